//! The engine as a persistent block: the GPU-resident soft NIC.
//!
//! One block per port — or several, up to
//! [`MAX_SHARDS`](super::tables::MAX_SHARDS) of them each serving its own
//! QPs ([`Port::assign_shards`](super::tables::Port::assign_shards); see
//! [`run_block`]), the others copying chunks of their large copies
//! (`shared`) — runs [`run_block`] (the `softnic_engine_*` kernels)
//! until the host sets [`EngineCtl::stop`]. Thread 0 is the NIC's control:
//! it runs [`super::poll_port`] — doorbells, WQE parsing, key, bounds and
//! access checks, the link model, faults, CQEs — exactly as the host thread
//! does. The other threads wait at the block barrier for payload to move:
//! [`BlockMover`] hands them each copy of at least [`BLOCK_COPY_MIN`]
//! bytes, and the block's other threads (all but warp 0 in a block of
//! two warps or more: `dma::copy_parts`) copy it with 16-byte vectors
//! ([`super::mover::copy_part`]) — or, from [`BULK_MIN`] bytes up when
//! [`EngineCtl::bulk_copy`] is set, its last thread moves the aligned
//! body through the SM's bulk-copy unit and the others the ends
//! (`dma`); smaller copies (signals, short messages)
//! thread 0 makes alone, which is cheaper than two barriers.
//!
//! An idle engine that finds one QP rung and nothing else moved serves it
//! without a pass when it is at most [`LONE_MAX`] simple WRITEs (`lone`):
//! a round trip's request then costs the control thread about half as
//! much.
//!
//! ## Ordering
//! * The producer (a user's kernel) writes WQEs, the doorbell record with
//!   `st.release`, and the UAR word after `fence.sc.sys`; the engine reads
//!   the UAR word and the record with `ld.relaxed.sys`, and follows a
//!   record that moved with one `fence.acq_rel` before it reads the WQEs
//!   ([`super::mem::acquire`]), at [`EngineCtl::sys_scope`]'s scope (`gpu`
//!   when every rank and port is on this GPU, `sys` otherwise), as is
//!   every fence and release below that orders it with the ranks (those
//!   with the host — the refresh, the state words — are `sys`).
//! * **Fences are few on purpose.** Every `fence.acq_rel` (and every
//!   acquire load) empties thread 0's L1, and the control's next table
//!   reads each wait for L2. On an H200 (`ibgda_bench`), cutting the
//!   fences from an acquire per doorbell, another per doorbell record and
//!   one after each copy to one acquire per doorbell record took a WQE's
//!   control from ~18 000 cycles to ~15 300. An idle pass would pay the same
//!   for every QP slot it looked at (~29 µs a pass, measured), hence
//!   `Watch`. Publication therefore uses release *operations* (a fence
//!   without the invalidation), placed on what an observer polls.
//! * Every [`REFRESH_NS`] the control thread fences, so table entries
//!   the host or another port's engine wrote (new QPs and regions, QP
//!   states) reach its plain loads, and lists the QP slots in use again.
//! * Payload is ordered before what an observer may poll after it: a CQE
//!   (`st.release` of its last word), an atomic (`atom.release`), a signal
//!   word — a copy of 8 or 16 aligned bytes, stored as whole 8-byte words
//!   (never seen half written), each a `st.release` once payload is
//!   pending — so a put's data is visible before the signal WQE behind it
//!   on the same QP (the in-order guarantee the transport's `put_signal`
//!   builds on). A block copy ends with a barrier, which orders the
//!   block's stores before thread 0's next release (one that runs on
//!   while thread 0 checks the next WQE is met at that barrier before
//!   any release: `deferred`); a bulk copy's issuing
//!   thread waits for its stores to complete and fences the bulk unit's
//!   accesses (the *async proxy*) against ordinary loads and stores (the
//!   *generic proxy*) before that barrier, and after the round's first
//!   barrier before its first load. Other copies shorter
//!   than [`BLOCK_COPY_MIN`] after pending payload are preceded by a
//!   fence, as before; bulk payload after bulk payload is not ordered
//!   (weak stores cannot be polled).
//!
//! ## Waits
//! Thread 0 never waits for anything but the barrier with its own block;
//! it checks the stop word every [`CONTROL_EVERY`] passes. The other threads wait at the
//! barrier, which thread 0 visits at least every [`HEARTBEAT_NS`] (the CPU
//! emulator fails barriers that wait too long). A pass is bounded: it
//! executes what is due and returns.
//!
//! ## The barrier
//! Thread 0 and the other threads meet at *different* barrier instructions
//! (thread 0 in `BlockMover::round`, the others in `serve`), and warp 0
//! is split between them. `bar.sync` is `barrier.sync.aligned`, which
//! PTX allows only where every thread of the block executes the same
//! instruction (undefined behaviour otherwise: the CPU emulator cannot
//! show it, a GPU may hang). The engine therefore uses the non-aligned
//! `barrier.sync 0` (`block_barrier`), which may be reached from
//! divergent code.
//!
//! How the host sees it start and stop: [`super::control`].

