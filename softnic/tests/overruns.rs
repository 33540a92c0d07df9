//! Producers that publish more than their rings hold, and WQEs that wait
//! for room: an overrun receive queue fails the WQE that would consume it
//! and flushes at most a ring, an overrun send queue flushes nothing it
//! cannot hold, and a SEND waiting for room in the responder's receive CQ
//! is counted once and fails after the transport timeout, never waits
//! forever.

mod common;

use common::*;
use doorbell_kernels::mlx5::{CqeSyndrome, CtrlSeg, WqeOp, OPCODE_SEND, WQE_CTRL_CQ_UPDATE};
use doorbell_softnic::engine::{access, rq, QpState, Reason};
use doorbell_softnic::host::Sge;
use doorbell_softnic::QueuePair;

/// Runs the fabric for `ns` of virtual time.
fn run_for(rig: &Rig, ns: u64) {
    let fabric = rig.fabric.clone();
    let until = fabric.now_ns() + ns;
    fabric
        .run_until("the time to pass", ns + 1_000_000, || fabric.now_ns() >= until)
        .unwrap();
}

/// `n` receive WQEs at the responder, 16 bytes of `rx` each.
fn post_receives(rig: &Rig, rx: &Region, n: u64) {
    for k in 0..n {
        let sge = Sge {
            addr: rx.addr() + 16 * k,
            len: 16,
            lkey: rx.key(),
        };
        rig.b.qp.post_recv(&[sge]).unwrap();
    }
}

/// A SEND of `len` bytes from `src`, signaled or not.
fn send(rig: &mut Rig, src: &Region, len: u32, signaled: bool) -> u16 {
    let ctrl = CtrlSeg {
        opcode: OPCODE_SEND,
        fm_ce_se: if signaled { WQE_CTRL_CQ_UPDATE } else { 0 },
        ..CtrlSeg::default()
    };
    let (idx, head) = rig.a.sq.write_segments(ctrl, &[data_seg(src.addr(), src.key(), len)], None);
    rig.a.sq.ring(head);
    idx
}

#[test]
fn a_receive_queue_its_producer_overran_fails_the_send_and_flushes_at_most_a_ring() {
    let mut rig = Rig::new(virtual_cfg());
    let src = Region::new(&rig.a.dev, &rig.a.pd, 64, 0);
    src.fill(&[0x5a; 64]);
    let rx = Region::new(&rig.b.dev, &rig.b.pd, 64, access::LOCAL_WRITE);
    post_receives(&rig, &rx, 2);
    // The responder's producer publishes 0x4000 receive WQEs into a ring
    // of 16 (before, the SENDs went into slots never posted or already
    // consumed, and completed).
    let rq_wqes = rig.b.mem.rq_wqes;
    // SAFETY: the QP's doorbell record pair; word 0 counts receive WQEs.
    unsafe { rq::publish(rig.b.mem.dbrec.as_ptr() as *mut u32, 0x4000) };
    let idx = send(&mut rig, &src, 8, true);
    let e = expect_err(rig.next_send_cqe(Which::A));
    assert_eq!(
        (CqeSyndrome::from_u8(e.syndrome), Reason::from_u8(e.vendor_err_synd), e.wqe_counter),
        (CqeSyndrome::RemoteOp, Reason::RqOverrun, idx),
        "{}",
        reason_of(e.vendor_err_synd)
    );
    run_for(&rig, 100_000);
    assert_eq!(rig.b.qp.state(), QpState::Err);
    assert!(
        rig.b.dev.error_log().iter().any(|r| r.reason == Reason::RqOverrun as u8),
        "{:?}",
        rig.b.dev.error_log()
    );
    // Flushed: a ring's worth of receive WQEs at most, never the count the
    // producer claimed.
    let mut flushed = 0u32;
    while let Some(c) = rig.b.recv_cqes.poll() {
        let c = expect_err(c);
        assert_eq!(CqeSyndrome::from_u8(c.syndrome), CqeSyndrome::WrFlush);
        flushed += 1;
    }
    assert_eq!(flushed, rq_wqes, "flush CQEs for an RQ of {rq_wqes}");
    run_for(&rig, 100_000);
    assert!(rig.b.recv_cqes.poll().is_none(), "more flushes after the ring's");
    assert!(rx.bytes().iter().all(|&b| b == 0), "the SEND wrote into the overrun ring's buffers");
    rx.check_canaries();
}

