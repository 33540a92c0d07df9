//! Sum all-reduce, generic over the transport.
//!
//! Every rank passes `elems` elements (`input`) and gets, in `output`, the
//! element-wise sum over all ranks (`f32`, or `bf16` summed in `f32`).
//! `input` and `output` are any device memory of this rank (they may be the
//! same buffer: in place); the communication goes through the library's
//! symmetric scratch buffers and signal words ([`AllReduceArgs::scratch`],
//! [`AllReduceArgs::sigs`]), sized by [`AllReduceArgs::scratch_bytes`] and
//! [`AllReduceArgs::sig_words`].
//!
//! ## Algorithms ([`Algo`])
//! | algorithm | data path | for |
//! |---|---|---|
//! | `Copy` | `output = input` | one rank |
//! | `OneShot` | copy input into the symmetric staging, signal; read every peer's staging through `peer_ptr` and sum | small messages (one step of latency) |
//! | `TwoShot` | staging as above; rank `r` sums shard `r` from every peer (reduce-scatter), signals; every rank reads each shard from its owner (all-gather) | medium and large messages over peer pointers |
//! | `Ll` | one-shot in 8-byte packets `(epoch << 32) \| 4 data bytes` stored straight into every peer's staging; each rank polls its own staging until every packet carries this launch's epoch, and sums | the smallest messages: one one-way trip, no fence, no signal, no barrier |
//! | `Pipelined` | chunk by chunk through [`crate::pipeline`](mod@crate::pipeline) rings: each chunk is put into its owner's ring (reduce-scatter), the owner sums and puts the result into every rank's ring (all-gather) | routes without peer pointers (puts and signals only: any transport), and the **fused** all-reduce: [`fused`] lets a producer compute each chunk, whose reduction starts the moment it is produced |
//! | `Hierarchical` | pipelined in three hops for ranks forming nodes ([`AllReduceArgs::node_ranks`]): into the node's owner of the chunk, the node's partial sums between the owners of every node, the sum back to the node (`hier.rs`) | ranks forming nodes under the routed transport (load/store inside a node, the NIC between nodes): each chunk crosses the NIC once per pair of nodes |
//!
//! The host (`doorbell::coll::AllReduce`) picks one by size and route.
//!
//! ## Work split
//! The grid is `blocks` blocks ([`AllReduceArgs::blocks`]; the kernel traps
//! on another grid). One-shot and two-shot cut each shard (two-shot: `world`
//! shards of `ceil(elems / world)` elements rounded up to [`ALIGN_ELEMS`];
//! one-shot: one shard) into one part per block, and each part into chunks
//! of `chunk_elems`: block `b` of every rank handles part `b` of every
//! shard, and signals per chunk, so blocks never wait for each other within
//! a rank, and a peer starts summing chunk `k` as soon as chunk `k` is
//! staged everywhere. Pipelined hands chunk `b + j * blocks` to block `b`,
//! owned (reduced) by rank `(j + b) % world`.
//!
//! ## Epochs: consecutive launches need no reset, and replay
//! Each block counts its launches itself, in a word of the signal area
//! ([`AllReduceArgs::epoch_word`]): launch `e` (from 1) of block `b`
//! reads `e - 1` there at its start and writes `e` at its end. Since every
//! rank launches the same plan the same number of times, block `b` of
//! every rank agrees on `e` — with no epoch in the kernel argument, so one
//! launch captured in a CUDA graph replays correctly. Every signal carries
//! it: one-shot and two-shot chunk `k` of launch `e` signals
//! `(e << 32) | (k + 1)`, and every wait is `>=`, so words left by earlier
//! launches never satisfy a later wait. Their staging is double-buffered by
//! epoch parity: a rank in launch `e + 2` rewrites the buffer of launch `e`
//! only after every peer has staged launch `e + 1`, which they do only once
//! their launch `e` is over — no barrier at the end of a launch. Pipelined
//! numbers chunks across launches (see [`crate::pipeline`](mod@crate::pipeline)): its credits
//! carry over.
//!
//! ## Waits
//! Every wait is the transport's bounded `wait_until*`; a wait that runs out
//! records its report for the host and the block returns.
//!
//! ## Deadlock freedom of the pipelined schedule
//! Block `b` of every rank walks its chunks `j = 0, 1, ...` in the same
//! order. At step `j` it produces chunk `j` and puts it into the owner's
//! ring (credit: the chunk `stages` before in that ring was released); if it
//! owns chunk `j` it waits for every rank's put of chunk `j`, sums, releases
//! those slots and puts the sum into every rank's all-gather ring (credit:
//! released by receivers at step `<= j - stages * world + lag`); then it
//! receives chunk `j - lag` (reduced at step `j - lag` by a rank that had put
//! before it waited). Every wait at step `j` depends on sends of steps
//! `<= j` that are issued before their sender waits at that step, so the
//! schedule cannot deadlock while all blocks of all ranks are resident.

#[macro_use]
#[path = "hier.rs"]
mod hier;
#[path = "launch.rs"]
mod launch;
use launch::{begin, finish, stale};

use super::reduce::{copy_bytes, sum_into, Bf16, DType, Element, Sources};
use super::MAX_RANKS;
use crate::pipeline::{BlockChunks, BlockCtl, Failed, RingSet};
use crate::ptx;
use crate::transport::{wait_all_raw, Cmp, Coop, RawSignal, RawWait, Transport};
#[cfg(feature = "library-kernels")]
use crate::{
    kernel,
    transport::{Ibgda, P2p, Proxy, Routed},
};

