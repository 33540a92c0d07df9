//! Byte-exact WQEs: the descriptor-generated host encoder, rdma-core's own
//! mlx5dv.h helpers (through rdma_sys_ext::shim) and the device builders run
//! on every backend (CPU emulator, GPU when present) agree on thousands of
//! random WQEs of every op.

mod wqe_common;

use doorbell::{Device, LaunchConfig};
use doorbell_kernels::mlx5::{self as m, AtomicSeg, Cqe64, CtrlSeg, DataSeg, ErrCqe, RaddrSeg, WqeOp, WqeRequest};
use doorbell_test_kernels::mlx5::mlx5_write_wqes;
use doorbell_tests::load_test_kernel;
use doorbell_tests::per_backend;
use rand::Rng;
use wqe_common::*;

fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(b[off..off + 4].try_into().unwrap())
}
fn be64(b: &[u8], off: usize) -> u64 {
    u64::from_be_bytes(b[off..off + 8].try_into().unwrap())
}

/// The host encoder against a byte-by-byte reading of the mlx5 layouts
/// (independent of the descriptor macro and of rdma-core).
#[test]
fn host_encoder_matches_hand_computed_layouts() {
    for (i, r) in random_requests(1, 3000).iter().enumerate() {
        let op = r.op().unwrap();
        let b = r.to_bytes();
        let ds = op.ds() as u32;
        assert_eq!(be32(&b, 0), (r.wqe_index as u32) << 8 | op.opcode() as u32, "#{i} {op:?}");
        assert_eq!(be32(&b, 4), (r.qpn & 0xff_ffff) << 8 | ds);
        assert_eq!(&b[8..11], &[0, 0, 0]);
        let fm = (if r.flags & 2 != 0 { 0x80 } else { 0 })
            | (if r.flags & 1 != 0 { 0x08 } else { 0 })
            | (if r.flags & 4 != 0 { 0x02 } else { 0 });
        assert_eq!(b[11], fm);
        assert_eq!(be32(&b, 12), if op == WqeOp::WriteImm { r.imm } else { 0 });
        match op {
            WqeOp::Nop => assert!(b[16..].iter().all(|&x| x == 0)),
            WqeOp::Write | WqeOp::WriteImm | WqeOp::Read => {
                assert_eq!((be64(&b, 16), be32(&b, 24), be32(&b, 28)), (r.raddr, r.rkey, 0));
                assert_eq!((be32(&b, 32), be32(&b, 36), be64(&b, 40)), (r.len, r.lkey, r.laddr));
                assert!(b[48..].iter().all(|&x| x == 0));
            }
            WqeOp::FetchAdd | WqeOp::CompareSwap => {
                assert_eq!((be64(&b, 16), be32(&b, 24), be32(&b, 28)), (r.raddr, r.rkey, 0));
                let (sa, cmp) = if op == WqeOp::FetchAdd { (r.add, 0) } else { (r.swap, r.compare) };
                assert_eq!((be64(&b, 32), be64(&b, 40)), (sa, cmp));
                assert_eq!((be32(&b, 48), be32(&b, 52), be64(&b, 56)), (8, r.lkey, r.laddr));
            }
        }
        assert_eq!(r.wqe_len(), ds as usize * 16);
    }
}

#[cfg(feature = "mlx5-shim")]
#[test]
fn host_encoder_matches_rdma_core_helpers() {
    for (i, r) in random_requests(2, 6000).iter().enumerate() {
        let want = rdma_sys_ext::shim::reference_wqe(&shim_params(r));
        let got = r.to_bytes();
        assert_eq!(want.len(), r.wqe_len(), "#{i}");
        assert_eq!(
            &got[..want.len()],
            &want[..],
            "#{i} {:?}\n{}vs rdma-core\n{}",
            r.op(),
            m::dump::format_hex(&got),
            m::dump::format_hex(&want)
        );
        assert!(got[want.len()..].iter().all(|&x| x == 0));
    }
}

per_backend! {
    fn device_builders_match_the_host_encoder_on_every_backend(dev: Device) {
        let n = 4096usize;
        let reqs = random_requests(3, n);
        let want: Vec<[u8; 64]> = reqs.iter().map(WqeRequest::to_bytes).collect();
        let f = load_test_kernel::<mlx5_write_wqes>(&dev).unwrap();
        let dreqs = dev.alloc_from(&raw(&reqs)).unwrap();
        // Poisoned output: every byte must be written, including padding.
        let mut out = dev.alloc_from(&vec![0xdead_beefu32; n * 16]).unwrap();
        let s = dev.new_stream().unwrap();
        let cfg = if dev.is_gpu() {
            LaunchConfig::linear(8, 128)
        } else {
            LaunchConfig::linear(2, 64)
        };
        // SAFETY: n requests, 16 n output words.
        unsafe {
            s.launch(&f, cfg, (dreqs.as_ptr() as *const WqeRequest, n as u32, out.as_mut_ptr()))
                .unwrap()
        };
        s.synchronize().unwrap();
        let got = out.to_host().unwrap();
        for i in 0..n {
            let bytes: Vec<u8> = got[i * 16..i * 16 + 16].iter().flat_map(|w| w.to_le_bytes()).collect();
            assert_eq!(bytes, want[i], "WQE {i} ({:?}) on {dev:?}", reqs[i].op());
        }
    }
}

