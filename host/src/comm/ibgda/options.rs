//! The IBGDA transport's settings ([`IbgdaOptions`]) and the routed
//! transport's choice of peers reached through the NIC ([`RdmaPeers`]).

use doorbell_kernels::transport::ibgda::MAX_BATCH;

use crate::error::{Error, Result};
use crate::nic::soft::{LinkModel, SoftNicEngine, SoftOptions};

/// `DOORBELL_IBGDA_QPS_PER_PEER`: RC QPs per peer, 1..=[`MAX_QPS_PER_PEER`]
/// (the world's ranks times this must fit the NIC port's QPs: 64 on the
/// soft NIC).
pub const QPS_ENV: &str = "DOORBELL_IBGDA_QPS_PER_PEER";
/// The most RC QPs per peer `DOORBELL_IBGDA_QPS_PER_PEER` takes (two ranks
/// fill the soft NIC's port with 32; a NIC's own bound is checked at set-up).
pub const MAX_QPS_PER_PEER: u32 = 64;
/// `DOORBELL_IBGDA_SQ_SIZE`: send-queue slots per QP, a power of two in 32..=32768.
pub const SQ_ENV: &str = "DOORBELL_IBGDA_SQ_SIZE";
/// `DOORBELL_IBGDA_MAX_MSG`: most bytes per WQE, 1..2^31 (a longer put or
/// get is posted as several WQEs).
pub const MAX_MSG_ENV: &str = "DOORBELL_IBGDA_MAX_MSG";
/// `DOORBELL_RDMA_PEERS`: which pairs of ranks the routed transport sends
/// through the NIC although load/store reaches them.
pub const RDMA_PEERS_ENV: &str = "DOORBELL_RDMA_PEERS";
/// `DOORBELL_NODES`: the world's ranks form this many modeled nodes of
/// consecutive ranks (the world size divided evenly): the routed transport
/// reaches a peer on another node through the NIC, one on its own node by
/// load/store, and the soft NIC models a 400 Gb/s, 2 µs link
/// ([`NODE_LINK`]) unless `DOORBELL_SOFTNIC_LINK` says otherwise.
pub const NODES_ENV: &str = "DOORBELL_NODES";
/// The link modeled nodes get when `DOORBELL_SOFTNIC_LINK` is unset.
pub const NODE_LINK: LinkModel = LinkModel::new(400_000_000_000, 2_000);

/// `DOORBELL_NODES` (unset: `None`), 1..=1024.
fn nodes_from_env() -> Result<Option<usize>> {
    if crate::vars::raw(NODES_ENV)?.is_none() {
        return Ok(None);
    }
    Ok(Some(crate::vars::uint(NODES_ENV, 1, 1, 1024)? as usize))
}

