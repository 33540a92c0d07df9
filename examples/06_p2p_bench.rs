//! Benchmark of the P2P transport against the raw floors, measured in the
//! same run, interleaved and repeated:
//!
//! * signal round trip between two ranks, one thread per rank, in three
//!   variants on the same 8-byte word of one symmetric allocation:
//!   - **floor** (`flag_pingpong_pair`): a release store to the peer's word,
//!     acquire loads of the own word, unbounded spin, no doorbell API;
//!   - **unchecked** (`signal_pingpong_unchecked`): the peer's word
//!     translated once with `peer_ptr`, the same store and loads at the
//!     transport's scope, polled under the transport's bounded spin;
//!   - **checked** (`signal_pingpong`): `signal` + `wait_until` through the
//!     transport, argument checks included (four calls per round trip).
//!
//!   The argument checks cost `(checked - unchecked) / 4` per call (an
//!   average over the round trip's calls: a wait's checks run while the
//!   peer's signal is in flight, a signal's lie on the round trip's path).
//!   After a warm-up round, `--rounds` rounds run floor, checked,
//!   unchecked in turn (each launch times `--rtt-iters` round trips after
//!   an untimed handshake); the table gives each one's median and minimum,
//!   the ratios are of medians.
//! * put bandwidth, 4 KiB .. 256 MiB (`put_bw`: rank 0's blocks put pieces
//!   of `--piece` bytes (32 KiB: a 4 MiB put fills 128 SMs) into rank 1's symmetric buffer, repeatedly in one launch) vs
//!   two plain copy kernels with the same grid writing the same
//!   destination: `copy_raw` (grid-stride) and `copy_pieces` (the put's
//!   pieces, without the transport). The floor is the faster of the two
//!   (medians). After a warm-up launch of each, `--rounds` rounds run put,
//!   grid-stride copy, piece copy in turn. Rank 1 launches its wait for
//!   the put's signal once rank 0's timed launch has finished
//!   (`--peer-waits after`, the default: the puts, their `quiet` and the
//!   signal are timed with the GPU to themselves, as the floors are);
//!   `--peer-waits during` launches it first, and on one GPU the waiter
//!   then shares the GPU with the put it waits for. Each timed launch
//!   repeats its put or copy until 1 GiB has moved (`-n` sets the count)
//!   and, on a GPU, queues behind a 200 µs `hold_stream` kernel: the
//!   events time the GPU's work, not the host's submission.
//!
//! ```text
//! cargo run --release --example p2p_bench -- --help
//! cargo run --release --example p2p_bench -- [--device gpu|cpu] [-b MINBYTES] [-e MAXBYTES] [-f STEPFACTOR]
//!     [-n ITERS] [-w WARMUP_ITERS] [--rtt-iters N] [--rounds N] [--spread] [--out DIR]
//! ```
//! Flags follow nccl-tests (`-b/--minbytes`, `-e/--maxbytes`, `-f/--stepfactor`,
//! `-n/--iters`, `-w/--warmup_iters`). Two ranks are threads of this process:
//! on one GPU both ranks share it (puts are device-local copies); with
//! `--spread` and two GPUs, rank r runs on GPU r and puts cross NVLink (the
//! floors then write into the peer GPU too). For each size rank 1 checks the
//! bytes of the first put before any copy writes there (`#wrong`), and a
//! progress line goes to stderr. Writes `p2p_bench.json`, `p2p_bench.csv`
//! (puts), `p2p_bench_rtt.csv` (round trips), `p2p_bench.png` and
//! `p2p_bench.svg` to `--out` (default `.`). On the CPU emulator the
//! timings say nothing about a GPU; the run then only checks that
//! everything works.

use std::time::Duration;

use clap::Parser;
use doorbell::comm::{CommOptions, Communicator};
use doorbell::{Function, LaunchConfig, Stream};
use doorbell_example_kernels::comm::{
    copy_pieces, copy_raw, flag_pingpong_pair, hold_stream, put_bw_p2p as put_bw, signal_pingpong_p2p as signal_pingpong,
    signal_pingpong_unchecked, PINGPONG_OK,
};
use doorbell_examples::cli::P2pBenchArgs;
use doorbell_examples::plot::{write_chart, Chart, Series};
use doorbell_examples::{main_with, ratio, BoxError};

