//! # doorbell-softnic — a software mlx5 NIC
//!
//! No machine doorbell is developed on has an RDMA NIC, so this crate is
//! one in software: a device that executes **the exact bytes a ConnectX NIC
//! would** — the WQEs a GPU kernel (or the CPU emulator, or host code)
//! writes into an SQ ring with `doorbell_kernels::mlx5`'s send pipeline,
//! the big-endian SQ counter in the doorbell record, the 8-byte doorbell in
//! the UAR word — and answers with the CQE64s that `poll_cq` reads. Keys,
//! bounds and access rights are checked like hardware: a bad WQE gets an
//! error CQE with the matching mlx5 syndrome, its QP moves to the error
//! state, later WQEs are flushed, and no memory is touched.
//!
//! ## Quick start
//!
//! ```
//! use doorbell_kernels::mlx5::queue::{ring_doorbell, update_doorbell_record};
//! use doorbell_kernels::mlx5::wqe::{write_rdma_write_wqe, Transfer, FLAG_SIGNALED};
//! use doorbell_softnic::engine::access;
//! use doorbell_softnic::host::{Cqe, CqMemory, HostBuffer, QpMemory};
//! use doorbell_softnic::{FabricConfig, MemoryRegion, QueuePair, RdmaDevice, SoftFabric};
//!
//! // Two ports of one fabric (same address space), a virtual clock.
//! let fabric = SoftFabric::new(FabricConfig { virtual_time: true, ..Default::default() });
//! let (a, b) = (fabric.open_device(None)?, fabric.open_device(None)?);
//! let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
//!
//! // Ring memory the caller owns (GPU memory on real hardware).
//! let (qa_mem, qb_mem) = (QpMemory::new(64, 0, 1), QpMemory::new(64, 0, 1));
//! let (ca_mem, cb_mem) = (CqMemory::new(64), CqMemory::new(64));
//! let src = HostBuffer::zeroed(4096, 64);
//! let dst = HostBuffer::zeroed(4096, 64);
//! src.write(0, b"hello, soft NIC");
//!
//! // SAFETY: every buffer above outlives the objects registered on it.
//! let (mr_src, mr_dst, cq_a, cq_b) = unsafe {
//!     (
//!         a.reg_mr(&pd_a, src.as_ptr(), 4096, 0)?,
//!         b.reg_mr(&pd_b, dst.as_ptr(), 4096, access::LOCAL_WRITE | access::REMOTE_WRITE)?,
//!         a.create_cq(ca_mem.ring())?,
//!         b.create_cq(cb_mem.ring())?,
//!     )
//! };
//! let qa = unsafe { a.create_qp(&pd_a, &cq_a, &cq_a, qa_mem.rings())? };
//! let qb = unsafe { b.create_qp(&pd_b, &cq_b, &cq_b, qb_mem.rings())? };
//! qa.connect(qb.endpoint(), 0)?; // RESET → INIT → RTR → RTS
//! qb.connect(qa.endpoint(), access::REMOTE_WRITE)?;
//!
//! // The device-side send path, run here on the host: write a WQE into the
//! // SQ ring, publish the doorbell record, ring the doorbell.
//! let h = qa_mem.handle(qa.qpn(), &ca_mem);
//! let t = Transfer { raddr: mr_dst.addr(), rkey: mr_dst.rkey(), laddr: mr_src.addr(), lkey: mr_src.lkey(), len: 15 };
//! unsafe {
//!     let head = write_rdma_write_wqe(h.sq, 0, qa.qpn(), &t, FLAG_SIGNALED);
//!     update_doorbell_record(&h, 1);
//!     ring_doorbell(&h, head);
//! }
//!
//! a.poll_once(); // or `a.spawn_engine()` for a thread that polls
//! match cq_a.reader().poll() {
//!     Some(Cqe::Ok(c)) => assert_eq!(c.wqe_counter, 0),
//!     other => panic!("{other:?}"),
//! }
//! assert_eq!(&dst.to_vec()[..15], b"hello, soft NIC");
//! # Ok::<(), doorbell_softnic::Error>(())
//! ```
//!
//! ## The parts
//!
//! | part | what |
//! |---|---|
//! | [`engine`] | the core: `no_std`, no allocation, no panics on ring contents; fixed-size `#[repr(C)]` tables ([`engine::Port`]) and [`engine::poll_port`], one pass over a port. Builds for `nvptx64` (checked with `cargo build --target nvptx64-nvidia-cuda -Zbuild-std=core`) |
//! | [`verbs`] | the setup interface as traits ([`RdmaDevice`], [`QueuePair`], [`MemoryRegion`], [`CompletionQueue`]) shaped like verbs + mlx5 direct verbs, free of GPU specifics: a transport switches to a real NIC by opening another device |
//! | [`host`] | the soft implementation: [`SoftFabric`] (ports that reach each other, a real or virtual clock), [`SoftDevice`] with [`SoftDevice::poll_once`] and [`SoftDevice::spawn_engine`], ports resident elsewhere ([`host::ResidentPort`]), ring memory helpers, a host [`host::CqReader`] |
//! | [`kernel`] | `softnic_engine_256`, `_512`, `_1024`: the engine as a persistent block per port (control on thread 0, payload moved by the block), built into this crate's own PTX |
//!
//! ## What a WQE goes through
//!
//! 1. **Doorbell.** Each pass reads the QP's UAR word (acquire); a new value
//!    is a doorbell (without a UAR, a new doorbell-record value is). The
//!    *delay* fault postpones acting on it; the *drop* fault ignores it.
//! 2. **Doorbell record.** When a doorbell is due — or when
//!    [`engine::EngineConfig::dbr_reread_ns`] passed since the last read,
//!    which is how a missed doorbell is recovered — the engine reads the BE32
//!    SQ counter with acquire (pairing with `update_doorbell_record`'s
//!    release): WQEs between its consumer index and that counter are
//!    published.
//! 3. **Start.** For each published WQE, in order, the ctrl segment's `ds`
//!    gives its basic blocks (a WQE may span several and wrap the ring; one
//!    not fully published waits). The link model gives it a due time
//!    (`max(now, port free) + bytes / bandwidth + latency`; a fenced WQE
//!    starts no earlier than the QP's earlier reads and atomics complete),
//!    and it joins the QP's in-flight ring (16 deep).
//! 4. **Execute**, in order, once due: parse with the `#[descriptor]`
//!    decoders (opcode, `ds`, `wqe_index`, QP number, inline flag, lengths),
//!    check every local data segment (lkey, PD, bounds, local write for
//!    read destinations and atomic results), find the peer (connected back,
//!    RTR/RTS, not stalled — else wait up to the transport timeout), check
//!    the remote range (rkey, PD, bounds, region and QP access), for
//!    write-with-immediate / send take the peer's next receive WQE (else
//!    wait up to the RNR timeout), check CQ room; only then move data or run
//!    the 8-byte atomic.
//!    The WQE is copied out of the ring once, and every check and every
//!    byte moved uses that copy (likewise the receive WQE a send
//!    consumes): a producer rewriting the slot after the doorbell cannot
//!    move an access past what was checked.
//! 5. **Complete.** A signaled WQE gets a CQE64 (`MLX5_CQE_REQ`, its
//!    `wqe_counter`, `byte_cnt`, its opcode in `sop_drop_qpn`'s high byte,
//!    the engine's clock as `timestamp`) with the owner bit of the CQ's pass,
//!    published by a release store of its last word; an unsignaled one is
//!    consumed silently. The responder's receive WQE completes with
//!    `RESP_WR_IMM` (immediate, length, solicited bit) or `RESP_SEND`:
//!    the requester's engine posts the event into the responder QP's
//!    inbox ([`engine::tables::Inbox`]) and the responder's own engine
//!    writes the CQE when it drains it, so each port's CQs, receive
//!    queues, states and counters have one writer.
//! 6. **Errors.** A failed check writes an error CQE (signaled or not) with
//!    the mlx5 syndrome — `LOCAL_PROT` (lkey, bounds, local access),
//!    `LOCAL_QP_OP` (malformed WQE), `LOCAL_LENGTH`, `REMOTE_ACCESS` (rkey,
//!    bounds, PD, access), `REMOTE_INVAL_REQ` (misaligned atomic, send too
//!    long), `REMOTE_OP`, `RNR_RETRY_EXC`, `TRANSPORT_RETRY_EXC` — with the
//!    soft NIC's [`engine::Reason`] in `vendor_err_synd` and in the port's
//!    [`SoftDevice::error_log`]. The QP moves to ERR; remote access and
//!    invalid-request errors move the responder QP to ERR too (IB responder
//!    class C). A QP in ERR flushes every started and published WQE and
//!    every posted receive WQE with `WR_FLUSH_ERR`, one CQE each.
//!
//! ## Emulated, and what hardware does differently
//!
//! * **Doorbells.** Hardware is woken by the UAR write (and BlueFlame copies
//!   the WQE into the doorbell); the soft NIC polls the UAR word and the
//!   record. It reads the UAR value (the last rung WQE's ctrl head) only
//!   on its lone-request path: which WQEs that doorbell covers (a record
//!   read with the ring may already publish a later doorbell's).
//! * **Order.** The soft NIC executes a QP's WQEs one after the other and
//!   moves a WQE's data at its modelled completion time. Hardware pipelines
//!   WQEs, may land a write's data long before its CQE, and works on many
//!   QPs at once. So fences are trivially honoured in execution (earlier
//!   reads and atomics are complete before a later WQE executes), and
//!   modelled in time by the link model. Completions of different QPs may
//!   be reordered by the reorder fault, never those of one QP.
//! * **Stricter.** A ctrl segment whose `wqe_index` is not the consumer
//!   index, or whose QP number is not the QP's, fails with `LOCAL_QP_OP`
//!   (hardware trusts them): producer bugs show up here first.
//! * **Keys.** lkey = rkey = `(slot + 1) << 8 | tag`, as mlx5 mkeys pair an
//!   index with a tag; a deregistered key stays invalid when the slot is
//!   reused. Zero-length transfers do not check keys; a data segment's
//!   `byte_count` of 0 means 0 bytes (mlx5; mlx4 read it as 2 GiB).
//! * **Atomics.** The remote word is read and updated in host order; the
//!   old value lands in the local buffer big-endian, as ConnectX returns it
//!   on little-endian hosts ([`engine::EngineConfig::atomic_reply_be`]
//!   switches to host order). Check this against hardware before relying on it.
//! * **A full CQ** (known from the consumer's doorbell record) holds
//!   completions back until there is room, a signaled WQE on its own send
//!   CQ for at most the transport timeout: then the CQ has overrun, the QP
//!   moves to the error state and the port's error log says `CqOverrun`,
//!   where hardware would overrun the CQ at once and raise an asynchronous
//!   error.
//! * **Flushes** complete every WQE (signaled or not), as the IB spec asks.
//! * **Timeouts** replace PSNs, ACK timeouts and retry counters: a peer that
//!   does not answer for [`engine::EngineConfig::transport_timeout_ns`], or
//!   has no receive WQE for [`engine::EngineConfig::rnr_timeout_ns`], fails
//!   the WQE.
//! * **Link model.** One transmitter per port, shared in start order; RDMA
//!   reads are charged to the requester's port; no packets, headers,
//!   congestion or credit.
//!
//! Not emulated: inline data (fails with `LOCAL_QP_OP`), send with
//! immediate / invalidate, masked and 4-byte atomics, UD/DC/UC transports,
//! SRQs, memory windows, UMR, ODP, CQ moderation and arming through the CQ
//! doorbell (use [`SoftCq::req_notify`]), asynchronous events beyond the
//! error log.
//!
//! ## Fault injection
//!
//! [`engine::FaultConfig`] (in [`FabricConfig::engine`] or
//! [`SoftFabric::set_config`]): delayed doorbell handling, dropped doorbells
//! (recovered by the next doorbell or the timed re-read of the doorbell
//! record), completions reordered across QPs, forced error completions with
//! a chosen syndrome, a stalled peer port (a delay, or past the transport
//! timeout a `TRANSPORT_RETRY_EXC` error). Each ends in a correct result or
//! a typed error CQE; the tests check that none hangs and none writes
//! outside registered regions.
//!
//! ## Link model
//!
//! Per device: `fabric.open_device(Some(model))`; [`link_from_env`] reads
//! `DOORBELL_SOFTNIC_LINK` (`400gbps,2us`; units bps…tbps and ns…s,
//! decimals allowed; `off`), and a malformed value is an error naming the
//! variable and the accepted forms. With a virtual clock
//! ([`FabricConfig::virtual_time`], [`SoftFabric::run_until`]) the model's
//! times are exact and tests do not depend on the machine's speed.
//!
//! ## Threads, clocks, cleanup
//!
//! All ports of a fabric share one lock: [`SoftDevice::poll_once`] (and the
//! thread of [`SoftDevice::spawn_engine`], one per device, stopped and
//! joined when its [`EngineThread`] guard drops) takes it for one pass, as
//! do the setup calls. Ring and payload memory is shared with producers
//! without the lock: doorbell records and CQE `op_own` words are accessed
//! with `sys`-scope acquire/release through `doorbell_kernels::ptx`
//! ([`engine::mem`] is the only place that touches foreign memory). The
//! memory given to `reg_mr`, `create_cq` and `create_qp` must stay valid
//! until the returned object is dropped; dropping it removes it from the
//! tables under the lock, after which the engine never touches that memory.
//!
//! ## Limits
//!
//! Per port: 256 memory regions, 64 CQs, 64 QPs, 16 WQEs in flight per QP;
//! 64 ports per fabric; SQs up to 2^15 basic blocks (the doorbell record's
//! 16-bit counter tells no more apart); WQEs up to 16 basic blocks and 16
//! data segments; receive WQEs up to 16 scatter entries; messages up to
//! 2^31 − 1 bytes (a byte count of 2^31 is the inline flag). The ports of one fabric share an address space (threads of one
//! process, the emulator's memory, or one GPU's device pointers and peer
//! mappings). Ports of several processes are several fabrics, one per
//! process, each opening its ports at agreed indices
//! ([`SoftFabric::open_device_at`]) and connecting with
//! [`SoftQp::connect_remote`]; a GPU-resident engine then reaches another
//! process's port through an [`engine::Window`] onto the memory of it this
//! process has mapped (its symmetric heap, where its tables and its remote
//! regions lie) — never its rings, so SEND and WRITE with immediate toward
//! it fail ([`engine::Reason::Unmapped`]). The
//! host engine runs one device pass at a time (one lock). The GPU-resident
//! engine ([`engine::resident`], the [`kernel::softnic_engine_256()`] kernels and its siblings)
//! gives each port its own block; ports reach each other through an
//! [`engine::PortTable`]. An engine writes no other port's tables but the
//! inbox of the responder QP it is connected to (single producer, single
//! consumer, release/acquire: see [`engine::tables`]); the responder's
//! engine applies those events to its own CQs, receive queue, QP state,
//! counters and error log.
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch))]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod engine;
pub mod kernel;

#[cfg(not(target_arch = "nvptx64"))]
mod error;
#[cfg(not(target_arch = "nvptx64"))]
pub mod host;
#[cfg(not(target_arch = "nvptx64"))]
pub mod verbs;

#[cfg(not(target_arch = "nvptx64"))]
pub use error::{Error, Result};
#[cfg(not(target_arch = "nvptx64"))]
pub use host::{
    link_from_env, link_from_str, DeregisterError, EngineThread, FabricConfig, Sge, SoftCq, SoftDevice, SoftFabric, SoftMr, SoftPd, SoftQp,
    LINK_ENV,
};
#[cfg(not(target_arch = "nvptx64"))]
pub use verbs::{CompletionQueue, CqRing, MemoryRegion, QpEndpoint, QpRings, QueuePair, RdmaDevice};
