//! The all-reduce's benchmark (`--bench`): times, per size from `-b` (8 B)
//! to `-e` (`--max-bytes`), times `-f` (2) from one size to the next, as
//! nccl-tests does: (a) the fused all-reduce (automatic algorithm; chunk
//! sizes 16 KiB .. 4 MiB, the best one reported), (b) a CPU-driven
//! baseline — the same work as one producer launch and one all-reduce
//! launch per chunk, as a host-driven library does, (c) unfused — the
//! producer kernel over the whole vector, then `AllReduce::run` (automatic
//! algorithm), (d) NCCL's `ncclAllReduce` on the same buffers and streams,
//! after the same producer kernel, when `libnccl.so.2` loads and every rank
//! has a GPU of its own (NCCL refuses several ranks on one GPU). Every
//! variant is timed the same way: a host loop of launches between two
//! events (`--graph`: replays of a captured CUDA graph), the slowest rank's
//! time; with two or more ranks on one GPU, one launch in flight per
//! rank, each timed by its own events (the shared harness, `bench/`).
//! Writes `allreduce_bench.json`, `.png` and `.svg` (bus bandwidth beside
//! time per all-reduce) into `--out`. Inputs and reference are the checked
//! run's (`contribution`, `want`).

use doorbell::coll::{Algo, AllReduce, AllReduceOptions, Bf16, DType, HostElement, Placement, Plan, MAX_THREADS};
use doorbell::comm::{one_launch_in_flight, CommOptions, Communicator};
use doorbell::{DeviceBuffer, DeviceCopy, ForTransport, Function, LaunchConfig, Module, Stream};
use doorbell_example_kernels::allreduce::{fused_grad_allreduce_512, fused_grad_allreduce_512x2, produce_grad};
use doorbell_example_kernels::comm::hold_stream;
use doorbell_examples::cli::{sweep, Compute};
use doorbell_examples::nccl;
use doorbell_examples::plot::{Chart, Series};
use doorbell_examples::{BoxError, USER_KERNELS};
use doorbell_kernels::transport::P2p;

use super::bench::{self, Table, Timing};
use super::{contribution, want, Args, FusedKernel, Topology};

type Fused512 = <fused_grad_allreduce_512 as ForTransport<P2p>>::Kernel;
type Fused512x2 = <fused_grad_allreduce_512x2 as ForTransport<P2p>>::Kernel;

/// One measurement.
#[derive(Clone, Debug, serde::Serialize)]
struct Row {
    /// Bytes per rank.
    size: u64,
    /// Elements per rank.
    count: u64,
    #[serde(rename = "type")]
    dtype: &'static str,
    /// fused, cpu-driven, unfused, nccl, producer (the producer kernel alone).
    variant: String,
    /// Chunk bytes (fused, cpu-driven), else 0.
    chunk: u64,
    /// The algorithm of our all-reduce in this variant.
    algo: String,
    /// Microseconds per all-reduce (slowest rank).
    time_us: f64,
    /// size / time, GB/s.
    algbw: f64,
    /// algbw * 2 (ranks - 1) / ranks, GB/s.
    busbw: f64,
    /// Elements compared with the reference on every rank (sampled).
    checked: u64,
}

#[derive(serde::Serialize)]
struct Report {
    device: String,
    ranks: usize,
    placement: String,
    dtype: &'static str,
    compute: String,
    timing: &'static str,
    notes: Vec<String>,
    rows: Vec<Row>,
}

