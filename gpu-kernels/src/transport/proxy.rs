//! The CPU-proxy transport: the kernel writes a small request (operation,
//! peer, offsets, bytes, signal) into a ring in mapped host memory; a host
//! thread (`Communicator::proxy`) builds the WQEs, rings the NIC's doorbell,
//! polls the completions and reports them back in the same mapped memory.
//! The shape of NVSHMEM's IBRC / CPU-proxy path, behind the same contract
//! as [`super::Ibgda`] — so one kernel body runs over both, and the
//! difference between a GPU that posts its own WQEs and one that asks the
//! CPU to is measured on the same NIC.
//!
//! ## A request's life
//! 1. **Reserve**: one thread takes a ticket `t` (an atomic add on a
//!    counter in device memory).
//! 2. **Flow control**: it waits (bounded) until the proxy has taken
//!    ticket `t - slots` out of the ring ([`ProxyWords::taken`]).
//! 3. **Write**: the request's fields, then its `seq = t + 1` with release
//!    at system scope (the proxy reads `seq` with acquire).
//! 4. The proxy takes requests in ticket order, posts their WQEs on its QP
//!    to the peer (a WRITE per chunk of the NIC's largest message, then the
//!    signal's WQE on the same QP: the peer sees the data before the
//!    signal), rings each QP it posted to once per sweep, and advances
//!    [`ProxyWords::done`] past every request whose WQEs have completed, in
//!    ticket order.
//! 5. A blocking call waits (bounded) until `done > t`.
//!
//! **Errors.** An error completion, or a request the proxy refuses (its own
//! checks repeat the kernel's), is published in [`ProxyWords::error`] with
//! the ticket it stopped at; `done` never passes it, and waiters for that
//! ticket or later get [`CommError::Completion`] ([`CommError::Timeout`]
//! for a NIC that stopped completing), as does a post that finds the ring
//! full; the report names the request, its peer and why
//! ([`ErrorKind::ProxyFailed`](crate::heap::ErrorKind::ProxyFailed)). A reservation that finds
//! no room within the budget marks the handle **wedged** (later posters
//! fail at once: the ticket it holds is never written, so the proxy stops
//! there); `Communicator::proxy_reset` starts afresh.
//!
//! **Ordering.** Requests are executed in ticket order and every request
//! to a peer goes to the one QP of the proxy to that peer, executed in
//! order by the NIC: `fence` orders nothing extra, as with IBGDA. `quiet`
//! waits until every ticket reserved so far (by any thread of the rank) is
//! done — more than the contract asks, never less.
//!
//! **Nodes.** Where the ranks form (modeled) nodes (`DOORBELL_NODES`,
//! `Communicator::proxy_routed`), the handle reaches the ranks of its own
//! node by load/store ([`Proxy::direct`], through its [`P2p`] half), as the
//! routed transport does, and only the others through the proxy: every
//! call that names a peer goes wholly to that peer's route, `fence` is
//! P2P's when any rank is direct, `quiet(None)` completes both, and the
//! barrier stores its epoch into direct peers' slots and asks the proxy
//! for the rest. Without nodes every rank, this one included, goes
//! through the proxy. A direct peer gets P2P's ordering, which is the
//! contract's and no more: a block's blocking `put` then one thread's
//! `signal` needs the barrier and `fence` between them there, where the
//! proxy's one queue per peer happens to order them.

use super::ibgda::{RegRegion, REG_SLOTS};
use super::p2p::P2p;
use super::routed::{route_bit, ROUTE_WORDS};
use super::{Cmp, CommError, Coop, RawSignal, RawWait, RawXfer, SignalOp, Transport};
use crate::heap::{Arg, Call, Checked, HeapBounds, Reporter, EPOCH_OFFSET};
use crate::ptx;
use crate::sync::{Spin, Timeout};

/// [`ProxyRequest::op`]: a WRITE of `bytes` (then the signal, when
/// [`REQ_SIGNAL`] is set).
pub const OP_PUT: u32 = 1;
/// [`ProxyRequest::op`]: a READ of `bytes` into the local address.
pub const OP_GET: u32 = 2;
/// [`ProxyRequest::op`]: the signal alone.
pub const OP_SIGNAL: u32 = 3;
/// [`ProxyRequest::flags`]: the request carries a signal.
pub const REQ_SIGNAL: u32 = 1;

