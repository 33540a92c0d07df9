//! The IBGDA transport's host side: set-up written against the NIC
//! boundary ([`crate::nic`]: the soft NIC today, a ConnectX NIC through
//! mlx5 by the same sequence), teardown, registration, reset, diagnostics,
//! and the per-peer route table of the routed transport.
//!
//! ## Set-up (collective: the first [`Communicator::ibgda`] or
//! [`Communicator::routed`] call of every rank)
//! 1. Each rank opens its NIC port (one place: `open_nic`; the soft NIC's
//!    fabric and engine are described in [`crate::nic::soft`]), registers
//!    its symmetric heap (local write, remote read/write/atomic) and a
//!    scratch area (one word per SQ slot: `Set` values, fetch-add results).
//! 2. Ring memory in device memory (the emulator's: host memory): per QP
//!    the SQ, the CQ (filled with invalid CQEs here, as rdma-core leaves a
//!    new CQ) and 64 bytes for the doorbell records and the UAR word.
//! 3. Per peer (itself included: loopback) `qps_per_peer` RC QPs, each with
//!    its own CQ of `sq_size` entries (it cannot overflow).
//! 4. Endpoints ([`Endpoint`]: LID, GID, QP number, PSN, MTU, provider
//!    slot) with the heap base and rkey go through the world's host
//!    collective (`all_gather_bytes`, lengths checked exactly); QP `k` of
//!    rank `a` to rank `b` connects to QP `k` of rank `b` to rank `a`:
//!    RESET → INIT → RTR → RTS ([`QueuePair::connect`]).
//! 5. The kernels' QP table (rings, and the doorbell address from
//!    [`QueuePair::doorbell`]) is copied to the device; a world barrier
//!    (every QP is in RTS before any kernel posts); then [`Nic::start`].
//!
//! Teardown (the communicator's drop or [`Communicator::ibgda_reset`]):
//! [`Nic::stop`] first, which waits (bounded) until the NIC no longer
//! touches the rings; only then are QPs, CQs and regions destroyed and
//! their memory freed. If the NIC does not stop, the ring memory is leaked
//! (and logged), never freed under it.
//!
//! While the soft NIC's engine kernel runs, a module load or an allocation
//! on its GPU may wait for every kernel there (with CUDA's lazy loading
//! even a first launch may): load your modules before the first
//! [`Communicator::ibgda`]. Each step logs at `DOORBELL_LOG=debug`, so a
//! run that stops somewhere shows where.

mod inspect;
mod options;

use doorbell_kernels::mlx5::{Cqe64, QpHandle, CQE_INVALID, CQE_SIZE, QP_GPU_SCOPE, SEND_WQE_BB};
use doorbell_kernels::transport::ibgda::{IbgdaQp, QpCounters, RegRegion, REG_SLOTS};
use doorbell_kernels::transport::routed::ROUTE_WORDS;
use doorbell_kernels::transport::{Ibgda, Routed};

use super::{Communicator, PeerRoute};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, MappedBuffer};
use crate::nic::soft::{CrossProcess, SoftNic, SoftOpen};
use crate::nic::{access, CompletionQueue, CqRing, Endpoint, MemoryRegion, Nic, NicKind, QpOptions, QpRings, QueuePair, StartCtx};

pub use inspect::IbgdaQueue;
pub use options::{IbgdaOptions, RdmaPeers};

/// Alignment of each QP's rings: a page, as a ConnectX wants the work and
/// completion queues it reads through DevX UMEMs (the soft NIC does not
/// care).
const RING_ALIGN: usize = 4096;

/// Where one QP's rings lie in the ring memory: the SQ at 0, the CQ at
/// `cq`, then `tail` holding the QP's doorbell record pair (+0), the CQ's
/// (+8) and the UAR word (+16); each part page-aligned, `per_qp` bytes in
/// all.
#[derive(Clone, Copy)]
struct RingLayout {
    cq: usize,
    tail: usize,
    per_qp: usize,
}

/// Every QP's CQ and the QPs, in QP order.
type Queues = (Vec<Box<dyn CompletionQueue>>, Vec<Box<dyn QueuePair>>);

/// A rank's heap as the NIC reaches it, and its QPs' endpoints (the
/// set-up's exchange: heap base, rkey, then `nqps` endpoints).
struct PeerHeap {
    base: u64,
    rkey: u32,
    qps: Vec<Endpoint>,
}