fn main() {
    let args = P2pBenchArgs::parse();
    main_with(|| run(&args));
}

/// Transport calls per signal round trip (`signal` and `wait_until` on
/// each rank): the divisor of the per-call check cost.
const CALLS_PER_ROUND_TRIP: u32 = 4;

/// Median and minimum of one measurement's rounds.
#[derive(Clone, Debug, Default, serde::Serialize)]
struct Stat {
    median_us: f64,
    min_us: f64,
    /// Every round, in the order run.
    rounds_us: Vec<f64>,
}

impl Stat {
    fn of(rounds_us: Vec<f64>) -> Stat {
        let mut v = rounds_us.clone();
        v.sort_by(f64::total_cmp);
        let median_us = match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Stat {
            median_us,
            min_us: v.first().copied().unwrap_or(f64::NAN),
            rounds_us,
        }
    }
}

/// The three signal round trips, us per round trip (rank 0's clock).
#[derive(Clone, Debug, Default, serde::Serialize)]
struct Rtt {
    floor: Stat,
    unchecked: Stat,
    checked: Stat,
}

impl Rtt {
    /// `(checked - unchecked) / CALLS_PER_ROUND_TRIP`, ns, from medians.
    fn check_ns_per_call(&self) -> f64 {
        (self.checked.median_us - self.unchecked.median_us) * 1e3 / CALLS_PER_ROUND_TRIP as f64
    }
}

/// One put size, as measured on rank 0 (`wrong`: bytes rank 1 received wrong).
#[derive(Clone, Debug)]
struct Row {
    bytes: u64,
    iters: u32,
    blocks: u64,
    put: Stat,
    copy: Stat,
    pieces: Stat,
    wrong: u64,
}

impl Row {
    /// The copy floor: the faster of the two copies (medians), and which.
    fn floor(&self) -> (f64, &'static str) {
        if self.pieces.median_us < self.copy.median_us {
            (self.pieces.median_us, "pieces")
        } else {
            (self.copy.median_us, "grid-stride")
        }
    }
}

/// The byte at `i` of the data put for `size`: differs from one size to the
/// next, so stale data from an earlier size counts as wrong.
fn pattern_byte(i: u64, size: u64) -> u8 {
    (i.wrapping_mul(131) ^ size.trailing_zeros() as u64 ^ (i >> 8)) as u8
}

/// How long a GPU stream is held before each timed put or copy launch
/// ([`hold_stream`]): far longer than the host takes to submit the two
/// events and the launch.
const HOLD_NS: u64 = 200_000;

/// µs per iteration of the launch that `launch` enqueues on `s`, timed with
/// events around it. With `hold` (on a GPU), the stream is first held for
/// [`HOLD_NS`], so the first event fires right before the launch starts
/// instead of while the host is still submitting it.
fn timed(
    s: &Stream,
    hold: Option<&Function<hold_stream>>,
    iters: u32,
    launch: impl FnOnce() -> doorbell::Result<()>,
) -> doorbell::Result<f64> {
    if let Some(h) = hold {
        // SAFETY: one scalar argument; the kernel touches no memory.
        unsafe { s.launch(h, LaunchConfig::linear(1, 32), (HOLD_NS,))? };
    }
    let t0 = s.record()?;
    launch()?;
    let t1 = s.record()?;
    s.synchronize()?;
    Ok(t0.elapsed_ms(&t1)? as f64 * 1e3 / iters as f64)
}

