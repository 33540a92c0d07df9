//! The lone request: one QP rung while the engine idled, served without a
//! pass.
//!
//! A round trip's signal is the transport's most common request and the
//! one whose latency users see: the engine idles, one QP's doorbell word
//! moves, one or two small WRITEs wait behind it. The general way through
//! the engine — a pass over the woken slot
//! ([`poll_port_masked`](super::super::poll::poll_port_masked)), its
//! doorbell bookkeeping, the queued burst and the block's round with two
//! barriers ([`super::BlockMover::run_queued`]) — cost the control thread
//! about 33 000 cycles for such a request on an H200, of which the WQEs'
//! own checks and stores are a third (`ibgda_bench`'s engine profile).
//!
//! [`serve`] does what that pass would do for it and no more, on the
//! control thread alone: the doorbell's bookkeeping (exactly
//! [`watch_doorbell`](super::super::poll)'s for a UAR doorbell with no
//! fault), one acquire, the doorbell record, then for each published WQE
//! the burst's read-once checks ([`check_write`]) on each copy and, for those that
//! pass, the payload through the block's mover (ordered as every copy is),
//! the CQE each asks for, the counters and the ring's step. It steps aside
//! — before touching anything, or after the bookkeeping, leaving the rest
//! to a pass over the slot at once — whenever that pass could do
//! something else: the link model on, a fault configured, a QP not ready
//! to send or without a UAR, WQEs in flight or a doorbell pending,
//! responder events in its inbox, more than [`LONE_MAX`] basic blocks
//! published, or a WQE that is not a simple WRITE (another opcode, a
//! longer message, a failed check: the one-WQE path executes it and
//! reports its error). Every error completion, fault and other opcode
//! therefore behaves as before.

use super::super::burst::{answering, check_write, load_wqe, push_write_cqe, BurstHead, Simple, Tally};
use super::super::config::EngineConfig;
use super::super::mem;
use super::super::mover::{PayloadMover, Phase};
use super::super::poll::published;
use super::super::tables::{Port, PortTable, Ports, QpState, MAX_QPS, MAX_SHARDS};
use super::super::{cqe, wqe};
use super::{BlockMover, View};

/// Most basic blocks (WQEs) published behind a lone doorbell that the
/// lone path executes; more go to a pass, whose burst checks them a lane
/// each.
pub const LONE_MAX: u32 = 2;

