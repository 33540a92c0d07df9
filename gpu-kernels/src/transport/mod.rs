//! The device API every transport implements: **the transport contract**.
//!
//! A kernel receives a transport handle (e.g. [`P2p`]) by value and calls the
//! [`Transport`] methods on it. Write the body once, generic over the
//! transport, and let `#[kernel(transports(...))]` export one PTX entry per
//! transport — no hand-written wrappers:
//!
//! ```
//! use doorbell_kernels::kernel;
//! use doorbell_kernels::transport::{Ibgda, P2p, SignalOp, Transport};
//!
//! #[kernel(transports(P2p, Ibgda))]      // entries `ring_p2p`, `ring_ibgda`
//! pub unsafe fn ring<T: Transport>(t: T, buf: *mut u8, sig: *mut u64, n: u64) {
//!     let next = (t.rank() + 1) % t.world_size();
//!     // SAFETY: `buf` (n bytes) and `sig` are symmetric (the launcher's contract).
//!     let _ = unsafe { t.put_signal_block(buf, buf, n, sig, 1, SignalOp::Add, next) };
//! }
//! // host: module.function::<<ring as ForTransport<P2p>>::Kernel>()
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
//! ## Where memory may lie
//! | argument | must lie in | why |
//! |---|---|---|
//! | destination of a put, source of a get, every signal word | the symmetric heap (checked on every call) | it is translated to the peer's copy; an RDMA transport needs the peer's key for it |
//! | source of a put, destination of a get | the symmetric heap or a buffer registered with the communicator | an RDMA transport needs a local key; P2P accepts any device memory and does not check it |
//!
//! ## The calls
//! Suffixes say who calls: `_warp` — all 32 lanes of a warp, converged, same
//! arguments; `_block` — every thread of the block; none — one thread. Every
//! call that can fail returns [`Result`]`<_, `[`CommError`]`>`; the first
//! error of a rank is also recorded in its heap header
//! ([`crate::heap::ErrorReport`]) and the host's `Communicator::check` /
//! `synchronize` turn it into an error naming rank, call, peer and offset.
//! A call rejected for a bad argument writes nothing.
//!
//! | call | publishes / observes | scope | pairs with | who calls |
//! |---|---|---|---|---|
//! | `put_{warp,block}` | nothing by itself (weak stores); the source may be reused on return | — | a later `signal`, `fence` or `quiet` | warp / block |
//! | `put_nbi_{warp,block}` | as `put`, completes at `quiet` (the source must stay unchanged until then) | — | `quiet` | warp / block |
//! | `get_{warp,block}` | the data is in the local destination on return | — | the peer's `signal` that published it | warp / block |
//! | `get_nbi_{warp,block}` | the data is in the destination after `quiet` | — | `quiet` | warp / block |
//! | `put_signal_{warp,block}` (`_nbi` too) | the data, then the signal: the peer that sees the signal sees the data | sys (gpu when every rank shares one GPU) | the peer's `wait_until*` | warp / block |
//! | `signal` | every earlier put of the calling thread to that peer (a release); a warp's or block's puts: barrier, then `fence`, then `signal` — or one `put_signal_*` | sys (gpu on one GPU) | the peer's `wait_until*` | one thread |
//! | `wait_until`, `wait_until_{any,all,some}` | acquires what the matching signals published | sys (gpu on one GPU) | `signal`, `put_signal` | one thread |
//! | `fence` | orders the calling thread's earlier puts — and, after a warp/block barrier, its group's — before its later puts and signals | sys | — | one thread |
//! | `quiet`, `quiet_peer` | completes every earlier put/get (`_nbi` included) of the calling thread, to all peers / one | sys | — | one thread |
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
//! comparisons against values in the handle, folded into one predicate and
//! one branch; only a bad argument takes it, to one out-of-line cold
//! function that works out which check failed and records the report
//! ([`crate::heap::HeapBounds`]). See `p2p_bench`'s `checks` row for the
//! measured cost.

pub mod ibgda;
pub mod p2p;
pub mod routed;

pub use ibgda::Ibgda;
pub use p2p::P2p;
pub use routed::Routed;

pub use crate::heap::{Call, ErrorKind, ErrorReport};
pub use crate::sync::Timeout;

