//! Two OS processes forming a communicator through the TCP rendezvous and
//! exchanging data with the P2P transport, and over the soft NIC with
//! IBGDA (plain and routed) and the CPU proxy: shared-memory heaps on the CPU emulator, CUDA IPC on
//! a GPU. Each transport runs the ring, the flagged rounds and the
//! contract's argument checks and multi-word waits across the two
//! processes; the routed transport and the proxy the library's all-reduce
//! too. The test binary re-runs itself as rank 1.

use std::process::{Command, Stdio};
use std::time::Duration;

use doorbell::coll::reference::{allreduce_sum_nodes, first_mismatch};
use doorbell::coll::{AllReduce, AllReduceOptions, DType, TransportKind};
use doorbell::comm::{CommOptions, Communicator, PeerRoute, RdmaPeers};
use doorbell::world::{RendezvousHost, World, WorldConfig};
use doorbell::{Backend, Device, DeviceBuffer, ForTransport, Kernel, KernelParam, LaunchConfig, Module};
use doorbell_kernels::transport::Transport;
use doorbell_test_kernels::contract::{bad_call, collect_signals, flagged_rounds};
use doorbell_test_kernels::testing::{record_indices, ring, STATUS_OK};
use doorbell_tests::{BadArgs, CollectArgs, FlaggedRounds, RingArgs, RoundArgs, BAD_CALLS, BAD_CALL_CONTROL, TEST_KERNELS};

const TOKEN: &str = "comm-procs-test-token-91c2";
const BYTES: usize = 10_007;

/// Rank `rank`'s device: GPU 0, or GPU `rank % gpus` with
/// DOORBELL_RANK_PER_GPU=1 (or its former name, DOORBELL_SPREAD_GPUS=1).
fn device(backend: Backend, rank: usize) -> Device {
    let spread = match std::env::var("DOORBELL_RANK_PER_GPU") {
        Ok(v) => v == "1",
        Err(_) => std::env::var("DOORBELL_SPREAD_GPUS").is_ok_and(|v| v == "1"),
    };
    match backend {
        Backend::Gpu => Device::gpu(if spread { rank % doorbell::gpu_count().max(1) } else { 0 }).unwrap(),
        _ => Device::emulator(0),
    }
}

/// The transport a two-process run uses: P2P (load/store through the
/// mapped heaps), IBGDA over the soft NIC (each process runs its port's
/// engine, which reaches the peer's tables and heap through the same
/// mapping), the routed transport with every pair sent through the NIC, or
/// the CPU proxy (each process's host thread posts its requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    P2p,
    Ibgda,
    Routed,
    /// The CPU proxy: a host thread of each process posts the WQEs.
    Proxy,
}

impl Via {
    fn name(self) -> &'static str {
        match self {
            Via::P2p => "p2p",
            Via::Ibgda => "ibgda",
            Via::Routed => "routed",
            Via::Proxy => "proxy",
        }
    }
    fn parse(s: &str) -> Via {
        match s {
            "ibgda" => Via::Ibgda,
            "routed" => Via::Routed,
            "proxy" => Via::Proxy,
            _ => Via::P2p,
        }
    }
}

/// A rank's communicator: a 1 MiB heap, waits of at most 20 s.
fn open_rank(world: World, backend: Backend) -> Result<Communicator, doorbell::Error> {
    let opts = CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let rank = world.rank();
    Communicator::new(world, device(backend, rank), opts)
}

