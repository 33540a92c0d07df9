//! Which RDMA devices and ports may be used: the `NCCL_IB_HCA` list syntax,
//! read from [`ENV_VAR`] (`DOORBELL_IB_HCA`).
//!
//! A filter is a comma-separated list of `name[:port]` entries:
//!
//! | spec | accepts |
//! |------|---------|
//! | `mlx5` | every port of every device whose name starts with `mlx5` (`mlx5_0`, `mlx5_10`, ...) |
//! | `mlx5_0:1,mlx5_1:1` | port 1 of devices starting with `mlx5_0` or `mlx5_1` (so `mlx5_10` too) |
//! | `=mlx5_1:1` | port 1 of exactly `mlx5_1` |
//! | `^mlx5_0` | every port of every device except those starting with `mlx5_0` |
//! | `^=mlx5_0` | every port of every device except exactly `mlx5_0` |
//!
//! Names match by prefix unless the list starts with `=`, as NCCL does; the
//! leading `^` (which comes before `=`) turns the list into an exclusion
//! list. An entry without a port covers every port of its devices.
//!
//! ```
//! use rdma_sys_ext::hca::HcaFilter;
//!
//! let f: HcaFilter = "^=mlx5_0".parse()?;
//! assert!(!f.accepts("mlx5_0", 1));
//! assert!(f.accepts("mlx5_00", 1));
//! assert!(f.accepts("mlx5_1", 1));
//! # Ok::<(), rdma_sys_ext::hca::HcaFilterError>(())
//! ```

use std::fmt;
use std::str::FromStr;

/// The environment variable holding the device filter.
pub const ENV_VAR: &str = "DOORBELL_IB_HCA";

/// One `name[:port]` entry of a filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaEntry {
    /// The device name, or name prefix when the filter is not exact.
    pub name: String,
    /// The port number (1-based); `None` covers every port.
    pub port: Option<u8>,
}

/// A parsed `NCCL_IB_HCA`-style device filter; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaFilter {
    spec: String,
    exclude: bool,
    exact: bool,
    entries: Vec<HcaEntry>,
}

/// Why a filter spec was rejected. Each variant names the spec or the entry
/// at fault and says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HcaFilterError {
    /// The spec is empty (or only whitespace).
    #[error("empty device filter: expected a comma-separated list of `name[:port]` entries, e.g. `mlx5_0:1,mlx5_1:1`")]
    Empty,
    /// The spec is only `^`, `=` or `^=` with no entries after it.
    #[error("device filter `{spec}` has no entries after its `^`/`=` prefix: expected e.g. `^mlx5_0` or `=mlx5_1:1`")]
    NoEntries {
        /// The whole spec.
        spec: String,
    },
    /// An entry between commas is empty (`a,,b`, a leading or trailing comma).
    #[error("device filter `{spec}` has an empty entry (number {position}, counting from 1): expected `name[:port]` between commas")]
    EmptyEntry {
        /// The whole spec.
        spec: String,
        /// 1-based position of the empty entry.
        position: usize,
    },
    /// An entry has a port but no name (`:1`).
    #[error("device filter entry `{entry}` has no device name: expected `name[:port]`, e.g. `mlx5_0:1`")]
    EmptyName {
        /// The entry.
        entry: String,
    },
    /// An entry's port is not a number from 1 to 255.
    #[error("device filter entry `{entry}` has port `{port}`: expected a port number from 1 to 255 (ports count from 1)")]
    BadPort {
        /// The entry.
        entry: String,
        /// The text after the colon.
        port: String,
    },
    /// The environment variable's value is not UTF-8.
    #[error("DOORBELL_IB_HCA is not valid UTF-8 (`{lossy}`): device names are ASCII, e.g. `mlx5_0:1`")]
    NotUnicode {
        /// The value with invalid bytes replaced.
        lossy: String,
    },
    /// A name contains a character that cannot be part of one (`^`, `=`,
    /// whitespace), e.g. `=^mlx5_0` (the `^` must come first) or `mlx5_0 mlx5_1`.
    #[error("device filter entry `{entry}` contains `{ch}`: `^` and `=` may only open the whole list (`^` first), and entries are separated by commas")]
    BadName {
        /// The entry.
        entry: String,
        /// The offending character.
        ch: char,
    },
}

