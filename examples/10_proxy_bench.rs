//! GPU-initiated communication against a CPU proxy, on the same soft NIC
//! and the same two ranks, in one run:
//!
//! * **8-byte `put_signal` round trip** (`put_signal_rtt`, one warp per
//!   rank): IBGDA (the kernel writes the WQEs and rings the doorbell), the
//!   CPU proxy (the kernel writes a request; a host thread writes the WQEs
//!   and rings), and P2P (stores) as the floor.
//! * **8-byte message rate** (`post_burst`, one warp of rank 0 posting
//!   `--wqes` non-blocking puts, then `quiet`): million puts per second
//!   from the first post to the last completion, IBGDA and proxy.
//! * **8-byte message rate of many warps** (`post_lanes`, `--lane-blocks`
//!   blocks of one warp, each lane posting its own put `--lane-rounds`
//!   times): million puts per second completed. IBGDA posts a warp's 32
//!   WQEs behind one doorbell on the block's QP
//!   (`DOORBELL_IBGDA_QPS_PER_PEER`, `DOORBELL_SOFTNIC_ENGINE_BLOCKS`);
//!   the proxy takes each lane's put as a request and posts on its one QP
//!   per peer.
//! * **the fused all-reduce** (`fused_grad_allreduce`: each rank's
//!   producer computes its gradient chunk by chunk and sends each chunk as
//!   it is made), f32, `--ar-sizes` bytes per rank, 2 ranks across the NIC
//!   (no pair load/store), IBGDA and proxy: µs per step (median of
//!   `--ar-steps` steps, each launch synchronized), every step's output
//!   checked bit for bit against the CPU reference on every rank.
//!
//! Each round sets IBGDA up, measures it and P2P, closes it, then sets the
//! proxy up on the freed NIC and measures it (the two cannot share a NIC
//! port); a warm-up round is dropped and the report takes the medians and
//! their ratios. Every message-rate launch is checked on rank 1: the words
//! the puts wrote must hold the value rank 0 put in that launch (a wrong
//! result fails the run). On the CPU emulator the timings mean nothing
//! about a GPU; the run checks that every path works.
//!
//! ```text
//! cargo run --release --example proxy_bench -- [--device gpu|cpu] [--rtt-iters N] [--wqes N] [--rounds N] [--out DIR]
//! ```
//! Prints a table and writes `proxy_bench.json` and `proxy_bench.{png,svg}`
//! (the fused all-reduce's algbw beside its time per step) to `--out`.

#[path = "bench/mod.rs"]
mod bench;

use bench::{median_upper as median, run_ranks};
use clap::Parser;
use doorbell::coll::{AllReduce, AllReduceOptions, DType, TransportKind};
use doorbell::comm::{CommOptions, Communicator, ProxyStats};
use doorbell::{DeviceBuffer, FamilyHandle, LaunchConfig};
use doorbell_example_kernels::allreduce::{fused_grad_allreduce, grad, COMPUTE_HASH};
use doorbell_example_kernels::ibgda_bench::{post_burst, post_lanes, put_signal_rtt, BENCH_OK};
use doorbell_examples::cli::ProxyBenchArgs;
use doorbell_examples::plot::Series;
use doorbell_examples::{main_with, ratio, BoxError, USER_KERNELS};

fn main() {
    let args = ProxyBenchArgs::parse();
    main_with(|| run(&args));
}

/// What rank 0 reports (the fields of `proxy_bench.json`).
#[derive(serde::Serialize, Debug, Default)]
struct Report {
    device: String,
    rtt_iters: u32,
    wqes: u32,
    /// Per timed round.
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
    /// The fused all-reduce: per size, µs per step of each round.
    allreduce: Vec<ArRow>,
    /// Rank 0's proxy thread over the last round.
    proxy_requests: u64,
    proxy_wqes: u64,
    proxy_doorbells: u64,
}

