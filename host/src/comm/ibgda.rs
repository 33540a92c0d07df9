//! The IBGDA transport's host side: setup through the verbs-shaped
//! interface of `doorbell-softnic` (so switching to a ConnectX NIC changes
//! which device is opened, not this sequence), teardown, registration,
//! reset, and the per-peer route table of the routed transport.
//!
//! ## Setup (collective: the first [`Communicator::ibgda`] or
//! [`Communicator::routed`] call of every rank)
//! 1. Rank 0 makes a [`SoftFabric`] (the switch between the ports) and
//!    hands it to the other ranks of this process.
//! 2. Each rank opens its own port ([`SoftFabric::open_device`], with the
//!    `DOORBELL_SOFTNIC_LINK` model), allocates a PD, registers its
//!    symmetric heap (local write, remote read/write/atomic) and a scratch
//!    area (one word per SQ slot: `Set` values, fetch-add results).
//! 3. Per peer (itself included: loopback) `qps_per_peer` RC QPs, each with
//!    its own CQ of `sq_size` entries (see the device docs: it cannot
//!    overflow).
//! 4. Endpoints (LID, QP numbers, heap base, rkey) go through the world's
//!    host collective (`all_gather_bytes`); QP `k` of rank `a` to rank `b`
//!    connects to QP `k` of rank `b` to rank `a`: RESET → INIT → RTR → RTS.
//! 5. A world barrier (every QP is in RTS before any kernel posts), then
//!    the engine thread of this rank's port starts.
//!
//! Teardown (the communicator's drop, which already waited for every rank):
//! the engine stops, then QPs, CQs and regions are destroyed, then their
//! memory is freed — after which the NIC never touches it.
//!
//! ## Where the engine runs
//! On the CPU emulator "device memory" is host memory, so the soft NIC's
//! host thread executes WQEs directly on the heaps, rings and CQs. On a GPU
//! the rings and the heap are device memory: a host-thread engine would
//! need the rings in mapped pinned memory and one driver copy per WQE
//! (the measured mapped round trip is 3.2 µs, a launch 4.3 µs: slower than
//! the message); the intended engine is GPU-resident — a persistent kernel
//! running the soft NIC's `no_std` `engine::poll_port` core. Until it
//! exists, asking for IBGDA on a GPU is an error that says so.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use doorbell_kernels::mlx5::wire::CqeSyndrome;
use doorbell_kernels::transport::ibgda::{IbgdaQp, QpState, RegRegion, MAX_BATCH, QP_ERR_COMPLETION, QP_ERR_WEDGED, REG_SLOTS};
use doorbell_kernels::transport::routed::ROUTE_WORDS;
use doorbell_kernels::transport::{Ibgda, Routed};
use doorbell_softnic::engine::access;
use doorbell_softnic::engine::LinkModel;
use doorbell_softnic::host::{CqMemory, HostBuffer, QpMemory};
use doorbell_softnic::{
    EngineThread, FabricConfig, MemoryRegion, QpEndpoint, QueuePair, RdmaDevice, SoftCq, SoftDevice, SoftFabric, SoftMr, SoftPd, SoftQp,
};

use super::{Communicator, PeerRoute};
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;

/// `DOORBELL_IBGDA_QPS_PER_PEER`: RC QPs per peer, 1..=16.
pub const QPS_ENV: &str = "DOORBELL_IBGDA_QPS_PER_PEER";
/// `DOORBELL_IBGDA_SQ_SIZE`: send-queue slots per QP, a power of two in 32..=32768.
pub const SQ_ENV: &str = "DOORBELL_IBGDA_SQ_SIZE";
/// `DOORBELL_RDMA_PEERS`: which pairs of ranks the routed transport sends
/// through the NIC although load/store reaches them.
pub const RDMA_PEERS_ENV: &str = "DOORBELL_RDMA_PEERS";

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
    /// Largest message of one WQE; longer puts and gets are split (default
    /// 1 MiB: long transfers become several WQEs the NIC can pipeline).
    pub max_msg: u32,
    /// The soft NIC's link model (`DOORBELL_SOFTNIC_LINK`; `None`: off).
    pub link: Option<LinkModel>,
}

