//! Benchmark of the P2P transport against the raw floors, measured in the
//! same run, interleaved and repeated (the timing, rounds, table, files and
//! figure come from the shared harness, `bench/`):
//!
//! * signal round trip between two ranks, one thread per rank, on the same
//!   8-byte word of one symmetric allocation: **floor**
//!   (`flag_pingpong_pair`: a release store to the peer's word, acquire
//!   loads of the own word, unbounded spin, no doorbell API), **unchecked**
//!   (`signal_pingpong_unchecked`: the word translated once with
//!   `peer_ptr`, the same store and loads at the transport's scope under
//!   its bounded spin) and **checked** (`signal_pingpong`: `signal` +
//!   `wait_until`, argument checks included, four calls per round trip).
//!   The checks cost `(checked - unchecked) / 4` per call. After a warm-up
//!   round, `--rounds` rounds run floor, checked, unchecked in turn (each
//!   launch times `--rtt-iters` round trips after an untimed handshake);
//!   the table gives medians and minima, the ratios are of medians.
//! * put bandwidth, `-b` .. `-e` bytes (`put_bw`: rank 0's blocks put pieces
//!   of `--piece` bytes into rank 1's symmetric buffer, repeatedly in one
//!   launch) vs two copy kernels with the same grid writing the same
//!   destination: `copy_raw` (grid-stride) and `copy_pieces` (the put's
//!   pieces without the transport); the floor is the faster (medians).
//!   After a warm-up launch of each (`-w` iterations), `--rounds` rounds
//!   run put, grid-stride copy, piece copy in turn. Rank 1 launches its wait
//!   for the put's signal once rank 0's timed launch has finished
//!   (`--peer-waits after`: the puts, their `quiet` and the signal are
//!   timed with the GPU to themselves, as the floors are); `during`
//!   launches it first (on one GPU it then shares the GPU with the put).
//!   Each timed launch repeats its put or copy until 1 GiB has moved (`-n`
//!   sets the count) and, on a GPU, queues behind a 200 µs `hold_stream`
//!   kernel: the events time the GPU's work, not the host's submission.
//!
//! ```text
//! cargo run --release --example p2p_bench -- [--device gpu|cpu] [-b 4K] [-e 256M] [-f 4]
//!     [-n ITERS] [-w WARMUP_ITERS] [--rtt-iters N] [--rounds N] [--spread] [--out DIR]
//! ```
//! Flags follow nccl-tests (sizes with K, M, G suffixes). Two ranks are
//! threads of this process: on one GPU both share it (puts are device-local
//! copies); with `--spread` and two GPUs rank r runs on GPU r and puts
//! cross NVLink. Rank 1 checks the bytes of each size's first put before
//! any copy writes there (`#wrong`). Writes `p2p_bench.json`,
//! `p2p_bench.csv` (puts), `p2p_bench_rtt.csv` (round trips) and
//! `p2p_bench.{png,svg}` (bandwidth beside time) to `--out`. On the CPU
//! emulator the timings say nothing about a GPU; the run checks that
//! everything works.
//!
//! Longer than the other examples: besides the two measurements, it keeps
//! the report's JSON and CSV columns as earlier outputs have them (stored
//! results are compared with new runs), one field each.

#[path = "bench/mod.rs"]
mod bench;

use std::time::Duration;

use bench::{interleaved, time_events, Stat, Table};
use clap::Parser;
use doorbell::comm::{CommOptions, Communicator};
use doorbell::{LaunchConfig, Stream};
use doorbell_example_kernels::comm::{
    copy_pieces, copy_raw, flag_pingpong_pair, hold_stream, put_bw_p2p as put_bw, signal_pingpong_p2p as signal_pingpong,
    signal_pingpong_unchecked, PINGPONG_OK,
};
use doorbell_examples::cli::{P2pBenchArgs, P2pBenchPlan};
use doorbell_examples::plot::{Chart, Series};
use doorbell_examples::{main_with, ratio, BoxError};

fn main() {
    let args = P2pBenchArgs::parse();
    main_with(|| run(&args));
}

/// Transport calls per signal round trip (`signal` and `wait_until` on
/// each rank): the divisor of the per-call check cost.
const CALLS_PER_ROUND_TRIP: u32 = 4;

/// The three signal round trips, us per round trip (rank 0's clock).
#[derive(Clone, Debug, Default, serde::Serialize)]
struct Rtt {
    floor: Stat,
    unchecked: Stat,
    checked: Stat,
}

