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
//! | `DOORBELL_EMU_MAX_THREADS` | 1..=1048576 | 16384 |
//! | `DOORBELL_EMU_BARRIER_TIMEOUT_S` | seconds in 0.001..=86400 | 60 |
//! | `DOORBELL_LOG` | `off`, `error`, `warn`, `info`, `debug`, `trace` | `warn` |
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

/// Parses every run-time `DOORBELL_*` variable of the table above and
/// returns the first unusable one, so that a program can refuse a bad
/// environment before it starts any work.
pub fn check() -> Result<()> {
    crate::backend::Backend::from_env()?;
    // As `CommOptions::from_env` reads them.
    secs("DOORBELL_WAIT_TIMEOUT_S", Duration::from_secs(10), 0.001, 86400.0)?;
    crate::vars::flag_renamed(crate::comm::RANK_PER_GPU_ENV, crate::comm::RANK_PER_GPU_ENV_OLD, false)?;
    flag(crate::comm::SELF_TEST_ENV, true)?;
    doorbell_kernels::emu::try_barrier_timeout()?;
    doorbell_kernels::emu::max_threads()?;
    crate::logging::level_from_env()?;
    crate::vars::flag_renamed("DOORBELL_LOAD_CUBIN", "DOORBELL_CUBIN", true)?;
    crate::comm::IbgdaOptions::from_env()?;
    crate::comm::RdmaPeers::from_env()?;
    crate::nic::check_env()?;
    Ok(())
}
