//! The checks that turn what was found into problems and warnings: the
//! embedded kernels against the driver and the GPUs, the RDMA devices, the
//! routes between ranks and the `DOORBELL_*` variables.

use super::{env, ptx, rdma, routes, Finding, Gpu, GpuSection, Image, Launch, Options, Report, RouteSection};

/// Runs `f`, turning a panic into an error line (a probe must never take
/// the diagnosis down).
pub(super) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
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

fn capability(g: &Gpu) -> (i32, i32) {
    let (a, b) = g.compute_capability.split_once('.').unwrap_or(("0", "0"));
    (a.parse().unwrap_or(0), b.parse().unwrap_or(0))
}

pub(super) fn probe_kernels(report: &mut Report) {
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

/// What is wrong with rdma-core and the RDMA devices: problems, warnings.
pub(super) fn rdma_findings(r: &rdma::RdmaReport) -> (Vec<Finding>, Vec<Finding>) {
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

pub(super) fn probe_routes(report: &mut Report, opts: &Options, links: &[Vec<Option<routes::Link>>]) {
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
    let pairs = match rdma_peers.check_env(ranks).and_then(|()| routes::table(&world)) {
        Ok(p) => p,
        Err(e) => {
            report.problem(
                "routes",
                format!("{e}"),
                "name only ranks of the world in DOORBELL_RDMA_PEERS (pairs like 0-1), or `all`, or `none`; set DOORBELL_NODES to a count that divides the world",
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

pub(super) fn probe_env(report: &mut Report) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
                    heap_parts: Some(i == 0),
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
}
