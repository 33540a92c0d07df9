//! mlx5 work-queue and completion-queue wire format: the constants a GPU
//! kernel needs to build send WQEs and parse CQEs itself (IBGDA).
//!
//! Names are mlx5dv.h's without the `MLX5_` prefix (`MLX5_OPCODE_RDMA_WRITE`
//! is [`OPCODE_RDMA_WRITE`]). Every value is checked twice: at compile time
//! against the bindgen output of the header (the `const _` assertions in this
//! file), and in the tests against the C compiler's view of the header
//! (through the shim, see [`crate::shim`]).
//!
//! All multi-byte fields of WQEs and CQEs are big-endian.
//!
//! # Send WQE layout
//! A WQE is a run of 16-byte segments ("ds" counts them) inside 64-byte
//! basic blocks ([`SEND_WQE_BB`]):
//!
//! | op | segments | ds |
//! |----|----------|----|
//! | NOP | ctrl | 1 |
//! | RDMA write / write-imm / read | ctrl, raddr, data | 3 |
//! | atomic fetch-add / compare-swap | ctrl, raddr, atomic, data (8-byte result buffer) | 4 |
//!
//! Ctrl segment (16 bytes, [`ctrl`] offsets): word 0 =
//! `opmod << 24 | wqe_index << 8 | opcode`; word 1 = `qpn << 8 | ds`;
//! byte 8 signature; bytes 9-10 DCI stream id; byte 11 `fm_ce_se`
//! ([`WQE_CTRL_FENCE`] | [`WQE_CTRL_CQ_UPDATE`] | [`WQE_CTRL_SOLICITED`]);
//! word 3 immediate (already in network order).

use crate::sys;

// ---- send opcodes (ctrl segment, low byte of word 0) -------------------

/// `MLX5_OPCODE_NOP`.
pub const OPCODE_NOP: u8 = 0x00;
/// `MLX5_OPCODE_SEND_INVAL`.
pub const OPCODE_SEND_INVAL: u8 = 0x01;
/// `MLX5_OPCODE_RDMA_WRITE`.
pub const OPCODE_RDMA_WRITE: u8 = 0x08;
/// `MLX5_OPCODE_RDMA_WRITE_IMM`.
pub const OPCODE_RDMA_WRITE_IMM: u8 = 0x09;
/// `MLX5_OPCODE_SEND`.
pub const OPCODE_SEND: u8 = 0x0a;
/// `MLX5_OPCODE_SEND_IMM`.
pub const OPCODE_SEND_IMM: u8 = 0x0b;
/// `MLX5_OPCODE_TSO`.
pub const OPCODE_TSO: u8 = 0x0e;
/// `MLX5_OPCODE_RDMA_READ`.
pub const OPCODE_RDMA_READ: u8 = 0x10;
/// `MLX5_OPCODE_ATOMIC_CS` (compare and swap, 8 bytes).
pub const OPCODE_ATOMIC_CS: u8 = 0x11;
/// `MLX5_OPCODE_ATOMIC_FA` (fetch and add, 8 bytes).
pub const OPCODE_ATOMIC_FA: u8 = 0x12;
/// `MLX5_OPCODE_ATOMIC_MASKED_CS`.
pub const OPCODE_ATOMIC_MASKED_CS: u8 = 0x14;
/// `MLX5_OPCODE_ATOMIC_MASKED_FA`.
pub const OPCODE_ATOMIC_MASKED_FA: u8 = 0x15;
/// `MLX5_OPCODE_FMR`.
pub const OPCODE_FMR: u8 = 0x19;
/// `MLX5_OPCODE_LOCAL_INVAL`.
pub const OPCODE_LOCAL_INVAL: u8 = 0x1b;
/// `MLX5_OPCODE_CONFIG_CMD`.
pub const OPCODE_CONFIG_CMD: u8 = 0x1f;
/// `MLX5_OPCODE_SET_PSV`.
pub const OPCODE_SET_PSV: u8 = 0x20;
/// `MLX5_OPCODE_UMR`.
pub const OPCODE_UMR: u8 = 0x25;
/// `MLX5_OPCODE_TAG_MATCHING`.
pub const OPCODE_TAG_MATCHING: u8 = 0x28;
/// `MLX5_OPCODE_FLOW_TBL_ACCESS`.
pub const OPCODE_FLOW_TBL_ACCESS: u8 = 0x2c;
/// `MLX5_OPCODE_MMO`.
pub const OPCODE_MMO: u8 = 0x2f;