/// Comparison for the `wait_until*` calls.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// `==`
    Eq = 0,
    /// `!=`
    Ne = 1,
    /// `>`
    Gt = 2,
    /// `>=`
    Ge = 3,
    /// `<`
    Lt = 4,
    /// `<=`
    Le = 5,
}

impl Cmp {
    /// Applies the comparison.
    #[inline(always)]
    pub fn holds(self, seen: u64, value: u64) -> bool {
        match self {
            Cmp::Eq => seen == value,
            Cmp::Ne => seen != value,
            Cmp::Gt => seen > value,
            Cmp::Ge => seen >= value,
            Cmp::Lt => seen < value,
            Cmp::Le => seen <= value,
        }
    }
    /// The operator, for messages (`==`, `>=`, ...).
    pub fn symbol(self) -> &'static str {
        match self {
            Cmp::Eq => "==",
            Cmp::Ne => "!=",
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
            Cmp::Lt => "<",
            Cmp::Le => "<=",
        }
    }

    /// From the raw value stored in a report.
    pub fn from_u32(v: u32) -> Option<Cmp> {
        Some(match v {
            0 => Cmp::Eq,
            1 => Cmp::Ne,
            2 => Cmp::Gt,
            3 => Cmp::Ge,
            4 => Cmp::Lt,
            5 => Cmp::Le,
            _ => return None,
        })
    }
}

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

/// Why a device call failed. The first error of a rank is also recorded in
/// its heap header for the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommError {
    /// A bounded wait ran out of budget (the report says which word).
    Timeout(Timeout),
    /// A completion came back with an error (RDMA): the peer and the
    /// completion's syndrome.
    Completion {
        /// The peer of the failed operation.
        peer: u32,
        /// The completion's syndrome byte.
        syndrome: u8,
    },
    /// `peer` is not a rank of this world.
    BadPeer {
        /// The rank asked for.
        peer: u32,
    },
    /// `[offset, offset + bytes)` is not inside the symmetric heap (or the
    /// registered memory the call needs).
    OutOfRange {
        /// Offset from the heap base (wrapping: huge when below it).
        offset: u64,
        /// Bytes of the range.
        bytes: u64,
    },
    /// A signal word that is not 8-byte aligned.
    Misaligned {
        /// Its offset from the heap base.
        offset: u64,
    },
    /// A count out of range (e.g. more than 64 words for `wait_until_some`).
    BadCount {
        /// The count given.
        count: u64,
    },
}

/// The device communication API (the transport contract), implemented by every
/// transport. See the module docs for the per-call table.
///
/// The required methods take a [`Coop`] so each transport writes each
/// operation once; the conventional names (`put_warp`, `put_nbi_block`,
/// ...) are provided on top and compile to the same code.
pub trait Transport: Copy {
    /// This rank.
    fn rank(&self) -> u32;
    /// Number of ranks.
    fn world_size(&self) -> u32;

    /// The address at which this thread can load from and store to `peer`'s
    /// copy of the symmetric location `local`, when the route allows direct
    /// access (same GPU, NVLink, PCIe P2P); `None` otherwise (RDMA peers, a
    /// bad `peer`, `local` outside the heap). The fast path of collectives.
    fn peer_ptr<T>(&self, local: *const T, peer: u32) -> Option<*mut T>;

    /// Copies `bytes` from `src` (local) to the symmetric `dst` on `peer`.
    /// `nbi`: completes at `quiet` instead of on return.
    ///
    /// # Safety
    /// `src` is valid for `bytes`; every thread of `g` passes the same arguments.
    unsafe fn put_coop(&self, g: Coop, dst: *mut u8, src: *const u8, bytes: u64, peer: u32, nbi: bool) -> Result<(), CommError>;

    /// Copies `bytes` from the symmetric `src` on `peer` to local `dst`.
    ///
    /// # Safety
    /// `dst` is valid for `bytes`; every thread of `g` passes the same arguments.
    unsafe fn get_coop(&self, g: Coop, dst: *mut u8, src: *const u8, bytes: u64, peer: u32, nbi: bool) -> Result<(), CommError>;

