//! The runtime's header at the start of every symmetric heap, and the
//! error reports a kernel leaves there for the host.
//!
//! | offset | bytes | what |
//! |---|---|---|
//! | 0 | 8 × [`MAX_RANKS`] | barrier slots: slot `r` holds rank `r`'s latest barrier epoch |
//! | [`EPOCH_OFFSET`] | 8 | this rank's barrier epoch (local) |
//! | [`REPORTED_OFFSET`] | 4 | nonzero once an error of this rank is recorded (host reads and clears it) |
//! | [`BLOCK_RESULT_OFFSET`] | 8 | result word of `barrier_block` |
//! | [`FAILURES_OFFSET`] | 8 | failures the ranks met on, as the host counts them (it writes it) |
//! | [`STALE_OFFSET`] | 8 | nonzero after a launch of stale all-reduce or pipeline arguments: their count plus one (host reads and clears it) |
//! | [`REPORT_OFFSET`] | [`REPORT_SLOTS`] × 96 | the [`ErrorReport`] slots (host reads and clears them) |
//!
//! User allocations start at [`HEAP_RESERVED`]; transports refuse ranges
//! that reach into the header.

/// Bytes at the start of every symmetric heap reserved for the runtime.
pub const HEAP_RESERVED: u64 = 8192;
/// Most ranks a communicator supports.
pub const MAX_RANKS: u32 = 256;
/// Offset of the barrier epoch word (local to each rank).
pub const EPOCH_OFFSET: u64 = MAX_RANKS as u64 * 8;
/// Offset of the word that says an error of this rank is recorded.
pub const REPORTED_OFFSET: u64 = EPOCH_OFFSET + 8;
/// Offset of the block-barrier result word.
pub const BLOCK_RESULT_OFFSET: u64 = EPOCH_OFFSET + 16;
/// Offset of the word counting the failures the ranks met on: the host
/// writes its count there after each (`Communicator::failures_met`, while
/// no kernel of the rank runs), and the all-reduce compares it with the
/// count its arguments were made at before it touches anything.
pub const FAILURES_OFFSET: u64 = EPOCH_OFFSET + 24;
/// Offset of the word a refused all-reduce or pipeline launch leaves (see
/// [`FAILURES_OFFSET`]): the failure count its arguments were made at, plus
/// one ([`STALE_PIPELINE`] set for a pipeline's), with the reported word set; the host turns it into
/// [`ErrorKind::Stale`]'s error when no report slot holds another.
pub const STALE_OFFSET: u64 = EPOCH_OFFSET + 32;
/// Set in [`STALE_OFFSET`]'s word when the refused launch was a
/// pipeline's (`pipeline::Pipe::run`) rather than the all-reduce's.
pub const STALE_PIPELINE: u64 = 1 << 63;
/// Offset of the first report slot.
pub const REPORT_OFFSET: u64 = EPOCH_OFFSET + 64;
/// Report slots: writers that fail at the same moment mostly pick
/// different slots, so one of them survives intact (the protocol of
/// `record`, the private function that writes them).
pub const REPORT_SLOTS: u64 = 32;
const _: () = assert!(EPOCH_OFFSET + 8 <= REPORTED_OFFSET && REPORTED_OFFSET + 4 <= BLOCK_RESULT_OFFSET);
const _: () = assert!(BLOCK_RESULT_OFFSET + 8 <= FAILURES_OFFSET && FAILURES_OFFSET + 8 <= STALE_OFFSET);
const _: () = assert!(STALE_OFFSET + 8 <= REPORT_OFFSET);
const _: () = assert!(REPORT_OFFSET.is_multiple_of(64));
const _: () = assert!(REPORT_OFFSET + REPORT_SLOTS * core::mem::size_of::<ErrorReport>() as u64 <= HEAP_RESERVED);
// The device trace's word (its rings' address) lies past the reports.
const _: () = assert!(
    REPORT_OFFSET + REPORT_SLOTS * core::mem::size_of::<ErrorReport>() as u64 <= crate::trace::TRACE_OFFSET
        && crate::trace::TRACE_OFFSET + 8 <= HEAP_RESERVED
);

u32_enum! {
    /// What went wrong ([`ErrorReport::kind`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ErrorKind {
        /// A bounded wait ran out of budget.
        Timeout = 1,
        /// A completion came back with an error (RDMA transports).
        Completion = 2,
        /// The destination rank is not in the world.
        BadPeer = 3,
        /// The range is not inside the symmetric heap (or registered memory).
        OutOfRange = 4,
        /// A signal word is not 8-byte aligned.
        Misaligned = 5,
        /// A count argument is out of its range (e.g. more than 64 signal words).
        BadCount = 6,
        /// A send queue made no progress within the budget (RDMA): the NIC
        /// consumed WQEs up to `seen`, the call needed `expected`.
        QueueStalled = 7,
        /// A part of a typed buffer reaches past the buffer: elements
        /// `[seen, seen + bytes / detail)` of a buffer of `expected` elements
        /// of `detail` bytes, at heap offset `offset`.
        OutsideBuffer = 8,
        /// A typed transfer's destination and source differ in length
        /// (`expected`: the destination's elements; `seen`: the source's).
        LengthMismatch = 9,
        /// The CPU proxy stopped at a request (its transport): `peer` is
        /// that request's peer, `seen` its ticket, `detail` the proxy's
        /// failure: its kind (`PROXY_ERR_*`) in bits 8 and up, the
        /// completion's syndrome or the refusal's reason in the low byte.
        ProxyFailed = 10,
        /// A launch whose arguments were made before a failure the ranks
        /// met on (`expected`: the failure count the arguments were made
        /// at; `seen`: the count now): it ran nothing. The kernel leaves
        /// [`STALE_OFFSET`]'s word, and the host makes the report.
        Stale = 11,
    }
}

