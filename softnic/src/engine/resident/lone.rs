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
//!
//! The table entries the checks read — the local region, the responder's
//! port, QP and region — are read in the memory trip that reads the WQEs,
//! at the addresses the QP's last lone doorbell named ([`Guesses`],
//! [`Preload`]), rather than in one dependent trip after another once the
//! WQEs have arrived (the checks were about 9 000 of a lone doorbell's
//! 19 000 cycles on an H200: `benchmarks/ibgda_h200_lone_profile.txt`).

use doorbell_kernels::mlx5::{DataSeg, RaddrSeg};
use doorbell_kernels::ptx;

use super::super::burst::{answering, check_write, load_wqe, push_write_cqe, BurstHead, Simple, Tables, Tally, WriteTables};
use super::super::config::EngineConfig;
use super::super::exec::{admit_remote, answers_as};
use super::super::link::LinkModel;
use super::super::mem;
use super::super::mover::{PayloadMover, Phase};
use super::super::poll::{doorbell_covers, published};
use super::super::tables::{
    access, key_slot, CqEntry, MrEntry, Port, PortStats, PortTable, Ports, QpEntry, QpState, Window, MAX_CQS, MAX_QPS, MAX_SHARDS,
};
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
/// `guesses` holds what each QP's last lone doorbell named ([`Guesses`]).
///
/// # Safety
/// The tables' contract ([`super::super::poll_port`]); `view` is the
/// engine's view of its port `p`.
#[inline(never)]
pub(super) unsafe fn serve(
    view: &mut View,
    p: usize,
    (q, seen): (usize, u64),
    now_ns: u64,
    cfg: &EngineConfig,
    mover: &mut BlockMover,
    guesses: &mut Guesses,
) -> Option<u32> {
    // Bursts off (`burst` 0): every WQE takes the one-WQE path, this one's
    // too.
    if q >= MAX_QPS || !cfg.faults.quiet() || mover.allow[q] != 0 || mover.burst_max == 0 {
        return None;
    }
    let scope = mover.scope();
    let ports: *const PortTable = view.table();
    let port = view.own_mut()?;
    let own = port as *mut Port as usize as u64;
    // What the checks below read of the port and the QP, in one memory
    // trip: read field by field, one branch after another, each load
    // waited for the branch before it.
    // SAFETY: an entry of the engine's own port (`q` checked above).
    let (h, link) = unsafe { (read_qp_head(&raw const port.qps[q]), read_link(&raw const port.link)) };
    if link.enabled() {
        return None;
    }
    // The doorbell, as `watch_doorbell` takes it.
    let ready = h.in_use() & (h.state() == QpState::Rts);
    let ring_ok = !h.sq.is_null() & (h.sq_wqebbs != 0) & (h.sq_wqebbs <= wqe::MAX_SQ_WQEBBS);
    let idle = (h.db_pending == 0) & (h.inflight_len == 0) & (seen != h.last_doorbell);
    if !(ready & ring_ok & idle & !h.uar.is_null() & !h.dbrec.is_null()) {
        return None;
    }
    // The doorbell word is the first 8 bytes of the last rung WQE's ctrl
    // segment, whose big-endian WQE index (bytes 1 and 2) says at least
    // how many WQEs follow `sq_ci`: a run too long for this path goes to
    // the pass at once, before the acquire (the record decides otherwise).
    let last = ((seen >> 8) as u16).swap_bytes();
    if last.wrapping_sub(h.sq_ci as u16) >= LONE_MAX as u16 {
        return None;
    }
    let shard = h.shard as usize % MAX_SHARDS;
    let Port { qps, stats, .. } = &mut *port;
    let qp = &mut qps[q];
    let stats = &mut stats[shard];
    qp.last_doorbell = seen;
    qp.doorbells = h.doorbells.wrapping_add(1);
    stats.doorbells += 1;
    stats.last_uar = seen;
    stats.last_qpn = h.qpn;
    mover.rung(q);
    // Before the acquire, what needs none: the QP's entries this engine
    // writes itself and those that change only under a refresh.
    let mut head = BurstHead::new(ports as usize as u64, own, (p, q), &h, h.sq_ci, 0);
    head.now_ns = now_ns;
    head.sys = (scope == mem::Scope::Sys) as u32;
    let dbrec = h.dbrec;
    // The record and the WQEs after the UAR word that showed the
    // doorbell. The WQEs that may follow `sq_ci` are read together with
    // the record (which says how many are published; the rest are
    // ignored), and the responder's entries with them: one memory trip
    // for all.
    let guess = guesses.of(q);
    // The send CQ's entry and the shard's counters, which the steps after
    // the checks read (and write), each in their own trip to L2 since the
    // acquire empties L1: asked for in this trip, those reads find them in
    // L1.
    let own_port = own as usize as *const Port;
    // SAFETY: the engine's own port, live while it runs.
    let (cq_at, stats_at) = unsafe {
        (
            (&raw const (*own_port).cqs).cast::<CqEntry>().add(h.send_cq as usize % MAX_CQS),
            (&raw const (*own_port).stats).cast::<PortStats>().add(shard),
        )
    };
    mem::acquire(scope);
    // SAFETY: both lie in the engine's own port.
    unsafe {
        touch(cq_at);
        touch(stats_at);
    }
    // SAFETY: the ring's slots (checked above: not null, a valid size).
    let segs: [[[u32; 4]; 3]; LONE_MAX as usize] = core::array::from_fn(|k| unsafe { load_wqe(&head, head.start.wrapping_add(k as u32)) });
    // SAFETY: the view's contract keeps the table and its ports valid.
    let pre = unsafe { Preload::read(&*ports, &*(own as usize as *const Port), &head, guess) };
    // SAFETY: the caller's contract (the QP's doorbell record).
    let record = unsafe { mem::peek_dbrec(dbrec.add(1)) } & 0xffff;
    // Only the WQEs the doorbell word covers: the record, read after the
    // ring's slots, may already publish another poster's WQEs, whose slots
    // were read before it and may be stale (their doorbell comes next).
    let pi = doorbell_covers(seen, h.sq_ci, record, h.sq_wqebbs);
    if record != h.sq_pi {
        stats.last_sq_pi = record;
        stats.last_qpn = h.qpn;
    }
    qp.sq_pi = pi;
    qp.db_pending = 0;
    qp.last_dbr_read_ns = now_ns;
    let avail = published(pi, h.sq_ci);
    head.count = avail;
    doorbell_kernels::trace_hook! {
        super::super::trace::event(super::super::trace::rings(port), super::super::trace::What::NicDoorbell, u32::MAX, seen);
    }
    mover.lap(Phase::Doorbell);
    if avail > LONE_MAX || avail > head.sq_wqebbs {
        return None;
    }
    // Every WQE checked once, from its copy, before anything is stored.
    let mut simple: [Option<Simple>; LONE_MAX as usize] = [None; LONE_MAX as usize];
    let mut n = 0u32;
    // A loop of constant length over the copies, unrolled: each copy's
    // words stay in registers (indexed at run time they would go through
    // the stack first).
    let mut open = pre.answering(&head);
    for (k, (segs, slot)) in segs.iter().zip(simple.iter_mut()).enumerate() {
        let k = k as u32;
        if open && k < avail {
            *slot = check_write(&pre, &head, head.start.wrapping_add(k), segs);
            open = slot.is_some();
            n += open as u32;
        }
    }
    if avail != 0 {
        guesses.learn(q, &segs[0], pre.peer_now);
    }
    mover.lap(Phase::Check);
    let port = view.own_mut()?;
    doorbell_kernels::trace_hook! {
        let tr = super::super::trace::rings(port);
    }
    let Port { qps, cqs, .. } = &mut *port;
    let qp = &mut qps[q];
    let qpn = h.qpn;
    let mut cq = cqs.get_mut(h.send_cq as usize);
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
        let stats = &mut port.stats[shard];
        tally.apply_to(stats);
        stats.last_qpn = qpn;
    }
    mover.lone_doorbells += 1;
    mover.lone_wqes += done as u64;
    mover.lap(Phase::Lone);
    (done == avail).then_some(done)
}

