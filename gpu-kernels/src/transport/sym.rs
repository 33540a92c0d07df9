//! Typed symmetric buffers and the arguments of the typed transfer calls.
//!
//! A [`Sym<T>`] is a kernel's view of one symmetric allocation: where this
//! rank's copy starts and how many elements of `T` it holds. The host makes
//! it (`SymBuffer::sym`) and passes it as a kernel argument (16 bytes). A
//! [`Part<T>`] is a range of elements of one buffer, taken with
//! [`Sym::part`] and friends without any check; the transfer call that uses
//! it checks it against *its own buffer* (not just the heap), and a part
//! outside its buffer is an error naming the argument, the range and the
//! buffer's length — a put past the end of one buffer can no longer land in
//! the next allocation of the peer.
//!
//! The calls take their arguments by name, so a destination and a source,
//! or a byte count and a signal value, cannot trade places:
//!
//! ```
//! use doorbell_kernels::transport::{Coop, Get, Put, Signal, Sym, Transport, Cmp};
//!
//! /// Rank `me` sends its `n` elements to the same place on `peer`, then
//! /// bumps `ready[me]` there; waits for every rank's words here.
//! unsafe fn gather<T: Transport>(t: T, data: Sym<f32>, ready: Sym<u64>, n: u64, step: u64) {
//!     let me = t.rank() as u64;
//!     let mine = data.part(me * n, n);
//!     for peer in 0..t.world_size() {
//!         let put = Put::dst(mine).src(mine).signal(Signal::set(ready.word(me), step));
//!         // SAFETY: every thread of the block calls with the same arguments.
//!         if unsafe { t.put(Coop::Block, peer, put) }.is_err() {
//!             return; // recorded for the host
//!         }
//!     }
//!     // SAFETY: one thread waits for the block.
//!     let _ = unsafe { t.wait_until_all(ready.all(), Cmp::Ge, step) };
//! }
//! ```
//!
//! Raw byte pointers stay available to experts through the `_raw` calls of
//! [`Transport`](super::Transport) ([`RawXfer`], [`RawSignal`], [`RawWait`]).

use super::{CommError, SignalOp};
use crate::heap::{Arg, Call, HeapBounds};

/// One symmetric buffer of `len` elements of `T`, as a kernel sees it:
/// this rank's copy (a put's destination names the peer's copy at the same
/// offset). Plain data, 16 bytes, made by the host (`SymBuffer::sym`) or by
/// [`Sym::from_raw`].
#[repr(C)]
pub struct Sym<T> {
    ptr: *mut T,
    len: u64,
}

impl<T> Clone for Sym<T> {
    #[inline(always)]
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Sym<T> {}

impl<T> core::fmt::Debug for Sym<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sym").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

#[cfg(not(target_arch = "nvptx64"))]
// SAFETY: #[repr(C)] pointer + u64, 8-byte aligned: a 16-byte struct
// parameter of the PTX entry point.
unsafe impl<T: 'static> crate::KernelParam for Sym<T> {}

impl<T> Sym<T> {
    /// The buffer of `len` elements at `ptr` (this rank's copy). Nothing is
    /// checked here; every call that moves data checks its range against
    /// the symmetric heap, and parts of it against `len`.
    #[inline(always)]
    pub const fn from_raw(ptr: *mut T, len: u64) -> Sym<T> {
        Sym { ptr, len }
    }
    /// Elements.
    #[inline(always)]
    pub const fn len(&self) -> u64 {
        self.len
    }
    /// No elements.
    #[inline(always)]
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// This rank's copy: plain loads and stores of the kernel's own data.
    #[inline(always)]
    pub const fn as_ptr(&self) -> *mut T {
        self.ptr
    }
    /// Elements `start .. start + n`. Not checked until a call uses it.
    #[inline(always)]
    pub const fn part(self, start: u64, n: u64) -> Part<T> {
        Part { buf: self, start, n }
    }
    /// Every element.
    #[inline(always)]
    pub const fn all(self) -> Part<T> {
        self.part(0, self.len)
    }
}

impl Sym<u64> {
    /// Word `i`, as a signal or a wait names it.
    #[inline(always)]
    pub const fn word(self, i: u64) -> Part<u64> {
        self.part(i, 1)
    }
}

/// Elements `start .. start + n` of one buffer ([`Sym::part`]); checked
/// against the buffer by the call that uses it.
pub struct Part<T> {
    buf: Sym<T>,
    start: u64,
    n: u64,
}

impl<T> Clone for Part<T> {
    #[inline(always)]
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Part<T> {}

impl<T> core::fmt::Debug for Part<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Part")
            .field("buf", &self.buf)
            .field("start", &self.start)
            .field("n", &self.n)
            .finish()
    }
}

