//! Byte-exact reference WQEs and CQEs made by C code that uses rdma-core's
//! own `<infiniband/mlx5dv.h>` helpers (`shim/mlx5_ref.c`).
//!
//! Compiled only when the header is present at build time (cfg
//! `doorbell_mlx5_shim`, set by build.rs). Meant for tests: compare a WQE
//! builder or a CQE decoder (e.g. the GPU kernels') with what the header's
//! helpers produce. No RDMA device or rdma-core library is needed.

use core::ffi::{c_char, c_int, CStr};

/// The work request a reference WQE is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RefWqeOp {
    /// `MLX5_OPCODE_NOP`: ctrl segment only (ds = 1).
    #[default]
    Nop,
    /// `MLX5_OPCODE_RDMA_WRITE`: ctrl, raddr, data (ds = 3).
    Write,
    /// `MLX5_OPCODE_RDMA_WRITE_IMM`: ctrl (with imm), raddr, data (ds = 3).
    WriteImm,
    /// `MLX5_OPCODE_RDMA_READ`: ctrl, raddr, data (ds = 3).
    Read,
    /// `MLX5_OPCODE_ATOMIC_FA`: ctrl, raddr, atomic (swap_add = add,
    /// compare = 0), data of 8 bytes for the fetched value (ds = 4).
    FetchAdd,
    /// `MLX5_OPCODE_ATOMIC_CS`: ctrl, raddr, atomic (swap_add = swap,
    /// compare = compare), data of 8 bytes for the old value (ds = 4).
    CompareSwap,
}

impl RefWqeOp {
    fn code(self) -> u32 {
        match self {
            RefWqeOp::Nop => 0,
            RefWqeOp::Write => 1,
            RefWqeOp::WriteImm => 2,
            RefWqeOp::Read => 3,
            RefWqeOp::FetchAdd => 4,
            RefWqeOp::CompareSwap => 5,
        }
    }
}

/// Inputs of [`reference_wqe`].
///
/// `fm_ce_se` = `(fence ? 0x80 : 0) | (signaled ? 0x08 : 0) |
/// (solicited ? 0x02 : 0)`; opmod and signature are 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WqeParams {
    /// The operation.
    pub op: RefWqeOp,
    /// Producer index of the WQE (goes into ctrl word 0, bits 8..24).
    pub wqe_index: u16,
    /// QP number (24 bits; higher bits are dropped).
    pub qpn: u32,
    /// Remote address.
    pub raddr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Local address (for atomics: the 8-byte result buffer).
    pub laddr: u64,
    /// Local key.
    pub lkey: u32,
    /// Byte count of the data segment (ignored for atomics, which use 8).
    pub len: u32,
    /// Immediate for [`RefWqeOp::WriteImm`], as the receiver reads it (host
    /// order); the ctrl segment stores it big-endian.
    pub imm: u32,
    /// Addend of [`RefWqeOp::FetchAdd`].
    pub add: u64,
    /// Compare value of [`RefWqeOp::CompareSwap`].
    pub compare: u64,
    /// Swap value of [`RefWqeOp::CompareSwap`].
    pub swap: u64,
    /// Request a CQE ([`crate::mlx5::WQE_CTRL_CQ_UPDATE`]).
    pub signaled: bool,
    /// Fence ([`crate::mlx5::WQE_CTRL_FENCE`]).
    pub fence: bool,
    /// Solicited event ([`crate::mlx5::WQE_CTRL_SOLICITED`]).
    pub solicited: bool,
}

/// C form of [`WqeParams`]: `struct doorbell_wqe_params` in the shim.
#[repr(C)]
struct RawWqeParams {
    raddr: u64,
    laddr: u64,
    add: u64,
    compare: u64,
    swap: u64,
    op: u32,
    qpn: u32,
    rkey: u32,
    lkey: u32,
    len: u32,
    imm: u32,
    wqe_index: u16,
    signaled: u8,
    fence: u8,
    solicited: u8,
}

#[repr(C)]
struct RawHeaderValue {
    name: *const c_char,
    value: u64,
}

