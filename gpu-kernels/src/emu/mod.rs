//! CPU emulator: runs a kernel's threads as OS threads on the host.
//!
//! Every thread of a launch runs concurrently (communication kernels spin on
//! each other, so running blocks one after another would deadlock). Block
//! barriers, warp shuffles/votes and `bar.warp.sync` are real rendezvous
//! between those threads; atomics and fences use `std::sync::atomic` with the
//! same or stronger semantics; spin-waits yield the OS thread.
//!
//! Failure is never a hang: a panicking thread (a failed `assert!`, a `trap`)
//! aborts the whole launch — threads waiting at a barrier or spinning in
//! [`spin_yield`] unwind — and [`run`] returns [`EmuError::Panicked`] naming
//! the thread. A barrier that some threads never reach (divergent
//! `sync_threads` or shuffle) fails after [`barrier_timeout`] with
//! [`EmuError::Panicked`] describing the stuck barrier.
//!
//! Where the GPU would fault, the emulator fails the launch too (an error
//! naming the block and thread): a vector load or store that is not 16-byte
//! aligned, an atomic or ordered access not aligned to its size
//! ([`check_align`]). Warp collectives honour their member mask: lanes
//! outside it are not waited for, and a lane in it that never arrives is an
//! error after [`barrier_timeout`].
//!
//! Limits: every memory scope behaves as `sys`.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

mod barrier;
mod warp;
use crate::env_vars as env;
use barrier::Barrier;
use warp::Warp;

/// A launch's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmuLaunch {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
}

/// Why an emulated launch failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EmuError {
    /// The launch shape is invalid (zero dims, too many threads per block).
    InvalidLaunch(String),
    /// The launch needs more OS threads than the emulator allows.
    TooManyThreads {
        /// Threads the launch needs.
        threads: u64,
        /// Threads the emulator allows (`DOORBELL_EMU_MAX_THREADS`).
        limit: u64,
    },
    /// The OS refused to create a thread.
    Spawn(String),
    /// A kernel thread panicked (or hit a barrier timeout).
    Panicked {
        /// The block index of the thread.
        block: [u32; 3],
        /// The thread index within its block.
        thread: [u32; 3],
        /// The panic's message.
        message: String,
    },
    /// An emulator variable (`DOORBELL_EMU_*`) holds something unusable.
    BadEnv(env::EnvError),
}

