//! The device trace: what a kernel's transport calls and pipelines did,
//! and when, in ring buffers the host reads after the launch.
//!
//! Every traced call writes a span (a begin and an end event) or an instant
//! event: an [`Event`] of `(%globaltimer, what, block, peer, argument)` in
//! the ring of its warp. The host (`doorbell::trace`) turns the rings of
//! every rank into one Chrome trace (Perfetto) and a text summary.
//!
//! **Off by default, and then free.**
//! * On the GPU, the hooks exist only in kernels built with this crate's
//!   `trace` feature. Without it [`span`], [`instant`] and [`Span::end`]
//!   are empty functions of plain scalars: the PTX is the PTX of a build
//!   without them (the PTX tests compare the two builds).
//! * With the feature, a hook first tests the handle's trace word (the P2P
//!   handle's `trace`, a kernel parameter; handles without one pass 1),
//!   then reads one word of the rank's heap header ([`TRACE_OFFSET`]): 0
//!   (the host has not turned tracing on) and the hook does nothing more.
//!   The recorder is still part of the kernel, though, and it costs even
//!   when no event is written: it holds values that differ from lane to
//!   lane (`%tid`, `%laneid`, the slot its atomic add returns), and ptxas
//!   then compiles the whole entry, the recorder's callers included, as
//!   code whose lanes may diverge. A kernel whose own code is the same in
//!   every lane (one thread doing `signal` and `wait_until`, as the P2P
//!   benchmark's signal round trip) loses ptxas's uniform mode there:
//!   convergence barriers (BSSY/BSYNC, BREAK) around its branches, a YIELD
//!   in each spin loop, values in vector instead of uniform registers.
//!   Kernels whose threads already differ (copies, anything indexed by the
//!   thread) are compiled that way in both builds. Hence doorbell's build
//!   helper, with `DOORBELL_TRACE_KERNELS=1`, builds each kernel crate both
//!   with and without this feature, and the host loads the image with the
//!   hooks only while tracing is requested (`doorbell::ModuleImage`):
//!   tracing off runs the code of a build without them.
//! * On the emulator the hooks are always compiled in (the same one-word
//!   test), so tracing works with no rebuild.
//!
//! **The rings.** The word at [`TRACE_OFFSET`] holds the address of a
//! [`TraceHeader`], followed by `rings` counters (u32, one per ring) and
//! `rings * capacity` events. A warp's ring is its global warp index modulo
//! `rings`; a writer claims a slot with an atomic add on the ring's counter
//! and keeps the last `capacity` events of a ring (the host counts the
//! ones overwritten). Warps that share a ring share its counter: nothing is
//! lost but old events.

use crate::ptx;

/// Offset in the heap header of the word holding the trace rings' address
/// (0: tracing off).
pub const TRACE_OFFSET: u64 = 8128;

/// Bytes of one event in a ring.
pub const EVENT_BYTES: u64 = 32;

/// The start of the trace memory (what [`TRACE_OFFSET`] points at).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceHeader {
    /// Number of rings (a power of two).
    pub rings: u32,
    /// Events each ring keeps (a power of two).
    pub capacity: u32,
    /// The rank the memory belongs to (the host checks it when reading).
    pub rank: u32,
    /// Reserved, zero.
    pub _pad: u32,
}

/// Bytes from the [`TraceHeader`] to the first counter.
pub const COUNTERS_AT: u64 = 64;

/// Bytes of trace memory for `rings` rings of `capacity` events.
pub const fn trace_bytes(rings: u32, capacity: u32) -> u64 {
    events_at(rings) + rings as u64 * capacity as u64 * EVENT_BYTES
}

/// Offset of the first event: after the counters, 64-byte aligned.
pub const fn events_at(rings: u32) -> u64 {
    (COUNTERS_AT + rings as u64 * 4).div_ceil(64) * 64
}

/// One event as a ring holds it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// `%globaltimer` (emulator: nanoseconds since the process's first
    /// read).
    pub at_ns: u64,
    /// [`What`] as u16 in the low half; the thread's lane and warp in
    /// block in the high half (`lane | warp << 5`, 5 + 11 bits).
    pub what: u32,
    /// Block index.
    pub block: u32,
    /// The peer involved (`u32::MAX`: none).
    pub peer: u32,
    /// Reserved, zero.
    pub _pad: u32,
    /// What the event carries: bytes, a sequence number, a word's offset,
    /// a queue index (see [`What`]).
    pub arg: u64,
}
const _: () = assert!(core::mem::size_of::<Event>() as u64 == EVENT_BYTES);

/// The end of a span: [`What`] with this bit set.
pub const END: u16 = 0x8000;

