//! Error paths: each bad WQE gets an error CQE with the matching mlx5
//! syndrome, moves the QP to the error state, later WQEs are flushed, and
//! no byte outside (or inside) any region is written.

mod common;

use common::*;
use doorbell_kernels::mlx5::{CqeSyndrome, CtrlSeg, WqeOp, WqeRequest, CQE_REQ_ERR, CQE_RESP_ERR, OPCODE_RDMA_WRITE, WQE_CTRL_CQ_UPDATE};
use doorbell_softnic::engine::{access, QpState, Reason};
use doorbell_softnic::{QueuePair, Sge};

/// Regions on both sides with distinct contents.
struct Bufs {
    src: Region,
    dst: Region,
    ro: Region,
    other_pd: Region,
    local_ro: Region,
}

fn bufs(rig: &Rig) -> Bufs {
    use doorbell_softnic::RdmaDevice;
    let src = Region::new(&rig.a.dev, &rig.a.pd, 512, access::LOCAL_WRITE);
    src.fill(&[0x11; 512]);
    let dst = Region::new(&rig.b.dev, &rig.b.pd, 512, access::ALL);
    dst.fill(&[0x22; 512]);
    let ro = Region::new(&rig.b.dev, &rig.b.pd, 512, access::REMOTE_READ);
    ro.fill(&[0x33; 512]);
    let pd2 = rig.b.dev.alloc_pd().unwrap();
    let other_pd = Region::new(&rig.b.dev, &pd2, 512, access::ALL);
    other_pd.fill(&[0x44; 512]);
    let local_ro = Region::new(&rig.a.dev, &rig.a.pd, 512, 0);
    local_ro.fill(&[0x55; 512]);
    Bufs {
        src,
        dst,
        ro,
        other_pd,
        local_ro,
    }
}

fn untouched(b: &Bufs) {
    for (r, v) in [
        (&b.src, 0x11),
        (&b.dst, 0x22),
        (&b.ro, 0x33),
        (&b.other_pd, 0x44),
        (&b.local_ro, 0x55),
    ] {
        assert!(r.bytes().iter().all(|&x| x == v), "a failed WQE wrote into a region");
        r.check_canaries();
    }
}

/// [`check_bad`] for a bad WQE posted as it is: `make` builds it.
fn check_bad_post(name: &str, make: impl FnOnce(&Bufs) -> WqeRequest, syndrome: CqeSyndrome, reason: Reason, responder_err: bool) {
    check_bad(name, |rig, b| rig.a.sq.post(&make(b)), syndrome, reason, responder_err);
}

/// Posts `bad` between a good signaled write before and an unsignaled write
/// plus a signaled NOP after; checks the good one completes, the bad one
/// fails with `syndrome`/`reason`, both later ones are flushed, the QP is
/// in the error state and nothing was written.
fn check_bad(name: &str, bad: impl FnOnce(&mut Rig, &Bufs) -> u16, syndrome: CqeSyndrome, reason: Reason, responder_err: bool) {
    let mut rig = Rig::new(virtual_cfg());
    let b = bufs(&rig);
    // A good (zero-length) write first: it completes and changes nothing.
    let good = rig
        .a
        .sq
        .post(&req(WqeOp::Write, b.src.addr(), b.src.key(), b.dst.addr(), b.dst.key(), 0, true));
    let c = expect_ok(rig.next_send_cqe(Which::A));
    assert_eq!(c.wqe_counter, good);
    let idx = bad(&mut rig, &b);
    let later1 = rig
        .a
        .sq
        .post(&req(WqeOp::Write, b.src.addr(), b.src.key(), b.dst.addr(), b.dst.key(), 64, false));
    let later2 = rig.a.sq.post(&req(WqeOp::Nop, 0, 0, 0, 0, 0, true));
    let e = expect_err(rig.next_send_cqe(Which::A));
    assert_eq!(e.opcode, CQE_REQ_ERR, "{name}");
    assert_eq!(
        CqeSyndrome::from_u8(e.syndrome),
        syndrome,
        "{name}: syndrome {:#x} ({})",
        e.syndrome,
        reason_of(e.vendor_err_synd)
    );
    assert_eq!(Reason::from_u8(e.vendor_err_synd), reason, "{name}");
    assert_eq!(e.wqe_counter, idx, "{name}");
    assert_eq!(e.qpn, rig.a.qp.qpn());
    // Later WQEs: flushed, each with its own counter (signaled or not).
    for want in [later1, later2] {
        let f = expect_err(rig.next_send_cqe(Which::A));
        assert_eq!(
            (CqeSyndrome::from_u8(f.syndrome), f.wqe_counter),
            (CqeSyndrome::WrFlush, want),
            "{name}: flush"
        );
    }
    assert_eq!(rig.a.qp.state(), QpState::Err, "{name}");
    assert_eq!(
        rig.b.qp.state(),
        if responder_err { QpState::Err } else { QpState::Rts },
        "{name}: responder state"
    );
    // New WQEs on an errored QP are flushed too.
    let after = rig.a.sq.post(&req(WqeOp::Nop, 0, 0, 0, 0, 0, false));
    let f = expect_err(rig.next_send_cqe(Which::A));
    assert_eq!((CqeSyndrome::from_u8(f.syndrome), f.wqe_counter), (CqeSyndrome::WrFlush, after));
    untouched(&b);
    let log = rig.a.dev.error_log();
    let rec = log
        .iter()
        .find(|r| r.wqe_counter == idx && r.responder == 0)
        .expect("an error record");
    assert_eq!(Reason::from_u8(rec.reason), reason);
}

