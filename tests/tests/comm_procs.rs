//! Two OS processes forming a communicator through the TCP rendezvous and
//! exchanging data with the P2P transport: shared-memory heaps on the CPU
//! emulator, CUDA IPC on a GPU. The test binary re-runs itself as rank 1.

use std::process::{Command, Stdio};
use std::time::Duration;

use doorbell::comm::{CommOptions, Communicator, PeerRoute};
use doorbell::world::{RendezvousHost, World, WorldConfig};
use doorbell::{Backend, Device, LaunchConfig, KERNELS_PTX};
use doorbell_kernels::testing::{p2p_ring, STATUS_OK};

const TOKEN: &str = "comm-procs-test-token-91c2";
const BYTES: usize = 10_007;

/// Rank `rank`'s device: GPU 0, or GPU `rank % gpus` with DOORBELL_SPREAD_GPUS=1.
fn device(backend: Backend, rank: usize) -> Device {
    let spread = std::env::var("DOORBELL_SPREAD_GPUS").is_ok_and(|v| v == "1");
    match backend {
        Backend::Gpu => Device::gpu(if spread { rank % doorbell::gpu_count().max(1) } else { 0 }).unwrap(),
        _ => Device::emulator(0),
    }
}

/// Both ranks: ring put/get of BYTES with a signal and a barrier; returns the route to the peer.
fn run_rank(world: World, backend: Backend) -> Result<PeerRoute, doorbell::Error> {
    let opts = CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let rank = world.rank();
    let comm = Communicator::new(world, device(backend, rank), opts)?;
    let dev = comm.device();
    let m = dev.load_module(KERNELS_PTX)?;
    let f = m.function::<p2p_ring>()?;
    let src = comm.alloc::<u8>(BYTES)?;
    let dst = comm.alloc::<u8>(BYTES)?;
    let got = comm.alloc::<u8>(BYTES)?;
    let sig = comm.alloc::<u64>(1)?;
    let mut status = dev.alloc_zeroed::<u32>(1)?;
    let r = comm.rank();
    src.copy_from_host(&(0..BYTES).map(|i| (i * 7 + r * 100) as u8).collect::<Vec<_>>())?;
    comm.barrier()?;
    let s = dev.new_stream()?;
    // SAFETY: sizes as p2p_ring documents.
    unsafe {
        s.launch(
            &f,
            LaunchConfig::linear(1, 64),
            (
                comm.p2p(),
                src.as_mut_ptr(),
                dst.as_mut_ptr(),
                got.as_mut_ptr(),
                BYTES as u64,
                0u64,
                sig.as_mut_ptr(),
                1u64,
                0u32,
                status.as_mut_ptr(),
            ),
        )?
    };
    comm.synchronize(&s)?;
    assert_eq!(status.to_host()?[0], STATUS_OK);
    let peer = 1 - r;
    let want: Vec<u8> = (0..BYTES).map(|i| (i * 7 + peer * 100) as u8).collect();
    assert!(dst.to_host()? == want, "rank {r}: put data wrong");
    assert!(got.to_host()? == want, "rank {r}: get data wrong");
    Ok(comm.describe_peers()[peer].clone())
}

#[test]
fn child_rank() {
    let Ok(backend) = std::env::var("DOORBELL_TEST_COMM_CHILD") else {
        return;
    };
    let backend: Backend = backend.parse().unwrap();
    let cfg = WorldConfig::from_env().unwrap().expect("launcher variables set by the parent");
    let world = World::rendezvous(&cfg, b"comm-procs").unwrap();
    let route = run_rank(world, backend).unwrap();
    println!("CHILD-ROUTE {route:?}");
}

fn two_processes(backend: Backend) -> (PeerRoute, String) {
    let cfg = WorldConfig::new(0, 2, "127.0.0.1", 0, TOKEN).with_rendezvous_timeout(Duration::from_secs(30));
    let host = RendezvousHost::bind(&cfg).unwrap();
    let port = host.local_addr().port();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_rank", "--nocapture", "--test-threads", "1"])
        .env("DOORBELL_TEST_COMM_CHILD", if backend == Backend::Gpu { "gpu" } else { "cpu" })
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env_remove("DOORBELL_MASTER_PORT")
        .env("DOORBELL_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let world = host.accept(b"comm-procs").unwrap();
    let route = run_rank(world, backend).unwrap();
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
    let (route, child) = two_processes(Backend::Cpu);
    assert_eq!(route, PeerRoute::SharedMemory);
    assert!(child.contains("CHILD-ROUTE SharedMemory"), "{child}");
}

#[test]
fn two_processes_exchange_data_through_cuda_ipc_on_a_gpu() {
    if doorbell_tests::gpu().is_none() {
        eprintln!("no GPU: skipped (DOORBELL_TEST_REQUIRE_GPU=1 makes this a failure)");
        return;
    }
    let (route, child) = two_processes(Backend::Gpu);
    assert_eq!(route, PeerRoute::CudaIpc);
    assert!(child.contains("CHILD-ROUTE CudaIpc"), "{child}");
}
