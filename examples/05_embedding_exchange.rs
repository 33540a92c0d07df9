//! Embedding exchange: row-wise sharded embedding tables, multi-hot bags
//! with sum pooling, the lookup fused with its all-to-all (forward) and the
//! gradients routed back and applied with SGD (backward), one kernel per
//! rank and direction, no CPU in the loop. Every result is checked against
//! a sequential CPU reference; a mismatch exits non-zero.
//!
//! ```text
//! cargo run --release --example embedding_exchange -- --help
//! cargo run --release --example embedding_exchange -- [--ranks N] [--tables T] [--rows R] [--dim D]
//!     [--batch B] [--pooling P] [--zipf S] [--seed X] [--train-steps K] [--lr L] [--device gpu|cpu|auto]
//!     [--ids PATH] [--dump PATH] [--dump-tables PATH] [--transport p2p|ibgda|routed]
//!     [--bench [--quick] [--breakdown] [--iters N] [--out DIR]]
//! ```
//! Definitions (so any reference agrees): table `t`, global row `j`,
//! element `k` starts as `((t*7 + j*13 + k*3) mod 23) - 11`; row `j` lives
//! on rank `j mod N`; `--ids` is little-endian u32 `[rank][table][sample][pooling]`
//! (`0xFFFFFFFF`: padding); the output is `out[rank][sample][table][k]`,
//! the sum over the bag's ids; the upstream gradient is
//! `((rank*5 + sample*3 + table*7 + k) mod 9) - 4`; SGD `row -= lr * sum`.
//! `--dump` writes the first step's output (f32 LE, `[rank][sample][table][dim]`),
//! `--dump-tables` the tables after the last step (f32 LE, `[table][row][dim]`).
//!
//! `--bench` measures, in one run, the fused exchange (push with dedup, and
//! the direct-load pull forward), a CPU-driven baseline (counts exchanged on
//! the host, one driver copy per peer per table) and NCCL (gather kernel →
//! grouped ncclSend/ncclRecv → pooling kernel), forward and backward, over
//! a DLRM-like sweep; writes `embedding_exchange.{json,png,svg}` to `--out`.
//! With two ranks or more it also times the put floor (`put-floor`): the
//! fused forward's remote row bytes moved by plain puts from every rank to
//! every peer at once, nothing else; each shape's line `put floor ...`
//! gives the fused and pull forwards' row bandwidth as a share of it.
//! `--quick` runs the three smaller shapes only; `--breakdown` adds the
//! fused kernels' per-phase times (`%globaltimer` at the end of each phase,
//! block 0's clock, mean over the timed iterations, the slowest rank at
//! each phase end).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use doorbell::comm::{CommOptions, Communicator};
use doorbell::{DeviceBuffer, Stream};
use doorbell_example_kernels::embedding as emb_k;
use doorbell_examples::cli::{ranged, DeviceArgs};
use doorbell_examples::embedding::{self as emb, Baseline, Exchange, Mover, Problem, Traffic};
use doorbell_examples::plot::{write_chart, Chart, Series};
use doorbell_examples::{main_with, BoxError};

/// Device transports.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum TransportArg {
    /// Stores into peers' memory (same GPU, NVLink/PCIe peers; the emulator).
    P2p,
    /// GPU-built RDMA WQEs through the soft NIC (push forward and backward; emulator and GPU).
    Ibgda,
    /// Load/store or the soft NIC per pair of ranks (DOORBELL_RDMA_PEERS; checked on the emulator).
    Routed,
}

impl TransportArg {
    fn kind(self) -> emb::TransportKind {
        match self {
            TransportArg::P2p => emb::TransportKind::P2p,
            TransportArg::Ibgda => emb::TransportKind::Ibgda,
            TransportArg::Routed => emb::TransportKind::Routed,
        }
    }
}