/// The algorithms; see the module docs.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    /// One rank: `output = input`.
    Copy = 0,
    /// Every rank reads every peer's staging and sums.
    OneShot = 1,
    /// Reduce-scatter + all-gather through peer pointers.
    TwoShot = 2,
    /// Reduce-scatter + all-gather through pipeline rings (puts, signals).
    Pipelined = 3,
    /// One-shot with the flag in the data ("low latency"): 8-byte packets
    /// of 4 data bytes and the launch's epoch, no fence, no signal word.
    Ll = 4,
    /// Pipelined in three hops for ranks forming nodes (`hier.rs`); only in
    /// entries whose transport routes by node ([`Transport::NODES`]).
    Hierarchical = 5,
}

impl Algo {
    /// From the raw kernel argument.
    pub fn from_u32(v: u32) -> Option<Algo> {
        Some(match v {
            0 => Algo::Copy,
            1 => Algo::OneShot,
            2 => Algo::TwoShot,
            3 => Algo::Pipelined,
            4 => Algo::Ll,
            5 => Algo::Hierarchical,
            _ => return None,
        })
    }
    /// The name users type.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Copy => "copy",
            Algo::OneShot => "one-shot",
            Algo::TwoShot => "two-shot",
            Algo::Pipelined => "pipelined",
            Algo::Ll => "ll",
            Algo::Hierarchical => "hierarchical",
        }
    }
}

/// Shards, parts and chunks start at multiples of this many elements (256
/// bytes of `f32`): vector loads and stores stay aligned.
pub const ALIGN_ELEMS: u64 = 64;
/// Slots of the pipelined rings are padded to this many bytes.
pub const SLOT_ALIGN: u64 = 256;

/// Everything an all-reduce launch needs: a kernel argument, made by the
/// host (`doorbell::coll::AllReduce`), the same on every rank but for the
/// buffers' local addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllReduceArgs {
    /// This rank's input, `elems` elements (any device memory).
    pub input: u64,
    /// This rank's output, `elems` elements (may equal `input`).
    pub output: u64,
    /// Elements per rank.
    pub elems: u64,
    /// Elements per signalled chunk (a multiple of [`ALIGN_ELEMS`]).
    pub chunk_elems: u64,
    /// Launches the host has made with these buffers (for its records; the
    /// kernel counts its own epochs per block, see the module docs).
    pub epoch: u64,
    /// Symmetric scratch, [`Self::scratch_bytes`] bytes (this rank's address).
    pub scratch: u64,
    /// Symmetric signal words, [`Self::sig_words`] u64 (this rank's address).
    pub sigs: u64,
    /// The failures the ranks had met on when the all-reduce was made
    /// (`Communicator::failures_met`): a launch that finds another count in
    /// its rank's heap header ([`FAILURES_OFFSET`](crate::heap::FAILURES_OFFSET)) runs nothing and
    /// reports [`ErrorKind::Stale`](crate::heap::ErrorKind::Stale) — a
    /// launch or graph replay of arguments made before such a failure,
    /// whose launch counts and signal words may differ between ranks.
    pub failures: u64,
    /// [`DType`] as u32.
    pub dtype: u32,
    /// [`Algo`] as u32.
    pub algo: u32,
    /// Blocks of the launch (the grid must be exactly this).
    pub blocks: u32,
    /// Pipelined: stages per ring (>= 1).
    pub stages: u32,
    /// Ranks (1..=[`MAX_RANKS`]).
    pub world: u32,
    /// Hierarchical: ranks per node (consecutive; 2.., dividing `world`), else 0.
    pub node_ranks: u32,
}
const _: () = assert!(core::mem::size_of::<AllReduceArgs>() == 88);

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] integers, 8-byte aligned, as the PTX parameter.
unsafe impl crate::KernelParam for AllReduceArgs {}

#[inline(always)]
fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

/// One chunk's signal value in launch `epoch`.
#[inline(always)]
fn tag(epoch: u64, k: u64) -> u64 {
    (epoch << 32) | (k + 1)
}

impl AllReduceArgs {
    /// Bytes per element.
    #[inline(always)]
    pub fn elem_bytes(&self) -> u64 {
        if self.dtype == DType::Bf16 as u32 {
            2
        } else {
            4
        }
    }

    /// Elements per shard (one-shot: the whole vector), padded.
    #[inline(always)]
    fn shard_elems(&self) -> u64 {
        let shards = if self.algo == Algo::TwoShot as u32 { self.world as u64 } else { 1 };
        round_up(self.elems.div_ceil(shards).max(1), ALIGN_ELEMS)
    }

    /// LL: bytes of one rank's packet slot (8 bytes per 4 data bytes of
    /// the padded vector).
    #[inline(always)]
    fn ll_slot_bytes(&self) -> u64 {
        2 * self.shard_elems() * self.elem_bytes()
    }

    /// Bytes of one pipelined ring slot.
    #[inline(always)]
    pub fn slot_bytes(&self) -> u64 {
        round_up(self.chunk_elems * self.elem_bytes(), SLOT_ALIGN)
    }

    /// Pipelined: words of one counter array of one block's ring set.
    #[inline(always)]
    fn ring_words(&self) -> u64 {
        RingSet::counter_words(self.world, self.stages)
    }

