//! The device API every transport implements: **the transport contract**.
//!
//! A kernel receives a transport handle (e.g. [`P2p`]) by value and calls the
//! [`Transport`] methods on it. Write the body once, generic over the
//! transport, and let `#[kernel(transports(...))]` export one PTX entry per
//! transport — no hand-written wrappers:
//!
//! ```
//! use doorbell_kernels::kernel;
//! use doorbell_kernels::transport::{Coop, Ibgda, P2p, Put, Signal, Sym, Transport};
//!
//! #[kernel(transports(P2p, Ibgda))]      // entries `ring_p2p`, `ring_ibgda`
//! pub unsafe fn ring<T: Transport>(t: T, buf: Sym<f32>, sig: Sym<u64>) {
//!     let next = (t.rank() + 1) % t.world_size();
//!     let put = Put::dst(buf.all()).src(buf.all()).signal(Signal::add(sig.word(0), 1));
//!     // SAFETY: every thread of the block passes the same arguments.
//!     let _ = unsafe { t.put(Coop::Block, next, put) };
//! }
//! // host: module.function::<<ring as ForTransport<P2p>>::Kernel>(), with
//! // `comm.alloc::<f32>(n)?.sym()` as the `buf` argument
//! # fn _f(_: <ring as doorbell_kernels::ForTransport<P2p>>::Kernel) {}
//! ```
//!
//! ## Words
//! A **rank** is a member of the world (`0..world_size`); the rank a call
//! targets is its **peer** argument. **Symmetric** memory is the heap every
//! rank allocates collectively: a buffer sits at the same offset on every
//! rank, and calls take this rank's (local) address of it. A **signal** is an
//! 8-byte word in the symmetric heap that a call sets or adds to (not the
//! mlx5 "signaled" WQE flag, which asks the NIC for a completion).
//!
//! ## Typed and raw calls
//! The typed calls take [`Part`]s of [`Sym`] buffers (element counts, not
//! bytes) and their arguments by name ([`Put`], [`Get`], [`Signal`]); each
//! part is checked against *its own buffer*, so a put that runs past the end
//! of one buffer is refused instead of landing in the next allocation of the
//! peer. The `_raw` calls underneath take byte pointers ([`RawXfer`],
//! [`RawSignal`], [`RawWait`]) and check against the heap only: for experts
//! and for the library's collectives, which compute their own addresses.
//! The cooperating group is a [`Coop`] argument and non-blocking is
//! [`Put::nbi`] (or [`RawXfer::nbi`]), not a name suffix.
//!
//! ## Where memory may lie
//! | argument | must lie in | why |
//! |---|---|---|
//! | destination of a put, source of a get, every signal word | the symmetric heap (checked on every call) | it is translated to the peer's copy; an RDMA transport needs the peer's key for it |
//! | source of a put, destination of a get | the symmetric heap or a buffer registered with the communicator ([`Part::local`]) | an RDMA transport needs a local key (an unregistered one is refused, the error says how to register it); P2P accepts any device memory and does not check it |
//!
//! ## The calls
//! `g: Coop` says who calls: [`Coop::Thread`] — one thread,
//! [`Coop::Warp`] — all 32 lanes of a warp, converged, same arguments,
//! [`Coop::Block`] — every thread of the block. Every call that can fail
//! returns [`Result`]`<_, `[`CommError`]`>`; the first error of a rank is
//! also recorded in its heap header ([`crate::heap::ErrorReport`], naming the
//! argument) and the host's `Communicator::check` / `synchronize` turn it
//! into an error naming rank, call, argument, peer and offset. A call
//! rejected for a bad argument writes nothing.
//!
//! | call | publishes / observes | scope | pairs with | who calls |
//! |---|---|---|---|---|
//! | `put(g, peer, Put::dst(d).src(s))` | nothing by itself (weak stores); the source may be reused on return | — | a later `signal`, `fence` or `quiet` | `g` |
//! | `put(.., put.nbi())` | as `put`, completes at `quiet` (the source must stay unchanged until then) | — | `quiet` | `g` |
//! | `put(.., put.signal(Signal::set(w, v)))` | the data, then the signal: the peer that sees the signal sees the data | sys (gpu when every rank shares one GPU) | the peer's `wait_until*` | `g` |
//! | `put_lanes(peer, put)` | as `put` (or its signal form) for each lane's own `put`: each lane's signal publishes that lane's data only; IBGDA posts the warp's WQEs behind one doorbell | as `put` | as `put` | all 32 lanes of a warp, converged, each its own arguments |
//! | `put_lanes_many(peer, n, nbi, \|i\| (dst, src))` | each lane its own `n` puts (no signal), in no order among themselves (two to one destination race); IBGDA posts all the warp's WQEs behind one doorbell | — | a warp barrier, `fence`, `signal`; or `quiet` | all 32 lanes of a warp, converged |
//! | `get(g, peer, Get::dst(d).src(s))` | the data is in the local destination on return (after `quiet` with `.nbi()`) | — | the peer's `signal` that published it | `g` |
//! | `signal(peer, Signal::add(w, v))` | every earlier put of the calling thread to that peer (a release); a warp's or block's puts: barrier, then `fence`, then `signal` — or one put with a signal | sys (gpu on one GPU) | the peer's `wait_until*` | one thread |
//! | `wait_until`, `wait_until_{any,all}` | acquires what the matching signals published | sys (gpu on one GPU) | `signal`, a put's signal | one thread |
//! | `fence` | orders the calling thread's earlier puts — and, after a warp/block barrier, its group's — before its later puts and signals | sys | — | one thread |
//! | `quiet(None)`, `quiet(Some(peer))` | completes every earlier put/get (non-blocking ones too) of the calling thread, to all peers / one | sys | — | one thread |
//! | `barrier` | all ranks arrive; what each did before is visible to all after | sys | every other rank's `barrier` | one thread per rank (`barrier_block`: one block) |
//! | `peer_ptr` | — (an address: plain loads/stores, ordered by the caller) | — | — | any thread |
//!
//! ## Bounded waits
//! Every wait runs through [`crate::sync::Spin`] with the handle's budget;
//! on expiry it records the report (rank, call, peer, offset, comparison,
//! expected, seen) and returns [`CommError::Timeout`]. Nothing hangs.
//!
//! ## Cost of the checks
//! Arguments are checked once per call, not per element: a few integer
//! comparisons against values in the handle (and, for typed calls, in the
//! parts), folded into one predicate and one branch per check; only a bad
//! argument takes it, to the cold function that records the report
//! ([`crate::heap::HeapBounds`]). See `p2p_bench`'s `checks` row for the
//! measured cost.

