//! The soft NIC engine's shared copies in flight two at a time: a QP's
//! large puts and gets land as if one after the other. Rank 0 makes lists
//! of non-blocking transfers of 512 KiB (each a copy shared by the port's
//! engine blocks) without waiting between them, then `quiet`s; the host
//! applies the same list to its own copy of both buffers and compares
//! every byte and the canaries around them. Transfers that touch disjoint
//! bytes, or (puts, whose sources do not change until they complete)
//! write the same bytes from the same source bytes, may run beside the
//! one before ([`EngineCounters::pipelined_copies`] counts
//! them); a transfer that reads what one in flight writes, writes what it
//! reads, or writes its bytes from other source bytes waits for it.

use std::time::Duration;

use doorbell::comm::{CommOptions, Communicator, IbgdaOptions, SoftNicEngine};
use doorbell::{Backend, Device, LaunchConfig};
use doorbell_softnic::engine::EngineCounters;
use doorbell_test_kernels::contract::transfers_in_order_ibgda;
use doorbell_tests::{per_backend, Guarded, TEST_KERNELS};

/// Bytes of each transfer (a shared copy: at least `SHARE_MIN`).
const PIECE: u64 = 512 << 10;
/// Pieces in each buffer.
const PIECES: u64 = 8;
const PUT: u64 = 0;
const GET: u64 = 1;

/// A list of transfers (kind, destination offset, source offset), each
/// `PIECE` bytes, in pieces.
struct Case {
    name: &'static str,
    list: &'static [(u64, u64, u64)],
    /// Whether every transfer after the first conflicts with the one
    /// before (none may run beside it).
    ordered: bool,
}

const CASES: [Case; 6] = [
    Case {
        name: "puts to distinct places",
        list: &[
            (PUT, 0, 0),
            (PUT, 1, 1),
            (PUT, 2, 2),
            (PUT, 3, 3),
            (PUT, 4, 4),
            (PUT, 5, 5),
            (PUT, 6, 6),
            (PUT, 7, 7),
        ],
        ordered: false,
    },
    Case {
        name: "puts of the same source to the same place",
        list: &[(PUT, 6, 2); 10],
        ordered: false,
    },
    Case {
        name: "puts of other sources to the same place (the last one wins)",
        list: &[(PUT, 7, 0), (PUT, 7, 1), (PUT, 7, 2), (PUT, 7, 3), (PUT, 7, 4)],
        ordered: true,
    },
    Case {
        // A READ's source is the responder's memory, which may change
        // between two gets: they are not the same copy twice.
        name: "gets of the same remote place into the same place",
        list: &[(GET, 5, 3); 10],
        ordered: true,
    },
    Case {
        name: "gets of what the put before wrote",
        list: &[(PUT, 1, 6), (GET, 7, 1), (PUT, 1, 5), (GET, 6, 1)],
        ordered: true,
    },
    Case {
        name: "puts over what the get before read, and from what it wrote",
        list: &[(GET, 0, 2), (PUT, 2, 1), (GET, 1, 3), (PUT, 3, 1)],
        ordered: true,
    },
];

/// Applies `list` to the host's copies of rank 1's `remote` and rank 0's
/// `local` buffers.
fn model(list: &[(u64, u64, u64)], remote: &mut [u8], local: &mut [u8]) {
    for &(kind, d, s) in list {
        let (d, s, n) = ((d * PIECE) as usize, (s * PIECE) as usize, PIECE as usize);
        if kind == PUT {
            remote[d..d + n].copy_from_slice(&local[s..s + n]);
        } else {
            local[d..d + n].copy_from_slice(&remote[s..s + n]);
        }
    }
}

