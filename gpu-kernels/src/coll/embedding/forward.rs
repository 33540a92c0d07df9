//! The push forward ([`forward()`]: route, vote, gather, pool) and the
//! pull forward ([`forward_pull()`]); the protocol is in the parent
//! module's docs.

use super::common::{block_share, grid_sync_or_report, hash_insert, pair, set_status, set_status_words, stamp, status_code};
use super::rows::{copy_rows, grid_warp, pool_bag, Look};
use super::{
    hash_tag, request_key, EmbBufs, EmbShape, FwdArgs, ERR_WORDS, FIRST, PAD, STATUS_BAD_ID, STATUS_BAD_REQUEST, STATUS_CAPACITY,
    STATUS_NO_PEER_PTR, STATUS_OK, STATUS_PEER_ERROR, STATUS_PEER_TIMEOUT, STATUS_TIMEOUT, STATUS_TRANSPORT,
};
use crate::ptx;
use crate::transport::{Cmp, Coop, RawSignal, RawXfer, Transport};

/// Bytes of one slice of a request list sent from every block
/// ([`send_list_slices`]).
pub const LIST_PIECE_BYTES: u64 = 32768;

/// The verdict signal of a requester: `epoch << 33 | bad << 32 | count`.
#[inline(always)]
fn verdict_sig(epoch: u64, bad: bool, count: u32) -> u64 {
    (epoch << 33) | ((bad as u64) << 32) | count as u64
}

/// Phase 2 for one owner, by a whole block: this rank's request list, or
/// (`bad`) its error report, into the owner's buffers, with the verdict as
/// the signal. If the put is refused, the bare signal still goes out, so
/// the owner is never left waiting; returns false then (the caller records
/// the refusal after the vote, so that every block of this rank has sent
/// the same verdict).
#[inline(always)]
unsafe fn send_verdict<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, epoch: u64, owner: u32, bad: bool, count: u32) -> bool {
    let n = t.world_size();
    let me = t.rank();
    let par = (epoch & 1) as usize;
    let cap = s.cap as usize;
    let sig = verdict_sig(epoch, bad, if bad { 0 } else { count });
    // SAFETY: buffers as EmbBufs documents (the caller's launch contract).
    unsafe {
        let (dst, src, bytes) = if bad {
            let row = ERR_WORDS;
            (
                b.errs.add(me as usize * row) as *mut u8,
                b.errs.add(n as usize * row) as *const u8,
                (ERR_WORDS * 4) as u64,
            )
        } else {
            (
                b.req_in.add((par * n as usize + me as usize) * cap) as *mut u8,
                b.req_out.add(owner as usize * cap) as *const u8,
                count as u64 * 8,
            )
        };
        let r = t.put_raw(
            Coop::Block,
            owner,
            RawXfer {
                dst,
                src,
                bytes,
                nbi: false,
            },
            Some(RawSignal::set(b.req_sig.add(me as usize), sig)),
        );
        if r.is_err() && ptx::thread_rank_in_block() == 0 {
            let _ = t.signal_raw(owner, RawSignal::set(b.req_sig.add(me as usize), verdict_sig(epoch, true, 0)));
        }
        r.is_ok()
    }
}

/// Request lists at least this long (bytes; the longest of a rank's lists)
/// go out in slices from every block (`send_list_slices`) rather than
/// from one block each: the default of [`FwdArgs::sliced_bytes`].
pub const SLICED_LIST_BYTES: u64 = 256 << 10;

