use doorbell_kernels::pipeline;
use doorbell_kernels::pipeline::{BlockChunks, BlockCtl, RingSet};
use doorbell_kernels::transport::{P2p, Transport};

// The generated loop's names and labels are out of the body's reach.
pub unsafe fn producer(t: P2p, ring: RingSet, ctl: BlockCtl, chunks: BlockChunks, outbox: *mut f32) {
    let _ = pipeline!(unsafe send {
        transport: t, ring: ring, ctl: ctl, chunks: chunks,
        first_seq: 0, to: 1, outbox: outbox, elem: f32,
    } |_first, _len, _buf| {
        __db_j += 3;
        break 'produce;
    });
}

// The transport is a value (`*t` through a reference): the error points
// at the expression.
pub unsafe fn by_reference<T: Transport>(t: &T, ring: RingSet, ctl: BlockCtl, chunks: BlockChunks) {
    let _ = pipeline!(unsafe recv {
        transport: t, ring: ring, ctl: ctl, chunks: chunks,
        first_seq: 0, from: 1, elem: f32,
    } |_first, _len, _slot| {});
}

fn main() {}
