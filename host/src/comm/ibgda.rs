//! The IBGDA transport's host side: setup through the verbs-shaped
//! interface of `doorbell-softnic` (so switching to a ConnectX NIC changes
//! which device is opened, not this sequence), teardown, registration,
//! reset, and the per-peer route table of the routed transport.
//!
//! ## Setup (collective: the first [`Communicator::ibgda`] or
//! [`Communicator::routed`] call of every rank)
//! 1. Rank 0 makes a [`SoftFabric`] (the switch between the ports) and
//!    hands it to the other ranks of this process. In a world where a
//!    peer runs in another process, every rank makes a fabric of its own
//!    instead and opens its port at its rank's index
//!    ([`SoftFabric::open_device_at`]), so LIDs agree across processes.
//! 2. Each rank opens its own port ([`SoftFabric::open_device`], with the
//!    `DOORBELL_SOFTNIC_LINK` model), allocates a PD, registers its
//!    symmetric heap (local write, remote read/write/atomic) and a scratch
//!    area (one word per SQ slot: `Set` values, fetch-add results).
//! 3. Per peer (itself included: loopback) `qps_per_peer` RC QPs, each with
//!    its own CQ of `sq_size` entries (see the device docs: it cannot
//!    overflow).
//! 4. Endpoints (LID, QP numbers and table slots, heap base, rkey) go
//!    through the world's host collective (`all_gather_bytes`); QP `k` of
//!    rank `a` to rank `b` connects to QP `k` of rank `b` to rank `a`:
//!    RESET → INIT → RTR → RTS ([`SoftQp::connect_remote`], which takes a
//!    port of another process's fabric on trust, as an RC NIC takes an
//!    address vector).
//! 5. A world barrier (every QP is in RTS before any kernel posts), then
//!    this rank's port gets its engine.
//!
//! The rings (SQ, doorbell records, UAR word, CQ), the scratch words and
//! the QPs' software state are device memory (the emulator's is host
//! memory); the host fills the CQ rings with invalid CQEs itself.
//!
//! ## Where the engine runs
//! * **Kernel** (`SoftNicEngine::Kernel`; the default on a GPU,
//!   `DOORBELL_SOFTNIC_ENGINE=kernel` on the emulator): each rank copies
//!   its port's tables to its device memory, the ranks exchange those
//!   addresses into a `PortTable`, and each rank launches `softnic_engine`
//!   (from [`SOFTNIC_PTX`]) — **one block per port**, [`ENGINE_THREADS_GPU`]
//!   threads on a GPU (`DOORBELL_SOFTNIC_ENGINE_THREADS`) — on a
//!   non-blocking stream that
//!   [`crate::Device::synchronize`] and buffer frees do not wait for.
//!   The engine's module is loaded once per device and process and never
//!   unloaded (unloading it, or loading modules and allocating, while an
//!   engine runs may wait for that engine, which never ends by itself), and
//!   every rank loads and allocates before a world barrier that precedes
//!   the first launch. The engine publishes its state (running, exited)
//!   into a word of mapped host memory, so the host's waits for it read
//!   host memory in a bounded loop and make no driver call.
//!   Thread 0 runs the engine's control (the same `poll_port` as the host
//!   thread); copies of 1 KiB or more are moved by the whole block with
//!   16-byte vectors, smaller ones by thread 0. Payload goes over the same
//!   mappings as P2P (same-GPU pointers, peer access between GPUs); the
//!   engine's fences and CQE releases are at `gpu` scope when every rank
//!   shares one GPU (`DOORBELL_SOFTNIC_SCOPE=sys` widens them), else at
//!   `sys`. **Cost**: one SM per rank (a block of 256, 512 or 1024
//!   threads holds all of its registers: 255, 128 or 64 per thread) —
//!   a kernel that sizes an
//!   all-resident grid by the SM count must leave those SMs free, or it
//!   and the engine wait for each other. The fabric then sends new
//!   regions (`ibgda_register`) and fault configurations to the device
//!   tables, and reads counters and the error log from them.
//!
//!   **Across processes** the engines reach each other through the
//!   symmetric heaps, which every rank has mapped (CUDA IPC, or shared
//!   memory on the emulator): each port's tables lie in a tail of its
//!   rank's heap allocation, past the heap's end ([`TABLES_TAIL`] bytes,
//!   made with the heap in such a world), which peers map with the heap
//!   but which no transport call (their range checks end at the heap's
//!   end) and no registered region reaches; and the port table gives each port of another
//!   process a [`Window`] — its heap as its owner addresses it, and as
//!   this process maps it — through which the engine translates the
//!   responder's addresses. So a remote region must lie in the peer's heap
//!   (the transport's targets always do; a buffer a peer gave
//!   `ibgda_register` is a local source or destination only), and SEND
//!   and WRITE with immediate, which consume the responder's receive
//!   queue, fail toward another process (`Reason::Unmapped`; the transport
//!   uses neither). A fault configuration set through
//!   [`Communicator::soft_nic`] reaches this process's engine only. An
//!   engine that does not stop at teardown leaves its tables in use: a
//!   later set-up of the same communicator is then refused.
//! * **Thread** (`SoftNicEngine::Thread`, the emulator's default): a host
//!   thread per port polls the same tables in host memory. Refused in a
//!   world of several processes (it executes one fabric), and on a
//!   GPU: a host thread would need a driver copy per WQE (a mapped round
//!   trip costs 3.2 µs, a launch 4.3 µs — more than the message).
//!
//! While an engine runs, a module load or an allocation on its GPU may
//! wait for every kernel there (with CUDA's lazy loading even a first
//! launch may): load your modules before the first [`Communicator::ibgda`].
//!
//! Each step logs at `DOORBELL_LOG=debug` (rings allocated, QPs connected,
//! engine tables allocated and copied, module loaded, engine launched and
//! started, stop requested, engine stopped, with times), so a run that
//! stops somewhere shows where. Set-up checks that the engine's port table
//! and the kernels' QP table name the same SQ, doorbell record, UAR word
//! and CQ for every QP (and logs them). A running kernel engine publishes
//! an `EngineProgress` record into mapped host memory; a watch thread
//! logs it every few seconds ([`IbgdaProgress`] says how to read it), and
//! teardown and [`Communicator::ibgda_progress`] report it.
//!
//! Teardown (the communicator's drop or [`Communicator::ibgda_reset`]):
//! the host sets the engine's stop word, waits (20 s at most) for it to
//! report that it exited, synchronizes its stream, and only then destroys
//! QPs, CQs and regions and frees their memory. An engine that does not
//! stop in time is reported and its memory is leaked, never freed under
//! it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use doorbell_kernels::mlx5::wire::CqeSyndrome;
use doorbell_kernels::mlx5::{QpHandle, CQE_SIZE, SEND_WQE_BB};
use doorbell_kernels::transport::ibgda::{IbgdaQp, QpState, RegRegion, MAX_BATCH, QP_ERR_COMPLETION, QP_ERR_WEDGED, REG_SLOTS};
use doorbell_kernels::transport::routed::ROUTE_WORDS;
use doorbell_kernels::transport::{Ibgda, Routed};
use doorbell_kernels::Kernel;
use doorbell_softnic::engine::resident::{
    EngineCounters, EngineCtl, EngineProgress, SHARED_BYTES, STATE_EXITED, STATE_LAUNCHED, STATE_RUNNING,
};
use doorbell_softnic::engine::{access, cqe, EngineConfig, LinkModel, MrEntry, Port, PortStats, PortTable, Window, MAX_PORTS};
use doorbell_softnic::host::ResidentPort;
use doorbell_softnic::kernel::{softnic_engine, softnic_engine_mid, softnic_engine_wide, ENGINE_THREADS, ENGINE_THREADS_MID};
use doorbell_softnic::{
    CqRing, EngineThread, FabricConfig, MemoryRegion, QpEndpoint, QpRings, QueuePair, RdmaDevice, SoftCq, SoftDevice, SoftFabric, SoftMr,
    SoftPd, SoftQp,
};

use super::{Communicator, PeerRoute};
use crate::backend::{FunctionBackend, StreamBackend};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;

/// The soft NIC's engine kernel (`softnic_engine`), built from
/// `doorbell-softnic` into a PTX of its own: the soft NIC is a device, not
/// a library kernel, so it is not in [`crate::KERNELS_PTX`].
pub const SOFTNIC_PTX: &str = SOFTNIC.ptx;
/// [`SOFTNIC_PTX`] with its cubin (see [`crate::ModuleImage`]): what the
/// set-up loads.
pub const SOFTNIC: crate::ModuleImage = crate::module_image!("doorbell_softnic");

/// Bytes after the symmetric heap, in the same allocation, that hold this
/// rank's soft NIC port tables in a world of several processes: every peer
/// maps them with the heap, and neither the transports' range checks nor
/// the heap's registered region reach past the heap's end.
pub(crate) const TABLES_TAIL: u64 = (std::mem::size_of::<Port>() as u64).next_multiple_of(4096);

