//! The benchmark harness the examples share: the ranks a benchmark runs on
//! (threads of this process, or one rank per process under a launcher),
//! timing (warm-up, timed iterations, CUDA-graph capture and replay, events
//! around a held stream), rounds interleaved between variants with their
//! median and minimum, and the report (a text table, JSON and CSV files,
//! bandwidth and latency plots side by side). The NCCL baseline is
//! `doorbell_examples::nccl` (`nccl::baseline` says whether it can run).
//!
//! An example includes it with `#[path = "bench/mod.rs"] mod bench;`. Each
//! example uses a part of it, so the parts one example leaves unused are
//! not dead code, and the re-exports it leaves unused not unused imports.
#![allow(dead_code, unused_imports)]

mod ranks;
mod report;
mod timing;

pub use ranks::{run_ranks, RankRun};
pub use report::{write_figure, write_json, write_text, Table};
pub use timing::{interleaved, median_upper, time_events, time_launches, Stat, Timing};
