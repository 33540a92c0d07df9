//! One builder per command: plain parameters in, a filled [`Mailbox`] out,
//! every value checked against its field.

use super::fields::{ads, cqc, create_cq, create_qp, hdr, qpc, Scope};
use super::mailbox::{Command, Mailbox, PrmError};

/// Where the CQ context sits in `create_cq_in`.
pub const CREATE_CQ_CQC: Scope = Scope {
    path: "create_cq_in.cq_context",
    off: 0x80,
};

/// The QP context in `create_qp_in`.
pub const CREATE_QP_QPC: Scope = Scope {
    path: "create_qp_in.qpc",
    off: 0xc0,
};

/// The mailbox struct of each state transition, with its QP context and
/// that context's primary address path (both at the same offsets in every
/// transition). Any other command reads as the last.
const TRANSITIONS: [(Command, &str, &str); 3] = [
    (Command::Rst2InitQp, "rst2init_qp_in.qpc", "rst2init_qp_in.qpc.primary_address_path"),
    (Command::Init2RtrQp, "init2rtr_qp_in.qpc", "init2rtr_qp_in.qpc.primary_address_path"),
    (Command::Rtr2RtsQp, "rtr2rts_qp_in.qpc", "rtr2rts_qp_in.qpc.primary_address_path"),
];

/// The [`TRANSITIONS`] row of `cmd`.
fn transition(cmd: Command) -> (Command, &'static str, &'static str) {
    TRANSITIONS.into_iter().find(|t| t.0 == cmd).unwrap_or(TRANSITIONS[2])
}

/// The QP context of a state transition (`<cmd>_in.qpc` at 0xc0).
pub fn transition_qpc(cmd: Command) -> Scope {
    Scope {
        path: transition(cmd).1,
        off: 0xc0,
    }
}

/// The primary address path of a state transition's QP context.
pub fn transition_path(cmd: Command) -> Scope {
    Scope {
        path: transition(cmd).2,
        off: 0xc0 + 0xc0,
    }
}

/// A QP command's mailbox with the QP's number set.
fn qp_mailbox(cmd: Command, qpn: u32) -> Result<Mailbox, PrmError> {
    let mut m = Mailbox::new(cmd);
    let top = m.top();
    m.set(top, hdr::QPN, u64::from(qpn))?;
    Ok(m)
}

/// Refuses a PSN or QPN `v` wider than 24 bits, naming it as `what`.
fn within_24_bits(cmd: Command, what: &str, v: u32) -> Result<(), PrmError> {
    if v > 0xff_ffff {
        return Err(PrmError::BadArgument {
            command: cmd.name(),
            reason: format!("{what} {v:#x} is wider than 24 bits"),
        });
    }
    Ok(())
}

/// The IB MTU code (`IBV_MTU_*`, the QPC's `mtu`) of `bytes`.
///
/// # Errors
/// [`PrmError::BadArgument`] for anything but 256, 512, 1024, 2048, 4096.
pub fn mtu_code(bytes: u32) -> Result<u8, PrmError> {
    match bytes {
        256 => Ok(1),
        512 => Ok(2),
        1024 => Ok(3),
        2048 => Ok(4),
        4096 => Ok(5),
        _ => Err(PrmError::BadArgument {
            command: Command::Init2RtrQp.name(),
            reason: format!("path MTU {bytes} is not one of 256, 512, 1024, 2048, 4096 bytes"),
        }),
    }
}

/// floor(log2(n)), 0 for 0 and 1.
pub fn log2_floor(n: u32) -> u8 {
    if n <= 1 {
        0
    } else {
        (31 - n.leading_zeros()) as u8
    }
}

/// What a CQ is created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqParams {
    /// log2 of the CQE count.
    pub log_cq_size: u8,
    /// The UAR page the CQ's doorbells use.
    pub uar_page: u32,
    /// Completion EQ (`mlx5dv_devx_query_eqn`).
    pub eqn: u32,
    /// The ring's umem.
    pub cq_umem_id: u32,
    /// The ring's offset in it.
    pub cq_umem_offset: u64,
    /// The doorbell record's umem.
    pub dbr_umem_id: u32,
    /// The doorbell record's offset in it.
    pub dbr_offset: u64,
}

