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

/// The soft NIC of the one rank of `world` on `dev`.
fn open_alone(dev: &Device, world: &World, options: SoftOptions) -> SoftNic {
    open(SoftOpen {
        rank: 0,
        device: dev,
        world,
        options,
        cross_process: None,
        same_gpu: true,
    })
    .expect("open")
}

/// The kernels' QP table (one `IbgdaQp`) the transport would build for
/// `qp` over these rings, in device memory.
fn kernel_table(dev: &Device, qp: &dyn QueuePair, uar: u64, cq_ring: CqRing, qp_rings: QpRings) -> DeviceBuffer<u64> {
    let entry = IbgdaQp {
        qp: QpHandle {
            sq: qp_rings.sq as *mut u32,
            sq_producer: std::ptr::null_mut(),
            sq_ready: std::ptr::null_mut(),
            sq_dbr: qp_rings.dbrec.wrapping_add(1),
            uar: uar as *mut u64,
            cq: cq_ring.buf as *mut u32,
            cq_consumer: std::ptr::null_mut(),
            cq_dbr: cq_ring.dbrec,
            sq_size: ENTRIES,
            qpn: qp.qpn(),
            cq_size: ENTRIES,
            flags: 0,
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
    dev.alloc_from(&entry).expect("table")
}

/// Payload bytes of the writes of [`bursts_run`]: short ones a burst takes
/// (up to 64), one it leaves to the one-WQE path (65), unaligned ones.
const WRITE_LENS: [usize; 20] = [8, 8, 16, 3, 64, 8, 24, 1, 8, 8, 65, 8, 16, 40, 8, 8, 7, 8, 32, 8];
/// Where [`bursts_run`]'s payloads start in its region, and its targets.
const SRC_AT: usize = 64;
const DST_AT: usize = 2048;
/// Bytes between two targets (a canary gap around each).
const DST_STRIDE: usize = 80;

/// What a run of [`WRITE_LENS`] writes through a kernel engine left.
struct BurstRun {
    region: Vec<u8>,
    payload: Vec<u8>,
    stats: doorbell_softnic::engine::PortStats,
    bursts: u64,
    burst_wqes: u64,
    lone_wqes: u64,
    errors: Vec<doorbell_softnic::engine::ErrorRecord>,
}

/// On the emulator's engine kernel with bursts of at most `burst` WQEs:
/// posts the RDMA WRITEs of [`WRITE_LENS`] (payload `seed`-dependent, the
/// last one signaled) on a loopback QP with one doorbell, WQE `bad` with a
/// wrong remote key, and waits until each WQE has completed or been
/// flushed.
fn bursts_run(burst: u32, bad: Option<usize>, seed: u64) -> BurstRun {
    writes_run(burst, bad, seed, false)
}

/// [`bursts_run`], or with `one_by_one` a doorbell per WQE, each rung
/// once the one before completed (lone requests).
fn writes_run(burst: u32, bad: Option<usize>, seed: u64, one_by_one: bool) -> BurstRun {
    let world = World::single();
    let dev = Device::emulator(0);
    let options = SoftOptions {
        engine: Some(SoftNicEngine::Kernel),
        burst: Some(burst),
        ..SoftOptions::default()
    };
    let mut nic = open_alone(&dev, &world, options);
    let buf = dev.alloc_zeroed::<u8>(4096).expect("region");
    // SAFETY: `buf` outlives the region (dropped after it below).
    let mr = unsafe { nic.reg_mr(buf.as_raw(), 4096, access::ALL) }.expect("register");
    let (mem, cq_ring, qp_rings) = rings(&dev);
    // SAFETY: `mem` outlives the CQ and the QP (dropped after them).
    let cq = unsafe { nic.create_cq(cq_ring) }.expect("cq");
    // SAFETY: as above.
    let qp = unsafe { nic.create_qp(&*cq, qp_rings) }.expect("qp");
    qp.connect(&qp.endpoint(), access::REMOTE_WRITE, &QpOptions::default())
        .expect("loopback");
    let table = kernel_table(&dev, &*qp, qp.doorbell(), cq_ring, qp_rings);
    nic.start(&StartCtx {
        rank: 0,
        size: 1,
        device: &dev,
        world: &world,
        kernel_qps: &table,
        nqps: 1,
        heap_base: None,
        ranks_per_gpu: 1,
    })
    .expect("start");

    let mut state = seed | 1;
    let mut payload = vec![0u8; WRITE_LENS.iter().sum()];
    for b in payload.iter_mut() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *b = state as u8;
    }
    let base = buf.as_raw();
    // SAFETY (this block): the emulator's device memory is this process's;
    // the engine reads the ring and the region only after the doorbell.
    let uar = unsafe {
        let region = base as *mut u8;
        std::ptr::copy_nonoverlapping(payload.as_ptr(), region.add(SRC_AT), payload.len());
        std::ptr::write_bytes(region.add(DST_AT), 0xa5, 4096 - DST_AT);
        let mut uar = 0;
        let mut off = 0;
        for (i, &len) in WRITE_LENS.iter().enumerate() {
            let rkey = if bad == Some(i) { mr.rkey() ^ 0x8000 } else { mr.rkey() };
            let t = doorbell_kernels::mlx5::wqe::Transfer {
                raddr: base + (DST_AT + i * DST_STRIDE + 8) as u64,
                rkey,
                laddr: base + (SRC_AT + off) as u64,
                lkey: mr.lkey(),
                len: len as u32,
            };
            let last = i + 1 == WRITE_LENS.len();
            let flags = if last || one_by_one {
                doorbell_kernels::mlx5::wqe::FLAG_SIGNALED
            } else {
                0
            };
            let slot = (qp_rings.sq as *mut u32).add(i * 16);
            uar = doorbell_kernels::mlx5::wqe::write_rdma_write_wqe(slot, i as u16, qp.qpn(), &t, flags);
            off += len;
            if one_by_one {
                ring(qp_rings, i as u32 + 1, uar);
                let t0 = std::time::Instant::now();
                while nic.device().stats().wqes + nic.device().stats().errors < i as u64 + 1 {
                    assert!(t0.elapsed().as_secs() < 60, "WQE {i} never completed");
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            }
        }
        if !one_by_one {
            ring(qp_rings, WRITE_LENS.len() as u32, uar);
        }
        uar
    };
    assert_ne!(uar, 0);
    let t0 = std::time::Instant::now();
    let stats = loop {
        let s = nic.device().stats();
        if s.wqes + s.errors + s.flushes >= WRITE_LENS.len() as u64 {
            break s;
        }
        assert!(t0.elapsed().as_secs() < 60, "the engine finished {s:?}");
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    let report = nic.engine_report().expect("running");
    let errors = nic.device().error_log();
    assert_eq!(nic.stop(), Ok(()));
    let region = buf.to_host().expect("region");
    drop(qp);
    drop(cq);
    drop(mem);
    drop(mr);
    BurstRun {
        region,
        payload,
        stats,
        bursts: report.counters.bursts,
        burst_wqes: report.counters.burst_wqes,
        lone_wqes: report.counters.lone_wqes,
        errors,
    }
}

/// Publishes WQEs up to `pi` and rings the doorbell with the last one's
/// ctrl head, as a producer does.
///
/// # Safety
/// `rings`' doorbell record and UAR word are valid.
unsafe fn ring(rings: QpRings, pi: u32, uar: u64) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    // SAFETY: the caller's contract.
    unsafe { std::ptr::write_volatile(rings.dbrec.add(1), pi.to_be()) };
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { std::ptr::write_volatile(rings.uar, uar) };
}

/// Checks that the writes before `done` landed byte for byte and nothing
/// else in the targets' area changed.
fn check_targets(r: &BurstRun, done: usize) {
    let mut off = 0;
    let mut expect = vec![0xa5u8; 4096 - DST_AT];
    for (i, &len) in WRITE_LENS.iter().enumerate() {
        if i < done {
            let at = i * DST_STRIDE + 8;
            expect[at..at + len].copy_from_slice(&r.payload[off..off + len]);
        }
        off += len;
    }
    for (k, (&got, &want)) in r.region[DST_AT..].iter().zip(&expect).enumerate() {
        assert_eq!(
            got,
            want,
            "target area byte {k} (WQE {}): {done} WQEs should have landed",
            k / DST_STRIDE
        );
    }
}

#[test]
fn bursts_execute_runs_of_short_writes_in_order_and_leave_the_rest_to_the_one_wqe_path() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64);
    let n = WRITE_LENS.len();
    let long = WRITE_LENS.iter().position(|&l| l > 64).expect("a long write");
    // Every write lands; the bursts took the short ones (the long one and
    // whatever a burst had not reached took the one-WQE path).
    let on = bursts_run(32, None, seed);
    check_targets(&on, n);
    assert_eq!((on.stats.wqes, on.stats.errors, on.stats.cqes), (n as u64, 0, 1), "{:?}", on.stats);
    // Two bursts, around the long one (the one-WQE path's).
    assert_eq!((on.bursts, on.burst_wqes), (2, n as u64 - 1), "WQE {long} is 65 bytes");
    // Bursts off: the same bytes, no burst.
    let off = bursts_run(0, None, seed);
    check_targets(&off, n);
    assert_eq!(off.region, on.region);
    assert_eq!((off.bursts, off.burst_wqes, off.stats.wqes), (0, 0, n as u64));
    // A bad remote key in the middle of a burst: the writes before it
    // land, it fails with its error CQE and log entry, the rest flush.
    for burst in [32, 0] {
        let bad = 5;
        let r = bursts_run(burst, Some(bad), seed);
        check_targets(&r, bad);
        assert_eq!(
            (r.stats.wqes, r.stats.errors, r.stats.flushes),
            (bad as u64, 1, (n - bad - 1) as u64),
            "bursts of {burst}: {:?}",
            r.stats
        );
        let e = r.errors.first().expect("an error record");
        assert_eq!(
            (e.wqe_counter as usize, e.reason),
            (bad, doorbell_softnic::engine::Reason::BadKey as u8),
            "{e:?}"
        );
        assert_eq!(r.burst_wqes, if burst == 0 { 0 } else { bad as u64 });
    }
    // A doorbell per WQE: lone requests, served without a pass when bursts
    // are on; with bursts off every WQE takes the one-WQE path (the lone
    // path had not checked the setting).
    // Whether a doorbell finds the engine idle is timing: on a loaded
    // machine the engine thread may be descheduled until its record
    // re-read takes every doorbell, so a few runs get their chance.
    let mut lone = writes_run(32, None, seed, true);
    for _ in 1..5 {
        check_targets(&lone, n);
        if lone.lone_wqes > 0 {
            break;
        }
        lone = writes_run(32, None, seed, true);
    }
    check_targets(&lone, n);
    assert!(lone.lone_wqes > 0, "no lone request with bursts on in 5 runs: {:?}", lone.stats);
    let off = writes_run(0, None, seed, true);
    check_targets(&off, n);
    assert_eq!((off.lone_wqes, off.burst_wqes, off.stats.wqes), (0, 0, n as u64));
}