/// Every block's share of every owner's request list (this rank's
/// `req_out[o]`, `counts[o]` keys, into the owner's `req_in` slot for this
/// rank): pieces of [`LIST_PIECE_BYTES`] dealt round-robin over the grid,
/// `put_nbi_block`, then `quiet` by thread 0. Returns, on thread 0, an
/// owner whose piece was refused or this rank when the quiet failed
/// (`u32::MAX`: none; other threads know only of refused puts). No
/// signal: the caller sends the verdicts once every block is done.
#[inline(always)]
unsafe fn send_list_slices<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, counts: *const u32, epoch: u64) -> u32 {
    let n = t.world_size();
    let me = t.rank() as usize;
    let par = (epoch & 1) as usize;
    let cap = s.cap as usize;
    let blocks = ptx::grid_dim_x() as u64;
    let mut failed = u32::MAX;
    // SAFETY: counts <= cap (no capacity error on this path); buffers as
    // EmbBufs documents.
    unsafe {
        let mut first = 0u64; // pieces of the owners before `o`
        for o in 0..n {
            let bytes = ptx::ld_relaxed_gpu_u32(counts.add(o as usize)).min(s.cap) as u64 * 8;
            let pieces = bytes.div_ceil(LIST_PIECE_BYTES);
            let dst = b.req_in.add((par * n as usize + me) * cap) as *mut u8;
            let src = b.req_out.add(o as usize * cap) as *const u8;
            let whole = RawXfer {
                dst,
                src,
                bytes,
                nbi: true,
            };
            // This block's pieces of owner `o`: global indices blk, blk + blocks, ...
            let mut q = (ptx::block_idx_x() as u64 + blocks - first % blocks) % blocks;
            while q < pieces {
                let lo = q * LIST_PIECE_BYTES;
                let len = LIST_PIECE_BYTES.min(bytes - lo);
                if t.put_raw(Coop::Block, o, whole.piece(lo, len), None).is_err() {
                    failed = o;
                }
                q += blocks;
            }
            first += pieces;
        }
        // The block's puts, then one thread completes them (quiet is a
        // one-thread call); that thread's answer is the block's.
        ptx::sync_threads();
        if ptx::thread_rank_in_block() == 0 && t.quiet(None).is_err() {
            failed = me as u32;
        }
    }
    failed
}

/// A block of this rank that stops before its rows (its grid barrier or its
/// wait for the verdicts ran out of budget) still adds its 1 to every
/// requester's `rows_sig`, so the counts (`epoch * blocks`, accumulated over
/// launches) stay in step; before that it marks the epoch in their
/// `rows_sig[N + me]`, so that a requester whose wait completes with this
/// count knows the rows never came. Without it, a rank that is late by more
/// than the budget finds its peers gone and waits out a second budget for
/// adds that never come, and so does every later step of every rank.
/// Thread 0 of the block calls the transport; every thread may call it.
/// The fence orders the marks before the adds (it pairs with the acquire
/// of the requester's `rows_sig` wait, then [`gave_up_owner`]).
#[inline(always)]
unsafe fn give_up<T: Transport>(t: &T, b: &EmbBufs, epoch: u64) {
    let n = t.world_size();
    let me = t.rank();
    if ptx::thread_rank_in_block() == 0 {
        // SAFETY: `rows_sig` holds 2N words (launch contract). Refused
        // signals are the communicator's report already.
        unsafe {
            for r in 0..n {
                let _ = t.signal_raw(r, RawSignal::set(b.rows_sig.add((n + me) as usize), epoch));
            }
            t.fence();
            for r in 0..n {
                let _ = t.signal_raw(r, RawSignal::add(b.rows_sig.add(me as usize), 1));
            }
        }
    }
}

/// The lowest owner with a block that gave up in `epoch` (or later), else
/// `u32::MAX`. One thread, after its `rows_sig` wait (acquire) completed.
#[inline(always)]
unsafe fn gave_up_owner(b: &EmbBufs, n: u32, epoch: u64) -> u32 {
    for o in 0..n {
        // SAFETY: `rows_sig` holds 2N words (launch contract).
        if unsafe { ptx::ld_acquire_sys_u64(b.rows_sig.add((n + o) as usize)) } >= epoch {
            return o;
        }
    }
    u32::MAX
}

