//! Routes per peer: one handle that reaches some peers by load/store (the
//! [`P2p`] transport: same GPU, NVLink, PCIe) and the others through the NIC
//! (the [`Ibgda`] transport), in one kernel.
//!
//! Every call that names a peer goes wholly to that peer's route, so the
//! ordering each transport gives per peer (`put_signal`, `signal` after
//! `fence`) holds unchanged. Calls without a peer combine both:
//!
//! | call | what it does |
//! |---|---|
//! | `wait_until*` | local acquire loads at system scope (the NIC and peers on other GPUs write these words) |
//! | `fence` | P2P's `fence.acq_rel.sys`; the NIC side orders by QP (nothing to do) |
//! | `quiet` | completes the NIC's WQEs of the calling block, then P2P's `fence.sc.sys` |
//! | `barrier` | quiet every QP, fence, then the epoch into each rank's slot: a release store for load/store peers, an 8-byte WRITE for RDMA peers; then local waits |
//!
//! The route table is a bit per rank ([`Routed::rdma`]: set = RDMA), made by
//! `Communicator::routed` from where peers are and `DOORBELL_RDMA_PEERS`.

use super::ibgda::Ibgda;
use super::p2p::P2p;
use super::{Cmp, CommError, Coop, RawSignal, RawWait, RawXfer, Transport};
use crate::heap::{Call, Checked, HeapBounds, MAX_RANKS};
use crate::ptx;

/// Words of the route bit set (one bit per rank).
pub const ROUTE_WORDS: usize = MAX_RANKS as usize / 64;

/// Bit `peer` of a route bit set (`peer < MAX_RANKS`, checked by the
/// caller against its world).
#[inline(always)]
pub(crate) fn route_bit(bits: &[u64; ROUTE_WORDS], peer: u32) -> bool {
    // Constant indices: selects in registers, no local-memory copy.
    let mut w = bits[0];
    let mut i = 1;
    while i < ROUTE_WORDS {
        if (peer as usize >> 6) == i {
            w = bits[i];
        }
        i += 1;
    }
    w >> (peer & 63) & 1 != 0
}

/// The routed transport's device handle: both transports and a bit per
/// peer. Plain `#[repr(C)]` data made by `Communicator::routed`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Routed {
    /// Load/store to peers whose bit is clear.
    pub p2p: P2p,
    /// The NIC to peers whose bit is set (it has QPs only to those).
    pub ibgda: Ibgda,
    /// Bit `p % 64` of word `p / 64` set: rank `p` is reached by RDMA.
    pub rdma: [u64; ROUTE_WORDS],
}
const _: () = assert!(core::mem::size_of::<Routed>() == core::mem::size_of::<P2p>() + core::mem::size_of::<Ibgda>() + 8 * ROUTE_WORDS);

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] plain data (two plain handles and integers), 8-byte
// aligned, matching the struct-by-value parameter of the PTX entry point.
unsafe impl crate::KernelParam for Routed {}

impl Routed {
    /// Whether `peer` is reached through the NIC (false for ranks outside
    /// the world: P2P then reports the bad peer).
    #[inline(always)]
    pub fn is_rdma(&self, peer: u32) -> bool {
        peer < self.p2p.world && route_bit(&self.rdma, peer)
    }

    unsafe fn barrier_inner(&self) -> Result<(), CommError> {
        let me = self.p2p.rank;
        // SAFETY: one thread per rank (contract); header words.
        let epoch = unsafe {
            self.ibgda.quiet_all(Call::Barrier)?;
            // Publish this thread's (and its block's, after the block
            // barrier) load/store writes with the slot stores below.
            ptx::fence_acq_rel_sys();
            let epoch = self.ibgda.next_epoch();
            let slot = me as u64 * 8;
            for peer in 0..self.p2p.world {
                if self.is_rdma(peer) {
                    self.ibgda.put_header_word(peer, slot, epoch)?;
                } else {
                    let local = (self.p2p.local_base + slot) as *const u64;
                    if let Some(remote) = self.p2p.peer_ptr(local, peer) {
                        ptx::st_release_sys_u64(remote, epoch);
                    }
                }
            }
            epoch
        };
        self.ibgda.wait_slots(epoch)
    }
}

