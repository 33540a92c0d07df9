//! Kernels used by doorbell's own tests (behaviour that must match on the GPU
//! and the CPU emulator).

use doorbell_kernels::{kernel, ptx, sync};

/// Error codes written to `status`.
pub const STATUS_OK: u32 = 1;
/// The consumer block gave up waiting for the producer's flag.
pub const STATUS_TIMEOUT: u32 = 2;

/// Two blocks: block 0 reduces `input` with warp shuffles and a block
/// barrier and publishes the sum behind a release flag; block 1 waits for the
/// flag with acquire and writes `out[t] = sum + t * ballot_popcount`.
///
/// Launch with grid (2,1,1) and block (64,1,1) or any multiple of 32 up to
/// 1024; `input` holds `blockDim.x` values, `out` as many, `scratch` 33 words
/// (warp sums + the sum), `flag` and `status` one word each, zeroed.
#[kernel]
pub unsafe fn shuffle_barrier_flag(input: *const u32, out: *mut u32, scratch: *mut u32, flag: *mut u32, status: *mut u32) {
    let t = ptx::thread_idx_x();
    let lane = ptx::lane_id();
    let warp = t / 32;
    let nwarps = ptx::block_dim_x().div_ceil(32);
    if ptx::block_idx_x() == 0 {
        // SAFETY: `input` has blockDim.x elements.
        let mut v = unsafe { *input.add(t as usize) };
        let mut d = 16;
        while d > 0 {
            v = v.wrapping_add(ptx::shfl_sync_down_u32(ptx::FULL_MASK, v, d));
            d /= 2;
        }
        if lane == 0 {
            // SAFETY: scratch has 33 words.
            unsafe { *scratch.add(warp as usize) = v };
        }
        ptx::sync_threads();
        if t == 0 {
            let mut s = 0u32;
            for w in 0..nwarps {
                // SAFETY: as above.
                s = s.wrapping_add(unsafe { *scratch.add(w as usize) });
            }
            // SAFETY: as above; flag is a zeroed word.
            unsafe {
                *scratch.add(32) = s;
                sync::publish_gpu(flag, 1);
            }
        }
    } else {
        if t == 0 {
            // SAFETY: flag and status are valid words.
            let ok = unsafe { sync::wait_ge_gpu(flag, 1, sync::DEFAULT_BUDGET_NS) };
            unsafe { *status = if ok.is_ok() { STATUS_OK } else { STATUS_TIMEOUT } };
        }
        ptx::sync_threads();
        // Ballot: lanes whose index is odd.
        let odd = ptx::vote_sync_ballot(ptx::FULL_MASK, lane & 1 == 1).count_ones();
        // SAFETY: the sum was published before the flag we acquired, and
        // `sync_threads` ordered thread 0's acquire before this read.
        let sum = unsafe { ptx::ld_relaxed_gpu_u32(scratch.add(32)) };
        // SAFETY: out has blockDim.x elements.
        unsafe { *out.add(t as usize) = sum.wrapping_add(t.wrapping_mul(odd)) };
    }
}

/// Thread `who` of block 0 traps while the rest of its block waits at a
/// barrier: the launch must fail with an error, not hang.
#[kernel]
pub unsafe fn trap_in_one_thread(who: u32) {
    if ptx::block_idx_x() == 0 && ptx::thread_idx_x() == who {
        ptx::trap();
    }
    ptx::sync_threads();
}

/// `out[global id] = (tid.x, tid.y, tid.z, ctaid.x, ctaid.y, ctaid.z, lane, ntid.x*ntid.y*ntid.z, nctaid.x*nctaid.y*nctaid.z)`
/// for a 3-D launch; 9 words per thread.
#[kernel]
pub unsafe fn record_indices(out: *mut u32) {
    let per_block = ptx::block_dim_x() * ptx::block_dim_y() * ptx::block_dim_z();
    let block_lin = ptx::block_idx_x() + ptx::grid_dim_x() * (ptx::block_idx_y() + ptx::grid_dim_y() * ptx::block_idx_z());
    let g = (block_lin * per_block + ptx::thread_rank_in_block()) as usize;
    let v = [
        ptx::thread_idx_x(),
        ptx::thread_idx_y(),
        ptx::thread_idx_z(),
        ptx::block_idx_x(),
        ptx::block_idx_y(),
        ptx::block_idx_z(),
        ptx::lane_id(),
        per_block,
        ptx::grid_dim_x() * ptx::grid_dim_y() * ptx::grid_dim_z(),
    ];
    for (k, x) in v.iter().enumerate() {
        // SAFETY: `out` holds 9 words per thread of the launch.
        unsafe { *out.add(g * 9 + k) = *x };
    }
}

