//! Collectives on a [`Communicator`]: the sum all-reduce, plain or fused
//! with a producer kernel.
//!
//! ```no_run
//! use doorbell::{Backend, comm::{Communicator, CommOptions}, coll::{AllReduce, DType}};
//! # fn main() -> doorbell::Result<()> {
//! Communicator::local(4, Backend::Auto, CommOptions::default(), |comm| {
//!     let n = 1 << 20;
//!     let ar = AllReduce::new(comm, n, DType::F32)?;      // collective: sizes its buffers
//!     let dev = comm.device();
//!     let mut grad = dev.alloc_from(&vec![comm.rank() as f32; n])?;
//!     let stream = dev.new_stream()?;
//!     ar.run_in_place(&stream, &mut grad)?;               // every rank, same order
//!     comm.synchronize(&stream)?;                          // errors of device waits surface here
//!     assert!(grad.to_host()?.iter().all(|&x| x == 6.0)); // 0 + 1 + 2 + 3
//!     Ok(())
//! })?;
//! # Ok(()) }
//! ```
//!
//! ## What it does
//! Every rank passes `elems` elements and gets the element-wise sum over
//! all ranks, `f32` or [`Bf16`] (summed in `f32` in rank order, rounded once
//! to nearest even: the CPU reference [`reference::allreduce_sum`] computes
//! the same bits). Input and output are any device memory of the rank,
//! the same buffer for in place. 1 to 8 ranks ([`MAX_RANKS`]); one rank is
//! a copy. Zero elements: nothing is launched.
//!
//! ## Algorithms
//! Chosen by size and route ([`AllReduceOptions::algo`] overrides):
//! LL (one-shot with the flag in the data) up to [`LL_MAX_BYTES`]
//! ([`LL_MAX_BYTES_SHARED_GPU`] when ranks share a GPU; and
//! [`LL_MAX_SCRATCH`]), two-shot (reduce-scatter + all-gather, both by
//! stores into the peers' memory) above, pipelined (reduce-scatter +
//! all-gather through pipeline rings, with puts and signals) where a route
//! has no peer pointers; one-shot (staged copies and a signal per chunk)
//! only when asked for. See
//! `doorbell_kernels::coll::allreduce` for the data paths.
//!
//! ## Rules
//! * `AllReduce::new` is collective (it allocates symmetric memory); every
//!   rank launches it (`run`, or a fused kernel with the arguments of
//!   [`AllReduce::fused_args`]) the same number of times, in the same order
//!   as its other collectives: each block of the kernel counts its launches
//!   in device memory, so launches follow each other with no reset and no
//!   barrier, and a launch captured in a CUDA graph can be replayed (the
//!   arguments do not change from launch to launch).
//! * Launches of one `AllReduce` go to one stream per rank (they are
//!   ordered with each other); the host must not reuse the input or read
//!   the output before the stream has reached the end of the launch.
//! * Blocks of all ranks wait on each other: they must be resident at
//!   once. The default grid keeps to a share of the GPU's SMs per rank.
//!
//! ## The fused all-reduce
//! [`AllReduce::fused_args`] gives the kernel argument and grid for a
//! kernel of your own that calls `doorbell_kernels::coll::allreduce::fused`
//! with a producer closure. With one-shot and two-shot the producer writes
//! each chunk straight into the peers' staging (its stores are the
//! reduce-scatter) and the chunk's reduction starts as soon as every rank
//! has signalled it; pipelined hands each chunk to its owner's ring (see
//! `docs/allreduce.md`).

use std::sync::atomic::{AtomicU64, Ordering};

use doorbell_kernels::coll::allreduce::{allreduce, allreduce_wide, AllReduceArgs, ALIGN_ELEMS};
use doorbell_kernels::transport::P2p;
use doorbell_kernels::{ForTransport, Kernel};

pub use doorbell_kernels::coll::allreduce::Algo;
pub use doorbell_kernels::coll::{Bf16, DType, MAX_RANKS};

use crate::comm::{Communicator, PeerRoute, RdmaPeers, SymBuffer};
use crate::error::{Error, Result};
use crate::family::{AnyTransport, Family};
use crate::memory::{DeviceBuffer, DeviceCopy};
use crate::module::Function;
use crate::stream::{LaunchConfig, Stream};

pub mod embedding;
pub mod reference;

pub use crate::family::TransportKind;
pub use embedding::{EmbeddingError, EmbeddingExchange, EmbeddingOptions};

// SAFETY: a transparent u16: plain data, valid for every bit pattern.
unsafe impl DeviceCopy for Bf16 {}

/// Element types of the collectives, as the host handles them (upload,
/// round, compare). The device side of the same types is
/// [`doorbell_kernels::coll::Element`].
pub trait HostElement: DeviceCopy + PartialEq + std::fmt::Debug {
    /// The kernel-side tag.
    const DTYPE: DType;
    /// Widens to `f32` exactly.
    fn to_f32(self) -> f32;
    /// Rounds to nearest even.
    fn from_f32(v: f32) -> Self;
    /// The raw bits (for bit-exact comparisons; NaN-safe).
    fn to_bits(self) -> u32;
}

