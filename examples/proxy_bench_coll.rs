//! `proxy_bench`'s collective parts, each over one transport with every
//! step checked against the CPU reference (a wrong result fails the run):
//!
//! * the all-reduce of a producer's gradient three ways: **fused** (the
//!   producer sends each chunk as it is made, one launch), **CPU-driven**
//!   (the host launches the producer and then the library's all-reduce
//!   for each chunk in turn, as a host-driven library does), and the
//!   **producer alone** in both launch shapes, so that the time a step
//!   spends communicating is its time less the producer's;
//! * the **embedding exchange**, forward and backward (the library's
//!   push kernels), timed apart.
//!
//! Times are host wall clock from after a barrier to the end of the
//! step's `synchronize`, the median of the timed steps after one warm-up.

use doorbell::coll::embedding::{launch_config_for, EmbeddingExchange, EmbeddingOptions};
use doorbell::coll::{Algo, AllReduce, AllReduceOptions, DType, TransportKind};
use doorbell::comm::Communicator;
use doorbell::{DeviceBuffer, Function, LaunchConfig, Module, Stream};
use doorbell_example_kernels::allreduce::{fused_grad_allreduce, grad, produce_grad, COMPUTE_HASH};
use doorbell_examples::embedding::{self as emb, compare, Problem};
use doorbell_examples::BoxError;

use crate::bench::median_upper as median;

/// One all-reduce size (bytes per rank, f32) and its chunk (`None`: the
/// fused plan's own; the CPU-driven way then launches the whole buffer
/// as one chunk: the producer kernel, then one all-reduce).
pub type ArCase = (u64, Option<u64>);

/// What one rank needs for the all-reduce parts.
pub struct ArBench<'c> {
    comm: &'c Communicator,
    module: &'c Module,
    s: Stream,
    produce: Function<produce_grad>,
    steps: u32,
}

/// Elements of `bytes` of f32, at least one.
fn elems_of(bytes: u64) -> usize {
    (bytes / 4).max(1) as usize
}

/// Elements per CPU-driven chunk at `case`.
fn per_chunk((bytes, chunk): ArCase) -> usize {
    let elems = elems_of(bytes);
    chunk.map_or(elems, |c| elems_of(c).min(elems))
}

impl<'c> ArBench<'c> {
    pub fn new(comm: &'c Communicator, module: &'c Module, steps: u32) -> Result<Self, BoxError> {
        Ok(ArBench {
            comm,
            module,
            s: comm.device().new_stream()?,
            produce: module.function::<produce_grad>()?,
            steps,
        })
    }