/// Per QP slot, what the last lone doorbell's first WQE named: its local
/// and remote keys and the responder's port. The next lone doorbell on
/// the QP most likely names them again (a round trip's signal, a stream
/// of puts into one heap), so their table entries are read in the trip
/// that reads its WQEs, after the same acquire ([`Preload`]), instead of
/// one dependent trip after another once the WQEs have arrived. A guess
/// only chooses what is read early: every check runs on what was read,
/// and a WQE naming anything else is checked from the tables as before.
pub(super) struct Guesses {
    lkey: [u32; MAX_QPS],
    rkey: [u32; MAX_QPS],
    /// The responder's port as the fabric's table named it (null: none).
    peer: [u64; MAX_QPS],
}

/// One QP's guess ([`Guesses`]).
#[derive(Clone, Copy, Debug)]
struct Guess {
    lkey: u32,
    rkey: u32,
    peer: u64,
}

impl Guesses {
    /// No guess for any QP: the first lone doorbell of each reads the
    /// tables after its WQEs.
    pub(super) const fn new() -> Guesses {
        Guesses {
            lkey: [0; MAX_QPS],
            rkey: [0; MAX_QPS],
            peer: [0; MAX_QPS],
        }
    }

    fn of(&self, q: usize) -> Guess {
        match (self.lkey.get(q), self.rkey.get(q), self.peer.get(q)) {
            (Some(&lkey), Some(&rkey), Some(&peer)) => Guess { lkey, rkey, peer },
            _ => Guess { lkey: 0, rkey: 0, peer: 0 },
        }
    }

