//! A resident engine's control block ([`EngineCtl`]): what the host and
//! the engine kernel ([`super::resident`]) share — stop and state words,
//! the configuration, the engine's counters and its progress record.
//!
//! ## Start and stop, as the host sees them
//! The engine stores its state ([`STATE_RUNNING`], [`STATE_EXITED`]) into
//! its control block and, when [`EngineCtl::host_state`] is set, into that
//! word of mapped host memory too, so the host waits for it by reading
//! its own memory — a bounded loop that makes no driver call, which a
//! driver call blocked behind a running kernel would turn into a hang.
//!
//! ## Several blocks
//! An engine of `n` blocks has `n` control blocks side by side, one per
//! block, each with its own state word and counters; only the first has
//! `host_state` and `host_progress` set, and only its `stop`, `cfg` and
//! `cfg_epoch` are read (by every block). The first block says it runs
//! once every block does and that it exited once every block did; the
//! host adds the blocks' counters ([`EngineCounters::add`]) and waits for
//! every block's `cfg_applied`.

use super::burst::BURST_MAX;
use super::config::EngineConfig;
use super::mover::PHASES;
use super::tables::PortTable;

/// [`EngineCtl::state`]: launched, not started yet.
pub const STATE_LAUNCHED: u32 = 0;
/// [`EngineCtl::state`]: polling.
pub const STATE_RUNNING: u32 = 1;
/// [`EngineCtl::state`]: stopped; the engine touches nothing any more.
pub const STATE_EXITED: u32 = 2;

/// One engine's control block, in device memory (or the emulator's), shared
/// by the host and the engine kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EngineCtl {
    /// Host → engine: non-zero asks the engine to stop (read with
    /// `ld.relaxed.sys` every [`CONTROL_EVERY`](super::resident::CONTROL_EVERY) passes).
    pub stop: u32,
    /// Engine → host: [`STATE_LAUNCHED`], [`STATE_RUNNING`],
    /// [`STATE_EXITED`] (stored with `st.release.sys`).
    pub state: u32,
    /// Host: bumped after each new [`Self::cfg`]; the engine reloads the
    /// configuration (and reseeds its generator) when it changes.
    pub cfg_epoch: u64,
    /// Engine → host: the last [`Self::cfg_epoch`] it applied (stored with
    /// `st.release.sys` before the pass that first uses it), so the host
    /// can wait until a new configuration is in force.
    pub cfg_applied: u64,
    /// Timeouts, faults.
    pub cfg: EngineConfig,
    /// Every port of the fabric.
    pub table: *const PortTable,
    /// The port this engine runs.
    pub port: u32,
    /// 1: some port's memory or some rank is on another GPU: the engine's
    /// ordering with the ranks (the acquire after a doorbell record, the
    /// fence before a short copy after payload, the releases of CQEs,
    /// atomics and signal words) is at `sys` scope; 0: every port and every
    /// rank is on this GPU: `gpu` scope suffices. What the host writes
    /// (tables, configuration) is acquired at `sys` either way.
    pub sys_scope: u32,
    /// Most WQEs of one burst ([`super::burst`]): runs of small RDMA
    /// WRITEs that the block reads and checks together, one WQE per
    /// thread (at most [`BURST_MAX`] and the block's threads); 0: no
    /// bursts, every WQE takes the one-WQE path.
    pub burst: u32,
    /// Nanoseconds the control thread sleeps (`nanosleep`) between passes
    /// once it has been idle a while (`resident`'s `IDLE_SPINS` passes); 0:
    /// it never sleeps. A doorbell rung meanwhile waits up to this long
    /// more (or what the GPU makes of it: `nanosleep` is approximate).
    pub idle_sleep_ns: u32,
    /// 1: block copies of at least `resident::BULK_MIN` bytes move their
    /// 16-byte-aligned body through the SM's bulk-copy unit (the kernel
    /// launched with `resident::SHARED_BYTES_BULK` of shared memory);
    /// 0: the block's threads copy every byte.
    pub bulk_copy: u32,
    /// Zero (keeps the next field 8-byte aligned).
    pub reserved: u32,
    /// The fabric's clock when the engine was launched, ns: the engine's
    /// time is this plus `%globaltimer` elapsed since its block 0 started
    /// (`clock_start_ns`).
    pub clock_base_ns: u64,
    /// Engine: block 0's `%globaltimer` when its control loop started (0
    /// until then). Every block's engine time counts from it, so a port's
    /// blocks share one clock, as the link model's transmitter they share
    /// needs.
    pub clock_start_ns: u64,
    /// Engine: what it has done (stored with `st.relaxed.sys` now and
    /// then; read by the host for statistics).
    pub counters: EngineCounters,
    /// This block's board of shared copies (all zero at launch): the
    /// block posts a large copy on it and the port's other blocks copy
    /// chunks of it ([`CopyBoard`]).
    pub board: CopyBoard,
    /// Engine → host: a copy of [`Self::state`] in memory the host reads
    /// without a driver call (mapped pinned host memory on a GPU; stored
    /// with `st.release.sys`); null: none.
    pub host_state: *mut u32,
    /// Engine → host: the engine's [`EngineProgress`], in memory the host
    /// reads without a driver call (mapped pinned host memory on a GPU);
    /// null: none.
    pub host_progress: *mut EngineProgress,
}

