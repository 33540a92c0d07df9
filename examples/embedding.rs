//! Host side of the embedding exchange (`embedding_exchange` example, its
//! benchmark and `tests/tests/embedding.rs`): the problem's exact
//! definitions, id generation (uniform / Zipf), a sequential CPU reference,
//! and drivers for the fused kernels ([`Exchange`]) and for the host-driven
//! baselines ([`Baseline`]). Device code and the protocol:
//! `doorbell_example_kernels::embedding`.

use doorbell::comm::{Communicator, SymBuffer};
use doorbell::{DeviceBuffer, Error, ForTransport, Function, LaunchConfig, Result, Stream};
use doorbell_example_kernels::embedding::{
    self as k, emb_backward, emb_bl_accumulate, emb_bl_apply, emb_bl_count, emb_bl_gather, emb_bl_grad_scatter, emb_bl_pool,
    emb_bl_scatter, emb_copy_words, emb_forward, emb_forward_pull, emb_put_floor, emb_zero_words, EmbBufs, EmbShape, PAD,
};
use doorbell_kernels::transport::{Ibgda, P2p, Routed};

pub use doorbell::coll::TransportKind;

type Fwd<T> = Function<<emb_forward as ForTransport<T>>::Kernel>;
type Bwd<T> = Function<<emb_backward as ForTransport<T>>::Kernel>;
type Pull<T> = Function<<emb_forward_pull as ForTransport<T>>::Kernel>;
type Floor = Function<<emb_put_floor as ForTransport<P2p>>::Kernel>;

/// The transport handle and its entries (forward, backward, pull where
/// peer pointers may exist).
enum Kernels {
    P2p(P2p, Fwd<P2p>, Bwd<P2p>, Pull<P2p>),
    Ibgda(Ibgda, Fwd<Ibgda>, Bwd<Ibgda>),
    Routed(Box<Routed>, Fwd<Routed>, Bwd<Routed>, Pull<Routed>),
}

/// Runs `$body` with `$t` (the handle), `$fwd` and `$bwd` (the entries) of
/// whichever transport `$k` holds.
macro_rules! with_transport {
    ($k:expr, |$t:ident, $fwd:ident, $bwd:ident| $body:expr) => {
        match $k {
            Kernels::P2p(t, f, b, _) => {
                let ($t, $fwd, $bwd) = (*t, f, b);
                $body
            }
            Kernels::Ibgda(t, f, b) => {
                let ($t, $fwd, $bwd) = (*t, f, b);
                $body
            }
            Kernels::Routed(t, f, b, _) => {
                let ($t, $fwd, $bwd) = (**t, f, b);
                $body
            }
        }
    };
}

impl Kernels {
    /// Registers per thread of the entry that uses the most (driver
    /// attributes; `None` on the emulator).
    fn max_registers(&self) -> Option<u32> {
        let regs = match self {
            Kernels::P2p(_, f, b, p) => [f.attributes(), b.attributes(), p.attributes()],
            Kernels::Ibgda(_, f, b) => [f.attributes(), b.attributes(), None],
            Kernels::Routed(_, f, b, p) => [f.attributes(), b.attributes(), p.attributes()],
        };
        regs.iter().flatten().map(|a| a.registers.max(0) as u32).max()
    }
}

/// The problem: the same on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Ranks.
    pub ranks: u32,
    /// Tables.
    pub tables: u32,
    /// Rows of every table.
    pub rows: u32,
    /// Elements per row.
    pub dim: u32,
    /// Samples per rank.
    pub batch: u32,
    /// Ids per bag.
    pub pooling: u32,
}

impl Problem {
    /// Lookups of one rank (`tables * batch * pooling`), padding included.
    pub fn lookups(&self) -> usize {
        self.tables as usize * self.batch as usize * self.pooling as usize
    }
    /// Rows of every table per rank.
    pub fn shard_rows(&self) -> u32 {
        self.rows.div_ceil(self.ranks)
    }
    /// f32 of one rank's shard (`[table][local row][dim]`).
    pub fn shard_len(&self) -> usize {
        self.tables as usize * self.shard_rows() as usize * self.dim as usize
    }
    /// f32 of one rank's output (`[sample][table][dim]`).
    pub fn out_len(&self) -> usize {
        self.batch as usize * self.tables as usize * self.dim as usize
    }
    /// Checks the limits of the kernels.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.ranks == 0 || self.ranks > 64 {
            return Err(format!("{} ranks: use 1..=64", self.ranks));
        }
        if self.tables == 0 || self.tables > k::MAX_TABLES {
            return Err(format!("{} tables: use 1..={}", self.tables, k::MAX_TABLES));
        }
        if self.dim == 0 || self.dim > k::MAX_DIM {
            return Err(format!("dim {}: use 1..={}", self.dim, k::MAX_DIM));
        }
        if self.rows == 0 || self.rows == PAD {
            return Err(format!("{} rows: use 1..={}", self.rows, PAD - 1));
        }
        if self.batch == 0 || self.pooling == 0 {
            return Err("batch and pooling must be at least 1".into());
        }
        if self.lookups() as u64 > k::MAX_LOOKUPS {
            return Err(format!(
                "{} lookups per rank: keep tables * batch * pooling at most 2^29",
                self.lookups()
            ));
        }
        Ok(())
    }
}

/// Element `k` of global row `j` of table `t` at the start:
/// `((t*7 + j*13 + k*3) mod 23) - 11`.
pub fn init_value(t: u32, j: u32, k: u32) -> f32 {
    ((t as u64 * 7 + j as u64 * 13 + k as u64 * 3) % 23) as f32 - 11.0
}

/// Upstream gradient: `((rank*5 + sample*3 + table*7 + k) mod 9) - 4`.
pub fn grad_value(rank: u32, sample: u32, table: u32, k: u32) -> f32 {
    ((rank as u64 * 5 + sample as u64 * 3 + table as u64 * 7 + k as u64) % 9) as f32 - 4.0
}

/// All tables, `[table][global row][dim]`, at the start.
pub fn initial_tables(p: &Problem) -> Vec<f32> {
    let mut v = Vec::with_capacity(p.tables as usize * p.rows as usize * p.dim as usize);
    for t in 0..p.tables {
        for j in 0..p.rows {
            v.extend((0..p.dim).map(|k| init_value(t, j, k)));
        }
    }
    v
}

/// Rank `rank`'s shard of `tables` (`[table][global row][dim]`); rows past
/// the end are zero.
pub fn shard_of(p: &Problem, tables: &[f32], rank: u32) -> Vec<f32> {
    let (d, sr) = (p.dim as usize, p.shard_rows());
    let mut v = vec![0f32; p.shard_len()];
    for t in 0..p.tables as usize {
        for l in 0..sr {
            let j = l * p.ranks + rank;
            if j < p.rows {
                let src = (t * p.rows as usize + j as usize) * d;
                let dst = (t * sr as usize + l as usize) * d;
                v[dst..dst + d].copy_from_slice(&tables[src..src + d]);
            }
        }
    }
    v
}

/// Writes `shard` of `rank` back into `tables` (`[table][global row][dim]`).
pub fn unshard(p: &Problem, tables: &mut [f32], shard: &[f32], rank: u32) {
    let (d, sr) = (p.dim as usize, p.shard_rows());
    for t in 0..p.tables as usize {
        for l in 0..sr {
            let j = l * p.ranks + rank;
            if j < p.rows {
                let dst = (t * p.rows as usize + j as usize) * d;
                let src = (t * sr as usize + l as usize) * d;
                tables[dst..dst + d].copy_from_slice(&shard[src..src + d]);
            }
        }
    }
}

