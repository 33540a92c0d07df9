//! Polling the send CQ: owner-bit phase, opcode, `wqe_counter`, error
//! syndromes; every wait bounded.
//!
//! CQE `i` of the ring holds consumer index `ci` when `i == ci % cq_size`; it
//! is ready for software when its opcode is not `MLX5_CQE_INVALID` and its
//! owner bit equals the pass parity `(ci / cq_size) & 1` (the NIC flips the
//! bit it writes on each pass). The poller reads the last word of the CQE
//! (`wqe_counter`, `signature`, `op_own`) with `ld.acquire.sys`, and only
//! after seeing it ready reads the rest.

use super::queue::QpHandle;
use super::segments::{Cqe64, ErrCqe};
use super::*;
use crate::ptx;

pub use super::wire::CqeSyndrome;

/// A successful completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The `wqe_counter` it reports (every WQE up to it is done).
    pub wqe_counter: u16,
    /// The consumer index it was found at.
    pub cq_index: u32,
    /// `byte_cnt`.
    pub byte_cnt: u32,
    /// QP number.
    pub qpn: u32,
}

/// Why [`poll_cq`] did not return a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqError {
    /// The budget ran out waiting for the CQE at `cq_index` while waiting for
    /// `wqe_counter`: its `op_own` byte was `seen_op_own`, the owner bit
    /// expected was `expected_owner`.
    Timeout {
        /// The WQE whose completion was awaited (its 16-bit counter).
        wqe_counter: u16,
        /// The CQ's consumer index that was polled.
        cq_index: u32,
        /// The owner bit a CQE of this pass carries.
        expected_owner: u8,
        /// The CQE's `op_own` byte as last read.
        seen_op_own: u8,
    },
    /// The NIC reported a failed WQE (`struct mlx5_err_cqe`): `opcode` is
    /// `MLX5_CQE_REQ_ERR` or `MLX5_CQE_RESP_ERR`.
    Failed {
        /// The CQE's opcode (`MLX5_CQE_REQ_ERR` or `MLX5_CQE_RESP_ERR`).
        opcode: u8,
        /// Why the WQE failed.
        syndrome: CqeSyndrome,
        /// The vendor's own syndrome byte.
        vendor_syndrome: u8,
        /// The failed WQE's 16-bit counter.
        wqe_counter: u16,
        /// The failed WQE's opcode.
        wqe_opcode: u8,
        /// The QP the WQE was posted on.
        qpn: u32,
        /// The CQ's consumer index of this CQE.
        cq_index: u32,
    },
    /// A CQE with an opcode a send CQ should not hold.
    UnexpectedOpcode {
        /// The CQE's opcode.
        opcode: u8,
        /// The WQE counter the CQE names.
        wqe_counter: u16,
        /// The CQ's consumer index of this CQE.
        cq_index: u32,
    },
}

/// What the CQE at consumer index `ci` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqeState {
    /// Not written for this pass yet.
    Empty {
        /// The owner bit a CQE of this pass carries.
        expected_owner: u8,
        /// The CQE's `op_own` byte as read.
        op_own: u8,
    },
    /// A success completion.
    Done(Completion),
    /// An error or unexpected CQE.
    Error(CqError),
}

/// The owner bit a CQE at consumer index `ci` has once it is ready.
#[inline(always)]
pub const fn expected_owner(ci: u32, cq_size: u32) -> u8 {
    (ci & cq_size != 0) as u8
}

/// `op_own` from the CQE's last memory word (bytes 60..64).
#[inline(always)]
pub const fn op_own_of(last_word: u32) -> u8 {
    (last_word >> 24) as u8
}

/// Whether `op_own` marks the CQE ready at consumer index `ci`.
#[inline(always)]
pub const fn cqe_ready(op_own: u8, ci: u32, cq_size: u32) -> bool {
    op_own >> 4 != CQE_INVALID && (op_own & CQE_OWNER_MASK) == expected_owner(ci, cq_size)
}

/// Decodes a CQE image (its 16 memory words) found at consumer index `ci`.
pub const fn classify_cqe(w: &[u32; 16], ci: u32, cq_size: u32) -> CqeState {
    let op_own = op_own_of(w[15]);
    if !cqe_ready(op_own, ci, cq_size) {
        return CqeState::Empty {
            expected_owner: expected_owner(ci, cq_size),
            op_own,
        };
    }
    let opcode = op_own >> 4;
    if opcode == CQE_REQ_ERR || opcode == CQE_RESP_ERR {
        let e = ErrCqe::from_words(w);
        return CqeState::Error(CqError::Failed {
            opcode,
            syndrome: CqeSyndrome::from_u8(e.syndrome),
            vendor_syndrome: e.vendor_err_synd,
            wqe_counter: e.wqe_counter,
            wqe_opcode: e.wqe_opcode,
            qpn: e.qpn,
            cq_index: ci,
        });
    }
    let c = Cqe64::from_words(w);
    if opcode != CQE_REQ {
        return CqeState::Error(CqError::UnexpectedOpcode {
            opcode,
            wqe_counter: c.wqe_counter,
            cq_index: ci,
        });
    }
    CqeState::Done(Completion {
        wqe_counter: c.wqe_counter,
        cq_index: ci,
        byte_cnt: c.byte_cnt,
        qpn: c.qpn,
    })
}

/// True when `seen` is `target` or a later WQE (mod 2^16, within half the
/// counter space): a requester CQE reports every WQE up to its counter.
#[inline(always)]
pub const fn counter_reached(seen: u16, target: u16) -> bool {
    seen.wrapping_sub(target) < 0x8000
}