/// The push forward: see the module docs. `a.ids` `[tables][batch][pooling]`,
/// `a.out` `[batch][tables][dim]` (local). `status` gets [`STATUS_OK`] or
/// why not. Every thread of the grid calls it.
///
/// # Safety
/// The buffers of `b` are as [`EmbBufs`] documents, sized from `s` and the
/// world; the launch as the module docs say (the same grid on every rank,
/// co-resident, [`super::SHARED_BYTES`] of shared memory; epochs 1, 2, 3, ...).
#[inline(always)]
pub unsafe fn forward<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, a: &FwdArgs) {
    let n = t.world_size();
    let par = (a.epoch & 1) as usize;
    let tid = ptx::thread_rank_in_block();
    // SAFETY: buffers as EmbBufs documents, sized from `s` and the world
    // (launch contract); every index below stays inside them.
    unsafe {
        stamp(b.stamps, 0);
        let counts = b.counts.add(par * n as usize);
        // The next epoch's counters start from zero. Here, not at the end:
        // a block that gives up returns early, and counters left from an
        // earlier epoch would shift every list index of the next one (the
        // backward would send those stale entries' staging rows too). The
        // other parity is the last forward's, whose backward ran before.
        if ptx::block_idx_x() == 0 {
            let next = b.counts.add((1 - par) * n as usize);
            let mut o = tid;
            while o < n {
                *next.add(o as usize) = 0;
                o += ptx::block_dim_x();
            }
        }
        route(n, s, b, a, counts);
        let routed = grid_sync_or_report(b.grid, b.status, a.budget_ns, 0);
        stamp(b.stamps, 1);
        let (routed, refused) = vote(t, s, b, a, counts, routed);
        if !routed {
            give_up(t, b, a.epoch);
            return;
        }
        let verdict = verdicts(t, s, b, a.epoch);
        if refused != u32::MAX && tid == 0 {
            set_status(b.status, STATUS_TRANSPORT, refused, 0, 0, 0);
        }
        stamp(b.stamps, 2);
        if verdict == 2 {
            if tid == 0 {
                set_status(b.status, STATUS_TIMEOUT, 1, 0, 0, 0);
            }
            give_up(t, b, a.epoch);
            return;
        }
        if verdict == 0 {
            gather(t, s, b, a.epoch);
        }
        ptx::sync_threads();
        if tid == 0 {
            // The block's puts (its warps', ordered before this thread by the
            // barrier) are published by the signals once fenced. A bad step
            // adds too (nothing to publish), so the counts stay in step.
            t.fence();
            for r in 0..n {
                if t.signal_raw(r, RawSignal::add(b.rows_sig.add(t.rank() as usize), 1)).is_err() {
                    set_status(b.status, STATUS_TRANSPORT, r, 2, 0, 0);
                }
            }
        }
        stamp(b.stamps, 3);
        let Some(gone) = rows_in(t, b, a.epoch, verdict) else {
            return;
        };
        stamp(b.stamps, 4);
        if verdict == 0 && gone == u32::MAX {
            pool(n, s, b, a);
            stamp(b.stamps, 5);
        }
    }
}

/// Phase 1, validate, dedup and route (this rank's scratch only). A warp
/// takes 32 neighbouring lookups at a time, so its lanes loop together and
/// can share one counter add per owner (below).
#[inline(always)]
unsafe fn route(n: u32, s: &EmbShape, b: &EmbBufs, a: &FwdArgs, counts: *mut u32) {
    let cap = s.cap as usize;
    let per_table = s.batch as u64 * s.pooling as u64;
    let lookups = s.tables as u64 * per_table;
    let tag = hash_tag(a.epoch);
    let ids = a.ids;
    let lane = ptx::lane_id();
    let (gw, warps) = grid_warp();
    let mut base = gw as u64 * 32;
    // SAFETY: as for `forward`.
    unsafe {
        while base < lookups {
            let i = base + lane as u64;
            // The owner whose list this lane's fresh key joins, if any.
            let mut joins = u32::MAX;
            let mut key_slot = 0u32;
            if i < lookups {
                let id = *ids.add(i as usize);
                let table = (i / per_table) as u32;
                let slot_p = b.slot_of.add(i as usize);
                if id == PAD {
                    *slot_p = PAD;
                } else if id >= s.rows {
                    let within = i % per_table;
                    set_status(
                        b.status,
                        STATUS_BAD_ID,
                        table,
                        (within / s.pooling as u64) as u32,
                        (within % s.pooling as u64) as u32,
                        id,
                    );
                    *slot_p = PAD;
                } else {
                    let (slot, fresh) = hash_insert(b.keys, s.hash_bits, tag, table, id);
                    if fresh {
                        *slot_p = slot | FIRST;
                        joins = id % n;
                        key_slot = slot;
                    } else {
                        *slot_p = slot;
                    }
                }
            }
            // One atomic add per owner per warp, not per key: with few
            // ranks, every fresh key of the grid would otherwise add to the
            // same one or two counters, and same-word atomics serialize.
            let mut pending = ptx::vote_sync_ballot(ptx::FULL_MASK, joins != u32::MAX);
            while pending != 0 {
                let leader = pending.trailing_zeros();
                let owner = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, joins, leader);
                let group = ptx::vote_sync_ballot(ptx::FULL_MASK, joins == owner);
                let mut first = 0;
                if lane == leader {
                    first = ptx::atom_add_relaxed_gpu_u32(counts.add(owner as usize), group.count_ones());
                }
                let first = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, first, leader);
                if joins == owner {
                    let u = first + (group & ((1u32 << lane) - 1)).count_ones();
                    *b.vals.add(key_slot as usize) = u;
                    if u < s.cap {
                        let id = *ids.add(i as usize);
                        *b.req_out.add(owner as usize * cap + u as usize) = request_key((i / per_table) as u32, id);
                    } else {
                        set_status(b.status, STATUS_CAPACITY, owner, u + 1, s.cap, 0);
                    }
                }
                pending &= !group;
            }
            base += warps as u64 * 32;
        }
    }
}

