//! Your own fused kernels, as short as they get: a producer that sends
//! each chunk to the next rank the moment it is computed (`pipeline!`'s
//! `pipe` form over [`Pipe::run`]),
//! and an all-gather that computes this rank's part and puts it, with its
//! signal, into every rank ([`Put`] on [`Sym`] buffers). The host side is
//! `examples/09_fused.rs`.

use doorbell_kernels::pipeline::Pipe;
use doorbell_kernels::transport::{Cmp, Coop, Ibgda, P2p, Put, Signal, Sym, Transport};
use doorbell_kernels::{kernel, pipeline, ptx};

/// Element `i` of rank `rank`'s data in step `step` (what the kernels
/// compute; the host checks against it).
#[inline(always)]
pub fn value(rank: u32, i: u64, step: u64) -> f32 {
    ((rank as u64 * 1009 + i * 7 + step * 13) % 251) as f32 - 125.0
}

/// Computes this rank's `elems` values chunk by chunk and sends each chunk
/// to the next rank as soon as it is computed; the previous rank's values
/// land in `out`. Grid: `Rings::blocks()`.
#[kernel(transports(P2p, Ibgda))]
pub unsafe fn produce_send<T: Transport>(t: T, pipe: Pipe<f32>, out: *mut f32, elems: u64, step: u64) {
    let (me, n) = (t.rank(), t.world_size());
    let (tid, nthr) = (ptx::thread_rank_in_block() as u64, ptx::block_dim_x() as usize);
    // `unsafe pipe`: `pipe` is `Communicator::rings`'s, `out` holds `elems`.
    let done = pipeline!(unsafe pipe { transport: t, pipe: pipe, elems: elems, to: (me + 1) % n, from: (me + n - 1) % n }
    send |first, len, buf| {
        for i in (tid..len).step_by(nthr) {
            *buf.add(i as usize) = value(me, first + i, step);
        }
    }
    recv |first, len, slot| {
        for i in (tid..len).step_by(nthr) {
            *out.add((first + i) as usize) = *slot.add(i as usize);
        }
    });
    let _ = done; // a failure is recorded for the host
}

/// All-gather in one block: computes this rank's part of `data` (world
/// parts of equal length), puts it into every rank with `ready[me] = step`
/// as its signal, and waits until every rank's part of this step is here.
#[kernel(transports(P2p, Ibgda))]
pub unsafe fn all_gather<T: Transport>(t: T, data: Sym<f32>, ready: Sym<u64>, step: u64) {
    let (me, n) = (t.rank(), t.world_size());
    let (tid, nthr) = (ptx::thread_rank_in_block() as u64, ptx::block_dim_x() as u64);
    let part = data.len() / n as u64;
    let mine = data.part(me as u64 * part, part);
    for i in (tid..part).step_by(nthr as usize) {
        // SAFETY: inside this rank's part.
        unsafe { *mine.as_ptr().add(i as usize) = value(me, i, step) };
    }
    ptx::sync_threads();
    for peer in 0..n {
        let put = Put::dst(mine).src(mine).signal(Signal::set(ready.word(me as u64), step));
        // SAFETY: every thread of the block makes the same call.
        if unsafe { t.put(Coop::Block, peer, put) }.is_err() {
            return; // recorded for the host
        }
    }
    if tid == 0 {
        // SAFETY: one thread waits.
        let _ = unsafe { t.wait_until_all(ready.all(), Cmp::Ge, step) };
    }
}
