//! What the engine's control thread tells the host: its state, its
//! counters and its progress record, each a store the host reads at any
//! time (the state with release, the others relaxed).

use doorbell_kernels::ptx;

use super::view::View;
use super::{BlockMover, EngineCtl, EngineProgress};

/// Publishes the engine's state: `st.release.sys` into the control block
/// and into [`EngineCtl::host_state`] when set. Pairs with the host's
/// acquire read of either; release, so the host that sees
/// [`STATE_EXITED`] also sees the counters stored before it.
///
/// # Safety
/// `ctl` is valid; its `host_state`, when non-null, is a valid word.
#[inline(always)]
pub(super) unsafe fn publish_state(ctl: *mut EngineCtl, state: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        ptx::st_release_sys_u32(&raw mut (*ctl).state, state);
        let h = core::ptr::read_volatile(&raw const (*ctl).host_state);
        if !h.is_null() {
            ptx::st_release_sys_u32(h, state);
        }
    }
}

/// Stores the engine's counters into its control block (read by the host
/// for statistics; no ordering needed).
///
/// # Safety
/// `ctl` is valid.
pub(super) unsafe fn publish_counters(ctl: *mut EngineCtl, passes: u64, busy: u64, busy_cycles: u64, m: &BlockMover) {
    // SAFETY: the caller's contract; 8-byte aligned fields.
    unsafe {
        let c = &raw mut (*ctl).counters;
        ptx::st_relaxed_sys_u64(&raw mut (*c).passes, passes);
        ptx::st_relaxed_sys_u64(&raw mut (*c).busy_passes, busy);
        ptx::st_relaxed_sys_u64(&raw mut (*c).block_copies, m.block_copies);
        ptx::st_relaxed_sys_u64(&raw mut (*c).thread_copies, m.thread_copies);
        ptx::st_relaxed_sys_u64(&raw mut (*c).block_bytes, m.block_bytes);
        ptx::st_relaxed_sys_u64(&raw mut (*c).busy_cycles, busy_cycles);
        ptx::st_relaxed_sys_u64(&raw mut (*c).copy_cycles, m.copy_cycles);
        ptx::st_relaxed_sys_u64(&raw mut (*c).fence_cycles, m.fence_cycles);
        for (i, v) in m.phase_cycles.iter().enumerate() {
            ptx::st_relaxed_sys_u64(&raw mut (*c).phase_cycles[i], *v);
        }
        ptx::st_relaxed_sys_u64(&raw mut (*c).bursts, m.bursts);
        ptx::st_relaxed_sys_u64(&raw mut (*c).burst_wqes, m.burst_wqes);
        ptx::st_relaxed_sys_u64(&raw mut (*c).rung_wqes, m.rung_wqes);
        ptx::st_relaxed_sys_u64(&raw mut (*c).rung_to_done_ns, m.rung_to_done_ns);
        ptx::st_relaxed_sys_u64(&raw mut (*c).burst_rounds, m.burst_rounds);
        ptx::st_relaxed_sys_u64(&raw mut (*c).round_cycles, m.round_cycles);
        ptx::st_relaxed_sys_u64(&raw mut (*c).gather_cycles, m.gather_cycles);
        ptx::st_relaxed_sys_u64(&raw mut (*c).complete_cycles, m.complete_cycles);
        ptx::st_relaxed_sys_u64(&raw mut (*c).unordered_wqes, m.unordered_wqes);
        ptx::st_relaxed_sys_u64(&raw mut (*c).shared_bytes, m.shared_bytes);
        ptx::st_relaxed_sys_u64(&raw mut (*c).lone_doorbells, m.lone_doorbells);
        ptx::st_relaxed_sys_u64(&raw mut (*c).lone_wqes, m.lone_wqes);
        ptx::st_relaxed_sys_u64(&raw mut (*c).bulk_bytes, m.bulk_bytes);
        ptx::st_relaxed_sys_u64(&raw mut (*c).deferred_copies, m.deferred_copies);
        ptx::st_relaxed_sys_u64(&raw mut (*c).overlapped_copies, m.overlapped_copies);
        ptx::st_relaxed_sys_u64(&raw mut (*c).drain_own_cycles, m.drain_own_cycles);
        ptx::st_relaxed_sys_u64(&raw mut (*c).drain_shared_cycles, m.drain_shared_cycles);
        ptx::st_relaxed_sys_u64(&raw mut (*c).shared_copies, m.shared_copies);
        ptx::st_relaxed_sys_u64(&raw mut (*c).shared_chunks, m.shared_chunks);
        ptx::st_relaxed_sys_u64(&raw mut (*c).late_chunks, m.late_chunks);
        ptx::st_relaxed_sys_u64(&raw mut (*c).pipelined_copies, m.pipelined_copies);
    }
}

/// Stores the engine's [`EngineProgress`] into `to` (null: nothing), from
/// its own port's counters (written by this thread: plain reads).
/// `st.relaxed.sys`: the host reads the words at any time and needs them
/// only eventually; no ordering with anything else, so no fence on the
/// engine's path.
///
/// # Safety
/// `to`, when non-null, is a valid, 8-byte aligned record.
pub(super) unsafe fn publish_progress(to: *mut EngineProgress, seq: u64, passes: u64, now_ns: u64, view: &View) {
    if to.is_null() {
        return;
    }
    let s = match view.own() {
        Some(p) => p.total_stats(),
        None => super::super::tables::PortStats::default(),
    };
    // SAFETY: field addresses of the caller's record (no access yet).
    let words = unsafe {
        [
            (&raw mut (*to).passes, passes),
            (&raw mut (*to).time_ns, now_ns),
            (&raw mut (*to).doorbells, s.doorbells),
            (&raw mut (*to).last_uar, s.last_uar),
            (&raw mut (*to).last_sq_pi, s.last_sq_pi as u64),
            (&raw mut (*to).dbr_rereads, s.dbr_rereads),
            (&raw mut (*to).fetched, s.fetched),
            (&raw mut (*to).executed, s.executed),
            (&raw mut (*to).wqes, s.wqes),
            (&raw mut (*to).cqes, s.cqes),
            (&raw mut (*to).errors, s.errors),
            (&raw mut (*to).flushes, s.flushes),
            (&raw mut (*to).last_qpn, s.last_qpn as u64),
            (&raw mut (*to).last_wqe, s.last_wqe as u64),
            (&raw mut (*to).seq, seq),
        ]
    };
    for (p, v) in words {
        // SAFETY: the caller's contract; fields of the record.
        unsafe { ptx::st_relaxed_sys_u64(p, v) };
    }
}
