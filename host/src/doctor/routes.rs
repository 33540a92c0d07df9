//! Which route each pair of ranks of a world on this host would take, by
//! the communicator's own decision ([`crate::comm::route_to`]) and the
//! routed transport's ([`crate::comm::RdmaPeers::forced`]).

use serde::Serialize;

use crate::comm::{route_to, PeerPlace, PeerRoute, RdmaPeers};

/// How the ranks of the modelled world are launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Launch {
    /// One process per rank (torchrun, mpirun, srun), rank `r` on GPU
    /// `r % gpus`.
    Processes,
    /// Thread ranks of one process ([`crate::comm::Communicator::local`]):
    /// every rank on GPU 0, or rank `r` on GPU `r % gpus` with
    /// `DOORBELL_RANK_PER_GPU=1`.
    Threads,
}

/// How two GPUs reach each other, as the driver and NVML say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Link {
    /// `cuDeviceCanAccessPeer`.
    pub can_access: bool,
    /// Native peer atomics (`None`: not known).
    pub native_atomics: Option<bool>,
    /// NVLink between them (`None`: not known, no NVML).
    pub nvlink: Option<bool>,
}

/// What the route table is computed from.
#[derive(Clone, Debug)]
pub struct World<'a> {
    /// Ranks.
    pub ranks: usize,
    /// GPUs of this host (0: the CPU emulator).
    pub gpus: usize,
    /// How the ranks are launched.
    pub launch: Launch,
    /// `DOORBELL_RANK_PER_GPU` (thread ranks only).
    pub rank_per_gpu: bool,
    /// `links[a][b]`: GPU `a` to GPU `b` (`None`: could not be read).
    pub links: &'a [Vec<Option<Link>>],
    /// `DOORBELL_RDMA_PEERS`.
    pub rdma_peers: &'a RdmaPeers,
    /// The NIC the routed transport would use, in words.
    pub nic: &'a str,
}

/// One pair of ranks.
#[derive(Clone, Debug, Serialize)]
pub struct RoutePair {
    /// The lower rank.
    pub rank: usize,
    /// The higher rank.
    pub peer: usize,
    /// The rank's GPU (`None`: the emulator).
    pub rank_gpu: Option<usize>,
    /// The peer's GPU.
    pub peer_gpu: Option<usize>,
    /// The load/store route ([`PeerRoute`], its name).
    pub route: String,
    /// What carries it: `same GPU`, `NVLink`, `PCIe`, `host memory`, ...
    pub via: String,
    /// Whether the routed transport sends this pair through the NIC.
    pub through_nic: bool,
    /// Why, in words.
    pub why: String,
    /// What stops this pair, where something does.
    pub problem: Option<String>,
}

/// Where rank `r` runs: its GPU (`None` on the emulator).
pub fn gpu_of(w: &World<'_>, r: usize) -> Option<usize> {
    if w.gpus == 0 {
        return None;
    }
    Some(match w.launch {
        Launch::Threads if !w.rank_per_gpu => 0,
        _ => r % w.gpus,
    })
}

