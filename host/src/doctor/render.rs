//! The report as text ([`Report::render`]), one section after the other.

use super::{Launch, Report};

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
