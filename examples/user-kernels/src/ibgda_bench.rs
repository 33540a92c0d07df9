//! The kernels of `ibgda_bench` (`examples/08_ibgda_bench.rs`) and of
//! `proxy_bench`'s pairs: one body per measurement, instantiated for the
//! P2P transport (the baseline), for IBGDA over the soft NIC and for the
//! CPU proxy. The round trip and the post rates run between the two ranks
//! of a pair, which the host names to each (`peer`, [`NO_PEER`] for a rank
//! outside every pair); the other kernels between ranks 0 and 1.

use doorbell_kernels::transport::ibgda::PostProfile;
use doorbell_kernels::transport::{Cmp, CommError, Coop, Ibgda, P2p, Proxy, RawSignal, RawXfer, Transport};
use doorbell_kernels::{kernel, ptx};

/// Status: every call succeeded.
pub const BENCH_OK: u32 = 1;
/// Status: a transport call failed (the host reads the report).
pub const BENCH_FAILED: u32 = 2;
/// `peer` of a rank that takes no part in a pair kernel: it returns at
/// once.
pub const NO_PEER: u32 = u32::MAX;

/// `iters` 8-byte `put_signal` round trips between this rank and `peer`,
/// one warp per rank (launch 1 × 32): the rank that `leads` (non-zero;
/// the other passes 0) puts `buf[0]` into its peer's `buf` with the signal
/// `sig = epoch0 + i`, the peer waits for it and answers the same way.
/// Round 0 is an untimed handshake; the leading rank writes the time of
/// the other `iters` rounds to `out_ns[0]`. A rank whose `peer` is
/// [`NO_PEER`] returns at once.
#[kernel(transports(P2p, Ibgda, Proxy))]
pub unsafe fn put_signal_rtt<T: Transport>(
    t: T,
    peer: u32,
    leads: u32,
    buf: *mut u64,
    sig: *mut u64,
    epoch0: u64,
    iters: u32,
    out_ns: *mut u64,
    status: *mut u32,
) {
    if peer == NO_PEER {
        return;
    }
    let lead = ptx::lane_id() == 0;
    let mut ok = true;
    let mut t0 = 0u64;
    let mut i = 0u32;
    // An 8-byte put from `buf` into the peer's `buf`.
    let x = RawXfer {
        dst: buf as *mut u8,
        src: buf as *const u8,
        bytes: 8,
        nbi: false,
    };
    // SAFETY: symmetric `buf` and `sig` of one word each, launched 1 × 32.
    unsafe {
        while i <= iters && ok {
            let v = epoch0 + i as u64;
            if i == 1 {
                t0 = ptx::globaltimer_ns();
            }
            if leads != 0 {
                ok = t.put_raw(Coop::Warp, peer, x, Some(RawSignal::set(sig, v))).is_ok();
                if ok && lead {
                    ok = t.wait_word_raw(sig, Cmp::Ge, v).is_ok();
                }
            } else {
                if lead {
                    ok = t.wait_word_raw(sig, Cmp::Ge, v).is_ok();
                }
                ok = ptx::vote_sync_all(ptx::FULL_MASK, ok);
                if ok {
                    ok = t.put_raw(Coop::Warp, peer, x, Some(RawSignal::set(sig, v))).is_ok();
                }
            }
            ok = ptx::vote_sync_all(ptx::FULL_MASK, ok);
            i += 1;
        }
        if lead {
            *out_ns = ptx::globaltimer_ns().wrapping_sub(t0);
            *status = if ok { BENCH_OK } else { BENCH_FAILED };
        }
    }
}