impl HostElement for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_bits(self) -> u32 {
        f32::to_bits(self)
    }
}

impl HostElement for Bf16 {
    const DTYPE: DType = DType::Bf16;
    fn to_f32(self) -> f32 {
        Bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        Bf16::from_f32(v)
    }
    fn to_bits(self) -> u32 {
        self.0 as u32
    }
}

/// Largest message (bytes per rank) the automatic choice sends with the
/// LL one-shot (flag in the data): its packets carry twice the bytes, and
/// every thread polls its own, so it wins where latency, not bandwidth,
/// is the cost (on two H200s over NVLink it beat one-shot and two-shot at
/// every size up to 1 MiB).
pub const LL_MAX_BYTES: u64 = 1 << 20;
/// [`LL_MAX_BYTES`] when ranks share a GPU, where its doubled bytes cost
/// HBM bandwidth instead of a link's latency. Two ranks on one H200, both
/// forced, same run: LL 6.0 / 9.0 / 15.5 / 28.6 µs, two-shot 13.1 / 14.0 /
/// 13.6 / 14.5 µs at 128 KiB / 256 KiB / 512 KiB / 1 MiB
/// (`benchmarks/allreduce_h200_2ranks_ll_vs_twoshot.txt`).
pub const LL_MAX_BYTES_SHARED_GPU: u64 = 256 << 10;
/// Most symmetric scratch the automatic choice gives LL (it takes
/// `4 * world * bytes`: two parities of a packet slot per rank): with 8
/// ranks, LL stops at 512 KiB.
pub const LL_MAX_SCRATCH: u64 = 16 << 20;
/// LL: data bytes per block of a plain launch: one 4-byte packet per
/// thread of 256. A thread's polls of its packets run one after another;
/// with two packets per thread, 2 KiB on one block took 3.22 µs on two
/// H200s where 1 KiB took 2.56 and 2 KiB spread over every SM 2.82.
const LL_BYTES_PER_BLOCK: u64 = 1 << 10;
/// Default bytes per signalled chunk of one-shot / two-shot when ranks
/// share a GPU (two ranks on one H200: 1 MiB chunks ran 2-5 % faster than
/// 256 KiB from 64 MiB up).
pub const DEFAULT_CHUNK_BYTES: u64 = 1 << 20;
/// Default bytes per signalled chunk of one-shot / two-shot when every
/// rank has its GPU to itself (two H200s over NVLink: 256 KiB chunks ran
/// 5-7 % faster than 1 MiB at 256 and 512 MiB, the same from 2 MiB to
/// 128 MiB and at 1 GiB, in two runs).
pub const DEFAULT_CHUNK_BYTES_OWN_GPU: u64 = 256 << 10;
/// Default bytes per chunk of the pipelined (and fused) all-reduce.
pub const DEFAULT_PIPELINE_CHUNK_BYTES: u64 = 64 << 10;
/// Default stages per pipeline ring.
pub const DEFAULT_STAGES: u32 = 4;

/// Most blocks per rank when several ranks share a GPU; and all ranks'
/// grids together take at most half of its SMs. Every block of every rank
/// must be resident at once, and near-full grids were fragile on the H200:
/// one block per SM split over the ranks (3 x 44 of 132 SMs) failed its
/// fused tests in one run, and 4 ranks x 32 blocks (128 SMs) had a rank's
/// first launch of a plan never start within the peers' 10 s waits in the
/// benchmark (3 x 32 and 8 x 16 passed every test). The half leaves room
/// for anything else the GPU runs.
pub const MAX_BLOCKS_SHARED_GPU: u32 = 32;

/// Explicit [`AllReduceOptions::blocks`] on a GPU shared by ranks: at most
/// this many times the default most blocks per rank (the rank's share of
/// SMs, [`MAX_BLOCKS_SHARED_GPU`] at most) — two blocks per SM, what the
/// library's `…_512x2` entries fit.
pub const MAX_BLOCKS_PER_SM_SHARED: u64 = 2;

