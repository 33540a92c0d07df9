//! Build script for rdma-sys-ext.
//!
//! The crate itself needs nothing at build time: libibverbs and libmlx5 are
//! opened with `dlopen` at run time. The only thing built here is the C test
//! shim (`shim/mlx5_ref.c`), a byte-exact reference for mlx5 WQEs/CQEs made
//! with rdma-core's own header. It is compiled only where that header exists
//! (`$DOORBELL_RDMA_INCLUDE/infiniband/mlx5dv.h`, else
//! `/usr/include/infiniband/mlx5dv.h`), and then `cfg(doorbell_mlx5_shim)`
//! is set so `rdma_sys_ext::shim` and the tests that use it are compiled.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(doorbell_mlx5_shim)");
    println!("cargo::rerun-if-changed=shim/mlx5_ref.c");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=DOORBELL_RDMA_INCLUDE");

    let include_dir = match std::env::var_os("DOORBELL_RDMA_INCLUDE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from("/usr/include"),
    };
    let header = include_dir.join("infiniband").join("mlx5dv.h");
    println!("cargo::rerun-if-changed={}", header.display());

    if !header.is_file() {
        println!(
            "cargo::warning=rdma-sys-ext: {} not found; the mlx5 C reference shim \
             (rdma_sys_ext::shim) is not built. Install libibverbs-dev or set \
             DOORBELL_RDMA_INCLUDE to the directory that holds infiniband/mlx5dv.h.",
            header.display()
        );
        return;
    }

    cc::Build::new()
        .file("shim/mlx5_ref.c")
        .include(&include_dir)
        .warnings(true)
        .extra_warnings(true)
        .compile("doorbell_mlx5_ref");
    println!("cargo::rustc-cfg=doorbell_mlx5_shim");
}
