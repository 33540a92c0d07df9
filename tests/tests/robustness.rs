//! Failures that used to be lost, launches that used to wrap, writes that
//! used to vanish and aborts that used to block: each test here asserts on
//! what the defect changed.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use doorbell::comm::{CommOptions, Communicator};
use doorbell::world::{RendezvousHost, World, WorldConfig};
use doorbell::{Backend, Device, Error, LaunchConfig};
use doorbell_example_kernels::comm::hold_stream;
use doorbell_test_kernels::testing::trap_in_one_thread;

/// A kernel failure stays until the user's own synchronize reports it:
/// freeing a scratch buffer or dropping a mapped buffer (which wait for the
/// device internally) must not swallow it.
#[test]
fn an_emulator_kernel_failure_survives_internal_waits() {
    let dev = Device::emulator(0);
    let (f, s) = doorbell_tests::test_kernel::<trap_in_one_thread>(&dev);
    let scratch = dev.alloc_zeroed::<u32>(64).unwrap();
    let mapped = dev.alloc_mapped::<u32>(4).unwrap();
    // SAFETY: no pointers.
    unsafe { s.launch(&f, LaunchConfig::linear(1, 32), (5,)).unwrap() };
    drop(scratch);
    drop(mapped);
    let e = s.synchronize().unwrap_err();
    doorbell_tests::assert_emulator_failure(&e, "trap_in_one_thread");
    // Reported once: the stream is usable again.
    s.synchronize().unwrap();

    // A stream dropped before anyone looked hands its failure to the device.
    let s = dev.new_stream().unwrap();
    // SAFETY: no pointers.
    unsafe { s.launch(&f, LaunchConfig::linear(1, 32), (3,)).unwrap() };
    drop(dev.alloc_zeroed::<u8>(16).unwrap());
    drop(s);
    let e = dev.synchronize().unwrap_err();
    assert!(e.to_string().contains("[3, 0, 0]"), "{e}");
    dev.synchronize().unwrap();
}

/// Launch shapes whose thread counts overflow 64 bits are refused at the
/// launch with a clear error, instead of wrapping past the limits (and the
/// emulator then spawning threads without bound).
#[test]
fn launch_sizes_that_overflow_are_refused() {
    let dev = Device::emulator(0);
    let (f, s) = doorbell_tests::test_kernel::<trap_in_one_thread>(&dev);
    let cases = [
        // 2^64 threads per block: the product wraps to 0.
        ((1, 1, 1), (1 << 22, 1 << 21, 1 << 21)),
        // 2^64 blocks of one thread.
        ((1 << 22, 1 << 21, 1 << 21), (1, 1, 1)),
        // 2^64 blocks of 32 threads (grid within 32 bits per dimension).
        ((u32::MAX, u32::MAX, 2), (32, 1, 1)),
    ];
    for (grid, block) in cases {
        let cfg = LaunchConfig {
            grid,
            block,
            shared_mem_bytes: 0,
            overlap_previous: false,
        };
        // SAFETY: no pointers; nothing may run.
        match unsafe { s.launch(&f, cfg, (u32::MAX,)) } {
            Err(Error::InvalidLaunch { reason, .. }) => {
                assert!(reason.contains("grid") || reason.contains("block"), "{reason}");
            }
            other => {
                // Do not let the emulator try to run it.
                std::mem::forget(s);
                panic!("grid {grid:?} block {block:?}: expected InvalidLaunch, got {other:?}");
            }
        }
    }
    // CUDA's per-dimension limits are checked too (grid y and z at most
    // 65535, block z at most 64).
    for (grid, block) in [((1, 65536, 1), (1, 1, 1)), ((1, 1, 1), (1, 1, 65))] {
        let cfg = LaunchConfig {
            grid,
            block,
            shared_mem_bytes: 0,
            overlap_previous: false,
        };
        // SAFETY: no pointers; nothing may run.
        let e = unsafe { s.launch(&f, cfg, (u32::MAX,)) }.unwrap_err();
        assert!(matches!(e, Error::InvalidLaunch { .. }), "{e}");
    }
    s.synchronize().unwrap();
}

