//! Communication kernels of the examples: ping-pong, and the P2P
//! benchmark's kernels with their raw floors.

use doorbell_kernels::transport::{Cmp, CommError, Coop, Ibgda, P2p, RawSignal, RawXfer, Signal, Sym, Transport};
use doorbell_kernels::{kernel, ptx, sync};

/// Status word values written by communication kernels.
pub const PINGPONG_OK: u32 = 1;
/// A wait ran out of budget (the communicator holds the report).
pub const PINGPONG_TIMEOUT: u32 = 2;

/// Ping-pong between ranks 0 and 1 (other ranks idle). Each block owns the
/// slice `[b*chunk, min((b+1)*chunk, bytes))` of `buf` and the signal word
/// `sig[b]` (both symmetric). Iteration `i`: rank 0 `put_signal`s its slice
/// to rank 1 with `sig[b] = i` there; rank 1 waits for it and `put_signal`s
/// the slice back; rank 0 waits. With `bytes == 0` this is a pure signal
/// round trip. Signal values continue from `epoch0` (the value the previous
/// launch ended at), so launches can follow each other without resetting.
/// Rank 0's block `b` writes its elapsed ns to `out_ns[b]`; `status[b]`
/// gets `PINGPONG_OK`, `PINGPONG_TIMEOUT` or `PINGPONG_ERROR`.
#[kernel(no_spill, transports(P2p, Ibgda))]
pub unsafe fn pingpong<T: Transport>(
    t: T,
    buf: *mut u8,
    bytes: u64,
    chunk: u64,
    sig: *mut u64,
    epoch0: u64,
    iters: u32,
    out_ns: *mut u64,
    status: *mut u32,
) {
    let me = t.rank();
    if me > 1 {
        return;
    }
    let peer = 1 - me;
    let b = ptx::block_idx_x() as u64;
    let lo = (b * chunk).min(bytes);
    let hi = ((b + 1) * chunk).min(bytes);
    // SAFETY: the host allocates `buf`, `sig` (one word per block)
    // symmetrically and `out_ns`/`status` with one entry per block.
    unsafe {
        let slice = buf.add(lo as usize);
        let my_sig = sig.add(b as usize);
        let first = ptx::thread_rank_in_block() == 0;
        let result = status.add(b as usize);
        if first {
            *result = PINGPONG_OK;
        }
        ptx::sync_threads();
        let start = ptx::globaltimer_ns();
        for i in epoch0 + 1..=epoch0 + iters as u64 {
            if me == 1 && !wait_block(&t, my_sig, i, result) {
                return;
            }
            if let Err(e) = t.put_raw(
                Coop::Block,
                peer,
                RawXfer {
                    dst: slice,
                    src: slice,
                    bytes: hi - lo,
                    nbi: false,
                },
                Some(RawSignal::set(my_sig, i)),
            ) {
                if first {
                    *result = status_of(e);
                }
                return;
            }
            if me == 0 && !wait_block(&t, my_sig, i, result) {
                return;
            }
        }
        if me == 0 && first {
            *out_ns.add(b as usize) = ptx::globaltimer_ns() - start;
        }
    }
}

/// A wait failed for another reason than its budget.
pub const PINGPONG_ERROR: u32 = 3;

fn status_of(e: CommError) -> u32 {
    match e {
        CommError::Timeout(_) => PINGPONG_TIMEOUT,
        _ => PINGPONG_ERROR,
    }
}

/// Thread 0 waits for `*sig >= i`; the block learns the outcome. False
/// (status written) when the wait failed.
#[inline(always)]
unsafe fn wait_block<T: Transport>(t: &T, sig: *mut u64, i: u64, result: *mut u32) -> bool {
    // SAFETY: the caller's symmetric word and status word.
    unsafe {
        if ptx::thread_rank_in_block() == 0 {
            if let Err(e) = t.wait_word_raw(sig, Cmp::Ge, i) {
                *result = status_of(e);
            }
        }
        ptx::sync_threads();
        ptx::ld_relaxed_cta_u32(result) == PINGPONG_OK
    }
}