/// Phase 2, vote with the requests: every owner gets this rank's verdict,
/// even for an empty list, and even when this rank is in error or its grid
/// barrier ran out (then only this block's owners can be told). Returns
/// whether this block may go on (`routed`: its grid barriers passed) and
/// an owner whose verdict put was refused (`u32::MAX`: none).
#[inline(always)]
unsafe fn vote<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, a: &FwdArgs, counts: *mut u32, routed: bool) -> (bool, u32) {
    let n = t.world_size();
    let me = t.rank();
    let tid = ptx::thread_rank_in_block();
    let blk = ptx::block_idx_x();
    let blocks = ptx::grid_dim_x();
    let epoch = a.epoch;
    // SAFETY: as for `forward`.
    unsafe {
        // One reading per block, shared: the block's threads send alike.
        // Only phase 1's codes are this rank's verdict: a sibling block
        // already past its vote may have recorded a peer's error (or a
        // later failure) by the time a slow block reads the word, and that
        // block must not pass it on as this rank's own.
        let mut my_err = !routed;
        if tid == 0 {
            let code = status_code(b.status);
            my_err |= code == STATUS_BAD_ID || code == STATUS_CAPACITY;
            if my_err {
                let own = b.errs.add(n as usize * ERR_WORDS);
                for w in 0..ERR_WORDS {
                    *own.add(w) = if w < 6 { ptx::ld_relaxed_gpu_u32(b.status.add(w)) } else { 0 };
                }
            }
        }
        let my_err = block_share(my_err as u32) != 0;
        let mut refused = u32::MAX;
        // Long lists go out in slices from every block, then one grid
        // barrier, then the verdicts as bare signals: one block alone moves
        // a few GB/s, and a list of a million keys would take milliseconds.
        // Every block reads the same counts (phase 1's barrier), so every
        // block takes the same way.
        let mut longest = 0u32;
        for o in 0..n {
            longest = longest.max(ptx::ld_relaxed_gpu_u32(counts.add(o as usize)));
        }
        let sliced = routed && !my_err && longest as u64 * 8 >= a.sliced_bytes && blocks > 1;
        let mut routed = routed;
        if sliced {
            let failed = send_list_slices(t, s, b, counts, epoch);
            if failed != u32::MAX && tid == 0 {
                set_status(b.status, STATUS_TRANSPORT, failed, 5, 0, 0);
            }
            // Every slice in place (each block's quiet came before it).
            routed = grid_sync_or_report(b.grid, b.status, a.budget_ns, 9);
            // A refused slice anywhere makes this rank's verdict bad (the
            // status words say why; no report travels with a bare signal).
            let bad = !routed || block_share((tid == 0 && status_code(b.status) == STATUS_TRANSPORT) as u32) != 0;
            if tid == 0 {
                t.fence();
                let mut owner = blk;
                while owner < n {
                    let c = ptx::ld_relaxed_gpu_u32(counts.add(owner as usize));
                    let sig = verdict_sig(epoch, bad, if bad { 0 } else { c });
                    if t.signal_raw(owner, RawSignal::set(b.req_sig.add(me as usize), sig)).is_err() {
                        refused = owner;
                    }
                    owner += blocks;
                }
            }
        } else {
            let mut owner = blk;
            while owner < n {
                let c = if my_err {
                    0
                } else {
                    ptx::ld_relaxed_gpu_u32(counts.add(owner as usize))
                };
                if !send_verdict(t, s, b, epoch, owner, my_err, c) {
                    refused = owner;
                }
                owner += blocks;
            }
        }
        (routed, refused)
    }
}

