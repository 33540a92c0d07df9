//! Embedding exchange: a row-wise sharded embedding lookup fused with its
//! all-to-all, forward and backward (what DLRM / TorchRec users call the
//! sparse "input dist → lookup → output dist" pipeline), in one kernel per
//! rank and direction.
//!
//! ## Sharding and layouts
//! Every table has `rows` rows of `dim` f32. Row `j` lives on rank `j % N`
//! as local row `j / N` (each rank holds `shard_rows = ceil(rows / N)` rows
//! per table, `[table][local row][dim]`). A rank's lookups are
//! `ids[table][sample][pooling]` (u32); [`PAD`] (`0xFFFFFFFF`) is padding, so
//! bags of any length, empty ones included, fit the fixed layout. The pooled
//! output is `out[sample][table][dim]` (sum pooling).
//!
//! ## Forward ([`emb_forward`]): route → dedup → request → gather → pool
//! 1. **Dedup and route** (every block, grid-stride over the lookups): each
//!    `(table, id)` is inserted into an open-addressing hash table (keys
//!    tagged with the epoch, so it needs no clearing between steps). The
//!    thread that inserts a key first takes the next index `u` of the
//!    owner's request list and writes the key there; repeated ids get the
//!    same slot. One grid barrier.
//! 2. **Request**: block `g` sends its owners' lists
//!    (`owner % blocks == g`) into the owners' symmetric request buffers
//!    with `put_signal_block`; the signal word carries the epoch, an error
//!    bit and the count, so empty lists and errors travel the same way.
//! 3. **Gather** (owner side): once every requester's list is in, warps take
//!    the requested rows and `put_warp` them straight from the table into
//!    the requester's receive buffer (`rows_in[owner][u]`); each block then
//!    adds 1 to the requester's per-owner signal (`rows_sig`).
//! 4. **Pool** (requester side): once every owner's blocks have signalled,
//!    one warp per bag sums its rows in bag order (`p = 0, 1, ...`) — the
//!    same order as a sequential reference, so forward results are
//!    bit-exact — and writes `out`.
//!
//! Deduplicated rows are sent once per (requester, owner) pair; the traffic
//! saved is `(lookups - unique keys) * dim * 4` bytes per direction (the
//! example prints it). Pooling stays at the requester: owners could pool
//! partial sums per (requester, sample, table) instead, but partial sums
//! cannot be shared between bags, so under skew the dedup wins, and the
//! summation order would depend on the sharding.
//!
//! [`emb_forward_pull`] is the other design: where `peer_ptr` gives direct
//! access (same GPU, NVLink), a warp reads each row straight from the
//! owner's table and pools it, with no routing and no dedup (one barrier
//! across ranks first, so no owner is still updating its table). It needs
//! direct load/store access (it reports [`STATUS_NO_PEER_PTR`] otherwise)
//! and has no backward of its own; the benchmark measures both.
//!
//! ## Backward ([`emb_backward`]), reusing the forward's routing
//! 1. The requester sums the upstream gradient `g[sample][table]` of every
//!    occurrence of a key into a staging row per unique key (the receive
//!    buffer of the forward, zeroed first), then `put_signal_block`s each
//!    owner its list of summed rows, in the order of the owner's request
//!    list (so no keys travel back).
//! 2. The owner adds the rows of every requester into a per-row accumulator
//!    (`gacc`, kept all-zero between steps), one grid barrier, then each
//!    element is taken with an atomic exchange against zero by exactly one
//!    thread, which applies SGD: `row -= lr * sum`.
//!
//! **Float-sum order**: the gradient sums (steps 1 and 2) are atomic adds,
//! so their order varies from run to run; when every partial sum is exactly
//! representable (integer-valued gradients whose sums stay below 2^24, as in
//! the example) the result is still bit-exact and deterministic, otherwise
//! it matches a sequential reference within f32 rounding. `row -= lr * sum`
//! is one multiply and one subtract (no fused multiply-add).
//!
//! ## Errors
//! Ids are validated on the device too: an id `>= rows` (other than
//! [`PAD`]) or a list past its capacity marks the rank's request signal with
//! the error bit. Every rank sees every requester's signal before it gathers
//! anything, so then **no rank writes any output or table** ([`STATUS_*`]
//! in the `status` words say why; [`STATUS_PEER_ERROR`] on the ranks that
//! only learnt of another rank's error), while the protocol itself still
//! completes, so the next step can run. Waits are bounded by `budget_ns`.
//!
//! ## Launch
//! Every rank launches the same grid (`blocks` × `threads`, threads a
//! multiple of 32) with [`SHARED_BYTES`] of dynamic shared memory; the grid
//! must be co-resident (grid barriers), and so must every rank's grid when
//! ranks share a GPU. Epochs start at 1 and go up by one per forward; a
//! backward uses the epoch of the forward before it.

