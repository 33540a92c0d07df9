//! Kernel families for the one-call launch tests (`tests/tests/launch_family.rs`):
//! the same body exported for several transports, each writing values the
//! host can tell apart by rank, transport and salt.

use doorbell_kernels::kernel;
use doorbell_kernels::ptx;
use doorbell_kernels::transport::{Cmp, Ibgda, P2p, Proxy, RawSignal, Routed, Transport};

/// A number per transport type, so an entry's output says which
/// transport's entry ran.
pub trait Tag {
    /// The transport's number.
    const TAG: u64;
}

impl Tag for P2p {
    const TAG: u64 = 1;
}

impl Tag for Ibgda {
    const TAG: u64 = 2;
}

impl Tag for Routed {
    const TAG: u64 = 3;
}
impl Tag for Proxy {
    const TAG: u64 = 4;
}

/// What rank `rank` of `world` writes under transport `tag` with `salt`,
/// for element `i` (the host computes the same).
pub const fn stamp_value(tag: u64, rank: u32, world: u32, salt: u64, i: u64) -> u64 {
    (tag << 56) | ((rank as u64) << 48) | ((world as u64) << 40) | ((salt & 0xff_ffff) << 16) | (i & 0xffff)
}

/// `out[0]` gets the previous rank's stamp of element 0, sent through the
/// transport as a signal value; this failed with a transport error.
pub const STAMP_FAILED: u64 = u64::MAX;

/// One grid of `n` threads (any block shape): thread `i` writes
/// `stamp_value(T::TAG, rank, world, salt, i)` to `out[1 + i]`; thread 0
/// also sets the next rank's `sig` word to its element-0 stamp, waits for
/// its own `sig` to be set by the previous rank and writes what it got to
/// `out[0]` ([`STAMP_FAILED`] on a transport error). `out` holds `n + 1`
/// words; `sig` is one symmetric word, zero before the launch.
#[kernel(transports(P2p, Ibgda, Routed, Proxy))]
pub unsafe fn stamp<T: Transport + Tag>(t: T, out: *mut u64, n: u32, salt: u64, sig: *mut u64) {
    let i = ptx::global_thread_id_x();
    let (rank, world) = (t.rank(), t.world_size());
    if i < n {
        // SAFETY: `out` holds `n + 1` words.
        unsafe { *out.add(1 + i as usize) = stamp_value(T::TAG, rank, world, salt, i as u64) };
    }
    if i == 0 {
        let next = (rank + 1) % world;
        let mine = stamp_value(T::TAG, rank, world, salt, 0);
        // SAFETY: `sig` is a symmetric word only accessed atomically.
        let got = unsafe {
            t.signal_raw(next, RawSignal::set(sig, mine))
                .and_then(|()| t.wait_word_raw(sig, Cmp::Ne, 0))
        };
        // SAFETY: as above.
        unsafe { *out = got.unwrap_or(STAMP_FAILED) };
    }
}

/// [`stamp()`], exported for P2P and the routed transport only: launched with
/// an IBGDA handle chosen at run time, it is refused.
#[kernel(transports(P2p, Routed))]
pub unsafe fn stamp_pair<T: Transport + Tag>(t: T, out: *mut u64, n: u32, salt: u64, sig: *mut u64) {
    // SAFETY: the caller keeps `stamp`'s contract.
    unsafe { stamp(t, out, n, salt, sig) }
}
