//! # doorbell-softnic — a software mlx5 NIC
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod engine;

#[cfg(not(target_arch = "nvptx64"))]
mod error;
#[cfg(not(target_arch = "nvptx64"))]
pub mod host;
#[cfg(not(target_arch = "nvptx64"))]
pub mod verbs;

#[cfg(not(target_arch = "nvptx64"))]
pub use error::{Error, Result};
#[cfg(not(target_arch = "nvptx64"))]
pub use host::{
    link_from_env, link_from_str, EngineThread, FabricConfig, Sge, SoftCq, SoftDevice, SoftFabric, SoftMr, SoftPd, SoftQp, LINK_ENV,
};
#[cfg(not(target_arch = "nvptx64"))]
pub use verbs::{CompletionQueue, CqRing, MemoryRegion, QpEndpoint, QpRings, QueuePair, RdmaDevice};
