//! Strict parsing of `DOORBELL_*` environment variables.
//!
//! One parser for every variable doorbell reads at run time (the host
//! runtime re-exports it as `doorbell::env`; the CPU emulator uses it for
//! its own limits). A value that does not parse, or lies outside its
//! range, is an error naming the variable, the value and the accepted
//! range: never clamped, never ignored. An unset or empty variable means
//! the default.
//!
//! A renamed variable is read under its new name and, for one release,
//! under the name it replaced ([`raw_renamed`], [`flag_renamed`]): the
//! caller learns which name was used, to warn about the old one.

use std::fmt;
use std::time::Duration;

/// A `DOORBELL_*` variable holds something unusable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvError {
    /// The variable.
    pub var: String,
    /// Its value (lossy UTF-8).
    pub value: String,
    /// What is wrong and what is accepted.
    pub reason: String,
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "environment variable {}={:?} {}", self.var, self.value, self.reason)
    }
}

impl std::error::Error for EnvError {}

fn bad(var: &str, value: &str, reason: String) -> EnvError {
    EnvError {
        var: var.to_string(),
        value: value.to_string(),
        reason,
    }
}

/// The raw value of `var`: `None` when unset or empty (blank counts as
/// unset, as `export VAR=` is a common leftover); an error when it is not
/// UTF-8.
pub fn raw(var: &str) -> Result<Option<String>, EnvError> {
    match std::env::var(var) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(bad(var, &v.to_string_lossy(), "is not valid UTF-8".into())),
    }
}

/// Parses `value` of `var` as seconds (decimal, may be fractional) in
/// `min..=max`.
pub fn parse_secs(var: &str, value: &str, min: f64, max: f64) -> Result<Duration, EnvError> {
    let range = || format!("a number of seconds in {min}..={max}");
    let t = value.trim();
    // `f64::from_str` takes "inf", "NaN" and "infinity": only plain decimals here.
    if t.is_empty()
        || !t
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
    {
        return Err(bad(var, value, format!("is not a number; use {}", range())));
    }
    match t.parse::<f64>() {
        Ok(s) if s.is_finite() && (min..=max).contains(&s) => Ok(Duration::from_secs_f64(s)),
        Ok(_) => Err(bad(var, value, format!("is out of range; use {}", range()))),
        Err(_) => Err(bad(var, value, format!("is not a number; use {}", range()))),
    }
}

/// Parses `value` of `var` as a decimal integer in `min..=max`.
pub fn parse_uint(var: &str, value: &str, min: u64, max: u64) -> Result<u64, EnvError> {
    let range = || format!("an integer in {min}..={max}");
    let t = value.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(var, value, format!("is not a non-negative integer; use {}", range())));
    }
    match t.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(bad(var, value, format!("is out of range; use {}", range()))),
    }
}

/// Parses `value` of `var` as a switch: `0` or `1`.
pub fn parse_flag(var: &str, value: &str) -> Result<bool, EnvError> {
    match value.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err(bad(var, value, "is not a switch; use 1 (on) or 0 (off)".into())),
    }
}

/// Parses `value` of `var` as one of `choices` (case-insensitive); returns
/// the index of the choice.
pub fn parse_choice(var: &str, value: &str, choices: &[&str]) -> Result<usize, EnvError> {
    let t = value.trim().to_ascii_lowercase();
    choices
        .iter()
        .position(|c| *c == t)
        .ok_or_else(|| bad(var, value, format!("is not one of {}", choices.join(", "))))
}

/// `var` as seconds in `min..=max`, or `default` when unset.
pub fn secs(var: &str, default: Duration, min: f64, max: f64) -> Result<Duration, EnvError> {
    raw(var)?.map_or(Ok(default), |v| parse_secs(var, &v, min, max))
}

/// `var` as an integer in `min..=max`, or `default` when unset.
pub fn uint(var: &str, default: u64, min: u64, max: u64) -> Result<u64, EnvError> {
    raw(var)?.map_or(Ok(default), |v| parse_uint(var, &v, min, max))
}

/// `var` as a `0`/`1` switch, or `default` when unset.
pub fn flag(var: &str, default: bool) -> Result<bool, EnvError> {
    raw(var)?.map_or(Ok(default), |v| parse_flag(var, &v))
}

