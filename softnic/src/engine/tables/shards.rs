//! Several engine blocks on one port: which block serves which QP
//! ([`Port::assign_shards`]) and the counters each block keeps
//! ([`Port::stats_mut`], [`Port::total_stats`]).
//!
//! A block of the GPU-resident engine is one control thread: its passes
//! over the port's QPs are serial, each QP's step a chain of dependent
//! loads, so one block's rate falls as QPs are added. With several blocks
//! each runs its own QPs, side by side on its own SM. Blocks share nothing
//! they write: a QP, the CQs it completes into (its send and receive CQ)
//! and its counters belong to one block. QPs that share a CQ therefore
//! belong to the same block. The link model's one transmitter for the whole
//! port ([`Port::tx_free_ps`]) is the exception: every block reserves it
//! with an atomic compare-and-swap ([`crate::engine::mem::reserve_wire`]),
//! so QPs on different blocks share its bandwidth as QPs of one block do.
//!
//! The assignment is made once, on the tables a resident engine takes
//! (no QP changes state while it runs: the host wrapper refuses), and
//! read by every block when it lists its QPs.

use super::{Port, PortStats, MAX_CQS, MAX_SHARDS};

impl PortStats {
    /// All zero.
    pub const ZERO: PortStats = PortStats {
        wqes: 0,
        bytes: 0,
        cqes: 0,
        errors: 0,
        flushes: 0,
        doorbells: 0,
        doorbells_dropped: 0,
        dbr_rereads: 0,
        executed: 0,
        fetched: 0,
        last_uar: 0,
        last_sq_pi: 0,
        last_qpn: 0,
        last_wqe: 0,
        reserved: 0,
    };
}

impl Port {
    /// The counters QP slot `q` adds to: those of the block serving it.
    #[inline(always)]
    pub fn stats_mut(&mut self, q: usize) -> &mut PortStats {
        let shard = self.qps.get(q).map_or(0, |qp| qp.shard as usize);
        &mut self.stats[shard % MAX_SHARDS]
    }

    /// The counters of every block added up. The `last_*` fields, which
    /// name the latest doorbell or WQE a block handled, are those of the
    /// block that saw the most doorbells (blocks keep no common clock).
    pub fn total_stats(&self) -> PortStats {
        let mut t = PortStats::ZERO;
        let mut busiest: Option<&PortStats> = None;
        for s in &self.stats {
            t.wqes += s.wqes;
            t.bytes += s.bytes;
            t.cqes += s.cqes;
            t.errors += s.errors;
            t.flushes += s.flushes;
            t.doorbells += s.doorbells;
            t.doorbells_dropped += s.doorbells_dropped;
            t.dbr_rereads += s.dbr_rereads;
            t.executed += s.executed;
            t.fetched += s.fetched;
            if busiest.is_none_or(|b| s.doorbells + s.fetched > b.doorbells + b.fetched) {
                busiest = Some(s);
            }
        }
        if let Some(b) = busiest {
            (t.last_uar, t.last_sq_pi, t.last_qpn, t.last_wqe) = (b.last_uar, b.last_sq_pi, b.last_qpn, b.last_wqe);
        }
        t
    }

