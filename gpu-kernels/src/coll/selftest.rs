//! The start-up self-test of a route: every rank puts a small message,
//! different for each (sender, receiver, route, run), into every peer's
//! landing area with the transport's own typed calls, then waits (bounded)
//! for every peer's message. The host (`doorbell::comm::Communicator::self_test`)
//! prepares the area, launches [`selftest()`] per transport and checks what
//! landed against [`message`].
//!
//! ## The area (one per route, [`SelfTestArgs::area`], `u64` words)
//! | words | what |
//! |---|---|
//! | `[s * MSG_WORDS, (s + 1) * MSG_WORDS)` for `s < world` | the message rank `s` put here |
//! | `world * MSG_WORDS + s` | its signal: `seq` once rank `s`'s message is here |
//! | `world * (MSG_WORDS + 1) + d * MSG_WORDS ..` | this rank's outbox: the message for rank `d` (the puts' source) |
//! | `world * (2 * MSG_WORDS + 1) + d` | 1 when this rank tests its route to rank `d` (written by the host) |
//!
//! The host zeroes the area and sets the signal words of the ranks that
//! send nothing here (this rank, ranks the route does not reach) to `seq`
//! before the launch, so one bounded `wait_until_all` covers every sender.

use crate::transport::{Cmp, Coop, Put, Signal, Sym, Transport};
#[cfg(feature = "library-kernels")]
use crate::{
    kernel,
    transport::{Ibgda, P2p},
};

/// Words of one self-test message.
pub const MSG_WORDS: u64 = 4;

/// Route numbers mixed into the messages: load/store (P2P).
pub const ROUTE_P2P: u64 = 1;
/// Route numbers mixed into the messages: the NIC (IBGDA).
pub const ROUTE_IBGDA: u64 = 2;

/// `u64` words of one route's area in a world of `world` ranks.
pub const fn area_words(world: u64) -> u64 {
    world * (2 * MSG_WORDS + 2)
}

/// Word `i` of the message rank `src` sends to rank `dst` over `route` in
/// the run `nonce`: a SplitMix64 mix of all five, so messages of other
/// pairs, routes or runs differ in every word.
pub const fn message(nonce: u64, src: u64, dst: u64, route: u64, i: u64) -> u64 {
    let mut z = nonce
        ^ (src.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        ^ (dst.wrapping_mul(0xc2b2_ae3d_27d4_eb4f))
        ^ (route.wrapping_mul(0x1656_67b1_9e37_79f9))
        ^ (i.wrapping_mul(0xd6e8_feb8_6659_fd93));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The self-test's kernel argument.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SelfTestArgs {
    /// This route's area ([`area_words`] words, symmetric).
    pub area: Sym<u64>,
    /// The run's nonce (agreed by every rank; never 0): mixed into the
    /// messages, and the value of the signals.
    pub nonce: u64,
    /// The route's number ([`ROUTE_P2P`], [`ROUTE_IBGDA`]).
    pub route: u64,
}
const _: () = assert!(core::mem::size_of::<SelfTestArgs>() == 32);

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: plain `repr(C)` data: a device address, a length and two words.
unsafe impl crate::KernelParam for SelfTestArgs {}

/// The body: writes the outbox, puts each tested peer's message with a
/// signal, completes the puts, then waits for every sender's signal. One
/// thread.
///
/// # Safety
/// `a.area` is this route's area, prepared by the host on every rank
/// before any rank launches.
pub unsafe fn run<T: Transport>(t: &T, a: &SelfTestArgs) -> Result<(), crate::transport::CommError> {
    let (me, n) = (t.rank() as u64, t.world_size() as u64);
    let area = a.area;
    let sigs = n * MSG_WORDS;
    let outbox = sigs + n;
    let flags = outbox + n * MSG_WORDS;
    let mut first = Ok(());
    for k in 1..n {
        let d = (me + k) % n;
        // SAFETY: inside the area (the host sized it for this world).
        if unsafe { core::ptr::read_volatile(area.as_ptr().add((flags + d) as usize)) } == 0 {
            continue;
        }
        for i in 0..MSG_WORDS {
            // SAFETY: this rank's outbox, read only by the puts below.
            unsafe {
                core::ptr::write_volatile(
                    area.as_ptr().add((outbox + d * MSG_WORDS + i) as usize),
                    message(a.nonce, me, d, a.route, i),
                )
            };
        }
        let put = Put::dst(area.part(me * MSG_WORDS, MSG_WORDS))
            .src(area.part(outbox + d * MSG_WORDS, MSG_WORDS))
            .signal(Signal::set(area.word(sigs + me), a.nonce));
        // SAFETY: one thread; the signal word is accessed atomically by all.
        if let Err(e) = unsafe { t.put(Coop::Thread, d as u32, put) } {
            first = first.and(Err(e));
        }
    }
    // SAFETY: one thread, the only one of this rank using the queues.
    if let Err(e) = unsafe { t.quiet(None) } {
        first = first.and(Err(e));
    }
    // Every sender's signal; 64 words per wait.
    let mut s = 0;
    while s < n {
        let m = (n - s).min(64);
        // SAFETY: the area's signal words; one thread.
        if let Err(e) = unsafe { t.wait_until_all(area.part(sigs + s, m), Cmp::Eq, a.nonce) } {
            return first.and(Err(e));
        }
        s += m;
    }
    first
}

/// The library's self-test kernel: [`run`] over the transport, one block
/// of one thread per rank.
#[cfg(feature = "library-kernels")]
#[kernel(transports(P2p, Ibgda))]
pub unsafe fn selftest<T: Transport>(t: T, args: SelfTestArgs) {
    // SAFETY: the host prepared the area (launch contract).
    let _ = unsafe { run(&t, &args) };
}
