//! Sum all-reduce across ranks (threads of this process), checked element
//! by element on every rank against a CPU reference; with `--bench`, an
//! nccl-tests-style sweep comparing the fused all-reduce with a CPU-driven
//! baseline, the unfused pair (producer kernel, then the all-reduce) and
//! NCCL, in the same run (`allreduce_bench.rs`).
//!
//! ```text
//! cargo run --release --example allreduce -- --help
//! cargo run --release --example allreduce -- [--ranks N] [--elems N] [--dtype f32|bf16] [--chunk BYTES]
//!     [--compute none|hash|gemv] [--algo auto|ll|one-shot|two-shot|pipelined] [--transport p2p|ibgda|routed|proxy]
//!     [--device gpu|cpu|auto] [--iters N] [--in-place] [--dump PATH] [--spread] [--threads N]
//! cargo run --release --example allreduce -- --bench [-b 8] [-e 128M] [-f 2] [-n ITERS] [--graph] [--threads N] [--out DIR] ...
//! ```
//!
//! Inputs: with `--compute none` rank `r`'s element `i` is
//! `((r*131 + i*31) mod 17) - 8`; with `--compute hash|gemv` a producer
//! computes rank `r`'s gradient for step `s` inside the fused kernel
//! (`doorbell_example_kernels::allreduce`), and its chunks are reduced as
//! they are produced. Every rank checks every element of its result, bit
//! for bit, against the CPU's sum (f32 accumulation in rank order). The
//! flags are `doorbell_examples::cli::AllreduceArgs`.

#[path = "allreduce_bench.rs"]
mod allreduce_bench;
#[path = "bench/mod.rs"]
mod bench;

use clap::Parser;
use doorbell::coll::{Algo, AllReduce, AllReduceOptions, Bf16, DType, HostElement, Placement, Plan};
use doorbell::comm::{CommOptions, Communicator};
use doorbell::ForTransport;
use doorbell_example_kernels::allreduce::{fused_grad_allreduce, grad};
use doorbell_examples::cli::{AllreduceArgs as Args, AllreduceTransport as TransportArg, Compute};
use doorbell_examples::{die, main_with, BoxError, USER_KERNELS};
use doorbell_kernels::transport::P2p;

/// The fused kernel's P2P entry (the benchmark's; the check launches the
/// family with the all-reduce's transport).
type FusedKernel = <fused_grad_allreduce as ForTransport<P2p>>::Kernel;

fn main() {
    let args = Args::parse();
    main_with(|| run(&args));
}

/// Where ranks run: (GPU?, SMs of one GPU, ranks sharing a GPU, GPUs).
type Topology = (bool, usize, usize, usize);

/// The [`Topology`] of `ranks` thread ranks.
fn topology(gpu: bool, ranks: usize, spread: bool) -> Result<Topology, BoxError> {
    if !gpu {
        return Ok((false, 1, ranks, 0));
    }
    let gpus = doorbell::gpu_count().max(1);
    let sms = doorbell::Device::gpu(0)?.multiprocessor_count();
    let per_gpu = if spread { ranks.div_ceil(gpus) } else { ranks };
    Ok((true, sms, per_gpu, gpus))
}

