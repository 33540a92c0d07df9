//! The IBGDA transport over the soft NIC (CPU emulator, thread worlds):
//! fault injection — error completions, dropped and delayed doorbells, a
//! stalled peer (within and past the wait budget) — each ending in a typed
//! error or a correct result, never a hang, never a write outside
//! registered memory (canaries); recovery by reset; unregistered sources
//! refused; the strict `DOORBELL_RDMA_PEERS` setting.
//!
//! The behaviour tests shared with every transport are in `contract.rs`
//! and `comm.rs`.

use std::time::{Duration, Instant};

use doorbell::comm::{CommOptions, Communicator, IbgdaOptions, RdmaPeers};
use doorbell::{Backend, Error, ForTransport, LaunchConfig};
use doorbell_kernels::transport::Ibgda;
use doorbell_softnic::engine::EngineConfig;
use doorbell_test_kernels::contract::bad_call;
use doorbell_test_kernels::testing::{ring_ibgda, STATUS_OK};
use doorbell_tests::{load_test_kernel, TEST_KERNELS};

const BYTES: u64 = 4096;

fn opts(wait: Duration) -> CommOptions {
    CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: wait,
        ..Default::default()
    }
}

/// What one faulty `put_signal_block` (rank 0 → rank 1, 4 KiB, signal 7)
/// left behind.
struct Outcome {
    /// Rank 0's result code (0 ok, 1 timeout, 2 completion, 4 out of range).
    code: u32,
    /// Rank 0's host error from `synchronize`.
    err: Option<String>,
    /// Rank 0's `ibgda_check`.
    check: Option<String>,
    /// Rank 1's destination and signal words afterwards.
    dst: Vec<u8>,
    sig: Vec<u64>,
    /// Rank 0's launch to sync.
    took: Duration,
    /// After a reset with the faults off: the same call delivered.
    recovered: bool,
}

/// Runs the bad-call kernel's control case (a good `put_signal_block`) with
/// the soft NIC configured by `fault` (given the engine config and rank 1's
/// port index); with `register` false the source is not registered.
fn faulty_put_signal(wait: Duration, register: bool, fault: impl Fn(&mut EngineConfig, usize) + Sync) -> Outcome {
    let out = Communicator::local(2, Backend::Cpu, opts(wait), |comm| {
        let dev = comm.device();
        let f = load_test_kernel::<<bad_call as ForTransport<Ibgda>>::Kernel>(dev)?;
        let dst = comm.alloc::<u8>(BYTES as usize)?;
        let sig = comm.alloc::<u64>(2)?;
        let src_host: Vec<u8> = (0..BYTES).map(|i| (i % 253) as u8 + 1).collect();
        let src = dev.alloc_from(&src_host)?;
        let mut codes = dev.alloc_zeroed::<u32>(2)?;
        let mut t = comm.ibgda()?;
        if register {
            // SAFETY: `src` outlives the communicator's use of it here.
            t = unsafe { comm.ibgda_register(src.as_ptr() as u64, BYTES as usize)? };
        }
        let nic = comm.soft_nic().expect("set up");
        let ports = comm.world().all_gather_bytes(&(nic.port_index() as u64).to_le_bytes())?;
        let port1 = u64::from_le_bytes(ports[1].as_slice().try_into().unwrap()) as usize;
        if comm.rank() == 0 {
            let mut cfg = nic.fabric().config();
            fault(&mut cfg, port1);
            nic.fabric().set_config(cfg);
        }
        comm.barrier()?;
        let s = dev.new_stream()?;
        let t0 = Instant::now();
        let args = (t, dst.as_mut_ptr(), src.as_ptr(), BYTES, sig.as_mut_ptr(), 6u32, codes.as_mut_ptr());
        // SAFETY: symmetric dst/sig, src of BYTES, two code words.
        unsafe { s.launch(&f, LaunchConfig::linear(1, 64), args)? };
        let err = comm.synchronize(&s).err().map(|e| e.to_string());
        let took = t0.elapsed();
        let check = comm.ibgda_check().err().map(|e| e.to_string());
        comm.barrier()?;
        let (d, g) = (dst.to_host()?, sig.to_host()?);
        // (A WQE that timed out, not failed, may still land once the peer
        // answers again: read the canaries before the faults go away.)
        comm.barrier()?;

        // Recovery: faults off, reset (collective), the same call again.
        if comm.rank() == 0 {
            nic.fabric().set_config(EngineConfig::default());
        }
        comm.barrier()?;
        comm.ibgda_reset()?;
        let mut t = comm.ibgda()?;
        if register {
            // SAFETY: as above.
            t = unsafe { comm.ibgda_register(src.as_ptr() as u64, BYTES as usize)? };
        }
        comm.check()?;
        let mut codes2 = dev.alloc_zeroed::<u32>(2)?;
        comm.barrier()?;
        let args = (
            t,
            dst.as_mut_ptr(),
            src.as_ptr(),
            BYTES,
            sig.as_mut_ptr(),
            6u32,
            codes2.as_mut_ptr(),
        );
        // SAFETY: as above.
        unsafe { s.launch(&f, LaunchConfig::linear(1, 64), args)? };
        let second = comm.synchronize(&s);
        comm.barrier()?;
        let want = if register || comm.rank() != 0 { 0 } else { 4 };
        let recovered = second.is_ok() && codes2.to_host()?[0] == want;
        let recovered = recovered && (!register || comm.rank() != 1 || dst.to_host()? == src_host);
        Ok(Outcome {
            code: codes.to_host()?[0],
            err,
            check,
            dst: d,
            sig: g,
            took,
            recovered,
        })
    })
    .expect("the world");
    let mut it = out.into_iter();
    let (r0, r1) = (it.next().unwrap(), it.next().unwrap());
    assert!(r1.recovered, "rank 1 after reset: {:?}", r1.err);
    Outcome {
        dst: r1.dst,
        sig: r1.sig,
        ..r0
    }
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let written = self.dst.iter().filter(|&&b| b != 0).count();
        write!(
            f,
            "code {}, err {:?}, check {:?}, {written} target bytes written, sig {:?}, took {:?}, recovered {}",
            self.code, self.err, self.check, self.sig, self.took, self.recovered
        )
    }
}

