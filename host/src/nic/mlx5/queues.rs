//! The DevX objects of an mlx5 port: umems, memory regions, CQs and QPs.
//! Each holds the port's [`Shared`] so the context outlives it, and
//! destroys itself on drop (errors there are logged, never panics).

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rdma_sys_ext::prm::{self, Command, Mailbox, RemoteAccess};
use rdma_sys_ext::sys;

use super::plan::{self, RegMethod};
use super::Shared;
use crate::error::{Error, Result};
use crate::nic::{access, CompletionQueue, Endpoint, MemoryRegion, QpOptions, QueuePair};

/// A DevX umem (memory the device reads and writes by its umem id).
pub(super) struct Umem {
    shared: Arc<Shared>,
    umem: *mut sys::mlx5dv_devx_umem,
}

// SAFETY: the handle is used only through libmlx5, which is thread-safe.
unsafe impl Send for Umem {}
// SAFETY: as above.
unsafe impl Sync for Umem {}

impl Umem {
    /// Registers `len` bytes at `addr` by the port's methods in order
    /// (dma-buf of the enclosing pages first, else the pointer itself).
    ///
    /// # Safety
    /// The memory stays allocated until the umem is dropped.
    pub(super) unsafe fn register(shared: &Arc<Shared>, addr: usize, len: usize) -> Result<Umem> {
        let access = sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ;
        let mut why = Vec::new();
        for m in &shared.reg_order {
            let r = match m {
                RegMethod::DmaBuf => shared.with_dmabuf(addr, len, |fd, offset| {
                    // SAFETY: the caller keeps the memory; `fd` covers it.
                    unsafe { shared.verbs.devx_umem_reg_dmabuf(shared.ctx, offset as *mut _, len, access, fd) }.map_err(|e| e.to_string())
                }),
                // SAFETY: as above.
                RegMethod::PeerMem => {
                    unsafe { shared.verbs.mlx5dv_devx_umem_reg(shared.ctx, addr as *mut _, len, access) }.map_err(|e| e.to_string())
                }
            };
            match r {
                Ok(umem) => {
                    return Ok(Umem {
                        shared: shared.clone(),
                        umem,
                    })
                }
                Err(e) => why.push(format!("{}: {e}", m.describe())),
            }
        }
        Err(shared.err(format!(
            "cannot register {len} bytes at {addr:#x} as a DevX umem ({})",
            why.join("; ")
        )))
    }

    pub(super) fn id(&self) -> u32 {
        // SAFETY: live umem.
        unsafe { (*self.umem).umem_id }
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: registered once, no object uses it any more (objects hold
        // their umems and drop them after themselves).
        self.shared
            .warn_failed(unsafe { self.shared.verbs.mlx5dv_devx_umem_dereg(self.umem) });
    }
}

/// A DevX object (CQ or QP), destroyed on drop.
pub(super) struct DevxObj {
    pub(super) shared: Arc<Shared>,
    obj: *mut sys::mlx5dv_devx_obj,
}

// SAFETY: used only through libmlx5, which is thread-safe.
unsafe impl Send for DevxObj {}
// SAFETY: as above.
unsafe impl Sync for DevxObj {}

impl DevxObj {
    /// Runs a CREATE command; returns the object and its number.
    pub(super) fn create(shared: &Arc<Shared>, m: &Mailbox) -> Result<(DevxObj, u32)> {
        let mut out = m.out_buffer();
        // SAFETY: the context is live; the umems and UAR the command names
        // are held by the caller for the object's life.
        let obj = unsafe { shared.verbs.devx_obj_create(shared.ctx, m.bytes(), &mut out) }.map_err(|e| shared.err(e.to_string()))?;
        let obj = DevxObj {
            shared: shared.clone(),
            obj,
        };
        let n = prm::created_number(m.command(), &out).map_err(|e| shared.err(e.to_string()))?;
        Ok((obj, n))
    }

    pub(super) fn modify(&self, m: &Mailbox) -> Result<()> {
        let mut out = m.out_buffer();
        // SAFETY: live object.
        unsafe { self.shared.verbs.devx_obj_modify(self.obj, m.bytes(), &mut out) }.map_err(|e| self.shared.err(e.to_string()))?;
        prm::check_out(m.command(), &out).map_err(|e| self.shared.err(e.to_string()))
    }
}

impl Drop for DevxObj {
    fn drop(&mut self) {
        // SAFETY: created once; dropped before the umems it names.
        self.shared.warn_failed(unsafe { self.shared.verbs.devx_obj_destroy(self.obj) });
    }
}

/// A registered memory region.
pub(super) struct Mr {
    pub(super) shared: Arc<Shared>,
    pub(super) mr: *mut sys::ibv_mr,
}

// SAFETY: used only through libibverbs, which is thread-safe.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl MemoryRegion for Mr {
    fn lkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.mr).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered once.
        self.shared.warn_failed(unsafe { self.shared.verbs.dereg_mr(self.mr) });
    }
}

