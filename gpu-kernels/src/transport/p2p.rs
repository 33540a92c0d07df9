//! The P2P transport: loads and stores straight into peers' symmetric heaps
//! (same GPU, NVLink or PCIe peers; host memory on the emulator).

use super::{Cmp, CommError, Coop, RawSignal, RawWait, RawXfer, SignalOp, Transport};
use crate::heap::{Arg, Call, Checked, HeapBounds, Reporter, EPOCH_OFFSET};
use crate::ptx;
// `What` is used inside the hooks only (gone without the trace feature).
#[allow(unused_imports)]
use crate::trace::{around, hook, What};

/// Peers whose heap base is carried in the handle itself (kernel parameter
/// space), so translating an address costs no dependent global load.
/// Peers past these are read from the peer table.
pub const NEAR_PEERS: usize = 8;

/// The P2P transport's device handle. Plain `#[repr(C)]` data shared by
/// host and device, made by `Communicator::p2p`; immutable for a kernel's
/// life.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2p {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// Heap size in bytes, header included (same on every rank).
    pub heap_bytes: u64,
    /// This rank's heap base.
    pub local_base: u64,
    /// Spin budget, ns.
    pub budget_ns: u64,
    /// 1 when every rank runs on this same GPU: signals and waits then use
    /// `.gpu` scope, which is cheaper than `.sys` (peers on other GPUs,
    /// processes on other GPUs, or the host need `.sys`).
    pub same_gpu: u32,
    /// 1 when the host traced this rank when it made the handle
    /// (`crate::trace`): the hooks then read the heap header's trace word;
    /// 0 and they read nothing.
    pub trace: u32,
    /// `world` entries: each rank's heap base mapped into this rank's
    /// address space (entry `rank` is the local heap; 0: not reachable by
    /// load/store).
    pub peers: *const u64,
    /// `peers[0..NEAR_PEERS]`, inline.
    pub near: [u64; NEAR_PEERS],
}
const _: () = assert!(core::mem::size_of::<P2p>() == 48 + 8 * NEAR_PEERS);

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] plain data (integers and a pointer), 8-byte aligned,
// matching the struct-by-value parameter of the PTX entry point.
unsafe impl crate::KernelParam for P2p {}

impl P2p {
    /// Heap base of `peer` (`peer < world`, checked by the caller).
    #[inline(always)]
    fn base_of(&self, peer: u32) -> u64 {
        if (peer as usize) < NEAR_PEERS {
            // Constant indices: selects in registers, no local-memory copy
            // of the parameter array.
            let mut b = self.near[0];
            let mut i = 1;
            while i < NEAR_PEERS {
                if peer as usize == i {
                    b = self.near[i];
                }
                i += 1;
            }
            b
        } else {
            // SAFETY: `peers` has `world` entries and `peer < world`.
            unsafe { *self.peers.add(peer as usize) }
        }
    }

    #[inline(always)]
    fn reserved(&self, offset: u64) -> *mut u64 {
        (self.local_base + offset) as *mut u64
    }

    #[inline(always)]
    fn load_signal(&self, p: *const u64) -> u64 {
        // SAFETY: checked by the caller to be an aligned word of the heap.
        unsafe {
            if self.same_gpu != 0 {
                ptx::ld_acquire_gpu_u64(p)
            } else {
                ptx::ld_acquire_sys_u64(p)
            }
        }
    }

    /// The signal store/add at `remote` (already translated): a release by
    /// the calling thread, at gpu scope when every rank shares this GPU,
    /// else sys. Publishes what this thread ordered before it; callers that
    /// publish a warp's or block's stores fence first ([`Self::group_fence`]).
    #[inline(always)]
    unsafe fn signal_at(&self, remote: *mut u64, value: u64, op: SignalOp) {
        // SAFETY: the caller's contract.
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

    /// Makes the stores of the threads ordered before this one by a warp or
    /// block barrier part of what its next release publishes to peers on
    /// other GPUs (as NVSHMEM fences before a group's signal). Within one
    /// GPU the release at gpu scope is cumulative over the barrier already.
    #[inline(always)]
    fn group_fence(&self) {
        if self.same_gpu == 0 {
            ptx::fence_acq_rel_sys();
        }
    }

    /// The barrier over the reserved slots (no argument checks: runtime words).
    unsafe fn barrier_inner(&self) -> Result<(), CommError> {
        let epoch_ptr = self.reserved(EPOCH_OFFSET);
        // SAFETY: reserved header words; one thread per rank (contract).
        unsafe {
            let epoch = *epoch_ptr + 1;
            *epoch_ptr = epoch;
            // Everything the block did before (ordered by barrier_block's
            // block barrier) is published with the slots.
            self.group_fence();
            let slot = self.reserved(self.rank as u64 * 8);
            for peer in 0..self.world {
                let remote = (self.base_of(peer) + self.rank as u64 * 8) as *mut u64;
                self.signal_at(remote, epoch, SignalOp::Set);
            }
            let _ = slot;
            for peer in 0..self.world {
                let s = self.reserved(peer as u64 * 8);
                if let Err(t) = crate::sync::spin_until(self.budget_ns, || self.load_signal(s), |v| v >= epoch) {
                    return Err(self.fail_wait(t, Call::Barrier, peer, s as u64, Cmp::Ge, epoch));
                }
            }
        }
        Ok(())
    }
}

/// Copies `bytes` with the threads of `g` ([`crate::copy::copy_bytes`]).
#[inline(always)]
unsafe fn copy_coop(g: Coop, dst: *mut u8, src: *const u8, bytes: u64) {
    let (me, n) = g.index_and_size();
    // SAFETY: the caller's contract.
    unsafe { crate::copy::copy_bytes(dst, src, bytes, me, n) }
}

impl Checked for P2p {
    #[inline(always)]
    fn traced(&self) -> u32 {
        self.trace
    }
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
    fn peer_ptr<T>(&self, local: *const T, peer: u32) -> Option<*mut T> {
        let off = (local as u64).wrapping_sub(self.local_base);
        if peer >= self.world || off >= self.heap_bytes {
            return None;
        }
        let base = self.base_of(peer);
        if base == 0 {
            return None;
        }
        Some((base + off) as *mut T)
    }