/// splitmix64: a small deterministic generator.
pub struct Rng(u64);
impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Every rank's lookups, `[rank][table][sample][pooling]`: full bags of
/// ids drawn uniformly (`zipf == 0`) or from a Zipf law with exponent
/// `zipf` over the rows (row 0 the most frequent).
pub fn generate_ids(p: &Problem, zipf: f64, seed: u64) -> Vec<Vec<u32>> {
    let cdf: Option<Vec<f64>> = (zipf > 0.0).then(|| {
        let mut acc = 0.0;
        let mut c: Vec<f64> = (1..=p.rows as u64)
            .map(|r| {
                acc += (r as f64).powf(-zipf);
                acc
            })
            .collect();
        let total = acc;
        c.iter_mut().for_each(|x| *x /= total);
        c
    });
    (0..p.ranks)
        .map(|r| {
            let mut rng = Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(r as u64));
            (0..p.lookups())
                .map(|_| match &cdf {
                    None => (rng.next_u64() % p.rows as u64) as u32,
                    Some(c) => {
                        let x = rng.next_f64();
                        c.partition_point(|v| *v < x).min(p.rows as usize - 1) as u32
                    }
                })
                .collect()
        })
        .collect()
}

/// The first id out of range: an error naming rank, table, sample, position.
pub fn validate_ids(p: &Problem, ids: &[Vec<u32>]) -> std::result::Result<(), String> {
    for (r, v) in ids.iter().enumerate() {
        if v.len() != p.lookups() {
            return Err(format!(
                "rank {r} has {} ids, expected tables*batch*pooling = {}",
                v.len(),
                p.lookups()
            ));
        }
        if let Some(i) = v.iter().position(|&id| id != PAD && id >= p.rows) {
            let per = p.batch as usize * p.pooling as usize;
            return Err(format!(
                "id {} (rank {r}, table {}, sample {}, position {}) is out of range: tables have {} rows \
                 (0xFFFFFFFF is padding); nothing was run",
                v[i],
                i / per,
                i % per / p.pooling as usize,
                i % p.pooling as usize,
                p.rows
            ));
        }
    }
    Ok(())
}

/// The sequential reference forward of one rank: `[sample][table][dim]`,
/// each bag summed in position order.
pub fn reference_forward(p: &Problem, tables: &[f32], ids: &[u32]) -> Vec<f32> {
    let d = p.dim as usize;
    let mut out = vec![0f32; p.out_len()];
    for s in 0..p.batch as usize {
        for t in 0..p.tables as usize {
            let o = &mut out[(s * p.tables as usize + t) * d..][..d];
            for q in 0..p.pooling as usize {
                let id = ids[(t * p.batch as usize + s) * p.pooling as usize + q];
                if id == PAD {
                    continue;
                }
                let row = &tables[(t * p.rows as usize + id as usize) * d..][..d];
                o.iter_mut().zip(row).for_each(|(a, b)| *a += *b);
            }
        }
    }
    out
}

/// The sequential reference backward + SGD over every rank's lookups.
pub fn reference_backward(p: &Problem, tables: &mut [f32], ids: &[Vec<u32>], lr: f32) {
    let d = p.dim as usize;
    let mut sum: std::collections::BTreeMap<(u32, u32), Vec<f32>> = Default::default();
    for (r, v) in ids.iter().enumerate() {
        for t in 0..p.tables {
            for s in 0..p.batch {
                for q in 0..p.pooling {
                    let id = v[((t * p.batch + s) * p.pooling + q) as usize];
                    if id == PAD {
                        continue;
                    }
                    let acc = sum.entry((t, id)).or_insert_with(|| vec![0.0; d]);
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a += grad_value(r as u32, s, t, k as u32);
                    }
                }
            }
        }
    }
    for ((t, id), g) in sum {
        let row = &mut tables[(t as usize * p.rows as usize + id as usize) * d..][..d];
        row.iter_mut().zip(&g).for_each(|(w, g)| *w -= lr * *g);
    }
}

/// One rank's upstream gradient `[sample][table][dim]`.
pub fn upstream_grad(p: &Problem, rank: u32) -> Vec<f32> {
    let mut g = Vec::with_capacity(p.out_len());
    for s in 0..p.batch {
        for t in 0..p.tables {
            g.extend((0..p.dim).map(|k| grad_value(rank, s, t, k)));
        }
    }
    g
}

/// Traffic of one step's forward: lookups sent with and without dedup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Traffic {
    /// Non-padding lookups over all ranks.
    pub lookups: u64,
    /// Unique (table, id) keys per (requester, owner), summed over ranks:
    /// the rows the fused exchange moves.
    pub unique: u64,
    /// Of those, rows that stay on their own rank.
    pub unique_local: u64,
    /// Largest (requester, owner) list: the capacity the exchange needs.
    pub max_pair: u64,
}

impl Traffic {
    /// Bytes of rows one direction moves without / with dedup, dim `d`.
    pub fn row_bytes(&self, d: u32) -> (u64, u64) {
        (self.lookups * d as u64 * 4, self.unique * d as u64 * 4)
    }
}

/// Most lookups any owner receives: what a [`Baseline`]'s receive
/// buffers must hold (`max_recv` of [`Baseline::new`]).
pub fn max_recv(p: &Problem, ids: &[Vec<u32>]) -> u64 {
    let mut per = vec![0u64; p.ranks as usize];
    for v in ids {
        for &id in v {
            if id < p.rows {
                per[(id % p.ranks) as usize] += 1;
            }
        }
    }
    per.into_iter().max().unwrap_or(0)
}

/// Counts the traffic of `ids` (every rank's).
pub fn traffic(p: &Problem, ids: &[Vec<u32>]) -> Traffic {
    let mut tr = Traffic::default();
    for (r, v) in ids.iter().enumerate() {
        let mut seen = std::collections::HashSet::new();
        let mut per_owner = vec![0u64; p.ranks as usize];
        for (i, &id) in v.iter().enumerate() {
            if id == PAD || id >= p.rows {
                continue;
            }
            tr.lookups += 1;
            let t = i / (p.batch as usize * p.pooling as usize);
            if seen.insert((t, id)) {
                tr.unique += 1;
                per_owner[(id % p.ranks) as usize] += 1;
                if (id % p.ranks) as usize == r {
                    tr.unique_local += 1;
                }
            }
        }
        tr.max_pair = tr.max_pair.max(per_owner.into_iter().max().unwrap_or(0));
    }
    tr
}

/// Most blocks per SM the fused kernels' grids ask for: more would only add
/// warps that wait at the same barriers.
pub const MAX_BLOCKS_PER_SM: u32 = 2;

/// What bounds how many blocks one SM holds at once (sm_90: 65 536
/// registers, 2048 threads, 32 blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmLimits {
    /// 32-bit registers per SM.
    pub registers: u32,
    /// Threads per SM.
    pub threads: u32,
    /// Blocks per SM.
    pub blocks: u32,
}

impl SmLimits {
    /// An H100 / H200 SM (compute capability 9.0).
    pub const SM_90: SmLimits = SmLimits {
        registers: 65536,
        threads: 2048,
        blocks: 32,
    };

