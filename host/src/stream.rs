//! Streams, launches and events.
//!
//! A [`Stream`] is an in-order queue of work. On a GPU it is a CUDA stream;
//! on the CPU emulator it is a worker thread that runs each launch (all of its
//! GPU threads concurrently) before starting the next. Either way
//! [`Stream::launch`] returns at once and errors surface at
//! [`Stream::synchronize`], as with CUDA.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use cudarc::driver::{result, CudaEvent, CudaStream};
use doorbell_kernels::emu::{self, EmuLaunch};
use doorbell_kernels::{Kernel, KernelArgs};

use crate::device::{Device, DeviceInner};
use crate::error::{CudaCall, Error, Result};
use crate::module::{Function, FunctionInner};

/// Grid and block shape of a launch, plus dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch of `blocks` × `threads`.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// With `bytes` of dynamic shared memory per block.
    pub fn with_shared_mem(mut self, bytes: u32) -> Self {
        self.shared_mem_bytes = bytes;
        self
    }

    fn validate(&self, kernel: &'static str) -> Result<()> {
        let (g, b) = (self.grid, self.block);
        if [g.0, g.1, g.2, b.0, b.1, b.2].contains(&0) {
            return Err(Error::InvalidLaunch {
                kernel,
                reason: format!("grid {g:?} / block {b:?} has a zero dimension"),
            });
        }
        let threads = b.0 as u64 * b.1 as u64 * b.2 as u64;
        if threads > 1024 {
            return Err(Error::InvalidLaunch {
                kernel,
                reason: format!("{threads} threads per block; at most 1024"),
            });
        }
        Ok(())
    }
}

/// An in-order queue of work on a device.
pub struct Stream {
    device: Device,
    inner: StreamInner,
}

enum StreamInner {
    Gpu(Arc<CudaStream>),
    Emu(Arc<EmuStream>),
}

type Job = Box<dyn FnOnce() -> Result<()> + Send>;

/// The emulator's stream: a worker thread draining a queue.
pub(crate) struct EmuStream {
    state: Mutex<EmuState>,
    cv: Condvar,
}

struct EmuState {
    queue: VecDeque<Job>,
    busy: bool,
    error: Option<Error>,
    closed: bool,
}

