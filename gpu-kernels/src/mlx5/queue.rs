//! The device handle of one mlx5 QP and the send pipeline, one step per
//! function:
//!
//! ```text
//! reserve_wqe_slots_warp   lane 0: one atomic add on the producer index; broadcast (shfl)
//! write_*_wqe              every lane: its own WQE, four 16-byte stores
//! sync_warp                the batch's WQEs are written
//! submit                   lane 0: wait for this batch's turn (ready index), then
//!   update_doorbell_record   st.release.sys of the BE32 SQ counter
//!   ring_doorbell            fence.sc.sys, then the 8-byte doorbell store to the UAR
//!                          and release the turn to the next batch
//! ```
//! [`post_batch_warp`] runs them in order. The ring does not wait for free
//! slots: the caller keeps at most `sq_size` WQEs outstanding (poll the CQ,
//! [`super::poll_cq`], before reusing slots).

use super::wqe::{write_wqe, WqeRequest, FLAG_SIGNALED};
use crate::ptx;

/// Everything a kernel needs to post to one QP and poll its send CQ. Plain
/// data shared by host and device (80 bytes, `repr(C)`); passed by value.
///
/// On a real NIC the host maps the SQ buffer, doorbell records, UAR page and
/// CQ buffer of an mlx5 QP into the GPU; the soft NIC and the tests use
/// ordinary device memory laid out the same way.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpHandle {
    /// SQ ring: `sq_size` basic blocks of 64 bytes, 64-byte aligned.
    pub sq: *mut u32,
    /// Producer index (WQEBBs reserved so far, wrapping `u32`). GPU atomics only.
    pub sq_producer: *mut u32,
    /// Ready index: WQEBBs whose doorbell has been rung. Batches ring in
    /// reservation order by waiting for it to reach their start.
    pub sq_ready: *mut u32,
    /// Send doorbell record (`dbrec[MLX5_SND_DBR]`): BE32 of the SQ counter
    /// (mod 2^16).
    pub sq_dbr: *mut u32,
    /// UAR / BlueFlame doorbell register (8 bytes).
    pub uar: *mut u64,
    /// CQ ring: `cq_size` CQEs of 64 bytes, 64-byte aligned.
    pub cq: *mut u32,
    /// CQ consumer index (CQEs consumed, wrapping `u32`); owned by the one
    /// thread that polls.
    pub cq_consumer: *mut u32,
    /// CQ doorbell record (`dbrec[MLX5_CQ_SET_CI]`): BE32 of the consumer
    /// index (mod 2^24).
    pub cq_dbr: *mut u32,
    /// SQ size in basic blocks, a power of 2.
    pub sq_size: u32,
    /// QP number (24 bits).
    pub qpn: u32,
    /// CQ size in CQEs, a power of 2.
    pub cq_size: u32,
    /// [`QP_GPU_SCOPE`] or zero.
    pub flags: u32,
}

/// [`QpHandle::flags`]: what reads this QP's rings and writes its CQEs is
/// an engine on the GPU the kernels run on (the soft NIC), so the IBGDA
/// transport releases doorbells ([`publish_and_ring`]), and acquires CQEs,
/// at GPU scope. Without it (a NIC
/// across PCIe) both are at system scope, as they must be, and cost more:
/// a system-scope fence waits for the GPU's earlier stores to reach the
/// whole system.
pub const QP_GPU_SCOPE: u32 = 1;

impl QpHandle {
    /// The NIC is an engine on this GPU ([`QP_GPU_SCOPE`]).
    #[inline(always)]
    pub fn gpu_scope(&self) -> bool {
        self.flags & QP_GPU_SCOPE != 0
    }

    /// Acquire-loads the last word of a CQE (its `op_own` byte) at the
    /// NIC's scope: the rest of the CQE, and what the NIC wrote before it,
    /// are read after it.
    ///
    /// # Safety
    /// `w` is a valid, 4-byte aligned word of this QP's CQ ring.
    #[inline(always)]
    pub unsafe fn acquire_cqe_word(&self, w: *const u32) -> u32 {
        // SAFETY: the caller's contract.
        unsafe {
            if self.gpu_scope() {
                ptx::ld_acquire_gpu_u32(w)
            } else {
                ptx::ld_acquire_sys_u32(w)
            }
        }
    }

    /// Release-stores the CQ doorbell record for consumer index `ci`: the
    /// NIC may reuse the CQEs before it, which were read before this.
    ///
    /// # Safety
    /// `cq_dbr` is valid.
    #[inline(always)]
    pub unsafe fn set_cq_doorbell_record(&self, ci: u32) {
        let v = (ci & 0xff_ffff).swap_bytes();
        // SAFETY: the caller's contract.
        unsafe {
            if self.gpu_scope() {
                ptx::st_release_gpu_u32(self.cq_dbr, v)
            } else {
                ptx::st_release_sys_u32(self.cq_dbr, v)
            }
        }
    }
}

const _: () = assert!(core::mem::size_of::<QpHandle>() == 80);
const _: () = assert!(core::mem::align_of::<QpHandle>() == 8);

