//! The mlx5 wire vocabulary, defined once: WQE opcodes and flags, segment
//! and CQE sizes and field offsets, CQE opcodes and error syndromes. The
//! device code builds and parses WQEs/CQEs with it; `rdma-sys-ext`
//! re-exports it and checks every value at compile time against the
//! bindgen view of rdma-core's `mlx5dv.h`, and its tests against the C
//! compiler's view (a shim).
//!
//! Names are mlx5dv.h's without the `MLX5_` prefix (`MLX5_OPCODE_RDMA_WRITE`
//! is [`OPCODE_RDMA_WRITE`]). All multi-byte fields of WQEs and CQEs are
//! big-endian.
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
//! word 3 immediate (already in network order). The "signaled" WQE flag
//! (`WQE_CTRL_CQ_UPDATE`) asks for a completion; it is unrelated to the
//! transport API's signal words.

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

/// The immediate (ctrl segment bytes 12–15, as read big-endian) that marks
/// an RDMA WRITE of a warp-wide run (`Transport::put_lanes`) other than the
/// run's first WQE: the run's WRITEs are the parts of one call, which race
/// with each other as the lanes' stores would over P2P, so they need no
/// order among themselves. An RDMA WRITE (opcode `0x08`) carries no
/// immediate, and a ConnectX ignores the field for it; the soft NIC's
/// bursts store the WRITEs so marked without a release each (one fence
/// orders them all behind what came before the run). A WQE built by
/// rdma-core has 0 there.
pub const UNORDERED_WRITE_IMM: u32 = 0x6c61_6e65;

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
    /// `syndrome`: a [`CqeSyndrome`](super::CqeSyndrome).
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

/// `MLX5_CQE_SYNDROME_*`: why a WQE failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CqeSyndrome {
    /// 0x01: a local length error (the data segment's length or a bad SGE).
    LocalLength,
    /// 0x02: local QP operation error (malformed WQE).
    LocalQpOp,
    /// 0x04: local protection error (lkey does not cover the local buffer).
    LocalProt,
    /// 0x05: flushed: the QP was in error when this WQE reached it.
    WrFlush,
    /// 0x06: memory window bind error.
    MwBind,
    /// 0x10: bad response from the remote.
    BadResp,
    /// 0x11: local access error.
    LocalAccess,
    /// 0x12: remote invalid request (e.g. an op the remote QP does not allow).
    RemoteInvalReq,
    /// 0x13: remote access error (rkey / bounds / permissions).
    RemoteAccess,
    /// 0x14: remote operation error.
    RemoteOp,
    /// 0x15: transport retries exhausted (remote unreachable).
    TransportRetryExc,
    /// 0x16: RNR retries exhausted.
    RnrRetryExc,
    /// 0x22: remote aborted.
    RemoteAborted,
    /// A value mlx5dv.h does not name.
    Other(u8),
}

impl CqeSyndrome {
    /// Every syndrome mlx5dv.h names, in header order.
    pub const ALL: [CqeSyndrome; 13] = [
        Self::LocalLength,
        Self::LocalQpOp,
        Self::LocalProt,
        Self::WrFlush,
        Self::MwBind,
        Self::BadResp,
        Self::LocalAccess,
        Self::RemoteInvalReq,
        Self::RemoteAccess,
        Self::RemoteOp,
        Self::TransportRetryExc,
        Self::RnrRetryExc,
        Self::RemoteAborted,
    ];

    /// The named syndrome for byte `v`, `None` for a value the header does not name.
    pub const fn known(v: u8) -> Option<CqeSyndrome> {
        match Self::from_u8(v) {
            Self::Other(_) => None,
            s => Some(s),
        }
    }

