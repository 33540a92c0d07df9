//! Chunk pipelines between ranks: "send each chunk the moment it is
//! produced", with credits, over any [`Transport`].
//!
//! A loop over chunks becomes **produce → hand off → send**: a block fills a
//! chunk, [`RingSet::commit_block`] moves it into its consumer's slot and
//! raises that slot's *full* counter in the same call (`put_signal`), and the
//! consumer, which waits on exactly that counter ([`RingSet::wait_block`]),
//! starts on the chunk while the producer goes on to the next one. A
//! consumer hands the slot back with [`RingSet::release_block`]; a producer
//! reuses a slot only after [`RingSet::acquire_block`] saw it released, so a
//! slow consumer never sees a chunk overwritten under it.
//!
//! ## The ring (CUTLASS's pipeline, across ranks)
//! A [`RingSet`] is, on every rank, one ring of `stages` chunk slots per
//! peer that sends to it (the slots and the *full* counters live with the
//! consumer), plus one *empty* counter per stage per peer it sends to (with
//! the producer). Chunks are numbered by a **sequence number** `seq` that
//! never restarts (launch after launch, see below); chunk `seq` goes through
//! stage `seq % stages`.
//!
//! | step | who | waits for | then | pairs with |
//! |---|---|---|---|---|
//! | `acquire_block(seq, dst)` | producer block | `empty[stage][dst] >= seq + 1 - stages` (chunk `seq - stages` released) | may write the slot | consumer's `release_block` |
//! | `commit_block(seq, dst, src)` | producer block | — | `put_signal`: data into `dst`'s slot, then `full[stage][me] = seq + 1` there | consumer's `wait_block` |
//! | `wait_block(seq, src)` | consumer block | `full[stage][src] >= seq + 1` | reads the slot | producer's `commit_block` |
//! | `release_block(seq, src)` | consumer block | — | `empty[stage][me] = seq + 1` on `src` | producer's `acquire_block` |
//!
//! Counters hold sequence numbers plus one instead of CUTLASS's phase bit:
//! the same information, never ambiguous, and monotonic, so one comparison
//! (`>=`) serves every wait and the counters never need a reset. The
//! `_all` forms wait for (or signal) every peer at once: the counters of one
//! stage are consecutive words, one [`Transport::wait_until_all`].
//!
//! **Sequence numbers across launches.** A kernel that moves `n` chunks
//! through a ring per launch numbers launch `e`'s (from 0) chunks
//! `e * n .. (e + 1) * n`: the rings, their counters and their credits
//! carry over from launch to launch with no reset and no barrier, and a
//! producer already in launch `e + 1` still waits for the consumer's
//! releases of launch `e`.
//!
//! ## Who calls
//! Every `_block` method is called by all threads of a block with the same
//! arguments: thread 0 waits or signals, and the block learns the outcome
//! through a per-block control word ([`BlockCtl`]); data moves with all
//! threads. An `Err` is returned to every thread of the block (the
//! transport has recorded what failed for the host), and the block should
//! return.
//!
//! ## Ordering and deadlock freedom
//! The transport's `put_signal` publishes the data with the counter (release
//! at system scope, or GPU scope when every rank shares one GPU) and
//! `wait_until` acquires it. Blocks that wait on each other across ranks
//! must all be resident at once (size the grid for it: the collectives
//! launch one block per few SMs, fewer when ranks share a GPU). A schedule
//! is deadlock-free when every wait at step `j` depends only on sends of
//! steps `<= j` by ranks that send before they wait; the fused all-reduce in
//! [`crate::coll::allreduce`] is built that way (see there).

mod pipe;
pub use pipe::Pipe;

use crate::heap;
use crate::ptx;
use crate::transport::{wait_all_raw, Cmp, CommError, Coop, RawSignal, RawWait, RawXfer, Transport};

/// A block-level call failed; the transport recorded why (the host's
/// `Communicator::check` reports it). Every thread of the block gets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failed;

impl From<CommError> for Failed {
    fn from(_: CommError) -> Failed {
        Failed
    }
}

