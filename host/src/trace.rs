//! The device trace, host side: events the kernels' transport calls and
//! pipelines wrote (`doorbell_kernels::trace`), turned into a Chrome trace
//! that opens in Perfetto (<https://ui.perfetto.dev>) and a text summary.
//!
//! Turn it on with `DOORBELL_TRACE=<dir>` (read by
//! [`CommOptions::from_env`](crate::comm::CommOptions::from_env)) or
//! [`Communicator::trace_start`](crate::comm::Communicator::trace_start).
//! Then every [`Communicator::synchronize`](crate::comm::Communicator::synchronize)
//! collects this rank's events from the device, and
//! [`Communicator::trace_write`](crate::comm::Communicator::trace_write)
//! (collective) writes `trace.json` and `summary.txt` with every rank's;
//! [`Communicator::local`](crate::comm::Communicator::local) calls it when
//! its ranks return, and a communicator dropped with events not yet
//! written leaves its own `rank-<r>.json` and `rank-<r>.txt`.
//!
//! **What is in it.** A process per rank, a track per block (a block's
//! other warps, when they record, get tracks of their own): spans for
//! puts, gets, signals, waits, barriers, quiets, and a pipeline's
//! producing, consuming and waiting for slots and chunks; instants for WQEs
//! posted, doorbells rung, completions seen and errors; and, over the soft
//! NIC, a track "soft NIC engine" per rank with its engine's instants: each
//! WQE fetched from a send queue, executed, and its CQE written (the
//! engine kernel records them when built with the `trace` feature, the
//! emulator's engines always). Timestamps are the
//! GPU's `%globaltimer` moved onto the host's clock (a calibration launch
//! per rank when tracing starts), so ranks on several GPUs of one host line
//! up to within the calibration's error, which the summary states; ranks
//! on other hosts line up as well as the hosts' clocks do.
//!
//! **Which image.** A build with `DOORBELL_TRACE_KERNELS=1` embeds two
//! images of each kernel crate ([`crate::ModuleImage`]): the default one
//! and one with the hooks. A module loaded on a GPU takes the traced one
//! only when tracing is requested for the process ([`tracing_requested`]:
//! `DOORBELL_TRACE` set, or tracing started before the load); a module
//! loaded earlier keeps its default image and records nothing, and
//! [`Communicator::trace_start`](crate::comm::Communicator::trace_start)
//! warns naming it ([`loaded_without_hooks`]).
//!
//! **Cost.** Off (the default), nothing: GPU kernels built without the
//! `trace` feature of `doorbell-kernels` have no hooks at all, and a build
//! with `DOORBELL_TRACE_KERNELS=1` loads their default image while tracing
//! is off. A traced image costs even when no event is written (see
//! `doorbell_kernels::trace`). On, every event is an atomic add and a
//! 32-byte store by the thread that makes the call. Each rank keeps the
//! last [`TraceOptions::events_per_ring`] events of each of its
//! [`TraceOptions::rings`] rings (a warp writes ring `warp % rings`); the
//! summary counts the ones overwritten.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use crate::image::{loaded_without_hooks, tracing_requested, TRACE_ENV};
pub use doorbell_kernels::trace::{What, COMPILED, ENGINE_BLOCK};

/// How much the device keeps between two collections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceOptions {
    /// Where `trace.json` and `summary.txt` go (created if missing).
    pub dir: PathBuf,
    /// Rings per rank (a power of two): warp `w` of the grid writes ring
    /// `w % rings`.
    pub rings: u32,
    /// Events each ring keeps (a power of two); older ones are overwritten
    /// and counted.
    pub events_per_ring: u32,
}

/// `DOORBELL_TRACE_EVENTS`: [`TraceOptions::events_per_ring`] (a power of
/// two in 16..=1048576).
pub const TRACE_EVENTS_ENV: &str = "DOORBELL_TRACE_EVENTS";

/// The trace `DOORBELL_TRACE` and `DOORBELL_TRACE_EVENTS` ask for (`None`:
/// off); a bad value is [`Error::BadEnv`](crate::Error::BadEnv).
pub fn options_from_env() -> crate::Result<Option<TraceOptions>> {
    let events = crate::vars::uint(TRACE_EVENTS_ENV, 2048, 16, 1 << 20)?;
    if !events.is_power_of_two() {
        return Err(crate::Error::BadEnv {
            var: TRACE_EVENTS_ENV.into(),
            value: events.to_string(),
            reason: "is not a power of two (events each ring keeps: 16, 32, ..., 1048576)".into(),
        });
    }
    Ok(crate::vars::raw(TRACE_ENV)?.map(|dir| TraceOptions {
        events_per_ring: events as u32,
        ..TraceOptions::new(dir)
    }))
}

