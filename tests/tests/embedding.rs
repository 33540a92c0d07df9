//! The embedding exchange (forward, backward + SGD) against the sequential
//! CPU reference, on every backend, for 1..=8 ranks: skewed ids, duplicates
//! inside a bag, empty and partly padded bags, a rank with no traffic; an
//! out-of-range id is an error on the device, named on every rank, with
//! nothing written anywhere, well within the wait budget, and the next step
//! still runs; the host check names the id.

use doorbell_tests::per_backend;
use std::time::Duration;

use doorbell::coll::embedding::{EmbeddingError, EmbeddingExchange, EmbeddingOptions, Problem, PAD, SHARED_BYTES, STAMP_FWD};
use doorbell::coll::TransportKind;
use doorbell::comm::{CommOptions, Communicator, RdmaPeers};
use doorbell::{Backend, DeviceBuffer, LaunchConfig, Stream};
use doorbell_examples::embedding as emb;

fn opts(p: &Problem, cap: u32) -> CommOptions {
    CommOptions {
        heap_bytes: emb::heap_bytes_needed(p, cap).next_multiple_of(1 << 20),
        wait_timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

fn cfg(comm: &Communicator, ranks: u32) -> LaunchConfig {
    if comm.device().is_gpu() {
        emb::launch_config(comm, ranks)
    } else {
        // Few blocks and threads: every emulated thread is an OS thread.
        LaunchConfig::linear(2, 32).with_shared_mem(SHARED_BYTES)
    }
}

/// The library's exchange over `transport`, launched with `cfg`.
fn exchange<'c>(
    comm: &'c Communicator,
    p: &Problem,
    cap: u32,
    cfg: LaunchConfig,
    transport: TransportKind,
) -> doorbell::Result<EmbeddingExchange<'c>> {
    exchange_routed(comm, p, cap, cfg, transport, None)
}

/// [`exchange`] with the pairs the routed transport or the proxy sends
/// through the NIC.
fn exchange_routed<'c>(
    comm: &'c Communicator,
    p: &Problem,
    cap: u32,
    cfg: LaunchConfig,
    transport: TransportKind,
    rdma_peers: Option<RdmaPeers>,
) -> doorbell::Result<EmbeddingExchange<'c>> {
    let opts = EmbeddingOptions {
        transport,
        rdma_peers,
        launch: Some(cfg),
        ..EmbeddingOptions::default()
    };
    EmbeddingExchange::with_options(comm, p, cap, &opts)
}

/// Zipf ids with the awkward cases mixed in: every third bag of table 0
/// empty, bags with padding in the middle, a repeated id inside a bag, and
/// (with 2+ ranks) the last rank asking for nothing at all.
fn tricky_ids(p: &Problem, seed: u64) -> Vec<Vec<u32>> {
    let mut ids = emb::generate_ids(p, 1.2, seed);
    let (b, q) = (p.batch as usize, p.pooling as usize);
    for (r, v) in ids.iter_mut().enumerate() {
        for s in 0..b {
            let bag = &mut v[s * q..(s + 1) * q];
            if s % 3 == 0 {
                bag.fill(PAD);
            } else if s % 3 == 1 {
                bag[q / 2] = PAD;
                bag[0] = bag[q - 1];
            }
        }
        // The largest row id, so the last shard's last row is used.
        v[q * b + 1] = p.rows - 1;
        if p.ranks > 1 && r == p.ranks as usize - 1 {
            v.fill(PAD);
        }
    }
    ids
}

struct Outcome {
    outs: Vec<Vec<Vec<f32>>>,
    tables: Vec<f32>,
}

impl Outcome {
    /// Every rank's (outputs per step, shard), the shards put back into
    /// whole tables.
    fn of(p: &Problem, res: Vec<(Vec<Vec<f32>>, Vec<f32>)>) -> Outcome {
        let mut tables = vec![0f32; emb::initial_tables(p).len()];
        for (r, (_, shard)) in res.iter().enumerate() {
            emb::unshard(p, &mut tables, shard, r as u32);
        }
        Outcome {
            outs: res.into_iter().map(|(o, _)| o).collect(),
            tables,
        }
    }

    /// Every step's forward on every rank and the tables after the last
    /// step against the sequential reference (SGD rate `lr`, the same ids
    /// every step); returns the reference tables.
    fn check(&self, p: &Problem, ids: &[Vec<u32>], lr: f32, what: &str) -> Vec<f32> {
        let mut tables = emb::initial_tables(p);
        for step in 0..self.outs.first().map_or(0, Vec::len) {
            for (r, outs) in self.outs.iter().enumerate() {
                let want = emb::reference_forward(p, &tables, &ids[r]);
                assert_close(&outs[step], &want, &format!("{what}, step {step}, rank {r} forward"));
            }
            emb::reference_backward(p, &mut tables, ids, lr);
        }
        assert_close(&self.tables, &tables, &format!("{what}, tables"));
        tables
    }
}

/// How the ranks send their request lists: from one block per owner, or in
/// slices from every block (every list, whatever its length).
#[derive(Clone, Copy, Debug)]
enum Lists {
    PerOwner,
    Sliced,
}

