//! The block as the engine's [`PayloadMover`]: what the execution of a
//! WQE asks of it — its scope, the profile's laps, bursts queued for the
//! block's round, and each payload copy (a signal word by the control
//! thread, short copies by it alone, large ones by the block or shared
//! with the port's other blocks, deferred where the engine allows).

use doorbell_kernels::ptx;

use super::super::burst::{self, BurstHead};
use super::super::mem::Scope;
use super::super::mover::{copy_part, overlaps, PayloadMover, Phase};
use super::super::tables::{CqEntry, Ports, MAX_QPS};
use super::{BlockMover, Job, BLOCK_COPY_MIN, JOB_COPY};

impl PayloadMover for BlockMover {
    #[inline(always)]
    fn scope(&self) -> Scope {
        if self.sys {
            Scope::Sys
        } else {
            Scope::Gpu
        }
    }

    #[inline(always)]
    fn lap(&mut self, phase: Phase) {
        let now = ptx::clock64();
        self.pass_phases[phase as usize] += now.wrapping_sub(self.lap_start);
        self.lap_start = now;
    }

    #[inline(always)]
    fn rung(&mut self, q: usize) {
        self.rung_at[q % MAX_QPS] = ptx::globaltimer_ns();
    }

    #[inline(always)]
    fn defer(&mut self, on: bool) {
        self.defer = on;
    }

    #[inline(always)]
    fn drain(&mut self) {
        self.drain_copy();
    }

    unsafe fn hold_cqe(&mut self, cq: &mut CqEntry, w: &[u32; 16]) -> bool {
        // SAFETY: the caller's contract.
        unsafe { self.hold(cq, w) }
    }

    #[inline(always)]
    fn executed(&mut self, q: usize) {
        let at = self.rung_at[q % MAX_QPS];
        if at != 0 {
            self.rung_wqes += 1;
            self.rung_to_done_ns += ptx::globaltimer_ns().wrapping_sub(at);
        }
    }

    /// Queues the burst for this pass's round (`run_queued`) and
    /// has the one-WQE path start nothing meanwhile; after the round, the
    /// QP's next call says what its burst's outcome left to the one-WQE
    /// path. A QP whose send CQ a queued burst already writes, or a full
    /// queue, waits for the next pass.
    unsafe fn burst<P: Ports + ?Sized>(
        &mut self,
        ports: &mut P,
        p: usize,
        q: usize,
        start: u32,
        avail: u32,
        now_ns: u64,
    ) -> burst::Outcome {
        let count = avail.min(self.burst_max);
        if count == 0 || p != self.port as usize || q >= MAX_QPS {
            return burst::Outcome::NONE;
        }
        let allowed = core::mem::take(&mut self.allow[q]);
        if allowed != 0 {
            return burst::Outcome { done: 0, fetch: allowed };
        }
        let wait = burst::Outcome { done: 0, fetch: 0 };
        if self.queued >= self.max_jobs || self.queued_qps & (1u64 << q) != 0 {
            return wait;
        }
        let own = ports.raw(p);
        let Some(qp) = ports.get(p).and_then(|x| x.qps.get(q)) else {
            return burst::Outcome::NONE;
        };
        for j in 0..self.queued as usize {
            // SAFETY: a queued job of this pass, written by this thread.
            let other = unsafe { core::ptr::read_volatile(&raw const (*self.jobs.add(j)).head.send_cq) };
            if other == qp.send_cq {
                return wait;
            }
        }
        let mut head = BurstHead::new(self.table, own as usize as u64, (p, q), qp, start, count);
        head.now_ns = now_ns;
        head.sys = self.sys as u32;
        // SAFETY: job `queued` of the block's jobs, read by the others only
        // between the barriers of the next round.
        unsafe { core::ptr::write_volatile(&raw mut (*self.jobs.add(self.queued as usize)).head, head) };
        self.queued += 1;
        self.queued_qps |= 1u64 << q;
        self.pass_bursts += 1;
        if !self.eager {
            return wait;
        }
        // SAFETY: the tables' contract (the caller's).
        unsafe { self.run_queued(ports, p) };
        // SAFETY: this burst's job, complete after its round.
        let done = unsafe { core::ptr::read_volatile(&raw const (*self.jobs).tally.done) };
        burst::Outcome {
            done,
            fetch: core::mem::take(&mut self.allow[q]),
        }
    }

    unsafe fn copy_frozen(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        self.frozen = true;
        // SAFETY: the caller's contract.
        unsafe { self.copy(dst, src, len) };
        self.frozen = false;
    }

    unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        if len == 0 {
            return;
        }
        // What the control did since its last lap was checking this WQE.
        self.lap(Phase::Check);
        self.overlapped_copies += self.in_flight() as u64;
        let overlap = overlaps(dst, src, len);
        // A signal word: one or two aligned 8-byte words.
        let word = !overlap && len <= 16 && (dst as usize | src as usize | len) & 7 == 0;
        let bulk = !overlap && self.parts > 1 && len >= BLOCK_COPY_MIN;
        // In order: a copy in flight lands before this one starts, except
        // the other blocks' chunks of shared copies that this one commutes
        // with (`shared`).
        if bulk && self.may_post_beside(dst, src, len) {
            self.drain_for_posting();
        } else {
            self.drain();
        }
        // Earlier payload is ordered before a signal word by the word's
        // release stores, and need not be before bulk payload (nobody can
        // poll weak stores); anything else gets a fence, as before.
        if self.dirty && !word && !bulk {
            self.fence();
            self.dirty = false;
        }
        let c0 = ptx::clock64();
        if word {
            let (d, s) = (dst as *mut u64, src as *const u64);
            let scope = self.scope();
            for k in 0..len / 8 {
                // SAFETY: the caller's contract; 8-byte aligned (checked).
                unsafe {
                    let v = core::ptr::read_volatile(s.add(k));
                    if self.dirty {
                        super::super::mem::store_release_u64(d.add(k), v, scope);
                    } else {
                        core::ptr::write_volatile(d.add(k), v);
                    }
                }
            }
            self.thread_copies += 1;
            self.dirty = true;
        } else if overlap {
            // SAFETY: the caller's contract (memmove handles the overlap).
            unsafe { super::super::mem::copy_bytes(dst, src, len) };
            self.thread_copies += 1;
            self.dirty = true;
        } else if !bulk {
            // SAFETY: the caller's contract; one part of one.
            unsafe { copy_part(dst, src, len, 0, 1) };
            self.thread_copies += 1;
            self.dirty = true;
        } else {
            // SAFETY: the caller's contract; no overlap (checked).
            if !unsafe { self.copy_shared(dst, src, len, self.defer) } {
                let job = Job {
                    kind: JOB_COPY,
                    bulk: 0,
                    dst: dst as usize as u64,
                    src: src as usize as u64,
                    len: len as u64,
                };
                // SAFETY: as above.
                unsafe { self.round_or_defer(job, self.defer) };
            }
            // The block's stores are ordered before the barrier that ends
            // the round (for a deferred copy, the one a drain meets), so
            // thread 0's next release (a signal word, an atomic, a CQE) or
            // fence publishes them too.
            self.dirty = true;
            self.block_copies += 1;
            self.block_bytes += len as u64;
        }
        self.lap_start = ptx::clock64();
        self.copy_cycles += self.lap_start.wrapping_sub(c0);
    }
}
