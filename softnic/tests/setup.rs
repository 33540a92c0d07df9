//! The verbs-shaped setup: state machine, connection errors, keys, access
//! flags, what each state executes.

mod common;

use common::*;
use doorbell_kernels::mlx5::{CqeSyndrome, WqeOp};
use doorbell_softnic::engine::{access, QpState};
use doorbell_softnic::{Error, MemoryRegion, QpEndpoint, QueuePair, RdmaDevice, SoftFabric};

#[test]
fn the_qp_state_machine_is_verbs() {
    let fabric = SoftFabric::new(virtual_cfg());
    let dev = fabric.open_device(None).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let a = End::new(&dev, &pd, 16, 16, true);
    let b = End::new(&dev, &pd, 16, 16, true);
    assert_eq!(a.qp.state(), QpState::Reset);
    assert!(matches!(
        a.qp.modify_to_rts(),
        Err(Error::BadTransition {
            from: QpState::Reset,
            to: QpState::Rts,
            ..
        })
    ));
    assert!(matches!(a.qp.modify_to_rtr(b.qp.endpoint()), Err(Error::BadTransition { .. })));
    a.qp.modify_to_init(access::REMOTE_WRITE).unwrap();
    let missing = QpEndpoint {
        lid: dev.lid(),
        qpn: 0xabcd,
    };
    let e = a.qp.modify_to_rtr(missing).unwrap_err();
    assert!(matches!(e, Error::NoSuchRemote { qpn: 0xabcd, .. }), "{e}");
    assert_eq!(a.qp.state(), QpState::Init, "a failed transition changes nothing");
    assert!(matches!(
        a.qp.modify_to_rtr(QpEndpoint { lid: 99, qpn: b.qp.qpn() }),
        Err(Error::NoSuchRemote { lid: 99, .. })
    ));
    a.qp.modify_to_rtr(b.qp.endpoint()).unwrap();
    a.qp.modify_to_rts().unwrap();
    a.qp.modify_to_rts().unwrap();
    a.qp.modify_to_err().unwrap();
    assert!(matches!(a.qp.modify_to_rts(), Err(Error::BadTransition { from: QpState::Err, .. })));
    a.qp.modify_to_reset().unwrap();
    a.qp.connect(b.qp.endpoint(), ALL_ACCESS).unwrap();
    assert_eq!(a.qp.state(), QpState::Rts);
}

#[test]
fn wqes_wait_until_rts_and_the_responder_answers_only_from_rtr() {
    let mut rig = Rig::with(virtual_cfg(), None, 16, 16, true);
    let src = Region::new(&rig.a.dev, &rig.a.pd, 64, 0);
    let dst = Region::new(&rig.b.dev, &rig.b.pd, 64, access::LOCAL_WRITE | access::REMOTE_WRITE);
    src.fill(&[9; 64]);
    // Take A back to RESET and post while it is not in RTS.
    rig.a.qp.modify_to_reset().unwrap();
    rig.a.sq.pi = 0;
    unsafe { doorbell_kernels::mlx5::queue::update_doorbell_record(&rig.a.sq.h, 0) };
    rig.a.qp.modify_to_init(ALL_ACCESS).unwrap();
    rig.a.sq.post(&write_req(&src, &dst, 0, 64, true));
    rig.a.qp.modify_to_rtr(rig.b.qp.endpoint()).unwrap();
    for _ in 0..3 {
        rig.fabric.poll_all();
        rig.fabric.advance_ns(200_000);
    }
    assert!(rig.a.send_cqes.poll().is_none(), "executed before RTS");
    rig.a.qp.modify_to_rts().unwrap();
    expect_ok(rig.next_send_cqe(Which::A));
    assert_eq!(dst.bytes(), vec![9; 64]);
}

#[test]
fn moving_to_err_flushes_outstanding_sends_and_receives() {
    let mut rig = Rig::with(virtual_cfg(), None, 16, 16, true);
    for _ in 0..3 {
        rig.b.qp.post_recv(&[]).unwrap();
    }
    rig.b.qp.modify_to_err().unwrap();
    for k in 0..3u16 {
        let e = expect_err(rig.next_recv_cqe(Which::B));
        assert_eq!((CqeSyndrome::from_u8(e.syndrome), e.wqe_counter), (CqeSyndrome::WrFlush, k));
    }
    rig.b.sq.post(&req(WqeOp::Nop, 0, 0, 0, 0, 0, false));
    let e = expect_err(rig.next_send_cqe(Which::B));
    assert_eq!(CqeSyndrome::from_u8(e.syndrome), CqeSyndrome::WrFlush);
}

#[test]
fn registration_checks_flags_and_keys_are_unique_and_stale_after_deregistration() {
    let fabric = SoftFabric::new(virtual_cfg());
    let dev = fabric.open_device(None).unwrap();
    let other = fabric.open_device(None).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let buf = doorbell_softnic::host::HostBuffer::zeroed(4096, 64);
    unsafe {
        assert!(matches!(
            dev.reg_mr(&pd, buf.as_ptr(), 4096, access::REMOTE_WRITE),
            Err(Error::BadAccess { .. })
        ));
        assert!(matches!(dev.reg_mr(&pd, buf.as_ptr(), 4096, 0x100), Err(Error::BadAccess { .. })));
        assert!(matches!(dev.reg_mr(&pd, buf.as_ptr(), 0, 0), Err(Error::BadRegion { .. })));
        assert!(matches!(other.reg_mr(&pd, buf.as_ptr(), 16, 0), Err(Error::Foreign { .. })));
        let m1 = dev.reg_mr(&pd, buf.as_ptr(), 4096, access::ALL).unwrap();
        let m2 = dev.reg_mr(&pd, buf.as_ptr(), 4096, access::ALL).unwrap();
        assert_ne!(m1.lkey(), m2.lkey());
        assert_eq!(m1.lkey(), m1.rkey());
        let k1 = m1.lkey();
        drop(m1);
        let m3 = dev.reg_mr(&pd, buf.as_ptr(), 4096, access::ALL).unwrap();
        assert_ne!(m3.lkey(), k1, "a slot reused after deregistration gets a new key");
    }
}

#[test]
fn rings_must_be_powers_of_two_and_aligned() {
    let fabric = SoftFabric::new(virtual_cfg());
    let dev = fabric.open_device(None).unwrap();
    let mem = doorbell_softnic::host::CqMemory::new(6);
    let e = unsafe { dev.create_cq(mem.ring()) }.unwrap_err();
    assert!(e.to_string().contains("power of two"), "{e}");
    let mem = doorbell_softnic::host::CqMemory::new(8);
    let mut r = mem.ring();
    r.buf = unsafe { r.buf.add(8) };
    assert!(unsafe { dev.create_cq(r) }.unwrap_err().to_string().contains("aligned"));
}