/// IBGDA settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbgdaOptions {
    /// RC QPs per peer (default 2). Block `b` posts on QP `b mod n`, so
    /// more QPs let more blocks post without taking turns on one send
    /// queue; every QP costs a CQ, rings and a slot of the port's 64. Two,
    /// as NVSHMEM's IBGDA defaults to, keeps worlds of up to 32 ranks
    /// within the soft NIC's port limits.
    pub qps_per_peer: u32,
    /// Send-queue slots per QP, a power of two ≥ 32 (one warp's batch);
    /// each QP's CQ has as many entries. Default 256.
    pub sq_size: u32,
    /// Largest message of one WQE, below 2^31 (`DOORBELL_IBGDA_MAX_MSG`); longer
    /// puts and gets are split (default 1 MiB: long transfers become
    /// several WQEs the NIC can pipeline; the soft NIC copies each WQE as
    /// one piece, so larger WQEs move its large puts faster).
    pub max_msg: u32,
    /// The soft NIC's link model (`DOORBELL_SOFTNIC_LINK`; `None`: off).
    pub link: Option<LinkModel>,
    /// Where the soft NIC's engine runs (`DOORBELL_SOFTNIC_ENGINE`; `None`:
    /// the kernel on a GPU, the host thread on the emulator).
    pub engine: Option<SoftNicEngine>,
    /// Threads of the engine kernel's one block per port
    /// (`DOORBELL_SOFTNIC_ENGINE_THREADS`; `None`: [`ENGINE_THREADS_GPU`](crate::nic::soft::ENGINE_THREADS_GPU) on
    /// a GPU, 32 on the emulator, where every thread is an OS thread).
    pub engine_threads: Option<u32>,
    /// Blocks (SMs) of the engine kernel per port
    /// (`DOORBELL_SOFTNIC_ENGINE_BLOCKS`, 1..=32; `None`:
    /// [`ENGINE_BLOCKS_GPU`](crate::nic::soft::ENGINE_BLOCKS_GPU) on a GPU,
    /// 1 on the emulator): up to 8 run QPs, each its own, so more QPs per
    /// peer are served side by side; the others serve none and copy chunks
    /// of the large puts and gets.
    pub engine_blocks: Option<u32>,
    /// Makes the engine kernel's ordering with the ranks (the acquire after
    /// a doorbell record, the fence before a short copy after payload, the
    /// releases of CQEs, atomics and signal words) `sys`-scoped even when
    /// every rank runs on the engine's GPU, where it is `gpu`-scoped
    /// otherwise (`DOORBELL_SOFTNIC_SCOPE=sys`; default `auto`). With
    /// ranks on several GPUs it is `sys` either way. For measuring what the
    /// narrower scope saves (on one H200: within the spread between runs,
    /// `benchmarks/ibgda_h200_scope_ab.txt`).
    pub engine_sys_scope: bool,
    /// Makes the engine kernel's block copies with its threads alone
    /// (`DOORBELL_SOFTNIC_COPY=threads`; default `bulk`: a copy of 64 KiB
    /// or more whose two ends share their offset mod 16 moves its
    /// 16-byte-aligned body through the SM's bulk-copy
    /// unit, staged in the block's shared memory). For measuring what the
    /// bulk-copy unit gains.
    pub engine_thread_copies: bool,
    /// Most WQEs of one burst of the engine kernel
    /// (`DOORBELL_SOFTNIC_BURST`, 0..=32; `None`: 32): runs of small RDMA
    /// WRITEs its block reads and checks together, a WQE per thread
    /// (`doorbell_softnic::engine::burst`); 0 turns bursts off, so every
    /// WQE takes the one-WQE path (for measuring what they save).
    pub engine_burst: Option<u32>,
    /// How long the engine kernel's control thread sleeps between passes
    /// once idle, ns (`DOORBELL_SOFTNIC_IDLE_SLEEP_NS`, 0..=1000000;
    /// `None`: 100); 0: it never sleeps, so a doorbell is seen a pass
    /// after it rings.
    pub engine_idle_sleep_ns: Option<u32>,
}

impl Default for IbgdaOptions {
    fn default() -> Self {
        IbgdaOptions {
            qps_per_peer: 2,
            sq_size: 256,
            max_msg: 1 << 20,
            link: None,
            engine: None,
            engine_threads: None,
            engine_blocks: None,
            engine_sys_scope: false,
            engine_thread_copies: false,
            engine_burst: None,
            engine_idle_sleep_ns: None,
        }
    }
}

/// Refuses, before any QP is made, a world whose QPs (`qps_per_peer` per
/// rank, itself included) do not fit the NIC port's `max` (`None`: no
/// bound), naming the setting that fits. Every rank opens the same kind of
/// NIC, so every rank refuses alike.
pub(super) fn check_qp_room(world: usize, qps_per_peer: usize, max: Option<usize>) -> Result<()> {
    let Some(max) = max else { return Ok(()) };
    let need = world.saturating_mul(qps_per_peer);
    if need <= max {
        return Ok(());
    }
    let fits = max / world.max(1);
    let advice = if fits == 0 {
        format!("the port cannot hold a QP for each of {world} ranks")
    } else {
        format!("use at most {fits} QPs per peer ({QPS_ENV}, or IbgdaOptions::qps_per_peer)")
    };
    Err(Error::comm(format!(
        "IBGDA set-up: {world} ranks x {qps_per_peer} QPs per peer need {need} QPs on each rank's NIC port, which takes {max}: {advice}"
    )))
}