fn transfers_land_in_order(dev: Device) {
    let b = dev.backend();
    // Four engine blocks, one QP per peer: one block serves it, three copy
    // chunks of its shared copies.
    let io = IbgdaOptions {
        qps_per_peer: 1,
        sq_size: 64,
        max_msg: 8 << 20,
        engine: Some(SoftNicEngine::Kernel),
        engine_threads: Some(if b == Backend::Gpu { 256 } else { 32 }),
        engine_blocks: Some(4),
        ..IbgdaOptions::default()
    };
    let o = CommOptions {
        heap_bytes: 16 << 20,
        wait_timeout: Duration::from_secs(30),
        spread_gpus: b == Backend::Gpu && doorbell::gpu_count() >= 2,
        ..CommOptions::default()
    };
    let bytes = (PIECE * PIECES) as usize;
    // Rounds of the cases, each with its own bytes; rank 0 returns how
    // many copies ran beside the one before, per case.
    const ROUNDS: usize = 6;
    let ranks = Communicator::local(2, b, o, |comm| {
        let m = comm.device().load_module(&TEST_KERNELS)?;
        let f = m.function::<transfers_in_order_ibgda>()?;
        let remote = Guarded::new(comm, bytes)?;
        let local = Guarded::new(comm, bytes)?;
        let t = comm.ibgda_with(&io)?;
        let r = comm.rank();
        let mut pipelined = vec![0u64; CASES.len()];
        for round in 0..ROUNDS {
            for (c, case) in CASES.iter().enumerate() {
                // Bytes that differ by rank, round, case and place.
                let fill = |who: u64, i: usize| {
                    let x = (i as u64 ^ who << 40 ^ (round as u64) << 48 ^ (c as u64) << 56).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    (x >> 29) as u8
                };
                let (mut want_remote, mut want_local): (Vec<u8>, Vec<u8>) =
                    ((0..bytes).map(|i| fill(1, i)).collect(), (0..bytes).map(|i| fill(2, i)).collect());
                if r == 1 {
                    remote.buf.copy_from_host(&want_remote)?;
                } else {
                    local.buf.copy_from_host(&want_local)?;
                }
                let words: Vec<u64> = case.list.iter().flat_map(|&(k, d, s)| [k, d * PIECE, s * PIECE, PIECE]).collect();
                let list = comm.device().alloc_from(&words)?;
                let mut status = comm.device().alloc_zeroed::<u32>(1)?;
                let before = comm.ibgda_engine().expect("set up").counters;
                let args = (
                    t,
                    remote.buf.as_mut_ptr(),
                    local.buf.as_mut_ptr(),
                    list.as_ptr(),
                    case.list.len() as u32,
                    status.as_mut_ptr(),
                );
                // SAFETY: both buffers hold every transfer of the list.
                let s = unsafe { doorbell_tests::launch_after_barrier(comm, &f, LaunchConfig::linear(1, 64), args)? };
                comm.synchronize(&s)?;
                comm.ibgda_check()?;
                comm.barrier()?;
                let what = format!("rank {r}, round {round}, {}", case.name);
                model(case.list, &mut want_remote, &mut want_local);
                if r == 0 {
                    assert_eq!(status.to_host()?[0], 1, "{what}: the kernel's status");
                    assert!(local.buf.to_host()? == want_local, "{what}: the gets' bytes differ");
                    let after: EngineCounters = comm.ibgda_engine().expect("set up").counters;
                    pipelined[c] += after.pipelined_copies - before.pipelined_copies;
                } else {
                    assert!(remote.buf.to_host()? == want_remote, "{what}: the puts' bytes differ");
                }
                assert!(remote.canaries_intact()? && local.canaries_intact()?, "{what}: a canary changed");
                comm.barrier()?;
            }
        }
        Ok(pipelined)
    })
    .expect("the world");
    for (case, &n) in CASES.iter().zip(&ranks[0]) {
        if case.ordered {
            assert_eq!(n, 0, "{}: {n} copies ran beside one they conflict with", case.name);
        } else {
            // Whether the next transfer is already in flight when the
            // engine comes to it depends on when rank 0 posts it; over the
            // rounds at least one is.
            assert!(n >= 1, "{}: no copy ran beside the one before in {ROUNDS} rounds", case.name);
        }
    }
}

per_backend! {
    /// Lists of non-blocking 512 KiB puts and gets from one QP, each a
    /// shared copy of a four-block engine: distinct places and repeats of
    /// the same copy run beside the copy before; a put over the same place
    /// from another source, a get of what a put wrote and a put over what
    /// a get read wait for it. Every byte and canary checked.
    fn a_qps_shared_copies_land_in_order_with_two_in_flight(dev: Device) {
        transfers_land_in_order(dev);
    }
}
