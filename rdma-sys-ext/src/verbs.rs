//! The thin layer: [`Verbs`], one method per C call, each returning
//! `Result<_, Error>`.

use core::ffi::{c_int, c_void, CStr};
use core::mem::{offset_of, size_of};
use core::ptr;

use crate::error::{errno_from_null, errno_from_rc, Error};
use crate::sys;

/// Soname of libibverbs that [`Verbs::load`] opens.
pub const LIBIBVERBS: &str = "libibverbs.so.1";
/// Soname of libmlx5 (mlx5 direct verbs) that [`Verbs::load`] opens.
pub const LIBMLX5: &str = "libmlx5.so.1";

/// libibverbs and libmlx5, opened at run time, with their entry points.
///
/// Nothing here is linked: [`Verbs::load`] `dlopen`s the libraries, so a
/// binary that uses this crate starts on a machine without rdma-core and
/// gets [`Error::LibraryNotFound`] instead of a loader failure.
///
/// Methods mirror the C verbs one to one. Those that take raw pointers are
/// `unsafe`: the caller vouches that each pointer came from the matching
/// verb of this same `Verbs` and has not been destroyed. Creation methods
/// return non-null pointers (a NULL from C becomes an `Err`). For RAII
/// wrappers over the most common objects see [`crate::DeviceList`],
/// [`crate::Context`], [`crate::ProtectionDomain`] and
/// [`crate::MemoryRegion`].
///
/// `Verbs` is `Send + Sync`: libibverbs is thread-safe.
pub struct Verbs {
    ibv: sys::IbverbsFns,
    ibv_name: &'static str,
    mlx5: Result<sys::Mlx5Fns, String>,
    mlx5_name: &'static str,
    devx: Result<sys::DevxFns, String>,
}

impl core::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Verbs")
            .field("libibverbs", &self.ibv_name)
            .field(
                "libmlx5",
                &match &self.mlx5 {
                    Ok(_) => format!("loaded ({})", self.mlx5_name),
                    Err(e) => format!("not loaded: {e}"),
                },
            )
            .finish()
    }
}

/// Takes a symbol out of a symbol table, or says which one is missing.
fn sym<T: Copy>(r: &Result<T, libloading::Error>, library: &'static str, symbol: &'static str) -> Result<T, Error> {
    match r {
        Ok(f) => Ok(*f),
        Err(e) => Err(Error::MissingSymbol {
            library,
            symbol,
            detail: e.to_string(),
        }),
    }
}

macro_rules! ibv {
    ($self:ident . $name:ident) => {
        sym(&$self.ibv.$name, $self.ibv_name, stringify!($name))?
    };
}

macro_rules! devx {
    ($self:ident . $name:ident) => {{
        let fns = $self.devx_fns()?;
        sym(&fns.$name, $self.mlx5_name, stringify!($name))?
    }};
}

macro_rules! mlx5 {
    ($self:ident . $name:ident) => {{
        let fns = $self.mlx5_fns()?;
        sym(&fns.$name, $self.mlx5_name, stringify!($name))?
    }};
}

/// `verbs_get_ctx` from verbs.h: the `verbs_context` that embeds `ctx`, if
/// the provider uses the extended ABI.
///
/// # Safety
/// `ctx` must point to a live `ibv_context` returned by `ibv_open_device`.
unsafe fn verbs_ctx(ctx: *mut sys::ibv_context) -> Option<*mut sys::verbs_context> {
    // SAFETY: ctx is a live context (caller's contract); reading a field
    // through the raw pointer creates no reference.
    let abi = unsafe { (*ctx).abi_compat };
    if abi != sys::VERBS_ABI_IS_EXTENDED {
        return None;
    }
    // SAFETY: with the extended ABI the context is the last field of a
    // verbs_context (the header's container_of); the pointer stays inside
    // that allocation.
    Some(unsafe { ctx.byte_sub(offset_of!(sys::verbs_context, context)) }.cast())
}

/// `verbs_get_ctx_op` from verbs.h: the `verbs_context` if its ops table is
/// large enough to hold the op at `op_offset` (new ops are added at the
/// front, so an older library's struct starts later in memory).
///
/// # Safety
/// As for [`verbs_ctx`].
unsafe fn verbs_ctx_with_op(ctx: *mut sys::ibv_context, op_offset: usize) -> Option<*mut sys::verbs_context> {
    // SAFETY: forwarded contract.
    let vctx = unsafe { verbs_ctx(ctx) }?;
    // SAFETY: `sz` sits just before `context` and exists in every version
    // of verbs_context.
    let sz = unsafe { (*vctx).sz };
    if sz < size_of::<sys::verbs_context>() - op_offset {
        return None;
    }
    Some(vctx)
}

