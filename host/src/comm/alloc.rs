//! Symmetric allocation: [`Communicator::alloc`] and what it reuses.
//!
//! Every rank holds the same map of live allocations, since every rank
//! makes the same allocations in the same order and frees the same ones at
//! the same moment. Dropping a [`SymBuffer`] frees nothing by itself (its
//! peers may still put into their copies): the rank notes the drop, and
//! the next allocation, collective as it is, frees what every rank has
//! dropped — after each rank's device has finished the work it was given,
//! so no kernel still reads or writes a range handed out again. A range is
//! handed out first-fit, 256-byte aligned, and zeroed on every rank before
//! the allocation returns.

use std::collections::{BTreeMap, BTreeSet};

use doorbell_kernels::heap::HEAP_RESERVED;

use super::{stuck, Communicator, SymBuffer};
use crate::error::{Error, Result};
use crate::memory::DeviceCopy;

/// Alignment of every symmetric allocation.
const ALIGN: u64 = 256;

/// The heap's live allocations (the same on every rank) and the ones this
/// rank has dropped that are not freed yet.
#[derive(Debug)]
pub(super) struct HeapMap {
    /// End of the heap (bytes from its base).
    end: u64,
    /// Live allocations by index: `[offset, end)`.
    live: BTreeMap<u64, (u64, u64)>,
    /// Indices this rank dropped, still live until every rank has.
    dropped: BTreeSet<u64>,
    /// The next allocation's index.
    next: u64,
}

impl HeapMap {
    /// An empty map of a heap of `end` bytes (user ranges start at
    /// [`HEAP_RESERVED`]).
    pub(super) fn new(end: u64) -> HeapMap {
        HeapMap {
            end,
            live: BTreeMap::new(),
            dropped: BTreeSet::new(),
            next: 0,
        }
    }

    /// The next allocation's index.
    pub(super) fn next_index(&self) -> u64 {
        self.next
    }

    /// Notes that this rank dropped allocation `index`.
    pub(super) fn drop_local(&mut self, index: u64) {
        if self.live.contains_key(&index) {
            self.dropped.insert(index);
        }
    }

    /// This rank's dropped indices, as the bytes the ranks exchange.
    pub(super) fn dropped_bytes(&self) -> Vec<u8> {
        self.dropped.iter().flat_map(|i| i.to_le_bytes()).collect()
    }

    /// The indices every rank's `lists` (as [`Self::dropped_bytes`] made
    /// them) holds: the allocations to free.
    pub(super) fn dropped_everywhere(lists: &[Vec<u8>]) -> BTreeSet<u64> {
        let parse = |b: &Vec<u8>| -> BTreeSet<u64> {
            b.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect()
        };
        let mut sets = lists.iter().map(parse);
        let first = sets.next().unwrap_or_default();
        sets.fold(first, |acc, s| acc.intersection(&s).copied().collect())
    }

    /// Frees the allocations `indices`.
    pub(super) fn free(&mut self, indices: &BTreeSet<u64>) {
        for i in indices {
            self.live.remove(i);
            self.dropped.remove(i);
        }
    }

    /// Where `bytes` would go: the first aligned range after
    /// [`HEAP_RESERVED`] that no live allocation overlaps; else `Err` with
    /// the largest free range's bytes.
    pub(super) fn place(&self, bytes: u64) -> std::result::Result<u64, u64> {
        let mut ranges: Vec<(u64, u64)> = self.live.values().copied().collect();
        ranges.sort_unstable();
        let mut at = HEAP_RESERVED;
        let mut largest = 0u64;
        for (lo, hi) in ranges.into_iter().chain([(self.end, self.end)]) {
            let start = at.div_ceil(ALIGN) * ALIGN;
            let room = lo.saturating_sub(start);
            if start <= lo && bytes <= room {
                return Ok(start);
            }
            largest = largest.max(room);
            at = at.max(hi);
        }
        Err(largest)
    }

    /// Records allocation `[offset, offset + bytes)` under the next index;
    /// returns that index.
    pub(super) fn insert(&mut self, offset: u64, bytes: u64) -> u64 {
        let index = self.next;
        self.live.insert(index, (offset, offset + bytes));
        self.next += 1;
        index
    }
}

