use doorbell_kernels::kernel;
use doorbell_kernels::transport::{P2p, Transport};

// The host joins the handle and the other arguments in this order: the
// transport handle comes first.
#[kernel(transports(P2p))]
pub unsafe fn handle_second<T: Transport>(out: *mut u32, t: T) {
    unsafe { *out = t.rank() };
}

// The handle is the generic type itself, not something built from it.
#[kernel(transports(P2p))]
pub unsafe fn handle_by_pointer<T: Transport>(t: *const T, out: *mut u32) {
    unsafe { *out = (*t).rank() };
}

// No parameter at all: no handle.
#[kernel(transports(P2p))]
pub unsafe fn no_handle<T: Transport>() {}

fn main() {
    let _ = core::mem::size_of::<P2p>();
}