    /// Pipelined: scratch bytes of one block (two ring sets, an outbox for
    /// the produced chunk, one for the reduced chunk).
    #[inline(always)]
    fn block_scratch(&self) -> u64 {
        (2 * RingSet::slot_area(self.world, self.stages, 1) + 2) * self.slot_bytes()
    }

    /// Bytes of symmetric scratch the launch needs.
    pub fn scratch_bytes(&self) -> u64 {
        let e = self.elem_bytes();
        match Algo::from_u32(self.algo) {
            // Two parities of `world` staging slots (two-shot: and of the
            // result area, the padded vector).
            Some(Algo::OneShot) => 2 * self.world as u64 * self.shard_elems() * e,
            Some(Algo::TwoShot) => 4 * self.world as u64 * self.shard_elems() * e,
            // Two parities of `world` packet slots (twice the data).
            Some(Algo::Ll) => 2 * self.world as u64 * self.ll_slot_bytes(),
            Some(Algo::Pipelined) => self.blocks as u64 * self.block_scratch(),
            Some(Algo::Hierarchical) => self.blocks as u64 * hier::block_scratch(self),
            _ => 0,
        }
    }

    /// Symmetric u64 signal words the launch needs (one control word per
    /// block, the algorithm's signals, one epoch word per block), zero
    /// before the first launch.
    pub fn sig_words(&self) -> u64 {
        self.algo_sig_words() + self.blocks as u64
    }

    /// The control words and the algorithm's signals.
    #[inline(always)]
    fn algo_sig_words(&self) -> u64 {
        let g = self.blocks as u64;
        g + match Algo::from_u32(self.algo) {
            Some(Algo::OneShot) | Some(Algo::TwoShot) => 2 * g * self.world as u64,
            Some(Algo::Pipelined) => 4 * g * self.ring_words(),
            Some(Algo::Hierarchical) => g * hier::block_counter_words(self),
            _ => 0,
        }
    }

    /// Block `b`'s launch counter: the last epoch it completed.
    #[inline(always)]
    pub fn epoch_word(&self, b: u64) -> *mut u64 {
        (self.sigs + (self.algo_sig_words() + b) * 8) as *mut u64
    }

    /// Part `b` of a padded shard of `sh` elements, as `[lo, hi)`.
    #[inline(always)]
    fn part(&self, sh: u64, b: u64) -> (u64, u64) {
        let pp = round_up(sh.div_ceil(self.blocks as u64), ALIGN_ELEMS);
        let lo = (b * pp).min(sh);
        (lo, (lo + pp).min(sh))
    }

    /// Block `b`'s control word.
    #[inline(always)]
    fn ctl(&self, b: u64) -> BlockCtl {
        BlockCtl((self.sigs + b * 8) as *mut u32)
    }
}

/// Chunks of the part `[lo, hi)`.
#[inline(always)]
fn chunk_count(lo: u64, hi: u64, ch: u64) -> u64 {
    (hi - lo).div_ceil(ch)
}

/// Chunk `k` of part `[lo, hi)` of shard `s` (padded length `sh`), as
/// absolute element indices clipped to `elems`.
#[inline(always)]
fn chunk_abs(lo: u64, hi: u64, ch: u64, k: u64, s: u64, sh: u64, elems: u64) -> (u64, u64) {
    let x0 = lo + k * ch;
    let x1 = (x0 + ch).min(hi);
    ((s * sh + x0).min(elems), (s * sh + x1).min(elems))
}

/// Rank `q`'s address of the symmetric `local`, or a trap when the route
/// has no peer pointer (the host picks `Pipelined` for such worlds).
/// Computed where it is used, from the handle: no table of addresses held
/// in registers across a loop.
#[inline(always)]
fn peer_at<T: Transport>(t: &T, local: u64, q: u64) -> *mut u8 {
    match t.peer_ptr(local as *const u8, q as u32) {
        Some(p) => p,
        None => ptx::trap(),
    }
}

/// After the block's writes: `*word = value` on every rank (release).
#[inline(always)]
unsafe fn publish_block<T: Transport>(t: &T, ctl: BlockCtl, word: u64, value: u64) -> Result<(), Failed> {
    ptx::sync_threads();
    ctl.lead(|| {
        // Barrier (in `lead`'s caller), fence, signal: the block's stores
        // are published with the signal (the contract's group rule).
        t.fence();
        for p in 0..t.world_size() {
            // SAFETY: a symmetric signal word (the caller's).
            unsafe { t.signal_raw(p, RawSignal::set(word as *mut u64, value)) }?;
        }
        Ok(())
    })
}

/// Waits until every rank's word of `world` consecutive ones is `>= value`.
#[inline(always)]
unsafe fn wait_all_block<T: Transport>(t: &T, ctl: BlockCtl, words: u64, value: u64) -> Result<(), Failed> {
    // SAFETY: `world` consecutive symmetric words (the caller's).
    let w = RawWait {
        words: words as *const u64,
        count: t.world_size(),
        cmp: Cmp::Ge,
        value,
    };
    ctl.lead(|| unsafe { wait_all_raw(t, w) })
}

