//! A user's kernel crate: what a crate of your own kernels looks like.
//!
//! It builds twice: for `nvptx64-nvidia-cuda` into one PTX file (the
//! consumer's `build.rs` calls `doorbell::build::PtxBuilder`), and for the
//! host, where the CPU emulator runs the same functions. The two crate
//! attributes below are all the set-up it needs.
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
#![deny(unsafe_op_in_unsafe_fn)]
// A kernel's parameters are its launch interface (its argument tuple).
#![allow(clippy::too_many_arguments)]

use doorbell_kernels::{kernel, ptx};

pub mod allreduce;
pub mod comm;
pub mod embedding;
pub mod fused;
pub mod ibgda_bench;
pub mod shift;

/// `out[i] = a[i] * b[i] + c[i]` over `n` elements, grid-stride.
#[kernel(no_spill)]
pub unsafe fn fused_multiply_add(a: *const f32, b: *const f32, c: *const f32, out: *mut f32, n: u64) {
    let mut i = ptx::global_thread_id_x() as u64;
    let stride = ptx::grid_stride_x() as u64;
    while i < n {
        let k = i as usize;
        // SAFETY: the launcher passes buffers of at least `n` elements.
        unsafe { *out.add(k) = ptx::fma_f32(*a.add(k), *b.add(k), *c.add(k)) };
        i += stride;
    }
}

/// Byte histogram: `bins[b]` += number of bytes equal to `b` in `data[..n]`.
/// Each block counts into its own 256 bins in shared memory (launch with
/// 1024 bytes of dynamic shared memory), then adds them to `bins` with
/// relaxed GPU-scope atomics.
#[kernel(no_spill)]
pub unsafe fn byte_histogram(data: *const u8, n: u64, bins: *mut u32) {
    let local = ptx::dynamic_shared_mem() as *mut u32;
    let t = ptx::thread_idx_x();
    let threads = ptx::block_dim_x();
    let mut b = t;
    while b < 256 {
        // SAFETY: 256 words of shared memory.
        unsafe { *local.add(b as usize) = 0 };
        b += threads;
    }
    ptx::sync_threads();
    let mut i = ptx::global_thread_id_x() as u64;
    let stride = ptx::grid_stride_x() as u64;
    while i < n {
        // SAFETY: `data` holds `n` bytes; shared bins as above.
        unsafe { ptx::atom_add_relaxed_cta_u32(local.add(*data.add(i as usize) as usize), 1) };
        i += stride;
    }
    ptx::sync_threads();
    let mut b = t;
    while b < 256 {
        // SAFETY: `bins` holds 256 words.
        unsafe {
            let c = *local.add(b as usize);
            if c != 0 {
                ptx::atom_add_relaxed_gpu_u32(bins.add(b as usize), c);
            }
        }
        b += threads;
    }
}