const _: () = assert!(core::mem::size_of::<EngineCtl>().is_multiple_of(8));

/// The copies one engine block shares with the port's other blocks
/// (`resident::shared`): the block that owns the board posts a copy, every
/// block that looks claims chunks (of `resident::SHARE_CHUNK` bytes or
/// more) until none is left, the owner waits for the chunks others
/// claimed. Two postings may be in flight at once (the owner posts the
/// next while others still copy chunks of the last): posting `n`'s fields
/// are in `slots[n % 2]`, which the owner rewrites only once posting
/// `n - 2` has been copied whole. Written and read by the engine's blocks
/// only (GPU-scope atomics); all zero: posting 0, nothing to claim.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyBoard {
    /// The newest posting's number (bits 63..32), its number of chunks
    /// (31..16) and its next chunk not yet claimed (15..0): a block claims
    /// a chunk by a compare-and-swap that keeps the number and the count,
    /// so a claim never lands on a later posting or past the end of its
    /// own.
    pub claim: u64,
    /// The fields of the postings with even and odd numbers.
    pub slots: [CopySlot; 2],
}

/// One posting's fields on a [`CopyBoard`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopySlot {
    /// Chunks copied by blocks other than the owner (reset by the owner
    /// before it posts).
    pub done: u32,
    /// Bytes per chunk of the posting (a multiple of 16; the last chunk
    /// may be shorter).
    pub chunk: u32,
    /// Destination of the whole copy.
    pub dst: u64,
    /// Source of the whole copy (not overlapping the destination).
    pub src: u64,
    /// Bytes of the whole copy.
    pub len: u64,
    /// The owner's `%globaltimer` when it posted the copy (what the
    /// claimers' [`EngineCounters::help_claim_ns`] is measured from).
    pub posted_ns: u64,
}

impl CopySlot {
    /// A slot no posting has used.
    pub const ZERO: CopySlot = CopySlot {
        done: 0,
        chunk: 0,
        dst: 0,
        src: 0,
        len: 0,
        posted_ns: 0,
    };
}