/// Whether a launch whose arguments were made at failure count `made_at`
/// (the header's count masked by `mask`: a field of fewer bits holds its
/// low bits) finds the ranks met on a failure since ([`FAILURES_OFFSET`](crate::heap::FAILURES_OFFSET));
/// it must then touch nothing. Every thread calling it leaves `mark |
/// (made_at + 1)` in [`STALE_OFFSET`](crate::heap::STALE_OFFSET)'s word and sets the reported word
/// (the same two values from every thread), which the host's check turns
/// into [`ErrorKind::Stale`](crate::heap::ErrorKind::Stale)'s error. Two plain stores: a call to the
/// report writer here, or the stores kept to one thread of the block, made
/// ptxas spill more in the all-reduce's entries.
///
/// `local_base` is this rank's heap base.
#[inline(always)]
pub fn stale_launch(local_base: u64, made_at: u64, mask: u64, mark: u64) -> bool {
    // SAFETY (both blocks): words of this rank's heap header; the host
    // writes the failure count only while no kernel of the rank runs, and
    // reads the other two once the launch is over.
    let failures = unsafe { core::ptr::read_volatile((local_base + heap::FAILURES_OFFSET) as *const u64) };
    if failures & mask == made_at {
        return false;
    }
    unsafe {
        core::ptr::write_volatile((local_base + heap::STALE_OFFSET) as *mut u64, mark | (made_at + 1));
        core::ptr::write_volatile((local_base + heap::REPORTED_OFFSET) as *mut u32, 1);
    }
    true
}

/// A word through which thread 0 of a block tells the block how a call it
/// made alone went. One per block, anywhere in device memory (the
/// collectives keep theirs in their signal area).
#[derive(Clone, Copy, Debug)]
pub struct BlockCtl(pub *mut u32);

impl BlockCtl {
    /// Runs `f` on thread 0, then gives every thread of the block its
    /// outcome. Called by every thread of the block. Costs two block
    /// barriers: one to publish the outcome, one so the word is read by
    /// all before the next call may overwrite it.
    #[inline(always)]
    pub fn lead(self, f: impl FnOnce() -> Result<(), CommError>) -> Result<(), Failed> {
        if ptx::thread_rank_in_block() == 0 {
            let ok = f().is_ok();
            // SAFETY: this block's word; only thread 0 writes it, between
            // the barriers that order it with the other threads' reads.
            unsafe { core::ptr::write_volatile(self.0, ok as u32) };
        }
        ptx::sync_threads();
        // SAFETY: written by thread 0 before the barrier.
        let ok = unsafe { core::ptr::read_volatile(self.0) } != 0;
        ptx::sync_threads();
        if ok {
            Ok(())
        } else {
            Err(Failed)
        }
    }
}

/// The rings one rank uses with its peers, all with the same stage count
/// and slot size. Plain `#[repr(C)]` data (a kernel argument, or computed
/// in the kernel from one); all addresses are this rank's copies of
/// symmetric buffers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RingSet {
    /// Slot `(src, stage)` of the ring from `src` is at
    /// `slots + src * peer_stride + stage * slot_bytes` (consumer side).
    pub slots: u64,
    /// Bytes between two stages of one ring (at least the chunk size;
    /// 16-byte multiples keep vector copies).
    pub slot_bytes: u64,
    /// Bytes between the rings of two source peers.
    pub peer_stride: u64,
    /// `full[stage][src]`, u64 words (consumer side).
    pub full: u64,
    /// `empty[stage][dst]`, u64 words (producer side).
    pub empty: u64,
    /// Stages per ring (>= 1).
    pub stages: u32,
    /// Peers (ranks) in the set, at most 64.
    pub peers: u32,
}
const _: () = assert!(core::mem::size_of::<RingSet>() == 48);

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] integers, 8-byte aligned, as the PTX parameter.
unsafe impl crate::KernelParam for RingSet {}

impl RingSet {
    /// Bytes of slots per rank for `peers` rings of `stages` slots of
    /// `slot_bytes` (the `slots` allocation).
    pub const fn slot_area(peers: u32, stages: u32, slot_bytes: u64) -> u64 {
        peers as u64 * stages as u64 * slot_bytes
    }
    /// Words of one counter array (`full` or `empty`).
    pub const fn counter_words(peers: u32, stages: u32) -> u64 {
        peers as u64 * stages as u64
    }