fn run(backend: Backend, p: &Problem, ids: &[Vec<u32>], steps: usize, lr: f32, lists: Lists) -> Outcome {
    run_over(backend, p, ids, steps, lr, TransportKind::P2p, lists)
}

fn run_over(backend: Backend, p: &Problem, ids: &[Vec<u32>], steps: usize, lr: f32, transport: TransportKind, lists: Lists) -> Outcome {
    run_routed(backend, p, ids, (steps, lr), (transport, None), lists)
}

/// [`run_over`] with the pairs the transport sends through the NIC.
fn run_routed(
    backend: Backend,
    p: &Problem,
    ids: &[Vec<u32>],
    (steps, lr): (usize, f32),
    (transport, peers): (TransportKind, Option<RdmaPeers>),
    lists: Lists,
) -> Outcome {
    let tr = emb::traffic(p, ids);
    let cap = tr.max_pair.max(1) as u32;
    let init = emb::initial_tables(p);
    let res = Communicator::local(p.ranks as usize, backend, opts(p, cap), |comm| {
        let mut x = exchange_routed(comm, p, cap, cfg(comm, p.ranks), transport, peers.clone())?;
        if let Lists::Sliced = lists {
            x.set_sliced_list_bytes(0);
        }
        train_rank(comm, x, (p, ids, &init), (steps, lr))
    })
    .unwrap_or_else(|e| panic!("{backend:?} {transport:?} {lists:?} {p:?}: {e}"));
    Outcome::of(p, res)
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        // Integer-valued gradients: every partial sum is exact, so the only
        // slack is f32 rounding of `lr * sum` (far below a lost gradient's `lr`).
        assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{what}: element {i}: got {g}, want {w}");
    }
}

per_backend! {
    fn forward_and_backward_match_the_reference_for_1_to_8_ranks(backend: Backend) {
        for ranks in 1..=8u32 {
            let p = Problem {
                ranks,
                tables: 3,
                rows: 37 + ranks,
                dim: if ranks % 2 == 0 { 18 } else { 40 },
                batch: 6,
                pooling: 5,
            };
            let ids = tricky_ids(&p, ranks as u64);
            let (steps, lr) = (2, 0.125);
            // Odd rank counts send their lists in slices.
            let lists = if ranks % 2 == 1 { Lists::Sliced } else { Lists::PerOwner };
            let got = run(backend, &p, &ids, steps, lr, lists);
            let tables = got.check(&p, &ids, lr, &format!("{backend:?} {ranks} ranks"));
            // The tables did change, and a rank's empty bags gave zeros.
            assert_ne!(tables, emb::initial_tables(&p));
            assert!(
                got.outs[0][0][..p.dim as usize].iter().all(|v| *v == 0.0),
                "sample 0's empty bag of table 0"
            );
            assert!(got.outs[0][0].iter().any(|v| *v != 0.0));
            if ranks > 1 {
                assert!(
                    got.outs[ranks as usize - 1][0].iter().all(|v| *v == 0.0),
                    "the rank with no traffic"
                );
            }
        }
    }
}

#[test]
fn dedup_counts_and_capacity() {
    let p = Problem {
        ranks: 2,
        tables: 1,
        rows: 10,
        dim: 4,
        batch: 2,
        pooling: 3,
    };
    // Rank 0: ids 1,1,3 | 4,PAD,1 -> unique 1,3 (owner 1) and 4 (owner 0).
    let ids = vec![vec![1, 1, 3, 4, PAD, 1], vec![PAD; 6]];
    let tr = emb::traffic(&p, &ids);
    assert_eq!((tr.lookups, tr.unique, tr.unique_local, tr.max_pair), (5, 3, 1, 2));
    assert_eq!(tr.row_bytes(4), (5 * 16, 3 * 16));
}

/// `f`, with its rank's error on stderr as it happens: `Communicator::local`
/// returns the first error in rank order, so a rank that failed on the host
/// (and never launched its next kernel) would otherwise hide behind the
/// wait timeouts of the lower ranks it left waiting.
fn noting<R>(f: impl Fn(&Communicator) -> doorbell::Result<R> + Sync) -> impl Fn(&Communicator) -> doorbell::Result<R> + Sync {
    move |comm| {
        let r = f(comm);
        if let Err(e) = &r {
            eprintln!("rank {}: failed: {e}", comm.rank());
        }
        r
    }
}

/// The failure tests' problem: 3 ranks, 2 tables of 20 rows, 4 samples,
/// bags of 3.
const FAIL_PROBLEM: Problem = Problem {
    ranks: 3,
    tables: 2,
    rows: 20,
    dim: 8,
    batch: 4,
    pooling: 3,
};

/// `good` with an out-of-range id on each of `bad_ranks` (rank r gets
/// `rows + r - 1`), at table 1, sample 2, position 1 of its ids.
fn with_bad_ids(p: &Problem, good: &[Vec<u32>], bad_ranks: &[usize]) -> Vec<Vec<u32>> {
    let at = (p.batch as usize + 2) * p.pooling as usize + 1;
    let mut bad = good.to_vec();
    for &r in bad_ranks {
        bad[r][at] = p.rows + r as u32 - 1;
    }
    bad
}