/// What one block of a one-shot or two-shot launch works on, computed once
/// at its start: its part `[lo, hi)` of every (padded) shard of `sh`
/// elements, cut into `kn` chunks of `ch`, and this launch's staging —
/// `world` slots of `sh` elements (slot `r`: what rank `r` sent here), of
/// the epoch's parity.
struct Shot {
    w: u64,
    me: u64,
    esz: u64,
    tid: u64,
    nthr: u64,
    ctl: BlockCtl,
    sh: u64,
    stg: u64,
    /// This block's `world` ready words (one per rank).
    ready: u64,
    lo: u64,
    hi: u64,
    ch: u64,
    kn: u64,
}

impl Shot {
    #[inline(always)]
    fn new<T: Transport>(t: &T, a: &AllReduceArgs, esz: u64) -> Shot {
        let (w, b, g) = (a.world as u64, ptx::block_idx_x() as u64, a.blocks as u64);
        let (tid, nthr) = Coop::Block.index_and_size();
        let sh = a.shard_elems();
        let (lo, hi) = a.part(sh, b);
        Shot {
            w,
            me: t.rank() as u64,
            esz,
            tid,
            nthr,
            ctl: a.ctl(b),
            sh,
            stg: a.scratch + (a.epoch & 1) * w * sh * esz,
            ready: a.sigs + (g + b * w) * 8,
            lo,
            hi,
            ch: a.chunk_elems,
            kn: chunk_count(lo, hi, a.chunk_elems),
        }
    }

    /// Chunk `k` of this block's part of shard `s`, as absolute indices.
    #[inline(always)]
    fn chunk(&self, a: &AllReduceArgs, k: u64, s: u64) -> (u64, u64) {
        chunk_abs(self.lo, self.hi, self.ch, k, s, self.sh, a.elems)
    }

    /// This rank's `world` staging slots as sources of a sum (local memory).
    #[inline(always)]
    fn slots(&self) -> Sources {
        Sources {
            base: self.stg,
            stride: self.sh * self.esz,
            n: self.w as u32,
        }
    }
}

/// One-shot, by push: each chunk of this rank's vector is produced into
/// its own staging slot, copied into the same slot (`me`) of every peer's
/// staging, and signalled; then every rank sums its `world` slots locally.
/// One step of latency, remote writes only (no remote read round trips).
unsafe fn one_shot<T: Transport, E: Element, P: FnMut(Chunk)>(t: &T, a: &AllReduceArgs, mut produce: P) -> Result<(), Failed> {
    let p = Shot::new(t, a, E::DTYPE.size());
    let (me, esz) = (p.me, p.esz);
    let mine = p.stg + me * p.sh * esz;
    for k in 0..p.kn {
        let (a0, a1) = p.chunk(a, k, 0);
        if a1 > a0 {
            let at = mine + a0 * esz;
            produce(Chunk {
                dst: at as *mut u8,
                first: a0,
                len: a1 - a0,
                dtype: E::DTYPE,
            });
            ptx::sync_threads();
            for q in 0..p.w {
                if q != me {
                    // SAFETY: slot `me` of rank q's staging (same offsets), `sh` elements.
                    unsafe { copy_bytes(peer_at(t, at, q), at as *const u8, (a1 - a0) * esz, p.tid, p.nthr) };
                }
            }
        }
        // SAFETY: this block's ready word of this rank, in the signal area.
        unsafe { publish_block(t, p.ctl, p.ready + me * 8, tag(a.epoch, k)) }?;
    }
    let srcs = p.slots();
    for k in 0..p.kn {
        // SAFETY: the block's `world` ready words.
        unsafe { wait_all_block(t, p.ctl, p.ready, tag(a.epoch, k)) }?;
        let (a0, a1) = p.chunk(a, k, 0);
        if a1 > a0 {
            // SAFETY: every slot holds the chunk (signalled), output `elems`.
            unsafe { sum_into::<E>((a.output + a0 * esz) as *mut u8, &srcs, a0 * esz, a1 - a0, p.tid, p.nthr) };
        }
    }
    Ok(())
}

/// Steps the reduction of two-shot trails the production (chunk `j - 1`
/// is reduced after chunk `j` is produced): a peer's chunk has had a step
/// to arrive.
const TWO_SHOT_LAG: u64 = 1;