/// Every thread adds 1 to `counter` with `atom.add.relaxed.gpu`, then thread 0
/// of each block publishes with `atom.add.release.gpu` on `done`; block 0's
/// thread 0 waits for all blocks with acquire and copies the counter to `out`.
#[kernel]
pub unsafe fn atomics_and_fences(counter: *mut u32, done: *mut u32, out: *mut u32, status: *mut u32) {
    // SAFETY: all pointers are single zeroed words.
    unsafe {
        ptx::atom_add_relaxed_gpu_u32(counter, 1);
        ptx::sync_threads();
        if ptx::thread_idx_x() == 0 {
            ptx::fence_acq_rel_gpu();
            ptx::atom_add_release_gpu_u32(done, 1);
            if ptx::block_idx_x() == 0 {
                let r = sync::wait_ge_gpu(done, ptx::grid_dim_x(), sync::DEFAULT_BUDGET_NS);
                *status = if r.is_ok() { STATUS_OK } else { STATUS_TIMEOUT };
                *out = ptx::ld_relaxed_gpu_u32(counter);
            }
        }
    }
}

use crate::contract::Shadow;
use doorbell_kernels::transport::{Cmp, Coop, Ibgda, P2p, Proxy, RawSignal, RawXfer, Routed, Transport};

/// A failed transport call's status: `STATUS_TIMEOUT` for a timeout, else
/// `STATUS_ERROR`.
pub const STATUS_ERROR: u32 = 3;

/// Ring exchange exercising put/get/signal/wait/barrier on every rank:
/// 1. rank r puts `src[..bytes]` (local) to `dst + offset` on rank r+1 with
///    `put_block` (or `put_warp` by warp 0 when `use_warp != 0`) and adds 1
///    to `sig` there; waits until its own `sig >= expected`;
/// 2. barrier across ranks;
/// 3. gets `bytes` from rank r-1's `src` into local `got + offset`.
///
/// `status` is set to `STATUS_OK`, `STATUS_TIMEOUT` or `STATUS_ERROR`. One
/// block per rank. One body, an entry per transport: `ring_p2p`, `ring_shadow`,
/// `ring_ibgda`, `ring_routed`, `ring_proxy`.
#[kernel(transports(P2p, Shadow, Ibgda, Routed, Proxy))]
pub unsafe fn ring<T: Transport>(
    t: T,
    src: *mut u8,
    dst: *mut u8,
    got: *mut u8,
    bytes: u64,
    offset: u64,
    sig: *mut u64,
    expected: u64,
    use_warp: u32,
    status: *mut u32,
) {
    let n = t.world_size();
    let me = t.rank();
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let first = ptx::thread_rank_in_block() == 0;
    let use_warp = use_warp != 0;
    // SAFETY: per the kernel's contract.
    unsafe {
        let mut ok = true;
        let x = RawXfer {
            dst: dst.add(offset as usize),
            src,
            bytes,
            nbi: false,
        };
        if use_warp {
            if ptx::warp_id_in_block() == 0 {
                ok = t.put_raw(Coop::Warp, next, x, None).is_ok();
            }
        } else {
            ok = t.put_raw(Coop::Block, next, x, None).is_ok();
        }
        if !ok {
            *status = STATUS_ERROR;
        }
        ptx::sync_threads();
        if first && ptx::ld_relaxed_cta_u32(status) != STATUS_ERROR {
            // The block's puts, ordered before this thread by the barrier,
            // are published with the signal once fenced.
            t.fence();
            *status = match t
                .signal_raw(next, RawSignal::add(sig, 1))
                .and_then(|_| t.wait_word_raw(sig, Cmp::Ge, expected))
            {
                Ok(_) => STATUS_OK,
                Err(doorbell_kernels::transport::CommError::Timeout(_)) => STATUS_TIMEOUT,
                Err(_) => STATUS_ERROR,
            };
        }
        ptx::sync_threads();
        if ptx::ld_relaxed_cta_u32(status) != STATUS_OK {
            return;
        }
        if t.barrier_block().is_err() {
            if first {
                *status = STATUS_TIMEOUT;
            }
            return;
        }
        let x = RawXfer {
            dst: got.add(offset as usize),
            src,
            bytes,
            nbi: false,
        };
        let r = if use_warp {
            if ptx::warp_id_in_block() == 0 {
                t.get_raw(Coop::Warp, prev, x)
            } else {
                Ok(())
            }
        } else {
            t.get_raw(Coop::Block, prev, x)
        };
        if r.is_err() {
            *status = STATUS_ERROR;
        }
    }
}

