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
//! ## Forward ([`emb_forward`]): validate and route → vote with the requests → gather → pool
//! 1. **Validate, dedup and route** (every block, grid-stride over the
//!    lookups; only this rank's scratch is written): an id `>= rows` (other
//!    than [`PAD`]) is recorded as this rank's error. Every other `(table,
//!    id)` is inserted into an open-addressing hash table (keys tagged with
//!    the epoch, so it needs no clearing between steps). The thread that
//!    inserts a key first takes the next index `u` of the owner's request
//!    list, writes the key there and marks its lookup as the key's first
//!    occurrence (the top bit of the lookup's slot). A warp takes its
//!    lanes' indices with one atomic add per owner (the lanes joining that
//!    owner's list counted with a ballot), not one per key: with two ranks
//!    every fresh key of the grid adds to one of two words, and same-word
//!    atomics serialize in L2. One grid barrier.
//! 2. **Vote with the requests**: block `g` sends its owners' lists
//!    (`owner % blocks == g`) into the owners' symmetric request buffers
//!    with `put_signal_block`. The signal word is the verdict: `epoch << 33
//!    | bad << 32 | count`. A rank in error (an id or capacity error of
//!    phase 1, or a block whose grid barrier ran out: never an error a
//!    sibling block recorded after its own vote) sends no list but its error
//!    report (the status words, 32 bytes) with the bad bit set, so every
//!    peer can say which rank failed, why, and which id. If the put is
//!    refused, the bare signal still goes out: a rank never leaves its peers
//!    waiting for its verdict. A good rank whose longest list reaches
//!    `sliced_bytes` (default [`SLICED_LIST_BYTES`]) sends its lists in
//!    slices from every block instead (`put_nbi_block`, `quiet`), one more
//!    grid barrier, then the verdicts as bare signals (bad if a slice was
//!    refused or the barrier ran out): one block alone moves a few GB/s.
//! 3. **Gather** (owner side): once every requester's verdict is in, either
//!    all of them are good — warps take the requested rows and copy them
//!    straight from the table into the requester's receive buffer through
//!    `peer_ptr` (several rows in flight per warp), or `put_warp` them
//!    where no direct access exists
//!    (`rows_in[owner][u]`), each block then adds 1 to the requester's
//!    per-owner signal (`rows_sig`) — or some rank is bad, and nothing is
//!    written (the blocks still add their 1). Every rank sees the same
//!    verdicts, so every rank takes the same way.
//! 4. **Pool** (requester side): once every owner's blocks have signalled
//!    — a failed step waits for that too, then returns: an owner block's 1
//!    comes after it read this epoch's verdicts, so no rank's next forward
//!    overwrites a verdict signal some block has yet to read —
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
//! It runs only if the forward of its epoch passed the vote (every rank
//! knows the same verdict); otherwise every rank returns with
//! [`STATUS_NO_FORWARD`] and nothing written. It reads the forward's
//! routing (hash slots, keys, list indices), not the ids again, so ids
//! changed on the device since the forward cannot send it out of bounds.
//! 1. **First occurrences** (requester): the lookup that inserted a key
//!    writes `0 + g` (its bag's upstream gradient) into the key's staging
//!    row, the forward's receive buffer `rows_in[owner][u]`, with plain
//!    stores: no zeroing pass, and with uniform ids, where most keys occur
//!    once, no atomics at all. One grid barrier.
//! 2. **Repeats** (requester): every other occurrence adds its gradient
//!    with an atomic float add (`red.add.f32`: done in L2, no retry loop,
//!    so a hot key under skew costs one add per occurrence). One grid
//!    barrier.
//! 3. **Send**: every warp of the grid puts contiguous pieces of the
//!    staging rows (up to [`PUT_PIECE_BYTES`]) into the owners' `grad_in`,
//!    in the order of the owner's request list (so no keys travel back);
//!    each block then fences and adds 1 to each owner's `grad_sig`. Rows
//!    for this rank itself stay where they are.
//! 4. **Accumulate and apply** (owner): once every requester's blocks have
//!    signalled (`seq * blocks`, `seq` the backward's launch count), the
//!    rows of every requester are added into a per-row accumulator
//!    (`gacc`, kept all-zero between steps), one grid barrier, then each
//!    element is taken with an atomic exchange against zero by exactly one
//!    thread, which applies SGD: `row -= lr * sum`.
//!
//! **Float-sum order**: a key's first occurrence starts its sum (`0 + g`,
//! as a sequential reference starting from zero); the other occurrences
//! (step 2) and the requesters' partial sums (step 4) are atomic adds, so
//! their order varies from run to run when a key occurs three times or more
//! per requester or comes from several requesters. When every partial sum
//! is exactly representable (integer-valued gradients whose sums stay below
//! 2^24, as in the example) the result is still bit-exact and
//! deterministic, otherwise it matches a sequential reference within f32
//! rounding. `row -= lr * sum` is one multiply and one subtract (no fused
//! multiply-add).
//!
//! ## Errors
//! Ids are validated on the device, in the first phase, before anything
//! moves: an id `>= rows` (other than [`PAD`]) or a list past its capacity
//! makes this rank's verdict bad. Every rank waits for every rank's verdict
//! (one exchange of signals, the same one that carries the requests), so
//! every rank learns of an error in the time of one message and ends the
//! step after one more (every owner block's `rows_sig`); **no rank writes
//! any output or table** ([`STATUS_*`](STATUS_OK) in the
//! `status` words say why; [`STATUS_PEER_ERROR`] with the failing rank's
//! own report on the ranks that only learnt of it), while the protocol
//! itself completes, so the next step can run. Waits are bounded by
//! `budget_ns`; they are only for peers that have not launched yet or have
//! died, never for a peer that found an error. A block whose own wait runs
//! out still adds its 1 to `rows_sig`, marked as given up: a peer that
//! launches later than the budget then learns of it in one message
//! ([`STATUS_PEER_TIMEOUT`], nothing pooled) instead of waiting out a
//! second budget, and the accumulated counts stay in step for the next
//! step.
//!
//! ## Phase stamps
//! With [`EmbBufs::stamps`] non-null, thread 0 of block 0 records
//! `%globaltimer` at the end of each phase ([`STAMP_FWD`], [`STAMP_BWD`]
//! name the slots), so a benchmark can say where a step's time goes.
//! Block 0's clock: a phase that ends in a grid barrier ends for every
//! block; one that does not (sending) is block 0's share only.
//!
//! ## Launch
//! Every rank launches the same grid (`blocks` × `threads`, threads a
//! multiple of 32) with [`SHARED_BYTES`] of dynamic shared memory; the grid
//! must be co-resident (grid barriers), and so must every rank's grid when
//! ranks share a GPU. Epochs start at 1 and go up by one per forward; a
//! backward uses the epoch of the forward before it, at most once.
//!
//! **Co-residency depends on the instantiation.** The `Ibgda` and `Routed`
//! entries carry the send queue's code (reservation, flow control, CQ
//! polling) and use ~150–190 registers a thread against P2P's ~80: an sm_90
//! SM holds one block of 256 threads of them, not two. A grid sized for two
//! per SM then starts only the blocks that fit; they wait at the first grid
//! barrier for blocks that start only once they leave, and when its budget
//! runs out they vote "bad" and return — the late blocks then pass the
//! barrier among themselves, see the bad verdicts, send no rows and add
//! their 1 to `rows_sig`, which stops at the number of late blocks. Size
//! the grid from the entry's registers (the host's `fit_grid`), never from
//! the SM count alone.

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
/// u32 words of one error report in [`EmbBufs::errs`] (status words 0..5, padded).
pub const ERR_WORDS: usize = 8;
/// Most lookups per rank: the slot of a lookup keeps its top bit for
/// "first occurrence", so the hash table (twice the lookups) stays below 2^31.
pub const MAX_LOOKUPS: u64 = 1 << 29;
/// Bytes a warp sends with one put in the backward (whole rows; at least one).
pub const PUT_PIECE_BYTES: u32 = 16384;

