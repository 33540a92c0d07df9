//! Host side of the embedding exchange example, its benchmark and
//! `tests/tests/embedding.rs`: the synthetic problem's exact definitions
//! (initial tables, upstream gradients, ids drawn uniformly or from a Zipf
//! law) and their sequential reference, the host-driven baselines the
//! benchmark compares the fused exchange with ([`Baseline`]: counts
//! exchanged on the host, then driver copies or NCCL), and the put floor
//! ([`PutFloor`]). The fused exchange itself is the library's:
//! [`doorbell::coll::EmbeddingExchange`].

use std::path::Path;
use std::time::Duration;

use doorbell::comm::{CommOptions, Communicator, SymBuffer};
use doorbell::{DeviceBuffer, Error, ForTransport, Function, LaunchConfig, Result, Stream};
use doorbell_example_kernels::embedding::{
    emb_bl_accumulate, emb_bl_apply, emb_bl_count, emb_bl_gather, emb_bl_grad_scatter, emb_bl_pool, emb_bl_scatter, emb_copy_words,
    emb_put_floor,
};
use doorbell_kernels::coll::embedding::emb_zero_words;
use doorbell_kernels::transport::P2p;

use crate::BoxError;

pub use doorbell::coll::embedding::{
    fit_grid, grid_request, heap_bytes_needed, launch_config, launch_config_for, reference_forward, resident_blocks_per_sm, shard_of,
    traffic, unshard, validate_ids, EmbShape, EmbeddingError, EmbeddingExchange, EmbeddingOptions, Problem, SmLimits, Traffic,
    MAX_BLOCKS_PER_SM, PAD,
};
pub use doorbell::coll::TransportKind;

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

/// The sequential reference backward + SGD over every rank's lookups, with
/// the synthetic upstream gradient ([`grad_value`]).
pub fn reference_backward(p: &Problem, tables: &mut [f32], ids: &[Vec<u32>], lr: f32) {
    let grads: Vec<Vec<f32>> = (0..p.ranks).map(|r| upstream_grad(p, r)).collect();
    let d = p.dim as usize;
    doorbell::coll::embedding::reference_backward(p, tables, ids, lr, |r, s, t| {
        &grads[r as usize][(s as usize * p.tables as usize + t as usize) * d..][..d]
    });
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

/// Every rank's lookups from `path` (u32 LE `[rank][table][sample][pooling]`).
pub fn read_ids(path: &Path, p: &Problem) -> std::result::Result<Vec<Vec<u32>>, BoxError> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let want = p.ranks as usize * p.lookups() * 4;
    if bytes.len() != want {
        return Err(format!(
            "{}: {} bytes, expected ranks*tables*batch*pooling*4 = {want} (u32 LE [rank][table][sample][pooling])",
            path.display(),
            bytes.len()
        )
        .into());
    }
    let all: Vec<u32> = bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Ok(all.chunks(p.lookups()).map(|c| c.to_vec()).collect())
}

/// Writes `v` to `path` as f32 LE.
pub fn write_f32(path: &Path, v: impl Iterator<Item = f32>) -> std::result::Result<(), BoxError> {
    let bytes: Vec<u8> = v.flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()).into())
}

/// The communicator options of the example: `heap` bytes of symmetric
/// heap (rounded up to 1 MiB), a 30 s wait budget, the rest from the
/// environment.
pub fn comm_options(heap: u64) -> std::result::Result<CommOptions, BoxError> {
    Ok(CommOptions {
        heap_bytes: heap.next_multiple_of(1 << 20),
        wait_timeout: Duration::from_secs(30),
        ..CommOptions::from_env()?
    })
}

/// Ranks sharing one GPU: all of them, or with `DOORBELL_RANK_PER_GPU=1`
/// the ranks over the GPUs.
pub fn ranks_per_gpu(p: &Problem, opts: &CommOptions) -> u32 {
    if opts.spread_gpus {
        p.ranks.div_ceil(doorbell::gpu_count().max(1) as u32)
    } else {
        p.ranks
    }
}

/// Largest difference between `got` and `want`, and whether it is within
/// `1e-5 * (1 + |want|)` everywhere (a lost or misrouted row or gradient
/// changes some element by at least `lr`, far more).
pub fn compare(got: &[f32], want: &[f32]) -> (f32, bool) {
    let mut worst = 0f32;
    let mut ok = got.len() == want.len();
    for (g, w) in got.iter().zip(want) {
        let d = (g - w).abs();
        worst = worst.max(if d.is_nan() { f32::INFINITY } else { d });
        // NaN anywhere is a difference.
        let limit = 1e-5 * (1.0 + w.abs());
        if d.is_nan() || limit.is_nan() || d > limit {
            ok = false;
        }
    }
    (worst, ok)
}