/// The route table of `w`: one entry per pair of ranks, lower rank first.
/// An `Err` is a `DOORBELL_RDMA_PEERS` that names a rank outside the world.
pub fn table(w: &World<'_>) -> crate::Result<Vec<RoutePair>> {
    let mut out = Vec::new();
    for rank in 0..w.ranks {
        for peer in rank + 1..w.ranks {
            let (ga, gb) = (gpu_of(w, rank), gpu_of(w, peer));
            let place = PeerPlace {
                remote: false,
                same_process: w.launch == Launch::Threads,
                gpu: w.gpus > 0,
                same_gpu: ga == gb,
            };
            let route = route_to(rank, peer, place);
            let through_nic = w.rdma_peers.forced(rank, peer, w.ranks)?;
            let link = match (ga, gb) {
                (Some(a), Some(b)) if a != b => Some(w.links.get(a).and_then(|row| row.get(b).copied()).flatten()),
                _ => None,
            };
            let (mut via, mut why) = match route {
                PeerRoute::SameProcess if place.gpu => (
                    "same GPU".to_string(),
                    format!("threads of one process on GPU {}: one address space", ga.unwrap_or(0)),
                ),
                PeerRoute::SameProcess => (
                    "host memory".to_string(),
                    "threads of one process on the CPU emulator: one address space".to_string(),
                ),
                PeerRoute::PeerAccess => (
                    String::new(),
                    format!(
                        "threads of one process on GPU {} and GPU {}: CUDA peer access",
                        ga.unwrap_or(0),
                        gb.unwrap_or(0)
                    ),
                ),
                PeerRoute::CudaIpc if ga == gb => (
                    "same GPU".to_string(),
                    format!("processes of this host on GPU {}: CUDA IPC", ga.unwrap_or(0)),
                ),
                PeerRoute::CudaIpc => (
                    String::new(),
                    format!(
                        "processes of this host on GPU {} and GPU {}: CUDA IPC",
                        ga.unwrap_or(0),
                        gb.unwrap_or(0)
                    ),
                ),
                PeerRoute::SharedMemory => (
                    "shared memory".to_string(),
                    "processes of this host on the CPU emulator: heap files in /dev/shm".to_string(),
                ),
                PeerRoute::Local | PeerRoute::Remote => (String::new(), String::new()),
            };
            let mut problem = None;
            if let Some(link) = link {
                match link {
                    None => via = "unknown (peer access could not be read)".to_string(),
                    Some(l) if !l.can_access => {
                        via = "none".to_string();
                        problem = Some(format!(
                            "ranks {rank} and {peer} need peer access between GPU {} and GPU {}, which the driver \
                             refuses (cuDeviceCanAccessPeer = 0)",
                            ga.unwrap_or(0),
                            gb.unwrap_or(0)
                        ));
                    }
                    Some(l) => {
                        via = match l.nvlink {
                            Some(true) => "NVLink".to_string(),
                            Some(false) => "PCIe".to_string(),
                            None => "NVLink or PCIe (no NVML to tell)".to_string(),
                        };
                        if l.native_atomics == Some(false) {
                            problem = Some(format!(
                                "GPU {} and GPU {} have no native peer atomics: the communicator refuses this pair \
                                 (signals that add into the peer's memory would not be atomic)",
                                ga.unwrap_or(0),
                                gb.unwrap_or(0)
                            ));
                        }
                    }
                }
            }
            if through_nic {
                why.push_str(&format!(
                    "; the routed transport sends this pair through {} (DOORBELL_RDMA_PEERS)",
                    w.nic
                ));
            }
            out.push(RoutePair {
                rank,
                peer,
                rank_gpu: ga,
                peer_gpu: gb,
                route: format!("{route:?}"),
                via,
                through_nic,
                why,
                problem,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(can_access: bool, nvlink: Option<bool>) -> Option<Link> {
        Some(Link {
            can_access,
            native_atomics: Some(can_access),
            nvlink,
        })
    }

    fn world<'a>(ranks: usize, gpus: usize, launch: Launch, links: &'a [Vec<Option<Link>>], peers: &'a RdmaPeers) -> World<'a> {
        World {
            ranks,
            gpus,
            launch,
            rank_per_gpu: false,
            links,
            rdma_peers: peers,
            nic: "the soft NIC",
        }
    }

    #[test]
    fn emulator_threads_and_processes() {
        let peers = RdmaPeers::Needed;
        let t = table(&world(3, 0, Launch::Threads, &[], &peers)).unwrap();
        assert_eq!(t.len(), 3, "three pairs of three ranks");
        assert!(t
            .iter()
            .all(|p| p.route == "SameProcess" && p.rank_gpu.is_none() && p.problem.is_none()));
        let t = table(&world(2, 0, Launch::Processes, &[], &peers)).unwrap();
        assert_eq!((t[0].route.as_str(), t[0].via.as_str()), ("SharedMemory", "shared memory"));
    }

    #[test]
    fn four_gpus_two_of_them_without_peer_access() {
        // GPUs 0-1 and 2-3 joined by NVLink; 0/1 reach 2/3 over PCIe, but 1-3 not at all.
        let links: Vec<Vec<Option<Link>>> = (0..4)
            .map(|a| {
                (0..4)
                    .map(|b| {
                        (a != b)
                            .then(|| link(!matches!((a, b), (1, 3) | (3, 1)), Some((a < 2) == (b < 2))))
                            .flatten()
                    })
                    .collect()
            })
            .collect();
        let peers = RdmaPeers::Pairs(vec![(0, 2)]);
        let t = table(&world(4, 4, Launch::Processes, &links, &peers)).unwrap();
        let pair = |a, b| t.iter().find(|p| (p.rank, p.peer) == (a, b)).unwrap();
        assert_eq!((pair(0, 1).route.as_str(), pair(0, 1).via.as_str()), ("CudaIpc", "NVLink"));
        assert_eq!(pair(0, 2).via, "PCIe");
        assert!(pair(0, 2).through_nic && pair(0, 2).why.contains("the soft NIC"));
        assert!(!pair(0, 1).through_nic);
        let bad: Vec<_> = t.iter().filter(|p| p.problem.is_some()).map(|p| (p.rank, p.peer)).collect();
        assert_eq!(bad, [(1, 3)]);
        assert!(pair(1, 3).problem.as_ref().unwrap().contains("GPU 1 and GPU 3"));

        // Thread ranks all on GPU 0 need no peer access.
        let t = table(&world(4, 4, Launch::Threads, &links, &peers)).unwrap();
        assert!(t
            .iter()
            .all(|p| p.route == "SameProcess" && p.via == "same GPU" && p.problem.is_none()));
        // ... but spread over the GPUs they do.
        let mut w = world(4, 4, Launch::Threads, &links, &peers);
        w.rank_per_gpu = true;
        let t = table(&w).unwrap();
        assert_eq!(t.iter().find(|p| (p.rank, p.peer) == (0, 1)).unwrap().route, "PeerAccess");
        assert_eq!(t.iter().filter(|p| p.problem.is_some()).count(), 1);
    }

    #[test]
    fn more_ranks_than_gpus_share_them() {
        let links = vec![vec![None, link(true, None)], vec![link(true, None), None]];
        let peers = RdmaPeers::All;
        let t = table(&world(3, 2, Launch::Processes, &links, &peers)).unwrap();
        let p02 = t.iter().find(|p| (p.rank, p.peer) == (0, 2)).unwrap();
        assert_eq!((p02.rank_gpu, p02.peer_gpu, p02.via.as_str()), (Some(0), Some(0), "same GPU"));
        let p01 = t.iter().find(|p| (p.rank, p.peer) == (0, 1)).unwrap();
        assert!(p01.via.starts_with("NVLink or PCIe"), "{}", p01.via);
        assert!(t.iter().all(|p| p.through_nic));
    }

    #[test]
    fn rdma_peers_outside_the_world_is_an_error() {
        let peers = RdmaPeers::Pairs(vec![(0, 5)]);
        assert!(table(&world(2, 0, Launch::Threads, &[], &peers)).is_err());
    }
}
