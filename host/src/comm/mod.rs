//! The communicator: a world of ranks, a symmetric heap on each, and the
//! device handle of the P2P transport.
//!
//! ```no_run
//! use doorbell::{Backend, comm::{Communicator, CommOptions}};
//! # fn main() -> doorbell::Result<()> {
//! // Four ranks as threads of this process, on GPU 0 (or the emulator).
//! let sums = Communicator::local(4, Backend::Auto, CommOptions::default(), |comm| {
//!     let buf = comm.alloc::<u64>(1024)?;          // collective: same offset everywhere
//!     let t = comm.p2p();                          // device handle, a kernel argument
//!     // ... launch kernels taking `t` and `buf.as_mut_ptr()` ...
//!     # let _ = (buf, t);
//!     Ok(comm.rank())
//! })?;
//! # Ok(()) }
//! ```
//!
//! ## How peers are reached
//! | peers | GPU | CPU emulator |
//! |---|---|---|
//! | threads of one process | same address space (one GPU), or peer access between GPUs | same address space |
//! | processes of one host | CUDA virtual memory: the heap's parts handed over a Unix socket as file descriptors, the soft NIC tables past their inboxes mapped read-only ([`Communicator::peer_mapping`]); legacy CUDA IPC where that cannot be used | shared memory files in `/dev/shm` (the tables read-only likewise) |
//! | other hosts | only through the NIC (the IBGDA or routed transport) | same |
//!
//! [`Communicator::describe_peers`] says which route each peer takes.
//!
//! ## Self-test
//! A communicator tests its routes when it forms: every rank puts a small
//! message, different for each (sender, receiver, route, run), to every
//! peer over P2P with the transport's own puts and signals (a library
//! kernel), waits for every peer's (bounded by [`CommOptions::wait_timeout`])
//! and checks it; the IBGDA route is tested the same way when
//! [`Communicator::ibgda`] (or [`Communicator::routed`]) sets it up. A
//! message that does not arrive as sent fails [`Communicator::new`] (or that
//! set-up) on every rank with [`Error::SelfTest`], naming the sender, the
//! receiver, the route, what arrived and what was expected, before any user
//! kernel runs. [`Communicator::self_test`] runs it again on demand;
//! `DOORBELL_SELF_TEST=0` or [`CommOptions::self_test`] turns the automatic
//! runs off. On the CPU emulator it adds well under a millisecond to
//! forming a communicator of 2 or 4 thread ranks (docs/comm.md has the
//! figures and the command).
//!
//! ## Symmetric allocation
//! [`Communicator::alloc`] is collective: every rank must allocate the same
//! sizes in the same order. Each allocation is checked across ranks; a rank
//! that asks for something else gets an error naming the rank and the field.
//! A buffer's space is taken back once every rank has dropped it: the next
//! allocation frees it, after each rank's device has finished its work.
//! Dropping a communicator is collective too: it waits for this rank's device
//! and then for every rank, so no peer still uses the heap when it is freed.
//!
//! ## Errors from kernels
//! Device-side waits are bounded ([`CommOptions::wait_timeout`],
//! `DOORBELL_WAIT_TIMEOUT_S`). A wait that runs out records which rank,
//! which operation, the value expected and the value seen;
//! [`Communicator::check`] (and [`Communicator::synchronize`]) turns that
//! record into [`Error::WaitTimeout`]; a transport call refused for a bad
//! argument (a peer outside the world, a range outside the heap, a misaligned
//! signal word) becomes [`Error::DeviceCall`] naming rank, call, peer and offset.
//!
//! A timed-out wait also says **who is stuck**: before returning it,
//! `check` reads every rank's state (its last communicator step, what its
//! device handle launched and what its last synchronize covered, its own
//! timed-out wait) and follows the peer each wait names, down to a rank
//! that is not running a kernel, runs one without a timed-out wait, or
//! exited; the chain is in the error's `stuck` field ([`StuckRanks`]) and
//! its message. Thread worlds share the states; process worlds read them
//! from a status responder each rank runs (see `docs/comm.md`).

use std::sync::Mutex;
use std::time::Duration;

use doorbell_kernels::heap::{EPOCH_OFFSET, FAILURES_OFFSET, HEAP_RESERVED, MAX_RANKS};
use doorbell_kernels::transport::p2p::NEAR_PEERS;
use doorbell_kernels::transport::P2p;

use crate::device::{Backend, Device};
use crate::error::{Error, Result};
use crate::family::AnyTransport;
use crate::family::TransportKind;
use crate::memory::{DeviceBuffer, DeviceCopy};
use crate::stream::Stream;
use crate::world::World;

mod alloc;
mod fdpass;
mod ibgda;
mod proxy;
mod reports;
mod rings;
mod selftest;
mod setup;
mod shm;
mod stuck;
mod trace;

