//! Kernels used by doorbell's own tests (behaviour that must match on the GPU
//! and the CPU emulator).

use crate::{kernel, ptx, sync};

/// Error codes written to `status`.
pub const STATUS_OK: u32 = 1;
/// The consumer block gave up waiting for the producer's flag.
pub const STATUS_TIMEOUT: u32 = 2;

/// Two blocks: block 0 reduces `input` with warp shuffles and a block
/// barrier and publishes the sum behind a release flag; block 1 waits for the
/// flag with acquire and writes `out[t] = sum + t * ballot_popcount`.
///
/// Launch with grid (2,1,1) and block (64,1,1) or any multiple of 32 up to
/// 1024; `input` holds `blockDim.x` values, `out` as many, `scratch` 33 words
/// (warp sums + the sum), `flag` and `status` one word each, zeroed.
#[kernel]
pub unsafe fn shuffle_barrier_flag(input: *const u32, out: *mut u32, scratch: *mut u32, flag: *mut u32, status: *mut u32) {
    let t = ptx::thread_idx_x();
    let lane = ptx::lane_id();
    let warp = t / 32;
    let nwarps = ptx::block_dim_x().div_ceil(32);
    if ptx::block_idx_x() == 0 {
        // SAFETY: `input` has blockDim.x elements.
        let mut v = unsafe { *input.add(t as usize) };
        let mut d = 16;
        while d > 0 {
            v = v.wrapping_add(ptx::shfl_sync_down_u32(ptx::FULL_MASK, v, d));
            d /= 2;
        }
        if lane == 0 {
            // SAFETY: scratch has 33 words.
            unsafe { *scratch.add(warp as usize) = v };
        }
        ptx::sync_threads();
        if t == 0 {
            let mut s = 0u32;
            for w in 0..nwarps {
                // SAFETY: as above.
                s = s.wrapping_add(unsafe { *scratch.add(w as usize) });
            }
            // SAFETY: as above; flag is a zeroed word.
            unsafe {
                *scratch.add(32) = s;
                sync::publish_gpu(flag, 1);
            }
        }
    } else {
        if t == 0 {
            // SAFETY: flag and status are valid words.
            let ok = unsafe { sync::wait_ge_gpu(flag, 1, sync::DEFAULT_BUDGET_NS) };
            unsafe { *status = if ok.is_ok() { STATUS_OK } else { STATUS_TIMEOUT } };
        }
        ptx::sync_threads();
        // Ballot: lanes whose index is odd.
        let odd = ptx::vote_sync_ballot(ptx::FULL_MASK, lane & 1 == 1).count_ones();
        // SAFETY: the sum was published before the flag we acquired, and
        // `sync_threads` ordered thread 0's acquire before this read.
        let sum = unsafe { ptx::ld_relaxed_gpu_u32(scratch.add(32)) };
        // SAFETY: out has blockDim.x elements.
        unsafe { *out.add(t as usize) = sum.wrapping_add(t.wrapping_mul(odd)) };
    }
}
