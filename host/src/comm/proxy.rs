//! The CPU-proxy transport's host side: the thread that turns the kernels'
//! requests into WQEs (the device side, the request format and the
//! contract are in `doorbell_kernels::transport::proxy`).
//!
//! ## Set-up (collective: the first [`Communicator::proxy`] of every rank)
//! The same NIC set-up as IBGDA (`comm::ibgda`: the port, the heap's
//! region, one QP per peer, endpoints exchanged, RTS, the NIC started),
//! except that the rings and the scratch words lie in mapped host memory,
//! where this thread writes WQEs and reads CQEs, and that the soft NIC's
//! engine orders with the rings at system scope (the CPU is the other
//! side). Then the request ring
//! ([`RING_SLOTS`] slots and the published words, mapped host memory) and
//! the kernels' reservation counter (device memory), and the thread.
//!
//! ## The thread
//! Each sweep it takes the requests published in ticket order (at most a
//! ring's worth), writes their WQEs — a WRITE or READ per chunk of the
//! largest message, then the signal's WRITE (`Set`, from the slot's
//! scratch word) or fetch-add (`Add`) on the same QP, only a request's last
//! WQE signaled — rings each QP it posted to once, consumes every CQE
//! present, and publishes `taken` and `done`. It repeats the kernels'
//! checks (peer, heap ranges, operation) and refuses a request that fails
//! them with [`PROXY_ERR_REFUSED`], as it reports an error completion with
//! [`PROXY_ERR_COMPLETION`] and a NIC that stops completing within the
//! communicator's wait budget with [`PROXY_ERR_STALLED`]; after a failure
//! it takes nothing more (`Communicator::proxy_reset` starts afresh). An
//! idle thread spins for a while, then sleeps in short naps, so a rank
//! that is not communicating leaves its CPU to others.
//!
//! A ConnectX NIC would be driven by the same code (the WQEs are the mlx5
//! bytes the IBGDA transport writes); it has run over the soft NIC only.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use doorbell_kernels::mlx5::cq::{classify_cqe, CqError, CqeState};
use doorbell_kernels::mlx5::queue::{publish_and_ring, wqe_slot};
use doorbell_kernels::mlx5::wqe::{write_atomic_fetch_add_wqe, write_rdma_read_wqe, write_rdma_write_wqe, Transfer, FLAG_SIGNALED};
use doorbell_kernels::transport::ibgda::{IbgdaQp, RegRegion, REG_SLOTS};
use doorbell_kernels::transport::proxy::{
    proxy_error_parts, proxy_error_ticket, proxy_error_word, ProxyRequest, ProxyTail, ProxyWords, OP_GET, OP_PUT, OP_SIGNAL,
    PROXY_ERR_COMPLETION, PROXY_ERR_REFUSED, PROXY_ERR_STALLED, REQ_SIGNAL,
};
use doorbell_kernels::transport::routed::ROUTE_WORDS;
use doorbell_kernels::transport::{Proxy, SignalOp};

use super::ibgda::{IbgdaOptions, IbgdaState, RdmaPeers};
use super::Communicator;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, MappedBuffer};

/// Slots of the request ring (a power of two).
pub const RING_SLOTS: u32 = 1024;
/// Requests a sweep takes before it rings the doorbells and polls the CQs.
const SWEEP: u64 = 64;
/// Idle sweeps spent spinning before the thread naps.
const IDLE_SPINS: u32 = 20_000;
/// An idle thread's nap.
const NAP: Duration = Duration::from_micros(20);

/// [`PROXY_ERR_REFUSED`] reasons (the error word's low byte).
mod refused {
    pub const PEER: u64 = 1;
    pub const REMOTE_RANGE: u64 = 2;
    pub const LOCAL_RANGE: u64 = 3;
    pub const SIGNAL: u64 = 4;
    pub const OP: u64 = 5;
}

/// What a failure of the proxy thread was, in words: `kind` is a
/// `PROXY_ERR_*`, `low` the completion's syndrome or the refusal's reason.
/// [`Communicator::proxy_check`] and the kernels' reports
/// ([`ErrorKind::ProxyFailed`](doorbell_kernels::heap::ErrorKind::ProxyFailed)) say it alike.
pub(crate) fn failure_words(kind: u64, low: u64) -> String {
    match kind {
        PROXY_ERR_COMPLETION => {
            let syn = doorbell_kernels::mlx5::cq::CqeSyndrome::from_u8(low as u8);
            format!("completion error {} (syndrome {:#04x})", syn.c_name(), low as u8)
        }
        PROXY_ERR_REFUSED => {
            let why = match low {
                refused::PEER => "no such peer",
                refused::REMOTE_RANGE => "the remote range is outside the peer's heap",
                refused::LOCAL_RANGE => "the local range is neither heap nor registered memory",
                refused::SIGNAL => "the signal word is outside the heap or misaligned, or its operation unknown",
                refused::OP => "an unknown operation",
                _ => "an unknown reason",
            };
            format!("refused by the proxy's checks: {why} (reason {low})")
        }
        PROXY_ERR_STALLED => "the NIC made no progress within the wait budget".to_string(),
        k => format!("error word {k:#x}"),
    }
}

