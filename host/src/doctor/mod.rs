//! `doorbell doctor`: what this machine offers doorbell, and what stops it.
//!
//! The diagnosis behind the `doorbell doctor` command (the `doorbell`
//! binary of this crate), for set-up problems and bug reports. [`run`]
//! probes the machine and returns a [`Report`]; [`Report::render`] prints
//! it as text, and it serializes (serde) to the one JSON object of
//! `doorbell doctor --json`. The sections:
//!
//! * **GPUs**: the CUDA driver (loaded at run time, as the runtime loads
//!   it) and its version, each GPU's name, compute capability, memory and
//!   PCI bus id; without a driver or a GPU, the CPU emulator runs.
//! * **Kernels**: the embedded PTX images ([`crate::KERNELS`], the soft
//!   NIC's [`crate::comm::SOFTNIC`]): their PTX ISA version and target,
//!   their cubins and arch, checked against the driver (a PTX ISA newer
//!   than the driver can compile does not load) and the GPUs.
//! * **Peers**: the peer-access matrix of the GPUs (`cuDeviceCanAccessPeer`,
//!   native atomics) and NVLink where NVML (`libnvidia-ml.so.1`, optional)
//!   says.
//! * **RDMA**: rdma-core's libraries and versions, the RDMA devices, their
//!   ports, state, link layer and RoCE v2 GIDs, their distance to each GPU
//!   ([`rdma_sys_ext::topo`]), and the NIC each GPU's rank would open
//!   ([`crate::nic::select`]).
//! * **Routes**: the route each pair of ranks of a world on this host
//!   would take ([`crate::comm::route_to`], the communicator's own
//!   decision), and whether the routed transport sends it through the NIC.
//! * **Environment**: every `DOORBELL_*` variable set, checked by the
//!   crate's own parsers ([`crate::env::CHECKS`], the world's); names no
//!   part of doorbell reads are flagged.
//!
//! Each problem is a [`Finding`] with its reason and a fix; a report with
//! problems exits 1 ([`Report::exit_code`]). No GPU is a warning (the
//! emulator runs) unless a GPU is required ([`Options::require_gpu`]).
//! Nothing here panics on a machine that lacks something: a probe that
//! fails becomes a line saying what could not be read and why.

use serde::Serialize;

pub mod env;
pub mod nvml;
pub mod ptx;
pub mod rdma;
pub mod routes;

use crate::backend::cuda::{self, probe as cuda_probe};
pub use routes::Launch;

/// What to diagnose.
#[derive(Clone, Debug)]
pub struct Options {
    /// Ranks of the modelled world (`None`: one per GPU, or 2 without GPUs).
    pub ranks: Option<usize>,
    /// How those ranks are launched.
    pub launch: Launch,
    /// No GPU is a problem, not a warning.
    pub require_gpu: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ranks: None,
            launch: Launch::Processes,
            require_gpu: false,
        }
    }
}

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
    /// 0 without problems, 1 with any.
    pub fn exit_code(&self) -> i32 {
        i32::from(!self.problems.is_empty())
    }

    fn problem(&mut self, section: &'static str, message: String, fix: impl Into<String>) {
        self.problems.push(Finding {
            section,
            message,
            fix: fix.into(),
        });
    }

    fn warning(&mut self, section: &'static str, message: String, fix: impl Into<String>) {
        self.warnings.push(Finding {
            section,
            message,
            fix: fix.into(),
        });
    }
}

/// Runs `f`, turning a panic into an error line (a probe must never take
/// the diagnosis down).
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "no message".into());
            Err(format!("{what} failed unexpectedly: {msg}"))
        }
    }
}

fn probe_gpus(report: &mut Report) {
    let g = &mut report.gpus;
    g.driver_loaded = guarded("loading the CUDA driver", || Ok(cuda::driver_present())).unwrap_or(false);
    if !g.driver_loaded {
        g.errors
            .push("the CUDA driver library (libcuda.so) cannot be loaded: no NVIDIA driver here".into());
        return;
    }
    match guarded("cuDriverGetVersion", cuda_probe::driver_version) {
        Ok(v) => {
            g.cuda_version_raw = Some(v);
            g.cuda_version = Some(format!("{}.{}", v / 1000, (v % 1000) / 10));
            g.max_ptx_isa = ptx::max_isa_for_driver(v).map(|i| i.to_string());
        }
        Err(e) => {
            g.errors.push(e);
            return;
        }
    }
    let n = match guarded("cuDeviceGetCount", cuda_probe::count) {
        Ok(n) => n,
        Err(e) => {
            g.errors.push(e);
            return;
        }
    };
    for i in 0..n {
        match guarded("reading a GPU", || cuda_probe::gpu(i)) {
            Ok(p) => g.devices.push(Gpu {
                ordinal: i,
                name: p.name,
                compute_capability: format!("{}.{}", p.compute_capability.0, p.compute_capability.1),
                memory_bytes: p.memory_bytes,
                pci_bus_id: p.pci_bus_id,
            }),
            Err(e) => g.errors.push(format!("GPU {i}: {e}")),
        }
    }
}

