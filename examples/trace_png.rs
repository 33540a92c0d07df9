//! Draws a device trace as a timeline PNG: a row per traced block of each
//! rank, a bar per span (producing, sending, waiting, consuming).
//!
//! ```text
//! DOORBELL_TRACE=/tmp/tr cargo run --release --example allreduce -- --compute gemv   # writes /tmp/tr/trace.json
//! cargo run --release --example trace_png -- /tmp/tr/trace.json timeline.png [--blocks 4] [--from-us 0 --to-us 200]
//! ```
//! GPU kernels record only when built with the trace hooks
//! (`DOORBELL_TRACE_KERNELS=1` at build time); the emulator always records.

use std::path::PathBuf;

use clap::Parser;
use doorbell_examples::timeline::{bars, draw};

/// Draws a doorbell trace (trace.json) as a timeline PNG.
#[derive(Parser, Debug)]
struct Args {
    /// The Chrome trace doorbell wrote (`trace.json` or `rank-<r>.json`)
    trace: PathBuf,
    /// The PNG to write
    png: PathBuf,
    /// Rows (blocks) per rank
    #[arg(long, default_value = "4", value_parser = clap::value_parser!(u16).range(1..=64))]
    blocks: u16,
    /// Show spans from this many µs after the first event
    #[arg(long, default_value = "0")]
    from_us: f64,
    /// ... up to this many µs (default: the end)
    #[arg(long)]
    to_us: Option<f64>,
    /// Width in pixels
    #[arg(long, default_value = "1400", value_parser = clap::value_parser!(u32).range(320..=8000))]
    width: u32,
    /// Title
    #[arg(long, default_value = "doorbell device trace")]
    title: String,
}

fn main() {
    let a = Args::parse();
    let run = || -> Result<(), String> {
        let text = std::fs::read(&a.trace).map_err(|e| format!("cannot read {}: {e}", a.trace.display()))?;
        let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| format!("{} is not JSON: {e}", a.trace.display()))?;
        let to = a.to_us.unwrap_or(f64::INFINITY);
        if !(a.from_us >= 0.0 && to > a.from_us) {
            return Err(format!("--from-us {} --to-us {to}: an empty window", a.from_us));
        }
        let shown: Vec<_> = bars(&json)?
            .into_iter()
            .filter(|b| b.start + b.dur >= a.from_us && b.start <= to)
            .map(|mut b| {
                b.start -= a.from_us;
                b
            })
            .collect();
        draw(&shown, a.blocks as usize, &a.title, a.width, &a.png)?;
        println!("{} spans drawn into {}", shown.len(), a.png.display());
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("trace_png: {e}");
        std::process::exit(2);
    }
}