/// The byte at `i` of the data put for `size`: differs from one size to the
/// next, so stale data from an earlier size counts as wrong.
fn pattern_byte(i: u64, size: u64) -> u8 {
    (i.wrapping_mul(131) ^ size.trailing_zeros() as u64 ^ (i >> 8)) as u8
}

fn run(args: &P2pBenchArgs) -> Result<(), BoxError> {
    let backend = args.device.backend()?;
    let gpu = args.device.wants_gpu()?;
    let plan = args.plan(gpu).unwrap_or_else(|e| {
        use clap::CommandFactory;
        P2pBenchArgs::command().error(clap::error::ErrorKind::ArgumentConflict, e).exit()
    });
    let opts = CommOptions {
        heap_bytes: plan.heap_bytes,
        wait_timeout: Duration::from_secs(30),
        spread_gpus: args.spread || CommOptions::from_env()?.spread_gpus,
        ..CommOptions::default()
    };
    if !gpu {
        eprintln!("# note: the backend is the CPU emulator: emulator timings say nothing about a GPU");
    }
    let results = Communicator::local(2, backend, opts, |comm| {
        let s = comm.device().new_stream()?;
        let rtt = measure_rtt(comm, &s, plan.rtt_iters, plan.rounds)?;
        let rows = measure_puts(comm, &s, args, &plan)?;
        let scope = if comm.p2p()?.same_gpu != 0 { "gpu" } else { "sys" };
        let route = format!("{:?}, signals at .{scope} scope", comm.describe_peers()[1]);
        Ok((rtt, rows, comm.device().name(), route))
    })?;
    let (rtt, rows, name, route) = results.into_iter().next().expect("rank 0");
    report(args, &plan, &rtt, rows, &name, &route, gpu)
}

/// The signal round trip's three variants, on the same word of one
/// symmetric allocation: a warm-up round, then `rounds` rounds of floor,
/// checked, unchecked. Rank 0 returns the times; rank 1 zeros.
fn measure_rtt(comm: &Communicator, s: &Stream, iters: u32, rounds: u32) -> doorbell::Result<Rtt> {
    let m = comm.load_module(&doorbell_examples::USER_KERNELS)?;
    let (checked, unchecked) = (m.function::<signal_pingpong>()?, m.function::<signal_pingpong_unchecked>()?);
    let floor = m.function::<flag_pingpong_pair>()?;
    let me = comm.rank();
    let word = comm.alloc::<u64>(1)?;
    let theirs = comm.peer_address(word.as_ptr(), 1 - me)?;
    let handle = comm.p2p()?;
    let sys_scope = (handle.same_gpu == 0) as u32;
    let mut out_ns = comm.device().alloc_zeroed::<u64>(1)?;
    let mut status = comm.device().alloc_zeroed::<u32>(1)?;
    // The word's value both ranks have reached; every launch continues from it.
    let mut epoch = 0u64;
    let one = LaunchConfig::linear(1, 32);
    const NAMES: [&str; 3] = ["Floor", "Checked", "Unchecked"];
    // Variant 0 floor, 1 checked, 2 unchecked, in turn.
    let [f, c, u] = interleaved::<3, _>(true, rounds, |v, _| {
        comm.barrier()?;
        let (word_p, out_p, status_p) = (word.as_mut_ptr(), out_ns.as_mut_ptr(), status.as_mut_ptr());
        // SAFETY: `word` is symmetric (`theirs` its copy on the peer as this
        // GPU sees it), `out_ns` and `status` one word each; both ranks
        // launch the same variant with the same epoch.
        unsafe {
            match v {
                0 => s.launch(&floor, one, (word_p, theirs, me as u32, sys_scope, epoch, iters, out_p))?,
                1 => s.launch(&checked, one, (handle, word_p, epoch, iters, out_p, status_p))?,
                _ => s.launch(&unchecked, one, (handle, word_p, epoch, iters, out_p, status_p))?,
            }
        };
        comm.synchronize(s)?;
        if v != 0 && status.to_host()?[0] != PINGPONG_OK {
            return Err(doorbell::Error::Comm(format!("the {} signal ping-pong did not complete", NAMES[v])));
        }
        // The handshake round trip, then the timed ones.
        epoch += iters as u64 + 1;
        Ok(if me == 0 {
            out_ns.to_host()?[0] as f64 / iters as f64 / 1e3
        } else {
            0.0
        })
    })?;
    if me == 0 {
        eprintln!("# signal round trip, us (rounds in order): floor {f:.3?}, checked {c:.3?}, unchecked {u:.3?}");
    }
    Ok(Rtt {
        floor: Stat::of(f),
        unchecked: Stat::of(u),
        checked: Stat::of(c),
    })
}

