//! GPU-initiated communication against a CPU proxy, on the same soft NIC
//! and the same ranks, in one run:
//!
//! * **8-byte `put_signal` round trip** (`put_signal_rtt`, one warp per
//!   rank of a pair): IBGDA (the kernel writes the WQEs and rings the
//!   doorbell), the CPU proxy (the kernel writes a request; a host thread
//!   writes the WQEs and rings), and P2P (stores) as the floor.
//! * **8-byte message rate** (`post_burst`, one warp of a pair's first
//!   rank posting `--wqes` non-blocking puts, then `quiet`): million puts
//!   per second from the first post to the last completion, IBGDA and
//!   proxy.
//! * **8-byte message rate of many warps** (`post_lanes`, `--lane-blocks`
//!   blocks of one warp, each lane posting its own put `--lane-rounds`
//!   times): million puts per second completed. IBGDA posts a warp's 32
//!   WQEs behind one doorbell on the block's QP
//!   (`DOORBELL_IBGDA_QPS_PER_PEER`, `DOORBELL_SOFTNIC_ENGINE_BLOCKS`);
//!   the proxy takes each lane's put as a request and posts on its one QP
//!   per peer.
//! * **the all-reduce** of a producer's gradient (f32, `--ar-sizes` bytes
//!   per rank, `--ar-chunks`), 2 ranks across the NIC (no pair
//!   load/store), three ways ([`proxy_bench_coll`]): fused
//!   (`fused_grad_allreduce`: the producer sends each chunk as it is
//!   made) over IBGDA and over the proxy; CPU-driven (for each chunk the
//!   producer's launch, then the library's all-reduce of that chunk) over
//!   both; and the producer alone, launched whole and per chunk, whose
//!   time taken from a step's leaves the time spent communicating. µs per
//!   step, median of `--ar-steps`; every step's output checked bit for
//!   bit against the CPU reference on every rank.
//! * **the embedding exchange** (the library's push forward and backward,
//!   4 tables, Zipf 1.05 ids, `--emb-dims`, `--emb-batch`) over IBGDA and
//!   the proxy: µs per forward and per backward, every forward's output
//!   and the tables after the last step checked against the CPU
//!   reference.
//!
//! **Pairs**: with two ranks, ranks 0 and 1. With more (`--ranks N`, above
//! 2 with `DOORBELL_NODES` making nodes of them) rank `i` of the first
//! node pairs with rank `i` of the second, and `--pairs` of them (default:
//! every rank of a node) measure at once, as a node's GPUs all talk across
//! at once; the round trip's figure is the median over every pair and
//! round, a rate's every pair's puts over the span from the first post of
//! any pair to the last completion of any (`%globaltimer`), the median
//! over rounds.
//!
//! **More ranks**: the GPU-initiated side of the collectives is the routed
//! transport (IBGDA between nodes, load/store inside one) and the proxy
//! routes the same way, so both plan the hierarchical all-reduce (checked
//! against the node-wise sum); the pairs, across nodes, go through the NIC
//! on both sides.
//!
//! Each round sets IBGDA up, measures it and P2P, closes it, then sets the
//! proxy up on the freed NIC and measures it (the two cannot share a NIC
//! port); a warm-up round is dropped and the report takes the medians and
//! their ratios. Every message-rate launch is checked on each pair's
//! second rank: the words the puts wrote must hold the value its partner
//! put in that launch (a value per poster and launch; a wrong result fails
//! the run). Every put writes a word of its own (the lane posts up to
//! `LANE_WORDS` puts), so one lost put fails it. On the CPU emulator the
//! timings mean nothing about a GPU; the run checks that every path works.
//!
//! ```text
//! cargo run --release --example proxy_bench -- [--device gpu|cpu] [--ranks N] [--pairs N] [--rtt-iters N] [--wqes N] [--rounds N]
//!     [--ar-sizes B,..] [--ar-chunks B,..] [--emb-dims D,..] [--emb-steps N] [--out DIR]
//! ```
//! Prints a table and writes to `--out`: `proxy_bench.json`,
//! `proxy_bench.{png,svg}` (the all-reduce's algbw beside its time per
//! step, a line per way, transport and chunk) and
//! `proxy_bench_embedding.{png,svg}` (forward and backward time per step
//! against the row's bytes).

#[path = "bench/mod.rs"]
mod bench;
#[path = "proxy_bench_coll.rs"]
mod proxy_bench_coll;
#[path = "proxy_bench_pairs.rs"]
mod proxy_bench_pairs;