/// One rank of a failure test: its exchange (tables loaded), its shard as
/// loaded, its bad and good ids, its upstream gradient, and an output
/// buffer filled with `canary`, on stream `s`.
struct FailRank<'c> {
    x: EmbeddingExchange<'c>,
    shard: Vec<f32>,
    bad: DeviceBuffer<u32>,
    good: DeviceBuffer<u32>,
    grad: DeviceBuffer<f32>,
    canary: Vec<f32>,
    out: DeviceBuffer<f32>,
    s: Stream,
}

impl<'c> FailRank<'c> {
    fn new(comm: &'c Communicator, p: &Problem, cap: u32, init: &[f32], bad: &[Vec<u32>], good: &[Vec<u32>]) -> doorbell::Result<Self> {
        let r = comm.rank() as u32;
        let dev = comm.device();
        let x = exchange(comm, p, cap, cfg(comm, p.ranks), TransportKind::P2p)?;
        let shard = emb::shard_of(p, init, r);
        x.load_shard(&shard)?;
        let canary = vec![-7.5f32; p.out_len()];
        Ok(FailRank {
            x,
            shard,
            bad: dev.alloc_from(&bad[r as usize])?,
            good: dev.alloc_from(&good[r as usize])?,
            grad: dev.alloc_from(&emb::upstream_grad(p, r))?,
            out: dev.alloc_from(&canary)?,
            canary,
            s: dev.new_stream()?,
        })
    }

    /// Neither the output nor the tables were written.
    fn untouched(&mut self) -> doorbell::Result<bool> {
        Ok(self.out.to_host()? == self.canary && self.x.shard()? == self.shard)
    }
}

/// Runs `body` on the ranks of [`FAIL_PROBLEM`] with a wait budget of
/// `wait`, each with its [`FailRank`] (tables loaded from `init`); a
/// rank's error is printed as it happens.
fn fail_world<R: Send>(
    backend: Backend,
    wait: Duration,
    init: &[f32],
    bad: &[Vec<u32>],
    good: &[Vec<u32>],
    body: impl for<'c> Fn(&'c Communicator, FailRank<'c>) -> doorbell::Result<R> + Sync,
) -> doorbell::Result<Vec<R>> {
    let p = FAIL_PROBLEM;
    let cap = (p.lookups() as u32).max(1);
    let opts = CommOptions {
        wait_timeout: wait,
        ..opts(&p, cap)
    };
    Communicator::local(
        p.ranks as usize,
        backend,
        opts,
        noting(|comm| body(comm, FailRank::new(comm, &p, cap, init, bad, good)?)),
    )
}

/// The good step after a failed one was right: every rank's output
/// (`next`) against the reference forward of its good ids, and the tables
/// its shard makes up with its peers' against the reference backward.
fn assert_next_step<'a>(backend: Backend, init: &[f32], good: &[Vec<u32>], steps: impl Iterator<Item = (&'a [f32], &'a [f32])>) {
    let p = FAIL_PROBLEM;
    let mut tables = vec![0f32; init.len()];
    for (r, (next, shard)) in steps.enumerate() {
        let want = emb::reference_forward(&p, init, &good[r]);
        assert_close(next, &want, &format!("{backend:?} rank {r}: next step"));
        emb::unshard(&p, &mut tables, shard, r as u32);
    }
    let mut want = init.to_vec();
    emb::reference_backward(&p, &mut want, good, 0.5);
    assert_close(&tables, &want, &format!("{backend:?}: tables after the next step"));
}

/// The wait budget of the out-of-range test: long, so that a rank left
/// waiting for a peer that stopped shows up as a slow test, not only as an
/// error; short enough that such a wait still ends in an error naming its
/// phase within a minute, rather than the test being killed.
const LONG_WAIT: Duration = Duration::from_secs(20);
/// How long a failed step may take, every rank included: far below
/// `LONG_WAIT` (every rank learns of the error from one exchange of
/// verdicts, nobody waits out a budget).
const FAIL_FAST: Duration = Duration::from_secs(10);