/// One put size as measured on rank 0, in nccl-tests' columns plus the
/// floors: a row of the table, `p2p_bench.csv` and `p2p_bench.json`.
#[derive(serde::Serialize)]
struct Row {
    bytes: u64,
    count: u64,
    r#type: &'static str,
    iters: u32,
    blocks: u64,
    /// Median over the rounds; `put_min_us` the fastest round.
    put_us: f64,
    put_min_us: f64,
    put_gbps: Option<f64>,
    /// The faster copy (medians), and which one.
    floor_us: f64,
    floor_kind: &'static str,
    floor_gbps: Option<f64>,
    /// put bandwidth / floor bandwidth.
    ratio: Option<f64>,
    copy: Stat,
    piece_copy: Stat,
    put: Stat,
    /// Bytes rank 1 received wrong from the size's first put.
    wrong: u64,
}

impl Row {
    fn new(bytes: u64, iters: u32, blocks: u64, [put, copy, piece_copy]: [Stat; 3], wrong: u64) -> Row {
        let (floor_us, floor_kind) = if piece_copy.median_us < copy.median_us {
            (piece_copy.median_us, "pieces")
        } else {
            (copy.median_us, "grid-stride")
        };
        let put_gbps = ratio(bytes as f64, put.median_us * 1e-6).map(|b| b / 1e9);
        let floor_gbps = ratio(bytes as f64, floor_us * 1e-6).map(|b| b / 1e9);
        let (put_us, put_min_us) = (put.median_us, put.min_us);
        let ratio = put_gbps.zip(floor_gbps).and_then(|(a, b)| ratio(a, b));
        let r#type = "uint8";
        Row {
            bytes,
            count: bytes,
            r#type,
            iters,
            blocks,
            put_us,
            put_min_us,
            put_gbps,
            floor_us,
            floor_kind,
            floor_gbps,
            ratio,
            copy,
            piece_copy,
            put,
            wrong,
        }
    }
}