/// [`ProxyWords::error`]'s kind (bits 56..64): an error completion; the low
/// byte is the syndrome.
pub const PROXY_ERR_COMPLETION: u64 = 1;
/// [`ProxyWords::error`]'s kind: the proxy refused a request (its own checks
/// of peer, ranges and operation; the low byte says which).
pub const PROXY_ERR_REFUSED: u64 = 2;
/// [`ProxyWords::error`]'s kind: the NIC made no progress within the
/// proxy's budget.
pub const PROXY_ERR_STALLED: u64 = 3;

/// The error word [`ProxyWords::error`] for a failure of `kind` at request
/// `ticket` to `peer`: the kind in bits 56..64, the peer in bits 32..56, the
/// ticket's low 24 bits in bits 8..32 and `low` (a syndrome or a refusal's
/// reason) in the low byte.
#[inline(always)]
pub const fn proxy_error_word(kind: u64, peer: u32, low: u64, ticket: u64) -> u64 {
    kind << 56 | ((peer as u64) & 0xff_ffff) << 32 | (ticket & 0xff_ffff) << 8 | (low & 0xff)
}

/// The parts of error word `e` ([`proxy_error_word`]): kind, peer and low
/// byte (a syndrome or a refusal's reason).
#[inline(always)]
pub const fn proxy_error_parts(e: u64) -> (u64, u32, u64) {
    (e >> 56, ((e >> 32) & 0xff_ffff) as u32, e & 0xff)
}

/// The ticket of the failure in error word `e`, given the value read from
/// [`ProxyWords::error_ticket`]. The proxy rewrites both words when it finds
/// an earlier request failed, so a reader can see one failure's word beside
/// another's ticket; the word carries its own ticket's low 24 bits, and the
/// ticket is the one with those bits nearest the ticket word read (both
/// failures are among the requests taken and not yet completed, far fewer
/// than the 2^23 either way this resolves).
#[inline(always)]
pub const fn proxy_error_ticket(e: u64, ticket_word: u64) -> u64 {
    let tag = (e >> 8) & 0xff_ffff;
    // The difference tag - ticket_word, as a signed 24-bit number.
    let d = (tag.wrapping_sub(ticket_word) & 0xff_ffff) as u32;
    let d = ((d << 8) as i32 >> 8) as i64;
    ticket_word.wrapping_add(d as u64)
}

/// One request (64 bytes, one slot of the ring in mapped host memory).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyRequest {
    /// `ticket + 1` once the fields below are written (release, system
    /// scope); the proxy waits for exactly this value in slot `ticket %
    /// slots`.
    pub seq: u64,
    /// [`OP_PUT`], [`OP_GET`] or [`OP_SIGNAL`].
    pub op: u32,
    /// The target rank.
    pub peer: u32,
    /// Local address: a put's source, a get's destination (the heap or a
    /// registered buffer).
    pub local: u64,
    /// Offset in the peer's heap: a put's destination, a get's source.
    pub remote_off: u64,
    /// Bytes to move (0 for a signal alone).
    pub bytes: u64,
    /// Offset of the signal word in the peer's heap.
    pub sig_off: u64,
    /// The signal's value.
    pub sig_value: u64,
    /// [`SignalOp`] as its discriminant.
    pub sig_op: u16,
    /// [`REQ_SIGNAL`] or 0.
    pub flags: u16,
    /// Reserved, zero.
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<ProxyRequest>() == 64);

/// What the proxy publishes for the kernels (in mapped host memory, 64
/// bytes; the host writes, kernels read at system scope).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyWords {
    /// Tickets taken out of the ring: every slot of a ticket below it may
    /// be written again.
    pub taken: u64,
    /// Tickets done: every request below it has completed at its target.
    pub done: u64,
    /// 0, or the first failure ([`proxy_error_word`]): kind
    /// ([`PROXY_ERR_COMPLETION`], ...) in bits 56..64, the peer in bits
    /// 32..56, the ticket's low 24 bits in bits 8..32, the syndrome or
    /// reason in the low byte. Published (release) after `error_ticket`;
    /// read the ticket with [`proxy_error_ticket`].
    pub error: u64,
    /// The ticket the failure stopped at (`done` never passes it).
    pub error_ticket: u64,
    /// Reserved, zero.
    pub _reserved: [u64; 4],
}
const _: () = assert!(core::mem::size_of::<ProxyWords>() == 64);

