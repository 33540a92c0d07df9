//! The IBGDA transport: the GPU builds mlx5 WQEs, rings the doorbell and
//! polls completions itself (InfiniBand GPUDirect Async). Runs over a
//! ConnectX NIC or, where there is none, the soft NIC (`doorbell-softnic`),
//! which executes the same WQE bytes.
//!
//! ## What each call posts
//! | call | WQEs (on the calling block's QP to the peer) |
//! |---|---|
//! | `put` | RDMA WRITE, split into chunks of at most [`Ibgda::max_msg`] bytes |
//! | `get` | RDMA READ, chunked the same way |
//! | `put_lanes` | each lane's WRITE (at most one chunk each, else lane by lane) and its signal WQE, the warp's run behind one doorbell, only its last WQE signaled |
//! | `signal` `Add` | ATOMIC fetch-add (the old value lands in the slot's scratch word) |
//! | `signal` `Set` | 8-byte RDMA WRITE from the slot's scratch word holding the value |
//! | `put_signal` | the WRITEs, then the signal WQE, **on the same QP** |
//! | `quiet`, `quiet_peer`, blocking calls | poll the QP's CQ until the last WQE posted has completed |
//! | `barrier` | quiet, then an 8-byte WRITE of the epoch into every rank's barrier slot, then local waits |
//!
//! **Why fetch-add for `Add` and a WRITE for `Set`**: `Add` must be atomic
//! against other ranks' adds to the same word, which only a NIC atomic is;
//! `Set` needs no atomicity, and a WRITE is cheaper than a compare-swap
//! loop and lands with the same ordering. The value a `Set` writes sits in
//! a per-slot scratch word ([`IbgdaQp::scratch`], one word per SQ slot, in
//! registered memory): it stays unchanged until the slot is reused, which
//! flow control allows only after the WQE completed — so `_nbi` signals
//! need no caller-owned buffer. (mlx5 could also carry the 8 bytes inline
//! in the WQE; the soft NIC does not emulate inline data.)
//!
//! **Ordering.** Every operation of a block to a peer goes to the same QP
//! (`block index mod qps_per_peer`), and an RC QP executes its requests in
//! order: the responder places a WRITE's data before it executes the next
//! request of that QP. So the signal WQE of `put_signal`, posted after the
//! data WQEs on the same QP, is seen only after the data — no completion
//! wait, no fence bit (mlx5's fence bit waits for earlier READs and atomics,
//! which `put_signal` does not depend on). [`Transport::fence`] therefore
//! orders nothing extra. A block's `signal` after its warps' puts (barrier,
//! `fence`, `signal`) is ordered the same way: the puts' WQEs were rung
//! before the barrier, the signal's after.
//!
//! **Local signal words** are written by the NIC: waits are plain
//! `ld.acquire.sys` loads bounded by [`crate::sync::Spin`].
//!
//! ## The send queue shared by warps
//! Per QP, a small state block in device memory ([`QpCounters`]): producer
//! and ready indices (the mlx5 pipeline's), the CQ consumer index, the
//! **completed** index (WQEs known complete), a poll lock, an error word.
//!
//! 1. **Reserve**: one atomic add on the producer index per batch (lane 0
//!    of a warp, or the calling thread), 1..=32 WQEs.
//! 2. **Flow control**: the batch writes its slots only once
//!    `end - completed <= sq_size` — a reservation never overruns WQEs the
//!    NIC has not consumed. While waiting, the poster drives completions.
//! 3. **Write**: lane `i` writes WQE `i`; only the batch's last WQE asks for
//!    a completion.
//! 4. **Submit in order**: wait for the ready index to reach the batch's
//!    start, doorbell record, doorbell, hand over the turn.
//! 5. **Complete**: whoever waits takes the poll lock if it is free and
//!    consumes every CQE present (no one ever blocks while holding it),
//!    advancing the completed index; others re-read the index.
//!
//! **CQ sizing**: every CQE answers at least one WQE, and flow control keeps
//! at most `sq_size` WQEs without a consumed CQE, so a CQ of `sq_size`
//! entries cannot overflow (flushes complete every WQE, still at most
//! `sq_size`).
//!
//! **Errors.** An error CQE is never "not done yet": the first one sets the
//! QP's error word (syndrome and the failing WQE's index); waiters for WQEs
//! at or past it get [`CommError::Completion`], later posters are refused at
//! once. A batch that times out (no free slots, no turn, no completion)
//! marks the QP **wedged**, so later warps fail at once instead of each
//! waiting out its budget. Either way the first error is recorded in the
//! heap header; the host reports the QP states and resets them
//! (`Communicator::ibgda_reset`).