/// Most symmetric bytes one fused variant may use, over the ranks sharing a GPU.
const RING_BUDGET: u64 = 16 << 30;
const FUSED_CHUNKS: [u64; 5] = [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
const TIMING: &str = "a host loop of launches between two events on each rank's stream (ours and NCCL's alike), after warm-up; the slowest rank's time per all-reduce";
const TIMING_GRAPH: &str = "CUDA graphs: each variant's timed launches captured once on each rank's stream and replayed between two events (ours and NCCL's alike; the CPU-driven baseline stays a host loop), after warm-up; the slowest rank's time per all-reduce";

const TIMING_ONE: &str = "one launch in flight per rank: each launch (the CPU-driven baseline: each chunk's launches) waited for before the next, the ranks meeting at a barrier and holding their streams 200 us before its first event, and timed between its own two events, after warm-up; the slowest rank's mean time per all-reduce";
const TIMING_GRAPH_ONE: &str = "CUDA graphs of one launch, one in flight per rank: each replay waited for before the next, the ranks meeting at a barrier and holding their streams 200 us before its first event, and timed between its own two events (the CPU-driven baseline stays a host loop), after warm-up; the slowest rank's mean time per all-reduce";

/// How the bench times: `--graph` on a GPU, else a host loop; one launch
/// at a time when two or more ranks share a GPU.
fn timing(args: &Args, gpu: bool, per_gpu: usize) -> &'static str {
    match (args.graph && gpu, one_launch_in_flight(gpu, per_gpu)) {
        (true, false) => TIMING_GRAPH,
        (false, false) => TIMING,
        (true, true) => TIMING_GRAPH_ONE,
        (false, true) => TIMING_ONE,
    }
}

/// The notes the report starts with: the emulator, NCCL, launch overlap,
/// ranks sharing a GPU.
fn notes(args: &Args, topo: Topology, nccl: &Result<nccl::Library, String>) -> Result<Vec<String>, BoxError> {
    let (gpu, sms, per_gpu, _) = topo;
    let mut notes = Vec::new();
    if !gpu {
        notes.push("CPU emulator: every GPU thread is an OS thread; the times say nothing about a GPU (this run checks that the benchmark works end to end)".to_string());
    }
    notes.push(nccl::baseline_note(nccl));
    // What the library makes of --launch-overlap here (a plan says).
    let overlap_opts = AllReduceOptions {
        overlap_launch: args.overlap_launch(),
        ..Default::default()
    };
    let overlap = Plan::new(
        args.ranks as usize,
        1,
        args.dtype(),
        &overlap_opts,
        Placement {
            gpu,
            sms,
            ranks_per_gpu: per_gpu,
            peer_pointers: true,
            node_ranks: 1,
        },
    )?
    .overlap;
    notes.push(format!(
        "launch overlap (programmatic dependent launch) of our plain all-reduces: {}",
        if overlap && gpu { "on" } else { "off" }
    ));
    if one_launch_in_flight(gpu, per_gpu) {
        notes.push(format!(
            "{per_gpu} ranks share a GPU: one launch in flight per rank (README, \"Ranks sharing a GPU\")"
        ));
    }
    Ok(notes)
}

/// The table's line for one size: the best row of each variant.
fn table_row(table: &Table, bytes: u64, count: usize, dtype: DType, rows: &[Row]) -> String {
    let best = |v: &str| {
        rows.iter()
            .filter(|r| r.variant == v)
            .min_by(|a, b| a.time_us.total_cmp(&b.time_us))
    };
    let cell = |v: &str| best(v).map_or("-".into(), |r| format!("{:>10.2} {:>7.2} {:>7.2}", r.time_us, r.algbw, r.busbw));
    let producer = best("producer").map_or("-".into(), |r| format!("{:.2}", r.time_us));
    let by_chunk: Vec<String> = rows
        .iter()
        .filter(|r| r.variant == "fused")
        .map(|r| format!("{}K {} {:.2}", r.chunk >> 10, r.algo, r.time_us))
        .collect();
    let head = [bytes.to_string(), count.to_string(), dtype.name().to_string()];
    let variants = ["fused", "cpu-driven", "unfused", "nccl"].map(cell);
    table.row(&[&head[..], &variants[..], &[producer, by_chunk.join(", ")]].concat())
}

