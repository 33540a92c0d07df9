//! The exchange's grid: every block of every rank's grid must be resident
//! at once (its kernels meet at grid barriers), so the grid is sized from
//! the SMs a rank may use and fitted to how many blocks of the loaded
//! kernels an SM holds.

use doorbell_kernels::coll::embedding::SHARED_BYTES;

use crate::comm::Communicator;
use crate::stream::LaunchConfig;

/// Most blocks per SM the fused kernels' grids ask for: more would only add
/// warps that wait at the same barriers.
pub const MAX_BLOCKS_PER_SM: u32 = 2;

/// The phases of [`super::EmbeddingError::Timeout`] that are grid barriers
/// (the kernels' `grid_sync_or_report` steps): a timeout there means a
/// block of the grid did not run, not that a peer was slow.
pub const GRID_BARRIER_PHASES: [u32; 5] = [0, 3, 4, 6, 8];

/// What bounds how many blocks one SM holds at once (sm_90: 65 536
/// registers, 2048 threads, 32 blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmLimits {
    /// 32-bit registers per SM.
    pub registers: u32,
    /// Threads per SM.
    pub threads: u32,
    /// Blocks per SM.
    pub blocks: u32,
}

impl SmLimits {
    /// An H100 / H200 SM (compute capability 9.0).
    pub const SM_90: SmLimits = SmLimits {
        registers: 65536,
        threads: 2048,
        blocks: 32,
    };

    /// The limits of `comm`'s GPU as the driver reports them (`None` on the
    /// emulator, where every thread of a launch runs at once).
    pub fn of(comm: &Communicator) -> Option<SmLimits> {
        use cudarc::driver::sys::CUdevice_attribute::*;
        let ctx = comm.device().as_cuda()?;
        let get = |a| ctx.attribute(a).ok().map(|v| v.max(0) as u32);
        Some(SmLimits {
            registers: get(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?,
            threads: get(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
            blocks: get(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)?,
        })
    }
}

/// Blocks of `threads` threads of a kernel using `registers` registers per
/// thread that one SM holds at once: registers are allocated per warp in
/// units of 256 (every architecture since sm_50), so a warp takes
/// `ceil(32 × registers / 256) × 256` of them. (The fused kernels' 16 bytes
/// of shared memory never bound it.) 0: such a block does not fit at all.
pub fn resident_blocks_per_sm(sm: &SmLimits, registers: u32, threads: u32) -> u32 {
    let warps = threads.div_ceil(32).max(1);
    let per_warp = (32 * registers.max(1)).div_ceil(256) * 256;
    let by_registers = sm.registers / per_warp / warps;
    let by_threads = sm.threads / (32 * warps);
    by_registers.min(by_threads).min(sm.blocks)
}

/// The grid [`launch_config_for`] asks for, fitted to what the kernels it
/// launches allow: `requested` assumes [`MAX_BLOCKS_PER_SM`] blocks per SM;
/// when a kernel's registers leave room for only `per_sm` (fewer), the grid
/// shrinks by the same factor, rounded down, so it stays within the SMs the
/// request was sized for (every rank's grid, when ranks share a GPU). Err
/// when even the fitted grid cannot be resident on `sms` SMs (a grid larger
/// than the request's sizing allows).
pub fn fit_grid(requested: u32, per_sm: u32, sms: u32) -> std::result::Result<u32, String> {
    if per_sm == 0 {
        return Err("a block of the exchange's kernels does not fit on one SM (registers or threads); use fewer threads per block".into());
    }
    let blocks = if per_sm < MAX_BLOCKS_PER_SM {
        (requested * per_sm / MAX_BLOCKS_PER_SM).max(1)
    } else {
        requested
    };
    if blocks > per_sm * sms {
        return Err(format!(
            "{blocks} blocks cannot all be resident at once ({per_sm} per SM, {sms} SMs) and the exchange's grid barriers need them to be; size the grid with launch_config_for"
        ));
    }
    Ok(blocks)
}

/// The blocks per rank [`launch_config_for`] asks for on a GPU of `sms` SMs
/// shared by `ranks_per_gpu` ranks: [`MAX_BLOCKS_PER_SM`] per SM of the
/// rank's share, the soft NIC engines' SMs (`engine_sms` per rank: 0 when
/// the transport does not go through it) left out; at most 256.
pub fn grid_request(sms: u32, ranks_per_gpu: u32, engine_sms: u32) -> u32 {
    let rpg = ranks_per_gpu.max(1);
    let free = sms.saturating_sub(rpg * engine_sms).max(1);
    (MAX_BLOCKS_PER_SM * free / rpg).clamp(1, 256)
}

/// Launch shape of the exchange's kernels on a device: the same on every
/// rank, small enough that every rank's grid is resident at once (beside
/// the soft NIC engines' SMs, [`Communicator::engine_sms_per_rank`] per
/// rank of the GPU, when the transport goes through it: `soft_nic`), at [`MAX_BLOCKS_PER_SM`] blocks per SM;
/// on the emulator 2 blocks of 64 threads.
///
/// **Residency is a property of the kernel, not only of the SM count**:
/// [`super::EmbeddingExchange::with_options`] fits the grid to the
/// registers of the kernels it loads ([`fit_grid`]). Over IBGDA and routed
/// transports the forward uses ~180 registers a thread, so an SM holds one
/// block of 256 threads, not two; a grid of two blocks per SM then starts
/// only half its blocks, which wait at the first grid barrier for blocks
/// that cannot start until they leave (a stall of the whole wait budget).
pub fn launch_config_for(comm: &Communicator, ranks_per_gpu: u32, soft_nic: bool) -> LaunchConfig {
    let dev = comm.device();
    if dev.is_gpu() {
        let sms = dev.multiprocessor_count() as u32;
        let engine = if soft_nic { comm.engine_sms_per_rank() } else { 0 };
        LaunchConfig::linear(grid_request(sms, ranks_per_gpu, engine), 256)
    } else {
        LaunchConfig::linear(2, 64)
    }
    .with_shared_mem(SHARED_BYTES)
}

/// [`launch_config_for`] a transport of loads and stores (P2P).
pub fn launch_config(comm: &Communicator, ranks_per_gpu: u32) -> LaunchConfig {
    launch_config_for(comm, ranks_per_gpu, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grid_the_kernels_cannot_hold_is_refused_and_a_fitting_one_kept() {
        assert_eq!(fit_grid(256, 1, 132), Ok(128));
        assert_eq!(fit_grid(256, 2, 132), Ok(256));
        assert!(fit_grid(300, 2, 100).unwrap_err().contains("launch_config_for"));
        assert!(fit_grid(8, 0, 132).is_err());
        assert_eq!(grid_request(132, 1, 1), 256);
        assert_eq!(grid_request(132, 2, 4), 124);
        assert_eq!(grid_request(132, 4, 0), 66);
        assert_eq!(resident_blocks_per_sm(&SmLimits::SM_90, 182, 256), 1);
        assert_eq!(resident_blocks_per_sm(&SmLimits::SM_90, 80, 256), 3);
    }
}
