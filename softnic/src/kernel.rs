//! The soft NIC's kernel: the GPU-resident engine ([`crate::engine::resident`])
//! as one `#[kernel]`, built into this crate's own PTX (the soft NIC is a
//! device of its own, not a library kernel) and, on the host, into the
//! function the CPU emulator runs.

use doorbell_kernels::kernel;

use crate::engine::resident::{run_block, EngineCtl};

// The engine is one body (`run_block`) built as three entries that differ
// only in the block size they are built for: ptxas fits each entry's
// registers to its largest block (`launch_bounds`), and the host launcher
// takes the smallest entry that holds the block it was asked for. The
// number in each name is that largest block.

/// The engine for blocks of up to [`ENGINE_256_THREADS`] threads: one
/// block per port, until `ctl.stop` is set; thread 0 runs the engine's
/// control (`poll_port`), the block moves the payload. Without a bound,
/// ptxas gives it about 255 registers per thread, so 256 threads fit an SM.
/// Launch with one block of 32..=256 threads and
/// [`crate::engine::resident::SHARED_BYTES`] of dynamic shared memory
/// ([`crate::engine::resident::SHARED_BYTES_BULK`] for bulk copies), on
/// a stream of its own (it never ends by itself).
#[kernel]
pub unsafe fn softnic_engine_256(ctl: *mut EngineCtl) {
    // SAFETY: the launcher's contract (see `run_block`).
    unsafe { run_block(ctl) }
}

/// The engine for blocks of up to 512 threads (the launcher takes it for
/// more than [`ENGINE_256_THREADS`], up to [`ENGINE_512_THREADS`]): ptxas
/// keeps it within 128 registers, where the control thread's code does not
/// spill (it does within [`softnic_engine_1024()`]'s 64). Launched as
/// [`softnic_engine_256()`].
#[kernel(launch_bounds(threads = 512, min_blocks = 1))]
pub unsafe fn softnic_engine_512(ctl: *mut EngineCtl) {
    // SAFETY: the launcher's contract (see `run_block`).
    unsafe { run_block(ctl) }
}

/// The engine for blocks of up to 1024 threads (the launcher takes it for
/// more than [`ENGINE_512_THREADS`]): ptxas keeps it within 64 registers.
/// More threads keep more of a block copy's loads in flight; the control
/// thread's code spills to local memory. Launched as
/// [`softnic_engine_256()`].
#[kernel(launch_bounds(threads = 1024, min_blocks = 1))]
pub unsafe fn softnic_engine_1024(ctl: *mut EngineCtl) {
    // SAFETY: the launcher's contract (see `run_block`).
    unsafe { run_block(ctl) }
}

/// Most threads of a [`softnic_engine_256()`] block; more take
/// [`softnic_engine_512()`].
pub const ENGINE_256_THREADS: u32 = 256;

/// Most threads of a [`softnic_engine_512()`] block; more take
/// [`softnic_engine_1024()`].
pub const ENGINE_512_THREADS: u32 = 512;
