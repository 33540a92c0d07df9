//! Bursts: the GPU engine's path for runs of small RDMA WRITEs, the WQEs
//! the transport posts most (signals, barrier words, short puts).
//!
//! The one-WQE path ([`super::exec::execute`]) is one thread's chain of
//! dependent loads: the WQE, the local region, the responder's port, QP
//! and region, the payload — each waiting for the one before (about
//! 13 500 cycles of control per WQE on an H200). A burst hands the run of
//! WQEs a doorbell published to a warp of the engine's block, one WQE per
//! lane: every lane reads its WQE out of the ring once, makes the same
//! checks as the one-WQE path on that copy, and copies the payload (at
//! most [`BURST_MAX_BYTES`]) into shared memory, all lanes' loads in
//! flight together. Then the warp's lane 0 stores the payloads in WQE
//! order, each ordered behind the ones before it (a release each), writes
//! the CQEs the WQEs ask for and steps the ring. A row of WRITEs marked
//! unordered (a warp-wide run's after its first, none signaled) it hands
//! back to the warp: each lane stores its own behind one fence, and lane 0
//! goes on once they all have (a warp barrier before its next release).
//!
//! **Many QPs at once.** The control thread queues the bursts of one pass
//! over its port — one per QP with simple WRITEs published, at most
//! [`JOBS`] and one per warp of the block — and the block runs them in one
//! round: warp `j` gathers burst `j`'s WQEs, a lane each, then its lane 0
//! completes them in order (payload, CQEs, the QP's ring). Bursts of
//! different QPs share nothing but the port's counters, which the control
//! thread adds up after the round, so their ordered stores and CQEs
//! proceed side by side rather than one QP after the other. After a pass
//! with at most one burst, though, a burst runs as soon as it is queued:
//! a lone request (a round trip's signal) then waits for no walk over the
//! other QPs.
//!
//! A burst covers the longest prefix of the published WQEs that are
//! simple: an RDMA WRITE with one data segment of 1..=[`BURST_MAX_BYTES`]
//! bytes whose ctrl segment, keys, bounds, access, responder and room
//! all pass. The first WQE that is anything else — another opcode, a
//! longer message, a bad key, a responder not ready — ends the burst
//! untouched, and the one-WQE path executes it (and reports its error),
//! so every error completion, every fault and every other opcode behave
//! as before. Bursts run only when the engine is free to reorder nothing:
//! the link model off, no fault injected, nothing in flight on the QP.

use doorbell_kernels::mlx5::{CtrlSeg, DataSeg, RaddrSeg, CQE_REQ, INLINE_SEG, OPCODE_RDMA_WRITE, UNORDERED_WRITE_IMM, WQE_CTRL_CQ_UPDATE};

use super::exec::{answers, check_remote_at};
use super::mem::Scope;
pub use super::mover::Outcome;
use super::mover::{copy_part, overlaps, PayloadMover};
use super::tables::{access, CqEntry, Port, PortStats, PortTable, Ports, QpEntry, QP_CONNECTED};
use super::{cqe, mem};

/// Most WQEs one burst takes (one per lane of a warp).
pub const BURST_MAX: u32 = 32;
/// Most bursts of one round: one per warp of the engine's block, each on
/// its own QP.
pub const JOBS: usize = 16;
/// Most payload bytes of a WQE a burst takes; longer WRITEs take the
/// one-WQE path, whose copy uses the whole block.
pub const BURST_MAX_BYTES: u32 = 64;

/// [`Slot::flags`]: the WQE is simple and checked; its payload is in
/// [`Slot::data`].
pub const SLOT_OK: u32 = 1;
/// [`Slot::flags`]: the WQE asks for a CQE.
pub const SLOT_SIGNALED: u32 = 2;
/// [`Slot::flags`]: the WRITE is a warp-wide run's WQE other than its
/// first ([`UNORDERED_WRITE_IMM`]): it needs no order with the run's other
/// WRITEs.
pub const SLOT_UNORDERED: u32 = 4;