u32_enum! {
    /// Which device call failed ([`ErrorReport::call`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Call {
        /// `put_*` (blocking).
        Put = 1,
        /// `put_nbi_*`.
        PutNbi = 2,
        /// `get_*` (blocking).
        Get = 3,
        /// `get_nbi_*`.
        GetNbi = 4,
        /// `put_signal_*`.
        PutSignal = 5,
        /// `put_signal_nbi_*`.
        PutSignalNbi = 6,
        /// `signal`.
        Signal = 7,
        /// `wait_until`.
        WaitUntil = 8,
        /// `wait_until_any`.
        WaitUntilAny = 9,
        /// `wait_until_all`.
        WaitUntilAll = 10,
        /// `wait_until_some`.
        WaitUntilSome = 11,
        /// `quiet` / `quiet_peer`.
        Quiet = 12,
        /// `barrier` / `barrier_block`.
        Barrier = 13,
        /// `Pipe::run` (the pipeline's own checks).
        Pipeline = 14,
        /// The all-reduce's own checks (`coll::allreduce::run` / `fused`).
        AllReduce = 15,
    }
}

impl Call {
    /// The call a put is: with a signal or not, non-blocking or not.
    #[inline(always)]
    pub fn put(signal: bool, nbi: bool) -> Call {
        match (signal, nbi) {
            (false, false) => Call::Put,
            (false, true) => Call::PutNbi,
            (true, false) => Call::PutSignal,
            (true, true) => Call::PutSignalNbi,
        }
    }

    /// The API name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Call::Put => "put",
            Call::PutNbi => "put_nbi",
            Call::Get => "get",
            Call::GetNbi => "get_nbi",
            Call::PutSignal => "put_signal",
            Call::PutSignalNbi => "put_signal_nbi",
            Call::Signal => "signal",
            Call::WaitUntil => "wait_until",
            Call::WaitUntilAny => "wait_until_any",
            Call::WaitUntilAll => "wait_until_all",
            Call::WaitUntilSome => "wait_until_some",
            Call::Quiet => "quiet",
            Call::Barrier => "barrier",
            Call::Pipeline => "pipeline",
            Call::AllReduce => "all-reduce",
        }
    }
}

u32_enum! {
    /// Which argument of a call a report is about ([`ErrorReport::arg`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Arg {
        /// Not about one argument (a timeout, a peer, a count).
        None = 0,
        /// Where the data lands: a put's (on the peer), a get's (here).
        Destination = 1,
        /// Where the data comes from: a put's (here), a get's (on the peer).
        Source = 2,
        /// A signal word (a signal's, a put's signal, a wait's words).
        Signal = 3,
    }
}

impl Arg {
    /// The name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Arg::None => "argument",
            Arg::Destination => "destination",
            Arg::Source => "source",
            Arg::Signal => "signal word",
        }
    }
}

/// An error of a rank's kernels, as one report slot of its heap header
/// holds it (the private `record` writes it; the host picks the earliest
/// intact one with [`first_report`] and clears the slots).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorReport {
    /// 0: empty; 1: written (stored last, after a fence).
    pub present: u32,
    /// Rank that failed.
    pub rank: u32,
    /// [`ErrorKind`] as u32.
    pub kind: u32,
    /// [`Call`] as u32.
    pub call: u32,
    /// The peer rank involved (`u32::MAX` when none; for
    /// [`ErrorKind::ProxyFailed`], the failed request's).
    pub peer: u32,
    /// Block index of the thread that failed.
    pub block: u32,
    /// Timeouts: the comparison (`Cmp` as u32). Completion errors: the
    /// syndrome. Typed-buffer errors: the element size in bytes.
    /// [`ErrorKind::ProxyFailed`]: the proxy's failure kind and low byte.
    pub detail: u32,
    /// The argument the report is about ([`Arg`] as u32).
    pub arg: u32,
    /// Offset in the symmetric heap of the word or range involved (wrapping
    /// difference from the heap base: a huge value means below the heap).
    pub offset: u64,
    /// Bytes of the range (range errors); the count (count errors).
    pub bytes: u64,
    /// Timeouts: the value expected.
    pub expected: u64,
    /// Timeouts: the value last seen. [`ErrorKind::ProxyFailed`]: the
    /// ticket of the request the proxy stopped at.
    pub seen: u64,
    /// Timeouts: the budget that ran out, ns.
    pub budget_ns: u64,
    /// `%globaltimer` when the error was recorded: the host reports the
    /// earliest of several.
    pub at_ns: u64,
    /// Who wrote it: SM and warp slot, plus one.
    pub writer: u64,
    /// [`ErrorReport::digest`] of every field above (`present` as 1): a
    /// slot two writers filled at once does not match it.
    pub check: u64,
}
const _: () = assert!(core::mem::size_of::<ErrorReport>() == 96);

