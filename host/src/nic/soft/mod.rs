//! The soft NIC (`doorbell-softnic`) behind the NIC boundary: [`SoftNic`]
//! implements [`Nic`] over a port of a [`SoftFabric`], and hosts the
//! port's engine.
//!
//! ## Fabrics
//! In a world of one process, rank 0 makes the fabric (the switch between
//! the ports) and hands it to the other ranks ([`open`] is collective
//! then). In a world where a peer runs in another process, every rank
//! makes a fabric of its own and opens its port at its rank's index
//! ([`SoftFabric::open_device_at`]), so LIDs agree across processes; a QP
//! then connects to a port of another process's fabric by the slot its
//! owner published ([`Endpoint::slot`]), taken on trust as an RC NIC takes
//! an address vector.
//!
//! ## Where the engine runs ([`Nic::start`])
//! * **Kernel** ([`SoftNicEngine::Kernel`]; the default on a GPU and in a
//!   world of several processes, [`ENGINE_ENV`]`=kernel` on the emulator):
//!   each rank copies its port's tables to its device memory, the ranks
//!   exchange those addresses into a port table, and each rank launches
//!   `softnic_engine_256` (from [`SOFTNIC_PTX`]) — **one block per port**
//!   by default, up to [`MAX_ENGINE_BLOCKS`] ([`ENGINE_BLOCKS_ENV`]), of
//!   which up to [`MAX_SHARDS`](doorbell_softnic::engine::MAX_SHARDS) serve QPs, each its own, and all share the
//!   large copies, [`ENGINE_THREADS_GPU`] threads on a GPU
//!   ([`ENGINE_THREADS_ENV`]) — on
//!   a non-blocking stream that [`crate::Device::synchronize`] and buffer
//!   frees do not wait for. The engine's module is loaded once per device
//!   and process and never unloaded (unloading it, or loading modules and
//!   allocating, while an engine runs may wait for that engine, which
//!   never ends by itself), and every rank loads and allocates before a
//!   world barrier that precedes the first launch. The engine publishes
//!   its state (running, exited) and a progress record into mapped host
//!   memory, so the host's waits for it read host memory in a bounded loop
//!   and make no driver call; a watch thread logs the record every few
//!   seconds ([`IbgdaProgress`] says how to read it).
//!
//!   Thread 0 runs the engine's control (the same `poll_port` as the host
//!   thread); copies of 1 KiB or more are moved by the whole block with
//!   16-byte vectors, smaller ones by thread 0, and from 64 KiB up their
//!   aligned body goes through the SM's bulk-copy unit (TMA, staged in
//!   the block's shared memory; [`COPY_ENV`]`=threads` keeps it with the
//!   threads). Payload goes over the same
//!   mappings as P2P; the engine's fences and CQE releases are at `gpu`
//!   scope when every rank shares one GPU ([`SCOPE_ENV`]`=sys` widens
//!   them), else at `sys`. **Cost**: one SM per block (a block of 256, 512
//!   or 1024 threads holds all of its registers) — a kernel that sizes an
//!   all-resident grid by the SM count must leave those SMs free, or it and
//!   the engine wait for each other. While the engine runs, the fabric
//!   sends new regions and fault configurations to the device tables and
//!   reads counters and the error log from them.
//!
//!   **Across processes** the engines reach each other through the
//!   symmetric heaps, which every rank has mapped: each port's tables lie
//!   in a tail of its rank's heap allocation, past the heap's end
//!   ([`TABLES_TAIL`] bytes), which peers map with the heap but which no
//!   transport call and no registered region reaches; the port table gives
//!   each port of another process a window — its heap as its owner
//!   addresses it, and as this process maps it — through which the engine
//!   translates the responder's addresses. So a remote region must lie in
//!   the peer's heap, and SEND and WRITE with immediate (which consume the
//!   responder's receive queue) fail toward another process. A fault
//!   configuration reaches this process's engine only. An engine that does
//!   not stop leaves its tables in use: a later [`open`] with the same
//!   [`CrossProcess::tail_in_use`] flag is refused.
//! * **Thread** ([`SoftNicEngine::Thread`], the emulator's default in a
//!   world of one process): a host thread per port polls the same tables
//!   in host memory. Refused in a world of several processes (it executes
//!   one fabric) and on a GPU (a host thread would need a driver copy per
//!   WQE).
//!
//! Both check at [`Nic::start`] that the engine's port table and the
//! kernels' QP table name the same SQ, doorbell record, UAR word and CQ
//! for every QP (and log them at debug level).
//!
//! [`Nic::stop`] sets the engine's stop word, waits (20 s at most) for it
//! to report that it exited and synchronizes its stream; an engine that
//! does not stop is reported and its memory leaked, never freed under it.

