//! The CPU emulator turns a barrier some threads never reach into an error
//! (its own test binary: the barrier timeout is read once per process).

use std::time::{Duration, Instant};

use doorbell::{Device, LaunchConfig};
use doorbell_test_kernels::testing::divergent_barrier;

#[test]
fn a_barrier_some_threads_never_reach_fails_after_the_timeout() {
    std::env::set_var("DOORBELL_EMU_BARRIER_TIMEOUT_S", "1");
    let dev = Device::emulator(0);
    let (f, s) = doorbell_tests::test_kernel::<divergent_barrier>(&dev);
    let mut flag = dev.alloc_zeroed::<u32>(1).unwrap();
    let t0 = Instant::now();
    // SAFETY: one word.
    unsafe { s.launch(&f, LaunchConfig::linear(1, 64), (flag.as_mut_ptr(),)).unwrap() };
    let err = s.synchronize().unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(20), "took {:?}", t0.elapsed());
    let msg = err.to_string();
    doorbell_tests::assert_emulator_failure(&err, "divergent_barrier");
    assert!(msg.contains("sync_threads") && msg.contains("32 of 64"), "{msg}");
}
