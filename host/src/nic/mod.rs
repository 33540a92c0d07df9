//! The NIC boundary: what the IBGDA transport's set-up asks of an RDMA
//! device, in one place, with two implementations — the soft NIC
//! ([`soft`], the GPU-resident engine of `doorbell-softnic`) and a
//! ConnectX NIC through mlx5 DevX ([`mlx5`], rdma-core loaded at run time
//! by `rdma-sys-ext`).
//!
//! The sequence is verbs': open a port ([`soft::open`],
//! [`mlx5::Mlx5Nic::open`]) → register memory
//! ([`Nic::reg_mr`]) → create CQs and QPs over memory the caller chose
//! ([`Nic::create_cq`], [`Nic::create_qp`]: the GPU writes WQEs and polls
//! CQEs there itself) → exchange [`Endpoint`]s out of band → move each QP
//! RESET → INIT → RTR → RTS ([`QueuePair::connect`]) → once every rank's
//! QPs are ready, [`Nic::start`] (the soft NIC launches its engine; mlx5
//! starts the CPU-assisted doorbell where the GPU cannot map the UAR) →
//! kernels post → [`Nic::stop`] before anything is freed.
//!
//! Nothing here knows which transport uses it, and the communicator's
//! IBGDA set-up (`comm::ibgda`) knows nothing of either implementation
//! beyond opening one and the soft NIC's diagnostics.
//!
//! Which implementation is used is `DOORBELL_NIC=auto|soft|mlx5`
//! ([`NicChoice`]); which port, `DOORBELL_IB_HCA` (NCCL's syntax) or the
//! port nearest the GPU ([`rdma_sys_ext::topo`]).

use std::any::Any;

use crate::error::{Error, Result};

pub mod mlx5;
pub mod select;
pub mod soft;

pub use doorbell_softnic::{CqRing, QpRings};

/// `DOORBELL_NIC`: `auto` (default), `soft` or `mlx5`.
pub const NIC_ENV: &str = "DOORBELL_NIC";

/// Access flags of a memory region or a QP, with verbs' values
/// (`IBV_ACCESS_*`), which both implementations take (the soft NIC defines
/// them, as it checks them itself).
pub use doorbell_softnic::engine::access;

/// Which implementation: `DOORBELL_NIC`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NicChoice {
    /// mlx5 where one is usable, else the soft NIC (one info line says why).
    Auto,
    /// The soft NIC.
    Soft,
    /// A ConnectX NIC; an error naming what is missing when none is usable.
    Mlx5,
}

impl NicChoice {
    /// `auto`, `soft` or `mlx5`.
    pub fn parse(var: &str, s: &str) -> Result<NicChoice> {
        match s.trim() {
            "" | "auto" => Ok(NicChoice::Auto),
            "soft" => Ok(NicChoice::Soft),
            "mlx5" => Ok(NicChoice::Mlx5),
            _ => Err(Error::BadEnv {
                var: var.to_string(),
                value: s.to_string(),
                reason: "expected auto, soft or mlx5".to_string(),
            }),
        }
    }

    /// From [`NIC_ENV`] (unset: [`NicChoice::Auto`]).
    pub fn from_env() -> Result<NicChoice> {
        match crate::vars::raw(NIC_ENV)? {
            None => Ok(NicChoice::Auto),
            Some(v) => NicChoice::parse(NIC_ENV, &v),
        }
    }
}

/// Which kind of device an opened [`Nic`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NicKind {
    /// `doorbell-softnic`.
    Soft,
    /// A ConnectX NIC through mlx5 DevX.
    Mlx5,
}

/// A port's link layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: QPs are addressed by LID.
    InfiniBand,
    /// Ethernet (RoCE v2): QPs are addressed by GID.
    Ethernet,
}

/// What [`Nic::port`] reports of the opened port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// `mlx5_0:1`, or `soft:<index>`.
    pub name: String,
    /// LID (InfiniBand; 0 on Ethernet).
    pub lid: u16,
    /// The GID QPs are addressed by on Ethernet (zero where none is used).
    pub gid: [u8; 16],
    /// Its index in the port's GID table (RoCE v2), if one is used.
    pub gid_index: Option<u32>,
    /// InfiniBand or Ethernet.
    pub link_layer: LinkLayer,
    /// The port's active MTU in bytes (256..=4096).
    pub active_mtu: u32,
}

/// Where a QP can be reached: what the peer passes to
/// [`QueuePair::connect`]. Exchanged through the communicator's
/// rendezvous as [`Endpoint::BYTES`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Endpoint {
    /// The port's LID (InfiniBand).
    pub lid: u16,
    /// The port's GID (RoCE v2).
    pub gid: [u8; 16],
    /// QP number (24 bits).
    pub qpn: u32,
    /// The first packet sequence number the QP sends (24 bits).
    pub psn: u32,
    /// The path MTU the QP will use, in bytes.
    pub mtu: u32,
    /// Provider-private word: the soft NIC's slot of the QP in its port's
    /// table (what a port of another process's fabric is reached by); 0
    /// on mlx5.
    pub slot: u32,
}