impl Verbs {
    /// Opens `libibverbs.so.1` (required) and `libmlx5.so.1` (optional: if
    /// it cannot be opened, the mlx5 methods return
    /// [`Error::Mlx5Unavailable`] and [`Verbs::has_mlx5`] is false).
    ///
    /// # Errors
    /// [`Error::LibraryNotFound`] when libibverbs cannot be opened; its
    /// message says which packages to install.
    pub fn load() -> Result<Self, Error> {
        Self::load_sonames(LIBIBVERBS, LIBMLX5)
    }

    /// [`Verbs::load`] with other library names or paths (tests use a
    /// missing name to see the failure).
    ///
    /// # Errors
    /// [`Error::LibraryNotFound`] when `ibverbs` cannot be opened.
    pub fn load_sonames(ibverbs: &'static str, mlx5: &'static str) -> Result<Self, Error> {
        // SAFETY: opening rdma-core runs its ELF initializers, which only
        // set up library-internal state; the symbol types come from
        // bindgen over the same headers the library implements.
        let ibv = unsafe { sys::IbverbsFns::new(ibverbs) }.map_err(|source| Error::LibraryNotFound { library: ibverbs, source })?;
        // SAFETY: as above, for libmlx5.
        let mlx5_fns = unsafe { sys::Mlx5Fns::new(mlx5) }.map_err(|e| e.to_string());
        // SAFETY: the same library again (dlopen counts references).
        let devx = unsafe { sys::DevxFns::new(mlx5) }.map_err(|e| e.to_string());
        Ok(Verbs {
            ibv,
            ibv_name: ibverbs,
            mlx5: mlx5_fns,
            mlx5_name: mlx5,
            devx,
        })
    }

    /// Whether libmlx5 was loaded.
    pub fn has_mlx5(&self) -> bool {
        self.mlx5.is_ok()
    }

    /// Why libmlx5 was not loaded, if it was not.
    pub fn mlx5_load_error(&self) -> Option<&str> {
        self.mlx5.as_ref().err().map(String::as_str)
    }

    /// Whether libibverbs has `ibv_reg_dmabuf_mr` (rdma-core 34+).
    pub fn has_reg_dmabuf_mr(&self) -> bool {
        self.ibv.ibv_reg_dmabuf_mr.is_ok()
    }

    /// The raw libibverbs symbol table, for verbs this layer does not wrap.
    pub fn ibverbs_fns(&self) -> &sys::IbverbsFns {
        &self.ibv
    }

    /// The raw libmlx5 symbol table.
    ///
    /// # Errors
    /// [`Error::Mlx5Unavailable`] when libmlx5 was not loaded.
    pub fn mlx5_fns(&self) -> Result<&sys::Mlx5Fns, Error> {
        self.mlx5
            .as_ref()
            .map_err(|reason| Error::Mlx5Unavailable { reason: reason.clone() })
    }

    /// The raw libmlx5 DevX symbol table (`mlx5dv_devx_obj_*`,
    /// `mlx5dv_devx_general_cmd`, `mlx5dv_devx_query_eqn`,
    /// `mlx5dv_devx_umem_reg_ex`).
    ///
    /// # Errors
    /// [`Error::Mlx5Unavailable`] when libmlx5 was not loaded.
    pub fn devx_fns(&self) -> Result<&sys::DevxFns, Error> {
        self.devx
            .as_ref()
            .map_err(|reason| Error::Mlx5Unavailable { reason: reason.clone() })
    }

    // ---- devices ------------------------------------------------------

    /// `ibv_get_device_list`: a NULL-terminated array and its length. Free
    /// it with [`Verbs::free_device_list`].
    ///
    /// # Errors
    /// [`Error::GetDeviceList`]; `ENOSYS` means the kernel has no RDMA
    /// (no `/sys/class/infiniband_verbs`).
    pub fn get_device_list(&self) -> Result<(*mut *mut sys::ibv_device, usize), Error> {
        let f = ibv!(self.ibv_get_device_list);
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        let list = unsafe { f(&mut n) };
        if list.is_null() {
            return Err(Error::GetDeviceList { source: errno_from_null() });
        }
        Ok((list, usize::try_from(n).unwrap_or(0)))
    }

    /// `ibv_free_device_list`.
    ///
    /// # Safety
    /// `list` came from [`Verbs::get_device_list`] and is freed once; no
    /// `ibv_device` pointer from it is used afterwards except by contexts
    /// already opened from it.
    pub unsafe fn free_device_list(&self, list: *mut *mut sys::ibv_device) -> Result<(), Error> {
        let f = ibv!(self.ibv_free_device_list);
        // SAFETY: caller's contract.
        unsafe { f(list) };
        Ok(())
    }