/// Put bandwidth per size against the two copy floors, interleaved. Rank 0
/// returns the rows (rank 1 the same sizes, times zero, and `wrong`).
fn measure_puts(comm: &Communicator, s: &Stream, args: &P2pBenchArgs, plan: &P2pBenchPlan) -> doorbell::Result<Vec<Row>> {
    let dev = comm.device();
    let m = comm.load_module(&doorbell_examples::USER_KERNELS)?;
    let (copy, pieces, put) = (m.function::<copy_raw>()?, m.function::<copy_pieces>()?, m.function::<put_bw>()?);
    let hold = if dev.is_gpu() { Some(m.function::<hold_stream>()?) } else { None };
    let (sm_blocks, threads) = if dev.is_gpu() {
        (dev.multiprocessor_count() as u64, 512u32)
    } else {
        (2, 32)
    };
    let mut src = dev.alloc_zeroed::<u8>(plan.max_bytes as usize)?;
    let dst = comm.alloc::<u8>(plan.max_bytes as usize)?;
    // The floors write exactly where the put writes: rank 1's `dst`, as
    // rank 0's GPU sees it (the same GPU, or the peer across NVLink).
    let target = comm.peer_address(dst.as_ptr(), 1)?;
    let psig = comm.alloc::<u64>(1)?;
    let mut status = dev.alloc_zeroed::<u32>(1)?;
    let mut expect = 0u64;
    let (rank0, waits_during) = (comm.rank() == 0, args.peer_waits == "during");
    let mut rows = Vec::new();
    for &bytes in &plan.sizes {
        let blocks = bytes.div_ceil(plan.piece).clamp(1, sm_blocks);
        let iters = plan.iters_for(bytes);
        let cfg = LaunchConfig::linear(blocks as u32, threads);
        // Fresh data for this size; rank 1 checks what the first put brought (#wrong).
        if rank0 {
            src.copy_from_host(&doorbell_examples::host_vec(plan.max_bytes, |i| pattern_byte(i, bytes)).map_err(doorbell::Error::Comm)?)?;
        }
        let mut wrong = None;
        // One put launch on both ranks (rank 0 puts, rank 1 waits for the
        // blocks' signals), timed on rank 0; the first of a size is checked.
        // With `during` rank 1 launches before the barrier and rank 0 after
        // it, so rank 0's launch never waits for rank 1's at the driver
        // (that wait would land between rank 0's events); with `after` rank
        // 1 launches once rank 0's timed launch has finished.
        let mut put_once = |n: u32| -> doorbell::Result<f64> {
            expect += blocks;
            let warp = (args.put_by == "warp") as u32;
            // SAFETY: buffers hold max_bytes >= bytes; `psig` symmetric, `status` one word.
            let mut launch = || unsafe {
                let a = (
                    dst.as_mut_ptr(),
                    src.as_ptr(),
                    bytes,
                    plan.piece,
                    n,
                    warp,
                    psig.as_mut_ptr(),
                    expect,
                );
                s.launch(
                    &put,
                    cfg,
                    (comm.p2p()?, a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7, status.as_mut_ptr()),
                )
            };
            let us = match (rank0, waits_during) {
                (true, _) => {
                    comm.barrier()?;
                    let us = time_events(s, hold.as_ref(), n, launch)?;
                    if !waits_during {
                        comm.barrier()?;
                    }
                    us
                }
                (false, true) => {
                    launch()?;
                    comm.barrier()?;
                    0.0
                }
                (false, false) => {
                    // Rank 0's put has finished, signal included: the wait only confirms it.
                    comm.barrier()?;
                    comm.barrier()?;
                    launch()?;
                    0.0
                }
            };
            comm.synchronize(s)?;
            if status.to_host()?[0] != PINGPONG_OK {
                return Err(doorbell::Error::Comm(format!("put of {bytes} bytes did not complete")));
            }
            if wrong.is_none() {
                wrong = Some(count_wrong(comm, bytes, || dst.to_host())?);
            }
            Ok(us)
        };
        // A copy floor on rank 0. Rank 1 only keeps step: it waits at a
        // second barrier until the floor is timed, so its next put waiter
        // is not launched inside the floor's timed window.
        let floor_once = |pieces_floor: bool, n: u32| -> doorbell::Result<f64> {
            comm.barrier()?;
            // SAFETY: `target` and `src` hold max_bytes >= bytes, 16-byte aligned.
            let us = match rank0 {
                true => time_events(s, hold.as_ref(), n, || unsafe {
                    match pieces_floor {
                        true => s.launch(&pieces, cfg, (target, src.as_ptr(), bytes, plan.piece, n)),
                        false => s.launch(&copy, cfg, (target, src.as_ptr(), bytes, n)),
                    }
                })?,
                false => 0.0,
            };
            comm.barrier()?;
            Ok(us)
        };
        let warm = args.warmup_iters as u32;
        let [p, c, q] = interleaved::<3, _>(warm > 0, plan.rounds, |v, w| {
            let n = if w { warm } else { iters };
            if v == 0 {
                put_once(n)
            } else {
                floor_once(v == 2, n)
            }
        })?;
        let row = Row::new(bytes, iters, blocks, [Stat::of(p), Stat::of(c), Stat::of(q)], wrong.unwrap_or(0));
        if rank0 {
            eprintln!(
                "# {bytes:>12} bytes x {iters:>5}, {blocks:>3} blocks: put {:>10.2} us, copy {:>10.2} us, piece copy {:>10.2} us (medians), {} wrong",
                row.put.median_us, row.copy.median_us, row.piece_copy.median_us, row.wrong
            );
        }
        rows.push(row);
    }
    comm.barrier()?;
    Ok(rows)
}

/// Bytes of rank 1's buffer (`read` copies it to the host, on rank 1
/// only) that differ from the pattern for `bytes`, broadcast to both ranks.
fn count_wrong(comm: &Communicator, bytes: u64, read: impl FnOnce() -> doorbell::Result<Vec<u8>>) -> doorbell::Result<u64> {
    let w = match comm.rank() {
        1 => {
            let got = read()?;
            (0..bytes).filter(|&i| got[i as usize] != pattern_byte(i, bytes)).count() as u64
        }
        _ => 0,
    };
    let b = comm.world().broadcast_bytes(1, &w.to_le_bytes())?;
    let w = b
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .ok_or_else(|| doorbell::Error::Comm("rank 1's count of wrong bytes did not arrive".into()))?;
    Ok(u64::from_le_bytes(w))
}