use doorbell_kernels::transport::{Cmp, Ibgda, P2p, Routed, SignalOp, Transport};
use doorbell_kernels::{kernel, ptx};

/// Padding id: contributes nothing.
pub const PAD: u32 = u32::MAX;
/// Most tables (the hash key keeps 8 bits for the table).
pub const MAX_TABLES: u32 = 256;
/// Largest `dim` handled (rows are pooled 256 elements at a time).
pub const MAX_DIM: u32 = 4096;
/// Dynamic shared memory a launch needs, bytes.
pub const SHARED_BYTES: u32 = 16;
/// Words of the status buffer.
pub const STATUS_WORDS: usize = 8;

/// Status word 0: all went well.
pub const STATUS_OK: u32 = 0;
/// An id `>= rows` (words 1..5: table, sample, position, id).
pub const STATUS_BAD_ID: u32 = 1;
/// A request list outgrew its capacity (words 1..3: owner, count).
pub const STATUS_CAPACITY: u32 = 2;
/// Another rank reported an error; nothing was written.
pub const STATUS_PEER_ERROR: u32 = 3;
/// A transport call failed (the communicator's report says which).
pub const STATUS_TRANSPORT: u32 = 4;
/// An owner received a key that is not its own (a routing bug).
pub const STATUS_BAD_REQUEST: u32 = 5;
/// `peer_ptr` gave no direct access (the pull forward needs it).
pub const STATUS_NO_PEER_PTR: u32 = 6;
/// A wait or grid barrier ran out of budget.
pub const STATUS_TIMEOUT: u32 = 7;

/// The problem's shape, the same on every rank.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbShape {
    /// Tables (`<= MAX_TABLES`).
    pub tables: u32,
    /// Elements per row (`<= MAX_DIM`).
    pub dim: u32,
    /// Samples per rank.
    pub batch: u32,
    /// Ids per bag.
    pub pooling: u32,
    /// Rows of every table (global).
    pub rows: u32,
    /// Rows of every table held per rank: `ceil(rows / N)`.
    pub shard_rows: u32,
    /// Capacity of one (requester, owner) request list, in keys.
    pub cap: u32,
    /// The hash table has `1 << hash_bits` slots (at least twice the lookups).
    pub hash_bits: u32,
}
const _: () = assert!(core::mem::size_of::<EmbShape>() == 32);

/// The exchange's buffers. "Symmetric": allocated with the communicator,
/// same offset on every rank; "local": this rank's device memory.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EmbBufs {
    /// Symmetric `[tables][shard_rows][dim]`: this rank's shard.
    pub tables: *mut f32,
    /// Symmetric `[2][N][cap]` keys received from each requester (by epoch parity).
    pub req_in: *mut u64,
    /// Symmetric `[N]`: `epoch << 33 | error << 32 | count` from each requester.
    pub req_sig: *mut u64,
    /// Symmetric `[N][cap][dim]`: rows received from each owner; the
    /// backward's gradient staging.
    pub rows_in: *mut f32,
    /// Symmetric `[N]`: +1 per block of each owner per epoch.
    pub rows_sig: *mut u64,
    /// Symmetric `[N][cap][dim]`: summed gradients from each requester.
    pub grad_in: *mut f32,
    /// Symmetric `[N]`: the epoch, from each requester.
    pub grad_sig: *mut u64,
    /// Symmetric `[N][cap]`: this rank's request list for each owner.
    pub req_out: *mut u64,
    /// Local `[1 << hash_bits]` keys: `tag << 40 | table << 32 | id`.
    pub keys: *mut u64,
    /// Local `[1 << hash_bits]`: a key's index in its owner's list.
    pub vals: *mut u32,
    /// Local `[tables][batch][pooling]`: each lookup's hash slot (PAD: none).
    pub slot_of: *mut u32,
    /// Local `[2][N]`: requests to each owner, by epoch parity.
    pub counts: *mut u32,
    /// Local `[2][N]`: requests from each requester, by epoch parity.
    pub rcounts: *mut u32,
    /// Local `[tables][shard_rows][dim]`: gradient sums (all zero between steps).
    pub gacc: *mut f32,
    /// Local `[2]`: grid barrier (arrivals, generation).
    pub grid: *mut u32,
    /// Local `[STATUS_WORDS]`: the first error (0: none).
    pub status: *mut u32,
}

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] plain data (u32 fields), 4-byte aligned, matching the
// struct-by-value parameter of the PTX entry points.
unsafe impl doorbell_kernels::KernelParam for EmbShape {}
#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] raw pointers only, 8-byte aligned, as the PTX parameter.
unsafe impl doorbell_kernels::KernelParam for EmbBufs {}

/// The hash tag of an epoch: 1..2^24-1 (0 marks never-used slots). The host
/// zeroes the keys when the tag wraps to 1 again.
#[inline(always)]
pub fn hash_tag(epoch: u64) -> u64 {
    ((epoch.wrapping_sub(1)) % ((1 << 24) - 1)) + 1
}

