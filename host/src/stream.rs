//! Streams, launches and events.
//!
//! A [`Stream`] is an in-order queue of work. On a GPU it is a CUDA stream;
//! on the CPU emulator it is a worker thread that runs each launch (all of its
//! GPU threads concurrently) before starting the next. Either way
//! [`Stream::launch`] returns at once and errors surface at
//! [`Stream::synchronize`], as with CUDA.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use doorbell_kernels::{EntryVisitor, Kernel, KernelFamily};

use crate::backend::{EventBackend, StreamBackend};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::family::{Family, FamilyHandle};
pub use crate::launch::LaunchConfig;
use crate::module::Function;

/// An in-order queue of work on a device.
pub struct Stream {
    // Dropped first: an emulator stream finishes its queue before the
    // device handle goes.
    inner: StreamBackend,
    device: Device,
}

impl Device {
    /// A new stream (GPU: a CUDA stream; emulator: an in-order worker).
    pub fn new_stream(&self) -> Result<Stream> {
        Ok(Stream {
            inner: self.inner.new_stream()?,
            device: self.clone(),
        })
    }
}

impl Stream {
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
        cfg.validate(K::NAME, K::MAX_THREADS)?;
        if !f.device().same(&self.device) {
            return Err(Error::DeviceMismatch(
                "the kernel's module was loaded on another device than this stream's",
            ));
        }
        // SAFETY: `f` is K's handle, and the caller accepted K's contract.
        let r = unsafe { self.inner.launch::<K>(&f.inner, &cfg, args) };
        if r.is_ok() {
            self.device.activity().note(K::NAME);
        }
        r
    }

    /// Enqueues kernel family `F` for the transport of `handle`: the entry
    /// `handle` picks, with the arguments `handle` followed by `rest` (the
    /// family's other parameters, as a tuple). `handle` is a concrete
    /// transport ([`P2p`](crate::kernels::transport::P2p), ...: the entry is
    /// chosen at compile time, and a family not exported for it does not
    /// compile) or an [`AnyTransport`](crate::AnyTransport) (chosen at run
    /// time: a family not exported for it returns
    /// [`Error::TransportNotExported`] and enqueues nothing).
    ///
    /// # Safety
    /// As [`Self::launch`]: the arguments must satisfy the kernel's contract.
    pub unsafe fn launch_family<F: KernelFamily, H: FamilyHandle<F>>(
        &self,
        family: &Family<F>,
        cfg: LaunchConfig,
        handle: H,
        rest: H::Rest,
    ) -> Result<()> {
        if !family.device().same(&self.device) {
            return Err(Error::DeviceMismatch(
                "the kernel family's module was loaded on another device than this stream's",
            ));
        }
        let visitor = LaunchEntry { stream: self, family, cfg };
        match handle.visit_entry(rest, visitor) {
            Some(launched) => launched,
            None => Err(family.not_exported(handle.transport_name())),
        }
    }

    /// Waits for everything enqueued so far; returns the first error any of it hit.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    /// Whether everything enqueued so far has finished, without waiting
    /// (`cuStreamQuery` on a GPU): `Ok(false)` while work runs, the error a
    /// kernel of the stream hit once one failed (on the emulator it is also
    /// still reported by [`Self::synchronize`]).
    pub fn query(&self) -> Result<bool> {
        self.inner.query()
    }

    /// Records an event (a timestamp in stream order).
    pub fn record(&self) -> Result<Event> {
        Ok(Event {
            inner: self.inner.record()?,
        })
    }

    /// Whether the stream is being captured into a CUDA graph (never on the
    /// emulator).
    pub fn is_capturing(&self) -> Result<bool> {
        match self.inner.as_cuda() {
            Some(s) => {
                let status = s.capture_status().map_err(|source| Error::Cuda {
                    call: "cuStreamIsCapturing",
                    source,
                })?;
                Ok(status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
            }
            None => Ok(false),
        }
    }

    /// The CUDA stream (`None` on the emulator): the escape hatch to cudarc.
    pub fn as_cuda(&self) -> Option<&Arc<CudaStream>> {
        self.inner.as_cuda()
    }
}

/// Launches the family entry a handle picked. Made only by
/// [`Stream::launch_family`], whose caller accepted the kernel's contract.
struct LaunchEntry<'a, F: KernelFamily> {
    stream: &'a Stream,
    family: &'a Family<F>,
    cfg: LaunchConfig,
}

impl<F: KernelFamily> EntryVisitor for LaunchEntry<'_, F> {
    type Output = Result<()>;

    fn visit<K: Kernel>(self, args: K::Args) -> Result<()> {
        self.cfg.validate(K::NAME, K::MAX_THREADS)?;
        let f = self.family.entry(K::NAME)?;
        // SAFETY: `f` is the entry loaded for `K::NAME`, one of `F`'s
        // entries, whose argument tuple `K::Args` the family built; the
        // caller of `launch_family` (the only maker of this visitor)
        // accepted the kernel's contract for the values.
        let r = unsafe { self.stream.inner.launch::<K>(f, &self.cfg, args) };
        if r.is_ok() {
            self.stream.device.activity().note(K::NAME);
        }
        r
    }
}

/// A point in a stream's order, with a timestamp.
pub struct Event {
    inner: EventBackend,
}

impl Event {
    /// Waits until the stream has reached the event.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    /// Milliseconds from `self` to `end` (both synchronized first).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.synchronize()?;
        end.synchronize()?;
        self.inner.elapsed_ms(&end.inner)
    }
}