/// The whole run, as written to `p2p_bench.json`. The flat `*_rtt_us`
/// fields are medians (kept for readers of earlier outputs).
#[derive(serde::Serialize)]
struct Report<'a> {
    device: &'a str,
    route: &'a str,
    emulator: bool,
    rounds: u32,
    rtt_iters: u32,
    /// Bytes per put call (and per piece of the piece-copy floor).
    piece_bytes: u64,
    /// Who calls each put: `block` or `warp`.
    put_by: &'a str,
    /// When rank 1's waiter ran: `after` or `during` the timed put launch.
    peer_waits: &'a str,
    /// Checked signal round trip (`signal` + `wait_until`), median.
    signal_rtt_us: f64,
    /// The same round trip without argument checks, median.
    unchecked_rtt_us: f64,
    /// Flag ping-pong floor, median.
    flag_floor_rtt_us: f64,
    /// checked / floor, of medians.
    rtt_ratio: Option<f64>,
    /// unchecked / floor, of medians.
    unchecked_rtt_ratio: Option<f64>,
    /// (checked - unchecked) / calls_per_round_trip, ns, of medians.
    check_ns_per_call: f64,
    calls_per_round_trip: u32,
    /// Every round of the three round trips.
    rtt: &'a Rtt,
    put: Vec<Row>,
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("n/a".to_string(), |v| format!("{v:.prec$}"))
}

/// Prints the round-trip table; returns `p2p_bench_rtt.csv`.
fn print_rtt(plan: &P2pBenchPlan, rtt: &Rtt) -> String {
    let (rtt_ratio, unchecked_ratio) = (
        ratio(rtt.checked.median_us, rtt.floor.median_us),
        ratio(rtt.unchecked.median_us, rtt.floor.median_us),
    );
    let check_ns = (rtt.checked.median_us - rtt.unchecked.median_us) * 1e3 / CALLS_PER_ROUND_TRIP as f64;
    println!(
        "# signal round trip, us, {} rounds x {} round trips, same word (median / min / vs floor):",
        plan.rounds, plan.rtt_iters
    );
    let mut csv = String::from("variant,calls_per_round_trip,rounds,iters,median_us,min_us,ratio_to_floor,check_ns_per_call\n");
    for (label, key, st, calls, r) in [
        ("flag ping-pong floor", "floor", &rtt.floor, 0, Some(1.0)),
        ("unchecked (peer_ptr)", "unchecked", &rtt.unchecked, 0, unchecked_ratio),
        ("signal + wait_until", "checked", &rtt.checked, CALLS_PER_ROUND_TRIP, rtt_ratio),
    ] {
        println!("#   {label:<22} {:>9.3} {:>9.3} {:>7}", st.median_us, st.min_us, fmt_opt(r, 2));
        let check = if key == "checked" {
            format!("{check_ns:.1}")
        } else {
            String::new()
        };
        let r = r.map_or(String::new(), |r| format!("{r:.3}"));
        csv += &format!(
            "{key},{calls},{},{},{:.4},{:.4},{r},{check}\n",
            plan.rounds, plan.rtt_iters, st.median_us, st.min_us
        );
    }
    println!(
        "# argument checks: (checked - unchecked) / {CALLS_PER_ROUND_TRIP} calls = {check_ns:.1} ns per call; signal round trip / floor = {}",
        fmt_opt(rtt_ratio, 2)
    );
    csv
}

/// Prints the put table; returns `p2p_bench.csv`.
fn print_puts(rows: &[Row]) -> String {
    let t = [
        ("size(B)", 12),
        ("count", 12),
        ("type", 6),
        ("time(us)", 12),
        ("algbw(GB/s)", 12),
        ("floor(us)", 12),
    ]
    .into_iter()
    .chain([
        ("floor(GB/s)", 12),
        ("ratio", 8),
        ("#wrong", 8),
        ("blocks", 6),
        ("min(us)", 12),
        ("copy(us)", 12),
        ("pieces(us)", 12),
    ])
    .fold(Table::new(), |t, (h, w)| t.col(h, w));
    println!("{}", t.heading());
    let mut csv = String::from(
        "bytes,count,type,iters,blocks,put_us,put_min_us,put_gbps,floor_us,floor_kind,floor_gbps,ratio,copy_us,piece_copy_us,wrong\n",
    );
    for r in rows {
        let f2 = |v: f64| format!("{v:.2}");
        let cells = [
            r.bytes.to_string(),
            r.count.to_string(),
            r.r#type.into(),
            f2(r.put_us),
            fmt_opt(r.put_gbps, 1),
            f2(r.floor_us),
            fmt_opt(r.floor_gbps, 1),
            fmt_opt(r.ratio, 2),
            r.wrong.to_string(),
            r.blocks.to_string(),
            f2(r.put_min_us),
            f2(r.copy.median_us),
            f2(r.piece_copy.median_us),
        ];
        println!("{}", t.row(&cells));
        let c = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
        csv += &format!(
            "{},{},uint8,{},{},{:.3},{:.3},{},{:.3},{},{},{},{:.3},{:.3},{}\n",
            r.bytes,
            r.count,
            r.iters,
            r.blocks,
            r.put_us,
            r.put_min_us,
            c(r.put_gbps),
            r.floor_us,
            r.floor_kind,
            c(r.floor_gbps),
            c(r.ratio),
            r.copy.median_us,
            r.piece_copy.median_us,
            r.wrong
        );
    }
    csv
}