impl ErrorReport {
    /// A 64-bit mix of every field but `check` (`present` taken as 1).
    #[inline(always)]
    pub fn digest(&self) -> u64 {
        let pair = |a: u32, b: u32| a as u64 | (b as u64) << 32;
        let words = [
            pair(1, self.rank),
            pair(self.kind, self.call),
            pair(self.peer, self.block),
            pair(self.detail, self.arg),
            self.offset,
            self.bytes,
            self.expected,
            self.seen,
            self.budget_ns,
            self.at_ns,
            self.writer,
        ];
        let mut h = 0x9e37_79b9_7f4a_7c15u64;
        for w in words {
            h = (h ^ w).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            h ^= h >> 31;
        }
        h
    }

    /// Written completely by one writer: present, and its check matches.
    pub fn intact(&self) -> bool {
        self.present == 1 && self.check == self.digest()
    }
}

/// What the host finds in a rank's report slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reports {
    /// No slot holds a report.
    None,
    /// The earliest intact report.
    First(ErrorReport),
    /// Reports were written, but writers that failed at the same moment
    /// overwrote each other in every one of those slots.
    Collided {
        /// Slots written.
        slots: u32,
        /// The [`ErrorKind`] and [`Call`] (as u32) every written slot
        /// names, when they all name the same (what the writers had in
        /// common, then).
        common: Option<(u32, u32)>,
    },
}

/// The earliest intact report of `slots` (by `at_ns`, then slot order).
pub fn first_report(slots: &[ErrorReport]) -> Reports {
    let mut written = slots.iter().filter(|r| r.present != 0 || r.writer != 0);
    let first = written.next().map(|r| (r.kind, r.call));
    let mut count = first.map_or(0, |_| 1);
    let mut common = first;
    for r in written {
        count += 1;
        if common != Some((r.kind, r.call)) {
            common = None;
        }
    }
    match slots.iter().filter(|r| r.intact()).min_by_key(|r| r.at_ns) {
        Some(r) => Reports::First(*r),
        None if count > 0 => Reports::Collided { slots: count, common },
        None => Reports::None,
    }
}

/// What a transport handle contributes to an error report: three scalars,
/// passed by value so that recording an error never takes the address of
/// the handle (which would copy the whole kernel parameter into local
/// memory on every call path, error or not).
///
/// Its methods are inlined and pass only scalars to the one cold function
/// that writes the report: the NVPTX ABI passes an aggregate argument or
/// result (this struct, a `CommError`) through a local-memory copy, and the
/// copy's stores would sit on the hot path of every checked call.
#[derive(Clone, Copy, Debug)]
pub struct Reporter {
    /// This rank.
    pub rank: u32,
    /// This rank's heap base (the report lives in its header).
    pub local_base: u64,
    /// The handle's spin budget, ns.
    pub budget_ns: u64,
}

impl Reporter {
    /// This rank and its heap base, for [`record`].
    #[inline(always)]
    fn writer(self) -> Writer {
        Writer {
            local_base: self.local_base,
            rank: self.rank,
        }
    }

    /// Records `e` of `call` about `arg` (the first error of the rank
    /// wins) and returns it.
    #[inline(always)]
    pub fn fail(self, e: CommError, call: Call, arg: Arg, peer: u32, offset: u64) -> CommError {
        let (kind, detail, bytes, progress) = match e {
            CommError::Timeout(t) => (ErrorKind::Timeout, 0, 0, Pair(0, t.seen)),
            CommError::Completion { syndrome, .. } => (ErrorKind::Completion, syndrome as u32, 0, Pair(0, 0)),
            CommError::BadPeer { .. } => (ErrorKind::BadPeer, 0, 0, Pair(0, 0)),
            CommError::OutOfRange { bytes, .. } => (ErrorKind::OutOfRange, 0, bytes, Pair(0, 0)),
            CommError::Misaligned { .. } => (ErrorKind::Misaligned, 0, 0, Pair(0, 0)),
            CommError::BadCount { count } => (ErrorKind::BadCount, 0, count, Pair(0, 0)),
            CommError::OutsideBuffer { start, n, len, .. } => (ErrorKind::OutsideBuffer, 0, n, Pair(len, start)),
            CommError::LengthMismatch { dst, src } => (ErrorKind::LengthMismatch, 0, 0, Pair(dst, src)),
        };
        let (what, who) = (Pair32(kind as u32, site(call, arg)), Pair32(peer, detail));
        record(self.writer(), what, who, Pair(offset, bytes), progress, self.budget_ns);
        e
    }

