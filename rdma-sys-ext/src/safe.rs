//! A small RAII layer over the most common objects. Everything else is
//! reached through [`Verbs`] with the `as_raw()` pointers.

use core::ffi::c_void;
use std::sync::Arc;

use crate::error::Error;
use crate::sys;
use crate::verbs::{Verbs, ENOSYS};

/// One RDMA device as listed by `ibv_get_device_list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel name, e.g. `"mlx5_0"`.
    pub name: String,
    /// Node GUID in host order (see [`Verbs::get_device_guid`]).
    pub guid: u64,
    /// Position in the list, for [`DeviceList::open`].
    pub index: usize,
}

/// The devices `ibv_get_device_list` reports, freed on drop.
///
/// A machine whose kernel has no RDMA support makes `ibv_get_device_list`
/// fail with `ENOSYS`; that is reported as an empty list, not an error.
pub struct DeviceList {
    verbs: Arc<Verbs>,
    list: *mut *mut sys::ibv_device,
    len: usize,
}

// SAFETY: the list is plain memory owned by this value; libibverbs device
// handles may be used from any thread.
unsafe impl Send for DeviceList {}
// SAFETY: shared access only reads the array.
unsafe impl Sync for DeviceList {}

impl DeviceList {
    /// Lists the devices.
    ///
    /// # Errors
    /// [`Error::GetDeviceList`] for failures other than "no RDMA in this
    /// kernel" (`ENOSYS`, an empty list), or [`Error::MissingSymbol`].
    pub fn new(verbs: &Arc<Verbs>) -> Result<Self, Error> {
        match verbs.get_device_list() {
            Ok((list, len)) => Ok(DeviceList {
                verbs: Arc::clone(verbs),
                list,
                len,
            }),
            Err(Error::GetDeviceList { source }) if source.raw_os_error() == Some(ENOSYS) => Ok(DeviceList {
                verbs: Arc::clone(verbs),
                list: core::ptr::null_mut(),
                len: 0,
            }),
            Err(e) => Err(e),
        }
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no devices.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The raw `ibv_device *` at `index`.
    pub fn get_raw(&self, index: usize) -> Option<*mut sys::ibv_device> {
        if index < self.len {
            // SAFETY: `list` holds `len` entries (libibverbs' contract).
            Some(unsafe { *self.list.add(index) })
        } else {
            None
        }
    }

    /// The raw NULL-terminated array (NULL when the list is empty because
    /// the kernel has no RDMA).
    pub fn as_raw(&self) -> *mut *mut sys::ibv_device {
        self.list
    }

    /// Name of the device at `index`.
    ///
    /// # Errors
    /// [`Error::GetDeviceName`]; `None` when `index` is out of range.
    pub fn name(&self, index: usize) -> Option<Result<String, Error>> {
        let dev = self.get_raw(index)?;
        // SAFETY: `dev` is an entry of this live list.
        Some(unsafe { self.verbs.get_device_name(dev) })
    }

    /// Node GUID (host order) of the device at `index`.
    pub fn guid(&self, index: usize) -> Option<Result<u64, Error>> {
        let dev = self.get_raw(index)?;
        // SAFETY: `dev` is an entry of this live list.
        Some(unsafe { self.verbs.get_device_guid(dev) })
    }

    /// Name, GUID and index of every device.
    ///
    /// # Errors
    /// The first failing name or GUID lookup.
    pub fn iter(&self) -> impl Iterator<Item = Result<DeviceInfo, Error>> + '_ {
        (0..self.len).map(move |index| {
            Ok(DeviceInfo {
                name: self.name(index).expect("index in range")?,
                guid: self.guid(index).expect("index in range")?,
                index,
            })
        })
    }

    /// Opens the device at `index`; `None` when out of range.
    pub fn open(&self, index: usize) -> Option<Result<Context, Error>> {
        let dev = self.get_raw(index)?;
        Some(Context::open_raw(&self.verbs, dev))
    }

