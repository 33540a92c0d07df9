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
//! * **the engine's primitives** (on a GPU): what a fence, a load that
//!   hits L1 or follows a fence, a prefetch, a release, an atomic and a
//!   short sleep cost one thread, in cycles, while the engines run.
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
//! The setup is here; the measurements, each a launch of its own kernel
//! per transport, are in `ibgda_bench_runs.rs`, and the report, with its
//! JSON fields as earlier outputs have them, in `ibgda_bench_report.rs`.

#[path = "bench/mod.rs"]
mod bench;
#[path = "ibgda_bench_report.rs"]
mod report;
#[path = "ibgda_bench_runs.rs"]
mod runs;

use bench::run_ranks;
use clap::Parser;
use doorbell::comm::{CommOptions, Communicator, IbgdaOptions, SymBuffer};
use doorbell::{DeviceBuffer, Stream};
use doorbell_example_kernels::ibgda_bench::lane_words;
use doorbell_examples::cli::IbgdaBenchArgs;
use doorbell_examples::plot::{Chart, Series};
use doorbell_examples::{die, main_with, BoxError, USER_KERNELS};
use doorbell_kernels::transport::{Ibgda, P2p};
use report::{print_report, BwRow, Report};
use runs::{engine_shares, lane_rates, post_rates, primitives, profile_posts, put_bandwidth, round_trips};

fn main() {
    let args = IbgdaBenchArgs::parse();
    main_with(|| run(&args));
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
        // Source and destination, a word per rate put, and room.
        heap_bytes: 2 * max + 8 * rate_words(a) as u64 + (1 << 20),
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

/// Words of the rate runs' target: a word per put of the post rate and
/// of the lane posts (up to `LANE_WORDS`).
fn rate_words(a: &IbgdaBenchArgs) -> usize {
    (a.wqes as usize).max(lane_words(a.lane_blocks as u32, a.lane_rounds as u32))
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
        // The post rate's and the lane posts' puts write a word each.
        words: comm.alloc::<u64>(rate_words(p.args))?,
        sig: comm.alloc::<u64>(1)?,
        s: dev.new_stream()?,
        pattern: (0..p.max).map(|i| (i % 251) as u8 ^ 0x5a).collect(),
        status: dev.alloc_zeroed::<u32>(1)?,
        out: dev.alloc_zeroed::<u64>(3)?,
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
    primitives(&mut r, &mut report)?;
    engine_shares(comm, engine_before, wqes_before, &mut report)?;
    comm.barrier()?;
    Ok((comm.rank() == 0).then_some(report))
}
