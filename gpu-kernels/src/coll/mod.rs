//! Collectives, generic over the transport: the device side of
//! `doorbell::coll`.
//!
//! * [`reduce`] — the element types ([`f32`], [`Bf16`]) and the block-wide
//!   sum every reduction uses (`f32` accumulation in rank order, one
//!   rounding at the end: GPU, emulator and host reference agree bit for
//!   bit).
//! * [`allreduce`] — sum all-reduce: one-shot, two-shot (reduce-scatter +
//!   all-gather through peer pointers) and pipelined (reduce-scatter +
//!   all-gather through [`crate::pipeline`](mod@crate::pipeline) rings, with puts and signals: any
//!   transport; the fused all-reduce, where a producer computes each chunk
//!   and its reduction starts the moment it is done).
//! * [`selftest`] — the communicator's start-up self-test: a message per
//!   (sender, receiver, route) over the transport's typed puts and signals,
//!   waited for with a bounded wait.
//!
//! The kernels are exported per transport (`allreduce_p2p`, `_ibgda`, `_routed`; `selftest_p2p`, `_ibgda`) into the
//! library's PTX; the host's `doorbell::coll::AllReduce` sizes the buffers,
//! picks the algorithm and launches them.

pub mod allreduce;
pub mod embedding;
pub mod reduce;
pub mod selftest;

pub use reduce::{Bf16, DType, Element};

/// Most ranks a collective supports (peer addresses are held in registers,
/// and the signals of one step are waited for with one `wait_until_all`).
pub const MAX_RANKS: usize = 8;
