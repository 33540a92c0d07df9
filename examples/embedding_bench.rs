//! The embedding exchange's benchmark (`--bench`): the fused exchange
//! (push with dedup, and the pull forward) against the host-driven
//! baselines (driver copies, NCCL) over a DLRM-like sweep, with the put
//! floor; the table on stdout, `embedding_exchange.json` (written by the
//! shared harness, `bench/`) and the figure. Its timing is its own: a
//! host loop, wall clock per step up to the stream's synchronize (the
//! baselines synchronize inside a step), so its figures stay comparable
//! with the stored runs (`benchmarks/embedding_*`).

use std::time::Instant;

use doorbell::coll::embedding::{EmbeddingExchange, EmbeddingOptions, STAMP_BWD, STAMP_FWD};
use doorbell::comm::{CommOptions, Communicator};
use doorbell::{Backend, DeviceBuffer, Stream};
use doorbell_examples::embedding::{self as emb, comm_options, compare, ranks_per_gpu, Baseline, Mover, Problem, PutFloor, Traffic};
use doorbell_examples::plot::{write_chart, Chart, Series};
use doorbell_examples::BoxError;

use super::{bench as harness, problem, Args};

/// The benchmark: see the module docs.
pub fn bench(args: &Args) -> Result<(), BoxError> {
    let sw = Sweep::new(args)?;
    println!(
        "timing: a host loop per method, {} iterations after one warm-up, wall clock around each step's launches up to its \
         stream synchronize (the baselines synchronize inside a step anyway); the slowest rank's mean",
        sw.iters
    );
    println!(
        "{:>6} {:>4} {:>5} {:<14} {:<4} {:>11} {:>12} {:>10} {:>13} {:>8} {:>5}",
        "batch", "pool", "zipf", "method", "dir", "lookups", "bytes", "time_us", "lookups/s", "GB/s", "ok"
    );
    let mut rows = Vec::new();
    // The tables do not depend on the batch: made once.
    let init = emb::initial_tables(&sw.base);
    // Memory per rank kept under about 12 GiB / ranks-per-GPU.
    let budget: u64 = (12u64 << 30) / sw.rpg as u64;
    for &(batch, pooling) in &sw.shapes {
        for zipf in [0.0, sw.skew] {
            let p = Problem { batch, pooling, ..sw.base };
            p.check()?;
            let ids = emb::generate_ids(&p, zipf, args.seed);
            let tr = emb::traffic(&p, &ids);
            let max_recv = emb::max_recv(&p, &ids);
            let cap = tr.max_pair.max(1) as u32;
            let heap = emb::heap_bytes_needed(&p, cap) + emb::baseline_heap_bytes(&p, max_recv);
            let local = p.lookups() as u64 * (16 + p.dim as u64 * 8) + max_recv * p.dim as u64 * 4;
            if heap + local > budget {
                println!(
                    "{batch:>6} {pooling:>4} {zipf:>5} skipped: needs {:.1} GiB per rank",
                    (heap + local) as f64 / (1u64 << 30) as f64
                );
                continue;
            }
            let want: Vec<Vec<f32>> = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..p.ranks as usize)
                    .map(|r| {
                        let (init, ids) = (&init, &ids);
                        sc.spawn(move || emb::reference_forward(&p, init, &ids[r]))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("reference thread")).collect()
            });
            let case = Case {
                p,
                zipf,
                ids: &ids,
                tr,
                max_recv,
                init: &init,
                want: &want,
            };
            let res = Communicator::local(p.ranks as usize, sw.backend, comm_options(heap)?, |comm| {
                measure(comm, &sw, &case, args.breakdown)
            })?;
            report(&case, res, args.breakdown, &mut rows);
        }
    }
    write_results(args, &sw, &rows)?;
    if rows.iter().any(|r| !r.checked) {
        return Err("a method's forward output differs from the CPU reference (or the put floor reported an error)".into());
    }
    Ok(())
}