/// What iteration `i` of [`signal_pingpong`](fn@signal_pingpong) carries from rank `from`.
pub const fn pingpong_word(i: u64, from: u32) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (from as u64 + 1)
}

/// `iters` round trips of one 8-byte put with a signal between ranks 0 and
/// 1 (thread 0 of the block; other ranks and threads idle): in iteration
/// `i` (from 1) rank 0 writes [`pingpong_word`]`(i, 0)` into its `src`
/// word and puts it into rank 1's `dst` word with rank 1's `sig` set to
/// `i` (`add != 0`: `sig` added 1 instead, an atomic behind the WRITE);
/// rank 1 waits for it, checks `dst`, and answers with
/// `pingpong_word(i, 1)` the same way; rank 0 waits and checks. `bad`
/// gets the number of payloads that were not the iteration's; `status`
/// `STATUS_OK`, `STATUS_TIMEOUT` or `STATUS_ERROR`.
#[kernel(transports(P2p, Ibgda))]
pub unsafe fn signal_pingpong<T: Transport>(
    t: T,
    src: *mut u64,
    dst: *mut u64,
    sig: *mut u64,
    iters: u32,
    add: u32,
    bad: *mut u32,
    status: *mut u32,
) {
    let me = t.rank();
    if me > 1 || ptx::thread_rank_in_block() != 0 {
        return;
    }
    let peer = 1 - me;
    let mut wrong = 0u32;
    // SAFETY: `src`, `dst`, `sig` are symmetric words, `bad` and `status`
    // one word each.
    unsafe {
        let fail = |e: doorbell_kernels::transport::CommError, wrong: u32| {
            *bad = wrong;
            *status = match e {
                doorbell_kernels::transport::CommError::Timeout(_) => STATUS_TIMEOUT,
                _ => STATUS_ERROR,
            };
        };
        for i in 1..=iters as u64 {
            if me == 1 {
                if let Err(e) = t.wait_word_raw(sig, Cmp::Ge, i) {
                    return fail(e, wrong);
                }
                wrong += (core::ptr::read_volatile(dst) != pingpong_word(i, 0)) as u32;
            }
            core::ptr::write_volatile(src, pingpong_word(i, me));
            let x = RawXfer {
                dst: dst as *mut u8,
                src: src as *mut u8,
                bytes: 8,
                nbi: false,
            };
            let s = if add != 0 { RawSignal::add(sig, 1) } else { RawSignal::set(sig, i) };
            if let Err(e) = t.put_raw(Coop::Thread, peer, x, Some(s)) {
                return fail(e, wrong);
            }
            if me == 0 {
                if let Err(e) = t.wait_word_raw(sig, Cmp::Ge, i) {
                    return fail(e, wrong);
                }
                wrong += (core::ptr::read_volatile(dst) != pingpong_word(i, 1)) as u32;
            }
        }
        *bad = wrong;
        *status = STATUS_OK;
    }
}

/// Waits for a signal nobody sends: must end with a recorded timeout.
#[kernel]
pub unsafe fn p2p_wait_forever(t: P2p, sig: *mut u64, status: *mut u32) {
    if ptx::thread_rank_in_block() == 0 {
        // SAFETY: `sig` is symmetric, `status` one word.
        unsafe {
            let r = t.wait_word_raw(sig, Cmp::Eq, 0xdead_beef);
            *status = if r.is_ok() { STATUS_OK } else { STATUS_TIMEOUT };
        }
    }
}