impl std::fmt::Display for EmuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmuError::InvalidLaunch(m) => write!(f, "invalid launch configuration: {m}"),
            EmuError::TooManyThreads { threads, limit } => write!(
                f,
                "the CPU emulator runs every GPU thread as an OS thread; this launch needs {threads}, more than the limit {limit} \
                 (use fewer blocks with a grid-stride loop, or raise DOORBELL_EMU_MAX_THREADS)"
            ),
            EmuError::Spawn(m) => write!(f, "could not start an emulator thread: {m}"),
            EmuError::Panicked { block, thread, message } => write!(
                f,
                "kernel thread (block {block:?}, thread {thread:?}) failed on the CPU emulator: {message}"
            ),
            EmuError::BadEnv(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EmuError {}

/// Per-block state shared by its threads.
pub struct BlockShared {
    barrier: Barrier,
    warps: Vec<Warp>,
    shared_mem: Box<[u128]>,
}

impl BlockShared {
    /// Base of the block's dynamic shared memory.
    pub fn shared_mem_ptr(&self) -> *mut u8 {
        self.shared_mem.as_ptr() as *mut u8
    }

    /// Bytes of the block's dynamic shared memory (the launch's, rounded
    /// up to 16).
    pub fn shared_mem_len(&self) -> usize {
        self.shared_mem.len() * 16
    }
}

/// The calling emulated thread's identity.
pub struct ThreadCtx {
    /// `%tid`
    pub thread_idx: [u32; 3],
    /// `%ntid`
    pub block_dim: [u32; 3],
    /// `%ctaid`
    pub block_idx: [u32; 3],
    /// `%nctaid`
    pub grid_dim: [u32; 3],
    /// `%laneid`
    pub lane: u32,
    warp: u32,
    /// This thread's block.
    pub block: Arc<BlockShared>,
    launch: Arc<LaunchShared>,
}

struct LaunchShared {
    aborted: AtomicBool,
    first_error: Mutex<Option<EmuError>>,
}

/// Payload used to unwind threads of an aborted launch (not reported).
struct Aborted;

thread_local! {
    static CTX: Cell<*const ThreadCtx> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` with the calling thread's context.
///
/// Panics when called outside an emulated launch: device primitives only make
/// sense inside a kernel.
pub fn with_thread<R>(f: impl FnOnce(&ThreadCtx) -> R) -> R {
    let p = CTX.with(|c| c.get());
    assert!(
        !p.is_null(),
        "a doorbell device primitive was called outside a kernel launch; launch the kernel through doorbell (Stream::launch)"
    );
    // SAFETY: set by `run` for the lifetime of the thread's kernel call.
    f(unsafe { &*p })
}

/// True on a thread that runs an emulated kernel.
pub fn in_kernel() -> bool {
    CTX.with(|c| !c.get().is_null())
}

fn check_aborted(t: &ThreadCtx) {
    if t.launch.aborted.load(Ordering::Relaxed) {
        std::panic::resume_unwind(Box::new(Aborted));
    }
}

/// Default of [`barrier_timeout`].
pub const DEFAULT_BARRIER_TIMEOUT: Duration = Duration::from_secs(60);
/// Default of [`max_threads`].
pub const DEFAULT_MAX_THREADS: u64 = 16384;

/// Barrier wait timeout: `DOORBELL_EMU_BARRIER_TIMEOUT_S` (seconds in
/// 0.001..=86400, default 60), read once per process. An unusable value is
/// an error of every launch ([`run`]).
pub fn try_barrier_timeout() -> Result<Duration, env::EnvError> {
    static T: OnceLock<Result<Duration, env::EnvError>> = OnceLock::new();
    T.get_or_init(|| env::secs("DOORBELL_EMU_BARRIER_TIMEOUT_S", DEFAULT_BARRIER_TIMEOUT, 0.001, 86400.0))
        .clone()
}

/// [`try_barrier_timeout`], or the default when the variable is unusable
/// (no launch runs then: [`run`] reports the variable first).
pub fn barrier_timeout() -> Duration {
    try_barrier_timeout().unwrap_or(DEFAULT_BARRIER_TIMEOUT)
}

/// Most OS threads one launch may use: `DOORBELL_EMU_MAX_THREADS` (an
/// integer in 1..=1048576, default 16384), read at every launch.
pub fn max_threads() -> Result<u64, env::EnvError> {
    env::uint("DOORBELL_EMU_MAX_THREADS", DEFAULT_MAX_THREADS, 1, 1 << 20)
}

/// Fails the calling kernel thread, as the GPU would fault, when `p` is not
/// aligned to `align` bytes; `what` names the access (`ld.v4.u32`, ...).
#[inline]
pub fn check_align(p: usize, align: usize, what: &str) {
    if !p.is_multiple_of(align) {
        misaligned(p, align, what)
    }
}

#[cold]
#[inline(never)]
fn misaligned(p: usize, align: usize, what: &str) -> ! {
    panic!("misaligned address {p:#x} for {what}: it must be {align}-byte aligned (the GPU faults with a misaligned address error)")
}

/// `bar.sync 0` for the calling thread.
pub fn block_barrier() {
    with_thread(|t| t.block.barrier.wait(&t.launch.aborted, "sync_threads (block barrier)"));
}

/// `bar.red.or.pred` for the calling thread: a block barrier that returns
/// whether any thread passed `pred` true.
pub fn block_barrier_or(pred: bool) -> bool {
    with_thread(|t| t.block.barrier.wait_or(pred, &t.launch.aborted, "sync_threads_or (block barrier)"))
}

/// The calling lane's part in a warp collective over `mask`.
fn warp_exchange(mask: u32, value: u64, what: &str) -> (u32, warp::GroupResult) {
    with_thread(|t| {
        let w = &t.block.warps[t.warp as usize];
        (t.lane, w.exchange(t.lane, mask, value, &t.launch.aborted, barrier_timeout(), what))
    })
}

/// `bar.warp.sync mask` for the calling thread: waits for the lanes in `mask`.
pub fn warp_barrier(mask: u32) {
    warp_exchange(mask, 0, "sync_warp");
}

/// Shuffle source selection.
#[derive(Clone, Copy, Debug)]
pub enum ShuffleMode {
    /// From lane `n`.
    Idx(u32),
    /// From lane `lane + n`.
    Down(u32),
    /// From lane `lane - n`.
    Up(u32),
    /// From lane `lane ^ n`.
    Xor(u32),
}

/// Warp shuffle of a 32-bit value among the lanes in `mask`. A source lane
/// outside the group (not in `mask`, or past the warp) yields the caller's
/// own value.
pub fn shuffle(mask: u32, value: u32, mode: ShuffleMode) -> u32 {
    let (lane, x) = warp_exchange(mask, value as u64, "warp shuffle");
    let src = match mode {
        ShuffleMode::Idx(n) => Some(n & 31),
        ShuffleMode::Down(n) => lane.checked_add(n).filter(|s| *s < 32),
        ShuffleMode::Up(n) => lane.checked_sub(n),
        ShuffleMode::Xor(n) => Some((lane ^ n) & 31),
    };
    match src {
        Some(s) if x.members & (1 << s) != 0 => x.values[s as usize] as u32,
        _ => value,
    }
}

/// Warp ballot among the lanes in `mask`: bit `i` set when lane `i` took
/// part and passed `pred`.
pub fn ballot(mask: u32, pred: bool) -> u32 {
    let (_, x) = warp_exchange(mask, pred as u64, "warp vote");
    (0..32)
        .filter(|&l| x.members & (1 << l) != 0 && x.values[l] != 0)
        .fold(0u32, |m, l| m | 1 << l)
}

/// Mask of the lanes that exist in the calling thread's warp.
pub fn active_lane_mask() -> u32 {
    with_thread(|t| t.block.warps[t.warp as usize].existing())
}

/// Yield inside a spin-wait; unwinds when the launch was aborted.
pub fn spin_yield() {
    if in_kernel() {
        with_thread(check_aborted);
    }
    std::thread::yield_now();
}

/// Monotonic nanoseconds (the emulator's `%globaltimer`).
pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

fn install_quiet_hook() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // Kernel-thread panics are reported through `run`'s error, and
            // abort unwinds carry no message worth printing.
            if info.payload().downcast_ref::<Aborted>().is_some() || in_kernel() {
                return;
            }
            prev(info)
        }));
    });
}

/// Runs one launch: `body` on every thread of the grid, all concurrently.
/// Returns when every thread has finished.
pub fn run(cfg: EmuLaunch, body: &(dyn Fn() + Sync)) -> Result<(), EmuError> {
    let EmuLaunch {
        grid,
        block,
        shared_mem_bytes,
    } = cfg;
    if grid.contains(&0) || block.contains(&0) {
        return Err(EmuError::InvalidLaunch(format!(
            "grid {grid:?} and block {block:?} must have no zero dimension"
        )));
    }
    // Three u32 factors fit in u128 (and 2^96 blocks of at most 1024
    // threads too): no product here can wrap.
    let per_block = block.iter().map(|&d| u128::from(d)).product::<u128>();
    if per_block > 1024 {
        return Err(EmuError::InvalidLaunch(format!(
            "block {block:?} has {per_block} threads per block; the GPU allows at most 1024"
        )));
    }
    let blocks = grid.iter().map(|&d| u128::from(d)).product::<u128>();
    let threads = blocks * per_block;
    try_barrier_timeout().map_err(EmuError::BadEnv)?;
    let limit = max_threads().map_err(EmuError::BadEnv)?;
    if threads > u128::from(limit) {
        let Ok(threads) = u64::try_from(threads) else {
            return Err(EmuError::InvalidLaunch(format!(
                "grid {grid:?} of block {block:?} is {threads} threads, more than 2^64"
            )));
        };
        return Err(EmuError::TooManyThreads { threads, limit });
    }
    install_quiet_hook();
    let launch = Arc::new(LaunchShared {
        aborted: AtomicBool::new(false),
        first_error: Mutex::new(None),
    });
    let per_block = per_block as u32;
    let nwarps = per_block.div_ceil(32);
    let smem_words = (shared_mem_bytes as usize).div_ceil(16);

    let spawn_result = std::thread::scope(|s| -> Result<(), EmuError> {
        for bz in 0..grid[2] {
            for by in 0..grid[1] {
                for bx in 0..grid[0] {
                    let shared = Arc::new(BlockShared {
                        barrier: Barrier::new(per_block as usize),
                        warps: (0..nwarps).map(|w| Warp::new((per_block - w * 32).min(32))).collect(),
                        shared_mem: vec![0u128; smem_words].into_boxed_slice(),
                    });
                    for r in 0..per_block {
                        let tid = [r % block[0], (r / block[0]) % block[1], r / (block[0] * block[1])];
                        let ctx = ThreadCtx {
                            thread_idx: tid,
                            block_dim: block,
                            block_idx: [bx, by, bz],
                            grid_dim: grid,
                            lane: r % 32,
                            warp: r / 32,
                            block: shared.clone(),
                            launch: launch.clone(),
                        };
                        let spawned = std::thread::Builder::new()
                            .name(format!("emu-b{bx}.{by}.{bz}-t{r}"))
                            .stack_size(512 * 1024)
                            .spawn_scoped(s, move || thread_main(ctx, body));
                        if let Err(e) = spawned {
                            launch.aborted.store(true, Ordering::Relaxed);
                            return Err(EmuError::Spawn(e.to_string()));
                        }
                    }
                }
            }
        }
        Ok(())
    });
    spawn_result?;
    let err = launch.first_error.lock().unwrap_or_else(|e| e.into_inner()).take();
    match err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn thread_main(ctx: ThreadCtx, body: &(dyn Fn() + Sync)) {
    CTX.with(|c| c.set(&ctx as *const ThreadCtx));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    CTX.with(|c| c.set(std::ptr::null()));
    // An exited thread no longer takes part in its block's and warp's barriers.
    ctx.block.barrier.leave();
    ctx.block.warps[ctx.warp as usize].leave(ctx.lane);
    if let Err(payload) = result {
        if payload.downcast_ref::<Aborted>().is_none() {
            let mut slot = ctx.launch.first_error.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(EmuError::Panicked {
                    block: ctx.block_idx,
                    thread: ctx.thread_idx,
                    message: panic_message(payload.as_ref()),
                });
            }
            ctx.launch.aborted.store(true, Ordering::Relaxed);
            ctx.block.barrier.wake_all();
            for w in &ctx.block.warps {
                w.wake_all();
            }
        }
    }
}

#[cfg(test)]
mod tests;
