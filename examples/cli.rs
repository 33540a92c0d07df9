//! Command lines of the examples, as `clap` parsers (derive). Each example
//! parses with `XArgs::parse()` (bad input: a message and exit status 2);
//! tests call `XArgs::try_parse_from` and the `validate` functions here.

use std::path::PathBuf;

use clap::{Args, Parser, ValueEnum};
use doorbell::coll::{Algo, DType, TransportKind};
use doorbell::Backend;
use doorbell_example_kernels::allreduce::{COMPUTE_GEMV, COMPUTE_HASH};

/// Largest element count of `fma` (2^34 f32: 64 GiB per vector).
pub const FMA_MAX_N: u64 = 1 << 34;
/// Largest byte count of `histogram` and of a `pingpong` / `p2p_bench` buffer (64 GiB).
pub const MAX_BYTES: u64 = 1 << 36;

/// A value parser for an integer in `min..=max`, decimal or `0x` hex, `_`
/// separators allowed.
pub fn ranged(min: u64, max: u64) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let v = parse_number(s).ok_or_else(|| format!("`{s}` is not a whole number (decimal or 0x hex); use {min}..={max}"))?;
        if (min..=max).contains(&v) {
            Ok(v)
        } else {
            Err(format!("{v} is out of range; use {min}..={max}"))
        }
    }
}

/// Decimal or `0x`/`0X` hex, `_` separators allowed; nothing else.
pub fn parse_number(s: &str) -> Option<u64> {
    doorbell_kernels::mlx5::dump::parse_number(s)
}

/// A byte count as nccl-tests writes one: a whole number (decimal or `0x`
/// hex, `_` separators allowed) with an optional binary suffix `K`, `M`,
/// `G` or `T` (either case: 2^10, 2^20, 2^30, 2^40). `128M` is 134217728.
/// Fractions (`1.5M`), negative numbers, other suffixes and counts past
/// `u64::MAX` are errors naming the text.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if !t.starts_with("0x") && !t.starts_with("0X") && c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("`{s}` has an unknown size suffix `{c}`; use K, M, G or T (powers of 1024)")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n = parse_number(digits)
        .ok_or_else(|| format!("`{s}` is not a size: give a whole number, optionally with K, M, G or T (e.g. 8, 4096, 64K, 128M)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{s}` is too large: more than {} bytes", u64::MAX))
}

/// `bytes` the way [`parse_size`] reads it back, shortest first: `64K`,
/// `128M`, `1G` for whole multiples of a unit, else the plain number.
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// A value parser for a byte count in `min..=max`, in [`parse_size`]'s
/// syntax (`-e 128M`, `--size 4K`, or plain numbers as before).
pub fn sized(min: u64, max: u64) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let v = parse_size(s)?;
        if (min..=max).contains(&v) {
            Ok(v)
        } else {
            Err(format!(
                "{v} is out of range; use {}..={} ({min}..={max} bytes)",
                format_size(min),
                format_size(max)
            ))
        }
    }
}

/// A sweep of sizes as nccl-tests makes one: `min`, `min * factor`, ...
/// while at most `max` (nothing when `min > max`; stops before a size
/// that would overflow).
pub fn sweep(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut sizes = Vec::new();
    let mut b = min;
    while b <= max {
        sizes.push(b);
        match b.checked_mul(factor) {
            Some(n) if factor > 1 => b = n,
            _ => break,
        }
    }
    sizes
}

fn parse_backend(s: &str) -> Result<Backend, String> {
    s.parse::<Backend>()
        .map_err(|_| format!("`{s}` is not a backend; use gpu, cpu or auto"))
}

/// `--device`, shared by every example that runs kernels.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct DeviceArgs {
    /// Where kernels run: gpu, cpu (the CPU emulator) or auto (the GPU when
    /// one is present) [default: DOORBELL_DEVICE, else auto]
    #[arg(long, value_name = "gpu|cpu|auto", value_parser = parse_backend)]
    pub device: Option<Backend>,
}

impl DeviceArgs {
    /// The backend `--device` names, else `DOORBELL_DEVICE`'s (an error
    /// naming that variable when it is bad), else auto.
    pub fn backend(&self) -> doorbell::Result<Backend> {
        match self.device {
            Some(b) => Ok(b),
            None => Backend::from_env(),
        }
    }

    /// True when the chosen backend is (or, for auto, will be) a GPU.
    pub fn wants_gpu(&self) -> doorbell::Result<bool> {
        Ok(match self.backend()? {
            Backend::Gpu => true,
            Backend::Cpu => false,
            Backend::Auto => doorbell::gpu_count() > 0,
        })
    }
}

