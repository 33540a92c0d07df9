//! The setup interface, shaped like verbs + mlx5 direct verbs, so that a
//! transport written against it switches from the soft NIC to a ConnectX
//! NIC by changing only which device it opens.
//!
//! The sequence is verbs': open a device → allocate a protection domain →
//! register memory (lkey, rkey) → create CQs → create a QP → move it
//! RESET → INIT → RTR (connected to the remote QP) → RTS; ERR and RESET
//! from any state. What differs from plain verbs is IBGDA's: the SQ, RQ,
//! CQ rings, doorbell records and the UAR word live in memory the caller
//! chose (GPU memory on real hardware, registered with
//! `mlx5dv_devx_umem_reg` and named in the DevX `CREATE_CQ` / `CREATE_QP`
//! commands; host or emulator memory for the soft NIC), because the GPU
//! writes WQEs and polls CQEs there itself. [`CqRing`] and [`QpRings`]
//! describe that memory; nothing here knows about GPUs.
//!
//! Endpoints ([`QpEndpoint`]: LID + QP number) are exchanged out of band
//! (the communicator's rendezvous) and passed to
//! [`QueuePair::modify_to_rtr`].

use crate::engine::QpState;

/// A CQ's memory: `entries` CQE64s and the consumer's doorbell record pair
/// (`[0]` = BE32 consumer index, `MLX5_CQ_SET_CI`; `[1]` = arm word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqRing {
    /// `entries × 64` bytes, 64-byte aligned.
    pub buf: *mut u8,
    /// Entries, a power of two.
    pub entries: u32,
    /// Two BE32 words, 8-byte aligned. Null: the NIC does not learn the
    /// consumer index (the soft NIC then cannot hold completions back when
    /// the CQ is full).
    pub dbrec: *mut u32,
}

/// A QP's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpRings {
    /// SQ: `sq_wqebbs × 64` bytes, 64-byte aligned.
    pub sq: *mut u8,
    /// SQ size in 64-byte basic blocks, a power of two.
    pub sq_wqebbs: u32,
    /// RQ: `rq_wqes × rq_max_sge × 16` bytes, 16-byte aligned; null with
    /// `rq_wqes == 0` (no receive queue).
    pub rq: *mut u8,
    /// RQ size in receive WQEs, a power of two, or 0.
    pub rq_wqes: u32,
    /// Scatter entries per receive WQE, a power of two.
    pub rq_max_sge: u32,
    /// Doorbell record pair: `[0]` BE32 receive counter (`MLX5_RCV_DBR`),
    /// `[1]` BE32 send counter (`MLX5_SND_DBR`); 8-byte aligned.
    pub dbrec: *mut u32,
    /// The UAR doorbell register (8 bytes, 8-byte aligned); null: the soft
    /// NIC watches the doorbell record instead (a real NIC needs its UAR).
    pub uar: *mut u64,
}

/// Where a QP can be reached: what the peer passes to `modify_to_rtr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpEndpoint {
    /// The port's LID.
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
}

/// A registered memory region.
pub trait MemoryRegion {
    /// Key for this port's own WQEs (data segments, receive scatter lists).
    fn lkey(&self) -> u32;
    /// Key peers put in remote-address segments.
    fn rkey(&self) -> u32;
    /// First byte.
    fn addr(&self) -> u64;
    /// Bytes.
    fn len(&self) -> usize;
    /// Whether it is empty (never, once registered).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A completion queue.
pub trait CompletionQueue {
    /// CQ number.
    fn cqn(&self) -> u32;
    /// Its memory.
    fn ring(&self) -> CqRing;
}

/// An RC queue pair.
pub trait QueuePair {
    /// The provider's error type.
    type Error: std::error::Error + Send + Sync + 'static;
    /// QP number.
    fn qpn(&self) -> u32;
    /// Where peers reach it.
    fn endpoint(&self) -> QpEndpoint;
    /// Its memory.
    fn rings(&self) -> QpRings;
    /// Its current state.
    fn state(&self) -> QpState;
    /// RESET → INIT, granting peers the `access` remote flags
    /// (`IBV_ACCESS_REMOTE_*`).
    fn modify_to_init(&self, access: u32) -> Result<(), Self::Error>;
    /// INIT → RTR, connected to `remote`.
    fn modify_to_rtr(&self, remote: QpEndpoint) -> Result<(), Self::Error>;
    /// RTR → RTS: the NIC starts executing the SQ on doorbells.
    fn modify_to_rts(&self) -> Result<(), Self::Error>;
    /// Any → ERR: outstanding and new WQEs complete with flush errors.
    fn modify_to_err(&self) -> Result<(), Self::Error>;
    /// Any → RESET: forgets progress and the connection.
    fn modify_to_reset(&self) -> Result<(), Self::Error>;
    /// INIT → RTR → RTS in one go (from RESET).
    fn connect(&self, remote: QpEndpoint, access: u32) -> Result<(), Self::Error> {
        self.modify_to_init(access)?;
        self.modify_to_rtr(remote)?;
        self.modify_to_rts()
    }
}

/// An RDMA device (one port): the verbs entry point.
///
/// # Safety of the `unsafe` methods
/// They hand the device raw memory that it reads and writes on its own,
/// asynchronously, until the returned object is dropped (as `ibv_reg_mr`,
/// DevX UMEM registration and queue creation do): the memory must stay
/// valid and not be freed or reused for anything else before that.
pub trait RdmaDevice {
    /// The provider's error type.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Protection domain.
    type Pd;
    /// Memory region.
    type Mr: MemoryRegion;
    /// Completion queue.
    type Cq: CompletionQueue;
    /// Queue pair.
    type Qp: QueuePair<Error = Self::Error>;

    /// The port's LID.
    fn lid(&self) -> u16;
    /// `ibv_alloc_pd`.
    fn alloc_pd(&self) -> Result<Self::Pd, Self::Error>;
    /// `ibv_reg_mr`: registers `len` bytes at `addr` with `access`
    /// (`IBV_ACCESS_*`; remote write and remote atomic need local write).
    ///
    /// # Safety
    /// See the trait: the memory stays valid while the region lives.
    unsafe fn reg_mr(&self, pd: &Self::Pd, addr: *mut u8, len: usize, access: u32) -> Result<Self::Mr, Self::Error>;
    /// Creates a CQ on the memory `ring` (initialising its CQEs as
    /// invalid).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn create_cq(&self, ring: CqRing) -> Result<Self::Cq, Self::Error>;
    /// Creates an RC QP in `pd` on the memory `rings`, completing to
    /// `send_cq` and `recv_cq`. It starts in RESET.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn create_qp(&self, pd: &Self::Pd, send_cq: &Self::Cq, recv_cq: &Self::Cq, rings: QpRings) -> Result<Self::Qp, Self::Error>;
}