/// One size (and chunk) of the fused all-reduce.
#[derive(serde::Serialize, Debug, Default, Clone)]
struct ArRow {
    bytes: u64,
    /// Bytes per chunk (`None`: the plan's own choice).
    chunk: Option<u64>,
    ibgda_us: Vec<f64>,
    proxy_us: Vec<f64>,
    ibgda_median_us: f64,
    proxy_median_us: f64,
    /// IBGDA's time over the proxy's.
    ibgda_over_proxy: Option<f64>,
    /// busbw (algbw × 2 (n-1)/n), GB/s, of the medians.
    ibgda_busbw_gbps: f64,
    proxy_busbw_gbps: f64,
    /// Elements checked against the reference per rank, every step.
    checked: u64,
}

struct Plan {
    rtt_iters: u32,
    wqes: u32,
    rounds: u32,
    lane_blocks: u32,
    lane_rounds: u32,
    ar_sizes: Vec<u64>,
    ar_chunks: Vec<Option<u64>>,
    ar_steps: u32,
}

impl Plan {
    /// Every (size, chunk) of the fused all-reduce, in report order.
    fn ar_cases(&self) -> Vec<(u64, Option<u64>)> {
        self.ar_sizes
            .iter()
            .flat_map(|&b| self.ar_chunks.iter().map(move |&c| (b, c)))
            .collect()
    }
}

fn run(a: &ProxyBenchArgs) -> Result<(), BoxError> {
    let gpu = a.device.wants_gpu()?;
    let plan = Plan {
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
    };
    // The symmetric heap hands out space and never takes it back: every
    // round's all-reduces (set up anew, as the transports are) take their
    // scratch afresh, up to ~6x the size per transport.
    let per_round: u64 = plan.ar_cases().iter().map(|c| c.0).sum::<u64>() * 12;
    let opts = CommOptions {
        heap_bytes: per_round * (plan.rounds as u64 + 1) + (64 << 20),
        ..CommOptions::from_env()?
    };
    let ran = run_ranks("proxy_bench", 2, Some(2), a.device.backend()?, opts, |comm| bench(comm, &plan))?;
    let Some(r) = ran.results.into_iter().flatten().next() else {
        return match ran.one_process_per_rank {
            true => Ok(()),
            false => Err("rank 0 produced no report".into()),
        };
    };
    println!("# proxy_bench on {} (2 ranks; medians of {} rounds)", r.device, a.rounds);
    println!(
        "{:<34} {:>12} {:>12} {:>12} {:>14}",
        "", "ibgda", "cpu proxy", "p2p", "ibgda / proxy"
    );
    println!(
        "{:<34} {:>12.2} {:>12.2} {:>12.2} {:>14}",
        "8-byte put_signal round trip, us",
        r.rtt_ibgda_median_us,
        r.rtt_proxy_median_us,
        r.rtt_p2p_median_us,
        fmt(r.rtt_ibgda_over_proxy)
    );
    println!(
        "{:<34} {:>12.3} {:>12.3} {:>12} {:>14}",
        "8-byte puts by one warp, M/s",
        r.rate_ibgda_median_mput_s,
        r.rate_proxy_median_mput_s,
        "",
        fmt(r.rate_ibgda_over_proxy)
    );
    println!(
        "{:<34} {:>12.3} {:>12.3} {:>12} {:>14}",
        format!("8-byte puts by {} warps, M/s", r.lane_blocks),
        r.lanes_ibgda_median_mput_s,
        r.lanes_proxy_median_mput_s,
        "",
        fmt(r.lanes_ibgda_over_proxy)
    );
    for row in &r.allreduce {
        println!(
            "{:<34} {:>12.1} {:>12.1} {:>12} {:>14}",
            match row.chunk {
                None => format!("fused all-reduce {} B, us/step", row.bytes),
                Some(c) => format!("fused all-reduce {} B/{c} B, us/step", row.bytes),
            },
            row.ibgda_median_us,
            row.proxy_median_us,
            "",
            fmt(row.ibgda_over_proxy)
        );
    }
    println!(
        "# rank 0's proxy thread, last round: {} requests, {} WQEs, {} doorbells",
        r.proxy_requests, r.proxy_wqes, r.proxy_doorbells
    );
    let path = bench::write_json(&a.out, "proxy_bench.json", &r)?;
    println!("# wrote {}", path.display());
    if !r.allreduce.is_empty() {
        // A line per transport and chunk size.
        let mut chunks: Vec<Option<u64>> = Vec::new();
        for row in &r.allreduce {
            if !chunks.contains(&row.chunk) {
                chunks.push(row.chunk);
            }
        }
        type Pick = fn(&ArRow) -> f64;
        let picks: [(&str, Pick); 2] = [("IBGDA", |row| row.ibgda_median_us), ("the CPU proxy", |row| row.proxy_median_us)];
        let mut names = Vec::new();
        for c in &chunks {
            for (t, _) in &picks {
                let chunk = c.map_or(String::new(), |c| format!(", {} KiB chunks", c >> 10));
                names.push(format!("fused over {t}{chunk}"));
            }
        }
        let times: Vec<Series> = chunks
            .iter()
            .flat_map(|c| picks.iter().map(move |(_, pick)| (*c, *pick)))
            .zip(&names)
            .map(|((c, pick), name)| Series {
                name,
                points: r
                    .allreduce
                    .iter()
                    .filter(|row| row.chunk == c)
                    .map(|row| (row.bytes as f64, pick(row)))
                    .collect(),
            })
            .collect();
        let title = format!("fused all-reduce, 2 ranks across the soft NIC ({})", r.device);
        let (png, _) = bench::write_times_figure(&a.out, "proxy_bench", &title, "bytes per rank", &times)?;
        println!("# wrote {} (algbw and time per step)", png.display());
    }
    Ok(())
}

