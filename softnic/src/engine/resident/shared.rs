//! Large copies shared by a port's engine blocks.
//!
//! One block copies at what one SM moves (~26 GB/s on an H200 with its
//! threads, ~34 with the bulk-copy unit), whatever
//! the port's other blocks are doing. While some block of the port serves
//! no QP (more blocks than groups of QPs), a copy of at least [`SHARE_MIN`]
//! bytes is therefore posted on the copying block's own [`CopyBoard`] (in
//! its control block) and cut into chunks of [`SHARE_CHUNK`] bytes or more
//! (about one per block of the port, so each chunk's copy streams): the
//! owner and every other block of the port that looks claim chunks one at
//! a time and copy each with their whole block; the owner returns once
//! every chunk is copied, so what follows the copy on its QP (a signal
//! word, a CQE) is ordered after all of it, as for a copy of its own block.
//!
//! * **Who looks.** Blocks that serve no QP (more blocks than QP groups)
//!   at the top of
//!   each pass, the others every [`HELP_EVERY`] passes
//!   ([`BlockMover::help`]): one relaxed load of each other block's claim
//!   word, compared with the last posting it saw there.
//! * **No waits on others' work.** The owner claims chunks like any block
//!   and waits only for chunks another block has claimed, which that
//!   block copies without waiting for anything. Every block has a board of
//!   its own, so owners never wait for one another.
//! * **Claims.** The claim word holds the posting's number, its count of
//!   chunks and its next chunk; a claim is a compare-and-swap that keeps
//!   number and count, so a block late for one posting cannot claim a
//!   chunk of the next one with the first one's addresses, nor a chunk
//!   past its end. While a chunk of a posting is unclaimed its owner is
//!   still in that copy, so the addresses a claimer read after the number
//!   are that posting's.
//! * **Ordering.** A helper's block ends its chunk at a barrier; its
//!   control thread then fences at the engine's scope and adds the chunks
//!   it copied to the board's `done`, which the owner reads with acquire at
//!   that scope: the chunk's stores happen before the owner's next release
//!   (as a block copy's do before thread 0's).

use doorbell_kernels::ptx;

use super::super::control::CopyBoard;
use super::super::mem::Scope;
use super::super::mover::PayloadMover;
use super::{BlockMover, Job, JOB_COPY};

/// Copies of at least this many bytes are shared with the port's other
/// blocks (when it has any).
pub const SHARE_MIN: usize = 256 << 10;
/// Fewest bytes per claimed chunk of a shared copy (a multiple of 16, so
/// every chunk keeps the copy's alignment); a copy is cut into about one
/// chunk per block of the port, at least this long each (two per block
/// moved 1 MiB WQEs with 8 blocks 0.86 - 0.88x as fast at 16 - 256 MiB,
/// `benchmarks/ibgda_h200_bulk_copy_blocks.txt`).
pub const SHARE_CHUNK: usize = 64 << 10;

/// Blocks that serve QPs look at the other blocks' boards every this many
/// passes (each look is a trip to L2 on their path to the next doorbell).
pub const HELP_EVERY: u64 = 16;

/// The most chunks one posting has (the claim word's 16-bit count);
/// longer copies are made by their own block alone.
const MAX_CHUNKS: usize = u16::MAX as usize;

const _: () = assert!(SHARE_CHUNK.is_multiple_of(16) && SHARE_MIN >= 2 * SHARE_CHUNK);

/// The posting number of a claim word.
fn posting(claim: u64) -> u32 {
    (claim >> 32) as u32
}

/// The count of chunks of a claim word's posting.
fn chunks_of(claim: u64) -> u32 {
    (claim >> 16) as u16 as u32
}

/// Claims the next chunk of posting `seq`; `None` when none is left or
/// the board holds another posting.
///
/// # Safety
/// `board` is a board of the port.
unsafe fn claim_chunk(board: *mut CopyBoard, seq: u32) -> Option<u32> {
    // SAFETY (whole function): the caller's contract; the claim word is
    // only accessed atomically.
    unsafe {
        let at = &raw mut (*board).claim;
        let mut v = ptx::ld_relaxed_gpu_u64(at);
        loop {
            let next = v as u16 as u32;
            if posting(v) != seq || next >= chunks_of(v) {
                return None;
            }
            let old = ptx::atom_cas_relaxed_gpu_u64(at, v, v + 1);
            if old == v {
                return Some(next);
            }
            v = old;
        }
    }
}

impl BlockMover {
    /// Block `b`'s board (`b` < the port's blocks; `ctls` not null).
    fn board(&self, b: usize) -> *mut CopyBoard {
        // SAFETY: the port's control blocks are `blocks` consecutive ones.
        unsafe { &raw mut (*self.ctls.add(b)).board }
    }

    /// Copies chunk `c` (of `chunk` bytes each) of `len` bytes from `src`
    /// to `dst` with this block; returns its bytes.
    ///
    /// # Safety
    /// As for [`Self::round`] on the whole copy; `c` is one of its chunks.
    unsafe fn copy_chunk(&mut self, dst: u64, src: u64, len: u64, chunk: u32, c: u32) -> u64 {
        let off = c as u64 * chunk as u64;
        let n = (len - off).min(chunk as u64);
        let job = Job {
            kind: JOB_COPY,
            bulk: 0,
            dst: dst + off,
            src: src + off,
            len: n,
        };
        // SAFETY: the caller's contract.
        unsafe { self.round(job) };
        n
    }