mod engine;
mod port;
mod report;
#[cfg(test)]
mod tests;

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use doorbell_softnic::engine::burst::BURST_MAX;
use doorbell_softnic::engine::resident::IDLE_SLEEP_NS;
use doorbell_softnic::engine::{Port, MAX_ENGINE_BLOCKS};
use doorbell_softnic::{FabricConfig, QueuePair as _, RdmaDevice as _, SoftCq, SoftFabric, SoftMr, SoftPd, SoftQp};

use super::{CompletionQueue, CqRing, Endpoint, LinkLayer, MemoryRegion, Nic, NicKind, PortInfo, QpOptions, QpRings, QueuePair, StartCtx};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::world::World;
use engine::Engine;

pub use doorbell_softnic::engine::resident::EngineProgress;
pub use doorbell_softnic::engine::{EngineConfig, EngineCounters, LinkModel, Phase as EnginePhase};
pub use doorbell_softnic::SoftDevice;
pub use report::{EngineReport, IbgdaProgress};

/// The soft NIC's engine kernel (`softnic_engine_256`), built from
/// `doorbell-softnic` into a PTX of its own: the soft NIC is a device, not
/// a library kernel, so it is not in [`crate::KERNELS_PTX`].
pub const SOFTNIC_PTX: &str = SOFTNIC.ptx;
/// [`SOFTNIC_PTX`] with its cubin (see [`crate::ModuleImage`]): what
/// [`Nic::start`] loads.
pub const SOFTNIC: crate::ModuleImage = crate::module_image!("doorbell_softnic");

/// How long teardown waits for the engine kernel to stop, and setup for it
/// to start.
pub(super) const ENGINE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Bytes after the symmetric heap, in the same allocation, that hold a
/// rank's soft NIC port tables in a world of several processes: every peer
/// maps them with the heap, and neither the transports' range checks nor
/// the heap's registered region reach past the heap's end.
pub const TABLES_TAIL: u64 = (std::mem::size_of::<Port>() as u64).next_multiple_of(4096);

