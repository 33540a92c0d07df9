//! Row primitives of the exchange, one warp per row (or bag) unless said
//! otherwise: sum-pool a bag, copy rows several in flight, add a row into an
//! accumulator with atomics, apply SGD from an accumulator. Rows of a `dim`
//! that is a multiple of 4 are moved 16 bytes per lane per access (the
//! buffers must then be 16-byte aligned and rows whole), other rows one
//! element per lane. Public for kernels of your own (the examples'
//! host-driven baselines use them).

use crate::ptx;

/// Rows a lane has in flight at once when pooling or copying rows: each
/// row's load is issued before the first is used, so a warp waits for one
/// memory round trip per group of rows, not per row. ([`pool_bag`] writes
/// its four out by hand.)
pub const IN_FLIGHT: usize = 4;

/// What a bag's lookup contributes to its pooled row.
#[derive(Clone, Copy, Debug)]
pub enum Look {
    /// Padding: nothing.
    Pad,
    /// An error (already reported): the bag is not written.
    Bad,
    /// The row to add (its first element).
    Row(*const f32),
}

/// `W` consecutive f32 at `p` (`W` 4: one 16-byte load, `p` 16-byte aligned).
#[inline(always)]
unsafe fn load_w<const W: usize>(p: *const f32) -> [f32; W] {
    // SAFETY: `W` readable, aligned elements (caller); in the first branch
    // W == 4, so the two array types are one.
    unsafe {
        if W == 4 {
            let q = ptx::ld_v4_u32(p as *const u32).map(f32::from_bits);
            core::mem::transmute_copy::<[f32; 4], [f32; W]>(&q)
        } else {
            core::array::from_fn(|i| *p.add(i))
        }
    }
}

/// Stores `W` consecutive f32 at `p` (as [`load_w`]).
#[inline(always)]
unsafe fn store_w<const W: usize>(p: *mut f32, v: [f32; W]) {
    // SAFETY: `W` writable, aligned elements (caller); W == 4 in the first branch.
    unsafe {
        if W == 4 {
            let v = core::mem::transmute_copy::<[f32; W], [f32; 4]>(&v);
            ptx::st_v4_u32(p as *mut u32, v.map(f32::to_bits));
        } else {
            for (i, x) in v.iter().enumerate() {
                *p.add(i) = *x;
            }
        }
    }
}

/// Sum-pools one bag into `dst` (`dim` elements): one warp, every lane
/// calls it. `look(p)` for `p` in `0..pooling` says what the bag's `p`-th
/// lookup adds (lane `p % 32` asks it); rows are summed from zero in `p` order (a sequential
/// reference's order, so the result is bit-exact), [`IN_FLIGHT`] rows
/// loaded before they are added. A lane takes `W` consecutive elements per
/// pass of `32 * W` (`W` 4 needs `dim % 4 == 0` and 16-byte aligned rows).
/// Nothing is written when some lookup is [`Look::Bad`]; returns false then.
#[inline(always)]
unsafe fn pool_bag_w<const W: usize>(dim: usize, pooling: usize, dst: *mut f32, look: impl Fn(usize) -> Look) -> bool {
    let lane = ptx::lane_id() as usize;
    let mut bad = false;
    let mut kc = 0usize;
    // SAFETY: rows and `dst` hold `dim` elements (the caller's `look`).
    unsafe {
        while kc < dim {
            let k = kc + W * lane;
            let on = k < dim;
            let mut acc = [0f32; W];
            let mut p0 = 0usize;
            while p0 < pooling {
                // Lane `i` looks up lookup `p0 + i`: the bag's address
                // chains (id, slot, list index) run side by side, not one
                // after another. Null: nothing to add.
                let q = p0 + lane;
                let mut mine = core::ptr::null::<f32>();
                if q < pooling {
                    match look(q) {
                        Look::Row(r) => mine = r,
                        Look::Bad => bad = true,
                        Look::Pad => {}
                    }
                }
                let here = (pooling - p0).min(32);
                let mut g = 0usize;
                while g < here {
                    // Four rows' addresses from their lanes, every load,
                    // then the adds in order (written out: arrays indexed in
                    // a loop were kept in local memory).
                    let addr = |j: usize| ptx::shfl_sync_idx_u64(ptx::FULL_MASK, mine as u64, (g + j) as u32) as *const f32;
                    let (a0, a1, a2, a3) = (addr(0), addr(1), addr(2), addr(3));
                    let load = |a: *const f32| if on && !a.is_null() { load_w::<W>(a.add(k)) } else { [0f32; W] };
                    let (v0, v1, v2, v3) = (load(a0), load(a1), load(a2), load(a3));
                    for (a, v) in [(a0, v0), (a1, v1), (a2, v2), (a3, v3)] {
                        if !a.is_null() {
                            for i in 0..W {
                                acc[i] += v[i];
                            }
                        }
                    }
                    g += IN_FLIGHT;
                }
                p0 += 32;
            }
            bad = ptx::vote_sync_any(ptx::FULL_MASK, bad);
            if on && !bad {
                store_w::<W>(dst.add(k), acc);
            }
            kc += 32 * W;
        }
    }
    !bad
}

