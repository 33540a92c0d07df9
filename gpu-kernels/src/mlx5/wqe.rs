//! One WQE = one 64-byte basic block, built from a [`WqeRequest`].
//!
//! [`wqe_words`] assembles the 16 memory words in registers (it is `const`
//! and shared by host and device); the `write_*_wqe` functions store them
//! with four 16-byte stores. One lane builds one WQE; nothing reads memory.

use super::segments::{AtomicSeg, CtrlSeg, DataSeg, RaddrSeg};
use super::*;

u32_enum! {
    /// The operation of a WQE.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub enum WqeOp {
        /// `MLX5_OPCODE_NOP`: ctrl only (ds 1).
        #[default]
        Nop = 0,
        /// `MLX5_OPCODE_RDMA_WRITE`: ctrl + raddr + data (ds 3).
        Write = 1,
        /// `MLX5_OPCODE_RDMA_WRITE_IMM`: ctrl (with imm) + raddr + data (ds 3).
        WriteImm = 2,
        /// `MLX5_OPCODE_RDMA_READ`: ctrl + raddr + data (ds 3).
        Read = 3,
        /// `MLX5_OPCODE_ATOMIC_FA`: ctrl + raddr + atomic + data(8) (ds 4).
        FetchAdd = 4,
        /// `MLX5_OPCODE_ATOMIC_CS`: ctrl + raddr + atomic + data(8) (ds 4).
        CompareSwap = 5,
    }
}

impl WqeOp {
    /// Every operation.
    pub const ALL: [WqeOp; 6] = [
        WqeOp::Nop,
        WqeOp::Write,
        WqeOp::WriteImm,
        WqeOp::Read,
        WqeOp::FetchAdd,
        WqeOp::CompareSwap,
    ];

    /// The `MLX5_OPCODE_*` byte.
    pub const fn opcode(self) -> u8 {
        match self {
            WqeOp::Nop => OPCODE_NOP,
            WqeOp::Write => OPCODE_RDMA_WRITE,
            WqeOp::WriteImm => OPCODE_RDMA_WRITE_IMM,
            WqeOp::Read => OPCODE_RDMA_READ,
            WqeOp::FetchAdd => OPCODE_ATOMIC_FA,
            WqeOp::CompareSwap => OPCODE_ATOMIC_CS,
        }
    }

    /// WQE size in 16-byte units.
    pub const fn ds(self) -> u8 {
        match self {
            WqeOp::Nop => 1,
            WqeOp::Write | WqeOp::WriteImm | WqeOp::Read => 3,
            WqeOp::FetchAdd | WqeOp::CompareSwap => 4,
        }
    }

    /// The name `wqe_dump` uses (`nop`, `write`, `write-imm`, `read`,
    /// `fetch-add`, `cas`).
    pub const fn name(self) -> &'static str {
        match self {
            WqeOp::Nop => "nop",
            WqeOp::Write => "write",
            WqeOp::WriteImm => "write-imm",
            WqeOp::Read => "read",
            WqeOp::FetchAdd => "fetch-add",
            WqeOp::CompareSwap => "cas",
        }
    }
}

/// `WqeRequest::flags`: ask for a CQE.
pub const FLAG_SIGNALED: u16 = 1;
/// `WqeRequest::flags`: fence.
pub const FLAG_FENCE: u16 = 2;
/// `WqeRequest::flags`: solicited event.
pub const FLAG_SOLICITED: u16 = 4;

/// One work request, as kernels read it from device memory (72 bytes, no
/// padding; same layout on host and device).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct WqeRequest {
    /// Remote address.
    pub raddr: u64,
    /// Local address (atomics: the 8-byte buffer that receives the old value).
    pub laddr: u64,
    /// Addend of a fetch-add.
    pub add: u64,
    /// Compare value of a compare-swap.
    pub compare: u64,
    /// Swap value of a compare-swap.
    pub swap: u64,
    /// [`WqeOp`] as `u32`.
    pub op: u32,
    /// QP number (24 bits; higher bits are dropped).
    pub qpn: u32,
    /// Remote key.
    pub rkey: u32,
    /// Local key.
    pub lkey: u32,
    /// Bytes (write/read; atomics always move 8).
    pub len: u32,
    /// Immediate of a write-with-immediate, as the receiver reads it.
    pub imm: u32,
    /// Producer index of the WQE (mod 2^16).
    pub wqe_index: u16,
    /// [`FLAG_SIGNALED`] | [`FLAG_FENCE`] | [`FLAG_SOLICITED`].
    pub flags: u16,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<WqeRequest>() == 72);
const _: () = assert!(core::mem::align_of::<WqeRequest>() == 8);

impl WqeRequest {
    /// The operation, if `op` holds a valid code.
    pub const fn op(&self) -> Option<WqeOp> {
        WqeOp::from_u32(self.op)
    }