/// The key sent to an owner: `table << 32 | id`.
#[inline(always)]
pub fn request_key(table: u32, id: u32) -> u64 {
    ((table as u64) << 32) | id as u64
}

/// Records the first error of this rank (first caller wins); one thread.
#[inline(never)]
unsafe fn set_status(status: *mut u32, code: u32, a: u32, b: u32, c: u32, d: u32) {
    // SAFETY: `status` holds STATUS_WORDS words (launch contract).
    unsafe {
        if ptx::atom_cas_relaxed_gpu_u32(status, 0, code) == 0 {
            *status.add(1) = a;
            *status.add(2) = b;
            *status.add(3) = c;
            *status.add(4) = d;
        }
    }
}

#[inline(always)]
unsafe fn status_code(status: *const u32) -> u32 {
    // SAFETY: as for `set_status`.
    unsafe { ptx::ld_relaxed_gpu_u32(status) }
}

/// `*p += v` for f32 with a compare-and-swap loop (lock-free; the order of
/// concurrent adds is not fixed).
#[inline(always)]
unsafe fn atomic_add_f32(p: *mut f32, v: f32) {
    let w = p as *mut u32;
    // SAFETY: a valid, 4-byte aligned f32 (caller).
    unsafe {
        let mut old = ptx::ld_relaxed_gpu_u32(w);
        loop {
            let new = (f32::from_bits(old) + v).to_bits();
            let seen = ptx::atom_cas_relaxed_gpu_u32(w, old, new);
            if seen == old {
                break;
            }
            old = seen;
        }
    }
}

/// Barrier across the blocks of this rank's grid (all co-resident): every
/// thread calls it. Publishes every write made before it to every block
/// after it (gpu scope: one rank's grid lives on one GPU). Bounded: false
/// (for every thread of the block) when the budget ran out.
#[inline(always)]
unsafe fn grid_sync(grid: *mut u32, budget_ns: u64) -> bool {
    let sh = ptx::dynamic_shared_mem() as *mut u32;
    ptx::sync_threads();
    if ptx::thread_rank_in_block() == 0 {
        // SAFETY: `grid` holds two words; `sh` SHARED_BYTES of shared memory.
        unsafe {
            let gen = grid.add(1);
            // The generation cannot move before this block arrives.
            let g0 = ptx::ld_acquire_gpu_u32(gen);
            ptx::fence_acq_rel_gpu();
            let arrived = ptx::atom_add_acq_rel_gpu_u32(grid, 1) + 1;
            let mut ok = true;
            if arrived == ptx::grid_dim_x() {
                ptx::st_relaxed_gpu_u32(grid, 0);
                ptx::st_release_gpu_u32(gen, g0.wrapping_add(1));
            } else {
                ok = doorbell_kernels::sync::spin_until(budget_ns, || ptx::ld_acquire_gpu_u32(gen) as u64, |v| v != g0 as u64).is_ok();
            }
            ptx::st_relaxed_cta_u32(sh, ok as u32);
        }
    }
    ptx::sync_threads();
    // SAFETY: written by thread 0 before the barrier.
    unsafe { ptx::ld_relaxed_cta_u32(sh) != 0 }
}

/// [`grid_sync`]; when its budget runs out, thread 0 records
/// `STATUS_TIMEOUT` with `step` (where the kernel stopped) and every thread
/// gets false.
#[inline(always)]
unsafe fn grid_sync_or_report(grid: *mut u32, status: *mut u32, budget_ns: u64, step: u32) -> bool {
    // SAFETY: the launch's grid words and status words (the caller's).
    unsafe {
        if grid_sync(grid, budget_ns) {
            return true;
        }
        if ptx::thread_rank_in_block() == 0 {
            set_status(status, STATUS_TIMEOUT, step, 0, 0, 0);
        }
    }
    false
}

/// Thread 0's value, shared with the block (every thread calls it).
#[inline(always)]
unsafe fn block_share(v: u32) -> u32 {
    let sh = (ptx::dynamic_shared_mem() as *mut u32).wrapping_add(1);
    // SAFETY: SHARED_BYTES of shared memory (launch contract).
    unsafe {
        if ptx::thread_rank_in_block() == 0 {
            ptx::st_relaxed_cta_u32(sh, v);
        }
        ptx::sync_threads();
        let r = ptx::ld_relaxed_cta_u32(sh);
        ptx::sync_threads();
        r
    }
}