/// `CREATE_CQ`: 64-byte CQEs, overrun ignored (the GPU consumer does not
/// arm the CQ), ring and doorbell record in umems.
///
/// # Errors
/// [`PrmError::ValueTooWide`] for a value outside its field.
pub fn create_cq(p: &CqParams) -> Result<Mailbox, PrmError> {
    let mut m = Mailbox::new(Command::CreateCq);
    let c = CREATE_CQ_CQC;
    m.set(c, cqc::CQE_SZ, 0)?;
    m.set(c, cqc::OI, 1)?;
    m.set(c, cqc::LOG_CQ_SIZE, u64::from(p.log_cq_size))?;
    m.set(c, cqc::UAR_PAGE, u64::from(p.uar_page))?;
    m.set(c, cqc::C_EQN, u64::from(p.eqn))?;
    m.set(c, cqc::LOG_PAGE_SIZE, 0)?;
    m.set(c, cqc::PAGE_OFFSET, 0)?;
    m.set(c, cqc::DBR_UMEM_VALID, 1)?;
    m.set(c, cqc::DBR_UMEM_ID, u64::from(p.dbr_umem_id))?;
    m.set(c, cqc::DBR_ADDR, p.dbr_offset)?;
    let top = m.top();
    m.set(top, create_cq::CQ_UMEM_VALID, 1)?;
    m.set(top, create_cq::CQ_UMEM_ID, u64::from(p.cq_umem_id))?;
    m.set(top, create_cq::CQ_UMEM_OFFSET, p.cq_umem_offset)?;
    Ok(m)
}

/// What an RC QP is created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpParams {
    /// Protection domain number.
    pub pd: u32,
    /// UAR page of its doorbells.
    pub uar_page: u32,
    /// log2 of the SQ size in 64-byte basic blocks.
    pub log_sq_size: u8,
    /// log2 of the RQ's WQE count; `None`: a zero-length RQ (no receives).
    pub log_rq_size: Option<u8>,
    /// log2 of a receive WQE's size in 16-byte units (with an RQ).
    pub log_rq_stride: u8,
    /// The CQ both queues complete to.
    pub cqn: u32,
    /// The WQ buffer's umem (RQ first, then SQ, per the PRM).
    pub wq_umem_id: u32,
    /// The WQ buffer's offset in it.
    pub wq_umem_offset: u64,
    /// The doorbell record's umem.
    pub dbr_umem_id: u32,
    /// The doorbell record's offset in it.
    pub dbr_offset: u64,
    /// log2 of the largest message.
    pub log_msg_max: u8,
}

/// `CREATE_QP`, RC, migrated path state, in RESET.
///
/// # Errors
/// [`PrmError::ValueTooWide`] for a value outside its field.
pub fn create_qp(p: &QpParams) -> Result<Mailbox, PrmError> {
    let mut m = Mailbox::new(Command::CreateQp);
    let c = CREATE_QP_QPC;
    m.set(c, qpc::ST, 0)?;
    m.set(c, qpc::PM_STATE, 3)?;
    m.set(c, qpc::PD, u64::from(p.pd))?;
    m.set(c, qpc::UAR_PAGE, u64::from(p.uar_page))?;
    m.set(c, qpc::LOG_MSG_MAX, u64::from(p.log_msg_max))?;
    m.set(c, qpc::LOG_SQ_SIZE, u64::from(p.log_sq_size))?;
    match p.log_rq_size {
        None => {
            m.set(c, qpc::RQ_TYPE, 3)?;
            m.set(c, qpc::LOG_RQ_SIZE, 0)?;
        }
        Some(l) => {
            m.set(c, qpc::RQ_TYPE, 0)?;
            m.set(c, qpc::LOG_RQ_SIZE, u64::from(l))?;
            m.set(c, qpc::LOG_RQ_STRIDE, u64::from(p.log_rq_stride))?;
        }
    }
    m.set(c, qpc::CQN_SND, u64::from(p.cqn))?;
    m.set(c, qpc::CQN_RCV, u64::from(p.cqn))?;
    m.set(c, qpc::LOG_PAGE_SIZE, 0)?;
    m.set(c, qpc::PAGE_OFFSET, 0)?;
    m.set(c, qpc::DBR_UMEM_VALID, 1)?;
    m.set(c, qpc::DBR_UMEM_ID, u64::from(p.dbr_umem_id))?;
    m.set(c, qpc::DBR_ADDR, p.dbr_offset)?;
    let top = m.top();
    m.set(top, create_qp::WQ_UMEM_VALID, 1)?;
    m.set(top, create_qp::WQ_UMEM_ID, u64::from(p.wq_umem_id))?;
    m.set(top, create_qp::WQ_UMEM_OFFSET, p.wq_umem_offset)?;
    Ok(m)
}

