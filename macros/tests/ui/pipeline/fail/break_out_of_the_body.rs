use doorbell_kernels::pipeline;
use doorbell_kernels::pipeline::{BlockChunks, BlockCtl, RingSet};
use doorbell_kernels::transport::P2p;

// The body cannot skip the generated hand-off: `break` and `continue` do
// not reach the generated loop.
pub unsafe fn producer(t: P2p, ring: RingSet, ctl: BlockCtl, chunks: BlockChunks, outbox: *mut f32) {
    let _ = pipeline!(unsafe send {
        transport: t, ring: ring, ctl: ctl, chunks: chunks,
        first_seq: 0, to: 1, outbox: outbox, elem: f32,
    } |_first, len, _buf| {
        if len == 0 {
            continue;
        }
    });
    let _ = pipeline!(unsafe recv {
        transport: t, ring: ring, ctl: ctl, chunks: chunks,
        first_seq: 0, from: 1, elem: f32,
    } |_first, len, _slot| {
        if len == 0 {
            break;
        }
    });
}

fn main() {}