pub mod ibgda;
pub mod p2p;
pub mod proxy;
pub mod routed;
pub mod sym;

pub use ibgda::Ibgda;
pub use p2p::P2p;
pub use proxy::Proxy;
pub use routed::Routed;
pub use sym::{Get, Part, Put, RawSignal, RawWait, RawXfer, Signal, Sym};

pub use crate::heap::{Arg, Call, Cmp, CommError, ErrorKind, ErrorReport};
use crate::heap::{Checked, BLOCK_RESULT_OFFSET};
pub use crate::sync::Timeout;

/// What a signal does to the target word.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOp {
    /// Store the value.
    Set = 0,
    /// Add the value (atomically).
    Add = 1,
}

/// Who cooperates in a data-moving call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coop {
    /// One thread.
    Thread,
    /// The 32 lanes of a warp, converged.
    Warp,
    /// Every thread of the block.
    Block,
}

impl Coop {
    /// (this thread's index in the group, group size).
    #[inline(always)]
    pub fn index_and_size(self) -> (u64, u64) {
        match self {
            Coop::Thread => (0, 1),
            Coop::Warp => (crate::ptx::lane_id() as u64, 32),
            Coop::Block => (
                crate::ptx::thread_rank_in_block() as u64,
                (crate::ptx::block_dim_x() * crate::ptx::block_dim_y() * crate::ptx::block_dim_z()) as u64,
            ),
        }
    }
    /// True on the one thread of the group that signals for it.
    #[inline(always)]
    pub fn is_leader(self) -> bool {
        self.index_and_size().0 == 0
    }
    /// Orders the group's earlier memory operations before the leader's next
    /// one (a warp or block barrier; nothing for one thread).
    #[inline(always)]
    pub fn sync(self) {
        match self {
            Coop::Thread => {}
            Coop::Warp => crate::ptx::sync_warp(crate::ptx::FULL_MASK),
            Coop::Block => crate::ptx::sync_threads(),
        }
    }
}