per_backend! {
    fn out_of_range_ids_fail_fast_on_every_rank_with_nothing_written_then_the_next_step_runs(backend: Backend) {
        let p = FAIL_PROBLEM;
        let good = emb::generate_ids(&p, 0.0, 7);
        // Rank 1, table 1, sample 2, position 1; in the second case rank 2
        // too (the lowest failing rank is the one named to the others); in
        // the third rank 2 alone, so that a good rank (1) hears a good rank's
        // (0) verdict from a block other than the one that heard its own.
        for bad_ranks in [vec![1usize], vec![2, 1], vec![2]] {
            let first_bad = *bad_ranks.iter().min().unwrap() as u32;
            let bad = with_bad_ids(&p, &good, &bad_ranks);
            let err = emb::validate_ids(&p, &bad).unwrap_err().to_string();
            assert!(err.contains(&format!("rank {first_bad}, table 1, sample 2, position 1")), "{err}");
            let init = emb::initial_tables(&p);
            let res = fail_world(backend, LONG_WAIT, &init, &bad, &good, |comm, mut f| {
                    let r = comm.rank() as u32;
                    f.x.set_stamps(true);
                    // Progress on stderr as it happens (`--nocapture`): if a
                    // step stalls, the last line of each rank says where.
                    let since = std::time::Instant::now();
                    let note = |what: &str| {
                        eprintln!(
                            "{backend:?} bad {bad_ranks:?} rank {r} at {:.1} ms: {what}",
                            since.elapsed().as_secs_f64() * 1e3
                        )
                    };
                    note(&format!(
                        "grid {:?} x {:?}, (registers, blocks per SM) {:?}",
                        f.x.launch_config().grid,
                        f.x.launch_config().block,
                        f.x.residency()
                    ));
                    // Device-side check (the host check skipped on purpose),
                    // every rank starting together.
                    comm.barrier()?;
                    let t0 = std::time::Instant::now();
                    f.x.forward(&f.s, &f.bad, &mut f.out)?;
                    let e = f.x.finish(&f.s).err();
                    let took = t0.elapsed();
                    note("failed forward finished");
                    let (fwd, _) = f.x.stamps()?;
                    note("stamps read");
                    let phases: Vec<String> = STAMP_FWD
                        .iter()
                        .zip(&fwd)
                        .map(|(n, t)| t.map_or(format!("{n} -"), |t| format!("{n} {:.1}us", t as f64 / 1e3)))
                        .collect();
                    let why = e.as_ref().map_or("no error".to_string(), |e| e.to_string());
                    note(&format!("failed forward in {took:?} [{}]: {why}", phases.join(", ")));
                    let untouched = f.untouched()?;
                    note("output and shard read");
                    // The backward of the failed forward runs nowhere.
                    f.x.backward(&f.s, &f.grad, 0.5)?;
                    note("backward refused");
                    let eb = f.x.finish(&f.s).err();
                    note("refused backward done");
                    let still = f.untouched()?;
                    note("output and shard read again");
                    // Every rank's reads are done before any rank launches
                    // the next step: ranks sharing a GPU share its hardware
                    // work queues, and a copy queued behind a peer's kernel
                    // that waits for this rank's vote waits for it (seen on
                    // the H200, see the README's limits).
                    comm.barrier()?;
                    // The protocol is intact: a good step runs and is right.
                    f.x.forward(&f.s, &f.good, &mut f.out)?;
                    note("next forward launched");
                    f.x.finish(&f.s)?;
                    note("next forward done");
                    let next = f.out.to_host()?;
                    f.x.backward(&f.s, &f.grad, 0.5)?;
                    f.x.finish(&f.s)?;
                    note("next backward done");
                    Ok((e, took, untouched, eb, still, next, f.x.shard()?))
                })
            .unwrap_or_else(|e| panic!("{backend:?} bad {bad_ranks:?}: {e}"));
            for (r, (e, took, untouched, eb, still, _, _)) in res.iter().enumerate() {
                let what = format!("{backend:?}, bad ids on ranks {bad_ranks:?}, rank {r}");
                let e = e.as_ref().unwrap_or_else(|| panic!("{what}: no error"));
                let msg = e.to_string();
                let own = |e: &EmbeddingError, rank: u32| {
                    matches!(e, EmbeddingError::BadId { rank: rr, table: 1, sample: 2, position: 1, id, rows: 20 }
                        if *rr == rank && *id == p.rows + rank - 1)
                };
                match e {
                    EmbeddingError::PeerFailed { rank, failed, cause } if !bad_ranks.contains(&r) => {
                        assert_eq!((*rank, *failed), (r as u32, first_bad), "{what}: {msg}");
                        assert!(own(cause, first_bad), "{what}: {msg}");
                        let id = p.rows + first_bad - 1;
                        assert!(
                            msg.contains(&format!("rank {first_bad} failed"))
                                && msg.contains(&format!("id {id} (table 1, sample 2, position 1) is out of range")),
                            "{what}: {msg}"
                        );
                    }
                    e if bad_ranks.contains(&r) => {
                        assert!(own(e, r as u32), "{what}: {msg}");
                        assert!(msg.contains("is out of range: tables have 20 rows"), "{what}: {msg}");
                    }
                    _ => panic!("{what}: unexpected error {msg}"),
                }
                assert!(e.nothing_written(), "{what}: {msg}");
                assert!(
                    *took < FAIL_FAST,
                    "{what}: the failed step took {took:?} with a wait budget of {LONG_WAIT:?}: a rank waited for a peer \
                     that had stopped instead of learning of its error"
                );
                assert!(untouched, "{what}: the failed forward wrote the output or the tables");
                match eb {
                    Some(EmbeddingError::NoForward { rank }) => assert_eq!(*rank, r as u32, "{what}"),
                    other => panic!("{what}: the backward of a failed forward gave {other:?}"),
                }
                assert!(still, "{what}: the backward of a failed forward wrote something");
            }
            assert_next_step(backend, &init, &good, res.iter().map(|x| (&x.5[..], &x.6[..])));
        }
    }
}

/// The wait budget of the late-rank test: short, so that its timeouts
/// come quickly; the late rank starts `LATE` after its peers, past it.
const SHORT_WAIT: Duration = Duration::from_secs(2);
const LATE: Duration = Duration::from_secs(3);

