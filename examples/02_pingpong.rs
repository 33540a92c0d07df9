//! 02 — ping-pong between two ranks with GPU-initiated puts and signals.
//!
//! ```text
//! cargo run --release --example pingpong -- --help
//! cargo run --release --example pingpong -- [--device gpu|cpu|auto] [--transport p2p|ibgda] [--iters N] [--size BYTES|4K|1M]
//! ```
//! Two ranks as threads of this process by default. One rank per process
//! when `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` are set (as
//! torchrun does); the processes prove they belong to the same job with the
//! secret in `DOORBELL_TOKEN`:
//! ```text
//! export DOORBELL_TOKEN=$(head -c16 /dev/urandom | xxd -p) MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2
//! RANK=0 ./pingpong & RANK=1 ./pingpong
//! ```
//! Rank 0 puts `--size` bytes into rank 1's symmetric buffer and signals;
//! rank 1 waits, puts them back and signals; repeated `--iters` times inside
//! one kernel launch. It prints the round-trip time and the bandwidth
//! (2 × size per round trip), and checks the data that came back. Ranks
//! launched with different `--iters` or `--size` all fail, with one message
//! showing each rank's values; a rank that fails tells the others at once
//! (they exit non-zero within seconds, naming it).

#[path = "bench/mod.rs"]
mod bench;

use bench::run_ranks;
use clap::Parser;
use doorbell::comm::{CommOptions, Communicator};
use doorbell::{Backend, LaunchConfig};
use doorbell_example_kernels::comm::{pingpong, PINGPONG_OK};
use doorbell_examples::cli::{PingpongArgs, Transport};
use doorbell_examples::{main_with, BoxError};

struct Opts {
    backend: Backend,
    iters: u32,
    size: u64,
    transport: Transport,
}

fn main() {
    let args = PingpongArgs::parse();
    main_with(|| run(&args));
}

fn run(args: &PingpongArgs) -> Result<(), BoxError> {
    let opts = Opts {
        backend: args.device.backend()?,
        // Range-checked by the parser (1..=u32::MAX).
        iters: args.iters as u32,
        size: args.size,
        transport: args.transport,
    };
    let comm_opts = CommOptions {
        heap_bytes: args.heap_bytes(),
        ..CommOptions::from_env()?
    };
    // Two thread ranks, or this process's rank of a launcher's world.
    let ran = run_ranks("pingpong", 2, None, opts.backend, comm_opts, |comm| Ok(run_rank(comm, &opts)?))?;
    if let Some(line) = ran.results.into_iter().flatten().next() {
        println!("{line}");
    }
    Ok(())
}

fn run_rank(comm: &Communicator, o: &Opts) -> doorbell::Result<Option<String>> {
    let dev = comm.device();
    if comm.world_size() < 2 {
        return Err(doorbell::Error::Comm("pingpong needs at least 2 ranks".into()));
    }
    comm.world().check_same_params(&[("iters", o.iters as u64), ("size", o.size)])?;
    let module = comm.load_module(&doorbell_examples::USER_KERNELS)?;
    // The kernel's entries, one per transport it is exported for; the
    // handle picks one at launch (IBGDA: the same body's RDMA
    // instantiation; its set-up is collective).
    let family = module.family::<pingpong>()?;
    let t = comm.transport(o.transport.kind())?;
    let (max_blocks, mut threads) = if dev.is_gpu() { (32u64, 512u32) } else { (2, 32) };
    // A block no larger than the entry's registers allow (the IBGDA
    // instantiation holds more registers per thread than the P2P one).
    if let Some(a) = family.attributes(&t)? {
        threads = threads.min((a.max_threads_per_block.max(32) as u32) / 32 * 32);
    }
    let blocks = o.size.div_ceil(256 << 10).clamp(1, max_blocks);
    let chunk = o.size.div_ceil(blocks).div_ceil(16) * 16;
    let buf = comm.alloc::<u8>(o.size.max(16) as usize)?;
    let sig = comm.alloc::<u64>(blocks as usize)?;
    let mut out_ns = dev.alloc_zeroed::<u64>(blocks as usize)?;
    let mut status = dev.alloc_zeroed::<u32>(blocks as usize)?;
    let pattern: Vec<u8> = (0..o.size.max(16)).map(|i| (i as u8).wrapping_mul(31).wrapping_add(7)).collect();
    if comm.rank() == 0 {
        buf.copy_from_host(&pattern)?;
    }
    let stream = dev.new_stream()?;
    let cfg = LaunchConfig::linear(blocks as u32, threads);
    let mut epoch = 0u64;
    let mut launch = |iters: u32, epoch: &mut u64| -> doorbell::Result<()> {
        comm.barrier()?;
        let (bp, sp, e) = (buf.as_mut_ptr(), sig.as_mut_ptr(), *epoch);
        let (ns, st) = (out_ns.as_mut_ptr(), status.as_mut_ptr());
        // SAFETY: `buf` holds `size` bytes and `sig` one word per block on
        // every rank; `out_ns`/`status` one entry per block.
        unsafe { stream.launch_family(&family, cfg, t, (bp, o.size, chunk, sp, e, iters, ns, st))? };
        comm.synchronize(&stream)?;
        *epoch += iters as u64;
        Ok(())
    };
    launch(o.iters.min(10), &mut epoch)?; // warm-up
    launch(o.iters, &mut epoch)?;
    comm.barrier()?;
    let st = status.to_host()?;
    if comm.rank() > 1 {
        return Ok(None);
    }
    if st.iter().any(|&s| s != PINGPONG_OK) {
        return Err(doorbell::Error::Comm(format!(
            "rank {}: a block did not finish (status {st:?})",
            comm.rank()
        )));
    }
    let got = buf.to_host()?;
    let n = o.size as usize;
    if got[..n] != pattern[..n] {
        let bad = got.iter().zip(&pattern).position(|(a, b)| a != b).unwrap_or(0);
        return Err(doorbell::Error::Comm(format!("rank {}: data differs at byte {bad}", comm.rank())));
    }
    if comm.rank() != 0 {
        return Ok(None);
    }
    let ns = out_ns.to_host()?.into_iter().max().unwrap_or(0) as f64;
    let rtt_us = ns / o.iters as f64 / 1e3;
    let gbps = if o.size > 0 {
        2.0 * o.size as f64 / (rtt_us * 1e-6) / 1e9
    } else {
        0.0
    };
    Ok(Some(format!(
        "pingpong: {} ranks on {} ({:?}), transport {:?}, route to peer: {:?}, {} bytes x {} iters, {} block(s) x {threads} threads\n\
         round trip: {rtt_us:.3} us, bandwidth: {gbps:.2} GB/s (2 x size per round trip)\n\
         checked: the {} bytes rank 0 sent came back unchanged",
        comm.world_size(),
        dev.name(),
        dev.backend(),
        o.transport,
        comm.describe_peers()[1],
        o.size,
        o.iters,
        blocks,
        o.size
    )))
}