impl Endpoint {
    /// Bytes of [`Endpoint::to_bytes`].
    pub const BYTES: usize = 2 + 16 + 4 + 4 + 4 + 4;

    /// Little-endian, fields in declaration order.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..2].copy_from_slice(&self.lid.to_le_bytes());
        b[2..18].copy_from_slice(&self.gid);
        b[18..22].copy_from_slice(&self.qpn.to_le_bytes());
        b[22..26].copy_from_slice(&self.psn.to_le_bytes());
        b[26..30].copy_from_slice(&self.mtu.to_le_bytes());
        b[30..34].copy_from_slice(&self.slot.to_le_bytes());
        b
    }

    /// The inverse of [`Endpoint::to_bytes`]; `None` for another length.
    pub fn from_bytes(b: &[u8]) -> Option<Endpoint> {
        if b.len() != Self::BYTES {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        Some(Endpoint {
            lid: u16::from_le_bytes([b[0], b[1]]),
            gid: b[2..18].try_into().expect("16 bytes"),
            qpn: u32_at(18),
            psn: u32_at(22),
            mtu: u32_at(26),
            slot: u32_at(30),
        })
    }
}

/// How a QP is connected: the RC attributes of INIT → RTR → RTS that a
/// real NIC needs (the soft NIC ignores what it does not model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpOptions {
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096); `None`: the port's
    /// active MTU (`DOORBELL_IB_MTU`).
    pub mtu: Option<u32>,
    /// Local ACK timeout exponent, 4.096 µs × 2^timeout (`DOORBELL_IB_TIMEOUT`, default 18, about 1 s).
    pub timeout: u8,
    /// Transport retries (`DOORBELL_IB_RETRY_CNT`, default 7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (7: forever).
    pub rnr_retry: u8,
    /// Outstanding RDMA reads and atomics, each way (`DOORBELL_IB_MAX_RD_ATOMIC`, default 16).
    pub max_rd_atomic: u8,
    /// Service level (`DOORBELL_IB_SL`, default 0).
    pub sl: u8,
    /// Traffic class (RoCE; `DOORBELL_IB_TC`, default 0).
    pub traffic_class: u8,
}

impl Default for QpOptions {
    fn default() -> Self {
        QpOptions {
            mtu: None,
            timeout: 18,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            sl: 0,
            traffic_class: 0,
        }
    }
}

impl QpOptions {
    /// The defaults with `DOORBELL_IB_MTU` (256, 512, 1024, 2048 or 4096),
    /// `DOORBELL_IB_TIMEOUT` (0..=31), `DOORBELL_IB_RETRY_CNT` (0..=7),
    /// `DOORBELL_IB_MAX_RD_ATOMIC` (1..=16), `DOORBELL_IB_SL` (0..=15) and
    /// `DOORBELL_IB_TC` (0..=255) applied; a value out of range is an
    /// error naming the variable.
    pub fn from_env() -> Result<QpOptions> {
        let d = QpOptions::default();
        let small =
            |var: &str, default: u8, min: u64, max: u64| -> Result<u8> { Ok(crate::vars::uint(var, default as u64, min, max)? as u8) };
        let mtu = match crate::vars::raw("DOORBELL_IB_MTU")? {
            None => None,
            Some(v) => match v.trim() {
                m @ ("256" | "512" | "1024" | "2048" | "4096") => Some(m.parse().expect("listed")),
                _ => {
                    return Err(Error::BadEnv {
                        var: "DOORBELL_IB_MTU".to_string(),
                        value: v,
                        reason: "expected 256, 512, 1024, 2048 or 4096 (bytes)".to_string(),
                    })
                }
            },
        };
        Ok(QpOptions {
            mtu,
            timeout: small("DOORBELL_IB_TIMEOUT", d.timeout, 0, 31)?,
            retry_cnt: small("DOORBELL_IB_RETRY_CNT", d.retry_cnt, 0, 7)?,
            rnr_retry: d.rnr_retry,
            max_rd_atomic: small("DOORBELL_IB_MAX_RD_ATOMIC", d.max_rd_atomic, 1, 16)?,
            sl: small("DOORBELL_IB_SL", d.sl, 0, 15)?,
            traffic_class: small("DOORBELL_IB_TC", d.traffic_class, 0, 255)?,
        })
    }
}

/// `DOORBELL_IB_DOORBELL`: how a ConnectX's doorbell is rung.
pub const DOORBELL_ENV: &str = "DOORBELL_IB_DOORBELL";

