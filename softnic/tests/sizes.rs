//! Sizes the 16- and 32-bit fields of the mlx5 layouts cannot carry are
//! refused, and a memory region is never left registered with an engine
//! while the fabric thinks it gone.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use doorbell_kernels::mlx5::{CqeSyndrome, CtrlSeg, OPCODE_RDMA_WRITE, WQE_CTRL_CQ_UPDATE};
use doorbell_softnic::engine::tables::key_slot;
use doorbell_softnic::engine::{access, EngineConfig, MrEntry, Port, QpState, Reason};
use doorbell_softnic::host::{CqMemory, HostBuffer, QpMemory, ResidentPort, MAX_SQ_WQEBBS};
use doorbell_softnic::{Error, FabricConfig, MemoryRegion, QueuePair, RdmaDevice, SoftDevice, SoftFabric, SoftMr, SoftPd};

#[test]
fn a_message_of_2_31_bytes_fails_with_a_length_error_not_as_an_inline_flag() {
    let mut rig = Rig::new(virtual_cfg());
    let src = Region::new(&rig.a.dev, &rig.a.pd, 4096, 0);
    let dst = Region::new(&rig.b.dev, &rig.b.pd, 4096, access::LOCAL_WRITE | access::REMOTE_WRITE);
    // Two segments of 2^30 bytes: 2^31 in all, which no byte count (whose
    // bit 31 is the inline flag) and no message may reach.
    let ctrl = CtrlSeg {
        opcode: OPCODE_RDMA_WRITE,
        fm_ce_se: WQE_CTRL_CQ_UPDATE,
        ..CtrlSeg::default()
    };
    let half = 1u32 << 30;
    let (idx, head) = rig.a.sq.write_segments(
        ctrl,
        &[
            raddr_seg(dst.addr(), dst.key()),
            data_seg(src.addr(), src.key(), half),
            data_seg(src.addr(), src.key(), half),
        ],
        None,
    );
    rig.a.sq.ring(head);
    let e = expect_err(rig.next_send_cqe(Which::A));
    assert_eq!(e.wqe_counter, idx);
    assert_eq!(
        (e.syndrome, Reason::from_u8(e.vendor_err_synd)),
        (CqeSyndrome::LocalLength.as_u8(), Reason::Length),
        "a 2^31-byte message is a length error ({})",
        reason_of(e.vendor_err_synd)
    );
    src.check_canaries();
    dst.check_canaries();
    assert!(dst.bytes().iter().all(|&b| b == 0));
    assert_eq!(doorbell_softnic::engine::wqe::MAX_MESSAGE, (1 << 31) - 1);
}

#[test]
fn queues_the_16_bit_counters_cannot_tell_apart_are_refused() {
    let fabric = SoftFabric::new(virtual_cfg());
    let dev = fabric.open_device(None).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq_mem = CqMemory::new(64);
    // SAFETY: the memory outlives the CQ.
    let cq = unsafe { dev.create_cq(cq_mem.ring()).unwrap() };
    for (mem, what) in [
        (QpMemory::new(1 << 16, 0, 1), "an SQ of 2^16 basic blocks"),
        (QpMemory::new(1 << 17, 0, 1), "an SQ of 2^17 basic blocks"),
        (QpMemory::new(64, 1 << 16, 1), "an RQ of 2^16 receive WQEs"),
        (QpMemory::new(64, 16, 32), "receive WQEs of 32 scatter entries"),
    ] {
        // SAFETY: the memory outlives the call (and no QP is made).
        match unsafe { dev.create_qp(&pd, &cq, &cq, mem.rings()) } {
            Err(Error::BadRing { why, .. }) => assert!(why.contains("at most"), "{what}: {why}"),
            Err(e) => panic!("{what}: refused for another reason: {e}"),
            Ok(_) => panic!("{what} was accepted"),
        }
    }
    // The largest of each is accepted.
    let mem = QpMemory::new(MAX_SQ_WQEBBS, 1 << 15, 16);
    // SAFETY: the memory outlives the QP.
    let qp = unsafe { dev.create_qp(&pd, &cq, &cq, mem.rings()) }.expect("an SQ of 2^15 basic blocks");
    drop(qp);
}

