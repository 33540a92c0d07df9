//! Raw FFI types and symbol tables for libibverbs and libmlx5.
//!
//! Everything in [`generated`] (re-exported here) is produced by
//! `scripts/gen-rdma-bindings.sh` (bindgen over `<infiniband/verbs.h>` +
//! `<infiniband/mlx5dv.h>`, rdma-core 44 on Debian 12). Do not edit it by
//! hand: rerun the script. The DevX types bindgen does not produce, the
//! opaque [`mlx5dv_devx_obj`] and [`mlx5dv_devx_umem_in`], are written by
//! hand in `devx.rs`, with compile-time layout checks of the struct.
//!
//! The types carry bindgen's compile-time layout assertions (size, alignment
//! and every field offset as clang computed them from the header), so a
//! mismatch fails the build instead of corrupting memory.
//!
//! Enums are plain integer constants (`pub type ibv_qp_type = u32;`
//! `pub const IBV_QPT_RC: ibv_qp_type = 2;` and so on), because C enums used
//! as flag sets hold values that no Rust enum variant could.
//!
//! The three symbol tables, [`IbverbsFns`], [`Mlx5Fns`] and [`DevxFns`]
//! (`mlx5dv_devx_obj_*`, `mlx5dv_devx_general_cmd`, `mlx5dv_devx_query_eqn`,
//! `mlx5dv_devx_umem_reg_ex`), are built with libloading from `dlopen`ed
//! libraries, each declared once in `tables.rs` by one macro from its C
//! signatures (those the script's bindgen run derives from the headers).
//! Each field is a `Result`: a symbol that an older rdma-core lacks (say
//! `ibv_reg_dmabuf_mr`, new in IBVERBS_1.12 / rdma-core 34) is kept as the
//! `Err` from `dlsym`, and [`crate::Verbs`] turns it into
//! [`crate::Error::MissingSymbol`] when it is called. `dlsym` resolves the
//! default symbol version (e.g. `ibv_query_port@@IBVERBS_1.1`), which is the
//! one a program linked against the current headers would use.

#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::missing_safety_doc,
    missing_docs,
    rustdoc::all
)]

#[rustfmt::skip]
pub mod generated;
mod devx;
mod tables;

pub use devx::{mlx5dv_devx_obj, mlx5dv_devx_umem_in, MLX5DV_UMEM_MASK_DMABUF};
pub use generated::*;
pub use tables::{DevxFns, IbverbsFns, Mlx5Fns};

/// `__VERBS_ABI_IS_EXTENDED` from verbs.h: the value of
/// `ibv_context::abi_compat` when the context is embedded in a
/// [`verbs_context`] (a macro, `((void *)UINTPTR_MAX)`, so bindgen skips it).
pub const VERBS_ABI_IS_EXTENDED: *mut core::ffi::c_void = usize::MAX as *mut core::ffi::c_void;

/// `MLX5DV_UAR_ALLOC_TYPE_BF` (mlx5_api.h macro): a blue-flame UAR page.
pub const MLX5DV_UAR_ALLOC_TYPE_BF: u32 = MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF;
/// `MLX5DV_UAR_ALLOC_TYPE_NC` (mlx5_api.h macro): a non-cached UAR page,
/// the kind IBGDA maps for GPU doorbells.
pub const MLX5DV_UAR_ALLOC_TYPE_NC: u32 = MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC;

/// `IBV_ACCESS_OPTIONAL_RANGE` (verbs_api.h macro): access bits a kernel may
/// ignore (e.g. [`IBV_ACCESS_RELAXED_ORDERING`]). `ibv_reg_mr` in verbs.h is a
/// macro that routes such flags to `ibv_reg_mr_iova2`; [`crate::Verbs::reg_mr`]
/// does the same.
pub const IBV_ACCESS_OPTIONAL_RANGE: u32 = IB_UVERBS_ACCESS_OPTIONAL_RANGE;

/// `struct mlx5_wqe_ctrl_seg` (hand-written: the header declares it
/// `__packed__` and `__aligned__(4)`, which bindgen renders as
/// `repr(packed(4))` and so misplaces `dci_stream_channel_id`).
///
/// `dci_stream_channel_id` is a big-endian 16-bit value at byte offset 9,
/// kept as bytes here so the struct needs no packing. All multi-byte fields
/// are big-endian. Size and offsets are checked at compile time in
/// [`crate::mlx5`] and against the C compiler in the tests.
#[repr(C, align(4))]
#[derive(Debug, Default, Copy, Clone, PartialEq, Eq)]
pub struct mlx5_wqe_ctrl_seg {
    pub opmod_idx_opcode: __be32,
    pub qpn_ds: __be32,
    pub signature: u8,
    pub dci_stream_channel_id: [u8; 2],
    pub fm_ce_se: u8,
    pub imm: __be32,
}