/// Tuning of an [`AllReduce`]; `Default` picks everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllReduceOptions {
    /// The device transport (default [`TransportKind::P2p`]). IBGDA and
    /// routed set the transport up on first use (collective, like `new`).
    pub transport: TransportKind,
    /// Routed transport and CPU proxy: which pairs of ranks go through the
    /// NIC (default: the environment — `DOORBELL_RDMA_PEERS` or
    /// `DOORBELL_NODES` for the routed transport, only `DOORBELL_NODES` for
    /// the proxy, which otherwise sends every pair through the NIC:
    /// `Communicator::proxy`). Ignored otherwise.
    pub rdma_peers: Option<RdmaPeers>,
    /// The algorithm (default: by size and route).
    pub algo: Option<Algo>,
    /// Bytes per signalled chunk, rounded up to 64 elements (default
    /// [`DEFAULT_CHUNK_BYTES_OWN_GPU`] when every rank has its own GPU, else
    /// [`DEFAULT_CHUNK_BYTES`]; pipelined [`DEFAULT_PIPELINE_CHUNK_BYTES`]).
    pub chunk_bytes: Option<u64>,
    /// Blocks per rank (default: by size — a chunk (pipelined) or 64 KiB
    /// per block — up to one per SM of the rank's GPU; when ranks share a
    /// GPU, all ranks' grids together up to half its SMs, at most
    /// [`MAX_BLOCKS_SHARED_GPU`] per rank; 2 on the emulator). Explicit
    /// counts on a shared GPU: at most [`MAX_BLOCKS_PER_SM_SHARED`] times
    /// that default.
    pub blocks: Option<u32>,
    /// Threads per block, a multiple of 32 (default on a GPU: 256 — any
    /// kernel fits 256 threads, whatever its register count — except
    /// [`MAX_THREADS_WIDE`] for a plain two-shot over P2P when every rank
    /// has its own GPU; 64 on the emulator, whose GPU threads are OS
    /// threads). Plain launches take at
    /// most [`MAX_THREADS`], or [`MAX_THREADS_WIDE`] for two-shot over P2P
    /// (a second entry, built for blocks that large); a fused plan's block
    /// is your kernel's.
    pub threads: Option<u32>,
    /// Stages per pipeline ring (default [`DEFAULT_STAGES`]).
    pub stages: Option<u32>,
    /// Plan for a fused kernel ([`AllReduce::fused_args`]): by default the
    /// grid is the most blocks the rank may have ([`Self::blocks`]) whatever
    /// the size — the producer computes in the all-reduce's blocks and
    /// needs the whole GPU — where a plain all-reduce sizes it by bytes.
    pub fused: bool,
    /// Launch each all-reduce to overlap the tail of the kernel before it on
    /// the stream (programmatic dependent launch,
    /// [`crate::LaunchConfig::overlap_previous`]): the kernel waits for that
    /// kernel on the device instead of being launched after it, and lets
    /// the next one launch early. Default: on when the rank has its GPU to
    /// itself; off when ranks share one (a kernel launched early holds SMs
    /// while it waits, which a peer's all-reduce may need), and off on the
    /// emulator. Plain launches only: the launch [`AllReduce::fused_args`]
    /// returns never overlaps (your kernel is yours to order).
    pub overlap_launch: Option<bool>,
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::Collective {
        op: "all-reduce",
        reason: reason.into(),
    }
}

/// Where the ranks of an all-reduce run, as its plan needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// On a GPU (false: the CPU emulator).
    pub gpu: bool,
    /// SMs the plan's grid may use.
    pub sms: usize,
    /// Ranks sharing this rank's GPU (1: a GPU of its own).
    pub ranks_per_gpu: usize,
    /// Every peer's buffers are reachable by load/store (P2P).
    pub peer_pointers: bool,
    /// Ranks per node where the transport routes by node (the routed
    /// transport over [`RdmaPeers::Nodes`]); 1 where there are no nodes.
    pub node_ranks: usize,
}

/// The launch plan: algorithm, geometry and the buffers' sizes. The same on
/// every rank (checked at [`AllReduce::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The kernel argument, without this rank's addresses and epoch.
    pub args: AllReduceArgs,
    /// Threads per block.
    pub threads: u32,
    /// Plain launches overlap the previous kernel on the stream
    /// ([`AllReduceOptions::overlap_launch`]).
    pub overlap: bool,
}