    /// A part of a typed buffer of `elem`-byte elements, at heap offset
    /// `offset`, reaches past its buffer: `extent` is (first element,
    /// elements, buffer length). Records the report (element size in
    /// `detail`) and returns the error.
    #[inline(always)]
    pub fn fail_part(self, call: Call, arg: Arg, peer: u32, offset: u64, extent: (u64, u64, u64), elem: u32) -> CommError {
        let (start, n, len) = extent;
        let (what, who) = (Pair32(ErrorKind::OutsideBuffer as u32, site(call, arg)), Pair32(peer, elem));
        record(
            self.writer(),
            what,
            who,
            Pair(offset, n.saturating_mul(elem as u64)),
            Pair(len, start),
            self.budget_ns,
        );
        CommError::OutsideBuffer { arg, start, n, len }
    }

    /// A typed transfer's destination (at heap offset `offset`) holds
    /// `dst` elements of `elem` bytes and its source `src`: records the
    /// report and returns the error.
    #[inline(always)]
    pub fn fail_lengths(self, call: Call, peer: u32, offset: u64, dst: u64, src: u64, elem: u32) -> CommError {
        let (what, who) = (
            Pair32(ErrorKind::LengthMismatch as u32, site(call, Arg::Destination)),
            Pair32(peer, elem),
        );
        record(
            self.writer(),
            what,
            who,
            Pair(offset, src.saturating_mul(elem as u64)),
            Pair(dst, src),
            self.budget_ns,
        );
        CommError::LengthMismatch { dst, src }
    }

    /// A wait on the word at address `at` ran out of budget: the report
    /// carries the comparison and the value expected too.
    #[inline(always)]
    pub fn fail_wait(self, t: crate::sync::Timeout, call: Call, peer: u32, at: u64, cmp: Cmp, expected: u64) -> CommError {
        let (what, who) = (Pair32(ErrorKind::Timeout as u32, site(call, Arg::Signal)), Pair32(peer, cmp as u32));
        let range = Pair(at.wrapping_sub(self.local_base), 8);
        record(self.writer(), what, who, range, Pair(expected, t.seen), self.budget_ns);
        CommError::Timeout(t)
    }

    /// The CPU proxy stopped at request `ticket` to `peer` (`detail`: see
    /// [`ErrorKind::ProxyFailed`]): records the report and returns `e`,
    /// the error the call returns.
    #[inline(always)]
    pub fn fail_proxy(self, e: CommError, call: Call, peer: u32, ticket: u64, detail: u32) -> CommError {
        let (what, who) = (Pair32(ErrorKind::ProxyFailed as u32, call as u32), Pair32(peer, detail));
        record(self.writer(), what, who, Pair(0, 0), Pair(0, ticket), self.budget_ns);
        e
    }

    /// A send queue to `peer` made no progress within the budget: its
    /// completions reached `seen`, the call needed `expected`.
    #[inline(always)]
    pub fn fail_queue(self, call: Call, peer: u32, seen: u32, expected: u32) -> CommError {
        let (what, who) = (Pair32(ErrorKind::QueueStalled as u32, call as u32), Pair32(peer, 0));
        record(
            self.writer(),
            what,
            who,
            Pair(0, 0),
            Pair(expected as u64, seen as u64),
            self.budget_ns,
        );
        CommError::Timeout(crate::sync::Timeout { seen: seen as u64 })
    }
}

// The cold functions below take their scalars in pairs: a struct of two
// scalars is passed as two registers, while a larger aggregate would go
// through a local-memory copy on the caller's side (see [`Reporter`]).

/// Whose report it is: this rank's heap base and rank.
#[derive(Clone, Copy)]
struct Writer {
    local_base: u64,
    rank: u32,
}

/// Two 32-bit fields of a report: (kind, [`site`]) or (peer, detail); for
/// [`reject`], (site, peer).
#[derive(Clone, Copy)]
struct Pair32(u32, u32);

/// A call and the argument a report is about, in one scalar (the call in
/// the low 16 bits): [`record`] writes them to their own fields.
#[inline(always)]
fn site(call: Call, arg: Arg) -> u32 {
    call as u32 | (arg as u32) << 16
}

/// Two 64-bit fields of a report: (offset, bytes) or (expected, seen).
#[derive(Clone, Copy)]
struct Pair(u64, u64);

/// What a range is checked against: the world's size and the heap's.
#[derive(Clone, Copy)]
struct Limits {
    world: u32,
    heap_bytes: u64,
}