pub use crate::error::StuckRanks;
pub use crate::nic::soft::{
    EngineCounters, EnginePhase, EngineReport, IbgdaProgress, SoftNicEngine, ENGINE_THREADS_GPU, SOFTNIC, SOFTNIC_PTX,
};
pub use ibgda::{IbgdaOptions, IbgdaQueue, RdmaPeers};
pub use proxy::{ProxyStats, RING_SLOTS as PROXY_RING_SLOTS};
pub use rings::{RingShape, Rings};
#[doc(hidden)]
pub use selftest::RouteFault;
pub use selftest::{SelfTestReport, SelfTestRoute, SELF_TEST_ENV};
pub use setup::{route_to, PeerMapping, PeerPlace, PeerRoute, HEAP_PARTS_ENV};
use setup::{Heap, Mapping};
pub use stuck::STUCK_MARGIN;

/// Communicator settings.
///
/// [`CommOptions::default`] is the built-in defaults and reads no
/// environment; [`CommOptions::from_env`] applies `DOORBELL_WAIT_TIMEOUT_S`,
/// `DOORBELL_RANK_PER_GPU` and `DOORBELL_SELF_TEST` on top, strictly (a bad
/// value is an error).
#[derive(Clone, Debug)]
pub struct CommOptions {
    /// Usable symmetric heap per rank, bytes (the runtime adds its header).
    pub heap_bytes: u64,
    /// Budget of every device-side wait (default 10 s; `DOORBELL_WAIT_TIMEOUT_S`
    /// with [`from_env`](Self::from_env)).
    pub wait_timeout: Duration,
    /// Thread worlds on a GPU machine: put rank `r` on GPU `r % gpus`
    /// instead of every rank on GPU 0 (default off; `DOORBELL_RANK_PER_GPU=1`
    /// with [`from_env`](Self::from_env)).
    pub spread_gpus: bool,
    /// Trace the kernels of every rank ([`crate::trace`]; default off;
    /// `DOORBELL_TRACE=<dir>` with [`from_env`](Self::from_env)).
    pub trace: Option<crate::trace::TraceOptions>,
    /// The self-test when the communicator forms, and when it sets up
    /// IBGDA ([`Communicator::self_test`]): `None` (the default) leaves it
    /// to `DOORBELL_SELF_TEST` (`0` off; `1` or unset on), `Some(on)`
    /// decides here. Every rank must agree.
    pub self_test: Option<bool>,
    /// Fault injection, for tests only ([`RouteFault`]).
    #[doc(hidden)]
    pub route_fault: Option<RouteFault>,
}

/// `DOORBELL_RANK_PER_GPU`: `1` puts thread rank `r` on GPU `r % gpus`
/// ([`CommOptions::spread_gpus`]).
pub const RANK_PER_GPU_ENV: &str = "DOORBELL_RANK_PER_GPU";
/// The name [`RANK_PER_GPU_ENV`] had before, still read (with a warning)
/// for one release when the new one is unset.
pub const RANK_PER_GPU_ENV_OLD: &str = "DOORBELL_SPREAD_GPUS";

/// Default of [`CommOptions::wait_timeout`].
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for CommOptions {
    /// The built-in defaults: 64 MiB heap, 10 s waits, no spreading. Reads
    /// no environment (use [`CommOptions::from_env`] for that).
    fn default() -> Self {
        CommOptions {
            heap_bytes: 64 << 20,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            spread_gpus: false,
            trace: None,
            self_test: None,
            route_fault: None,
        }
    }
}

impl CommOptions {
    /// The defaults with `DOORBELL_WAIT_TIMEOUT_S` (seconds in
    /// 0.001..=86400), `DOORBELL_RANK_PER_GPU` (`0` or `1`; its former name
    /// `DOORBELL_SPREAD_GPUS` is still read, with a warning, when it is
    /// unset) and `DOORBELL_SELF_TEST` (`0` or `1`) applied; an
    /// unusable value is [`Error::BadEnv`] naming the variable and the range.
    pub fn from_env() -> Result<CommOptions> {
        Ok(CommOptions {
            wait_timeout: crate::vars::secs("DOORBELL_WAIT_TIMEOUT_S", DEFAULT_WAIT_TIMEOUT, 0.001, 86400.0)?,
            spread_gpus: crate::vars::flag_renamed(RANK_PER_GPU_ENV, RANK_PER_GPU_ENV_OLD, false)?,
            trace: crate::trace::options_from_env()?,
            self_test: Some(crate::vars::flag(SELF_TEST_ENV, true)?),
            ..CommOptions::default()
        })
    }
}

/// Ranks on one GPU from which each rank keeps one launch that waits for
/// peers in flight ([`Communicator::launch_waiting`]): with 3 and 4 thread
/// ranks on one H200, launches queued back to back stopped the all-reduce
/// benchmark in nearly every run, and one at a time passed every run; two
/// ranks, which once ran queued launches in every run, later stopped the
/// benchmark with a producer (`--compute gemv`) in 5 of 5 runs with them.
pub const ONE_LAUNCH_IN_FLIGHT_FROM: usize = 2;

