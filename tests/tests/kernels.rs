//! Behaviour of kernels on every backend: the same source, the same results.

use doorbell::{Backend, Device, Error, LaunchConfig};
use doorbell_example_kernels::fused_multiply_add;
use doorbell_test_kernels::testing::{self, atomics_and_fences, block_or_rounds, record_indices, shuffle_barrier_flag, trap_in_one_thread};
use doorbell_tests::backends;
use doorbell_tests::load_test_kernel;
use doorbell_tests::per_backend;

fn run_shuffle_barrier_flag(dev: &Device, threads: u32) -> Vec<u32> {
    let f = load_test_kernel::<shuffle_barrier_flag>(dev).unwrap();
    let input: Vec<u32> = (0..threads).map(|i| i.wrapping_mul(2_654_435_761) >> 7).collect();
    let dinput = dev.alloc_from(&input).unwrap();
    let mut out = dev.alloc_zeroed::<u32>(threads as usize).unwrap();
    let mut scratch = dev.alloc_zeroed::<u32>(33).unwrap();
    let mut flag = dev.alloc_zeroed::<u32>(1).unwrap();
    let mut status = dev.alloc_zeroed::<u32>(1).unwrap();
    let s = dev.new_stream().unwrap();
    // SAFETY: buffer sizes as the kernel documents.
    unsafe {
        s.launch(
            &f,
            LaunchConfig::linear(2, threads),
            (
                dinput.as_ptr(),
                out.as_mut_ptr(),
                scratch.as_mut_ptr(),
                flag.as_mut_ptr(),
                status.as_mut_ptr(),
            ),
        )
        .unwrap()
    };
    s.synchronize().unwrap();
    assert_eq!(
        status.to_host().unwrap(),
        vec![testing::STATUS_OK],
        "consumer block timed out on {dev:?}"
    );
    let sum = input.iter().fold(0u32, |a, &x| a.wrapping_add(x));
    let got = out.to_host().unwrap();
    let want: Vec<u32> = (0..threads).map(|t| sum.wrapping_add(t * 16)).collect();
    assert_eq!(got, want, "on {dev:?}");
    got
}

#[test]
fn warp_shuffle_block_barrier_and_release_acquire_flag_agree_across_backends() {
    for threads in [64, 96, 256] {
        let results: Vec<Vec<u32>> = backends().iter().map(|d| run_shuffle_barrier_flag(d, threads)).collect();
        for r in &results[1..] {
            assert_eq!(r, &results[0]);
        }
    }
}

per_backend! {
    /// `sync_threads_or` (`bar.red.or.pred`) is a barrier whose result every
    /// thread shares: rounds back to back, the one thread passing true moving
    /// (first, last, a middle warp, none), so a result left over from an
    /// earlier round, or one thread seeing another's, shows.
    fn sync_threads_or_gives_every_thread_the_blocks_or_round_after_round(dev: Device) {
        let threads = 96u32;
        let pick: Vec<u32> = vec![0, threads, 95, 40, threads + 7, 33, 1, threads];
        let want: Vec<u32> = pick.iter().map(|&p| (p < threads) as u32).chain([0]).collect();
        let f = load_test_kernel::<block_or_rounds>(&dev).unwrap();
        let dpick = dev.alloc_from(&pick).unwrap();
        let mut out = dev.alloc_zeroed::<u32>(pick.len() + 1).unwrap();
        let s = dev.new_stream().unwrap();
        // SAFETY: `pick` and `out` as the kernel documents.
        unsafe {
            s.launch(
                &f,
                LaunchConfig::linear(1, threads),
                (dpick.as_ptr(), pick.len() as u32, out.as_mut_ptr()),
            )
            .unwrap()
        };
        s.synchronize().unwrap();
        assert_eq!(out.to_host().unwrap(), want, "{}", dev.name());
    }
}

per_backend! {
    fn fused_multiply_add_is_bit_exact_on_every_backend(dev: Device) {
        let n = 100_003usize;
        let a: Vec<f32> = (0..n).map(|i| (i as f32).sin() * 1e3).collect();
        let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).cos()).collect();
        let c: Vec<f32> = (0..n).map(|i| (i % 17) as f32 * -0.1).collect();
        let want: Vec<u32> = (0..n).map(|i| a[i].mul_add(b[i], c[i]).to_bits()).collect();
        let m = dev.load_module(&doorbell_examples::USER_KERNELS).unwrap();
        let f = m.function::<fused_multiply_add>().unwrap();
        let (da, db, dc) = (
            dev.alloc_from(&a).unwrap(),
            dev.alloc_from(&b).unwrap(),
            dev.alloc_from(&c).unwrap(),
        );
        let mut out = dev.alloc_zeroed::<f32>(n).unwrap();
        let s = dev.new_stream().unwrap();
        // SAFETY: n elements each.
        unsafe {
            s.launch(
                &f,
                LaunchConfig::linear(3, 64),
                (da.as_ptr(), db.as_ptr(), dc.as_ptr(), out.as_mut_ptr(), n as u64),
            )
            .unwrap()
        };
        s.synchronize().unwrap();
        let got: Vec<u32> = out.to_host().unwrap().iter().map(|x| x.to_bits()).collect();
        assert!(got == want, "fma differs from f32::mul_add on {dev:?}");
    }
}