/// Sharded embedding lookup fused with its all-to-all, forward and backward,
/// checked against a CPU reference.
#[derive(Parser, Debug, Clone)]
#[command(name = "embedding_exchange", version, about, long_about = None)]
struct Args {
    #[command(flatten)]
    device: DeviceArgs,
    /// Ranks (threads of this process; one per GPU with DOORBELL_SPREAD_GPUS=1)
    #[arg(long, value_name = "N", default_value = "4", value_parser = ranged(1, 64))]
    ranks: u64,
    /// Tables [default: 4; --bench: 26]
    #[arg(long, value_name = "T", value_parser = ranged(1, 256))]
    tables: Option<u64>,
    /// Rows of every table [default: 1000; --bench: 100000]
    #[arg(long, value_name = "R", value_parser = ranged(1, u32::MAX as u64 - 1))]
    rows: Option<u64>,
    /// Elements per row [default: 64; --bench: 128]
    #[arg(long, value_name = "D", value_parser = ranged(1, 4096))]
    dim: Option<u64>,
    /// Samples per rank
    #[arg(long, value_name = "B", default_value = "64", value_parser = ranged(1, 1 << 20))]
    batch: u64,
    /// Ids per bag
    #[arg(long, value_name = "P", default_value = "8", value_parser = ranged(1, 1024))]
    pooling: u64,
    /// Zipf exponent of the ids (0: uniform)
    #[arg(long, value_name = "S", default_value = "0")]
    zipf: f64,
    /// Seed of the ids
    #[arg(long, value_name = "X", default_value = "1", value_parser = ranged(0, u64::MAX))]
    seed: u64,
    /// The device transport (ibgda, routed: through the soft NIC; not with --bench)
    #[arg(long, value_enum, default_value_t = TransportArg::P2p)]
    transport: TransportArg,
    /// Training steps (forward, backward, SGD), same ids every step
    #[arg(long = "train-steps", value_name = "K", default_value = "1", value_parser = ranged(1, 1_000_000))]
    train_steps: u64,
    /// SGD learning rate
    #[arg(long, value_name = "L", default_value = "0.01")]
    lr: f32,
    /// Read the lookups from a file (u32 LE, [rank][table][sample][pooling])
    #[arg(long, value_name = "PATH")]
    ids: Option<PathBuf>,
    /// Write the first step's output (f32 LE, [rank][sample][table][dim])
    #[arg(long, value_name = "PATH")]
    dump: Option<PathBuf>,
    /// Write the tables after the last step (f32 LE, [table][row][dim])
    #[arg(long = "dump-tables", value_name = "PATH")]
    dump_tables: Option<PathBuf>,
    /// Benchmark: fused vs CPU-driven copies vs NCCL over a DLRM-like sweep
    #[arg(long)]
    bench: bool,
    /// Timed iterations per configuration and method (--bench) [default: 20 on a GPU (10 with --quick), 2 on the emulator]
    #[arg(long, value_name = "N", value_parser = ranged(1, 100_000))]
    iters: Option<u64>,
    /// --bench: the three smaller shapes only (batch x pooling 512x1, 512x8, 2048x8), 10 iterations
    #[arg(long)]
    quick: bool,
    /// --bench: also time the fused kernels' phases (%globaltimer stamps of block 0; see `breakdown` lines and the JSON)
    #[arg(long)]
    breakdown: bool,
    /// Where the benchmark's JSON and plots go
    #[arg(long, value_name = "DIR", default_value = ".")]
    out: PathBuf,
}

fn main() {
    let args = Args::parse();
    if args.transport != TransportArg::P2p && args.bench {
        eprintln!(
            "error: --bench runs the pull forward, which loads rows through peer pointers (IBGDA has none), and the P2P baselines; \
             use --transport ibgda|routed for the checked run (push forward and backward)"
        );
        std::process::exit(2);
    }
    if !(args.zipf >= 0.0 && args.zipf.is_finite()) || !args.lr.is_finite() {
        eprintln!("error: --zipf must be >= 0 and --lr finite");
        std::process::exit(2);
    }
    main_with(|| if args.bench { bench(&args) } else { run(&args) });
}

fn problem(args: &Args, bench: bool) -> Problem {
    Problem {
        ranks: args.ranks as u32,
        tables: args.tables.unwrap_or(if bench { 26 } else { 4 }) as u32,
        rows: args.rows.unwrap_or(if bench { 100_000 } else { 1000 }) as u32,
        dim: args.dim.unwrap_or(if bench { 128 } else { 64 }) as u32,
        batch: args.batch as u32,
        pooling: args.pooling as u32,
    }
}