impl PeerHeap {
    /// Rank `r`'s message `b`, which must hold `nqps` endpoints.
    fn decode(b: &[u8], r: usize, nqps: usize) -> Result<PeerHeap> {
        let want = 12 + nqps * Endpoint::BYTES;
        if b.len() != want {
            return Err(Error::comm(format!(
                "rank {r} sent a malformed IBGDA endpoint message ({} bytes, not {want}: heap base, rkey and {nqps} endpoints)",
                b.len()
            )));
        }
        let qps = b[12..]
            .chunks_exact(Endpoint::BYTES)
            .map(Endpoint::from_bytes)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::comm(format!("rank {r} sent an endpoint that does not decode")))?;
        Ok(PeerHeap {
            base: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            rkey: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            qps,
        })
    }
}

/// What the kernels' QP table is made of ([`IbgdaQp`] per QP).
struct KernelView<'a> {
    rings_base: u64,
    layout: &'a RingLayout,
    sq: u32,
    qps_per_peer: usize,
    states: *mut QpCounters,
    scratch: *mut u64,
    scratch_lkey: u32,
    /// Every QP handle's `flags` ([`QP_GPU_SCOPE`] when the NIC runs on
    /// the kernels' GPU).
    qp_flags: u32,
}

impl KernelView<'_> {
    /// The table's words: QP `k` of peer `p` at index `p * qps_per_peer + k`.
    fn table_words(&self, remotes: &[PeerHeap], qps: &[Box<dyn QueuePair>]) -> Vec<u64> {
        let (layout, sq, qpp) = (self.layout, self.sq, self.qps_per_peer);
        let at = |i: usize, off: usize| self.rings_base + (i * layout.per_qp + off) as u64;
        let tail = layout.tail;
        let mut words: Vec<u64> = Vec::with_capacity(qps.len() * 16);
        for (p, remote) in remotes.iter().enumerate() {
            for k in 0..qpp {
                let i = p * qpp + k;
                let state = self.states.wrapping_add(i);
                // SAFETY (the three field addresses): inside the states buffer.
                let h = QpHandle {
                    sq: at(i, 0) as *mut u32,
                    sq_producer: unsafe { &raw mut (*state).producer },
                    sq_ready: unsafe { &raw mut (*state).ready },
                    sq_dbr: at(i, tail + 4) as *mut u32,
                    uar: qps[i].doorbell() as *mut u64,
                    cq: at(i, layout.cq) as *mut u32,
                    cq_consumer: unsafe { &raw mut (*state).cq_consumer },
                    cq_dbr: at(i, tail + 8) as *mut u32,
                    sq_size: sq,
                    qpn: qps[i].qpn(),
                    cq_size: sq,
                    flags: self.qp_flags,
                };
                let e = IbgdaQp {
                    qp: h,
                    state,
                    scratch: self.scratch.wrapping_add(i * sq as usize),
                    scratch_lkey: self.scratch_lkey,
                    peer: p as u32,
                    remote_base: remote.base,
                    rkey: remote.rkey,
                    _pad: 0,
                    _reserved: 0,
                };
                // SAFETY: IbgdaQp is 128 bytes of plain data, 8-byte aligned.
                let w: [u64; 16] = unsafe { std::mem::transmute(e) };
                words.extend_from_slice(&w);
            }
        }
        words
    }
}

impl RingLayout {
    /// The first image of `nqps` QPs' ring memory: every CQE invalid
    /// (owner 0, opcode invalid), as rdma-core leaves a new CQ; the send
    /// rings, doorbell records and UAR words zero.
    fn fresh_rings(&self, nqps: usize, sq: u32) -> Vec<u8> {
        let invalid: Vec<u8> = Cqe64 {
            opcode: CQE_INVALID,
            ..Cqe64::default()
        }
        .to_words()
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
        let mut image = vec![0u8; nqps * self.per_qp];
        for i in 0..nqps {
            let cq = i * self.per_qp + self.cq;
            for e in 0..sq as usize {
                image[cq + e * CQE_SIZE..cq + (e + 1) * CQE_SIZE].copy_from_slice(&invalid);
            }
        }
        image
    }

    /// Creates a CQ and a QP over each of `nqps` QPs' rings at
    /// `rings_base`, `sq` slots each.
    ///
    /// # Safety
    /// The rings (`nqps * per_qp` bytes at `rings_base`) outlive the
    /// objects and stay unread by anyone else until the NIC stops.
    unsafe fn create_queues(&self, nic: &dyn Nic, rings_base: u64, nqps: usize, sq: u32) -> Result<Queues> {
        let at = |i: usize, off: usize| rings_base + (i * self.per_qp + off) as u64;
        let mut cqs = Vec::with_capacity(nqps);
        let mut qps = Vec::with_capacity(nqps);
        for i in 0..nqps {
            let cq_ring = CqRing {
                buf: at(i, self.cq) as *mut u8,
                entries: sq,
                dbrec: at(i, self.tail + 8) as *mut u32,
            };
            let qp_rings = QpRings {
                sq: at(i, 0) as *mut u8,
                sq_wqebbs: sq,
                rq: std::ptr::null_mut(),
                rq_wqes: 0,
                rq_max_sge: 1,
                dbrec: at(i, self.tail) as *mut u32,
                uar: at(i, self.tail + 16) as *mut u64,
            };
            // SAFETY: the caller's contract.
            let cq = unsafe { nic.create_cq(cq_ring) }?;
            // SAFETY: as above.
            let qp = unsafe { nic.create_qp(&*cq, qp_rings) }?;
            cqs.push(cq);
            qps.push(qp);
        }
        Ok((cqs, qps))
    }