/// Records an error of this rank in its heap header (at `local_base`),
/// unless one is recorded already (the first error wins). Scalars only,
/// fields written in place: nothing of the report passes through local
/// memory.
///
/// No read-modify-write atomic claims the record, and nothing here reads a
/// lane's identity (`%laneid`, `%tid`, `activemask`), on purpose: ptxas
/// compiles a loop that can reach either for intra-warp forward progress,
/// with a `YIELD` in its poll loops and convergence barriers
/// (`BSSY`/`BSYNC`) around its branches. The failing branches of the
/// checked calls stay inside the caller's loops (LLVM does not thread jumps
/// on a GPU target, so the `Result`'s tag is tested again after each
/// call), so a CAS claim here put those on every hot path: about 30 ns per
/// call of a signal round trip on an H200 (`p2p_bench`). Instead:
///
/// * the slot is picked by the report's check, a hash of every field, the
///   SM and warp slot of the writer included: warps resident at one moment
///   differ in SM or warp slot, and lanes of one warp that fail together
///   differ in some field (lanes that fail alike write the same values in
///   lockstep); a slot another writer has started (`writer` set) is left
///   to it;
/// * the report carries a check of its fields ([`ErrorReport::digest`]):
///   a slot two writers filled at once fails it, and the host takes the
///   earliest intact slot ([`first_report`]);
/// * once a report is published (fields, fence, `present`, then the
///   header's reported word), later errors leave the slots alone.
#[cold]
#[inline(never)]
fn record(w: Writer, what: Pair32, who: Pair32, range: Pair, progress: Pair, budget_ns: u64) {
    use crate::ptx;
    let Writer { local_base, rank } = w;
    let (Pair32(kind, site), Pair32(peer, detail)) = (what, who);
    let (call, arg) = (site & 0xffff, site >> 16);
    let Pair(offset, bytes) = range;
    let Pair(expected, seen) = progress;
    let reported = (local_base + REPORTED_OFFSET) as *mut u32;
    crate::trace::hook! { crate::trace::instant(1, local_base, crate::trace::What::Error, peer, kind as u64); }
    // SAFETY: the reported word and the slots lie in the reserved header of
    // this rank's heap; the words other threads poll are accessed atomically.
    unsafe {
        if ptx::ld_relaxed_sys_u32(reported) != 0 {
            return;
        }
        let (sm, warp) = ptx::sm_and_warp_slot();
        let mut r = ErrorReport {
            present: 1,
            rank,
            kind,
            call,
            peer,
            block: ptx::block_idx_x(),
            detail,
            arg,
            offset,
            bytes,
            expected,
            seen,
            budget_ns,
            at_ns: ptx::globaltimer_ns(),
            writer: ((sm as u64) << 32 | warp as u64) + 1,
            check: 0,
        };
        r.check = r.digest();
        let slot = r.check.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 59;
        const _: () = assert!(REPORT_SLOTS == 32);
        let at = (local_base + REPORT_OFFSET + slot * core::mem::size_of::<ErrorReport>() as u64) as *mut ErrorReport;
        use core::ptr::{addr_of_mut, write_volatile};
        if ptx::ld_relaxed_sys_u64(addr_of_mut!((*at).writer)) != 0 {
            return;
        }
        write_volatile(addr_of_mut!((*at).writer), r.writer);
        write_volatile(addr_of_mut!((*at).rank), r.rank);
        write_volatile(addr_of_mut!((*at).kind), r.kind);
        write_volatile(addr_of_mut!((*at).call), r.call);
        write_volatile(addr_of_mut!((*at).peer), r.peer);
        write_volatile(addr_of_mut!((*at).block), r.block);
        write_volatile(addr_of_mut!((*at).detail), r.detail);
        write_volatile(addr_of_mut!((*at).arg), r.arg);
        write_volatile(addr_of_mut!((*at).offset), r.offset);
        write_volatile(addr_of_mut!((*at).bytes), r.bytes);
        write_volatile(addr_of_mut!((*at).expected), r.expected);
        write_volatile(addr_of_mut!((*at).seen), r.seen);
        write_volatile(addr_of_mut!((*at).budget_ns), r.budget_ns);
        write_volatile(addr_of_mut!((*at).at_ns), r.at_ns);
        write_volatile(addr_of_mut!((*at).check), r.check);
        ptx::fence_sc_sys();
        ptx::st_release_sys_u32(addr_of_mut!((*at).present), 1);
        ptx::st_release_sys_u32(reported, 1);
    }
}

/// The argument checks every transport makes, once per call: a peer inside
/// the world, a range inside the heap's user part, an aligned signal word.
/// A failed check records its report and returns the error before anything
/// is written.
#[derive(Clone, Copy, Debug)]
pub struct HeapBounds {
    /// Who records a failure.
    pub reporter: Reporter,
    /// Ranks in the world.
    pub world: u32,
    /// Heap size in bytes, header included.
    pub heap_bytes: u64,
}

impl HeapBounds {
    /// `peer < world` and `[local, local + bytes)` inside the user part of
    /// the heap; returns the offset of `local`.
    #[inline(always)]
    pub fn range(self, call: Call, arg: Arg, local: u64, bytes: u64, peer: u32) -> Result<u64, CommError> {
        self.checked(call, arg, local, bytes, peer, 1)
    }

    /// [`Self::range`] for an 8-byte signal word, which must be aligned.
    #[inline(always)]
    pub fn signal(self, call: Call, sig: u64, peer: u32) -> Result<u64, CommError> {
        self.checked(call, Arg::Signal, sig, 8, peer, 8)
    }

