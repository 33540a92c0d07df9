//! `ibgda_bench`'s measurements, each run on both ranks with rank 0
//! filling in its part of the report: the put_signal round trips, the put
//! bandwidth, the post rates, the lane posts, one thread's post profile,
//! and where rank 0's engine spent its cycles.

use std::time::Instant;

use doorbell::comm::{Communicator, EnginePhase as Phase, EngineReport};
use doorbell::{AnyTransport, DeviceBuffer, LaunchConfig};
use doorbell_example_kernels::ibgda_bench::{
    post_burst_ibgda, post_lanes_ibgda, post_lanes_many_ibgda, post_profile, primitive_costs, put_signal_rtt, put_stream, BENCH_OK,
    NO_PEER, PRIMITIVES, PRIMITIVE_COUNT,
};
use doorbell_examples::cli::sweep;
use doorbell_examples::{ratio, BoxError};
use doorbell_kernels::transport::ibgda::PostProfile;
use doorbell_kernels::transport::{Ibgda, P2p};

use super::bench::{interleaved, median_upper as median};
use super::report::{BwRow, LaneEngine, Report};
use super::{Plan, Rank};

fn check(status: &DeviceBuffer<u32>, what: &str) -> Result<(), BoxError> {
    let s = status.to_host()?[0];
    if s != BENCH_OK && s != 0 {
        return Err(format!("{what}: a transport call failed (status {s})").into());
    }
    Ok(())
}

/// The handle of variant `v` of an interleaved pair: 0 IBGDA, else P2P.
fn handle(v: usize, ib: Ibgda, p2p: P2p) -> AnyTransport {
    match v {
        0 => ib.into(),
        _ => p2p.into(),
    }
}

/// The peer of rank `me` in the kernels that pair ranks 0 and 1 (rank 0
/// leads or posts); the rank that receives passes [`NO_PEER`] where it
/// only receives.
fn partner(me: usize) -> u32 {
    1 - me.min(1) as u32
}

/// Part 1: put_signal round trips, IBGDA and P2P in turn.
pub fn round_trips(r: &mut Rank, p: &Plan, report: &mut Report) -> Result<(), BoxError> {
    let (comm, me) = (r.comm, r.comm.rank());
    let (ib, p2p) = (r.ib, r.p2p);
    let family = r.m.family::<put_signal_rtt>()?;
    let mut epoch = 1u64;
    let mut engine: Option<LaneEngine> = None;
    let [ib_us, p2p_us] = interleaved::<2, BoxError>(true, p.args.rounds as u32, |v, warm| {
        r.status.zero()?;
        comm.barrier()?;
        let before = comm.ibgda_engine().filter(|_| v == 0 && !warm);
        let t0 = Instant::now();
        let a = (
            partner(me),
            (me == 0) as u32,
            r.words.as_mut_ptr(),
            r.sig.as_mut_ptr(),
            epoch,
            p.rtt_iters,
            r.out.as_mut_ptr(),
            r.status.as_mut_ptr(),
        );
        let one = LaunchConfig::linear(1, 32);
        // SAFETY: symmetric `words` and `sig`; one warp per rank.
        unsafe { r.s.launch_family(&family, one, handle(v, ib, p2p), a)? };
        comm.synchronize(&r.s)?;
        if let (Some(b), Some(a)) = (before, comm.ibgda_engine()) {
            let ns = t0.elapsed().as_nanos() as u64;
            engine.get_or_insert_with(LaneEngine::default).add(&b.counters, &a.counters, ns);
        }
        check(&r.status, "put_signal round trip")?;
        epoch += p.rtt_iters as u64 + 1;
        Ok(r.out.to_host()?[0] as f64 / 1e3 / p.rtt_iters as f64)
    })?;
    if me == 0 {
        (report.rtt_ibgda_us, report.rtt_p2p_us) = (median(ib_us), median(p2p_us));
        report.rtt_ratio = ratio(report.rtt_ibgda_us, report.rtt_p2p_us);
        report.rtt_engine = engine;
        eprintln!(
            "put_signal round trip: ibgda {:.2} us, p2p {:.2} us",
            report.rtt_ibgda_us, report.rtt_p2p_us
        );
    }
    Ok(())
}

