//! Kernels of doorbell's own tests. Built to PTX by `tests/build.rs` with
//! `doorbell::build`, exactly as a user's kernel crate is, so none of them
//! ships in the library's PTX (`doorbell::KERNELS_PTX`).
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
#![deny(unsafe_op_in_unsafe_fn)]
// A kernel's parameters are its launch interface (its argument tuple).
#![allow(clippy::too_many_arguments)]
#![allow(clippy::missing_safety_doc)]

pub mod contract;
pub mod family;
pub mod golden;
pub mod mlx5;
pub mod pipeline;
pub mod testing;
pub mod typed;