fn capability(g: &Gpu) -> (i32, i32) {
    let (a, b) = g.compute_capability.split_once('.').unwrap_or(("0", "0"));
    (a.parse().unwrap_or(0), b.parse().unwrap_or(0))
}

fn probe_kernels(report: &mut Report) {
    report.kernels.load_cubin = crate::vars::flag_renamed("DOORBELL_LOAD_CUBIN", "DOORBELL_CUBIN", true).unwrap_or(true);
    let images = [("doorbell_kernels", crate::KERNELS), ("doorbell_softnic", crate::comm::SOFTNIC)];
    for (name, image) in images {
        let (image, problems, warnings) = assess_image(name, image.ptx, image.cubin, &report.gpus, report.kernels.load_cubin);
        report.kernels.images.push(image);
        report.problems.extend(problems);
        report.warnings.extend(warnings);
    }
}

/// What an embedded module is, checked against the driver and the GPUs:
/// the image, its problems and its warnings.
fn assess_image(name: &str, ptx_text: &str, cubin: &[u8], g: &GpuSection, load_cubin: bool) -> (Image, Vec<Finding>, Vec<Finding>) {
    let (mut problems, mut warnings) = (Vec::new(), Vec::new());
    let finding = |message: String, fix: &str| Finding {
        section: "kernels",
        message,
        fix: fix.to_string(),
    };
    let h = ptx::parse_header(ptx_text);
    let built = crate::ptx_is_built(ptx_text);
    let max = g.max_ptx_isa.clone();
    let driver_can_compile = match (h.version, g.cuda_version_raw.and_then(ptx::max_isa_for_driver)) {
        (Some(v), Some(m)) => Some(v <= m),
        _ => None,
    };
    let cubin_arch = ptx::cubin_arch(cubin);
    let cubin_loads_on = match cubin_arch.as_deref().and_then(ptx::target_capability) {
        Some((maj, min, specific)) if load_cubin => g
            .devices
            .iter()
            .filter(|d| {
                let (a, b) = capability(d);
                a == maj && (b == min || (!specific && b > min))
            })
            .map(|d| d.ordinal)
            .collect(),
        _ => Vec::new(),
    };
    let image = Image {
        name: name.to_string(),
        ptx_bytes: ptx_text.len(),
        ptx_built: built,
        ptx_isa: h.version.map(|v| v.to_string()),
        target: h.target.clone(),
        cubin_bytes: cubin.len(),
        cubin_arch,
        driver_can_compile,
        cubin_loads_on,
    };
    let gpus = !g.devices.is_empty();
    if !built {
        let msg = format!("{name}: this binary was built without PTX (DOORBELL_SKIP_PTX=1 wrote a placeholder)");
        let fix = "rebuild without DOORBELL_SKIP_PTX (the device toolchain of scripts/setup.sh builds the PTX)";
        if gpus {
            problems.push(finding(format!("{msg}: launches on the GPUs fail"), fix));
        } else {
            warnings.push(finding(format!("{msg}: only the CPU emulator can run it"), fix));
        }
        return (image, problems, warnings);
    }
    if driver_can_compile == Some(false) {
        let covered = image.cubin_loads_on.clone();
        let uncovered: Vec<usize> = g.devices.iter().map(|d| d.ordinal).filter(|o| !covered.contains(o)).collect();
        let msg = format!(
            "{name}: its PTX is ISA {} but the driver (CUDA {}) compiles PTX up to ISA {}",
            h.version.map(|v| v.to_string()).unwrap_or_default(),
            g.cuda_version.clone().unwrap_or_default(),
            max.unwrap_or_default(),
        );
        let fix = "update the NVIDIA driver, or build the PTX with a device toolchain whose LLVM emits an older ISA";
        if uncovered.is_empty() {
            warnings.push(finding(
                format!("{msg}: every GPU loads the embedded cubin instead, but DOORBELL_LOAD_CUBIN=0 would fail"),
                fix,
            ));
        } else {
            problems.push(finding(
                format!("{msg}: the module does not load on GPU(s) {uncovered:?}, which need the PTX"),
                fix,
            ));
        }
    }
    if let Some((maj, min, _)) = h.target.as_deref().and_then(ptx::target_capability) {
        let too_old: Vec<(usize, String)> = g
            .devices
            .iter()
            .filter(|d| capability(d) < (maj, min))
            .map(|d| (d.ordinal, d.compute_capability.clone()))
            .collect();
        for (i, cc) in too_old {
            problems.push(finding(
                format!(
                    "{name}: its PTX targets {} (compute capability {maj}.{min}) but GPU {i} has compute capability {cc}",
                    h.target.clone().unwrap_or_default()
                ),
                "run on a GPU of that capability or newer, or build the PTX for this GPU (DOORBELL_PTX_ARCH)",
            ));
        }
    }

    (image, problems, warnings)
}