/// 01 — a fused multiply-add over a large vector, checked element by element.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(name = "fma", version, about, long_about = None)]
pub struct FmaArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Elements per vector [default: 67108864 on a GPU, 4194304 on the emulator]
    #[arg(long, value_name = "ELEMENTS", value_parser = ranged(1, FMA_MAX_N))]
    pub n: Option<u64>,
    /// Timed launches [default: 20 on a GPU, 2 on the emulator]
    #[arg(long, value_name = "N", value_parser = ranged(1, u32::MAX as u64))]
    pub iters: Option<u64>,
}

/// 03 — a byte histogram from a user kernel crate, checked against a CPU count.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(name = "histogram", version, about, long_about = None)]
pub struct HistogramArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Input bytes (K, M, G suffixes: powers of 1024) [default: 268435456 on a GPU, 4194304 on the emulator]
    #[arg(long, value_name = "BYTES", value_parser = sized(1, MAX_BYTES))]
    pub n: Option<u64>,
}

/// Device transports the examples can use.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Stores into peers' memory (same process, CUDA IPC, shared memory).
    #[default]
    P2p,
    /// GPU-built RDMA WQEs through the soft NIC (the CPU emulator, thread ranks).
    Ibgda,
}

impl Transport {
    /// The library's name for it (`Communicator::transport` takes it).
    pub fn kind(self) -> TransportKind {
        match self {
            Transport::P2p => TransportKind::P2p,
            Transport::Ibgda => TransportKind::Ibgda,
        }
    }
}

/// 09 — your own fused kernels: a producer → next-rank pipeline and an
/// all-gather, checked value by value.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(name = "fused", version, about, long_about = None)]
pub struct FusedArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// The device transport (ibgda: through the soft NIC)
    #[arg(long, value_enum, default_value_t = Transport::P2p)]
    pub transport: Transport,
    /// Ranks, as threads of this process
    #[arg(long, value_name = "N", default_value = "2", value_parser = ranged(2, 8))]
    pub ranks: u64,
}

/// 02 — ping-pong between two ranks with GPU-initiated puts and signals.
///
/// Two ranks as threads of this process by default; one rank per process
/// when RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set (torchrun),
/// with the job secret in DOORBELL_TOKEN.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(name = "pingpong", version, about, long_about)]
pub struct PingpongArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// The device transport (ibgda: RDMA through the soft NIC, on a GPU or the CPU emulator, thread ranks or one rank per process)
    #[arg(long, value_enum, default_value_t = Transport::P2p)]
    pub transport: Transport,
    /// Round trips inside one kernel launch
    #[arg(long, value_name = "N", default_value = "1000", value_parser = ranged(1, u32::MAX as u64))]
    pub iters: u64,
    /// Bytes put each way per round trip (K, M, G suffixes: powers of 1024)
    #[arg(long, value_name = "BYTES", default_value = "8", value_parser = sized(0, MAX_BYTES))]
    pub size: u64,
}

impl PingpongArgs {
    /// Symmetric heap for `--size`: the buffer, room for the signals, to a
    /// power of two.
    pub fn heap_bytes(&self) -> u64 {
        // `size` is at most MAX_BYTES: no overflow.
        (self.size.max(16) + (1 << 20)).next_power_of_two()
    }