impl<T> Part<T> {
    /// `n` elements at `ptr` of memory that is not a symmetric buffer: a
    /// put's source or a get's destination in other device memory (P2P
    /// takes any; an RDMA transport needs it registered with the
    /// communicator, or it reports the argument and how to register it).
    #[inline(always)]
    pub const fn local(ptr: *mut T, n: u64) -> Part<T> {
        Sym::from_raw(ptr, n).all()
    }
    /// Elements `start .. start + n` of this part (counted from its start;
    /// checked against the whole buffer).
    #[inline(always)]
    pub const fn part(self, start: u64, n: u64) -> Part<T> {
        Part {
            buf: self.buf,
            start: self.start.wrapping_add(start),
            n,
        }
    }
    /// Elements.
    #[inline(always)]
    pub const fn len(&self) -> u64 {
        self.n
    }
    /// No elements.
    #[inline(always)]
    pub const fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// The first element's address in this rank's copy.
    #[inline(always)]
    pub fn as_ptr(&self) -> *mut T {
        self.buf.ptr.wrapping_add(self.start as usize)
    }
    /// Bytes of the part (saturating: an absurd count fails the heap check).
    #[inline(always)]
    pub(crate) fn bytes(&self) -> u64 {
        self.n.saturating_mul(core::mem::size_of::<T>() as u64)
    }
    /// Inside its buffer: `start + n <= len`, without overflow.
    #[inline(always)]
    pub(crate) fn inside(&self) -> bool {
        self.start <= self.buf.len && self.n <= self.buf.len - self.start
    }
    /// (first element, elements, buffer length), for reports.
    #[inline(always)]
    pub(crate) fn extent(&self) -> (u64, u64, u64) {
        (self.start, self.n, self.buf.len)
    }
}

/// A signal as a typed call takes it: `op` with `value` on a symmetric
/// word ([`Sym::word`]).
#[derive(Clone, Copy, Debug)]
pub struct Signal {
    pub(crate) word: Part<u64>,
    pub(crate) value: u64,
    pub(crate) op: SignalOp,
}

impl Signal {
    /// Store `value` into `word`.
    #[inline(always)]
    pub const fn set(word: Part<u64>, value: u64) -> Signal {
        Signal {
            word,
            value,
            op: SignalOp::Set,
        }
    }
    /// Add `value` to `word` (atomically).
    #[inline(always)]
    pub const fn add(word: Part<u64>, value: u64) -> Signal {
        Signal {
            word,
            value,
            op: SignalOp::Add,
        }
    }
}

/// A put under construction: [`Put::dst`] names where it lands on the
/// peer; [`PutDst::src`] what it copies from here.
#[derive(Clone, Copy, Debug)]
pub struct PutDst<T> {
    dst: Part<T>,
}

/// A put: `src` (here) copied into `dst` (on the peer; both the same
/// length), then, optionally, a signal the peer can wait for — the peer
/// that sees the signal sees the data.
#[derive(Clone, Copy, Debug)]
pub struct Put<T> {
    pub(crate) dst: Part<T>,
    pub(crate) src: Part<T>,
    pub(crate) signal: Option<Signal>,
    pub(crate) nbi: bool,
}

impl<T> Put<T> {
    /// Starts a put into `dst`, a part of a symmetric buffer (the peer's
    /// copy is written).
    #[inline(always)]
    pub const fn dst(dst: Part<T>) -> PutDst<T> {
        PutDst { dst }
    }
    /// After the data, apply `signal` on the peer (one `put_signal`).
    #[inline(always)]
    pub const fn signal(mut self, signal: Signal) -> Put<T> {
        self.signal = Some(signal);
        self
    }
    /// Non-blocking: the call returns once the transfer is issued; it
    /// completes at `quiet`, and `src` must stay unchanged until then.
    #[inline(always)]
    pub const fn nbi(mut self) -> Put<T> {
        self.nbi = true;
        self
    }
}

impl<T> PutDst<T> {
    /// Copies from `src`: a part of a symmetric buffer, or of memory
    /// registered with the communicator ([`Part::local`]).
    #[inline(always)]
    pub const fn src(self, src: Part<T>) -> Put<T> {
        Put {
            dst: self.dst,
            src,
            signal: None,
            nbi: false,
        }
    }
}

/// A get under construction: [`Get::dst`] names where the data lands here.
#[derive(Clone, Copy, Debug)]
pub struct GetDst<T> {
    dst: Part<T>,
}

/// A get: `src` (the peer's copy of a symmetric part) copied into `dst`
/// (here; the same length).
#[derive(Clone, Copy, Debug)]
pub struct Get<T> {
    pub(crate) dst: Part<T>,
    pub(crate) src: Part<T>,
    pub(crate) nbi: bool,
}

impl<T> Get<T> {
    /// Starts a get into `dst` (this rank's memory: a symmetric part or
    /// [`Part::local`]).
    #[inline(always)]
    pub const fn dst(dst: Part<T>) -> GetDst<T> {
        GetDst { dst }
    }
    /// Non-blocking: the data is in `dst` after `quiet`.
    #[inline(always)]
    pub const fn nbi(mut self) -> Get<T> {
        self.nbi = true;
        self
    }
}

