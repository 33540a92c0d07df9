//! The responder's side of a message, kept by its owner: a requester's
//! engine never writes another port's QP, CQ or counters. It posts an
//! event ([`InboxEvent`]: a receive consumed, a responder error) into the
//! responder QP's inbox, checking room first (`inbox_room`, `room`),
//! and the responder port's own engine applies the events in order when
//! it drains the inbox ([`apply_event`]: the receive CQE, the receive
//! index, the error state and log).

use doorbell_kernels::mlx5::{CQE_RESP_WR_IMM, WQE_CTRL_SOLICITED};

use super::mem::Scope;
use super::tables::{
    ErrorRecord, InboxEvent, Port, Ports, QpState, EVENT_ERROR, EVENT_ERROR_RECEIVE, EVENT_RECEIVE, EVENT_SOLICITED, INBOX, MAX_QPS,
    MAX_SHARDS,
};
use super::wqe::Wqe;
use super::{cqe, mem};

/// Whether the inbox of the peer QP `pq` of port `pp` has room for one
/// more event from its requester, QP `q` of port `p`. The peer's
/// `inbox_tail` (a load from another port's tables) is read only when
/// the events this QP wrote since it last read it fill the inbox.
///
/// # Safety
/// The ports' tables are valid.
pub(crate) unsafe fn inbox_room<P: Ports + ?Sized>(ports: &mut P, p: usize, q: usize, pp: usize, pq: usize) -> bool {
    let peer = ports.raw(pp);
    if peer.is_null() || pq >= MAX_QPS {
        return false;
    }
    // SAFETY: a live port (the caller's contract); the field's address
    // only, no reference to the peer's tables.
    let tail_at = unsafe { &raw const (*peer).qps[pq].inbox_tail };
    let Some(qp) = ports.get_mut(p).and_then(|x| x.qps.get_mut(q)) else {
        return false;
    };
    if qp.out_head.wrapping_sub(qp.out_tail_seen) < INBOX as u32 {
        return true;
    }
    // SAFETY: as above.
    qp.out_tail_seen = unsafe { mem::peek_word(tail_at) };
    qp.out_head.wrapping_sub(qp.out_tail_seen) < INBOX as u32
}

/// Tells the peer QP `pq` of port `pp` what happened to it as the
/// responder of QP `q` of port `p`: writes `ev` into its inbox and
/// publishes the inbox head with a release at `scope` (ordered after the
/// payload this engine moved for it). Room was checked ([`inbox_room`]).
///
/// # Safety
/// As for [`inbox_room`].
pub(crate) unsafe fn post_event<P: Ports + ?Sized>(ports: &mut P, p: usize, q: usize, pp: usize, pq: usize, ev: &InboxEvent, scope: Scope) {
    let Some(qp) = ports.get_mut(p).and_then(|x| x.qps.get_mut(q)) else {
        return;
    };
    let head = qp.out_head;
    qp.out_head = head.wrapping_add(1);
    let peer = ports.raw(pp);
    if peer.is_null() || pq >= MAX_QPS {
        return;
    }
    // SAFETY: a live port (the caller's contract); addresses of its inbox
    // only, written through `mem` as the tables' concurrency rules say.
    unsafe {
        let inbox = &raw mut (*peer).inbox[pq];
        let slot = &raw mut (*inbox).events[head as usize % INBOX];
        mem::store_event(slot as *mut [u32; 8], &ev.to_words());
        mem::publish_word(&raw mut (*inbox).head, head.wrapping_add(1), scope);
    }
}

/// A successful responder completion, as an event for the responder's
/// owner: the receive WQE this QP consumed (`RESP_WR_IMM` or `RESP_SEND`
/// as `opcode`, solicited bit as the sender asked). Room was checked.
///
/// # Safety
/// As for [`inbox_room`].
pub(crate) unsafe fn complete_responder<P: Ports + ?Sized>(
    ports: &mut P,
    (p, q): (usize, usize),
    (pp, pq): (usize, usize),
    w: &Wqe,
    opcode: u8,
    now_ns: u64,
    scope: Scope,
) {
    let Some(qp) = ports.get_mut(p).and_then(|x| x.qps.get_mut(q)) else {
        return;
    };
    let rq_idx = qp.peer_rq_ci;
    qp.peer_rq_ci = rq_idx.wrapping_add(1);
    let solicited = w.ctrl.fm_ce_se & WQE_CTRL_SOLICITED != 0;
    let ev = InboxEvent {
        kind: EVENT_RECEIVE,
        opcode,
        syndrome: 0,
        reason: 0,
        rq_idx: rq_idx as u16,
        flags: if solicited { EVENT_SOLICITED } else { 0 },
        byte_cnt: w.len as u32,
        imm_or_key: if opcode == CQE_RESP_WR_IMM { w.ctrl.imm } else { 0 },
        addr: 0,
        time_ns: now_ns,
    };
    // SAFETY: the caller's contract.
    unsafe { post_event(ports, p, q, pp, pq, &ev, scope) };
}

