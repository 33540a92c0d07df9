//! The PRM layout this crate writes: [`Field`]s (name, bit offset, width
//! as `mlx5_ifc.h` declares them), grouped by the struct they belong to,
//! and the [`Scope`] that places a struct inside a mailbox.

/// A field of a PRM struct: name, bit offset inside its struct, width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// The name in `mlx5_ifc.h`.
    pub name: &'static str,
    /// Bit offset from the start of the enclosing struct.
    pub off: u32,
    /// Width in bits (1..=128).
    pub bits: u32,
    /// `reserved_*` in the kernel's `mlx5_ifc.h` (only DevX users write it).
    pub devx_only: bool,
}

const fn f(name: &'static str, off: u32, bits: u32) -> Field {
    Field {
        name,
        off,
        bits,
        devx_only: false,
    }
}

const fn devx_only(name: &'static str, off: u32, bits: u32) -> Field {
    Field {
        name,
        off,
        bits,
        devx_only: true,
    }
}

/// Where a struct sits in a mailbox: its path of field names from the
/// mailbox struct (`create_qp_in.qpc.primary_address_path`) and its bit
/// offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scope {
    /// Dotted path, starting with the mailbox struct's name.
    pub path: &'static str,
    /// Bit offset from the mailbox start.
    pub off: u32,
}

/// Fields of every input mailbox header (`*_in` structs).
pub mod hdr {
    use super::{f, Field};
    /// `opcode`.
    pub const OPCODE: Field = f("opcode", 0x0, 16);
    /// `op_mod`.
    pub const OP_MOD: Field = f("op_mod", 0x30, 16);
    /// `qpn` of the QP state-transition commands.
    pub const QPN: Field = f("qpn", 0x48, 24);
    /// `opt_param_mask` of RST2INIT/INIT2RTR/RTR2RTS.
    pub const OPT_PARAM_MASK: Field = f("opt_param_mask", 0x80, 32);
    /// `status` of every output mailbox.
    pub const STATUS: Field = f("status", 0x0, 8);
    /// `syndrome` of every output mailbox.
    pub const SYNDROME: Field = f("syndrome", 0x20, 32);
    /// `cqn` of `create_cq_out`, `qpn` of `create_qp_out`.
    pub const OBJ_NUMBER: Field = f("cqn", 0x48, 24);
}

/// `create_cq_in` fields outside the CQ context.
pub mod create_cq {
    use super::{devx_only, f, Field};
    /// `cq_umem_offset`: the ring's offset in its umem.
    pub const CQ_UMEM_OFFSET: Field = devx_only("cq_umem_offset", 0x280, 64);
    /// `cq_umem_id`.
    pub const CQ_UMEM_ID: Field = devx_only("cq_umem_id", 0x2c0, 32);
    /// `cq_umem_valid`.
    pub const CQ_UMEM_VALID: Field = f("cq_umem_valid", 0x2e0, 1);
}

/// `cqc`: the CQ context.
pub mod cqc {
    use super::{devx_only, f, Field};
    /// `dbr_umem_valid`.
    pub const DBR_UMEM_VALID: Field = f("dbr_umem_valid", 0x6, 1);
    /// `cqe_sz`: 0 = 64-byte CQEs.
    pub const CQE_SZ: Field = f("cqe_sz", 0x8, 3);
    /// `cc`: collapsed CQ (0: every CQE has its own slot).
    pub const CC: Field = f("cc", 0xb, 1);
    /// `oi`: overrun ignore.
    pub const OI: Field = f("oi", 0xe, 1);
    /// `page_offset`.
    pub const PAGE_OFFSET: Field = f("page_offset", 0x54, 6);
    /// `log_cq_size`.
    pub const LOG_CQ_SIZE: Field = f("log_cq_size", 0x63, 5);
    /// `uar_page`.
    pub const UAR_PAGE: Field = f("uar_page", 0x68, 24);
    /// `c_eqn_or_apu_element`: the completion EQ.
    pub const C_EQN: Field = f("c_eqn_or_apu_element", 0xa0, 32);
    /// `log_page_size` (log2 of bytes, minus 12).
    pub const LOG_PAGE_SIZE: Field = f("log_page_size", 0xc3, 5);
    /// `dbr_umem_id`.
    pub const DBR_UMEM_ID: Field = devx_only("dbr_umem_id", 0xe0, 32);
    /// `dbr_addr`: the doorbell record's offset in its umem.
    pub const DBR_ADDR: Field = f("dbr_addr", 0x1c0, 64);
}

/// `create_qp_in` fields outside the QP context.
pub mod create_qp {
    use super::{f, Field};
    /// `wq_umem_offset`.
    pub const WQ_UMEM_OFFSET: Field = f("wq_umem_offset", 0x800, 64);
    /// `wq_umem_id`.
    pub const WQ_UMEM_ID: Field = f("wq_umem_id", 0x840, 32);
    /// `wq_umem_valid`.
    pub const WQ_UMEM_VALID: Field = f("wq_umem_valid", 0x860, 1);
}

