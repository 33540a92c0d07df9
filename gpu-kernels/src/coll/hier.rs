//! The **hierarchical** all-reduce, for ranks that form nodes of
//! `node_ranks` consecutive ranks (load/store inside a node, a NIC between
//! nodes: the routed transport over `DOORBELL_NODES`).
//!
//! Block `b` walks its chunks `j = 0, 1, ...` as the pipelined algorithm
//! does, but chunk `j` has an owner on **every** node: the rank of local
//! index `(j + b) % node_ranks`. At step `j` every rank produces chunk `j`
//! and puts it into its own node's owner's ring (load/store); the owners
//! sum their node's chunks, put the node's partial sum into every node's
//! owner of `j` (the NIC: each owner sends `nodes - 1` partials and
//! receives as many), sum those, and put the result into every rank of
//! their node (load/store); every rank receives chunk `j - lag` from its
//! node's owner into the output. So each chunk crosses the NIC once per
//! pair of nodes instead of once per pair of ranks.
//!
//! Three ring sets per block, each with a slot per source rank (`world`
//! peers, of which a set uses its group): `rs` (node peers → owner), `xs`
//! (owner → owners of the other nodes), `ag` (owner → node peers).
//! Between one pair of ranks, a ring's chunks are numbered by the owner's
//! local index as in the pipelined algorithm (`seq`), and carry over
//! launches the same way. Deadlock freedom follows the pipelined
//! argument: at step `j` every wait is for sends of steps `<= j`, each
//! issued before its sender waits at that step (an owner commits its
//! partial to every owner before it waits for theirs), and a ring's credit
//! for chunk `j` is the release of chunk `j - stages * node_ranks`, given at
//! step `j - stages * node_ranks + lag` at the latest.

/// The first step of the pipelined and hierarchical algorithms: produce
/// elements `first .. first + len` into `outbox`, then hand them off into
/// slot `s` of owner `o`'s ring of `rs` the moment they are produced. A
/// macro, not a function, so that both keep the code they were verified with.
macro_rules! produce_and_send {
    ($t:expr, $ctl:expr, $rs:expr, $produce:expr, $outbox:expr, ($first:expr, $len:expr), ($s:expr, $o:expr), $esz:expr) => {{
        $produce(Chunk {
            dst: $outbox,
            first: $first,
            len: $len,
            dtype: E::DTYPE,
        });
        ptx::sync_threads();
        // SAFETY: the ring sets lie in this launch's symmetric scratch.
        unsafe {
            $rs.acquire_block($t, $ctl, $s, $o)?;
            $rs.commit_block($t, $s, $o, $outbox, $len * $esz)?;
        }
    }};
}

use super::{lag, owned, AllReduceArgs};
use crate::coll::reduce::{copy_bytes, sum_into, Element, Sources};
use crate::pipeline::{BlockChunks, Failed, RingSet};
use crate::ptx;
use crate::transport::{wait_all_raw, Cmp, Coop, RawWait, Transport};

use super::Chunk;

/// Scratch bytes of one block: three ring sets and three boxes (the
/// produced chunk, the node's partial sum, the whole sum).
#[inline(always)]
pub(super) fn block_scratch(a: &AllReduceArgs) -> u64 {
    (3 * RingSet::slot_area(a.world, a.stages, 1) + 3) * a.slot_bytes()
}

/// Counter words of one block: `full` and `empty` of each ring set.
#[inline(always)]
pub(super) fn block_counter_words(a: &AllReduceArgs) -> u64 {
    6 * RingSet::counter_words(a.world, a.stages)
}

/// Whether the arguments describe nodes this kernel can walk.
#[inline(always)]
pub(super) fn valid(a: &AllReduceArgs) -> bool {
    let k = a.node_ranks;
    k >= 2 && k < a.world && a.world.is_multiple_of(k)
}