use super::{Cmp, CommError, Coop, RawSignal, RawWait, RawXfer, SignalOp, Transport};
use crate::heap::{Arg, Call, Checked, HeapBounds, Reporter, EPOCH_OFFSET};
use crate::mlx5::cq::{classify_cqe, cqe_ready, op_own_of, CqError, CqeState};
use crate::mlx5::queue::{publish_and_ring, wqe_slot, QpHandle};
use crate::mlx5::wqe::{write_atomic_fetch_add_wqe, write_rdma_read_wqe, write_rdma_write_wqe, Transfer, FLAG_SIGNALED};
use crate::ptx;
use crate::sync::{Spin, Timeout};
// `What` is used inside the hooks only (gone without the trace feature).
#[allow(unused_imports)]
use crate::trace::{around, hook, What};

mod queue;

pub use queue::PostProfile;

/// Registered local buffers a handle carries besides the heap.
pub const REG_SLOTS: usize = 4;
/// Most WQEs in one batch (one per lane).
pub const MAX_BATCH: u32 = 32;
/// [`QpCounters::error`]: a completion error; the low byte is the syndrome.
pub const QP_ERR_COMPLETION: u32 = 0x100;
/// [`QpCounters::error`]: a post or completion wait timed out (the QP is wedged).
pub const QP_ERR_WEDGED: u32 = 0x200;
/// [`QpCounters::error`]: set, with the kind, while the first failure's
/// `error_at` is being written ([`publish_qp_error`]); cleared when the word
/// is published. Readers that need `error_at` wait until it is clear.
pub const QP_ERR_PENDING: u32 = 0x8000_0000;

/// Records a QP failure `err` (first wins) at WQE index `at`: claims the
/// error word with [`QP_ERR_PENDING`], writes `error_at`, then publishes the
/// word with release, so a reader that sees the word without the pending
/// bit (acquire) sees `error_at` too. Whether this call won.
///
/// # Safety
/// `s` is a valid QP state.
#[inline(always)]
pub unsafe fn publish_qp_error(s: *mut QpCounters, err: u32, at: u32) -> bool {
    // SAFETY: the caller's contract.
    unsafe {
        if ptx::atom_cas_relaxed_gpu_u32(&raw mut (*s).error, 0, err | QP_ERR_PENDING) != 0 {
            return false;
        }
        ptx::st_relaxed_gpu_u32(&raw mut (*s).error_at, at);
        ptx::st_release_gpu_u32(&raw mut (*s).error, err);
    }
    true
}

/// The QP's published failure: `(error word, error_at)`, or `None` while
/// healthy or while the first failure is still being recorded.
///
/// # Safety
/// `s` is a valid QP state.
#[inline(always)]
pub unsafe fn published_qp_error(s: *const QpCounters) -> Option<(u32, u32)> {
    // SAFETY: the caller's contract. Acquire pairs with the release in
    // `publish_qp_error`: `error_at` was written before.
    unsafe {
        let err = ptx::ld_acquire_gpu_u32(&raw const (*s).error);
        if err == 0 || err & QP_ERR_PENDING != 0 {
            return None;
        }
        Some((err, ptx::ld_relaxed_gpu_u32(&raw const (*s).error_at)))
    }
}

/// The software state of one QP, in device memory (64 bytes). The
/// [`QpHandle`] of the QP points at its first three words.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Producer index: WQEs reserved (wrapping).
    pub producer: u32,
    /// Ready index: WQEs whose doorbell has rung.
    pub ready: u32,
    /// CQ consumer index.
    pub cq_consumer: u32,
    /// WQEs known complete (every WQE below it), from the CQEs consumed.
    pub completed: u32,
    /// 1 while a thread consumes CQEs.
    pub poll_lock: u32,
    /// 0: healthy; [`QP_ERR_COMPLETION`] | syndrome; [`QP_ERR_WEDGED`]
    /// (with [`QP_ERR_PENDING`] while `error_at` is being written).
    pub error: u32,
    /// The index of the first WQE not known good once `error` is set.
    pub error_at: u32,
    /// Reserved, zero.
    pub _reserved: [u32; 9],
}
const _: () = assert!(core::mem::size_of::<QpCounters>() == 64);