use doorbell_kernels::ptx;

use super::burst::{BurstHead, BurstJob, Tally, BURST_MAX, JOBS};
use super::config::{EngineConfig, EngineRng};
use super::mem::{self, Scope};
use super::mover::{PayloadMover, Phase, PHASES};
use super::poll::{poll_port_masked, PollReport};
use super::tables::{Ports, MAX_ENGINE_BLOCKS, MAX_QPS};

mod deferred;
mod dma;
mod lanes;
mod lone;
mod payload;
mod publish;
use publish::{publish_counters, publish_progress, publish_state};
mod shards;
mod shared;
mod view;
use lanes::run_bursts;
use shards::Shards;
use view::{Rung, View, Watch};

pub use dma::{AHEAD, BULK_BYTES, BULK_MIN, STAGES, STAGE_BYTES};
pub use lone::LONE_MAX;

pub use shared::{HELP_EVERY, SHARE_CHUNK, SHARE_MIN};

pub use super::control::{
    EngineCounters, EngineCtl, EngineProgress, IDLE_SLEEP_NS, PROGRESS_EVERY, STATE_EXITED, STATE_LAUNCHED, STATE_RUNNING,
};

/// Copies of at least this many bytes are made by the whole block; smaller
/// ones by the control thread alone.
pub const BLOCK_COPY_MIN: usize = 1024;
/// The control thread meets its block at least this often while idle, ns.
pub const HEARTBEAT_NS: u64 = 5_000_000;
/// The control thread reads the stop word and the configuration epoch
/// every this many passes.
pub const CONTROL_EVERY: u64 = 16;
/// At least this often (ns) the control thread makes the host's and the
/// other ports' table writes visible (a fence) and lists the QP slots in
/// use again; a QP created while the engine runs is polled within this.
/// Each refresh forces a full pass, and a request rung during one waits
/// for it and takes the burst path: at 100 µs, together with the
/// doorbell records' re-reads ([`EngineConfig::dbr_reread_ns`]), about a
/// quarter of a round trip's requests did so on an H200
/// (`benchmarks/ibgda_h200_forced_passes_ab.txt`).
pub const REFRESH_NS: u64 = 1_000_000;
/// Idle passes before the control thread sleeps between passes.
const IDLE_SPINS: u32 = 64;

/// Where the block's [`BurstJob`]s start in its dynamic shared memory,
/// after the [`Job`].
const BURST_AT: usize = core::mem::size_of::<Job>().next_multiple_of(16);

/// Dynamic shared memory the engine kernel needs: one [`Job`] and
/// [`JOBS`] [`BurstJob`]s.
pub const SHARED_BYTES: u32 = (BURST_AT + JOBS * core::mem::size_of::<BurstJob>()) as u32;
const _: () = assert!(SHARED_BYTES <= 48 * 1024);
/// Where the bulk copies' area ([`dma`]) starts in the block's dynamic
/// shared memory.
const BULK_AT: usize = (SHARED_BYTES as usize).next_multiple_of(128);
/// Dynamic shared memory the engine kernel needs when its block copies go
/// through the bulk-copy unit ([`EngineCtl::bulk_copy`]): the jobs and
/// [`BULK_BYTES`] (over 48 KiB: the launch raises the kernel's limit).
pub const SHARED_BYTES_BULK: u32 = BULK_AT as u32 + BULK_BYTES;
// Within what an sm_90 block may have (227 KiB).
const _: () = assert!(SHARED_BYTES_BULK <= 227 * 1024);

