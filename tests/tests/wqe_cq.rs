//! CQ polling on every backend: success, earlier completions consumed on the
//! way, error syndromes decoded, owner-bit phase across the ring's wrap,
//! budget exhaustion reported with what was expected and seen.

mod wqe_common;

use doorbell::{Device, LaunchConfig};
use doorbell_kernels::mlx5::cq::{classify_cqe, decode_poll_result, CqeState, POLL_RESULT_WORDS};
use doorbell_kernels::mlx5::{Completion, CqError, Cqe64, CqeSyndrome, CQE_REQ_ERR, CQE_RESP_ERR, CQE_RESP_SEND};
use doorbell_test_kernels::mlx5::mlx5_poll_cq;
use doorbell_tests::load_test_kernel;
use doorbell_tests::per_backend;
use wqe_common::*;

const QPN: u32 = 0x00ab_cdef;
const SHORT_BUDGET_NS: u64 = 2_000_000;
const LONG_BUDGET_NS: u64 = 5_000_000_000;

struct Polled {
    results: Vec<Result<Completion, CqError>>,
    consumer: u32,
    cq_dbr: u32,
}

fn poll(dev: &Device, cq_size: u32, cqes: &[[u8; 64]], ci: u32, targets: &[u32], budget_ns: u64) -> Polled {
    let f = load_test_kernel::<mlx5_poll_cq>(dev).unwrap();
    let mut qp = TestQp::new(dev, 4, 0, QPN, cq_size, cqes, ci);
    let dtargets = dev.alloc_from(targets).unwrap();
    let mut out = dev.alloc_zeroed::<u32>(targets.len() * POLL_RESULT_WORDS).unwrap();
    let s = dev.new_stream().unwrap();
    // SAFETY: the handle's buffers live in `qp`; 8 words per target.
    unsafe {
        s.launch(
            &f,
            LaunchConfig::linear(1, 32),
            (qp.handle(), dtargets.as_ptr(), targets.len() as u32, budget_ns, out.as_mut_ptr()),
        )
        .unwrap()
    };
    s.synchronize().unwrap();
    let words = out.to_host().unwrap();
    let results = words
        .chunks(POLL_RESULT_WORDS)
        .map_while(|c| decode_poll_result(c.try_into().unwrap()))
        .collect();
    Polled {
        results,
        consumer: qp.consumer.to_host().unwrap()[0],
        cq_dbr: qp.cq_dbr.to_host().unwrap()[0],
    }
}

fn be(v: u32) -> u32 {
    v.swap_bytes()
}

per_backend! {
    fn success_completion_is_returned_and_consumed(dev: Device) {
        let p = poll(&dev, 4, &[req_cqe(false, 7, QPN, 4096)], 0, &[7], LONG_BUDGET_NS);
        assert_eq!(
            p.results,
            vec![Ok(Completion {
                wqe_counter: 7,
                cq_index: 0,
                byte_cnt: 4096,
                qpn: QPN
            })],
            "{dev:?}"
        );
        assert_eq!(p.consumer, 1);
        assert_eq!(p.cq_dbr, be(1), "CQ doorbell record holds the BE32 consumer index");
    }
}

per_backend! {
    fn earlier_completions_are_consumed_until_the_target(dev: Device) {
        let cqes = [req_cqe(false, 31, QPN, 0), req_cqe(false, 63, QPN, 0), req_cqe(false, 95, QPN, 0)];
        let p = poll(&dev, 8, &cqes, 0, &[63, 80], LONG_BUDGET_NS);
        assert_eq!(p.results[0].unwrap().cq_index, 1, "{dev:?}");
        // 95 is past 80: every WQE up to 95 is done, so 80 is.
        assert_eq!(p.results[1].unwrap().wqe_counter, 95);
        assert_eq!(p.consumer, 3);
    }
}

per_backend! {
    fn error_completions_are_decoded_into_typed_errors(dev: Device) {
        let cqes = [req_cqe(false, 3, QPN, 0), err_cqe(CQE_REQ_ERR, false, 4, 0x13, 0x88, 0x08, QPN)];
        let p = poll(&dev, 4, &cqes, 0, &[3, 9], LONG_BUDGET_NS);
        assert_eq!(p.results.len(), 2, "{dev:?}");
        assert_eq!(
            p.results[1],
            Err(CqError::Failed {
                opcode: CQE_REQ_ERR,
                syndrome: CqeSyndrome::RemoteAccess,
                vendor_syndrome: 0x88,
                wqe_counter: 4,
                wqe_opcode: 0x08,
                qpn: QPN,
                cq_index: 1
            })
        );
        assert_eq!(p.consumer, 2, "the error CQE is consumed, not left for the next poll");
        // A responder error, and an opcode a send CQ never holds.
        let p = poll(
            &dev,
            4,
            &[err_cqe(CQE_RESP_ERR, false, 0, 0x05, 0, 0, QPN)],
            0,
            &[0],
            LONG_BUDGET_NS,
        );
        assert!(
            matches!(
                p.results[0],
                Err(CqError::Failed {
                    opcode: CQE_RESP_ERR,
                    syndrome: CqeSyndrome::WrFlush,
                    ..
                })
            ),
            "{:?}",
            p.results
        );
        let weird = Cqe64 {
            opcode: CQE_RESP_SEND,
            wqe_counter: 2,
            ..Default::default()
        }
        .to_bytes();
        let p = poll(&dev, 4, &[weird], 0, &[2], LONG_BUDGET_NS);
        assert_eq!(
            p.results,
            vec![Err(CqError::UnexpectedOpcode {
                opcode: CQE_RESP_SEND,
                wqe_counter: 2,
                cq_index: 0
            })]
        );
        // Unknown syndromes are kept, not lost.
        let p = poll(&dev, 4, &[err_cqe(CQE_REQ_ERR, false, 0, 0x7e, 0, 0, QPN)], 0, &[0], LONG_BUDGET_NS);
        assert!(matches!(
            p.results[0],
            Err(CqError::Failed {
                syndrome: CqeSyndrome::Other(0x7e),
                ..
            })
        ));
    }
}

