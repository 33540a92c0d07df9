//! IBGDA over the soft NIC against P2P, measured in one run on the same
//! two ranks (threads of this process, `--spread`: one GPU each; or one
//! rank per process when launcher variables are set, e.g.
//! `RANK=0 ./ibgda_bench & RANK=1 ./ibgda_bench` with `WORLD_SIZE=2`,
//! `MASTER_ADDR`, `MASTER_PORT` and `DOORBELL_TOKEN`, each on GPU
//! `LOCAL_RANK`):
//!
//! * **put_signal round trip**, 8 bytes, one warp per rank
//!   (`put_signal_rtt`): through the soft NIC (WQEs, doorbell, the engine
//!   kernel executing them, CQ) vs through P2P (stores); µs per round trip,
//!   median of `--rounds` launches, and the ratio.
//! * **put bandwidth**, `-b`..`-e` bytes (`put_stream`: rank 0's `--blocks`
//!   blocks put their shares non-blocking, then `quiet`), GB/s of IBGDA vs
//!   P2P and the ratio. With `DOORBELL_SOFTNIC_LINK` set (e.g.
//!   `400gbps,2us`) the table adds the link's promised bandwidth for the
//!   launch's puts streamed through one link (`n / (n / bw + latency)`,
//!   `n` = bytes × iters) and the achieved fraction.
//! * **WQE post rate** (`post_burst`): `--wqes` 8-byte puts posted by one
//!   warp, then by one block; million WQEs/s of posting (the send queue
//!   holds them: no flow control in the timed part when `--wqes` is at
//!   most the queue size).
//! * **engine execution rate**: WQEs rank 0's port executed (its counters)
//!   over the time from the first post to the last completion.
//!
//! ```text
//! cargo run --release --example ibgda_bench -- [--device gpu|cpu] [-b BYTES] [-e BYTES] [-f F] [--blocks N]
//!     [--rtt-iters N] [--wqes N] [--rounds N] [--spread] [--out DIR]
//! ```
//! Prints a text table and writes `ibgda_bench.json` to `--out`. On the
//! CPU emulator the timings mean nothing about a GPU; the run checks that
//! every path works (each put's bytes are checked on rank 1).

use std::time::Instant;

use clap::Parser;
use doorbell::comm::{CommOptions, Communicator, EnginePhase as Phase, IbgdaOptions};
use doorbell::world::{World, WorldConfig};
use doorbell::{Backend, Device, LaunchConfig, Stream};
use doorbell_example_kernels::ibgda_bench::{
    post_burst_ibgda, put_signal_rtt_ibgda, put_signal_rtt_p2p, put_stream_ibgda, put_stream_p2p, BENCH_OK,
};
use doorbell_examples::cli::IbgdaBenchArgs;
use doorbell_examples::{die, main_with, ratio, BoxError, USER_KERNELS};

