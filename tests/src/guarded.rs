//! A symmetric buffer between two canary buffers, for tests that check
//! nothing outside a transfer's target is written.

use doorbell::comm::{Communicator, SymBuffer};

/// The byte every canary holds.
pub const CANARY: u8 = 0xa5;

/// Bytes of canary on each side of the target.
const GUARD: usize = 4096;

/// A symmetric buffer of `n` bytes between two canary buffers, every byte
/// of all three set: the target and its neighbours.
pub struct Guarded<'c> {
    before: SymBuffer<'c, u8>,
    /// The target.
    pub buf: SymBuffer<'c, u8>,
    after: SymBuffer<'c, u8>,
}

impl<'c> Guarded<'c> {
    /// Allocates the three buffers on `comm` (every rank, in this order)
    /// and fills the canaries.
    pub fn new(comm: &'c Communicator, n: usize) -> doorbell::Result<Guarded<'c>> {
        let g = Guarded {
            before: comm.alloc::<u8>(GUARD)?,
            buf: comm.alloc::<u8>(n)?,
            after: comm.alloc::<u8>(GUARD)?,
        };
        g.before.copy_from_host(&[CANARY; GUARD])?;
        g.after.copy_from_host(&[CANARY; GUARD])?;
        Ok(g)
    }

    /// Whether every canary byte still holds [`CANARY`].
    pub fn canaries_intact(&self) -> doorbell::Result<bool> {
        Ok(self
            .before
            .to_host()?
            .iter()
            .chain(self.after.to_host()?.iter())
            .all(|&b| b == CANARY))
    }
}
