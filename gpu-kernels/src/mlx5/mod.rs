//! mlx5 (ConnectX) send path built by the GPU itself: WQEs, doorbells, CQ
//! polling (IBGDA).
//!
//! | layer | what |
//! |---|---|
//! | [`wire`] | the mlx5 wire vocabulary (opcodes, flags, sizes, offsets, syndromes), defined once for the device code and `rdma-sys-ext` |
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
//! cannot depend on rdma-core); `rdma-sys-ext` checks them against the header
//! at compile time.

pub mod cq;
pub mod queue;
pub mod segments;
pub mod wire;
pub mod wqe;

#[cfg(not(target_arch = "nvptx64"))]
pub mod dump;

pub use cq::{poll_cq, Completion, CqError, CqeSyndrome};
pub use queue::{
    queue_failed, reserve_wqe_slots_warp, ring_doorbell, submit, update_doorbell_record, QpHandle, SubmitTimeout, QP_GPU_SCOPE,
};
pub use segments::{AtomicSeg, Cqe64, CtrlSeg, DataSeg, ErrCqe, RaddrSeg};
pub use wire::*;
pub use wqe::{wqe_words, WqeOp, WqeRequest};