fn main() {
    let args = IbgdaBenchArgs::parse();
    main_with(|| run(&args));
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

#[derive(serde::Serialize, Clone, Debug)]
struct BwRow {
    bytes: u64,
    iters: u32,
    ibgda_gbps: f64,
    p2p_gbps: f64,
    ratio: Option<f64>,
    link_promised_gbps: Option<f64>,
    link_achieved: Option<f64>,
}

#[derive(serde::Serialize, Clone, Debug, Default)]
struct Report {
    device: String,
    ranks_on: String,
    engine: String,
    engine_threads: u32,
    link: Option<String>,
    rtt_iters: u32,
    rtt_ibgda_us: f64,
    rtt_p2p_us: f64,
    rtt_ratio: Option<f64>,
    post_warp_mwqe_s: f64,
    post_block_mwqe_s: f64,
    engine_mwqe_s: f64,
    engine_wqes: u64,
    /// Where rank 0's engine kernel spent its busy cycles over the whole
    /// run: shares of copying payload, fencing after copies, and the rest
    /// (control: doorbells, WQE parsing, checks, CQEs); control cycles per
    /// WQE executed.
    engine_copy_share: Option<f64>,
    engine_fence_share: Option<f64>,
    engine_control_share: Option<f64>,
    engine_control_cycles_per_wqe: Option<f64>,
    /// The control cycles per WQE by phase (the soft NIC's `Phase`, by
    /// name), and `walk`: the rest, the pass's own walk over the QPs.
    engine_phase_cycles_per_wqe: Vec<(String, f64)>,
    put_bw: Vec<BwRow>,
}

fn check(status: &doorbell::DeviceBuffer<u32>, what: &str) -> Result<(), BoxError> {
    let s = status.to_host()?[0];
    if s != BENCH_OK && s != 0 {
        return Err(format!("{what}: a transport call failed (status {s})").into());
    }
    Ok(())
}

fn run(a: &IbgdaBenchArgs) -> Result<(), BoxError> {
    let gpu = a.device.wants_gpu()?;
    let max = a.max_bytes.unwrap_or(if gpu { 256 << 20 } else { 1 << 20 });
    if a.min_bytes > max {
        die(format!("--minbytes {} is larger than --maxbytes {max}", a.min_bytes));
    }
    let rtt_iters = a.rtt_iters.unwrap_or(if gpu { 2000 } else { 50 }) as u32;
    let io = IbgdaOptions::from_env()?;
    if a.wqes > io.sq_size as u64 {
        eprintln!(
            "note: --wqes {} exceeds the send queue ({}); the post rate then includes waiting for completions",
            a.wqes, io.sq_size
        );
    }
    let opts = CommOptions {
        heap_bytes: 2 * max + (1 << 20),
        spread_gpus: a.spread,
        ..CommOptions::from_env()?
    };
    let backend = a.device.backend()?;
    let r = match WorldConfig::from_env()? {
        // Two thread ranks of this process.
        None => {
            let reports = Communicator::local(2, backend, opts, |comm| -> doorbell::Result<Option<Report>> {
                bench(comm, a, max, rtt_iters, &io).map_err(|e| match e.downcast::<doorbell::Error>() {
                    // Kept as it is, so main_with sees what kind it is (a NIC this machine lacks: status 2).
                    Ok(e) => *e,
                    Err(e) => doorbell::Error::Comm(e.to_string()),
                })
            })?;
            reports.into_iter().flatten().next().ok_or("rank 0 produced no report")?
        }
        // One rank per process (torchrun, mpirun, srun, or RANK=0/1 by hand).
        Some(cfg) => {
            let world = World::rendezvous(&cfg, b"ibgda_bench v1")?;
            if world.world_size() != 2 {
                // Bad input: exit 2.
                die(format!(
                    "ibgda_bench runs on 2 ranks; the launcher made a world of {}",
                    world.world_size()
                ));
            }
            let dev = match backend {
                Backend::Cpu => Device::emulator(world.local_rank()),
                b => Device::open(b, world.local_rank() % doorbell::gpu_count().max(1))?,
            };
            let comm = Communicator::new(world, dev, opts)?;
            match bench(&comm, a, max, rtt_iters, &io) {
                Ok(Some(mut r)) => {
                    r.ranks_on = format!("one process per rank, {}", r.ranks_on);
                    r
                }
                Ok(None) => return Ok(()),
                Err(e) => {
                    // Tell the other rank now rather than let it time out.
                    comm.abort(&e.to_string());
                    return Err(e);
                }
            }
        }
    };

    println!(
        "# ibgda_bench on {} ({}), soft NIC engine: {} ({} threads), link model: {}",
        r.device,
        r.ranks_on,
        r.engine,
        r.engine_threads,
        r.link.as_deref().unwrap_or("off")
    );
    println!(
        "# 8-byte put_signal round trip, one warp per rank, {} round trips per launch, median of {} launches",
        r.rtt_iters, a.rounds
    );
    println!("{:>12} {:>12} {:>8}", "ibgda (us)", "p2p (us)", "ratio");
    println!(
        "{:>12.2} {:>12.2} {:>8}",
        r.rtt_ibgda_us,
        r.rtt_p2p_us,
        r.rtt_ratio.map_or("-".into(), |x| format!("{x:.2}"))
    );
    println!(
        "# put bandwidth (GB/s = 1e9 bytes/s), {} blocks of rank 0, non-blocking puts then quiet",
        a.blocks
    );
    println!(
        "{:>12} {:>7} {:>11} {:>11} {:>8} {:>13} {:>9}",
        "bytes", "iters", "ibgda", "p2p", "ratio", "link promised", "achieved"
    );
    for b in &r.put_bw {
        println!(
            "{:>12} {:>7} {:>11.2} {:>11.2} {:>8} {:>13} {:>9}",
            b.bytes,
            b.iters,
            b.ibgda_gbps,
            b.p2p_gbps,
            b.ratio.map_or("-".into(), |x| format!("{x:.3}")),
            b.link_promised_gbps.map_or("-".into(), |x| format!("{x:.2}")),
            b.link_achieved.map_or("-".into(), |x| format!("{x:.3}"))
        );
    }
    println!(
        "# WQE post rate ({} 8-byte puts): one warp {:.3} M WQE/s, one block {:.3} M WQE/s",
        a.wqes, r.post_warp_mwqe_s, r.post_block_mwqe_s
    );
    println!(
        "# engine execution rate: {:.3} M WQE/s ({} WQEs executed by rank 0's port)",
        r.engine_mwqe_s, r.engine_wqes
    );
    if let (Some(c), Some(f), Some(k), Some(w)) = (
        r.engine_copy_share,
        r.engine_fence_share,
        r.engine_control_share,
        r.engine_control_cycles_per_wqe,
    ) {
        println!(
            "# engine busy cycles: {:.1} % copying payload, {:.1} % fences after copies, {:.1} % control ({:.0} cycles per WQE)",
            c * 100.0,
            f * 100.0,
            k * 100.0,
            w
        );
    }
    if !r.engine_phase_cycles_per_wqe.is_empty() {
        let parts: Vec<String> = r.engine_phase_cycles_per_wqe.iter().map(|(n, c)| format!("{n} {c:.0}")).collect();
        println!("# control cycles per WQE by phase: {}", parts.join(", "));
    }
    if !gpu {
        println!("# CPU emulator: the timings say nothing about a GPU; every path ran and every put was checked");
    }
    std::fs::create_dir_all(&a.out)?;
    let path = a.out.join("ibgda_bench.json");
    std::fs::write(&path, serde_json::to_string_pretty(&r)?).map_err(|e| format!("writing {}: {e}", path.display()))?;
    println!("# wrote {}", path.display());
    Ok(())
}

/// One rank's part; rank 0 returns the report.
fn bench(comm: &Communicator, a: &IbgdaBenchArgs, max: u64, rtt_iters: u32, io: &IbgdaOptions) -> Result<Option<Report>, BoxError> {
    let dev = comm.device();
    let m = comm.load_module(&USER_KERNELS)?;
    let me = comm.rank();
    let p2p = comm.p2p()?;
    let ib = comm.ibgda_with(io)?;
    let src = comm.alloc::<u8>(max as usize)?;
    let dst = comm.alloc::<u8>(max as usize)?;
    let words = comm.alloc::<u64>(128)?;
    let sig = comm.alloc::<u64>(1)?;
    let pattern: Vec<u8> = (0..max).map(|i| (i % 251) as u8 ^ 0x5a).collect();
    src.copy_from_host(&pattern)?;
    let mut status = dev.alloc_zeroed::<u32>(1)?;
    let mut out = dev.alloc_zeroed::<u64>(2)?;
    let s: Stream = dev.new_stream()?;
    let engine_before = comm.ibgda_engine();
    let wqes_before = comm.soft_nic().map(|n| n.stats().wqes).unwrap_or(0);
    let mut report = Report {
        device: dev.name(),
        ranks_on: if a.spread || comm.ranks_per_gpu() == 1 && dev.is_gpu() {
            "one GPU per rank".into()
        } else {
            "one device".into()
        },
        link: io.link.map(|l| format!("{} bit/s, {} ns", l.bits_per_second(), l.latency_ns)),
        rtt_iters,
        ..Report::default()
    };

    // 1. put_signal round trips, IBGDA and P2P in turn.
    let f_rtt_ib = m.function::<put_signal_rtt_ibgda>()?;
    let f_rtt_p2p = m.function::<put_signal_rtt_p2p>()?;
    let (mut ib_us, mut p2p_us) = (Vec::new(), Vec::new());
    let mut epoch = 1u64;
    for round in 0..=a.rounds {
        for use_ib in [true, false] {
            status.zero()?;
            comm.barrier()?;
            // SAFETY: symmetric `words` and `sig`; one warp per rank.
            unsafe {
                if use_ib {
                    s.launch(
                        &f_rtt_ib,
                        LaunchConfig::linear(1, 32),
                        (
                            ib,
                            words.as_mut_ptr(),
                            sig.as_mut_ptr(),
                            epoch,
                            rtt_iters,
                            out.as_mut_ptr(),
                            status.as_mut_ptr(),
                        ),
                    )?;
                } else {
                    s.launch(
                        &f_rtt_p2p,
                        LaunchConfig::linear(1, 32),
                        (
                            p2p,
                            words.as_mut_ptr(),
                            sig.as_mut_ptr(),
                            epoch,
                            rtt_iters,
                            out.as_mut_ptr(),
                            status.as_mut_ptr(),
                        ),
                    )?;
                }
            }
            comm.synchronize(&s)?;
            check(&status, "put_signal round trip")?;
            epoch += rtt_iters as u64 + 1;
            let us = out.to_host()?[0] as f64 / 1e3 / rtt_iters as f64;
            if round > 0 && me == 0 {
                if use_ib {
                    ib_us.push(us)
                } else {
                    p2p_us.push(us)
                }
            }
        }
    }
    report.rtt_ibgda_us = median(ib_us);
    report.rtt_p2p_us = median(p2p_us);
    report.rtt_ratio = ratio(report.rtt_ibgda_us, report.rtt_p2p_us);
    if me == 0 {
        eprintln!(
            "put_signal round trip: ibgda {:.2} us, p2p {:.2} us",
            report.rtt_ibgda_us, report.rtt_p2p_us
        );
    }

    // 2. Put bandwidth, IBGDA and P2P in turn, every size checked.
    let f_put_ib = m.function::<put_stream_ibgda>()?;
    let f_put_p2p = m.function::<put_stream_p2p>()?;
    let mut bytes = a.min_bytes;
    while bytes <= max {
        let iters = ((256u64 << 20) / bytes).clamp(if dev.is_gpu() { 4 } else { 1 }, if dev.is_gpu() { 1000 } else { 8 }) as u32;
        let (mut ib_t, mut p2p_t) = (Vec::new(), Vec::new());
        for round in 0..=a.rounds {
            for use_ib in [true, false] {
                if round == 0 && use_ib {
                    comm.barrier()?;
                    dst.copy_from_host(&vec![0u8; max as usize])?;
                }
                status.zero()?;
                comm.barrier()?;
                let t0 = Instant::now();
                // SAFETY: symmetric src/dst of `max` >= `bytes` bytes.
                unsafe {
                    let cfg = LaunchConfig::linear(a.blocks as u32, 256);
                    if use_ib {
                        s.launch(
                            &f_put_ib,
                            cfg,
                            (ib, dst.as_mut_ptr(), src.as_ptr(), bytes, iters, status.as_mut_ptr()),
                        )?;
                    } else {
                        s.launch(
                            &f_put_p2p,
                            cfg,
                            (p2p, dst.as_mut_ptr(), src.as_ptr(), bytes, iters, status.as_mut_ptr()),
                        )?;
                    }
                }
                comm.synchronize(&s)?;
                let secs = t0.elapsed().as_secs_f64();
                check(&status, "put")?;
                comm.barrier()?;
                if round == 0 && use_ib && me == 1 {
                    let got = dst.to_host()?;
                    if got[..bytes as usize] != pattern[..bytes as usize] || got[bytes as usize..].iter().any(|&b| b != 0) {
                        return Err(format!("the IBGDA put of {bytes} bytes did not land exactly in rank 1's buffer").into());
                    }
                }
                if round > 0 {
                    let gbps = bytes as f64 * iters as f64 / secs / 1e9;
                    if use_ib {
                        ib_t.push(gbps)
                    } else {
                        p2p_t.push(gbps)
                    }
                }
            }
        }
        let (ibg, p2g) = (median(ib_t), median(p2p_t));
        let promised = io.link.filter(|l| l.enabled()).map(|l| {
            // `iters` puts stream through one link: one latency, then the wire.
            let total = bytes * iters as u64;
            let wire_s = l.wire_ps(total) as f64 * 1e-12 + l.latency_ns as f64 * 1e-9;
            total as f64 / wire_s / 1e9
        });
        report.put_bw.push(BwRow {
            bytes,
            iters,
            ibgda_gbps: ibg,
            p2p_gbps: p2g,
            ratio: ratio(ibg, p2g),
            link_promised_gbps: promised,
            link_achieved: promised.and_then(|p| ratio(ibg, p)),
        });
        if me == 0 {
            eprintln!("put {bytes} bytes: ibgda {ibg:.2} GB/s, p2p {p2g:.2} GB/s");
        }
        bytes = match bytes.checked_mul(a.step_factor) {
            Some(b) => b,
            None => break,
        };
    }

    // 3. Post rate (one warp, one block) and 4. the engine's execution rate.
    let f_post = m.function::<post_burst_ibgda>()?;
    let nic = comm.soft_nic().ok_or("the soft NIC is not set up")?;
    let mut rates = [Vec::new(), Vec::new()];
    let (mut executed, mut busy_ns) = (0u64, 0u64);
    for round in 0..=a.rounds {
        for (k, (threads, use_warp)) in [(32u32, 1u32), (256, 0)].into_iter().enumerate() {
            if me == 0 && round == 0 {
                eprintln!("post rate: {} posting", if use_warp != 0 { "one warp" } else { "one block" });
            }
            status.zero()?;
            comm.barrier()?;
            let before = nic.stats().wqes;
            // SAFETY: symmetric `words` of 128 words, `src` at least 16 bytes.
            unsafe {
                s.launch(
                    &f_post,
                    LaunchConfig::linear(1, threads),
                    (
                        ib,
                        words.as_mut_ptr(),
                        src.as_ptr() as *const u64,
                        a.wqes as u32,
                        use_warp,
                        out.as_mut_ptr(),
                        status.as_mut_ptr(),
                    ),
                )?;
            }
            comm.synchronize(&s)?;
            check(&status, "post burst")?;
            let ns = out.to_host()?;
            let after = nic.stats().wqes;
            if round > 0 && me == 0 {
                rates[k].push(a.wqes as f64 / (ns[0].max(1) as f64 * 1e-9) / 1e6);
                executed += after - before;
                busy_ns += ns[1];
            }
        }
    }
    report.post_warp_mwqe_s = median(std::mem::take(&mut rates[0]));
    report.post_block_mwqe_s = median(std::mem::take(&mut rates[1]));
    report.engine_wqes = executed;
    report.engine_mwqe_s = executed as f64 / (busy_ns.max(1) as f64 * 1e-9) / 1e6;
    if let Some(e) = comm.ibgda_engine() {
        report.engine = format!("{:?}", e.engine);
        report.engine_threads = e.threads;
        let wqes = nic.stats().wqes - wqes_before;
        if let Some(b) = engine_before {
            let (e, b) = (e.counters, b.counters);
            let busy = e.busy_cycles - b.busy_cycles;
            if busy > 0 && wqes > 0 {
                let copy = (e.copy_cycles - b.copy_cycles) as f64;
                let fence = (e.fence_cycles - b.fence_cycles) as f64;
                let control = (busy as f64 - copy - fence).max(0.0);
                report.engine_copy_share = Some(copy / busy as f64);
                report.engine_fence_share = Some(fence / busy as f64);
                report.engine_control_share = Some(control / busy as f64);
                report.engine_control_cycles_per_wqe = Some(control / wqes as f64);
                let mut phases: Vec<(String, f64)> = Phase::ALL
                    .iter()
                    .map(|&p| {
                        let i = p as usize;
                        (
                            p.name().to_string(),
                            e.phase_cycles[i].wrapping_sub(b.phase_cycles[i]) as f64 / wqes as f64,
                        )
                    })
                    .collect();
                let walk = control / wqes as f64 - phases.iter().map(|(_, c)| c).sum::<f64>();
                phases.push(("walk".to_string(), walk.max(0.0)));
                report.engine_phase_cycles_per_wqe = phases;
            }
        }
    }
    comm.barrier()?;
    Ok((me == 0).then_some(report))
}
