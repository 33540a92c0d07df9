//! The engine's byte movement (its DMA), split from its control.
//!
//! [`super::poll_port`] decides *what* moves — after every key, bounds and
//! access check, before the CQE — and hands each copy to a [`PayloadMover`]. The
//! host thread's mover is one thread doing `memmove` ([`ThreadMover`]); the
//! GPU-resident engine's mover ([`super::resident::BlockMover`]) wakes the
//! rest of its block and copies with every thread, 16 bytes at a time
//! ([`copy_part`]). The control logic is the same code either way.

/// The parts of a busy pass whose cycles the GPU-resident engine counts
/// ([`PayloadMover::lap`]; `EngineCounters::phase_cycles`), in pass order: the
/// engine's profile (`ibgda_bench` prints it per WQE). Copies and the
/// fences between them are counted apart (`copy_cycles`, `fence_cycles`);
/// what none of these holds is the pass's walk over its QPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Phase {
    /// A QP slot's own checks (in use, state), noticing a doorbell and
    /// reading the doorbell record, with the acquire fence that makes the
    /// WQEs behind it visible.
    Doorbell = 0,
    /// Starting the published WQEs: reading and parsing them, the link
    /// model, the in-flight ring.
    Fetch = 1,
    /// Execution begins: room in the send CQ.
    Room = 2,
    /// Parsing the WQE again (the in-flight ring keeps only its index).
    Parse = 3,
    /// Counting it, and the injected-error fault.
    Admit = 4,
    /// Local key, bounds and access checks of its gather or scatter list.
    Local = 5,
    /// The responder: its QP, connection and state; the stalled-peer fault.
    Peer = 6,
    /// Remote key, bounds and access checks (WRITE, READ, atomics).
    Remote = 7,
    /// The responder's receive WQE, its checks and CQ room (sends, writes
    /// with immediate).
    Receive = 8,
    /// The rest up to the data: walking the gather or scatter list.
    Check = 9,
    /// An atomic's remote read-modify-write and the write of its result.
    Atomic = 10,
    /// The responder's completion: its receive CQE, its RQ counter.
    Responder = 11,
    /// The requester's completion: counters, its CQE and the release.
    Requester = 12,
    /// The rest: the in-flight ring, failed WQEs, flushes.
    Complete = 13,
    /// Bursts ([`super::burst`]): the block's round that reads and checks
    /// a run of WQEs, then the control thread's in-order stores, counters
    /// and CQEs for them (their copies counted as copies).
    Burst = 14,
    /// The lone-request path (`resident`'s `lone`): one QP rung while the
    /// engine idled, its doorbell, checks, CQEs and ring without a pass
    /// (its copies counted as copies).
    Lone = 15,
}

/// Number of [`Phase`]s.
pub const PHASES: usize = 16;

impl Phase {
    /// Every phase, in order.
    pub const ALL: [Phase; PHASES] = [
        Phase::Doorbell,
        Phase::Fetch,
        Phase::Room,
        Phase::Parse,
        Phase::Admit,
        Phase::Local,
        Phase::Peer,
        Phase::Remote,
        Phase::Receive,
        Phase::Check,
        Phase::Atomic,
        Phase::Responder,
        Phase::Requester,
        Phase::Complete,
        Phase::Burst,
        Phase::Lone,
    ];

    /// Its name in lower case, as reports print it.
    pub const fn name(self) -> &'static str {
        match self {
            Phase::Doorbell => "doorbell",
            Phase::Fetch => "fetch",
            Phase::Room => "room",
            Phase::Parse => "parse",
            Phase::Admit => "admit",
            Phase::Local => "local",
            Phase::Peer => "peer",
            Phase::Remote => "remote",
            Phase::Receive => "receive",
            Phase::Check => "check",
            Phase::Atomic => "atomic",
            Phase::Responder => "responder",
            Phase::Requester => "requester",
            Phase::Complete => "complete",
            Phase::Burst => "burst",
            Phase::Lone => "lone",
        }
    }
}

