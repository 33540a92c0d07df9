//! Ring wraparound over many iterations (SQ basic blocks, the 16-bit WQE
//! counter, the CQ's owner-bit phase over hundreds of passes), consumed by
//! the device pipeline's own `poll_cq`, deterministic and with engine
//! threads.

mod common;

use common::*;
use doorbell_kernels::mlx5::cq::poll_cq;
use doorbell_kernels::mlx5::WqeOp;
use doorbell_softnic::engine::access;
use doorbell_softnic::FabricConfig;

const SLOT: usize = 16;

/// Posts `iters` batches of 1..=8 writes (16 distinct bytes each, the last
/// signaled) into a 16-block SQ, completing to an 8-entry CQ, and checks
/// every byte of every batch and every completion (via `poll_cq`, which
/// checks the owner bit of each pass). `drive` runs the engine (a
/// `poll_once`, or nothing when engine threads run).
fn run(rig: &mut Rig, iters: u32, drive: &dyn Fn(&Rig)) {
    let src = Region::new(&rig.a.dev, &rig.a.pd, 8 * SLOT, 0);
    let dst = Region::new(&rig.b.dev, &rig.b.pd, 8 * SLOT, access::LOCAL_WRITE | access::REMOTE_WRITE);
    let mut r = rng(7);
    let mut wqes = 0u64;
    for it in 0..iters {
        let n = 1 + (it % 8) as usize;
        let payload = random_bytes(&mut r, n * SLOT);
        src.fill(&payload);
        let mut head = 0;
        let mut last = 0;
        for i in 0..n {
            let off = (i * SLOT) as u64;
            let w = write_req(&src, &dst, off, SLOT as u32, i == n - 1);
            (last, head) = rig.a.sq.write(&w);
        }
        rig.a.sq.ring(head);
        drive(rig);
        // SAFETY: the handle's memory lives in the rig.
        let c = unsafe { poll_cq(&rig.a.sq.h, last, 2_000_000_000) }.unwrap_or_else(|e| panic!("iteration {it}: {e:?}"));
        assert_eq!(c.wqe_counter, last, "iteration {it}");
        assert_eq!(&dst.bytes()[..n * SLOT], &payload[..], "iteration {it}");
        wqes += n as u64;
    }
    assert!(wqes > 65_536 || iters < 10_000, "the 16-bit WQE counter did not wrap");
    src.check_canaries();
    dst.check_canaries();
}

#[test]
fn sq_wqe_counter_and_cq_phase_wrap_many_times_deterministic() {
    let mut rig = Rig::with(virtual_cfg(), None, 16, 8, true);
    // 16 000 batches: 72 000 WQEs (the 16-bit counter wraps), 16 000 CQEs
    // through an 8-entry CQ (2 000 passes of the owner bit).
    run(&mut rig, 16_000, &|rig| {
        rig.a.dev.poll_once();
    });
    assert_eq!(rig.a.dev.stats().cqes, 16_000);
}

#[test]
fn wraps_with_engine_threads_and_a_real_clock() {
    let mut rig = Rig::with(FabricConfig::default(), None, 16, 8, false);
    let _ea = rig.a.dev.spawn_engine();
    let _eb = rig.b.dev.spawn_engine();
    run(&mut rig, 3_000, &|_| {});
}

#[test]
fn a_full_cq_holds_completions_back_until_the_consumer_frees_room() {
    // 4-entry CQ, 10 signaled NOPs: 4 are written, the rest wait for the
    // consumer index (doorbell record), none overwrites an unread CQE.
    let mut rig = Rig::with(virtual_cfg(), None, 16, 4, true);
    for _ in 0..10 {
        rig.a.sq.post(&req(WqeOp::Nop, 0, 0, 0, 0, 0, true));
    }
    for _ in 0..5 {
        rig.a.dev.poll_once();
        rig.fabric.advance_ns(10_000);
    }
    assert_eq!(rig.a.dev.stats().cqes, 4);
    for k in 0..10u16 {
        let c = expect_ok(rig.next_send_cqe(Which::A));
        assert_eq!(c.wqe_counter, k);
    }
}
