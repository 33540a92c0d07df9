//! Bad input never panics or aborts, and a failed rank never waits out a
//! world timeout: allocation failures, unchecked sizes, strict `DOORBELL_*`
//! parsing, aborting a world, ranks launched with different work.
//!
//! Environment variables are process-wide: every test that sets one is in
//! `environment_variables_are_parsed_strictly`, which runs its cases in order.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use doorbell::comm::{CommOptions, Communicator};
use doorbell::world::{RendezvousHost, World, WorldConfig};
use doorbell::{Backend, Device, Error};

#[test]
fn emulator_allocation_failure_is_an_error_not_an_abort() {
    let _env = doorbell_tests::env_reader();
    let dev = Device::emulator(0);
    // More than any host has (1 PiB): the allocator refuses.
    let e = dev.alloc_zeroed::<u8>(1 << 50).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { bytes, .. } if bytes == 1 << 50), "{e}");
    assert!(e.to_string().contains("CPU emulator"), "{e}");
    // No layout holds it.
    let e = dev.alloc_zeroed::<u8>(isize::MAX as usize).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    // Elements x size overflows.
    let e = dev.alloc_zeroed::<u64>(usize::MAX).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }) && e.to_string().contains("overflow"), "{e}");
    let e = dev
        .alloc_mapped::<u32>(usize::MAX / 2)
        .err()
        .expect("a mapped buffer of 2^63 elements");
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    // Still usable afterwards.
    assert_eq!(dev.alloc_from(&[1u32, 2, 3]).unwrap().to_host().unwrap(), [1, 2, 3]);
}

#[test]
fn gpu_allocation_failure_is_an_error_not_an_abort() {
    let _env = doorbell_tests::env_reader();
    // Says that it skipped, and fails under DOORBELL_TEST_REQUIRE_GPU=1.
    let Some(dev) = doorbell_tests::gpu() else {
        return;
    };
    let e = dev.alloc_zeroed::<u8>(1 << 50).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. } | Error::Cuda { .. }), "{e}");
}

#[test]
fn symmetric_allocation_sizes_are_checked() {
    let _env = doorbell_tests::env_reader();
    let r = Communicator::local(2, Backend::Cpu, CommOptions::default(), |comm| {
        let huge = comm.alloc::<u8>(usize::MAX).map(|_| ()).unwrap_err();
        assert!(matches!(huge, Error::HeapExhausted { .. }), "{huge}");
        Ok(())
    });
    // Every rank sees the same HeapExhausted; nothing panicked.
    r.unwrap();
    let r = Communicator::local(2, Backend::Cpu, CommOptions::default(), |comm| {
        comm.alloc::<u64>(usize::MAX).map(|_| ())
    });
    let e = r.unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
    let opts = CommOptions {
        heap_bytes: u64::MAX,
        ..CommOptions::default()
    };
    let e = Communicator::local(2, Backend::Cpu, opts, |_| Ok(())).unwrap_err();
    assert!(e.to_string().contains("cannot be allocated"), "{e}");
    let opts = CommOptions {
        heap_bytes: 1 << 50,
        ..CommOptions::default()
    };
    let e = Communicator::local(2, Backend::Cpu, opts, |_| Ok(())).unwrap_err();
    assert!(e.to_string().contains("could not allocate"), "{e}");
}

#[test]
fn a_failed_rank_does_not_wait_for_the_others() {
    let _env = doorbell_tests::env_reader();
    // Rank 0 is busy (no collective) until rank 1 is done; rank 1 fails.
    // Rank 1's communicator must go without waiting for rank 0, and rank 0's
    // next collective must name rank 1.
    let mut worlds = World::local_threads(2).into_iter();
    let (w0, w1) = (worlds.next().unwrap(), worlds.next().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        let r0 = s.spawn(move || {
            let comm = Communicator::new(w0, Device::emulator(0), CommOptions::default()).unwrap();
            let rank1_done = rx.recv_timeout(Duration::from_secs(20));
            let e = comm.barrier().unwrap_err();
            (rank1_done, e)
        });
        s.spawn(move || {
            let comm = Communicator::new(w1, Device::emulator(1), CommOptions::default()).unwrap();
            let t0 = Instant::now();
            comm.abort("rank 1: the kernel's wait timed out");
            drop(comm);
            tx.send(t0.elapsed()).unwrap();
        });
        let (rank1_done, e) = r0.join().unwrap();
        let took = rank1_done.expect("rank 1 waited for rank 0 instead of aborting");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(matches!(e, Error::PeerFailed { rank: 0, peer: 1, .. }), "{e}");
        assert!(e.to_string().contains("the kernel's wait timed out"), "{e}");
    });
}