/// Inserts `(table, id)` for `tag`; returns (slot, inserted by this call).
#[inline(always)]
unsafe fn hash_insert(keys: *mut u64, bits: u32, tag: u64, table: u32, id: u32) -> (u32, bool) {
    let body = request_key(table, id);
    let key = (tag << 40) | body;
    let mask = (1u64 << bits) - 1;
    let mut slot = body.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits);
    loop {
        // SAFETY: slot < 1 << bits, the table's size (launch contract).
        unsafe {
            let p = keys.add(slot as usize);
            let cur = ptx::ld_relaxed_gpu_u64(p);
            if cur == key {
                return (slot as u32, false);
            }
            if cur >> 40 != tag {
                // Empty, or a key of an earlier epoch: claim it.
                let seen = ptx::atom_cas_relaxed_gpu_u64(p, cur, key);
                if seen == cur {
                    return (slot as u32, true);
                }
                if seen == key {
                    return (slot as u32, false);
                }
                // Another key of this epoch took it: look again.
                continue;
            }
        }
        slot = (slot + 1) & mask;
    }
}

/// Elements of a row a lane handles per pass (`256 / 32`).
const PER_LANE: usize = 8;
const CHUNK: u32 = 32 * PER_LANE as u32;

/// One grid-wide warp index and the number of warps of the grid.
#[inline(always)]
fn grid_warp() -> (u32, u32) {
    let wpb = ptx::block_dim_x() / 32;
    (ptx::block_idx_x() * wpb + ptx::warp_id_in_block(), ptx::grid_dim_x() * wpb)
}

