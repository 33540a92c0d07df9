//! The all-reduce (`doorbell::coll`) and the pipeline rings on every
//! backend: 1..8 ranks, f32 and bf16, in place and out of place, every
//! algorithm, awkward sizes and chunks, consecutive launches (epochs), the
//! fused all-reduce with producers, ring credits under a slow consumer, and
//! argument errors. Every element of every rank is compared bit for bit
//! with the CPU reference; inputs differ per rank, element and launch.
//!
//! Zero elements is a valid all-reduce that launches nothing.

use doorbell_tests::per_backend;
use std::time::Duration;

use doorbell::coll::reference::{allreduce_sum, first_mismatch};
use doorbell::coll::{Algo, AllReduce, AllReduceOptions, Bf16, DType, HostElement, TransportKind};
use doorbell::comm::{CommOptions, Communicator, RdmaPeers};
use doorbell::{Backend, Error, ForTransport, Function, Kernel, LaunchConfig, Stream};
use doorbell_example_kernels::allreduce::{fused_grad_allreduce, fused_grad_allreduce_512, grad, COMPUTE_GEMV, COMPUTE_HASH};
use doorbell_kernels::coll::allreduce::AllReduceArgs;
use doorbell_kernels::pipeline::RingSet;
use doorbell_kernels::transport::{Ibgda, P2p, Proxy, Routed};
use doorbell_test_kernels::pipeline::ring_credits;