    fn new(sq: u32) -> RingLayout {
        let ring = (sq as usize * SEND_WQE_BB).next_multiple_of(RING_ALIGN);
        RingLayout {
            cq: ring,
            tail: 2 * ring,
            per_qp: 2 * ring + RING_ALIGN,
        }
    }
}

/// Everything the NIC touches besides the heaps and the registered
/// buffers, in device memory (the emulator's: host memory).
struct Memory {
    _rings: Backing,
    _scratch: Backing,
    states: DeviceBuffer<u8>,
    table: DeviceBuffer<u64>,
}

/// Where the rings and the scratch words lie: device memory (the kernels
/// post) or mapped host memory (a host thread posts: the CPU proxy), at the
/// same address for the host and the device.
enum Backing {
    Device(DeviceBuffer<u8>),
    Mapped(MappedBuffer<u8>),
}

impl Backing {
    /// `bytes` zeroed bytes of the kind asked for. Mapped memory must have
    /// one address for the host and the device (unified addressing), as the
    /// host thread and the NIC share the rings' pointers.
    fn alloc(device: &Device, bytes: usize, mapped: bool) -> Result<Backing> {
        if !mapped {
            return Ok(Backing::Device(device.alloc_zeroed::<u8>(bytes)?));
        }
        // Dropped only after the NIC stopped (the state's drop).
        let m = device.alloc_mapped_idle_on_drop::<u8>(bytes)?;
        if m.host_ptr() as u64 != m.device_ptr() as u64 {
            return Err(Error::comm(format!(
                "mapped host memory has a device address ({:#x}) other than its host address ({:#x}): the CPU proxy needs \
                 unified addressing",
                m.device_ptr() as u64,
                m.host_ptr() as u64
            )));
        }
        Ok(Backing::Mapped(m))
    }

    /// The first byte's address (the device's, which is the host's when mapped).
    fn addr(&self) -> u64 {
        match self {
            Backing::Device(b) => b.as_raw(),
            Backing::Mapped(m) => m.device_ptr() as u64,
        }
    }

    /// Writes `bytes` at address `at` inside the allocation.
    fn write(&self, device: &Device, at: u64, bytes: &[u8]) -> Result<()> {
        match self {
            // SAFETY: inside the buffer (the caller's layout).
            Backing::Device(_) => unsafe { device.write_raw(at, bytes) },
            Backing::Mapped(_) => {
                // SAFETY: inside the mapped buffer, which nothing reads yet.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, bytes.len()) };
                Ok(())
            }
        }
    }
}

/// This rank's IBGDA resources. Field order is drop order after
/// [`Nic::stop`] (in the drop): QPs before their CQs, regions, then the
/// memory, then the port.
pub(crate) struct IbgdaState {
    qps: Vec<Box<dyn QueuePair>>,
    cqs: Vec<Box<dyn CompletionQueue>>,
    registered: Vec<Box<dyn MemoryRegion>>,
    _scratch_mr: Box<dyn MemoryRegion>,
    _heap_mr: Box<dyn MemoryRegion>,
    memory: Option<Memory>,
    nic: Box<dyn Nic>,
    opts: IbgdaOptions,
    handle: Ibgda,
    /// The kernels' QP table as the host built it.
    table_words: Vec<u64>,
}

// SAFETY: the raw pointers inside (the handle's QP table) name memory this
// state owns; the NIC objects are Send + Sync themselves.
unsafe impl Send for IbgdaState {}

impl IbgdaState {
    /// Registers `len` bytes at `addr` with the NIC and adds the region to
    /// the handle (at most [`REG_SLOTS`]); `what` names the transport in
    /// the error.
    ///
    /// # Safety
    /// The memory stays allocated while this state lives.
    pub(super) unsafe fn register(&mut self, rank: usize, addr: u64, len: usize, what: &str) -> Result<RegRegion> {
        let n = self.handle.nreg as usize;
        if n >= REG_SLOTS {
            return Err(Error::comm(format!(
                "rank {rank}: at most {REG_SLOTS} buffers can be registered for {what}; put the data in the symmetric heap"
            )));
        }
        // SAFETY: the caller keeps the memory valid while the region lives
        // (it lives in this state).
        let mr = unsafe { self.nic.reg_mr(addr, len, access::LOCAL_WRITE) }?;
        let r = RegRegion {
            addr,
            len: len as u64,
            lkey: mr.lkey(),
            _pad: 0,
        };
        self.handle.reg[n] = r;
        self.handle.nreg += 1;
        self.registered.push(mr);
        Ok(r)
    }

