//! The device API of the communicator: one API for every transport.
//!
//! A kernel receives a transport handle (e.g. [`P2p`]) by value and calls
//! `put`/`get`/`signal`/`wait_until`/`quiet`/`barrier` on it. Write the body
//! generic over [`Transport`] and keep the `#[kernel]` entry point thin, so
//! the IBGDA transport plugs in without touching the body:
//!
//! ```ignore
//! #[kernel]
//! pub unsafe fn my_kernel(t: P2p, buf: *mut u8, n: u64) { unsafe { body(&t, buf, n) } }
//! unsafe fn body<T: Transport>(t: &T, buf: *mut u8, n: u64) { /* ... */ }
//! ```
//!
//! ## Symmetric memory
//! Every rank owns a symmetric heap of the same size, allocated collectively
//! on the host; buffers carved from it sit at the same offset on every rank.
//! Device calls take **local** addresses (this rank's copy of a symmetric
//! buffer) and a destination `pe`; the transport translates.
//!
//! ## Memory ordering, per call
//! | call | publishes / observes | scope | pairs with |
//! |---|---|---|---|
//! | `put_*` | nothing by itself (weak stores) | — | a later `signal`, `fence` or `quiet` |
//! | `signal` (set/add) | every earlier `put` of the calling thread — and, after a block/warp barrier, of its block/warp — to `pe` | sys | the target's `wait_until` |
//! | `wait_until` | acquires what the matching `signal` published | sys | `signal` |
//! | `fence` | orders earlier puts before later puts/signals of the calling thread | sys | — |
//! | `quiet` | completes every earlier put of the calling thread (P2P: stores are visible once issued and fenced) | sys | — |
//! | `barrier` | all ranks arrive; everything each rank did before is visible to all after | sys | every other rank's `barrier` |
//!
//! ## Bounded waits
//! Every spin has a budget (`budget_ns` in the handle). On expiry the first
//! failing thread records [`WaitReport`] — rank, operation, peer, address
//! offset, comparison, expected and seen value — in the handle's error slot,
//! and the call returns `Err`; the kernel returns early and the host turns the
//! report into an error. Nothing hangs.

use crate::ptx;

/// Comparison for [`Transport::wait_until`].
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

    /// From the raw value stored in a [`WaitReport`].
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

/// Signal operation.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOp {
    /// Store the value.
    Set = 0,
    /// Add the value.
    Add = 1,
}

/// Which device operation ran out of budget.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOp {
    /// [`Transport::wait_until`].
    WaitUntil = 1,
    /// [`Transport::barrier`].
    Barrier = 2,
}

/// What a timed-out wait records (in device memory; the host reads it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitReport {
    /// 0: no report; 1: a report is present.
    pub present: u32,
    /// Rank that gave up.
    pub rank: u32,
    /// [`WaitOp`] as u32.
    pub op: u32,
    /// [`Cmp`] as u32.
    pub cmp: u32,
    /// The peer waited for (`u32::MAX` when any).
    pub peer: u32,
    /// Block index of the thread that gave up.
    pub block: u32,
    /// Offset of the waited word in the symmetric heap.
    pub offset: u64,
    /// Value expected (compared with `cmp`).
    pub expected: u64,
    /// Value last seen.
    pub seen: u64,
    /// Budget that ran out, ns.
    pub budget_ns: u64,
}
const _: () = assert!(core::mem::size_of::<WaitReport>() == 56);

/// The wait ran out of budget; the report is in the handle's error slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedOut {
    /// Value last seen.
    pub seen: u64,
}