    /// Remembers the keys of `segs` (a WRITE's copy: ctrl, remote address,
    /// data segment) and the responder's port `peer` for QP slot `q`.
    fn learn(&mut self, q: usize, segs: &[[u32; 4]; 3], peer: u64) {
        if let (Some(l), Some(r), Some(p)) = (self.lkey.get_mut(q), self.rkey.get_mut(q), self.peer.get_mut(q)) {
            *l = DataSeg::from_words(&segs[2]).lkey;
            *r = RaddrSeg::from_words(&segs[1]).rkey;
            *p = peer;
        }
    }
}

// The words [`Preload::read`] reads in 16- and 8-byte loads.
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(align_of::<Port>() >= 16 && offset_of!(Port, mrs) % 16 == 0 && offset_of!(Port, qps) % 16 == 0);
    assert!(size_of::<MrEntry>() == 32 && offset_of!(MrEntry, len) == 8 && offset_of!(MrEntry, key) == 16);
    assert!(offset_of!(MrEntry, access) == 20 && offset_of!(MrEntry, pd) == 24 && offset_of!(MrEntry, valid) == 28);
    assert!(offset_of!(QpEntry, qpn) % 8 == 0 && offset_of!(QpEntry, access) % 8 == 0);
    assert!(offset_of!(QpEntry, state) == offset_of!(QpEntry, qpn) + 4 && offset_of!(QpEntry, pd) == offset_of!(QpEntry, qpn) + 8);
    assert!(offset_of!(QpEntry, peer_port) == offset_of!(QpEntry, access) + 4);
    assert!(offset_of!(QpEntry, peer_qp) == offset_of!(QpEntry, access) + 8);
    assert!(offset_of!(QpEntry, flags) == offset_of!(QpEntry, access) + 12);
};