/// The benchmark: see the module docs.
pub fn bench(args: &Args, backend: doorbell::Backend, opts: CommOptions, topo: Topology) -> Result<(), BoxError> {
    let (gpu, _, per_gpu, gpus) = topo;
    let ranks = args.ranks as usize;
    let dtype = args.dtype();
    let max_bytes = args.max_bytes.unwrap_or(if gpu { 1 << 30 } else { 64 << 10 });
    let nccl = nccl::baseline(gpu, per_gpu);
    let notes = notes(args, topo, &nccl)?;
    for n in &notes {
        eprintln!("note: {n}");
    }
    let placement = if !gpu {
        "emulator".to_string()
    } else if per_gpu > 1 {
        format!("{ranks} thread ranks on {} GPU(s)", ranks.div_ceil(per_gpu).min(gpus))
    } else {
        format!("{ranks} thread ranks, one per GPU")
    };
    let sizes = sweep(args.min_bytes.max(dtype.size()).next_power_of_two(), max_bytes, args.step_factor);
    let timing = timing(args, gpu, per_gpu);
    println!(
        "# allreduce bench: {placement}, {} sum, compute {:?}; {timing}",
        dtype.name(),
        args.compute
    );
    let table = ["fused", "cpu-driven", "unfused", "nccl"]
        .into_iter()
        .fold(
            Table::new().prefixes("# ", "  ").col("size", 12).col("count", 11).col("type", 5),
            |t, v| t.bar().col(&format!("{v}: us algbw busbw"), 26),
        )
        .bar()
        .col("producer: us", 12)
        .bar()
        .col("fused us by chunk", 0);
    println!("{}", table.heading());
    let mut rows: Vec<Row> = Vec::new();
    for &bytes in &sizes {
        let count = (bytes / dtype.size()) as usize;
        let size_rows = bench_size(args, backend, &opts, topo, count, nccl.is_ok())?;
        println!("{}", table_row(&table, bytes, count, dtype, &size_rows));
        rows.extend(size_rows);
    }
    let device = if gpu {
        doorbell::Device::gpu(0)?.name()
    } else {
        "CPU emulator".into()
    };
    let compute = format!("{:?}", args.compute).to_lowercase();
    let title = format!("all-reduce busbw, {placement}, {} {compute}", dtype.name());
    // Per variant and size: the best busbw and the best time (over chunks).
    let series = |f: fn(&Row) -> f64, best: fn(f64, f64) -> f64| -> Vec<Series> {
        let points = |v: &str| -> Vec<(f64, f64)> {
            let at = |s: u64| rows.iter().filter(|r| r.size == s && r.variant == v).map(f).reduce(best);
            sizes.iter().filter_map(|&s| at(s).map(|y| (s as f64, y))).collect()
        };
        let named = ["fused", "cpu-driven", "unfused", "nccl"].map(|name| Series {
            name,
            points: points(name),
        });
        named.into_iter().filter(|s| !s.points.is_empty()).collect()
    };
    let (bw, time) = (series(|r| r.busbw, f64::max), series(|r| r.time_us, f64::min));
    let chart = Chart {
        title: &title,
        x_label: "bytes per rank",
        y_label: "busbw (GB/s)",
        series: &bw,
    };
    let report = Report {
        device,
        ranks,
        placement,
        dtype: dtype.name(),
        compute,
        timing,
        notes,
        rows,
    };
    let json = bench::write_json(&args.out, "allreduce_bench.json", &report)?;
    let (png, svg) = bench::write_figure(&args.out, "allreduce_bench", &chart, &time)?;
    println!("# wrote {}, {} and {}", json.display(), png.display(), svg.display());
    Ok(())
}

/// The timed launches per variant at `bytes`.
fn iters_for(args: &Args, gpu: bool, bytes: u64) -> (u64, u64) {
    if let Some(n) = args.bench_iters {
        return (n.min(5), n);
    }
    if !gpu {
        return (1, 2);
    }
    (5, ((1u64 << 32) / bytes.max(1)).clamp(5, 200))
}

