//! The report as text ([`Report::render`]), one section after the other.

use std::fmt::Write;

use super::{Launch, Report};

/// Lines of text, each ended by a newline.
struct Text(String);

impl Text {
    fn w(&mut self, line: String) {
        self.0.push_str(&line);
        self.0.push('\n');
    }
}

impl Report {
    /// The report as text, one section after the other.
    pub fn render(&self) -> String {
        let mut t = Text(String::new());
        t.w(format!("doorbell doctor (doorbell {})", self.doorbell_version));
        t.w(String::new());
        self.render_gpus(&mut t);
        self.render_kernels(&mut t);
        self.render_peers(&mut t);
        self.render_rdma(&mut t);
        self.render_routes(&mut t);
        self.render_environment(&mut t);
        self.render_findings(&mut t);
        t.0
    }

    /// The GPUs, the driver and the backend a rank would take.
    fn render_gpus(&self, t: &mut Text) {
        t.w("== GPUs ==".into());
        let g = &self.gpus;
        if g.driver_loaded {
            t.w(format!(
                "CUDA driver: loaded; CUDA {} (PTX ISA up to {}){}",
                g.cuda_version.as_deref().unwrap_or("version unknown"),
                g.max_ptx_isa.as_deref().unwrap_or("unknown"),
                g.driver_version.as_ref().map(|v| format!("; driver {v}")).unwrap_or_default()
            ));
        } else {
            t.w("CUDA driver: not found".into());
        }
        for d in &g.devices {
            t.w(format!(
                "GPU {}: {}, compute capability {}, {:.1} GiB, PCI {}",
                d.ordinal,
                d.name,
                d.compute_capability,
                d.memory_bytes as f64 / (1u64 << 30) as f64,
                d.pci_bus_id
            ));
            t.w(format!(
                "  processes sharing it map each other's heaps {}",
                heap_parts_line(d.heap_parts)
            ));
        }
        for e in &g.errors {
            t.w(format!("  could not read: {e}"));
        }
        t.w(format!("backend (DOORBELL_DEVICE=auto): {}", g.backend));
        t.w(String::new());
    }

