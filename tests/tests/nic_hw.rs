//! On a ConnectX NIC and a GPU: the mlx5 DevX implementation of the NIC
//! boundary, end to end. Every test is `#[ignore]` and needs
//! `DOORBELL_TEST_NIC=<device>[:port]` (e.g. `mlx5_0:1`);
//! `scripts/run-nic-tests.sh` runs them:
//!
//! ```text
//! DOORBELL_TEST_NIC=mlx5_0 cargo test --release -p doorbell-tests --test nic_hw -- --ignored --test-threads=1
//! ```
//!
//! (one at a time: the tests set the process's NIC variables and use one port).
//!
//! * `loopback_rdma_write`: two RC QPs of one port connected to each other;
//!   the GPU posts RDMA writes with the project's WQE code
//!   (`mlx5_post_wqes`), polls their completions (`mlx5_poll_cq`), and the
//!   destination holds the source's bytes.
//! * `register_gpu_memory`: GPU memory registered for remote access, with
//!   keys, and `describe()` naming how.
//! * `ibgda_ring_through_the_nic`: the IBGDA transport set up by a
//!   communicator (`DOORBELL_NIC=mlx5`, the port of `DOORBELL_TEST_NIC`)
//!   between two ranks on GPU 0; the test kernels' ring runs put, get, a
//!   signal add (an RDMA atomic), waits and barriers from the GPU through
//!   the NIC, at sizes from 8 B to 8 MiB, by block and by warp, and every
//!   byte that arrived is checked, and none outside.
//! * `proxy_ring_through_the_nic`: the same ring over the CPU proxy: a
//!   host thread of each rank writes the WQEs into rings in mapped host
//!   memory and rings the port's UAR register through this process's
//!   mapping of it (not the GPU's), with a full fence after each sweep's
//!   doorbells (the register may be mapped write-combining).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use doorbell::comm::{CommOptions, Communicator};
use doorbell::kernels::mlx5::cq::{decode_poll_result, POLL_RESULT_WORDS};
use doorbell::kernels::mlx5::wqe::FLAG_SIGNALED;
use doorbell::kernels::mlx5::{QpHandle, WqeOp, WqeRequest};
use doorbell::nic::mlx5::{gpu_pci_bus_id, Mlx5Nic};
use doorbell::nic::{access, CqRing, MemoryRegion, Nic, NicKind, QpOptions, QpRings, QueuePair, NIC_ENV};
use doorbell::{Backend, Device, DeviceBuffer, LaunchConfig};
use doorbell_test_kernels::mlx5::{mlx5_poll_cq, mlx5_post_wqes};
use doorbell_tests::ring::{ring_once, RingTransport};
use doorbell_tests::TEST_KERNELS;
use rdma_sys_ext::hca::HcaFilter;
use rdma_sys_ext::topo::Topology;
use rdma_sys_ext::Verbs;

const ENV: &str = "DOORBELL_TEST_NIC";

/// The port under test (`DOORBELL_TEST_NIC`), or a panic saying to set it.
fn spec() -> String {
    std::env::var(ENV).ok().filter(|s| !s.trim().is_empty()).unwrap_or_else(|| {
        panic!("{ENV} is not set: name the ConnectX port to test, e.g. {ENV}=mlx5_0 (or mlx5_0:1); see scripts/run-nic-tests.sh")
    })
}

/// The NIC under test and a GPU, or a panic saying what is missing.
fn open() -> (Device, Mlx5Nic) {
    let spec = spec();
    let dev = Device::gpu(0).expect("these tests need a GPU");
    let verbs = Arc::new(Verbs::load().expect("rdma-core (libibverbs, libmlx5)"));
    let filter = HcaFilter::parse(&format!("={spec}")).expect("a device[:port] in DOORBELL_TEST_NIC");
    let bus = gpu_pci_bus_id(&dev).expect("cuDeviceGetPCIBusId").expect("a GPU");
    let topo = Topology::read(Path::new("/")).expect("sysfs");
    let choice = topo.nearest(&bus, Some(&filter)).expect("the named port, ACTIVE");
    let mut nic = Mlx5Nic::open(&verbs, &choice, &dev).expect("open the port with DevX");
    nic.start_doorbells().expect("doorbells");
    eprintln!("{}", nic.describe());
    (dev, nic)
}

/// Device memory for one QP and its CQ, and the handle kernels use.
struct Rings {
    sq: DeviceBuffer<u64>,
    cq: DeviceBuffer<u64>,
    dbrs: DeviceBuffer<u32>,
    counters: DeviceBuffer<u32>,
}

const SQ_WQEBBS: u32 = 64;
const CQ_ENTRIES: u32 = 64;

impl Rings {
    fn new(dev: &Device) -> Rings {
        // Invalid CQEs: op_own = MLX5_CQE_INVALID << 4, owner 0 (the last byte of each 64).
        let mut cq = vec![0u64; CQ_ENTRIES as usize * 8];
        for e in cq.chunks_mut(8) {
            e[7] = 0xf0u64 << 56;
        }
        Rings {
            sq: dev.alloc_zeroed(SQ_WQEBBS as usize * 8).unwrap(),
            cq: dev.alloc_from(&cq).unwrap(),
            // [0] RQ dbr, [1] SQ dbr, [2] CQ set_ci, [3] CQ arm.
            dbrs: dev.alloc_zeroed(16).unwrap(),
            // producer, ready, consumer
            counters: dev.alloc_zeroed(4).unwrap(),
        }
    }