impl Default for IbgdaOptions {
    fn default() -> Self {
        IbgdaOptions {
            qps_per_peer: 2,
            sq_size: 256,
            max_msg: 1 << 20,
            link: None,
        }
    }
}

impl IbgdaOptions {
    /// The defaults with `DOORBELL_IBGDA_QPS_PER_PEER`,
    /// `DOORBELL_IBGDA_SQ_SIZE` and `DOORBELL_SOFTNIC_LINK` applied,
    /// strictly.
    pub fn from_env() -> Result<IbgdaOptions> {
        let d = IbgdaOptions::default();
        let qps = crate::env::uint(QPS_ENV, d.qps_per_peer as u64, 1, 16)? as u32;
        let sq = crate::env::uint(SQ_ENV, d.sq_size as u64, MAX_BATCH as u64, 32768)? as u32;
        if !sq.is_power_of_two() {
            return Err(Error::BadEnv {
                var: SQ_ENV.to_string(),
                value: sq.to_string(),
                reason: "is not a power of two; use 32, 64, 128, ... 32768".to_string(),
            });
        }
        let link = doorbell_softnic::link_from_env().map_err(|e| Error::BadEnv {
            var: doorbell_softnic::LINK_ENV.to_string(),
            value: std::env::var(doorbell_softnic::LINK_ENV).unwrap_or_default(),
            reason: e.to_string(),
        })?;
        Ok(IbgdaOptions {
            qps_per_peer: qps,
            sq_size: sq,
            link,
            ..d
        })
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::comm(format!("IBGDA options: {what}")));
        if !(1..=16).contains(&self.qps_per_peer) {
            return bad(format!("qps_per_peer {} is not in 1..=16", self.qps_per_peer));
        }
        if !self.sq_size.is_power_of_two() || !(MAX_BATCH..=32768).contains(&self.sq_size) {
            return bad(format!("sq_size {} is not a power of two in 32..=32768", self.sq_size));
        }
        if self.max_msg == 0 || self.max_msg > 1 << 31 {
            return bad(format!("max_msg {} is not in 1..=2^31", self.max_msg));
        }
        Ok(())
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

    /// `DOORBELL_RDMA_PEERS` (unset or empty: [`RdmaPeers::Needed`]).
    pub fn from_env() -> Result<RdmaPeers> {
        match crate::env::raw(RDMA_PEERS_ENV)? {
            None => Ok(RdmaPeers::Needed),
            Some(v) => RdmaPeers::parse(RDMA_PEERS_ENV, &v),
        }
    }

    /// Whether `rank` reaches `peer` by RDMA under this setting (checking
    /// the ranks named against the world size).
    fn forced(&self, rank: usize, peer: usize, size: usize) -> Result<bool> {
        Ok(match self {
            RdmaPeers::Needed => false,
            RdmaPeers::All => peer != rank,
            RdmaPeers::Pairs(p) => {
                if let Some(&(a, b)) = p.iter().find(|(a, b)| *a >= size || *b >= size) {
                    return Err(Error::BadEnv {
                        var: RDMA_PEERS_ENV.to_string(),
                        value: format!("{a}-{b}"),
                        reason: format!("names a rank outside this world of {size} ranks"),
                    });
                }
                p.iter().any(|&(a, b)| (a, b) == (rank, peer) || (b, a) == (rank, peer))
            }
        })
    }
}

/// Fabrics being handed from rank 0 to the other ranks of this process,
/// by a number only this process's ranks learn.
static FABRICS: Mutex<Option<HashMap<u64, SoftFabric>>> = Mutex::new(None);
static NEXT_FABRIC: AtomicU64 = AtomicU64::new(1);