#[test]
fn an_overrun_receive_queue_flushed_through_a_small_cq_completes_at_most_a_ring() {
    // A receive CQ of 4 entries, read as it fills: the flush goes over
    // several calls, and still completes one ring (16) in all.
    let mut rig = Rig::with(virtual_cfg(), None, 64, 4, true);
    let src = Region::new(&rig.a.dev, &rig.a.pd, 64, 0);
    let rq_wqes = rig.b.mem.rq_wqes;
    // SAFETY: the QP's doorbell record pair; word 0 counts receive WQEs.
    unsafe { rq::publish(rig.b.mem.dbrec.as_ptr() as *mut u32, 0x4000) };
    send(&mut rig, &src, 8, true);
    let e = expect_err(rig.next_send_cqe(Which::A));
    assert_eq!(Reason::from_u8(e.vendor_err_synd), Reason::RqOverrun);
    let mut flushed = 0u32;
    for _ in 0..50 {
        run_for(&rig, 10_000);
        while let Some(c) = rig.b.recv_cqes.poll() {
            assert_eq!(CqeSyndrome::from_u8(expect_err(c).syndrome), CqeSyndrome::WrFlush);
            flushed += 1;
        }
    }
    assert_eq!(flushed, rq_wqes, "flush CQEs for an RQ of {rq_wqes} through a CQ of 4");
}

#[test]
fn flushing_an_overrun_send_queue_completes_nothing_the_ring_cannot_hold() {
    let mut rig = Rig::with(virtual_cfg(), None, 16, 64, true);
    // A record 1000 basic blocks ahead of a ring of 16: the QP fails, and
    // its flush writes no CQE for the published "WQEs" (before: one per
    // basic block until the 64-entry CQ was full).
    // SAFETY: the handle's doorbell words.
    unsafe {
        doorbell_kernels::mlx5::queue::update_doorbell_record(&rig.a.sq.h, 1000);
        doorbell_kernels::mlx5::queue::ring_doorbell(&rig.a.sq.h, 1);
    }
    run_for(&rig, 100_000);
    assert_eq!(rig.a.qp.state(), QpState::Err);
    assert!(rig.a.dev.error_log().iter().any(|r| r.reason == Reason::SqOverrun as u8));
    let mut cqes = Vec::new();
    while let Some(c) = rig.a.send_cqes.poll() {
        cqes.push(expect_err(c).wqe_counter);
    }
    assert_eq!(cqes, Vec::<u16>::new(), "flush CQEs for an overrun ring");
    assert_eq!(rig.a.dev.stats().executed, 0);
}

#[test]
fn a_send_retried_while_the_receive_cq_is_full_is_counted_once() {
    // Receive CQs of 2 entries: the third SEND waits for room at the
    // responder, retried on every pass (before, each retry counted it as
    // executed again, and drew the injected-error fault again; with no
    // deadline).
    let mut rig = Rig::with(virtual_cfg(), None, 64, 2, true);
    let src = Region::new(&rig.a.dev, &rig.a.pd, 64, 0);
    let rx = Region::new(&rig.b.dev, &rig.b.pd, 64, access::LOCAL_WRITE);
    post_receives(&rig, &rx, 4);
    // Two SENDs fill the responder's receive CQ; the third finds it full.
    for _ in 0..2 {
        send(&mut rig, &src, 8, false);
    }
    run_for(&rig, 100_000);
    send(&mut rig, &src, 8, false);
    run_for(&rig, 200_000);
    let s = rig.a.dev.stats();
    assert_eq!(s.wqes, 2, "the third SEND completed while the responder's receive CQ was full");
    assert_eq!(
        (s.fetched, s.executed),
        (3, 3),
        "three SENDs fetched and counted once each, the third retried for 200 us"
    );
    assert_eq!(rig.b.recv_cqes.poll().map(|c| expect_ok(c).wqe_counter), Some(0));
    // Room again: the third completes, still counted once.
    assert_eq!(rig.b.recv_cqes.poll().map(|c| expect_ok(c).wqe_counter), Some(1));
    let third = rig.next_recv_cqe(Which::B);
    assert_eq!(expect_ok(third).wqe_counter, 2);
    assert_eq!(rig.a.dev.stats().executed, 3);
}

