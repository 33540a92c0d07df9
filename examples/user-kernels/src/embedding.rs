//! The embedding exchange's benchmark kernels: the host-driven baselines
//! (gather kernel → exchange by the host → pooling kernel, and back: plain
//! kernels around one driver copy per peer per table, or NCCL send/recv,
//! no dedup) and the put floor the fused exchange's bandwidth is compared
//! with. The fused exchange itself is the library's
//! (`doorbell_kernels::coll::embedding`, `doorbell::coll::EmbeddingExchange`);
//! these kernels use its shapes, buffers and row helpers.

use doorbell_kernels::coll::embedding::rows::{add_row, apply_row, copy_rows, grid_warp, pool_bag, Look};
use doorbell_kernels::coll::embedding::{request_key, EmbBufs, EmbShape, PAD, STATUS_TRANSPORT};
use doorbell_kernels::transport::{Coop, P2p, RawXfer, Transport};
use doorbell_kernels::{kernel, ptx};

// The baselines' kernels: plain kernels around a host-driven exchange
// (one copy per peer per table, or NCCL send/recv). No transport.
// ---------------------------------------------------------------------------

/// Deals the lookups (`[tables][batch][pooling]`) to the grid's threads:
/// `body(i, id)` for lookup `i`, of id `id` (padding where `id >= s.rows`).
///
/// # Safety
/// `ids` holds the lookups.
#[inline(always)]
unsafe fn for_each_lookup(s: &EmbShape, ids: *const u32, mut body: impl FnMut(u64, u32)) {
    let lookups = s.tables as u64 * (s.batch as u64 * s.pooling as u64);
    let mut i = ptx::global_thread_id_x() as u64;
    while i < lookups {
        // SAFETY: the caller's promise.
        body(i, unsafe { *ids.add(i as usize) });
        i += ptx::grid_stride_x() as u64;
    }
}

/// The table of lookup `i` (`[tables][batch][pooling]` order).
#[inline(always)]
fn table_of(s: &EmbShape, i: u64) -> u32 {
    (i / (s.batch as u64 * s.pooling as u64)) as u32
}

/// Deals the bags to the grid's warps: `body(w, bag)` for bag `w` (`sample
/// * tables + table`), `bag` the index of its first lookup in
/// `[tables][batch][pooling]` order.
#[inline(always)]
fn for_each_bag(s: &EmbShape, mut body: impl FnMut(u32, usize)) {
    let (gw, warps) = grid_warp();
    let per_table = s.batch as u64 * s.pooling as u64;
    let mut w = gw;
    while w < s.batch * s.tables {
        body(
            w,
            ((w % s.tables) as u64 * per_table + (w / s.tables) as u64 * s.pooling as u64) as usize,
        );
        w += warps;
    }
}

/// Where the row of `key` (`request_key(table, id)`) starts in this rank's
/// shard of the tables (`world` ranks): its offset in elements.
#[inline(always)]
fn shard_row(s: &EmbShape, world: u32, key: u64) -> usize {
    let (table, id) = ((key >> 32) as usize, key as u32);
    (table * s.shard_rows as usize + (id / world) as usize) * s.dim as usize
}

/// Baseline step 1: `cnt[owner][table]` += the lookups of that pair
/// (`cnt` zeroed by the caller). Bad ids are not counted.
#[kernel]
pub unsafe fn emb_bl_count(s: EmbShape, world: u32, ids: *const u32, cnt: *mut u32) {
    // SAFETY: `ids` holds the lookups, `cnt` world × tables words.
    unsafe {
        for_each_lookup(&s, ids, |i, id| {
            if id < s.rows {
                ptx::atom_add_relaxed_gpu_u32(cnt.add(((id % world) * s.tables + table_of(&s, i)) as usize), 1);
            }
        });
    }
}