/// Where the engine's payload copies go, the scope of its ordering, and
/// the cycle count of its control.
pub trait PayloadMover {
    /// Moves `len` bytes from `src` to `dst` (an RDMA WRITE's gather list,
    /// a READ's scatter list, a send, an atomic's result). The ranges may
    /// overlap (loopback into one region). Every byte has landed when it
    /// returns (or, while [`defer`](Self::defer) is on, by the next
    /// [`drain`](Self::drain), and a later copy whose bytes its order could
    /// change starts after it), and is ordered before what an observer may
    /// poll after it: the engine's later CQEs and atomics (releases),
    /// signal words (later copies of 8 or 16 aligned bytes) and short
    /// copies; not before later bulk payload.
    ///
    /// # Safety
    /// Both ranges are valid for `len` bytes.
    unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, len: usize);

    /// [`copy`](Self::copy) from a source that does not change until the
    /// WQE completes (a requester's own gather list: a WRITE's or a send's,
    /// which the verbs contract freezes until then), so two copies in
    /// flight that write the same bytes from the same source bytes write
    /// the same values. A READ's source (the responder's memory) is not.
    ///
    /// # Safety
    /// As for [`copy`](Self::copy).
    #[inline(always)]
    unsafe fn copy_frozen(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: the caller's contract.
        unsafe { self.copy(dst, src, len) }
    }

    /// Lets a block copy that [`copy`](Self::copy) starts run on after it
    /// returns (`on`), until [`drain`](Self::drain): the control thread then
    /// checks the next WQE of the QP while the block moves the bytes. While
    /// on, the caller drains before anything that publishes (a CQE, an
    /// atomic, a responder's event, a fence) and before it stops deferring.
    /// A no-op where copies always complete in `copy`.
    #[inline(always)]
    fn defer(&mut self, _on: bool) {}

    /// Waits until the block copy still in flight (if any) has landed and
    /// is ordered as [`copy`](Self::copy) promises, then writes the CQE
    /// held for it ([`hold_cqe`](Self::hold_cqe)).
    #[inline(always)]
    fn drain(&mut self) {}

    /// With a block copy in flight and no CQE held yet: claims the slot of
    /// a requester's success CQE in `cq` now (room and owner bits count
    /// it) and keeps its image `w` to store at [`drain`](Self::drain),
    /// once the payload it reports has landed; returns false (doing
    /// nothing) otherwise, and the caller drains and pushes it itself
    /// ([`super::cqe::push`]).
    ///
    /// # Safety
    /// As for [`super::cqe::push`].
    #[inline(always)]
    unsafe fn hold_cqe(&mut self, _cq: &mut super::tables::CqEntry, _w: &[u32; 16]) -> bool {
        false
    }

    /// The scope of the engine's ordering with the ranks (the acquire after
    /// a doorbell record; the releases of CQEs, atomics and signal words):
    /// `sys` unless every party is known to be on the engine's GPU.
    #[inline(always)]
    fn scope(&self) -> super::mem::Scope {
        super::mem::Scope::Sys
    }

    /// Counts the cycles since the last lap as `phase`'s (the GPU engine's
    /// profile; a no-op elsewhere).
    #[inline(always)]
    fn lap(&mut self, _phase: Phase) {}

    /// QP slot `q`'s doorbell was just seen (the GPU engine's latency
    /// counters; a no-op elsewhere).
    #[inline(always)]
    fn rung(&mut self, _q: usize) {}

    /// Stores the payloads of slots `from..to` of the burst being
    /// completed ([`super::burst::complete`]) — a row of WRITEs marked
    /// unordered, none signaled — each by its own lane of the warp, ordered
    /// behind every payload before them and before what the caller stores
    /// after; returns false (storing nothing) where there is no such warp,
    /// and the caller stores them itself.
    ///
    /// # Safety
    /// The slots are those of the burst being completed, checked.
    #[inline(always)]
    unsafe fn row(&mut self, _from: u32, _to: u32) -> bool {
        false
    }

    /// A WQE of QP slot `q` was just executed (its CQE, if any, written):
    /// the GPU engine counts the time since the QP's last doorbell was
    /// seen (a no-op elsewhere).
    #[inline(always)]
    fn executed(&mut self, _q: usize) {}

    /// Executes a burst ([`super::burst`]): of the `avail` basic blocks
    /// QP `q` of port `p` has published from SQ counter `start`, the
    /// longest prefix of simple RDMA WRITEs, with the mover's block; steps
    /// the ring past them and says how many it executed and how many WQEs
    /// the one-WQE path starts before the next burst. The default (a mover
    /// without a block): [`Outcome::NONE`], the one-WQE path
    /// runs them all. Called only when nothing is in flight on the QP, the
    /// link model is off and no fault is injected.
    ///
    /// # Safety
    /// The tables' contract ([`super::poll_port`]); `start` is the QP's
    /// `sq_ci`.
    #[inline(always)]
    unsafe fn burst<P: super::tables::Ports + ?Sized>(
        &mut self,
        ports: &mut P,
        p: usize,
        q: usize,
        start: u32,
        avail: u32,
        now_ns: u64,
    ) -> Outcome {
        let _ = (ports, p, q, start, avail, now_ns);
        Outcome::NONE
    }
}

/// The one-thread mover of the host-thread engine: `memmove`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadMover;

impl PayloadMover for ThreadMover {
    #[inline(always)]
    unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: the caller's contract.
        unsafe { super::mem::copy_bytes(dst, src, len) }
    }
}