#[cfg(feature = "mlx5-shim")]
per_backend! {
    fn device_builders_match_rdma_core_helpers_on_every_backend(dev: Device) {
        let n = 1536usize;
        let reqs = random_requests(4, n);
        let f = load_test_kernel::<mlx5_write_wqes>(&dev).unwrap();
        let dreqs = dev.alloc_from(&raw(&reqs)).unwrap();
        let mut out = dev.alloc_zeroed::<u32>(n * 16).unwrap();
        let s = dev.new_stream().unwrap();
        // SAFETY: as above.
        unsafe {
            s.launch(
                &f,
                LaunchConfig::linear(1, 96),
                (dreqs.as_ptr() as *const WqeRequest, n as u32, out.as_mut_ptr()),
            )
            .unwrap()
        };
        s.synchronize().unwrap();
        let got = out.to_host().unwrap();
        for (i, r) in reqs.iter().enumerate() {
            let want = rdma_sys_ext::shim::reference_wqe(&shim_params(r));
            let bytes: Vec<u8> = got[i * 16..i * 16 + 16].iter().flat_map(|w| w.to_le_bytes()).collect();
            assert_eq!(&bytes[..want.len()], &want[..], "WQE {i} ({:?}) on {dev:?}", r.op());
        }
    }
}

#[test]
fn segment_field_accessors_agree_with_whole_segment_encoding() {
    let mut rng = rng(5);
    for _ in 0..2000 {
        let c = CtrlSeg {
            opcode: rng.gen(),
            wqe_index: rng.gen(),
            opmod: rng.gen(),
            ds: rng.gen(),
            qpn: rng.gen::<u32>() & 0xff_ffff,
            signature: rng.gen(),
            dci_stream_channel_id: rng.gen(),
            fm_ce_se: rng.gen(),
            imm: rng.gen(),
        };
        let b = c.to_bytes();
        assert_eq!(CtrlSeg::from_bytes(&b), c);
        assert_eq!(CtrlSeg::from_words(&c.to_words()), c);
        // Field by field into a zero image gives the same bytes.
        let mut img = [0u8; 16];
        CtrlSeg::set_imm(&mut img, c.imm);
        CtrlSeg::set_qpn(&mut img, c.qpn);
        CtrlSeg::set_opcode(&mut img, c.opcode);
        CtrlSeg::set_fm_ce_se(&mut img, c.fm_ce_se);
        CtrlSeg::set_dci_stream_channel_id(&mut img, c.dci_stream_channel_id);
        CtrlSeg::set_wqe_index(&mut img, c.wqe_index);
        CtrlSeg::set_signature(&mut img, c.signature);
        CtrlSeg::set_ds(&mut img, c.ds);
        CtrlSeg::set_opmod(&mut img, c.opmod);
        assert_eq!(img, b);
        assert_eq!(CtrlSeg::get_qpn(&b), c.qpn);
        assert_eq!(CtrlSeg::get_wqe_index_words(&c.to_words()), c.wqe_index);
        // A setter only touches its own bits.
        let mut w = c.to_words();
        CtrlSeg::set_wqe_index_words(&mut w, !c.wqe_index);
        assert_eq!(
            CtrlSeg::from_words(&w),
            CtrlSeg {
                wqe_index: !c.wqe_index,
                ..c
            }
        );

        let e = ErrCqe {
            srqn: rng.gen(),
            vendor_err_synd: rng.gen(),
            syndrome: rng.gen(),
            qpn: rng.gen::<u32>() & 0xff_ffff,
            wqe_opcode: rng.gen(),
            wqe_counter: rng.gen(),
            signature: rng.gen(),
            owner: rng.gen(),
            opcode: rng.gen_range(0..16),
        };
        assert_eq!(ErrCqe::from_bytes(&e.to_bytes()), e);
        let eb = e.to_bytes();
        assert_eq!(
            (eb[54], eb[55], be32(&eb, 56), eb[63]),
            (
                e.vendor_err_synd,
                e.syndrome,
                (e.wqe_opcode as u32) << 24 | e.qpn,
                e.opcode << 4 | e.owner as u8
            )
        );
    }
    // Out-of-range values lose their high bits, never spill into neighbours.
    let mut img = [0u8; 16];
    CtrlSeg::set_qpn(&mut img, 0xffff_ffff);
    assert_eq!(img[4..8], [0xff, 0xff, 0xff, 0x00]);
    assert_eq!(CtrlSeg::QPN_MAX, 0xff_ffff);
    assert_eq!(CtrlSeg::WQE_INDEX_MAX, 0xffff);
}

