//! The CPU-proxy transport over the soft NIC (CPU emulator, thread worlds):
//! error completions become typed errors naming the request, nothing is
//! written, and a reset recovers; the proxy and IBGDA refuse to share one
//! NIC; the proxy thread posts each request's WQEs once.
//!
//! The behaviour shared with every transport (bad arguments, data visible
//! with its signal, multi-word waits) is in `contract.rs`.

use std::time::Duration;

use doorbell::comm::{CommOptions, Communicator, IbgdaOptions, RdmaPeers, SymBuffer};
use doorbell::{Backend, ForTransport, LaunchConfig};
use doorbell_kernels::transport::{CommError, Coop, Proxy, RawSignal, RawXfer, Transport};
use doorbell_softnic::engine::EngineConfig;
use doorbell_test_kernels::contract::bad_call;
use doorbell_tests::load_test_kernel;

const BYTES: u64 = 4096;
/// The bad-call kernel's control case: a good `put_signal` (block) of
/// `BYTES` with signal 7.
const CONTROL: u32 = 6;

fn opts() -> CommOptions {
    CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

/// The bad-call kernel's proxy entry (loaded before the proxy's set-up).
type ControlKernel = doorbell::Function<<bad_call as ForTransport<Proxy>>::Kernel>;

/// Launches the bad-call kernel's control case over `t` (rank 0 puts
/// `BYTES` of `src` into rank 1's `dst` with signal 7 in `sig[0]`; rank 1
/// only receives) and synchronizes: the synchronize's result and rank 0's
/// result code (0 ok, 2 a completion error).
fn put_signal_once(
    comm: &Communicator,
    f: &ControlKernel,
    t: Proxy,
    dst: *mut u8,
    src: *const u8,
    sig: *mut u64,
) -> doorbell::Result<(doorbell::Result<()>, u32)> {
    let dev = comm.device();
    let s = dev.new_stream()?;
    let mut codes = dev.alloc_zeroed::<u32>(2)?;
    comm.barrier()?;
    let args = (t, dst, src, BYTES, sig, CONTROL, codes.as_mut_ptr());
    // SAFETY: symmetric dst/sig of BYTES and two words, src of BYTES (the
    // callers'), two code words.
    unsafe { s.launch(f, LaunchConfig::linear(1, 64), args)? };
    let r = comm.synchronize(&s);
    Ok((r, codes.to_host()?[0]))
}

/// The control case's kernel and symmetric buffers: `BYTES` of
/// destination, two signal words, `BYTES` of source in the heap.
struct Control<'c> {
    f: ControlKernel,
    dst: SymBuffer<'c, u8>,
    sig: SymBuffer<'c, u64>,
    src: SymBuffer<'c, u8>,
}