/// The contract's signal round trip: one thread per rank, ranks 0 and 1.
/// Rank 0 `signal`s `sig = i` on rank 1 and `wait_until`s its own `sig >=
/// i`; rank 1 mirrors it. Every call goes through the transport's typed
/// calls with their argument checks (the word against its buffer, then the
/// heap): four checked calls per round trip. Values continue from
/// `epoch0`; the first round trip is a handshake (it absorbs the two
/// launches' skew) and is not timed, so `iters + 1` round trips run and rank
/// 0 writes the ns of the last `iters` to `out_ns`. Every rank writes its
/// status to `status`.
#[kernel(no_spill, transports(P2p))]
pub unsafe fn signal_pingpong<T: Transport>(t: T, sig: *mut u64, epoch0: u64, iters: u32, out_ns: *mut u64, status: *mut u32) {
    let me = t.rank();
    if me > 1 || ptx::thread_rank_in_block() != 0 || ptx::block_idx_x() != 0 {
        return;
    }
    let peer = 1 - me;
    // SAFETY: `sig` symmetric, `out_ns`/`status` one word each.
    unsafe {
        *status = PINGPONG_OK;
        let mut start = 0;
        // The typed calls: the word is checked against its buffer (one
        // word here) as well as the heap, as a user's kernel does.
        let word = Sym::from_raw(sig, 1).word(0);
        for i in epoch0 + 1..=epoch0 + 1 + iters as u64 {
            let r = if me == 0 {
                t.signal(peer, Signal::set(word, i)).and_then(|_| t.wait_until(word, Cmp::Ge, i))
            } else {
                t.wait_until(word, Cmp::Ge, i)
                    .and_then(|_| t.signal(peer, Signal::set(word, i)).map(|_| i))
            };
            if let Err(e) = r {
                *status = status_of(e);
                return;
            }
            if i == epoch0 + 1 {
                start = ptx::globaltimer_ns();
            }
        }
        if me == 0 {
            *out_ns = ptx::globaltimer_ns() - start;
        }
    }
}

/// [`signal_pingpong`](fn@signal_pingpong) without the per-call argument checks: the peer's
/// word is translated once with `t.peer_ptr`, then each round trip is a
/// release store to it and acquire loads of the own word, at the scope the
/// transport's `signal` / `wait_until` use (`.gpu` when both ranks share a
/// GPU, else `.sys`), polled under the same bounded spin ([`sync::spin_until`],
/// the handle's budget). Against [`signal_pingpong`](fn@signal_pingpong) it isolates what the
/// checks cost; against [`flag_pingpong_pair`](fn@flag_pingpong_pair), what the bounded spin
/// costs. Same handshake, epochs, `out_ns` and `status` as
/// [`signal_pingpong`](fn@signal_pingpong); a spin out of budget writes `PINGPONG_TIMEOUT`
/// (nothing is recorded in the heap's report), a peer without a load/store
/// route `PINGPONG_ERROR`.
#[kernel(no_spill)]
pub unsafe fn signal_pingpong_unchecked(t: P2p, sig: *mut u64, epoch0: u64, iters: u32, out_ns: *mut u64, status: *mut u32) {
    let me = t.rank();
    if me > 1 || ptx::thread_rank_in_block() != 0 || ptx::block_idx_x() != 0 {
        return;
    }
    let gpu_scope = t.same_gpu != 0;
    // SAFETY: `sig` symmetric (its peer copy translated by the handle),
    // `out_ns`/`status` one word each.
    unsafe {
        let Some(theirs) = t.peer_ptr(sig as *const u64, 1 - me) else {
            *status = PINGPONG_ERROR;
            return;
        };
        *status = PINGPONG_OK;
        let post = |i: u64| {
            if gpu_scope {
                ptx::st_release_gpu_u64(theirs, i)
            } else {
                ptx::st_release_sys_u64(theirs, i)
            }
        };
        let wait = |i: u64| {
            let load = || {
                if gpu_scope {
                    ptx::ld_acquire_gpu_u64(sig)
                } else {
                    ptx::ld_acquire_sys_u64(sig)
                }
            };
            sync::spin_until(t.budget_ns, load, |v| v >= i).is_ok()
        };
        let mut start = 0;
        for i in epoch0 + 1..=epoch0 + 1 + iters as u64 {
            let ok = if me == 0 {
                post(i);
                wait(i)
            } else {
                let ok = wait(i);
                post(i);
                ok
            };
            if !ok {
                *status = PINGPONG_TIMEOUT;
                return;
            }
            if i == epoch0 + 1 {
                start = ptx::globaltimer_ns();
            }
        }
        if me == 0 {
            *out_ns = ptx::globaltimer_ns() - start;
        }
    }
}