    /// `ibv_get_device_name`, e.g. `"mlx5_0"`.
    ///
    /// # Safety
    /// `device` is an entry of a live device list.
    pub unsafe fn get_device_name(&self, device: *mut sys::ibv_device) -> Result<String, Error> {
        let f = ibv!(self.ibv_get_device_name);
        // SAFETY: caller's contract.
        let name = unsafe { f(device) };
        if name.is_null() {
            return Err(Error::GetDeviceName { source: errno_from_null() });
        }
        // SAFETY: libibverbs returns a NUL-terminated string that lives as
        // long as the device; it is copied at once.
        Ok(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
    }

    /// `ibv_get_device_guid`, converted from network order: the node GUID as
    /// a number (`0x0c42a10300112233` prints as `0c42:a103:0011:2233`).
    ///
    /// # Safety
    /// `device` is an entry of a live device list.
    pub unsafe fn get_device_guid(&self, device: *mut sys::ibv_device) -> Result<u64, Error> {
        let f = ibv!(self.ibv_get_device_guid);
        // SAFETY: caller's contract.
        Ok(u64::from_be(unsafe { f(device) }))
    }

    /// `ibv_open_device`. Close with [`Verbs::close_device`].
    ///
    /// # Safety
    /// `device` is an entry of a live device list.
    pub unsafe fn open_device(&self, device: *mut sys::ibv_device) -> Result<*mut sys::ibv_context, Error> {
        let f = ibv!(self.ibv_open_device);
        // SAFETY: caller's contract.
        let ctx = unsafe { f(device) };
        if ctx.is_null() {
            let source = errno_from_null();
            // SAFETY: caller's contract.
            let device = unsafe { self.get_device_name(device) }.unwrap_or_default();
            return Err(Error::OpenDevice { device, source });
        }
        Ok(ctx)
    }

    /// `ibv_close_device`.
    ///
    /// # Safety
    /// `ctx` came from [`Verbs::open_device`], every object created on it is
    /// destroyed, and it is not used afterwards.
    pub unsafe fn close_device(&self, ctx: *mut sys::ibv_context) -> Result<(), Error> {
        let f = ibv!(self.ibv_close_device);
        // SAFETY: caller's contract.
        let rc = unsafe { f(ctx) };
        check(rc, |source| Error::CloseDevice { source })
    }

    /// `ibv_query_device`.
    ///
    /// # Safety
    /// `ctx` is a live context from [`Verbs::open_device`].
    pub unsafe fn query_device(&self, ctx: *mut sys::ibv_context) -> Result<sys::ibv_device_attr, Error> {
        let f = ibv!(self.ibv_query_device);
        let mut attr = sys::ibv_device_attr::default();
        // SAFETY: caller's contract; `attr` is a valid out-pointer.
        let rc = unsafe { f(ctx, &mut attr) };
        check(rc, |source| Error::QueryDevice { source })?;
        Ok(attr)
    }

    /// `ibv_query_device_ex` (a static inline in verbs.h, re-done here: the
    /// provider's `query_device_ex` op, else `ibv_query_device` filling
    /// `orig_attr` only).
    ///
    /// # Safety
    /// `ctx` is a live context from [`Verbs::open_device`].
    pub unsafe fn query_device_ex(&self, ctx: *mut sys::ibv_context) -> Result<sys::ibv_device_attr_ex, Error> {
        let mut attr = sys::ibv_device_attr_ex::default();
        // SAFETY: caller's contract.
        let vctx = unsafe { verbs_ctx_with_op(ctx, offset_of!(sys::verbs_context, query_device_ex)) };
        // SAFETY: `verbs_ctx_with_op` checked the op lies inside the table.
        if let Some(op) = vctx.and_then(|v| unsafe { (*v).query_device_ex }) {
            // SAFETY: the provider's own op, called as verbs.h calls it.
            let rc = unsafe { op(ctx, ptr::null(), &mut attr, size_of::<sys::ibv_device_attr_ex>()) };
            if rc != libc_errno::EOPNOTSUPP && rc != libc_errno::ENOSYS {
                check(rc, |source| Error::QueryDeviceEx { source })?;
                return Ok(attr);
            }
        }
        attr = sys::ibv_device_attr_ex::default();
        // SAFETY: caller's contract.
        attr.orig_attr = unsafe { self.query_device(ctx) }.map_err(|e| match e {
            Error::QueryDevice { source } => Error::QueryDeviceEx { source },
            e => e,
        })?;
        Ok(attr)
    }

    /// `ibv_query_port` (a static inline in verbs.h, re-done here: the
    /// provider's `query_port` op with the full `ibv_port_attr` size, else
    /// the exported `ibv_query_port@@IBVERBS_1.1`, which fills the older,
    /// shorter layout).
    ///
    /// # Safety
    /// `ctx` is a live context from [`Verbs::open_device`].
    pub unsafe fn query_port(&self, ctx: *mut sys::ibv_context, port: u8) -> Result<sys::ibv_port_attr, Error> {
        let mut attr = sys::ibv_port_attr::default();
        // SAFETY: caller's contract.
        let vctx = unsafe { verbs_ctx_with_op(ctx, offset_of!(sys::verbs_context, query_port)) };
        // SAFETY: `verbs_ctx_with_op` checked the op lies inside the table.
        let rc = if let Some(op) = vctx.and_then(|v| unsafe { (*v).query_port }) {
            // SAFETY: the provider's own op, called as verbs.h calls it.
            unsafe { op(ctx, port, &mut attr, size_of::<sys::ibv_port_attr>()) }
        } else {
            let f = ibv!(self.ibv_query_port);
            // SAFETY: the compat layout is a prefix of ibv_port_attr (the
            // header passes the same cast); `attr` is zeroed.
            unsafe { f(ctx, port, (&mut attr as *mut sys::ibv_port_attr).cast()) }
        };
        check(rc, |source| Error::QueryPort { port, source })?;
        Ok(attr)
    }

    /// `ibv_query_gid`.
    ///
    /// # Safety
    /// `ctx` is a live context from [`Verbs::open_device`].
    pub unsafe fn query_gid(&self, ctx: *mut sys::ibv_context, port: u8, index: i32) -> Result<sys::ibv_gid, Error> {
        let f = ibv!(self.ibv_query_gid);
        let mut gid = sys::ibv_gid::default();
        // SAFETY: caller's contract; `gid` is a valid out-pointer.
        let rc = unsafe { f(ctx, port, index, &mut gid) };
        check(rc, |source| Error::QueryGid { port, index, source })?;
        Ok(gid)
    }

    // ---- protection domains and memory regions ------------------------

    /// `ibv_alloc_pd`.
    ///
    /// # Safety
    /// `ctx` is a live context from [`Verbs::open_device`].
    pub unsafe fn alloc_pd(&self, ctx: *mut sys::ibv_context) -> Result<*mut sys::ibv_pd, Error> {
        let f = ibv!(self.ibv_alloc_pd);
        // SAFETY: caller's contract.
        nonnull(unsafe { f(ctx) }, |source| Error::AllocPd { source })
    }

    /// `ibv_dealloc_pd`.
    ///
    /// # Safety
    /// `pd` came from [`Verbs::alloc_pd`] and is not used afterwards.
    pub unsafe fn dealloc_pd(&self, pd: *mut sys::ibv_pd) -> Result<(), Error> {
        let f = ibv!(self.ibv_dealloc_pd);
        // SAFETY: caller's contract.
        check(unsafe { f(pd) }, |source| Error::DeallocPd { source })
    }

    /// `ibv_reg_mr` (as the verbs.h macro does: flags in
    /// [`sys::IBV_ACCESS_OPTIONAL_RANGE`], such as relaxed ordering, go
    /// through `ibv_reg_mr_iova2` with `iova = addr`).
    ///
    /// # Safety
    /// `pd` is a live PD; `addr..addr+len` is memory that stays mapped until
    /// the MR is deregistered.
    pub unsafe fn reg_mr(&self, pd: *mut sys::ibv_pd, addr: *mut c_void, len: usize, access: u32) -> Result<*mut sys::ibv_mr, Error> {
        let mr = if access & sys::IBV_ACCESS_OPTIONAL_RANGE == 0 {
            let f = ibv!(self.ibv_reg_mr);
            // SAFETY: caller's contract. Flags are bits, passed as C int.
            unsafe { f(pd, addr, len, access as c_int) }
        } else {
            let f = ibv!(self.ibv_reg_mr_iova2);
            // SAFETY: caller's contract.
            unsafe { f(pd, addr, len, addr as u64, access) }
        };
        nonnull(mr, |source| Error::RegMr {
            addr: addr as usize,
            len,
            access,
            source,
        })
    }

    /// `ibv_reg_dmabuf_mr` (rdma-core 34+; [`Error::MissingSymbol`] on
    /// older ones): registers `len` bytes at `offset` of dma-buf `fd` (e.g.
    /// exported GPU memory), reachable at I/O virtual address `iova`.
    ///
    /// # Safety
    /// `pd` is a live PD and `fd` a dma-buf that covers the range.
    pub unsafe fn reg_dmabuf_mr(
        &self,
        pd: *mut sys::ibv_pd,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        access: u32,
    ) -> Result<*mut sys::ibv_mr, Error> {
        let f = ibv!(self.ibv_reg_dmabuf_mr);
        // SAFETY: caller's contract.
        let mr = unsafe { f(pd, offset, len, iova, fd, access as c_int) };
        nonnull(mr, |source| Error::RegDmabufMr {
            fd,
            offset,
            len,
            iova,
            access,
            source,
        })
    }

    /// `ibv_dereg_mr`.
    ///
    /// # Safety
    /// `mr` came from [`Verbs::reg_mr`] / [`Verbs::reg_dmabuf_mr`] and is
    /// not used afterwards.
    pub unsafe fn dereg_mr(&self, mr: *mut sys::ibv_mr) -> Result<(), Error> {
        let f = ibv!(self.ibv_dereg_mr);
        // SAFETY: caller's contract.
        check(unsafe { f(mr) }, |source| Error::DeregMr { source })
    }

    // ---- completion queues and queue pairs ----------------------------

    /// `ibv_create_cq` with at least `cqe` entries.
    ///
    /// # Safety
    /// `ctx` is a live context; `channel` is NULL or a live completion
    /// channel of it; `cq_context` is stored, not dereferenced.
    pub unsafe fn create_cq(
        &self,
        ctx: *mut sys::ibv_context,
        cqe: i32,
        cq_context: *mut c_void,
        channel: *mut sys::ibv_comp_channel,
        comp_vector: i32,
    ) -> Result<*mut sys::ibv_cq, Error> {
        let f = ibv!(self.ibv_create_cq);
        // SAFETY: caller's contract.
        let cq = unsafe { f(ctx, cqe, cq_context, channel, comp_vector) };
        nonnull(cq, |source| Error::CreateCq { cqe, source })
    }

    /// `ibv_destroy_cq`.
    ///
    /// # Safety
    /// `cq` came from [`Verbs::create_cq`], no QP uses it, and it is not
    /// used afterwards.
    pub unsafe fn destroy_cq(&self, cq: *mut sys::ibv_cq) -> Result<(), Error> {
        let f = ibv!(self.ibv_destroy_cq);
        // SAFETY: caller's contract.
        check(unsafe { f(cq) }, |source| Error::DestroyCq { source })
    }

    /// `ibv_create_qp`. On success `attr.cap` holds the sizes granted.
    ///
    /// # Safety
    /// `pd` is a live PD; the CQs (and SRQ, if any) in `attr` are live
    /// objects of the same context.
    pub unsafe fn create_qp(&self, pd: *mut sys::ibv_pd, attr: &mut sys::ibv_qp_init_attr) -> Result<*mut sys::ibv_qp, Error> {
        let f = ibv!(self.ibv_create_qp);
        // SAFETY: caller's contract; `attr` is valid for reads and writes.
        let qp = unsafe { f(pd, attr) };
        nonnull(qp, |source| Error::CreateQp {
            qp_type: attr.qp_type,
            source,
        })
    }

    /// `ibv_create_qp_ex` (a static inline in verbs.h, re-done here through
    /// the provider's `create_qp_ex` op; [`Error::Unsupported`] if it has
    /// none).
    ///
    /// # Safety
    /// `ctx` is a live context; every object `attr` names (PD, CQs, ...) is
    /// a live object of it.
    pub unsafe fn create_qp_ex(&self, ctx: *mut sys::ibv_context, attr: &mut sys::ibv_qp_init_attr_ex) -> Result<*mut sys::ibv_qp, Error> {
        // SAFETY: caller's contract.
        let vctx = unsafe { verbs_ctx_with_op(ctx, offset_of!(sys::verbs_context, create_qp_ex)) };
        // SAFETY: `verbs_ctx_with_op` checked the op lies inside the table.
        let Some(op) = vctx.and_then(|v| unsafe { (*v).create_qp_ex }) else {
            return Err(Error::Unsupported { op: "ibv_create_qp_ex" });
        };
        // SAFETY: the provider's own op, called as verbs.h calls it.
        let qp = unsafe { op(ctx, attr) };
        nonnull(qp, |source| Error::CreateQp {
            qp_type: attr.qp_type,
            source,
        })
    }

    /// `ibv_destroy_qp`.
    ///
    /// # Safety
    /// `qp` came from [`Verbs::create_qp`] / [`Verbs::create_qp_ex`] (or
    /// mlx5dv's QP creation) and is not used afterwards.
    pub unsafe fn destroy_qp(&self, qp: *mut sys::ibv_qp) -> Result<(), Error> {
        let f = ibv!(self.ibv_destroy_qp);
        // SAFETY: caller's contract: qp is live until the call.
        let qpn = unsafe { (*qp).qp_num };
        // SAFETY: caller's contract.
        check(unsafe { f(qp) }, |source| Error::DestroyQp { qpn, source })
    }

    /// `ibv_modify_qp` with the `IBV_QP_*` bits of `attr_mask`.
    ///
    /// # Safety
    /// `qp` is a live QP.
    pub unsafe fn modify_qp(&self, qp: *mut sys::ibv_qp, attr: &mut sys::ibv_qp_attr, attr_mask: u32) -> Result<(), Error> {
        let f = ibv!(self.ibv_modify_qp);
        // SAFETY: caller's contract; `attr` is valid for reads.
        let rc = unsafe { f(qp, attr, attr_mask as c_int) };
        // SAFETY: caller's contract: qp is live.
        let qpn = unsafe { (*qp).qp_num };
        check(rc, |source| Error::ModifyQp {
            qpn,
            state: attr.qp_state,
            attr_mask,
            source,
        })
    }

    // ---- mlx5 direct verbs --------------------------------------------

    /// `mlx5dv_is_supported`: whether `device` is driven by the mlx5
    /// provider.
    ///
    /// # Safety
    /// `device` is an entry of a live device list.
    pub unsafe fn mlx5dv_is_supported(&self, device: *mut sys::ibv_device) -> Result<bool, Error> {
        let f = mlx5!(self.mlx5dv_is_supported);
        // SAFETY: caller's contract.
        Ok(unsafe { f(device) })
    }

    /// `mlx5dv_open_device`: opens `device` through the mlx5 provider with
    /// `attr.flags` (`MLX5DV_CONTEXT_FLAGS_DEVX` for DevX, which the
    /// `mlx5dv_devx_*` calls need). Close with [`Verbs::close_device`].
    ///
    /// # Safety
    /// `device` is an entry of a live device list.
    pub unsafe fn mlx5dv_open_device(
        &self,
        device: *mut sys::ibv_device,
        attr: &mut sys::mlx5dv_context_attr,
    ) -> Result<*mut sys::ibv_context, Error> {
        let f = mlx5!(self.mlx5dv_open_device);
        // SAFETY: caller's contract; `attr` is valid for reads and writes.
        let ctx = unsafe { f(device, attr) };
        if ctx.is_null() {
            let source = errno_from_null();
            // SAFETY: caller's contract.
            let device = unsafe { self.get_device_name(device) }.unwrap_or_default();
            return Err(Error::OpenDevice { device, source });
        }
        Ok(ctx)
    }

    /// `mlx5dv_init_obj`: fills the `out` structs that `obj` points to for
    /// each `MLX5DV_OBJ_*` bit in `obj_type` (QP/CQ buffers, doorbell
    /// records, UAR/BlueFlame registers).
    ///
    /// # Safety
    /// Each `in` pointer selected by `obj_type` is a live object of an mlx5
    /// context and each `out` pointer is valid for writes.
    pub unsafe fn mlx5dv_init_obj(&self, obj: &mut sys::mlx5dv_obj, obj_type: u64) -> Result<(), Error> {
        let f = mlx5!(self.mlx5dv_init_obj);
        // SAFETY: caller's contract.
        let rc = unsafe { f(obj, obj_type) };
        check(rc, |source| Error::Mlx5InitObj { obj_type, source })
    }

    /// `mlx5dv_query_device`, asking for the fields selected by
    /// `comp_mask` (`MLX5DV_CONTEXT_MASK_*`); on return `comp_mask` says
    /// which were filled.
    ///
    /// # Safety
    /// `ctx` is a live context.
    pub unsafe fn mlx5dv_query_device(&self, ctx: *mut sys::ibv_context, comp_mask: u64) -> Result<sys::mlx5dv_context, Error> {
        let f = mlx5!(self.mlx5dv_query_device);
        let mut attr = sys::mlx5dv_context {
            comp_mask,
            ..Default::default()
        };
        // SAFETY: caller's contract; `attr` is a valid out-pointer.
        let rc = unsafe { f(ctx, &mut attr) };
        check(rc, |source| Error::Mlx5QueryDevice { source })?;
        Ok(attr)
    }

    /// `mlx5dv_devx_umem_reg`: registers `addr..addr+len` as a DevX user
    /// memory object (its `umem_id` goes into DevX commands, e.g. for WQ
    /// and CQ buffers in GPU memory).
    ///
    /// # Safety
    /// `ctx` is a live context opened with DevX; the memory stays mapped
    /// until [`Verbs::mlx5dv_devx_umem_dereg`].
    pub unsafe fn mlx5dv_devx_umem_reg(
        &self,
        ctx: *mut sys::ibv_context,
        addr: *mut c_void,
        len: usize,
        access: u32,
    ) -> Result<*mut sys::mlx5dv_devx_umem, Error> {
        let f = mlx5!(self.mlx5dv_devx_umem_reg);
        // SAFETY: caller's contract.
        let umem = unsafe { f(ctx, addr, len, access) };
        nonnull(umem, |source| Error::DevxUmemReg {
            addr: addr as usize,
            len,
            access,
            source,
        })
    }

    /// `mlx5dv_devx_umem_dereg`.
    ///
    /// # Safety
    /// `umem` came from [`Verbs::mlx5dv_devx_umem_reg`], no DevX object uses
    /// it, and it is not used afterwards.
    pub unsafe fn mlx5dv_devx_umem_dereg(&self, umem: *mut sys::mlx5dv_devx_umem) -> Result<(), Error> {
        let f = mlx5!(self.mlx5dv_devx_umem_dereg);
        // SAFETY: caller's contract.
        check(unsafe { f(umem) }, |source| Error::DevxUmemDereg { source })
    }

    /// `mlx5dv_devx_alloc_uar` with `flags` =
    /// [`sys::MLX5DV_UAR_ALLOC_TYPE_NC`] or [`sys::MLX5DV_UAR_ALLOC_TYPE_BF`].
    ///
    /// # Safety
    /// `ctx` is a live context opened with DevX.
    pub unsafe fn mlx5dv_devx_alloc_uar(&self, ctx: *mut sys::ibv_context, flags: u32) -> Result<*mut sys::mlx5dv_devx_uar, Error> {
        let f = mlx5!(self.mlx5dv_devx_alloc_uar);
        // SAFETY: caller's contract.
        let uar = unsafe { f(ctx, flags) };
        nonnull(uar, |source| Error::DevxAllocUar { flags, source })
    }

    /// `mlx5dv_devx_free_uar`.
    ///
    /// # Safety
    /// `uar` came from [`Verbs::mlx5dv_devx_alloc_uar`], nothing still rings
    /// doorbells through its pages, and it is not used afterwards.
    pub unsafe fn mlx5dv_devx_free_uar(&self, uar: *mut sys::mlx5dv_devx_uar) -> Result<(), Error> {
        let f = mlx5!(self.mlx5dv_devx_free_uar);
        // SAFETY: caller's contract.
        unsafe { f(uar) };
        Ok(())
    }
}

/// The error of a DevX command that returned `rc`: errno, plus the
/// opcode from `inp` and status/syndrome from `out` (the firmware's word,
/// which `errno` alone, usually `EREMOTEIO`, does not carry).
fn devx_error(call: &'static str, rc: c_int, inp: &[u8], out: &[u8]) -> Error {
    let source = if rc == 0 { errno_from_null() } else { errno_from_rc(rc) };
    let opcode = crate::prm::input_opcode(inp).unwrap_or(0);
    let (status, syndrome) = crate::prm::output_status(out).unwrap_or((0, 0));
    Error::DevxCmd {
        call,
        command: crate::prm::opcode_name(opcode),
        opcode,
        status,
        syndrome,
        source,
    }
}

/// Checks a DevX mailbox pair's sizes before C reads and writes them.
fn devx_lens(call: &'static str, inp: &[u8], out: &[u8]) -> Result<(), Error> {
    if inp.len() < crate::prm::MBOX_HDR_BYTES || out.len() < crate::prm::MBOX_HDR_BYTES {
        return Err(Error::DevxMailbox {
            call,
            in_len: inp.len(),
            out_len: out.len(),
        });
    }
    Ok(())
}

impl Verbs {
    /// `mlx5dv_devx_obj_create`: runs the CREATE_* command in `inp`
    /// ([`crate::prm`] builds them) and returns the object; `out` receives
    /// the output mailbox (the new object's number is in it).
    ///
    /// # Errors
    /// [`Error::DevxCmd`] with the firmware's status and syndrome.
    ///
    /// # Safety
    /// `ctx` is a live context opened with DevX, and every umem, UAR, PD,
    /// CQ or other object the command names is alive.
    pub unsafe fn devx_obj_create(
        &self,
        ctx: *mut sys::ibv_context,
        inp: &[u8],
        out: &mut [u8],
    ) -> Result<*mut sys::mlx5dv_devx_obj, Error> {
        devx_lens("mlx5dv_devx_obj_create", inp, out)?;
        let f = devx!(self.mlx5dv_devx_obj_create);
        // SAFETY: caller's contract; the buffers are valid for their lengths.
        let obj = unsafe { f(ctx, inp.as_ptr().cast(), inp.len(), out.as_mut_ptr().cast(), out.len()) };
        if obj.is_null() {
            return Err(devx_error("mlx5dv_devx_obj_create", 0, inp, out));
        }
        Ok(obj)
    }