    #[inline(always)]
    unsafe fn put_raw(&self, g: Coop, peer: u32, x: RawXfer, signal: Option<RawSignal>) -> Result<(), CommError> {
        // Every check before any store: a bad argument writes nothing.
        let (_, off, sig_off) = super::check_put(self, peer, &x, signal)?;
        let base = self.base_of(peer);
        hook! {
            let what = if signal.is_some() { What::PutSignal } else { What::Put };
            let span = g.is_leader().then(|| crate::trace::span(self.trace, self.local_base, what, peer, x.bytes));
        }
        // SAFETY: checked range; `src` per the contract.
        unsafe { copy_coop(g, (base + off) as *mut u8, x.src, x.bytes) };
        if let Some(s) = signal {
            // Every thread's stores happen before the leader's release.
            g.sync();
            if g.is_leader() {
                if g != Coop::Thread {
                    self.group_fence();
                }
                // SAFETY: an aligned word of the peer's heap.
                unsafe { self.signal_at((base + sig_off) as *mut u64, s.value, s.op) };
            }
        }
        hook! { if let Some(s) = span { s.end(x.bytes) } }
        Ok(())
    }

    #[inline(always)]
    unsafe fn get_raw(&self, g: Coop, peer: u32, x: RawXfer) -> Result<(), CommError> {
        let call = if x.nbi { Call::GetNbi } else { Call::Get };
        let off = self.check_range(call, Arg::Source, x.src as u64, x.bytes, peer)?;
        self.check_local_dst(call, x.dst as u64, x.bytes, peer)?;
        let remote = (self.base_of(peer) + off) as *const u8;
        hook! { let span = g.is_leader().then(|| crate::trace::span(self.trace, self.local_base, What::Get, peer, x.bytes)); }
        // SAFETY: as for put.
        unsafe { copy_coop(g, x.dst, remote, x.bytes) };
        hook! { if let Some(s) = span { s.end(x.bytes) } }
        Ok(())
    }

    #[inline(always)]
    unsafe fn signal_raw(&self, peer: u32, s: RawSignal) -> Result<(), CommError> {
        let off = self.check_signal(Call::Signal, s.word as u64, peer)?;
        hook! { let span = crate::trace::span(self.trace, self.local_base, What::Signal, peer, off); }
        // SAFETY: an aligned word of the peer's heap.
        unsafe { self.signal_at((self.base_of(peer) + off) as *mut u64, s.value, s.op) };
        hook! { span.end(s.value); }
        Ok(())
    }

    #[inline(always)]
    unsafe fn wait_word_raw(&self, sig: *const u64, cmp: Cmp, value: u64) -> Result<u64, CommError> {
        self.check_signal(Call::WaitUntil, sig as u64, self.rank)?;
        hook! { let span = crate::trace::span(self.trace, self.local_base, What::Wait, u32::MAX, (sig as u64).wrapping_sub(self.local_base)); }
        match crate::sync::spin_until(self.budget_ns, || self.load_signal(sig), |v| cmp.holds(v, value)) {
            Ok(v) => {
                hook! { span.end(v); }
                Ok(v)
            }
            Err(t) => Err(self.fail_wait(t, Call::WaitUntil, u32::MAX, sig as u64, cmp, value)),
        }
    }

    #[inline(always)]
    unsafe fn wait_some_raw(&self, w: RawWait, skip: u64) -> Result<u64, CommError> {
        super::wait_some_words(self, w, skip, |p| self.load_signal(p))
    }

    #[inline(always)]
    fn fence(&self) {
        ptx::fence_acq_rel_sys();
    }

    #[inline(always)]
    unsafe fn quiet(&self, peer: Option<u32>) -> Result<(), CommError> {
        if let Some(peer) = peer.filter(|&p| p >= self.world) {
            return Err(self.fail(CommError::BadPeer { peer }, Call::Quiet, Arg::None, peer, 0));
        }
        // Stores to peers are complete once issued; the fence makes them
        // visible at system scope before anything this thread does next.
        hook! { let span = crate::trace::span(self.trace, self.local_base, What::Quiet, peer.unwrap_or(u32::MAX), 0); }
        ptx::fence_sc_sys();
        hook! { span.end(0); }
        Ok(())
    }

    unsafe fn barrier(&self) -> Result<(), CommError> {
        around!({ let span = crate::trace::span(self.trace, self.local_base, What::Barrier, u32::MAX, 0); }
        // SAFETY: the caller's contract.
        unsafe { self.barrier_inner() }, |r| { span.end(r.is_ok() as u64); })
    }
}
