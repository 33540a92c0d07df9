//! Launch detection: who am I, how many are we, where is rank 0.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};

/// Rendezvous timeout when `DOORBELL_RENDEZVOUS_TIMEOUT_S` is unset.
pub const DEFAULT_RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(60);
/// Collective timeout when `DOORBELL_WORLD_TIMEOUT_S` is unset.
pub const DEFAULT_WORLD_TIMEOUT: Duration = Duration::from_secs(300);
/// Rank 0's port under mpirun/srun when neither `DOORBELL_MASTER_PORT` nor
/// `MASTER_PORT` is set.
pub const DEFAULT_PORT: u16 = 29510;

/// The launcher whose variables described this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `torchrun` (or anything else that sets `RANK` / `WORLD_SIZE`).
    Torchrun,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    Mpirun,
    /// Slurm's `srun` (`SLURM_PROCID` / `SLURM_NTASKS`).
    Slurm,
    /// Built by hand ([`WorldConfig::new`]).
    Manual,
}

/// Where this process sits in a multi-process job and how to reach rank 0.
///
/// Built from the launcher's environment by [`WorldConfig::from_env`], or by
/// hand with [`WorldConfig::new`]. `Debug` never prints the token.
#[derive(Clone)]
pub struct WorldConfig {
    /// This process's rank, `0..size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub size: usize,
    /// Rank among the processes of this host.
    pub local_rank: usize,
    /// Number of processes on this host, when the launcher says.
    pub local_size: Option<usize>,
    /// Host (name or address) where rank 0 listens.
    pub master_addr: String,
    /// Port where rank 0 listens (0 = any free port; only rank 0 may use it,
    /// see [`RendezvousHost::local_addr`](super::RendezvousHost::local_addr)).
    pub master_port: u16,
    /// Address rank 0 binds.
    pub bind_addr: String,
    /// How long the rendezvous waits for every rank.
    pub rendezvous_timeout: Duration,
    /// How long a collective waits for every rank.
    pub world_timeout: Duration,
    /// Which launcher's variables were read.
    pub launcher: Launcher,
    token: Vec<u8>,
}

