//! The symbol tables of the `dlopen`ed libraries: [`IbverbsFns`]
//! (libibverbs), [`Mlx5Fns`] and [`DevxFns`] (libmlx5), each declared once
//! with [`dlopen_table!`] from its C signatures.
//!
//! The signatures of the first two are those bindgen's `--dynamic-loading`
//! mode derives from `<infiniband/verbs.h>` and `<infiniband/mlx5dv.h>`
//! (`scripts/gen-rdma-bindings.sh`, rdma-core 44); the DevX ones are taken
//! from `<infiniband/mlx5dv.h>` by hand. Every type they name comes from
//! [`super::generated`] or [`super::devx`].

use core::ffi::{c_char, c_int, c_uint, c_void};

use super::devx::{mlx5dv_devx_obj, mlx5dv_devx_umem_in};
use super::generated::*;

/// Declares a symbol table of a `dlopen`ed library: a struct that owns the
/// library and holds, for each listed C function, a public field with the
/// `dlsym` result (the function pointer, or the `Err` of a symbol this
/// library lacks, kept so that only a call to it fails), and the
/// constructors `new` (open a library by path or soname) and
/// `from_library` (take an open one).
macro_rules! dlopen_table {
    (
        $(#[$meta:meta])*
        pub struct $table:ident {
            $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? ; )*
        }
    ) => {
        $(#[$meta])*
        pub struct $table {
            /// The library the symbols live in; dropping it unloads them.
            __library: ::libloading::Library,
            $(
                #[doc = concat!("`", stringify!($name), "`, or the error `dlsym` gave for it.")]
                pub $name: Result<unsafe extern "C" fn($($arg: $ty),*) $(-> $ret)?, ::libloading::Error>,
            )*
        }

        impl $table {
            /// Opens the library at `path` (a path or a soname) and looks up
            /// every symbol.
            ///
            /// # Safety
            /// Loading a library runs its initialisers; the library must be
            /// the one whose signatures this table declares.
            pub unsafe fn new<P: AsRef<::std::ffi::OsStr>>(path: P) -> Result<Self, ::libloading::Error> {
                let library = unsafe { ::libloading::Library::new(path.as_ref()) }?;
                unsafe { Self::from_library(library) }
            }

            /// Looks up every symbol in an open `library`.
            ///
            /// # Safety
            /// As [`Self::new`]: the library must match the declared signatures.
            pub unsafe fn from_library<L: Into<::libloading::Library>>(library: L) -> Result<Self, ::libloading::Error> {
                let __library = library.into();
                $(
                    let $name = unsafe { __library.get(concat!(stringify!($name), "\0").as_bytes()) }.map(|sym| *sym);
                )*
                Ok($table { __library, $($name),* })
            }
        }
    };
}

dlopen_table! {
    /// The libibverbs functions doorbell calls.
    pub struct IbverbsFns {
        fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
        fn ibv_free_device_list(list: *mut *mut ibv_device);
        fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char;
        fn ibv_get_device_guid(device: *mut ibv_device) -> __be64;
        fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
        fn ibv_close_device(context: *mut ibv_context) -> c_int;
        fn ibv_query_device(context: *mut ibv_context, device_attr: *mut ibv_device_attr) -> c_int;
        fn ibv_query_port(context: *mut ibv_context, port_num: u8, port_attr: *mut _compat_ibv_port_attr) -> c_int;
        fn ibv_query_gid(context: *mut ibv_context, port_num: u8, index: c_int, gid: *mut ibv_gid) -> c_int;
        fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
        fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
        fn ibv_reg_mr_iova2(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_uint) -> *mut ibv_mr;
        fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr;
        fn ibv_reg_dmabuf_mr(pd: *mut ibv_pd, offset: u64, length: usize, iova: u64, fd: c_int, access: c_int) -> *mut ibv_mr;
        fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
        fn ibv_create_cq(context: *mut ibv_context, cqe: c_int, cq_context: *mut c_void, channel: *mut ibv_comp_channel, comp_vector: c_int) -> *mut ibv_cq;
        fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
        fn ibv_create_qp(pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
        fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int;
        fn ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int, init_attr: *mut ibv_qp_init_attr) -> c_int;
        fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    }
}

dlopen_table! {
    /// The libmlx5 direct-verbs functions doorbell calls (besides DevX).
    pub struct Mlx5Fns {
        fn mlx5dv_query_device(ctx_in: *mut ibv_context, attrs_out: *mut mlx5dv_context) -> c_int;
        fn mlx5dv_init_obj(obj: *mut mlx5dv_obj, obj_type: u64) -> c_int;
        fn mlx5dv_is_supported(device: *mut ibv_device) -> bool;
        fn mlx5dv_open_device(device: *mut ibv_device, attr: *mut mlx5dv_context_attr) -> *mut ibv_context;
        fn mlx5dv_devx_umem_reg(ctx: *mut ibv_context, addr: *mut c_void, size: usize, access: u32) -> *mut mlx5dv_devx_umem;
        fn mlx5dv_devx_umem_dereg(umem: *mut mlx5dv_devx_umem) -> c_int;
        fn mlx5dv_devx_alloc_uar(context: *mut ibv_context, flags: u32) -> *mut mlx5dv_devx_uar;
        fn mlx5dv_devx_free_uar(devx_uar: *mut mlx5dv_devx_uar);
    }
}

dlopen_table! {
    /// The libmlx5 DevX functions: PRM command objects, the general command,
    /// EQ queries and umem registration with a dma-buf.
    pub struct DevxFns {
        fn mlx5dv_devx_obj_create(context: *mut ibv_context, in_: *const c_void, inlen: usize, out: *mut c_void, outlen: usize) -> *mut mlx5dv_devx_obj;
        fn mlx5dv_devx_obj_query(obj: *mut mlx5dv_devx_obj, in_: *const c_void, inlen: usize, out: *mut c_void, outlen: usize) -> c_int;
        fn mlx5dv_devx_obj_modify(obj: *mut mlx5dv_devx_obj, in_: *const c_void, inlen: usize, out: *mut c_void, outlen: usize) -> c_int;
        fn mlx5dv_devx_obj_destroy(obj: *mut mlx5dv_devx_obj) -> c_int;
        fn mlx5dv_devx_general_cmd(context: *mut ibv_context, in_: *const c_void, inlen: usize, out: *mut c_void, outlen: usize) -> c_int;
        fn mlx5dv_devx_query_eqn(context: *mut ibv_context, vector: u32, eqn: *mut u32) -> c_int;
        fn mlx5dv_devx_umem_reg_ex(ctx: *mut ibv_context, umem_in: *mut mlx5dv_devx_umem_in) -> *mut mlx5dv_devx_umem;
    }
}