/// `DOORBELL_IBGDA_QPS_PER_PEER`: RC QPs per peer, 1..=16.
pub const QPS_ENV: &str = "DOORBELL_IBGDA_QPS_PER_PEER";
/// `DOORBELL_IBGDA_SQ_SIZE`: send-queue slots per QP, a power of two in 32..=32768.
pub const SQ_ENV: &str = "DOORBELL_IBGDA_SQ_SIZE";
/// `DOORBELL_RDMA_PEERS`: which pairs of ranks the routed transport sends
/// through the NIC although load/store reaches them.
pub const RDMA_PEERS_ENV: &str = "DOORBELL_RDMA_PEERS";
/// `DOORBELL_SOFTNIC_ENGINE`: `kernel` or `thread`, where the soft NIC's
/// engine runs (see [`SoftNicEngine`]).
pub const ENGINE_ENV: &str = "DOORBELL_SOFTNIC_ENGINE";
/// `DOORBELL_SOFTNIC_ENGINE_THREADS`: threads of the engine kernel's block,
/// a multiple of 32 in 32..=1024.
pub const ENGINE_THREADS_ENV: &str = "DOORBELL_SOFTNIC_ENGINE_THREADS";
/// `DOORBELL_SOFTNIC_SCOPE`: `auto` or `sys`, the scope of the engine
/// kernel's ordering with the ranks (see [`IbgdaOptions::engine_sys_scope`]).
pub const SCOPE_ENV: &str = "DOORBELL_SOFTNIC_SCOPE";
/// Threads of the engine kernel's block on a GPU by default: 512, on
/// `softnic_engine_mid` (128 registers per thread). Measured on one H200
/// (`ibgda_bench`, the block sizes alternated in one run:
/// `benchmarks/ibgda_h200_engine_entries.txt`):
///
/// | threads (entry) | control cycles / WQE | engine M WQE/s | 256 MiB puts | `put_signal` round trip |
/// |---|---|---|---|---|
/// | 256 (`softnic_engine`, 255 registers) | 12 540 – 12 640 | 0.127 – 0.128 | 22.7 – 22.8 GB/s | 50.4 – 50.5 µs |
/// | 512 (`softnic_engine_mid`) | 13 390 – 13 410 | 0.122 – 0.123 | 28.7 – 29.0 GB/s | 51.4 – 51.7 µs |
/// | 512 on `softnic_engine_wide` (64 registers, before) | 14 700 – 14 740 | 0.113 | 26.9 – 27.0 GB/s | 54.6 – 54.7 µs |
/// | 1024 (`softnic_engine_wide`) | 14 720 – 14 790 | 0.113 – 0.114 | 30.5 – 30.6 GB/s | 54.5 – 54.6 µs |
///
/// Each of 256, 512 and 1024 holds all of its SM's registers.
pub const ENGINE_THREADS_GPU: u32 = 512;

/// Where the soft NIC's engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoftNicEngine {
    /// A host thread per port (`SoftDevice::spawn_engine`). The emulator's
    /// default; refused on a GPU (the rings are device memory).
    Thread,
    /// A persistent kernel per port (`softnic_engine`, one block) on a
    /// stream of its own: the GPU's engine, and selectable on the emulator
    /// (`DOORBELL_SOFTNIC_ENGINE=kernel`) to test it there.
    Kernel,
}

impl SoftNicEngine {
    /// `kernel` or `thread`.
    pub fn parse(var: &str, s: &str) -> Result<SoftNicEngine> {
        match s.trim() {
            "kernel" => Ok(SoftNicEngine::Kernel),
            "thread" => Ok(SoftNicEngine::Thread),
            _ => Err(Error::BadEnv {
                var: var.to_string(),
                value: s.to_string(),
                reason: "is not `kernel` (a persistent engine kernel) or `thread` (a host thread; the CPU emulator only)".to_string(),
            }),
        }
    }
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
    /// Largest message of one WQE; longer puts and gets are split (default
    /// 1 MiB: long transfers become several WQEs the NIC can pipeline).
    pub max_msg: u32,
    /// The soft NIC's link model (`DOORBELL_SOFTNIC_LINK`; `None`: off).
    pub link: Option<LinkModel>,
    /// Where the soft NIC's engine runs (`DOORBELL_SOFTNIC_ENGINE`; `None`:
    /// the kernel on a GPU, the host thread on the emulator).
    pub engine: Option<SoftNicEngine>,
    /// Threads of the engine kernel's one block per port
    /// (`DOORBELL_SOFTNIC_ENGINE_THREADS`; `None`: [`ENGINE_THREADS_GPU`] on
    /// a GPU, 32 on the emulator, where every thread is an OS thread).
    pub engine_threads: Option<u32>,
    /// Makes the engine kernel's ordering with the ranks (the acquire after
    /// a doorbell record, the fence before a short copy after payload, the
    /// releases of CQEs, atomics and signal words) `sys`-scoped even when
    /// every rank runs on the engine's GPU, where it is `gpu`-scoped
    /// otherwise (`DOORBELL_SOFTNIC_SCOPE=sys`; default `auto`). With
    /// ranks on several GPUs it is `sys` either way. For measuring what the
    /// narrower scope saves (on one H200: within the spread between runs,
    /// `benchmarks/ibgda_h200_scope_ab.txt`).
    pub engine_sys_scope: bool,
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
            engine_sys_scope: false,
        }
    }
}