/// Forward: see the module docs. `ids` `[tables][batch][pooling]`, `out`
/// `[batch][tables][dim]` (local). `status` gets [`STATUS_OK`] or why not.
///
/// Launch: the same grid on every rank, threads a multiple of 32,
/// [`SHARED_BYTES`] of shared memory; epochs 1, 2, 3, ...
#[kernel(transports(P2p, Ibgda, Routed))]
pub unsafe fn emb_forward<T: Transport>(t: T, s: EmbShape, b: EmbBufs, ids: *const u32, out: *mut f32, epoch: u64, budget_ns: u64) {
    let n = t.world_size();
    let me = t.rank();
    let par = (epoch & 1) as usize;
    let cap = s.cap as usize;
    let dim = s.dim as usize;
    let per_table = s.batch as u64 * s.pooling as u64;
    let lookups = s.tables as u64 * per_table;
    let tid = ptx::thread_rank_in_block();
    let blk = ptx::block_idx_x();
    let blocks = ptx::grid_dim_x();
    let tag = hash_tag(epoch);
    // SAFETY: buffers as EmbBufs documents, sized from `s` and the world
    // (launch contract); every index below stays inside them.
    unsafe {
        let counts = b.counts.add(par * n as usize);
        // 1. Dedup and route.
        let mut i = ptx::global_thread_id_x() as u64;
        let stride = ptx::grid_stride_x() as u64;
        while i < lookups {
            let id = *ids.add(i as usize);
            let table = (i / per_table) as u32;
            let slot_p = b.slot_of.add(i as usize);
            if id == PAD {
                *slot_p = PAD;
            } else if id >= s.rows {
                let within = i % per_table;
                set_status(
                    b.status,
                    STATUS_BAD_ID,
                    table,
                    (within / s.pooling as u64) as u32,
                    (within % s.pooling as u64) as u32,
                    id,
                );
                *slot_p = PAD;
            } else {
                let (slot, fresh) = hash_insert(b.keys, s.hash_bits, tag, table, id);
                *slot_p = slot;
                if fresh {
                    let owner = id % n;
                    let u = ptx::atom_add_relaxed_gpu_u32(counts.add(owner as usize), 1);
                    *b.vals.add(slot as usize) = u;
                    if u < s.cap {
                        *b.req_out.add(owner as usize * cap + u as usize) = request_key(table, id);
                    } else {
                        set_status(b.status, STATUS_CAPACITY, owner, u + 1, s.cap, 0);
                    }
                }
            }
            i += stride;
        }
        if !grid_sync_or_report(b.grid, b.status, budget_ns, 0) {
            return;
        }

        // 2. Request: every owner gets a signal, even for an empty list.
        let my_err = status_code(b.status) != STATUS_OK;
        let mut owner = blk;
        while owner < n {
            let c = if my_err {
                0
            } else {
                ptx::ld_relaxed_gpu_u32(counts.add(owner as usize))
            };
            let sig = (epoch << 33) | ((my_err as u64) << 32) | c as u64;
            let dst = b.req_in.add((par * n as usize + me as usize) * cap);
            let src = b.req_out.add(owner as usize * cap);
            let r = t.put_signal_block(
                dst as *mut u8,
                src as *const u8,
                c as u64 * 8,
                b.req_sig.add(me as usize),
                sig,
                SignalOp::Set,
                owner,
            );
            if r.is_err() && tid == 0 {
                set_status(b.status, STATUS_TRANSPORT, owner, 0, 0, 0);
            }
            owner += blocks;
        }

        // 3. Gather: wait for every requester (this is where every rank
        // learns whether any rank failed), then send the rows.
        let mut verdict = 0u32; // 0 fine, 1 some rank failed, 2 timed out
        if tid == 0 {
            for r in 0..n {
                match t.wait_until(b.req_sig.add(r as usize), Cmp::Ge, epoch << 33) {
                    Ok(v) => {
                        if (v >> 32) & 1 != 0 || (v as u32) > s.cap {
                            verdict = verdict.max(1);
                        }
                        if blk == 0 {
                            *b.rcounts.add(par * n as usize + r as usize) = v as u32;
                        }
                    }
                    Err(_) => {
                        verdict = 2;
                        break;
                    }
                }
            }
        }
        let verdict = block_share(verdict);
        if verdict == 2 {
            if tid == 0 {
                set_status(b.status, STATUS_TIMEOUT, 1, 0, 0, 0);
            }
            return;
        }
        let (gw, warps) = grid_warp();
        if verdict == 0 {
            for r in 0..n {
                // Stable for this kernel's life (the requester's next
                // request needs this rank's next rows first).
                let c = ptx::ld_relaxed_sys_u64(b.req_sig.add(r as usize)) as u32;
                let list = b.req_in.add((par * n as usize + r as usize) * cap);
                let mut u = gw;
                while u < c {
                    let key = *list.add(u as usize);
                    let table = (key >> 32) as u32;
                    let id = key as u32;
                    if table >= s.tables || id >= s.rows || id % n != me {
                        if ptx::lane_id() == 0 {
                            set_status(b.status, STATUS_BAD_REQUEST, r, table, id, 0);
                        }
                    } else {
                        let row = b.tables.add((table as usize * s.shard_rows as usize + (id / n) as usize) * dim);
                        let dst = b.rows_in.add((me as usize * cap + u as usize) * dim);
                        if t.put_warp(dst as *mut u8, row as *const u8, dim as u64 * 4, r).is_err() && ptx::lane_id() == 0 {
                            set_status(b.status, STATUS_TRANSPORT, r, 1, 0, 0);
                        }
                    }
                    u += warps;
                }
            }
        } else if tid == 0 && status_code(b.status) == STATUS_OK {
            set_status(b.status, STATUS_PEER_ERROR, 0, 0, 0, 0);
        }
        ptx::sync_threads();
        if tid == 0 {
            // The block's puts (its warps', ordered before this thread by the
            // barrier) are published by the signals once fenced.
            t.fence();
            for r in 0..n {
                if t.signal(b.rows_sig.add(me as usize), 1, SignalOp::Add, r).is_err() {
                    set_status(b.status, STATUS_TRANSPORT, r, 2, 0, 0);
                }
            }
        }

        // 4. Pool, once every block of every owner has sent.
        let mut waited = 0u32;
        if tid == 0 {
            for o in 0..n {
                if t.wait_until(b.rows_sig.add(o as usize), Cmp::Ge, epoch * blocks as u64).is_err() {
                    waited = 1;
                    break;
                }
            }
        }
        if block_share(waited) != 0 {
            if tid == 0 {
                set_status(b.status, STATUS_TIMEOUT, 2, 0, 0, 0);
            }
            return;
        }
        if verdict == 0 {
            let lane = ptx::lane_id() as usize;
            let bags = s.batch * s.tables;
            let mut w = gw;
            while w < bags {
                let sample = w / s.tables;
                let table = w % s.tables;
                let bag = (table as u64 * per_table + sample as u64 * s.pooling as u64) as usize;
                let dst = out.add(w as usize * dim);
                let mut kc = 0usize;
                while kc < dim {
                    let mut acc = [0f32; PER_LANE];
                    for p in 0..s.pooling as usize {
                        let id = *ids.add(bag + p);
                        if id == PAD {
                            continue;
                        }
                        let u = *b.vals.add(*b.slot_of.add(bag + p) as usize) as usize;
                        let row = b.rows_in.add(((id % n) as usize * cap + u) * dim + kc);
                        for (j, a) in acc.iter_mut().enumerate() {
                            let k = lane + 32 * j;
                            if kc + k < dim {
                                *a += *row.add(k);
                            }
                        }
                    }
                    for (j, a) in acc.iter().enumerate() {
                        let k = lane + 32 * j;
                        if kc + k < dim {
                            *dst.add(kc + k) = *a;
                        }
                    }
                    kc += CHUNK as usize;
                }
                w += warps;
            }
        }
        // The next epoch's counters start from zero.
        if blk == 0 {
            let next = b.counts.add((1 - par) * n as usize);
            let mut o = tid;
            while o < n {
                *next.add(o as usize) = 0;
                o += ptx::block_dim_x();
            }
        }
    }
}