// ---- ctrl segment fm_ce_se flags ----------------------------------------

/// `MLX5_WQE_CTRL_CQ_UPDATE`: write a CQE when this WQE completes
/// ("signaled").
pub const WQE_CTRL_CQ_UPDATE: u8 = 0x08;
/// `MLX5_WQE_CTRL_SOLICITED`: set the solicited-event bit.
pub const WQE_CTRL_SOLICITED: u8 = 0x02;
/// `MLX5_WQE_CTRL_FENCE`: wait for earlier RDMA reads/atomics first.
pub const WQE_CTRL_FENCE: u8 = 0x80;
/// `MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE`.
pub const WQE_CTRL_INITIATOR_SMALL_FENCE: u8 = 0x20;

// ---- WQE geometry ------------------------------------------------------

/// `MLX5_SEND_WQE_BB`: bytes in a send-queue basic block.
pub const SEND_WQE_BB: usize = 64;
/// `MLX5_SEND_WQE_SHIFT`: log2 of [`SEND_WQE_BB`].
pub const SEND_WQE_SHIFT: u32 = 6;
/// `MLX5_INLINE_SEG`: flag in an inline data segment's byte count.
pub const INLINE_SEG: u32 = 0x8000_0000;
/// Bytes in one data-segment unit ("ds" counts these).
pub const SEG_UNIT: usize = 16;
/// `sizeof(struct mlx5_wqe_ctrl_seg)`.
pub const CTRL_SEG_SIZE: usize = 16;
/// `sizeof(struct mlx5_wqe_raddr_seg)`.
pub const RADDR_SEG_SIZE: usize = 16;
/// `sizeof(struct mlx5_wqe_data_seg)`.
pub const DATA_SEG_SIZE: usize = 16;
/// `sizeof(struct mlx5_wqe_atomic_seg)`.
pub const ATOMIC_SEG_SIZE: usize = 16;

/// Byte offsets in `struct mlx5_wqe_ctrl_seg`.
pub mod ctrl {
    /// `opmod_idx_opcode` (BE32: opmod << 24 | wqe index << 8 | opcode).
    pub const OPMOD_IDX_OPCODE: usize = 0;
    /// `qpn_ds` (BE32: qpn << 8 | ds).
    pub const QPN_DS: usize = 4;
    /// `signature`.
    pub const SIGNATURE: usize = 8;
    /// `dci_stream_channel_id` (BE16).
    pub const DCI_STREAM_CHANNEL_ID: usize = 9;
    /// `fm_ce_se`.
    pub const FM_CE_SE: usize = 11;
    /// `imm` (network order).
    pub const IMM: usize = 12;
}

/// Byte offsets in `struct mlx5_wqe_raddr_seg`.
pub mod raddr {
    /// `raddr` (BE64).
    pub const RADDR: usize = 0;
    /// `rkey` (BE32).
    pub const RKEY: usize = 8;
}

/// Byte offsets in `struct mlx5_wqe_data_seg`.
pub mod data {
    /// `byte_count` (BE32).
    pub const BYTE_COUNT: usize = 0;
    /// `lkey` (BE32).
    pub const LKEY: usize = 4;
    /// `addr` (BE64).
    pub const ADDR: usize = 8;
}

/// Byte offsets in `struct mlx5_wqe_atomic_seg`.
pub mod atomic {
    /// `swap_add` (BE64): the addend, or the swap value.
    pub const SWAP_ADD: usize = 0;
    /// `compare` (BE64).
    pub const COMPARE: usize = 8;
}

// ---- CQEs ----------------------------------------------------------------

