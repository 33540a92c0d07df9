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
//! The measurements are here; the tables and files, with their columns as
//! earlier outputs have them, are in `p2p_bench_report.rs`.

#[path = "bench/mod.rs"]
mod bench;
#[path = "p2p_bench_report.rs"]
mod report;

use std::time::Duration;

use bench::{interleaved, time_on_rank0, Peers, Stat};
use clap::Parser;
use doorbell::comm::{CommOptions, Communicator};
use doorbell::{LaunchConfig, Stream};
use doorbell_example_kernels::comm::{
    copy_pieces, copy_raw, flag_pingpong_pair, hold_stream, put_bw_p2p as put_bw, signal_pingpong_p2p as signal_pingpong,
    signal_pingpong_unchecked, PINGPONG_OK,
};
use doorbell_examples::cli::{P2pBenchArgs, P2pBenchPlan};
use doorbell_examples::{main_with, BoxError};
use report::{Row, Rtt};

fn main() {
    let args = P2pBenchArgs::parse();
    main_with(|| run(&args));
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
    let env = CommOptions::from_env()?;
    let opts = CommOptions {
        heap_bytes: plan.heap_bytes,
        wait_timeout: Duration::from_secs(30),
        spread_gpus: args.spread || env.spread_gpus,
        ..env
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
    report::report(args, &plan, &rtt, rows, &name, &route, gpu)
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
    let rank0 = comm.rank() == 0;
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
        // With `during` rank 1 launches first; with `after` once rank 0's
        // timed launch has finished (the put, signal included, is then
        // done: the wait only confirms it).
        let peer = if args.peer_waits == "during" {
            Peers::LaunchFirst
        } else {
            Peers::LaunchAfter
        };
        let mut put_once = |n: u32| -> doorbell::Result<f64> {
            expect += blocks;
            let warp = (args.put_by == "warp") as u32;
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
            // SAFETY: buffers hold max_bytes >= bytes; `psig` symmetric, `status` one word.
            let launch = || unsafe {
                let args = (comm.p2p()?, a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7, status.as_mut_ptr());
                s.launch(&put, cfg, args)
            };
            let us = time_on_rank0(comm, s, hold.as_ref(), n, peer, launch)?;
            comm.synchronize(s)?;
            if status.to_host()?[0] != PINGPONG_OK {
                return Err(doorbell::Error::Comm(format!("put of {bytes} bytes did not complete")));
            }
            if wrong.is_none() {
                wrong = Some(count_wrong(comm, bytes, || dst.to_host())?);
            }
            Ok(us)
        };
        // A copy floor on rank 0. Rank 1 only keeps step, so its next put
        // waiter is not launched inside the floor's timed window.
        let floor_once = |pieces_floor: bool, n: u32| {
            // SAFETY: `target` and `src` hold max_bytes >= bytes, 16-byte aligned.
            time_on_rank0(comm, s, hold.as_ref(), n, Peers::Idle, || unsafe {
                match pieces_floor {
                    true => s.launch(&pieces, cfg, (target, src.as_ptr(), bytes, plan.piece, n)),
                    false => s.launch(&copy, cfg, (target, src.as_ptr(), bytes, n)),
                }
            })
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
            eprintln!("{}", row.progress());
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
