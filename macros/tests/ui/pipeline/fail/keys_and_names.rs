use doorbell_kernels::pipeline;
use doorbell_kernels::pipeline::{BlockChunks, BlockCtl, RingSet};
use doorbell_kernels::transport::P2p;

pub unsafe fn producer(t: P2p, ring: RingSet, ctl: BlockCtl, chunks: BlockChunks, outbox: *mut f32) {
    // No `unsafe`: the caller must vouch for the ring's addresses.
    let _ = pipeline!(send {
        transport: t, ring: ring, ctl: ctl, chunks: chunks,
        first_seq: 0, to: 1, outbox: outbox, elem: f32,
    } |first, len, buf| {});

    // A key given twice, an unknown one, a missing one (`ctl`).
    let _ = pipeline!(unsafe send {
        transport: t, ring: ring, ring: ring, chunks: chunks,
        first_seq: 0, to: 1, outbox: outbox, elem: f32, speed: 3,
    } |first, len, buf| {});

    // `recv` has no outbox and names its peer `from`.
    let _ = pipeline!(unsafe recv {
        transport: t, ring: ring, ctl: ctl, chunks: chunks,
        first_seq: 0, to: 1, outbox: outbox, elem: f32,
    } |first, len, slot| {});

    // Three plain names.
    let _ = pipeline!(unsafe send {
        transport: t, ring: ring, ctl: ctl, chunks: chunks,
        first_seq: 0, to: 1, outbox: outbox, elem: f32,
    } |first, (len, buf)| {});

    // Neither send nor recv.
    let _ = pipeline!(unsafe push {} |a, b, c| {});
}

fn main() {}
