//! [`EmbeddingExchange`]: one rank's fused exchange, its buffers, kernels
//! and epochs.

use doorbell_kernels::coll::embedding::{
    emb_backward, emb_forward, emb_forward_pull, emb_zero_words, hash_tag, BwdArgs, EmbBufs, EmbShape, FwdArgs, ERR_WORDS, SHARED_BYTES,
    STAMP_BWD, STAMP_BWD_AT, STAMP_FWD, STAMP_WORDS, STATUS_OK, STATUS_PEER_ERROR, STATUS_WORDS,
};

use super::grid::{fit_grid, launch_config_for, resident_blocks_per_sm, SmLimits};
use super::{invalid, EmbeddingError, EmbeddingOptions, Problem, SLICED_LIST_BYTES};
use crate::coll::TransportKind;
use crate::comm::{Communicator, SymBuffer};
use crate::error::Result;
use crate::family::{AnyTransport, Family};
use crate::memory::DeviceBuffer;
use crate::module::Function;
use crate::stream::{LaunchConfig, Stream};

/// The transport handle and the library's entries: forward, backward,
/// and the pull forward where peer pointers may exist (not over IBGDA,
/// which it is not exported for). The handle picks each family's entry.
struct Kernels {
    t: Box<AnyTransport>,
    /// The communicator's NIC generation when `t` was made, for a NIC
    /// transport (`None`: P2P, whose handle a NIC teardown leaves valid).
    nic_gen: Option<u64>,
    fwd: Family<emb_forward>,
    bwd: Family<emb_backward>,
    pull: Option<Family<emb_forward_pull>>,
}

impl Kernels {
    /// The library's entries for `opts.transport`, with its handle (set up
    /// on first use: collective).
    fn load(comm: &Communicator, opts: &EmbeddingOptions) -> Result<Kernels> {
        let m = comm.library_module()?;
        let t: AnyTransport = match opts.transport {
            TransportKind::P2p => comm.p2p()?.into(),
            TransportKind::Ibgda => comm.ibgda()?.into(),
            TransportKind::Proxy => comm.proxy_with_routes(opts.rdma_peers.as_ref())?.into(),
            TransportKind::Routed => match &opts.rdma_peers {
                Some(peers) => comm.routed_with(peers)?.into(),
                None => comm.routed()?.into(),
            },
        };
        let pull = match opts.transport {
            TransportKind::Ibgda | TransportKind::Proxy => None,
            _ => Some(m.family()?),
        };
        let nic_gen = (opts.transport != TransportKind::P2p).then(|| comm.nic_generation());
        Ok(Kernels {
            t: Box::new(t),
            nic_gen,
            fwd: m.family()?,
            bwd: m.family()?,
            pull,
        })
    }

    /// Registers per thread of the entry that uses the most (driver
    /// attributes; `None` on the emulator).
    fn max_registers(&self) -> Result<Option<u32>> {
        let t = &*self.t;
        let pull = match &self.pull {
            Some(p) => p.attributes(t)?,
            None => None,
        };
        let regs = [self.fwd.attributes(t)?, self.bwd.attributes(t)?, pull];
        Ok(regs.iter().flatten().map(|a| a.registers.max(0) as u32).max())
    }
}

/// Symmetric heap the fused exchange needs per rank for `p` with list
/// capacity `cap` (to size `CommOptions::heap_bytes`).
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
        (n + 1) * ERR_WORDS as u64 * 4,
    ];
    parts.iter().map(|b| b + 256).sum::<u64>() + (1 << 20)
}

/// One launch's phase stamps, ns since its start (`None`: not reached);
/// see [`EmbeddingExchange::stamps`].
pub type PhaseStamps = Vec<Option<u64>>;

/// The exchange's memory: symmetric buffers (the same offsets on every
/// rank) and this rank's scratch, and the kernels' view of them.
struct Buffers<'c> {
    tables: SymBuffer<'c, f32>,
    _sym: Vec<SymBuffer<'c, u64>>,
    _sym_f: Vec<SymBuffer<'c, f32>>,
    _errs: SymBuffer<'c, u32>,
    keys: DeviceBuffer<u64>,
    _local: Vec<DeviceBuffer<u32>>,
    _gacc: DeviceBuffer<f32>,
    _verdict: DeviceBuffer<u64>,
    status: DeviceBuffer<u32>,
    stamps: DeviceBuffer<u64>,
    /// The kernels' view (stamps off).
    view: EmbBufs,
}

