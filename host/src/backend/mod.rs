//! The backends behind the public types: [`cuda`] (a GPU through the CUDA
//! driver) and [`emu`] (the CPU emulator).
//!
//! Every difference between a GPU and the emulator lives in one of those two
//! modules. The public types ([`crate::Device`], [`crate::Stream`],
//! [`crate::Event`], [`crate::Module`], [`crate::Function`], the buffers)
//! hold one of the enums below and call its methods; this file is the only
//! place that matches on the backend, each method once.
//!
//! Why enums rather than trait objects (`dyn DeviceBackend`):
//! - the set of backends is closed (two), and known here;
//! - some operations take two objects that must come from the same backend
//!   (a function launched on a stream, the time between two events): an
//!   enum matches the pair once, where a trait would downcast through `Any`;
//! - a launch is generic over the kernel (its argument type, and on the
//!   emulator the kernel's Rust body), which an object-safe trait could take
//!   only by boxing the arguments and an emulator closure on every GPU
//!   launch.
//!
//! This module depends only on [`crate::error`], the environment's parsers
//! and the plain launch descriptions (`LaunchConfig`, `ModuleSource`), never
//! on the public-type modules, so those import it without cycles.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use doorbell_kernels::Kernel;

use crate::error::{Error, Result};
use crate::image::ModuleSource;
use crate::launch::{FunctionAttributes, LaunchConfig};

pub(crate) mod cuda;
pub(crate) mod cuda_probe;
pub(crate) mod emu;
pub(crate) mod vmm;

