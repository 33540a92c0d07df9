//! The `DOORBELL_*` variables in effect: what each is, and whether the
//! crate's own parser takes its value.

use serde::Serialize;

/// Who reads a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VarKind {
    /// The runtime ([`crate::env::CHECKS`]).
    Runtime,
    /// The world of several processes ([`crate::WorldConfig::from_env`]).
    World,
    /// The PTX build ([`crate::build`]), at build time only.
    Build,
    /// The tests.
    Test,
    /// No part of doorbell reads it.
    Unknown,
}

/// The world's variables ([`crate::WorldConfig`]).
pub const WORLD_VARS: &[&str] = &[
    "DOORBELL_TOKEN",
    "DOORBELL_MASTER_ADDR",
    "DOORBELL_MASTER_PORT",
    "DOORBELL_BIND_ADDR",
    "DOORBELL_HOSTNAME",
    "DOORBELL_RENDEZVOUS_TIMEOUT_S",
    "DOORBELL_WORLD_TIMEOUT_S",
];

/// The build's variables ([`crate::build`]).
pub const BUILD_VARS: &[&str] = &[
    "DOORBELL_SKIP_PTX",
    "DOORBELL_PTX_ARCH",
    "DOORBELL_DEVICE_CARGO",
    "DOORBELL_DEVICE_RUSTC",
    "DOORBELL_PTX_TARGET_DIR",
    "DOORBELL_PTXAS",
    "DOORBELL_RDMA_INCLUDE",
];

/// Who reads `name` (a `DOORBELL_*` name).
pub fn classify(name: &str) -> VarKind {
    if crate::env::CHECKS.iter().any(|c| c.vars.contains(&name)) {
        VarKind::Runtime
    } else if WORLD_VARS.contains(&name) {
        VarKind::World
    } else if BUILD_VARS.contains(&name) {
        VarKind::Build
    } else if name.starts_with("DOORBELL_TEST_") || name == "DOORBELL_BLESS" {
        VarKind::Test
    } else {
        VarKind::Unknown
    }
}

/// Every name doorbell reads, for suggestions.
fn known_names() -> impl Iterator<Item = &'static str> {
    crate::env::CHECKS
        .iter()
        .flat_map(|c| c.vars.iter().copied())
        .chain(WORLD_VARS.iter().copied())
        .chain(BUILD_VARS.iter().copied())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The known name closest to an unknown `name` (a likely typo), if any is
/// close.
pub fn suggest(name: &str) -> Option<&'static str> {
    known_names()
        .map(|k| (edit_distance(name, k), k))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k)
}

/// One `DOORBELL_*` variable of the environment.
#[derive(Clone, Debug, Serialize)]
pub struct EnvVar {
    /// The name.
    pub name: String,
    /// The value (lossy UTF-8; `DOORBELL_TOKEN` is not shown).
    pub value: String,
    /// Who reads it.
    pub kind: VarKind,
    /// `ok`, `bad`, `unknown`, or `not_checked` (build and test variables).
    pub status: &'static str,
    /// What is wrong, or what it is.
    pub message: String,
}