impl fmt::Debug for WorldConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorldConfig")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("local_rank", &self.local_rank)
            .field("local_size", &self.local_size)
            .field("master_addr", &self.master_addr)
            .field("master_port", &self.master_port)
            .field("bind_addr", &self.bind_addr)
            .field("rendezvous_timeout", &self.rendezvous_timeout)
            .field("world_timeout", &self.world_timeout)
            .field("launcher", &self.launcher)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl WorldConfig {
    /// A configuration built by hand: rank `rank` of `size`, rank 0 at
    /// `master_addr:master_port`, sharing `token`. Local rank 0, default
    /// timeouts, bind address chosen as [`from_env`](Self::from_env) does.
    pub fn new(rank: usize, size: usize, master_addr: &str, master_port: u16, token: &str) -> WorldConfig {
        WorldConfig {
            rank,
            size,
            local_rank: 0,
            local_size: None,
            master_addr: master_addr.to_string(),
            master_port,
            bind_addr: default_bind_addr(master_addr),
            rendezvous_timeout: DEFAULT_RENDEZVOUS_TIMEOUT,
            world_timeout: DEFAULT_WORLD_TIMEOUT,
            launcher: Launcher::Manual,
            token: token.as_bytes().to_vec(),
        }
    }

    /// Sets the rendezvous timeout.
    pub fn with_rendezvous_timeout(mut self, timeout: Duration) -> WorldConfig {
        self.rendezvous_timeout = timeout;
        self
    }

    /// Sets the collective timeout.
    pub fn with_world_timeout(mut self, timeout: Duration) -> WorldConfig {
        self.world_timeout = timeout;
        self
    }

    /// Replaces the job token.
    pub fn with_token(mut self, token: &str) -> WorldConfig {
        self.token = token.as_bytes().to_vec();
        self
    }

    pub(crate) fn token(&self) -> &[u8] {
        &self.token
    }

    /// Reads the process environment; see [`from_vars`](Self::from_vars).
    /// A variable it consults whose value is not UTF-8 is
    /// [`Error::BadEnv`] naming it (never taken for unset).
    pub fn from_env() -> Result<Option<WorldConfig>> {
        Self::from_os_vars(&|name| std::env::var_os(name))
    }

    /// [`from_vars`](Self::from_vars) over raw values: the first variable
    /// consulted whose value is not UTF-8 is [`Error::BadEnv`] naming it.
    pub(crate) fn from_os_vars(get: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> Result<Option<WorldConfig>> {
        let garbled = std::cell::RefCell::new(None);
        let r = Self::from_vars(&|name| match get(name)?.into_string() {
            Ok(v) => Some(v),
            Err(raw) => {
                garbled.borrow_mut().get_or_insert((name.to_string(), raw));
                None
            }
        });
        match garbled.into_inner() {
            Some((var, raw)) => Err(Error::BadEnv {
                var,
                value: raw.to_string_lossy().into_owned(),
                reason: "is not valid UTF-8".into(),
            }),
            None => r,
        }
    }

    /// Detects the launch from variables looked up through `get`.
    ///
    /// `Ok(None)` means a single process (no launcher variables, or a world
    /// size of 1). Launchers are tried in the order torchrun (`RANK`,
    /// `WORLD_SIZE`), mpirun (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`),
    /// srun (`SLURM_PROCID`, `SLURM_NTASKS`). Inconsistent or unparsable
    /// values are errors naming the variable and its value; a world size above
    /// [`MAX_WORLD_SIZE`](super::MAX_WORLD_SIZE) is one.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<WorldConfig>> {
        // Empty values count as unset: `export RANK=` is a common leftover.
        let get = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let (launcher, rank_var, size_var, local_rank_var, local_size_var) = if get("RANK").is_some() || get("WORLD_SIZE").is_some() {
            (Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        } else if get("OMPI_COMM_WORLD_RANK").is_some() || get("OMPI_COMM_WORLD_SIZE").is_some() {
            (
                Launcher::Mpirun,
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            )
        } else if get("SLURM_PROCID").is_some() || get("SLURM_NTASKS").is_some() {
            (
                Launcher::Slurm,
                "SLURM_PROCID",
                "SLURM_NTASKS",
                "SLURM_LOCALID",
                "SLURM_NTASKS_PER_NODE",
            )
        } else {
            return Ok(None);
        };
        let need = |var: &'static str| {
            get(var).ok_or_else(|| Error::MissingEnv {
                var,
                hint: format!("the {launcher:?} launch variables are only partly set; set {rank_var} and {size_var} together"),
            })
        };
        let size = parse_num::<usize>(size_var, &need(size_var)?)?;
        let rank = parse_num::<usize>(rank_var, &need(rank_var)?)?;
        if size == 0 {
            return Err(bad(size_var, "0", "must be at least 1"));
        }
        if size > super::MAX_WORLD_SIZE {
            return Err(bad(
                size_var,
                &size.to_string(),
                &format!("must be at most {} (doorbell::world::MAX_WORLD_SIZE)", super::MAX_WORLD_SIZE),
            ));
        }
        if rank >= size {
            return Err(bad(rank_var, &rank.to_string(), &format!("must be below {size_var}={size}")));
        }
        if size == 1 {
            return Ok(None);
        }
        // Slurm's per-node count may be a list like "4(x2)"; only a plain number is used.
        let local_size = match get(local_size_var) {
            Some(v) if launcher == Launcher::Slurm && v.parse::<usize>().is_err() => None,
            Some(v) => Some(parse_num::<usize>(local_size_var, &v)?),
            None => None,
        };
        let local_rank = match get(local_rank_var) {
            Some(v) => parse_num::<usize>(local_rank_var, &v)?,
            None => 0,
        };
        if let Some(ls) = local_size {
            if ls == 0 || ls > size {
                return Err(bad(local_size_var, &ls.to_string(), &format!("must be in 1..={size}")));
            }
            if local_rank >= ls {
                return Err(bad(
                    local_rank_var,
                    &local_rank.to_string(),
                    &format!("must be below {local_size_var}={ls}"),
                ));
            }
        }
        let single_node = match launcher {
            Launcher::Mpirun => local_size == Some(size),
            Launcher::Slurm => get("SLURM_NNODES").or_else(|| get("SLURM_JOB_NUM_NODES")).as_deref() == Some("1"),
            _ => false,
        };

        let master_addr = match get("DOORBELL_MASTER_ADDR").or_else(|| get("MASTER_ADDR")) {
            Some(a) => a.trim().to_string(),
            None if single_node => "127.0.0.1".to_string(),
            None => {
                return Err(Error::MissingEnv {
                    var: "MASTER_ADDR",
                    hint: "a multi-node job needs rank 0's host: export MASTER_ADDR (or DOORBELL_MASTER_ADDR) on every process, \
                           e.g. under Slurm `export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)`"
                        .to_string(),
                })
            }
        };
        let port_var = if get("DOORBELL_MASTER_PORT").is_some() {
            "DOORBELL_MASTER_PORT"
        } else {
            "MASTER_PORT"
        };
        let master_port = match get(port_var) {
            Some(p) => parse_num::<u16>(port_var, &p)?,
            None if launcher == Launcher::Torchrun => {
                return Err(Error::MissingEnv {
                    var: "MASTER_PORT",
                    hint: "torchrun sets it; when launching by hand export MASTER_PORT (or DOORBELL_MASTER_PORT) on every process"
                        .to_string(),
                })
            }
            None => DEFAULT_PORT,
        };
        if master_port == 0 {
            return Err(bad(port_var, "0", "must be a fixed port that every rank knows (1..=65535)"));
        }
        let bind_addr = get("DOORBELL_BIND_ADDR")
            .map(|a| a.trim().to_string())
            .unwrap_or_else(|| default_bind_addr(&master_addr));
        let rendezvous_timeout = match get("DOORBELL_RENDEZVOUS_TIMEOUT_S") {
            Some(v) => parse_secs("DOORBELL_RENDEZVOUS_TIMEOUT_S", &v)?,
            None => DEFAULT_RENDEZVOUS_TIMEOUT,
        };
        let world_timeout = match get("DOORBELL_WORLD_TIMEOUT_S") {
            Some(v) => parse_secs("DOORBELL_WORLD_TIMEOUT_S", &v)?,
            None => DEFAULT_WORLD_TIMEOUT,
        };
        let token = get("DOORBELL_TOKEN").ok_or_else(|| Error::MissingEnv {
            var: "DOORBELL_TOKEN",
            hint: format!(
                "a job of {size} processes needs a shared secret so that only its own processes join: generate one per job \
                 and export it to every process, e.g. `export DOORBELL_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n')` \
                 before torchrun/srun, and `mpirun -x DOORBELL_TOKEN ...` under Open MPI"
            ),
        })?;
        if token.len() < super::MIN_TOKEN_BYTES {
            return Err(Error::TokenTooShort {
                rank,
                len: token.len(),
                min: super::MIN_TOKEN_BYTES,
            });
        }
        if let Some(reason) = super::low_entropy(token.as_bytes()) {
            return Err(Error::WeakToken { rank, reason });
        }
        Ok(Some(WorldConfig {
            rank,
            size,
            local_rank,
            local_size,
            master_addr,
            master_port,
            bind_addr,
            rendezvous_timeout,
            world_timeout,
            launcher,
            token: token.into_bytes(),
        }))
    }
}