pub(super) unsafe fn hierarchical<T: Transport, E: Element, P: FnMut(Chunk)>(
    t: &T,
    a: &AllReduceArgs,
    mut produce: P,
) -> Result<(), Failed> {
    let (k, me, b) = (a.node_ranks as u64, t.rank() as u64, ptx::block_idx_x() as u64);
    let (nodes, node) = (a.world as u64 / k, me / k);
    let esz = E::DTYPE.size();
    let (tid, nthr) = Coop::Block.index_and_size();
    let ctl = a.ctl(b);
    let slot = a.slot_bytes();
    let area = a.scratch + b * block_scratch(a);
    let ring_bytes = RingSet::slot_area(a.world, a.stages, slot);
    let words = RingSet::counter_words(a.world, a.stages) * 8;
    let counters = a.sigs + a.blocks as u64 * 8 + b * block_counter_words(a) * 8;
    let ring = |n: u64| RingSet {
        slots: area + n * ring_bytes,
        slot_bytes: slot,
        peer_stride: a.stages as u64 * slot,
        full: counters + 2 * n * words,
        empty: counters + (2 * n + 1) * words,
        stages: a.stages,
        peers: a.world,
    };
    let (rs, xs, ag) = (ring(0), ring(1), ring(2));
    let outbox = (area + 3 * ring_bytes) as *mut u8;
    let partial = (area + 3 * ring_bytes + slot) as *mut u8;
    let whole = (area + 3 * ring_bytes + 2 * slot) as *mut u8;
    let chunks = BlockChunks {
        elems: a.elems,
        chunk: a.chunk_elems,
        block: b,
        blocks: a.blocks as u64,
    };
    let jn = chunks.count();
    let e0 = a.epoch - 1;
    // Chunk j's owner on node n, and its number in the rings of that owner.
    let local = |j: u64| (j + b) % k;
    let owner_on = |n: u64, j: u64| (n * k + local(j)) as u32;
    let seq = |j: u64| e0 * owned(jn, b, local(j), k) + j / k;
    let lag = lag(a.stages);
    for j in 0..jn + lag {
        if j < jn {
            let (first, len) = chunks.range(j);
            let (o, s) = (owner_on(node, j), seq(j));
            produce_and_send!(t, ctl, rs, produce, outbox, (first, len), (s, o), esz);
            if o as u64 == me {
                // SAFETY: as above; the slots hold `len` elements once full.
                unsafe {
                    // The node's chunks: slots of ranks node*k .. node*k+k.
                    let w = RawWait {
                        words: rs.full_word(s, (node * k) as u32),
                        count: k as u32,
                        cmp: Cmp::Ge,
                        value: s + 1,
                    };
                    ctl.lead(|| wait_all_raw(t, w))?;
                    let srcs = Sources {
                        base: rs.slot(s, (node * k) as u32) as u64,
                        stride: rs.peer_stride,
                        n: k as u32,
                    };
                    sum_into::<E>(partial, &srcs, 0, len, tid, nthr);
                    for q in node * k..node * k + k {
                        rs.release_block(t, ctl, s, q as u32)?;
                    }
                    // The node's partial to this chunk's owner on every node.
                    for n in 0..nodes {
                        xs.acquire_block(t, ctl, s, owner_on(n, j))?;
                        xs.commit_block(t, s, owner_on(n, j), partial, len * esz)?;
                    }
                    for n in 0..nodes {
                        xs.wait_block(t, ctl, s, owner_on(n, j))?;
                    }
                    let srcs = Sources {
                        base: xs.slot(s, owner_on(0, j)) as u64,
                        stride: k * xs.peer_stride,
                        n: nodes as u32,
                    };
                    sum_into::<E>(whole, &srcs, 0, len, tid, nthr);
                    for n in 0..nodes {
                        xs.release_block(t, ctl, s, owner_on(n, j))?;
                    }
                    // The sum to every rank of the node.
                    for q in node * k..node * k + k {
                        ag.acquire_block(t, ctl, s, q as u32)?;
                        ag.commit_block(t, s, q as u32, whole, len * esz)?;
                    }
                }
            }
        }
        if j >= lag {
            let jr = j - lag;
            let (first, len) = chunks.range(jr);
            let (o, s) = (owner_on(node, jr), seq(jr));
            // SAFETY: as above; output holds `elems` elements.
            unsafe {
                let src = ag.wait_block(t, ctl, s, o)?;
                copy_bytes((a.output + first * esz) as *mut u8, src, len * esz, tid, nthr);
                ag.release_block(t, ctl, s, o)?;
            }
        }
    }
    Ok(())
}