impl Plan {
    /// The plan for `elems` elements of `dtype` over `world` ranks placed
    /// as `at` says.
    pub fn new(world: usize, elems: usize, dtype: DType, opts: &AllReduceOptions, at: Placement) -> Result<Plan> {
        let Placement {
            gpu,
            sms,
            ranks_per_gpu,
            peer_pointers,
            node_ranks,
        } = at;
        if world == 0 || world > MAX_RANKS {
            return Err(invalid(format!("{world} ranks; the all-reduce supports 1..={MAX_RANKS}")));
        }
        let esz = dtype.size();
        let elems64 = elems as u64;
        let bytes = elems64
            .checked_mul(esz)
            .ok_or_else(|| invalid(format!("{elems} elements overflow a byte count")))?;
        // On a GPU shared with other ranks, or one of its own: several
        // defaults differ (measured on the H200; the constants say how).
        let shared_gpu = gpu && ranks_per_gpu > 1;
        let own_gpu = gpu && !shared_gpu;
        let ll_max = if shared_gpu { LL_MAX_BYTES_SHARED_GPU } else { LL_MAX_BYTES };
        let nodes = node_ranks > 1 && node_ranks < world && world.is_multiple_of(node_ranks);
        let algo = match opts.algo {
            Some(a) => a,
            None if world == 1 => Algo::Copy,
            None if !peer_pointers && nodes && routes_by_node(opts.transport) => Algo::Hierarchical,
            None if !peer_pointers => Algo::Pipelined,
            None if bytes <= ll_max && 4 * world as u64 * bytes <= LL_MAX_SCRATCH => Algo::Ll,
            None => Algo::TwoShot,
        };
        if world == 1 && algo != Algo::Copy && algo != Algo::Pipelined {
            return Err(invalid(format!("{} needs at least 2 ranks; one rank is a copy", algo.name())));
        }
        if algo == Algo::Hierarchical && !(nodes && routes_by_node(opts.transport)) {
            return Err(invalid(format!(
                "the hierarchical algorithm needs ranks forming 2 or more nodes of 2 or more ranks each, over the routed \
                 transport or the CPU proxy (DOORBELL_NODES or RdmaPeers::Nodes); here {world} ranks, {node_ranks} per node, over {}",
                opts.transport
            )));
        }
        if world > 1 && algo == Algo::Copy {
            return Err(invalid(format!("the copy algorithm is for one rank, not {world}")));
        }
        if matches!(algo, Algo::OneShot | Algo::TwoShot | Algo::Ll) && !peer_pointers {
            return Err(invalid(format!(
                "{} stores into peers' memory through peer pointers, and a route of this communicator has none; use the pipelined algorithm",
                algo.name()
            )));
        }
        // Pipelined and hierarchical: chunks through rings.
        let ringed = matches!(algo, Algo::Pipelined | Algo::Hierarchical);
        let default_chunk = if ringed {
            DEFAULT_PIPELINE_CHUNK_BYTES
        } else if own_gpu {
            DEFAULT_CHUNK_BYTES_OWN_GPU
        } else {
            DEFAULT_CHUNK_BYTES
        };
        let chunk_bytes = opts.chunk_bytes.unwrap_or(default_chunk);
        if chunk_bytes == 0 || chunk_bytes > 1 << 30 {
            return Err(invalid(format!("a chunk of {chunk_bytes} bytes; use 1..=1073741824")));
        }
        let chunk_elems = chunk_bytes.div_ceil(esz).div_ceil(ALIGN_ELEMS) * ALIGN_ELEMS;
        // Plain two-shot with a GPU to itself: the wide entry's blocks
        // (busbw 1.01-1.10x NCCL's from 64 MiB to 1 GiB on two H200s in
        // two runs, where 256 threads reached 0.97-1.01x:
        // benchmarks/README.md).
        let wide = own_gpu && !opts.fused && has_wide_entry(algo, opts.transport);
        let threads = opts.threads.unwrap_or(if wide {
            MAX_THREADS_WIDE
        } else if gpu {
            MAX_THREADS
        } else {
            64
        });
        if threads == 0 || threads > 1024 || !threads.is_multiple_of(32) {
            return Err(invalid(format!("{threads} threads per block; use a multiple of 32 in 32..=1024")));
        }
        let stages = opts.stages.unwrap_or(DEFAULT_STAGES);
        if !(1..=64).contains(&stages) {
            return Err(invalid(format!("{stages} pipeline stages; use 1..=64")));
        }
        let max_blocks = if gpu {
            // Every block of every rank must be resident at once: at most
            // one per SM of this rank's share (the entries' registers allow
            // one block of 256 threads per SM, or of 512 for the wide one);
            // when ranks share the GPU, half of that and at most
            // MAX_BLOCKS_SHARED_GPU.
            if shared_gpu {
                (sms / 2 / ranks_per_gpu).clamp(1, MAX_BLOCKS_SHARED_GPU as usize) as u64
            } else {
                sms.max(1) as u64
            }
        } else {
            2
        };
        // Enough work per block to pay for its signals: a chunk (pipelined)
        // or 64 KiB; LL has no signals, and more threads poll sooner.
        let per_block = match algo {
            Algo::Pipelined | Algo::Hierarchical => chunk_elems * esz,
            Algo::Ll => LL_BYTES_PER_BLOCK * threads as u64 / 256,
            _ => 64 << 10,
        };
        let blocks = match opts.blocks {
            // Ranks sharing a GPU: every rank's blocks must be resident at
            // once, so an explicit grid stays within two blocks per SM of
            // the rank's share (the most any of the library's entries fits;
            // the benchmark's 2 x 132 blocks of 512 threads by each of 2
            // ranks left no SM of an H200 for anything else).
            Some(b) if shared_gpu && b as u64 > MAX_BLOCKS_PER_SM_SHARED * max_blocks => {
                let most = MAX_BLOCKS_PER_SM_SHARED * max_blocks;
                let why = "every rank's blocks must be resident at once";
                return Err(invalid(format!(
                    "{b} blocks per rank on a GPU shared by {ranks_per_gpu} ranks: {why}; use 1..={most}"
                )));
            }
            Some(b) if (1..=1024).contains(&b) => b,
            Some(b) => return Err(invalid(format!("{b} blocks per rank; use 1..=1024"))),
            None if opts.fused && !ringed => max_blocks as u32,
            None => bytes.div_ceil(per_block).clamp(1, max_blocks) as u32,
        };
        let args = AllReduceArgs {
            input: 0,
            output: 0,
            elems: elems64,
            chunk_elems,
            epoch: 0,
            scratch: 0,
            sigs: 0,
            failures: 0,
            dtype: dtype as u32,
            algo: algo as u32,
            blocks,
            stages,
            world: world as u32,
            node_ranks: if algo == Algo::Hierarchical { node_ranks as u32 } else { 0 },
        };
        let overlap = opts.overlap_launch.unwrap_or(own_gpu);
        Ok(Plan { args, threads, overlap })
    }

