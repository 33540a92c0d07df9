//! The IBGDA transport over the soft NIC (CPU emulator, thread worlds):
//! the transport's own behaviour — chunked transfers, send-queue flow
//! control, the routed mix — and fault injection: error completions,
//! dropped and delayed doorbells, a stalled peer. Each ends in a typed error
//! or a correct result, never a hang, never a write outside registered
//! memory (canaries).

use std::time::{Duration, Instant};

use doorbell::comm::{CommOptions, Communicator, IbgdaOptions, RdmaPeers};
use doorbell::{Backend, Error, LaunchConfig};
use doorbell_test_kernels::testing::{ring_ibgda, ring_routed, STATUS_OK};
use doorbell_tests::TEST_KERNELS_PTX;

fn pattern(rank: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(rank as u8 * 7 + 3))
        .collect()
}

fn opts(wait: Duration) -> CommOptions {
    CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: wait,
        ..Default::default()
    }
}

/// The ring kernel (put, signal-add, wait, barrier, get) over IBGDA or the
/// routed transport; returns each rank's status.
fn ring_over(ranks: usize, bytes: usize, offset: usize, warp: bool, routed: Option<RdmaPeers>, io: &IbgdaOptions) {
    Communicator::local(ranks, Backend::Cpu, opts(Duration::from_secs(20)), |comm| {
        let dev = comm.device();
        let m = dev.load_module(TEST_KERNELS_PTX)?;
        let src = comm.alloc::<u8>(bytes.max(1))?;
        let dst = comm.alloc::<u8>(bytes + offset + 1)?;
        let got = comm.alloc::<u8>(bytes + offset + 1)?;
        let sig = comm.alloc::<u64>(1)?;
        let mut status = dev.alloc_zeroed::<u32>(1)?;
        src.copy_from_host(&pattern(comm.rank(), bytes.max(1)))?;
        let t = comm.ibgda_with(io)?;
        comm.barrier()?;
        let s = dev.new_stream()?;
        let args = (
            src.as_mut_ptr(),
            dst.as_mut_ptr(),
            got.as_mut_ptr(),
            bytes as u64,
            offset as u64,
            sig.as_mut_ptr(),
            1u64,
            warp as u32,
            status.as_mut_ptr(),
        );
        let (a, b, c, d, e, f, g, h, i) = args;
        // SAFETY: sizes as the ring kernel documents.
        unsafe {
            match &routed {
                None => s.launch(
                    &m.function::<ring_ibgda>()?,
                    LaunchConfig::linear(1, 64),
                    (t, a, b, c, d, e, f, g, h, i),
                )?,
                Some(p) => s.launch(
                    &m.function::<ring_routed>()?,
                    LaunchConfig::linear(1, 64),
                    (comm.routed_with(p)?, a, b, c, d, e, f, g, h, i),
                )?,
            }
        };
        comm.synchronize(&s)?;
        comm.ibgda_check()?;
        assert_eq!(status.to_host()?[0], STATUS_OK, "rank {}", comm.rank());
        let prev = (comm.rank() + ranks - 1) % ranks;
        let want = pattern(prev, bytes.max(1));
        let (d, g) = (dst.to_host()?, got.to_host()?);
        assert_eq!(&d[offset..offset + bytes], &want[..bytes], "put into rank {}", comm.rank());
        assert_eq!(&g[offset..offset + bytes], &want[..bytes], "get by rank {}", comm.rank());
        assert!(
            d[..offset].iter().all(|&x| x == 0) && d[offset + bytes] == 0,
            "put wrote outside its range"
        );
        assert!(
            g[..offset].iter().all(|&x| x == 0) && g[offset + bytes] == 0,
            "get wrote outside its range"
        );
        assert_eq!(sig.to_host()?, vec![1]);
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{ranks} ranks, {bytes} B at +{offset}, warp={warp}, routed={routed:?}: {e}"));
}

#[test]
fn ring_over_ibgda_smoke() {
    ring_over(2, 4096, 0, false, None, &IbgdaOptions::default());
}
