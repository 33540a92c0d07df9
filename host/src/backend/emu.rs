//! The CPU emulator backend: "device memory" is host memory, a stream is a
//! worker thread that runs each launch (all of its GPU threads concurrently)
//! before starting the next, and a kernel is its Rust body, linked into the
//! binary ([`doorbell_kernels::emu`] runs it).

use std::alloc::Layout;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Instant;

use doorbell_kernels::emu::{self, EmuLaunch};
use doorbell_kernels::Kernel;

use crate::error::{Error, Result};

/// Names the emulator in allocation errors.
pub(crate) const MEMORY_LABEL: &str = "CPU emulator (host memory)";

const ALIGN: usize = 256;

/// The emulator's "device memory": zeroed host memory, 256-byte aligned like
/// `cuMemAlloc`. `bytes` is non-zero. A size no layout can hold, or a host
/// that refuses the allocation, is [`Error::OutOfMemory`] (never an abort).
fn alloc_zeroed(bytes: usize) -> Result<*mut u8> {
    let oom = |detail: String| Error::OutOfMemory {
        bytes: bytes as u64,
        device: MEMORY_LABEL.into(),
        detail,
    };
    let layout = Layout::from_size_align(bytes, ALIGN).map_err(|_| {
        oom(format!(
            "more than the largest allocation the host allows ({} bytes)",
            isize::MAX as usize - (ALIGN - 1)
        ))
    })?;
    debug_assert!(bytes > 0);
    // SAFETY: non-zero size (callers allocate nothing for zero bytes).
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(oom("the host allocator refused it (not enough memory)".into()));
    }
    Ok(p)
}

/// Frees what [`alloc_zeroed`] returned.
///
/// # Safety
/// `p` came from `alloc_zeroed(bytes)` and is freed once.
unsafe fn free(p: *mut u8, bytes: usize) {
    let layout = Layout::from_size_align(bytes, ALIGN).expect("valid at allocation");
    // SAFETY: the caller passes what `alloc_zeroed` returned for this size, once.
    unsafe { std::alloc::dealloc(p, layout) };
}

fn host_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// A kernel failure as the emulator keeps it until someone is told: the
/// kernel's name and what went wrong (both cheap to copy, so the same failure
/// can be reported again).
#[derive(Clone, Debug)]
struct Failure {
    kernel: &'static str,
    source: emu::EmuError,
}

impl Failure {
    fn to_error(&self) -> Error {
        Error::Emulator {
            kernel: self.kernel,
            source: self.source.clone(),
        }
    }
}

/// Where a dropped stream leaves a failure nobody has been told about, so
/// that the device's next [`Device::synchronize`] reports it.
type Orphans = Arc<Mutex<Option<Failure>>>;

/// An emulator instance (`ordinal` only labels it) and its streams.
///
/// A kernel failure is sticky, as a CUDA launch failure is: internal waits
/// (freeing memory, dropping a buffer, a stream or a communicator) never
/// consume it; it stays until a user-facing synchronize (of the stream, an
/// event on it, or the device) returns it.
pub(crate) struct Device {
    ordinal: usize,
    streams: Mutex<Vec<Weak<Queue>>>,
    orphans: Orphans,
    pub(crate) activity: Arc<super::Activity>,
}

impl Device {
    pub(crate) fn new(ordinal: usize) -> Device {
        Device {
            ordinal,
            streams: Mutex::new(Vec::new()),
            orphans: Arc::new(Mutex::new(None)),
            activity: Default::default(),
        }
    }

    fn live_streams(&self) -> Vec<Arc<Queue>> {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Waits for every stream of this device without consuming a failure:
    /// for internal waits (before freeing memory), which must leave a kernel
    /// error for the user to see.
    pub(crate) fn wait_idle(&self) {
        for s in self.live_streams() {
            s.wait_idle();
        }
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub(crate) fn name(&self) -> String {
        format!("CPU emulator ({} host threads available)", host_threads())
    }

    /// The host's hardware threads stand for SMs.
    pub(crate) fn multiprocessor_count(&self) -> usize {
        host_threads()
    }

    /// Waits for every stream of this device; reports (and clears) the
    /// first failure found: a live stream's, else one a dropped stream left.
    /// Failures of other streams stay for the next call.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let streams = self.live_streams();
        for s in &streams {
            s.wait_idle();
        }
        for s in &streams {
            s.synchronize()?;
        }
        match self.orphans.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(f) => Err(f.to_error()),
            None => Ok(()),
        }
    }

