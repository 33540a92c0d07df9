//! When a device wait runs out of budget, the error names the rank that is
//! actually stuck: every rank's state is read and the chain of waits is
//! followed to a rank that skipped its launch, waits on the wrong word, or
//! exited — in thread worlds and across two processes (the test binary
//! re-runs itself as rank 1). CPU emulator, short wait budgets.

use std::time::{Duration, Instant};

use doorbell::comm::{CommOptions, Communicator};
use doorbell::world::{RendezvousHost, World, WorldConfig};
use doorbell::{Backend, Device, Error, LaunchConfig};
use doorbell_test_kernels::testing::{p2p_wait_forever, record_indices, STATUS_TIMEOUT};
use doorbell_tests::{launch_barrier_rounds, load_test_kernel, TEST_KERNELS};

const TOKEN: &str = "stuck-ranks-test-token-5e7a1";

fn opts() -> CommOptions {
    CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: Duration::from_millis(1000),
        ..Default::default()
    }
}

/// The "who is stuck" part of a timed-out wait's error (as `Display` ends
/// with it), its chain and its culprit.
fn stuck_of(e: &Error) -> (String, Vec<usize>, Option<usize>) {
    match e {
        Error::WaitTimeout { stuck: Some(s), .. } => {
            let text = format!(". Who is stuck: {}", s.text);
            assert!(e.to_string().ends_with(&text), "{e}");
            (text, s.chain.clone(), s.culprit)
        }
        other => panic!("expected a timed-out wait that names who is stuck, got {other}"),
    }
}

/// Launches the barrier kernel (one round) on `comm` and returns the error
/// its synchronize gives.
fn barrier_kernel_times_out(comm: &Communicator) -> Result<Error, Error> {
    barrier_kernel_times_out_after(comm, || {})
}

/// [`barrier_kernel_times_out`], running `before_launch` once the
/// allocations (collective) are made.
fn barrier_kernel_times_out_after(comm: &Communicator, before_launch: impl FnOnce()) -> Result<Error, Error> {
    let b = launch_barrier_rounds(comm, 1, 32, || {
        before_launch();
        Ok(())
    })?;
    let e = comm.synchronize(&b.stream).expect_err("a barrier without every rank times out");
    assert_eq!(b.status.to_host()?[0], STATUS_TIMEOUT);
    Ok(e)
}

/// On `n` thread ranks, the last one runs `last` instead of the barrier
/// kernel; `last` ends in a host barrier, which every other rank joins
/// once its barrier kernel has timed out and its error is read. Returns
/// the other ranks' errors, in rank order.
fn all_but_the_last_time_out(n: usize, last: impl Fn(&Communicator) -> Result<(), Error> + Sync) -> Vec<Error> {
    let errs = Communicator::local(n, Backend::Cpu, opts(), |comm| {
        if comm.rank() == n - 1 {
            return last(comm).map(|()| None);
        }
        let e = barrier_kernel_times_out(comm)?;
        // Lets the last rank out of its barrier once every rank has read it.
        comm.barrier()?;
        Ok(Some(e))
    })
    .unwrap();
    errs.into_iter()
        .take(n - 1)
        .map(|e| e.expect("every rank but the last times out"))
        .collect()
}

#[test]
fn a_rank_that_skips_its_launch_is_named_as_not_running_a_kernel() {
    let errs = all_but_the_last_time_out(4, |comm| {
        // The same allocations as the others, then no launch at all.
        comm.device().load_module(&TEST_KERNELS)?;
        let _counter = comm.alloc::<u64>(1)?;
        comm.barrier()
    });
    for (r, e) in errs.iter().enumerate() {
        let (s, chain, culprit) = stuck_of(e);
        assert_eq!((chain, culprit), (vec![r, 3], Some(3)), "rank {r}: {s}");
        // Rank 3's barrier slot is the word at offset 3 * 8.
        let chain = format!(
            ". Who is stuck: rank {r} waits for rank 3's signal at offset 0x18 (barrier >= 1, saw 0); \
             rank 3 is not running a kernel: it launched none since its communicator was created; now in barrier"
        );
        assert!(s.starts_with(&chain), "rank {r}:\n{s}\nwanted:\n{chain}");
        if r == 0 {
            println!("{e}");
        }
    }
}

