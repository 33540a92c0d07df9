//! DevX command mailboxes: the PRM commands IBGDA's set-up sends through
//! `mlx5dv_devx_obj_create` / `_modify` ([`crate::Verbs::devx_obj_create`]),
//! built as byte buffers with named fields.
//!
//! The PRM lays a mailbox out big-endian, fields addressed by bit offset
//! from the mailbox start (bit 0 is the most significant bit of byte 0)
//! and bit width, as `include/linux/mlx5/mlx5_ifc.h` declares them
//! (`u8 field[width]` arrays). [`Mailbox::set`] writes a [`Field`] at an
//! offset inside a [`Scope`] (the nested struct the field belongs to) and
//! records what it wrote ([`Mailbox::written`]); the test
//! `tests/prm_layout.rs` parses `mlx5_ifc.h` and checks every written
//! field's offset and width, and every opcode, against it.
//!
//! A few fields only DevX users set (the umem ids of a CQ's ring and
//! doorbell record and of a QP's doorbell record) are `reserved_*` in the
//! kernel's header, which never writes them; they are marked
//! [`Field::devx_only`], and the test checks that they lie inside a
//! reserved range of the header's struct.

use core::fmt;

/// Bytes of a mailbox header (`opcode`, `uid`, `op_mod` in; `status`,
/// `syndrome` out) that every mailbox has.
pub const MBOX_HDR_BYTES: usize = 16;

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

/// The commands this module builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// `CREATE_CQ`.
    CreateCq,
    /// `CREATE_QP`.
    CreateQp,
    /// `RST2INIT_QP`.
    Rst2InitQp,
    /// `INIT2RTR_QP`.
    Init2RtrQp,
    /// `RTR2RTS_QP`.
    Rtr2RtsQp,
    /// `2ERR_QP`.
    ToErrQp,
    /// `2RST_QP`.
    ToRstQp,
}

impl Command {
    /// Every command.
    pub const ALL: [Command; 7] = [
        Command::CreateCq,
        Command::CreateQp,
        Command::Rst2InitQp,
        Command::Init2RtrQp,
        Command::Rtr2RtsQp,
        Command::ToErrQp,
        Command::ToRstQp,
    ];

    /// `MLX5_CMD_OP_*`.
    pub const fn opcode(self) -> u16 {
        match self {
            Command::CreateCq => 0x400,
            Command::CreateQp => 0x500,
            Command::Rst2InitQp => 0x502,
            Command::Init2RtrQp => 0x503,
            Command::Rtr2RtsQp => 0x504,
            Command::ToErrQp => 0x507,
            Command::ToRstQp => 0x50a,
        }
    }

    /// The PRM name (`MLX5_CMD_OP_<name>`).
    pub const fn name(self) -> &'static str {
        match self {
            Command::CreateCq => "CREATE_CQ",
            Command::CreateQp => "CREATE_QP",
            Command::Rst2InitQp => "RST2INIT_QP",
            Command::Init2RtrQp => "INIT2RTR_QP",
            Command::Rtr2RtsQp => "RTR2RTS_QP",
            Command::ToErrQp => "2ERR_QP",
            Command::ToRstQp => "2RST_QP",
        }
    }

    /// The mailbox structs' base name in `mlx5_ifc.h` (`<base>_in_bits`,
    /// `<base>_out_bits`).
    pub const fn ifc_struct(self) -> &'static str {
        match self {
            Command::CreateCq => "create_cq",
            Command::CreateQp => "create_qp",
            Command::Rst2InitQp => "rst2init_qp",
            Command::Init2RtrQp => "init2rtr_qp",
            Command::Rtr2RtsQp => "rtr2rts_qp",
            Command::ToErrQp => "qp_2err",
            Command::ToRstQp => "qp_2rst",
        }
    }

    /// Bytes of the input mailbox (no page list: queues live in umems).
    pub const fn in_len(self) -> usize {
        match self {
            Command::ToErrQp | Command::ToRstQp => 0x80 / 8,
            _ => 0x880 / 8,
        }
    }

    /// Bytes of the output mailbox.
    pub const fn out_len(self) -> usize {
        0x80 / 8
    }
}

/// The command name of `opcode`, `"UNKNOWN"` for one this module does not build.
pub fn opcode_name(opcode: u16) -> &'static str {
    Command::ALL.iter().find(|c| c.opcode() == opcode).map_or("UNKNOWN", |c| c.name())
}

