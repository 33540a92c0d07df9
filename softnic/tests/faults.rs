//! Fault injection: each fault ends in a correct result or a typed error
//! CQE — never a hang (every wait below is bounded) and never a write
//! outside registered regions (canaries checked).

mod common;

use common::*;
use doorbell_kernels::mlx5::cq::poll_cq;
use doorbell_kernels::mlx5::{CqeSyndrome, WqeOp};
use doorbell_softnic::engine::{access, EngineConfig, FaultConfig, QpState, Reason};
use doorbell_softnic::{FabricConfig, QueuePair, RdmaDevice, SoftFabric};

fn cfg(faults: FaultConfig) -> FabricConfig {
    FabricConfig {
        engine: EngineConfig {
            faults,
            ..EngineConfig::default()
        },
        virtual_time: true,
        device_rings: false,
    }
}

/// Posts a signaled write of `len` distinct bytes and returns (CQE, CQE time).
fn one_write(rig: &mut Rig, src: &Region, dst: &Region, len: usize, seed: u64) -> (doorbell_softnic::host::Cqe, u64) {
    let data = random_bytes(&mut rng(seed), len);
    src.fill(&data);
    rig.a.sq.post(&write_req(src, dst, 0, len as u32, true));
    let c = rig.next_send_cqe(Which::A);
    let t = rig.fabric.now_ns();
    if matches!(c, doorbell_softnic::host::Cqe::Ok(_)) {
        assert_eq!(&dst.bytes()[..len], &data[..]);
    }
    (c, t)
}

/// A rig with `faults` and [`regions`] on it.
fn rig_with(faults: FaultConfig) -> (Rig, Region, Region) {
    let rig = Rig::new(cfg(faults));
    let (src, dst) = regions(&rig);
    (rig, src, dst)
}

fn regions(rig: &Rig) -> (Region, Region) {
    (
        Region::new(&rig.a.dev, &rig.a.pd, 4096, 0),
        Region::new(&rig.b.dev, &rig.b.pd, 4096, access::LOCAL_WRITE | access::REMOTE_WRITE),
    )
}

#[test]
fn delayed_doorbells_are_acted_on_after_the_delay() {
    let (mut rig, src, dst) = rig_with(FaultConfig {
        doorbell_delay_ns: 30_000,
        ..FaultConfig::default()
    });
    rig.fabric.poll_all(); // the read of the doorbell record at RTS
    for k in 0..5u64 {
        let t0 = rig.fabric.now_ns();
        let (c, t) = one_write(&mut rig, &src, &dst, 100 + k as usize, k);
        let c = expect_ok(c);
        assert!(t - t0 >= 30_000, "write {k} completed {} ns after its doorbell", t - t0);
        assert!(c.timestamp >= t0 + 30_000);
    }
    dst.check_canaries();
}

#[test]
fn dropped_doorbells_are_recovered_by_the_next_doorbell_or_the_record_reread() {
    for uar in [true, false] {
        // Every other doorbell missed.
        let mut rig = Rig::with(
            cfg(FaultConfig {
                drop_doorbell_every: 2,
                ..FaultConfig::default()
            }),
            None,
            64,
            64,
            uar,
        );
        let (src, dst) = regions(&rig);
        rig.fabric.poll_all();
        let mut slow = 0;
        for k in 0..20u64 {
            let t0 = rig.fabric.now_ns();
            let (c, t) = one_write(&mut rig, &src, &dst, 64 + k as usize, 100 + k);
            expect_ok(c);
            let dt = t - t0;
            let period = EngineConfig::default().dbr_reread_ns;
            assert!(dt <= period + 1_000, "write {k} waited {dt} ns (the re-read period is {period} ns)");
            if dt >= 1_000 {
                slow += 1;
            }
        }
        let s = rig.a.dev.stats();
        assert_eq!(s.doorbells_dropped, 10, "uar {uar}");
        assert!(s.dbr_rereads >= 10, "uar {uar}: {s:?}");
        assert_eq!(slow, 10, "uar {uar}: each dropped doorbell waits for the re-read");
        dst.check_canaries();
    }
}

