//! Shared helpers for doorbell's cross-crate integration tests (tests/tests/).

use doorbell::{Backend, Device};

/// The PTX of the test kernel crate (`tests/kernels`), built by `tests/build.rs`.
pub const TEST_KERNELS_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/doorbell_test_kernels.ptx"));

/// The devices a behaviour test runs on: always the CPU emulator, plus GPU 0
/// when one is present. `DOORBELL_TEST_REQUIRE_GPU=1` makes a missing GPU a
/// failure (used on the GPU machine, so a GPU run cannot silently become an
/// emulator-only run).
pub fn backends() -> Vec<Device> {
    let mut v = vec![Device::emulator(0)];
    match Device::open(Backend::Gpu, 0) {
        Ok(d) => v.push(d),
        Err(e) => {
            if std::env::var("DOORBELL_TEST_REQUIRE_GPU").is_ok_and(|x| x == "1") {
                panic!("DOORBELL_TEST_REQUIRE_GPU=1 but no GPU: {e}");
            }
            // Said, not silent: this test ran on the emulator only.
            eprintln!("no GPU ({e}): GPU half skipped, emulator only (DOORBELL_TEST_REQUIRE_GPU=1 makes this a failure)");
        }
    }
    v
}

/// The GPU, if present.
pub fn gpu() -> Option<Device> {
    backends().into_iter().find(|d| d.is_gpu())
}