/// The kernels' own words (device memory, 16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyTail {
    /// Tickets reserved.
    pub tail: u64,
    /// Nonzero once a reservation found no room within its budget.
    pub wedged: u64,
    /// A value of [`ProxyWords::taken`] a poster has read (a lower bound
    /// of it, raised with release): a reservation below `taken_seen +
    /// slots` has room without reading the mapped word over the bus.
    pub taken_seen: u64,
    /// The same for [`ProxyWords::done`]: waiters poll this device word,
    /// and one of them at a time (the holder of `poll_lock`) reads the
    /// mapped words over the bus and raises it.
    pub done_seen: u64,
    /// Nonzero while a waiter reads the mapped words.
    pub poll_lock: u32,
    /// Keeps the struct a whole number of u64 words.
    pub _pad: u32,
}

/// The CPU-proxy transport's device handle. Plain `#[repr(C)]` data made
/// by `Communicator::proxy`; calls may come from any number of warps and
/// blocks at once.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Proxy {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// Heap size in bytes, header included (same on every rank).
    pub heap_bytes: u64,
    /// This rank's heap base.
    pub local_base: u64,
    /// Spin budget of every wait, ns.
    pub budget_ns: u64,
    /// The request ring (`slots` entries, mapped host memory).
    pub ring: *mut ProxyRequest,
    /// The proxy's published words (mapped host memory).
    pub words: *const ProxyWords,
    /// The kernels' reservation counter (device memory).
    pub tail: *mut ProxyTail,
    /// Ring slots (a power of two).
    pub slots: u32,
    /// Entries of `reg` in use.
    pub nreg: u32,
    /// Registered local buffers (`Communicator::proxy_register`): puts may
    /// read from them, gets write into them. `lkey` is the proxy's.
    pub reg: [RegRegion; REG_SLOTS],
    /// Load/store to the peers whose bit is set in [`Self::direct`].
    pub p2p: P2p,
    /// Bit `p % 64` of word `p / 64` set: rank `p` is on this rank's
    /// (modeled) node and reached by load/store, not through the proxy.
    /// All clear unless the ranks form nodes (`DOORBELL_NODES`,
    /// `Communicator::proxy_routed`).
    pub direct: [u64; ROUTE_WORDS],
}
const _: () = assert!(core::mem::size_of::<Proxy>() == 64 + 24 * REG_SLOTS + core::mem::size_of::<P2p>() + 8 * ROUTE_WORDS);

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] plain data (integers, pointers, plain structs), 8-byte
// aligned, matching the struct-by-value parameter of the PTX entry point.
unsafe impl crate::KernelParam for Proxy {}

/// A request as the kernel hands it over.
#[derive(Clone, Copy)]
struct Req {
    op: u32,
    peer: u32,
    local: u64,
    remote_off: u64,
    bytes: u64,
    sig: Option<(u64, u64, SignalOp)>,
}

impl Checked for Proxy {
    #[inline(always)]
    fn bounds(&self) -> HeapBounds {
        HeapBounds {
            reporter: Reporter {
                rank: self.rank,
                local_base: self.local_base,
                budget_ns: self.budget_ns,
            },
            world: self.world,
            heap_bytes: self.heap_bytes,
        }
    }
}

impl Proxy {
    /// Whether `peer` is reached by load/store ([`Self::direct`]); false
    /// for ranks outside the world (the proxy's checks report the peer).
    #[inline(always)]
    pub fn is_direct(&self, peer: u32) -> bool {
        peer < self.world && route_bit(&self.direct, peer)
    }

    /// Whether any rank is reached by load/store.
    #[inline(always)]
    fn any_direct(&self) -> bool {
        let mut any = 0;
        let mut i = 0;
        while i < ROUTE_WORDS {
            any |= self.direct[i];
            i += 1;
        }
        any != 0
    }