/// `n` 16-byte vectors from `src` to `dst`, this thread taking vectors
/// `me, me + stride, ...` with four in flight (as the transport's copy
/// does): the loop of both copy floors.
///
/// # Safety
/// Both pointers 16-byte aligned and valid for `n` vectors.
#[inline(always)]
unsafe fn copy_vectors(dst: *mut u8, src: *const u8, n: u64, me: u64, stride: u64) {
    let v = |i: u64| (i * 16) as usize;
    let mut i = me;
    // SAFETY: in bounds, aligned (contract).
    unsafe {
        while i + 3 * stride < n {
            let a = ptx::ld_v4_u32(src.add(v(i)) as *const u32);
            let b = ptx::ld_v4_u32(src.add(v(i + stride)) as *const u32);
            let c = ptx::ld_v4_u32(src.add(v(i + 2 * stride)) as *const u32);
            let d = ptx::ld_v4_u32(src.add(v(i + 3 * stride)) as *const u32);
            ptx::st_v4_u32(dst.add(v(i)) as *mut u32, a);
            ptx::st_v4_u32(dst.add(v(i + stride)) as *mut u32, b);
            ptx::st_v4_u32(dst.add(v(i + 2 * stride)) as *mut u32, c);
            ptx::st_v4_u32(dst.add(v(i + 3 * stride)) as *mut u32, d);
            i += 4 * stride;
        }
        while i < n {
            ptx::st_v4_u32(dst.add(v(i)) as *mut u32, ptx::ld_v4_u32(src.add(v(i)) as *const u32));
            i += stride;
        }
    }
}

/// Keeps the stream busy for `ns` of `%globaltimer`: thread 0 of block 0
/// spins, every other thread returns. A benchmark launches it just before
/// its first timed event, so that the event and the timed launch queue
/// behind it and the timed window opens when the GPU reaches them, not
/// while the host is still submitting the launch.
#[kernel]
pub unsafe fn hold_stream(ns: u64) {
    if ptx::global_thread_id_x() != 0 {
        return;
    }
    let start = ptx::globaltimer_ns();
    while ptx::globaltimer_ns().wrapping_sub(start) < ns {}
}

/// Raw floor for put bandwidth: a grid-stride 16-byte vector copy of
/// `bytes` (a multiple of 16; both pointers 16-byte aligned), `iters` times,
/// with four vectors in flight per thread (as the transport's copy has).
#[kernel(no_spill)]
pub unsafe fn copy_raw(dst: *mut u8, src: *const u8, bytes: u64, iters: u32) {
    let me = ptx::global_thread_id_x() as u64;
    let stride = ptx::grid_stride_x() as u64;
    for _ in 0..iters {
        // SAFETY: in bounds, aligned (contract).
        unsafe { copy_vectors(dst, src, bytes / 16, me, stride) };
    }
}