#[test]
fn descriptor_layouts_match_the_header_checked_offsets() {
    use rdma_sys_ext::mlx5 as r;
    let off = |layout: &[(&str, u32, u32, u32, u32)], name: &str| layout.iter().find(|f| f.0 == name).unwrap().1 as usize;
    assert_eq!(off(&CtrlSeg::LAYOUT, "opcode"), r::ctrl::OPMOD_IDX_OPCODE);
    assert_eq!(off(&CtrlSeg::LAYOUT, "qpn"), r::ctrl::QPN_DS);
    assert_eq!(off(&CtrlSeg::LAYOUT, "signature"), r::ctrl::SIGNATURE);
    assert_eq!(off(&CtrlSeg::LAYOUT, "dci_stream_channel_id"), r::ctrl::DCI_STREAM_CHANNEL_ID);
    assert_eq!(off(&CtrlSeg::LAYOUT, "fm_ce_se"), r::ctrl::FM_CE_SE);
    assert_eq!(off(&CtrlSeg::LAYOUT, "imm"), r::ctrl::IMM);
    assert_eq!(off(&RaddrSeg::LAYOUT, "raddr"), r::raddr::RADDR);
    assert_eq!(off(&RaddrSeg::LAYOUT, "rkey"), r::raddr::RKEY);
    assert_eq!(off(&DataSeg::LAYOUT, "byte_count"), r::data::BYTE_COUNT);
    assert_eq!(off(&DataSeg::LAYOUT, "lkey"), r::data::LKEY);
    assert_eq!(off(&DataSeg::LAYOUT, "addr"), r::data::ADDR);
    assert_eq!(off(&AtomicSeg::LAYOUT, "swap_add"), r::atomic::SWAP_ADD);
    assert_eq!(off(&AtomicSeg::LAYOUT, "compare"), r::atomic::COMPARE);
    assert_eq!(off(&Cqe64::LAYOUT, "byte_cnt"), r::cqe64::BYTE_CNT);
    assert_eq!(off(&Cqe64::LAYOUT, "qpn"), r::cqe64::SOP_DROP_QPN);
    assert_eq!(off(&Cqe64::LAYOUT, "wqe_counter"), r::cqe64::WQE_COUNTER);
    assert_eq!(off(&Cqe64::LAYOUT, "opcode"), r::cqe64::OP_OWN);
    assert_eq!(off(&Cqe64::LAYOUT, "owner"), r::cqe64::OP_OWN);
    assert_eq!(off(&ErrCqe::LAYOUT, "syndrome"), r::err_cqe::SYNDROME);
    assert_eq!(off(&ErrCqe::LAYOUT, "vendor_err_synd"), r::err_cqe::VENDOR_ERR_SYND);
    assert_eq!(off(&ErrCqe::LAYOUT, "qpn"), r::err_cqe::S_WQE_OPCODE_QPN);
    assert_eq!(off(&ErrCqe::LAYOUT, "wqe_counter"), r::err_cqe::WQE_COUNTER);
}

/// The descriptor offsets against the C compiler's `offsetof`.
#[cfg(feature = "mlx5-shim")]
#[test]
fn layouts_match_the_header_offsets() {
    use rdma_sys_ext::shim::header_value;
    let check = |layout: &[(&str, u32, u32, u32, u32)], field: &str, c: &str| {
        let ours = layout.iter().find(|f| f.0 == field).unwrap().1 as u64;
        assert_eq!(Some(ours), header_value(c), "{field} vs {c}");
    };
    check(&CtrlSeg::LAYOUT, "imm", "offsetof(mlx5_wqe_ctrl_seg,imm)");
    check(&CtrlSeg::LAYOUT, "fm_ce_se", "offsetof(mlx5_wqe_ctrl_seg,fm_ce_se)");
    check(
        &CtrlSeg::LAYOUT,
        "dci_stream_channel_id",
        "offsetof(mlx5_wqe_ctrl_seg,dci_stream_channel_id)",
    );
    check(&CtrlSeg::LAYOUT, "qpn", "offsetof(mlx5_wqe_ctrl_seg,qpn_ds)");
    check(&RaddrSeg::LAYOUT, "rkey", "offsetof(mlx5_wqe_raddr_seg,rkey)");
    check(&DataSeg::LAYOUT, "addr", "offsetof(mlx5_wqe_data_seg,addr)");
    check(&AtomicSeg::LAYOUT, "compare", "offsetof(mlx5_wqe_atomic_seg,compare)");
    check(&Cqe64::LAYOUT, "byte_cnt", "offsetof(mlx5_cqe64,byte_cnt)");
    check(&Cqe64::LAYOUT, "wqe_counter", "offsetof(mlx5_cqe64,wqe_counter)");
    check(&Cqe64::LAYOUT, "opcode", "offsetof(mlx5_cqe64,op_own)");
    check(&ErrCqe::LAYOUT, "syndrome", "offsetof(mlx5_err_cqe,syndrome)");
    check(&ErrCqe::LAYOUT, "vendor_err_synd", "offsetof(mlx5_err_cqe,vendor_err_synd)");
    check(&ErrCqe::LAYOUT, "qpn", "offsetof(mlx5_err_cqe,s_wqe_opcode_qpn)");
    assert_eq!(header_value("sizeof(mlx5_wqe_ctrl_seg)"), Some(CtrlSeg::SIZE as u64));
    assert_eq!(header_value("sizeof(mlx5_cqe64)"), Some(Cqe64::SIZE as u64));
}
