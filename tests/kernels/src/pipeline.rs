//! Behaviour kernels of the pipeline rings (`doorbell_kernels::pipeline`).

use doorbell_kernels::pipeline::{BlockCtl, RingSet};
use doorbell_kernels::transport::{P2p, Transport};
use doorbell_kernels::{kernel, ptx};

/// The word `k` of chunk `seq`.
#[inline(always)]
pub fn ring_pattern(seq: u64, k: u64) -> u32 {
    (seq as u32).wrapping_mul(0x9e37_79b9) ^ (k as u32).wrapping_mul(0x85eb_ca6b) ^ 0x5bd1_e995
}

/// Rank 0 sends chunks `base..base + n` of `words` u32 each to rank 1
/// through `ring` (one block each side); rank 1 is slow: it reads each
/// chunk, sleeps about `delay_ns`, reads it again, and counts every word
/// that was not the chunk's pattern either time into `bad[0]` before
/// releasing the slot. `credits == 0` makes the producer skip
/// `acquire_block` (the negative control: it then overwrites slots the
/// consumer still reads). `outbox` is a symmetric buffer of `words` u32.
#[kernel(transports(P2p))]
pub unsafe fn ring_credits<T: Transport>(
    t: T,
    ring: RingSet,
    ctl: *mut u32,
    outbox: *mut u32,
    base: u64,
    n: u64,
    words: u64,
    delay_ns: u64,
    credits: u32,
    bad: *mut u32,
) {
    let ctl = BlockCtl(ctl);
    let me = t.rank();
    let (tid, nthr) = (ptx::thread_rank_in_block() as u64, ptx::block_dim_x() as u64);
    for seq in base..base + n {
        // SAFETY: the ring, control word and buffers are the test's
        // symmetric allocations of the sizes documented above.
        unsafe {
            if me == 0 {
                if credits != 0 && ring.acquire_block(&t, ctl, seq, 1).is_err() {
                    return;
                }
                let mut k = tid;
                while k < words {
                    *outbox.add(k as usize) = ring_pattern(seq, k);
                    k += nthr;
                }
                ptx::sync_threads();
                if ring.commit_block(&t, seq, 1, outbox as *const u8, words * 4).is_err() {
                    return;
                }
            } else if me == 1 {
                let Ok(slot) = ring.wait_block(&t, ctl, seq, 0) else { return };
                let slot = slot as *const u32;
                let mut wrong = 0u32;
                for pass in 0..2 {
                    let mut k = tid;
                    while k < words {
                        if core::ptr::read_volatile(slot.add(k as usize)) != ring_pattern(seq, k) {
                            wrong += 1;
                        }
                        k += nthr;
                    }
                    if pass == 0 {
                        let start = ptx::globaltimer_ns();
                        while ptx::globaltimer_ns() - start < delay_ns {
                            ptx::nanosleep(1000);
                        }
                    }
                }
                if wrong != 0 {
                    ptx::atom_add_relaxed_gpu_u32(bad, wrong);
                }
                if ring.release_block(&t, ctl, seq, 0).is_err() {
                    return;
                }
            }
        }
    }
}

/// `Pipe::run` with data that depends on the launch counter alone (not on
/// any argument): each rank sends `elems` values `ring_pattern(launch *
/// 1_000_000 + me, i)` to the next rank, which stores them in `out`. Replays
/// of one captured launch must still deliver each replay's data.
#[kernel(transports(P2p))]
pub unsafe fn pipe_by_launch<T: Transport>(t: T, pipe: doorbell_kernels::pipeline::Pipe<u32>, out: *mut u32, elems: u64) {
    let (me, n) = (t.rank(), t.world_size());
    let (tid, nthr) = (ptx::thread_rank_in_block() as u64, ptx::block_dim_x() as u64);
    let tag = pipe.launch() * 1_000_000 + me as u64;
    let produce = |first: u64, len: u64, buf: *mut u32| {
        for i in (tid..len).step_by(nthr as usize) {
            // SAFETY: `buf` holds a chunk.
            unsafe { *buf.add(i as usize) = ring_pattern(tag, first + i) };
        }
    };
    let consume = |first: u64, len: u64, slot: *const u32| {
        for i in (tid..len).step_by(nthr as usize) {
            // SAFETY: `out` holds `elems`.
            unsafe { *out.add((first + i) as usize) = *slot.add(i as usize) };
        }
    };
    // SAFETY: the launcher's rings; a failure is recorded for the host.
    let _ = unsafe { pipe.run(&t, elems, ((me + 1) % n, (me + n - 1) % n), produce, consume) };
}
