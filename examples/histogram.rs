//! 03 — your own kernel crate: a byte histogram from `examples/user-kernels`,
//! built to PTX by `examples/build.rs` through `doorbell::build::PtxBuilder`
//! and embedded here, run on the GPU or the CPU emulator and checked against
//! a CPU count.
//!
//! ```text
//! cargo run --release --example histogram -- [--device gpu|cpu|auto] [--n BYTES]
//! ```

use doorbell::{Device, LaunchConfig};
use doorbell_example_kernels::byte_histogram;
use doorbell_examples::{die, Args, USER_KERNELS_PTX};

fn main() {
    if let Err(e) = run() {
        die(e);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse(&[])?;
    let bad = args.unknown(&["device", "n"]);
    if !bad.is_empty() {
        return Err(format!(
            "unknown option(s): {}; usage: histogram [--device gpu|cpu|auto] [--n BYTES]",
            bad.join(", ")
        )
        .into());
    }
    let backend = args.backend()?;
    let dev = Device::open(backend, 0)?;
    let n = args.num("n", if dev.is_gpu() { 1 << 28 } else { 1 << 22 })? as usize;
    println!("device: {} ({:?} backend)", dev.name(), dev.backend());
    // Skewed bytes, so bins differ.
    let data: Vec<u8> = (0..n as u64)
        .map(|i| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as u8) ^ ((i % 7) as u8))
        .collect();
    let module = dev.load_module(USER_KERNELS_PTX)?;
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
    unsafe { stream.launch(&f, cfg, (ddata.as_ptr(), n as u64, bins.as_mut_ptr()))? };
    let t1 = stream.record()?;
    stream.synchronize()?;
    let ms = t0.elapsed_ms(&t1)?;
    let got = bins.to_host()?;
    let mut want = [0u32; 256];
    for b in &data {
        want[*b as usize] += 1;
    }
    let ok = got[..] == want[..];
    println!(
        "kernel: byte_histogram from the user kernel crate, {n} bytes, {:.3} ms ({:.1} GB/s)",
        ms,
        n as f64 / (ms as f64 * 1e-3) / 1e9
    );
    println!("checked: 256 bins against a CPU count: {}", if ok { "equal" } else { "DIFFERENT" });
    if !ok {
        return Err("histogram differs from the CPU count".into());
    }
    Ok(())
}