fn assert_untouched(o: &Outcome) {
    assert!(o.dst.iter().all(|&b| b == 0), "the target buffer changed: {o:?}");
    assert_eq!(o.sig, vec![0, 0], "the signal words changed");
}

#[test]
fn error_completions_are_typed_errors_write_nothing_and_reset_recovers() {
    let o = faulty_put_signal(Duration::from_secs(20), true, |c, _| c.faults.force_error_every = 1);
    assert_eq!(o.code, 2, "{o:?}");
    let err = o.err.as_deref().unwrap_or_default();
    assert!(err.contains("put_signal") && err.contains("syndrome 0x14"), "{err}");
    let check = o.check.as_deref().unwrap_or_default();
    assert!(check.contains("REMOTE_OP_ERR") && check.contains("ibgda_reset"), "{check}");
    assert_untouched(&o);
    assert!(o.recovered, "the reset queue did not deliver: {o:?}");
}

/// [`faulty_put_signal`] toward a peer whose port stalls for good, with the
/// NIC's transport timeout `transport_timeout_ns` and the wait budget `wait`.
fn put_signal_to_a_stalled_peer(wait: Duration, transport_timeout_ns: u64) -> Outcome {
    faulty_put_signal(wait, true, |c, port1| {
        c.transport_timeout_ns = transport_timeout_ns;
        c.faults.stall_port = port1 as u32 + 1;
        c.faults.stall_until_ns = u64::MAX;
    })
}

/// The call toward a stalled peer failed with status `code` in less than
/// `within`, wrote nothing, and the reset queue delivered.
fn assert_stalled_call_failed(o: &Outcome, code: u32, within: Duration) {
    assert_eq!(o.code, code, "{o:?}");
    assert!(o.took < within, "{o:?}");
    assert_untouched(o);
    assert!(o.recovered, "{o:?}");
}

