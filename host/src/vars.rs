//! The parsers every run-time `DOORBELL_*` variable goes through, as
//! doorbell's [`Result`]: thin wrappers of `doorbell_kernels::emu::env`.
//!
//! A leaf: it reads the environment and nothing of the crate but its error
//! type, so every layer (the backends, the NICs, the communicator) reads its
//! variables here without an import running back up. The public face of
//! these parsers, with the check of the whole environment, is
//! [`crate::env`].

use std::time::Duration;

use doorbell_kernels::emu::env as parse;
pub use doorbell_kernels::emu::env::{parse_choice, parse_flag, parse_secs, parse_uint, EnvError};

use crate::error::Result;

/// The raw value of `var`; `None` when unset or empty.
pub fn raw(var: &str) -> Result<Option<String>> {
    Ok(parse::raw(var)?)
}

/// `var` as seconds in `min..=max`, or `default` when unset.
pub fn secs(var: &str, default: Duration, min: f64, max: f64) -> Result<Duration> {
    Ok(parse::secs(var, default, min, max)?)
}

/// `var` as an integer in `min..=max`, or `default` when unset.
pub fn uint(var: &str, default: u64, min: u64, max: u64) -> Result<u64> {
    Ok(parse::uint(var, default, min, max)?)
}

/// `var` as a `0`/`1` switch, or `default` when unset.
pub fn flag(var: &str, default: bool) -> Result<bool> {
    Ok(parse::flag(var, default)?)
}
