//! The backward ([`backward()`]): gradients staged per key, sent to the
//! owners, accumulated and applied with SGD; the protocol is in the
//! parent module's docs.

use super::common::{block_share, grid_sync_or_report, set_status, stamp};
use super::rows::{add_row, apply_row, grid_warp};
use super::{BwdArgs, EmbBufs, EmbShape, FIRST, PAD, PUT_PIECE_BYTES, STAMP_BWD_AT, STATUS_NO_FORWARD, STATUS_TIMEOUT, STATUS_TRANSPORT};
use crate::ptx;
use crate::transport::{Cmp, Coop, RawSignal, RawXfer, Transport};

/// Backward of the forward with the same epoch: see the module docs.
/// `a.grad` `[batch][tables][dim]` (local), SGD step `a.lr`, `a.seq` the
/// number of backward launches so far, this one included (the same on
/// every rank). Every thread of the grid calls it.
///
/// # Safety
/// As for [`super::forward()`]; `a.epoch` is the epoch of this rank's last
/// forward, and each forward has at most one backward.
#[inline(always)]
pub unsafe fn backward<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, a: &BwdArgs) {
    let n = t.world_size();
    let me = t.rank();
    let tid = ptx::thread_rank_in_block();
    let lane = ptx::lane_id() as usize;
    let dim = s.dim as usize;
    let (grad, budget_ns) = (a.grad, a.budget_ns);
    // SAFETY: buffers as EmbBufs documents, sized from `s` and the world
    // (launch contract); every index below stays inside them.
    unsafe {
        stamp(b.stamps, STAMP_BWD_AT);
        // Only after a forward that passed the vote: its verdict is the
        // same on every rank, so every rank goes the same way.
        let fwd = ptx::ld_relaxed_gpu_u64(b.verdict);
        if fwd != a.epoch << 1 {
            if tid == 0 {
                set_status(b.status, STATUS_NO_FORWARD, fwd as u32, 0, 0, 0);
                // No data; the adds keep the owners' counts in step.
                for o in 0..n {
                    if o != me {
                        let _ = t.signal_raw(o, RawSignal::add(b.grad_sig.add(me as usize), 1));
                    }
                }
            }
            return;
        }
        // 1. A key's first occurrence starts its staging row: 0 + g.
        for_lookups(
            s,
            b,
            n,
            grad,
            |sl| sl & FIRST != 0,
            |row, g| {
                let mut k = lane;
                while k < dim {
                    *row.add(k) = 0.0 + *g.add(k);
                    k += 32;
                }
            },
        );
        if !grid_sync_or_report(b.grid, b.status, budget_ns, 3) {
            return;
        }
        stamp(b.stamps, STAMP_BWD_AT + 1);
        // 2. The other occurrences add theirs.
        for_lookups(
            s,
            b,
            n,
            grad,
            |sl| sl & FIRST == 0,
            |row, g| {
                let mut k = lane;
                while k < dim {
                    ptx::red_add_relaxed_gpu_f32(row.add(k), *g.add(k));
                    k += 32;
                }
            },
        );
        if !grid_sync_or_report(b.grid, b.status, budget_ns, 4) {
            return;
        }
        stamp(b.stamps, STAMP_BWD_AT + 2);
        send(t, s, b, a.epoch);
        stamp(b.stamps, STAMP_BWD_AT + 3);
        accumulate_and_apply(t, s, b, a);
    }
}

/// Step 3, send: every warp puts whole rows, [`PUT_PIECE_BYTES`] at a
/// time, in the owner's request-list order; this rank's own rows stay.
/// Then each block fences and adds 1 to each owner's `grad_sig`.
#[inline(always)]
unsafe fn send<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, epoch: u64) {
    let n = t.world_size();
    let me = t.rank();
    let par = (epoch & 1) as usize;
    let cap = s.cap as usize;
    let dim = s.dim as usize;
    let lane = ptx::lane_id() as usize;
    let (gw, warps) = grid_warp();
    // SAFETY: as for `backward`.
    unsafe {
        let counts = b.counts.add(par * n as usize);
        let piece = (PUT_PIECE_BYTES as usize / (dim * 4)).max(1);
        let mut base = 0u32; // pieces of the owners before this one: spreads the owners over the warps
        for o in 0..n {
            if o == me {
                continue;
            }
            let c = ptx::ld_relaxed_gpu_u32(counts.add(o as usize)).min(s.cap) as usize;
            let pieces = c.div_ceil(piece) as u32;
            let mut q = (gw + warps - base % warps) % warps;
            while q < pieces {
                let u0 = q as usize * piece;
                let rows = piece.min(c - u0);
                let dst = b.grad_in.add((me as usize * cap + u0) * dim);
                let src = b.rows_in.add((o as usize * cap + u0) * dim);
                let x = RawXfer {
                    dst: dst as *mut u8,
                    src: src as *const u8,
                    bytes: (rows * dim * 4) as u64,
                    nbi: false,
                };
                if t.put_raw(Coop::Warp, o, x, None).is_err() && lane == 0 {
                    set_status(b.status, STATUS_TRANSPORT, o, 3, 0, 0);
                }
                q += warps;
            }
            base = base.wrapping_add(pieces);
        }
        ptx::sync_threads();
        if ptx::thread_rank_in_block() == 0 {
            // As in the forward: the block's puts, then its signals.
            t.fence();
            for o in 0..n {
                if o != me && t.signal_raw(o, RawSignal::add(b.grad_sig.add(me as usize), 1)).is_err() {
                    set_status(b.status, STATUS_TRANSPORT, o, 4, 0, 0);
                }
            }
        }
    }
}

