//! A pipeline's rings in one collective call: [`Communicator::rings`].
//!
//! `pipeline!` and [`Pipe::run`] need, on every rank, a ring set per
//! producer/consumer pair of blocks (slots and *full*/*empty* counters), a
//! control word per block, the producers' outboxes and a launch counter per
//! block — six symmetric allocations with strides that must agree. This
//! makes them all, checks the shape, and hands the kernel one [`Pipe`].

use doorbell_kernels::pipeline::{Pipe, RingSet};

use super::{Communicator, SymBuffer};
use crate::error::{Error, Result};
use crate::memory::DeviceCopy;

/// The shape of a pipeline's rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingShape {
    /// Slots per ring (at least 1; 2 or more let a producer run ahead).
    pub stages: u32,
    /// Elements per chunk (at least 1).
    pub chunk: u64,
    /// Producer/consumer pairs of blocks (at least 1): the grid is
    /// `2 * pairs` blocks.
    pub pairs: u32,
}

/// A pipeline's symmetric allocations ([`Communicator::rings`]); the kernel
/// takes [`Rings::pipe`]. Their space comes back once every rank has
/// dropped them. Each block counts its launches, a failed one not: after a
/// failure the ranks met on ([`Communicator::failures_met`]) their counts
/// may differ between ranks, so [`Rings::pipe`] refuses and the rings must
/// be made again. (A launch captured in a CUDA graph before the failure is
/// not checked when it is replayed: capture again too.)
pub struct Rings<'c, E: DeviceCopy> {
    shape: RingShape,
    /// [`Communicator::failures_met`] when they were made.
    failures_at: u64,
    rings: RingSet,
    ctl: SymBuffer<'c, u32>,
    launches: SymBuffer<'c, u64>,
    outbox: SymBuffer<'c, E>,
    // Held for their lifetime: the ring set points into them.
    _slots: SymBuffer<'c, u8>,
    _counters: SymBuffer<'c, u64>,
}

impl<E: DeviceCopy> Rings<'_, E> {
    /// The kernel argument; an error when the ranks met on a failure since
    /// the rings were made (their launch counts may differ between ranks,
    /// and a launch could take a stale chunk): make new rings.
    pub fn pipe(&self) -> Result<Pipe<E>> {
        self.ctl
            .comm
            .check_no_failure_since(self.failures_at, "this pipeline's rings (`Communicator::rings`)")?;
        Ok(Pipe {
            rings: self.rings,
            ctl: self.ctl.as_mut_ptr(),
            launches: self.launches.as_mut_ptr(),
            outbox: self.outbox.as_mut_ptr(),
            chunk: self.shape.chunk,
            pairs: self.shape.pairs,
            failures: self.failures_at as u32,
        })
    }
    /// Blocks of the grid a launch must have: `2 * pairs`.
    pub fn blocks(&self) -> u32 {
        2 * self.shape.pairs
    }
    /// The shape it was made with.
    pub fn shape(&self) -> RingShape {
        self.shape
    }
    /// Launches this rank's blocks have completed without error (the
    /// lowest block counter): the next launch numbers its chunks from it.
    pub fn launches(&self) -> Result<u64> {
        Ok(self.launches.to_host()?.into_iter().min().unwrap_or(0))
    }
}

impl Communicator {
    /// Collective: the rings of a pipeline of `E` elements with `shape`,
    /// between every pair of ranks (any rank may send to any other), for
    /// [`Pipe::run`] or `pipeline!`. Every rank calls it with the same
    /// shape; it returns once every rank's counters are zeroed. Every block
    /// of a launch's grid (`2 * pairs`) must be resident at once.
    pub fn rings<E: DeviceCopy>(&self, shape: RingShape) -> Result<Rings<'_, E>> {
        let RingShape { stages, chunk, pairs } = shape;
        let world = self.world_size() as u32;
        let bad = |why: String| Err(Error::comm(format!("rings of {shape:?}: {why}")));
        if stages == 0 || chunk == 0 || pairs == 0 {
            return bad("stages, chunk and pairs must each be at least 1".into());
        }
        if world > 64 {
            return bad(format!("a ring set spans at most 64 ranks, this world has {world}"));
        }
        let blocks = pairs
            .checked_mul(2)
            .ok_or_else(|| Error::comm(format!("{pairs} pairs overflow a grid")))?;
        // Slots 16-byte aligned keep the copies vectorised.
        let slot_bytes = chunk
            .checked_mul(std::mem::size_of::<E>() as u64)
            .and_then(|b| b.checked_next_multiple_of(16))
            .ok_or_else(|| Error::comm(format!("a chunk of {chunk} elements overflows a slot")))?;
        let slot_area = RingSet::slot_area(world, stages, slot_bytes)
            .checked_mul(pairs as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| Error::comm(format!("{pairs} pairs of {world} rings of {stages} × {slot_bytes} bytes overflow")))?;
        let words = (RingSet::counter_words(world, stages) * pairs as u64) as usize;
        let outbox_len = usize::try_from(chunk * pairs as u64).map_err(|_| Error::comm("the outboxes overflow".to_string()))?;
        // Before the collective allocations: a failure met while they are
        // made makes these rings refuse too.
        let failures_at = self.failures_met();
        let slots = self.alloc::<u8>(slot_area)?;
        let counters = self.alloc::<u64>(2 * words)?;
        let ctl = self.alloc::<u32>(blocks as usize)?;
        let launches = self.alloc::<u64>(blocks as usize)?;
        let outbox = self.alloc::<E>(outbox_len)?;
        let rings = RingSet {
            slots: slots.as_ptr() as u64,
            slot_bytes,
            peer_stride: stages as u64 * slot_bytes,
            full: counters.as_ptr() as u64,
            // `RingSet::nth` steps both counter arrays by one set's words.
            empty: counters.as_ptr() as u64 + 8 * words as u64,
            stages,
            peers: world,
        };
        Ok(Rings {
            shape,
            failures_at,
            rings,
            ctl,
            launches,
            outbox,
            _slots: slots,
            _counters: counters,
        })
    }
}