use bench::{median_upper as median, run_ranks};
use clap::Parser;
use doorbell::coll::{AllReduce, DType, TransportKind};
use doorbell::comm::{CommOptions, Communicator, ProxyStats};
use doorbell_examples::cli::ProxyBenchArgs;
use doorbell_examples::embedding::Problem;
use doorbell_examples::pairs::Pairs;
use doorbell_examples::plot::{self, Chart, Series, YScale};
use doorbell_examples::{die, main_with, ratio, BoxError, USER_KERNELS};
use proxy_bench_coll::{ArBench, EmbCase};
use proxy_bench_pairs::{PairRank, PairRound};

fn main() {
    let args = ProxyBenchArgs::parse();
    main_with(|| run(&args));
}

/// What rank 0 reports (the fields of `proxy_bench.json`).
#[derive(serde::Serialize, serde::Deserialize, Debug, Default)]
struct Report {
    device: String,
    /// Ranks, and the transport of the GPU-initiated side: `ibgda` with 2
    /// ranks, `routed` (IBGDA between nodes) with more.
    #[serde(default)]
    ranks: u32,
    #[serde(default)]
    gpu_transport: String,
    rtt_iters: u32,
    wqes: u32,
    /// The pairs that measured the round trip and the rates, at once:
    /// [leader, partner].
    #[serde(default)]
    pairs: Vec<[u32; 2]>,
    /// The round trip: every pair's, round by round; the rates: per timed
    /// round, every pair's puts over the span they took together.
    rtt_ibgda_us: Vec<f64>,
    rtt_proxy_us: Vec<f64>,
    rtt_p2p_us: Vec<f64>,
    rate_ibgda_mput_s: Vec<f64>,
    rate_proxy_mput_s: Vec<f64>,
    /// Medians, and the ratios the comparison is about.
    rtt_ibgda_median_us: f64,
    rtt_proxy_median_us: f64,
    rtt_p2p_median_us: f64,
    rtt_ibgda_over_proxy: Option<f64>,
    rate_ibgda_median_mput_s: f64,
    rate_proxy_median_mput_s: f64,
    rate_ibgda_over_proxy: Option<f64>,
    lane_blocks: u32,
    lane_rounds: u32,
    lanes_ibgda_mput_s: Vec<f64>,
    lanes_proxy_mput_s: Vec<f64>,
    lanes_ibgda_median_mput_s: f64,
    lanes_proxy_median_mput_s: f64,
    lanes_ibgda_over_proxy: Option<f64>,
    /// The all-reduce: per size and chunk, µs per step of each round.
    allreduce: Vec<ArRow>,
    /// The embedding exchange: per row width, µs per step of each round.
    embedding: Vec<EmbRow>,
    /// Rank 0's proxy thread over the last round.
    proxy_requests: u64,
    proxy_wqes: u64,
    proxy_doorbells: u64,
}

/// One way of the all-reduce over one transport at one size and chunk.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, Clone)]
struct ArWay {
    /// µs per step of each round, and their median.
    us: Vec<f64>,
    median_us: f64,
    /// busbw (algbw × 2 (n-1)/n), GB/s, of the median.
    busbw_gbps: f64,
    /// The median less the producer's own time in the same launch shape:
    /// the time the step spends communicating.
    comm_us: f64,
}

impl ArWay {
    fn settle(&mut self, bytes: u64, ranks: f64, producer_us: f64) {
        self.median_us = median(self.us.clone());
        self.busbw_gbps = bytes as f64 / (self.median_us * 1e3) * 2.0 * (ranks - 1.0) / ranks;
        self.comm_us = self.median_us - producer_us;
    }
}

/// One size (and chunk) of the all-reduce.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, Clone)]
struct ArRow {
    bytes: u64,
    /// Bytes per chunk (`None`: the fused plan's own choice, and the
    /// CPU-driven all-reduce in one chunk).
    chunk: Option<u64>,
    fused_ibgda: ArWay,
    fused_proxy: ArWay,
    /// A producer launch and an all-reduce launch per chunk.
    cpu_ibgda: ArWay,
    cpu_proxy: ArWay,
    /// The producer alone, launched whole / per chunk (µs, each round),
    /// while the GPU-initiated side was set up (its soft NIC engine
    /// running), and the same while the proxy was: each side's
    /// communicating time takes off its own.
    producer_us: Vec<f64>,
    producer_chunks_us: Vec<f64>,
    producer_median_us: f64,
    producer_chunks_median_us: f64,
    #[serde(default)]
    producer_proxy_us: Vec<f64>,
    #[serde(default)]
    producer_chunks_proxy_us: Vec<f64>,
    #[serde(default)]
    producer_proxy_median_us: f64,
    #[serde(default)]
    producer_chunks_proxy_median_us: f64,
    /// Fused IBGDA's time over the fused proxy's, and over CPU-driven
    /// IBGDA's and the proxy's.
    fused_ibgda_over_fused_proxy: Option<f64>,
    fused_ibgda_over_cpu_ibgda: Option<f64>,
    fused_ibgda_over_cpu_proxy: Option<f64>,
    /// Elements checked against the reference per rank, every step.
    checked: u64,
}