    /// `fm_ce_se` of the ctrl segment.
    pub const fn fm_ce_se(&self) -> u8 {
        let mut v = 0;
        if self.flags & FLAG_FENCE != 0 {
            v |= WQE_CTRL_FENCE;
        }
        if self.flags & FLAG_SIGNALED != 0 {
            v |= WQE_CTRL_CQ_UPDATE;
        }
        if self.flags & FLAG_SOLICITED != 0 {
            v |= WQE_CTRL_SOLICITED;
        }
        v
    }

    /// The request as nine `u64`s (for a `DeviceBuffer<[u64; 9]>`).
    pub const fn to_raw(&self) -> [u64; 9] {
        // SAFETY: repr(C), 72 bytes, align 8, no padding (asserted above).
        unsafe { core::mem::transmute::<WqeRequest, [u64; 9]>(*self) }
    }

    /// Host encoder: the WQE's 64 bytes (the bytes past `ds × 16` are zero).
    pub const fn to_bytes(&self) -> [u8; SEND_WQE_BB] {
        crate::layout::words_to_bytes(&wqe_words(self))
    }

    /// The meaningful length of [`Self::to_bytes`]: `ds × 16` (16 for an
    /// unknown op code).
    pub const fn wqe_len(&self) -> usize {
        match self.op() {
            Some(op) => op.ds() as usize * 16,
            None => 16,
        }
    }
}

/// The ctrl segment of `r` for operation `op`.
#[inline(always)]
pub const fn ctrl_seg(r: &WqeRequest, op: WqeOp) -> CtrlSeg {
    CtrlSeg {
        opcode: op.opcode(),
        wqe_index: r.wqe_index,
        opmod: 0,
        ds: op.ds(),
        qpn: r.qpn,
        signature: 0,
        dci_stream_channel_id: 0,
        fm_ce_se: r.fm_ce_se(),
        imm: if matches!(op, WqeOp::WriteImm) { r.imm } else { 0 },
    }
}

/// Device builder: the 64-byte basic block of `r` as 16 memory words,
/// assembled in registers. An unknown op code builds a NOP.
#[inline(always)]
pub const fn wqe_words(r: &WqeRequest) -> [u32; 16] {
    let op = match r.op() {
        Some(op) => op,
        None => WqeOp::Nop,
    };
    let c = ctrl_seg(r, op).to_words();
    let z = [0u32; 4];
    let (s1, s2, s3) = match op {
        WqeOp::Nop => (z, z, z),
        WqeOp::Write | WqeOp::WriteImm | WqeOp::Read => (
            RaddrSeg {
                raddr: r.raddr,
                rkey: r.rkey,
            }
            .to_words(),
            DataSeg {
                byte_count: r.len,
                lkey: r.lkey,
                addr: r.laddr,
            }
            .to_words(),
            z,
        ),
        WqeOp::FetchAdd | WqeOp::CompareSwap => {
            let atomic = if matches!(op, WqeOp::FetchAdd) {
                AtomicSeg {
                    swap_add: r.add,
                    compare: 0,
                }
            } else {
                AtomicSeg {
                    swap_add: r.swap,
                    compare: r.compare,
                }
            };
            (
                RaddrSeg {
                    raddr: r.raddr,
                    rkey: r.rkey,
                }
                .to_words(),
                atomic.to_words(),
                DataSeg {
                    byte_count: 8,
                    lkey: r.lkey,
                    addr: r.laddr,
                }
                .to_words(),
            )
        }
    };
    [
        c[0], c[1], c[2], c[3], s1[0], s1[1], s1[2], s1[3], s2[0], s2[1], s2[2], s2[3], s3[0], s3[1], s3[2], s3[3],
    ]
}

/// Stores a basic block with four 16-byte stores.
///
/// # Safety
/// `slot` is valid for 64 bytes of writes and 16-byte aligned.
#[inline(always)]
pub unsafe fn store_wqe(slot: *mut u32, w: &[u32; 16]) {
    // SAFETY: the caller's contract.
    unsafe {
        crate::ptx::st_v4_u32(slot, [w[0], w[1], w[2], w[3]]);
        crate::ptx::st_v4_u32(slot.add(4), [w[4], w[5], w[6], w[7]]);
        crate::ptx::st_v4_u32(slot.add(8), [w[8], w[9], w[10], w[11]]);
        crate::ptx::st_v4_u32(slot.add(12), [w[12], w[13], w[14], w[15]]);
    }
}