    /// What every rank must agree on.
    pub fn params(&self) -> [(&'static str, u64); 2] {
        [("iters", self.iters), ("size", self.size)]
    }
}

/// P2P transport benchmark against raw floors measured in the same run:
/// signal round trip (checked and unchecked) vs a flag ping-pong, put
/// bandwidth vs two copy kernels; interleaved rounds, medians.
/// Flags follow nccl-tests.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(name = "p2p_bench", version, about, long_about = None)]
pub struct P2pBenchArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Smallest put size, bytes (K, M, G suffixes: powers of 1024)
    #[arg(short = 'b', long = "minbytes", value_name = "BYTES", default_value = "4096", value_parser = sized(1, MAX_BYTES))]
    pub min_bytes: u64,
    /// Largest put size, bytes (K, M, G suffixes) [default: 268435456 on a GPU, 4194304 on the emulator]
    #[arg(short = 'e', long = "maxbytes", alias = "max-size", value_name = "BYTES", value_parser = sized(1, MAX_BYTES))]
    pub max_bytes: Option<u64>,
    /// Multiply the size by this factor from one row to the next
    #[arg(short = 'f', long = "stepfactor", value_name = "F", default_value = "4", value_parser = ranged(2, 1024))]
    pub step_factor: u64,
    /// Timed puts per size, in one launch [default: 1 GiB / size on a GPU, 256 MiB / size on the emulator, clamped to 4..=2000]
    #[arg(short = 'n', long = "iters", value_name = "N", value_parser = ranged(1, 1_000_000))]
    pub iters: Option<u64>,
    /// Iterations of the untimed warm-up launch of the put and of each copy, per size
    #[arg(short = 'w', long = "warmup_iters", alias = "warmup-iters", value_name = "N", default_value = "1", value_parser = ranged(0, 1_000_000))]
    pub warmup_iters: u64,
    /// Round trips timed per launch of each signal variant (floor, unchecked, checked) [default: 20000 on a GPU, 200 on the emulator]
    #[arg(long = "rtt-iters", value_name = "N", value_parser = ranged(1, u32::MAX as u64))]
    pub rtt_iters: Option<u64>,
    /// Rounds of the interleaved measurements (floor, then the transport's
    /// calls, in turn); the table reports each one's median and minimum
    #[arg(long, value_name = "N", default_value = "5", value_parser = ranged(1, 1000))]
    pub rounds: u64,
    /// Bytes per put call (and per piece of the piece-copy floor): one block
    /// per piece, up to one block per SM; a multiple of 16
    #[arg(long, value_name = "BYTES", default_value = "32768", value_parser = piece_bytes)]
    pub piece: u64,
    /// Who calls the put: `block` (one `put_nbi_block` per piece) or `warp`
    /// (pieces of `--piece / warps per block` bytes dealt round-robin to
    /// every warp of the grid, one `put_nbi_warp` each; the same grid)
    #[arg(long = "put-by", value_name = "WHO", default_value = "block", value_parser = ["block", "warp"])]
    pub put_by: String,
    /// When rank 1 launches the kernel that waits for a put's signal:
    /// `after` rank 0's timed put launch has finished (its `quiet` and
    /// signal are inside the timed window; the put runs alone, as the copy
    /// floors do), or `during` it (launched first: on one GPU the waiter
    /// then shares the GPU with the put it waits for)
    #[arg(long = "peer-waits", value_name = "WHEN", default_value = "after", value_parser = ["after", "during"])]
    pub peer_waits: String,
    /// Two GPUs: rank r on GPU r, puts cross NVLink
    #[arg(long)]
    pub spread: bool,
    /// Where p2p_bench.{json,csv,png,svg} and p2p_bench_rtt.csv go
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub out: std::path::PathBuf,
}

/// `p2p_bench`'s settings once the defaults for the backend are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct P2pBenchPlan {
    /// The put sizes, in order.
    pub sizes: Vec<u64>,
    /// The largest size asked for (buffers are this large).
    pub max_bytes: u64,
    /// Timed signal round trips per launch.
    pub rtt_iters: u32,
    /// Rounds of each interleaved measurement.
    pub rounds: u32,
    /// Symmetric heap per rank.
    pub heap_bytes: u64,
    /// Bytes per put call and per piece of the piece-copy floor.
    pub piece: u64,
    /// `--iters`, when given.
    pub iters: Option<u64>,
    /// Without `--iters`: the bytes one timed launch puts (a long launch
    /// makes the launch's own jitter a small part of what is timed).
    pub launch_bytes: u64,
}

impl P2pBenchPlan {
    /// Timed puts for `bytes`, in one launch.
    pub fn iters_for(&self, bytes: u64) -> u32 {
        self.iters.unwrap_or_else(|| (self.launch_bytes / bytes.max(1)).clamp(4, 2000)) as u32
    }
}

/// `--piece`: 1 KiB ..= 16 MiB, a multiple of 16 (the copies move 16-byte vectors).
fn piece_bytes(v: &str) -> Result<u64, String> {
    let n = sized(1024, 16 << 20)(v)?;
    if n % 16 != 0 {
        return Err(format!("{n} is not a multiple of 16"));
    }
    Ok(n)
}

impl P2pBenchArgs {
    /// Applies the defaults for a GPU (`gpu`) or the emulator and checks
    /// the flags against each other.
    pub fn plan(&self, gpu: bool) -> Result<P2pBenchPlan, String> {
        let max = self.max_bytes.unwrap_or(if gpu { 256 << 20 } else { 4 << 20 });
        if self.min_bytes > max {
            return Err(format!(
                "--minbytes {} is larger than --maxbytes {max}; give -b <= -e",
                self.min_bytes
            ));
        }
        Ok(P2pBenchPlan {
            sizes: sweep(self.min_bytes, max, self.step_factor),
            max_bytes: max,
            rtt_iters: self.rtt_iters.unwrap_or(if gpu { 20_000 } else { 200 }) as u32,
            rounds: self.rounds as u32,
            // `max` is at most MAX_BYTES: no overflow.
            heap_bytes: max * 2 + (1 << 20),
            piece: self.piece,
            iters: self.iters,
            launch_bytes: if gpu { 1 << 30 } else { 256 << 20 },
        })
    }
}

/// `allreduce --dtype`: the element type.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeArg {
    /// 32-bit float
    F32,
    /// bfloat16 (f32 accumulation)
    Bf16,
}

/// `allreduce --compute`: what produces each rank's vector.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compute {
    /// No producer: the input formula, a plain all-reduce.
    None,
    /// A hash of (rank, element, step), computed in the fused kernel.
    Hash,
    /// A small dense layer per element (32 multiply-adds), in the fused kernel.
    Gemv,
}