    pub(crate) fn new_stream(&self) -> Result<Stream> {
        let s = Queue::start()?;
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(&s));
        Ok(Stream {
            queue: s,
            orphans: self.orphans.clone(),
        })
    }

    /// A stream [`Device::synchronize`] (and so `free`) does not wait for:
    /// for a persistent kernel that ends only when told to.
    pub(crate) fn new_stream_untracked(&self) -> Result<Stream> {
        Ok(Stream {
            queue: Queue::start()?,
            orphans: self.orphans.clone(),
        })
    }

    /// `bytes` (non-zero) of zeroed "device memory"; its address.
    pub(crate) fn alloc_zeroed(&self, bytes: usize) -> Result<u64> {
        Ok(alloc_zeroed(bytes)? as u64)
    }

    /// Frees what [`Device::alloc_zeroed`] returned, once the device's
    /// streams are idle.
    ///
    /// # Safety
    /// `addr` came from `alloc_zeroed(bytes)` on this device and is freed once.
    pub(crate) unsafe fn free(&self, addr: u64, bytes: usize) {
        // Kernels still running may use the memory: wait, as cudaFree does,
        // leaving any kernel failure for the user's own synchronize.
        self.wait_idle();
        // SAFETY: allocated by alloc_zeroed with this size; freed once.
        unsafe { free(addr as *mut u8, bytes) };
    }

    /// Sets `bytes` at `addr` to zero.
    ///
    /// # Safety
    /// `addr..addr+bytes` is memory of this device.
    pub(crate) unsafe fn zero(&self, addr: u64, bytes: usize) -> Result<()> {
        // SAFETY: the caller vouches that the allocation spans `bytes`.
        unsafe { std::ptr::write_bytes(addr as *mut u8, 0, bytes) };
        Ok(())
    }

    /// "Mapped" memory is plain host memory: the host and device addresses are one.
    pub(crate) fn alloc_mapped(&self, bytes: usize) -> Result<(*mut u8, u64)> {
        let p = alloc_zeroed(bytes)?;
        Ok((p, p as u64))
    }

    /// Frees what [`Device::alloc_mapped`] returned.
    ///
    /// # Safety
    /// `host` came from `alloc_mapped(bytes)` on this device and is freed once.
    pub(crate) unsafe fn free_mapped(&self, host: *mut u8, bytes: usize) {
        // SAFETY: allocated by alloc_zeroed with this size; freed once.
        unsafe { free(host, bytes) };
    }

    /// Copies host bytes to "device" address `addr`.
    ///
    /// # Safety
    /// `addr..addr+src.len()` is memory of this device.
    pub(crate) unsafe fn write(&self, addr: u64, src: &[u8]) -> Result<()> {
        // SAFETY: the caller vouches for the destination range.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) };
        Ok(())
    }

    /// Copies "device" bytes at `addr` to the host.
    ///
    /// # Safety
    /// `addr..addr+dst.len()` is memory of this device.
    pub(crate) unsafe fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        // SAFETY: the caller vouches for the source range.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}

type Job = Box<dyn FnOnce() -> Result<(), Failure> + Send>;

/// The worker behind an emulator stream: a thread draining a queue.
pub(crate) struct Queue {
    state: Mutex<QueueState>,
    cv: Condvar,
}

struct QueueState {
    queue: VecDeque<Job>,
    busy: bool,
    error: Option<Failure>,
    closed: bool,
}

impl Queue {
    fn start() -> Result<Arc<Queue>> {
        let s = Arc::new(Queue {
            state: Mutex::new(QueueState {
                queue: VecDeque::new(),
                busy: false,
                error: None,
                closed: false,
            }),
            cv: Condvar::new(),
        });
        let worker = s.clone();
        std::thread::Builder::new()
            .name("doorbell-emu-stream".into())
            .spawn(move || worker.run())
            .map_err(Error::Thread)?;
        Ok(s)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(&self) {
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    if let Some(j) = st.queue.pop_front() {
                        st.busy = true;
                        break j;
                    }
                    if st.closed {
                        return;
                    }
                    st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            let r = job();
            let mut st = self.lock();
            st.busy = false;
            if let Err(e) = r {
                if st.error.is_none() {
                    st.error = Some(e);
                }
            }
            self.cv.notify_all();
        }
    }