impl HcaFilter {
    /// Parses a spec; see the [module docs](self) for the syntax.
    /// Whitespace around the whole spec and around each entry is ignored.
    pub fn parse(spec: &str) -> Result<Self, HcaFilterError> {
        let trimmed = spec.trim();
        if trimmed.is_empty() {
            return Err(HcaFilterError::Empty);
        }
        let mut rest = trimmed;
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        if rest.trim().is_empty() {
            return Err(HcaFilterError::NoEntries { spec: trimmed.to_string() });
        }
        let mut entries = Vec::new();
        for (i, raw) in rest.split(',').enumerate() {
            let entry = raw.trim();
            if entry.is_empty() {
                return Err(HcaFilterError::EmptyEntry {
                    spec: trimmed.to_string(),
                    position: i + 1,
                });
            }
            let (name, port) = match entry.split_once(':') {
                Some((name, port_text)) => {
                    let port = port_text.trim();
                    let parsed = port.parse::<u8>().ok().filter(|&p| p != 0 && !port.starts_with('+'));
                    match parsed {
                        Some(p) => (name.trim(), Some(p)),
                        None => {
                            return Err(HcaFilterError::BadPort {
                                entry: entry.to_string(),
                                port: port.to_string(),
                            })
                        }
                    }
                }
                None => (entry, None),
            };
            if name.is_empty() {
                return Err(HcaFilterError::EmptyName { entry: entry.to_string() });
            }
            if let Some(ch) = name.chars().find(|c| matches!(c, '^' | '=' | ':') || c.is_whitespace()) {
                return Err(HcaFilterError::BadName {
                    entry: entry.to_string(),
                    ch,
                });
            }
            entries.push(HcaEntry {
                name: name.to_string(),
                port,
            });
        }
        Ok(HcaFilter {
            spec: trimmed.to_string(),
            exclude,
            exact,
            entries,
        })
    }

    /// Reads [`ENV_VAR`]: `Ok(None)` when it is unset or empty, an error
    /// when it is set but malformed or not UTF-8.
    pub fn from_env() -> Result<Option<Self>, HcaFilterError> {
        match std::env::var_os(ENV_VAR) {
            None => Ok(None),
            Some(v) => match v.into_string() {
                Err(raw) => Err(HcaFilterError::NotUnicode {
                    lossy: raw.to_string_lossy().into_owned(),
                }),
                Ok(text) if text.trim().is_empty() => Ok(None),
                Ok(text) => Self::parse(&text).map(Some),
            },
        }
    }

    /// Whether port `port` of device `device` may be used.
    pub fn accepts(&self, device: &str, port: u8) -> bool {
        let listed = self.entries.iter().any(|e| {
            let name_ok = if self.exact {
                device == e.name
            } else {
                device.starts_with(e.name.as_str())
            };
            name_ok && e.port.is_none_or(|p| p == port)
        });
        listed != self.exclude
    }

    /// The spec as given (trimmed), for messages.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// Whether the list excludes (`^`) rather than selects.
    pub fn is_exclude(&self) -> bool {
        self.exclude
    }

    /// Whether names match exactly (`=`) rather than by prefix.
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// The entries, in the order given.
    pub fn entries(&self) -> &[HcaEntry] {
        &self.entries
    }
}