/// Backward of the forward with the same `epoch` (same ids): see the module
/// docs. `grad` `[batch][tables][dim]` (local), SGD step `lr`. Launch as
/// for [`emb_forward`]; run it only after that forward succeeded.
#[kernel(transports(P2p, Ibgda, Routed))]
pub unsafe fn emb_backward<T: Transport>(
    t: T,
    s: EmbShape,
    b: EmbBufs,
    ids: *const u32,
    grad: *const f32,
    lr: f32,
    epoch: u64,
    budget_ns: u64,
) {
    let n = t.world_size();
    let me = t.rank();
    let par = (epoch & 1) as usize;
    let cap = s.cap as usize;
    let dim = s.dim as usize;
    let per_table = s.batch as u64 * s.pooling as u64;
    let tid = ptx::thread_rank_in_block();
    let blk = ptx::block_idx_x();
    let blocks = ptx::grid_dim_x();
    let lane = ptx::lane_id() as usize;
    let (gw, warps) = grid_warp();
    // SAFETY: as for emb_forward.
    unsafe {
        let counts = b.counts.add(par * n as usize);
        let rcounts = b.rcounts.add(par * n as usize);
        // 1. Zero the staging rows (the forward's receive buffer).
        for o in 0..n as usize {
            let c = ptx::ld_relaxed_gpu_u32(counts.add(o)).min(s.cap) as usize;
            let base = b.rows_in.add(o * cap * dim);
            let mut i = ptx::global_thread_id_x() as usize;
            while i < c * dim {
                *base.add(i) = 0.0;
                i += ptx::grid_stride_x() as usize;
            }
        }
        if !grid_sync_or_report(b.grid, b.status, budget_ns, 3) {
            return;
        }
        // 2. Sum the gradient of every occurrence per unique key.
        let bags = s.batch * s.tables;
        let mut w = gw;
        while w < bags {
            let sample = w / s.tables;
            let table = w % s.tables;
            let bag = (table as u64 * per_table + sample as u64 * s.pooling as u64) as usize;
            let g = grad.add(w as usize * dim);
            for p in 0..s.pooling as usize {
                let id = *ids.add(bag + p);
                if id == PAD || id >= s.rows {
                    continue;
                }
                let u = *b.vals.add(*b.slot_of.add(bag + p) as usize) as usize;
                let row = b.rows_in.add(((id % n) as usize * cap + u) * dim);
                let mut k = lane;
                while k < dim {
                    atomic_add_f32(row.add(k), *g.add(k));
                    k += 32;
                }
            }
            w += warps;
        }
        if !grid_sync_or_report(b.grid, b.status, budget_ns, 4) {
            return;
        }
        // 3. Send each owner its summed rows, in its request list's order.
        let mut owner = blk;
        while owner < n {
            let c = ptx::ld_relaxed_gpu_u32(counts.add(owner as usize)).min(s.cap) as u64;
            let dst = b.grad_in.add(me as usize * cap * dim);
            let src = b.rows_in.add(owner as usize * cap * dim);
            let r = t.put_signal_block(
                dst as *mut u8,
                src as *const u8,
                c * dim as u64 * 4,
                b.grad_sig.add(me as usize),
                epoch,
                SignalOp::Set,
                owner,
            );
            if r.is_err() && tid == 0 {
                set_status(b.status, STATUS_TRANSPORT, owner, 3, 0, 0);
            }
            owner += blocks;
        }
        // 4. Owner: accumulate every requester's rows.
        let mut waited = 0u32;
        if tid == 0 {
            for r in 0..n {
                if t.wait_until(b.grad_sig.add(r as usize), Cmp::Ge, epoch).is_err() {
                    waited = 1;
                    break;
                }
            }
        }
        if block_share(waited) != 0 {
            if tid == 0 {
                set_status(b.status, STATUS_TIMEOUT, 5, 0, 0, 0);
            }
            return;
        }
        for r in 0..n as usize {
            let c = ptx::ld_relaxed_gpu_u32(rcounts.add(r)).min(s.cap);
            let list = b.req_in.add((par * n as usize + r) * cap);
            let mut u = gw;
            while u < c {
                let key = *list.add(u as usize);
                let (table, id) = ((key >> 32) as u32, key as u32);
                if table < s.tables && id < s.rows && id % n == me {
                    let acc = b.gacc.add((table as usize * s.shard_rows as usize + (id / n) as usize) * dim);
                    let src = b.grad_in.add((r * cap + u as usize) * dim);
                    let mut k = lane;
                    while k < dim {
                        atomic_add_f32(acc.add(k), *src.add(k));
                        k += 32;
                    }
                }
                u += warps;
            }
        }
        if !grid_sync_or_report(b.grid, b.status, budget_ns, 6) {
            return;
        }
        // 5. Apply: each element's sum is taken (and reset) by one thread.
        for r in 0..n as usize {
            let c = ptx::ld_relaxed_gpu_u32(rcounts.add(r)).min(s.cap);
            let list = b.req_in.add((par * n as usize + r) * cap);
            let mut u = gw;
            while u < c {
                let key = *list.add(u as usize);
                let (table, id) = ((key >> 32) as u32, key as u32);
                if table < s.tables && id < s.rows && id % n == me {
                    let off = (table as usize * s.shard_rows as usize + (id / n) as usize) * dim;
                    let acc = b.gacc.add(off) as *mut u32;
                    let row = b.tables.add(off);
                    let mut k = lane;
                    while k < dim {
                        let bits = ptx::atom_exch_relaxed_gpu_u32(acc.add(k), 0);
                        if bits != 0 {
                            let v = *row.add(k);
                            *row.add(k) = v - lr * f32::from_bits(bits);
                        }
                        k += 32;
                    }
                }
                u += warps;
            }
        }
    }
}