/// One row width of the embedding exchange.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, Clone)]
struct EmbRow {
    tables: u32,
    rows: u32,
    dim: u32,
    batch: u32,
    pooling: u32,
    fwd_ibgda_us: Vec<f64>,
    fwd_proxy_us: Vec<f64>,
    bwd_ibgda_us: Vec<f64>,
    bwd_proxy_us: Vec<f64>,
    fwd_ibgda_median_us: f64,
    fwd_proxy_median_us: f64,
    bwd_ibgda_median_us: f64,
    bwd_proxy_median_us: f64,
    /// IBGDA's time over the proxy's.
    fwd_ibgda_over_proxy: Option<f64>,
    bwd_ibgda_over_proxy: Option<f64>,
}

struct Plan {
    ranks: u32,
    /// The ranks form modeled nodes (`DOORBELL_NODES`).
    nodes: bool,
    /// Which ranks measure the round trip and the rates, with which.
    pairs: Pairs,
    rtt_iters: u32,
    wqes: u32,
    rounds: u32,
    lane_blocks: u32,
    lane_rounds: u32,
    ar_sizes: Vec<u64>,
    ar_chunks: Vec<Option<u64>>,
    ar_steps: u32,
    emb: Vec<EmbCase>,
    emb_steps: u32,
}

impl Plan {
    /// The GPU-initiated side of the collectives: where the ranks form
    /// nodes, the routed transport (IBGDA between nodes, load/store inside
    /// one, this rank included), routed as the proxy then is; else IBGDA
    /// (every pair through the NIC, as the proxy sends them).
    fn gpu_kind(&self) -> TransportKind {
        if self.nodes {
            TransportKind::Routed
        } else {
            TransportKind::Ibgda
        }
    }

    /// Every (size, chunk) of the fused all-reduce, in report order.
    fn ar_cases(&self) -> Vec<(u64, Option<u64>)> {
        self.ar_sizes
            .iter()
            .flat_map(|&b| self.ar_chunks.iter().map(move |&c| (b, c)))
            .collect()
    }
}