#[test]
fn bad_lkey() {
    check_bad_post(
        "bad lkey",
        |b| {
            req(
                WqeOp::Write,
                b.src.addr(),
                b.src.key() ^ 0x100,
                b.dst.addr(),
                b.dst.key(),
                64,
                false,
            )
        },
        CqeSyndrome::LocalProt,
        Reason::BadKey,
        false,
    );
}

#[test]
fn local_range_out_of_bounds() {
    check_bad_post(
        "local oob",
        |b| req(WqeOp::Write, b.src.addr() + 500, b.src.key(), b.dst.addr(), b.dst.key(), 13, false),
        CqeSyndrome::LocalProt,
        Reason::OutOfBounds,
        false,
    );
}

#[test]
fn read_into_a_region_without_local_write() {
    check_bad_post(
        "read into read-only",
        |b| req(WqeOp::Read, b.local_ro.addr(), b.local_ro.key(), b.ro.addr(), b.ro.key(), 64, false),
        CqeSyndrome::LocalProt,
        Reason::AccessDenied,
        false,
    );
}

#[test]
fn bad_rkey() {
    check_bad_post(
        "bad rkey",
        |b| req(WqeOp::Write, b.src.addr(), b.src.key(), b.dst.addr(), 0xdead_0001, 64, false),
        CqeSyndrome::RemoteAccess,
        Reason::BadKey,
        true,
    );
}

#[test]
fn remote_range_out_of_bounds_by_one_byte() {
    check_bad_post(
        "remote oob",
        |b| req(WqeOp::Write, b.src.addr(), b.src.key(), b.dst.addr() + 1, b.dst.key(), 512, false),
        CqeSyndrome::RemoteAccess,
        Reason::OutOfBounds,
        true,
    );
}

#[test]
fn write_to_a_read_only_region() {
    check_bad_post(
        "write to remote-read-only",
        |b| req(WqeOp::Write, b.src.addr(), b.src.key(), b.ro.addr(), b.ro.key(), 8, false),
        CqeSyndrome::RemoteAccess,
        Reason::AccessDenied,
        true,
    );
}

#[test]
fn remote_region_of_another_protection_domain() {
    check_bad_post(
        "pd mismatch",
        |b| {
            req(
                WqeOp::Write,
                b.src.addr(),
                b.src.key(),
                b.other_pd.addr(),
                b.other_pd.key(),
                8,
                false,
            )
        },
        CqeSyndrome::RemoteAccess,
        Reason::PdMismatch,
        true,
    );
}

#[test]
fn atomic_without_remote_atomic_rights_and_misaligned() {
    check_bad_post(
        "atomic on read-only",
        |b| WqeRequest {
            add: 1,
            ..req(WqeOp::FetchAdd, b.src.addr(), b.src.key(), b.ro.addr(), b.ro.key(), 8, false)
        },
        CqeSyndrome::RemoteAccess,
        Reason::AccessDenied,
        true,
    );
    check_bad_post(
        "misaligned atomic",
        |b| WqeRequest {
            add: 1,
            ..req(WqeOp::FetchAdd, b.src.addr(), b.src.key(), b.dst.addr() + 4, b.dst.key(), 8, false)
        },
        CqeSyndrome::RemoteInvalReq,
        Reason::Misaligned,
        true,
    );
}