fn fmt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

/// A transport call in the launch failed.
fn check(status: &DeviceBuffer<u32>, what: &str) -> Result<(), BoxError> {
    let s = status.to_host()?[0];
    if s != BENCH_OK && s != 0 {
        return Err(format!("{what}: a transport call failed (status {s})").into());
    }
    Ok(())
}

/// One rank's buffers and kernel families.
struct Rank<'c> {
    comm: &'c Communicator,
    s: doorbell::Stream,
    rtt: doorbell::Family<put_signal_rtt>,
    burst: doorbell::Family<post_burst>,
    lanes: doorbell::Family<post_lanes>,
    words: doorbell::comm::SymBuffer<'c, u64>,
    sig: doorbell::comm::SymBuffer<'c, u64>,
    src: doorbell::comm::SymBuffer<'c, u64>,
    status: DeviceBuffer<u32>,
    out: DeviceBuffer<u64>,
    epoch: u64,
}

impl Rank<'_> {
    /// Before a rate launch: rank 1 zeroes the words the puts write, rank
    /// 0 fills its source with `value`.
    fn prepare(&mut self, value: u64) -> Result<(), BoxError> {
        self.status.zero()?;
        if self.comm.rank() == 1 {
            self.words.copy_from_host(&[0u64; 128])?;
        } else {
            self.src.copy_from_host(&[value; 64])?;
        }
        self.comm.barrier()?;
        Ok(())
    }

    /// After it: rank 1's first `n` words hold `value`, the others 0.
    fn landed(&self, n: usize, value: u64, what: &str) -> Result<(), BoxError> {
        self.comm.barrier()?;
        if self.comm.rank() == 1 {
            let got = self.words.to_host()?;
            let want = |i: usize| if i < n { value } else { 0 };
            if let Some(i) = (0..128).find(|&i| got[i] != want(i)) {
                return Err(format!("{what}: rank 1's word {i} holds {:#x}, not {:#x}", got[i], want(i)).into());
            }
        }
        Ok(())
    }

    /// µs per 8-byte put_signal round trip over `t`.
    fn round_trip<T>(&mut self, p: &Plan, t: T) -> Result<f64, BoxError>
    where
        T: FamilyHandle<put_signal_rtt, Rest = (*mut u64, *mut u64, u64, u32, *mut u64, *mut u32)>,
    {
        self.status.zero()?;
        self.comm.barrier()?;
        let a = (
            self.words.as_mut_ptr(),
            self.sig.as_mut_ptr(),
            self.epoch,
            p.rtt_iters,
            self.out.as_mut_ptr(),
            self.status.as_mut_ptr(),
        );
        // SAFETY: symmetric `words` and `sig`; one warp per rank.
        unsafe { self.s.launch_family(&self.rtt, LaunchConfig::linear(1, 32), t, a)? };
        self.comm.synchronize(&self.s)?;
        check(&self.status, "put_signal round trip")?;
        self.epoch += p.rtt_iters as u64 + 1;
        Ok(self.out.to_host()?[0] as f64 / 1e3 / p.rtt_iters as f64)
    }

    /// Million 8-byte puts per second by one warp of rank 0 over `t`, from
    /// the first post to the last completion; rank 1 checks what landed.
    fn message_rate<T>(&mut self, p: &Plan, t: T, value: u64) -> Result<f64, BoxError>
    where
        T: FamilyHandle<post_burst, Rest = (*mut u64, *const u64, u32, u32, *mut u64, *mut u32)>,
    {
        self.prepare(value)?;
        let a = (
            self.words.as_mut_ptr(),
            self.src.as_ptr(),
            p.wqes,
            1u32,
            self.out.as_mut_ptr(),
            self.status.as_mut_ptr(),
        );
        // SAFETY: symmetric `words` of 128 words, `src` of 64; one warp posts.
        unsafe { self.s.launch_family(&self.burst, LaunchConfig::linear(1, 32), t, a)? };
        self.comm.synchronize(&self.s)?;
        check(&self.status, "message rate")?;
        self.landed((p.wqes as usize).min(64), value, "message rate")?;
        let ns = self.out.to_host()?;
        Ok(p.wqes as f64 / (ns[1].max(1) as f64 * 1e-9) / 1e6)
    }

    /// Million 8-byte puts per second completed by `lane_blocks` warps of
    /// rank 0, each lane posting its own put `lane_rounds` times; rank 1
    /// checks what landed.
    fn lane_rate<T>(&mut self, p: &Plan, t: T, value: u64) -> Result<f64, BoxError>
    where
        T: FamilyHandle<post_lanes, Rest = (*mut u64, *const u64, u32, *mut u64, *mut u32)>,
    {
        self.prepare(value)?;
        let a = (
            self.words.as_mut_ptr(),
            self.src.as_ptr(),
            p.lane_rounds,
            self.out.as_mut_ptr(),
            self.status.as_mut_ptr(),
        );
        // SAFETY: symmetric `words` of 128 words, `src` of 64; 3 output
        // words per block (at most 64 blocks).
        unsafe { self.s.launch_family(&self.lanes, LaunchConfig::linear(p.lane_blocks, 32), t, a)? };
        self.comm.synchronize(&self.s)?;
        check(&self.status, "lane posts")?;
        self.landed((32 * p.lane_blocks as usize).min(128), value, "lane posts")?;
        let ns = self.out.to_host()?;
        let b = p.lane_blocks as usize;
        let t0 = (0..b).map(|k| ns[3 * k]).min().unwrap_or(0);
        let t1 = (0..b).map(|k| ns[3 * k + 2]).max().unwrap_or(0);
        let puts = 32.0 * p.lane_rounds as f64 * b as f64;
        Ok(puts / (t1.saturating_sub(t0).max(1) as f64 * 1e-9) / 1e6)
    }
}