// SAFETY: repr(C) plain data (pointers and u32s), the same size and alignment
// as the kernel's 80-byte .param.
#[cfg(not(target_arch = "nvptx64"))]
unsafe impl crate::KernelParam for QpHandle {}

/// A batch waited longer than its budget for its turn to ring the doorbell,
/// or found the queue failed by an earlier such batch (then `seen` is the
/// failure mark, see [`queue_failed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubmitTimeout {
    /// The ready index this batch waited for (its first WQEBB).
    pub expected: u32,
    /// The ready index it last saw.
    pub seen: u32,
}

/// How far (wrapping) past a batch's start the failure mark puts the ready
/// index: half the index space, where no live ready index can be (at most
/// `sq_size` WQEBBs are outstanding).
const FAILED_OFFSET: u32 = 1 << 31;

/// Whether the ready index `ready`, as seen by a batch starting at `start`,
/// is the failure mark: a batch that ran out of budget waiting for its turn
/// moves the ready index half the index space away, so that every batch
/// still waiting, and every later one, gives up at once instead of waiting
/// out its own budget for a turn that cannot come.
#[inline(always)]
pub fn queue_failed(ready: u32, start: u32) -> bool {
    start.wrapping_sub(ready) > FAILED_OFFSET / 2
}

/// Pointer to the basic block of producer index `idx`.
///
/// # Safety
/// `qp.sq` holds `qp.sq_size` basic blocks and `sq_size` is a power of 2.
#[inline(always)]
pub unsafe fn wqe_slot(qp: &QpHandle, idx: u32) -> *mut u32 {
    // SAFETY: the index is reduced mod sq_size, inside the ring.
    unsafe { qp.sq.add(((idx & (qp.sq_size - 1)) as usize) * 16) }
}

/// Reserves `count` consecutive basic blocks for the warp: lane 0 does one
/// relaxed atomic add on the producer index (GPU scope: only GPU threads
/// reserve; the ready index orders what the NIC sees), and the start is
/// broadcast with a shuffle. Returns the first reserved producer index on
/// every lane.
///
/// Called by the whole warp, converged, with the same `count` on every lane.
///
/// # Safety
/// `qp.sq_producer` is valid.
#[inline(always)]
pub unsafe fn reserve_wqe_slots_warp(qp: &QpHandle, count: u32) -> u32 {
    let mut start = 0;
    if ptx::lane_id() == 0 {
        // SAFETY: the caller's contract.
        start = unsafe { ptx::atom_add_relaxed_gpu_u32(qp.sq_producer, count) };
    }
    ptx::shfl_sync_idx_u32(ptx::FULL_MASK, start, 0)
}

/// Publishes the SQ counter `sq_counter` (the producer index after the batch)
/// to the doorbell record: one `st.release.sys` of its big-endian low 16
/// bits. The release makes the batch's WQEs (ordered before this thread by
/// the warp barrier) visible to the NIC no later than the record.
///
/// Called by one lane (the submitting lane).
///
/// # Safety
/// `qp.sq_dbr` is valid and 4-byte aligned.
#[inline(always)]
pub unsafe fn update_doorbell_record(qp: &QpHandle, sq_counter: u32) {
    // SAFETY: the caller's contract.
    unsafe { ptx::st_release_sys_u32(qp.sq_dbr, (sq_counter & 0xffff).swap_bytes()) }
}

/// Rings the doorbell: `fence.sc.sys` (the doorbell record reaches the NIC
/// before the doorbell), then one 8-byte store of the first 8 bytes of the
/// batch's last ctrl segment to the UAR register.
///
/// `ctrl_head` is that value as [`write_wqe`] returns it (its little-endian
/// bytes are the ctrl segment's first 8 bytes). The store is
/// `st.relaxed.sys.u64`: one 8-byte transaction at system scope. (PTX 8.2's
/// `st.mmio.relaxed.sys` would name the MMIO intent exactly; the module is
/// built as PTX 7.8.)
///
/// Called by one lane, after [`update_doorbell_record`].
///
/// # Safety
/// `qp.uar` is valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn ring_doorbell(qp: &QpHandle, ctrl_head: u64) {
    ptx::fence_sc_sys();
    // SAFETY: the caller's contract.
    unsafe { ptx::st_relaxed_sys_u64(qp.uar, ctrl_head) }
}

/// [`update_doorbell_record`] then [`ring_doorbell`], or, on a QP whose
/// NIC is an engine on this GPU ([`QP_GPU_SCOPE`]), the same two stores
/// as releases at GPU scope: the engine reads the doorbell word, then
/// acquires, then reads the record and the WQEs. What the IBGDA transport
/// calls; the mlx5 path ([`submit`]) always takes system scope.
///
/// Called by one lane, after the warp's WQEs are written and `sync_warp`.
///
/// # Safety
/// As for both functions.
#[inline(always)]
pub unsafe fn publish_and_ring(qp: &QpHandle, sq_counter: u32, ctrl_head: u64) {
    // SAFETY: the caller's contract.
    unsafe {
        if qp.gpu_scope() {
            ptx::st_release_gpu_u32(qp.sq_dbr, (sq_counter & 0xffff).swap_bytes());
            ptx::st_release_gpu_u64(qp.uar, ctrl_head);
        } else {
            update_doorbell_record(qp, sq_counter);
            ring_doorbell(qp, ctrl_head);
        }
    }
}

