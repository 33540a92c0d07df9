//! `ibgda_bench`'s results and report: the put bandwidth rows, rank 0's
//! engine over the lane-post runs, the report rank 0 fills in (its fields
//! are the JSON fields of `ibgda_bench.json`, as earlier outputs have
//! them) and the lines it prints.

use doorbell::comm::{EngineCounters, EnginePhase as Phase};
use doorbell_examples::cli::IbgdaBenchArgs;

use super::bench::Table;

#[derive(serde::Serialize, Clone, Debug)]
pub struct BwRow {
    pub bytes: u64,
    pub iters: u32,
    pub ibgda_gbps: f64,
    pub p2p_gbps: f64,
    pub ratio: Option<f64>,
    pub link_promised_gbps: Option<f64>,
    pub link_achieved: Option<f64>,
    /// Rank 0's engine (its blocks added up) over the timed IBGDA
    /// launches of this size.
    pub engine: Option<LaneEngine>,
}

/// What rank 0's engine did over the timed lane-post runs of many blocks
/// (sums of its counters' growth): where a burst round's time goes.
#[derive(serde::Serialize, Clone, Copy, Debug, Default)]
pub struct LaneEngine {
    /// The runs' wall time, ns.
    pub elapsed_ns: u64,
    pub passes: u64,
    pub busy_cycles: u64,
    pub rounds: u64,
    pub bursts: u64,
    pub burst_wqes: u64,
    /// The control thread's cycles inside burst rounds.
    pub round_cycles: u64,
    /// Summed over bursts: lane 0's gather, and its completion of the burst.
    pub gather_cycles: u64,
    pub complete_cycles: u64,
    /// Burst WQEs stored without a release of their own.
    pub unordered_wqes: u64,
    /// Doorbells the lone-request path served without a pass, and their
    /// WQEs.
    pub lone_doorbells: u64,
    pub lone_wqes: u64,
    /// The control thread's busy cycles by phase (`Phase as usize`), and
    /// in copies and in fences after copies.
    pub phases: [u64; Phase::ALL.len()],
    pub copy_cycles: u64,
    pub fence_cycles: u64,
    /// Copies made by whole blocks, their bytes, and the bytes blocks
    /// copied of other blocks' shared copies.
    pub block_copies: u64,
    pub block_bytes: u64,
    pub shared_bytes: u64,
    /// Block copies that ran on while the control thread checked the QP's
    /// next WQE (its later wait for them counts in `copy_cycles`).
    pub deferred_copies: u64,
    /// Of those, the ones the next WQE's copy found still in flight.
    pub overlapped_copies: u64,
    /// The drains' waits for the block's own copy and for other blocks'
    /// chunks (both within `copy_cycles`), the chunks left to their
    /// owner, and the chunks of others' copies with their claims' delays.
    pub drain_own_cycles: u64,
    pub drain_shared_cycles: u64,
    pub shared_copies: u64,
    pub shared_chunks: u64,
    pub late_chunks: u64,
    pub helped_chunks: u64,
    pub helped_postings: u64,
    pub help_claim_ns: u64,
    pub help_seen_ns: u64,
    pub help_copy_ns: u64,
    /// Shared copies posted before the one before was drained.
    pub pipelined_copies: u64,
}