/// Steps 4 and 5 (owner): once every requester's blocks have signalled,
/// every requester's rows are added into the accumulator; one grid barrier;
/// then each element's sum is taken (and reset) by one thread and applied.
#[inline(always)]
unsafe fn accumulate_and_apply<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, a: &BwdArgs) {
    let n = t.world_size();
    let me = t.rank();
    let par = (a.epoch & 1) as usize;
    let cap = s.cap as usize;
    let dim = s.dim as usize;
    let tid = ptx::thread_rank_in_block();
    let blocks = ptx::grid_dim_x();
    let (gw, warps) = grid_warp();
    // SAFETY: as for `backward`.
    unsafe {
        let rcounts = b.rcounts.add(par * n as usize);
        let mut waited = 0u32;
        if tid == 0 {
            for r in 0..n {
                if r != me && t.wait_word_raw(b.grad_sig.add(r as usize), Cmp::Ge, a.seq * blocks as u64).is_err() {
                    waited = 1;
                    break;
                }
            }
        }
        if block_share(waited) != 0 {
            if tid == 0 {
                set_status(b.status, STATUS_TIMEOUT, 5, 0, 0, 0);
            }
            return;
        }
        stamp(b.stamps, STAMP_BWD_AT + 4);
        for r in 0..n as usize {
            let c = ptx::ld_relaxed_gpu_u32(rcounts.add(r)).min(s.cap);
            let list = b.req_in.add((par * n as usize + r) * cap);
            let from = if r == me as usize { b.rows_in } else { b.grad_in };
            let mut u = gw;
            while u < c {
                let key = *list.add(u as usize);
                let (table, id) = ((key >> 32) as u32, key as u32);
                if table < s.tables && id < s.rows && id % n == me {
                    let acc = b.gacc.add((table as usize * s.shard_rows as usize + (id / n) as usize) * dim);
                    add_row(acc, from.add((r * cap + u as usize) * dim), dim);
                }
                u += warps;
            }
        }
        if !grid_sync_or_report(b.grid, b.status, a.budget_ns, 6) {
            return;
        }
        stamp(b.stamps, STAMP_BWD_AT + 5);
        // 5. Apply: each element's sum is taken (and reset) by one thread.
        for r in 0..n as usize {
            let c = ptx::ld_relaxed_gpu_u32(rcounts.add(r)).min(s.cap);
            let list = b.req_in.add((par * n as usize + r) * cap);
            let mut u = gw;
            while u < c {
                let key = *list.add(u as usize);
                let (table, id) = ((key >> 32) as u32, key as u32);
                if table < s.tables && id < s.rows && id % n == me {
                    let off = (table as usize * s.shard_rows as usize + (id / n) as usize) * dim;
                    apply_row(b.gacc.add(off), b.tables.add(off), dim, a.lr);
                }
                u += warps;
            }
        }
        stamp(b.stamps, STAMP_BWD_AT + 6);
    }
}

/// Every lookup of this rank that `pick`s its slot word (top bit: first
/// occurrence), with its key's staging row and its bag's gradient row; one
/// warp per bag, grid-stride. The forward's routing only: no id is read.
#[inline(always)]
unsafe fn for_lookups(s: &EmbShape, b: &EmbBufs, n: u32, grad: *const f32, pick: impl Fn(u32) -> bool, f: impl Fn(*mut f32, *const f32)) {
    let (gw, warps) = grid_warp();
    let per_table = s.batch as u64 * s.pooling as u64;
    let (cap, dim) = (s.cap as usize, s.dim as usize);
    let bags = s.batch * s.tables;
    let mut w = gw;
    // SAFETY: buffers as EmbBufs documents (the caller's launch contract);
    // slots and list indices come from the forward, which passed its vote
    // (every index below the hash size and the capacity).
    unsafe {
        while w < bags {
            let bag = ((w % s.tables) as u64 * per_table + (w / s.tables) as u64 * s.pooling as u64) as usize;
            let g = grad.add(w as usize * dim);
            for p in 0..s.pooling as usize {
                let sl = *b.slot_of.add(bag + p);
                if sl == PAD || !pick(sl) {
                    continue;
                }
                let slot = (sl & !FIRST) as usize;
                let owner = (*b.keys.add(slot) as u32) % n;
                let u = *b.vals.add(slot) as usize;
                f(b.rows_in.add((owner as usize * cap + u) * dim), g);
            }
            w += warps;
        }
    }
}
