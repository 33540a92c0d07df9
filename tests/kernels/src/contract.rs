//! Kernels that test the transport contract: argument checks, data
//! visible when its signal is seen, multi-word waits — and `Shadow`, a
//! second transport, so every body here is instantiated for two.

use doorbell_kernels::heap::{Checked, HeapBounds};
use doorbell_kernels::transport::{Cmp, CommError, Coop, Ibgda, P2p, Proxy, RawSignal, RawWait, RawXfer, Routed, Sym, Transport};
use doorbell_kernels::{kernel, ptx};

/// A test transport: P2P underneath, plus a count of the data-moving calls
/// in a device word — a distinct type, so `#[kernel(transports(P2p,
/// Shadow))]` bodies are proven to instantiate and run for two transports.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Shadow {
    /// The transport doing the work.
    pub inner: P2p,
    /// A device word: +1 per data-moving call (by the call's leader).
    pub calls: *mut u64,
}

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] plain data (P2p and a pointer), 8-byte aligned.
unsafe impl doorbell_kernels::KernelParam for Shadow {}

impl Shadow {
    #[inline(always)]
    fn count(&self, g: Coop) {
        if g.is_leader() {
            // SAFETY: `calls` is a device word owned by this rank's test.
            unsafe { ptx::atom_add_relaxed_gpu_u64(self.calls, 1) };
        }
    }
}

impl Checked for Shadow {
    fn bounds(&self) -> HeapBounds {
        self.inner.bounds()
    }
}

impl Transport for Shadow {
    fn rank(&self) -> u32 {
        self.inner.rank()
    }
    fn world_size(&self) -> u32 {
        self.inner.world_size()
    }
    fn peer_ptr<T>(&self, local: *const T, peer: u32) -> Option<*mut T> {
        self.inner.peer_ptr(local, peer)
    }
    unsafe fn put_raw(&self, g: Coop, peer: u32, x: RawXfer, signal: Option<RawSignal>) -> Result<(), CommError> {
        self.count(g);
        // SAFETY: the caller's contract.
        unsafe { self.inner.put_raw(g, peer, x, signal) }
    }
    unsafe fn get_raw(&self, g: Coop, peer: u32, x: RawXfer) -> Result<(), CommError> {
        self.count(g);
        // SAFETY: the caller's contract.
        unsafe { self.inner.get_raw(g, peer, x) }
    }
    unsafe fn signal_raw(&self, peer: u32, s: RawSignal) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.inner.signal_raw(peer, s) }
    }
    unsafe fn wait_word_raw(&self, word: *const u64, cmp: Cmp, value: u64) -> Result<u64, CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.inner.wait_word_raw(word, cmp, value) }
    }
    unsafe fn wait_some_raw(&self, w: RawWait, skip: u64) -> Result<u64, CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.inner.wait_some_raw(w, skip) }
    }
    fn fence(&self) {
        self.inner.fence()
    }
    unsafe fn quiet(&self, peer: Option<u32>) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.inner.quiet(peer) }
    }
    unsafe fn barrier(&self) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.inner.barrier() }
    }
}

/// The code a test reads back for a call's result: 0 = Ok, else the
/// `ErrorKind` number of the error.
#[inline(always)]
pub fn code(r: Result<(), CommError>) -> u32 {
    match r {
        Ok(()) => 0,
        Err(CommError::Timeout(_)) => 1,
        Err(CommError::Completion { .. }) => 2,
        Err(CommError::BadPeer { .. }) => 3,
        Err(CommError::OutOfRange { .. }) => 4,
        Err(CommError::Misaligned { .. }) => 5,
        Err(CommError::BadCount { .. }) => 6,
        Err(CommError::OutsideBuffer { .. }) => 8,
        Err(CommError::LengthMismatch { .. }) => 9,
    }
}