    /// The limits of `comm`'s GPU as the driver reports them (`None` on the
    /// emulator, where every thread of a launch runs at once).
    pub fn of(comm: &Communicator) -> Option<SmLimits> {
        use cudarc::driver::sys::CUdevice_attribute::*;
        let ctx = comm.device().as_cuda()?;
        let get = |a| ctx.attribute(a).ok().map(|v| v.max(0) as u32);
        Some(SmLimits {
            registers: get(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?,
            threads: get(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
            blocks: get(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)?,
        })
    }
}

/// Blocks of `threads` threads of a kernel using `registers` registers per
/// thread that one SM holds at once: registers are allocated per warp in
/// units of 256 (every architecture since sm_50), so a warp takes
/// `ceil(32 × registers / 256) × 256` of them. (The fused kernels' 16 bytes
/// of shared memory never bound it.) 0: such a block does not fit at all.
pub fn resident_blocks_per_sm(sm: &SmLimits, registers: u32, threads: u32) -> u32 {
    let warps = threads.div_ceil(32).max(1);
    let per_warp = (32 * registers.max(1)).div_ceil(256) * 256;
    let by_registers = sm.registers / per_warp / warps;
    let by_threads = sm.threads / (32 * warps);
    by_registers.min(by_threads).min(sm.blocks)
}

/// The grid [`launch_config_for`] asks for, fitted to what the kernels it
/// launches allow: `requested` assumes [`MAX_BLOCKS_PER_SM`] blocks per SM;
/// when a kernel's registers leave room for only `per_sm` (fewer), the grid
/// shrinks by the same factor, rounded down, so it stays within the SMs the
/// request was sized for (every rank's grid, when ranks share a GPU). Err
/// when even the fitted grid cannot be resident on `sms` SMs (a grid larger
/// than the request's sizing allows).
pub fn fit_grid(requested: u32, per_sm: u32, sms: u32) -> std::result::Result<u32, String> {
    if per_sm == 0 {
        return Err("a block of the exchange's kernels does not fit on one SM (registers or threads); use fewer threads per block".into());
    }
    let blocks = if per_sm < MAX_BLOCKS_PER_SM {
        (requested * per_sm / MAX_BLOCKS_PER_SM).max(1)
    } else {
        requested
    };
    if blocks > per_sm * sms {
        return Err(format!(
            "{blocks} blocks cannot all be resident at once ({per_sm} per SM, {sms} SMs) and the exchange's grid barriers need them to be; size the grid with launch_config_for"
        ));
    }
    Ok(blocks)
}

/// The phases of [`ExchangeError::Timeout`] that are grid barriers (the
/// kernels' `grid_sync_or_report` steps): a timeout there means a block of
/// the grid did not run, not that a peer was slow.
pub const GRID_BARRIER_PHASES: [u32; 5] = [0, 3, 4, 6, 8];

/// The blocks per rank [`launch_config_for`] asks for on a GPU of `sms` SMs
/// shared by `ranks_per_gpu` ranks: [`MAX_BLOCKS_PER_SM`] per SM of the
/// rank's share, the soft NIC engines' SMs (one per rank) left out when
/// `soft_nic`; at most 256.
pub fn grid_request(sms: u32, ranks_per_gpu: u32, soft_nic: bool) -> u32 {
    let rpg = ranks_per_gpu.max(1);
    let free = if soft_nic { sms.saturating_sub(rpg).max(1) } else { sms };
    (MAX_BLOCKS_PER_SM * free / rpg).clamp(1, 256)
}

/// Launch shape of the exchange's kernels on a device: the same on every
/// rank, small enough that every rank's grid is resident at once (beside
/// the soft NIC engines, one SM per rank of the GPU, when the transport
/// goes through it: `soft_nic`), at [`MAX_BLOCKS_PER_SM`] blocks per SM.
///
/// **Residency is a property of the kernel, not only of the SM count**:
/// [`Exchange::with_transport`] fits the grid to the registers of the
/// kernels it loads ([`fit_grid`]). Over IBGDA and routed transports the
/// forward uses ~180 registers a thread, so an SM holds one block of 256
/// threads, not two; a grid of two blocks per SM then starts only half its
/// blocks, which wait at the first grid barrier for blocks that cannot
/// start until they leave (a stall of the whole wait budget).
pub fn launch_config_for(comm: &Communicator, ranks_per_gpu: u32, soft_nic: bool) -> LaunchConfig {
    let dev = comm.device();
    if dev.is_gpu() {
        let sms = dev.multiprocessor_count() as u32;
        LaunchConfig::linear(grid_request(sms, ranks_per_gpu, soft_nic), 256)
    } else {
        LaunchConfig::linear(2, 64)
    }
    .with_shared_mem(k::SHARED_BYTES)
}

/// [`launch_config_for`] a transport of loads and stores (P2P).
pub fn launch_config(comm: &Communicator, ranks_per_gpu: u32) -> LaunchConfig {
    launch_config_for(comm, ranks_per_gpu, false)
}

fn err(msg: impl Into<String>) -> Error {
    Error::Comm(msg.into())
}

/// Symmetric heap the fused exchange needs per rank for `p` with list
/// capacity `cap`.
pub fn heap_bytes_needed(p: &Problem, cap: u32) -> u64 {
    let (n, c, d) = (p.ranks as u64, cap as u64, p.dim as u64);
    let parts = [
        p.shard_len() as u64 * 4,
        2 * n * c * 8,
        n * 8,
        n * c * d * 4,
        2 * n * 8,
        n * c * d * 4,
        n * 8,
        n * c * 8,
        (n + 1) * k::ERR_WORDS as u64 * 4,
    ];
    parts.iter().map(|b| b + 256).sum::<u64>() + (1 << 20)
}

/// One rank's fused exchange: its buffers, kernels and epoch.
pub struct Exchange<'c> {
    comm: &'c Communicator,
    /// The shape passed to the kernels.
    pub shape: EmbShape,
    tables: SymBuffer<'c, f32>,
    _sym: Vec<SymBuffer<'c, u64>>,
    _sym_f: Vec<SymBuffer<'c, f32>>,
    keys: DeviceBuffer<u64>,
    _local: Vec<DeviceBuffer<u32>>,
    _gacc: DeviceBuffer<f32>,
    _errs: SymBuffer<'c, u32>,
    _verdict: DeviceBuffer<u64>,
    status: DeviceBuffer<u32>,
    stamps: DeviceBuffer<u64>,
    zero: Function<emb_zero_words>,
    /// The benchmark's put floor (P2P only).
    floor: Option<Floor>,
    bufs: EmbBufs,
    kernels: Kernels,
    /// Launch shape (the same on every rank): the one asked for, its grid
    /// fitted on a GPU to how many blocks the kernels' registers let every
    /// SM hold ([`fit_grid`]).
    pub cfg: LaunchConfig,
    /// On a GPU: the most registers per thread of the kernels it launches,
    /// as the driver compiled them, and how many blocks of `cfg` one SM
    /// holds at that count.
    pub residency: Option<(u32, u32)>,
    epoch: u64,
    /// The epoch of the last backward launched (0: none).
    bwd_epoch: u64,
    /// Backward launches so far (the owners' gradient signals count them).
    bwd_seq: u64,
    budget_ns: u64,
    /// Request lists this long or longer go out in slices from every block
    /// (see `emb_forward`).
    sliced_bytes: u64,
}

impl<'c> Exchange<'c> {
    /// Collective: allocates the buffers for `p` with request lists of `cap`
    /// keys per (requester, owner) and loads the kernels (P2P transport).
    pub fn new(comm: &'c Communicator, p: &Problem, cap: u32, cfg: LaunchConfig) -> Result<Exchange<'c>> {
        Self::with_transport(comm, p, cap, cfg, TransportKind::P2p)
    }

    /// [`Self::new`] over `transport`. IBGDA and routed (`DOORBELL_RDMA_PEERS`)
    /// are set up on first use (collective), on the CPU emulator only for
    /// now. Every put of the push kernels reads from a symmetric buffer
    /// (request lists, table shard, gradient staging), so nothing needs
    /// `Communicator::ibgda_register`. The pull forward needs peer pointers:
    /// not over IBGDA.
    ///
    /// On a GPU the grid of `cfg` is fitted to the loaded kernels'
    /// registers ([`fit_grid`]): the IBGDA and routed entries hold one
    /// block of 256 threads per SM where P2P's hold three. Every rank
    /// computes the same grid when every rank's GPU is the same model
    /// (the kernels' signal counts assume one grid size on every rank).
    pub fn with_transport(
        comm: &'c Communicator,
        p: &Problem,
        cap: u32,
        cfg: LaunchConfig,
        transport: TransportKind,
    ) -> Result<Exchange<'c>> {
        p.check().map_err(err)?;
        if p.ranks as usize != comm.world_size() {
            return Err(err(format!(
                "the problem has {} ranks, the communicator {}",
                p.ranks,
                comm.world_size()
            )));
        }
        let dev = comm.device();
        let m = comm.load_module(&crate::USER_KERNELS)?;
        let (n, c, d) = (p.ranks as usize, cap.max(1) as usize, p.dim as usize);
        let hash_bits = (2 * p.lookups()).next_power_of_two().trailing_zeros().max(4);
        let shape = EmbShape {
            tables: p.tables,
            dim: p.dim,
            batch: p.batch,
            pooling: p.pooling,
            rows: p.rows,
            shard_rows: p.shard_rows(),
            cap: c as u32,
            hash_bits,
        };
        let tables = comm.alloc::<f32>(p.shard_len())?;
        let req_in = comm.alloc::<u64>(2 * n * c)?;
        let req_sig = comm.alloc::<u64>(n)?;
        let rows_in = comm.alloc::<f32>(n * c * d)?;
        let rows_sig = comm.alloc::<u64>(2 * n)?;
        let grad_in = comm.alloc::<f32>(n * c * d)?;
        let grad_sig = comm.alloc::<u64>(n)?;
        let req_out = comm.alloc::<u64>(n * c)?;
        let errs = comm.alloc::<u32>((n + 1) * k::ERR_WORDS)?;
        let mut keys = dev.alloc_zeroed::<u64>(1 << hash_bits)?;
        let mut vals = dev.alloc_zeroed::<u32>(1 << hash_bits)?;
        let mut slot_of = dev.alloc_zeroed::<u32>(p.lookups())?;
        let mut counts = dev.alloc_zeroed::<u32>(2 * n)?;
        let mut rcounts = dev.alloc_zeroed::<u32>(2 * n)?;
        let mut gacc = dev.alloc_zeroed::<f32>(p.shard_len())?;
        let mut grid = dev.alloc_zeroed::<u32>(2)?;
        let mut verdict = dev.alloc_zeroed::<u64>(1)?;
        let mut status = dev.alloc_zeroed::<u32>(k::STATUS_WORDS)?;
        let stamps = dev.alloc_zeroed::<u64>(k::STAMP_WORDS)?;
        let kernels = match transport {
            TransportKind::P2p => Kernels::P2p(comm.p2p()?, m.function()?, m.function()?, m.function()?),
            TransportKind::Ibgda => Kernels::Ibgda(comm.ibgda()?, m.function()?, m.function()?),
            TransportKind::Routed => Kernels::Routed(Box::new(comm.routed()?), m.function()?, m.function()?, m.function()?),
        };
        // Every block of the grid must be resident at once (grid barriers),
        // and how many an SM holds depends on the kernels' registers.
        let mut cfg = cfg;
        let mut residency = None;
        if let (Some(sm), Some(regs)) = (SmLimits::of(comm), kernels.max_registers()) {
            let threads = cfg.block.0 * cfg.block.1 * cfg.block.2;
            let per_sm = resident_blocks_per_sm(&sm, regs, threads);
            residency = Some((regs, per_sm));
            cfg.grid.0 = fit_grid(cfg.grid.0, per_sm, dev.multiprocessor_count() as u32)
                .map_err(|e| err(format!("rank {}: {e} ({regs} registers per thread)", comm.rank())))?;
        }
        let bufs = EmbBufs {
            tables: tables.as_mut_ptr(),
            req_in: req_in.as_mut_ptr(),
            req_sig: req_sig.as_mut_ptr(),
            rows_in: rows_in.as_mut_ptr(),
            rows_sig: rows_sig.as_mut_ptr(),
            grad_in: grad_in.as_mut_ptr(),
            grad_sig: grad_sig.as_mut_ptr(),
            req_out: req_out.as_mut_ptr(),
            errs: errs.as_mut_ptr(),
            keys: keys.as_mut_ptr(),
            vals: vals.as_mut_ptr(),
            slot_of: slot_of.as_mut_ptr(),
            counts: counts.as_mut_ptr(),
            rcounts: rcounts.as_mut_ptr(),
            gacc: gacc.as_mut_ptr(),
            grid: grid.as_mut_ptr(),
            verdict: verdict.as_mut_ptr(),
            status: status.as_mut_ptr(),
            stamps: std::ptr::null_mut(),
        };
        Ok(Exchange {
            residency,
            comm,
            shape,
            tables,
            _sym: vec![req_in, req_sig, rows_sig, grad_sig, req_out],
            _sym_f: vec![rows_in, grad_in],
            keys,
            _local: vec![vals, slot_of, counts, rcounts, grid],
            _gacc: gacc,
            _errs: errs,
            _verdict: verdict,
            status,
            stamps,
            zero: m.function()?,
            floor: match transport {
                TransportKind::P2p => Some(m.function()?),
                _ => None,
            },
            bufs,
            kernels,
            cfg,
            epoch: 0,
            bwd_epoch: 0,
            bwd_seq: 0,
            // The communicator's wait budget (CommOptions::wait_timeout).
            budget_ns: comm.wait_budget_ns(),
            sliced_bytes: k::SLICED_LIST_BYTES,
        })
    }

