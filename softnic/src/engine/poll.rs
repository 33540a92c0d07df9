//! One pass of the engine over a port: for each QP, notice doorbells, read
//! the doorbell record, start the WQEs it publishes (timed by the link
//! model), execute those whose time has come, and flush QPs in the error
//! state. Nothing here blocks: a pass does what it can and says when the
//! next thing is due.

use doorbell_kernels::mlx5::CqeSyndrome;

use super::config::{EngineConfig, EngineRng};
use super::exec::{execute, fail_requester, Fail, FailedWqe, Step};
use super::inbox::apply_event;
use super::mover::{PayloadMover, Phase};
use super::tables::{ErrorRecord, InboxEvent, Inflight, Port, Ports, QpState, Reason, INBOX, MAX_QPS, MAX_SHARDS, WAITS_OWN_CQ};
use super::wqe::{self, wqe_bbs};
use super::{cqe, mem};

// A QP mask is one u64.
const _: () = assert!(MAX_QPS <= 64);

/// What a pass did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollReport {
    /// WQEs started, executed, failed or flushed, and receive WQEs flushed.
    pub progressed: u32,
    /// The earliest time something is due (a modelled completion, a delayed
    /// doorbell, a timeout, a doorbell-record re-read), ns; `u64::MAX` when
    /// nothing is pending. A virtual clock can jump to it.
    pub next_event_ns: u64,
}

impl PollReport {
    /// Nothing done, nothing pending.
    pub const IDLE: PollReport = PollReport {
        progressed: 0,
        next_event_ns: u64::MAX,
    };

    fn due(&mut self, t: u64) {
        self.next_event_ns = self.next_event_ns.min(t);
    }
}

/// One pass over port `p` of the fabric `ports` at time `now_ns`; payload
/// bytes move through `mover` (the control — parsing, checks, CQEs — is
/// this function's, on the calling thread).
///
/// # Safety
/// Every ring, doorbell record and UAR word in the tables of every port is
/// valid memory of the stated size and alignment, and every registered
/// region is valid memory, for the whole pass.
pub unsafe fn poll_port<P: Ports + ?Sized, M: PayloadMover>(
    ports: &mut P,
    p: usize,
    now_ns: u64,
    cfg: &EngineConfig,
    rng: &mut EngineRng,
    mover: &mut M,
) -> PollReport {
    // SAFETY: the caller's contract.
    unsafe { poll_port_masked(ports, p, u64::MAX, now_ns, cfg, rng, mover) }
}

/// [`poll_port`] over the QP slots whose bit is set in `mask` (bit `q`:
/// slot `q`) only: the GPU engine passes the slots in use, so an idle pass
/// does not walk the whole table.
///
/// # Safety
/// As for [`poll_port`].
pub unsafe fn poll_port_masked<P: Ports + ?Sized, M: PayloadMover>(
    ports: &mut P,
    p: usize,
    mask: u64,
    now_ns: u64,
    cfg: &EngineConfig,
    rng: &mut EngineRng,
    mover: &mut M,
) -> PollReport {
    let mut report = PollReport::IDLE;
    let pass = Pass { now_ns, cfg };
    match ports.get(p) {
        Some(port) if port.valid != 0 => {}
        _ => return report,
    }
    if cfg.faults.reorder_across_qps == 0 {
        // The slots in use, lowest first, one step per slot (not per
        // table slot: the GPU engine's control is one thread, where a walk
        // over all 64 cost ~1 950 cycles per WQE executed).
        let mut left = mask;
        while left != 0 {
            let q = left.trailing_zeros() as usize;
            left &= left - 1;
            // SAFETY: the caller's contract.
            unsafe { poll_qp(ports, p, q, pass, rng, mover, &mut report) };
        }
        return report;
    }
    let start = rng.below(MAX_QPS as u64) as usize;
    for k in 0..MAX_QPS {
        let q = (start + k) % MAX_QPS;
        if mask & (1u64 << q) == 0 {
            continue;
        }
        // SAFETY: the caller's contract.
        unsafe { poll_qp(ports, p, q, pass, rng, mover, &mut report) };
    }
    report
}

/// What every QP of a pass reads: the clock reading and the
/// configuration. Two scalars, passed by value: a call passes them in
/// registers (a larger aggregate would be passed through memory).
#[derive(Clone, Copy)]
struct Pass<'a> {
    now_ns: u64,
    cfg: &'a EngineConfig,
}