/// What an engine kernel has done, as its control block holds it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Passes over the port.
    pub passes: u64,
    /// Passes that made progress.
    pub busy_passes: u64,
    /// Copies made by the whole block (at least [`BLOCK_COPY_MIN`](super::resident::BLOCK_COPY_MIN) bytes).
    pub block_copies: u64,
    /// Copies made by the control thread alone.
    pub thread_copies: u64,
    /// Bytes moved by block copies.
    pub block_bytes: u64,
    /// SM cycles (`%clock64`) of the passes that made progress — the
    /// engine's busy time. `copy_cycles` and `fence_cycles` are parts of
    /// it; the rest is control: doorbells, WQE parsing, checks, CQEs.
    pub busy_cycles: u64,
    /// Cycles moving payload (thread copies, block rounds).
    pub copy_cycles: u64,
    /// Cycles in the fences between copies (before a short copy that
    /// follows payload; printed as "fences after copies").
    pub fence_cycles: u64,
    /// The rest of the busy cycles by [`Phase`](super::mover::Phase) (index: `Phase as usize`):
    /// where the control's time goes. The part of `busy_cycles` in none of
    /// these or the copies and fences is the pass's own walk over the QPs.
    pub phase_cycles: [u64; PHASES],
    /// Bursts that executed WQEs ([`super::burst`]; those of one pass run
    /// side by side in one round of the block, a warp each). A burst whose
    /// first WQE is not simple executes none: its share of a round is the
    /// price a stream of other WQEs pays per doorbell.
    pub bursts: u64,
    /// WQEs bursts executed (the rest took the one-WQE path).
    pub burst_wqes: u64,
    /// WQEs executed after a doorbell of their QP was seen, and the sum
    /// of their times from that doorbell seen to their execution's end
    /// (CQE written), `%globaltimer` ns: the engine's share of a WQE's
    /// latency (noticing the doorbell comes before it; the poster's
    /// completion poll after it).
    pub rung_wqes: u64,
    /// See `rung_wqes`.
    pub rung_to_done_ns: u64,
    /// Rounds of the block that ran bursts; `bursts` over these is how
    /// many QPs' bursts ran side by side, on average.
    pub burst_rounds: u64,
    /// The control thread's cycles inside burst rounds (publishing the
    /// round to its last barrier): part of `busy_cycles`.
    pub round_cycles: u64,
    /// Summed over the bursts: the cycles of their lane 0 gathering its
    /// WQE (`gather_cycles`) and completing the burst (`complete_cycles`:
    /// the ordered payload stores, CQEs and ring) — where a round's time
    /// goes.
    pub gather_cycles: u64,
    /// See `gather_cycles`.
    pub complete_cycles: u64,
    /// WQEs bursts stored without a release of their own: the WRITEs of
    /// warp-wide runs after each run's first
    /// (`doorbell_kernels::mlx5::UNORDERED_WRITE_IMM`).
    pub unordered_wqes: u64,
    /// Bytes this block copied of other blocks' shared copies
    /// ([`CopyBoard`]); those copies' own bytes count in the owner's
    /// `block_bytes`.
    pub shared_bytes: u64,
    /// Doorbells the lone-request path took ([`super::resident`]'s
    /// `lone`: one QP rung while the engine idled, served without a pass),
    /// and the WQEs it executed. Its cycles are the
    /// [`Phase::Lone`](super::mover::Phase::Lone) phase's.
    pub lone_doorbells: u64,
    /// See `lone_doorbells`.
    pub lone_wqes: u64,
    /// Bytes of block copies (this block's own and chunks of other blocks'
    /// shared ones) moved by the SM's bulk-copy unit (`resident`'s `dma`).
    /// Summed over a port's blocks, the threads moved `block_bytes` less
    /// this (`block_bytes` counts a shared copy whole, at its owner).
    pub bulk_bytes: u64,
    /// Block copies that moved their bytes while the control thread went
    /// on to check the QP's next WQE (`PayloadMover::defer`); the control
    /// waited for each at its next copy or publication, or (a shared copy
    /// the next one may run beside) at the copy after (its wait counts in
    /// `copy_cycles`). A shared copy counts once, whoever copied its
    /// chunks (all of them perhaps other blocks).
    pub deferred_copies: u64,
    /// Of `deferred_copies`, those the QP's next WQE found still in flight
    /// when its own copy began: the control had checked that WQE while the
    /// bytes moved. The others ended with the QP's run of due WQEs (or at
    /// a publication before the next copy).
    pub overlapped_copies: u64,
    /// Of `copy_cycles`, the control thread's waits at the second barrier
    /// of its block's copy in flight (the block still copying when the
    /// next copy or publication needed it).
    pub drain_own_cycles: u64,
    /// Of `copy_cycles`, an owner's waits for the chunks of its shared
    /// copies that other blocks claimed and were still copying.
    pub drain_shared_cycles: u64,
    /// Copies this block shared (posted on its board), and their chunks.
    pub shared_copies: u64,
    /// See `shared_copies`.
    pub shared_chunks: u64,
    /// Chunks of this block's deferred shared copies that no other block
    /// had claimed when the owner drained the copy, so it copied them
    /// itself then (besides the one it copies as it posts).
    pub late_chunks: u64,
    /// Chunks of other blocks' shared copies this block copied.
    pub helped_chunks: u64,
    /// Postings of other blocks this block copied chunks of, and the time
    /// from each posting to this block's first claim on it, summed (how
    /// late the helpers come).
    pub helped_postings: u64,
    /// See `helped_postings`.
    pub help_claim_ns: u64,
    /// Of `help_claim_ns`, the part until the look at the boards that saw
    /// the posting (and claimed the chunk), summed over the same postings;
    /// the rest runs from that look to the claim.
    pub help_seen_ns: u64,
    /// Time this block spent copying other blocks' chunks, ns.
    pub help_copy_ns: u64,
    /// Shared copies this block posted before its previous one was
    /// drained (other blocks' chunks of it perhaps still being copied).
    pub pipelined_copies: u64,
}

