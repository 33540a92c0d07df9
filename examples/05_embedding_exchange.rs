//! Embedding exchange: row-wise sharded embedding tables, multi-hot bags
//! with sum pooling, the lookup fused with its all-to-all (forward) and the
//! gradients routed back and applied with SGD (backward), one kernel per
//! rank and direction, no CPU in the loop: the library's
//! `doorbell::coll::EmbeddingExchange`. Every result is checked against a
//! sequential CPU reference; a mismatch exits non-zero.
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

use clap::{Parser, ValueEnum};
use doorbell::coll::embedding::{launch_config_for, EmbeddingExchange, EmbeddingOptions};
use doorbell::comm::Communicator;
use doorbell_examples::cli::{ranged, DeviceArgs};
use doorbell_examples::embedding::{self as emb, comm_options, compare, print_traffic, ranks_per_gpu, Problem};
use doorbell_examples::{main_with, BoxError};

#[path = "bench/mod.rs"]
mod bench;
#[path = "embedding_bench.rs"]
mod embedding_bench;

/// Device transports.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum TransportArg {
    /// Stores into peers' memory (same GPU, NVLink/PCIe peers; the emulator).
    P2p,
    /// GPU-built RDMA WQEs through the soft NIC (push forward and backward; emulator and GPU).
    Ibgda,
    /// Load/store or the soft NIC per pair of ranks (DOORBELL_RDMA_PEERS; checked on the emulator).
    Routed,
    /// Every peer through the soft NIC, each row's put posted by a host thread (the CPU proxy).
    Proxy,
}

impl TransportArg {
    fn kind(self) -> emb::TransportKind {
        match self {
            TransportArg::P2p => emb::TransportKind::P2p,
            TransportArg::Ibgda => emb::TransportKind::Ibgda,
            TransportArg::Routed => emb::TransportKind::Routed,
            TransportArg::Proxy => emb::TransportKind::Proxy,
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
    /// Ranks (threads of this process; one per GPU with DOORBELL_RANK_PER_GPU=1)
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
             use --transport ibgda|routed|proxy for the checked run (push forward and backward)"
        );
        std::process::exit(2);
    }
    if args.zipf < 0.0 || !args.zipf.is_finite() || !args.lr.is_finite() {
        eprintln!("error: --zipf must be >= 0 and --lr finite");
        std::process::exit(2);
    }
    main_with(|| if args.bench { embedding_bench::bench(&args) } else { run(&args) });
}

/// The problem the flags ask for (`bench`: the benchmark's defaults).
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

fn run(args: &Args) -> Result<(), BoxError> {
    let p = problem(args, false);
    p.check().map_err(bare)?;
    let backend = args.device.backend()?;
    let ids = match &args.ids {
        Some(path) => emb::read_ids(path, &p)?,
        None => emb::generate_ids(&p, args.zipf, args.seed),
    };
    // Host validation: nothing runs, nothing is written.
    emb::validate_ids(&p, &ids).map_err(bare)?;
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
        let transport = args.transport.kind();
        let eo = EmbeddingOptions {
            transport,
            launch: Some(launch_config_for(comm, rpg, transport != emb::TransportKind::P2p)),
            ..EmbeddingOptions::default()
        };
        let mut x = EmbeddingExchange::with_options(comm, &p, cap, &eo)?;
        if r == 0 {
            // The grid fitted to the kernels' registers: every block must be
            // resident at once (grid barriers).
            let cfg = x.launch_config();
            match x.residency() {
                Some((regs, per_sm)) => println!(
                    "grid: {} blocks x {} threads per rank ({regs} registers per thread: {per_sm} blocks per SM)",
                    cfg.grid.0, cfg.block.0
                ),
                None => println!("grid: {} blocks x {} threads per rank", cfg.grid.0, cfg.block.0),
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
        emb::write_f32(path, results.iter().flat_map(|r| r.2[0].iter().copied()))?;
        println!("wrote the first step's output to {}", path.display());
    }
    if let Some(path) = &args.dump_tables {
        emb::write_f32(path, got.iter().copied())?;
        println!("wrote the tables to {}", path.display());
    }
    if !all_ok {
        return Err("the exchange differs from the CPU reference".into());
    }
    Ok(())
}

/// A library error of bad input, as the example words it: the reason alone.
fn bare(e: doorbell::Error) -> BoxError {
    match e {
        doorbell::Error::Collective { reason, .. } => reason.into(),
        e => e.into(),
    }
}