/// Whether ranks on a GPU (`gpu`) shared by `ranks_per_gpu` ranks keep one
/// launch that waits for peers in flight each
/// ([`Communicator::one_launch_in_flight`], for programs that decide before
/// a communicator exists).
pub fn one_launch_in_flight(gpu: bool, ranks_per_gpu: usize) -> bool {
    gpu && ranks_per_gpu >= ONE_LAUNCH_IN_FLIGHT_FROM
}

/// One rank's communicator. Created collectively by every rank.
pub struct Communicator {
    world: World,
    device: Device,
    rank: usize,
    size: usize,
    heap_base: u64,
    heap_len: u64,
    routes: Vec<PeerRoute>,
    bases: Vec<u64>,
    peer_table: DeviceBuffer<u64>,
    heap_map: Mutex<alloc::HeapMap>,
    budget_ns: u64,
    same_gpu: bool,
    /// The most ranks of this world on one GPU (every rank computes the
    /// same number from the gathered device ids).
    ranks_per_gpu: usize,
    /// The first device-side failure this rank saw: its drop then aborts
    /// the world instead of waiting for every rank.
    failure: Mutex<Option<String>>,
    /// The CPU proxy's thread and NIC resources, once set up (`proxy.rs`);
    /// dropped before the heap they name.
    proxy: Mutex<Option<proxy::ProxyState>>,
    /// The IBGDA transport's resources, once set up (`ibgda.rs`); dropped
    /// before the heap they name.
    ibgda: Mutex<Option<ibgda::IbgdaState>>,
    /// Bumped each time IBGDA's or the proxy's NIC state is torn down:
    /// handles made before point at freed rings ([`Self::nic_generation`]).
    nic_generation: std::sync::atomic::AtomicU64,
    /// [`Communicator::failures_met`].
    failures_met: std::sync::atomic::AtomicU64,
    /// Set when a soft NIC engine that used the heap's table tail did not
    /// stop (its tables are still in use: no later set-up may reuse them).
    softnic_tail_leaked: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The library's kernels ([`crate::KERNELS_PTX`]), loaded once: the
    /// collectives take their entry points from it, so none loads a module
    /// while the soft NIC's engine kernel runs.
    library: std::sync::OnceLock<crate::Module>,
    /// The end of this rank's last launch that waits for peers, while
    /// [`ONE_LAUNCH_IN_FLIGHT_FROM`] or more ranks share a GPU
    /// ([`Communicator::launch_waiting`]).
    in_flight: Mutex<Option<crate::stream::Event>>,
    /// What this rank is doing, as peers read it when a wait runs out
    /// (`stuck.rs`).
    status: std::sync::Arc<stuck::Status>,
    /// The start-up self-test's setting and last report (`selftest.rs`).
    self_test: selftest::SelfTestState,
    // Drop order: mappings of peers before our own heap.
    _mappings: Vec<Mapping>,
    /// [`Self::peer_mapping`] of each peer.
    peer_mappings: Vec<Option<PeerMapping>>,
    _heap: Option<Heap>,
    /// Set by [`Communicator::local`] once every rank's device is idle:
    /// no peer can write into this heap any more, so the drop may free it
    /// even when the world broke.
    quiesced: bool,
    /// The device trace, while this rank traces ([`crate::trace`]).
    trace: Mutex<Option<trace::Tracer>>,
}