impl LaneEngine {
    pub fn add(&mut self, b: &EngineCounters, a: &EngineCounters, ns: u64) {
        self.elapsed_ns += ns;
        self.passes += a.passes - b.passes;
        self.busy_cycles += a.busy_cycles - b.busy_cycles;
        self.rounds += a.burst_rounds - b.burst_rounds;
        self.bursts += a.bursts - b.bursts;
        self.burst_wqes += a.burst_wqes - b.burst_wqes;
        self.round_cycles += a.round_cycles - b.round_cycles;
        self.gather_cycles += a.gather_cycles - b.gather_cycles;
        self.complete_cycles += a.complete_cycles - b.complete_cycles;
        self.unordered_wqes += a.unordered_wqes - b.unordered_wqes;
        self.lone_doorbells += a.lone_doorbells - b.lone_doorbells;
        self.lone_wqes += a.lone_wqes - b.lone_wqes;
        for (k, v) in self.phases.iter_mut().enumerate() {
            *v += a.phase_cycles[k].wrapping_sub(b.phase_cycles[k]);
        }
        self.copy_cycles += a.copy_cycles - b.copy_cycles;
        self.fence_cycles += a.fence_cycles - b.fence_cycles;
        self.block_copies += a.block_copies - b.block_copies;
        self.block_bytes += a.block_bytes - b.block_bytes;
        self.shared_bytes += a.shared_bytes - b.shared_bytes;
        self.deferred_copies += a.deferred_copies - b.deferred_copies;
        self.overlapped_copies += a.overlapped_copies - b.overlapped_copies;
        self.drain_own_cycles += a.drain_own_cycles - b.drain_own_cycles;
        self.drain_shared_cycles += a.drain_shared_cycles - b.drain_shared_cycles;
        self.shared_copies += a.shared_copies - b.shared_copies;
        self.shared_chunks += a.shared_chunks - b.shared_chunks;
        self.late_chunks += a.late_chunks - b.late_chunks;
        self.helped_chunks += a.helped_chunks - b.helped_chunks;
        self.helped_postings += a.helped_postings - b.helped_postings;
        self.help_claim_ns += a.help_claim_ns - b.help_claim_ns;
        self.help_seen_ns += a.help_seen_ns - b.help_seen_ns;
        self.help_copy_ns += a.help_copy_ns - b.help_copy_ns;
        self.pipelined_copies += a.pipelined_copies - b.pipelined_copies;
    }
}

#[derive(serde::Serialize, Clone, Debug, Default)]
pub struct Report {
    pub device: String,
    pub ranks_on: String,
    pub engine: String,
    pub engine_threads: u32,
    /// Blocks of rank 0's engine kernel (each serves its own QPs).
    pub engine_blocks: u32,
    pub link: Option<String>,
    pub rtt_iters: u32,
    pub rtt_ibgda_us: f64,
    pub rtt_p2p_us: f64,
    pub rtt_ratio: Option<f64>,
    /// Rank 0's engine over the timed IBGDA round-trip launches.
    pub rtt_engine: Option<LaneEngine>,
    pub post_warp_mwqe_s: f64,
    pub post_block_mwqe_s: f64,
    pub engine_mwqe_s: f64,
    /// The lane-post run (`post_lanes`): blocks, QPs they use, WQEs.
    pub lanes_blocks: u64,
    pub lanes_qps: u64,
    pub lanes_wqes: u64,
    /// M WQE/s of posting and to the last completion: one block, then
    /// `lanes_blocks` blocks (median of the rounds).
    pub lanes_one_post_mwqe_s: f64,
    pub lanes_one_done_mwqe_s: f64,
    pub lanes_all_post_mwqe_s: f64,
    pub lanes_all_done_mwqe_s: f64,
    /// Rank 0's engine over the timed runs of `lanes_blocks` blocks.
    pub lanes_engine: Option<LaneEngine>,
    /// One block's warp posting `lanes_batch` puts per lane a call
    /// (`post_lanes_many`): M WQE/s of posting and to the last completion.
    pub lanes_batch: u64,
    pub lanes_batch_post_mwqe_s: f64,
    pub lanes_batch_done_mwqe_s: f64,
    pub engine_wqes: u64,
    /// Where rank 0's engine kernel spent its busy cycles over the whole
    /// run: shares of copying payload, fencing after copies, and the rest
    /// (control: doorbells, WQE parsing, checks, CQEs); control cycles per
    /// WQE executed.
    pub engine_copy_share: Option<f64>,
    pub engine_fence_share: Option<f64>,
    pub engine_control_share: Option<f64>,
    pub engine_control_cycles_per_wqe: Option<f64>,
    /// The control cycles per WQE by phase (the soft NIC's `Phase`, by
    /// name), and `walk`: the rest, the pass's own walk over the QPs.
    pub engine_phase_cycles_per_wqe: Vec<(String, f64)>,
    /// Of the WQEs rank 0's engine executed over the run: how many its
    /// bursts took (runs of short WRITEs checked a WQE per thread), in how
    /// many bursts (`DOORBELL_SOFTNIC_BURST`).
    pub engine_burst_wqes: Option<u64>,
    /// One thread's blocking 8-byte puts (`Ibgda::profile_puts`): cycles
    /// per WQE of each step (checks, reserve, write, doorbell, the wait
    /// for the CQE, its consumption).
    pub post_cycles_per_wqe: Vec<(String, f64)>,
    /// Over those puts: rank 0's engine's mean time from seeing a QP's
    /// doorbell to the end of the WQE's execution (its CQE written), ns.
    pub post_engine_ns_per_wqe: Option<f64>,
    /// Rank 0's engine over those puts (each a burst round of its own).
    pub post_engine: Option<LaneEngine>,
    /// What the engine's primitives cost on this GPU (`primitive_costs`):
    /// cycles per operation, by name.
    pub primitive_cycles: Vec<(String, u64)>,
    pub engine_bursts: Option<u64>,
    /// Over the whole run, rank 0's engine: payload bytes its blocks
    /// copied, and of those the chunks one block copied of another's
    /// copy (the engine's shared copies).
    pub engine_copied_bytes: Option<u64>,
    pub engine_shared_bytes: Option<u64>,
    /// Of the engine's block copies (its own and shared chunks), the bytes
    /// the SM's bulk-copy unit moved.
    pub engine_bulk_bytes: Option<u64>,
    /// The engine's block copies are made by its threads alone.
    pub engine_thread_copies: bool,
    pub put_bw: Vec<BwRow>,
}