/// Bytes in a CQE (`sizeof(struct mlx5_cqe64)`).
pub const CQE_SIZE: usize = 64;
/// `MLX5_CQE_OWNER_MASK`: the owner bit in `op_own`.
pub const CQE_OWNER_MASK: u8 = 1;
/// `MLX5_CQE_REQ`: a send-side completion.
pub const CQE_REQ: u8 = 0;
/// `MLX5_CQE_RESP_WR_IMM`: an incoming RDMA write with immediate.
pub const CQE_RESP_WR_IMM: u8 = 1;
/// `MLX5_CQE_RESP_SEND`.
pub const CQE_RESP_SEND: u8 = 2;
/// `MLX5_CQE_RESP_SEND_IMM`.
pub const CQE_RESP_SEND_IMM: u8 = 3;
/// `MLX5_CQE_RESP_SEND_INV`.
pub const CQE_RESP_SEND_INV: u8 = 4;
/// `MLX5_CQE_RESIZE_CQ`.
pub const CQE_RESIZE_CQ: u8 = 5;
/// `MLX5_CQE_NO_PACKET`.
pub const CQE_NO_PACKET: u8 = 6;
/// `MLX5_CQE_SIG_ERR`.
pub const CQE_SIG_ERR: u8 = 12;
/// `MLX5_CQE_REQ_ERR`: a send-side error; the CQE is a `mlx5_err_cqe`.
pub const CQE_REQ_ERR: u8 = 13;
/// `MLX5_CQE_RESP_ERR`: a receive-side error; the CQE is a `mlx5_err_cqe`.
pub const CQE_RESP_ERR: u8 = 14;
/// `MLX5_CQE_INVALID`: software's initial value; hardware has not
/// written this entry.
pub const CQE_INVALID: u8 = 15;
/// `MLX5_CQE_VENDOR_SYNDROME_ODP_PFAULT`.
pub const CQE_VENDOR_SYNDROME_ODP_PFAULT: u8 = 0x93;

/// `MLX5_CQ_DOORBELL`: offset of the CQ doorbell in the UAR page.
pub const CQ_DOORBELL: u32 = 0x20;
/// `MLX5_CQ_DB_REQ_NOT_SOL`: arm for solicited completions only.
pub const CQ_DB_REQ_NOT_SOL: u32 = 1 << 24;
/// `MLX5_CQ_DB_REQ_NOT`: arm for any completion.
pub const CQ_DB_REQ_NOT: u32 = 0;

/// Byte offsets in `struct mlx5_cqe64` (a successful completion).
pub mod cqe64 {
    /// `srqn_uidx` (BE32).
    pub const SRQN_UIDX: usize = 32;
    /// `imm_inval_pkey` (BE32): the immediate of RESP_*_IMM completions.
    pub const IMM_INVAL_PKEY: usize = 36;
    /// `byte_cnt` (BE32): bytes transferred.
    pub const BYTE_CNT: usize = 44;
    /// `timestamp` (BE64).
    pub const TIMESTAMP: usize = 48;
    /// `sop_drop_qpn` (BE32): QP number in the low 24 bits.
    pub const SOP_DROP_QPN: usize = 56;
    /// `wqe_counter` (BE16): index of the completed WQE (requester side).
    pub const WQE_COUNTER: usize = 60;
    /// `signature`.
    pub const SIGNATURE: usize = 62;
    /// `op_own`: CQE opcode in the high nibble, owner bit in bit 0.
    pub const OP_OWN: usize = 63;
}

/// Byte offsets in `struct mlx5_err_cqe` (opcode [`CQE_REQ_ERR`] or
/// [`CQE_RESP_ERR`]).
pub mod err_cqe {
    /// `srqn`.
    pub const SRQN: usize = 32;
    /// `vendor_err_synd`: vendor-specific detail.
    pub const VENDOR_ERR_SYND: usize = 54;
    /// `syndrome`: a [`super::CqeSyndrome`].
    pub const SYNDROME: usize = 55;
    /// `s_wqe_opcode_qpn` (BE32): failing WQE's opcode in the high byte, QP
    /// number in the low 24 bits.
    pub const S_WQE_OPCODE_QPN: usize = 56;
    /// `wqe_counter` (BE16).
    pub const WQE_COUNTER: usize = 60;
    /// `signature`.
    pub const SIGNATURE: usize = 62;
    /// `op_own`.
    pub const OP_OWN: usize = 63;
}

