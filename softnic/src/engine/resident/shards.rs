//! The engine's blocks as one block's control thread sees them: its own
//! control block and block 0's, the start-up and exit hand-shakes between
//! them, and the clock they share.

use doorbell_kernels::ptx;

use super::super::control::EngineCtl;

/// The engine's blocks as a block's control thread sees them.
#[derive(Clone, Copy)]
pub(super) struct Shards {
    /// Block 0's control block: the stop word, the configuration, the
    /// state the host reads.
    pub(super) main: *mut EngineCtl,
    /// This block's index.
    pub(super) me: usize,
    /// The blocks.
    pub(super) n: usize,
}

impl Shards {
    /// This block's control block.
    pub(super) fn own(&self) -> *mut EngineCtl {
        self.main.wrapping_add(self.me)
    }

    /// The `%globaltimer` reading every block of the port counts its engine
    /// time from: block 0's, taken once every block runs and published in
    /// its control block; the others wait for it (or for the stop word, and
    /// then take their own: they are about to exit).
    ///
    /// # Safety
    /// As for [`run_block`](super::run_block).
    pub(super) unsafe fn start_clock(&self) -> u64 {
        // SAFETY (whole function): the caller's contract: block 0's
        // control block, written by block 0 only.
        unsafe {
            let at = &raw mut (*self.main).clock_start_ns;
            if self.me == 0 {
                let t0 = ptx::globaltimer_ns().max(1);
                ptx::st_release_sys_u64(at, t0);
                return t0;
            }
            loop {
                let t0 = ptx::ld_acquire_sys_u64(at);
                if t0 != 0 {
                    return t0;
                }
                if ptx::ld_relaxed_sys_u32(&raw const (*self.main).stop) != 0 {
                    return ptx::globaltimer_ns();
                }
                ptx::nanosleep(100);
            }
        }
    }

    /// Block 0 waits until every other block's state is `want` (`st.release`
    /// by that block, read with acquire), or, when `stop_too`, until the
    /// stop word is set. Other blocks return at once.
    ///
    /// # Safety
    /// As for [`run_block`](super::run_block).
    pub(super) unsafe fn wait_others(&self, want: u32, stop_too: bool) {
        if self.me != 0 {
            return;
        }
        for b in 1..self.n {
            // SAFETY: the caller's contract: a control block per block.
            unsafe {
                let at = &raw const (*self.main.add(b)).state;
                while ptx::ld_acquire_sys_u32(at) != want {
                    if stop_too && ptx::ld_relaxed_sys_u32(&raw const (*self.main).stop) != 0 {
                        return;
                    }
                    ptx::nanosleep(1_000);
                }
            }
        }
    }
}