/// What the proxy thread did, for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Requests taken out of the ring.
    pub requests: u64,
    /// WQEs written.
    pub wqes: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// CQEs consumed.
    pub cqes: u64,
}

/// The counters the thread updates and the host reads.
#[derive(Default)]
struct SharedStats {
    requests: AtomicU64,
    wqes: AtomicU64,
    doorbells: AtomicU64,
    cqes: AtomicU64,
    /// Set by `Communicator::proxy_hold`: the thread takes no new requests.
    held: AtomicBool,
}

/// This rank's proxy. Field order is drop order after the thread has
/// stopped (in the drop): the queues (the NIC stops first inside), then
/// the ring and the tail.
pub(crate) struct ProxyState {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    stats: Arc<SharedStats>,
    /// Registered buffers, as the thread checks them.
    regs: Arc<std::sync::RwLock<Vec<RegRegion>>>,
    queues: Option<IbgdaState>,
    _shared: MappedBuffer<u64>,
    tail: DeviceBuffer<u64>,
    handle: Proxy,
}

// SAFETY: the raw pointers inside (the handle) name memory this state owns.
unsafe impl Send for ProxyState {}

impl Drop for ProxyState {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("rank {}: the CPU proxy thread panicked", self.handle.rank);
            }
        }
        // The queues next: their drop stops the NIC before any ring is freed.
        drop(self.queues.take());
    }
}

/// One QP as the thread drives it.
struct Queue {
    qp: IbgdaQp,
    /// WQEs written (wrapping).
    producer: u32,
    /// WQEs rung.
    rung: u32,
    /// The last written WQE's ctrl head (what the doorbell carries).
    head: u64,
    /// WQEs known complete.
    completed: u32,
    /// CQ consumer index.
    ci: u32,
}

/// A request taken and posted, not yet known complete.
struct Pending {
    ticket: u64,
    queue: usize,
    /// The index past its last WQE.
    end: u32,
}

/// The thread's view of the request stream.
struct Tickets {
    /// The next ticket to take.
    next: u64,
    /// Published: every request before it has completed.
    done: u64,
    /// Published: every request before it is read out of its slot.
    taken: u64,
    /// Requests taken and not yet completed, oldest first.
    pending: VecDeque<Pending>,
    /// The ticket of the published failure, if any.
    failed: Option<u64>,
}

/// What the thread needs, all plain data (the pointers name memory the
/// state owns, which outlives the thread).
struct Worker {
    rank: u32,
    world: u32,
    heap_base: u64,
    heap_bytes: u64,
    heap_lkey: u32,
    max_msg: u64,
    budget: Duration,
    regs: Arc<std::sync::RwLock<Vec<RegRegion>>>,
    ring: usize,
    words: usize,
    slots: u64,
    queues: Vec<Queue>,
    /// The doorbells are a NIC's register (mlx5's UAR), which may be
    /// mapped write-combining: a full fence after a sweep's doorbells
    /// sends them out of the CPU's buffers at once.
    flush_doorbells: bool,
    stop: Arc<AtomicBool>,
    stats: Arc<SharedStats>,
}

