//! # doorbell-kernels — the device side of doorbell
//!
//! Kernels written in plain Rust, compiled two ways from the same source:
//!
//! * for `nvptx64-nvidia-cuda` (`sm_90`), `no_std`, into one PTX module that
//!   the host crate embeds and loads with the CUDA driver;
//! * for the host, where the [CPU emulator](emu) runs every thread of a
//!   launch as a real OS thread, so kernels that spin on each other work.
//!
//! ## Tiers
//! 1. [`ptx`] — one tiny always-inline function per instruction: indices,
//!    block barrier, warp shuffles and votes, and the memory-ordering table
//!    `<op>_<sem>_<scope>_<type>` (`ld_acquire_gpu_u32`, `st_release_sys_u64`,
//!    `fence_acq_rel_gpu`, `atom_add_acq_rel_gpu_u32`, ...). Inline asm on the
//!    GPU (LLVM 22's NVPTX backend drops the ordering of Rust atomic RMWs, so
//!    we never rely on them), `std::sync::atomic` with the same semantics on
//!    the host.
//! 2. [`sync`] — documented publish/observe pairs and bounded spins.
//! 3. [`transport`] — the device communication API (the transport contract) and its
//!    transports; [`heap`] — the symmetric heap's runtime header; [`mlx5`] —
//!    the NIC's wire vocabulary and the GPU-driven send pipeline.
//!
//! The PTX of this crate holds the library's own kernels only; examples and
//! tests keep their kernels in kernel crates of their own, built by
//! `doorbell::build` exactly as a user's crate is.
//!
//! ## Writing a kernel
//! ```
//! use doorbell_kernels::{kernel, ptx};
//!
//! #[kernel]
//! pub unsafe fn axpy(a: f32, x: *const f32, y: *mut f32, n: u32) {
//!     let mut i = ptx::global_thread_id_x();
//!     while i < n {
//!         unsafe { *y.add(i as usize) = a * *x.add(i as usize) + *y.add(i as usize) };
//!         i += ptx::grid_stride_x();
//!     }
//! }
//! ```
//! The host launches it with `stream.launch::<axpy>(&function, cfg, (a, x, y, n))`
//! whichever backend is active; see the `doorbell` crate.
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch))]
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(clippy::missing_safety_doc)]
#![warn(missing_docs)]

extern crate self as doorbell_kernels;

pub use doorbell_macros::{descriptor, kernel, pipeline};

/// Declares a fieldless enum with `#[repr(u32)]` values, and its
/// `from_u32`: the variant a raw value (a kernel argument, a report's word)
/// stands for, the inverse of `as u32`.
macro_rules! u32_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $value:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[repr(u32)]
        $vis enum $name {
            $($(#[$vmeta])* $variant = $value,)+
        }

        impl $name {
            /// The variant whose `repr(u32)` value is `v`; `None` when no
            /// variant has it.
            pub const fn from_u32(v: u32) -> Option<$name> {
                Some(match v {
                    $($value => $name::$variant,)+
                    _ => return None,
                })
            }
        }
    };
}

// The collectives hold the library's only kernel entry points (`allreduce_*`,
// `emb_*`), exported with the `library-kernels` feature that only `doorbell`
// sets: a PTX module of another crate leaves them out (the collectives' code
// stays, for fused kernels), so the driver does not compile them there.
pub mod coll;
pub mod copy;
pub mod heap;
pub mod layout;
pub mod mlx5;
pub mod pipeline;
pub mod ptx;
pub mod sync;
pub mod trace;
pub mod transport;

#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;
#[cfg(not(target_arch = "nvptx64"))]
pub mod env_vars;

#[cfg(not(target_arch = "nvptx64"))]
mod launch;
#[cfg(not(target_arch = "nvptx64"))]
pub use launch::{AnyFamily, EntryVisitor, FamilyEntry, ForTransport, Kernel, KernelArgs, KernelFamily, KernelParam};

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // A device panic (failed bounds check, explicit panic) aborts the kernel;
    // the host sees CUDA_ERROR_LAUNCH_FAILED / ILLEGAL_INSTRUCTION.
    ptx::trap()
}
