//! Bulk copies through the SM's bulk-copy unit (Hopper's TMA): the engine
//! block's DMA.
//!
//! A block copy by the block's threads keeps as many bytes in flight as
//! its registers hold (224 copying threads × 16 vectors × 16 B = 56 KiB), which
//! bounds one engine block at what one SM's loads and stores move. The
//! bulk-copy unit moves whole ranges between global and shared memory with
//! no registers at all: one thread of the block (the last) streams the
//! 16-byte-aligned body of a copy through [`STAGES`] buffers of
//! [`STAGE_BYTES`] in the block's shared memory — a bulk load into a
//! stage (`cp.async.bulk` into shared memory, completing on the stage's
//! `mbarrier`), then, [`AHEAD`] stages later, a bulk store out of it
//! (`cp.async.bulk` to global memory, a bulk group of its own) — so up to
//! [`AHEAD`] loads and the stores behind them are in flight at once. The
//! block's other threads copy the unaligned head and tail bytes.
//!
//! Ordering: the issuing thread fences the async proxy against the
//! generic one (`fence.proxy.async.global`) before its first load (the
//! payload was published by generic stores, acquired by the control
//! thread before the round) and, after waiting for every store to
//! complete (`cp.async.bulk.wait_group 0`), once more before the round's
//! closing barrier: the control thread's next release or fence then
//! orders the stored bytes before what follows, as it does for the
//! threads' own stores.
//!
//! Off the GPU (the emulator) the same loop runs with each bulk operation
//! done at once as a byte copy through the same stages, so the split of a
//! copy into head, stages and tail is exercised by the CPU tests too; a
//! model of the waits fails where the GPU would hang (a wait for an
//! `mbarrier` phase that never completes) or send overwritten bytes (a
//! load into a stage a store may still be reading).

use super::super::mover::copy_part;

/// Bytes of one stage (one bulk load, one bulk store).
pub const STAGE_BYTES: usize = 16 << 10;
/// Stages in the block's shared memory.
pub const STAGES: usize = 6;
/// Loads issued ahead of the first store: a store leaves its stage this
/// many loads after that stage was loaded (up to `AHEAD + 1` loads are
/// outstanding just before each wait).
pub const AHEAD: usize = 4;
/// Stores still *reading* their stage that a load may leave pending
/// before it reuses the stage of the oldest (`cp.async.bulk.wait_group.read`);
/// stores whose writes are in flight do not hold a stage.
const READ_PENDING: usize = STAGES - 1 - AHEAD;
const _: () = assert!(AHEAD >= 1 && AHEAD < STAGES && STAGES <= 32);

/// Copies of at least this many bytes go through the bulk-copy unit (when
/// the engine's configuration asks for it and both ends share their
/// offset mod 16); shorter ones by the threads.
pub const BULK_MIN: usize = 64 << 10;

/// Where the `mbarrier`s start in the area, and the stages after them.
const STAGES_AT: usize = (STAGES * 8).next_multiple_of(128);
/// Shared memory the bulk copies need after the block's jobs: the
/// `mbarrier`s and the stages.
pub const BULK_BYTES: u32 = (STAGES_AT + STAGES * STAGE_BYTES) as u32;

/// The head (bytes before the first 16-byte-aligned destination byte) and
/// the body (a multiple of 16 bytes after it) of a copy the bulk-copy unit
/// makes; `None`: the threads make it all (too short, or the two ends do
/// not share their offset mod 16).
#[inline(always)]
pub fn split(dst: u64, src: u64, len: usize) -> Option<(usize, usize)> {
    if len < BULK_MIN || (dst ^ src) & 15 != 0 {
        return None;
    }
    let head = ((16 - (dst & 15)) & 15) as usize;
    Some((head, (len - head) & !15))
}

/// The issuing thread's view of the bulk-copy area: its stages and
/// `mbarrier`s, the stage the next load takes, and each stage's parity.
pub(super) struct Dma {
    /// The area (16-byte aligned, [`BULK_BYTES`]).
    area: *mut u8,
    /// The `mbarrier`s are initialized.
    ready: bool,
    /// The stage of the next load (and of the next wait: every load is
    /// waited for within the copy that issued it).
    next: usize,
    /// Bit `s`: the phase parity stage `s`'s next wait waits for.
    parity: u32,
}

