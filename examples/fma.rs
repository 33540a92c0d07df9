//! 01 — a fused multiply-add over a large vector, on the GPU or the CPU
//! emulator, checked element by element against a CPU reference.
//!
//! ```text
//! cargo run --release --example fma -- [--device gpu|cpu|auto] [--n ELEMENTS] [--iters N]
//! ```
//! It prints which backend ran, what it checked, and a fingerprint of the
//! output bits: the same on every backend, because the kernel uses one
//! rounding (`fma.rn.f32` / `f32::mul_add`).

use doorbell::{Device, LaunchConfig, KERNELS_PTX};
use doorbell_examples::{die, fingerprint, Args};
use doorbell_kernels::examples::fused_multiply_add;

fn main() {
    if let Err(e) = run() {
        die(e);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse(&[])?;
    let bad = args.unknown(&["device", "n", "iters"]);
    if !bad.is_empty() {
        return Err(format!(
            "unknown option(s): {}; usage: fma [--device gpu|cpu|auto] [--n ELEMENTS] [--iters N]",
            bad.join(", ")
        )
        .into());
    }
    let backend = args.backend()?;
    let dev = Device::open(backend, 0)?;
    let default_n = if dev.is_gpu() { 1 << 26 } else { 1 << 22 };
    let n = args.num("n", default_n)? as usize;
    let iters = args.num("iters", if dev.is_gpu() { 20 } else { 2 })?.max(1) as u32;
    if n == 0 {
        return Err("--n must be at least 1".into());
    }
    println!("device: {} ({:?} backend)", dev.name(), dev.backend());

    // Inputs with varied exponents and signs, so rounding matters.
    let a: Vec<f32> = (0..n).map(|i| ((i % 1000) as f32 - 500.0) * 1.000_123e-3).collect();
    let b: Vec<f32> = (0..n).map(|i| ((i % 777) as f32 + 0.5) * 3.3e-2).collect();
    let c: Vec<f32> = (0..n).map(|i| ((i % 313) as f32) * -7.1e-4).collect();

    let module = dev.load_module(KERNELS_PTX)?;
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
    let ms = start.elapsed_ms(&end)? / iters as f32;

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
    let gbps = (4.0 * 4.0 * n as f64) / (ms as f64 * 1e-3) / 1e9;
    println!(
        "kernel: fused_multiply_add, {n} elements, grid {}x{} threads, {iters} timed launches",
        cfg.grid.0, cfg.block.0
    );
    println!("time: {ms:.3} ms per launch, {gbps:.1} GB/s (3 loads + 1 store of f32 per element)");
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