/// One QP as kernels see it (128 bytes, in device memory).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbgdaQp {
    /// The mlx5 rings, doorbells and counters.
    pub qp: QpHandle,
    /// Its software state (`qp.sq_producer` etc. point into it).
    pub state: *mut QpCounters,
    /// One 8-byte word per SQ slot: the value of a `Set` signal, the
    /// returned old value of a fetch-add. Registered with `scratch_lkey`.
    pub scratch: *mut u64,
    /// Local key of `scratch`.
    pub scratch_lkey: u32,
    /// The peer this QP reaches.
    pub peer: u32,
    /// The peer's heap base (remote address of offset 0).
    pub remote_base: u64,
    /// The peer's heap rkey.
    pub rkey: u32,
    /// Reserved, zero.
    pub _pad: u32,
    /// Reserved, zero.
    pub _reserved: u64,
}
const _: () = assert!(core::mem::size_of::<IbgdaQp>() == 128);

/// A registered local buffer: puts may read from it, gets write into it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegRegion {
    /// First byte (device address).
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// Local key.
    pub lkey: u32,
    /// Reserved, zero.
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<RegRegion>() == 24);

/// The IBGDA transport's device handle. Plain `#[repr(C)]` data made by
/// `Communicator::ibgda`; immutable for a kernel's life. Calls may come
/// from any number of warps and blocks at once.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Ibgda {
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
    /// `world × qps_per_peer` QPs: peer `p`'s QP `k` at `p × qps_per_peer + k`.
    pub qps: *const IbgdaQp,
    /// QPs per peer, ≥ 1; block `b` uses QP `b mod qps_per_peer`.
    pub qps_per_peer: u32,
    /// Largest message of one WQE, bytes (a put or get is split).
    pub max_msg: u32,
    /// Local key of this rank's heap.
    pub heap_lkey: u32,
    /// Entries of `reg` in use.
    pub nreg: u32,
    /// Registered buffers (`Communicator::ibgda_register`).
    pub reg: [RegRegion; REG_SLOTS],
}
const _: () = assert!(core::mem::size_of::<Ibgda>() == 56 + 24 * REG_SLOTS);

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] plain data (integers, a pointer, plain structs), 8-byte
// aligned, matching the struct-by-value parameter of the PTX entry point.
unsafe impl crate::KernelParam for Ibgda {}

/// Who posts a batch: one thread doing every WQE, or a converged warp with
/// lane `i` doing WQE `i`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Poster {
    Thread,
    Warp,
}

/// An operation of a batch: chunk `k` of a transfer, or the signal.
#[derive(Clone, Copy)]
struct Xfer {
    /// WRITE (put) or READ (get).
    read: bool,
    /// Remote address of the transfer's first byte.
    raddr: u64,
    /// Local address of the transfer's first byte.
    laddr: u64,
    lkey: u32,
    bytes: u64,
}

/// A transfer of no data (a signal or a header word alone).
const NO_DATA: Xfer = Xfer {
    read: false,
    raddr: 0,
    laddr: 0,
    lkey: 0,
    bytes: 0,
};

/// Which call posts, to which peer (for its error reports).
#[derive(Clone, Copy)]
struct Site {
    call: Call,
    peer: u32,
}

/// The batches of a transfer one poster takes: batch `j` when
/// `j % stride == which`.
#[derive(Clone, Copy)]
struct Share {
    which: u64,
    stride: u64,
}

impl Share {
    /// Every batch.
    const ALL: Share = Share { which: 0, stride: 1 };
}

/// Chunks `first .. first + count` of a transfer (one batch).
#[derive(Clone, Copy)]
struct Chunks {
    first: u64,
    count: u32,
}

#[derive(Clone, Copy)]
struct Sig {
    /// Remote address of the word.
    raddr: u64,
    value: u64,
    op: SignalOp,
}

impl Sig {
    /// The signal of a batch that has none (never written: its slot is
    /// not posted).
    const NONE: Sig = Sig {
        raddr: 0,
        value: 0,
        op: SignalOp::Set,
    };
}

/// Errors as two words, to broadcast from the posting lane.
#[inline(always)]
fn encode(r: Result<u32, CommError>) -> (u32, u32) {
    match r {
        Ok(v) => (0, v),
        Err(CommError::Timeout(t)) => (1, t.seen as u32),
        Err(CommError::Completion { syndrome, .. }) => (2, syndrome as u32),
        Err(_) => (3, 0),
    }
}