    /// The transport's handle.
    pub(super) fn handle(&self) -> Ibgda {
        self.handle
    }

    /// Every QP as a host thread that posts on it sees it (QP `k` of peer
    /// `p` at `p * qps_per_peer + k`): the kernels' table, each doorbell
    /// the address the host rings it at ([`QueuePair::host_doorbell`]).
    pub(super) fn host_qp_table(&self) -> Vec<IbgdaQp> {
        let table = self.table_words.chunks_exact(16).map(|w| {
            let w: [u64; 16] = w.try_into().expect("16 words");
            // SAFETY: the words of an IbgdaQp (128 bytes of plain data).
            unsafe { std::mem::transmute::<[u64; 16], IbgdaQp>(w) }
        });
        with_host_doorbells(table, self.qps.iter().map(|q| q.host_doorbell()))
    }

    /// Whether a doorbell the host rang must be flushed out of the CPU's
    /// write-combining buffers (a NIC's UAR register, which may be mapped
    /// write-combining) rather than reach memory the NIC polls.
    pub(super) fn host_doorbell_is_mmio(&self) -> bool {
        self.nic.kind() != NicKind::Soft
    }

    /// Statistics of the soft NIC's engine, when that is the NIC.
    pub(super) fn nic_describe(&self) -> String {
        self.nic.describe()
    }

    /// The soft NIC, when that is what this state runs on.
    pub(super) fn soft(&self) -> Option<&SoftNic> {
        self.nic.as_any().downcast_ref::<SoftNic>()
    }

    /// The kernels' per-QP state words, read from the device.
    fn queue_states(&self, comm: &Communicator) -> Result<Vec<QpCounters>> {
        let Some(mem) = self.memory.as_ref() else { return Ok(Vec::new()) };
        let mut raw = vec![0u8; mem.states.len()];
        // SAFETY: the states buffer, whole (plain words; a racing kernel
        // makes the snapshot approximate, never invalid).
        unsafe { comm.device.read_raw(mem.states.as_raw(), &mut raw)? };
        let n = (comm.size * self.opts.qps_per_peer as usize).min(raw.len() / std::mem::size_of::<QpCounters>());
        // SAFETY: `raw` holds one QpCounters per QP (plain data).
        Ok((0..n)
            .map(|i| unsafe { std::ptr::read_unaligned((raw.as_ptr() as *const QpCounters).add(i)) })
            .collect())
    }
}

impl Communicator {
    /// The IBGDA transport's device handle (a kernel argument), every peer
    /// — this rank included — reached through the (soft) NIC.
    ///
    /// **Collective the first time** (every rank calls it, or
    /// [`Communicator::routed`]): sets the transport up with
    /// [`IbgdaOptions::from_env`]. Later calls return the handle at once.
    /// On a GPU the soft NIC's engine is a persistent kernel (see the
    /// module docs). Peers may be threads of this process or other
    /// processes (then each rank runs its own fabric and the kernel engine;
    /// see the module docs for what crosses processes).
    pub fn ibgda(&self) -> Result<Ibgda> {
        self.ibgda_state(None)
    }

    /// As [`Self::ibgda`], with explicit options (used only if the
    /// transport is not set up yet; collective then).
    pub fn ibgda_with(&self, opts: &IbgdaOptions) -> Result<Ibgda> {
        self.ibgda_state(Some(opts))
    }

    /// The routed transport: load/store to peers that P2P reaches, the NIC
    /// to the others and to those `DOORBELL_RDMA_PEERS` names. Collective
    /// the first time, as [`Self::ibgda`].
    pub fn routed(&self) -> Result<Routed> {
        self.routed_with(&RdmaPeers::from_env_for(self.size)?)
    }

    /// [`Self::routed`] with an explicit route setting.
    pub fn routed_with(&self, peers: &RdmaPeers) -> Result<Routed> {
        let ibgda = self.ibgda()?;
        Ok(Routed {
            p2p: self.p2p_handle(),
            ibgda,
            rdma: self.rdma_bits(peers)?,
        })
    }

    /// The route bit set of `peers`: bit `p` set when rank `p` is reached
    /// through the NIC — peers of other hosts, and of the others those the
    /// setting names.
    pub(super) fn rdma_bits(&self, peers: &RdmaPeers) -> Result<[u64; ROUTE_WORDS]> {
        let mut rdma = [0u64; ROUTE_WORDS];
        for p in 0..self.size {
            if self.routes[p] == PeerRoute::Remote || peers.forced(self.rank, p, self.size)? {
                rdma[p / 64] |= 1 << (p % 64);
            }
        }
        Ok(rdma)
    }