/// The engine's block barrier: `barrier.sync 0`, the non-aligned form,
/// because thread 0 and the other threads reach it from different code
/// (see the module docs). Also orders the block's shared and global
/// memory accesses (CTA scope), as `bar.sync` does. Called by every thread
/// of the block, from any code path.
#[inline(always)]
fn block_barrier() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a barrier; it orders memory, so no `nomem`.
    unsafe {
        core::arch::asm!("barrier.sync 0;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    ptx::sync_threads();
}

/// [`Job::kind`]: nothing to copy (a heartbeat).
const JOB_IDLE: u32 = 0;
/// [`Job::kind`]: copy `len` bytes.
const JOB_COPY: u32 = 1;
/// [`Job::kind`]: the engine stops.
const JOB_EXIT: u32 = 2;
/// [`Job::kind`]: the bursts `0..len` ([`burst`]'s many QPs at once):
/// lane `l` of warp `j` checks and gathers WQE `l` of burst `j`
/// ([`burst::gather`]); after a barrier, lane 0 of warp `j` completes
/// burst `j` ([`complete_job`]).
const JOB_BURSTS: u32 = 3;

/// What the control thread asks of its block, in shared memory. Written by
/// thread 0 before the first barrier of a round, read by the others after
/// it; not written again before the round's second barrier.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Job {
    kind: u32,
    /// A copy: 1 when its body goes through the bulk-copy unit ([`dma`]).
    bulk: u32,
    dst: u64,
    src: u64,
    len: u64,
}

/// The block's mover, run by thread 0 (the others are in `serve`).
pub struct BlockMover {
    job: *mut Job,
    /// The block's [`JOBS`] burst jobs (shared memory after `job`).
    jobs: *mut BurstJob,
    /// Bursts queued in this pass (the first `queued` jobs), at most
    /// `max_jobs` (one per warp).
    queued: u32,
    max_jobs: u32,
    /// QP slots with a queued burst (bit `q`).
    queued_qps: u64,
    /// Run each burst as soon as it is queued (the pass before queued at
    /// most one); otherwise the pass's bursts run together at its end.
    eager: bool,
    /// Bursts queued in this pass so far.
    pass_bursts: u32,
    /// Per QP slot: WQEs the one-WQE path may start before the QP's next
    /// burst, from its last burst's outcome (0: none).
    allow: [u32; MAX_QPS],
    /// The fabric's port table and this engine's port, as bursts name them.
    table: u64,
    port: u32,
    /// Most WQEs of a burst (0: none), within a warp and the block's threads.
    burst_max: u32,
    parts: usize,
    sys: bool,
    /// Thread 0 stored payload since its last fence.
    dirty: bool,
    last_barrier_ns: u64,
    block_copies: u64,
    thread_copies: u64,
    block_bytes: u64,
    copy_cycles: u64,
    fence_cycles: u64,
    /// `%clock64` at the last lap.
    lap_start: u64,
    /// This pass's cycles by phase (kept only if the pass made progress).
    pass_phases: [u64; PHASES],
    /// Busy passes' cycles by phase.
    phase_cycles: [u64; PHASES],
    bursts: u64,
    burst_wqes: u64,
    burst_rounds: u64,
    round_cycles: u64,
    gather_cycles: u64,
    complete_cycles: u64,
    unordered_wqes: u64,
    /// `%globaltimer` when each QP slot's last doorbell was seen (0: none).
    rung_at: [u64; MAX_QPS],
    rung_wqes: u64,
    rung_to_done_ns: u64,
    /// The port's control blocks (one per block, each with its block's
    /// board of shared copies; null: the port has one block), how many,
    /// and this block's index.
    ctls: *mut EngineCtl,
    blocks: usize,
    me: usize,
    /// Into how many chunks this block's large copies are cut
    /// ([`shared`]): the port's blocks per block that serves QPs, rounded
    /// up; 0 (not shared) while every block serves QPs.
    share: usize,
    /// The last posting on each block's board this block has seen through
    /// (only blocks that may serve QPs post).
    seen: [u32; super::tables::MAX_SHARDS],
    /// The posting on each board this block last copied a chunk of (its
    /// delay to the first claim is counted once).
    helped_seq: [u32; super::tables::MAX_SHARDS],
    /// The number of this block's last posting on its own board (only
    /// this block changes it; the host writes every board's claim word 0
    /// at each launch).
    posted: u32,
    /// This block's newest shared copy still in flight ([`shared`]):
    /// posted, some chunks perhaps not claimed yet or still being copied
    /// by others.
    posting: Option<shared::Posting>,
    /// The shared copy posted before it, still in flight: every chunk
    /// claimed, some perhaps still being copied by others.
    older: Option<shared::Posting>,
    /// Bytes copied of other blocks' shared copies.
    shared_bytes: u64,
    /// Doorbells and WQEs the lone path served ([`lone`]).
    lone_doorbells: u64,
    lone_wqes: u64,
    /// Block copies move their body through the bulk-copy unit ([`dma`]).
    bulk: bool,
    /// A block copy may run on past [`PayloadMover::copy`] (the caller
    /// drains before it publishes).
    defer: bool,
    /// The copy being made is [`PayloadMover::copy_frozen`]'s.
    frozen: bool,
    /// A block copy is in flight: the block is between the round's two
    /// barriers, and thread 0 has not met it at the second yet (a copy of
    /// its own, or its own chunk of its shared copy in flight).
    pending: bool,
    /// Block copies that ran on while the control thread went on, and
    /// those of them the next copy found in flight.
    deferred_copies: u64,
    overlapped_copies: u64,
    /// Where the drains waited, chunks left to their owner, chunks of
    /// others' copies and their claims' delays
    /// ([`EngineCounters::drain_own_cycles`] and after).
    drain_own_cycles: u64,
    drain_shared_cycles: u64,
    shared_copies: u64,
    shared_chunks: u64,
    late_chunks: u64,
    pipelined_copies: u64,
    helped_chunks: u64,
    helped_postings: u64,
    help_claim_ns: u64,
    help_seen_ns: u64,
    help_copy_ns: u64,
    /// Bytes the bulk-copy unit moved.
    bulk_bytes: u64,
    /// The CQEs held for the newest copy in flight
    /// ([`PayloadMover::hold_cqe`]), `held[held_new]`, and for the shared
    /// copy posted before it (`older`), the other one: the slots swap
    /// roles rather than move their images.
    held: [deferred::Held; 2],
    held_new: usize,
}