/// 16-byte vectors each thread of a block copy keeps in flight: the
/// engine is one block, whose copy rate is bytes in flight over memory
/// latency. A copy by at most [`WIDE_COPY_PARTS`] threads keeps twice as
/// many ([`COPY_UNROLL_WIDE`]), so a block of 256 threads has as many
/// bytes in flight as one of 512.
pub const COPY_UNROLL: usize = 8;
/// [`COPY_UNROLL`] for copies of at most [`WIDE_COPY_PARTS`] threads.
pub const COPY_UNROLL_WIDE: usize = 16;
/// Copies by this many threads or fewer use [`COPY_UNROLL_WIDE`].
pub const WIDE_COPY_PARTS: usize = 256;

/// The 16-byte-vector body of [`copy_part`]: vectors `part`,
/// `part + parts`, ... below `body`, `U` of them in flight at a time.
/// Not inlined: one copy of each loop in the engine's code, not one per
/// caller. Inlined, the 16-vector loop took back what 255 registers gave
/// the control thread (round trip 1.00×, lane posts 1.07× against 512
/// threads; not inlined 0.94 – 0.99× and 1.10 – 1.12× on one H200:
/// `benchmarks/ibgda_h200_engine_copy_inlining.txt`).
///
/// # Safety
/// `d` and `s` are 16-byte aligned and valid for `body` vectors; the
/// ranges do not overlap.
#[inline(never)]
unsafe fn copy_vectors<const U: usize>(d: *mut u32, s: *const u32, body: usize, part: usize, parts: usize) {
    let mut k = part;
    // SAFETY (whole function): every vector below `body` (the caller's
    // contract).
    unsafe {
        while k + (U - 1) * parts < body {
            let mut x = [[0u32; 4]; U];
            for (u, x) in x.iter_mut().enumerate() {
                *x = doorbell_kernels::ptx::ld_v4_u32(s.add(4 * (k + u * parts)));
            }
            for (u, x) in x.iter().enumerate() {
                doorbell_kernels::ptx::st_v4_u32(d.add(4 * (k + u * parts)), *x);
            }
            k += U * parts;
        }
        while k < body {
            doorbell_kernels::ptx::st_v4_u32(d.add(4 * k), doorbell_kernels::ptx::ld_v4_u32(s.add(4 * k)));
            k += parts;
        }
    }
}

/// Whether `[dst, dst + len)` and `[src, src + len)` overlap.
#[inline(always)]
pub fn overlaps(dst: *const u8, src: *const u8, len: usize) -> bool {
    let (d, s) = (dst as usize, src as usize);
    len != 0 && d < s.wrapping_add(len) && s < d.wrapping_add(len)
}

/// Part `part` of `parts` of a copy of `len` bytes (non-overlapping
/// ranges): called by `parts` threads, each with its own `part`, together
/// they copy every byte once. One or two aligned 8-byte words (a signal)
/// move as whole 8-byte stores. Otherwise, when `dst` and `src` share their
/// offset mod 16, the body moves in 16-byte vectors, [`COPY_UNROLL`] in flight per
/// thread ([`COPY_UNROLL_WIDE`] when `parts` is at most [`WIDE_COPY_PARTS`]), and the unaligned head and tail byte by byte; else in the widest
/// unit both share (8, 4, or 1 bytes).
///
/// # Safety
/// Both ranges are valid for `len` bytes and do not overlap; `part < parts`.
#[inline(always)]
pub unsafe fn copy_part(dst: *mut u8, src: *const u8, len: usize, part: usize, parts: usize) {
    if len <= 16 && (dst as usize | src as usize | len) & 7 == 0 {
        let (d, s) = (dst as *mut u64, src as *const u64);
        let mut k = part;
        while k < len / 8 {
            // SAFETY: inside both ranges, 8-byte aligned (checked above).
            unsafe { core::ptr::write_volatile(d.add(k), core::ptr::read_volatile(s.add(k))) };
            k += parts;
        }
        return;
    }
    let phase = (dst as usize ^ src as usize) & 15;
    let unit = if phase == 0 {
        16
    } else if phase & 7 == 0 {
        8
    } else if phase & 3 == 0 {
        4
    } else {
        1
    };
    let head = ((unit - (dst as usize & (unit - 1))) & (unit - 1)).min(len);
    let body = (len - head) / unit;
    let tail = len - head - body * unit;
    // SAFETY (whole function): every offset below stays inside the ranges
    // (the caller's contract), each unit aligned as its width needs.
    unsafe {
        // Head and tail bytes.
        let mut i = part;
        while i < head + tail {
            let o = if i < head { i } else { head + body * unit + (i - head) };
            core::ptr::write_volatile(dst.add(o), core::ptr::read_volatile(src.add(o)));
            i += parts;
        }
        let (d, s) = (dst.add(head), src.add(head));
        match unit {
            16 => {
                let (d, s) = (d as *mut u32, s as *const u32);
                if parts <= WIDE_COPY_PARTS {
                    copy_vectors::<COPY_UNROLL_WIDE>(d, s, body, part, parts);
                } else {
                    copy_vectors::<COPY_UNROLL>(d, s, body, part, parts);
                }
            }
            8 => {
                let (d, s) = (d as *mut u64, s as *const u64);
                let mut k = part;
                while k < body {
                    core::ptr::write_volatile(d.add(k), core::ptr::read_volatile(s.add(k)));
                    k += parts;
                }
            }
            4 => {
                let (d, s) = (d as *mut u32, s as *const u32);
                let mut k = part;
                while k < body {
                    core::ptr::write_volatile(d.add(k), core::ptr::read_volatile(s.add(k)));
                    k += parts;
                }
            }
            _ => {
                let mut k = part;
                while k < body {
                    core::ptr::write_volatile(d.add(k), core::ptr::read_volatile(s.add(k)));
                    k += parts;
                }
            }
        }
    }
}