/// What an event is. Spans have a begin event (the value) and an end event
/// (the value | [`END`]); the rest are instants.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    /// Span: a pipeline's producer computes a chunk (arg: the chunk's
    /// sequence number).
    Produce = 1,
    /// Span: a pipeline's consumer uses a received chunk (arg: sequence).
    Consume = 2,
    /// Span: a put (arg: bytes).
    Put = 3,
    /// Span: a put with a signal (arg: bytes).
    PutSignal = 4,
    /// Span: a get (arg: bytes).
    Get = 5,
    /// Span: a signal (arg: the word's heap offset).
    Signal = 6,
    /// Span: a wait on signal words (arg: the first word's heap offset;
    /// the end event's arg: the value seen).
    Wait = 7,
    /// Span: a barrier across ranks.
    Barrier = 8,
    /// Span: a quiet (arg: the peer, or `u64::MAX` for all).
    Quiet = 9,
    /// Span: a pipeline's producer waits for a free slot (arg: sequence).
    Acquire = 10,
    /// Span: a pipeline's consumer waits for a chunk (arg: sequence).
    Arrive = 11,
    /// Instant: WQEs written into a send queue (arg: how many).
    WqePosted = 32,
    /// Instant: a doorbell rung (arg: the producer index written).
    Doorbell = 33,
    /// Instant: completions seen (arg: the consumer index reached).
    Completion = 34,
    /// Instant: a call failed (arg: [`crate::heap::ErrorKind`] as u64).
    Error = 35,
    /// Instant: the soft NIC's engine took a WQE from a send queue (arg:
    /// its WQE index; block: [`ENGINE_BLOCK`]).
    NicFetch = 36,
    /// Instant: the soft NIC's engine executed a WQE, before its CQE (arg:
    /// its bytes; peer: the responder's port; block: [`ENGINE_BLOCK`]).
    NicExecute = 37,
    /// Instant: the soft NIC's engine wrote a requester CQE (arg: the CQ's
    /// producer index after it; block: [`ENGINE_BLOCK`]).
    NicCqe = 38,
    /// Instant: the soft NIC's engine saw a QP's doorbell, in the pass
    /// that starts its WQEs (arg: the doorbell word's new value; block:
    /// [`ENGINE_BLOCK`]). With the poster's [`What::Doorbell`], how long
    /// the engine took to notice it.
    NicDoorbell = 39,
    /// Instant: the soft NIC's engine, idle, saw a doorbell word or a
    /// responder event move and starts a full pass (arg: the idle passes
    /// before it; block: [`ENGINE_BLOCK`]).
    NicWake = 40,
}

/// The block of the events the soft NIC's engine writes
/// ([`record_engine`]): a track of their own, apart from the kernels'
/// blocks.
pub const ENGINE_BLOCK: u32 = u32::MAX;

impl What {
    /// From the low 15 bits of an event's `what`.
    pub fn from_u16(v: u16) -> Option<What> {
        Some(match v & !END {
            1 => What::Produce,
            2 => What::Consume,
            3 => What::Put,
            4 => What::PutSignal,
            5 => What::Get,
            6 => What::Signal,
            7 => What::Wait,
            8 => What::Barrier,
            9 => What::Quiet,
            10 => What::Acquire,
            11 => What::Arrive,
            32 => What::WqePosted,
            33 => What::Doorbell,
            34 => What::Completion,
            35 => What::Error,
            36 => What::NicFetch,
            37 => What::NicExecute,
            38 => What::NicCqe,
            39 => What::NicDoorbell,
            40 => What::NicWake,
            _ => return None,
        })
    }

    /// The name shown in a trace viewer.
    pub fn name(self) -> &'static str {
        match self {
            What::Produce => "produce",
            What::Consume => "consume",
            What::Put => "put",
            What::PutSignal => "put_signal",
            What::Get => "get",
            What::Signal => "signal",
            What::Wait => "wait",
            What::Barrier => "barrier",
            What::Quiet => "quiet",
            What::Acquire => "acquire slot",
            What::Arrive => "wait for chunk",
            What::WqePosted => "WQEs posted",
            What::Doorbell => "doorbell",
            What::Completion => "completion",
            What::Error => "error",
            What::NicFetch => "NIC: WQE fetched",
            What::NicExecute => "NIC: WQE executed",
            What::NicCqe => "NIC: CQE written",
            What::NicDoorbell => "NIC: doorbell seen",
            What::NicWake => "NIC: woke",
        }
    }

    /// A span (begin and end events) rather than an instant.
    pub fn is_span(self) -> bool {
        (self as u16) < 32
    }
}

/// Whether this build records events at all (the emulator always; PTX with
/// the `trace` feature).
pub const COMPILED: bool = cfg!(any(feature = "trace", not(target_arch = "nvptx64")));