#[test]
fn a_rank_whose_kernel_ended_without_signalling_is_named_with_its_kernel() {
    // Rank 2 runs another kernel instead of the barrier: synchronized
    // (it ended), then not (it may still run).
    for synchronized in [true, false] {
        let errs = all_but_the_last_time_out(3, |comm| {
            let dev = comm.device();
            let fill = load_test_kernel::<record_indices>(dev)?;
            let _counter = comm.alloc::<u64>(1)?;
            let mut out = dev.alloc_zeroed::<u32>(9 * 32)?;
            let s = dev.new_stream()?;
            // SAFETY: 9 words per thread.
            unsafe { s.launch(&fill, LaunchConfig::linear(1, 32), (out.as_mut_ptr(),))? };
            if synchronized {
                comm.synchronize(&s)?;
            }
            comm.barrier()?;
            comm.synchronize(&s)
        });
        for (r, e) in errs.iter().enumerate() {
            let (s, chain, culprit) = stuck_of(e);
            assert_eq!((chain, culprit), (vec![r, 2], Some(2)), "rank {r}: {s}");
            let rank2 = if synchronized {
                "rank 2 is not running a kernel: it launched nothing since its last synchronize, which covered its \
                 launch #1 (`record_indices`) — that kernel ended without writing the word, or this rank skipped a \
                 launch; now in barrier"
            } else {
                "rank 2 launched `record_indices` (launch #1) and has not synchronized it: that kernel may still run, \
                 or ended without writing the word; now in barrier"
            };
            let want = format!(". Who is stuck: rank {r} waits for rank 2's signal at offset 0x10 (barrier >= 1, saw 0); {rank2}");
            assert!(s.starts_with(&want), "rank {r}:\n{s}\nwanted:\n{want}");
        }
    }
}

#[test]
fn a_rank_that_waits_on_the_wrong_word_is_named_with_the_word() {
    let errs = Communicator::local(3, Backend::Cpu, opts(), |comm| {
        let dev = comm.device();
        let m = dev.load_module(&TEST_KERNELS)?;
        let wait = m.function::<p2p_wait_forever>()?;
        let fill = m.function::<record_indices>()?;
        let sig = comm.alloc::<u64>(4)?;
        let mut status = dev.alloc_zeroed::<u32>(1)?;
        let mut out = dev.alloc_zeroed::<u32>(9 * 32)?;
        let s = dev.new_stream()?;
        let r = comm.rank();
        if r == 2 {
            // Finishes a kernel, then waits for the others in a barrier.
            // SAFETY: 9 words per thread.
            unsafe { s.launch(&fill, LaunchConfig::linear(1, 32), (out.as_mut_ptr(),))? };
            comm.synchronize(&s)?;
            comm.barrier()?;
            return Ok(None);
        }
        // Rank 0 waits on word 0; rank 1 on word 2, which nobody writes either.
        let word = sig.as_mut_ptr().wrapping_add(2 * r);
        // SAFETY: a symmetric word, one status word.
        unsafe { s.launch(&wait, LaunchConfig::linear(1, 32), (comm.p2p()?, word, status.as_mut_ptr()))? };
        let e = comm.synchronize(&s).expect_err("nobody writes the word");
        comm.barrier()?;
        Ok(Some((e, sig.offset())))
    })
    .unwrap();
    let (e0, base) = errs[0].as_ref().expect("rank 0 times out");
    let (s, chain, culprit) = stuck_of(e0);
    // Nothing names the writer of a plain word: no chain to follow.
    assert_eq!((chain, culprit), (vec![0], None), "{s}");
    println!("{e0}");
    let mine = format!(
        ". Who is stuck: rank 0 waits for a signal at offset {base:#x} (wait_until == 3735928559, saw 0) \
         from a rank its wait does not name; the other ranks: rank 1 waits for a signal at offset {:#x} \
         (wait_until == 3735928559, saw 0)",
        base + 16
    );
    assert!(s.starts_with(&mine), "{s}\nwanted:\n{mine}");
    assert!(
        s.contains(
            "rank 2 is not running a kernel: it launched nothing since its last synchronize, which covered its \
             launch #1 (`record_indices`); now in barrier"
        ),
        "{s}"
    );
    let (e1, _) = errs[1].as_ref().expect("rank 1 times out");
    let (s1, _, _) = stuck_of(e1);
    assert!(
        s1.starts_with(&format!(". Who is stuck: rank 1 waits for a signal at offset {:#x}", base + 16)),
        "{s1}"
    );
}