impl BlockMover {
    /// A pass begins: its laps count from here.
    #[inline(always)]
    fn begin_pass(&mut self) {
        // Word by word: `[0; PHASES]` is a memset, which the GPU build
        // makes a loop of byte stores (~1 000 cycles a pass).
        for c in self.pass_phases.iter_mut() {
            // SAFETY: an element of this thread's own array.
            unsafe { core::ptr::write_volatile(c, 0) };
        }
        self.lap_start = ptx::clock64();
    }

    /// The pass made progress: its laps join the busy cycles' profile.
    #[inline(always)]
    fn keep_pass(&mut self) {
        // By reference: iterating the array by value copies it first (a
        // byte loop on the GPU).
        for (t, c) in self.phase_cycles.iter_mut().zip(self.pass_phases.iter()) {
            *t += *c;
        }
    }

    /// Orders thread 0's earlier stores (and, after a barrier, the block's)
    /// before its later ones, at the engine's scope.
    #[inline(always)]
    fn fence(&mut self) {
        self.drain();
        let c0 = ptx::clock64();
        if self.sys {
            ptx::fence_acq_rel_sys();
        } else {
            ptx::fence_acq_rel_gpu();
        }
        self.fence_cycles += ptx::clock64().wrapping_sub(c0);
    }

    /// One round with the block: publish `job`, barrier; the other threads
    /// copy if asked; barrier (not for [`JOB_EXIT`]: the others return).
    ///
    /// # Safety
    /// A copy job's ranges are valid and do not overlap.
    unsafe fn round(&mut self, job: Job) {
        // SAFETY: the caller's contract.
        unsafe { self.round_or_defer(job, false) }
    }

    /// [`Self::round`]; a copy with `defer` returns after the first
    /// barrier, in flight until [`drain`](PayloadMover::drain) meets the
    /// block at the second.
    ///
    /// # Safety
    /// As for [`Self::round`].
    unsafe fn round_or_defer(&mut self, job: Job, defer: bool) {
        self.drain();
        // SAFETY: the caller's contract; nothing is in flight now.
        unsafe { self.round_now(job, defer) }
    }

    /// [`Self::round_or_defer`] where nothing is in flight: without the
    /// drain, which a shared copy's own rounds (made while it is drained)
    /// would otherwise call back into.
    ///
    /// # Safety
    /// As for [`Self::round`]; no copy is in flight.
    unsafe fn round_now(&mut self, mut job: Job, defer: bool) {
        if job.kind == JOB_COPY {
            job.bulk = self.bulk as u32;
            // Thread 0 copies nothing (`dma::copy_parts`).
            if let Some((_, body)) = dma::split(job.dst, job.src, job.len as usize).filter(|_| self.bulk && self.parts > 2) {
                self.bulk_bytes += body as u64;
            }
        }
        // SAFETY: the job slot is this block's shared memory; the others
        // read it only between the two barriers of a round.
        unsafe { core::ptr::write_volatile(self.job, job) };
        block_barrier();
        if job.kind == JOB_EXIT {
            return;
        }
        if job.kind == JOB_BURSTS {
            // Thread 0 is lane 0 of warp 0: burst 0's first WQE, then,
            // after the others' gathers, burst 0's completion.
            // SAFETY: the jobs were written before the barrier.
            unsafe { run_bursts(self.jobs, job.len as usize, 0) };
        }
        if job.kind == JOB_COPY && defer {
            self.pending = true;
            self.deferred_copies += 1;
            mem::copy_in_flight(true);
            return;
        }
        block_barrier();
        self.last_barrier_ns = ptx::globaltimer_ns();
    }