impl EmuStream {
    fn start() -> Result<Arc<EmuStream>> {
        let s = Arc::new(EmuStream {
            state: Mutex::new(EmuState {
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

    fn lock(&self) -> std::sync::MutexGuard<'_, EmuState> {
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

    pub(crate) fn synchronize(&self) -> Result<()> {
        let mut st = self.lock();
        while st.busy || !st.queue.is_empty() {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        match st.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
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

impl Stream {
    pub(crate) fn new(device: &Device) -> Result<Stream> {
        let inner = match &*device.inner {
            DeviceInner::Gpu(ctx) => {
                let s = ctx.new_stream().call("cuStreamCreate")?;
                device
                    .gpu_streams
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Arc::downgrade(&s));
                StreamInner::Gpu(s)
            }
            DeviceInner::Emu(e) => {
                let s = EmuStream::start()?;
                e.streams.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(&s));
                StreamInner::Emu(s)
            }
        };
        Ok(Stream {
            device: device.clone(),
            inner,
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Enqueues kernel `K` with `args`.
    ///
    /// # Safety
    /// The arguments must satisfy the kernel's contract (valid device
    /// pointers of the sizes it reads and writes, alive until the launch
    /// completes).
    pub unsafe fn launch<K: Kernel>(&self, f: &Function<K>, cfg: LaunchConfig, args: K::Args) -> Result<()> {
        cfg.validate(K::NAME)?;
        if !f.device().same(&self.device) {
            return Err(Error::DeviceMismatch(
                "the kernel's module was loaded on another device than this stream's",
            ));
        }
        match (&self.inner, &f.inner) {
            (StreamInner::Gpu(s), FunctionInner::Gpu(func)) => {
                self.device.bind()?;
                let mut args = args;
                let mut params = args.param_ptrs();
                // SAFETY: `params` points at K::Args' fields, matching the entry
                // point's parameters (the #[kernel] macro derived both from one
                // signature); the caller vouches for their values.
                unsafe {
                    result::launch_kernel(
                        func.cu_function(),
                        cfg.grid,
                        cfg.block,
                        cfg.shared_mem_bytes,
                        s.cu_stream(),
                        &mut params,
                    )
                }
                .call("cuLaunchKernel")
            }
            (StreamInner::Emu(s), FunctionInner::Emu) => {
                let launch = EmuLaunch {
                    grid: [cfg.grid.0, cfg.grid.1, cfg.grid.2],
                    block: [cfg.block.0, cfg.block.1, cfg.block.2],
                    shared_mem_bytes: cfg.shared_mem_bytes,
                };
                let args = AssertSend(args);
                s.push(Box::new(move || {
                    let args = &args;
                    let body = move || {
                        // SAFETY: the launch's caller accepted the kernel's contract.
                        unsafe { K::emulate(args.0) }
                    };
                    emu::run(launch, &body).map_err(|source| Error::Emulator { kernel: K::NAME, source })
                }));
                Ok(())
            }
            _ => Err(Error::DeviceMismatch("kernel and stream belong to different backends")),
        }
    }

    /// Waits for everything enqueued so far; returns the first error any of it hit.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner {
            StreamInner::Gpu(s) => s.synchronize().call("cuStreamSynchronize"),
            StreamInner::Emu(s) => s.synchronize(),
        }
    }

    /// Records an event (a timestamp in stream order).
    pub fn record(&self) -> Result<Event> {
        match &self.inner {
            StreamInner::Gpu(s) => {
                let e = s
                    .context()
                    .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .call("cuEventCreate")?;
                e.record(s).call("cuEventRecord")?;
                Ok(Event { inner: EventInner::Gpu(e) })
            }
            StreamInner::Emu(s) => {
                let slot = Arc::new(Mutex::new(None));
                let w = slot.clone();
                s.push(Box::new(move || {
                    *w.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                    Ok(())
                }));
                Ok(Event {
                    inner: EventInner::Emu(slot, s.clone()),
                })
            }
        }
    }

    /// The CUDA stream (`None` on the emulator): the escape hatch to cudarc.
    pub fn as_cuda(&self) -> Option<&Arc<CudaStream>> {
        match &self.inner {
            StreamInner::Gpu(s) => Some(s),
            StreamInner::Emu(_) => None,
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let StreamInner::Emu(s) = &self.inner {
            let _ = s.synchronize();
            s.close();
        }
    }
}

/// A point in a stream's order, with a timestamp.
pub struct Event {
    inner: EventInner,
}

enum EventInner {
    Gpu(CudaEvent),
    Emu(Arc<Mutex<Option<Instant>>>, Arc<EmuStream>),
}

impl Event {
    /// Waits until the stream has reached the event.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner {
            EventInner::Gpu(e) => e.synchronize().call("cuEventSynchronize"),
            EventInner::Emu(slot, s) => {
                while slot.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
                    s.synchronize()?;
                }
                Ok(())
            }
        }
    }

    /// Milliseconds from `self` to `end` (both synchronized first).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.synchronize()?;
        end.synchronize()?;
        match (&self.inner, &end.inner) {
            (EventInner::Gpu(a), EventInner::Gpu(b)) => a.elapsed_ms(b).call("cuEventElapsedTime"),
            (EventInner::Emu(a, _), EventInner::Emu(b, _)) => {
                let a = a.lock().unwrap_or_else(|e| e.into_inner()).expect("synchronized");
                let b = b.lock().unwrap_or_else(|e| e.into_inner()).expect("synchronized");
                Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3)
            }
            _ => Err(Error::DeviceMismatch("events from different backends")),
        }
    }
}