/// One QP's share of a pass: inbox, doorbell, flush or fetch and execute.
///
/// # Safety
/// As for [`poll_port`].
unsafe fn poll_qp<P: Ports + ?Sized, M: PayloadMover>(
    ports: &mut P,
    p: usize,
    q: usize,
    pass: Pass<'_>,
    rng: &mut EngineRng,
    mover: &mut M,
    report: &mut PollReport,
) {
    let (now_ns, cfg) = (pass.now_ns, pass.cfg);
    let Some(qp) = ports.get(p).and_then(|x| x.qps.get(q)) else {
        return;
    };
    if !qp.in_use() {
        return;
    }
    let scope = mover.scope();
    let before = qp.state();
    // SAFETY (whole function): the caller's contract.
    // The inbox head's load is issued first and used after the doorbell
    // word's, so the two memory latencies overlap.
    let mail = unsafe { inbox_head(ports, p, q) };
    if matches!(before, QpState::Rts | QpState::Err) && unsafe { watch_doorbell(ports, p, q, now_ns, cfg, scope, report) } {
        mover.rung(q);
    }
    unsafe { drain_inbox(ports, p, q, mail, now_ns, scope, report) };
    mover.lap(Phase::Doorbell);
    // A responder error drained just now moved the QP to the error state.
    let Some(qp) = ports.get(p).and_then(|x| x.qps.get(q)) else {
        return;
    };
    let state = qp.state();
    if !matches!(state, QpState::Rts | QpState::Err) {
        return;
    }
    if state == QpState::Err {
        unsafe { flush(ports, p, q, now_ns, scope, report) };
        mover.lap(Phase::Complete);
        return;
    }
    let limit = unsafe { burst(ports, p, q, pass, mover, report) };
    unsafe { fetch(ports, p, q, now_ns, limit, report) };
    mover.lap(Phase::Fetch);
    if cfg.faults.reorder_across_qps != 0 {
        if let Some(qp) = ports.get_mut(p).and_then(|x| x.qps.get_mut(q)) {
            if qp.inflight_len > 0 && qp.held < 2 && rng.below(2) == 0 {
                qp.held += 1;
                report.due(now_ns.saturating_add(1));
                return;
            }
            qp.held = 0;
        }
    }
    // A WQE's block copy may run on while the next one's checks are made
    // (`PayloadMover::defer`); nothing outside this loop sees one in flight.
    // Only where there is something to execute (or a state to report): an
    // idle pass, the lone path's rival for each doorbell, pays nothing for
    // it (it ran the round trip up to 1.08x as long).
    if ports
        .get(p)
        .and_then(|x| x.qps.get(q))
        .is_some_and(|qp| qp.inflight_len != 0 || qp.state() != QpState::Rts)
    {
        mover.defer(true);
        unsafe { execute_due(ports, p, q, now_ns, cfg, mover, report) };
        mover.drain();
        mover.defer(false);
    }
    mover.lap(Phase::Complete);
}

/// The head of QP `q`'s inbox (events its peer wrote), read without
/// ordering; [`drain_inbox`] acquires before reading what it publishes.
///
/// # Safety
/// As for [`poll_port`].
#[inline(always)]
unsafe fn inbox_head<P: Ports + ?Sized>(ports: &mut P, p: usize, q: usize) -> u32 {
    let port = ports.raw(p);
    if port.is_null() || q >= MAX_QPS {
        return 0;
    }
    // SAFETY: a live port (the caller's contract); the head's address
    // only, as the peer writes it concurrently.
    unsafe { mem::peek_word(&raw const (*port).inbox[q].head) }
}