/// The name of a mailbox `status` (`MLX5_CMD_STAT_*`).
pub fn status_name(status: u8) -> &'static str {
    match status {
        0x0 => "OK",
        0x1 => "INT_ERR",
        0x2 => "BAD_OP_ERR",
        0x3 => "BAD_PARAM_ERR",
        0x4 => "BAD_SYS_STATE_ERR",
        0x5 => "BAD_RES_ERR",
        0x6 => "RES_BUSY",
        0x8 => "LIM_ERR",
        0x9 => "BAD_RES_STATE_ERR",
        0xa => "IX_ERR",
        0xf => "NO_RES_ERR",
        0x10 => "BAD_INP_LEN_ERR",
        0x11 => "BAD_OUTP_LEN_ERR",
        0x40 => "BAD_QP_STATE_ERR",
        0x41 => "BAD_PKT_ERR",
        0x42 => "BAD_SIZE_OUTS_CQES_ERR",
        _ => "unknown status",
    }
}

/// The opcode of an input mailbox, `None` if it is shorter than 2 bytes.
pub fn input_opcode(inp: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*inp.first()?, *inp.get(1)?]))
}

/// `(status, syndrome)` of an output mailbox, `None` if it is shorter than 8 bytes.
pub fn output_status(out: &[u8]) -> Option<(u8, u32)> {
    let s: [u8; 4] = out.get(4..8)?.try_into().ok()?;
    Some((*out.first()?, u32::from_be_bytes(s)))
}

/// What goes wrong building a command or reading its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrmError {
    /// A value does not fit its field.
    ValueTooWide {
        /// The command being built.
        command: &'static str,
        /// The field.
        field: &'static str,
        /// The value.
        value: u64,
        /// The field's width in bits.
        bits: u32,
    },
    /// An argument is outside what the command accepts.
    BadArgument {
        /// The command being built.
        command: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The device answered with a non-zero status.
    Failed {
        /// The command.
        command: &'static str,
        /// Its opcode.
        opcode: u16,
        /// `MLX5_CMD_STAT_*`.
        status: u8,
        /// Firmware-specific detail.
        syndrome: u32,
    },
    /// The output mailbox is shorter than the command's.
    ShortOutput {
        /// The command.
        command: &'static str,
        /// Bytes given.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
}

impl fmt::Display for PrmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrmError::ValueTooWide {
                command,
                field,
                value,
                bits,
            } => write!(f, "{command}: {value:#x} does not fit the {bits}-bit field {field}"),
            PrmError::BadArgument { command, reason } => write!(f, "{command}: {reason}"),
            PrmError::Failed {
                command,
                opcode,
                status,
                syndrome,
            } => write!(
                f,
                "{command} (opcode {opcode:#x}) failed: status {status:#x} ({}), syndrome {syndrome:#010x}",
                status_name(*status)
            ),
            PrmError::ShortOutput { command, len, need } => {
                write!(f, "{command}: output mailbox of {len} bytes, {need} needed")
            }
        }
    }
}

impl std::error::Error for PrmError {}

/// A field [`Mailbox::set`] wrote: where and how wide, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// `<scope path>.<field name>`, e.g. `create_qp_in.qpc.log_sq_size`.
    pub path: String,
    /// Bit offset from the mailbox start.
    pub off: u32,
    /// Width in bits.
    pub bits: u32,
    /// See [`Field::devx_only`].
    pub devx_only: bool,
}

/// Writes the `bits`-bit big-endian value `v` at bit `off` of `buf`.
fn put_bits(buf: &mut [u8], off: u32, bits: u32, v: u128) {
    for i in 0..bits {
        let p = (off + i) as usize;
        let bit = (v >> (bits - 1 - i)) & 1;
        let mask = 0x80u8 >> (p % 8);
        if bit == 1 {
            buf[p / 8] |= mask;
        } else {
            buf[p / 8] &= !mask;
        }
    }
}

/// Reads the `bits`-bit big-endian value at bit `off` of `buf`.
pub fn get_bits(buf: &[u8], off: u32, bits: u32) -> u128 {
    let mut v = 0u128;
    for i in 0..bits {
        let p = (off + i) as usize;
        v = (v << 1) | u128::from((buf[p / 8] >> (7 - p % 8)) & 1);
    }
    v
}

/// An input mailbox being built.
#[derive(Clone, Debug)]
pub struct Mailbox {
    cmd: Command,
    buf: Vec<u8>,
    written: Vec<Written>,
}

impl Mailbox {
    /// A zeroed input mailbox for `cmd` with its opcode set.
    pub fn new(cmd: Command) -> Mailbox {
        let mut m = Mailbox {
            cmd,
            buf: vec![0; cmd.in_len()],
            written: Vec::new(),
        };
        let top = m.top();
        m.put(top, hdr::OPCODE, u128::from(cmd.opcode()));
        m
    }

