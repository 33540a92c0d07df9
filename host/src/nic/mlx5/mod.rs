//! A ConnectX port behind the NIC boundary, through mlx5 DevX: [`Mlx5Nic`].
//!
//! * **Open**: `mlx5dv_open_device` with DevX, the port's LID / GID / MTU,
//!   a PD (its number from `mlx5dv_init_obj`), the completion EQ, and one
//!   non-cached UAR page for every QP's and CQ's doorbells.
//! * **Memory** ([`Nic::reg_mr`]) and **rings** (DevX umems): GPU memory
//!   is handed over as a dma-buf (`cuMemGetHandleForAddressRange` →
//!   `ibv_reg_dmabuf_mr` / `mlx5dv_devx_umem_reg_ex`) where the kernel and
//!   rdma-core support it, else by its pointer through `nvidia_peermem`;
//!   with neither, opening fails with what to enable. [`Nic::describe`]
//!   says which one registered the last region.
//! * **CQs and QPs** are DevX objects created by the PRM commands of
//!   [`rdma_sys_ext::prm`] over the caller's rings: 64-byte CQEs; RC QPs
//!   with a zero-length RQ unless the caller gave one (then the SQ must
//!   follow it in one buffer). [`QueuePair::connect`] runs RST2INIT,
//!   INIT2RTR (LID on InfiniBand; GID, GID index, traffic class and the
//!   next hop's MAC on RoCE v2) and RTR2RTS.
//! * **Doorbells**: the UAR page is mapped into the GPU
//!   (`cuMemHostRegister(IOMEMORY | DEVICEMAP)`), and [`QueuePair::doorbell`]
//!   is the doorbell register's GPU address. Where the driver refuses that
//!   mapping, each QP gets a word of mapped host memory instead, and
//!   [`Nic::start`] starts a host thread that copies every new value
//!   written there to the UAR register (CPU-assisted doorbells, stated in
//!   [`Nic::describe`] and logged); [`Nic::stop`] stops it.
//!
//! Not run here: everything past loading rdma-core needs a ConnectX NIC
//! (and a GPU); `tests/tests/nic_hw.rs` and `scripts/run-nic-tests.sh`
//! exercise it on one. What needs no device (command building, path and
//! MTU choice, ring checks, the registration choice) is in [`plan`] and
//! tested.

mod driver;
pub mod plan;
mod proxy;
mod queues;

use std::any::Any;
use std::path::Path;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;
use rdma_sys_ext::prm;
use rdma_sys_ext::sys;
use rdma_sys_ext::topo::{self, Choice};
use rdma_sys_ext::{DeviceList, Verbs};

use self::plan::RegMethod;
use self::proxy::{Proxy, ProxyTable};
use self::queues::{nic_err, Cq, DevxObj, Mr, Qp, Umem};
use super::{CompletionQueue, CqRing, DoorbellPath, LinkLayer, MemoryRegion, Nic, NicKind, PortInfo, QpRings, QueuePair, StartCtx};
use crate::error::{Error, Result};

/// log2 of the largest message a QP sends or accepts (1 GiB, within every
/// ConnectX's `log_max_msg`).
pub const LOG_MSG_MAX: u8 = 30;

/// Bytes of a UAR page.
const UAR_PAGE_BYTES: usize = 4096;

/// What the port's objects share: the context, PD, UAR, and how memory is
/// registered. Dropped after the last object (each holds it).
pub(crate) struct Shared {
    verbs: Arc<Verbs>,
    ctx: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
    pdn: u32,
    eqn: u32,
    uar: *mut sys::mlx5dv_devx_uar,
    /// The UAR page's GPU mapping (`cuMemHostRegister`), if the driver allowed it.
    uar_gpu: Option<u64>,
    cuda: Arc<CudaContext>,
    port: PortInfo,
    port_num: u8,
    local_mac: Option<[u8; 6]>,
    reg_order: Vec<RegMethod>,
    last_reg: Mutex<Option<RegMethod>>,
    proxy: Mutex<Option<ProxyTable>>,
}