fn run(args: &P2pBenchArgs) -> Result<(), BoxError> {
    let backend = args.device.backend()?;
    let gpu = args.device.wants_gpu()?;
    let plan = args.plan(gpu).unwrap_or_else(|e| {
        use clap::CommandFactory;
        P2pBenchArgs::command().error(clap::error::ErrorKind::ArgumentConflict, e).exit()
    });
    let env_opts = CommOptions::from_env()?;
    let opts = CommOptions {
        heap_bytes: plan.heap_bytes,
        wait_timeout: Duration::from_secs(30),
        spread_gpus: args.spread || env_opts.spread_gpus,
    };
    if !gpu {
        eprintln!("# note: the backend is the CPU emulator: emulator timings say nothing about a GPU");
    }

    let results = Communicator::local(2, backend, opts, |comm| {
        let dev = comm.device();
        let s = dev.new_stream()?;
        let rtt = measure_rtt(comm, &s, plan.rtt_iters, plan.rounds)?;
        let rows = measure_puts(comm, &s, args, &plan)?;
        let scope = if comm.p2p()?.same_gpu != 0 { "gpu" } else { "sys" };
        Ok((
            rtt,
            rows,
            dev.name(),
            format!("{:?}, signals at .{scope} scope", comm.describe_peers()[1]),
        ))
    })?;
    let (rtt, rows, name, route) = results.into_iter().next().expect("rank 0");

    report(args, &plan, &rtt, &rows, &name, &route, gpu)?;
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    if wrong > 0 {
        return Err(format!("{wrong} bytes arrived wrong (see the #wrong column)").into());
    }
    Ok(())
}

/// The signal round trip's three variants, on the same word of one
/// symmetric allocation: a warm-up round, then `rounds` rounds of floor,
/// checked, unchecked. Rank 0 returns the times; rank 1 zeros.
fn measure_rtt(comm: &Communicator, s: &Stream, iters: u32, rounds: u32) -> doorbell::Result<Rtt> {
    #[derive(Clone, Copy, Debug)]
    enum Variant {
        Floor,
        Checked,
        Unchecked,
    }
    let m = comm.load_module(&doorbell_examples::USER_KERNELS)?;
    let checked = m.function::<signal_pingpong>()?;
    let unchecked = m.function::<signal_pingpong_unchecked>()?;
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
    let mut once = |v: Variant| -> doorbell::Result<f64> {
        comm.barrier()?;
        // SAFETY: `word` is symmetric (`theirs` its copy on the peer as
        // this GPU sees it), `out_ns` and `status` one word each; both
        // ranks launch the same variant with the same epoch.
        unsafe {
            match v {
                Variant::Floor => s.launch(
                    &floor,
                    one,
                    (word.as_mut_ptr(), theirs, me as u32, sys_scope, epoch, iters, out_ns.as_mut_ptr()),
                )?,
                Variant::Checked => s.launch(
                    &checked,
                    one,
                    (handle, word.as_mut_ptr(), epoch, iters, out_ns.as_mut_ptr(), status.as_mut_ptr()),
                )?,
                Variant::Unchecked => s.launch(
                    &unchecked,
                    one,
                    (handle, word.as_mut_ptr(), epoch, iters, out_ns.as_mut_ptr(), status.as_mut_ptr()),
                )?,
            }
        };
        comm.synchronize(s)?;
        if !matches!(v, Variant::Floor) && status.to_host()?[0] != PINGPONG_OK {
            return Err(doorbell::Error::Comm(format!("the {v:?} signal ping-pong did not complete")));
        }
        // The handshake round trip, then the timed ones.
        epoch += iters as u64 + 1;
        Ok(if me == 0 {
            out_ns.to_host()?[0] as f64 / iters as f64 / 1e3
        } else {
            0.0
        })
    };
    let order = [Variant::Floor, Variant::Checked, Variant::Unchecked];
    // Warm-up: clocks up, code and words cached.
    for v in order {
        once(v)?;
    }
    let (mut f, mut c, mut u) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        f.push(once(Variant::Floor)?);
        c.push(once(Variant::Checked)?);
        u.push(once(Variant::Unchecked)?);
    }
    if me == 0 {
        eprintln!("# signal round trip, us (rounds in order): floor {f:.3?}, checked {c:.3?}, unchecked {u:.3?}");
    }
    Ok(Rtt {
        floor: Stat::of(f),
        unchecked: Stat::of(u),
        checked: Stat::of(c),
    })
}

