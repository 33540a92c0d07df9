//! The mlx5 constants and WQE/CQE layouts against rdma-core's mlx5dv.h, as
//! the C compiler sees it (through shim/mlx5_ref.c).

#![cfg(doorbell_mlx5_shim)]

use rdma_sys_ext::mlx5::{self, CqeSyndrome};
use rdma_sys_ext::shim::{header_value, header_values, reference_cqe, reference_wqe, RefWqeOp, WqeParams};

fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(b[off..off + 4].try_into().unwrap())
}
fn be64(b: &[u8], off: usize) -> u64 {
    u64::from_be_bytes(b[off..off + 8].try_into().unwrap())
}
fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes(b[off..off + 2].try_into().unwrap())
}

/// Every Rust constant, by the C name the shim exports it under.
fn rust_values() -> Vec<(&'static str, u64)> {
    use mlx5::*;
    let mut v: Vec<(&'static str, u64)> = vec![
        ("MLX5_OPCODE_NOP", OPCODE_NOP.into()),
        ("MLX5_OPCODE_SEND_INVAL", OPCODE_SEND_INVAL.into()),
        ("MLX5_OPCODE_RDMA_WRITE", OPCODE_RDMA_WRITE.into()),
        ("MLX5_OPCODE_RDMA_WRITE_IMM", OPCODE_RDMA_WRITE_IMM.into()),
        ("MLX5_OPCODE_SEND", OPCODE_SEND.into()),
        ("MLX5_OPCODE_SEND_IMM", OPCODE_SEND_IMM.into()),
        ("MLX5_OPCODE_TSO", OPCODE_TSO.into()),
        ("MLX5_OPCODE_RDMA_READ", OPCODE_RDMA_READ.into()),
        ("MLX5_OPCODE_ATOMIC_CS", OPCODE_ATOMIC_CS.into()),
        ("MLX5_OPCODE_ATOMIC_FA", OPCODE_ATOMIC_FA.into()),
        ("MLX5_OPCODE_ATOMIC_MASKED_CS", OPCODE_ATOMIC_MASKED_CS.into()),
        ("MLX5_OPCODE_ATOMIC_MASKED_FA", OPCODE_ATOMIC_MASKED_FA.into()),
        ("MLX5_OPCODE_FMR", OPCODE_FMR.into()),
        ("MLX5_OPCODE_LOCAL_INVAL", OPCODE_LOCAL_INVAL.into()),
        ("MLX5_OPCODE_CONFIG_CMD", OPCODE_CONFIG_CMD.into()),
        ("MLX5_OPCODE_SET_PSV", OPCODE_SET_PSV.into()),
        ("MLX5_OPCODE_UMR", OPCODE_UMR.into()),
        ("MLX5_OPCODE_TAG_MATCHING", OPCODE_TAG_MATCHING.into()),
        ("MLX5_OPCODE_FLOW_TBL_ACCESS", OPCODE_FLOW_TBL_ACCESS.into()),
        ("MLX5_OPCODE_MMO", OPCODE_MMO.into()),
        ("MLX5_WQE_CTRL_CQ_UPDATE", WQE_CTRL_CQ_UPDATE.into()),
        ("MLX5_WQE_CTRL_SOLICITED", WQE_CTRL_SOLICITED.into()),
        ("MLX5_WQE_CTRL_FENCE", WQE_CTRL_FENCE.into()),
        ("MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE", WQE_CTRL_INITIATOR_SMALL_FENCE.into()),
        ("MLX5_SEND_WQE_BB", SEND_WQE_BB as u64),
        ("MLX5_SEND_WQE_SHIFT", SEND_WQE_SHIFT.into()),
        ("MLX5_INLINE_SEG", INLINE_SEG.into()),
        ("MLX5_CQE_OWNER_MASK", CQE_OWNER_MASK.into()),
        ("MLX5_CQE_REQ", CQE_REQ.into()),
        ("MLX5_CQE_RESP_WR_IMM", CQE_RESP_WR_IMM.into()),
        ("MLX5_CQE_RESP_SEND", CQE_RESP_SEND.into()),
        ("MLX5_CQE_RESP_SEND_IMM", CQE_RESP_SEND_IMM.into()),
        ("MLX5_CQE_RESP_SEND_INV", CQE_RESP_SEND_INV.into()),
        ("MLX5_CQE_RESIZE_CQ", CQE_RESIZE_CQ.into()),
        ("MLX5_CQE_NO_PACKET", CQE_NO_PACKET.into()),
        ("MLX5_CQE_SIG_ERR", CQE_SIG_ERR.into()),
        ("MLX5_CQE_REQ_ERR", CQE_REQ_ERR.into()),
        ("MLX5_CQE_RESP_ERR", CQE_RESP_ERR.into()),
        ("MLX5_CQE_INVALID", CQE_INVALID.into()),
        ("MLX5_CQE_VENDOR_SYNDROME_ODP_PFAULT", CQE_VENDOR_SYNDROME_ODP_PFAULT.into()),
        ("MLX5_CQ_DOORBELL", CQ_DOORBELL.into()),
        ("MLX5_CQ_DB_REQ_NOT_SOL", CQ_DB_REQ_NOT_SOL.into()),
        ("MLX5_CQ_DB_REQ_NOT", CQ_DB_REQ_NOT.into()),
        ("sizeof(mlx5_wqe_ctrl_seg)", CTRL_SEG_SIZE as u64),
        ("sizeof(mlx5_wqe_raddr_seg)", RADDR_SEG_SIZE as u64),
        ("sizeof(mlx5_wqe_data_seg)", DATA_SEG_SIZE as u64),
        ("sizeof(mlx5_wqe_atomic_seg)", ATOMIC_SEG_SIZE as u64),
        ("sizeof(mlx5_cqe64)", CQE_SIZE as u64),
        ("sizeof(mlx5_err_cqe)", CQE_SIZE as u64),
        ("offsetof(mlx5_wqe_ctrl_seg,opmod_idx_opcode)", ctrl::OPMOD_IDX_OPCODE as u64),
        ("offsetof(mlx5_wqe_ctrl_seg,qpn_ds)", ctrl::QPN_DS as u64),
        ("offsetof(mlx5_wqe_ctrl_seg,signature)", ctrl::SIGNATURE as u64),
        (
            "offsetof(mlx5_wqe_ctrl_seg,dci_stream_channel_id)",
            ctrl::DCI_STREAM_CHANNEL_ID as u64,
        ),
        ("offsetof(mlx5_wqe_ctrl_seg,fm_ce_se)", ctrl::FM_CE_SE as u64),
        ("offsetof(mlx5_wqe_ctrl_seg,imm)", ctrl::IMM as u64),
        ("offsetof(mlx5_wqe_raddr_seg,raddr)", raddr::RADDR as u64),
        ("offsetof(mlx5_wqe_raddr_seg,rkey)", raddr::RKEY as u64),
        ("offsetof(mlx5_wqe_data_seg,byte_count)", data::BYTE_COUNT as u64),
        ("offsetof(mlx5_wqe_data_seg,lkey)", data::LKEY as u64),
        ("offsetof(mlx5_wqe_data_seg,addr)", data::ADDR as u64),
        ("offsetof(mlx5_wqe_atomic_seg,swap_add)", atomic::SWAP_ADD as u64),
        ("offsetof(mlx5_wqe_atomic_seg,compare)", atomic::COMPARE as u64),
        ("offsetof(mlx5_cqe64,srqn_uidx)", cqe64::SRQN_UIDX as u64),
        ("offsetof(mlx5_cqe64,imm_inval_pkey)", cqe64::IMM_INVAL_PKEY as u64),
        ("offsetof(mlx5_cqe64,byte_cnt)", cqe64::BYTE_CNT as u64),
        ("offsetof(mlx5_cqe64,timestamp)", cqe64::TIMESTAMP as u64),
        ("offsetof(mlx5_cqe64,sop_drop_qpn)", cqe64::SOP_DROP_QPN as u64),
        ("offsetof(mlx5_cqe64,wqe_counter)", cqe64::WQE_COUNTER as u64),
        ("offsetof(mlx5_cqe64,signature)", cqe64::SIGNATURE as u64),
        ("offsetof(mlx5_cqe64,op_own)", cqe64::OP_OWN as u64),
        ("offsetof(mlx5_err_cqe,srqn)", err_cqe::SRQN as u64),
        ("offsetof(mlx5_err_cqe,vendor_err_synd)", err_cqe::VENDOR_ERR_SYND as u64),
        ("offsetof(mlx5_err_cqe,syndrome)", err_cqe::SYNDROME as u64),
        ("offsetof(mlx5_err_cqe,s_wqe_opcode_qpn)", err_cqe::S_WQE_OPCODE_QPN as u64),
        ("offsetof(mlx5_err_cqe,wqe_counter)", err_cqe::WQE_COUNTER as u64),
        ("offsetof(mlx5_err_cqe,signature)", err_cqe::SIGNATURE as u64),
        ("offsetof(mlx5_err_cqe,op_own)", err_cqe::OP_OWN as u64),
    ];
    for s in CqeSyndrome::ALL {
        v.push((s.c_name(), s.as_u8().into()));
    }
    v
}