/// All variants at one size, in a communicator of their own (its heap sized
/// for them).
fn bench_size(
    args: &Args,
    backend: doorbell::Backend,
    opts: &CommOptions,
    topo: Topology,
    count: usize,
    nccl: bool,
) -> Result<Vec<Row>, BoxError> {
    let (gpu, sms, per_gpu, _) = topo;
    let ranks = args.ranks as usize;
    let dtype = args.dtype();
    let bytes = count as u64 * dtype.size();
    let chunks: Vec<u64> = FUSED_CHUNKS
        .iter()
        .copied()
        .filter(|&c| c <= bytes.max(FUSED_CHUNKS[0]))
        .take(if gpu { 5 } else { 2 })
        .collect();
    let base_chunk = args.chunk.unwrap_or(256 << 10);
    // Heap: every plan of this size.
    let plan = |o: AllReduceOptions, n: usize| {
        Plan::new(
            ranks,
            n,
            dtype,
            &o,
            Placement {
                gpu,
                sms,
                ranks_per_gpu: per_gpu,
                peer_pointers: true,
                node_ranks: 1,
            },
        )
    };
    // Rings of the largest chunks can outgrow a GPU shared by many ranks:
    // keep each fused variant's buffers under RING_BUDGET per rank.
    // Fused variants: per chunk, the kernel's width — blocks of 256 threads
    // (its full register budget), and with a producer on a GPU the
    // launch-bounded kernels: one block of 512 per SM (128 registers), two
    // (64 registers, more spilled): more warps for the producer.
    let widths: &[Width] = if gpu && args.compute != Compute::None {
        &[Width::Threads256, Width::Threads512, Width::Threads512x2]
    } else {
        &[Width::Default]
    };
    // Two blocks per SM for 512x2: twice the plan's grid of one per SM
    // (the rank's share; on a shared GPU all ranks' grids fill at most half
    // of it, so every block of every rank stays resident).
    let one_per_sm = |c: u64| plan(fused_opts(c, Width::Threads512, 0, None), count).map_or(1, |p| p.launch_config().grid.0);
    let mut variants: Vec<(u64, Width, AllReduceOptions)> = chunks
        .iter()
        .flat_map(|&c| {
            widths
                .iter()
                .map(move |&w| (c, w, fused_opts(c, w, one_per_sm(c), args.overlap_launch())))
        })
        .collect();
    variants.retain(|(_, _, o)| plan(o.clone(), count).is_ok_and(|p| p.heap_bytes() <= RING_BUDGET / per_gpu.max(1) as u64));
    let mut heap = 1 << 20;
    for (_, _, o) in &variants {
        heap += plan(o.clone(), count)?.heap_bytes();
    }
    // The plain all-reduce: --threads where its plan is two-shot.
    let mut plain = AllReduceOptions {
        algo: args.algo(),
        overlap_launch: args.overlap_launch(),
        ..Default::default()
    };
    if let Some(t) = args.threads {
        let wide = AllReduceOptions {
            threads: Some(t as u32),
            ..plain.clone()
        };
        if plan(wide.clone(), count)?.algo() == Algo::TwoShot {
            plain = wide;
        }
    }
    heap += plan(plain.clone(), count)?.heap_bytes();
    let per_chunk = (base_chunk / dtype.size()).max(1) as usize;
    heap += plan(AllReduceOptions::default(), per_chunk.min(count))?.heap_bytes() * 2;
    let mut opts = opts.clone();
    opts.heap_bytes = heap;
    let p = SizePlan {
        count,
        variants,
        plain,
        per_chunk,
        nccl,
    };
    let per_rank = Communicator::local(ranks, backend, opts, |comm| {
        let r = match dtype {
            DType::F32 => bench_rank::<f32>(comm, args, &p),
            DType::Bf16 => bench_rank::<Bf16>(comm, args, &p),
        };
        r.map_err(|e| doorbell::Error::Comm(format!("rank {}: {e}", comm.rank())))
    })?;
    Ok(per_rank.into_iter().next().unwrap_or_default())
}

/// Which fused kernel, and its grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Width {
    /// The plan's defaults (the emulator; no producer).
    Default,
    /// `fused_grad_allreduce`, 256 threads, one block per SM.
    Threads256,
    /// `fused_grad_allreduce_512`, 512 threads, one block per SM.
    Threads512,
    /// `fused_grad_allreduce_512x2`, 512 threads, two blocks per SM.
    Threads512x2,
}