    /// Phase stamps on or off (off at first): with them on, every launch
    /// records `%globaltimer` at the end of each phase (thread 0 of block
    /// 0; see `doorbell_example_kernels::embedding`), read back with
    /// [`Self::stamps`]. Costs one clock read and store per phase.
    pub fn set_stamps(&mut self, on: bool) {
        self.bufs.stamps = if on { self.stamps.as_mut_ptr() } else { std::ptr::null_mut() };
    }

    /// The last launches' phase stamps, ns: the forward's (`STAMP_FWD`) and
    /// the backward's (`STAMP_BWD`), each minus its own start, `None` where
    /// a phase was not reached. Synchronous; call after [`Self::finish`].
    pub fn stamps(&self) -> Result<(Vec<Option<u64>>, Vec<Option<u64>>)> {
        let v = self.stamps.to_host()?;
        let rel = |at: usize, len: usize| -> Vec<Option<u64>> {
            (0..len)
                .map(|i| (v[at] != 0 && v[at + i] >= v[at]).then(|| v[at + i] - v[at]))
                .collect()
        };
        // A stamp older than its launch's start is a previous launch's.
        Ok((rel(0, k::STAMP_FWD.len()), rel(k::STAMP_BWD_AT, k::STAMP_BWD.len())))
    }