    /// Ring set `n` of several laid out one after the other: slots
    /// `peers * peer_stride` bytes apart, counters
    /// [`Self::counter_words`] words apart. Blocks that move chunks at the
    /// same time each need a ring set of their own (slots and counters are
    /// indexed by peer and stage only), and a control word of their own.
    #[inline(always)]
    pub fn nth(&self, n: u64) -> RingSet {
        let words = Self::counter_words(self.peers, self.stages) * 8;
        RingSet {
            slots: self.slots + n * self.peers as u64 * self.peer_stride,
            full: self.full + n * words,
            empty: self.empty + n * words,
            ..*self
        }
    }

    /// The stage chunk `seq` goes through.
    #[inline(always)]
    pub fn stage(&self, seq: u64) -> u64 {
        seq % self.stages as u64
    }

    /// This rank's slot holding chunk `seq` from `src`.
    #[inline(always)]
    pub fn slot(&self, seq: u64, src: u32) -> *mut u8 {
        (self.slots + src as u64 * self.peer_stride + self.stage(seq) * self.slot_bytes) as *mut u8
    }

    /// The `full` counter of chunk `seq` from `src` (consumer side).
    #[inline(always)]
    pub(crate) fn full_word(&self, seq: u64, src: u32) -> *mut u64 {
        (self.full + (self.stage(seq) * self.peers as u64 + src as u64) * 8) as *mut u64
    }

    #[inline(always)]
    fn empty_word(&self, seq: u64, dst: u32) -> *mut u64 {
        (self.empty + (self.stage(seq) * self.peers as u64 + dst as u64) * 8) as *mut u64
    }

    /// The credit chunk `seq` needs: chunk `seq - stages` released.
    #[inline(always)]
    fn credit(&self, seq: u64) -> Option<u64> {
        (seq + 1).checked_sub(self.stages as u64).filter(|&v| v > 0)
    }

    /// Producer: waits until the slot of chunk `seq` at `dst` is free
    /// (chunk `seq - stages` released). Acquire; pairs with the consumer's
    /// [`Self::release_block`]. Every thread of the block.
    ///
    /// # Safety
    /// The ring set's addresses are this rank's copies of symmetric words.
    #[inline(always)]
    pub unsafe fn acquire_block<T: Transport>(&self, t: &T, ctl: BlockCtl, seq: u64, dst: u32) -> Result<(), Failed> {
        let Some(need) = self.credit(seq) else { return Ok(()) };
        // SAFETY: the caller's contract.
        ctl.lead(|| unsafe { t.wait_word_raw(self.empty_word(seq, dst), Cmp::Ge, need) }.map(|_| ()))
    }

    /// [`Self::acquire_block`] for every peer at once.
    ///
    /// # Safety
    /// As for `acquire_block`.
    #[inline(always)]
    pub unsafe fn acquire_all_block<T: Transport>(&self, t: &T, ctl: BlockCtl, seq: u64) -> Result<(), Failed> {
        let Some(need) = self.credit(seq) else { return Ok(()) };
        // SAFETY: the caller's contract; `peers` consecutive words.
        let w = RawWait {
            words: self.empty_word(seq, 0),
            count: self.peers,
            cmp: Cmp::Ge,
            value: need,
        };
        ctl.lead(|| unsafe { wait_all_raw(t, w) })
    }

    /// Producer: copies `bytes` from `src` (symmetric or registered memory)
    /// into `dst`'s slot for chunk `seq`, then sets its full counter to
    /// `seq + 1` (the transport orders data before counter). Call after
    /// [`Self::acquire_block`]. Every thread of the block.
    ///
    /// # Safety
    /// As for `acquire_block`; `bytes <= slot_bytes`; `src` valid for `bytes`.
    #[inline(always)]
    pub unsafe fn commit_block<T: Transport>(&self, t: &T, seq: u64, dst: u32, src: *const u8, bytes: u64) -> Result<(), Failed> {
        let me = t.rank();
        // SAFETY: the caller's contract.
        let x = RawXfer {
            dst: self.slot(seq, me),
            src,
            bytes,
            nbi: false,
        };
        unsafe { t.put_raw(Coop::Block, dst, x, Some(RawSignal::set(self.full_word(seq, me), seq + 1))) }?;
        Ok(())
    }