/// The device communication API (the transport contract), implemented by every
/// transport. See the module docs for the per-call table.
///
/// A transport implements the `_raw` calls (byte pointers, the group as a
/// [`Coop`], blocking or not in the arguments); the typed calls on top
/// ([`Self::put`], [`Self::get`], [`Self::signal`], the waits) take
/// [`Part`]s of [`Sym`] buffers, check each against its own buffer, and
/// compile to the raw call.
pub trait Transport: Copy + Checked {
    /// Whether ranks may form nodes under this transport (some pairs by
    /// load/store, others through the NIC): the library's all-reduce
    /// builds its hierarchical algorithm only into entries where this
    /// holds (the routed transport, and the CPU proxy, which reaches the
    /// peers of its node by load/store).
    const NODES: bool = false;

    /// This rank.
    fn rank(&self) -> u32;
    /// Number of ranks.
    fn world_size(&self) -> u32;

    /// The address at which this thread can load from and store to `peer`'s
    /// copy of the symmetric location `local`, when the route allows direct
    /// access (same GPU, NVLink, PCIe P2P); `None` otherwise (RDMA peers, a
    /// bad `peer`, `local` outside the heap). The fast path of collectives.
    fn peer_ptr<T>(&self, local: *const T, peer: u32) -> Option<*mut T>;

    /// Copies `x.bytes` from local `x.src` to the symmetric `x.dst` on
    /// `peer`, then, with `signal`, applies it to the symmetric word there
    /// (the peer that sees the signal sees the data). `x.nbi`: completes at
    /// `quiet` instead of on return.
    ///
    /// # Safety
    /// `x.src` is valid for `x.bytes`; every thread of `g` passes the same
    /// arguments; a signal word is only accessed atomically by every party.
    unsafe fn put_raw(&self, g: Coop, peer: u32, x: RawXfer, signal: Option<RawSignal>) -> Result<(), CommError>;

    /// Every lane of a converged warp puts its own `x` to `peer` — each
    /// lane its own bytes (0: none), and its own signal after them, if
    /// any. Each lane's signal follows that lane's data; nothing orders one
    /// lane's transfer against another's. `x.nbi`: the whole warp's puts
    /// complete at `quiet` instead of on return. Every lane's arguments
    /// are checked before anything is written; when one is refused, every
    /// lane returns the error of the lowest lane refused.
    ///
    /// IBGDA posts the warp's WQEs as one run behind one doorbell (one
    /// reservation, one completion), and marks the run's WRITEs after its
    /// first as needing no order among themselves
    /// ([`crate::mlx5::UNORDERED_WRITE_IMM`]); the default puts lane by
    /// lane, each lane as one thread.
    ///
    /// # Safety
    /// All 32 lanes call it, converged; each lane's `x.src` is valid for
    /// its `x.bytes`; `x.nbi` is the same on every lane; signal words are
    /// only accessed atomically by every party.
    unsafe fn put_lanes_raw(&self, peer: u32, x: RawXfer, signal: Option<RawSignal>) -> Result<(), CommError> {
        warp_verdict(check_put(self, peer, &x, signal))?;
        // SAFETY: the caller's contract; checked.
        let r = unsafe { self.put_raw(Coop::Thread, peer, x, signal) };
        // Every lane has posted before any lane goes on, so that a `quiet`
        // by one lane afterwards covers the whole warp's puts.
        crate::ptx::sync_warp(u32::MAX);
        r
    }