#[test]
fn malformed_wqes() {
    check_bad(
        "unknown opcode",
        |rig, _| {
            let ctrl = CtrlSeg {
                opcode: 0x2a,
                fm_ce_se: 0,
                ..CtrlSeg::default()
            };
            let (idx, head) = rig.a.sq.write_segments(ctrl, &[], None);
            rig.a.sq.ring(head);
            idx
        },
        CqeSyndrome::LocalQpOp,
        Reason::BadOpcode,
        false,
    );
    check_bad(
        "ds too small for a write",
        |rig, b| {
            let ctrl = CtrlSeg {
                opcode: OPCODE_RDMA_WRITE,
                ..CtrlSeg::default()
            };
            let (idx, head) = rig.a.sq.write_segments(ctrl, &[raddr_seg(b.dst.addr(), b.dst.key())], Some(1));
            rig.a.sq.ring(head);
            idx
        },
        CqeSyndrome::LocalQpOp,
        Reason::BadDs,
        false,
    );
    check_bad(
        "wqe_index not the consumer index",
        |rig, b| {
            let mut r = req(WqeOp::Write, b.src.addr(), b.src.key(), b.dst.addr(), b.dst.key(), 8, false);
            r.wqe_index = 0x777;
            let idx = rig.a.sq.pi as u16;
            // Write by hand so the wrong index stays.
            let slot = unsafe { rig.a.sq.h.sq.add(((rig.a.sq.pi & (rig.a.sq.h.sq_size - 1)) as usize) * 16) };
            r.qpn = rig.a.sq.h.qpn;
            let head = unsafe { doorbell_kernels::mlx5::wqe::write_wqe(slot, &r) };
            rig.a.sq.pi += 1;
            rig.a.sq.ring(head);
            idx
        },
        CqeSyndrome::LocalQpOp,
        Reason::WqeIndexMismatch,
        false,
    );
    check_bad(
        "inline data",
        |rig, b| {
            let ctrl = CtrlSeg {
                opcode: OPCODE_RDMA_WRITE,
                fm_ce_se: WQE_CTRL_CQ_UPDATE,
                ..CtrlSeg::default()
            };
            let (idx, head) = rig.a.sq.write_segments(
                ctrl,
                &[raddr_seg(b.dst.addr(), b.dst.key()), [(8u32 | 0x8000_0000).to_be(), 0, 0, 0]],
                None,
            );
            rig.a.sq.ring(head);
            idx
        },
        CqeSyndrome::LocalQpOp,
        Reason::InlineUnsupported,
        false,
    );
    check_bad(
        "atomic with a 4-byte result buffer",
        |rig, b| {
            let mut r = WqeRequest {
                add: 1,
                ..req(WqeOp::FetchAdd, b.src.addr(), b.src.key(), b.dst.addr(), b.dst.key(), 8, false)
            };
            r.wqe_index = rig.a.sq.pi as u16;
            r.qpn = rig.a.sq.h.qpn;
            let mut w = doorbell_kernels::mlx5::wqe_words(&r);
            w[12] = 4u32.to_be(); // data segment byte_count
            let slot = unsafe { rig.a.sq.h.sq.add(((rig.a.sq.pi & (rig.a.sq.h.sq_size - 1)) as usize) * 16) };
            unsafe { doorbell_kernels::mlx5::wqe::store_wqe(slot, &w) };
            let idx = rig.a.sq.pi as u16;
            rig.a.sq.pi += 1;
            rig.a.sq.ring(w[0] as u64 | (w[1] as u64) << 32);
            idx
        },
        CqeSyndrome::LocalLength,
        Reason::Length,
        false,
    );
}