#[inline(always)]
fn decode(kind: u32, v: u32, peer: u32) -> Result<u32, CommError> {
    match kind {
        0 => Ok(v),
        1 => Err(CommError::Timeout(Timeout { seen: v as u64 })),
        2 => Err(CommError::Completion { peer, syndrome: v as u8 }),
        _ => Err(CommError::BadCount { count: 0 }),
    }
}

/// `f` run by lane 0 alone (reserving, submitting for the warp); every
/// lane of the converged warp gets its result, an error as [`decode`]
/// rebuilds it.
#[inline(always)]
fn on_lane0(peer: u32, f: impl FnOnce() -> Result<u32, CommError>) -> Result<u32, CommError> {
    let mut r = (0u32, 0u32);
    if ptx::lane_id() == 0 {
        r = encode(f());
    }
    let kind = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, r.0, 0);
    let v = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, r.1, 0);
    decode(kind, v, peer)
}

/// `a` is at or past `b` (indices within half the counter space).
#[inline(always)]
fn reached(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

impl Ibgda {
    // ---- argument checks and reports (as P2p's) --------------------------

    #[inline(always)]
    fn reserved(&self, offset: u64) -> *mut u64 {
        (self.local_base + offset) as *mut u64
    }

    /// The local key covering `[addr, addr + bytes)`: the heap, or a
    /// registered buffer; else the range is refused (the NIC could not
    /// reach it).
    #[inline(always)]
    fn local_key(&self, call: Call, arg: Arg, addr: u64, bytes: u64, peer: u32) -> Result<u32, CommError> {
        let off = addr.wrapping_sub(self.local_base);
        if bytes == 0 || off <= self.heap_bytes && bytes <= self.heap_bytes - off {
            return Ok(self.heap_lkey);
        }
        let mut i = 0;
        while i < REG_SLOTS {
            let r = self.reg[i];
            let o = addr.wrapping_sub(r.addr);
            if (i as u32) < self.nreg && o <= r.len && bytes <= r.len - o {
                return Ok(r.lkey);
            }
            i += 1;
        }
        Err(self.fail(CommError::OutOfRange { offset: off, bytes }, call, arg, peer, off))
    }

    // ---- QPs ---------------------------------------------------------------

    /// The calling block's QP to `peer` (`peer < world`).
    #[inline(always)]
    fn qp(&self, peer: u32) -> IbgdaQp {
        let k = if self.qps_per_peer <= 1 {
            0
        } else {
            ptx::block_idx_x() % self.qps_per_peer
        };
        // SAFETY: `qps` has world × qps_per_peer entries, 8-byte aligned;
        // read as words (a by-value copy would be a loop of byte loads).
        unsafe { ptx::load_words::<IbgdaQp, 16>(self.qps.add((peer * self.qps_per_peer + k) as usize)) }
    }

    /// The QP error as a device error (and its report).
    #[inline(always)]
    fn qp_failed(&self, err: u32, call: Call, peer: u32) -> CommError {
        let e = if err & QP_ERR_COMPLETION != 0 {
            CommError::Completion { peer, syndrome: err as u8 }
        } else {
            CommError::Timeout(Timeout { seen: 0 })
        };
        self.fail(e, call, Arg::None, peer, 0)
    }

    /// Marks the QP wedged (first error wins), records the stall.
    #[inline(always)]
    fn wedge(&self, q: &IbgdaQp, call: Call, peer: u32, seen: u32, expected: u32) -> CommError {
        // SAFETY: the QP's state words.
        unsafe {
            let s = q.state;
            let done = ptx::ld_acquire_gpu_u32(&raw const (*s).completed);
            publish_qp_error(s, QP_ERR_WEDGED, done);
        }
        self.bounds().reporter.fail_queue(call, peer, seen, expected)
    }

    /// Loads a local signal word the NIC (or a peer) writes: acquire at
    /// system scope.
    #[inline(always)]
    fn load_signal(p: *const u64) -> u64 {
        // SAFETY: checked by the caller to be an aligned heap word.
        unsafe { ptx::ld_acquire_sys_u64(p) }
    }

    /// Waits until every barrier slot holds at least `epoch`. One thread.
    pub(crate) fn wait_slots(&self, epoch: u64) -> Result<(), CommError> {
        for peer in 0..self.world {
            let s = self.reserved(peer as u64 * 8);
            if let Err(t) = crate::sync::spin_until(self.budget_ns, || Self::load_signal(s), |v| v >= epoch) {
                return Err(self.fail_wait(t, Call::Barrier, peer, s as u64, Cmp::Ge, epoch));
            }
        }
        Ok(())
    }

    /// This rank's next barrier epoch (one thread per rank).
    ///
    /// # Safety
    /// One thread per rank is in a barrier.
    pub(crate) unsafe fn next_epoch(&self) -> u64 {
        let p = self.reserved(EPOCH_OFFSET);
        // SAFETY: a reserved header word, used by one thread per rank.
        unsafe {
            let e = *p + 1;
            *p = e;
            e
        }
    }

    unsafe fn barrier_inner(&self) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        let epoch = unsafe {
            // Everything this rank posted before is complete at its target.
            self.quiet_all(Call::Barrier)?;
            let epoch = self.next_epoch();
            for peer in 0..self.world {
                self.put_header_word(peer, self.rank as u64 * 8, epoch)?;
            }
            epoch
        };
        self.wait_slots(epoch)
    }

    /// The local `wait_some_raw` (shared with the routed transport).
    pub(crate) fn wait_some(&self, w: RawWait, skip: u64) -> Result<u64, CommError> {
        super::wait_some_words(self, w, skip, Self::load_signal)
    }

    /// The local `wait_until` (shared with the routed transport).
    pub(crate) fn wait_one(&self, sig: *const u64, cmp: Cmp, value: u64) -> Result<u64, CommError> {
        self.check_signal(Call::WaitUntil, sig as u64, self.rank)?;
        hook! { let span = crate::trace::span(1, self.local_base, What::Wait, u32::MAX, (sig as u64).wrapping_sub(self.local_base)); }
        match crate::sync::spin_until(self.budget_ns, || Self::load_signal(sig), |v| cmp.holds(v, value)) {
            Ok(v) => {
                hook! { span.end(v); }
                Ok(v)
            }
            Err(t) => Err(self.fail_wait(t, Call::WaitUntil, u32::MAX, sig as u64, cmp, value)),
        }
    }
}

