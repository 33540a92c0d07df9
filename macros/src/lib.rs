//! Proc-macros for doorbell.
//!
//! * [`macro@kernel`] turns one Rust function into a GPU kernel entry point
//!   (`extern "ptx-kernel"` on nvptx64) and, on the host, into a function the
//!   CPU emulator runs plus a marker type the launcher uses to type-check
//!   arguments.
//! * [`macro@descriptor`] declares a NIC descriptor layout (mlx5 WQE
//!   segments, CQEs) and generates host encoders/decoders and device builders.
//! * [`macro@pipeline`] writes a block's loop over chunks as produce → hand
//!   off → send (or wait → consume → release) on a credit ring.
//!
//! Each macro is split into `parse` → `validate` → `generate`; errors point at
//! the offending token and several are reported at once. The attribute macros
//! emit the original item next to `compile_error!` so later diagnostics stay
//! useful; `pipeline!` reports every invocation error at once (a syntax error:
//! the first), and its body is compiled only once the invocation is right.
#![warn(missing_docs)]

use proc_macro::TokenStream;

mod descriptor;
mod kernel;
mod pipeline;

/// Declares a kernel.
///
/// ```
/// #[doorbell_kernels::kernel]
/// pub unsafe fn scale(x: *mut f32, a: f32, n: u32) {
///     let i = doorbell_kernels::ptx::global_thread_id_x();
///     if i < n {
///         unsafe { *x.add(i as usize) *= a };
///     }
/// }
///
/// #[doorbell_kernels::kernel(no_spill)] // ptxas must report no local-memory spills
/// pub unsafe fn inner_loop(x: *mut u32) {
///     unsafe { *x += 1 };
/// }
///
/// // A body generic over its transport: one entry per transport listed.
/// use doorbell_kernels::transport::{P2p, Transport};
/// #[doorbell_kernels::kernel(transports(P2p))]
/// pub unsafe fn rank_of<T: Transport>(t: T, out: *mut u32) {
///     unsafe { *out = t.rank() };
/// }
/// # let _ = <rank_of as doorbell_kernels::ForTransport<P2p>>::Kernel::default_name();
/// # trait N { fn default_name() -> &'static str; }
/// # impl<K: doorbell_kernels::Kernel> N for K { fn default_name() -> &'static str { K::NAME } }
/// ```
///
/// On `nvptx64` this emits `#[no_mangle] pub unsafe extern "ptx-kernel" fn`.
/// On the host it emits the same function (for the CPU emulator) and a
/// zero-sized type of the same name implementing
/// `doorbell_kernels::Kernel`, whose `Args` is the tuple of parameter types.
///
/// Rules (checked, with errors on the offending token): the function is
/// `unsafe` (kernels dereference raw device pointers), has no generics
/// (except the one transport parameter with `transports(...)`), no `self`,
/// no return type, plain identifier parameters, is not `async`/`const` and
/// has no explicit ABI. Options: `no_spill`; `transports(A, B)` on a body generic
/// over `T: Transport` whose first parameter is the handle (`t: T`) emits
/// entries `name_a`, `name_b`, maps each transport to its entry (and the
/// other parameters, as a tuple) through `doorbell_kernels::ForTransport`,
/// and makes the marker a `doorbell_kernels::KernelFamily` (plus
/// `AnyFamily` when no other parameter names `T`), which the host launches
/// with one call whatever the transport;
/// `no_spill(A)` with `transports(...)` asks it of the listed transports'
/// entries only; `launch_bounds(threads = N, min_blocks = M)` is CUDA's
/// `__launch_bounds__(N, M)`: the PTX build writes `.maxntid N, 1, 1` and
/// `.minnctapersm M` into the entry (ptxas then keeps its registers within
/// what `M` blocks of `N` threads per SM allow), and a launch with more
/// than `N` threads per block is refused (`Kernel::MAX_THREADS`).
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel::expand(attr.into(), item.into()).into()
}

/// Declares a NIC descriptor layout (a WQE segment, a CQE, ...) and
/// generates its encoders, decoders and device builder.
///
/// ```
/// #[doorbell_kernels::descriptor(size = 16, endian = big)]
/// pub struct CtrlSeg {
///     /// WQE opcode.
///     #[field(byte = 0, word = u32, bit = 0, width = 8)]
///     pub opcode: u8,
///     /// Producer index of the WQE.
///     #[field(byte = 0, word = u32, bit = 8, width = 16)]
///     pub wqe_index: u16,
///     #[field(byte = 11)]
///     pub fm_ce_se: u8,
/// }
/// ```
///
/// Options: `size = BYTES` (required, a multiple of 4), `endian = big|little`
/// (default `big`, the byte order of multi-byte container words). Each field
/// is `u8`, `u16`, `u32`, `u64` or `bool` and says where it lives:
/// `byte = N` (offset of its container word), `word = u8|u16|u32|u64` (the
/// container, default the field's type), `bit = N` (offset of the field's
/// least significant bit in the container's value, default 0), `width = N`
/// (bits, default the type's), `endian = ...` (overrides the descriptor's).
/// Bytes no field covers are reserved and always zero.
///
/// Generated, next to the struct (which also derives `Clone, Copy, Debug,
/// Default, PartialEq, Eq, Hash`): `SIZE`, `WORDS`, `LAYOUT`, `<FIELD>_MAX`,
/// `<FIELD>_BYTE`; `to_words` (the device builder: memory words assembled in
/// registers) and `store` (16-byte `st.v4.u32` stores, no read-modify-write);
/// `to_bytes`/`from_bytes`/`from_words`/`load_words`; and per field
/// `get_<f>`/`set_<f>` on a `[u8; SIZE]` image and `get_<f>_words`/
/// `set_<f>_words` on a `[u32; WORDS]` image. All of it is `no_std` and
/// builds for `nvptx64`.
///
/// Rejected, with an error on the offending token: a missing or bad size,
/// fields without `#[field(byte = N)]`, fields past the end, widths of 0, over
/// 64, wider than the type or not fitting the container at their bit offset,
/// fields sharing a bit, and unknown options.
#[proc_macro_attribute]
pub fn descriptor(attr: TokenStream, item: TokenStream) -> TokenStream {
    descriptor::expand(attr.into(), item.into()).into()
}