    /// Spreads the QPs in use over at most `blocks` engine blocks (clamped
    /// to `1..=`[`MAX_SHARDS`]) and returns how many blocks have QPs to
    /// serve (at least 1): QPs linked by a CQ (as send or receive CQ of
    /// either) form a group, and groups go to blocks in turn, in the order
    /// of their lowest QP slot. With one block every QP is block 0's.
    pub fn assign_shards(&mut self, blocks: u32) -> u32 {
        for qp in self.qps.iter_mut() {
            qp.shard = 0;
        }
        let blocks = blocks.clamp(1, MAX_SHARDS as u32);
        if blocks == 1 {
            return 1;
        }
        // Union-find over CQ slots; a QP joins its send and receive CQ.
        let mut parent: [u8; MAX_CQS] = core::array::from_fn(|i| i as u8);
        fn root(parent: &mut [u8; MAX_CQS], mut c: usize) -> usize {
            while parent[c] as usize != c {
                parent[c] = parent[parent[c] as usize];
                c = parent[c] as usize;
            }
            c
        }
        let cq_of = |c: u32| (c as usize) % MAX_CQS;
        for qp in self.qps.iter().filter(|qp| qp.in_use()) {
            let (a, b) = (root(&mut parent, cq_of(qp.send_cq)), root(&mut parent, cq_of(qp.recv_cq)));
            parent[a.max(b)] = a.min(b) as u8;
        }
        // Groups to blocks in turn, by the group's first QP.
        let mut block_of_group = [u8::MAX; MAX_CQS];
        let mut groups = 0u32;
        for q in 0..self.qps.len() {
            if !self.qps[q].in_use() {
                continue;
            }
            let g = root(&mut parent, cq_of(self.qps[q].send_cq));
            if block_of_group[g] == u8::MAX {
                block_of_group[g] = (groups % blocks) as u8;
                groups += 1;
            }
            self.qps[q].shard = block_of_group[g] as u32;
        }
        groups.clamp(1, blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{QpEntry, QP_IN_USE};
    use super::*;
    use crate::engine::LinkModel;

    fn port_with(cqs: &[(u32, u32)]) -> Port {
        let mut p = Port::new(1, LinkModel::OFF);
        for (q, &(s, r)) in cqs.iter().enumerate() {
            p.qps[q] = QpEntry {
                send_cq: s,
                recv_cq: r,
                flags: QP_IN_USE,
                ..QpEntry::EMPTY
            };
        }
        p
    }

    fn shards(p: &Port) -> Vec<u32> {
        p.qps.iter().filter(|q| q.in_use()).map(|q| q.shard).collect()
    }

    #[test]
    fn qps_of_their_own_cqs_go_to_blocks_in_turn() {
        let mut p = port_with(&[(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]);
        assert_eq!(p.assign_shards(2), 2);
        assert_eq!(shards(&p), [0, 1, 0, 1, 0]);
        assert_eq!(p.assign_shards(8), 5);
        assert_eq!(shards(&p), [0, 1, 2, 3, 4]);
        assert_eq!(p.assign_shards(1), 1);
        assert_eq!(shards(&p), [0; 5]);
    }

    #[test]
    fn qps_linked_by_a_cq_share_a_block() {
        // QP 2 links QP 0's CQ 0 with QP 1's CQ 1 (as its receive CQ):
        // all three are one group; QP 3 is another.
        let mut p = port_with(&[(0, 0), (1, 1), (0, 1), (5, 5)]);
        assert_eq!(p.assign_shards(4), 2);
        assert_eq!(shards(&p), [0, 0, 0, 1]);
        // A chain through receive CQs: 0 -> 7, 7 -> 9, 9 -> 9.
        let mut p = port_with(&[(0, 7), (7, 9), (9, 9), (3, 3)]);
        assert_eq!(p.assign_shards(3), 2);
        assert_eq!(shards(&p), [0, 0, 0, 1]);
    }

    #[test]
    fn the_link_model_spreads_qps_like_any_port() {
        // One transmitter for the port, reserved atomically by every block:
        // the link no longer keeps the QPs on one block.
        let mut p = port_with(&[(0, 0), (1, 1)]);
        p.link = LinkModel::new(400_000_000_000, 2_000);
        assert_eq!(p.assign_shards(4), 2);
        assert_eq!(shards(&p), [0, 1]);
    }

    #[test]
    fn counters_add_up_over_blocks() {
        let mut p = port_with(&[(0, 0), (1, 1)]);
        p.assign_shards(2);
        p.stats_mut(0).wqes += 3;
        p.stats_mut(1).wqes += 4;
        p.stats_mut(1).doorbells += 2;
        p.stats_mut(1).last_qpn = 77;
        assert_eq!((p.stats[0].wqes, p.stats[1].wqes), (3, 4));
        let t = p.total_stats();
        assert_eq!((t.wqes, t.doorbells, t.last_qpn), (7, 2, 77));
    }
}
