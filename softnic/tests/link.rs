//! The link model in virtual time: promised bandwidth within 5 % for large
//! transfers, latency, a port's bandwidth shared between QPs, fences, and
//! the `DOORBELL_SOFTNIC_LINK` syntax.

mod common;

use common::*;
use doorbell_kernels::mlx5::WqeOp;
use doorbell_softnic::engine::{access, LinkModel};
use doorbell_softnic::{link_from_env, link_from_str, FabricConfig, QueuePair, RdmaDevice, LINK_ENV};

const MIB: usize = 1 << 20;

fn link_400g_2us() -> LinkModel {
    link_from_str(LINK_ENV, "400gbps,2us").unwrap().unwrap()
}

/// Posts `n` signaled writes of `size` bytes from `e` and returns the CQE
/// timestamps (modelled completion times, ns).
fn writes(rig: &mut Rig, n: usize, size: usize) -> Vec<u64> {
    let src = Region::new(&rig.a.dev, &rig.a.pd, size, 0);
    let dst = Region::new(&rig.b.dev, &rig.b.pd, size, access::LOCAL_WRITE | access::REMOTE_WRITE);
    src.fill(&random_bytes(&mut rng(9), size));
    for _ in 0..n {
        rig.a.sq.post(&write_req(&src, &dst, 0, size as u32, true));
    }
    let t = (0..n).map(|_| expect_ok(rig.next_send_cqe(Which::A)).timestamp).collect();
    assert_eq!(dst.bytes(), src.bytes());
    dst.check_canaries();
    t
}

#[test]
fn large_transfers_reach_the_promised_bandwidth_within_5_percent() {
    let link = link_400g_2us();
    let mut rig = Rig::with(virtual_cfg(), Some(link), 64, 64, true);
    let (n, size) = (48, 4 * MIB);
    let t = writes(&mut rig, n, size);
    let bytes = (n * size) as f64;
    let seconds = *t.last().unwrap() as f64 * 1e-9;
    let gbps = bytes * 8.0 / seconds / 1e9;
    assert!((380.0..=400.0).contains(&gbps), "modelled {gbps:.1} Gb/s for a 400 Gb/s link");
    // No completion before latency + its bytes on the wire.
    let wire_ns = |k: usize| (k * size) as f64 * 8.0 / 400.0;
    for (k, &ts) in t.iter().enumerate() {
        assert!(
            ts as f64 >= 2000.0 + wire_ns(k + 1) - 1.0,
            "WQE {k} completed at {ts} ns, before its modelled time"
        );
    }
    // One WQE every size / bandwidth.
    let gap = (t[n - 1] - t[n - 2]) as f64;
    assert!((gap - wire_ns(1)).abs() < 2.0, "gap {gap} ns");
}

#[test]
fn a_small_write_pays_the_latency() {
    let mut rig = Rig::with(virtual_cfg(), Some(link_400g_2us()), 64, 64, true);
    rig.a.dev.poll_once();
    rig.fabric.set_time_ns(10_000);
    let t = writes(&mut rig, 1, 8);
    // 2 us latency + 0.16 ns on the wire, rounded up to the engine's whole-ns clock.
    assert_eq!(t[0], 10_000 + 2_000 + 1);
}

#[test]
fn two_qps_of_one_port_share_its_bandwidth() {
    let fabric = doorbell_softnic::SoftFabric::new(virtual_cfg());
    let link = link_400g_2us();
    let da = fabric.open_device(Some(link)).unwrap();
    let db = fabric.open_device(Some(link)).unwrap();
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let mut ends: Vec<(End, End)> = (0..2)
        .map(|_| (End::new(&da, &pa, 64, 64, true), End::new(&db, &pb, 64, 64, true)))
        .collect();
    for (a, b) in &ends {
        a.qp.connect(b.qp.endpoint(), ALL_ACCESS).unwrap();
        b.qp.connect(a.qp.endpoint(), ALL_ACCESS).unwrap();
    }
    let size = 2 * MIB;
    let src = Region::new(&da, &pa, size, 0);
    let dst = Region::new(&db, &pb, size, access::LOCAL_WRITE | access::REMOTE_WRITE);
    for (a, _) in ends.iter_mut() {
        for _ in 0..8 {
            a.sq.post(&write_req(&src, &dst, 0, size as u32, true));
        }
    }
    let mut last = 0;
    let mut got = 0;
    fabric
        .run_until("16 completions", 1_000_000_000, || {
            for (a, _) in ends.iter_mut() {
                while let Some(c) = a.send_cqes.poll() {
                    last = last.max(expect_ok(c).timestamp);
                    got += 1;
                }
            }
            got == 16
        })
        .unwrap();
    let gbps = (16 * size) as f64 * 8.0 / (last as f64 * 1e-9) / 1e9;
    assert!(
        (380.0..=400.0).contains(&gbps),
        "two QPs together: {gbps:.1} Gb/s on a 400 Gb/s port"
    );
}

#[test]
fn a_fenced_write_waits_for_the_earlier_read() {
    let run = |fence: bool| {
        let mut rig = Rig::with(virtual_cfg(), Some(link_400g_2us()), 64, 64, true);
        let local = Region::new(&rig.a.dev, &rig.a.pd, MIB, access::LOCAL_WRITE);
        let remote = Region::new(&rig.b.dev, &rig.b.pd, MIB, access::ALL);
        rig.a.sq.post(&req(
            WqeOp::Read,
            local.addr(),
            local.key(),
            remote.addr(),
            remote.key(),
            MIB as u32,
            true,
        ));
        let mut w = write_req(&local, &remote, 0, 8, true);
        if fence {
            w.flags |= FENCE;
        }
        rig.a.sq.post(&w);
        let read = expect_ok(rig.next_send_cqe(Which::A)).timestamp;
        let write = expect_ok(rig.next_send_cqe(Which::A)).timestamp;
        write - read
    };
    assert!(run(false) < 100, "unfenced write finished {} ns after the read", run(false));
    assert!(run(true) >= 2_000, "fenced write finished only {} ns after the read", run(true));
}

#[test]
fn link_syntax_errors_name_the_variable_and_the_accepted_forms() {
    let e = link_from_str(LINK_ENV, "fast").unwrap_err().to_string();
    assert!(e.contains("DOORBELL_SOFTNIC_LINK=\"fast\""), "{e}");
    assert!(e.contains("400gbps,2us"), "{e}");
    assert_eq!(link_from_str(LINK_ENV, "off").unwrap(), None);
    // The only test of this binary that touches the environment.
    std::env::set_var(LINK_ENV, "100gbps,5us");
    let m = link_from_env().unwrap().unwrap();
    assert_eq!((m.bits_per_second(), m.latency_ns), (100_000_000_000, 5_000));
    std::env::set_var(LINK_ENV, "100gbps 5us");
    assert!(link_from_env().unwrap_err().to_string().contains(LINK_ENV));
    std::env::remove_var(LINK_ENV);
    assert_eq!(link_from_env().unwrap(), None);
    let _ = FabricConfig::default();
}