/// Remote access a QP grants (`rre`/`rwe`/`rae`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteAccess {
    /// Peers may read.
    pub read: bool,
    /// Peers may write.
    pub write: bool,
    /// Peers may apply atomics.
    pub atomic: bool,
}

/// `RST2INIT_QP`: port, P_Key index 0, remote access.
///
/// # Errors
/// [`PrmError::ValueTooWide`] for a value outside its field.
pub fn rst2init(qpn: u32, port: u8, access: RemoteAccess) -> Result<Mailbox, PrmError> {
    let mut m = qp_mailbox(Command::Rst2InitQp, qpn)?;
    let c = transition_qpc(Command::Rst2InitQp);
    m.set(c, qpc::RRE, u64::from(access.read))?;
    m.set(c, qpc::RWE, u64::from(access.write))?;
    m.set(c, qpc::RAE, u64::from(access.atomic))?;
    if access.atomic {
        m.set(c, qpc::ATOMIC_MODE, 1)?;
    }
    let a = transition_path(Command::Rst2InitQp);
    m.set(a, ads::VHCA_PORT_NUM, u64::from(port))?;
    m.set(a, ads::PKEY_INDEX, 0)?;
    Ok(m)
}

/// How the remote QP is addressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAddress {
    /// InfiniBand: by LID, no GRH.
    Ib {
        /// The remote port's LID.
        lid: u16,
    },
    /// RoCE v2: by GID, with a GRH.
    Roce {
        /// The remote GID.
        gid: [u8; 16],
        /// This port's GID index (the source address).
        sgid_index: u8,
        /// Hop limit of the GRH.
        hop_limit: u8,
        /// Traffic class.
        tclass: u8,
        /// The next hop's MAC.
        rmac: [u8; 6],
        /// UDP source port (ECMP entropy), 0xC000..=0xFFFF.
        udp_sport: u16,
    },
}

/// The INIT → RTR attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrParams {
    /// This QP.
    pub qpn: u32,
    /// The port (1-based).
    pub port: u8,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// The remote QP.
    pub remote_qpn: u32,
    /// The first PSN expected from the peer (24 bits).
    pub next_rcv_psn: u32,
    /// Reads/atomics answered at once (rounded down to a power of two).
    pub max_rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_nak: u8,
    /// Service level.
    pub sl: u8,
    /// The remote address.
    pub remote: RemoteAddress,
    /// log2 of the largest message.
    pub log_msg_max: u8,
}