/// Every thread of a block with its call's [`code`] `c`: thread 0's goes to
/// `out[0]`, and each thread whose code differs adds 1 to `out[1]`.
///
/// # Safety
/// `out` holds two words; every thread of the block calls it.
#[inline(always)]
pub unsafe fn report_block_code(c: u32, out: *mut u32) {
    // SAFETY: the caller's promise.
    unsafe {
        if ptx::thread_rank_in_block() == 0 {
            *out = c;
        }
        ptx::sync_threads();
        if c != *out {
            ptx::atom_add_relaxed_gpu_u32(out.add(1), 1);
        }
    }
}

/// One bad call per launch, by every thread of one block on rank 0, to rank
/// 1 (`case`): 0 `put_block` to rank `world`; 1 `put_block` of `bytes` at
/// `dst` (the host makes it run past the heap end); 2 `signal` on a
/// misaligned word (`sig + 4 bytes`); 3 `put_signal_block` with a good range
/// and a misaligned signal (must write no data either); 4 `get_block` from
/// rank `world`; 5 `wait_until_some` over 65 words; 6 a good
/// `put_signal_block` (the control case); 7 `get_block` of 64 bytes from
/// rank 1's `dst` into this rank's heap header, which starts `bytes` before
/// `dst` (the host passes `dst`'s heap offset). `out[0]` = [`code`] of
/// thread 0's result, `out[1]` = how many threads got a different code.
#[kernel(transports(P2p, Shadow, Ibgda, Routed, Proxy))]
pub unsafe fn bad_call<T: Transport>(t: T, dst: *mut u8, src: *const u8, bytes: u64, sig: *mut u64, case: u32, out: *mut u32) {
    if t.rank() != 0 {
        return;
    }
    let bad_peer = t.world_size();
    let misaligned = (sig as u64 + 4) as *mut u64;
    let x = RawXfer {
        dst,
        src,
        bytes,
        nbi: false,
    };
    // SAFETY: the host passes symmetric `dst`, `sig` and a local `src` of `bytes`.
    let r = unsafe {
        match case {
            0 => t.put_raw(Coop::Block, bad_peer, x, None),
            1 => t.put_raw(Coop::Block, 1, x, None),
            2 => {
                if ptx::thread_rank_in_block() == 0 {
                    t.signal_raw(1, RawSignal::set(misaligned, 7))
                } else {
                    Err(CommError::Misaligned { offset: 0 })
                }
            }
            3 => t.put_raw(Coop::Block, 1, x, Some(RawSignal::set(misaligned, 7))),
            4 => t.get_raw(Coop::Block, bad_peer, x),
            7 => t.get_raw(
                Coop::Block,
                1,
                RawXfer {
                    dst: dst.sub(bytes as usize),
                    src: dst,
                    bytes: 64,
                    nbi: false,
                },
            ),
            5 => {
                if ptx::thread_rank_in_block() == 0 {
                    t.wait_some_raw(
                        RawWait {
                            words: sig,
                            count: 65,
                            cmp: Cmp::Ge,
                            value: 1,
                        },
                        0,
                    )
                    .map(|_| ())
                } else {
                    Err(CommError::BadCount { count: 65 })
                }
            }
            _ => t.put_raw(Coop::Block, 1, x, Some(RawSignal::set(sig, 7))),
        }
    };
    // SAFETY: `out` holds two words.
    unsafe { report_block_code(code(r), out) };
}

/// The word `w` of block `b`'s payload at iteration `i`: differs every
/// iteration, block and word.
#[inline(always)]
pub fn payload(i: u32, b: u32, w: u32) -> u32 {
    i.wrapping_mul(0x9e37_79b1) ^ (b << 20) ^ w.wrapping_mul(0x85eb_ca6b)
}