/// Part 2: put bandwidth, IBGDA and P2P in turn; each size's first IBGDA
/// put is checked on rank 1 (exactly the put's bytes, nothing past them).
pub fn put_bandwidth(r: &mut Rank, p: &Plan, report: &mut Report) -> Result<(), BoxError> {
    let (comm, me, gpu) = (r.comm, r.comm.rank(), r.comm.device().is_gpu());
    let (ib, p2p) = (r.ib, r.p2p);
    let family = r.m.family::<put_stream>()?;
    for bytes in sweep(p.args.min_bytes, p.max, p.args.step_factor) {
        let iters = ((256u64 << 20) / bytes).clamp(if gpu { 4 } else { 1 }, if gpu { 1000 } else { 8 }) as u32;
        let mut engine: Option<LaneEngine> = None;
        let [ib_t, p2p_t] = interleaved::<2, BoxError>(true, p.args.rounds as u32, |v, warm| {
            if warm && v == 0 {
                comm.barrier()?;
                r.dst.copy_from_host(&vec![0u8; p.max as usize])?;
            }
            r.status.zero()?;
            comm.barrier()?;
            let before = comm.ibgda_engine().filter(|_| v == 0 && !warm);
            let t0 = Instant::now();
            let cfg = LaunchConfig::linear(p.args.blocks as u32, 256);
            let a = (r.dst.as_mut_ptr(), r.src.as_ptr(), bytes, iters, r.status.as_mut_ptr());
            // SAFETY: symmetric src/dst of `max` >= `bytes` bytes.
            unsafe { r.s.launch_family(&family, cfg, handle(v, ib, p2p), a)? };
            comm.synchronize(&r.s)?;
            let secs = t0.elapsed().as_secs_f64();
            if let (Some(b), Some(a)) = (before, comm.ibgda_engine()) {
                engine
                    .get_or_insert_with(LaneEngine::default)
                    .add(&b.counters, &a.counters, (secs * 1e9) as u64);
            }
            check(&r.status, "put")?;
            comm.barrier()?;
            if warm && v == 0 && me == 1 {
                let (got, n) = (r.dst.to_host()?, bytes as usize);
                if got[..n] != r.pattern[..n] || got[n..].iter().any(|&b| b != 0) {
                    return Err(format!("the IBGDA put of {bytes} bytes did not land exactly in rank 1's buffer").into());
                }
            }
            Ok(bytes as f64 * iters as f64 / secs / 1e9)
        })?;
        let (ibg, p2g) = (median(ib_t), median(p2p_t));
        let promised = p.io.link.filter(|l| l.enabled()).map(|l| {
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
            engine,
        });
        if me == 0 {
            eprintln!("put {bytes} bytes: ibgda {ibg:.2} GB/s, p2p {p2g:.2} GB/s");
        }
    }
    Ok(())
}

/// Parts 3 and 4: the post rate (one warp, one block) and the engine's
/// execution rate.
pub fn post_rates(r: &mut Rank, p: &Plan, report: &mut Report) -> Result<(), BoxError> {
    let (comm, me) = (r.comm, r.comm.rank());
    let ib = r.ib;
    let f_post = r.m.function::<post_burst_ibgda>()?;
    let nic = comm.soft_nic().ok_or("the soft NIC is not set up")?;
    let (mut executed, mut busy_ns) = (0u64, 0u64);
    let [warp, block] = interleaved::<2, BoxError>(true, p.args.rounds as u32, |v, warm| {
        let (threads, use_warp) = [(32u32, 1u32), (256, 0)][v];
        if me == 0 && warm {
            eprintln!("post rate: {} posting", if use_warp != 0 { "one warp" } else { "one block" });
        }
        r.status.zero()?;
        comm.barrier()?;
        let before = nic.stats().wqes;
        let peer = if me == 0 { partner(me) } else { NO_PEER };
        let a = (r.words.as_mut_ptr(), r.src.as_ptr() as *const u64, p.args.wqes as u32, use_warp);
        // SAFETY: symmetric `words` of at least `wqes` words, `src` at
        // least 16 bytes.
        unsafe {
            let cfg = LaunchConfig::linear(1, threads);
            let (out, status) = (r.out.as_mut_ptr(), r.status.as_mut_ptr());
            r.s.launch(&f_post, cfg, (ib, peer, a.0, a.1, a.2, a.3, out, status))?;
        }
        comm.synchronize(&r.s)?;
        check(&r.status, "post burst")?;
        let ns = r.out.to_host()?;
        if !warm && me == 0 {
            executed += nic.stats().wqes - before;
            busy_ns += ns[1];
        }
        Ok(p.args.wqes as f64 / (ns[0].max(1) as f64 * 1e-9) / 1e6)
    })?;
    if me == 0 {
        (report.post_warp_mwqe_s, report.post_block_mwqe_s) = (median(warp), median(block));
        report.engine_wqes = executed;
        report.engine_mwqe_s = executed as f64 / (busy_ns.max(1) as f64 * 1e-9) / 1e6;
    }
    Ok(())
}