    /// Writes this rank's shard (`[table][local row][dim]`).
    pub fn load_shard(&self, shard: &[f32]) -> Result<()> {
        self.tables.copy_from_host(shard)
    }

    /// This rank's shard.
    pub fn shard(&self) -> Result<Vec<f32>> {
        self.tables.to_host()
    }

    /// The epoch of the last forward.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Enqueues the fused forward (`ids` `[table][sample][pooling]`, `out`
    /// `[sample][table][dim]`, both local). Every rank calls it. Its
    /// kernels wait for the peers': where three or more ranks share a GPU,
    /// they are queued only once this rank's previous such launch has
    /// ended (`Communicator::launch_waiting`), as are the backward's and
    /// the pull forward's.
    pub fn forward(&mut self, s: &Stream, ids: &DeviceBuffer<u32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        self.epoch += 1;
        let comm = self.comm;
        let this = &mut *self;
        comm.launch_waiting(s, || {
            if this.epoch > 1 && k::hash_tag(this.epoch) == 1 {
                // In `s`'s order, before the forward that reuses the tags.
                // SAFETY: `keys` holds its length in u64, twice as many u32 words.
                unsafe {
                    s.launch(
                        &this.zero,
                        LaunchConfig::linear(this.cfg.grid.0, 256),
                        (this.keys.as_mut_ptr() as *mut u32, 2 * this.keys.len() as u64),
                    )?
                };
            }
            // SAFETY: buffers sized for `shape` (new); every rank launches
            // the same grid; each entry gets its own transport's handle.
            with_transport!(&this.kernels, |t, fwd, _bwd| unsafe {
                s.launch(
                    fwd,
                    this.cfg,
                    (
                        t,
                        this.shape,
                        this.bufs,
                        ids.as_ptr(),
                        out.as_mut_ptr(),
                        this.epoch,
                        this.budget_ns,
                        this.sliced_bytes,
                    ),
                )
            })
        })
    }

    /// Enqueues the fused backward of the last forward (`grad`
    /// `[sample][table][dim]`), SGD step `lr`, at most once per forward. It
    /// reuses the forward's routing (the ids are not read again); after a
    /// forward that failed its vote it writes nothing and [`Self::finish`]
    /// says so, on every rank.
    pub fn backward(&mut self, s: &Stream, grad: &DeviceBuffer<f32>, lr: f32) -> Result<()> {
        if self.epoch == 0 {
            return Err(err("backward before any forward: run Exchange::forward first"));
        }
        if self.bwd_epoch == self.epoch {
            return Err(err(format!(
                "a second backward of forward {}: each forward's gradients are applied once; run the next forward first",
                self.epoch
            )));
        }
        self.bwd_epoch = self.epoch;
        self.bwd_seq += 1;
        // SAFETY: as for forward.
        self.comm.launch_waiting(s, || {
            with_transport!(&self.kernels, |t, _fwd, bwd| unsafe {
                s.launch(
                    bwd,
                    self.cfg,
                    (
                        t,
                        self.shape,
                        self.bufs,
                        grad.as_ptr(),
                        lr,
                        self.epoch,
                        self.bwd_seq,
                        self.budget_ns,
                    ),
                )
            })
        })
    }

    /// Enqueues the pull forward (direct loads through `peer_ptr`). Not
    /// over IBGDA, which has no peer pointers (an error); over the routed
    /// transport a pair through the NIC reports `STATUS_NO_PEER_PTR`.
    pub fn forward_pull(&self, s: &Stream, ids: &DeviceBuffer<u32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        let out = out.as_mut_ptr();
        if let Kernels::Ibgda(..) = &self.kernels {
            return Err(err(
                "the pull forward loads rows through peer pointers, and the IBGDA transport has none; use the push forward (Exchange::forward) or the P2P transport",
            ));
        }
        // SAFETY: as for forward.
        self.comm.launch_waiting(s, || unsafe {
            match &self.kernels {
                Kernels::P2p(t, _, _, pull) => s.launch(pull, self.cfg, (*t, self.shape, self.bufs, ids.as_ptr(), out, self.budget_ns)),
                Kernels::Routed(t, _, _, pull) => s.launch(pull, self.cfg, (**t, self.shape, self.bufs, ids.as_ptr(), out, self.budget_ns)),
                Kernels::Ibgda(..) => Err(err("the pull forward has no IBGDA entry")),
            }
        })
    }

    /// From how many bytes a rank's longest request list goes out in
    /// slices from every block rather than from one block per owner
    /// (default `SLICED_LIST_BYTES`, 256 KiB; 0: always, where the grid
    /// has two blocks or more). Ranks may differ: it changes how a rank
    /// sends, not what its peers receive.
    pub fn set_sliced_list_bytes(&mut self, bytes: u64) {
        self.sliced_bytes = bytes;
    }

    /// Largest `bytes` [`Self::put_floor`] takes: one shard, and one
    /// owner's slot of a requester's receive buffer.
    pub fn floor_max_bytes(&self) -> u64 {
        let sh = &self.shape;
        let slot = sh.cap as u64 * sh.dim as u64 * 4;
        let shard = sh.tables as u64 * sh.shard_rows as u64 * sh.dim as u64 * 4;
        slot.min(shard) / 16 * 16
    }

    /// Enqueues the benchmark's copy floor (P2P only; every rank calls
    /// it): `bytes` (a multiple of 16, at most [`Self::floor_max_bytes`])
    /// put from this rank's shard into every peer's receive buffer at
    /// once, nothing else (see `emb_put_floor`). It writes into the peers'
    /// receive buffers, which a forward or backward still running there
    /// uses: call it only when every rank's earlier steps have finished
    /// (`finish`, then a barrier). Check it with [`Self::finish`].
    pub fn put_floor(&mut self, s: &Stream, bytes: u64) -> Result<()> {
        let max = self.floor_max_bytes();
        if bytes % 16 != 0 || bytes > max {
            return Err(err(format!("put floor: {bytes} bytes; a multiple of 16 up to {max} expected")));
        }
        let Some(f) = &self.floor else {
            return Err(err("the put floor is measured over the P2P transport only"));
        };
        // SAFETY: `bytes` within the shard and a receive slot (checked);
        // every rank launches the same grid.
        unsafe { s.launch(f, self.cfg, (self.comm.p2p()?, self.shape, self.bufs, bytes)) }
    }

    /// `steps` training steps with the same ids, each checked with
    /// [`finish`](Self::finish): the forward into `out`, then the backward
    /// of `grad` with SGD rate `lr`, then `out` read back (the returned
    /// outputs) and a barrier. Every rank calls it. The reads come when no
    /// kernel of this exchange waits for this rank, and no rank launches
    /// its next forward before every rank has read: ranks sharing a GPU
    /// share its hardware work queues, and a host copy queued behind a
    /// peer's kernel that waits for this rank waits until that kernel's
    /// budget runs out.
    pub fn train(
        &mut self,
        s: &Stream,
        ids: &DeviceBuffer<u32>,
        grad: &DeviceBuffer<f32>,
        out: &mut DeviceBuffer<f32>,
        lr: f32,
        steps: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let mut outs = Vec::with_capacity(steps);
        for _ in 0..steps {
            self.forward(s, ids, out)?;
            self.finish(s)?;
            self.backward(s, grad, lr)?;
            self.finish(s)?;
            outs.push(out.to_host()?);
            self.comm.barrier()?;
        }
        Ok(outs)
    }