fn read_ids(path: &PathBuf, p: &Problem) -> Result<Vec<Vec<u32>>, BoxError> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let want = p.ranks as usize * p.lookups() * 4;
    if bytes.len() != want {
        return Err(format!(
            "{}: {} bytes, expected ranks*tables*batch*pooling*4 = {want} (u32 LE [rank][table][sample][pooling])",
            path.display(),
            bytes.len()
        )
        .into());
    }
    let all: Vec<u32> = bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Ok(all.chunks(p.lookups()).map(|c| c.to_vec()).collect())
}

fn write_f32(path: &PathBuf, v: impl Iterator<Item = f32>) -> Result<(), BoxError> {
    let bytes: Vec<u8> = v.flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()).into())
}

fn comm_options(heap: u64) -> Result<CommOptions, BoxError> {
    Ok(CommOptions {
        heap_bytes: heap.next_multiple_of(1 << 20),
        wait_timeout: Duration::from_secs(30),
        ..CommOptions::from_env()?
    })
}

fn ranks_per_gpu(p: &Problem, opts: &CommOptions) -> u32 {
    if opts.spread_gpus {
        p.ranks.div_ceil(doorbell::gpu_count().max(1) as u32)
    } else {
        p.ranks
    }
}

/// Largest difference between `got` and `want`, and whether it is within
/// `1e-5 * (1 + |want|)` everywhere (a lost or misrouted row or gradient
/// changes some element by at least `lr`, far more).
fn compare(got: &[f32], want: &[f32]) -> (f32, bool) {
    let mut worst = 0f32;
    let mut ok = got.len() == want.len();
    for (g, w) in got.iter().zip(want) {
        let d = (g - w).abs();
        worst = worst.max(if d.is_nan() { f32::INFINITY } else { d });
        if !(d <= 1e-5 * (1.0 + w.abs())) {
            ok = false;
        }
    }
    (worst, ok)
}

fn print_traffic(p: &Problem, tr: &Traffic) {
    let (plain, dedup) = tr.row_bytes(p.dim);
    let saved = plain.saturating_sub(dedup);
    println!(
        "traffic per step and direction: {} lookups, {} unique (rank, table, id) -> rows moved {:.3} MB instead of {:.3} MB \
         ({:.1}% saved by dedup; {} of the unique rows are local)",
        tr.lookups,
        tr.unique,
        dedup as f64 / 1e6,
        plain as f64 / 1e6,
        if plain > 0 { saved as f64 * 100.0 / plain as f64 } else { 0.0 },
        tr.unique_local
    );
}