// GPU pairs index several matrices at once.
#[allow(clippy::needless_range_loop)]
fn probe_peers(report: &mut Report) -> Vec<Vec<Option<routes::Link>>> {
    let n = report.gpus.devices.len();
    let mut links = vec![vec![None; n]; n];
    let bus: Vec<String> = report.gpus.devices.iter().map(|g| g.pci_bus_id.clone()).collect();
    let nv = if report.gpus.driver_loaded {
        guarded("NVML", || nvml::probe(&bus))
    } else {
        Err(format!(
            "not tried: {} comes with the NVIDIA driver, which is not here",
            nvml::LIBNVML
        ))
    };
    let p = &mut report.peers;
    let nv = match nv {
        Ok(r) => {
            p.nvml = true;
            report.gpus.driver_version = r.driver_version.clone();
            p.nvlink_active_links = r.active_links.clone();
            p.errors.extend(r.errors.iter().cloned());
            Some(r)
        }
        Err(e) => {
            p.nvml_error = Some(e);
            None
        }
    };
    p.matrix = vec![vec![None; n]; n];
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            match guarded("cuDeviceCanAccessPeer", || cuda_probe::peer(a, b)) {
                Ok(q) => {
                    let nvlink = nv.as_ref().and_then(|r| r.nvlink[a][b]);
                    p.matrix[a][b] = Some(PeerCell {
                        can_access: q.can_access,
                        native_atomics: q.native_atomics,
                        performance_rank: q.performance_rank,
                        nvlink,
                        pcie: nv.as_ref().and_then(|r| r.pcie[a][b].clone()),
                    });
                    links[a][b] = Some(routes::Link {
                        can_access: q.can_access,
                        native_atomics: q.native_atomics,
                        nvlink,
                    });
                }
                Err(e) => p.errors.push(format!("GPU {a} -> GPU {b}: {e}")),
            }
        }
    }
    links
}

fn probe_rdma(report: &mut Report) {
    let bus: Vec<String> = report.gpus.devices.iter().map(|g| g.pci_bus_id.clone()).collect();
    report.rdma = match guarded("probing rdma-core", || Ok(rdma::probe(&bus))) {
        Ok(r) => r,
        Err(e) => rdma::RdmaReport {
            errors: vec![e],
            ..Default::default()
        },
    };
    let (problems, warnings) = rdma_findings(&report.rdma);
    report.problems.extend(problems);
    report.warnings.extend(warnings);
}

/// What is wrong with rdma-core and the RDMA devices: problems, warnings.
fn rdma_findings(r: &rdma::RdmaReport) -> (Vec<Finding>, Vec<Finding>) {
    let (mut problems, mut warnings) = (Vec::new(), Vec::new());
    let finding = |message: String, fix: &str| Finding {
        section: "rdma",
        message,
        fix: fix.to_string(),
    };
    let verbs_loaded = r.libraries.first().is_some_and(|l| l.error.is_none());
    if verbs_loaded && !r.devices.is_empty() {
        let active = r.devices.iter().flat_map(|d| &d.ports).any(|p| p.state.contains("ACTIVE"));
        if !active {
            let ports: Vec<String> = r
                .devices
                .iter()
                .flat_map(|d| d.ports.iter().map(move |p| format!("{}:{} {}", d.name, p.port, p.state)))
                .collect();
            problems.push(finding(
                format!(
                    "rdma-core and RDMA devices are here but no port is ACTIVE ({}): the NIC cannot carry traffic",
                    ports.join(", ")
                ),
                "connect the cable and check the subnet manager (InfiniBand: opensm) or the Ethernet link (RoCE); `ibv_devinfo` shows the port state",
            ));
        }
        for d in r.devices.iter().filter(|d| d.listed_by_rdma_core == Some(false)) {
            warnings.push(finding(
                format!("{} is in sysfs but rdma-core does not list it", d.name),
                "load ib_uverbs, and check the permissions of /dev/infiniband (in a container pass --device /dev/infiniband)",
            ));
        }
        for d in &r.devices {
            for p in d
                .ports
                .iter()
                .filter(|p| p.link_layer.starts_with("Ethernet") && p.state.contains("ACTIVE"))
            {
                if p.gid_index.is_none() {
                    problems.push(finding(
                        format!("{}:{} is RoCE but its GID table has no RoCE v2 entry", d.name, p.port),
                        "give the interface an IP address (RoCE v2 GIDs follow the interface's addresses)",
                    ));
                }
            }
        }
    }
    for line in r.nic_per_gpu.iter().filter(|l| l.contains("none: ")) {
        problems.push(finding(
            format!("no NIC for IBGDA: {line}"),
            "fix what the line names, or set DOORBELL_NIC=auto (the soft NIC where no ConnectX is usable)",
        ));
    }
    (problems, warnings)
}

