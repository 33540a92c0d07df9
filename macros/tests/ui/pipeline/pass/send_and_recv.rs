use doorbell_kernels::pipeline;
use doorbell_kernels::pipeline::{BlockChunks, BlockCtl, Failed, RingSet};
use doorbell_kernels::transport::{P2p, Transport};

// Both sides compile against any transport (a value: `*t` through a
// reference), and each is an expression of type Result<(), Failed>.
pub unsafe fn both<T: Transport>(t: &T, ring: RingSet, ctl: BlockCtl, chunks: BlockChunks, outbox: *mut u32, out: *mut u32) -> Result<(), Failed> {
    let sent: Result<(), Failed> = pipeline!(unsafe send {
        transport: *t, ring: ring, ctl: ctl, chunks: chunks,
        first_seq: 7, to: 1, outbox: outbox, elem: u32,
    } |mut first, len, buf| {
        // The names may be `mut`: the body's own copies.
        let end = first + len;
        let mut i = 0;
        while first < end {
            unsafe { *buf.add(i) = first as u32 };
            first += 1;
            i += 1;
        }
    });
    sent?;
    pipeline!(unsafe recv {
        transport: *t, ring: ring, ctl: ctl, chunks: chunks,
        first_seq: 7, from: 0, elem: u32,
    } |first, len, slot| {
        for i in 0..len {
            unsafe { *out.add((first + i) as usize) = *slot.add(i as usize) };
        }
    })
}

fn main() {
    let _ = both::<P2p>;
}