impl Checked for Ibgda {
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

impl Transport for Ibgda {
    #[inline(always)]
    fn rank(&self) -> u32 {
        self.rank
    }
    #[inline(always)]
    fn world_size(&self) -> u32 {
        self.world
    }

    /// Always `None`: peers are reached through the NIC only.
    #[inline(always)]
    fn peer_ptr<T>(&self, _local: *const T, _peer: u32) -> Option<*mut T> {
        None
    }

    unsafe fn put_raw(&self, g: Coop, peer: u32, x: RawXfer, signal: Option<RawSignal>) -> Result<(), CommError> {
        // Every check before any WQE: a bad argument writes nothing.
        let (call, off, sig_off) = super::check_put(self, peer, &x, signal)?;
        let lkey = self.local_key(call, Arg::Source, x.src as u64, x.bytes, peer)?;
        if x.bytes == 0 && signal.is_none() {
            return Ok(());
        }
        let (wire, sig) = self.put_wire(peer, &x, (off, sig_off), lkey, signal);
        around!({
            let what = if signal.is_some() { What::PutSignal } else { What::Put };
            let span = g.is_leader().then(|| crate::trace::span(1, self.local_base, what, peer, x.bytes));
        }
        // SAFETY: checked arguments; the caller's contract.
        unsafe { self.transfer(g, wire, sig, Site { call, peer }, x.nbi) }, |r| { if let Some(s) = span { s.end(x.bytes) } })
    }