/// Two-shot, by push: shard `s` of each produced chunk is written straight
/// into slot `me` of its owner `s`'s staging (a reduce-scatter by remote
/// stores, issued while producing); the owner sums its `world` slots
/// locally into its output and writes the sum into every peer's result
/// area; each rank then copies the other shards from its result area
/// (local) into its output.
unsafe fn two_shot<T: Transport, E: Element, P: FnMut(Chunk)>(t: &T, a: &AllReduceArgs, mut produce: P) -> Result<(), Failed> {
    let p = Shot::new(t, a, E::DTYPE.size());
    let (w, me, esz, sh) = (p.w, p.me, p.esz, p.sh);
    let (b, g) = (ptx::block_idx_x() as u64, a.blocks as u64);
    // Result area of this parity: the padded vector, shard s at s * sh.
    let res = a.scratch + 2 * w * sh * esz + (a.epoch & 1) * w * sh * esz;
    let reduced = a.sigs + (g + g * w + b * w) * 8;
    let srcs = p.slots();
    for j in 0..p.kn + TWO_SHOT_LAG {
        if j < p.kn {
            // Produce chunk j of part b of every shard into its owner.
            for s in 0..w {
                let (a0, a1) = p.chunk(a, j, s);
                if a1 > a0 {
                    produce(Chunk {
                        dst: peer_at(t, p.stg + me * sh * esz + (a0 - s * sh) * esz, s),
                        first: a0,
                        len: a1 - a0,
                        dtype: E::DTYPE,
                    });
                }
            }
            // SAFETY: this block's ready word of this rank.
            unsafe { publish_block(t, p.ctl, p.ready + me * 8, tag(a.epoch, j)) }?;
        }
        if j >= TWO_SHOT_LAG {
            // Reduce chunk k of this rank's shard, push the sum.
            let k = j - TWO_SHOT_LAG;
            // SAFETY: the block's ready words.
            unsafe { wait_all_block(t, p.ctl, p.ready, tag(a.epoch, k)) }?;
            let (a0, a1) = p.chunk(a, k, me);
            if a1 > a0 {
                let out = (a.output + a0 * esz) as *mut u8;
                // SAFETY: every slot holds the chunk (signalled); output `elems`.
                unsafe { sum_into::<E>(out, &srcs, (a0 - me * sh) * esz, a1 - a0, p.tid, p.nthr) };
                ptx::sync_threads();
                for q in 0..w {
                    if q != me {
                        // SAFETY: rank q's result area holds the padded vector.
                        unsafe { copy_bytes(peer_at(t, res + a0 * esz, q), out, (a1 - a0) * esz, p.tid, p.nthr) };
                    }
                }
            }
            // SAFETY: this block's reduced word of this rank.
            unsafe { publish_block(t, p.ctl, reduced + me * 8, tag(a.epoch, k)) }?;
        }
    }
    // All-gather: the other shards arrived in this rank's result area.
    for k in 0..p.kn {
        // SAFETY: the block's reduced words.
        unsafe { wait_all_block(t, p.ctl, reduced, tag(a.epoch, k)) }?;
        for s in 0..w {
            let (a0, a1) = p.chunk(a, k, s);
            if s != me && a1 > a0 {
                let at = a0 * esz;
                // SAFETY: owner `s` has written and published the chunk; output `elems`.
                unsafe { copy_bytes((a.output + at) as *mut u8, (res + at) as *const u8, (a1 - a0) * esz, p.tid, p.nthr) };
            }
        }
    }
    Ok(())
}

/// LL, the one-shot for the smallest messages: each chunk is produced into
/// this rank's own slot (plain layout), then every thread packs its share
/// into 8-byte packets `(epoch << 32) | data` (4 data bytes: one `f32` or
/// two `bf16`) and stores each packet into slot `me` of every peer's
/// staging with one relaxed system-scope store. An aligned 8-byte store is
/// seen whole or not at all, so a receiver that sees this launch's epoch in
/// a packet sees its data: no fence, no signal word, no barrier — one
/// one-way trip. Each rank then polls its own staging, packet by packet,
/// with the transport's bounded `wait_until` (a packet is `>= epoch << 32`
/// exactly when it carries this launch's epoch or a later one; the slot's
/// previous content is from launch `epoch - 2`), and sums in rank order.
///
/// Epochs are 32 bits in a packet: after 2^32 launches of one plan a stale
/// packet would pass; the host rebuilds nothing for it (12 hours at 10 µs
/// per launch).
///
/// `direct` (the plain all-reduce, [`run`]): the packets are read from
/// `a.input` itself, with no produce pass, no copy and no block barrier
/// before the first store.
unsafe fn ll<T: Transport, E: Element, P: FnMut(Chunk)>(t: &T, a: &AllReduceArgs, mut produce: P, direct: bool) -> Result<(), Failed> {
    let (w, me, b) = (a.world as u64, t.rank() as u64, ptx::block_idx_x() as u64);
    let esz = E::DTYPE.size();
    let epp = 4 / esz; // elements per packet
    let (tid, nthr) = Coop::Block.index_and_size();
    let sh = a.shard_elems();
    let (lo, hi) = a.part(sh, b);
    let slot = a.ll_slot_bytes();
    let stg = a.scratch + (a.epoch & 1) * w * slot;
    let mine = stg + me * slot;
    let flag = (a.epoch & 0xffff_ffff) << 32;
    // This rank's packet `pk`: from the input (direct), else from the own
    // slot, where the chunks were produced (plain layout; 4 bytes at
    // 4 * pk lie inside the slot's 8 * pk).
    let own = |pk: u64| -> u32 {
        if !direct {
            // SAFETY: as above; produced before a block barrier.
            return unsafe { *((mine + 4 * pk) as *const u32) };
        }
        if E::DTYPE == DType::F32 {
            // SAFETY: input holds `elems` f32, and pk < elems.
            return unsafe { *((a.input + 4 * pk) as *const u32) };
        }
        // bf16: two elements, the second only if it exists (the input may
        // end after the first, and is only 2-byte aligned).
        // SAFETY: input holds `elems` bf16, and 2 * pk < elems.
        let lo = unsafe { *((a.input + 4 * pk) as *const u16) } as u32;
        let hi = if 2 * pk + 1 < a.elems {
            // SAFETY: as above, element 2 * pk + 1 exists.
            unsafe { *((a.input + 4 * pk + 2) as *const u16) as u32 }
        } else {
            0
        };
        lo | (hi << 16)
    };
    // Packets `[p0, p1)`, this thread's share, into slot `me` of every peer.
    let send = |p0: u64, p1: u64| {
        let mut pk = p0 + tid;
        while pk < p1 {
            let packet = flag | own(pk) as u64;
            for q in 0..w {
                if q != me {
                    // SAFETY: packet `pk` of slot `me` of rank q's staging.
                    unsafe { ptx::st_relaxed_sys_u64(peer_at(t, mine + 8 * pk, q) as *mut u64, packet) };
                }
            }
            pk += nthr;
        }
    };
    let kn = if direct { 0 } else { chunk_count(lo, hi, a.chunk_elems) };
    for k in 0..kn {
        let (a0, a1) = chunk_abs(lo, hi, a.chunk_elems, k, 0, sh, a.elems);
        if a1 <= a0 {
            continue;
        }
        produce(Chunk {
            dst: (mine + a0 * esz) as *mut u8,
            first: a0,
            len: a1 - a0,
            dtype: E::DTYPE,
        });
        ptx::sync_threads();
        send(a0 / epp, a1.div_ceil(epp));
    }
    // This block's packets (none where its part lies past the end).
    let (p0, p1) = (lo / epp, hi.min(a.elems).div_ceil(epp).max(lo / epp));
    if direct {
        send(p0, p1);
    }
    let mut pk = p0 + tid;
    let mut failed = false;
    'packets: while pk < p1 {
        // The packet's (up to) two elements, summed in rank order.
        let (mut x0, mut x1) = (0f32, 0f32);
        for r in 0..w {
            let data = if r == me {
                own(pk)
            } else {
                let at = (stg + r * slot + 8 * pk) as *const u64;
                // SAFETY: packet `pk` of slot r of this rank's staging.
                match unsafe { t.wait_word_raw(at, Cmp::Ge, flag) } {
                    Ok(v) => v as u32,
                    Err(_) => {
                        // Recorded by the transport; stop waiting.
                        failed = true;
                        break 'packets;
                    }
                }
            };
            let (v0, v1) = if E::DTYPE == DType::F32 {
                (f32::from_bits(data), 0.0)
            } else {
                (f32::from_bits(data << 16), f32::from_bits(data & 0xffff_0000))
            };
            if r == 0 {
                (x0, x1) = (v0, v1);
            } else {
                (x0, x1) = (x0 + v0, x1 + v1);
            }
        }
        let e = pk * epp;
        // SAFETY: output holds `elems` elements; e < elems (pk < p1).
        unsafe { E::store(a.output as *mut u8, e, x0) };
        if epp == 2 && e + 1 < a.elems {
            // SAFETY: as above, element e + 1 exists.
            unsafe { E::store(a.output as *mut u8, e + 1, x1) };
        }
        pk += nthr;
    }
    // One outcome for the whole block (the epoch word is written only
    // after a launch every thread of the block completed).
    if ptx::sync_threads_or(failed) {
        Err(Failed)
    } else {
        Ok(())
    }
}

