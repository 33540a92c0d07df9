//! IBGDA over the soft NIC against P2P, measured in one run on the same
//! two ranks (threads of this process, `--spread`: one GPU each; or one
//! rank per process when launcher variables are set, e.g.
//! `RANK=0 ./ibgda_bench & RANK=1 ./ibgda_bench` with `WORLD_SIZE=2`,
//! `MASTER_ADDR`, `MASTER_PORT` and `DOORBELL_TOKEN`, each on GPU
//! `LOCAL_RANK`):
//!
//! * **put_signal round trip**, 8 bytes, one warp per rank
//!   (`put_signal_rtt`): through the soft NIC (WQEs, doorbell, the engine
//!   kernel executing them, CQ) vs through P2P (stores); µs per round trip,
//!   median of `--rounds` launches, and the ratio.
//! * **put bandwidth**, `-b`..`-e` bytes (`put_stream`: rank 0's `--blocks`
//!   blocks put their shares non-blocking, then `quiet`), GB/s of IBGDA vs
//!   P2P and the ratio. With `DOORBELL_SOFTNIC_LINK` set (e.g.
//!   `400gbps,2us`) the table adds the link's promised bandwidth for the
//!   launch's puts streamed through one link (`n / (n / bw + latency)`,
//!   `n` = bytes × iters) and the achieved fraction.
//! * **WQE post rate** (`post_burst`): `--wqes` 8-byte puts posted by one
//!   warp, then by one block; million WQEs/s of posting (the send queue
//!   holds them: no flow control in the timed part when `--wqes` is at
//!   most the queue size).
//! * **engine execution rate**: WQEs rank 0's port executed (its counters)
//!   over the time from the first post to the last completion.
//!
//! ```text
//! cargo run --release --example ibgda_bench -- [--device gpu|cpu] [-b 4K] [-e 256M] [-f F] [--blocks N]
//!     [--rtt-iters N] [--wqes N] [--rounds N] [--spread] [--out DIR]
//! ```
//! Every measurement runs a warm-up round, then `--rounds` rounds with
//! IBGDA and P2P in turn (the shared harness, `bench/`). Prints a text
//! table and writes `ibgda_bench.json` and `ibgda_bench.{png,svg}` (put
//! bandwidth beside time per launch) to `--out`. On the CPU emulator the
//! timings mean nothing about a GPU; the run checks that every path works
//! (each size's first IBGDA put is checked byte for byte on rank 1).
//!
//! Longer than the other examples: four measurements, each a launch of
//! its own kernel per transport, and the engine's cycle accounting, with
//! the report's JSON fields as earlier outputs have them.

#[path = "bench/mod.rs"]
mod bench;

use std::time::Instant;

use bench::{interleaved, median_upper as median, run_ranks, Table};
use clap::Parser;
use doorbell::comm::{CommOptions, Communicator, EngineCounters, EnginePhase as Phase, EngineReport, IbgdaOptions, SymBuffer};
use doorbell::{AnyTransport, DeviceBuffer, LaunchConfig, Stream};
use doorbell_example_kernels::ibgda_bench::{post_burst_ibgda, post_lanes_ibgda, post_profile, put_signal_rtt, put_stream, BENCH_OK};
use doorbell_examples::cli::{sweep, IbgdaBenchArgs};
use doorbell_examples::plot::{Chart, Series};
use doorbell_examples::{die, main_with, ratio, BoxError, USER_KERNELS};
use doorbell_kernels::transport::ibgda::PostProfile;
use doorbell_kernels::transport::{Ibgda, P2p};

fn main() {
    let args = IbgdaBenchArgs::parse();
    main_with(|| run(&args));
}

#[derive(serde::Serialize, Clone, Debug)]
struct BwRow {
    bytes: u64,
    iters: u32,
    ibgda_gbps: f64,
    p2p_gbps: f64,
    ratio: Option<f64>,
    link_promised_gbps: Option<f64>,
    link_achieved: Option<f64>,
}