/// Applies the responder events the QP's peer wrote into its inbox up to
/// `head` ([`inbox_head`]; see [`super::tables`]' module docs): nothing
/// when it is the QP's tail; otherwise an acquire, the events in order,
/// and a release of the new tail. An event that needs room in a full
/// receive CQ stays, with those after it, for a later pass.
///
/// # Safety
/// As for [`poll_port`].
unsafe fn drain_inbox<P: Ports + ?Sized>(
    ports: &mut P,
    p: usize,
    q: usize,
    head: u32,
    now_ns: u64,
    scope: mem::Scope,
    report: &mut PollReport,
) {
    let port = ports.raw(p);
    if port.is_null() || q >= MAX_QPS {
        return;
    }
    // SAFETY (whole function): a live port (the caller's contract); the
    // inbox is reached through its address and `mem` only, as the peer
    // writes it concurrently.
    unsafe {
        let inbox = &raw const (*port).inbox[q];
        let mut tail = (*port).qps[q].inbox_tail;
        if head == tail {
            return;
        }
        // The events before the head are read after it.
        mem::acquire(scope);
        // A head more than a full inbox ahead is no head this QP's peer
        // wrote (a stale connection's): take the last INBOX events only.
        if head.wrapping_sub(tail) > INBOX as u32 {
            tail = head.wrapping_sub(INBOX as u32);
        }
        while tail != head {
            let slot = &raw const (*inbox).events[tail as usize % INBOX];
            let ev = InboxEvent::from_words(&mem::load_event(slot as *const [u32; 8]));
            if !apply_event(&mut *port, q, &ev, scope) {
                report.due(now_ns.saturating_add(1_000));
                break;
            }
            tail = tail.wrapping_add(1);
            report.progressed += 1;
        }
        // The peer reuses the slots up to here once it sees this.
        mem::publish_word(&raw mut (*port).qps[q].inbox_tail, tail, scope);
    }
}

/// The word that says a QP was rung, read without ordering: its UAR word,
/// or without a UAR the send counter of its doorbell record. The engine
/// compares it with [`super::tables::QpEntry::last_doorbell`]; a change
/// makes it read the doorbell record (see [`watch_doorbell`]).
///
/// # Safety
/// `qp.dbrec` is valid; `qp.uar`, when not null, too.
#[inline(always)]
pub(crate) unsafe fn doorbell_word(qp: &super::tables::QpEntry) -> u64 {
    // SAFETY: the caller's contract.
    unsafe {
        if qp.uar.is_null() {
            (mem::peek_dbrec(qp.dbrec.add(1)) & 0xffff) as u64
        } else {
            mem::peek_uar(qp.uar)
        }
    }
}

/// Notices a doorbell (a new UAR value, or without a UAR a new doorbell
/// record value), applies the drop and delay faults, and reads the
/// doorbell record when a doorbell is due or the re-read timeout expired.
/// A doorbell rung through the UAR is followed by one [`mem::acquire`]
/// before the record is read, so the record is at least as new as the
/// doorbell and the WQEs it publishes are read after it; without a UAR
/// (or on the re-read timeout) a record that moved is followed by one.
/// Returns whether it saw a new doorbell.
///
/// # Safety
/// As for [`poll_port`].
unsafe fn watch_doorbell<P: Ports + ?Sized>(
    ports: &mut P,
    p: usize,
    q: usize,
    now_ns: u64,
    cfg: &EngineConfig,
    scope: mem::Scope,
    report: &mut PollReport,
) -> bool {
    let Some(port) = ports.get_mut(p) else { return false };
    let Port { qps, stats, .. } = port;
    let Some(qp) = qps.get_mut(q) else { return false };
    let stats = &mut stats[qp.shard as usize % MAX_SHARDS];
    if qp.dbrec.is_null() {
        return false;
    }
    // SAFETY (whole function): the caller's contract.
    let seen = unsafe { doorbell_word(qp) };
    let rung = seen != qp.last_doorbell;
    if rung {
        qp.last_doorbell = seen;
        qp.doorbells += 1;
        stats.doorbells += 1;
        if !qp.uar.is_null() {
            stats.last_uar = seen;
        }
        stats.last_qpn = qp.qpn;
        let n = cfg.faults.drop_doorbell_every as u64;
        if n != 0 && qp.doorbells % n == 0 {
            stats.doorbells_dropped += 1;
        } else if qp.db_pending == 0 {
            qp.db_pending = 1;
            qp.db_due_ns = now_ns.saturating_add(cfg.faults.doorbell_delay_ns);
        }
    }
    let doorbell_due = qp.db_pending != 0 && now_ns >= qp.db_due_ns;
    let reread_due = now_ns.saturating_sub(qp.last_dbr_read_ns) >= cfg.dbr_reread_ns;
    if doorbell_due || reread_due {
        if !doorbell_due {
            stats.dbr_rereads += 1;
        }
        // A doorbell rung through the UAR: one acquire after the UAR value
        // that showed it, then the record, which is then at least as new
        // as the doorbell (the producer fences between the two) and covers
        // the WQEs it publishes. (A relaxed read first was older than the
        // doorbell often enough to cost a second fence; every fence
        // empties this thread's L1.)
        let acquired = doorbell_due && !qp.uar.is_null();
        if acquired {
            mem::acquire(scope);
        }
        let pi = unsafe { mem::peek_dbrec(qp.dbrec.add(1)) } & 0xffff;
        if pi != qp.sq_pi {
            // The WQEs the new record publishes are read after this: after
            // the UAR's acquire those the doorbell word covers; another
            // poster's beyond them (its record already stored, its doorbell
            // not yet) need an acquire after the record too.
            if !acquired || doorbell_covers(seen, qp.sq_ci, pi, qp.sq_wqebbs) != pi {
                mem::acquire(scope);
            }
            stats.last_sq_pi = pi;
            stats.last_qpn = qp.qpn;
        }
        qp.sq_pi = pi;
        qp.db_pending = 0;
        qp.last_dbr_read_ns = now_ns;
    }
    if qp.db_pending != 0 {
        report.due(qp.db_due_ns);
    }
    report.due(qp.last_dbr_read_ns.saturating_add(cfg.dbr_reread_ns.max(1)));
    doorbell_kernels::trace_hook! {
        if rung {
            if let Some(port) = ports.get(p) {
                super::trace::event(super::trace::rings(port), super::trace::What::NicDoorbell, u32::MAX, seen);
            }
        }
    }
    rung
}