    /// Whether `[addr, addr + bytes)` is memory the proxy's NIC can reach
    /// locally (the heap or a registered buffer); else the call is refused.
    #[inline(always)]
    fn check_local(&self, call: Call, arg: Arg, addr: u64, bytes: u64, peer: u32) -> Result<(), CommError> {
        let off = addr.wrapping_sub(self.local_base);
        if bytes == 0 || off <= self.heap_bytes && bytes <= self.heap_bytes - off {
            return Ok(());
        }
        let mut i = 0;
        while i < REG_SLOTS {
            let r = self.reg[i];
            let o = addr.wrapping_sub(r.addr);
            if (i as u32) < self.nreg && o <= r.len && bytes <= r.len - o {
                return Ok(());
            }
            i += 1;
        }
        Err(self.fail(CommError::OutOfRange { offset: off, bytes }, call, arg, peer, off))
    }

    /// The proxy's published failure as `(error word, ticket)`, if any.
    #[inline(always)]
    fn failure(&self) -> Option<(u64, u64)> {
        // SAFETY: the handle's words (mapped host memory). Acquire pairs
        // with the proxy's release of `error` after `error_ticket`.
        unsafe {
            let e = ptx::ld_acquire_sys_u64(&raw const (*self.words).error);
            (e != 0).then(|| {
                let t = ptx::ld_relaxed_sys_u64(&raw const (*self.words).error_ticket);
                (e, proxy_error_ticket(e, t))
            })
        }
    }

    /// The device error (and its report, naming the request the proxy
    /// stopped at and its peer) for the proxy's failure `(word, ticket)`:
    /// an error completion as one ([`CommError::Completion`]), a NIC that
    /// made no progress as a timeout, a refused request as a completion of
    /// syndrome 0.
    #[inline(always)]
    fn failed(&self, (e, ticket): (u64, u64), call: Call) -> CommError {
        let at = ((e >> 32) & 0xff_ffff) as u32;
        let kind = e >> 56;
        let err = match kind {
            PROXY_ERR_COMPLETION => CommError::Completion {
                peer: at,
                syndrome: e as u8,
            },
            PROXY_ERR_STALLED => CommError::Timeout(Timeout { seen: 0 }),
            _ => CommError::Completion { peer: at, syndrome: 0 },
        };
        let detail = ((kind as u32) << 8) | (e & 0xff) as u32;
        self.bounds().reporter.fail_proxy(err, call, at, ticket, detail)
    }

    /// Reserves a ticket and hands `r` to the proxy. One thread.
    ///
    /// # Safety
    /// The handle's ring, words and tail are valid.
    #[inline(always)]
    unsafe fn post(&self, r: &Req, call: Call) -> Result<u64, CommError> {
        // SAFETY: the caller's contract.
        unsafe {
            if ptx::ld_relaxed_gpu_u64(&raw const (*self.tail).wedged) != 0 {
                return Err(self.bounds().reporter.fail_queue(call, r.peer, 0, 0));
            }
            let t = ptx::atom_add_relaxed_gpu_u64(&raw mut (*self.tail).tail, 1);
            let slots = self.slots as u64;
            // Room: the proxy has taken ticket `t - slots`. The mapped
            // word is read over the bus only when the last value a poster
            // saw does not show it; a published failure is looked at
            // there too (the proxy takes nothing after one, so the ring
            // fills), and by every wait.
            let seen = &raw mut (*self.tail).taken_seen;
            if t >= ptx::ld_acquire_gpu_u64(seen) + slots {
                if let Some(f) = self.failure() {
                    return Err(self.failed(f, call));
                }
                let taken = &raw const (*self.words).taken;
                // A failure published while this poster waits ends the wait
                // (the proxy takes nothing after one): `u64::MAX` says so.
                let room = |v: u64| v == u64::MAX || t < v + slots;
                let load = || match self.failure() {
                    Some(_) => u64::MAX,
                    None => ptx::ld_acquire_sys_u64(taken),
                };
                match crate::sync::spin_until(self.budget_ns, load, room) {
                    Ok(u64::MAX) => {
                        if let Some(f) = self.failure() {
                            return Err(self.failed(f, call));
                        }
                    }
                    Ok(v) => {
                        ptx::atom_max_release_gpu_u64(seen, v);
                    }
                    Err(to) => {
                        ptx::st_relaxed_gpu_u64(&raw mut (*self.tail).wedged, 1);
                        return Err(self
                            .bounds()
                            .reporter
                            .fail_queue(call, r.peer, to.seen as u32, (t - slots + 1) as u32));
                    }
                }
            }
            let slot = self.ring.add((t & (slots - 1)) as usize);
            let (sig_off, sig_value, sig_op, flags) = match r.sig {
                Some((o, v, op)) => (o, v, op as u16, REQ_SIGNAL as u16),
                None => (0, 0, 0, 0),
            };
            let w = ProxyRequest {
                seq: 0,
                op: r.op,
                peer: r.peer,
                local: r.local,
                remote_off: r.remote_off,
                bytes: r.bytes,
                sig_off,
                sig_value,
                sig_op,
                flags,
                _pad: 0,
            };
            let words: [u64; 8] = core::mem::transmute(w);
            let dst = slot as *mut u64;
            let mut i = 1;
            while i < 8 {
                core::ptr::write_volatile(dst.add(i), words[i]);
                i += 1;
            }
            ptx::st_release_sys_u64(dst, t + 1);
            Ok(t)
        }
    }