/// Rank 0 puts `bytes` from `src` to rank 1's `dst`, `iters` times, each
/// block its share (cut at 16 bytes), non-blocking, then `quiet`. Rank 1
/// returns at once. Timed by the host around the launch.
#[kernel(transports(P2p, Ibgda))]
pub unsafe fn put_stream<T: Transport>(t: T, dst: *mut u8, src: *const u8, bytes: u64, iters: u32, status: *mut u32) {
    if t.rank() != 0 {
        return;
    }
    let blocks = ptx::grid_dim_x() as u64;
    let piece = bytes.div_ceil(blocks).div_ceil(16) * 16;
    let lo = (ptx::block_idx_x() as u64 * piece).min(bytes);
    let n = piece.min(bytes - lo);
    let mut r: Result<(), CommError> = Ok(());
    let x = RawXfer {
        dst,
        src,
        bytes,
        nbi: true,
    }
    .piece(lo, n);
    // SAFETY: `dst` (symmetric) and `src` hold `bytes`.
    unsafe {
        let mut i = 0;
        while i < iters && r.is_ok() && n > 0 {
            r = t.put_raw(Coop::Block, 1, x, None);
            i += 1;
        }
        if ptx::thread_idx_x() == 0 {
            if r.is_ok() {
                r = t.quiet(None);
            }
            if r.is_err() {
                *status = BENCH_FAILED;
            }
        }
    }
}

/// The posting rank (the one given a `peer`) posts `wqes` 8-byte
/// non-blocking puts of `src[0]` to `peer` by one warp (`use_warp != 0`;
/// launch 1 × 32) or one block (launch 1 × 256), then `quiet`; put `i`
/// writes word `i` of `dst` (`wqes` words), so every put lost shows as a
/// word unwritten. `out_ns[0]`: time to post them all; `out_ns[1]`: until
/// the last completed; `out_ns[2]`: `%globaltimer` at the first post. A
/// rank whose `peer` is [`NO_PEER`] (the receiver) returns at once.
#[kernel(transports(Ibgda, Proxy))]
pub unsafe fn post_burst<T: Transport>(
    t: T,
    peer: u32,
    dst: *mut u64,
    src: *const u64,
    wqes: u32,
    use_warp: u32,
    out_ns: *mut u64,
    status: *mut u32,
) {
    if peer == NO_PEER || (use_warp != 0 && ptx::warp_id_in_block() != 0) {
        return;
    }
    let lead = ptx::thread_idx_x() == 0;
    let mut r: Result<(), CommError> = Ok(());
    // SAFETY: `dst` (symmetric) holds `wqes` words, `src` one.
    unsafe {
        let t0 = ptx::globaltimer_ns();
        let mut i = 0u32;
        while i < wqes && r.is_ok() {
            let d = dst.add(i as usize) as *mut u8;
            let g = if use_warp != 0 { Coop::Warp } else { Coop::Block };
            let x = RawXfer {
                dst: d,
                src: src as *const u8,
                bytes: 8,
                nbi: true,
            };
            r = t.put_raw(g, peer, x, None);
            i += 1;
        }
        let t1 = ptx::globaltimer_ns();
        if lead {
            if r.is_ok() {
                r = t.quiet(None);
            }
            *out_ns = t1.wrapping_sub(t0);
            *out_ns.add(1) = ptx::globaltimer_ns().wrapping_sub(t0);
            *out_ns.add(2) = t0;
            *status = if r.is_ok() { BENCH_OK } else { BENCH_FAILED };
        }
    }
}

/// Rank 0's first thread posts `n` 8-byte puts of `src[0]` into rank 1's
/// `dst[0]`, each one WQE waited for before the next, and writes the
/// summed cycles of each step — checks, reserve, write, doorbell, the
/// wait for the CQE, its consumption — to `out` ([`Ibgda::profile_puts`]). Launch 1 × 1.
#[kernel]
pub unsafe fn post_profile(t: Ibgda, dst: *mut u64, src: *const u64, n: u32, out: *mut PostProfile, status: *mut u32) {
    if t.rank() != 0 || ptx::thread_idx_x() != 0 {
        return;
    }
    let x = RawXfer {
        dst: dst as *mut u8,
        src: src as *const u8,
        bytes: 8,
        nbi: false,
    };
    let mut p = PostProfile::default();
    // SAFETY: `dst` is symmetric, `src` registered (the host's contract).
    let r = unsafe { t.profile_puts(1, x, n, &mut p) };
    // SAFETY: one record and one word (the host's contract).
    unsafe {
        *out = p;
        *status = if r.is_ok() { BENCH_OK } else { BENCH_FAILED };
    }
}

/// The most words [`post_lanes`](fn@post_lanes) writes: `rounds × blocks × 32`, at most
/// this many (512 KiB); later puts wrap around.
pub const LANE_WORDS: usize = 1 << 16;