/// Both ranks: ring put/get of BYTES with a signal and a barrier, then
/// flagged rounds, over `via`; returns the route to the peer.
fn run_rank(world: World, backend: Backend, via: Via) -> Result<PeerRoute, doorbell::Error> {
    let comm = open_rank(world, backend)?;
    let rank = comm.rank();
    // Before the IBGDA set-up: no module loads while a GPU engine runs.
    let m = comm.device().load_module(&TEST_KERNELS)?;
    match via {
        Via::P2p => exchange(&comm, &m, comm.p2p()?)?,
        Via::Ibgda => exchange(&comm, &m, comm.ibgda()?)?,
        Via::Routed => {
            let t = comm.routed_with(&RdmaPeers::All)?;
            exchange(&comm, &m, t)?;
            allreduce_across(&comm, TransportKind::Routed)?;
        }
        Via::Proxy => {
            exchange(&comm, &m, comm.proxy()?)?;
            allreduce_across(&comm, TransportKind::Proxy)?;
            // Every call to the peer went through this process's thread.
            let st = comm.proxy_stats().expect("the proxy is set up");
            assert!(st.requests > 0 && st.cqes > 0, "rank {rank}: the proxy took nothing: {st:?}");
        }
    }
    // The NIC's queues are clean after both exchanges.
    match via {
        Via::P2p => {}
        Via::Proxy => comm.proxy_check()?,
        _ => comm.ibgda_check()?,
    }
    Ok(comm.describe_peers()[1 - comm.rank()].clone())
}

/// The library's all-reduce over `kind` between the two processes (every
/// pair through the NIC), three launches of f32 that differ per rank,
/// element and launch, each result checked bit for bit against the CPU
/// reference on both ranks.
fn allreduce_across(comm: &Communicator, kind: TransportKind) -> Result<(), doorbell::Error> {
    const ELEMS: usize = 3001;
    let opts = AllReduceOptions {
        transport: kind,
        rdma_peers: Some(RdmaPeers::All),
        stages: Some(2),
        chunk_bytes: Some(1024),
        ..Default::default()
    };
    let ar = AllReduce::with_options(comm, ELEMS, DType::F32, &opts)?;
    let dev = comm.device();
    let s = dev.new_stream()?;
    for launch in 0..3usize {
        let inputs: Vec<Vec<f32>> = (0..2)
            .map(|r| {
                (0..ELEMS)
                    .map(|i| ((r * 7 + i * 13 + launch * 5) % 29) as f32 * 0.3125 - 4.0)
                    .collect()
            })
            .collect();
        let want = allreduce_sum_nodes(&inputs, 2);
        let input = dev.alloc_from(&inputs[comm.rank()])?;
        let mut out: DeviceBuffer<f32> = dev.alloc_zeroed(ELEMS)?;
        ar.run(&s, &input, &mut out)?;
        comm.synchronize(&s)?;
        let got = out.to_host()?;
        if let Some(i) = first_mismatch(&got, &want) {
            panic!(
                "{kind}, launch {launch}, rank {}: element {i} is {}, want {}",
                comm.rank(),
                got[i],
                want[i]
            );
        }
        comm.barrier()?;
    }
    Ok(())
}

fn exchange<T: Transport + KernelParam>(comm: &Communicator, m: &Module, t: T) -> Result<(), doorbell::Error>
where
    ring: ForTransport<T>,
    <ring as ForTransport<T>>::Kernel: Kernel<Args = RingArgs<T>>,
    flagged_rounds: ForTransport<T>,
    <flagged_rounds as ForTransport<T>>::Kernel: Kernel<Args = RoundArgs<T>>,
    bad_call: ForTransport<T>,
    <bad_call as ForTransport<T>>::Kernel: Kernel<Args = BadArgs<T>>,
    collect_signals: ForTransport<T>,
    <collect_signals as ForTransport<T>>::Kernel: Kernel<Args = CollectArgs<T>>,
{
    let dev = comm.device();
    let f = m.function::<<ring as ForTransport<T>>::Kernel>()?;
    let src = comm.alloc::<u8>(BYTES)?;
    let dst = comm.alloc::<u8>(BYTES)?;
    let got = comm.alloc::<u8>(BYTES)?;
    let sig = comm.alloc::<u64>(1)?;
    let mut status = dev.alloc_zeroed::<u32>(1)?;
    let r = comm.rank();
    src.copy_from_host(&(0..BYTES).map(|i| (i * 7 + r * 100) as u8).collect::<Vec<_>>())?;
    let bufs = (src.as_mut_ptr(), dst.as_mut_ptr(), got.as_mut_ptr());
    let args = doorbell_tests::ring_round(t, bufs, BYTES as u64, sig.as_mut_ptr(), status.as_mut_ptr());
    // SAFETY: sizes as ring documents.
    let s = unsafe { doorbell_tests::launch_after_barrier(comm, &f, LaunchConfig::linear(1, 64), args)? };
    comm.synchronize(&s)?;
    assert_eq!(status.to_host()?[0], STATUS_OK);
    let peer = 1 - r;
    let want: Vec<u8> = (0..BYTES).map(|i| (i * 7 + peer * 100) as u8).collect();
    assert!(dst.to_host()? == want, "rank {r}: put data wrong");
    assert!(got.to_host()? == want, "rank {r}: get data wrong");
    flagged_rounds_across(comm, m, t)?;
    contract_across(comm, m, t)
}