impl Communicator {
    /// Collective: `len` elements of `T` at the same heap offset on every rank,
    /// zeroed. Every rank must make the same allocations in the same order.
    /// Returns once every rank's copy is zeroed, so puts and signals into
    /// peers may start at once.
    ///
    /// Space of buffers every rank has dropped since is taken back first:
    /// each rank then waits for the streams made through its device handle
    /// (dropped ones with work queued included) before the space is handed
    /// out again, so such an allocation also waits for this rank's kernels
    /// to end. Drop a buffer on every rank once no kernel uses it, and the
    /// next allocation may reuse it. Puts a NIC transport (IBGDA, the CPU
    /// proxy) still holds are not waited for: quiet them first.
    pub fn alloc<T: DeviceCopy>(&self, len: usize) -> Result<SymBuffer<'_, T>> {
        let bytes = u64::try_from(len)
            .ok()
            .and_then(|n| n.checked_mul(std::mem::size_of::<T>() as u64))
            .ok_or_else(|| {
                Error::comm(format!(
                    "{len} elements of {} bytes overflow a symmetric allocation",
                    std::mem::size_of::<T>()
                ))
            })?;
        let _step = self.status.enter(stuck::Step::Collective("alloc"));
        let mut map = self.heap_map.lock().unwrap_or_else(|e| e.into_inner());
        let index = map.next_index();
        let mut desc = Vec::new();
        desc.extend_from_slice(&index.to_le_bytes());
        desc.extend_from_slice(&bytes.to_le_bytes());
        desc.extend_from_slice(&(std::mem::align_of::<T>() as u64).to_le_bytes());
        self.world
            .check_same(&format!("symmetric allocation #{index} (bytes, alignment)"), &desc)?;
        // What every rank has dropped is freed, once no rank's device
        // still works on it.
        let lists = self.world.all_gather_bytes(&map.dropped_bytes())?;
        let freed = HeapMap::dropped_everywhere(&lists);
        if !freed.is_empty() {
            self.device.wait_idle();
            self.world.barrier()?;
            map.free(&freed);
        }
        let offset = map.place(bytes).map_err(|largest| Error::HeapExhausted {
            requested: bytes,
            free: largest,
            heap: self.heap_len - HEAP_RESERVED,
        })?;
        let index = map.insert(offset, bytes);
        drop(map);
        let buf = SymBuffer {
            comm: self,
            offset,
            len,
            index,
            _t: std::marker::PhantomData,
        };
        // Zero it (the heap may hold data of an earlier run of this process,
        // or of a freed buffer), then wait until every rank has zeroed its
        // copy: a rank that returned first could otherwise put into a peer's
        // copy that the peer zeroes afterwards. A rank whose zeroing fails
        // aborts the world, so the others' barrier fails at once naming it.
        // SAFETY: inside this rank's heap.
        if let Err(e) = unsafe { self.device.write_raw(self.heap_base + offset, &vec![0u8; bytes as usize]) } {
            self.abort(&format!("zeroing symmetric allocation #{index} failed: {e}"));
            return Err(e);
        }
        self.world.barrier()?;
        Ok(buf)
    }

    /// Notes that this rank dropped allocation `index` ([`SymBuffer`]'s drop).
    pub(super) fn sym_dropped(&self, index: u64) {
        self.heap_map.lock().unwrap_or_else(|e| e.into_inner()).drop_local(index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn ranges_go_first_fit_aligned_and_come_back_only_when_every_rank_dropped_them() {
        let mut m = HeapMap::new(HEAP_RESERVED + 4 * MIB);
        let a = m.place(100).unwrap();
        assert_eq!(a, HEAP_RESERVED);
        let ia = m.insert(a, 100);
        let b = m.place(MIB).unwrap();
        assert_eq!(b, HEAP_RESERVED + ALIGN, "after a, aligned");
        let ib = m.insert(b, MIB);
        let c = m.place(MIB).unwrap();
        let ic = m.insert(c, MIB);
        assert_eq!(c, b + MIB);
        // Too big for what is left (just under 2 MiB past c).
        let left = HEAP_RESERVED + 4 * MIB - (c + MIB);
        assert_eq!(m.place(3 * MIB), Err(left));
        // b dropped on one rank only: still live.
        m.drop_local(ib);
        let other = HeapMap::new(HEAP_RESERVED + 4 * MIB);
        let freed = HeapMap::dropped_everywhere(&[m.dropped_bytes(), other.dropped_bytes()]);
        assert!(freed.is_empty());
        // On both: b's range is free again and the next MiB goes there.
        let freed = HeapMap::dropped_everywhere(&[m.dropped_bytes(), m.dropped_bytes()]);
        assert_eq!(freed, BTreeSet::from([ib]));
        m.free(&freed);
        assert_eq!(m.place(MIB), Ok(b));
        assert_eq!(m.place(MIB + 1), Ok(c + MIB), "b's gap is one MiB");
        // The largest free range when nothing fits: b's gap + nothing more.
        assert_eq!(m.place(4 * MIB), Err(left.max(MIB)));
        m.drop_local(ia);
        m.drop_local(ic);
        m.drop_local(ia);
        let freed = HeapMap::dropped_everywhere(&[m.dropped_bytes()]);
        assert_eq!(freed, BTreeSet::from([ia, ic]));
        m.free(&freed);
        assert_eq!(m.place(4 * MIB), Ok(HEAP_RESERVED), "the whole heap is free");
        // An index already freed (or never made) is not noted.
        m.drop_local(ib);
        m.drop_local(99);
        assert!(m.dropped_bytes().is_empty());
    }

    #[test]
    fn empty_allocations_take_no_room_and_need_no_space() {
        let mut m = HeapMap::new(HEAP_RESERVED + ALIGN);
        let z = m.place(0).unwrap();
        m.insert(z, 0);
        assert_eq!(m.place(ALIGN), Ok(HEAP_RESERVED));
        let full = m.insert(HEAP_RESERVED, ALIGN);
        assert_eq!(m.place(1), Err(0));
        assert_eq!(m.place(0), Ok(HEAP_RESERVED), "an empty one needs no room");
        m.drop_local(full);
        m.free(&HeapMap::dropped_everywhere(&[m.dropped_bytes()]));
        assert_eq!(m.place(ALIGN), Ok(HEAP_RESERVED));
    }
}