/// Words of `dst` a [`post_lanes`](fn@post_lanes) launch of `blocks` blocks and `rounds`
/// rounds writes.
pub fn lane_words(blocks: u32, rounds: u32) -> usize {
    (32 * blocks as usize * rounds as usize).min(LANE_WORDS)
}

/// The posting rank's blocks each post `rounds` × 32 8-byte non-blocking
/// puts to `peer` by one warp, a WQE per lane ([`Transport::put_lanes_raw`]: a
/// warp's 32 WQEs behind one doorbell), then `quiet`. Launch
/// `blocks × 32`; block `b` posts on its QP, `b mod qps_per_peer`. Lane
/// `l` of block `b` writes, in round `i`, word `((i × blocks + b) × 32 + l)
/// mod LANE_WORDS` of `dst` (which holds that many words, or all of
/// [`LANE_WORDS`]): up to `LANE_WORDS` puts each write a word of their
/// own, so a lost put shows as a word unwritten. `out_ns[3b ..]`:
/// block `b`'s `%globaltimer` at its start, when its last WQE was posted
/// and when it completed. A rank whose `peer` is [`NO_PEER`] (the
/// receiver) returns at once.
#[kernel(transports(Ibgda, Proxy))]
pub unsafe fn post_lanes<T: Transport>(t: T, peer: u32, dst: *mut u64, src: *const u64, rounds: u32, out_ns: *mut u64, status: *mut u32) {
    if peer == NO_PEER || ptx::warp_id_in_block() != 0 {
        return;
    }
    let (b, blocks) = (ptx::block_idx_x() as u64, ptx::grid_dim_x() as u64);
    let lane = ptx::lane_id() as u64;
    let mut r: Result<(), CommError> = Ok(());
    let t0 = ptx::globaltimer_ns();
    let mut i = 0;
    while i < rounds && r.is_ok() {
        let word = ((i as u64 * blocks + b) * 32 + lane) % LANE_WORDS as u64;
        let x = RawXfer {
            // SAFETY: `dst` holds every word below `LANE_WORDS` this
            // launch's puts reach.
            dst: unsafe { dst.add(word as usize) } as *mut u8,
            src: src as *const u8,
            bytes: 8,
            nbi: true,
        };
        // SAFETY: every lane of the warp calls; `dst` symmetric, `src` registered.
        r = unsafe { t.put_lanes_raw(peer, x, None) };
        i += 1;
    }
    let t1 = ptx::globaltimer_ns();
    if lane == 0 {
        if r.is_ok() {
            // SAFETY: one thread of the block quiets its own puts.
            r = unsafe { t.quiet(None) };
        }
        // SAFETY: `out_ns` holds 3 words per block, `status` one word.
        unsafe {
            let o = out_ns.add(3 * b as usize);
            *o = t0;
            *o.add(1) = t1;
            *o.add(2) = ptx::globaltimer_ns();
            if r.is_err() {
                *status = BENCH_FAILED;
            }
        }
    }
}