/// Forward by direct loads from the owners' tables (`peer_ptr`), no
/// routing and no dedup: see the module docs. Same arguments as
/// [`emb_forward`] (only `tables`, `grid` and `status` of `b` are used).
/// Bad ids are skipped and reported; the bags holding them are not written.
#[kernel(transports(P2p, Routed))]
pub unsafe fn emb_forward_pull<T: Transport>(t: T, s: EmbShape, b: EmbBufs, ids: *const u32, out: *mut f32, budget_ns: u64) {
    let n = t.world_size();
    let dim = s.dim as usize;
    let per_table = s.batch as u64 * s.pooling as u64;
    let tid = ptx::thread_rank_in_block();
    let lane = ptx::lane_id() as usize;
    // SAFETY: as for emb_forward.
    unsafe {
        // No owner may still be applying a backward step to its table.
        if ptx::block_idx_x() == 0 && t.barrier_block().is_err() && tid == 0 {
            set_status(b.status, STATUS_TIMEOUT, 7, 0, 0, 0);
        }
        if !grid_sync_or_report(b.grid, b.status, budget_ns, 8) {
            return;
        }
        let (gw, warps) = grid_warp();
        let bags = s.batch * s.tables;
        let mut w = gw;
        while w < bags {
            let sample = w / s.tables;
            let table = w % s.tables;
            let bag = (table as u64 * per_table + sample as u64 * s.pooling as u64) as usize;
            let dst = out.add(w as usize * dim);
            let mut kc = 0usize;
            let mut bad = false;
            while kc < dim {
                let mut acc = [0f32; PER_LANE];
                for p in 0..s.pooling as usize {
                    let id = *ids.add(bag + p);
                    if id == PAD {
                        continue;
                    }
                    if id >= s.rows {
                        if lane == 0 {
                            set_status(b.status, STATUS_BAD_ID, table, sample, p as u32, id);
                        }
                        bad = true;
                        continue;
                    }
                    let local = b
                        .tables
                        .add((table as usize * s.shard_rows as usize + (id / n) as usize) * dim + kc);
                    let Some(row) = t.peer_ptr(local as *const f32, id % n) else {
                        if lane == 0 {
                            set_status(b.status, STATUS_NO_PEER_PTR, id % n, 0, 0, 0);
                        }
                        bad = true;
                        continue;
                    };
                    for (j, a) in acc.iter_mut().enumerate() {
                        let k = lane + 32 * j;
                        if kc + k < dim {
                            *a += *row.add(k);
                        }
                    }
                }
                if !bad {
                    for (j, a) in acc.iter().enumerate() {
                        let k = lane + 32 * j;
                        if kc + k < dim {
                            *dst.add(kc + k) = *a;
                        }
                    }
                }
                kc += CHUNK as usize;
            }
            w += warps;
        }
    }
}

// ---------------------------------------------------------------------------
// The baselines' kernels: plain kernels around a host-driven exchange
// (one copy per peer per table, or NCCL send/recv). No transport.
// ---------------------------------------------------------------------------

/// Baseline step 1: `cnt[owner][table]` += the lookups of that pair
/// (`cnt` zeroed by the caller). Bad ids are not counted.
#[kernel]
pub unsafe fn emb_bl_count(s: EmbShape, world: u32, ids: *const u32, cnt: *mut u32) {
    let per_table = s.batch as u64 * s.pooling as u64;
    let lookups = s.tables as u64 * per_table;
    let mut i = ptx::global_thread_id_x() as u64;
    while i < lookups {
        // SAFETY: `ids` holds the lookups, `cnt` world × tables words.
        unsafe {
            let id = *ids.add(i as usize);
            if id < s.rows {
                let table = (i / per_table) as u32;
                ptx::atom_add_relaxed_gpu_u32(cnt.add(((id % world) * s.tables + table) as usize), 1);
            }
        }
        i += ptx::grid_stride_x() as u64;
    }
}