fn run(args: &Args) -> Result<(), BoxError> {
    let p = problem(args, false);
    p.check()?;
    let backend = args.device.backend()?;
    let ids = match &args.ids {
        Some(path) => read_ids(path, &p)?,
        None => emb::generate_ids(&p, args.zipf, args.seed),
    };
    // Host validation: nothing runs, nothing is written.
    emb::validate_ids(&p, &ids)?;
    let tr = emb::traffic(&p, &ids);
    let cap = tr.max_pair.max(1) as u32;
    let opts = comm_options(emb::heap_bytes_needed(&p, cap))?;
    let rpg = ranks_per_gpu(&p, &opts);
    println!(
        "embedding exchange: {} ranks, {} tables x {} rows x dim {}, batch {} per rank, pooling {}, zipf {}, {} training step(s), lr {}",
        p.ranks, p.tables, p.rows, p.dim, p.batch, p.pooling, args.zipf, args.train_steps, args.lr
    );
    print_traffic(&p, &tr);
    let steps = args.train_steps as usize;
    let lr = args.lr;
    let init = emb::initial_tables(&p);
    let results = Communicator::local(p.ranks as usize, backend, opts, |comm| {
        let r = comm.rank() as u32;
        let dev = comm.device();
        let mut x = Exchange::with_transport(
            comm,
            &p,
            cap,
            emb::launch_config_for(comm, rpg, args.transport.kind() != emb::TransportKind::P2p),
            args.transport.kind(),
        )?;
        if r == 0 {
            // The grid fitted to the kernels' registers: every block must be
            // resident at once (grid barriers).
            match x.residency {
                Some((regs, per_sm)) => println!(
                    "grid: {} blocks x {} threads per rank ({regs} registers per thread: {per_sm} blocks per SM)",
                    x.cfg.grid.0, x.cfg.block.0
                ),
                None => println!("grid: {} blocks x {} threads per rank", x.cfg.grid.0, x.cfg.block.0),
            }
        }
        x.load_shard(&emb::shard_of(&p, &init, r))?;
        let ids_d = dev.alloc_from(&ids[r as usize])?;
        let grad = dev.alloc_from(&emb::upstream_grad(&p, r))?;
        let mut out = dev.alloc_zeroed::<f32>(p.out_len())?;
        let s = dev.new_stream()?;
        comm.barrier()?;
        let outs = match x.train(&s, &ids_d, &grad, &mut out, lr, steps) {
            Ok(outs) => outs,
            Err(e) => {
                // Through the soft NIC: what its engine did and where each
                // send queue stands, while the state is still there.
                if let Some(p) = comm.ibgda_progress() {
                    eprintln!("rank {r}: {p}");
                }
                if let Ok(Some(queues)) = comm.ibgda_queues() {
                    for q in queues {
                        eprintln!("{q}");
                    }
                }
                return Err(e);
            }
        };
        Ok((dev.name(), dev.is_gpu(), outs, x.shard()?))
    })?;
    println!(
        "device: {} ({}), transport {}",
        results[0].0,
        if results[0].1 { "GPU" } else { "CPU emulator" },
        args.transport.kind().name()
    );

    // The reference, step by step.
    let mut tables = init;
    let mut all_ok = true;
    for step in 0..steps {
        let mut worst = 0f32;
        let mut ok = true;
        for (r, res) in results.iter().enumerate() {
            let want = emb::reference_forward(&p, &tables, &ids[r]);
            let (w, o) = compare(&res.2[step], &want);
            worst = worst.max(w);
            ok &= o;
        }
        if step == 0 || step + 1 == steps || !ok {
            println!(
                "checked: step {} forward, {} outputs per rank against the CPU reference: {} (max |diff| {worst:e})",
                step + 1,
                p.out_len(),
                if ok { "equal" } else { "DIFFERENT" }
            );
        }
        all_ok &= ok;
        emb::reference_backward(&p, &mut tables, &ids, lr);
    }
    let mut got = vec![0f32; tables.len()];
    for (r, res) in results.iter().enumerate() {
        emb::unshard(&p, &mut got, &res.3, r as u32);
    }
    let (worst, ok) = compare(&got, &tables);
    println!(
        "checked: tables after {steps} step(s) of backward + SGD ({} values) against the CPU reference: {} (max |diff| {worst:e})",
        tables.len(),
        if ok { "equal" } else { "DIFFERENT" }
    );
    all_ok &= ok;
    if let Some(path) = &args.dump {
        write_f32(path, results.iter().flat_map(|r| r.2[0].iter().copied()))?;
        println!("wrote the first step's output to {}", path.display());
    }
    if let Some(path) = &args.dump_tables {
        write_f32(path, got.iter().copied())?;
        println!("wrote the tables to {}", path.display());
    }
    if !all_ok {
        return Err("the exchange differs from the CPU reference".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Benchmark
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, serde::Serialize)]
struct Row {
    batch: u32,
    pooling: u32,
    zipf: f64,
    method: String,
    direction: String,
    /// Non-padding lookups over all ranks per step.
    lookups: u64,
    /// Bytes moved between ranks per step (rows, keys), over all ranks.
    bytes: u64,
    /// Mean time per step, µs (slowest rank).
    time_us: f64,
    lookups_per_s: f64,
    gb_per_s: f64,
    /// Forward output checked against the reference (fused) or the fused output (baselines).
    checked: bool,
    /// `--breakdown`: the fused kernels' phases, µs each (see [`Phases`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    phases_us: Option<Vec<(String, f64)>>,
}

/// Per-phase times of the fused kernels from their `%globaltimer` stamps
/// (ns since the launch's start, block 0): summed over the timed
/// iterations of one rank (the first call, `time_loop`'s warm-up, is left out).
struct Phases {
    sum: Vec<f64>,
    seen: Vec<u64>,
    warmed: bool,
}

impl Phases {
    fn new(stamps: usize) -> Phases {
        Phases {
            sum: vec![0.0; stamps],
            seen: vec![0; stamps],
            warmed: false,
        }
    }

    fn add(&mut self, stamps: &[Option<u64>]) {
        if !std::mem::replace(&mut self.warmed, true) {
            return;
        }
        for (i, v) in stamps.iter().enumerate() {
            if let Some(ns) = v {
                self.sum[i] += *ns as f64;
                self.seen[i] += 1;
            }
        }
    }

    /// Collective: each phase end (µs since the start, mean over the
    /// iterations), the slowest rank's; a phase never reached counts 0.
    fn slowest(&self, comm: &Communicator) -> doorbell::Result<Vec<f64>> {
        let mine: Vec<u8> = self
            .sum
            .iter()
            .zip(&self.seen)
            .flat_map(|(s, n)| (if *n > 0 { s / *n as f64 / 1e3 } else { 0.0 }).to_le_bytes())
            .collect();
        let all = comm.world().all_gather_bytes(&mine)?;
        let all = doorbell_examples::gathered(&all, self.sum.len(), "the phase times", f64::from_le_bytes)?;
        Ok((0..self.sum.len()).map(|i| all.iter().map(|v| v[i]).fold(0.0, f64::max)).collect())
    }
}

/// Phase ends (µs since the start) as named phase lengths: each phase's
/// end minus the previous one's (the first stamp is the start itself).
fn named(names: &[&str], ends: &[f64]) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = (1..names.len())
        .map(|i| (names[i].to_string(), (ends[i] - ends[i - 1]).max(0.0)))
        .collect();
    v.push(("total".into(), ends.iter().copied().fold(0.0, f64::max)));
    v
}