fn run(a: &ProxyBenchArgs) -> Result<(), BoxError> {
    if let Some(path) = &a.replot {
        return replot(path, &a.out);
    }
    let gpu = a.device.wants_gpu()?;
    let ranks = a.ranks as u32;
    let nodes = match doorbell::comm::RdmaPeers::from_env()? {
        doorbell::comm::RdmaPeers::Nodes(n) => Some(n),
        _ => None,
    };
    if ranks > 2 {
        // Both transports must route by node for the comparison to hold.
        match doorbell::comm::RdmaPeers::from_env()? {
            doorbell::comm::RdmaPeers::Nodes(n) if n >= 2 && (ranks as usize).is_multiple_of(n) => {}
            _ => die(format!(
                "--ranks {ranks}: above 2 ranks proxy_bench compares the transports across modeled nodes; \
                 set DOORBELL_NODES to a node count of 2 or more that divides {ranks}"
            )),
        }
    }
    // Two ranks on one node would time load/store under the proxy's name.
    let pairs = Pairs::new(ranks, nodes.map(|n| n as u32), a.pairs.map(|n| n as u32)).unwrap_or_else(|e| die(e));
    let nodes = nodes.is_some();
    let plan = Plan {
        ranks,
        nodes,
        pairs,
        rtt_iters: a.rtt_iters.unwrap_or(if gpu { 2000 } else { 50 }) as u32,
        wqes: a.wqes.unwrap_or(if gpu { 4096 } else { 256 }) as u32,
        rounds: a.rounds as u32,
        lane_blocks: a.lane_blocks as u32,
        lane_rounds: a.lane_rounds.unwrap_or(if gpu { 64 } else { 4 }) as u32,
        ar_sizes: match &a.ar_sizes {
            Some(v) => v.clone(),
            None if gpu => vec![4 << 10, 256 << 10, 4 << 20, 16 << 20],
            None => vec![4 << 10, 64 << 10],
        },
        ar_chunks: match &a.ar_chunks {
            Some(v) => v.iter().map(|&c| Some(c)).collect(),
            None => vec![None],
        },
        ar_steps: a.ar_steps.unwrap_or(if gpu { 10 } else { 3 }) as u32,
        emb: match a.emb_dims.clone().unwrap_or(if gpu { vec![32, 128, 512] } else { vec![8, 16] }) {
            _ if a.emb_steps == Some(0) => Vec::new(),
            dims => dims
                .into_iter()
                .map(|dim| {
                    let batch = a.emb_batch.unwrap_or(if gpu { 256 } else { 4 }) as u32;
                    let (tables, rows, pooling) = if gpu { (4, 16384, 8) } else { (2, 64, 3) };
                    let p = Problem {
                        ranks,
                        tables,
                        rows,
                        dim: dim as u32,
                        batch,
                        pooling,
                    };
                    // A shape the exchange refuses is bad input.
                    p.check().unwrap_or_else(|e| die(e));
                    EmbCase::new(p)
                })
                .collect(),
        },
        emb_steps: a.emb_steps.unwrap_or(if gpu { 5 } else { 2 }) as u32,
    };
    // Every round's all-reduces and exchanges are set up anew (as the
    // transports are) and dropped: up to ~4x an all-reduce's size per rank
    // of the world per transport, fused and CPU-driven (the rings have a
    // row per rank). The heap takes dropped space back at the next
    // allocation; room for two rounds leaves slack for its gaps.
    let per_round: u64 =
        plan.ar_cases().iter().map(|c| c.0).sum::<u64>() * 8 * ranks as u64 + plan.emb.iter().map(|c| c.heap_bytes()).sum::<u64>() * 2;
    let opts = CommOptions {
        heap_bytes: per_round * 2 + (64 << 20),
        ..CommOptions::from_env()?
    };
    let ran = run_ranks(
        "proxy_bench",
        ranks as usize,
        Some(ranks as usize),
        a.device.backend()?,
        opts,
        |comm| bench(comm, &plan),
    )?;
    let Some(r) = ran.results.into_iter().flatten().next() else {
        return match ran.one_process_per_rank {
            true => Ok(()),
            false => Err("rank 0 produced no report".into()),
        };
    };
    println!(
        "# proxy_bench on {} ({} ranks; GPU-initiated over {}; medians of {} rounds)",
        r.device, r.ranks, r.gpu_transport, a.rounds
    );
    println!(
        "{:<40} {:>12} {:>12} {:>12} {:>14}",
        "", r.gpu_transport, "cpu proxy", "p2p", "gpu / proxy"
    );
    print_pairs(&r);
    print_collectives(&r);
    let path = bench::write_json(&a.out, "proxy_bench.json", &r)?;
    println!("# wrote {}", path.display());
    figures(&a.out, &r)
}

/// The round trip's and the rates' lines of the table.
fn print_pairs(r: &Report) {
    let pairs: Vec<String> = r.pairs.iter().map(|[a, b]| format!("{a}-{b}")).collect();
    println!(
        "# pairs across nodes, at once: {} (GPU-initiated side: IBGDA; rates of every pair together)",
        pairs.join(", ")
    );
    println!(
        "{:<40} {:>12.2} {:>12.2} {:>12.2} {:>14}",
        "8-byte put_signal round trip, us",
        r.rtt_ibgda_median_us,
        r.rtt_proxy_median_us,
        r.rtt_p2p_median_us,
        fmt(r.rtt_ibgda_over_proxy)
    );
    println!(
        "{:<40} {:>12.3} {:>12.3} {:>12} {:>14}",
        "8-byte puts, a warp per pair, M/s",
        r.rate_ibgda_median_mput_s,
        r.rate_proxy_median_mput_s,
        "",
        fmt(r.rate_ibgda_over_proxy)
    );
    println!(
        "{:<40} {:>12.3} {:>12.3} {:>12} {:>14}",
        format!("8-byte puts, {} warps per pair, M/s", r.lane_blocks),
        r.lanes_ibgda_median_mput_s,
        r.lanes_proxy_median_mput_s,
        "",
        fmt(r.lanes_ibgda_over_proxy)
    );
}

