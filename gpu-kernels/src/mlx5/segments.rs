//! The mlx5 wire layouts, declared with [`#[descriptor]`](crate::descriptor):
//! send WQE segments (`struct mlx5_wqe_*_seg` in rdma-core's mlx5dv.h) and
//! the 64-byte CQE in its two shapes (`struct mlx5_cqe64`, `struct
//! mlx5_err_cqe`). Every multi-byte field is big-endian. Offsets are the
//! header's; `tests/tests/wqe_*.rs` checks them against the C compiler's view
//! and the header's own helpers.

use crate::descriptor;

/// `struct mlx5_wqe_ctrl_seg` (16 bytes): the first segment of every WQE.
#[descriptor(size = 16, endian = big)]
pub struct CtrlSeg {
    /// `MLX5_OPCODE_*` (low byte of `opmod_idx_opcode`).
    #[field(byte = 0, word = u32, bit = 0, width = 8)]
    pub opcode: u8,
    /// Producer index of the WQE, in 64-byte basic blocks (mod 2^16).
    #[field(byte = 0, word = u32, bit = 8, width = 16)]
    pub wqe_index: u16,
    /// Opcode modifier (0 for the operations here).
    #[field(byte = 0, word = u32, bit = 24, width = 8)]
    pub opmod: u8,
    /// WQE size in 16-byte units (`ds`).
    #[field(byte = 4, word = u32, bit = 0, width = 8)]
    pub ds: u8,
    /// QP number (24 bits).
    #[field(byte = 4, word = u32, bit = 8, width = 24)]
    pub qpn: u32,
    /// WQE signature (unused: 0).
    #[field(byte = 8)]
    pub signature: u8,
    /// `dci_stream_channel_id` (DC transport only: 0).
    #[field(byte = 9)]
    pub dci_stream_channel_id: u16,
    /// `MLX5_WQE_CTRL_FENCE | MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED`.
    #[field(byte = 11)]
    pub fm_ce_se: u8,
    /// Immediate data, as the receiver reads it (stored big-endian).
    #[field(byte = 12)]
    pub imm: u32,
}

/// `struct mlx5_wqe_raddr_seg` (16 bytes): the remote side of an RDMA or
/// atomic operation.
#[descriptor(size = 16, endian = big)]
pub struct RaddrSeg {
    /// Remote virtual address.
    #[field(byte = 0)]
    pub raddr: u64,
    /// Remote key.
    #[field(byte = 8)]
    pub rkey: u32,
}

/// `struct mlx5_wqe_data_seg` (16 bytes): one local scatter/gather entry.
#[descriptor(size = 16, endian = big)]
pub struct DataSeg {
    /// Bytes to transfer.
    #[field(byte = 0)]
    pub byte_count: u32,
    /// Local key.
    #[field(byte = 4)]
    pub lkey: u32,
    /// Local virtual address.
    #[field(byte = 8)]
    pub addr: u64,
}

/// `struct mlx5_wqe_atomic_seg` (16 bytes).
#[descriptor(size = 16, endian = big)]
pub struct AtomicSeg {
    /// Swap value (compare-and-swap) or addend (fetch-and-add).
    #[field(byte = 0)]
    pub swap_add: u64,
    /// Compare value (compare-and-swap; 0 for fetch-and-add).
    #[field(byte = 8)]
    pub compare: u64,
}

/// `struct mlx5_cqe64` (64 bytes): the fields a requester polls.
#[descriptor(size = 64, endian = big)]
pub struct Cqe64 {
    /// `srqn_uidx`.
    #[field(byte = 32)]
    pub srqn_uidx: u32,
    /// `imm_inval_pkey`: immediate of a receive with immediate.
    #[field(byte = 36)]
    pub imm_inval_pkey: u32,
    /// `byte_cnt`: bytes transferred (responder) / read.
    #[field(byte = 44)]
    pub byte_cnt: u32,
    /// `timestamp`.
    #[field(byte = 48)]
    pub timestamp: u64,
    /// QP number (low 24 bits of `sop_drop_qpn`).
    #[field(byte = 56, word = u32, bit = 0, width = 24)]
    pub qpn: u32,
    /// `sop_drop_qpn` high byte.
    #[field(byte = 56, word = u32, bit = 24, width = 8)]
    pub sop_drop: u8,
    /// `wqe_counter`: the WQE index this completion reports (for a
    /// requester: every WQE up to and including it is done).
    #[field(byte = 60)]
    pub wqe_counter: u16,
    /// `signature`.
    #[field(byte = 62)]
    pub signature: u8,
    /// Owner bit (bit 0 of `op_own`): toggles each pass over the CQ ring.
    #[field(byte = 63, word = u8, bit = 0, width = 1)]
    pub owner: bool,
    /// Solicited-event / format bits of `op_own` (bits 1..4).
    #[field(byte = 63, word = u8, bit = 1, width = 3)]
    pub op_own_flags: u8,
    /// CQE opcode (`MLX5_CQE_*`, high nibble of `op_own`).
    #[field(byte = 63, word = u8, bit = 4, width = 4)]
    pub opcode: u8,
}

/// `struct mlx5_err_cqe` (64 bytes): the CQE of a failed WQE (opcode
/// `MLX5_CQE_REQ_ERR` or `MLX5_CQE_RESP_ERR`).
#[descriptor(size = 64, endian = big)]
pub struct ErrCqe {
    /// `srqn`.
    #[field(byte = 32)]
    pub srqn: u32,
    /// `vendor_err_synd`: vendor detail.
    #[field(byte = 54)]
    pub vendor_err_synd: u8,
    /// `syndrome`: `MLX5_CQE_SYNDROME_*`.
    #[field(byte = 55)]
    pub syndrome: u8,
    /// QP number (low 24 bits of `s_wqe_opcode_qpn`).
    #[field(byte = 56, word = u32, bit = 0, width = 24)]
    pub qpn: u32,
    /// Opcode of the failed WQE (high byte of `s_wqe_opcode_qpn`).
    #[field(byte = 56, word = u32, bit = 24, width = 8)]
    pub wqe_opcode: u8,
    /// `wqe_counter` of the failed WQE.
    #[field(byte = 60)]
    pub wqe_counter: u16,
    /// `signature`.
    #[field(byte = 62)]
    pub signature: u8,
    /// Owner bit of `op_own`.
    #[field(byte = 63, word = u8, bit = 0, width = 1)]
    pub owner: bool,
    /// CQE opcode (high nibble of `op_own`).
    #[field(byte = 63, word = u8, bit = 4, width = 4)]
    pub opcode: u8,
}

const _: () = assert!(CtrlSeg::SIZE == 16 && RaddrSeg::SIZE == 16 && DataSeg::SIZE == 16 && AtomicSeg::SIZE == 16);
const _: () = assert!(Cqe64::SIZE == 64 && ErrCqe::SIZE == 64);