fn run(args: &Args) -> Result<(), BoxError> {
    if args.transport != TransportArg::P2p && args.bench {
        die("--bench measures the P2P transport; --transport ibgda|routed|proxy belongs to the checked run");
    }
    if args.compute != Compute::None && args.in_place {
        die("--in-place applies to --compute none: a fused producer writes its gradient into the pipeline, and the sum into the output");
    }
    if args.bench && args.dump.is_some() {
        die("--dump belongs to the checked run, not to --bench");
    }
    if args.min_bytes > args.max_bytes.unwrap_or(u64::MAX) {
        die("--min-bytes is larger than --max-bytes");
    }
    if args.threads.is_some() && args.compute != Compute::None {
        die("--threads sizes the library's plain all-reduce (--compute none); a fused producer runs in the example's own kernels");
    }
    let gpu = args.device.wants_gpu()?;
    let backend = args.device.backend()?;
    let mut opts = CommOptions::from_env()?;
    opts.spread_gpus |= args.spread;
    let ranks = args.ranks as usize;
    let topo = topology(gpu, ranks, opts.spread_gpus)?;
    if args.bench {
        return allreduce_bench::bench(args, backend, opts, topo);
    }
    let elems = args.elems.unwrap_or(if gpu { 1 << 24 } else { 100_003 });
    let elems = usize::try_from(elems).map_err(|_| "--elems does not fit this host")?;
    let ar_opts = AllReduceOptions {
        algo: args.algo(),
        chunk_bytes: args.chunk,
        transport: args.transport.kind(),
        // A producer computes in the all-reduce's blocks: the whole GPU.
        fused: args.compute != Compute::None,
        overlap_launch: args.overlap_launch(),
        threads: args.threads.map(|t| t as u32),
        ..Default::default()
    };
    // Bad combinations (--algo one-shot with one rank or over IBGDA, ...)
    // are bad input.
    let pointers = match args.transport {
        TransportArg::P2p => true,
        TransportArg::Ibgda | TransportArg::Proxy => false,
        TransportArg::Routed => doorbell::comm::RdmaPeers::from_env()? == doorbell::comm::RdmaPeers::Needed,
    };
    // Ranks forming nodes (DOORBELL_NODES) plan the hierarchical algorithm.
    let node_ranks = match (args.transport, doorbell::comm::RdmaPeers::from_env()?) {
        (TransportArg::Routed | TransportArg::Proxy, doorbell::comm::RdmaPeers::Nodes(n)) if n > 0 && ranks.is_multiple_of(n) => ranks / n,
        _ => 1,
    };
    let plan = Plan::new(
        ranks,
        elems,
        args.dtype(),
        &ar_opts,
        Placement {
            gpu: topo.0,
            sms: topo.1,
            ranks_per_gpu: topo.2,
            peer_pointers: pointers || ranks == 1,
            node_ranks,
        },
    )
    .unwrap_or_else(|e| die(e));
    if args.compute == Compute::None {
        plan.check_plain_launch(args.transport.kind()).unwrap_or_else(|e| die(e));
    }
    opts.heap_bytes = plan.heap_bytes() + (1 << 20);
    let start = std::time::Instant::now();
    let results = Communicator::local(ranks, backend, opts, |comm| match args.dtype() {
        DType::F32 => check_rank::<f32>(comm, args, elems, &ar_opts),
        DType::Bf16 => check_rank::<Bf16>(comm, args, elems, &ar_opts),
    })?;
    let secs = start.elapsed().as_secs_f64();
    let (algo, device) = (&results[0].algo, &results[0].device);
    let bad: u64 = results.iter().map(|r| r.mismatches).sum();
    println!(
        "allreduce: {ranks} rank(s) on {device}, {elems} {} elements per rank, {algo} over {}, chunk {} B, compute {:?}{}",
        args.dtype().name(),
        args.transport.kind().name(),
        plan.args.chunk_elems * args.dtype().size(),
        args.compute,
        if args.in_place { ", in place" } else { "" }
    );
    for r in &results {
        if let Some((i, got, want)) = &r.first_bad {
            println!(
                "  rank {}: {} element(s) differ; first at {i}: got {got}, want {want}",
                r.rank, r.mismatches
            );
        }
    }
    if let Some(path) = &args.dump {
        std::fs::write(path, &results[0].dump).map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("  wrote rank 0's result to {} ({} bytes)", path.display(), results[0].dump.len());
    }
    if bad != 0 {
        return Err(format!("{bad} element(s) differ from the CPU reference").into());
    }
    println!(
        "  checked: {} step(s) x {ranks} rank(s) x {elems} elements = {} elements, every one equal bit for bit to the CPU reference ({secs:.2} s)",
        args.iters,
        args.iters * ranks as u64 * elems as u64,
    );
    // The slowest rank's time of each step after the first (a warm-up).
    let mut slowest: Vec<f64> = (1..args.iters as usize)
        .map(|k| results.iter().map(|r| r.step_us[k]).fold(0f64, f64::max))
        .collect();
    if !slowest.is_empty() {
        slowest.sort_by(f64::total_cmp);
        println!(
            "  time per step: median {:.1} us of {} step(s) after the first (the slowest rank's; a launch each, synchronized; host wall clock)",
            slowest[slowest.len() / 2],
            slowest.len()
        );
    }
    Ok(())
}

/// One rank's checked run.
struct RankResult {
    rank: usize,
    device: String,
    algo: String,
    mismatches: u64,
    first_bad: Option<(usize, String, String)>,
    dump: Vec<u8>,
    /// µs of each step: from after a barrier to the end of its synchronize.
    step_us: Vec<f64>,
}

/// `--compute none` input: `((r*131 + i*31) mod 17) - 8`, in u64, then signed.
fn input_value(r: usize, i: usize) -> f32 {
    let v = ((r as u64).wrapping_mul(131).wrapping_add((i as u64).wrapping_mul(31)) % 17) as i64 - 8;
    v as f32
}

/// Rank `r`'s contribution to element `i` at `step`, as the element type.
fn contribution<T: HostElement>(compute: u32, r: usize, i: usize, step: u32) -> T {
    if compute == 0 {
        T::from_f32(input_value(r, i))
    } else {
        T::from_f32(grad(compute, r as u32, i as u64, step))
    }
}