per_backend! {
    /// A rank that launches a step later than the wait budget (what a driver
    /// call that waits for every kernel of the GPU did to rank 1 on an H200,
    /// right after a failed step): its peers give up on its verdict and report
    /// the timeout; their blocks still count in `rows_sig`, marked as given up,
    /// so the late rank learns of it in one message (no second budget: before,
    /// it waited for counts that never came), nothing is pooled or applied
    /// anywhere, and the step after runs and is right on every rank.
    fn a_rank_later_than_the_budget_learns_that_its_peers_gave_up_and_the_next_step_runs(backend: Backend) {
        let p = FAIL_PROBLEM;
        let late_rank = 1u32;
        let good = emb::generate_ids(&p, 0.0, 7);
        // As on the GPU: a failed step first (ranks 2 and 1), its backward
        // refused, then the late step.
        let bad = with_bad_ids(&p, &good, &[2, 1]);
        let init = emb::initial_tables(&p);
        let res = fail_world(backend, SHORT_WAIT, &init, &bad, &good, |comm, mut f| {
                let r = comm.rank() as u32;
                comm.barrier()?;
                f.x.forward(&f.s, &f.bad, &mut f.out)?;
                let failed = f.x.finish(&f.s).err().map(|e| e.to_string());
                f.x.backward(&f.s, &f.grad, 0.5)?;
                let refused = matches!(f.x.finish(&f.s), Err(EmbeddingError::NoForward { .. }));
                if r == late_rank {
                    std::thread::sleep(LATE);
                }
                let t0 = std::time::Instant::now();
                f.x.forward(&f.s, &f.good, &mut f.out)?;
                let late = f.x.finish(&f.s).err();
                let took = t0.elapsed();
                let untouched = f.out.to_host()? == f.canary;
                f.x.backward(&f.s, &f.grad, 0.5)?;
                let late_bwd = f.x.finish(&f.s).err();
                let still = f.untouched()?;
                // A rank that saw a device error has handled it once every
                // rank is past it.
                comm.barrier()?;
                let next = f.x.train(&f.s, &f.good, &f.grad, &mut f.out, 0.5, 1)?.remove(0);
                Ok((failed, refused, late, took, untouched, late_bwd, still, next, f.x.shard()?))
            })
        .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
        for (r, (failed, refused, late, took, untouched, late_bwd, still, _, _)) in res.iter().enumerate() {
            let what = format!("{backend:?}, rank {late_rank} late by {LATE:?}, rank {r}");
            assert!(failed.is_some() && *refused, "{what}: the failed step before: {failed:?}");
            let e = late.as_ref().unwrap_or_else(|| panic!("{what}: the late step passed"));
            if r as u32 == late_rank {
                assert!(
                    matches!(e, EmbeddingError::PeerTimedOut { rank, peer } if *rank == late_rank && *peer != late_rank),
                    "{what}: {e}"
                );
                assert!(e.nothing_written(), "{what}: {e}");
                assert!(
                    *took < SHORT_WAIT,
                    "{what}: the late step took {took:?} with a budget of {SHORT_WAIT:?}: it waited for counts its peers never sent"
                );
            } else {
                // The peers waited for the late rank's verdict and gave up.
                assert!(matches!(e, EmbeddingError::Device(_)), "{what}: {e}");
                assert!(e.to_string().contains("gave up"), "{what}: {e}");
            }
            assert!(untouched, "{what}: the late step wrote the output");
            assert!(
                matches!(late_bwd, Some(EmbeddingError::NoForward { .. })),
                "{what}: the backward of the late step gave {late_bwd:?}"
            );
            assert!(still, "{what}: the late step's backward wrote something");
        }
        assert_next_step(backend, &init, &good, res.iter().map(|x| (&x.7[..], &x.8[..])));
    }
}

per_backend! {
    fn the_pull_forward_matches_the_reference(backend: Backend) {
        let p = Problem {
            ranks: 4,
            tables: 2,
            rows: 30,
            dim: 24,
            batch: 5,
            pooling: 4,
        };
        let ids = tricky_ids(&p, 3);
        let init = emb::initial_tables(&p);
        let cap = emb::traffic(&p, &ids).max_pair.max(1) as u32;
        let outs = Communicator::local(4, backend, opts(&p, cap), |comm| {
            let r = comm.rank() as u32;
            let dev = comm.device();
            let x = exchange(comm, &p, cap, cfg(comm, p.ranks), TransportKind::P2p)?;
            x.load_shard(&emb::shard_of(&p, &init, r))?;
            let ids_d = dev.alloc_from(&ids[r as usize])?;
            let mut out = dev.alloc_zeroed::<f32>(p.out_len())?;
            let s = dev.new_stream()?;
            x.forward_pull(&s, &ids_d, &mut out)?;
            comm.synchronize(&s)?;
            out.to_host()
        })
        .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
        for (r, o) in outs.iter().enumerate() {
            assert_close(
                o,
                &emb::reference_forward(&p, &init, &ids[r]),
                &format!("{backend:?} rank {r} pull"),
            );
        }
    }
}