    fn push(&self, job: Job) {
        let mut st = self.lock();
        st.queue.push_back(job);
        self.cv.notify_all();
    }

    /// Waits until the queue is drained; the lock, held, for the caller.
    fn drained(&self) -> std::sync::MutexGuard<'_, QueueState> {
        let mut st = self.lock();
        while st.busy || !st.queue.is_empty() {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st
    }

    /// Waits until the queue is drained, leaving a failure in place.
    fn wait_idle(&self) {
        drop(self.drained());
    }

    /// Waits until the queue is drained; reports a failure once (to the
    /// caller, who is the user or passes it to the user).
    fn synchronize(&self) -> Result<()> {
        match self.drained().error.take() {
            Some(f) => Err(f.to_error()),
            None => Ok(()),
        }
    }

    /// Without waiting: whether the queue is drained, or the failure a job
    /// hit (left for `synchronize` to report too).
    fn query(&self) -> Result<bool> {
        let st = self.lock();
        match &st.error {
            Some(f) => Err(f.to_error()),
            None => Ok(!st.busy && st.queue.is_empty()),
        }
    }

    /// Waits until the queue is drained; takes a failure still there (for a
    /// stream being dropped, which hands it on to its device).
    fn take_failure(&self) -> Option<Failure> {
        self.drained().error.take()
    }

    fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        self.cv.notify_all();
    }
}

/// Wraps values that cross into emulator threads. Kernel arguments are raw
/// pointers and plain data; the kernel's contract (which the caller of the
/// unsafe launch accepted) governs their use.
struct AssertSend<T>(T);
// SAFETY: see above.
unsafe impl<T> Send for AssertSend<T> {}
// SAFETY: see above.
unsafe impl<T> Sync for AssertSend<T> {}

/// An emulator stream: owns its worker, which finishes the queued work and
/// stops when the stream is dropped (a failure nobody was told about then
/// moves to the device, see [`Device::synchronize`]).
pub(crate) struct Stream {
    queue: Arc<Queue>,
    orphans: Orphans,
}

impl Stream {
    /// Enqueues kernel `K` with `args`.
    ///
    /// # Safety
    /// The arguments satisfy the kernel's contract.
    pub(crate) unsafe fn launch<K: Kernel>(
        &self,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem_bytes: u32,
        args: K::Args,
    ) -> Result<()> {
        let launch = EmuLaunch {
            grid: [grid.0, grid.1, grid.2],
            block: [block.0, block.1, block.2],
            shared_mem_bytes,
        };
        let args = AssertSend(args);
        self.queue.push(Box::new(move || {
            let args = &args;
            let body = move || {
                // SAFETY: the launch's caller accepted the kernel's contract.
                unsafe { K::emulate(args.0) }
            };
            emu::run(launch, &body).map_err(|source| Failure { kernel: K::NAME, source })
        }));
        Ok(())
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.queue.synchronize()
    }

    pub(crate) fn query(&self) -> Result<bool> {
        self.queue.query()
    }

    /// An event that the worker stamps when it reaches it.
    pub(crate) fn record(&self) -> Result<Event> {
        let slot = Arc::new(Mutex::new(None));
        let w = slot.clone();
        self.queue.push(Box::new(move || {
            *w.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            Ok(())
        }));
        Ok(Event {
            at: slot,
            queue: self.queue.clone(),
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(f) = self.queue.take_failure() {
            let mut slot = self.orphans.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(f);
            }
        }
        self.queue.close();
    }
}

/// An emulator event: the time its stream's worker reached it.
pub(crate) struct Event {
    at: Arc<Mutex<Option<Instant>>>,
    queue: Arc<Queue>,
}

impl Event {
    pub(crate) fn synchronize(&self) -> Result<()> {
        while self.at.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
            self.queue.synchronize()?;
        }
        Ok(())
    }

    /// Both events are synchronized (the caller made sure).
    pub(crate) fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        let a = self.at.lock().unwrap_or_else(|e| e.into_inner()).expect("synchronized");
        let b = end.at.lock().unwrap_or_else(|e| e.into_inner()).expect("synchronized");
        Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3)
    }
}