#[test]
fn a_stalled_peer_fails_the_wqe_with_a_transport_retry_error() {
    let o = put_signal_to_a_stalled_peer(Duration::from_secs(20), 50_000_000);
    assert_stalled_call_failed(&o, 2, Duration::from_secs(10));
    assert!(o.err.as_deref().unwrap_or_default().contains("syndrome 0x15"), "{o:?}");
}

#[test]
fn a_peer_stalled_past_the_wait_budget_is_a_timeout_and_a_wedged_queue() {
    let o = put_signal_to_a_stalled_peer(Duration::from_millis(300), 5_000_000_000);
    assert_stalled_call_failed(&o, 1, Duration::from_secs(5));
    let err = o.err.as_deref().unwrap_or_default();
    assert!(err.contains("put_signal") && err.contains("made no progress for 300 ms"), "{err}");
    assert!(o.check.as_deref().unwrap_or_default().contains("wedged"), "{o:?}");
}

#[test]
fn an_unregistered_source_is_refused_and_nothing_is_written() {
    let o = faulty_put_signal(Duration::from_secs(20), false, |_, _| {});
    assert_eq!(o.code, 4, "{o:?}");
    // The error names the argument and how to register it.
    let err = o.err.as_deref().unwrap_or_default();
    assert!(
        err.contains("the source (") && err.contains("register it with Communicator::ibgda_register"),
        "{o:?}"
    );
    assert!(o.check.is_none(), "a refused call leaves the queue healthy: {o:?}");
    assert_untouched(&o);
}

/// The ring (put, signal-add, wait, barrier, get) on 3 ranks under `fault`.
fn ring_under(fault: impl Fn(&mut EngineConfig) + Sync, bytes: usize) {
    let io = IbgdaOptions {
        sq_size: 32,
        max_msg: 2048,
        ..Default::default()
    };
    Communicator::local(3, Backend::Cpu, opts(Duration::from_secs(20)), |comm| {
        let dev = comm.device();
        let m = dev.load_module(&TEST_KERNELS)?;
        let src = comm.alloc::<u8>(bytes)?;
        let dst = comm.alloc::<u8>(bytes)?;
        let got = comm.alloc::<u8>(bytes)?;
        let sig = comm.alloc::<u64>(1)?;
        let mut status = dev.alloc_zeroed::<u32>(1)?;
        let mine: Vec<u8> = (0..bytes).map(|i| (i as u8) ^ (comm.rank() as u8 * 91)).collect();
        src.copy_from_host(&mine)?;
        let t = comm.ibgda_with(&io)?;
        if comm.rank() == 0 {
            let fabric = comm.soft_nic().unwrap().fabric();
            let mut cfg = fabric.config();
            fault(&mut cfg);
            fabric.set_config(cfg);
        }
        let bufs = (src.as_mut_ptr(), dst.as_mut_ptr(), got.as_mut_ptr());
        let args = doorbell_tests::ring_round(t, bufs, bytes as u64, sig.as_mut_ptr(), status.as_mut_ptr());
        // SAFETY: sizes as the ring kernel documents.
        let s = unsafe { doorbell_tests::launch_after_barrier(comm, &m.function::<ring_ibgda>()?, LaunchConfig::linear(1, 64), args)? };
        comm.synchronize(&s)?;
        comm.ibgda_check()?;
        assert_eq!(status.to_host()?[0], STATUS_OK);
        let prev = (comm.rank() + 2) % 3;
        let want: Vec<u8> = (0..bytes).map(|i| (i as u8) ^ (prev as u8 * 91)).collect();
        assert_eq!(dst.to_host()?, want, "put into rank {}", comm.rank());
        assert_eq!(got.to_host()?, want, "get by rank {}", comm.rank());
        Ok(())
    })
    .unwrap();
}

#[test]
fn dropped_doorbells_are_recovered_from_the_doorbell_record() {
    ring_under(|c| c.faults.drop_doorbell_every = 1, 70_000);
    ring_under(|c| c.faults.drop_doorbell_every = 3, 70_000);
}