impl IbgdaOptions {
    /// The defaults with `DOORBELL_IBGDA_QPS_PER_PEER`,
    /// `DOORBELL_IBGDA_SQ_SIZE`, `DOORBELL_SOFTNIC_LINK`,
    /// `DOORBELL_SOFTNIC_ENGINE`, `DOORBELL_SOFTNIC_ENGINE_THREADS` and
    /// `DOORBELL_SOFTNIC_SCOPE` applied, strictly.
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
        let engine = match crate::env::raw(ENGINE_ENV)? {
            None => None,
            Some(v) => Some(SoftNicEngine::parse(ENGINE_ENV, &v)?),
        };
        let engine_threads = match crate::env::raw(ENGINE_THREADS_ENV)? {
            None => None,
            Some(_) => {
                let t = crate::env::uint(ENGINE_THREADS_ENV, 256, 32, 1024)? as u32;
                if t % 32 != 0 {
                    return Err(Error::BadEnv {
                        var: ENGINE_THREADS_ENV.to_string(),
                        value: t.to_string(),
                        reason: "is not a multiple of 32 (whole warps)".to_string(),
                    });
                }
                Some(t)
            }
        };
        let engine_sys_scope = match crate::env::raw(SCOPE_ENV)?.as_deref().map(str::trim) {
            None | Some("auto") => false,
            Some("sys") => true,
            Some(v) => {
                return Err(Error::BadEnv {
                    var: SCOPE_ENV.to_string(),
                    value: v.to_string(),
                    reason: "is not `auto` (gpu scope when every rank shares the engine's GPU) or `sys`".to_string(),
                })
            }
        };
        Ok(IbgdaOptions {
            qps_per_peer: qps,
            sq_size: sq,
            link,
            engine,
            engine_threads,
            engine_sys_scope,
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
        if let Some(t) = self.engine_threads {
            if !(32..=1024).contains(&t) || t % 32 != 0 {
                return bad(format!("engine_threads {t} is not a multiple of 32 in 32..=1024"));
            }
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

/// One QP and its CQ (dropped QP first). Their memory is in [`Memory`].
struct Qp {
    qp: SoftQp,
    _cq: SoftCq,
}

/// Bytes of ring memory per QP: the SQ, the CQ, then 64 bytes holding the
/// QP's doorbell record pair (+0), the CQ's (+8) and the UAR word (+16).
fn qp_bytes(sq: u32) -> usize {
    2 * sq as usize * SEND_WQE_BB + 64
}

/// Everything the soft NIC's engine touches besides the heaps and the
/// registered buffers, in device memory (the emulator's: host memory).
struct Memory {
    _rings: DeviceBuffer<u8>,
    _scratch: DeviceBuffer<u64>,
    states: DeviceBuffer<u8>,
    table: DeviceBuffer<u64>,
}

/// The engine of this rank's port.
enum Engine {
    Thread(EngineThread),
    Kernel(KernelEngine),
}

/// A running `softnic_engine` kernel and the device memory it owns.
struct KernelEngine {
    /// The untracked stream it runs on (nothing else runs there).
    stream: Option<StreamBackend>,
    /// While it runs, module unloads and frees on its GPU (which would wait
    /// for it) are postponed; dropped once it stopped, leaked with it if
    /// it did not.
    _persistent: Option<crate::backend::cuda::PersistentKernel>,
    ctl: DeviceBuffer<u8>,
    _ports: DeviceBuffer<u8>,
    /// Its port's tables, when not in the symmetric heap.
    _port: Option<DeviceBuffer<u8>>,
    /// Where its port's tables are.
    port_addr: u64,
    device: Device,
    threads: u32,
    /// Its state word and progress record in mapped host memory.
    status: StatusSlot,
    /// Its port (index in the fabric).
    port: u32,
    /// Logs its progress record while it runs.
    watch: Option<Watch>,
}

/// How often the watch logs an engine's progress record (at debug level,
/// and at warn when the engine stopped passing).
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// A host thread that reads an engine's progress record (mapped host
/// memory: no driver call, so it reports while a user kernel or a driver
/// call is stuck) and logs it every [`WATCH_EVERY`]. Stopped on drop.
struct Watch {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    fn start(rank: usize, port: u32, record: *const EngineProgress, state: *const u32) -> Watch {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let (record, state) = (record as usize, state as usize);
        let handle = std::thread::Builder::new()
            .name(format!("softnic-watch-{port}"))
            .spawn(move || {
                let mut last_passes = 0u64;
                let mut next = std::time::Instant::now() + WATCH_EVERY;
                while !flag.load(Ordering::Acquire) {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    if std::time::Instant::now() < next {
                        continue;
                    }
                    next += WATCH_EVERY;
                    // SAFETY: a record and a word of an engine image's pages,
                    // which are never freed.
                    let (p, st) = unsafe {
                        (
                            std::ptr::read_volatile(record as *const EngineProgress),
                            std::ptr::read_volatile(state as *const u32),
                        )
                    };
                    let line = IbgdaProgress {
                        rank,
                        port,
                        engine: SoftNicEngine::Kernel,
                        record: p,
                    };
                    if st == STATE_RUNNING && p.passes == last_passes {
                        tracing::warn!(
                            "rank {rank}: {line}; no pass for {} s: the engine kernel does not poll (not scheduled, or stuck)",
                            WATCH_EVERY.as_secs()
                        );
                    } else {
                        tracing::debug!("rank {rank}: {line} (state: {})", state_name(st));
                    }
                    last_passes = p.passes;
                }
            })
            .ok();
        Watch { stop, handle }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// What a soft NIC engine has seen and done, from its progress record:
/// `Display` gives one line for logs and error messages, e.g.
/// `engine port 0: 1234567 passes, doorbell record 0 (last UAR 0), 0
/// doorbells, 0 WQEs fetched, 0 WQEs, 0 CQEs, 0 errors`.
///
/// Reading a stalled run: passes that do not grow — the engine does not
/// poll; passes but no doorbells and doorbell record 0 — the producer's
/// UAR and doorbell-record stores never reach the engine (visibility or
/// a wrong address: compare the set-up's address log); doorbells but no
/// WQEs fetched — the doorbell record or the WQE is not what the engine
/// expects; WQEs and CQEs written but the user kernel's wait times out —
/// the kernel's CQ poll does not see the engine's CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbgdaProgress {
    /// The rank whose engine this is.
    pub rank: usize,
    /// Its port (index in the fabric).
    pub port: u32,
    /// Where it runs (the host thread has no pass count: 0).
    pub engine: SoftNicEngine,
    /// The record.
    pub record: EngineProgress,
}

impl IbgdaProgress {
    /// The record of a host-thread engine, from its port's counters.
    fn from_stats(rank: usize, port: u32, s: &PortStats) -> IbgdaProgress {
        IbgdaProgress {
            rank,
            port,
            engine: SoftNicEngine::Thread,
            record: EngineProgress {
                seq: 0,
                passes: 0,
                time_ns: 0,
                doorbells: s.doorbells,
                last_uar: s.last_uar,
                last_sq_pi: s.last_sq_pi as u64,
                dbr_rereads: s.dbr_rereads,
                fetched: s.fetched,
                executed: s.executed,
                wqes: s.wqes,
                cqes: s.cqes,
                errors: s.errors,
                flushes: s.flushes,
                last_qpn: s.last_qpn as u64,
                last_wqe: s.last_wqe as u64,
            },
        }
    }
}

/// One send queue of the IBGDA transport as its kernels keep it
/// ([`Communicator::ibgda_queues`]). Indices count WQEs and wrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbgdaQueue {
    /// The rank that posts on it.
    pub rank: usize,
    /// The rank it reaches.
    pub peer: usize,
    /// Which of the QPs to that peer.
    pub qp: usize,
    /// WQEs reserved.
    pub producer: u32,
    /// WQEs rung (submitted in reservation order).
    pub ready: u32,
    /// WQEs known complete.
    pub completed: u32,
    /// CQEs consumed.
    pub cq_consumer: u32,
    /// 1 while a thread consumes CQEs.
    pub poll_lock: u32,
    /// 0, or the completion error / wedge word.
    pub error: u32,
    /// The first WQE not known good once `error` is set.
    pub error_at: u32,
}

impl std::fmt::Display for IbgdaQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {} QP {} to rank {}: reserved {}, rung {}, completed {}, CQEs consumed {}, poll lock {}, error {:#x} at {}",
            self.rank,
            self.qp,
            self.peer,
            self.producer,
            self.ready,
            self.completed,
            self.cq_consumer,
            self.poll_lock,
            self.error,
            self.error_at
        )
    }
}

impl std::fmt::Display for IbgdaProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.record;
        write!(f, "engine port {}: ", self.port)?;
        match self.engine {
            SoftNicEngine::Kernel if p.seq == 0 => write!(f, "no progress record published yet, ")?,
            SoftNicEngine::Kernel => write!(f, "{} passes, ", p.passes)?,
            SoftNicEngine::Thread => write!(f, "host thread, ")?,
        }
        write!(
            f,
            "doorbell record {} (last UAR {:#x}), {} doorbells, {} re-reads, {} WQEs fetched, {} executed, {} WQEs, {} CQEs, {} errors, {} flushes, last QP {:#x} WQE {}",
            p.last_sq_pi,
            p.last_uar,
            p.doorbells,
            p.dbr_rereads,
            p.fetched,
            p.executed,
            p.wqes,
            p.cqes,
            p.errors,
            p.flushes,
            p.last_qpn,
            p.last_wqe
        )
    }
}

/// How long teardown waits for the engine kernel to stop, and setup for it
/// to start.
const ENGINE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// State words per device (one 4 KiB page of mapped host memory): engines
/// of one device running at once.
const STATUS_SLOTS: usize = 1024;

/// The engine kernel of one device and a page of mapped host memory for
/// the engines' state words, made once per process and device and never
/// freed: unloading a module whose kernel still runs, or freeing pinned
/// memory (which waits for the whole device), while another rank's engine
/// runs on the same GPU would hang or fault. Loading it once also means the
/// driver compiles the PTX once, not at every set-up and reset.
struct EngineImage {
    /// The entries, by [`EngineEntry`].
    functions: [Arc<FunctionBackend>; 3],
    status_host: usize,
    status_dev: u64,
    /// [`STATUS_SLOTS`] progress records, mapped like the state words.
    progress_host: usize,
    progress_dev: u64,
    free: Vec<u32>,
}

/// Engine images by (GPU?, ordinal).
static ENGINE_IMAGES: Mutex<Option<HashMap<(bool, usize), EngineImage>>> = Mutex::new(None);

/// One engine's state word: [`STATUS_SLOTS`] per device.
struct StatusSlot {
    key: (bool, usize),
    slot: u32,
    host: *mut u32,
    dev: u64,
    /// The engine's progress record (host and device addresses).
    progress_host: *mut EngineProgress,
    progress_dev: u64,
}

impl StatusSlot {
    /// The engine's progress record as it last published it. Reads this
    /// process's memory: no driver call, so it works while the engine or
    /// a user kernel is stuck.
    fn progress(&self) -> EngineProgress {
        // SAFETY: a record of the image's page, which is never freed.
        let v = unsafe { std::ptr::read_volatile(self.progress_host) };
        std::sync::atomic::fence(Ordering::Acquire);
        v
    }

    /// The engine's state as it last published it (acquire: pairs with its
    /// `st.release.sys`). Reads this process's memory: no driver call.
    fn read(&self) -> u32 {
        // SAFETY: a word of the image's page, which is never freed.
        let v = unsafe { std::ptr::read_volatile(self.host) };
        std::sync::atomic::fence(Ordering::Acquire);
        v
    }

    /// Hands the word back once its engine has exited.
    fn release(self) {
        if let Some(img) = ENGINE_IMAGES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .and_then(|m| m.get_mut(&self.key))
        {
            img.free.push(self.slot);
        }
    }
}

/// The engine kernel's entry for a block size: each is the same engine,
/// built for at most that many threads (so with at most 255, 128 or 64
/// registers per thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EngineEntry {
    /// `softnic_engine`: up to [`ENGINE_THREADS`] (256).
    Narrow = 0,
    /// `softnic_engine_mid`: up to [`ENGINE_THREADS_MID`] (512).
    Mid = 1,
    /// `softnic_engine_wide`: up to 1024.
    Wide = 2,
}