#[test]
fn start_checks_the_kernels_table_against_the_engines_then_runs_and_stops() {
    let world = World::single();
    let dev = Device::emulator(0);
    let mut nic = open_alone(&dev, &world, opts(Some(SoftNicEngine::Thread)));
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
        heap_base: None,
        ranks_per_gpu: 1,
    };
    let e = nic.start(&ctx(&zeros)).expect_err("an unknown QP").to_string();
    assert!(e.contains("not in the soft NIC engine's port table"), "{e}");
    assert!(nic.engine_report().is_none());
    // The table the transport builds from the same rings: accepted.
    let table = kernel_table(&dev, &*qp, qp.doorbell(), cq_ring, qp_rings);
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

#[test]
fn engine_blocks_that_would_leave_the_ranks_no_sm_are_refused() {
    use super::engine::check_engine_sms;
    // 8 ranks of 16 blocks on a GPU of 132 SMs: 128 held, 4 left.
    assert!(check_engine_sms(16, 8, 132).is_ok());
    assert!(check_engine_sms(1, 1, 2).is_ok());
    // 5 ranks of 32 blocks: 160 of 132.
    let e = check_engine_sms(32, 5, 132).unwrap_err();
    assert!(
        e.contains("160 of the GPU's 132 SMs") && e.contains("at most 26 engine blocks"),
        "{e}"
    );
    // Every SM held: none left for the ranks' kernels.
    let e = check_engine_sms(33, 4, 132).unwrap_err();
    assert!(e.contains("at most 32 engine blocks"), "{e}");
    // Not even one block per rank fits.
    let e = check_engine_sms(1, 8, 8).unwrap_err();
    assert!(e.contains("not even one block per rank fits"), "{e}");
    assert!(check_engine_sms(1, 1, 1).is_err());
    // No rank count known: one rank.
    assert!(check_engine_sms(8, 0, 132).is_ok());
}