/// Device-side communication API, implemented by every transport.
///
/// Collective suffixes: `_warp` functions are called by all 32 lanes of a
/// warp with the same arguments; `_block` by every thread of the block.
pub trait Transport {
    /// This rank.
    fn rank(&self) -> u32;
    /// Number of ranks.
    fn world_size(&self) -> u32;
    /// Copies `bytes` from local `src` to the symmetric `dst` on `pe`
    /// (warp-cooperative, vectorized when aligned). No ordering: follow with
    /// `signal`, `fence` or `quiet`.
    ///
    /// # Safety
    /// `dst` is a local address inside the symmetric heap with `bytes` valid
    /// on every rank; `src` is valid for `bytes`.
    unsafe fn put_warp(&self, dst: *mut u8, src: *const u8, bytes: u64, pe: u32);
    /// [`Self::put_warp`] by all threads of a block.
    ///
    /// # Safety
    /// As for `put_warp`.
    unsafe fn put_block(&self, dst: *mut u8, src: *const u8, bytes: u64, pe: u32);
    /// Copies `bytes` from the symmetric `src` on `pe` to local `dst`
    /// (warp-cooperative). The data is read when the call returns.
    ///
    /// # Safety
    /// Mirror of `put_warp`.
    unsafe fn get_warp(&self, dst: *mut u8, src: *const u8, bytes: u64, pe: u32);
    /// [`Self::get_warp`] by all threads of a block.
    ///
    /// # Safety
    /// As for `get_warp`.
    unsafe fn get_block(&self, dst: *mut u8, src: *const u8, bytes: u64, pe: u32);
    /// Sets or adds `value` to the symmetric 8-byte word `sig` on `pe`, with
    /// release semantics at system scope (see the module table). One thread.
    ///
    /// # Safety
    /// `sig` is an 8-byte aligned local address in the symmetric heap.
    unsafe fn signal(&self, sig: *mut u64, value: u64, op: SignalOp, pe: u32);
    /// Spins until `*sig cmp value` holds on this rank's word, with acquire
    /// semantics (pairs with `signal`). One thread. Bounded: on expiry it
    /// records a [`WaitReport`] and returns `Err`.
    ///
    /// # Safety
    /// As for `signal`.
    unsafe fn wait_until(&self, sig: *const u64, cmp: Cmp, value: u64) -> Result<u64, TimedOut>;
    /// Orders the calling thread's earlier puts before its later puts and signals.
    fn fence(&self);
    /// Completes all of the calling thread's earlier puts.
    fn quiet(&self);
    /// Barrier across all ranks, called by ONE thread per rank (use
    /// [`Self::barrier_block`] from a whole block). Bounded like `wait_until`.
    ///
    /// # Safety
    /// Exactly one thread per rank may be in a barrier at a time.
    unsafe fn barrier(&self) -> Result<(), TimedOut>;
    /// [`Self::barrier`] from every thread of one block per rank: thread 0
    /// runs it between two block barriers. All threads get the same result.
    ///
    /// # Safety
    /// As for `barrier`; one block per rank.
    unsafe fn barrier_block(&self) -> Result<(), TimedOut>;
}

/// Bytes at the start of every symmetric heap reserved for the runtime:
/// barrier slots (8 bytes per rank, up to [`MAX_RANKS`]), the local barrier
/// epoch, and the wait report.
pub const HEAP_RESERVED: u64 = 4096;
/// Most ranks a communicator supports.
pub const MAX_RANKS: u32 = 256;
/// Offset of the barrier epoch word (local to each rank).
pub const EPOCH_OFFSET: u64 = MAX_RANKS as u64 * 8;
/// Offset of the shared wait-report flag word + report.
pub const REPORT_OFFSET: u64 = EPOCH_OFFSET + 64;
/// Offset of the block-barrier result word.
pub const BLOCK_RESULT_OFFSET: u64 = REPORT_OFFSET + 128;
const _: () = assert!(BLOCK_RESULT_OFFSET + 8 <= HEAP_RESERVED);

/// The P2P transport's device handle: loads and stores straight into peers'
/// symmetric heaps (same GPU, NVLink or PCIe peers, or host memory on the
/// emulator). Plain `#[repr(C)]` data shared by host and device.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2p {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// `world` entries: each rank's heap base, mapped into this rank's
    /// address space (entry `rank` is the local heap).
    pub peers: *const u64,
    /// Heap size in bytes (same on every rank).
    pub heap_bytes: u64,
    /// Spin budget, ns.
    pub budget_ns: u64,
    /// 1 when every rank runs on this same GPU: signals and waits then use
    /// `.gpu` scope, which is cheaper than `.sys` (peers on other GPUs,
    /// processes on other GPUs, or the host need `.sys`).
    pub same_gpu: u32,
    /// Reserved, zero.
    pub _pad: u32,
    /// This rank's heap base (`peers[rank]`), kept here to save a load on
    /// every address translation.
    pub local_base: u64,
}
const _: () = assert!(core::mem::size_of::<P2p>() == 48);

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] plain data (integers and a pointer), 8-byte aligned,
// matching the struct-by-value parameter of the PTX entry point.
unsafe impl crate::KernelParam for P2p {}

impl P2p {
    #[inline(always)]
    fn local_base(&self) -> u64 {
        self.local_base
    }

