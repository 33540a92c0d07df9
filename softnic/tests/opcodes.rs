//! Every opcode the soft NIC executes, byte for byte, with the CQE fields
//! checked against the `#[descriptor]` layouts.

mod common;

use common::*;
use doorbell_kernels::mlx5::{
    CtrlSeg, WqeOp, WqeRequest, CQE_REQ, CQE_RESP_SEND, CQE_RESP_WR_IMM, OPCODE_NOP, OPCODE_RDMA_READ, OPCODE_RDMA_WRITE, OPCODE_SEND,
    WQE_CTRL_CQ_UPDATE, WQE_CTRL_SOLICITED,
};
use doorbell_softnic::engine::access;
use doorbell_softnic::Sge;

#[test]
fn rdma_write_moves_every_byte_of_payloads_that_differ_per_wqe() {
    let mut rig = Rig::new(virtual_cfg());
    let mut r = rng(1);
    let n = 40usize;
    let size = 1000usize;
    let src = Region::new(&rig.a.dev, &rig.a.pd, n * size, access::LOCAL_WRITE);
    let dst = Region::new(&rig.b.dev, &rig.b.pd, n * size, access::LOCAL_WRITE | access::REMOTE_WRITE);
    let payload = random_bytes(&mut r, n * size);
    src.fill(&payload);
    let mut last = 0;
    for i in 0..n {
        // Odd lengths and offsets: 1000 - i bytes at offset i * 1000.
        let len = size - i;
        let off = (i * size) as u64;
        last = rig.a.sq.post(&write_req(&src, &dst, off, len as u32, i == n - 1));
    }
    let c = expect_ok(rig.next_send_cqe(Which::A));
    assert_eq!(c.opcode, CQE_REQ);
    assert_eq!(c.wqe_counter, last, "only the last (signaled) WQE completes");
    assert_eq!(c.qpn, rig.a.qp_qpn());
    assert_eq!(
        c.sop_drop, OPCODE_RDMA_WRITE,
        "the requester CQE names the WQE opcode in sop_drop_qpn's high byte"
    );
    assert_eq!(c.byte_cnt, (size - (n - 1)) as u32);
    assert!(rig.a.send_cqes.poll().is_none(), "unsignaled WQEs wrote CQEs");
    let got = dst.bytes();
    for i in 0..n {
        let off = i * size;
        let len = size - i;
        assert_eq!(&got[off..off + len], &payload[off..off + len], "WQE {i}'s payload");
        assert!(got[off + len..off + size].iter().all(|&b| b == 0), "WQE {i} wrote past its length");
    }
    src.check_canaries();
    dst.check_canaries();
    assert_eq!(rig.a.dev.stats().wqes, n as u64);
}

trait QpnOf {
    fn qp_qpn(&self) -> u32;
}
impl QpnOf for End {
    fn qp_qpn(&self) -> u32 {
        use doorbell_softnic::QueuePair;
        self.qp.qpn()
    }
}

#[test]
fn rdma_read_fills_the_local_buffer() {
    let mut rig = Rig::new(virtual_cfg());
    let mut r = rng(2);
    let remote = Region::new(&rig.b.dev, &rig.b.pd, 4096, access::REMOTE_READ);
    let local = Region::new(&rig.a.dev, &rig.a.pd, 4096, access::LOCAL_WRITE);
    let payload = random_bytes(&mut r, 4096);
    remote.fill(&payload);
    for (k, (off, len)) in [(0usize, 4096u32), (17, 1), (100, 333)].into_iter().enumerate() {
        local.fill(&[0; 4096]);
        let idx = rig.a.sq.post(&req(
            WqeOp::Read,
            local.addr() + off as u64,
            local.key(),
            remote.addr() + off as u64,
            remote.key(),
            len,
            true,
        ));
        let c = expect_ok(rig.next_send_cqe(Which::A));
        assert_eq!((c.wqe_counter, c.byte_cnt, c.sop_drop), (idx, len, OPCODE_RDMA_READ), "read {k}");
        let got = local.bytes();
        assert_eq!(&got[off..off + len as usize], &payload[off..off + len as usize]);
        assert!(got[..off].iter().chain(&got[off + len as usize..]).all(|&b| b == 0));
    }
    local.check_canaries();
    remote.check_canaries();
}