pub(crate) use cuda::{IpcMapping, IPC_HANDLE_BYTES};
pub(crate) use vmm::{VmmRange, VMM_ALIGN};

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
        match crate::vars::raw("DOORBELL_DEVICE")? {
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

/// A device handle's backend.
pub(crate) enum DeviceBackend {
    Cuda(cuda::Device),
    Emu(emu::Device),
}

impl DeviceBackend {
    /// The backend (never `Auto`).
    pub(crate) fn kind(&self) -> Backend {
        match self {
            DeviceBackend::Cuda(_) => Backend::Gpu,
            DeviceBackend::Emu(_) => Backend::Cpu,
        }
    }

    /// Launches through this handle ([`Activity`]).
    pub(crate) fn activity(&self) -> &std::sync::Arc<Activity> {
        match self {
            DeviceBackend::Cuda(d) => &d.activity,
            DeviceBackend::Emu(d) => &d.activity,
        }
    }

    pub(crate) fn ordinal(&self) -> usize {
        match self {
            DeviceBackend::Cuda(d) => d.ordinal(),
            DeviceBackend::Emu(d) => d.ordinal(),
        }
    }

    pub(crate) fn name(&self) -> String {
        match self {
            DeviceBackend::Cuda(d) => d.name(),
            DeviceBackend::Emu(d) => d.name(),
        }
    }

    pub(crate) fn compute_capability(&self) -> Option<(i32, i32)> {
        match self {
            DeviceBackend::Cuda(d) => d.compute_capability(),
            DeviceBackend::Emu(_) => None,
        }
    }

    pub(crate) fn multiprocessor_count(&self) -> usize {
        match self {
            DeviceBackend::Cuda(d) => d.multiprocessor_count(),
            DeviceBackend::Emu(d) => d.multiprocessor_count(),
        }
    }

    /// Waits for the streams created through this handle.
    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            DeviceBackend::Cuda(d) => d.synchronize(),
            DeviceBackend::Emu(d) => d.synchronize(),
        }
    }

    /// Waits for the streams created through this handle without consuming
    /// a kernel failure (CUDA keeps its own sticky errors; the emulator keeps
    /// its failure for the user's next synchronize): for internal waits
    /// before memory is freed.
    pub(crate) fn wait_idle(&self) {
        match self {
            DeviceBackend::Cuda(d) => {
                let _ = d.synchronize();
            }
            DeviceBackend::Emu(d) => d.wait_idle(),
        }
    }

    pub(crate) fn as_cuda(&self) -> Option<&Arc<CudaContext>> {
        match self {
            DeviceBackend::Cuda(d) => Some(d.context()),
            DeviceBackend::Emu(_) => None,
        }
    }

    pub(crate) fn new_stream(&self) -> Result<StreamBackend> {
        match self {
            DeviceBackend::Cuda(d) => d.new_stream().map(StreamBackend::Cuda),
            DeviceBackend::Emu(d) => d.new_stream().map(StreamBackend::Emu),
        }
    }

    /// A stream that [`DeviceBackend::synchronize`] does not wait for.
    pub(crate) fn new_stream_untracked(&self) -> Result<StreamBackend> {
        match self {
            DeviceBackend::Cuda(d) => d.new_stream_untracked().map(StreamBackend::Cuda),
            DeviceBackend::Emu(d) => d.new_stream_untracked().map(StreamBackend::Emu),
        }
    }

    /// Declares a persistent kernel (one that ends only when told to) on
    /// this device until the guard drops: meanwhile module unloads and
    /// memory frees on the GPU, which would wait for it, are postponed
    /// until it has stopped. Nothing to do on the emulator.
    pub(crate) fn persistent_kernel(&self) -> Option<cuda::PersistentKernel> {
        match self {
            DeviceBackend::Cuda(d) => Some(d.persistent_kernel()),
            DeviceBackend::Emu(_) => None,
        }
    }

    pub(crate) fn load_module(&self, src: ModuleSource<'_>) -> Result<ModuleBackend> {
        match self {
            // The traced image only when tracing is requested (crate::image).
            DeviceBackend::Cuda(d) => {
                let image = crate::image::select_for_load(&src, crate::image::tracing_requested());
                tracing::debug!("{}: loading {} ({:?} image)", d.memory_label(), src.name(), image.choice);
                d.load_module(image).map(ModuleBackend::Cuda)
            }
            // Nothing to load: the kernels' host code is linked into the binary.
            DeviceBackend::Emu(_) => Ok(ModuleBackend::Emu),
        }
    }

    /// Names the device in allocation errors.
    pub(crate) fn memory_label(&self) -> String {
        match self {
            DeviceBackend::Cuda(d) => d.memory_label(),
            DeviceBackend::Emu(_) => emu::MEMORY_LABEL.into(),
        }
    }

    /// `bytes` (non-zero) of zeroed device memory; its device address.
    pub(crate) fn alloc_zeroed(&self, bytes: usize) -> Result<u64> {
        match self {
            DeviceBackend::Cuda(d) => d.alloc_zeroed(bytes),
            DeviceBackend::Emu(d) => d.alloc_zeroed(bytes),
        }
    }

    /// Frees an allocation of [`DeviceBackend::alloc_zeroed`]; waits for the
    /// device's outstanding work first, like `cudaFree`.
    ///
    /// # Safety
    /// `addr` came from `alloc_zeroed(bytes)` on this device and is freed once.
    pub(crate) unsafe fn free(&self, addr: u64, bytes: usize) {
        match self {
            // SAFETY: the caller passes an allocation of this device, once.
            DeviceBackend::Cuda(d) => unsafe { d.free(addr, bytes) },
            // SAFETY: as above.
            DeviceBackend::Emu(d) => unsafe { d.free(addr, bytes) },
        }
    }

    /// Sets `bytes` at `addr` to zero (synchronous).
    ///
    /// # Safety
    /// `addr..addr+bytes` is device memory of this device.
    pub(crate) unsafe fn zero(&self, addr: u64, bytes: usize) -> Result<()> {
        match self {
            // SAFETY: the caller vouches for the range.
            DeviceBackend::Cuda(d) => unsafe { d.zero(addr, bytes) },
            // SAFETY: as above.
            DeviceBackend::Emu(d) => unsafe { d.zero(addr, bytes) },
        }
    }

    /// `bytes` (non-zero) of zeroed host memory the device can address: its
    /// host and device addresses.
    pub(crate) fn alloc_mapped(&self, bytes: usize) -> Result<(*mut u8, u64)> {
        match self {
            DeviceBackend::Cuda(d) => d.alloc_mapped(bytes),
            DeviceBackend::Emu(d) => d.alloc_mapped(bytes),
        }
    }

    /// Frees an allocation of [`DeviceBackend::alloc_mapped`].
    ///
    /// # Safety
    /// `host` came from `alloc_mapped(bytes)` on this device, the device no
    /// longer uses it, and it is freed once.
    pub(crate) unsafe fn free_mapped(&self, host: *mut u8, bytes: usize) {
        match self {
            // SAFETY: the caller passes an allocation of this device, once.
            DeviceBackend::Cuda(d) => unsafe { d.free_mapped(host) },
            // SAFETY: as above.
            DeviceBackend::Emu(d) => unsafe { d.free_mapped(host, bytes) },
        }
    }

    /// Copies host bytes to device address `addr` (synchronous).
    ///
    /// # Safety
    /// `addr..addr+src.len()` is device memory of this device.
    pub(crate) unsafe fn write(&self, addr: u64, src: &[u8]) -> Result<()> {
        match self {
            // SAFETY: the caller vouches for the range.
            DeviceBackend::Cuda(d) => unsafe { d.write(addr, src) },
            // SAFETY: as above.
            DeviceBackend::Emu(d) => unsafe { d.write(addr, src) },
        }
    }

    /// Copies device bytes at `addr` to the host (synchronous).
    ///
    /// # Safety
    /// `addr..addr+dst.len()` is device memory of this device.
    pub(crate) unsafe fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        match self {
            // SAFETY: the caller vouches for the range.
            DeviceBackend::Cuda(d) => unsafe { d.read(addr, dst) },
            // SAFETY: as above.
            DeviceBackend::Emu(d) => unsafe { d.read(addr, dst) },
        }
    }

    /// The GPU's UUID in hex (empty when the driver does not say), or "cpu".
    pub(crate) fn uuid(&self) -> String {
        match self {
            DeviceBackend::Cuda(d) => d.uuid(),
            DeviceBackend::Emu(_) => "cpu".to_string(),
        }
    }

    /// The CUDA IPC handle of the allocation at `addr` (GPU only: emulator
    /// ranks of several processes share heaps through shared memory files).
    pub(crate) fn ipc_export(&self, addr: u64) -> Result<[u8; IPC_HANDLE_BYTES]> {
        match self {
            DeviceBackend::Cuda(d) => d.ipc_export(addr),
            DeviceBackend::Emu(_) => Err(no_ipc()),
        }
    }

    /// Opens an allocation another process exported with
    /// [`DeviceBackend::ipc_export`] and checks that the mapping spans `need`
    /// bytes; `peer_ordinal`, `rank` and `peer` only describe the failure.
    pub(crate) fn ipc_open(
        &self,
        handle: &[u8; IPC_HANDLE_BYTES],
        need: u64,
        peer_ordinal: u32,
        rank: usize,
        peer: usize,
    ) -> Result<IpcMapping> {
        match self {
            DeviceBackend::Cuda(d) => d.ipc_open(handle, need, (peer_ordinal, rank, peer)),
            DeviceBackend::Emu(_) => Err(no_ipc()),
        }
    }

    /// Why this device cannot share a heap whose parts peers map with
    /// their own access ([`vmm`]), or `None` when it can.
    pub(crate) fn vmm_unshareable(&self) -> Option<String> {
        match self {
            DeviceBackend::Cuda(d) => d.vmm_unshareable(),
            DeviceBackend::Emu(_) => Some(no_ipc().to_string()),
        }
    }

    /// Zeroed, exportable parts of the given lengths in one range ([`vmm`]).
    pub(crate) fn vmm_alloc(&self, parts: &[u64]) -> Result<VmmRange> {
        match self {
            DeviceBackend::Cuda(d) => d.vmm_alloc(parts),
            DeviceBackend::Emu(_) => Err(no_ipc()),
        }
    }

    /// Maps the parts another process exported, read-only from part
    /// `read_only_from` on ([`vmm`]).
    pub(crate) fn vmm_import(
        &self,
        fds: &[std::os::fd::OwnedFd],
        parts: &[u64],
        read_only_from: usize,
        who: (u32, usize, usize),
    ) -> Result<VmmRange> {
        match self {
            DeviceBackend::Cuda(d) => d.vmm_import(fds, parts, read_only_from, who),
            DeviceBackend::Emu(_) => Err(no_ipc()),
        }
    }

    /// Lets this device access device `peer_ordinal`'s memory. On the
    /// emulator every "device" is host memory already: nothing to do.
    pub(crate) fn enable_peer_access(&self, peer_ordinal: usize, rank: usize, peer: usize) -> Result<()> {
        match self {
            DeviceBackend::Cuda(d) => d.enable_peer_access(peer_ordinal, rank, peer),
            DeviceBackend::Emu(_) => Ok(()),
        }
    }
}