/// Part 4b: warps posting a WQE per lane (`post_lanes`), one block and
/// then `--lane-blocks` blocks, each on its QP: WQEs per second posted and
/// completed (the first block's start to the last one's end).
pub fn lane_rates(r: &mut Rank, p: &Plan, report: &mut Report) -> Result<(), BoxError> {
    let (comm, me) = (r.comm, r.comm.rank());
    let f = r.m.function::<post_lanes_ibgda>()?;
    let many = r.m.function::<post_lanes_many_ibgda>()?;
    let blocks = p.args.lane_blocks as u32;
    let rounds = p.args.lane_rounds as u32;
    let batch = p.args.lane_batch as u32;
    let mut out = comm.device().alloc_zeroed::<u64>(3 * blocks as usize)?;
    let mut posted: [Vec<f64>; 3] = Default::default();
    let mut engine: Option<LaneEngine> = None;
    // 0: one block, 1: `blocks` blocks, each a WQE per lane a call; 2: one
    // block, `batch` per lane a call.
    let [one, all, one_many] = interleaved::<3, BoxError>(true, p.args.rounds as u32, |v, warm| {
        let n = [1, blocks, 1][v];
        if me == 0 && warm {
            eprintln!("lane posts: {n} block(s) of one warp, {} per lane a call", [1, 1, batch][v]);
        }
        r.status.zero()?;
        out.zero()?;
        comm.barrier()?;
        let before = comm.ibgda_engine().filter(|_| v == 1 && !warm);
        let peer = if me == 0 { partner(me) } else { NO_PEER };
        // SAFETY: symmetric `words` of `lane_words(blocks, rounds)`, registered `src`; `out` holds 3 words per block.
        unsafe {
            let a = (r.words.as_mut_ptr(), r.src.as_ptr() as *const u64, rounds, out.as_raw() as *mut u64);
            if v == 2 {
                let cfg = LaunchConfig::linear(n, 32);
                r.s.launch(&many, cfg, (r.ib, peer, a.0, a.1, a.2, batch, a.3, r.status.as_mut_ptr()))?;
            } else {
                r.s.launch(
                    &f,
                    LaunchConfig::linear(n, 32),
                    (r.ib, peer, a.0, a.1, a.2, a.3, r.status.as_mut_ptr()),
                )?;
            }
        }
        comm.synchronize(&r.s)?;
        check(&r.status, "lane posts")?;
        let ns = out.to_host()?;
        let at = |k: usize| ns.iter().skip(k).step_by(3).take(n as usize);
        let t0 = at(0).min().copied().unwrap_or(0);
        let wqes = (32 * rounds * n) as f64;
        let rate = |end: u64| wqes / (end.saturating_sub(t0).max(1) as f64 * 1e-9) / 1e6;
        if !warm {
            posted[v].push(rate(at(1).max().copied().unwrap_or(0)));
        }
        if let (Some(b), Some(a)) = (before, comm.ibgda_engine()) {
            let ns = at(2).max().copied().unwrap_or(0).saturating_sub(t0);
            engine.get_or_insert_with(LaneEngine::default).add(&b.counters, &a.counters, ns);
        }
        Ok(rate(at(2).max().copied().unwrap_or(0)))
    })?;
    if me == 0 {
        report.lanes_blocks = blocks as u64;
        report.lanes_qps = (blocks as u64).min(p.io.qps_per_peer as u64);
        report.lanes_wqes = 32 * rounds as u64;
        let [p1, pn, pm] = posted;
        (report.lanes_one_post_mwqe_s, report.lanes_all_post_mwqe_s) = (median(p1), median(pn));
        (report.lanes_one_done_mwqe_s, report.lanes_all_done_mwqe_s) = (median(one), median(all));
        report.lanes_batch = batch as u64;
        (report.lanes_batch_post_mwqe_s, report.lanes_batch_done_mwqe_s) = (median(pm), median(one_many));
        report.lanes_engine = engine;
    }
    Ok(())
}