    /// Opens the device at `index` through mlx5dv with DevX enabled
    /// (`MLX5DV_CONTEXT_FLAGS_DEVX`), as IBGDA needs for UAR and umem
    /// registration; `None` when out of range.
    pub fn open_devx(&self, index: usize) -> Option<Result<Context, Error>> {
        let dev = self.get_raw(index)?;
        let mut attr = sys::mlx5dv_context_attr {
            flags: sys::MLX5DV_CONTEXT_FLAGS_DEVX,
            comp_mask: 0,
        };
        // SAFETY: `dev` is an entry of this live list.
        let ctx = unsafe { self.verbs.mlx5dv_open_device(dev, &mut attr) };
        Some(ctx.map(|ctx| Context {
            verbs: Arc::clone(&self.verbs),
            ctx,
        }))
    }

    /// Opens the device called `name` (e.g. `"mlx5_0"`); `None` when no
    /// device has that name.
    pub fn open_by_name(&self, name: &str) -> Option<Result<Context, Error>> {
        let index = (0..self.len).find(|&i| matches!(self.name(i), Some(Ok(n)) if n == name))?;
        self.open(index)
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: the list came from get_device_list and is freed once;
            // open contexts do not depend on it.
            let _ = unsafe { self.verbs.free_device_list(self.list) };
        }
    }
}

impl core::fmt::Debug for DeviceList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list()
            .entries((0..self.len).map(|i| self.name(i).and_then(Result::ok)))
            .finish()
    }
}

/// An open device (`ibv_context`), closed on drop.
pub struct Context {
    verbs: Arc<Verbs>,
    ctx: *mut sys::ibv_context,
}

// SAFETY: libibverbs contexts are thread-safe.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    fn open_raw(verbs: &Arc<Verbs>, dev: *mut sys::ibv_device) -> Result<Self, Error> {
        // SAFETY: `dev` is an entry of a live device list (only DeviceList
        // calls this).
        let ctx = unsafe { verbs.open_device(dev) }?;
        Ok(Context {
            verbs: Arc::clone(verbs),
            ctx,
        })
    }

    /// Takes ownership of a context opened elsewhere (e.g. with
    /// `mlx5dv_open_device` for DevX); it is closed on drop.
    ///
    /// # Safety
    /// `ctx` is a live context opened through the libibverbs that `verbs`
    /// loaded, and nothing else closes it.
    pub unsafe fn from_raw(verbs: &Arc<Verbs>, ctx: *mut sys::ibv_context) -> Self {
        Context {
            verbs: Arc::clone(verbs),
            ctx,
        }
    }

    /// The raw `ibv_context *`.
    pub fn as_raw(&self) -> *mut sys::ibv_context {
        self.ctx
    }

    /// The loaded libraries this context belongs to.
    pub fn verbs(&self) -> &Arc<Verbs> {
        &self.verbs
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<sys::ibv_device_attr, Error> {
        // SAFETY: `self.ctx` is live while `self` exists.
        unsafe { self.verbs.query_device(self.ctx) }
    }

    /// `ibv_query_device_ex`.
    pub fn query_device_ex(&self) -> Result<sys::ibv_device_attr_ex, Error> {
        // SAFETY: `self.ctx` is live while `self` exists.
        unsafe { self.verbs.query_device_ex(self.ctx) }
    }

    /// `ibv_query_port` (ports are numbered from 1).
    pub fn query_port(&self, port: u8) -> Result<sys::ibv_port_attr, Error> {
        // SAFETY: `self.ctx` is live while `self` exists.
        unsafe { self.verbs.query_port(self.ctx, port) }
    }

    /// `ibv_query_gid`: the 16 raw GID bytes.
    pub fn query_gid(&self, port: u8, index: i32) -> Result<[u8; 16], Error> {
        // SAFETY: `self.ctx` is live while `self` exists.
        let gid = unsafe { self.verbs.query_gid(self.ctx, port, index) }?;
        // SAFETY: every bit pattern of the union is a valid byte array.
        Ok(unsafe { gid.raw })
    }

    /// `mlx5dv_query_device` (see [`Verbs::mlx5dv_query_device`]).
    pub fn mlx5_query_device(&self, comp_mask: u64) -> Result<sys::mlx5dv_context, Error> {
        // SAFETY: `self.ctx` is live while `self` exists.
        unsafe { self.verbs.mlx5dv_query_device(self.ctx, comp_mask) }
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain<'_>, Error> {
        // SAFETY: `self.ctx` is live while `self` exists.
        let pd = unsafe { self.verbs.alloc_pd(self.ctx) }?;
        Ok(ProtectionDomain { ctx: self, pd })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: borrowing guarantees every PD/MR made through this safe
        // layer is gone; objects made through the raw layer are the
        // caller's to destroy first.
        let _ = unsafe { self.verbs.close_device(self.ctx) };
    }
}