/// Forward + backward over IBGDA (every peer through the soft NIC; the CPU
/// emulator only), 2 ranks, against the reference: the push path needs
/// only puts and signals, from symmetric buffers. The pull forward, which
/// needs peer pointers, is refused.
#[test]
fn forward_and_backward_over_ibgda_on_the_emulator() {
    let p = Problem {
        ranks: 2,
        tables: 2,
        rows: 41,
        dim: 20,
        batch: 6,
        pooling: 4,
    };
    for (ids, lists) in [(tricky_ids(&p, 7), Lists::PerOwner), (emb::generate_ids(&p, 1.1, 3), Lists::Sliced)] {
        let (steps, lr) = (2, 0.125);
        let got = run_over(Backend::Cpu, &p, &ids, steps, lr, TransportKind::Ibgda, lists);
        let tables = got.check(&p, &ids, lr, "IBGDA");
        assert_ne!(tables, emb::initial_tables(&p));
    }
    let r = Communicator::local(2, Backend::Cpu, opts(&p, 64), |comm| {
        let x = exchange(comm, &p, 64, cfg(comm, 2), TransportKind::Ibgda)?;
        let dev = comm.device();
        let ids = dev.alloc_zeroed::<u32>(p.lookups())?;
        let mut out = dev.alloc_zeroed::<f32>(p.out_len())?;
        x.forward_pull(&dev.new_stream()?, &ids, &mut out)
    });
    match r {
        Err(e) => assert!(e.to_string().contains("peer pointers"), "{e}"),
        Ok(_) => panic!("the pull forward ran over IBGDA"),
    }
}

/// Forward + backward over the CPU proxy (each row's put handed to a host
/// thread that posts the WQEs on the soft NIC), 2 ranks, against the
/// reference.
#[test]
fn forward_and_backward_over_the_cpu_proxy_on_the_emulator() {
    let p = Problem {
        ranks: 2,
        tables: 2,
        rows: 41,
        dim: 20,
        batch: 6,
        pooling: 4,
    };
    let (ids, lists) = (tricky_ids(&p, 11), Lists::PerOwner);
    let (steps, lr) = (2, 0.125);
    let got = run_over(Backend::Cpu, &p, &ids, steps, lr, TransportKind::Proxy, lists);
    let tables = got.check(&p, &ids, lr, "proxy");
    assert_ne!(tables, emb::initial_tables(&p));
}

/// The same over 4 ranks as 2 modeled nodes: the proxy reaches the rank of
/// its own node by load/store and the other node's through the NIC, and
/// its barriers mix both (release stores and signal requests).
#[test]
fn forward_and_backward_over_the_cpu_proxy_across_modeled_nodes() {
    let p = Problem {
        ranks: 4,
        tables: 3,
        rows: 43,
        dim: 12,
        batch: 5,
        pooling: 3,
    };
    let ids = tricky_ids(&p, 17);
    let via = (TransportKind::Proxy, Some(RdmaPeers::Nodes(2)));
    let got = run_routed(Backend::Cpu, &p, &ids, (2, 0.25), via, Lists::PerOwner);
    let tables = got.check(&p, &ids, 0.25, "proxy, 2 nodes");
    assert_ne!(tables, emb::initial_tables(&p));
}

/// The IBGDA forward and backward with a grid like a GPU's, scaled down:
/// 16 blocks of 2 warps per rank, so 8 blocks share each of the two QPs
/// to a peer (block `b` posts on QP `b mod 2`), warps of different blocks
/// interleave their reservations, most blocks signal before others have
/// put their rows, and 32-slot send queues wrap many times per step (flow
/// control and CQ polling under contention). Both soft NIC engines: the
/// host thread and the engine kernel. The test the GPU stall
/// (256 blocks x 256 threads, 256 slots) was chased with; it could not
/// reproduce it: the stall was a grid of two blocks per SM where the
/// IBGDA entries' registers leave room for one, so half the grid never
/// started (the emulator runs every block at once); see
/// `embedding_residency.rs`.
#[test]
fn ibgda_with_many_blocks_sharing_small_send_queues() {
    use doorbell::comm::{IbgdaOptions, SoftNicEngine};
    let p = Problem {
        ranks: 2,
        tables: 4,
        rows: 200,
        dim: 16,
        batch: 16,
        pooling: 8,
    };
    let ids = emb::generate_ids(&p, 1.1, 3);
    let cap = emb::traffic(&p, &ids).max_pair.max(1) as u32;
    let init = emb::initial_tables(&p);
    let (steps, lr) = (2, 0.125);
    for engine in [SoftNicEngine::Thread, SoftNicEngine::Kernel] {
        let res = Communicator::local(p.ranks as usize, Backend::Cpu, opts(&p, cap), |comm| {
            let io = IbgdaOptions {
                sq_size: 32,
                engine: Some(engine),
                ..IbgdaOptions::default()
            };
            comm.ibgda_with(&io)?;
            let lc = LaunchConfig::linear(16, 64).with_shared_mem(SHARED_BYTES);
            train_rank(
                comm,
                exchange(comm, &p, cap, lc, TransportKind::Ibgda)?,
                (&p, &ids, &init),
                (steps, lr),
            )
        })
        .unwrap_or_else(|e| panic!("{engine:?}: {e}"));
        Outcome::of(&p, res).check(&p, &ids, lr, &format!("{engine:?}"));
    }
}