/// Part 5: where one thread's blocking 8-byte puts spend their cycles
/// (`post_profile`, rank 0 to rank 1).
pub fn profile_posts(r: &mut Rank, p: &Plan, report: &mut Report) -> Result<(), BoxError> {
    let f = r.m.function::<post_profile>()?;
    let out = r.comm.device().alloc_zeroed::<u64>(7)?;
    let n = p.rtt_iters.min(2000);
    r.status.zero()?;
    r.comm.barrier()?;
    let before = r.comm.ibgda_engine();
    let t0 = Instant::now();
    // SAFETY: symmetric `words`, registered `src`; `out` holds a
    // PostProfile (seven words).
    unsafe {
        let a = (
            r.words.as_mut_ptr(),
            r.src.as_ptr() as *const u64,
            n,
            out.as_raw() as *mut PostProfile,
        );
        r.s.launch(&f, LaunchConfig::linear(1, 1), (r.ib, a.0, a.1, a.2, a.3, r.status.as_mut_ptr()))?;
    }
    r.comm.synchronize(&r.s)?;
    if r.comm.rank() != 0 {
        return Ok(());
    }
    check(&r.status, "post profile")?;
    if let (Some(b), Some(a)) = (before, r.comm.ibgda_engine()) {
        let wqes = a.counters.rung_wqes - b.counters.rung_wqes;
        if wqes > 0 {
            report.post_engine_ns_per_wqe = Some((a.counters.rung_to_done_ns - b.counters.rung_to_done_ns) as f64 / wqes as f64);
        }
        let mut e = LaneEngine::default();
        e.add(&b.counters, &a.counters, t0.elapsed().as_nanos() as u64);
        report.post_engine = Some(e);
    }
    let v = out.to_host()?;
    let per = |c: u64| c as f64 / v[0].max(1) as f64;
    let names = ["checks", "reserve", "write", "doorbell", "cqe_wait", "consume"];
    report.post_cycles_per_wqe = names.iter().zip(&v[1..]).map(|(n, &c)| (n.to_string(), per(c))).collect();
    Ok(())
}

/// Part 6: what the engine's primitives cost on this GPU
/// (`primitive_costs`, one thread of rank 0, the engines running).
pub fn primitives(r: &mut Rank, report: &mut Report) -> Result<(), BoxError> {
    r.comm.barrier()?;
    if r.comm.rank() != 0 || !r.comm.device().is_gpu() {
        return Ok(());
    }
    let f = r.m.function::<primitive_costs>()?;
    let lines = 4096u32;
    let mem = r.comm.device().alloc_zeroed::<u64>(16 * lines as usize)?;
    let out = r.comm.device().alloc_zeroed::<u64>(PRIMITIVE_COUNT + 1)?;
    // SAFETY: `mem` holds `lines` 128-byte lines, `out` PRIMITIVE_COUNT + 1 words.
    unsafe {
        r.s.launch(
            &f,
            LaunchConfig::linear(1, 32),
            (mem.as_raw() as *mut u64, lines, out.as_raw() as *mut u64),
        )?
    };
    r.s.synchronize()?;
    let v = out.to_host()?;
    report.primitive_cycles = PRIMITIVES.iter().zip(&v).map(|(n, &c)| (n.to_string(), c)).collect();
    Ok(())
}

/// Where rank 0's engine spent its busy cycles since `before`.
pub fn engine_shares(comm: &Communicator, before: Option<EngineReport>, wqes_before: u64, report: &mut Report) -> Result<(), BoxError> {
    let (Some(e), Some(nic)) = (comm.ibgda_engine(), comm.soft_nic()) else {
        return Ok(());
    };
    report.engine = format!("{:?}", e.engine);
    report.engine_threads = e.threads;
    report.engine_blocks = e.blocks.len() as u32;
    let wqes = nic.stats().wqes - wqes_before;
    let Some(b) = before else { return Ok(()) };
    let (e, b) = (e.counters, b.counters);
    report.engine_burst_wqes = Some(e.burst_wqes - b.burst_wqes);
    report.engine_bursts = Some(e.bursts - b.bursts);
    report.engine_copied_bytes = Some(e.block_bytes - b.block_bytes);
    report.engine_shared_bytes = Some(e.shared_bytes - b.shared_bytes);
    report.engine_bulk_bytes = Some(e.bulk_bytes - b.bulk_bytes);
    report.engine_thread_copies = doorbell::nic::soft::SoftOptions::from_env().is_ok_and(|o| o.thread_copies);
    let busy = e.busy_cycles - b.busy_cycles;
    if busy == 0 || wqes == 0 {
        return Ok(());
    }
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
            (
                p.name().to_string(),
                e.phase_cycles[p as usize].wrapping_sub(b.phase_cycles[p as usize]) as f64 / wqes as f64,
            )
        })
        .collect();
    let walk = control / wqes as f64 - phases.iter().map(|(_, c)| c).sum::<f64>();
    phases.push(("walk".to_string(), walk.max(0.0)));
    report.engine_phase_cycles_per_wqe = phases;
    Ok(())
}
