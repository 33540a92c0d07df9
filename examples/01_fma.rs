//! 01 — a fused multiply-add over a large vector, on the GPU or the CPU
//! emulator, checked element by element against a CPU reference.
//!
//! ```text
//! cargo run --release --example fma -- --help
//! cargo run --release --example fma -- [--device gpu|cpu|auto] [--n ELEMENTS] [--iters N]
//! ```
//! It prints which backend ran, what it checked, and a fingerprint of the
//! output bits: the same on every backend, because the kernel uses one
//! rounding (`fma.rn.f32` / `f32::mul_add`).

use clap::Parser;
use doorbell::{Device, LaunchConfig};
use doorbell_example_kernels::fused_multiply_add;
use doorbell_examples::cli::FmaArgs;
use doorbell_examples::{fingerprint, host_vec, main_with, BoxError, USER_KERNELS};

fn main() {
    let args = FmaArgs::parse();
    main_with(|| run(&args));
}

fn run(args: &FmaArgs) -> Result<(), BoxError> {
    let dev = Device::open(args.device.backend()?, 0)?;
    let n = args.n.unwrap_or(if dev.is_gpu() { 1 << 26 } else { 1 << 22 });
    let iters = args.iters.unwrap_or(if dev.is_gpu() { 20 } else { 2 }) as u32;
    println!("device: {} ({:?} backend)", dev.name(), dev.backend());

    // Inputs with varied exponents and signs, so rounding matters.
    let a = host_vec(n, |i| ((i % 1000) as f32 - 500.0) * 1.000_123e-3)?;
    let b = host_vec(n, |i| ((i % 777) as f32 + 0.5) * 3.3e-2)?;
    let c = host_vec(n, |i| ((i % 313) as f32) * -7.1e-4)?;
    let n = a.len();

    let module = dev.load_module(&USER_KERNELS)?;
    let fma = module.function::<fused_multiply_add>()?;
    let da = dev.alloc_from(&a)?;
    let db = dev.alloc_from(&b)?;
    let dc = dev.alloc_from(&c)?;
    let mut dout = dev.alloc_zeroed::<f32>(n)?;
    let stream = dev.new_stream()?;
    let blocks = if dev.is_gpu() {
        dev.multiprocessor_count() as u32 * 4
    } else {
        dev.multiprocessor_count() as u32
    };
    let cfg = LaunchConfig::linear(blocks, if dev.is_gpu() { 256 } else { 32 });

    let launch = |out: *mut f32| {
        // SAFETY: all four buffers hold `n` elements and outlive the launch.
        unsafe { stream.launch(&fma, cfg, (da.as_ptr(), db.as_ptr(), dc.as_ptr(), out, n as u64)) }
    };
    launch(dout.as_mut_ptr())?; // warm-up
    let start = stream.record()?;
    for _ in 0..iters {
        launch(dout.as_mut_ptr())?;
    }
    let end = stream.record()?;
    stream.synchronize()?;
    let ms = start.elapsed_ms(&end)? as f64 / iters as f64;

    let out = dout.to_host()?;
    let mut mismatches = 0usize;
    for i in 0..n {
        let want = a[i].mul_add(b[i], c[i]);
        if out[i].to_bits() != want.to_bits() {
            if mismatches < 5 {
                eprintln!("mismatch at {i}: got {} want {}", out[i], want);
            }
            mismatches += 1;
        }
    }
    let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_le_bytes()).collect();
    println!(
        "kernel: fused_multiply_add, {n} elements, grid {}x{} threads, {iters} timed launches",
        cfg.grid.0, cfg.block.0
    );
    match doorbell_examples::ratio(4.0 * 4.0 * n as f64, ms * 1e-3) {
        Some(bps) => println!(
            "time: {ms:.3} ms per launch, {:.1} GB/s (3 loads + 1 store of f32 per element)",
            bps / 1e9
        ),
        None => println!("time: {ms:.3} ms per launch (too short for the timer to give a bandwidth)"),
    }
    if !dev.is_gpu() {
        println!("note: the backend is the CPU emulator: emulator timings say nothing about a GPU");
    }
    println!(
        "checked: {n} outputs against a CPU reference (f32::mul_add), bit-exact: {}",
        if mismatches == 0 { "yes" } else { "NO" }
    );
    println!("output fingerprint: {:016x}", fingerprint(&bytes));
    if mismatches > 0 {
        return Err(format!("{mismatches} of {n} outputs differ from the reference").into());
    }
    Ok(())
}
