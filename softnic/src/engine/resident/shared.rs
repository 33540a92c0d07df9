//! Large copies shared by a port's engine blocks.
//!
//! One block copies at what one SM moves (~26 GB/s on an H200 with its
//! threads, ~34 with the bulk-copy unit), whatever
//! the port's other blocks are doing. While some block of the port serves
//! no QP (more blocks than groups of QPs; blocks beyond
//! [`MAX_SHARDS`](super::super::tables::MAX_SHARDS) never serve one), a
//! copy of at least [`SHARE_MIN`] bytes is therefore posted on the copying
//! block's own [`CopyBoard`] (in its control block) and cut into chunks of
//! [`SHARE_CHUNK`] bytes or more, as many as the port has blocks for each
//! block serving QPs (16 blocks of which 8 serve QPs: two chunks a copy).
//! The posting holds chunk 0 for its owner; the owner and every other
//! block of the port that looks claim the others one at a time and copy
//! each with their whole block.
//!
//! * **Deferred.** Where the engine lets a copy run on past its WQE
//!   ([`PayloadMover::defer`]), the owner's block copies one chunk while
//!   its control thread goes on to the QP's next WQE, and the other blocks
//!   copy the rest; [`PayloadMover::drain`] (before anything that says the
//!   copy landed: a signal word, a CQE, an atomic) meets the block,
//!   copies the chunks still unclaimed and waits for the others'.
//!   Otherwise the owner claims chunks until none is left and returns once
//!   every chunk is copied. Either way what follows the copy on its QP is
//!   ordered after all of it, as for a copy of its own block.
//! * **Two in flight.** The next shared copy does not wait for the last
//!   one's chunks that other blocks are still copying: the owner meets its
//!   block, copies the last copy's chunks nobody claimed and posts the next
//!   on the board's other slot ([`BlockMover::drain_for_posting`]); only
//!   the copy before the last must have landed, since its slot is reused.
//!   A copy whose bytes could differ for it — one that writes what a copy
//!   in flight reads, reads what one writes, or writes what one writes
//!   other than from the same source byte of a frozen source — drains
//!   first, so the copies of a QP land as if one after the other. (Two
//!   copies that write the same byte from the same byte of a WRITE's or a
//!   send's gather list write the same value: the requester must not
//!   change it until the WQE completes ([`PayloadMover::copy_frozen`]); a
//!   READ's source, the responder's memory, may change between two.)
//! * **Who looks.** Blocks that serve no QP (more blocks than QP groups)
//!   at the top of
//!   each pass, the others every [`HELP_EVERY`] passes
//!   ([`BlockMover::help`]): one relaxed load of each other block's claim
//!   word, compared with the last posting it saw there. Each block starts
//!   at another board (its own index modulo the boards), so blocks that
//!   look at once take chunks of different postings, and a posting whose
//!   claim word shows every chunk taken costs nothing more. A look copies
//!   one chunk at most: the other postings it saw go to the blocks that
//!   look next rather than wait behind that chunk.
//! * **No waits on others' work.** The owner claims chunks like any block
//!   and waits only for chunks another block has claimed, which that
//!   block copies without waiting for anything: a block with a copy of its
//!   own in flight claims no other block's chunks ([`BlockMover::help`]).
//!   Every block has a board of its own, so owners never wait for one
//!   another.
//! * **Claims.** The claim word holds the posting's number, its count of
//!   chunks and its next chunk; a claim is a compare-and-swap that keeps
//!   number and count, so a block late for one posting cannot claim a
//!   chunk of the next one with the first one's addresses, nor a chunk
//!   past its end. A posting's fields are in the slot of its number's
//!   parity, which the owner rewrites only after every chunk of the
//!   posting two before has been copied — the claimer's included — so the
//!   addresses a claimer reads after its claim (behind a fence, the number
//!   having been published with release) are that posting's.
//! * **Ordering.** A helper's block ends its chunk at a barrier; its
//!   control thread then fences at the engine's scope and adds the chunks
//!   it copied to the board's `done`, which the owner reads with acquire at
//!   that scope: the chunk's stores happen before the owner's next release
//!   (as a block copy's do before thread 0's).

use doorbell_kernels::ptx;