    /// Waits until ticket `t` is done. One thread.
    ///
    /// Waiters poll the device copy `done_seen`; one at a time, the one
    /// that takes `poll_lock`, reads the proxy's mapped words over the bus
    /// and raises the copy. Hundreds of warps each polling host memory
    /// fill the bus with reads, and the NIC's own reads of the rings (host
    /// memory too) then crawl.
    #[inline(always)]
    fn wait_done(&self, t: u64, call: Call, peer: u32) -> Result<(), CommError> {
        let mut spin = Spin::new(self.budget_ns);
        // SAFETY: the handle's tail (device memory) and words.
        unsafe {
            let seen = &raw mut (*self.tail).done_seen;
            let lock = &raw mut (*self.tail).poll_lock;
            loop {
                // Acquire pairs with the poller's release below, which
                // follows its system-scope acquire of the proxy's word.
                let mut done = ptx::ld_acquire_gpu_u64(seen);
                if done > t {
                    return Ok(());
                }
                if ptx::atom_cas_acquire_gpu_u32(lock, 0, 1) == 0 {
                    done = ptx::ld_acquire_sys_u64(&raw const (*self.words).done);
                    ptx::atom_max_release_gpu_u64(seen, done);
                    let failure = if done > t { None } else { self.failure() };
                    ptx::st_release_gpu_u32(lock, 0);
                    if done > t {
                        return Ok(());
                    }
                    if let Some(f) = failure.filter(|&(_, at)| at <= t) {
                        return Err(self.failed(f, call));
                    }
                }
                if !spin.again() {
                    return Err(self.bounds().reporter.fail_queue(call, peer, done as u32, (t + 1) as u32));
                }
            }
        }
    }

    /// Every ticket reserved so far is done. One thread.
    fn quiet_all(&self, call: Call, peer: u32) -> Result<(), CommError> {
        // SAFETY: the handle's tail.
        let end = unsafe { ptx::ld_acquire_gpu_u64(&raw const (*self.tail).tail) };
        if end == 0 {
            return Ok(());
        }
        self.wait_done(end - 1, call, peer)
    }

    /// `r` posted by the group `g` (its leader), waited for unless `nbi`;
    /// every thread of the group returns the group's result.
    ///
    /// # Safety
    /// As [`Self::post`]; every thread of `g` passes the same arguments.
    #[inline(always)]
    unsafe fn request(&self, g: Coop, r: Req, call: Call, nbi: bool) -> Result<(), CommError> {
        g.sync();
        let mut res = Ok(());
        if g.is_leader() {
            // SAFETY: the caller's contract.
            res = unsafe { self.post(&r, call) }.and_then(|t| if nbi { Ok(()) } else { self.wait_done(t, call, r.peer) });
        }
        match g {
            Coop::Thread => res,
            Coop::Warp => super::warp_verdict(res),
            Coop::Block => {
                let failed = ptx::sync_threads_or(res.is_err());
                match res {
                    Ok(()) if failed => Err(match self.failure() {
                        Some(f) => self.failed(f, call),
                        None => CommError::Timeout(Timeout { seen: 0 }),
                    }),
                    r => r,
                }
            }
        }
    }

    #[inline(always)]
    fn reserved(&self, offset: u64) -> *mut u64 {
        (self.local_base + offset) as *mut u64
    }

    #[inline(always)]
    fn load_signal(p: *const u64) -> u64 {
        // SAFETY: checked by the caller to be an aligned heap word.
        unsafe { ptx::ld_acquire_sys_u64(p) }
    }
}

