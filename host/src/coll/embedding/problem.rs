//! The problem an exchange is built for, its sharding, the host-side
//! checks of lookups, the traffic they make, and the sequential CPU
//! reference the exchange is checked against.

use std::collections::{BTreeMap, HashSet};

use doorbell_kernels::coll::embedding::{EmbShape, MAX_DIM, MAX_LOOKUPS, MAX_TABLES, PAD};

use super::invalid;
use crate::error::Result;

/// The problem: the same on every rank.
///
/// Every table has `rows` rows of `dim` f32; global row `j` lives on rank
/// `j % ranks` as its local row `j / ranks`. A rank's lookups are
/// `ids[table][sample][pooling]` ([`PAD`] is padding); its pooled output is
/// `out[sample][table][dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Ranks.
    pub ranks: u32,
    /// Tables.
    pub tables: u32,
    /// Rows of every table.
    pub rows: u32,
    /// Elements per row.
    pub dim: u32,
    /// Samples per rank.
    pub batch: u32,
    /// Ids per bag.
    pub pooling: u32,
}

impl Problem {
    /// The kernels' view of this problem, with request lists of `cap` keys
    /// and a hash table of `1 << hash_bits` slots (0 and 0 for kernels that
    /// use neither).
    pub fn shape(&self, cap: u32, hash_bits: u32) -> EmbShape {
        EmbShape {
            tables: self.tables,
            dim: self.dim,
            batch: self.batch,
            pooling: self.pooling,
            rows: self.rows,
            shard_rows: self.shard_rows(),
            cap,
            hash_bits,
        }
    }

    /// Lookups of one rank (`tables * batch * pooling`), padding included.
    pub fn lookups(&self) -> usize {
        self.tables as usize * self.batch as usize * self.pooling as usize
    }
    /// Rows of every table per rank.
    pub fn shard_rows(&self) -> u32 {
        self.rows.div_ceil(self.ranks)
    }
    /// f32 of one rank's shard (`[table][local row][dim]`).
    pub fn shard_len(&self) -> usize {
        self.tables as usize * self.shard_rows() as usize * self.dim as usize
    }
    /// f32 of one rank's output (`[sample][table][dim]`).
    pub fn out_len(&self) -> usize {
        self.batch as usize * self.tables as usize * self.dim as usize
    }
    /// Checks the limits of the kernels: 1..=64 ranks, 1..=[`MAX_TABLES`]
    /// tables, `dim` 1..=[`MAX_DIM`], 1..[`PAD`] rows, a batch and bags of
    /// at least one, at most 2^29 lookups per rank.
    pub fn check(&self) -> Result<()> {
        if self.ranks == 0 || self.ranks > 64 {
            return Err(invalid(format!("{} ranks: use 1..=64", self.ranks)));
        }
        if self.tables == 0 || self.tables > MAX_TABLES {
            return Err(invalid(format!("{} tables: use 1..={MAX_TABLES}", self.tables)));
        }
        if self.dim == 0 || self.dim > MAX_DIM {
            return Err(invalid(format!("dim {}: use 1..={MAX_DIM}", self.dim)));
        }
        if self.rows == 0 || self.rows == PAD {
            return Err(invalid(format!("{} rows: use 1..={}", self.rows, PAD - 1)));
        }
        if self.batch == 0 || self.pooling == 0 {
            return Err(invalid("batch and pooling must be at least 1"));
        }
        if self.lookups() as u64 > MAX_LOOKUPS {
            return Err(invalid(format!(
                "{} lookups per rank: keep tables * batch * pooling at most 2^29",
                self.lookups()
            )));
        }
        Ok(())
    }
}

/// Where rank `rank`'s rows lie: for every row of its shard that holds a
/// global row, (the row's offset in `[table][global row][dim]`, its offset
/// in the shard's `[table][local row][dim]`), in f32.
fn shard_rows_of(p: &Problem, rank: u32) -> impl Iterator<Item = (usize, usize)> + '_ {
    let (d, sr) = (p.dim as usize, p.shard_rows());
    (0..p.tables as usize).flat_map(move |t| {
        (0..sr)
            .map(move |l| (l, l * p.ranks + rank))
            .filter(|&(_, j)| j < p.rows)
            .map(move |(l, j)| ((t * p.rows as usize + j as usize) * d, (t * sr as usize + l as usize) * d))
    })
}

/// Rank `rank`'s shard of `tables` (`[table][global row][dim]`), as
/// [`super::EmbeddingExchange::load_shard`] takes it; rows past the end are
/// zero.
pub fn shard_of(p: &Problem, tables: &[f32], rank: u32) -> Vec<f32> {
    let d = p.dim as usize;
    let mut v = vec![0f32; p.shard_len()];
    for (global, local) in shard_rows_of(p, rank) {
        v[local..local + d].copy_from_slice(&tables[global..global + d]);
    }
    v
}

/// Writes `shard` of `rank` back into `tables` (`[table][global row][dim]`).
pub fn unshard(p: &Problem, tables: &mut [f32], shard: &[f32], rank: u32) {
    let d = p.dim as usize;
    for (global, local) in shard_rows_of(p, rank) {
        tables[global..global + d].copy_from_slice(&shard[local..local + d]);
    }
}