/// The variables of `vars` (name, value) whose name starts with
/// `DOORBELL_`, sorted by name, classified; runtime and world values are
/// validated by `errors`, which maps a variable to its parser's message.
pub fn classify_all(vars: &[(String, String)], errors: &dyn Fn(&str) -> Option<String>) -> Vec<EnvVar> {
    let mut out: Vec<EnvVar> = vars
        .iter()
        .filter(|(n, _)| n.starts_with("DOORBELL_"))
        .map(|(name, value)| {
            let kind = classify(name);
            let value = if name == "DOORBELL_TOKEN" {
                format!("({} bytes, not shown)", value.len())
            } else {
                value.clone()
            };
            let (status, message) = match kind {
                VarKind::Unknown => (
                    "unknown",
                    match suggest(name) {
                        Some(k) => format!("no part of doorbell reads {name}; did you mean {k}?"),
                        None => format!("no part of doorbell reads {name}"),
                    },
                ),
                VarKind::Build => ("not_checked", "read by the PTX build (cargo build), not at run time".to_string()),
                VarKind::Test => ("not_checked", "read by doorbell's tests".to_string()),
                VarKind::Runtime | VarKind::World => match errors(name) {
                    Some(e) => ("bad", e),
                    None => ("ok", String::new()),
                },
            };
            EnvVar {
                name: name.clone(),
                value,
                kind,
                status,
                message,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The variable a crate error names, where it is a bad or missing variable.
pub fn error_var(e: &crate::Error) -> Option<String> {
    match e {
        crate::Error::BadEnv { var, .. } => Some(var.clone()),
        crate::Error::MissingEnv { var, .. } => Some(var.to_string()),
        _ => None,
    }
}

/// Runs every runtime check ([`crate::env::CHECKS`]) and, where a world
/// variable is set, the world's parser; returns each failing variable with
/// its message.
pub fn check_process_env() -> Vec<(String, String)> {
    let mut bad = Vec::new();
    for c in crate::env::CHECKS {
        if let Err(e) = (c.check)() {
            let var = error_var(&e).unwrap_or_else(|| c.vars[0].to_string());
            bad.push((var, e.to_string()));
        }
    }
    if let Some((var, msg)) = check_world_vars(&|n| std::env::var(n).ok()) {
        bad.push((var, msg));
    }
    bad
}

/// Validates the world's variables with the world's own parser
/// ([`crate::WorldConfig::from_vars`]): under a launcher, as the program
/// will read them; without one, where a world `DOORBELL_*` variable is set,
/// with a launch of two processes assumed around it, so that a bad value
/// is found before a job is started.
pub fn check_world_vars(get: &dyn Fn(&str) -> Option<String>) -> Option<(String, String)> {
    let set = |n: &str| get(n).filter(|v| !v.trim().is_empty());
    let launched = [
        "RANK",
        "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "SLURM_PROCID",
        "SLURM_NTASKS",
    ]
    .iter()
    .any(|v| set(v).is_some());
    if !launched && !WORLD_VARS.iter().any(|v| set(v).is_some()) {
        return None;
    }
    let r = if launched {
        crate::WorldConfig::from_vars(get)
    } else {
        // Only what the world needs besides doorbell's own variables.
        crate::WorldConfig::from_vars(&|n| match n {
            "RANK" => Some("0".into()),
            "WORLD_SIZE" => Some("2".into()),
            "MASTER_ADDR" => Some("127.0.0.1".into()),
            "MASTER_PORT" => Some("29500".into()),
            "DOORBELL_TOKEN" => get(n).or_else(|| Some("3f9a0c7e5b21d84c6e0f1a2b9d8c7e6f".into())),
            n if n.starts_with("DOORBELL_") => get(n),
            _ => None,
        })
    };
    match r {
        Ok(_) => None,
        Err(e) => {
            let var = error_var(&e).unwrap_or_else(|| "DOORBELL_TOKEN".to_string());
            Some((var, e.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_classified() {
        assert_eq!(classify("DOORBELL_WAIT_TIMEOUT_S"), VarKind::Runtime);
        assert_eq!(classify("DOORBELL_CUBIN"), VarKind::Runtime, "a former name is still read");
        assert_eq!(classify("DOORBELL_IB_MTU"), VarKind::Runtime);
        assert_eq!(classify("DOORBELL_TOKEN"), VarKind::World);
        assert_eq!(classify("DOORBELL_SKIP_PTX"), VarKind::Build);
        assert_eq!(classify("DOORBELL_TEST_REQUIRE_GPU"), VarKind::Test);
        assert_eq!(classify("DOORBELL_WAIT_TIMEOUT"), VarKind::Unknown);
        assert_eq!(suggest("DOORBELL_WAIT_TIMEOUT"), Some("DOORBELL_WAIT_TIMEOUT_S"));
        assert_eq!(suggest("DOORBELL_COMPLETELY_DIFFERENT"), None);
    }

    #[test]
    fn values_are_classified_with_their_parsers_verdict() {
        let vars: Vec<(String, String)> = [
            ("PATH", "/bin"),
            ("DOORBELL_WAIT_TIMEOUT_S", "abc"),
            ("DOORBELL_LOG", "info"),
            ("DOORBELL_LGO", "info"),
            ("DOORBELL_TOKEN", "secretsecretsecret"),
            ("DOORBELL_SKIP_PTX", "1"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        let errors = |n: &str| (n == "DOORBELL_WAIT_TIMEOUT_S").then(|| "not a number".to_string());
        let out = classify_all(&vars, &errors);
        let names: Vec<&str> = out.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "DOORBELL_LGO",
                "DOORBELL_LOG",
                "DOORBELL_SKIP_PTX",
                "DOORBELL_TOKEN",
                "DOORBELL_WAIT_TIMEOUT_S"
            ]
        );
        let status: Vec<&str> = out.iter().map(|v| v.status).collect();
        assert_eq!(status, ["unknown", "ok", "not_checked", "ok", "bad"]);
        assert!(out[0].message.contains("did you mean DOORBELL_LOG"), "{}", out[0].message);
        assert!(!out[3].value.contains("secret"), "the token is not shown");
        assert_eq!(out[4].message, "not a number");
    }

    #[test]
    fn world_variables_are_checked_by_the_worlds_parser_without_a_launcher() {
        let env =
            |pairs: &'static [(&'static str, &'static str)]| move |n: &str| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string());
        assert_eq!(check_world_vars(&env(&[])), None, "nothing set, nothing checked");
        assert_eq!(check_world_vars(&env(&[("DOORBELL_WORLD_TIMEOUT_S", "30")])), None);
        let (var, msg) = check_world_vars(&env(&[("DOORBELL_WORLD_TIMEOUT_S", "soon")])).expect("bad");
        assert_eq!(var, "DOORBELL_WORLD_TIMEOUT_S", "{msg}");
        let (var, _) = check_world_vars(&env(&[("DOORBELL_MASTER_PORT", "70000")])).expect("bad port");
        assert_eq!(var, "DOORBELL_MASTER_PORT");
        assert!(check_world_vars(&env(&[("DOORBELL_TOKEN", "short")])).is_some(), "a short token");
        // Under a launcher the world is read as the program will: a missing token is named.
        let (var, _) = check_world_vars(&env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "29500"),
            ("MASTER_ADDR", "10.0.0.1"),
        ]))
        .expect("no token");
        assert_eq!(var, "DOORBELL_TOKEN");
    }
}
