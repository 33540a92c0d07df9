//! WQEs built per second by one warp and by one block (the device builder
//! only: registers → four 16-byte stores into a ring in device memory), on
//! every backend. Prints the rates; asserts the ring holds what the host
//! encoder makes, so the measured loop is the real one.

mod wqe_common;

use doorbell::{Device, LaunchConfig};
use doorbell_kernels::mlx5::WqeRequest;
use doorbell_test_kernels::mlx5::mlx5_bench_write_wqes;
use doorbell_tests::load_test_kernel;
use doorbell_tests::per_backend;
use wqe_common::*;

fn run(dev: &Device, warps: u32, k: u32, ring_wqes: u32) -> f64 {
    let reqs = random_requests(21, 32);
    let f = load_test_kernel::<mlx5_bench_write_wqes>(dev).unwrap();
    let dreqs = dev.alloc_from(&raw(&reqs)).unwrap();
    let mut ring = dev.alloc_zeroed::<u32>((warps * ring_wqes * 16) as usize).unwrap();
    let mut ns = dev.alloc_zeroed::<u64>(warps as usize).unwrap();
    let s = dev.new_stream().unwrap();
    let launch = |ring: *mut u32, ns: *mut u64| {
        // SAFETY: 32 requests, `warps` rings of ring_wqes blocks, one word per warp.
        unsafe {
            s.launch(
                &f,
                LaunchConfig::linear(1, warps * 32),
                (dreqs.as_ptr() as *const WqeRequest, ring, ring_wqes, k, ns),
            )
            .unwrap()
        };
    };
    launch(ring.as_mut_ptr(), ns.as_mut_ptr()); // warm-up
    launch(ring.as_mut_ptr(), ns.as_mut_ptr());
    s.synchronize().unwrap();
    let words = ring.to_host().unwrap();
    let rounds = k / 32;
    for w in 0..warps as usize {
        for lane in 0..32u32 {
            let idx = (rounds - 1) * 32 + lane;
            let base = reqs[lane as usize];
            let want = WqeRequest {
                wqe_index: idx as u16,
                raddr: base.raddr.wrapping_add((rounds - 1) as u64 * base.len as u64),
                ..base
            }
            .to_bytes();
            let at = (w * ring_wqes as usize + (idx & (ring_wqes - 1)) as usize) * 16;
            let got: Vec<u8> = words[at..at + 16].iter().flat_map(|x| x.to_le_bytes()).collect();
            assert_eq!(got, want, "warp {w} lane {lane} on {dev:?}");
        }
    }
    let max_ns = ns.to_host().unwrap().into_iter().max().unwrap();
    // Every warp timed its k WQEs with %globaltimer: a zero would mean the
    // timing code never ran (or the clock does not move).
    assert!(max_ns > 0, "no warp recorded a build time on {dev:?}");
    (warps as f64 * k as f64) / (max_ns as f64 * 1e-9)
}

per_backend! {
    fn wqes_built_per_second_by_one_warp_and_one_block(dev: Device) {
        let (k, block_warps) = if dev.is_gpu() { (32 * 4096, 32) } else { (32 * 64, 2) };
        let one_warp = run(&dev, 1, k, 256);
        let block = run(&dev, block_warps, k, 256);
        println!(
            "{}: WQE build rate — one warp: {:.1} M WQE/s; one block of {block_warps} warps: {:.1} M WQE/s ({:.1}× a warp); {k} WQEs per warp",
            dev.name(),
            one_warp / 1e6,
            block / 1e6,
            block / one_warp
        );
    }
}
