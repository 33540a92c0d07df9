//! The engine core: `no_std`, no allocation, no panics on what the rings
//! hold. It works on a fabric of [`Port`]s (fixed-size `#[repr(C)]` tables)
//! that some owner — the host wrapper today, a GPU-resident engine later —
//! keeps and passes in, and on a clock the owner supplies.
//!
//! | module | what |
//! |---|---|
//! | [`tables`] | memory regions, CQs, QPs, ports; keys, access flags, QP states, [`Reason`] |
//! | [`wqe`] | reading and checking WQEs from the SQ ring with the `#[descriptor]` decoders |
//! | [`exec`] | executing one WQE: checks, data movement, atomics, receive WQEs, CQEs |
//! | [`poll`] | [`poll_port`]: doorbells, doorbell-record reads, link timing, in-order execution, flushes |
//! | [`cqe`] | CQE64 / error-CQE images with the `#[descriptor]` encoders, owner bit, events |
//! | [`rq`] | the receive queue layout, and helpers to post receive WQEs |
//! | [`link`] | bandwidth + latency model and its `400gbps,2us` syntax |
//! | [`config`] | timeouts, atomic reply byte order, fault injection |
//! | [`mem`] | every access to memory the engine does not own, at `sys` scope through `doorbell_kernels::ptx` |

pub mod config;
pub mod cqe;
pub mod exec;
pub mod link;
pub mod mem;
pub mod poll;
pub mod rq;
pub mod tables;
pub mod wqe;

pub use config::{EngineConfig, FaultConfig, Rng};
pub use link::{parse_link, LinkModel, LinkParseError, LINK_FORMS};
pub use poll::{poll_port, PollReport};
pub use tables::{access, CqEntry, ErrorRecord, MrEntry, Port, PortStats, QpEntry, QpState, Reason};