/// `allreduce --transport`: the device transport.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllreduceTransport {
    /// Loads and stores into peers' memory.
    P2p,
    /// GPU-built RDMA WQEs through the soft NIC (its engine kernel on a GPU, slow: see the README).
    Ibgda,
    /// Load/store or the soft NIC per pair of ranks (DOORBELL_RDMA_PEERS).
    Routed,
    /// Every peer through the soft NIC, each put and signal posted by a host thread (the CPU proxy).
    Proxy,
}

impl AllreduceTransport {
    /// The library's name for it.
    pub fn kind(self) -> TransportKind {
        match self {
            AllreduceTransport::P2p => TransportKind::P2p,
            AllreduceTransport::Ibgda => TransportKind::Ibgda,
            AllreduceTransport::Routed => TransportKind::Routed,
            AllreduceTransport::Proxy => TransportKind::Proxy,
        }
    }
}

/// `allreduce --launch-overlap`: programmatic dependent launch of the
/// plain all-reduces.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapArg {
    /// On when every rank has a GPU of its own
    Auto,
    /// Always
    On,
    /// Never
    Off,
}

/// `allreduce --algo`: the all-reduce algorithm.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgoArg {
    /// By size and route
    Auto,
    /// LL one-shot: the flag travels in the data
    Ll,
    /// One-shot
    OneShot,
    /// Two-shot: reduce-scatter, then all-gather
    TwoShot,
    /// Pipelined chunks through rings
    Pipelined,
    /// Pipelined in three hops for ranks forming nodes (--transport routed or proxy with DOORBELL_NODES)
    Hierarchical,
}

/// 04 — sum all-reduce across ranks, checked against a CPU reference; --bench
/// compares it with a CPU-driven baseline, the unfused pair and NCCL.
#[derive(Parser, Debug, Clone)]
#[command(name = "allreduce", version, about, long_about = None)]
pub struct AllreduceArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Ranks (threads of this process)
    #[arg(long, value_name = "N", default_value = "2", value_parser = ranged(1, 8))]
    pub ranks: u64,
    /// Elements per rank [default: 16777216 on a GPU, 100003 on the emulator]
    #[arg(long, value_name = "N", value_parser = ranged(0, 1 << 32))]
    pub elems: Option<u64>,
    /// Element type
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// Bytes per chunk (signalling unit; the fused kernel's production unit; K, M suffixes) [default: by algorithm]
    #[arg(long, value_name = "BYTES", value_parser = sized(1, 1 << 30))]
    pub chunk: Option<u64>,
    /// Producer of each rank's vector (hash, gemv: fused into the all-reduce)
    #[arg(long, value_enum, default_value_t = Compute::None)]
    pub compute: Compute,
    /// All-reduce algorithm, plain and fused (auto: ll, two-shot or pipelined by size and route)
    #[arg(long, value_enum, default_value_t = AlgoArg::Auto)]
    pub algo: AlgoArg,
    /// Device transport (ibgda, routed: through the soft NIC; pipelined algorithm where a pair has no peer pointers)
    #[arg(long, value_enum, default_value_t = AllreduceTransport::P2p)]
    pub transport: AllreduceTransport,
    /// Threads per block of the library's plain all-reduce, --compute none (257..=512: two-shot over p2p only; --bench: applied to the sizes whose plan is two-shot) [default: 512 for two-shot with a GPU per rank, else 256 on a GPU, 64 on the emulator]
    #[arg(long, value_name = "N", value_parser = ranged(32, 1024))]
    pub threads: Option<u64>,
    /// Checked all-reduces (steps)
    #[arg(long, value_name = "N", default_value = "3", value_parser = ranged(1, 1_000_000))]
    pub iters: u64,
    /// Write rank 0's final result here (raw little-endian values of the dtype)
    #[arg(long, value_name = "PATH")]
    pub dump: Option<PathBuf>,
    /// Output over the input (--compute none)
    #[arg(long)]
    pub in_place: bool,
    /// One rank per GPU (rank r on GPU r mod #GPUs), as DOORBELL_RANK_PER_GPU=1
    #[arg(long)]
    pub spread: bool,
    /// Run the benchmark sweep instead of the checked run
    #[arg(long)]
    pub bench: bool,
    /// Largest message of the sweep, bytes per rank (K, M, G suffixes, as nccl-tests' -e) [default: 1073741824 on a GPU, 65536 on the emulator]
    #[arg(short = 'e', long, alias = "maxbytes", value_name = "BYTES", value_parser = sized(8, 1 << 34))]
    pub max_bytes: Option<u64>,
    /// Smallest message of the sweep, bytes per rank (K, M, G suffixes), rounded up to a power of two
    #[arg(short = 'b', long, alias = "minbytes", value_name = "BYTES", default_value = "8", value_parser = sized(2, 1 << 34))]
    pub min_bytes: u64,
    /// Multiply the size by this factor from one row of the sweep to the next
    #[arg(short = 'f', long, alias = "stepfactor", value_name = "F", default_value = "2", value_parser = ranged(2, 1024))]
    pub step_factor: u64,
    /// Timed launches per size and variant [default: by size on a GPU, 2 on the emulator]
    #[arg(short = 'n', long = "bench-iters", value_name = "N", value_parser = ranged(1, 100_000))]
    pub bench_iters: Option<u64>,
    /// Time the benchmark as CUDA-graph replays (ours and NCCL's alike) instead of a host loop
    #[arg(long)]
    pub graph: bool,
    /// Launch each plain all-reduce to overlap the kernel before it on the stream (programmatic dependent launch)
    #[arg(long = "launch-overlap", value_enum, default_value_t = OverlapArg::Auto)]
    pub launch_overlap: OverlapArg,
    /// Directory for the benchmark's JSON and plots
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub out: PathBuf,
}