impl<'c> Buffers<'c> {
    /// Collective (symmetric allocations): every buffer of [`EmbBufs`] for
    /// `p` and `shape`, zeroed.
    fn alloc(comm: &'c Communicator, p: &Problem, shape: &EmbShape) -> Result<Buffers<'c>> {
        let dev = comm.device();
        let (n, c, d) = (p.ranks as usize, shape.cap as usize, p.dim as usize);
        let tables = comm.alloc::<f32>(p.shard_len())?;
        let req_in = comm.alloc::<u64>(2 * n * c)?;
        let req_sig = comm.alloc::<u64>(n)?;
        let rows_in = comm.alloc::<f32>(n * c * d)?;
        let rows_sig = comm.alloc::<u64>(2 * n)?;
        let grad_in = comm.alloc::<f32>(n * c * d)?;
        let grad_sig = comm.alloc::<u64>(n)?;
        let req_out = comm.alloc::<u64>(n * c)?;
        let errs = comm.alloc::<u32>((n + 1) * ERR_WORDS)?;
        let mut keys = dev.alloc_zeroed::<u64>(1 << shape.hash_bits)?;
        let mut vals = dev.alloc_zeroed::<u32>(1 << shape.hash_bits)?;
        let mut slot_of = dev.alloc_zeroed::<u32>(p.lookups())?;
        let mut counts = dev.alloc_zeroed::<u32>(2 * n)?;
        let mut rcounts = dev.alloc_zeroed::<u32>(2 * n)?;
        let mut gacc = dev.alloc_zeroed::<f32>(p.shard_len())?;
        let mut grid = dev.alloc_zeroed::<u32>(2)?;
        let mut verdict = dev.alloc_zeroed::<u64>(1)?;
        let mut status = dev.alloc_zeroed::<u32>(STATUS_WORDS)?;
        let stamps = dev.alloc_zeroed::<u64>(STAMP_WORDS)?;
        let view = EmbBufs {
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
        Ok(Buffers {
            tables,
            _sym: vec![req_in, req_sig, rows_sig, grad_sig, req_out],
            _sym_f: vec![rows_in, grad_in],
            _errs: errs,
            keys,
            _local: vec![vals, slot_of, counts, rcounts, grid],
            _gacc: gacc,
            _verdict: verdict,
            status,
            stamps,
            view,
        })
    }
}

/// Checks a launch shape the exchange's kernels can run: 1-D, whole warps
/// of at most 256 threads, [`SHARED_BYTES`] of shared memory or more.
fn check_launch(cfg: &LaunchConfig) -> Result<()> {
    let (g, b) = (cfg.grid, cfg.block);
    if g.1 != 1 || g.2 != 1 || b.1 != 1 || b.2 != 1 || g.0 == 0 {
        return Err(invalid(format!(
            "grid {g:?} / block {b:?}: the exchange's kernels take a 1-D grid of at least one block"
        )));
    }
    if b.0 == 0 || b.0 % 32 != 0 || b.0 > 256 {
        return Err(invalid(format!("{} threads per block: use a multiple of 32 up to 256", b.0)));
    }
    if cfg.shared_mem_bytes < SHARED_BYTES {
        return Err(invalid(format!(
            "{} bytes of shared memory per block: the kernels need {SHARED_BYTES} (LaunchConfig::with_shared_mem)",
            cfg.shared_mem_bytes
        )));
    }
    Ok(())
}

/// One rank's fused embedding exchange: its buffers, kernels and epochs.
/// See the [module docs](super).
pub struct EmbeddingExchange<'c> {
    comm: &'c Communicator,
    shape: EmbShape,
    mem: Buffers<'c>,
    bufs: EmbBufs,
    zero: Function<emb_zero_words>,
    kernels: Kernels,
    cfg: LaunchConfig,
    residency: Option<(u32, u32)>,
    epoch: u64,
    /// The epoch of the last backward launched (0: none).
    bwd_epoch: u64,
    /// Backward launches so far (the owners' gradient signals count them).
    bwd_seq: u64,
    budget_ns: u64,
    /// Request lists this long or longer go out in slices from every block.
    sliced_bytes: u64,
}

impl<'c> EmbeddingExchange<'c> {
    /// Collective: an exchange for `p` with request lists of `cap` keys per
    /// (requester, owner) ([`super::Traffic::max_pair`] of the lookups it
    /// will see), the default options (P2P, the grid of
    /// [`launch_config_for`]).
    pub fn new(comm: &'c Communicator, p: &Problem, cap: u32) -> Result<EmbeddingExchange<'c>> {
        Self::with_options(comm, p, cap, &EmbeddingOptions::default())
    }

    /// Collective: [`Self::new`] tuned by `opts`. IBGDA and routed are set
    /// up on first use (collective). Every put of the push kernels reads
    /// from a symmetric buffer (request lists, table shard, gradient
    /// staging), so nothing needs `Communicator::ibgda_register`. The pull
    /// forward needs peer pointers: not over IBGDA.
    ///
    /// On a GPU the grid is fitted to the loaded kernels' registers
    /// ([`fit_grid`]): the IBGDA and routed entries hold one block of 256
    /// threads per SM where P2P's hold three. Every rank computes the same
    /// grid when every rank's GPU is the same model (the kernels' signal
    /// counts assume one grid size on every rank).
    pub fn with_options(comm: &'c Communicator, p: &Problem, cap: u32, opts: &EmbeddingOptions) -> Result<EmbeddingExchange<'c>> {
        p.check()?;
        if p.ranks as usize != comm.world_size() {
            return Err(invalid(format!(
                "the problem has {} ranks, the communicator {}",
                p.ranks,
                comm.world_size()
            )));
        }
        let mut cfg = opts
            .launch
            .unwrap_or_else(|| launch_config_for(comm, comm.ranks_per_gpu() as u32, opts.transport != TransportKind::P2p));
        check_launch(&cfg)?;
        let hash_bits = (2 * p.lookups()).next_power_of_two().trailing_zeros().max(4);
        let shape = p.shape(cap.max(1), hash_bits);
        let mem = Buffers::alloc(comm, p, &shape)?;
        let kernels = Kernels::load(comm, opts)?;
        // Every block of the grid must be resident at once (grid barriers),
        // and how many an SM holds depends on the kernels' registers.
        let mut residency = None;
        if let (Some(sm), Some(regs)) = (SmLimits::of(comm), kernels.max_registers()?) {
            let threads = cfg.block.0 * cfg.block.1 * cfg.block.2;
            let per_sm = resident_blocks_per_sm(&sm, regs, threads);
            residency = Some((regs, per_sm));
            cfg.grid.0 = fit_grid(cfg.grid.0, per_sm, comm.device().multiprocessor_count() as u32)
                .map_err(|e| invalid(format!("rank {}: {e} ({regs} registers per thread)", comm.rank())))?;
        }
        let zero = comm.library_module()?.function()?;
        // Every rank has loaded the kernels (the driver compiles them at the
        // first load) before any rank launches one that waits for it.
        comm.barrier()?;
        Ok(EmbeddingExchange {
            comm,
            shape,
            bufs: mem.view,
            mem,
            zero,
            kernels,
            cfg,
            residency,
            epoch: 0,
            bwd_epoch: 0,
            bwd_seq: 0,
            // The communicator's wait budget (CommOptions::wait_timeout).
            budget_ns: comm.wait_budget_ns(),
            sliced_bytes: opts.sliced_list_bytes.unwrap_or(SLICED_LIST_BYTES),
        })
    }

    /// The shape passed to the kernels.
    pub fn shape(&self) -> &EmbShape {
        &self.shape
    }

    /// The launch shape (the same on every rank): the one asked for, its
    /// grid fitted on a GPU to how many blocks the kernels' registers let
    /// every SM hold ([`fit_grid`]).
    pub fn launch_config(&self) -> LaunchConfig {
        self.cfg
    }

    /// On a GPU: the most registers per thread of the kernels it launches,
    /// as the driver compiled them, and how many blocks of the launch shape
    /// one SM holds at that count (`None` on the emulator).
    pub fn residency(&self) -> Option<(u32, u32)> {
        self.residency
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// The kernel arguments of this exchange's shape and buffers, and its
    /// launch shape, for a kernel of your own that works on them (the
    /// examples' put floor writes into the receive buffers). Such a kernel
    /// must not run while a forward or backward of any rank does.
    pub fn kernel_view(&self) -> (EmbShape, EmbBufs, LaunchConfig) {
        (self.shape, self.bufs, self.cfg)
    }

    /// Phase stamps on or off (off at first): with them on, every launch
    /// records `%globaltimer` at the end of each phase (thread 0 of block
    /// 0; see `doorbell_kernels::coll::embedding`), read back with
    /// [`Self::stamps`]. Costs one clock read and store per phase.
    pub fn set_stamps(&mut self, on: bool) {
        self.bufs.stamps = if on { self.mem.stamps.as_mut_ptr() } else { std::ptr::null_mut() };
    }

    /// The last launches' phase stamps, ns: the forward's (`STAMP_FWD`) and
    /// the backward's (`STAMP_BWD`), each minus its own start, `None` where
    /// a phase was not reached. Synchronous; call after [`Self::finish`].
    pub fn stamps(&self) -> Result<(PhaseStamps, PhaseStamps)> {
        let v = self.mem.stamps.to_host()?;
        let rel = |at: usize, len: usize| -> Vec<Option<u64>> {
            (0..len)
                .map(|i| (v[at] != 0 && v[at + i] >= v[at]).then(|| v[at + i] - v[at]))
                .collect()
        };
        // A stamp older than its launch's start is a previous launch's.
        Ok((rel(0, STAMP_FWD.len()), rel(STAMP_BWD_AT, STAMP_BWD.len())))
    }

    /// Writes this rank's shard (`[table][local row][dim]`, `shard_len`
    /// elements: [`super::shard_of`]).
    pub fn load_shard(&self, shard: &[f32]) -> Result<()> {
        if shard.len() != self.mem.tables.len() {
            return Err(invalid(format!(
                "a shard of {} elements; this rank's holds tables * shard_rows * dim = {}",
                shard.len(),
                self.mem.tables.len()
            )));
        }
        self.mem.tables.copy_from_host(shard)
    }

    /// This rank's shard.
    pub fn shard(&self) -> Result<Vec<f32>> {
        self.mem.tables.to_host()
    }

    /// The epoch of the last forward.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Checks a stream and a device buffer of `want` elements.
    fn check_io<T: crate::memory::DeviceCopy>(&self, s: &Stream, what: &str, buf: &DeviceBuffer<T>, want: usize) -> Result<()> {
        if let Some(g) = self.kernels.nic_gen {
            self.comm.check_nic_generation(g, "this embedding exchange")?;
        }
        if !s.device().same(self.comm.device()) {
            return Err(invalid("the stream belongs to another device than the communicator's"));
        }
        if !buf.device().same(self.comm.device()) {
            return Err(invalid(format!("the {what} lives on another device than the communicator's")));
        }
        if buf.len() != want {
            return Err(invalid(format!("the {what} holds {} elements; {want} expected", buf.len())));
        }
        Ok(())
    }

    fn lookups(&self) -> usize {
        let s = &self.shape;
        s.tables as usize * s.batch as usize * s.pooling as usize
    }

    fn out_len(&self) -> usize {
        let s = &self.shape;
        s.batch as usize * s.tables as usize * s.dim as usize
    }
}

impl EmbeddingExchange<'_> {
    /// Enqueues the fused forward (`ids` `[table][sample][pooling]`, `out`
    /// `[sample][table][dim]`, both local). Every rank calls it. Its
    /// kernels wait for the peers': where two or more ranks share a GPU,
    /// they are queued only once this rank's previous such launch has
    /// ended (`Communicator::launch_waiting`), as are the backward's and
    /// the pull forward's. Errors of the step itself surface at
    /// [`Self::finish`].
    pub fn forward(&mut self, s: &Stream, ids: &DeviceBuffer<u32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        self.check_io(s, "ids buffer", ids, self.lookups())?;
        self.check_io(s, "output", out, self.out_len())?;
        self.epoch += 1;
        let comm = self.comm;
        let this = &mut *self;
        comm.launch_waiting(s, || {
            if this.epoch > 1 && hash_tag(this.epoch) == 1 {
                // In `s`'s order, before the forward that reuses the tags.
                // SAFETY: `keys` holds its length in u64, twice as many u32 words.
                unsafe {
                    s.launch(
                        &this.zero,
                        LaunchConfig::linear(this.cfg.grid.0, 256),
                        (this.mem.keys.as_mut_ptr() as *mut u32, 2 * this.mem.keys.len() as u64),
                    )?
                };
            }
            let args = FwdArgs {
                ids: ids.as_ptr(),
                out: out.as_mut_ptr(),
                epoch: this.epoch,
                budget_ns: this.budget_ns,
                sliced_bytes: this.sliced_bytes,
            };
            // SAFETY: buffers sized for `shape` (new), `ids` and `out`
            // checked; every rank launches the same grid; the handle picks
            // its own transport's entry.
            let k = &this.kernels;
            unsafe { s.launch_family(&k.fwd, this.cfg, *k.t, (this.shape, this.bufs, args)) }
        })
    }

    /// Enqueues the fused backward of the last forward (`grad`
    /// `[sample][table][dim]`), SGD step `lr`, at most once per forward. It
    /// reuses the forward's routing (the ids are not read again); after a
    /// forward that failed its vote it writes nothing and [`Self::finish`]
    /// says so, on every rank.
    pub fn backward(&mut self, s: &Stream, grad: &DeviceBuffer<f32>, lr: f32) -> Result<()> {
        self.check_io(s, "gradient", grad, self.out_len())?;
        if self.epoch == 0 {
            return Err(invalid("backward before any forward: run EmbeddingExchange::forward first"));
        }
        if self.bwd_epoch == self.epoch {
            return Err(invalid(format!(
                "a second backward of forward {}: each forward's gradients are applied once; run the next forward first",
                self.epoch
            )));
        }
        self.bwd_epoch = self.epoch;
        self.bwd_seq += 1;
        let args = BwdArgs {
            grad: grad.as_ptr(),
            lr,
            epoch: self.epoch,
            seq: self.bwd_seq,
            budget_ns: self.budget_ns,
        };
        // SAFETY: as for forward.
        self.comm.launch_waiting(s, || {
            let k = &self.kernels;
            // SAFETY: as for forward.
            unsafe { s.launch_family(&k.bwd, self.cfg, *k.t, (self.shape, self.bufs, args)) }
        })
    }

    /// Enqueues the pull forward (direct loads through `peer_ptr`, no dedup,
    /// no routing, no backward of its own). Not over IBGDA, which has no
    /// peer pointers (an error); over the routed transport a pair through
    /// the NIC reports [`EmbeddingError::NoPeerPointer`].
    pub fn forward_pull(&self, s: &Stream, ids: &DeviceBuffer<u32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        self.check_io(s, "ids buffer", ids, self.lookups())?;
        self.check_io(s, "output", out, self.out_len())?;
        let out = out.as_mut_ptr();
        let (t, Some(pull)) = (&*self.kernels.t, &self.kernels.pull) else {
            return Err(invalid(
                "the pull forward loads rows through peer pointers, and the IBGDA transport has none; use the push forward (EmbeddingExchange::forward) or the P2P transport",
            ));
        };
        // SAFETY: as for forward.
        self.comm.launch_waiting(s, || unsafe {
            s.launch_family(pull, self.cfg, *t, (self.shape, self.bufs, ids.as_ptr(), out, self.budget_ns))
        })
    }

    /// From how many bytes a rank's longest request list goes out in
    /// slices from every block rather than from one block per owner
    /// (default [`SLICED_LIST_BYTES`], 256 KiB; 0: always, where the grid
    /// has two blocks or more). Ranks may differ: it changes how a rank
    /// sends, not what its peers receive.
    pub fn set_sliced_list_bytes(&mut self, bytes: u64) {
        self.sliced_bytes = bytes;
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
    /// [`EmbeddingError`] (and clears it, in `s`'s order). A communicator
    /// error (a wait that ran out of budget) is returned first, and the
    /// status words are cleared then too: left in place, they would be the
    /// first error of the next launch as well (its own is recorded only
    /// where none is).
    pub fn finish(&mut self, s: &Stream) -> std::result::Result<(), EmbeddingError> {
        let synced = self.comm.synchronize(s);
        let st = match self.mem.status.to_host() {
            Ok(st) => st,
            Err(e) => return Err(synced.err().unwrap_or(e).into()),
        };
        if st[0] != STATUS_OK {
            // SAFETY: `status` holds STATUS_WORDS words.
            let cleared = unsafe {
                s.launch(
                    &self.zero,
                    LaunchConfig::linear(1, 32),
                    (self.mem.status.as_mut_ptr(), STATUS_WORDS as u64),
                )
            };
            if let Err(e) = cleared {
                return Err(synced.err().unwrap_or(e).into());
            }
        }
        synced?;
        if st[0] == STATUS_OK {
            return Ok(());
        }
        let rank = self.comm.rank() as u32;
        Err(match st[0] {
            STATUS_PEER_ERROR => EmbeddingError::PeerFailed {
                rank,
                failed: st[1],
                cause: Box::new(EmbeddingError::from_status(st[1], &st[2..], &self.shape)),
            },
            _ => EmbeddingError::from_status(rank, &st, &self.shape),
        })
    }
}
