//! A block copy in flight while the control thread goes on
//! ([`PayloadMover::defer`]) — the block's own, or a shared copy of which
//! the block copies one chunk while other blocks copy the rest
//! (`shared`): meeting the block at the copy's second barrier and
//! finishing the shared copy ([`PayloadMover::drain`]), and the CQE that
//! waits for it ([`PayloadMover::hold_cqe`]).

use doorbell_kernels::ptx;

use super::super::cqe;
use super::super::mem;
use super::super::mover::PayloadMover;
use super::super::tables::CqEntry;
use super::{block_barrier, BlockMover};

impl BlockMover {
    /// Whether a copy runs on past [`PayloadMover::copy`]: the block's own
    /// (between a round's barriers) or a shared copy of this block's
    /// (`shared`) with chunks not yet copied.
    #[inline(always)]
    pub(super) fn in_flight(&self) -> bool {
        self.pending || self.posting.is_some()
    }

    /// Meets the block at the second barrier of the copy in flight, then
    /// copies what is left of this block's shared copy in flight and waits
    /// for the chunks the other blocks claimed; the wait counts as
    /// copying, not as the phase it interrupts. Only then the held CQE.
    #[inline(always)]
    pub(super) fn drain_copy(&mut self) {
        if !self.in_flight() {
            return;
        }
        let c0 = ptx::clock64();
        if self.pending {
            block_barrier();
            self.pending = false;
            self.last_barrier_ns = ptx::globaltimer_ns();
            self.drain_own_cycles += ptx::clock64().wrapping_sub(c0);
        }
        if let Some(p) = self.posting.take() {
            // SAFETY: this block's posting, its ranges checked by the
            // engine when it was posted; nothing is in flight any more, so
            // the rounds below start at once.
            unsafe { self.finish_shared(p, true) };
        }
        mem::copy_in_flight(false);
        if !self.held_cq.is_null() {
            let scope = PayloadMover::scope(self);
            // SAFETY: the slot `hold_cqe` claimed in a live CQ of this
            // engine's own tables; the payload it reports has landed.
            unsafe {
                mem::store_cqe(self.held_at, &self.held_img, scope);
                // A requester's success CQE: neither solicited nor an error.
                cqe::notify(&mut *self.held_cq, false);
            }
            self.held_cq = core::ptr::null_mut();
        }
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
        if !self.in_flight() || !self.held_cq.is_null() {
            return false;
        }
        // SAFETY: the caller's contract.
        let Some(at) = (unsafe { cqe::claim(cq) }) else {
            return false;
        };
        // Word by word: an array moved by value may become a byte loop.
        for (d, v) in self.held_img.iter_mut().zip(w.iter()) {
            *d = *v;
        }
        self.held_at = at;
        self.held_cq = cq;
        true
    }
}