/// One QP and its memory (dropped QP first, memory last).
struct Qp {
    qp: SoftQp,
    _cq: SoftCq,
    _qp_mem: QpMemory,
    _cq_mem: CqMemory,
}

/// This rank's IBGDA resources. Field order is drop order: the engine
/// stops before anything it reads goes away.
pub(crate) struct IbgdaState {
    engine: Option<EngineThread>,
    qps: Vec<Option<Qp>>,
    registered: Vec<SoftMr>,
    _scratch_mr: SoftMr,
    _heap_mr: SoftMr,
    _table: DeviceBuffer<u64>,
    states: HostBuffer,
    _scratch: HostBuffer,
    pd: SoftPd,
    device: SoftDevice,
    opts: IbgdaOptions,
    handle: Ibgda,
}

// SAFETY: the raw pointers inside (rings, the device handle) name memory
// this state owns; the soft NIC objects are Send + Sync themselves.
unsafe impl Send for IbgdaState {}

impl Communicator {
    /// The IBGDA transport's device handle (a kernel argument), every peer
    /// — this rank included — reached through the (soft) NIC.
    ///
    /// **Collective the first time** (every rank calls it, or
    /// [`Communicator::routed`]): sets the transport up with
    /// [`IbgdaOptions::from_env`]. Later calls return the handle at once.
    /// Emulator only for now (see the module docs); peers must be threads of
    /// this process (one soft fabric).
    pub fn ibgda(&self) -> Result<Ibgda> {
        self.ibgda_state(None)
    }

    /// As [`Self::ibgda`], with explicit options (used only if the
    /// transport is not set up yet; collective then).
    pub fn ibgda_with(&self, opts: &IbgdaOptions) -> Result<Ibgda> {
        self.ibgda_state(Some(opts))
    }

    /// The routed transport: load/store to peers that P2P reaches, the NIC
    /// to the others and to those `DOORBELL_RDMA_PEERS` names. Collective
    /// the first time, as [`Self::ibgda`].
    pub fn routed(&self) -> Result<Routed> {
        self.routed_with(&RdmaPeers::from_env()?)
    }

    /// [`Self::routed`] with an explicit route setting.
    pub fn routed_with(&self, peers: &RdmaPeers) -> Result<Routed> {
        let ibgda = self.ibgda()?;
        let mut rdma = [0u64; ROUTE_WORDS];
        // Every peer of a communicator is on this host and reachable by
        // load/store, so only the setting sends pairs through the NIC.
        for p in 0..self.size {
            if peers.forced(self.rank, p, self.size)? {
                rdma[p / 64] |= 1 << (p % 64);
            }
        }
        Ok(Routed {
            p2p: self.p2p(),
            ibgda,
            rdma,
        })
    }

    /// Registers `len` bytes at the device address `addr` with the NIC, so
    /// puts may read from it and gets write into it. Local to this rank;
    /// returns the updated handle (earlier handles do not know the buffer).
    /// At most [`REG_SLOTS`] buffers. The memory must outlive the
    /// communicator or [`Self::ibgda_reset`].
    ///
    /// # Safety
    /// `addr..addr + len` is device memory of this rank that stays
    /// allocated until this communicator is dropped or reset.
    pub unsafe fn ibgda_register(&self, addr: u64, len: usize) -> Result<Ibgda> {
        self.ibgda()?;
        let mut guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        let st = guard.as_mut().expect("set up above");
        let n = st.handle.nreg as usize;
        if n >= REG_SLOTS {
            return Err(Error::comm(format!(
                "rank {}: at most {REG_SLOTS} buffers can be registered for IBGDA; put the data in the symmetric heap",
                self.rank
            )));
        }
        let access = access::LOCAL_WRITE;
        // SAFETY: the caller keeps the memory valid while the region lives
        // (it lives in the state, dropped with the communicator).
        let mr = unsafe { st.device.reg_mr(&st.pd, addr as *mut u8, len, access) }.map_err(softnic_err)?;
        st.handle.reg[n] = RegRegion {
            addr,
            len: len as u64,
            lkey: mr.lkey(),
            _pad: 0,
        };
        st.handle.nreg += 1;
        st.registered.push(mr);
        Ok(st.handle)
    }