pub fn print_report(r: &Report, a: &IbgdaBenchArgs, gpu: bool) {
    let link = r.link.as_deref().unwrap_or("off");
    println!(
        "# ibgda_bench on {} ({}), soft NIC engine: {} ({} block(s) of {} threads), link model: {link}",
        r.device,
        r.ranks_on,
        r.engine,
        r.engine_blocks.max(1),
        r.engine_threads
    );
    println!(
        "# 8-byte put_signal round trip, one warp per rank, {} round trips per launch, median of {} launches",
        r.rtt_iters, a.rounds
    );
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".into(), |x| format!("{x:.prec$}"));
    let t = Table::new().col("ibgda (us)", 12).col("p2p (us)", 12).col("ratio", 8);
    println!("{}", t.heading());
    println!(
        "{}",
        t.row(&[
            format!("{:.2}", r.rtt_ibgda_us),
            format!("{:.2}", r.rtt_p2p_us),
            opt(r.rtt_ratio, 2)
        ])
    );
    if let Some(e) = r.rtt_engine {
        print_engine(&e, r.engine_blocks, "over the round trips");
    }
    println!(
        "# put bandwidth (GB/s = 1e9 bytes/s), {} blocks of rank 0, non-blocking puts then quiet",
        a.blocks
    );
    let t = [
        ("bytes", 12),
        ("iters", 7),
        ("ibgda", 11),
        ("p2p", 11),
        ("ratio", 8),
        ("link promised", 13),
        ("achieved", 9),
    ]
    .into_iter()
    .fold(Table::new(), |t, (h, w)| t.col(h, w));
    println!("{}", t.heading());
    for b in &r.put_bw {
        let (ib, p2p) = (format!("{:.2}", b.ibgda_gbps), format!("{:.2}", b.p2p_gbps));
        let cells = [b.bytes.to_string(), b.iters.to_string(), ib, p2p, opt(b.ratio, 3)];
        let link = [opt(b.link_promised_gbps, 2), opt(b.link_achieved, 3)];
        println!("{}", t.row(&[&cells[..], &link[..]].concat()));
    }
    for b in &r.put_bw {
        if let Some(e) = b.engine.filter(|e| e.block_copies != 0) {
            print_put_engine(&e, b.bytes, r.engine_blocks);
        }
    }
    println!(
        "# WQE post rate ({} 8-byte puts): one warp {:.3} M WQE/s, one block {:.3} M WQE/s",
        a.wqes, r.post_warp_mwqe_s, r.post_block_mwqe_s
    );
    println!(
        "# engine execution rate: {:.3} M WQE/s ({} WQEs executed by rank 0's port)",
        r.engine_mwqe_s, r.engine_wqes
    );
    println!(
        "# warp posts of a WQE per lane ({} 8-byte puts per block, 32 behind each doorbell): one block {:.3} M WQE/s posted, {:.3} M WQE/s completed; {} blocks on {} QPs {:.3} M WQE/s posted, {:.3} M WQE/s completed",
        r.lanes_wqes, r.lanes_one_post_mwqe_s, r.lanes_one_done_mwqe_s, r.lanes_blocks, r.lanes_qps, r.lanes_all_post_mwqe_s, r.lanes_all_done_mwqe_s
    );
    println!(
        "# one warp posting {} puts per lane a call (put_lanes_many_raw, {} behind each doorbell while that fits the send queue, else 32): {:.3} M WQE/s posted, {:.3} M WQE/s completed",
        r.lanes_batch,
        32 * r.lanes_batch,
        r.lanes_batch_post_mwqe_s,
        r.lanes_batch_done_mwqe_s
    );
    if let Some(e) = r.lanes_engine {
        let heading = format!("over those {} blocks' runs", r.lanes_blocks);
        print_engine(&e, r.engine_blocks, &heading);
    }
    if let (Some(c), Some(f), Some(k), Some(w)) = (
        r.engine_copy_share,
        r.engine_fence_share,
        r.engine_control_share,
        r.engine_control_cycles_per_wqe,
    ) {
        let (c, f, k) = (c * 100.0, f * 100.0, k * 100.0);
        println!("# engine busy cycles: {c:.1} % copying payload, {f:.1} % fences after copies, {k:.1} % control ({w:.0} cycles per WQE)");
    }
    if !r.engine_phase_cycles_per_wqe.is_empty() {
        let parts: Vec<String> = r.engine_phase_cycles_per_wqe.iter().map(|(n, c)| format!("{n} {c:.0}")).collect();
        println!("# control cycles per WQE by phase: {}", parts.join(", "));
    }
    if !r.post_cycles_per_wqe.is_empty() {
        let parts: Vec<String> = r.post_cycles_per_wqe.iter().map(|(n, c)| format!("{n} {c:.0}")).collect();
        println!("# one thread's blocking 8-byte puts, cycles per WQE: {}", parts.join(", "));
    }
    if let Some(ns) = r.post_engine_ns_per_wqe {
        println!("# of the CQE wait, the engine from seeing the doorbell to the CQE written: {ns:.0} ns per WQE");
    }
    if let Some(e) = r.post_engine {
        print_engine(&e, r.engine_blocks, "over those puts (a round each)");
    }
    if !r.primitive_cycles.is_empty() {
        let parts: Vec<String> = r.primitive_cycles.iter().map(|(n, c)| format!("{n} {c}")).collect();
        println!(
            "# this GPU's primitives, cycles each (one thread, the engines running): {}",
            parts.join(", ")
        );
    }
    if let (Some(w), Some(b)) = (r.engine_burst_wqes, r.engine_bursts) {
        println!("# engine bursts: {w} WQEs in {b} bursts");
    }
    if let (Some(c), Some(s)) = (r.engine_copied_bytes, r.engine_shared_bytes) {
        let pct = 100.0 * s as f64 / c.max(1) as f64;
        println!("# engine copies: {c} payload bytes, {s} of them ({pct:.1} %) in chunks a block copied of another's copy");
        if let Some(k) = r.engine_bulk_bytes {
            // `c` counts every byte of the blocks' copies (chunks other
            // blocks moved included): the bulk share is of it.
            let all = c.max(1) as f64;
            println!(
                "# engine bulk-copy unit: {k} bytes ({:.1} % of the payload bytes; DOORBELL_SOFTNIC_COPY={})",
                100.0 * k as f64 / all,
                if r.engine_thread_copies { "threads" } else { "bulk" }
            );
        }
    }
    if !gpu {
        println!("# CPU emulator: the timings say nothing about a GPU; every path ran and every put was checked");
    }
}

