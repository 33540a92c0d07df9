//! PTX modules and kernel handles.

use std::ffi::CString;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};
use doorbell_kernels::Kernel;

use crate::device::{Device, DeviceInner};
use crate::error::{CudaCall, Error, Result};

/// A loaded PTX module (GPU) or the set of kernels linked into this binary
/// (emulator).
pub struct Module {
    device: Device,
    inner: ModuleInner,
}

enum ModuleInner {
    Gpu(Arc<GpuModule>),
    Emu,
}

pub(crate) struct GpuModule {
    module: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: CUmodule handles may be used from any thread with the context bound.
unsafe impl Send for GpuModule {}
// SAFETY: as above.
unsafe impl Sync for GpuModule {}

impl Drop for GpuModule {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded by cuModuleLoadData; unloaded once.
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

/// True when `ptx` is a real module rather than the placeholder the build
/// helper writes when the PTX build was skipped.
pub fn ptx_is_built(ptx: &str) -> bool {
    ptx.contains(".entry") || ptx.contains(".target")
}

impl Device {
    /// Loads `ptx` (e.g. [`crate::KERNELS_PTX`], or a kernel crate's PTX
    /// embedded with `include_str!`). On the emulator nothing is loaded: the
    /// kernels' host code is linked into the binary.
    pub fn load_module(&self, ptx: &str) -> Result<Module> {
        let inner = match &*self.inner {
            DeviceInner::Gpu(ctx) => {
                if !ptx_is_built(ptx) {
                    return Err(Error::PtxNotBuilt);
                }
                self.bind()?;
                let src = CString::new(ptx).map_err(|_| Error::PtxNotBuilt)?;
                // SAFETY: NUL-terminated PTX text; context bound.
                let module = unsafe { result::module::load_data(src.as_ptr() as *const _) }.call("cuModuleLoadData")?;
                ModuleInner::Gpu(Arc::new(GpuModule { module, ctx: ctx.clone() }))
            }
            DeviceInner::Emu(_) => ModuleInner::Emu,
        };
        Ok(Module {
            device: self.clone(),
            inner,
        })
    }
}

impl Module {
    /// The handle of kernel `K`.
    pub fn function<K: Kernel>(&self) -> Result<Function<K>> {
        let inner = match &self.inner {
            ModuleInner::Gpu(m) => {
                let name = CString::new(K::NAME).map_err(|_| Error::KernelNotFound { name: K::NAME })?;
                self.device.bind()?;
                // SAFETY: module loaded in this context.
                let f = unsafe { result::module::get_function(m.module, name) }.map_err(|_| Error::KernelNotFound { name: K::NAME })?;
                FunctionInner::Gpu(GpuFunction { f, _module: m.clone() })
            }
            ModuleInner::Emu => FunctionInner::Emu,
        };
        Ok(Function {
            device: self.device.clone(),
            inner,
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
    pub(crate) inner: FunctionInner,
    _k: PhantomData<fn() -> K>,
}

pub(crate) enum FunctionInner {
    Gpu(GpuFunction),
    Emu,
}

pub(crate) struct GpuFunction {
    f: sys::CUfunction,
    _module: Arc<GpuModule>,
}

// SAFETY: CUfunction handles are usable from any thread with the context bound.
unsafe impl Send for GpuFunction {}
// SAFETY: as above.
unsafe impl Sync for GpuFunction {}

impl GpuFunction {
    pub(crate) fn cu_function(&self) -> sys::CUfunction {
        self.f
    }
}

impl<K: Kernel> Function<K> {
    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Registers, local memory (bytes per thread) and max threads per block,
    /// as the driver reports them (`None` on the emulator).
    pub fn attributes(&self) -> Option<FunctionAttributes> {
        let FunctionInner::Gpu(g) = &self.inner else { return None };
        let get = |a| {
            let mut v = 0i32;
            // SAFETY: valid function handle.
            unsafe { sys::cuFuncGetAttribute(&mut v, a, g.f) }.result().ok().map(|_| v)
        };
        use sys::CUfunction_attribute::*;
        Some(FunctionAttributes {
            registers: get(CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            local_bytes: get(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            max_threads_per_block: get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        })
    }
}

/// What the driver says about a compiled kernel.
#[derive(Clone, Copy, Debug)]
pub struct FunctionAttributes {
    /// Registers per thread.
    pub registers: i32,
    /// Local memory per thread (spills, stack), bytes.
    pub local_bytes: i32,
    /// Largest block the kernel can run with.
    pub max_threads_per_block: i32,
}
