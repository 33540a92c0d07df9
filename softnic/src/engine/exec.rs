//! Executing one WQE: every check first (keys, bounds, access, receive
//! WQE, CQ room), then the data movement, then the CQEs. A WQE that fails
//! a check touches no memory but its error CQE. The WQE and the receive
//! WQE it consumes are each read out of their rings once ([`wqe::parse`],
//! [`rq::read_wqe`]); the checks and the copies use those copies only.

use doorbell_kernels::mlx5::{
    CqeSyndrome, CQE_REQ, CQE_RESP_SEND, CQE_RESP_WR_IMM, OPCODE_ATOMIC_CS, OPCODE_ATOMIC_FA, OPCODE_NOP, OPCODE_RDMA_READ,
    OPCODE_RDMA_WRITE, OPCODE_RDMA_WRITE_IMM, OPCODE_SEND, WQE_CTRL_CQ_UPDATE,
};

use super::config::EngineConfig;
use super::inbox::{complete_responder, inbox_room, post_event, room};
use super::mem::Scope;
use super::mover::{PayloadMover, Phase};
use super::rq::RecvWqe;
use super::tables::{
    access, ErrorRecord, InboxEvent, Inflight, MrEntry, Port, Ports, QpEntry, QpState, Reason, ADMITTED, EVENT_ERROR, EVENT_ERROR_RECEIVE,
    MAX_QPS, MAX_SHARDS, QP_CONNECTED,
};
use super::wqe::{self, Wqe};
use super::{cqe, mem, rq};

/// What became of the WQE at the head of a QP's in-flight ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Executed; its CQE (if signaled) is written.
    Done,
    /// The responder cannot take it yet; retry, and fail with `syndrome`
    /// once `timeout_ns` has passed since the first attempt.
    Wait {
        /// Why it waits.
        reason: Reason,
        /// Syndrome if it never proceeds.
        syndrome: CqeSyndrome,
        /// How long it may wait, ns.
        timeout_ns: u64,
        /// Its opcode (for the error CQE if it never proceeds).
        opcode: u8,
    },
    /// Its QP's own send CQ is full: retry later, at most the transport
    /// timeout ([`EngineConfig::transport_timeout_ns`]), after which the
    /// CQ has overrun.
    OwnCqFull,
    /// The tables it needs are not there; retry later (no deadline).
    Blocked,
    /// Failed: its error CQE is written and the QP is in the error state.
    Failed,
}

/// A failed check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fail {
    /// Syndrome for the requester's error CQE.
    pub syndrome: CqeSyndrome,
    /// Why.
    pub reason: Reason,
    /// The key involved.
    pub key: u32,
    /// The address involved.
    pub addr: u64,
}

impl Fail {
    const fn new(syndrome: CqeSyndrome, reason: Reason, key: u32, addr: u64) -> Fail {
        Fail {
            syndrome,
            reason,
            key,
            addr,
        }
    }
}

/// Responder-side consequence of a failed WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Responder {
    /// Not the responder's business (local errors).
    Untouched,
    /// The responder QP moves to the error state (IB responder class C
    /// errors: invalid request, remote access violation).
    Error,
    /// As `Error`, and the receive WQE being consumed completes with this
    /// syndrome (`MLX5_CQE_RESP_ERR`).
    ErrorWithReceive(CqeSyndrome, Reason),
}

/// The peer of QP `q` on port `p`, if it answers: in use, connected back to
/// this QP, in RTR or RTS.
pub(crate) fn resolve_peer<P: Ports + ?Sized>(ports: &P, p: usize, q: usize) -> Result<(usize, usize), Reason> {
    let qp = ports.get(p).and_then(|x| x.qps.get(q)).ok_or(Reason::PeerNotReady)?;
    if qp.flags & QP_CONNECTED == 0 {
        return Err(Reason::PeerNotReady);
    }
    let (pp, pq) = (qp.peer_port as usize, qp.peer_qp as usize);
    if ports.get(pp).is_some_and(|port| answers(port, pq, (p, q))) {
        Ok((pp, pq))
    } else {
        Err(Reason::PeerNotReady)
    }
}

/// Whether QP `pq` of `port` answers the requester `(p, q)`: in use,
/// connected back to it, in RTR or RTS.
#[inline(always)]
pub(crate) fn answers(port: &Port, pq: usize, (p, q): (usize, usize)) -> bool {
    port.qps.get(pq).is_some_and(|peer| answers_as(port.valid, peer, (p, q)))
}