/// Hands the WQEs QP `q` has published to the mover's burst
/// ([`PayloadMover::burst`]) when nothing may reorder them: the link model
/// off, no fault injected, nothing in flight, a ring that can be trusted.
/// What the burst leaves, [`fetch`] starts as before; returns how many
/// WQEs it may start in this pass (the rest wait for the next burst).
///
/// # Safety
/// As for [`poll_port`].
#[inline(always)]
unsafe fn burst<P: Ports + ?Sized, M: PayloadMover>(
    ports: &mut P,
    p: usize,
    q: usize,
    pass: Pass<'_>,
    mover: &mut M,
    report: &mut PollReport,
) -> u32 {
    let Some(port) = ports.get(p) else { return u32::MAX };
    if port.link.enabled() || !pass.cfg.faults.quiet() {
        return u32::MAX;
    }
    let Some(qp) = port.qps.get(q) else { return u32::MAX };
    let avail = published(qp.sq_pi, qp.sq_ci);
    if qp.inflight_len != 0 || avail == 0 || avail > qp.sq_wqebbs || qp.sq_wqebbs > wqe::MAX_SQ_WQEBBS {
        return u32::MAX;
    }
    let start = qp.sq_ci;
    // SAFETY: the caller's contract; `start` is the QP's `sq_ci`.
    let o = unsafe { mover.burst(ports, p, q, start, avail, pass.now_ns) };
    report.progressed += o.done;
    o.fetch
}

/// The producer index to take from a doorbell record `record` read after
/// the doorbell word `seen` (the first 8 bytes of the last rung WQE's ctrl
/// segment: its big-endian WQE index in bytes 1 – 2, its ds in the low 6
/// bits of byte 7) and one acquire, for a send queue of `ring` basic blocks
/// consumed up to `sq_ci`: at most the end of that WQE. Those WQEs were
/// published before the word was stored, so the acquire after reading it
/// covers them; WQEs the record publishes beyond them belong to a later
/// doorbell (their slots need an acquire after the record). A record
/// publishing more than the ring holds (or gone backwards) is returned as
/// read: the fetch reports the overrun.
pub(crate) fn doorbell_covers(seen: u64, sq_ci: u32, record: u32, ring: u32) -> u32 {
    let last = ((seen >> 8) as u16).swap_bytes();
    let ds = (seen >> 56) as u32 & 0x3f;
    let covered = last.wrapping_sub(sq_ci as u16) as u32 + ds.div_ceil(4).max(1);
    let published = published(record, sq_ci);
    if published > covered && published <= ring {
        sq_ci.wrapping_add(covered) & 0xffff
    } else {
        record
    }
}

/// Basic blocks published and not yet started.
pub(crate) fn published(sq_pi: u32, sq_ci: u32) -> u32 {
    (sq_pi as u16).wrapping_sub(sq_ci as u16) as u32
}

