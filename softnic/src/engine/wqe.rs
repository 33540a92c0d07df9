//! Reading WQEs out of the SQ ring with the `#[descriptor]` decoders of
//! `doorbell_kernels::mlx5::segments`: 16-byte segments addressed by
//! (WQE counter, segment number), wrapping at the end of the ring.
//!
//! ## One read
//! [`parse`] copies a WQE out of the ring once — each of its segments with
//! one 16-byte load — into a [`Wqe`], and execution checks and moves data
//! from that copy only: a producer that rewrites the slot after the
//! doorbell (a bug, or a hostile rank) changes what the engine reads at
//! most before the copy, never between a check and the access it
//! guards. Each execution attempt makes its own copy: a WQE that waited
//! for its responder (no receive WQE yet, a peer not ready) touched
//! nothing and is copied and checked again when retried. What the fetch
//! reads ahead of execution (the ctrl segment's `ds`, and with a link
//! model the length and fence bit) only steps the ring and times the
//! WQE; execution refuses a WQE whose `ds` no longer spans the basic
//! blocks fetched ([`Reason::BadDs`]).

use doorbell_kernels::mlx5::{
    AtomicSeg, CqeSyndrome, CtrlSeg, DataSeg, RaddrSeg, INLINE_SEG, OPCODE_ATOMIC_CS, OPCODE_ATOMIC_FA, OPCODE_NOP, OPCODE_RDMA_READ,
    OPCODE_RDMA_WRITE, OPCODE_RDMA_WRITE_IMM, OPCODE_SEND, SEND_WQE_BB,
};

use super::mem;
use super::tables::{QpEntry, Reason};

/// Most basic blocks one WQE may span (`MLX5_SEND_WQE_MAX_WQEBBS`: 1 KiB).
pub const MAX_WQEBBS: u32 = 16;
/// Largest message (bytes) of one WQE: 2^31 − 1. A data segment's
/// `byte_count` of `0x8000_0000` is the inline flag ([`INLINE_SEG`]), so no
/// segment — and no message — reaches 2^31; a longer total fails with
/// `LOCAL_LENGTH` ([`Reason::Length`]).
pub const MAX_MESSAGE: u64 = (1 << 31) - 1;
/// Most basic blocks of a send queue: the doorbell record's send counter
/// has 16 bits, so a producer a whole ring of 2^16 ahead reads as nothing
/// published (and further overruns as a few WQEs); with at most 2^15 every
/// overrun short of 2^16 shows ([`Reason::SqOverrun`]). A QP with a larger
/// ring fails at its first doorbell.
pub const MAX_SQ_WQEBBS: u32 = 1 << 15;
/// Most receive WQEs of a receive queue (a 16-bit counter, as for
/// [`MAX_SQ_WQEBBS`]).
pub const MAX_RQ_WQES: u32 = 1 << 15;
/// Most data segments of one WQE the engine executes (its copy of the
/// gather or scatter list holds this many); more fail with `LOCAL_QP_OP`
/// ([`Reason::TooManySegments`]).
pub const MAX_SGE: usize = 16;

/// A parsed WQE: the engine's only copy of it (see the module docs).
///
/// Its first data segment is a field of its own; the others are written
/// into the caller's [`MoreSegs`], of which only the first
/// `data_count - 1` entries are written and read ([`Wqe::segments`]). So
/// the WQE stays small and a WQE of one data segment — every WQE the
/// transport posts — never touches the array, which on the GPU lives in
/// the engine thread's local memory (slow after every fence): a copy of a
/// WQE with all sixteen segments inline cost the GPU's engine ~8 000
/// cycles per WQE.
#[derive(Clone, Copy)]
pub struct Wqe<'a> {
    /// SQ counter (basic blocks) of its first basic block.
    pub idx: u32,
    /// Basic blocks it spans.
    pub bbs: u32,
    /// Its ctrl segment.
    pub ctrl: CtrlSeg,
    /// Its remote-address segment (zero for NOP and SEND).
    pub raddr: RaddrSeg,
    /// Its atomic segment (zero unless an atomic).
    pub atomic: AtomicSeg,
    /// Segment number of the first data segment.
    pub data_first: u32,
    /// Data segments.
    pub data_count: u32,
    /// Bytes of every data segment together.
    pub len: u64,
    /// Its first data segment (zero when it has none).
    first: DataSeg,
    /// Its other data segments: the first `data_count - 1` are written,
    /// the rest never read.
    rest: &'a MoreSegs,
}