/// `DOORBELL_SOFTNIC_ENGINE`: `kernel` or `thread`, where the soft NIC's
/// engine runs (see [`SoftNicEngine`]).
pub const ENGINE_ENV: &str = "DOORBELL_SOFTNIC_ENGINE";
/// `DOORBELL_SOFTNIC_ENGINE_THREADS`: threads of the engine kernel's block,
/// a multiple of 32 in 32..=1024.
pub const ENGINE_THREADS_ENV: &str = "DOORBELL_SOFTNIC_ENGINE_THREADS";
/// `DOORBELL_SOFTNIC_ENGINE_BLOCKS`: blocks (SMs) of the engine kernel
/// per port, 1..=32; at most 8 serve QPs (see
/// [`SoftOptions::engine_blocks`]).
pub const ENGINE_BLOCKS_ENV: &str = "DOORBELL_SOFTNIC_ENGINE_BLOCKS";
/// `DOORBELL_SOFTNIC_SCOPE`: `auto` or `sys`, the scope of the engine
/// kernel's ordering with the ranks (see [`SoftOptions::sys_scope`]).
pub const SCOPE_ENV: &str = "DOORBELL_SOFTNIC_SCOPE";
/// `DOORBELL_SOFTNIC_COPY`: `bulk` (the default) or `threads`, how the
/// engine kernel's block copies move payload (see
/// [`SoftOptions::thread_copies`]).
pub const COPY_ENV: &str = "DOORBELL_SOFTNIC_COPY";
/// `DOORBELL_SOFTNIC_BURST`: most WQEs of one burst of the engine kernel,
/// 0..=32 (0: no bursts; see [`SoftOptions::burst`]).
pub const BURST_ENV: &str = "DOORBELL_SOFTNIC_BURST";
/// `DOORBELL_SOFTNIC_IDLE_SLEEP_NS`: how long the engine kernel's control
/// thread sleeps between passes once idle, ns, 0..=1000000 (0: never; see
/// [`SoftOptions::idle_sleep_ns`]).
pub const IDLE_SLEEP_ENV: &str = "DOORBELL_SOFTNIC_IDLE_SLEEP_NS";
/// Most [`SoftOptions::idle_sleep_ns`]: 1 ms.
pub const IDLE_SLEEP_MAX_NS: u32 = 1_000_000;
/// Threads of the engine kernel's block on a GPU by default: 256, on
/// `softnic_engine_256` (255 registers per thread: its control thread
/// spills less than on `softnic_engine_512`'s 128), whose copies keep 16
/// vectors in flight per thread instead of 8, so the block has as many
/// bytes in flight as one of 512. On one H200, against 512 threads in the
/// same run (`benchmarks/ibgda_h200_engine_copy_inlining.txt`): puts of
/// 64 and 256 MiB 1.02 – 1.03×, lane posts 1.10 – 1.12×, the `put_signal`
/// round trip 0.94 – 0.99×; with the copy loops inlined (the build before,
/// `benchmarks/ibgda_h200_engine_threads_wide.txt`) 8 engine blocks on
/// 16 QPs posted 15.56 against 14.56 M WQE/s. 256 threads with 8 vectors
/// in flight ran the round trip 0.89 – 0.92× as long but large puts
/// 0.85 – 0.86× as fast. Earlier (the build of
/// `benchmarks/ibgda_h200_engine_entries.txt`, when 512 became the
/// default):
///
/// | threads (entry) | control cycles / WQE | engine M WQE/s | 256 MiB puts | `put_signal` round trip |
/// |---|---|---|---|---|
/// | 256 (`softnic_engine_256`, 255 registers) | 12 540 – 12 640 | 0.127 – 0.128 | 22.7 – 22.8 GB/s | 50.4 – 50.5 µs |
/// | 512 (`softnic_engine_512`) | 13 390 – 13 410 | 0.122 – 0.123 | 28.7 – 29.0 GB/s | 51.4 – 51.7 µs |
/// | 512 on `softnic_engine_1024` (64 registers, before) | 14 700 – 14 740 | 0.113 | 26.9 – 27.0 GB/s | 54.6 – 54.7 µs |
/// | 1024 (`softnic_engine_1024`) | 14 720 – 14 790 | 0.113 – 0.114 | 30.5 – 30.6 GB/s | 54.5 – 54.6 µs |
///
/// Each of 256, 512 and 1024 holds all of its SM's registers.
pub const ENGINE_THREADS_GPU: u32 = 256;
/// Blocks of the engine kernel per port on a GPU by default
/// ([`SoftOptions::engine_blocks`]): one SM per rank, as the library's
/// grids that must be resident at once assume unless told more.
pub const ENGINE_BLOCKS_GPU: u32 = 1;

/// The path MTU the soft NIC reports (it does not packetize).
const SOFT_MTU: u32 = 4096;

/// Where the soft NIC's engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoftNicEngine {
    /// A host thread per port (`SoftDevice::spawn_engine`). The emulator's
    /// default; refused on a GPU (the rings are device memory).
    Thread,
    /// A persistent kernel per port (`softnic_engine_256`, one block) on a
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