per_backend! {
    fn thread_block_grid_indices_and_lanes_match_cuda_numbering(dev: Device) {
        let cfg = LaunchConfig {
            grid: (2, 3, 1),
            block: (8, 4, 2),
            ..LaunchConfig::linear(1, 1)
        };
        let threads = 2 * 3 * 8 * 4 * 2;
        let f = load_test_kernel::<record_indices>(&dev).unwrap();
        let mut out = dev.alloc_zeroed::<u32>(threads * 9).unwrap();
        let s = dev.new_stream().unwrap();
        // SAFETY: 9 words per thread.
        unsafe { s.launch(&f, cfg, (out.as_mut_ptr(),)).unwrap() };
        s.synchronize().unwrap();
        let got = out.to_host().unwrap();
        for by in 0..3u32 {
            for bx in 0..2u32 {
                for tz in 0..2u32 {
                    for ty in 0..4u32 {
                        for tx in 0..8u32 {
                            let rank = tx + 8 * (ty + 4 * tz);
                            let g = ((bx + 2 * by) * 64 + rank) as usize;
                            assert_eq!(
                                &got[g * 9..g * 9 + 9],
                                &[tx, ty, tz, bx, by, 0, rank % 32, 64, 6],
                                "{dev:?} thread {g}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Runs `atomics_and_fences` on `dev` as `cfg` with its four words
/// (counter, done, out, status) and waits for it.
///
/// # Safety
/// Each word is a device-visible `u32`.
unsafe fn run_atomics_and_fences(dev: &Device, cfg: LaunchConfig, words: (*mut u32, *mut u32, *mut u32, *mut u32)) {
    let (f, s) = doorbell_tests::test_kernel::<atomics_and_fences>(dev);
    // SAFETY: the caller's promise.
    unsafe { s.launch(&f, cfg, words).unwrap() };
    s.synchronize().unwrap();
}

per_backend! {
    fn atomics_count_every_thread_and_release_acquire_publishes_the_total(dev: Device) {
        let mut counter = dev.alloc_zeroed::<u32>(1).unwrap();
        let mut done = dev.alloc_zeroed::<u32>(1).unwrap();
        let mut out = dev.alloc_zeroed::<u32>(1).unwrap();
        let mut status = dev.alloc_zeroed::<u32>(1).unwrap();
        let words = (counter.as_mut_ptr(), done.as_mut_ptr(), out.as_mut_ptr(), status.as_mut_ptr());
        // SAFETY: single words.
        unsafe { run_atomics_and_fences(&dev, LaunchConfig::linear(4, 96), words) };
        assert_eq!(status.to_host().unwrap()[0], testing::STATUS_OK);
        assert_eq!(out.to_host().unwrap()[0], 4 * 96, "{dev:?}");
    }
}

#[test]
fn a_trapping_thread_fails_the_launch_instead_of_hanging() {
    let dev = Device::emulator(0);
    let (f, s) = doorbell_tests::test_kernel::<trap_in_one_thread>(&dev);
    // SAFETY: no pointers.
    unsafe { s.launch(&f, LaunchConfig::linear(2, 64), (17,)).unwrap() };
    let err = s.synchronize().unwrap_err();
    let msg = err.to_string();
    doorbell_tests::assert_emulator_failure(&err, "trap_in_one_thread");
    assert!(msg.contains("trap") && msg.contains("[17, 0, 0]"), "{msg}");
    // The stream stays usable after reporting the error.
    // SAFETY: as above; no thread traps with who = 999.
    unsafe { s.launch(&f, LaunchConfig::linear(1, 32), (999,)).unwrap() };
    s.synchronize().unwrap();
}

/// Polls `s.query()` (bounded) until it is not `Ok(false)`.
fn query_until_settled(s: &doorbell::Stream) -> doorbell::Result<bool> {
    let t0 = std::time::Instant::now();
    loop {
        match s.query() {
            Ok(false) if t0.elapsed() < std::time::Duration::from_secs(30) => std::thread::sleep(std::time::Duration::from_millis(1)),
            r => return r,
        }
    }
}

#[test]
fn query_reports_a_kernel_failure_without_waiting() {
    let dev = Device::emulator(0);
    let (f, s) = doorbell_tests::test_kernel::<trap_in_one_thread>(&dev);
    // SAFETY: no pointers.
    unsafe { s.launch(&f, LaunchConfig::linear(2, 64), (17,)).unwrap() };
    let err = query_until_settled(&s).unwrap_err();
    assert!(err.to_string().contains("trap"), "{err}");
    // Still there for synchronize, which reports it once.
    assert!(s.synchronize().is_err());
    assert!(s.synchronize().is_ok());
    // SAFETY: as above; no thread traps with who = 999.
    unsafe { s.launch(&f, LaunchConfig::linear(1, 32), (999,)).unwrap() };
    assert!(query_until_settled(&s).unwrap(), "a finished launch reads as done");
}

per_backend! {
    /// `Stream::query` says a running kernel is not done and a finished
    /// one is: the kernel runs for 200 ms, the first query comes at once.
    fn query_sees_a_kernel_run_and_finish(dev: Device) {
        let (f, s) = doorbell_tests::test_kernel::<testing::spin_for>(&dev);
        // SAFETY: no pointers.
        unsafe { s.launch(&f, LaunchConfig::linear(1, 32), (200_000_000u64,)).unwrap() };
        assert!(!s.query().unwrap(), "{dev:?}: done at once");
        assert!(query_until_settled(&s).unwrap(), "{dev:?}: never done");
        s.synchronize().unwrap();
    }
}

per_backend! {
    fn bad_launch_shapes_are_errors(dev: Device) {
        let (f, s) = doorbell_tests::test_kernel::<trap_in_one_thread>(&dev);
        for cfg in [
            LaunchConfig::linear(0, 32),
            LaunchConfig::linear(1, 0),
            LaunchConfig::linear(1, 2048),
        ] {
            // SAFETY: rejected before running.
            let r = unsafe { s.launch(&f, cfg, (0,)) };
            assert!(matches!(r, Err(Error::InvalidLaunch { .. })), "{cfg:?} on {dev:?}: {:?}", r.err());
        }
    }
}

#[test]
fn emulator_refuses_launches_needing_too_many_threads() {
    let dev = Device::emulator(0);
    let (f, s) = doorbell_tests::test_kernel::<trap_in_one_thread>(&dev);
    // SAFETY: refused before running.
    unsafe { s.launch(&f, LaunchConfig::linear(100_000, 1024), (u32::MAX,)).unwrap() };
    let msg = s.synchronize().unwrap_err().to_string();
    assert!(msg.contains("DOORBELL_EMU_MAX_THREADS"), "{msg}");
}

#[test]
fn missing_gpu_is_an_error_not_a_panic() {
    match Device::open(Backend::Gpu, 0) {
        Ok(d) => {
            let count = doorbell::gpu_count();
            let r = Device::open(Backend::Gpu, count + 3);
            assert!(matches!(r, Err(Error::NoSuchGpu { .. })), "{:?}", r.err());
            drop(d);
        }
        Err(e) => {
            assert!(matches!(e, Error::NoDriver | Error::NoGpu), "{e}");
            assert!(e.to_string().contains("DOORBELL_DEVICE=cpu"), "the error names the fix: {e}");
        }
    }
    assert!(matches!("tpu".parse::<Backend>(), Err(Error::BadBackend(_))));
}

#[test]
fn auto_backend_falls_back_to_the_emulator_without_a_gpu() {
    let d = Device::open(Backend::Auto, 0).unwrap();
    assert_eq!(d.is_gpu(), doorbell::gpu_count() > 0);
}

#[test]
fn length_mismatch_is_reported() {
    let dev = Device::emulator(0);
    let mut b = dev.alloc_zeroed::<u32>(4).unwrap();
    assert!(matches!(
        b.copy_from_host(&[1, 2, 3]),
        Err(Error::LengthMismatch { device: 4, host: 3 })
    ));
}

per_backend! {
    fn mapped_memory_is_shared_between_host_and_kernel(dev: Device) {
        let counter = dev.alloc_mapped::<u32>(1).unwrap();
        let done = dev.alloc_mapped::<u32>(1).unwrap();
        let out = dev.alloc_mapped::<u32>(1).unwrap();
        let status = dev.alloc_mapped::<u32>(1).unwrap();
        let words = (counter.device_ptr(), done.device_ptr(), out.device_ptr(), status.device_ptr());
        // SAFETY: single mapped words.
        unsafe { run_atomics_and_fences(&dev, LaunchConfig::linear(2, 32), words) };
        assert_eq!(out.read(0), 64, "{dev:?}");
        assert_eq!(counter.read(0), 64);
    }
}