/// `a` is at or past `b` (WQE indices within half the counter space).
fn reached(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

// SAFETY: the raw pointers inside (QP rings, the ring, the words) name
// memory the state owns, which outlives the thread (joined in its drop).
unsafe impl Send for Worker {}

impl Worker {
    fn words(&self) -> *mut ProxyWords {
        self.words as *mut ProxyWords
    }

    fn publish(&self, field: fn(*mut ProxyWords) -> *mut u64, v: u64) {
        // SAFETY: a word of the mapped ProxyWords; the kernels read it with
        // acquire loads at system scope.
        unsafe { (*(field(self.words()) as *const AtomicU64)).store(v, Ordering::Release) }
    }

    /// Publishes the first failure (the ticket first, then the word).
    fn fail(&self, kind: u64, peer: u32, low: u64, ticket: u64) {
        self.publish(|w| unsafe { &raw mut (*w).error_ticket }, ticket);
        self.publish(|w| unsafe { &raw mut (*w).error }, proxy_error_word(kind, peer, low, ticket));
        tracing::warn!(
            "rank {}: CPU proxy: request {ticket} to rank {peer} failed (kind {kind}, code {low:#x}); it takes no more requests until a reset",
            self.rank
        );
    }

    /// The request in the slot of `ticket`, once published.
    fn take(&self, ticket: u64) -> Option<ProxyRequest> {
        let slot = (self.ring as *mut ProxyRequest).wrapping_add((ticket & (self.slots - 1)) as usize);
        // SAFETY: a slot of the mapped ring; `seq` is published last with
        // release by the kernel, so the fields read after it are the request's.
        unsafe {
            if (*(slot as *const AtomicU64)).load(Ordering::Acquire) != ticket + 1 {
                return None;
            }
            Some(std::ptr::read_volatile(slot))
        }
    }

    /// The local key of `[addr, addr + bytes)`, if the NIC can reach it.
    fn local_key(&self, addr: u64, bytes: u64) -> Option<u32> {
        let off = addr.wrapping_sub(self.heap_base);
        if bytes == 0 || off <= self.heap_bytes && bytes <= self.heap_bytes - off {
            return Some(self.heap_lkey);
        }
        self.regs.read().unwrap_or_else(|p| p.into_inner()).iter().find_map(|r| {
            let o = addr.wrapping_sub(r.addr);
            (o <= r.len && bytes <= r.len - o).then_some(r.lkey)
        })
    }

    /// The kernels' checks again: `Err(reason)` for a request that fails them.
    fn check(&self, r: &ProxyRequest) -> std::result::Result<(), u64> {
        if r.peer >= self.world {
            return Err(refused::PEER);
        }
        let in_heap = |off: u64, n: u64| off <= self.heap_bytes && n <= self.heap_bytes - off;
        match r.op {
            OP_PUT | OP_GET => {
                if !in_heap(r.remote_off, r.bytes) {
                    return Err(refused::REMOTE_RANGE);
                }
                if self.local_key(r.local, r.bytes).is_none() {
                    return Err(refused::LOCAL_RANGE);
                }
            }
            OP_SIGNAL if r.flags as u32 & REQ_SIGNAL != 0 => {}
            _ => return Err(refused::OP),
        }
        let signal = r.op != OP_GET && r.flags as u32 & REQ_SIGNAL != 0;
        if signal && (!in_heap(r.sig_off, 8) || !r.sig_off.is_multiple_of(8) || r.sig_op > SignalOp::Add as u16) {
            return Err(refused::SIGNAL);
        }
        if r.op == OP_GET && r.flags != 0 {
            return Err(refused::OP);
        }
        Ok(())
    }

    /// WQEs `r` takes.
    fn wqes(&self, r: &ProxyRequest) -> u64 {
        let data = if r.op == OP_SIGNAL { 0 } else { r.bytes.div_ceil(self.max_msg) };
        data + (r.flags as u32 & REQ_SIGNAL != 0) as u64
    }

    /// Consumes every CQE of queue `i` present. `Err((syndrome, index))` on
    /// an error completion.
    fn poll(&mut self, i: usize) -> std::result::Result<(), (u8, u32)> {
        let q = &mut self.queues[i];
        let size = q.qp.qp.cq_size;
        let mut got = 0;
        loop {
            let cqe = q.qp.qp.cq.wrapping_add(((q.ci & (size - 1)) as usize) * 16);
            // SAFETY: a CQE of the QP's mapped CQ; its last word (owner bit)
            // is read first with acquire, the rest after it.
            let w: [u32; 16] = unsafe {
                let last = (*(cqe.add(15) as *const std::sync::atomic::AtomicU32)).load(Ordering::Acquire);
                let mut w = [0u32; 16];
                for (k, v) in w.iter_mut().enumerate().take(15) {
                    *v = std::ptr::read_volatile(cqe.add(k));
                }
                w[15] = last;
                w
            };
            let (counter, err) = match classify_cqe(&w, q.ci, size) {
                CqeState::Empty { .. } => break,
                CqeState::Done(c) => (c.wqe_counter, None),
                CqeState::Error(CqError::Failed { wqe_counter, syndrome, .. }) => (wqe_counter, Some(syndrome.as_u8())),
                CqeState::Error(CqError::UnexpectedOpcode { wqe_counter, .. }) => (wqe_counter, Some(0xff)),
                CqeState::Error(CqError::Timeout { wqe_counter, .. }) => (wqe_counter, Some(0xfe)),
            };
            let at = q.completed.wrapping_add(counter.wrapping_sub(q.completed as u16) as u32);
            q.ci = q.ci.wrapping_add(1);
            got += 1;
            // SAFETY: the CQ's doorbell record (mapped).
            unsafe { q.qp.qp.set_cq_doorbell_record(q.ci) };
            if let Some(s) = err {
                self.stats.cqes.fetch_add(got, Ordering::Relaxed);
                return Err((s, at));
            }
            q.completed = at.wrapping_add(1);
        }
        self.stats.cqes.fetch_add(got, Ordering::Relaxed);
        Ok(())
    }

    /// Writes WQEs `from..to` of `r` (its chunks, then its signal) on queue
    /// `i`, the last of them signaled (room checked by the caller); returns
    /// the index past them.
    fn write(&mut self, i: usize, r: &ProxyRequest, from: u64, to: u64) -> u32 {
        let lkey = self.local_key(r.local, r.bytes).unwrap_or(self.heap_lkey);
        let q = &mut self.queues[i];
        let chunks = if r.op == OP_SIGNAL { 0 } else { r.bytes.div_ceil(self.max_msg) };
        for k in from..to {
            let idx = q.producer;
            let flags = if k + 1 == to { FLAG_SIGNALED } else { 0 };
            // SAFETY: the slot is free (room checked); the mapped SQ.
            let slot = unsafe { wqe_slot(&q.qp.qp, idx) };
            let head = if k < chunks {
                let off = k * self.max_msg;
                let t = Transfer {
                    raddr: q.qp.remote_base + r.remote_off + off,
                    rkey: q.qp.rkey,
                    laddr: r.local + off,
                    lkey,
                    len: (r.bytes - off).min(self.max_msg) as u32,
                };
                // SAFETY: as above.
                unsafe {
                    if r.op == OP_GET {
                        write_rdma_read_wqe(slot, idx as u16, q.qp.qp.qpn, &t, flags)
                    } else {
                        write_rdma_write_wqe(slot, idx as u16, q.qp.qp.qpn, &t, flags)
                    }
                }
            } else {
                let scratch = q.qp.scratch.wrapping_add((idx & (q.qp.qp.sq_size - 1)) as usize);
                let t = Transfer {
                    raddr: q.qp.remote_base + r.sig_off,
                    rkey: q.qp.rkey,
                    laddr: scratch as u64,
                    lkey: q.qp.scratch_lkey,
                    len: 8,
                };
                // SAFETY: one scratch word per slot, free with the slot.
                unsafe {
                    if r.sig_op == SignalOp::Add as u16 {
                        write_atomic_fetch_add_wqe(slot, idx as u16, q.qp.qp.qpn, &t, r.sig_value, flags)
                    } else {
                        std::ptr::write_volatile(scratch, r.sig_value);
                        write_rdma_write_wqe(slot, idx as u16, q.qp.qp.qpn, &t, flags)
                    }
                }
            };
            q.head = head;
            q.producer = idx.wrapping_add(1);
        }
        self.stats.wqes.fetch_add(to - from, Ordering::Relaxed);
        q.producer
    }

    /// Rings every queue with WQEs written since its last doorbell.
    fn ring_all(&mut self) {
        let mut rang = false;
        for q in &mut self.queues {
            if q.rung != q.producer {
                // SAFETY: the QP's mapped doorbell record, and the address
                // this process rings its doorbell at.
                unsafe { publish_and_ring(&q.qp.qp, q.producer, q.head) };
                q.rung = q.producer;
                rang = true;
                self.stats.doorbells.fetch_add(1, Ordering::Relaxed);
            }
        }
        if rang && self.flush_doorbells {
            std::sync::atomic::fence(Ordering::SeqCst);
        }
    }

    /// Polls every queue with WQEs outstanding, retires the requests whose
    /// WQEs have all completed and publishes `done`. Returns whether
    /// anything completed, and the failed request of the lowest ticket as
    /// `(peer, syndrome, ticket)` (queues fail independently: the earliest
    /// request is the one whose waiters must hear of it).
    fn advance(&mut self, t: &mut Tickets) -> (bool, Option<(u32, u8, u64)>) {
        let mut moved = false;
        let mut first: Option<(u32, u8, u64)> = None;
        for i in 0..self.queues.len() {
            let before = self.queues[i].completed;
            if before == self.queues[i].rung {
                continue;
            }
            if let Err((s, at)) = self.poll(i) {
                let ticket = ticket_of(&t.pending, i, at).unwrap_or(t.next);
                if first.is_none_or(|f| ticket < f.2) {
                    first = Some((i as u32 / self.queues_per_peer(), s, ticket));
                }
            }
            moved |= self.queues[i].completed != before;
        }
        while let Some(p) = t.pending.front() {
            if !reached(self.queues[p.queue].completed, p.end) {
                break;
            }
            t.pending.pop_front();
            moved = true;
        }
        let done = t.pending.front().map_or(t.next, |p| p.ticket);
        if done != t.done {
            t.done = done;
            self.publish(|w| unsafe { &raw mut (*w).done }, done);
        }
        if t.taken != t.next {
            // The requests before `next` are read out of their slots.
            t.taken = t.next;
            self.publish(|w| unsafe { &raw mut (*w).taken }, t.next);
        }
        (moved, first)
    }

    /// Publishes a failure of `ticket` unless one of an earlier or the
    /// same ticket is published already (a later-found failure of an
    /// earlier request moves the published ticket back: its waiters must
    /// hear of it too).
    fn fail_at(&self, t: &mut Tickets, kind: u64, peer: u32, low: u64, ticket: u64) {
        if t.failed.is_none_or(|f| ticket < f) {
            self.fail(kind, peer, low, ticket);
            t.failed = Some(ticket);
        }
    }

    /// Waits for room for `step` more WQEs on queue `i`, ringing what is
    /// written and retiring what completes meanwhile (so waiters of
    /// earlier requests are answered while a long request goes in
    /// parts). False when it must stop: a failure published, no
    /// completion on the queue within the budget (published as a stalled
    /// NIC, naming the queue's oldest request), or the thread told to stop.
    fn room(&mut self, t: &mut Tickets, i: usize, step: u64, sq: u64, peer: u32) -> bool {
        let mut start = Instant::now();
        let mut seen = self.queues[i].completed;
        while self.queues[i].producer.wrapping_sub(self.queues[i].completed) as u64 + step > sq {
            if self.stop.load(Ordering::Acquire) {
                return false;
            }
            self.ring_all();
            let (_, err) = self.advance(t);
            if let Some((p, s, ticket)) = err {
                self.fail_at(t, PROXY_ERR_COMPLETION, p, s as u64, ticket);
                return false;
            }
            if self.queues[i].completed != seen {
                seen = self.queues[i].completed;
                start = Instant::now();
            } else if start.elapsed() > self.budget {
                let ticket = ticket_of(&t.pending, i, seen).unwrap_or(t.next);
                self.fail_at(t, PROXY_ERR_STALLED, peer, 0, ticket);
                return false;
            }
            std::hint::spin_loop();
        }
        true
    }

    fn run(mut self) {
        let mut t = Tickets {
            next: 0,
            done: 0,
            taken: 0,
            pending: VecDeque::new(),
            failed: None,
        };
        let mut idle = 0u32;
        // When the oldest waiting request last saw a completion (or was taken).
        let mut progress = Instant::now();
        let sq = self.queues.first().map(|q| q.qp.qp.sq_size).unwrap_or(0) as u64;
        while !self.stop.load(Ordering::Acquire) {
            let mut busy = false;
            // Take and post.
            let first = t.next;
            while t.failed.is_none() && t.next - first < SWEEP && !self.stats.held.load(Ordering::Acquire) {
                let Some(r) = self.take(t.next) else { break };
                busy = true;
                if let Err(why) = self.check(&r) {
                    let next = t.next;
                    self.fail_at(&mut t, PROXY_ERR_REFUSED, r.peer, why, next);
                    break;
                }
                let i = r.peer as usize;
                // A queue's worth of WQEs at a time (a put of more chunks
                // than the SQ holds goes in parts, each part's last WQE
                // signaled so that its room comes back).
                let n = self.wqes(&r);
                let (mut k, mut end) = (0u64, self.queues[i].producer);
                while k < n && t.failed.is_none() {
                    let step = (n - k).min(sq);
                    if !self.room(&mut t, i, step, sq, r.peer) {
                        break;
                    }
                    end = self.write(i, &r, k, k + step);
                    k += step;
                }
                if k < n {
                    // A failure, or told to stop.
                    break;
                }
                t.pending.push_back(Pending {
                    ticket: t.next,
                    queue: i,
                    end,
                });
                t.next += 1;
                self.stats.requests.fetch_add(1, Ordering::Relaxed);
            }
            self.ring_all();
            // Complete.
            let (moved, err) = self.advance(&mut t);
            if let Some((p, s, ticket)) = err {
                self.fail_at(&mut t, PROXY_ERR_COMPLETION, p, s as u64, ticket);
            }
            if moved || busy || t.pending.is_empty() {
                progress = Instant::now();
            } else if t.failed.is_none() && progress.elapsed() > self.budget {
                // WQEs outstanding and none completed for the whole budget.
                if let Some(&Pending { ticket, queue, .. }) = t.pending.front() {
                    let peer = queue as u32 / self.queues_per_peer();
                    self.fail_at(&mut t, PROXY_ERR_STALLED, peer, 0, ticket);
                }
            }
            busy |= moved;
            if busy || !t.pending.is_empty() {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle > IDLE_SPINS {
                std::thread::sleep(NAP);
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn queues_per_peer(&self) -> u32 {
        (self.queues.len() as u32 / self.world).max(1)
    }
}

/// The ticket of the first pending request on queue `i` whose WQEs reach
/// past index `at` (the request a failed WQE belongs to).
fn ticket_of(pending: &VecDeque<Pending>, i: usize, at: u32) -> Option<u64> {
    pending.iter().find(|p| p.queue == i && !reached(at, p.end)).map(|p| p.ticket)
}

impl Communicator {
    /// The CPU-proxy transport's device handle (a kernel argument): kernels
    /// hand each put, get and signal to a host thread of this rank, which
    /// posts the WQEs on the NIC (the soft NIC here, a ConnectX NIC by the
    /// same code) — NVSHMEM's CPU-proxy shape, to set beside IBGDA.
    ///
    /// **Collective the first time** (every rank calls it): sets the NIC's
    /// QPs up as [`Communicator::ibgda`] does, from
    /// [`IbgdaOptions::from_env`] with one QP per peer, their rings in
    /// mapped host memory, and starts the thread. It cannot share the NIC
    /// with IBGDA: while one is set up the other is refused (tear the
    /// other down first: [`Communicator::ibgda_close`],
    /// [`Communicator::proxy_reset`]).
    ///
    /// Every rank, this one included, is reached through the proxy, except
    /// under `DOORBELL_NODES`: the ranks of this rank's (modeled) node are
    /// then reached by load/store ([`Self::proxy_routed`] with
    /// [`RdmaPeers::Nodes`]).
    pub fn proxy(&self) -> Result<Proxy> {
        self.proxy_state(None)
    }

    /// The proxy's handle with its routes set by `peers`, as
    /// [`Self::routed_with`] sets the routed transport's: a rank on another
    /// host, or one `peers` sends through the NIC, is reached through the
    /// proxy; every other rank (this one included) by load/store
    /// ([`Proxy::direct`]). With [`RdmaPeers::Nodes`] the ranks of this
    /// rank's node are reached by load/store and the others through the
    /// proxy; with [`RdmaPeers::All`] every peer through the proxy. Sets
    /// the proxy up as [`Self::proxy`] does the first time (collective).
    pub fn proxy_routed(&self, peers: &RdmaPeers) -> Result<Proxy> {
        let mut h = self.proxy()?;
        h.p2p = self.p2p_handle();
        h.direct = self.direct_bits(peers)?;
        Ok(h)
    }

    /// [`Self::proxy_routed`] with `peers`, else [`Self::proxy`] (its own
    /// routes: `DOORBELL_NODES`, or every pair through the proxy).
    pub(crate) fn proxy_with_routes(&self, peers: Option<&RdmaPeers>) -> Result<Proxy> {
        match peers {
            Some(p) => self.proxy_routed(p),
            None => self.proxy(),
        }
    }

    /// The complement of [`Self::rdma_bits`] over the world.
    fn direct_bits(&self, peers: &RdmaPeers) -> Result<[u64; ROUTE_WORDS]> {
        let rdma = self.rdma_bits(peers)?;
        let mut direct = [0u64; ROUTE_WORDS];
        for p in 0..self.size {
            if rdma[p / 64] >> (p % 64) & 1 == 0 {
                direct[p / 64] |= 1 << (p % 64);
            }
        }
        Ok(direct)
    }

    /// As [`Self::proxy`], with explicit options (used only if the proxy
    /// is not set up yet; collective then). `qps_per_peer` is taken as 1
    /// (the proxy's one QP per peer keeps each peer's requests in order).
    pub fn proxy_with(&self, opts: &IbgdaOptions) -> Result<Proxy> {
        self.proxy_state(Some(opts))
    }

    fn proxy_state(&self, opts: Option<&IbgdaOptions>) -> Result<Proxy> {
        let mut guard = self.proxy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = guard.as_ref() {
            return Ok(st.handle);
        }
        let ibgda_up = self.ibgda_if_set_up().is_some();
        self.refuse_second_nic_user(ibgda_up, "the CPU proxy", "IBGDA", "ibgda_close()")?;
        let mut opts = match opts {
            Some(o) => o.clone(),
            None => IbgdaOptions::from_env()?,
        };
        opts.qps_per_peer = 1;
        // The CPU rings the doorbells and reads the CQEs: the soft NIC's
        // engine orders with it at system scope (its acquire after a
        // doorbell, its CQE releases), even on the ranks' own GPU.
        opts.engine_sys_scope = true;
        let queues = self.queue_setup(opts.clone(), true)?;
        let st = self.proxy_start(queues, &opts)?;
        let h = st.handle;
        *guard = Some(st);
        Ok(h)
    }

    /// Registers `len` bytes at the device address `addr` with the proxy's
    /// NIC, so puts may read from it and gets write into it; returns the
    /// updated handle (earlier handles do not know the buffer). At most
    /// [`REG_SLOTS`] buffers. The handle has [`Self::proxy`]'s routes;
    /// for others call [`Self::proxy_routed`] after registering (its
    /// handles carry every buffer registered so far).
    ///
    /// # Safety
    /// `addr..addr + len` is device memory of this rank that stays
    /// allocated until this communicator is dropped or the proxy reset.
    pub unsafe fn proxy_register(&self, addr: u64, len: usize) -> Result<Proxy> {
        self.proxy()?;
        let mut guard = self.proxy.lock().unwrap_or_else(|p| p.into_inner());
        let st = guard.as_mut().expect("set up above");
        let queues = st.queues.as_mut().expect("present until the drop");
        // SAFETY: the caller's contract.
        let r = unsafe { queues.register(self.rank, addr, len, "the CPU proxy") }?;
        st.regs.write().unwrap_or_else(|p| p.into_inner()).push(r);
        let n = st.handle.nreg as usize;
        st.handle.reg[n] = r;
        st.handle.nreg += 1;
        Ok(st.handle)
    }

    /// Collective: stops this rank's proxy thread and tears its QPs down
    /// once every rank has come here (a peer's get or put may still be
    /// answered by this rank's QPs until then); the next
    /// [`Communicator::proxy`] sets it up afresh (collective then). Call it
    /// on every rank, with no kernel using the handle running.
    pub fn proxy_reset(&self) -> Result<()> {
        self.world.barrier()?;
        drop(self.proxy.lock().unwrap_or_else(|p| p.into_inner()).take());
        self.nic_torn_down();
        self.world.barrier()?;
        Ok(())
    }

    /// What this rank's proxy thread has done so far (`None` when it is
    /// not set up).
    pub fn proxy_stats(&self) -> Option<ProxyStats> {
        self.proxy.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|st| ProxyStats {
            requests: st.stats.requests.load(Ordering::Relaxed),
            wqes: st.stats.wqes.load(Ordering::Relaxed),
            doorbells: st.stats.doorbells.load(Ordering::Relaxed),
            cqes: st.stats.cqes.load(Ordering::Relaxed),
        })
    }

    /// Holds (`true`) or releases (`false`) this rank's proxy thread:
    /// while held it takes no new requests (those it has taken still
    /// complete), so a kernel that goes on posting fills the request ring
    /// ([`PROXY_RING_SLOTS`](crate::comm::PROXY_RING_SLOTS)) and then waits
    /// for room, within its wait budget. For tests and for watching a full
    /// ring; an error when the proxy is not set up.
    pub fn proxy_hold(&self, held: bool) -> Result<()> {
        let guard = self.proxy.lock().unwrap_or_else(|p| p.into_inner());
        let st = guard
            .as_ref()
            .ok_or_else(|| Error::comm(format!("rank {}: proxy_hold: the CPU proxy is not set up", self.rank)))?;
        st.stats.held.store(held, Ordering::Release);
        Ok(())
    }

    /// The proxy's published failure as an error naming the request's
    /// ticket, the peer and what failed (`Ok` while healthy or not set up).
    /// After a failure the proxy takes no more requests: reset it
    /// ([`Communicator::proxy_reset`]).
    pub fn proxy_check(&self) -> Result<()> {
        let guard = self.proxy.lock().unwrap_or_else(|p| p.into_inner());
        let Some(st) = guard.as_ref() else { return Ok(()) };
        // SAFETY: the mapped words, read as the kernels read them.
        let (e, t) = unsafe {
            let w = st.handle.words;
            (
                (*(&raw const (*w).error as *const AtomicU64)).load(Ordering::Acquire),
                std::ptr::read_volatile(&raw const (*w).error_ticket),
            )
        };
        if e == 0 {
            // A poster that found the request ring full for its whole
            // budget marked the handle wedged (its later posts fail at
            // once), with nothing published by the thread.
            let tail = st.tail.to_host()?;
            let wedged_at = std::mem::offset_of!(ProxyTail, wedged) / 8;
            if tail.get(wedged_at).is_some_and(|&w| w != 0) {
                return Err(Error::comm(format!(
                    "rank {}: CPU proxy: a kernel found the request ring full for its whole wait budget (the proxy took \
                     nothing: held, or stuck behind a request); the handle is wedged and every later post fails at once \
                     until proxy_reset()",
                    self.rank
                )));
            }
            return Ok(());
        }
        let t = proxy_error_ticket(e, t);
        let (kind, peer, low) = proxy_error_parts(e);
        let what = failure_words(kind, low);
        Err(Error::comm(format!(
            "rank {}: CPU proxy: request {t} to rank {peer}: {what}; it takes no more requests until proxy_reset()",
            self.rank
        )))
    }

    /// Collective: `what` may not be set up while `other` is on any rank
    /// (`up`: on this one), as both would drive the same NIC port; the
    /// error names the rank and `reset`, the way out.
    pub(super) fn refuse_second_nic_user(&self, up: bool, what: &str, other: &str, reset: &str) -> Result<()> {
        let all = self.world.all_gather_bytes(&[up as u8])?;
        match all.iter().position(|b| b.first() == Some(&1)) {
            Some(r) => Err(Error::comm(format!(
                "rank {}: {what} cannot be set up while {other} is (rank {r} has it): both would drive the same NIC port; \
                 call {reset} on every rank first",
                self.rank
            ))),
            None => Ok(()),
        }
    }

    /// The soft NIC under the proxy, when that is its NIC.
    pub(super) fn proxy_soft_nic(&self) -> Option<crate::nic::soft::SoftDevice> {
        let guard = self.proxy.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref()?.queues.as_ref()?.soft().map(|s| s.device().clone())
    }

    pub(super) fn proxy_if_set_up(&self) -> bool {
        self.proxy.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    fn proxy_start(&self, queues: IbgdaState, opts: &IbgdaOptions) -> Result<ProxyState> {
        let ib = queues.handle();
        let words_len = std::mem::size_of::<ProxyWords>() / 8;
        let ring_len = RING_SLOTS as usize * std::mem::size_of::<ProxyRequest>() / 8;
        // Dropped after the thread joined and the NIC stopped, with no
        // kernel using the handle (proxy_reset's and the drop's contract).
        let shared = self.device.alloc_mapped_idle_on_drop::<u64>(words_len + ring_len)?;
        if shared.host_ptr() as u64 != shared.device_ptr() as u64 {
            return Err(Error::comm(
                "mapped host memory has a device address other than its host address: the CPU proxy needs unified addressing".to_string(),
            ));
        }
        let tail = self.device.alloc_zeroed::<u64>(std::mem::size_of::<ProxyTail>() / 8)?;
        // Modeled nodes: the ranks of this node by load/store. Otherwise
        // every rank, this one too, through the proxy.
        let direct = match RdmaPeers::nodes_from_env(self.size)? {
            Some(p) => self.direct_bits(&p)?,
            None => [0; ROUTE_WORDS],
        };
        let base = shared.host_ptr() as usize;
        let ring = base + std::mem::size_of::<ProxyWords>();
        let handle = Proxy {
            rank: ib.rank,
            world: ib.world,
            heap_bytes: ib.heap_bytes,
            local_base: ib.local_base,
            budget_ns: ib.budget_ns,
            ring: ring as *mut ProxyRequest,
            words: base as *const ProxyWords,
            tail: tail.as_raw() as *mut ProxyTail,
            slots: RING_SLOTS,
            nreg: 0,
            reg: [RegRegion::default(); REG_SLOTS],
            p2p: self.p2p_handle(),
            direct,
        };
        let queue_list = queues
            .host_qp_table()
            .into_iter()
            .map(|qp| Queue {
                qp,
                producer: 0,
                rung: 0,
                head: 0,
                completed: 0,
                ci: 0,
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(SharedStats::default());
        let regs = Arc::new(std::sync::RwLock::new(Vec::new()));
        let worker = Worker {
            rank: ib.rank,
            world: ib.world,
            heap_base: ib.local_base,
            heap_bytes: ib.heap_bytes,
            heap_lkey: ib.heap_lkey,
            max_msg: opts.max_msg as u64,
            budget: Duration::from_nanos(ib.budget_ns),
            regs: regs.clone(),
            ring,
            words: base,
            slots: RING_SLOTS as u64,
            queues: queue_list,
            flush_doorbells: queues.host_doorbell_is_mmio(),
            stop: stop.clone(),
            stats: stats.clone(),
        };
        let rank = self.rank;
        let thread = std::thread::Builder::new()
            .name(format!("doorbell-proxy-{rank}"))
            .spawn(move || worker.run())
            .map_err(|e| Error::comm(format!("rank {rank}: could not start the CPU proxy thread: {e}")))?;
        tracing::info!(
            "rank {rank}: CPU proxy over {}: {} QPs, {RING_SLOTS} request slots",
            queues.nic_describe(),
            self.size
        );
        Ok(ProxyState {
            stop,
            thread: Some(thread),
            stats,
            regs,
            queues: Some(queues),
            _shared: shared,
            tail,
            handle,
        })
    }
}
