//! Pairs of ranks on two nodes, as `proxy_bench` measures its round trip
//! and message rates between them: rank `i` of the first node with rank
//! `i` of the second; and the rate of every pair together.

/// Which ranks measure with which.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pairs {
    /// Ranks of a node: a pair's ranks lie this far apart.
    per_node: u32,
    /// Pairs measuring at once (`1..=per_node`).
    count: u32,
}

impl Pairs {
    /// The pairs of `ranks` ranks on `nodes` nodes (`None`: every rank a
    /// node of its own, as two ranks without `DOORBELL_NODES` are), the
    /// first `count` of them (`None`: one per rank of a node). A count
    /// the nodes cannot hold is refused, naming it.
    pub fn new(ranks: u32, nodes: Option<u32>, count: Option<u32>) -> Result<Pairs, String> {
        let nodes = nodes.unwrap_or(ranks);
        if nodes < 2 || !ranks.is_multiple_of(nodes) {
            return Err(format!(
                "the round trip and the rates run between ranks on different nodes: {nodes} node(s) of {ranks} ranks hold no such pair"
            ));
        }
        let per_node = ranks / nodes;
        let count = count.unwrap_or(per_node);
        if count == 0 || count > per_node {
            return Err(format!(
                "--pairs {count}: {per_node} rank(s) per node pair up with the next node's, so 1 to {per_node} pairs can measure"
            ));
        }
        Ok(Pairs { per_node, count })
    }

    /// Every measuring pair: (leader, partner), ranks of the first and
    /// second node.
    pub fn list(&self) -> Vec<[u32; 2]> {
        (0..self.count).map(|i| [i, i + self.per_node]).collect()
    }

    /// `rank`'s part: its peer and whether it leads; `None` outside every
    /// pair.
    pub fn role(&self, rank: u32) -> Option<(u32, bool)> {
        self.list().into_iter().find_map(|[a, b]| match rank {
            r if r == a => Some((b, true)),
            r if r == b => Some((a, false)),
            _ => None,
        })
    }
}

/// One rate launch's figures.
#[derive(Debug, Default)]
pub struct Rates {
    /// Each pair's own: its puts over its first post to its last
    /// completion.
    pub per_pair: Vec<f64>,
    /// Every pair's puts over the span from the first pair's first post to
    /// the last pair's last completion (`%globaltimer`, one clock on one
    /// GPU; GPUs of one host keep theirs within microseconds).
    pub all: f64,
}

impl Rates {
    /// From each leader's (own rate, start ns, end ns) and the puts each
    /// posted.
    pub fn of(bursts: &[[u64; 3]], puts: f64) -> Rates {
        let start = bursts.iter().map(|b| b[1]).min().unwrap_or(0);
        let end = bursts.iter().map(|b| b[2]).max().unwrap_or(0);
        Rates {
            per_pair: bursts.iter().map(|b| f64::from_bits(b[0])).collect(),
            all: puts * bursts.len() as f64 / (end.saturating_sub(start).max(1) as f64 * 1e-9) / 1e6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Pairs, Rates};

    #[test]
    fn pairs_join_each_rank_of_the_first_node_to_its_place_on_the_second() {
        let two = Pairs::new(2, None, None).unwrap();
        assert_eq!(two.list(), [[0, 1]]);
        assert_eq!((two.role(0), two.role(1)), (Some((1, true)), Some((0, false))));
        let p = Pairs::new(6, Some(2), None).unwrap();
        assert_eq!(p.list(), [[0, 3], [1, 4], [2, 5]]);
        assert_eq!((p.role(1), p.role(5)), (Some((4, true)), Some((2, false))));
        let one = Pairs::new(8, Some(4), Some(1)).unwrap();
        assert_eq!(one.list(), [[0, 2]]);
        assert_eq!((one.role(1), one.role(3), one.role(4)), (None, None, None));
    }

    #[test]
    fn the_rate_of_every_pair_together_is_over_their_joint_span() {
        let bits = |x: f64| x.to_bits();
        // Two pairs of 1000 puts: one over [0, 1 ms), one over [0.5, 1.5 ms).
        let r = Rates::of(&[[bits(1.0), 0, 1_000_000], [bits(1.0), 500_000, 1_500_000]], 1000.0);
        assert_eq!(r.per_pair, [1.0, 1.0]);
        assert!((r.all - 2000.0 / 1.5e-3 / 1e6).abs() < 1e-9, "{}", r.all);
        assert!(r.all <= r.per_pair.iter().sum::<f64>());
    }

    #[test]
    fn pairs_the_nodes_cannot_hold_are_refused_naming_them() {
        let e = Pairs::new(4, Some(2), Some(3)).unwrap_err();
        assert!(e.contains("--pairs 3") && e.contains("1 to 2"), "{e}");
        assert!(Pairs::new(4, Some(2), Some(0)).unwrap_err().contains("--pairs 0"));
        assert!(Pairs::new(2, Some(1), None).unwrap_err().contains("different nodes"));
    }
}
