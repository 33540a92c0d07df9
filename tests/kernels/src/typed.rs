//! Kernels of the typed transfer calls: every part checked against its own
//! buffer, arguments by name, errors naming the argument.

use doorbell_kernels::transport::{Cmp, Coop, Get, Ibgda, P2p, Part, Proxy, Put, RawXfer, Routed, Signal, Sym, Transport};
use doorbell_kernels::{kernel, ptx};

use crate::contract::{code, report_block_code};

/// One typed call per launch, by every thread of one block on rank 0, to
/// rank 1 (`case`), with `buf` a symmetric buffer of `n = buf.len()` u32
/// and `sigs` one of 2 words:
///
/// | case | call | what is wrong |
/// |---|---|---|
/// | 0 | put | destination `buf.part(n - 3, 4)` runs one element past `buf` |
/// | 1 | put | source `buf.part(1, n)` runs past |
/// | 2 | put | destination of 4 elements, source of 5 |
/// | 3 | put with signal | signal word `sigs.word(2)` past `sigs` |
/// | 4 | get | source `buf.part(n, 1)` past |
/// | 5 | wait_until_all | words `sigs.part(1, 2)` past |
/// | 6 | put with signal | nothing (the control: all of `buf`, `sigs[0] = 7`) |
/// | 7 | put with signal | source `Part::local(local, n)`: memory outside the heap (refused by an RDMA transport unless registered) |
///
/// `out[0]` = `code` of thread 0's result, `out[1]` = threads that
/// got a different one.
#[kernel(transports(P2p, Ibgda))]
pub unsafe fn typed_call<T: Transport>(t: T, buf: Sym<u32>, sigs: Sym<u64>, local: *mut u32, case: u32, out: *mut u32) {
    if t.rank() != 0 {
        return;
    }
    let n = buf.len();
    let done = Signal::set(sigs.word(0), 7);
    // SAFETY: every thread of the block makes the same call; `local` holds `n`.
    let r = unsafe {
        match case {
            0 => t.put(Coop::Block, 1, Put::dst(buf.part(n - 3, 4)).src(buf.part(0, 4))),
            1 => t.put(Coop::Block, 1, Put::dst(buf.all()).src(buf.part(1, n))),
            2 => t.put(Coop::Block, 1, Put::dst(buf.part(0, 4)).src(buf.part(0, 5))),
            3 => t.put(
                Coop::Block,
                1,
                Put::dst(buf.all()).src(buf.all()).signal(Signal::set(sigs.word(2), 1)),
            ),
            4 => t.get(Coop::Block, 1, Get::dst(buf.part(0, 1)).src(buf.part(n, 1))),
            // Every thread waits (a one-thread call; the words are refused before any wait).
            5 => t.wait_until_all(sigs.part(1, 2), Cmp::Ge, 1),
            6 => t.put(Coop::Block, 1, Put::dst(buf.all()).src(buf.all()).signal(done)),
            _ => t.put(Coop::Block, 1, Put::dst(buf.all()).src(Part::local(local, n)).signal(done)),
        }
    };
    // SAFETY: two words (the launcher's).
    unsafe { report_block_code(code(r), out) };
}

/// Words of `dst` and `src` each lane of [`put_lanes_call()`] owns.
pub const LANE_WORDS: u64 = 4;

