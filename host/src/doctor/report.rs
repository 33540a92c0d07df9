//! The report's data: the sections, the findings and the [`Report`] that
//! holds them, serialized (serde) as the one JSON object of
//! `doorbell doctor --json`.

use serde::Serialize;

use super::{env, rdma, routes, Launch};

/// Something wrong (a problem) or worth knowing (a warning).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Finding {
    /// The section it belongs to.
    pub section: &'static str,
    /// What is wrong and why.
    pub message: String,
    /// What to do.
    pub fix: String,
}

/// One GPU.
#[derive(Clone, Debug, Serialize)]
pub struct Gpu {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Name.
    pub name: String,
    /// Compute capability, `9.0`.
    pub compute_capability: String,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// Whether processes sharing this GPU can map each other's heaps in
    /// parts, the soft NIC tables read-only (it exports allocations as
    /// file descriptors); else legacy CUDA IPC, read-write as a whole.
    /// `None`: the driver did not say.
    pub heap_parts: Option<bool>,
}

/// The GPUs and the driver.
#[derive(Clone, Debug, Serialize, Default)]
pub struct GpuSection {
    /// The CUDA driver library loads.
    pub driver_loaded: bool,
    /// The CUDA version the driver supports, `12.4`.
    pub cuda_version: Option<String>,
    /// As `cuDriverGetVersion` returns it, `12040`.
    pub cuda_version_raw: Option<i32>,
    /// The driver's own version, from NVML (`550.54.15`).
    pub driver_version: Option<String>,
    /// The newest PTX ISA the driver compiles.
    pub max_ptx_isa: Option<String>,
    /// Where `DOORBELL_DEVICE=auto` runs: `gpu` or `cpu emulator`.
    pub backend: String,
    /// The GPUs.
    pub devices: Vec<Gpu>,
    /// What could not be read, and why.
    pub errors: Vec<String>,
}

/// One embedded module.
#[derive(Clone, Debug, Serialize)]
pub struct Image {
    /// Which (`doorbell_kernels`, `doorbell_softnic`).
    pub name: String,
    /// PTX bytes.
    pub ptx_bytes: usize,
    /// False where the build wrote a placeholder (`DOORBELL_SKIP_PTX=1`).
    pub ptx_built: bool,
    /// `.version`.
    pub ptx_isa: Option<String>,
    /// `.target`.
    pub target: Option<String>,
    /// Cubin bytes (0: none embedded).
    pub cubin_bytes: usize,
    /// The cubin's arch.
    pub cubin_arch: Option<String>,
    /// Whether the driver can compile this PTX (`None`: no driver, or no PTX).
    pub driver_can_compile: Option<bool>,
    /// GPUs that load the cubin rather than compile the PTX.
    pub cubin_loads_on: Vec<usize>,
}

/// The embedded kernels.
#[derive(Clone, Debug, Serialize, Default)]
pub struct KernelSection {
    /// The modules.
    pub images: Vec<Image>,
    /// `DOORBELL_LOAD_CUBIN` lets cubins load.
    pub load_cubin: bool,
}

/// A pair of GPUs.
#[derive(Clone, Debug, Serialize)]
pub struct PeerCell {
    /// `cuDeviceCanAccessPeer`.
    pub can_access: bool,
    /// Native peer atomics (`None`: unknown).
    pub native_atomics: Option<bool>,
    /// The driver's performance rank of the link (0 best).
    pub performance_rank: Option<i32>,
    /// NVLink (`None`: no NVML answer).
    pub nvlink: Option<bool>,
    /// Their PCIe relation, as NVML says (`PIX` ... `SYS`).
    pub pcie: Option<String>,
}

/// Peer access and NVLink.
#[derive(Clone, Debug, Serialize, Default)]
pub struct PeerSection {
    /// NVML loaded.
    pub nvml: bool,
    /// Why NVML could not be used.
    pub nvml_error: Option<String>,
    /// Active NVLink links per GPU (NVML).
    pub nvlink_active_links: Vec<Option<u32>>,
    /// `matrix[a][b]`: GPU `a` to GPU `b` (`None` on the diagonal or unread).
    pub matrix: Vec<Vec<Option<PeerCell>>>,
    /// What could not be read, and why.
    pub errors: Vec<String>,
}

/// Routes between ranks.
#[derive(Clone, Debug, Serialize)]
pub struct RouteSection {
    /// Ranks.
    pub ranks: usize,
    /// How they are launched.
    pub launch: Launch,
    /// `DOORBELL_RANK_PER_GPU` (thread ranks).
    pub rank_per_gpu: bool,
    /// Each rank's GPU (`None`: the emulator).
    pub placement: Vec<Option<usize>>,
    /// The NIC the routed transport would use (rank 0's).
    pub nic: String,
    /// Every pair.
    pub pairs: Vec<routes::RoutePair>,
}

/// The environment.
#[derive(Clone, Debug, Serialize, Default)]
pub struct EnvSection {
    /// Every `DOORBELL_*` variable set.
    pub vars: Vec<env::EnvVar>,
}

/// Everything `doorbell doctor` found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// This crate's version.
    pub doorbell_version: &'static str,
    /// GPUs and the driver.
    pub gpus: GpuSection,
    /// The embedded kernels.
    pub kernels: KernelSection,
    /// Peer access and NVLink.
    pub peers: PeerSection,
    /// rdma-core and the RDMA devices.
    pub rdma: rdma::RdmaReport,
    /// Routes between ranks.
    pub routes: RouteSection,
    /// The `DOORBELL_*` variables.
    pub environment: EnvSection,
    /// What is wrong: each makes the command exit 1.
    pub problems: Vec<Finding>,
    /// Worth knowing, not wrong.
    pub warnings: Vec<Finding>,
}

impl Report {
    /// The sections: the top-level keys of the JSON form (`doorbell doctor
    /// --json`), in order. Bug reports and scripts rely on them.
    pub const SECTIONS: [&'static str; 9] = [
        "doorbell_version",
        "gpus",
        "kernels",
        "peers",
        "rdma",
        "routes",
        "environment",
        "problems",
        "warnings",
    ];

    /// 0 without problems, 1 with any.
    pub fn exit_code(&self) -> i32 {
        i32::from(!self.problems.is_empty())
    }

    pub(super) fn problem(&mut self, section: &'static str, message: String, fix: impl Into<String>) {
        self.problems.push(Finding {
            section,
            message,
            fix: fix.into(),
        });
    }

    pub(super) fn warning(&mut self, section: &'static str, message: String, fix: impl Into<String>) {
        self.warnings.push(Finding {
            section,
            message,
            fix: fix.into(),
        });
    }
}