/// [`post_lanes`](fn@post_lanes) with `per_call` puts per lane in each
/// call ([`Transport::put_lanes_many_raw`]: the warp's `32 × per_call`
/// WQEs behind one doorbell): `rounds` puts per lane in all (the last call
/// takes what is left), to the same words as [`post_lanes`](fn@post_lanes)'s;
/// `out_ns` as there.
#[kernel(transports(Ibgda, Proxy))]
pub unsafe fn post_lanes_many<T: Transport>(
    t: T,
    peer: u32,
    dst: *mut u64,
    src: *const u64,
    rounds: u32,
    per_call: u32,
    out_ns: *mut u64,
    status: *mut u32,
) {
    if peer == NO_PEER || ptx::warp_id_in_block() != 0 {
        return;
    }
    let (b, blocks) = (ptx::block_idx_x() as u64, ptx::grid_dim_x() as u64);
    let lane = ptx::lane_id() as u64;
    let per_call = per_call.max(1);
    let mut r: Result<(), CommError> = Ok(());
    let t0 = ptx::globaltimer_ns();
    let mut i = 0;
    while i < rounds && r.is_ok() {
        let n = per_call.min(rounds - i);
        let x = |j: u32| {
            let word = (((i + j) as u64 * blocks + b) * 32 + lane) % LANE_WORDS as u64;
            RawXfer {
                // SAFETY: `dst` holds every word below `LANE_WORDS` this
                // launch's puts reach.
                dst: unsafe { dst.add(word as usize) } as *mut u8,
                src: src as *const u8,
                bytes: 8,
                nbi: true,
            }
        };
        // SAFETY: every lane of the warp calls; `dst` symmetric, `src` registered.
        r = unsafe { t.put_lanes_many_raw(peer, n, true, x) };
        i += n;
    }
    let t1 = ptx::globaltimer_ns();
    if lane == 0 {
        if r.is_ok() {
            // SAFETY: one thread of the block quiets its own puts.
            r = unsafe { t.quiet(None) };
        }
        // SAFETY: `out_ns` holds 3 words per block, `status` one word.
        unsafe {
            let o = out_ns.add(3 * b as usize);
            *o = t0;
            *o.add(1) = t1;
            *o.add(2) = ptx::globaltimer_ns();
            if r.is_err() {
                *status = BENCH_FAILED;
            }
        }
    }
}

/// Words [`primitive_costs`](fn@primitive_costs) writes: cycles per operation, in this order
/// (the host prints them with [`PRIMITIVES`]' names).
pub const PRIMITIVE_COUNT: usize = 15;

/// What each word of [`primitive_costs`](fn@primitive_costs)' output measured.
pub const PRIMITIVES: [&str; PRIMITIVE_COUNT] = [
    "fence.acq_rel.gpu",
    "fence.acq_rel.sys",
    "fence.sc.gpu",
    "fence.sc.sys",
    "dependent weak load, L1 hit",
    "dependent weak load after fence.acq_rel.gpu",
    "the same, its 8 lines prefetched to L1 after the fence",
    "dependent ld.relaxed.gpu",
    "weak store + st.release.gpu",
    "dependent atom.add.relaxed.gpu",
    "nanosleep(100)",
    "%globaltimer read",
    "dependent weak load after weak store + st.release.gpu",
    "dependent local-memory (stack) load",
    "the same after fence.acq_rel.gpu",
];

/// Loads chained through memory: each word holds the address of the next.
const CHAIN: usize = 8;
/// Repetitions each figure is averaged over.
const REPS: u64 = 64;

/// Follows the chain from `p` for [`CHAIN`] weak loads.
#[inline(always)]
unsafe fn chase(mut p: u64) -> u64 {
    for _ in 0..CHAIN {
        // SAFETY: the chain's words hold addresses of its lines.
        p = unsafe { ptx::ld_u64(p as usize as *const u64) };
    }
    p
}