/// The raw value of a variable renamed from `old` to `new`, and the name it
/// was read under: `new` when set (then `old` is not read), else `old`;
/// `None` when neither is set.
pub fn raw_renamed<'a>(new: &'a str, old: &'a str) -> Result<Option<(String, &'a str)>, EnvError> {
    if let Some(v) = raw(new)? {
        return Ok(Some((v, new)));
    }
    Ok(raw(old)?.map(|v| (v, old)))
}

/// A `0`/`1` switch renamed from `old` to `new` (see [`raw_renamed`]), or
/// `default` when neither is set. The second value is `Some(old)` when the
/// value came from the old name, for the caller's deprecation notice; an
/// error names the variable actually read.
pub fn flag_renamed<'a>(new: &'a str, old: &'a str, default: bool) -> Result<(bool, Option<&'a str>), EnvError> {
    match raw_renamed(new, old)? {
        None => Ok((default, None)),
        Some((v, var)) => Ok((parse_flag(var, &v)?, (var == old).then_some(old))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_strict_and_ranged() {
        assert_eq!(parse_secs("V", "2.5", 0.001, 10.0).unwrap(), Duration::from_millis(2500));
        assert_eq!(parse_secs("V", " 1e-3 ", 0.001, 10.0).unwrap(), Duration::from_millis(1));
        for v in ["abc", "inf", "NaN", "", "1s", "0x10"] {
            let e = parse_secs("V", v, 0.001, 10.0).unwrap_err();
            assert!(
                e.to_string().contains("is not a number") && e.to_string().contains("0.001..=10"),
                "{v}: {e}"
            );
        }
        for v in ["0", "1e300", "-1", "10.5"] {
            let e = parse_secs("V", v, 0.001, 10.0).unwrap_err();
            assert!(e.to_string().contains("out of range"), "{v}: {e}");
        }
    }

    #[test]
    fn integers_are_strict_and_ranged() {
        assert_eq!(parse_uint("V", "16384", 1, 1 << 20).unwrap(), 16384);
        for v in ["abc", "-1", "1.5", "1e3", "0x10"] {
            assert!(
                parse_uint("V", v, 1, 100)
                    .unwrap_err()
                    .reason
                    .contains("not a non-negative integer"),
                "{v}"
            );
        }
        for v in ["0", "101", "99999999999999999999999"] {
            assert!(parse_uint("V", v, 1, 100).unwrap_err().reason.contains("1..=100"), "{v}");
        }
    }

    #[test]
    fn flags_and_choices() {
        assert!(parse_flag("V", "1").unwrap());
        assert!(!parse_flag("V", "0").unwrap());
        assert!(parse_flag("V", "yes").is_err());
        assert_eq!(parse_choice("V", "GPU", &["auto", "gpu"]).unwrap(), 1);
        let e = parse_choice("V", "foo", &["auto", "gpu"]).unwrap_err();
        assert_eq!(e.to_string(), "environment variable V=\"foo\" is not one of auto, gpu");
    }

    /// Variables of this test only: the test binary's other tests never
    /// read them, so setting them here races with nothing.
    #[test]
    fn a_renamed_flag_prefers_the_new_name_and_says_when_the_old_one_was_read() {
        let (new, old) = ("DOORBELL_TEST_RENAMED_NEW", "DOORBELL_TEST_RENAMED_OLD");
        std::env::remove_var(new);
        std::env::remove_var(old);
        assert_eq!(flag_renamed(new, old, true).unwrap(), (true, None));
        std::env::set_var(old, "0");
        assert_eq!(flag_renamed(new, old, true).unwrap(), (false, Some(old)));
        std::env::set_var(old, "yes");
        let e = flag_renamed(new, old, true).unwrap_err();
        assert_eq!(e.var, old, "the error names the variable read");
        std::env::set_var(new, "1");
        assert_eq!(
            flag_renamed(new, old, false).unwrap(),
            (true, None),
            "the new name wins, the old is not read"
        );
        std::env::set_var(new, "2");
        assert_eq!(flag_renamed(new, old, false).unwrap_err().var, new);
        std::env::remove_var(new);
        std::env::remove_var(old);
    }
}