/// [`answers`] on a copy: `valid`, the responder port's word, and `peer`,
/// its QP's entry (the fields read: flags, state, peer port and QP).
#[inline(always)]
pub(crate) fn answers_as(valid: u32, peer: &QpEntry, (p, q): (usize, usize)) -> bool {
    valid != 0
        && peer.in_use()
        && peer.flags & QP_CONNECTED != 0
        && peer.peer_port as usize == p
        && peer.peer_qp as usize == q
        && matches!(peer.state(), QpState::Rtr | QpState::Rts)
}

/// Checks every data segment of `w` (the engine's copy) against port
/// `p`'s regions with the QP's protection domain and `need` (0 for a
/// gather list: local read is always allowed; [`access::LOCAL_WRITE`] for
/// a scatter list).
fn check_local(port: &Port, q: usize, w: &Wqe, need: u32) -> Result<(), Fail> {
    let Some(qp) = port.qps.get(q) else {
        return Err(Fail::new(CqeSyndrome::LocalQpOp, Reason::None, 0, 0));
    };
    for d in w.segments() {
        port.check_mr(d.lkey, qp.pd, d.addr, d.byte_count as u64, need)
            .map_err(|r| Fail::new(CqeSyndrome::LocalProt, r, d.lkey, d.addr))?;
    }
    Ok(())
}

/// Checks the remote range of `w` (`len` bytes) against the peer port's
/// regions, the peer QP's protection domain and access rights.
fn check_remote<P: Ports + ?Sized>(ports: &P, pp: usize, pq: usize, w: &Wqe, len: u64, need: u32) -> Result<*mut u8, Fail> {
    check_remote_at(ports, pp, pq, w.raddr.raddr, w.raddr.rkey, len, need)
}

/// Checks `len` bytes at `addr` under `key` against the regions of port
/// `pp`, the protection domain of its QP `pq` and `need`; returns where
/// this engine reaches them.
#[inline(always)]
pub(crate) fn check_remote_at<P: Ports + ?Sized>(
    ports: &P,
    pp: usize,
    pq: usize,
    addr: u64,
    key: u32,
    len: u64,
    need: u32,
) -> Result<*mut u8, Fail> {
    let denied = |r| Fail::new(CqeSyndrome::RemoteAccess, r, key, addr);
    let port = ports.get(pp).ok_or(denied(Reason::BadKey))?;
    let peer = port.qps.get(pq).ok_or(denied(Reason::BadKey))?;
    admit_remote(port.mr_of(key), peer, |a, n| ports.reach(pp, a, n), addr, key, len, need)
}

/// [`check_remote_at`]'s checks on what it looked up: `mr`, the entry of
/// the slot `key` names in the responder port's table (`None`: no such
/// slot), `peer`, the responder QP's entry (the fields read: protection
/// domain and access), and `reach`, how this engine reaches the
/// responder's memory ([`Ports::reach`]).
#[inline(always)]
pub(crate) fn admit_remote(
    mr: Option<&MrEntry>,
    peer: &QpEntry,
    reach: impl FnOnce(u64, u64) -> Option<*mut u8>,
    addr: u64,
    key: u32,
    len: u64,
    need: u32,
) -> Result<*mut u8, Fail> {
    let denied = |r| Fail::new(CqeSyndrome::RemoteAccess, r, key, addr);
    if len == 0 {
        // Verbs do not validate keys of zero-length transfers.
        return Ok(addr as usize as *mut u8);
    }
    let ptr = match mr {
        Some(mr) => mr.admits(key, peer.pd, addr, len, need).map_err(denied)?,
        None => return Err(denied(Reason::BadKey)),
    };
    if peer.access & need != need {
        return Err(denied(Reason::AccessDenied));
    }
    // The responder's address as this engine reaches it (a port of another
    // process: through the mapping of its heap).
    reach(ptr as u64, len).ok_or(denied(Reason::Unmapped))
}

