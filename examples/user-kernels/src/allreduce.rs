//! The fused all-reduce of the `allreduce` example: a producer computes
//! this rank's gradient chunk by chunk, and each chunk's reduce-scatter and
//! all-gather start the moment it is written (`doorbell_kernels::coll::
//! allreduce::fused`). Also the same producers alone, for the unfused and
//! CPU-driven baselines.
//!
//! The producers use `ptx::fma_f32` for every multiply-add (one rounding on
//! the GPU and on the host), so the host computes the very same gradient
//! bits for its reference.

use doorbell_kernels::coll::allreduce::{fused, AllReduceArgs, Chunk};
use doorbell_kernels::coll::{Bf16, DType};
use doorbell_kernels::transport::{Coop, Ibgda, P2p, Proxy, Routed, Transport};
use doorbell_kernels::{kernel, ptx};

/// `grad[i]` is [`grad_hash`].
pub const COMPUTE_HASH: u32 = 1;
/// `grad[i]` is [`grad_gemv`]: a small dense layer per element.
pub const COMPUTE_GEMV: u32 = 2;
/// Inputs of the GEMV-like producer.
pub const GEMV_K: u64 = 32;

/// A cheap per-element gradient: differs per rank, element and step.
#[inline(always)]
pub fn grad_hash(rank: u32, i: u64, step: u32) -> f32 {
    let h = (rank as u64 * 131 + i * 31 + step as u64 * 7) % 17;
    ptx::fma_f32(h as f32 - 8.0, 0.3125, (i % 5) as f32 * 0.01)
}

/// A GEMV-like gradient: `sum over k < GEMV_K of w(i, k) * x(rank, step, k)`,
/// accumulated with `fma` in `k` order.
#[inline(always)]
pub fn grad_gemv(rank: u32, i: u64, step: u32) -> f32 {
    let mut acc = 0.0f32;
    let mut k = 0;
    while k < GEMV_K {
        let w = ((i * 7 + k * 13) % 11) as f32 - 5.0;
        let x = ((rank as u64 * 3 + k * 5 + step as u64) % 9) as f32 - 4.0;
        acc = ptx::fma_f32(w * 0.125, x * 0.25, acc);
        k += 1;
    }
    acc
}

/// The gradient `compute` names.
#[inline(always)]
pub fn grad(compute: u32, rank: u32, i: u64, step: u32) -> f32 {
    if compute == COMPUTE_GEMV {
        grad_gemv(rank, i, step)
    } else {
        grad_hash(rank, i, step)
    }
}

/// Elements a producer thread computes at once ([`grad_lanes`]).
pub const ILP: usize = 4;

/// Calls `put(i, grad(first + i))` for `i = start, start + stride, ...`
/// below `n`, [`ILP`] elements at a time ([`grad_lanes`]), then the rest
/// one by one: the loop of the fused producer (stride: its block) and of
/// the standalone one (stride: its grid).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn for_each_grad(compute: u32, rank: u32, step: u32, first: u64, start: u64, stride: u64, n: u64, mut put: impl FnMut(u64, f32)) {
    let mut i = start;
    while i + (ILP as u64 - 1) * stride < n {
        let g = grad_lanes(compute, rank, first + i, stride, step);
        for (j, v) in g.iter().enumerate() {
            put(i + j as u64 * stride, *v);
        }
        i += ILP as u64 * stride;
    }
    while i < n {
        put(i, grad(compute, rank, first + i, step));
        i += stride;
    }
}

/// [`grad`] of the elements `i + j * stride`, `j < ILP`, computed side by
/// side: the same bits as [`grad`] per element (the same `fma`s in the
/// same order), but `ILP` independent chains per thread, so a thread keeps
/// the SM's pipelines busy at the fused kernel's occupancy (one or two
/// blocks per SM: the all-reduce's registers), not only at a plain
/// kernel's.
#[inline(always)]
pub fn grad_lanes(compute: u32, rank: u32, i: u64, stride: u64, step: u32) -> [f32; ILP] {
    let mut out = [0.0f32; ILP];
    if compute != COMPUTE_GEMV {
        for (j, o) in out.iter_mut().enumerate() {
            *o = grad_hash(rank, i + j as u64 * stride, step);
        }
        return out;
    }
    let mut k = 0;
    while k < GEMV_K {
        let x = ((rank as u64 * 3 + k * 5 + step as u64) % 9) as f32 - 4.0;
        for (j, o) in out.iter_mut().enumerate() {
            let w = (((i + j as u64 * stride) * 7 + k * 13) % 11) as f32 - 5.0;
            *o = ptx::fma_f32(w * 0.125, x * 0.25, *o);
        }
        k += 1;
    }
    out
}