/// Room for a WQE's data segments after the first, which the caller of
/// [`parse`] provides (uninitialised: [`more_segs`]).
pub type MoreSegs = [core::mem::MaybeUninit<DataSeg>; MAX_SGE - 1];

/// Uninitialised room for [`parse`]'s further data segments.
#[inline(always)]
pub const fn more_segs() -> MoreSegs {
    [core::mem::MaybeUninit::uninit(); MAX_SGE - 1]
}

impl Wqe<'_> {
    /// Its data segment `k` (`k < data_count`).
    #[inline(always)]
    fn seg(&self, k: usize) -> DataSeg {
        match k.checked_sub(1) {
            None => self.first,
            // SAFETY: `parse` writes entries 0..data_count-1 of `rest`
            // (data_count ≤ MAX_SGE) before it returns the WQE, and nothing
            // else builds one; `segments` asks only for k < data_count.
            Some(r) => unsafe { self.rest.get(r).map_or(DataSeg::default(), |d| d.assume_init()) },
        }
    }

    /// Its first data segment (an atomic's result address: `parse` gives
    /// an atomic exactly one).
    #[inline(always)]
    pub fn first_segment(&self) -> DataSeg {
        self.first
    }

    /// Its data segments, by value.
    #[inline(always)]
    pub fn segments(&self) -> impl Iterator<Item = DataSeg> + '_ {
        let n = (self.data_count as usize).min(MAX_SGE);
        (0..n).map(move |k| self.seg(k))
    }
}

impl core::fmt::Debug for Wqe<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Wqe")
            .field("idx", &self.idx)
            .field("bbs", &self.bbs)
            .field("ctrl", &self.ctrl)
            .field("raddr", &self.raddr)
            .field("atomic", &self.atomic)
            .field("data_first", &self.data_first)
            .field("len", &self.len)
            .field("data_count", &self.data_count)
            .finish_non_exhaustive()?;
        f.debug_list().entries(self.segments()).finish()
    }
}

impl PartialEq for Wqe<'_> {
    fn eq(&self, o: &Wqe<'_>) -> bool {
        (self.idx, self.bbs, self.ctrl, self.raddr, self.atomic, self.data_first, self.len)
            == (o.idx, o.bbs, o.ctrl, o.raddr, o.atomic, o.data_first, o.len)
            && self.segments().eq(o.segments())
    }
}

impl Eq for Wqe<'_> {}

/// Why a WQE cannot be executed as written (`LOCAL_QP_OP_ERR` or
/// `LOCAL_LENGTH_ERR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed {
    /// Syndrome to report.
    pub syndrome: CqeSyndrome,
    /// Why.
    pub reason: Reason,
    /// The opcode its ctrl segment held (for the error CQE).
    pub opcode: u8,
}

/// Address of segment `k` of the WQE whose first basic block has SQ
/// counter `idx`, wrapping at the end of the ring.
///
/// # Safety
/// `qp.sq` holds `qp.sq_wqebbs` (a power of two, non-zero) basic blocks.
#[inline(always)]
pub unsafe fn seg_ptr(qp: &QpEntry, idx: u32, k: u32) -> *const u8 {
    let ring_bytes = qp.sq_wqebbs as u64 * SEND_WQE_BB as u64;
    let off = (idx as u64 * SEND_WQE_BB as u64 + k as u64 * 16) & (ring_bytes - 1);
    // SAFETY: the offset is reduced modulo the ring size.
    unsafe { qp.sq.add(off as usize) }
}

/// Reads segment `k` of the WQE at `idx`.
///
/// # Safety
/// As for [`seg_ptr`]; the ring is 16-byte aligned.
#[inline(always)]
pub unsafe fn load_seg(qp: &QpEntry, idx: u32, k: u32) -> [u32; 4] {
    // SAFETY: the caller's contract.
    unsafe { mem::load_seg(seg_ptr(qp, idx, k)) }
}

/// The ctrl segment of the WQE at `idx`.
///
/// # Safety
/// As for [`load_seg`].
#[inline(always)]
pub unsafe fn read_ctrl(qp: &QpEntry, idx: u32) -> CtrlSeg {
    // SAFETY: the caller's contract.
    CtrlSeg::from_words(&unsafe { load_seg(qp, idx, 0) })
}

/// Basic blocks a WQE of `ds` 16-byte units spans, if `ds` is possible for
/// a ring of `sq_wqebbs` basic blocks.
#[inline(always)]
pub const fn wqe_bbs(ds: u8, sq_wqebbs: u32) -> Option<u32> {
    let bbs = (ds as u32 * 16).div_ceil(SEND_WQE_BB as u32);
    if ds == 0 || bbs > MAX_WQEBBS || bbs > sq_wqebbs {
        None
    } else {
        Some(bbs)
    }
}