/// Serves the lone doorbell of QP slot `q` of the engine's port `p`,
/// whose doorbell word read `seen` ([`super::view::Rung::lone`]), at
/// engine time `now_ns` (see the module docs). Returns the WQEs it
/// executed when it served the doorbell completely; `None` when a pass
/// over the slot must run now (it may have taken the doorbell's
/// bookkeeping and executed some WQEs; the pass finds the rest published).
///
/// # Safety
/// The tables' contract ([`super::super::poll_port`]); `view` is the
/// engine's view of its port `p`.
#[inline(never)]
pub(super) unsafe fn serve(
    view: &mut View,
    p: usize,
    q: usize,
    seen: u64,
    now_ns: u64,
    cfg: &EngineConfig,
    mover: &mut BlockMover,
) -> Option<u32> {
    if q >= MAX_QPS || !cfg.faults.quiet() || mover.allow[q] != 0 {
        return None;
    }
    let scope = mover.scope();
    let ports: *const PortTable = view.table();
    let port = view.own_mut()?;
    let own = port as *mut Port as usize as u64;
    if port.link.enabled() {
        return None;
    }
    // The doorbell, as `watch_doorbell` takes it.
    let Port { qps, stats, .. } = &mut *port;
    let qp = &mut qps[q];
    let ready = qp.in_use() && qp.state() == QpState::Rts;
    let ring_ok = !qp.sq.is_null() && qp.sq_wqebbs != 0 && qp.sq_wqebbs <= wqe::MAX_SQ_WQEBBS;
    if !ready
        || !ring_ok
        || qp.uar.is_null()
        || qp.dbrec.is_null()
        || qp.db_pending != 0
        || qp.inflight_len != 0
        || seen == qp.last_doorbell
    {
        return None;
    }
    // The doorbell word is the first 8 bytes of the last rung WQE's ctrl
    // segment, whose big-endian WQE index (bytes 1 and 2) says at least
    // how many WQEs follow `sq_ci`: a run too long for this path goes to
    // the pass at once, before the acquire (the record decides otherwise).
    let last = ((seen >> 8) as u16).swap_bytes();
    if last.wrapping_sub(qp.sq_ci as u16) >= LONE_MAX as u16 {
        return None;
    }
    let stats = &mut stats[qp.shard as usize % MAX_SHARDS];
    qp.last_doorbell = seen;
    qp.doorbells += 1;
    stats.doorbells += 1;
    stats.last_uar = seen;
    stats.last_qpn = qp.qpn;
    mover.rung(q);
    // Before the acquire, what needs none: the QP's entries this engine
    // writes itself and those that change only under a refresh.
    let mut head = BurstHead::new(ports as usize as u64, own, (p, q), qp, qp.sq_ci, 0);
    head.now_ns = now_ns;
    head.sys = (scope == mem::Scope::Sys) as u32;
    let dbrec = qp.dbrec;
    // The record and the WQEs after the UAR word that showed the
    // doorbell. The WQEs that may follow `sq_ci` are read together with
    // the record (which says how many are published; the rest are
    // ignored), and the responder's entries with them: one memory trip
    // for all.
    mem::acquire(scope);
    // SAFETY: the ring's slots (checked above: not null, a valid size).
    let segs: [[[u32; 4]; 3]; LONE_MAX as usize] = core::array::from_fn(|k| unsafe { load_wqe(&head, head.start.wrapping_add(k as u32)) });
    // SAFETY: the caller's contract (the QP's doorbell record).
    let pi = unsafe { mem::peek_dbrec(dbrec.add(1)) } & 0xffff;
    if pi != qp.sq_pi {
        stats.last_sq_pi = pi;
        stats.last_qpn = qp.qpn;
    }
    qp.sq_pi = pi;
    qp.db_pending = 0;
    qp.last_dbr_read_ns = now_ns;
    let avail = published(qp.sq_pi, qp.sq_ci);
    head.count = avail;
    doorbell_kernels::trace_hook! {
        super::super::trace::event(super::super::trace::rings(port), super::super::trace::What::NicDoorbell, u32::MAX, seen);
    }
    mover.lap(Phase::Doorbell);
    if avail > LONE_MAX || avail > head.sq_wqebbs {
        return None;
    }
    // Every WQE checked once, from its copy, before anything is stored.
    // SAFETY: the view's contract keeps the table and its ports valid.
    let (ports, own) = unsafe { (&*ports, &*(own as usize as *const Port)) };
    let peer = ports.get(head.peer_port as usize).filter(|port| answering(port, &head));
    let mut simple: [Option<Simple>; LONE_MAX as usize] = [None; LONE_MAX as usize];
    let mut n = 0u32;
    // A loop of constant length over the copies, unrolled: each copy's
    // words stay in registers (indexed at run time they would go through
    // the stack first).
    let mut open = peer.is_some();
    for (k, (segs, slot)) in segs.iter().zip(simple.iter_mut()).enumerate() {
        let k = k as u32;
        if open && k < avail {
            *slot = check_write(ports, own, &head, head.start.wrapping_add(k), segs);
            open = slot.is_some();
            n += open as u32;
        }
    }
    mover.lap(Phase::Check);
    let port = view.own_mut()?;
    doorbell_kernels::trace_hook! {
        let tr = super::super::trace::rings(port);
    }
    let Port { qps, cqs, .. } = &mut *port;
    let qp = &mut qps[q];
    let qpn = qp.qpn;
    let mut cq = cqs.get_mut(qp.send_cq as usize);
    let (mut done, mut bytes, mut cqes) = (0u32, 0u64, 0u32);
    while done < n {
        let Some(w) = simple[done as usize % LONE_MAX as usize] else {
            break;
        };
        // SAFETY: the caller's contract.
        if w.signaled && !cq.as_deref_mut().is_some_and(|cq| unsafe { cqe::has_room_cached(cq) }) {
            break;
        }
        let idx = head.start.wrapping_add(done);
        // SAFETY: the checks passed: both ranges lie in registered regions
        // and do not overlap.
        unsafe { mover.copy(w.dst, w.src, w.len as usize) };
        doorbell_kernels::trace_hook! {
            super::super::trace::event(tr, super::super::trace::What::NicFetch, u32::MAX, idx as u64);
            super::super::trace::event(tr, super::super::trace::What::NicExecute, head.peer_port, w.len as u64);
        }
        if w.signaled {
            if let Some(cq) = cq.as_deref_mut() {
                // SAFETY: the caller's contract; room checked above.
                if unsafe { push_write_cqe(cq, qpn, idx, w.len, now_ns, scope) } {
                    cqes += 1;
                    doorbell_kernels::trace_hook! {
                        super::super::trace::event(tr, super::super::trace::What::NicCqe, u32::MAX, cq.pi as u64);
                    }
                }
            }
        }
        bytes += w.len as u64;
        done += 1;
        mover.executed(q);
        mover.lap(Phase::Requester);
    }
    if done != 0 {
        qp.sq_ci = head.start.wrapping_add(done);
        let tally = Tally {
            done,
            bytes,
            cqes,
            last_wqe: head.start.wrapping_add(done - 1),
            ..Tally::default()
        };
        tally.apply(port, q);
        port.stats_mut(q).last_qpn = qpn;
    }
    mover.lone_doorbells += 1;
    mover.lone_wqes += done as u64;
    mover.lap(Phase::Lone);
    (done == avail).then_some(done)
}
