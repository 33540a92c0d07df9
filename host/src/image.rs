//! What a module is loaded from: PTX text, or a kernel crate's build
//! output (its PTX and cubin) embedded with [`module_image!`](crate::module_image).
//!
//! Plain data with no device behind it, so the backends that load modules
//! and the public [`Module`](crate::Module) both build on it.

/// A kernel crate's build output as a binary embeds it: its PTX and the
/// cubin `ptxas` made of it for the build's arch (empty when the build
/// found no `ptxas`; see [`crate::build`]). Loading one on a GPU of that
/// arch skips the driver's compile of the PTX (seconds per MB of PTX, the
/// first time on a machine); on another GPU, or with `DOORBELL_LOAD_CUBIN=0`,
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

/// What [`Device::load_module`](crate::Device::load_module) loads: PTX text, or a [`ModuleImage`].
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
