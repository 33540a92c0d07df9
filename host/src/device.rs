//! Devices: a GPU through the CUDA driver, or the CPU emulator.

use std::sync::Arc;

use cudarc::driver::CudaContext;

pub use crate::backend::cuda::{driver_present, gpu_count};
pub(crate) use crate::backend::Activity;
pub use crate::backend::Backend;
use crate::backend::{cuda, emu, DeviceBackend};
use crate::error::Result;

/// A device: a GPU context or a CPU emulator instance. Cheap to clone;
/// `Send + Sync`.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceBackend>,
}

impl Device {
    /// What this handle's streams launched (shared by its clones).
    pub(crate) fn activity(&self) -> &Arc<Activity> {
        self.inner.activity()
    }
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
        Ok(Device {
            inner: Arc::new(DeviceBackend::Cuda(cuda::Device::open(ordinal)?)),
        })
    }

    /// A CPU emulator device (`ordinal` only labels it).
    pub fn emulator(ordinal: usize) -> Device {
        Device {
            inner: Arc::new(DeviceBackend::Emu(emu::Device::new(ordinal))),
        }
    }

    /// The backend this device runs on (never `Auto`).
    pub fn backend(&self) -> Backend {
        self.inner.kind()
    }

    /// True for a GPU.
    pub fn is_gpu(&self) -> bool {
        self.backend() == Backend::Gpu
    }

    /// Ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal()
    }

    /// A human-readable name: the GPU's, or "CPU emulator".
    pub fn name(&self) -> String {
        self.inner.name()
    }

    /// Compute capability of a GPU (`None` on the emulator).
    pub fn compute_capability(&self) -> Option<(i32, i32)> {
        self.inner.compute_capability()
    }

    /// Number of SMs (the emulator reports the host's hardware threads).
    pub fn multiprocessor_count(&self) -> usize {
        self.inner.multiprocessor_count()
    }

    /// Waits for all work enqueued through this handle (its streams). Other
    /// handles of the same GPU (other thread ranks) are not waited for.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    /// Waits like [`Device::synchronize`] but leaves a kernel failure for the
    /// user's own synchronize (internal waits before freeing memory).
    pub(crate) fn wait_idle(&self) {
        self.inner.wait_idle()
    }

    /// The GPU's CUDA context (`None` on the emulator): the escape hatch to cudarc.
    pub fn as_cuda(&self) -> Option<&Arc<CudaContext>> {
        self.inner.as_cuda()
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