/// [`BurstJob::row`]`[2]`: the lanes named store their slots' payload.
pub const ROW_STORE: u32 = 1;
/// [`BurstJob::row`]`[2]`: the burst is complete; the lanes leave.
pub const ROW_DONE: u32 = 2;

/// The end of the row of checked, unsignaled WRITEs marked unordered
/// that starts at slot `from` of burst `job` (`from` itself when that slot
/// is not one).
///
/// # Safety
/// `job` is a burst being completed.
#[inline(always)]
unsafe fn row_end(job: *const BurstJob, from: u32, count: u32) -> u32 {
    let mut end = from;
    // SAFETY: the caller's contract.
    while end < count
        && unsafe { (*job).slots.get(end as usize) }
            .is_some_and(|s| s.flags & (SLOT_OK | SLOT_UNORDERED | SLOT_SIGNALED) == SLOT_OK | SLOT_UNORDERED)
    {
        end += 1;
    }
    end
}

/// One WQE of a burst, as its thread leaves it in shared memory.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    /// Where the payload goes (as this engine reaches it).
    pub dst: u64,
    /// Payload bytes.
    pub len: u32,
    /// [`SLOT_OK`], [`SLOT_SIGNALED`], [`SLOT_UNORDERED`]; 0: not simple,
    /// the burst ends here.
    pub flags: u32,
    /// The payload, read from the gather list once.
    pub data: [u64; (BURST_MAX_BYTES / 8) as usize],
}

/// One burst of a round, in shared memory next to the block's copy job
/// (the block holds [`JOBS`] of them): the control thread writes its head
/// before the round's first barrier; the threads of warp `j` (burst `j`)
/// below `count` fill their slots before the second; that warp's lane 0
/// completes the burst and writes its tally before the third.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug)]
pub struct BurstJob {
    /// The burst's QP and WQEs.
    pub head: BurstHead,
    /// What [`complete`] did, for the control thread.
    pub tally: Tally,
    /// Lane 0 to its warp while completing: store the slots
    /// `row[0]..row[1]` ([`ROW_STORE`] in `row[2]`), or stop ([`ROW_DONE`]).
    pub row: [u32; 4],
    /// One per WQE.
    pub slots: [Slot; BURST_MAX as usize],
}

/// A burst's QP and WQEs. The QP's own fields the checks need come with
/// it (the control thread has just read that entry), so a thread's first
/// loads are its WQE's segments and the responder's entries, side by
/// side, not one after the other.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug)]
pub struct BurstHead {
    /// The fabric's port table (`*const PortTable`).
    pub table: u64,
    /// The engine's own port (`*const Port`).
    pub own: u64,
    /// The QP's send ring.
    pub sq: u64,
    /// The engine's port index.
    pub port: u32,
    /// The QP slot.
    pub q: u32,
    /// SQ counter of the first WQE.
    pub start: u32,
    /// WQEs to look at (thread `t` takes `start + t`).
    pub count: u32,
    /// The QP's ring size (basic blocks).
    pub sq_wqebbs: u32,
    /// The QP's number.
    pub qpn: u32,
    /// The QP's protection domain.
    pub pd: u32,
    /// The responder: its port index.
    pub peer_port: u32,
    /// The responder: its QP slot.
    pub peer_qp: u32,
    /// 1: the QP is connected ([`QP_CONNECTED`]).
    pub connected: u32,
    /// The QP's send CQ (no two bursts of a round share one).
    pub send_cq: u32,
    /// 1: the engine orders its stores at `sys` scope, else `gpu`.
    pub sys: u32,
    /// The engine's clock when the burst was queued (the CQEs' time).
    pub now_ns: u64,
}