impl AllreduceArgs {
    /// `--dtype` as the library's type.
    pub fn dtype(&self) -> DType {
        match self.dtype {
            DtypeArg::F32 => DType::F32,
            DtypeArg::Bf16 => DType::Bf16,
        }
    }
    /// `--compute` as the user kernels' code (0: none).
    pub fn compute_code(&self) -> u32 {
        match self.compute {
            Compute::None => 0,
            Compute::Hash => COMPUTE_HASH,
            Compute::Gemv => COMPUTE_GEMV,
        }
    }
    /// `--launch-overlap` (`None`: the library decides).
    pub fn overlap_launch(&self) -> Option<bool> {
        match self.launch_overlap {
            OverlapArg::Auto => None,
            OverlapArg::On => Some(true),
            OverlapArg::Off => Some(false),
        }
    }
    /// `--algo` (`None`: the library picks by size and route).
    pub fn algo(&self) -> Option<Algo> {
        match (self.compute, self.algo) {
            (_, AlgoArg::Auto) => None,
            (_, AlgoArg::Ll) => Some(Algo::Ll),
            (_, AlgoArg::OneShot) => Some(Algo::OneShot),
            (_, AlgoArg::TwoShot) => Some(Algo::TwoShot),
            (_, AlgoArg::Pipelined) => Some(Algo::Pipelined),
            (_, AlgoArg::Hierarchical) => Some(Algo::Hierarchical),
        }
    }
}

/// mlx5 work-queue entry operations.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum WqeOpArg {
    /// NOP
    Nop,
    /// RDMA write
    Write,
    /// RDMA write with immediate
    WriteImm,
    /// RDMA read
    Read,
    /// Atomic fetch-and-add
    FetchAdd,
    /// Atomic compare-and-swap
    Cas,
}

/// Prints the mlx5 WQE the host encoder builds for one work request, one
/// 16-byte unit per line in lowercase hex, nothing else on stdout. Numbers:
/// decimal or 0x hex.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(name = "wqe_dump", version, about, long_about = None)]
pub struct WqeDumpArgs {
    /// The operation
    #[arg(value_enum)]
    pub op: WqeOpArg,
    /// WQE index (16 bit)
    #[arg(long, value_name = "N", value_parser = ranged(0, u16::MAX as u64))]
    pub index: Option<u64>,
    /// QP number (24 bit)
    #[arg(long, value_name = "N", value_parser = ranged(0, 0xff_ffff))]
    pub qpn: Option<u64>,
    /// Remote address (not for nop)
    #[arg(long, value_name = "N", value_parser = ranged(0, u64::MAX))]
    pub raddr: Option<u64>,
    /// Remote key (not for nop)
    #[arg(long, value_name = "N", value_parser = ranged(0, u32::MAX as u64))]
    pub rkey: Option<u64>,
    /// Local address (not for nop)
    #[arg(long, value_name = "N", value_parser = ranged(0, u64::MAX))]
    pub laddr: Option<u64>,
    /// Local key (not for nop)
    #[arg(long, value_name = "N", value_parser = ranged(0, u32::MAX as u64))]
    pub lkey: Option<u64>,
    /// Length, bytes (write, write-imm, read)
    #[arg(long, value_name = "N", value_parser = ranged(0, u32::MAX as u64))]
    pub len: Option<u64>,
    /// Immediate as the receiver reads it (write-imm)
    #[arg(long, value_name = "N", value_parser = ranged(0, u32::MAX as u64))]
    pub imm: Option<u64>,
    /// Addend (fetch-add)
    #[arg(long, value_name = "N", value_parser = ranged(0, u64::MAX))]
    pub add: Option<u64>,
    /// Compare value (cas)
    #[arg(long, value_name = "N", value_parser = ranged(0, u64::MAX))]
    pub compare: Option<u64>,
    /// Swap value (cas)
    #[arg(long, value_name = "N", value_parser = ranged(0, u64::MAX))]
    pub swap: Option<u64>,
    /// Request a completion
    #[arg(long)]
    pub signaled: bool,
    /// Fence behind earlier reads and atomics
    #[arg(long)]
    pub fence: bool,
    /// Solicited event
    #[arg(long)]
    pub solicited: bool,
}