#[test]
fn local_ranks_whose_closure_fails_abort_the_others() {
    let _env = doorbell_tests::env_reader();
    let t0 = Instant::now();
    let e = Communicator::local(2, Backend::Cpu, CommOptions::default(), |comm| {
        if comm.rank() == 1 {
            return Err(Error::Comm("rank 1 gave up".into()));
        }
        // Rank 0 waits in collectives rank 1 never joins.
        comm.barrier()?;
        comm.barrier()?;
        Ok(())
    })
    .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let msg = e.to_string();
    assert!(msg.contains("rank 1") && msg.contains("rank 1 gave up"), "{msg}");
}

fn tcp_pair(f0: impl FnOnce(World) -> Error + Send, f1: impl FnOnce(World) -> Error + Send) -> (Error, Error) {
    const TOKEN: &str = "9e51c07a3fd2486b0c7e1a95d3f26b48";
    let host = RendezvousHost::bind(&WorldConfig::new(0, 2, "127.0.0.1", 0, TOKEN)).unwrap();
    let port = host.local_addr().port();
    std::thread::scope(|s| {
        let a = s.spawn(move || f0(host.accept(b"").unwrap()));
        let b = s.spawn(move || f1(World::rendezvous(&WorldConfig::new(1, 2, "127.0.0.1", port, TOKEN), b"").unwrap()));
        (a.join().unwrap(), b.join().unwrap())
    })
}