    /// Runs the bursts queued in this pass in one round (warp `j` burst
    /// `j`), then adds their tallies to the port's counters, notes what
    /// each left to the one-WQE path and returns the progress to report
    /// (one more per QP whose next pass has WQEs for the one-WQE path, so
    /// that pass comes at once).
    ///
    /// # Safety
    /// The tables' contract ([`super::poll_port`]).
    unsafe fn run_queued<P: Ports + ?Sized>(&mut self, ports: &mut P, p: usize) -> u32 {
        let n = self.queued;
        if n == 0 {
            return 0;
        }
        self.lap(Phase::Doorbell);
        let c0 = ptx::clock64();
        // SAFETY: the queued jobs' heads were written by this thread.
        unsafe {
            self.round(Job {
                kind: JOB_BURSTS,
                bulk: 0,
                dst: 0,
                src: 0,
                len: n as u64,
            })
        };
        self.burst_rounds += 1;
        self.round_cycles += ptx::clock64().wrapping_sub(c0);
        let now = ptx::globaltimer_ns();
        let mut progressed = 0;
        for j in 0..n as usize {
            // SAFETY: job `j` of this round, complete after its barrier.
            let (h, t): (BurstHead, Tally) = unsafe {
                let job = self.jobs.add(j);
                (
                    core::ptr::read_volatile(&raw const (*job).head),
                    core::ptr::read_volatile(&raw const (*job).tally),
                )
            };
            let q = h.q as usize % MAX_QPS;
            if let Some(port) = ports.get_mut(p) {
                t.apply(port, q);
                if t.done != 0 {
                    port.stats_mut(q).last_qpn = h.qpn;
                }
            }
            if t.fetch != 0 {
                self.allow[q] = t.fetch;
                progressed += 1;
            }
            progressed += t.done;
            self.bursts += (t.done != 0) as u64;
            self.burst_wqes += t.done as u64;
            self.gather_cycles += t.gather_cycles as u64;
            self.complete_cycles += t.complete_cycles as u64;
            self.unordered_wqes += t.unordered as u64;
            let at = self.rung_at[q];
            if at != 0 {
                self.rung_wqes += t.done as u64;
                self.rung_to_done_ns += t.done as u64 * now.wrapping_sub(at);
            }
        }
        self.queued = 0;
        self.queued_qps = 0;
        // Other threads stored payload: thread 0's next copy that is not a
        // signal word fences first, and its signal words are releases.
        self.dirty = true;
        self.lap(Phase::Burst);
        progressed
    }
}

/// The threads other than the control thread: copy their part of each
/// job until the engine exits.
///
/// # Safety
/// `job` is the block's job slot; thread 0 runs [`control`].
unsafe fn serve(job: *const Job, part: usize, parts: usize) {
    let jobs = burst_jobs(job as *mut Job);
    // The last thread issues the bulk copies, from the area after the jobs
    // (there when the configuration asks for bulk copies).
    let mut dma = dma::Dma::new(job.cast::<u8>().wrapping_add(BULK_AT).cast_mut());
    loop {
        block_barrier();
        // SAFETY: written by thread 0 before the barrier above.
        let j = unsafe { core::ptr::read_volatile(job) };
        match j.kind {
            JOB_EXIT => return,
            // SAFETY: the jobs were written by thread 0 before the barrier above.
            JOB_BURSTS => unsafe { run_bursts(jobs, j.len as usize, part) },
            JOB_COPY => {
                // SAFETY: thread 0 checked the ranges (the engine's checks)
                // and that they do not overlap. Thread 0 takes no part (it
                // may be checking the next WQE meanwhile), nor, in a block
                // of two warps or more, the rest of its warp
                // ([`dma::copy_parts`]).
                if let Some((me, of)) = dma::copy_parts(part, parts) {
                    unsafe {
                        let mine = (part == parts - 1).then_some(&mut dma);
                        dma::copy_job(j.dst, j.src, j.len as usize, j.bulk != 0, me, of, mine)
                    }
                }
            }
            _ => {}
        }
        block_barrier();
    }
}