fn report(args: &P2pBenchArgs, plan: &P2pBenchPlan, rtt: &Rtt, rows: Vec<Row>, name: &str, route: &str, gpu: bool) -> Result<(), BoxError> {
    let (out, put_by, peer_waits) = (args.out.as_path(), args.put_by.as_str(), args.peer_waits.as_str());
    let (shown, who) = match put_by {
        "warp" => (
            format!("{} bytes per block split over its warps", plan.piece),
            "each put by one warp, pieces dealt round-robin to every warp of the grid (as many blocks as for block puts)",
        ),
        _ => (format!("{} bytes", plan.piece), "one block per piece"),
    };
    println!("# doorbell P2P benchmark: 2 ranks on {name}, route {route}; puts of {shown}, {who}; rank 1 waits {peer_waits} the timed put launch");
    if !gpu {
        println!("# note: the backend is the CPU emulator: emulator timings say nothing about a GPU");
    }
    let rtt_csv = print_rtt(plan, rtt);
    let csv = print_puts(&rows);
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    let bw = |us: &dyn Fn(&Row) -> f64| {
        rows.iter()
            .map(|r| (r.bytes as f64, ratio(r.bytes as f64, us(r) * 1e3).unwrap_or(f64::NAN)))
            .collect()
    };
    let time = |us: &dyn Fn(&Row) -> f64| rows.iter().map(|r| (r.bytes as f64, us(r))).collect();
    let (put_name, floor_name) = (
        "put_block (P2P transport), median",
        "copy kernel (floor: faster of grid-stride and pieces), median",
    );
    let bw_series = [
        Series {
            name: put_name,
            points: bw(&|r| r.put_us),
        },
        Series {
            name: floor_name,
            points: bw(&|r| r.floor_us),
        },
    ];
    let time_series = [
        Series {
            name: put_name,
            points: time(&|r| r.put_us),
        },
        Series {
            name: floor_name,
            points: time(&|r| r.floor_us),
        },
    ];
    let title = format!("doorbell P2P put vs copy floor ({name})");
    let chart = Chart {
        title: &title,
        x_label: "bytes",
        y_label: "GB/s",
        series: &bw_series,
    };
    let report = Report {
        device: name,
        route,
        emulator: !gpu,
        rounds: plan.rounds,
        rtt_iters: plan.rtt_iters,
        piece_bytes: plan.piece,
        put_by,
        peer_waits,
        signal_rtt_us: rtt.checked.median_us,
        unchecked_rtt_us: rtt.unchecked.median_us,
        flag_floor_rtt_us: rtt.floor.median_us,
        rtt_ratio: ratio(rtt.checked.median_us, rtt.floor.median_us),
        unchecked_rtt_ratio: ratio(rtt.unchecked.median_us, rtt.floor.median_us),
        check_ns_per_call: (rtt.checked.median_us - rtt.unchecked.median_us) * 1e3 / CALLS_PER_ROUND_TRIP as f64,
        calls_per_round_trip: CALLS_PER_ROUND_TRIP,
        rtt,
        put: rows,
    };
    bench::write_json(out, "p2p_bench.json", &report)?;
    bench::write_text(out, "p2p_bench.csv", &csv)?;
    bench::write_text(out, "p2p_bench_rtt.csv", &rtt_csv)?;
    bench::write_figure(out, "p2p_bench", &chart, &time_series)?;
    println!("# wrote {}/p2p_bench.{{json,csv,png,svg}} and p2p_bench_rtt.csv", out.display());
    if wrong > 0 {
        return Err(format!("{wrong} bytes arrived wrong (see the #wrong column)").into());
    }
    Ok(())
}