/// Data visible when its signal is seen, between two processes: rank 0
/// `put_signal`s a payload that changes every round, rank 1 checks every
/// word after each signal (see `flagged_rounds`).
fn flagged_rounds_across<T: Transport + KernelParam>(comm: &Communicator, m: &Module, t: T) -> Result<(), doorbell::Error>
where
    flagged_rounds: ForTransport<T>,
    <flagged_rounds as ForTransport<T>>::Kernel: Kernel<Args = RoundArgs<T>>,
{
    let (blocks, words, iters) = (4u32, 1031u32, 20u32);
    let f = m.function::<<flagged_rounds as ForTransport<T>>::Kernel>()?;
    let mut rounds = FlaggedRounds::new(comm, blocks, words)?;
    let args = rounds.args(t, iters, 0);
    // SAFETY: sizes as flagged_rounds documents.
    let s = unsafe { doorbell_tests::launch_after_barrier(comm, &f, LaunchConfig::linear(blocks, 64), args)? };
    comm.synchronize(&s)?;
    rounds.check(comm.rank(), iters, &format!("rank {}", comm.rank()))
}

/// The contract's argument checks and multi-word waits between two
/// processes: rank 0 makes each bad call toward rank 1 (a rank outside the
/// world, a range past the heap's end, a misaligned signal word alone and
/// behind a put, a get from a rank outside the world, a wait over too many
/// words); each is a typed error naming rank 0, the call and the peer, and
/// rank 1's target and signal words stay zero. The same call with good
/// arguments then delivers, and rank 1 collects 12 signals set one by one
/// with `wait_until_some`.
fn contract_across<T: Transport + KernelParam>(comm: &Communicator, m: &Module, t: T) -> Result<(), doorbell::Error>
where
    bad_call: ForTransport<T>,
    <bad_call as ForTransport<T>>::Kernel: Kernel<Args = BadArgs<T>>,
    collect_signals: ForTransport<T>,
    <collect_signals as ForTransport<T>>::Kernel: Kernel<Args = CollectArgs<T>>,
{
    let dev = comm.device();
    let r = comm.rank();
    let f = m.function::<<bad_call as ForTransport<T>>::Kernel>()?;
    let dst = comm.alloc::<u8>(4096)?;
    let sig = comm.alloc::<u64>(2)?;
    let src = comm.alloc::<u8>(4096)?;
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8 + 1).collect();
    src.copy_from_host(&pattern)?;
    let mut codes = dev.alloc_zeroed::<u32>(2)?;
    let s = dev.new_stream()?;
    let control = (BAD_CALL_CONTROL, 0, "", None, "");
    for (case, code, call, peer, words) in BAD_CALLS.into_iter().chain([control]) {
        // The offset named: the range's start, or the misaligned signal word.
        let offset = match case {
            1 => Some(dst.offset()),
            2 | 3 => Some(sig.offset() + 4),
            7 => Some(0),
            _ => None,
        };
        let what = format!("rank {r} case {case}");
        dst.copy_from_host(&[0; 4096])?;
        sig.copy_from_host(&[0; 2])?;
        codes.copy_from_host(&[0, 0])?;
        comm.barrier()?;
        // Case 1: a range from `dst` one byte past the heap's end (never read).
        let bytes = doorbell_tests::bad_call_bytes(case, dst.offset(), comm.heap_bytes());
        let args = (t, dst.as_mut_ptr(), src.as_ptr(), bytes, sig.as_mut_ptr(), case, codes.as_mut_ptr());
        // SAFETY: symmetric dst/sig; src holds 4096 bytes, all a call may read.
        let err = unsafe { doorbell_tests::run_bad_call(comm, &s, &f, args)? };
        if r == 0 {
            assert_eq!(codes.to_host()?, vec![code, 0], "{what}: error code, threads that disagreed");
            match (case, err) {
                (BAD_CALL_CONTROL, None) => {}
                (
                    _,
                    Some(doorbell::Error::DeviceCall {
                        rank,
                        call: c,
                        peer: p,
                        offset: o,
                        reason,
                        ..
                    }),
                ) if case != BAD_CALL_CONTROL => {
                    assert_eq!((rank, c, p), (0, call, peer), "{what}");
                    assert!(reason.contains(words), "{what}: {reason}");
                    if let Some(want) = offset {
                        assert_eq!(o, want, "{what}: offset named");
                    }
                }
                (_, other) => panic!("{what}: unexpected outcome {other:?}"),
            }
        } else if case == BAD_CALL_CONTROL {
            assert_eq!(dst.to_host()?, pattern, "{what}: the control put_signal's data");
            assert_eq!(sig.to_host()?, vec![7, 0], "{what}: the control put_signal's signal");
        } else {
            assert!(dst.to_host()?.iter().all(|&b| b == 0), "{what}: the target buffer changed");
            assert_eq!(sig.to_host()?, vec![0, 0], "{what}: the signal words changed");
        }
    }
    let f = m.function::<<collect_signals as ForTransport<T>>::Kernel>()?;
    let sigs = comm.alloc::<u64>(doorbell_tests::COLLECT_WORDS as usize)?;
    let mut out = dev.alloc_zeroed::<u64>(4)?;
    comm.barrier()?;
    let args = doorbell_tests::collect_args(t, sigs.as_mut_ptr(), out.as_mut_ptr());
    // SAFETY: symmetric words, four output words.
    unsafe { s.launch(&f, LaunchConfig::linear(1, 32), args)? };
    comm.synchronize(&s)?;
    comm.barrier()?;
    if r == 1 {
        doorbell_tests::check_collected(&out.to_host()?, &format!("rank {r}"));
    }
    Ok(())
}

