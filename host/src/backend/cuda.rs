//! The GPU backend: everything that talks to the CUDA driver (through
//! cudarc, the driver library loaded at run time): contexts, allocation and
//! copies, streams and events, modules and launches, CUDA IPC and peer
//! access.

use std::ffi::CString;
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};
use doorbell_kernels::KernelArgs;

use crate::error::{CudaCall, Error, Result};
use crate::image::SelectedImage;
use crate::launch::{FunctionAttributes, LaunchConfig};

/// Number of CUDA GPUs; 0 when no driver is present (never panics).
pub fn gpu_count() -> usize {
    if !driver_present() {
        return 0;
    }
    CudaContext::device_count().map(|n| n.max(0) as usize).unwrap_or(0)
}

/// True when the CUDA driver library can be loaded.
pub fn driver_present() -> bool {
    driver_settings();
    // SAFETY: only probes whether the library can be dlopen'd.
    unsafe { sys::is_culib_present() }
}

/// Driver settings for kernels that wait on each other, made before the
/// driver is initialized unless the variable is already set:
/// * `CUDA_MODULE_LOADING=EAGER`: with CUDA's lazy loading (the default
///   since CUDA 12.2) the first launch of a kernel can wait for a running
///   kernel that spins on it. NVSHMEM asks for eager loading too.
/// * `CUDA_DEVICE_MAX_CONNECTIONS=32`: streams share the GPU's hardware
///   work queues (8 by default), and work queued behind a spinning kernel
///   of another stream in the same queue waits for it — on an H200, a rank's
///   host copy waited there for peers' kernels that were waiting for this
///   rank, until their waits ran out. More queues make such sharing rarer,
///   not impossible (it was seen again with 32): ranks sharing a GPU should
///   finish their host copies of a step before any of them launches a
///   kernel that waits for the others (a barrier). The library's host
///   copies go through a stream of their own and pinned memory, never the
///   legacy default stream.
fn driver_settings() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (k, v) in [("CUDA_MODULE_LOADING", "EAGER"), ("CUDA_DEVICE_MAX_CONNECTIONS", "32")] {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
    });
}

/// `DOORBELL_LOAD_CUBIN`: `0` loads modules from their PTX even where a
/// cubin is embedded (the driver compiles it, as for a GPU of another
/// arch); `1` (the default) loads the cubin where the GPU takes it.
pub(crate) const CUBIN_ENV: &str = "DOORBELL_LOAD_CUBIN";
/// The name [`CUBIN_ENV`] had before, still read (with a warning) for one
/// release when the new one is unset.
pub(crate) const CUBIN_ENV_OLD: &str = "DOORBELL_CUBIN";

/// True when `ptx` is a real module rather than the placeholder the build
/// helper writes when the PTX build was skipped.
pub fn ptx_is_built(ptx: &str) -> bool {
    ptx.contains(".entry") || ptx.contains(".target")
}