/// Phase 3a: every requester's verdict (the one wait of an error: one
/// message). Returns, shared by the block: 0 every rank is fine, 1 some
/// rank failed (this rank's status then names the lowest failing peer, if
/// it has no error of its own), 2 a wait ran out of budget.
#[inline(always)]
unsafe fn verdicts<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, epoch: u64) -> u32 {
    let n = t.world_size();
    let me = t.rank();
    let par = (epoch & 1) as usize;
    let blk = ptx::block_idx_x();
    let mut verdict = 0u32; // 0 fine, 1 some rank failed, 2 timed out
                            // SAFETY: as for `forward`.
    unsafe {
        if ptx::thread_rank_in_block() == 0 {
            let mut first_bad = u32::MAX;
            for r in 0..n {
                match t.wait_word_raw(b.req_sig.add(r as usize), Cmp::Ge, epoch << 33) {
                    Ok(v) => {
                        if (v >> 32) & 1 != 0 || (v as u32) > s.cap {
                            verdict = verdict.max(1);
                            if first_bad == u32::MAX && r != me {
                                first_bad = r;
                            }
                        }
                        if blk == 0 {
                            *b.rcounts.add(par * n as usize + r as usize) = v as u32;
                        }
                    }
                    Err(_) => {
                        verdict = 2;
                        break;
                    }
                }
            }
            if verdict == 1 && status_code(b.status) == STATUS_OK && first_bad != u32::MAX {
                // The lowest failing rank's report (its put came with its signal).
                let rep = b.errs.add(first_bad as usize * ERR_WORDS);
                let w = |k: usize| *rep.add(k);
                set_status_words(
                    b.status,
                    STATUS_PEER_ERROR,
                    pair(first_bad, w(0)),
                    pair(w(1), w(2)),
                    pair(w(3), w(4)),
                );
            }
            if blk == 0 && verdict != 2 {
                *b.verdict = (epoch << 1) | (verdict != 0) as u64;
            }
        }
        block_share(verdict)
    }
}

/// Phase 3b (owner side, every requester good): the requested rows, copied
/// by the warps straight into each requester's receive buffer where it can
/// be stored to, else one put per row.
#[inline(always)]
unsafe fn gather<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, epoch: u64) {
    let n = t.world_size();
    let me = t.rank();
    let par = (epoch & 1) as usize;
    let cap = s.cap as usize;
    let dim = s.dim as usize;
    let (gw, warps) = grid_warp();
    // SAFETY: as for `forward`.
    unsafe {
        for r in 0..n {
            // Stable for this kernel's life (the requester's next
            // request needs this rank's next rows first).
            let c = ptx::ld_relaxed_sys_u64(b.req_sig.add(r as usize)) as u32;
            let list = b.req_in.add((par * n as usize + r as usize) * cap);
            // The row of request `u`, or None (reported) for a key that
            // is not this rank's.
            let row = |u: u32| -> Option<*const f32> {
                let key = *list.add(u as usize);
                let table = (key >> 32) as u32;
                let id = key as u32;
                if table >= s.tables || id >= s.rows || id % n != me {
                    set_status(b.status, STATUS_BAD_REQUEST, r, table, id, 0);
                    return None;
                }
                Some(b.tables.add((table as usize * s.shard_rows as usize + (id / n) as usize) * dim) as *const f32)
            };
            let slot = b.rows_in.add(me as usize * cap * dim);
            // Where the requester's slot can be stored to directly, the
            // warps copy rows themselves, several in flight; otherwise
            // (a NIC between the two) one put per row.
            let direct = if dim.is_multiple_of(4) { t.peer_ptr(slot, r) } else { None };
            if let Some(peer_slot) = direct {
                copy_rows(dim, c, peer_slot, row);
            } else {
                let mut u = gw;
                while u < c {
                    if let Some(src) = row(u) {
                        let dst = slot.add(u as usize * dim);
                        if t.put_raw(
                            Coop::Warp,
                            r,
                            RawXfer {
                                dst: dst as *mut u8,
                                src: src as *const u8,
                                bytes: dim as u64 * 4,
                                nbi: false,
                            },
                            None,
                        )
                        .is_err()
                            && ptx::lane_id() == 0
                        {
                            set_status(b.status, STATUS_TRANSPORT, r, 1, 0, 0);
                        }
                    }
                    u += warps;
                }
            }
        }
    }
}

