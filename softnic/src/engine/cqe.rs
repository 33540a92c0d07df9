//! Writing CQE64s with the `#[descriptor]` encoders of
//! `doorbell_kernels::mlx5::segments` ([`Cqe64`], [`ErrCqe`]).
//!
//! The CQE for producer count `pi` goes to entry `pi % entries` with the
//! owner bit `(pi / entries) & 1` — the bit `poll_cq` expects
//! ([`expected_owner`]). It is published by a release store of its last
//! word (`op_own`).

use doorbell_kernels::mlx5::cq::expected_owner;
use doorbell_kernels::mlx5::{Cqe64, ErrCqe, CQE_INVALID, CQE_REQ_ERR, CQE_RESP_ERR, CQE_SIZE};

use super::mem;
use super::tables::CqEntry;

/// Whether the CQ has room for one more CQE. Without a consumer doorbell
/// record the engine cannot know and assumes room. A full CQ holds the
/// completion back (hardware would overrun the CQ and raise an
/// asynchronous error instead).
///
/// # Safety
/// `cq.dbrec`, if not null, is valid.
pub unsafe fn has_room(cq: &CqEntry) -> bool {
    if cq.valid == 0 {
        return false;
    }
    if cq.dbrec.is_null() {
        return true;
    }
    // SAFETY: the caller's contract.
    let ci = unsafe { mem::load_dbrec(cq.dbrec) } & 0xff_ffff;
    used(cq, ci) < cq.entries
}

/// [`has_room`] for the CQ's own port's engine: the consumer's doorbell
/// record is read (an acquire load at `sys` scope: a memory round trip per
/// WQE otherwise) only when the consumer index read last says the CQ is
/// full, and that index is kept in [`CqEntry::ci_seen`]. The index only
/// grows, so a stale one under-reports room, never over-reports it.
/// Another port's engine (a responder's CQ) uses [`has_room`], which
/// writes nothing.
///
/// # Safety
/// As for [`has_room`].
pub unsafe fn has_room_cached(cq: &mut CqEntry) -> bool {
    if cq.valid == 0 {
        return false;
    }
    if cq.dbrec.is_null() {
        return true;
    }
    // `ci_seen` is kept at the producer counter's full width, so CQEs other
    // ports push meanwhile (responder completions) count until 2^32 of
    // them, not 2^24.
    if cq.pi.wrapping_sub(cq.ci_seen) < cq.entries {
        return true;
    }
    // SAFETY: the caller's contract.
    let ci = unsafe { mem::load_dbrec(cq.dbrec) } & 0xff_ffff;
    let used = used(cq, ci);
    cq.ci_seen = cq.pi.wrapping_sub(used);
    used < cq.entries
}

/// CQEs written and not consumed, for consumer index `ci` (mod 2^24).
fn used(cq: &CqEntry, ci: u32) -> u32 {
    (cq.pi & 0xff_ffff).wrapping_sub(ci) & 0xff_ffff
}

/// The owner bit of the next CQE this CQ gets.
#[inline(always)]
pub fn next_owner(cq: &CqEntry) -> bool {
    expected_owner(cq.pi, cq.entries) != 0
}

/// Writes the CQE image `w` (its owner bit already set from
/// [`next_owner`]) at the producer position, advances it, and fires the
/// armed event if this completion qualifies (`solicited` or an error for a
/// CQ armed for solicited completions only). Returns false, writing
/// nothing, when the CQ is not valid. The CQE's last word is a release at
/// `scope` ([`mem::store_cqe`]).
///
/// # Safety
/// `cq.ring` holds `cq.entries` CQEs, 64-byte aligned.
pub unsafe fn push(cq: &mut CqEntry, w: &[u32; 16], solicited_or_error: bool, scope: mem::Scope) -> bool {
    // SAFETY: the caller's contract.
    let Some(at) = (unsafe { claim(cq) }) else {
        return false;
    };
    // SAFETY: a slot of the ring (the caller's contract).
    unsafe { mem::store_cqe(at, w, scope) };
    notify(cq, solicited_or_error);
    true
}

/// The first half of [`push`]: the slot the next CQE goes to, the
/// producer position advanced past it (so room and owner bits count it);
/// `None` when the CQ is not valid. The caller stores the CQE there, then
/// calls [`notify`].
///
/// # Safety
/// As for [`push`].
#[inline(always)]
pub unsafe fn claim(cq: &mut CqEntry) -> Option<*mut u8> {
    if cq.valid == 0 || cq.ring.is_null() || cq.entries == 0 {
        return None;
    }
    let slot = (cq.pi & (cq.entries - 1)) as usize;
    cq.pi = cq.pi.wrapping_add(1);
    // SAFETY: the slot is inside the ring (the caller's contract).
    Some(unsafe { cq.ring.add(slot * CQE_SIZE) })
}

/// The second half of [`push`], after the CQE is stored: fires the armed
/// event if this completion qualifies.
#[inline(always)]
pub fn notify(cq: &mut CqEntry, solicited_or_error: bool) {
    if cq.armed == 1 || (cq.armed == 2 && solicited_or_error) {
        cq.armed = 0;
        cq.events = cq.events.wrapping_add(1);
    }
}