use super::super::control::{CopyBoard, CopySlot};
use super::super::mem::{self, Scope};
use super::super::mover::PayloadMover;
use super::super::tables::MAX_SHARDS;
use super::{BlockMover, Job, JOB_COPY};

/// Copies of at least this many bytes are shared with the port's other
/// blocks (when it has any).
pub const SHARE_MIN: usize = 256 << 10;
/// Fewest bytes per claimed chunk of a shared copy (a multiple of 16, so
/// every chunk keeps the copy's alignment). Shorter chunks do not stream
/// through the bulk-copy unit: cutting each copy into one chunk per block
/// of the port, 16 blocks of which 8 served QPs moved 4 MiB puts 0.65x as
/// fast as 8 blocks alone (`benchmarks/ibgda_h100_share_chunks_ab.txt`).
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
    // SAFETY: the caller's contract; the claim word is only accessed
    // atomically.
    unsafe { claim_chunk_from(board, seq, ptx::ld_relaxed_gpu_u64(&raw const (*board).claim)) }
}

/// [`claim_chunk`], with `v` the claim word as last read (the first
/// compare-and-swap tries it without reading it again).
///
/// # Safety
/// As for [`claim_chunk`].
unsafe fn claim_chunk_from(board: *mut CopyBoard, seq: u32, mut v: u64) -> Option<u32> {
    // SAFETY (whole function): the caller's contract; the claim word is
    // only accessed atomically.
    unsafe {
        let at = &raw mut (*board).claim;
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

/// Whether `[a, a + la)` and `[b, b + lb)` share a byte.
fn meet(a: u64, la: u64, b: u64, lb: u64) -> bool {
    a < b.saturating_add(lb) && b < a.saturating_add(la)
}

/// A shared copy posted on a block's board: the posting's number, its
/// chunks, and the ranges of the whole copy.
#[derive(Clone, Copy)]
pub(super) struct Posting {
    seq: u32,
    chunks: u32,
    /// Bytes per chunk (the last one may be shorter).
    chunk: u32,
    /// Chunks the owner claimed so far.
    mine: u32,
    /// Its source does not change until its WQE completes
    /// ([`PayloadMover::copy_frozen`]).
    frozen: bool,
    dst: u64,
    src: u64,
    len: u64,
}

impl Posting {
    /// Whether a copy of `len` bytes from `src` to `dst` (its source
    /// `frozen` or not) may land in any order with this one, its bytes the
    /// same either way: it neither writes what this one reads nor reads
    /// what this one writes, and where both write the same byte they copy
    /// it from the same source byte (the same displacement) of sources
    /// that do not change meanwhile (two READs of memory the responder may
    /// change between them do not commute).
    fn commutes(&self, dst: u64, src: u64, len: u64, frozen: bool) -> bool {
        !meet(dst, len, self.src, self.len)
            && !meet(src, len, self.dst, self.len)
            && (!meet(dst, len, self.dst, self.len) || (frozen && self.frozen && dst.wrapping_sub(src) == self.dst.wrapping_sub(self.src)))
    }

    /// The block copy of chunk `c` (one of the posting's).
    fn chunk_job(&self, c: u32) -> Job {
        let off = c as u64 * self.chunk as u64;
        Job {
            kind: JOB_COPY,
            bulk: 0,
            dst: self.dst + off,
            src: self.src + off,
            len: (self.len - off).min(self.chunk as u64),
        }
    }
}

impl BlockMover {
    /// Block `b`'s board (`b` < the port's blocks; `ctls` not null).
    fn board(&self, b: usize) -> *mut CopyBoard {
        // SAFETY: the port's control blocks are `blocks` consecutive ones.
        unsafe { &raw mut (*self.ctls.add(b)).board }
    }

    /// The slot of posting `seq` on block `b`'s board.
    fn slot(&self, b: usize, seq: u32) -> *mut CopySlot {
        // SAFETY: as in `board`; two slots.
        unsafe { &raw mut (*self.board(b)).slots[(seq & 1) as usize] }
    }

    /// Chunk size and count of a shared copy of `len` bytes; `None` when
    /// such a copy is not shared ([`Self::copy_shared`]).
    fn cut(&self, len: usize) -> Option<(usize, usize)> {
        if self.ctls.is_null() || self.share < 2 || len < SHARE_MIN {
            return None;
        }
        let chunk = len.div_ceil(self.share).next_multiple_of(16).max(SHARE_CHUNK);
        let chunks = len.div_ceil(chunk);
        (chunk <= u32::MAX as usize && chunks <= MAX_CHUNKS).then_some((chunk, chunks))
    }

    /// Whether a deferred copy of `len` bytes from `src` to `dst` may be
    /// posted while this block's shared copies in flight still land: it
    /// is shared and it [commutes](Posting::commutes) with each of them.
    pub(super) fn may_post_beside(&self, dst: *mut u8, src: *const u8, len: usize) -> bool {
        let (d, s, l) = (dst as usize as u64, src as usize as u64, len as u64);
        self.defer
            && self.cut(len).is_some()
            && [self.posting, self.older]
                .iter()
                .flatten()
                .all(|p| p.commutes(d, s, l, self.frozen))
    }

    /// Copies `len` bytes from `src` to `dst` (not overlapping) with the
    /// help of the port's other blocks: with `defer`, this block copies one
    /// chunk and the call returns while that chunk and the others' are in
    /// flight (the next posting, [`BlockMover::drain_for_posting`], or
    /// [`drain_copy`](Self::drain_copy) copies what is left unclaimed, and
    /// a drain waits for the rest); otherwise it returns once all of it
    /// is copied.
    /// `false` (nothing copied) when the copy is too short or too long to
    /// share, the port has one block, or every block serves QPs (each busy
    /// with copies of its own).
    ///
    /// # Safety
    /// Both ranges are valid for `len` bytes, and do not overlap, until the
    /// copy is drained; the block has no copy in flight (other blocks'
    /// chunks of this block's last posting may be, when that posting is
    /// one this copy may run beside).
    #[inline(never)]
    pub(super) unsafe fn copy_shared(&mut self, dst: *mut u8, src: *const u8, len: usize, defer: bool) -> bool {
        // SAFETY: the caller's contract.
        let Some(p) = (unsafe { self.post(dst, src, len) }) else {
            return false;
        };
        // The posting holds chunk 0 for its owner.
        // SAFETY: the caller's contract; one chunk of the copy.
        unsafe { self.round_now(p.chunk_job(0), defer) };
        if defer {
            self.posting = Some(p);
        } else {
            // SAFETY: the caller's contract.
            unsafe { self.finish_shared(p, false) };
        }
        true
    }

    /// Posts a copy of `len` bytes from `src` to `dst` on this block's
    /// board, its chunks open to every block's claims; `None` (nothing
    /// posted) when it is not to be shared ([`Self::copy_shared`]).
    ///
    /// # Safety
    /// As for [`Self::copy_shared`].
    unsafe fn post(&mut self, dst: *mut u8, src: *const u8, len: usize) -> Option<Posting> {
        let (chunk, chunks) = self.cut(len)?;
        // Only this block changes the posting's number (claims keep it),
        // so it need not read it back.
        let seq = self.posted.wrapping_add(1);
        let p = Posting {
            seq,
            chunks: chunks as u32,
            chunk: chunk as u32,
            mine: 1,
            frozen: self.frozen,
            dst: dst as usize as u64,
            src: src as usize as u64,
            len: len as u64,
        };
        let slot = self.slot(self.me, seq);
        // SAFETY (whole block): the board is this block's, in the port's
        // control blocks (`run_block`'s contract); the slot's fields are
        // written by this block only, before a posting is published, and
        // the posting that used the slot last (two before) was finished:
        // nobody reads them any more.
        unsafe {
            core::ptr::write_volatile(&raw mut (*slot).dst, p.dst);
            core::ptr::write_volatile(&raw mut (*slot).src, p.src);
            core::ptr::write_volatile(&raw mut (*slot).len, p.len);
            core::ptr::write_volatile(&raw mut (*slot).chunk, p.chunk);
            core::ptr::write_volatile(&raw mut (*slot).posted_ns, ptx::globaltimer_ns());
            ptx::st_relaxed_gpu_u32(&raw mut (*slot).done, 0);
            // The fields above before the posting's number; chunk 0 is
            // claimed for the owner already (the claim word's next chunk
            // is 1). A chunk of the last posting still unclaimed is no
            // longer claimable: the owner took them all (`drain_for_posting`).
            let claim = &raw mut (*self.board(self.me)).claim;
            ptx::st_release_gpu_u64(claim, (seq as u64) << 32 | (p.chunks as u64) << 16 | 1);
        }
        self.posted = seq;
        self.shared_copies += 1;
        self.shared_chunks += p.chunks as u64;
        self.pipelined_copies += self.older.is_some() as u64;
        Some(p)
    }

    /// Copies the chunks of this block's posting `p` nobody has claimed
    /// yet, then waits until the other blocks have copied theirs: all of
    /// the copy has landed when it returns.
    ///
    /// # Safety
    /// `p` is this block's newest posting, not finished yet; its ranges
    /// valid; nothing is in flight on the block.
    #[inline(never)]
    pub(super) unsafe fn finish_shared(&mut self, mut p: Posting, deferred: bool) {
        // SAFETY: the caller's contract.
        unsafe {
            self.claim_rest(&mut p, deferred);
            self.wait_others(&p);
        }
    }

    /// Claims and copies the chunks of this block's newest posting `p`
    /// nobody has claimed yet; then every chunk is copied or being copied
    /// by the block that claimed it.
    ///
    /// # Safety
    /// As for [`Self::finish_shared`].
    pub(super) unsafe fn claim_rest(&mut self, p: &mut Posting, deferred: bool) {
        let b = self.board(self.me);
        // The owner's own chunk was claimed with the posting; of a
        // deferred copy, any other it claims now no block took in time.
        let first = p.mine;
        // SAFETY: the caller's contract; the board is this block's.
        while let Some(c) = unsafe { claim_chunk(b, p.seq) } {
            // Nothing else in flight (the caller's contract).
            // SAFETY: one chunk of the posting's ranges.
            unsafe { self.round_now(p.chunk_job(c), false) };
            p.mine += 1;
        }
        if deferred {
            self.late_chunks += (p.mine - first) as u64;
        }
    }

    /// Waits until the other blocks have copied the chunks of this block's
    /// posting `p` that they claimed (all of them are claimed).
    ///
    /// # Safety
    /// `p` is one of this block's postings, every chunk claimed.
    pub(super) unsafe fn wait_others(&mut self, p: &Posting) {
        // SAFETY: the slot's `done` is only accessed atomically.
        let done = unsafe { &raw const (*self.slot(self.me, p.seq)).done };
        let c0 = ptx::clock64();
        // SAFETY: as above.
        while unsafe { self.load_done(done) } < p.chunks - p.mine {
            core::hint::spin_loop();
        }
        self.drain_shared_cycles += ptx::clock64().wrapping_sub(c0);
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

    /// Copies a chunk of a posting on the other blocks' boards that this
    /// block has not seen through yet (one chunk a look); returns the
    /// chunks it copied. Nothing while a copy of this block's is in flight:
    /// a block claims others' chunks only when it waits for nothing, so no
    /// two owners ever wait for each other's chunks.
    ///
    /// # Safety
    /// As for [`run_block`](super::run_block): a posting's ranges are
    /// valid (its owner checked them) until every chunk is copied.
    #[inline(never)]
    pub(super) unsafe fn help(&mut self) -> u32 {
        if self.ctls.is_null() || self.in_flight() {
            return 0;
        }
        // One relaxed load of every other board's claim word, all issued
        // before any is compared.
        // Only blocks that may serve QPs post (the others have no copies).
        let scan_ns = ptx::globaltimer_ns();
        let mut claims = [0u64; MAX_SHARDS];
        for (b, c) in claims.iter_mut().enumerate().take(self.blocks) {
            if b != self.me {
                // SAFETY: as in `board`; the claim word is only accessed
                // atomically.
                *c = unsafe { ptx::ld_relaxed_gpu_u64(&raw const (*self.board(b)).claim) };
            }
        }
        // Each block starts at another board, so that blocks looking at
        // once spread over the postings rather than all claim the first
        // one's chunks and then queue for the next (the blocks' first
        // claims came ~4.8 us after a posting on one H200, in a copy of
        // ~4 us).
        let owners = self.blocks.min(MAX_SHARDS);
        for k in 0..owners {
            let b = (self.me + k) % owners;
            let c = claims[b];
            if b == self.me || posting(c) == self.seen[b] {
                continue;
            }
            if c as u16 as u32 >= chunks_of(c) {
                // Every chunk claimed already.
                self.seen[b] = posting(c);
                continue;
            }
            // SAFETY: the caller's contract.
            if unsafe { self.help_board(b, c, scan_ns) } {
                // One chunk a look: the postings this look saw besides
                // go to the blocks that look next (or to this one's next
                // look), rather than wait behind this chunk.
                return 1;
            }
        }
        0
    }

    /// Copies a chunk of the posting on block `b`'s board; `false`, with
    /// the posting remembered as seen, when none is left to claim.
    ///
    /// # Safety
    /// As for [`Self::help`].
    unsafe fn help_board(&mut self, b: usize, claim: u64, scan_ns: u64) -> bool {
        let board = self.board(b);
        let seq = posting(claim);
        // SAFETY (whole function): as in `post`.
        unsafe {
            // Claimed first, from the word `help` read: a posting whose
            // chunks are all taken costs no more trips.
            let Some(c) = claim_chunk_from(board, seq, claim) else {
                self.seen[b] = seq;
                return false;
            };
            let claimed_ns = ptx::globaltimer_ns();
            // A successful claim keeps `seq` and found a chunk unclaimed:
            // the owner has been in posting `seq`'s copy from before the
            // number was published until then, so the fields are its. The
            // fence orders their reads after the claim (which read the
            // number the owner published with release).
            mem::acquire(Scope::Gpu);
            // The posting's slot is not rewritten before every chunk of it
            // is copied, this block's included.
            let slot = self.slot(b, seq);
            let p = Posting {
                seq,
                chunks: chunks_of(claim),
                chunk: core::ptr::read_volatile(&raw const (*slot).chunk),
                mine: 0,
                frozen: false,
                dst: core::ptr::read_volatile(&raw const (*slot).dst),
                src: core::ptr::read_volatile(&raw const (*slot).src),
                len: core::ptr::read_volatile(&raw const (*slot).len),
            };
            if self.helped_seq[b] != seq {
                // This block's first chunk of the posting.
                self.helped_seq[b] = seq;
                let posted_ns = core::ptr::read_volatile(&raw const (*slot).posted_ns);
                self.helped_postings += 1;
                self.help_claim_ns += claimed_ns.saturating_sub(posted_ns);
                self.help_seen_ns += scan_ns.saturating_sub(posted_ns);
            }
            // Off the GPU: a claimed chunk lands late, as a busy SM's
            // might (an owner that does not wait for it fails the tests).
            mem::claimed_chunk_lands_late();
            let job = p.chunk_job(c);
            // Nothing in flight (`help`'s check).
            let t0 = ptx::globaltimer_ns();
            self.round_now(job, false);
            self.help_copy_ns += ptx::globaltimer_ns().saturating_sub(t0);
            self.shared_bytes += job.len;
            self.helped_chunks += 1;
            // This block's counts of others' chunks go out with the
            // chunks: a block that serves no QP publishes its other
            // counters only every so many idle passes, and a reader of
            // the counters after the copy's completion must see it.
            let mine = &raw mut (*self.ctls.add(self.me)).counters;
            ptx::st_relaxed_sys_u64(&raw mut (*mine).shared_bytes, self.shared_bytes);
            ptx::st_relaxed_sys_u64(&raw mut (*mine).helped_chunks, self.helped_chunks);
            ptx::st_relaxed_sys_u64(&raw mut (*mine).helped_postings, self.helped_postings);
            ptx::st_relaxed_sys_u64(&raw mut (*mine).help_claim_ns, self.help_claim_ns);
            ptx::st_relaxed_sys_u64(&raw mut (*mine).help_seen_ns, self.help_seen_ns);
            ptx::st_relaxed_sys_u64(&raw mut (*mine).help_copy_ns, self.help_copy_ns);
            // The block's stores (ordered before each round's last
            // barrier) before the count the owner acquires.
            self.fence();
            let done = &raw mut (*slot).done;
            match self.scope() {
                Scope::Gpu => ptx::atom_add_relaxed_gpu_u32(done, 1),
                Scope::Sys => ptx::atom_add_relaxed_sys_u32(done, 1),
            };
            true
        }
    }
}
