//! Embedding exchange: a row-wise sharded embedding lookup fused with its
//! all-to-all, forward and backward (what DLRM / TorchRec users call the
//! sparse "input dist → lookup → output dist" pipeline), in one kernel per
//! rank and direction: the device side of `doorbell::coll::EmbeddingExchange`,
//! which sizes the buffers, fits the grid and launches these kernels.
//!
//! The entries ([`emb_forward()`], [`emb_backward()`], [`emb_forward_pull()`],
//! [`emb_zero_words()`]) are in the library's PTX (left out with
//! the `library-kernels` feature); their bodies ([`forward()`], [`backward()`],
//! [`forward_pull()`]) and the row helpers of [`rows`] stay public for
//! kernels of your own.
//!
//! ## Sharding and layouts
//! Every table has `rows` rows of `dim` f32. Row `j` lives on rank `j % N`
//! as local row `j / N` (each rank holds `shard_rows = ceil(rows / N)` rows
//! per table, `[table][local row][dim]`). A rank's lookups are
//! `ids[table][sample][pooling]` (u32); [`PAD`] (`0xFFFFFFFF`) is padding, so
//! bags of any length, empty ones included, fit the fixed layout. The pooled
//! output is `out[sample][table][dim]` (sum pooling).
//!
//! ## Forward ([`emb_forward()`]): validate and route → vote with the requests → gather → pool
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
//!    [`FwdArgs::sliced_bytes`] (default [`SLICED_LIST_BYTES`]) sends its lists in
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
//! embedding example prints it). Pooling stays at the requester: owners could pool
//! partial sums per (requester, sample, table) instead, but partial sums
//! cannot be shared between bags, so under skew the dedup wins, and the
//! summation order would depend on the sharding.
//!
//! [`emb_forward_pull()`] is the other design: where `peer_ptr` gives direct
//! access (same GPU, NVLink), a warp reads each row straight from the
//! owner's table and pools it, with no routing and no dedup (one barrier
//! across ranks first, so no owner is still updating its table). It needs
//! direct load/store access (it reports [`STATUS_NO_PEER_PTR`] otherwise)
//! and has no backward of its own; the benchmark measures both.
//!
//! ## Backward ([`emb_backward()`]), reusing the forward's routing
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
//! the grid from the entry's registers (`doorbell::coll::embedding::fit_grid`), never from
//! the SM count alone.

#[cfg(feature = "library-kernels")]
use crate::transport::{Ibgda, P2p, Proxy, Routed, Transport};
#[cfg(feature = "library-kernels")]
use crate::{kernel, ptx};

mod backward;
mod common;
mod forward;
pub mod rows;

pub use backward::backward;
pub use forward::{forward, forward_pull, SLICED_LIST_BYTES};

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

impl EmbShape {
    /// Bag `w` (`0..batch * tables`, sample-major): its sample, its table
    /// and the index of its first id in the `[table][sample][pooling]` ids.
    #[inline(always)]
    pub fn bag(&self, w: u32) -> (u32, u32, usize) {
        let (sample, table) = (w / self.tables, w % self.tables);
        let first = (table as u64 * self.batch as u64 + sample as u64) * self.pooling as u64;
        (sample, table, first as usize)
    }
}

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
unsafe impl crate::KernelParam for EmbShape {}
#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] raw pointers only, 8-byte aligned, as the PTX parameter.
unsafe impl crate::KernelParam for EmbBufs {}

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

/// The per-launch arguments of the push forward ([`emb_forward()`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FwdArgs {
    /// Local `[tables][batch][pooling]` lookup ids ([`PAD`]: padding).
    pub ids: *const u32,
    /// Local `[batch][tables][dim]` pooled output.
    pub out: *mut f32,
    /// This forward's epoch: 1, 2, 3, ... (one more per forward).
    pub epoch: u64,
    /// Budget of every wait and grid barrier, ns.
    pub budget_ns: u64,
    /// From how many bytes the longest request list goes out in slices
    /// from every block ([`SLICED_LIST_BYTES`] by default).
    pub sliced_bytes: u64,
}

