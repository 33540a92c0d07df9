//! The whole send path (reserve → write → sync_warp → ordered submit →
//! doorbell record → doorbell) from many warps at once, on every backend.

mod wqe_common;

use doorbell::{Device, LaunchConfig};
use doorbell_kernels::mlx5::wqe::FLAG_SIGNALED;
use doorbell_kernels::mlx5::{CtrlSeg, WqeOp, WqeRequest};
use doorbell_test_kernels::mlx5::mlx5_post_wqes;
use doorbell_tests::load_test_kernel;
use doorbell_tests::per_backend;
use rand::Rng;
use wqe_common::*;

const QPN: u32 = 0x12_3456;

/// Posts `n` random non-NOP requests (told apart by `raddr`) starting at
/// producer index `start`, and checks every basic block, the counters, the
/// doorbell record and the doorbell.
fn post_and_check(dev: &Device, sq_size: u32, start: u32, n: usize, cfg: LaunchConfig, seed: u64) {
    let mut r = rng(seed);
    let ops = [WqeOp::Write, WqeOp::WriteImm, WqeOp::Read, WqeOp::FetchAdd, WqeOp::CompareSwap];
    let reqs: Vec<WqeRequest> = (0..n)
        .map(|i| WqeRequest {
            raddr: (i as u64) << 32 | r.gen::<u32>() as u64,
            ..random_request(&mut r, ops[i % ops.len()])
        })
        .collect();
    let f = load_test_kernel::<mlx5_post_wqes>(dev).unwrap();
    let mut qp = TestQp::new(dev, sq_size, start, QPN, 4, &[], 0);
    let dreqs = dev.alloc_from(&raw(&reqs)).unwrap();
    let warps = cfg.grid.0 * cfg.block.0 / 32;
    let mut status = dev.alloc_zeroed::<u32>(warps as usize).unwrap();
    let s = dev.new_stream().unwrap();
    // SAFETY: the handle's buffers live in `qp`; n <= sq_size; one status word per warp.
    unsafe {
        s.launch(
            &f,
            cfg,
            (
                qp.handle(),
                dreqs.as_ptr() as *const WqeRequest,
                n as u32,
                10_000_000_000u64,
                status.as_mut_ptr(),
            ),
        )
        .unwrap()
    };
    s.synchronize().unwrap();
    assert!(
        status.to_host().unwrap().iter().all(|&x| x == 1),
        "a warp's submit timed out on {dev:?}"
    );

    let end = start.wrapping_add(n as u32);
    assert_eq!(qp.producer.to_host().unwrap()[0], end);
    assert_eq!(qp.ready.to_host().unwrap()[0], end);
    let dbr = qp.sq_dbr.to_host().unwrap()[0];
    assert_eq!(
        dbr.to_le_bytes(),
        (end & 0xffff).to_be_bytes(),
        "doorbell record = BE32 SQ counter on {dev:?}"
    );

    let blocks = qp.sq_blocks();
    let mut seen = vec![false; n];
    let mut slot_of = vec![0u32; n];
    for k in 0..n as u32 {
        let idx = start.wrapping_add(k);
        let b = &blocks[(idx & (sq_size - 1)) as usize];
        let ctrl = CtrlSeg::from_bytes(b[..16].try_into().unwrap());
        assert_eq!(ctrl.wqe_index, idx as u16, "slot {idx} on {dev:?}");
        assert_eq!(ctrl.qpn, QPN);
        let i = u64::from_be_bytes(b[16..24].try_into().unwrap()) >> 32;
        let i = i as usize;
        assert!(i < n && !seen[i], "slot {idx} holds request {i} twice or out of range");
        seen[i] = true;
        slot_of[i] = k;
        let last_of_batch = i % 32 == 31 || i == n - 1;
        let want = WqeRequest {
            wqe_index: idx as u16,
            qpn: QPN,
            flags: (reqs[i].flags & !FLAG_SIGNALED) | if last_of_batch { FLAG_SIGNALED } else { 0 },
            ..reqs[i]
        };
        assert_eq!(b, &want.to_bytes(), "slot {idx}, request {i} on {dev:?}");
    }
    // Batches are contiguous: request i + 1 follows request i within a batch.
    for i in 0..n - 1 {
        if i % 32 != 31 {
            assert_eq!(slot_of[i + 1], slot_of[i] + 1, "batch of request {i} split on {dev:?}");
        }
    }
    // Ordered submit: the last doorbell rung is the one of the batch that
    // ends at the producer index.
    let last = &blocks[(end.wrapping_sub(1) & (sq_size - 1)) as usize];
    assert_eq!(
        qp.uar.to_host().unwrap()[0].to_le_bytes(),
        last[..8],
        "doorbell = first 8 bytes of the last ctrl segment on {dev:?}"
    );
}

per_backend! {
    fn warps_post_batches_in_order_and_ring_the_doorbell(dev: Device) {
        let cfg = if dev.is_gpu() {
            LaunchConfig::linear(16, 256)
        } else {
            LaunchConfig::linear(2, 64)
        };
        post_and_check(&dev, 1024, 0, 1000, cfg, 11);
    }
}

per_backend! {
    fn producer_index_wraps_the_ring_and_the_16_bit_wqe_index(dev: Device) {
        // Producer near u32::MAX: slots wrap the 64-entry ring, wqe_index wraps 2^16.
        post_and_check(&dev, 64, u32::MAX - 20, 64, LaunchConfig::linear(1, 64), 12);
        post_and_check(&dev, 128, 0xfff0, 37, LaunchConfig::linear(2, 32), 13);
    }
}

per_backend! {
    /// A batch that reserved slots and never rang (its warp died) makes the
    /// next submit time out; after that the queue is failed, and every later
    /// batch fails at once instead of waiting out its own budget.
    fn after_one_submit_times_out_later_batches_fail_fast(dev: Device) {
        use std::time::{Duration, Instant};
        let budget = Duration::from_millis(400);
        let f = load_test_kernel::<mlx5_post_wqes>(&dev).unwrap();
        let mut r = rng(7);
        let reqs: Vec<WqeRequest> = (0..32).map(|_| random_request(&mut r, WqeOp::Write)).collect();
        let dreqs = dev.alloc_from(&raw(&reqs)).unwrap();
        let mut qp = TestQp::new(&dev, 256, 0, QPN, 4, &[], 0);
        // Slot 0 reserved by a batch that never rings.
        qp.producer.copy_from_host(&[1]).unwrap();
        let s = dev.new_stream().unwrap();
        let mut post = || {
            let mut status = dev.alloc_zeroed::<u32>(1).unwrap();
            let t0 = Instant::now();
            // SAFETY: the handle's buffers live in `qp`; 32 requests <= sq_size; one warp, one status word.
            unsafe {
                s.launch(
                    &f,
                    LaunchConfig::linear(1, 32),
                    (
                        qp.handle(),
                        dreqs.as_ptr() as *const WqeRequest,
                        32u32,
                        budget.as_nanos() as u64,
                        status.as_mut_ptr(),
                    ),
                )
                .unwrap()
            };
            s.synchronize().unwrap();
            (status.to_host().unwrap()[0], t0.elapsed())
        };
        let (first, waited) = post();
        assert_eq!(first, 2, "{dev:?}: the first batch must time out");
        assert!(waited >= budget, "{dev:?}: it gave up after {waited:?}");
        for k in 0..3 {
            let (status, took) = post();
            assert_eq!(status, 2, "{dev:?}: batch {k} after the failure");
            assert!(took < budget / 2, "{dev:?}: batch {k} after the failure waited {took:?}");
        }
    }
}