/// Copies the peer's receive WQE `idx` out of its ring and checks each
/// entry of the copy against the peer port's regions (local write).
/// Returns the copy and its total capacity.
///
/// # Safety
/// The peer's RQ ring is valid.
#[inline(never)]
unsafe fn check_receive(port: &Port, pq: usize, idx: u32, recv: &mut RecvWqe) -> Result<u64, (CqeSyndrome, Reason, u32, u64)> {
    let Some(peer) = port.qps.get(pq) else {
        return Err((CqeSyndrome::LocalQpOp, Reason::None, 0, 0));
    };
    // SAFETY: the caller's contract.
    unsafe { rq::read_wqe(peer, idx, recv) }.map_err(|r| (CqeSyndrome::LocalQpOp, r, 0, 0))?;
    let mut cap = 0u64;
    for d in recv.entries() {
        port.check_mr(d.lkey, peer.pd, d.addr, d.byte_count as u64, access::LOCAL_WRITE)
            .map_err(|r| (CqeSyndrome::LocalProt, r, d.lkey, d.addr))?;
        cap += d.byte_count as u64;
    }
    Ok(cap)
}

/// Copies `w`'s gather list (the engine's copy) to the contiguous `dst`.
///
/// # Safety
/// Checked by [`check_local`] and [`check_remote`].
#[inline(never)]
unsafe fn gather_to<M: PayloadMover>(w: &Wqe, dst: *mut u8, mover: &mut M) {
    let mut off = 0usize;
    for d in w.segments() {
        // SAFETY: the caller's contract; the gather list is the
        // requester's, frozen until its WQE completes.
        unsafe { mover.copy_frozen(dst.add(off), d.addr as usize as *const u8, d.byte_count as usize) };
        off += d.byte_count as usize;
    }
}

/// Copies the contiguous `src` into `w`'s scatter list (the engine's copy).
///
/// # Safety
/// Checked by [`check_local`] and [`check_remote`].
#[inline(never)]
unsafe fn scatter_from<M: PayloadMover>(w: &Wqe, src: *const u8, mover: &mut M) {
    let mut off = 0usize;
    for d in w.segments() {
        // SAFETY: the caller's contract.
        unsafe { mover.copy(d.addr as usize as *mut u8, src.add(off), d.byte_count as usize) };
        off += d.byte_count as usize;
    }
}

/// Copies `w`'s gather list into the scatter list of `recv` (both the
/// engine's copies, checked): a send.
///
/// # Safety
/// Checked by [`check_local`] and [`check_receive`]; the message fits.
#[inline(never)]
unsafe fn gather_to_receive<M: PayloadMover>(w: &Wqe, recv: &RecvWqe, mover: &mut M) {
    let dsts = recv.entries();
    let mut k = 0usize;
    let mut dst_off = 0u64;
    for s in w.segments() {
        let mut src_off = 0u64;
        while src_off < s.byte_count as u64 {
            let Some(d) = dsts.get(k) else { return };
            let room = (d.byte_count as u64).saturating_sub(dst_off);
            if room == 0 {
                k += 1;
                dst_off = 0;
                continue;
            }
            let chunk = room.min(s.byte_count as u64 - src_off);
            // SAFETY: the caller's contract; the gather list is the
            // sender's, frozen until its WQE completes.
            unsafe {
                mover.copy_frozen(
                    (d.addr + dst_off) as usize as *mut u8,
                    (s.addr + src_off) as usize as *const u8,
                    chunk as usize,
                )
            };
            src_off += chunk;
            dst_off += chunk;
        }
    }
}

/// Appends `f` to `port`'s error log: the WQE (or receive WQE) `counter`
/// of QP `qpn`, reported with `syndrome`.
fn record(port: &mut Port, now_ns: u64, qpn: u32, counter: u16, opcode: u8, syndrome: CqeSyndrome, f: &Fail) {
    port.log_error(ErrorRecord {
        time_ns: now_ns,
        addr: f.addr,
        key: f.key,
        qpn,
        wqe_counter: counter,
        opcode,
        syndrome: syndrome.as_u8(),
        reason: f.reason as u8,
        responder: 0,
        reserved: [0; 2],
    });
}

/// The requester's WQE a failure is reported for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailedWqe {
    /// Its SQ counter (the CQE's `wqe_counter`).
    pub idx: u32,
    /// Its opcode (the ctrl segment's).
    pub opcode: u8,
}