/// Baseline step 2: every lookup's key goes to `keys[soff[owner][table] +
/// i]` (`cursor` zeroed by the caller) and its position there to `pos`
/// (`[tables][batch][pooling]`; PAD for padding).
#[kernel]
pub unsafe fn emb_bl_scatter(s: EmbShape, world: u32, ids: *const u32, soff: *const u32, cursor: *mut u32, keys: *mut u64, pos: *mut u32) {
    let per_table = s.batch as u64 * s.pooling as u64;
    let lookups = s.tables as u64 * per_table;
    let mut i = ptx::global_thread_id_x() as u64;
    while i < lookups {
        // SAFETY: sizes as documented; `keys` holds every non-pad lookup.
        unsafe {
            let id = *ids.add(i as usize);
            if id < s.rows {
                let table = (i / per_table) as u32;
                let pair = ((id % world) * s.tables + table) as usize;
                let at = *soff.add(pair) + ptx::atom_add_relaxed_gpu_u32(cursor.add(pair), 1);
                *keys.add(at as usize) = request_key(table, id);
                *pos.add(i as usize) = at;
            } else {
                *pos.add(i as usize) = PAD;
            }
        }
        i += ptx::grid_stride_x() as u64;
    }
}

/// Baseline step 3 (owner): `rows[j]` = the row of `keys[j]`, `j < count`.
#[kernel]
pub unsafe fn emb_bl_gather(s: EmbShape, world: u32, tables: *const f32, keys: *const u64, count: u32, rows: *mut f32) {
    let (gw, warps) = grid_warp();
    let dim = s.dim as usize;
    let mut j = gw;
    while j < count {
        // SAFETY: `keys` holds `count` keys of this rank's rows; `rows` count × dim.
        unsafe {
            let key = *keys.add(j as usize);
            let (table, id) = ((key >> 32) as usize, key as u32);
            let src = tables.add((table * s.shard_rows as usize + (id / world) as usize) * dim);
            let dst = rows.add(j as usize * dim);
            let mut k = ptx::lane_id() as usize;
            while k < dim {
                *dst.add(k) = *src.add(k);
                k += 32;
            }
        }
        j += warps;
    }
}

/// Baseline step 4: `out[sample][table]` = the sum of `rows[pos]` over the bag.
#[kernel]
pub unsafe fn emb_bl_pool(s: EmbShape, ids: *const u32, pos: *const u32, rows: *const f32, out: *mut f32) {
    let (gw, warps) = grid_warp();
    let dim = s.dim as usize;
    let per_table = s.batch as u64 * s.pooling as u64;
    let lane = ptx::lane_id() as usize;
    let mut w = gw;
    while w < s.batch * s.tables {
        let bag = ((w % s.tables) as u64 * per_table + (w / s.tables) as u64 * s.pooling as u64) as usize;
        // SAFETY: sizes as documented.
        unsafe {
            let mut k = lane;
            while k < dim {
                let mut acc = 0f32;
                for p in 0..s.pooling as usize {
                    if *ids.add(bag + p) < s.rows {
                        acc += *rows.add(*pos.add(bag + p) as usize * dim + k);
                    }
                }
                *out.add(w as usize * dim + k) = acc;
                k += 32;
            }
        }
        w += warps;
    }
}

/// Baseline backward step 1: `grads[pos]` = the upstream gradient of the
/// bag of every lookup (one row per occurrence).
#[kernel]
pub unsafe fn emb_bl_grad_scatter(s: EmbShape, ids: *const u32, pos: *const u32, grad: *const f32, grads: *mut f32) {
    let (gw, warps) = grid_warp();
    let dim = s.dim as usize;
    let per_table = s.batch as u64 * s.pooling as u64;
    let mut w = gw;
    while w < s.batch * s.tables {
        let bag = ((w % s.tables) as u64 * per_table + (w / s.tables) as u64 * s.pooling as u64) as usize;
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
        w += warps;
    }
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
            let key = *keys.add(j as usize);
            let (table, id) = ((key >> 32) as usize, key as u32);
            let acc = gacc.add((table * s.shard_rows as usize + (id / world) as usize) * dim);
            let mut k = ptx::lane_id() as usize;
            while k < dim {
                atomic_add_f32(acc.add(k), *grads.add(j as usize * dim + k));
                k += 32;
            }
        }
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
            let key = *keys.add(j as usize);
            let (table, id) = ((key >> 32) as usize, key as u32);
            let off = (table * s.shard_rows as usize + (id / world) as usize) * dim;
            let mut k = ptx::lane_id() as usize;
            while k < dim {
                let bits = ptx::atom_exch_relaxed_gpu_u32((gacc.add(off) as *mut u32).add(k), 0);
                if bits != 0 {
                    let v = *tables.add(off + k);
                    *tables.add(off + k) = v - lr * f32::from_bits(bits);
                }
                k += 32;
            }
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

/// `p[..n] = 0` (u32 words).
#[kernel]
pub unsafe fn emb_zero_words(p: *mut u32, n: u64) {
    let mut i = ptx::global_thread_id_x() as u64;
    while i < n {
        // SAFETY: `p` holds `n` words.
        unsafe { *p.add(i as usize) = 0 };
        i += ptx::grid_stride_x() as u64;
    }
}