/// Microseconds per step of the fused all-reduce of `bytes` (f32) over
/// `kind`, the median of `p.ar_steps` steps after one warm-up; every
/// step's output is checked against the CPU reference. Returns the time
/// and the elements checked per step.
fn fused_allreduce(
    comm: &Communicator,
    m: &doorbell::Module,
    p: &Plan,
    kind: TransportKind,
    (bytes, chunk): (u64, Option<u64>),
) -> Result<(f64, u64), BoxError> {
    let elems = (bytes / 4).max(1) as usize;
    let opts = AllReduceOptions {
        transport: kind,
        fused: true,
        chunk_bytes: chunk,
        ..Default::default()
    };
    let ar = AllReduce::with_options(comm, elems, DType::F32, &opts)?;
    let fam = m.family::<fused_grad_allreduce>()?;
    let dev = comm.device();
    let s = dev.new_stream()?;
    let mut out = dev.alloc_zeroed::<f32>(elems)?;
    let ranks = comm.world_size() as u32;
    let mut times = Vec::new();
    for step in 0..=p.ar_steps {
        comm.barrier()?;
        let t0 = std::time::Instant::now();
        if let Some((a, cfg)) = ar.fused_args(&s, &mut out)? {
            // SAFETY: arguments from fused_args for this world and buffer,
            // launched with the all-reduce's transport.
            unsafe { s.launch_family(&fam, cfg, comm.transport(kind)?, (a, COMPUTE_HASH, step))? };
        }
        comm.synchronize(&s)?;
        let us = t0.elapsed().as_secs_f64() * 1e6;
        if step > 0 {
            times.push(us);
        }
        let got = out.to_host()?;
        for (i, g) in got.iter().enumerate() {
            let want = (0..ranks).fold(0f32, |acc, r| acc + grad(COMPUTE_HASH, r, i as u64, step));
            if g.to_bits() != want.to_bits() {
                return Err(format!(
                    "fused all-reduce over {kind} ({bytes} bytes), step {step}, rank {}: element {i} is {g}, not {want}",
                    comm.rank()
                )
                .into());
            }
        }
    }
    if comm.rank() == 0 {
        eprintln!(
            "  fused all-reduce {bytes} B (chunk {}) over {kind}: {:.1} us a step",
            chunk.map_or("auto".to_string(), |c| format!("{c} B")),
            median(times.clone())
        );
    }
    Ok((median(times), elems as u64))
}