/// Fails the requester's WQE `wqe` of QP `q` of port `p`: error CQE
/// (signaled or not; room was checked), QP to the error state, error log;
/// after the mover's copy in flight, if any, has landed.
///
/// # Safety
/// The QP's send CQ ring is valid.
pub unsafe fn fail_requester<P: Ports + ?Sized, M: PayloadMover>(
    ports: &mut P,
    p: usize,
    q: usize,
    wqe: FailedWqe,
    f: &Fail,
    now_ns: u64,
    mover: &mut M,
) {
    mover.drain();
    let scope = mover.scope();
    let FailedWqe { idx, opcode } = wqe;
    let Some(port) = ports.get_mut(p) else { return };
    let Port { qps, cqs, stats, .. } = &mut *port;
    let Some(qp) = qps.get_mut(q) else { return };
    let stats = &mut stats[qp.shard as usize % MAX_SHARDS];
    qp.state = QpState::Err as u32;
    let qpn = qp.qpn;
    if let Some(cq) = cqs.get_mut(qp.send_cq as usize) {
        let img = cqe::error(cq, false, f.syndrome.as_u8(), f.reason as u8, qpn, opcode, idx as u16);
        // SAFETY: the caller's contract.
        if unsafe { cqe::push(cq, &img, true, scope) } {
            stats.cqes += 1;
        }
    }
    stats.errors += 1;
    record(port, now_ns, qpn, idx as u16, opcode, f.syndrome, f);
}

/// The responder side of a failed WQE of QP `q` of port `p`, as an event
/// for the responder's owner ([`post_event`]): its QP moves to the error
/// state, and with a receive syndrome the receive WQE being consumed (the
/// requester's next, which it then counts as consumed) completes with a
/// `RESP_ERR` CQE. `None`: the responder is not involved.
fn fail_event<P: Ports + ?Sized>(
    ports: &mut P,
    p: usize,
    q: usize,
    what: Responder,
    f: &Fail,
    opcode: u8,
    now_ns: u64,
) -> Option<InboxEvent> {
    let qp = ports.get_mut(p).and_then(|x| x.qps.get_mut(q))?;
    let rq_idx = qp.peer_rq_ci;
    let (kind, syndrome, reason) = match what {
        Responder::Untouched => return None,
        Responder::Error => (EVENT_ERROR, f.syndrome, f.reason),
        Responder::ErrorWithReceive(s, r) => {
            qp.peer_rq_ci = rq_idx.wrapping_add(1);
            (EVENT_ERROR_RECEIVE, s, r)
        }
    };
    Some(InboxEvent {
        kind,
        opcode,
        syndrome: syndrome.as_u8(),
        reason: reason as u8,
        rq_idx: rq_idx as u16,
        flags: 0,
        byte_cnt: 0,
        imm_or_key: f.key,
        addr: f.addr,
        time_ns: now_ns,
    })
}

/// A successful requester completion: counters, and the CQE if the WQE
/// asked for one.
///
/// # Safety
/// The QP's send CQ ring is valid.
unsafe fn complete_requester<P: Ports + ?Sized, M: PayloadMover>(
    ports: &mut P,
    p: usize,
    q: usize,
    w: &Wqe,
    byte_cnt: u32,
    now_ns: u64,
    mover: &mut M,
) {
    let scope = mover.scope();
    let Some(port) = ports.get_mut(p) else { return };
    doorbell_kernels::trace_hook! {
        let tr = super::trace::rings(port);
    }
    let Port { qps, cqs, stats, .. } = port;
    let Some(qp) = qps.get(q) else { return };
    let stats = &mut stats[qp.shard as usize % MAX_SHARDS];
    // Recorded before its CQE: a kernel that saw the CQE finds the event.
    doorbell_kernels::trace_hook! {
        super::trace::event(tr, super::trace::What::NicExecute, qp.peer_port, w.len);
    }
    stats.wqes += 1;
    stats.bytes += w.len;
    if w.ctrl.fm_ce_se & WQE_CTRL_CQ_UPDATE != 0 {
        if let Some(cq) = cqs.get_mut(qp.send_cq as usize) {
            let done = cqe::Success {
                opcode: CQE_REQ,
                qpn: qp.qpn,
                wqe_counter: w.idx as u16,
                byte_cnt,
                imm: 0,
                sop: w.ctrl.opcode,
                solicited: false,
                time_ns: now_ns,
            };
            let img = cqe::success(cq, &done);
            // SAFETY: the caller's contract (room was checked). The CQE
            // waits for a copy still in flight, or that copy is drained.
            let written = unsafe { mover.hold_cqe(cq, &img) } || {
                mover.drain();
                unsafe { cqe::push(cq, &img, false, scope) }
            };
            if written {
                stats.cqes += 1;
                doorbell_kernels::trace_hook! {
                    super::trace::event(tr, super::trace::What::NicCqe, u32::MAX, cq.pi as u64);
                }
            }
        }
    }
}