#[test]
fn atomics_update_the_remote_word_and_return_the_old_value_big_endian() {
    let mut rig = Rig::new(virtual_cfg());
    let target = Region::new(&rig.b.dev, &rig.b.pd, 64, access::LOCAL_WRITE | access::REMOTE_ATOMIC);
    let result = Region::new(&rig.a.dev, &rig.a.pd, 64, access::LOCAL_WRITE);
    target.write_at(8, &1000u64.to_ne_bytes());
    let fa = WqeRequest {
        add: 5,
        ..req(
            WqeOp::FetchAdd,
            result.addr(),
            result.key(),
            target.addr() + 8,
            target.key(),
            8,
            true,
        )
    };
    for k in 0..10u64 {
        rig.a.sq.post(&fa);
        let c = expect_ok(rig.next_send_cqe(Which::A));
        assert_eq!(c.byte_cnt, 8);
        assert_eq!(
            result.u64_at(0),
            (1000 + 5 * k).to_be(),
            "old value of fetch-add {k}, big-endian as ConnectX returns it"
        );
    }
    assert_eq!(target.u64_at(8), 1050);
    // Compare-and-swap: a miss leaves the word, a hit swaps it.
    let cas = |compare, swap| WqeRequest {
        compare,
        swap,
        ..req(
            WqeOp::CompareSwap,
            result.addr() + 8,
            result.key(),
            target.addr() + 8,
            target.key(),
            8,
            true,
        )
    };
    rig.a.sq.post(&cas(7, 99));
    expect_ok(rig.next_send_cqe(Which::A));
    assert_eq!(result.u64_at(8), 1050u64.to_be());
    assert_eq!(target.u64_at(8), 1050, "a failed compare must not swap");
    rig.a.sq.post(&cas(1050, 0xdead_beef_0123_4567));
    expect_ok(rig.next_send_cqe(Which::A));
    assert_eq!(result.u64_at(8), 1050u64.to_be());
    assert_eq!(target.u64_at(8), 0xdead_beef_0123_4567);
    assert_eq!(target.u64_at(0), 0);
    assert_eq!(target.u64_at(16), 0);
    target.check_canaries();
    result.check_canaries();
}

#[test]
fn atomic_reply_can_be_host_order() {
    let cfg = doorbell_softnic::FabricConfig {
        engine: doorbell_softnic::engine::EngineConfig {
            atomic_reply_be: 0,
            ..Default::default()
        },
        virtual_time: true,
        device_rings: false,
    };
    let mut rig = Rig::new(cfg);
    let target = Region::new(&rig.b.dev, &rig.b.pd, 8, access::LOCAL_WRITE | access::REMOTE_ATOMIC);
    let result = Region::new(&rig.a.dev, &rig.a.pd, 8, access::LOCAL_WRITE);
    target.write_at(0, &41u64.to_ne_bytes());
    rig.a.sq.post(&WqeRequest {
        add: 1,
        ..req(WqeOp::FetchAdd, result.addr(), result.key(), target.addr(), target.key(), 8, true)
    });
    expect_ok(rig.next_send_cqe(Which::A));
    assert_eq!((result.u64_at(0), target.u64_at(0)), (41, 42));
}

