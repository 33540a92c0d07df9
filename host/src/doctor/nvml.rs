//! NVML (`libnvidia-ml.so.1`, loaded at run time, optional): NVLink
//! between GPUs and their PCIe relation, as `nvidia-smi topo -m` shows.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use libloading::{Library, Symbol};

/// The library's name.
pub const LIBNVML: &str = "libnvidia-ml.so.1";

type Device = *mut c_void;
type Ret = c_int;
const NVML_SUCCESS: Ret = 0;
/// `NVML_P2P_CAPS_INDEX_NVLINK`.
const CAPS_NVLINK: c_int = 2;
/// `NVML_P2P_STATUS_OK`.
const P2P_OK: c_int = 0;
/// NVLink links probed per GPU (`NVML_NVLINK_MAX_LINKS`).
const MAX_LINKS: c_uint = 18;

/// What NVML says of the GPUs (given by PCI bus id, in ordinal order).
#[derive(Clone, Debug, Default)]
pub struct NvmlReport {
    /// NVML's driver version string.
    pub driver_version: Option<String>,
    /// `nvlink[a][b]`: NVLink between GPU `a` and GPU `b` (`None`: no answer).
    pub nvlink: Vec<Vec<Option<bool>>>,
    /// `pcie[a][b]`: their nearest common PCIe ancestor, in `nvidia-smi
    /// topo` terms (`PIX`, `PXB`, `PHB`, `NODE`, `SYS`).
    pub pcie: Vec<Vec<Option<String>>>,
    /// Active NVLink links per GPU (`None`: no answer).
    pub active_links: Vec<Option<u32>>,
    /// Each GPU that NVML could not find, and why.
    pub errors: Vec<String>,
}

fn topology_level(level: c_int) -> String {
    match level {
        0 => "X".into(),
        10 => "PIX".into(),
        20 => "PXB".into(),
        30 => "PHB".into(),
        40 => "NODE".into(),
        50 => "SYS".into(),
        l => format!("level {l}"),
    }
}

/// Loads NVML and reads what it says of `bus_ids`; `Err` says why it
/// could not (not installed, init failed).
pub fn probe(bus_ids: &[String]) -> Result<NvmlReport, String> {
    // SAFETY: loading the system's NVML runs its initializers, like any
    // program linked with it.
    let lib = unsafe { Library::new(LIBNVML) }.map_err(|e| format!("{LIBNVML} cannot be loaded: {e}"))?;
    // SAFETY: the signatures are NVML's (nvml.h); each symbol is used only
    // while `lib` lives.
    unsafe {
        let init: Symbol<unsafe extern "C" fn() -> Ret> = lib
            .get(b"nvmlInit_v2\0")
            .map_err(|e| format!("{LIBNVML} has no nvmlInit_v2: {e}"))?;
        let r = init();
        if r != NVML_SUCCESS {
            return Err(format!("nvmlInit_v2 failed with NVML error {r}"));
        }
        let shutdown: Option<Symbol<unsafe extern "C" fn() -> Ret>> = lib.get(b"nvmlShutdown\0").ok();
        let out = read(&lib, bus_ids);
        if let Some(s) = shutdown {
            s();
        }
        Ok(out)
    }
}

/// # Safety
/// NVML is initialized; `lib` is NVML.
unsafe fn read(lib: &Library, bus_ids: &[String]) -> NvmlReport {
    let n = bus_ids.len();
    let mut out = NvmlReport {
        nvlink: vec![vec![None; n]; n],
        pcie: vec![vec![None; n]; n],
        active_links: vec![None; n],
        ..NvmlReport::default()
    };
    // SAFETY (all blocks below): NVML's signatures; buffers sized as passed.
    unsafe {
        if let Ok(f) = lib.get::<unsafe extern "C" fn(*mut c_char, c_uint) -> Ret>(b"nvmlSystemGetDriverVersion\0") {
            let mut buf = [0 as c_char; 96];
            if f(buf.as_mut_ptr(), buf.len() as c_uint) == NVML_SUCCESS {
                out.driver_version = Some(CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned());
            }
        }
        let Ok(by_bus) = lib.get::<unsafe extern "C" fn(*const c_char, *mut Device) -> Ret>(b"nvmlDeviceGetHandleByPciBusId_v2\0") else {
            out.errors.push("NVML has no nvmlDeviceGetHandleByPciBusId_v2".into());
            return out;
        };
        let handles: Vec<Option<Device>> = bus_ids
            .iter()
            .map(|b| {
                let c = CString::new(b.as_str()).ok()?;
                let mut d: Device = std::ptr::null_mut();
                match by_bus(c.as_ptr(), &mut d) {
                    NVML_SUCCESS => Some(d),
                    r => {
                        out.errors.push(format!("NVML does not find the GPU at {b} (NVML error {r})"));
                        None
                    }
                }
            })
            .collect();
        let p2p = lib
            .get::<unsafe extern "C" fn(Device, Device, c_int, *mut c_int) -> Ret>(b"nvmlDeviceGetP2PStatus\0")
            .ok();
        let ancestor = lib
            .get::<unsafe extern "C" fn(Device, Device, *mut c_int) -> Ret>(b"nvmlDeviceGetTopologyCommonAncestor\0")
            .ok();
        let link_state = lib
            .get::<unsafe extern "C" fn(Device, c_uint, *mut c_int) -> Ret>(b"nvmlDeviceGetNvLinkState\0")
            .ok();
        for (a, da) in handles.iter().enumerate() {
            let Some(da) = *da else { continue };
            if let Some(f) = &link_state {
                let mut active = 0;
                let mut answered = false;
                for link in 0..MAX_LINKS {
                    let mut state: c_int = 0;
                    if f(da, link, &mut state) == NVML_SUCCESS {
                        answered = true;
                        active += u32::from(state != 0);
                    }
                }
                out.active_links[a] = answered.then_some(active);
            }
            for (b, db) in handles.iter().enumerate() {
                let Some(db) = *db else { continue };
                if a == b {
                    continue;
                }
                if let Some(f) = &p2p {
                    let mut status: c_int = -1;
                    if f(da, db, CAPS_NVLINK, &mut status) == NVML_SUCCESS {
                        out.nvlink[a][b] = Some(status == P2P_OK);
                    }
                }
                if let Some(f) = &ancestor {
                    let mut level: c_int = 0;
                    if f(da, db, &mut level) == NVML_SUCCESS {
                        out.pcie[a][b] = Some(topology_level(level));
                    }
                }
            }
        }
    }
    out
}
