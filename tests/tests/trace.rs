//! The device trace (`doorbell::trace`): a pipeline's events recorded in
//! order with sane timestamps, on the emulator and (kernels built with the
//! `trace` feature) on the GPU; the Chrome trace valid; off means nothing
//! recorded; bad options are clear errors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use doorbell::comm::{CommOptions, Communicator};
use doorbell::trace::{TraceEvent, TraceOptions, What};
use doorbell::{Device, LaunchConfig};
use doorbell_tests::{per_backend, PipeByLaunch};

fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("doorbell-trace-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

const ELEMS: u64 = 5000;
const CHUNK: u64 = 512;
const LAUNCHES: u64 = 2;

/// Runs the pipeline `LAUNCHES` times on 2 ranks; returns each rank's
/// events and the host-clock window they must lie in.
fn traced_pipeline(dev: &Device, trace: Option<TraceOptions>) -> Vec<(Vec<TraceEvent>, u64, u64)> {
    let backend = dev.backend();
    let opts = CommOptions {
        heap_bytes: 8 << 20,
        wait_timeout: Duration::from_secs(30),
        trace,
        ..Default::default()
    };
    Communicator::local(2, backend, opts, |comm| {
        let module = comm.load_module(&doorbell_tests::TEST_KERNELS_TRACED)?;
        let pipe = PipeByLaunch::new(comm, &module, CHUNK, 2, ELEMS)?;
        let start = unix_ns();
        for launch in 0..LAUNCHES {
            comm.barrier()?;
            pipe.launch()?;
            comm.synchronize(&pipe.stream)?;
            let bad = pipe.wrong_values(comm, launch)?;
            assert_eq!(bad, 0, "rank {} launch {launch}: {bad} values wrong", comm.rank());
        }
        let end = unix_ns();
        Ok((comm.trace_events(), start, end))
    })
    .unwrap_or_else(|e| panic!("{backend:?}: {e}"))
}

per_backend! {
    /// Every chunk's steps are recorded once per launch with the right
    /// sequence numbers, bytes and peers, in the order the pipeline takes
    /// them, inside the window the host saw; then the Chrome trace of both
    /// ranks is valid and the summary counts the same chunks.
    fn a_traced_pipeline_records_every_chunk_in_order(dev: Device) {
        let dir = fresh_dir(&format!("pipeline-{:?}", dev.backend()));
        let opts = TraceOptions { rings: 64, events_per_ring: 256, ..TraceOptions::new(&dir) };
        let ranks = traced_pipeline(&dev, Some(opts));
        let chunks = ELEMS.div_ceil(CHUNK) * LAUNCHES;
        for (rank, (events, start, end)) in ranks.iter().enumerate() {
            let (next, prev) = ((rank as u32 + 1) % 2, (rank as u32 + 1) % 2);
            let begins = |w: What| events.iter().filter(move |e| e.what == w && !e.end);
            // Sequence numbers count each block's chunks, on across launches:
            // 2 producer blocks (0, 1) and their 2 consumers (2, 3).
            let per_block = chunks / 2;
            for (w, blocks) in [(What::Acquire, [0, 1]), (What::Produce, [0, 1]), (What::Arrive, [2, 3]), (What::Consume, [2, 3])] {
                let got: Vec<(u32, u64)> = begins(w).map(|e| (e.block, e.arg)).collect();
                let want: BTreeSet<(u32, u64)> = blocks.iter().flat_map(|&b| (0..per_block).map(move |q| (b, q))).collect();
                assert_eq!(got.len() as u64, chunks, "rank {rank}: {w:?} events: {got:?}");
                assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), want, "rank {rank}: {w:?} (block, sequence)");
            }
            assert!(begins(What::Produce).all(|e| e.peer == Some(next)), "rank {rank}: a chunk produced for another peer");
            assert!(begins(What::Consume).all(|e| e.peer == Some(prev)), "rank {rank}: a chunk consumed from another peer");
            let puts: Vec<_> = begins(What::PutSignal).collect();
            assert_eq!(puts.len() as u64, chunks, "rank {rank}: one put_signal per chunk");
            assert_eq!(puts.iter().map(|e| e.arg).sum::<u64>(), ELEMS * 4 * LAUNCHES, "rank {rank}: bytes put");
            assert!(puts.iter().all(|e| e.peer == Some(next)));
            // Every span ends, each thread's events in time order, all in the window.
            let slices = doorbell::trace::slices(events);
            assert!(slices.iter().all(|s| !s.instant), "rank {rank}: a span without its end");
            let mut last: BTreeMap<(u32, u32, u32), u64> = BTreeMap::new();
            let slack = 2_000_000; // the clock calibration's error and more
            for e in events {
                assert_eq!(e.rank, rank as u32);
                assert!(e.at_ns + slack >= *start && e.at_ns <= end + slack, "rank {rank}: {e:?} outside [{start}, {end}]");
                let l = last.entry((e.block, e.warp, e.lane)).or_insert(0);
                assert!(e.at_ns >= *l, "rank {rank}: time went back on block {} : {e:?}", e.block);
                *l = e.at_ns;
            }
            // Per producer block: a chunk's slot acquired, produced, then put.
            for s in slices.iter().filter(|s| s.begin.what == What::Produce) {
                let seq = s.begin.arg;
                let acq = slices
                    .iter()
                    .find(|a| a.begin.what == What::Acquire && a.begin.arg == seq && a.begin.block == s.begin.block)
                    .unwrap();
                assert!(acq.begin.at_ns + acq.dur_ns <= s.begin.at_ns, "rank {rank} chunk {seq}: produced before its slot was free");
            }
        }
        // Communicator::local wrote the world's trace when the ranks returned.
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("trace.json")).unwrap()).unwrap();
        let evs = json["traceEvents"].as_array().expect("traceEvents");
        let procs: BTreeSet<u64> = evs.iter().filter(|e| e["name"] == "process_name").map(|e| e["pid"].as_u64().unwrap()).collect();
        assert_eq!(procs, BTreeSet::from([0, 1]), "one process per rank");
        let mut last: BTreeMap<(u64, u64), f64> = BTreeMap::new();
        let mut n = 0;
        for e in evs.iter().filter(|e| e["ph"] != "M") {
            let (pid, tid, ts) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap(), e["ts"].as_f64().unwrap());
            assert!(e["name"].is_string() && e["cat"].is_string(), "{e}");
            match e["ph"].as_str() {
                Some("X") => assert!(e["dur"].as_f64().unwrap() >= 0.0, "{e}"),
                Some("i") => {}
                other => panic!("unexpected phase {other:?}: {e}"),
            }
            let l = last.entry((pid, tid)).or_insert(f64::MIN);
            assert!(ts >= *l, "track ({pid}, {tid}) goes back in time at {e}");
            *l = ts;
            n += 1;
        }
        let recorded: usize = ranks.iter().map(|r| doorbell::trace::slices(&r.0).len()).sum();
        assert_eq!(n, recorded, "every slice of both ranks is in the file");
        let summary = std::fs::read_to_string(dir.join("summary.txt")).unwrap();
        for r in 0..2 {
            assert!(summary.contains(&format!("rank {r}: ")), "{summary}");
        }
        assert!(summary.contains("producing ") && summary.contains(&format!("({chunks} chunks)")), "{summary}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Tracing off (the default): nothing is recorded, no file written, and
/// asking for the trace is a clear error.
#[test]
fn off_by_default_records_nothing() {
    let _env = doorbell_tests::env_reader();
    let dir = fresh_dir("off");
    let ranks = traced_pipeline(&Device::emulator(0), None);
    assert!(ranks.iter().all(|r| r.0.is_empty()), "events recorded with tracing off");
    assert!(!dir.exists());
    let e = Communicator::local(1, doorbell::Backend::Cpu, CommOptions::default(), |comm| {
        assert!(!comm.tracing());
        Ok(comm.trace_write().err().map(|e| e.to_string()).unwrap_or_default())
    })
    .unwrap();
    assert!(e[0].contains("does not trace") && e[0].contains("DOORBELL_TRACE"), "{}", e[0]);
}

/// Options that cannot work are refused naming the fix; a bad
/// `DOORBELL_TRACE_EVENTS` names the variable.
#[test]
fn bad_trace_options_are_clear_errors() {
    let _env = doorbell_tests::env_writer();
    let dir = fresh_dir("bad");
    for (rings, events, want) in [
        (3, 256, "powers of two"),
        (64, 100, "powers of two"),
        (1 << 16, 1 << 16, "more than"),
    ] {
        let opts = CommOptions {
            trace: Some(TraceOptions {
                rings,
                events_per_ring: events,
                ..TraceOptions::new(&dir)
            }),
            ..Default::default()
        };
        let e = Communicator::local(1, doorbell::Backend::Cpu, opts, |_| Ok(()))
            .err()
            .map(|e| e.to_string());
        let e = e.unwrap_or_default();
        assert!(e.contains(want), "rings {rings}, events {events}: {e}");
    }
    std::env::set_var("DOORBELL_TRACE_EVENTS", "1000");
    let e = doorbell::trace::options_from_env().err().map(|e| e.to_string()).unwrap_or_default();
    std::env::remove_var("DOORBELL_TRACE_EVENTS");
    assert!(e.contains("DOORBELL_TRACE_EVENTS") && e.contains("power of two"), "{e}");
}

/// A wait that runs out of budget leaves a wait without an end and an
/// error event in the trace, and the error of the synchronize.
#[test]
fn a_timed_out_wait_shows_as_an_open_wait_and_an_error() {
    let _env = doorbell_tests::env_reader();
    use doorbell_test_kernels::testing::p2p_wait_forever;
    let dir = fresh_dir("timeout");
    let opts = CommOptions {
        wait_timeout: Duration::from_millis(50),
        trace: Some(TraceOptions::new(&dir)),
        ..Default::default()
    };
    let got = Communicator::local(1, doorbell::Backend::Cpu, opts, |comm| {
        let m = comm.load_module(&doorbell_tests::TEST_KERNELS_TRACED)?;
        let f = m.function::<p2p_wait_forever>()?;
        let sig = comm.alloc::<u64>(1)?;
        let status = comm.device().alloc_zeroed::<u32>(1)?;
        let s = comm.device().new_stream()?;
        // SAFETY: `sig` is symmetric, `status` one word.
        unsafe {
            s.launch(
                &f,
                LaunchConfig::linear(1, 1),
                (comm.p2p()?, sig.as_mut_ptr(), status.as_raw() as *mut u32),
            )?
        };
        let err = comm.synchronize(&s).err().map(|e| e.to_string()).unwrap_or_default();
        Ok((err, comm.trace_events(), sig.offset()))
    })
    .unwrap();
    let (err, events, offset) = &got[0];
    assert!(err.contains("wait_until"), "{err}");
    let waits: Vec<_> = events.iter().filter(|e| e.what == What::Wait).collect();
    assert_eq!(waits.len(), 1, "{events:?}");
    assert!(!waits[0].end && waits[0].arg == *offset, "{waits:?}");
    let errors: Vec<_> = events.iter().filter(|e| e.what == What::Error).collect();
    assert_eq!(errors.len(), 1, "{events:?}");
    assert_eq!(errors[0].arg, doorbell::kernels::heap::ErrorKind::Timeout as u64);
    assert!(
        errors[0].at_ns >= waits[0].at_ns + 40_000_000,
        "the error came before the budget ran out"
    );
    let _ = std::fs::remove_dir_all(dir);
}

per_backend! {
    /// Over the soft NIC the engine's events go into each rank's trace, on
    /// a track of their own: every WQE fetched once and executed once, with
    /// the bytes the ring moved (its put and its get cut into WQEs of at
    /// most `max_msg` bytes), the signaled ones' CQEs, in time order, and
    /// the Chrome trace names the track. On the emulator both engines (the
    /// host thread, and the engine kernel with its bursts); on a GPU the
    /// engine kernel, whose events exist only in a build with the hooks
    /// (`DOORBELL_TRACE_KERNELS=1`, whose traced image the engine loads
    /// since the communicator asks for tracing): without them, none may
    /// appear.
    fn the_soft_nic_engine_records_its_wqes_on_a_track_of_its_own(dev: Device) {
        use doorbell::comm::{IbgdaOptions, SoftNicEngine, SOFTNIC};
        use doorbell::trace::ENGINE_BLOCK;
        use doorbell_tests::ring::{ring_once, RingTransport};
        const BYTES: usize = 5000;
        const MAX_MSG: u32 = 1024;
        let engines: &[SoftNicEngine] = if dev.is_gpu() { &[SoftNicEngine::Kernel] } else { &[SoftNicEngine::Thread, SoftNicEngine::Kernel] };
        // Tracing is asked for before the engine's module loads: its traced
        // image, when the build made one.
        let hooks = !dev.is_gpu() || SOFTNIC.ptx.contains("record_engine") || SOFTNIC.traced_ptx.contains("record_engine");
        if !hooks {
            eprintln!("the soft NIC engine kernel was built without the trace hooks: checking that it records nothing");
        }
        for &engine in engines {
            let dir = fresh_dir(&format!("engine-{engine:?}-{:?}", dev.backend()));
            let opts = CommOptions {
                heap_bytes: 1 << 20,
                wait_timeout: Duration::from_secs(30),
                trace: Some(TraceOptions {
                    rings: 16,
                    events_per_ring: 4096,
                    ..TraceOptions::new(&dir)
                }),
                ..Default::default()
            };
            let io = IbgdaOptions {
                sq_size: 32,
                max_msg: MAX_MSG,
                engine: Some(engine),
                ..Default::default()
            };
            let threads = if dev.is_gpu() { 256 } else { 64 };
            let ranks = Communicator::local(2, dev.backend(), opts, |comm| {
                ring_once(comm, BYTES, 0, false, threads, |c| Ok(RingTransport::Ibgda(c.ibgda_with(&io)?)))?;
                Ok(comm.trace_events())
            })
            .unwrap_or_else(|e| panic!("{engine:?}: {e}"));
            let nic = |w: What| matches!(w, What::NicFetch | What::NicExecute | What::NicCqe | What::NicDoorbell | What::NicWake);
            for (rank, events) in ranks.iter().enumerate() {
                let what = format!("{engine:?} engine, rank {rank}");
                let eng: Vec<&TraceEvent> = events.iter().filter(|e| e.block == ENGINE_BLOCK).collect();
                assert_eq!(events.iter().filter(|e| nic(e.what)).count(), eng.len(), "{what}: NIC events off the engine's track");
                if !hooks {
                    assert!(eng.is_empty(), "{what}: an engine built without the hooks recorded {eng:?}");
                    continue;
                }
                assert!(eng.iter().all(|e| nic(e.what) && e.warp == 0 && e.lane == 0 && !e.end), "{what}: {eng:?}");
                let of = |w: What| eng.iter().filter(move |e| e.what == w);
                let (fetched, executed, cqes) = (of(What::NicFetch).count(), of(What::NicExecute).count(), of(What::NicCqe).count());
                assert_eq!(fetched, executed, "{what}: every WQE fetched is executed once");
                assert!(cqes >= 1 && cqes <= executed, "{what}: {cqes} CQEs for {executed} WQEs");
                // Each run of WQEs starts in a pass that saw its doorbell.
                let first = |w: What| of(w).map(|e| e.at_ns).next();
                let (rung, fetch) = (first(What::NicDoorbell), first(What::NicFetch));
                assert!(rung.is_some() && rung <= fetch, "{what}: first doorbell seen {rung:?}, first WQE fetched {fetch:?}");
                // The ring's put and get: 4 full WQEs and one of 904 bytes each.
                let sizes: Vec<u64> = of(What::NicExecute).map(|e| e.arg).collect();
                let n = |b: u64| sizes.iter().filter(|&&s| s == b).count();
                let tail = (BYTES % MAX_MSG as usize) as u64;
                assert!(n(MAX_MSG as u64) >= 8 && n(tail) >= 2, "{what}: WQE sizes {sizes:?}");
                // Each WQE fetched before it is executed, the engine's clock on.
                let (mut t, mut pending) = (0, 0i64);
                for e in &eng {
                    assert!(e.at_ns >= t, "{what}: time went back at {e:?}");
                    t = e.at_ns;
                    match e.what {
                        What::NicFetch => pending += 1,
                        What::NicExecute => {
                            pending -= 1;
                            assert!(pending >= 0, "{what}: a WQE executed before it was fetched");
                        }
                        _ => {}
                    }
                }
            }
            if hooks {
                let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("trace.json")).unwrap()).unwrap();
                let named: BTreeSet<u64> = json["traceEvents"]
                    .as_array()
                    .expect("traceEvents")
                    .iter()
                    .filter(|e| e["name"] == "thread_name" && e["args"]["name"] == "soft NIC engine")
                    .map(|e| e["pid"].as_u64().unwrap())
                    .collect();
                assert_eq!(named, BTreeSet::from([0, 1]), "{engine:?}: a soft NIC engine track per rank");
                let summary = std::fs::read_to_string(dir.join("summary.txt")).unwrap();
                assert!(summary.contains("soft NIC engine: "), "{summary}");
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