/// The sweep: its base problem, shapes, iterations, where it runs.
struct Sweep {
    backend: Backend,
    gpu: bool,
    base: Problem,
    iters: u64,
    skew: f64,
    shapes: Vec<(u32, u32)>,
    rpg: u32,
    /// Why NCCL is left out (`None`: it runs).
    nccl_note: Option<String>,
}

impl Sweep {
    /// The sweep the flags ask for; prints its notes.
    fn new(args: &Args) -> Result<Sweep, BoxError> {
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
        let rpg = ranks_per_gpu(&base, &CommOptions::from_env()?);
        let nccl_note = if !gpu {
            Some("NCCL needs GPUs".to_string())
        } else if rpg > 1 {
            Some("NCCL refuses two ranks on one GPU: run with DOORBELL_RANK_PER_GPU=1 and a GPU per rank".to_string())
        } else {
            doorbell_examples::nccl::available().err()
        };
        if let Some(n) = &nccl_note {
            println!("note: NCCL column skipped: {n}");
        }
        Ok(Sweep {
            backend,
            gpu,
            base,
            iters,
            skew,
            shapes,
            rpg,
            nccl_note,
        })
    }
}

/// One point of the sweep: its problem, ids and what they make.
struct Case<'a> {
    p: Problem,
    zipf: f64,
    ids: &'a [Vec<u32>],
    tr: Traffic,
    max_recv: u64,
    init: &'a [f32],
    /// Every rank's reference forward.
    want: &'a [Vec<f32>],
}

impl Case<'_> {
    /// Remote (rank, peer) pairs.
    fn pairs(&self) -> u64 {
        self.p.ranks as u64 * (self.p.ranks as u64).saturating_sub(1)
    }

    /// The put floor's bytes per (rank, peer) pair: the fused forward's
    /// remote rows, spread evenly over the pairs.
    fn floor_pair(&self) -> u64 {
        let remote = (self.tr.unique - self.tr.unique_local) * self.p.dim as u64 * 4;
        remote.checked_div(self.pairs()).map_or(0, |b| b / 16 * 16)
    }
}

/// One rank's measurements: (method, direction, checked, seconds).
type Times = Vec<(&'static str, &'static str, bool, f64)>;

/// The fused forward's and backward's phase ends, µs (the slowest rank's).
type PhaseEnds = (Vec<f64>, Vec<f64>);