#[test]
fn a_dropped_doorbell_is_recovered_by_the_next_doorbell() {
    let (mut rig, src, dst) = rig_with(FaultConfig {
        drop_doorbell_every: 2,
        ..FaultConfig::default()
    });
    rig.fabric.poll_all();
    // Doorbell 1 seen; doorbell 2 (for WQE 1) dropped; doorbell 3 (WQE 2)
    // seen: its record read covers WQE 1 too, with no re-read needed.
    for k in 0..3u64 {
        rig.a
            .sq
            .post(&req(WqeOp::Write, src.addr(), src.key(), dst.addr() + k * 8, dst.key(), 8, true));
        rig.a.dev.poll_once();
    }
    for k in 0..3u16 {
        assert_eq!(expect_ok(rig.a.send_cqes.poll().expect("a CQE")).wqe_counter, k);
    }
    assert_eq!(rig.fabric.now_ns(), 0, "no time passed: no re-read was needed");
    assert_eq!(rig.a.dev.stats().doorbells_dropped, 1);
}

#[test]
fn completions_reordered_across_qps_keep_each_qps_order_and_data() {
    let order = |reorder: u32| {
        let fabric = SoftFabric::new(cfg(FaultConfig {
            reorder_across_qps: reorder,
            seed: 42,
            ..FaultConfig::default()
        }));
        let da = fabric.open_device(None).unwrap();
        let db = fabric.open_device(None).unwrap();
        let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
        // Four QPs on A sharing one send CQ.
        let cq_mem = doorbell_softnic::host::CqMemory::new(256);
        let scq = unsafe { da.create_cq(cq_mem.ring()).unwrap() };
        let mut reader = scq.reader();
        let peers: Vec<End> = (0..4).map(|_| End::new(&db, &pb, 64, 64, true)).collect();
        let mems: Vec<doorbell_softnic::host::QpMemory> = (0..4).map(|_| doorbell_softnic::host::QpMemory::new(64, 0, 1)).collect();
        let qps: Vec<_> = mems
            .iter()
            .map(|m| unsafe { da.create_qp(&pa, &scq, &scq, m.rings()).unwrap() })
            .collect();
        let mut posters: Vec<Poster> = qps
            .iter()
            .zip(&mems)
            .map(|(q, m)| Poster {
                h: m.handle(q.qpn(), &cq_mem),
                pi: 0,
            })
            .collect();
        for (q, p) in qps.iter().zip(&peers) {
            q.connect(p.qp.endpoint(), ALL_ACCESS).unwrap();
            p.qp.connect(q.endpoint(), ALL_ACCESS).unwrap();
        }
        let src = Region::new(&da, &pa, 4 * 8 * 64, 0);
        let dst = Region::new(&db, &pb, 4 * 8 * 64, access::LOCAL_WRITE | access::REMOTE_WRITE);
        let data = random_bytes(&mut rng(5), 4 * 8 * 64);
        src.fill(&data);
        let mut seen = Vec::new();
        for round in 0..8u64 {
            for (i, p) in posters.iter_mut().enumerate() {
                let off = (i as u64 * 8 + round) * 64;
                p.post(&write_req(&src, &dst, off, 64, true));
            }
            fabric
                .run_until("this round's CQEs", 1_000_000_000, || {
                    while let Some(c) = reader.poll() {
                        let c = expect_ok(c);
                        seen.push((c.qpn, c.wqe_counter));
                    }
                    seen.len() as u64 == 4 * (round + 1)
                })
                .unwrap();
        }
        assert_eq!(dst.bytes(), data);
        dst.check_canaries();
        for q in &qps {
            let counters: Vec<u16> = seen.iter().filter(|(n, _)| *n == q.qpn()).map(|&(_, c)| c).collect();
            assert_eq!(
                counters,
                (0..8).collect::<Vec<u16>>(),
                "QP {:#x}'s completions out of order",
                q.qpn()
            );
        }
        seen.iter().map(|&(n, _)| n).collect::<Vec<u32>>()
    };
    let plain = order(0);
    let shuffled = order(1);
    assert_ne!(plain, shuffled, "the reorder fault changed nothing");
    assert_eq!(plain, order(0), "without faults the order is deterministic");
}