/// The table entries a lone doorbell's WQEs were guessed to name
/// ([`Guesses`]), read together right after the acquire: the local
/// region's entry, the fabric table's word for the responder's port (and
/// its window), and — when the guessed port is that word — the port's
/// valid word, the responder QP's words and its region's entry. Checks
/// run on these copies exactly as on the tables ([`WriteTables`]); a key
/// naming another slot, or a responder port other than the guess, is
/// checked from the tables ([`Tables`]).
struct Preload<'a> {
    tables: Tables<'a>,
    own_slot: Option<usize>,
    own_mr: MrEntry,
    /// The fabric's table: the responder's port now (null: none) and its
    /// window.
    peer_now: u64,
    window: Window,
    /// The guessed port is the responder's port now: the copies below are
    /// its.
    peer_ok: bool,
    valid: u32,
    qp: QpEntry,
    peer_slot: Option<usize>,
    peer_mr: MrEntry,
}

/// The fields of a QP's entry that [`serve`] reads, one 8-byte load for
/// each word that holds some, every load issued before any is used (the
/// rest of the copy is empty). QP entries are 8-byte aligned only.
///
/// # Safety
/// `at` is a live entry.
#[inline(always)]
unsafe fn read_qp_head(at: *const QpEntry) -> QpEntry {
    let w = at as *const u64;
    // SAFETY: words of the entry (the caller's contract), 8-byte aligned.
    let word = |i: usize| unsafe { ptx::ld_u64(w.add(i)) };
    let [sq, dbrec, uar, qpn_state, pd_cq, wqebbs, access_peer, peer_flags, ci_pi, db_pending, last_doorbell, doorbells, inflight_shard] =
        [0, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 15, 18].map(word);
    let (lo, hi) = (|x: u64| x as u32, |x: u64| (x >> 32) as u32);
    QpEntry {
        sq: sq as usize as *mut u8,
        dbrec: dbrec as usize as *mut u32,
        uar: uar as usize as *const u64,
        qpn: lo(qpn_state),
        state: hi(qpn_state),
        pd: lo(pd_cq),
        send_cq: hi(pd_cq),
        sq_wqebbs: hi(wqebbs),
        access: lo(access_peer),
        peer_port: hi(access_peer),
        peer_qp: lo(peer_flags),
        flags: hi(peer_flags),
        sq_ci: lo(ci_pi),
        sq_pi: hi(ci_pi),
        db_pending: hi(db_pending),
        last_doorbell,
        doorbells,
        inflight_len: lo(inflight_shard),
        shard: hi(inflight_shard),
        ..QpEntry::EMPTY
    }
}

/// Loads one word of each 32-byte sector of `*at` (L1 fills by sectors)
/// without waiting for them: the object is in L1 for the loads after it.
///
/// # Safety
/// `at` is a live object, 8-byte aligned.
#[inline(always)]
unsafe fn touch<T>(at: *const T) {
    let (first, last) = (at as usize, at as usize + core::mem::size_of::<T>() - 1);
    // SAFETY: every address lies in `*at` (the caller's contract).
    unsafe { ptx::ld_u32(first as *const u32) };
    for k in 1..=core::mem::size_of::<T>().div_ceil(32) {
        let sector = (first & !31) + 32 * k;
        if sector <= last {
            // SAFETY: as above.
            unsafe { ptx::ld_u32(sector as *const u32) };
        }
    }
}

/// The port's link model, as two 8-byte loads issued together.
///
/// # Safety
/// `at` is the engine's own port's model.
#[inline(always)]
unsafe fn read_link(at: *const LinkModel) -> LinkModel {
    let w = at as *const u64;
    // SAFETY: the caller's contract; the model is two 8-byte words.
    unsafe {
        LinkModel {
            fs_per_byte: ptx::ld_u64(w),
            latency_ns: ptx::ld_u64(w.add(1)),
        }
    }
}