    /// A get's local destination `[local, local + bytes)` must not overlap
    /// this rank's reserved header (error reports, epochs, block results):
    /// a get there would overwrite it. Anywhere else is the caller's
    /// contract (the heap's user part, or other device memory).
    #[inline(always)]
    pub fn local_dst(self, call: Call, local: u64, bytes: u64, peer: u32) -> Result<(), CommError> {
        let base = self.reporter.local_base;
        let hits_header = (bytes != 0) & (local < base.saturating_add(HEAP_RESERVED)) & (local.saturating_add(bytes) > base);
        if hits_header {
            return Err(self.rejected(call, Arg::Destination, local.wrapping_sub(base), bytes, peer));
        }
        Ok(())
    }

    /// All of a call's conditions folded into one predicate (`|`, not
    /// `||`) and one branch, taken only by a bad argument. Which condition
    /// failed is worked out out of line ([`reject`]): one cold call site
    /// per checked call, instead of one inlined report per condition whose
    /// arguments and error values the compiler kept on the hot path.
    #[inline(always)]
    fn checked(self, call: Call, arg: Arg, local: u64, bytes: u64, peer: u32, align: u64) -> Result<u64, CommError> {
        let off = local.wrapping_sub(self.reporter.local_base);
        let bad = (peer >= self.world)
            | (off < HEAP_RESERVED)
            | (off > self.heap_bytes)
            | (bytes > self.heap_bytes.wrapping_sub(off))
            | (off & (align - 1) != 0);
        if bad {
            return Err(self.rejected(call, arg, off, bytes, peer));
        }
        Ok(off)
    }

    /// The cold half of [`Self::checked`]: [`reject`] records the report
    /// and says which error it was; the error is built here from the
    /// scalars at hand (scalars in, a scalar out: nothing passes through
    /// local memory).
    #[inline(always)]
    fn rejected(self, call: Call, arg: Arg, off: u64, bytes: u64, peer: u32) -> CommError {
        let r = self.reporter;
        let limits = Limits {
            world: self.world,
            heap_bytes: self.heap_bytes,
        };
        let kind = reject(r.writer(), r.budget_ns, limits, Pair32(site(call, arg), peer), Pair(off, bytes));
        if kind == ErrorKind::BadPeer as u32 {
            CommError::BadPeer { peer }
        } else if kind == ErrorKind::OutOfRange as u32 {
            CommError::OutOfRange { offset: off, bytes }
        } else {
            CommError::Misaligned { offset: off }
        }
    }
}

/// Which of [`HeapBounds::checked`]'s conditions failed, in the order the
/// reports have always named them (peer, then range, then alignment — the
/// only one left when the first two hold); records the report and returns
/// the [`ErrorKind`] as u32. Out of line and cold: only a bad argument
/// gets here.
#[cold]
#[inline(never)]
fn reject(w: Writer, budget_ns: u64, limits: Limits, call_peer: Pair32, range: Pair) -> u32 {
    let Limits { world, heap_bytes } = limits;
    let Pair32(site, peer) = call_peer;
    let Pair(off, bytes) = range;
    let (kind, report_bytes) = if peer >= world {
        (ErrorKind::BadPeer, 0)
    } else if off < HEAP_RESERVED || off > heap_bytes || bytes > heap_bytes - off {
        (ErrorKind::OutOfRange, bytes)
    } else {
        (ErrorKind::Misaligned, 0)
    };
    record(
        w,
        Pair32(kind as u32, site),
        Pair32(peer, 0),
        Pair(off, report_bytes),
        Pair(0, 0),
        budget_ns,
    );
    kind as u32
}

/// A transport handle's argument checks and error reports, written once:
/// a handle says where its heap is ([`Checked::bounds`]); the rest follows.
pub trait Checked {
    /// This rank's heap, world and report scalars.
    fn bounds(&self) -> HeapBounds;

    /// Whether the device trace's hooks look for trace rings
    /// (`crate::trace`): nonzero, and each hook reads the heap header's
    /// trace word. A handle that carries the host's answer in a kernel
    /// parameter (the P2P handle) costs nothing on its hot paths when
    /// tracing is off; the default looks every time.
    #[inline(always)]
    fn traced(&self) -> u32 {
        1
    }

    /// Records the first error of this rank and returns it.
    #[inline(always)]
    fn fail(&self, e: CommError, call: Call, arg: Arg, peer: u32, offset: u64) -> CommError {
        self.bounds().reporter.fail(e, call, arg, peer, offset)
    }

    /// A wait on the word at address `at` ran out of budget.
    #[inline(always)]
    fn fail_wait(&self, t: crate::sync::Timeout, call: Call, peer: u32, at: u64, cmp: Cmp, expected: u64) -> CommError {
        self.bounds().reporter.fail_wait(t, call, peer, at, cmp, expected)
    }

    /// [`HeapBounds::range`].
    #[inline(always)]
    fn check_range(&self, call: Call, arg: Arg, local: u64, bytes: u64, peer: u32) -> Result<u64, CommError> {
        self.bounds().range(call, arg, local, bytes, peer)
    }