/// One CUDA context per GPU ordinal for the whole process, shared by every
/// handle (thread ranks on one GPU use one context). cudarc's event tracking
/// is switched off: we never use its `CudaSlice`, and its implicit
/// synchronization (a context-wide synchronize when the first stream is
/// created) would wait for other ranks' spinning kernels.
fn shared_context(ordinal: usize) -> Result<Arc<CudaContext>> {
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

/// A GPU as one [`crate::Device`] handle sees it: the GPU's shared context
/// and the streams created through the handle.
pub(crate) struct Device {
    /// Launches through this handle ([`super::Activity`]).
    pub(crate) activity: Arc<super::Activity>,
    ctx: Arc<CudaContext>,
    /// GPU streams created through this handle: what `synchronize` waits for.
    /// Several handles (e.g. thread ranks) share one CUDA context, so a
    /// context-wide synchronize would wait for other ranks' spinning kernels.
    /// Held strongly: a stream the user dropped with work queued (cudarc
    /// destroys a stream without waiting, and the work runs on) is waited
    /// for too, and let go once that work is done.
    streams: Mutex<Vec<Arc<CudaStream>>>,
    /// Allocations dropped while this handle lives: `cuMemFree` waits for
    /// the whole device, so a rank freeing a buffer while a peer rank's
    /// kernel on the same GPU spins, waiting for this rank's next launch,
    /// would deadlock. They are freed when the handle goes (every rank of a
    /// world is past its collective drop then), or once they exceed
    /// [`DEFERRED_FREE_LIMIT`] bytes.
    deferred: Mutex<(Vec<u64>, usize)>,
    /// The stream of this handle's host copies and memsets (non-blocking,
    /// not waited for by `synchronize`): the legacy default stream's
    /// synchronous copies were seen to wait for other ranks' kernels.
    copier: Arc<CudaStream>,
    /// Pinned host memory ([`STAGING_BYTES`], allocated with the handle)
    /// every host copy goes through, in pieces: a copy to or from pageable
    /// memory is staged by the driver, and pinning memory on the way is an
    /// implicit device-wide synchronization, which would wait for other
    /// ranks' spinning kernels. A DMA between the device and pinned memory
    /// on a non-blocking stream is ordered after that stream's work only.
    /// (It can still queue behind another stream's kernel when both
    /// streams share one of the GPU's hardware work queues: see
    /// `driver_settings`.)
    staging: Mutex<Staging>,
}

/// Bytes of a handle's pinned staging buffer (host copies move in pieces
/// of this size).
pub(crate) const STAGING_BYTES: usize = 8 << 20;

/// A handle's pinned staging buffer (`cuMemHostAlloc`, freed with the
/// handle).
struct Staging(*mut u8);

// SAFETY: plain host memory, used only under the handle's mutex.
unsafe impl Send for Staging {}

impl Drop for Device {
    fn drop(&mut self) {
        self.release_deferred();
        let p = self.staging.get_mut().unwrap_or_else(|p| p.into_inner()).0;
        if !p.is_null() && self.bind().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc in `open`; no copy uses it
            // now (every copy waits for its DMA before returning).
            let _ = unsafe { result::free_host(p as *mut std::ffi::c_void) };
        }
    }
}

/// Bytes of dropped allocations a handle keeps before freeing them anyway.
pub(crate) const DEFERRED_FREE_LIMIT: usize = 4 << 30;

/// What waits for a GPU's persistent kernels (soft NIC engines) to end:
/// `cuModuleUnload` and `cuMemFree` may wait for every kernel of the GPU,
/// and a persistent kernel ends only when told to, so while one runs on a
/// GPU the unloads and frees on that GPU are kept here and made when the
/// last one has stopped ([`PersistentKernel`]'s drop).
#[derive(Default)]
pub(super) struct Persistent {
    running: usize,
    /// Modules (`CUmodule` as an integer) and allocations, with their
    /// context.
    modules: Vec<(usize, Arc<CudaContext>)>,
    memory: Vec<(u64, Arc<CudaContext>)>,
    /// Mapped host allocations (`cuMemHostAlloc`'s pointer as an integer):
    /// `cuMemFreeHost` may wait for the GPU too.
    mapped: Vec<(usize, Arc<CudaContext>)>,
    /// Other releases that may wait for the GPU (the virtual-memory
    /// ranges of `vmm`: `cuMemUnmap`), run first.
    pub(super) later: Vec<Box<dyn FnOnce() + Send>>,
}

static PERSISTENT: Mutex<std::collections::BTreeMap<usize, Persistent>> = Mutex::new(std::collections::BTreeMap::new());