/// Polls the send CQ until a completion at or past `wqe_counter` (consuming
/// every CQE on the way), an error CQE, or `budget_ns` without progress.
/// Each consumed CQE advances the consumer index and the CQ doorbell record
/// (`st.release.sys`, BE32 of the index mod 2^24). An error CQE is consumed
/// and reported, never treated as "not done yet".
///
/// Called by one thread: the CQ's only consumer.
///
/// # Safety
/// `qp.cq` holds `qp.cq_size` CQEs (a power of 2), 16-byte aligned;
/// `qp.cq_consumer` and `qp.cq_dbr` are valid.
#[inline(always)]
pub unsafe fn poll_cq(qp: &QpHandle, wqe_counter: u16, budget_ns: u64) -> Result<Completion, CqError> {
    // SAFETY: the caller's contract; this thread owns the consumer index.
    let mut ci = unsafe { core::ptr::read_volatile(qp.cq_consumer) };
    let mut spin = crate::sync::Spin::new(budget_ns);
    loop {
        // SAFETY: the entry is inside the ring.
        let cqe = unsafe { qp.cq.add(((ci & (qp.cq_size - 1)) as usize) * 16) };
        // SAFETY: as above. Acquire: the rest of the CQE is read after it.
        let last = unsafe { ptx::ld_acquire_sys_u32(cqe.add(15)) };
        let op_own = op_own_of(last);
        if !cqe_ready(op_own, ci, qp.cq_size) {
            if !spin.again() {
                return Err(CqError::Timeout {
                    wqe_counter,
                    cq_index: ci,
                    expected_owner: expected_owner(ci, qp.cq_size),
                    seen_op_own: op_own,
                });
            }
            continue;
        }
        let mut w = [0u32; 16];
        // SAFETY: as above; bytes 32..60 hold every field decoded here.
        unsafe {
            let a = ptx::ld_v4_u32(cqe.add(8));
            let b = ptx::ld_v4_u32(cqe.add(12));
            w[8] = a[0];
            w[9] = a[1];
            w[10] = a[2];
            w[11] = a[3];
            w[12] = b[0];
            w[13] = b[1];
            w[14] = b[2];
        }
        w[15] = last;
        let state = classify_cqe(&w, ci, qp.cq_size);
        ci = ci.wrapping_add(1);
        // SAFETY: the caller's contract.
        unsafe {
            core::ptr::write_volatile(qp.cq_consumer, ci);
            ptx::st_release_sys_u32(qp.cq_dbr, (ci & 0xff_ffff).swap_bytes());
        }
        match state {
            CqeState::Done(c) if counter_reached(c.wqe_counter, wqe_counter) => return Ok(c),
            CqeState::Done(_) => {
                // An earlier batch's completion: keep going, with a fresh budget.
                spin.restart();
            }
            CqeState::Error(e) => return Err(e),
            CqeState::Empty { .. } => {}
        }
    }
}

/// Result words of the test kernels: `[kind, a, b, c, d, e, f, g]`.
pub const POLL_RESULT_WORDS: usize = 8;

/// Encodes a [`poll_cq`] result as 8 words (kind 1 = completion, 2 =
/// timeout, 3 = failed, 4 = unexpected opcode; 0 = not run).
pub const fn encode_poll_result(r: &Result<Completion, CqError>) -> [u32; POLL_RESULT_WORDS] {
    match *r {
        Ok(c) => [1, c.wqe_counter as u32, c.cq_index, c.byte_cnt, c.qpn, 0, 0, 0],
        Err(CqError::Timeout {
            wqe_counter,
            cq_index,
            expected_owner,
            seen_op_own,
        }) => [2, wqe_counter as u32, cq_index, expected_owner as u32, seen_op_own as u32, 0, 0, 0],
        Err(CqError::Failed {
            opcode,
            syndrome,
            vendor_syndrome,
            wqe_counter,
            wqe_opcode,
            qpn,
            cq_index,
        }) => [
            3,
            wqe_counter as u32,
            cq_index,
            opcode as u32,
            syndrome.as_u8() as u32,
            vendor_syndrome as u32,
            wqe_opcode as u32,
            qpn,
        ],
        Err(CqError::UnexpectedOpcode {
            opcode,
            wqe_counter,
            cq_index,
        }) => [4, wqe_counter as u32, cq_index, opcode as u32, 0, 0, 0, 0],
    }
}

/// Inverse of [`encode_poll_result`]; `None` for kind 0 or an unknown kind.
pub const fn decode_poll_result(w: &[u32; POLL_RESULT_WORDS]) -> Option<Result<Completion, CqError>> {
    Some(match w[0] {
        1 => Ok(Completion {
            wqe_counter: w[1] as u16,
            cq_index: w[2],
            byte_cnt: w[3],
            qpn: w[4],
        }),
        2 => Err(CqError::Timeout {
            wqe_counter: w[1] as u16,
            cq_index: w[2],
            expected_owner: w[3] as u8,
            seen_op_own: w[4] as u8,
        }),
        3 => Err(CqError::Failed {
            wqe_counter: w[1] as u16,
            cq_index: w[2],
            opcode: w[3] as u8,
            syndrome: CqeSyndrome::from_u8(w[4] as u8),
            vendor_syndrome: w[5] as u8,
            wqe_opcode: w[6] as u8,
            qpn: w[7],
        }),
        4 => Err(CqError::UnexpectedOpcode {
            wqe_counter: w[1] as u16,
            cq_index: w[2],
            opcode: w[3] as u8,
        }),
        _ => return None,
    })
}