    /// Every lane of a converged warp puts `count` transfers of its own to
    /// `peer` (lanes may pass different counts): its `i`-th is `x(i)`, for
    /// `i < count` (0 bytes: nothing moves, but its destination must still
    /// lie in the heap's user part). The many-messages-per-lane shape (a
    /// lane's tokens, rows or flags): one call posts what `count` calls of
    /// [`Self::put_lanes_raw`] would, without a signal. Nothing orders one
    /// transfer against another. `nbi` is the call's, for every transfer
    /// (each `x(i).nbi` is not read): the whole warp's puts complete at
    /// `quiet` instead of on return. Every transfer of every lane is
    /// checked before anything is written; when one is refused, every lane
    /// returns the error of the lowest lane refused (its first refused
    /// transfer).
    ///
    /// IBGDA posts the warp's transfers as one run behind one doorbell (one
    /// reservation, one completion) when every lane names the same `peer`,
    /// each transfer fits one WQE (at most the handle's largest message)
    /// and the run fits the send queue; else, as the default does, it puts
    /// round by round, one [`Self::put_lanes_raw`] call per index `i`
    /// (where a transport checks a source only as it posts it, the rounds
    /// before a refused one are written).
    ///
    /// `x` runs on each lane on its own (lanes out of step): it must not
    /// use warp-wide operations (`shfl`, `vote`, `sync_warp`).
    ///
    /// # Safety
    /// All 32 lanes call it, converged, with the same `nbi`; `x` returns
    /// the same transfer each time it is called with the same index (it is
    /// called more than once per index), each source valid for its bytes.
    unsafe fn put_lanes_many_raw(&self, peer: u32, count: u32, nbi: bool, x: impl Fn(u32) -> RawXfer) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { put_lanes_rounds(self, peer, count, nbi, x) }
    }

    /// Copies `x.bytes` from the symmetric `x.src` on `peer` to local `x.dst`.
    ///
    /// # Safety
    /// `x.dst` is valid for `x.bytes`; every thread of `g` passes the same arguments.
    unsafe fn get_raw(&self, g: Coop, peer: u32, x: RawXfer) -> Result<(), CommError>;

    /// Applies `s` to the symmetric word on `peer`, with release semantics:
    /// the peer that sees it sees the calling thread's earlier puts. To
    /// publish a warp's or block's puts, order them before this thread with
    /// a barrier and call [`Self::fence`] first (or put with a signal, which
    /// does both). One thread.
    ///
    /// # Safety
    /// The word is only accessed atomically by every party.
    unsafe fn signal_raw(&self, peer: u32, s: RawSignal) -> Result<(), CommError>;

    /// Spins until this rank's symmetric word `*word cmp value` holds,
    /// with acquire semantics; returns the value seen. One thread.
    ///
    /// # Safety
    /// As for [`Self::signal_raw`].
    unsafe fn wait_word_raw(&self, word: *const u64, cmp: Cmp, value: u64) -> Result<u64, CommError>;

    /// Spins until `w.words[i] w.cmp w.value` holds for at least one `i`
    /// whose bit is clear in `skip`; returns the mask of every such word
    /// that holds (non-empty). Acquire. One thread.
    ///
    /// # Safety
    /// As for [`Self::signal_raw`].
    unsafe fn wait_some_raw(&self, w: RawWait, skip: u64) -> Result<u64, CommError>;

    /// Orders the calling thread's earlier puts — and those of the threads
    /// ordered before it by a warp or block barrier — before its later puts
    /// and signals, to every peer. One thread.
    fn fence(&self);

    /// Completes every earlier put/get of the calling thread: to `peer`, or
    /// to every peer with `None`.
    ///
    /// # Safety
    /// One thread; no other thread of the rank shares its queues meanwhile
    /// unless the transport says otherwise.
    unsafe fn quiet(&self, peer: Option<u32>) -> Result<(), CommError>;

    /// Barrier across all ranks, by ONE thread per rank. Bounded.
    ///
    /// # Safety
    /// Exactly one thread per rank is in a barrier at a time.
    unsafe fn barrier(&self) -> Result<(), CommError>;

    // ---- provided: the block barrier and the typed calls -----------------

    /// [`Self::barrier`] from every thread of one block per rank: thread 0
    /// runs it between two block barriers. All threads get the same result.
    ///
    /// # Safety
    /// As for `barrier`; one block per rank.
    unsafe fn barrier_block(&self) -> Result<(), CommError> {
        let result = (self.bounds().reporter.local_base + BLOCK_RESULT_OFFSET) as *mut u64;
        // Non-aligned on entry too: callers often do one thread's work just
        // before (`if first { signal }`), and LLVM may then copy an aligned
        // barrier into thread 0's path and the others' (a hang on an H200).
        crate::ptx::sync_threads_divergent();
        if crate::ptx::thread_rank_in_block() == 0 {
            // SAFETY: one block per rank (contract).
            let r = unsafe { self.barrier() };
            // SAFETY: reserved word, read after the block barrier below.
            unsafe { *result = if r.is_ok() { 0 } else { 1 } };
        }
        // Thread 0 arrives from its own path: the non-aligned barrier.
        crate::ptx::sync_threads_divergent();
        // SAFETY: written by thread 0 before the barrier.
        if unsafe { *result } == 0 {
            Ok(())
        } else {
            Err(CommError::Timeout(Timeout { seen: 0 }))
        }
    }

    /// Puts `p` to `peer` with the group `g`: its source into its
    /// destination (each checked against its own buffer; both the same
    /// length), then its signal, if any. Nothing is written when an
    /// argument is refused.
    ///
    /// # Safety
    /// The source is valid memory (a symmetric part, or [`Part::local`]
    /// memory); every thread of `g` passes the same arguments.
    #[inline(always)]
    unsafe fn put<T>(&self, g: Coop, peer: u32, p: Put<T>) -> Result<(), CommError> {
        let call = Call::put(p.signal.is_some(), p.nbi);
        sym::check_pair(self.bounds(), call, peer, p.dst, p.src)?;
        let signal = match p.signal {
            Some(s) => Some(sym::check_signal(self.bounds(), call, peer, s)?),
            None => None,
        };
        let x = RawXfer {
            dst: p.dst.as_ptr() as *mut u8,
            src: p.src.as_ptr() as *const u8,
            bytes: p.dst.bytes(),
            nbi: p.nbi,
        };
        // SAFETY: the caller's contract; the raw call checks the heap.
        unsafe { self.put_raw(g, peer, x, signal) }
    }

    /// Every lane of a converged warp puts its own `p` to `peer`: the
    /// many-small-messages shape (a token, a row, a flag per lane). A lane
    /// with nothing to send passes an empty part and no signal. Each
    /// lane's arguments are checked first; when any lane's is refused,
    /// nothing is written and every lane returns the error of the lowest
    /// lane refused. See [`Self::put_lanes_raw`].
    ///
    /// # Safety
    /// All 32 lanes call it, converged; each lane's source is valid
    /// memory; `nbi` is the same on every lane.
    #[inline(always)]
    unsafe fn put_lanes<T>(&self, peer: u32, p: Put<T>) -> Result<(), CommError> {
        let call = Call::put(p.signal.is_some(), p.nbi);
        let checked = sym::check_pair(self.bounds(), call, peer, p.dst, p.src).and_then(|_| match p.signal {
            Some(s) => sym::check_signal(self.bounds(), call, peer, s).map(Some),
            None => Ok(None),
        });
        let signal = warp_verdict(checked)?;
        let x = RawXfer {
            dst: p.dst.as_ptr() as *mut u8,
            src: p.src.as_ptr() as *const u8,
            bytes: p.dst.bytes(),
            nbi: p.nbi,
        };
        // SAFETY: the caller's contract; the raw call checks the heap.
        unsafe { self.put_lanes_raw(peer, x, signal) }
    }

    /// Every lane of a converged warp puts `count` parts of its own to
    /// `peer` (lanes may pass different counts): its `i`-th is
    /// `parts(i)`, a (destination, source) pair of the same length, each
    /// checked against its own buffer (an empty pair: nothing). No signal:
    /// publish the warp's puts with a warp barrier, [`Self::fence`] and a
    /// [`Self::signal`]. `nbi` is the call's. When any transfer is
    /// refused, nothing is written and every lane returns the error of the
    /// lowest lane refused. `parts` runs on each lane on its own (no
    /// warp-wide operations in it). See [`Self::put_lanes_many_raw`].
    ///
    /// ```
    /// use doorbell_kernels::transport::{Ibgda, P2p, Sym, Transport};
    /// use doorbell_kernels::{kernel, ptx};
    ///
    /// /// Lane `l` of warp 0 sends rows `l·n .. l·n + n` (`dim` floats each)
    /// /// of `rows` into the same rows of `peer`'s `inbox`, then lane 0
    /// /// completes the warp's puts.
    /// #[kernel(transports(P2p, Ibgda))]
    /// pub unsafe fn send_rows<T: Transport>(t: T, rows: Sym<f32>, inbox: Sym<f32>, peer: u32, n: u32, dim: u64) {
    ///     if ptx::warp_id_in_block() != 0 {
    ///         return;
    ///     }
    ///     let lane = ptx::lane_id() as u64;
    ///     let row = |i: u32| {
    ///         let at = (lane * n as u64 + i as u64) * dim;
    ///         (inbox.part(at, dim), rows.part(at, dim))
    ///     };
    ///     // SAFETY: the whole warp calls, to one peer, non-blocking.
    ///     let mut r = unsafe { t.put_lanes_many(peer, n, true, row) };
    ///     if lane == 0 {
    ///         // SAFETY: one thread completes the warp's puts.
    ///         r = r.and(unsafe { t.quiet(Some(peer)) });
    ///     }
    ///     let _ = r; // an error is also recorded for the host
    /// }
    /// # fn _f(_: <send_rows as doorbell_kernels::ForTransport<P2p>>::Kernel) {}
    /// ```
    ///
    /// # Safety
    /// As for [`Self::put_lanes_many_raw`]: all 32 lanes call it,
    /// converged, with the same `nbi`; `parts` returns the same
    /// pair each time it is called with the same index; each source is
    /// valid memory.
    #[inline(always)]
    unsafe fn put_lanes_many<T>(
        &self,
        peer: u32,
        count: u32,
        nbi: bool,
        parts: impl Fn(u32) -> (Part<T>, Part<T>),
    ) -> Result<(), CommError> {
        let call = Call::put(false, nbi);
        check_each(count, |i| {
            let (dst, src) = parts(i);
            sym::check_pair(self.bounds(), call, peer, dst, src)
        })?;
        let x = |i: u32| {
            let (dst, src) = parts(i);
            RawXfer {
                dst: dst.as_ptr() as *mut u8,
                src: src.as_ptr() as *const u8,
                bytes: dst.bytes(),
                nbi,
            }
        };
        // SAFETY: the caller's contract; the raw call checks the heap.
        unsafe { self.put_lanes_many_raw(peer, count, nbi, x) }
    }

    /// Gets `p` from `peer` with the group `g`: the peer's copy of its
    /// source into its (local) destination, each checked against its own
    /// buffer, both the same length.
    ///
    /// # Safety
    /// The destination is valid memory; every thread of `g` passes the
    /// same arguments.
    #[inline(always)]
    unsafe fn get<T>(&self, g: Coop, peer: u32, p: Get<T>) -> Result<(), CommError> {
        let call = if p.nbi { Call::GetNbi } else { Call::Get };
        sym::check_pair(self.bounds(), call, peer, p.dst, p.src)?;
        let x = RawXfer {
            dst: p.dst.as_ptr() as *mut u8,
            src: p.src.as_ptr() as *const u8,
            bytes: p.dst.bytes(),
            nbi: p.nbi,
        };
        // SAFETY: the caller's contract; the raw call checks the heap.
        unsafe { self.get_raw(g, peer, x) }
    }

    /// [`Self::signal_raw`] on a typed word ([`Sym::word`]), checked
    /// against its buffer. One thread.
    ///
    /// # Safety
    /// As for `signal_raw`.
    #[inline(always)]
    unsafe fn signal(&self, peer: u32, s: Signal) -> Result<(), CommError> {
        let raw = sym::check_signal(self.bounds(), Call::Signal, peer, s)?;
        // SAFETY: the caller's contract.
        unsafe { self.signal_raw(peer, raw) }
    }

    /// Spins until this rank's `word` (the first of the part) satisfies
    /// `cmp value`, with acquire semantics; returns the value seen. One
    /// thread.
    ///
    /// # Safety
    /// As for [`Self::signal_raw`].
    #[inline(always)]
    unsafe fn wait_until(&self, word: Part<u64>, cmp: Cmp, value: u64) -> Result<u64, CommError> {
        let w = sym::check_words(self.bounds(), Call::WaitUntil, word.part(0, 1))?;
        // SAFETY: the caller's contract.
        unsafe { self.wait_word_raw(w, cmp, value) }
    }

    /// Spins until one of `words` (1..=64) satisfies `cmp value`; returns
    /// its index in the part. One thread.
    ///
    /// # Safety
    /// As for [`Self::signal_raw`].
    #[inline(always)]
    unsafe fn wait_until_any(&self, words: Part<u64>, cmp: Cmp, value: u64) -> Result<u32, CommError> {
        let w = sym::check_words(self.bounds(), Call::WaitUntilAny, words)?;
        let raw = RawWait {
            words: w,
            count: words.len().min(u32::MAX as u64) as u32,
            cmp,
            value,
        };
        // SAFETY: the caller's contract.
        let mask = unsafe { self.wait_some_raw(raw, 0) }?;
        Ok(mask.trailing_zeros())
    }

    /// Spins until every word of `words` (1..=64) satisfies `cmp value`.
    /// One thread. The budget restarts whenever another word arrives
    /// (progress is not a hang).
    ///
    /// # Safety
    /// As for [`Self::signal_raw`].
    #[inline(always)]
    unsafe fn wait_until_all(&self, words: Part<u64>, cmp: Cmp, value: u64) -> Result<(), CommError> {
        let w = sym::check_words(self.bounds(), Call::WaitUntilAll, words)?;
        let count = words.len().min(u32::MAX as u64) as u32;
        // SAFETY: the caller's contract.
        unsafe {
            wait_all_raw(
                self,
                RawWait {
                    words: w,
                    count,
                    cmp,
                    value,
                },
            )
        }
    }
}