#[test]
#[ignore = "a child process's entry point: the tests that need it run it with --ignored"]
fn child_rank() {
    let Some(backend) = doorbell_tests::child_var("DOORBELL_TEST_COMM_CHILD") else {
        return;
    };
    let backend: Backend = backend.parse().unwrap();
    let via = Via::parse(&std::env::var("DOORBELL_TEST_COMM_VIA").unwrap_or_default());
    let cfg = WorldConfig::from_env().unwrap().expect("launcher variables set by the parent");
    let world = World::rendezvous(&cfg, b"comm-procs").unwrap();
    let route = run_rank(world, backend, via).unwrap();
    println!("CHILD-ROUTE {route:?}");
}

fn two_processes(backend: Backend, via: Via) -> (PeerRoute, String) {
    let cfg = WorldConfig::new(0, 2, "127.0.0.1", 0, TOKEN).with_rendezvous_timeout(Duration::from_secs(30));
    let host = RendezvousHost::bind(&cfg).unwrap();
    let port = host.local_addr().port();
    let child_backend = if backend == Backend::Gpu { "gpu" } else { "cpu" };
    let child = doorbell_tests::spawn_rank1(
        "child_rank",
        port,
        TOKEN,
        1,
        &[("DOORBELL_TEST_COMM_CHILD", child_backend), ("DOORBELL_TEST_COMM_VIA", via.name())],
    );
    let world = host.accept(b"comm-procs").unwrap();
    let route = run_rank(world, backend, via).unwrap_or_else(|e| panic!("{} rank 0: {e}", via.name()));
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (route, stdout)
}