/// Status word 0: all went well.
pub const STATUS_OK: u32 = 0;
/// An id `>= rows` (words 1..5: table, sample, position, id).
pub const STATUS_BAD_ID: u32 = 1;
/// A request list outgrew its capacity (words 1..4: owner, count, capacity).
pub const STATUS_CAPACITY: u32 = 2;
/// Another rank reported an error; nothing was written (word 1: that rank;
/// words 2..7: its status words 0..5, as it reported them).
pub const STATUS_PEER_ERROR: u32 = 3;
/// A transport call failed (the communicator's report says which).
pub const STATUS_TRANSPORT: u32 = 4;
/// An owner received a key that is not its own (a routing bug).
pub const STATUS_BAD_REQUEST: u32 = 5;
/// `peer_ptr` gave no direct access (the pull forward needs it).
pub const STATUS_NO_PEER_PTR: u32 = 6;
/// A wait or grid barrier ran out of budget (word 1: where).
pub const STATUS_TIMEOUT: u32 = 7;
/// A backward whose forward did not pass the vote: nothing was written
/// (word 1: the last forward's verdict word, low 32 bits).
pub const STATUS_NO_FORWARD: u32 = 8;
/// A block of another rank gave up on this step (its own wait ran out of
/// budget, it reports the timeout) and counted without sending its rows:
/// nothing was pooled here (word 1: that rank).
pub const STATUS_PEER_TIMEOUT: u32 = 9;

/// Phase stamps of the forward, indices into [`EmbBufs::stamps`]: start,
/// routed (grid barrier), verdicts in, rows sent, rows in, pooled.
pub const STAMP_FWD: [&str; 6] = ["start", "route", "vote", "gather", "rows_in", "pool"];
/// Phase stamps of the backward, at `STAMP_BWD_AT + i`: start, first
/// occurrences (grid barrier), repeats (grid barrier), sent, grads in,
/// accumulated (grid barrier), applied.
pub const STAMP_BWD: [&str; 7] = ["start", "first", "repeat", "send", "grads_in", "accum", "apply"];
/// Where the backward's stamps start in [`EmbBufs::stamps`].
pub const STAMP_BWD_AT: usize = 8;
/// u64 words of [`EmbBufs::stamps`].
pub const STAMP_WORDS: usize = 16;

/// The top bit of a lookup's slot: the lookup that inserted the key.
const FIRST: u32 = 1 << 31;

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
    /// The hash table has `1 << hash_bits` slots (at least twice the lookups, at most 2^30).
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
    /// Symmetric `[N]`: `epoch << 33 | bad << 32 | count` from each requester (its verdict).
    pub req_sig: *mut u64,
    /// Symmetric `[N][cap][dim]`: rows received from each owner; the
    /// backward's gradient staging.
    pub rows_in: *mut f32,
    /// Symmetric `[2][N]`: `[o]` +1 per block of owner `o` per forward;
    /// `[N + o]` the last epoch in which a block of owner `o` gave up (a
    /// wait ran out of budget) and counted without sending its rows.
    pub rows_sig: *mut u64,
    /// Symmetric `[N][cap][dim]`: summed gradients from each requester.
    pub grad_in: *mut f32,
    /// Symmetric `[N]`: +1 per block of each requester per backward.
    pub grad_sig: *mut u64,
    /// Symmetric `[N][cap]`: this rank's request list for each owner.
    pub req_out: *mut u64,
    /// Symmetric `[N + 1][ERR_WORDS]` u32: the error report of each
    /// requester that was bad in the last forward; row `N`: this rank's own
    /// (the source of its puts).
    pub errs: *mut u32,
    /// Local `[1 << hash_bits]` keys: `tag << 40 | table << 32 | id`.
    pub keys: *mut u64,
    /// Local `[1 << hash_bits]`: a key's index in its owner's list.
    pub vals: *mut u32,
    /// Local `[tables][batch][pooling]`: each lookup's hash slot, top bit
    /// set on the key's first occurrence (PAD: none).
    pub slot_of: *mut u32,
    /// Local `[2][N]`: requests to each owner, by epoch parity.
    pub counts: *mut u32,
    /// Local `[2][N]`: requests from each requester, by epoch parity.
    pub rcounts: *mut u32,
    /// Local `[tables][shard_rows][dim]`: gradient sums (all zero between steps).
    pub gacc: *mut f32,
    /// Local `[2]`: grid barrier (arrivals, generation).
    pub grid: *mut u32,
    /// Local `[1]`: the last forward's verdict, `epoch << 1 | bad` (the
    /// backward runs only on `epoch << 1`).
    pub verdict: *mut u64,
    /// Local `[STATUS_WORDS]`: the first error (0: none).
    pub status: *mut u32,
    /// Local `[STAMP_WORDS]` or null: phase stamps (see the module docs).
    pub stamps: *mut u64,
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