/// The block's [`BurstJob`]s, in its dynamic shared memory after the job.
#[inline(always)]
fn burst_jobs(job: *mut Job) -> *mut BurstJob {
    job.cast::<u8>().wrapping_add(BURST_AT).cast::<BurstJob>()
}

/// The engine kernel's body, called by every thread of its blocks
/// (launched with [`SHARED_BYTES`] of dynamic shared memory, or
/// [`SHARED_BYTES_BULK`] for bulk copies: with less, [`EngineCtl::bulk_copy`]
/// is ignored and the threads copy every byte). Block `b` of
/// a grid of `n` serves the QPs whose [`QpEntry::shard`](super::tables::QpEntry::shard) is `b`
/// ([`Port::assign_shards`](super::tables::Port::assign_shards)) with its own control block, `ctl.add(b)`;
/// the stop word and the configuration are block 0's (`ctl`), which is
/// also the one whose state and progress the host reads: block 0 says it
/// runs once every block does, and that it exited once every block did.
///
/// # Safety
/// `ctl` is valid for as many control blocks as the grid has blocks, each
/// of whose table points at live ports, whose rings and regions stay
/// valid until the engine reports [`STATE_EXITED`].
pub unsafe fn run_block(ctl: *mut EngineCtl) {
    let job = ptx::dynamic_shared_mem() as *mut Job;
    let part = ptx::thread_idx_x() as usize;
    let parts = ptx::block_dim_x() as usize;
    if part != 0 {
        // SAFETY: the caller's contract.
        unsafe { serve(job, part, parts) };
        return;
    }
    let shards = Shards {
        main: ctl,
        me: ptx::block_idx_x() as usize,
        n: ptx::grid_dim_x() as usize,
    };
    // SAFETY: the caller's contract.
    unsafe { control(shards, job, parts) };
}

impl BlockMover {
    /// Block `shards.me`'s mover at the start of its control loop:
    /// settings from its control block `ctl` (port `port`'s tables, the
    /// burst limit, the scope), nothing queued or counted yet.
    ///
    /// # Safety
    /// `ctl` is the block's valid control block; `job` as for
    /// [`run_block`].
    #[inline(always)]
    unsafe fn new(job: *mut Job, parts: usize, ctl: *mut EngineCtl, shards: &Shards, port: usize, t0: u64) -> BlockMover {
        // SAFETY: the caller's contract.
        unsafe {
            BlockMover {
                job,
                jobs: burst_jobs(job),
                queued: 0,
                max_jobs: (parts / 32).clamp(1, JOBS) as u32,
                queued_qps: 0,
                eager: false,
                pass_bursts: 0,
                allow: [0; MAX_QPS],
                table: core::ptr::read_volatile(&raw const (*ctl).table) as usize as u64,
                port: port as u32,
                burst_max: core::ptr::read_volatile(&raw const (*ctl).burst).min(BURST_MAX).min(parts as u32),
                parts,
                sys: core::ptr::read_volatile(&raw const (*ctl).sys_scope) != 0,
                dirty: false,
                last_barrier_ns: t0,
                block_copies: 0,
                thread_copies: 0,
                block_bytes: 0,
                copy_cycles: 0,
                fence_cycles: 0,
                lap_start: 0,
                pass_phases: [0; PHASES],
                phase_cycles: [0; PHASES],
                bursts: 0,
                burst_wqes: 0,
                burst_rounds: 0,
                round_cycles: 0,
                gather_cycles: 0,
                complete_cycles: 0,
                unordered_wqes: 0,
                rung_at: [0; MAX_QPS],
                rung_wqes: 0,
                rung_to_done_ns: 0,
                ctls: if shards.n > 1 { shards.main } else { core::ptr::null_mut() },
                blocks: shards.n.min(MAX_ENGINE_BLOCKS),
                me: shards.me,
                share: 0,
                seen: [0; super::tables::MAX_SHARDS],
                helped_seq: [0; super::tables::MAX_SHARDS],
                posted: 0,
                posting: None,
                older: None,
                shared_bytes: 0,
                lone_doorbells: 0,
                lone_wqes: 0,
                // Only where the launch reserved the area ([`SHARED_BYTES_BULK`]).
                bulk: core::ptr::read_volatile(&raw const (*ctl).bulk_copy) != 0 && ptx::dynamic_shared_mem_bytes() >= SHARED_BYTES_BULK,
                bulk_bytes: 0,
                defer: false,
                frozen: false,
                pending: false,
                deferred_copies: 0,
                overlapped_copies: 0,
                drain_own_cycles: 0,
                drain_shared_cycles: 0,
                shared_copies: 0,
                shared_chunks: 0,
                late_chunks: 0,
                pipelined_copies: 0,
                helped_chunks: 0,
                helped_postings: 0,
                help_claim_ns: 0,
                help_seen_ns: 0,
                help_copy_ns: 0,
                held: [deferred::Held::NONE; 2],
                held_new: 0,
            }
        }
    }
}