    unsafe fn put_lanes_raw(&self, peer: u32, x: RawXfer, signal: Option<RawSignal>) -> Result<(), CommError> {
        // Every lane's checks before any WQE: a bad argument writes nothing.
        let checked = super::check_put(self, peer, &x, signal)
            .and_then(|(call, off, sig_off)| Ok((call, off, sig_off, self.local_key(call, Arg::Source, x.src as u64, x.bytes, peer)?)));
        let (call, off, sig_off, lkey) = super::warp_verdict(checked)?;
        let lead = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, peer, 0);
        let nbi = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, x.nbi as u32, 0);
        if !ptx::vote_sync_all(ptx::FULL_MASK, peer == lead && x.nbi as u32 == nbi) {
            // Lanes to different peers (QPs): each lane on its own.
            // SAFETY: the caller's contract; checked.
            return unsafe { self.put_raw(Coop::Thread, peer, x, signal) };
        }
        let (wire, sig) = self.put_wire(peer, &x, (off, sig_off), lkey, signal);
        let q = self.qp(peer);
        let site = Site { call, peer };
        around!({ let span = (ptx::lane_id() == 0).then(|| crate::trace::span(1, self.local_base, What::Put, peer, x.bytes)); }
        // SAFETY: checked arguments, one QP for the warp; the caller's contract.
        unsafe {
            match self.post_lanes(&q, &wire, sig.as_ref(), site) {
                Ok(Some(t)) if !x.nbi => self.wait_posted(Poster::Warp, &q, t, call, peer),
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            }
        }, |r| { if let Some(s) = span { s.end(x.bytes) } })
    }

    unsafe fn put_lanes_many_raw(&self, peer: u32, count: u32, nbi: bool, x: impl Fn(u32) -> RawXfer) -> Result<(), CommError> {
        let call = Call::put(false, nbi);
        // Every transfer's checks before any WQE: a bad one writes nothing.
        let mut one_wqe = true;
        super::check_each(count, |i| {
            let xi = RawXfer { nbi, ..x(i) };
            one_wqe &= xi.bytes <= self.max_msg as u64;
            super::check_put(self, peer, &xi, None).and_then(|_| self.local_key(call, Arg::Source, xi.src as u64, xi.bytes, peer).map(drop))
        })?;
        if !ptx::vote_sync_any(ptx::FULL_MASK, count > 0) {
            // Nothing to send (and no peer checked: none may be valid).
            return Ok(());
        }
        let lead = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, peer, 0);
        if !ptx::vote_sync_all(ptx::FULL_MASK, one_wqe && peer == lead) {
            // A transfer of several WQEs, or lanes to different peers
            // (QPs): round by round.
            // SAFETY: the caller's contract.
            return unsafe { super::put_lanes_rounds(self, peer, count, nbi, x) };
        }
        let q = self.qp(peer);
        let site = Site { call, peer };
        around!({ let span = (ptx::lane_id() == 0).then(|| crate::trace::span(1, self.local_base, What::Put, peer, count as u64)); }
        // SAFETY: checked transfers of one WQE each, one QP for the warp;
        // the caller's contract.
        unsafe {
            match self.post_lanes_many(&q, count, nbi, &x, site) {
                Ok(Some(t)) if !nbi => self.wait_posted(Poster::Warp, &q, t, call, peer),
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            }
        }, |r| { if let Some(s) = span { s.end(count as u64) } })
    }

    unsafe fn get_raw(&self, g: Coop, peer: u32, x: RawXfer) -> Result<(), CommError> {
        let call = if x.nbi { Call::GetNbi } else { Call::Get };
        let off = self.check_range(call, Arg::Source, x.src as u64, x.bytes, peer)?;
        // The NIC would write the heap's header as readily as its user part.
        self.check_local_dst(call, x.dst as u64, x.bytes, peer)?;
        let lkey = self.local_key(call, Arg::Destination, x.dst as u64, x.bytes, peer)?;
        if x.bytes == 0 {
            return Ok(());
        }
        let wire = Xfer {
            read: true,
            raddr: self.remote_base(peer) + off,
            laddr: x.dst as u64,
            lkey,
            bytes: x.bytes,
        };
        around!({ let span = g.is_leader().then(|| crate::trace::span(1, self.local_base, What::Get, peer, x.bytes)); }
        // SAFETY: as above.
        unsafe { self.transfer(g, wire, None, Site { call, peer }, x.nbi) }, |r| { if let Some(s) = span { s.end(x.bytes) } })
    }

    unsafe fn signal_raw(&self, peer: u32, s: RawSignal) -> Result<(), CommError> {
        let off = self.check_signal(Call::Signal, s.word as u64, peer)?;
        let q = self.qp(peer);
        let sig = Sig {
            raddr: q.remote_base + off,
            value: s.value,
            op: s.op,
        };
        // Non-blocking like P2P's store: the peer sees it when the NIC
        // delivers it; `quiet` completes it.
        around!({ let span = crate::trace::span(1, self.local_base, What::Signal, peer, off); }
        // SAFETY: checked arguments.
        unsafe {
            self.post_xfer(
                Poster::Thread,
                &q,
                &NO_DATA,
                Some(&sig),
                Share::ALL,
                Site { call: Call::Signal, peer },
            )
        }, |r| { span.end(s.value); })
        .map(|_| ())
    }

    #[inline(always)]
    unsafe fn wait_word_raw(&self, word: *const u64, cmp: Cmp, value: u64) -> Result<u64, CommError> {
        self.wait_one(word, cmp, value)
    }

    #[inline(always)]
    unsafe fn wait_some_raw(&self, w: RawWait, skip: u64) -> Result<u64, CommError> {
        self.wait_some(w, skip)
    }

    /// Nothing to do: a block's WQEs to a peer share one QP, executed in
    /// order (see the module docs).
    #[inline(always)]
    fn fence(&self) {}

    unsafe fn quiet(&self, peer: Option<u32>) -> Result<(), CommError> {
        around!({ let span = crate::trace::span(1, self.local_base, What::Quiet, peer.unwrap_or(u32::MAX), 0); }
        match peer {
            Some(peer) if peer >= self.world => Err(self.fail(CommError::BadPeer { peer }, Call::Quiet, Arg::None, peer, 0)),
            // SAFETY: the handle's QPs are valid.
            Some(peer) => unsafe { self.quiet_qp(&self.qp(peer), Call::Quiet) },
            None => {
                for peer in 0..self.world {
                    let q = self.qp(peer);
                    // A routed handle has no QP to peers it reaches by load/store.
                    if !q.state.is_null() {
                        // SAFETY: as above.
                        unsafe { self.quiet_qp(&q, Call::Quiet) }?;
                    }
                }
                Ok(())
            }
        }, |r| { span.end(r.is_ok() as u64); })
    }

    unsafe fn barrier(&self) -> Result<(), CommError> {
        around!({ let span = crate::trace::span(1, self.local_base, What::Barrier, u32::MAX, 0); }
        // SAFETY: the caller's contract.
        unsafe { self.barrier_inner() }, |r| { span.end(r.is_ok() as u64); })
    }
}