impl Dma {
    /// The area at `area` (not touched until the first copy).
    pub(super) fn new(area: *mut u8) -> Dma {
        Dma {
            area,
            ready: false,
            next: 0,
            parity: 0,
        }
    }

    fn bar(&self, s: usize) -> *mut u64 {
        self.area.wrapping_add(8 * s).cast()
    }

    fn stage(&self, s: usize) -> *mut u8 {
        self.area.wrapping_add(STAGES_AT + s * STAGE_BYTES)
    }

    /// Copies `len` bytes (a multiple of 16) from `src` to `dst`, both
    /// 16-byte aligned, not overlapping; every byte has been stored and is
    /// ordered for the block's next barrier when it returns.
    ///
    /// # Safety
    /// Both ranges are valid; the area is this block's, used by this
    /// thread only.
    pub(super) unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        if len == 0 {
            return;
        }
        // SAFETY (whole function): the caller's contract; every stage and
        // `mbarrier` lies inside the area.
        unsafe {
            if !self.ready {
                for s in 0..STAGES {
                    bulk::init(self.bar(s));
                }
                bulk::init_done();
                self.ready = true;
            }
            bulk::fence_global();
            let n = len.div_ceil(STAGE_BYTES);
            let size = |i: usize| (len - i * STAGE_BYTES).min(STAGE_BYTES);
            let first = self.next;
            for i in 0..n + AHEAD {
                if i < n {
                    let s = (first + i) % STAGES;
                    if i >= STAGES {
                        // The store of chunk `i - STAGES` has read its stage.
                        bulk::wait_reads();
                    }
                    bulk::load(self.stage(s), src.add(i * STAGE_BYTES), size(i), self.bar(s));
                }
                if i >= AHEAD {
                    let j = i - AHEAD;
                    if j < n {
                        let s = (first + j) % STAGES;
                        bulk::wait_loaded(self.bar(s), self.parity >> s & 1);
                        self.parity ^= 1 << s;
                        bulk::store(dst.add(j * STAGE_BYTES), self.stage(s), size(j));
                    }
                }
            }
            self.next = (first + n) % STAGES;
            bulk::wait_stores();
            bulk::fence_global();
        }
    }
}

/// Which part of a block copy thread `part` of a block of `parts` threads
/// moves, and of how many parts: `None` for the threads that move none.
/// Thread 0 (the control thread) never copies. In a block of two warps or
/// more, neither does the rest of warp 0: every copying warp's 32 lanes
/// then move 32 consecutive 16-byte vectors from a 512-byte boundary,
/// whereas with thread 0 alone left out (255 parts) each warp's vectors
/// straddled cache lines; the threads' copies ran 1.27 - 1.46x as fast
/// with 8 engine blocks on 8 QPs on an H100
/// (`benchmarks/ibgda_h100_copy_modes.txt`).
#[inline(always)]
pub(super) fn copy_parts(part: usize, parts: usize) -> Option<(usize, usize)> {
    if parts >= 64 {
        (part >= 32).then(|| (part - 32, parts - 32))
    } else {
        (part >= 1).then(|| (part - 1, parts - 1))
    }
}

/// Part `part` of `parts` of a block copy of `len` bytes from `src` to
/// `dst` (not overlapping). With `bulk` set and a copy [`split`] accepts,
/// the last thread moves the body through the bulk-copy unit (`dma` is
/// its area; `None` for the other threads, and for the last one it makes
/// that thread copy the body itself) and the others the head and tail
/// bytes; otherwise every thread copies its part ([`copy_part`]).
///
/// # Safety
/// Both ranges are valid for `len` bytes and do not overlap; `part <
/// parts`; `dma` is `Some` for the last thread when `bulk` is set.
#[inline(always)]
pub(super) unsafe fn copy_job(dst: u64, src: u64, len: usize, bulk: bool, part: usize, parts: usize, dma: Option<&mut Dma>) {
    let (d, s) = (dst as usize as *mut u8, src as usize as *const u8);
    // SAFETY (whole function): the caller's contract; head, body and tail
    // partition the ranges.
    unsafe {
        match split(dst, src, len).filter(|_| bulk && parts > 1) {
            None => copy_part(d, s, len, part, parts),
            Some((head, body)) => {
                if part == parts - 1 {
                    match dma {
                        Some(dma) => dma.copy(d.add(head), s.add(head), body),
                        // No area: the body by this thread alone.
                        None => copy_part(d.add(head), s.add(head), body, 0, 1),
                    }
                } else {
                    let ends = head + (len - head - body);
                    let mut i = part;
                    while i < ends {
                        let o = if i < head { i } else { head + body + (i - head) };
                        core::ptr::write_volatile(d.add(o), core::ptr::read_volatile(s.add(o)));
                        i += parts - 1;
                    }
                }
            }
        }
    }
}