impl<'c> Control<'c> {
    fn new(comm: &'c Communicator) -> doorbell::Result<Control<'c>> {
        Ok(Control {
            f: load_test_kernel::<<bad_call as ForTransport<Proxy>>::Kernel>(comm.device())?,
            dst: comm.alloc::<u8>(BYTES as usize)?,
            sig: comm.alloc::<u64>(2)?,
            src: comm.alloc::<u8>(BYTES as usize)?,
        })
    }

    /// [`put_signal_once`] from `src` into `dst` and `sig` over `t`.
    fn put(&self, comm: &Communicator, t: Proxy) -> doorbell::Result<(doorbell::Result<()>, u32)> {
        put_signal_once(comm, &self.f, t, self.dst.as_mut_ptr(), self.src.as_ptr(), self.sig.as_mut_ptr())
    }
}

/// What rank 0's faulty put left behind, and rank 1's target.
#[derive(Debug)]
struct Outcome {
    code: u32,
    err: Option<String>,
    check: Option<String>,
    dst: Vec<u8>,
    sig: Vec<u64>,
    recovered: bool,
}

#[test]
fn error_completions_are_typed_errors_naming_the_request_and_reset_recovers() {
    let out = Communicator::local(2, Backend::Cpu, opts(), |comm| {
        let dev = comm.device();
        let f = load_test_kernel::<<bad_call as ForTransport<Proxy>>::Kernel>(dev)?;
        let dst = comm.alloc::<u8>(BYTES as usize)?;
        let sig = comm.alloc::<u64>(2)?;
        let src_host: Vec<u8> = (0..BYTES).map(|i| (i % 253) as u8 + 1).collect();
        let src = dev.alloc_from(&src_host)?;
        comm.proxy()?;
        // SAFETY: `src` outlives the communicator's use of it here.
        let t = unsafe { comm.proxy_register(src.as_ptr() as u64, BYTES as usize)? };
        let nic = comm.soft_nic().expect("the proxy runs over the soft NIC");
        if comm.rank() == 0 {
            let mut cfg = nic.fabric().config();
            cfg.faults.force_error_every = 1;
            nic.fabric().set_config(cfg);
        }
        let (r, code) = put_signal_once(comm, &f, t, dst.as_mut_ptr(), src.as_ptr(), sig.as_mut_ptr())?;
        let err = r.err().map(|e| e.to_string());
        let check = comm.proxy_check().err().map(|e| e.to_string());
        comm.barrier()?;
        let (d, g) = (dst.to_host()?, sig.to_host()?);
        comm.barrier()?;

        // Recovery: faults off, reset (collective), the same call again.
        if comm.rank() == 0 {
            nic.fabric().set_config(EngineConfig::default());
        }
        comm.barrier()?;
        comm.proxy_reset()?;
        comm.proxy()?;
        // SAFETY: as above.
        let t = unsafe { comm.proxy_register(src.as_ptr() as u64, BYTES as usize)? };
        comm.proxy_check()?;
        let (second, code2) = put_signal_once(comm, &f, t, dst.as_mut_ptr(), src.as_ptr(), sig.as_mut_ptr())?;
        comm.barrier()?;
        let recovered = second.is_ok() && code2 == 0;
        let recovered = recovered && (comm.rank() != 1 || dst.to_host()? == src_host && sig.to_host()?[0] == 7);
        Ok(Outcome {
            code,
            err,
            check,
            dst: d,
            sig: g,
            recovered,
        })
    })
    .expect("the world");
    let (r0, r1) = (&out[0], &out[1]);
    assert!(r0.recovered && r1.recovered, "{r0:?} / {r1:?}");
    assert_eq!(r0.code, 2, "rank 0's put_signal must fail as a completion error: {r0:?}");
    let err = r0.err.as_deref().unwrap_or_default();
    assert!(err.contains("syndrome") && err.contains("request 0 to rank 1"), "{err}");
    let check = r0.check.as_deref().unwrap_or_default();
    assert!(
        check.contains("request 0 to rank 1") && check.contains("completion error"),
        "{check}"
    );
    assert!(r1.dst.iter().all(|&b| b == 0), "the target buffer changed: {r1:?}");
    assert_eq!(r1.sig, vec![0, 0], "the signal words changed");
}

#[test]
fn the_proxy_and_ibgda_refuse_to_share_the_nic() {
    // Each refusal names the way out, and taking it works.
    let out = Communicator::local(2, Backend::Cpu, opts(), |comm| {
        comm.ibgda()?;
        let proxy_while_ibgda = comm.proxy().err().map(|e| e.to_string());
        comm.ibgda_close()?;
        let after = comm.proxy().map(|_| ()).map_err(|e| e.to_string());
        Ok((proxy_while_ibgda, after))
    })
    .expect("the world");
    for (r, (e, after)) in out.iter().enumerate() {
        let e = e.as_deref().unwrap_or_default();
        assert!(e.contains("ibgda_close()") && e.contains("the same NIC"), "rank {r}: {e}");
        assert!(after.is_ok(), "rank {r}: the proxy after IBGDA's close: {after:?}");
    }
    let out = Communicator::local(2, Backend::Cpu, opts(), |comm| {
        comm.proxy()?;
        let ibgda_while_proxy = comm.ibgda().err().map(|e| e.to_string());
        comm.proxy_reset()?;
        let after = comm.ibgda().map(|_| ()).map_err(|e| e.to_string());
        Ok((ibgda_while_proxy, after))
    })
    .expect("the world");
    for (r, (e, after)) in out.iter().enumerate() {
        let e = e.as_deref().unwrap_or_default();
        assert!(e.contains("proxy_reset") && e.contains("the same NIC"), "rank {r}: {e}");
        assert!(after.is_ok(), "rank {r}: IBGDA after the proxy's reset: {after:?}");
    }
}

#[test]
fn the_proxy_posts_each_request_once() {
    let out = Communicator::local(2, Backend::Cpu, opts(), |comm| {
        let c = Control::new(comm)?;
        let (r, _) = c.put(comm, comm.proxy()?)?;
        r?;
        comm.barrier()?;
        Ok(comm.proxy_stats().expect("set up"))
    })
    .expect("the world");
    // Rank 0 put 4 KiB (one WRITE under the 1 MiB largest message) with a
    // signal (one more WQE), rung once; rank 1 only received.
    assert_eq!((out[0].requests, out[0].wqes, out[0].doorbells), (1, 2, 1), "{:?}", out[0]);
    assert_eq!(out[0].cqes, 1, "only a request's last WQE is signaled: {:?}", out[0]);
    assert_eq!((out[1].requests, out[1].wqes), (0, 0), "{:?}", out[1]);
}

/// The proxy's routes: with both ranks on one node
/// (`RdmaPeers::Nodes(1)`) rank 0's `put_signal` to rank 1 is a store,
/// never a request; with every pair across the NIC (`RdmaPeers::All`) it
/// is one request of two WQEs. The data and the signal land either way
/// (a pattern new for each handle).
#[test]
fn the_proxy_reaches_its_nodes_ranks_by_load_store_and_the_others_through_the_nic() {
    let out = Communicator::local(2, Backend::Cpu, opts(), |comm| {
        let c = Control::new(comm)?;
        let (dst, sig, src) = (&c.dst, &c.sig, &c.src);
        let mut seen = Vec::new();
        for (i, peers) in [RdmaPeers::Nodes(1), RdmaPeers::All].iter().enumerate() {
            let t = comm.proxy_routed(peers)?;
            let pattern: Vec<u8> = (0..BYTES).map(|b| (b % 241) as u8 ^ (0x5a + i as u8)).collect();
            src.copy_from_host(&pattern)?;
            dst.copy_from_host(&vec![0u8; BYTES as usize])?;
            sig.copy_from_host(&[0u64; 2])?;
            let before = comm.proxy_stats().expect("set up");
            let (r, code) = c.put(comm, t)?;
            r?;
            comm.barrier()?;
            let after = comm.proxy_stats().expect("set up");
            let landed = dst.to_host()? == pattern && sig.to_host()?[0] == 7;
            seen.push((
                t.is_direct(1 - comm.rank() as u32),
                after.requests - before.requests,
                after.wqes - before.wqes,
                code,
                landed,
            ));
            comm.barrier()?;
        }
        Ok(seen)
    })
    .expect("the world");
    let [(direct, requests, wqes, code, _), (direct_all, requests_all, wqes_all, code_all, _)] = out[0][..] else {
        panic!("two handles: {:?}", out[0]);
    };
    assert!(direct && !direct_all, "rank 0's route to rank 1: {:?}", out[0]);
    assert_eq!((requests, wqes, code), (0, 0, 0), "one node: a store, no request");
    assert_eq!((requests_all, wqes_all, code_all), (1, 2, 0), "across the NIC: one request");
    assert!(
        out[1].iter().all(|h| h.4),
        "rank 1 did not get the data and the signal: {:?}",
        out[1]
    );
}

/// The test kernels' ring (put to the next rank with a signal add, a
/// wait, a barrier, a get from the previous rank) over the proxy, by
/// block and by warp, at sizes from nothing to many WQEs (1 KiB messages),
/// on 2 and 3 ranks, and on 4 ranks as 2 modeled nodes (hops 1 -> 2 and
/// 3 -> 0 through the proxy, the others by load/store): every byte that
/// arrived is checked, and none outside (`RingBufs::check`).
#[test]
fn put_get_signal_wait_barrier_ring_over_the_proxy() {
    use doorbell_tests::ring::{ring_once, RingTransport};
    let io = IbgdaOptions {
        sq_size: 32,
        max_msg: 1024,
        ..Default::default()
    };
    let ring = |ranks: usize, bytes: usize, offset: usize, warp: bool, nodes: Option<usize>| {
        Communicator::local(ranks, Backend::Cpu, opts(), |comm| {
            ring_once(comm, bytes, offset, warp, 64, |c| {
                let t = c.proxy_with(&io)?;
                Ok(RingTransport::Proxy(match nodes {
                    Some(n) => c.proxy_routed(&RdmaPeers::Nodes(n))?,
                    None => t,
                }))
            })?;
            comm.proxy_reset()
        })
        .unwrap_or_else(|e| panic!("{ranks} ranks, {bytes} B at +{offset}, warp={warp}, nodes={nodes:?}: {e}"));
    };
    ring(2, 4096, 0, false, None);
    for (bytes, offset) in [(0, 0), (7, 3), (4093, 5), (100_000, 12)] {
        for warp in [false, true] {
            ring(3, bytes, offset, warp, None);
        }
    }
    ring(4, 70_001, 3, false, Some(2));
}

/// An all-reduce made over a NIC transport refuses to run once that
/// transport was torn down (its handle names freed rings), naming the
/// way out; one made afresh runs and is right. Over the proxy
/// (`proxy_reset`) and IBGDA (`ibgda_reset`).
#[test]
fn a_collective_made_before_a_reset_refuses_to_run_and_a_new_one_runs() {
    use doorbell::coll::AllReduceOptions;
    use doorbell::coll::{AllReduce, DType, TransportKind};
    let big = CommOptions {
        heap_bytes: 16 << 20,
        ..opts()
    };
    let out = Communicator::local(2, Backend::Cpu, big, |comm| {
        let dev = comm.device();
        let s = dev.new_stream()?;
        let mut seen = Vec::new();
        for kind in [TransportKind::Proxy, TransportKind::Ibgda] {
            let o = AllReduceOptions {
                transport: kind,
                ..Default::default()
            };
            let sum = |ar: &AllReduce| -> doorbell::Result<Vec<f32>> {
                let mut buf = dev.alloc_from(&[comm.rank() as f32 + 1.5; 257])?;
                ar.run_in_place(&s, &mut buf)?;
                comm.synchronize(&s)?;
                buf.to_host()
            };
            let ar = AllReduce::with_options(comm, 257, DType::F32, &o)?;
            let before = sum(&ar)?;
            match kind {
                TransportKind::Proxy => comm.proxy_reset()?,
                _ => comm.ibgda_reset()?,
            }
            let stale = sum(&ar).err().map(|e| e.to_string()).unwrap_or_default();
            let fresh = sum(&AllReduce::with_options(comm, 257, DType::F32, &o)?)?;
            seen.push((before, stale, fresh));
            if kind == TransportKind::Proxy {
                comm.proxy_reset()?;
            }
        }
        Ok(seen)
    })
    .expect("the world");
    for (r, runs) in out.iter().enumerate() {
        for (before, stale, fresh) in runs {
            assert!(before.iter().chain(fresh).all(|&v| v == 4.0), "rank {r}: {before:?} / {fresh:?}");
            assert!(
                stale.contains("torn down since") && stale.contains("make a new one"),
                "rank {r}: {stale}"
            );
        }
    }
}

#[test]
fn a_put_of_more_wqes_than_the_send_queue_holds_goes_in_parts() {
    // 64-byte WQEs and a 32-slot queue: the 4 KiB put is 64 WRITEs and its
    // signal, posted 32 + 32 + 1, each part's last WQE signaled.
    let io = IbgdaOptions {
        sq_size: 32,
        max_msg: 64,
        ..IbgdaOptions::from_env().expect("options")
    };
    let out = Communicator::local(2, Backend::Cpu, opts(), |comm| {
        let dev = comm.device();
        let f = load_test_kernel::<<bad_call as ForTransport<Proxy>>::Kernel>(dev)?;
        let dst = comm.alloc::<u8>(BYTES as usize)?;
        let sig = comm.alloc::<u64>(2)?;
        let src = comm.alloc::<u8>(BYTES as usize)?;
        let pattern: Vec<u8> = (0..BYTES).map(|i| (i % 239) as u8 ^ 0x3c).collect();
        src.copy_from_host(&pattern)?;
        let t = comm.proxy_with(&io)?;
        let (r, _) = put_signal_once(comm, &f, t, dst.as_mut_ptr(), src.as_ptr(), sig.as_mut_ptr())?;
        r?;
        comm.barrier()?;
        Ok((comm.proxy_stats().expect("set up"), dst.to_host()?, sig.to_host()?, pattern))
    })
    .expect("the world");
    let (stats, _, _, _) = &out[0];
    assert_eq!((stats.requests, stats.wqes, stats.cqes), (1, 65, 3), "{stats:?}");
    let (_, dst, sig, pattern) = &out[1];
    assert_eq!(dst, pattern, "rank 1's destination");
    assert_eq!(sig[0], 7, "the signal after the data");
}

/// 2 warps post 2.5 times the request ring's slots of non-blocking puts
/// (a request per lane, 40 rounds each) while rank 0's proxy is held for
/// 300 ms: reservations past the ring must wait for the proxy to take the
/// requests they would overwrite (the room a poster saw is kept on the
/// device and re-read from host memory only when it runs out). Every
/// request completes and the words land.
#[test]
fn more_requests_than_the_ring_holds_wait_for_room_and_all_land() {
    use doorbell_example_kernels::ibgda_bench::{lane_words, post_lanes, BENCH_FAILED, NO_PEER};
    const ROUNDS: u32 = 40;
    const VALUE: u64 = 0x5eed_0000_7a11_0001;
    // A word per put: 2 blocks x 32 lanes x ROUNDS.
    const WORDS: usize = 2 * 32 * ROUNDS as usize;
    assert_eq!(lane_words(2, ROUNDS), WORDS, "under LANE_WORDS: a word per put");
    let out = Communicator::local(2, Backend::Cpu, opts(), |comm| {
        let dev = comm.device();
        let f = comm
            .load_module(&doorbell_examples::USER_KERNELS)?
            .function::<<post_lanes as ForTransport<Proxy>>::Kernel>()?;
        let dst = comm.alloc::<u64>(WORDS)?;
        dst.copy_from_host(&[0u64; WORDS])?;
        let src = comm.alloc::<u64>(64)?;
        src.copy_from_host(&[VALUE; 64])?;
        let t = comm.proxy()?;
        let s = dev.new_stream()?;
        let mut ns = dev.alloc_zeroed::<u64>(6)?;
        let mut status = dev.alloc_zeroed::<u32>(1)?;
        comm.proxy_hold(true)?;
        comm.barrier()?;
        // Rank 0 posts to rank 1.
        let peer = if comm.rank() == 0 { 1 } else { NO_PEER };
        let args = (
            t,
            peer,
            dst.as_mut_ptr(),
            src.as_ptr(),
            ROUNDS,
            ns.as_mut_ptr(),
            status.as_mut_ptr(),
        );
        // SAFETY: symmetric dst of a word per put, src of 64; 3 timer words
        // per block, one status word.
        unsafe { s.launch(&f, LaunchConfig::linear(2, 32), args)? };
        std::thread::sleep(Duration::from_millis(300));
        comm.proxy_hold(false)?;
        comm.synchronize(&s)?;
        comm.barrier()?;
        Ok((status.to_host()?[0], dst.to_host()?, comm.proxy_stats().expect("set up")))
    })
    .expect("the world");
    assert_ne!(out[0].0, BENCH_FAILED, "rank 0's puts failed");
    let requests = 2 * 32 * ROUNDS as u64;
    assert!(
        requests > 2 * doorbell::comm::PROXY_RING_SLOTS as u64,
        "the ring wraps at least twice"
    );
    assert_eq!(out[0].2.requests, requests, "{:?}", out[0].2);
    // Every put wrote a word of its own of rank 1.
    let landed = &out[1].1;
    if let Some(i) = landed.iter().position(|w| *w != VALUE) {
        panic!("rank 1's word {i} of {WORDS} holds {:#x}", landed[i]);
    }
}

/// A proxy handle used from a test's own thread as a kernel's thread uses
/// it (the emulator runs device code on host threads): plain data naming
/// the communicator's memory, copied to the thread as a kernel argument is.
#[derive(Clone, Copy)]
struct OnThread(Proxy);
// SAFETY: as a kernel argument, copied to every thread that uses it.
unsafe impl Send for OnThread {}
// SAFETY: as above.
unsafe impl Sync for OnThread {}

impl OnThread {
    fn handle(&self) -> &Proxy {
        &self.0
    }

