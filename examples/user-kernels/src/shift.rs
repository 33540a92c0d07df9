//! A producer → consumer pipeline written with `pipeline!`: every rank
//! computes its vector chunk by chunk and sends each chunk to the next rank
//! the moment it is computed; the next rank writes each chunk into its
//! output as it arrives. Credits keep a fast producer from overwriting a
//! slot its consumer still reads, whatever the ring's depth.
//!
//! The grid is `2 * pairs` blocks: block `p < pairs` produces its share of
//! the chunks into ring set `p` of the next rank; block `pairs + p`
//! consumes ring set `p` of this rank (from the previous rank's block `p`).
//! Each pair has a ring set and each block a control word of its own. Every
//! block of every rank must be resident at once. The launch counter is a
//! kernel argument here, so a launch must not be replayed from a CUDA graph
//! as is (its sequence numbers would repeat); the all-reduce counts its
//! launches in device memory for that.

use doorbell_kernels::pipeline::{BlockChunks, BlockCtl, RingSet};
use doorbell_kernels::transport::{Ibgda, P2p, Transport};
use doorbell_kernels::{kernel, pipeline, ptx};

/// Element `i` of rank `r`'s vector in launch `launch`: what the producer
/// computes (and the reference the host checks against).
#[inline(always)]
pub fn shift_value(r: u32, i: u64, launch: u64) -> f32 {
    let h = (r as u64 * 131 + i * 31 + launch * 7) % 17;
    h as f32 - 8.0 + (i % 3) as f32 * 0.25
}

/// One launch of the shift: this rank's vector of `elems` elements (chunks
/// of `chunk`) goes to rank `me + 1`; the previous rank's lands in `out`.
/// `rings`: `pairs` ring sets laid out as `RingSet::nth` says (one per
/// producer/consumer pair of blocks), `ctl`: one control word per block, `outbox`: `pairs * chunk` elements, all
/// symmetric. `launch` counts from 0; sequence numbers go on from launch
/// to launch.
#[kernel(transports(P2p, Ibgda))]
pub unsafe fn pipeline_shift<T: Transport>(
    t: T,
    rings: RingSet,
    ctl: *mut u32,
    outbox: *mut f32,
    out: *mut f32,
    elems: u64,
    chunk: u64,
    launch: u64,
) {
    let (me, world) = (t.rank(), t.world_size());
    let (b, grid) = (ptx::block_idx_x() as u64, ptx::grid_dim_x() as u64);
    // A producer and a consumer block per pair: an even grid of at least 2.
    if grid < 2 || grid % 2 != 0 {
        ptx::trap();
    }
    let pairs = grid / 2;
    let (tid, nthr) = (ptx::thread_rank_in_block() as u64, ptx::block_dim_x() as u64);
    let p = b % pairs;
    let chunks = BlockChunks {
        elems,
        chunk,
        block: p,
        blocks: pairs,
    };
    let ring = rings.nth(p);
    // SAFETY: one control word per block (the launcher's contract).
    let ctl = BlockCtl(unsafe { ctl.add(b as usize) });
    let first_seq = launch * chunks.count();
    let done = if b < pairs {
        // SAFETY: `pairs * chunk` elements of outbox.
        let outbox = unsafe { outbox.add((p * chunk) as usize) };
        pipeline!(unsafe send {
            transport: t, ring: ring, ctl: ctl, chunks: chunks,
            first_seq: first_seq, to: (me + 1) % world, outbox: outbox, elem: f32,
        } |first, len, buf| {
            let mut i = tid;
            while i < len {
                // SAFETY: the outbox holds a chunk; i < len <= chunk.
                unsafe { *buf.add(i as usize) = shift_value(me, first + i, launch) };
                i += nthr;
            }
        })
    } else {
        pipeline!(unsafe recv {
            transport: t, ring: ring, ctl: ctl, chunks: chunks,
            first_seq: first_seq, from: (me + world - 1) % world, elem: f32,
        } |first, len, slot| {
            let mut i = tid;
            while i < len {
                // SAFETY: `out` holds `elems` elements; first + i < elems.
                unsafe { *out.add((first + i) as usize) = *slot.add(i as usize) };
                i += nthr;
            }
        })
    };
    // A failed call was recorded by the transport for the host.
    let _ = done;
}