    /// Symmetric bytes the plan allocates per rank (scratch and signals,
    /// with the allocator's alignment): what `CommOptions::heap_bytes` must
    /// leave room for.
    pub fn heap_bytes(&self) -> u64 {
        self.args.scratch_bytes().div_ceil(256) * 256 + self.args.sig_words() * 8 + 512
    }

    /// The algorithm.
    pub fn algo(&self) -> Algo {
        Algo::from_u32(self.args.algo).expect("made by Plan::new")
    }

    /// Whether the library's kernel over `transport` can run a plain
    /// launch of this plan: its block fits the entry ([`MAX_THREADS`], or
    /// [`MAX_THREADS_WIDE`] for two-shot over P2P). `AllReduce` checks it
    /// when it is made for plain launches; this is the same check before
    /// any communicator exists.
    pub fn check_plain_launch(&self, transport: TransportKind) -> Result<()> {
        check_plain_threads(self, transport)
    }

    /// The grid and block of a plain launch, with the plan's overlap
    /// ([`AllReduce::fused_args`] turns the overlap off).
    pub fn launch_config(&self) -> LaunchConfig {
        LaunchConfig::linear(self.args.blocks, self.threads).with_overlap_previous(self.overlap)
    }
}

/// A plain launch of the library's kernel fits the plan's block: at most
/// [`MAX_THREADS`] threads, or [`MAX_THREADS_WIDE`] for two-shot over P2P
/// (a fused plan's block is the user's kernel's business).
fn check_plain_threads(plan: &Plan, transport: TransportKind) -> Result<()> {
    let wide = has_wide_entry(plan.algo(), transport);
    let most = if wide { MAX_THREADS_WIDE } else { MAX_THREADS };
    if plan.threads > most {
        return Err(invalid(format!(
            "{} threads per block; the library's {} kernel takes at most {most}{}",
            plan.threads,
            plan.algo().name(),
            if wide {
                String::new()
            } else {
                format!(" ({MAX_THREADS_WIDE} for two-shot over P2P)")
            }
        )));
    }
    Ok(())
}

/// Whether the library has an entry for blocks of up to
/// [`MAX_THREADS_WIDE`] threads for `algo` over `transport`: two-shot over
/// P2P only.
fn has_wide_entry(algo: Algo, transport: TransportKind) -> bool {
    algo == Algo::TwoShot && transport == TransportKind::P2p
}

/// Whether `t` can reach some peers by load/store and others through the
/// NIC, by node (`Transport::NODES` in the library's entries).
fn routes_by_node(t: TransportKind) -> bool {
    matches!(t, TransportKind::Routed | TransportKind::Proxy)
}

/// The routed transport's pairs through the NIC: the option, else the
/// environment.
fn rdma_peers(opts: &AllReduceOptions, size: usize) -> Result<RdmaPeers> {
    match &opts.rdma_peers {
        Some(p) => Ok(p.clone()),
        None => RdmaPeers::from_env_for(size),
    }
}

/// The CPU proxy's routes: the option, else `DOORBELL_NODES` alone (which
/// `Communicator::proxy` reads; `None`: every pair through the proxy).
fn proxy_peers(opts: &AllReduceOptions, size: usize) -> Result<Option<RdmaPeers>> {
    match &opts.rdma_peers {
        Some(p) => Ok(Some(p.clone())),
        None => RdmaPeers::nodes_from_env(size),
    }
}

/// True when `route` gives load/store access to the peer's heap.
fn has_pointer(route: &PeerRoute) -> bool {
    matches!(
        route,
        PeerRoute::Local | PeerRoute::SameProcess | PeerRoute::PeerAccess | PeerRoute::CudaIpc | PeerRoute::SharedMemory
    )
}

/// The entry for blocks of up to [`MAX_THREADS_WIDE`] threads (two-shot
/// over P2P).
type WideEntry = <allreduce_wide as ForTransport<P2p>>::Kernel;

/// Most threads per block of a plain launch through the library's entry
/// for every transport: it uses about 250 registers, so a larger block
/// does not fit an SM.
pub const MAX_THREADS: u32 = 256;
/// Most threads per block of a plain two-shot launch over P2P: plans of
/// more than [`MAX_THREADS`] launch the entry built for this many (within
/// 128 registers; two-shot only).
pub const MAX_THREADS_WIDE: u32 = WideEntry::MAX_THREADS;