    /// The syndrome for byte `v`.
    pub const fn from_u8(v: u8) -> CqeSyndrome {
        match v {
            0x01 => Self::LocalLength,
            0x02 => Self::LocalQpOp,
            0x04 => Self::LocalProt,
            0x05 => Self::WrFlush,
            0x06 => Self::MwBind,
            0x10 => Self::BadResp,
            0x11 => Self::LocalAccess,
            0x12 => Self::RemoteInvalReq,
            0x13 => Self::RemoteAccess,
            0x14 => Self::RemoteOp,
            0x15 => Self::TransportRetryExc,
            0x16 => Self::RnrRetryExc,
            0x22 => Self::RemoteAborted,
            other => Self::Other(other),
        }
    }

    /// The byte value.
    pub const fn as_u8(self) -> u8 {
        match self {
            Self::LocalLength => 0x01,
            Self::LocalQpOp => 0x02,
            Self::LocalProt => 0x04,
            Self::WrFlush => 0x05,
            Self::MwBind => 0x06,
            Self::BadResp => 0x10,
            Self::LocalAccess => 0x11,
            Self::RemoteInvalReq => 0x12,
            Self::RemoteAccess => 0x13,
            Self::RemoteOp => 0x14,
            Self::TransportRetryExc => 0x15,
            Self::RnrRetryExc => 0x16,
            Self::RemoteAborted => 0x22,
            Self::Other(v) => v,
        }
    }

    /// The header's name, e.g. `"MLX5_CQE_SYNDROME_WR_FLUSH_ERR"`.
    pub const fn c_name(self) -> &'static str {
        match self {
            Self::LocalLength => "MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR",
            Self::LocalQpOp => "MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR",
            Self::LocalProt => "MLX5_CQE_SYNDROME_LOCAL_PROT_ERR",
            Self::WrFlush => "MLX5_CQE_SYNDROME_WR_FLUSH_ERR",
            Self::MwBind => "MLX5_CQE_SYNDROME_MW_BIND_ERR",
            Self::BadResp => "MLX5_CQE_SYNDROME_BAD_RESP_ERR",
            Self::LocalAccess => "MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR",
            Self::RemoteInvalReq => "MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR",
            Self::RemoteAccess => "MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR",
            Self::RemoteOp => "MLX5_CQE_SYNDROME_REMOTE_OP_ERR",
            Self::TransportRetryExc => "MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR",
            Self::RnrRetryExc => "MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR",
            Self::RemoteAborted => "MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR",
            Self::Other(_) => "MLX5_CQE_SYNDROME_(unknown)",
        }
    }

    /// What went wrong, in words, with the usual cause.
    pub const fn description(self) -> &'static str {
        match self {
            Self::LocalLength => "local length error: a scatter/gather list is longer than the message or the buffer is too small",
            Self::LocalQpOp => "local QP operation error: the WQE is malformed or the QP is in a state that cannot post it",
            Self::LocalProt => "local protection error: an lkey is invalid or its MR does not cover the local buffer",
            Self::WrFlush => "work request flushed: the QP entered the error state, outstanding WQEs were discarded",
            Self::MwBind => "memory window bind error",
            Self::BadResp => "bad response: unexpected transport opcode from the responder",
            Self::LocalAccess => "local access error: protection error on a local buffer during an incoming operation",
            Self::RemoteInvalReq => "remote invalid request: the responder rejected the request (e.g. unsupported op, bad length)",
            Self::RemoteAccess => "remote access error: rkey invalid, remote range outside the MR, or missing remote access rights",
            Self::RemoteOp => "remote operation error: the responder could not complete the operation",
            Self::TransportRetryExc => "transport retry count exceeded: no ACK from the peer (peer down, wrong address or path)",
            Self::RnrRetryExc => "RNR retry count exceeded: the responder had no receive WQE posted",
            Self::RemoteAborted => "remote aborted: the responder aborted the operation",
            Self::Other(_) => "a syndrome mlx5dv.h does not name",
        }
    }
}

impl core::fmt::Display for CqeSyndrome {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ({:#04x})", self.description(), self.as_u8())
    }
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
        assert!(CqeSyndrome::from_u8(s.as_u8()).as_u8() == s.as_u8());
        assert!(CqeSyndrome::known(s.as_u8()).is_some());
        i += 1;
    }
};
