//! A block copy in flight while the control thread goes on
//! ([`PayloadMover::defer`]) — the block's own, or a shared copy of which
//! the block copies one chunk while other blocks copy the rest
//! (`shared`): meeting the block at the copy's second barrier and
//! finishing the shared copies ([`PayloadMover::drain`]; the next shared
//! copy may be posted beside the last one's chunks still in flight), and
//! the CQEs that wait for them ([`PayloadMover::hold_cqe`]).

use doorbell_kernels::ptx;

use super::super::cqe;
use super::super::mem;
use super::super::mover::PayloadMover;
use super::super::tables::CqEntry;
use super::{block_barrier, BlockMover};

/// A requester's success CQE held until its copy has landed: its CQ
/// (null: none), the slot it claimed there and its image.
#[derive(Clone, Copy)]
pub(super) struct Held {
    cq: *mut CqEntry,
    at: *mut u8,
    img: [u32; 16],
}

impl Held {
    pub(super) const NONE: Held = Held {
        cq: core::ptr::null_mut(),
        at: core::ptr::null_mut(),
        img: [0; 16],
    };

    /// Writes the held CQE, if any, and holds none.
    ///
    /// # Safety
    /// The copy it reports, and every copy before it on its QP, has
    /// landed; the slot was claimed in a live CQ of this engine's tables.
    unsafe fn release(&mut self, scope: mem::Scope) {
        if self.cq.is_null() {
            return;
        }
        // SAFETY: the caller's contract.
        unsafe {
            mem::store_cqe(self.at, &self.img, scope);
            // A requester's success CQE: neither solicited nor an error.
            cqe::notify(&mut *self.cq, false);
        }
        self.cq = core::ptr::null_mut();
    }
}

impl BlockMover {
    /// Whether a copy runs on past [`PayloadMover::copy`]: the block's own
    /// (between a round's barriers) or a shared copy of this block's
    /// (`shared`) with chunks not yet copied.
    #[inline(always)]
    pub(super) fn in_flight(&self) -> bool {
        self.pending || self.posting.is_some() || self.older.is_some()
    }

    /// Meets the block at the second barrier of the copy in flight, then
    /// copies what is left of this block's shared copy in flight and waits
    /// for the chunks the other blocks claimed (of the copy posted before
    /// it too); the wait counts as copying, not as the phase it
    /// interrupts. Only then the held CQEs.
    #[inline(always)]
    pub(super) fn drain_copy(&mut self) {
        if self.in_flight() {
            self.drain_in_flight();
        }
    }

    /// [`Self::drain_copy`] with a copy in flight: out of line, so that
    /// the engine's many drain points stay a test and a call (inlined
    /// whole, they grew the one-WQE path's steps past what the compiler
    /// inlines into it).
    #[inline(never)]
    fn drain_in_flight(&mut self) {
        let c0 = ptx::clock64();
        self.meet_block(c0);
        if let Some(p) = self.posting.take() {
            // SAFETY: this block's posting, its ranges checked by the
            // engine when it was posted; nothing is in flight any more, so
            // the rounds below start at once.
            unsafe { self.finish_shared(p, true) };
        }
        if let Some(p) = self.older.take() {
            // SAFETY: the posting before, every chunk claimed.
            unsafe { self.wait_others(&p) };
        }
        // Both copies have landed: the older one's CQE, then the newest's.
        self.release_held(self.held_new ^ 1, false);
        self.release_held(self.held_new, false);
        self.count_drain(c0);
    }

    /// Before a shared copy that may be posted beside this block's copies
    /// in flight ([`may_post_beside`](Self::may_post_beside)): meets the
    /// block (the next copy's own chunk needs it), waits for the posting
    /// before the last (the next one reuses its slot) and writes its CQE,
    /// and copies the last posting's chunks nobody claimed, so that only
    /// other blocks' chunks of it stay in flight; its CQE stays held. The
    /// waits count as copying.
    #[inline(never)]
    pub(super) fn drain_for_posting(&mut self) {
        let c0 = ptx::clock64();
        self.meet_block(c0);
        if let Some(p) = self.older.take() {
            // SAFETY: this block's posting before the last, every chunk
            // claimed.
            unsafe { self.wait_others(&p) };
            // Its copy and everything before it have landed; the last
            // posting, after it, is still in flight.
            self.release_held(self.held_new ^ 1, true);
        }
        if let Some(mut p) = self.posting.take() {
            // SAFETY: this block's newest posting; nothing is in flight on
            // the block any more.
            unsafe { self.claim_rest(&mut p, true) };
            self.older = Some(p);
            // Its CQE's slot becomes the older one's (released above):
            // the next copy's CQE is held in the other.
            self.held_new ^= 1;
        } else {
            // No shared copy was in flight: the block's own copy, if one
            // was, landed at the barrier; nothing is in flight any more.
            self.release_held(self.held_new, false);
        }
        self.count_drain(c0);
    }

    /// Meets the block at the second barrier of its copy in flight, if
    /// any (the wait since `c0` counts as the drain's own-block wait).
    #[inline(always)]
    fn meet_block(&mut self, c0: u64) {
        if self.pending {
            block_barrier();
            self.pending = false;
            self.last_barrier_ns = ptx::globaltimer_ns();
            self.drain_own_cycles += ptx::clock64().wrapping_sub(c0);
        }
    }

    /// Writes the CQE held in slot `k` (if any), whose copy and every copy
    /// before it have landed; `in_flight`: a later copy still is (off the
    /// GPU the engine checks that nothing is published while one is).
    #[inline(always)]
    fn release_held(&mut self, k: usize, in_flight: bool) {
        mem::copy_in_flight(false);
        let scope = PayloadMover::scope(self);
        // SAFETY: a slot claimed by `hold_cqe` in a live CQ of this
        // engine's own tables; the payload it reports has landed.
        unsafe { self.held[k & 1].release(scope) };
        mem::copy_in_flight(in_flight);
    }

    /// A drain that began at `c0` ends: its time counts as copying, not
    /// as the phase it interrupted.
    #[inline(always)]
    fn count_drain(&mut self, c0: u64) {
        let waited = ptx::clock64().wrapping_sub(c0);
        self.copy_cycles += waited;
        self.lap_start = self.lap_start.wrapping_add(waited);
    }

    /// [`PayloadMover::hold_cqe`]'s work.
    ///
    /// # Safety
    /// As for [`PayloadMover::hold_cqe`].
    #[inline(always)]
    pub(super) unsafe fn hold(&mut self, cq: &mut CqEntry, w: &[u32; 16]) -> bool {
        if !self.in_flight() {
            return false;
        }
        let held = &mut self.held[self.held_new & 1];
        if !held.cq.is_null() {
            return false;
        }
        // SAFETY: the caller's contract.
        let Some(at) = (unsafe { cqe::claim(cq) }) else {
            return false;
        };
        // Word by word: an array moved by value may become a byte loop.
        for (d, v) in held.img.iter_mut().zip(w.iter()) {
            *d = *v;
        }
        held.at = at;
        held.cq = cq;
        true
    }
}
