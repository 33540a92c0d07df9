//! # doorbell — fused compute + communication GPU kernels in Rust
//!
//! Kernels are plain Rust ([`doorbell_kernels`]), compiled by cargo to PTX
//! for `sm_90` and embedded in the host binary. The same kernel source also
//! runs on a CPU emulator, so every example and test runs where there is no
//! GPU.
//!
//! ## Quick start
//! ```no_run
//! use doorbell::{Device, Backend, LaunchConfig};
//! use doorbell_kernels::{kernel, ptx};
//!
//! /// Your kernel, in your kernel crate (built to PTX by your `build.rs`).
//! #[kernel]
//! pub unsafe fn fused_multiply_add(a: *const f32, b: *const f32, c: *const f32, out: *mut f32, n: u64) {
//!     let mut i = ptx::global_thread_id_x() as u64;
//!     while i < n {
//!         let k = i as usize;
//!         unsafe { *out.add(k) = ptx::fma_f32(*a.add(k), *b.add(k), *c.add(k)) };
//!         i += ptx::grid_stride_x() as u64;
//!     }
//! }
//! # const MY_KERNELS_PTX: &str = ""; // include_str!(concat!(env!("OUT_DIR"), "/my_kernels.ptx"))
//!
//! # fn main() -> doorbell::Result<()> {
//! let dev = Device::open(Backend::Auto, 0)?;       // GPU if present, else the emulator
//! let module = dev.load_module(MY_KERNELS_PTX)?;   // the emulator runs the Rust function itself
//! let fma = module.function::<fused_multiply_add>()?;
//! let n = 1 << 20;
//! let a = dev.alloc_from(&vec![1.5f32; n])?;
//! let b = dev.alloc_from(&vec![2.0f32; n])?;
//! let c = dev.alloc_from(&vec![0.25f32; n])?;
//! let mut out = dev.alloc_zeroed::<f32>(n)?;
//! let stream = dev.new_stream()?;
//! // SAFETY: all four buffers hold n elements.
//! unsafe { stream.launch(&fma, LaunchConfig::linear(64, 256), (a.as_ptr(), b.as_ptr(), c.as_ptr(), out.as_mut_ptr(), n as u64))? };
//! stream.synchronize()?;
//! assert!(out.to_host()?.iter().all(|&x| x == 3.25));
//! # Ok(()) }
//! ```
//!
//! ## Backends
//! [`Backend::Auto`] picks the GPU when the CUDA driver loads and reports a
//! GPU, the emulator otherwise; `DOORBELL_DEVICE=gpu|cpu|auto` forces it
//! ([`Device::from_env`]). The CUDA driver is loaded at run time (cudarc,
//! dynamic loading): a binary built without CUDA runs everywhere, and asking
//! for a GPU where there is none is an [`Error`], never a panic.
//!
//! ## Thread safety and cleanup
//! [`Device`] is a cheap `Clone + Send + Sync` handle. Buffers free their
//! memory on drop after waiting for the device's outstanding work, like
//! `cudaFree`. Streams are in-order queues; errors surface at
//! [`Stream::synchronize`].
//!
//! ## Building kernels
//! See [`build`] for the PTX build helper a kernel crate's consumer calls from
//! its `build.rs`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(feature = "runtime")]
mod backend;
pub mod build;
#[cfg(feature = "runtime")]
pub mod coll;
#[cfg(feature = "runtime")]
pub mod comm;
#[cfg(feature = "runtime")]
mod device;
#[cfg(feature = "runtime")]
pub mod doctor;
#[cfg(feature = "runtime")]
pub mod env;
mod error;
#[cfg(feature = "runtime")]
mod family;
#[cfg(feature = "runtime")]
pub mod guide;
#[cfg(feature = "runtime")]
mod image;
#[cfg(feature = "runtime")]
mod launch;
#[cfg(feature = "runtime")]
mod logging;
#[cfg(feature = "runtime")]
mod memory;
#[cfg(feature = "runtime")]
mod module;
#[cfg(feature = "runtime")]
pub mod nic;
#[cfg(feature = "runtime")]
mod stream;
#[cfg(feature = "runtime")]
pub mod trace;
#[cfg(feature = "runtime")]
mod vars;
#[cfg(feature = "runtime")]
pub mod world;

pub use error::{Error, Result, StuckRanks};
#[cfg(feature = "runtime")]
pub use {
    device::{driver_present, gpu_count, Backend, Device},
    // The device crate, and its kernel traits at the top.
    doorbell_kernels as kernels,
    doorbell_kernels::{AnyFamily, ForTransport, Kernel, KernelArgs, KernelFamily, KernelParam},
    family::{AnyTransport, Family, FamilyHandle},
    image::{ImageChoice, ModuleImage, ModuleSource, SelectedImage},
    launch::{FunctionAttributes, LaunchConfig},
    logging::init_logging,
    memory::{DeviceBuffer, DeviceCopy, MappedBuffer},
    module::{ptx_is_built, Function, Module},
    stream::{Event, Stream},
    world::{World, WorldConfig},
};

/// The PTX of `doorbell-kernels`: the library's own kernels (collectives),
/// built for `sm_90` by this crate's build script. Examples and tests keep
/// their kernels in kernel crates of their own.
#[cfg(feature = "runtime")]
pub const KERNELS_PTX: &str = KERNELS.ptx;
/// [`KERNELS_PTX`] with its cubin for `sm_90` when the build found a
/// `ptxas` (see [`build`]): what the library loads.
#[cfg(feature = "runtime")]
pub const KERNELS: ModuleImage = module_image!("doorbell_kernels");