/// Data visible when its signal is seen. Rank 0's block `b`, `iters` times:
/// waits for rank 1's ack of the previous round, writes the round's payload
/// into its staging slice `src[b*words..]`, and `put_signal`s it to rank 1's
/// `data[b*words..]` with `sig[b] = i` (`mode` 0: block call; 1: warp 0 calls
/// the warp variant; 2: block `_nbi` call then `quiet`; 3: a blocking
/// block `put` without a signal, then thread 0's `signal`). Rank 1's block `b`
/// waits for `sig[b] == i`, checks every word, counts wrong words in
/// `wrong[b]`, and acks with `ack[b] = i` on rank 0. `status[b]`: 1 ok,
/// 2 timeout, 3 another error.
#[kernel(transports(P2p, Shadow, Ibgda, Routed, Proxy))]
pub unsafe fn flagged_rounds<T: Transport>(
    t: T,
    data: *mut u32,
    src: *mut u32,
    words: u32,
    sig: *mut u64,
    ack: *mut u64,
    iters: u32,
    mode: u32,
    wrong: *mut u32,
    status: *mut u32,
) {
    let me = t.rank();
    if me > 1 {
        return;
    }
    let b = ptx::block_idx_x();
    let tid = ptx::thread_rank_in_block();
    let nthreads = ptx::block_dim_x();
    let first = tid == 0;
    // SAFETY: per the contract above: symmetric `data`, `src`, `sig`, `ack`
    // sized for the grid; `wrong`/`status` one word per block.
    unsafe {
        let mine = data.add((b * words) as usize);
        let stage = src.add((b * words) as usize);
        let my_sig = sig.add(b as usize);
        let my_ack = ack.add(b as usize);
        let st = status.add(b as usize);
        if first {
            *st = 1;
        }
        ptx::sync_threads();
        let fail = |e: CommError| {
            *st = if matches!(e, CommError::Timeout(_)) { 2 } else { 3 };
        };
        for i in 1..=iters {
            if me == 0 {
                if first && i > 1 {
                    if let Err(e) = t.wait_word_raw(my_ack, Cmp::Eq, (i - 1) as u64) {
                        fail(e);
                    }
                }
                ptx::sync_threads();
                if ptx::ld_relaxed_cta_u32(st) != 1 {
                    return;
                }
                let mut w = tid;
                while w < words {
                    *stage.add(w as usize) = payload(i, b, w);
                    w += nthreads;
                }
                ptx::sync_threads();
                let bytes = words as u64 * 4;
                let x = RawXfer {
                    dst: mine as *mut u8,
                    src: stage as *const u8,
                    bytes,
                    nbi: mode == 2,
                };
                let sig = Some(RawSignal::set(my_sig, i as u64));
                let r = match mode {
                    1 if ptx::warp_id_in_block() == 0 => t.put_raw(Coop::Warp, 1, x, sig),
                    1 => Ok(()),
                    2 => {
                        let r = t.put_raw(Coop::Block, 1, x, sig);
                        if first {
                            r.and_then(|_| t.quiet(None))
                        } else {
                            r
                        }
                    }
                    3 => {
                        let r = t.put_raw(Coop::Block, 1, x, None);
                        match (r, sig) {
                            (Ok(()), Some(s)) if first => t.signal_raw(1, s),
                            (r, _) => r,
                        }
                    }
                    _ => t.put_raw(Coop::Block, 1, x, sig),
                };
                if let Err(e) = r {
                    fail(e);
                    return;
                }
            } else {
                if first {
                    if let Err(e) = t.wait_word_raw(my_sig, Cmp::Eq, i as u64) {
                        fail(e);
                    }
                }
                ptx::sync_threads();
                if ptx::ld_relaxed_cta_u32(st) != 1 {
                    return;
                }
                let mut bad = 0u32;
                let mut w = tid;
                while w < words {
                    if ptx::ld_relaxed_sys_u32(mine.add(w as usize)) != payload(i, b, w) {
                        bad += 1;
                    }
                    w += nthreads;
                }
                if bad != 0 {
                    ptx::atom_add_relaxed_gpu_u32(wrong.add(b as usize), bad);
                }
                ptx::sync_threads();
                if first {
                    // The block's reads are done (barrier); fenced, the ack
                    // lets the sender overwrite the slice.
                    t.fence();
                    if let Err(e) = t.signal_raw(0, RawSignal::set(my_ack, i as u64)) {
                        fail(e);
                    }
                }
            }
        }
    }
}