impl core::fmt::Debug for Context {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Context").field("ctx", &self.ctx).finish()
    }
}

/// A protection domain (`ibv_pd`), deallocated on drop.
pub struct ProtectionDomain<'ctx> {
    ctx: &'ctx Context,
    pd: *mut sys::ibv_pd,
}

// SAFETY: libibverbs objects are thread-safe.
unsafe impl Send for ProtectionDomain<'_> {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain<'_> {}

impl<'ctx> ProtectionDomain<'ctx> {
    /// The raw `ibv_pd *`.
    pub fn as_raw(&self) -> *mut sys::ibv_pd {
        self.pd
    }

    /// The context this PD belongs to.
    pub fn context(&self) -> &'ctx Context {
        self.ctx
    }

    /// Registers `addr..addr+len` with `IBV_ACCESS_*` flags.
    ///
    /// # Safety
    /// The memory stays mapped (and, for host memory, is not freed) until
    /// the returned region is dropped; the NIC may read or write it at any
    /// time the access flags allow.
    pub unsafe fn reg_mr(&self, addr: *mut c_void, len: usize, access: u32) -> Result<MemoryRegion<'_>, Error> {
        // SAFETY: PD live; memory contract forwarded to the caller.
        let mr = unsafe { self.ctx.verbs.reg_mr(self.pd, addr, len, access) }?;
        Ok(MemoryRegion { pd: self, mr })
    }

    /// Registers `len` bytes at `offset` of dma-buf `fd` at I/O virtual
    /// address `iova` (GPU memory exported as dma-buf).
    ///
    /// # Safety
    /// `fd` is a dma-buf covering the range, kept alive until the region is
    /// dropped.
    pub unsafe fn reg_dmabuf_mr(&self, offset: u64, len: usize, iova: u64, fd: i32, access: u32) -> Result<MemoryRegion<'_>, Error> {
        // SAFETY: PD live; dma-buf contract forwarded to the caller.
        let mr = unsafe { self.ctx.verbs.reg_dmabuf_mr(self.pd, offset, len, iova, fd, access) }?;
        Ok(MemoryRegion { pd: self, mr })
    }
}

impl Drop for ProtectionDomain<'_> {
    fn drop(&mut self) {
        // SAFETY: every MemoryRegion borrowing this PD is gone.
        let _ = unsafe { self.ctx.verbs.dealloc_pd(self.pd) };
    }
}

impl core::fmt::Debug for ProtectionDomain<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ProtectionDomain").field("pd", &self.pd).finish()
    }
}

/// A registered memory region (`ibv_mr`), deregistered on drop.
pub struct MemoryRegion<'pd> {
    pd: &'pd ProtectionDomain<'pd>,
    mr: *mut sys::ibv_mr,
}

// SAFETY: libibverbs objects are thread-safe; the keys are read-only.
unsafe impl Send for MemoryRegion<'_> {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion<'_> {}

impl MemoryRegion<'_> {
    /// The raw `ibv_mr *`.
    pub fn as_raw(&self) -> *mut sys::ibv_mr {
        self.mr
    }

    fn raw(&self) -> &sys::ibv_mr {
        // SAFETY: the MR is live and libibverbs does not change these
        // fields after registration.
        unsafe { &*self.mr }
    }

    /// Local key, for data segments of this process's WQEs.
    pub fn lkey(&self) -> u32 {
        self.raw().lkey
    }

    /// Remote key, for peers' RDMA operations on this region.
    pub fn rkey(&self) -> u32 {
        self.raw().rkey
    }

    /// Start address as registered.
    pub fn addr(&self) -> *mut c_void {
        self.raw().addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.raw().length
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for MemoryRegion<'_> {
    fn drop(&mut self) {
        // SAFETY: the MR came from this PD and is deregistered once.
        let _ = unsafe { self.pd.ctx.verbs.dereg_mr(self.mr) };
    }
}

impl core::fmt::Debug for MemoryRegion<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &self.addr())
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}