/// Put bandwidth per size against the two copy floors, interleaved. Rank 0
/// returns the rows (rank 1 the same sizes, times zero, and `wrong`).
fn measure_puts(
    comm: &Communicator,
    s: &Stream,
    args: &P2pBenchArgs,
    plan: &doorbell_examples::cli::P2pBenchPlan,
) -> doorbell::Result<Vec<Row>> {
    let dev = comm.device();
    let m = comm.load_module(&doorbell_examples::USER_KERNELS)?;
    let copy = m.function::<copy_raw>()?;
    let pieces = m.function::<copy_pieces>()?;
    let put = m.function::<put_bw>()?;
    let hold = if dev.is_gpu() { Some(m.function::<hold_stream>()?) } else { None };
    let (sm_blocks, threads) = if dev.is_gpu() {
        (dev.multiprocessor_count() as u64, 512u32)
    } else {
        (2, 32)
    };
    let max_size = plan.max_bytes;
    let mut src = dev.alloc_zeroed::<u8>(max_size as usize)?;
    let dst = comm.alloc::<u8>(max_size as usize)?;
    // The floors write exactly where the put writes: rank 1's `dst`, as
    // rank 0's GPU sees it (the same GPU, or the peer across NVLink).
    let target = comm.peer_address(dst.as_ptr(), 1)?;
    let psig = comm.alloc::<u64>(1)?;
    let mut status = dev.alloc_zeroed::<u32>(1)?;
    let mut expect = 0u64;
    let rank0 = comm.rank() == 0;
    let waits_during = args.peer_waits == "during";
    let mut rows = Vec::new();
    for &bytes in &plan.sizes {
        let blocks = bytes.div_ceil(plan.piece).clamp(1, sm_blocks);
        let iters = plan.iters_for(bytes);
        let cfg = LaunchConfig::linear(blocks as u32, threads);
        // Fresh data for this size; rank 1 checks what the first put brought (#wrong).
        if rank0 {
            src.copy_from_host(&doorbell_examples::host_vec(max_size, |i| pattern_byte(i, bytes)).map_err(doorbell::Error::Comm)?)?;
        }
        let mut wrong = None;
        // One put launch on both ranks (rank 0 puts, rank 1 waits for the
        // blocks' signals), timed on rank 0; the first of a size is checked.
        // With `--peer-waits during` rank 1 launches before the barrier and
        // rank 0 after it, so rank 0's launch never waits for rank 1's at
        // the driver (as the floors' launches do not): that wait would land
        // between rank 0's events. With `after` rank 1 launches once rank
        // 0's timed launch has finished.
        let mut put_once = |n: u32| -> doorbell::Result<f64> {
            expect += blocks;
            // SAFETY: buffers hold max_size >= bytes; `psig` symmetric, `status` one word.
            let mut launch = || unsafe {
                s.launch(
                    &put,
                    cfg,
                    (
                        comm.p2p()?,
                        dst.as_mut_ptr(),
                        src.as_ptr(),
                        bytes,
                        plan.piece,
                        n,
                        (args.put_by == "warp") as u32,
                        psig.as_mut_ptr(),
                        expect,
                        status.as_mut_ptr(),
                    ),
                )
            };
            let us = if rank0 {
                comm.barrier()?;
                let us = timed(s, hold.as_ref(), n, launch)?;
                if !waits_during {
                    comm.barrier()?;
                }
                us
            } else if waits_during {
                launch()?;
                comm.barrier()?;
                0.0
            } else {
                // Rank 0's put has finished, signal included: the wait
                // only confirms it.
                comm.barrier()?;
                comm.barrier()?;
                launch()?;
                0.0
            };
            comm.synchronize(s)?;
            if status.to_host()?[0] != PINGPONG_OK {
                return Err(doorbell::Error::Comm(format!("put of {bytes} bytes did not complete")));
            }
            if wrong.is_none() {
                let w = if comm.rank() == 1 {
                    let got = dst.to_host()?;
                    (0..bytes).filter(|&i| got[i as usize] != pattern_byte(i, bytes)).count() as u64
                } else {
                    0
                };
                let b = comm.world().broadcast_bytes(1, &w.to_le_bytes())?;
                let w = b
                    .get(..8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .ok_or_else(|| doorbell::Error::Comm("rank 1's count of wrong bytes did not arrive".into()))?;
                wrong = Some(u64::from_le_bytes(w));
            }
            Ok(us)
        };
        // A copy floor on rank 0. Rank 1 only keeps step: it waits at a
        // second barrier until the floor is timed, so its next put waiter
        // is not launched inside the floor's timed window.
        let floor_once = |pieces_floor: bool, n: u32| -> doorbell::Result<f64> {
            comm.barrier()?;
            let us = if rank0 {
                // SAFETY: `target` and `src` hold max_size >= bytes, 16-byte aligned.
                timed(s, hold.as_ref(), n, || unsafe {
                    if pieces_floor {
                        s.launch(&pieces, cfg, (target, src.as_ptr(), bytes, plan.piece, n))
                    } else {
                        s.launch(&copy, cfg, (target, src.as_ptr(), bytes, n))
                    }
                })?
            } else {
                0.0
            };
            comm.barrier()?;
            Ok(us)
        };
        if args.warmup_iters > 0 {
            let w = args.warmup_iters as u32;
            put_once(w)?;
            floor_once(false, w)?;
            floor_once(true, w)?;
        }
        let (mut p, mut c, mut q) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..plan.rounds {
            p.push(put_once(iters)?);
            c.push(floor_once(false, iters)?);
            q.push(floor_once(true, iters)?);
        }
        let row = Row {
            bytes,
            iters,
            blocks,
            put: Stat::of(p),
            copy: Stat::of(c),
            pieces: Stat::of(q),
            wrong: wrong.unwrap_or(0),
        };
        if rank0 {
            eprintln!(
                "# {bytes:>12} bytes x {iters:>5}, {blocks:>3} blocks: put {:>10.2} us, copy {:>10.2} us, piece copy {:>10.2} us (medians), {} wrong",
                row.put.median_us, row.copy.median_us, row.pieces.median_us, row.wrong
            );
        }
        rows.push(row);
    }
    comm.barrier()?;
    Ok(rows)
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
    put: Vec<JsonRow>,
}

/// One row of the table, in nccl-tests' columns plus the floors.
#[derive(serde::Serialize)]
struct JsonRow {
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
    wrong: u64,
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("n/a".to_string(), |v| format!("{v:.prec$}"))
}

fn report(
    args: &P2pBenchArgs,
    plan: &doorbell_examples::cli::P2pBenchPlan,
    rtt: &Rtt,
    rows: &[Row],
    name: &str,
    route: &str,
    gpu: bool,
) -> Result<(), BoxError> {
    let (out_dir, put_by, peer_waits) = (args.out.as_path(), args.put_by.as_str(), args.peer_waits.as_str());
    let who = if put_by == "warp" {
        "each put by one warp, pieces dealt round-robin to every warp of the grid (as many blocks as for block puts)"
    } else {
        "one block per piece"
    };
    let shown = if put_by == "warp" {
        format!("{} bytes per block split over its warps", plan.piece)
    } else {
        format!("{} bytes", plan.piece)
    };
    println!("# doorbell P2P benchmark: 2 ranks on {name}, route {route}; puts of {shown}, {who}; rank 1 waits {peer_waits} the timed put launch");
    if !gpu {
        println!("# note: the backend is the CPU emulator: emulator timings say nothing about a GPU");
    }
    let rtt_ratio = ratio(rtt.checked.median_us, rtt.floor.median_us);
    let unchecked_ratio = ratio(rtt.unchecked.median_us, rtt.floor.median_us);
    let check_ns = rtt.check_ns_per_call();
    println!(
        "# signal round trip, us, {} rounds x {} round trips, same word (median / min / vs floor):",
        plan.rounds, plan.rtt_iters
    );
    let mut rtt_csv = String::from("variant,calls_per_round_trip,rounds,iters,median_us,min_us,ratio_to_floor,check_ns_per_call\n");
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
        rtt_csv += &format!(
            "{key},{calls},{},{},{:.4},{:.4},{r},{check}\n",
            plan.rounds, plan.rtt_iters, st.median_us, st.min_us
        );
    }
    println!(
        "# argument checks: (checked - unchecked) / {CALLS_PER_ROUND_TRIP} calls = {check_ns:.1} ns per call; signal round trip / floor = {}",
        fmt_opt(rtt_ratio, 2)
    );
    println!(
        "{:>12} {:>12} {:>6} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8} {:>6} {:>12} {:>12} {:>12}",
        "size(B)",
        "count",
        "type",
        "time(us)",
        "algbw(GB/s)",
        "floor(us)",
        "floor(GB/s)",
        "ratio",
        "#wrong",
        "blocks",
        "min(us)",
        "copy(us)",
        "pieces(us)"
    );
    let mut csv = String::from(
        "bytes,count,type,iters,blocks,put_us,put_min_us,put_gbps,floor_us,floor_kind,floor_gbps,ratio,copy_us,piece_copy_us,wrong\n",
    );
    let mut json_rows = Vec::new();
    for r in rows {
        let (floor_us, floor_kind) = r.floor();
        let bw = ratio(r.bytes as f64, r.put.median_us * 1e-6).map(|b| b / 1e9);
        let fbw = ratio(r.bytes as f64, floor_us * 1e-6).map(|b| b / 1e9);
        let rr = bw.zip(fbw).and_then(|(a, b)| ratio(a, b));
        println!(
            "{:>12} {:>12} {:>6} {:>12.2} {:>12} {:>12.2} {:>12} {:>8} {:>8} {:>6} {:>12.2} {:>12.2} {:>12.2}",
            r.bytes,
            r.bytes,
            "uint8",
            r.put.median_us,
            fmt_opt(bw, 1),
            floor_us,
            fmt_opt(fbw, 1),
            fmt_opt(rr, 2),
            r.wrong,
            r.blocks,
            r.put.min_us,
            r.copy.median_us,
            r.pieces.median_us
        );
        let c = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
        csv += &format!(
            "{},{},uint8,{},{},{:.3},{:.3},{},{:.3},{floor_kind},{},{},{:.3},{:.3},{}\n",
            r.bytes,
            r.bytes,
            r.iters,
            r.blocks,
            r.put.median_us,
            r.put.min_us,
            c(bw),
            floor_us,
            c(fbw),
            c(rr),
            r.copy.median_us,
            r.pieces.median_us,
            r.wrong
        );
        json_rows.push(JsonRow {
            bytes: r.bytes,
            count: r.bytes,
            r#type: "uint8",
            iters: r.iters,
            blocks: r.blocks,
            put_us: r.put.median_us,
            put_min_us: r.put.min_us,
            put_gbps: bw,
            floor_us,
            floor_kind,
            floor_gbps: fbw,
            ratio: rr,
            copy: r.copy.clone(),
            piece_copy: r.pieces.clone(),
            put: r.put.clone(),
            wrong: r.wrong,
        });
    }
    let json = serde_json::to_string_pretty(&Report {
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
        rtt_ratio,
        unchecked_rtt_ratio: unchecked_ratio,
        check_ns_per_call: check_ns,
        calls_per_round_trip: CALLS_PER_ROUND_TRIP,
        rtt,
        put: json_rows,
    })?;
    std::fs::create_dir_all(out_dir)?;
    std::fs::write(out_dir.join("p2p_bench.json"), json + "\n")?;
    std::fs::write(out_dir.join("p2p_bench.csv"), csv)?;
    std::fs::write(out_dir.join("p2p_bench_rtt.csv"), rtt_csv)?;
    let gbps = |us: f64, bytes: u64| ratio(bytes as f64, us * 1e3).unwrap_or(f64::NAN);
    let title = format!("doorbell P2P put vs copy floor ({name})");
    write_chart(
        &Chart {
            title: &title,
            x_label: "bytes",
            y_label: "GB/s",
            series: &[
                Series {
                    name: "put_block (P2P transport), median",
                    points: rows.iter().map(|r| (r.bytes as f64, gbps(r.put.median_us, r.bytes))).collect(),
                },
                Series {
                    name: "copy kernel (floor: faster of grid-stride and pieces), median",
                    points: rows.iter().map(|r| (r.bytes as f64, gbps(r.floor().0, r.bytes))).collect(),
                },
            ],
        },
        &out_dir.join("p2p_bench.png"),
        &out_dir.join("p2p_bench.svg"),
    )?;
    println!("# wrote {}/p2p_bench.{{json,csv,png,svg}} and p2p_bench_rtt.csv", out_dir.display());
    Ok(())
}