impl Transport for Proxy {
    const NODES: bool = true;

    #[inline(always)]
    fn rank(&self) -> u32 {
        self.rank
    }
    #[inline(always)]
    fn world_size(&self) -> u32 {
        self.world
    }

    /// `None` for peers reached through the proxy; the peer's address for
    /// those on this rank's node ([`Self::direct`]).
    #[inline(always)]
    fn peer_ptr<T>(&self, local: *const T, peer: u32) -> Option<*mut T> {
        if self.is_direct(peer) {
            self.p2p.peer_ptr(local, peer)
        } else {
            None
        }
    }

    unsafe fn put_raw(&self, g: Coop, peer: u32, x: RawXfer, signal: Option<RawSignal>) -> Result<(), CommError> {
        if self.is_direct(peer) {
            // SAFETY: the caller's contract.
            return unsafe { self.p2p.put_raw(g, peer, x, signal) };
        }
        let (call, off, sig_off) = super::check_put(self, peer, &x, signal)?;
        self.check_local(call, Arg::Source, x.src as u64, x.bytes, peer)?;
        if x.bytes == 0 && signal.is_none() {
            return Ok(());
        }
        let r = Req {
            op: OP_PUT,
            peer,
            local: x.src as u64,
            remote_off: off,
            bytes: x.bytes,
            sig: signal.map(|s| (sig_off, s.value, s.op)),
        };
        // SAFETY: checked arguments; the caller's contract.
        unsafe { self.request(g, r, call, x.nbi) }
    }

    unsafe fn put_lanes_many_raw(&self, peer: u32, count: u32, nbi: bool, x: impl Fn(u32) -> RawXfer) -> Result<(), CommError> {
        // The sources too before anything is written (the rounds check the
        // destinations): a request names registered memory only.
        let call = Call::put(false, nbi);
        let sources = if self.is_direct(peer) { 0 } else { count };
        super::check_each(sources, |i| {
            let xi = x(i);
            self.check_local(call, Arg::Source, xi.src as u64, xi.bytes, peer)
        })?;
        // SAFETY: the caller's contract.
        unsafe { super::put_lanes_rounds(self, peer, count, nbi, x) }
    }

    unsafe fn get_raw(&self, g: Coop, peer: u32, x: RawXfer) -> Result<(), CommError> {
        if self.is_direct(peer) {
            // SAFETY: the caller's contract.
            return unsafe { self.p2p.get_raw(g, peer, x) };
        }
        let call = if x.nbi { Call::GetNbi } else { Call::Get };
        let off = self.check_range(call, Arg::Source, x.src as u64, x.bytes, peer)?;
        self.check_local_dst(call, x.dst as u64, x.bytes, peer)?;
        self.check_local(call, Arg::Destination, x.dst as u64, x.bytes, peer)?;
        if x.bytes == 0 {
            return Ok(());
        }
        let r = Req {
            op: OP_GET,
            peer,
            local: x.dst as u64,
            remote_off: off,
            bytes: x.bytes,
            sig: None,
        };
        // SAFETY: as above.
        unsafe { self.request(g, r, call, x.nbi) }
    }

    unsafe fn signal_raw(&self, peer: u32, s: RawSignal) -> Result<(), CommError> {
        if self.is_direct(peer) {
            // SAFETY: the caller's contract.
            return unsafe { self.p2p.signal_raw(peer, s) };
        }
        let off = self.check_signal(Call::Signal, s.word as u64, peer)?;
        let r = Req {
            op: OP_SIGNAL,
            peer,
            local: 0,
            remote_off: 0,
            bytes: 0,
            sig: Some((off, s.value, s.op)),
        };
        // Non-blocking like IBGDA's: `quiet` completes it.
        // SAFETY: checked arguments.
        unsafe { self.request(Coop::Thread, r, Call::Signal, true) }
    }

    #[inline(always)]
    unsafe fn wait_word_raw(&self, word: *const u64, cmp: Cmp, value: u64) -> Result<u64, CommError> {
        self.check_signal(Call::WaitUntil, word as u64, self.rank)?;
        match crate::sync::spin_until(self.budget_ns, || Self::load_signal(word), |v| cmp.holds(v, value)) {
            Ok(v) => Ok(v),
            Err(t) => Err(self.fail_wait(t, Call::WaitUntil, u32::MAX, word as u64, cmp, value)),
        }
    }