/// The transport handle and the kernel entries it launches.
enum Launcher {
    /// The library kernel's entries; the handle picks one.
    Family(Box<AnyTransport>, Family<allreduce>),
    /// The entry for blocks of more than [`MAX_THREADS`] threads.
    P2pWide(P2p, Function<WideEntry>),
}

/// A sum all-reduce of `elems` elements of one type over a communicator's
/// ranks: its plan, its symmetric buffers, its launch counter. See the
/// module docs.
pub struct AllReduce<'c> {
    comm: &'c Communicator,
    /// Planned for a fused kernel ([`AllReduceOptions::fused`]).
    fused: bool,
    plan: Plan,
    transport: TransportKind,
    scratch: SymBuffer<'c, u8>,
    sigs: SymBuffer<'c, u64>,
    launcher: Launcher,
    epoch: AtomicU64,
    /// The communicator's NIC generation when the launcher's handle was
    /// made, for a NIC transport (`None`: P2P).
    nic_gen: Option<u64>,
    /// [`Communicator::failures_met`] when it was made.
    failures_at: u64,
}

impl<'c> AllReduce<'c> {
    /// Collective: an all-reduce of `elems` elements of `dtype` with the
    /// default options.
    pub fn new(comm: &'c Communicator, elems: usize, dtype: DType) -> Result<AllReduce<'c>> {
        Self::with_options(comm, elems, dtype, &AllReduceOptions::default())
    }

    /// The plan `with_options` would make on this communicator, without
    /// allocating (to size `CommOptions::heap_bytes`, for instance). Peer
    /// pointers: every route has one under P2P; none under IBGDA; under the
    /// routed transport, only when [`AllReduceOptions::rdma_peers`] sends no
    /// pair through the NIC (the plan is the same on every rank, so one pair
    /// without pointers makes the whole world pipelined).
    pub fn plan_for(comm: &Communicator, elems: usize, dtype: DType, opts: &AllReduceOptions) -> Result<Plan> {
        let dev = comm.device();
        let routes = comm.describe_peers();
        // The world's most ranks on one GPU, not this rank's count: the plan
        // (grid, chunk) must be the same on every rank.
        let per_gpu = comm.ranks_per_gpu();
        let direct = routes.iter().all(has_pointer);
        let peer_pointers = match opts.transport {
            TransportKind::P2p => direct,
            TransportKind::Ibgda | TransportKind::Proxy => false,
            TransportKind::Routed => direct && (comm.world_size() == 1 || rdma_peers(opts, comm.world_size())? == RdmaPeers::Needed),
        };
        // The soft NIC's engine kernels hold SMs (a block each, one per
        // rank by default) while the transport goes through them: grids
        // that must be resident at once leave those SMs free.
        let sms = match opts.transport {
            TransportKind::P2p => dev.multiprocessor_count(),
            _ if dev.is_gpu() => {
                let engine = per_gpu * comm.engine_sms_per_rank() as usize;
                dev.multiprocessor_count().saturating_sub(engine + 1).max(1)
            }
            _ => dev.multiprocessor_count(),
        };
        let world = comm.world_size();
        // The routes the transport's handle is made with (below).
        let peers = match opts.transport {
            TransportKind::Routed => Some(rdma_peers(opts, comm.world_size())?),
            TransportKind::Proxy => proxy_peers(opts, comm.world_size())?,
            _ => None,
        };
        let node_ranks = match peers {
            Some(RdmaPeers::Nodes(n)) if n > 0 && world.is_multiple_of(n) => world / n,
            _ => 1,
        };
        Plan::new(
            world,
            elems,
            dtype,
            opts,
            Placement {
                gpu: dev.is_gpu(),
                sms,
                ranks_per_gpu: per_gpu,
                peer_pointers,
                node_ranks,
            },
        )
    }

    /// Collective: an all-reduce of `elems` elements of `dtype`, tuned by
    /// `opts`. Every rank must pass the same arguments (checked).
    pub fn with_options(comm: &'c Communicator, elems: usize, dtype: DType, opts: &AllReduceOptions) -> Result<AllReduce<'c>> {
        let plan = Self::plan_for(comm, elems, dtype, opts)?;
        if !opts.fused {
            check_plain_threads(&plan, opts.transport)?;
        }
        let a = &plan.args;
        let mut desc = Vec::new();
        for v in [
            a.elems,
            a.chunk_elems,
            a.dtype as u64,
            a.algo as u64,
            a.blocks as u64,
            a.stages as u64,
            plan.threads as u64,
            opts.transport as u64,
            a.node_ranks as u64,
        ] {
            desc.extend_from_slice(&v.to_le_bytes());
        }
        comm.world().check_same(
            "all-reduce plan (elements, chunk, type, algorithm, blocks, stages, threads, transport, ranks per node)",
            &desc,
        )?;
        let scratch = comm.alloc::<u8>(a.scratch_bytes().max(1) as usize)?;
        let sigs = comm.alloc::<u64>(a.sig_words() as usize)?;
        let module = comm.library_module()?;
        let launcher = match opts.transport {
            TransportKind::P2p if plan.threads > MAX_THREADS && has_wide_entry(plan.algo(), opts.transport) => {
                Launcher::P2pWide(comm.p2p()?, module.function()?)
            }
            TransportKind::P2p => Launcher::Family(Box::new(comm.p2p()?.into()), module.family()?),
            TransportKind::Ibgda => Launcher::Family(Box::new(comm.ibgda()?.into()), module.family()?),
            TransportKind::Proxy => Launcher::Family(Box::new(comm.proxy_with_routes(opts.rdma_peers.as_ref())?.into()), module.family()?),
            TransportKind::Routed => {
                let t = comm.routed_with(&rdma_peers(opts, comm.world_size())?)?;
                let algo = plan.algo();
                if matches!(algo, Algo::OneShot | Algo::TwoShot | Algo::Ll) {
                    if let Some(p) = (0..comm.world_size() as u32).find(|&p| t.is_rdma(p)) {
                        return Err(invalid(format!(
                            "{} stores into peers' memory through peer pointers, and rank {p} is reached through the NIC; use the pipelined algorithm",
                            algo.name()
                        )));
                    }
                }
                Launcher::Family(Box::new(t.into()), module.family()?)
            }
        };
        tracing::debug!(
            "rank {}: all-reduce of {} {} ({}, {} block(s), chunk {} elements): scratch at heap offset {:#x}, signal words at {:#x}",
            comm.rank(),
            a.elems,
            dtype.name(),
            plan.algo().name(),
            a.blocks,
            a.chunk_elems,
            scratch.offset(),
            sigs.offset()
        );
        // Every rank has zeroed its copy of the signal words before any
        // rank's first launch may signal into it.
        comm.barrier()?;
        Ok(AllReduce {
            comm,
            fused: opts.fused,
            plan,
            transport: opts.transport,
            scratch,
            sigs,
            launcher,
            epoch: AtomicU64::new(0),
            nic_gen: (opts.transport != TransportKind::P2p).then(|| comm.nic_generation()),
            failures_at: comm.failures_met(),
        })
    }

    /// The plan (algorithm, grid, chunk).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }
    /// Elements per rank.
    pub fn elems(&self) -> usize {
        self.plan.args.elems as usize
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        DType::from_u32(self.plan.args.dtype).expect("made by Plan::new")
    }
    /// The algorithm.
    pub fn algo(&self) -> Algo {
        self.plan.algo()
    }
    /// The device transport its launches run over (a fused kernel of your
    /// own must take the same transport's handle).
    pub fn transport(&self) -> TransportKind {
        self.transport
    }
    /// Launches so far, as counted on the host (`run` and `fused_args`
    /// calls; a captured launch replayed from a graph is not counted).
    pub fn launches(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    fn check_stream(&self, stream: &Stream) -> Result<()> {
        if !stream.device().same(self.comm.device()) {
            return Err(invalid("the stream belongs to another device than the communicator's"));
        }
        Ok(())
    }

    fn check_buffer<T: HostElement>(&self, what: &str, buf: &DeviceBuffer<T>) -> Result<()> {
        if T::DTYPE != self.dtype() {
            return Err(invalid(format!(
                "the {what} holds {} elements, this all-reduce was made for {}",
                T::DTYPE.name(),
                self.dtype().name()
            )));
        }
        if buf.len() != self.elems() {
            return Err(invalid(format!(
                "the {what} holds {} elements, this all-reduce was made for {}",
                buf.len(),
                self.elems()
            )));
        }
        if !buf.device().same(self.comm.device()) {
            return Err(invalid(format!("the {what} lives on another device than the communicator's")));
        }
        Ok(())
    }

    /// The next launch's arguments (one more epoch).
    fn next_args(&self, input: u64, output: u64) -> AllReduceArgs {
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed) + 1;
        AllReduceArgs {
            input,
            output,
            epoch,
            scratch: self.scratch.as_ptr() as u64,
            sigs: self.sigs.as_ptr() as u64,
            failures: self.failures_at,
            ..self.plan.args
        }
    }

    /// Enqueues `output = sum over ranks of input` on `stream`. Every rank
    /// calls it, in the same order; errors of the device's waits surface at
    /// `Communicator::synchronize`. Where two or more ranks share a GPU
    /// it first waits on the host for this rank's previous launch to end
    /// ([`Communicator::launch_waiting`]).
    pub fn run<T: HostElement>(&self, stream: &Stream, input: &DeviceBuffer<T>, output: &mut DeviceBuffer<T>) -> Result<()> {
        self.check_buffer("input", input)?;
        self.check_buffer("output", output)?;
        // SAFETY: both hold `elems` elements of the right type on this device.
        unsafe { self.run_raw(stream, input.as_raw(), output.as_raw()) }
    }

    /// [`Self::run`] in place: `buf = sum over ranks of buf`.
    pub fn run_in_place<T: HostElement>(&self, stream: &Stream, buf: &mut DeviceBuffer<T>) -> Result<()> {
        self.check_buffer("buffer", buf)?;
        // SAFETY: as for `run`.
        unsafe { self.run_raw(stream, buf.as_raw(), buf.as_raw()) }
    }

    /// [`Self::run`] on symmetric buffers (`input` may be `output`).
    pub fn run_sym<T: HostElement>(&self, stream: &Stream, input: &SymBuffer<'_, T>, output: &SymBuffer<'_, T>) -> Result<()> {
        for (what, len) in [("input", input.len()), ("output", output.len())] {
            if T::DTYPE != self.dtype() || len != self.elems() {
                return Err(invalid(format!(
                    "the {what} holds {len} {} elements, this all-reduce was made for {} {}",
                    T::DTYPE.name(),
                    self.elems(),
                    self.dtype().name()
                )));
            }
        }
        // SAFETY: as for `run`.
        unsafe { self.run_raw(stream, input.as_ptr() as u64, output.as_mut_ptr() as u64) }
    }

    /// [`Self::run`] on raw device addresses.
    ///
    /// # Safety
    /// `input` and `output` are device addresses of this rank's device
    /// holding `elems` elements of the all-reduce's type (or the same
    /// address), alive and unused by others until the launch completes.
    pub unsafe fn run_raw(&self, stream: &Stream, input: u64, output: u64) -> Result<()> {
        self.check_stream(stream)?;
        if let Some(g) = self.nic_gen {
            self.comm.check_nic_generation(g, "this all-reduce")?;
        }
        self.comm.check_no_failure_since(self.failures_at, "this all-reduce")?;
        check_plain_threads(&self.plan, self.transport)?;
        if self.elems() == 0 {
            return Ok(());
        }
        let cfg = self.plan.launch_config();
        // One at a time where ranks crowd a GPU (Communicator::launch_waiting).
        self.comm.launch_waiting(stream, || {
            let args = self.next_args(input, output);
            // SAFETY: the plan's buffers are allocated; the caller vouches
            // for input and output; each entry gets its own transport's
            // handle.
            unsafe {
                match &self.launcher {
                    Launcher::Family(t, f) => stream.launch_family(f, cfg, **t, (args,)),
                    Launcher::P2pWide(t, f) => stream.launch(f, cfg, (*t, args)),
                }
            }
        })
    }

    /// The argument and grid for one launch of a **fused** all-reduce
    /// kernel of your own (it calls `doorbell_kernels::coll::allreduce::fused`
    /// with its producer), writing the sum into `output`. Launch it on every
    /// rank, in the same order as this all-reduce's other launches; the same
    /// arguments serve every launch into the same `output` (the kernel
    /// counts its epochs), so a captured launch can be replayed. Plan with
    /// [`AllReduceOptions::fused`] so the producer gets the whole GPU. Any
    /// algorithm: one-shot and two-shot hand the producer the peers'
    /// staging, pipelined its ring outbox. `None` for zero elements (launch
    /// nothing).
    ///
    /// Arguments taken before a failure the ranks met on
    /// ([`Communicator::failures_met`]), launched or replayed from a
    /// captured graph after it, run nothing: every block finds the count in
    /// its rank's heap header changed and returns, and `synchronize`
    /// reports it on every rank. After such a failure make a new
    /// all-reduce, take its arguments and capture again.
    pub fn fused_args<T: HostElement>(
        &self,
        stream: &Stream,
        output: &mut DeviceBuffer<T>,
    ) -> Result<Option<(AllReduceArgs, LaunchConfig)>> {
        self.check_buffer("output", output)?;
        // SAFETY: checked above.
        unsafe { self.fused_args_raw(stream, output.as_raw()) }
    }

    /// [`Self::fused_args`] on a raw output address.
    ///
    /// # Safety
    /// `output` holds `elems` elements of the all-reduce's type on this
    /// rank's device.
    pub unsafe fn fused_args_raw(&self, stream: &Stream, output: u64) -> Result<Option<(AllReduceArgs, LaunchConfig)>> {
        self.check_stream(stream)?;
        self.comm.check_no_failure_since(self.failures_at, "this all-reduce")?;
        if !self.fused && self.plan.threads > MAX_THREADS {
            return Err(invalid(format!(
                "this all-reduce was planned for plain launches in blocks of {} threads (the library's two-shot entry); \
                 plan with `AllReduceOptions::fused` for a kernel of your own",
                self.plan.threads
            )));
        }
        if self.elems() == 0 {
            return Ok(None);
        }
        // The user's kernel may read what earlier kernels wrote before it
        // calls `fused`: launched after them, as usual.
        Ok(Some((
            self.next_args(0, output),
            self.plan.launch_config().with_overlap_previous(false),
        )))
    }
}
