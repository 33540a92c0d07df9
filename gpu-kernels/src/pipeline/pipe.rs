//! A whole producer → consumer pipeline in one call: [`Pipe::run`].
//!
//! The host makes everything a ring needs in one collective call
//! (`Communicator::rings`, which returns the [`Pipe`] kernel argument): the
//! ring sets (one per producer/consumer pair of blocks), a control word per
//! block, the producers' outboxes and a launch counter per block. The
//! kernel then says only what it produces and what it does with what it
//! receives:
//!
//! ```
//! use doorbell_kernels::pipeline::Pipe;
//! use doorbell_kernels::transport::{P2p, Transport};
//! use doorbell_kernels::{kernel, ptx};
//!
//! /// Every rank sends `elems` values to the next rank, chunk by chunk.
//! #[kernel(transports(P2p))]
//! pub unsafe fn shift<T: Transport>(t: T, pipe: Pipe<f32>, out: *mut f32, elems: u64) {
//!     let (me, n) = (t.rank(), t.world_size());
//!     let (tid, nthr) = (ptx::thread_rank_in_block() as u64, ptx::block_dim_x() as u64);
//!     // SAFETY: `pipe` comes from `Communicator::rings`; `out` holds `elems`.
//!     let _ = unsafe {
//!         pipe.run(&t, elems, ((me + 1) % n, (me + n - 1) % n),
//!             |first, len, buf| (tid..len).step_by(nthr as usize).for_each(|i| *buf.add(i as usize) = (first + i) as f32),
//!             |first, len, slot| (tid..len).step_by(nthr as usize).for_each(|i| *out.add((first + i) as usize) = *slot.add(i as usize)))
//!     };
//! }
//! ```
//!
//! **The grid** is `2 * pairs` blocks, all resident at once: block `p <
//! pairs` produces its share of the chunks (`BlockChunks` with `pairs`
//! blocks) and sends them through ring set `p`; block `pairs + p` receives
//! ring set `p` from the sending peer. A grid of another size is refused
//! (recorded for the host) before any wait.
//!
//! **Sequence numbers across launches** come from the per-block launch
//! counters in device memory: a block reads its counter when it starts and
//! bumps it when it finishes without error, so launch after launch — and
//! CUDA-graph replays of one captured launch — go on numbering chunks where
//! the last one stopped, with no host state. A failed launch leaves the
//! counters as they were; the rings are then out of step (the host's error
//! says so) and are made again.

use super::{stale_launch, BlockChunks, BlockCtl, Failed, RingSet};
use crate::heap::{Arg, Call, STALE_PIPELINE};
use crate::ptx;
#[allow(unused_imports)]
use crate::trace::{hook, What};
use crate::transport::{CommError, Transport};

/// A pipeline's rings, control words, outboxes and launch counters: the
/// kernel argument `Communicator::rings` makes (this rank's addresses of
/// symmetric allocations). Plain `#[repr(C)]` data.
#[repr(C)]
pub struct Pipe<E> {
    /// Ring set of pair 0; pair `p`'s is `rings.nth(p)`.
    pub rings: RingSet,
    /// `2 * pairs` control words, one per block.
    pub ctl: *mut u32,
    /// `2 * pairs` launch counters, one per block.
    pub launches: *mut u64,
    /// `pairs * chunk` elements: producer `p`'s chunk is filled at `p * chunk`.
    pub outbox: *mut E,
    /// Elements per chunk.
    pub chunk: u64,
    /// Producer/consumer pairs of blocks.
    pub pairs: u32,
    /// The failures the ranks had met on when the rings were made
    /// (`Communicator::failures_met`, low 32 bits): a launch that finds
    /// another count in its rank's heap header
    /// ([`FAILURES_OFFSET`](crate::heap::FAILURES_OFFSET)) runs nothing and
    /// reports [`ErrorKind::Stale`](crate::heap::ErrorKind::Stale) — an
    /// argument taken, or a graph captured, before such a failure.
    pub failures: u32,
}

impl<E> Clone for Pipe<E> {
    #[inline(always)]
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for Pipe<E> {}

impl<E> core::fmt::Debug for Pipe<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pipe")
            .field("rings", &self.rings)
            .field("chunk", &self.chunk)
            .field("pairs", &self.pairs)
            .finish_non_exhaustive()
    }
}

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] integers and pointers, 8-byte aligned, as the PTX
// parameter of the same layout.
unsafe impl<E: 'static> crate::KernelParam for Pipe<E> {}

impl<E> Pipe<E> {
    /// Launches this block has completed before this one (its counter):
    /// what makes data differ from launch to launch when the kernel's
    /// arguments cannot (a replayed CUDA graph). Read it before
    /// [`Self::run`] returns (`run` bumps it at its end).
    #[inline(always)]
    pub fn launch(&self) -> u64 {
        // SAFETY: one counter per block (the contract of `run`).
        unsafe { core::ptr::read_volatile(self.launches.add(ptx::block_idx_x() as usize)) }
    }