#[test]
fn two_processes_exchange_data_through_shared_memory_on_the_emulator() {
    let (route, child) = two_processes(Backend::Cpu, Via::P2p);
    assert_eq!(route, PeerRoute::SharedMemory);
    assert!(child.contains("CHILD-ROUTE SharedMemory"), "{child}");
}

#[test]
fn two_processes_exchange_data_through_cuda_ipc_on_a_gpu() {
    if doorbell_tests::gpu().is_none() {
        eprintln!("no GPU: skipped (DOORBELL_TEST_REQUIRE_GPU=1 makes this a failure)");
        return;
    }
    let (route, child) = two_processes(Backend::Gpu, Via::P2p);
    assert_eq!(route, PeerRoute::CudaIpc);
    assert!(child.contains("CHILD-ROUTE CudaIpc"), "{child}");
}

/// IBGDA between processes: each process runs its own port's engine
/// (the kernel engine, the default when a peer is in another process),
/// which finds the peer's tables and regions in the peer's mapped heap.
/// The routed transport sends every pair through the NIC; the CPU proxy's
/// thread in each process posts that process's requests.
#[test]
fn two_processes_over_ibgda_and_routed_rdma_on_the_emulator() {
    for via in [Via::Ibgda, Via::Routed, Via::Proxy] {
        let (route, child) = two_processes(Backend::Cpu, via);
        assert_eq!(route, PeerRoute::SharedMemory, "{}", via.name());
        assert!(child.contains("CHILD-ROUTE SharedMemory"), "{}: {child}", via.name());
    }
}

#[test]
fn two_processes_over_ibgda_and_routed_rdma_on_a_gpu() {
    if doorbell_tests::gpu().is_none() {
        eprintln!("no GPU: skipped (DOORBELL_TEST_REQUIRE_GPU=1 makes this a failure)");
        return;
    }
    for via in [Via::Ibgda, Via::Routed, Via::Proxy] {
        let (route, child) = two_processes(Backend::Gpu, via);
        assert_eq!(route, PeerRoute::CudaIpc, "{}", via.name());
        assert!(child.contains("CHILD-ROUTE CudaIpc"), "{}: {child}", via.name());
    }
}

// ---- Heap files of a killed rank ----

/// This job's heap files in /dev/shm: `doorbell-<pid>-*` of the given processes.
fn heap_files_of(pids: &[u32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| pids.iter().any(|p| n.starts_with(&format!("doorbell-{p}-"))))
                .collect()
        })
        .unwrap_or_default()
}