fn probe_routes(report: &mut Report, opts: &Options, links: &[Vec<Option<routes::Link>>]) {
    let gpus = report.gpus.devices.len();
    let ranks = opts.ranks.unwrap_or(if gpus > 0 { gpus } else { 2 });
    let rank_per_gpu = crate::vars::flag_renamed(crate::comm::RANK_PER_GPU_ENV, crate::comm::RANK_PER_GPU_ENV_OLD, false).unwrap_or(false);
    let rdma_peers = crate::comm::RdmaPeers::from_env().unwrap_or_default();
    let nic = report
        .rdma
        .nic_per_gpu
        .first()
        .map(|l| {
            l.split_once(": ")
                .filter(|_| gpus > 0)
                .map(|(_, r)| r.to_string())
                .unwrap_or(l.clone())
        })
        .unwrap_or_else(|| "the NIC".into());
    let world = routes::World {
        ranks,
        gpus,
        launch: opts.launch,
        rank_per_gpu,
        links,
        rdma_peers: &rdma_peers,
        nic: &nic,
    };
    let placement = (0..ranks).map(|r| routes::gpu_of(&world, r)).collect();
    let pairs = match routes::table(&world) {
        Ok(p) => p,
        Err(e) => {
            report.problem(
                "routes",
                format!("{e}"),
                "name only ranks of the world in DOORBELL_RDMA_PEERS (pairs like 0-1), or `all`, or `none`",
            );
            // The load/store routes still hold; none is sent through the NIC.
            let needed = crate::comm::RdmaPeers::Needed;
            routes::table(&routes::World {
                rdma_peers: &needed,
                ..world.clone()
            })
            .unwrap_or_default()
        }
    };
    for p in pairs.iter().filter_map(|p| p.problem.clone()) {
        report.problem(
            "routes",
            p,
            "put these ranks on GPUs that reach each other (NVLink), one process per GPU pair that can, or route them through the NIC with DOORBELL_RDMA_PEERS (that pair still needs the NIC's path)",
        );
    }
    if crate::comm::one_launch_in_flight(gpus > 0, ranks.div_ceil(gpus.max(1))) && opts.launch == Launch::Threads && !rank_per_gpu {
        report.warning(
            "routes",
            format!("{ranks} thread ranks share GPU 0: each keeps one launch that waits for peers in flight"),
            "set DOORBELL_RANK_PER_GPU=1 to spread thread ranks over the GPUs",
        );
    }
    report.routes = RouteSection {
        ranks,
        launch: opts.launch,
        rank_per_gpu,
        placement,
        nic,
        pairs,
    };
}

fn probe_env(report: &mut Report) {
    let vars: Vec<(String, String)> = std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .collect();
    let bad = guarded("checking the environment", || Ok(env::check_process_env())).unwrap_or_else(|e| vec![("DOORBELL_*".into(), e)]);
    let errors = |name: &str| bad.iter().find(|(v, _)| v == name).map(|(_, m)| m.clone());
    report.environment.vars = env::classify_all(&vars, &errors);
    for v in report.environment.vars.clone() {
        match v.status {
            "bad" => report.problem(
                "environment",
                v.message.clone(),
                format!("set {} to an accepted value, or unset it for the default", v.name),
            ),
            "unknown" => report.warning(
                "environment",
                v.message.clone(),
                match env::suggest(&v.name) {
                    Some(k) => format!("rename it to {k}, or unset it"),
                    None => "unset it (docs/env.md lists doorbell's variables)".to_string(),
                },
            ),
            _ => {}
        }
    }
    // A failure whose variable is not set (a missing one) still counts.
    let missing: Vec<(String, String)> = bad
        .iter()
        .filter(|(var, _)| !report.environment.vars.iter().any(|v| &v.name == var))
        .cloned()
        .collect();
    for (var, msg) in missing {
        report.problem("environment", msg, format!("set {var}"));
    }
}

