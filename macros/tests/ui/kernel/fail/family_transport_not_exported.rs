use doorbell_kernels::kernel;
use doorbell_kernels::transport::{Ibgda, P2p, Transport};
use doorbell_kernels::{AnyFamily, ForTransport};

#[kernel(transports(P2p))]
pub unsafe fn only_p2p<T: Transport>(t: T, out: *mut u32) {
    unsafe { *out = t.rank() };
}

// Other parameters that name the transport type: one entry per transport
// takes different arguments, so no handle chosen at run time can launch it.
#[kernel(transports(P2p, Ibgda))]
pub unsafe fn rest_names_the_transport<T: Transport>(t: T, peer: *const T) {
    let _ = (t, peer);
}

// What a launch with a concrete handle asks of the family.
fn launch_with<H, F: ForTransport<H>>(_handle: H) {}

// What a launch with a handle chosen at run time asks of the family.
fn launch_any<F: AnyFamily>() {}

fn ibgda() -> Ibgda {
    unimplemented!()
}

fn main() {
    launch_with::<Ibgda, only_p2p>(ibgda());
    launch_any::<rest_names_the_transport>();
}