impl Communicator {
    /// Collective: forms the communicator of `world` on `device`, then runs
    /// the self-test of its P2P route ([`Self::self_test`]) unless
    /// [`CommOptions::self_test`] or `DOORBELL_SELF_TEST=0` turns it off: a
    /// route that does not deliver is [`Error::SelfTest`] here, before any
    /// user kernel runs.
    pub fn new(world: World, device: Device, opts: CommOptions) -> Result<Communicator> {
        let rank = world.rank();
        let size = world.world_size();
        if size as u32 > MAX_RANKS {
            return Err(Error::comm(format!("{size} ranks; the P2P transport supports at most {MAX_RANKS}")));
        }
        let heap_len = opts
            .heap_bytes
            .div_ceil(256)
            .checked_mul(256)
            .and_then(|b| b.checked_add(HEAP_RESERVED))
            .filter(|&b| usize::try_from(b).is_ok())
            .ok_or_else(|| Error::comm(format!("a symmetric heap of {} bytes cannot be allocated", opts.heap_bytes)))?;
        world.check_same("heap size", &heap_len.to_le_bytes())?;
        world.check_same("backend", if device.is_gpu() { b"gpu" } else { b"cpu" })?;
        let self_test = match opts.self_test {
            Some(on) => on,
            None => crate::vars::flag(SELF_TEST_ENV, true)?,
        };

        let place = setup::locate(&world, &device)?;
        let setup::Allocated {
            heap,
            base: heap_base,
            alloc_len,
            handles,
            server: fd_server,
        } = setup::allocate_heap(&world, &device, heap_len, &place)?;
        let setup::Mapped {
            mut bases,
            routes,
            mappings,
            layouts: peer_mappings,
        } = setup::map_peers(&device, rank, &place, &handles, (heap_base, heap_len, alloc_len))?;
        for (p, b) in bases.iter_mut().enumerate().filter(|(_, b)| **b != 0) {
            *b = b.wrapping_add(RouteFault::skew(opts.route_fault, rank, p, SelfTestRoute::P2p));
        }
        let setup::Located { me, ids, heap_files, .. } = place;
        // Everyone has mapped everyone: the heap files can go (on an
        // earlier error, `heap_files` went when it was dropped).
        world.barrier()?;
        drop(heap_files);
        drop(fd_server);
        let status = std::sync::Arc::new(stuck::Status::new(device.activity().clone()));
        let source = status.clone();
        world.serve_status(std::sync::Arc::new(move || source.encode()))?;
        world.check_same("self-test setting (CommOptions::self_test, DOORBELL_SELF_TEST)", &[self_test as u8])?;
        for (p, route) in routes.iter().enumerate().filter(|(p, _)| *p != rank) {
            tracing::info!("rank {rank}: route to rank {p}: {route:?} (heap of {heap_len} bytes)");
        }
        let peer_table = device.alloc_from(&bases)?;
        let same_gpu = device.is_gpu() && !me.uuid.is_empty() && ids.iter().all(|i| i.uuid == me.uuid);
        let ranks_per_gpu = if device.is_gpu() {
            ids.iter()
                .map(|i| ids.iter().filter(|j| j.uuid == i.uuid).count())
                .max()
                .unwrap_or(1)
        } else {
            size
        };
        if opts.trace.is_some() {
            // Before the self-test loads the library's kernels: with
            // tracing asked for, every module takes its traced image.
            crate::image::request_tracing();
        }
        let comm = Communicator {
            world,
            device,
            rank,
            size,
            heap_base,
            heap_len,
            routes,
            bases,
            peer_table,
            heap_map: Mutex::new(alloc::HeapMap::new(heap_len)),
            failure: Mutex::new(None),
            budget_ns: opts.wait_timeout.as_nanos().min(u64::MAX as u128) as u64,
            same_gpu,
            ranks_per_gpu,
            proxy: Mutex::new(None),
            ibgda: Mutex::new(None),
            nic_generation: std::sync::atomic::AtomicU64::new(0),
            failures_met: std::sync::atomic::AtomicU64::new(0),
            softnic_tail_leaked: Default::default(),
            library: std::sync::OnceLock::new(),
            in_flight: Mutex::new(None),
            status,
            self_test: selftest::SelfTestState::new(self_test, opts.route_fault),
            _mappings: mappings,
            peer_mappings,
            _heap: Some(heap),
            quiesced: false,
            trace: Mutex::new(None),
        };
        if self_test {
            match comm.self_test() {
                Ok(_) => {}
                // Every rank has the same verdict: the drop's barrier meets.
                Err(e @ Error::SelfTest { .. }) => return Err(e),
                Err(e) => {
                    comm.abort(&format!("its self-test failed: {e}"));
                    return Err(e);
                }
            }
        }
        // After the self-test: the trace shows the user's kernels.
        if let Some(t) = opts.trace {
            comm.trace_start(t)?;
        }
        Ok(comm)
    }

