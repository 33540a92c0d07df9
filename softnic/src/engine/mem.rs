//! Every memory access the engine makes to memory it does not own: rings,
//! doorbell records, the UAR word, registered memory. One function per kind
//! of access, so the GPU-resident engine swaps only this file.
//!
//! Each function goes through `doorbell_kernels::ptx` (inline PTX on
//! nvptx64, `core::sync::atomic` with the same semantics on the host), at
//! `sys` scope: the other side is a GPU kernel, a CPU thread or the
//! emulator, and the soft NIC plays a device that sees all of them. Those
//! that order the engine with the ranks — the acquire after a doorbell
//! record, the CQE's release, atomics, a signal word's release — take a
//! [`Scope`] instead: the GPU-resident engine narrows them to `gpu` when
//! every party is on its GPU.

use doorbell_kernels::ptx;

#[cfg(not(target_arch = "nvptx64"))]
std::thread_local! {
    /// Off the GPU: this thread (an engine's control thread) started a
    /// block copy that has not been drained yet.
    static COPY_IN_FLIGHT: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Notes whether the calling control thread has a block copy in flight
/// (the GPU-resident engine's deferred copies). Off the GPU every store
/// below that publishes (a CQE, an atomic, a release) then fails loudly:
/// it would let an observer see a completion before the payload, which
/// the CPU tests cannot otherwise catch reliably. A no-op on the GPU.
#[inline(always)]
pub fn copy_in_flight(on: bool) {
    #[cfg(not(target_arch = "nvptx64"))]
    COPY_IN_FLIGHT.with(|c| c.set(on));
    #[cfg(target_arch = "nvptx64")]
    let _ = on;
}

/// Off the GPU, where an engine block is OS threads that run when the OS
/// lets them: waits 2 ms before a block copies a chunk of another
/// block's shared copy that it claimed, so that an owner publishing before
/// that chunk landed is caught by the tests rather than by chance. A
/// no-op on the GPU.
#[inline(always)]
pub fn claimed_chunk_lands_late() {
    #[cfg(not(target_arch = "nvptx64"))]
    std::thread::sleep(std::time::Duration::from_millis(2));
}

/// Off the GPU: panics when the calling thread publishes `what` while its
/// block copy is in flight (an engine bug: a missing drain).
#[inline(always)]
fn settled(what: &str) {
    #[cfg(not(target_arch = "nvptx64"))]
    assert!(
        !COPY_IN_FLIGHT.with(|c| c.get()),
        "soft NIC engine: {what} published while a block copy was still in flight"
    );
    #[cfg(target_arch = "nvptx64")]
    let _ = what;
}

/// Reads a doorbell record word (the producer's BE32 counter) with acquire:
/// pairs with the producer's `st.release.sys` of the record
/// (`update_doorbell_record`), so the WQEs written before it are visible
/// to the segment loads that follow. Returns the counter in host order.
///
/// # Safety
/// `p` is valid and 4-byte aligned.
#[inline(always)]
pub unsafe fn load_dbrec(p: *const u32) -> u32 {
    // SAFETY: the caller's contract.
    u32::from_be(unsafe { ptx::ld_acquire_sys_u32(p) })
}

/// Reads the UAR doorbell word with acquire: pairs with the producer's
/// `fence.sc.sys` + doorbell store (`ring_doorbell`), so the doorbell
/// record read after it is at least as new as the doorbell.
///
/// # Safety
/// `p` is valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn load_uar(p: *const u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { ptx::ld_acquire_sys_u64(p) }
}

/// Reads a doorbell record word without ordering (`ld.relaxed.sys`):
/// the engine's idle polling. A relaxed load does not invalidate the
/// reader's L1 as an acquire does, so the engine's own tables stay cached
/// between doorbells; the caller follows a *changed* value with
/// [`acquire`] before it reads what the value publishes. Returns the
/// counter in host order.
///
/// # Safety
/// `p` is valid and 4-byte aligned.
#[inline(always)]
pub unsafe fn peek_dbrec(p: *const u32) -> u32 {
    // SAFETY: the caller's contract.
    u32::from_be(unsafe { ptx::ld_relaxed_sys_u32(p) })
}

/// Reads the UAR doorbell word without ordering (see [`peek_dbrec`]).
///
/// # Safety
/// `p` is valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn peek_uar(p: *const u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { ptx::ld_relaxed_sys_u64(p) }
}

