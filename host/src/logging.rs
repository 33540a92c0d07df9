//! Logging through `tracing`, at the level `DOORBELL_LOG` names (like
//! `NCCL_DEBUG`): `warn` by default; `info` shows the rendezvous and the
//! route to every peer; `debug` more.

use crate::error::Result;

/// The level `DOORBELL_LOG` names (`warn` when unset).
pub(crate) fn level_from_env() -> Result<&'static str> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    match crate::vars::raw("DOORBELL_LOG")? {
        None => Ok("warn"),
        Some(v) => Ok(LEVELS[crate::vars::parse_choice("DOORBELL_LOG", &v, &LEVELS)?]),
    }
}

/// Installs a logger on stderr at the level `DOORBELL_LOG` names. Call it
/// once at the start of a program; later calls (or a logger the program
/// installed itself) are left alone. A bad `DOORBELL_LOG` is an error.
pub fn init_logging() -> Result<()> {
    let level = level_from_env()?;
    let filter = tracing_subscriber::EnvFilter::new(level);
    // `try_init` fails only when a global logger exists already: keep that one.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
    Ok(())
}