impl EngineCounters {
    /// Adds another block's counters (an engine of several blocks).
    pub fn add(&mut self, o: &EngineCounters) {
        let EngineCounters {
            passes,
            busy_passes,
            block_copies,
            thread_copies,
            block_bytes,
            busy_cycles,
            copy_cycles,
            fence_cycles,
            phase_cycles,
            bursts,
            burst_wqes,
            rung_wqes,
            rung_to_done_ns,
            burst_rounds,
            round_cycles,
            gather_cycles,
            complete_cycles,
            unordered_wqes,
            shared_bytes,
            lone_doorbells,
            lone_wqes,
            bulk_bytes,
            deferred_copies,
            overlapped_copies,
            drain_own_cycles,
            drain_shared_cycles,
            shared_copies,
            shared_chunks,
            late_chunks,
            helped_chunks,
            helped_postings,
            help_claim_ns,
            help_seen_ns,
            help_copy_ns,
            pipelined_copies,
        } = self;
        for (a, b) in [
            (passes, o.passes),
            (busy_passes, o.busy_passes),
            (block_copies, o.block_copies),
            (thread_copies, o.thread_copies),
            (block_bytes, o.block_bytes),
            (busy_cycles, o.busy_cycles),
            (copy_cycles, o.copy_cycles),
            (fence_cycles, o.fence_cycles),
            (bursts, o.bursts),
            (burst_wqes, o.burst_wqes),
            (rung_wqes, o.rung_wqes),
            (rung_to_done_ns, o.rung_to_done_ns),
            (burst_rounds, o.burst_rounds),
            (round_cycles, o.round_cycles),
            (gather_cycles, o.gather_cycles),
            (complete_cycles, o.complete_cycles),
            (unordered_wqes, o.unordered_wqes),
            (shared_bytes, o.shared_bytes),
            (lone_doorbells, o.lone_doorbells),
            (lone_wqes, o.lone_wqes),
            (bulk_bytes, o.bulk_bytes),
            (deferred_copies, o.deferred_copies),
            (overlapped_copies, o.overlapped_copies),
            (drain_own_cycles, o.drain_own_cycles),
            (drain_shared_cycles, o.drain_shared_cycles),
            (shared_copies, o.shared_copies),
            (shared_chunks, o.shared_chunks),
            (late_chunks, o.late_chunks),
            (helped_chunks, o.helped_chunks),
            (helped_postings, o.helped_postings),
            (help_claim_ns, o.help_claim_ns),
            (help_seen_ns, o.help_seen_ns),
            (help_copy_ns, o.help_copy_ns),
            (pipelined_copies, o.pipelined_copies),
        ] {
            *a = a.wrapping_add(b);
        }
        for (a, b) in phase_cycles.iter_mut().zip(o.phase_cycles) {
            *a = a.wrapping_add(b);
        }
    }
}

/// [`EngineCtl::idle_sleep_ns`] by default: 100 ns.
pub const IDLE_SLEEP_NS: u32 = 100;

/// The control thread stores its [`EngineProgress`] every this many passes
/// (and when it exits): a compare per pass, fifteen stores per 256.
pub const PROGRESS_EVERY: u64 = 256;