    /// [`HeapBounds::local_dst`].
    #[inline(always)]
    fn check_local_dst(&self, call: Call, local: u64, bytes: u64, peer: u32) -> Result<(), CommError> {
        self.bounds().local_dst(call, local, bytes, peer)
    }

    /// [`HeapBounds::signal`].
    #[inline(always)]
    fn check_signal(&self, call: Call, sig: u64, peer: u32) -> Result<u64, CommError> {
        self.bounds().signal(call, sig, peer)
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    use super::*;
    use CommError;

    const HEAP: u64 = 2 * HEAP_RESERVED;

    /// Runs `f` as one emulated thread (the report records its block index)
    /// against a heap of `HEAP` bytes in host memory; returns what `f`
    /// returned, the report the host would take and the slots written.
    fn with_heap<R: Send>(f: impl Fn(HeapBounds) -> R + Sync) -> (R, ErrorReport, usize) {
        let heap = vec![0u64; (HEAP / 8) as usize];
        let base = heap.as_ptr() as u64;
        let bounds = HeapBounds {
            reporter: Reporter {
                rank: 1,
                local_base: base,
                budget_ns: 5,
            },
            world: 2,
            heap_bytes: HEAP,
        };
        let out = std::sync::Mutex::new(None);
        let launch = crate::emu::EmuLaunch {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem_bytes: 0,
        };
        crate::emu::run(launch, &|| *out.lock().unwrap() = Some(f(bounds))).unwrap();
        // SAFETY: the slots lie inside the heap; the launch has ended.
        let slots = unsafe { core::slice::from_raw_parts((base + REPORT_OFFSET) as *const ErrorReport, REPORT_SLOTS as usize) };
        let written = slots.iter().filter(|r| r.present != 0).count();
        let first = match first_report(slots) {
            Reports::First(r) => r,
            Reports::None => ErrorReport::default(),
            Reports::Collided { slots, .. } => panic!("{slots} report slots written, none intact"),
        };
        (out.into_inner().unwrap().unwrap(), first, written)
    }

    #[test]
    fn good_arguments_pass_and_record_nothing() {
        let (r, report, written) = with_heap(|b| {
            let base = b.reporter.local_base;
            (
                b.signal(Call::Signal, base + HEAP - 8, 1),
                b.range(Call::Put, Arg::Destination, base + HEAP_RESERVED, HEAP - HEAP_RESERVED, 0),
                b.range(Call::Put, Arg::Destination, base + HEAP, 0, 1),
            )
        });
        assert_eq!(r, (Ok(HEAP - 8), Ok(HEAP_RESERVED), Ok(HEAP)));
        assert_eq!((report, written), (ErrorReport::default(), 0));
    }

    #[test]
    fn a_bad_peer_is_named_before_a_bad_range_or_alignment() {
        // Peer, range (into the header) and alignment all wrong: the peer is reported.
        let (r, report, _) = with_heap(|b| b.signal(Call::Signal, b.reporter.local_base + 12, 2));
        assert_eq!(r, Err(CommError::BadPeer { peer: 2 }));
        assert_eq!(
            (report.present, report.rank, report.kind, report.call, report.peer),
            (1, 1, ErrorKind::BadPeer as u32, Call::Signal as u32, 2)
        );
        assert_eq!((report.offset, report.bytes, report.budget_ns), (12, 0, 5));
    }

    #[test]
    fn a_bad_range_is_named_before_alignment() {
        for (off, bytes) in [(12, 8), (HEAP - 4, 8), (HEAP + 8, 8), (u64::MAX - 3, 8)] {
            let (r, report, _) =
                with_heap(|b| b.range(Call::PutSignal, Arg::Destination, b.reporter.local_base.wrapping_add(off), bytes, 1));
            assert_eq!(r, Err(CommError::OutOfRange { offset: off, bytes }), "offset {off}");
            assert_eq!(
                (report.kind, report.call, report.arg, report.peer),
                (ErrorKind::OutOfRange as u32, Call::PutSignal as u32, Arg::Destination as u32, 1)
            );
            assert_eq!((report.offset, report.bytes), (off, bytes), "offset {off}");
        }
        let (r, _, _) = with_heap(|b| b.range(Call::Put, Arg::Destination, b.reporter.local_base + HEAP_RESERVED + 8, HEAP, 0));
        assert_eq!(
            r,
            Err(CommError::OutOfRange {
                offset: HEAP_RESERVED + 8,
                bytes: HEAP
            })
        );
    }

    #[test]
    fn a_misaligned_signal_inside_the_heap_is_named_and_the_first_error_stays() {
        let off = HEAP_RESERVED + 4;
        let (r, report, written) = with_heap(|b| {
            let base = b.reporter.local_base;
            let first = b.signal(Call::WaitUntil, base + off, 0);
            let second = b.range(Call::Get, Arg::Destination, base, 8, 3);
            (first, second)
        });
        assert_eq!(r, (Err(CommError::Misaligned { offset: off }), Err(CommError::BadPeer { peer: 3 })));
        assert_eq!(
            (report.kind, report.call, report.arg, report.peer, report.offset, report.bytes),
            (ErrorKind::Misaligned as u32, Call::WaitUntil as u32, Arg::Signal as u32, 0, off, 0)
        );
        assert_eq!(written, 1, "the second error left the slots alone");
    }

    /// An intact report of `kind` at `at_ns` written by `writer`.
    fn report(kind: ErrorKind, at_ns: u64, writer: u64) -> ErrorReport {
        let mut r = ErrorReport {
            present: 1,
            rank: 3,
            kind: kind as u32,
            call: Call::Signal as u32,
            peer: 1,
            offset: 0x2000 + writer,
            at_ns,
            writer,
            ..ErrorReport::default()
        };
        r.check = r.digest();
        r
    }

    #[test]
    fn the_host_takes_the_earliest_intact_report_and_skips_mixed_ones() {
        let early = report(ErrorKind::Timeout, 100, 1);
        let late = report(ErrorKind::BadPeer, 200, 2);
        // A slot two writers filled at once: the first's fields, the second's check.
        let mut mixed = report(ErrorKind::OutOfRange, 50, 3);
        mixed.check = report(ErrorKind::Misaligned, 51, 4).check;
        let mut slots = [ErrorReport::default(); REPORT_SLOTS as usize];
        assert_eq!(first_report(&slots), Reports::None);
        (slots[3], slots[9], slots[20]) = (late, mixed, early);
        assert_eq!(first_report(&slots), Reports::First(early));
        // One field of another writer is enough to spoil a slot.
        slots[20].seen = 7;
        assert_eq!(first_report(&slots), Reports::First(late));
        slots[3].block = 1;
        assert_eq!(first_report(&slots), Reports::Collided { slots: 3, common: None });
        // Spoiled slots that agree on kind and call say so.
        let mut a = report(ErrorKind::Timeout, 1, 5);
        let mut b = report(ErrorKind::Timeout, 2, 6);
        (a.seen, b.offset) = (1, 2);
        assert_eq!(
            first_report(&[a, b, ErrorReport::default()]),
            Reports::Collided {
                slots: 2,
                common: Some((ErrorKind::Timeout as u32, Call::Signal as u32))
            }
        );
    }
}

u32_enum! {
    /// Comparison for the `wait_until*` calls.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Cmp {
        /// `==`
        Eq = 0,
        /// `!=`
        Ne = 1,
        /// `>`
        Gt = 2,
        /// `>=`
        Ge = 3,
        /// `<`
        Lt = 4,
        /// `<=`
        Le = 5,
    }
}