/// Segments before the data segments, for each executed opcode, and
/// whether the opcode is one the engine executes.
const fn layout(opcode: u8) -> Option<u32> {
    match opcode {
        OPCODE_NOP => Some(1),
        OPCODE_SEND => Some(1),
        OPCODE_RDMA_WRITE | OPCODE_RDMA_WRITE_IMM | OPCODE_RDMA_READ => Some(2),
        OPCODE_ATOMIC_CS | OPCODE_ATOMIC_FA => Some(3),
        _ => None,
    }
}

const fn malformed(reason: Reason, opcode: u8) -> Malformed {
    Malformed {
        syndrome: CqeSyndrome::LocalQpOp,
        reason,
        opcode,
    }
}

/// Copies the WQE at SQ counter `idx` out of the ring (each segment once)
/// and checks its shape: a known opcode, a `ds` that fits the opcode and
/// the ring, `wqe_index` equal to the consumer index and the QP's own
/// number in the ctrl segment (the soft NIC is stricter than hardware
/// here: it catches producer bugs), at most [`MAX_SGE`] data segments, no
/// inline data, at most [`MAX_MESSAGE`] bytes, and an atomic with exactly
/// one 8-byte data segment. Reads only the ring; everything after works
/// from the returned copy.
///
/// # Safety
/// As for [`load_seg`].
#[inline(always)]
pub unsafe fn parse<'a>(qp: &QpEntry, idx: u32, more: &'a mut MoreSegs) -> Result<Wqe<'a>, Malformed> {
    // SAFETY: the caller's contract.
    let ctrl = unsafe { read_ctrl(qp, idx) };
    let op = ctrl.opcode;
    let head = layout(op).ok_or(malformed(Reason::BadOpcode, op))?;
    let bbs = wqe_bbs(ctrl.ds, qp.sq_wqebbs).ok_or(malformed(Reason::BadDs, op))?;
    if (ctrl.ds as u32) < head {
        return Err(malformed(Reason::BadDs, op));
    }
    if ctrl.wqe_index != idx as u16 {
        return Err(malformed(Reason::WqeIndexMismatch, op));
    }
    if ctrl.qpn != qp.qpn & 0xff_ffff {
        return Err(malformed(Reason::QpnMismatch, op));
    }
    let is_atomic = matches!(op, OPCODE_ATOMIC_CS | OPCODE_ATOMIC_FA);
    let data_count = if op == OPCODE_NOP { 0 } else { ctrl.ds as u32 - head };
    if data_count as usize > MAX_SGE {
        return Err(malformed(Reason::TooManySegments, op));
    }
    if is_atomic && data_count != 1 {
        return Err(malformed(Reason::BadDs, op));
    }
    let mut raddr = RaddrSeg::default();
    let mut atomic = AtomicSeg::default();
    if head >= 2 {
        // SAFETY: the caller's contract.
        raddr = RaddrSeg::from_words(&unsafe { load_seg(qp, idx, 1) });
    }
    if is_atomic {
        // SAFETY: the caller's contract.
        atomic = AtomicSeg::from_words(&unsafe { load_seg(qp, idx, 2) });
    }
    let mut first = DataSeg::default();
    let mut len = 0u64;
    for n in 0..data_count {
        // SAFETY: the caller's contract.
        let d = DataSeg::from_words(&unsafe { load_seg(qp, idx, head + n) });
        if d.byte_count & INLINE_SEG != 0 {
            return Err(malformed(Reason::InlineUnsupported, op));
        }
        len += d.byte_count as u64;
        match (n as usize).checked_sub(1) {
            None => first = d,
            Some(r) => {
                if let Some(slot) = more.get_mut(r) {
                    slot.write(d);
                }
            }
        }
    }
    if len > MAX_MESSAGE || (is_atomic && len != 8) {
        return Err(Malformed {
            syndrome: CqeSyndrome::LocalLength,
            reason: Reason::Length,
            opcode: op,
        });
    }
    let w = Wqe {
        idx,
        bbs,
        ctrl,
        raddr,
        atomic,
        data_first: head,
        data_count,
        len,
        first,
        rest: more,
    };
    Ok(w)
}

/// Whether the opcode reads from the responder (RDMA read, atomics): a
/// fenced WQE waits for these.
#[inline(always)]
pub const fn is_read_or_atomic(opcode: u8) -> bool {
    matches!(opcode, OPCODE_RDMA_READ | OPCODE_ATOMIC_CS | OPCODE_ATOMIC_FA)
}