/// Prints the traffic line of a run.
pub fn print_traffic(p: &Problem, tr: &Traffic) {
    let (plain, dedup) = tr.row_bytes(p.dim);
    let saved = plain.saturating_sub(dedup);
    println!(
        "traffic per step and direction: {} lookups, {} unique (rank, table, id) -> rows moved {:.3} MB instead of {:.3} MB \
         ({:.1}% saved by dedup; {} of the unique rows are local)",
        tr.lookups,
        tr.unique,
        dedup as f64 / 1e6,
        plain as f64 / 1e6,
        if plain > 0 { saved as f64 * 100.0 / plain as f64 } else { 0.0 },
        tr.unique_local
    );
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
        let shape = p.shape(0, 0);
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
            f_zero: comm.library_module()?.function()?,
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
        let via = Via { mover, nccl };
        let total = self.to_owners(s, via, 8, self.send_keys.as_raw(), self.recv_keys.as_ptr() as u64)?;
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
            via,
            Move {
                unit: d * 4,
                dir: Dir::ToRequesters,
                src: self.send_rows.as_raw(),
                dst: self.recv_rows.as_ptr() as u64,
            },
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
        let via = Via { mover, nccl };
        let total = self.to_owners(s, via, d * 4, self.send_grads.as_raw(), self.recv_grads.as_ptr() as u64)?;
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

    /// [`Self::exchange`] `ToOwners`: returns how many entries this rank,
    /// as an owner, received.
    fn to_owners(&self, s: &Stream, via: Via<'_>, unit: u64, src: u64, dst: u64) -> Result<u32> {
        let dir = Dir::ToOwners;
        self.exchange(s, via, Move { unit, dir, src, dst })?;
        Ok(self.recv_total(self.comm.rank()) as u32)
    }

    /// Moves `unit`-byte entries between ranks: `ToOwners` from the send
    /// order (`src`, local) to the owners' receive order (`dst`,
    /// symmetric); `ToRequesters` the reverse. Returns when every rank's
    /// data has arrived.
    fn exchange(&self, s: &Stream, via: Via<'_>, m: Move) -> Result<()> {
        let (n, tt) = (self.p.ranks as usize, self.p.tables as usize);
        let me = self.comm.rank();
        let Move { unit, dir, src, dst } = m;
        match via.mover {
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
                let nc = via.nccl.ok_or_else(|| err("NCCL is not set up"))?;
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

/// How a baseline step moves its data: the mover and, for NCCL, its
/// communicator.
#[derive(Clone, Copy)]
struct Via<'a> {
    mover: Mover,
    nccl: Option<&'a crate::nccl::Comm>,
}

/// One exchange of `unit`-byte entries in direction `dir`, from local
/// `src` to symmetric `dst`.
#[derive(Clone, Copy)]
struct Move {
    unit: u64,
    dir: Dir,
    src: u64,
    dst: u64,
}

#[derive(Clone, Copy)]
enum Dir {
    ToOwners,
    ToRequesters,
}

fn err(msg: impl Into<String>) -> Error {
    Error::Comm(msg.into())
}

type Floor = Function<<emb_put_floor as ForTransport<P2p>>::Kernel>;

/// The benchmark's put floor: the fused forward's remote row bytes moved by
/// plain puts from every rank to every peer at once, nothing else
/// (`emb_put_floor`, P2P only), into an exchange's receive buffers.
pub struct PutFloor {
    f: Floor,
}

impl PutFloor {
    /// Collective: loads the floor's kernel.
    pub fn new(comm: &Communicator) -> Result<PutFloor> {
        let m = comm.load_module(&crate::USER_KERNELS)?;
        Ok(PutFloor { f: m.function()? })
    }

    /// Largest `bytes` [`Self::run`] takes for `x`: one shard, and one
    /// owner's slot of a requester's receive buffer.
    pub fn max_bytes(x: &EmbeddingExchange) -> u64 {
        let sh = x.shape();
        let slot = sh.cap as u64 * sh.dim as u64 * 4;
        let shard = sh.tables as u64 * sh.shard_rows as u64 * sh.dim as u64 * 4;
        slot.min(shard) / 16 * 16
    }

    /// Enqueues the floor (P2P only; every rank calls it): `bytes` (a
    /// multiple of 16, at most [`Self::max_bytes`]) put from this rank's
    /// shard into every peer's receive buffer of `x` at once. It writes
    /// into the peers' receive buffers, which a forward or backward still
    /// running there uses: call it only when every rank's earlier steps
    /// have finished (`finish`, then a barrier). Check it with
    /// [`EmbeddingExchange::finish`].
    pub fn run(&self, x: &EmbeddingExchange, s: &Stream, bytes: u64) -> Result<()> {
        let max = Self::max_bytes(x);
        if !bytes.is_multiple_of(16) || bytes > max {
            return Err(err(format!("put floor: {bytes} bytes; a multiple of 16 up to {max} expected")));
        }
        let (shape, bufs, cfg) = x.kernel_view();
        let t = x.comm().p2p()?;
        // SAFETY: `bytes` within the shard and a receive slot (checked);
        // every rank launches the same grid.
        unsafe { s.launch(&self.f, cfg, (t, shape, bufs, bytes)) }
    }
}
