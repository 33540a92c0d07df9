//! Devices: a GPU through the CUDA driver, or the CPU emulator.

use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::{sys, CudaContext};

use crate::error::{CudaCall, Error, Result};
use crate::stream::{EmuStream, Stream};

/// Which backend runs kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// The GPU when a driver and a GPU are present, the CPU emulator otherwise.
    #[default]
    Auto,
    /// A CUDA GPU; an error when there is none.
    Gpu,
    /// The CPU emulator.
    Cpu,
}

impl Backend {
    /// Reads `DOORBELL_DEVICE` (`gpu`, `cpu`, `auto`; unset or empty means
    /// auto). Anything else is [`Error::BadEnv`] naming the variable.
    pub fn from_env() -> Result<Backend> {
        match crate::env::raw("DOORBELL_DEVICE")? {
            None => Ok(Backend::Auto),
            Some(v) => v.parse().map_err(|_| Error::BadEnv {
                var: "DOORBELL_DEVICE".into(),
                value: v,
                reason: "is not one of gpu, cpu, auto".into(),
            }),
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = Error;
    /// `gpu` (or `cuda`), `cpu` (or `emu`, `emulator`), `auto`; any case.
    fn from_str(s: &str) -> Result<Backend> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Backend::Auto),
            "gpu" | "cuda" => Ok(Backend::Gpu),
            "cpu" | "emu" | "emulator" => Ok(Backend::Cpu),
            _ => Err(Error::BadBackend(s.to_string())),
        }
    }
}

/// Number of CUDA GPUs; 0 when no driver is present (never panics).
pub fn gpu_count() -> usize {
    if !driver_present() {
        return 0;
    }
    CudaContext::device_count().map(|n| n.max(0) as usize).unwrap_or(0)
}

/// True when the CUDA driver library can be loaded.
pub fn driver_present() -> bool {
    eager_module_loading();
    // SAFETY: only probes whether the library can be dlopen'd.
    unsafe { sys::is_culib_present() }
}

/// Kernels that wait on each other must be loaded before any of them runs:
/// with CUDA's lazy loading (the default since CUDA 12.2) the first launch
/// of a kernel can wait for a running kernel that spins on it. Like NVSHMEM,
/// doorbell asks for eager loading unless `CUDA_MODULE_LOADING` is set.
fn eager_module_loading() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("CUDA_MODULE_LOADING").is_none() {
            std::env::set_var("CUDA_MODULE_LOADING", "EAGER");
        }
    });
}

/// A device: a GPU context or a CPU emulator instance. Cheap to clone;
/// `Send + Sync`.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
    /// GPU streams created through this handle: what `synchronize` waits for.
    /// Several handles (e.g. thread ranks) share one CUDA context, so a
    /// context-wide synchronize would wait for other ranks' spinning kernels.
    pub(crate) gpu_streams: Arc<Mutex<Vec<Weak<cudarc::driver::CudaStream>>>>,
}

pub(crate) enum DeviceInner {
    Gpu(Arc<CudaContext>),
    Emu(EmuDevice),
}

pub(crate) struct EmuDevice {
    pub(crate) ordinal: usize,
    pub(crate) streams: Mutex<Vec<Weak<EmuStream>>>,
}

impl Device {
    /// Opens device `ordinal` on `backend`.
    pub fn open(backend: Backend, ordinal: usize) -> Result<Device> {
        match backend {
            Backend::Gpu => Self::gpu(ordinal),
            Backend::Cpu => Ok(Self::emulator(ordinal)),
            Backend::Auto => {
                if gpu_count() > 0 {
                    Self::gpu(ordinal)
                } else {
                    Ok(Self::emulator(ordinal))
                }
            }
        }
    }

    /// Opens device `ordinal` on the backend `DOORBELL_DEVICE` names.
    pub fn from_env(ordinal: usize) -> Result<Device> {
        Self::open(Backend::from_env()?, ordinal)
    }