/// What rank 0's engine did over the timed lane-post runs of many blocks
/// (sums of its counters' growth): where a burst round's time goes.
#[derive(serde::Serialize, Clone, Copy, Debug, Default)]
struct LaneEngine {
    /// The runs' wall time, ns.
    elapsed_ns: u64,
    passes: u64,
    busy_cycles: u64,
    rounds: u64,
    bursts: u64,
    burst_wqes: u64,
    /// The control thread's cycles inside burst rounds.
    round_cycles: u64,
    /// Summed over bursts: lane 0's gather, and its completion of the burst.
    gather_cycles: u64,
    complete_cycles: u64,
    /// Burst WQEs stored without a release of their own.
    unordered_wqes: u64,
    /// The control thread's busy cycles by phase (`Phase as usize`), and
    /// in copies and in fences after copies.
    phases: [u64; Phase::ALL.len()],
    copy_cycles: u64,
    fence_cycles: u64,
}

impl LaneEngine {
    fn add(&mut self, b: &EngineCounters, a: &EngineCounters, ns: u64) {
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
        for (k, v) in self.phases.iter_mut().enumerate() {
            *v += a.phase_cycles[k].wrapping_sub(b.phase_cycles[k]);
        }
        self.copy_cycles += a.copy_cycles - b.copy_cycles;
        self.fence_cycles += a.fence_cycles - b.fence_cycles;
    }
}

#[derive(serde::Serialize, Clone, Debug, Default)]
struct Report {
    device: String,
    ranks_on: String,
    engine: String,
    engine_threads: u32,
    /// Blocks of rank 0's engine kernel (each serves its own QPs).
    engine_blocks: u32,
    link: Option<String>,
    rtt_iters: u32,
    rtt_ibgda_us: f64,
    rtt_p2p_us: f64,
    rtt_ratio: Option<f64>,
    post_warp_mwqe_s: f64,
    post_block_mwqe_s: f64,
    engine_mwqe_s: f64,
    /// The lane-post run (`post_lanes`): blocks, QPs they use, WQEs.
    lanes_blocks: u64,
    lanes_qps: u64,
    lanes_wqes: u64,
    /// M WQE/s of posting and to the last completion: one block, then
    /// `lanes_blocks` blocks (median of the rounds).
    lanes_one_post_mwqe_s: f64,
    lanes_one_done_mwqe_s: f64,
    lanes_all_post_mwqe_s: f64,
    lanes_all_done_mwqe_s: f64,
    /// Rank 0's engine over the timed runs of `lanes_blocks` blocks.
    lanes_engine: Option<LaneEngine>,
    engine_wqes: u64,
    /// Where rank 0's engine kernel spent its busy cycles over the whole
    /// run: shares of copying payload, fencing after copies, and the rest
    /// (control: doorbells, WQE parsing, checks, CQEs); control cycles per
    /// WQE executed.
    engine_copy_share: Option<f64>,
    engine_fence_share: Option<f64>,
    engine_control_share: Option<f64>,
    engine_control_cycles_per_wqe: Option<f64>,
    /// The control cycles per WQE by phase (the soft NIC's `Phase`, by
    /// name), and `walk`: the rest, the pass's own walk over the QPs.
    engine_phase_cycles_per_wqe: Vec<(String, f64)>,
    /// Of the WQEs rank 0's engine executed over the run: how many its
    /// bursts took (runs of short WRITEs checked a WQE per thread), in how
    /// many bursts (`DOORBELL_SOFTNIC_BURST`).
    engine_burst_wqes: Option<u64>,
    /// One thread's blocking 8-byte puts (`Ibgda::profile_puts`): cycles
    /// per WQE of each step (checks, reserve, write, doorbell, the wait
    /// for the CQE, its consumption).
    post_cycles_per_wqe: Vec<(String, f64)>,
    /// Over those puts: rank 0's engine's mean time from seeing a QP's
    /// doorbell to the end of the WQE's execution (its CQE written), ns.
    post_engine_ns_per_wqe: Option<f64>,
    engine_bursts: Option<u64>,
    /// Over the whole run, rank 0's engine: payload bytes its blocks
    /// copied, and of those the chunks one block copied of another's
    /// copy (the engine's shared copies).
    engine_copied_bytes: Option<u64>,
    engine_shared_bytes: Option<u64>,
    put_bw: Vec<BwRow>,
}

