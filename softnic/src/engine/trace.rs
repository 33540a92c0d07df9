//! The engine's events in the device trace (`doorbell_kernels::trace`):
//! a WQE fetched from a send queue, executed, its CQE written. They go to
//! the trace memory of the port's rank, found through the region that
//! holds the rank's symmetric heap ([`Port::trace_mr`]): its header's
//! trace word, the one the rank's kernels read, is 0 while the rank does
//! not trace.
//!
//! The hooks are `doorbell_kernels::trace_hook!` statements: compiled into
//! the engine kernel only with `doorbell-kernels`' `trace` feature (a build
//! with `DOORBELL_TRACE_KERNELS=1`), always on the emulator's engines.

pub use doorbell_kernels::trace::What;
use doorbell_kernels::trace::{record_engine, TRACE_OFFSET};

use super::tables::Port;

/// The trace memory of a port's rank: 0 when it does not trace, or the
/// port names no heap region.
#[inline(always)]
pub fn rings(port: &Port) -> u64 {
    let Some(mr) = (port.trace_mr as usize).checked_sub(1).and_then(|i| port.mrs.get(i)) else {
        return 0;
    };
    if mr.valid == 0 || mr.len < TRACE_OFFSET + 8 {
        return 0;
    }
    // SAFETY: the word lies inside a registered region (checked above),
    // which the registration's contract keeps valid; the host writes it
    // only while no kernel of the rank runs.
    unsafe { core::ptr::read_volatile((mr.addr + TRACE_OFFSET) as *const u64) }
}

/// Records `what` when `trace` (from [`rings`]) is not 0.
#[inline(always)]
pub fn event(trace: u64, what: What, peer: u32, arg: u64) {
    if trace != 0 {
        record_engine(trace, what, peer, arg);
    }
}