/// The scope of the engine's ordering with the ranks — its acquire fences
/// ([`acquire`]), CQE releases ([`store_cqe`]), atomics and signal-word
/// releases: which threads they order the engine with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every party is on the engine's GPU: the producers ringing its
    /// doorbells, the consumers polling its CQs, the other ports' engines,
    /// and the memory of every port (thread ranks sharing one GPU). (On
    /// one H200 the saving over `sys` was within the spread between runs.)
    Gpu,
    /// Some party may be elsewhere: another GPU, a CPU thread, a NIC.
    Sys,
}

/// Turns the relaxed loads before it into acquires (`fence.acq_rel` at
/// `scope`: with a relaxed load that observed a release store it forms the
/// PTX acquire pattern), so the loads after it see what the producer wrote
/// before its release — the WQEs behind a new doorbell record.
#[inline(always)]
pub fn acquire(scope: Scope) {
    match scope {
        Scope::Gpu => ptx::fence_acq_rel_gpu(),
        Scope::Sys => ptx::fence_acq_rel_sys(),
    }
}

/// Reads one 16-byte WQE segment as its four memory words (weak: ordered
/// by the acquire of the doorbell record before it).
///
/// # Safety
/// `p` is valid for 16 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn load_seg(p: *const u8) -> [u32; 4] {
    // SAFETY: the caller's contract.
    unsafe { ptx::ld_v4_u32(p as *const u32) }
}

/// Writes one 16-byte segment (receive WQEs posted by host helpers).
///
/// # Safety
/// `p` is valid for 16 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn store_seg(p: *mut u8, w: [u32; 4]) {
    // SAFETY: the caller's contract.
    unsafe { ptx::st_v4_u32(p as *mut u32, w) }
}

/// Publishes a CQE: words 0..15 with weak stores, then word 15 (which holds
/// `op_own`) with `st.release` at `scope`. Pairs with the poller's
/// `ld.acquire.sys` of word 15 (`poll_cq`): once it sees the new owner bit,
/// the rest of the CQE and every data write the engine made before are
/// visible.
///
/// # Safety
/// `p` is valid for 64 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn store_cqe(p: *mut u8, w: &[u32; 16], scope: Scope) {
    settled("a CQE");
    let q = p as *mut u32;
    // SAFETY: the caller's contract.
    unsafe {
        ptx::st_v4_u32(q, [w[0], w[1], w[2], w[3]]);
        ptx::st_v4_u32(q.add(4), [w[4], w[5], w[6], w[7]]);
        ptx::st_v4_u32(q.add(8), [w[8], w[9], w[10], w[11]]);
        ptx::st_relaxed_sys_u32(q.add(12), w[12]);
        ptx::st_relaxed_sys_u32(q.add(13), w[13]);
        ptx::st_relaxed_sys_u32(q.add(14), w[14]);
        match scope {
            Scope::Gpu => ptx::st_release_gpu_u32(q.add(15), w[15]),
            Scope::Sys => ptx::st_release_sys_u32(q.add(15), w[15]),
        }
    }
}

/// Writes a doorbell-record word (BE32 of `v`) with release (host helpers
/// that post receives).
///
/// # Safety
/// `p` is valid and 4-byte aligned.
#[inline(always)]
pub unsafe fn store_dbrec(p: *mut u32, v: u32) {
    // SAFETY: the caller's contract.
    unsafe { ptx::st_release_sys_u32(p, v.to_be()) }
}

/// Moves payload bytes (a DMA): `len` bytes from `src` to `dst`; the ranges
/// may overlap (loopback into the same region).
///
/// # Safety
/// Both ranges are valid for `len` bytes.
#[inline(always)]
pub unsafe fn copy_bytes(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { core::ptr::copy(src, dst, len) }
}

/// Atomic fetch-and-add on a remote 8-byte word. Atomic with respect to
/// other NIC atomics and to CPU and GPU atomics on the same word at
/// `scope`; a release at `scope`, so the payload the engine moved before
/// (the WRITE ahead of it on the QP: `put_signal`) is visible to whoever
/// observes the new value.
///
/// # Safety
/// `p` is valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn atomic_fetch_add_u64(p: *mut u64, v: u64, scope: Scope) -> u64 {
    settled("an atomic");
    // SAFETY: the caller's contract.
    unsafe {
        match scope {
            Scope::Gpu => ptx::atom_add_release_gpu_u64(p, v),
            Scope::Sys => ptx::atom_add_release_sys_u64(p, v),
        }
    }
}