/// The all-reduce's and the embedding exchange's lines of the table.
fn print_collectives(r: &Report) {
    for row in &r.allreduce {
        let name = match row.chunk {
            None => format!("{} B", row.bytes),
            Some(c) => format!("{} B/{c} B", row.bytes),
        };
        let ways = [
            ("fused", &row.fused_ibgda, &row.fused_proxy),
            ("CPU-driven", &row.cpu_ibgda, &row.cpu_proxy),
        ];
        for (way, ib, px) in ways {
            println!(
                "{:<40} {:>12.1} {:>12.1} {:>12} {:>14}",
                format!("{way} all-reduce {name}, us/step"),
                ib.median_us,
                px.median_us,
                "",
                fmt(ratio(ib.median_us, px.median_us))
            );
        }
        println!(
            "#   producer alone {:.1} / {:.1} us launched whole, {:.1} / {:.1} us launched per chunk; communicating (step less producer): \
             fused {:.1} / {:.1}, CPU-driven {:.1} / {:.1} us; fused {g} over CPU-driven {g} {} and proxy {}",
            row.producer_median_us,
            row.producer_proxy_median_us,
            row.producer_chunks_median_us,
            row.producer_chunks_proxy_median_us,
            row.fused_ibgda.comm_us,
            row.fused_proxy.comm_us,
            row.cpu_ibgda.comm_us,
            row.cpu_proxy.comm_us,
            fmt(row.fused_ibgda_over_cpu_ibgda),
            fmt(row.fused_ibgda_over_cpu_proxy),
            g = r.gpu_transport,
        );
    }
    for row in &r.embedding {
        for (dir, ib, px, q) in [
            (
                "forward",
                row.fwd_ibgda_median_us,
                row.fwd_proxy_median_us,
                row.fwd_ibgda_over_proxy,
            ),
            (
                "backward",
                row.bwd_ibgda_median_us,
                row.bwd_proxy_median_us,
                row.bwd_ibgda_over_proxy,
            ),
        ] {
            println!(
                "{:<40} {:>12.1} {:>12.1} {:>12} {:>14}",
                format!("embedding {dir} dim {}, us", row.dim),
                ib,
                px,
                "",
                fmt(q)
            );
        }
    }
    println!(
        "# rank 0's proxy thread, last round: {} requests, {} WQEs, {} doorbells",
        r.proxy_requests, r.proxy_wqes, r.proxy_doorbells
    );
}

/// The figures of a report, into `out`.
fn figures(out: &std::path::Path, r: &Report) -> Result<(), BoxError> {
    if !r.allreduce.is_empty() {
        let png = allreduce_figure(out, r)?;
        println!("# wrote {} (algbw and time per step)", png.display());
    }
    if !r.embedding.is_empty() {
        let png = embedding_figure(out, r)?;
        println!("# wrote {} (time per step against row bytes)", png.display());
    }
    Ok(())
}

/// `--replot`: the figures of a stored `proxy_bench.json`, nothing run.
fn replot(path: &std::path::Path, out: &std::path::Path) -> Result<(), BoxError> {
    // A file that is missing or not a report is bad input.
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| die(format!("{}: {e}", path.display())));
    let r: Report = serde_json::from_str(&text).unwrap_or_else(|e| die(format!("{}: not a proxy_bench report: {e}", path.display())));
    figures(out, &r)
}

/// "2 ranks", or "4 ranks, IBGDA routed" where the GPU-initiated side is
/// the routed transport (a report from before either field: 2 ranks).
fn ranks_in_words(r: &Report) -> String {
    match r.gpu_transport.as_str() {
        "routed" => format!("{} ranks, IBGDA routed by node", r.ranks),
        _ => format!("{} ranks", r.ranks.max(2)),
    }
}

/// A line's name, "over IBGDA" naming the routed transport where the
/// report's GPU-initiated side was routed.
fn gpu_side(r: &Report, name: &str) -> String {
    match r.gpu_transport.as_str() {
        "routed" => name.replace("over IBGDA", "over IBGDA (routed)"),
        _ => name.to_string(),
    }
}