/// Copies rows `u` in `0..count` from `src(u)` (None: skipped) to
/// `dst + u * dim`, every warp of the grid taking [`IN_FLIGHT`] rows at a
/// time, 16 bytes per lane per access, every load of a group issued before
/// its stores. `dim % 4 == 0`; rows and `dst` 16-byte aligned. Every lane
/// calls it.
#[inline(always)]
pub unsafe fn copy_rows(dim: usize, count: u32, dst: *mut f32, src: impl Fn(u32) -> Option<*const f32>) {
    let (gw, warps) = grid_warp();
    let lane = ptx::lane_id() as usize;
    let words = dim / 4;
    let mut u0 = gw * IN_FLIGHT as u32;
    // SAFETY: the caller's rows and slot, `count` rows each way.
    unsafe {
        while u0 < count {
            let total = (count - u0).min(IN_FLIGHT as u32) as usize * words;
            let mut w = lane;
            while w < total {
                let mut v = [[0u32; 4]; IN_FLIGHT];
                let mut at = [core::ptr::null_mut::<f32>(); IN_FLIGHT];
                for j in 0..IN_FLIGHT {
                    let x = w + 32 * j;
                    if x < total {
                        let u = u0 + (x / words) as u32;
                        let off = (x % words) * 4;
                        if let Some(r) = src(u) {
                            v[j] = ptx::ld_v4_u32(r.add(off) as *const u32);
                            at[j] = dst.add(u as usize * dim + off);
                        }
                    }
                }
                for j in 0..IN_FLIGHT {
                    if !at[j].is_null() {
                        ptx::st_v4_u32(at[j] as *mut u32, v[j]);
                    }
                }
                w += 32 * IN_FLIGHT;
            }
            u0 += warps * IN_FLIGHT as u32;
        }
    }
}

/// `acc[k] += src[k]` for the `dim` elements of a row (one warp, every
/// lane calls it): atomic float adds, a lane's `W` consecutive elements
/// loaded at once.
#[inline(always)]
unsafe fn add_row_w<const W: usize>(acc: *mut f32, src: *const f32, dim: usize) {
    let mut k = W * ptx::lane_id() as usize;
    // SAFETY: two rows of `dim` elements, aligned for `W` (caller).
    unsafe {
        while k < dim {
            let v = load_w::<W>(src.add(k));
            for (i, x) in v.into_iter().enumerate() {
                ptx::red_add_relaxed_gpu_f32(acc.add(k + i), x);
            }
            k += 32 * W;
        }
    }
}