impl Cmp {
    /// Applies the comparison.
    #[inline(always)]
    pub fn holds(self, seen: u64, value: u64) -> bool {
        match self {
            Cmp::Eq => seen == value,
            Cmp::Ne => seen != value,
            Cmp::Gt => seen > value,
            Cmp::Ge => seen >= value,
            Cmp::Lt => seen < value,
            Cmp::Le => seen <= value,
        }
    }
    /// The operator, for messages (`==`, `>=`, ...).
    pub fn symbol(self) -> &'static str {
        match self {
            Cmp::Eq => "==",
            Cmp::Ne => "!=",
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
            Cmp::Lt => "<",
            Cmp::Le => "<=",
        }
    }
}

/// Why a device call failed. The first error of a rank is also recorded in
/// its heap header for the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommError {
    /// A bounded wait ran out of budget (the report says which word).
    Timeout(crate::sync::Timeout),
    /// A completion came back with an error (RDMA): the peer and the
    /// completion's syndrome.
    Completion {
        /// The peer of the failed operation.
        peer: u32,
        /// The completion's syndrome byte.
        syndrome: u8,
    },
    /// `peer` is not a rank of this world.
    BadPeer {
        /// The rank asked for.
        peer: u32,
    },
    /// `[offset, offset + bytes)` is not inside the symmetric heap (or the
    /// registered memory the call needs).
    OutOfRange {
        /// Offset from the heap base (wrapping: huge when below it).
        offset: u64,
        /// Bytes of the range.
        bytes: u64,
    },
    /// A signal word that is not 8-byte aligned.
    Misaligned {
        /// Its offset from the heap base.
        offset: u64,
    },
    /// A count out of range (e.g. more than 64 words for a wait).
    BadCount {
        /// The count given.
        count: u64,
    },
    /// A [`Part`](crate::transport::Part) reaches past its buffer: elements `start .. start + n`
    /// of a buffer of `len`.
    OutsideBuffer {
        /// Which argument.
        arg: Arg,
        /// First element asked for.
        start: u64,
        /// Elements asked for.
        n: u64,
        /// The buffer's length.
        len: u64,
    },
    /// A typed transfer's destination and source differ in length.
    LengthMismatch {
        /// Elements of the destination.
        dst: u64,
        /// Elements of the source.
        src: u64,
    },
}

// A `CommError` as words, for warp-wide calls.
mod words;