    /// Registers `len` bytes at the device address `addr` with the NIC, so
    /// puts may read from it and gets write into it. Local to this rank;
    /// returns the updated handle (earlier handles do not know the buffer).
    /// At most [`REG_SLOTS`] buffers. The memory must outlive the
    /// communicator or [`Self::ibgda_reset`].
    ///
    /// # Safety
    /// `addr..addr + len` is device memory of this rank that stays
    /// allocated until this communicator is dropped or reset.
    pub unsafe fn ibgda_register(&self, addr: u64, len: usize) -> Result<Ibgda> {
        self.ibgda()?;
        let mut guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        let st = guard.as_mut().expect("set up above");
        // SAFETY: the caller's contract.
        unsafe { st.register(self.rank, addr, len, "IBGDA") }?;
        Ok(st.handle)
    }

    /// Collective: tears the IBGDA transport down (the NIC stops, its QPs
    /// and memory go) without setting it up again, so that the CPU proxy
    /// ([`Communicator::proxy`]) may take the NIC; a later
    /// [`Communicator::ibgda`] sets it up afresh. Call it on every rank,
    /// with no kernel using an IBGDA handle running.
    pub fn ibgda_close(&self) -> Result<()> {
        self.world.barrier()?;
        drop(self.ibgda.lock().unwrap_or_else(|p| p.into_inner()).take());
        self.nic_torn_down();
        self.world.barrier()?;
        Ok(())
    }

    /// Collective: tears the IBGDA transport down and sets it up again
    /// with the same options — the way out of a QP error state. Handles
    /// made before are invalid afterwards; take new ones (registered
    /// buffers must be registered again).
    pub fn ibgda_reset(&self) -> Result<()> {
        self.world.barrier()?;
        let opts = {
            let mut guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
            guard.take().map(|st| st.opts.clone())
        };
        self.nic_torn_down();
        self.world.barrier()?;
        if let Some(o) = opts {
            self.ibgda_state(Some(&o))?;
        }
        Ok(())
    }