impl BurstHead {
    /// The head of a burst of `count` WQEs of QP `q` (`qp`) of port `p`
    /// from SQ counter `start` on.
    #[inline(always)]
    pub fn new(table: u64, own: u64, (p, q): (usize, usize), qp: &QpEntry, start: u32, count: u32) -> BurstHead {
        BurstHead {
            table,
            own,
            sq: qp.sq as usize as u64,
            port: p as u32,
            q: q as u32,
            start,
            count,
            sq_wqebbs: qp.sq_wqebbs,
            qpn: qp.qpn,
            pd: qp.pd,
            peer_port: qp.peer_port,
            peer_qp: qp.peer_qp,
            connected: (qp.flags & QP_CONNECTED != 0) as u32,
            send_cq: qp.send_cq,
            sys: 1,
            now_ns: 0,
        }
    }
}

/// What a burst's completion did: its [`Outcome`], and what the port's
/// counters gain from it. The thread that completes a burst does not
/// write the port's counters (other bursts of the port complete at the same
/// time on other threads); the control thread adds the tallies.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    /// WQEs executed (the outcome's `done`).
    pub done: u32,
    /// The outcome's `fetch`.
    pub fetch: u32,
    /// Payload bytes.
    pub bytes: u64,
    /// CQEs written.
    pub cqes: u32,
    /// The SQ counter of the last WQE executed.
    pub last_wqe: u32,
    /// Lane 0's cycles gathering its WQE and completing the burst (the
    /// engine's profile).
    pub gather_cycles: u32,
    /// See `gather_cycles`.
    pub complete_cycles: u32,
    /// WRITEs stored without a release of their own ([`SLOT_UNORDERED`]).
    pub unordered: u32,
}

impl Tally {
    /// The burst's outcome.
    pub fn outcome(&self) -> Outcome {
        Outcome {
            done: self.done,
            fetch: self.fetch,
        }
    }

    /// Adds the tally of QP slot `q`'s burst to port `port`'s counters
    /// (the control thread).
    pub fn apply(&self, port: &mut Port, q: usize) {
        if self.done != 0 {
            self.apply_to(port.stats_mut(q));
        }
    }

    /// [`Self::apply`] to the counters of the QP's shard.
    #[inline(always)]
    pub fn apply_to(&self, s: &mut PortStats) {
        s.fetched += self.done as u64;
        s.executed += self.done as u64;
        s.wqes += self.done as u64;
        s.bytes += self.bytes;
        s.cqes += self.cqes as u64;
        s.last_wqe = self.last_wqe;
    }
}

/// What a simple WQE does, as its checks found it.
#[derive(Clone, Copy)]
pub(crate) struct Simple {
    pub(crate) dst: *mut u8,
    pub(crate) src: *const u8,
    pub(crate) len: u32,
    pub(crate) signaled: bool,
    pub(crate) unordered: bool,
}

/// Segment `k` of the WQE at SQ counter `idx` of the ring `sq` of
/// `wqebbs` basic blocks (a power of two), as [`super::wqe::seg_ptr`].
#[inline(always)]
fn seg_at(sq: u64, wqebbs: u32, idx: u32, k: u32) -> *const u8 {
    let ring = wqebbs as u64 * 64;
    (sq + ((idx as u64 * 64 + k as u64 * 16) & (ring - 1))) as usize as *const u8
}

/// Reads the WQE at SQ counter `idx` of the burst's QP (each segment
/// once) and checks it as [`super::exec::execute`] would check an RDMA
/// WRITE; `None` unless it is simple (see the module docs).
///
/// # Safety
/// The tables' contract ([`super::poll_port`]); `h` is the burst's header.
#[inline(always)]
pub(crate) unsafe fn simple_write(ports: &PortTable, h: &BurstHead, idx: u32) -> Option<Simple> {
    if h.sq == 0 || h.sq_wqebbs == 0 {
        return None;
    }
    // The responder's entries and the WQE's segments, all independent.
    let peer = ports.get(h.peer_port as usize);
    // SAFETY: the caller's contract; segments of the ring.
    let segs = unsafe { load_wqe(h, idx) };
    if !peer.is_some_and(|port| answering(port, h)) {
        return None;
    }
    // SAFETY: the caller's contract: the engine's own live port.
    let own: &Port = unsafe { (h.own as usize as *const Port).as_ref() }?;
    check_write(&Tables { ports, own }, h, idx, &segs)
}