/// Checks every rank's lookups on the host (`ids[rank]`, each
/// `[table][sample][pooling]`): the first id out of range is an error
/// naming rank, table, sample and position. The device checks them too
/// (an [`super::EmbeddingError::BadId`], nothing written); this check
/// says so before anything runs.
pub fn validate_ids(p: &Problem, ids: &[Vec<u32>]) -> Result<()> {
    for (r, v) in ids.iter().enumerate() {
        if v.len() != p.lookups() {
            return Err(invalid(format!(
                "rank {r} has {} ids, expected tables*batch*pooling = {}",
                v.len(),
                p.lookups()
            )));
        }
        if let Some(i) = v.iter().position(|&id| id != PAD && id >= p.rows) {
            let per = p.batch as usize * p.pooling as usize;
            return Err(invalid(format!(
                "id {} (rank {r}, table {}, sample {}, position {}) is out of range: tables have {} rows \
                 (0xFFFFFFFF is padding); nothing was run",
                v[i],
                i / per,
                i % per / p.pooling as usize,
                i % p.pooling as usize,
                p.rows
            )));
        }
    }
    Ok(())
}

/// The sequential reference forward of one rank: `[sample][table][dim]`,
/// each bag summed in position order (the exchange's order: its forward
/// is bit-exact against this).
pub fn reference_forward(p: &Problem, tables: &[f32], ids: &[u32]) -> Vec<f32> {
    let d = p.dim as usize;
    let mut out = vec![0f32; p.out_len()];
    for s in 0..p.batch as usize {
        for t in 0..p.tables as usize {
            let o = &mut out[(s * p.tables as usize + t) * d..][..d];
            for q in 0..p.pooling as usize {
                let id = ids[(t * p.batch as usize + s) * p.pooling as usize + q];
                if id == PAD {
                    continue;
                }
                let row = &tables[(t * p.rows as usize + id as usize) * d..][..d];
                o.iter_mut().zip(row).for_each(|(a, b)| *a += *b);
            }
        }
    }
    out
}

/// The sequential reference backward + SGD over every rank's lookups:
/// `grad(rank, sample, table)` gives the upstream gradient row (`dim`
/// elements) of a bag; every (table, id) gets the sum of its lookups'
/// gradients (rank, table, sample, position order), then `row -= lr * sum`.
pub fn reference_backward<'g>(p: &Problem, tables: &mut [f32], ids: &[Vec<u32>], lr: f32, grad: impl Fn(u32, u32, u32) -> &'g [f32]) {
    let d = p.dim as usize;
    let mut sum: BTreeMap<(u32, u32), Vec<f32>> = Default::default();
    for (r, v) in ids.iter().enumerate() {
        for t in 0..p.tables {
            for s in 0..p.batch {
                let g = grad(r as u32, s, t);
                for q in 0..p.pooling {
                    let id = v[((t * p.batch + s) * p.pooling + q) as usize];
                    if id == PAD {
                        continue;
                    }
                    let acc = sum.entry((t, id)).or_insert_with(|| vec![0.0; d]);
                    for (a, g) in acc.iter_mut().zip(g) {
                        *a += *g;
                    }
                }
            }
        }
    }
    for ((t, id), g) in sum {
        let row = &mut tables[(t as usize * p.rows as usize + id as usize) * d..][..d];
        row.iter_mut().zip(&g).for_each(|(w, g)| *w -= lr * *g);
    }
}

/// Traffic of one step's forward: lookups sent with and without dedup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Non-padding lookups over all ranks.
    pub lookups: u64,
    /// Unique (table, id) keys per (requester, owner), summed over ranks:
    /// the rows the fused exchange moves.
    pub unique: u64,
    /// Of those, rows that stay on their own rank.
    pub unique_local: u64,
    /// Largest (requester, owner) list: the capacity the exchange needs.
    pub max_pair: u64,
}

impl Traffic {
    /// Bytes of rows one direction moves without / with dedup, dim `d`.
    pub fn row_bytes(&self, d: u32) -> (u64, u64) {
        (self.lookups * d as u64 * 4, self.unique * d as u64 * 4)
    }
}

/// Counts the traffic of `ids` (every rank's): [`Traffic::max_pair`] is
/// the list capacity an exchange needs for them.
pub fn traffic(p: &Problem, ids: &[Vec<u32>]) -> Traffic {
    let mut tr = Traffic::default();
    for (r, v) in ids.iter().enumerate() {
        let mut seen = HashSet::new();
        let mut per_owner = vec![0u64; p.ranks as usize];
        for (i, &id) in v.iter().enumerate() {
            if id == PAD || id >= p.rows {
                continue;
            }
            tr.lookups += 1;
            let t = i / (p.batch as usize * p.pooling as usize);
            if seen.insert((t, id)) {
                tr.unique += 1;
                per_owner[(id % p.ranks) as usize] += 1;
                if (id % p.ranks) as usize == r {
                    tr.unique_local += 1;
                }
            }
        }
        tr.max_pair = tr.max_pair.max(per_owner.into_iter().max().unwrap_or(0));
    }
    tr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_hold_every_rth_row_and_give_the_tables_back() {
        let p = Problem {
            ranks: 3,
            tables: 2,
            rows: 7,
            dim: 2,
            batch: 1,
            pooling: 1,
        };
        let tables: Vec<f32> = (0..2 * 7 * 2).map(|i| i as f32 + 1.0).collect();
        let shards: Vec<Vec<f32>> = (0..3).map(|r| shard_of(&p, &tables, r)).collect();
        // Rank 1 holds global rows 1 and 4 of each table; its third local row is past the end.
        assert_eq!(shards[1], [3.0, 4.0, 9.0, 10.0, 0.0, 0.0, 17.0, 18.0, 23.0, 24.0, 0.0, 0.0]);
        let mut back = vec![0f32; tables.len()];
        for (r, s) in shards.iter().enumerate() {
            unshard(&p, &mut back, s, r as u32);
        }
        assert_eq!(back, tables);
    }
}