/// Rank 0's engine over a window of the run (`e`, its counters' growth;
/// `blocks` blocks): passes, lone doorbells, burst rounds and where a
/// round's (or, without rounds, a lone doorbell's) cycles go.
fn print_engine(e: &LaneEngine, blocks: u32, heading: &str) {
    let per = |c: u64, n: u64| c as f64 / n.max(1) as f64;
    if e.lone_doorbells != 0 {
        println!(
            "# rank 0's engine {heading}: {} passes, {} doorbells served by the lone path ({:.2} WQEs each), busy {:.0} cycles a lone doorbell (the window's busy cycles over them; {} burst rounds besides)",
            e.passes,
            e.lone_doorbells,
            per(e.lone_wqes, e.lone_doorbells),
            per(e.busy_cycles, e.lone_doorbells),
            e.rounds,
        );
    }
    // The phases per lone doorbell where those are most of the window's
    // work, else per round.
    let lone = e.lone_doorbells != 0 && e.lone_doorbells >= e.rounds;
    if lone {
        print_phases(e, e.lone_doorbells, "a lone doorbell (all the window's busy cycles)");
    }
    if e.rounds == 0 || e.bursts == 0 || e.burst_wqes == 0 {
        return;
    }
    println!(
        "# rank 0's engine ({} block(s), counts added up, per round of a block) {heading}: {} passes, {} rounds, {:.2} bursts a round, {:.1} WQEs a burst ({} stored unordered); a block's round every {:.0} ns, {:.0} cycles in it; per burst, lane 0: gather {:.0} cycles, completion {:.0} cycles ({:.0} per WQE); busy {:.0} cycles a round",
        blocks.max(1),
        e.passes,
        e.rounds,
        per(e.bursts, e.rounds),
        per(e.burst_wqes, e.bursts),
        e.unordered_wqes,
        per(e.elapsed_ns * blocks.max(1) as u64, e.rounds),
        per(e.round_cycles, e.rounds),
        per(e.gather_cycles, e.bursts),
        per(e.complete_cycles, e.bursts),
        per(e.complete_cycles, e.burst_wqes),
        per(e.busy_cycles, e.rounds),
    );
    if !lone {
        print_phases(e, e.rounds, "a round");
    }
}

