//! Tier 2: memory-ordering helpers as documented publish/observe pairs, and
//! **the** bounded spin every wait of the device crate uses.
//!
//! | publisher (one thread)                 | observer (one thread)                        | scope |
//! |----------------------------------------|----------------------------------------------|-------|
//! | [`publish_gpu`] after writing the data | [`wait_ge_gpu`] before reading it            | gpu: blocks of one GPU |
//! | [`publish_sys`]                        | [`wait_ge_sys`]                              | sys: peers, host, NIC  |
//!
//! Every spin — these pairs, the transports' `wait_until`/`barrier`, the
//! mlx5 send queue's turn-taking and the CQ poll — runs through [`Spin`]: a
//! deadline from `%globaltimer`, a poll cadence (the clock is read every
//! [`CLOCK_EVERY`] polls, since reading it costs about as much as a poll),
//! and one back-off policy (tight polling first for latency, then
//! `nanosleep` doubling up to [`MAX_BACKOFF_NS`] to spare the memory system).
//! When the budget runs out the wait returns [`Timeout`] with the value it
//! last saw, so the caller can report which rank, which operation, expected
//! and seen — never hang.

use crate::ptx;

/// A bounded wait ran out of budget: the one name for "budget exhausted".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeout {
    /// The value the waited word held when the wait gave up.
    pub seen: u64,
}

/// Default spin budget: 10 s.
pub const DEFAULT_BUDGET_NS: u64 = 10_000_000_000;
/// Polls between two reads of `%globaltimer` on the GPU.
pub const CLOCK_EVERY: u32 = 32;
/// Polls of tight spinning before the back-off starts (GPU).
pub const TIGHT_POLLS: u32 = 4096;
/// Longest back-off sleep, ns.
pub const MAX_BACKOFF_NS: u32 = 1024;

/// The bounded spin: create it when a wait starts, call [`Spin::again`]
/// after every unsuccessful poll.
///
/// ```
/// # use doorbell_kernels::sync::Spin;
/// let mut spin = Spin::new(1_000_000);
/// let mut polls = 0;
/// while polls < 10 {           // the condition being waited for
///     if !spin.again() { break } // budget exhausted: report and return
///     polls += 1;
/// }
/// ```
pub struct Spin {
    start: u64,
    budget_ns: u64,
    polls: u32,
    backoff: u32,
}

impl Spin {
    /// Starts a wait with `budget_ns` of `%globaltimer`. The clock is first
    /// read at the first cadence point, not here: a wait that succeeds
    /// within [`CLOCK_EVERY`] polls — the latency-critical case — never
    /// reads it (the deadline is then at most that many polls late).
    #[inline(always)]
    pub fn new(budget_ns: u64) -> Spin {
        Spin {
            start: 0,
            budget_ns,
            polls: 0,
            backoff: 32,
        }
    }

    /// After an unsuccessful poll: `true` to poll again, `false` once the
    /// budget is exhausted. Sleeps per the back-off policy.
    #[inline(always)]
    pub fn again(&mut self) -> bool {
        self.polls = self.polls.wrapping_add(1);
        // On the emulator every poll yields: its "threads" share few CPUs.
        let gpu = cfg!(target_arch = "nvptx64");
        if gpu && !self.polls.is_multiple_of(CLOCK_EVERY) {
            return true;
        }
        let now = ptx::globaltimer_ns();
        if self.start == 0 {
            self.start = now;
        } else if now.wrapping_sub(self.start) > self.budget_ns {
            return false;
        }
        if !gpu || self.polls > TIGHT_POLLS {
            ptx::nanosleep(self.backoff);
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF_NS);
        }
        true
    }

    /// Progress was made: the budget starts again (a queue that moves is
    /// not stuck, however long it takes in total).
    #[inline(always)]
    pub fn restart(&mut self) {
        self.start = 0;
        self.polls = 0;
        self.backoff = 32;
    }
}

/// Polls `load` until `done(value)` holds, within `budget_ns`.
#[inline(always)]
pub fn spin_until(budget_ns: u64, mut load: impl FnMut() -> u64, done: impl Fn(u64) -> bool) -> Result<u64, Timeout> {
    let mut spin = Spin::new(budget_ns);
    loop {
        let v = load();
        if done(v) {
            return Ok(v);
        }
        if !spin.again() {
            return Err(Timeout { seen: v });
        }
    }
}

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
    spin_until(
        budget_ns,
        || unsafe { ptx::ld_acquire_gpu_u32(flag) } as u64,
        |v| v >= target as u64,
    )
    .map(|v| v as u32)
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
    spin_until(
        budget_ns,
        || unsafe { ptx::ld_acquire_sys_u32(flag) } as u64,
        |v| v >= target as u64,
    )
    .map(|v| v as u32)
}