// SAFETY: the raw handles are used only through libibverbs/libmlx5, which
// are thread-safe; the mutable state is behind mutexes.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    fn err(&self, what: String) -> Error {
        nic_err(&self.port.name, what)
    }

    /// Logs a release that failed where nothing can return it: a drop.
    fn warn_failed<E: std::fmt::Display>(&self, released: std::result::Result<(), E>) {
        if let Err(e) = released {
            tracing::warn!("mlx5 {}: {e}", self.port.name);
        }
    }

    /// Calls `f(fd, offset of addr in the dma-buf)` with a dma-buf of the
    /// 4 KiB pages around `addr..addr+len`, closing it afterwards.
    fn with_dmabuf<T>(
        &self,
        addr: usize,
        len: usize,
        f: impl FnOnce(i32, u64) -> std::result::Result<T, String>,
    ) -> std::result::Result<T, String> {
        let start = addr & !(UAR_PAGE_BYTES - 1);
        let end = (addr + len).next_multiple_of(UAR_PAGE_BYTES);
        let fd = driver::dmabuf_fd(&self.cuda, start as u64, end - start).map_err(|e| e.to_string())?;
        let r = f(fd, (addr - start) as u64);
        // SAFETY: `fd` was returned by the driver for us; the NIC keeps its own reference.
        unsafe { libc::close(fd) };
        r
    }

    /// The UAR register's host address.
    fn uar_reg(&self) -> *mut u64 {
        // SAFETY: live UAR.
        unsafe { (*self.uar).reg_addr.cast() }
    }

    fn uar_page_id(&self) -> u32 {
        // SAFETY: live UAR.
        unsafe { (*self.uar).page_id }
    }

    fn proxy_release(&self, slot: usize) {
        if let Some(t) = self.proxy.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            t.release(slot);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let name = self.port.name.clone();
        let warn = |what: &str, e: &dyn std::fmt::Display| tracing::warn!("mlx5 {name}: {what}: {e}");
        if self.uar_gpu.is_some() {
            // SAFETY: registered at open; every QP (and so every kernel's use) is gone.
            if let Err(e) = unsafe { driver::host_unregister(&self.cuda, (*self.uar).base_addr) } {
                warn("cuMemHostUnregister of the UAR page", &e);
            }
        }
        // SAFETY: each handle was created once at open and every object using it is gone.
        unsafe {
            if let Err(e) = self.verbs.mlx5dv_devx_free_uar(self.uar) {
                warn("free UAR", &e);
            }
            if let Err(e) = self.verbs.dealloc_pd(self.pd) {
                warn("dealloc PD", &e);
            }
            if let Err(e) = self.verbs.close_device(self.ctx) {
                warn("close device", &e);
            }
        }
    }
}

/// A ConnectX port opened with DevX. See the module documentation.
pub struct Mlx5Nic {
    shared: Arc<Shared>,
    proxy: Option<Proxy>,
}

fn unavailable(what: String) -> Error {
    Error::NicUnavailable { missing: what }
}

/// What to do when DevX is refused.
pub const DEVX_REFUSED_HINT: &str = "DevX was refused: give the process CAP_NET_RAW (run as root, or in a container \
     `--cap-add=NET_RAW`, or `--privileged`), pass /dev/infiniband through (`--device /dev/infiniband`), and check \
     that mlx5_ib supports DevX (Linux 5.0+ or MLNX_OFED)";

/// The netdev MAC of a RoCE port's GID entry, from sysfs.
fn gid_mac(device: &str, port: u8, gid_index: u32) -> Option<[u8; 6]> {
    let p = format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/ndevs/{gid_index}");
    let ndev = std::fs::read_to_string(p).ok()?;
    let mac = std::fs::read_to_string(format!("/sys/class/net/{}/address", ndev.trim())).ok()?;
    plan::parse_mac(&mac)
}