/// The bulk-copy unit's instructions on the GPU; elsewhere, the same steps
/// done at once by the calling thread.
mod bulk {
    #[cfg(target_arch = "nvptx64")]
    use core::arch::asm;

    /// The shared-space address of a generic pointer into shared memory.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn shared(p: *const u8) -> u32 {
        let r: u64;
        // SAFETY: an address conversion.
        unsafe { asm!("cvta.to.shared.u64 {0}, {1};", out(reg64) r, in(reg64) p as u64, options(nomem, nostack, pure)) };
        r as u32
    }

    /// The global-space address of a generic pointer into global memory.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn global(p: *const u8) -> u64 {
        let r: u64;
        // SAFETY: an address conversion.
        unsafe { asm!("cvta.to.global.u64 {0}, {1};", out(reg64) r, in(reg64) p as u64, options(nomem, nostack, pure)) };
        r
    }

    /// `mbarrier.init` with one arrival.
    ///
    /// # Safety
    /// `bar` is an 8-byte aligned word of this block's shared memory.
    #[inline(always)]
    pub(super) unsafe fn init(bar: *mut u64) {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: the caller's contract.
        unsafe {
            asm!("mbarrier.init.shared::cta.b64 [{0}], 1;", in(reg32) shared(bar.cast()), options(nostack))
        };
        // The model's `mbarrier`: the count of its completed phases.
        #[cfg(not(target_arch = "nvptx64"))]
        // SAFETY: the caller's contract.
        unsafe {
            bar.write(0)
        };
    }

    /// Makes the `mbarrier`s' initialization visible to the bulk-copy unit.
    #[inline(always)]
    pub(super) fn init_done() {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: fences.
        unsafe {
            asm!(
                "fence.mbarrier_init.release.cluster;",
                "fence.proxy.async.shared::cta;",
                options(nostack)
            )
        };
    }

    /// Orders this thread's view of global memory (generic accesses)
    /// with the bulk-copy unit's accesses (the async proxy), both ways.
    #[inline(always)]
    pub(super) fn fence_global() {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: a fence.
        unsafe {
            asm!("fence.proxy.async.global;", options(nostack))
        };
    }

    /// Loads `n` bytes (a multiple of 16) from `src` into the stage at
    /// `dst`, completing on `bar`'s current phase.
    ///
    /// # Safety
    /// `dst` and `bar` as for [`init`] (initialized), both 16-byte
    /// aligned ranges valid; no load on `bar`'s current phase yet.
    #[inline(always)]
    pub(super) unsafe fn load(dst: *mut u8, src: *const u8, n: usize, bar: *mut u64) {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: the caller's contract.
        unsafe {
            let b = shared(bar.cast());
            asm!(
                "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};",
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{b}];",
                b = in(reg32) b,
                n = in(reg32) n as u32,
                d = in(reg32) shared(dst),
                s = in(reg64) global(src),
                options(nostack)
            )
        };
        #[cfg(not(target_arch = "nvptx64"))]
        // SAFETY: the caller's contract.
        unsafe {
            model::loading(dst);
            core::ptr::copy_nonoverlapping(src, dst, n);
            // The load lands at once: its phase completes.
            bar.write(bar.read() + 1);
        };
    }

    /// Waits until `bar`'s phase of parity `parity` has completed (the
    /// stage's load landed).
    ///
    /// # Safety
    /// `bar` as for [`load`].
    #[inline(always)]
    pub(super) unsafe fn wait_loaded(bar: *mut u64, parity: u32) {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: the caller's contract.
        unsafe {
            let b = shared(bar.cast());
            loop {
                let done: u32;
                asm!(
                    "{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {q}; selp.u32 {o}, 1, 0, p; }}",
                    b = in(reg32) b,
                    q = in(reg32) parity,
                    o = out(reg32) done,
                    options(nostack)
                );
                if done != 0 {
                    break;
                }
            }
        }
        // On the GPU a wait for a phase that never completes hangs; the
        // model says so.
        #[cfg(not(target_arch = "nvptx64"))]
        // SAFETY: the caller's contract.
        unsafe {
            let done = bar.read();
            assert!(
                (done & 1) as u32 != parity,
                "a wait for parity {parity} on an mbarrier with {done} completed phases would never end"
            );
        }
    }

    /// Stores `n` bytes (a multiple of 16) of the stage at `src` to `dst`,
    /// as a bulk group of its own.
    ///
    /// # Safety
    /// `src` a loaded stage, `dst` valid; both 16-byte aligned.
    #[inline(always)]
    pub(super) unsafe fn store(dst: *mut u8, src: *const u8, n: usize) {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: the caller's contract.
        unsafe {
            asm!(
                "cp.async.bulk.global.shared::cta.bulk_group [{d}], [{s}], {n};",
                "cp.async.bulk.commit_group;",
                d = in(reg64) global(dst),
                s = in(reg32) shared(src),
                n = in(reg32) n as u32,
                options(nostack)
            )
        };
        #[cfg(not(target_arch = "nvptx64"))]
        // SAFETY: the caller's contract.
        unsafe {
            core::ptr::copy_nonoverlapping(src, dst, n);
            model::stored_from(src);
        };
    }

    /// Waits until all but the [`super::READ_PENDING`] newest stores have
    /// read their stages.
    #[inline(always)]
    pub(super) fn wait_reads() {
        #[cfg(not(target_arch = "nvptx64"))]
        model::reads_waited(super::READ_PENDING);
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: a wait.
        unsafe {
            asm!("cp.async.bulk.wait_group.read {n};", n = const super::READ_PENDING, options(nostack))
        };
    }

    /// Waits until every store has completed, its writes visible to this
    /// thread.
    #[inline(always)]
    pub(super) fn wait_stores() {
        #[cfg(not(target_arch = "nvptx64"))]
        model::reads_waited(0);
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: a wait.
        unsafe {
            asm!("cp.async.bulk.wait_group 0;", options(nostack))
        };
    }

    /// Off the GPU: which stages the issuing thread's stores may still be
    /// reading (every store reads at once here, but on the GPU it reads
    /// until a `wait_group.read` lets fewer than it be pending), so a load
    /// into such a stage — bytes a store would send that were overwritten
    /// first — fails loudly instead of passing.
    #[cfg(not(target_arch = "nvptx64"))]
    mod model {
        use super::super::STAGES;
        use std::cell::Cell;

        std::thread_local! {
            /// The stages of the stores not waited for, oldest first, and
            /// how many there are.
            static READING: Cell<([usize; STAGES + 1], usize)> = const { Cell::new(([0; STAGES + 1], 0)) };
        }

        /// A store out of the stage at `stage` was issued.
        pub(super) fn stored_from(stage: *const u8) {
            READING.with(|r| {
                let (mut v, n) = r.get();
                assert!(n <= STAGES, "more stores pending than stages");
                v[n] = stage as usize;
                r.set((v, n + 1));
            });
        }

        /// A wait left at most `keep` of the newest stores pending.
        pub(super) fn reads_waited(keep: usize) {
            READING.with(|r| {
                let (mut v, n) = r.get();
                if n > keep {
                    v.copy_within(n - keep..n, 0);
                    r.set((v, keep));
                }
            });
        }

        /// A load into the stage at `stage` is issued.
        pub(super) fn loading(stage: *const u8) {
            READING.with(|r| {
                let (v, n) = r.get();
                assert!(
                    !v[..n].contains(&(stage as usize)),
                    "a bulk load into a stage whose store may still be reading it"
                );
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_copying_warp_is_whole_and_the_parts_are_each_taken_once() {
        for threads in [32usize, 64, 96, 256, 512, 1024] {
            let got: Vec<Option<(usize, usize)>> = (0..threads).map(|t| copy_parts(t, threads)).collect();
            assert_eq!(got[0], None, "{threads} threads: the control thread copies");
            let mut mine: Vec<usize> = got.iter().flatten().map(|&(me, _)| me).collect();
            let of = got.iter().flatten().map(|&(_, of)| of).max().unwrap();
            assert!(got.iter().flatten().all(|&(_, n)| n == of), "{threads} threads: parts disagree");
            mine.sort_unstable();
            assert_eq!(
                mine,
                (0..of).collect::<Vec<usize>>(),
                "{threads} threads: a part taken twice or never"
            );
            assert_eq!(
                got[threads - 1].map(|(me, _)| me),
                Some(of - 1),
                "the last thread (the bulk copies') copies"
            );
            if threads >= 64 {
                // Warp 0 out, and part `me` on lane `me % 32`: each warp's
                // 32 vectors start on a 512-byte boundary.
                assert_eq!(of, threads - 32);
                for (t, p) in got.iter().enumerate() {
                    assert_eq!(p.is_some(), t >= 32, "{threads} threads, thread {t}");
                    if let Some((me, _)) = p {
                        assert_eq!(me % 32, t % 32, "{threads} threads, thread {t}");
                    }
                }
            } else {
                assert_eq!(of, threads - 1);
            }
        }
    }

    #[test]
    fn split_keeps_the_body_aligned_and_leaves_short_or_misaligned_copies_to_the_threads() {
        assert_eq!(split(0x1000, 0x2000, BULK_MIN - 1), None);
        assert_eq!(split(0x1001, 0x2002, 1 << 20), None);
        assert_eq!(split(0x1000, 0x2000, BULK_MIN), Some((0, BULK_MIN)));
        // Head to the next 16-byte boundary, the body a multiple of 16.
        assert_eq!(split(0x1003, 0x2003, BULK_MIN + 100), Some((13, (BULK_MIN + 100 - 13) & !15)));
    }

    /// A 16-byte-aligned buffer of at least `n` bytes, filled with `f(i)`.
    fn buffer(n: usize, f: impl Fn(usize) -> u8) -> Vec<u128> {
        let mut v = vec![0u128; n.div_ceil(16)];
        // SAFETY: the vector's own bytes.
        let b = unsafe { core::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 16) };
        for (i, x) in b.iter_mut().enumerate() {
            *x = f(i);
        }
        v
    }

    fn bytes(v: &[u128]) -> &[u8] {
        // SAFETY: the vector's own bytes.
        unsafe { core::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 16) }
    }

    /// Copies through the stages (each bulk operation done at once here)
    /// and through the head/tail split, for several alignments and for
    /// sizes around the stage and ring boundaries, one `Dma` throughout
    /// (its stages rotate from copy to copy); the bytes differ everywhere,
    /// and the bytes around the destination stay untouched.
    #[test]
    fn bulk_copies_move_every_byte_once_and_nothing_else() {
        let mut area = vec![0u128; BULK_BYTES as usize / 16];
        let mut dma = Dma::new(area.as_mut_ptr().cast());
        let big = 3 * BULK_MIN + 77;
        let src = buffer(big + 64, |i| (i * 7 + i / 251) as u8);
        let lens = [
            BULK_MIN,
            BULK_MIN + 1,
            BULK_MIN + STAGE_BYTES * AHEAD + 16,
            BULK_MIN + STAGE_BYTES * STAGES - 16,
            BULK_MIN + STAGE_BYTES * STAGES + 5,
            big,
        ];
        let mut bulk = 0;
        for &len in &lens {
            // Destination and source offsets: equal mod 16 (the bulk unit
            // takes the body) and not (the threads copy it all).
            for (od, os) in [(0usize, 0usize), (1, 17), (8, 24), (15, 31), (3, 4)] {
                let mut dst = buffer(big + 128, |_| 0xA5);
                let d = dst.as_mut_ptr().cast::<u8>().wrapping_add(32 + od);
                let s = src.as_ptr().cast::<u8>().wrapping_add(os);
                if split(d as u64, s as u64, len).is_some() {
                    bulk += 1;
                }
                let parts = 4;
                for part in 0..parts {
                    let mine = (part == parts - 1).then_some(&mut dma);
                    // SAFETY: both ranges inside their buffers, apart.
                    unsafe { copy_job(d as u64, s as u64, len, true, part, parts, mine) };
                }
                let out = bytes(&dst);
                assert_eq!(
                    &out[32 + od..32 + od + len],
                    &bytes(&src)[os..os + len],
                    "len {len} offsets {od}/{os}"
                );
                assert!(out[..32 + od].iter().all(|&b| b == 0xA5), "bytes before, len {len}");
                assert!(out[32 + od + len..].iter().all(|&b| b == 0xA5), "bytes after, len {len}");
            }
        }
        assert_eq!(bulk, 4 * lens.len(), "the aligned cases went through the stages");
    }
}