    /// Copies `bytes` to the symmetric `dst` on `peer`, then applies `op`
    /// with `value` to the symmetric signal word `sig` there; the peer sees
    /// the data once it sees the signal. Ordered by the transport.
    ///
    /// # Safety
    /// As for [`Self::put_coop`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn put_signal_coop(
        &self,
        g: Coop,
        dst: *mut u8,
        src: *const u8,
        bytes: u64,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        peer: u32,
        nbi: bool,
    ) -> Result<(), CommError>;

    /// Applies `op` with `value` to the symmetric signal word `sig` on
    /// `peer`, with release semantics: the peer that sees it sees the calling
    /// thread's earlier puts. To publish a warp's or block's puts, order them
    /// before this thread with a barrier and call [`Self::fence`] first (or
    /// use `put_signal_*`, which does both). One thread.
    ///
    /// # Safety
    /// `sig` is only accessed atomically by every party.
    unsafe fn signal(&self, sig: *mut u64, value: u64, op: SignalOp, peer: u32) -> Result<(), CommError>;

    /// Spins until this rank's signal word `*sig cmp value` holds, with
    /// acquire semantics. Returns the value seen. One thread.
    ///
    /// # Safety
    /// As for [`Self::signal`].
    unsafe fn wait_until(&self, sig: *const u64, cmp: Cmp, value: u64) -> Result<u64, CommError>;

    /// Spins until `sigs[i] cmp value` holds for at least one `i` whose bit
    /// is clear in `skip`, among `count` (1..=64) consecutive signal words;
    /// returns the mask of every such word that holds (non-empty). Acquire.
    /// One thread. `wait_until_any` and `wait_until_all` build on it.
    ///
    /// # Safety
    /// As for [`Self::signal`].
    unsafe fn wait_until_some(&self, sigs: *const u64, count: u32, skip: u64, cmp: Cmp, value: u64) -> Result<u64, CommError>;

    /// Orders the calling thread's earlier puts — and those of the threads
    /// ordered before it by a warp or block barrier — before its later puts
    /// and signals, to every peer. One thread.
    fn fence(&self);

    /// Completes every earlier put/get of the calling thread, to every peer.
    ///
    /// # Safety
    /// One thread; no other thread of the rank shares its queues meanwhile
    /// unless the transport says otherwise.
    unsafe fn quiet(&self) -> Result<(), CommError>;

    /// [`Self::quiet`] for the operations to one peer.
    ///
    /// # Safety
    /// As for `quiet`.
    unsafe fn quiet_peer(&self, peer: u32) -> Result<(), CommError>;

    /// Barrier across all ranks, by ONE thread per rank. Bounded.
    ///
    /// # Safety
    /// Exactly one thread per rank is in a barrier at a time.
    unsafe fn barrier(&self) -> Result<(), CommError>;

    /// [`Self::barrier`] from every thread of one block per rank: thread 0
    /// runs it between two block barriers. All threads get the same result.
    ///
    /// # Safety
    /// As for `barrier`; one block per rank.
    unsafe fn barrier_block(&self) -> Result<(), CommError>;

    // ---- the conventional names ------------------------------------------

    /// [`Self::put_coop`] by a warp, blocking.
    ///
    /// # Safety
    /// As for `put_coop`.
    #[inline(always)]
    unsafe fn put_warp(&self, dst: *mut u8, src: *const u8, bytes: u64, peer: u32) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.put_coop(Coop::Warp, dst, src, bytes, peer, false) }
    }
    /// [`Self::put_coop`] by a block, blocking.
    ///
    /// # Safety
    /// As for `put_coop`.
    #[inline(always)]
    unsafe fn put_block(&self, dst: *mut u8, src: *const u8, bytes: u64, peer: u32) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.put_coop(Coop::Block, dst, src, bytes, peer, false) }
    }
    /// [`Self::put_coop`] by a warp, non-blocking (completes at `quiet`).
    ///
    /// # Safety
    /// As for `put_coop`; `src` unchanged until `quiet`.
    #[inline(always)]
    unsafe fn put_nbi_warp(&self, dst: *mut u8, src: *const u8, bytes: u64, peer: u32) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.put_coop(Coop::Warp, dst, src, bytes, peer, true) }
    }
    /// [`Self::put_coop`] by a block, non-blocking (completes at `quiet`).
    ///
    /// # Safety
    /// As for `put_nbi_warp`.
    #[inline(always)]
    unsafe fn put_nbi_block(&self, dst: *mut u8, src: *const u8, bytes: u64, peer: u32) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.put_coop(Coop::Block, dst, src, bytes, peer, true) }
    }
    /// [`Self::get_coop`] by a warp, blocking.
    ///
    /// # Safety
    /// As for `get_coop`.
    #[inline(always)]
    unsafe fn get_warp(&self, dst: *mut u8, src: *const u8, bytes: u64, peer: u32) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.get_coop(Coop::Warp, dst, src, bytes, peer, false) }
    }
    /// [`Self::get_coop`] by a block, blocking.
    ///
    /// # Safety
    /// As for `get_coop`.
    #[inline(always)]
    unsafe fn get_block(&self, dst: *mut u8, src: *const u8, bytes: u64, peer: u32) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.get_coop(Coop::Block, dst, src, bytes, peer, false) }
    }
    /// [`Self::get_coop`] by a warp, non-blocking (data after `quiet`).
    ///
    /// # Safety
    /// As for `get_coop`.
    #[inline(always)]
    unsafe fn get_nbi_warp(&self, dst: *mut u8, src: *const u8, bytes: u64, peer: u32) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.get_coop(Coop::Warp, dst, src, bytes, peer, true) }
    }
    /// [`Self::get_coop`] by a block, non-blocking (data after `quiet`).
    ///
    /// # Safety
    /// As for `get_coop`.
    #[inline(always)]
    unsafe fn get_nbi_block(&self, dst: *mut u8, src: *const u8, bytes: u64, peer: u32) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.get_coop(Coop::Block, dst, src, bytes, peer, true) }
    }
    /// [`Self::put_signal_coop`] by a warp, blocking.
    ///
    /// # Safety
    /// As for `put_signal_coop`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn put_signal_warp(
        &self,
        dst: *mut u8,
        src: *const u8,
        bytes: u64,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        peer: u32,
    ) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.put_signal_coop(Coop::Warp, dst, src, bytes, sig, value, op, peer, false) }
    }
    /// [`Self::put_signal_coop`] by a block, blocking.
    ///
    /// # Safety
    /// As for `put_signal_coop`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn put_signal_block(
        &self,
        dst: *mut u8,
        src: *const u8,
        bytes: u64,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        peer: u32,
    ) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.put_signal_coop(Coop::Block, dst, src, bytes, sig, value, op, peer, false) }
    }
    /// [`Self::put_signal_coop`] by a warp, non-blocking.
    ///
    /// # Safety
    /// As for `put_signal_coop`; `src` unchanged until `quiet`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn put_signal_nbi_warp(
        &self,
        dst: *mut u8,
        src: *const u8,
        bytes: u64,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        peer: u32,
    ) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.put_signal_coop(Coop::Warp, dst, src, bytes, sig, value, op, peer, true) }
    }
    /// [`Self::put_signal_coop`] by a block, non-blocking.
    ///
    /// # Safety
    /// As for `put_signal_nbi_warp`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn put_signal_nbi_block(
        &self,
        dst: *mut u8,
        src: *const u8,
        bytes: u64,
        sig: *mut u64,
        value: u64,
        op: SignalOp,
        peer: u32,
    ) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.put_signal_coop(Coop::Block, dst, src, bytes, sig, value, op, peer, true) }
    }
    /// Spins until one of `count` (1..=64) consecutive signal words satisfies
    /// `cmp value`; returns its index. One thread.
    ///
    /// # Safety
    /// As for `signal`.
    #[inline(always)]
    unsafe fn wait_until_any(&self, sigs: *const u64, count: u32, cmp: Cmp, value: u64) -> Result<u32, CommError> {
        // SAFETY: the caller's contract.
        let mask = unsafe { self.wait_until_some(sigs, count, 0, cmp, value) }?;
        Ok(mask.trailing_zeros())
    }
    /// Spins until all `count` (1..=64) consecutive signal words satisfy
    /// `cmp value`. One thread. The budget restarts whenever another word
    /// arrives (progress is not a hang).
    ///
    /// # Safety
    /// As for `signal`.
    #[inline(always)]
    unsafe fn wait_until_all(&self, sigs: *const u64, count: u32, cmp: Cmp, value: u64) -> Result<(), CommError> {
        let all = if count >= 64 { u64::MAX } else { (1u64 << count) - 1 };
        let mut done = 0u64;
        while done != all {
            // SAFETY: the caller's contract.
            done |= unsafe { self.wait_until_some(sigs, count, done, cmp, value) }?;
        }
        Ok(())
    }
}