impl Width {
    fn label(self) -> &'static str {
        match self {
            Width::Default => "",
            Width::Threads256 => "/256",
            Width::Threads512 => "/512",
            Width::Threads512x2 => "/512x2",
        }
    }
}

/// A fused variant's plan; `one_per_sm` is the grid of one block per SM
/// of the rank's share.
fn fused_opts(chunk: u64, width: Width, one_per_sm: u32, overlap_launch: Option<bool>) -> AllReduceOptions {
    let (threads, blocks) = match width {
        Width::Default => (None, None),
        Width::Threads256 => (Some(256), None),
        Width::Threads512 => (Some(512), None),
        Width::Threads512x2 => (Some(512), Some(2 * one_per_sm.max(1))),
    };
    AllReduceOptions {
        chunk_bytes: Some(chunk),
        fused: true,
        overlap_launch,
        threads,
        blocks,
        ..Default::default()
    }
}

/// Elements compared per check: all up to 64 Ki, else a strided sample
/// (every element of the first and last 4 Ki, every 4099th between).
fn sample(count: usize) -> Vec<usize> {
    if count <= 1 << 16 {
        return (0..count).collect();
    }
    let mut v: Vec<usize> = (0..4096).collect();
    v.extend((4096..count - 4096).step_by(4099));
    v.extend(count - 4096..count);
    v
}

/// One rank's buffers and kernels at one size, and how it times them.
struct RankBench<'a, T: DeviceCopy> {
    comm: &'a Communicator,
    stream: Stream,
    count: usize,
    compute: u32,
    timing: Timing,
    samples: Vec<usize>,
    input: DeviceBuffer<T>,
    work: DeviceBuffer<T>,
    out: DeviceBuffer<T>,
    module: Module,
    produce_fn: Function<produce_grad>,
    produce_cfg: LaunchConfig,
    /// Holds the stream before a timed launch where one launch is in
    /// flight (GPU only).
    hold: Option<Function<hold_stream>>,
}

impl<'a, T: HostElement> RankBench<'a, T> {
    fn new(comm: &'a Communicator, args: &Args, count: usize) -> Result<Self, BoxError> {
        let dev = comm.device();
        let stream = dev.new_stream()?;
        let module = comm.load_module(&USER_KERNELS)?;
        let produce_fn = module.function::<produce_grad>()?;
        let hold = if dev.is_gpu() {
            Some(module.function::<hold_stream>()?)
        } else {
            None
        };
        let (warmup, iters) = iters_for(args, dev.is_gpu(), count as u64 * T::DTYPE.size());
        let host_input: Vec<T> = (0..count).map(|i| contribution::<T>(0, comm.rank(), i, 0)).collect();
        let threads = if dev.is_gpu() { 256 } else { 64 };
        let blocks = if dev.is_gpu() {
            (count as u64).div_ceil(threads as u64).clamp(1, 1024) as u32
        } else {
            2
        };
        Ok(RankBench {
            comm,
            count,
            compute: args.compute_code(),
            timing: Timing {
                warmup,
                iters,
                graph: args.graph,
            },
            samples: sample(count),
            input: dev.alloc_from(&host_input)?,
            work: dev.alloc_zeroed::<T>(count)?,
            out: dev.alloc_zeroed::<T>(count)?,
            stream,
            module,
            produce_fn,
            produce_cfg: LaunchConfig::linear(blocks, threads),
            hold,
        })
    }

    /// The producer kernel: elements `first..first + n` of step 0 into `dst`.
    fn produce(&self, dst: u64, first: u64, n: u64) -> doorbell::Result<()> {
        let a = (
            dst as *mut u8,
            T::DTYPE as u32,
            first,
            n,
            self.comm.rank() as u32,
            self.compute,
            0u32,
        );
        // SAFETY: `dst` holds `n` elements of the dtype.
        unsafe { self.stream.launch(&self.produce_fn, self.produce_cfg, a) }
    }

    /// Where each variant's all-reduce reads: the input formula (compute
    /// none), or the producer's output in `work`.
    fn src(&self) -> u64 {
        if self.compute == 0 {
            self.input.as_raw()
        } else {
            self.work.as_raw()
        }
    }