fn bad(var: &str, value: &str, reason: &str) -> Error {
    Error::BadEnv {
        var: var.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn parse_num<T: std::str::FromStr>(var: &str, value: &str) -> Result<T> {
    value.trim().parse::<T>().map_err(|_| {
        bad(
            var,
            value,
            &format!(
                "is not a valid {}",
                if std::mem::size_of::<T>() == 2 {
                    "port number"
                } else {
                    "non-negative integer"
                }
            ),
        )
    })
}

fn parse_secs(var: &str, value: &str) -> Result<Duration> {
    match value.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
        _ => Err(bad(var, value, "is not a positive number of seconds")),
    }
}

/// Loopback masters bind loopback (nothing else can reach them anyway);
/// otherwise listen on every interface, which survives NAT and multi-homed
/// hosts where MASTER_ADDR names another interface's address.
fn default_bind_addr(master_addr: &str) -> String {
    let loopback = master_addr == "localhost" || master_addr.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        master_addr.to_string()
    } else {
        "0.0.0.0".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A token of the least accepted length.
    const T: &str = "5f0c2e9a7b3d41e8";

    fn detect(vars: &[(&str, &str)]) -> Result<Option<WorldConfig>> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        WorldConfig::from_vars(&|k| map.get(k).cloned())
    }

    #[test]
    fn nothing_set_is_single_process() {
        assert!(detect(&[]).unwrap().is_none());
        assert!(detect(&[("DOORBELL_TOKEN", T), ("MASTER_ADDR", "h")]).unwrap().is_none());
    }

    #[test]
    fn world_size_one_is_single_process_and_needs_no_token() {
        assert!(detect(&[("RANK", "0"), ("WORLD_SIZE", "1")]).unwrap().is_none());
    }

    #[test]
    fn torchrun() {
        let c = detect(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "29400"),
            ("DOORBELL_TOKEN", "s3cret-0123456789abcdef"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((c.rank, c.size, c.local_rank, c.local_size), (3, 8, 1, Some(2)));
        assert_eq!((c.master_addr.as_str(), c.master_port), ("node7", 29400));
        assert_eq!(c.bind_addr, "0.0.0.0");
        assert_eq!(c.launcher, Launcher::Torchrun);
        assert_eq!(c.rendezvous_timeout, DEFAULT_RENDEZVOUS_TIMEOUT);
        assert_eq!(c.token(), b"s3cret-0123456789abcdef");
        assert!(!format!("{c:?}").contains("s3cret"), "Debug must not print the token");
    }

    #[test]
    fn torchrun_without_port_names_it() {
        let e = detect(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("DOORBELL_TOKEN", T)]).unwrap_err();
        assert!(matches!(e, Error::MissingEnv { var: "MASTER_PORT", .. }), "{e}");
    }

    #[test]
    fn mpirun_single_node_defaults() {
        let c = detect(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("DOORBELL_TOKEN", T),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((c.rank, c.size, c.local_rank), (1, 4, 1));
        assert_eq!(
            (c.master_addr.as_str(), c.master_port, c.bind_addr.as_str()),
            ("127.0.0.1", DEFAULT_PORT, "127.0.0.1")
        );
        assert_eq!(c.launcher, Launcher::Mpirun);
    }

    #[test]
    fn mpirun_multi_node_takes_doorbell_vars_first() {
        let c = detect(&[
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "5"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "8"),
            ("MASTER_ADDR", "ignored"),
            ("DOORBELL_MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "1"),
            ("DOORBELL_MASTER_PORT", "40000"),
            ("DOORBELL_BIND_ADDR", "10.0.0.1"),
            ("DOORBELL_RENDEZVOUS_TIMEOUT_S", "2.5"),
            ("DOORBELL_WORLD_TIMEOUT_S", "30"),
            ("DOORBELL_TOKEN", T),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.master_addr.as_str(), c.master_port, c.bind_addr.as_str()),
            ("10.0.0.1", 40000, "10.0.0.1")
        );
        assert_eq!(c.rendezvous_timeout, Duration::from_millis(2500));
        assert_eq!(c.world_timeout, Duration::from_secs(30));
    }

    #[test]
    fn mpirun_multi_node_without_address_says_how() {
        let e = detect(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "8"),
            ("DOORBELL_TOKEN", T),
        ])
        .unwrap_err();
        assert!(matches!(e, Error::MissingEnv { var: "MASTER_ADDR", .. }), "{e}");
        assert!(e.to_string().contains("export MASTER_ADDR"), "{e}");
    }

    #[test]
    fn slurm() {
        let c = detect(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS_PER_NODE", "2(x2)"),
            ("SLURM_NNODES", "2"),
            ("MASTER_ADDR", "gpu01"),
            ("DOORBELL_TOKEN", T),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((c.rank, c.size, c.local_rank, c.local_size), (2, 4, 0, None));
        assert_eq!((c.master_addr.as_str(), c.master_port), ("gpu01", DEFAULT_PORT));
        assert_eq!(c.launcher, Launcher::Slurm);
        let one_node = detect(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_NNODES", "1"),
            ("DOORBELL_TOKEN", T),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(one_node.master_addr, "127.0.0.1");
    }

    #[test]
    fn torchrun_wins_over_slurm() {
        let c = detect(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "5"),
            ("DOORBELL_TOKEN", T),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((c.launcher, c.rank), (Launcher::Torchrun, 1));
    }

    #[test]
    fn missing_token_says_how_to_set_it() {
        let e = detect(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "5")]).unwrap_err();
        assert!(matches!(e, Error::MissingEnv { var: "DOORBELL_TOKEN", .. }), "{e}");
        assert!(e.to_string().contains("export DOORBELL_TOKEN="), "{e}");
        let empty = detect(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "5"),
            ("DOORBELL_TOKEN", ""),
        ]);
        assert!(matches!(empty, Err(Error::MissingEnv { var: "DOORBELL_TOKEN", .. })));
    }

    fn bad_var(vars: &[(&str, &str)]) -> (String, String) {
        match detect(vars) {
            Err(Error::BadEnv { var, value, .. }) => (var, value),
            other => panic!("expected BadEnv, got {other:?}"),
        }
    }

    #[test]
    fn inconsistent_values_name_variable_and_value() {
        let base = [("MASTER_ADDR", "h"), ("MASTER_PORT", "5"), ("DOORBELL_TOKEN", T)];
        let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&'static str, &'static str)> {
            base.iter().copied().chain(extra.iter().copied()).collect()
        };
        assert_eq!(bad_var(&with(&[("RANK", "4"), ("WORLD_SIZE", "4")])), ("RANK".into(), "4".into()));
        assert_eq!(bad_var(&with(&[("RANK", "x"), ("WORLD_SIZE", "4")])), ("RANK".into(), "x".into()));
        assert_eq!(
            bad_var(&with(&[("RANK", "0"), ("WORLD_SIZE", "-2")])),
            ("WORLD_SIZE".into(), "-2".into())
        );
        assert_eq!(
            bad_var(&with(&[("RANK", "0"), ("WORLD_SIZE", "0")])),
            ("WORLD_SIZE".into(), "0".into())
        );
        assert_eq!(
            bad_var(&with(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "2"),
                ("LOCAL_WORLD_SIZE", "2")
            ])),
            ("LOCAL_RANK".into(), "2".into())
        );
        assert_eq!(
            bad_var(&[("OMPI_COMM_WORLD_RANK", "7"), ("OMPI_COMM_WORLD_SIZE", "2"), ("DOORBELL_TOKEN", T)]),
            ("OMPI_COMM_WORLD_RANK".into(), "7".into())
        );
        assert_eq!(
            bad_var(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "two")]),
            ("SLURM_NTASKS".into(), "two".into())
        );
        assert_eq!(
            bad_var(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "70000"),
                ("DOORBELL_TOKEN", T)
            ]),
            ("MASTER_PORT".into(), "70000".into())
        );
        assert_eq!(
            bad_var(&with(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("DOORBELL_RENDEZVOUS_TIMEOUT_S", "-1")
            ])),
            ("DOORBELL_RENDEZVOUS_TIMEOUT_S".into(), "-1".into())
        );
        let e = detect(&with(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err().to_string();
        assert!(e.contains("RANK=\"4\"") && e.contains("WORLD_SIZE=4"), "{e}");
    }

    #[test]
    fn half_set_launcher_names_the_missing_variable() {
        let e = detect(&[("RANK", "0")]).unwrap_err();
        assert!(matches!(e, Error::MissingEnv { var: "WORLD_SIZE", .. }), "{e}");
    }

    #[test]
    fn short_token_is_refused_with_how_to_make_one() {
        let vars = |token: &'static str| {
            [
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "5"),
                ("DOORBELL_TOKEN", token),
            ]
        };
        let e = detect(&vars("0123456789abcde")).unwrap_err();
        assert!(matches!(e, Error::TokenTooShort { rank: 1, len: 15, min: 16 }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("DOORBELL_TOKEN") && msg.contains("head -c16 /dev/urandom"), "{msg}");
        let e = detect(&vars("aaaaaaaaaaaaaaaa")).unwrap_err();
        assert!(matches!(e, Error::WeakToken { rank: 1, .. }), "{e}");
        assert!(e.to_string().contains("head -c16 /dev/urandom | od -An -tx1"), "{e}");
        assert!(!msg.contains("0123456789abcde"), "the message must not print the token: {msg}");
        assert_eq!(detect(&vars(T)).unwrap().unwrap().token(), T.as_bytes());
    }
}