    fn qp_rings(&mut self) -> QpRings {
        QpRings {
            sq: self.sq.as_mut_ptr().cast(),
            sq_wqebbs: SQ_WQEBBS,
            rq: std::ptr::null_mut(),
            rq_wqes: 0,
            rq_max_sge: 1,
            dbrec: self.dbrs.as_mut_ptr(),
            uar: std::ptr::null_mut(),
        }
    }

    fn cq_ring(&mut self) -> CqRing {
        CqRing {
            buf: self.cq.as_mut_ptr().cast(),
            entries: CQ_ENTRIES,
            // SAFETY: in bounds of the 16 words.
            dbrec: unsafe { self.dbrs.as_mut_ptr().add(2) },
        }
    }

    fn handle(&mut self, qp: &dyn QueuePair) -> QpHandle {
        let c = self.counters.as_mut_ptr();
        let d = self.dbrs.as_mut_ptr();
        // SAFETY: all in bounds of their buffers.
        unsafe {
            QpHandle {
                sq: self.sq.as_mut_ptr().cast(),
                sq_producer: c,
                sq_ready: c.add(1),
                sq_dbr: d.add(1),
                uar: qp.doorbell() as *mut u64,
                cq: self.cq.as_mut_ptr().cast(),
                cq_consumer: c.add(2),
                cq_dbr: d.add(2),
                sq_size: SQ_WQEBBS,
                qpn: qp.qpn(),
                cq_size: CQ_ENTRIES,
                flags: 0,
            }
        }
    }
}

#[test]
#[ignore = "needs a ConnectX NIC and a GPU: DOORBELL_TEST_NIC=<device> (scripts/run-nic-tests.sh)"]
fn loopback_rdma_write() {
    let (dev, mut nic) = open();
    let n_bytes = 1 << 20;
    let pieces = 8u32;
    let pattern: Vec<u8> = (0..n_bytes).map(|i| (i * 7 + 3) as u8).collect();
    let src = dev.alloc_from(&pattern).unwrap();
    let mut dst = dev.alloc_zeroed::<u8>(n_bytes).unwrap();
    let mut a = Rings::new(&dev);
    let mut b = Rings::new(&dev);
    // SAFETY: every buffer outlives the regions and queues (dropped first, below).
    let (src_mr, dst_mr, cq_a, cq_b) = unsafe {
        (
            nic.reg_mr(src.as_ptr() as u64, n_bytes, access::LOCAL_WRITE).unwrap(),
            nic.reg_mr(dst.as_mut_ptr() as u64, n_bytes, access::ALL).unwrap(),
            nic.create_cq(a.cq_ring()).unwrap(),
            nic.create_cq(b.cq_ring()).unwrap(),
        )
    };
    // SAFETY: as above.
    let (qp_a, qp_b) = unsafe {
        (
            nic.create_qp(&*cq_a, a.qp_rings()).unwrap(),
            nic.create_qp(&*cq_b, b.qp_rings()).unwrap(),
        )
    };
    let opts = QpOptions::default();
    qp_a.connect(&qp_b.endpoint(), access::ALL, &opts).unwrap();
    qp_b.connect(&qp_a.endpoint(), access::ALL, &opts).unwrap();

    let piece = n_bytes as u32 / pieces;
    let reqs: Vec<[u64; 9]> = (0..pieces)
        .map(|i| {
            WqeRequest {
                op: WqeOp::Write as u32,
                qpn: qp_a.qpn(),
                laddr: src.as_ptr() as u64 + u64::from(i * piece),
                lkey: src_mr.lkey(),
                raddr: dst.as_mut_ptr() as u64 + u64::from(i * piece),
                rkey: dst_mr.rkey(),
                len: piece,
                wqe_index: i as u16,
                flags: if i == pieces - 1 { FLAG_SIGNALED } else { 0 },
                ..WqeRequest::default()
            }
            .to_raw()
        })
        .collect();
    let module = dev.load_module(&TEST_KERNELS).unwrap();
    let post = module.function::<mlx5_post_wqes>().unwrap();
    let poll = module.function::<mlx5_poll_cq>().unwrap();
    let dreqs = dev.alloc_from(&reqs).unwrap();
    let mut status = dev.alloc_zeroed::<u32>(1).unwrap();
    let handle = a.handle(&*qp_a);
    let s = dev.new_stream().unwrap();
    // SAFETY: the handle's buffers live in `a`; `pieces` ≤ SQ size; one warp.
    unsafe {
        s.launch(
            &post,
            LaunchConfig::linear(1, 32),
            (
                handle,
                dreqs.as_ptr() as *const WqeRequest,
                pieces,
                5_000_000_000u64,
                status.as_mut_ptr(),
            ),
        )
        .unwrap()
    };
    s.synchronize().unwrap();
    assert_eq!(status.to_host().unwrap(), vec![1], "the post timed out");
    let targets = dev.alloc_from(&[pieces - 1]).unwrap();
    let mut out = dev.alloc_zeroed::<u32>(POLL_RESULT_WORDS).unwrap();
    // SAFETY: as above; one target, 8 words.
    unsafe {
        s.launch(
            &poll,
            LaunchConfig::linear(1, 32),
            (handle, targets.as_ptr(), 1u32, 5_000_000_000u64, out.as_mut_ptr()),
        )
        .unwrap()
    };
    s.synchronize().unwrap();
    let words = out.to_host().unwrap();
    let r = decode_poll_result(words[..POLL_RESULT_WORDS].try_into().unwrap()).expect("a poll result");
    let c = r.unwrap_or_else(|e| panic!("RDMA write failed: {e:?} ({})", nic.describe()));
    assert_eq!(c.wqe_counter, (pieces - 1) as u16);
    assert_eq!(c.qpn, qp_a.qpn());
    assert_eq!(dst.to_host().unwrap(), pattern, "the destination does not hold the source's bytes");

    qp_a.modify_to_err().unwrap();
    drop((qp_a, qp_b, cq_a, cq_b, src_mr, dst_mr));
    nic.stop().unwrap();
}

