//! mlx5 work-queue and completion-queue wire format: the constants a GPU
//! kernel needs to build send WQEs and parse CQEs itself (IBGDA).
//!
//! The vocabulary is defined once, in `doorbell_kernels::mlx5::wire` (the
//! device code uses it); this module re-exports it and checks every value at
//! compile time against the bindgen output of rdma-core's `mlx5dv.h` (the
//! `const _` assertions below), and the tests check it against the C
//! compiler's view of the header (through the shim, see [`crate::shim`]).

pub use doorbell_kernels::mlx5::wire::*;

use crate::sys;

// ---- compile-time checks against the bindgen view of mlx5dv.h ----------

macro_rules! same_as_header {
    ($($ours:expr => $header:path),* $(,)?) => {
        $( const _: () = assert!(
            $ours as u64 == $header as u64,
            concat!(stringify!($ours), " differs from ", stringify!($header))
        ); )*
    };
}

same_as_header! {
    OPCODE_NOP => sys::MLX5_OPCODE_NOP,
    OPCODE_SEND_INVAL => sys::MLX5_OPCODE_SEND_INVAL,
    OPCODE_RDMA_WRITE => sys::MLX5_OPCODE_RDMA_WRITE,
    OPCODE_RDMA_WRITE_IMM => sys::MLX5_OPCODE_RDMA_WRITE_IMM,
    OPCODE_SEND => sys::MLX5_OPCODE_SEND,
    OPCODE_SEND_IMM => sys::MLX5_OPCODE_SEND_IMM,
    OPCODE_TSO => sys::MLX5_OPCODE_TSO,
    OPCODE_RDMA_READ => sys::MLX5_OPCODE_RDMA_READ,
    OPCODE_ATOMIC_CS => sys::MLX5_OPCODE_ATOMIC_CS,
    OPCODE_ATOMIC_FA => sys::MLX5_OPCODE_ATOMIC_FA,
    OPCODE_ATOMIC_MASKED_CS => sys::MLX5_OPCODE_ATOMIC_MASKED_CS,
    OPCODE_ATOMIC_MASKED_FA => sys::MLX5_OPCODE_ATOMIC_MASKED_FA,
    OPCODE_FMR => sys::MLX5_OPCODE_FMR,
    OPCODE_LOCAL_INVAL => sys::MLX5_OPCODE_LOCAL_INVAL,
    OPCODE_CONFIG_CMD => sys::MLX5_OPCODE_CONFIG_CMD,
    OPCODE_SET_PSV => sys::MLX5_OPCODE_SET_PSV,
    OPCODE_UMR => sys::MLX5_OPCODE_UMR,
    OPCODE_TAG_MATCHING => sys::MLX5_OPCODE_TAG_MATCHING,
    OPCODE_FLOW_TBL_ACCESS => sys::MLX5_OPCODE_FLOW_TBL_ACCESS,
    OPCODE_MMO => sys::MLX5_OPCODE_MMO,
    WQE_CTRL_CQ_UPDATE => sys::MLX5_WQE_CTRL_CQ_UPDATE,
    WQE_CTRL_SOLICITED => sys::MLX5_WQE_CTRL_SOLICITED,
    WQE_CTRL_FENCE => sys::MLX5_WQE_CTRL_FENCE,
    WQE_CTRL_INITIATOR_SMALL_FENCE => sys::MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE,
    SEND_WQE_BB => sys::MLX5_SEND_WQE_BB,
    SEND_WQE_SHIFT => sys::MLX5_SEND_WQE_SHIFT,
    INLINE_SEG => sys::MLX5_INLINE_SEG,
    CQE_OWNER_MASK => sys::MLX5_CQE_OWNER_MASK,
    CQE_REQ => sys::MLX5_CQE_REQ,
    CQE_RESP_WR_IMM => sys::MLX5_CQE_RESP_WR_IMM,
    CQE_RESP_SEND => sys::MLX5_CQE_RESP_SEND,
    CQE_RESP_SEND_IMM => sys::MLX5_CQE_RESP_SEND_IMM,
    CQE_RESP_SEND_INV => sys::MLX5_CQE_RESP_SEND_INV,
    CQE_RESIZE_CQ => sys::MLX5_CQE_RESIZE_CQ,
    CQE_NO_PACKET => sys::MLX5_CQE_NO_PACKET,
    CQE_SIG_ERR => sys::MLX5_CQE_SIG_ERR,
    CQE_REQ_ERR => sys::MLX5_CQE_REQ_ERR,
    CQE_RESP_ERR => sys::MLX5_CQE_RESP_ERR,
    CQE_INVALID => sys::MLX5_CQE_INVALID,
    CQE_VENDOR_SYNDROME_ODP_PFAULT => sys::MLX5_CQE_VENDOR_SYNDROME_ODP_PFAULT,
    CQ_DOORBELL => sys::MLX5_CQ_DOORBELL,
    CQ_DB_REQ_NOT_SOL => sys::MLX5_CQ_DB_REQ_NOT_SOL,
    CQ_DB_REQ_NOT => sys::MLX5_CQ_DB_REQ_NOT,
    CqeSyndrome::LocalLength.as_u8() => sys::MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR,
    CqeSyndrome::LocalQpOp.as_u8() => sys::MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
    CqeSyndrome::LocalProt.as_u8() => sys::MLX5_CQE_SYNDROME_LOCAL_PROT_ERR,
    CqeSyndrome::WrFlush.as_u8() => sys::MLX5_CQE_SYNDROME_WR_FLUSH_ERR,
    CqeSyndrome::MwBind.as_u8() => sys::MLX5_CQE_SYNDROME_MW_BIND_ERR,
    CqeSyndrome::BadResp.as_u8() => sys::MLX5_CQE_SYNDROME_BAD_RESP_ERR,
    CqeSyndrome::LocalAccess.as_u8() => sys::MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR,
    CqeSyndrome::RemoteInvalReq.as_u8() => sys::MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR,
    CqeSyndrome::RemoteAccess.as_u8() => sys::MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR,
    CqeSyndrome::RemoteOp.as_u8() => sys::MLX5_CQE_SYNDROME_REMOTE_OP_ERR,
    CqeSyndrome::TransportRetryExc.as_u8() => sys::MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR,
    CqeSyndrome::RnrRetryExc.as_u8() => sys::MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR,
    CqeSyndrome::RemoteAborted.as_u8() => sys::MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR,
}