impl TraceOptions {
    /// Defaults: 256 rings of 2,048 events (16 MiB of device memory per
    /// rank).
    pub fn new(dir: impl Into<PathBuf>) -> TraceOptions {
        TraceOptions {
            dir: dir.into(),
            rings: 256,
            events_per_ring: 2048,
        }
    }
}

/// One event, on the host's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// The rank that recorded it.
    pub rank: u32,
    /// Nanoseconds since the Unix epoch (the device clock moved onto the
    /// host's).
    pub at_ns: u64,
    /// What happened.
    pub what: What,
    /// The end of a span (else its begin, or an instant).
    pub end: bool,
    /// Block index.
    pub block: u32,
    /// Warp in the block.
    pub warp: u32,
    /// Lane in the warp.
    pub lane: u32,
    /// The peer involved.
    pub peer: Option<u32>,
    /// Bytes, a sequence number, a word's offset or a queue index (see
    /// [`What`]).
    pub arg: u64,
}

/// Bytes of one encoded event ([`encode`]).
const WIRE_BYTES: usize = 40;

/// Events as bytes, for the gather to the rank that writes the trace.
pub(crate) fn encode(events: &[TraceEvent]) -> Vec<u8> {
    let mut out = Vec::with_capacity(events.len() * WIRE_BYTES);
    for e in events {
        out.extend_from_slice(&e.rank.to_le_bytes());
        out.extend_from_slice(&(e.what as u16 | if e.end { doorbell_kernels::trace::END } else { 0 }).to_le_bytes());
        out.extend_from_slice(&(e.lane as u16 | (e.warp as u16) << 5).to_le_bytes());
        out.extend_from_slice(&e.at_ns.to_le_bytes());
        out.extend_from_slice(&e.block.to_le_bytes());
        out.extend_from_slice(&e.peer.unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(&e.arg.to_le_bytes());
        out.extend_from_slice(&[0u8; 8]);
    }
    out
}

/// The events of [`encode`]; `None` when the bytes are not a whole number
/// of events or name an unknown kind.
pub(crate) fn decode(bytes: &[u8]) -> Option<Vec<TraceEvent>> {
    if !bytes.len().is_multiple_of(WIRE_BYTES) {
        return None;
    }
    let u16_at = |c: &[u8], i: usize| u16::from_le_bytes([c[i], c[i + 1]]);
    let u32_at = |c: &[u8], i: usize| u32::from_le_bytes(c[i..i + 4].try_into().unwrap_or_default());
    let u64_at = |c: &[u8], i: usize| u64::from_le_bytes(c[i..i + 8].try_into().unwrap_or_default());
    bytes
        .chunks_exact(WIRE_BYTES)
        .map(|c| {
            let (what, who) = (u16_at(c, 4), u16_at(c, 6));
            let peer = u32_at(c, 20);
            Some(TraceEvent {
                rank: u32_at(c, 0),
                what: What::from_u16(what)?,
                end: what & doorbell_kernels::trace::END != 0,
                lane: (who & 31) as u32,
                warp: (who >> 5) as u32,
                at_ns: u64_at(c, 8),
                block: u32_at(c, 16),
                peer: (peer != u32::MAX).then_some(peer),
                arg: u64_at(c, 24),
            })
        })
        .collect()
}

/// A span with its two ends, or an instant (`dur_ns` 0, `instant` set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    /// The begin (or instant) event.
    pub begin: TraceEvent,
    /// Nanoseconds to the end event (0 for an instant).
    pub dur_ns: u64,
    /// An instant event, or a span whose end was not recorded (its call
    /// failed, or the kernel still ran when the rings were read).
    pub instant: bool,
    /// The end event's argument (a wait: the value seen).
    pub end_arg: u64,
}