#[test]
fn tcp_abort_reaches_the_other_rank_at_once() {
    let _env = doorbell_tests::env_reader();
    // A peer fails: rank 0's collective fails naming it.
    let t0 = Instant::now();
    let (e0, e1) = tcp_pair(
        |w| w.barrier().unwrap_err(),
        |w| {
            w.abort("device error on rank 1");
            w.barrier().unwrap_err()
        },
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(matches!(e0, Error::PeerFailed { rank: 0, peer: 1, .. }), "{e0}");
    assert!(e0.to_string().contains("device error on rank 1"), "{e0}");
    assert!(matches!(e1, Error::WorldBroken { .. }), "{e1}");
    // Rank 0 fails: the peer's collective fails naming rank 0.
    let t0 = Instant::now();
    let (_, e1) = tcp_pair(
        |w| {
            w.abort("device error on rank 0");
            w.barrier().unwrap_err()
        },
        |w| w.barrier().unwrap_err(),
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let msg = e1.to_string();
    assert!(msg.contains("rank 0 failed") && msg.contains("device error on rank 0"), "{msg}");
}

#[test]
fn ranks_with_different_work_all_fail_showing_the_values() {
    let _env = doorbell_tests::env_reader();
    let errs = World::run_threads(2, |w| {
        let iters = if w.rank() == 0 { 1000 } else { 10 };
        w.check_same_params(&[("iters", iters), ("size", 8)])
    });
    for e in errs {
        let msg = e.unwrap_err().to_string();
        assert!(msg.contains("iters (rank 0: 1000, rank 1: 10)"), "{msg}");
    }
}

#[test]
fn backend_names_blame_the_right_source() {
    let _env = doorbell_tests::env_reader();
    let e = "foo".parse::<Backend>().unwrap_err().to_string();
    assert!(
        e.contains("\"foo\"") && e.contains("gpu, cpu or auto") && !e.contains("DOORBELL_DEVICE"),
        "{e}"
    );
    assert!("".parse::<Backend>().is_err());
    assert_eq!("GPU".parse::<Backend>().unwrap(), Backend::Gpu);
}

#[test]
fn soft_nic_idle_sleep_is_parsed_strictly() {
    let _env = doorbell_tests::env_writer();
    use doorbell::comm::IbgdaOptions;
    let var = "DOORBELL_SOFTNIC_IDLE_SLEEP_NS";
    for bad in ["1000001", "abc", "-1", "1e3"] {
        let e = with_var(var, bad, IbgdaOptions::from_env).unwrap_err();
        assert!(matches!(&e, Error::BadEnv { var: v, .. } if v == var), "{bad}: {e}");
        let e = with_var(var, bad, doorbell::env::check).unwrap_err();
        assert!(e.to_string().contains(var), "{bad}: {e}");
    }
    assert_eq!(with_var(var, "0", IbgdaOptions::from_env).unwrap().engine_idle_sleep_ns, Some(0));
    assert_eq!(
        with_var(var, "1000000", IbgdaOptions::from_env).unwrap().engine_idle_sleep_ns,
        Some(1_000_000)
    );
    assert_eq!(IbgdaOptions::default().engine_idle_sleep_ns, None);
    // Set in code past its limit: the transport refuses it, naming it.
    let o = IbgdaOptions {
        engine_idle_sleep_ns: Some(1_000_001),
        ..IbgdaOptions::default()
    };
    let r = Communicator::local(1, Backend::Cpu, CommOptions::default(), move |comm| comm.ibgda_with(&o).map(|_| ()));
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("idle_sleep_ns 1000001"), "{msg}");
}

/// Sets `var=value`, runs `f`, unsets it.
fn with_var<T>(var: &str, value: &str, f: impl FnOnce() -> T) -> T {
    std::env::set_var(var, value);
    let r = f();
    std::env::remove_var(var);
    r
}

#[test]
fn environment_variables_are_parsed_strictly() {
    let _env = doorbell_tests::env_writer();
    // DOORBELL_WAIT_TIMEOUT_S: a Duration panic, a silent clamp and a silent
    // default before.
    for (v, why) in [
        ("1e300", "out of range"),
        ("abc", "not a number"),
        ("0", "out of range"),
        ("-1", "out of range"),
        ("inf", "not a number"),
    ] {
        let e = with_var("DOORBELL_WAIT_TIMEOUT_S", v, CommOptions::from_env)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("DOORBELL_WAIT_TIMEOUT_S") && e.contains(why) && e.contains("0.001..=86400"),
            "{v}: {e}"
        );
        let e = with_var("DOORBELL_WAIT_TIMEOUT_S", v, doorbell::env::check)
            .unwrap_err()
            .to_string();
        assert!(e.contains("DOORBELL_WAIT_TIMEOUT_S"), "{v}: {e}");
    }
    let o = with_var("DOORBELL_WAIT_TIMEOUT_S", "2.5", CommOptions::from_env).unwrap();
    assert_eq!(o.wait_timeout, Duration::from_millis(2500));
    assert_eq!(CommOptions::from_env().unwrap().wait_timeout, Duration::from_secs(10));
    // Default reads no environment.
    let d = with_var("DOORBELL_WAIT_TIMEOUT_S", "3", CommOptions::default);
    assert_eq!(d.wait_timeout, Duration::from_secs(10));

    let e = with_var("DOORBELL_RANK_PER_GPU", "yes", CommOptions::from_env)
        .unwrap_err()
        .to_string();
    assert!(e.contains("DOORBELL_RANK_PER_GPU") && e.contains("use 1 (on) or 0 (off)"), "{e}");
    assert!(with_var("DOORBELL_RANK_PER_GPU", "1", CommOptions::from_env).unwrap().spread_gpus);
    // The former name, for one release: read when the new one is unset,
    // its errors name it.
    assert!(with_var("DOORBELL_SPREAD_GPUS", "1", CommOptions::from_env).unwrap().spread_gpus);
    let e = with_var("DOORBELL_SPREAD_GPUS", "yes", CommOptions::from_env)
        .unwrap_err()
        .to_string();
    assert!(e.contains("DOORBELL_SPREAD_GPUS"), "{e}");

    let e = with_var("DOORBELL_DEVICE", "foo", Backend::from_env).unwrap_err().to_string();
    assert!(
        e.contains("DOORBELL_DEVICE") && e.contains("\"foo\"") && e.contains("gpu, cpu, auto"),
        "{e}"
    );
    assert_eq!(with_var("DOORBELL_DEVICE", "cpu", Backend::from_env).unwrap(), Backend::Cpu);

    let e = with_var("DOORBELL_LOG", "loud", doorbell::init_logging).unwrap_err().to_string();
    assert!(e.contains("DOORBELL_LOG") && e.contains("warn") && e.contains("debug"), "{e}");
    with_var("DOORBELL_LOG", "error", doorbell::init_logging).unwrap();

    // The emulator's limits fail the launch (and env::check) naming the variable.
    use doorbell_kernels::emu::{run, EmuError, EmuLaunch};
    let one = EmuLaunch {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem_bytes: 0,
    };
    for v in ["abc", "0", "99999999"] {
        let e = with_var("DOORBELL_EMU_MAX_THREADS", v, doorbell::env::check)
            .unwrap_err()
            .to_string();
        assert!(e.contains("DOORBELL_EMU_MAX_THREADS") && e.contains("1..=1048576"), "{v}: {e}");
        let r = with_var("DOORBELL_EMU_MAX_THREADS", v, || run(one, &|| {}));
        assert!(
            matches!(&r, Err(EmuError::BadEnv(e)) if e.var == "DOORBELL_EMU_MAX_THREADS"),
            "{v}: {r:?}"
        );
    }
    run(one, &|| {}).unwrap();
    doorbell::env::check().unwrap();
    // DOORBELL_EMU_BARRIER_TIMEOUT_S is read once per process (the first
    // launch above read it); its parser is tested in doorbell-kernels.

    // Launcher variables: a non-UTF-8 value is an error naming the variable
    // (it used to count as unset, so a torchrun rank silently ran alone).
    {
        use std::os::unix::ffi::OsStrExt;
        let garbled = std::ffi::OsStr::from_bytes(b"\xff\xfe1");
        std::env::set_var("RANK", garbled);
        let r = WorldConfig::from_env();
        std::env::set_var("WORLD_SIZE", "2");
        let r2 = WorldConfig::from_env();
        std::env::remove_var("RANK");
        std::env::remove_var("WORLD_SIZE");
        for r in [r, r2] {
            let e = r.expect_err("a non-UTF-8 RANK must be refused");
            assert!(matches!(&e, Error::BadEnv { var, .. } if var == "RANK"), "{e}");
            assert!(e.to_string().contains("UTF-8"), "{e}");
        }
        std::env::set_var("MASTER_ADDR", garbled);
        std::env::set_var("RANK", "1");
        std::env::set_var("WORLD_SIZE", "2");
        std::env::set_var("DOORBELL_TOKEN", "5f0c2e9a7b3d41e8a6c09d7f2b1e4a38");
        let r = WorldConfig::from_env();
        for v in ["MASTER_ADDR", "RANK", "WORLD_SIZE", "DOORBELL_TOKEN"] {
            std::env::remove_var(v);
        }
        let e = r.expect_err("a non-UTF-8 MASTER_ADDR must be refused");
        assert!(matches!(&e, Error::BadEnv { var, .. } if var == "MASTER_ADDR"), "{e}");
    }
    // WORLD_SIZE is bounded (rank 0 sets aside a slot per rank first).
    std::env::set_var("RANK", "1");
    std::env::set_var("WORLD_SIZE", "1000000000000");
    let r = WorldConfig::from_env();
    std::env::remove_var("RANK");
    std::env::remove_var("WORLD_SIZE");
    let e = r.expect_err("a world of 10^12 ranks must be refused");
    let msg = e.to_string();
    assert!(
        matches!(&e, Error::BadEnv { var, .. } if var == "WORLD_SIZE") && msg.contains("65536"),
        "{msg}"
    );
}

#[test]
fn world_sizes_are_bounded() {
    let _env = doorbell_tests::env_reader();
    const TOKEN: &str = "5f0c2e9a7b3d41e8a6c09d7f2b1e4a38";
    for size in [65537, 1 << 40] {
        let e = RendezvousHost::bind(&WorldConfig::new(0, size, "127.0.0.1", 0, TOKEN))
            .err()
            .unwrap_or_else(|| panic!("a world of {size} ranks was accepted"));
        assert!(e.to_string().contains("65536"), "{e}");
        let e = World::rendezvous(
            &WorldConfig::new(1, size, "127.0.0.1", 1, TOKEN).with_rendezvous_timeout(Duration::from_secs(2)),
            b"",
        )
        .err()
        .unwrap_or_else(|| panic!("a world of {size} ranks was accepted"));
        assert!(e.to_string().contains("65536"), "{e}");
    }
}