// The words `read_qp_head` and `read_link` read.
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(align_of::<QpEntry>() >= 8 && size_of::<QpEntry>().is_multiple_of(8) && offset_of!(Port, qps).is_multiple_of(8));
    assert!(offset_of!(QpEntry, sq) == 0 && offset_of!(QpEntry, dbrec) == 16 && offset_of!(QpEntry, uar) == 24);
    assert!(offset_of!(QpEntry, qpn) == 32 && offset_of!(QpEntry, state) == 36);
    assert!(offset_of!(QpEntry, pd) == 40 && offset_of!(QpEntry, send_cq) == 44 && offset_of!(QpEntry, sq_wqebbs) == 52);
    assert!(offset_of!(QpEntry, access) == 64 && offset_of!(QpEntry, peer_port) == 68);
    assert!(offset_of!(QpEntry, peer_qp) == 72 && offset_of!(QpEntry, flags) == 76);
    assert!(offset_of!(QpEntry, sq_ci) == 80 && offset_of!(QpEntry, sq_pi) == 84 && offset_of!(QpEntry, db_pending) == 92);
    assert!(offset_of!(QpEntry, last_doorbell) == 96 && offset_of!(QpEntry, doorbells) == 120);
    assert!(offset_of!(QpEntry, inflight_len) == 144 && offset_of!(QpEntry, shard) == 148);
    assert!(size_of::<LinkModel>() == 16 && offset_of!(LinkModel, latency_ns) == 8 && offset_of!(Port, link).is_multiple_of(8));
};

/// A memory region's entry, read as two 16-byte loads.
///
/// # Safety
/// `at` is a live entry, 16-byte aligned.
#[inline(always)]
unsafe fn read_mr(at: *const MrEntry) -> MrEntry {
    // SAFETY: the caller's contract.
    let (a, b) = unsafe { (ptx::ld_v4_u32(at as *const u32), ptx::ld_v4_u32((at as *const u32).add(4))) };
    MrEntry {
        addr: a[0] as u64 | (a[1] as u64) << 32,
        len: a[2] as u64 | (a[3] as u64) << 32,
        key: b[0],
        access: b[1],
        pd: b[2],
        valid: b[3],
    }
}

impl<'a> Preload<'a> {
    /// Reads what `guess` names for the lone doorbell `h` of the engine's
    /// port `own` (see the type's docs). Every load is issued before any
    /// of them is used.
    ///
    /// # Safety
    /// After the doorbell's acquire; the tables' contract
    /// ([`super::super::poll_port`]): the fabric's table `ports` does not
    /// change while the engine runs, so a guessed port, once read from it,
    /// is a live port.
    #[inline(always)]
    unsafe fn read(ports: &'a PortTable, own: &'a Port, h: &BurstHead, guess: Guess) -> Preload<'a> {
        let (pp, pq) = (h.peer_port as usize, h.peer_qp as usize);
        let own_slot = key_slot(guess.lkey);
        // SAFETY (whole block): entries of live tables at in-range indices;
        // the alignment is asserted above.
        unsafe {
            let own_mr = match own_slot {
                Some(s) => read_mr(&raw const own.mrs[s]),
                None => MrEntry::EMPTY,
            };
            let (mut peer_now, mut window) = (0, Window::SAME);
            let mut count = 0;
            if pp < ports.ports.len() {
                peer_now = ptx::ld_u64(&raw const ports.ports[pp] as *const u64);
                count = ptx::ld_u32(&raw const ports.count);
                let w = &raw const ports.windows[pp];
                window = Window {
                    from: ptx::ld_u64(&raw const (*w).from),
                    len: ptx::ld_u64(&raw const (*w).len),
                    to: ptx::ld_u64(&raw const (*w).to),
                };
            }
            let peer_slot = key_slot(guess.rkey);
            let (mut valid, mut qp, mut peer_mr) = (0, QpEntry::EMPTY, MrEntry::EMPTY);
            let guessed = guess.peer as usize as *const Port;
            if !guessed.is_null() && pq < MAX_QPS {
                valid = ptx::ld_u32(&raw const (*guessed).valid);
                let e = &raw const (*guessed).qps[pq];
                let a = ptx::ld_u64(&raw const (*e).qpn as *const u64);
                let b = ptx::ld_u64(&raw const (*e).pd as *const u64);
                let c = ptx::ld_u64(&raw const (*e).access as *const u64);
                let d = ptx::ld_u64(&raw const (*e).peer_qp as *const u64);
                (qp.qpn, qp.state, qp.pd) = (a as u32, (a >> 32) as u32, b as u32);
                (qp.access, qp.peer_port, qp.peer_qp, qp.flags) = (c as u32, (c >> 32) as u32, d as u32, (d >> 32) as u32);
                if let Some(s) = peer_slot {
                    peer_mr = read_mr(&raw const (*guessed).mrs[s]);
                }
            }
            // Only now are the loads' values used.
            let live = (pp as u32) < count;
            if !live {
                (peer_now, window) = (0, Window::SAME);
            }
            Preload {
                tables: Tables { ports, own },
                own_slot,
                own_mr,
                peer_now,
                window,
                peer_ok: live && peer_now != 0 && peer_now == guess.peer && pq < MAX_QPS,
                valid,
                qp,
                peer_slot,
                peer_mr,
            }
        }
    }

    /// [`answering`]: the responder answers the doorbell's QP.
    #[inline(always)]
    fn answering(&self, h: &BurstHead) -> bool {
        if self.peer_ok {
            h.connected != 0 && answers_as(self.valid, &self.qp, (h.port as usize, h.q as usize))
        } else {
            self.tables.ports.get(h.peer_port as usize).is_some_and(|port| answering(port, h))
        }
    }
}

