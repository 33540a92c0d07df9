//! The receive queue, laid out as mlx5's (non-SRQ) RQ: `rq_wqes` receive
//! WQEs of `rq_max_sge` data segments each (`struct mlx5_wqe_data_seg`,
//! encoded with [`DataSeg`]); a WQE with fewer scatter entries ends with one
//! whose lkey is [`INVALID_LKEY`]. The producer publishes the receive
//! counter (low 16 bits, BE32) in `dbrec[MLX5_RCV_DBR]` (`dbrec[0]`).

use doorbell_kernels::mlx5::DataSeg;

use super::mem;
use super::tables::{QpEntry, Reason, INVALID_LKEY};

/// Most scatter entries of one receive WQE the engine copies and executes
/// (`create_qp` refuses a larger `rq_max_sge`; a receive WQE of a larger
/// stride with more live entries fails with [`Reason::TooManySegments`]).
pub const MAX_RECV_SGE: usize = 16;

/// A receive WQE as the engine copied it out of the RQ ring: its scatter
/// list, up to the terminator. The engine checks and scatters from this
/// copy only (a consumer that rewrites the slot after posting it cannot
/// move the scatter past what was checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWqe {
    /// Its scatter entries, `count` of them.
    pub sges: [DataSeg; MAX_RECV_SGE],
    /// Entries.
    pub count: u32,
}

impl RecvWqe {
    /// No entries (what [`read_wqe`] fills).
    pub const EMPTY: RecvWqe = RecvWqe {
        sges: [DataSeg {
            byte_count: 0,
            lkey: 0,
            addr: 0,
        }; MAX_RECV_SGE],
        count: 0,
    };

    /// Its scatter entries.
    #[inline(always)]
    pub fn entries(&self) -> &[DataSeg] {
        self.sges.get(..(self.count as usize).min(MAX_RECV_SGE)).unwrap_or(&[])
    }
}

/// Copies receive WQE `idx` of `qp` out of the ring into `r`, each entry
/// with one 16-byte load, up to its terminator (an [`INVALID_LKEY`] entry)
/// or `rq_max_sge` entries. In place: the caller's copy is the only one.
///
/// # Safety
/// As for [`sge_ptr`].
pub unsafe fn read_wqe(qp: &QpEntry, idx: u32, r: &mut RecvWqe) -> Result<(), Reason> {
    r.count = 0;
    let mut k = 0u32;
    // SAFETY: the caller's contract.
    while let Some(d) = unsafe { read_sge(qp, idx, k) } {
        let Some(slot) = r.sges.get_mut(k as usize) else {
            return Err(Reason::TooManySegments);
        };
        *slot = d;
        k += 1;
    }
    r.count = k;
    Ok(())
}

/// Address of scatter entry `k` of receive WQE `idx`.
///
/// # Safety
/// `qp.rq` holds `qp.rq_wqes` (a power of two, non-zero) WQEs of
/// `qp.rq_max_sge × 16` bytes.
#[inline(always)]
pub unsafe fn sge_ptr(rq: *mut u8, rq_wqes: u32, max_sge: u32, idx: u32, k: u32) -> *mut u8 {
    let slot = (idx & (rq_wqes - 1)) as usize;
    // SAFETY: inside the ring (the caller's contract).
    unsafe { rq.add((slot * max_sge as usize + k as usize) * 16) }
}

/// Scatter entry `k` of receive WQE `idx` of `qp`, or `None` past the end
/// of its list (an [`INVALID_LKEY`] terminator or `k == rq_max_sge`).
///
/// # Safety
/// As for [`sge_ptr`].
pub unsafe fn read_sge(qp: &QpEntry, idx: u32, k: u32) -> Option<DataSeg> {
    if k >= qp.rq_max_sge {
        return None;
    }
    // SAFETY: the caller's contract.
    let d = DataSeg::from_words(&unsafe { mem::load_seg(sge_ptr(qp.rq, qp.rq_wqes, qp.rq_max_sge, idx, k)) });
    if d.lkey == INVALID_LKEY {
        None
    } else {
        Some(d)
    }
}

/// Receive WQEs posted past `consumed` (the receive WQEs a requester
/// took: its [`super::tables::QpEntry::peer_rq_ci`]).
///
/// # Safety
/// `qp.dbrec` is valid when `qp.rq` is not null.
pub unsafe fn posted_since(qp: &QpEntry, consumed: u32) -> u32 {
    if qp.rq.is_null() || qp.rq_wqes == 0 || qp.dbrec.is_null() {
        return 0;
    }
    // SAFETY: the caller's contract.
    let pi = unsafe { mem::load_dbrec(qp.dbrec) } as u16;
    pi.wrapping_sub(consumed as u16) as u32
}

/// Receive WQEs posted and not completed (the owner's view: its
/// `rq_ci`).
///
/// # Safety
/// `qp.dbrec` is valid when `qp.rq` is not null.
pub unsafe fn posted(qp: &QpEntry) -> u32 {
    if qp.rq.is_null() || qp.rq_wqes == 0 || qp.dbrec.is_null() {
        return 0;
    }
    // SAFETY: the caller's contract.
    let pi = unsafe { mem::load_dbrec(qp.dbrec) } as u16;
    pi.wrapping_sub(qp.rq_ci as u16) as u32
}

/// Writes receive WQE `idx` with the scatter list `sges` (at most
/// `max_sge` entries; a shorter list gets an [`INVALID_LKEY`] terminator).
/// Publish it with [`publish`]. Returns false, writing nothing, when the
/// list is too long.
///
/// # Safety
/// As for [`sge_ptr`], for writes.
pub unsafe fn write_wqe(rq: *mut u8, rq_wqes: u32, max_sge: u32, idx: u32, sges: &[DataSeg]) -> bool {
    if sges.len() > max_sge as usize {
        return false;
    }
    for (k, s) in sges.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe { mem::store_seg(sge_ptr(rq, rq_wqes, max_sge, idx, k as u32), s.to_words()) };
    }
    if sges.len() < max_sge as usize {
        let end = DataSeg {
            byte_count: 0,
            lkey: INVALID_LKEY,
            addr: 0,
        };
        // SAFETY: the caller's contract.
        unsafe { mem::store_seg(sge_ptr(rq, rq_wqes, max_sge, idx, sges.len() as u32), end.to_words()) };
    }
    true
}

/// Publishes receive counter `counter` (receive WQEs posted so far) to the
/// doorbell record `dbrec[0]` with release.
///
/// # Safety
/// `dbrec` is valid and 4-byte aligned.
pub unsafe fn publish(dbrec: *mut u32, counter: u32) {
    // SAFETY: the caller's contract.
    unsafe { mem::store_dbrec(dbrec, counter & 0xffff) }
}