/// A block's loop over its chunks of a credit ring
/// (`doorbell_kernels::pipeline::RingSet`), as **produce → hand off →
/// send** on the producer and **wait → consume → release** on the
/// consumer; the credits, the per-chunk signal and the ordering are
/// generated. An expression of type
/// `Result<(), doorbell_kernels::pipeline::Failed>` (`Err` when a transport
/// call failed; the transport recorded why for the host).
///
/// ```ignore
/// // Producer: chunk j of this block (elements first..first + len) is
/// // computed into `buf` (the outbox), then sent to rank `next`.
/// let sent = doorbell_kernels::pipeline!(unsafe send {
///     transport: t, ring: rings.nth(pair), ctl: ctl, chunks: chunks,
///     first_seq: launch * chunks.count(), to: next, outbox: outbox, elem: f32,
/// } |first, len, buf| {
///     let mut i = tid;
///     while i < len {
///         unsafe { *buf.add(i as usize) = f(first + i) };
///         i += nthr;
///     }
/// });
/// // Consumer: the same chunks from rank `prev`, each read from its slot
/// // the moment it has arrived.
/// let got = doorbell_kernels::pipeline!(unsafe recv {
///     transport: t, ring: rings.nth(pair), ctl: ctl, chunks: chunks,
///     first_seq: launch * chunks.count(), from: prev, elem: f32,
/// } |first, len, slot| {
///     /* read slot[..len] */
/// });
/// ```
///
/// Every key is required: `transport` (a value of any `Transport` type,
/// such as the kernel's `t`; `*t` through a reference), `ring` (`RingSet`), `ctl` (`BlockCtl`, the block's control
/// word), `chunks` (`BlockChunks`: which chunks this block handles),
/// `first_seq` (`u64`: the sequence number of the block's first chunk; go
/// on from launch to launch, never restart), `to` / `from` (`u32`: the peer
/// rank), `outbox` (send only: `*mut elem`, a symmetric or registered
/// buffer of one chunk), `elem` (the element type). The body runs once per
/// chunk, by every thread of the block, with `first` and `len` (`u64`
/// elements) and `buf: *mut elem` (send) or `slot: *const elem` (recv)
/// (names of your choice, `mut` allowed). It cannot name the generated
/// loop's variables or labels, and `break` / `continue` out of it do not
/// compile; it must run to its end on every thread: `return`, `?` or a
/// labeled jump to a loop of yours skip the hand-off, and the peer waits
/// until its budget runs out.
///
/// Blocks that move chunks at the same time each need a ring set
/// (`RingSet::nth`) and a control word of their own: slots and counters
/// are indexed by peer and stage only. Sequence numbers must never repeat
/// on a ring: a launch replayed from a CUDA graph with the same
/// `first_seq` would repeat them (count launches in device memory then, as
/// the all-reduce does).
///
/// Generated per chunk, send: `acquire_block` (wait for the credit: the
/// consumer released chunk `seq - stages` of that slot), the body, a block
/// barrier, `commit_block` (one `put_signal`: the data, then the slot's
/// full counter). Recv: `wait_block` (exactly that chunk's counter), the
/// body, `release_block` (barrier, fence, the producer's empty counter).
/// Over the IBGDA transport, `commit_block` is where WQEs are built, the
/// doorbell rung and completions polled. Bad arguments trap the launch
/// before any wait: a chunk larger than a slot (or whose byte count
/// overflows), no chunk or no block, a peer outside the ring set, slots not
/// aligned for `elem`. `unsafe` is part of the syntax: the caller
/// vouches that the ring, control word and outbox are this rank's symmetric
/// allocations of the sizes they claim.
///
/// Rejected with an error on the token: a missing `unsafe`, an unknown,
/// missing or repeated key, a body without exactly three plain names, a
/// `transport` that is not a value of a `Transport` type.
#[proc_macro]
pub fn pipeline(input: TokenStream) -> TokenStream {
    pipeline::expand(input.into()).into()
}