    /// Consumer: waits until chunk `seq` from `src` is in its slot; returns
    /// the slot. Acquire; pairs with [`Self::commit_block`].
    ///
    /// # Safety
    /// As for `acquire_block`.
    #[inline(always)]
    pub unsafe fn wait_block<T: Transport>(&self, t: &T, ctl: BlockCtl, seq: u64, src: u32) -> Result<*const u8, Failed> {
        // SAFETY: the caller's contract.
        ctl.lead(|| unsafe { t.wait_word_raw(self.full_word(seq, src), Cmp::Ge, seq + 1) }.map(|_| ()))?;
        Ok(self.slot(seq, src))
    }

    /// [`Self::wait_block`] for chunk `seq` from every peer.
    ///
    /// # Safety
    /// As for `acquire_block`.
    #[inline(always)]
    pub unsafe fn wait_all_block<T: Transport>(&self, t: &T, ctl: BlockCtl, seq: u64) -> Result<(), Failed> {
        // SAFETY: the caller's contract; `peers` consecutive words.
        let w = RawWait {
            words: self.full_word(seq, 0),
            count: self.peers,
            cmp: Cmp::Ge,
            value: seq + 1,
        };
        ctl.lead(|| unsafe { wait_all_raw(t, w) })
    }

    /// Consumer: hands the slot of chunk `seq` back to `src` (its empty
    /// counter for this rank becomes `seq + 1`). Release: every read of
    /// the slot by the block happens before the producer may overwrite it
    /// (a block barrier, a fence, then the signal: call it right after the
    /// block's last read).
    ///
    /// # Safety
    /// As for `acquire_block`.
    #[inline(always)]
    pub unsafe fn release_block<T: Transport>(&self, t: &T, ctl: BlockCtl, seq: u64, src: u32) -> Result<(), Failed> {
        let me = t.rank();
        ptx::sync_threads();
        ctl.lead(|| {
            // The block's reads of the slot, ordered before thread 0 by the
            // barrier, happen before the release (the contract's group rule).
            t.fence();
            // SAFETY: the caller's contract.
            unsafe { t.signal_raw(src, RawSignal::set(self.empty_word(seq, me), seq + 1)) }
        })
    }

    /// [`Self::release_block`] to every peer.
    ///
    /// # Safety
    /// As for `acquire_block`.
    #[inline(always)]
    pub unsafe fn release_all_block<T: Transport>(&self, t: &T, ctl: BlockCtl, seq: u64) -> Result<(), Failed> {
        let me = t.rank();
        ptx::sync_threads();
        ctl.lead(|| {
            t.fence();
            for p in 0..self.peers {
                // SAFETY: the caller's contract.
                unsafe { t.signal_raw(p, RawSignal::set(self.empty_word(seq, me), seq + 1)) }?;
            }
            Ok(())
        })
    }
}

/// The chunks of `elems` elements (`chunk` each, the last one shorter) that
/// block `block` of `blocks` handles, in order: chunk `block`, then
/// `block + blocks`, ... The `j`-th has index `block + j * blocks`.
#[derive(Clone, Copy, Debug)]
pub struct BlockChunks {
    /// Elements in all.
    pub elems: u64,
    /// Elements per chunk (> 0).
    pub chunk: u64,
    /// This block.
    pub block: u64,
    /// Blocks sharing the chunks.
    pub blocks: u64,
}

impl BlockChunks {
    /// Chunks in all.
    #[inline(always)]
    pub fn total(&self) -> u64 {
        self.elems.div_ceil(self.chunk)
    }
    /// How many chunks this block handles.
    #[inline(always)]
    pub fn count(&self) -> u64 {
        let c = self.total();
        if self.block >= c {
            0
        } else {
            (c - self.block).div_ceil(self.blocks)
        }
    }
    /// `[first, first + len)` elements of this block's `j`-th chunk.
    #[inline(always)]
    pub fn range(&self, j: u64) -> (u64, u64) {
        let first = (self.block + j * self.blocks) * self.chunk;
        (first, self.chunk.min(self.elems - first))
    }
}

/// `pipeline!`'s check that its `transport` is a value of a `Transport`
/// type (an error at the user's expression otherwise). Not for direct use.
#[doc(hidden)]
#[inline(always)]
pub fn transport_value<T: Transport>(t: &T) -> &T {
    t
}
