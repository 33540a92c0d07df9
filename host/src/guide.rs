//! # Your own project
//!
//! A fused kernel of your own takes two crates and a few lines of set-up;
//! this page has all of it, and its example runs as a test (on the CPU
//! emulator, where it needs no GPU). `examples/user-kernels/src/fused.rs`
//! and `examples/09_fused.rs` are the same two kernels and their host code
//! as a repository example.
//!
//! ## The crates
//!
//! * **The kernel crate** (`my-kernels`), built twice: to PTX for the GPU and
//!   for the host, where the emulator runs the same functions.
//!   `Cargo.toml`: `doorbell-kernels = { path = "../doorbell/gpu-kernels" }`.
//!   `src/lib.rs` starts with
//!   `#![cfg_attr(target_arch = "nvptx64", no_std)]` and
//!   `#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]`. Its module
//!   holds only its own kernels (the library's entries are exported in
//!   doorbell's own module only).
//! * **The host crate**: `doorbell = { path = "../doorbell/host" }` and
//!   `my-kernels = { path = "../my-kernels" }` as dependencies,
//!   `doorbell = { path = "../doorbell/host", default-features = false,
//!   features = ["build"] }` as a build-dependency, and a `build.rs` of one
//!   line: `doorbell::build::PtxBuilder::new("../my-kernels").build_or_report();`
//!   (a kernel that does not compile is reported as the compiler's own
//!   errors; a missing `ptxas` is a `cargo:warning`, never an empty cubin
//!   over a good one). The code embeds the result with
//!   `const MY_KERNELS: doorbell::ModuleImage = doorbell::module_image!("my_kernels");`.
//! * **The toolchain**: copy the repository's `rust-toolchain.toml` next to
//!   your workspace's `Cargo.toml` (the device build needs the pinned
//!   toolchain's `core` source; `scripts/setup.sh` installs it and `ptxas`).
//!
//! ## Two fused kernels and their host code
//!
//! A producer that sends each chunk to the next rank the moment it is
//! computed ([`Pipe::run`](doorbell_kernels::pipeline::Pipe::run): the
//! rings, the producer/consumer split, the control words and the sequence
//! numbers across launches are its business), and an all-gather with typed
//! puts ([`Put`](doorbell_kernels::transport::Put) on
//! [`Sym`](doorbell_kernels::transport::Sym) buffers, each part checked
//! against its own buffer). One launch call serves every transport the
//! kernel is exported for.
//!
//! ```
//! use doorbell::comm::{CommOptions, Communicator, RingShape};
//! use doorbell::{coll::TransportKind, Backend, LaunchConfig};
//! use doorbell_kernels::pipeline::Pipe;
//! use doorbell_kernels::transport::{Cmp, Coop, Ibgda, P2p, Put, Signal, Sym, Transport};
//! use doorbell_kernels::{kernel, ptx};
//!
//! // ---- the kernel crate ----
//! fn value(rank: u32, i: u64, step: u64) -> f32 { ((rank as u64 * 1009 + i * 7 + step * 13) % 251) as f32 }
//!
//! /// Sends this rank's `elems` values to the next rank chunk by chunk; the previous rank's land in `out`.
//! #[kernel(transports(P2p, Ibgda))]
//! pub unsafe fn produce_send<T: Transport>(t: T, pipe: Pipe<f32>, out: *mut f32, elems: u64, step: u64) {
//!     let (me, n) = (t.rank(), t.world_size());
//!     let (tid, nthr) = (ptx::thread_rank_in_block() as u64, ptx::block_dim_x() as usize);
//!     let produce = |first: u64, len: u64, buf: *mut f32| {
//!         (tid..len).step_by(nthr).for_each(|i| unsafe { *buf.add(i as usize) = value(me, first + i, step) })
//!     };
//!     let consume = |first: u64, len: u64, slot: *const f32| {
//!         (tid..len).step_by(nthr).for_each(|i| unsafe { *out.add((first + i) as usize) = *slot.add(i as usize) })
//!     };
//!     let _ = unsafe { pipe.run(&t, elems, ((me + 1) % n, (me + n - 1) % n), produce, consume) };
//! }
//!
//! /// All-gather by one block: computes this rank's part of `data`, puts it into every rank.
//! #[kernel(transports(P2p, Ibgda))]
//! pub unsafe fn all_gather<T: Transport>(t: T, data: Sym<f32>, ready: Sym<u64>, step: u64) {
//!     let (me, n, tid) = (t.rank(), t.world_size(), ptx::thread_rank_in_block() as u64);
//!     let part = data.len() / n as u64;
//!     let mine = data.part(me as u64 * part, part);
//!     (tid..part).step_by(ptx::block_dim_x() as usize).for_each(|i| unsafe { *mine.as_ptr().add(i as usize) = value(me, i, step) });
//!     ptx::sync_threads();
//!     for peer in 0..n {
//!         let put = Put::dst(mine).src(mine).signal(Signal::set(ready.word(me as u64), step));
//!         if unsafe { t.put(Coop::Block, peer, put) }.is_err() {
//!             return; // recorded: the host's synchronize returns it
//!         }
//!     }
//!     if tid == 0 {
//!         let _ = unsafe { t.wait_until_all(ready.all(), Cmp::Ge, step) };
//!     }
//! }
//!
//! // ---- the host crate ----
//! # const MY_KERNELS: &str = ""; // doorbell::module_image!("my_kernels") in a real crate
//! fn run(comm: &Communicator, kind: TransportKind) -> doorbell::Result<()> {
//!     let (me, n, elems, part) = (comm.rank() as u32, comm.world_size() as u32, 10_000u64, 1024usize);
//!     let module = comm.load_module(MY_KERNELS)?; // modules first, then the transports
//!     let (send, gather) = (module.family::<produce_send>()?, module.family::<all_gather>()?);
//!     let (t, stream) = (comm.transport(kind)?, comm.device().new_stream()?);
//!     let rings = comm.rings::<f32>(RingShape { stages: 2, chunk: 512, pairs: 2 })?;
//!     let (data, ready) = (comm.alloc::<f32>(n as usize * part)?, comm.alloc::<u64>(n as usize)?);
//!     let mut out = comm.device().alloc_zeroed::<f32>(elems as usize)?;
//!     for step in 1..=2u64 {
//!         unsafe { stream.launch_family(&send, LaunchConfig::linear(rings.blocks(), 32), t, (rings.pipe()?, out.as_mut_ptr(), elems, step))? };
//!         comm.synchronize(&stream)?;
//!         unsafe { stream.launch_family(&gather, LaunchConfig::linear(1, 32), t, (data.sym(), ready.sym(), step))? };
//!         comm.synchronize(&stream)?;
//!         let prev = (me + n - 1) % n;
//!         assert!(out.to_host()?.iter().enumerate().all(|(i, &v)| v == value(prev, i as u64, step)));
//!         assert!(data.to_host()?.iter().enumerate().all(|(i, &v)| v == value((i / part) as u32, (i % part) as u64, step)));
//!         comm.barrier()?; // every rank's host reads before the next step's puts
//!     }
//!     Ok(())
//! }
//!
//! # fn main() -> doorbell::Result<()> {
//! for kind in [TransportKind::P2p, TransportKind::Ibgda] {
//!     Communicator::local(2, Backend::Cpu, CommOptions::default(), |comm| run(comm, kind))?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## Collective calls
//!
//! Every rank makes these, in the same order (a rank that does not, or
//! disagrees on the arguments, makes every rank fail naming it):
//!
//! | call | what |
//! |---|---|
//! | `Communicator::new`, `Communicator::local` | form the world and its symmetric heaps |
//! | `Communicator::alloc` | a symmetric buffer (returns once every rank's copy is zeroed) |
//! | `Communicator::rings` | a pipeline's rings (allocations, as above) |
//! | `Communicator::barrier` | every rank arrives; host work before it is done everywhere |
//! | `Communicator::ibgda`, `ibgda_with`, `routed`, `routed_with`, `transport(Ibgda or Routed)` | the first sets the NIC transport up |
//! | `Communicator::ibgda_register` | makes local memory a put source / get destination for the NIC |
//! | `Communicator::ibgda_reset` | tears the NIC transport down and up again after an error |
//! | `AllReduce::new`, `EmbeddingExchange::new` (and `with`) | the collectives' symmetric buffers |
//!
//! ## Ordering rules
//!
//! * Load every module before the first IBGDA or routed handle: on a GPU
//!   the soft NIC's engine kernel then runs until teardown, and a module
//!   load would wait for it.
//! * A kernel that waits for peers needs every rank's kernel to run:
//!   launch the same kernels, in the same order, on every rank.
//! * Blocks that wait on each other (a pipeline's `2 * pairs`) must all be
//!   resident at once: size the grid for it.
//! * Ranks sharing one GPU: keep one launch in flight per rank
//!   (`synchronize` each before the next), and finish a step's host copies
//!   on every rank (`barrier`) before any rank launches the next — CUDA may
//!   queue one rank's copy behind another rank's waiting kernel.
//! * Read results a peer put into your buffers after `synchronize` (your
//!   kernel saw the signal) — and before the peer's next put into them,
//!   which a `barrier` after the reads guarantees.
//! * A source given to a non-blocking put (`.nbi()`) stays unchanged until
//!   `quiet`.
//! * After a device error, `synchronize`/`check` returns it; IBGDA queues
//!   are then reset with `ibgda_reset` (collective), and a pipeline's rings
//!   are made again (their counters are out of step).