    /// Runs `f` on `n` ranks, each a thread of this process with its own
    /// communicator, on `backend` (GPU 0 for every rank, or one GPU per rank
    /// with `spread_gpus`). Returns each rank's result, in rank order; the
    /// first error any rank hit otherwise.
    pub fn local<R: Send>(n: usize, backend: Backend, opts: CommOptions, f: impl Fn(&Communicator) -> Result<R> + Sync) -> Result<Vec<R>> {
        let worlds = World::local_threads(n);
        let backend = match backend {
            Backend::Auto if crate::device::gpu_count() > 0 => Backend::Gpu,
            Backend::Auto => Backend::Cpu,
            b => b,
        };
        let gpus = if backend == Backend::Gpu {
            crate::device::gpu_count().max(1)
        } else {
            1
        };
        // No rank frees its heap until every rank's kernels, which may
        // write into it, have stopped: each waits for its own device, then
        // for the others (a rank's thread that ends early counts as arrived).
        let gate = Quiesce::new(n);
        let results: Vec<Result<R>> = std::thread::scope(|s| {
            let handles: Vec<_> = worlds
                .into_iter()
                .enumerate()
                .map(|(r, w)| {
                    let (f, gate) = (&f, &gate);
                    let opts = opts.clone();
                    s.spawn(move || -> Result<R> {
                        let arrival = gate.arrival();
                        let ordinal = if opts.spread_gpus { r % gpus } else { 0 };
                        let dev = match backend {
                            Backend::Gpu => Device::gpu(ordinal)?,
                            _ => Device::emulator(r),
                        };
                        let mut comm = Communicator::new(w, dev, opts)?;
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&comm)));
                        comm.status.set(stuck::Step::Returned {
                            ok: matches!(r, Ok(Ok(_))),
                        });
                        match &r {
                            Ok(Err(e)) => comm.abort(&e.to_string()),
                            Err(_) => comm.abort("it panicked"),
                            // Every rank that traces writes the one trace of the world
                            // (a rank that failed leaves its own file at drop instead).
                            Ok(Ok(_)) if comm.tracing() => {
                                if let Err(e) = comm.trace_write() {
                                    tracing::warn!("rank {}: the world's trace was not written: {e}", comm.rank);
                                }
                            }
                            Ok(Ok(_)) => {}
                        }
                        comm.device.wait_idle();
                        arrival.wait_for_all();
                        comm.quiesced = true;
                        drop(comm);
                        r.unwrap_or_else(|p| std::panic::resume_unwind(p))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::comm("a rank's thread panicked"))))
                .collect()
        });
        results.into_iter().collect()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.size
    }
    /// The device this rank runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The world (host-side collectives).
    pub fn world(&self) -> &World {
        &self.world
    }
    /// Bytes of each rank's symmetric heap, the runtime's header
    /// ([`doorbell_kernels::heap::HEAP_RESERVED`] bytes) included: a range at
    /// offset `o` of `b` bytes is valid for transport calls when
    /// `HEAP_RESERVED <= o` and `o + b <= heap_bytes()`.
    pub fn heap_bytes(&self) -> u64 {
        self.heap_len
    }
    /// The most ranks of this world that share one GPU (1 when every rank
    /// has its own; the world's size on the emulator). The same on every
    /// rank, so plans made from it agree.
    pub fn ranks_per_gpu(&self) -> usize {
        self.ranks_per_gpu
    }

    /// Whether this rank's launches that wait for peers go one at a time
    /// ([`Self::launch_waiting`]): on a GPU shared by
    /// [`ONE_LAUNCH_IN_FLIGHT_FROM`] or more ranks of the world.
    pub fn one_launch_in_flight(&self) -> bool {
        one_launch_in_flight(self.device.is_gpu(), self.ranks_per_gpu)
    }

    /// Runs `launch` (which enqueues one kernel that waits for peers on
    /// `stream`). Where [`Self::one_launch_in_flight`], it first waits on
    /// the host until this rank's previous such launch has ended, and
    /// records this one's end: a launch queued behind a rank's own waiting
    /// kernel can hold a peer's kernel in the GPU's hardware queues, and
    /// the peers then wait for each other until their budgets run out
    /// (README, "Ranks sharing a GPU"). A stream being captured into a CUDA
    /// graph is not waited for (nothing runs during capture): keep such a
    /// graph to one waiting launch per replay, and wait for each replay;
    /// and capture in `CU_STREAM_CAPTURE_MODE_RELAXED` (or thread-local)
    /// mode, since the wait here is a `cuEventSynchronize` that a global
    /// capture on another rank's thread would forbid. The collectives'
    /// plain launches go through here (`AllReduce::run`); launch your own
    /// waiting kernels through it too (a launch inside `launch` that goes
    /// through it as well is not waited for twice).
    pub fn launch_waiting(&self, stream: &Stream, launch: impl FnOnce() -> Result<()>) -> Result<()> {
        if !self.one_launch_in_flight() || stream.is_capturing()? {
            return launch();
        }
        // Not held while `launch` runs: it may come back here.
        let prev = self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(prev) = prev {
            prev.synchronize()?;
        }
        launch()?;
        *self.in_flight.lock().unwrap_or_else(|p| p.into_inner()) = Some(stream.record()?);
        Ok(())
    }

    /// How each peer is reached.
    pub fn describe_peers(&self) -> &[PeerRoute] {
        &self.routes
    }

    /// How this process maps `peer`'s heap allocation, where `peer` is
    /// another process of this host ([`PeerRoute::CudaIpc`],
    /// [`PeerRoute::SharedMemory`]); `None` for any other peer. The part a
    /// peer may only read holds that peer's soft NIC port tables.
    pub fn peer_mapping(&self, peer: usize) -> Option<PeerMapping> {
        self.peer_mappings.get(peer).copied().flatten()
    }

    /// The address of `peer`'s copy of a symmetric location, as this rank's
    /// GPU sees it (a device address: for kernels and driver copies, not for
    /// the host). `local` must lie in this rank's heap.
    pub fn peer_address<T>(&self, local: *const T, peer: usize) -> Result<*mut T> {
        let off = (local as u64).wrapping_sub(self.heap_base);
        if off >= self.heap_len || peer >= self.size {
            return Err(Error::comm(format!(
                "{local:p} is not in rank {}'s symmetric heap, or rank {peer} does not exist",
                self.rank
            )));
        }
        if self.routes[peer] == PeerRoute::Remote {
            return Err(Error::PeerUnreachable {
                rank: self.rank,
                peer,
                reason: "it runs on another host: its heap has no address here (reach it through the NIC)".to_string(),
            });
        }
        Ok((self.bases[peer] + off) as *mut T)
    }

    /// The budget of every device-side wait, in nanoseconds
    /// ([`CommOptions::wait_timeout`]), as the transport handles carry it.
    pub fn wait_budget_ns(&self) -> u64 {
        self.budget_ns
    }

    /// The P2P transport's device handle (a kernel argument). An error
    /// ([`Error::PeerUnreachable`]) in a world spanning hosts, where
    /// load/store cannot reach every peer.
    pub fn p2p(&self) -> Result<P2p> {
        if let Some(p) = self.routes.iter().position(|r| *r == PeerRoute::Remote) {
            return Err(Error::PeerUnreachable {
                rank: self.rank,
                peer: p,
                reason: format!(
                    "it runs on another host ({:?}), which load/store cannot reach; use the NIC: `Communicator::ibgda` \
                     (every peer through it) or `Communicator::routed` (load/store where it reaches, the NIC elsewhere)",
                    self.world.peers()[p].hostname
                ),
            });
        }
        Ok(self.p2p_handle())
    }

    /// The device handle of transport `kind`, chosen at run time (a
    /// `--transport` flag, a config): [`Self::p2p`], [`Self::ibgda`] or
    /// [`Self::routed`], with their errors; IBGDA and routed set the
    /// transport up on first use (collective). Launch a kernel family with
    /// it through [`Stream::launch_family`].
    pub fn transport(&self, kind: TransportKind) -> Result<AnyTransport> {
        Ok(match kind {
            TransportKind::P2p => self.p2p()?.into(),
            TransportKind::Ibgda => self.ibgda()?.into(),
            TransportKind::Routed => self.routed()?.into(),
            TransportKind::Proxy => self.proxy()?.into(),
        })
    }

    /// The P2P handle whatever the routes (a remote peer's base is 0):
    /// for the routed transport, which sends remote peers through the NIC.
    pub(crate) fn p2p_handle(&self) -> P2p {
        let mut near = [0u64; NEAR_PEERS];
        for (n, b) in near.iter_mut().zip(&self.bases) {
            *n = *b;
        }
        P2p {
            rank: self.rank as u32,
            world: self.size as u32,
            heap_bytes: self.heap_len,
            local_base: self.heap_base,
            budget_ns: self.budget_ns,
            same_gpu: self.same_gpu as u32,
            // Tracing now: the handle's hooks look for the rings (a handle
            // made before `trace_start` records nothing).
            trace: self.tracing() as u32,
            peers: self.peer_table.as_ptr(),
            near,
        }
    }

    /// The library's kernels ([`crate::KERNELS`]) on this rank's
    /// device, loaded on first use and kept.
    pub fn library_module(&self) -> Result<&crate::Module> {
        if let Some(m) = self.library.get() {
            return Ok(m);
        }
        let m = self.device.load_module(&crate::KERNELS)?;
        let _ = self.library.set(m);
        Ok(self.library.get().expect("set above"))
    }

    /// Loads `ptx` on this rank's device, then waits until every rank has
    /// loaded it (collective). The driver compiles PTX at its first load —
    /// tens of seconds for a large module — and a kernel that waits on its
    /// peers must not start while a peer is still compiling, or its bounded
    /// waits run out: load modules of communicating kernels through this.
    pub fn load_module<'a>(&self, src: impl Into<crate::ModuleSource<'a>>) -> Result<crate::Module> {
        let m = self.device.load_module(src)?;
        let _step = self.status.enter(stuck::Step::Collective("load_module"));
        self.world.barrier()?;
        Ok(m)
    }

    /// How many times IBGDA's or the CPU proxy's NIC state has been torn
    /// down on this rank (`ibgda_close`, `ibgda_reset`, `proxy_reset`, a
    /// set-up that failed its self-test). A handle of those transports
    /// made at another generation points at freed rings; the library's
    /// collectives check it before each launch.
    pub fn nic_generation(&self) -> u64 {
        self.nic_generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How many times the ranks met in [`Self::barrier`] after a failed
    /// synchronize on some rank (every rank counts the same). A launch
    /// that failed on one rank may have completed on another, so a
    /// collective made before such a failure may hold launch counts and
    /// signal words that differ between ranks, and its next launch could
    /// pass a wait early and read stale data: the library's all-reduce
    /// checks it before each launch and refuses.
    pub fn failures_met(&self) -> u64 {
        self.failures_met.load(std::sync::atomic::Ordering::Acquire)
    }

    /// An error when `made_at` (a [`Self::failures_met`]) is not the
    /// current count: `what` was made before a failure the ranks met on.
    pub(crate) fn check_no_failure_since(&self, made_at: u64, what: &str) -> Result<()> {
        if self.failures_met() == made_at {
            return Ok(());
        }
        Err(Error::comm(format!(
            "rank {}: {what} was made before a launch failed on some rank (met in the barrier after it): its launch \
             counts and signal words may differ between ranks, so its next launch could read stale data: make a new one",
            self.rank
        )))
    }

    /// Notes a teardown of a NIC transport's state ([`Self::nic_generation`]).
    pub(crate) fn nic_torn_down(&self) {
        self.nic_generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// An error when `made_at` (a [`Self::nic_generation`]) is not the
    /// current generation: `what` was made with a NIC transport's handle
    /// that has been torn down since.
    pub(crate) fn check_nic_generation(&self, made_at: u64, what: &str) -> Result<()> {
        let now = self.nic_generation();
        if now == made_at {
            return Ok(());
        }
        Err(Error::comm(format!(
            "rank {}: {what} was made with a NIC transport's handle that has been torn down since \
             (ibgda_close, ibgda_reset or proxy_reset); its rings are freed: make a new one",
            self.rank
        )))
    }

    /// Host-side barrier across ranks. A rank that saw a device error and
    /// then completes a barrier with every other rank has handled it: its
    /// drop waits for the others again instead of aborting the world.
    ///
    /// When any rank saw such an error (its [`synchronize`](Self::synchronize)
    /// failed), the barrier also brings the device barriers' counts back
    /// together: a device barrier that some ranks ran and others did not
    /// (one timed out waiting for a rank that never came) leaves the
    /// ranks' counts apart, and every later device barrier would then pass
    /// early on some ranks and time out on the others. Call it, as after
    /// any failed synchronize, when no kernel of any rank runs.
    pub fn barrier(&self) -> Result<()> {
        let _step = self.status.enter(stuck::Step::Barrier);
        let failed = self.failure.lock().unwrap_or_else(|p| p.into_inner()).is_some();
        let all = self.world.all_gather_bytes(&[failed as u8])?;
        if all.iter().any(|b| b.first() == Some(&1)) {
            let met = self.failures_met.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
            // The count the all-reduce's kernels compare their arguments'
            // with (launches and graph replays of arguments made before).
            // SAFETY: the failures word of this rank's heap header; no
            // kernel of this rank runs (the contract above).
            let noted = unsafe { self.device.write_raw(self.heap_base + FAILURES_OFFSET, &met.to_le_bytes()) };
            // Its world barrier puts every rank's word in place before any
            // rank launches again.
            self.align_barrier_counts()?;
            noted?;
        }
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(())
    }

    /// Sets every rank's device barrier count (the heap header's epoch
    /// word) to the largest (collective). Every count a peer signaled is
    /// at most its own, so the next device barrier waits for a value no
    /// rank has signaled yet, on every rank.
    fn align_barrier_counts(&self) -> Result<()> {
        let at = self.heap_base + EPOCH_OFFSET;
        let mut word = [0u8; 8];
        // SAFETY: the epoch word of this rank's heap header.
        let read = unsafe { self.device.read_raw(at, &mut word) };
        // A rank that cannot read its word still takes part in both
        // collectives (u64::MAX: none), so the others do not wait for it.
        let mine = read.as_ref().map_or(u64::MAX, |()| u64::from_le_bytes(word));
        let all = self.world.all_gather_bytes(&mine.to_le_bytes())?;
        let counts = all.iter().filter_map(|b| Some(u64::from_le_bytes(b.as_slice().try_into().ok()?)));
        let top = counts.filter(|&c| c != u64::MAX).max().unwrap_or(mine);
        let written = if read.is_ok() && top != mine {
            tracing::debug!(
                rank = self.rank,
                from = mine,
                to = top,
                "device barrier count aligned after a failure"
            );
            // SAFETY: as above; no kernel of this rank runs (the contract).
            unsafe { self.device.write_raw(at, &top.to_le_bytes()) }
        } else {
            Ok(())
        };
        // Every rank's copy is done before any rank launches again: ranks
        // sharing a GPU share its queues, and a copy queued behind a
        // peer's kernel that waits for this rank would wait out its budget.
        self.world.barrier()?;
        read.and(written)
    }

    /// Synchronizes `stream`, then [`Self::check`]s for timed-out waits.
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        let step = self.status.enter(stuck::Step::Synchronize);
        let r = stream.synchronize().and_then(|()| self.trace_collect()).and_then(|_| self.check());
        step.synchronized(r.is_ok());
        if let Err(e) = &r {
            self.note_failure(e);
        }
        r
    }

    fn note_failure(&self, e: &Error) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert_with(|| e.to_string());
    }

    /// This rank has failed: tells every other rank (their collectives fail
    /// with an error naming this rank and `reason`) and makes this
    /// communicator's drop skip the collective wait for the others.
    /// [`Communicator::local`] calls it for a rank whose closure fails; a
    /// device error seen by [`synchronize`](Self::synchronize) has the same
    /// effect at drop.
    pub fn abort(&self, reason: &str) {
        self.note_failure(&Error::comm(reason.to_string()));
        self.world.abort(reason);
    }
}