    /// Synchronizes `s`, then turns a device status into an
    /// [`ExchangeError`] (and clears it, in `s`'s order). A communicator
    /// error (a wait that ran out of budget) is returned first, and the
    /// status words are cleared then too: left in place, they would be the
    /// first error of the next launch as well (its own is recorded only
    /// where none is).
    pub fn finish(&mut self, s: &Stream) -> std::result::Result<(), ExchangeError> {
        let synced = self.comm.synchronize(s);
        let st = match self.status.to_host() {
            Ok(st) => st,
            Err(e) => return Err(synced.err().unwrap_or(e).into()),
        };
        if st[0] != k::STATUS_OK {
            // SAFETY: `status` holds STATUS_WORDS words.
            let cleared = unsafe {
                s.launch(
                    &self.zero,
                    LaunchConfig::linear(1, 32),
                    (self.status.as_mut_ptr(), k::STATUS_WORDS as u64),
                )
            };
            if let Err(e) = cleared {
                return Err(synced.err().unwrap_or(e).into());
            }
        }
        synced?;
        if st[0] == k::STATUS_OK {
            return Ok(());
        }
        let rank = self.comm.rank() as u32;
        Err(match st[0] {
            k::STATUS_PEER_ERROR => ExchangeError::PeerFailed {
                rank,
                failed: st[1],
                cause: Box::new(ExchangeError::from_status(st[1], &st[2..], &self.shape)),
            },
            _ => ExchangeError::from_status(rank, &st, &self.shape),
        })
    }
}

/// Why a fused exchange step failed, as [`Exchange::finish`] reports it.
/// Every variant but `Device` and `Timeout` means that nothing was written
/// on any rank (no output, no table) and that the next step can run.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExchangeError {
    /// A lookup id is not a row of its table (and not the padding id).
    BadId {
        /// The rank whose lookups held it.
        rank: u32,
        /// Table, sample and position in the bag of the lookup.
        table: u32,
        sample: u32,
        position: u32,
        /// The id, and the rows every table has.
        id: u32,
        rows: u32,
    },
    /// A (requester, owner) request list outgrew the capacity the exchange
    /// was built with.
    Capacity { rank: u32, owner: u32, needed: u32, cap: u32 },
    /// Another rank failed this step (`cause`, as that rank reported it);
    /// this rank learnt it from that rank's verdict.
    PeerFailed { rank: u32, failed: u32, cause: Box<ExchangeError> },
    /// A backward after a forward that failed (no rank ran it).
    NoForward { rank: u32 },
    /// Another rank gave up on this step (its own wait ran out of budget:
    /// that rank reports the timeout); no rank pooled anything.
    PeerTimedOut { rank: u32, peer: u32 },
    /// An owner received a key that is not its own (a routing bug).
    BadRequest { rank: u32, requester: u32, table: u32, id: u32 },
    /// The pull forward found no direct access to a peer's memory.
    NoPeerPointer { rank: u32, peer: u32 },
    /// A wait or grid barrier ran out of its budget (`phase`: where; the
    /// grid barriers are [`GRID_BARRIER_PHASES`]).
    Timeout { rank: u32, phase: u32 },
    /// A transport call was refused (`detail`: which call and peer).
    Transport { rank: u32, code: u32, detail: [u32; 2] },
    /// The communicator or the device failed (a timed-out transport wait, a
    /// driver error).
    Device(Error),
}

impl ExchangeError {
    /// Decodes the status words `st` (`[code, details...]`) of `rank`.
    fn from_status(rank: u32, st: &[u32], shape: &EmbShape) -> ExchangeError {
        let w = |i: usize| st.get(i).copied().unwrap_or(0);
        match w(0) {
            k::STATUS_BAD_ID => ExchangeError::BadId {
                rank,
                table: w(1),
                sample: w(2),
                position: w(3),
                id: w(4),
                rows: shape.rows,
            },
            k::STATUS_CAPACITY => ExchangeError::Capacity {
                rank,
                owner: w(1),
                needed: w(2),
                cap: w(3),
            },
            k::STATUS_NO_FORWARD => ExchangeError::NoForward { rank },
            k::STATUS_PEER_TIMEOUT => ExchangeError::PeerTimedOut { rank, peer: w(1) },
            k::STATUS_BAD_REQUEST => ExchangeError::BadRequest {
                rank,
                requester: w(1),
                table: w(2),
                id: w(3),
            },
            k::STATUS_NO_PEER_PTR => ExchangeError::NoPeerPointer { rank, peer: w(1) },
            k::STATUS_TIMEOUT => ExchangeError::Timeout { rank, phase: w(1) },
            code => ExchangeError::Transport {
                rank,
                code,
                detail: [w(1), w(2)],
            },
        }
    }

    /// True when the step wrote nothing anywhere and the exchange can go on.
    pub fn nothing_written(&self) -> bool {
        match self {
            ExchangeError::BadId { .. }
            | ExchangeError::Capacity { .. }
            | ExchangeError::NoForward { .. }
            | ExchangeError::PeerTimedOut { .. } => true,
            ExchangeError::PeerFailed { cause, .. } => cause.nothing_written(),
            _ => false,
        }
    }
}

impl std::fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExchangeError::BadId {
                rank,
                table,
                sample,
                position,
                id,
                rows,
            } => write!(
                f,
                "rank {rank}: id {id} (table {table}, sample {sample}, position {position}) is out of range: tables have {rows} rows \
                 (0xFFFFFFFF is padding); nothing was written on any rank"
            ),
            ExchangeError::Capacity { rank, owner, needed, cap } => write!(
                f,
                "rank {rank}: {needed} unique keys for rank {owner} exceed the list capacity {cap}; nothing was written on any rank \
                 (build the exchange with a capacity of at least the largest list, Traffic::max_pair)"
            ),
            ExchangeError::PeerFailed { rank, failed, cause } => {
                write!(f, "rank {rank}: rank {failed} failed this step, so no rank wrote anything: {cause}")
            }
            ExchangeError::NoForward { rank } => write!(
                f,
                "rank {rank}: the backward did not run because its forward failed; nothing was written on any rank"
            ),
            ExchangeError::PeerTimedOut { rank, peer } => write!(
                f,
                "rank {rank}: rank {peer} stopped waiting in this step (its wait ran out of budget: it reports the timeout), so no rank \
                 pooled anything; nothing was written on any rank and the next step can run (if a rank can start this late, raise \
                 DOORBELL_WAIT_TIMEOUT_S)"
            ),
            ExchangeError::BadRequest {
                rank,
                requester,
                table,
                id,
            } => write!(
                f,
                "rank {rank}: rank {requester} asked for table {table} id {id} that this rank does not own"
            ),
            ExchangeError::NoPeerPointer { rank, peer } => write!(
                f,
                "rank {rank}: no direct access to rank {peer}'s memory (the pull forward needs it)"
            ),
            ExchangeError::Timeout { rank, phase } if GRID_BARRIER_PHASES.contains(phase) => write!(
                f,
                "rank {rank}: a grid barrier of the exchange ran out of budget (phase {phase}): some blocks of the grid never started — every block must be resident at once; launch the grid Exchange fitted (Exchange::cfg, from launch_config_for)"
            ),
            ExchangeError::Timeout { rank, phase } => {
                write!(f, "rank {rank}: a wait of the exchange ran out of budget (phase {phase})")
            }
            ExchangeError::Transport { rank, code, detail } => write!(
                f,
                "rank {rank}: a transport call was refused (status {code}, detail {} {}); the communicator's report says which",
                detail[0], detail[1]
            ),
            ExchangeError::Device(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ExchangeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExchangeError::Device(e) => Some(e),
            ExchangeError::PeerFailed { cause, .. } => Some(cause.as_ref()),
            _ => None,
        }
    }
}