/// Phase 4a: waits until every block of every owner has sent — and so has
/// read every verdict of this epoch. A failed step waits too: a rank that
/// left without it could launch its next forward and overwrite its verdict
/// signal on an owner whose slower block has not read it yet, which would
/// then vote on the next epoch's verdicts. One more message. `None` when
/// the wait ran out of budget (reported); else the lowest owner with a
/// block that gave up (`u32::MAX`: none), the same for every block.
#[inline(always)]
unsafe fn rows_in<T: Transport>(t: &T, b: &EmbBufs, epoch: u64, verdict: u32) -> Option<u32> {
    let n = t.world_size();
    let tid = ptx::thread_rank_in_block();
    let blocks = ptx::grid_dim_x();
    // SAFETY: as for `forward`.
    unsafe {
        let mut waited = 0u32;
        if tid == 0 {
            for o in 0..n {
                if t.wait_word_raw(b.rows_sig.add(o as usize), Cmp::Ge, epoch * blocks as u64).is_err() {
                    waited = 1;
                    break;
                }
            }
        }
        if block_share(waited) != 0 {
            if tid == 0 {
                set_status(b.status, STATUS_TIMEOUT, 2, 0, 0, 0);
            }
            return None;
        }
        // An owner block that gave up counted without sending its rows:
        // nobody pools, and the backward of this epoch is refused. Every
        // block of this rank reads the same marks (their sets came before
        // the adds it just waited for), so every block goes the same way.
        let mut gone = u32::MAX;
        if tid == 0 && verdict == 0 {
            gone = gave_up_owner(b, n, epoch);
            if gone != u32::MAX {
                set_status(b.status, STATUS_PEER_TIMEOUT, gone, 0, 0, 0);
                *b.verdict = (epoch << 1) | 1;
            }
        }
        Some(block_share(gone))
    }
}

/// Phase 4b, pool: one warp per bag sums its rows in bag order.
#[inline(always)]
unsafe fn pool(n: u32, s: &EmbShape, b: &EmbBufs, a: &FwdArgs) {
    let cap = s.cap as usize;
    let dim = s.dim as usize;
    let (ids, out) = (a.ids, a.out);
    let (gw, warps) = grid_warp();
    let bags = s.batch * s.tables;
    let mut w = gw;
    // SAFETY: as for `forward`; slots and list indices from phase 1.
    unsafe {
        while w < bags {
            let (_, _, bag) = s.bag(w);
            pool_bag(dim, s.pooling as usize, out.add(w as usize * dim), |p| {
                let id = *ids.add(bag + p);
                if id == PAD {
                    return Look::Pad;
                }
                let slot = *b.slot_of.add(bag + p) & !FIRST;
                let u = *b.vals.add(slot as usize) as usize;
                Look::Row(b.rows_in.add(((id % n) as usize * cap + u) * dim))
            });
            w += warps;
        }
    }
}

/// Forward by direct loads from the owners' tables (`peer_ptr`), no
/// routing and no dedup: see the module docs. Same arguments as
/// [`forward()`] (only `tables`, `grid` and `status` of `b` are used).
/// Bad ids are skipped and reported; the bags holding them are not written.
///
/// # Safety
/// As for [`forward()`].
#[inline(always)]
pub unsafe fn forward_pull<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, ids: *const u32, out: *mut f32, budget_ns: u64) {
    let n = t.world_size();
    let dim = s.dim as usize;
    let tid = ptx::thread_rank_in_block();
    // SAFETY: as for `forward`.
    unsafe {
        // No owner may still be applying a backward step to its table.
        if ptx::block_idx_x() == 0 && t.barrier_block().is_err() && tid == 0 {
            set_status(b.status, STATUS_TIMEOUT, 7, 0, 0, 0);
        }
        if !grid_sync_or_report(b.grid, b.status, budget_ns, 8) {
            return;
        }
        let (gw, warps) = grid_warp();
        let bags = s.batch * s.tables;
        let mut w = gw;
        while w < bags {
            let (sample, table, bag) = s.bag(w);
            pool_bag(dim, s.pooling as usize, out.add(w as usize * dim), |p| {
                let id = *ids.add(bag + p);
                if id == PAD {
                    return Look::Pad;
                }
                if id >= s.rows {
                    set_status(b.status, STATUS_BAD_ID, table, sample, p as u32, id);
                    return Look::Bad;
                }
                let local = b.tables.add((table as usize * s.shard_rows as usize + (id / n) as usize) * dim);
                match t.peer_ptr(local as *const f32, id % n) {
                    Some(row) => Look::Row(row),
                    None => {
                        set_status(b.status, STATUS_NO_PEER_PTR, id % n, 0, 0, 0);
                        Look::Bad
                    }
                }
            });
            w += warps;
        }
    }
}