/// Spins until all `w.count` (1..=64) words satisfy the comparison, by
/// repeated [`Transport::wait_some_raw`] calls that skip the words already
/// seen.
///
/// # Safety
/// As for [`Transport::wait_some_raw`].
#[inline(always)]
pub unsafe fn wait_all_raw<T: Transport>(t: &T, w: RawWait) -> Result<(), CommError> {
    let all = if w.count >= 64 { u64::MAX } else { (1u64 << w.count) - 1 };
    let mut done = 0u64;
    while done != all {
        // SAFETY: the caller's contract.
        done |= unsafe { t.wait_some_raw(w, done) }?;
    }
    Ok(())
}

/// The body of [`Transport::wait_some_raw`] every transport shares: checks
/// the count (1..=64) and the words (aligned, in the heap), then polls them
/// with `load` (an acquire load at the transport's scope) until one not in
/// `skip` holds, within the handle's budget.
#[inline(always)]
pub(crate) fn wait_some_words<C: Checked>(c: &C, w: RawWait, skip: u64, load: impl Fn(*const u64) -> u64) -> Result<u64, CommError> {
    let RawWait { words, count, cmp, value } = w;
    let call = Call::WaitUntilSome;
    let b = c.bounds();
    let off = (words as u64).wrapping_sub(b.reporter.local_base);
    if count == 0 || count > 64 {
        return Err(c.fail(CommError::BadCount { count: count as u64 }, call, Arg::Signal, u32::MAX, off));
    }
    let off = b.range(call, Arg::Signal, words as u64, 8 * count as u64, b.reporter.rank)?;
    if off & 7 != 0 {
        return Err(c.fail(CommError::Misaligned { offset: off }, call, Arg::Signal, u32::MAX, off));
    }
    crate::trace::hook! { let span = crate::trace::span(c.traced(), b.reporter.local_base, crate::trace::What::Wait, u32::MAX, off); }
    let mut spin = crate::sync::Spin::new(b.reporter.budget_ns);
    loop {
        let mut ready = 0u64;
        let mut last = 0u64;
        for i in 0..count {
            if skip & (1u64 << i) == 0 {
                last = load(words.wrapping_add(i as usize));
                if cmp.holds(last, value) {
                    ready |= 1u64 << i;
                }
            }
        }
        if ready != 0 {
            crate::trace::hook! { span.end(ready); }
            return Ok(ready);
        }
        if !spin.again() {
            let first = (!skip).trailing_zeros().min(count - 1);
            let at = words as u64 + first as u64 * 8;
            return Err(c.fail_wait(Timeout { seen: last }, call, u32::MAX, at, cmp, value));
        }
    }
}