impl Mlx5Nic {
    /// Opens `choice`'s port (from [`crate::nic::select`]) for the GPU of
    /// `device`.
    ///
    /// # Errors
    /// [`Error::NicUnavailable`] naming what is missing: a GPU, the device,
    /// DevX (with [`DEVX_REFUSED_HINT`]), a way to register GPU memory;
    /// [`Error::Comm`] when a later set-up call fails.
    pub fn open(verbs: &Arc<Verbs>, choice: &Choice, device: &crate::Device) -> Result<Mlx5Nic> {
        let name = format!("{}:{}", choice.device, choice.port);
        let cuda_ctx = device
            .as_cuda()
            .ok_or_else(|| unavailable(format!("{name}: the mlx5 NIC needs a GPU device (this one is the CPU emulator)")))?
            .clone();
        let root = Path::new("/");
        let dmabuf = verbs.has_reg_dmabuf_mr() && topo::dmabuf_supported_by_kernel(root).unwrap_or(false);
        let reg_order =
            plan::registration_order(dmabuf, topo::nvidia_peermem_loaded(root)).map_err(|e| unavailable(format!("{name}: {e}")))?;

        let list = DeviceList::new(verbs).map_err(|e| unavailable(format!("{name}: {e}")))?;
        let index = (0..list.len())
            .find(|&i| matches!(list.name(i), Some(Ok(n)) if n == choice.device))
            .ok_or_else(|| unavailable(format!("{name}: rdma-core does not list {}", choice.device)))?;
        let raw = list.get_raw(index).expect("index in range");
        // SAFETY: `raw` is an entry of the live list.
        if !unsafe { verbs.mlx5dv_is_supported(raw) }.map_err(|e| unavailable(format!("{name}: {e}")))? {
            return Err(unavailable(format!("{name}: not an mlx5 (ConnectX) device")));
        }
        let mut attr = sys::mlx5dv_context_attr {
            flags: sys::MLX5DV_CONTEXT_FLAGS_DEVX,
            comp_mask: 0,
        };
        // SAFETY: as above.
        let ctx =
            unsafe { verbs.mlx5dv_open_device(raw, &mut attr) }.map_err(|e| unavailable(format!("{name}: {e}; {DEVX_REFUSED_HINT}")))?;
        drop(list);
        // From here every failure closes what was opened.
        let mut pd: *mut sys::ibv_pd = std::ptr::null_mut();
        let mut uar: *mut sys::mlx5dv_devx_uar = std::ptr::null_mut();
        let r = (|| -> Result<Shared> {
            let e = |what: String| nic_err(&name, what);
            // SAFETY: `ctx` is live for all of these.
            let pa = unsafe { verbs.query_port(ctx, choice.port) }.map_err(|x| e(x.to_string()))?;
            let link_layer = if u32::from(pa.link_layer) == sys::IBV_LINK_LAYER_ETHERNET {
                LinkLayer::Ethernet
            } else {
                LinkLayer::InfiniBand
            };
            let active_mtu = plan::mtu_bytes(pa.active_mtu).ok_or_else(|| e(format!("port reports MTU code {}", pa.active_mtu)))?;
            let (gid, gid_index) = match (link_layer, choice.gid_index) {
                (LinkLayer::Ethernet, Some(i)) => {
                    // SAFETY: live context.
                    let g = unsafe { verbs.query_gid(ctx, choice.port, i as i32) }.map_err(|x| e(x.to_string()))?;
                    // SAFETY: a GID is 16 bytes in every view of the union.
                    (unsafe { g.raw }, Some(i))
                }
                (LinkLayer::Ethernet, None) => return Err(unavailable(format!("{name}: a RoCE port needs a RoCE v2 GID (none found)"))),
                (LinkLayer::InfiniBand, _) => ([0; 16], None),
            };
            // SAFETY: live context.
            pd = unsafe { verbs.alloc_pd(ctx) }.map_err(|x| e(x.to_string()))?;
            let mut dv_pd = sys::mlx5dv_pd::default();
            // SAFETY: zeroed table with the PD's in/out pointers set.
            let mut obj: sys::mlx5dv_obj = unsafe { std::mem::zeroed() };
            obj.pd.in_ = pd;
            obj.pd.out = &mut dv_pd;
            // SAFETY: `pd` is live, `dv_pd` valid for writes.
            unsafe { verbs.mlx5dv_init_obj(&mut obj, u64::from(sys::MLX5DV_OBJ_PD)) }.map_err(|x| e(x.to_string()))?;
            // SAFETY: live DevX context.
            let eqn = unsafe { verbs.devx_query_eqn(ctx, 0) }.map_err(|x| e(x.to_string()))?;
            // SAFETY: live DevX context.
            uar = match unsafe { verbs.mlx5dv_devx_alloc_uar(ctx, sys::MLX5DV_UAR_ALLOC_TYPE_NC) } {
                Ok(u) => u,
                // SAFETY: as above.
                Err(_) => unsafe { verbs.mlx5dv_devx_alloc_uar(ctx, sys::MLX5DV_UAR_ALLOC_TYPE_BF) }.map_err(|x| e(x.to_string()))?,
            };
            // SAFETY: the UAR page stays mapped until it is freed in Shared::drop, after this unregisters it.
            let path = DoorbellPath::from_env()?;
            let mapped = match path {
                DoorbellPath::Cpu => Err("DOORBELL_IB_DOORBELL=cpu".to_string()),
                // SAFETY: the UAR page stays mapped until it is freed in Shared::drop, after this unregisters it.
                _ => unsafe { driver::host_register_io(&cuda_ctx, (*uar).base_addr, UAR_PAGE_BYTES) }.map_err(|x| x.to_string()),
            };
            let uar_gpu = match (mapped, path) {
                (Ok(d), _) => Some(d),
                (Err(x), DoorbellPath::Gpu) => {
                    return Err(unavailable(format!(
                        "{name}: DOORBELL_IB_DOORBELL=gpu, but the GPU cannot map the NIC's UAR page ({x}); the NVIDIA \
                         driver allows that mapping to root, or to everyone with `options nvidia \
                         NVreg_RegistryDwords=\"PeerMappingOverride=1;\"` in /etc/modprobe.d/nvidia.conf (then reload the \
                         driver); or set DOORBELL_IB_DOORBELL=auto for CPU-assisted doorbells"
                    )))
                }
                (Err(x), _) => {
                    tracing::info!(
                        "mlx5 {name}: doorbells are CPU-assisted, a host thread forwards them ({x}; the GPU maps the UAR \
                         page as root or with the NVIDIA driver's PeerMappingOverride=1)"
                    );
                    None
                }
            };
            let proxy = if uar_gpu.is_none() { Some(ProxyTable::new(device)?) } else { None };
            Ok(Shared {
                verbs: verbs.clone(),
                ctx,
                pd,
                pdn: dv_pd.pdn,
                eqn,
                uar,
                uar_gpu,
                cuda: cuda_ctx.clone(),
                local_mac: gid_index.and_then(|i| gid_mac(&choice.device, choice.port, i)),
                port: PortInfo {
                    name: name.clone(),
                    lid: pa.lid,
                    gid,
                    gid_index,
                    link_layer,
                    active_mtu,
                },
                port_num: choice.port,
                reg_order,
                last_reg: Mutex::new(None),
                proxy: Mutex::new(proxy),
            })
        })();
        match r {
            Ok(shared) => Ok(Mlx5Nic {
                shared: Arc::new(shared),
                proxy: None,
            }),
            Err(err) => {
                // SAFETY: created above, no object uses them.
                unsafe {
                    if !uar.is_null() {
                        let _ = verbs.mlx5dv_devx_free_uar(uar);
                    }
                    if !pd.is_null() {
                        let _ = verbs.dealloc_pd(pd);
                    }
                    let _ = verbs.close_device(ctx);
                }
                Err(err)
            }
        }
    }

