//! Plain descriptions of a launch: its shape ([`LaunchConfig`]) and what
//! the driver reports of a compiled kernel ([`FunctionAttributes`]).
//!
//! Nothing here touches a device, so the backends take these types and the
//! public stream and module types hand them on, all importing this module.

use crate::error::{Error, Result};

/// Grid and block shape of a launch, plus dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
    /// Programmatic dependent launch: the kernel may start while the
    /// previous kernel on the stream is still running (its launch overlaps
    /// that kernel's tail; on a GPU, `cuLaunchKernelEx` with programmatic
    /// stream serialization). The kernel must call
    /// `doorbell_kernels::ptx::wait_prior_grids` before it touches anything
    /// the previous kernel reads or writes; the previous kernel lets it
    /// start early with `ptx::allow_dependent_launch` (else it starts when
    /// that kernel ends, as usual). Every block of the kernel calls
    /// `wait_prior_grids` first, unconditionally: a block that ended
    /// without waiting could end before the kernel before it, and the
    /// stream's order would be lost. Ignored on the emulator, whose
    /// launches never overlap.
    pub overlap_previous: bool,
}

impl LaunchConfig {
    /// A 1-D launch of `blocks` × `threads`.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (threads, 1, 1),
            shared_mem_bytes: 0,
            overlap_previous: false,
        }
    }

    /// With `bytes` of dynamic shared memory per block.
    pub fn with_shared_mem(mut self, bytes: u32) -> Self {
        self.shared_mem_bytes = bytes;
        self
    }

    /// Launched to overlap the previous kernel on the stream (see
    /// [`LaunchConfig::overlap_previous`]).
    pub fn with_overlap_previous(mut self, on: bool) -> Self {
        self.overlap_previous = on;
        self
    }

    /// Checks the shape against CUDA's limits (every dimension non-zero;
    /// grid x below 2^31, grid y and z at most 65535; block x and y at most
    /// 1024, block z at most 64, at most 1024 threads per block) and the
    /// kernel's launch bounds. Products are computed without overflow, so a
    /// shape whose thread count wraps 64 bits is refused, not run.
    pub(crate) fn validate(&self, kernel: &'static str, max_threads: u32) -> Result<()> {
        let (g, b) = (self.grid, self.block);
        let invalid = |reason: String| Error::InvalidLaunch { kernel, reason };
        if [g.0, g.1, g.2, b.0, b.1, b.2].contains(&0) {
            return Err(invalid(format!("grid {g:?} / block {b:?} has a zero dimension")));
        }
        if g.0 > GRID_X_MAX || g.1 > GRID_YZ_MAX || g.2 > GRID_YZ_MAX {
            return Err(invalid(format!(
                "grid {g:?} exceeds the device limits (x at most {GRID_X_MAX}, y and z at most {GRID_YZ_MAX})"
            )));
        }
        if b.0 > 1024 || b.1 > 1024 || b.2 > 64 {
            return Err(invalid(format!(
                "block {b:?} exceeds the device limits (x and y at most 1024, z at most 64)"
            )));
        }
        let threads = u128::from(b.0) * u128::from(b.1) * u128::from(b.2);
        if threads > 1024 {
            return Err(invalid(format!("block {b:?} has {threads} threads per block; at most 1024")));
        }
        if max_threads > 0 && threads > u128::from(max_threads) {
            return Err(invalid(format!(
                "block {b:?} has {threads} threads per block; its #[kernel(launch_bounds(threads = {max_threads}))] allows at most {max_threads}"
            )));
        }
        Ok(())
    }
}

/// CUDA's largest grid x dimension (2^31 - 1).
const GRID_X_MAX: u32 = i32::MAX as u32;
/// CUDA's largest grid y and z dimension.
const GRID_YZ_MAX: u32 = 65535;

/// What the driver says about a compiled kernel.
#[derive(Clone, Copy, Debug)]
pub struct FunctionAttributes {
    /// Registers per thread.
    pub registers: i32,
    /// Local memory per thread (spills, stack), bytes.
    pub local_bytes: i32,
    /// Largest block the kernel can run with.
    pub max_threads_per_block: i32,
}