impl WqeDumpArgs {
    /// The request, checked by the encoder's own parser (which also refuses
    /// options that mean nothing for the operation, e.g. `--imm` on a write).
    pub fn request(&self) -> Result<doorbell_kernels::mlx5::WqeRequest, String> {
        let op = WqeOpArg::value_variants()
            .iter()
            .find(|v| **v == self.op)
            .and_then(|v| v.to_possible_value())
            .expect("every op has a name");
        let mut argv = vec![op.get_name().to_string()];
        let values = [
            ("index", self.index),
            ("qpn", self.qpn),
            ("raddr", self.raddr),
            ("rkey", self.rkey),
            ("laddr", self.laddr),
            ("lkey", self.lkey),
            ("len", self.len),
            ("imm", self.imm),
            ("add", self.add),
            ("compare", self.compare),
            ("swap", self.swap),
        ];
        for (name, v) in values {
            if let Some(v) = v {
                argv.push(format!("--{name}={v}"));
            }
        }
        for (name, on) in [("signaled", self.signaled), ("fence", self.fence), ("solicited", self.solicited)] {
            if on {
                argv.push(format!("--{name}"));
            }
        }
        doorbell_kernels::mlx5::dump::parse_args(&argv)
    }
}

/// 08 — IBGDA over the soft NIC against P2P, in one run: put_signal round
/// trip, put bandwidth, WQE post rate, the engine's execution rate, and
/// (with `DOORBELL_SOFTNIC_LINK`) achieved against promised bandwidth.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(name = "ibgda_bench", version, about, long_about = None)]
pub struct IbgdaBenchArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Smallest put size, bytes (K, M, G suffixes: powers of 1024)
    #[arg(short = 'b', long = "minbytes", value_name = "BYTES", default_value = "4096", value_parser = sized(16, MAX_BYTES))]
    pub min_bytes: u64,
    /// Largest put size, bytes (K, M, G suffixes) [default: 268435456 on a GPU, 1048576 on the emulator]
    #[arg(short = 'e', long = "maxbytes", value_name = "BYTES", value_parser = sized(16, MAX_BYTES))]
    pub max_bytes: Option<u64>,
    /// Multiply the size by this factor from one row to the next
    #[arg(short = 'f', long = "stepfactor", value_name = "F", default_value = "4", value_parser = ranged(2, 1024))]
    pub step_factor: u64,
    /// Blocks of rank 0 that put (each its share of the message)
    #[arg(long, value_name = "N", default_value = "8", value_parser = ranged(1, 1024))]
    pub blocks: u64,
    /// put_signal round trips timed per launch [default: 2000 on a GPU, 50 on the emulator]
    #[arg(long = "rtt-iters", value_name = "N", value_parser = ranged(1, 1_000_000))]
    pub rtt_iters: Option<u64>,
    /// WQEs of the post-rate burst (at most the send queue's size) and of
    /// the engine-rate run
    #[arg(long = "wqes", value_name = "N", default_value = "128", value_parser = ranged(1, 1_000_000))]
    pub wqes: u64,
    /// Blocks of rank 0 in the lane-post run (each one warp posting a
    /// WQE per lane on its own QP, `block mod DOORBELL_IBGDA_QPS`)
    #[arg(long = "lane-blocks", value_name = "N", default_value = "8", value_parser = ranged(1, 64))]
    pub lane_blocks: u64,
    /// Warp-wide posts (32 WQEs each) per block of the lane-post run
    #[arg(long = "lane-rounds", value_name = "N", default_value = "256", value_parser = ranged(1, 100_000))]
    pub lane_rounds: u64,
    /// Puts per lane in each call of the one-warp batched run
    /// (`put_lanes_many_raw`: 32 × N WQEs behind one doorbell while they
    /// fit the send queue)
    #[arg(long = "lane-batch", value_name = "N", default_value = "4", value_parser = ranged(1, 1024))]
    pub lane_batch: u64,
    /// Rounds of every measurement; the table reports the median
    #[arg(long, value_name = "N", default_value = "3", value_parser = ranged(1, 1000))]
    pub rounds: u64,
    /// Two GPUs: rank r on GPU r (the engine fences at sys scope)
    #[arg(long)]
    pub spread: bool,
    /// Where ibgda_bench.json goes
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub out: std::path::PathBuf,
}