/// What a burst did, and what the one-WQE path takes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// WQEs the burst executed.
    pub done: u32,
    /// Most WQEs the one-WQE path starts before the next burst: the run
    /// of WQEs the burst saw were not simple, so that the simple ones
    /// after it are the next pass's burst; 0 when the burst did every WQE
    /// it was given (the next pass bursts on); `u32::MAX` when no burst
    /// ran, nothing simple followed, or a full send CQ stopped it.
    pub fetch: u32,
}

impl Outcome {
    /// No burst ran: the one-WQE path takes everything.
    pub const NONE: Outcome = Outcome { done: 0, fetch: u32::MAX };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every split of every alignment copies every byte once and nothing else.
    #[test]
    fn parts_cover_the_copy_exactly() {
        let src: Vec<u8> = (0..700u32).map(|i| (i * 7 + 3) as u8).collect();
        for parts in [1usize, 2, 3, 32] {
            for so in 0..17 {
                for dof in 0..17 {
                    for len in [0usize, 1, 15, 16, 17, 63, 64, 200, 513] {
                        let mut dst = vec![0xeeu8; 720];
                        let mut buf = vec![0u8; 720];
                        buf[..700].copy_from_slice(&src);
                        let s = buf.as_ptr();
                        let d = dst.as_mut_ptr();
                        // Aligned bases for the vector path.
                        let (s, d) = (unsafe { s.add((16 - s as usize % 16) % 16 + so) }, unsafe {
                            d.add((16 - d as usize % 16) % 16 + dof)
                        });
                        for part in 0..parts {
                            unsafe { copy_part(d, s, len, part, parts) };
                        }
                        let dbase = (d as usize) - (dst.as_ptr() as usize);
                        let sbase = (s as usize) - (buf.as_ptr() as usize);
                        for (i, &b) in dst.iter().enumerate() {
                            let want = if i >= dbase && i < dbase + len {
                                buf[sbase + i - dbase]
                            } else {
                                0xee
                            };
                            assert_eq!(b, want, "parts {parts} so {so} do {dof} len {len} byte {i}");
                        }
                    }
                }
            }
        }
    }

    /// Copies long enough for every part to run its unrolled loop, by
    /// block sizes on both sides of [`WIDE_COPY_PARTS`] (16 and 8 vectors
    /// in flight), copy every byte once.
    #[test]
    fn both_unrolls_cover_long_copies_exactly() {
        let len = 16 * (COPY_UNROLL_WIDE * 2 * WIDE_COPY_PARTS + 37) + 5;
        let src: Vec<u8> = (0..len + 32).map(|i| (i * 13 + 5) as u8).collect();
        for parts in [2usize, WIDE_COPY_PARTS, WIDE_COPY_PARTS + 1, 2 * WIDE_COPY_PARTS] {
            for off in [0usize, 3] {
                let mut dst = vec![0xeeu8; len + 48];
                let s = unsafe { src.as_ptr().add((16 - src.as_ptr() as usize % 16) % 16 + off) };
                let base = (16 - dst.as_ptr() as usize % 16) % 16 + off;
                let d = unsafe { dst.as_mut_ptr().add(base) };
                for part in 0..parts {
                    unsafe { copy_part(d, s, len, part, parts) };
                }
                let sbase = s as usize - src.as_ptr() as usize;
                for (i, &b) in dst.iter().enumerate() {
                    let want = if (base..base + len).contains(&i) {
                        src[sbase + i - base]
                    } else {
                        0xee
                    };
                    assert_eq!(b, want, "parts {parts} offset {off} byte {i}");
                }
            }
        }
    }

    #[test]
    fn overlap_is_detected() {
        let b = [0u8; 64];
        let p = b.as_ptr();
        assert!(overlaps(p, unsafe { p.add(8) }, 16));
        assert!(!overlaps(p, unsafe { p.add(16) }, 16));
        assert!(!overlaps(p, p, 0));
    }
}