    /// The set-up state's handle, when the transport is set up.
    pub(super) fn ibgda_if_set_up(&self) -> Option<Ibgda> {
        self.ibgda.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|st| st.handle)
    }

    /// The set-up state's handle, setting it up first if needed; a new
    /// set-up runs the self-test of the IBGDA route when it is on
    /// ([`Communicator::self_test_enabled`]), and a route that fails it is
    /// torn down again (a later call sets it up, and tests it, anew).
    fn ibgda_state(&self, opts: Option<&IbgdaOptions>) -> Result<Ibgda> {
        // Asked before the IBGDA lock is taken: the proxy's set-up holds
        // its own lock while it asks about IBGDA (one lock order).
        let proxy_up = self.proxy_if_set_up();
        let mut guard = self.ibgda.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = guard.as_ref() {
            return Ok(st.handle);
        }
        let opts = match opts {
            Some(o) => o.clone(),
            None => IbgdaOptions::from_env()?,
        };
        self.refuse_second_nic_user(proxy_up, "IBGDA", "the CPU proxy", "proxy_reset()")?;
        if self.self_test.enabled {
            // Before the soft NIC's engine kernel runs (see the module docs).
            self.library_module()?;
        }
        let st = self.queue_setup(opts, false)?;
        let h = st.handle;
        *guard = Some(st);
        drop(guard);
        if self.self_test.enabled {
            if let Err(e) = self.run_self_test(&[(super::SelfTestRoute::Ibgda, h.into())]) {
                if matches!(e, Error::SelfTest { .. }) {
                    // Every rank has this verdict and its kernels are done:
                    // the route is torn down, not left in use (as a reset).
                    self.world.barrier()?;
                    drop(self.ibgda.lock().unwrap_or_else(|p| p.into_inner()).take());
                    self.nic_torn_down();
                    self.world.barrier()?;
                }
                return Err(e);
            }
        }
        Ok(h)
    }

    /// Whether a peer runs in another process.
    fn cross_process(&self) -> bool {
        self.routes
            .iter()
            .any(|r| matches!(r, PeerRoute::CudaIpc | PeerRoute::SharedMemory))
    }

    /// Opens this rank's NIC port: the one place that chooses the NIC
    /// (`nic::select`: `DOORBELL_NIC`, rdma-core, `DOORBELL_IB_HCA`, the
    /// port nearest the GPU). Collective: every rank takes part in every
    /// step, so a rank that cannot open its NIC makes every rank fail with
    /// its name instead of leaving them in a later exchange; ranks must
    /// agree on the kind of NIC (a soft NIC port cannot reach a ConnectX
    /// one). Ranks of other processes were checked to run the same version
    /// and layout at the rendezvous.
    fn open_nic(&self, opts: &IbgdaOptions) -> Result<Box<dyn Nic>> {
        use crate::nic::select::Selection;
        // This rank's GPU, and every GPU on this host (so GPUs at the same
        // distance are spread over NICs, and sharing is reported).
        // (A failed query is this rank's selection error, reported after
        // the exchanges below, which every rank must take part in.)
        let gpu = crate::nic::mlx5::gpu_pci_bus_id(&self.device);
        let bus = gpu.as_ref().ok().and_then(|g| g.as_deref());
        let host = self.world.peers()[self.rank].hostname.clone();
        let mine = format!("{host}\n{}", bus.unwrap_or(""));
        let all = self.world.all_gather_bytes(mine.as_bytes())?;
        let here: Vec<String> = all
            .iter()
            .filter_map(|b| {
                let t = String::from_utf8_lossy(b);
                let (h, g) = t.split_once('\n')?;
                (h == host && !g.is_empty()).then(|| g.to_string())
            })
            .collect();

        let selection = match (
            gpu.and_then(|g| crate::nic::select::select(self.rank, g.as_deref(), &here)),
            self.routes.iter().position(|r| *r == PeerRoute::Remote),
        ) {
            (Ok(Selection::Soft { reason }), Some(p)) => Err(Error::NicUnavailable {
                missing: format!(
                    "rank {}: rank {p} runs on another host ({:?}), and the soft NIC ({reason}) reaches only ranks of \
                     this host (its engine executes WQEs through the mapped heaps); across hosts IBGDA needs ConnectX \
                     NICs (DOORBELL_NIC=mlx5)",
                    self.rank,
                    self.world.peers()[p].hostname
                ),
            }),
            (s, _) => s,
        };
        let kind = match &selection {
            Err(_) => 0u8,
            Ok(Selection::Soft { .. }) => 1,
            Ok(Selection::Mlx5 { .. }) => 2,
        };
        let kinds = self.world.all_gather_bytes(&[kind])?;
        let selection = selection?;
        let failed: Vec<usize> = (0..self.size)
            .filter(|&r| kinds[r].first() != Some(&1) && kinds[r].first() != Some(&2))
            .collect();
        if !failed.is_empty() {
            return Err(Error::comm(format!(
                "rank {}: IBGDA set-up: rank(s) {failed:?} could not choose a NIC (their own errors say why)",
                self.rank
            )));
        }
        if kinds.iter().any(|k| k.first() != Some(&kind)) {
            let name = |k: Option<&u8>| if k == Some(&1) { "the soft NIC" } else { "mlx5" };
            let list: Vec<String> = kinds
                .iter()
                .enumerate()
                .map(|(r, k)| format!("rank {r}: {}", name(k.first())))
                .collect();
            return Err(Error::NicUnavailable {
                missing: format!(
                    "ranks chose different NICs ({}), and a soft NIC port cannot reach a ConnectX one: give every rank \
                     the same {} (and, with auto, the same rdma-core and devices)",
                    list.join(", "),
                    crate::nic::NIC_ENV
                ),
            });
        }
        tracing::info!("rank {}: IBGDA NIC: {}", self.rank, selection.describe());
        let opened: Result<Box<dyn Nic>> = match selection {
            Selection::Soft { .. } => {
                let cross_process = self.cross_process().then(|| CrossProcess {
                    heap_base: self.heap_base,
                    heap_len: self.heap_len,
                    tables_offset: super::setup::tail_off(self.heap_len),
                    mapped: (0..self.size)
                        .map(|p| matches!(self.routes[p], PeerRoute::CudaIpc | PeerRoute::SharedMemory).then(|| self.bases[p]))
                        .collect(),
                    tail_in_use: self.softnic_tail_leaked.clone(),
                });
                // Collective inside (rank 0's fabric handed to the others).
                return Ok(Box::new(crate::nic::soft::open(SoftOpen {
                    rank: self.rank,
                    device: &self.device,
                    world: &self.world,
                    options: opts.soft(),
                    cross_process,
                    same_gpu: self.same_gpu,
                })?));
            }
            Selection::Mlx5 { choice, verbs } => {
                crate::nic::mlx5::Mlx5Nic::open(&verbs, &choice, &self.device).map(|n| Box::new(n) as Box<dyn Nic>)
            }
        };
        let oks = self.world.all_gather_bytes(&[opened.is_ok() as u8])?;
        let nic = opened?;
        let failed: Vec<usize> = (0..self.size).filter(|&r| oks[r].first() != Some(&1)).collect();
        if !failed.is_empty() {
            return Err(Error::comm(format!(
                "rank {}: IBGDA set-up: rank(s) {failed:?} could not open their NIC port (their own errors say why)",
                self.rank
            )));
        }
        tracing::info!("rank {}: IBGDA NIC opened: {}", self.rank, nic.describe());
        Ok(nic)
    }

    /// The QPs, rings and tables of the transport, posted to by the kernels
    /// (`host_rings` false: rings in device memory) or by a host thread (the
    /// CPU proxy: rings and scratch in mapped host memory).
    pub(super) fn queue_setup(&self, opts: IbgdaOptions, host_rings: bool) -> Result<IbgdaState> {
        opts.validate()?;
        // Read before any collective: a bad value fails every rank alike.
        let qp_opts = QpOptions::from_env()?;
        self.world.check_same(
            "IBGDA options (QPs per peer, SQ size, largest message)",
            &[opts.qps_per_peer, opts.sq_size, opts.max_msg]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )?;
        let t_setup = std::time::Instant::now();
        let (rank, size) = (self.rank, self.size);
        let qpp = opts.qps_per_peer as usize;
        let sq = opts.sq_size;

        // 1. The port, the heap's region.
        let nic = self.open_nic(&opts)?;
        options::check_qp_room(size, qpp, nic.max_qps())?;
        // SAFETY: the heap outlives this state (the communicator drops the
        // state before its heap).
        let heap_mr = unsafe { nic.reg_mr(self.heap_base, self.heap_len as usize, access::ALL) }?;

        // 2. Ring memory, scratch, the kernels' queue states.
        let nqps = size * qpp;
        let layout = RingLayout::new(sq);
        let per_qp = layout.per_qp;
        // A page more, so the first QP's rings can start on a page.
        let rings = Backing::alloc(&self.device, nqps * per_qp + RING_ALIGN, host_rings)?;
        let rings_base = rings.addr().next_multiple_of(RING_ALIGN as u64);
        let scratch_bytes = nqps * sq as usize * 8;
        let scratch = Backing::alloc(&self.device, scratch_bytes, host_rings)?;
        let states = self.device.alloc_zeroed::<u8>(nqps * std::mem::size_of::<QpCounters>())?;
        // SAFETY: the scratch buffer lives in `memory`, which outlives the region.
        let scratch_mr = unsafe { nic.reg_mr(scratch.addr(), scratch_bytes, access::LOCAL_WRITE) }?;
        rings.write(&self.device, rings_base, &layout.fresh_rings(nqps, sq))?;
        tracing::debug!(
            "rank {rank}: IBGDA set-up: port {} (LID {}) open; rings of {nqps} QPs ({} bytes), scratch and QP states allocated and initialised in {} ms",
            nic.port().name,
            nic.port().lid,
            nqps * per_qp,
            t_setup.elapsed().as_millis()
        );

        // 3. QPs: to every rank, this one included (loopback).
        // SAFETY: the rings live in `memory`, which is freed only after the
        // NIC stopped and the objects are dropped.
        let (cqs, qps) = unsafe { layout.create_queues(&*nic, rings_base, nqps, sq) }?;

        // 4. Exchange the heap base, its rkey, then every QP's endpoint.
        let mut mine = Vec::with_capacity(12 + nqps * Endpoint::BYTES);
        mine.extend_from_slice(&self.heap_base.to_le_bytes());
        mine.extend_from_slice(&heap_mr.rkey().to_le_bytes());
        for q in &qps {
            mine.extend_from_slice(&q.endpoint().to_bytes());
        }
        let all = self.world.all_gather_bytes(&mine)?;
        let mut remotes = all
            .iter()
            .enumerate()
            .map(|(r, b)| PeerHeap::decode(b, r, nqps))
            .collect::<Result<Vec<_>>>()?;
        for (p, remote) in remotes.iter_mut().enumerate() {
            remote.base = remote
                .base
                .wrapping_add(super::RouteFault::skew(self.self_test.fault, rank, p, super::SelfTestRoute::Ibgda));
        }

        // Connect QP k to peer p with the peer's QP k to this rank.
        let remote_access = access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;
        for (p, remote) in remotes.iter().enumerate() {
            for k in 0..qpp {
                qps[p * qpp + k].connect(&remote.qps[rank * qpp + k], remote_access, &qp_opts)?;
            }
        }
        tracing::debug!(
            "rank {rank}: IBGDA set-up: {nqps} QPs connected (RTS) in {} ms",
            t_setup.elapsed().as_millis()
        );

        // The kernels' view of every QP.
        let view = KernelView {
            rings_base,
            layout: &layout,
            sq,
            qps_per_peer: qpp,
            states: states.as_raw() as *mut QpCounters,
            scratch: scratch.addr() as *mut u64,
            scratch_lkey: scratch_mr.lkey(),
            qp_flags: if nic.on_the_kernels_gpu() { QP_GPU_SCOPE } else { 0 },
        };
        let words = view.table_words(&remotes, &qps);
        let table = self.device.alloc_from(&words)?;
        tracing::debug!("rank {rank}: IBGDA set-up: the kernels' QP table copied to the device");
        let handle = Ibgda {
            rank: rank as u32,
            world: size as u32,
            heap_bytes: self.heap_len,
            local_base: self.heap_base,
            budget_ns: self.budget_ns,
            qps: table.as_ptr() as *const IbgdaQp,
            qps_per_peer: opts.qps_per_peer,
            max_msg: opts.max_msg,
            heap_lkey: heap_mr.lkey(),
            nreg: 0,
            reg: [RegRegion::default(); REG_SLOTS],
        };
        // From here on a failure drops the state: the NIC stops before
        // anything it may read is freed.
        let mut st = IbgdaState {
            qps,
            cqs,
            registered: Vec::new(),
            _scratch_mr: scratch_mr,
            _heap_mr: heap_mr,
            memory: Some(Memory {
                _rings: rings,
                _scratch: scratch,
                states,
                table,
            }),
            nic,
            opts,
            handle,
            table_words: words,
        };

        // 5. Everyone is in RTS before any kernel posts; then the NIC starts.
        self.world.barrier()?;
        let kernel_qps = &st.memory.as_ref().expect("set above").table;
        st.nic.start(&StartCtx {
            rank,
            size,
            device: &self.device,
            world: &self.world,
            kernel_qps,
            nqps,
            heap_base: Some(self.heap_base),
            ranks_per_gpu: self.ranks_per_gpu,
        })?;
        tracing::info!(
            "rank {rank}: IBGDA over {}: {nqps} QPs ({qpp} per rank), SQ {sq} slots",
            st.nic.describe()
        );
        tracing::debug!("rank {rank}: IBGDA set-up done in {} ms", t_setup.elapsed().as_millis());
        Ok(st)
    }
}