    /// Runs this block's side of the pipeline over `elems` elements:
    /// producers fill each chunk with `produce(first, len, buf)` (elements
    /// `first .. first + len` into `buf[..len]`, by every thread of the
    /// block) and send it to `peers.0`; consumers hand each chunk from
    /// `peers.1` to `consume(first, len, slot)` and release it. Every
    /// thread of every block calls it, with the same arguments. Returns
    /// `Err` on every thread of a block whose transport call failed (the
    /// transport recorded why) or whose grid is not `2 * pairs` blocks, and
    /// on every thread, with nothing sent, when the ranks met on a failure
    /// since the rings were made ([`Self::failures`]).
    ///
    /// # Safety
    /// `self` is what `Communicator::rings` made for this element type, on
    /// this communicator; every block of the grid is resident at once; the
    /// closures' own memory accesses are valid.
    #[inline(always)]
    pub unsafe fn run<T: Transport>(
        &self,
        t: &T,
        elems: u64,
        peers: (u32, u32),
        mut produce: impl FnMut(u64, u64, *mut E),
        mut consume: impl FnMut(u64, u64, *const E),
    ) -> Result<(), Failed> {
        let (b, grid) = (ptx::block_idx_x() as u64, ptx::grid_dim_x() as u64);
        let pairs = self.pairs as u64;
        if grid != 2 * pairs {
            if ptx::thread_rank_in_block() == 0 {
                let e = CommError::BadCount { count: grid };
                let _ = t.fail(e, Call::Pipeline, Arg::None, u32::MAX, 2 * pairs);
            }
            return Err(Failed);
        }
        if stale_launch(
            t.bounds().reporter.local_base,
            self.failures as u64,
            u32::MAX as u64,
            STALE_PIPELINE,
        ) {
            return Err(Failed);
        }
        let p = b % pairs;
        let chunks = BlockChunks {
            elems,
            chunk: self.chunk,
            block: p,
            blocks: pairs,
        };
        let ring = self.rings.nth(p);
        // SAFETY: one control word and one counter per block (the contract).
        let (ctl, counter) = unsafe { (BlockCtl(self.ctl.add(b as usize)), self.launches.add(b as usize)) };
        // SAFETY: as above; read by every thread before thread 0 bumps it
        // after the last barrier below.
        let seq0 = unsafe { core::ptr::read_volatile(counter) } * chunks.count();
        let elem_bytes = core::mem::size_of::<E>() as u64;
        hook! {
            // Thread 0 traces the block's steps (its transport calls trace
            // themselves); each span ends before any block barrier.
            let (on, base) = (t.traced(), t.bounds().reporter.local_base);
            let lead = ptx::thread_rank_in_block() == 0;
            let step = |what: What, peer: u32, seq: u64| lead.then(|| crate::trace::span(on, base, what, peer, seq));
            let end = |s: Option<crate::trace::Span>, seq: u64| s.map_or((), |s| s.end(seq));
        }
        let mut result = Ok(());
        for j in 0..chunks.count() {
            let (first, len) = chunks.range(j);
            let seq = seq0 + j;
            // SAFETY: the contract: this rank's ring set, control word and outbox.
            result = unsafe {
                if b < pairs {
                    // SAFETY: producer p's chunk of the outbox.
                    let buf = self.outbox.add((p * self.chunk) as usize);
                    hook! { let s = step(What::Acquire, peers.0, seq); }
                    ring.acquire_block(t, ctl, seq, peers.0).and_then(|()| {
                        hook! { end(s, seq); let s = step(What::Produce, peers.0, seq); }
                        produce(first, len, buf);
                        hook! { end(s, seq); }
                        ptx::sync_threads();
                        ring.commit_block(t, seq, peers.0, buf as *const u8, len * elem_bytes)
                    })
                } else {
                    hook! { let s = step(What::Arrive, peers.1, seq); }
                    ring.wait_block(t, ctl, seq, peers.1).and_then(|slot| {
                        hook! { end(s, seq); let s = step(What::Consume, peers.1, seq); }
                        consume(first, len, slot as *const E);
                        hook! { end(s, seq); }
                        ring.release_block(t, ctl, seq, peers.1)
                    })
                }
            };
            if result.is_err() {
                break;
            }
        }
        ptx::sync_threads();
        if result.is_ok() && ptx::thread_rank_in_block() == 0 {
            // SAFETY: this block's counter; every thread read it above.
            unsafe { core::ptr::write_volatile(counter, core::ptr::read_volatile(counter) + 1) };
        }
        result
    }
}