    /// The embedded kernel images against the driver.
    fn render_kernels(&self, t: &mut Text) {
        t.w("== Kernels ==".into());
        for i in &self.kernels.images {
            if !i.ptx_built {
                t.w(format!(
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
            t.w(line);
        }
        if !self.kernels.load_cubin {
            t.w("DOORBELL_LOAD_CUBIN=0: modules load from their PTX".into());
        }
        t.w(String::new());
    }

    /// Peer access between the GPUs, with NVLink and PCIe distance.
    fn render_peers(&self, t: &mut Text) {
        t.w("== Peer access ==".into());
        let p = &self.peers;
        match (&p.nvml_error, p.nvml) {
            (_, true) => t.w("NVML: loaded".into()),
            (Some(e), _) => t.w(format!("NVML: not used ({e})")),
            _ => {}
        }
        let n = p.matrix.len();
        if n < 2 {
            t.w(format!("{n} GPU(s): no pairs"));
        } else {
            let mut head = "      ".to_string();
            for b in 0..n {
                let _ = write!(head, "{:>8}", format!("GPU{b}"));
            }
            t.w(head);
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
                t.w(row);
            }
            t.w(
                "(NVL: NVLink; PIX/PXB/PHB/NODE/SYS: peer access over PCIe at that distance; P2P: peer access, link unknown; no: none)"
                    .into(),
            );
            for a in 0..n {
                for b in 0..n {
                    if let Some(c) = &p.matrix[a][b] {
                        if c.can_access && c.native_atomics == Some(false) {
                            t.w(format!("GPU{a} -> GPU{b}: peer access without native atomics"));
                        }
                    }
                }
            }
        }
        for e in &p.errors {
            t.w(format!("  could not read: {e}"));
        }
        t.w(String::new());
    }

    /// rdma-core, the RDMA devices and ports, and the NIC each GPU would use.
    fn render_rdma(&self, t: &mut Text) {
        t.w("== RDMA ==".into());
        let r = &self.rdma;
        for l in &r.libraries {
            match (&l.path, &l.error) {
                (Some(path), _) => t.w(format!(
                    "{}: {} (version {})",
                    l.name,
                    path,
                    l.version.as_deref().unwrap_or("unknown")
                )),
                (None, Some(e)) => t.w(format!("{}: not installed ({e})", l.name)),
                (None, None) => t.w(format!("{}: loaded (file unknown)", l.name)),
            }
        }
        if r.devices.is_empty() {
            t.w("RDMA devices: none".into());
        }
        for d in &r.devices {
            t.w(format!(
                "{}: PCI {}, driver {}, NUMA {}{}",
                d.name,
                d.pci_bus_id.as_deref().unwrap_or("?"),
                d.driver.as_deref().unwrap_or("?"),
                d.numa_node.map(|n| n.to_string()).unwrap_or("?".into()),
                listed("to GPUs", d.gpu_distance.iter().enumerate().map(|(i, x)| format!("GPU{i} {x}"))),
            ));
            for port in &d.ports {
                t.w(format!(
                    "  port {}: {}, {}{}{}",
                    port.port,
                    port.state,
                    port.link_layer,
                    port.rate.as_ref().map(|r| format!(", {r}")).unwrap_or_default(),
                    listed("RoCE v2 GIDs", port.roce_v2_gids.iter().map(|(i, g)| format!("[{i}] {g}"))),
                ));
            }
        }
        t.w(format!(
            "nvidia_peermem: {}",
            if r.nvidia_peermem { "loaded" } else { "not loaded" }
        ));
        for e in &r.errors {
            t.w(format!("  could not read: {e}"));
        }
        for l in &r.nic_per_gpu {
            t.w(format!("IBGDA NIC: {l}"));
        }
        t.w(String::new());
    }

    /// Which route each pair of ranks would take, and why.
    fn render_routes(&self, t: &mut Text) {
        let rt = &self.routes;
        t.w(format!(
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
        t.w(place.join(", "));
        for p in &rt.pairs {
            t.w(format!(
                "{} <-> {}: {} via {}{} ({})",
                p.rank,
                p.peer,
                p.route,
                p.via,
                if p.through_nic { ", routed through the NIC" } else { "" },
                p.why
            ));
        }
        t.w(String::new());
    }

    /// The `DOORBELL_*` variables in effect.
    fn render_environment(&self, t: &mut Text) {
        t.w("== Environment ==".into());
        if self.environment.vars.is_empty() {
            t.w("no DOORBELL_* variable is set (every default applies)".into());
        }
        for v in &self.environment.vars {
            let kind = format!("{:?}", v.kind).to_lowercase();
            t.w(match v.status {
                "ok" => format!("{}={} ({kind}): ok", v.name, v.value),
                _ if v.message.is_empty() => format!("{}={} ({kind})", v.name, v.value),
                status => format!("{}={} ({kind}): {status}: {}", v.name, v.value, v.message),
            });
        }
        t.w(String::new());
    }

    /// The warnings and problems with their fixes, and the verdict.
    fn render_findings(&self, t: &mut Text) {
        for (title, list) in [("Warnings", &self.warnings), ("Problems", &self.problems)] {
            if list.is_empty() {
                continue;
            }
            t.w(format!("== {title} =="));
            for f in list {
                t.w(format!("[{}] {}", f.section, f.message));
                t.w(format!("    fix: {}", f.fix));
            }
            t.w(String::new());
        }
        t.w(if self.problems.is_empty() {
            format!("result: OK ({} warning(s))", self.warnings.len())
        } else {
            format!("result: {} problem(s), {} warning(s)", self.problems.len(), self.warnings.len())
        });
    }
}

/// `"; {what}: a, b, c"` for a list of `items`; nothing when there are none.
fn listed(what: &str, items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    if items.is_empty() {
        String::new()
    } else {
        format!("; {what}: {}", items.join(", "))
    }
}

/// How processes sharing a GPU map each other's heaps ([`super::Gpu::heap_parts`]).
fn heap_parts_line(parts: Option<bool>) -> &'static str {
    match parts {
        Some(true) => "in parts (virtual memory; the soft NIC port tables read-only)",
        Some(false) => "through legacy CUDA IPC, read-write as a whole (the GPU does not export allocations as file descriptors)",
        None => "in parts if the GPU exports allocations as file descriptors (the driver did not say)",
    }
}

#[cfg(test)]
mod tests {
    use super::heap_parts_line;

    /// Each answer of the probe says how the tables are mapped.
    #[test]
    fn the_heap_parts_line_says_whether_the_tables_are_read_only() {
        assert!(heap_parts_line(Some(true)).contains("tables read-only"));
        assert!(heap_parts_line(Some(false)).contains("legacy CUDA IPC, read-write"));
        assert!(heap_parts_line(None).contains("did not say"));
    }
}
