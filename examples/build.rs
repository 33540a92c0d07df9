// Builds the user kernel crate (examples/user-kernels) to PTX, the way a
// downstream project builds its own kernels: doorbell's build helper as a
// build-dependency, the PTX embedded with include_str!.
fn main() {
    doorbell::build::PtxBuilder::new("user-kernels").build_or_report();
}