/// Builds `r` in registers and writes it at `slot` (one lane, one WQE: four
/// 16-byte stores; the bytes past `ds × 16` are written as zero). Returns the
/// first 8 bytes of the ctrl segment (the doorbell value) as a `u64` whose
/// little-endian bytes are those 8 bytes.
///
/// # Safety
/// `slot` is valid for 64 bytes of writes and 16-byte aligned.
#[inline(always)]
pub unsafe fn write_wqe(slot: *mut u32, r: &WqeRequest) -> u64 {
    let w = wqe_words(r);
    // SAFETY: the caller's contract.
    unsafe { store_wqe(slot, &w) };
    w[0] as u64 | (w[1] as u64) << 32
}

/// Writes a NOP WQE (ds 1). See [`write_wqe`].
///
/// # Safety
/// As for [`write_wqe`].
#[inline(always)]
pub unsafe fn write_nop_wqe(slot: *mut u32, wqe_index: u16, qpn: u32, flags: u16) -> u64 {
    let r = WqeRequest {
        op: WqeOp::Nop as u32,
        wqe_index,
        qpn,
        flags,
        ..ZERO
    };
    // SAFETY: the caller's contract.
    unsafe { write_wqe(slot, &r) }
}

/// The remote and local sides of a one-sided transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Transfer {
    /// Remote address.
    pub raddr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Local address.
    pub laddr: u64,
    /// Local key.
    pub lkey: u32,
    /// Bytes.
    pub len: u32,
}

const ZERO: WqeRequest = WqeRequest {
    raddr: 0,
    laddr: 0,
    add: 0,
    compare: 0,
    swap: 0,
    op: 0,
    qpn: 0,
    rkey: 0,
    lkey: 0,
    len: 0,
    imm: 0,
    wqe_index: 0,
    flags: 0,
    reserved: 0,
};

#[inline(always)]
const fn transfer_request(op: WqeOp, wqe_index: u16, qpn: u32, t: &Transfer, flags: u16) -> WqeRequest {
    WqeRequest {
        op: op as u32,
        wqe_index,
        qpn,
        raddr: t.raddr,
        rkey: t.rkey,
        laddr: t.laddr,
        lkey: t.lkey,
        len: t.len,
        flags,
        ..ZERO
    }
}

/// Writes an RDMA write WQE (ds 3). See [`write_wqe`].
///
/// # Safety
/// As for [`write_wqe`].
#[inline(always)]
pub unsafe fn write_rdma_write_wqe(slot: *mut u32, wqe_index: u16, qpn: u32, t: &Transfer, flags: u16) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { write_wqe(slot, &transfer_request(WqeOp::Write, wqe_index, qpn, t, flags)) }
}

/// Writes an RDMA write-with-immediate WQE (ds 3); `imm` as the receiver
/// reads it. See [`write_wqe`].
///
/// # Safety
/// As for [`write_wqe`].
#[inline(always)]
pub unsafe fn write_rdma_write_imm_wqe(slot: *mut u32, wqe_index: u16, qpn: u32, t: &Transfer, imm: u32, flags: u16) -> u64 {
    let r = WqeRequest {
        imm,
        ..transfer_request(WqeOp::WriteImm, wqe_index, qpn, t, flags)
    };
    // SAFETY: the caller's contract.
    unsafe { write_wqe(slot, &r) }
}

/// Writes an RDMA read WQE (ds 3). See [`write_wqe`].
///
/// # Safety
/// As for [`write_wqe`].
#[inline(always)]
pub unsafe fn write_rdma_read_wqe(slot: *mut u32, wqe_index: u16, qpn: u32, t: &Transfer, flags: u16) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { write_wqe(slot, &transfer_request(WqeOp::Read, wqe_index, qpn, t, flags)) }
}

/// Writes an atomic fetch-and-add WQE (ds 4): the old remote value lands in
/// the 8 bytes at `t.laddr` (`t.len` is ignored). See [`write_wqe`].
///
/// # Safety
/// As for [`write_wqe`].
#[inline(always)]
pub unsafe fn write_atomic_fetch_add_wqe(slot: *mut u32, wqe_index: u16, qpn: u32, t: &Transfer, add: u64, flags: u16) -> u64 {
    let r = WqeRequest {
        add,
        ..transfer_request(WqeOp::FetchAdd, wqe_index, qpn, t, flags)
    };
    // SAFETY: the caller's contract.
    unsafe { write_wqe(slot, &r) }
}

/// Writes an atomic compare-and-swap WQE (ds 4). See
/// [`write_atomic_fetch_add_wqe`].
///
/// # Safety
/// As for [`write_wqe`].
#[inline(always)]
pub unsafe fn write_atomic_cas_wqe(slot: *mut u32, wqe_index: u16, qpn: u32, t: &Transfer, compare: u64, swap: u64, flags: u16) -> u64 {
    let r = WqeRequest {
        compare,
        swap,
        ..transfer_request(WqeOp::CompareSwap, wqe_index, qpn, t, flags)
    };
    // SAFETY: the caller's contract.
    unsafe { write_wqe(slot, &r) }
}