    #[inline(always)]
    unsafe fn wait_some_raw(&self, w: RawWait, skip: u64) -> Result<u64, CommError> {
        super::wait_some_words(self, w, skip, Self::load_signal)
    }

    /// Requests run in ticket order, each peer's on one QP: nothing to do
    /// for them. Stores to peers on this rank's node: P2P's fence.
    #[inline(always)]
    fn fence(&self) {
        if self.any_direct() {
            self.p2p.fence();
        }
    }

    unsafe fn quiet(&self, peer: Option<u32>) -> Result<(), CommError> {
        match peer {
            Some(p) if p >= self.world => Err(self.fail(CommError::BadPeer { peer: p }, Call::Quiet, Arg::None, p, 0)),
            // SAFETY: the caller's contract.
            Some(p) if self.is_direct(p) => unsafe { self.p2p.quiet(peer) },
            Some(p) => self.quiet_all(Call::Quiet, p),
            None => {
                self.quiet_all(Call::Quiet, u32::MAX)?;
                if self.any_direct() {
                    // SAFETY: the caller's contract.
                    unsafe { self.p2p.quiet(None) }?;
                }
                Ok(())
            }
        }
    }

    unsafe fn barrier(&self) -> Result<(), CommError> {
        self.quiet_all(Call::Barrier, u32::MAX)?;
        // Publish this thread's (and its block's) load/store writes with
        // the slot stores below.
        ptx::fence_acq_rel_sys();
        let p = self.reserved(EPOCH_OFFSET);
        // SAFETY: a reserved header word, used by one thread per rank.
        let epoch = unsafe {
            let e = *p + 1;
            *p = e;
            e
        };
        for peer in 0..self.world {
            if self.is_direct(peer) {
                let slot = (self.local_base + self.rank as u64 * 8) as *const u64;
                if let Some(remote) = self.p2p.peer_ptr(slot, peer) {
                    // SAFETY: the slot word of this rank in the peer's
                    // header, mapped (checked by `peer_ptr`).
                    unsafe { ptx::st_release_sys_u64(remote, epoch) };
                }
                continue;
            }
            let r = Req {
                op: OP_SIGNAL,
                peer,
                local: 0,
                remote_off: 0,
                bytes: 0,
                sig: Some((self.rank as u64 * 8, epoch, SignalOp::Set)),
            };
            // SAFETY: a header word of every rank (the proxy allows the
            // whole heap as a target); the handle's ring.
            unsafe { self.post(&r, Call::Barrier) }?;
        }
        for peer in 0..self.world {
            let s = self.reserved(peer as u64 * 8);
            if let Err(t) = crate::sync::spin_until(self.budget_ns, || Self::load_signal(s), |v| v >= epoch) {
                return Err(self.fail_wait(t, Call::Barrier, peer, s as u64, Cmp::Ge, epoch));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word and a ticket read from two different failures (the proxy
    /// moved its failure to an earlier request between the two loads) still
    /// give the word's own ticket, across a 2^24 boundary too.
    #[test]
    fn the_error_word_names_its_own_ticket_beside_another_failure_s_ticket() {
        for (word_ticket, other) in [
            (1_000_005u64, 1_000_002u64),
            (1_000_002, 1_000_005),
            (0xff_fffe, 0x100_0003),
            (0x100_0003, 0xff_fffe),
            (0x3_1234_5678, 0x3_1234_5600),
            (7, 7),
            (0, 3),
            (3, 0),
            (5, u64::MAX),
            (u64::MAX, 5),
            (0x7f_ffff, 0),
            (0, 0x80_0000),
        ] {
            let e = proxy_error_word(PROXY_ERR_COMPLETION, 3, 0x15, word_ticket);
            assert_eq!(
                proxy_error_ticket(e, other),
                word_ticket,
                "word of {word_ticket:#x}, ticket word {other:#x}"
            );
            assert_eq!(e >> 56, PROXY_ERR_COMPLETION);
            assert_eq!((e >> 32) & 0xff_ffff, 3);
            assert_eq!(e & 0xff, 0x15);
            assert_eq!(proxy_error_parts(e), (PROXY_ERR_COMPLETION, 3, 0x15));
        }
    }
}