    /// Opens GPU `ordinal` (its primary context).
    pub fn gpu(ordinal: usize) -> Result<Device> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        let count = CudaContext::device_count().call("cuDeviceGetCount")?.max(0) as usize;
        if count == 0 {
            return Err(Error::NoGpu);
        }
        if ordinal >= count {
            return Err(Error::NoSuchGpu { ordinal, count });
        }
        let ctx = shared_context(ordinal)?;
        Ok(Device {
            inner: Arc::new(DeviceInner::Gpu(ctx)),
            gpu_streams: Default::default(),
        })
    }

    /// A CPU emulator device (`ordinal` only labels it).
    pub fn emulator(ordinal: usize) -> Device {
        Device {
            inner: Arc::new(DeviceInner::Emu(EmuDevice {
                ordinal,
                streams: Mutex::new(Vec::new()),
            })),
            gpu_streams: Default::default(),
        }
    }

    /// The backend this device runs on (never `Auto`).
    pub fn backend(&self) -> Backend {
        match &*self.inner {
            DeviceInner::Gpu(_) => Backend::Gpu,
            DeviceInner::Emu(_) => Backend::Cpu,
        }
    }

    /// True for a GPU.
    pub fn is_gpu(&self) -> bool {
        self.backend() == Backend::Gpu
    }

    /// Ordinal.
    pub fn ordinal(&self) -> usize {
        match &*self.inner {
            DeviceInner::Gpu(c) => c.ordinal(),
            DeviceInner::Emu(e) => e.ordinal,
        }
    }

    /// A human-readable name: the GPU's, or "CPU emulator".
    pub fn name(&self) -> String {
        match &*self.inner {
            DeviceInner::Gpu(c) => c.name().unwrap_or_else(|_| "CUDA GPU".into()),
            DeviceInner::Emu(_) => format!("CPU emulator ({} host threads available)", host_threads()),
        }
    }

    /// Compute capability of a GPU (`None` on the emulator).
    pub fn compute_capability(&self) -> Option<(i32, i32)> {
        match &*self.inner {
            DeviceInner::Gpu(c) => c.compute_capability().ok(),
            DeviceInner::Emu(_) => None,
        }
    }

    /// Number of SMs (the emulator reports the host's hardware threads).
    pub fn multiprocessor_count(&self) -> usize {
        match &*self.inner {
            DeviceInner::Gpu(c) => c
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map(|v| v as usize)
                .unwrap_or(1),
            DeviceInner::Emu(_) => host_threads(),
        }
    }

    /// Waits for all work enqueued through this handle (its streams). Other
    /// handles of the same GPU (other thread ranks) are not waited for.
    pub fn synchronize(&self) -> Result<()> {
        match &*self.inner {
            DeviceInner::Gpu(_) => {
                let streams: Vec<_> = self
                    .gpu_streams
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .filter_map(Weak::upgrade)
                    .collect();
                for s in streams {
                    s.synchronize().call("cuStreamSynchronize")?;
                }
                Ok(())
            }
            DeviceInner::Emu(e) => {
                let streams: Vec<_> = e
                    .streams
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .filter_map(Weak::upgrade)
                    .collect();
                let mut first = Ok(());
                for s in streams {
                    let r = s.synchronize();
                    if first.is_ok() {
                        first = r;
                    }
                }
                first
            }
        }
    }

    /// A new stream (GPU: a CUDA stream; emulator: an in-order worker).
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::new(self)
    }

    /// The GPU's CUDA context (`None` on the emulator): the escape hatch to cudarc.
    pub fn as_cuda(&self) -> Option<&Arc<CudaContext>> {
        match &*self.inner {
            DeviceInner::Gpu(c) => Some(c),
            DeviceInner::Emu(_) => None,
        }
    }

    pub(crate) fn bind(&self) -> Result<()> {
        if let DeviceInner::Gpu(c) = &*self.inner {
            c.bind_to_thread().call("cuCtxSetCurrent")?;
        }
        Ok(())
    }

    pub(crate) fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("backend", &self.backend())
            .field("ordinal", &self.ordinal())
            .finish()
    }
}

/// One CUDA context per GPU ordinal for the whole process, shared by every
/// handle (thread ranks on one GPU use one context). cudarc's event tracking
/// is switched off: we never use its `CudaSlice`, and its implicit
/// synchronization (a context-wide synchronize when the first stream is
/// created) would wait for other ranks' spinning kernels.
pub(crate) fn shared_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    static CONTEXTS: std::sync::OnceLock<Mutex<std::collections::HashMap<usize, Weak<CudaContext>>>> = std::sync::OnceLock::new();
    let mut map = CONTEXTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = map.get(&ordinal).and_then(Weak::upgrade) {
        return Ok(c);
    }
    let ctx = CudaContext::new(ordinal).call("cuDevicePrimaryCtxRetain")?;
    // SAFETY: no CudaSlice exists on this context yet (it was just created).
    unsafe { ctx.disable_event_tracking() };
    map.insert(ordinal, Arc::downgrade(&ctx));
    Ok(ctx)
}

fn host_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