/// Adds one to a counter that engines of several ports (and GPUs) may bump
/// at once; returns the old value. Relaxed, at `sys` scope.
///
/// # Safety
/// `p` is valid and 4-byte aligned.
#[inline(always)]
pub unsafe fn claim_u32(p: *mut u32) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { ptx::atom_add_relaxed_sys_u32(p, 1) }
}

/// Atomic compare-and-swap on a remote 8-byte word; returns the old value.
/// Same scope and ordering as [`atomic_fetch_add_u64`].
///
/// # Safety
/// `p` is valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn atomic_cas_u64(p: *mut u64, compare: u64, swap: u64, scope: Scope) -> u64 {
    settled("an atomic");
    // SAFETY: the caller's contract.
    unsafe {
        match scope {
            Scope::Gpu => ptx::atom_cas_release_gpu_u64(p, compare, swap),
            Scope::Sys => ptx::atom_cas_release_sys_u64(p, compare, swap),
        }
    }
}

/// Reserves the port's transmitter ([`crate::engine::Port::tx_free_ps`])
/// for `wire_ps` from no earlier than `earliest_ps`: the WQE starts at the
/// later of `earliest_ps` and the transmitter's free time, the transmitter
/// is free again at `start + wire_ps`, and that end is returned. Every
/// engine block of the port reserves through this one word, so WQEs of
/// QPs on different blocks queue on one transmitter in the order their
/// reservations land, as those of one block queue in its order. Relaxed at
/// `gpu` scope: only the port's own engine blocks, all on one device, touch
/// the word, and nothing else is ordered by it.
///
/// # Safety
/// `p` is valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn reserve_wire(p: *mut u64, earliest_ps: u64, wire_ps: u64) -> u64 {
    // SAFETY (the loads and swaps): the caller's contract.
    let mut free = unsafe { ptx::ld_relaxed_gpu_u64(p) };
    loop {
        let end = earliest_ps.max(free).saturating_add(wire_ps);
        let seen = unsafe { ptx::atom_cas_relaxed_gpu_u64(p, free, end) };
        if seen == free {
            return end;
        }
        free = seen;
    }
}

/// Stores an 8-byte word with release at `scope`: a signal word written
/// after payload, ordered behind it without a fence (a fence would also
/// empty the control thread's L1).
///
/// # Safety
/// `p` is valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn store_release_u64(p: *mut u64, v: u64, scope: Scope) {
    settled("a release store");
    // SAFETY: the caller's contract.
    unsafe {
        match scope {
            Scope::Gpu => ptx::st_release_gpu_u64(p, v),
            Scope::Sys => ptx::st_release_sys_u64(p, v),
        }
    }
}

/// Reads a word another engine publishes (an inbox's head, a receiver's
/// inbox tail) without ordering (`ld.relaxed.sys`): a changed value is
/// followed by [`acquire`] before what it publishes is read.
///
/// # Safety
/// `p` is valid and 4-byte aligned.
#[inline(always)]
pub unsafe fn peek_word(p: *const u32) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { ptx::ld_relaxed_sys_u32(p) }
}

/// Publishes a word with release at `scope` (an inbox's head after its
/// events, a receiver's inbox tail after it read them).
///
/// # Safety
/// `p` is valid and 4-byte aligned.
#[inline(always)]
pub unsafe fn publish_word(p: *mut u32, v: u32, scope: Scope) {
    settled("a published word");
    // SAFETY: the caller's contract.
    unsafe {
        match scope {
            Scope::Gpu => ptx::st_release_gpu_u32(p, v),
            Scope::Sys => ptx::st_release_sys_u32(p, v),
        }
    }
}

/// Writes a 32-byte inbox event (two 16-byte stores; published by the
/// inbox head's [`publish_word`] after it).
///
/// # Safety
/// `p` is valid for 32 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn store_event(p: *mut [u32; 8], w: &[u32; 8]) {
    let q = p as *mut u32;
    // SAFETY: the caller's contract.
    unsafe {
        ptx::st_v4_u32(q, [w[0], w[1], w[2], w[3]]);
        ptx::st_v4_u32(q.add(4), [w[4], w[5], w[6], w[7]]);
    }
}

/// Reads a 32-byte inbox event (weak: ordered by the [`acquire`] after the
/// head that published it).
///
/// # Safety
/// `p` is valid for 32 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn load_event(p: *const [u32; 8]) -> [u32; 8] {
    let q = p as *const u32;
    // SAFETY: the caller's contract.
    let (a, b) = unsafe { (ptx::ld_v4_u32(q), ptx::ld_v4_u32(q.add(4))) };
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}