/// SGD on one row (one warp, every lane calls it): each element's
/// accumulated sum is taken and reset with an atomic exchange, and an
/// element whose sum was taken here gets `row -= lr * sum` (one multiply,
/// one subtract). Only the elements taken here are written: when a row
/// is applied from several lists, the second visit takes zeros and leaves
/// the row alone. A lane has its `W` exchanges in flight at once.
#[inline(always)]
unsafe fn apply_row_w<const W: usize>(acc: *mut f32, row: *mut f32, dim: usize, lr: f32) {
    let acc = acc as *mut u32;
    let mut k = W * ptx::lane_id() as usize;
    // SAFETY: two rows of `dim` elements (caller).
    unsafe {
        while k < dim {
            let mut sums = [0u32; W];
            for (i, x) in sums.iter_mut().enumerate() {
                *x = ptx::atom_exch_relaxed_gpu_u32(acc.add(k + i), 0);
            }
            for (i, x) in sums.into_iter().enumerate() {
                if x != 0 {
                    let v = *row.add(k + i);
                    *row.add(k + i) = v - lr * f32::from_bits(x);
                }
            }
            k += 32 * W;
        }
    }
}

/// One grid-wide warp index and the number of warps of the grid.
#[inline(always)]
pub fn grid_warp() -> (u32, u32) {
    let wpb = ptx::block_dim_x() / 32;
    (ptx::block_idx_x() * wpb + ptx::warp_id_in_block(), ptx::grid_dim_x() * wpb)
}

/// Sum-pools one bag into `dst` (`dim` elements): one warp, every lane
/// calls it. `look(p)` for `p` in `0..pooling` says what the bag's `p`-th
/// lookup adds (lane `p % 32` asks it); rows are summed from zero in `p`
/// order (a sequential reference's order, so the result is bit-exact),
/// [`IN_FLIGHT`] rows loaded before they are added. Nothing is written
/// when some lookup is [`Look::Bad`]; returns false then.
///
/// # Safety
/// Every row `look` returns and `dst` hold `dim` elements; with `dim % 4
/// == 0` they are 16-byte aligned. All 32 lanes of the warp call it.
#[inline(always)]
pub unsafe fn pool_bag(dim: usize, pooling: usize, dst: *mut f32, look: impl Fn(usize) -> Look) -> bool {
    // SAFETY: the caller's rows and `dst`.
    unsafe {
        if dim.is_multiple_of(4) {
            pool_bag_w::<4>(dim, pooling, dst, &look)
        } else {
            pool_bag_w::<1>(dim, pooling, dst, &look)
        }
    }
}

/// `acc[k] += src[k]` for the `dim` elements of a row (one warp, every
/// lane calls it), with atomic float adds (`red.add.f32`).
///
/// # Safety
/// Both rows hold `dim` elements, 16-byte aligned when `dim % 4 == 0`.
#[inline(always)]
pub unsafe fn add_row(acc: *mut f32, src: *const f32, dim: usize) {
    // SAFETY: the caller's rows.
    unsafe {
        if dim.is_multiple_of(4) {
            add_row_w::<4>(acc, src, dim)
        } else {
            add_row_w::<1>(acc, src, dim)
        }
    }
}

/// SGD on one row from its accumulator (one warp, every lane calls it):
/// each element's sum is taken and reset to zero with an atomic exchange,
/// and an element whose sum was taken here gets `row -= lr * sum` (one
/// multiply, one subtract). Only the elements taken here are written.
///
/// # Safety
/// Both rows hold `dim` elements, 16-byte aligned when `dim % 4 == 0`.
#[inline(always)]
pub unsafe fn apply_row(acc: *mut f32, row: *mut f32, dim: usize, lr: f32) {
    // SAFETY: the caller's rows.
    unsafe {
        if dim.is_multiple_of(4) {
            apply_row_w::<4>(acc, row, dim, lr)
        } else {
            apply_row_w::<1>(acc, row, dim, lr)
        }
    }
}