/// The CQE opcode: the high nibble of `op_own`.
pub const fn cqe_opcode(op_own: u8) -> u8 {
    op_own >> 4
}

/// The owner bit of `op_own`.
pub const fn cqe_owner(op_own: u8) -> u8 {
    op_own & CQE_OWNER_MASK
}

/// Error syndromes of an `mlx5_err_cqe` (`MLX5_CQE_SYNDROME_*`).
#[repr(u8)]
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CqeSyndrome {
    /// `MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR`.
    LocalLengthErr = 0x01,
    /// `MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR`.
    LocalQpOpErr = 0x02,
    /// `MLX5_CQE_SYNDROME_LOCAL_PROT_ERR`.
    LocalProtErr = 0x04,
    /// `MLX5_CQE_SYNDROME_WR_FLUSH_ERR`.
    WrFlushErr = 0x05,
    /// `MLX5_CQE_SYNDROME_MW_BIND_ERR`.
    MwBindErr = 0x06,
    /// `MLX5_CQE_SYNDROME_BAD_RESP_ERR`.
    BadRespErr = 0x10,
    /// `MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR`.
    LocalAccessErr = 0x11,
    /// `MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR`.
    RemoteInvalReqErr = 0x12,
    /// `MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR`.
    RemoteAccessErr = 0x13,
    /// `MLX5_CQE_SYNDROME_REMOTE_OP_ERR`.
    RemoteOpErr = 0x14,
    /// `MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR`.
    TransportRetryExcErr = 0x15,
    /// `MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR`.
    RnrRetryExcErr = 0x16,
    /// `MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR`.
    RemoteAbortedErr = 0x22,
}

impl CqeSyndrome {
    /// Every syndrome, in header order.
    pub const ALL: [CqeSyndrome; 13] = [
        Self::LocalLengthErr,
        Self::LocalQpOpErr,
        Self::LocalProtErr,
        Self::WrFlushErr,
        Self::MwBindErr,
        Self::BadRespErr,
        Self::LocalAccessErr,
        Self::RemoteInvalReqErr,
        Self::RemoteAccessErr,
        Self::RemoteOpErr,
        Self::TransportRetryExcErr,
        Self::RnrRetryExcErr,
        Self::RemoteAbortedErr,
    ];