/// Starts the published WQEs: each gets its due time from the link model
/// (the port's transmitter is shared in start order; a fenced WQE starts no
/// earlier than the completion of the QP's earlier reads and atomics) and
/// joins the QP's in-flight ring.
///
/// # Safety
/// As for [`poll_port`].
unsafe fn fetch<P: Ports + ?Sized>(ports: &mut P, p: usize, q: usize, now_ns: u64, limit: u32, report: &mut PollReport) {
    // The transmitter is the port's, shared by its engine blocks: reserved
    // atomically through its address (taken from the raw port, as the
    // inbox head is), never through the borrow below.
    let raw = ports.raw(p);
    if raw.is_null() {
        return;
    }
    // SAFETY: a live port (the caller's contract); the field's address only.
    let tx_free = unsafe { &raw mut (*raw).tx_free_ps };
    let Some(port) = ports.get_mut(p) else { return };
    doorbell_kernels::trace_hook! {
        let tr = super::trace::rings(port);
    }
    let Port { qps, link, stats, .. } = &mut *port;
    let Some(qp) = qps.get_mut(q) else { return };
    let stats = &mut stats[qp.shard as usize % MAX_SHARDS];
    let now_ps = now_ns.saturating_mul(1000);
    let mut overrun = None;
    let mut started = 0u32;
    loop {
        if qp.inflight_len as usize >= super::tables::MAX_INFLIGHT || started >= limit {
            break;
        }
        let avail = published(qp.sq_pi, qp.sq_ci);
        if avail == 0 {
            break;
        }
        if avail > qp.sq_wqebbs || qp.sq_wqebbs > wqe::MAX_SQ_WQEBBS {
            // The producer overran the ring (or the ring is too large to
            // tell an overrun): nothing in it can be trusted.
            qp.state = QpState::Err as u32;
            stats.errors += 1;
            overrun = Some(ErrorRecord {
                time_ns: now_ns,
                qpn: qp.qpn,
                wqe_counter: qp.sq_ci as u16,
                syndrome: CqeSyndrome::LocalQpOp.as_u8(),
                reason: Reason::SqOverrun as u8,
                ..ErrorRecord::default()
            });
            break;
        }
        // SAFETY (loop body): the caller's contract.
        let ctrl = unsafe { wqe::read_ctrl(qp, qp.sq_ci) };
        // A bad ds still takes one basic block; execution reports it.
        let bbs = wqe_bbs(ctrl.ds, qp.sq_wqebbs).unwrap_or(1);
        if bbs > avail {
            break; // the rest of the WQE is not published yet
        }
        // Only the link model needs the WQE's length, fence bit and kind
        // here (execution parses it again, and reports a bad one): without
        // it the parse is skipped. Measured on an H200: fetch 2 470 → 1 735
        // cycles per WQE, the parse at execution 1 530 → 1 690 (its lines
        // no longer warm), the control ~2 % faster.
        let (bytes, fenced, rd_atomic) = if !link.enabled() {
            (0, false, false)
        } else {
            let mut more = wqe::more_segs();
            match unsafe { wqe::parse(qp, qp.sq_ci, &mut more) } {
                Ok(w) => (
                    w.len,
                    w.ctrl.fm_ce_se & doorbell_kernels::mlx5::WQE_CTRL_FENCE != 0,
                    wqe::is_read_or_atomic(w.ctrl.opcode),
                ),
                Err(_) => (0, false, false),
            }
        };
        let due_ps = if link.enabled() {
            let earliest = if fenced { now_ps.max(qp.rd_atomic_due_ps) } else { now_ps };
            // SAFETY: a field of this live port, 8-byte aligned.
            let end = unsafe { mem::reserve_wire(tx_free, earliest, link.wire_ps(bytes)) };
            end.saturating_add(link.latency_ns.saturating_mul(1000))
        } else {
            now_ps
        };
        if rd_atomic {
            qp.rd_atomic_due_ps = qp.rd_atomic_due_ps.max(due_ps);
        }
        qp.inflight_push(Inflight {
            wqe_idx: qp.sq_ci,
            // At most a WQE's 16 basic blocks (`wqe_bbs`).
            bbs: bbs as u16,
            admitted: 0,
            due_ps,
            deadline_ns: 0,
        });
        stats.fetched += 1;
        stats.last_qpn = qp.qpn;
        stats.last_wqe = qp.sq_ci;
        doorbell_kernels::trace_hook! {
            super::trace::event(tr, super::trace::What::NicFetch, u32::MAX, qp.sq_ci as u64);
        }
        qp.sq_ci = qp.sq_ci.wrapping_add(bbs);
        report.progressed += 1;
        started += 1;
    }
    if let Some(r) = overrun {
        port.log_error(r);
    }
}