#[test]
fn forced_error_completions_are_typed_and_touch_no_memory() {
    let (mut rig, src, dst) = rig_with(FaultConfig {
        force_error_every: 4,
        forced_syndrome: CqeSyndrome::RemoteOp.as_u8(),
        ..FaultConfig::default()
    });
    for k in 0..3u64 {
        expect_ok(one_write(&mut rig, &src, &dst, 32, k).0);
    }
    dst.fill(&[0; 4096]);
    src.fill(&[0xee; 64]);
    rig.a.sq.post(&write_req(&src, &dst, 0, 64, false));
    let next = rig.a.sq.post(&write_req(&src, &dst, 0, 64, true));
    let e = expect_err(rig.next_send_cqe(Which::A));
    assert_eq!(
        (CqeSyndrome::from_u8(e.syndrome), Reason::from_u8(e.vendor_err_synd)),
        (CqeSyndrome::RemoteOp, Reason::Injected)
    );
    assert_eq!(e.wqe_counter, 3);
    let f = expect_err(rig.next_send_cqe(Which::A));
    assert_eq!((CqeSyndrome::from_u8(f.syndrome), f.wqe_counter), (CqeSyndrome::WrFlush, next));
    assert!(dst.bytes().iter().all(|&b| b == 0), "a forced error wrote data");
    assert_eq!(rig.a.qp.state(), QpState::Err);
    dst.check_canaries();
}

#[test]
fn a_briefly_stalled_peer_delays_and_a_dead_one_fails_with_retry_exceeded() {
    let stall = |until| {
        cfg(FaultConfig {
            stall_port: 2, // port index 1 (B) + 1
            stall_until_ns: until,
            ..FaultConfig::default()
        })
    };
    let mut rig = Rig::new(stall(5_000_000));
    let (src, dst) = regions(&rig);
    let (c, t) = one_write(&mut rig, &src, &dst, 1000, 1);
    expect_ok(c);
    assert!((5_000_000..5_100_000).contains(&t), "completed at {t} ns, the stall ends at 5 ms");
    dst.check_canaries();

    let mut rig = Rig::new(stall(u64::MAX));
    let (src, dst) = regions(&rig);
    let (c, t) = one_write(&mut rig, &src, &dst, 1000, 2);
    let e = expect_err(c);
    assert_eq!(
        (CqeSyndrome::from_u8(e.syndrome), Reason::from_u8(e.vendor_err_synd)),
        (CqeSyndrome::TransportRetryExc, Reason::PeerStalled)
    );
    assert!(
        (100_000_000..=101_000_000).contains(&t),
        "failed at {t} ns; the transport timeout is 100 ms"
    );
    assert!(dst.bytes().iter().all(|&b| b == 0));
    dst.check_canaries();
}

#[test]
fn a_peer_that_is_gone_fails_with_retry_exceeded_on_a_real_clock_without_hanging() {
    let mut rig = Rig::with(
        FabricConfig {
            engine: EngineConfig {
                transport_timeout_ns: 20_000_000,
                ..EngineConfig::default()
            },
            virtual_time: false,
            device_rings: false,
        },
        None,
        64,
        64,
        true,
    );
    let (src, dst) = regions(&rig);
    let _engine = rig.a.dev.spawn_engine();
    rig.b.qp.modify_to_err().unwrap();
    let idx = rig.a.sq.post(&write_req(&src, &dst, 0, 64, true));
    let t0 = std::time::Instant::now();
    // The device pipeline's own poll, with a 5 s budget.
    let r = unsafe { poll_cq(&rig.a.sq.h, idx, 5_000_000_000) };
    match r {
        Err(doorbell_kernels::mlx5::CqError::Failed { syndrome, wqe_counter, .. }) => {
            assert_eq!((syndrome, wqe_counter), (CqeSyndrome::TransportRetryExc, idx));
        }
        other => panic!("expected a transport-retry error, got {other:?}"),
    }
    assert!(t0.elapsed() < std::time::Duration::from_secs(4));
    assert!(dst.bytes().iter().all(|&b| b == 0));
}