    /// Times `run` (the harness: warm-up, then a host loop or graph replays;
    /// the CPU-driven baseline never as a graph), takes the slowest rank's
    /// time and, where `checked`, compares a sample of every rank's output
    /// with the reference.
    fn measure(
        &self,
        variant: &str,
        chunk: u64,
        algo: &str,
        checked: bool,
        run: &mut dyn FnMut() -> doorbell::Result<()>,
    ) -> Result<Row, BoxError> {
        let comm = self.comm;
        let timing = Timing {
            graph: self.timing.graph && variant != "cpu-driven",
            ..self.timing
        };
        let us = bench::time_launches(comm, &self.stream, &timing, self.hold.as_ref(), variant, run)?;
        let all = comm.world().all_gather_bytes(&us.to_le_bytes())?;
        let slowest = doorbell_examples::slowest(&all, "the time per launch")?;
        let (ranks, step) = (comm.world_size(), 0);
        let bad = match checked {
            true => {
                let got = self.out.to_host()?;
                let want = |i: usize| want::<T>(self.compute, ranks, ranks, i, step).to_bits();
                self.samples.iter().filter(|&&i| got[i].to_bits() != want(i)).count()
            }
            false => 0,
        };
        if bad != 0 {
            let n = self.samples.len();
            return Err(format!("{variant} (chunk {chunk}): {bad} of {n} sampled elements differ from the reference").into());
        }
        let bytes = self.count as u64 * T::DTYPE.size();
        let algbw = bytes as f64 / (slowest * 1e-6) / 1e9;
        Ok(Row {
            size: bytes,
            count: self.count as u64,
            dtype: T::DTYPE.name(),
            variant: variant.to_string(),
            chunk,
            algo: algo.to_string(),
            time_us: slowest,
            algbw,
            busbw: algbw * 2.0 * (ranks as f64 - 1.0) / ranks as f64,
            checked: if checked { self.samples.len() as u64 } else { 0 },
        })
    }

    /// (a) fused, per chunk size and block width.
    fn fused(&self, variants: &[(u64, Width, AllReduceOptions)]) -> Result<Vec<Row>, BoxError> {
        let (comm, s, compute, out) = (self.comm, &self.stream, self.compute, self.out.as_raw());
        let (f256, f512, f512x2) = (
            self.module.function::<FusedKernel>()?,
            self.module.function::<Fused512>()?,
            self.module.function::<Fused512x2>()?,
        );
        let mut rows = Vec::new();
        for &(c, width, ref o) in variants {
            let ar = AllReduce::with_options(comm, self.count, T::DTYPE, o)?;
            let mut run = || -> doorbell::Result<()> {
                if compute == 0 {
                    // SAFETY: both hold `count` elements of the dtype.
                    return unsafe { ar.run_raw(s, self.input.as_raw(), out) };
                }
                // SAFETY: as above.
                let Some((a, cfg)) = (unsafe { ar.fused_args_raw(s, out) })? else {
                    return Ok(());
                };
                let args = (comm.p2p()?, a, compute, 0u32);
                // SAFETY: arguments from fused_args for this world; the
                // 512-thread kernels for the plans of 512 threads.
                unsafe {
                    match width {
                        Width::Threads512 => s.launch(&f512, cfg, args),
                        Width::Threads512x2 => s.launch(&f512x2, cfg, args),
                        _ => s.launch(&f256, cfg, args),
                    }
                }
            };
            let label = format!("{}{}", ar.algo().name(), width.label());
            rows.push(self.measure("fused", c, &label, true, &mut run)?);
        }
        Ok(rows)
    }