/// The three segments of the WQE at SQ counter `idx` of the burst's QP
/// (ctrl, remote address, first data segment), each read once.
///
/// # Safety
/// `h.sq` is the QP's ring of `h.sq_wqebbs` basic blocks (not 0).
#[inline(always)]
pub(crate) unsafe fn load_wqe(h: &BurstHead, idx: u32) -> [[u32; 4]; 3] {
    // SAFETY: the caller's contract; segments of the ring.
    unsafe {
        [
            mem::load_seg(seg_at(h.sq, h.sq_wqebbs, idx, 0)),
            mem::load_seg(seg_at(h.sq, h.sq_wqebbs, idx, 1)),
            mem::load_seg(seg_at(h.sq, h.sq_wqebbs, idx, 2)),
        ]
    }
}

/// Whether `peer` (the responder's port) answers the burst's QP: it is
/// connected, and its QP is connected back and ready to receive.
#[inline(always)]
pub(crate) fn answering(peer: &Port, h: &BurstHead) -> bool {
    h.connected != 0 && answers(peer, h.peer_qp as usize, (h.port as usize, h.q as usize))
}

/// Where [`check_write`] reads the tables: the tables themselves
/// ([`Tables`]), or copies of the entries a lone request's WQEs were
/// expected to name, read in one trip with the WQEs (`resident::lone`).
pub(crate) trait WriteTables {
    /// [`Port::check_mr`] of the engine's own port for a gather entry
    /// (local read).
    fn local(&self, key: u32, pd: u32, addr: u64, len: u64) -> Option<*mut u8>;
    /// [`check_remote_at`] of the responder `h` names, for a WRITE.
    fn remote(&self, h: &BurstHead, addr: u64, key: u32, len: u64) -> Option<*mut u8>;
}

/// The tables themselves: the fabric's and the engine's own port.
pub(crate) struct Tables<'a> {
    pub ports: &'a PortTable,
    pub own: &'a Port,
}

impl WriteTables for Tables<'_> {
    #[inline(always)]
    fn local(&self, key: u32, pd: u32, addr: u64, len: u64) -> Option<*mut u8> {
        self.own.check_mr(key, pd, addr, len, 0).ok()
    }
    #[inline(always)]
    fn remote(&self, h: &BurstHead, addr: u64, key: u32, len: u64) -> Option<*mut u8> {
        check_remote_at(
            self.ports,
            h.peer_port as usize,
            h.peer_qp as usize,
            addr,
            key,
            len,
            access::REMOTE_WRITE,
        )
        .ok()
    }
}

/// Checks the WQE at SQ counter `idx` whose segments are `segs` (read
/// once, [`load_wqe`]) as [`super::exec::execute`] would check an RDMA
/// WRITE of the engine's port, whose responder answers ([`answering`]),
/// reading the tables through `t`; `None` unless it is simple (see the
/// module docs).
#[inline(always)]
pub(crate) fn check_write(t: &impl WriteTables, h: &BurstHead, idx: u32, segs: &[[u32; 4]; 3]) -> Option<Simple> {
    let ctrl = CtrlSeg::from_words(&segs[0]);
    // One basic block: ctrl, remote address, one data segment.
    if ctrl.opcode != OPCODE_RDMA_WRITE || ctrl.ds != 3 || ctrl.wqe_index != idx as u16 || ctrl.qpn != h.qpn & 0xff_ffff {
        return None;
    }
    let raddr = RaddrSeg::from_words(&segs[1]);
    let seg = DataSeg::from_words(&segs[2]);
    let len = seg.byte_count;
    if len & INLINE_SEG != 0 || len == 0 || len > BURST_MAX_BYTES {
        return None;
    }
    let src = t.local(seg.lkey, h.pd, seg.addr, len as u64)?;
    let dst = t.remote(h, raddr.raddr, raddr.rkey, len as u64)?;
    if overlaps(dst, src, len as usize) {
        return None;
    }
    Some(Simple {
        dst,
        src,
        len,
        signaled: ctrl.fm_ce_se & WQE_CTRL_CQ_UPDATE != 0,
        unordered: ctrl.imm == UNORDERED_WRITE_IMM,
    })
}

