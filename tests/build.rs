// Builds the test kernel crate (tests/kernels) to PTX with doorbell's build
// helper, as any user's kernel crate is built; the tests embed it as
// `doorbell_tests::TEST_KERNELS_PTX`.
fn main() {
    doorbell::build::PtxBuilder::new("kernels").build_or_report();
}