#[test]
fn write_with_immediate_consumes_a_receive_and_completes_on_both_sides() {
    let mut rig = Rig::new(virtual_cfg());
    let src = Region::new(&rig.a.dev, &rig.a.pd, 256, access::LOCAL_WRITE);
    let dst = Region::new(&rig.b.dev, &rig.b.pd, 256, access::LOCAL_WRITE | access::REMOTE_WRITE);
    src.fill(&(0..=255u8).collect::<Vec<_>>());
    let unused = Region::new(&rig.b.dev, &rig.b.pd, 64, access::LOCAL_WRITE);
    for k in 0..3u32 {
        // A receive WQE (its buffer is not used by a write-with-immediate).
        let ridx = rig
            .b
            .qp
            .post_recv(&[Sge {
                addr: unused.addr(),
                len: 64,
                lkey: unused.key(),
            }])
            .unwrap();
        assert_eq!(ridx, k);
        let imm = 0x1234_0000 + k;
        let r = WqeRequest {
            imm,
            flags: SIGNALED | if k == 1 { SOLICITED } else { 0 },
            ..req(
                WqeOp::WriteImm,
                src.addr(),
                src.key(),
                dst.addr() + k as u64,
                dst.key(),
                100 + k,
                false,
            )
        };
        let idx = rig.a.sq.post(&r);
        let s = expect_ok(rig.next_send_cqe(Which::A));
        assert_eq!((s.opcode, s.wqe_counter), (CQE_REQ, idx));
        let c = expect_ok(rig.next_recv_cqe(Which::B));
        assert_eq!(c.opcode, CQE_RESP_WR_IMM);
        assert_eq!(c.imm_inval_pkey, imm, "the immediate, as the sender wrote it");
        assert_eq!(c.byte_cnt, 100 + k);
        assert_eq!(c.wqe_counter, k as u16, "the receive WQE's counter");
        assert_eq!(c.qpn, rig.b.qp_qpn());
        assert_eq!(c.op_own_flags & 1, (k == 1) as u8, "solicited-event bit");
        assert_eq!(&dst.bytes()[k as usize..(100 + 2 * k) as usize], &src.bytes()[..(100 + k) as usize]);
    }
    assert!(
        unused.bytes().iter().all(|&b| b == 0),
        "a write-with-immediate wrote into the receive buffer"
    );
    for r in [&src, &dst, &unused] {
        r.check_canaries();
    }
}

#[test]
fn send_scatters_into_the_receive_buffers_and_reports_solicited_events() {
    let mut rig = Rig::new(virtual_cfg());
    let mut r = rng(3);
    let src = Region::new(&rig.a.dev, &rig.a.pd, 1000, 0);
    let payload = random_bytes(&mut r, 1000);
    src.fill(&payload);
    let rx = Region::new(&rig.b.dev, &rig.b.pd, 1200, access::LOCAL_WRITE);
    // Three scatter entries: 100 + 300 + 800 bytes; the message is 700 bytes
    // gathered from two pieces.
    rig.b
        .qp
        .post_recv(&[
            Sge {
                addr: rx.addr(),
                len: 100,
                lkey: rx.key(),
            },
            Sge {
                addr: rx.addr() + 100,
                len: 300,
                lkey: rx.key(),
            },
            Sge {
                addr: rx.addr() + 400,
                len: 800,
                lkey: rx.key(),
            },
        ])
        .unwrap();
    rig.b.rcq.req_notify(true);
    let ctrl = CtrlSeg {
        opcode: OPCODE_SEND,
        fm_ce_se: WQE_CTRL_CQ_UPDATE | WQE_CTRL_SOLICITED,
        ..CtrlSeg::default()
    };
    let (idx, head) = rig.a.sq.write_segments(
        ctrl,
        &[data_seg(src.addr(), src.key(), 250), data_seg(src.addr() + 500, src.key(), 450)],
        None,
    );
    rig.a.sq.ring(head);
    let s = expect_ok(rig.next_send_cqe(Which::A));
    assert_eq!((s.wqe_counter, s.sop_drop, s.byte_cnt), (idx, OPCODE_SEND, 700));
    let c = expect_ok(rig.next_recv_cqe(Which::B));
    assert_eq!(
        (c.opcode, c.byte_cnt, c.wqe_counter, c.op_own_flags & 1),
        (CQE_RESP_SEND, 700, 0, 1)
    );
    let mut want = payload[..250].to_vec();
    want.extend_from_slice(&payload[500..950]);
    let got = rx.bytes();
    assert_eq!(&got[..700], &want[..]);
    assert!(got[700..].iter().all(|&b| b == 0));
    assert_eq!(rig.b.rcq.events(), 1, "the solicited completion fires the armed CQ's event");
    rx.check_canaries();
}

