//! The soft NIC's kernel: the GPU-resident engine ([`crate::engine::resident`])
//! as one `#[kernel]`, built into this crate's own PTX (the soft NIC is a
//! device of its own, not a library kernel) and, on the host, into the
//! function the CPU emulator runs.

use doorbell_kernels::kernel;

use crate::engine::resident::{run_block, EngineCtl};

/// One block per port, until `ctl.stop` is set: thread 0 runs the
/// engine's control (`poll_port`), the block moves the payload. Launch
/// with one block of 32..=1024 threads and
/// [`crate::engine::resident::SHARED_BYTES`] of dynamic shared memory, on
/// a stream of its own (it never ends by itself).
#[kernel]
pub unsafe fn softnic_engine(ctl: *mut EngineCtl) {
    // SAFETY: the launcher's contract (see `run_block`).
    unsafe { run_block(ctl) }
}

/// [`softnic_engine()`] for blocks of up to 1024 threads (the launcher takes
/// it for more than [`ENGINE_THREADS_MID`]): ptxas keeps it within 64
/// registers (`launch_bounds`), where [`softnic_engine()`] uses about 255
/// and so fits 256 threads. More threads keep more of a block copy's loads
/// in flight; the control thread's code spills to local memory.
#[kernel(launch_bounds(threads = 1024, min_blocks = 1))]
pub unsafe fn softnic_engine_wide(ctl: *mut EngineCtl) {
    // SAFETY: the launcher's contract (see `run_block`).
    unsafe { run_block(ctl) }
}

/// [`softnic_engine()`] for blocks of up to 512 threads (the launcher takes
/// it for more than [`ENGINE_THREADS`], up to [`ENGINE_THREADS_MID`]):
/// ptxas keeps it within 128 registers, where the control thread's code
/// does not spill (it does within [`softnic_engine_wide()`]'s 64).
#[kernel(launch_bounds(threads = 512, min_blocks = 1))]
pub unsafe fn softnic_engine_mid(ctl: *mut EngineCtl) {
    // SAFETY: the launcher's contract (see `run_block`).
    unsafe { run_block(ctl) }
}

/// Most threads of a [`softnic_engine()`] block; more take
/// [`softnic_engine_mid()`].
pub const ENGINE_THREADS: u32 = 256;

/// Most threads of a [`softnic_engine_mid()`] block; more take
/// [`softnic_engine_wide()`].
pub const ENGINE_THREADS_MID: u32 = 512;