/// Thread 0 spins until `ns` nanoseconds of `%globaltimer` have passed: a
/// kernel that is still running for that long after its launch.
#[kernel]
pub unsafe fn spin_for(ns: u64) {
    if ptx::thread_rank_in_block() == 0 {
        let t0 = ptx::globaltimer_ns();
        while ptx::globaltimer_ns().wrapping_sub(t0) < ns {
            ptx::nanosleep(1_000);
        }
    }
}

/// A barrier passed before every rank had arrived at it.
pub const STATUS_EARLY: u32 = 4;

/// `rounds` times: every rank adds its rank+1 to `counter` on every rank
/// with a signal-add, then a barrier, after which each rank's counter must
/// hold every rank's adds of every round so far (else `STATUS_EARLY`: the
/// barrier let it through before some rank arrived); the host reads the
/// total. `status`: `STATUS_OK`, `STATUS_TIMEOUT`, `STATUS_EARLY`.
#[kernel]
pub unsafe fn p2p_barrier_rounds(t: P2p, counter: *mut u64, rounds: u32, status: *mut u32) {
    // SAFETY: `counter` symmetric, `status` one word; one block per rank.
    unsafe {
        let first = ptx::thread_rank_in_block() == 0;
        let n = t.world_size() as u64;
        let per_round = n * (n + 1) / 2;
        for k in 0..rounds as u64 {
            if first {
                for peer in 0..t.world_size() {
                    if t.signal_raw(peer, RawSignal::add(counter, t.rank() as u64 + 1)).is_err() {
                        *status = STATUS_ERROR;
                    }
                }
            }
            if t.barrier_block().is_err() {
                if first {
                    *status = STATUS_TIMEOUT;
                }
                return;
            }
            if first && core::ptr::read_volatile(counter) < (k + 1) * per_round {
                *status = STATUS_EARLY;
            }
        }
        if t.barrier_block().is_err() {
            if first {
                *status = STATUS_TIMEOUT;
            }
            return;
        }
        // The host zeroes `status` before the launch.
        if first && *status == 0 {
            *status = STATUS_OK;
        }
    }
}

/// Deliberately broken: warp 0 waits at a block barrier that warp 1 never
/// reaches, because warp 1 spins on a flag warp 0 sets only after the
/// barrier. On the CPU emulator this must fail with a barrier timeout, not
/// hang. Never launch it on a GPU (it would hang there). Block of 64 threads.
#[kernel]
pub unsafe fn divergent_barrier(flag: *mut u32) {
    // SAFETY: one zeroed word.
    unsafe {
        if ptx::warp_id_in_block() == 0 {
            ptx::sync_threads();
            ptx::st_release_gpu_u32(flag, 1);
        } else {
            while ptx::ld_acquire_gpu_u32(flag) == 0 {
                ptx::nanosleep(100);
            }
        }
    }
}

/// `out[round]` = `sync_threads_or` of "this thread is thread `pick[round]`"
/// for each of `rounds` rounds in a row (`pick[round]` past the block:
/// nobody passes true), as thread 0 of the block saw it; every other
/// thread whose result differs from thread 0's adds 1 to `out[rounds]`.
/// One block; `out` holds `rounds + 1` zeroed words.
#[kernel]
pub unsafe fn block_or_rounds(pick: *const u32, rounds: u32, out: *mut u32) {
    let t = ptx::thread_idx_x();
    for r in 0..rounds {
        // SAFETY: `pick` holds `rounds` words.
        let any = ptx::sync_threads_or(t == unsafe { *pick.add(r as usize) });
        // SAFETY: `out` holds `rounds + 1` words.
        unsafe {
            if t == 0 {
                *out.add(r as usize) = any as u32;
            }
            ptx::sync_threads();
            if (*out.add(r as usize) != 0) != any {
                ptx::atom_add_relaxed_gpu_u32(out.add(rounds as usize), 1);
            }
            ptx::sync_threads();
        }
    }
}