/// Probes this machine.
pub fn run(opts: &Options) -> Report {
    let mut report = Report {
        doorbell_version: env!("CARGO_PKG_VERSION"),
        gpus: GpuSection::default(),
        kernels: KernelSection::default(),
        peers: PeerSection::default(),
        rdma: rdma::RdmaReport::default(),
        routes: RouteSection {
            ranks: 0,
            launch: opts.launch,
            rank_per_gpu: false,
            placement: Vec::new(),
            nic: String::new(),
            pairs: Vec::new(),
        },
        environment: EnvSection::default(),
        problems: Vec::new(),
        warnings: Vec::new(),
    };
    probe_env(&mut report);
    probe_gpus(&mut report);
    let device = crate::backend::Backend::from_env().ok();
    let gpus = report.gpus.devices.len();
    report.gpus.backend = match (device, gpus) {
        (Some(crate::Backend::Cpu), _) => "cpu emulator (DOORBELL_DEVICE=cpu)".into(),
        (_, 0) => "cpu emulator".into(),
        _ => "gpu".into(),
    };
    if gpus == 0 {
        let why = report
            .gpus
            .errors
            .first()
            .cloned()
            .unwrap_or_else(|| "the driver reports no GPU".into());
        let fix = "install the NVIDIA driver and make the GPUs visible (in a container: --gpus all); without them doorbell runs on its CPU emulator";
        if opts.require_gpu || device == Some(crate::Backend::Gpu) {
            let by = if opts.require_gpu { "--require-gpu" } else { "DOORBELL_DEVICE=gpu" };
            report.problem("gpus", format!("no GPU ({why}), and {by} asks for one"), fix);
        } else {
            report.warning("gpus", format!("no GPU ({why}): the CPU emulator will be used"), fix);
        }
    } else {
        for e in report.gpus.errors.clone() {
            report.warning("gpus", e, "check the driver with nvidia-smi");
        }
    }
    probe_kernels(&mut report);
    let links = probe_peers(&mut report);
    probe_rdma(&mut report);
    probe_routes(&mut report, opts, &links);
    report
}

