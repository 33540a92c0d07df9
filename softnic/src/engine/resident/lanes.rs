//! A burst round's lanes: every thread of the engine's block gathers its
//! WQE of its warp's burst ([`burst::gather`]), and after the round's
//! middle barrier lane 0 of each warp completes that burst
//! ([`burst::complete`]) through a [`LaneMover`], timing both for the
//! engine's profile. While it does, the warp's other lanes wait for rows
//! of WRITEs marked unordered ([`burst::SLOT_UNORDERED`]) and store each
//! its own slot of a row at once ([`serve_rows`]): lane 0 names the row in
//! [`BurstJob::row`] and meets them at a warp barrier before and after.

use doorbell_kernels::ptx;

use super::super::burst::{self, BurstJob, ROW_DONE, ROW_STORE};
use super::super::mem::{self, Scope};
use super::super::mover::{copy_part, PayloadMover};
use super::super::tables::PortTable;
use super::{block_barrier, View};

/// Thread `part`'s share of a round of `n` bursts: lane `l` of warp `j <
/// n` gathers WQE `l` of burst `j`; after a barrier that warp's lane 0
/// completes the burst ([`complete_job`]). Every thread of the block calls
/// it (it holds the round's middle barrier).
///
/// # Safety
/// `jobs` holds the round's `n` queued bursts.
pub(super) unsafe fn run_bursts(jobs: *mut BurstJob, n: usize, part: usize) {
    let (j, lane) = (part / 32, part % 32);
    // SAFETY (whole function): the caller's contract; slot `lane` of burst
    // `j` is this thread's until the middle barrier, burst `j` its lane 0's
    // after it.
    unsafe {
        let c0 = ptx::clock64();
        if j < n && lane < core::ptr::read_volatile(&raw const (*jobs.add(j)).head.count) as usize {
            burst::gather(jobs.add(j), lane);
        }
        let gathered = ptx::clock64().wrapping_sub(c0);
        block_barrier();
        if j < n {
            if lane == 0 {
                complete_job(jobs.add(j), gathered);
            } else {
                serve_rows(jobs.add(j), lane);
            }
        }
    }
}

/// Lane `lane` (not 0) of the warp completing burst `job`: at each warp
/// barrier lane 0 names a row of slots (or the end); the lanes of the row
/// fence (ordering their store behind every payload before the row, which
/// they have seen through the barrier) and store their slot's payload,
/// then meet lane 0 again, whose next store is a release.
///
/// # Safety
/// `job` is a burst lane 0 of this warp completes with a [`LaneMover`].
unsafe fn serve_rows(job: *mut BurstJob, lane: usize) {
    // SAFETY (whole function): the caller's contract; `row` is written by
    // lane 0 between the warp barriers at which the others read it.
    unsafe {
        let scope = if core::ptr::read_volatile(&raw const (*job).head.sys) != 0 {
            Scope::Sys
        } else {
            Scope::Gpu
        };
        loop {
            ptx::sync_warp(ptx::FULL_MASK);
            let [from, to, cmd, _] = core::ptr::read_volatile(&raw const (*job).row);
            if cmd != ROW_STORE {
                return;
            }
            store_slot(job, lane, from, to, scope);
            ptx::sync_warp(ptx::FULL_MASK);
        }
    }
}

/// Stores slot `lane`'s payload of burst `job` when `from <= lane < to`,
/// behind a fence at `scope`.
///
/// # Safety
/// The row's slots are checked ([`burst::complete`]'s rows).
#[inline(always)]
unsafe fn store_slot(job: *mut BurstJob, lane: usize, from: u32, to: u32, scope: Scope) {
    if !(from as usize..to as usize).contains(&lane) {
        return;
    }
    // SAFETY: the caller's contract.
    unsafe {
        if let Some(slot) = (*job).slots.get(lane) {
            mem::acquire(scope);
            copy_part(
                slot.dst as usize as *mut u8,
                slot.data.as_ptr() as *const u8,
                slot.len as usize,
                0,
                1,
            );
        }
    }
}

/// Completes burst `job` on the calling thread: its payload in WQE order,
/// its CQEs and its QP's ring ([`burst::complete`]), through a
/// [`LaneMover`]; leaves the tally in the job, with the cycles of this
/// thread's gather (`gathered`) and of the completion.
///
/// # Safety
/// `job`'s slots are filled; the tables' contract.
unsafe fn complete_job(job: *mut BurstJob, gathered: u64) {
    // SAFETY: the caller's contract.
    unsafe {
        let c0 = ptx::clock64();
        let h = core::ptr::read_volatile(&raw const (*job).head);
        let mut ports = View::new(h.table as usize as *const PortTable, h.port as usize);
        let scope = if h.sys != 0 { Scope::Sys } else { Scope::Gpu };
        let mut t = burst::complete(&mut ports, h.port as usize, job, h.now_ns, &mut LaneMover { scope, job });
        // The other lanes leave once they see this.
        core::ptr::write_volatile(&raw mut (*job).row, [0, 0, ROW_DONE, 0]);
        ptx::sync_warp(ptx::FULL_MASK);
        t.gather_cycles = gathered.min(u32::MAX as u64) as u32;
        t.complete_cycles = ptx::clock64().wrapping_sub(c0).min(u32::MAX as u64) as u32;
        core::ptr::write_volatile(&raw mut (*job).tally, t);
    }
}

/// The mover of a thread completing a burst: each copy (at most
/// [`burst::BURST_MAX_BYTES`], from shared memory) is ordered behind every
/// payload before it — this thread's, and, through the round's barriers,
/// the block's. A payload of one or two aligned 8-byte words (a signal, a
/// barrier word, a short put) is stored with a release per word, which
/// leaves the thread's L1 as it is; any other behind a fence at the
/// engine's scope.
struct LaneMover {
    scope: Scope,
    /// The burst being completed (its rows go to the warp's lanes).
    job: *mut BurstJob,
}

impl PayloadMover for LaneMover {
    #[inline(always)]
    fn scope(&self) -> Scope {
        self.scope
    }

    /// Names the row to the warp, stores slot 0 if it is in it, and
    /// meets the lanes again once they stored theirs.
    unsafe fn row(&mut self, from: u32, to: u32) -> bool {
        // SAFETY: the caller's contract; the lanes read `row` between the
        // two barriers.
        unsafe {
            core::ptr::write_volatile(&raw mut (*self.job).row, [from, to, ROW_STORE, 0]);
            ptx::sync_warp(ptx::FULL_MASK);
            store_slot(self.job, 0, from, to, self.scope);
            ptx::sync_warp(ptx::FULL_MASK);
        }
        true
    }

    unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        if len <= 16 && (dst as usize | src as usize | len) & 7 == 0 {
            let (d, s) = (dst as *mut u64, src as *const u64);
            for k in 0..len / 8 {
                // SAFETY: the caller's contract; 8-byte aligned (checked).
                unsafe { mem::store_release_u64(d.add(k), core::ptr::read_volatile(s.add(k)), self.scope) };
            }
            return;
        }
        // `fence.acq_rel` at the scope: a release for the stores after it.
        mem::acquire(self.scope);
        // SAFETY: the caller's contract; a burst's ranges never overlap.
        unsafe { copy_part(dst, src, len, 0, 1) };
    }
}