/// Baseline step 2: every lookup's key goes to `keys[soff[owner][table] +
/// i]` (`cursor` zeroed by the caller) and its position there to `pos`
/// (`[tables][batch][pooling]`; PAD for padding).
#[kernel]
pub unsafe fn emb_bl_scatter(s: EmbShape, world: u32, ids: *const u32, soff: *const u32, cursor: *mut u32, keys: *mut u64, pos: *mut u32) {
    // SAFETY: sizes as documented; `keys` holds every non-pad lookup.
    unsafe {
        for_each_lookup(&s, ids, |i, id| {
            if id < s.rows {
                let table = table_of(&s, i);
                let pair = ((id % world) * s.tables + table) as usize;
                let at = *soff.add(pair) + ptx::atom_add_relaxed_gpu_u32(cursor.add(pair), 1);
                *keys.add(at as usize) = request_key(table, id);
                *pos.add(i as usize) = at;
            } else {
                *pos.add(i as usize) = PAD;
            }
        });
    }
}

/// Baseline step 3 (owner): `rows[j]` = the row of `keys[j]`, `j < count`.
#[kernel]
pub unsafe fn emb_bl_gather(s: EmbShape, world: u32, tables: *const f32, keys: *const u64, count: u32, rows: *mut f32) {
    let dim = s.dim as usize;
    let src = |j: u32| -> Option<*const f32> {
        // SAFETY: `keys` holds `count` keys of this rank's rows.
        Some(tables.wrapping_add(shard_row(&s, world, unsafe { *keys.add(j as usize) })))
    };
    // SAFETY: `rows` holds count × dim; rows whole, so 16-byte aligned for dim % 4 == 0.
    unsafe {
        if dim.is_multiple_of(4) {
            copy_rows(dim, count, rows, src);
        } else {
            let (gw, warps) = grid_warp();
            let mut j = gw;
            while j < count {
                if let Some(r) = src(j) {
                    let mut k = ptx::lane_id() as usize;
                    while k < dim {
                        *rows.add(j as usize * dim + k) = *r.add(k);
                        k += 32;
                    }
                }
                j += warps;
            }
        }
    }
}

/// Baseline step 4: `out[sample][table]` = the sum of `rows[pos]` over the bag.
#[kernel]
pub unsafe fn emb_bl_pool(s: EmbShape, ids: *const u32, pos: *const u32, rows: *const f32, out: *mut f32) {
    let dim = s.dim as usize;
    for_each_bag(&s, |w, bag| {
        // SAFETY: sizes as documented.
        unsafe {
            pool_bag(dim, s.pooling as usize, out.add(w as usize * dim), |p| {
                if *ids.add(bag + p) < s.rows {
                    Look::Row(rows.add(*pos.add(bag + p) as usize * dim))
                } else {
                    Look::Pad
                }
            });
        }
    });
}

/// Baseline backward step 1: `grads[pos]` = the upstream gradient of the
/// bag of every lookup (one row per occurrence).
#[kernel]
pub unsafe fn emb_bl_grad_scatter(s: EmbShape, ids: *const u32, pos: *const u32, grad: *const f32, grads: *mut f32) {
    let dim = s.dim as usize;
    for_each_bag(&s, |w, bag| {
        // SAFETY: sizes as documented.
        unsafe {
            for p in 0..s.pooling as usize {
                if *ids.add(bag + p) < s.rows {
                    let dst = grads.add(*pos.add(bag + p) as usize * dim);
                    let mut k = ptx::lane_id() as usize;
                    while k < dim {
                        *dst.add(k) = *grad.add(w as usize * dim + k);
                        k += 32;
                    }
                }
            }
        }
    });
}

/// Baseline backward step 2 (owner): `gacc[row of keys[j]] += grads[j]`.
#[kernel]
pub unsafe fn emb_bl_accumulate(s: EmbShape, world: u32, keys: *const u64, count: u32, grads: *const f32, gacc: *mut f32) {
    let (gw, warps) = grid_warp();
    let dim = s.dim as usize;
    let mut j = gw;
    while j < count {
        // SAFETY: as for emb_bl_gather.
        unsafe {
            add_row(
                gacc.add(shard_row(&s, world, *keys.add(j as usize))),
                grads.add(j as usize * dim),
                dim,
            )
        };
        j += warps;
    }
}