/// Every lane of one block's two warps on rank 0 puts its own part to
/// rank 1 with [`Transport::put_lanes`]. Lane `i` of the block (0..64):
/// `lane_words(i, round)` words (0: an empty part) from `src[4i..]` into
/// `dst[4i..]`; lanes with `i % 3 == 0` add `i + 1` to `sigs[i / 32]`
/// after their data.
///
/// | case | what |
/// |---|---|
/// | 0 | blocking puts |
/// | 1 | non-blocking puts, then thread 0 quiets |
/// | 2 | as 0, but lane 33's destination is `dst.part(4 * 64 - 1, 2)`, one word past `dst`: warp 1 must write nothing and every lane of it gets that error |
///
/// `out[i]` = `code` of lane `i`'s result.
#[kernel(transports(P2p, Ibgda))]
pub unsafe fn put_lanes_call<T: Transport>(t: T, dst: Sym<u64>, src: Sym<u64>, sigs: Sym<u64>, round: u32, case: u32, out: *mut u32) {
    if t.rank() != 0 {
        return;
    }
    let i = ptx::thread_rank_in_block() as u64;
    let n = lane_words(i, round);
    let mut to = dst.part(LANE_WORDS * i, n);
    if case == 2 && i == 33 {
        to = dst.part(LANE_WORDS * 64 - 1, 2);
    }
    let mut p = Put::dst(to).src(src.part(LANE_WORDS * i, to.len()));
    if i.is_multiple_of(3) {
        p = p.signal(Signal::add(sigs.word(i / 32), i + 1));
    }
    if case == 1 {
        p = p.nbi();
    }
    // SAFETY: both warps' lanes all call, converged; parts of symmetric buffers.
    let mut r = unsafe { t.put_lanes(1, p) };
    if case == 1 {
        ptx::sync_threads();
        if i == 0 {
            // SAFETY: one thread quiets the block's puts (after the barrier).
            r = r.and(unsafe { t.quiet(None) });
        }
    }
    // SAFETY: `out` holds 64 words (the launcher's).
    unsafe { *out.add(i as usize) = code(r) };
}

/// Words lane `i` of [`put_lanes_call()`] puts in round `round`: 0..=3,
/// changing with the round.
pub const fn lane_words(i: u64, round: u32) -> u64 {
    (i * 5 + round as u64) % 4
}

/// Rank 0's blocks each put `rounds` warp-wide runs to rank 1 on their own
/// QPs (`block mod qps_per_peer`) with [`Transport::put_lanes`],
/// non-blocking, then quiet: in round `r`, lane `l` of block `b` (of `B`)
/// puts word `(r B + b) 32 + l` of `src` into the same word of `dst`, and
/// in even rounds lanes with `l % 4 == 0` add 1 to `sigs[b]` after their
/// word (odd rounds are runs of 32 puts alone). Warp 0 of each block only.
/// `out[b]` = `code` of block `b`'s result.
#[kernel(transports(P2p, Ibgda))]
pub unsafe fn lanes_many_qps<T: Transport>(t: T, dst: Sym<u64>, src: Sym<u64>, sigs: Sym<u64>, rounds: u32, out: *mut u32) {
    if t.rank() != 0 || ptx::warp_id_in_block() != 0 {
        return;
    }
    let (b, blocks, lane) = (ptx::block_idx_x() as u64, ptx::grid_dim_x() as u64, ptx::lane_id() as u64);
    let mut r = Ok(());
    let mut k = 0;
    while k < rounds as u64 && r.is_ok() {
        let w = (k * blocks + b) * 32 + lane;
        let mut p = Put::dst(dst.part(w, 1)).src(src.part(w, 1)).nbi();
        if lane.is_multiple_of(4) && k.is_multiple_of(2) {
            p = p.signal(Signal::add(sigs.word(b), 1));
        }
        // SAFETY: the warp's lanes all call, converged; parts of symmetric buffers.
        r = unsafe { t.put_lanes(1, p) };
        k += 1;
    }
    if lane == 0 {
        // SAFETY: one thread of the block quiets its puts.
        let q = r.and(unsafe { t.quiet(None) });
        // SAFETY: `out` holds a word per block.
        unsafe { *out.add(b as usize) = code(q) };
    }
}

/// Transfers a lane of [`put_lanes_many_call()`] posts in one call in
/// cases 0 – 2: 0 ..= this many, by [`many_count`].
pub const MANY_MAX: u32 = 5;
/// Transfers every lane posts in case 3 of [`put_lanes_many_call()`]: a
/// run of 32 × 12 WQEs, longer than the default send queue (256).
pub const MANY_LONG: u32 = 12;
/// Words of `dst` (and `src`) each (lane, transfer) of
/// [`put_lanes_many_call()`] owns: a transfer puts 0 ..= 2 of them.
pub const MANY_SLOT: u64 = 2;