impl<T> GetDst<T> {
    /// Reads the peer's copy of `src`, a part of a symmetric buffer.
    #[inline(always)]
    pub const fn src(self, src: Part<T>) -> Get<T> {
        Get {
            dst: self.dst,
            src,
            nbi: false,
        }
    }
}

/// A transfer in raw bytes (the `_raw` calls): `dst` and `src` are this
/// rank's addresses (the symmetric side is translated to the peer).
#[derive(Clone, Copy, Debug)]
pub struct RawXfer {
    /// Where the bytes land (a put: a symmetric address; a get: local).
    pub dst: *mut u8,
    /// Where they come from (a put: local; a get: a symmetric address).
    pub src: *const u8,
    /// Bytes.
    pub bytes: u64,
    /// Completes at `quiet` instead of on return.
    pub nbi: bool,
}

/// A signal in raw form: `op` with `value` on the symmetric word at `word`.
#[derive(Clone, Copy, Debug)]
pub struct RawSignal {
    /// This rank's address of the (8-byte aligned, symmetric) word.
    pub word: *mut u64,
    /// The operand.
    pub value: u64,
    /// Set or add.
    pub op: SignalOp,
}

impl RawXfer {
    /// Bytes `lo .. lo + len` of this transfer: both sides moved by `lo`.
    #[inline(always)]
    pub fn piece(self, lo: u64, len: u64) -> RawXfer {
        RawXfer {
            dst: self.dst.wrapping_add(lo as usize),
            src: self.src.wrapping_add(lo as usize),
            bytes: len,
            nbi: self.nbi,
        }
    }
}

impl RawSignal {
    /// Store `value` into the word at `word`.
    #[inline(always)]
    pub const fn set(word: *mut u64, value: u64) -> RawSignal {
        RawSignal {
            word,
            value,
            op: SignalOp::Set,
        }
    }
    /// Add `value` to the word at `word`.
    #[inline(always)]
    pub const fn add(word: *mut u64, value: u64) -> RawSignal {
        RawSignal {
            word,
            value,
            op: SignalOp::Add,
        }
    }
}

/// A wait in raw form: `count` (1..=64) consecutive words from `words`
/// compared with `value`.
#[derive(Clone, Copy, Debug)]
pub struct RawWait {
    /// This rank's address of the first (8-byte aligned, symmetric) word.
    pub words: *const u64,
    /// Words, 1..=64.
    pub count: u32,
    /// The comparison each word must satisfy.
    pub cmp: super::Cmp,
    /// What the words are compared with.
    pub value: u64,
}

// ---- the per-buffer checks of the typed calls ------------------------------
//
// Each is one folded predicate and one branch on the hot path; only a bad
// argument takes it, to the report (written by the heap's cold `record`).

/// Heap offset of a part's buffer, for reports.
#[inline(always)]
fn buffer_offset<T>(b: HeapBounds, p: Part<T>) -> u64 {
    (p.buf.ptr as u64).wrapping_sub(b.reporter.local_base)
}

/// Records that `p`, argument `arg` of `call`, reaches past its buffer.
#[inline(always)]
fn outside<T>(b: HeapBounds, call: Call, arg: Arg, peer: u32, p: Part<T>) -> CommError {
    let elem = core::mem::size_of::<T>() as u32;
    b.reporter.fail_part(call, arg, peer, buffer_offset(b, p), p.extent(), elem)
}

/// A transfer's destination and source: each inside its buffer, both the
/// same length.
#[inline(always)]
pub(crate) fn check_pair<T>(b: HeapBounds, call: Call, peer: u32, dst: Part<T>, src: Part<T>) -> Result<(), CommError> {
    let bad = !dst.inside() | !src.inside() | (dst.n != src.n);
    if bad {
        return Err(if !dst.inside() {
            outside(b, call, Arg::Destination, peer, dst)
        } else if !src.inside() {
            outside(b, call, Arg::Source, peer, src)
        } else {
            let elem = core::mem::size_of::<T>() as u32;
            b.reporter.fail_lengths(call, peer, buffer_offset(b, dst), dst.n, src.n, elem)
        });
    }
    Ok(())
}

/// A signal's word: inside its buffer (the part's first element).
#[inline(always)]
pub(crate) fn check_signal(b: HeapBounds, call: Call, peer: u32, s: Signal) -> Result<RawSignal, CommError> {
    let w = s.word;
    if (w.n == 0) | (w.start >= w.buf.len) {
        return Err(outside(b, call, Arg::Signal, peer, w.part(0, 1)));
    }
    Ok(RawSignal {
        word: w.as_ptr(),
        value: s.value,
        op: s.op,
    })
}

/// A wait's words: inside their buffer.
#[inline(always)]
pub(crate) fn check_words(b: HeapBounds, call: Call, words: Part<u64>) -> Result<*const u64, CommError> {
    if !words.inside() {
        return Err(outside(b, call, Arg::Signal, u32::MAX, words));
    }
    Ok(words.as_ptr())
}