#[test]
fn send_longer_than_the_receive_buffer_fails_on_both_sides() {
    let mut rig = Rig::new(virtual_cfg());
    let src = Region::new(&rig.a.dev, &rig.a.pd, 256, 0);
    let rx = Region::new(&rig.b.dev, &rig.b.pd, 64, access::LOCAL_WRITE);
    let sge = Sge {
        addr: rx.addr(),
        len: 64,
        lkey: rx.key(),
    };
    for _ in 0..2 {
        rig.b.qp.post_recv(&[sge]).unwrap();
    }
    let ctrl = CtrlSeg {
        opcode: doorbell_kernels::mlx5::OPCODE_SEND,
        fm_ce_se: WQE_CTRL_CQ_UPDATE,
        ..CtrlSeg::default()
    };
    let (idx, head) = rig.a.sq.write_segments(ctrl, &[data_seg(src.addr(), src.key(), 65)], None);
    rig.a.sq.ring(head);
    let e = expect_err(rig.next_send_cqe(Which::A));
    assert_eq!(
        (CqeSyndrome::from_u8(e.syndrome), e.wqe_counter),
        (CqeSyndrome::RemoteInvalReq, idx)
    );
    let r = expect_err(rig.next_recv_cqe(Which::B));
    assert_eq!(r.opcode, CQE_RESP_ERR);
    assert_eq!((CqeSyndrome::from_u8(r.syndrome), r.wqe_counter), (CqeSyndrome::LocalLength, 0));
    // The responder is in error: its other receive is flushed.
    let r = expect_err(rig.next_recv_cqe(Which::B));
    assert_eq!((CqeSyndrome::from_u8(r.syndrome), r.wqe_counter), (CqeSyndrome::WrFlush, 1));
    assert_eq!(rig.b.qp.state(), QpState::Err);
    assert!(rx.bytes().iter().all(|&b| b == 0));
    rx.check_canaries();
}

#[test]
fn write_with_immediate_without_a_receive_fails_after_the_rnr_timeout_and_waits_before() {
    let mut rig = Rig::new(virtual_cfg());
    let src = Region::new(&rig.a.dev, &rig.a.pd, 64, 0);
    let dst = Region::new(&rig.b.dev, &rig.b.pd, 64, access::LOCAL_WRITE | access::REMOTE_WRITE);
    src.fill(&[7; 64]);
    let r = WqeRequest {
        imm: 1,
        ..req(WqeOp::WriteImm, src.addr(), src.key(), dst.addr(), dst.key(), 64, true)
    };
    // Posted late (after 1 ms of no receive): the write waits, then completes.
    rig.a.sq.post(&r);
    let fabric = rig.fabric.clone();
    fabric.run_until("1 ms", 10_000_000, || fabric.now_ns() >= 1_000_000).unwrap();
    assert!(rig.a.send_cqes.poll().is_none(), "completed without a receive WQE");
    assert!(dst.bytes().iter().all(|&b| b == 0), "wrote before a receive WQE was posted");
    rig.b
        .qp
        .post_recv(&[Sge {
            addr: dst.addr(),
            len: 0,
            lkey: dst.key(),
        }])
        .unwrap();
    expect_ok(rig.next_send_cqe(Which::A));
    expect_ok(rig.next_recv_cqe(Which::B));
    assert_eq!(dst.bytes(), vec![7; 64]);
    // Never posted: RNR retries exhausted after rnr_timeout_ns (100 ms).
    let t0 = rig.fabric.now_ns();
    let idx = rig.a.sq.post(&r);
    let e = expect_err(rig.next_send_cqe(Which::A));
    assert_eq!((CqeSyndrome::from_u8(e.syndrome), e.wqe_counter), (CqeSyndrome::RnrRetryExc, idx));
    let waited = rig.fabric.now_ns() - t0;
    assert!((100_000_000..=101_000_000).contains(&waited), "failed after {waited} ns");
    dst.check_canaries();
}

#[test]
fn deregistered_region_is_a_bad_key() {
    let mut rig = Rig::new(virtual_cfg());
    let src = Region::new(&rig.a.dev, &rig.a.pd, 64, 0);
    let mut dst = Region::new(&rig.b.dev, &rig.b.pd, 64, access::LOCAL_WRITE | access::REMOTE_WRITE);
    let (addr, key) = (dst.addr(), dst.key());
    dst.mr.take();
    rig.a.sq.post(&req(WqeOp::Write, src.addr(), src.key(), addr, key, 64, true));
    let e = expect_err(rig.next_send_cqe(Which::A));
    assert_eq!(
        (CqeSyndrome::from_u8(e.syndrome), Reason::from_u8(e.vendor_err_synd)),
        (CqeSyndrome::RemoteAccess, Reason::BadKey)
    );
    assert!(dst.bytes().iter().all(|&b| b == 0));
    dst.check_canaries();
}