/// A child of the kill tests. Rank 0 (`0`) prints its port and forms the
/// communicator; rank 1 forms it too (`1`), or (`1-scripted`) makes by hand
/// the collectives `Communicator::new` makes up to the heap files, creates
/// its heap file as a rank does, and stops there, as if killed while
/// setting up. Both print `FORMED` (or `CREATED`); then rank 0 waits in a
/// barrier, which fails when rank 1 dies, and rank 1 sleeps until killed.
#[test]
#[ignore = "a child process's entry point: the tests that need it run it with --ignored"]
fn child_heap_rank() {
    let Some(role) = doorbell_tests::child_var("DOORBELL_TEST_HEAP_CHILD") else {
        return;
    };
    let world = if role == "0" {
        let cfg = WorldConfig::new(0, 2, "127.0.0.1", 0, TOKEN).with_world_timeout(Duration::from_secs(30));
        let host = RendezvousHost::bind(&cfg).unwrap();
        println!("PORT {}", host.local_addr().port());
        host.accept(b"").unwrap()
    } else {
        World::rendezvous(&WorldConfig::from_env().unwrap().unwrap(), b"").unwrap()
    };
    let heap_bytes = 1 << 20;
    if role == "1-scripted" {
        // Keep in step with Communicator::new: heap size, backend, device
        // ids, then (process tag | heap file name); the file comes after.
        let heap_len: u64 = doorbell_kernels::heap::HEAP_RESERVED + heap_bytes;
        world.check_same("heap size", &heap_len.to_le_bytes()).unwrap();
        world.check_same("backend", b"cpu").unwrap();
        world.all_gather_bytes(b"0\ncpu").unwrap();
        let name = format!("/dev/shm/doorbell-{}-{}", std::process::id(), "5a".repeat(16));
        world.all_gather_bytes(&[&[0u8; 32][..], name.as_bytes()].concat()).unwrap();
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&name)
            .unwrap();
        f.set_len(heap_len).unwrap();
        println!("CREATED");
        std::thread::sleep(Duration::from_secs(60));
    }
    let opts = CommOptions {
        heap_bytes,
        ..Default::default()
    };
    let comm = match Communicator::new(world, Device::emulator(0), opts) {
        Ok(c) => c,
        Err(e) => {
            println!("NEW-FAILED {e}");
            std::process::exit(0);
        }
    };
    assert_eq!(comm.describe_peers()[1 - comm.rank()], PeerRoute::SharedMemory);
    println!("FORMED");
    if role == "0" {
        println!("BARRIER {}", comm.barrier().map_or_else(|e| e.to_string(), |()| "ok".into()));
        std::process::exit(0);
    }
    std::thread::sleep(Duration::from_secs(60));
}

/// Starts a `child_heap_rank` as rank 0, or as rank 1 joining `port`; its
/// stdout comes back line by line.
fn spawn_heap_child(role: &str, port: Option<u16>) -> (std::process::Child, impl Iterator<Item = String>) {
    use std::io::BufRead;
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child_heap_rank", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("DOORBELL_TEST_HEAP_CHILD", role)
        .env_remove("DOORBELL_MASTER_PORT")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(port) = port {
        c.env("RANK", "1")
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", "1")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("DOORBELL_TOKEN", TOKEN)
            .env("DOORBELL_WORLD_TIMEOUT_S", "30");
    }
    let mut child = c.spawn().unwrap();
    let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines.map_while(|l| l.ok()))
}

/// Rank 0's port, from its first line.
fn port_of(out: &mut impl Iterator<Item = String>) -> u16 {
    out.find_map(|l| l.split_once("PORT ").map(|(_, p)| p.trim().parse().unwrap()))
        .expect("rank 0 printed no port")
}

/// Kills rank 1 (SIGKILL) and reaps it; then rank 0's next line holding
/// `tag` (`missing`: what it means when there is none) must name the lost
/// rank 1.
fn rank0_loses_rank1(rank1: &mut std::process::Child, out0: &mut impl Iterator<Item = String>, tag: &str, missing: &str) {
    rank1.kill().unwrap();
    rank1.wait().unwrap();
    let line = out0.find(|l| l.contains(tag)).expect(missing);
    assert!(line.contains("lost rank 1"), "{line}");
}

#[test]
fn kill_9_of_a_rank_leaves_no_heap_file() {
    let (mut rank0, mut out0) = spawn_heap_child("0", None);
    let (mut rank1, mut out1) = spawn_heap_child("1", Some(port_of(&mut out0)));
    // (The test harness may print its own words before ours on a line.)
    assert!(out1.by_ref().any(|l| l.ends_with("FORMED")), "rank 1 never formed the communicator");
    assert!(out0.by_ref().any(|l| l.ends_with("FORMED")), "rank 0 never formed the communicator");
    let pids = [rank0.id(), rank1.id()];
    // Mid-run: the heaps are mapped, and no file of the job is left to leak.
    assert_eq!(heap_files_of(&pids), Vec::<String>::new(), "heap files while running");
    // SIGKILL; rank 0's barrier then fails.
    rank0_loses_rank1(&mut rank1, &mut out0, "BARRIER ", "rank 0 printed no barrier result");
    rank0.wait().unwrap();
    assert_eq!(heap_files_of(&pids), Vec::<String>::new(), "heap files after kill -9 of rank 1");
}