    /// `mlx5dv_devx_obj_modify`: runs a modify command (e.g. a QP state
    /// transition) on `obj`.
    ///
    /// # Errors
    /// [`Error::DevxCmd`] with the firmware's status and syndrome.
    ///
    /// # Safety
    /// `obj` came from [`Verbs::devx_obj_create`] and is alive.
    pub unsafe fn devx_obj_modify(&self, obj: *mut sys::mlx5dv_devx_obj, inp: &[u8], out: &mut [u8]) -> Result<(), Error> {
        devx_lens("mlx5dv_devx_obj_modify", inp, out)?;
        let f = devx!(self.mlx5dv_devx_obj_modify);
        // SAFETY: caller's contract; the buffers are valid for their lengths.
        let rc = unsafe { f(obj, inp.as_ptr().cast(), inp.len(), out.as_mut_ptr().cast(), out.len()) };
        if rc != 0 {
            return Err(devx_error("mlx5dv_devx_obj_modify", rc, inp, out));
        }
        Ok(())
    }

    /// `mlx5dv_devx_obj_query`: runs a query command on `obj`.
    ///
    /// # Errors
    /// [`Error::DevxCmd`] with the firmware's status and syndrome.
    ///
    /// # Safety
    /// `obj` came from [`Verbs::devx_obj_create`] and is alive.
    pub unsafe fn devx_obj_query(&self, obj: *mut sys::mlx5dv_devx_obj, inp: &[u8], out: &mut [u8]) -> Result<(), Error> {
        devx_lens("mlx5dv_devx_obj_query", inp, out)?;
        let f = devx!(self.mlx5dv_devx_obj_query);
        // SAFETY: caller's contract; the buffers are valid for their lengths.
        let rc = unsafe { f(obj, inp.as_ptr().cast(), inp.len(), out.as_mut_ptr().cast(), out.len()) };
        if rc != 0 {
            return Err(devx_error("mlx5dv_devx_obj_query", rc, inp, out));
        }
        Ok(())
    }