/// The second raw floor for put bandwidth: [`put_bw`](fn@put_bw)'s split of the work
/// without the transport. Pieces of `piece` bytes (a multiple of 16) are
/// dealt round-robin to the blocks, and a block copies its piece with its
/// threads (16-byte vectors, four in flight), `iters` times. Same contract
/// as [`copy_raw`](fn@copy_raw).
#[kernel(no_spill)]
pub unsafe fn copy_pieces(dst: *mut u8, src: *const u8, bytes: u64, piece: u64, iters: u32) {
    let me = ptx::thread_rank_in_block() as u64;
    let threads = ptx::block_dim_x() as u64;
    let blocks = ptx::grid_dim_x() as u64;
    let pieces = bytes.div_ceil(piece);
    for _ in 0..iters {
        let mut p = ptx::block_idx_x() as u64;
        while p < pieces {
            let lo = p * piece;
            let len = piece.min(bytes - lo);
            // SAFETY: `[lo, lo + len)` in bounds, aligned (contract).
            unsafe { copy_vectors(dst.add(lo as usize), src.add(lo as usize), len / 16, me, threads) };
            p += blocks;
        }
    }
}

/// [`put_bw`](fn@put_bw)'s puts, `iters` times: the pieces `first`,
/// `first + stride`, ... of `whole`, `piece` bytes each (the last one
/// shorter), to rank 1 with `coop`. The first error, if any.
///
/// # Safety
/// As `put_raw`, for `whole`.
#[inline(always)]
unsafe fn put_pieces<T: Transport>(
    t: &T,
    coop: Coop,
    whole: RawXfer,
    piece: u64,
    first: u64,
    stride: u64,
    iters: u32,
) -> Result<(), CommError> {
    let pieces = whole.bytes.div_ceil(piece);
    let mut r = Ok(());
    for _ in 0..iters {
        let mut p = first;
        while p < pieces {
            let lo = p * piece;
            let len = piece.min(whole.bytes - lo);
            // SAFETY: the piece lies within `whole` (the caller's promise).
            r = r.and(unsafe { t.put_raw(coop, 1, whole.piece(lo, len), None) });
            p += stride;
        }
    }
    r
}

/// Thread 0 of a block of [`put_bw`](fn@put_bw), after the block's puts
/// (`r`): `quiet`, then add 1 to `sig` on rank 1; block 0, or a block that
/// failed, writes `status`.
///
/// # Safety
/// `sig` symmetric, `status` one word.
#[inline(always)]
unsafe fn quiet_and_signal<T: Transport>(t: &T, r: Result<(), CommError>, sig: *mut u64, status: *mut u32) {
    // SAFETY: the caller's promise.
    unsafe {
        let r = r.and_then(|_| t.quiet(None)).and_then(|_| t.signal_raw(1, RawSignal::add(sig, 1)));
        if ptx::block_idx_x() == 0 || r.is_err() {
            *status = match r {
                Ok(()) => PINGPONG_OK,
                Err(e) => status_of(e),
            };
        }
    }
}

