//! Tier 2: memory-ordering helpers as documented publish/observe pairs, and
//! bounded spins.
//!
//! | publisher (one thread)                 | observer (one thread)                        | scope |
//! |----------------------------------------|----------------------------------------------|-------|
//! | [`publish_gpu`] after writing the data | [`wait_ge_gpu`] before reading it            | gpu: blocks of one GPU |
//! | [`publish_sys`]                        | [`wait_ge_sys`]                              | sys: peers, host, NIC  |
//!
//! Every spin is bounded by a budget in nanoseconds of `%globaltimer`; on
//! expiry the wait returns [`Timeout`] with the value it last saw, so the
//! caller can report which rank, which operation, expected and seen — never
//! hang.

use crate::ptx;

/// A bounded wait ran out of budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeout {
    /// The value the flag held when the wait gave up.
    pub seen: u64,
}

/// Default spin budget: 10 s.
pub const DEFAULT_BUDGET_NS: u64 = 10_000_000_000;

/// Publishes `value` at `flag` with release semantics at GPU scope: every
/// write this thread made before (and, after a block barrier, its block's
/// writes) is visible to a thread of the same GPU that observes the value
/// with [`wait_ge_gpu`]. Called by one thread.
///
/// # Safety
/// `flag` is valid, 4-byte aligned, and only accessed atomically.
#[inline(always)]
pub unsafe fn publish_gpu(flag: *mut u32, value: u32) {
    // The fence makes the block's earlier writes (ordered before this thread
    // by `sync_threads`) part of what the release store publishes.
    ptx::fence_acq_rel_gpu();
    // SAFETY: caller's contract.
    unsafe { ptx::st_release_gpu_u32(flag, value) }
}

/// Spins until `*flag >= target` with acquire semantics at GPU scope; pairs
/// with [`publish_gpu`]. Called by one thread (then `sync_threads` to share
/// the observation with the block). Gives up after `budget_ns`.
///
/// # Safety
/// As for [`publish_gpu`].
#[inline(always)]
pub unsafe fn wait_ge_gpu(flag: *const u32, target: u32, budget_ns: u64) -> Result<u32, Timeout> {
    // SAFETY: caller's contract.
    spin_until_ge(|| unsafe { ptx::ld_acquire_gpu_u32(flag) }, target, budget_ns)
}

/// [`publish_gpu`] at system scope: visible to peer GPUs, the host and NICs.
///
/// # Safety
/// As for [`publish_gpu`].
#[inline(always)]
pub unsafe fn publish_sys(flag: *mut u32, value: u32) {
    ptx::fence_acq_rel_sys();
    // SAFETY: caller's contract.
    unsafe { ptx::st_release_sys_u32(flag, value) }
}

/// [`wait_ge_gpu`] at system scope; pairs with [`publish_sys`] (or a host /
/// NIC write followed by the appropriate flush).
///
/// # Safety
/// As for [`publish_gpu`].
#[inline(always)]
pub unsafe fn wait_ge_sys(flag: *const u32, target: u32, budget_ns: u64) -> Result<u32, Timeout> {
    // SAFETY: caller's contract.
    spin_until_ge(|| unsafe { ptx::ld_acquire_sys_u32(flag) }, target, budget_ns)
}

/// The bounded spin behind the waits: `load` until it returns `>= target`,
/// backing off with `nanosleep`, for at most `budget_ns`.
#[inline(always)]
fn spin_until_ge(load: impl Fn() -> u32, target: u32, budget_ns: u64) -> Result<u32, Timeout> {
    let start = ptx::globaltimer_ns();
    let mut backoff = 32u32;
    loop {
        let v = load();
        if v >= target {
            return Ok(v);
        }
        if ptx::globaltimer_ns().wrapping_sub(start) > budget_ns {
            return Err(Timeout { seen: v as u64 });
        }
        ptx::nanosleep(backoff);
        backoff = (backoff * 2).min(1024);
    }
}