#[test]
fn a_send_to_a_receive_cq_nobody_polls_fails_after_the_transport_timeout() {
    let mut rig = Rig::with(virtual_cfg(), None, 64, 2, true);
    let src = Region::new(&rig.a.dev, &rig.a.pd, 64, 0);
    let rx = Region::new(&rig.b.dev, &rig.b.pd, 64, access::LOCAL_WRITE);
    post_receives(&rig, &rx, 3);
    for _ in 0..2 {
        send(&mut rig, &src, 8, false);
    }
    run_for(&rig, 100_000);
    // The responder never polls its receive CQ: the third SEND fails once
    // the transport timeout (100 ms) has passed, not before.
    let t0 = rig.fabric.now_ns();
    let idx = send(&mut rig, &src, 8, true);
    let e = expect_err(rig.next_send_cqe(Which::A));
    let waited = rig.fabric.now_ns() - t0;
    assert_eq!(
        (CqeSyndrome::from_u8(e.syndrome), Reason::from_u8(e.vendor_err_synd), e.wqe_counter),
        (CqeSyndrome::TransportRetryExc, Reason::ResponderFull, idx)
    );
    assert!((100_000_000..=101_000_000).contains(&waited), "failed after {waited} ns");
    assert_eq!(rig.a.qp.state(), QpState::Err);
    // Nothing of it reached the responder.
    assert!(rx.bytes()[32..48].iter().all(|&b| b == 0));
}

#[test]
fn a_failure_the_stopped_responder_cannot_hear_fails_the_requester_after_the_transport_timeout() {
    // The responder's engine stops (its port is never polled): its inbox
    // fills with the events of 16 SENDs, and a WRITE with a bad remote key
    // then has no room to report its error to the responder.
    let mut rig = Rig::new(virtual_cfg());
    let src = Region::new(&rig.a.dev, &rig.a.pd, 64, 0);
    let dst = Region::new(&rig.b.dev, &rig.b.pd, 64, access::LOCAL_WRITE | access::REMOTE_WRITE);
    let rx = Region::new(&rig.b.dev, &rig.b.pd, 256, access::LOCAL_WRITE);
    let inbox = doorbell_softnic::engine::tables::INBOX as u64;
    post_receives(&rig, &rx, inbox);
    let fabric = rig.fabric.clone();
    let poll_a = |rig: &Rig, ns: u64| {
        let until = fabric.now_ns() + ns;
        while fabric.now_ns() < until {
            rig.a.dev.poll_once();
            fabric.advance_ns(1_000);
        }
    };
    for _ in 0..inbox {
        send(&mut rig, &src, 8, false);
    }
    poll_a(&rig, 50_000);
    assert_eq!(rig.a.dev.stats().wqes, inbox, "the SENDs, their events in the responder's inbox");
    let bad = req(WqeOp::Write, src.addr(), src.key(), dst.addr(), dst.key() ^ 0x8000, 8, true);
    let t0 = fabric.now_ns();
    let idx = rig.a.sq.post(&bad);
    let mut got = None;
    while got.is_none() && fabric.now_ns() - t0 < 200_000_000 {
        poll_a(&rig, 100_000);
        got = rig.a.send_cqes.poll();
    }
    let waited = fabric.now_ns() - t0;
    let e = expect_err(got.expect("no completion within 200 ms: the requester waited for the responder forever"));
    assert_eq!((Reason::from_u8(e.vendor_err_synd), e.wqe_counter), (Reason::BadKey, idx));
    assert!((100_000_000..=101_000_000).contains(&waited), "failed after {waited} ns");
    assert!(dst.bytes().iter().all(|&b| b == 0));
}