    /// The mailbox struct itself as a scope (`<base>_in` at bit 0).
    pub fn top(&self) -> Scope {
        Scope {
            path: match self.cmd {
                Command::CreateCq => "create_cq_in",
                Command::CreateQp => "create_qp_in",
                Command::Rst2InitQp => "rst2init_qp_in",
                Command::Init2RtrQp => "init2rtr_qp_in",
                Command::Rtr2RtsQp => "rtr2rts_qp_in",
                Command::ToErrQp => "qp_2err_in",
                Command::ToRstQp => "qp_2rst_in",
            },
            off: 0,
        }
    }

    fn put(&mut self, scope: Scope, field: Field, v: u128) {
        let off = scope.off + field.off;
        put_bits(&mut self.buf, off, field.bits, v);
        self.written.push(Written {
            path: format!("{}.{}", scope.path, field.name),
            off,
            bits: field.bits,
            devx_only: field.devx_only,
        });
    }

    /// Sets `field` of the struct at `scope` to `value`.
    ///
    /// # Errors
    /// [`PrmError::ValueTooWide`] when `value` needs more bits than the field has.
    pub fn set(&mut self, scope: Scope, field: Field, value: u64) -> Result<(), PrmError> {
        if field.bits < 64 && value >> field.bits != 0 {
            return Err(PrmError::ValueTooWide {
                command: self.cmd.name(),
                field: field.name,
                value,
                bits: field.bits,
            });
        }
        self.put(scope, field, u128::from(value));
        Ok(())
    }

    /// Sets a 128-bit field (a GID) from its 16 bytes in wire order.
    pub fn set_bytes16(&mut self, scope: Scope, field: Field, bytes: [u8; 16]) {
        self.put(scope, field, u128::from_be_bytes(bytes));
    }

    /// Reads back a field of the struct at `scope`.
    pub fn get(&self, scope: Scope, field: Field) -> u128 {
        get_bits(&self.buf, scope.off + field.off, field.bits)
    }

    /// The command.
    pub fn command(&self) -> Command {
        self.cmd
    }

    /// The bytes to pass to DevX.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Every field written so far, in order.
    pub fn written(&self) -> &[Written] {
        &self.written
    }

    /// A zeroed output mailbox of the right size.
    pub fn out_buffer(&self) -> Vec<u8> {
        vec![0; self.cmd.out_len()]
    }
}

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

/// The QP context of a state transition (`<cmd>_in.qpc` at 0xc0).
pub fn transition_qpc(cmd: Command) -> Scope {
    let path = match cmd {
        Command::Rst2InitQp => "rst2init_qp_in.qpc",
        Command::Init2RtrQp => "init2rtr_qp_in.qpc",
        _ => "rtr2rts_qp_in.qpc",
    };
    Scope { path, off: 0xc0 }
}

/// The primary address path of a state transition's QP context.
pub fn transition_path(cmd: Command) -> Scope {
    let path = match cmd {
        Command::Rst2InitQp => "rst2init_qp_in.qpc.primary_address_path",
        Command::Init2RtrQp => "init2rtr_qp_in.qpc.primary_address_path",
        _ => "rtr2rts_qp_in.qpc.primary_address_path",
    };
    Scope { path, off: 0xc0 + 0xc0 }
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
    let mut m = Mailbox::new(Command::Rst2InitQp);
    let top = m.top();
    m.set(top, hdr::QPN, u64::from(qpn))?;
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
    for (what, v) in [("remote QPN", p.remote_qpn), ("receive PSN", p.next_rcv_psn)] {
        if v > 0xff_ffff {
            return Err(PrmError::BadArgument {
                command: cmd.name(),
                reason: format!("{what} {v:#x} is wider than 24 bits"),
            });
        }
    }
    let mut m = Mailbox::new(cmd);
    let top = m.top();
    m.set(top, hdr::QPN, u64::from(p.qpn))?;
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
    if p.next_send_psn > 0xff_ffff {
        return Err(PrmError::BadArgument {
            command: cmd.name(),
            reason: format!("send PSN {:#x} is wider than 24 bits", p.next_send_psn),
        });
    }
    let mut m = Mailbox::new(cmd);
    let top = m.top();
    m.set(top, hdr::QPN, u64::from(p.qpn))?;
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
    let mut m = Mailbox::new(Command::ToErrQp);
    let top = m.top();
    m.set(top, hdr::QPN, u64::from(qpn))?;
    Ok(m)
}

/// `2RST_QP`.
///
/// # Errors
/// [`PrmError::ValueTooWide`] for a QPN wider than 24 bits.
pub fn to_rst(qpn: u32) -> Result<Mailbox, PrmError> {
    let mut m = Mailbox::new(Command::ToRstQp);
    let top = m.top();
    m.set(top, hdr::QPN, u64::from(qpn))?;
    Ok(m)
}