/// Fused: this rank's gradient (`compute`, `step`), summed over all ranks
/// into `ar.output`, chunk by chunk as it is produced. Launch with the
/// argument and grid `AllReduce::fused_args` returns.
#[kernel(transports(P2p, Ibgda, Routed, Proxy))]
pub unsafe fn fused_grad_allreduce<T: Transport>(t: T, ar: AllReduceArgs, compute: u32, step: u32) {
    // SAFETY: the kernel's contract.
    unsafe { fused_grad(&t, &ar, compute, step) }
}

/// [`fused_grad_allreduce`](fn@fused_grad_allreduce) for blocks of up to 512 threads, one block
/// per SM (the name gives the block size it is built for; `launch_bounds`:
/// ptxas keeps it within 128 registers, so a block of 512 threads fits an
/// SM): twice the warps for the producer, some registers spilled. Plan it with `AllReduceOptions::threads = Some(512)`.
#[kernel(transports(P2p), launch_bounds(threads = 512, min_blocks = 1))]
pub unsafe fn fused_grad_allreduce_512<T: Transport>(t: T, ar: AllReduceArgs, compute: u32, step: u32) {
    // SAFETY: the kernel's contract.
    unsafe { fused_grad(&t, &ar, compute, step) }
}

/// [`fused_grad_allreduce`](fn@fused_grad_allreduce) for two blocks of 512 threads per SM (the
/// name: 512 threads, times 2 blocks; `launch_bounds`: 64 registers, the
/// rest spilled): the producer's warps of a plain kernel, the
/// communication code spilling. Plan it with
/// `threads = Some(512)` and two blocks per SM.
#[kernel(transports(P2p), launch_bounds(threads = 512, min_blocks = 2))]
pub unsafe fn fused_grad_allreduce_512x2<T: Transport>(t: T, ar: AllReduceArgs, compute: u32, step: u32) {
    // SAFETY: the kernel's contract.
    unsafe { fused_grad(&t, &ar, compute, step) }
}

/// The body of the three: the producer closure handed to `fused`.
#[inline(always)]
unsafe fn fused_grad<T: Transport>(t: &T, ar: &AllReduceArgs, compute: u32, step: u32) {
    let rank = t.rank();
    // SAFETY: `ar` comes from AllReduce::fused_args on this world; the
    // producer writes only the chunk it is given.
    let _ = unsafe {
        fused(t, ar, |chunk: Chunk| {
            let (me, n) = Coop::Block.index_and_size();
            // `chunk.write` (unsafe, in the block above): i < chunk.len.
            for_each_grad(compute, rank, step, chunk.first, me, n, chunk.len, |i, g| chunk.write(i, g));
        })
    };
}

/// The producer alone: elements `[first, first + n)` of this rank's
/// gradient into `out[0..n]` (`dtype`: 0 f32, 1 bf16), grid-stride.
#[kernel(no_spill)]
pub unsafe fn produce_grad(out: *mut u8, dtype: u32, first: u64, n: u64, rank: u32, compute: u32, step: u32) {
    let put = |i: u64, g: f32| {
        // SAFETY: `out` holds `n` elements of `dtype`, and i < n.
        unsafe {
            if dtype == DType::Bf16 as u32 {
                *(out as *mut Bf16).add(i as usize) = Bf16::from_f32(g);
            } else {
                *(out as *mut f32).add(i as usize) = g;
            }
        }
    };
    let (me, stride) = (ptx::global_thread_id_x() as u64, ptx::grid_stride_x() as u64);
    for_each_grad(compute, rank, step, first, me, stride, n, put);
}