/// One rank's measurements of `c`: every method's correctness first, then
/// its timing; and the fused kernels' phase ends (the slowest rank's).
fn measure(comm: &Communicator, sw: &Sweep, c: &Case, breakdown: bool) -> doorbell::Result<(Times, PhaseEnds)> {
    let (p, iters) = (&c.p, sw.iters);
    let r = comm.rank() as u32;
    let dev = comm.device();
    let cfg = emb::launch_config(comm, sw.rpg);
    let shard = emb::shard_of(p, c.init, r);
    let cap = c.tr.max_pair.max(1) as u32;
    let eo = EmbeddingOptions {
        launch: Some(cfg),
        ..EmbeddingOptions::default()
    };
    let mut x = EmbeddingExchange::with_options(comm, p, cap, &eo)?;
    x.load_shard(&shard)?;
    let mut bl = Baseline::new(comm, p, c.max_recv, cfg)?;
    bl.load_shard(&shard)?;
    let floor = PutFloor::new(comm)?;
    let ids_d = dev.alloc_from(&c.ids[r as usize])?;
    let grad = dev.alloc_from(&emb::upstream_grad(p, r))?;
    let mut out = dev.alloc_zeroed::<f32>(p.out_len())?;
    let s = dev.new_stream()?;
    let want = &c.want[r as usize];
    let nccl = if sw.nccl_note.is_none() {
        Some(doorbell_examples::nccl::Comm::new(comm, &s)?)
    } else {
        None
    };
    let mut t = Vec::new();
    // Correctness first (tables still at their initial values).
    x.forward(&s, &ids_d, &mut out)?;
    x.finish(&s)?;
    let fused_ok = compare(&out.to_host()?, want).1;
    let check_bl = |bl: &mut Baseline, out: &mut DeviceBuffer<f32>, m: Mover| -> doorbell::Result<bool> {
        bl.forward(&s, &ids_d, out, m, nccl.as_ref())?;
        Ok(compare(&out.to_host()?, want).1)
    };
    let copies_ok = check_bl(&mut bl, &mut out, Mover::Copies)?;
    let nccl_ok = if nccl.is_some() {
        check_bl(&mut bl, &mut out, Mover::Nccl)?
    } else {
        false
    };
    x.forward_pull(&s, &ids_d, &mut out)?;
    x.finish(&s)?;
    let pull_ok = compare(&out.to_host()?, want).1;
    // Fused push: forward alone, then forward + backward (backward timed alone).
    x.set_stamps(breakdown);
    let mut fwd_ph = Phases::new(STAMP_FWD.len());
    let fwd = time_loop(comm, iters, || {
        let t = timed(&s, || x.forward(&s, &ids_d, &mut out))?;
        if breakdown {
            fwd_ph.add(&x.stamps()?.0);
        }
        Ok(t)
    })?;
    t.push(("fused", "fwd", fused_ok, fwd));
    let mut bwd_ph = Phases::new(STAMP_BWD.len());
    let bwd = time_loop(comm, iters, || {
        x.forward(&s, &ids_d, &mut out)?;
        x.finish(&s)?;
        let t = timed(&s, || x.backward(&s, &grad, 0.0))?;
        if breakdown {
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
    let floor_pair = c.floor_pair();
    if floor_pair > 0 {
        // Every rank's steps above have finished (finish, barrier).
        comm.barrier()?;
        let f = time_loop(comm, iters, || timed(&s, || floor.run(&x, &s, floor_pair)))?;
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
}

#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Row {
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

/// Prints the rows of case `c` from every rank's measurements `res`
/// (the slowest rank's time each, checked only where every rank's output
/// was), its put-floor and dedup lines, and adds the rows to `rows`.
fn report(c: &Case, res: Vec<(Times, PhaseEnds)>, breakdown: bool, rows: &mut Vec<Row>) {
    let (p, tr, zipf) = (&c.p, &c.tr, c.zipf);
    let (batch, pooling) = (p.batch, p.pooling);
    let (floor_pair, pairs) = (c.floor_pair(), c.pairs());
    let phases = res[0].1.clone();
    let res: Vec<_> = res.into_iter().map(|(t, _)| t).collect();
    // Bytes between ranks: the fused exchange moves unique remote rows
    // (+ 8-byte keys), the baselines every remote lookup (+ keys).
    let remote_lookups = remote_lookups(p, c.ids);
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
        let ph = match (*method, *dir, breakdown) {
            ("fused", "fwd", true) => Some(named(&STAMP_FWD, &phases.0)),
            ("fused", "bwd", true) => Some(named(&STAMP_BWD, &phases.1)),
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

/// Writes `embedding_exchange.json` and the figure
/// (`embedding_exchange.{png,svg}`) to `--out`.
fn write_results(args: &Args, sw: &Sweep, rows: &[Row]) -> Result<(), BoxError> {
    let json = serde_json::json!({
        "what": "embedding exchange: fused (push + dedup, pull) vs CPU-driven copies vs NCCL",
        "timing": "host loop, wall clock per step up to stream synchronize, slowest rank's mean",
        "device": if sw.gpu { "gpu" } else { "cpu emulator" },
        "ranks": sw.base.ranks, "tables": sw.base.tables, "rows": sw.base.rows, "dim": sw.base.dim,
        "ranks_per_gpu": sw.rpg, "iters": sw.iters, "nccl": sw.nccl_note.clone().unwrap_or_else(|| "used".into()),
        "rows_measured": rows,
    });
    let jp = harness::write_json(&args.out, "embedding_exchange.json", &json)?;
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
        sw.base.ranks, sw.base.tables, sw.base.dim
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
    Ok(())
}

fn remote_lookups(p: &Problem, ids: &[Vec<u32>]) -> u64 {
    ids.iter()
        .enumerate()
        .map(|(r, v)| v.iter().filter(|&&id| id < p.rows && (id % p.ranks) as usize != r).count() as u64)
        .sum()
}
