//! The soft NIC through the NIC traits only, on the emulator.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use doorbell_kernels::mlx5::QpHandle;
use doorbell_kernels::transport::ibgda::IbgdaQp;
use doorbell_softnic::engine::QpState;

use super::*;
use crate::memory::DeviceBuffer;
use crate::nic::access;

const ENTRIES: u32 = 32;

fn opts(engine: Option<SoftNicEngine>) -> SoftOptions {
    SoftOptions {
        engine,
        ..SoftOptions::default()
    }
}

/// Rings of one QP and its CQ: SQ, CQ, then the QP's doorbell record pair
/// (+0), the CQ's (+8) and the UAR word (+16).
fn rings(dev: &Device) -> (DeviceBuffer<u8>, CqRing, QpRings) {
    let sq_bytes = ENTRIES as usize * 64;
    let mem = dev.alloc_zeroed::<u8>(2 * sq_bytes + 64).expect("ring memory");
    let base = mem.as_raw();
    let cq = CqRing {
        buf: (base + sq_bytes as u64) as *mut u8,
        entries: ENTRIES,
        dbrec: (base + 2 * sq_bytes as u64 + 8) as *mut u32,
    };
    let qp = QpRings {
        sq: base as *mut u8,
        sq_wqebbs: ENTRIES,
        rq: std::ptr::null_mut(),
        rq_wqes: 0,
        rq_max_sge: 1,
        dbrec: (base + 2 * sq_bytes as u64) as *mut u32,
        uar: (base + 2 * sq_bytes as u64 + 16) as *mut u64,
    };
    (mem, cq, qp)
}

/// A CQ of some other NIC.
struct Foreign;