/// `qpc`: the QP context.
pub mod qpc {
    use super::{devx_only, f, Field};
    /// `st`: service type (0 = RC).
    pub const ST: Field = f("st", 0x8, 8);
    /// `pm_state` (3 = migrated: no APM).
    pub const PM_STATE: Field = f("pm_state", 0x13, 2);
    /// `pd`.
    pub const PD: Field = f("pd", 0x28, 24);
    /// `mtu` (IB encoding, 1 = 256 B .. 5 = 4096 B).
    pub const MTU: Field = f("mtu", 0x40, 3);
    /// `log_msg_max`.
    pub const LOG_MSG_MAX: Field = f("log_msg_max", 0x43, 5);
    /// `log_rq_size`.
    pub const LOG_RQ_SIZE: Field = f("log_rq_size", 0x49, 4);
    /// `log_rq_stride` (log2 of the receive WQE size in 16-byte units).
    pub const LOG_RQ_STRIDE: Field = f("log_rq_stride", 0x4d, 3);
    /// `no_sq`.
    pub const NO_SQ: Field = f("no_sq", 0x50, 1);
    /// `log_sq_size` (in 64-byte WQE basic blocks).
    pub const LOG_SQ_SIZE: Field = f("log_sq_size", 0x51, 4);
    /// `uar_page`.
    pub const UAR_PAGE: Field = f("uar_page", 0x68, 24);
    /// `log_page_size`.
    pub const LOG_PAGE_SIZE: Field = f("log_page_size", 0xa3, 5);
    /// `remote_qpn`.
    pub const REMOTE_QPN: Field = f("remote_qpn", 0xa8, 24);
    /// `log_sra_max`: outstanding reads/atomics this QP issues, log2.
    pub const LOG_SRA_MAX: Field = f("log_sra_max", 0x388, 3);
    /// `retry_count`.
    pub const RETRY_COUNT: Field = f("retry_count", 0x38d, 3);
    /// `rnr_retry`.
    pub const RNR_RETRY: Field = f("rnr_retry", 0x390, 3);
    /// `next_send_psn`.
    pub const NEXT_SEND_PSN: Field = f("next_send_psn", 0x3c8, 24);
    /// `cqn_snd`.
    pub const CQN_SND: Field = f("cqn_snd", 0x3e8, 24);
    /// `log_rra_max`: outstanding reads/atomics this QP answers, log2.
    pub const LOG_RRA_MAX: Field = f("log_rra_max", 0x488, 3);
    /// `atomic_mode` (1 = IB-compatible 8-byte atomics).
    pub const ATOMIC_MODE: Field = f("atomic_mode", 0x48c, 4);
    /// `rre`: remote read enable.
    pub const RRE: Field = f("rre", 0x490, 1);
    /// `rwe`: remote write enable.
    pub const RWE: Field = f("rwe", 0x491, 1);
    /// `rae`: remote atomic enable.
    pub const RAE: Field = f("rae", 0x492, 1);
    /// `page_offset`.
    pub const PAGE_OFFSET: Field = f("page_offset", 0x494, 6);
    /// `min_rnr_nak`.
    pub const MIN_RNR_NAK: Field = f("min_rnr_nak", 0x4a3, 5);
    /// `next_rcv_psn`.
    pub const NEXT_RCV_PSN: Field = f("next_rcv_psn", 0x4a8, 24);
    /// `cqn_rcv`.
    pub const CQN_RCV: Field = f("cqn_rcv", 0x4e8, 24);
    /// `dbr_addr`: the doorbell record's offset in its umem.
    pub const DBR_ADDR: Field = f("dbr_addr", 0x500, 64);
    /// `rq_type` (3 = zero-length RQ).
    pub const RQ_TYPE: Field = f("rq_type", 0x565, 3);
    /// `dbr_umem_valid`.
    pub const DBR_UMEM_VALID: Field = f("dbr_umem_valid", 0x683, 1);
    /// `dbr_umem_id`.
    pub const DBR_UMEM_ID: Field = devx_only("dbr_umem_id", 0x720, 32);
}

/// `ads`: an address path (the QP's primary path).
pub mod ads {
    use super::{f, Field};
    /// `pkey_index`.
    pub const PKEY_INDEX: Field = f("pkey_index", 0x10, 16);
    /// `grh`: a GRH is sent (RoCE, or IB across subnets).
    pub const GRH: Field = f("grh", 0x28, 1);
    /// `rlid`.
    pub const RLID: Field = f("rlid", 0x30, 16);
    /// `ack_timeout`.
    pub const ACK_TIMEOUT: Field = f("ack_timeout", 0x40, 5);
    /// `src_addr_index`: the source GID's index.
    pub const SRC_ADDR_INDEX: Field = f("src_addr_index", 0x48, 8);
    /// `hop_limit`.
    pub const HOP_LIMIT: Field = f("hop_limit", 0x58, 8);
    /// `tclass`.
    pub const TCLASS: Field = f("tclass", 0x64, 8);
    /// `rgid_rip`: the remote GID.
    pub const RGID_RIP: Field = f("rgid_rip", 0x80, 128);
    /// `udp_sport` (RoCE v2).
    pub const UDP_SPORT: Field = f("udp_sport", 0x110, 16);
    /// `sl`.
    pub const SL: Field = f("sl", 0x124, 4);
    /// `vhca_port_num`: the port (1-based).
    pub const VHCA_PORT_NUM: Field = f("vhca_port_num", 0x128, 8);
    /// `rmac_47_32`: the next hop's MAC, high 16 bits (RoCE).
    pub const RMAC_47_32: Field = f("rmac_47_32", 0x130, 16);
    /// `rmac_31_0`.
    pub const RMAC_31_0: Field = f("rmac_31_0", 0x140, 32);
}