/// [`room`] for a CQ of the executing port itself, with its cached
/// consumer index ([`cqe::has_room_cached`]).
///
/// # Safety
/// As for [`room`].
unsafe fn own_room<P: Ports + ?Sized>(ports: &mut P, p: usize, cq: u32) -> bool {
    match ports.get_mut(p).and_then(|x| x.cqs.get_mut(cq as usize)) {
        // SAFETY: the caller's contract.
        Some(c) => unsafe { cqe::has_room_cached(c) },
        None => false,
    }
}

/// Executes the WQE `head` of QP `q` on port `p` (its due time has come);
/// its payload moves through `mover`, after every check and before its CQE.
///
/// # Safety
/// Every ring and doorbell record in the tables is valid; every registered
/// region is valid memory.
pub unsafe fn execute<P: Ports + ?Sized, M: PayloadMover>(
    ports: &mut P,
    p: usize,
    q: usize,
    head: &Inflight,
    now_ns: u64,
    cfg: &EngineConfig,
    mover: &mut M,
) -> Step {
    let mut more = wqe::more_segs();
    // SAFETY (whole function): the caller's contract.
    let x = match unsafe { admit(ports, (p, q), head, now_ns, cfg, mover, &mut more) } {
        Ok(x) => x,
        Err(step) => return step,
    };
    if matches!(x.opcode, OPCODE_RDMA_WRITE_IMM | OPCODE_SEND) && ports.foreign(x.pp) {
        // The responder's receive queue and CQ are rings of another
        // process, which this engine cannot reach.
        // The responder did nothing wrong: its QP stays as it is.
        let f = Fail::new(CqeSyndrome::RemoteInvalReq, Reason::Unmapped, 0, 0);
        return unsafe { x.fail_remote(ports, mover, f, Responder::Untouched) };
    }
    match x.opcode {
        OPCODE_RDMA_WRITE | OPCODE_RDMA_WRITE_IMM => unsafe { x.write(ports, cfg, mover) },
        OPCODE_RDMA_READ => unsafe { x.read(ports, mover) },
        OPCODE_ATOMIC_CS | OPCODE_ATOMIC_FA => unsafe { x.atomic(ports, cfg, mover) },
        OPCODE_SEND => unsafe { x.send(ports, cfg, mover) },
        _ => {
            // parse() accepts only the opcodes above.
            let f = Fail::new(CqeSyndrome::LocalQpOp, Reason::BadOpcode, 0, 0);
            let failed = FailedWqe {
                idx: x.w.idx,
                opcode: x.opcode,
            };
            unsafe { fail_requester(ports, p, q, failed, &f, now_ns, mover) };
            Step::Failed
        }
    }
}

/// A WQE that passed the requester's side of [`execute`] (CQ room, the one
/// read out of the ring, admission, local checks) with the responder QP
/// that answers it: what its opcode's step needs.
struct Admitted<'a> {
    p: usize,
    q: usize,
    pp: usize,
    pq: usize,
    w: Wqe<'a>,
    opcode: u8,
    now_ns: u64,
    scope: Scope,
    /// How long it may wait for a responder that does not answer, ns.
    timeout_ns: u64,
}