impl From<Error> for ExchangeError {
    fn from(e: Error) -> Self {
        ExchangeError::Device(e)
    }
}

impl From<ExchangeError> for Error {
    /// The device error itself, or [`Error::Comm`] with the message.
    fn from(e: ExchangeError) -> Self {
        match e {
            ExchangeError::Device(e) => e,
            e => Error::Comm(e.to_string()),
        }
    }
}

/// Copies `bytes` from local `src` to `dst` (any device address this rank
/// can reach: its own or a peer's) in stream order: the driver's copy on a
/// GPU, a copy kernel on the emulator.
pub struct Copier {
    copy: Function<emb_copy_words>,
}

impl Copier {
    /// Loads the copy kernel.
    pub fn new(comm: &Communicator) -> Result<Copier> {
        let m = comm.load_module(&crate::USER_KERNELS)?;
        Ok(Copier { copy: m.function()? })
    }

    /// Enqueues the copy (`bytes` a multiple of 4).
    ///
    /// # Safety
    /// Both ranges are valid device memory of `bytes` for this rank.
    pub unsafe fn copy(&self, s: &Stream, dst: u64, src: u64, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        match s.as_cuda() {
            Some(cs) => {
                cs.context().bind_to_thread().map_err(|e| err(format!("cuCtxSetCurrent: {e:?}")))?;
                // SAFETY: the caller's ranges; UVA addresses (peer access enabled by the communicator).
                unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes as usize, cs.cu_stream()) }
                    .map_err(|e| err(format!("cuMemcpyDtoDAsync: {e:?}")))
            }
            // SAFETY: the caller's ranges.
            None => unsafe {
                s.launch(
                    &self.copy,
                    LaunchConfig::linear(1, 64),
                    (dst as *mut u32, src as *const u32, bytes / 4),
                )
            },
        }
    }
}

/// How a baseline moves data between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mover {
    /// One driver copy per peer per table, issued by the host.
    Copies,
    /// Grouped ncclSend/ncclRecv, one pair per peer.
    Nccl,
}

/// The host-driven baselines: counts exchanged on the host every step,
/// then gather kernel → exchange → pooling kernel (no dedup).
pub struct Baseline<'c> {
    comm: &'c Communicator,
    p: Problem,
    shape: EmbShape,
    cfg: LaunchConfig,
    tables: DeviceBuffer<f32>,
    gacc: DeviceBuffer<f32>,
    cnt: DeviceBuffer<u32>,
    cursor: DeviceBuffer<u32>,
    soff_d: DeviceBuffer<u32>,
    send_keys: DeviceBuffer<u64>,
    pos: DeviceBuffer<u32>,
    send_rows: DeviceBuffer<f32>,
    send_grads: DeviceBuffer<f32>,
    recv_keys: SymBuffer<'c, u64>,
    recv_rows: SymBuffer<'c, f32>,
    recv_grads: SymBuffer<'c, f32>,
    copier: Copier,
    f_count: Function<emb_bl_count>,
    f_scatter: Function<emb_bl_scatter>,
    f_gather: Function<emb_bl_gather>,
    f_pool: Function<emb_bl_pool>,
    f_gscatter: Function<emb_bl_grad_scatter>,
    f_acc: Function<emb_bl_accumulate>,
    f_apply: Function<emb_bl_apply>,
    f_zero: Function<emb_zero_words>,
    /// `cnt[r][o][t]` of the last forward.
    all: Vec<u32>,
    /// Bytes of rows this rank sent to other ranks in the last forward.
    pub rows_sent: u64,
}

/// Symmetric heap the baseline needs: keys and rows of `max_recv` lookups
/// received by an owner, plus the requester's rows.
pub fn baseline_heap_bytes(p: &Problem, max_recv: u64) -> u64 {
    let d = p.dim as u64;
    max_recv * 8 + max_recv * d * 4 + p.lookups() as u64 * d * 4 + (1 << 20)
}