/// A rig whose requester's send CQ of 4 entries is full: four signaled
/// 8-byte WRITEs from `src` (bytes `i ^ salt`) into `dst`, never polled.
fn full_send_cq(salt: u8) -> (Rig, Region, Region) {
    let mut rig = Rig::with(virtual_cfg(), None, 64, 4, true);
    let src = Region::new(&rig.a.dev, &rig.a.pd, 64, 0);
    src.fill(&(0..64).map(|i| i as u8 ^ salt).collect::<Vec<u8>>());
    let dst = Region::new(&rig.b.dev, &rig.b.pd, 64, access::ALL);
    for k in 0..4 {
        rig.a.sq.post(&write_req(&src, &dst, 8 * k, 8, true));
    }
    run_for(&rig, 100_000);
    (rig, src, dst)
}

#[test]
fn a_send_cq_nobody_polls_overruns_after_the_transport_timeout_and_its_qp_flushes_once_it_has_room() {
    // A send CQ of 4 entries, never polled: four signaled WRITEs fill it,
    // the fifth waits for room, and once the transport timeout (100 ms)
    // has passed, not before, the CQ has overrun: the QP moves to the
    // error state and the port's log names the WQE; no CQE is overwritten.
    let (mut rig, src, dst) = full_send_cq(0x3c);
    let idx = rig.a.sq.post(&write_req(&src, &dst, 32, 8, true));
    let overran = |rig: &Rig| rig.a.dev.error_log().into_iter().find(|r| r.reason == Reason::CqOverrun as u8);
    run_for(&rig, 99_000_000);
    assert_eq!(rig.a.qp.state(), QpState::Rts, "failed before the transport timeout");
    assert!(overran(&rig).is_none());
    run_for(&rig, 2_000_000);
    assert_eq!(rig.a.qp.state(), QpState::Err, "still waiting past the transport timeout");
    let r = overran(&rig).expect("no CQ overrun in the port's log");
    assert_eq!((r.qpn, r.wqe_counter), (rig.a.qp.qpn(), idx));
    assert!(Reason::CqOverrun.description().contains("send CQ stayed full"));
    // The four completions are as written, in order.
    for k in 0..4u16 {
        let c = rig.a.send_cqes.poll().expect("a completion of the full CQ");
        assert_eq!(expect_ok(c).wqe_counter, k);
    }
    // With room again the waiting WRITE is flushed, never executed.
    let e = expect_err(rig.next_send_cqe(Which::A));
    assert_eq!(
        (CqeSyndrome::from_u8(e.syndrome), Reason::from_u8(e.vendor_err_synd), e.wqe_counter),
        (CqeSyndrome::WrFlush, Reason::Flushed, idx)
    );
    let got = dst.bytes();
    assert_eq!(&got[..32], &src.bytes()[..32], "the four WRITEs before it");
    assert!(got[32..40].iter().all(|&b| b == 0), "the WRITE that waited moved its bytes");
    dst.check_canaries();
}

#[test]
fn an_unsignaled_write_waits_for_room_in_its_full_send_cq_past_the_transport_timeout() {
    // It writes no CQE unless it fails, so a full CQ does not overrun for
    // it: it waits (the one-WQE path keeps room for an error CQE) and goes
    // once its consumer polls.
    let (mut rig, src, dst) = full_send_cq(0xa7);
    rig.a.sq.post(&write_req(&src, &dst, 32, 8, false));
    run_for(&rig, 250_000_000);
    assert_eq!(rig.a.qp.state(), QpState::Rts, "an unsignaled WRITE overran the CQ");
    assert!(rig.a.dev.error_log().iter().all(|r| r.reason != Reason::CqOverrun as u8));
    assert!(dst.bytes()[32..40].iter().all(|&b| b == 0), "it ran without room");
    // Room: it executes.
    assert_eq!(rig.a.send_cqes.poll().map(|c| expect_ok(c).wqe_counter), Some(0));
    run_for(&rig, 100_000);
    assert_eq!(&dst.bytes()[..40], &src.bytes()[..40]);
    assert_eq!(rig.a.qp.state(), QpState::Rts);
    dst.check_canaries();
}