    /// Runs `step` for the warm-up and the timed steps, each after a
    /// barrier and until `synchronize`; `check` sees each step's number
    /// after it. The median µs of the timed steps.
    fn timed(
        &self,
        mut step: impl FnMut(u32) -> Result<(), BoxError>,
        mut check: impl FnMut(u32) -> Result<(), BoxError>,
    ) -> Result<f64, BoxError> {
        let mut times = Vec::new();
        for k in 0..=self.steps {
            self.comm.barrier()?;
            let t0 = std::time::Instant::now();
            step(k)?;
            self.comm.synchronize(&self.s)?;
            if k > 0 {
                times.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            check(k)?;
        }
        Ok(median(times))
    }

    /// Every element of `out` equals the sum over ranks of step `step`'s
    /// gradient, bit for bit, summed as `ar` sums: in rank order, or (the
    /// hierarchical algorithm) each node's ranks first, then the nodes'
    /// sums in node order.
    fn check(&self, ar: &AllReduce<'_>, out: &DeviceBuffer<f32>, step: u32, what: &str) -> Result<(), BoxError> {
        let ranks = self.comm.world_size() as u32;
        let per = match ar.algo() {
            Algo::Hierarchical => ar.plan().args.node_ranks.max(1),
            _ => ranks,
        };
        let sum = |i: usize, rs: std::ops::Range<u32>| rs.map(|r| grad(COMPUTE_HASH, r, i as u64, step)).reduce(|a, b| a + b);
        for (i, g) in out.to_host()?.iter().enumerate() {
            let want = (0..ranks / per)
                .filter_map(|n| sum(i, n * per..(n + 1) * per))
                .reduce(|a, b| a + b)
                .unwrap_or(0.0);
            if g.to_bits() != want.to_bits() {
                let r = self.comm.rank();
                return Err(format!("{what}, step {step}, rank {r}: element {i} is {g}, not {want}").into());
            }
        }
        Ok(())
    }

    /// Launches the producer: elements `first..first + n` of step `step`'s
    /// gradient into `dst` (a grid over the range, at most 1024 blocks).
    fn produce(&self, dst: u64, first: u64, n: u64, step: u32) -> doorbell::Result<()> {
        let cfg = match self.comm.device().is_gpu() {
            true => LaunchConfig::linear(n.div_ceil(256).clamp(1, 1024) as u32, 256),
            false => LaunchConfig::linear(2, 64),
        };
        let a = (
            dst as *mut u8,
            DType::F32 as u32,
            first,
            n,
            self.comm.rank() as u32,
            COMPUTE_HASH,
            step,
        );
        // SAFETY: `dst` holds `n` f32 elements.
        unsafe { self.s.launch(&self.produce, cfg, a) }
    }

    /// The fused all-reduce over `kind`: µs per step.
    pub fn fused(&self, kind: TransportKind, (bytes, chunk): ArCase) -> Result<f64, BoxError> {
        let elems = elems_of(bytes);
        let opts = AllReduceOptions {
            transport: kind,
            fused: true,
            chunk_bytes: chunk,
            ..Default::default()
        };
        let ar = AllReduce::with_options(self.comm, elems, DType::F32, &opts)?;
        let fam = self.module.family::<fused_grad_allreduce>()?;
        let t = self.comm.transport(kind)?;
        // Written by each step's launch, read by its check.
        let out = std::cell::RefCell::new(self.comm.device().alloc_zeroed::<f32>(elems)?);
        let step = |k: u32| -> Result<(), BoxError> {
            if let Some((a, cfg)) = ar.fused_args(&self.s, &mut out.borrow_mut())? {
                // SAFETY: arguments from fused_args for this world and
                // buffer, launched with the all-reduce's transport.
                unsafe { self.s.launch_family(&fam, cfg, t, (a, COMPUTE_HASH, k))? };
            }
            Ok(())
        };
        let what = format!("fused all-reduce over {kind} ({bytes} bytes)");
        self.timed(step, |k| self.check(&ar, &out.borrow(), k, &what))
    }

    /// CPU-driven over `kind`: for each chunk the producer's launch, then
    /// the library's (unfused) all-reduce of that chunk. µs per step.
    pub fn cpu_driven(&self, kind: TransportKind, case: ArCase) -> Result<f64, BoxError> {
        let (elems, per) = (elems_of(case.0), per_chunk(case));
        let opts = AllReduceOptions {
            transport: kind,
            ..Default::default()
        };
        let full = AllReduce::with_options(self.comm, per, DType::F32, &opts)?;
        let tail = match elems % per {
            0 => None,
            n => Some(AllReduce::with_options(self.comm, n, DType::F32, &opts)?),
        };
        let dev = self.comm.device();
        let (work, out) = (dev.alloc_zeroed::<f32>(elems)?, dev.alloc_zeroed::<f32>(elems)?);
        let step = |k: u32| -> Result<(), BoxError> {
            let mut first = 0;
            while first < elems {
                let n = per.min(elems - first);
                let ar = if n == per {
                    &full
                } else {
                    tail.as_ref().ok_or("no tail all-reduce")?
                };
                let off = first as u64 * 4;
                self.produce(work.as_raw() + off, first as u64, n as u64, k)?;
                // SAFETY: both ranges hold `n` f32 elements of this device.
                unsafe { ar.run_raw(&self.s, work.as_raw() + off, out.as_raw() + off)? };
                first += n;
            }
            Ok(())
        };
        let what = format!("CPU-driven all-reduce over {kind} ({} bytes, {} B chunks)", case.0, per * 4);
        self.timed(step, |k| self.check(&full, &out, k, &what))
    }

    /// The producer alone: µs per step launched whole (the fused way's
    /// compute) and launched per chunk (the CPU-driven way's).
    pub fn producer(&self, case: ArCase) -> Result<(f64, f64), BoxError> {
        let (elems, per) = (elems_of(case.0), per_chunk(case));
        let work = self.comm.device().alloc_zeroed::<f32>(elems)?;
        let whole = self.timed(|k| Ok(self.produce(work.as_raw(), 0, elems as u64, k)?), |_| Ok(()))?;
        let chunked = self.timed(
            |k| {
                for first in (0..elems).step_by(per) {
                    let n = per.min(elems - first) as u64;
                    self.produce(work.as_raw() + first as u64 * 4, first as u64, n, k)?;
                }
                Ok(())
            },
            |_| Ok(()),
        )?;
        Ok((whole, chunked))
    }
}

/// The embedding exchange's shape and ids, the same on every rank.
pub struct EmbCase {
    pub p: Problem,
    pub ids: Vec<Vec<u32>>,
}

impl EmbCase {
    /// The shape with `dim`, ids drawn with Zipf 1.05 (seed 7).
    pub fn new(p: Problem) -> Self {
        let ids = emb::generate_ids(&p, 1.05, 7);
        EmbCase { p, ids }
    }