impl Drop for IbgdaState {
    fn drop(&mut self) {
        // The NIC first: nothing touches the rings while they go away.
        if let Err(why) = self.nic.stop() {
            // It may still touch the rings and the scratch: keep them.
            tracing::error!(
                "rank {}: {why}; the IBGDA rings, scratch and QP table of {} are leaked",
                self.handle.rank,
                self.nic.port().name
            );
            std::mem::forget(self.memory.take());
        }
        // Then the QPs before their CQs, the regions, the memory, the port.
        self.qps.clear();
        self.cqs.clear();
        self.registered.clear();
    }
}

/// `table` with QP `i`'s doorbell replaced by the `i`-th of `host`: the
/// kernels ring a GPU's address of the doorbell, which on a NIC whose
/// register the GPU maps is not an address the CPU may store to.
fn with_host_doorbells(table: impl Iterator<Item = IbgdaQp>, host: impl Iterator<Item = u64>) -> Vec<IbgdaQp> {
    table
        .zip(host)
        .map(|(mut e, db)| {
            e.qp.uar = db as *mut u64;
            e
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QP `i`'s entry as words that all differ, its doorbell a GPU's address.
    fn entry(i: u64) -> IbgdaQp {
        let w: [u64; 16] = std::array::from_fn(|k| (i << 32) | (k as u64 + 1) << 8);
        // SAFETY: an IbgdaQp is 128 bytes of plain data.
        unsafe { std::mem::transmute::<[u64; 16], IbgdaQp>(w) }
    }

    fn words(e: &IbgdaQp) -> [u64; 16] {
        // SAFETY: as above.
        unsafe { std::mem::transmute::<IbgdaQp, [u64; 16]>(*e) }
    }

    #[test]
    fn the_hosts_table_rings_the_host_doorbells_and_keeps_every_other_field() {
        let host = [0x7f00_0000_1000u64, 0x7f00_0000_2000, 0x7f00_0000_3000];
        let got = with_host_doorbells((0..3).map(entry), host.iter().copied());
        assert_eq!(got.len(), 3);
        for (i, e) in got.iter().enumerate() {
            assert_eq!(e.qp.uar as u64, host[i], "QP {i}'s doorbell");
            let (before, after) = (words(&entry(i as u64)), words(e));
            let changed: Vec<usize> = (0..16).filter(|&k| before[k] != after[k]).collect();
            assert_eq!(changed.len(), 1, "QP {i}: only the doorbell's word changes, not {changed:?}");
            assert_eq!(after[changed[0]], host[i]);
        }
    }
}