    /// (b) CPU-driven: one producer launch and one all-reduce launch per chunk.
    fn cpu_driven(&self, per_chunk: usize, overlap_launch: Option<bool>) -> Result<Row, BoxError> {
        let (comm, count, esz) = (self.comm, self.count, T::DTYPE.size());
        let opts = AllReduceOptions {
            overlap_launch,
            ..Default::default()
        };
        let full = AllReduce::with_options(comm, per_chunk.min(count), T::DTYPE, &opts)?;
        let tail_len = count % per_chunk;
        let tail = match tail_len != 0 && count > per_chunk {
            true => Some(AllReduce::with_options(comm, tail_len, T::DTYPE, &opts)?),
            false => None,
        };
        let (src, out) = (self.src(), self.out.as_raw());
        let mut run = || -> doorbell::Result<()> {
            let mut first = 0usize;
            while first < count {
                let n = per_chunk.min(count - first);
                let ar = if n == per_chunk.min(count) {
                    &full
                } else {
                    tail.as_ref().expect("tail")
                };
                let off = first as u64 * esz;
                if self.compute != 0 {
                    self.produce(self.work.as_raw() + off, first as u64, n as u64)?;
                }
                // SAFETY: both ranges hold `n` elements.
                unsafe { ar.run_raw(&self.stream, src + off, out + off)? };
                if comm.one_launch_in_flight() {
                    comm.synchronize(&self.stream)?;
                }
                first += n;
            }
            Ok(())
        };
        self.measure("cpu-driven", per_chunk as u64 * esz, full.algo().name(), true, &mut run)
    }

    /// The producer alone (where the time of the others goes), then (c)
    /// unfused: the producer, then the all-reduce (`--algo`, else by size).
    fn unfused(&self, plain: &AllReduceOptions) -> Result<Vec<Row>, BoxError> {
        let (count, work, compute) = (self.count as u64, self.work.as_raw(), self.compute);
        let mut rows = Vec::new();
        if compute != 0 {
            rows.push(self.measure("producer", 0, "-", false, &mut || self.produce(work, 0, count))?);
        }
        let ar = AllReduce::with_options(self.comm, self.count, T::DTYPE, plain)?;
        let mut run = || -> doorbell::Result<()> {
            if compute != 0 {
                self.produce(work, 0, count)?;
            }
            // SAFETY: both hold `count` elements.
            unsafe { ar.run_raw(&self.stream, self.src(), self.out.as_raw()) }
        };
        // The block size where it is not the 256 every entry fits.
        let label = match ar.plan().threads {
            t if self.comm.device().is_gpu() && t != MAX_THREADS => format!("{} {t}t", ar.algo().name()),
            _ => ar.algo().name().to_string(),
        };
        rows.push(self.measure("unfused", 0, &label, true, &mut run)?);
        Ok(rows)
    }

    /// (d) NCCL on the same buffers and stream, after the same producer.
    fn nccl(&self) -> Result<Row, BoxError> {
        let ncomm = nccl::Comm::new(self.comm, &self.stream)?;
        let (count, work) = (self.count, self.work.as_raw());
        let mut run = || -> doorbell::Result<()> {
            if self.compute != 0 {
                self.produce(work, 0, count as u64)?;
            }
            ncomm.all_reduce(self.src(), self.out.as_raw(), count, T::DTYPE, &self.stream)
        };
        let r = self.measure("nccl", 0, "nccl", true, &mut run);
        // ncclCommDestroy, measured or not.
        drop(ncomm);
        r
    }
}

/// What one size runs: its element count, the fused variants, the plain
/// all-reduce's options, the CPU-driven baseline's chunk (elements), and
/// whether NCCL runs.
struct SizePlan {
    count: usize,
    variants: Vec<(u64, Width, AllReduceOptions)>,
    plain: AllReduceOptions,
    per_chunk: usize,
    nccl: bool,
}

/// Everything one rank runs at one size; rank 0's rows (times are the
/// slowest rank's).
fn bench_rank<T: HostElement>(comm: &Communicator, args: &Args, p: &SizePlan) -> Result<Vec<Row>, BoxError> {
    let rb = RankBench::<T>::new(comm, args, p.count)?;
    let mut rows = rb.fused(&p.variants)?;
    rows.push(rb.cpu_driven(p.per_chunk, args.overlap_launch())?);
    rows.extend(rb.unfused(&p.plain)?);
    if p.nccl {
        rows.push(rb.nccl()?);
    }
    Ok(if comm.rank() == 0 { rows } else { Vec::new() })
}
