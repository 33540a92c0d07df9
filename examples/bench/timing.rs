//! Timing: launches between two events after a warm-up (a host loop, or
//! replays of a captured CUDA graph), one launch timed behind a held
//! stream, and rounds interleaved between variants.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use doorbell::comm::Communicator;
use doorbell::{Function, LaunchConfig, Stream};
use doorbell_example_kernels::comm::hold_stream;
use doorbell_examples::BoxError;

/// How [`time_launches`] times one variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Untimed launches first (each waited for when one launch is in flight).
    pub warmup: u64,
    /// Timed launches; the result is the mean per launch.
    pub iters: u64,
    /// Capture the timed launches once as a CUDA graph and time its
    /// replays (GPU only; ignored on the emulator).
    pub graph: bool,
}

/// Median and minimum of one measurement's rounds.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stat {
    /// The middle round (the mean of the two middle ones for an even count).
    pub median_us: f64,
    /// The fastest round.
    pub min_us: f64,
    /// Every round, in the order run.
    pub rounds_us: Vec<f64>,
}

impl Stat {
    /// The statistics of `rounds_us` (NaN for none).
    pub fn of(rounds_us: Vec<f64>) -> Stat {
        let mut v = rounds_us.clone();
        v.sort_by(f64::total_cmp);
        let median_us = match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Stat {
            median_us,
            min_us: v.first().copied().unwrap_or(f64::NAN),
            rounds_us,
        }
    }
}

/// The element at index `len / 2` once sorted (for an even count the upper
/// of the two middle ones; NaN for none).
pub fn median_upper(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs `N` variants in turn, round by round: first a warm-up round when
/// `warmup` (`once(variant, true)`, results dropped), then `rounds` timed
/// rounds (`once(variant, false)`). Returns each variant's timed results in
/// the order run, so every variant sees the same drift of clocks and
/// neighbours.
pub fn interleaved<const N: usize, E>(
    warmup: bool,
    rounds: u32,
    mut once: impl FnMut(usize, bool) -> Result<f64, E>,
) -> Result<[Vec<f64>; N], E> {
    if warmup {
        for v in 0..N {
            once(v, true)?;
        }
    }
    let mut out: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(rounds as usize));
    for _ in 0..rounds {
        for (v, results) in out.iter_mut().enumerate() {
            results.push(once(v, false)?);
        }
    }
    Ok(out)
}

/// How long a GPU stream is held before a launch [`time_events`] times:
/// far longer than the host takes to submit the two events and the launch.
const HOLD_NS: u64 = 200_000;

/// µs per iteration of the launch that `launch` enqueues on `s` (`iters`
/// iterations in it), timed with events around it. With `hold` (on a GPU),
/// the stream is first held for 200 µs, so the first event fires right
/// before the launch starts instead of while the host is still submitting.
pub fn time_events(
    s: &Stream,
    hold: Option<&Function<hold_stream>>,
    iters: u32,
    launch: impl FnOnce() -> doorbell::Result<()>,
) -> doorbell::Result<f64> {
    if let Some(h) = hold {
        // SAFETY: one scalar argument; the kernel touches no memory.
        unsafe { s.launch(h, LaunchConfig::linear(1, 32), (HOLD_NS,))? };
    }
    let t0 = s.record()?;
    launch()?;
    let t1 = s.record()?;
    s.synchronize()?;
    Ok(t0.elapsed_ms(&t1)? as f64 * 1e3 / iters as f64)
}

/// What the ranks other than rank 0 launch while [`time_on_rank0`] times
/// rank 0's launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peers {
    /// Nothing: they only keep step (e.g. while rank 0 times a copy floor).
    Idle,
    /// Their launch before rank 0's (e.g. a kernel waiting for rank 0's
    /// puts): on a shared GPU it then runs beside the timed one.
    LaunchFirst,
    /// Their launch once rank 0's timed launch has finished.
    LaunchAfter,
}

/// Rank 0's µs per iteration of `launch` (`iters` in it), timed with
/// events by [`time_events`] (behind `hold`); the other ranks return 0.0
/// and run `launch` as `peers` says. Barriers order them: a peer that
/// launches first does so before the barrier rank 0 launches after (so
/// rank 0's launch never waits for a peer's at the driver, between its
/// events); otherwise a second barrier keeps every peer out of rank 0's
/// timed window, and a peer that launches after does so past it.
pub fn time_on_rank0(
    comm: &Communicator,
    s: &Stream,
    hold: Option<&Function<hold_stream>>,
    iters: u32,
    peers: Peers,
    mut launch: impl FnMut() -> doorbell::Result<()>,
) -> doorbell::Result<f64> {
    let first = peers == Peers::LaunchFirst;
    if comm.rank() == 0 {
        comm.barrier()?;
        let us = time_events(s, hold, iters, launch)?;
        if !first {
            comm.barrier()?;
        }
        return Ok(us);
    }
    if first {
        launch()?;
    }
    comm.barrier()?;
    if !first {
        comm.barrier()?;
    }
    if peers == Peers::LaunchAfter {
        launch()?;
    }
    Ok(0.0)
}

