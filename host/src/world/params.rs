//! Checking that every rank was given the same work.

use super::World;
use crate::error::{Error, Result};

impl World {
    /// Collective: checks that every rank presents the same named
    /// parameters (iterations, sizes, ... as the ranks were launched with).
    /// On a difference every rank gets [`Error::ParamsDiffer`], one message
    /// listing each differing parameter with every rank's value, e.g.
    /// *"the ranks disagree on iters (rank 0: 1000, rank 1: 10)"*. Call it
    /// before the work starts: ranks that disagree would otherwise wait for
    /// each other until a timeout, or report a success for different work.
    pub fn check_same_params(&self, params: &[(&str, u64)]) -> Result<()> {
        let mine: String = params.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        let all = self.all_gather_bytes(mine.as_bytes())?;
        let decode = |b: &[u8]| -> Vec<(String, String)> {
            String::from_utf8_lossy(b)
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let tables: Vec<Vec<(String, String)>> = all.iter().map(|b| decode(b)).collect();
        let mut names: Vec<String> = Vec::new();
        for t in &tables {
            for (k, _) in t {
                if !names.contains(k) {
                    names.push(k.clone());
                }
            }
        }
        let value = |t: &[(String, String)], k: &str| t.iter().find(|(n, _)| n == k).map_or("(not given)".to_string(), |(_, v)| v.clone());
        let differing: Vec<String> = names
            .iter()
            .filter(|k| tables.iter().any(|t| value(t, k) != value(&tables[0], k)))
            .map(|k| {
                let per_rank: Vec<String> = tables
                    .iter()
                    .enumerate()
                    .map(|(r, t)| format!("rank {r}: {}", value(t, k)))
                    .collect();
                format!("{k} ({})", per_rank.join(", "))
            })
            .collect();
        if differing.is_empty() {
            Ok(())
        } else {
            Err(Error::ParamsDiffer {
                rank: self.rank(),
                detail: differing.join("; "),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_params_pass_and_different_ones_list_every_rank() {
        let ok = World::run_threads(3, |w| w.check_same_params(&[("iters", 10), ("size", 8)]));
        assert!(ok.iter().all(|r| r.is_ok()), "{ok:?}");
        let errs = World::run_threads(3, |w| {
            let iters = if w.rank() == 2 { 5 } else { 10 };
            w.check_same_params(&[("iters", iters), ("size", 8)])
        });
        for (r, e) in errs.into_iter().enumerate() {
            let msg = e.unwrap_err().to_string();
            assert!(
                msg.contains(&format!("rank {r}:")) && msg.contains("iters (rank 0: 10, rank 1: 10, rank 2: 5)") && !msg.contains("size"),
                "{msg}"
            );
        }
    }
}