impl IbgdaOptions {
    /// The defaults with `DOORBELL_IBGDA_QPS_PER_PEER`,
    /// `DOORBELL_IBGDA_SQ_SIZE`, `DOORBELL_SOFTNIC_LINK`,
    /// `DOORBELL_SOFTNIC_ENGINE`, `DOORBELL_SOFTNIC_ENGINE_THREADS`,
    /// `DOORBELL_SOFTNIC_ENGINE_BLOCKS`, `DOORBELL_SOFTNIC_SCOPE`, `DOORBELL_SOFTNIC_COPY`,
    /// `DOORBELL_SOFTNIC_BURST` and `DOORBELL_SOFTNIC_IDLE_SLEEP_NS` applied,
    /// strictly.
    pub fn from_env() -> Result<IbgdaOptions> {
        let d = IbgdaOptions::default();
        let qps = crate::vars::uint(QPS_ENV, d.qps_per_peer as u64, 1, MAX_QPS_PER_PEER as u64)? as u32;
        let sq = crate::vars::uint(SQ_ENV, d.sq_size as u64, MAX_BATCH as u64, 32768)? as u32;
        if !sq.is_power_of_two() {
            return Err(Error::BadEnv {
                var: SQ_ENV.to_string(),
                value: sq.to_string(),
                reason: "is not a power of two; use 32, 64, 128, ... 32768".to_string(),
            });
        }
        let max_msg = crate::vars::uint(MAX_MSG_ENV, d.max_msg as u64, 1, (1 << 31) - 1)? as u32;
        let soft = SoftOptions::from_env()?;
        // Modeled nodes talk over a modeled link unless told otherwise.
        let link_unset = crate::vars::raw(doorbell_softnic::LINK_ENV)?.is_none();
        let link = match nodes_from_env()? {
            Some(_) if link_unset => Some(NODE_LINK),
            _ => soft.link,
        };
        Ok(IbgdaOptions {
            qps_per_peer: qps,
            sq_size: sq,
            max_msg,
            link,
            engine: soft.engine,
            engine_threads: soft.engine_threads,
            engine_blocks: soft.engine_blocks,
            engine_sys_scope: soft.sys_scope,
            engine_thread_copies: soft.thread_copies,
            engine_burst: soft.burst,
            engine_idle_sleep_ns: soft.idle_sleep_ns,
        })
    }

    pub(super) fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::comm(format!("IBGDA options: {what}")));
        if !(1..=MAX_QPS_PER_PEER).contains(&self.qps_per_peer) {
            return bad(format!("qps_per_peer {} is not in 1..={MAX_QPS_PER_PEER}", self.qps_per_peer));
        }
        if !self.sq_size.is_power_of_two() || !(MAX_BATCH..=32768).contains(&self.sq_size) {
            return bad(format!("sq_size {} is not a power of two in 32..=32768", self.sq_size));
        }
        // A WQE's byte count of 2^31 is mlx5's inline-segment flag.
        if self.max_msg == 0 || self.max_msg >= 1 << 31 {
            return bad(format!(
                "max_msg {} is not in 1..2^31 (a data segment's byte count of 2^31 or more is mlx5's inline flag)",
                self.max_msg
            ));
        }
        self.soft().check().or_else(bad)
    }

    /// The soft NIC's part of these settings.
    pub(crate) fn soft(&self) -> SoftOptions {
        SoftOptions {
            link: self.link,
            engine: self.engine,
            engine_threads: self.engine_threads,
            engine_blocks: self.engine_blocks,
            sys_scope: self.engine_sys_scope,
            thread_copies: self.engine_thread_copies,
            burst: self.engine_burst,
            idle_sleep_ns: self.engine_idle_sleep_ns,
        }
    }
}

/// Which pairs of ranks the routed transport sends through the NIC.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum RdmaPeers {
    /// Only peers that load/store cannot reach (none, within one host).
    #[default]
    Needed,
    /// Every pair.
    All,
    /// These pairs (both directions), on top of the needed ones.
    Pairs(Vec<(usize, usize)>),
    /// The world as this many modeled nodes of consecutive ranks
    /// (`DOORBELL_NODES`): every pair on different nodes.
    Nodes(usize),
}