/// The requester's side of [`execute`]: `Err` is the step the WQE ends
/// with here (blocked, waiting, failed, or a NOP done).
///
/// # Safety
/// As for [`execute`].
unsafe fn admit<'a, P: Ports + ?Sized, M: PayloadMover>(
    ports: &mut P,
    (p, q): (usize, usize),
    head: &Inflight,
    now_ns: u64,
    cfg: &EngineConfig,
    mover: &mut M,
    more: &'a mut wqe::MoreSegs,
) -> Result<Admitted<'a>, Step> {
    if q >= MAX_QPS {
        return Err(Step::Blocked);
    }
    let scope = mover.scope();
    let Some(send_cq) = ports.get(p).and_then(|x| x.qps.get(q)).map(|qp| qp.send_cq) else {
        return Err(Step::Blocked);
    };
    // SAFETY (whole function): the caller's contract; every pointer below
    // was checked against the tables first.
    if !unsafe { own_room(ports, p, send_cq) } {
        return Err(Step::OwnCqFull);
    }
    mover.lap(Phase::Room);
    let Some(qp) = ports.get(p).and_then(|x| x.qps.get(q)) else {
        return Err(Step::Blocked);
    };
    // The WQE's one read out of the ring: everything below uses `w`.
    let w = match unsafe { wqe::parse(qp, head.wqe_idx, more) } {
        Ok(w) if w.bbs == head.bbs as u32 => w,
        other => {
            let m = match other {
                Err(m) => m,
                // The producer rewrote the ctrl segment since the fetch
                // stepped over it: the ring's basic blocks no longer line up.
                Ok(w) => wqe::Malformed {
                    syndrome: CqeSyndrome::LocalQpOp,
                    reason: Reason::BadDs,
                    opcode: w.ctrl.opcode,
                },
            };
            let f = Fail::new(m.syndrome, m.reason, 0, 0);
            unsafe {
                fail_requester(
                    ports,
                    p,
                    q,
                    FailedWqe {
                        idx: head.wqe_idx,
                        opcode: m.opcode,
                    },
                    &f,
                    now_ns,
                    mover,
                )
            };
            return Err(Step::Failed);
        }
    };
    let opcode = w.ctrl.opcode;
    mover.lap(Phase::Parse);
    // Counted (and the fault drawn) once per WQE: not again on a retry
    // after it waited for the responder or was blocked past this point.
    if head.admitted & ADMITTED == 0 {
        if let Some(port) = ports.get_mut(p) {
            let stats = port.stats_mut(q);
            stats.executed += 1;
            let n = cfg.faults.force_error_every as u64;
            if n != 0 && stats.executed % n == 0 {
                let f = Fail::new(cfg.faults.forced(), Reason::Injected, 0, 0);
                unsafe { fail_requester(ports, p, q, FailedWqe { idx: w.idx, opcode }, &f, now_ns, mover) };
                return Err(Step::Failed);
            }
            if let Some(h) = port.qps.get_mut(q).and_then(|qp| qp.inflight_front_mut()) {
                h.admitted |= ADMITTED;
            }
        }
    }
    mover.lap(Phase::Admit);
    if opcode == OPCODE_NOP {
        unsafe { complete_requester(ports, p, q, &w, 0, now_ns, mover) };
        mover.lap(Phase::Requester);
        return Err(Step::Done);
    }

    // Local checks.
    let local_need = if matches!(opcode, OPCODE_RDMA_READ | OPCODE_ATOMIC_CS | OPCODE_ATOMIC_FA) {
        access::LOCAL_WRITE
    } else {
        0
    };
    let local = match ports.get(p) {
        Some(port) => check_local(port, q, &w, local_need),
        None => return Err(Step::Blocked),
    };
    if let Err(f) = local {
        unsafe { fail_requester(ports, p, q, FailedWqe { idx: w.idx, opcode }, &f, now_ns, mover) };
        return Err(Step::Failed);
    }
    mover.lap(Phase::Local);

    // The responder.
    let (pp, pq) = match resolve_peer(ports, p, q) {
        Ok(x) => x,
        Err(reason) => {
            return Err(Step::Wait {
                reason,
                syndrome: CqeSyndrome::TransportRetryExc,
                timeout_ns: cfg.transport_timeout_ns,
                opcode,
            })
        }
    };
    if cfg.faults.stalled(pp, now_ns) {
        return Err(Step::Wait {
            reason: Reason::PeerStalled,
            syndrome: CqeSyndrome::TransportRetryExc,
            timeout_ns: cfg.transport_timeout_ns,
            opcode,
        });
    }
    mover.lap(Phase::Peer);
    Ok(Admitted {
        p,
        q,
        pp,
        pq,
        w,
        opcode,
        now_ns,
        scope,
        timeout_ns: cfg.transport_timeout_ns,
    })
}

