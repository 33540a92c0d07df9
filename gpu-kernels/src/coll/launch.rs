//! A launch's own bookkeeping around the all-reduce's algorithm: the
//! checks of its arguments against the launch, the refusal of arguments
//! made before a failure the ranks met on, and each block's epoch (the
//! module docs of [`super`]).

use super::{hier, Algo, AllReduceArgs, MAX_RANKS};
use crate::coll::reduce::DType;
use crate::pipeline::{stale_launch, Failed};
use crate::ptx;
use crate::transport::Transport;

/// Traps unless the launch matches the arguments (grid, world, algorithm).
#[inline(always)]
pub(super) fn check<T: Transport>(t: &T, a: &AllReduceArgs) {
    let ok = ptx::grid_dim_x() == a.blocks
        && a.world == t.world_size()
        && (a.world as usize) <= MAX_RANKS
        && a.chunk_elems > 0
        && DType::from_u32(a.dtype).is_some()
        && Algo::from_u32(a.algo).is_some()
        && (!T::NODES || a.algo != Algo::Hierarchical as u32 || hier::valid(a));
    if !ok {
        ptx::trap();
    }
}

/// Checks the launch and returns `a` with the block's epoch in `epoch`:
/// one more than the last launch it completed (module docs). (A plain
/// pair of calls, not a function taking the body as a closure: such a
/// closure was compiled out of line, its arguments through a stack frame.)
#[inline(always)]
pub(super) fn begin<T: Transport>(t: &T, a: &AllReduceArgs) -> AllReduceArgs {
    check(t, a);
    let mut at = *a;
    // SAFETY: this block's epoch word, written only by its thread 0 (in
    // `finish`) after a barrier that follows every thread's read.
    at.epoch = unsafe { core::ptr::read_volatile(a.epoch_word(ptx::block_idx_x() as u64)) } + 1;
    at
}

/// Whether the ranks met on a failure since `a` was made
/// ([`AllReduceArgs::failures`]): the launch must then touch nothing
/// ([`stale_launch`]). Called first, apart from [`begin`]: with its
/// early return inside the copy `begin` makes, ptxas spilled more.
#[inline(always)]
pub(super) fn stale<T: Transport>(t: &T, a: &AllReduceArgs) -> bool {
    stale_launch(t.bounds().reporter.local_base, a.failures, u64::MAX, 0)
}

/// Counts the launch `at` in the block's epoch word when it succeeded.
#[inline(always)]
pub(super) fn finish(at: &AllReduceArgs, r: Result<(), Failed>) -> Result<(), Failed> {
    if r.is_ok() {
        ptx::sync_threads();
        if ptx::thread_rank_in_block() == 0 {
            // SAFETY: as in `begin`; the next launch reads it (stream order).
            unsafe { core::ptr::write_volatile(at.epoch_word(ptx::block_idx_x() as u64), at.epoch) };
        }
    }
    r
}