/// `INIT2RTR_QP`.
///
/// # Errors
/// [`PrmError::BadArgument`] for an MTU that is not an IB MTU, a PSN or
/// QPN wider than 24 bits; [`PrmError::ValueTooWide`] otherwise.
pub fn init2rtr(p: &RtrParams) -> Result<Mailbox, PrmError> {
    let cmd = Command::Init2RtrQp;
    let mtu = mtu_code(p.mtu)?;
    within_24_bits(cmd, "remote QPN", p.remote_qpn)?;
    within_24_bits(cmd, "receive PSN", p.next_rcv_psn)?;
    let mut m = qp_mailbox(cmd, p.qpn)?;
    let c = transition_qpc(cmd);
    m.set(c, qpc::MTU, u64::from(mtu))?;
    m.set(c, qpc::LOG_MSG_MAX, u64::from(p.log_msg_max))?;
    m.set(c, qpc::REMOTE_QPN, u64::from(p.remote_qpn))?;
    m.set(c, qpc::NEXT_RCV_PSN, u64::from(p.next_rcv_psn))?;
    m.set(c, qpc::LOG_RRA_MAX, u64::from(log2_floor(u32::from(p.max_rd_atomic)).min(7)))?;
    m.set(c, qpc::MIN_RNR_NAK, u64::from(p.min_rnr_nak))?;
    let a = transition_path(cmd);
    m.set(a, ads::VHCA_PORT_NUM, u64::from(p.port))?;
    m.set(a, ads::SL, u64::from(p.sl))?;
    match p.remote {
        RemoteAddress::Ib { lid } => {
            m.set(a, ads::GRH, 0)?;
            m.set(a, ads::RLID, u64::from(lid))?;
        }
        RemoteAddress::Roce {
            gid,
            sgid_index,
            hop_limit,
            tclass,
            rmac,
            udp_sport,
        } => {
            m.set(a, ads::GRH, 1)?;
            m.set_bytes16(a, ads::RGID_RIP, gid);
            m.set(a, ads::SRC_ADDR_INDEX, u64::from(sgid_index))?;
            m.set(a, ads::HOP_LIMIT, u64::from(hop_limit))?;
            m.set(a, ads::TCLASS, u64::from(tclass))?;
            m.set(a, ads::RMAC_47_32, u64::from(u16::from_be_bytes([rmac[0], rmac[1]])))?;
            m.set(
                a,
                ads::RMAC_31_0,
                u64::from(u32::from_be_bytes([rmac[2], rmac[3], rmac[4], rmac[5]])),
            )?;
            m.set(a, ads::UDP_SPORT, u64::from(udp_sport))?;
        }
    }
    Ok(m)
}

/// The RTR → RTS attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsParams {
    /// This QP.
    pub qpn: u32,
    /// The first PSN sent (24 bits).
    pub next_send_psn: u32,
    /// Transport retries (0..=7).
    pub retry_count: u8,
    /// RNR retries (0..=7, 7 = forever).
    pub rnr_retry: u8,
    /// Reads/atomics outstanding at once (rounded down to a power of two).
    pub max_rd_atomic: u8,
    /// Local ACK timeout exponent (0..=31).
    pub ack_timeout: u8,
}

/// `RTR2RTS_QP`.
///
/// # Errors
/// [`PrmError::BadArgument`] for a PSN wider than 24 bits;
/// [`PrmError::ValueTooWide`] for retry counts above 7 or a timeout above 31.
pub fn rtr2rts(p: &RtsParams) -> Result<Mailbox, PrmError> {
    let cmd = Command::Rtr2RtsQp;
    within_24_bits(cmd, "send PSN", p.next_send_psn)?;
    let mut m = qp_mailbox(cmd, p.qpn)?;
    let c = transition_qpc(cmd);
    m.set(c, qpc::NEXT_SEND_PSN, u64::from(p.next_send_psn))?;
    m.set(c, qpc::RETRY_COUNT, u64::from(p.retry_count))?;
    m.set(c, qpc::RNR_RETRY, u64::from(p.rnr_retry))?;
    m.set(c, qpc::LOG_SRA_MAX, u64::from(log2_floor(u32::from(p.max_rd_atomic)).min(7)))?;
    m.set(transition_path(cmd), ads::ACK_TIMEOUT, u64::from(p.ack_timeout))?;
    Ok(m)
}

/// `2ERR_QP`.
///
/// # Errors
/// [`PrmError::ValueTooWide`] for a QPN wider than 24 bits.
pub fn to_err(qpn: u32) -> Result<Mailbox, PrmError> {
    qp_mailbox(Command::ToErrQp, qpn)
}

/// `2RST_QP`.
///
/// # Errors
/// [`PrmError::ValueTooWide`] for a QPN wider than 24 bits.
pub fn to_rst(qpn: u32) -> Result<Mailbox, PrmError> {
    qp_mailbox(Command::ToRstQp, qpn)
}
