use doorbell_kernels::pipeline;
use doorbell_kernels::pipeline::Pipe;
use doorbell_kernels::transport::P2p;

pub unsafe fn both_sides(t: P2p, pipe: Pipe<f32>) {
    // No `unsafe`: the caller must vouch for the pipe.
    let _ = pipeline!(pipe { transport: t, pipe: pipe, elems: 8, to: 1, from: 1 }
        send |first, len, buf| {} recv |first, len, slot| {});

    // A missing key (`from`).
    let _ = pipeline!(unsafe pipe { transport: t, pipe: pipe, elems: 8, to: 1 }
        send |first, len, buf| {} recv |first, len, slot| {});

    // The bodies in the wrong order.
    let _ = pipeline!(unsafe pipe { transport: t, pipe: pipe, elems: 8, to: 1, from: 1 }
        recv |first, len, slot| {} send |first, len, buf| {});

    // A body with two names.
    let _ = pipeline!(unsafe pipe { transport: t, pipe: pipe, elems: 8, to: 1, from: 1 }
        send |first, len| {} recv |first, len, slot| {});
}

fn main() {}