fn bench(comm: &Communicator, p: &Plan) -> Result<Option<Report>, BoxError> {
    let dev = comm.device();
    // Before any NIC set-up: a module load waits behind the soft NIC's
    // engine. (An all-reduce over P2P loads the library's module.)
    let m = comm.load_module(&USER_KERNELS)?;
    drop(AllReduce::new(comm, 1, DType::F32)?);
    let mut r = Rank {
        comm,
        s: dev.new_stream()?,
        rtt: m.family::<put_signal_rtt>()?,
        burst: m.family::<post_burst>()?,
        lanes: m.family::<post_lanes>()?,
        words: comm.alloc::<u64>(128)?,
        sig: comm.alloc::<u64>(1)?,
        src: comm.alloc::<u64>(64)?,
        status: dev.alloc_zeroed::<u32>(1)?,
        out: dev.alloc_zeroed::<u64>(3 * 64)?,
        epoch: 1,
    };
    let p2p = comm.p2p()?;
    let mut rep = Report {
        device: dev.name(),
        rtt_iters: p.rtt_iters,
        wqes: p.wqes,
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
    let t0 = std::time::Instant::now();
    let note = |what: &str| {
        if comm.rank() == 0 {
            eprintln!("[{:7.2} s] {what}", t0.elapsed().as_secs_f64());
        }
    };
    for round in 0..=p.rounds {
        let warm = round == 0;
        note(&format!("round {round}: IBGDA set-up"));
        let ib = comm.ibgda()?;
        note("IBGDA: round trips, message rates");
        let rtt_ib = r.round_trip(p, ib)?;
        let rtt_p2p = r.round_trip(p, p2p)?;
        let rate_ib = r.message_rate(p, ib, 0x1b9d_a000 + round as u64)?;
        let lanes_ib = r.lane_rate(p, ib, 0x1a9e_5000 + round as u64)?;
        note("IBGDA: fused all-reduce");
        let mut ar_ib = Vec::new();
        for case in p.ar_cases() {
            ar_ib.push(fused_allreduce(comm, &m, p, TransportKind::Ibgda, case)?);
        }
        note("IBGDA closed; proxy set-up");
        comm.ibgda_close()?;
        let px = comm.proxy()?;
        note("proxy: round trips, message rates");
        let rtt_px = r.round_trip(p, px)?;
        let rate_px = r.message_rate(p, px, 0xc0de_0000 + round as u64)?;
        let lanes_px = r.lane_rate(p, px, 0xc1a9_e000 + round as u64)?;
        note("proxy: fused all-reduce");
        let mut ar_px = Vec::new();
        for case in p.ar_cases() {
            ar_px.push(fused_allreduce(comm, &m, p, TransportKind::Proxy, case)?);
        }
        stats = comm.proxy_stats().unwrap_or_default();
        comm.proxy_check()?;
        note("proxy reset");
        comm.proxy_reset()?;
        if comm.rank() == 0 {
            eprintln!(
                "round {round}{}: round trip ibgda {rtt_ib:.2} / proxy {rtt_px:.2} / p2p {rtt_p2p:.2} us; \
                 puts ibgda {rate_ib:.3} / proxy {rate_px:.3} M/s; {lb} warps ibgda {lanes_ib:.3} / proxy {lanes_px:.3} M/s",
                if warm { " (warm-up)" } else { "" },
                lb = p.lane_blocks,
            );
        }
        if !warm {
            rep.rtt_ibgda_us.push(rtt_ib);
            rep.rtt_proxy_us.push(rtt_px);
            rep.rtt_p2p_us.push(rtt_p2p);
            rep.rate_ibgda_mput_s.push(rate_ib);
            rep.rate_proxy_mput_s.push(rate_px);
            rep.lanes_ibgda_mput_s.push(lanes_ib);
            rep.lanes_proxy_mput_s.push(lanes_px);
            for (k, row) in ar_rows.iter_mut().enumerate() {
                row.ibgda_us.push(ar_ib[k].0);
                row.proxy_us.push(ar_px[k].0);
                row.checked = ar_ib[k].1;
            }
        }
    }
    rep.rtt_ibgda_median_us = median(rep.rtt_ibgda_us.clone());
    rep.rtt_proxy_median_us = median(rep.rtt_proxy_us.clone());
    rep.rtt_p2p_median_us = median(rep.rtt_p2p_us.clone());
    rep.rtt_ibgda_over_proxy = ratio(rep.rtt_ibgda_median_us, rep.rtt_proxy_median_us);
    rep.rate_ibgda_median_mput_s = median(rep.rate_ibgda_mput_s.clone());
    rep.rate_proxy_median_mput_s = median(rep.rate_proxy_mput_s.clone());
    rep.rate_ibgda_over_proxy = ratio(rep.rate_ibgda_median_mput_s, rep.rate_proxy_median_mput_s);
    (rep.lane_blocks, rep.lane_rounds) = (p.lane_blocks, p.lane_rounds);
    rep.lanes_ibgda_median_mput_s = median(rep.lanes_ibgda_mput_s.clone());
    rep.lanes_proxy_median_mput_s = median(rep.lanes_proxy_mput_s.clone());
    rep.lanes_ibgda_over_proxy = ratio(rep.lanes_ibgda_median_mput_s, rep.lanes_proxy_median_mput_s);
    let n = comm.world_size() as f64;
    for row in &mut ar_rows {
        row.ibgda_median_us = median(row.ibgda_us.clone());
        row.proxy_median_us = median(row.proxy_us.clone());
        row.ibgda_over_proxy = ratio(row.ibgda_median_us, row.proxy_median_us);
        let busbw = |us: f64| row.bytes as f64 / (us * 1e3) * 2.0 * (n - 1.0) / n;
        (row.ibgda_busbw_gbps, row.proxy_busbw_gbps) = (busbw(row.ibgda_median_us), busbw(row.proxy_median_us));
    }
    rep.allreduce = ar_rows;
    (rep.proxy_requests, rep.proxy_wqes, rep.proxy_doorbells) = (stats.requests, stats.wqes, stats.doorbells);
    comm.barrier()?;
    Ok((comm.rank() == 0).then_some(rep))
}