// Each opcode's step of `execute`: the responder's checks, the payload,
// the CQEs. Safety (every method): as for `execute`.
impl Admitted<'_> {
    /// The requester's completion of a WQE that succeeded: its CQE, if it
    /// asked for one, once its payload has landed (held by the mover while
    /// the copy runs on).
    #[inline(always)]
    unsafe fn finish<P: Ports + ?Sized, M: PayloadMover>(&self, ports: &mut P, mover: &mut M, byte_cnt: u32) -> Step {
        unsafe { complete_requester(ports, self.p, self.q, &self.w, byte_cnt, self.now_ns, mover) };
        mover.lap(Phase::Requester);
        Step::Done
    }

    /// A responder-side failure: the requester's error CQE, and the
    /// responder hears of it through its inbox (waiting for room there:
    /// nothing was touched yet, so the retry fails the same way; at most the
    /// transport timeout, after which the requester fails as it would have,
    /// unheard by a responder whose engine stopped draining its inbox).
    #[inline(never)]
    unsafe fn fail_remote<P: Ports + ?Sized, M: PayloadMover>(&self, ports: &mut P, mover: &mut M, f: Fail, what: Responder) -> Step {
        let (p, q, pp, pq) = (self.p, self.q, self.pp, self.pq);
        if what != Responder::Untouched && !unsafe { inbox_room(ports, p, q, pp, pq) } {
            return Step::Wait {
                reason: f.reason,
                syndrome: f.syndrome,
                timeout_ns: self.timeout_ns,
                opcode: self.opcode,
            };
        }
        let failed = FailedWqe {
            idx: self.w.idx,
            opcode: self.opcode,
        };
        unsafe {
            fail_requester(ports, p, q, failed, &f, self.now_ns, mover);
            if let Some(ev) = fail_event(ports, p, q, what, &f, self.opcode, self.now_ns) {
                post_event(ports, p, q, pp, pq, &ev, self.scope);
            }
        }
        Step::Failed
    }

    /// The responder's next receive WQE for this WQE, which consumes one
    /// (SEND, WRITE with immediate): one posted since the last this QP
    /// consumed, room in the responder's receive CQ and in its inbox. `Ok`:
    /// that receive WQE's RQ index; `Err`: the step to return (wait for a
    /// receive WQE until the RNR timeout, for room until the transport
    /// timeout; an RQ its producer overran fails it, and the responder QP
    /// moves to the error state).
    #[inline(always)]
    unsafe fn receive<P: Ports + ?Sized, M: PayloadMover>(&self, ports: &mut P, cfg: &EngineConfig, mover: &mut M) -> Result<u32, Step> {
        let (p, q, pp, pq, opcode) = (self.p, self.q, self.pp, self.pq, self.opcode);
        let Some(consumed) = ports.get(p).and_then(|x| x.qps.get(q)).map(|x| x.peer_rq_ci) else {
            return Err(Step::Blocked);
        };
        let Some(peer) = ports.get(pp).and_then(|x| x.qps.get(pq)) else {
            return Err(Step::Blocked);
        };
        // SAFETY (whole function): the caller's contract.
        let posted = unsafe { rq::posted_since(peer, consumed) };
        if posted > peer.rq_wqes {
            // Its producer overran the ring: no receive WQE in it can be
            // trusted (the slot for this one may hold one already consumed).
            let f = Fail::new(CqeSyndrome::RemoteOp, Reason::RqOverrun, 0, 0);
            return Err(unsafe { self.fail_remote(ports, mover, f, Responder::Error) });
        }
        if posted == 0 {
            return Err(Step::Wait {
                reason: Reason::NoReceiveWqe,
                syndrome: CqeSyndrome::RnrRetryExc,
                timeout_ns: cfg.rnr_timeout_ns,
                opcode,
            });
        }
        // No room for its receive completion (or for the event that asks
        // the responder to write it): wait for the responder's consumer, at
        // most the transport timeout (a CQ nobody polls, or an engine that
        // stopped, would hold the QP forever).
        if !unsafe { room(ports, pp, peer.recv_cq) } || !unsafe { inbox_room(ports, p, q, pp, pq) } {
            return Err(Step::Wait {
                reason: Reason::ResponderFull,
                syndrome: CqeSyndrome::TransportRetryExc,
                timeout_ns: self.timeout_ns,
                opcode,
            });
        }
        Ok(consumed)
    }

    /// RDMA WRITE, and WRITE with immediate (which consumes a receive WQE).
    unsafe fn write<P: Ports + ?Sized, M: PayloadMover>(&self, ports: &mut P, cfg: &EngineConfig, mover: &mut M) -> Step {
        let (p, q, pp, pq, w) = (self.p, self.q, self.pp, self.pq, &self.w);
        let dst = match check_remote(ports, pp, pq, w, w.len, access::REMOTE_WRITE) {
            Ok(d) => d,
            Err(f) => return unsafe { self.fail_remote(ports, mover, f, Responder::Error) },
        };
        mover.lap(Phase::Remote);
        let imm = self.opcode == OPCODE_RDMA_WRITE_IMM;
        if imm {
            if let Err(step) = unsafe { self.receive(ports, cfg, mover) } {
                return step;
            }
            mover.lap(Phase::Receive);
        }
        unsafe { gather_to(w, dst, mover) };
        if imm {
            mover.drain();
            unsafe { complete_responder(ports, (p, q), (pp, pq), w, CQE_RESP_WR_IMM, self.now_ns, self.scope) };
            mover.lap(Phase::Responder);
        }
        unsafe { self.finish(ports, mover, w.len as u32) }
    }

    /// RDMA READ.
    unsafe fn read<P: Ports + ?Sized, M: PayloadMover>(&self, ports: &mut P, mover: &mut M) -> Step {
        let w = &self.w;
        let src = match check_remote(ports, self.pp, self.pq, w, w.len, access::REMOTE_READ) {
            Ok(s) => s,
            Err(f) => return unsafe { self.fail_remote(ports, mover, f, Responder::Error) },
        };
        mover.lap(Phase::Remote);
        unsafe { scatter_from(w, src, mover) };
        unsafe { self.finish(ports, mover, w.len as u32) }
    }

    /// Compare-and-swap and fetch-and-add on 8 aligned bytes; the old value
    /// goes to the WQE's one data segment.
    unsafe fn atomic<P: Ports + ?Sized, M: PayloadMover>(&self, ports: &mut P, cfg: &EngineConfig, mover: &mut M) -> Step {
        let w = &self.w;
        if !w.raddr.raddr.is_multiple_of(8) {
            let f = Fail::new(CqeSyndrome::RemoteInvalReq, Reason::Misaligned, w.raddr.rkey, w.raddr.raddr);
            return unsafe { self.fail_remote(ports, mover, f, Responder::Error) };
        }
        let target = match check_remote(ports, self.pp, self.pq, w, 8, access::REMOTE_ATOMIC) {
            Ok(t) => t as *mut u64,
            Err(f) => return unsafe { self.fail_remote(ports, mover, f, Responder::Error) },
        };
        mover.lap(Phase::Remote);
        // The result address as checked: the copy's one data segment.
        let result = w.first_segment();
        mover.lap(Phase::Check);
        mover.drain();
        let old = unsafe {
            if self.opcode == OPCODE_ATOMIC_FA {
                mem::atomic_fetch_add_u64(target, w.atomic.swap_add, self.scope)
            } else {
                mem::atomic_cas_u64(target, w.atomic.compare, w.atomic.swap_add, self.scope)
            }
        };
        let bytes = if cfg.atomic_reply_be != 0 {
            old.to_be_bytes()
        } else {
            old.to_ne_bytes()
        };
        // The control thread writes the 8-byte result itself: the
        // source is its own local memory.
        unsafe { mem::copy_bytes(result.addr as usize as *mut u8, bytes.as_ptr(), 8) };
        mover.lap(Phase::Atomic);
        unsafe { self.finish(ports, mover, 8) }
    }

    /// SEND: into the responder's next receive WQE, checked first.
    unsafe fn send<P: Ports + ?Sized, M: PayloadMover>(&self, ports: &mut P, cfg: &EngineConfig, mover: &mut M) -> Step {
        let (p, q, pp, pq, w) = (self.p, self.q, self.pp, self.pq, &self.w);
        let rq_idx = match unsafe { self.receive(ports, cfg, mover) } {
            Ok(consumed) => consumed,
            Err(step) => return step,
        };
        // Filled in place: a receive WQE moved by value is a 256-byte copy,
        // which the GPU build makes a loop of byte loads and stores.
        let mut recv = RecvWqe::EMPTY;
        let checked = match ports.get(pp) {
            Some(port) => unsafe { check_receive(port, pq, rq_idx, &mut recv) },
            None => return Step::Blocked,
        };
        match checked {
            Err((s, r, key, addr)) => {
                let f = Fail::new(CqeSyndrome::RemoteOp, r, key, addr);
                return unsafe { self.fail_remote(ports, mover, f, Responder::ErrorWithReceive(s, r)) };
            }
            Ok(cap) if cap < w.len => {
                let f = Fail::new(CqeSyndrome::RemoteInvalReq, Reason::Length, 0, 0);
                let what = Responder::ErrorWithReceive(CqeSyndrome::LocalLength, Reason::Length);
                return unsafe { self.fail_remote(ports, mover, f, what) };
            }
            Ok(_) => {}
        }
        mover.lap(Phase::Receive);
        unsafe { gather_to_receive(w, &recv, mover) };
        mover.drain();
        unsafe { complete_responder(ports, (p, q), (pp, pq), w, CQE_RESP_SEND, self.now_ns, self.scope) };
        mover.lap(Phase::Responder);
        unsafe { self.finish(ports, mover, w.len as u32) }
    }
}