#[test]
fn every_constant_equals_the_header() {
    let header = header_values();
    let ours = rust_values();
    for (name, value) in &ours {
        let Some(&(_, h)) = header.iter().find(|(n, _)| n == name) else {
            panic!("{name} is not exported by the shim");
        };
        assert_eq!(*value, h, "{name}: Rust {value:#x}, mlx5dv.h {h:#x}");
    }
    for (name, _) in &header {
        assert!(
            ours.iter().any(|(n, _)| n == name),
            "the shim exports {name}, which has no Rust counterpart in this test"
        );
    }
    assert_eq!(ours.len(), header.len());
}

#[test]
fn hand_written_ctrl_seg_matches_the_header() {
    use core::mem::{align_of, offset_of, size_of};
    use rdma_sys_ext::sys::mlx5_wqe_ctrl_seg as C;
    assert_eq!(size_of::<C>() as u64, header_value("sizeof(mlx5_wqe_ctrl_seg)").unwrap());
    assert_eq!(align_of::<C>(), 4);
    for (field, off) in [
        ("opmod_idx_opcode", offset_of!(C, opmod_idx_opcode)),
        ("qpn_ds", offset_of!(C, qpn_ds)),
        ("signature", offset_of!(C, signature)),
        ("dci_stream_channel_id", offset_of!(C, dci_stream_channel_id)),
        ("fm_ce_se", offset_of!(C, fm_ce_se)),
        ("imm", offset_of!(C, imm)),
    ] {
        let h = header_value(&format!("offsetof(mlx5_wqe_ctrl_seg,{field})")).unwrap();
        assert_eq!(off as u64, h, "{field}");
    }
}

