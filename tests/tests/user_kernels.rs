//! A kernel from a user's own crate, built to PTX through the build helper,
//! runs on every backend.

use doorbell::{Device, LaunchConfig};
use doorbell_example_kernels::byte_histogram;
use doorbell_examples::USER_KERNELS;
use doorbell_tests::per_backend;

/// Example 09's own file: the test runs its host code as written.
#[allow(dead_code)]
#[path = "../../examples/09_fused.rs"]
mod fused_example;

per_backend! {
    fn a_user_crate_kernel_with_shared_memory_and_atomics_runs_on_every_backend(dev: Device) {
        let n = 300_007usize;
        let data: Vec<u8> = (0..n).map(|i| (i * i % 251) as u8).collect();
        let mut want = vec![0u32; 256];
        for b in &data {
            want[*b as usize] += 1;
        }
        let m = dev.load_module(&USER_KERNELS).unwrap();
        let f = m.function::<byte_histogram>().unwrap();
        let d = dev.alloc_from(&data).unwrap();
        let mut bins = dev.alloc_zeroed::<u32>(256).unwrap();
        let s = dev.new_stream().unwrap();
        // SAFETY: n bytes, 256 bins, 1 KiB of shared memory.
        unsafe {
            s.launch(
                &f,
                LaunchConfig::linear(3, 96).with_shared_mem(1024),
                (d.as_ptr(), n as u64, bins.as_mut_ptr()),
            )
            .unwrap()
        };
        s.synchronize().unwrap();
        assert_eq!(bins.to_host().unwrap(), want, "{dev:?}");
    }
}