    /// `mlx5dv_devx_obj_destroy`.
    ///
    /// # Errors
    /// [`Error::DevxDestroy`] (`EBUSY`: another object still uses it).
    ///
    /// # Safety
    /// `obj` came from [`Verbs::devx_obj_create`] and is not used afterwards.
    pub unsafe fn devx_obj_destroy(&self, obj: *mut sys::mlx5dv_devx_obj) -> Result<(), Error> {
        let f = devx!(self.mlx5dv_devx_obj_destroy);
        // SAFETY: caller's contract.
        check(unsafe { f(obj) }, |source| Error::DevxDestroy { source })
    }

    /// `mlx5dv_devx_general_cmd`: a command that creates no object (e.g.
    /// QUERY_HCA_CAP).
    ///
    /// # Errors
    /// [`Error::DevxCmd`] with the firmware's status and syndrome.
    ///
    /// # Safety
    /// `ctx` is a live context opened with DevX.
    pub unsafe fn devx_general_cmd(&self, ctx: *mut sys::ibv_context, inp: &[u8], out: &mut [u8]) -> Result<(), Error> {
        devx_lens("mlx5dv_devx_general_cmd", inp, out)?;
        let f = devx!(self.mlx5dv_devx_general_cmd);
        // SAFETY: caller's contract; the buffers are valid for their lengths.
        let rc = unsafe { f(ctx, inp.as_ptr().cast(), inp.len(), out.as_mut_ptr().cast(), out.len()) };
        if rc != 0 {
            return Err(devx_error("mlx5dv_devx_general_cmd", rc, inp, out));
        }
        Ok(())
    }