/// Applies one responder event to port `port`'s QP `q` (the owner's
/// engine draining its inbox): the receive CQE (success or `RESP_ERR`),
/// the receive-queue index, the error state, counters and error log.
/// Returns false, changing nothing, when the event needs a CQE and the
/// receive CQ is full (the event waits in the inbox).
///
/// # Safety
/// The QP's receive CQ ring is valid.
pub unsafe fn apply_event(port: &mut Port, q: usize, ev: &InboxEvent, scope: Scope) -> bool {
    let Port { qps, cqs, stats, .. } = &mut *port;
    let Some(qp) = qps.get_mut(q) else { return true };
    let stats = &mut stats[qp.shard as usize % MAX_SHARDS];
    let qpn = qp.qpn;
    // How far the event's receive WQE is past the next one this QP
    // completes: negative when a flush completed it already.
    let ahead = (ev.rq_idx).wrapping_sub(qp.rq_ci as u16) as i16;
    let cq = cqs.get_mut(qp.recv_cq as usize);
    match ev.kind {
        EVENT_RECEIVE => {
            if ahead < 0 {
                // Flushed before the event came in (the QP moved to the
                // error state meanwhile): one completion per receive WQE.
                return true;
            }
            if let Some(cq) = cq {
                // SAFETY: the caller's contract.
                if !unsafe { cqe::has_room_cached(cq) } {
                    return false;
                }
                let solicited = ev.flags & EVENT_SOLICITED != 0;
                let done = cqe::Success {
                    opcode: ev.opcode,
                    qpn,
                    wqe_counter: ev.rq_idx,
                    byte_cnt: ev.byte_cnt,
                    imm: ev.imm_or_key,
                    sop: 0,
                    solicited,
                    time_ns: ev.time_ns,
                };
                let img = cqe::success(cq, &done);
                // SAFETY: the caller's contract; room checked.
                if unsafe { cqe::push(cq, &img, solicited, scope) } {
                    stats.cqes += 1;
                }
            }
            qp.rq_ci = qp.rq_ci.wrapping_add(ahead as u32 + 1);
            true
        }
        EVENT_ERROR | EVENT_ERROR_RECEIVE => {
            let receive = ev.kind == EVENT_ERROR_RECEIVE && ahead >= 0;
            if receive {
                if let Some(cq) = cq {
                    // SAFETY: the caller's contract.
                    if !unsafe { cqe::has_room_cached(cq) } {
                        return false;
                    }
                    let img = cqe::error(cq, true, ev.syndrome, ev.reason, qpn, ev.opcode, ev.rq_idx);
                    // SAFETY: the caller's contract; room checked.
                    if unsafe { cqe::push(cq, &img, true, scope) } {
                        stats.cqes += 1;
                    }
                }
                qp.rq_ci = qp.rq_ci.wrapping_add(ahead as u32 + 1);
                stats.errors += 1;
            }
            qp.state = QpState::Err as u32;
            port.log_error(ErrorRecord {
                time_ns: ev.time_ns,
                addr: ev.addr,
                key: ev.imm_or_key,
                qpn,
                wqe_counter: ev.rq_idx,
                opcode: ev.opcode,
                syndrome: ev.syndrome,
                reason: ev.reason,
                responder: 1,
                reserved: [0; 2],
            });
            true
        }
        // Not an event this engine writes: nothing to apply.
        _ => true,
    }
}

/// Whether the CQ in slot `cq` of port `p` — another port's, a
/// responder's — has room (read only: that port's engine owns the entry).
///
/// # Safety
/// Its doorbell record is valid.
pub(crate) unsafe fn room<P: Ports + ?Sized>(ports: &P, p: usize, cq: u32) -> bool {
    match ports.get(p).and_then(|x| x.cqs.get(cq as usize)) {
        // SAFETY: the caller's contract.
        Some(c) => unsafe { cqe::has_room(c) },
        None => false,
    }
}