    /// Collective: tears the IBGDA transport down and sets it up again
    /// with the same options — the way out of a QP error state. Handles
    /// made before are invalid afterwards; take new ones (registered
    /// buffers must be registered again).
    pub fn ibgda_reset(&self) -> Result<()> {
        self.world.barrier()?;
        let opts = {
            let mut guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
            guard.take().map(|st| st.opts.clone())
        };
        self.world.barrier()?;
        if let Some(o) = opts {
            self.ibgda_state(Some(&o))?;
        }
        Ok(())
    }

    /// The soft NIC device of this rank (fault injection, statistics, the
    /// error log), once the transport is set up.
    pub fn soft_nic(&self) -> Option<SoftDevice> {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().map(|st| st.device.clone())
    }

    /// Reports QPs of this rank in an error state: a completion error (with
    /// its syndrome) or a wedged queue (a post or wait that timed out).
    /// Kernels must not be running. Clean when not set up.
    pub fn ibgda_check(&self) -> Result<()> {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        let Some(st) = guard.as_ref() else { return Ok(()) };
        let qpp = st.opts.qps_per_peer as usize;
        let mut bad = Vec::new();
        for i in 0..self.size * qpp {
            // SAFETY: `states` holds one QpState per QP; no kernel runs.
            let s = unsafe { std::ptr::read_volatile((st.states.as_ptr() as *const QpState).add(i)) };
            if s.error != 0 {
                let what = if s.error & QP_ERR_COMPLETION != 0 {
                    let syn = CqeSyndrome::from_u8(s.error as u8);
                    format!("completion error {} ({:#04x})", syn.c_name(), s.error as u8)
                } else if s.error & QP_ERR_WEDGED != 0 {
                    "wedged (a post or completion wait ran out of budget)".to_string()
                } else {
                    format!("error word {:#x}", s.error)
                };
                bad.push(format!("QP {} to rank {}: {what} at WQE {}", i % qpp, i / qpp, s.error_at));
            }
        }
        if bad.is_empty() {
            return Ok(());
        }
        let log: Vec<String> = st.device.error_log().iter().map(|r| format!("{r:?}")).take(4).collect();
        Err(Error::comm(format!(
            "rank {}: IBGDA queues in error: {}; soft NIC log: [{}]; call Communicator::ibgda_reset (collective) to recover",
            self.rank,
            bad.join("; "),
            log.join(", ")
        )))
    }

    /// The set-up state's handle, setting it up first if needed.
    fn ibgda_state(&self, opts: Option<&IbgdaOptions>) -> Result<Ibgda> {
        let mut guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = guard.as_ref() {
            return Ok(st.handle);
        }
        let opts = match opts {
            Some(o) => o.clone(),
            None => IbgdaOptions::from_env()?,
        };
        let st = self.ibgda_setup(opts)?;
        let h = st.handle;
        *guard = Some(st);
        Ok(h)
    }

