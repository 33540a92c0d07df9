//! The `doorbell` command. `doorbell doctor` reports what this machine
//! offers doorbell (GPUs, driver, embedded kernels, peer access, RDMA,
//! routes between ranks, the `DOORBELL_*` environment) and what is wrong,
//! with a fix for each problem. See `doorbell::doctor`.

use clap::{Parser, Subcommand, ValueEnum};
use doorbell::doctor::{self, Launch};

#[derive(Parser)]
#[command(name = "doorbell", version, about = "doorbell: fused compute + communication GPU kernels")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LaunchArg {
    /// One process per rank (torchrun, mpirun, srun), rank r on GPU r mod #GPUs.
    Processes,
    /// Thread ranks of one process (`Communicator::local`).
    Threads,
}

#[derive(Subcommand)]
enum Command {
    /// Diagnose this machine: GPUs, driver, embedded kernels, peer access,
    /// RDMA, routes between ranks, DOORBELL_* variables. Exits 1 when
    /// something is wrong.
    Doctor {
        /// Print one JSON object (for bug reports) instead of text.
        #[arg(long)]
        json: bool,
        /// Ranks of the world whose routes are shown (default: one per GPU, or 2).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(doorbell::kernels::heap::MAX_RANKS)))]
        ranks: Option<u32>,
        /// How those ranks are launched.
        #[arg(long, value_enum, default_value = "processes")]
        launch: LaunchArg,
        /// No GPU is a problem (exit 1) rather than a warning.
        #[arg(long)]
        require_gpu: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Doctor {
            json,
            ranks,
            launch,
            require_gpu,
        } => {
            let opts = doctor::Options {
                ranks: ranks.map(|r| r as usize),
                launch: match launch {
                    LaunchArg::Processes => Launch::Processes,
                    LaunchArg::Threads => Launch::Threads,
                },
                require_gpu,
            };
            let report = doctor::run(&opts);
            if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("doorbell doctor: cannot write the report as JSON: {e}");
                        std::process::exit(1);
                    }
                }
            } else {
                print!("{}", report.render());
            }
            std::process::exit(report.exit_code());
        }
    }
}