/// `proxy_bench`: GPU-initiated (IBGDA) against the CPU proxy on the same
/// soft NIC, in one run.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "proxy_bench",
    about = "IBGDA vs the CPU proxy: 8-byte put_signal round trip and message rate, the all-reduce (fused and CPU-driven), the embedding exchange"
)]
pub struct ProxyBenchArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Ranks (thread ranks of one process). Above 2 they must form modeled
    /// nodes (DOORBELL_NODES): the GPU-initiated side of the collectives is
    /// then the routed transport (IBGDA between nodes, load/store inside
    /// one), and the proxy routes the same way
    #[arg(long, value_name = "N", default_value = "2", value_parser = ranged(2, doorbell::coll::MAX_RANKS as u64))]
    pub ranks: u64,
    /// Pairs measuring the round trip and the rates at once: rank i of the
    /// first node with rank i of the second, for i below N [default: every
    /// rank of a node]
    #[arg(long, value_name = "N", value_parser = ranged(1, doorbell::coll::MAX_RANKS as u64))]
    pub pairs: Option<u64>,
    /// put_signal round trips timed per launch [default: 2000 on a GPU, 50 on the emulator]
    #[arg(long = "rtt-iters", value_name = "N", value_parser = ranged(1, 1_000_000))]
    pub rtt_iters: Option<u64>,
    /// 8-byte non-blocking puts one warp posts per message-rate launch
    /// [default: 4096 on a GPU, 256 on the emulator]
    #[arg(long = "wqes", value_name = "N", value_parser = ranged(1, 1_000_000))]
    pub wqes: Option<u64>,
    /// Blocks of rank 0 in the many-warps rate (each one warp posting a
    /// put per lane, `--lane-rounds` times)
    #[arg(long = "lane-blocks", value_name = "N", default_value = "8", value_parser = ranged(1, 64))]
    pub lane_blocks: u64,
    /// Warp-wide posts (32 puts each) per block of the many-warps rate
    /// [default: 64 on a GPU, 4 on the emulator]
    #[arg(long = "lane-rounds", value_name = "N", value_parser = ranged(1, 100_000))]
    pub lane_rounds: Option<u64>,
    /// Bytes per rank of the all-reduce comparison (K, M suffixes),
    /// comma-separated [default: 4K,256K,4M,16M on a GPU, 4K,64K on the emulator]
    #[arg(long = "ar-sizes", value_name = "BYTES,..", value_delimiter = ',', value_parser = sized(4, 1 << 30))]
    pub ar_sizes: Option<Vec<u64>>,
    /// Chunk sizes of the all-reduce comparison (K, M suffixes),
    /// comma-separated: every size runs with each [default: the fused
    /// plan's own, and the CPU-driven all-reduce in one chunk]
    #[arg(long = "ar-chunks", value_name = "BYTES,..", value_delimiter = ',', value_parser = sized(4, 1 << 30))]
    pub ar_chunks: Option<Vec<u64>>,
    /// Timed steps of each all-reduce size and way [default: 10 on a GPU, 3 on the emulator]
    #[arg(long = "ar-steps", value_name = "N", value_parser = ranged(1, 10_000))]
    pub ar_steps: Option<u64>,
    /// Row widths (elements) of the embedding exchange comparison,
    /// comma-separated [default: 32,128,512 on a GPU, 8,16 on the emulator]
    #[arg(long = "emb-dims", value_name = "D,..", value_delimiter = ',', value_parser = ranged(1, 4096))]
    pub emb_dims: Option<Vec<u64>>,
    /// Samples per rank of the embedding exchange (4 tables, 16384 rows,
    /// 8 ids per bag on a GPU; 2 x 64 rows, 3 ids on the emulator)
    /// [default: 256 on a GPU, 4 on the emulator]
    #[arg(long = "emb-batch", value_name = "N", value_parser = ranged(1, 65536))]
    pub emb_batch: Option<u64>,
    /// Timed steps (forward, then backward) of each embedding shape; 0
    /// leaves the embedding exchange out [default: 5 on a GPU, 2 on the emulator]
    #[arg(long = "emb-steps", value_name = "N", value_parser = ranged(0, 10_000))]
    pub emb_steps: Option<u64>,
    /// Rounds: each sets IBGDA up, measures it (and P2P), closes it, then
    /// the same over the CPU proxy; the report takes the medians
    #[arg(long, value_name = "N", default_value = "3", value_parser = ranged(1, 1000))]
    pub rounds: u64,
    /// Where proxy_bench.json and the figures go
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub out: std::path::PathBuf,
    /// Draw the figures of a stored proxy_bench.json into --out; run nothing
    #[arg(long, value_name = "JSON")]
    pub replot: Option<std::path::PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn sizes_take_nccl_tests_suffixes() {
        for (text, want) in [
            ("8", 8),
            ("0", 0),
            ("4096", 4096),
            ("0x1000", 4096),
            ("1_024", 1024),
            ("1K", 1 << 10),
            ("64k", 64 << 10),
            ("128M", 128 << 20),
            ("256m", 256 << 20),
            ("1G", 1 << 30),
            ("2T", 2 << 40),
            (" 16K ", 16 << 10),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn bad_sizes_are_errors_naming_the_text() {
        for (text, needle) in [
            ("", "not a size"),
            ("K", "not a size"),
            ("1.5M", "not a size"),
            ("-1", "not a size"),
            ("12X", "unknown size suffix `X`"),
            ("4KB", "unknown size suffix `B`"),
            ("0x10K", "not a size"),
            ("16777216T", "too large"),
            ("18446744073709551616", "not a size"),
        ] {
            let e = parse_size(text).expect_err(text);
            assert!(e.contains(needle) && e.contains(&format!("`{text}`")), "{text}: {e}");
        }
        let limit = sized(16, 64 << 30);
        assert_eq!(limit("256M"), Ok(256 << 20));
        let e = limit("128G").unwrap_err();
        assert!(
            e.contains("out of range") && e.contains("16..=64G") && e.contains("137438953472"),
            "{e}"
        );
        assert!(limit("8").unwrap_err().contains("out of range"));
    }

    #[test]
    fn sizes_print_as_they_parse() {
        for (bytes, text) in [
            (0, "0"),
            (8, "8"),
            (1000, "1000"),
            (1536, "1536"),
            (1 << 10, "1K"),
            (3 << 20, "3M"),
            (1 << 30, "1G"),
            (1 << 40, "1T"),
        ] {
            assert_eq!(format_size(bytes), text);
            assert_eq!(parse_size(text), Ok(bytes));
        }
    }

    #[test]
    fn sweeps_multiply_and_stop_at_the_largest_size() {
        assert_eq!(sweep(8, 64, 2), [8, 16, 32, 64]);
        assert_eq!(sweep(4096, 65536, 4), [4096, 16384, 65536]);
        assert_eq!(sweep(1000, 9000, 3), [1000, 3000, 9000]);
        assert_eq!(sweep(5, 4, 2), Vec::<u64>::new());
        assert_eq!(sweep(1 << 62, u64::MAX, 4), [1 << 62]);
        assert_eq!(sweep(7, 100, 1), [7]);
        let a = P2pBenchArgs::try_parse_from(["p2p_bench", "-b", "4K", "-e", "256K", "-f", "4"]).unwrap();
        assert_eq!(a.plan(false).unwrap().sizes, [4 << 10, 16 << 10, 64 << 10, 256 << 10]);
        let a = IbgdaBenchArgs::try_parse_from(["ibgda_bench", "--maxbytes", "1M"]).unwrap();
        assert_eq!(a.max_bytes, Some(1 << 20));
        assert!(PingpongArgs::try_parse_from(["pingpong", "--size", "65G"]).is_err());
        assert_eq!(PingpongArgs::try_parse_from(["pingpong", "--size", "4K"]).unwrap().size, 4096);
    }

    #[test]
    fn allreduce_sweep_flags_take_nccl_tests_syntax_beside_the_long_names() {
        AllreduceArgs::command().debug_assert();
        let a = AllreduceArgs::try_parse_from(["allreduce", "--bench", "-b", "1K", "-e", "128M", "-f", "4", "-n", "3"]).unwrap();
        assert_eq!(
            (a.min_bytes, a.max_bytes, a.step_factor, a.bench_iters),
            (1024, Some(128 << 20), 4, Some(3))
        );
        let a = AllreduceArgs::try_parse_from(["allreduce", "--max-bytes", "256M", "--min-bytes", "64", "--chunk", "64K"]).unwrap();
        assert_eq!(
            (a.min_bytes, a.max_bytes, a.step_factor, a.chunk),
            (64, Some(256 << 20), 2, Some(64 << 10))
        );
        assert_eq!(
            (a.dtype(), a.compute_code(), a.overlap_launch(), a.algo()),
            (DType::F32, 0, None, None)
        );
        for bad in [["-e", "32G"], ["-e", "4"], ["-b", "1.5K"], ["-f", "1"], ["--algo", "ring"]] {
            let e = AllreduceArgs::try_parse_from(["allreduce", bad[0], bad[1]]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
        let a = AllreduceArgs::try_parse_from(["allreduce", "--compute", "gemv", "--algo", "two-shot", "--launch-overlap", "off"]).unwrap();
        assert_eq!(
            (a.compute_code(), a.algo(), a.overlap_launch()),
            (COMPUTE_GEMV, Some(Algo::TwoShot), Some(false))
        );
        assert_eq!(AllreduceTransport::Routed.kind(), TransportKind::Routed);
        assert_eq!(Transport::P2p.kind(), TransportKind::P2p);
        assert_eq!(Transport::Ibgda.kind(), TransportKind::Ibgda);
    }
}