#[test]
fn delayed_doorbells_and_reordered_completions_give_correct_results() {
    ring_under(
        |c| {
            c.faults.doorbell_delay_ns = 300_000;
            c.faults.reorder_across_qps = 1;
            c.faults.seed = 7;
        },
        70_000,
    );
}

#[test]
fn rdma_peers_setting_is_parsed_strictly() {
    let v = "DOORBELL_RDMA_PEERS";
    assert_eq!(RdmaPeers::parse(v, "all").unwrap(), RdmaPeers::All);
    assert_eq!(RdmaPeers::parse(v, "none").unwrap(), RdmaPeers::Needed);
    assert_eq!(RdmaPeers::parse(v, "").unwrap(), RdmaPeers::Needed);
    assert_eq!(RdmaPeers::parse(v, "0-1, 2-3").unwrap(), RdmaPeers::Pairs(vec![(0, 1), (2, 3)]));
    for bad in ["0-0", "a-b", "0:1", "0-1,", "all,0-1", "-1", "0-1-2"] {
        let e = RdmaPeers::parse(v, bad).unwrap_err();
        assert!(matches!(e, Error::BadEnv { .. }), "{bad}: {e}");
        assert!(e.to_string().contains(v), "{bad}: {e}");
    }
    // A rank outside the world is an error naming the setting as given
    // (the variable's own check is `RdmaPeers::check_env`'s unit test).
    let r = Communicator::local(2, Backend::Cpu, CommOptions::default(), |comm| {
        comm.routed_with(&RdmaPeers::Pairs(vec![(0, 5)])).map(|_| ())
    });
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("0-5") && msg.contains("outside this world"), "{msg}");
}

#[test]
fn ibgda_on_a_gpu_with_a_host_thread_engine_is_refused_with_the_reason() {
    let Some(_gpu) = doorbell_tests::gpu() else {
        eprintln!("no GPU: skipped (DOORBELL_TEST_REQUIRE_GPU=1 makes a missing GPU a failure)");
        return;
    };
    let thread = IbgdaOptions {
        engine: Some(doorbell::comm::SoftNicEngine::Thread),
        ..Default::default()
    };
    let r = Communicator::local(2, Backend::Gpu, CommOptions::default(), |comm| comm.ibgda_with(&thread).map(|_| ()));
    let msg = r.unwrap_err().to_string();
    assert!(
        msg.contains("device memory") && msg.contains("DOORBELL_SOFTNIC_ENGINE=kernel"),
        "{msg}"
    );
}

/// The soft NIC's engine runs on the kernels' device, so the kernels' QP
/// handles say so (`QP_GPU_SCOPE`: doorbells released and CQEs acquired at
/// GPU scope); `engine_sys_scope` (`DOORBELL_SOFTNIC_SCOPE=sys`) keeps
/// both sides at system scope. Read from the kernels' QP table itself (on
/// the emulator device memory is host memory).
#[test]
fn soft_nic_qp_handles_order_at_gpu_scope_unless_the_engine_is_told_sys() {
    use doorbell_kernels::mlx5::QP_GPU_SCOPE;
    for sys in [false, true] {
        let io = IbgdaOptions {
            engine_sys_scope: sys,
            qps_per_peer: 2,
            ..Default::default()
        };
        let flags = Communicator::local(2, Backend::Cpu, opts(Duration::from_secs(20)), |comm| {
            let t: Ibgda = comm.ibgda_with(&io)?;
            let n = (t.world * t.qps_per_peer) as usize;
            // SAFETY: the emulator's device memory is host memory, and the
            // table holds world × qps_per_peer entries while `comm` lives.
            let flags: Vec<u32> = (0..n).map(|i| unsafe { (*t.qps.add(i)).qp.flags }).collect();
            comm.barrier()?;
            Ok(flags)
        })
        .expect("the world");
        let want = if sys { 0 } else { QP_GPU_SCOPE };
        for (r, f) in flags.iter().enumerate() {
            assert_eq!(f.len(), 4, "rank {r}: 2 peers x 2 QPs");
            assert!(
                f.iter().all(|&v| v == want),
                "rank {r}, engine_sys_scope {sys}: flags {f:?}, want {want}"
            );
        }
    }
}