/// The soft NIC's own settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SoftOptions {
    /// The link model (`DOORBELL_SOFTNIC_LINK`; `None`: off).
    pub link: Option<LinkModel>,
    /// Where the engine runs ([`ENGINE_ENV`]; `None`: the kernel on a GPU
    /// or in a world of several processes, the host thread otherwise).
    pub engine: Option<SoftNicEngine>,
    /// Threads of the engine kernel's one block ([`ENGINE_THREADS_ENV`];
    /// `None`: [`ENGINE_THREADS_GPU`] on a GPU, 32 on the emulator, where
    /// every thread is an OS thread).
    pub engine_threads: Option<u32>,
    /// Blocks of the engine kernel per port ([`ENGINE_BLOCKS_ENV`],
    /// 1..=[`MAX_ENGINE_BLOCKS`]; `None`: [`ENGINE_BLOCKS_GPU`] on a GPU,
    /// 1 on the emulator), each on its own SM. Up to [`MAX_SHARDS`](doorbell_softnic::engine::MAX_SHARDS) of
    /// them run QPs, each its own (`Port::assign_shards`: QPs that share a
    /// CQ share a block; with the link model on, the blocks reserve the
    /// port's one transmitter in turn); blocks beyond the port's groups of
    /// QPs serve none. While some block serves none, the blocks copy
    /// chunks of one another's payloads of `SHARE_MIN` bytes or more (the
    /// engine's shared copies), so large puts and gets move at several
    /// SMs' rate; a block that serves QPs posts such a copy and goes on
    /// checking its QP's next WQE while the others copy it.
    pub engine_blocks: Option<u32>,
    /// Makes the engine kernel's ordering with the ranks `sys`-scoped even
    /// when every rank runs on the engine's GPU ([`SCOPE_ENV`]`=sys`).
    pub sys_scope: bool,
    /// Makes the engine kernel's block copies with the block's threads
    /// alone ([`COPY_ENV`]`=threads`). By default a copy of at least
    /// `BULK_MIN` bytes (`doorbell_softnic::engine::resident`) whose two
    /// ends share their offset mod 16 moves its
    /// 16-byte-aligned body through the SM's bulk-copy unit (TMA), staged
    /// in the block's shared memory (`SHARED_BYTES_BULK` of it), and its
    /// threads copy the rest.
    pub thread_copies: bool,
    /// Most WQEs of one burst of the engine kernel ([`BURST_ENV`];
    /// `None`: [`BURST_MAX`]):
    /// runs of small RDMA WRITEs its block reads and checks together, a
    /// WQE per thread; 0: none, every WQE takes the one-WQE path.
    pub burst: Option<u32>,
    /// How long the engine kernel's control thread sleeps (`nanosleep`)
    /// between passes once it has been idle for a while, ns
    /// ([`IDLE_SLEEP_ENV`]; `None`: `IDLE_SLEEP_NS` of
    /// `doorbell_softnic::engine::resident`); 0: it never sleeps. A
    /// doorbell rung while it sleeps waits for the sleep to end. At most
    /// [`IDLE_SLEEP_MAX_NS`].
    pub idle_sleep_ns: Option<u32>,
}

impl SoftOptions {
    /// The defaults with `DOORBELL_SOFTNIC_LINK`, [`ENGINE_ENV`],
    /// [`ENGINE_THREADS_ENV`], [`SCOPE_ENV`], [`COPY_ENV`], [`BURST_ENV`] and
    /// [`IDLE_SLEEP_ENV`] applied, strictly.
    pub fn from_env() -> Result<SoftOptions> {
        let link = doorbell_softnic::link_from_env().map_err(|e| Error::BadEnv {
            var: doorbell_softnic::LINK_ENV.to_string(),
            value: std::env::var(doorbell_softnic::LINK_ENV).unwrap_or_default(),
            reason: e.to_string(),
        })?;
        let engine = match crate::vars::raw(ENGINE_ENV)? {
            None => None,
            Some(v) => Some(SoftNicEngine::parse(ENGINE_ENV, &v)?),
        };
        let engine_threads = match crate::vars::raw(ENGINE_THREADS_ENV)? {
            None => None,
            Some(_) => {
                let t = crate::vars::uint(ENGINE_THREADS_ENV, 256, 32, 1024)? as u32;
                if !t.is_multiple_of(32) {
                    return Err(Error::BadEnv {
                        var: ENGINE_THREADS_ENV.to_string(),
                        value: t.to_string(),
                        reason: "is not a multiple of 32 (whole warps)".to_string(),
                    });
                }
                Some(t)
            }
        };
        let engine_blocks = match crate::vars::raw(ENGINE_BLOCKS_ENV)? {
            None => None,
            Some(_) => Some(crate::vars::uint(ENGINE_BLOCKS_ENV, 1, 1, MAX_ENGINE_BLOCKS as u64)? as u32),
        };
        // `auto`: gpu scope when every rank shares the engine's GPU.
        let sys_scope = crate::vars::choice(SCOPE_ENV, &["auto", "sys"])? == Some(1);
        // `bulk`: the SM's bulk-copy unit moves large copies.
        let thread_copies = crate::vars::choice(COPY_ENV, &["bulk", "threads"])? == Some(1);
        let burst = match crate::vars::raw(BURST_ENV)? {
            None => None,
            Some(_) => Some(crate::vars::uint(BURST_ENV, BURST_MAX as u64, 0, BURST_MAX as u64)? as u32),
        };
        let idle_sleep_ns = match crate::vars::raw(IDLE_SLEEP_ENV)? {
            None => None,
            Some(_) => Some(crate::vars::uint(IDLE_SLEEP_ENV, IDLE_SLEEP_NS as u64, 0, IDLE_SLEEP_MAX_NS as u64)? as u32),
        };
        Ok(SoftOptions {
            link,
            engine,
            engine_threads,
            engine_blocks,
            sys_scope,
            thread_copies,
            burst,
            idle_sleep_ns,
        })
    }