impl WriteTables for Preload<'_> {
    #[inline(always)]
    fn local(&self, key: u32, pd: u32, addr: u64, len: u64) -> Option<*mut u8> {
        if len == 0 || self.own_slot.is_none() || key_slot(key) != self.own_slot {
            return self.tables.local(key, pd, addr, len);
        }
        self.own_mr.admits(key, pd, addr, len, 0).ok()
    }

    #[inline(always)]
    fn remote(&self, h: &BurstHead, addr: u64, key: u32, len: u64) -> Option<*mut u8> {
        if !self.peer_ok || self.peer_slot.is_none() || key_slot(key) != self.peer_slot {
            return self.tables.remote(h, addr, key, len);
        }
        admit_remote(
            Some(&self.peer_mr),
            &self.qp,
            |a, n| self.window.reach(a, n),
            addr,
            key,
            len,
            access::REMOTE_WRITE,
        )
        .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::link::LinkModel;
    use crate::engine::tables::{make_key, QP_CONNECTED, QP_IN_USE};
    use doorbell_kernels::mlx5::{CtrlSeg, OPCODE_RDMA_WRITE, OPCODE_SEND};
    use rand::{Rng, SeedableRng};

    const OWN_Q: usize = 3;
    const PEER_Q: usize = 5;

    /// The doorbell word as a producer stores it: the ctrl segment's first
    /// 8 bytes (its words as `CtrlSeg` encodes them, little-endian).
    fn doorbell_word(wqe_index: u16, ds: u8) -> u64 {
        let w = CtrlSeg {
            opcode: OPCODE_RDMA_WRITE,
            wqe_index,
            ds,
            qpn: 0x12_3456,
            ..CtrlSeg::default()
        }
        .to_words();
        w[0] as u64 | (w[1] as u64) << 32
    }

    #[test]
    fn the_lone_path_takes_only_the_wqes_its_doorbell_word_covers() {
        // The record ends where the rung WQE (one basic block) ends.
        assert_eq!(doorbell_covers(doorbell_word(5, 2), 5, 6, 64), 6);
        // Three WQEs of one basic block, the last one rung.
        assert_eq!(doorbell_covers(doorbell_word(7, 2), 5, 8, 64), 8);
        // Another poster published two more basic blocks after the word
        // was stored: not taken (their slots may have been read stale).
        assert_eq!(doorbell_covers(doorbell_word(5, 2), 5, 8, 64), 6);
        // A WQE of 12 ds spans 3 basic blocks.
        assert_eq!(doorbell_covers(doorbell_word(5, 12), 5, 9, 64), 8);
        assert_eq!(doorbell_covers(doorbell_word(5, 12), 5, 8, 64), 8);
        // Across the 16-bit wrap.
        assert_eq!(doorbell_covers(doorbell_word(0xffff, 2), 0xfffe, 3, 64), 0);
        // A record behind the word (an older one): as read.
        assert_eq!(doorbell_covers(doorbell_word(9, 2), 5, 7, 64), 7);
        // A record behind the consumer index, or past a ring of 64: as
        // read, so that the fetch fails the QP (SqOverrun) instead of the
        // lone path executing the word's WQE.
        assert_eq!(doorbell_covers(doorbell_word(5, 2), 5, 3, 64), 3);
        assert_eq!(doorbell_covers(doorbell_word(5, 2), 5, 5 + 65, 64), 70);
    }

    fn mr(addr: u64, len: u64, key: u32, access: u32, pd: u32) -> MrEntry {
        MrEntry {
            addr,
            len,
            key,
            access,
            pd,
            valid: 1,
        }
    }

    fn qp(qpn: u32, pd: u32, access: u32, peer: (u32, u32)) -> QpEntry {
        QpEntry {
            qpn,
            state: QpState::Rts as u32,
            pd,
            access,
            peer_port: peer.0,
            peer_qp: peer.1,
            flags: QP_IN_USE | QP_CONNECTED,
            ..QpEntry::EMPTY
        }
    }

    /// What a check found, comparable.
    fn seen(s: Option<Simple>) -> Option<(u64, u64, u32, bool, bool)> {
        s.map(|s| (s.dst as u64, s.src as u64, s.len, s.signaled, s.unordered))
    }

    /// The checks of a lone doorbell's WRITEs on the copies read with a
    /// guess and on the tables themselves agree, whatever the guess
    /// (right, another slot, another tag, none, another port) and whatever
    /// changed in the tables (regions, the responder's state, its window,
    /// the fabric's port count); both ways are taken often.
    #[test]
    fn checks_on_the_guessed_copies_agree_with_the_tables() {
        let mut own = Box::new(Port::new(1, LinkModel::OFF));
        let mut peer = Box::new(Port::new(2, LinkModel::OFF));
        own.qps[OWN_Q] = qp(0x123, 3, 0, (1, PEER_Q as u32));
        let mut rng = rand::rngs::StdRng::seed_from_u64(29);
        let (mut hits, mut misses, mut passed) = (0u32, 0u32, 0u32);
        // Of the hits, those whose WQE passed every check.
        for trial in 0..20_000u32 {
            // The tables, changed at random.
            own.mrs[0] = mr(0x1_0000, 0x1000, make_key(0, 1), 0, 3);
            own.mrs[1] = mr(0x1_8000, 0x1000, make_key(1, 2), 0, if rng.gen_bool(0.5) { 3 } else { 4 });
            own.mrs[0].valid = rng.gen_bool(0.9) as u32;
            let pd = if rng.gen_bool(0.9) { 5 } else { 6 };
            peer.mrs[0] = mr(0x2_0000, 0x1000, make_key(0, 7), access::REMOTE_WRITE, pd);
            peer.mrs[1] = mr(
                0x2_8000,
                0x1000,
                make_key(1, 9),
                if rng.gen_bool(0.5) { access::REMOTE_WRITE } else { 0 },
                5,
            );
            peer.mrs[0].valid = rng.gen_bool(0.9) as u32;
            peer.valid = rng.gen_bool(0.95) as u32;
            peer.qps[PEER_Q] = qp(
                0x456,
                5,
                if rng.gen_bool(0.95) { access::REMOTE_WRITE } else { 0 },
                (0, OWN_Q as u32),
            );
            let states = [QpState::Rts, QpState::Rts, QpState::Rts, QpState::Rtr, QpState::Err, QpState::Reset];
            peer.qps[PEER_Q].state = states[rng.gen_range(0..states.len())] as u32;
            if rng.gen_bool(0.05) {
                peer.qps[PEER_Q].peer_qp = OWN_Q as u32 + 1;
            }
            let mut table = PortTable::EMPTY;
            table.ports[0] = &mut *own;
            table.ports[1] = &mut *peer;
            table.count = if rng.gen_bool(0.95) { 2 } else { 1 };
            if rng.gen_bool(0.3) {
                table.windows[1] = Window {
                    from: 0x2_0000,
                    len: 0x800,
                    to: 0x9_0000,
                };
            }
            // The WQE.
            let idx = trial;
            let keys = [
                make_key(0, 1),
                make_key(0, 7),
                make_key(1, 2),
                make_key(1, 9),
                make_key(0, 2),
                make_key(5, 1),
                0,
            ];
            let lkey = if rng.gen_bool(0.7) {
                make_key(0, 1)
            } else {
                keys[rng.gen_range(0..keys.len())]
            };
            let rkey = if rng.gen_bool(0.7) {
                make_key(0, 7)
            } else {
                keys[rng.gen_range(0..keys.len())]
            };
            let len = if rng.gen_bool(0.6) {
                8
            } else {
                [8u32, 1, 64, 65, 0, 4096][rng.gen_range(0..6)]
            };
            let laddr = if rng.gen_bool(0.6) {
                0x1_0000
            } else {
                [0x1_0ff8u64, 0x1_0fff, 0x1_8000, 0xff00][rng.gen_range(0..4)]
            };
            let raddr = if rng.gen_bool(0.6) {
                0x2_0000
            } else {
                [0x2_07f8u64, 0x2_0ff8, 0x2_8000, 0x1_0000][rng.gen_range(0..4)]
            };
            let ctrl = CtrlSeg {
                opcode: if rng.gen_bool(0.95) { OPCODE_RDMA_WRITE } else { OPCODE_SEND },
                wqe_index: if rng.gen_bool(0.97) { idx as u16 } else { idx as u16 ^ 1 },
                ds: 3,
                qpn: 0x123,
                fm_ce_se: rng.gen_range(0..16u8),
                ..CtrlSeg::default()
            };
            let segs = [
                ctrl.to_words(),
                RaddrSeg { raddr, rkey }.to_words(),
                DataSeg {
                    byte_count: len,
                    lkey,
                    addr: laddr,
                }
                .to_words(),
            ];
            // The guess.
            let right = rng.gen_bool(0.6);
            let guess = Guess {
                lkey: if right {
                    lkey
                } else {
                    [make_key(0, 1), make_key(1, 2), make_key(0, 2), 0][rng.gen_range(0..4)]
                },
                rkey: if right {
                    rkey
                } else {
                    [make_key(0, 7), make_key(1, 9), make_key(0, 8), 0][rng.gen_range(0..4)]
                },
                peer: if right || rng.gen_bool(0.5) {
                    &*peer as *const Port as u64
                } else {
                    [&*own as *const Port as u64, 0][rng.gen_range(0..2)]
                },
            };
            let h = BurstHead::new(
                &table as *const PortTable as u64,
                &*own as *const Port as u64,
                (0, OWN_Q),
                &own.qps[OWN_Q],
                idx,
                1,
            );
            let tables = Tables { ports: &table, own: &own };
            // SAFETY: live tables, read after everything above was written.
            let pre = unsafe { Preload::read(&table, &own, &h, guess) };
            let want_open = table.get(1).is_some_and(|p| answering(p, &h));
            assert_eq!(pre.answering(&h), want_open, "trial {trial}: whether the responder answers");
            let want = seen(check_write(&tables, &h, idx, &segs));
            assert_eq!(seen(check_write(&pre, &h, idx, &segs)), want, "trial {trial}: {guess:?} {segs:x?}");
            let local_hit = len != 0 && key_slot(lkey).is_some() && key_slot(lkey) == key_slot(guess.lkey);
            let remote_hit = pre.peer_ok && key_slot(rkey).is_some() && key_slot(rkey) == key_slot(guess.rkey);
            if local_hit && remote_hit {
                hits += 1;
                passed += want.is_some() as u32;
            } else {
                misses += 1;
            }
        }
        assert!(
            hits > 4_000 && misses > 4_000 && passed > 1_000,
            "hits {hits}, misses {misses}, passed {passed}"
        );
    }
}