fn no_ipc() -> Error {
    Error::comm("CUDA IPC needs a GPU; emulator ranks in several processes share their heaps through shared memory")
}

/// A stream's backend.
pub(crate) enum StreamBackend {
    Cuda(cuda::Stream),
    Emu(emu::Stream),
}

impl StreamBackend {
    /// Enqueues kernel `K` (`f`) with `args`.
    ///
    /// # Safety
    /// `f` is `K`'s entry point and the arguments satisfy the kernel's
    /// contract (valid device pointers of the sizes it reads and writes,
    /// alive until the launch completes).
    pub(crate) unsafe fn launch<K: Kernel>(&self, f: &FunctionBackend, cfg: &LaunchConfig, args: K::Args) -> Result<()> {
        match (self, f) {
            // SAFETY: `f` is K's entry point and K::Args its parameters; the
            // caller vouches for their values.
            (StreamBackend::Cuda(s), FunctionBackend::Cuda(f)) => unsafe { s.launch(f, cfg, args) },
            // SAFETY: the caller vouches for the arguments.
            (StreamBackend::Emu(s), FunctionBackend::Emu) => unsafe { s.launch::<K>(cfg.grid, cfg.block, cfg.shared_mem_bytes, args) },
            _ => Err(Error::DeviceMismatch("kernel and stream belong to different backends")),
        }
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            StreamBackend::Cuda(s) => s.synchronize(),
            StreamBackend::Emu(s) => s.synchronize(),
        }
    }

    /// Whether everything enqueued has finished, without waiting; a
    /// failure a kernel hit is the error.
    pub(crate) fn query(&self) -> Result<bool> {
        match self {
            StreamBackend::Cuda(s) => s.query(),
            StreamBackend::Emu(s) => s.query(),
        }
    }

    pub(crate) fn record(&self) -> Result<EventBackend> {
        match self {
            StreamBackend::Cuda(s) => s.record().map(EventBackend::Cuda),
            StreamBackend::Emu(s) => s.record().map(EventBackend::Emu),
        }
    }

    pub(crate) fn as_cuda(&self) -> Option<&Arc<CudaStream>> {
        match self {
            StreamBackend::Cuda(s) => Some(s.as_cuda()),
            StreamBackend::Emu(_) => None,
        }
    }
}

