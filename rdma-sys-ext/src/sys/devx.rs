//! The DevX types that bindgen does not produce (written by hand from
//! `<infiniband/mlx5dv.h>`, rdma-core 44, with compile-time layout checks);
//! [`super::DevxFns`] takes them.

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
    ["Offset of field: mlx5dv_devx_umem_in::access"][::core::mem::offset_of!(mlx5dv_devx_umem_in, access) - 16usize];
    ["Offset of field: mlx5dv_devx_umem_in::pgsz_bitmap"][::core::mem::offset_of!(mlx5dv_devx_umem_in, pgsz_bitmap) - 24usize];
    ["Offset of field: mlx5dv_devx_umem_in::comp_mask"][::core::mem::offset_of!(mlx5dv_devx_umem_in, comp_mask) - 32usize];
    ["Offset of field: mlx5dv_devx_umem_in::dmabuf_fd"][::core::mem::offset_of!(mlx5dv_devx_umem_in, dmabuf_fd) - 40usize];
};