impl EngineEntry {
    /// The entry for blocks of `threads`.
    fn for_threads(threads: u32) -> EngineEntry {
        if threads <= ENGINE_THREADS {
            EngineEntry::Narrow
        } else if threads <= ENGINE_THREADS_MID {
            EngineEntry::Mid
        } else {
            EngineEntry::Wide
        }
    }
}

/// The engine kernel on `dev` (loaded, and compiled by the driver, the
/// first time) — its `entry` — and a free state word, reset to
/// [`STATE_LAUNCHED`].
fn engine_image(dev: &Device, rank: usize, entry: EngineEntry) -> Result<(Arc<FunctionBackend>, StatusSlot)> {
    let key = (dev.is_gpu(), dev.ordinal());
    let mut guard = ENGINE_IMAGES.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if !map.contains_key(&key) {
        let t0 = std::time::Instant::now();
        let module = dev.inner.load_module((&SOFTNIC).into())?;
        let functions = [
            Arc::new(module.function(<softnic_engine as Kernel>::NAME)?),
            Arc::new(module.function(<softnic_engine_mid as Kernel>::NAME)?),
            Arc::new(module.function(<softnic_engine_wide as Kernel>::NAME)?),
        ];
        let (host, dev_addr) = dev.inner.alloc_mapped(STATUS_SLOTS * 4)?;
        let (progress_host, progress_dev) = dev.inner.alloc_mapped(STATUS_SLOTS * std::mem::size_of::<EngineProgress>())?;
        tracing::debug!(
            "rank {rank}: IBGDA: soft NIC engine module loaded on {} ({} bytes of PTX) in {} ms; kept for the process",
            dev.name(),
            SOFTNIC_PTX.len(),
            t0.elapsed().as_millis()
        );
        map.insert(
            key,
            EngineImage {
                functions,
                status_host: host as usize,
                status_dev: dev_addr,
                progress_host: progress_host as usize,
                progress_dev,
                free: (0..STATUS_SLOTS as u32).rev().collect(),
            },
        );
    }
    let img = map.get_mut(&key).expect("inserted above");
    let slot = img.free.pop().ok_or_else(|| {
        Error::comm(format!(
            "rank {rank}: {STATUS_SLOTS} soft NIC engines already run on {}; drop communicators using IBGDA first",
            dev.name()
        ))
    })?;
    let s = StatusSlot {
        key,
        slot,
        host: (img.status_host + 4 * slot as usize) as *mut u32,
        dev: img.status_dev + 4 * slot as u64,
        progress_host: (img.progress_host + std::mem::size_of::<EngineProgress>() * slot as usize) as *mut EngineProgress,
        progress_dev: img.progress_dev + (std::mem::size_of::<EngineProgress>() * slot as usize) as u64,
    };
    // SAFETY: a word and a record of the pages, no engine uses them (the
    // slot was free).
    unsafe {
        std::ptr::write_volatile(s.host, STATE_LAUNCHED);
        std::ptr::write_volatile(s.progress_host, EngineProgress::default());
    }
    Ok((img.functions[entry as usize].clone(), s))
}