    /// Whether doorbells are forwarded by a host thread (the GPU could not
    /// map the UAR page).
    pub fn cpu_assisted_doorbells(&self) -> bool {
        self.shared.uar_gpu.is_none()
    }

    /// What [`Nic::start`] does, without the world: starts the
    /// CPU-assisted doorbell thread where the GPU cannot map the UAR page
    /// (idempotent; nothing to do otherwise).
    ///
    /// # Errors
    /// [`Error::Thread`] when the thread cannot be spawned.
    pub fn start_doorbells(&mut self) -> Result<()> {
        if self.shared.uar_gpu.is_none() && self.proxy.is_none() {
            tracing::info!(
                "mlx5 {}: starting the CPU-assisted doorbell thread (the GPU cannot map the UAR page)",
                self.shared.port.name
            );
            self.proxy = Some(Proxy::start(self.shared.clone())?);
        }
        Ok(())
    }

    /// The PD number (what DevX commands name).
    pub fn pdn(&self) -> u32 {
        self.shared.pdn
    }
}

/// The PCI bus id of `device`'s GPU (`None` on the emulator), for choosing
/// the nearest NIC.
pub fn gpu_pci_bus_id(device: &crate::Device) -> Result<Option<String>> {
    device.as_cuda().map(|c| driver::pci_bus_id(c)).transpose()
}