    /// The syndrome with byte value `v`, if it is one the header defines.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x01 => Self::LocalLengthErr,
            0x02 => Self::LocalQpOpErr,
            0x04 => Self::LocalProtErr,
            0x05 => Self::WrFlushErr,
            0x06 => Self::MwBindErr,
            0x10 => Self::BadRespErr,
            0x11 => Self::LocalAccessErr,
            0x12 => Self::RemoteInvalReqErr,
            0x13 => Self::RemoteAccessErr,
            0x14 => Self::RemoteOpErr,
            0x15 => Self::TransportRetryExcErr,
            0x16 => Self::RnrRetryExcErr,
            0x22 => Self::RemoteAbortedErr,
            _ => return None,
        })
    }

    /// The byte value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The header's name, e.g. `"MLX5_CQE_SYNDROME_WR_FLUSH_ERR"`.
    pub const fn c_name(self) -> &'static str {
        match self {
            Self::LocalLengthErr => "MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR",
            Self::LocalQpOpErr => "MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR",
            Self::LocalProtErr => "MLX5_CQE_SYNDROME_LOCAL_PROT_ERR",
            Self::WrFlushErr => "MLX5_CQE_SYNDROME_WR_FLUSH_ERR",
            Self::MwBindErr => "MLX5_CQE_SYNDROME_MW_BIND_ERR",
            Self::BadRespErr => "MLX5_CQE_SYNDROME_BAD_RESP_ERR",
            Self::LocalAccessErr => "MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR",
            Self::RemoteInvalReqErr => "MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR",
            Self::RemoteAccessErr => "MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR",
            Self::RemoteOpErr => "MLX5_CQE_SYNDROME_REMOTE_OP_ERR",
            Self::TransportRetryExcErr => "MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR",
            Self::RnrRetryExcErr => "MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR",
            Self::RemoteAbortedErr => "MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR",
        }
    }

    /// What went wrong, in words, with the usual cause.
    pub const fn description(self) -> &'static str {
        match self {
            Self::LocalLengthErr => "local length error: a scatter/gather list is longer than the message or the buffer is too small",
            Self::LocalQpOpErr => "local QP operation error: the WQE is malformed or the QP is in a state that cannot post it",
            Self::LocalProtErr => "local protection error: an lkey is invalid or its MR does not cover the local buffer",
            Self::WrFlushErr => "work request flushed: the QP entered the error state, outstanding WQEs were discarded",
            Self::MwBindErr => "memory window bind error",
            Self::BadRespErr => "bad response: unexpected transport opcode from the responder",
            Self::LocalAccessErr => "local access error: protection error on a local buffer during an incoming operation",
            Self::RemoteInvalReqErr => "remote invalid request: the responder rejected the request (e.g. unsupported op, bad length)",
            Self::RemoteAccessErr => "remote access error: rkey invalid, remote range outside the MR, or missing remote access rights",
            Self::RemoteOpErr => "remote operation error: the responder could not complete the operation",
            Self::TransportRetryExcErr => "transport retry count exceeded: no ACK from the peer (peer down, wrong address or path)",
            Self::RnrRetryExcErr => "RNR retry count exceeded: the responder had no receive WQE posted",
            Self::RemoteAbortedErr => "remote aborted: the responder aborted the operation",
        }
    }
}

impl core::fmt::Display for CqeSyndrome {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ({:#04x})", self.description(), self.as_u8())
    }
}

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
    CqeSyndrome::LocalLengthErr => sys::MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR,
    CqeSyndrome::LocalQpOpErr => sys::MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
    CqeSyndrome::LocalProtErr => sys::MLX5_CQE_SYNDROME_LOCAL_PROT_ERR,
    CqeSyndrome::WrFlushErr => sys::MLX5_CQE_SYNDROME_WR_FLUSH_ERR,
    CqeSyndrome::MwBindErr => sys::MLX5_CQE_SYNDROME_MW_BIND_ERR,
    CqeSyndrome::BadRespErr => sys::MLX5_CQE_SYNDROME_BAD_RESP_ERR,
    CqeSyndrome::LocalAccessErr => sys::MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR,
    CqeSyndrome::RemoteInvalReqErr => sys::MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR,
    CqeSyndrome::RemoteAccessErr => sys::MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR,
    CqeSyndrome::RemoteOpErr => sys::MLX5_CQE_SYNDROME_REMOTE_OP_ERR,
    CqeSyndrome::TransportRetryExcErr => sys::MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR,
    CqeSyndrome::RnrRetryExcErr => sys::MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR,
    CqeSyndrome::RemoteAbortedErr => sys::MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR,
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

// Internal consistency.
const _: () = assert!(SEND_WQE_BB == 1 << SEND_WQE_SHIFT);
const _: () = assert!(SEND_WQE_BB == 4 * SEG_UNIT);
const _: () = assert!(CTRL_SEG_SIZE + RADDR_SEG_SIZE + ATOMIC_SEG_SIZE + DATA_SEG_SIZE == SEND_WQE_BB);
const _: () = assert!(cqe64::OP_OWN == CQE_SIZE - 1 && err_cqe::OP_OWN == cqe64::OP_OWN);
const _: () = assert!(cqe64::WQE_COUNTER == err_cqe::WQE_COUNTER);
const _: () = {
    let mut i = 0;
    while i < CqeSyndrome::ALL.len() {
        let s = CqeSyndrome::ALL[i];
        match CqeSyndrome::from_u8(s.as_u8()) {
            Some(t) => assert!(t as u8 == s as u8),
            None => panic!("from_u8 misses a syndrome"),
        }
        i += 1;
    }
};