/// Pairs each thread's begin and end events, in the order the thread
/// recorded them (`events` keeps each thread's order: the rings do).
/// Ends with no begin (overwritten) are dropped; begins with no end become
/// instants.
pub fn slices(events: &[TraceEvent]) -> Vec<Slice> {
    let mut open: BTreeMap<(u32, u32, u32, u32), Vec<usize>> = BTreeMap::new();
    let mut out: Vec<Slice> = Vec::with_capacity(events.len());
    for e in events {
        let key = (e.rank, e.block, e.warp, e.lane);
        if !e.what.is_span() {
            out.push(Slice {
                begin: *e,
                dur_ns: 0,
                instant: true,
                end_arg: e.arg,
            });
        } else if !e.end {
            open.entry(key).or_default().push(out.len());
            out.push(Slice {
                begin: *e,
                dur_ns: 0,
                instant: true,
                end_arg: 0,
            });
        } else if let Some(stack) = open.get_mut(&key) {
            // The innermost open span of the same kind (spans nest).
            if let Some(pos) = stack.iter().rposition(|&i| out[i].begin.what == e.what) {
                let i = stack[pos];
                stack.truncate(pos);
                let s = &mut out[i];
                s.dur_ns = e.at_ns.saturating_sub(s.begin.at_ns);
                s.instant = false;
                s.end_arg = e.arg;
            }
        }
    }
    out
}

/// Where the trace went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceFiles {
    /// The Chrome trace (open it in Perfetto).
    pub json: PathBuf,
    /// The text summary.
    pub summary: PathBuf,
    /// Events written.
    pub events: usize,
}

/// What [`write_files`] needs besides the events.
#[derive(Clone, Debug, Default)]
pub struct TraceMeta {
    /// Per rank: events overwritten in the rings before they were read.
    pub overwritten: Vec<u64>,
    /// Per rank: half the calibration's round trip, ns (how far its clock
    /// may be off the host's).
    pub clock_error_ns: Vec<u64>,
}

/// Writes `<stem>.json` (Chrome trace) and `<stem>.txt` (summary) of
/// `events` into `dir`.
pub fn write_files(dir: &Path, stem: &str, events: &[TraceEvent], meta: &TraceMeta) -> std::io::Result<TraceFiles> {
    std::fs::create_dir_all(dir)?;
    let json = dir.join(format!("{stem}.json"));
    let summary = dir.join(if stem == "trace" {
        "summary.txt".to_string()
    } else {
        format!("{stem}.txt")
    });
    let sl = slices(events);
    std::fs::write(&json, serde_json::to_vec(&chrome_trace(&sl, meta))?)?;
    std::fs::write(&summary, summarize(&sl, meta))?;
    Ok(TraceFiles {
        json,
        summary,
        events: events.len(),
    })
}

/// Microseconds (Chrome's unit) from the earliest event.
fn micros(ns: u64, t0: u64) -> f64 {
    (ns.saturating_sub(t0)) as f64 / 1000.0
}

/// The track of a thread: its block's, or a track of its own for a
/// block's other warps.
fn track(e: &TraceEvent) -> u64 {
    e.block as u64 * 2048 + e.warp as u64
}

