//! The soft NIC's engine kernel (`softnic_engine_256`, one persistent block
//! per port): the IBGDA ring and a fault-injection case run with it on the
//! CPU emulator and, when present, on the GPU (two GPUs: one rank per GPU,
//! the engine fencing at `sys` scope). Canaries around every target show
//! that nothing outside the transfers is written. The rest of the IBGDA
//! behaviour tests run with the kernel engine on the emulator under
//! `DOORBELL_SOFTNIC_ENGINE=kernel` (and with it by default on a GPU).

use doorbell_tests::per_backend;
use std::time::Duration;

use doorbell::comm::{CommOptions, Communicator, EnginePhase, IbgdaOptions, SoftNicEngine};
use doorbell::{Backend, Device, DeviceBuffer, ForTransport, LaunchConfig};
use doorbell_kernels::transport::Ibgda;
use doorbell_softnic::engine::{EngineConfig, LinkModel};
use doorbell_test_kernels::contract::{bad_call, flagged_rounds_ibgda};
use doorbell_test_kernels::testing::{pingpong_word, ring_ibgda, signal_pingpong_ibgda, STATUS_OK};
use doorbell_test_kernels::typed::lanes_many_qps_ibgda;
use doorbell_tests::{load_test_kernel, FlaggedRounds, Guarded, TEST_KERNELS};

fn opts(backend: Backend, wait: Duration) -> CommOptions {
    CommOptions {
        heap_bytes: 4 << 20,
        wait_timeout: wait,
        // Two GPUs: one rank per GPU (peer access, sys-scope fences).
        spread_gpus: backend == Backend::Gpu && doorbell::gpu_count() >= 2,
        ..CommOptions::default()
    }
}

fn kernel_engine(sq: u32, max_msg: u32) -> IbgdaOptions {
    IbgdaOptions {
        sq_size: sq,
        max_msg,
        engine: Some(SoftNicEngine::Kernel),
        ..IbgdaOptions::default()
    }
}