/// How kernels ring a ConnectX's doorbell (`DOORBELL_IB_DOORBELL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DoorbellPath {
    /// The UAR page mapped into the GPU where the driver allows it, else
    /// a host thread forwards the GPU's doorbells (said in the log).
    Auto,
    /// The UAR page mapped into the GPU; where the driver refuses, an
    /// error naming what to change (`PeerMappingOverride`).
    Gpu,
    /// Always CPU-assisted (a host thread rings the UAR).
    Cpu,
}

impl DoorbellPath {
    /// From [`DOORBELL_ENV`]: `auto` (default), `gpu` or `cpu`.
    pub fn from_env() -> Result<DoorbellPath> {
        let Some(v) = crate::vars::raw(DOORBELL_ENV)? else {
            return Ok(DoorbellPath::Auto);
        };
        match v.trim() {
            "auto" => Ok(DoorbellPath::Auto),
            "gpu" => Ok(DoorbellPath::Gpu),
            "cpu" => Ok(DoorbellPath::Cpu),
            _ => Err(Error::BadEnv {
                var: DOORBELL_ENV.to_string(),
                value: v,
                reason: "expected auto, gpu or cpu".to_string(),
            }),
        }
    }
}

/// Checks every NIC variable (`DOORBELL_NIC`, `DOORBELL_IB_HCA`,
/// `DOORBELL_IB_*`, `DOORBELL_IB_DOORBELL`) without opening anything: what `doorbell::env::check`
/// runs.
pub fn check_env() -> Result<()> {
    NicChoice::from_env()?;
    select::Probe::system()?;
    QpOptions::from_env()?;
    DoorbellPath::from_env()?;
    Ok(())
}

/// A registered memory region.
pub trait MemoryRegion: Send + Sync {
    /// Key for this port's own WQEs.
    fn lkey(&self) -> u32;
    /// Key peers put in remote-address segments.
    fn rkey(&self) -> u32;
}

/// A completion queue over caller-chosen memory.
pub trait CompletionQueue: Send + Sync {
    /// CQ number.
    fn cqn(&self) -> u32;
    /// The implementation's own object, for [`Nic::create_qp`].
    fn as_any(&self) -> &dyn Any;
}

/// An RC queue pair over caller-chosen memory. It starts in RESET.
pub trait QueuePair: Send + Sync {
    /// QP number.
    fn qpn(&self) -> u32;
    /// Where peers reach it.
    fn endpoint(&self) -> Endpoint;
    /// RESET → INIT → RTR → RTS toward `remote`, granting the peer
    /// `access` ([`access`] remote flags).
    fn connect(&self, remote: &Endpoint, access: u32, opts: &QpOptions) -> Result<()>;
    /// Any → ERR: outstanding and new WQEs complete with flush errors.
    fn modify_to_err(&self) -> Result<()>;
    /// The address the GPU rings this QP's doorbell at (8 bytes): the
    /// caller's UAR word on the soft NIC, the UAR page mapped into the
    /// GPU on mlx5 (or a word a host thread forwards to it, where the
    /// GPU cannot map the UAR).
    fn doorbell(&self) -> u64;
    /// The address a host thread rings this QP's doorbell at (8 bytes),
    /// for one that posts the WQEs itself (the CPU proxy): on mlx5 the UAR
    /// register as this process maps it, whether or not the GPU maps it
    /// too (the GPU's address of it, [`Self::doorbell`], is not one the
    /// CPU may store to); on the soft NIC the same word as
    /// [`Self::doorbell`], which the host reaches where the rings are
    /// mapped host memory.
    fn host_doorbell(&self) -> u64;
}

/// What [`Nic::start`] gets: the collective context in which every rank
/// starts its port once all QPs are in RTS.
pub struct StartCtx<'a> {
    /// This rank.
    pub rank: usize,
    /// Ranks in the world.
    pub size: usize,
    /// The device the kernels run on.
    pub device: &'a crate::Device,
    /// The world (collectives among the ranks, over the host channel).
    pub world: &'a crate::World,
    /// The kernels' QP table (`IbgdaQp` × `nqps`, device memory), which
    /// an implementation may check its own view against.
    pub kernel_qps: &'a crate::DeviceBuffer<u64>,
    /// QPs in that table.
    pub nqps: usize,
    /// This rank's symmetric heap, registered with the NIC (`None`: no
    /// heap): where the soft NIC's engine finds the device trace's rings.
    pub heap_base: Option<u64>,
    /// The most ranks of the world that share one GPU (the soft NIC's
    /// engine kernels of those ranks hold SMs of it together).
    pub ranks_per_gpu: usize,
}