    fn ibgda_setup(&self, opts: IbgdaOptions) -> Result<IbgdaState> {
        opts.validate()?;
        self.world.check_same(
            "IBGDA options (QPs per peer, SQ size, largest message)",
            &[opts.qps_per_peer, opts.sq_size, opts.max_msg]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )?;
        if self.device.is_gpu() {
            return Err(Error::comm(
                "the IBGDA transport over the soft NIC runs on the CPU emulator only for now: on a GPU the soft NIC needs its \
                 GPU-resident engine, which is not built yet; use the P2P transport (comm.p2p()) or DOORBELL_DEVICE=cpu",
            ));
        }
        if let Some(p) = self
            .routes
            .iter()
            .position(|r| !matches!(r, PeerRoute::Local | PeerRoute::SameProcess | PeerRoute::PeerAccess))
        {
            return Err(Error::comm(format!(
                "rank {}: rank {p} runs in another process; the soft NIC connects ranks of one process only \
                 (use thread ranks, Communicator::local, for IBGDA over the soft NIC)",
                self.rank
            )));
        }
        let size = self.size;
        let qpp = opts.qps_per_peer as usize;
        let sq = opts.sq_size;

        // 1. One fabric for the world, made by rank 0.
        let id = if self.rank == 0 {
            let id = NEXT_FABRIC.fetch_add(1, Ordering::Relaxed) ^ ((std::process::id() as u64) << 40);
            let fabric = SoftFabric::new(FabricConfig::default());
            FABRICS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(HashMap::new)
                .insert(id, fabric);
            id
        } else {
            0
        };
        let ids = self.world.all_gather_bytes(&id.to_le_bytes())?;
        let id = u64::from_le_bytes(
            ids[0]
                .as_slice()
                .try_into()
                .map_err(|_| Error::comm("rank 0 sent a malformed fabric id"))?,
        );
        let fabric = FABRICS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|m| m.get(&id).cloned());
        self.world.barrier()?;
        if self.rank == 0 {
            if let Some(m) = FABRICS.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                m.remove(&id);
            }
        }
        let fabric = fabric.ok_or_else(|| Error::comm(format!("rank {}: rank 0's soft NIC fabric is not in this process", self.rank)))?;

        // 2. Port, PD, regions.
        let device = fabric.open_device(opts.link).map_err(softnic_err)?;
        let pd = device.alloc_pd().map_err(softnic_err)?;
        // SAFETY: the heap outlives this state (the communicator drops the
        // state before its heap).
        let heap_mr = unsafe { device.reg_mr(&pd, self.heap_base as *mut u8, self.heap_len as usize, access::ALL) }.map_err(softnic_err)?;
        let nqps = size * qpp;
        let scratch = HostBuffer::zeroed(nqps * sq as usize * 8, 64);
        // SAFETY: the scratch buffer is owned by the state and outlives the region.
        let scratch_mr = unsafe { device.reg_mr(&pd, scratch.as_ptr(), scratch.len(), access::LOCAL_WRITE) }.map_err(softnic_err)?;
        let states = HostBuffer::zeroed(nqps * std::mem::size_of::<QpState>(), 64);

        // 3. QPs: to every rank, this one included (loopback).
        let mut qps = Vec::with_capacity(nqps);
        for _ in 0..nqps {
            let cq_mem = CqMemory::new(sq);
            let qp_mem = QpMemory::new(sq, 0, 1);
            // SAFETY: the rings live in `Qp` next to the objects, dropped after them.
            let cq = unsafe { device.create_cq(cq_mem.ring()) }.map_err(softnic_err)?;
            // SAFETY: as above.
            let qp = unsafe { device.create_qp(&pd, &cq, &cq, qp_mem.rings()) }.map_err(softnic_err)?;
            qps.push(Some(Qp {
                qp,
                _cq: cq,
                _qp_mem: qp_mem,
                _cq_mem: cq_mem,
            }));
        }

        // 4. Exchange endpoints: heap base, rkey, LID, then every QP number.
        let mut mine = Vec::new();
        mine.extend_from_slice(&self.heap_base.to_le_bytes());
        mine.extend_from_slice(&heap_mr.rkey().to_le_bytes());
        mine.extend_from_slice(&(device.lid() as u32).to_le_bytes());
        for q in qps.iter().flatten() {
            mine.extend_from_slice(&q.qp.qpn().to_le_bytes());
        }
        let all = self.world.all_gather_bytes(&mine)?;
        struct Remote {
            base: u64,
            rkey: u32,
            lid: u16,
            qpns: Vec<u32>,
        }
        let remotes = all
            .iter()
            .enumerate()
            .map(|(r, b)| {
                if b.len() != 16 + 4 * nqps {
                    return Err(Error::comm(format!("rank {r} sent a malformed IBGDA endpoint ({} bytes)", b.len())));
                }
                let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
                Ok(Remote {
                    base: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
                    rkey: u32_at(8),
                    lid: u32_at(12) as u16,
                    qpns: (0..nqps).map(|i| u32_at(16 + 4 * i)).collect(),
                })
            })
            .collect::<Result<Vec<_>>>()?;

        // Connect QP k to peer p with the peer's QP k to this rank.
        let remote_access = access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;
        for p in 0..size {
            for k in 0..qpp {
                let q = qps[p * qpp + k].as_ref().expect("made above");
                let ep = QpEndpoint {
                    lid: remotes[p].lid,
                    qpn: remotes[p].qpns[self.rank * qpp + k],
                };
                q.qp.connect(ep, remote_access).map_err(softnic_err)?;
            }
        }

        // The device's view of every QP.
        let mut words: Vec<u64> = Vec::with_capacity(nqps * 16);
        for p in 0..size {
            for k in 0..qpp {
                let i = p * qpp + k;
                let q = qps[i].as_ref().expect("made above");
                // SAFETY: inside the states buffer (one QpState per QP).
                let state = unsafe { (states.as_ptr() as *mut QpState).add(i) };
                let mut h = q._qp_mem.handle(q.qp.qpn(), &q._cq_mem);
                // SAFETY: fields of the QP's state block.
                unsafe {
                    h.sq_producer = &raw mut (*state).producer;
                    h.sq_ready = &raw mut (*state).ready;
                    h.cq_consumer = &raw mut (*state).cq_consumer;
                }
                let e = IbgdaQp {
                    qp: h,
                    state,
                    // SAFETY: inside the scratch buffer (sq words per QP).
                    scratch: unsafe { (scratch.as_ptr() as *mut u64).add(i * sq as usize) },
                    scratch_lkey: scratch_mr.lkey(),
                    peer: p as u32,
                    remote_base: remotes[p].base,
                    rkey: remotes[p].rkey,
                    _pad: 0,
                    _reserved: 0,
                };
                // SAFETY: IbgdaQp is 128 bytes of plain data, 8-byte aligned.
                let w: [u64; 16] = unsafe { std::mem::transmute(e) };
                words.extend_from_slice(&w);
            }
        }
        let table = self.device.alloc_from(&words)?;

        // 5. Everyone is in RTS before any kernel posts; then the engine.
        self.world.barrier()?;
        let engine = device.spawn_engine();
        let handle = Ibgda {
            rank: self.rank as u32,
            world: size as u32,
            heap_bytes: self.heap_len,
            local_base: self.heap_base,
            budget_ns: self.budget_ns,
            qps: table.as_ptr() as *const IbgdaQp,
            qps_per_peer: opts.qps_per_peer,
            max_msg: opts.max_msg,
            heap_lkey: heap_mr.lkey(),
            nreg: 0,
            reg: [RegRegion::default(); REG_SLOTS],
        };
        tracing::info!(
            "rank {}: IBGDA over the soft NIC: LID {}, {} QPs ({} per rank), SQ {} slots, link {:?}",
            self.rank,
            device.lid(),
            nqps,
            qpp,
            sq,
            opts.link
        );
        Ok(IbgdaState {
            engine: Some(engine),
            qps,
            registered: Vec::new(),
            _scratch_mr: scratch_mr,
            _heap_mr: heap_mr,
            _table: table,
            states,
            _scratch: scratch,
            pd,
            device,
            opts,
            handle,
        })
    }
}

impl Drop for IbgdaState {
    fn drop(&mut self) {
        // The engine first: nothing polls the rings while they go away.
        drop(self.engine.take());
        // Then the QPs (and their CQs and rings) before the regions.
        self.qps.clear();
        self.registered.clear();
    }
}

fn softnic_err(e: doorbell_softnic::Error) -> Error {
    Error::comm(format!("soft NIC: {e}"))
}
