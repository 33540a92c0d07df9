// Builds doorbell-kernels (the device side) to PTX and embeds it as
// `doorbell::KERNELS_PTX`, and the soft NIC's engine kernel (a device of
// its own, not a library kernel) to `doorbell_softnic.ptx`, which the
// IBGDA set-up loads. The helper is shared with users' build scripts.
#[path = "src/build.rs"]
#[allow(dead_code)]
mod ptx_build;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/build.rs");
    if std::env::var_os("CARGO_FEATURE_RUNTIME").is_none() {
        return;
    }
    // Only the library's own module exports the collectives' entries
    // (`library-kernels`); the soft NIC's leaves them out, as every other
    // kernel crate's does: the driver would compile them all before the
    // engine could start.
    let builds = [
        (
            "../gpu-kernels",
            ptx_build::PtxBuilder::new("../gpu-kernels").feature("library-kernels"),
        ),
        // PTX ISA 8.0: the engine's bulk copies (`cp.async.bulk`).
        ("../softnic", ptx_build::PtxBuilder::new("../softnic").target_feature("+ptx80")),
    ];
    for (krate, builder) in builds {
        if let Some(out) = builder.build_or_report() {
            if !out.built {
                println!("cargo:warning=doorbell: PTX build of {krate} skipped (DOORBELL_SKIP_PTX=1); GPU launches will fail, the CPU emulator works");
            }
        }
    }
}