/// Executes, in order, the in-flight WQEs whose due time has come. A WQE
/// waiting on the responder keeps the ones behind it waiting too (RC
/// order), until it proceeds or its deadline fails it.
///
/// # Safety
/// As for [`poll_port`].
unsafe fn execute_due<P: Ports + ?Sized, M: PayloadMover>(
    ports: &mut P,
    p: usize,
    q: usize,
    now_ns: u64,
    cfg: &EngineConfig,
    mover: &mut M,
    report: &mut PollReport,
) {
    let now_ps = now_ns.saturating_mul(1000);
    loop {
        // The previous WQE's end (in-flight ring, a failure) was completion.
        mover.lap(Phase::Complete);
        let Some(qp) = ports.get(p).and_then(|x| x.qps.get(q)) else {
            return;
        };
        if qp.state() != QpState::Rts {
            report.due(now_ns.saturating_add(1)); // flush on the next pass
            return;
        }
        let Some(head) = qp.inflight_front().copied() else {
            return;
        };
        if head.due_ps > now_ps {
            report.due(head.due_ps.div_ceil(1000));
            return;
        }
        // SAFETY: the caller's contract.
        let step = unsafe { execute(ports, p, q, &head, now_ns, cfg, mover) };
        match step {
            Step::Done | Step::Failed => {
                if let Some(qp) = ports.get_mut(p).and_then(|x| x.qps.get_mut(q)) {
                    qp.inflight_pop();
                }
                mover.executed(q);
                report.progressed += 1;
            }
            Step::Blocked => {
                report.due(now_ns.saturating_add(1_000));
                return;
            }
            Step::OwnCqFull => {
                // Its consumer may yet poll: a signaled WQE waits at most
                // the transport timeout (one that stopped would hold the QP
                // forever), or what is left of a wait on the responder it
                // had begun. Then the CQ has overrun; no CQE can say so:
                // the QP moves to the error state (its WQEs flush as the CQ
                // gets room) and the port's error log names the QP and WQE.
                // An unsignaled WQE writes no CQE unless it fails: it waits
                // for room as long as it takes, as before.
                let Some(port) = ports.get_mut(p) else { return };
                let Some(qp) = port.qps.get_mut(q) else { return };
                let qpn = qp.qpn;
                // SAFETY: the caller's contract; the head's ctrl segment.
                let signaled = unsafe { wqe::read_ctrl(qp, head.wqe_idx) }.fm_ce_se & doorbell_kernels::mlx5::WQE_CTRL_CQ_UPDATE != 0;
                if !signaled {
                    report.due(now_ns.saturating_add(1_000));
                    return;
                }
                let Some(h) = qp.inflight_front_mut() else { return };
                if h.deadline_ns == 0 {
                    h.admitted |= WAITS_OWN_CQ;
                    h.deadline_ns = now_ns.saturating_add(cfg.transport_timeout_ns).max(1);
                }
                let deadline = h.deadline_ns;
                if now_ns < deadline {
                    report.due(deadline.min(now_ns.saturating_add(1_000)));
                    return;
                }
                let wqe_counter = h.wqe_idx as u16;
                qp.state = QpState::Err as u32;
                port.stats_mut(q).errors += 1;
                port.log_error(ErrorRecord {
                    time_ns: now_ns,
                    qpn,
                    wqe_counter,
                    syndrome: CqeSyndrome::LocalQpOp.as_u8(),
                    reason: Reason::CqOverrun as u8,
                    ..ErrorRecord::default()
                });
                report.progressed += 1;
                return;
            }
            Step::Wait {
                reason,
                syndrome,
                timeout_ns,
                opcode,
            } => {
                let Some(qp) = ports.get_mut(p).and_then(|x| x.qps.get_mut(q)) else {
                    return;
                };
                let Some(h) = qp.inflight_front_mut() else { return };
                if h.admitted & WAITS_OWN_CQ != 0 {
                    // Its deadline was its own CQ's wait: the responder's
                    // is a deadline of its own. (A wait on the responder
                    // begun first keeps its deadline through a full CQ.)
                    h.admitted &= !WAITS_OWN_CQ;
                    h.deadline_ns = 0;
                }
                if h.deadline_ns == 0 {
                    h.deadline_ns = now_ns.saturating_add(timeout_ns).max(1);
                }
                let deadline = h.deadline_ns;
                if now_ns < deadline {
                    report.due(deadline.min(now_ns.saturating_add(1_000)));
                    return;
                }
                let f = Fail {
                    syndrome,
                    reason,
                    key: 0,
                    addr: 0,
                };
                // SAFETY: the caller's contract; execute() checked the room.
                unsafe { fail_requester(ports, p, q, FailedWqe { idx: head.wqe_idx, opcode }, &f, now_ns, mover) };
                if let Some(qp) = ports.get_mut(p).and_then(|x| x.qps.get_mut(q)) {
                    qp.inflight_pop();
                }
                report.progressed += 1;
            }
        }
    }
}