/// The reference sum of element `i` over ranks `first..first + count`,
/// in `f32` in rank order, rounded once.
fn sum_of<T: HostElement>(compute: u32, first: usize, count: usize, i: usize, step: u32) -> T {
    let mut acc = contribution::<T>(compute, first, i, step).to_f32();
    for r in first + 1..first + count {
        acc += contribution::<T>(compute, r, i, step).to_f32();
    }
    T::from_f32(acc)
}

/// The reference sum of element `i` over `ranks` ranks forming nodes of
/// `node_ranks` (all of them: no nodes): each node's sum rounded, then
/// the nodes' sums in node order (the hierarchical algorithm's order).
fn want<T: HostElement>(compute: u32, ranks: usize, node_ranks: usize, i: usize, step: u32) -> T {
    if node_ranks >= ranks {
        return sum_of(compute, 0, ranks, i, step);
    }
    let mut acc = 0f32;
    for n in 0..ranks / node_ranks {
        let partial = sum_of::<T>(compute, n * node_ranks, node_ranks, i, step).to_f32();
        acc = if n == 0 { partial } else { acc + partial };
    }
    T::from_f32(acc)
}

fn to_le_bytes<T: HostElement>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * T::DTYPE.size() as usize);
    for x in v {
        match T::DTYPE {
            DType::F32 => out.extend_from_slice(&x.to_bits().to_le_bytes()),
            DType::Bf16 => out.extend_from_slice(&(x.to_bits() as u16).to_le_bytes()),
        }
    }
    out
}

fn check_rank<T: HostElement>(comm: &Communicator, args: &Args, elems: usize, opts: &AllReduceOptions) -> doorbell::Result<RankResult> {
    // Modules first: over IBGDA on a GPU the all-reduce starts the soft
    // NIC's engine kernel, and no module loads while it runs.
    let module = comm.load_module(&USER_KERNELS)?;
    // Every entry of the fused kernel, one per transport.
    let fused = module.family::<fused_grad_allreduce>()?;
    let ar = AllReduce::with_options(comm, elems, T::DTYPE, opts)?;
    let dev = comm.device();
    let stream = dev.new_stream()?;
    let me = comm.rank();
    let ranks = comm.world_size();
    let compute = args.compute_code();
    // The hierarchical algorithm sums each node's ranks first.
    let node_ranks = match ar.algo() {
        Algo::Hierarchical => ar.plan().args.node_ranks as usize,
        _ => ranks,
    };
    let mut out = dev.alloc_zeroed::<T>(elems)?;
    let mut result = RankResult {
        rank: me,
        device: if dev.is_gpu() { dev.name() } else { "the CPU emulator".into() },
        algo: ar.algo().name().to_string(),
        mismatches: 0,
        first_bad: None,
        dump: Vec::new(),
        step_us: Vec::new(),
    };
    for step in 0..args.iters as u32 {
        // The input (compute none) is made before the step's clock starts.
        let input = match compute {
            0 => Some(dev.alloc_from(&(0..elems).map(|i| contribution::<T>(0, me, i, step)).collect::<Vec<T>>())?),
            _ => None,
        };
        comm.barrier()?;
        let t0 = std::time::Instant::now();
        if let Some(mut input) = input {
            if args.in_place {
                ar.run_in_place(&stream, &mut input)?;
                comm.synchronize(&stream)?;
                out = input;
            } else {
                ar.run(&stream, &input, &mut out)?;
                comm.synchronize(&stream)?;
            }
        } else if let Some((a, cfg)) = ar.fused_args(&stream, &mut out)? {
            // SAFETY: arguments from fused_args for this world and buffer,
            // launched with the transport the all-reduce was made for.
            // The handle's transport picks the family's entry.
            unsafe { stream.launch_family(&fused, cfg, comm.transport(ar.transport())?, (a, compute, step))? };
            comm.synchronize(&stream)?;
        }
        result.step_us.push(t0.elapsed().as_secs_f64() * 1e6);
        let got = out.to_host()?;
        for (i, g) in got.iter().enumerate() {
            let w = want::<T>(compute, ranks, node_ranks, i, step);
            if g.to_bits() != w.to_bits() {
                result.mismatches += 1;
                if result.first_bad.is_none() {
                    result.first_bad = Some((i, format!("{g:?}"), format!("{w:?}")));
                }
            }
        }
        if step as u64 + 1 == args.iters && me == 0 && args.dump.is_some() {
            result.dump = to_le_bytes(&got);
        }
    }
    Ok(result)
}