/// The chunk a producer fills, handed to the closure of [`fused`]: the
/// elements `[first, first + len)` of this rank's vector go to `dst`
/// (element `i` of the chunk at `dst[i]`).
#[derive(Clone, Copy, Debug)]
pub struct Chunk {
    /// Where the chunk goes (a pipeline slot of this rank), `len` elements.
    pub dst: *mut u8,
    /// Index of the chunk's first element in the whole vector.
    pub first: u64,
    /// Elements in the chunk.
    pub len: u64,
    /// Element type of `dst`.
    pub dtype: DType,
}

impl Chunk {
    /// Stores `v` (rounded to the element type) as element `i` of the chunk.
    ///
    /// # Safety
    /// `i < len`.
    #[inline(always)]
    pub unsafe fn write(&self, i: u64, v: f32) {
        // SAFETY: the caller's contract.
        unsafe {
            match self.dtype {
                DType::F32 => f32::store(self.dst, i, v),
                DType::Bf16 => Bf16::store(self.dst, i, v),
            }
        }
    }
    /// This thread's share of the chunk's elements (block-stride): the
    /// elements every thread of the block fills between them.
    #[inline(always)]
    pub fn my_elements(&self) -> core::iter::StepBy<core::ops::Range<u64>> {
        let (me, n) = Coop::Block.index_and_size();
        (me..self.len).step_by(n as usize)
    }
}

/// How many of block `b`'s `jn` chunks rank `o` owns (`(j + b) % w == o`).
#[inline(always)]
fn owned(jn: u64, b: u64, o: u64, w: u64) -> u64 {
    let j0 = (o + w - b % w) % w;
    if j0 < jn {
        (jn - j0 - 1) / w + 1
    } else {
        0
    }
}

/// Receive lag of the pipelined all-gather: chunk `j - lag` is taken out
/// at step `j`, so a chunk's reduction and its all-gather overlap the
/// next chunks' production.
#[inline(always)]
fn lag(stages: u32) -> u64 {
    (stages as u64).saturating_sub(1).min(2)
}

