// Hand-written in the style of the bindgen --dynamic-loading tables next to
// it (scripts/gen-rdma-bindings.sh does not produce this file, so
// regenerating the others leaves it alone). Signatures are those of
// <infiniband/mlx5dv.h>, rdma-core 44.

use super::generated::*;

/// `struct mlx5dv_devx_obj`: opaque to callers (a DevX object handle).
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct mlx5dv_devx_obj {
    _unused: [u8; 0],
}

/// `MLX5DV_UMEM_MASK_DMABUF`: `mlx5dv_devx_umem_in::dmabuf_fd` is valid.
pub const MLX5DV_UMEM_MASK_DMABUF: u64 = 1;

/// `struct mlx5dv_devx_umem_in`: the arguments of `mlx5dv_devx_umem_reg_ex`.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct mlx5dv_devx_umem_in {
    pub addr: *mut ::core::ffi::c_void,
    pub size: usize,
    pub access: u32,
    pub pgsz_bitmap: u64,
    pub comp_mask: u64,
    pub dmabuf_fd: ::core::ffi::c_int,
}
#[allow(clippy::unnecessary_operation, clippy::identity_op)]
const _: () = {
    ["Size of mlx5dv_devx_umem_in"][::core::mem::size_of::<mlx5dv_devx_umem_in>() - 48usize];
    ["Alignment of mlx5dv_devx_umem_in"][::core::mem::align_of::<mlx5dv_devx_umem_in>() - 8usize];
    ["Offset of field: mlx5dv_devx_umem_in::access"]
        [::core::mem::offset_of!(mlx5dv_devx_umem_in, access) - 16usize];
    ["Offset of field: mlx5dv_devx_umem_in::pgsz_bitmap"]
        [::core::mem::offset_of!(mlx5dv_devx_umem_in, pgsz_bitmap) - 24usize];
    ["Offset of field: mlx5dv_devx_umem_in::comp_mask"]
        [::core::mem::offset_of!(mlx5dv_devx_umem_in, comp_mask) - 32usize];
    ["Offset of field: mlx5dv_devx_umem_in::dmabuf_fd"]
        [::core::mem::offset_of!(mlx5dv_devx_umem_in, dmabuf_fd) - 40usize];
};

pub struct DevxFns {
    __library: ::libloading::Library,
    pub mlx5dv_devx_obj_create: Result<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            in_: *const ::core::ffi::c_void,
            inlen: usize,
            out: *mut ::core::ffi::c_void,
            outlen: usize,
        ) -> *mut mlx5dv_devx_obj,
        ::libloading::Error,
    >,
    pub mlx5dv_devx_obj_query: Result<
        unsafe extern "C" fn(
            obj: *mut mlx5dv_devx_obj,
            in_: *const ::core::ffi::c_void,
            inlen: usize,
            out: *mut ::core::ffi::c_void,
            outlen: usize,
        ) -> ::core::ffi::c_int,
        ::libloading::Error,
    >,
    pub mlx5dv_devx_obj_modify: Result<
        unsafe extern "C" fn(
            obj: *mut mlx5dv_devx_obj,
            in_: *const ::core::ffi::c_void,
            inlen: usize,
            out: *mut ::core::ffi::c_void,
            outlen: usize,
        ) -> ::core::ffi::c_int,
        ::libloading::Error,
    >,
    pub mlx5dv_devx_obj_destroy: Result<
        unsafe extern "C" fn(obj: *mut mlx5dv_devx_obj) -> ::core::ffi::c_int,
        ::libloading::Error,
    >,
    pub mlx5dv_devx_general_cmd: Result<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            in_: *const ::core::ffi::c_void,
            inlen: usize,
            out: *mut ::core::ffi::c_void,
            outlen: usize,
        ) -> ::core::ffi::c_int,
        ::libloading::Error,
    >,
    pub mlx5dv_devx_query_eqn: Result<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            vector: u32,
            eqn: *mut u32,
        ) -> ::core::ffi::c_int,
        ::libloading::Error,
    >,
    pub mlx5dv_devx_umem_reg_ex: Result<
        unsafe extern "C" fn(
            ctx: *mut ibv_context,
            umem_in: *mut mlx5dv_devx_umem_in,
        ) -> *mut mlx5dv_devx_umem,
        ::libloading::Error,
    >,
}
impl DevxFns {
    pub unsafe fn new<P>(path: P) -> Result<Self, ::libloading::Error>
    where
        P: AsRef<::std::ffi::OsStr>,
    {
        let path = path.as_ref();
        let library = unsafe { ::libloading::Library::new(path) }?;
        unsafe { Self::from_library(library) }
    }
    pub unsafe fn from_library<L>(library: L) -> Result<Self, ::libloading::Error>
    where
        L: Into<::libloading::Library>,
    {
        let __library = library.into();
        let mlx5dv_devx_obj_create =
            unsafe { __library.get(b"mlx5dv_devx_obj_create\0") }.map(|sym| *sym);
        let mlx5dv_devx_obj_query =
            unsafe { __library.get(b"mlx5dv_devx_obj_query\0") }.map(|sym| *sym);
        let mlx5dv_devx_obj_modify =
            unsafe { __library.get(b"mlx5dv_devx_obj_modify\0") }.map(|sym| *sym);
        let mlx5dv_devx_obj_destroy =
            unsafe { __library.get(b"mlx5dv_devx_obj_destroy\0") }.map(|sym| *sym);
        let mlx5dv_devx_general_cmd =
            unsafe { __library.get(b"mlx5dv_devx_general_cmd\0") }.map(|sym| *sym);
        let mlx5dv_devx_query_eqn =
            unsafe { __library.get(b"mlx5dv_devx_query_eqn\0") }.map(|sym| *sym);
        let mlx5dv_devx_umem_reg_ex =
            unsafe { __library.get(b"mlx5dv_devx_umem_reg_ex\0") }.map(|sym| *sym);
        Ok(DevxFns {
            __library,
            mlx5dv_devx_obj_create,
            mlx5dv_devx_obj_query,
            mlx5dv_devx_obj_modify,
            mlx5dv_devx_obj_destroy,
            mlx5dv_devx_general_cmd,
            mlx5dv_devx_query_eqn,
            mlx5dv_devx_umem_reg_ex,
        })
    }
}