/// The ring (put, signal-add, wait, barrier, get) on `ranks` ranks over the
/// kernel engine, with messages large enough for block copies; `threads`:
/// the engine block's (default: the plain entry's 256, 32 on the emulator;
/// more: the wide entry).
fn ring_with_kernel_engine(dev_backend: Backend, ranks: usize, bytes: usize, threads: Option<u32>) {
    // `DOORBELL_LOG=debug` shows each set-up step (run with --nocapture).
    let _ = doorbell::init_logging();
    let io = IbgdaOptions {
        engine_threads: threads,
        ..kernel_engine(64, 64 << 10)
    };
    let reports = Communicator::local(ranks, dev_backend, opts(dev_backend, Duration::from_secs(20)), |comm| {
        let dev = comm.device();
        let m = dev.load_module(&TEST_KERNELS)?;
        let src = comm.alloc::<u8>(bytes)?;
        let dst = Guarded::new(comm, bytes)?;
        let got = Guarded::new(comm, bytes)?;
        let sig = comm.alloc::<u64>(1)?;
        let mut status = dev.alloc_zeroed::<u32>(1)?;
        let mine: Vec<u8> = (0..bytes).map(|i| (i as u8) ^ (comm.rank() as u8 * 91) ^ 0x3c).collect();
        src.copy_from_host(&mine)?;
        let t = comm.ibgda_with(&io)?;
        let bufs = (src.as_mut_ptr(), dst.buf.as_mut_ptr(), got.buf.as_mut_ptr());
        let args = doorbell_tests::ring_round(t, bufs, bytes as u64, sig.as_mut_ptr(), status.as_mut_ptr());
        // SAFETY: sizes as the ring kernel documents.
        let s = unsafe { doorbell_tests::launch_after_barrier(comm, &m.function::<ring_ibgda>()?, LaunchConfig::linear(1, 64), args)? };
        if let Err(e) = comm.synchronize(&s) {
            // Where the engine stands tells which step stalled.
            eprintln!("rank {}: {e}; {}", comm.rank(), progress_of(comm));
            return Err(e);
        }
        comm.ibgda_check()?;
        assert_eq!(status.to_host()?[0], STATUS_OK, "rank {}", comm.rank());
        let prev = (comm.rank() + ranks - 1) % ranks;
        let want: Vec<u8> = (0..bytes).map(|i| (i as u8) ^ (prev as u8 * 91) ^ 0x3c).collect();
        assert!(dst.buf.to_host()? == want, "put into rank {} differs", comm.rank());
        assert!(got.buf.to_host()? == want, "get by rank {} differs", comm.rank());
        assert!(
            dst.canaries_intact()? && got.canaries_intact()?,
            "rank {}: a canary changed",
            comm.rank()
        );
        let stats = comm.soft_nic().expect("set up").stats();
        let report = comm.ibgda_engine().expect("set up");
        // The record is published every few hundred passes: wait for the
        // one that includes this port's last WQE.
        let t0 = std::time::Instant::now();
        let progress = loop {
            let p = comm.ibgda_progress().expect("set up");
            if (p.record.wqes >= stats.wqes && p.record.cqes >= stats.cqes) || t0.elapsed() > Duration::from_secs(10) {
                break p;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        comm.barrier()?;
        Ok((report, stats, progress))
    })
    .expect("the world");
    for (r, (report, stats, progress)) in reports.iter().enumerate() {
        let p = &progress.record;
        assert!(p.seq > 0 && p.passes > 0, "rank {r}: no progress record: {progress}");
        assert!(
            p.doorbells > 0 && p.last_uar != 0 && p.last_sq_pi != 0,
            "rank {r}: no doorbell in the record: {progress}"
        );
        assert!(
            p.wqes >= stats.wqes && p.fetched >= p.wqes && p.cqes > 0 && p.errors == 0,
            "rank {r}: the record's WQE and CQE counts trail the port's ({stats:?}): {progress}"
        );
        assert!(progress.to_string().contains(&format!("{} passes", p.passes)), "{progress}");
        assert_eq!(report.engine, SoftNicEngine::Kernel, "rank {r}");
        if let Some(t) = threads {
            assert_eq!(report.threads, t, "rank {r}: the engine block's threads");
        }
        assert!(report.counters.passes > 0, "rank {r}: the engine made no pass: {report:?}");
        assert!(
            report.counters.block_copies > 0,
            "rank {r}: no block copy of {bytes}-byte messages: {report:?}"
        );
        assert!(
            report.counters.thread_copies + report.counters.burst_wqes > 0,
            "rank {r}: signals are copied by the control thread or a burst: {report:?}"
        );
        assert!(stats.wqes > 0 && stats.errors == 0, "rank {r}: port counters {stats:?}");
        // The profile: every step a WRITE or READ takes counted cycles; the
        // responder's receive steps, which no operation of the ring takes
        // (no sends, no writes with immediate), none.
        let cycles = |p: EnginePhase| report.counters.phase_cycles[p as usize];
        for p in [
            EnginePhase::Doorbell,
            EnginePhase::Fetch,
            EnginePhase::Room,
            EnginePhase::Parse,
            EnginePhase::Local,
            EnginePhase::Peer,
            EnginePhase::Remote,
            EnginePhase::Requester,
        ] {
            assert!(cycles(p) > 0, "rank {r}: no cycles in phase {}: {report:?}", p.name());
        }
        for p in [EnginePhase::Receive, EnginePhase::Responder] {
            assert_eq!(cycles(p), 0, "rank {r}: cycles in phase {}: {report:?}", p.name());
        }
    }
}

/// The engine's progress record as one line, for error paths.
fn progress_of(comm: &Communicator) -> String {
    comm.ibgda_progress()
        .map_or_else(|| "IBGDA not set up".to_string(), |p| p.to_string())
}

/// Every doorbell dropped and no doorbell-record re-read: the engine sees
/// the doorbells but fetches nothing, the ring's waits run out of budget,
/// and the progress record printed with the error says exactly that.
#[test]
fn a_stalled_wait_is_explained_by_the_engines_progress_record() {
    let _ = doorbell::init_logging();
    let b = Backend::Cpu;
    // The counters below start from a fresh engine and fresh queues: no
    // self-test traffic at IBGDA set-up.
    let opts = CommOptions {
        self_test: Some(false),
        ..opts(b, Duration::from_secs(2))
    };
    let lines = Communicator::local(2, b, opts, |comm| {
        let dev = comm.device();
        let m = dev.load_module(&TEST_KERNELS)?;
        let src = comm.alloc::<u8>(4096)?;
        let dst = comm.alloc::<u8>(4096)?;
        let got = comm.alloc::<u8>(4096)?;
        let sig = comm.alloc::<u64>(1)?;
        let mut status = dev.alloc_zeroed::<u32>(1)?;
        let t = comm.ibgda_with(&kernel_engine(64, 64 << 10))?;
        let nic = comm.soft_nic().expect("set up");
        if comm.rank() == 0 {
            let mut cfg = nic.fabric().config();
            cfg.faults.drop_doorbell_every = 1;
            cfg.dbr_reread_ns = u64::MAX;
            nic.fabric().try_set_config(cfg).expect("the engine kernel takes the configuration");
        }
        comm.barrier()?;
        // A pass that began before the configuration arrived may still see
        // a doorbell with the old one: wait for two publications (a pass
        // that began after it) first.
        let seq = comm.ibgda_progress().expect("set up").record.seq;
        let t0 = std::time::Instant::now();
        while comm.ibgda_progress().expect("set up").record.seq < seq + 2 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "rank {}: the engine stopped publishing",
                comm.rank()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let bufs = (src.as_mut_ptr(), dst.as_mut_ptr(), got.as_mut_ptr());
        let args = doorbell_tests::ring_round(t, bufs, 4096u64, sig.as_mut_ptr(), status.as_mut_ptr());
        // SAFETY: sizes as the ring kernel documents.
        let s = unsafe { doorbell_tests::launch_after_barrier(comm, &m.function::<ring_ibgda>()?, LaunchConfig::linear(1, 32), args)? };
        let err = comm.synchronize(&s).err();
        // Past the budget the record has had thousands of passes to land.
        let p = comm.ibgda_progress().expect("set up");
        let line = format!("{}; {p}", err.map(|e| e.to_string()).unwrap_or_else(|| "no error".to_string()));
        let queues = comm.ibgda_queues()?.expect("set up");
        comm.barrier()?;
        Ok((line, p, queues))
    })
    .expect("the world");
    for (r, (line, p, queues)) in lines.iter().enumerate() {
        // The queues say the same from the kernels' side: the WQEs to the
        // next rank were rung and none completed.
        let next = (r + 1) % 2;
        let rung: Vec<_> = queues.iter().filter(|q| q.peer == next && q.ready != q.completed).collect();
        assert!(
            !rung.is_empty(),
            "rank {r}: no queue to rank {next} with rung, uncompleted WQEs: {queues:?}"
        );
        for q in &rung {
            assert!(q.rank == r && q.completed == 0 && q.ready == q.producer, "rank {r}: {q}");
            assert!(q.to_string().contains(&format!("rung {}, completed 0", q.ready)), "{q}");
        }
        assert!(!line.starts_with("no error"), "rank {r}: the stalled ring finished: {line}");
        let rec = &p.record;
        assert!(rec.passes > 0 && rec.doorbells > 0, "rank {r}: {line}");
        assert!(rec.fetched == 0 && rec.wqes == 0 && rec.cqes == 0, "rank {r}: {line}");
        assert!(
            line.contains(&format!(
                "engine port {}: {} passes, doorbell record 0 (last UAR {:#x}), {} doorbells",
                p.port, rec.passes, rec.last_uar, rec.doorbells
            )),
            "rank {r}: {line}"
        );
        assert!(line.contains("0 WQEs fetched") && rec.last_uar != 0, "rank {r}: {line}");
    }
}

per_backend! {
    fn the_engine_kernel_runs_the_ring_with_block_copies_and_writes_nothing_else(dev: Device) {
        let b = dev.backend();
        // Odd sizes: unaligned tails in every block copy; several WQEs per put.
        ring_with_kernel_engine(b, 3, 200_003, None);
        ring_with_kernel_engine(b, 2, 5_000, None);
        // The other two entries: blocks of 257..=512 threads, and more.
        ring_with_kernel_engine(b, 2, 200_003, Some(512));
        ring_with_kernel_engine(b, 2, 200_003, Some(640));
    }
}

/// Round trips of one 8-byte put with a signal over the kernel engine
/// ([`signal_pingpong_ibgda`]): every payload is the iteration's, the
/// signal ends at the round trips' count (an atomic applied twice or never
/// would show), and each rank's engine served doorbells on the lone path
/// (one QP rung while it idled): with `add`, the WRITE there and the
/// atomic behind it in the pass that follows at once.
fn lone_round_trips(backend: Backend, iters: u32, add: bool) {
    let _ = doorbell::init_logging();
    // A busy machine can make every emulated pass outlast the refresh period
    // (all forced, none lone): the checked round trips then run again.
    let runs = if backend == Backend::Gpu { 1 } else { 3 };
    let mut reports = vec![];
    for _ in 0..runs {
        reports = lone_round_trip_run(backend, iters, add);
        if reports.iter().all(|c| c.lone_doorbells > 0) {
            break;
        }
    }
    for (r, c) in reports.iter().enumerate() {
        eprintln!(
            "rank {r} (add {add}): {} lone doorbells, {} WQEs on the lone path, {} in bursts, {} passes",
            c.lone_doorbells, c.lone_wqes, c.burst_wqes, c.passes
        );
        assert!(
            c.lone_doorbells > 0 && c.lone_wqes > 0,
            "rank {r}: nothing took the lone path: {c:?}"
        );
        // The round trips post two WQEs each; the ranks' barriers around
        // them a few more (a rank's last WQEs may all take the lone path).
        assert!(
            c.rung_wqes <= iters as u64 * 2 + 8,
            "rank {r}: the engine saw more WQEs rung than the round trips and barriers post: {c:?}"
        );
        assert!(c.lone_wqes <= c.rung_wqes, "rank {r}: more lone WQEs than rung: {c:?}");
        assert!(
            c.phase_cycles[EnginePhase::Lone as usize] > 0,
            "rank {r}: no cycles in the lone phase: {c:?}"
        );
    }
}

/// One checked run of [`lone_round_trips`]: each rank's engine counters.
fn lone_round_trip_run(backend: Backend, iters: u32, add: bool) -> Vec<doorbell_softnic::engine::EngineCounters> {
    let io = kernel_engine(64, 64 << 10);
    Communicator::local(2, backend, opts(backend, Duration::from_secs(20)), |comm| {
        let dev = comm.device();
        let m = dev.load_module(&TEST_KERNELS)?;
        let (src, dst, sig) = (comm.alloc::<u64>(1)?, comm.alloc::<u64>(1)?, comm.alloc::<u64>(1)?);
        let mut bad = dev.alloc_zeroed::<u32>(1)?;
        let mut status = dev.alloc_zeroed::<u32>(1)?;
        let t = comm.ibgda_with(&io)?;
        let args = (
            t,
            src.as_mut_ptr(),
            dst.as_mut_ptr(),
            sig.as_mut_ptr(),
            iters,
            add as u32,
            bad.as_mut_ptr(),
            status.as_mut_ptr(),
        );
        let f = m.function::<signal_pingpong_ibgda>()?;
        // SAFETY: symmetric words and one word each for `bad` and `status`.
        let s = unsafe { doorbell_tests::launch_after_barrier(comm, &f, LaunchConfig::linear(1, 32), args)? };
        if let Err(e) = comm.synchronize(&s) {
            eprintln!("rank {}: {e}; {}", comm.rank(), progress_of(comm));
            return Err(e);
        }
        comm.ibgda_check()?;
        let r = comm.rank() as u32;
        assert_eq!(status.to_host()?[0], STATUS_OK, "rank {r}");
        assert_eq!(bad.to_host()?[0], 0, "rank {r}: payloads that were not their iteration's");
        assert_eq!(dst.to_host()?[0], pingpong_word(iters as u64, 1 - r), "rank {r}: the last payload");
        assert_eq!(sig.to_host()?[0], iters as u64, "rank {r}: the signal");
        comm.barrier()?;
        Ok(comm.ibgda_engine().expect("set up").counters)
    })
    .expect("the world")
}

per_backend! {
    fn lone_round_trips_take_the_lone_path_and_deliver_every_payload(dev: Device) {
        let iters = if dev.is_gpu() { 2000 } else { 200 };
        lone_round_trips(dev.backend(), iters, false);
        lone_round_trips(dev.backend(), iters, true);
    }
}

/// One `put_signal_block` (rank 0 → rank 1, 64 KiB, signal 7) with every
/// WQE failed on purpose: a typed completion error, no byte of the target
/// or the signal written, canaries intact; after a reset the same call
/// delivers.
fn forced_error_with_kernel_engine(backend: Backend) {
    let _ = doorbell::init_logging();
    const BYTES: usize = 64 << 10;
    Communicator::local(2, backend, opts(backend, Duration::from_secs(20)), |comm| {
        let dev = comm.device();
        let f = load_test_kernel::<<bad_call as ForTransport<Ibgda>>::Kernel>(dev)?;
        let dst = Guarded::new(comm, BYTES)?;
        dst.buf.copy_from_host(&[0u8; BYTES])?;
        let sig = comm.alloc::<u64>(2)?;
        let src_host: Vec<u8> = (0..BYTES).map(|i| (i % 251) as u8 + 1).collect();
        let src = dev.alloc_from(&src_host)?;
        let mut codes = dev.alloc_zeroed::<u32>(2)?;
        comm.ibgda_with(&kernel_engine(256, 1 << 20))?;
        // SAFETY: `src` outlives the communicator's use of it here.
        let t = unsafe { comm.ibgda_register(src.as_ptr() as u64, BYTES)? };
        let nic = comm.soft_nic().expect("set up");
        if comm.rank() == 0 {
            let mut cfg = nic.fabric().config();
            cfg.faults.force_error_every = 1;
            nic.fabric().try_set_config(cfg).expect("the engine kernel takes the configuration");
        }
        comm.barrier()?;
        let s = dev.new_stream()?;
        // The put_signal case (6) through handle `t`, results in `codes`.
        let put_signal = |t: Ibgda, codes: &mut DeviceBuffer<u32>| {
            let a = (dst.buf.as_mut_ptr(), src.as_ptr(), BYTES as u64, sig.as_mut_ptr(), 6u32);
            // SAFETY: symmetric dst/sig, src of BYTES, two code words.
            unsafe { s.launch(&f, LaunchConfig::linear(1, 64), (t, a.0, a.1, a.2, a.3, a.4, codes.as_mut_ptr())) }
        };
        put_signal(t, &mut codes)?;
        let err = comm.synchronize(&s).err().map(|e| format!("{e}; {}", progress_of(comm)));
        let check = comm.ibgda_check().err().map(|e| e.to_string());
        comm.barrier()?;
        if comm.rank() == 0 {
            assert_eq!(codes.to_host()?[0], 2, "rank 0's result code: {err:?}");
            let err = err.unwrap_or_default();
            assert!(err.contains("syndrome 0x14"), "{err}");
            let check = check.unwrap_or_default();
            assert!(check.contains("REMOTE_OP_ERR"), "{check}");
            let log = nic.error_log();
            assert!(!log.is_empty(), "the engine kernel's error log is empty");
        } else {
            assert!(dst.buf.to_host()?.iter().all(|&b| b == 0), "the failed put wrote into rank 1");
            assert_eq!(sig.to_host()?, vec![0, 0], "the failed signal changed");
            assert!(dst.canaries_intact()?, "a canary changed");
        }
        comm.barrier()?;

        // Faults off (the configuration reaches the running engine), reset, again.
        if comm.rank() == 0 {
            nic.fabric().try_set_config(EngineConfig::default()).expect("configuration");
        }
        comm.barrier()?;
        comm.ibgda_reset()?;
        // SAFETY: as above.
        let t = unsafe { comm.ibgda_register(src.as_ptr() as u64, BYTES)? };
        assert_eq!(
            comm.ibgda_engine().map(|e| e.engine),
            Some(SoftNicEngine::Kernel),
            "reset keeps the engine kind"
        );
        let mut codes = dev.alloc_zeroed::<u32>(2)?;
        comm.barrier()?;
        put_signal(t, &mut codes)?;
        if let Err(e) = comm.synchronize(&s) {
            eprintln!("rank {}: {e}; {}", comm.rank(), progress_of(comm));
            return Err(e);
        }
        comm.barrier()?;
        assert_eq!(codes.to_host()?[0], 0, "rank {} after reset", comm.rank());
        if comm.rank() == 1 {
            assert!(dst.buf.to_host()? == src_host, "the put after reset did not deliver");
            assert!(dst.canaries_intact()?, "a canary changed after reset");
        }
        Ok(())
    })
    .expect("the world");
}

per_backend! {
    fn forced_error_completions_with_the_engine_kernel_are_typed_and_write_nothing(dev: Device) {
        forced_error_with_kernel_engine(dev.backend());
    }
}

#[test]
fn on_a_gpu_the_kernel_engine_is_the_default_and_the_thread_engine_is_refused() {
    let Some(_gpu) = doorbell_tests::gpu() else {
        eprintln!("no GPU: skipped (it checks the GPU default; DOORBELL_TEST_REQUIRE_GPU=1 makes a missing GPU a failure)");
        return;
    };
    let kinds = Communicator::local(2, Backend::Gpu, CommOptions::default(), |comm| {
        comm.ibgda_with(&IbgdaOptions::default())?;
        Ok(comm.ibgda_engine().map(|e| (e.engine, e.threads)))
    })
    .expect("IBGDA on a GPU");
    assert!(
        kinds
            .iter()
            .all(|k| *k == Some((SoftNicEngine::Kernel, doorbell::comm::ENGINE_THREADS_GPU))),
        "{kinds:?}"
    );
    let thread = IbgdaOptions {
        engine: Some(SoftNicEngine::Thread),
        ..IbgdaOptions::default()
    };
    let r = Communicator::local(2, Backend::Gpu, CommOptions::default(), |comm| comm.ibgda_with(&thread).map(|_| ()));
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("DOORBELL_SOFTNIC_ENGINE=kernel"), "{msg}");
}

#[test]
fn engine_settings_are_parsed_strictly() {
    assert_eq!(SoftNicEngine::parse("V", "kernel").unwrap(), SoftNicEngine::Kernel);
    assert_eq!(SoftNicEngine::parse("V", " thread ").unwrap(), SoftNicEngine::Thread);
    for bad in ["", "gpu", "Kernel", "threads"] {
        let e = SoftNicEngine::parse("DOORBELL_SOFTNIC_ENGINE", bad).unwrap_err().to_string();
        assert!(e.contains("DOORBELL_SOFTNIC_ENGINE"), "{bad}: {e}");
    }
    let with = |engine_threads, engine_blocks| IbgdaOptions {
        engine_threads,
        engine_blocks,
        ..kernel_engine(64, 1 << 20)
    };
    let bad = [
        (with(Some(48), None), "multiple of 32"),
        (with(None, Some(33)), "engine_blocks 33 is not in 1..=32"),
        (with(None, Some(0)), "engine_blocks 0 is not in 1..=32"),
    ];
    for (io, want) in bad {
        let r = Communicator::local(1, Backend::Cpu, CommOptions::default(), |comm| comm.ibgda_with(&io).map(|_| ()));
        let e = r.unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    let _ = Device::emulator(0);
}

/// Warp-wide runs of 8-byte puts, with signals in every other round (runs
/// of 32 puts alone between: rows of a burst led by an ordered WRITE), from `blocks` blocks on as
/// many QPs, through an engine of `threads` threads (a burst per warp of
/// it at once): every word and every signal arrives; returns rank 0's
/// engine counters.
fn lanes_over_many_qps(backend: Backend, blocks: u32, threads: u32, engine_blocks: Option<u32>) -> doorbell::comm::EngineReport {
    lanes_over_many_qps_linked(backend, blocks, threads, engine_blocks, None).0
}

/// [`lanes_over_many_qps`] over a port with the link model `link`; also
/// returns, for each rank, the time from its launch to its kernel's end
/// (rank 0 puts and quiets: its WQEs complete; rank 1 returns at once).
fn lanes_over_many_qps_linked(
    backend: Backend,
    blocks: u32,
    threads: u32,
    engine_blocks: Option<u32>,
    link: Option<LinkModel>,
) -> (doorbell::comm::EngineReport, Vec<Duration>) {
    const ROUNDS: u32 = 24;
    let io = IbgdaOptions {
        qps_per_peer: blocks,
        engine_threads: Some(threads),
        engine_blocks,
        link,
        ..kernel_engine(256, 1 << 20)
    };
    let words = (ROUNDS * blocks * 32) as usize;
    let src_words: Vec<u64> = (0..words as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5a).collect();
    let out = Communicator::local(2, backend, opts(backend, Duration::from_secs(30)), |comm| {
        let f = load_test_kernel::<lanes_many_qps_ibgda>(comm.device())?;
        let t = comm.ibgda_with(&io)?;
        let dst = comm.alloc::<u64>(words)?;
        let src = comm.alloc::<u64>(words)?;
        let sigs = comm.alloc::<u64>(blocks as usize)?;
        dst.copy_from_host(&vec![0; words])?;
        src.copy_from_host(&src_words)?;
        sigs.copy_from_host(&vec![0; blocks as usize])?;
        let mut codes = comm.device().alloc_from(&vec![u32::MAX; blocks as usize])?;
        let s = comm.device().new_stream()?;
        comm.barrier()?;
        let t0 = std::time::Instant::now();
        // SAFETY: symmetric buffers of the sizes the kernel documents.
        unsafe {
            s.launch(
                &f,
                LaunchConfig::linear(blocks, 32),
                (t, dst.sym(), src.sym(), sigs.sym(), ROUNDS, codes.as_mut_ptr()),
            )?
        };
        comm.synchronize(&s)?;
        let took = t0.elapsed();
        comm.barrier()?;
        Ok((
            codes.to_host()?,
            dst.to_host()?,
            sigs.to_host()?,
            comm.ibgda_engine().expect("set up"),
            took,
        ))
    })
    .unwrap_or_else(|e| panic!("{backend:?}, {blocks} QPs, {engine_blocks:?} engine blocks: {e}"));
    assert_eq!(out[0].0, vec![0; blocks as usize], "rank 0's blocks' results");
    assert!(out[1].1 == src_words, "{backend:?}: rank 1's words differ from rank 0's source");
    assert_eq!(
        out[1].2,
        // Lanes 0, 4, .., 28 signal in even rounds.
        vec![(ROUNDS as u64).div_ceil(2) * 8; blocks as usize],
        "{backend:?}: the blocks' signal words"
    );
    (out[0].3.clone(), out.iter().map(|o| o.4).collect())
}

per_backend! {
    /// Eight QPs posting warp-wide runs at once through an engine of 8 warps
    /// (bursts of several QPs side by side) and of one warp (one at a time):
    /// every word and signal arrives; the engine counts its burst rounds and
    /// stores the runs' marked WRITEs without a release each.
    fn bursts_of_many_qps_run_side_by_side_and_deliver_everything(dev: Device) {
        let b = dev.backend();
        for threads in [256, 32] {
            let r = lanes_over_many_qps(b, 8, threads, None);
            let c = r.counters;
            assert!(c.burst_wqes > 0 && c.burst_rounds > 0, "{threads} threads: no bursts: {r:?}");
            // The runs' WRITEs after each run's first are marked unordered
            // and stored without a release each (every word was checked above).
            assert!(
                c.unordered_wqes > 0 && c.unordered_wqes < c.burst_wqes,
                "{threads} threads: unordered WRITEs {} of {} burst WQEs: {r:?}",
                c.unordered_wqes,
                c.burst_wqes
            );
            if threads == 32 {
                assert!(c.bursts <= c.burst_rounds, "one warp runs at most one burst a round: {r:?}");
            } else {
                assert!(c.bursts > c.burst_rounds, "8 warps never ran two QPs' bursts in one round: {r:?}");
            }
            eprintln!(
                "{threads} engine threads: {} WQEs in {} bursts in {} rounds ({:.2} bursts a round)",
                c.burst_wqes,
                c.bursts,
                c.burst_rounds,
                c.bursts as f64 / c.burst_rounds as f64
            );
        }
    }
}

per_backend! {
    /// Eight QPs, each with a CQ of its own, through an engine of four
    /// blocks: each block serves two of them (its own control thread and
    /// bursts), every word and signal arrives, and each block executed
    /// WQEs of its own.
    fn an_engine_of_several_blocks_serves_its_qps_side_by_side(dev: Device) {
        let b = dev.backend();
        let threads = if b == Backend::Gpu { 256 } else { 32 };
        let r = lanes_over_many_qps(b, 8, threads, Some(4));
        assert_eq!(r.blocks.len(), 4, "engine blocks: {r:?}");
        for (i, c) in r.blocks.iter().enumerate() {
            assert!(c.burst_wqes > 0 && c.busy_passes > 0, "block {i} executed nothing: {r:?}");
        }
        let total: u64 = r.blocks.iter().map(|c| c.burst_wqes).sum();
        assert_eq!(total, r.counters.burst_wqes, "the blocks' counters add up");
        // One block: the same QPs through one control thread.
        let one = lanes_over_many_qps(b, 8, threads, Some(1));
        assert_eq!(one.blocks.len(), 1, "{one:?}");
    }
}

per_backend! {
    /// The link model's one transmitter per port, shared by the port's
    /// engine blocks: four QPs on four blocks over a slow modeled link
    /// deliver every word and signal, every block executes WQEs of its
    /// own, and rank 0's kernel (the one that puts; it waits for its
    /// WRITEs) does not end before the wire time of all its WRITEs one
    /// after another (four transmitters, one per block, would take a
    /// quarter of it; the emulator is slower than the link, so there the
    /// bound holds whatever the engine does and the test shows only the
    /// words and the blocks).
    fn the_link_models_transmitter_is_shared_by_the_ports_engine_blocks(dev: Device) {
        let b = dev.backend();
        let threads = if b == Backend::Gpu { 256 } else { 32 };
        // 10 Mb/s: 6.4 us on the wire per 8-byte WRITE.
        let link = LinkModel::new(10_000_000, 1_000);
        let (r, took) = lanes_over_many_qps_linked(b, 4, threads, Some(4), Some(link));
        assert_eq!(r.blocks.len(), 4, "engine blocks: {r:?}");
        for (i, c) in r.blocks.iter().enumerate() {
            assert!(c.rung_wqes > 0 && c.busy_passes > 0, "block {i} executed nothing: {r:?}");
        }
        // Each rank's 4 QPs x 24 rounds x 32 lanes of 8-byte WRITEs (its
        // signals' atomics besides, not counted).
        let wire = Duration::from_nanos(link.wire_ps(4 * 24 * 32 * 8) / 1000);
        assert!(took[0] >= wire, "rank 0's kernel took {:?}, less than its WRITEs' {wire:?} on one transmitter", took[0]);
        eprintln!("{b:?}: rank 0's kernel took {:?}, its WRITEs' wire time {wire:?}", took[0]);
    }
}

per_backend! {
    /// Two ranks with 32 QPs per peer fill each port's 64 QP slots: 32
    /// blocks post on their own QPs through an engine of 8 blocks, every
    /// word and signal arrives and every engine block executed WQEs; a
    /// third rank would need 96 slots and is refused before any QP is made,
    /// the error naming the setting that fits.
    fn thirty_two_qps_per_peer_fill_the_port_and_a_world_past_it_is_refused(dev: Device) {
        let b = dev.backend();
        let threads = if b == Backend::Gpu { 256 } else { 32 };
        let r = lanes_over_many_qps(b, 32, threads, Some(8));
        assert_eq!(r.blocks.len(), 8, "engine blocks: {r:?}");
        for (i, c) in r.blocks.iter().enumerate() {
            assert!(c.burst_wqes > 0, "engine block {i} executed nothing: {r:?}");
        }
        let io = IbgdaOptions {
            qps_per_peer: 32,
            ..kernel_engine(64, 1 << 20)
        };
        let e = Communicator::local(3, b, opts(b, Duration::from_secs(30)), |comm| comm.ibgda_with(&io).map(|_| ()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("3 ranks x 32 QPs per peer need 96 QPs") && e.contains("use at most 21 QPs per peer (DOORBELL_IBGDA_QPS_PER_PEER"),
            "{e}"
        );
    }
}

per_backend! {
    /// Puts and gets of payloads whose two ends share their offset mod 16
    /// (the SM's bulk-copy unit moves the aligned body, the threads the
    /// head and tail) and whose ends do not (the threads move it all),
    /// with the default bulk copies and with thread copies: every byte
    /// arrives, none around the target changes, and the bulk-copy unit
    /// moved exactly the aligned bodies of the WQEs of 64 KiB or more
    /// (none with thread copies).
    fn aligned_and_misaligned_payloads_arrive_through_bulk_and_thread_copies(dev: Device) {
        let b = dev.backend();
        // (bytes, source offset, destination offset): 3 WQEs of up to
        // 1 MiB with a 13-byte head; one WQE the threads copy (offsets 5
        // and 9 differ mod 16); one just over the bulk minimum.
        let cases = [((2 << 20) + 4100, 3usize, 3usize), (300_005, 5, 9), (doorbell_softnic::engine::resident::BULK_MIN + 16, 0, 0)];
        let room = (2 << 20) + 4200;
        for thread_copies in [false, true] {
            let io = IbgdaOptions {
                qps_per_peer: 1,
                engine_thread_copies: thread_copies,
                ..kernel_engine(64, 1 << 20)
            };
            let o = CommOptions {
                heap_bytes: 32 << 20,
                ..opts(b, Duration::from_secs(30))
            };
            let reports = Communicator::local(2, b, o, |comm| {
                let m = comm.device().load_module(&TEST_KERNELS)?;
                let src = comm.alloc::<u8>(room)?;
                let dst = Guarded::new(comm, room)?;
                let got = Guarded::new(comm, room)?;
                let sig = comm.alloc::<u64>(1)?;
                let t = comm.ibgda_with(&io)?;
                let bulk_before = comm.ibgda_engine().expect("set up").counters.bulk_bytes;
                // What the bulk-copy unit must move for this rank's put and
                // get (each executed by this rank's engine): per WQE of up
                // to 1 MiB whose ends share their offset mod 16 and that is
                // at least BULK_MIN long, its body after the head.
                let mut bulk_want = 0u64;
                for &(bytes, so, d_off) in &cases {
                    for lo in (0..bytes).step_by(1 << 20) {
                        let n = (bytes - lo).min(1 << 20);
                        let (d, s) = (dst.buf.as_mut_ptr() as usize + d_off + lo, src.as_mut_ptr() as usize + so + lo);
                        if n >= doorbell_softnic::engine::resident::BULK_MIN && (d ^ s) & 15 == 0 {
                            let head = (16 - d % 16) % 16;
                            bulk_want += 2 * ((n - head) & !15) as u64;
                        }
                    }
                }
                for (round, &(bytes, so, d_off)) in cases.iter().enumerate() {
                    let mut status = comm.device().alloc_zeroed::<u32>(1)?;
                    sig.copy_from_host(&[0])?;
                    let byte = |rank: usize, i: usize| ((i.wrapping_mul(0x9E37_79B1) >> 7) as u8 ^ (rank as u8 * 77)).wrapping_add(round as u8);
                    src.copy_from_host(&(0..room).map(|i| byte(comm.rank(), i)).collect::<Vec<u8>>())?;
                    dst.buf.copy_from_host(&vec![0x5a; room])?;
                    got.buf.copy_from_host(&vec![0x5a; room])?;
                    comm.barrier()?;
                    let bufs = (
                        src.as_mut_ptr().wrapping_add(so),
                        dst.buf.as_mut_ptr().wrapping_add(d_off),
                        got.buf.as_mut_ptr().wrapping_add(d_off),
                    );
                    let args = doorbell_tests::ring_round(t, bufs, bytes as u64, sig.as_mut_ptr(), status.as_mut_ptr());
                    // SAFETY: every range inside its buffer, as the ring kernel documents.
                    let s = unsafe { doorbell_tests::launch_after_barrier(comm, &m.function::<ring_ibgda>()?, LaunchConfig::linear(1, 64), args)? };
                    comm.synchronize(&s)?;
                    comm.ibgda_check()?;
                    let r = comm.rank();
                    assert_eq!(status.to_host()?[0], STATUS_OK, "rank {r}, case {round}");
                    let mut want = vec![0x5au8; room];
                    for i in 0..bytes {
                        want[d_off + i] = byte(1 - r, so + i);
                    }
                    let (put, fetched) = (dst.buf.to_host()?, got.buf.to_host()?);
                    let first = |v: &[u8]| v.iter().zip(&want).position(|(a, b)| a != b);
                    assert!(put == want, "rank {r}, case {round} ({bytes} bytes, offsets {so}/{d_off}, thread copies {thread_copies}): put differs first at {:?}", first(&put));
                    assert!(fetched == want, "rank {r}, case {round}: get differs first at {:?}", first(&fetched));
                    assert!(dst.canaries_intact()? && got.canaries_intact()?, "rank {r}, case {round}: a canary changed");
                    comm.barrier()?;
                }
                let report = comm.ibgda_engine().expect("set up");
                Ok((report.counters.bulk_bytes - bulk_before, bulk_want, report))
            })
            .expect("the world");
            for (r, (moved, want, report)) in reports.iter().enumerate() {
                let want = if thread_copies { 0 } else { *want };
                assert!(want > 0 || thread_copies, "the cases have bulk bodies");
                assert_eq!(*moved, want, "rank {r}, thread copies {thread_copies}: bytes the bulk-copy unit moved: {report:?}");
            }
        }
    }
}

per_backend! {
    /// 4 MiB puts and gets (one WQE each) through an engine of four blocks
    /// on ports with fewer QP groups than blocks: the blocks that serve no
    /// QP copy chunks of the large payloads (the engine's shared copies),
    /// every byte arrives, and no canary around the targets changes.
    fn large_payloads_are_copied_by_the_ports_other_blocks(dev: Device) {
        shared_copies(dev, 4);
    }
}

per_backend! {
    /// As above through an engine of ten blocks: the two beyond those that
    /// may serve QPs (`MAX_SHARDS`) run too and copy chunks like the
    /// others, and the serving block's shared copies run on while it goes
    /// on (each is deferred, finished before its CQE).
    fn blocks_beyond_those_serving_qps_copy_chunks_of_deferred_shared_copies(dev: Device) {
        shared_copies(dev, 10);
    }
}

/// Rounds of 4 MiB puts and gets, each with its own payload, through an
/// engine of `blocks` blocks with one QP per peer; checks every byte and
/// canary, and that the blocks serving no QP copied chunks. A copy is
/// cut into about one chunk per block, so whether another block claims
/// one before the owner takes them all depends on when the blocks run
/// (on the emulator, on how the OS schedules their threads): several
/// rounds, and at least one chunk copied by another block over all of
/// them.
fn shared_copies(dev: Device, blocks: u32) {
    const ROUNDS: usize = 6;
    let b = dev.backend();
    let bytes = (4 << 20) + 4100;
    let io = IbgdaOptions {
        qps_per_peer: 1,
        engine_threads: Some(if b == Backend::Gpu { 256 } else { 32 }),
        engine_blocks: Some(blocks),
        ..kernel_engine(64, 8 << 20)
    };
    let o = CommOptions {
        heap_bytes: 32 << 20,
        ..opts(b, Duration::from_secs(30))
    };
    let reports = Communicator::local(2, b, o, |comm| {
        let m = comm.device().load_module(&TEST_KERNELS)?;
        let src = comm.alloc::<u8>(bytes)?;
        let dst = Guarded::new(comm, bytes)?;
        let got = Guarded::new(comm, bytes)?;
        let sig = comm.alloc::<u64>(1)?;
        let t = comm.ibgda_with(&io)?;
        for round in 0..ROUNDS {
            let mut status = comm.device().alloc_zeroed::<u32>(1)?;
            sig.copy_from_host(&[0])?;
            let byte = |rank: usize, i: usize| ((i.wrapping_mul(0x9E37_79B1) >> 7) as u8 ^ (rank as u8 * 77)).wrapping_add(round as u8);
            src.copy_from_host(&(0..bytes).map(|i| byte(comm.rank(), i)).collect::<Vec<u8>>())?;
            comm.barrier()?;
            let bufs = (src.as_mut_ptr(), dst.buf.as_mut_ptr(), got.buf.as_mut_ptr());
            let args = doorbell_tests::ring_round(t, bufs, bytes as u64, sig.as_mut_ptr(), status.as_mut_ptr());
            // SAFETY: sizes as the ring kernel documents.
            let s = unsafe { doorbell_tests::launch_after_barrier(comm, &m.function::<ring_ibgda>()?, LaunchConfig::linear(1, 64), args)? };
            comm.synchronize(&s)?;
            comm.ibgda_check()?;
            let r = comm.rank();
            assert_eq!(status.to_host()?[0], STATUS_OK, "rank {r}, round {round}");
            let want: Vec<u8> = (0..bytes).map(|i| byte(1 - r, i)).collect();
            assert!(dst.buf.to_host()? == want, "put into rank {r} differs, round {round}");
            assert!(got.buf.to_host()? == want, "get by rank {r} differs, round {round}");
            assert!(
                dst.canaries_intact()? && got.canaries_intact()?,
                "rank {r}, round {round}: a canary changed"
            );
            comm.barrier()?;
        }
        Ok(comm.ibgda_engine().expect("set up"))
    })
    .expect("the world");
    for (r, report) in reports.iter().enumerate() {
        let n = blocks as usize;
        assert_eq!(report.blocks.len(), n, "rank {r}: every block asked for runs: {report:?}");
        // One QP per peer: one block serves it, and whatever the others
        // copied was a chunk of its put or get.
        let owners: Vec<usize> = (0..n).filter(|&i| report.blocks[i].block_copies > 0).collect();
        assert_eq!(owners.len(), 1, "rank {r}: one block makes the copies: {report:?}");
        let owner = &report.blocks[owners[0]];
        let helped: u64 = report.blocks.iter().map(|c| c.shared_bytes).sum();
        assert!(helped > 0, "rank {r}: no other block copied a chunk: {report:?}");
        assert!(
            helped < (2 * ROUNDS * bytes) as u64 && owner.shared_bytes == 0,
            "rank {r}: more shared than the payloads, or the owner helped itself: {report:?}"
        );
        // Every put and get of the owner's was a shared copy that ran on
        // past its WQE's execution (deferred) until drained.
        assert!(
            owner.deferred_copies >= 2 * ROUNDS as u64,
            "rank {r}: the shared copies were not deferred: {report:?}"
        );
        // The drain's counters. Every put and get was a shared copy of
        // at least two chunks; the posting holds the first for its owner,
        // others claim chunks while it goes on, and its drain copies the
        // rest: so the chunks others copied and those left to the drain
        // make up all but one chunk of each copy, each counted once.
        let copies = 2 * ROUNDS as u64;
        let claimed: u64 = report.blocks.iter().map(|c| c.helped_chunks).sum();
        let postings: u64 = report.blocks.iter().map(|c| c.helped_postings).sum();
        let rest = claimed + owner.late_chunks;
        assert!(
            owner.shared_copies == copies && owner.shared_chunks >= 2 * copies && rest == owner.shared_chunks - copies,
            "rank {r}: {claimed} chunks claimed by others and {} left to the drain, of {} chunks in {} shared copies: {report:?}",
            owner.late_chunks,
            owner.shared_chunks,
            owner.shared_copies
        );
        // A helper's postings: at least one, at most one a copy per
        // helper, each with the delay to its first claim.
        assert!(
            postings >= 1 && postings <= copies * (n as u64 - 1) && postings <= claimed,
            "rank {r}: {postings} postings helped: {report:?}"
        );
        // Of each delay, the part until the look that saw the posting
        // (a look comes before its claims); and the helpers' chunks took
        // time to copy.
        let seen: u64 = report.blocks.iter().map(|c| c.help_seen_ns).sum();
        let delays: u64 = report.blocks.iter().map(|c| c.help_claim_ns).sum();
        let copying: u64 = report.blocks.iter().map(|c| c.help_copy_ns).sum();
        assert!(
            seen <= delays && copying > 0,
            "rank {r}: the helpers' delays and copy times: {report:?}"
        );
        assert!(
            owner.drain_shared_cycles <= owner.copy_cycles && owner.drain_own_cycles <= owner.copy_cycles,
            "rank {r}: the drain's waits are part of the copies' cycles: {report:?}"
        );
    }
}

per_backend! {
    /// A WQE's block copy runs on while the engine's control thread checks
    /// the QP's next WQE (`PayloadMover::defer`), and still lands before
    /// anything that says it did (its CQE waits for it): 4 blocks of rank 0
    /// `put_signal` 16 KiB and 12 bytes each per round (a block copy each,
    /// then the signal), blocking, by warp, non-blocking then `quiet`, and
    /// as a blocking `put` whose CQE comes before the `signal` is posted, a
    /// payload that changes every round; rank 1 checks every word once it
    /// sees the round's signal. Once with the defaults (the signals go in bursts),
    /// once with every WQE on the one-WQE path (a fault that only holds
    /// QPs back a pass turns bursts off), where the signal's checks run
    /// while its put's bytes move. Off the GPU the engine also fails loudly
    /// if it stores a CQE, an atomic or a release while a copy is in flight.
    fn block_copies_overlap_the_next_wqes_checks_and_land_before_their_signal(dev: Device) {
        overlapped_puts(dev, 1, None, 4099, 12);
    }
}

per_backend! {
    /// As above with puts of 256 KiB and 12 bytes through an engine of
    /// three blocks, two of which serve no QP: each put is a shared copy
    /// (`SHARE_MIN`), posted and deferred; its signal, its CQE and the next
    /// put wait until every chunk, the other blocks' too, has landed.
    fn shared_copies_run_on_past_their_wqe_and_land_before_their_signal(dev: Device) {
        overlapped_puts(dev, 1, Some(3), (256 << 10) / 4 + 3, 3);
    }
}

per_backend! {
    /// As above with two QPs per peer over six engine blocks: two blocks
    /// post shared copies at once (rank 0's posters alternate between the
    /// QPs) while the others, and each owner when it has nothing in
    /// flight, copy their chunks; no owner waits for another's.
    fn shared_copies_of_several_owners_at_once_land_before_their_signals(dev: Device) {
        overlapped_puts(dev, 2, Some(6), (256 << 10) / 4 + 3, 3);
    }
}

/// Rank 0's 4 blocks `put_signal` `words` u32 words each per round,
/// `iters` rounds in each of the four modes, over `qps` QPs per peer and
/// an engine of `engine_blocks` blocks; see the tests above.
fn overlapped_puts(dev: Device, qps: u32, engine_blocks: Option<u32>, words: u32, iters: u32) {
    let b = dev.backend();
    let io = IbgdaOptions {
        qps_per_peer: qps,
        engine_threads: Some(if b == Backend::Gpu { 256 } else { 32 }),
        engine_blocks,
        ..kernel_engine(64, 1 << 20)
    };
    // Rank 0's kernel's blocks, each putting its own part.
    let posters = 4u32;
    let ranks = Communicator::local(2, b, opts(b, Duration::from_secs(30)), |comm| {
        let m = comm.device().load_module(&TEST_KERNELS)?;
        let f = m.function::<flagged_rounds_ibgda>()?;
        let t = comm.ibgda_with(&io)?;
        let nic = comm.soft_nic().expect("set up");
        let mut deferred = vec![];
        for one_wqe_path in [false, true] {
            let mut cfg = nic.fabric().config();
            cfg.faults.reorder_across_qps = one_wqe_path as u32;
            comm.barrier()?;
            if comm.rank() == 0 {
                nic.fabric().try_set_config(cfg).expect("the engine kernel takes the configuration");
            }
            comm.barrier()?;
            let before = comm.ibgda_engine().expect("set up").counters;
            for mode in [0, 1, 2, 3] {
                let mut rounds = FlaggedRounds::new(comm, posters, words)?;
                let args = rounds.args(t, iters, mode);
                // SAFETY: sizes as flagged_rounds documents.
                let s = unsafe { doorbell_tests::launch_after_barrier(comm, &f, LaunchConfig::linear(posters, 64), args)? };
                comm.synchronize(&s)?;
                comm.ibgda_check()?;
                let what = format!("rank {}, one-WQE path {one_wqe_path}, mode {mode}", comm.rank());
                rounds.check(comm.rank(), iters, &what)?;
                comm.barrier()?;
            }
            let after = comm.ibgda_engine().expect("set up").counters;
            deferred.push((
                after.deferred_copies - before.deferred_copies,
                after.overlapped_copies - before.overlapped_copies,
            ));
        }
        Ok((deferred, comm.ibgda_engine().expect("set up")))
    })
    .expect("the world");
    let (deferred, report) = &ranks[0];
    // Rank 0's engine executed every put: 4 modes x `iters` rounds x 4
    // posters.
    for (k, (n, _)) in deferred.iter().enumerate() {
        assert!(
            *n >= (4 * iters * posters) as u64,
            "case {k}: rank 0's puts ran on past their copy call {n} times, want one per put"
        );
    }
    // On the one-WQE path each put's signal (its own WQE, copied by the
    // control thread) comes right after it: the signal's checks ran
    // while the put's bytes moved, in every round of the three modes
    // that put_signal.
    let (_, overlapped) = deferred[1];
    assert!(
        overlapped >= (3 * iters * posters) as u64,
        "one-WQE path: {overlapped} copies were still in flight at the next WQE's copy"
    );
    // Each QP's puts were copied by the one block that serves it.
    let owners = report.blocks.iter().filter(|c| c.block_copies > 0).count();
    assert_eq!(owners, qps as usize, "rank 0: a block per QP posts the copies: {report:?}");
    // With blocks that serve no QP, they copied chunks of the puts.
    if engine_blocks.is_some_and(|n| n > 1) {
        let helped: u64 = report.blocks.iter().map(|c| c.shared_bytes).sum();
        assert!(helped > 0, "rank 0: no block copied a chunk of another's put: {report:?}");
    }
}