/// `run`'s launches captured once as a CUDA graph (`n` of them), uploaded
/// on every rank before any rank replays it (no rank's set-up work queued
/// behind a peer's waiting kernels), then replayed once untimed. `None`
/// on the emulator.
fn capture(
    comm: &Communicator,
    stream: &Stream,
    name: &str,
    n: u64,
    run: &mut dyn FnMut() -> doorbell::Result<()>,
) -> Result<Option<CudaGraph>, BoxError> {
    let Some(cu) = stream.as_cuda() else {
        return Ok(None);
    };
    let me = comm.rank();
    cu.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(|e| format!("{name}: starting a CUDA graph capture: {e:?}"))?;
    let captured = (0..n).try_for_each(|_| run());
    let g = cu
        .end_capture(CUgraphInstantiate_flags(0))
        .map_err(|e| format!("{name}: ending the CUDA graph capture: {e:?}"))?;
    captured?;
    let g = g.ok_or_else(|| format!("{name}: the CUDA graph capture recorded nothing"))?;
    g.upload().map_err(|e| format!("{name}: uploading the CUDA graph: {e:?}"))?;
    comm.synchronize(stream)?;
    tracing::debug!("rank {me}: {name}: {n} launch(es) captured and uploaded");
    comm.barrier()?;
    g.launch().map_err(|e| format!("{name}: replaying the CUDA graph: {e:?}"))?;
    comm.synchronize(stream)?;
    tracing::debug!("rank {me}: {name}: untimed replay done");
    Ok(Some(g))
}

/// This rank's µs per launch of `run` (which enqueues one launch, e.g. an
/// all-reduce, on `stream`): a barrier, `t.warmup` untimed launches, then
/// `t.iters` timed ones between two events — a host loop, or with
/// `t.graph` on a GPU replays of the launches captured once. Where ranks
/// keep one launch in flight (two or more share a GPU), every launch
/// (replay) is waited for and timed by its own events, and the result is
/// their mean; then, with `hold` (on a GPU), the ranks first meet at a
/// barrier and each holds its stream for 200 µs before the first event,
/// so the events time the launch from its start, not the host's
/// submission, and the ranks' launches start together. Barriers keep
/// every rank's host work of the previous variant ahead of any rank's
/// launches that wait for peers.
pub fn time_launches(
    comm: &Communicator,
    stream: &Stream,
    t: &Timing,
    hold: Option<&Function<hold_stream>>,
    name: &str,
    run: &mut dyn FnMut() -> doorbell::Result<()>,
) -> Result<f64, BoxError> {
    let me = comm.rank();
    let one_at_a_time = comm.one_launch_in_flight();
    comm.barrier()?;
    tracing::debug!("rank {me}: {name}: {} warm-up launch(es)", t.warmup);
    for _ in 0..t.warmup {
        run()?;
        if one_at_a_time {
            comm.synchronize(stream)?;
        }
    }
    comm.synchronize(stream)?;
    tracing::debug!("rank {me}: {name}: warm-up done");
    let graph = if t.graph {
        capture(comm, stream, name, if one_at_a_time { 1 } else { t.iters }, run)?
    } else {
        None
    };
    comm.barrier()?;
    let mut launch = || -> Result<(), BoxError> {
        match &graph {
            Some(g) => g.launch().map_err(|e| format!("{name}: replaying the CUDA graph: {e:?}"))?,
            None if one_at_a_time => run()?,
            None => (0..t.iters).try_for_each(|_| run())?,
        }
        Ok(())
    };
    let mut ms = 0.0;
    for _ in 0..if one_at_a_time { t.iters } else { 1 } {
        if let (true, Some(h)) = (one_at_a_time, hold) {
            comm.barrier()?;
            // SAFETY: one scalar argument; the kernel touches no memory.
            unsafe { stream.launch(h, LaunchConfig::linear(1, 32), (HOLD_NS,))? };
        }
        let start = stream.record()?;
        launch()?;
        let end = stream.record()?;
        comm.synchronize(stream)?;
        ms += start.elapsed_ms(&end)? as f64;
    }
    tracing::debug!("rank {me}: {name}: timed launches done");
    drop(graph);
    Ok(ms * 1e3 / t.iters as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_minima() {
        let s = Stat::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((s.median_us, s.min_us, s.rounds_us), (2.0, 1.0, vec![3.0, 1.0, 2.0]));
        assert_eq!(Stat::of(vec![4.0, 1.0, 2.0, 8.0]).median_us, 3.0);
        assert!(Stat::of(Vec::new()).median_us.is_nan() && Stat::of(Vec::new()).min_us.is_nan());
        assert_eq!(median_upper(vec![4.0, 1.0, 2.0, 8.0]), 4.0);
        assert_eq!(median_upper(vec![5.0, 1.0, 3.0]), 3.0);
        assert!(median_upper(Vec::new()).is_nan());
    }

    #[test]
    fn rounds_interleave_variants_after_one_warm_up() {
        let mut calls = Vec::new();
        let [a, b] = interleaved::<2, ()>(true, 3, |v, warm| {
            calls.push((v, warm));
            Ok(calls.len() as f64)
        })
        .unwrap();
        assert_eq!(calls[..2], [(0, true), (1, true)]);
        assert_eq!(calls[2..], [(0, false), (1, false), (0, false), (1, false), (0, false), (1, false)]);
        assert_eq!((a, b), (vec![3.0, 5.0, 7.0], vec![4.0, 6.0, 8.0]));
        let r = interleaved::<3, &str>(false, 2, |v, _| if v == 1 { Err("bad") } else { Ok(0.0) });
        assert_eq!(r.unwrap_err(), "bad");
    }
}