/// Checks an output mailbox's status.
///
/// # Errors
/// [`PrmError::ShortOutput`], or [`PrmError::Failed`] with the status and syndrome.
pub fn check_out(cmd: Command, out: &[u8]) -> Result<(), PrmError> {
    if out.len() < cmd.out_len() {
        return Err(PrmError::ShortOutput {
            command: cmd.name(),
            len: out.len(),
            need: cmd.out_len(),
        });
    }
    let status = get_bits(out, hdr::STATUS.off, hdr::STATUS.bits) as u8;
    let syndrome = get_bits(out, hdr::SYNDROME.off, hdr::SYNDROME.bits) as u32;
    if status != 0 {
        return Err(PrmError::Failed {
            command: cmd.name(),
            opcode: cmd.opcode(),
            status,
            syndrome,
        });
    }
    Ok(())
}

/// The object number a CREATE_CQ / CREATE_QP returned (`cqn` / `qpn`, 24 bits).
///
/// # Errors
/// As [`check_out`].
pub fn created_number(cmd: Command, out: &[u8]) -> Result<u32, PrmError> {
    check_out(cmd, out)?;
    Ok(get_bits(out, hdr::OBJ_NUMBER.off, hdr::OBJ_NUMBER.bits) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_big_endian_msb_first() {
        let mut b = [0u8; 8];
        put_bits(&mut b, 0x13, 2, 3); // pm_state-like: bits 19..21
        assert_eq!(b, [0, 0, 0x18, 0, 0, 0, 0, 0]);
        put_bits(&mut b, 0x28, 24, 0xabcdef);
        assert_eq!(&b[5..8], &[0xab, 0xcd, 0xef]);
        assert_eq!(get_bits(&b, 0x28, 24), 0xabcdef);
        assert_eq!(get_bits(&b, 0x13, 2), 3);
    }

    #[test]
    fn too_wide_values_are_refused() {
        let mut m = Mailbox::new(Command::CreateQp);
        let e = m.set(CREATE_QP_QPC, qpc::LOG_SQ_SIZE, 16).unwrap_err();
        assert!(matches!(e, PrmError::ValueTooWide { bits: 4, value: 16, .. }), "{e}");
        assert!(e.to_string().contains("log_sq_size"), "{e}");
    }

    #[test]
    fn opcode_is_first_and_output_parses() {
        let m = to_err(0x1234).unwrap();
        assert_eq!(&m.bytes()[..2], &[0x05, 0x07]);
        assert_eq!(&m.bytes()[9..12], &[0x00, 0x12, 0x34]);
        let mut out = m.out_buffer();
        out[8..12].copy_from_slice(&0x00_0a_bc_deu32.to_be_bytes());
        assert_eq!(created_number(Command::CreateQp, &out).unwrap(), 0x0abcde);
        out[0] = 0x3;
        out[4..8].copy_from_slice(&0xdead_beefu32.to_be_bytes());
        let e = check_out(Command::CreateQp, &out).unwrap_err();
        assert_eq!(
            e,
            PrmError::Failed {
                command: "CREATE_QP",
                opcode: 0x500,
                status: 3,
                syndrome: 0xdead_beef
            }
        );
        assert!(e.to_string().contains("BAD_PARAM_ERR"), "{e}");
        assert!(matches!(check_out(Command::CreateQp, &out[..8]), Err(PrmError::ShortOutput { .. })));
    }

    #[test]
    fn rtr_roce_path_and_mtu() {
        let p = RtrParams {
            qpn: 7,
            port: 1,
            mtu: 4096,
            remote_qpn: 9,
            next_rcv_psn: 0x123456,
            max_rd_atomic: 16,
            min_rnr_nak: 12,
            sl: 0,
            remote: RemoteAddress::Roce {
                gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
                sgid_index: 3,
                hop_limit: 64,
                tclass: 0,
                rmac: [0x02, 0x11, 0x22, 0x33, 0x44, 0x55],
                udp_sport: 0xc001,
            },
            log_msg_max: 30,
        };
        let m = init2rtr(&p).unwrap();
        let c = transition_qpc(Command::Init2RtrQp);
        let a = transition_path(Command::Init2RtrQp);
        assert_eq!(m.get(c, qpc::MTU), 5);
        assert_eq!(m.get(c, qpc::LOG_RRA_MAX), 4);
        assert_eq!(m.get(a, ads::GRH), 1);
        assert_eq!(m.get(a, ads::RMAC_47_32), 0x0211);
        assert_eq!(m.get(a, ads::RMAC_31_0), 0x2233_4455);
        assert_eq!(m.get(a, ads::RGID_RIP) >> 112, 0xfe80);
        let bad = init2rtr(&RtrParams { mtu: 1500, ..p }).unwrap_err();
        assert!(bad.to_string().contains("1500"), "{bad}");
        let bad = init2rtr(&RtrParams {
            next_rcv_psn: 1 << 24,
            ..p
        });
        assert!(matches!(bad, Err(PrmError::BadArgument { .. })));
    }
}