/// When `alloc` returns on any rank, every rank's copy has been zeroed: a
/// fast rank's write into a slow rank's copy survives.
#[test]
fn alloc_returns_only_once_every_copy_is_zeroed() {
    Communicator::local(2, Backend::Cpu, CommOptions::default(), |comm| {
        let dev = comm.device();
        let s = dev.new_stream()?;
        let m = dev.load_module(&doorbell_examples::USER_KERNELS)?;
        if comm.rank() == 0 {
            // Rank 0's zeroing waits for its device: keep it busy for a while.
            let hold = m.function::<hold_stream>()?;
            // SAFETY: no pointers.
            unsafe { s.launch(&hold, LaunchConfig::linear(1, 1), (400_000_000u64,))? };
        }
        let buf = comm.alloc::<u64>(1024)?;
        if comm.rank() == 1 {
            // The emulator's device addresses are host addresses.
            let peer = comm.peer_address(buf.as_ptr(), 0)?;
            // SAFETY: rank 0's copy of `buf`, 1024 u64s, mapped in this process.
            unsafe { std::ptr::write_volatile(peer.add(1023), 0xfeed) };
        }
        comm.barrier()?;
        if comm.rank() == 0 {
            let v = buf.to_host()?;
            assert_eq!(v[1023], 0xfeed, "rank 1's write was zeroed away");
            assert!(v[..1023].iter().all(|&x| x == 0));
        }
        comm.barrier()?;
        s.synchronize()
    })
    .unwrap();
}

/// `World::abort` returns within a second even while another thread of the
/// rank is inside a collective (which holds the world's lock until its
/// timeout), and the other rank still learns why.
#[test]
fn tcp_abort_does_not_wait_behind_a_collective() {
    const TOKEN: &str = "5f0c2e9a7b3d41e8a6c09d7f2b1e4a38";
    let timeout = Duration::from_secs(8);
    let cfg0 = WorldConfig::new(0, 2, "127.0.0.1", 0, TOKEN).with_world_timeout(timeout);
    let host = RendezvousHost::bind(&cfg0).unwrap();
    let port = host.local_addr().port();
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let r0 = s.spawn(move || {
            let w = host.accept(b"").unwrap();
            // Join no collective until rank 1 has aborted.
            rx.recv().unwrap();
            let t = Instant::now();
            // Rank 1 had joined the first barrier before it aborted, so that
            // one may complete; the next must fail with rank 1's reason.
            let e = w.barrier().and_then(|()| w.barrier()).unwrap_err();
            (e, t.elapsed())
        });
        let cfg1 = WorldConfig::new(1, 2, "127.0.0.1", port, TOKEN).with_world_timeout(timeout);
        let w = World::rendezvous(&cfg1, b"").unwrap();
        let (abort_took, blocked) = std::thread::scope(|inner| {
            let blocked = inner.spawn(|| w.barrier().unwrap_err());
            std::thread::sleep(Duration::from_millis(300));
            let t = Instant::now();
            w.abort("rank 1's device failed");
            let took = t.elapsed();
            tx.send(()).unwrap();
            (took, blocked.join().unwrap())
        });
        assert!(abort_took < Duration::from_secs(1), "abort took {abort_took:?}");
        assert!(matches!(blocked, Error::WorldBroken { .. } | Error::PeerLost { .. }), "{blocked}");
        let (e0, waited) = r0.join().unwrap();
        assert!(waited < Duration::from_secs(3), "rank 0 waited {waited:?}");
        assert!(
            e0.to_string().contains("rank 1's device failed"),
            "rank 0 must learn the reason: {e0}"
        );
    });
}