/// One rank's share of a training run through the exchange `x`: its shard
/// of `init` loaded, `steps` steps of its lookups; the forwards' outputs
/// and the shard after.
fn train_rank(
    comm: &Communicator,
    mut x: EmbeddingExchange<'_>,
    (p, ids, init): (&Problem, &[Vec<u32>], &[f32]),
    (steps, lr): (usize, f32),
) -> doorbell::Result<(Vec<Vec<f32>>, Vec<f32>)> {
    let r = comm.rank() as u32;
    let dev = comm.device();
    x.load_shard(&emb::shard_of(p, init, r))?;
    let ids_d = dev.alloc_from(&ids[r as usize])?;
    let grad = dev.alloc_from(&emb::upstream_grad(p, r))?;
    let mut out = dev.alloc_zeroed::<f32>(p.out_len())?;
    let s = dev.new_stream()?;
    let outs = x.train(&s, &ids_d, &grad, &mut out, lr, steps)?;
    Ok((outs, x.shard()?))
}

/// One warp per rank puts hundreds of rows to its peer through the NIC,
/// one warp put per row: over IBGDA (both soft NIC engines) and the CPU
/// proxy, rows of an odd width; forward and tables after two steps
/// against the reference. A wrong row index lands a row in another
/// request's slot.
#[test]
fn one_warp_gathers_hundreds_of_rows_through_the_nic() {
    use doorbell::comm::{IbgdaOptions, SoftNicEngine};
    let p = Problem {
        ranks: 2,
        tables: 2,
        rows: 2000,
        dim: 13,
        batch: 96,
        pooling: 4,
    };
    let ids = emb::generate_ids(&p, 0.0, 5);
    let cap = emb::traffic(&p, &ids).max_pair.max(1) as u32;
    // The rows each rank asks its peer for (distinct (table, id) the other
    // rank owns): hundreds, all through the owner's one warp.
    let per_table = (p.batch * p.pooling) as usize;
    let asked = (0..p.ranks).map(|r| {
        let theirs = ids[r as usize].iter().enumerate().filter(|(_, &id)| id % p.ranks != r);
        theirs
            .map(|(i, &id)| (i / per_table, id))
            .collect::<std::collections::HashSet<_>>()
            .len()
    });
    let fewest = asked.min().unwrap_or(0);
    assert!(fewest > 256, "{fewest} rows asked across ranks: too few");
    let init = emb::initial_tables(&p);
    let (steps, lr) = (2, 0.125);
    let runs = [
        (TransportKind::Ibgda, Some(SoftNicEngine::Thread)),
        (TransportKind::Ibgda, Some(SoftNicEngine::Kernel)),
        (TransportKind::Proxy, None),
    ];
    for (transport, engine) in runs {
        let res = Communicator::local(p.ranks as usize, Backend::Cpu, opts(&p, cap), |comm| {
            if let Some(engine) = engine {
                let io = IbgdaOptions {
                    engine: Some(engine),
                    ..IbgdaOptions::default()
                };
                comm.ibgda_with(&io)?;
            }
            let lc = LaunchConfig::linear(1, 32).with_shared_mem(SHARED_BYTES);
            train_rank(comm, exchange(comm, &p, cap, lc, transport)?, (&p, &ids, &init), (steps, lr))
        })
        .unwrap_or_else(|e| panic!("{transport:?} {engine:?}: {e}"));
        Outcome::of(&p, res).check(&p, &ids, lr, &format!("{transport:?} {engine:?}"));
    }
}

per_backend! {
    /// The host-driven baseline the benchmark compares with (gather kernel →
    /// one copy per peer per table → pooling kernel, and back: gradient
    /// scatter, accumulate, apply) computes what the fused exchange does:
    /// forward and tables after two steps, skewed ids (rows asked for by
    /// several ranks and many times by one), 16-byte and scalar row paths.
    fn the_host_driven_baseline_matches_the_reference(backend: Backend) {
        use doorbell_examples::embedding::{Baseline, Mover};
        for dim in [40, 18] {
            let p = Problem {
                ranks: 3,
                tables: 2,
                rows: 50,
                dim,
                batch: 8,
                pooling: 6,
            };
            let ids = emb::generate_ids(&p, 1.1, 11);
            let max_recv = emb::max_recv(&p, &ids);
            let init = emb::initial_tables(&p);
            let (steps, lr) = (2, 0.125);
            let o = CommOptions {
                heap_bytes: emb::baseline_heap_bytes(&p, max_recv).next_multiple_of(1 << 20),
                ..opts(&p, 1)
            };
            let res = Communicator::local(p.ranks as usize, backend, o, |comm| {
                let r = comm.rank() as u32;
                let dev = comm.device();
                let mut bl = Baseline::new(comm, &p, max_recv, cfg(comm, p.ranks))?;
                bl.load_shard(&emb::shard_of(&p, &init, r))?;
                let ids_d = dev.alloc_from(&ids[r as usize])?;
                let grad = dev.alloc_from(&emb::upstream_grad(&p, r))?;
                let mut out = dev.alloc_zeroed::<f32>(p.out_len())?;
                let s = dev.new_stream()?;
                let mut outs = Vec::new();
                for _ in 0..steps {
                    bl.forward(&s, &ids_d, &mut out, Mover::Copies, None)?;
                    outs.push(out.to_host()?);
                    bl.backward(&s, &ids_d, &grad, lr, Mover::Copies, None)?;
                }
                Ok((outs, bl.shard()?))
            })
            .unwrap_or_else(|e| panic!("{backend:?} dim {dim}: {e}"));
            let tables = Outcome::of(&p, res).check(&p, &ids, lr, &format!("{backend:?} dim {dim}"));
            assert_ne!(tables, init, "the steps changed the tables");
        }
    }
}