/// What a success CQE reports; the rest of its 64 bytes is zero but the
/// CQ's owner bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Success {
    /// The CQE opcode (`MLX5_CQE_REQ`, or a responder's receive opcode).
    pub opcode: u8,
    /// The QP number.
    pub qpn: u32,
    /// The WQE counter: the SQ index (requester) or RQ index (responder).
    pub wqe_counter: u16,
    /// Bytes moved.
    pub byte_cnt: u32,
    /// The immediate (or invalidated key), big-endian as on the wire.
    pub imm: u32,
    /// The requester's WQE opcode (`sop_drop`); 0 for a responder.
    pub sop: u8,
    /// The solicited-event flag.
    pub solicited: bool,
    /// The timestamp, ns.
    pub time_ns: u64,
}

/// A success CQE image.
pub fn success(cq: &CqEntry, c: &Success) -> [u32; 16] {
    Cqe64 {
        srqn_uidx: 0,
        imm_inval_pkey: c.imm,
        byte_cnt: c.byte_cnt,
        timestamp: c.time_ns,
        qpn: c.qpn & 0xff_ffff,
        sop_drop: c.sop,
        wqe_counter: c.wqe_counter,
        signature: 0,
        owner: next_owner(cq),
        op_own_flags: c.solicited as u8,
        opcode: c.opcode,
    }
    .to_words()
}

/// An error CQE image (`MLX5_CQE_REQ_ERR` when `responder` is false, else
/// `MLX5_CQE_RESP_ERR`).
pub fn error(cq: &CqEntry, responder: bool, syndrome: u8, vendor: u8, qpn: u32, wqe_opcode: u8, wqe_counter: u16) -> [u32; 16] {
    ErrCqe {
        srqn: 0,
        vendor_err_synd: vendor,
        syndrome,
        qpn: qpn & 0xff_ffff,
        wqe_opcode,
        wqe_counter,
        signature: 0,
        owner: next_owner(cq),
        opcode: if responder { CQE_RESP_ERR } else { CQE_REQ_ERR },
    }
    .to_words()
}

/// The words of an invalid CQE (`op_own = MLX5_CQE_INVALID << 4`, owner
/// 0): what every entry of a fresh CQ ring holds.
pub fn invalid_cqe_words() -> [u32; 16] {
    Cqe64 {
        opcode: CQE_INVALID,
        ..Cqe64::default()
    }
    .to_words()
}

/// Fills a fresh CQ ring with invalid CQEs (`op_own = MLX5_CQE_INVALID <<
/// 4`, owner 0), as rdma-core does at CQ creation, so no entry looks ready
/// before the engine writes it.
///
/// # Safety
/// `ring` holds `entries` CQEs, 64-byte aligned.
pub unsafe fn init_ring(ring: *mut u8, entries: u32) {
    let w = invalid_cqe_words();
    for i in 0..entries as usize {
        // SAFETY: inside the ring (the caller's contract).
        unsafe { mem::store_cqe(ring.add(i * CQE_SIZE), &w, mem::Scope::Sys) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cached check reads the consumer's record only when the index it
    /// holds says "full", and never reports room the record does not give.
    #[test]
    fn the_cached_room_check_reads_the_record_only_when_full() {
        let mut ring = vec![0u8; 4 * CQE_SIZE + 64];
        let ring_ptr = ring.as_mut_ptr().wrapping_add(ring.as_ptr().align_offset(64));
        let mut record = [0u32; 2];
        // Written below through this pointer only, as a consumer would.
        let dbrec = record.as_mut_ptr();
        let mut cq = CqEntry {
            ring: ring_ptr,
            dbrec,
            entries: 4,
            cqn: 1,
            valid: 1,
            ..CqEntry::EMPTY
        };
        let img = invalid_cqe_words();
        for _ in 0..4 {
            // SAFETY: `dbrec` and the 4-entry ring live through the test.
            assert!(unsafe { has_room_cached(&mut cq) });
            // SAFETY: as above.
            assert!(unsafe { push(&mut cq, &img, false, mem::Scope::Sys) });
        }
        // Full by the record (consumer index 0) and by the cache.
        // SAFETY: as above.
        assert!(!unsafe { has_room_cached(&mut cq) } && !unsafe { has_room(&cq) });
        // The consumer takes three: the record is read again.
        // SAFETY: `record` outlives the test.
        unsafe { dbrec.write_volatile(3u32.to_be()) };
        // SAFETY: as above.
        assert!(unsafe { has_room_cached(&mut cq) });
        assert_eq!(cq.ci_seen, 3);
        // While the cached index leaves room, the record is not read: a
        // record that went backwards (impossible for a real consumer) is
        // not seen — the proof that no load was made.
        // SAFETY: as above.
        unsafe { dbrec.write_volatile(0) };
        // SAFETY: as above.
        assert!(unsafe { has_room_cached(&mut cq) });
        // SAFETY: as above.
        assert!(!unsafe { has_room(&cq) }, "the uncached check reads the record");
    }
}