impl RdmaPeers {
    /// Parses `all`, `none` or `a-b,c-d,...` (ranks, `a != b`).
    pub fn parse(var: &str, s: &str) -> Result<RdmaPeers> {
        let bad = |reason: String| Error::BadEnv {
            var: var.to_string(),
            value: s.to_string(),
            reason,
        };
        let t = s.trim();
        match t {
            "" | "none" => return Ok(RdmaPeers::Needed),
            "all" => return Ok(RdmaPeers::All),
            _ => {}
        }
        let mut pairs = Vec::new();
        for item in t.split(',') {
            let (a, b) = item.split_once('-').ok_or_else(|| {
                bad(format!(
                    "has {item:?}, not a pair `a-b`; accepted: all, none, or pairs like 0-1,2-3"
                ))
            })?;
            let rank = |x: &str| {
                x.trim()
                    .parse::<usize>()
                    .map_err(|_| bad(format!("has {x:?}, not a rank number; accepted: all, none, or pairs like 0-1,2-3")))
            };
            let (a, b) = (rank(a)?, rank(b)?);
            if a == b {
                return Err(bad(format!("pairs rank {a} with itself; a rank reaches itself by load/store")));
            }
            pairs.push((a, b));
        }
        Ok(RdmaPeers::Pairs(pairs))
    }

    /// `DOORBELL_NODES` alone, as [`RdmaPeers::Nodes`] (`None` when unset),
    /// checked against a world of `size` ranks ([`Self::check_env`]): the
    /// CPU proxy's routes, which `DOORBELL_RDMA_PEERS` does not set.
    pub(crate) fn nodes_from_env(size: usize) -> Result<Option<RdmaPeers>> {
        let peers = nodes_from_env()?.map(RdmaPeers::Nodes);
        if let Some(p) = &peers {
            p.check_env(size)?;
        }
        Ok(peers)
    }

    /// [`Self::from_env`] checked against a world of `size` ranks
    /// ([`Self::check_env`]).
    pub(crate) fn from_env_for(size: usize) -> Result<RdmaPeers> {
        let peers = Self::from_env()?;
        peers.check_env(size)?;
        Ok(peers)
    }

    /// `DOORBELL_RDMA_PEERS`, else `DOORBELL_NODES` ([`RdmaPeers::Nodes`]);
    /// neither: [`RdmaPeers::Needed`]. Both set is refused.
    pub fn from_env() -> Result<RdmaPeers> {
        match (crate::vars::raw(RDMA_PEERS_ENV)?, nodes_from_env()?) {
            (Some(v), Some(_)) => Err(Error::BadEnv {
                var: NODES_ENV.to_string(),
                value: std::env::var(NODES_ENV).unwrap_or_default(),
                reason: format!("is set together with {RDMA_PEERS_ENV}={v:?}: set one of the two"),
            }),
            (Some(v), None) => RdmaPeers::parse(RDMA_PEERS_ENV, &v),
            (None, Some(n)) => Ok(RdmaPeers::Nodes(n)),
            (None, None) => Ok(RdmaPeers::Needed),
        }
    }

    /// Whether `rank` reaches `peer` by RDMA under this setting (checking
    /// the setting against the world size: an error names the setting as
    /// the caller gave it; the communicator checks one read from the
    /// environment so that its error names the variable).
    pub fn forced(&self, rank: usize, peer: usize, size: usize) -> Result<bool> {
        if let Some(reason) = self.misfit(size) {
            return Err(Error::comm(format!("the route setting RdmaPeers::{self:?} {reason}")));
        }
        Ok(match self {
            RdmaPeers::Needed => false,
            RdmaPeers::All => peer != rank,
            RdmaPeers::Pairs(p) => p.iter().any(|&(a, b)| (a, b) == (rank, peer) || (b, a) == (rank, peer)),
            RdmaPeers::Nodes(n) => {
                let per = size / n;
                rank / per != peer / per
            }
        })
    }

    /// Why this setting cannot route a world of `size` ranks (`None`: it
    /// can).
    fn misfit(&self, size: usize) -> Option<String> {
        match self {
            RdmaPeers::Pairs(p) => p
                .iter()
                .find(|(a, b)| *a >= size || *b >= size)
                .map(|(a, b)| format!("names the pair {a}-{b}, a rank outside this world of {size} ranks")),
            RdmaPeers::Nodes(n) if *n == 0 || *n > size || !size.is_multiple_of(*n) => {
                Some(format!("does not divide this world of {size} ranks into nodes of equal size"))
            }
            _ => None,
        }
    }