/// Submits the batch `start..start + count` (already written): waits until
/// the ready index reaches `start` (earlier batches have rung, so doorbells
/// reach the NIC in producer order), updates the doorbell record, rings the
/// doorbell with `ctrl_head` (the batch's last WQE), then hands the turn to
/// the next batch with a release of the ready index.
///
/// Called by one lane, after the warp's `sync_warp`. Gives up after
/// `budget_ns` without writing anything, and then marks the queue failed
/// ([`queue_failed`]): batches waiting or posted later give up at once.
/// A batch that finds the queue failed gives up at once too.
///
/// # Safety
/// The handle's pointers are valid.
#[inline(always)]
pub unsafe fn submit(qp: &QpHandle, start: u32, count: u32, ctrl_head: u64, budget_ns: u64) -> Result<(), SubmitTimeout> {
    // SAFETY: the caller's contract. Acquire pairs with the previous
    // batch's release below: its doorbell happens before ours.
    let turn = crate::sync::spin_until(
        budget_ns,
        || unsafe { ptx::ld_acquire_gpu_u32(qp.sq_ready) } as u64,
        |v| v == start as u64 || queue_failed(v as u32, start),
    );
    match turn {
        Ok(v) if v as u32 != start => {
            return Err(SubmitTimeout {
                expected: start,
                seen: v as u32,
            })
        }
        Ok(_) => {}
        // SAFETY: the caller's contract.
        Err(t) => unsafe { fail_queue(qp, start, t.seen as u32)? },
    }
    let end = start.wrapping_add(count);
    // SAFETY: the caller's contract.
    unsafe {
        update_doorbell_record(qp, end);
        ring_doorbell(qp, ctrl_head);
        ptx::st_release_gpu_u32(qp.sq_ready, end);
    }
    Ok(())
}

/// The slow path of [`submit`] once its budget ran out: marks the queue
/// failed unless the turn came meanwhile (then rings as usual) or another
/// batch marked it first. A batch whose turn it was and that rings after
/// the mark overwrites it; the next waiter then marks it again.
///
/// # Safety
/// As for [`submit`].
#[inline(never)]
unsafe fn fail_queue(qp: &QpHandle, start: u32, mut seen: u32) -> Result<(), SubmitTimeout> {
    let mark = start.wrapping_add(FAILED_OFFSET);
    loop {
        if queue_failed(seen, start) {
            return Err(SubmitTimeout { expected: start, seen });
        }
        // SAFETY: the caller's contract. Acquire: when the turn came after
        // all, the previous batch's doorbell happens before ours.
        let was = unsafe { ptx::atom_cas_acquire_gpu_u32(qp.sq_ready, seen, mark) };
        if was == seen {
            return Err(SubmitTimeout { expected: start, seen });
        }
        if was == start {
            // The turn came after all: the caller rings.
            return Ok(());
        }
        seen = was;
    }
}

/// The whole send path for one warp: lanes `0..count` each post `req` (its
/// `wqe_index` and `qpn` are set from the reserved slot and the handle; only
/// the last WQE of the batch is signaled when `signal_last`, else the
/// requests' own flags decide). Returns the batch's first producer index,
/// or the submit timeout (on every lane).
///
/// Called by the whole warp, converged, with the same `count` (1..=32).
///
/// # Safety
/// The handle's pointers are valid; fewer than `sq_size` WQEs are outstanding.
#[inline(always)]
pub unsafe fn post_batch_warp(
    qp: &QpHandle,
    req: &WqeRequest,
    count: u32,
    signal_last: bool,
    budget_ns: u64,
) -> Result<u32, SubmitTimeout> {
    let lane = ptx::lane_id();
    // SAFETY: the caller's contract.
    let start = unsafe { reserve_wqe_slots_warp(qp, count) };
    let mut head = 0u64;
    if lane < count {
        let idx = start.wrapping_add(lane);
        let mut r = *req;
        r.wqe_index = idx as u16;
        r.qpn = qp.qpn;
        if signal_last {
            r.flags = (r.flags & !FLAG_SIGNALED) | if lane == count - 1 { FLAG_SIGNALED } else { 0 };
        }
        // SAFETY: the slot is inside the ring and reserved for this lane.
        head = unsafe { write_wqe(wqe_slot(qp, idx), &r) };
    }
    ptx::sync_warp(ptx::FULL_MASK);
    let last = ptx::shfl_sync_idx_u64(ptx::FULL_MASK, head, count - 1);
    let mut status = 0u32;
    let mut seen = 0u32;
    if lane == 0 {
        // SAFETY: the caller's contract.
        if let Err(t) = unsafe { submit(qp, start, count, last, budget_ns) } {
            status = 1;
            seen = t.seen;
        }
    }
    let status = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, status, 0);
    let seen = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, seen, 0);
    if status == 0 {
        Ok(start)
    } else {
        Err(SubmitTimeout { expected: start, seen })
    }
}