unsafe fn pipelined<T: Transport, E: Element, P: FnMut(Chunk)>(t: &T, a: &AllReduceArgs, mut produce: P) -> Result<(), Failed> {
    let (w, me, b) = (a.world as u64, t.rank(), ptx::block_idx_x() as u64);
    let esz = E::DTYPE.size();
    let (tid, nthr) = Coop::Block.index_and_size();
    let ctl = a.ctl(b);
    let slot = a.slot_bytes();
    let area = a.scratch + b * a.block_scratch();
    let ring_bytes = RingSet::slot_area(a.world, a.stages, slot);
    let words = a.ring_words() * 8;
    let counters = a.sigs + a.blocks as u64 * 8 + b * 4 * words;
    let rs = RingSet {
        slots: area,
        slot_bytes: slot,
        peer_stride: a.stages as u64 * slot,
        full: counters,
        empty: counters + words,
        stages: a.stages,
        peers: a.world,
    };
    let ag = RingSet {
        slots: area + ring_bytes,
        full: counters + 2 * words,
        empty: counters + 3 * words,
        ..rs
    };
    let outbox = (area + 2 * ring_bytes) as *mut u8;
    let agbox = (area + 2 * ring_bytes + slot) as *mut u8;
    let chunks = BlockChunks {
        elems: a.elems,
        chunk: a.chunk_elems,
        block: b,
        blocks: a.blocks as u64,
    };
    let jn = chunks.count();
    let e0 = a.epoch - 1;
    let owner = |j: u64| (j + b) % w;
    let seq = |j: u64| e0 * owned(jn, b, owner(j), w) + j / w;
    let lag = lag(a.stages);
    for j in 0..jn + lag {
        if j < jn {
            let (first, len) = chunks.range(j);
            let (o, s) = (owner(j) as u32, seq(j));
            produce_and_send!(t, ctl, rs, produce, outbox, (first, len), (s, o), esz);
            if o == me {
                // SAFETY: as above; the slots hold `len` elements once full.
                unsafe {
                    rs.wait_all_block(t, ctl, s)?;
                    let srcs = Sources {
                        base: rs.slot(s, 0) as u64,
                        stride: rs.peer_stride,
                        n: a.world,
                    };
                    sum_into::<E>(agbox, &srcs, 0, len, tid, nthr);
                    rs.release_all_block(t, ctl, s)?;
                    ag.acquire_all_block(t, ctl, s)?;
                    for q in 0..a.world {
                        ag.commit_block(t, s, q, agbox, len * esz)?;
                    }
                }
            }
        }
        if j >= lag {
            let jr = j - lag;
            let (first, len) = chunks.range(jr);
            let (o, s) = (owner(jr) as u32, seq(jr));
            // SAFETY: as above; output holds `elems` elements.
            unsafe {
                let src = ag.wait_block(t, ctl, s, o)?;
                copy_bytes((a.output + first * esz) as *mut u8, src, len * esz, tid, nthr);
                ag.release_block(t, ctl, s, o)?;
            }
        }
    }
    Ok(())
}

/// Runs the all-reduce `a` describes, by every thread of every block of the
/// launch. `Err` once a transport call failed (recorded for the host).
///
/// # Safety
/// `a` was made for this transport's world by the host (buffers allocated
/// as [`AllReduceArgs::scratch_bytes`] / [`AllReduceArgs::sig_words`] say,
/// input and output hold `elems` elements), and every rank launches it
/// the same number of times (each block counts its epochs; after a failed
/// launch the counts of a rank's blocks may differ: rebuild the buffers).
///
/// A launch may overlap the kernel before it on the stream (the host's
/// `AllReduceOptions::overlap_launch`): it waits for that kernel first
/// ([`ptx::wait_prior_grids`]), then lets the next all-reduce launch
/// early — a small all-reduce costs one launch gap less.
#[inline(always)]
pub unsafe fn run<T: Transport>(t: &T, a: &AllReduceArgs) -> Result<(), Failed> {
    // SAFETY: the caller's contract.
    unsafe { run_for::<T, false>(t, a) }
}

/// [`run`] for one of the library's entries. `WIDE` ([`allreduce_wide`]):
/// two-shot only (the algorithm of the largest messages; every other one
/// adds to its spills within 128 registers), any other algorithm traps.
/// The algorithms are instantiated once per entry (the input-copying
/// closure's type differs), so each entry inlines its own — one
/// out-of-line copy shared by both would be called through a stack frame.
#[inline(always)]
unsafe fn run_for<T: Transport, const WIDE: bool>(t: &T, a: &AllReduceArgs) -> Result<(), Failed> {
    // First, in every block: before anything the previous kernel may read
    // or write (the input and output, the epoch word, the staging).
    ptx::wait_prior_grids();
    ptx::allow_dependent_launch();
    let e = a.elem_bytes();
    let copy_input = |c: Chunk| {
        let (me, n) = Coop::Block.index_and_size();
        let src = a.input + c.first * e;
        if c.dst as u64 != src {
            // SAFETY: the caller's contract: `input` holds `elems` elements.
            unsafe { copy_bytes(c.dst, src as *const u8, c.len * e, me, n) };
        }
    };
    if stale(t, a) {
        return Err(Failed);
    }
    let at = begin(t, a);
    if !WIDE {
        // SAFETY: the caller's contract.
        return finish(&at, unsafe { run_algo(t, &at, copy_input, true) });
    }
    let bf16 = a.dtype == DType::Bf16 as u32;
    // SAFETY: the caller's contract, per algorithm.
    let r = unsafe {
        match Algo::from_u32(a.algo) {
            Some(Algo::TwoShot) if bf16 => two_shot::<T, Bf16, _>(t, &at, copy_input),
            Some(Algo::TwoShot) => two_shot::<T, f32, _>(t, &at, copy_input),
            _ => ptx::trap(),
        }
    };
    finish(&at, r)
}

