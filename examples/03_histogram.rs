//! 03 — your own kernel crate: a byte histogram from `examples/user-kernels`,
//! built to PTX by `examples/build.rs` through `doorbell::build::PtxBuilder`
//! and embedded here, run on the GPU or the CPU emulator and checked against
//! a CPU count.
//!
//! ```text
//! cargo run --release --example histogram -- --help
//! cargo run --release --example histogram -- [--device gpu|cpu|auto] [--n BYTES]
//! ```

use clap::Parser;
use doorbell::{Device, LaunchConfig};
use doorbell_example_kernels::byte_histogram;
use doorbell_examples::cli::HistogramArgs;
use doorbell_examples::{host_vec, main_with, ratio, BoxError, USER_KERNELS};

fn main() {
    let args = HistogramArgs::parse();
    main_with(|| run(&args));
}

fn run(args: &HistogramArgs) -> Result<(), BoxError> {
    let dev = Device::open(args.device.backend()?, 0)?;
    let n = args.n.unwrap_or(if dev.is_gpu() { 1 << 28 } else { 1 << 22 });
    println!("device: {} ({:?} backend)", dev.name(), dev.backend());
    // Skewed bytes, so bins differ.
    let data = host_vec(n, |i| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as u8) ^ ((i % 7) as u8))?;
    let module = dev.load_module(&USER_KERNELS)?;
    let f = module.function::<byte_histogram>()?;
    let ddata = dev.alloc_from(&data)?;
    let mut bins = dev.alloc_zeroed::<u32>(256)?;
    let stream = dev.new_stream()?;
    let cfg = if dev.is_gpu() {
        LaunchConfig::linear(dev.multiprocessor_count() as u32 * 4, 512)
    } else {
        LaunchConfig::linear(2, 64)
    }
    .with_shared_mem(1024);
    let t0 = stream.record()?;
    // SAFETY: `ddata` holds n bytes, `bins` 256 words; 1 KiB of shared memory.
    unsafe { stream.launch(&f, cfg, (ddata.as_ptr(), n, bins.as_mut_ptr()))? };
    let t1 = stream.record()?;
    stream.synchronize()?;
    let ms = t0.elapsed_ms(&t1)? as f64;
    let got = bins.to_host()?;
    let mut want = [0u64; 256];
    for b in &data {
        want[*b as usize] += 1;
    }
    // The kernel counts in u32 bins: a count past u32::MAX wraps on the device.
    let ok = got.iter().zip(&want).all(|(g, w)| *g as u64 == w % (1 << 32));
    let bw = ratio(n as f64, ms * 1e-3).map_or("-".to_string(), |b| format!("{:.1}", b / 1e9));
    println!("kernel: byte_histogram from the user kernel crate, {n} bytes, {ms:.3} ms ({bw} GB/s)");
    if !dev.is_gpu() {
        println!("note: the backend is the CPU emulator: emulator timings say nothing about a GPU");
    }
    println!("checked: 256 bins against a CPU count: {}", if ok { "equal" } else { "DIFFERENT" });
    if !ok {
        return Err("histogram differs from the CPU count".into());
    }
    Ok(())
}
