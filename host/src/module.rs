//! PTX modules and kernel handles.

use std::marker::PhantomData;

use doorbell_kernels::Kernel;

pub use crate::backend::cuda::ptx_is_built;
pub use crate::backend::FunctionAttributes;
use crate::backend::{FunctionBackend, ModuleBackend};
use crate::device::Device;
use crate::error::Result;

/// A loaded PTX module (GPU) or the set of kernels linked into this binary
/// (emulator).
pub struct Module {
    device: Device,
    inner: ModuleBackend,
}

/// A kernel crate's build output as a binary embeds it: its PTX and the
/// cubin `ptxas` made of it for the build's arch (empty when the build
/// found no `ptxas`; see [`crate::build`]). Loading one on a GPU of that
/// arch skips the driver's compile of the PTX (seconds per MB of PTX, the
/// first time on a machine); on another GPU, or with `DOORBELL_CUBIN=0`,
/// the PTX is loaded. Make one with [`module_image!`](crate::module_image).
#[derive(Clone, Copy, Debug)]
pub struct ModuleImage {
    /// The PTX text.
    pub ptx: &'static str,
    /// The cubin (may be empty).
    pub cubin: &'static [u8],
}

/// The [`ModuleImage`] of kernel crate `name` built by
/// [`PtxBuilder`](crate::build::PtxBuilder) into `OUT_DIR` (its PTX and
/// cubin embedded): `doorbell::module_image!("my_kernels")`.
#[macro_export]
macro_rules! module_image {
    ($name:literal) => {
        $crate::ModuleImage {
            ptx: include_str!(concat!(env!("OUT_DIR"), "/", $name, ".ptx")),
            cubin: include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".cubin")),
        }
    };
}

/// What [`Device::load_module`] loads: PTX text, or a [`ModuleImage`].
#[derive(Clone, Copy, Debug)]
pub enum ModuleSource<'a> {
    /// PTX text (compiled by the driver at load).
    Ptx(&'a str),
    /// PTX and, where it matches the GPU, its cubin.
    Image(&'a ModuleImage),
}

impl<'a> From<&'a str> for ModuleSource<'a> {
    fn from(ptx: &'a str) -> Self {
        ModuleSource::Ptx(ptx)
    }
}

impl<'a> From<&'a ModuleImage> for ModuleSource<'a> {
    fn from(image: &'a ModuleImage) -> Self {
        ModuleSource::Image(image)
    }
}

impl ModuleSource<'_> {
    pub(crate) fn ptx(&self) -> &str {
        match self {
            ModuleSource::Ptx(p) => p,
            ModuleSource::Image(m) => m.ptx,
        }
    }

    pub(crate) fn cubin(&self) -> &[u8] {
        match self {
            ModuleSource::Ptx(_) => &[],
            ModuleSource::Image(m) => m.cubin,
        }
    }
}

impl Device {
    /// Loads a module: PTX text (e.g. [`crate::KERNELS_PTX`], or a kernel
    /// crate's PTX embedded with `include_str!`) or a [`ModuleImage`]
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
