//! The exchange kernels' small steps: status words, phase stamps, the
//! bounded grid barrier, block-wide sharing and the dedup hash table.

use super::{request_key, STATUS_TIMEOUT};
use crate::ptx;

/// Two detail words in one argument: `lo` first, then `hi`.
#[inline(always)]
pub(super) fn pair(lo: u32, hi: u32) -> u64 {
    ((hi as u64) << 32) | lo as u64
}

/// Records the first error of this rank (first caller wins): `code` and
/// six detail words, two by two ([`pair`]: scalars, where an array would
/// live on the stack); one thread.
#[inline(never)]
pub(super) unsafe fn set_status_words(status: *mut u32, code: u32, w12: u64, w34: u64, w56: u64) {
    // SAFETY: `status` holds STATUS_WORDS words (launch contract).
    unsafe {
        if ptx::atom_cas_relaxed_gpu_u32(status, 0, code) == 0 {
            *status.add(1) = w12 as u32;
            *status.add(2) = (w12 >> 32) as u32;
            *status.add(3) = w34 as u32;
            *status.add(4) = (w34 >> 32) as u32;
            *status.add(5) = w56 as u32;
            *status.add(6) = (w56 >> 32) as u32;
        }
    }
}

/// [`set_status_words`] with four detail words.
#[inline(always)]
pub(super) unsafe fn set_status(status: *mut u32, code: u32, a: u32, b: u32, c: u32, d: u32) {
    // SAFETY: the caller's status words.
    unsafe { set_status_words(status, code, pair(a, b), pair(c, d), 0) }
}

#[inline(always)]
pub(super) unsafe fn status_code(status: *const u32) -> u32 {
    // SAFETY: as for `set_status`.
    unsafe { ptx::ld_relaxed_gpu_u32(status) }
}

/// Thread 0 of block 0 records `%globaltimer` in stamp `i` (if stamps are on).
#[inline(always)]
pub(super) unsafe fn stamp(stamps: *mut u64, i: usize) {
    if !stamps.is_null() && ptx::block_idx_x() == 0 && ptx::thread_rank_in_block() == 0 {
        // SAFETY: `stamps` holds STAMP_WORDS words (launch contract), i < STAMP_WORDS.
        unsafe { *stamps.add(i) = ptx::globaltimer_ns() };
    }
}

/// Barrier across the blocks of this rank's grid (all co-resident): every
/// thread calls it. Publishes every write made before it to every block
/// after it (gpu scope: one rank's grid lives on one GPU). Bounded: false
/// (for every thread of the block) when the budget ran out.
#[inline(always)]
pub(super) unsafe fn grid_sync(grid: *mut u32, budget_ns: u64) -> bool {
    let sh = ptx::dynamic_shared_mem() as *mut u32;
    // Callers come here right after one thread's work (a status report):
    // both barriers are the non-aligned form (LLVM may copy an aligned
    // barrier into that thread's path and the others', where a warp would
    // wait at two: `ptx_barriers` checks the PTX).
    ptx::sync_threads_divergent();
    if ptx::thread_rank_in_block() == 0 {
        // SAFETY: `grid` holds two words; `sh` SHARED_BYTES of shared memory.
        unsafe {
            let gen = grid.add(1);
            // The generation cannot move before this block arrives.
            let g0 = ptx::ld_acquire_gpu_u32(gen);
            ptx::fence_acq_rel_gpu();
            let arrived = ptx::atom_add_acq_rel_gpu_u32(grid, 1) + 1;
            let mut ok = true;
            if arrived == ptx::grid_dim_x() {
                ptx::st_relaxed_gpu_u32(grid, 0);
                ptx::st_release_gpu_u32(gen, g0.wrapping_add(1));
            } else {
                ok = crate::sync::spin_until(budget_ns, || ptx::ld_acquire_gpu_u32(gen) as u64, |v| v != g0 as u64).is_ok();
            }
            ptx::st_relaxed_cta_u32(sh, ok as u32);
        }
    }
    ptx::sync_threads_divergent();
    // SAFETY: written by thread 0 before the barrier.
    unsafe { ptx::ld_relaxed_cta_u32(sh) != 0 }
}

/// [`grid_sync`]; when its budget runs out, thread 0 records
/// `STATUS_TIMEOUT` with `step` (where the kernel stopped) and every thread
/// gets false.
#[inline(always)]
pub(super) unsafe fn grid_sync_or_report(grid: *mut u32, status: *mut u32, budget_ns: u64, step: u32) -> bool {
    // SAFETY: the launch's grid words and status words (the caller's).
    unsafe {
        if grid_sync(grid, budget_ns) {
            return true;
        }
        if ptx::thread_rank_in_block() == 0 {
            set_status(status, STATUS_TIMEOUT, step, 0, 0, 0);
        }
    }
    false
}

/// Thread 0's value, shared with the block (every thread calls it).
#[inline(always)]
pub(super) unsafe fn block_share(v: u32) -> u32 {
    let sh = (ptx::dynamic_shared_mem() as *mut u32).wrapping_add(1);
    // SAFETY: SHARED_BYTES of shared memory (launch contract).
    unsafe {
        if ptx::thread_rank_in_block() == 0 {
            ptx::st_relaxed_cta_u32(sh, v);
        }
        // After thread 0's store: non-aligned (as in `grid_sync`).
        ptx::sync_threads_divergent();
        let r = ptx::ld_relaxed_cta_u32(sh);
        ptx::sync_threads();
        r
    }
}

/// Inserts `(table, id)` for `tag`; returns (slot, inserted by this call).
#[inline(always)]
pub(super) unsafe fn hash_insert(keys: *mut u64, bits: u32, tag: u64, table: u32, id: u32) -> (u32, bool) {
    let body = request_key(table, id);
    let key = (tag << 40) | body;
    let mask = (1u64 << bits) - 1;
    let mut slot = body.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits);
    loop {
        // SAFETY: slot < 1 << bits, the table's size (launch contract).
        unsafe {
            let p = keys.add(slot as usize);
            let cur = ptx::ld_relaxed_gpu_u64(p);
            if cur == key {
                return (slot as u32, false);
            }
            if cur >> 40 != tag {
                // Empty, or a key of an earlier epoch: claim it.
                let seen = ptx::atom_cas_relaxed_gpu_u64(p, cur, key);
                if seen == cur {
                    return (slot as u32, true);
                }
                if seen == key {
                    return (slot as u32, false);
                }
                // Another key of this epoch took it: look again.
                continue;
            }
        }
        slot = (slot + 1) & mask;
    }
}