#[test]
fn kill_9_of_a_rank_while_heaps_are_set_up_leaves_no_heap_file() {
    let (mut rank0, mut out0) = spawn_heap_child("0", None);
    let (mut rank1, mut out1) = spawn_heap_child("1-scripted", Some(port_of(&mut out0)));
    assert!(out1.by_ref().any(|l| l.ends_with("CREATED")), "rank 1 never created its heap file");
    let pids = [rank0.id(), rank1.id()];
    // Both files exist: rank 0 made its own and now waits for rank 1's handle.
    let t0 = std::time::Instant::now();
    while heap_files_of(&pids).len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(20), "heap files: {:?}", heap_files_of(&pids));
        std::thread::sleep(Duration::from_millis(5));
    }
    // SIGKILL, with its file still in /dev/shm; rank 0's set-up then fails.
    rank0_loses_rank1(&mut rank1, &mut out0, "NEW-FAILED ", "rank 0's set-up did not fail");
    rank0.wait().unwrap();
    // Rank 0 removed its own file and the dead rank's, whose name it had.
    assert_eq!(
        heap_files_of(&pids),
        Vec::<String>::new(),
        "heap files after kill -9 of rank 1 during set-up"
    );
}

// ---- A peer's soft NIC tables ----

/// Both ranks set up IBGDA and exchange over it (each engine reads the
/// other's tables through its mapping), then rank 1 stores one word at the
/// first byte of rank 0's tables past their inboxes, which its mapping
/// must not let it write. Returns rank 0's view of the mapping; rank 1
/// prints its view, then the store's outcome (on the emulator the store
/// kills it).
fn tables_rank(world: World, backend: Backend) -> Result<String, doorbell::Error> {
    let comm = open_rank(world, backend)?;
    let rank = comm.rank();
    let m = comm.device().load_module(&TEST_KERNELS)?;
    let fill = m.function::<record_indices>()?;
    exchange(&comm, &m, comm.ibgda()?)?;
    comm.ibgda_check()?;
    let pm = comm.peer_mapping(1 - rank).expect("the peer is another process of this host");
    comm.barrier()?;
    if rank == 0 {
        return Ok(format!("{pm:?}"));
    }
    println!("CHILD-MAPPING {pm:?}");
    use std::io::Write;
    std::io::stdout().flush().ok();
    let s = comm.device().new_stream()?;
    let at = (pm.base + pm.writable) as *mut u32;
    // SAFETY: one thread writes 9 words at `at`: a fault, or the bug this test finds.
    let r = unsafe { s.launch(&fill, LaunchConfig::linear(1, 1), (at,)) }.and_then(|()| s.synchronize());
    println!("CHILD-STORE {r:?}");
    std::io::stdout().flush().ok();
    // Its context is lost on a GPU: no collective teardown.
    std::process::exit(0);
}

#[test]
#[ignore = "a child process's entry point: the tests that need it run it with --ignored"]
fn child_tables_rank() {
    let Some(backend) = doorbell_tests::child_var("DOORBELL_TEST_TABLES_CHILD") else {
        return;
    };
    let cfg = WorldConfig::from_env().unwrap().expect("launcher variables set by the parent");
    let world = World::rendezvous(&cfg, b"comm-procs-tables").unwrap();
    tables_rank(world, backend.parse().unwrap()).unwrap();
}