#[test]
fn nop_completes_when_signaled_and_unsignaled_wqes_are_consumed_silently() {
    let mut rig = Rig::new(virtual_cfg());
    for _ in 0..5 {
        rig.a.sq.post(&req(WqeOp::Nop, 0, 0, 0, 0, 0, false));
    }
    let idx = rig.a.sq.post(&req(WqeOp::Nop, 0, 0, 0, 0, 0, true));
    let c = expect_ok(rig.next_send_cqe(Which::A));
    assert_eq!((c.wqe_counter, c.sop_drop, c.byte_cnt), (idx, OPCODE_NOP, 0));
    assert_eq!(idx, 5);
    assert!(rig.a.send_cqes.poll().is_none());
}

#[test]
fn a_gather_list_spanning_basic_blocks_wraps_the_ring() {
    // An 8-block SQ; start 6 blocks in so a 3-block WQE (ds 11: ctrl, raddr,
    // 9 data segments) wraps from block 7 to block 1.
    let mut rig = Rig::with(virtual_cfg(), None, 8, 64, true);
    let mut r = rng(4);
    let src = Region::new(&rig.a.dev, &rig.a.pd, 9 * 64, 0);
    let dst = Region::new(&rig.b.dev, &rig.b.pd, 9 * 64, access::LOCAL_WRITE | access::REMOTE_WRITE);
    let payload = random_bytes(&mut r, 9 * 64);
    src.fill(&payload);
    for _ in 0..7 {
        rig.a.sq.post(&req(WqeOp::Nop, 0, 0, 0, 0, 0, true));
        expect_ok(rig.next_send_cqe(Which::A));
    }
    assert_eq!(rig.a.sq.pi, 7);
    // Pieces in reverse order, different lengths: 64 - k bytes from piece k.
    let mut segs = vec![raddr_seg(dst.addr(), dst.key())];
    let mut want = Vec::new();
    for k in (0..9usize).rev() {
        let len = 64 - k;
        segs.push(data_seg(src.addr() + (k * 64) as u64, src.key(), len as u32));
        want.extend_from_slice(&payload[k * 64..k * 64 + len]);
    }
    let ctrl = CtrlSeg {
        opcode: OPCODE_RDMA_WRITE,
        fm_ce_se: WQE_CTRL_CQ_UPDATE,
        ..CtrlSeg::default()
    };
    let (idx, head) = rig.a.sq.write_segments(ctrl, &segs, None);
    rig.a.sq.ring(head);
    let c = expect_ok(rig.next_send_cqe(Which::A));
    assert_eq!((c.wqe_counter, c.byte_cnt), (idx, want.len() as u32));
    assert_eq!(&dst.bytes()[..want.len()], &want[..]);
    // The next WQE starts after the 3 blocks.
    let next = rig.a.sq.post(&req(WqeOp::Nop, 0, 0, 0, 0, 0, true));
    assert_eq!(next, 10);
    assert_eq!(expect_ok(rig.next_send_cqe(Which::A)).wqe_counter, 10);
    dst.check_canaries();
}

#[test]
fn loopback_on_one_port_and_overlapping_ranges() {
    let fabric = doorbell_softnic::SoftFabric::new(virtual_cfg());
    let dev = fabric.open_device(None).unwrap();
    use doorbell_softnic::{QueuePair, RdmaDevice};
    let pd = dev.alloc_pd().unwrap();
    let mut a = End::new(&dev, &pd, 16, 16, true);
    let b = End::new(&dev, &pd, 16, 16, true);
    a.qp.connect(b.qp.endpoint(), ALL_ACCESS).unwrap();
    b.qp.connect(a.qp.endpoint(), ALL_ACCESS).unwrap();
    let buf = Region::new(&dev, &pd, 256, access::ALL);
    let data: Vec<u8> = (0..=255u8).collect();
    buf.fill(&data);
    // Overlapping write within one region: bytes 0..200 to 50..250.
    a.sq.post(&req(WqeOp::Write, buf.addr(), buf.key(), buf.addr() + 50, buf.key(), 200, true));
    let mut got = None;
    fabric
        .run_until("loopback CQE", 1_000_000, || {
            got = a.send_cqes.poll();
            got.is_some()
        })
        .unwrap();
    expect_ok(got.unwrap());
    let mut want = data.clone();
    want.copy_within(0..200, 50);
    assert_eq!(buf.bytes(), want);
    buf.check_canaries();
    assert!(a.recv_cqes.poll().is_none());
}