/// The all-reduce's figure: a line per way, transport and chunk size.
fn allreduce_figure(out: &std::path::Path, r: &Report) -> Result<std::path::PathBuf, BoxError> {
    let mut chunks: Vec<Option<u64>> = Vec::new();
    for row in &r.allreduce {
        if !chunks.contains(&row.chunk) {
            chunks.push(row.chunk);
        }
    }
    type Pick = fn(&ArRow) -> f64;
    let picks: [(&str, Pick); 4] = [
        ("fused over IBGDA", |row| row.fused_ibgda.median_us),
        ("fused over the CPU proxy", |row| row.fused_proxy.median_us),
        ("CPU-driven over IBGDA", |row| row.cpu_ibgda.median_us),
        ("CPU-driven over the CPU proxy", |row| row.cpu_proxy.median_us),
    ];
    let mut lines: Vec<(String, Option<u64>, Pick)> = Vec::new();
    for c in &chunks {
        for (t, pick) in &picks {
            let chunk = c.map_or(String::new(), |c| format!(", {} chunks", plot::human_bytes(c as f64)));
            lines.push((format!("{}{chunk}", gpu_side(r, t)), *c, *pick));
        }
    }
    let times: Vec<Series> = lines
        .iter()
        .map(|(name, c, pick)| Series {
            name,
            points: r
                .allreduce
                .iter()
                .filter(|row| row.chunk == *c)
                .map(|row| (row.bytes as f64, pick(row)))
                .collect(),
        })
        .collect();
    let title = format!("all-reduce, {} across the soft NIC ({})", ranks_in_words(r), r.device);
    Ok(bench::write_times_figure(out, "proxy_bench", &title, "bytes per rank", &times)?.0)
}