impl FromStr for HcaFilter {
    type Err = HcaFilterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for HcaFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> HcaFilter {
        HcaFilter::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn prefix_include() {
        let f = p("mlx5");
        assert!(!f.is_exclude() && !f.is_exact());
        assert!(f.accepts("mlx5_0", 1));
        assert!(f.accepts("mlx5_11", 2));
        assert!(!f.accepts("mlx4_0", 1));
        assert!(!f.accepts("rxe0", 1));
        // A prefix longer than the name does not match.
        assert!(!p("mlx5_00").accepts("mlx5_0", 1));
    }

    #[test]
    fn prefix_include_with_ports() {
        let f = p("mlx5_0:1,mlx5_1:2");
        assert_eq!(
            f.entries(),
            &[
                HcaEntry {
                    name: "mlx5_0".into(),
                    port: Some(1)
                },
                HcaEntry {
                    name: "mlx5_1".into(),
                    port: Some(2)
                }
            ]
        );
        assert!(f.accepts("mlx5_0", 1));
        assert!(!f.accepts("mlx5_0", 2));
        assert!(f.accepts("mlx5_1", 2));
        assert!(!f.accepts("mlx5_1", 1));
        // Prefix semantics: mlx5_10 starts with mlx5_1.
        assert!(f.accepts("mlx5_10", 2));
        assert!(!f.accepts("mlx5_2", 1));
    }

    #[test]
    fn exact_include() {
        let f = p("=mlx5_1:1");
        assert!(f.is_exact() && !f.is_exclude());
        assert!(f.accepts("mlx5_1", 1));
        assert!(!f.accepts("mlx5_1", 2));
        assert!(!f.accepts("mlx5_10", 1));
        assert!(!f.accepts("mlx5_0", 1));
    }

    #[test]
    fn prefix_exclude() {
        let f = p("^mlx5_0");
        assert!(f.is_exclude() && !f.is_exact());
        assert!(!f.accepts("mlx5_0", 1));
        assert!(!f.accepts("mlx5_0", 2));
        assert!(f.accepts("mlx5_1", 1));
        assert!(f.accepts("mlx4_0", 1));
    }

    #[test]
    fn exclude_port() {
        let f = p("^mlx5_0:2");
        assert!(f.accepts("mlx5_0", 1));
        assert!(!f.accepts("mlx5_0", 2));
        assert!(f.accepts("mlx5_1", 2));
    }

    #[test]
    fn exact_exclude() {
        let f = p("^=mlx5_0,mlx5_3:1");
        assert!(f.is_exclude() && f.is_exact());
        assert!(!f.accepts("mlx5_0", 1));
        assert!(f.accepts("mlx5_00", 1));
        assert!(!f.accepts("mlx5_3", 1));
        assert!(f.accepts("mlx5_3", 2));
        assert!(f.accepts("mlx5_1", 1));
    }

    #[test]
    fn whitespace_is_trimmed() {
        let f = p("  mlx5_0:1 , mlx5_2 ");
        assert_eq!(f.spec(), "mlx5_0:1 , mlx5_2");
        assert!(f.accepts("mlx5_0", 1));
        assert!(f.accepts("mlx5_2", 7));
        assert_eq!(f.to_string(), "mlx5_0:1 , mlx5_2");
        let parsed: HcaFilter = "mlx5".parse().unwrap();
        assert_eq!(parsed, p("mlx5"));
    }

    #[test]
    fn errors() {
        assert_eq!(HcaFilter::parse(""), Err(HcaFilterError::Empty));
        assert_eq!(HcaFilter::parse("  "), Err(HcaFilterError::Empty));
        for lone in ["^", "=", "^=", "^ "] {
            assert!(matches!(HcaFilter::parse(lone), Err(HcaFilterError::NoEntries { .. })), "{lone}");
        }
        assert_eq!(
            HcaFilter::parse("a,,b"),
            Err(HcaFilterError::EmptyEntry {
                spec: "a,,b".into(),
                position: 2
            })
        );
        assert_eq!(
            HcaFilter::parse("a,"),
            Err(HcaFilterError::EmptyEntry {
                spec: "a,".into(),
                position: 2
            })
        );
        assert_eq!(
            HcaFilter::parse("^,a"),
            Err(HcaFilterError::EmptyEntry {
                spec: "^,a".into(),
                position: 1
            })
        );
        for (spec, port) in [
            ("mlx5_0:0", "0"),
            ("mlx5_0:256", "256"),
            ("mlx5_0:x", "x"),
            ("mlx5_0:", ""),
            ("mlx5_0:-1", "-1"),
            ("mlx5_0:+1", "+1"),
        ] {
            assert_eq!(
                HcaFilter::parse(spec),
                Err(HcaFilterError::BadPort {
                    entry: spec.into(),
                    port: port.into()
                }),
                "{spec}"
            );
        }
        assert_eq!(
            HcaFilter::parse("mlx5_0:1:2"),
            Err(HcaFilterError::BadPort {
                entry: "mlx5_0:1:2".into(),
                port: "1:2".into()
            })
        );
        assert_eq!(HcaFilter::parse(":1"), Err(HcaFilterError::EmptyName { entry: ":1".into() }));
        assert_eq!(
            HcaFilter::parse("=^mlx5_0"),
            Err(HcaFilterError::BadName {
                entry: "^mlx5_0".into(),
                ch: '^'
            })
        );
        assert_eq!(
            HcaFilter::parse("a,^b"),
            Err(HcaFilterError::BadName {
                entry: "^b".into(),
                ch: '^'
            })
        );
        assert_eq!(
            HcaFilter::parse("mlx5_0 mlx5_1"),
            Err(HcaFilterError::BadName {
                entry: "mlx5_0 mlx5_1".into(),
                ch: ' '
            })
        );
    }

    #[test]
    fn error_messages_say_what_is_expected() {
        let e = HcaFilter::parse("mlx5_0:9x").unwrap_err().to_string();
        assert!(e.contains("mlx5_0:9x") && e.contains("1 to 255"), "{e}");
        let e = HcaFilter::parse("^").unwrap_err().to_string();
        assert!(e.contains("`^`") && e.contains("^mlx5_0"), "{e}");
        let e = HcaFilter::parse("a,,b").unwrap_err().to_string();
        assert!(e.contains("a,,b") && e.contains("number 2"), "{e}");
    }

    /// The only test touching the variable, so parallel tests do not race on it.
    #[test]
    fn from_env() {
        std::env::remove_var(ENV_VAR);
        assert_eq!(HcaFilter::from_env(), Ok(None));
        std::env::set_var(ENV_VAR, " ");
        assert_eq!(HcaFilter::from_env(), Ok(None));
        std::env::set_var(ENV_VAR, "^=mlx5_2");
        let f = HcaFilter::from_env().unwrap().unwrap();
        assert!(!f.accepts("mlx5_2", 1) && f.accepts("mlx5_3", 1));
        std::env::set_var(ENV_VAR, "mlx5_0:0");
        assert!(matches!(HcaFilter::from_env(), Err(HcaFilterError::BadPort { .. })));
        {
            use std::os::unix::ffi::OsStrExt;
            std::env::set_var(ENV_VAR, std::ffi::OsStr::from_bytes(b"mlx5_\xff"));
            assert_eq!(
                HcaFilter::from_env(),
                Err(HcaFilterError::NotUnicode {
                    lossy: "mlx5_\u{fffd}".into()
                })
            );
        }
        std::env::remove_var(ENV_VAR);
    }
}