/// An event's backend.
pub(crate) enum EventBackend {
    Cuda(cuda::Event),
    Emu(emu::Event),
}

impl EventBackend {
    pub(crate) fn synchronize(&self) -> Result<()> {
        match self {
            EventBackend::Cuda(e) => e.synchronize(),
            EventBackend::Emu(e) => e.synchronize(),
        }
    }

    /// Milliseconds from `self` to `end`; both already synchronized.
    pub(crate) fn elapsed_ms(&self, end: &EventBackend) -> Result<f32> {
        match (self, end) {
            (EventBackend::Cuda(a), EventBackend::Cuda(b)) => a.elapsed_ms(b),
            (EventBackend::Emu(a), EventBackend::Emu(b)) => a.elapsed_ms(b),
            _ => Err(Error::DeviceMismatch("events from different backends")),
        }
    }
}

/// A module's backend: a loaded PTX module, or nothing on the emulator
/// (kernels are linked into the binary).
pub(crate) enum ModuleBackend {
    Cuda(Arc<cuda::Module>),
    Emu,
}

impl ModuleBackend {
    /// The kernel named `name`.
    pub(crate) fn function(&self, name: &'static str) -> Result<FunctionBackend> {
        match self {
            ModuleBackend::Cuda(m) => m.function(name).map(FunctionBackend::Cuda),
            ModuleBackend::Emu => Ok(FunctionBackend::Emu),
        }
    }
}

/// A kernel handle's backend: an entry point, or nothing on the emulator
/// (the launch runs the kernel's Rust body, named by its type).
pub(crate) enum FunctionBackend {
    Cuda(cuda::Function),
    Emu,
}

impl FunctionBackend {
    /// What the driver reports (`None` on the emulator).
    pub(crate) fn attributes(&self) -> Option<FunctionAttributes> {
        match self {
            FunctionBackend::Cuda(f) => f.attributes(),
            FunctionBackend::Emu => None,
        }
    }
}

/// What a device handle's streams launched: a counter and the last
/// kernel's name, bumped by every [`Stream`](crate::Stream) launch (a
/// relaxed add and an uncontended lock). The communicator reads it to say
/// what a rank was doing when a peer's wait ran out.
#[derive(Default)]
pub(crate) struct Activity {
    launches: std::sync::atomic::AtomicU64,
    last: std::sync::Mutex<&'static str>,
}

impl Activity {
    /// Counts a launch of `kernel`.
    pub(crate) fn note(&self, kernel: &'static str) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = kernel;
        self.launches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs `f`, whose launches are the library's own (the self-test, the
    /// trace's clock calibration), and leaves the count and the last name
    /// as they were: a peer asking what this rank ran sees the user's
    /// kernels only.
    pub(crate) fn unrecorded<R>(&self, f: impl FnOnce() -> R) -> R {
        let before = self.get();
        let r = f();
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = before.1;
        self.launches.store(before.0, std::sync::atomic::Ordering::Relaxed);
        r
    }

    /// Launches so far and the last kernel's name (empty before any).
    pub(crate) fn get(&self) -> (u64, &'static str) {
        let last = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        (self.launches.load(std::sync::atomic::Ordering::Relaxed), last)
    }
}