impl KernelEngine {
    /// Waits (bounded, reading host memory only) until the engine's state
    /// word is `want`; the state seen last.
    fn wait_state(&self, want: u32) -> std::result::Result<(), u32> {
        let t0 = std::time::Instant::now();
        loop {
            let s = self.status.read();
            if s == want {
                return Ok(());
            }
            if t0.elapsed() >= ENGINE_WAIT {
                return Err(s);
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    /// Sets the stop word (a driver copy into the control block).
    fn request_stop(&self) -> Result<()> {
        // SAFETY: the stop word of the control block.
        unsafe {
            self.device.inner.write(
                self.ctl.as_raw() + std::mem::offset_of!(EngineCtl, stop) as u64,
                &1u32.to_le_bytes(),
            )
        }
    }

    /// Sets the stop word and waits for the kernel to exit and its stream
    /// to drain. On success the engine's state word is handed back; an
    /// error means it did not stop in time (its memory must then stay
    /// allocated: the caller leaks it).
    fn stop(mut self, rank: usize) -> std::result::Result<(), (KernelEngine, String)> {
        let t0 = std::time::Instant::now();
        tracing::debug!("rank {rank}: IBGDA teardown: stop requested of the soft NIC engine kernel");
        if let Err(e) = self.request_stop() {
            return Err((self, format!("setting its stop word failed: {e}")));
        }
        if let Err(seen) = self.wait_state(STATE_EXITED) {
            let why = format!("its state word still reads {} ({seen}); {}", state_name(seen), self.progress(rank));
            return Err((self, why));
        }
        self.watch = None;
        tracing::debug!("rank {rank}: IBGDA teardown: {}", self.progress(rank));
        if let Some(s) = self.stream.take() {
            if let Err(e) = s.synchronize() {
                tracing::error!("rank {rank}: soft NIC engine kernel: {e}");
            }
        }
        tracing::debug!(
            "rank {rank}: IBGDA teardown: soft NIC engine kernel stopped after {} ms",
            t0.elapsed().as_millis()
        );
        let KernelEngine { status, .. } = self;
        status.release();
        Ok(())
    }

    /// The engine's progress record, read from mapped host memory.
    fn progress(&self, rank: usize) -> IbgdaProgress {
        IbgdaProgress {
            rank,
            port: self.port,
            engine: SoftNicEngine::Kernel,
            record: self.status.progress(),
        }
    }

    /// The engine's counters from its control block.
    fn counters(&self) -> Result<EngineCtl> {
        let mut b = vec![0u8; std::mem::size_of::<EngineCtl>()];
        // SAFETY: the whole control block.
        unsafe { self.device.inner.read(self.ctl.as_raw(), &mut b)? };
        // SAFETY: EngineCtl is plain #[repr(C)] data.
        Ok(unsafe { std::ptr::read_unaligned(b.as_ptr() as *const EngineCtl) })
    }
}

/// An engine state word in words.
fn state_name(s: u32) -> &'static str {
    match s {
        STATE_LAUNCHED => "launched, never started",
        STATE_RUNNING => "running",
        STATE_EXITED => "exited",
        _ => "not a state",
    }
}

/// This port's live tables in device memory, for the fabric (statistics,
/// the error log, new regions, fault configuration).
struct DevicePort {
    device: Device,
    port: u64,
    ctl: u64,
    lid: u16,
}

impl DevicePort {
    fn write(&self, addr: u64, bytes: &[u8], what: &'static str) -> doorbell_softnic::Result<()> {
        // A driver copy while the engine runs: logged on both sides, so a
        // copy that waits behind a kernel shows in a stalled run's log.
        let t0 = std::time::Instant::now();
        tracing::debug!("soft NIC port LID {}: writing {what} into the running engine's tables", self.lid);
        // SAFETY: `addr` lies in this port's table or control block (the
        // callers compute it from field offsets).
        let r = unsafe { self.device.inner.write(addr, bytes) }.map_err(|e| doorbell_softnic::Error::ResidentWrite {
            lid: self.lid,
            what,
            why: e.to_string(),
        });
        tracing::debug!("soft NIC port LID {}: {what} written in {} us", self.lid, t0.elapsed().as_micros());
        r
    }
}

fn bytes_of<T>(v: &T) -> &[u8] {
    // SAFETY: plain #[repr(C)] data read as bytes.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}

impl ResidentPort for DevicePort {
    fn read_port(&self, into: &mut Port) -> doorbell_softnic::Result<()> {
        let mut b = vec![0u8; std::mem::size_of::<Port>()];
        // SAFETY: the whole port table.
        unsafe { self.device.inner.read(self.port, &mut b) }.map_err(|e| doorbell_softnic::Error::ResidentWrite {
            lid: self.lid,
            what: "port tables (reading)",
            why: e.to_string(),
        })?;
        // SAFETY: Port is plain #[repr(C)] data; these bytes are one.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), into as *mut Port as *mut u8, b.len()) };
        Ok(())
    }

    fn write_mr(&self, slot: usize, mr: &MrEntry) -> doorbell_softnic::Result<()> {
        let at = self.port + (std::mem::offset_of!(Port, mrs) + slot * std::mem::size_of::<MrEntry>()) as u64;
        let valid = at + std::mem::offset_of!(MrEntry, valid) as u64;
        // Never a valid entry with stale fields: invalidate, write, validate.
        self.write(valid, &0u32.to_le_bytes(), "memory region")?;
        self.write(at, bytes_of(&MrEntry { valid: 0, ..*mr }), "memory region")?;
        if mr.valid != 0 {
            self.write(valid, &mr.valid.to_le_bytes(), "memory region")?;
        }
        Ok(())
    }

    fn write_config(&self, cfg: &EngineConfig) -> doorbell_softnic::Result<()> {
        self.write(
            self.ctl + std::mem::offset_of!(EngineCtl, cfg) as u64,
            bytes_of(cfg),
            "configuration",
        )?;
        let epoch_at = self.ctl + std::mem::offset_of!(EngineCtl, cfg_epoch) as u64;
        let epoch = self.read_word(epoch_at)? + 1;
        self.write(epoch_at, &epoch.to_le_bytes(), "configuration")?;
        // In force before this returns: a kernel launched next sees it.
        let applied_at = self.ctl + std::mem::offset_of!(EngineCtl, cfg_applied) as u64;
        let t0 = std::time::Instant::now();
        loop {
            let seen = self.read_word(applied_at)?;
            if seen >= epoch {
                return Ok(());
            }
            if t0.elapsed() > ENGINE_WAIT {
                return Err(doorbell_softnic::Error::ResidentWrite {
                    lid: self.lid,
                    what: "configuration",
                    why: format!(
                        "the engine kernel did not take it within {} s (it applied epoch {seen}, not {epoch})",
                        ENGINE_WAIT.as_secs()
                    ),
                });
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}

impl DevicePort {
    /// One 8-byte word of the control block.
    fn read_word(&self, addr: u64) -> doorbell_softnic::Result<u64> {
        let mut b = [0u8; 8];
        // SAFETY: `addr` is a word of this port's control block (the
        // callers compute it from field offsets).
        unsafe { self.device.inner.read(addr, &mut b) }.map_err(|x| doorbell_softnic::Error::ResidentWrite {
            lid: self.lid,
            what: "configuration",
            why: x.to_string(),
        })?;
        Ok(u64::from_le_bytes(b))
    }
}

/// What the engine of this rank's port is and has done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineReport {
    /// Where it runs.
    pub engine: SoftNicEngine,
    /// Threads of its block (kernel engine; 1 for the host thread).
    pub threads: u32,
    /// What it has done (kernel engine; zero for the host thread, whose
    /// port statistics are `SoftDevice::stats`).
    pub counters: EngineCounters,
}

/// This rank's IBGDA resources. Field order is drop order: the engine
/// stops before anything it reads goes away.
pub(crate) struct IbgdaState {
    engine: Option<Engine>,
    qps: Vec<Option<Qp>>,
    registered: Vec<SoftMr>,
    _scratch_mr: SoftMr,
    _heap_mr: SoftMr,
    memory: Option<Memory>,
    pd: SoftPd,
    device: SoftDevice,
    opts: IbgdaOptions,
    handle: Ibgda,
    /// In a world of several processes: the communicator's flag that an
    /// engine on the heap's table tail did not stop (set by the drop).
    tail_leaked: Option<Arc<std::sync::atomic::AtomicBool>>,
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
    /// On a GPU the soft NIC's engine is a persistent kernel (see the
    /// module docs). Peers may be threads of this process or other
    /// processes (then each rank runs its own fabric and the kernel engine;
    /// see the module docs for what crosses processes).
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
        let Some(mem) = st.memory.as_ref() else { return Ok(()) };
        let mut raw = vec![0u8; mem.states.len()];
        // SAFETY: the states buffer, whole; no kernel of this rank runs.
        unsafe { self.device.read_raw(mem.states.as_raw(), &mut raw)? };
        for i in 0..self.size * qpp {
            // SAFETY: `raw` holds one QpState per QP (plain data).
            let s = unsafe { std::ptr::read_unaligned((raw.as_ptr() as *const QpState).add(i)) };
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

    /// Where this rank's soft NIC engine runs and what it has done (`None`
    /// before the transport is set up).
    pub fn ibgda_engine(&self) -> Option<EngineReport> {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref()?.engine.as_ref()? {
            Engine::Thread(_) => Some(EngineReport {
                engine: SoftNicEngine::Thread,
                threads: 1,
                counters: EngineCounters::default(),
            }),
            Engine::Kernel(k) => {
                let c = k.counters().ok()?;
                Some(EngineReport {
                    engine: SoftNicEngine::Kernel,
                    threads: k.threads,
                    counters: c.counters,
                })
            }
        }
    }

    /// What this rank's soft NIC engine has seen and done (`None` before
    /// the transport is set up): passes, doorbells, WQEs, CQEs, the last
    /// doorbell values read (see the `IbgdaProgress` docs on reading it). The
    /// kernel engine's record is read from mapped host memory with no
    /// driver call, so this answers while a kernel is stuck; print it
    /// when a wait involving IBGDA fails.
    pub fn ibgda_progress(&self) -> Option<IbgdaProgress> {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        let st = guard.as_ref()?;
        match st.engine.as_ref()? {
            Engine::Kernel(k) => Some(k.progress(self.rank)),
            Engine::Thread(_) => Some(IbgdaProgress::from_stats(
                self.rank,
                st.device.port_index() as u32,
                &st.device.stats(),
            )),
        }
    }

    /// A snapshot of this rank's send queues as the kernels keep them
    /// (`None` before the transport is set up): per QP its reservation,
    /// ready (rung), completed and CQ-consumer indices, the CQ poll lock
    /// and the error word. Read from device memory with a driver copy,
    /// which kernels running on other streams do not block, so it answers
    /// while a kernel is stuck; read with `ibgda_progress` it tells a
    /// queue whose turn never comes (`ready < producer`, `completed ==
    /// ready`) from an engine that does not run what was rung.
    pub fn ibgda_queues(&self) -> Result<Option<Vec<IbgdaQueue>>> {
        let guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        let Some(st) = guard.as_ref() else { return Ok(None) };
        let Some(mem) = st.memory.as_ref() else { return Ok(None) };
        let qpp = st.opts.qps_per_peer as usize;
        let mut raw = vec![0u8; mem.states.len()];
        // SAFETY: the states buffer, whole (plain words; a racing kernel
        // makes the snapshot approximate, never invalid).
        unsafe { self.device.read_raw(mem.states.as_raw(), &mut raw)? };
        let n = (self.size * qpp).min(raw.len() / std::mem::size_of::<QpState>());
        Ok(Some(
            (0..n)
                .map(|i| {
                    // SAFETY: `raw` holds one QpState per QP (plain data).
                    let s = unsafe { std::ptr::read_unaligned((raw.as_ptr() as *const QpState).add(i)) };
                    IbgdaQueue {
                        rank: self.rank,
                        peer: i / qpp,
                        qp: i % qpp,
                        producer: s.producer,
                        ready: s.ready,
                        completed: s.completed,
                        cq_consumer: s.cq_consumer,
                        poll_lock: s.poll_lock,
                        error: s.error,
                        error_at: s.error_at,
                    }
                })
                .collect(),
        ))
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

    /// Whether a peer runs in another process (then every rank makes a
    /// fabric of its own, and the engines reach each other's tables through
    /// the symmetric heaps).
    fn cross_process(&self) -> bool {
        self.routes
            .iter()
            .any(|r| matches!(r, PeerRoute::CudaIpc | PeerRoute::SharedMemory))
    }

    /// Collective over a world of one process: the fabric rank 0 makes,
    /// handed to every rank.
    fn shared_fabric(&self) -> Result<SoftFabric> {
        let id = if self.rank == 0 {
            let id = NEXT_FABRIC.fetch_add(1, Ordering::Relaxed) ^ ((std::process::id() as u64) << 40);
            // The rings are device memory (the emulator's is host memory,
            // but the set-up is the same): this side initialises them.
            let fabric = SoftFabric::new(FabricConfig {
                device_rings: true,
                ..FabricConfig::default()
            });
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
        fabric.ok_or_else(|| Error::comm(format!("rank {}: rank 0's soft NIC fabric is not in this process", self.rank)))
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
        let t_setup = std::time::Instant::now();
        let gpu = self.device.is_gpu();
        let cross_process = self.cross_process();
        if cross_process && self.softnic_tail_leaked.load(Ordering::Acquire) {
            return Err(Error::comm(format!(
                "rank {}: IBGDA set-up: the soft NIC engine of an earlier set-up did not stop and may still use this \
                 rank's port tables; this communicator cannot set IBGDA up again (make a new one)",
                self.rank
            )));
        }
        let engine_kind = opts.engine.unwrap_or(if gpu || cross_process {
            SoftNicEngine::Kernel
        } else {
            SoftNicEngine::Thread
        });
        if gpu && engine_kind == SoftNicEngine::Thread {
            return Err(Error::comm(format!(
                "{ENGINE_ENV}=thread: on a GPU the soft NIC's rings and the heap are device memory, which a host-thread engine \
                 cannot execute WQEs on; use {ENGINE_ENV}=kernel (the default on a GPU)"
            )));
        }
        if cross_process && engine_kind == SoftNicEngine::Thread {
            return Err(Error::comm(format!(
                "rank {}: {ENGINE_ENV}=thread: ranks of this world run in other processes, and a host-thread engine \
                 executes WQEs of one process's fabric only; use {ENGINE_ENV}=kernel (the default in such a world)",
                self.rank
            )));
        }
        let size = self.size;
        let qpp = opts.qps_per_peer as usize;
        let sq = opts.sq_size;

        // 1. One fabric for the world, made by rank 0; in a world spanning
        // processes, one per rank, its port at the rank's index.
        let (fabric, device) = if cross_process {
            let fabric = SoftFabric::new(FabricConfig {
                device_rings: true,
                ..FabricConfig::default()
            });
            let device = fabric.open_device_at(self.rank, opts.link).map_err(softnic_err)?;
            (fabric, device)
        } else {
            let fabric = self.shared_fabric()?;
            let device = fabric.open_device(opts.link).map_err(softnic_err)?;
            (fabric, device)
        };

        // 2. PD, regions, ring memory.
        let pd = device.alloc_pd().map_err(softnic_err)?;
        // SAFETY: the heap outlives this state (the communicator drops the
        // state before its heap).
        let heap_mr = unsafe { device.reg_mr(&pd, self.heap_base as *mut u8, self.heap_len as usize, access::ALL) }.map_err(softnic_err)?;
        let nqps = size * qpp;
        let per_qp = qp_bytes(sq);
        let rings = self.device.alloc_zeroed::<u8>(nqps * per_qp)?;
        let scratch = self.device.alloc_zeroed::<u64>(nqps * sq as usize)?;
        let states = self.device.alloc_zeroed::<u8>(nqps * std::mem::size_of::<QpState>())?;
        // SAFETY: the scratch buffer lives in `memory`, which outlives the region.
        let scratch_mr =
            unsafe { device.reg_mr(&pd, scratch.as_raw() as *mut u8, scratch.num_bytes(), access::LOCAL_WRITE) }.map_err(softnic_err)?;
        // Every CQE invalid (owner 0), as rdma-core leaves a new CQ; the
        // doorbell records and UAR words zero.
        let invalid: Vec<u8> = cqe::invalid_cqe_words().iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut image = vec![0u8; nqps * per_qp];
        for i in 0..nqps {
            let cq = i * per_qp + sq as usize * SEND_WQE_BB;
            for e in 0..sq as usize {
                image[cq + e * CQE_SIZE..cq + (e + 1) * CQE_SIZE].copy_from_slice(&invalid);
            }
        }
        // SAFETY: the ring buffer, whole.
        unsafe { self.device.write_raw(rings.as_raw(), &image)? };
        tracing::debug!(
            "rank {}: IBGDA set-up: port LID {} open; rings of {nqps} QPs ({} bytes), scratch and QP states allocated and initialised in {} ms",
            self.rank,
            device.lid(),
            nqps * per_qp,
            t_setup.elapsed().as_millis()
        );
        let at = |i: usize, off: usize| rings.as_raw() + (i * per_qp + off) as u64;
        let tail = 2 * sq as usize * SEND_WQE_BB;

        // 3. QPs: to every rank, this one included (loopback).
        let mut qps = Vec::with_capacity(nqps);
        for i in 0..nqps {
            let cq_ring = CqRing {
                buf: at(i, sq as usize * SEND_WQE_BB) as *mut u8,
                entries: sq,
                dbrec: at(i, tail + 8) as *mut u32,
            };
            let qp_rings = QpRings {
                sq: at(i, 0) as *mut u8,
                sq_wqebbs: sq,
                rq: std::ptr::null_mut(),
                rq_wqes: 0,
                rq_max_sge: 1,
                dbrec: at(i, tail) as *mut u32,
                uar: at(i, tail + 16) as *mut u64,
            };
            // SAFETY: the rings live in `memory`, dropped after the objects.
            let cq = unsafe { device.create_cq(cq_ring) }.map_err(softnic_err)?;
            // SAFETY: as above.
            let qp = unsafe { device.create_qp(&pd, &cq, &cq, qp_rings) }.map_err(softnic_err)?;
            qps.push(Some(Qp { qp, _cq: cq }));
        }

        // 4. Exchange endpoints: heap base, rkey, LID, then every QP number.
        let mut mine = Vec::new();
        mine.extend_from_slice(&self.heap_base.to_le_bytes());
        mine.extend_from_slice(&heap_mr.rkey().to_le_bytes());
        mine.extend_from_slice(&(device.lid() as u32).to_le_bytes());
        for q in qps.iter().flatten() {
            mine.extend_from_slice(&q.qp.qpn().to_le_bytes());
            mine.extend_from_slice(&(q.qp.slot() as u32).to_le_bytes());
        }
        let all = self.world.all_gather_bytes(&mine)?;
        struct Remote {
            base: u64,
            rkey: u32,
            lid: u16,
            /// (QP number, slot in the port's table) per QP.
            qps: Vec<(u32, usize)>,
        }
        let remotes = all
            .iter()
            .enumerate()
            .map(|(r, b)| {
                if b.len() != 16 + 8 * nqps {
                    return Err(Error::comm(format!("rank {r} sent a malformed IBGDA endpoint ({} bytes)", b.len())));
                }
                let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
                Ok(Remote {
                    base: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
                    rkey: u32_at(8),
                    lid: u32_at(12) as u16,
                    qps: (0..nqps).map(|i| (u32_at(16 + 8 * i), u32_at(20 + 8 * i) as usize)).collect(),
                })
            })
            .collect::<Result<Vec<_>>>()?;

        // Connect QP k to peer p with the peer's QP k to this rank.
        let remote_access = access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;
        for p in 0..size {
            for k in 0..qpp {
                let q = qps[p * qpp + k].as_ref().expect("made above");
                let (qpn, slot) = remotes[p].qps[self.rank * qpp + k];
                let ep = QpEndpoint { lid: remotes[p].lid, qpn };
                q.qp.connect_remote(ep, slot, remote_access).map_err(softnic_err)?;
            }
        }
        tracing::debug!(
            "rank {}: IBGDA set-up: {nqps} QPs connected (RTS) in {} ms",
            self.rank,
            t_setup.elapsed().as_millis()
        );

        // The device's view of every QP.
        let mut words: Vec<u64> = Vec::with_capacity(nqps * 16);
        for p in 0..size {
            for k in 0..qpp {
                let i = p * qpp + k;
                let q = qps[i].as_ref().expect("made above");
                let state = (states.as_raw() as *mut QpState).wrapping_add(i);
                // SAFETY (the three field addresses): inside the states buffer.
                let h = QpHandle {
                    sq: at(i, 0) as *mut u32,
                    sq_producer: unsafe { &raw mut (*state).producer },
                    sq_ready: unsafe { &raw mut (*state).ready },
                    sq_dbr: at(i, tail + 4) as *mut u32,
                    uar: at(i, tail + 16) as *mut u64,
                    cq: at(i, sq as usize * SEND_WQE_BB) as *mut u32,
                    cq_consumer: unsafe { &raw mut (*state).cq_consumer },
                    cq_dbr: at(i, tail + 8) as *mut u32,
                    sq_size: sq,
                    qpn: q.qp.qpn(),
                    cq_size: sq,
                    reserved: 0,
                };
                let e = IbgdaQp {
                    qp: h,
                    state,
                    scratch: (scratch.as_raw() as *mut u64).wrapping_add(i * sq as usize),
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
        tracing::debug!("rank {}: IBGDA set-up: the kernels' QP table copied to the device", self.rank);
        let memory = Memory {
            _rings: rings,
            _scratch: scratch,
            states,
            table,
        };

        if engine_kind == SoftNicEngine::Thread {
            check_ring_addresses(self.rank, &device.port_image(), &read_qp_table(&self.device, &memory.table, nqps)?)?;
        }

        // 5. Everyone is in RTS before any kernel posts; then the engine.
        self.world.barrier()?;
        let engine = match engine_kind {
            SoftNicEngine::Thread => Engine::Thread(device.spawn_engine()),
            SoftNicEngine::Kernel => Engine::Kernel(self.launch_engine(&fabric, &device, &opts, &memory.table, nqps)?),
        };
        let handle = Ibgda {
            rank: self.rank as u32,
            world: size as u32,
            heap_bytes: self.heap_len,
            local_base: self.heap_base,
            budget_ns: self.budget_ns,
            qps: memory.table.as_ptr() as *const IbgdaQp,
            qps_per_peer: opts.qps_per_peer,
            max_msg: opts.max_msg,
            heap_lkey: heap_mr.lkey(),
            nreg: 0,
            reg: [RegRegion::default(); REG_SLOTS],
        };
        tracing::info!(
            "rank {}: IBGDA over the soft NIC: LID {}, {} QPs ({} per rank), SQ {} slots, link {:?}, engine {:?}",
            self.rank,
            device.lid(),
            nqps,
            qpp,
            sq,
            opts.link,
            engine_kind
        );
        tracing::debug!("rank {}: IBGDA set-up done in {} ms", self.rank, t_setup.elapsed().as_millis());
        Ok(IbgdaState {
            engine: Some(engine),
            qps,
            registered: Vec::new(),
            _scratch_mr: scratch_mr,
            _heap_mr: heap_mr,
            memory: Some(memory),
            pd,
            device,
            opts,
            handle,
            tail_leaked: cross_process.then(|| self.softnic_tail_leaked.clone()),
        })
    }

    /// Collective: copies this rank's port tables to device memory, builds
    /// the fabric's port table from every rank's, loads the engine kernel
    /// (once per device and process), and — once every rank has done all
    /// of that — launches this port's engine kernel (one block) on a stream
    /// of its own; waits (bounded) until it runs.
    ///
    /// Every step that may wait for the whole device (a module load, an
    /// allocation) is done by every rank before the world barrier that
    /// precedes the first launch, so no rank's step waits for another
    /// rank's engine, which never ends by itself.
    fn launch_engine(
        &self,
        fabric: &SoftFabric,
        device: &SoftDevice,
        opts: &IbgdaOptions,
        kernel_qps: &DeviceBuffer<u64>,
        nqps: usize,
    ) -> Result<KernelEngine> {
        let rank = self.rank;
        let t0 = std::time::Instant::now();
        let port_bytes = std::mem::size_of::<Port>();
        // Where this port's tables live: device memory of their own; in a
        // world spanning processes, the tail past the heap in the heap's
        // allocation, which every rank has mapped (see the module docs).
        let (port, port_addr) = if self.cross_process() {
            (None, self.heap_base + super::tail_off(self.heap_len))
        } else {
            let b = self.device.alloc_zeroed::<u8>(port_bytes)?;
            let a = b.as_raw();
            (Some(b), a)
        };
        let image = device.port_image();
        // SAFETY: the port's memory, whole; `image` is plain data of that size.
        unsafe {
            self.device.write_raw(
                port_addr,
                std::slice::from_raw_parts(&*image as *const Port as *const u8, port_bytes),
            )?
        };
        let mut mine = (device.port_index() as u64).to_le_bytes().to_vec();
        mine.extend_from_slice(&port_addr.to_le_bytes());
        mine.extend_from_slice(&self.heap_base.to_le_bytes());
        let all = self.world.all_gather_bytes(&mine)?;
        let mut table = PortTable::EMPTY;
        for (r, b) in all.iter().enumerate() {
            if b.len() != 24 {
                return Err(Error::comm(format!("rank {r} sent a malformed soft NIC port address")));
            }
            let word = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
            let index = word(0) as usize;
            if index >= MAX_PORTS {
                return Err(Error::comm(format!(
                    "rank {r} sent soft NIC port {index}; a fabric has at most {MAX_PORTS}"
                )));
            }
            let (at, heap) = (word(1), word(2));
            if matches!(self.routes[r], PeerRoute::CudaIpc | PeerRoute::SharedMemory) {
                // Its tables (in the tail past its heap) and its regions as
                // this process maps its heap allocation.
                let off = super::tail_off(self.heap_len);
                if index != r || at != heap.wrapping_add(off) {
                    return Err(Error::comm(format!(
                        "rank {r} sent soft NIC port {index} with tables at {at:#x}, not port {r} at the end of its heap \
                         allocation ({:#x}); every rank must run this doorbell version",
                        heap.wrapping_add(off)
                    )));
                }
                table.ports[index] = (self.bases[r] + off) as *mut Port;
                table.windows[index] = Window {
                    from: heap,
                    len: self.heap_len,
                    to: self.bases[r],
                };
            } else {
                table.ports[index] = at as *mut Port;
            }
            table.count = table.count.max(index as u32 + 1);
        }
        let ports = self.device.alloc_zeroed::<u8>(std::mem::size_of::<PortTable>())?;
        let ctl = self.device.alloc_zeroed::<u8>(std::mem::size_of::<EngineCtl>())?;
        tracing::debug!(
            "rank {rank}: IBGDA engine set-up: tables allocated ({port_bytes} bytes of port tables, {} ports) in {} ms",
            table.count,
            t0.elapsed().as_millis()
        );
        let threads = opts
            .engine_threads
            .unwrap_or(if self.device.is_gpu() { ENGINE_THREADS_GPU } else { 32 });
        let entry = EngineEntry::for_threads(threads);
        let (function, status) = engine_image(&self.device, rank, entry)?;
        let sys_scope = self.device.is_gpu() && (!self.same_gpu || opts.engine_sys_scope);
        let cfg = EngineCtl::new(
            ports.as_raw() as *const PortTable,
            device.port_index() as u32,
            fabric.config(),
            sys_scope,
            fabric.now_ns(),
            status.dev as *mut u32,
            status.progress_dev as *mut EngineProgress,
        );
        // SAFETY: the table buffer and the control block, whole.
        unsafe {
            self.device.write_raw(ports.as_raw(), bytes_of(&table))?;
            self.device.write_raw(ctl.as_raw(), bytes_of(&cfg))?;
        }
        tracing::debug!(
            "rank {rank}: IBGDA engine set-up: tables copied to the device in {} ms",
            t0.elapsed().as_millis()
        );
        if let Some(a) = function.attributes() {
            if threads as i32 > a.max_threads_per_block {
                return Err(Error::comm(format!(
                    "rank {rank}: IBGDA options: engine_threads {threads}: the soft NIC engine kernel uses {} registers per thread, so a block of it holds at most {} threads on {}",
                    a.registers,
                    a.max_threads_per_block,
                    self.device.name()
                )));
            }
        }
        let stream = self.device.inner.new_stream_untracked()?;
        let engine = KernelEngine {
            stream: Some(stream),
            _persistent: self.device.inner.persistent_kernel(),
            ctl,
            _ports: ports,
            _port: port,
            port_addr,
            device: self.device.clone(),
            threads,
            status,
            port: device.port_index() as u32,
            watch: None,
        };
        // The engine's view of the rings (its port table as copied to the
        // device) against the kernels' (the QP table): a mismatch means the
        // engine would poll other words than the kernels ring.
        {
            let mut b = vec![0u8; port_bytes];
            // SAFETY: the port buffer, whole; no engine runs yet (every
            // rank launches after the barrier below).
            unsafe { self.device.read_raw(engine.port_addr, &mut b)? };
            // SAFETY: Port is plain #[repr(C)] data; these bytes are one.
            let on_device: Box<Port> = unsafe {
                let mut p = device.port_image();
                std::ptr::copy_nonoverlapping(b.as_ptr(), &mut *p as *mut Port as *mut u8, port_bytes);
                p
            };
            check_ring_addresses(rank, &on_device, &read_qp_table(&self.device, kernel_qps, nqps)?)?;
        }

        // No rank launches before every rank is done loading and allocating.
        self.world.barrier()?;
        let launched = std::time::Instant::now();
        // SAFETY: `function` is the engine's entry point for this many
        // threads (`softnic_engine`, `_mid` or `_wide`, one pointer
        // argument each); the control block names this port's
        // tables, the fabric's port table and (through them) rings and
        // regions that stay allocated until the engine reports that it
        // exited (teardown), and its state word, which is never freed.
        unsafe {
            let stream = engine.stream.as_ref().expect("set above");
            let cfg = crate::LaunchConfig::linear(1, threads).with_shared_mem(SHARED_BYTES);
            let args = (engine.ctl.as_raw() as *mut EngineCtl,);
            match entry {
                EngineEntry::Narrow => stream.launch::<softnic_engine>(&function, &cfg, args)?,
                EngineEntry::Mid => stream.launch::<softnic_engine_mid>(&function, &cfg, args)?,
                EngineEntry::Wide => stream.launch::<softnic_engine_wide>(&function, &cfg, args)?,
            }
        };
        tracing::debug!(
            "rank {rank}: IBGDA engine set-up: engine kernel launched (one block of {threads} threads, {SHARED_BYTES} bytes of shared memory)"
        );
        if let Err(seen) = engine.wait_state(STATE_RUNNING) {
            let msg = format!(
                "rank {rank}: the soft NIC's engine kernel did not start within {} s (its state word reads {seen}: {}); \
                 a persistent kernel needs a free SM: leave room for it beside kernels that occupy every SM",
                ENGINE_WAIT.as_secs(),
                state_name(seen)
            );
            tracing::error!("{msg}");
            // Should it start later, it exits at once; its memory and
            // stream stay allocated (leaked), as it may still run.
            let _ = engine.request_stop();
            std::mem::forget(engine);
            return Err(Error::comm(msg));
        }
        tracing::debug!(
            "rank {rank}: IBGDA engine set-up: engine kernel started {} ms after its launch",
            launched.elapsed().as_millis()
        );
        let mut engine = engine;
        engine.watch = Some(Watch::start(rank, engine.port, engine.status.progress_host, engine.status.host));
        device.set_resident(Some(Arc::new(DevicePort {
            device: self.device.clone(),
            port: engine.port_addr,
            ctl: engine.ctl.as_raw(),
            lid: device.lid(),
        })));
        // Every port reaches its running engine through the fabric before
        // any rank returns: a configuration set right after set-up (fault
        // injection) then reaches every engine, not only those done.
        self.world.barrier()?;
        tracing::info!(
            "rank {rank}: soft NIC engine kernel running: port {}, one block of {threads} threads, fences at {} scope",
            device.port_index(),
            if sys_scope { "sys" } else { "gpu" }
        );
        Ok(engine)
    }
}

impl Drop for IbgdaState {
    fn drop(&mut self) {
        // The engine first: nothing polls the rings while they go away.
        match self.engine.take() {
            Some(Engine::Kernel(k)) => match k.stop(self.handle.rank as usize) {
                Ok(()) => self.device.set_resident(None),
                Err((k, why)) => {
                    // It may still touch its tables, the rings and the
                    // scratch: keep them (and the stream) allocated.
                    tracing::error!(
                        "rank {}: soft NIC engine kernel of port LID {} did not stop within {} s ({why}); its memory is leaked",
                        self.handle.rank,
                        self.device.lid(),
                        ENGINE_WAIT.as_secs()
                    );
                    std::mem::forget(k);
                    std::mem::forget(self.memory.take());
                    // Its tables in the heap's tail stay in use: no later
                    // set-up of this communicator may write them.
                    if let Some(f) = &self.tail_leaked {
                        f.store(true, Ordering::Release);
                    }
                }
            },
            Some(Engine::Thread(t)) => drop(t),
            None => {}
        }
        // Then the QPs and CQs before the regions, and the memory last.
        self.qps.clear();
        self.registered.clear();
    }
}

/// The kernels' QP table as the device holds it.
fn read_qp_table(dev: &Device, table: &DeviceBuffer<u64>, nqps: usize) -> Result<Vec<IbgdaQp>> {
    let mut b = vec![0u8; nqps * std::mem::size_of::<IbgdaQp>()];
    // SAFETY: the table buffer holds `nqps` entries; no kernel uses it yet.
    unsafe { dev.read_raw(table.as_raw(), &mut b)? };
    Ok((0..nqps)
        // SAFETY: IbgdaQp is plain #[repr(C)] data; entry `i` lies in `b`.
        .map(|i| unsafe { std::ptr::read_unaligned((b.as_ptr() as *const IbgdaQp).add(i)) })
        .collect())
}

/// Logs each QP's SQ, doorbell record, UAR word and CQ as the engine's
/// port table holds them and as the kernels' QP table does, and fails
/// when they differ: the engine would watch words no kernel writes.
fn check_ring_addresses(rank: usize, port: &Port, kernel: &[IbgdaQp]) -> Result<()> {
    for (i, k) in kernel.iter().enumerate() {
        let h = &k.qp;
        let Some(q) = port.qps.iter().find(|q| q.in_use() && q.qpn == h.qpn) else {
            return Err(Error::comm(format!(
                "rank {rank}: IBGDA set-up: QP {i} (QPN {:#x}, to rank {}) of the kernels' QP table is not in the soft NIC                  engine's port table; the engine would never see its doorbells",
                h.qpn, k.peer
            )));
        };
        let cq = port
            .cqs
            .get(q.send_cq as usize)
            .copied()
            .unwrap_or(doorbell_softnic::engine::CqEntry::EMPTY);
        let pairs: [(&str, u64, u64); 7] = [
            ("SQ", q.sq as u64, h.sq as u64),
            ("send doorbell record", q.dbrec.wrapping_add(1) as u64, h.sq_dbr as u64),
            ("UAR word", q.uar as u64, h.uar as u64),
            ("CQ ring", cq.ring as u64, h.cq as u64),
            ("CQ doorbell record", cq.dbrec as u64, h.cq_dbr as u64),
            ("SQ size", q.sq_wqebbs as u64, h.sq_size as u64),
            ("CQ size", cq.entries as u64, h.cq_size as u64),
        ];
        tracing::debug!(
            "rank {rank}: IBGDA set-up: QP {i} (QPN {:#x}, to rank {}): SQ {:#x}, doorbell record {:#x}, UAR {:#x}, CQ {:#x} \
             (CQ doorbell record {:#x}) in the engine's table; kernel handle {}",
            h.qpn,
            k.peer,
            pairs[0].1,
            pairs[1].1,
            pairs[2].1,
            pairs[3].1,
            pairs[4].1,
            if pairs.iter().all(|p| p.1 == p.2) { "agrees" } else { "DIFFERS" }
        );
        if let Some((what, e, kh)) = pairs.iter().find(|p| p.1 != p.2) {
            return Err(Error::comm(format!(
                "rank {rank}: IBGDA set-up: QP {i} (QPN {:#x}, to rank {}): the kernels' handle has {what} {kh:#x}, the soft NIC \
                 engine's port table {e:#x}; the engine would watch other words than the kernels write (a set-up bug: the \
                 two tables must be built from the same ring addresses)",
                h.qpn, k.peer
            )));
        }
        if q.state() != doorbell_softnic::engine::QpState::Rts {
            return Err(Error::comm(format!(
                "rank {rank}: IBGDA set-up: QP {i} (QPN {:#x}, to rank {}) is in {:?}, not RTS, in the engine's table; \
                 the engine would ignore its doorbells",
                h.qpn,
                k.peer,
                q.state()
            )));
        }
    }
    Ok(())
}

fn softnic_err(e: doorbell_softnic::Error) -> Error {
    Error::comm(format!("soft NIC: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use doorbell_softnic::engine::tables::{QP_CONNECTED, QP_IN_USE};
    use doorbell_softnic::engine::{CqEntry, QpEntry};

    /// One QP in RTS with its CQ, in the engine's table and in the
    /// kernels' handle, built from the same ring addresses.
    fn views() -> (Box<Port>, IbgdaQp) {
        let (sq, cq, dbr, uar) = (0x1000u64, 0x5000u64, 0x9000u64, 0x9010u64);
        let mut port = Box::new(Port::new(1, LinkModel::OFF));
        port.cqs[0] = CqEntry {
            ring: cq as *mut u8,
            dbrec: (dbr + 8) as *const u32,
            entries: 64,
            cqn: 1,
            valid: 1,
            ..CqEntry::EMPTY
        };
        port.qps[3] = QpEntry {
            sq: sq as *mut u8,
            dbrec: dbr as *mut u32,
            uar: uar as *const u64,
            qpn: 0x103,
            state: doorbell_softnic::engine::QpState::Rts as u32,
            sq_wqebbs: 64,
            flags: QP_IN_USE | QP_CONNECTED,
            ..QpEntry::EMPTY
        };
        let k = IbgdaQp {
            qp: QpHandle {
                sq: sq as *mut u32,
                sq_producer: std::ptr::null_mut(),
                sq_ready: std::ptr::null_mut(),
                sq_dbr: (dbr + 4) as *mut u32,
                uar: uar as *mut u64,
                cq: cq as *mut u32,
                cq_consumer: std::ptr::null_mut(),
                cq_dbr: (dbr + 8) as *mut u32,
                sq_size: 64,
                qpn: 0x103,
                cq_size: 64,
                reserved: 0,
            },
            state: std::ptr::null_mut(),
            scratch: std::ptr::null_mut(),
            scratch_lkey: 0,
            peer: 1,
            remote_base: 0,
            rkey: 0,
            _pad: 0,
            _reserved: 0,
        };
        (port, k)
    }

    #[test]
    fn ring_addresses_that_agree_pass_and_each_mismatch_is_named() {
        let (port, k) = views();
        check_ring_addresses(0, &port, &[k]).expect("the same addresses");
        let mut uar = k;
        uar.qp.uar = 0x9018 as *mut u64;
        let e = check_ring_addresses(0, &port, &[uar]).expect_err("another UAR word").to_string();
        assert!(e.contains("UAR word 0x9018") && e.contains("0x9010"), "{e}");
        let mut dbr = k;
        dbr.qp.sq_dbr = 0x9000 as *mut u32;
        let e = check_ring_addresses(0, &port, &[dbr]).expect_err("the receive counter").to_string();
        assert!(e.contains("send doorbell record"), "{e}");
        let mut cq = k;
        cq.qp.cq = 0x5040 as *mut u32;
        let e = check_ring_addresses(0, &port, &[cq]).expect_err("another CQ").to_string();
        assert!(e.contains("CQ ring"), "{e}");
        let mut qpn = k;
        qpn.qp.qpn = 0x104;
        let e = check_ring_addresses(0, &port, &[qpn]).expect_err("an unknown QP").to_string();
        assert!(e.contains("not in the soft NIC"), "{e}");
        let (mut init, k) = views();
        init.qps[3].state = doorbell_softnic::engine::QpState::Init as u32;
        let e = check_ring_addresses(0, &init, &[k]).expect_err("a QP not in RTS").to_string();
        assert!(e.contains("not RTS"), "{e}");
    }
}