fn persistent() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<usize, Persistent>> {
    PERSISTENT.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a persistent kernel runs on GPU `ordinal` (then `keep` is
/// called to keep what is being released for later).
pub(super) fn defer_while_persistent(ordinal: usize, keep: impl FnOnce(&mut Persistent)) -> bool {
    let mut p = persistent();
    match p.get_mut(&ordinal) {
        Some(e) if e.running > 0 => {
            keep(e);
            true
        }
        _ => false,
    }
}

/// A persistent kernel is running on a GPU (from [`Device::persistent_kernel`]
/// until this is dropped): module unloads and frees on that GPU wait until
/// none runs. Leak it (`mem::forget`) for a kernel that did not stop.
pub(crate) struct PersistentKernel {
    ordinal: usize,
}

impl Drop for PersistentKernel {
    fn drop(&mut self) {
        let (modules, memory, mapped, later) = {
            let mut p = persistent();
            let e = p.entry(self.ordinal).or_default();
            e.running = e.running.saturating_sub(1);
            if e.running > 0 {
                return;
            }
            (
                std::mem::take(&mut e.modules),
                std::mem::take(&mut e.memory),
                std::mem::take(&mut e.mapped),
                std::mem::take(&mut e.later),
            )
        };
        // Released now that no persistent kernel runs.
        for release in later {
            release();
        }
        for (m, ctx) in modules {
            unload_module(&ctx, m as sys::CUmodule);
        }
        for (a, ctx) in memory {
            if ctx.bind_to_thread().is_ok() {
                // SAFETY: allocated by cuMemAlloc in this context, dropped
                // by its buffer, freed once (taken out of the list).
                let _ = unsafe { result::free_sync(a) };
            }
        }
        for (h, ctx) in mapped {
            if ctx.bind_to_thread().is_ok() {
                // SAFETY: allocated by cuMemHostAlloc, dropped by its
                // buffer, freed once (taken out of the list).
                let _ = unsafe { result::free_host(h as *mut std::ffi::c_void) };
            }
        }
    }
}

fn unload_module(ctx: &CudaContext, m: sys::CUmodule) {
    if ctx.bind_to_thread().is_ok() {
        // SAFETY: loaded by cuModuleLoadData; unloaded once.
        let _ = unsafe { result::module::unload(m) };
    }
}

impl Device {
    /// Opens GPU `ordinal` (its primary context).
    pub(crate) fn open(ordinal: usize) -> Result<Device> {
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
        let copier = ctx.new_stream().call("cuStreamCreate")?;
        ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: a context is current; freed in Drop.
        let staging = unsafe { result::malloc_host(STAGING_BYTES, 0) }.call("cuMemHostAlloc")? as *mut u8;
        Ok(Device {
            ctx,
            streams: Mutex::new(Vec::new()),
            deferred: Mutex::new((Vec::new(), 0)),
            copier,
            staging: Mutex::new(Staging(staging)),
            activity: Default::default(),
        })
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    pub(crate) fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "CUDA GPU".into())
    }

    pub(crate) fn compute_capability(&self) -> Option<(i32, i32)> {
        self.ctx.compute_capability().ok()
    }

    pub(crate) fn multiprocessor_count(&self) -> usize {
        self.ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map(|v| v as usize)
            .unwrap_or(1)
    }

    /// Makes the context current on the calling thread (driver calls need it).
    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")
    }

    /// Waits until what was queued on the copy stream has landed.
    fn settle(&self, call: &'static str) -> Result<()> {
        self.copier.synchronize().map_err(|source| Error::Cuda { call, source })
    }

    /// The streams created through this handle, after letting go of those
    /// only this list holds whose work is done.
    fn tracked_streams(&self) -> std::sync::MutexGuard<'_, Vec<Arc<CudaStream>>> {
        let mut list = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|s| Arc::strong_count(s) > 1 || Stream(s.clone()).query().is_ok_and(|done| !done));
        list
    }

    /// Waits for the streams created through this handle, dropped ones
    /// with work queued included; every one, also after a failure (the
    /// first failure is returned).
    pub(crate) fn synchronize(&self) -> Result<()> {
        let mut first = Ok(());
        let streams = self.tracked_streams().clone();
        for s in streams {
            let r = s.synchronize().call("cuStreamSynchronize");
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    pub(crate) fn new_stream(&self) -> Result<Stream> {
        let s = self.ctx.new_stream().call("cuStreamCreate")?;
        self.tracked_streams().push(s.clone());
        Ok(Stream(s))
    }

    /// A (non-blocking) stream [`Device::synchronize`] and `free` do not
    /// wait for: for a persistent kernel that ends only when told to.
    pub(crate) fn new_stream_untracked(&self) -> Result<Stream> {
        Ok(Stream(self.ctx.new_stream().call("cuStreamCreate")?))
    }

    /// Whether a persistent kernel (a soft NIC engine) runs on this GPU.
    pub(crate) fn persistent_running(&self) -> bool {
        persistent().get(&self.ordinal()).is_some_and(|e| e.running > 0)
    }

    /// Declares a persistent kernel on this GPU, until the guard drops
    /// (see [`PersistentKernel`]).
    pub(crate) fn persistent_kernel(&self) -> PersistentKernel {
        let ordinal = self.ordinal();
        persistent().entry(ordinal).or_default().running += 1;
        PersistentKernel { ordinal }
    }

    /// Names the device in allocation errors.
    pub(crate) fn memory_label(&self) -> String {
        format!("GPU {}", self.ordinal())
    }

    /// A failed driver allocation: out-of-memory becomes [`Error::OutOfMemory`],
    /// anything else stays the driver call's error.
    fn alloc_error(&self, e: DriverError, call: &'static str, bytes: usize) -> Error {
        if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
            Error::OutOfMemory {
                bytes: bytes as u64,
                device: self.memory_label(),
                detail: format!("{call} failed: {e}"),
            }
        } else {
            Error::Cuda { call, source: e }
        }
    }

    /// `bytes` (non-zero) of zeroed device memory.
    pub(crate) fn alloc_zeroed(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        // SAFETY: context bound; the allocation is freed by `free` when its buffer drops.
        let p = unsafe { result::malloc_sync(bytes) }.map_err(|e| self.alloc_error(e, "cuMemAlloc", bytes))?;
        // SAFETY: `p` spans `bytes` bytes.
        if let Err(e) = unsafe { result::memset_d8_async(p, 0, bytes, self.copier.cu_stream()) } {
            // SAFETY: just allocated, not handed out.
            let _ = unsafe { result::free_sync(p) };
            return Err(Error::Cuda {
                call: "cuMemsetD8",
                source: e,
            });
        }
        if let Err(e) = self.settle("cuStreamSynchronize (after cuMemsetD8Async)") {
            // SAFETY: just allocated, not handed out.
            let _ = unsafe { result::free_sync(p) };
            return Err(e);
        }
        Ok(p)
    }

    /// Frees what [`Device::alloc_zeroed`] returned, once this handle's
    /// work is done (its streams are synchronized, as `cudaFree` would wait,
    /// but not for other handles' kernels): the memory itself is released
    /// later (see `deferred`).
    ///
    /// # Safety
    /// `addr` came from `alloc_zeroed` on this device and is freed once.
    pub(crate) unsafe fn free(&self, addr: u64, bytes: usize) {
        let _ = self.synchronize();
        let over = {
            let mut d = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
            d.0.push(addr);
            d.1 += bytes;
            d.1 > DEFERRED_FREE_LIMIT
        };
        if over {
            self.release_deferred();
        }
    }

    /// `cuMemFree`s the deferred allocations (waits for the whole device).
    fn release_deferred(&self) {
        let addrs = std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|p| p.into_inner()));
        if addrs.0.is_empty() || self.bind().is_err() {
            return;
        }
        let ctx = self.ctx.clone();
        if defer_while_persistent(self.ordinal(), |e| e.memory.extend(addrs.0.iter().map(|&a| (a, ctx.clone())))) {
            return;
        }
        for a in addrs.0 {
            // SAFETY: allocated by cuMemAlloc in this context, dropped by its
            // buffer, freed once (taken out of the list).
            let _ = unsafe { result::free_sync(a) };
        }
    }

    /// Sets `bytes` at `addr` to zero.
    ///
    /// # Safety
    /// `addr..addr+bytes` is device memory of this device.
    pub(crate) unsafe fn zero(&self, addr: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller vouches that the allocation spans `bytes`.
        unsafe { result::memset_d8_async(addr, 0, bytes, self.copier.cu_stream()) }.call("cuMemsetD8Async")?;
        self.settle("cuStreamSynchronize (after cuMemsetD8Async)")
    }

    /// `bytes` of zeroed pinned host memory mapped into the device: its host
    /// and device addresses.
    pub(crate) fn alloc_mapped(&self, bytes: usize) -> Result<(*mut u8, u64)> {
        self.bind()?;
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: context bound; freed by `free_mapped` when its buffer drops.
        let h = unsafe { result::malloc_host(bytes, flags) }.map_err(|e| self.alloc_error(e, "cuMemHostAlloc", bytes))?;
        // SAFETY: `h` spans `bytes`.
        unsafe { std::ptr::write_bytes(h as *mut u8, 0, bytes) };
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: `h` was allocated with DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, h, 0) }
            .result()
            .call("cuMemHostGetDevicePointer")?;
        Ok((h as *mut u8, d))
    }

    /// Frees what [`Device::alloc_mapped`] returned.
    ///
    /// # Safety
    /// `host` came from `alloc_mapped` on this device and is freed once.
    pub(crate) unsafe fn free_mapped(&self, host: *mut u8) {
        let ctx = self.ctx.clone();
        if defer_while_persistent(self.ordinal(), |e| e.mapped.push((host as usize, ctx))) {
            return;
        }
        if self.bind().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc; freed once.
            let _ = unsafe { result::free_host(host as *mut _) };
        }
    }

    /// Copies host bytes to device address `addr` (synchronous).
    ///
    /// # Safety
    /// `addr..addr+src.len()` is device memory of this device.
    pub(crate) unsafe fn write(&self, addr: u64, src: &[u8]) -> Result<()> {
        self.bind()?;
        let st = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        for (i, piece) in src.chunks(STAGING_BYTES).enumerate() {
            // SAFETY: the staging buffer holds STAGING_BYTES >= piece.len()
            // bytes, used by this copy alone (the lock), and the previous
            // piece's DMA has landed (settle).
            let buf = unsafe { std::slice::from_raw_parts_mut(st.0, piece.len()) };
            buf.copy_from_slice(piece);
            // SAFETY: the caller vouches for the destination range.
            unsafe { result::memcpy_htod_async(addr + (i * STAGING_BYTES) as u64, &*buf, self.copier.cu_stream()) }
                .call("cuMemcpyHtoDAsync")?;
            self.settle("cuStreamSynchronize (after cuMemcpyHtoDAsync)")?;
        }
        Ok(())
    }

    /// Copies device bytes at `addr` to the host (synchronous).
    ///
    /// # Safety
    /// `addr..addr+dst.len()` is device memory of this device.
    pub(crate) unsafe fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        self.bind()?;
        let st = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        for (i, piece) in dst.chunks_mut(STAGING_BYTES).enumerate() {
            // SAFETY: as in `write`.
            let buf = unsafe { std::slice::from_raw_parts_mut(st.0, piece.len()) };
            // SAFETY: the caller vouches for the source range.
            unsafe { result::memcpy_dtoh_async(&mut *buf, addr + (i * STAGING_BYTES) as u64, self.copier.cu_stream()) }
                .call("cuMemcpyDtoHAsync")?;
            self.settle("cuStreamSynchronize (after cuMemcpyDtoHAsync)")?;
            piece.copy_from_slice(buf);
        }
        Ok(())
    }

    /// Loads PTX text (or its cubin) into this context.
    pub(crate) fn load_module(&self, src: SelectedImage<'_>) -> Result<Arc<Module>> {
        let ptx = src.ptx;
        if !ptx_is_built(ptx) {
            return Err(Error::PtxNotBuilt);
        }
        self.bind()?;
        if persistent().get(&self.ordinal()).is_some_and(|e| e.running > 0) {
            // cuModuleLoadData waits for the GPU's running kernels, and the
            // soft NIC's engine kernel runs until its teardown.
            return Err(Error::Comm(format!(
                "GPU {}: a module cannot be loaded while the soft NIC engine kernel runs on this GPU (the load would wait for it forever): load every module before the IBGDA transport is set up (the first Communicator::ibgda, routed or an all-reduce over them), or after the communicator is gone",
                self.ordinal()
            )));
        }
        if let Some(module) = self.load_cubin(src.cubin)? {
            return Ok(Arc::new(Module {
                module,
                ctx: self.ctx.clone(),
            }));
        }
        let src = CString::new(ptx).map_err(|_| Error::PtxNotBuilt)?;
        tracing::debug!(
            "GPU {}: loading a module of {} bytes of PTX (the driver compiles it the first time: seconds per MB)",
            self.ordinal(),
            ptx.len()
        );
        let t0 = std::time::Instant::now();
        // SAFETY: NUL-terminated PTX text; context bound.
        let module = unsafe { result::module::load_data(src.as_ptr() as *const _) }.call("cuModuleLoadData")?;
        // The driver compiles the PTX here (seconds for a large module, the
        // first time; its cache serves later loads).
        tracing::debug!(
            "GPU {}: loaded a module of {} bytes of PTX in {} ms",
            self.ordinal(),
            ptx.len(),
            t0.elapsed().as_millis()
        );
        Ok(Arc::new(Module {
            module,
            ctx: self.ctx.clone(),
        }))
    }

    /// `cubin` loaded as a module, when there is one, `DOORBELL_LOAD_CUBIN` does
    /// not say `0`, and the driver takes it (a cubin for another arch it
    /// refuses: then `None`, and the caller loads the PTX).
    fn load_cubin(&self, cubin: &[u8]) -> Result<Option<sys::CUmodule>> {
        if cubin.is_empty() || !crate::vars::flag_renamed(CUBIN_ENV, CUBIN_ENV_OLD, true)? {
            return Ok(None);
        }
        let t0 = std::time::Instant::now();
        // An 8-byte aligned copy (`include_bytes!` promises no alignment;
        // the driver reads the ELF headers in place).
        let mut image = vec![0u64; cubin.len().div_ceil(8)];
        // SAFETY: `image` holds at least `cubin.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(cubin.as_ptr(), image.as_mut_ptr() as *mut u8, cubin.len()) };
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is a whole ELF image the driver reads at this
        // address (it needs no length); the context is bound.
        let r = unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const _) }.result();
        match r {
            Ok(()) => {
                tracing::debug!(
                    "GPU {}: loaded a module from its cubin ({} bytes) in {} ms",
                    self.ordinal(),
                    cubin.len(),
                    t0.elapsed().as_millis()
                );
                Ok(Some(module))
            }
            Err(e) => {
                tracing::debug!(
                    "GPU {}: the driver refused the module's cubin ({e:?}); loading its PTX",
                    self.ordinal()
                );
                Ok(None)
            }
        }
    }

    /// The GPU's UUID in hex (empty when the driver does not say).
    pub(crate) fn uuid(&self) -> String {
        self.ctx
            .uuid()
            .map(|u| u.bytes.iter().map(|b| format!("{:02x}", *b as u8)).collect())
            .unwrap_or_default()
    }

    /// The CUDA IPC handle of the allocation at `addr`, for another process
    /// to open with [`Device::ipc_open`].
    pub(crate) fn ipc_export(&self, addr: u64) -> Result<[u8; IPC_HANDLE_BYTES]> {
        let mut ipc = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        self.bind()?;
        // SAFETY: `addr` is a cuMemAlloc allocation of this context (the caller's heap).
        unsafe { sys::cuIpcGetMemHandle(ipc.as_mut_ptr(), addr) }
            .result()
            .call("cuIpcGetMemHandle")?;
        // SAFETY: initialized by the call above (zeroed before).
        let ipc = unsafe { ipc.assume_init() };
        // SAFETY: CUipcMemHandle is 64 plain bytes.
        let bytes: [u8; IPC_HANDLE_BYTES] = unsafe { std::mem::transmute(ipc) };
        Ok(bytes)
    }

    /// Opens the allocation another process exported with
    /// [`Device::ipc_export`], and checks that it spans at least `need`
    /// bytes from the opened address (the peer's claim of its size is not
    /// trusted: the driver's `cuMemGetAddressRange` of the mapping is).
    /// `rank`, `peer` and `peer_ordinal` (the GPU the peer runs on) only
    /// describe the failure.
    pub(crate) fn ipc_open(
        &self,
        handle: &[u8; IPC_HANDLE_BYTES],
        need: u64,
        (peer_ordinal, rank, peer): (u32, usize, usize),
    ) -> Result<IpcMapping> {
        let mut ipc = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        // SAFETY: CUipcMemHandle is 64 plain bytes.
        unsafe { std::ptr::copy_nonoverlapping(handle.as_ptr(), ipc.as_mut_ptr() as *mut u8, IPC_HANDLE_BYTES) };
        let mut dptr: sys::CUdeviceptr = 0;
        self.bind()?;
        // SAFETY: a handle exported by the peer process for its heap.
        let r = unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut dptr,
                ipc.assume_init(),
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }
        .result();
        if let Err(e) = r {
            return Err(Error::PeerUnreachable {
                rank,
                peer,
                reason: format!(
                    "cuIpcOpenMemHandle failed ({e:?}); its GPU {} may not be peer-accessible from GPU {}",
                    peer_ordinal,
                    self.ordinal()
                ),
            });
        }
        // Closed on drop, also when the check below refuses it.
        let mapping = IpcMapping {
            ctx: self.ctx.clone(),
            ptr: dptr,
        };
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: a plain query of an address this context just mapped.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, dptr) }
            .result()
            .call("cuMemGetAddressRange")?;
        let usable = (base + size as u64).saturating_sub(dptr);
        if usable < need {
            return Err(Error::PeerUnreachable {
                rank,
                peer,
                reason: format!(
                    "its CUDA IPC heap handle maps {usable} bytes, fewer than the {need} this rank will touch \
                     (heap and tables); the peer claims a heap it did not export"
                ),
            });
        }
        Ok(mapping)
    }

    /// Lets this context access GPU `peer_ordinal`'s memory (NVLink/PCIe).
    /// `rank` and `peer` only describe the failure.
    pub(crate) fn enable_peer_access(&self, peer_ordinal: usize, rank: usize, peer: usize) -> Result<()> {
        let ctx = &self.ctx;
        let mut can = 0i32;
        // SAFETY: plain queries.
        unsafe {
            let mut peer_dev: sys::CUdevice = 0;
            sys::cuDeviceGet(&mut peer_dev, peer_ordinal as i32).result().call("cuDeviceGet")?;
            sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), peer_dev)
                .result()
                .call("cuDeviceCanAccessPeer")?;
        }
        if can == 0 {
            return Err(Error::PeerUnreachable {
                rank,
                peer,
                reason: format!(
                    "GPU {} cannot access GPU {peer_ordinal} (no NVLink/PCIe peer access)",
                    ctx.ordinal()
                ),
            });
        }
        self.require_peer_atomics(peer_ordinal, rank, peer)?;
        let peer_ctx = shared_context(peer_ordinal)?;
        self.bind()?;
        // SAFETY: both contexts are live primary contexts.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx.cu_ctx(), 0) };
        match r {
            sys::cudaError_enum::CUDA_SUCCESS | sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            e => Err(Error::PeerUnreachable {
                rank,
                peer,
                reason: format!("cuCtxEnablePeerAccess failed: {e:?}"),
            }),
        }
    }
}