/// `pipeline!` on both sides of a ring (`examples/user-kernels/src/shift.rs`):
/// every rank computes its vector chunk by chunk and each chunk goes to the
/// next rank as soon as it is computed. Rings of 2 stages and 20 chunks
/// per producer block exercise the credits; three launches go on with the
/// sequence numbers (no reset); an awkward length leaves a short last
/// chunk. Every element of every rank must be the previous rank's element
/// of that launch, bit for bit. P2P on every backend; IBGDA through the
/// soft NIC on the emulator.
#[test]
fn a_pipeline_macro_kernel_shifts_vectors_chunk_by_chunk() {
    use doorbell::comm::{CommOptions, Communicator};
    use doorbell::{Backend, ForTransport};
    use doorbell_example_kernels::shift::{pipeline_shift, shift_value};
    use doorbell_kernels::pipeline::RingSet;
    use doorbell_kernels::transport::{Ibgda, P2p};
    type ShiftP2p = <pipeline_shift as ForTransport<P2p>>::Kernel;
    type ShiftIbgda = <pipeline_shift as ForTransport<Ibgda>>::Kernel;

    let (ranks, elems, chunk, pairs, stages) = (3usize, 10_007u64, 256u64, 2u64, 2u32);
    let mut cases = doorbell_tests::backends().iter().map(|d| (d.backend(), false)).collect::<Vec<_>>();
    cases.push((Backend::Cpu, true));
    for (backend, ibgda) in cases {
        let opts = CommOptions {
            heap_bytes: 16 << 20,
            wait_timeout: std::time::Duration::from_secs(30),
            ..Default::default()
        };
        Communicator::local(ranks, backend, opts, |comm| {
            let dev = comm.device();
            let world = comm.world_size() as u32;
            let slot_bytes = chunk * 4;
            let slots = comm.alloc::<u8>((pairs * RingSet::slot_area(world, stages, slot_bytes)) as usize)?;
            let full = comm.alloc::<u64>((pairs * RingSet::counter_words(world, stages)) as usize)?;
            let empty = comm.alloc::<u64>((pairs * RingSet::counter_words(world, stages)) as usize)?;
            let ctl = comm.alloc::<u32>(2 * pairs as usize)?;
            let outbox = comm.alloc::<f32>((pairs * chunk) as usize)?;
            let rings = RingSet {
                slots: slots.as_ptr() as u64,
                slot_bytes,
                peer_stride: stages as u64 * slot_bytes,
                full: full.as_ptr() as u64,
                empty: empty.as_ptr() as u64,
                stages,
                peers: world,
            };
            let module = comm.load_module(&USER_KERNELS)?;
            let s = dev.new_stream()?;
            let threads = if dev.is_gpu() { 256 } else { 32 };
            let cfg = LaunchConfig::linear(2 * pairs as u32, threads);
            let me = comm.rank() as u32;
            let prev = (me + world - 1) % world;
            let ib = if ibgda { Some(comm.ibgda()?) } else { None };
            let f_p2p = module.function::<ShiftP2p>()?;
            let f_ibgda = module.function::<ShiftIbgda>()?;
            // Every rank has zeroed its counters before the first signal.
            comm.barrier()?;
            for launch in 0..3u64 {
                let mut out = dev.alloc_from(&vec![f32::NAN; elems as usize])?;
                let args = (
                    rings,
                    ctl.as_ptr() as *mut u32,
                    outbox.as_ptr() as *mut f32,
                    out.as_mut_ptr(),
                    elems,
                    chunk,
                    launch,
                );
                // SAFETY: the ring sets, control words and outbox are this
                // communicator's symmetric allocations of the sizes the
                // kernel documents; `out` holds `elems` elements.
                unsafe {
                    match &ib {
                        Some(t) => s.launch(&f_ibgda, cfg, (*t, args.0, args.1, args.2, args.3, args.4, args.5, args.6))?,
                        None => s.launch(&f_p2p, cfg, (comm.p2p()?, args.0, args.1, args.2, args.3, args.4, args.5, args.6))?,
                    }
                };
                comm.synchronize(&s)?;
                let got = out.to_host()?;
                let bad = (0..elems)
                    .filter(|&i| got[i as usize].to_bits() != shift_value(prev, i, launch).to_bits())
                    .collect::<Vec<_>>();
                assert!(
                    bad.is_empty(),
                    "{backend:?}, ibgda {ibgda}, rank {me}, launch {launch}: {} of {elems} elements wrong, first at {} ({} instead of {})",
                    bad.len(),
                    bad[0],
                    got[bad[0] as usize],
                    shift_value(prev, bad[0], launch)
                );
                // Every rank's host reads are done before any rank launches
                // again (ranks sharing a GPU share its work queues).
                comm.barrier()?;
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{backend:?}, ibgda {ibgda}: {e}"));
    }
}

per_backend! {
    /// `p2p_bench`'s put kernel, issued by blocks and by every warp of the
    /// grid (`--put-by warp`): rank 1 receives every byte of an awkward size
    /// (a short last piece), the pattern different for each issuer and launch.
    fn the_bandwidth_put_delivers_every_byte_by_blocks_and_by_warps(dev: Device) {
        use doorbell::comm::{CommOptions, Communicator};
        use doorbell_example_kernels::comm::{put_bw_p2p, PINGPONG_OK};
        let bytes = 100_016u64;
        let backend = dev.backend();
        let threads = if dev.is_gpu() { 256 } else { 64 };
        Communicator::local(2, backend, CommOptions::default(), |comm| {
            let module = comm.load_module(&USER_KERNELS)?;
            let f = module.function::<put_bw_p2p>()?;
            let dev = comm.device();
            let dst = comm.alloc::<u8>(bytes as usize)?;
            let sig = comm.alloc::<u64>(1)?;
            let s = dev.new_stream()?;
            let mut expect = 0u64;
            for (launch, by_warp) in [(0u64, 0u32), (1, 1), (2, 0), (3, 1)] {
                let pattern: Vec<u8> = (0..bytes)
                    .map(|i| (i.wrapping_mul(7 + 2 * launch) >> 3) as u8 ^ launch as u8)
                    .collect();
                let src = dev.alloc_from(&pattern)?;
                let mut status = dev.alloc_zeroed::<u32>(1)?;
                let blocks = 3u32;
                expect += blocks as u64;
                comm.barrier()?;
                // SAFETY: `dst` and `src` hold `bytes`; `sig` symmetric, `status` one word.
                unsafe {
                    s.launch(
                        &f,
                        LaunchConfig::linear(blocks, threads),
                        (
                            comm.p2p()?,
                            dst.as_mut_ptr(),
                            src.as_ptr(),
                            bytes,
                            16384u64,
                            2u32,
                            by_warp,
                            sig.as_mut_ptr(),
                            expect,
                            status.as_mut_ptr(),
                        ),
                    )?
                };
                comm.synchronize(&s)?;
                assert_eq!(status.to_host()?[0], PINGPONG_OK, "rank {} launch {launch}", comm.rank());
                if comm.rank() == 1 {
                    let got = dst.to_host()?;
                    let wrong = (0..bytes as usize).filter(|&i| got[i] != pattern[i]).count();
                    assert_eq!(wrong, 0, "{backend:?} launch {launch} by_warp {by_warp}: bytes wrong");
                }
            }
            Ok(())
        })
        .unwrap();
    }
}

per_backend! {
    /// Example 09 (`examples/09_fused.rs`), its own host code: three steps
    /// of the producer → next-rank pipeline (`Communicator::rings`,
    /// `Pipe::run`) and of the all-gather (typed puts and signals), over
    /// P2P and IBGDA, two and three ranks; every value of every step (they
    /// differ from step to step) is checked on every rank.
    fn the_fused_example_sends_and_gathers_every_value(backend: doorbell::Backend) {
        use doorbell::coll::TransportKind;
        use doorbell::comm::{CommOptions, Communicator};
        for (ranks, kind) in [(2, TransportKind::P2p), (3, TransportKind::P2p), (2, TransportKind::Ibgda)] {
            let opts = CommOptions {
                wait_timeout: std::time::Duration::from_secs(60),
                ..Default::default()
            };
            let lines = Communicator::local(ranks, backend, opts, |comm| fused_example::run(comm, kind))
                .unwrap_or_else(|e| panic!("{backend:?} {ranks} ranks over {kind:?}: {e}"));
            assert!(lines[0].contains("all correct"), "{}", lines[0]);
        }
    }
}

per_backend! {
    /// `Pipe::run` numbers its chunks from per-block launch counters in
    /// device memory, so replays of ONE captured launch (a CUDA graph on a
    /// GPU; repeated identical launches on the emulator) each deliver their
    /// own data: the kernel's values depend on the launch counter only, and
    /// every replay's values are checked on every rank. Sequence numbers
    /// that did not advance would either time out or hand the consumer the
    /// previous replay's slot.
    fn pipeline_launches_replayed_from_one_capture_deliver_each_replays_data(dev: Device) {
        use doorbell::comm::{CommOptions, Communicator};
        let backend = dev.backend();
        let elems = 20_011u64;
        let opts = CommOptions {
            heap_bytes: 16 << 20,
            wait_timeout: std::time::Duration::from_secs(30),
            ..Default::default()
        };
        Communicator::local(2, backend, opts, |comm| {
            let module = comm.load_module(&doorbell_tests::TEST_KERNELS)?;
            let pipe = doorbell_tests::PipeByLaunch::new(comm, &module, 512, 3, elems)?;
            let (s, launch) = (&pipe.stream, || pipe.launch());
            let graph = match s.as_cuda() {
                Some(cu) => {
                    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
                    cu.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).expect("capture");
                    launch()?;
                    let g = cu.end_capture(CUgraphInstantiate_flags(0)).expect("end capture").expect("a graph");
                    g.upload().expect("upload");
                    comm.synchronize(s)?;
                    Some(g)
                }
                None => None,
            };
            for replay in 0..4u64 {
                comm.barrier()?;
                match &graph {
                    Some(g) => g.launch().expect("replay"),
                    None => launch()?,
                }
                comm.synchronize(s)?;
                let bad = pipe.wrong_values(comm, replay)?;
                assert_eq!(bad, 0, "{backend:?} rank {} replay {replay}: {bad} of {elems} values wrong", comm.rank());
                assert_eq!(pipe.rings.launches()?, replay + 1);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
    }
}

/// Bad pipeline shapes are errors, not panics: a ring shape with a zero is
/// refused by `Communicator::rings`, naming the shape, and a launch whose
/// grid is not `Rings::blocks()` is refused by `Pipe::run` before any wait,
/// the host's error saying which grid it needs.
#[test]
fn bad_ring_shapes_and_grids_are_clear_errors() {
    use doorbell::comm::{CommOptions, Communicator, RingShape};
    use doorbell_test_kernels::pipeline::pipe_by_launch;
    let opts = CommOptions {
        heap_bytes: 16 << 20,
        wait_timeout: std::time::Duration::from_secs(5),
        ..Default::default()
    };
    let errs = Communicator::local(2, doorbell::Backend::Cpu, opts, |comm| {
        for shape in [
            RingShape {
                stages: 0,
                chunk: 64,
                pairs: 1,
            },
            RingShape {
                stages: 2,
                chunk: 0,
                pairs: 1,
            },
            RingShape {
                stages: 2,
                chunk: 64,
                pairs: 0,
            },
        ] {
            let e = comm.rings::<u32>(shape).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                e.contains("must each be at least 1") && e.contains(&format!("{shape:?}")),
                "{shape:?}: {e}"
            );
        }
        let module = comm.load_module(&doorbell_tests::TEST_KERNELS)?;
        let family = module.family::<pipe_by_launch>()?;
        let rings = comm.rings::<u32>(RingShape {
            stages: 2,
            chunk: 64,
            pairs: 2,
        })?;
        let mut out = comm.device().alloc_zeroed::<u32>(1000)?;
        let s = comm.device().new_stream()?;
        // SAFETY: the rings and `out` are this communicator's; the grid is wrong on purpose.
        unsafe {
            s.launch_family(
                &family,
                LaunchConfig::linear(3, 32),
                comm.p2p()?,
                (rings.pipe()?, out.as_mut_ptr(), 1000),
            )?
        };
        let e = comm.synchronize(&s).err().map(|e| e.to_string()).unwrap_or_default();
        comm.barrier()?;
        assert_eq!(rings.launches()?, 0, "a refused launch counts no launch");
        Ok(e)
    })
    .unwrap();
    for e in errs {
        assert!(e.contains("the grid has 3 blocks; a pipeline of 2 pairs runs on exactly 4"), "{e}");
    }
}