    /// Why these settings are unusable, if they are.
    pub fn check(&self) -> std::result::Result<(), String> {
        if let Some(t) = self.engine_threads {
            if !(32..=1024).contains(&t) || !t.is_multiple_of(32) {
                return Err(format!("engine_threads {t} is not a multiple of 32 in 32..=1024"));
            }
        }
        if let Some(b) = self.engine_blocks {
            if !(1..=MAX_ENGINE_BLOCKS as u32).contains(&b) {
                return Err(format!("engine_blocks {b} is not in 1..={MAX_ENGINE_BLOCKS}"));
            }
        }
        if let Some(b) = self.burst {
            if b > BURST_MAX {
                return Err(format!("engine_burst {b} is over {BURST_MAX} (WQEs of one burst)"));
            }
        }
        if let Some(s) = self.idle_sleep_ns {
            if s > IDLE_SLEEP_MAX_NS {
                return Err(format!("engine_idle_sleep_ns {s} is over {IDLE_SLEEP_MAX_NS} (1 ms)"));
            }
        }
        Ok(())
    }
}

/// What [`open`] needs to know of a world whose ranks run in several
/// processes.
#[derive(Clone, Debug)]
pub struct CrossProcess {
    /// This rank's symmetric heap, as this process addresses it.
    pub heap_base: u64,
    /// Bytes of every rank's heap (the same on all).
    pub heap_len: u64,
    /// Where the port tables start past a heap's base ([`TABLES_TAIL`]
    /// bytes there belong to the soft NIC).
    pub tables_offset: u64,
    /// Per rank: where this process maps that rank's heap allocation, for
    /// ranks of other processes; `None` for ranks of this process.
    pub mapped: Vec<Option<u64>>,
    /// Set when an engine whose tables lie in this heap's tail did not
    /// stop; [`open`] refuses while it is set.
    pub tail_in_use: Arc<AtomicBool>,
}

/// What [`open`] takes: the rank's place in the world.
pub struct SoftOpen<'a> {
    /// This rank.
    pub rank: usize,
    /// The device the kernels (and the engine kernel) run on.
    pub device: &'a Device,
    /// The world ([`open`] is collective over it in a world of one
    /// process: rank 0's fabric is handed to every rank).
    pub world: &'a World,
    /// The soft NIC's settings.
    pub options: SoftOptions,
    /// `Some` when a rank runs in another process.
    pub cross_process: Option<CrossProcess>,
    /// Whether every rank runs on one GPU (the engine's fences may then be
    /// `gpu`-scoped).
    pub same_gpu: bool,
}

/// Fabrics being handed from rank 0 to the other ranks of this process,
/// by a number only this process's ranks learn.
static FABRICS: Mutex<Option<HashMap<u64, SoftFabric>>> = Mutex::new(None);
static NEXT_FABRIC: AtomicU64 = AtomicU64::new(1);