/// Two ranks, two tables of 16 rows of 8 elements, 4 samples per rank,
/// 2 ids per bag: small enough for the error cases below.
fn small_problem() -> Problem {
    Problem {
        ranks: 2,
        tables: 2,
        rows: 16,
        dim: 8,
        batch: 4,
        pooling: 2,
    }
}

/// A peer whose part of the baseline's all-gather of row counts has the
/// wrong length makes `forward` fail with an error naming it, not panic.
#[test]
fn the_baseline_refuses_a_malformed_peer_part() {
    use doorbell_examples::embedding::{Baseline, Mover};
    let p = small_problem();
    let ids = emb::generate_ids(&p, 1.1, 3);
    let max_recv = emb::max_recv(&p, &ids);
    let init = emb::initial_tables(&p);
    let o = CommOptions {
        heap_bytes: emb::baseline_heap_bytes(&p, max_recv).next_multiple_of(1 << 20),
        ..opts(&p, 1)
    };
    let res = Communicator::local(2, Backend::Cpu, o, |comm| {
        let r = comm.rank() as u32;
        let dev = comm.device();
        let mut bl = Baseline::new(comm, &p, max_recv, cfg(comm, p.ranks))?;
        bl.load_shard(&emb::shard_of(&p, &init, r))?;
        if r == 1 {
            // Three bytes where rank 0 expects whole u32 counts.
            comm.world().all_gather_bytes(&[1, 2, 3])?;
            return Ok(());
        }
        let ids_d = dev.alloc_from(&ids[0])?;
        let mut out = dev.alloc_zeroed::<f32>(p.out_len())?;
        let s = dev.new_stream()?;
        bl.forward(&s, &ids_d, &mut out, Mover::Copies, None)
    });
    let e = res.unwrap_err().to_string();
    assert!(e.contains("rank 1 sent 3 bytes"), "{e}");
}

/// Bad input to the library's exchange is a typed error naming the
/// problem, before anything runs: a problem out of the kernels' limits or
/// of another world size, a launch shape the kernels cannot run (no shared
/// memory, part of a warp, a 2-D grid), buffers of the wrong length, a
/// backward before any forward or a second one of the same forward.
#[test]
fn bad_input_to_the_exchange_is_a_typed_error() {
    let p = small_problem();
    let collective = |e: doorbell::Error, what: &str| {
        let msg = e.to_string();
        assert!(
            matches!(
                e,
                doorbell::Error::Collective {
                    op: "embedding exchange",
                    ..
                }
            ),
            "{msg}"
        );
        assert!(msg.contains(what), "{msg} (expected it to say {what:?})");
    };
    let bad = Problem { tables: 0, ..p };
    collective(bad.check().unwrap_err(), "0 tables");
    collective(Problem { dim: 5000, ..p }.check().unwrap_err(), "dim 5000");
    let ids = emb::generate_ids(&p, 0.0, 1);
    let cap = emb::traffic(&p, &ids).max_pair.max(1) as u32;
    let res = Communicator::local(2, Backend::Cpu, opts(&p, cap), |comm| {
        let lc = LaunchConfig::linear(2, 32);
        let mut errs = Vec::new();
        for (launch, what) in [
            (lc, "shared memory"),
            (LaunchConfig::linear(2, 48).with_shared_mem(SHARED_BYTES), "48 threads per block"),
            (
                LaunchConfig {
                    grid: (2, 2, 1),
                    ..lc.with_shared_mem(SHARED_BYTES)
                },
                "1-D grid",
            ),
        ] {
            errs.push((exchange(comm, &p, cap, launch, TransportKind::P2p).err(), what));
        }
        let three = Problem { ranks: 3, ..p };
        errs.push((
            exchange(comm, &three, cap, cfg(comm, 2), TransportKind::P2p).err(),
            "the communicator 2",
        ));
        let mut x = exchange(comm, &p, cap, cfg(comm, 2), TransportKind::P2p)?;
        let dev = comm.device();
        let s = dev.new_stream()?;
        let ids_d = dev.alloc_from(&ids[comm.rank()])?;
        let short = dev.alloc_zeroed::<u32>(p.lookups() - 1)?;
        let grad = dev.alloc_zeroed::<f32>(p.out_len())?;
        let mut out = dev.alloc_zeroed::<f32>(p.out_len())?;
        errs.push((x.load_shard(&[0.0; 3]).err(), "a shard of 3 elements"));
        errs.push((x.forward(&s, &short, &mut out).err(), "the ids buffer holds 15 elements"));
        errs.push((x.backward(&s, &grad, 0.5).err(), "backward before any forward"));
        x.forward(&s, &ids_d, &mut out)?;
        x.finish(&s)?;
        x.backward(&s, &grad, 0.5)?;
        x.finish(&s)?;
        errs.push((x.backward(&s, &grad, 0.5).err(), "a second backward of forward 1"));
        // The exchange is intact: the next step runs.
        x.forward(&s, &ids_d, &mut out)?;
        x.finish(&s)?;
        Ok(errs)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for errs in res {
        for (e, what) in errs {
            collective(e.unwrap_or_else(|| panic!("no error where one says {what:?}")), what);
        }
    }
}