/// Put bandwidth: rank 0's blocks put `src` (local) to `dst` (symmetric) on
/// rank 1 in pieces of `piece` bytes (a multiple of 16) dealt round-robin, `iters` times, then `quiet` and signal
/// `sig` on rank 1 (add 1 per block). With `by_warp != 0` the pieces are
/// `piece / warps per block` bytes (a multiple of 16) dealt round-robin to
/// every warp of the grid, each put by its warp. Rank 1 waits until `sig >= expect`.
/// `status` gets `PINGPONG_OK`, `PINGPONG_TIMEOUT` or `PINGPONG_ERROR`.
#[kernel(no_spill, transports(P2p))]
pub unsafe fn put_bw<T: Transport>(
    t: T,
    dst: *mut u8,
    src: *const u8,
    bytes: u64,
    piece: u64,
    iters: u32,
    by_warp: u32,
    sig: *mut u64,
    expect: u64,
    status: *mut u32,
) {
    let first = ptx::thread_rank_in_block() == 0;
    let whole = RawXfer {
        dst,
        src,
        bytes,
        nbi: true,
    };
    // SAFETY: as documented; `status` one word, written by thread 0 of block 0.
    unsafe {
        if t.rank() == 0 && by_warp != 0 {
            // Pieces dealt to every warp of the grid, as the grid-stride
            // copy deals its vectors to every thread.
            let per_block = (ptx::block_dim_x() / 32) as u64;
            let warps = ptx::grid_dim_x() as u64 * per_block;
            let wpiece = (piece / per_block) / 16 * 16;
            let me = ptx::block_idx_x() as u64 * per_block + ptx::warp_id_in_block() as u64;
            let r = put_pieces(&t, Coop::Warp, whole, wpiece, me, warps, iters);
            // Every warp's puts are issued before thread 0 quiets and signals.
            let any_failed = ptx::sync_threads_or(r.is_err());
            if first {
                if any_failed && r.is_ok() {
                    // Another warp's put failed (its error is in the report).
                    *status = PINGPONG_ERROR;
                    return;
                }
                quiet_and_signal(&t, r, sig, status);
            }
        } else if t.rank() == 0 {
            // Pieces of `piece` bytes, dealt round-robin to the blocks (as
            // the copy floor's grid-stride deals its vectors): neighbouring
            // blocks stream neighbouring memory at the same time.
            let r = put_pieces(
                &t,
                Coop::Block,
                whole,
                piece,
                ptx::block_idx_x() as u64,
                ptx::grid_dim_x() as u64,
                iters,
            );
            ptx::sync_threads();
            if first {
                quiet_and_signal(&t, r, sig, status);
            }
        } else if t.rank() == 1 && first && ptx::block_idx_x() == 0 {
            *status = match t.wait_word_raw(sig, Cmp::Ge, expect) {
                Ok(_) => PINGPONG_OK,
                Err(e) => status_of(e),
            };
        }
    }
}

/// Raw floor for the signal round trip between two ranks (possibly on two
/// GPUs): rank 0 stores `i` to `their_flag` (the peer's word) with a release
/// store and waits for its own word to reach `i` with acquire loads; rank 1
/// mirrors it. 8-byte words, like the transport's signals; scope `.sys`
/// when `sys_scope != 0`, else `.gpu`. One thread per rank. Values continue
/// from `epoch0`; the first round trip is an untimed handshake, then rank 0
/// writes the ns of `iters` round trips to `out_ns` (as
/// [`signal_pingpong`](fn@signal_pingpong)). Unbounded spins: a measurement kernel, not for
/// production.
#[kernel(no_spill)]
pub unsafe fn flag_pingpong_pair(
    my_flag: *mut u64,
    their_flag: *mut u64,
    rank: u32,
    sys_scope: u32,
    epoch0: u64,
    iters: u32,
    out_ns: *mut u64,
) {
    if ptx::thread_idx_x() != 0 || ptx::block_idx_x() != 0 {
        return;
    }
    // SAFETY: one word each; `their_flag` is the peer's word as this GPU sees it.
    unsafe {
        let wait = |i: u64| {
            if sys_scope != 0 {
                while ptx::ld_acquire_sys_u64(my_flag) < i {}
            } else {
                while ptx::ld_acquire_gpu_u64(my_flag) < i {}
            }
        };
        let post = |i: u64| {
            if sys_scope != 0 {
                ptx::st_release_sys_u64(their_flag, i)
            } else {
                ptx::st_release_gpu_u64(their_flag, i)
            }
        };
        let mut start = 0;
        for i in epoch0 + 1..=epoch0 + 1 + iters as u64 {
            if rank == 0 {
                post(i);
                wait(i);
            } else {
                wait(i);
                post(i);
            }
            if i == epoch0 + 1 {
                start = ptx::globaltimer_ns();
            }
        }
        if rank == 0 {
            *out_ns = ptx::globaltimer_ns() - start;
        }
    }
}