/// Run by the test below in a child process: a two-GPU check.
#[test]
#[ignore = "a child process's entry point: the test below runs it with --ignored"]
fn two_gpu_requirement_child() {
    if doorbell_tests::have_gpus(2, "two_gpu_requirement_child") {
        println!("RAN ON TWO GPUS");
    }
}

/// A two-GPU test on a machine without two GPUs says that it did not run,
/// and fails when the run requires two GPUs (`DOORBELL_TEST_REQUIRE_GPUS=2`);
/// a run that requires one GPU does not make it fail.
#[test]
fn a_two_gpu_test_without_two_gpus_says_so_and_fails_when_they_are_required() {
    let run = |vars: &[(&str, &str)]| {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "two_gpu_requirement_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env_remove("DOORBELL_TEST_REQUIRE_GPU")
            .env_remove("DOORBELL_TEST_REQUIRE_GPUS")
            .envs(vars.iter().copied())
            .output()
            .unwrap()
    };
    let two = doorbell::gpu_count() >= 2;
    let text = |o: &std::process::Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    for vars in [&[][..], &[("DOORBELL_TEST_REQUIRE_GPU", "1")][..]] {
        let o = run(vars);
        assert!(o.status.success(), "{vars:?}: {}", text(&o));
        if !two {
            assert!(
                text(&o).contains("SKIPPED two_gpu_requirement_child") && text(&o).contains("NOT RUN"),
                "{}",
                text(&o)
            );
        }
    }
    let o = run(&[("DOORBELL_TEST_REQUIRE_GPUS", "2")]);
    assert_eq!(o.status.success(), two, "{}", text(&o));
    if !two {
        assert!(text(&o).contains("needs 2 GPU(s)"), "{}", text(&o));
    }
}

/// Run in a child process by the test below: rank 1 keeps copying into
/// rank 0's heap while it fails; rank 0 fails at once because of it. No
/// rank may free its heap while the other's kernel can still write there
/// (a freed heap is unmapped: the write would crash the process).
#[test]
#[ignore = "a child process's entry point: the test below runs it with --ignored"]
fn heap_freed_under_a_writer_child() {
    use doorbell_example_kernels::comm::copy_raw;
    if doorbell_tests::child_var("DOORBELL_TEST_HEAP_WRITER").is_none() {
        return;
    }
    let opts = CommOptions {
        heap_bytes: 64 << 20,
        ..CommOptions::default()
    };
    let r = Communicator::local(2, Backend::Cpu, opts, |comm| {
        let bytes = 8usize << 20;
        let buf = comm.alloc::<u8>(bytes)?;
        if comm.rank() == 0 {
            // Done: its drop's final barrier fails as soon as rank 1 aborts.
            return Ok(());
        }
        let dev = comm.device();
        let m = dev.load_module(&doorbell_examples::USER_KERNELS)?;
        let f = m.function::<copy_raw>()?;
        let src = dev.alloc_zeroed::<u8>(bytes)?;
        let s = dev.new_stream()?;
        let dst = comm.peer_address(buf.as_ptr(), 0)?;
        // SAFETY: rank 0's copy of `buf` and `src` both hold `bytes`, 16-byte aligned.
        unsafe { s.launch(&f, LaunchConfig::linear(4, 64), (dst, src.as_ptr(), bytes as u64, 400))? };
        std::thread::sleep(Duration::from_millis(50));
        comm.abort("rank 1 failed while its kernel still writes into rank 0's heap");
        Err(Error::Comm("rank 1 failed".into()))
    });
    let e = r.unwrap_err().to_string();
    assert!(e.contains("rank 1"), "{e}");
    println!("HEAP-WRITER-DONE");
}

#[test]
fn no_rank_frees_its_heap_while_a_peer_still_writes_into_it() {
    let o = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "heap_freed_under_a_writer_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DOORBELL_TEST_HEAP_WRITER", "1")
        .output()
        .unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && out.contains("HEAP-WRITER-DONE"), "{:?}:\n{out}", o.status);
}