impl CompletionQueue for Foreign {
    fn cqn(&self) -> u32 {
        7
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn two_ranks_connect_through_the_traits_and_bad_input_is_refused() {
    let results = World::run_threads(2, |world| -> Result<()> {
        let rank = world.rank();
        let dev = Device::emulator(0);
        let mut nic = open(SoftOpen {
            rank,
            device: &dev,
            world: &world,
            options: opts(None),
            cross_process: None,
            same_gpu: true,
        })?;
        assert_eq!(nic.kind(), NicKind::Soft);
        assert_eq!(nic.engine_kind(), SoftNicEngine::Thread, "the emulator's default in one process");
        let port = nic.port().clone();
        assert_eq!(port.lid as usize, nic.device().port_index() + 1);
        assert_eq!(port.name, format!("soft:{}", nic.device().port_index()));
        assert!(nic.describe().contains(&format!("LID {}", port.lid)), "{}", nic.describe());

        let buf = dev.alloc_zeroed::<u8>(4096)?;
        // SAFETY: `buf` outlives the region (dropped first below).
        let mr = unsafe { nic.reg_mr(buf.as_raw(), 4096, access::ALL) }?;
        assert_ne!(mr.lkey(), 0);
        // SAFETY: refused before anything is registered.
        let bad = unsafe { nic.reg_mr(buf.as_raw(), 4096, 0x100) }
            .err()
            .expect("unknown access bits")
            .to_string();
        assert!(bad.contains("unknown bits"), "{bad}");

        let (mem, cq_ring, qp_rings) = rings(&dev);
        // SAFETY: `mem` outlives the CQ and the QP (dropped after them).
        let cq = unsafe { nic.create_cq(cq_ring) }?;
        // SAFETY: as above.
        let qp = unsafe { nic.create_qp(&*cq, qp_rings) }?;
        // SAFETY: refused before the rings are used.
        let foreign = unsafe { nic.create_qp(&Foreign, qp_rings) }
            .err()
            .expect("a CQ of another NIC")
            .to_string();
        assert!(foreign.contains("another NIC"), "{foreign}");
        assert_eq!(qp.doorbell(), qp_rings.uar as u64, "the GPU rings the caller's UAR word");

        let ep = qp.endpoint();
        assert_eq!((ep.lid, ep.qpn), (port.lid, qp.qpn()));
        assert_eq!(Endpoint::from_bytes(&ep.to_bytes()), Some(ep));
        let all = world.all_gather_bytes(&ep.to_bytes())?;
        let peer = Endpoint::from_bytes(&all[1 - rank]).expect("an endpoint");
        let bad_mtu = QpOptions {
            mtu: Some(300),
            ..QpOptions::default()
        };
        let e = qp.connect(&peer, access::REMOTE_WRITE, &bad_mtu).expect_err("MTU 300").to_string();
        assert!(e.contains("MTU 300"), "{e}");
        qp.connect(&peer, access::REMOTE_WRITE | access::REMOTE_READ, &QpOptions::default())?;
        let image = nic.device().port_image();
        let entry = image
            .qps
            .iter()
            .find(|q| q.in_use() && q.qpn == qp.qpn())
            .expect("in the port table");
        assert_eq!(entry.state(), QpState::Rts);
        assert_eq!(entry.peer_port as usize + 1, peer.lid as usize, "connected to the peer's port");
        assert_eq!(entry.peer_qp, peer.slot, "at the slot the peer published");

        // Nothing started: stopping is a no-op, and there is no report.
        assert_eq!(nic.stop(), Ok(()));
        assert!(nic.engine_report().is_none() && nic.progress().is_none());
        world.barrier()?;
        drop(qp);
        drop(cq);
        drop(mem);
        drop(mr);
        Ok(())
    });
    for r in results {
        r.expect("rank");
    }
}

#[test]
fn start_checks_the_kernels_table_against_the_engines_then_runs_and_stops() {
    let world = World::single();
    let dev = Device::emulator(0);
    let mut nic = open(SoftOpen {
        rank: 0,
        device: &dev,
        world: &world,
        options: opts(Some(SoftNicEngine::Thread)),
        cross_process: None,
        same_gpu: true,
    })
    .expect("open");
    let (_mem, cq_ring, qp_rings) = rings(&dev);
    // SAFETY: `_mem` outlives the objects (declared before them).
    let cq = unsafe { nic.create_cq(cq_ring) }.expect("cq");
    // SAFETY: as above.
    let qp = unsafe { nic.create_qp(&*cq, qp_rings) }.expect("qp");
    qp.connect(&qp.endpoint(), access::REMOTE_WRITE, &QpOptions::default())
        .expect("loopback");
    // A kernels' table naming no QP of this port: refused, nothing runs.
    let zeros = dev.alloc_zeroed::<u64>(16).expect("table");
    let ctx = |t| StartCtx {
        rank: 0,
        size: 1,
        device: &dev,
        world: &world,
        kernel_qps: t,
        nqps: 1,
    };
    let e = nic.start(&ctx(&zeros)).expect_err("an unknown QP").to_string();
    assert!(e.contains("not in the soft NIC engine's port table"), "{e}");
    assert!(nic.engine_report().is_none());
    // The table the transport builds from the same rings: accepted.
    let entry = IbgdaQp {
        qp: QpHandle {
            sq: qp_rings.sq as *mut u32,
            sq_producer: std::ptr::null_mut(),
            sq_ready: std::ptr::null_mut(),
            sq_dbr: qp_rings.dbrec.wrapping_add(1),
            uar: qp.doorbell() as *mut u64,
            cq: cq_ring.buf as *mut u32,
            cq_consumer: std::ptr::null_mut(),
            cq_dbr: cq_ring.dbrec,
            sq_size: ENTRIES,
            qpn: qp.qpn(),
            cq_size: ENTRIES,
            reserved: 0,
        },
        state: std::ptr::null_mut(),
        scratch: std::ptr::null_mut(),
        scratch_lkey: 0,
        peer: 0,
        remote_base: 0,
        rkey: 0,
        _pad: 0,
        _reserved: 0,
    };
    // SAFETY: IbgdaQp is 128 bytes of plain data, 8-byte aligned.
    let entry: [u64; 16] = unsafe { std::mem::transmute(entry) };
    let table = dev.alloc_from(&entry).expect("table");
    nic.start(&ctx(&table)).expect("start");
    let report = nic.engine_report().expect("running");
    assert_eq!((report.engine, report.threads), (SoftNicEngine::Thread, 1));
    assert_eq!(nic.progress().expect("running").port, nic.device().port_index() as u32);
    let again = nic.start(&ctx(&table)).expect_err("already running").to_string();
    assert!(again.contains("already running"), "{again}");
    assert_eq!(nic.stop(), Ok(()));
    assert!(nic.engine_report().is_none());
    drop(qp);
    drop(cq);
}

#[test]
fn engines_that_cannot_run_here_and_bad_settings_are_refused_before_any_collective() {
    let world = World::single();
    let dev = Device::emulator(0);
    let cross = |in_use: bool| CrossProcess {
        heap_base: 0x10000,
        heap_len: 4096,
        tables_offset: 4096,
        mapped: vec![None],
        tail_in_use: Arc::new(AtomicBool::new(in_use)),
    };
    let try_open = |options: SoftOptions, cross_process: Option<CrossProcess>| {
        open(SoftOpen {
            rank: 0,
            device: &dev,
            world: &world,
            options,
            cross_process,
            same_gpu: true,
        })
        .map(|_| ())
        .expect_err("refused")
        .to_string()
    };
    let e = try_open(opts(Some(SoftNicEngine::Thread)), Some(cross(false)));
    assert!(e.contains("DOORBELL_SOFTNIC_ENGINE=kernel") && e.contains("other processes"), "{e}");
    let e = try_open(opts(Some(SoftNicEngine::Kernel)), Some(cross(true)));
    assert!(e.contains("did not stop"), "{e}");
    let threads = SoftOptions {
        engine_threads: Some(48),
        ..SoftOptions::default()
    };
    let e = try_open(threads, None);
    assert!(e.contains("multiple of 32"), "{e}");
    assert_eq!(SoftOptions::default().check(), Ok(()));
    assert!(SoftOptions {
        engine_threads: Some(2048),
        ..SoftOptions::default()
    }
    .check()
    .is_err());
}