    /// Translates a local symmetric address to `pe`'s copy.
    #[inline(always)]
    pub fn translate<T>(&self, local: *const T, pe: u32) -> *mut T {
        let off = local as u64 - self.local_base();
        // SAFETY: `peers` has `world` entries; `pe < world` is the caller's contract.
        (unsafe { *self.peers.add(pe as usize) } + off) as *mut T
    }

    fn reserved(&self, offset: u64) -> *mut u64 {
        (self.local_base() + offset) as *mut u64
    }

    /// Records a timed-out wait (first reporter wins).
    unsafe fn report(&self, op: WaitOp, cmp: Cmp, peer: u32, at: *const u64, expected: u64, seen: u64) {
        let flag = self.reserved(REPORT_OFFSET) as *mut u32;
        // SAFETY: the report area lies in the reserved heap header.
        unsafe {
            if ptx::atom_cas_relaxed_gpu_u32(flag, 0, 1) == 0 {
                let r = flag as *mut WaitReport;
                (*r).rank = self.rank;
                (*r).op = op as u32;
                (*r).cmp = cmp as u32;
                (*r).peer = peer;
                (*r).block = ptx::block_idx_x();
                (*r).offset = at as u64 - self.local_base();
                (*r).expected = expected;
                (*r).seen = seen;
                (*r).budget_ns = self.budget_ns;
                ptx::fence_sc_sys();
                ptx::st_release_sys_u32(flag, 1);
            }
        }
    }

    unsafe fn wait_inner(&self, sig: *const u64, cmp: Cmp, value: u64, op: WaitOp, peer: u32) -> Result<u64, TimedOut> {
        let start = ptx::globaltimer_ns();
        let mut polls = 0u32;
        loop {
            // SAFETY: caller's contract.
            let seen = unsafe {
                if self.same_gpu != 0 {
                    ptx::ld_acquire_gpu_u64(sig)
                } else {
                    ptx::ld_acquire_sys_u64(sig)
                }
            };
            if cmp.holds(seen, value) {
                return Ok(seen);
            }
            polls = polls.wrapping_add(1);
            // Reading %globaltimer costs about as much as a poll: look at the
            // clock every 32 polls only. On the emulator, yield every poll.
            if polls % 32 == 0 || !cfg!(target_arch = "nvptx64") {
                if ptx::globaltimer_ns().wrapping_sub(start) > self.budget_ns {
                    // SAFETY: as above.
                    unsafe { self.report(op, cmp, peer, sig, value, seen) };
                    return Err(TimedOut { seen });
                }
                // Tight spinning first (latency), then back off (memory
                // system bandwidth; the emulator's CPUs).
                if polls > 4096 || !cfg!(target_arch = "nvptx64") {
                    ptx::nanosleep(128);
                }
            }
        }
    }
}

/// Copies `bytes` with `n` cooperating threads, `me` being this thread's index:
/// 16-byte vectors when both ends are 16-byte aligned, else 4-byte words,
/// else bytes; the tail byte by byte.
#[inline(always)]
unsafe fn copy_cooperative(dst: *mut u8, src: *const u8, bytes: u64, me: u64, n: u64) {
    let align = (dst as u64 | src as u64) & 15;
    let mut done = 0u64;
    if align == 0 {
        let vecs = bytes / 16;
        let mut i = me;
        while i < vecs {
            // SAFETY: in bounds, 16-byte aligned.
            unsafe {
                ptx::st_v4_u32(
                    dst.add((i * 16) as usize) as *mut u32,
                    ptx::ld_v4_u32(src.add((i * 16) as usize) as *const u32),
                )
            };
            i += n;
        }
        done = vecs * 16;
    } else if align & 3 == 0 {
        let words = bytes / 4;
        let mut i = me;
        while i < words {
            // SAFETY: in bounds, 4-byte aligned.
            unsafe { *(dst.add((i * 4) as usize) as *mut u32) = *(src.add((i * 4) as usize) as *const u32) };
            i += n;
        }
        done = words * 4;
    }
    let mut i = done + me;
    while i < bytes {
        // SAFETY: in bounds.
        unsafe { *dst.add(i as usize) = *src.add(i as usize) };
        i += n;
    }
}

impl Transport for P2p {
    #[inline(always)]
    fn rank(&self) -> u32 {
        self.rank
    }
    #[inline(always)]
    fn world_size(&self) -> u32 {
        self.world
    }