/// Thread `t`'s part of a burst: checks WQE `start + t` and, if simple,
/// copies its payload into its slot. Called by threads `0..count` after
/// the round's first barrier.
///
/// # Safety
/// `job` is the block's burst job, written by the control thread before
/// the barrier; the tables' contract ([`super::poll_port`]).
pub unsafe fn gather(job: *mut BurstJob, t: usize) {
    // SAFETY (whole function): the caller's contract; slot `t` is this
    // thread's alone until the round's second barrier.
    unsafe {
        let h = &(*job).head;
        let idx = h.start.wrapping_add(t as u32);
        let table = h.table as usize as *const PortTable;
        let w = match table.as_ref() {
            Some(ports) => simple_write(ports, h, idx),
            None => None,
        };
        let Some(slot) = (*job).slots.get_mut(t) else { return };
        slot.flags = 0;
        let Some(w) = w else { return };
        copy_part(slot.data.as_mut_ptr() as *mut u8, w.src, w.len as usize, 0, 1);
        slot.dst = w.dst as usize as u64;
        slot.len = w.len;
        slot.flags = SLOT_OK | if w.signaled { SLOT_SIGNALED } else { 0 } | if w.unordered { SLOT_UNORDERED } else { 0 };
    }
}

/// Writes the CQE of a simple WRITE executed (QP `qpn`, SQ counter `idx`,
/// `len` bytes, at engine time `now_ns`) into its send CQ `cq`, whose room
/// the caller checked; whether it was written.
///
/// # Safety
/// `cq`'s ring is valid (the tables' contract).
#[inline(always)]
pub(crate) unsafe fn push_write_cqe(cq: &mut CqEntry, qpn: u32, idx: u32, len: u32, now_ns: u64, scope: Scope) -> bool {
    let img = cqe::success(
        cq,
        &cqe::Success {
            opcode: CQE_REQ,
            qpn,
            wqe_counter: idx as u16,
            byte_cnt: len,
            imm: 0,
            sop: OPCODE_RDMA_WRITE,
            solicited: false,
            time_ns: now_ns,
        },
    );
    // SAFETY: the caller's contract.
    unsafe { cqe::push(cq, &img, false, scope) }
}

