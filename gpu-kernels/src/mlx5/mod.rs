//! mlx5 (ConnectX) send path built by the GPU itself: WQEs, doorbells, CQ
//! polling (IBGDA).
//!
//! | layer | what |
//! |---|---|
//! | [`segments`] | wire layouts declared with [`#[descriptor]`](crate::descriptor): [`CtrlSeg`], [`RaddrSeg`], [`DataSeg`], [`AtomicSeg`], [`Cqe64`], [`ErrCqe`] |
//! | [`wqe`] | one WQE = one 64-byte basic block: [`WqeRequest`] → words ([`wqe_words`]) / bytes, and the per-lane device writers `write_*_wqe` |
//! | [`queue`] | the device handle [`QpHandle`] and the send pipeline: [`reserve_wqe_slots_warp`] → `write_*_wqe` → `sync_warp` → [`submit`] ([`update_doorbell_record`], [`ring_doorbell`]) |
//! | [`cq`] | [`poll_cq`]: owner-bit phase, opcode, `wqe_counter`, error syndromes, bounded by a budget |
//! | `dump` (host) | the `wqe_dump` example's parser and formatter |
//!
//! WQE layouts: NOP = ctrl (ds 1); RDMA write / write-with-immediate / read
//! = ctrl + raddr + data (ds 3); fetch-add / compare-swap = ctrl + raddr +
//! atomic + data (8 bytes: the local buffer that receives the old value, ds
//! 4). Only the last WQE of a batch asks for a completion.
//!
//! Everything here is `no_std` and builds for `nvptx64`; the same code runs on
//! the CPU emulator. The constants restate rdma-core's `mlx5dv.h` (this crate
//! cannot depend on rdma-core); the tests compare them with
//! `rdma_sys_ext::mlx5` and the header itself.

pub mod cq;
pub mod queue;
pub mod segments;
pub mod wqe;

#[cfg(not(target_arch = "nvptx64"))]
pub mod dump;

pub use cq::{poll_cq, Completion, CqError, CqeSyndrome};
pub use queue::{reserve_wqe_slots_warp, ring_doorbell, submit, update_doorbell_record, QpHandle, SubmitTimeout};
pub use segments::{AtomicSeg, Cqe64, CtrlSeg, DataSeg, ErrCqe, RaddrSeg};
pub use wqe::{wqe_words, WqeOp, WqeRequest};

/// `MLX5_OPCODE_NOP`.
pub const OPCODE_NOP: u8 = 0x00;
/// `MLX5_OPCODE_RDMA_WRITE`.
pub const OPCODE_RDMA_WRITE: u8 = 0x08;
/// `MLX5_OPCODE_RDMA_WRITE_IMM`.
pub const OPCODE_RDMA_WRITE_IMM: u8 = 0x09;
/// `MLX5_OPCODE_SEND`.
pub const OPCODE_SEND: u8 = 0x0a;
/// `MLX5_OPCODE_RDMA_READ`.
pub const OPCODE_RDMA_READ: u8 = 0x10;
/// `MLX5_OPCODE_ATOMIC_CS`.
pub const OPCODE_ATOMIC_CS: u8 = 0x11;
/// `MLX5_OPCODE_ATOMIC_FA`.
pub const OPCODE_ATOMIC_FA: u8 = 0x12;

/// `MLX5_WQE_CTRL_FENCE`: wait for earlier reads/atomics before executing.
pub const WQE_CTRL_FENCE: u8 = 0x80;
/// `MLX5_WQE_CTRL_CQ_UPDATE`: write a CQE when this WQE completes.
pub const WQE_CTRL_CQ_UPDATE: u8 = 0x08;
/// `MLX5_WQE_CTRL_SOLICITED`: solicited event at the receiver.
pub const WQE_CTRL_SOLICITED: u8 = 0x02;

/// `MLX5_SEND_WQE_BB`: bytes of a send-queue basic block (one WQE here).
pub const SEND_WQE_BB: usize = 64;
/// Bytes of a CQE (`struct mlx5_cqe64`).
pub const CQE_SIZE: usize = 64;
/// `MLX5_CQE_OWNER_MASK`.
pub const CQE_OWNER_MASK: u8 = 1;
/// `MLX5_CQE_REQ`: a requester (send queue) completion.
pub const CQE_REQ: u8 = 0;
/// `MLX5_CQE_RESP_WR_IMM`.
pub const CQE_RESP_WR_IMM: u8 = 1;
/// `MLX5_CQE_RESP_SEND`.
pub const CQE_RESP_SEND: u8 = 2;
/// `MLX5_CQE_REQ_ERR`: a requester error completion (`struct mlx5_err_cqe`).
pub const CQE_REQ_ERR: u8 = 13;
/// `MLX5_CQE_RESP_ERR`: a responder error completion.
pub const CQE_RESP_ERR: u8 = 14;
/// `MLX5_CQE_INVALID`: what a CQE holds before the NIC first writes it.
pub const CQE_INVALID: u8 = 15;