    /// Copies `len` bytes from `src` to `dst` (not overlapping) with the
    /// help of the port's other blocks, and returns once all of it is
    /// copied; `false` (nothing copied) when the copy is too short or too
    /// long to share, the port has one block, or every block serves QPs
    /// (each busy with copies of its own).
    ///
    /// # Safety
    /// Both ranges are valid for `len` bytes and do not overlap.
    #[inline(never)]
    pub(super) unsafe fn copy_shared(&mut self, dst: *mut u8, src: *const u8, len: usize) -> bool {
        if self.ctls.is_null() || !self.share || len < SHARE_MIN {
            return false;
        }
        let chunk = len.div_ceil(self.blocks).next_multiple_of(16).max(SHARE_CHUNK);
        let chunks = len.div_ceil(chunk);
        if chunk > u32::MAX as usize || chunks > MAX_CHUNKS {
            return false;
        }
        let (chunk, chunks) = (chunk as u32, chunks as u32);
        let b = self.board(self.me);
        let (d, s, l) = (dst as usize as u64, src as usize as u64, len as u64);
        // SAFETY (whole function): the board is this block's, in the port's
        // control blocks (`run_block`'s contract); its fields are written
        // by this block only, before a posting is published, and no chunk
        // of the previous posting is left to claim.
        unsafe {
            core::ptr::write_volatile(&raw mut (*b).dst, d);
            core::ptr::write_volatile(&raw mut (*b).src, s);
            core::ptr::write_volatile(&raw mut (*b).len, l);
            core::ptr::write_volatile(&raw mut (*b).chunk, chunk);
            ptx::st_relaxed_gpu_u32(&raw mut (*b).done, 0);
            let seq = posting(ptx::ld_relaxed_gpu_u64(&raw const (*b).claim)).wrapping_add(1);
            // The fields above before the posting's number.
            ptx::st_release_gpu_u64(&raw mut (*b).claim, (seq as u64) << 32 | (chunks as u64) << 16);
            let mut mine = 0u32;
            while let Some(c) = claim_chunk(b, seq) {
                self.copy_chunk(d, s, l, chunk, c);
                mine += 1;
            }
            // The chunks other blocks claimed; each is being copied.
            let done = &raw const (*b).done;
            while self.load_done(done) < chunks - mine {
                core::hint::spin_loop();
            }
        }
        true
    }

    /// `done`, with acquire at the engine's scope (the chunks' stores
    /// before what the owner publishes next).
    ///
    /// # Safety
    /// `p` is a board's `done`.
    unsafe fn load_done(&self, p: *const u32) -> u32 {
        // SAFETY: the caller's contract.
        unsafe {
            match self.scope() {
                Scope::Gpu => ptx::ld_acquire_gpu_u32(p),
                Scope::Sys => ptx::ld_acquire_sys_u32(p),
            }
        }
    }

    /// Copies chunks of the postings on the other blocks' boards that this
    /// block has not seen yet, until none is left to claim.
    ///
    /// # Safety
    /// As for [`run_block`](super::run_block): a posting's ranges are
    /// valid (its owner checked them) until every chunk is copied.
    #[inline(never)]
    pub(super) unsafe fn help(&mut self) {
        if self.ctls.is_null() {
            return;
        }
        // One relaxed load of every other board's claim word, all issued
        // before any is compared.
        let mut claims = [0u64; super::super::tables::MAX_SHARDS];
        for (b, c) in claims.iter_mut().enumerate().take(self.blocks) {
            if b != self.me {
                // SAFETY: as in `board`; the claim word is only accessed
                // atomically.
                *c = unsafe { ptx::ld_relaxed_gpu_u64(&raw const (*self.board(b)).claim) };
            }
        }
        for (b, &c) in claims.iter().enumerate().take(self.blocks) {
            if b != self.me && posting(c) != self.seen[b] {
                // SAFETY: the caller's contract.
                unsafe { self.help_board(b) };
            }
        }
    }

    /// Copies chunks of the posting on block `b`'s board until none is
    /// left to claim, and remembers the posting as seen.
    ///
    /// # Safety
    /// As for [`Self::help`].
    unsafe fn help_board(&mut self, b: usize) {
        let board = self.board(b);
        // SAFETY (whole function): as in `copy_shared`.
        unsafe {
            // The posting's fields after its number.
            let seq = posting(ptx::ld_acquire_gpu_u64(&raw const (*board).claim));
            let d = core::ptr::read_volatile(&raw const (*board).dst);
            let s = core::ptr::read_volatile(&raw const (*board).src);
            let l = core::ptr::read_volatile(&raw const (*board).len);
            let chunk = core::ptr::read_volatile(&raw const (*board).chunk);
            // A successful claim keeps `seq` and found a chunk unclaimed:
            // the owner has been in posting `seq`'s copy from before the
            // number was published until then, so these fields are its.
            let mut copied = 0u32;
            while let Some(c) = claim_chunk(board, seq) {
                self.shared_bytes += self.copy_chunk(d, s, l, chunk, c);
                copied += 1;
            }
            if copied != 0 {
                // This block's count of shared bytes goes out with the
                // chunks: a block that serves no QP publishes its other
                // counters only every so many idle passes, and a reader of
                // the counters after the copy's completion must see it.
                let mine = &raw mut (*self.ctls.add(self.me)).counters.shared_bytes;
                ptx::st_relaxed_sys_u64(mine, self.shared_bytes);
                // The block's stores (ordered before each round's last
                // barrier) before the count the owner acquires.
                self.fence();
                let done = &raw mut (*board).done;
                match self.scope() {
                    Scope::Gpu => ptx::atom_add_relaxed_gpu_u32(done, copied),
                    Scope::Sys => ptx::atom_add_relaxed_sys_u32(done, copied),
                };
            }
            self.seen[b] = seq;
        }
    }
}