fn psn_seed(qpn: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (t ^ qpn.wrapping_mul(0x9e37_79b9)) & plan::MASK_24
}

impl Nic for Mlx5Nic {
    fn kind(&self) -> NicKind {
        NicKind::Mlx5
    }

    fn port(&self) -> &PortInfo {
        &self.shared.port
    }

    fn describe(&self) -> String {
        let s = &self.shared;
        let reg = match *s.last_reg.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(m) => m.describe().to_string(),
            None => format!(
                "GPU memory to be registered by {}",
                s.reg_order.iter().map(|m| m.describe()).collect::<Vec<_>>().join(", else ")
            ),
        };
        let link = match s.port.link_layer {
            LinkLayer::InfiniBand => format!("InfiniBand LID {}", s.port.lid),
            LinkLayer::Ethernet => format!(
                "RoCE v2 GID index {} ({})",
                s.port.gid_index.unwrap_or(0),
                plan::format_gid(&s.port.gid)
            ),
        };
        let db = if s.uar_gpu.is_some() {
            "doorbells rung by the GPU on the UAR page it maps"
        } else {
            "CPU-assisted doorbells (the GPU cannot map the UAR page; a host thread forwards them)"
        };
        format!(
            "mlx5 {} (DevX, {link}, MTU {}, pdn {:#x}): {reg}; {db}",
            s.port.name, s.port.active_mtu, s.pdn
        )
    }

    unsafe fn reg_mr(&self, addr: u64, len: usize, access: u32) -> Result<Box<dyn MemoryRegion>> {
        let s = &self.shared;
        let mut flags = access;
        if access & (super::access::REMOTE_WRITE | super::access::REMOTE_ATOMIC) != 0 {
            flags |= super::access::LOCAL_WRITE;
        }
        let mut why = Vec::new();
        for m in &s.reg_order {
            let r = match m {
                RegMethod::DmaBuf => s.with_dmabuf(addr as usize, len, |fd, off| {
                    // SAFETY: the caller keeps the memory (trait contract); `fd` covers it.
                    unsafe { s.verbs.reg_dmabuf_mr(s.pd, off, len, addr, fd, flags) }.map_err(|e| e.to_string())
                }),
                // SAFETY: as above.
                RegMethod::PeerMem => unsafe { s.verbs.reg_mr(s.pd, addr as *mut _, len, flags) }.map_err(|e| e.to_string()),
            };
            match r {
                Ok(mr) => {
                    *s.last_reg.lock().unwrap_or_else(|p| p.into_inner()) = Some(*m);
                    return Ok(Box::new(Mr { shared: s.clone(), mr }));
                }
                Err(e) => why.push(format!("{}: {e}", m.describe())),
            }
        }
        Err(s.err(format!("cannot register {len} bytes at {addr:#x} ({})", why.join("; "))))
    }

    unsafe fn create_cq(&self, ring: CqRing) -> Result<Box<dyn CompletionQueue>> {
        let s = &self.shared;
        let g = plan::cq_geometry(&ring).map_err(|e| s.err(e))?;
        // SAFETY: the caller keeps the rings (trait contract).
        let ring_umem = unsafe { Umem::register(s, ring.buf as usize, g.bytes) }?;
        // SAFETY: as above.
        let dbr_umem = unsafe { Umem::register(s, ring.dbrec as usize, 8) }?;
        let m = prm::create_cq(&prm::CqParams {
            log_cq_size: g.log_size,
            uar_page: s.uar_page_id(),
            eqn: s.eqn,
            cq_umem_id: ring_umem.id(),
            cq_umem_offset: 0,
            dbr_umem_id: dbr_umem.id(),
            dbr_offset: 0,
        })
        .map_err(|e| s.err(e.to_string()))?;
        let (obj, cqn) = DevxObj::create(s, &m)?;
        Ok(Box::new(Cq {
            obj,
            cqn,
            _ring: ring_umem,
            _dbr: dbr_umem,
        }))
    }

    unsafe fn create_qp(&self, cq: &dyn CompletionQueue, rings: QpRings) -> Result<Box<dyn QueuePair>> {
        let s = &self.shared;
        let cq = cq
            .as_any()
            .downcast_ref::<Cq>()
            .ok_or_else(|| s.err("the CQ was not created by this mlx5 NIC".to_string()))?;
        if !Arc::ptr_eq(&cq.obj.shared, s) {
            return Err(s.err("the CQ belongs to another mlx5 port".to_string()));
        }
        let g = plan::qp_geometry(&rings).map_err(|e| s.err(e))?;
        // SAFETY: the caller keeps the rings (trait contract).
        let wq = unsafe { Umem::register(s, g.wq_start, g.wq_bytes) }?;
        // SAFETY: as above.
        let dbr = unsafe { Umem::register(s, rings.dbrec as usize, 8) }?;
        let m = prm::create_qp(&prm::QpParams {
            pd: s.pdn,
            uar_page: s.uar_page_id(),
            log_sq_size: g.log_sq_size,
            log_rq_size: g.log_rq_size,
            log_rq_stride: g.log_rq_stride,
            cqn: cq.cqn,
            wq_umem_id: wq.id(),
            wq_umem_offset: 0,
            dbr_umem_id: dbr.id(),
            dbr_offset: 0,
            log_msg_max: LOG_MSG_MAX,
        })
        .map_err(|e| s.err(e.to_string()))?;
        let (obj, qpn) = DevxObj::create(s, &m)?;
        let (doorbell, proxy_slot) = match s.uar_gpu {
            // SAFETY: live UAR.
            Some(gpu) => (gpu + unsafe { ((*s.uar).reg_addr as u64) - ((*s.uar).base_addr as u64) }, None),
            None => {
                let mut t = s.proxy.lock().unwrap_or_else(|p| p.into_inner());
                let t = t.as_mut().ok_or_else(|| s.err("no doorbell proxy table".to_string()))?;
                let slot = t
                    .claim()
                    .ok_or_else(|| s.err(format!("more than {} QPs with CPU-assisted doorbells", proxy::SLOTS)))?;
                (t.device_word(slot), Some(slot))
            }
        };
        Ok(Box::new(Qp {
            obj,
            qpn,
            psn: psn_seed(qpn),
            doorbell,
            host_doorbell: s.uar_reg() as u64,
            proxy_slot,
            connected: false.into(),
            _wq: wq,
            _dbr: dbr,
        }))
    }

    fn start(&mut self, ctx: &StartCtx<'_>) -> Result<()> {
        let _ = ctx;
        self.start_doorbells()
    }

    fn stop(&mut self) -> std::result::Result<(), String> {
        match self.proxy.take() {
            Some(p) => p.stop(),
            None => Ok(()),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for Mlx5Nic {
    fn drop(&mut self) {
        let stopped = self.stop();
        self.shared.warn_failed(stopped);
    }
}