fn opts() -> CommOptions {
    CommOptions {
        heap_bytes: 64 << 20,
        wait_timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

/// Rank `r`'s element `i` in launch `launch`: differs per rank, element and
/// launch, and is not an integer (so bf16 rounding is exercised).
fn value(r: usize, i: usize, launch: u64) -> f32 {
    let h = ((r as u64) * 131 + (i as u64) * 31 + launch * 7) % 17;
    (h as f32 - 8.0) * 0.3125 + (i % 5) as f32 * 0.01 + r as f32 * 0.001
}

/// The all-reduce of every rank's producer gradients (`compute`) at
/// `step`, as `T`: what a fused launch must write, bit for bit.
fn fused_want<T: HostElement>(compute: u32, ranks: usize, elems: usize, step: u32) -> Vec<T> {
    let inputs: Vec<Vec<T>> = (0..ranks)
        .map(|r| (0..elems).map(|i| T::from_f32(grad(compute, r as u32, i as u64, step))).collect())
        .collect();
    allreduce_sum(&inputs)
}

/// One fused step into a fresh output of `elems` `T`: `launch` gets
/// `fused_args`' arguments and grid. Returns the index of the first
/// element whose bits differ from [`fused_want`]'s.
fn fused_step<T: HostElement>(
    comm: &Communicator,
    ar: &AllReduce,
    s: &Stream,
    (elems, compute, step): (usize, u32, u32),
    launch: impl FnOnce(AllReduceArgs, LaunchConfig) -> doorbell::Result<()>,
) -> doorbell::Result<Option<usize>> {
    let mut out = comm.device().alloc_zeroed::<T>(elems)?;
    let (args, cfg) = ar.fused_args(s, &mut out)?.expect("elements");
    launch(args, cfg)?;
    comm.synchronize(s)?;
    let want = fused_want::<T>(compute, comm.world_size(), elems, step);
    Ok(out.to_host()?.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits()))
}

/// [`fused_step`] with the element type `dtype`.
fn fused_step_of(
    dtype: DType,
    comm: &Communicator,
    ar: &AllReduce,
    s: &Stream,
    at: (usize, u32, u32),
    launch: impl FnOnce(AllReduceArgs, LaunchConfig) -> doorbell::Result<()>,
) -> doorbell::Result<Option<usize>> {
    match dtype {
        DType::F32 => fused_step::<f32>(comm, ar, s, at, launch),
        DType::Bf16 => fused_step::<Bf16>(comm, ar, s, at, launch),
    }
}

/// A fused all-reduce (`options` with `fused` set) of `elems` `dtype` over
/// `comm`, the example kernel `K` that launches it with its producer, and a
/// new stream.
fn fused<K: Kernel>(
    comm: &Communicator,
    elems: usize,
    dtype: DType,
    options: AllReduceOptions,
) -> doorbell::Result<(AllReduce<'_>, Function<K>, Stream)> {
    let ar = AllReduce::with_options(comm, elems, dtype, &AllReduceOptions { fused: true, ..options })?;
    let f = comm.load_module(&doorbell_examples::USER_KERNELS)?.function::<K>()?;
    Ok((ar, f, comm.device().new_stream()?))
}

#[derive(Clone, Copy, Debug)]
struct Case {
    elems: usize,
    algo: Option<Algo>,
    in_place: bool,
    chunk_bytes: Option<u64>,
    launches: u64,
}

/// Runs `case` on this rank with element type `T`; checks every element.
fn run_case<T: HostElement>(comm: &Communicator, case: Case) -> doorbell::Result<()> {
    run_case_with::<T>(comm, case, AllReduceOptions::default())
}

/// [`run_case`] with `base` for the options the case does not set (the
/// transport, its routes).
fn run_case_with<T: HostElement>(comm: &Communicator, case: Case, base: AllReduceOptions) -> doorbell::Result<()> {
    let opts = AllReduceOptions {
        algo: case.algo,
        chunk_bytes: case.chunk_bytes,
        ..base
    };
    let ar = AllReduce::with_options(comm, case.elems, T::DTYPE, &opts)?;
    if opts.transport != TransportKind::P2p && comm.world_size() > 1 && opts.rdma_peers != Some(RdmaPeers::Needed) {
        assert_eq!(ar.algo(), Algo::Pipelined, "a route without peer pointers runs pipelined");
    }
    let dev = comm.device();
    let stream = dev.new_stream()?;
    let ranks = comm.world_size();
    let me = comm.rank();
    for launch in 1..=case.launches {
        let inputs: Vec<Vec<T>> = (0..ranks)
            .map(|r| (0..case.elems).map(|i| T::from_f32(value(r, i, launch))).collect())
            .collect();
        let want = allreduce_sum(&inputs);
        let mut input = dev.alloc_from(&inputs[me])?;
        let mut out = dev.alloc_zeroed::<T>(if case.in_place { 0 } else { case.elems })?;
        // Every rank's host copies of the previous launch (reads) and of
        // this one (writes) are done before any rank launches: with ranks
        // sharing a GPU, a copy can queue behind a peer's kernel that waits
        // for this rank (docs: ranks sharing a GPU).
        comm.barrier()?;
        let got = if case.in_place {
            ar.run_in_place(&stream, &mut input)?;
            comm.synchronize(&stream)?;
            input.to_host()?
        } else {
            ar.run(&stream, &input, &mut out)?;
            comm.synchronize(&stream)?;
            assert_eq!(input.to_host()?, inputs[me], "rank {me}: the input changed (out of place)");
            out.to_host()?
        };
        if let Some(i) = first_mismatch(&got, &want) {
            panic!(
                "{} ranks, {:?}, {} ({:?}), rank {me}, launch {launch}: element {i} is {:?}, want {:?}",
                ranks,
                case,
                T::DTYPE.name(),
                ar.algo(),
                got.get(i),
                want.get(i)
            );
        }
    }
    Ok(())
}

fn run_cases(backend: Backend, ranks: usize, dtypes: &[DType], cases: &[Case]) {
    Communicator::local(ranks, backend, opts(), |comm| {
        for &case in cases {
            for &dtype in dtypes {
                match dtype {
                    DType::F32 => run_case::<f32>(comm, case)?,
                    DType::Bf16 => run_case::<Bf16>(comm, case)?,
                }
            }
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{backend:?}, {ranks} ranks: {e}"));
}

fn case(elems: usize, algo: Option<Algo>, in_place: bool, chunk_bytes: Option<u64>) -> Case {
    Case {
        elems,
        algo,
        in_place,
        chunk_bytes,
        launches: 1,
    }
}

per_backend! {
    fn one_to_eight_ranks_with_the_automatic_choice(backend: Backend) {
        for ranks in 1..=8 {
            run_cases(
                backend,
                ranks,
                &[DType::F32, DType::Bf16],
                &[case(1000, None, false, None), case(333, None, true, None)],
            );
        }
    }
}

per_backend! {
    fn every_algorithm_type_placement_and_awkward_size(backend: Backend) {
        let algos = [Algo::Ll, Algo::OneShot, Algo::TwoShot, Algo::Pipelined];
        for ranks in [2, 3, 5] {
            let mut cases = Vec::new();
            for algo in algos {
                for elems in [1, 7, 4099] {
                    for in_place in [false, true] {
                        // 256-byte chunks: 64 elements, dividing neither the
                        // counts nor the shards.
                        cases.push(case(elems, Some(algo), in_place, Some(256)));
                    }
                }
            }
            run_cases(backend, ranks, &[DType::F32, DType::Bf16], &cases);
        }
    }
}

per_backend! {
    fn one_rank_is_a_copy_in_place_or_not(backend: Backend) {
        run_cases(
            backend,
            1,
            &[DType::F32, DType::Bf16],
            &[
                case(1, None, false, None),
                case(1001, None, true, None),
                case(1001, Some(Algo::Pipelined), false, Some(512)),
            ],
        );
    }
}

per_backend! {
    fn a_million_and_three_elements(backend: Backend) {
        run_cases(
            backend,
            2,
            &[DType::F32],
            &[case(1_000_003, Some(Algo::TwoShot), false, Some(300_000))],
        );
        run_cases(backend, 3, &[DType::Bf16], &[case(1_000_003, None, true, None)]);
        run_cases(
            backend,
            2,
            &[DType::Bf16],
            &[case(1_000_003, Some(Algo::Pipelined), false, Some(200_000))],
        );
    }
}

per_backend! {
    fn consecutive_launches_need_no_reset(backend: Backend) {
        let cases: Vec<Case> = [Algo::Ll, Algo::OneShot, Algo::TwoShot, Algo::Pipelined]
            .into_iter()
            .map(|algo| Case {
                launches: 5,
                ..case(777, Some(algo), false, Some(1024))
            })
            .collect();
        run_cases(backend, 4, &[DType::F32], &cases);
        // Two all-reduces of one communicator, interleaved, each with its
        // own epochs.
        Communicator::local(3, backend, opts(), |comm| {
            let a = AllReduce::new(comm, 100, DType::F32)?;
            let b = AllReduce::with_options(
                comm,
                100,
                DType::F32,
                &AllReduceOptions {
                    algo: Some(Algo::Pipelined),
                    stages: Some(1),
                    ..Default::default()
                },
            )?;
            let dev = comm.device();
            let s = dev.new_stream()?;
            for launch in 1..=4u64 {
                for ar in [&a, &b] {
                    let mut buf = dev.alloc_from(&(0..100).map(|i| value(comm.rank(), i, launch)).collect::<Vec<_>>())?;
                    comm.barrier()?; // host copies done on every rank before any launches
                    ar.run_in_place(&s, &mut buf)?;
                    comm.synchronize(&s)?;
                    let want: Vec<f32> = (0..100)
                        .map(|i| {
                            (0..3)
                                .map(|r| value(r, i, launch))
                                .fold(None, |acc: Option<f32>, x| Some(acc.map_or(x, |a| a + x)))
                                .unwrap()
                        })
                        .collect();
                    assert_eq!(first_mismatch(&buf.to_host()?, &want), None, "{:?}, launch {launch}", ar.algo());
                }
            }
            assert_eq!((a.launches(), b.launches()), (4, 4));
            Ok(())
        })
        .unwrap();
    }
}

per_backend! {
    fn fused_all_reduce_with_producers(backend: Backend) {
        type Fused = <fused_grad_allreduce as ForTransport<P2p>>::Kernel;
        // Every algorithm: one-shot and two-shot hand the producer the
        // peers' staging, pipelined its ring outbox, one rank the output.
        for (ranks, elems, dtype, compute, chunk, algo) in [
            (3, 5000, DType::F32, COMPUTE_HASH, 1024, Algo::Pipelined),
            (3, 5000, DType::F32, COMPUTE_HASH, 1024, Algo::TwoShot),
            (2, 4097, DType::Bf16, COMPUTE_GEMV, 4096, Algo::Pipelined),
            (2, 4097, DType::Bf16, COMPUTE_GEMV, 4096, Algo::TwoShot),
            (4, 999, DType::F32, COMPUTE_GEMV, 256, Algo::OneShot),
            (4, 999, DType::F32, COMPUTE_GEMV, 256, Algo::TwoShot),
            (2, 130, DType::Bf16, COMPUTE_HASH, 256, Algo::OneShot),
            (3, 1001, DType::F32, COMPUTE_GEMV, 256, Algo::Ll),
            (2, 131, DType::Bf16, COMPUTE_HASH, 256, Algo::Ll),
            (1, 300, DType::Bf16, COMPUTE_HASH, 256, Algo::Copy),
        ] {
            Communicator::local(ranks, backend, opts(), |comm| {
                let options = AllReduceOptions {
                    algo: Some(algo),
                    chunk_bytes: Some(chunk),
                    stages: Some(2),
                    ..Default::default()
                };
                let (ar, f, s) = fused::<Fused>(comm, elems, dtype, options)?;
                for step in 0..3u32 {
                    let launch = |args: AllReduceArgs, cfg: LaunchConfig| {
                        comm.barrier()?; // host copies done on every rank first
                        // SAFETY: arguments from fused_args for this world.
                        unsafe { s.launch(&f, cfg, (comm.p2p()?, args, compute, step)) }
                    };
                    let at = (elems, compute, step);
                    let bad = fused_step_of(dtype, comm, &ar, &s, at, launch)?;
                    assert_eq!(
                        bad,
                        None,
                        "{ranks} ranks, {elems} {}, {}, step {step}, rank {}",
                        dtype.name(),
                        algo.name(),
                        comm.rank()
                    );
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
        }
    }
}

per_backend! {
    /// Launches that overlap their predecessors (programmatic dependent launch,
    /// forced on) each read what the one before wrote: six in-place
    /// all-reduces queued back to back with no host wait between, every
    /// algorithm. A launch that read its input (or its epoch word) before its
    /// predecessor finished would sum a stale vector. The emulator never
    /// overlaps launches: there this checks the chain only.
    fn chained_launches_that_overlap_their_predecessors(backend: Backend) {
        let (ranks, elems) = (2usize, 5000usize);
        for algo in [Algo::Ll, Algo::OneShot, Algo::TwoShot, Algo::Pipelined] {
            Communicator::local(ranks, backend, opts(), |comm| {
                let ar = AllReduce::with_options(
                    comm,
                    elems,
                    DType::F32,
                    &AllReduceOptions {
                        algo: Some(algo),
                        chunk_bytes: Some(4096),
                        overlap_launch: Some(true),
                        ..Default::default()
                    },
                )?;
                assert!(ar.plan().launch_config().overlap_previous, "the plan overlaps its launches");
                let dev = comm.device();
                let s = dev.new_stream()?;
                let mut want: Vec<Vec<f32>> = (0..ranks)
                    .map(|r| (0..elems).map(|i| ((r * 131 + i * 31) % 17) as f32 - 8.0).collect())
                    .collect();
                let mut buf = dev.alloc_from(&want[comm.rank()])?;
                for _ in 0..6 {
                    ar.run_in_place(&s, &mut buf)?;
                    let sum = allreduce_sum(&want);
                    want = vec![sum; ranks];
                }
                comm.synchronize(&s)?;
                assert_eq!(
                    first_mismatch(&buf.to_host()?, &want[0]),
                    None,
                    "{}, rank {}",
                    algo.name(),
                    comm.rank()
                );
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{backend:?}, {}: {e}", algo.name()));
        }
    }
}

per_backend! {
    /// The arguments of one `fused_args` call serve every later launch into
    /// the same output, as a launch captured in a CUDA graph and replayed does:
    /// the blocks count their epochs on the device. Each launch's gradient
    /// differs (the step), so a launch that took an earlier launch's signals
    /// for its own would sum stale staging and mismatch.
    fn one_set_of_arguments_replays_launch_after_launch(backend: Backend) {
        type Fused = <fused_grad_allreduce as ForTransport<P2p>>::Kernel;
        let (ranks, elems) = (3usize, 3000usize);
        for algo in [Algo::Ll, Algo::OneShot, Algo::TwoShot, Algo::Pipelined] {
            Communicator::local(ranks, backend, opts(), |comm| {
                let options = AllReduceOptions {
                    algo: Some(algo),
                    chunk_bytes: Some(1024),
                    ..Default::default()
                };
                let (ar, f, s) = fused::<Fused>(comm, elems, DType::F32, options)?;
                let mut out = comm.device().alloc_zeroed::<f32>(elems)?;
                let (args, cfg) = ar.fused_args(&s, &mut out)?.expect("elements");
                for step in 0..5u32 {
                    comm.barrier()?; // every rank's read of the previous step is done
                    // SAFETY: arguments from fused_args for this world and `out`.
                    unsafe { s.launch(&f, cfg, (comm.p2p()?, args, COMPUTE_HASH, step))? };
                    comm.synchronize(&s)?;
                    let want = fused_want::<f32>(COMPUTE_HASH, ranks, elems, step);
                    let got = out.to_host()?;
                    assert_eq!(
                        first_mismatch(&got, &want),
                        None,
                        "{}, launch {step}, rank {}",
                        algo.name(),
                        comm.rank()
                    );
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
        }
    }
}

/// Rank 0 sends 24 chunks through a ring of 2 stages to a slow rank 1.
/// Returns the number of words rank 1 saw wrong.
fn ring_run(backend: Backend, credits: bool, launches: u64) -> u32 {
    type Ring = <ring_credits as ForTransport<P2p>>::Kernel;
    let (stages, words, n) = (2u32, 1024u64, 24u64);
    let out = Communicator::local(2, backend, opts(), |comm| {
        let dev = comm.device();
        let slots = comm.alloc::<u8>(RingSet::slot_area(2, stages, words * 4) as usize)?;
        let full = comm.alloc::<u64>(RingSet::counter_words(2, stages) as usize)?;
        let empty = comm.alloc::<u64>(RingSet::counter_words(2, stages) as usize)?;
        let ctl = comm.alloc::<u32>(1)?;
        let outbox = comm.alloc::<u32>(words as usize)?;
        let ring = RingSet {
            slots: slots.as_ptr() as u64,
            slot_bytes: words * 4,
            peer_stride: stages as u64 * words * 4,
            full: full.as_ptr() as u64,
            empty: empty.as_ptr() as u64,
            stages,
            peers: 2,
        };
        let mut bad = dev.alloc_zeroed::<u32>(1)?;
        let module = dev.load_module(&doorbell_tests::TEST_KERNELS)?;
        let f = module.function::<Ring>()?;
        let s = dev.new_stream()?;
        // Every rank has zeroed its counters before the first signal.
        comm.barrier()?;
        let threads = if dev.is_gpu() { 256 } else { 32 };
        // Sequence numbers go on from launch to launch: no reset between.
        for l in 0..launches {
            // SAFETY: the buffers above have the sizes ring_credits documents.
            unsafe {
                s.launch(
                    &f,
                    LaunchConfig::linear(1, threads),
                    (
                        comm.p2p()?,
                        ring,
                        ctl.as_mut_ptr(),
                        outbox.as_mut_ptr(),
                        l * n,
                        n,
                        words,
                        200_000u64,
                        credits as u32,
                        bad.as_mut_ptr(),
                    ),
                )?
            };
            comm.synchronize(&s)?;
        }
        Ok(bad.to_host()?[0])
    })
    .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
    out[1]
}

per_backend! {
    fn a_slow_consumer_never_sees_an_overwritten_chunk(backend: Backend) {
        assert_eq!(ring_run(backend, true, 2), 0, "{backend:?}: with credits");
        // The negative control: without credits the producer overwrites
        // slots under the slow consumer, and the test sees it.
        assert!(
            ring_run(backend, false, 1) > 0,
            "{backend:?}: without credits nothing was overwritten?"
        );
    }
}

per_backend! {
    fn zero_elements_launch_nothing(backend: Backend) {
        Communicator::local(2, backend, opts(), |comm| {
            let ar = AllReduce::new(comm, 0, DType::F32)?;
            let dev = comm.device();
            let s = dev.new_stream()?;
            let mut buf = dev.alloc_zeroed::<f32>(0)?;
            ar.run_in_place(&s, &mut buf)?;
            comm.synchronize(&s)?;
            assert_eq!(ar.launches(), 0);
            Ok(())
        })
        .unwrap();
    }
}

fn expect_collective_error(r: doorbell::Result<()>, needle: &str) {
    match r {
        Err(Error::Collective { reason, .. }) => assert!(reason.contains(needle), "{reason:?} does not mention {needle:?}"),
        other => panic!("expected an all-reduce error mentioning {needle:?}, got {other:?}"),
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    let backend = Backend::Cpu;
    Communicator::local(2, backend, opts(), |comm| {
        let dev = comm.device();
        let s = dev.new_stream()?;
        let ar = AllReduce::new(comm, 10, DType::F32)?;
        let input = dev.alloc_zeroed::<f32>(10)?;
        let mut short = dev.alloc_zeroed::<f32>(9)?;
        expect_collective_error(ar.run(&s, &input, &mut short), "9 elements");
        let mut wrong_type = dev.alloc_zeroed::<Bf16>(10)?;
        expect_collective_error(ar.run_in_place(&s, &mut wrong_type), "bf16");
        let mut out = dev.alloc_zeroed::<f32>(10)?;
        let bad = |o: AllReduceOptions| AllReduce::with_options(comm, 10, DType::F32, &o).map(|_| ());
        expect_collective_error(
            bad(AllReduceOptions {
                threads: Some(33),
                ..Default::default()
            }),
            "multiple of 32",
        );
        expect_collective_error(
            bad(AllReduceOptions {
                chunk_bytes: Some(0),
                ..Default::default()
            }),
            "chunk",
        );
        expect_collective_error(
            bad(AllReduceOptions {
                algo: Some(Algo::Copy),
                ..Default::default()
            }),
            "one rank",
        );
        // Another device's stream.
        let other = doorbell::Device::emulator(7).new_stream()?;
        expect_collective_error(ar.run(&other, &input, &mut out), "another device");
        Ok(())
    })
    .unwrap();
    let r = Communicator::local(9, backend, opts(), |comm| AllReduce::new(comm, 10, DType::F32).map(|_| ()));
    match r {
        Err(e) => assert!(e.to_string().contains("1..=8"), "{e}"),
        Ok(_) => panic!("9 ranks accepted"),
    }
}

per_backend! {
    /// `#[kernel(launch_bounds(threads = 512))]`: a block of 1024 threads (the
    /// device's limit, so only the bound refuses it) is an `InvalidLaunch`
    /// naming the bound, refused before anything runs (the output stays zero);
    /// the planned 512 threads run and sum.
    fn launch_bounds_refuse_a_larger_block(backend: Backend) {
        type Wide = <fused_grad_allreduce_512 as ForTransport<P2p>>::Kernel;
        assert_eq!(Wide::MAX_THREADS, 512);
        assert_eq!(<fused_grad_allreduce as ForTransport<P2p>>::Kernel::MAX_THREADS, 0, "no bound");
        let elems = 1000;
        Communicator::local(1, backend, opts(), |comm| {
            let options = AllReduceOptions {
                algo: Some(Algo::Copy),
                threads: Some(512),
                blocks: Some(1),
                ..Default::default()
            };
            let (ar, f, s) = fused::<Wide>(comm, elems, DType::F32, options)?;
            let mut out = comm.device().alloc_zeroed::<f32>(elems)?;
            let (args, cfg) = ar.fused_args(&s, &mut out)?.expect("elements");
            assert_eq!(cfg.block, (512, 1, 1), "the plan's block");
            let too_big = LaunchConfig {
                block: (1024, 1, 1),
                ..cfg
            };
            // SAFETY: the arguments are fused_args' for this world and
            // output; the launch is refused before it runs anyway.
            match unsafe { s.launch(&f, too_big, (comm.p2p()?, args, COMPUTE_HASH, 0)) } {
                Err(Error::InvalidLaunch { kernel, reason }) => {
                    assert_eq!(kernel, "fused_grad_allreduce_512_p2p");
                    assert!(
                        reason.contains("1024 threads") && reason.contains("launch_bounds(threads = 512)"),
                        "the reason names the block and the bound: {reason}"
                    );
                }
                other => panic!("{backend:?}: a block of 1024 threads was not refused: {other:?}"),
            }
            comm.synchronize(&s)?;
            assert!(out.to_host()?.iter().all(|&x| x == 0.0), "{backend:?}: the refused launch ran");
            // SAFETY: as above.
            unsafe { s.launch(&f, cfg, (comm.p2p()?, args, COMPUTE_HASH, 0))? };
            comm.synchronize(&s)?;
            let want = fused_want::<f32>(COMPUTE_HASH, 1, elems, 0);
            let got: Vec<u32> = out.to_host()?.iter().map(|x| x.to_bits()).collect();
            assert_eq!(
                got,
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{backend:?}: 512 threads"
            );
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
    }
}

/// The transports over the soft NIC (emulator only): IBGDA, the CPU proxy, mixed routes
/// (some pairs load/store), 2 and 3 ranks, f32 and bf16, awkward sizes and chunks, launches in
/// and out of place, the fused all-reduce — bit for bit against the CPU reference. One-shot
/// without peer pointers is refused. Modeled nodes: `allreduce_nodes.rs`.
#[test]
fn ibgda_and_routed_transports_on_the_emulator() {
    let transports = [
        (TransportKind::Ibgda, None, &[2usize, 3][..]),
        (TransportKind::Proxy, None, &[2, 3]),
        (TransportKind::Routed, Some(RdmaPeers::Pairs(vec![(0, 1)])), &[2, 3]),
        (TransportKind::Routed, Some(RdmaPeers::All), &[2, 3]),
    ];
    let cases = [
        Case {
            launches: 3,
            ..case(1001, None, false, Some(1024))
        },
        Case {
            launches: 2,
            ..case(77, None, true, None)
        },
        case(4097, Some(Algo::Pipelined), false, Some(256 * 4 + 1)),
    ];
    for (transport, rdma_peers, worlds) in transports {
        for &ranks in worlds {
            let base = AllReduceOptions {
                transport,
                rdma_peers: rdma_peers.clone(),
                stages: Some(2),
                ..Default::default()
            };
            Communicator::local(ranks, Backend::Cpu, opts(), |comm| {
                for &c in &cases {
                    run_case_with::<f32>(comm, c, base.clone())?;
                    run_case_with::<Bf16>(comm, c, base.clone())?;
                }
                fused_over(comm, &base, 2000, DType::F32)?;
                fused_over(comm, &base, 999, DType::Bf16)?;
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{transport:?} {rdma_peers:?}, {ranks} ranks: {e}"));
        }
    }
    // Peer pointers are needed by one-shot and two-shot: refused clearly.
    Communicator::local(2, Backend::Cpu, opts(), |comm| {
        for transport in [TransportKind::Ibgda, TransportKind::Routed, TransportKind::Proxy] {
            let r = AllReduce::with_options(
                comm,
                100,
                DType::F32,
                &AllReduceOptions {
                    algo: Some(Algo::OneShot),
                    transport,
                    rdma_peers: Some(RdmaPeers::All),
                    ..Default::default()
                },
            );
            expect_collective_error(r.map(|_| ()), "peer pointers");
        }
        Ok(())
    })
    .unwrap();
}

/// Two steps of the fused all-reduce (hash producer) over `base`'s transport.
fn fused_over(comm: &Communicator, base: &AllReduceOptions, elems: usize, dtype: DType) -> doorbell::Result<()> {
    let ar = AllReduce::with_options(
        comm,
        elems,
        dtype,
        &AllReduceOptions {
            algo: Some(Algo::Pipelined),
            chunk_bytes: Some(512),
            ..base.clone()
        },
    )?;
    assert_eq!(ar.transport(), base.transport);
    let dev = comm.device();
    let module = comm.load_module(&doorbell_examples::USER_KERNELS)?;
    let s = dev.new_stream()?;
    let ranks = comm.world_size();
    for step in 0..2u32 {
        let launch = |args: AllReduceArgs, cfg: LaunchConfig| -> doorbell::Result<()> {
            // SAFETY: arguments from fused_args for this world, launched
            // with the transport the all-reduce was made for.
            unsafe {
                match base.transport {
                    TransportKind::P2p => s.launch(
                        &module.function::<<fused_grad_allreduce as ForTransport<P2p>>::Kernel>()?,
                        cfg,
                        (comm.p2p()?, args, COMPUTE_HASH, step),
                    ),
                    TransportKind::Ibgda => s.launch(
                        &module.function::<<fused_grad_allreduce as ForTransport<Ibgda>>::Kernel>()?,
                        cfg,
                        (comm.ibgda()?, args, COMPUTE_HASH, step),
                    ),
                    TransportKind::Proxy => s.launch(
                        &module.function::<<fused_grad_allreduce as ForTransport<Proxy>>::Kernel>()?,
                        cfg,
                        (comm.proxy()?, args, COMPUTE_HASH, step),
                    ),
                    TransportKind::Routed => {
                        let peers = base.rdma_peers.clone().unwrap_or_default();
                        s.launch(
                            &module.function::<<fused_grad_allreduce as ForTransport<Routed>>::Kernel>()?,
                            cfg,
                            (comm.routed_with(&peers)?, args, COMPUTE_HASH, step),
                        )
                    }
                }
            }
        };
        let at = (elems, COMPUTE_HASH, step);
        let i = fused_step_of(dtype, comm, &ar, &s, at, launch)?;
        assert_eq!(
            i,
            None,
            "fused, {:?}, {ranks} ranks, {elems} {}, step {step}, rank {}",
            base,
            dtype.name(),
            comm.rank()
        );
    }
    Ok(())
}

/// What the plan makes of the placement (no device needed): with a GPU per
/// rank, LL up to 1 MiB, two-shot in 256 KiB chunks, launches overlapping
/// their predecessors; with ranks sharing a GPU, LL only up to 256 KiB,
/// 1 MiB chunks, no overlap, and all ranks' grids within half the SMs; the
/// option overrides the overlap either way; the emulator never overlaps.
#[test]
fn plans_follow_the_placement() {
    use doorbell::coll::{Placement, Plan, LL_MAX_BYTES_SHARED_GPU};
    let plan = |ranks: usize, bytes: u64, gpu: bool, per_gpu: usize, opts: &AllReduceOptions| {
        Plan::new(
            ranks,
            (bytes / 4) as usize,
            DType::F32,
            opts,
            Placement {
                gpu,
                sms: 132,
                ranks_per_gpu: per_gpu,
                peer_pointers: true,
                node_ranks: 1,
            },
        )
        .expect("a valid plan")
    };
    let auto = AllReduceOptions::default();
    let own = plan(2, 512 << 10, true, 1, &auto);
    assert_eq!((own.algo(), own.launch_config().overlap_previous), (Algo::Ll, true));
    let big = plan(2, 64 << 20, true, 1, &auto);
    assert_eq!((big.algo(), big.args.chunk_elems), (Algo::TwoShot, (256 << 10) / 4));
    assert!(big.launch_config().overlap_previous);
    // Plain two-shot on its own GPU: the wide entry's 512 threads; fused,
    // shared or on the emulator: 256 (64).
    assert_eq!(big.threads, 512);
    let fused = AllReduceOptions {
        fused: true,
        ..Default::default()
    };
    assert_eq!(plan(2, 64 << 20, true, 1, &fused).threads, 256);
    assert_eq!(plan(2, 64 << 20, true, 2, &auto).threads, 256);
    assert_eq!(plan(2, 64 << 20, false, 2, &auto).threads, 64);
    let shared = plan(2, 512 << 10, true, 2, &auto);
    assert_eq!((shared.algo(), shared.launch_config().overlap_previous), (Algo::TwoShot, false));
    assert_eq!(shared.args.chunk_elems, (1 << 20) / 4);
    assert_eq!(plan(2, LL_MAX_BYTES_SHARED_GPU, true, 2, &auto).algo(), Algo::Ll);
    for per_gpu in [2usize, 3, 4, 8] {
        let p = plan(per_gpu, 256 << 20, true, per_gpu, &auto);
        assert!(
            p.args.blocks as usize * per_gpu <= 132 / 2,
            "{per_gpu} ranks on one GPU: {} blocks each",
            p.args.blocks
        );
    }
    let off = AllReduceOptions {
        overlap_launch: Some(false),
        ..Default::default()
    };
    let on = AllReduceOptions {
        overlap_launch: Some(true),
        ..Default::default()
    };
    assert!(!plan(2, 8, true, 1, &off).launch_config().overlap_previous);
    assert!(plan(2, 8, true, 2, &on).launch_config().overlap_previous);
    assert!(!plan(2, 8, false, 2, &auto).launch_config().overlap_previous);
}

/// Explicit grids on a GPU shared by ranks stay within two blocks per SM
/// of the rank's share (every rank's blocks must be resident at once):
/// 2 x 132 blocks by each of 2 ranks on a 132-SM GPU is refused with the
/// most it takes (2 x 32); the same on a GPU of its own, and 64, are planned.
#[test]
fn explicit_grids_on_a_shared_gpu_stay_resident() {
    use doorbell::coll::{Placement, Plan};
    let plan = |per_gpu: usize, blocks: u32| {
        let opts = AllReduceOptions {
            fused: true,
            threads: Some(512),
            blocks: Some(blocks),
            ..Default::default()
        };
        let at = Placement {
            gpu: true,
            sms: 132,
            ranks_per_gpu: per_gpu,
            peer_pointers: true,
            node_ranks: 1,
        };
        Plan::new(2, 1 << 20, DType::F32, &opts, at)
    };
    let e = plan(2, 264).expect_err("264 blocks by each of 2 ranks on 132 SMs").to_string();
    assert!(
        e.contains("264 blocks per rank on a GPU shared by 2 ranks") && e.contains("1..=64"),
        "{e}"
    );
    assert!(plan(2, 65).is_err());
    assert_eq!(plan(2, 64).expect("two blocks per SM of the share").args.blocks, 64);
    assert_eq!(plan(1, 264).expect("a GPU of its own").args.blocks, 264);
}

per_backend! {
    /// Plain launches of plans made for a fused kernel (a block per SM share,
    /// most blocks with nothing to do at small sizes), on 3 and 4 ranks: what
    /// the benchmark's "fused" column runs with `--compute none`.
    fn plain_launches_of_wide_plans_on_several_ranks(backend: Backend) {
        for ranks in [3, 4] {
            Communicator::local(ranks, backend, opts(), |comm| {
                for algo in [Algo::Ll, Algo::OneShot, Algo::TwoShot] {
                    for elems in [2, 4099] {
                        let base = AllReduceOptions {
                            fused: true,
                            blocks: Some(22),
                            chunk_bytes: Some(16 << 10),
                            ..Default::default()
                        };
                        let case = Case {
                            elems,
                            algo: Some(algo),
                            in_place: false,
                            chunk_bytes: Some(16 << 10),
                            launches: 5,
                        };
                        run_case_with::<f32>(comm, case, base)?;
                    }
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{backend:?}, {ranks} ranks: {e}"));
        }
    }
}

per_backend! {
    /// Plain two-shot in blocks of 512 threads (the library's second entry,
    /// within 128 registers): f32 and bf16, in place and out of place, an
    /// awkward size, consecutive launches, 2 and 3 ranks. Another algorithm in
    /// such blocks, or a larger block, is refused before anything runs.
    fn two_shot_in_blocks_of_512_threads(backend: Backend) {
        for ranks in [2, 3] {
            Communicator::local(ranks, backend, opts(), |comm| {
                let wide = AllReduceOptions {
                    threads: Some(512),
                    ..Default::default()
                };
                for in_place in [false, true] {
                    let case = Case {
                        elems: 30_011,
                        algo: Some(Algo::TwoShot),
                        in_place,
                        chunk_bytes: Some(16 << 10),
                        launches: 3,
                    };
                    run_case_with::<f32>(comm, case, wide.clone())?;
                    run_case_with::<Bf16>(comm, case, wide.clone())?;
                }
                let refused = |algo, threads| {
                    let o = AllReduceOptions {
                        algo: Some(algo),
                        threads: Some(threads),
                        ..Default::default()
                    };
                    AllReduce::with_options(comm, 1000, DType::F32, &o).map(|_| ())
                };
                expect_collective_error(refused(Algo::OneShot, 512), "takes at most 256");
                expect_collective_error(refused(Algo::TwoShot, 1024), "takes at most 512");
                // A plan for the wide plain entry gives no arguments for a
                // fused kernel of the user's (its block would not fit one
                // without launch bounds).
                let plain = AllReduce::with_options(
                    comm,
                    1000,
                    DType::F32,
                    &AllReduceOptions {
                        algo: Some(Algo::TwoShot),
                        threads: Some(512),
                        ..Default::default()
                    },
                )?;
                let s = comm.device().new_stream()?;
                let mut out = comm.device().alloc_zeroed::<f32>(1000)?;
                expect_collective_error(plain.fused_args(&s, &mut out).map(|_| ()), "planned for plain launches");
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{backend:?}, {ranks} ranks: {e}"));
        }
    }
}

per_backend! {
    /// Four ranks (on a GPU machine: all on one GPU unless spread), each
    /// queueing 12 plain all-reduces back to back with no wait in between, on
    /// inputs that differ per launch; every output is checked after one
    /// synchronize. Where two or more ranks share a GPU, the library keeps
    /// one waiting launch in flight per rank (`Communicator::launch_waiting`):
    /// queued launches had stopped the all-reduce benchmark on the H200.
    fn queued_launches_on_ranks_that_share_a_gpu(backend: Backend) {
        const LAUNCHES: u64 = 12;
        let elems = 4099;
        Communicator::local(4, backend, opts(), |comm| {
            let dev = comm.device();
            assert_eq!(comm.one_launch_in_flight(), dev.is_gpu() && comm.ranks_per_gpu() >= 3);
            let s = dev.new_stream()?;
            for algo in [Algo::Ll, Algo::TwoShot] {
                let o = AllReduceOptions {
                    algo: Some(algo),
                    chunk_bytes: Some(4 << 10),
                    ..Default::default()
                };
                let ar = AllReduce::with_options(comm, elems, DType::F32, &o)?;
                let inputs: Vec<_> = (1..=LAUNCHES)
                    .map(|l| dev.alloc_from(&(0..elems).map(|i| value(comm.rank(), i, l)).collect::<Vec<f32>>()))
                    .collect::<doorbell::Result<_>>()?;
                let mut outs: Vec<_> = (0..LAUNCHES)
                    .map(|_| dev.alloc_zeroed::<f32>(elems))
                    .collect::<doorbell::Result<_>>()?;
                for (input, out) in inputs.iter().zip(outs.iter_mut()) {
                    ar.run(&s, input, out)?;
                }
                comm.synchronize(&s)?;
                for (l, out) in (1..=LAUNCHES).zip(&outs) {
                    let per_rank: Vec<Vec<f32>> = (0..4).map(|r| (0..elems).map(|i| value(r, i, l)).collect()).collect();
                    let want = allreduce_sum(&per_rank);
                    let got = out.to_host()?;
                    if let Some(i) = first_mismatch(&got, &want) {
                        panic!(
                            "{backend:?} {algo:?}, rank {}, launch {l}: element {i} is {}, want {}",
                            comm.rank(),
                            got[i],
                            want[i]
                        );
                    }
                }
                // The host copies of this round end on every rank before
                // any rank launches the next (README, "Ranks sharing a GPU").
                comm.barrier()?;
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
    }
}