/// An opened port of an RDMA device, with its protection domain.
///
/// # Safety of the `unsafe` methods
/// They hand the device memory that it reads and writes on its own,
/// asynchronously, until the returned object is dropped (as `ibv_reg_mr`,
/// DevX UMEM registration and queue creation do): the memory must stay
/// valid and must not be freed or reused before that object is dropped
/// and, for rings, before [`Nic::stop`] returned.
pub trait Nic: Send + Sync {
    /// Which implementation.
    fn kind(&self) -> NicKind;
    /// The opened port.
    fn port(&self) -> &PortInfo;
    /// One line for the log: the device, the port, how memory is
    /// registered and how doorbells are rung.
    fn describe(&self) -> String;
    /// Registers `len` bytes at `addr` (device memory on a GPU) with
    /// `access` ([`access`]).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn reg_mr(&self, addr: u64, len: usize, access: u32) -> Result<Box<dyn MemoryRegion>>;
    /// Creates a CQ on `ring`, whose CQEs the caller has made invalid
    /// (owner bit 0, opcode invalid).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn create_cq(&self, ring: CqRing) -> Result<Box<dyn CompletionQueue>>;
    /// Creates an RC QP on `rings`, completing its sends to `cq`; in RESET.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn create_qp(&self, cq: &dyn CompletionQueue, rings: QpRings) -> Result<Box<dyn QueuePair>>;
    /// Collective: called by every rank once every QP of the world is in
    /// RTS, before any kernel posts.
    fn start(&mut self, ctx: &StartCtx<'_>) -> Result<()>;
    /// Stops what [`Nic::start`] started and waits (bounded) until the
    /// device no longer touches the rings. `Err` says why it may still
    /// touch them; the caller then leaks the memory instead of freeing it.
    fn stop(&mut self) -> std::result::Result<(), String>;
    /// Whether what reads the rings and writes the CQEs runs on the GPU
    /// the kernels run on (the soft NIC's engine kernel), so the kernels
    /// may ring doorbells and poll CQEs with GPU-scope ordering
    /// (`QP_GPU_SCOPE` in their QP handles) instead of the system scope a
    /// NIC across PCIe needs. `false` unless an implementation knows.
    fn on_the_kernels_gpu(&self) -> bool {
        false
    }
    /// The most RC QPs (each with its own CQ) the opened port takes, when
    /// the implementation knows a bound a transport may reach; `None`:
    /// none it could reach (a ConnectX takes millions).
    fn max_qps(&self) -> Option<usize> {
        None
    }
    /// The soft NIC, for its diagnostics and fault injection.
    fn as_any(&self) -> &dyn Any;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_and_other_lengths_are_refused() {
        let e = Endpoint {
            lid: 0x1234,
            gid: std::array::from_fn(|i| i as u8 + 1),
            qpn: 0xab_cdef,
            psn: 0x12_3456,
            mtu: 4096,
            slot: 7,
        };
        let b = e.to_bytes();
        assert_eq!(Endpoint::from_bytes(&b), Some(e));
        assert_eq!(Endpoint::from_bytes(&b[1..]), None);
        assert_eq!(Endpoint::from_bytes(&[b.as_slice(), &[0]].concat()), None);
    }

    /// The only test that sets `DOORBELL_IB_*` (the process's environment
    /// is shared by the tests).
    #[test]
    fn qp_options_from_env_apply_values_and_refuse_out_of_range() {
        std::env::set_var("DOORBELL_IB_MTU", "2048");
        std::env::set_var("DOORBELL_IB_TIMEOUT", "14");
        let o = QpOptions::from_env().expect("valid");
        assert_eq!((o.mtu, o.timeout, o.retry_cnt), (Some(2048), 14, 7));
        std::env::set_var("DOORBELL_IB_MTU", "1500");
        match QpOptions::from_env() {
            Err(Error::BadEnv { var, .. }) => assert_eq!(var, "DOORBELL_IB_MTU"),
            r => panic!("{r:?}"),
        }
        std::env::remove_var("DOORBELL_IB_MTU");
        std::env::set_var("DOORBELL_IB_TIMEOUT", "32");
        match QpOptions::from_env() {
            Err(Error::BadEnv { var, .. }) => assert_eq!(var, "DOORBELL_IB_TIMEOUT"),
            r => panic!("{r:?}"),
        }
        std::env::remove_var("DOORBELL_IB_TIMEOUT");
        assert_eq!(QpOptions::from_env().expect("defaults"), QpOptions::default());
        assert_eq!(DoorbellPath::from_env().expect("unset"), DoorbellPath::Auto);
        std::env::set_var(DOORBELL_ENV, "gpu");
        assert_eq!(DoorbellPath::from_env().expect("gpu"), DoorbellPath::Gpu);
        std::env::set_var(DOORBELL_ENV, "uar");
        assert!(matches!(DoorbellPath::from_env(), Err(Error::BadEnv { .. })));
        std::env::remove_var(DOORBELL_ENV);
    }
}
