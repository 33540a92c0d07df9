// Builds the test kernel crate (tests/kernels) to PTX with doorbell's build
// helper, as any user's kernel crate is built; the tests embed it as
// `doorbell_tests::TEST_KERNELS_PTX`. A second build with the device trace's
// hooks (`trace` feature) goes to `traced/` for the trace tests, in a
// target directory of its own so the two builds do not undo each other.
use std::path::PathBuf;

fn main() {
    doorbell::build::PtxBuilder::new("kernels").build_or_report();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let target = match std::env::var_os("DOORBELL_PTX_TARGET_DIR") {
        Some(d) => PathBuf::from(d).join("traced"),
        None => out
            .ancestors()
            .find(|a| a.join("CACHEDIR.TAG").exists())
            .map_or_else(|| out.join("doorbell-ptx-traced"), |t| t.join("doorbell-ptx-traced")),
    };
    doorbell::build::PtxBuilder::new("kernels")
        .feature("trace")
        .out_dir(out.join("traced"))
        .target_dir(target)
        .build_or_report();
}