    /// `f` run as the one thread of a 1 × 1 emulated launch; its result.
    fn run<R: Send>(self, f: impl Fn(&Proxy) -> R + Sync) -> R {
        let out = std::sync::Mutex::new(None);
        let me = &self;
        let one = doorbell_kernels::emu::EmuLaunch {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem_bytes: 0,
        };
        doorbell_kernels::emu::run(one, &|| *out.lock().unwrap() = Some(f(me.handle()))).unwrap();
        out.into_inner().unwrap().expect("the launch ran its thread")
    }
}

/// A put of `bytes` at `addr` (a symmetric buffer of this rank) to the
/// same address on `peer`, by one thread.
fn put_at(t: &Proxy, peer: u32, addr: u64, bytes: u64, nbi: bool) -> Result<(), CommError> {
    let x = RawXfer {
        dst: addr as *mut u8,
        src: addr as *const u8,
        bytes,
        nbi,
    };
    // SAFETY: the caller's symmetric buffer of `bytes`; one thread.
    unsafe { t.put_raw(Coop::Thread, peer, x, None) }
}

/// `n` signals adding 1 to the symmetric word at `sig` on `peer`: how
/// many succeeded before the first failure, and that failure.
fn signals(t: &Proxy, peer: u32, sig: u64, n: u32) -> (u32, Option<CommError>) {
    for k in 0..n {
        // SAFETY: a symmetric word; one thread.
        if let Err(e) = unsafe { t.signal_raw(peer, RawSignal::add(sig as *mut u64, 1)) } {
            return (k, Some(e));
        }
    }
    (n, None)
}

/// A change to the soft NIC's configuration, given rank 1's port index.
type Fault = dyn Fn(&mut EngineConfig, u32);

/// Sets rank 0's soft NIC faults to `f(config, port index of rank 1)`
/// (collective: every rank learns the ports), waiting for the engine to
/// read them; the default configuration back with `None`.
fn faults(comm: &Communicator, f: Option<&Fault>) -> doorbell::Result<()> {
    let nic = comm.soft_nic().expect("the proxy runs over the soft NIC");
    let ports = comm.world().all_gather_bytes(&(nic.port_index() as u64).to_le_bytes())?;
    let port1 = u64::from_le_bytes(ports[1].as_slice().try_into().unwrap()) as u32;
    if comm.rank() == 0 {
        let mut cfg = EngineConfig::default();
        if let Some(f) = f {
            cfg = nic.fabric().config();
            f(&mut cfg, port1);
        }
        nic.fabric().set_config(cfg);
        // The engine reads its configuration between passes.
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Waiters of a request are answered while a later request goes in parts:
/// rank 0's blocking 8-byte put (ticket 0) completes long before the
/// 64 KiB put behind it (ticket 1: 1 024 WQEs of 64 B through a send queue
/// of 32, each WQE 20 ms on the modeled link), whose parts each wait for
/// room. The proxy used to publish `done` only once every part was
/// written, so the small put waited as long as the large one.
#[test]
fn a_request_completes_while_a_long_one_behind_it_goes_in_parts() {
    use doorbell_softnic::engine::LinkModel;
    use std::time::Instant;
    let io = IbgdaOptions {
        sq_size: 32,
        max_msg: 64,
        link: Some(LinkModel::new(0, 20_000_000)),
        ..Default::default()
    };
    let out = Communicator::local(2, Backend::Cpu, opts(), |comm| {
        let small = comm.alloc::<u64>(1)?;
        let big = comm.alloc::<u8>(64 << 10)?;
        let h = OnThread(comm.proxy_with(&io)?);
        comm.barrier()?;
        if comm.rank() != 0 {
            comm.barrier()?;
            return Ok(None);
        }
        comm.proxy_hold(true)?;
        let (small_at, big_at) = (small.as_mut_ptr() as u64, big.as_mut_ptr() as u64);
        let t0 = Instant::now();
        let (small_s, big_s) = std::thread::scope(|s| {
            let a = s.spawn(move || {
                h.run(|t| assert!(put_at(t, 0, small_at, 8, false).is_ok(), "the small put"));
                t0.elapsed().as_secs_f64()
            });
            // Ticket 0 is the small put's before the large one posts.
            std::thread::sleep(Duration::from_millis(200));
            let b = s.spawn(move || {
                // SAFETY (quiet): one thread quiets its own puts.
                h.run(|t| assert!(put_at(t, 1, big_at, 64 << 10, true).is_ok() && unsafe { t.quiet(None) }.is_ok()));
                t0.elapsed().as_secs_f64()
            });
            std::thread::sleep(Duration::from_millis(200));
            comm.proxy_hold(false).unwrap();
            (a.join().unwrap(), b.join().unwrap())
        });
        comm.barrier()?;
        Ok(Some((small_s, big_s)))
    })
    .expect("the world");
    let (small_s, big_s) = out[0].expect("rank 0 timed both");
    // Both waited for the release at 0.4 s; then one WQE's 20 ms against
    // 32 parts' worth.
    let (small_wait, big_wait) = (small_s - 0.4, big_s - 0.4);
    assert!(
        big_wait > 0.3 && small_wait < big_wait / 4.0,
        "the small put took {small_wait:.3} s after the release, the large one {big_wait:.3} s"
    );
}

/// A poster waiting for room in a full request ring hears of a failure
/// published meanwhile: rank 0's thread fills the ring with signals while
/// the proxy is held, then the proxy's first request fails (every WQE an
/// error completion) and it takes no more. The waiting post returns the
/// completion error at once, not a timeout after the whole budget (which
/// also marked the handle wedged).
#[test]
fn a_poster_waiting_for_ring_room_hears_of_a_failure() {
    use doorbell::comm::PROXY_RING_SLOTS;
    let out = Communicator::local(2, Backend::Cpu, opts(), |comm| {
        let sig = comm.alloc::<u64>(1)?;
        let h = OnThread(comm.proxy()?);
        faults(comm, Some(&|c, _| c.faults.force_error_every = 1))?;
        let mut seen = None;
        if comm.rank() == 0 {
            comm.proxy_hold(true)?;
            let at = sig.as_mut_ptr() as u64;
            let t0 = std::time::Instant::now();
            let (n, e) = std::thread::scope(|s| {
                let poster = s.spawn(move || h.run(|t| signals(t, 1, at, u32::MAX)));
                // The ring fills, and the poster waits for room.
                std::thread::sleep(Duration::from_millis(300));
                comm.proxy_hold(false).unwrap();
                poster.join().unwrap()
            });
            seen = Some((n, format!("{e:?}"), t0.elapsed().as_secs_f64()));
        }
        faults(comm, None)?;
        comm.barrier()?;
        comm.proxy_reset()?;
        Ok(seen)
    })
    .expect("the world");
    let (n, e, secs) = out[0].clone().expect("rank 0 posted");
    // The ring filled while held (the proxy takes some more once released,
    // before the first completion error comes back).
    assert!(n >= PROXY_RING_SLOTS, "only {n} posts before the error");
    assert!(e.contains("Completion"), "the waiting post's error: {e}");
    assert!(secs < 10.0, "the error came after {secs:.1} s (the budget is 20 s)");
}

/// A NIC that completes nothing is reported as stalled, naming the oldest
/// request waiting, even when the proxy has room to post more: rank 1's
/// port answers nothing, and rank 0's one blocking put to it ends with a
/// `proxy_check` error naming request 0. (The proxy used to look for a
/// stall only while it waited for room in a send queue.) A barrier after
/// it fails at once, and its report names the stall and request 0 to rank
/// 1, as `proxy_check` does (it used to say "a completion from rank
/// 4294967295 came back with error syndrome 0x00": the barrier's own
/// peer, none, and a completion that never came).
#[test]
fn a_nic_that_completes_nothing_is_reported_stalled_naming_the_oldest_request() {
    let short = CommOptions {
        wait_timeout: Duration::from_secs(2),
        ..opts()
    };
    let out = Communicator::local(2, Backend::Cpu, short, |comm| {
        let buf = comm.alloc::<u8>(8)?;
        let h = OnThread(comm.proxy()?);
        faults(
            comm,
            Some(&|c, port1| {
                // Rank 1's port never answers (a fault names a port by index + 1).
                c.faults.stall_port = port1 + 1;
                c.faults.stall_until_ns = u64::MAX;
                c.transport_timeout_ns = 60_000_000_000;
            }),
        )?;
        let mut seen = None;
        if comm.rank() == 0 {
            let at = buf.as_mut_ptr() as u64;
            let ok = h.run(|t| put_at(t, 1, at, 8, false).is_ok());
            // The proxy gives up on the queue within its budget of the put.
            std::thread::sleep(Duration::from_millis(500));
            let check = comm.proxy_check().err().map(|e| e.to_string());
            // The put's own report first, then the barrier's.
            let _ = comm.check();
            let t0 = std::time::Instant::now();
            // SAFETY: one thread of this rank (the other rank is not in it).
            let barrier = h.run(|t| unsafe { t.barrier() }.is_ok());
            let secs = t0.elapsed().as_secs_f64();
            let report = comm.check().err().map(|e| e.to_string());
            seen = Some((ok, check, barrier, secs, report));
        }
        faults(comm, None)?;
        comm.barrier()?;
        Ok(seen)
    })
    .expect("the world");
    let (ok, check, barrier, secs, report) = out[0].clone().expect("rank 0 put");
    assert!(!ok, "the put to a port that answers nothing succeeded");
    let check = check.unwrap_or_default();
    assert!(
        check.contains("request 0 to rank 1") && check.contains("no progress"),
        "proxy_check: {check}"
    );
    assert!(
        !barrier && secs < 1.0,
        "the barrier after the stall: ok {barrier} after {secs:.2} s"
    );
    let report = report.unwrap_or_default();
    assert!(
        report.contains("barrier") && report.contains("proxy stopped at its request 0 to rank 1: the NIC made no progress"),
        "the barrier's report: {report}"
    );
}

/// A barrier through the proxy that rank 2 skipped (ranks 0 and 1 time
/// out in it and read the error) leaves the ranks' barrier counts apart;
/// the host barrier after it aligns them, so the next barrier holds: rank
/// 2, there 200 ms before the others, waits for them. (Without it rank 2
/// passed at once on the counts the others had signaled in the failed
/// barrier, and they timed out.)
#[test]
fn a_barrier_some_ranks_skipped_leaves_the_next_one_whole() {
    use std::time::Instant;
    let short = CommOptions {
        wait_timeout: Duration::from_millis(300),
        ..opts()
    };
    let out = Communicator::local(3, Backend::Cpu, short, |comm| {
        let h = OnThread(comm.proxy()?);
        comm.barrier()?;
        let mut first = None;
        if comm.rank() != 2 {
            // SAFETY: one thread of this rank.
            first = Some(h.run(|t| unsafe { t.barrier() }.is_ok()));
            // Read (and so noted): the timeout.
            first = first.filter(|_| comm.check().is_err());
        }
        comm.barrier()?;
        if comm.rank() != 2 {
            std::thread::sleep(Duration::from_millis(200));
        }
        let t0 = Instant::now();
        // SAFETY: as above.
        let ok = h.run(|t| unsafe { t.barrier() }.is_ok());
        let secs = t0.elapsed().as_secs_f64();
        comm.barrier()?;
        comm.proxy_reset()?;
        Ok((first, ok, secs))
    })
    .expect("the world");
    for (r, (first, ok, secs)) in out.iter().enumerate() {
        if r != 2 {
            assert_eq!(*first, Some(false), "rank {r}: the barrier rank 2 skipped");
        }
        assert!(ok, "rank {r}: the barrier every rank joined failed after {secs:.3} s");
    }
    assert!(
        out[2].2 > 0.1,
        "rank 2 passed the barrier without waiting for the others: {:.4} s",
        out[2].2
    );
}

/// A handle wedged by a full request ring (the proxy held past a poster's
/// whole budget) is named by `proxy_check`, which used to answer Ok, and
/// its later posts fail at once; a reset recovers.
#[test]
fn proxy_check_names_a_wedged_handle() {
    use doorbell::comm::PROXY_RING_SLOTS;
    let short = CommOptions {
        wait_timeout: Duration::from_secs(1),
        ..opts()
    };
    let out = Communicator::local(2, Backend::Cpu, short, |comm| {
        let sig = comm.alloc::<u64>(1)?;
        let h = OnThread(comm.proxy()?);
        comm.barrier()?;
        let mut seen = None;
        if comm.rank() == 0 {
            let healthy = comm.proxy_check().is_ok();
            comm.proxy_hold(true)?;
            let at = sig.as_mut_ptr() as u64;
            // The ring's worth, one more that waits out its budget, then
            // one that fails at once.
            let (first, again, waited) = h.run(|t| {
                let (first, _) = signals(t, 1, at, PROXY_RING_SLOTS + 1);
                let t0 = std::time::Instant::now();
                let (again, _) = signals(t, 1, at, 1);
                (first, again, t0.elapsed().as_secs_f64())
            });
            let check = comm.proxy_check().err().map(|e| e.to_string());
            comm.proxy_hold(false)?;
            seen = Some((healthy, first, again, waited, check));
        }
        comm.barrier()?;
        comm.proxy_reset()?;
        Ok(seen)
    })
    .expect("the world");
    let (healthy, first, again, waited, check) = out[0].clone().expect("rank 0 posted");
    assert!(healthy, "proxy_check before anything was posted");
    assert_eq!(
        first, PROXY_RING_SLOTS,
        "the ring's worth of posts, then the one that found no room"
    );
    assert!(
        again == 0 && waited < 0.5,
        "a post after the wedge: {again} succeeded after {waited:.2} s"
    );
    let check = check.unwrap_or_default();
    assert!(check.contains("wedged") && check.contains("proxy_reset()"), "proxy_check: {check}");
}

/// When requests to two peers both fail, the failure published is the
/// earliest request's, whichever queue reports first: rank 0's blocking put
/// to rank 1 (ticket 0) and then to itself (ticket 1), every WQE an error
/// completion. Both posters get the completion error, and `proxy_check`
/// names request 0 (the failure used to go to the queue polled first, and
/// ticket 0's poster then waited out its budget).
#[test]
fn the_failure_published_is_the_earliest_requests() {
    let out = Communicator::local(2, Backend::Cpu, opts(), |comm| {
        let buf = comm.alloc::<u8>(8)?;
        let h = OnThread(comm.proxy()?);
        faults(comm, Some(&|c, _| c.faults.force_error_every = 1))?;
        let mut seen = None;
        if comm.rank() == 0 {
            comm.proxy_hold(true)?;
            let at = buf.as_mut_ptr() as u64;
            let t0 = std::time::Instant::now();
            let (a, b) = std::thread::scope(|s| {
                let a = s.spawn(move || h.run(|t| format!("{:?}", put_at(t, 1, at, 8, false))));
                std::thread::sleep(Duration::from_millis(200));
                let b = s.spawn(move || h.run(|t| format!("{:?}", put_at(t, 0, at, 8, false))));
                std::thread::sleep(Duration::from_millis(200));
                comm.proxy_hold(false).unwrap();
                (a.join().unwrap(), b.join().unwrap())
            });
            let secs = t0.elapsed().as_secs_f64();
            seen = Some((a, b, comm.proxy_check().err().map(|e| e.to_string()), secs));
        }
        faults(comm, None)?;
        comm.barrier()?;
        comm.proxy_reset()?;
        Ok(seen)
    })
    .expect("the world");
    let (a, b, check, secs) = out[0].clone().expect("rank 0 put");
    assert!(a.contains("Completion") && b.contains("Completion"), "ticket 0: {a}; ticket 1: {b}");
    assert!(secs < 10.0, "the posters waited {secs:.1} s (the budget is 20 s)");
    let check = check.unwrap_or_default();
    assert!(check.contains("request 0 to rank 1"), "proxy_check: {check}");
}