macro_rules! layout_as_header {
    ($($ours:expr => $value:expr),* $(,)?) => {
        $( const _: () = assert!(
            $ours == $value,
            concat!(stringify!($ours), " differs from ", stringify!($value))
        ); )*
    };
}

use core::mem::{offset_of, size_of};

layout_as_header! {
    CTRL_SEG_SIZE => size_of::<sys::mlx5_wqe_ctrl_seg>(),
    RADDR_SEG_SIZE => size_of::<sys::mlx5_wqe_raddr_seg>(),
    DATA_SEG_SIZE => size_of::<sys::mlx5_wqe_data_seg>(),
    ATOMIC_SEG_SIZE => size_of::<sys::mlx5_wqe_atomic_seg>(),
    CQE_SIZE => size_of::<sys::mlx5_cqe64>(),
    CQE_SIZE => size_of::<sys::mlx5_err_cqe>(),
    ctrl::OPMOD_IDX_OPCODE => offset_of!(sys::mlx5_wqe_ctrl_seg, opmod_idx_opcode),
    ctrl::QPN_DS => offset_of!(sys::mlx5_wqe_ctrl_seg, qpn_ds),
    ctrl::SIGNATURE => offset_of!(sys::mlx5_wqe_ctrl_seg, signature),
    ctrl::DCI_STREAM_CHANNEL_ID => offset_of!(sys::mlx5_wqe_ctrl_seg, dci_stream_channel_id),
    ctrl::FM_CE_SE => offset_of!(sys::mlx5_wqe_ctrl_seg, fm_ce_se),
    ctrl::IMM => offset_of!(sys::mlx5_wqe_ctrl_seg, imm),
    raddr::RADDR => offset_of!(sys::mlx5_wqe_raddr_seg, raddr),
    raddr::RKEY => offset_of!(sys::mlx5_wqe_raddr_seg, rkey),
    data::BYTE_COUNT => offset_of!(sys::mlx5_wqe_data_seg, byte_count),
    data::LKEY => offset_of!(sys::mlx5_wqe_data_seg, lkey),
    data::ADDR => offset_of!(sys::mlx5_wqe_data_seg, addr),
    atomic::SWAP_ADD => offset_of!(sys::mlx5_wqe_atomic_seg, swap_add),
    atomic::COMPARE => offset_of!(sys::mlx5_wqe_atomic_seg, compare),
    cqe64::SRQN_UIDX => offset_of!(sys::mlx5_cqe64, srqn_uidx),
    cqe64::IMM_INVAL_PKEY => offset_of!(sys::mlx5_cqe64, imm_inval_pkey),
    cqe64::BYTE_CNT => offset_of!(sys::mlx5_cqe64, byte_cnt),
    cqe64::TIMESTAMP => offset_of!(sys::mlx5_cqe64, timestamp),
    cqe64::SOP_DROP_QPN => offset_of!(sys::mlx5_cqe64, sop_drop_qpn),
    cqe64::WQE_COUNTER => offset_of!(sys::mlx5_cqe64, wqe_counter),
    cqe64::SIGNATURE => offset_of!(sys::mlx5_cqe64, signature),
    cqe64::OP_OWN => offset_of!(sys::mlx5_cqe64, op_own),
    err_cqe::SRQN => offset_of!(sys::mlx5_err_cqe, srqn),
    err_cqe::VENDOR_ERR_SYND => offset_of!(sys::mlx5_err_cqe, vendor_err_synd),
    err_cqe::SYNDROME => offset_of!(sys::mlx5_err_cqe, syndrome),
    err_cqe::S_WQE_OPCODE_QPN => offset_of!(sys::mlx5_err_cqe, s_wqe_opcode_qpn),
    err_cqe::WQE_COUNTER => offset_of!(sys::mlx5_err_cqe, wqe_counter),
    err_cqe::SIGNATURE => offset_of!(sys::mlx5_err_cqe, signature),
    err_cqe::OP_OWN => offset_of!(sys::mlx5_err_cqe, op_own),
}