/// A symmetric buffer: the same offset in every rank's heap. Kernels take
/// its local address; transports translate to peers.
pub struct SymBuffer<'c, T: DeviceCopy> {
    comm: &'c Communicator,
    offset: u64,
    len: usize,
    /// Its allocation's index (the order of [`Communicator::alloc`]).
    index: u64,
    _t: std::marker::PhantomData<T>,
}

impl<T: DeviceCopy> Drop for SymBuffer<'_, T> {
    /// Notes the drop: the space is taken back by the next allocation
    /// after every rank has dropped its buffer.
    fn drop(&mut self) {
        self.comm.sym_dropped(self.index);
    }
}

impl<T: DeviceCopy> SymBuffer<'_, T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Offset in the symmetric heap.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Local device address, a kernel argument.
    pub fn as_ptr(&self) -> *const T {
        (self.comm.heap_base + self.offset) as *const T
    }
    /// Local device address, a kernel argument.
    pub fn as_mut_ptr(&self) -> *mut T {
        (self.comm.heap_base + self.offset) as *mut T
    }
    /// The buffer as a typed kernel argument ([`Sym`](doorbell_kernels::transport::Sym)):
    /// this rank's address and the length, so the transfer calls check
    /// every part of it against this buffer.
    pub fn sym(&self) -> doorbell_kernels::transport::Sym<T> {
        doorbell_kernels::transport::Sym::from_raw(self.as_mut_ptr(), self.len as u64)
    }
    /// Copies `src` into this rank's copy (synchronous).
    pub fn copy_from_host(&self, src: &[T]) -> Result<()> {
        if src.len() != self.len {
            return Err(Error::LengthMismatch {
                device: self.len,
                host: src.len(),
            });
        }
        // SAFETY: plain data; inside this rank's heap.
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr() as *const u8, std::mem::size_of_val(src)) };
        // SAFETY: inside this rank's heap.
        unsafe { self.comm.device.write_raw(self.comm.heap_base + self.offset, bytes) }
    }
    /// This rank's copy as a `Vec` (synchronous).
    pub fn to_host(&self) -> Result<Vec<T>> {
        // SAFETY: DeviceCopy types are valid when zeroed.
        let mut v = vec![unsafe { std::mem::zeroed::<T>() }; self.len];
        // SAFETY: plain data.
        let bytes = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v.as_slice())) };
        // SAFETY: inside this rank's heap.
        unsafe { self.comm.device.read_raw(self.comm.heap_base + self.offset, bytes)? };
        Ok(v)
    }
}

