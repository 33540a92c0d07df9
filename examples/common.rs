//! Small helpers shared by the examples: argument parsing and reporting.

pub mod plot;

/// PTX of the user kernel crate (`examples/user-kernels`), built by this
/// package's `build.rs` with `doorbell::build::PtxBuilder`.
pub const USER_KERNELS_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/doorbell_example_kernels.ptx"));

use std::collections::HashMap;

/// `--key value` / `--flag` arguments.
pub struct Args {
    values: HashMap<String, String>,
    flags: Vec<String>,
    pub positional: Vec<String>,
}

impl Args {
    /// Parses `std::env::args()`; `flags` lists the options that take no value.
    pub fn parse(flags: &[&str]) -> Result<Args, String> {
        Self::from_iter(std::env::args().skip(1), flags)
    }

    /// Parses the given arguments.
    pub fn from_iter(it: impl IntoIterator<Item = String>, flags: &[&str]) -> Result<Args, String> {
        let mut values = HashMap::new();
        let mut fl = Vec::new();
        let mut positional = Vec::new();
        let mut it = it.into_iter();
        while let Some(a) = it.next() {
            if let Some(k) = a.strip_prefix("--") {
                if let Some((k, v)) = k.split_once('=') {
                    values.insert(k.to_string(), v.to_string());
                } else if flags.contains(&k) {
                    fl.push(k.to_string());
                } else {
                    let v = it.next().ok_or_else(|| format!("--{k} needs a value"))?;
                    values.insert(k.to_string(), v);
                }
            } else {
                positional.push(a);
            }
        }
        Ok(Args {
            values,
            flags: fl,
            positional,
        })
    }

    /// The string value of `--key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(|s| s.as_str())
    }

    /// True when `--flag` was given.
    pub fn flag(&self, key: &str) -> bool {
        self.flags.iter().any(|f| f == key)
    }

    /// `--key` as an unsigned number (decimal or 0x hex), or `default`.
    pub fn num(&self, key: &str, default: u64) -> Result<u64, String> {
        match self.get(key) {
            None => Ok(default),
            Some(s) => parse_u64(s).ok_or_else(|| format!("--{key} {s:?} is not a number (decimal or 0x hex)")),
        }
    }

    /// The backend `--device gpu|cpu|auto` names, else `DOORBELL_DEVICE`'s.
    pub fn backend(&self) -> doorbell::Result<doorbell::Backend> {
        match self.get("device") {
            Some(d) => d.parse(),
            None => doorbell::Backend::from_env(),
        }
    }

    /// Options that were given but are not in `known`.
    pub fn unknown(&self, known: &[&str]) -> Vec<String> {
        self.values
            .keys()
            .chain(self.flags.iter())
            .filter(|k| !known.contains(&k.as_str()))
            .cloned()
            .collect()
    }
}

/// Decimal or `0x` hex, with optional `_` separators.
pub fn parse_u64(s: &str) -> Option<u64> {
    let s = s.replace('_', "");
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

/// Exits with `msg` on stderr and status 2.
pub fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(2)
}

/// FNV-1a over bytes: a short fingerprint to compare outputs across runs.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}