/// The library's hook sites: `hook! { statements }` expands to the
/// statements where the hooks are compiled in ([`COMPILED`]) and to nothing
/// at all otherwise, arguments included, so a PTX build without the
/// `trace` feature is the PTX of the code without the hooks. (Empty hook
/// functions were not enough: LLVM reshaped the kernels around the dead
/// calls.)
#[cfg(any(feature = "trace", not(target_arch = "nvptx64")))]
macro_rules! hook {
    ($($t:tt)*) => { $($t)* };
}
/// See the other definition.
#[cfg(not(any(feature = "trace", not(target_arch = "nvptx64"))))]
macro_rules! hook {
    ($($t:tt)*) => {};
}
pub(crate) use hook;

/// The crate's own `hook!` for the other kernel crates (the soft NIC's engine):
/// `doorbell_kernels::trace_hook! { statements }` is the statements where
/// this crate's hooks are compiled in ([`COMPILED`]), nothing otherwise.
#[cfg(any(feature = "trace", not(target_arch = "nvptx64")))]
#[macro_export]
macro_rules! trace_hook {
    ($($t:tt)*) => { $($t)* };
}
/// See the other definition.
#[cfg(not(any(feature = "trace", not(target_arch = "nvptx64"))))]
#[macro_export]
macro_rules! trace_hook {
    ($($t:tt)*) => {};
}

/// `around!({ before } expr, |r| { after })`: `expr` with hook statements
/// before and after it (`r` names its value for them) where the hooks are
/// compiled in; `expr` alone, as written, otherwise.
#[cfg(any(feature = "trace", not(target_arch = "nvptx64")))]
macro_rules! around {
    ({ $($pre:tt)* } $e:expr, |$r:ident| { $($post:tt)* }) => {{
        $($pre)*
        let $r = $e;
        $($post)*
        $r
    }};
}
/// See the other definition.
#[cfg(not(any(feature = "trace", not(target_arch = "nvptx64"))))]
macro_rules! around {
    ({ $($pre:tt)* } $e:expr, |$r:ident| { $($post:tt)* }) => {
        $e
    };
}
pub(crate) use around;

/// An open span: [`Span::end`] writes its end event. Scalars only (no
/// address taken on any path).
#[derive(Clone, Copy, Debug)]
pub struct Span {
    /// The trace memory (0: not tracing), read once at the begin.
    rings: u64,
    what: u16,
    peer: u32,
}

/// Begins a span of `what` on the rank whose heap starts at `local_base`
/// and writes its begin event, when tracing is on. `on` is the handle's
/// word ([`crate::heap::Checked::traced`]): 0 and nothing is read at all
/// (a kernel parameter test: free on the hot path); else the heap header
/// says whether and where.
#[inline(always)]
pub fn span(on: u32, local_base: u64, what: What, peer: u32, arg: u64) -> Span {
    let rings = if COMPILED && on != 0 { rings_of(local_base) } else { 0 };
    if rings != 0 {
        trace_record(rings, what as u16, peer, arg);
    }
    Span {
        rings,
        what: what as u16,
        peer,
    }
}

impl Span {
    /// Ends the span; `arg` goes with the end event.
    #[inline(always)]
    pub fn end(self, arg: u64) {
        if COMPILED && self.rings != 0 {
            trace_record(self.rings, self.what | END, self.peer, arg);
        }
    }
}

/// Writes an instant event when tracing is on (`on` as for [`span`]).
#[inline(always)]
pub fn instant(on: u32, local_base: u64, what: What, peer: u32, arg: u64) {
    if COMPILED && on != 0 {
        let rings = rings_of(local_base);
        if rings != 0 {
            trace_record(rings, what as u16, peer, arg);
        }
    }
}

/// The trace memory's address from the heap header (0: off).
#[inline(always)]
fn rings_of(local_base: u64) -> u64 {
    // SAFETY: the word lies in the reserved header of this rank's heap,
    // written by the host only while no kernel runs: a plain load, which
    // the caches keep and the compiler may share between hooks.
    unsafe { core::ptr::read((local_base + TRACE_OFFSET) as *const u64) }
}