    /// Checks a setting read from the environment ([`Self::from_env`])
    /// against a world of `size` ranks: the
    /// error names the variable (`DOORBELL_NODES`, `DOORBELL_RDMA_PEERS`)
    /// and its value.
    pub(crate) fn check_env(&self, size: usize) -> Result<()> {
        let Some(reason) = self.misfit(size) else { return Ok(()) };
        let var = match self {
            RdmaPeers::Nodes(_) => NODES_ENV,
            _ => RDMA_PEERS_ENV,
        };
        Err(Error::BadEnv {
            var: var.to_string(),
            value: std::env::var(var).unwrap_or_default(),
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_world_whose_qps_overflow_the_port_is_refused_with_the_setting_that_fits() {
        check_qp_room(2, 32, Some(64)).unwrap();
        check_qp_room(1000, 64, None).unwrap();
        let e = check_qp_room(8, 16, Some(64)).unwrap_err().to_string();
        assert!(
            e.contains("8 ranks x 16 QPs per peer need 128 QPs") && e.contains("use at most 8 QPs per peer (DOORBELL_IBGDA_QPS_PER_PEER"),
            "{e}"
        );
        let e = check_qp_room(65, 1, Some(64)).unwrap_err().to_string();
        assert!(e.contains("cannot hold a QP for each of 65 ranks"), "{e}");
    }

    #[test]
    fn modeled_nodes_send_exactly_the_pairs_across_nodes_through_the_nic() {
        let two = RdmaPeers::Nodes(2);
        let rdma: Vec<Vec<bool>> = (0..4).map(|r| (0..4).map(|p| two.forced(r, p, 4).unwrap()).collect()).collect();
        assert_eq!(
            rdma,
            vec![
                vec![false, false, true, true],
                vec![false, false, true, true],
                vec![true, true, false, false],
                vec![true, true, false, false],
            ]
        );
        assert!(!RdmaPeers::Nodes(1).forced(0, 3, 4).unwrap(), "one node: all load/store");
        assert!(RdmaPeers::Nodes(4).forced(1, 2, 4).unwrap(), "a node per rank: all through the NIC");
        for (n, size) in [(3, 4), (0, 4), (8, 4)] {
            // Given by the caller: the error names the setting, not a variable.
            let e = RdmaPeers::Nodes(n).forced(0, 1, size).unwrap_err().to_string();
            assert!(
                e.contains(&format!("RdmaPeers::Nodes({n})")) && e.contains("does not divide") && !e.contains("DOORBELL"),
                "{n} nodes of {size}: {e}"
            );
            // Read from the environment: the variable.
            let e = RdmaPeers::Nodes(n).check_env(size).unwrap_err();
            assert!(matches!(&e, Error::BadEnv { var, .. } if var == "DOORBELL_NODES"), "{e}");
            assert!(e.to_string().contains("does not divide"), "{e}");
        }
        let e = RdmaPeers::Pairs(vec![(0, 1), (2, 5)]).check_env(4).unwrap_err();
        assert!(matches!(&e, Error::BadEnv { var, .. } if var == "DOORBELL_RDMA_PEERS"), "{e}");
        assert!(e.to_string().contains("2-5, a rank outside this world of 4 ranks"), "{e}");
        assert!(RdmaPeers::Nodes(2).check_env(4).is_ok() && RdmaPeers::All.check_env(1).is_ok());
    }

    #[test]
    fn a_largest_message_of_2_31_is_refused_as_the_inline_flag() {
        let with = |max_msg| {
            IbgdaOptions {
                max_msg,
                ..IbgdaOptions::default()
            }
            .validate()
        };
        assert!(with((1 << 31) - 1).is_ok());
        for bad in [0, 1 << 31, u32::MAX] {
            match with(bad) {
                Err(e) => assert!(e.to_string().contains("max_msg"), "{e}"),
                Ok(()) => panic!("max_msg {bad} accepted"),
            }
        }
    }
}