    /// Symmetric heap one exchange of this case takes.
    pub fn heap_bytes(&self) -> u64 {
        emb::heap_bytes_needed(&self.p, self.cap())
    }

    fn cap(&self) -> u32 {
        emb::traffic(&self.p, &self.ids).max_pair.max(1) as u32
    }
}

/// Forward and backward µs per step (medians) of the embedding exchange
/// over `kind`, `steps` timed steps after one warm-up (SGD rate 0.125),
/// every forward's output and the tables after the last backward checked
/// against the CPU reference.
pub fn embedding(comm: &Communicator, kind: TransportKind, c: &EmbCase, steps: u32) -> Result<(f64, f64), BoxError> {
    const LR: f32 = 0.125;
    let (p, r) = (&c.p, comm.rank() as u32);
    let eo = EmbeddingOptions {
        transport: kind,
        launch: Some(launch_config_for(comm, comm.ranks_per_gpu() as u32, kind != TransportKind::P2p)),
        ..EmbeddingOptions::default()
    };
    let mut x = EmbeddingExchange::with_options(comm, p, c.cap(), &eo)?;
    let mut tables = emb::initial_tables(p);
    x.load_shard(&emb::shard_of(p, &tables, r))?;
    let dev = comm.device();
    let ids = dev.alloc_from(&c.ids[r as usize])?;
    let grad = dev.alloc_from(&emb::upstream_grad(p, r))?;
    let mut out = dev.alloc_zeroed::<f32>(p.out_len())?;
    let s = dev.new_stream()?;
    let what = |step: u32, dir: &str| format!("embedding exchange over {kind} (dim {}), step {step}, rank {r}: {dir}", p.dim);
    let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
    for step in 0..=steps {
        comm.barrier()?;
        let t0 = std::time::Instant::now();
        x.forward(&s, &ids, &mut out)?;
        x.finish(&s).map_err(|e| format!("{}: {e}", what(step, "forward")))?;
        let t_fwd = t0.elapsed().as_secs_f64() * 1e6;
        let got = out.to_host()?;
        let (worst, ok) = compare(&got, &emb::reference_forward(p, &tables, &c.ids[r as usize]));
        if !ok {
            return Err(format!("{}: the output differs from the reference by up to {worst}", what(step, "forward")).into());
        }
        comm.barrier()?;
        let t1 = std::time::Instant::now();
        x.backward(&s, &grad, LR)?;
        x.finish(&s).map_err(|e| format!("{}: {e}", what(step, "backward")))?;
        let t_bwd = t1.elapsed().as_secs_f64() * 1e6;
        emb::reference_backward(p, &mut tables, &c.ids, LR);
        if step > 0 {
            fwd.push(t_fwd);
            bwd.push(t_bwd);
        }
    }
    let (worst, ok) = compare(&x.shard()?, &emb::shard_of(p, &tables, r));
    if !ok {
        return Err(format!("{}: the shard differs from the reference by up to {worst}", what(steps, "backward")).into());
    }
    comm.barrier()?;
    Ok((median(fwd), median(bwd)))
}