/// Records the first error of this rank (first caller wins): `code` and
/// six detail words (scalars: an array would live on the stack); one thread.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
unsafe fn set_status_words(status: *mut u32, code: u32, a: u32, b: u32, c: u32, d: u32, e: u32, f: u32) {
    // SAFETY: `status` holds STATUS_WORDS words (launch contract).
    unsafe {
        if ptx::atom_cas_relaxed_gpu_u32(status, 0, code) == 0 {
            *status.add(1) = a;
            *status.add(2) = b;
            *status.add(3) = c;
            *status.add(4) = d;
            *status.add(5) = e;
            *status.add(6) = f;
        }
    }
}

/// [`set_status_words`] with four detail words.
#[inline(always)]
unsafe fn set_status(status: *mut u32, code: u32, a: u32, b: u32, c: u32, d: u32) {
    // SAFETY: the caller's status words.
    unsafe { set_status_words(status, code, a, b, c, d, 0, 0) }
}

#[inline(always)]
unsafe fn status_code(status: *const u32) -> u32 {
    // SAFETY: as for `set_status`.
    unsafe { ptx::ld_relaxed_gpu_u32(status) }
}

/// Thread 0 of block 0 records `%globaltimer` in stamp `i` (if stamps are on).
#[inline(always)]
unsafe fn stamp(stamps: *mut u64, i: usize) {
    if !stamps.is_null() && ptx::block_idx_x() == 0 && ptx::thread_rank_in_block() == 0 {
        // SAFETY: `stamps` holds STAMP_WORDS words (launch contract), i < STAMP_WORDS.
        unsafe { *stamps.add(i) = ptx::globaltimer_ns() };
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

/// Rows a lane has in flight at once when pooling or copying rows: each
/// row's load is issued before the first is used, so a warp waits for one
/// memory round trip per group of rows, not per row. (`pool_bag` writes
/// its four out by hand.)
const IN_FLIGHT: usize = 4;

/// What a bag's lookup contributes to its pooled row.
#[derive(Clone, Copy)]
enum Look {
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
unsafe fn pool_bag<const W: usize>(dim: usize, pooling: usize, dst: *mut f32, look: impl Fn(usize) -> Look) -> bool {
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
unsafe fn copy_rows(dim: usize, count: u32, dst: *mut f32, src: impl Fn(u32) -> Option<*const f32>) {
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
/// loaded at once (choose `W` with [`by_row_width`]).
#[inline(always)]
unsafe fn add_row<const W: usize>(acc: *mut f32, src: *const f32, dim: usize) {
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
/// the row alone. A lane has its `W` exchanges in flight at once (choose
/// `W` with [`by_row_width`]).
#[inline(always)]
unsafe fn apply_row<const W: usize>(acc: *mut f32, row: *mut f32, dim: usize, lr: f32) {
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

/// `$f::<4>(args)` when rows allow 16-byte accesses (`dim % 4 == 0`:
/// the buffers start 16-byte aligned and rows are whole), else
/// `$f::<1>(args)`: the row helpers' element width per lane.
macro_rules! by_row_width {
    ($dim:expr, $f:ident($($a:expr),* $(,)?)) => {
        if $dim % 4 == 0 {
            $f::<4>($($a),*)
        } else {
            $f::<1>($($a),*)
        }
    };
}

/// One grid-wide warp index and the number of warps of the grid.
#[inline(always)]
fn grid_warp() -> (u32, u32) {
    let wpb = ptx::block_dim_x() / 32;
    (ptx::block_idx_x() * wpb + ptx::warp_id_in_block(), ptx::grid_dim_x() * wpb)
}

/// The verdict signal of a requester: `epoch << 33 | bad << 32 | count`.
#[inline(always)]
fn verdict_sig(epoch: u64, bad: bool, count: u32) -> u64 {
    (epoch << 33) | ((bad as u64) << 32) | count as u64
}

/// Phase 2 for one owner, by a whole block: this rank's request list, or
/// (`bad`) its error report, into the owner's buffers, with the verdict as
/// the signal. If the put is refused, the bare signal still goes out, so
/// the owner is never left waiting; returns false then (the caller records
/// the refusal after the vote, so that every block of this rank has sent
/// the same verdict).
#[inline(always)]
unsafe fn send_verdict<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, epoch: u64, owner: u32, bad: bool, count: u32) -> bool {
    let n = t.world_size();
    let me = t.rank();
    let par = (epoch & 1) as usize;
    let cap = s.cap as usize;
    let sig = verdict_sig(epoch, bad, if bad { 0 } else { count });
    // SAFETY: buffers as EmbBufs documents (the caller's launch contract).
    unsafe {
        let (dst, src, bytes) = if bad {
            let row = ERR_WORDS;
            (
                b.errs.add(me as usize * row) as *mut u8,
                b.errs.add(n as usize * row) as *const u8,
                (ERR_WORDS * 4) as u64,
            )
        } else {
            (
                b.req_in.add((par * n as usize + me as usize) * cap) as *mut u8,
                b.req_out.add(owner as usize * cap) as *const u8,
                count as u64 * 8,
            )
        };
        let r = t.put_signal_block(dst, src, bytes, b.req_sig.add(me as usize), sig, SignalOp::Set, owner);
        if r.is_err() && ptx::thread_rank_in_block() == 0 {
            let _ = t.signal(b.req_sig.add(me as usize), verdict_sig(epoch, true, 0), SignalOp::Set, owner);
        }
        r.is_ok()
    }
}

/// Request lists at least this long (bytes; the longest of a rank's lists)
/// go out in slices from every block ([`send_list_slices`]) rather than
/// from one block each: the default of [`emb_forward`]'s `sliced_bytes`.
pub const SLICED_LIST_BYTES: u64 = 256 << 10;

/// Every block's share of every owner's request list (this rank's
/// `req_out[o]`, `counts[o]` keys, into the owner's `req_in` slot for this
/// rank): pieces of [`FLOOR_PIECE_BYTES`] dealt round-robin over the grid,
/// `put_nbi_block`, then `quiet` by thread 0. Returns, on thread 0, an
/// owner whose piece was refused or this rank when the quiet failed
/// (`u32::MAX`: none; other threads know only of refused puts). No
/// signal: the caller sends the verdicts once every block is done.
#[inline(always)]
unsafe fn send_list_slices<T: Transport>(t: &T, s: &EmbShape, b: &EmbBufs, counts: *const u32, epoch: u64) -> u32 {
    let n = t.world_size();
    let me = t.rank() as usize;
    let par = (epoch & 1) as usize;
    let cap = s.cap as usize;
    let blocks = ptx::grid_dim_x() as u64;
    let mut failed = u32::MAX;
    // SAFETY: counts <= cap (no capacity error on this path); buffers as
    // EmbBufs documents.
    unsafe {
        let mut first = 0u64; // pieces of the owners before `o`
        for o in 0..n {
            let bytes = ptx::ld_relaxed_gpu_u32(counts.add(o as usize)).min(s.cap) as u64 * 8;
            let pieces = bytes.div_ceil(FLOOR_PIECE_BYTES);
            let dst = b.req_in.add((par * n as usize + me) * cap) as *mut u8;
            let src = b.req_out.add(o as usize * cap) as *const u8;
            // This block's pieces of owner `o`: global indices blk, blk + blocks, ...
            let mut q = (ptx::block_idx_x() as u64 + blocks - first % blocks) % blocks;
            while q < pieces {
                let lo = q * FLOOR_PIECE_BYTES;
                let len = FLOOR_PIECE_BYTES.min(bytes - lo);
                if t.put_nbi_block(dst.add(lo as usize), src.add(lo as usize), len, o).is_err() {
                    failed = o;
                }
                q += blocks;
            }
            first += pieces;
        }
        // The block's puts, then one thread completes them (quiet is a
        // one-thread call); that thread's answer is the block's.
        ptx::sync_threads();
        if ptx::thread_rank_in_block() == 0 && t.quiet().is_err() {
            failed = me as u32;
        }
    }
    failed
}

/// A block of this rank that stops before its rows (its grid barrier or its
/// wait for the verdicts ran out of budget) still adds its 1 to every
/// requester's `rows_sig`, so the counts (`epoch * blocks`, accumulated over
/// launches) stay in step; before that it marks the epoch in their
/// `rows_sig[N + me]`, so that a requester whose wait completes with this
/// count knows the rows never came. Without it, a rank that is late by more
/// than the budget finds its peers gone and waits out a second budget for
/// adds that never come, and so does every later step of every rank.
/// Thread 0 of the block calls the transport; every thread may call it.
/// The fence orders the marks before the adds (it pairs with the acquire
/// of the requester's `rows_sig` wait, then [`gave_up_owner`]).
#[inline(always)]
unsafe fn give_up<T: Transport>(t: &T, b: &EmbBufs, epoch: u64) {
    let n = t.world_size();
    let me = t.rank();
    if ptx::thread_rank_in_block() == 0 {
        // SAFETY: `rows_sig` holds 2N words (launch contract). Refused
        // signals are the communicator's report already.
        unsafe {
            for r in 0..n {
                let _ = t.signal(b.rows_sig.add((n + me) as usize), epoch, SignalOp::Set, r);
            }
            t.fence();
            for r in 0..n {
                let _ = t.signal(b.rows_sig.add(me as usize), 1, SignalOp::Add, r);
            }
        }
    }
}

/// The lowest owner with a block that gave up in `epoch` (or later), else
/// `u32::MAX`. One thread, after its `rows_sig` wait (acquire) completed.
#[inline(always)]
unsafe fn gave_up_owner(b: &EmbBufs, n: u32, epoch: u64) -> u32 {
    for o in 0..n {
        // SAFETY: `rows_sig` holds 2N words (launch contract).
        if unsafe { ptx::ld_acquire_sys_u64(b.rows_sig.add((n + o) as usize)) } >= epoch {
            return o;
        }
    }
    u32::MAX
}

/// Forward: see the module docs. `ids` `[tables][batch][pooling]`, `out`
/// `[batch][tables][dim]` (local). `status` gets [`STATUS_OK`] or why not.
///
/// Launch: the same grid on every rank, threads a multiple of 32 (at most
/// 256), [`SHARED_BYTES`] of shared memory; epochs 1, 2, 3, ...
///
/// `launch_bounds(threads = 256, min_blocks = 3)` (on the backward and the
/// pull forward too): the grids ask for two blocks per SM, and every block
/// of every rank's grid must be resident at once (grid barriers). At 86
/// registers a thread an SM held exactly two blocks of 256, so ranks
/// sharing a GPU filled it to the last slot, with no room for any other
/// kernel; capped at 80 registers an SM holds three, one to spare. (A
/// stall seen on the H200 with the GPU filled so was in the end a host
/// copy waiting for the peers' kernels, not a block left out.)
#[kernel(transports(P2p, Ibgda, Routed), launch_bounds(threads = 256, min_blocks = 3))]
#[allow(clippy::too_many_arguments)]
pub unsafe fn emb_forward<T: Transport>(
    t: T,
    s: EmbShape,
    b: EmbBufs,
    ids: *const u32,
    out: *mut f32,
    epoch: u64,
    budget_ns: u64,
    sliced_bytes: u64,
) {
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
        stamp(b.stamps, 0);
        let counts = b.counts.add(par * n as usize);
        // The next epoch's counters start from zero. Here, not at the end:
        // a block that gives up returns early, and counters left from an
        // earlier epoch would shift every list index of the next one (the
        // backward would send those stale entries' staging rows too). The
        // other parity is the last forward's, whose backward ran before.
        if blk == 0 {
            let next = b.counts.add((1 - par) * n as usize);
            let mut o = tid;
            while o < n {
                *next.add(o as usize) = 0;
                o += ptx::block_dim_x();
            }
        }
        // 1. Validate, dedup and route (this rank's scratch only). A warp
        // takes 32 neighbouring lookups at a time, so its lanes loop
        // together and can share one counter add per owner (below).
        let lane = ptx::lane_id();
        let (gw, warps) = grid_warp();
        let mut base = gw as u64 * 32;
        while base < lookups {
            let i = base + lane as u64;
            // The owner whose list this lane's fresh key joins, if any.
            let mut joins = u32::MAX;
            let mut key_slot = 0u32;
            if i < lookups {
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
                    if fresh {
                        *slot_p = slot | FIRST;
                        joins = id % n;
                        key_slot = slot;
                    } else {
                        *slot_p = slot;
                    }
                }
            }
            // One atomic add per owner per warp, not per key: with few
            // ranks, every fresh key of the grid would otherwise add to the
            // same one or two counters, and same-word atomics serialize.
            let mut pending = ptx::vote_sync_ballot(ptx::FULL_MASK, joins != u32::MAX);
            while pending != 0 {
                let leader = pending.trailing_zeros();
                let owner = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, joins, leader);
                let group = ptx::vote_sync_ballot(ptx::FULL_MASK, joins == owner);
                let mut first = 0;
                if lane == leader {
                    first = ptx::atom_add_relaxed_gpu_u32(counts.add(owner as usize), group.count_ones());
                }
                let first = ptx::shfl_sync_idx_u32(ptx::FULL_MASK, first, leader);
                if joins == owner {
                    let u = first + (group & ((1u32 << lane) - 1)).count_ones();
                    *b.vals.add(key_slot as usize) = u;
                    if u < s.cap {
                        let id = *ids.add(i as usize);
                        *b.req_out.add(owner as usize * cap + u as usize) = request_key((i / per_table) as u32, id);
                    } else {
                        set_status(b.status, STATUS_CAPACITY, owner, u + 1, s.cap, 0);
                    }
                }
                pending &= !group;
            }
            base += warps as u64 * 32;
        }
        let routed = grid_sync_or_report(b.grid, b.status, budget_ns, 0);
        stamp(b.stamps, 1);

        // 2. Vote with the requests: every owner gets this rank's verdict,
        // even for an empty list, and even when this rank is in error or its
        // grid barrier ran out (then only this block's owners can be told).
        // One reading per block, shared: the block's threads send alike.
        // Only phase 1's codes are this rank's verdict: a sibling block
        // already past its vote may have recorded a peer's error (or a
        // later failure) by the time a slow block reads the word, and that
        // block must not pass it on as this rank's own.
        let mut my_err = !routed;
        if tid == 0 {
            let code = status_code(b.status);
            my_err |= code == STATUS_BAD_ID || code == STATUS_CAPACITY;
            if my_err {
                let own = b.errs.add(n as usize * ERR_WORDS);
                for w in 0..ERR_WORDS {
                    *own.add(w) = if w < 6 { ptx::ld_relaxed_gpu_u32(b.status.add(w)) } else { 0 };
                }
            }
        }
        let my_err = block_share(my_err as u32) != 0;
        let mut refused = u32::MAX;
        // Long lists go out in slices from every block, then one grid
        // barrier, then the verdicts as bare signals: one block alone moves
        // a few GB/s, and a list of a million keys would take milliseconds.
        // Every block reads the same counts (phase 1's barrier), so every
        // block takes the same way.
        let mut longest = 0u32;
        for o in 0..n {
            longest = longest.max(ptx::ld_relaxed_gpu_u32(counts.add(o as usize)));
        }
        let sliced = routed && !my_err && longest as u64 * 8 >= sliced_bytes && blocks > 1;
        let mut routed = routed;
        if sliced {
            let failed = send_list_slices(&t, &s, &b, counts, epoch);
            if failed != u32::MAX && tid == 0 {
                set_status(b.status, STATUS_TRANSPORT, failed, 5, 0, 0);
            }
            // Every slice in place (each block's quiet came before it).
            routed = grid_sync_or_report(b.grid, b.status, budget_ns, 9);
            // A refused slice anywhere makes this rank's verdict bad (the
            // status words say why; no report travels with a bare signal).
            let bad = !routed || block_share((tid == 0 && status_code(b.status) == STATUS_TRANSPORT) as u32) != 0;
            if tid == 0 {
                t.fence();
                let mut owner = blk;
                while owner < n {
                    let c = ptx::ld_relaxed_gpu_u32(counts.add(owner as usize));
                    let sig = verdict_sig(epoch, bad, if bad { 0 } else { c });
                    if t.signal(b.req_sig.add(me as usize), sig, SignalOp::Set, owner).is_err() {
                        refused = owner;
                    }
                    owner += blocks;
                }
            }
        } else {
            let mut owner = blk;
            while owner < n {
                let c = if my_err {
                    0
                } else {
                    ptx::ld_relaxed_gpu_u32(counts.add(owner as usize))
                };
                if !send_verdict(&t, &s, &b, epoch, owner, my_err, c) {
                    refused = owner;
                }
                owner += blocks;
            }
        }
        if !routed {
            give_up(&t, &b, epoch);
            return;
        }

        // 3. Every requester's verdict (the one wait of an error: one
        // message), then the rows, or nothing.
        let mut verdict = 0u32; // 0 fine, 1 some rank failed, 2 timed out
        if tid == 0 {
            let mut first_bad = u32::MAX;
            for r in 0..n {
                match t.wait_until(b.req_sig.add(r as usize), Cmp::Ge, epoch << 33) {
                    Ok(v) => {
                        if (v >> 32) & 1 != 0 || (v as u32) > s.cap {
                            verdict = verdict.max(1);
                            if first_bad == u32::MAX && r != me {
                                first_bad = r;
                            }
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
            if verdict == 1 && status_code(b.status) == STATUS_OK && first_bad != u32::MAX {
                // The lowest failing rank's report (its put came with its signal).
                let rep = b.errs.add(first_bad as usize * ERR_WORDS);
                let w = |k: usize| *rep.add(k);
                set_status_words(b.status, STATUS_PEER_ERROR, first_bad, w(0), w(1), w(2), w(3), w(4));
            }
            if blk == 0 && verdict != 2 {
                *b.verdict = (epoch << 1) | (verdict != 0) as u64;
            }
        }
        let verdict = block_share(verdict);
        if refused != u32::MAX && tid == 0 {
            set_status(b.status, STATUS_TRANSPORT, refused, 0, 0, 0);
        }
        stamp(b.stamps, 2);
        if verdict == 2 {
            if tid == 0 {
                set_status(b.status, STATUS_TIMEOUT, 1, 0, 0, 0);
            }
            give_up(&t, &b, epoch);
            return;
        }
        if verdict == 0 {
            for r in 0..n {
                // Stable for this kernel's life (the requester's next
                // request needs this rank's next rows first).
                let c = ptx::ld_relaxed_sys_u64(b.req_sig.add(r as usize)) as u32;
                let list = b.req_in.add((par * n as usize + r as usize) * cap);
                // The row of request `u`, or None (reported) for a key that
                // is not this rank's.
                let row = |u: u32| -> Option<*const f32> {
                    let key = *list.add(u as usize);
                    let table = (key >> 32) as u32;
                    let id = key as u32;
                    if table >= s.tables || id >= s.rows || id % n != me {
                        set_status(b.status, STATUS_BAD_REQUEST, r, table, id, 0);
                        return None;
                    }
                    Some(b.tables.add((table as usize * s.shard_rows as usize + (id / n) as usize) * dim) as *const f32)
                };
                let slot = b.rows_in.add(me as usize * cap * dim);
                // Where the requester's slot can be stored to directly, the
                // warps copy rows themselves, several in flight; otherwise
                // (a NIC between the two) one put per row.
                let direct = if dim % 4 == 0 { t.peer_ptr(slot, r) } else { None };
                if let Some(peer_slot) = direct {
                    copy_rows(dim, c, peer_slot, row);
                } else {
                    let mut u = gw;
                    while u < c {
                        if let Some(src) = row(u) {
                            let dst = slot.add(u as usize * dim);
                            if t.put_warp(dst as *mut u8, src as *const u8, dim as u64 * 4, r).is_err() && ptx::lane_id() == 0 {
                                set_status(b.status, STATUS_TRANSPORT, r, 1, 0, 0);
                            }
                        }
                        u += warps;
                    }
                }
            }
        }
        ptx::sync_threads();
        if tid == 0 {
            // The block's puts (its warps', ordered before this thread by the
            // barrier) are published by the signals once fenced. A bad step
            // adds too (nothing to publish), so the counts stay in step.
            t.fence();
            for r in 0..n {
                if t.signal(b.rows_sig.add(me as usize), 1, SignalOp::Add, r).is_err() {
                    set_status(b.status, STATUS_TRANSPORT, r, 2, 0, 0);
                }
            }
        }
        stamp(b.stamps, 3);

        // Every block of every owner has sent — and so has read every
        // verdict of this epoch. A failed step waits too: a rank that left
        // without it could launch its next forward and overwrite its verdict
        // signal on an owner whose slower block has not read it yet, which
        // would then vote on the next epoch's verdicts. One more message.
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
        // An owner block that gave up counted without sending its rows:
        // nobody pools, and the backward of this epoch is refused. Every
        // block of this rank reads the same marks (their sets came before
        // the adds it just waited for), so every block goes the same way.
        let mut gone = u32::MAX;
        if tid == 0 && verdict == 0 {
            gone = gave_up_owner(&b, n, epoch);
            if gone != u32::MAX {
                set_status(b.status, STATUS_PEER_TIMEOUT, gone, 0, 0, 0);
                *b.verdict = (epoch << 1) | 1;
            }
        }
        let gone = block_share(gone);
        stamp(b.stamps, 4);
        if verdict == 0 && gone == u32::MAX {
            // 4. Pool.
            let bags = s.batch * s.tables;
            let mut w = gw;
            while w < bags {
                let sample = w / s.tables;
                let table = w % s.tables;
                let bag = (table as u64 * per_table + sample as u64 * s.pooling as u64) as usize;
                by_row_width!(
                    dim,
                    pool_bag(dim, s.pooling as usize, out.add(w as usize * dim), |p| {
                        let id = *ids.add(bag + p);
                        if id == PAD {
                            return Look::Pad;
                        }
                        let slot = *b.slot_of.add(bag + p) & !FIRST;
                        let u = *b.vals.add(slot as usize) as usize;
                        Look::Row(b.rows_in.add(((id % n) as usize * cap + u) * dim))
                    })
                );
                w += warps;
            }
            stamp(b.stamps, 5);
        }
    }
}

/// Every lookup of this rank that `pick`s its slot word (top bit: first
/// occurrence), with its key's staging row and its bag's gradient row; one
/// warp per bag, grid-stride. The forward's routing only: no id is read.
#[inline(always)]
unsafe fn for_lookups(s: &EmbShape, b: &EmbBufs, n: u32, grad: *const f32, pick: impl Fn(u32) -> bool, f: impl Fn(*mut f32, *const f32)) {
    let (gw, warps) = grid_warp();
    let per_table = s.batch as u64 * s.pooling as u64;
    let (cap, dim) = (s.cap as usize, s.dim as usize);
    let bags = s.batch * s.tables;
    let mut w = gw;
    // SAFETY: buffers as EmbBufs documents (the caller's launch contract);
    // slots and list indices come from the forward, which passed its vote
    // (every index below the hash size and the capacity).
    unsafe {
        while w < bags {
            let bag = ((w % s.tables) as u64 * per_table + (w / s.tables) as u64 * s.pooling as u64) as usize;
            let g = grad.add(w as usize * dim);
            for p in 0..s.pooling as usize {
                let sl = *b.slot_of.add(bag + p);
                if sl == PAD || !pick(sl) {
                    continue;
                }
                let slot = (sl & !FIRST) as usize;
                let owner = (*b.keys.add(slot) as u32) % n;
                let u = *b.vals.add(slot) as usize;
                f(b.rows_in.add((owner as usize * cap + u) * dim), g);
            }
            w += warps;
        }
    }
}

/// Backward of the forward with the same `epoch`: see the module docs.
/// `grad` `[batch][tables][dim]` (local), SGD step `lr`, `seq` the number
/// of backward launches so far, this one included (the same on every
/// rank). Launch as for [`emb_forward`].
#[kernel(transports(P2p, Ibgda, Routed), launch_bounds(threads = 256, min_blocks = 3))]
#[allow(clippy::too_many_arguments)]
pub unsafe fn emb_backward<T: Transport>(t: T, s: EmbShape, b: EmbBufs, grad: *const f32, lr: f32, epoch: u64, seq: u64, budget_ns: u64) {
    let n = t.world_size();
    let me = t.rank();
    let par = (epoch & 1) as usize;
    let cap = s.cap as usize;
    let dim = s.dim as usize;
    let tid = ptx::thread_rank_in_block();
    let blocks = ptx::grid_dim_x();
    let lane = ptx::lane_id() as usize;
    let (gw, warps) = grid_warp();
    // SAFETY: as for emb_forward.
    unsafe {
        stamp(b.stamps, STAMP_BWD_AT);
        // Only after a forward that passed the vote: its verdict is the
        // same on every rank, so every rank goes the same way.
        let fwd = ptx::ld_relaxed_gpu_u64(b.verdict);
        if fwd != epoch << 1 {
            if tid == 0 {
                set_status(b.status, STATUS_NO_FORWARD, fwd as u32, 0, 0, 0);
                // No data; the adds keep the owners' counts in step.
                for o in 0..n {
                    if o != me {
                        let _ = t.signal(b.grad_sig.add(me as usize), 1, SignalOp::Add, o);
                    }
                }
            }
            return;
        }
        let counts = b.counts.add(par * n as usize);
        let rcounts = b.rcounts.add(par * n as usize);
        // 1. A key's first occurrence starts its staging row: 0 + g.
        for_lookups(
            &s,
            &b,
            n,
            grad,
            |sl| sl & FIRST != 0,
            |row, g| {
                let mut k = lane;
                while k < dim {
                    *row.add(k) = 0.0 + *g.add(k);
                    k += 32;
                }
            },
        );
        if !grid_sync_or_report(b.grid, b.status, budget_ns, 3) {
            return;
        }
        stamp(b.stamps, STAMP_BWD_AT + 1);
        // 2. The other occurrences add theirs.
        for_lookups(
            &s,
            &b,
            n,
            grad,
            |sl| sl & FIRST == 0,
            |row, g| {
                let mut k = lane;
                while k < dim {
                    ptx::red_add_relaxed_gpu_f32(row.add(k), *g.add(k));
                    k += 32;
                }
            },
        );
        if !grid_sync_or_report(b.grid, b.status, budget_ns, 4) {
            return;
        }
        stamp(b.stamps, STAMP_BWD_AT + 2);
        // 3. Send: every warp puts whole rows, PUT_PIECE_BYTES at a time,
        // in the owner's request-list order; this rank's own rows stay.
        let piece = (PUT_PIECE_BYTES as usize / (dim * 4)).max(1);
        let mut base = 0u32; // pieces of the owners before this one: spreads the owners over the warps
        for o in 0..n {
            if o == me {
                continue;
            }
            let c = ptx::ld_relaxed_gpu_u32(counts.add(o as usize)).min(s.cap) as usize;
            let pieces = c.div_ceil(piece) as u32;
            let mut q = (gw + warps - base % warps) % warps;
            while q < pieces {
                let u0 = q as usize * piece;
                let rows = piece.min(c - u0);
                let dst = b.grad_in.add((me as usize * cap + u0) * dim);
                let src = b.rows_in.add((o as usize * cap + u0) * dim);
                if t.put_warp(dst as *mut u8, src as *const u8, (rows * dim * 4) as u64, o).is_err() && lane == 0 {
                    set_status(b.status, STATUS_TRANSPORT, o, 3, 0, 0);
                }
                q += warps;
            }
            base = base.wrapping_add(pieces);
        }
        ptx::sync_threads();
        if tid == 0 {
            // As in the forward: the block's puts, then its signals.
            t.fence();
            for o in 0..n {
                if o != me && t.signal(b.grad_sig.add(me as usize), 1, SignalOp::Add, o).is_err() {
                    set_status(b.status, STATUS_TRANSPORT, o, 4, 0, 0);
                }
            }
        }
        stamp(b.stamps, STAMP_BWD_AT + 3);
        // 4. Owner: every requester's blocks have sent; accumulate.
        let mut waited = 0u32;
        if tid == 0 {
            for r in 0..n {
                if r != me && t.wait_until(b.grad_sig.add(r as usize), Cmp::Ge, seq * blocks as u64).is_err() {
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
        stamp(b.stamps, STAMP_BWD_AT + 4);
        for r in 0..n as usize {
            let c = ptx::ld_relaxed_gpu_u32(rcounts.add(r)).min(s.cap);
            let list = b.req_in.add((par * n as usize + r) * cap);
            let from = if r == me as usize { b.rows_in } else { b.grad_in };
            let mut u = gw;
            while u < c {
                let key = *list.add(u as usize);
                let (table, id) = ((key >> 32) as u32, key as u32);
                if table < s.tables && id < s.rows && id % n == me {
                    let acc = b.gacc.add((table as usize * s.shard_rows as usize + (id / n) as usize) * dim);
                    by_row_width!(dim, add_row(acc, from.add((r * cap + u as usize) * dim), dim));
                }
                u += warps;
            }
        }
        if !grid_sync_or_report(b.grid, b.status, budget_ns, 6) {
            return;
        }
        stamp(b.stamps, STAMP_BWD_AT + 5);
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
                    by_row_width!(dim, apply_row(b.gacc.add(off), b.tables.add(off), dim, lr));
                }
                u += warps;
            }
        }
        stamp(b.stamps, STAMP_BWD_AT + 6);
    }
}

/// Forward by direct loads from the owners' tables (`peer_ptr`), no
/// routing and no dedup: see the module docs. Same arguments as
/// [`emb_forward`] (only `tables`, `grid` and `status` of `b` are used).
/// Bad ids are skipped and reported; the bags holding them are not written.
#[kernel(transports(P2p, Routed), launch_bounds(threads = 256, min_blocks = 3))]
pub unsafe fn emb_forward_pull<T: Transport>(t: T, s: EmbShape, b: EmbBufs, ids: *const u32, out: *mut f32, budget_ns: u64) {
    let n = t.world_size();
    let dim = s.dim as usize;
    let per_table = s.batch as u64 * s.pooling as u64;
    let tid = ptx::thread_rank_in_block();
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
            by_row_width!(
                dim,
                pool_bag(dim, s.pooling as usize, out.add(w as usize * dim), |p| {
                    let id = *ids.add(bag + p);
                    if id == PAD {
                        return Look::Pad;
                    }
                    if id >= s.rows {
                        set_status(b.status, STATUS_BAD_ID, table, sample, p as u32, id);
                        return Look::Bad;
                    }
                    let local = b.tables.add((table as usize * s.shard_rows as usize + (id / n) as usize) * dim);
                    match t.peer_ptr(local as *const f32, id % n) {
                        Some(row) => Look::Row(row),
                        None => {
                            set_status(b.status, STATUS_NO_PEER_PTR, id % n, 0, 0, 0);
                            Look::Bad
                        }
                    }
                })
            );
            w += warps;
        }
    }
}

/// Bytes a block moves with one put in [`emb_put_floor`] (the piece size
/// `p2p_bench` measures its put floor with).
pub const FLOOR_PIECE_BYTES: u64 = 32768;

/// The copy floor a benchmark compares the exchange's bandwidth with: the
/// same kind of traffic with nothing else. Every rank puts the first
/// `bytes` of its shard (`bytes` a multiple of 16, at most the shard and
/// one `rows_in` slot, `cap * dim * 4`) into every peer's `rows_in[me]`,
/// in pieces of [`FLOOR_PIECE_BYTES`] dealt round-robin over (piece, peer)
/// to the grid's blocks, with `put_nbi_block`, then `quiet` (thread 0): when the
/// kernel ends its data has arrived. No routing, no signals, no pooling.
/// A refused put is reported as [`STATUS_TRANSPORT`].
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
            if t.put_nbi_block(dst, src, len, peer).is_err() {
                refused = peer;
            }
            p += ptx::grid_dim_x() as u64;
        }
        ptx::sync_threads();
        if ptx::thread_rank_in_block() == 0 && t.quiet().is_err() {
            refused = me;
        }
        if refused != u32::MAX {
            set_status(b.status, STATUS_TRANSPORT, refused, 3, 0, 0);
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
    let dim = s.dim as usize;
    let src = |j: u32| -> Option<*const f32> {
        // SAFETY: `keys` holds `count` keys of this rank's rows.
        let key = unsafe { *keys.add(j as usize) };
        let (table, id) = ((key >> 32) as usize, key as u32);
        Some(tables.wrapping_add((table * s.shard_rows as usize + (id / world) as usize) * dim))
    };
    // SAFETY: `rows` holds count × dim; rows whole, so 16-byte aligned for dim % 4 == 0.
    unsafe {
        if dim % 4 == 0 {
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
    let (gw, warps) = grid_warp();
    let dim = s.dim as usize;
    let per_table = s.batch as u64 * s.pooling as u64;
    let mut w = gw;
    while w < s.batch * s.tables {
        let bag = ((w % s.tables) as u64 * per_table + (w / s.tables) as u64 * s.pooling as u64) as usize;
        // SAFETY: sizes as documented.
        unsafe {
            by_row_width!(
                dim,
                pool_bag(dim, s.pooling as usize, out.add(w as usize * dim), |p| {
                    if *ids.add(bag + p) < s.rows {
                        Look::Row(rows.add(*pos.add(bag + p) as usize * dim))
                    } else {
                        Look::Pad
                    }
                })
            );
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
            by_row_width!(dim, add_row(acc, grads.add(j as usize * dim), dim));
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
            by_row_width!(dim, apply_row(gacc.add(off), tables.add(off), dim, lr));
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