/// What the engine's primitives cost on this GPU, measured by lane 0 of
/// one warp (launch 1 × 32) while the rest of the machine runs as it does
/// (the soft NIC's engine polling): each fence alone, a weak load that
/// hits L1, one that follows a fence (which empties L1), the same with its
/// lines prefetched first, a strong load, a release store (and a weak
/// load after it), a returning atomic, a short sleep, a clock read, a
/// load from the thread's stack (local memory, where the engine's control
/// thread keeps what it spills) with and without a fence before it —
/// cycles (`%clock64`) per
/// operation, averaged over 64 repetitions, into `out`
/// ([`PRIMITIVE_COUNT`] words). `mem` holds `lines` 128-byte lines
/// (`lines` ≥ 512), which the kernel links into chains first; `out`
/// holds one word more (what the chains read, kept so they are not
/// optimized away).
#[kernel]
pub unsafe fn primitive_costs(mem: *mut u64, lines: u32, out: *mut u64) {
    if ptx::global_thread_id_x() != 0 || lines < 512 {
        return;
    }
    let n = lines as u64;
    let line = |i: u64| mem as u64 + 128 * (i % n);
    // SAFETY (whole body): `mem` holds `lines` lines, `out` the results.
    unsafe {
        for i in 0..n {
            // Line i leads to a line far from it, so no two loads of a
            // chain share a line.
            *(line(i) as usize as *mut u64) = line(i * 97 + 61);
        }
        ptx::fence_acq_rel_gpu();
        // A chain through the thread's stack: indices read with volatile
        // loads at indices known only at run time, so the array stays in
        // local memory (a chain the compiler can see through it keeps in
        // registers, which measures nothing).
        let mut stack = [0u64; 64];
        for (i, w) in stack.iter_mut().enumerate() {
            *w = ((i as u64 * 37 + 11) ^ (lines as u64 & 1)) % 64;
        }
        let local_chase = |mut k: u64| -> u64 {
            for _ in 0..CHAIN {
                k = core::ptr::read_volatile(stack.as_ptr().add((k % 64) as usize));
            }
            k
        };
        let mut r = [0u64; PRIMITIVE_COUNT];
        let mut sink = 0u64;
        // Cycles of one block of code, inlined where it is timed.
        macro_rules! time {
            ($($body:tt)*) => {{
                let c0 = ptx::clock64();
                $($body)*
                ptx::clock64().wrapping_sub(c0)
            }};
        }
        for rep in 0..REPS {
            let start = line(rep * 131);
            r[0] += time!(ptx::fence_acq_rel_gpu(););
            r[1] += time!(ptx::fence_acq_rel_sys(););
            r[2] += time!(ptx::fence_sc_gpu(););
            r[3] += time!(ptx::fence_sc_sys(););
            // The chain's lines, known before the fence (as the engine
            // knows its tables' addresses).
            let mut at = [0u64; CHAIN];
            let mut p = start;
            for a in at.iter_mut() {
                *a = p;
                p = ptx::ld_u64(p as usize as *const u64);
            }
            r[4] += time!(sink ^= chase(start););
            r[5] += time!(
                ptx::fence_acq_rel_gpu();
                sink ^= chase(start);
            );
            r[6] += time!(
                ptx::fence_acq_rel_gpu();
                for &a in at.iter() {
                    ptx::prefetch_l1(a as usize as *const u64);
                }
                sink ^= chase(start);
            );
            r[7] += time!(
                let mut q = start;
                for _ in 0..CHAIN {
                    q = ptx::ld_relaxed_gpu_u64(q as usize as *const u64);
                }
                sink ^= q;
            );
            let scratch = line(rep * 131 + 7) as usize as *mut u64;
            r[8] += time!(
                core::ptr::write_volatile(scratch.add(1), rep);
                ptx::st_release_gpu_u64(scratch.add(2), rep);
            );
            r[9] += time!(
                let mut v = 0u64;
                for _ in 0..CHAIN {
                    v = ptx::atom_add_relaxed_gpu_u64(scratch.add(3 + (v & 1) as usize), 1);
                }
                sink ^= v;
            );
            r[10] += time!(ptx::nanosleep(100););
            r[11] += time!(sink ^= ptx::globaltimer_ns(););
            // Warm the chain's lines again, then see whether a release
            // leaves them in L1.
            sink ^= chase(start);
            r[12] += time!(
                core::ptr::write_volatile(scratch.add(1), rep);
                ptx::st_release_gpu_u64(scratch.add(2), rep);
                sink ^= chase(start);
            );
            sink ^= local_chase(rep);
            r[13] += time!(sink ^= local_chase(rep ^ (sink % 3)););
            r[14] += time!(
                ptx::fence_acq_rel_gpu();
                sink ^= local_chase(rep ^ (sink % 5));
            );
        }
        // Per operation: the fence is taken out of the chains behind one.
        let fence = r[0];
        r[5] = r[5].saturating_sub(fence) / CHAIN as u64;
        r[6] = r[6].saturating_sub(fence) / CHAIN as u64;
        r[12] = r[12].saturating_sub(r[8]) / CHAIN as u64;
        r[13] /= CHAIN as u64;
        r[14] = r[14].saturating_sub(fence) / CHAIN as u64;
        r[4] /= CHAIN as u64;
        r[7] /= CHAIN as u64;
        r[9] /= CHAIN as u64;
        for (k, v) in r.iter().enumerate() {
            *out.add(k) = v / REPS;
        }
        // Keeps the chains' loads (their results are otherwise unused).
        *out.add(PRIMITIVE_COUNT) = sink;
    }
}