/// Thread 0: passes over its block's QPs until the stop word is set.
///
/// # Safety
/// As for [`run_block`].
unsafe fn control(shards: Shards, job: *mut Job, parts: usize) {
    let (main, ctl) = (shards.main, shards.own());
    // SAFETY (whole function): the caller's contract; the control block's
    // engine fields are written by this thread only, the host's fields read
    // with acquire where they change.
    unsafe {
        shards.wait_others(STATE_RUNNING, true);
        publish_state(ctl, STATE_RUNNING);
        let t0 = shards.start_clock();
        let base = core::ptr::read_volatile(&raw const (*ctl).clock_base_ns);
        let port = core::ptr::read_volatile(&raw const (*ctl).port) as usize;
        let mut table = View::new(core::ptr::read_volatile(&raw const (*ctl).table), port);
        let mut mover = BlockMover::new(job, parts, ctl, &shards, port, t0);
        let mut epoch = 0u64;
        let mut cfg = EngineConfig::default();
        let mut rng = EngineRng::new(0);
        let (mut passes, mut busy, mut busy_cycles) = (0u64, 0u64, 0u64);
        let mut idle = 0u32;
        let progress = core::ptr::read_volatile(&raw const (*ctl).host_progress);
        let idle_sleep = core::ptr::read_volatile(&raw const (*ctl).idle_sleep_ns);
        let mut seq = 0u64;
        let mut now = base;
        let mut watch = Watch::EMPTY;
        let mut guesses = lone::Guesses::new();
        // Forces a refresh and a full pass first.
        let mut refreshed_ns = t0.wrapping_sub(REFRESH_NS + 1);
        let mut last = PollReport {
            progressed: 1,
            next_event_ns: 0,
        };
        loop {
            if passes % CONTROL_EVERY == 0 {
                // Relaxed: the stop word orders nothing; a new epoch is
                // followed by a fence before the configuration is read.
                if ptx::ld_relaxed_sys_u32(&raw const (*main).stop) != 0 {
                    break;
                }
                let e = ptx::ld_relaxed_sys_u64(&raw const (*main).cfg_epoch);
                if e != epoch {
                    // `sys`: the host wrote the configuration.
                    mem::acquire(Scope::Sys);
                    cfg = core::ptr::read_volatile(&raw const (*main).cfg);
                    rng = EngineRng::new(cfg.faults.seed);
                    epoch = e;
                    ptx::st_release_sys_u64(&raw mut (*ctl).cfg_applied, e);
                    last.progressed = 1;
                }
            }
            // Chunks of other blocks' large copies, if any are posted: at
            // every pass of a block that serves no QP, now and then
            // otherwise.
            // A block that copied chunks does not sleep before its next look.
            if (watch.mask == 0 || passes % shared::HELP_EVERY == 0) && mover.help() != 0 {
                idle = 0;
            }
            let t = ptx::globaltimer_ns();
            now = base.wrapping_add(t.wrapping_sub(t0));
            passes += 1;
            if t.wrapping_sub(refreshed_ns) > REFRESH_NS {
                // What the host (new QPs, regions, states) and other ports
                // wrote into the tables becomes visible to the plain loads
                // that follow; then the slots in use are listed again.
                // `sys`: the host writes tables too.
                mem::acquire(Scope::Sys);
                watch = Watch::of(&table, shards.me);
                // Large copies are shared while some block serves no QP
                // (blocks that serve QPs rarely find time to help), each
                // cut into the port's blocks per serving block: when every
                // serving block copies at once, each chunk has a block to
                // copy it and stays long enough to stream.
                let serving = (watch.serving.count_ones() as usize).max(1);
                mover.share = if serving < mover.blocks {
                    mover.blocks.div_ceil(serving)
                } else {
                    0
                };
                refreshed_ns = t;
                last.progressed = 1;
            }
            let forced = last.progressed != 0 || now >= last.next_event_ns;
            // Woken from idle: only the slots whose doorbell word or inbox
            // head moved have anything to do (nothing else is due, and the
            // last pass did nothing), so the pass goes to them alone rather
            // than walk every slot in turn (a lone request's QP waited
            // 3.8 – 6.9 µs for its turn on an H200:
            // `benchmarks/ibgda_h200_rtt_timeline.txt`).
            let rung = if forced { Rung::NONE } else { watch.rung(&table) };
            let woke = rung.mask;
            let mut full = forced || woke != 0;
            doorbell_kernels::trace_hook! {
                if woke != 0 && !forced {
                    if let Some(own) = table.own() {
                        let tr = super::trace::rings(own);
                        super::trace::event(tr, super::trace::What::NicWake, u32::MAX, idle as u64);
                    }
                }
            }
            let c0 = ptx::clock64();
            // One QP rung and nothing else moved: a lone request, served
            // without a pass when it can be (`lone`); otherwise, or for
            // what it leaves, the pass below runs at once.
            let mut served = false;
            if let Some((q, seen)) = rung.lone {
                mover.begin_pass();
                if let Some(executed) = lone::serve(&mut table, port, (q, seen), now, &cfg, &mut mover, &mut guesses) {
                    full = false;
                    served = executed != 0;
                    // Nothing the doorbell covered is left on the QP, and
                    // nothing else moved: the next pass need not be a full
                    // one (a full pass takes longer than a round trip's
                    // other half, so the answer to this request would find
                    // the engine in it). WQEs a later doorbell publishes come
                    // with that doorbell, or at the record's re-read.
                    last = PollReport {
                        progressed: 0,
                        next_event_ns: last.next_event_ns.min(now.saturating_add(cfg.dbr_reread_ns.max(1))),
                    };
                    if served {
                        busy_cycles += ptx::clock64().wrapping_sub(c0);
                        mover.keep_pass();
                    }
                }
            }
            if full {
                if rung.lone.is_none() {
                    mover.begin_pass();
                }
                // After a pass with at most one burst, a burst is most likely
                // a lone request (a round trip's): it runs at once (burst.rs).
                mover.eager = mover.pass_bursts < 2;
                mover.pass_bursts = 0;
                let (mask, due) = if forced {
                    (watch.mask, u64::MAX)
                } else {
                    (woke, last.next_event_ns)
                };
                last = poll_port_masked(&mut table, port, mask, now, &cfg, &mut rng, &mut mover);
                // What the slots not visited had due stays due.
                last.next_event_ns = last.next_event_ns.min(due);
                last.progressed += mover.run_queued(&mut table, port);
                if last.progressed != 0 {
                    busy_cycles += ptx::clock64().wrapping_sub(c0);
                    mover.keep_pass();
                }
            }
            if passes % PROGRESS_EVERY == 1 && shards.me == 0 {
                seq += 1;
                publish_progress(progress, seq, passes, now, &table);
            }
            if served || (full && last.progressed != 0) {
                busy += 1;
                idle = 0;
                publish_counters(ctl, passes, busy, busy_cycles, &mover);
            } else {
                idle = idle.saturating_add(1);
                if idle > IDLE_SPINS && idle_sleep != 0 {
                    // Long idle: back off a little (the next doorbell waits
                    // about this long more).
                    ptx::nanosleep(idle_sleep);
                }
                if idle.is_multiple_of(1024) {
                    publish_counters(ctl, passes, busy, busy_cycles, &mover);
                }
            }
            if super::control::heartbeat_due(t, mover.last_barrier_ns, HEARTBEAT_NS) {
                mover.round(Job {
                    kind: JOB_IDLE,
                    bulk: 0,
                    dst: 0,
                    src: 0,
                    len: 0,
                });
            }
        }
        if mover.dirty {
            mover.fence();
        }
        publish_counters(ctl, passes, busy, busy_cycles, &mover);
        mover.round(Job {
            kind: JOB_EXIT,
            bulk: 0,
            dst: 0,
            src: 0,
            len: 0,
        });
        // Block 0's exit says the whole engine's: it waits for the others
        // (each sees the stop word within a few passes) and publishes the
        // progress they made too.
        shards.wait_others(STATE_EXITED, false);
        if shards.me == 0 {
            mem::acquire(Scope::Sys);
            publish_progress(progress, seq + 1, passes, now, &table);
        }
        publish_state(ctl, STATE_EXITED);
    }
}