/// Appends one event to the calling warp's ring.
#[cold]
#[inline(never)]
fn trace_record(trace: u64, what: u16, peer: u32, arg: u64) {
    // SAFETY: `trace` is the host's trace memory: a header, `rings`
    // counters and `rings * capacity` events (`TraceHeader`).
    unsafe {
        let h = core::ptr::read_volatile(trace as *const TraceHeader);
        let (rings, cap) = (h.rings.max(1), h.capacity.max(1));
        let (tid, lane) = (ptx::thread_rank_in_block(), ptx::lane_id());
        let warp_in_block = tid / 32;
        let warps = ptx::block_dim_x().div_ceil(32);
        let block = ptx::block_idx_x();
        let ring = (block.wrapping_mul(warps).wrapping_add(warp_in_block)) & (rings - 1);
        let counter = (trace + COUNTERS_AT + ring as u64 * 4) as *mut u32;
        let n = ptx::atom_add_relaxed_gpu_u32(counter, 1);
        let slot = (n & (cap - 1)) as u64;
        let e = (trace + events_at(rings) + (ring as u64 * cap as u64 + slot) * EVENT_BYTES) as *mut Event;
        let at = ptx::globaltimer_ns();
        write_event(
            e,
            Event {
                at_ns: at,
                what: what as u32 | (lane | (warp_in_block & 0x7ff) << 5) << 16,
                block,
                peer,
                _pad: 0,
                arg,
            },
        );
    }
}

/// Writes `ev` to the ring slot `e`, one volatile store per field, straight
/// from registers. (A volatile store of the whole struct went through a
/// copy in local memory: a 32-byte stack frame in every kernel with hooks,
/// and its pointer set up at each entry.)
///
/// # Safety
/// `e` is an event slot of the trace memory.
#[inline(always)]
unsafe fn write_event(e: *mut Event, ev: Event) {
    // SAFETY: the caller's contract; the fields lie within the slot.
    unsafe {
        core::ptr::write_volatile(&raw mut (*e).at_ns, ev.at_ns);
        core::ptr::write_volatile(&raw mut (*e).what, ev.what);
        core::ptr::write_volatile(&raw mut (*e).block, ev.block);
        core::ptr::write_volatile(&raw mut (*e).peer, ev.peer);
        core::ptr::write_volatile(&raw mut (*e)._pad, ev._pad);
        core::ptr::write_volatile(&raw mut (*e).arg, ev.arg);
    }
}

/// Appends one event of the soft NIC's engine to the last ring of the
/// trace memory at `trace` (a [`TraceHeader`]; the engine finds it through
/// its rank's heap header): block [`ENGINE_BLOCK`], lane and warp 0. Any
/// thread, on the GPU or a host thread of the emulator.
#[cold]
#[inline(never)]
pub fn record_engine(trace: u64, what: What, peer: u32, arg: u64) {
    // SAFETY: `trace` is the host's trace memory: a header, `rings`
    // counters and `rings * capacity` events (`TraceHeader`).
    unsafe {
        let h = core::ptr::read_volatile(trace as *const TraceHeader);
        let (rings, cap) = (h.rings.max(1), h.capacity.max(1));
        let ring = rings - 1;
        let counter = (trace + COUNTERS_AT + ring as u64 * 4) as *mut u32;
        let n = ptx::atom_add_relaxed_gpu_u32(counter, 1);
        let slot = (n & (cap - 1)) as u64;
        let e = (trace + events_at(rings) + (ring as u64 * cap as u64 + slot) * EVENT_BYTES) as *mut Event;
        write_event(
            e,
            Event {
                at_ns: ptx::globaltimer_ns(),
                what: what as u32,
                block: ENGINE_BLOCK,
                peer,
                _pad: 0,
                arg,
            },
        );
    }
}

/// Writes `%globaltimer` to `out[0]` (one thread): the host's calibration
/// of this GPU's clock against its own when tracing starts.
#[cfg(feature = "library-kernels")]
#[doorbell_kernels::kernel]
pub unsafe fn trace_clock(out: *mut u64) {
    if ptx::global_thread_id_x() == 0 {
        // SAFETY: the host passes one word.
        unsafe { core::ptr::write_volatile(out, ptx::globaltimer_ns()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_leaves_room_for_every_ring() {
        assert_eq!(events_at(1), 128);
        assert_eq!(events_at(16), 128);
        assert_eq!(events_at(1024), 64 + 4096);
        assert_eq!(trace_bytes(4, 8), 128 + 4 * 8 * 32);
    }

    #[test]
    fn every_kind_round_trips_and_ends_are_recognised() {
        for w in [
            What::Produce,
            What::Consume,
            What::Put,
            What::PutSignal,
            What::Get,
            What::Signal,
            What::Wait,
            What::Barrier,
            What::Quiet,
            What::Acquire,
            What::Arrive,
            What::WqePosted,
            What::Doorbell,
            What::Completion,
            What::Error,
            What::NicFetch,
            What::NicExecute,
            What::NicCqe,
            What::NicDoorbell,
            What::NicWake,
        ] {
            assert_eq!(What::from_u16(w as u16), Some(w));
            assert_eq!(What::from_u16(w as u16 | END), Some(w));
            assert_eq!(w.is_span(), (w as u16) < 32);
        }
        assert_eq!(What::from_u16(0), None);
        assert_eq!(What::from_u16(31), None);
    }
}