/// Where the ranks of [`Communicator::local`] wait for each other once
/// their own devices are idle, before any frees its heap.
struct Quiesce {
    n: usize,
    arrived: Mutex<usize>,
    cv: std::sync::Condvar,
}

impl Quiesce {
    fn new(n: usize) -> Quiesce {
        Quiesce {
            n,
            arrived: Mutex::new(0),
            cv: std::sync::Condvar::new(),
        }
    }

    /// One rank's arrival: counted at [`Arrival::wait_for_all`], or when
    /// dropped unused (a rank's thread that ended early).
    fn arrival(&self) -> Arrival<'_> {
        Arrival { gate: self, done: false }
    }
}

struct Arrival<'a> {
    gate: &'a Quiesce,
    done: bool,
}

impl Arrival<'_> {
    fn arrive(&mut self) -> std::sync::MutexGuard<'_, usize> {
        let mut a = self.gate.arrived.lock().unwrap_or_else(|p| p.into_inner());
        if !self.done {
            self.done = true;
            *a += 1;
            self.gate.cv.notify_all();
        }
        a
    }

    /// Counts this rank in and waits until every rank has arrived.
    fn wait_for_all(mut self) {
        let n = self.gate.n;
        let cv = &self.gate.cv;
        let mut a = self.arrive();
        while *a < n {
            a = cv.wait(a).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        drop(self.arrive());
    }
}

