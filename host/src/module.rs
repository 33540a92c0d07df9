//! PTX modules and kernel handles.

use std::marker::PhantomData;

use doorbell_kernels::{Kernel, KernelFamily};

pub use crate::backend::cuda::ptx_is_built;
use crate::backend::{FunctionBackend, ModuleBackend};
use crate::device::Device;
use crate::error::Result;
use crate::family::Family;
use crate::image::ModuleSource;
use crate::launch::FunctionAttributes;

/// A loaded PTX module (GPU) or the set of kernels linked into this binary
/// (emulator).
pub struct Module {
    device: Device,
    inner: ModuleBackend,
}

impl Device {
    /// Loads a module: PTX text (e.g. [`crate::KERNELS_PTX`], or a kernel
    /// crate's PTX embedded with `include_str!`) or a [`ModuleImage`](crate::ModuleImage)
    /// (e.g. [`crate::KERNELS`]), whose cubin spares the driver's compile.
    /// On the emulator nothing is loaded: the kernels' host code is linked
    /// into the binary.
    pub fn load_module<'a>(&self, src: impl Into<ModuleSource<'a>>) -> Result<Module> {
        Ok(Module {
            device: self.clone(),
            inner: self.inner.load_module(src.into())?,
        })
    }
}

impl Module {
    /// The handle of kernel `K`.
    pub fn function<K: Kernel>(&self) -> Result<Function<K>> {
        Ok(Function {
            device: self.device.clone(),
            inner: self.inner.function(K::NAME)?,
            _k: PhantomData,
        })
    }

    /// Every entry of kernel family `F` (declared with
    /// `#[kernel(transports(...))]`), loaded once: launch it with
    /// [`Stream::launch_family`](crate::Stream::launch_family), whose
    /// transport handle picks the entry. An error when an entry is missing
    /// from the module ([`Error::KernelNotFound`](crate::Error::KernelNotFound)).
    pub fn family<F: KernelFamily>(&self) -> Result<Family<F>> {
        Family::load(self.device.clone(), |name| self.inner.function(name))
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

/// A kernel ready to launch, typed by its marker so arguments are checked.
pub struct Function<K: Kernel> {
    device: Device,
    pub(crate) inner: FunctionBackend,
    _k: PhantomData<fn() -> K>,
}

impl<K: Kernel> Function<K> {
    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Registers, local memory (bytes per thread) and max threads per block,
    /// as the driver reports them (`None` on the emulator).
    pub fn attributes(&self) -> Option<FunctionAttributes> {
        self.inner.attributes()
    }
}