/// Baseline backward step 3 (owner): SGD on the rows of `keys`, taking each
/// accumulated element once (atomic exchange with zero).
#[kernel]
pub unsafe fn emb_bl_apply(s: EmbShape, world: u32, keys: *const u64, count: u32, gacc: *mut f32, tables: *mut f32, lr: f32) {
    let (gw, warps) = grid_warp();
    let dim = s.dim as usize;
    let mut j = gw;
    while j < count {
        // SAFETY: as for emb_bl_gather.
        unsafe {
            let off = shard_row(&s, world, *keys.add(j as usize));
            apply_row(gacc.add(off), tables.add(off), dim, lr);
        }
        j += warps;
    }
}

/// `dst[..words] = src[..words]` (u32 words): the baseline's copies on the
/// emulator (a GPU uses the driver's copy).
#[kernel]
pub unsafe fn emb_copy_words(dst: *mut u32, src: *const u32, words: u64) {
    let mut i = ptx::global_thread_id_x() as u64;
    while i < words {
        // SAFETY: both hold `words` words.
        unsafe { *dst.add(i as usize) = *src.add(i as usize) };
        i += ptx::grid_stride_x() as u64;
    }
}

/// Bytes a block moves with one put in [`emb_put_floor`](fn@emb_put_floor): the piece size
/// `p2p_bench` measures its put floor with, and the library's pieces of
/// long request lists.
pub const FLOOR_PIECE_BYTES: u64 = 32768;

/// The copy floor a benchmark compares the exchange's bandwidth with: the
/// same kind of traffic with nothing else. Every rank puts the first
/// `bytes` of its shard (`bytes` a multiple of 16, at most the shard and
/// one `rows_in` slot, `cap * dim * 4`) into every peer's `rows_in[me]`,
/// in pieces of [`FLOOR_PIECE_BYTES`] dealt round-robin over (piece, peer)
/// to the grid's blocks, with `put_nbi_block`, then `quiet` (thread 0): when the
/// kernel ends its data has arrived. No routing, no signals, no pooling.
/// A refused put is reported as `STATUS_TRANSPORT`.
#[kernel(transports(P2p), launch_bounds(threads = 256, min_blocks = 3))]
pub unsafe fn emb_put_floor<T: Transport>(t: T, s: EmbShape, b: EmbBufs, bytes: u64) {
    let n = t.world_size();
    let me = t.rank();
    if n < 2 {
        return;
    }
    let peers = (n - 1) as u64;
    let pieces = bytes.div_ceil(FLOOR_PIECE_BYTES) * peers;
    let slot = s.cap as usize * s.dim as usize;
    let mut refused = u32::MAX;
    let mut p = ptx::block_idx_x() as u64;
    // SAFETY: `bytes` within the shard and a `rows_in` slot (contract).
    unsafe {
        while p < pieces {
            let peer = (me + 1 + (p % peers) as u32) % n;
            let lo = (p / peers) * FLOOR_PIECE_BYTES;
            let len = FLOOR_PIECE_BYTES.min(bytes - lo);
            let src = (b.tables as *const u8).add(lo as usize);
            let dst = (b.rows_in.add(me as usize * slot) as *mut u8).add(lo as usize);
            if t.put_raw(
                Coop::Block,
                peer,
                RawXfer {
                    dst,
                    src,
                    bytes: len,
                    nbi: true,
                },
                None,
            )
            .is_err()
            {
                refused = peer;
            }
            p += ptx::grid_dim_x() as u64;
        }
        ptx::sync_threads();
        if ptx::thread_rank_in_block() == 0 && t.quiet(None).is_err() {
            refused = me;
        }
        if refused != u32::MAX && ptx::atom_cas_relaxed_gpu_u32(b.status, 0, STATUS_TRANSPORT) == 0 {
            // The first error of this rank, as the exchange's kernels record
            // theirs: the refused peer, and where (3: a put).
            *b.status.add(1) = refused;
            *b.status.add(2) = 3;
            *b.status.add(3) = 0;
            *b.status.add(4) = 0;
            *b.status.add(5) = 0;
            *b.status.add(6) = 0;
        }
    }
}