impl Report {
    /// The report as text, one section after the other.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let mut w = |line: String| {
            s.push_str(&line);
            s.push('\n');
        };
        w(format!("doorbell doctor (doorbell {})", self.doorbell_version));
        w(String::new());
        w("== GPUs ==".into());
        let g = &self.gpus;
        if g.driver_loaded {
            w(format!(
                "CUDA driver: loaded; CUDA {} (PTX ISA up to {}){}",
                g.cuda_version.as_deref().unwrap_or("version unknown"),
                g.max_ptx_isa.as_deref().unwrap_or("unknown"),
                g.driver_version.as_ref().map(|v| format!("; driver {v}")).unwrap_or_default()
            ));
        } else {
            w("CUDA driver: not found".into());
        }
        for d in &g.devices {
            w(format!(
                "GPU {}: {}, compute capability {}, {:.1} GiB, PCI {}",
                d.ordinal,
                d.name,
                d.compute_capability,
                d.memory_bytes as f64 / (1u64 << 30) as f64,
                d.pci_bus_id
            ));
        }
        for e in &g.errors {
            w(format!("  could not read: {e}"));
        }
        w(format!("backend (DOORBELL_DEVICE=auto): {}", g.backend));
        w(String::new());

        w("== Kernels ==".into());
        for i in &self.kernels.images {
            if !i.ptx_built {
                w(format!(
                    "{}: built without PTX (placeholder of {} bytes); no cubin",
                    i.name, i.ptx_bytes
                ));
                continue;
            }
            let mut line = format!(
                "{}: PTX ISA {}, target {}, {} bytes",
                i.name,
                i.ptx_isa.as_deref().unwrap_or("?"),
                i.target.as_deref().unwrap_or("?"),
                i.ptx_bytes
            );
            if i.cubin_bytes == 0 {
                line.push_str("; no cubin (the driver compiles the PTX)");
            } else {
                let _ = write!(
                    line,
                    "; cubin for {} ({} bytes)",
                    i.cubin_arch.as_deref().unwrap_or("an unrecognized arch"),
                    i.cubin_bytes
                );
                if !i.cubin_loads_on.is_empty() {
                    let _ = write!(line, ", loaded on GPU {:?}", i.cubin_loads_on);
                }
            }
            match i.driver_can_compile {
                Some(true) => line.push_str("; the driver compiles this ISA"),
                Some(false) => line.push_str("; TOO NEW for the driver"),
                None => {}
            }
            w(line);
        }
        if !self.kernels.load_cubin {
            w("DOORBELL_LOAD_CUBIN=0: modules load from their PTX".into());
        }
        w(String::new());

        w("== Peer access ==".into());
        let p = &self.peers;
        match (&p.nvml_error, p.nvml) {
            (_, true) => w("NVML: loaded".into()),
            (Some(e), _) => w(format!("NVML: not used ({e})")),
            _ => {}
        }
        let n = p.matrix.len();
        if n < 2 {
            w(format!("{n} GPU(s): no pairs"));
        } else {
            let mut head = "      ".to_string();
            for b in 0..n {
                let _ = write!(head, "{:>8}", format!("GPU{b}"));
            }
            w(head);
            for a in 0..n {
                let mut row = format!("{:<6}", format!("GPU{a}"));
                for b in 0..n {
                    let cell = match &p.matrix[a][b] {
                        _ if a == b => "X".to_string(),
                        None => "?".to_string(),
                        Some(c) if !c.can_access => "no".to_string(),
                        Some(c) => match c.nvlink {
                            Some(true) => "NVL".to_string(),
                            _ => c.pcie.clone().unwrap_or_else(|| "P2P".into()),
                        },
                    };
                    let _ = write!(row, "{cell:>8}");
                }
                w(row);
            }
            w(
                "(NVL: NVLink; PIX/PXB/PHB/NODE/SYS: peer access over PCIe at that distance; P2P: peer access, link unknown; no: none)"
                    .into(),
            );
            for a in 0..n {
                for b in 0..n {
                    if let Some(c) = &p.matrix[a][b] {
                        if c.can_access && c.native_atomics == Some(false) {
                            w(format!("GPU{a} -> GPU{b}: peer access without native atomics"));
                        }
                    }
                }
            }
        }
        for e in &p.errors {
            w(format!("  could not read: {e}"));
        }
        w(String::new());

        w("== RDMA ==".into());
        let r = &self.rdma;
        for l in &r.libraries {
            match (&l.path, &l.error) {
                (Some(path), _) => w(format!(
                    "{}: {} (version {})",
                    l.name,
                    path,
                    l.version.as_deref().unwrap_or("unknown")
                )),
                (None, Some(e)) => w(format!("{}: not installed ({e})", l.name)),
                (None, None) => w(format!("{}: loaded (file unknown)", l.name)),
            }
        }
        if r.devices.is_empty() {
            w("RDMA devices: none".into());
        }
        for d in &r.devices {
            w(format!(
                "{}: PCI {}, driver {}, NUMA {}{}",
                d.name,
                d.pci_bus_id.as_deref().unwrap_or("?"),
                d.driver.as_deref().unwrap_or("?"),
                d.numa_node.map(|n| n.to_string()).unwrap_or("?".into()),
                if d.gpu_distance.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; to GPUs: {}",
                        d.gpu_distance
                            .iter()
                            .enumerate()
                            .map(|(i, x)| format!("GPU{i} {x}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            ));
            for port in &d.ports {
                w(format!(
                    "  port {}: {}, {}{}{}",
                    port.port,
                    port.state,
                    port.link_layer,
                    port.rate.as_ref().map(|r| format!(", {r}")).unwrap_or_default(),
                    if port.roce_v2_gids.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; RoCE v2 GIDs: {}",
                            port.roce_v2_gids
                                .iter()
                                .map(|(i, g)| format!("[{i}] {g}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    }
                ));
            }
        }
        w(format!(
            "nvidia_peermem: {}",
            if r.nvidia_peermem { "loaded" } else { "not loaded" }
        ));
        for e in &r.errors {
            w(format!("  could not read: {e}"));
        }
        for l in &r.nic_per_gpu {
            w(format!("IBGDA NIC: {l}"));
        }
        w(String::new());

        let rt = &self.routes;
        w(format!(
            "== Routes ({} ranks, {}) ==",
            rt.ranks,
            match rt.launch {
                Launch::Processes => "one process per rank".to_string(),
                Launch::Threads if rt.rank_per_gpu => "threads of one process, DOORBELL_RANK_PER_GPU=1".to_string(),
                Launch::Threads => "threads of one process".to_string(),
            }
        ));
        let place: Vec<String> = rt
            .placement
            .iter()
            .enumerate()
            .map(|(r, g)| match g {
                Some(g) => format!("rank {r} -> GPU {g}"),
                None => format!("rank {r} -> emulator"),
            })
            .collect();
        w(place.join(", "));
        for p in &rt.pairs {
            w(format!(
                "{} <-> {}: {} via {}{} ({})",
                p.rank,
                p.peer,
                p.route,
                p.via,
                if p.through_nic { ", routed through the NIC" } else { "" },
                p.why
            ));
        }
        w(String::new());

        w("== Environment ==".into());
        if self.environment.vars.is_empty() {
            w("no DOORBELL_* variable is set (every default applies)".into());
        }
        for v in &self.environment.vars {
            let kind = format!("{:?}", v.kind).to_lowercase();
            w(match v.status {
                "ok" => format!("{}={} ({kind}): ok", v.name, v.value),
                _ if v.message.is_empty() => format!("{}={} ({kind})", v.name, v.value),
                status => format!("{}={} ({kind}): {status}: {}", v.name, v.value, v.message),
            });
        }
        w(String::new());

        for (title, list) in [("Warnings", &self.warnings), ("Problems", &self.problems)] {
            if list.is_empty() {
                continue;
            }
            w(format!("== {title} =="));
            for f in list {
                w(format!("[{}] {}", f.section, f.message));
                w(format!("    fix: {}", f.fix));
            }
            w(String::new());
        }
        w(if self.problems.is_empty() {
            format!("result: OK ({} warning(s))", self.warnings.len())
        } else {
            format!("result: {} problem(s), {} warning(s)", self.problems.len(), self.warnings.len())
        });
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON object's shape: what bug reports and scripts rely on.
    #[test]
    fn json_has_every_section() {
        let report = run(&Options {
            ranks: Some(3),
            ..Options::default()
        });
        let v: serde_json::Value = serde_json::to_value(&report).expect("serializes");
        for key in [
            "doorbell_version",
            "gpus",
            "kernels",
            "peers",
            "rdma",
            "routes",
            "environment",
            "problems",
            "warnings",
        ] {
            assert!(v.get(key).is_some(), "no {key} in {v}");
        }
        assert!(v["problems"].is_array() && v["warnings"].is_array());
        assert_eq!(v["routes"]["ranks"], 3);
        assert_eq!(v["routes"]["pairs"].as_array().map(Vec::len), Some(3));
        let images = v["kernels"]["images"].as_array().expect("images");
        assert_eq!(images.len(), 2);
        for i in images {
            for key in ["name", "ptx_built", "ptx_isa", "target", "cubin_bytes", "cubin_arch"] {
                assert!(i.get(key).is_some(), "no {key} in {i}");
            }
            // Built without PTX or with it: the two agree with the header.
            assert_eq!(i["ptx_built"].as_bool(), Some(!i["ptx_isa"].is_null()), "{i}");
        }
        assert!(v["rdma"]["libraries"].as_array().is_some_and(|l| l.len() == 2));
        assert_eq!(report.exit_code(), i32::from(!report.problems.is_empty()));
        let text = report.render();
        for head in [
            "== GPUs ==",
            "== Kernels ==",
            "== Peer access ==",
            "== RDMA ==",
            "== Routes",
            "== Environment ==",
            "result: ",
        ] {
            assert!(text.contains(head), "no {head} in\n{text}");
        }
    }

    fn gpus(driver: i32, ccs: &[&str]) -> GpuSection {
        GpuSection {
            driver_loaded: true,
            cuda_version_raw: Some(driver),
            cuda_version: Some(format!("{}.{}", driver / 1000, (driver % 1000) / 10)),
            max_ptx_isa: ptx::max_isa_for_driver(driver).map(|i| i.to_string()),
            devices: ccs
                .iter()
                .enumerate()
                .map(|(i, cc)| Gpu {
                    ordinal: i,
                    name: "test GPU".into(),
                    compute_capability: cc.to_string(),
                    memory_bytes: 0,
                    pci_bus_id: format!("0000:{:02x}:00.0", i + 1),
                })
                .collect(),
            ..GpuSection::default()
        }
    }

    fn sm90_cubin() -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        (b[4], b[5], b[7], b[8]) = (2, 1, 0x33, 7);
        b[48] = 90;
        b
    }

    const PTX_84: &str = ".version 8.4\n.target sm_90\n.address_size 64\n.visible .entry k()\n";

    /// PTX newer than the driver compiles: a problem for GPUs that need the
    /// PTX, a warning where every GPU loads the cubin.
    #[test]
    fn ptx_newer_than_the_driver() {
        let old = gpus(12020, &["9.0", "9.0"]);
        let (img, problems, warnings) = assess_image("k", PTX_84, &[], &old, true);
        assert_eq!(img.driver_can_compile, Some(false));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].message.contains("ISA 8.4") && problems[0].message.contains("up to ISA 8.2"),
            "{problems:?}"
        );
        assert!(problems[0].message.contains("GPU(s) [0, 1]"), "{problems:?}");
        assert!(warnings.is_empty());

        let (img, problems, warnings) = assess_image("k", PTX_84, &sm90_cubin(), &old, true);
        assert_eq!(img.cubin_arch.as_deref(), Some("sm_90"));
        assert_eq!(img.cubin_loads_on, [0, 1]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        // ... unless DOORBELL_LOAD_CUBIN=0.
        let (_, problems, _) = assess_image("k", PTX_84, &sm90_cubin(), &old, false);
        assert_eq!(problems.len(), 1, "{problems:?}");

        let new = gpus(12040, &["9.0"]);
        let (img, problems, warnings) = assess_image("k", PTX_84, &[], &new, true);
        assert_eq!(img.driver_can_compile, Some(true));
        assert!(problems.is_empty() && warnings.is_empty(), "{problems:?} {warnings:?}");
    }

    #[test]
    fn ptx_for_a_newer_gpu_and_a_build_without_ptx() {
        let (_, problems, _) = assess_image("k", PTX_84, &sm90_cubin(), &gpus(12040, &["9.0", "8.0"]), true);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].message.contains("GPU 1 has compute capability 8.0"), "{problems:?}");

        let placeholder = "// doorbell: PTX build skipped (DOORBELL_SKIP_PTX=1)\n";
        let (img, problems, warnings) = assess_image("k", placeholder, &[], &GpuSection::default(), true);
        assert!(!img.ptx_built && img.ptx_isa.is_none());
        assert!(problems.is_empty() && warnings.len() == 1, "no GPU: a warning");
        let (_, problems, _) = assess_image("k", placeholder, &[], &gpus(12040, &["9.0"]), true);
        assert_eq!(problems.len(), 1, "with a GPU: a problem");
        assert!(problems[0].message.contains("built without PTX"));
    }

    fn rdma_with(states: &[(&str, &str, Option<u32>)], listed: bool) -> rdma::RdmaReport {
        rdma::RdmaReport {
            libraries: vec![rdma::Library {
                name: "libibverbs.so.1".into(),
                path: Some("/usr/lib/libibverbs.so.1.14.44.0".into()),
                version: Some("1.14.44.0".into()),
                error: None,
            }],
            devices: vec![rdma::RdmaDev {
                name: "mlx5_0".into(),
                pci_bus_id: Some("0000:1a:00.0".into()),
                driver: Some("mlx5_core".into()),
                numa_node: Some(0),
                ports: states
                    .iter()
                    .enumerate()
                    .map(|(i, (state, link, gid))| rdma::RdmaPort {
                        port: i as u8 + 1,
                        state: state.to_string(),
                        link_layer: link.to_string(),
                        rate: None,
                        roce_v2_gids: Vec::new(),
                        gid_index: *gid,
                    })
                    .collect(),
                gpu_distance: Vec::new(),
                listed_by_rdma_core: Some(listed),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn rdma_without_an_active_port_or_a_roce_v2_gid() {
        let (p, w) = rdma_findings(&rdma_with(&[("1: DOWN", "InfiniBand", None)], true));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].message.contains("no port is ACTIVE (mlx5_0:1 1: DOWN)"), "{p:?}");
        assert!(w.is_empty());
        let (p, _) = rdma_findings(&rdma_with(&[("4: ACTIVE", "InfiniBand", None)], true));
        assert!(p.is_empty(), "{p:?}");
        let (p, _) = rdma_findings(&rdma_with(&[("4: ACTIVE", "Ethernet (RoCE)", None)], true));
        assert!(p.len() == 1 && p[0].message.contains("no RoCE v2 entry"), "{p:?}");
        let (p, w) = rdma_findings(&rdma_with(&[("4: ACTIVE", "Ethernet (RoCE)", Some(3))], false));
        assert!(p.is_empty(), "{p:?}");
        assert!(w.len() == 1 && w[0].message.contains("rdma-core does not list it"), "{w:?}");
        // Without rdma-core, the devices are not its problem: the soft NIC runs.
        let mut r = rdma_with(&[("1: DOWN", "InfiniBand", None)], true);
        r.libraries[0].error = Some("not installed".into());
        assert_eq!(rdma_findings(&r), (Vec::new(), Vec::new()));
        r.nic_per_gpu = vec!["GPU 0: none: rank 0: DOORBELL_NIC=mlx5, but ...".into()];
        assert_eq!(rdma_findings(&r).0.len(), 1, "DOORBELL_NIC=mlx5 without a NIC");
    }

    #[test]
    fn a_panicking_probe_becomes_a_line() {
        let r: Result<(), String> = guarded("a probe", || panic!("boom"));
        assert_eq!(r.unwrap_err(), "a probe failed unexpectedly: boom");
    }
}