/// A CQ: the object first (dropped first), then its umems.
pub(super) struct Cq {
    pub(super) obj: DevxObj,
    pub(super) cqn: u32,
    pub(super) _ring: Umem,
    pub(super) _dbr: Umem,
}

impl CompletionQueue for Cq {
    fn cqn(&self) -> u32 {
        self.cqn
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A QP in RESET until [`QueuePair::connect`].
pub(super) struct Qp {
    pub(super) obj: DevxObj,
    pub(super) qpn: u32,
    pub(super) psn: u32,
    /// Where the GPU rings: the UAR register mapped into it, or this QP's
    /// word of the CPU-assisted doorbell.
    pub(super) doorbell: u64,
    /// Where a host thread rings: the UAR register as this process maps it.
    pub(super) host_doorbell: u64,
    /// The proxy slot of this QP (CPU-assisted doorbells), freed on drop.
    pub(super) proxy_slot: Option<usize>,
    pub(super) connected: AtomicBool,
    pub(super) _wq: Umem,
    pub(super) _dbr: Umem,
}

impl Qp {
    fn shared(&self) -> &Arc<Shared> {
        &self.obj.shared
    }
}

impl QueuePair for Qp {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn endpoint(&self) -> Endpoint {
        let s = self.shared();
        Endpoint {
            lid: s.port.lid,
            gid: s.port.gid,
            qpn: self.qpn,
            psn: self.psn,
            mtu: s.port.active_mtu,
            slot: 0,
        }
    }

    fn connect(&self, remote: &Endpoint, access_flags: u32, opts: &QpOptions) -> Result<()> {
        let s = self.shared().clone();
        if self.connected.swap(true, Ordering::AcqRel) {
            return Err(s.err(format!("QP {:#x} is already connected", self.qpn)));
        }
        let r = (|| {
            let rmac = match s.port.link_layer {
                crate::nic::LinkLayer::Ethernet => {
                    let arp = std::fs::read_to_string("/proc/net/arp").unwrap_or_default();
                    Some(plan::resolve_rmac(&remote.gid, &s.port.gid, s.local_mac, &arp).map_err(|e| s.err(e))?)
                }
                crate::nic::LinkLayer::InfiniBand => None,
            };
            let local = plan::Local {
                port: &s.port,
                port_num: s.port_num,
                qpn: self.qpn,
                psn: self.psn,
                log_msg_max: super::LOG_MSG_MAX,
            };
            let (rtr, rts) = plan::plan_connect(&local, remote, opts, rmac).map_err(|e| s.err(e))?;
            let ra = RemoteAccess {
                read: access_flags & access::REMOTE_READ != 0,
                write: access_flags & access::REMOTE_WRITE != 0,
                atomic: access_flags & access::REMOTE_ATOMIC != 0,
            };
            let pe = |e: prm::PrmError| s.err(e.to_string());
            self.obj.modify(&prm::rst2init(self.qpn, s.port_num, ra).map_err(pe)?)?;
            self.obj.modify(&prm::init2rtr(&rtr).map_err(pe)?)?;
            self.obj.modify(&prm::rtr2rts(&rts).map_err(pe)?)
        })();
        if r.is_err() {
            self.connected.store(false, Ordering::Release);
            if let Ok(m) = prm::to_rst(self.qpn) {
                let _ = self.obj.modify(&m);
            }
        }
        r
    }

    fn modify_to_err(&self) -> Result<()> {
        let m = prm::to_err(self.qpn).map_err(|e| self.shared().err(e.to_string()))?;
        debug_assert_eq!(m.command(), Command::ToErrQp);
        self.obj.modify(&m)
    }

    fn doorbell(&self) -> u64 {
        self.doorbell
    }

    fn host_doorbell(&self) -> u64 {
        self.host_doorbell
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if let Some(slot) = self.proxy_slot {
            self.obj.shared.proxy_release(slot);
        }
    }
}

/// [`Error::Comm`] is what a failing NIC call becomes.
pub(super) fn nic_err(port: &str, what: String) -> Error {
    Error::Comm(format!("mlx5 {port}: {what}"))
}