impl Ibgda {
    /// What a checked put of `x` to `peer` sends: the WRITE of its bytes to
    /// heap offset `offs.0` and its signal, if any, to heap offset `offs.1`.
    #[inline(always)]
    fn put_wire(&self, peer: u32, x: &RawXfer, offs: (u64, u64), lkey: u32, signal: Option<RawSignal>) -> (Xfer, Option<Sig>) {
        let base = self.remote_base(peer);
        let wire = Xfer {
            read: false,
            raddr: base + offs.0,
            laddr: x.src as u64,
            lkey,
            bytes: x.bytes,
        };
        let sig = signal.map(|s| Sig {
            raddr: base + offs.1,
            value: s.value,
            op: s.op,
        });
        (wire, sig)
    }

    /// Heap base of `peer` as the NIC addresses it (`peer < world`).
    #[inline(always)]
    fn remote_base(&self, peer: u32) -> u64 {
        // SAFETY: `qps` has world × qps_per_peer entries; every QP of a
        // peer carries the same base.
        unsafe { (*self.qps.add((peer * self.qps_per_peer) as usize)).remote_base }
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    use super::*;

    /// The error word is published after its `error_at`, and a reader never
    /// takes a word still being recorded (whose `error_at` may be stale).
    #[test]
    fn a_qp_error_is_published_after_its_index_and_first_wins() {
        let mut s = QpCounters::default();
        let p = &raw mut s;
        // SAFETY: a valid state on this stack.
        unsafe {
            assert_eq!(published_qp_error(p), None);
            // Another thread claimed the word and has not written error_at yet.
            (*p).error = QP_ERR_COMPLETION | 5 | QP_ERR_PENDING;
            (*p).error_at = 0;
            assert_eq!(published_qp_error(p), None, "a word still being recorded was taken");
            assert!(!publish_qp_error(p, QP_ERR_WEDGED, 9), "a second failure must not win");
            (*p).error = 0;
            assert!(publish_qp_error(p, QP_ERR_COMPLETION | 5, 42));
            assert_eq!((s.error, s.error_at), (QP_ERR_COMPLETION | 5, 42));
            assert_eq!(published_qp_error(p), Some((QP_ERR_COMPLETION | 5, 42)));
            assert!(!publish_qp_error(p, QP_ERR_WEDGED, 7));
            assert_eq!((s.error, s.error_at), (QP_ERR_COMPLETION | 5, 42), "first wins");
        }
    }
}