impl<'c> Baseline<'c> {
    /// Collective. `max_recv`: most lookups any owner receives in a step.
    pub fn new(comm: &'c Communicator, p: &Problem, max_recv: u64, cfg: LaunchConfig) -> Result<Baseline<'c>> {
        let dev = comm.device();
        let m = comm.load_module(&crate::USER_KERNELS)?;
        let (n, t, d, l) = (p.ranks as usize, p.tables as usize, p.dim as usize, p.lookups());
        let mr = max_recv.max(1) as usize;
        let shape = EmbShape {
            tables: p.tables,
            dim: p.dim,
            batch: p.batch,
            pooling: p.pooling,
            rows: p.rows,
            shard_rows: p.shard_rows(),
            cap: 0,
            hash_bits: 0,
        };
        Ok(Baseline {
            comm,
            p: *p,
            shape,
            cfg,
            tables: dev.alloc_zeroed(p.shard_len())?,
            gacc: dev.alloc_zeroed(p.shard_len())?,
            cnt: dev.alloc_zeroed(n * t)?,
            cursor: dev.alloc_zeroed(n * t)?,
            soff_d: dev.alloc_zeroed(n * t)?,
            send_keys: dev.alloc_zeroed(l.max(1))?,
            pos: dev.alloc_zeroed(l)?,
            send_rows: dev.alloc_zeroed(mr * d)?,
            send_grads: dev.alloc_zeroed(l.max(1) * d)?,
            recv_keys: comm.alloc(mr)?,
            recv_rows: comm.alloc(l.max(1) * d)?,
            recv_grads: comm.alloc(mr * d)?,
            copier: Copier::new(comm)?,
            f_count: m.function()?,
            f_scatter: m.function()?,
            f_gather: m.function()?,
            f_pool: m.function()?,
            f_gscatter: m.function()?,
            f_acc: m.function()?,
            f_apply: m.function()?,
            f_zero: m.function()?,
            all: Vec::new(),
            rows_sent: 0,
        })
    }

    /// Writes this rank's shard.
    pub fn load_shard(&mut self, shard: &[f32]) -> Result<()> {
        self.tables.copy_from_host(shard)
    }

    /// This rank's shard.
    pub fn shard(&self) -> Result<Vec<f32>> {
        self.tables.to_host()
    }

    fn c(&self, r: usize, o: usize, t: usize) -> u64 {
        let (n, tt) = (self.p.ranks as usize, self.p.tables as usize);
        self.all[(r * n + o) * tt + t] as u64
    }
    /// Offset of (owner o, table t) in requester r's send order.
    fn soff(&self, r: usize, o: usize, t: usize) -> u64 {
        let tt = self.p.tables as usize;
        (0..o * tt + t).map(|i| self.c(r, i / tt, i % tt)).sum()
    }
    /// Offset of (requester r, table t) in owner o's receive order.
    fn roff(&self, o: usize, r: usize, t: usize) -> u64 {
        let tt = self.p.tables as usize;
        (0..r * tt + t).map(|i| self.c(i / tt, o, i % tt)).sum()
    }
    fn recv_total(&self, o: usize) -> u64 {
        self.roff(o, self.p.ranks as usize, 0)
    }

    /// The forward, host-driven: returns after the output is in `out`.
    pub fn forward(
        &mut self,
        s: &Stream,
        ids: &DeviceBuffer<u32>,
        out: &mut DeviceBuffer<f32>,
        mover: Mover,
        nccl: Option<&crate::nccl::Comm>,
    ) -> Result<()> {
        let (n, tt, d) = (self.p.ranks as usize, self.p.tables as usize, self.p.dim as u64);
        let me = self.comm.rank();
        let lin = LaunchConfig::linear(self.cfg.grid.0, self.cfg.block.0);
        // SAFETY: buffers sized in `new`; the offsets below come from the counts.
        unsafe {
            s.launch(&self.f_zero, lin, (self.cnt.as_mut_ptr(), (n * tt) as u64))?;
            s.launch(&self.f_zero, lin, (self.cursor.as_mut_ptr(), (n * tt) as u64))?;
            s.launch(&self.f_count, lin, (self.shape, n as u32, ids.as_ptr(), self.cnt.as_mut_ptr()))?;
        }
        s.synchronize()?;
        let mine = self.cnt.to_host()?;
        let bytes: Vec<u8> = mine.iter().flat_map(|c| c.to_le_bytes()).collect();
        // Collective: also a barrier (every rank's previous step is done).
        let all = self.comm.world().all_gather_bytes(&bytes)?;
        self.all = crate::gathered(&all, n * tt, "the per-rank row counts", u32::from_le_bytes)?
            .into_iter()
            .flatten()
            .collect();
        let soff: Vec<u32> = (0..n * tt).map(|i| self.soff(me, i / tt, i % tt) as u32).collect();
        self.soff_d.copy_from_host(&soff)?;
        // SAFETY: as above.
        unsafe {
            s.launch(
                &self.f_scatter,
                lin,
                (
                    self.shape,
                    n as u32,
                    ids.as_ptr(),
                    self.soff_d.as_ptr(),
                    self.cursor.as_mut_ptr(),
                    self.send_keys.as_mut_ptr(),
                    self.pos.as_mut_ptr(),
                ),
            )?;
        }
        // Keys to the owners.
        self.exchange(
            s,
            mover,
            nccl,
            8,
            Dir::ToOwners,
            self.send_keys.as_raw(),
            self.recv_keys.as_ptr() as u64,
        )?;
        let total = self.recv_total(me) as u32;
        // SAFETY: `recv_keys` holds `total` keys, `send_rows` total rows.
        unsafe {
            s.launch(
                &self.f_gather,
                self.cfg,
                (
                    self.shape,
                    n as u32,
                    self.tables.as_ptr(),
                    self.recv_keys.as_ptr(),
                    total,
                    self.send_rows.as_mut_ptr(),
                ),
            )?;
        }
        // Rows back to the requesters.
        self.exchange(
            s,
            mover,
            nccl,
            d * 4,
            Dir::ToRequesters,
            self.send_rows.as_raw(),
            self.recv_rows.as_ptr() as u64,
        )?;
        self.rows_sent = (0..n)
            .filter(|&r| r != me)
            .map(|r| (0..tt).map(|t| self.c(r, me, t)).sum::<u64>())
            .sum::<u64>()
            * d
            * 4;
        // SAFETY: `pos` indexes `recv_rows`.
        unsafe {
            s.launch(
                &self.f_pool,
                self.cfg,
                (
                    self.shape,
                    ids.as_ptr(),
                    self.pos.as_ptr(),
                    self.recv_rows.as_ptr(),
                    out.as_mut_ptr(),
                ),
            )?;
        }
        s.synchronize()
    }

    /// The backward of the last forward, host-driven.
    pub fn backward(
        &mut self,
        s: &Stream,
        ids: &DeviceBuffer<u32>,
        grad: &DeviceBuffer<f32>,
        lr: f32,
        mover: Mover,
        nccl: Option<&crate::nccl::Comm>,
    ) -> Result<()> {
        let n = self.p.ranks as usize;
        let me = self.comm.rank();
        let d = self.p.dim as u64;
        // SAFETY: `pos` from the forward indexes `send_grads`.
        unsafe {
            s.launch(
                &self.f_gscatter,
                self.cfg,
                (
                    self.shape,
                    ids.as_ptr(),
                    self.pos.as_ptr(),
                    grad.as_ptr(),
                    self.send_grads.as_mut_ptr(),
                ),
            )?;
        }
        self.exchange(
            s,
            mover,
            nccl,
            d * 4,
            Dir::ToOwners,
            self.send_grads.as_raw(),
            self.recv_grads.as_ptr() as u64,
        )?;
        let total = self.recv_total(me) as u32;
        // SAFETY: `recv_keys`/`recv_grads` hold `total` entries of this rank's rows.
        unsafe {
            s.launch(
                &self.f_acc,
                self.cfg,
                (
                    self.shape,
                    n as u32,
                    self.recv_keys.as_ptr(),
                    total,
                    self.recv_grads.as_ptr(),
                    self.gacc.as_mut_ptr(),
                ),
            )?;
            s.launch(
                &self.f_apply,
                self.cfg,
                (
                    self.shape,
                    n as u32,
                    self.recv_keys.as_ptr(),
                    total,
                    self.gacc.as_mut_ptr(),
                    self.tables.as_mut_ptr(),
                    lr,
                ),
            )?;
        }
        s.synchronize()
    }

    /// Moves `unit`-byte entries between ranks: `ToOwners` from the send
    /// order (`src`, local) to the owners' receive order (`dst`,
    /// symmetric); `ToRequesters` the reverse. Returns when every rank's
    /// data has arrived.
    #[allow(clippy::too_many_arguments)]
    fn exchange(&self, s: &Stream, mover: Mover, nccl: Option<&crate::nccl::Comm>, unit: u64, dir: Dir, src: u64, dst: u64) -> Result<()> {
        let (n, tt) = (self.p.ranks as usize, self.p.tables as usize);
        let me = self.comm.rank();
        match mover {
            Mover::Copies => {
                for peer in 0..n {
                    for t in 0..tt {
                        let (count, from, to) = match dir {
                            Dir::ToOwners => (self.c(me, peer, t), self.soff(me, peer, t), self.roff(peer, me, t)),
                            Dir::ToRequesters => (self.c(peer, me, t), self.roff(me, peer, t), self.soff(peer, me, t)),
                        };
                        let remote = self.comm.peer_address((dst + to * unit) as *const u8, peer)? as u64;
                        // SAFETY: offsets inside the buffers (from the exchanged counts).
                        unsafe { self.copier.copy(s, remote, src + from * unit, count * unit)? };
                    }
                }
                s.synchronize()?;
                self.comm.barrier()
            }
            Mover::Nccl => {
                let nc = nccl.ok_or_else(|| err("NCCL is not set up"))?;
                nc.group(|| {
                    for peer in 0..n {
                        let (send_at, send_n, recv_at, recv_n) = match dir {
                            Dir::ToOwners => (
                                self.soff(me, peer, 0),
                                (0..tt).map(|t| self.c(me, peer, t)).sum::<u64>(),
                                self.roff(me, peer, 0),
                                (0..tt).map(|t| self.c(peer, me, t)).sum::<u64>(),
                            ),
                            Dir::ToRequesters => (
                                self.roff(me, peer, 0),
                                (0..tt).map(|t| self.c(peer, me, t)).sum::<u64>(),
                                self.soff(me, peer, 0),
                                (0..tt).map(|t| self.c(me, peer, t)).sum::<u64>(),
                            ),
                        };
                        nc.send(src + send_at * unit, send_n * unit, peer, s)?;
                        nc.recv(dst + recv_at * unit, recv_n * unit, peer, s)?;
                    }
                    Ok(())
                })?;
                s.synchronize()
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Dir {
    ToOwners,
    ToRequesters,
}
