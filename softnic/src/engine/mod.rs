//! The engine core: `no_std`, no allocation, no panics on what the rings
//! hold. It works on a fabric of [`Port`]s (fixed-size `#[repr(C)]` tables)
//! that some owner — the host wrapper, or the GPU-resident engine kernel
//! ([`resident`]) — keeps and passes in, and on a clock the owner supplies.
//! One source, compiled for the host and for `nvptx64`.
//!
//! | module | what |
//! |---|---|
//! | [`tables`] | memory regions, CQs, QPs, ports; keys, access flags, QP states, [`Reason`] |
//! | [`wqe`] | reading and checking WQEs from the SQ ring with the `#[descriptor]` decoders |
//! | [`burst`] | the GPU engine's block-wide path for runs of small RDMA WRITEs |
//! | [`exec`] | executing one WQE: checks, data movement, atomics, receive WQEs, CQEs |
//! | [`inbox`] | the responder's side, kept by its owner: events a requester posts to a responder QP's inbox, applied by its engine |
//! | [`poll`] | [`poll_port`]: doorbells, doorbell-record reads, link timing, in-order execution, flushes |
//! | [`cqe`] | CQE64 / error-CQE images with the `#[descriptor]` encoders, owner bit, events |
//! | [`rq`] | the receive queue layout, and helpers to post receive WQEs |
//! | [`link`] | bandwidth + latency model and its `400gbps,2us` syntax |
//! | [`config`] | timeouts, atomic reply byte order, fault injection |
//! | [`mem`] | every access to memory the engine does not own, at `sys` scope through `doorbell_kernels::ptx` |
//! | [`mover`] | the byte movement, split from the control: [`PayloadMover`], the host thread's `memmove`, the block's 16-byte split |
//! | [`resident`] | the engine as a persistent block (the `softnic_engine_*` kernels): control block, block mover, stop word |

pub mod burst;
pub mod config;
pub mod control;
pub mod cqe;
pub mod exec;
pub mod inbox;
pub mod link;
pub mod mem;
pub mod mover;
pub mod poll;
pub mod resident;
pub mod rq;
pub mod tables;
pub mod trace;
pub mod wqe;

pub use config::{EngineConfig, EngineRng, FaultConfig};
pub use link::{parse_link, LinkModel, LinkParseError, LINK_FORMS};
pub use mover::{PayloadMover, Phase, ThreadMover, PHASES};
pub use poll::{poll_port, PollReport};
pub use resident::{EngineCounters, EngineCtl};
pub use tables::{
    access, CqEntry, ErrorRecord, MrEntry, Port, PortStats, PortTable, Ports, QpEntry, QpState, Reason, Window, MAX_ENGINE_BLOCKS,
    MAX_PORTS, MAX_SHARDS,
};