impl Checked for Routed {
    /// The P2P half's: both halves share the rank's heap and world.
    #[inline(always)]
    fn bounds(&self) -> HeapBounds {
        self.p2p.bounds()
    }
    #[inline(always)]
    fn traced(&self) -> u32 {
        self.p2p.trace
    }
}

impl Transport for Routed {
    const NODES: bool = true;

    #[inline(always)]
    fn rank(&self) -> u32 {
        self.p2p.rank
    }
    #[inline(always)]
    fn world_size(&self) -> u32 {
        self.p2p.world
    }

    #[inline(always)]
    fn peer_ptr<T>(&self, local: *const T, peer: u32) -> Option<*mut T> {
        if self.is_rdma(peer) {
            None
        } else {
            self.p2p.peer_ptr(local, peer)
        }
    }

    #[inline(always)]
    unsafe fn put_raw(&self, g: Coop, peer: u32, x: RawXfer, signal: Option<RawSignal>) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe {
            if self.is_rdma(peer) {
                self.ibgda.put_raw(g, peer, x, signal)
            } else {
                self.p2p.put_raw(g, peer, x, signal)
            }
        }
    }

    unsafe fn put_lanes_raw(&self, peer: u32, x: RawXfer, signal: Option<RawSignal>) -> Result<(), CommError> {
        let rdma = self.is_rdma(peer);
        // SAFETY: the caller's contract.
        unsafe {
            if crate::ptx::vote_sync_all(crate::ptx::FULL_MASK, rdma) {
                self.ibgda.put_lanes_raw(peer, x, signal)
            } else if crate::ptx::vote_sync_all(crate::ptx::FULL_MASK, !rdma) {
                self.p2p.put_lanes_raw(peer, x, signal)
            } else {
                // Lanes on both routes: each lane on its own.
                super::warp_verdict(super::check_put(self, peer, &x, signal))?;
                self.put_raw(Coop::Thread, peer, x, signal)
            }
        }
    }

    unsafe fn put_lanes_many_raw(&self, peer: u32, count: u32, nbi: bool, x: impl Fn(u32) -> RawXfer) -> Result<(), CommError> {
        let rdma = self.is_rdma(peer);
        // SAFETY: the caller's contract.
        unsafe {
            if crate::ptx::vote_sync_all(crate::ptx::FULL_MASK, rdma) {
                self.ibgda.put_lanes_many_raw(peer, count, nbi, x)
            } else if crate::ptx::vote_sync_all(crate::ptx::FULL_MASK, !rdma) {
                self.p2p.put_lanes_many_raw(peer, count, nbi, x)
            } else {
                // Lanes on both routes: round by round, each round's lanes
                // on their own routes.
                super::put_lanes_rounds(self, peer, count, nbi, x)
            }
        }
    }

    #[inline(always)]
    unsafe fn get_raw(&self, g: Coop, peer: u32, x: RawXfer) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe {
            if self.is_rdma(peer) {
                self.ibgda.get_raw(g, peer, x)
            } else {
                self.p2p.get_raw(g, peer, x)
            }
        }
    }

    #[inline(always)]
    unsafe fn signal_raw(&self, peer: u32, s: RawSignal) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe {
            if self.is_rdma(peer) {
                self.ibgda.signal_raw(peer, s)
            } else {
                self.p2p.signal_raw(peer, s)
            }
        }
    }

    #[inline(always)]
    unsafe fn wait_word_raw(&self, word: *const u64, cmp: Cmp, value: u64) -> Result<u64, CommError> {
        self.ibgda.wait_one(word, cmp, value)
    }

    #[inline(always)]
    unsafe fn wait_some_raw(&self, w: RawWait, skip: u64) -> Result<u64, CommError> {
        self.ibgda.wait_some(w, skip)
    }

    #[inline(always)]
    fn fence(&self) {
        self.p2p.fence();
        self.ibgda.fence();
    }

    unsafe fn quiet(&self, peer: Option<u32>) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe {
            match peer {
                Some(p) if self.is_rdma(p) => self.ibgda.quiet(peer),
                Some(_) => self.p2p.quiet(peer),
                None => {
                    self.ibgda.quiet(None)?;
                    self.p2p.quiet(None)
                }
            }
        }
    }

    unsafe fn barrier(&self) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.barrier_inner() }
    }
}
