use super::mailbox::put_bits;
use super::*;

#[test]
fn bits_are_big_endian_msb_first() {
    let mut b = [0u8; 8];
    put_bits(&mut b, 0x13, 2, 3); // pm_state-like: bits 19..21
    assert_eq!(b, [0, 0, 0x18, 0, 0, 0, 0, 0]);
    put_bits(&mut b, 0x28, 24, 0xabcdef);
    assert_eq!(&b[5..8], &[0xab, 0xcd, 0xef]);
    assert_eq!(get_bits(&b, 0x28, 24), 0xabcdef);
    assert_eq!(get_bits(&b, 0x13, 2), 3);
}

#[test]
fn too_wide_values_are_refused() {
    let mut m = Mailbox::new(Command::CreateQp);
    let e = m.set(CREATE_QP_QPC, qpc::LOG_SQ_SIZE, 16).unwrap_err();
    assert!(matches!(e, PrmError::ValueTooWide { bits: 4, value: 16, .. }), "{e}");
    assert!(e.to_string().contains("log_sq_size"), "{e}");
}

#[test]
fn opcode_is_first_and_output_parses() {
    let m = to_err(0x1234).unwrap();
    assert_eq!(&m.bytes()[..2], &[0x05, 0x07]);
    assert_eq!(&m.bytes()[9..12], &[0x00, 0x12, 0x34]);
    let mut out = m.out_buffer();
    out[8..12].copy_from_slice(&0x00_0a_bc_deu32.to_be_bytes());
    assert_eq!(created_number(Command::CreateQp, &out).unwrap(), 0x0abcde);
    out[0] = 0x3;
    out[4..8].copy_from_slice(&0xdead_beefu32.to_be_bytes());
    let e = check_out(Command::CreateQp, &out).unwrap_err();
    assert_eq!(
        e,
        PrmError::Failed {
            command: "CREATE_QP",
            opcode: 0x500,
            status: 3,
            syndrome: 0xdead_beef
        }
    );
    assert!(e.to_string().contains("BAD_PARAM_ERR"), "{e}");
    assert!(matches!(check_out(Command::CreateQp, &out[..8]), Err(PrmError::ShortOutput { .. })));
}

#[test]
fn rtr_roce_path_and_mtu() {
    let p = RtrParams {
        qpn: 7,
        port: 1,
        mtu: 4096,
        remote_qpn: 9,
        next_rcv_psn: 0x123456,
        max_rd_atomic: 16,
        min_rnr_nak: 12,
        sl: 0,
        remote: RemoteAddress::Roce {
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            sgid_index: 3,
            hop_limit: 64,
            tclass: 0,
            rmac: [0x02, 0x11, 0x22, 0x33, 0x44, 0x55],
            udp_sport: 0xc001,
        },
        log_msg_max: 30,
    };
    let m = init2rtr(&p).unwrap();
    let c = transition_qpc(Command::Init2RtrQp);
    let a = transition_path(Command::Init2RtrQp);
    assert_eq!(m.get(c, qpc::MTU), 5);
    assert_eq!(m.get(c, qpc::LOG_RRA_MAX), 4);
    assert_eq!(m.get(a, ads::GRH), 1);
    assert_eq!(m.get(a, ads::RMAC_47_32), 0x0211);
    assert_eq!(m.get(a, ads::RMAC_31_0), 0x2233_4455);
    assert_eq!(m.get(a, ads::RGID_RIP) >> 112, 0xfe80);
    let bad = init2rtr(&RtrParams { mtu: 1500, ..p }).unwrap_err();
    assert!(bad.to_string().contains("1500"), "{bad}");
    let bad = init2rtr(&RtrParams {
        next_rcv_psn: 1 << 24,
        ..p
    });
    assert!(matches!(bad, Err(PrmError::BadArgument { .. })));
}