#[test]
fn a_rank_whose_function_returned_is_named_as_exited() {
    let errs = Communicator::local(3, Backend::Cpu, opts(), |comm| {
        if comm.rank() == 2 {
            comm.device().load_module(&TEST_KERNELS)?;
            let _counter = comm.alloc::<u64>(1)?;
            return Ok(None);
        }
        Ok(Some(barrier_kernel_times_out(comm)?))
    })
    .unwrap();
    for (r, e) in errs.iter().take(2).enumerate() {
        let e = e.as_ref().expect("ranks 0 and 1 time out");
        let (s, ranks, culprit) = stuck_of(e);
        assert_eq!((ranks, culprit), (vec![r, 2], Some(2)), "rank {r}: {s}");
        let chain = format!(
            ". Who is stuck: rank {r} waits for rank 2's signal at offset 0x10 (barrier >= 1, saw 0); \
             rank 2 is not running a kernel: it launched none since its communicator was created; \
             it exited: its rank function returned Ok"
        );
        assert_eq!(s, chain, "rank {r}");
    }
}

// ---- two processes -------------------------------------------------------

#[test]
#[ignore = "a child process's entry point: the tests that need it run it with --ignored"]
fn child_stuck_rank() {
    let Some(role) = doorbell_tests::child_var("DOORBELL_TEST_STUCK_CHILD") else {
        return;
    };
    let cfg = WorldConfig::from_env().unwrap().expect("launcher variables set by the parent");
    let world = World::rendezvous(&cfg, b"").unwrap();
    let comm = Communicator::new(world, Device::emulator(1), opts()).unwrap();
    comm.device().load_module(&TEST_KERNELS).unwrap();
    let _counter = comm.alloc::<u64>(1).unwrap();
    match role.as_str() {
        // Gone without a word: the process ends here.
        "exit" => std::process::exit(0),
        // No launch; waits for rank 0 in a barrier.
        _ => comm.barrier().unwrap(),
    }
    println!("CHILD-DONE");
}

/// Rank 0 here, rank 1 a child process playing `role`; returns rank 0's error.
fn two_processes(role: &str) -> Error {
    let cfg = WorldConfig::new(0, 2, "127.0.0.1", 0, TOKEN).with_rendezvous_timeout(Duration::from_secs(30));
    let host = RendezvousHost::bind(&cfg).unwrap();
    let port = host.local_addr().port();
    let mut child = doorbell_tests::spawn_rank1("child_stuck_rank", port, TOKEN, 1, &[("DOORBELL_TEST_STUCK_CHILD", role)]);
    let world = host.accept(b"").unwrap();
    let comm = Communicator::new(world, Device::emulator(0), opts()).unwrap();
    let e = barrier_kernel_times_out_after(&comm, || {
        if role == "exit" {
            // Launch only once the child is gone.
            let t0 = Instant::now();
            while child.try_wait().unwrap().is_none() {
                assert!(t0.elapsed() < Duration::from_secs(30), "the child did not exit");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    })
    .unwrap();
    if role != "exit" {
        comm.barrier().unwrap();
    }
    drop(comm);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "child failed:\n{}", String::from_utf8_lossy(&out.stderr));
    e
}

/// [`two_processes`] with the child in `role`: rank 0's error names rank
/// 1 as the one at fault, saying `rank1` of it.
fn rank0_waits_for_rank1(role: &str, rank1: &str) {
    let e = two_processes(role);
    println!("{e}");
    let (s, chain, culprit) = stuck_of(&e);
    assert_eq!((chain, culprit), (vec![0, 1], Some(1)), "{s}");
    let want = format!(". Who is stuck: rank 0 waits for rank 1's signal at offset 0x8 (barrier >= 1, saw 0); {rank1}");
    assert!(s.starts_with(&want), "{s}\nwanted:\n{want}");
}

#[test]
fn a_process_rank_that_exited_is_named_as_gone() {
    rank0_waits_for_rank1("exit", "rank 1 exited or was killed (its status port refuses connections)");
}

#[test]
fn a_process_rank_that_skips_its_launch_is_named_from_its_status_port() {
    rank0_waits_for_rank1(
        "barrier",
        "rank 1 is not running a kernel: it launched none since its communicator was created; now in barrier",
    );
}