/// [`Transport::put_lanes_many_raw`] as rounds of
/// [`Transport::put_lanes_raw`]: every lane's transfers checked first (no
/// transfer written when one is refused), then index `i` of every lane in
/// round `i` (a lane whose `count` is past `i` puts nothing), as many
/// rounds as the warp's largest `count`; the first failed round ends it.
///
/// # Safety
/// As for [`Transport::put_lanes_many_raw`].
#[inline(always)]
pub(crate) unsafe fn put_lanes_rounds<T: Transport>(
    t: &T,
    peer: u32,
    count: u32,
    nbi: bool,
    x: impl Fn(u32) -> RawXfer,
) -> Result<(), CommError> {
    check_each(count, |i| check_put(t, peer, &RawXfer { nbi, ..x(i) }, None).map(drop))?;
    let rounds = warp_max_u32(count);
    let mut r = Ok(());
    let mut i = 0;
    while i < rounds && r.is_ok() {
        let xi = if i < count {
            RawXfer { nbi, ..x(i) }
        } else {
            // Nothing, at the start of the heap's user part (which every
            // check accepts).
            let at = (t.bounds().reporter.local_base + crate::heap::HEAP_RESERVED) as *mut u8;
            RawXfer {
                dst: at,
                src: at,
                bytes: 0,
                nbi,
            }
        };
        // SAFETY: the caller's contract; every lane's transfers checked.
        // One verdict for the warp: a transport's per-lane results (one
        // lane's source refused) must not split it between rounds.
        r = warp_verdict(unsafe { t.put_lanes_raw(peer, xi, None) });
        i += 1;
    }
    // Every lane has posted before any goes on, so that a `quiet` by one
    // lane afterwards covers the whole warp's puts.
    crate::ptx::sync_warp(crate::ptx::FULL_MASK);
    r
}