unsafe extern "C" {
    fn doorbell_ref_params_size() -> usize;
    fn doorbell_ref_wqe(p: *const RawWqeParams, buf: *mut u8, cap: usize) -> c_int;
    fn doorbell_ref_cqe(opcode: u8, owner: u8, wqe_counter: u16, syndrome: u8, vendor_syndrome: u8, qpn: u32, byte_cnt: u32, out: *mut u8);
    fn doorbell_ref_header_values(count: *mut usize) -> *const RawHeaderValue;
}

/// The WQE that mlx5dv.h's helpers build for `p`: 16, 48 or 64 bytes
/// (ds × 16), see [`RefWqeOp`].
pub fn reference_wqe(p: &WqeParams) -> Vec<u8> {
    // SAFETY: a pure function of its argument.
    assert_eq!(
        unsafe { doorbell_ref_params_size() },
        core::mem::size_of::<RawWqeParams>(),
        "shim/mlx5_ref.c and RawWqeParams disagree"
    );
    let raw = RawWqeParams {
        raddr: p.raddr,
        laddr: p.laddr,
        add: p.add,
        compare: p.compare,
        swap: p.swap,
        op: p.op.code(),
        qpn: p.qpn,
        rkey: p.rkey,
        lkey: p.lkey,
        len: p.len,
        imm: p.imm,
        wqe_index: p.wqe_index,
        signaled: p.signaled.into(),
        fence: p.fence.into(),
        solicited: p.solicited.into(),
    };
    let mut buf = vec![0u8; crate::mlx5::SEND_WQE_BB];
    // SAFETY: `raw` is a valid params struct and `buf` has `buf.len()`
    // writable bytes; the shim writes at most that many.
    let n = unsafe { doorbell_ref_wqe(&raw, buf.as_mut_ptr(), buf.len()) };
    let n = usize::try_from(n).expect("shim rejected a RefWqeOp it should know");
    buf.truncate(n);
    buf
}

/// A 64-byte CQE as the HCA writes it: `op_own = opcode << 4 | owner`,
/// `wqe_counter`, and the QP number, big-endian. For [`crate::mlx5::CQE_REQ_ERR`]
/// and [`crate::mlx5::CQE_RESP_ERR`] the layout is `struct mlx5_err_cqe`
/// (`syndrome`, `vendor_err_synd`, `s_wqe_opcode_qpn` = qpn; `byte_cnt`
/// ignored); otherwise `struct mlx5_cqe64` (`byte_cnt`, `sop_drop_qpn` =
/// qpn; syndromes ignored). Everything else is zero.
pub fn reference_cqe(opcode: u8, owner: bool, wqe_counter: u16, syndrome: u8, vendor_syndrome: u8, qpn: u32, byte_cnt: u32) -> [u8; 64] {
    let mut out = [0u8; 64];
    // SAFETY: `out` has the 64 writable bytes the shim fills.
    unsafe {
        doorbell_ref_cqe(
            opcode,
            owner.into(),
            wqe_counter,
            syndrome,
            vendor_syndrome,
            qpn,
            byte_cnt,
            out.as_mut_ptr(),
        )
    };
    out
}

/// Values the C compiler sees in mlx5dv.h: every constant mirrored in
/// [`crate::mlx5`] by its C name (`"MLX5_OPCODE_RDMA_WRITE"`), struct sizes
/// as `"sizeof(mlx5_cqe64)"` and field offsets as
/// `"offsetof(mlx5_cqe64,op_own)"`.
pub fn header_values() -> Vec<(&'static str, u64)> {
    let mut n = 0usize;
    // SAFETY: `n` is a valid out-pointer; the table is static.
    let table = unsafe { doorbell_ref_header_values(&mut n) };
    // SAFETY: the shim returns a static array of `n` entries.
    let entries = unsafe { core::slice::from_raw_parts(table, n) };
    entries
        .iter()
        .map(|e| {
            // SAFETY: names are static NUL-terminated string literals.
            let name = unsafe { CStr::from_ptr(e.name) };
            (name.to_str().expect("ASCII name"), e.value)
        })
        .collect()
}

/// One entry of [`header_values`].
pub fn header_value(name: &str) -> Option<u64> {
    header_values().into_iter().find(|(n, _)| *n == name).map(|(_, v)| v)
}