#[test]
fn write_wqe_hand_computed() {
    let p = WqeParams {
        op: RefWqeOp::Write,
        wqe_index: 0x1234,
        qpn: 0x00ab_cdef,
        raddr: 0x1122_3344_5566_7788,
        rkey: 0xdead_beef,
        laddr: 0x0000_7f00_0000_1000,
        lkey: 0x0102_0304,
        len: 4096,
        signaled: true,
        ..Default::default()
    };
    let w = reference_wqe(&p);
    assert_eq!(w.len(), 48);
    // ctrl word 0 = BE32((index << 8) | opcode), opmod 0
    assert_eq!(&w[0..4], &((0x1234u32 << 8) | 0x08).to_be_bytes());
    assert_eq!(&w[0..4], &[0x00, 0x12, 0x34, 0x08]);
    // ctrl word 1 = BE32((qpn << 8) | ds)
    assert_eq!(&w[4..8], &[0xab, 0xcd, 0xef, 0x03]);
    assert_eq!(w[8], 0, "signature");
    assert_eq!(&w[9..11], &[0, 0], "dci stream id");
    assert_eq!(w[11], 0x08, "fm_ce_se: CQ_UPDATE");
    assert_eq!(&w[12..16], &[0, 0, 0, 0], "imm");
    // raddr segment
    assert_eq!(&w[16..24], &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
    assert_eq!(&w[24..28], &[0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(&w[28..32], &[0, 0, 0, 0]);
    // data segment
    assert_eq!(&w[32..36], &[0x00, 0x00, 0x10, 0x00]);
    assert_eq!(&w[36..40], &[0x01, 0x02, 0x03, 0x04]);
    assert_eq!(&w[40..48], &[0, 0, 0x7f, 0, 0, 0, 0x10, 0]);
}

#[test]
fn nop_wqe_is_ctrl_only() {
    let w = reference_wqe(&WqeParams {
        op: RefWqeOp::Nop,
        wqe_index: 7,
        qpn: 0x0100_0042, // bit 24 is dropped
        fence: true,
        solicited: true,
        ..Default::default()
    });
    assert_eq!(w, [0, 0, 7, 0x00, 0, 0, 0x42, 1, 0, 0, 0, 0x80 | 0x02, 0, 0, 0, 0]);
}

#[test]
fn write_imm_stores_imm_big_endian() {
    let w = reference_wqe(&WqeParams {
        op: RefWqeOp::WriteImm,
        imm: 0xcafe_f00d,
        ..Default::default()
    });
    assert_eq!(w[3], mlx5::OPCODE_RDMA_WRITE_IMM);
    assert_eq!(&w[12..16], &[0xca, 0xfe, 0xf0, 0x0d]);
}

#[test]
fn atomic_wqes_hand_computed() {
    let base = WqeParams {
        wqe_index: 0xffff,
        qpn: 0x12,
        raddr: 0x1000,
        rkey: 5,
        laddr: 0x2000,
        lkey: 6,
        len: 999, // ignored: the result buffer is 8 bytes
        add: 0x0102_0304_0506_0708,
        compare: 0xaaaa_bbbb_cccc_dddd,
        swap: 0x1111_2222_3333_4444,
        ..Default::default()
    };
    let fa = reference_wqe(&WqeParams {
        op: RefWqeOp::FetchAdd,
        ..base
    });
    assert_eq!(fa.len(), 64);
    assert_eq!(&fa[0..8], &[0x00, 0xff, 0xff, 0x12, 0, 0, 0x12, 4]);
    assert_eq!(be64(&fa, 16), 0x1000);
    assert_eq!(be32(&fa, 24), 5);
    assert_eq!(be64(&fa, 32), 0x0102_0304_0506_0708, "swap_add = add");
    assert_eq!(be64(&fa, 40), 0, "compare = 0");
    assert_eq!(be32(&fa, 48), 8, "result buffer is 8 bytes");
    assert_eq!(be32(&fa, 52), 6);
    assert_eq!(be64(&fa, 56), 0x2000);

    let cs = reference_wqe(&WqeParams {
        op: RefWqeOp::CompareSwap,
        ..base
    });
    assert_eq!(cs[3], 0x11);
    assert_eq!(be64(&cs, 32), 0x1111_2222_3333_4444, "swap_add = swap");
    assert_eq!(be64(&cs, 40), 0xaaaa_bbbb_cccc_dddd, "compare");
    assert_eq!(&cs[48..], &fa[48..]);
}

/// An independent WQE builder from the Rust constants alone; it must agree
/// with the header's helpers byte for byte.
fn rust_wqe(p: &WqeParams) -> Vec<u8> {
    use mlx5::*;
    let (opcode, ds) = match p.op {
        RefWqeOp::Nop => (OPCODE_NOP, 1),
        RefWqeOp::Write => (OPCODE_RDMA_WRITE, 3),
        RefWqeOp::WriteImm => (OPCODE_RDMA_WRITE_IMM, 3),
        RefWqeOp::Read => (OPCODE_RDMA_READ, 3),
        RefWqeOp::FetchAdd => (OPCODE_ATOMIC_FA, 4),
        RefWqeOp::CompareSwap => (OPCODE_ATOMIC_CS, 4),
    };
    let mut w = vec![0u8; ds * SEG_UNIT];
    let put32 = |w: &mut Vec<u8>, off: usize, v: u32| w[off..off + 4].copy_from_slice(&v.to_be_bytes());
    let put64 = |w: &mut Vec<u8>, off: usize, v: u64| w[off..off + 8].copy_from_slice(&v.to_be_bytes());
    put32(&mut w, ctrl::OPMOD_IDX_OPCODE, (u32::from(p.wqe_index) << 8) | u32::from(opcode));
    put32(&mut w, ctrl::QPN_DS, ((p.qpn & 0xff_ffff) << 8) | ds as u32);
    w[ctrl::FM_CE_SE] = if p.fence { WQE_CTRL_FENCE } else { 0 }
        | if p.signaled { WQE_CTRL_CQ_UPDATE } else { 0 }
        | if p.solicited { WQE_CTRL_SOLICITED } else { 0 };
    if p.op == RefWqeOp::WriteImm {
        put32(&mut w, ctrl::IMM, p.imm);
    }
    if ds == 1 {
        return w;
    }
    let r = CTRL_SEG_SIZE;
    put64(&mut w, r + raddr::RADDR, p.raddr);
    put32(&mut w, r + raddr::RKEY, p.rkey);
    let mut d = r + RADDR_SEG_SIZE;
    let mut len = p.len;
    if ds == 4 {
        let (swap_add, compare) = if p.op == RefWqeOp::FetchAdd {
            (p.add, 0)
        } else {
            (p.swap, p.compare)
        };
        put64(&mut w, d + atomic::SWAP_ADD, swap_add);
        put64(&mut w, d + atomic::COMPARE, compare);
        d += ATOMIC_SEG_SIZE;
        len = 8;
    }
    put32(&mut w, d + data::BYTE_COUNT, len);
    put32(&mut w, d + data::LKEY, p.lkey);
    put64(&mut w, d + data::ADDR, p.laddr);
    w
}

/// xorshift64*: deterministic pseudo-random test inputs.
struct XorShift64(u64);
impl XorShift64 {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn rust_builder_agrees_with_header_helpers() {
    let ops = [
        RefWqeOp::Nop,
        RefWqeOp::Write,
        RefWqeOp::WriteImm,
        RefWqeOp::Read,
        RefWqeOp::FetchAdd,
        RefWqeOp::CompareSwap,
    ];
    let mut rng = XorShift64(0x9e37_79b9_7f4a_7c15);
    for i in 0..3000 {
        let bits = rng.next();
        let p = WqeParams {
            op: ops[i % ops.len()],
            wqe_index: rng.next() as u16,
            qpn: rng.next() as u32,
            raddr: rng.next(),
            rkey: rng.next() as u32,
            laddr: rng.next(),
            lkey: rng.next() as u32,
            len: rng.next() as u32,
            imm: rng.next() as u32,
            add: rng.next(),
            compare: rng.next(),
            swap: rng.next(),
            signaled: bits & 1 != 0,
            fence: bits & 2 != 0,
            solicited: bits & 4 != 0,
        };
        assert_eq!(rust_wqe(&p), reference_wqe(&p), "{p:?}");
    }
}

#[test]
fn success_cqe_fields() {
    let c = reference_cqe(mlx5::CQE_REQ, true, 0xbeef, 0x55, 0x66, 0x0aab_bccd, 123_456);
    assert_eq!(c[mlx5::cqe64::OP_OWN], (mlx5::CQE_REQ << 4) | 1);
    assert_eq!(mlx5::cqe_opcode(c[63]), mlx5::CQE_REQ);
    assert_eq!(mlx5::cqe_owner(c[63]), 1);
    assert_eq!(be16(&c, mlx5::cqe64::WQE_COUNTER), 0xbeef);
    assert_eq!(&c[60..62], &[0xbe, 0xef]);
    assert_eq!(be32(&c, mlx5::cqe64::BYTE_CNT), 123_456);
    assert_eq!(be32(&c, mlx5::cqe64::SOP_DROP_QPN) & 0xff_ffff, 0xab_bccd);
    // syndromes have no place in a successful CQE
    assert_eq!(c[mlx5::err_cqe::SYNDROME], 0);
    assert_eq!(c[mlx5::err_cqe::VENDOR_ERR_SYND], 0);

    let r = reference_cqe(mlx5::CQE_RESP_WR_IMM, false, 1, 0, 0, 3, 8);
    assert_eq!(r[63], 0x10);
}

#[test]
fn error_cqe_fields() {
    let c = reference_cqe(
        mlx5::CQE_REQ_ERR,
        false,
        0x0102,
        CqeSyndrome::RemoteAccess.as_u8(),
        0x88,
        0x00ff_0001,
        999,
    );
    assert_eq!(c[63], 0xd0);
    assert_eq!(mlx5::cqe_opcode(c[63]), mlx5::CQE_REQ_ERR);
    assert_eq!(c[mlx5::err_cqe::SYNDROME], 0x13);
    assert_eq!(CqeSyndrome::known(c[55]), Some(CqeSyndrome::RemoteAccess));
    assert_eq!(c[mlx5::err_cqe::VENDOR_ERR_SYND], 0x88);
    assert_eq!(be32(&c, mlx5::err_cqe::S_WQE_OPCODE_QPN) & 0xff_ffff, 0xff_0001);
    assert_eq!(be16(&c, mlx5::err_cqe::WQE_COUNTER), 0x0102);
    assert_eq!(be32(&c, mlx5::cqe64::BYTE_CNT), 0, "no byte_cnt in an error CQE");
    // everything else is zero
    assert!(c[..54].iter().all(|&b| b == 0));

    let flushed = reference_cqe(mlx5::CQE_RESP_ERR, true, 0, 0x05, 0, 0, 0);
    assert_eq!(flushed[63], 0xe1);
    assert_eq!(CqeSyndrome::known(flushed[55]), Some(CqeSyndrome::WrFlush));
}

#[test]
fn syndromes_equal_the_header_and_decode() {
    for s in CqeSyndrome::ALL {
        assert_eq!(header_value(s.c_name()), Some(s.as_u8().into()), "{s:?}");
        assert!(!s.description().is_empty());
        assert!(s.to_string().contains(&format!("{:#04x}", s.as_u8())));
    }
    let known: Vec<u8> = (0..=255u8).filter(|&v| CqeSyndrome::known(v).is_some()).collect();
    assert_eq!(known, CqeSyndrome::ALL.iter().map(|s| s.as_u8()).collect::<Vec<_>>());
    assert_eq!(CqeSyndrome::known(0x22), Some(CqeSyndrome::RemoteAborted));
    assert_eq!(CqeSyndrome::known(0x00), None);
}
