//! A command mailbox: the [`Command`]s this crate sends, a [`Mailbox`] that
//! writes [`Field`]s at their bit offsets and records what it wrote, and
//! the readers of a command's answer ([`check_out`], [`created_number`]).

use core::fmt;

use super::fields::{hdr, Field, Scope};

/// Bytes of a mailbox header (`opcode`, `uid`, `op_mod` in; `status`,
/// `syndrome` out) that every mailbox has.
pub const MBOX_HDR_BYTES: usize = 16;

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
pub(super) fn put_bits(buf: &mut [u8], off: u32, bits: u32, v: u128) {
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