/// Flushes a QP in the error state: every started and every published WQE
/// completes with `WR_FLUSH_ERR` (signaled or not, as the IB spec asks),
/// then every posted receive WQE.
///
/// # Safety
/// As for [`poll_port`].
unsafe fn flush<P: Ports + ?Sized>(ports: &mut P, p: usize, q: usize, now_ns: u64, scope: mem::Scope, report: &mut PollReport) {
    let Some(port) = ports.get_mut(p) else { return };
    let Port { qps, cqs, stats, .. } = port;
    let Some(qp) = qps.get_mut(q) else { return };
    let stats = &mut stats[qp.shard as usize % MAX_SHARDS];
    let flushed = Reason::Flushed as u8;
    let syndrome = CqeSyndrome::WrFlush.as_u8();
    // SAFETY (whole function): the caller's contract.
    if let Some(cq) = cqs.get_mut(qp.send_cq as usize) {
        // An overrun producer: what it published cannot be WQEs (the
        // started ones are flushed below, nothing of the ring).
        if published(qp.sq_pi, qp.sq_ci) > qp.sq_wqebbs {
            qp.sq_ci = qp.sq_pi;
        }
        loop {
            if !unsafe { cqe::has_room_cached(cq) } {
                report.due(now_ns.saturating_add(1_000));
                break;
            }
            // One read of the ctrl segment per flushed WQE: its opcode
            // for the CQE and, for one not started yet, its length.
            let (idx, opcode) = if let Some(h) = qp.inflight_front().copied() {
                qp.inflight_pop();
                (h.wqe_idx, unsafe { wqe::read_ctrl(qp, h.wqe_idx) }.opcode)
            } else {
                let avail = published(qp.sq_pi, qp.sq_ci).min(qp.sq_wqebbs);
                if avail == 0 {
                    break;
                }
                let idx = qp.sq_ci;
                let ctrl = unsafe { wqe::read_ctrl(qp, idx) };
                let bbs = wqe_bbs(ctrl.ds, qp.sq_wqebbs).unwrap_or(1).min(avail);
                qp.sq_ci = qp.sq_ci.wrapping_add(bbs);
                (idx, ctrl.opcode)
            };
            let img = cqe::error(cq, false, syndrome, flushed, qp.qpn, opcode, idx as u16);
            if unsafe { cqe::push(cq, &img, true, scope) } {
                stats.cqes += 1;
                stats.flushes += 1;
            }
            report.progressed += 1;
        }
    }
    if let Some(cq) = cqs.get_mut(qp.recv_cq as usize) {
        // At most a ring of receive WQEs: an overrun producer's count past
        // that is dropped first (the newest ring's worth stays to flush, over
        // as many calls as the CQ's room takes).
        let posted = unsafe { super::rq::posted(qp) };
        if posted > qp.rq_wqes {
            qp.rq_ci = qp.rq_ci.wrapping_add(posted - qp.rq_wqes);
        }
        let mut pending = posted.min(qp.rq_wqes);
        while pending > 0 {
            if !unsafe { cqe::has_room_cached(cq) } {
                report.due(now_ns.saturating_add(1_000));
                break;
            }
            let img = cqe::error(cq, true, syndrome, flushed, qp.qpn, 0, qp.rq_ci as u16);
            if unsafe { cqe::push(cq, &img, true, scope) } {
                stats.cqes += 1;
                stats.flushes += 1;
            }
            qp.rq_ci = qp.rq_ci.wrapping_add(1);
            pending -= 1;
            report.progressed += 1;
        }
    }
}