#[test]
#[ignore = "needs a ConnectX NIC and a GPU: DOORBELL_TEST_NIC=<device> (scripts/run-nic-tests.sh)"]
fn register_gpu_memory() {
    let (dev, nic) = open();
    let mut buf = dev.alloc_zeroed::<u8>(64 << 20).unwrap();
    // SAFETY: `buf` outlives the regions.
    let mrs: Vec<Box<dyn MemoryRegion>> = unsafe {
        vec![
            nic.reg_mr(buf.as_mut_ptr() as u64, 64 << 20, access::ALL).unwrap(),
            // An unaligned piece inside it.
            nic.reg_mr(buf.as_mut_ptr() as u64 + 4100, 10_000, access::REMOTE_READ).unwrap(),
        ]
    };
    assert_ne!(mrs[0].rkey(), mrs[1].rkey());
    let d = nic.describe();
    assert!(d.contains("dma-buf") || d.contains("nvidia_peermem"), "{d}");
    drop(mrs);
}

/// The test kernels' ring between two ranks on GPU 0 through the port of
/// `DOORBELL_TEST_NIC` (`DOORBELL_NIC=mlx5`), from 8 B to 8 MiB, by block
/// and by warp: `transport` makes each ring's handle (told the ring's
/// size), `after` checks each ring's aftermath; `what` names the run.
fn ring_through_the_port(
    what: &str,
    transport: impl Fn(&Communicator, usize) -> doorbell::Result<RingTransport> + Sync,
    after: impl Fn(&Communicator) -> doorbell::Result<()> + Sync,
) {
    let spec = spec();
    // Only this binary's tests run in this process, one at a time
    // (scripts/run-nic-tests.sh): no other thread reads the environment.
    std::env::set_var(NIC_ENV, "mlx5");
    std::env::set_var("DOORBELL_IB_HCA", format!("={spec}"));
    let opts = CommOptions {
        heap_bytes: 64 << 20,
        wait_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let cases = [(8, 0, false), (4093, 5, true), (1 << 20, 12, false), (8 << 20, 0, true)];
    Communicator::local(2, Backend::Gpu, opts, |comm| {
        for (bytes, offset, warp) in cases {
            ring_once(comm, bytes, offset, warp, 256, |c| transport(c, bytes))
                .inspect_err(|_| eprintln!("rank {}: the ring of {bytes} B at +{offset}, warp={warp} failed", comm.rank()))?;
            after(comm)?;
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("the ring {what} over {spec}: {e}"));
}

#[test]
#[ignore = "needs a ConnectX NIC and a GPU: DOORBELL_TEST_NIC=<device> (scripts/run-nic-tests.sh)"]
fn ibgda_ring_through_the_nic() {
    let transport = |c: &Communicator, bytes: usize| {
        let t = c.ibgda()?;
        let (kind, what) = c.ibgda_nic().expect("IBGDA is set up");
        assert_eq!(kind, NicKind::Mlx5, "rank {}: {what}", c.rank());
        if bytes == 8 {
            eprintln!("rank {}: {what}", c.rank());
        }
        Ok(RingTransport::Ibgda(t))
    };
    ring_through_the_port("by IBGDA", transport, |_| Ok(()));
}

#[test]
#[ignore = "needs a ConnectX NIC and a GPU: DOORBELL_TEST_NIC=<device> (scripts/run-nic-tests.sh)"]
fn proxy_ring_through_the_nic() {
    let after = |comm: &Communicator| {
        let st = comm.proxy_stats().expect("the proxy is set up");
        assert!(
            st.doorbells > 0 && st.cqes > 0,
            "rank {}: the proxy rang nothing: {st:?}",
            comm.rank()
        );
        Ok(())
    };
    ring_through_the_port("by the CPU proxy", |c, _| Ok(RingTransport::Proxy(c.proxy()?)), after);
}