/// Mean per-iteration seconds of `step` over `iters` iterations after one
/// warm-up, the slowest rank's.
fn time_loop(comm: &Communicator, iters: u64, mut step: impl FnMut() -> doorbell::Result<f64>) -> doorbell::Result<f64> {
    step()?;
    comm.barrier()?;
    let mut total = 0.0;
    for _ in 0..iters {
        total += step()?;
    }
    let mine = total / iters as f64;
    let all = comm.world().all_gather_bytes(&mine.to_le_bytes())?;
    doorbell_examples::slowest(&all, "the time per iteration")
}

fn timed(s: &Stream, f: impl FnOnce() -> doorbell::Result<()>) -> doorbell::Result<f64> {
    let t0 = Instant::now();
    f()?;
    s.synchronize()?;
    Ok(t0.elapsed().as_secs_f64())
}

fn bench(args: &Args) -> Result<(), BoxError> {
    let backend = args.device.backend()?;
    let gpu = args.device.wants_gpu()?;
    let base = problem(args, true);
    let iters = args.iters.unwrap_or(match (gpu, args.quick) {
        (false, _) => 2,
        (true, false) => 20,
        (true, true) => 10,
    });
    let skew = if args.zipf > 0.0 { args.zipf } else { 1.05 };
    let shapes: Vec<(u32, u32)> = if gpu {
        let all = vec![(512, 1), (512, 8), (2048, 8), (2048, 32), (8192, 8), (8192, 32)];
        all.into_iter().take(if args.quick { 3 } else { 6 }).collect()
    } else {
        println!("note: the backend is the CPU emulator: the sweep is tiny and its timings say nothing about a GPU");
        vec![(16, 2), (32, 4)]
    };
    let base = if gpu {
        base
    } else {
        Problem {
            tables: base.tables.min(4),
            rows: base.rows.min(2000),
            dim: base.dim.min(32),
            ..base
        }
    };
    let opts0 = CommOptions::from_env()?;
    let rpg = ranks_per_gpu(&base, &opts0);
    let nccl_note = if !gpu {
        Some("NCCL needs GPUs".to_string())
    } else if rpg > 1 {
        Some("NCCL refuses two ranks on one GPU: run with DOORBELL_SPREAD_GPUS=1 and a GPU per rank".to_string())
    } else {
        doorbell_examples::nccl::available().err()
    };
    if let Some(n) = &nccl_note {
        println!("note: NCCL column skipped: {n}");
    }
    println!(
        "timing: a host loop per method, {iters} iterations after one warm-up, wall clock around each step's launches up to its \
         stream synchronize (the baselines synchronize inside a step anyway); the slowest rank's mean"
    );
    println!(
        "{:>6} {:>4} {:>5} {:<14} {:<4} {:>11} {:>12} {:>10} {:>13} {:>8} {:>5}",
        "batch", "pool", "zipf", "method", "dir", "lookups", "bytes", "time_us", "lookups/s", "GB/s", "ok"
    );
    let mut rows = Vec::new();
    // The tables do not depend on the batch: made once.
    let init = emb::initial_tables(&base);
    // Memory per rank kept under about 12 GiB / ranks-per-GPU.
    let budget: u64 = (12u64 << 30) / rpg as u64;
    for &(batch, pooling) in &shapes {
        for zipf in [0.0, skew] {
            let p = Problem { batch, pooling, ..base };
            p.check()?;
            let ids = emb::generate_ids(&p, zipf, args.seed);
            let tr = emb::traffic(&p, &ids);
            let cap = tr.max_pair.max(1) as u32;
            let max_recv = emb::max_recv(&p, &ids);
            let heap = emb::heap_bytes_needed(&p, cap) + emb::baseline_heap_bytes(&p, max_recv);
            let local = p.lookups() as u64 * (16 + p.dim as u64 * 8) + max_recv * p.dim as u64 * 4;
            if heap + local > budget {
                println!(
                    "{batch:>6} {pooling:>4} {zipf:>5} skipped: needs {:.1} GiB per rank",
                    (heap + local) as f64 / (1u64 << 30) as f64
                );
                continue;
            }
            let opts = comm_options(heap)?;
            let want: Vec<Vec<f32>> = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..p.ranks as usize)
                    .map(|r| {
                        let (init, ids) = (&init, &ids);
                        sc.spawn(move || emb::reference_forward(&p, init, &ids[r]))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("reference thread")).collect()
            });
            // The put floor moves the fused forward's remote rows, spread
            // evenly over the (rank, peer) pairs.
            let pairs = p.ranks as u64 * (p.ranks as u64).saturating_sub(1);
            let floor_pair = if pairs > 0 {
                (tr.unique - tr.unique_local) * p.dim as u64 * 4 / pairs / 16 * 16
            } else {
                0
            };
            let nccl_on = nccl_note.is_none();
            let res = Communicator::local(p.ranks as usize, backend, opts, |comm| {
                let r = comm.rank() as u32;
                let dev = comm.device();
                let cfg = emb::launch_config(comm, rpg);
                let shard = emb::shard_of(&p, &init, r);
                let mut x = Exchange::new(comm, &p, cap, cfg)?;
                x.load_shard(&shard)?;
                let mut bl = Baseline::new(comm, &p, max_recv, cfg)?;
                bl.load_shard(&shard)?;
                let ids_d = dev.alloc_from(&ids[r as usize])?;
                let grad = dev.alloc_from(&emb::upstream_grad(&p, r))?;
                let mut out = dev.alloc_zeroed::<f32>(p.out_len())?;
                let s = dev.new_stream()?;
                let nccl = if nccl_on {
                    Some(doorbell_examples::nccl::Comm::new(comm, &s)?)
                } else {
                    None
                };
                let mut t = Vec::new();
                // Correctness first (tables still at their initial values).
                x.forward(&s, &ids_d, &mut out)?;
                x.finish(&s)?;
                let fused_ok = compare(&out.to_host()?, &want[r as usize]).1;
                let check_bl = |bl: &mut Baseline, out: &mut DeviceBuffer<f32>, m: Mover| -> doorbell::Result<bool> {
                    bl.forward(&s, &ids_d, out, m, nccl.as_ref())?;
                    Ok(compare(&out.to_host()?, &want[r as usize]).1)
                };
                let copies_ok = check_bl(&mut bl, &mut out, Mover::Copies)?;
                let nccl_ok = if nccl.is_some() {
                    check_bl(&mut bl, &mut out, Mover::Nccl)?
                } else {
                    false
                };
                x.forward_pull(&s, &ids_d, &mut out)?;
                x.finish(&s)?;
                let pull_ok = compare(&out.to_host()?, &want[r as usize]).1;
                // Fused push: forward alone, then forward + backward (backward timed alone).
                x.set_stamps(args.breakdown);
                let mut fwd_ph = Phases::new(emb_k::STAMP_FWD.len());
                let fwd = time_loop(comm, iters, || {
                    let t = timed(&s, || x.forward(&s, &ids_d, &mut out))?;
                    if args.breakdown {
                        fwd_ph.add(&x.stamps()?.0);
                    }
                    Ok(t)
                })?;
                t.push(("fused", "fwd", fused_ok, fwd));
                let mut bwd_ph = Phases::new(emb_k::STAMP_BWD.len());
                let bwd = time_loop(comm, iters, || {
                    x.forward(&s, &ids_d, &mut out)?;
                    x.finish(&s)?;
                    let t = timed(&s, || x.backward(&s, &grad, 0.0))?;
                    if args.breakdown {
                        bwd_ph.add(&x.stamps()?.1);
                    }
                    Ok(t)
                })?;
                t.push(("fused", "bwd", fused_ok, bwd));
                x.finish(&s)?;
                x.set_stamps(false);
                let phases = (fwd_ph.slowest(comm)?, bwd_ph.slowest(comm)?);
                t.push((
                    "fused-pull",
                    "fwd",
                    pull_ok,
                    time_loop(comm, iters, || timed(&s, || x.forward_pull(&s, &ids_d, &mut out)))?,
                ));
                x.finish(&s)?;
                if floor_pair > 0 {
                    // Every rank's steps above have finished (finish, barrier).
                    comm.barrier()?;
                    let f = time_loop(comm, iters, || timed(&s, || x.put_floor(&s, floor_pair)))?;
                    let clean = x.finish(&s).is_ok();
                    t.push(("put-floor", "fwd", clean, f));
                }
                let mut movers = vec![(Mover::Copies, "cpu-copies", copies_ok)];
                if nccl.is_some() {
                    movers.push((Mover::Nccl, "nccl", nccl_ok));
                }
                for (m, name, ok) in movers {
                    t.push((
                        name,
                        "fwd",
                        ok,
                        time_loop(comm, iters, || timed(&s, || bl.forward(&s, &ids_d, &mut out, m, nccl.as_ref())))?,
                    ));
                    let b = time_loop(comm, iters, || {
                        bl.forward(&s, &ids_d, &mut out, m, nccl.as_ref())?;
                        timed(&s, || bl.backward(&s, &ids_d, &grad, 0.0, m, nccl.as_ref()))
                    })?;
                    t.push((name, "bwd", ok, b));
                }
                Ok((t, phases))
            })?;
            let phases = res[0].1.clone();
            let res: Vec<_> = res.into_iter().map(|(t, _)| t).collect();
            // Bytes between ranks: the fused exchange moves unique remote rows
            // (+ 8-byte keys), the baselines every remote lookup (+ keys).
            let remote_lookups = remote_lookups(&p, &ids);
            let d = p.dim as u64 * 4;
            for (method, dir, ok, secs) in &res[0] {
                let checked = res.iter().all(|r| r.iter().any(|(m, dd, o, _)| m == method && dd == dir && *o));
                let bytes = match (*method, *dir) {
                    ("fused", "fwd") => (tr.unique - tr.unique_local) * (d + 8),
                    ("fused", _) => (tr.unique - tr.unique_local) * d,
                    ("fused-pull", _) => remote_lookups * d,
                    ("put-floor", _) => floor_pair * pairs,
                    (_, "fwd") => remote_lookups * (d + 8),
                    _ => remote_lookups * d,
                };
                let _ = ok;
                let ph = match (*method, *dir, args.breakdown) {
                    ("fused", "fwd", true) => Some(named(&emb_k::STAMP_FWD, &phases.0)),
                    ("fused", "bwd", true) => Some(named(&emb_k::STAMP_BWD, &phases.1)),
                    _ => None,
                };
                let row = Row {
                    phases_us: ph.clone(),
                    batch,
                    pooling,
                    zipf,
                    method: method.to_string(),
                    direction: dir.to_string(),
                    lookups: tr.lookups,
                    bytes,
                    time_us: secs * 1e6,
                    lookups_per_s: tr.lookups as f64 / secs,
                    gb_per_s: bytes as f64 / secs / 1e9,
                    checked,
                };
                println!(
                    "{:>6} {:>4} {:>5} {:<14} {:<4} {:>11} {:>12} {:>10.1} {:>13.3e} {:>8.2} {:>5}",
                    row.batch,
                    row.pooling,
                    row.zipf,
                    row.method,
                    row.direction,
                    row.lookups,
                    row.bytes,
                    row.time_us,
                    row.lookups_per_s,
                    row.gb_per_s,
                    match (row.method.as_str(), row.checked) {
                        ("put-floor", true) => "-",
                        (_, true) => "yes",
                        _ => "NO",
                    }
                );
                if let Some(ph) = &ph {
                    let parts: Vec<String> = ph.iter().map(|(n, us)| format!("{n} {us:.1}")).collect();
                    println!(
                        "       breakdown fused {dir} (µs per phase, block 0's clock, slowest rank): {}",
                        parts.join(" | ")
                    );
                }
                rows.push(row);
            }
            // The fused forward moves exactly the floor's row bytes (plus
            // 8-byte keys): its share of the floor is the floor's time over
            // its own. The pull moves every remote lookup's row (no dedup).
            let fwd = |m: &str| {
                rows.iter()
                    .rev()
                    .take(res[0].len())
                    .find(|r: &&Row| r.method == m && r.direction == "fwd")
            };
            if let (Some(fl), Some(f), Some(pl)) = (fwd("put-floor"), fwd("fused"), fwd("fused-pull")) {
                println!(
                    "       put floor {:.2} GB/s (the fused forward's remote rows, plain puts, every pair at once); row bandwidth over it: fused fwd {:.2}, pull fwd {:.2}",
                    fl.gb_per_s,
                    fl.time_us / f.time_us,
                    pl.gb_per_s / fl.gb_per_s
                );
            }
            let (plain, dedup) = tr.row_bytes(p.dim);
            println!(
                "       dedup: {} unique of {} lookups, rows {:.1} MB instead of {:.1} MB ({:.1}% saved)",
                tr.unique,
                tr.lookups,
                dedup as f64 / 1e6,
                plain as f64 / 1e6,
                (plain - dedup) as f64 * 100.0 / plain.max(1) as f64
            );
        }
    }
    std::fs::create_dir_all(&args.out)?;
    let json = serde_json::json!({
        "what": "embedding exchange: fused (push + dedup, pull) vs CPU-driven copies vs NCCL",
        "timing": "host loop, wall clock per step up to stream synchronize, slowest rank's mean",
        "device": if gpu { "gpu" } else { "cpu emulator" },
        "ranks": base.ranks, "tables": base.tables, "rows": base.rows, "dim": base.dim,
        "ranks_per_gpu": rpg, "iters": iters, "nccl": nccl_note.clone().unwrap_or_else(|| "used".into()),
        "rows_measured": rows,
    });
    let jp = args.out.join("embedding_exchange.json");
    std::fs::write(&jp, serde_json::to_string_pretty(&json)?)?;
    let mut series_data: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.direction == "fwd" && r.zipf == 0.0 && r.method != "put-floor")
    {
        let name = r.method.clone();
        let x = (r.batch as f64) * r.pooling as f64;
        match series_data.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push((x, r.lookups_per_s / 1e6)),
            None => series_data.push((name, vec![(x, r.lookups_per_s / 1e6)])),
        }
    }
    series_data.iter_mut().for_each(|(_, v)| v.sort_by(|a, b| a.0.total_cmp(&b.0)));
    let series: Vec<Series> = series_data
        .iter()
        .map(|(n, v)| Series {
            name: n,
            points: v.clone(),
        })
        .collect();
    let title = format!(
        "embedding forward, {} ranks, {} tables, dim {}, uniform ids",
        base.ranks, base.tables, base.dim
    );
    write_chart(
        &Chart {
            title: &title,
            x_label: "batch x pooling (ids per table per rank)",
            y_label: "M lookups/s",
            series: &series,
        },
        &args.out.join("embedding_exchange.png"),
        &args.out.join("embedding_exchange.svg"),
    )?;
    println!("wrote {} and embedding_exchange.png/.svg", jp.display());
    if rows.iter().any(|r| !r.checked) {
        return Err("a method's forward output differs from the CPU reference (or the put floor reported an error)".into());
    }
    Ok(())
}

/// Non-padding lookups whose row lives on another rank.
fn remote_lookups(p: &Problem, ids: &[Vec<u32>]) -> u64 {
    ids.iter()
        .enumerate()
        .map(|(r, v)| v.iter().filter(|&&id| id < p.rows && (id % p.ranks) as usize != r).count() as u64)
        .sum()
}