/// The embedding exchange's figure: forward and backward time per step
/// over each transport against the row's bytes.
fn embedding_figure(out: &std::path::Path, r: &Report) -> Result<std::path::PathBuf, BoxError> {
    type Pick = fn(&EmbRow) -> f64;
    let picks: [(&str, Pick); 4] = [
        ("forward over IBGDA", |row| row.fwd_ibgda_median_us),
        ("forward over the CPU proxy", |row| row.fwd_proxy_median_us),
        ("backward over IBGDA", |row| row.bwd_ibgda_median_us),
        ("backward over the CPU proxy", |row| row.bwd_proxy_median_us),
    ];
    let names: Vec<String> = picks.iter().map(|(name, _)| gpu_side(r, name)).collect();
    let series: Vec<Series> = picks
        .iter()
        .zip(&names)
        .map(|((_, pick), name)| Series {
            name,
            points: r.embedding.iter().map(|row| (row.dim as f64 * 4.0, pick(row))).collect(),
        })
        .collect();
    let e = &r.embedding[0];
    let title = format!(
        "embedding exchange, {}, {} tables, batch {} ({})",
        ranks_in_words(r),
        e.tables,
        e.batch,
        r.device
    );
    let chart = Chart {
        title: &title,
        x_label: "bytes per row",
        y_label: "time per step (us, log scale)",
        series: &series,
    };
    std::fs::create_dir_all(out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let (png, svg) = (out.join("proxy_bench_embedding.png"), out.join("proxy_bench_embedding.svg"));
    plot::write_charts(&[(&chart, YScale::Log)], &png, &svg)?;
    Ok(png)
}

impl Report {
    /// One timed round's pair figures: every pair's round trip, every
    /// pair's puts over the span they took together.
    fn add_pairs(&mut self, ib: &PairRound, px: &PairRound) {
        self.rtt_ibgda_us.extend(&ib.rtt_us);
        self.rtt_proxy_us.extend(&px.rtt_us);
        self.rtt_p2p_us.extend(&ib.rtt_p2p_us);
        self.rate_ibgda_mput_s.push(ib.rate.all);
        self.rate_proxy_mput_s.push(px.rate.all);
        self.lanes_ibgda_mput_s.push(ib.lanes.all);
        self.lanes_proxy_mput_s.push(px.lanes.all);
    }
}

/// A round's pair figures in a line: the round trips' range over the
/// pairs, the rates of every pair together.
fn pair_line(p: &Plan, ib: &PairRound, px: &PairRound) -> String {
    let span = |v: &[f64], digits: usize| {
        let (lo, hi) = v.iter().fold((f64::INFINITY, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        if v.len() > 1 {
            format!("{lo:.digits$}-{hi:.digits$}")
        } else {
            format!("{lo:.digits$}")
        }
    };
    // Every pair together, then each pair's own range.
    let rates = |r: &doorbell_examples::pairs::Rates| format!("{:.3} ({} each)", r.all, span(&r.per_pair, 3));
    format!(
        "round trip ibgda {} / proxy {} / p2p {} us; puts ibgda {} / proxy {} M/s; {} warps ibgda {} / proxy {} M/s ({} pair(s))",
        span(&ib.rtt_us, 2),
        span(&px.rtt_us, 2),
        span(&ib.rtt_p2p_us, 2),
        rates(&ib.rate),
        rates(&px.rate),
        p.lane_blocks,
        rates(&ib.lanes),
        rates(&px.lanes),
        ib.rtt_us.len(),
    )
}

/// The round trip's and the rates' medians and ratios.
fn pair_medians(rep: &mut Report) {
    rep.rtt_ibgda_median_us = median(rep.rtt_ibgda_us.clone());
    rep.rtt_proxy_median_us = median(rep.rtt_proxy_us.clone());
    rep.rtt_p2p_median_us = median(rep.rtt_p2p_us.clone());
    rep.rtt_ibgda_over_proxy = ratio(rep.rtt_ibgda_median_us, rep.rtt_proxy_median_us);
    rep.rate_ibgda_median_mput_s = median(rep.rate_ibgda_mput_s.clone());
    rep.rate_proxy_median_mput_s = median(rep.rate_proxy_mput_s.clone());
    rep.rate_ibgda_over_proxy = ratio(rep.rate_ibgda_median_mput_s, rep.rate_proxy_median_mput_s);
    rep.lanes_ibgda_median_mput_s = median(rep.lanes_ibgda_mput_s.clone());
    rep.lanes_proxy_median_mput_s = median(rep.lanes_proxy_mput_s.clone());
    rep.lanes_ibgda_over_proxy = ratio(rep.lanes_ibgda_median_mput_s, rep.lanes_proxy_median_mput_s);
}

fn fmt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

fn bench(comm: &Communicator, p: &Plan) -> Result<Option<Report>, BoxError> {
    let dev = comm.device();
    // Before any NIC set-up: a module load waits behind the soft NIC's
    // engine. (An all-reduce over P2P loads the library's module.)
    let m = comm.load_module(&USER_KERNELS)?;
    drop(AllReduce::new(comm, 1, DType::F32)?);
    let mut r = PairRank::new(comm, &m, p)?;
    let p2p = comm.p2p()?;
    let gpu_kind = p.gpu_kind();
    let mut rep = Report {
        device: dev.name(),
        ranks: p.ranks,
        gpu_transport: gpu_kind.to_string(),
        rtt_iters: p.rtt_iters,
        wqes: p.wqes,
        pairs: p.pairs.list(),
        ..Report::default()
    };
    let mut stats = ProxyStats::default();
    let mut ar_rows: Vec<ArRow> = p
        .ar_cases()
        .into_iter()
        .map(|(bytes, chunk)| ArRow {
            bytes,
            chunk,
            ..ArRow::default()
        })
        .collect();
    let mut emb_rows: Vec<EmbRow> = p
        .emb
        .iter()
        .map(|c| EmbRow {
            tables: c.p.tables,
            rows: c.p.rows,
            dim: c.p.dim,
            batch: c.p.batch,
            pooling: c.p.pooling,
            ..EmbRow::default()
        })
        .collect();
    let ar = ArBench::new(comm, &m, p.ar_steps)?;
    let t0 = std::time::Instant::now();
    let note = |what: &str| {
        if comm.rank() == 0 {
            eprintln!("[{:7.2} s] {what}", t0.elapsed().as_secs_f64());
        }
    };
    // Each case's fused and CPU-driven all-reduce over `kind` and the
    // producer alone, then each embedding shape's exchange.
    // Per all-reduce case: fused, CPU-driven, the producer alone (whole,
    // per chunk); per embedding shape: forward, backward.
    type Times = (Vec<(f64, f64, (f64, f64))>, Vec<(f64, f64)>);
    let collectives = |kind: TransportKind| -> Result<Times, BoxError> {
        note(&format!("{kind}: all-reduce, fused and CPU-driven"));
        let mut times = Vec::new();
        for case in p.ar_cases() {
            let fused = ar.fused(kind, case)?;
            let cpu = ar.cpu_driven(kind, case)?;
            // The producer alone, while this side is set up.
            let alone = ar.producer(case)?;
            if comm.rank() == 0 {
                let chunk = case.1.map_or("auto".to_string(), |c| format!("{c} B"));
                eprintln!(
                    "  all-reduce {} B (chunk {chunk}) over {kind}: fused {fused:.1}, CPU-driven {cpu:.1} us a step",
                    case.0
                );
            }
            times.push((fused, cpu, alone));
        }
        note(&format!("{kind}: embedding exchange"));
        let mut emb = Vec::new();
        for c in &p.emb {
            emb.push(proxy_bench_coll::embedding(comm, kind, c, p.emb_steps)?);
        }
        Ok((times, emb))
    };
    for round in 0..=p.rounds {
        let warm = round == 0;
        note(&format!("round {round}: IBGDA set-up"));
        let ib = comm.ibgda()?;
        note("IBGDA: round trips, message rates");
        let pairs_ib = r.round(p, ib, Some(p2p), 0x1b9d_a000 + round as u64)?;
        let (ar_ib, emb_ib) = collectives(gpu_kind)?;
        note("IBGDA closed; proxy set-up");
        comm.ibgda_close()?;
        let px = comm.proxy()?;
        note("proxy: round trips, message rates");
        let pairs_px = r.round(p, px, None::<doorbell_kernels::transport::P2p>, 0xc0de_0000 + round as u64)?;
        let (ar_px, emb_px) = collectives(TransportKind::Proxy)?;
        stats = comm.proxy_stats().unwrap_or_default();
        comm.proxy_check()?;
        note("proxy reset");
        comm.proxy_reset()?;
        if comm.rank() == 0 {
            eprintln!(
                "round {round}{}: {}",
                if warm { " (warm-up)" } else { "" },
                pair_line(p, &pairs_ib, &pairs_px)
            );
        }
        if !warm {
            rep.add_pairs(&pairs_ib, &pairs_px);
            for (k, row) in ar_rows.iter_mut().enumerate() {
                let ((fi, ci, alone), (fp, cp, alone_px)) = (ar_ib[k], ar_px[k]);
                row.fused_ibgda.us.push(fi);
                row.cpu_ibgda.us.push(ci);
                row.fused_proxy.us.push(fp);
                row.cpu_proxy.us.push(cp);
                row.producer_us.push(alone.0);
                row.producer_chunks_us.push(alone.1);
                row.producer_proxy_us.push(alone_px.0);
                row.producer_chunks_proxy_us.push(alone_px.1);
                row.checked = (row.bytes / 4).max(1);
            }
            for (k, row) in emb_rows.iter_mut().enumerate() {
                row.fwd_ibgda_us.push(emb_ib[k].0);
                row.bwd_ibgda_us.push(emb_ib[k].1);
                row.fwd_proxy_us.push(emb_px[k].0);
                row.bwd_proxy_us.push(emb_px[k].1);
            }
        }
    }
    (rep.lane_blocks, rep.lane_rounds) = (p.lane_blocks, p.lane_rounds);
    pair_medians(&mut rep);
    let n = comm.world_size() as f64;
    for row in &mut ar_rows {
        row.producer_median_us = median(row.producer_us.clone());
        row.producer_chunks_median_us = median(row.producer_chunks_us.clone());
        row.producer_proxy_median_us = median(row.producer_proxy_us.clone());
        row.producer_chunks_proxy_median_us = median(row.producer_chunks_proxy_us.clone());
        row.fused_ibgda.settle(row.bytes, n, row.producer_median_us);
        row.fused_proxy.settle(row.bytes, n, row.producer_proxy_median_us);
        row.cpu_ibgda.settle(row.bytes, n, row.producer_chunks_median_us);
        row.cpu_proxy.settle(row.bytes, n, row.producer_chunks_proxy_median_us);
        let fi = row.fused_ibgda.median_us;
        row.fused_ibgda_over_fused_proxy = ratio(fi, row.fused_proxy.median_us);
        row.fused_ibgda_over_cpu_ibgda = ratio(fi, row.cpu_ibgda.median_us);
        row.fused_ibgda_over_cpu_proxy = ratio(fi, row.cpu_proxy.median_us);
    }
    for row in &mut emb_rows {
        row.fwd_ibgda_median_us = median(row.fwd_ibgda_us.clone());
        row.fwd_proxy_median_us = median(row.fwd_proxy_us.clone());
        row.bwd_ibgda_median_us = median(row.bwd_ibgda_us.clone());
        row.bwd_proxy_median_us = median(row.bwd_proxy_us.clone());
        row.fwd_ibgda_over_proxy = ratio(row.fwd_ibgda_median_us, row.fwd_proxy_median_us);
        row.bwd_ibgda_over_proxy = ratio(row.bwd_ibgda_median_us, row.bwd_proxy_median_us);
    }
    rep.allreduce = ar_rows;
    rep.embedding = emb_rows;
    (rep.proxy_requests, rep.proxy_wqes, rep.proxy_doorbells) = (stats.requests, stats.wqes, stats.doorbells);
    comm.barrier()?;
    Ok((comm.rank() == 0).then_some(rep))
}
