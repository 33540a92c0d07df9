//! The benchmark harness the examples share: the ranks a benchmark runs on
//! (threads of this process, or one rank per process under a launcher),
//! timing (warm-up, timed iterations, CUDA-graph capture and replay, events
//! around a held stream, one rank timed while the others keep step),
//! rounds interleaved between variants with their median and minimum, and
//! the report (a text table, JSON and CSV files, bandwidth and latency
//! plots side by side, the bandwidth drawn from times). The NCCL baseline is
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
pub use report::{fmt_opt, write_figure, write_json, write_text, write_times_figure, Table};
pub use timing::{interleaved, median_upper, time_events, time_launches, time_on_rank0, Peers, Stat, Timing};