/// The per-launch arguments of the backward ([`emb_backward()`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BwdArgs {
    /// Local `[batch][tables][dim]` upstream gradient.
    pub grad: *const f32,
    /// SGD step: `row -= lr * sum`.
    pub lr: f32,
    /// The epoch of the forward whose routing it reuses.
    pub epoch: u64,
    /// Backward launches so far, this one included (the same on every rank).
    pub seq: u64,
    /// Budget of every wait and grid barrier, ns.
    pub budget_ns: u64,
}

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] raw pointers and u64s, 8-byte aligned, as the PTX parameter.
unsafe impl crate::KernelParam for FwdArgs {}
#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] raw pointers, an f32 (padded) and u64s, 8-byte
// aligned, as the PTX parameter.
unsafe impl crate::KernelParam for BwdArgs {}

/// The push forward: [`forward()`] over the transport. Launch: the same
/// grid on every rank, threads a multiple of 32 (at most 256),
/// [`SHARED_BYTES`] of shared memory; epochs 1, 2, 3, ...
///
/// `launch_bounds(threads = 256, min_blocks = 3)` (on the backward and the
/// pull forward too): the grids ask for two blocks per SM, and every block
/// of every rank's grid must be resident at once (grid barriers). At 86
/// registers a thread an SM held exactly two blocks of 256, so ranks
/// sharing a GPU filled it to the last slot, with no room for any other
/// kernel; capped at 80 registers an SM holds three, one to spare. (A
/// stall seen on the H200 with the GPU filled so was in the end a host
/// copy waiting for the peers' kernels, not a block left out.)
#[cfg(feature = "library-kernels")]
#[kernel(transports(P2p, Ibgda, Routed, Proxy), launch_bounds(threads = 256, min_blocks = 3))]
pub unsafe fn emb_forward<T: Transport>(t: T, s: EmbShape, b: EmbBufs, a: FwdArgs) {
    // SAFETY: the host sized the buffers for `s` and this world (launch contract).
    unsafe { forward(&t, &s, &b, &a) }
}

/// The backward of the forward with the same epoch: [`backward()`] over
/// the transport. Launch as for [`emb_forward()`].
#[cfg(feature = "library-kernels")]
#[kernel(transports(P2p, Ibgda, Routed, Proxy), launch_bounds(threads = 256, min_blocks = 3))]
pub unsafe fn emb_backward<T: Transport>(t: T, s: EmbShape, b: EmbBufs, a: BwdArgs) {
    // SAFETY: as for emb_forward.
    unsafe { backward(&t, &s, &b, &a) }
}

/// The pull forward: [`forward_pull()`] over a transport with peer
/// pointers (none over IBGDA). Launch as for [`emb_forward()`].
#[cfg(feature = "library-kernels")]
#[kernel(transports(P2p, Routed), launch_bounds(threads = 256, min_blocks = 3))]
pub unsafe fn emb_forward_pull<T: Transport>(t: T, s: EmbShape, b: EmbBufs, ids: *const u32, out: *mut f32, budget_ns: u64) {
    // SAFETY: as for emb_forward.
    unsafe { forward_pull(&t, &s, &b, ids, out, budget_ns) }
}

/// `p[..n] = 0` (u32 words), grid-stride: the host clears the hash keys
/// when their tag wraps and the status words after an error, in stream order.
#[cfg(feature = "library-kernels")]
#[kernel]
pub unsafe fn emb_zero_words(p: *mut u32, n: u64) {
    let mut i = ptx::global_thread_id_x() as u64;
    while i < n {
        // SAFETY: `p` holds `n` words.
        unsafe { *p.add(i as usize) = 0 };
        i += ptx::grid_stride_x() as u64;
    }
}