impl Device {
    /// Signals with `SignalOp::Add` into a peer GPU's memory are `atom.add`
    /// at system scope: they need native atomics between the pair (NVLink
    /// has them; PCIe may not). A pair without them is refused, naming it;
    /// a driver that cannot answer the query is logged and trusted.
    pub(crate) fn require_peer_atomics(&self, peer_ordinal: usize, rank: usize, peer: usize) -> Result<()> {
        let mut native = 0i32;
        // SAFETY: plain queries.
        let r = unsafe {
            let mut peer_dev: sys::CUdevice = 0;
            sys::cuDeviceGet(&mut peer_dev, peer_ordinal as i32).result().and_then(|()| {
                sys::cuDeviceGetP2PAttribute(
                    &mut native,
                    sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                    self.ctx.cu_device(),
                    peer_dev,
                )
                .result()
            })
        };
        match r {
            Ok(()) if native == 0 => Err(Error::PeerUnreachable {
                rank,
                peer,
                reason: format!(
                    "GPU {} and GPU {peer_ordinal} have no native peer atomics (a PCIe pair without them): \
                     signals that add into the peer's memory would not be atomic; put the ranks on GPUs \
                     joined by NVLink, or one rank per process on the same GPU",
                    self.ctx.ordinal()
                ),
            }),
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::warn!(
                    "cannot ask whether GPU {} and GPU {peer_ordinal} have native peer atomics ({e:?}); assuming they do",
                    self.ctx.ordinal()
                );
                Ok(())
            }
        }
    }
}