/// The **fused** all-reduce: `produce` computes each chunk of this rank's
/// contribution (every thread of the block calls it with the same
/// [`Chunk`]; fill `chunk.dst` with [`Chunk::write`] over
/// [`Chunk::my_elements`], or any other split), and the chunk is on its way
/// the moment the block is done with it: one-shot and two-shot (peer
/// pointers) hand the producer a peer's staging itself, so its stores are
/// the transfer; pipelined puts the chunk into its owner's ring. `a.input`
/// is not read; the sum lands in `a.output`. Every thread of every block of
/// the launch calls it.
///
/// # Safety
/// As for [`run`]; `produce` writes only `chunk.dst[..chunk.len]`.
#[inline(always)]
pub unsafe fn fused<T: Transport, P: FnMut(Chunk)>(t: &T, a: &AllReduceArgs, produce: P) -> Result<(), Failed> {
    if stale(t, a) {
        return Err(Failed);
    }
    let at = begin(t, a);
    crate::trace::hook! {
        // Thread 0 traces its share of each chunk's production (the
        // chunk's first element).
        let mut produce = produce;
        let (on, base) = (t.traced(), t.bounds().reporter.local_base);
        let lead = ptx::thread_rank_in_block() == 0;
        let produce = |c: Chunk| {
            let s = lead.then(|| crate::trace::span(on, base, crate::trace::What::Produce, u32::MAX, c.first));
            produce(c);
            if let Some(s) = s { s.end(c.len) }
        };
    }
    // SAFETY: the caller's contract.
    finish(&at, unsafe { run_algo(t, &at, produce, false) })
}

/// The algorithm `a.algo` with the block's epoch in `a.epoch`. `direct`:
/// `produce` copies `a.input` (the plain all-reduce), which an algorithm
/// may read itself instead.
#[inline(always)]
unsafe fn run_algo<T: Transport, P: FnMut(Chunk)>(t: &T, a: &AllReduceArgs, mut produce: P, direct: bool) -> Result<(), Failed> {
    let bf16 = a.dtype == DType::Bf16 as u32;
    // SAFETY: the caller's contract, per algorithm.
    unsafe {
        match Algo::from_u32(a.algo) {
            Some(Algo::OneShot) if bf16 => one_shot::<T, Bf16, P>(t, a, produce),
            Some(Algo::OneShot) => one_shot::<T, f32, P>(t, a, produce),
            Some(Algo::TwoShot) if bf16 => two_shot::<T, Bf16, P>(t, a, produce),
            Some(Algo::TwoShot) => two_shot::<T, f32, P>(t, a, produce),
            Some(Algo::Ll) if bf16 => ll::<T, Bf16, P>(t, a, produce, direct),
            Some(Algo::Ll) => ll::<T, f32, P>(t, a, produce, direct),
            Some(Algo::Pipelined) if bf16 => pipelined::<T, Bf16, P>(t, a, produce),
            Some(Algo::Pipelined) => pipelined::<T, f32, P>(t, a, produce),
            // Only where the transport routes by node; elsewhere refused.
            Some(Algo::Hierarchical) if T::NODES && bf16 => hier::hierarchical::<T, Bf16, P>(t, a, produce),
            Some(Algo::Hierarchical) if T::NODES => hier::hierarchical::<T, f32, P>(t, a, produce),
            Some(Algo::Hierarchical) => ptx::trap(),
            _ => {
                // One rank: the sum is the rank's own vector; produced
                // straight into the output, chunk by chunk over the blocks.
                let (b, g, dtype) = (
                    ptx::block_idx_x() as u64,
                    a.blocks as u64,
                    if bf16 { DType::Bf16 } else { DType::F32 },
                );
                let mut first = b * a.chunk_elems;
                while first < a.elems {
                    produce(Chunk {
                        dst: (a.output + first * a.elem_bytes()) as *mut u8,
                        first,
                        len: a.chunk_elems.min(a.elems - first),
                        dtype,
                    });
                    first += g * a.chunk_elems;
                }
                Ok(())
            }
        }
    }
}

/// The library's all-reduce kernel: [`run`] over the transport. Launch it
/// with the grid `args.blocks` (the host's `AllReduce::run` does). Only
/// the P2P entry is `no_spill`: the IBGDA and routed entries (WQE building, two
/// handles) keep 4 bytes in local memory, as ptxas reports.
#[cfg(feature = "library-kernels")]
#[kernel(no_spill(P2p), transports(P2p, Ibgda, Routed, Proxy))]
pub unsafe fn allreduce<T: Transport>(t: T, args: AllReduceArgs) {
    // SAFETY: the host made `args` for this world (launch contract).
    let _ = unsafe { run(&t, &args) };
}

/// [`allreduce()`] for blocks of up to 512 threads, two-shot over P2P only
/// (another algorithm traps): ptxas keeps it within 128 registers
/// (`launch_bounds`; it spills about 100 bytes), where the entry for every
/// algorithm uses about 250 and so fits only 256 threads on an SM. The
/// host launches it for two-shot plans of more than 256 threads per block:
/// twice the loads and stores in flight per SM, for the largest messages.
#[cfg(feature = "library-kernels")]
#[kernel(transports(P2p), launch_bounds(threads = 512, min_blocks = 1))]
pub unsafe fn allreduce_wide<T: Transport>(t: T, args: AllReduceArgs) {
    // SAFETY: the host made `args` for this world (launch contract).
    let _ = unsafe { run_for::<T, true>(&t, &args) };
}