#[test]
fn a_producer_overrunning_the_largest_send_queue_is_caught() {
    let fabric = SoftFabric::new(virtual_cfg());
    let (da, db) = (fabric.open_device(None).unwrap(), fabric.open_device(None).unwrap());
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (ma, mb) = (QpMemory::new(MAX_SQ_WQEBBS, 0, 1), QpMemory::new(64, 0, 1));
    let (ca, cb) = (CqMemory::new(64), CqMemory::new(64));
    // SAFETY: the memory outlives the objects.
    let (cqa, cqb) = unsafe { (da.create_cq(ca.ring()).unwrap(), db.create_cq(cb.ring()).unwrap()) };
    // SAFETY: as above.
    let (qa, qb) = unsafe {
        (
            da.create_qp(&pa, &cqa, &cqa, ma.rings()).unwrap(),
            db.create_qp(&pb, &cqb, &cqb, mb.rings()).unwrap(),
        )
    };
    qa.connect(qb.endpoint(), 0).unwrap();
    qb.connect(qa.endpoint(), 0).unwrap();
    // A whole ring and one more published: the engine must not start any
    // of it.
    let h = ma.handle(qa.qpn(), &ca);
    // SAFETY: the handle's doorbell words.
    unsafe {
        doorbell_kernels::mlx5::queue::update_doorbell_record(&h, MAX_SQ_WQEBBS + 1);
        doorbell_kernels::mlx5::queue::ring_doorbell(&h, 1);
    }
    for _ in 0..4 {
        da.poll_once();
    }
    assert_eq!(qa.state(), QpState::Err);
    assert!(
        da.error_log().iter().any(|r| r.reason == Reason::SqOverrun as u8),
        "{:?}",
        da.error_log()
    );
    assert_eq!(da.stats().executed, 0, "nothing of an overrun ring may execute");
}

/// A resident engine's tables kept in host memory, whose writes of an
/// invalid (deregistered) region fail while `refuse` is set.
struct FlakyEngine {
    port: Mutex<Box<Port>>,
    refuse: AtomicBool,
    refused: AtomicUsize,
}

// SAFETY: the port image's pointers are never dereferenced here.
unsafe impl Send for FlakyEngine {}
// SAFETY: as above; the image is behind a mutex.
unsafe impl Sync for FlakyEngine {}

impl ResidentPort for FlakyEngine {
    fn read_port(&self, into: &mut Port) -> doorbell_softnic::Result<()> {
        *into = (**self.port.lock().unwrap()).clone();
        Ok(())
    }
    fn write_mr(&self, slot: usize, mr: &MrEntry) -> doorbell_softnic::Result<()> {
        if mr.valid == 0 && self.refuse.load(Ordering::Acquire) {
            self.refused.fetch_add(1, Ordering::AcqRel);
            return Err(Error::ResidentWrite {
                lid: 1,
                what: "memory region",
                why: "the device is unreachable (injected)".to_string(),
            });
        }
        self.port.lock().unwrap().mrs[slot] = *mr;
        Ok(())
    }
    fn write_config(&self, _cfg: &EngineConfig) -> doorbell_softnic::Result<()> {
        Ok(())
    }
}

fn flaky(dev: &doorbell_softnic::SoftDevice) -> Arc<FlakyEngine> {
    let e = Arc::new(FlakyEngine {
        port: Mutex::new(dev.port_image()),
        refuse: AtomicBool::new(false),
        refused: AtomicUsize::new(0),
    });
    dev.set_resident(Some(e.clone()));
    e
}

fn entry(e: &FlakyEngine, slot: usize) -> MrEntry {
    e.port.lock().unwrap().mrs[slot]
}

/// A device whose resident engine is a [`FlakyEngine`], its protection
/// domain, and a 4 KiB region registered with `access` on a buffer that is
/// returned with it (drop the buffer last).
fn flaky_region(access: u32) -> (SoftDevice, SoftPd, Arc<FlakyEngine>, HostBuffer, SoftMr) {
    let fabric = SoftFabric::new(FabricConfig::default());
    let dev = fabric.open_device(None).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let engine = flaky(&dev);
    let buf = HostBuffer::zeroed(4096, 64);
    // SAFETY: the caller keeps the buffer until the region is gone.
    let mr = unsafe { dev.reg_mr(&pd, buf.as_ptr(), 4096, access) }.unwrap();
    (dev, pd, engine, buf, mr)
}