/// Checks this lane's transfers `0..count` with `check`, stopping at the
/// first refused, then returns the warp's verdict ([`warp_verdict`]): on
/// every lane, `Ok` or the error of the lowest lane refused. All 32 lanes
/// call it, converged.
#[inline(always)]
pub(crate) fn check_each(count: u32, mut check: impl FnMut(u32) -> Result<(), CommError>) -> Result<(), CommError> {
    let mut mine = Ok(());
    let mut i = 0;
    while i < count && mine.is_ok() {
        mine = check(i);
        i += 1;
    }
    warp_verdict(mine)
}

/// The largest `v` of the warp's lanes, on every lane. All 32 lanes call
/// it, converged.
#[inline(always)]
pub(crate) fn warp_max_u32(v: u32) -> u32 {
    let mut m = v;
    let mut d = 16;
    while d > 0 {
        m = m.max(crate::ptx::shfl_sync_xor_u32(crate::ptx::FULL_MASK, m, d));
        d /= 2;
    }
    m
}

/// The verdict of a warp whose every lane checked its own arguments:
/// `mine` on every lane when no lane was refused, else, on every lane, the
/// error of the lowest lane refused (each refused lane has recorded its
/// own report). All 32 lanes call it, converged.
#[inline(always)]
pub(crate) fn warp_verdict<T>(mine: Result<T, CommError>) -> Result<T, CommError> {
    let bad = crate::ptx::vote_sync_ballot(crate::ptx::FULL_MASK, mine.is_err());
    if bad == 0 {
        return mine;
    }
    let w = match &mine {
        Err(e) => e.to_words(),
        Ok(_) => [0; 4],
    };
    let src = bad.trailing_zeros();
    let w = w.map(|v| crate::ptx::shfl_sync_idx_u64(crate::ptx::FULL_MASK, v, src));
    Err(CommError::from_words(w))
}

/// A put's checks every transport makes before it writes anything: the
/// destination bytes and the signal word (when there is one) on `peer`, in
/// the heap's user part. Returns the call and the two heap offsets.
#[inline(always)]
pub(crate) fn check_put<C: Checked>(c: &C, peer: u32, x: &RawXfer, signal: Option<RawSignal>) -> Result<(Call, u64, u64), CommError> {
    let call = Call::put(signal.is_some(), x.nbi);
    let off = c.check_range(call, Arg::Destination, x.dst as u64, x.bytes, peer)?;
    let sig_off = match signal {
        Some(s) => c.check_signal(call, s.word as u64, peer)?,
        None => 0,
    };
    Ok((call, off, sig_off))
}
