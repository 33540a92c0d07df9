//! A kernel from a user's own crate, built to PTX through the build helper,
//! runs on every backend.

use doorbell::LaunchConfig;
use doorbell_example_kernels::byte_histogram;
use doorbell_examples::USER_KERNELS_PTX;

#[test]
fn a_user_crate_kernel_with_shared_memory_and_atomics_runs_on_every_backend() {
    let n = 300_007usize;
    let data: Vec<u8> = (0..n).map(|i| (i * i % 251) as u8).collect();
    let mut want = vec![0u32; 256];
    for b in &data {
        want[*b as usize] += 1;
    }
    for dev in doorbell_tests::backends() {
        let m = dev.load_module(USER_KERNELS_PTX).unwrap();
        let f = m.function::<byte_histogram>().unwrap();
        let d = dev.alloc_from(&data).unwrap();
        let mut bins = dev.alloc_zeroed::<u32>(256).unwrap();
        let s = dev.new_stream().unwrap();
        // SAFETY: n bytes, 256 bins, 1 KiB of shared memory.
        unsafe {
            s.launch(
                &f,
                LaunchConfig::linear(3, 96).with_shared_mem(1024),
                (d.as_ptr(), n as u64, bins.as_mut_ptr()),
            )
            .unwrap()
        };
        s.synchronize().unwrap();
        assert_eq!(bins.to_host().unwrap(), want, "{dev:?}");
    }
}