#[test]
fn a_dropped_region_the_engine_could_not_be_told_of_stays_registered_and_is_reported() {
    // The buffer stays allocated while the engine may still accept the key
    // (checked below).
    let (dev, pd, engine, buf, mr) = flaky_region(access::LOCAL_WRITE);
    let (key, slot) = (mr.lkey(), key_slot(mr.lkey()).unwrap());
    assert_eq!(entry(&engine, slot).key, key);
    engine.refuse.store(true, Ordering::Release);
    drop(mr);
    assert_eq!(engine.refused.load(Ordering::Acquire), 1);
    // The engine still accepts the key: the fabric says so, keeps the slot
    // (so no new region takes it) and lists the region.
    assert_eq!(entry(&engine, slot).valid, 1, "the engine's entry");
    let ours = dev.port_image().mrs[slot];
    assert_eq!(
        (ours.valid, ours.key),
        (1, key),
        "the fabric dropped a region the engine still honours"
    );
    assert_eq!(dev.undead_regions(), vec![key]);
    let other = HostBuffer::zeroed(64, 64);
    // SAFETY: as above.
    let mr2 = unsafe { dev.reg_mr(&pd, other.as_ptr(), 64, 0) }.unwrap();
    assert_ne!(key_slot(mr2.lkey()), Some(slot), "a new region took the slot of a live one");
    // Still unreachable: the retry says so and keeps it.
    assert!(matches!(dev.retry_deregistrations(), Err(Error::ResidentWrite { .. })));
    assert_eq!(dev.undead_regions(), vec![key]);
    // Reachable again: the retry ends it everywhere.
    engine.refuse.store(false, Ordering::Release);
    dev.retry_deregistrations().unwrap();
    assert!(dev.undead_regions().is_empty());
    assert_eq!(entry(&engine, slot), MrEntry::EMPTY);
    assert_eq!(dev.port_image().mrs[slot], MrEntry::EMPTY);
    drop(mr2);
    drop(buf);
}

#[test]
fn deregister_reports_a_failure_and_gives_the_region_back() {
    let (dev, _pd, engine, buf, mr) = flaky_region(0);
    let (key, slot) = (mr.lkey(), key_slot(mr.lkey()).unwrap());
    engine.refuse.store(true, Ordering::Release);
    let e = mr.deregister().expect_err("the engine refused");
    match e.error() {
        Error::Deregistration { key: k, len, .. } => assert_eq!((*k, *len), (key, 4096)),
        other => panic!("another error: {other}"),
    }
    assert!(e.to_string().contains("keep its memory allocated"), "{e}");
    // Nothing changed anywhere.
    assert_eq!(entry(&engine, slot).valid, 1);
    assert_eq!(dev.port_image().mrs[slot].valid, 1);
    assert!(dev.undead_regions().is_empty(), "the caller was told; nothing is undead");
    let mr = e.into_region();
    engine.refuse.store(false, Ordering::Release);
    mr.deregister().unwrap();
    assert_eq!(entry(&engine, slot), MrEntry::EMPTY);
    assert_eq!(dev.port_image().mrs[slot], MrEntry::EMPTY);
    drop(buf);
}

#[test]
fn taking_the_port_back_from_a_stopped_engine_ends_undead_regions() {
    let (dev, _pd, engine, buf, mr) = flaky_region(0);
    let slot = key_slot(mr.lkey()).unwrap();
    engine.refuse.store(true, Ordering::Release);
    drop(mr);
    assert_eq!(dev.undead_regions().len(), 1);
    // The engine stopped; the fabric's own engine must not honour the key.
    dev.set_resident(None);
    assert!(dev.undead_regions().is_empty());
    assert_eq!(dev.port_image().mrs[slot], MrEntry::EMPTY);
    drop(buf);
}