/// A port of the soft NIC with its protection domain, and its engine once
/// started.
pub struct SoftNic {
    /// Stopped (by [`Nic::stop`] or the drop) before anything else goes.
    engine: Option<Engine>,
    pd: SoftPd,
    device: SoftDevice,
    fabric: SoftFabric,
    port: PortInfo,
    rank: usize,
    options: SoftOptions,
    engine_kind: SoftNicEngine,
    same_gpu: bool,
    cross: Option<CrossProcess>,
}

impl std::fmt::Debug for SoftNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftNic")
            .field("port", &self.port.name)
            .field("lid", &self.port.lid)
            .field("engine", &self.engine_kind)
            .finish()
    }
}

/// Opens this rank's soft NIC port: the fabric (rank 0's, handed to every
/// rank of a one-process world: collective then; or one of its own at the
/// rank's index across processes), the port with the link model, and a
/// protection domain. Refuses an engine that cannot run where it is asked
/// to (the host thread on a GPU or across processes).
pub fn open(ctx: SoftOpen<'_>) -> Result<SoftNic> {
    let rank = ctx.rank;
    ctx.options.check().map_err(|e| Error::comm(format!("IBGDA options: {e}")))?;
    let gpu = ctx.device.is_gpu();
    let cross = ctx.cross_process.is_some();
    if let Some(c) = &ctx.cross_process {
        if c.tail_in_use.load(Ordering::Acquire) {
            return Err(Error::comm(format!(
                "rank {rank}: IBGDA set-up: the soft NIC engine of an earlier set-up did not stop and may still use this \
                 rank's port tables; this communicator cannot set IBGDA up again (make a new one)"
            )));
        }
    }
    let engine_kind = ctx.options.engine.unwrap_or(if gpu || cross {
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
    if cross && engine_kind == SoftNicEngine::Thread {
        return Err(Error::comm(format!(
            "rank {rank}: {ENGINE_ENV}=thread: ranks of this world run in other processes, and a host-thread engine \
             executes WQEs of one process's fabric only; use {ENGINE_ENV}=kernel (the default in such a world)"
        )));
    }
    let (fabric, device) = if cross {
        let fabric = SoftFabric::new(FabricConfig {
            device_rings: true,
            ..FabricConfig::default()
        });
        let device = fabric.open_device_at(rank, ctx.options.link).map_err(softnic_err)?;
        (fabric, device)
    } else {
        let fabric = shared_fabric(rank, ctx.world)?;
        let device = fabric.open_device(ctx.options.link).map_err(softnic_err)?;
        (fabric, device)
    };
    let pd = device.alloc_pd().map_err(softnic_err)?;
    let port = PortInfo {
        name: format!("soft:{}", device.port_index()),
        lid: device.lid(),
        gid: [0; 16],
        gid_index: None,
        link_layer: LinkLayer::InfiniBand,
        active_mtu: SOFT_MTU,
    };
    Ok(SoftNic {
        engine: None,
        pd,
        device,
        fabric,
        port,
        rank,
        options: ctx.options,
        engine_kind,
        same_gpu: ctx.same_gpu,
        cross: ctx.cross_process,
    })
}

/// Collective over a world of one process: the fabric rank 0 makes,
/// handed to every rank.
fn shared_fabric(rank: usize, world: &World) -> Result<SoftFabric> {
    let id = if rank == 0 {
        let id = NEXT_FABRIC.fetch_add(1, Ordering::Relaxed) ^ ((std::process::id() as u64) << 40);
        // The rings are device memory (the emulator's is host memory, but
        // the set-up is the same): the caller initialises them.
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
    let ids = world.all_gather_bytes(&id.to_le_bytes())?;
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
    world.barrier()?;
    if rank == 0 {
        if let Some(m) = FABRICS.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            m.remove(&id);
        }
    }
    fabric.ok_or_else(|| Error::comm(format!("rank {rank}: rank 0's soft NIC fabric is not in this process")))
}

impl SoftNic {
    /// The soft NIC device of this port (fault injection, statistics, the
    /// error log).
    pub fn device(&self) -> &SoftDevice {
        &self.device
    }

    /// Where the engine runs (chosen at [`open`]).
    pub fn engine_kind(&self) -> SoftNicEngine {
        self.engine_kind
    }

    /// Where the running engine runs and what it has done (`None` before
    /// [`Nic::start`] and after [`Nic::stop`]; for the kernel engine,
    /// also when its control block cannot be read).
    pub fn engine_report(&self) -> Option<EngineReport> {
        match self.engine.as_ref()? {
            Engine::Thread(_) => Some(EngineReport {
                engine: SoftNicEngine::Thread,
                threads: 1,
                counters: EngineCounters::default(),
                blocks: Vec::new(),
            }),
            Engine::Kernel(k) => {
                let blocks = k.counters().ok()?;
                let mut counters = EngineCounters::default();
                for b in &blocks {
                    counters.add(b);
                }
                Some(EngineReport {
                    engine: SoftNicEngine::Kernel,
                    threads: k.threads,
                    counters,
                    blocks,
                })
            }
        }
    }

    /// What the running engine has seen and done (`None` before
    /// [`Nic::start`] and after [`Nic::stop`]). The kernel engine's record
    /// is read from mapped host memory with no driver call, so this
    /// answers while a kernel is stuck.
    pub fn progress(&self) -> Option<IbgdaProgress> {
        match self.engine.as_ref()? {
            Engine::Kernel(k) => Some(k.progress(self.rank)),
            Engine::Thread(_) => Some(IbgdaProgress::from_stats(
                self.rank,
                self.device.port_index() as u32,
                &self.device.stats(),
            )),
        }
    }
}

/// A registered region of the soft NIC.
struct SoftRegion(SoftMr);

impl MemoryRegion for SoftRegion {
    fn lkey(&self) -> u32 {
        doorbell_softnic::MemoryRegion::lkey(&self.0)
    }
    fn rkey(&self) -> u32 {
        doorbell_softnic::MemoryRegion::rkey(&self.0)
    }
}

/// A CQ of the soft NIC.
struct SoftCompletionQueue(SoftCq);

impl CompletionQueue for SoftCompletionQueue {
    fn cqn(&self) -> u32 {
        doorbell_softnic::CompletionQueue::cqn(&self.0)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A QP of the soft NIC.
struct SoftQueuePair {
    qp: SoftQp,
    lid: u16,
}

impl QueuePair for SoftQueuePair {
    fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint {
            lid: self.lid,
            gid: [0; 16],
            qpn: self.qp.qpn(),
            psn: 0,
            mtu: SOFT_MTU,
            slot: self.qp.slot() as u32,
        }
    }

    fn connect(&self, remote: &Endpoint, access: u32, opts: &QpOptions) -> Result<()> {
        if let Some(m) = opts.mtu {
            if !(256..=4096).contains(&m) || !m.is_power_of_two() {
                return Err(Error::comm(format!(
                    "soft NIC: QP {:#x}: path MTU {m} is not one of 256, 512, 1024, 2048, 4096",
                    self.qp.qpn()
                )));
            }
        }
        let ep = doorbell_softnic::QpEndpoint {
            lid: remote.lid,
            qpn: remote.qpn,
        };
        self.qp.connect_remote(ep, remote.slot as usize, access).map_err(softnic_err)
    }

    fn modify_to_err(&self) -> Result<()> {
        self.qp.modify_to_err().map_err(softnic_err)
    }

    fn doorbell(&self) -> u64 {
        self.qp.rings().uar as u64
    }

    fn host_doorbell(&self) -> u64 {
        self.qp.rings().uar as u64
    }
}

impl Nic for SoftNic {
    fn kind(&self) -> NicKind {
        NicKind::Soft
    }

    /// The engine kernel runs on the kernels' GPU (on a GPU the thread
    /// engine is refused); `DOORBELL_SOFTNIC_SCOPE=sys` keeps the kernels'
    /// side at system scope too.
    fn on_the_kernels_gpu(&self) -> bool {
        !self.options.sys_scope
    }

    /// A port's QP and CQ tables' slots (the port is this transport's own).
    fn max_qps(&self) -> Option<usize> {
        Some(doorbell_softnic::engine::tables::MAX_QPS.min(doorbell_softnic::engine::tables::MAX_CQS))
    }

    fn port(&self) -> &PortInfo {
        &self.port
    }

    fn describe(&self) -> String {
        format!(
            "the soft NIC: port {} (LID {}) of {}, link {:?}, engine {:?}; regions in the port's table, doorbells rung by \
             the GPU at UAR words in the caller's ring memory",
            self.device.port_index(),
            self.port.lid,
            if self.cross.is_some() {
                "this rank's own fabric"
            } else {
                "this process's fabric"
            },
            self.options.link,
            self.engine_kind
        )
    }

    unsafe fn reg_mr(&self, addr: u64, len: usize, access: u32) -> Result<Box<dyn MemoryRegion>> {
        // SAFETY: the caller's contract (the trait's): the memory outlives
        // the region.
        let mr = unsafe { self.device.reg_mr(&self.pd, addr as *mut u8, len, access) }.map_err(softnic_err)?;
        Ok(Box::new(SoftRegion(mr)))
    }

    unsafe fn create_cq(&self, ring: CqRing) -> Result<Box<dyn CompletionQueue>> {
        // SAFETY: the caller's contract (the trait's).
        let cq = unsafe { self.device.create_cq(ring) }.map_err(softnic_err)?;
        Ok(Box::new(SoftCompletionQueue(cq)))
    }

    unsafe fn create_qp(&self, cq: &dyn CompletionQueue, rings: QpRings) -> Result<Box<dyn QueuePair>> {
        let cq = cq
            .as_any()
            .downcast_ref::<SoftCompletionQueue>()
            .ok_or_else(|| Error::comm("soft NIC: create_qp was given a CQ of another NIC"))?;
        // SAFETY: the caller's contract (the trait's).
        let qp = unsafe { self.device.create_qp(&self.pd, &cq.0, &cq.0, rings) }.map_err(softnic_err)?;
        Ok(Box::new(SoftQueuePair { qp, lid: self.port.lid }))
    }

    fn start(&mut self, ctx: &StartCtx<'_>) -> Result<()> {
        if self.engine.is_some() {
            return Err(Error::comm(format!("rank {}: the soft NIC's engine is already running", self.rank)));
        }
        // The engine's trace events go where the heap header says (no
        // event at all while the rank does not trace).
        self.device.trace_heap(ctx.heap_base).map_err(softnic_err)?;
        let engine = match self.engine_kind {
            SoftNicEngine::Thread => {
                let table = port::read_qp_table(ctx.device, ctx.kernel_qps, ctx.nqps)?;
                port::check_ring_addresses(self.rank, &self.device.port_image(), &table)?;
                Engine::Thread(self.device.spawn_engine())
            }
            SoftNicEngine::Kernel => Engine::Kernel(engine::launch(self, ctx)?),
        };
        self.engine = Some(engine);
        Ok(())
    }

    fn stop(&mut self) -> std::result::Result<(), String> {
        match self.engine.take() {
            Some(Engine::Kernel(k)) => match k.stop(self.rank) {
                Ok(()) => {
                    self.device.set_resident(None);
                    Ok(())
                }
                Err(failed) => {
                    let (k, why) = *failed;
                    // It may still touch its tables, the rings and the
                    // scratch: its own memory (and stream) stays allocated,
                    // and so must the caller's.
                    std::mem::forget(k);
                    if let Some(c) = &self.cross {
                        c.tail_in_use.store(true, Ordering::Release);
                    }
                    Err(format!(
                        "the soft NIC engine kernel of port LID {} did not stop within {} s ({why})",
                        self.port.lid,
                        ENGINE_WAIT.as_secs()
                    ))
                }
            },
            Some(Engine::Thread(t)) => {
                drop(t);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for SoftNic {
    fn drop(&mut self) {
        if let Err(why) = self.stop() {
            tracing::error!("rank {}: {why}; its memory is leaked", self.rank);
        }
    }
}

fn softnic_err(e: doorbell_softnic::Error) -> Error {
    Error::comm(format!("soft NIC: {e}"))
}