/// The Chrome trace of `slices`: a process per rank, a track per block.
pub fn chrome_trace(slices: &[Slice], meta: &TraceMeta) -> serde_json::Value {
    use serde_json::json;
    let t0 = slices.iter().map(|s| s.begin.at_ns).min().unwrap_or(0);
    let mut out = Vec::with_capacity(slices.len() + 16);
    let mut tracks: BTreeMap<(u32, u64), (u32, u32)> = BTreeMap::new();
    for s in slices {
        tracks.insert((s.begin.rank, track(&s.begin)), (s.begin.block, s.begin.warp));
    }
    let ranks: std::collections::BTreeSet<u32> = tracks.keys().map(|k| k.0).collect();
    for r in &ranks {
        out.push(json!({"name": "process_name", "ph": "M", "pid": r, "args": {"name": format!("rank {r}")}}));
        out.push(json!({"name": "process_sort_index", "ph": "M", "pid": r, "args": {"sort_index": r}}));
    }
    for ((r, tid), (block, warp)) in &tracks {
        let name = if *block == ENGINE_BLOCK {
            "soft NIC engine".to_string()
        } else if *warp == 0 {
            format!("block {block}")
        } else {
            format!("block {block} warp {warp}")
        };
        out.push(json!({"name": "thread_name", "ph": "M", "pid": r, "tid": tid, "args": {"name": name}}));
        out.push(json!({"name": "thread_sort_index", "ph": "M", "pid": r, "tid": tid, "args": {"sort_index": tid}}));
    }
    let mut sorted: Vec<&Slice> = slices.iter().collect();
    sorted.sort_by_key(|s| (s.begin.rank, track(&s.begin), s.begin.at_ns, std::cmp::Reverse(s.dur_ns)));
    for s in sorted {
        let e = &s.begin;
        let mut args = serde_json::Map::new();
        if let Some(p) = e.peer {
            args.insert("peer".into(), json!(p));
        }
        let (key, end_key) = match e.what {
            What::Put | What::PutSignal | What::Get => ("bytes", None),
            What::Signal => ("offset", Some("value")),
            What::Wait => ("offset", Some("seen")),
            What::Produce | What::Consume | What::Acquire | What::Arrive => ("chunk", None),
            What::WqePosted => ("wqes", None),
            What::Doorbell => ("producer_index", None),
            What::Completion => ("consumer_index", None),
            What::Error => ("kind", None),
            What::NicFetch => ("wqe_index", None),
            What::NicExecute => ("bytes", None),
            What::NicCqe => ("cq_producer_index", None),
            What::NicDoorbell => ("doorbell", None),
            What::NicWake => ("idle_passes", None),
            What::Barrier | What::Quiet => ("arg", None),
        };
        args.insert(key.into(), json!(e.arg));
        if let (Some(k), false) = (end_key, s.instant) {
            args.insert(k.into(), json!(s.end_arg));
        }
        args.insert("lane".into(), json!(e.lane));
        let name = if s.instant && e.what.is_span() {
            format!("{} (no end)", e.what.name())
        } else {
            e.what.name().to_string()
        };
        let mut ev = json!({
            "name": name, "cat": category(e.what), "pid": e.rank, "tid": track(e),
            "ts": micros(e.at_ns, t0), "args": args,
        });
        if s.instant {
            ev["ph"] = json!("i");
            ev["s"] = json!("t");
        } else {
            ev["ph"] = json!("X");
            ev["dur"] = json!(s.dur_ns as f64 / 1000.0);
        }
        out.push(ev);
    }
    json!({
        "traceEvents": out,
        "displayTimeUnit": "ns",
        "otherData": {
            "producer": "doorbell",
            "clock": "device %globaltimer moved onto the host's realtime clock",
            "start_unix_ns": t0,
            "overwritten_per_rank": meta.overwritten,
            "clock_error_ns_per_rank": meta.clock_error_ns,
        },
    })
}

/// The category of a kind (Perfetto's filter).
fn category(w: What) -> &'static str {
    match w {
        What::Produce | What::Consume | What::Acquire | What::Arrive => "pipeline",
        What::WqePosted | What::Doorbell | What::Completion => "nic",
        What::NicFetch | What::NicExecute | What::NicCqe | What::NicDoorbell | What::NicWake => "nic engine",
        What::Error => "error",
        _ => "transport",
    }
}