/// Runs [`tables_rank`] in two processes: rank 0's view of the mapping,
/// the child's exit status and its output.
fn tables_across(backend: Backend, child_env: &[(&str, &str)]) -> (String, std::process::ExitStatus, String) {
    let cfg = WorldConfig::new(0, 2, "127.0.0.1", 0, TOKEN).with_rendezvous_timeout(Duration::from_secs(30));
    let host = RendezvousHost::bind(&cfg).unwrap();
    let port = host.local_addr().port();
    let name = if backend == Backend::Gpu { "gpu" } else { "cpu" };
    let mut env = vec![("DOORBELL_TEST_TABLES_CHILD", name)];
    env.extend_from_slice(child_env);
    let child = doorbell_tests::spawn_rank1("child_tables_rank", port, TOKEN, 1, &env);
    let world = host.accept(b"comm-procs-tables").unwrap();
    let mine = tables_rank(world, backend).unwrap_or_else(|e| panic!("rank 0: {e}"));
    let out = child.wait_with_output().unwrap();
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (mine, out.status, text)
}

/// Both views of the mapping: the peer's allocation split where the
/// tables' inboxes end, both parts non-empty.
fn check_views(mine: &str, child: &str) {
    for view in [mine, child] {
        assert!(view.contains("read_only: ") && !view.contains("read_only: 0 "), "{view}");
    }
    assert!(child.contains("CHILD-MAPPING PeerMapping"), "{child}");
}

/// On the emulator a process maps its peer's tables past their inboxes
/// read-only: the child's store kills it (SIGSEGV) before it prints the
/// outcome.
#[test]
fn a_process_cannot_store_into_its_peers_soft_nic_tables_on_the_emulator() {
    use std::os::unix::process::ExitStatusExt;
    let (mine, status, child) = tables_across(Backend::Cpu, &[]);
    check_views(&mine, &child);
    assert_eq!(status.signal(), Some(11) /* SIGSEGV */, "{status:?}:\n{child}");
    assert!(!child.contains("CHILD-STORE"), "{child}");
}

/// On a GPU the peer's heap is mapped in parts (CUDA virtual memory, one
/// file descriptor per part): the tables past their inboxes read-only, so
/// the child's kernel faults instead of writing them.
#[test]
fn a_process_cannot_store_into_its_peers_soft_nic_tables_on_a_gpu() {
    if doorbell_tests::gpu().is_none() {
        eprintln!("no GPU: skipped (DOORBELL_TEST_REQUIRE_GPU=1 makes this a failure)");
        return;
    }
    let (mine, status, child) = tables_across(Backend::Gpu, &[]);
    check_views(&mine, &child);
    assert!(status.success(), "{status:?}:\n{child}");
    let outcome = child
        .lines()
        .find(|l| l.starts_with("CHILD-STORE"))
        .unwrap_or_else(|| panic!("{child}"));
    assert!(
        outcome.starts_with("CHILD-STORE Err("),
        "the store into the peer's tables went through: {outcome}\n{child}"
    );
    println!("rank 0: {mine}\n{child}");
}

/// `DOORBELL_HEAP_PARTS=0` in the child only: the child shares its heap
/// through legacy CUDA IPC (rank 0 maps all of it read-write), rank 0
/// still in parts (the child's store into rank 0's tables faults).
#[test]
fn heap_parts_turned_off_in_one_rank_on_a_gpu() {
    if doorbell_tests::gpu().is_none() {
        eprintln!("no GPU: skipped (DOORBELL_TEST_REQUIRE_GPU=1 makes this a failure)");
        return;
    }
    let (mine, status, child) = tables_across(Backend::Gpu, &[("DOORBELL_HEAP_PARTS", "0")]);
    assert!(mine.contains("read_only: 0 }"), "rank 0 maps the child's heap in parts: {mine}");
    assert!(
        child.contains("CHILD-MAPPING PeerMapping") && !child.contains("read_only: 0 }"),
        "{child}"
    );
    assert!(status.success(), "{status:?}:\n{child}");
    let outcome = child
        .lines()
        .find(|l| l.starts_with("CHILD-STORE"))
        .unwrap_or_else(|| panic!("{child}"));
    assert!(outcome.starts_with("CHILD-STORE Err("), "{outcome}\n{child}");
    println!("rank 0: {mine}\n{child}");
}