fn check(status: &DeviceBuffer<u32>, what: &str) -> Result<(), BoxError> {
    let s = status.to_host()?[0];
    if s != BENCH_OK && s != 0 {
        return Err(format!("{what}: a transport call failed (status {s})").into());
    }
    Ok(())
}

/// The settings every rank runs with.
struct Plan<'a> {
    args: &'a IbgdaBenchArgs,
    max: u64,
    rtt_iters: u32,
    io: IbgdaOptions,
}

fn run(a: &IbgdaBenchArgs) -> Result<(), BoxError> {
    let gpu = a.device.wants_gpu()?;
    let max = a.max_bytes.unwrap_or(if gpu { 256 << 20 } else { 1 << 20 });
    if a.min_bytes > max {
        die(format!("--minbytes {} is larger than --maxbytes {max}", a.min_bytes));
    }
    let plan = Plan {
        args: a,
        max,
        rtt_iters: a.rtt_iters.unwrap_or(if gpu { 2000 } else { 50 }) as u32,
        io: IbgdaOptions::from_env()?,
    };
    if a.wqes > plan.io.sq_size as u64 {
        let sq = plan.io.sq_size;
        eprintln!(
            "note: --wqes {} exceeds the send queue ({sq}); the post rate then includes waiting for completions",
            a.wqes
        );
    }
    let opts = CommOptions {
        heap_bytes: 2 * max + (1 << 20),
        spread_gpus: a.spread,
        ..CommOptions::from_env()?
    };
    let ran = run_ranks("ibgda_bench", 2, Some(2), a.device.backend()?, opts, |comm| bench(comm, &plan))?;
    let mut r = match ran.results.into_iter().flatten().next() {
        Some(r) => r,
        // Rank 1 of a world of processes: rank 0 reports.
        None if ran.one_process_per_rank => return Ok(()),
        None => return Err("rank 0 produced no report".into()),
    };
    if ran.one_process_per_rank {
        r.ranks_on = format!("one process per rank, {}", r.ranks_on);
    }
    print_report(&r, a, gpu);
    let path = bench::write_json(&a.out, "ibgda_bench.json", &r)?;
    let points = |f: &dyn Fn(&BwRow) -> f64| r.put_bw.iter().map(|b| (b.bytes as f64, f(b))).collect::<Vec<_>>();
    let us = |gbps: f64, b: &BwRow| b.bytes as f64 * b.iters as f64 / (gbps * 1e3);
    let bw = [("ibgda (soft NIC)", points(&|b| b.ibgda_gbps)), ("p2p", points(&|b| b.p2p_gbps))];
    let time = [
        ("ibgda (soft NIC)", points(&|b| us(b.ibgda_gbps, b))),
        ("p2p", points(&|b| us(b.p2p_gbps, b))),
    ];
    let series = |s: [(&'static str, Vec<(f64, f64)>); 2]| s.map(|(name, points)| Series { name, points });
    let title = format!("IBGDA vs P2P put bandwidth ({})", r.device);
    let bw = series(bw);
    let chart = Chart {
        title: &title,
        x_label: "bytes per put",
        y_label: "GB/s",
        series: &bw,
    };
    let (png, svg) = bench::write_figure(&a.out, "ibgda_bench", &chart, &series(time))?;
    println!("# wrote {}", path.display());
    eprintln!(
        "wrote {} and {} (us per launch of {} blocks' puts)",
        png.display(),
        svg.display(),
        a.blocks
    );
    Ok(())
}

fn print_report(r: &Report, a: &IbgdaBenchArgs, gpu: bool) {
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
    if let Some(e) = r.lanes_engine.filter(|e| e.rounds > 0 && e.bursts > 0 && e.burst_wqes > 0) {
        let per = |c: u64, n: u64| c as f64 / n.max(1) as f64;
        println!(
            "# rank 0's engine ({} block(s), counts added up, per round of a block) over those {} blocks' runs: {} passes, {} rounds, {:.2} bursts a round, {:.1} WQEs a burst ({} stored unordered); a block's round every {:.0} ns, {:.0} cycles in it; per burst, lane 0: gather {:.0} cycles, completion {:.0} cycles ({:.0} per WQE); busy {:.0} cycles a round",
            r.engine_blocks.max(1),
            r.lanes_blocks,
            e.passes,
            e.rounds,
            per(e.bursts, e.rounds),
            per(e.burst_wqes, e.bursts),
            e.unordered_wqes,
            per(e.elapsed_ns * r.engine_blocks.max(1) as u64, e.rounds),
            per(e.round_cycles, e.rounds),
            per(e.gather_cycles, e.bursts),
            per(e.complete_cycles, e.bursts),
            per(e.complete_cycles, e.burst_wqes),
            per(e.busy_cycles, e.rounds),
        );
        let named: u64 = e.phases.iter().sum::<u64>() + e.copy_cycles + e.fence_cycles;
        let mut parts: Vec<String> = Phase::ALL
            .iter()
            .filter(|&&p| e.phases[p as usize] != 0)
            .map(|&p| format!("{} {:.0}", p.name(), per(e.phases[p as usize], e.rounds)))
            .collect();
        parts.push(format!("copies {:.0}", per(e.copy_cycles + e.fence_cycles, e.rounds)));
        parts.push(format!("walk {:.0}", per(e.busy_cycles.saturating_sub(named), e.rounds)));
        println!("# its control thread's busy cycles a round, by phase: {}", parts.join(", "));
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
    if let (Some(w), Some(b)) = (r.engine_burst_wqes, r.engine_bursts) {
        println!("# engine bursts: {w} WQEs in {b} bursts");
    }
    if let (Some(c), Some(s)) = (r.engine_copied_bytes, r.engine_shared_bytes) {
        let pct = 100.0 * s as f64 / c.max(1) as f64;
        println!("# engine copies: {c} payload bytes, {s} of them ({pct:.1} %) in chunks a block copied of another's copy");
    }
    if !gpu {
        println!("# CPU emulator: the timings say nothing about a GPU; every path ran and every put was checked");
    }
}

/// One rank's buffers and kernels.
struct Rank<'c> {
    comm: &'c Communicator,
    s: Stream,
    m: doorbell::Module,
    ib: Ibgda,
    p2p: P2p,
    src: SymBuffer<'c, u8>,
    dst: SymBuffer<'c, u8>,
    words: SymBuffer<'c, u64>,
    sig: SymBuffer<'c, u64>,
    pattern: Vec<u8>,
    status: DeviceBuffer<u32>,
    out: DeviceBuffer<u64>,
}

/// One rank's part; rank 0 returns the report.
fn bench(comm: &Communicator, p: &Plan) -> Result<Option<Report>, BoxError> {
    let dev = comm.device();
    let mut r = Rank {
        comm,
        m: comm.load_module(&USER_KERNELS)?,
        p2p: comm.p2p()?,
        ib: comm.ibgda_with(&p.io)?,
        src: comm.alloc::<u8>(p.max as usize)?,
        dst: comm.alloc::<u8>(p.max as usize)?,
        words: comm.alloc::<u64>(128)?,
        sig: comm.alloc::<u64>(1)?,
        s: dev.new_stream()?,
        pattern: (0..p.max).map(|i| (i % 251) as u8 ^ 0x5a).collect(),
        status: dev.alloc_zeroed::<u32>(1)?,
        out: dev.alloc_zeroed::<u64>(2)?,
    };
    r.src.copy_from_host(&r.pattern)?;
    let engine_before = comm.ibgda_engine();
    let wqes_before = comm.soft_nic().map(|n| n.stats().wqes).unwrap_or(0);
    let ranks_on = match p.args.spread || comm.ranks_per_gpu() == 1 && dev.is_gpu() {
        true => "one GPU per rank",
        false => "one device",
    };
    let mut report = Report {
        device: dev.name(),
        ranks_on: ranks_on.into(),
        link: p.io.link.map(|l| format!("{} bit/s, {} ns", l.bits_per_second(), l.latency_ns)),
        rtt_iters: p.rtt_iters,
        ..Report::default()
    };
    round_trips(&mut r, p, &mut report)?;
    put_bandwidth(&mut r, p, &mut report)?;
    post_rates(&mut r, p, &mut report)?;
    lane_rates(&mut r, p, &mut report)?;
    profile_posts(&mut r, p, &mut report)?;
    engine_shares(comm, engine_before, wqes_before, &mut report)?;
    comm.barrier()?;
    Ok((comm.rank() == 0).then_some(report))
}

/// The handle of variant `v` of an interleaved pair: 0 IBGDA, else P2P.
fn handle(v: usize, ib: Ibgda, p2p: P2p) -> AnyTransport {
    match v {
        0 => ib.into(),
        _ => p2p.into(),
    }
}

/// Part 1: put_signal round trips, IBGDA and P2P in turn.
fn round_trips(r: &mut Rank, p: &Plan, report: &mut Report) -> Result<(), BoxError> {
    let (comm, me) = (r.comm, r.comm.rank());
    let (ib, p2p) = (r.ib, r.p2p);
    let family = r.m.family::<put_signal_rtt>()?;
    let mut epoch = 1u64;
    let [ib_us, p2p_us] = interleaved::<2, BoxError>(true, p.args.rounds as u32, |v, _| {
        r.status.zero()?;
        comm.barrier()?;
        let a = (
            r.words.as_mut_ptr(),
            r.sig.as_mut_ptr(),
            epoch,
            p.rtt_iters,
            r.out.as_mut_ptr(),
            r.status.as_mut_ptr(),
        );
        let one = LaunchConfig::linear(1, 32);
        // SAFETY: symmetric `words` and `sig`; one warp per rank.
        unsafe { r.s.launch_family(&family, one, handle(v, ib, p2p), a)? };
        comm.synchronize(&r.s)?;
        check(&r.status, "put_signal round trip")?;
        epoch += p.rtt_iters as u64 + 1;
        Ok(r.out.to_host()?[0] as f64 / 1e3 / p.rtt_iters as f64)
    })?;
    if me == 0 {
        (report.rtt_ibgda_us, report.rtt_p2p_us) = (median(ib_us), median(p2p_us));
        report.rtt_ratio = ratio(report.rtt_ibgda_us, report.rtt_p2p_us);
        eprintln!(
            "put_signal round trip: ibgda {:.2} us, p2p {:.2} us",
            report.rtt_ibgda_us, report.rtt_p2p_us
        );
    }
    Ok(())
}

/// Part 2: put bandwidth, IBGDA and P2P in turn; each size's first IBGDA
/// put is checked on rank 1 (exactly the put's bytes, nothing past them).
fn put_bandwidth(r: &mut Rank, p: &Plan, report: &mut Report) -> Result<(), BoxError> {
    let (comm, me, gpu) = (r.comm, r.comm.rank(), r.comm.device().is_gpu());
    let (ib, p2p) = (r.ib, r.p2p);
    let family = r.m.family::<put_stream>()?;
    for bytes in sweep(p.args.min_bytes, p.max, p.args.step_factor) {
        let iters = ((256u64 << 20) / bytes).clamp(if gpu { 4 } else { 1 }, if gpu { 1000 } else { 8 }) as u32;
        let [ib_t, p2p_t] = interleaved::<2, BoxError>(true, p.args.rounds as u32, |v, warm| {
            if warm && v == 0 {
                comm.barrier()?;
                r.dst.copy_from_host(&vec![0u8; p.max as usize])?;
            }
            r.status.zero()?;
            comm.barrier()?;
            let t0 = Instant::now();
            let cfg = LaunchConfig::linear(p.args.blocks as u32, 256);
            let a = (r.dst.as_mut_ptr(), r.src.as_ptr(), bytes, iters, r.status.as_mut_ptr());
            // SAFETY: symmetric src/dst of `max` >= `bytes` bytes.
            unsafe { r.s.launch_family(&family, cfg, handle(v, ib, p2p), a)? };
            comm.synchronize(&r.s)?;
            let secs = t0.elapsed().as_secs_f64();
            check(&r.status, "put")?;
            comm.barrier()?;
            if warm && v == 0 && me == 1 {
                let (got, n) = (r.dst.to_host()?, bytes as usize);
                if got[..n] != r.pattern[..n] || got[n..].iter().any(|&b| b != 0) {
                    return Err(format!("the IBGDA put of {bytes} bytes did not land exactly in rank 1's buffer").into());
                }
            }
            Ok(bytes as f64 * iters as f64 / secs / 1e9)
        })?;
        let (ibg, p2g) = (median(ib_t), median(p2p_t));
        let promised = p.io.link.filter(|l| l.enabled()).map(|l| {
            // `iters` puts stream through one link: one latency, then the wire.
            let total = bytes * iters as u64;
            let wire_s = l.wire_ps(total) as f64 * 1e-12 + l.latency_ns as f64 * 1e-9;
            total as f64 / wire_s / 1e9
        });
        report.put_bw.push(BwRow {
            bytes,
            iters,
            ibgda_gbps: ibg,
            p2p_gbps: p2g,
            ratio: ratio(ibg, p2g),
            link_promised_gbps: promised,
            link_achieved: promised.and_then(|p| ratio(ibg, p)),
        });
        if me == 0 {
            eprintln!("put {bytes} bytes: ibgda {ibg:.2} GB/s, p2p {p2g:.2} GB/s");
        }
    }
    Ok(())
}

/// Parts 3 and 4: the post rate (one warp, one block) and the engine's
/// execution rate.
fn post_rates(r: &mut Rank, p: &Plan, report: &mut Report) -> Result<(), BoxError> {
    let (comm, me) = (r.comm, r.comm.rank());
    let ib = r.ib;
    let f_post = r.m.function::<post_burst_ibgda>()?;
    let nic = comm.soft_nic().ok_or("the soft NIC is not set up")?;
    let (mut executed, mut busy_ns) = (0u64, 0u64);
    let [warp, block] = interleaved::<2, BoxError>(true, p.args.rounds as u32, |v, warm| {
        let (threads, use_warp) = [(32u32, 1u32), (256, 0)][v];
        if me == 0 && warm {
            eprintln!("post rate: {} posting", if use_warp != 0 { "one warp" } else { "one block" });
        }
        r.status.zero()?;
        comm.barrier()?;
        let before = nic.stats().wqes;
        let a = (r.words.as_mut_ptr(), r.src.as_ptr() as *const u64, p.args.wqes as u32, use_warp);
        // SAFETY: symmetric `words` of 128 words, `src` at least 16 bytes.
        unsafe {
            let cfg = LaunchConfig::linear(1, threads);
            r.s.launch(&f_post, cfg, (ib, a.0, a.1, a.2, a.3, r.out.as_mut_ptr(), r.status.as_mut_ptr()))?;
        }
        comm.synchronize(&r.s)?;
        check(&r.status, "post burst")?;
        let ns = r.out.to_host()?;
        if !warm && me == 0 {
            executed += nic.stats().wqes - before;
            busy_ns += ns[1];
        }
        Ok(p.args.wqes as f64 / (ns[0].max(1) as f64 * 1e-9) / 1e6)
    })?;
    if me == 0 {
        (report.post_warp_mwqe_s, report.post_block_mwqe_s) = (median(warp), median(block));
        report.engine_wqes = executed;
        report.engine_mwqe_s = executed as f64 / (busy_ns.max(1) as f64 * 1e-9) / 1e6;
    }
    Ok(())
}

/// Part 4b: warps posting a WQE per lane (`post_lanes`), one block and
/// then `--lane-blocks` blocks, each on its QP: WQEs per second posted and
/// completed (the first block's start to the last one's end).
fn lane_rates(r: &mut Rank, p: &Plan, report: &mut Report) -> Result<(), BoxError> {
    let (comm, me) = (r.comm, r.comm.rank());
    let f = r.m.function::<post_lanes_ibgda>()?;
    let blocks = p.args.lane_blocks as u32;
    let rounds = p.args.lane_rounds as u32;
    let mut out = comm.device().alloc_zeroed::<u64>(3 * blocks as usize)?;
    let mut posted: [Vec<f64>; 2] = Default::default();
    let mut engine: Option<LaneEngine> = None;
    let [one, all] = interleaved::<2, BoxError>(true, p.args.rounds as u32, |v, warm| {
        let n = [1, blocks][v];
        if me == 0 && warm {
            eprintln!("lane posts: {n} block(s) of one warp");
        }
        r.status.zero()?;
        out.zero()?;
        comm.barrier()?;
        let before = comm.ibgda_engine().filter(|_| v == 1 && !warm);
        // SAFETY: symmetric `words` of 128 words, registered `src`; `out` holds 3 words per block.
        unsafe {
            let a = (r.words.as_mut_ptr(), r.src.as_ptr() as *const u64, rounds, out.as_raw() as *mut u64);
            r.s.launch(&f, LaunchConfig::linear(n, 32), (r.ib, a.0, a.1, a.2, a.3, r.status.as_mut_ptr()))?;
        }
        comm.synchronize(&r.s)?;
        check(&r.status, "lane posts")?;
        let ns = out.to_host()?;
        let at = |k: usize| ns.iter().skip(k).step_by(3).take(n as usize);
        let t0 = at(0).min().copied().unwrap_or(0);
        let wqes = (32 * rounds * n) as f64;
        let rate = |end: u64| wqes / (end.saturating_sub(t0).max(1) as f64 * 1e-9) / 1e6;
        if !warm {
            posted[v].push(rate(at(1).max().copied().unwrap_or(0)));
        }
        if let (Some(b), Some(a)) = (before, comm.ibgda_engine()) {
            let ns = at(2).max().copied().unwrap_or(0).saturating_sub(t0);
            engine.get_or_insert_with(LaneEngine::default).add(&b.counters, &a.counters, ns);
        }
        Ok(rate(at(2).max().copied().unwrap_or(0)))
    })?;
    if me == 0 {
        report.lanes_blocks = blocks as u64;
        report.lanes_qps = (blocks as u64).min(p.io.qps_per_peer as u64);
        report.lanes_wqes = 32 * rounds as u64;
        let [p1, pn] = posted;
        (report.lanes_one_post_mwqe_s, report.lanes_all_post_mwqe_s) = (median(p1), median(pn));
        (report.lanes_one_done_mwqe_s, report.lanes_all_done_mwqe_s) = (median(one), median(all));
        report.lanes_engine = engine;
    }
    Ok(())
}

/// Part 5: where one thread's blocking 8-byte puts spend their cycles
/// (`post_profile`, rank 0 to rank 1).
fn profile_posts(r: &mut Rank, p: &Plan, report: &mut Report) -> Result<(), BoxError> {
    let f = r.m.function::<post_profile>()?;
    let out = r.comm.device().alloc_zeroed::<u64>(7)?;
    let n = p.rtt_iters.min(2000);
    r.status.zero()?;
    r.comm.barrier()?;
    let before = r.comm.ibgda_engine();
    // SAFETY: symmetric `words`, registered `src`; `out` holds a
    // PostProfile (seven words).
    unsafe {
        let a = (
            r.words.as_mut_ptr(),
            r.src.as_ptr() as *const u64,
            n,
            out.as_raw() as *mut PostProfile,
        );
        r.s.launch(&f, LaunchConfig::linear(1, 1), (r.ib, a.0, a.1, a.2, a.3, r.status.as_mut_ptr()))?;
    }
    r.comm.synchronize(&r.s)?;
    if r.comm.rank() != 0 {
        return Ok(());
    }
    check(&r.status, "post profile")?;
    if let (Some(b), Some(a)) = (before, r.comm.ibgda_engine()) {
        let wqes = a.counters.rung_wqes - b.counters.rung_wqes;
        if wqes > 0 {
            report.post_engine_ns_per_wqe = Some((a.counters.rung_to_done_ns - b.counters.rung_to_done_ns) as f64 / wqes as f64);
        }
    }
    let v = out.to_host()?;
    let per = |c: u64| c as f64 / v[0].max(1) as f64;
    let names = ["checks", "reserve", "write", "doorbell", "cqe_wait", "consume"];
    report.post_cycles_per_wqe = names.iter().zip(&v[1..]).map(|(n, &c)| (n.to_string(), per(c))).collect();
    Ok(())
}

/// Where rank 0's engine spent its busy cycles since `before`.
fn engine_shares(comm: &Communicator, before: Option<EngineReport>, wqes_before: u64, report: &mut Report) -> Result<(), BoxError> {
    let (Some(e), Some(nic)) = (comm.ibgda_engine(), comm.soft_nic()) else {
        return Ok(());
    };
    report.engine = format!("{:?}", e.engine);
    report.engine_threads = e.threads;
    report.engine_blocks = e.blocks.len() as u32;
    let wqes = nic.stats().wqes - wqes_before;
    let Some(b) = before else { return Ok(()) };
    let (e, b) = (e.counters, b.counters);
    report.engine_burst_wqes = Some(e.burst_wqes - b.burst_wqes);
    report.engine_bursts = Some(e.bursts - b.bursts);
    report.engine_copied_bytes = Some(e.block_bytes - b.block_bytes);
    report.engine_shared_bytes = Some(e.shared_bytes - b.shared_bytes);
    let busy = e.busy_cycles - b.busy_cycles;
    if busy == 0 || wqes == 0 {
        return Ok(());
    }
    let copy = (e.copy_cycles - b.copy_cycles) as f64;
    let fence = (e.fence_cycles - b.fence_cycles) as f64;
    let control = (busy as f64 - copy - fence).max(0.0);
    report.engine_copy_share = Some(copy / busy as f64);
    report.engine_fence_share = Some(fence / busy as f64);
    report.engine_control_share = Some(control / busy as f64);
    report.engine_control_cycles_per_wqe = Some(control / wqes as f64);
    let mut phases: Vec<(String, f64)> = Phase::ALL
        .iter()
        .map(|&p| {
            (
                p.name().to_string(),
                e.phase_cycles[p as usize].wrapping_sub(b.phase_cycles[p as usize]) as f64 / wqes as f64,
            )
        })
        .collect();
    let walk = control / wqes as f64 - phases.iter().map(|(_, c)| c).sum::<f64>();
    phases.push(("walk".to_string(), walk.max(0.0)));
    report.engine_phase_cycles_per_wqe = phases;
    Ok(())
}