/// What the engine has seen and done, as the host reads it at any time
/// (while a user kernel's wait stalls, at teardown): passes tell whether
/// the engine polls at all, the doorbell fields whether the producer's
/// UAR and doorbell-record stores reach it, the WQE and CQE counts whether
/// it executed and completed them. Each word is stored by the control
/// thread with `st.relaxed.sys` every [`PROGRESS_EVERY`] passes, in no
/// particular order: the words of one record may come from neighbouring
/// publications (`seq` says which one was last).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineProgress {
    /// Publications so far (0: the engine never published).
    pub seq: u64,
    /// Passes over the port.
    pub passes: u64,
    /// The engine's clock at this publication, ns.
    pub time_ns: u64,
    /// Doorbells seen: a new UAR value (or, without a UAR, a new
    /// doorbell-record value) on some QP.
    pub doorbells: u64,
    /// The last new UAR value read (0: none).
    pub last_uar: u64,
    /// The last new send counter read from a doorbell record (0: no
    /// doorbell record ever advanced).
    pub last_sq_pi: u64,
    /// Doorbell-record reads made by the re-read timeout.
    pub dbr_rereads: u64,
    /// WQEs fetched from send queues.
    pub fetched: u64,
    /// WQEs that began to execute.
    pub executed: u64,
    /// WQEs that completed successfully.
    pub wqes: u64,
    /// CQEs written.
    pub cqes: u64,
    /// Error CQEs (not counting flushes).
    pub errors: u64,
    /// Flush CQEs.
    pub flushes: u64,
    /// The QP number handled last.
    pub last_qpn: u64,
    /// The SQ counter (basic blocks) of the WQE fetched last.
    pub last_wqe: u64,
}

const _: () = assert!(core::mem::size_of::<EngineProgress>() == 15 * 8);

impl EngineCtl {
    /// A control block for `port` of `table`.
    pub const fn new(
        table: *const PortTable,
        port: u32,
        cfg: EngineConfig,
        sys_scope: bool,
        clock_base_ns: u64,
        host_state: *mut u32,
        host_progress: *mut EngineProgress,
    ) -> EngineCtl {
        EngineCtl {
            stop: 0,
            state: STATE_LAUNCHED,
            cfg_epoch: 1,
            cfg_applied: 0,
            cfg,
            table,
            port,
            sys_scope: sys_scope as u32,
            burst: BURST_MAX,
            idle_sleep_ns: IDLE_SLEEP_NS,
            bulk_copy: 0,
            reserved: 0,
            clock_base_ns,
            clock_start_ns: 0,
            counters: EngineCounters {
                passes: 0,
                busy_passes: 0,
                block_copies: 0,
                thread_copies: 0,
                block_bytes: 0,
                busy_cycles: 0,
                copy_cycles: 0,
                fence_cycles: 0,
                phase_cycles: [0; PHASES],
                bursts: 0,
                burst_wqes: 0,
                rung_wqes: 0,
                rung_to_done_ns: 0,
                burst_rounds: 0,
                round_cycles: 0,
                gather_cycles: 0,
                complete_cycles: 0,
                unordered_wqes: 0,
                shared_bytes: 0,
                lone_doorbells: 0,
                lone_wqes: 0,
                bulk_bytes: 0,
                deferred_copies: 0,
                overlapped_copies: 0,
                drain_own_cycles: 0,
                drain_shared_cycles: 0,
                shared_copies: 0,
                shared_chunks: 0,
                late_chunks: 0,
                helped_chunks: 0,
                helped_postings: 0,
                help_claim_ns: 0,
                help_seen_ns: 0,
                help_copy_ns: 0,
                pipelined_copies: 0,
            },
            board: CopyBoard {
                claim: 0,
                slots: [CopySlot::ZERO; 2],
            },
            host_state,
            host_progress,
        }
    }
}

/// Whether a block whose last barrier was at `last_barrier_ns` is owed a
/// heartbeat round (a barrier every `period_ns` while idle) at `t`, the
/// time its pass began. A barrier during the pass (a burst round, a copy)
/// is later than `t`: none is owed then. (A wrapping difference made every
/// busy pass run one more round of two block barriers.)
#[inline(always)]
pub(crate) fn heartbeat_due(t: u64, last_barrier_ns: u64, period_ns: u64) -> bool {
    t.saturating_sub(last_barrier_ns) > period_ns
}

#[cfg(test)]
mod tests {
    use super::heartbeat_due;

    #[test]
    fn a_heartbeat_is_owed_only_after_a_quiet_period_never_after_a_barrier_in_the_pass() {
        assert!(!heartbeat_due(1_000, 900, 5_000), "100 ns after a barrier");
        assert!(heartbeat_due(10_000, 4_000, 5_000), "6 us after one");
        assert!(!heartbeat_due(9_000, 4_000, 5_000), "exactly the period");
        // A barrier during the pass that began at `t`: later than `t`.
        assert!(!heartbeat_due(1_000, 1_200, 5_000), "a barrier after the pass began");
    }
}
