//! Strict parsing of the `DOORBELL_*` environment variables.
//!
//! Every variable doorbell reads at run time goes through these functions:
//! a value that does not parse, or lies outside its range, is
//! [`Error::BadEnv`](crate::Error::BadEnv) naming the variable, the value and the accepted range.
//! Nothing is clamped or ignored in silence; an unset or empty variable
//! means the default. The parser itself lives in
//! `doorbell_kernels::env_vars`, so the emulator's own limits
//! (`DOORBELL_EMU_*`) are read the same way.
//!
//! | variable | accepted | default |
//! |---|---|---|
//! | `DOORBELL_DEVICE` | `gpu`, `cpu`, `auto` | `auto` |
//! | `DOORBELL_WAIT_TIMEOUT_S` | seconds in 0.001..=86400 | 10 |
//! | `DOORBELL_RANK_PER_GPU` (formerly `DOORBELL_SPREAD_GPUS`) | `0`, `1` | 0 |
//! | `DOORBELL_SELF_TEST` | `0` (skip the communicator's self-test at start-up), `1` | 1 |
//! | `DOORBELL_HEAP_PARTS` | `0` (processes of a host share GPU heaps through legacy CUDA IPC, read-write), `1` (in parts, the soft NIC tables read-only) | 1 |
//! | `DOORBELL_EMU_MAX_THREADS` | 1..=1048576 | 16384 |
//! | `DOORBELL_EMU_BARRIER_TIMEOUT_S` | seconds in 0.001..=86400 | 60 |
//! | `DOORBELL_LOG` | `off`, `error`, `warn`, `info`, `debug`, `trace` | `warn` |
//! | `DOORBELL_TRACE` | a directory: trace the kernels into it ([`crate::trace`]) | unset (off) |
//! | `DOORBELL_TRACE_EVENTS` | events kept per trace ring, a power of two in 16..=1048576 | 2048 |
//! | `DOORBELL_LOAD_CUBIN` (formerly `DOORBELL_CUBIN`) | `0` (load modules from their PTX), `1` (from an embedded cubin where it fits the GPU) | 1 |
//!
//! A former name is still read, with a warning naming the new one, for one
//! release and only while the new name is unset.
//!
//! The launcher variables (`RANK`, `MASTER_PORT`, `DOORBELL_TOKEN`,
//! `DOORBELL_*_TIMEOUT_S` of the world, ...) are read, just as strictly, by
//! [`WorldConfig::from_env`](crate::WorldConfig::from_env).

use std::time::Duration;

use crate::error::Result;
pub use crate::vars::{flag, parse_choice, parse_flag, parse_secs, parse_uint, raw, secs, uint, EnvError};

/// One group of run-time variables and the parser that reads them, the
/// same call the runtime makes ([`CHECKS`]).
#[derive(Clone, Copy, Debug)]
pub struct Check {
    /// The variables the parser reads (former names included).
    pub vars: &'static [&'static str],
    /// The parser: `Err` names the first unusable variable of the group.
    pub check: fn() -> Result<()>,
}

/// Every run-time `DOORBELL_*` variable, grouped by the parser that reads
/// it. [`check`] runs them in order and stops at the first error;
/// `doorbell doctor` runs each and reports them all.
pub const CHECKS: &[Check] = &[
    Check {
        vars: &["DOORBELL_DEVICE"],
        check: || crate::backend::Backend::from_env().map(drop),
    },
    // As `CommOptions::from_env` reads them.
    Check {
        vars: &["DOORBELL_WAIT_TIMEOUT_S"],
        check: || secs("DOORBELL_WAIT_TIMEOUT_S", Duration::from_secs(10), 0.001, 86400.0).map(drop),
    },
    Check {
        vars: &[crate::comm::RANK_PER_GPU_ENV, crate::comm::RANK_PER_GPU_ENV_OLD],
        check: || crate::vars::flag_renamed(crate::comm::RANK_PER_GPU_ENV, crate::comm::RANK_PER_GPU_ENV_OLD, false).map(drop),
    },
    Check {
        vars: &["DOORBELL_EMU_BARRIER_TIMEOUT_S"],
        check: || Ok(doorbell_kernels::emu::try_barrier_timeout().map(drop)?),
    },
    Check {
        vars: &["DOORBELL_EMU_MAX_THREADS"],
        check: || Ok(doorbell_kernels::emu::max_threads().map(drop)?),
    },
    Check {
        vars: &["DOORBELL_LOG"],
        check: || crate::logging::level_from_env().map(drop),
    },
    Check {
        vars: &["DOORBELL_LOAD_CUBIN", "DOORBELL_CUBIN"],
        check: || crate::vars::flag_renamed("DOORBELL_LOAD_CUBIN", "DOORBELL_CUBIN", true).map(drop),
    },
    Check {
        vars: &[crate::comm::SELF_TEST_ENV],
        check: || flag(crate::comm::SELF_TEST_ENV, true).map(drop),
    },
    Check {
        vars: &[crate::comm::HEAP_PARTS_ENV],
        check: || flag(crate::comm::HEAP_PARTS_ENV, true).map(drop),
    },
    Check {
        vars: &[crate::trace::TRACE_ENV, crate::trace::TRACE_EVENTS_ENV],
        check: || crate::trace::options_from_env().map(drop),
    },
    Check {
        vars: &[
            "DOORBELL_IBGDA_QPS_PER_PEER",
            "DOORBELL_IBGDA_SQ_SIZE",
            "DOORBELL_IBGDA_MAX_MSG",
            "DOORBELL_SOFTNIC_LINK",
            "DOORBELL_SOFTNIC_ENGINE",
            "DOORBELL_SOFTNIC_ENGINE_THREADS",
            "DOORBELL_SOFTNIC_ENGINE_BLOCKS",
            "DOORBELL_SOFTNIC_SCOPE",
            "DOORBELL_SOFTNIC_COPY",
            "DOORBELL_SOFTNIC_BURST",
            "DOORBELL_SOFTNIC_IDLE_SLEEP_NS",
        ],
        check: || crate::comm::IbgdaOptions::from_env().map(drop),
    },
    Check {
        vars: &["DOORBELL_RDMA_PEERS", "DOORBELL_NODES"],
        check: || crate::comm::RdmaPeers::from_env().map(drop),
    },
    Check {
        vars: &[
            "DOORBELL_NIC",
            "DOORBELL_IB_HCA",
            "DOORBELL_IB_MTU",
            "DOORBELL_IB_TIMEOUT",
            "DOORBELL_IB_RETRY_CNT",
            "DOORBELL_IB_MAX_RD_ATOMIC",
            "DOORBELL_IB_SL",
            "DOORBELL_IB_TC",
            "DOORBELL_IB_DOORBELL",
        ],
        check: crate::nic::check_env,
    },
];

/// Parses every run-time `DOORBELL_*` variable of the table above and
/// returns the first unusable one, so that a program can refuse a bad
/// environment before it starts any work.
pub fn check() -> Result<()> {
    for c in CHECKS {
        (c.check)()?;
    }
    Ok(())
}