impl Drop for Communicator {
    /// Destruction is collective: peers may still read or write this rank's
    /// heap until every rank's kernels are done, so wait for this rank's
    /// device, then for every rank, before the heap is freed.
    ///
    /// A rank that failed (a device error, a timed-out wait, [`abort`](Self::abort),
    /// a panic) does not wait for the others, which may be the reason it
    /// failed: it aborts the world, so the others' collectives fail at once
    /// naming it. A rank whose final barrier did not complete (it failed, or
    /// a peer did) leaks its heap, saying so in a log line, when ranks of
    /// this process might still write into it; [`Communicator::local`]
    /// first waits until every rank's device is idle, and then frees.
    fn drop(&mut self) {
        self.status.set(stuck::Step::Dropping);
        // Leaves a kernel failure for the user's own synchronize.
        self.device.wait_idle();
        self.trace_finish();
        let noted = self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let failure = noted.or_else(|| std::thread::panicking().then(|| "it panicked".to_string()));
        let in_process_peers = self
            .routes
            .iter()
            .any(|r| matches!(r, PeerRoute::SameProcess | PeerRoute::PeerAccess));
        let synced = match &failure {
            Some(reason) => {
                self.world.abort(reason);
                false
            }
            None => self.world.barrier().is_ok(),
        };
        // A peer of this process whose kernels may still run can write into
        // this heap: without the final barrier (or `local`'s wait for every
        // rank's device) nothing says they stopped, so the heap is leaked.
        if !synced && !self.quiesced && in_process_peers {
            tracing::warn!(
                "rank {}: the world ended without every rank's kernels known to be done; leaking this rank's \
                 heap ({} bytes), which kernels of other ranks of this process may still write",
                self.rank,
                self.heap_len
            );
            std::mem::forget(self._heap.take());
        }
    }
}