    #[inline(always)]
    unsafe fn put_warp(&self, dst: *mut u8, src: *const u8, bytes: u64, pe: u32) {
        let remote = self.translate(dst, pe);
        // SAFETY: caller's contract.
        unsafe { copy_cooperative(remote, src, bytes, ptx::lane_id() as u64, 32) };
    }

    #[inline(always)]
    unsafe fn put_block(&self, dst: *mut u8, src: *const u8, bytes: u64, pe: u32) {
        let remote = self.translate(dst, pe);
        let n = (ptx::block_dim_x() * ptx::block_dim_y() * ptx::block_dim_z()) as u64;
        // SAFETY: caller's contract.
        unsafe { copy_cooperative(remote, src, bytes, ptx::thread_rank_in_block() as u64, n) };
    }

    #[inline(always)]
    unsafe fn get_warp(&self, dst: *mut u8, src: *const u8, bytes: u64, pe: u32) {
        let remote = self.translate(src, pe);
        // SAFETY: caller's contract.
        unsafe { copy_cooperative(dst, remote, bytes, ptx::lane_id() as u64, 32) };
    }

    #[inline(always)]
    unsafe fn get_block(&self, dst: *mut u8, src: *const u8, bytes: u64, pe: u32) {
        let remote = self.translate(src, pe);
        let n = (ptx::block_dim_x() * ptx::block_dim_y() * ptx::block_dim_z()) as u64;
        // SAFETY: caller's contract.
        unsafe { copy_cooperative(dst, remote, bytes, ptx::thread_rank_in_block() as u64, n) };
    }

    #[inline(always)]
    unsafe fn signal(&self, sig: *mut u64, value: u64, op: SignalOp, pe: u32) {
        let remote = self.translate(sig, pe);
        // Release is cumulative in the PTX memory model: the puts of this
        // thread, and of the warp/block ordered before it by a barrier, are
        // published with it. Across GPUs a system-scope fence first makes
        // the other threads' peer stores part of it too (as NVSHMEM does).
        if self.same_gpu == 0 {
            ptx::fence_acq_rel_sys();
        }
        // SAFETY: caller's contract.
        unsafe {
            match (op, self.same_gpu != 0) {
                (SignalOp::Set, true) => ptx::st_release_gpu_u64(remote, value),
                (SignalOp::Set, false) => ptx::st_release_sys_u64(remote, value),
                (SignalOp::Add, true) => {
                    ptx::atom_add_release_gpu_u64(remote, value);
                }
                (SignalOp::Add, false) => {
                    ptx::atom_add_release_sys_u64(remote, value);
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn wait_until(&self, sig: *const u64, cmp: Cmp, value: u64) -> Result<u64, TimedOut> {
        // SAFETY: caller's contract.
        unsafe { self.wait_inner(sig, cmp, value, WaitOp::WaitUntil, u32::MAX) }
    }

    #[inline(always)]
    fn fence(&self) {
        ptx::fence_acq_rel_sys();
    }

    #[inline(always)]
    fn quiet(&self) {
        ptx::fence_sc_sys();
    }

    unsafe fn barrier(&self) -> Result<(), TimedOut> {
        let epoch_ptr = self.reserved(EPOCH_OFFSET);
        // SAFETY: reserved header words; one thread per rank (contract).
        unsafe {
            let epoch = *epoch_ptr + 1;
            *epoch_ptr = epoch;
            let slot = self.reserved(self.rank as u64 * 8);
            for pe in 0..self.world {
                self.signal(slot, epoch, SignalOp::Set, pe);
            }
            for pe in 0..self.world {
                let s = self.reserved(pe as u64 * 8);
                self.wait_inner(s, Cmp::Ge, epoch, WaitOp::Barrier, pe)?;
            }
        }
        Ok(())
    }

    unsafe fn barrier_block(&self) -> Result<(), TimedOut> {
        let result = self.reserved(BLOCK_RESULT_OFFSET);
        ptx::sync_threads();
        if ptx::thread_rank_in_block() == 0 {
            // SAFETY: one block per rank (contract).
            let r = unsafe { self.barrier() };
            // SAFETY: reserved word, read after the block barrier below.
            unsafe { *result = if r.is_ok() { 0 } else { 1 } };
        }
        ptx::sync_threads();
        // SAFETY: written by thread 0 before the barrier.
        if unsafe { *result } == 0 {
            Ok(())
        } else {
            Err(TimedOut { seen: 0 })
        }
    }
}
