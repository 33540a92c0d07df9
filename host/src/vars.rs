//! The parsers every run-time `DOORBELL_*` variable goes through, as
//! doorbell's [`Result`]: thin wrappers of `doorbell_kernels::env_vars`.
//!
//! A leaf: it reads the environment and nothing of the crate but its error
//! type, so every layer (the backends, the NICs, the communicator) reads its
//! variables here without an import running back up. The public face of
//! these parsers, with the check of the whole environment, is
//! [`crate::env`].

use std::time::Duration;

use doorbell_kernels::env_vars as parse;
pub use doorbell_kernels::env_vars::{parse_choice, parse_flag, parse_secs, parse_uint, EnvError};

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

/// The index in `choices` of `var`'s value (trimmed, any case), or `None`
/// when unset.
pub fn choice(var: &str, choices: &[&str]) -> Result<Option<usize>> {
    Ok(parse::raw(var)?.map(|v| parse_choice(var, &v, choices)).transpose()?)
}

/// `var` as a `0`/`1` switch, or `default` when unset.
pub fn flag(var: &str, default: bool) -> Result<bool> {
    Ok(parse::flag(var, default)?)
}

/// A `0`/`1` switch renamed from `old` to `new`, or `default` when neither
/// is set. The old name is still read for one release, when the new one is
/// unset, with a warning that names the new one.
pub fn flag_renamed(new: &str, old: &str, default: bool) -> Result<bool> {
    let (value, deprecated) = parse::flag_renamed(new, old, default)?;
    if let Some(old) = deprecated {
        tracing::warn!("{old} is deprecated and will be removed in the next release: use {new}");
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    /// Collects the messages of the events logged while it is the default.
    struct Messages(Arc<Mutex<Vec<String>>>);

    struct Message<'a>(&'a mut String);

    impl tracing::field::Visit for Message<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                *self.0 = format!("{value:?}");
            }
        }
    }

    impl tracing::Subscriber for Messages {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut m = String::new();
            event.record(&mut Message(&mut m));
            self.0.lock().unwrap().push(m);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// The former name of a renamed switch is read when the new one is
    /// unset, with a warning naming the new one; the new name warns of
    /// nothing. Variables of this test only.
    #[test]
    fn a_former_name_is_read_with_a_warning_naming_the_new_one() {
        let (new, old) = ("DOORBELL_VARS_TEST_NEW", "DOORBELL_VARS_TEST_OLD");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let read = |set: &[(&str, &str)]| {
            std::env::remove_var(new);
            std::env::remove_var(old);
            for (k, v) in set {
                std::env::set_var(k, v);
            }
            let r = tracing::subscriber::with_default(Messages(seen.clone()), || super::flag_renamed(new, old, false));
            std::env::remove_var(new);
            std::env::remove_var(old);
            r
        };
        assert!(read(&[(old, "1")]).unwrap());
        let messages = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(messages[0].contains(old) && messages[0].contains(new), "{messages:?}");
        assert!(read(&[(new, "1"), (old, "0")]).unwrap(), "the new name wins");
        assert!(!read(&[]).unwrap(), "the default");
        assert!(seen.lock().unwrap().is_empty(), "only the former name warns");
    }
}