per_backend! {
    fn owner_bit_phase_follows_the_ring_across_its_wrap(dev: Device) {
        // cq_size 4, consumer at 6: entries 2, 3 belong to pass 1 (owner 1),
        // entries 0, 1 to pass 2 (owner 0) — the NIC wrote them after wrapping.
        let cqes = [
            req_cqe(false, 10, QPN, 0),
            req_cqe(false, 11, QPN, 0),
            req_cqe(true, 8, QPN, 0),
            req_cqe(true, 9, QPN, 0),
        ];
        let p = poll(&dev, 4, &cqes, 6, &[8, 9, 10, 11, 12], SHORT_BUDGET_NS);
        let idx: Vec<u32> = p.results.iter().take(4).map(|r| r.unwrap().cq_index).collect();
        assert_eq!(idx, vec![6, 7, 8, 9], "{dev:?}: {:?}", p.results);
        // Entry 2 still holds pass 1's CQE (owner 1): at consumer index 10
        // (pass 2) it is stale, and the poll reports it instead of hanging.
        assert_eq!(
            p.results[4],
            Err(CqError::Timeout {
                wqe_counter: 12,
                cq_index: 10,
                expected_owner: 0,
                seen_op_own: 0x01
            })
        );
        assert_eq!(p.consumer, 10);
        assert_eq!(p.cq_dbr, be(10));
    }
}

per_backend! {
    fn budget_exhaustion_reports_expected_and_seen(dev: Device) {
        // An empty CQ, then a CQE of the previous pass (owner 1 at pass 0):
        // neither is taken, and the error says what the poll saw.
        for (cqes, seen_op_own) in [(vec![], 0xf0), (vec![req_cqe(true, 5, QPN, 0)], 0x01)] {
            let p = poll(&dev, 4, &cqes, 0, &[5], SHORT_BUDGET_NS);
            assert_eq!(
                p.results,
                vec![Err(CqError::Timeout {
                    wqe_counter: 5,
                    cq_index: 0,
                    expected_owner: 0,
                    seen_op_own
                })],
                "{dev:?}"
            );
            assert_eq!(p.consumer, 0, "nothing consumed");
        }
    }
}

#[test]
fn classify_agrees_with_hand_built_images() {
    let w = |b: [u8; 64]| Cqe64::bytes_to_words(&b);
    assert!(matches!(
        classify_cqe(&w(invalid_cqe()), 0, 4),
        CqeState::Empty {
            expected_owner: 0,
            op_own: 0xf0
        }
    ));
    assert!(matches!(
        classify_cqe(&w(req_cqe(true, 1, 1, 1)), 4, 4),
        CqeState::Done(Completion { wqe_counter: 1, .. })
    ));
    assert!(matches!(
        classify_cqe(&w(req_cqe(true, 1, 1, 1)), 8, 4),
        CqeState::Empty { expected_owner: 0, .. }
    ));
}

/// The CQE images built with the descriptor are byte-identical to those
/// rdma-core's structs give (so the device tests above poll real layouts).
#[cfg(feature = "mlx5-shim")]
#[test]
fn hand_built_cqes_match_rdma_core_structs() {
    use rand::Rng;
    use rdma_sys_ext::shim::reference_cqe;
    let mut r = rng(9);
    for _ in 0..2000 {
        let (owner, counter, qpn, bytes): (bool, u16, u32, u32) = (r.gen(), r.gen(), r.gen::<u32>() & 0xff_ffff, r.gen());
        assert_eq!(
            req_cqe(owner, counter, qpn, bytes),
            reference_cqe(0, owner, counter, 0, 0, qpn, bytes)
        );
        let (synd, vendor): (u8, u8) = (r.gen(), r.gen());
        for op in [CQE_REQ_ERR, CQE_RESP_ERR] {
            assert_eq!(
                err_cqe(op, owner, counter, synd, vendor, 0, qpn),
                reference_cqe(op, owner, counter, synd, vendor, qpn, bytes)
            );
        }
    }
}

per_backend! {
    /// Polling CQEs made by rdma-core's structs on every backend.
    #[cfg(feature = "mlx5-shim")]
    fn polling_rdma_core_cqes(dev: Device) {
        use rdma_sys_ext::shim::reference_cqe;
        let cqes = [
            reference_cqe(0, false, 41, 0, 0, QPN, 77),
            reference_cqe(CQE_REQ_ERR, false, 42, 0x15, 0x81, QPN, 0),
        ];
        let p = poll(&dev, 2, &cqes, 0, &[41, 42], LONG_BUDGET_NS);
        assert_eq!(
            p.results[0],
            Ok(Completion {
                wqe_counter: 41,
                cq_index: 0,
                byte_cnt: 77,
                qpn: QPN
            }),
            "{dev:?}"
        );
        assert!(matches!(
            p.results[1],
            Err(CqError::Failed {
                syndrome: CqeSyndrome::TransportRetryExc,
                vendor_syndrome: 0x81,
                wqe_counter: 42,
                ..
            })
        ));
    }
}