    /// `mlx5dv_devx_query_eqn`: the EQ number of completion vector
    /// `vector`, for a CQ's `c_eqn`.
    ///
    /// # Errors
    /// [`Error::DevxQueryEqn`].
    ///
    /// # Safety
    /// `ctx` is a live context opened with DevX.
    pub unsafe fn devx_query_eqn(&self, ctx: *mut sys::ibv_context, vector: u32) -> Result<u32, Error> {
        let f = devx!(self.mlx5dv_devx_query_eqn);
        let mut eqn = 0u32;
        // SAFETY: caller's contract; `eqn` is a valid out-pointer.
        let rc = unsafe { f(ctx, vector, &mut eqn) };
        check(rc, |source| Error::DevxQueryEqn { vector, source })?;
        Ok(eqn)
    }

    /// `mlx5dv_devx_umem_reg_ex` with `MLX5DV_UMEM_MASK_DMABUF`: registers
    /// `len` bytes at `addr` as a DevX umem whose pages the kernel takes
    /// from dma-buf `fd` (exported GPU memory) rather than pinning them.
    ///
    /// # Errors
    /// [`Error::DevxUmemReg`], or [`Error::MissingSymbol`] on an rdma-core
    /// without `mlx5dv_devx_umem_reg_ex`.
    ///
    /// # Safety
    /// `ctx` is a live context opened with DevX; `fd` is a dma-buf of the
    /// memory at `addr..addr+len`, which stays allocated until the umem is
    /// deregistered.
    pub unsafe fn devx_umem_reg_dmabuf(
        &self,
        ctx: *mut sys::ibv_context,
        addr: *mut c_void,
        len: usize,
        access: u32,
        fd: i32,
    ) -> Result<*mut sys::mlx5dv_devx_umem, Error> {
        let f = devx!(self.mlx5dv_devx_umem_reg_ex);
        let mut inp = sys::mlx5dv_devx_umem_in {
            addr,
            size: len,
            access,
            // Any page size from 4 KiB up, as mlx5dv_devx_umem_reg asks.
            pgsz_bitmap: !0xfffu64,
            comp_mask: sys::MLX5DV_UMEM_MASK_DMABUF,
            dmabuf_fd: fd,
        };
        // SAFETY: caller's contract; `inp` is valid for the call.
        let umem = unsafe { f(ctx, &mut inp) };
        nonnull(umem, |source| Error::DevxUmemReg {
            addr: addr as usize,
            len,
            access,
            source,
        })
    }
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Verbs>();
};

/// Linux errno values this module compares against.
mod libc_errno {
    pub const ENOSYS: i32 = 38;
    pub const EOPNOTSUPP: i32 = 95;
}

pub(crate) use libc_errno::ENOSYS;

fn check(rc: c_int, err: impl FnOnce(std::io::Error) -> Error) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else {
        Err(err(errno_from_rc(rc)))
    }
}

fn nonnull<T>(p: *mut T, err: impl FnOnce(std::io::Error) -> Error) -> Result<*mut T, Error> {
    if p.is_null() {
        Err(err(errno_from_null()))
    } else {
        Ok(p)
    }
}