/// Transfers lane `l` posts in `round` of `case` of [`put_lanes_many_call()`].
pub const fn many_count(l: u64, round: u32, case: u32) -> u32 {
    if case == 3 {
        MANY_LONG
    } else {
        ((l * 7 + round as u64) % (MANY_MAX as u64 + 1)) as u32
    }
}

/// Words transfer `j` of lane `l` puts in `round` of `case`.
pub const fn many_words(l: u64, j: u32, round: u32, case: u32) -> u64 {
    if case == 3 {
        1
    } else if case == 4 && l == 9 && j == 2 {
        2
    } else {
        (l + 2 * j as u64 + round as u64) % 3
    }
}

/// One warp of rank 0 puts to rank 1 with
/// [`Transport::put_lanes_many_raw`]: lane `l` posts [`many_count`]
/// transfers, its `j`-th copying [`many_words`] words at word
/// `(l × MANY_LONG + j) × MANY_SLOT` of `src` into the same words of
/// `dst` (each holds `32 × MANY_LONG × MANY_SLOT` words).
///
/// | case | what |
/// |---|---|
/// | 0 | blocking puts |
/// | 1 | non-blocking puts by the typed call ([`Transport::put_lanes_many`]), then lane 0 quiets |
/// | 2 | as 0, but lane 9's third transfer (of 3) lands past the heap's end: nothing may be written, every lane gets that error |
/// | 3 | non-blocking, [`MANY_LONG`] one-word transfers per lane, then quiet |
/// | 4 | as 1, but lane 9's third part runs one word past `dst` (into the heap's next allocation): nothing may be written, every lane gets that error |
/// | 5 | no lane has anything to send, to a peer outside the world (`u32::MAX`): nothing happens, every lane gets `Ok` |
/// | 6 | as 0, but lane `l` puts to rank `1 + l mod (world − 1)`: lanes name different peers (over the routed transport, peers on both routes) |
///
/// `out[l]` = `code` of lane `l`'s result.
#[kernel(transports(P2p, Ibgda, Routed, Proxy))]
pub unsafe fn put_lanes_many_call<T: Transport>(t: T, dst: Sym<u64>, src: Sym<u64>, round: u32, case: u32, out: *mut u32) {
    if t.rank() != 0 || ptx::warp_id_in_block() != 0 {
        return;
    }
    let l = ptx::lane_id() as u64;
    let count = many_count(l, round, case);
    let x = |j: u32| {
        let w = (l * MANY_LONG as u64 + j as u64) * MANY_SLOT;
        let mut to = dst.part(w, MANY_SLOT).as_ptr() as *mut u8;
        if case == 2 && l == 9 && j == 2 {
            // Past the heap (1 MiB): the raw call's check refuses it.
            to = to.wrapping_add(1 << 30);
        }
        RawXfer {
            dst: to,
            src: src.part(w, MANY_SLOT).as_ptr() as *const u8,
            bytes: 8 * many_words(l, j, round, case),
            nbi: false,
        }
    };
    let parts = |j: u32| {
        let w = (l * MANY_LONG as u64 + j as u64) * MANY_SLOT;
        let n = many_words(l, j, round, case);
        let at = if case == 4 && l == 9 && j == 2 { dst.len() - 1 } else { w };
        (dst.part(at, n), src.part(w, n))
    };
    let nbi = case == 1 || case == 3 || case == 4;
    let (peer, count) = match case {
        5 => (u32::MAX, 0),
        6 => (1 + l as u32 % (t.world_size() - 1), many_count(l, round, 0)),
        _ => (1, count),
    };
    // SAFETY: the warp's lanes all call, converged (to one peer but in
    // case 6); the sources are symmetric memory.
    let mut r = unsafe {
        if case == 1 || case == 4 {
            t.put_lanes_many(peer, count, nbi, parts)
        } else {
            t.put_lanes_many_raw(peer, count, nbi, x)
        }
    };
    if nbi && l == 0 {
        // SAFETY: one thread quiets its warp's puts (posted before it returned).
        r = r.and(unsafe { t.quiet(None) });
    }
    // SAFETY: `out` holds 32 words (the launcher's).
    unsafe { *out.add(l as usize) = code(r) };
}