/// Per rank: time producing, sending, waiting, consuming (summed over
/// blocks), counts and bytes.
pub fn summarize(slices: &[Slice], meta: &TraceMeta) -> String {
    #[derive(Default)]
    struct Tally {
        first: u64,
        last: u64,
        tracks: std::collections::BTreeSet<u64>,
        ns: BTreeMap<&'static str, u64>,
        n: BTreeMap<&'static str, u64>,
        bytes_put: u64,
        errors: u64,
        open: u64,
        nic_executed: u64,
        nic_bytes: u64,
        nic_cqes: u64,
    }
    let mut per: BTreeMap<u32, Tally> = BTreeMap::new();
    for s in slices {
        let e = &s.begin;
        let t = per.entry(e.rank).or_insert_with(|| Tally {
            first: u64::MAX,
            ..Tally::default()
        });
        t.first = t.first.min(e.at_ns);
        t.last = t.last.max(e.at_ns + s.dur_ns);
        t.tracks.insert(track(e));
        let class = match e.what {
            What::Produce => Some("producing"),
            What::Consume => Some("consuming"),
            What::Put | What::PutSignal | What::Get | What::Signal => Some("sending"),
            // Acquire and Arrive hold a wait each: counting the waits is enough.
            What::Wait | What::Barrier | What::Quiet => Some("waiting"),
            _ => None,
        };
        if let Some(c) = class {
            *t.ns.entry(c).or_default() += s.dur_ns;
            *t.n.entry(c).or_default() += 1;
        }
        if matches!(e.what, What::Put | What::PutSignal) {
            t.bytes_put += e.arg;
        }
        if e.what == What::Error {
            t.errors += 1;
        }
        match e.what {
            What::NicExecute => {
                t.nic_executed += 1;
                t.nic_bytes += e.arg;
            }
            What::NicCqe => t.nic_cqes += 1,
            _ => {}
        }
        if s.instant && e.what.is_span() {
            t.open += 1;
        }
    }
    let mut out = String::from("doorbell device trace: time summed over each rank's blocks\n");
    for (r, t) in &per {
        let ms = |c: &str| t.ns.get(c).copied().unwrap_or(0) as f64 / 1e6;
        let n = |c: &str| t.n.get(c).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "rank {r}: {:.3} ms from first to last event, {} tracks; producing {:.3} ms ({} chunks), \
             sending {:.3} ms ({} calls, {} bytes put), waiting {:.3} ms ({} waits), consuming {:.3} ms ({} chunks); \
             {} errors, {} spans without an end, {} events overwritten, clock within ±{} ns",
            (t.last - t.first) as f64 / 1e6,
            t.tracks.len(),
            ms("producing"),
            n("producing"),
            ms("sending"),
            n("sending"),
            t.bytes_put,
            ms("waiting"),
            n("waiting"),
            ms("consuming"),
            n("consuming"),
            t.errors,
            t.open,
            meta.overwritten.get(*r as usize).copied().unwrap_or(0),
            meta.clock_error_ns.get(*r as usize).copied().unwrap_or(0),
        );
        if t.nic_executed + t.nic_cqes > 0 {
            let _ = writeln!(
                out,
                "rank {r}: soft NIC engine: {} WQEs executed ({} bytes), {} CQEs written",
                t.nic_executed, t.nic_bytes, t.nic_cqes
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(rank: u32, at: u64, what: What, end: bool, block: u32, arg: u64) -> TraceEvent {
        TraceEvent {
            rank,
            at_ns: at,
            what,
            end,
            block,
            warp: 0,
            lane: 0,
            peer: Some(rank ^ 1),
            arg,
        }
    }

    #[test]
    fn encoding_round_trips_every_field() {
        let mut e = ev(3, 123_456_789_012, What::PutSignal, true, 77, 4096);
        e.warp = 9;
        e.lane = 31;
        e.peer = None;
        let f = ev(0, 5, What::Doorbell, false, 1, u64::MAX);
        assert_eq!(decode(&encode(&[e, f])), Some(vec![e, f]));
        assert_eq!(decode(&[0u8; 39]), None);
    }

    #[test]
    fn spans_pair_innermost_first_and_orphans_are_handled() {
        let events = [
            ev(0, 100, What::Acquire, false, 0, 7),
            ev(0, 110, What::Wait, false, 0, 64),
            ev(0, 150, What::Wait, true, 0, 9),
            ev(0, 160, What::Acquire, true, 0, 7),
            // An end whose begin was overwritten: dropped.
            ev(0, 170, What::Put, true, 0, 8),
            // A begin with no end: an instant.
            ev(0, 180, What::Wait, false, 0, 64),
            ev(0, 190, What::Doorbell, false, 0, 3),
        ];
        let s = slices(&events);
        assert_eq!(s.len(), 4, "the orphan end makes no slice: {s:?}");
        assert_eq!((s[0].begin.what, s[0].dur_ns, s[0].instant), (What::Acquire, 60, false));
        assert_eq!((s[1].begin.what, s[1].dur_ns, s[1].end_arg), (What::Wait, 40, 9));
        assert!(s[2].instant && s[2].begin.what == What::Wait);
        assert!(s[3].instant && s[3].begin.what == What::Doorbell);
    }

    #[test]
    fn chrome_trace_has_one_process_per_rank_and_sorted_tracks() {
        let events = [
            ev(1, 2_000, What::Put, false, 0, 256),
            ev(1, 3_000, What::Put, true, 0, 256),
            ev(0, 1_000, What::Produce, false, 2, 5),
            ev(0, 4_000, What::Produce, true, 2, 5),
        ];
        let v = chrome_trace(&slices(&events), &TraceMeta::default());
        let evs = v["traceEvents"].as_array().unwrap();
        let procs: Vec<_> = evs
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| e["pid"].clone())
            .collect();
        assert_eq!(procs, vec![serde_json::json!(0), serde_json::json!(1)]);
        let put = evs.iter().find(|e| e["name"] == "put").unwrap();
        assert_eq!(
            (put["ph"].as_str(), put["ts"].as_f64(), put["dur"].as_f64()),
            (Some("X"), Some(1.0), Some(1.0))
        );
        assert_eq!(put["args"]["bytes"], 256);
        let text = summarize(&slices(&events), &TraceMeta::default());
        assert!(text.contains("rank 0: 0.003 ms"), "{text}");
        assert!(text.contains("rank 1:") && text.contains("256 bytes put"), "{text}");
    }
}