/// One thread's part, after its burst's slots are filled: executes the
/// simple prefix of the slots in order — payload through `mover` (ordered
/// behind the payload before it as the one-WQE path orders it), the CQE
/// of each signaled WQE — and steps QP `q`'s ring past them. Stops before
/// the first slot that is not simple and before a signaled WQE whose send
/// CQ is full. Writes only QP `q`'s own entries and its send CQ, so the
/// bursts of different QPs complete at the same time on different
/// threads; returns what it did, how far the one-WQE path goes next and
/// what the port's counters gain ([`Tally`]).
///
/// # Safety
/// `job` holds the burst's filled slots; the tables' contract.
pub unsafe fn complete<P: Ports + ?Sized, M: PayloadMover>(
    ports: &mut P,
    p: usize,
    job: *const BurstJob,
    now_ns: u64,
    mover: &mut M,
) -> Tally {
    let scope: Scope = mover.scope();
    // SAFETY (whole function): the caller's contract.
    unsafe {
        let (q, start, count) = ((*job).head.q as usize, (*job).head.start, (*job).head.count);
        let mut tally = Tally::default();
        let mut done = 0u32;
        let mut full = false;
        // The QP's entry and its send CQ are looked up once, before the
        // first payload: nothing else writes them during the round (the
        // control thread starts nothing on a QP with a queued burst, and no
        // two bursts of a round share a send CQ). Each payload's release
        // is then followed by stores only, not by loads of the tables it
        // would have to fetch again from L2.
        if let Some(port) = ports.get_mut(p) {
            doorbell_kernels::trace_hook! {
                let tr = super::trace::rings(port);
            }
            let Port { qps, cqs, .. } = port;
            if let Some(qp) = qps.get_mut(q) {
                let qpn = qp.qpn;
                let mut cq = cqs.get_mut(qp.send_cq as usize);
                // A WRITE marked unordered is stored without a release of
                // its own; one fence before the first of a row of them
                // orders the row behind every payload before it.
                let mut fenced = false;
                while done < count {
                    let Some(slot) = (*job).slots.get(done as usize) else { break };
                    if slot.flags & SLOT_OK == 0 {
                        break;
                    }
                    let signaled = slot.flags & SLOT_SIGNALED != 0;
                    let idx = start.wrapping_add(done);
                    if signaled && !cq.as_deref_mut().is_some_and(|cq| cqe::has_room_cached(cq)) {
                        full = true;
                        break;
                    }
                    // A row of unordered, unsignaled WRITEs: each lane of
                    // the warp stores its own (the mover's `row`), and this
                    // thread only counts them.
                    let row_end = row_end(job, done, count);
                    if row_end > done && mover.row(done, row_end) {
                        while done < row_end {
                            let len = (*job).slots.get(done as usize).map_or(0, |s| s.len);
                            let idx = start.wrapping_add(done);
                            doorbell_kernels::trace_hook! {
                                super::trace::event(tr, super::trace::What::NicFetch, u32::MAX, idx as u64);
                                super::trace::event(tr, super::trace::What::NicExecute, (*job).head.peer_port, len as u64);
                            }
                            tally.unordered += 1;
                            tally.bytes += len as u64;
                            tally.last_wqe = idx;
                            done += 1;
                            mover.executed(q);
                        }
                        fenced = false;
                        continue;
                    }
                    let (dst, src, len) = (slot.dst as usize as *mut u8, slot.data.as_ptr() as *const u8, slot.len as usize);
                    if slot.flags & SLOT_UNORDERED != 0 {
                        if !fenced {
                            mem::acquire(scope);
                            fenced = true;
                        }
                        copy_part(dst, src, len, 0, 1);
                        tally.unordered += 1;
                    } else {
                        mover.copy(dst, src, len);
                        fenced = false;
                    }
                    doorbell_kernels::trace_hook! {
                        super::trace::event(tr, super::trace::What::NicFetch, u32::MAX, idx as u64);
                        super::trace::event(tr, super::trace::What::NicExecute, (*job).head.peer_port, slot.len as u64);
                    }
                    tally.bytes += slot.len as u64;
                    tally.last_wqe = idx;
                    if signaled {
                        if let Some(cq) = cq.as_deref_mut() {
                            if push_write_cqe(cq, qpn, idx, slot.len, now_ns, scope) {
                                tally.cqes += 1;
                                doorbell_kernels::trace_hook! {
                                    super::trace::event(tr, super::trace::What::NicCqe, u32::MAX, cq.pi as u64);
                                }
                            }
                        }
                    }
                    done += 1;
                    mover.executed(q);
                }
                // The ring steps once, past the WQEs executed.
                if done != 0 {
                    qp.sq_ci = start.wrapping_add(done);
                }
            }
        }
        // The WQEs after the prefix the block saw were not simple: the
        // one-WQE path takes those, and a burst what follows them.
        let mut skip = 0u32;
        while done + skip < count && (*job).slots.get((done + skip) as usize).is_some_and(|s| s.flags & SLOT_OK == 0) {
            skip += 1;
        }
        let fetch = match (skip, done + skip == count) {
            // A full send CQ: the one-WQE path waits for room (and says
            // when to look again), as it always has.
            _ if full => u32::MAX,
            (0, _) => 0,
            (_, true) => u32::MAX,
            (k, false) => k,
        };
        tally.done = done;
        tally.fetch = fetch;
        tally
    }
}