/// Bytes of a CUDA IPC handle (`CUipcMemHandle`).
pub(crate) const IPC_HANDLE_BYTES: usize = 64;
const _: () = assert!(std::mem::size_of::<sys::CUipcMemHandle>() == IPC_HANDLE_BYTES);

/// A peer process's allocation opened through CUDA IPC; closed on drop.
pub(crate) struct IpcMapping {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
}

impl IpcMapping {
    /// The allocation's address in this context.
    pub(crate) fn as_raw(&self) -> u64 {
        self.ptr
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: opened by cuIpcOpenMemHandle; closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

/// A CUDA stream.
pub(crate) struct Stream(Arc<CudaStream>);

impl Stream {
    pub(crate) fn as_cuda(&self) -> &Arc<CudaStream> {
        &self.0
    }

    /// Enqueues `f` with `args`.
    ///
    /// # Safety
    /// `f` is the entry point whose parameters `A` describes (the `#[kernel]`
    /// macro derived both from one signature), and the values satisfy the
    /// kernel's contract.
    pub(crate) unsafe fn launch<A: KernelArgs>(&self, f: &Function, cfg: &LaunchConfig, args: A) -> Result<()> {
        self.0.context().bind_to_thread().call("cuCtxSetCurrent")?;
        let mut args = args;
        let mut params = args.param_ptrs();
        let (grid, block) = (cfg.grid, cfg.block);
        if cfg.shared_mem_bytes > 48 * 1024 {
            // Over 48 KiB the driver refuses the launch unless the limit is raised.
            let limit = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            // SAFETY: a valid function handle; a plain attribute.
            let set = unsafe { sys::cuFuncSetAttribute(f.f, limit, cfg.shared_mem_bytes as i32) };
            set.result().call("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")?;
        }
        if !cfg.overlap_previous {
            // SAFETY: `params` points at the fields of `args`, matching the
            // entry point's parameters (the #[kernel] macro derived both from
            // one signature); the caller vouches for their values.
            return unsafe { result::launch_kernel(f.f, grid, block, cfg.shared_mem_bytes, self.0.cu_stream(), &mut params) }
                .call("cuLaunchKernel");
        }
        // Programmatic stream serialization: the kernel may begin while the
        // previous one on the stream runs; it waits for it in
        // `griddepcontrol.wait` (`ptx::wait_prior_grids`).
        // SAFETY: a plain C union of integers; zero is a valid value.
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.0.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: as above; `config` and `attr` outlive the call.
        unsafe { sys::cuLaunchKernelEx(&config, f.f, params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .call("cuLaunchKernelEx")
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.0.synchronize().call("cuStreamSynchronize")
    }

    /// `cuStreamQuery`: whether everything enqueued has finished; a fault
    /// a kernel hit is the error.
    pub(crate) fn query(&self) -> Result<bool> {
        self.0.context().bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: a live stream of the context just bound.
        match unsafe { sys::cuStreamQuery(self.0.cu_stream()) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => e.result().call("cuStreamQuery").map(|_| false),
        }
    }

    pub(crate) fn record(&self) -> Result<Event> {
        let e = self
            .0
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .call("cuEventCreate")?;
        e.record(&self.0).call("cuEventRecord")?;
        Ok(Event(e))
    }
}

/// A CUDA event.
pub(crate) struct Event(CudaEvent);

impl Event {
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.0.synchronize().call("cuEventSynchronize")
    }

    pub(crate) fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.0.elapsed_ms(&end.0).call("cuEventElapsedTime")
    }
}

/// A loaded PTX module; unloaded when its last function is gone.
pub(crate) struct Module {
    module: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: CUmodule handles may be used from any thread with the context bound.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        let (m, ctx) = (self.module as usize, self.ctx.clone());
        if !defer_while_persistent(self.ctx.ordinal(), |e| e.modules.push((m, ctx))) {
            unload_module(&self.ctx, self.module);
        }
    }
}

impl Module {
    /// The entry point `name`.
    pub(crate) fn function(self: &Arc<Self>, name: &'static str) -> Result<Function> {
        let c_name = CString::new(name).map_err(|_| Error::KernelNotFound { name })?;
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: module loaded in this context.
        let f = unsafe { result::module::get_function(self.module, c_name) }.map_err(|_| Error::KernelNotFound { name })?;
        Ok(Function { f, _module: self.clone() })
    }
}

/// A kernel entry point; keeps its module loaded.
pub(crate) struct Function {
    f: sys::CUfunction,
    _module: Arc<Module>,
}

// SAFETY: CUfunction handles are usable from any thread with the context bound.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    pub(crate) fn attributes(&self) -> Option<FunctionAttributes> {
        let get = |a| {
            let mut v = 0i32;
            // SAFETY: valid function handle.
            unsafe { sys::cuFuncGetAttribute(&mut v, a, self.f) }.result().ok().map(|_| v)
        };
        use sys::CUfunction_attribute::*;
        Some(FunctionAttributes {
            registers: get(CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            local_bytes: get(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            max_threads_per_block: get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        })
    }
}