/// Where rank 0's engine spent the timed puts of `bytes` (`blocks` blocks,
/// counts added up): per block copy (a WQE's payload), the busy cycles of
/// all its blocks and the control's phases.
fn print_put_engine(e: &LaneEngine, bytes: u64, blocks: u32) {
    let per = |c: u64, n: u64| c as f64 / n.max(1) as f64;
    let n = e.block_copies;
    println!(
        "# rank 0's engine over the timed puts of {bytes} bytes ({} block(s), counts added up): {n} block copies of {:.0} KiB ({} ran on while the control went on, {} of them until the next WQE's copy) in {:.0} us, {:.0} % of their bytes in shared chunks; per copy {:.0} busy cycles: copies (the control thread's part and waits) {:.0}, fences {:.0}, the rest control",
        blocks.max(1),
        per(e.block_bytes, n) / 1024.0,
        e.deferred_copies,
        e.overlapped_copies,
        e.elapsed_ns as f64 / 1e3,
        100.0 * e.shared_bytes as f64 / e.block_bytes.max(1) as f64,
        per(e.busy_cycles, n),
        per(e.copy_cycles, n),
        per(e.fence_cycles, n),
    );
    if e.shared_copies != 0 || e.deferred_copies != 0 {
        println!(
            "# of the copies' cycles per copy: waiting for its own block {:.0}, for other blocks' chunks {:.0}; of {} shared copies' {} chunks, {} left to their owner's drain ({} copies posted before the one before was drained); other blocks copied {} chunks of {} postings, their first claim on a posting {:.0} ns after it on average ({:.0} until the look that saw it), {:.0} ns copying a chunk",
            per(e.drain_own_cycles, n),
            per(e.drain_shared_cycles, n),
            e.shared_copies,
            e.shared_chunks,
            e.late_chunks,
            e.pipelined_copies,
            e.helped_chunks,
            e.helped_postings,
            per(e.help_claim_ns, e.helped_postings),
            per(e.help_seen_ns, e.helped_postings),
            per(e.help_copy_ns, e.helped_chunks),
        );
    }
    print_phases(e, n, "a block copy");
}

/// The control thread's busy cycles of `e` by phase, per `n` (`unit`).
fn print_phases(e: &LaneEngine, n: u64, unit: &str) {
    let per = |c: u64, n: u64| c as f64 / n.max(1) as f64;
    let named: u64 = e.phases.iter().sum::<u64>() + e.copy_cycles + e.fence_cycles;
    let mut parts: Vec<String> = Phase::ALL
        .iter()
        .filter(|&&p| e.phases[p as usize] != 0)
        .map(|&p| format!("{} {:.0}", p.name(), per(e.phases[p as usize], n)))
        .collect();
    parts.push(format!("copies {:.0}", per(e.copy_cycles + e.fence_cycles, n)));
    parts.push(format!("walk {:.0}", per(e.busy_cycles.saturating_sub(named), n)));
    println!("# its control thread's busy cycles {unit}, by phase: {}", parts.join(", "));
}
