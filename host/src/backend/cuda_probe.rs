//! What `doorbell doctor` reads of the driver and its GPUs: plain queries,
//! no context created. Every function says why it could not answer
//! instead of failing; callers check
//! [`driver_present`](super::cuda::driver_present) first.

use std::ffi::{c_char, c_int, CStr};

use cudarc::driver::{result, sys};

/// One GPU as the driver describes it.
#[derive(Clone, Debug)]
pub(crate) struct GpuProbe {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub memory_bytes: u64,
    pub pci_bus_id: String,
    /// Whether it exports allocations as file descriptors (virtual memory
    /// management and POSIX descriptor handles), which processes sharing
    /// a heap in parts need; `None`: the driver did not answer.
    pub exports_fds: Option<bool>,
}

/// What the driver says of a pair of GPUs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerProbe {
    pub can_access: bool,
    /// `None`: the driver did not answer.
    pub native_atomics: Option<bool>,
    /// Relative performance of the link (0 is best); `None`: no answer.
    pub performance_rank: Option<i32>,
}

fn err(call: &str, e: impl std::fmt::Debug) -> String {
    format!("{call} failed: {e:?}")
}

/// `cuInit` and `cuDriverGetVersion`: e.g. 12040 for CUDA 12.4.
pub(crate) fn driver_version() -> Result<i32, String> {
    result::init().map_err(|e| err("cuInit", e))?;
    let mut v: c_int = 0;
    // SAFETY: a plain query into a local.
    unsafe { sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| err("cuDriverGetVersion", e))?;
    Ok(v)
}

/// The number of GPUs the driver reports.
pub(crate) fn count() -> Result<usize, String> {
    result::init().map_err(|e| err("cuInit", e))?;
    result::device::get_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| err("cuDeviceGetCount", e))
}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute, name: &str) -> Result<i32, String> {
    // SAFETY: a plain query of a device handle from cuDeviceGet.
    unsafe { result::device::get_attribute(dev, a) }.map_err(|e| err(name, e))
}

/// GPU `ordinal`: name, compute capability, memory, PCI bus id.
pub(crate) fn gpu(ordinal: usize) -> Result<GpuProbe, String> {
    let dev = result::device::get(ordinal as c_int).map_err(|e| err("cuDeviceGet", e))?;
    let name = result::device::get_name(dev).map_err(|e| err("cuDeviceGetName", e))?;
    let major = attr(
        dev,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)",
    )?;
    let minor = attr(
        dev,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)",
    )?;
    // SAFETY: as above.
    let memory_bytes = unsafe { result::device::total_mem(dev) }.map_err(|e| err("cuDeviceTotalMem", e))? as u64;
    let mut buf = [0 as c_char; 32];
    // SAFETY: the buffer holds `len` chars; the driver NUL-terminates.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev) }
        .result()
        .map_err(|e| err("cuDeviceGetPCIBusId", e))?;
    // SAFETY: NUL-terminated by the driver within the buffer.
    let pci_bus_id = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
    use sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED as FD,
        CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED as VA,
    };
    let exports_fds = match (attr(dev, VA, "VA"), attr(dev, FD, "FD")) {
        (Ok(va), Ok(fd)) => Some(va != 0 && fd != 0),
        _ => None,
    };
    Ok(GpuProbe {
        name,
        compute_capability: (major, minor),
        memory_bytes,
        pci_bus_id,
        exports_fds,
    })
}

/// Whether GPU `a` can access GPU `b`'s memory, with native atomics.
pub(crate) fn peer(a: usize, b: usize) -> Result<PeerProbe, String> {
    let da = result::device::get(a as c_int).map_err(|e| err("cuDeviceGet", e))?;
    let db = result::device::get(b as c_int).map_err(|e| err("cuDeviceGet", e))?;
    let mut can: c_int = 0;
    // SAFETY: plain queries of device handles from cuDeviceGet.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, da, db) }
        .result()
        .map_err(|e| err("cuDeviceCanAccessPeer", e))?;
    let p2p = |a: sys::CUdevice_P2PAttribute| {
        let mut v: c_int = 0;
        // SAFETY: as above.
        unsafe { sys::cuDeviceGetP2PAttribute(&mut v, a, da, db) }.result().ok().map(|()| v)
    };
    Ok(PeerProbe {
        can_access: can != 0,
        native_atomics: p2p(sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED).map(|v| v != 0),
        performance_rank: p2p(sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK),
    })
}
