//! Kernels over the mlx5 builders, for byte-exact tests (GPU and emulator
//! against the host encoder and rdma-core's helpers), the doorbell sequence
//! and benchmarks.

use doorbell_kernels::mlx5::cq::{encode_poll_result, poll_cq, POLL_RESULT_WORDS};
use doorbell_kernels::mlx5::queue::{post_batch_warp, QpHandle};
use doorbell_kernels::mlx5::wqe::{store_wqe, wqe_words, write_wqe, WqeRequest};
use doorbell_kernels::{kernel, ptx};

/// Builds WQE `i` of `reqs[0..n]` into `out[16 i .. 16 i + 16]` (64 bytes
/// each, 16-byte aligned), one WQE per thread, grid-stride. The requests'
/// own `wqe_index`, `qpn` and flags are used as given.
#[kernel(no_spill)]
pub unsafe fn mlx5_write_wqes(reqs: *const WqeRequest, n: u32, out: *mut u32) {
    let mut i = ptx::global_thread_id_x();
    while i < n {
        // SAFETY: `reqs` has n entries and `out` 16 n words.
        unsafe {
            let r = *reqs.add(i as usize);
            write_wqe(out.add(i as usize * 16), &r);
        }
        i += ptx::grid_stride_x();
    }
}

/// Posts `reqs[0..n]` to the QP: each warp takes batches of up to 32
/// consecutive requests (warp-stride over the grid's warps), one WQE per
/// lane, reserves slots, writes, and submits in order (doorbell record, then
/// doorbell). Only the last WQE of each batch is signaled. Lane 0 of each
/// warp writes `status[global warp]` = 1 (ok) or 2 (a submit ran out of
/// budget).
///
/// Launch with a multiple of 32 threads per block; `status` holds one word
/// per warp of the grid; at most `qp.sq_size` requests.
#[kernel(no_spill)]
pub unsafe fn mlx5_post_wqes(qp: QpHandle, reqs: *const WqeRequest, n: u32, budget_ns: u64, status: *mut u32) {
    let warps_per_block = ptx::block_dim_x() / 32;
    let warp = ptx::block_idx_x() * warps_per_block + ptx::thread_idx_x() / 32;
    let nwarps = ptx::grid_dim_x() * warps_per_block;
    let lane = ptx::lane_id();
    let mut ok = true;
    let mut batch = warp;
    while batch * 32 < n {
        let first = batch * 32;
        let count = (n - first).min(32);
        let mine = first + lane.min(count - 1);
        // SAFETY: `mine < n`.
        let req = unsafe { *reqs.add(mine as usize) };
        // SAFETY: the caller passes a valid handle and at most sq_size requests.
        if unsafe { post_batch_warp(&qp, &req, count, true, budget_ns) }.is_err() {
            ok = false;
            break;
        }
        batch += nwarps;
    }
    if lane == 0 {
        // SAFETY: one status word per warp.
        unsafe { *status.add(warp as usize) = if ok { 1 } else { 2 } };
    }
}

/// Thread 0 polls the QP's CQ `count` times, for `targets[k]` (a
/// `wqe_counter`), writing 8 result words per poll to `out`
/// ([`doorbell_kernels::mlx5::cq::encode_poll_result`]); stops after the first error.
#[kernel(no_spill)]
pub unsafe fn mlx5_poll_cq(qp: QpHandle, targets: *const u32, count: u32, budget_ns: u64, out: *mut u32) {
    if ptx::global_thread_id_x() != 0 {
        return;
    }
    for k in 0..count as usize {
        // SAFETY: `targets` has `count` entries, `out` 8 × count words.
        unsafe {
            let r = poll_cq(&qp, *targets.add(k) as u16, budget_ns);
            let w = encode_poll_result(&r);
            for (j, x) in w.iter().enumerate() {
                *out.add(k * POLL_RESULT_WORDS + j) = *x;
            }
            if r.is_err() {
                return;
            }
        }
    }
}

/// Benchmark: every warp builds `k` WQEs (k / 32 rounds of one WQE per lane)
/// from `reqs[lane]`, varying `wqe_index` and the remote address per round,
/// into its own ring of `ring_wqes` basic blocks (a power of 2) at
/// `ring + warp × ring_wqes × 16` words. Lane 0 writes the warp's elapsed
/// `%globaltimer` nanoseconds to `ns[global warp]`.
#[kernel(no_spill)]
pub unsafe fn mlx5_bench_write_wqes(reqs: *const WqeRequest, ring: *mut u32, ring_wqes: u32, k: u32, ns: *mut u64) {
    let warps_per_block = ptx::block_dim_x().div_ceil(32);
    let warp = ptx::block_idx_x() * warps_per_block + ptx::thread_idx_x() / 32;
    let lane = ptx::lane_id();
    // SAFETY: `reqs` has 32 entries.
    let base = unsafe { *reqs.add(lane as usize) };
    // SAFETY: each warp owns ring_wqes basic blocks.
    let my_ring = unsafe { ring.add(warp as usize * ring_wqes as usize * 16) };
    ptx::sync_warp(ptx::FULL_MASK);
    let t0 = ptx::globaltimer_ns();
    let rounds = k / 32;
    let mut j = 0;
    while j < rounds {
        let idx = j * 32 + lane;
        let mut r = base;
        r.wqe_index = idx as u16;
        r.raddr = base.raddr.wrapping_add(j as u64 * base.len as u64);
        let w = wqe_words(&r);
        // SAFETY: the slot is inside this warp's ring.
        unsafe { store_wqe(my_ring.add((idx & (ring_wqes - 1)) as usize * 16), &w) };
        j += 1;
    }
    ptx::sync_warp(ptx::FULL_MASK);
    let t1 = ptx::globaltimer_ns();
    if lane == 0 {
        // SAFETY: one word per warp.
        unsafe { *ns.add(warp as usize) = t1.wrapping_sub(t0) };
    }
}