/// Multi-word waits. Rank 0's thread 0 sets rank 1's `sigs[k] = 1` for `k`
/// from `count - 1` down to 0, spinning `gap_ns` between two. Rank 1's
/// thread 0 collects them with `wait_until_some` (skipping those it has),
/// then confirms with `wait_until_all` and `wait_until_any`; `out[0]` = the
/// mask collected, `out[1]` = the calls it took, `out[2]` = [`code`] of
/// the first error (0 if none), `out[3]` = the index `wait_until_any` gave.
#[kernel(transports(P2p, Shadow, Ibgda, Routed, Proxy))]
pub unsafe fn collect_signals<T: Transport>(t: T, sigs: *mut u64, count: u32, gap_ns: u64, out: *mut u64) {
    if ptx::thread_rank_in_block() != 0 || ptx::block_idx_x() != 0 {
        return;
    }
    // SAFETY: symmetric `sigs` of `count` words; `out` four words.
    unsafe {
        if t.rank() == 0 {
            let mut k = count;
            while k > 0 {
                k -= 1;
                let t0 = ptx::globaltimer_ns();
                while ptx::globaltimer_ns().wrapping_sub(t0) < gap_ns {}
                if let Err(e) = t.signal_raw(1, RawSignal::set(sigs.add(k as usize), 1)) {
                    *out.add(2) = code(Err(e)) as u64;
                    return;
                }
            }
        } else if t.rank() == 1 {
            let all = if count >= 64 { u64::MAX } else { (1u64 << count) - 1 };
            let mut have = 0u64;
            let mut calls = 0u64;
            while have != all {
                match t.wait_some_raw(
                    RawWait {
                        words: sigs,
                        count,
                        cmp: Cmp::Ge,
                        value: 1,
                    },
                    have,
                ) {
                    Ok(m) => {
                        have |= m;
                        calls += 1;
                    }
                    Err(e) => {
                        *out.add(2) = code(Err(e)) as u64;
                        break;
                    }
                }
            }
            *out = have;
            *out.add(1) = calls;
            if *out.add(2) == 0 {
                let words = Sym::from_raw(sigs, count as u64).all();
                let r = t.wait_until_all(words, Cmp::Ge, 1);
                *out.add(2) = code(r) as u64;
                if let Ok(i) = t.wait_until_any(words, Cmp::Ge, 1) {
                    *out.add(3) = i as u64;
                }
            }
        }
    }
}

/// Transfers in a QP's order: rank 0's block makes the `n` transfers
/// `list[4k..4k + 4]` = (kind, destination offset, source offset, bytes)
/// one after the other without waiting for any — kind 0 a non-blocking
/// put from `local + src` to rank 1's `remote + dst`, kind 1 a
/// non-blocking get from rank 1's `remote + src` into `local + dst` —
/// then `quiet`s. `status[0]`: 1 ok, 2 timeout, 3 another error.
#[kernel(transports(P2p, Ibgda))]
pub unsafe fn transfers_in_order<T: Transport>(t: T, remote: *mut u8, local: *mut u8, list: *const u64, n: u32, status: *mut u32) {
    if t.rank() != 0 {
        return;
    }
    // SAFETY: per the contract above: `remote` and `local` symmetric and
    // large enough for every transfer of `list` (`4 * n` words).
    unsafe {
        let mut r = Ok(());
        for k in 0..n as usize {
            let [kind, dst, src, bytes] = [0, 1, 2, 3].map(|i| *list.add(4 * k + i));
            let x = |dst: *mut u8, src: *const u8| RawXfer {
                dst,
                src,
                bytes,
                nbi: true,
            };
            r = if kind == 0 {
                t.put_raw(Coop::Block, 1, x(remote.add(dst as usize), local.add(src as usize)), None)
            } else {
                t.get_raw(Coop::Block, 1, x(local.add(dst as usize), remote.add(src as usize)))
            };
            if r.is_err() {
                break;
            }
        }
        if ptx::thread_rank_in_block() == 0 {
            let r = r.and_then(|_| t.quiet(None));
            *status = match r {
                Ok(()) => 1,
                Err(CommError::Timeout(_)) => 2,
                Err(_) => 3,
            };
        }
    }
}
