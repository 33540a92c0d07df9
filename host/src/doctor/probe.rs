//! The machine's probes: the CUDA driver and the GPUs, peer access and
//! NVLink, rdma-core and the RDMA devices. A probe that fails (or panics)
//! becomes an error line of its section, never a failed diagnosis.

use super::checks::{guarded, rdma_findings};
use super::{nvml, ptx, rdma, routes, Gpu, PeerCell, Report};
use crate::backend::{cuda, cuda_probe};

pub(super) fn probe_gpus(report: &mut Report) {
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
                heap_parts: p.exports_fds,
            }),
            Err(e) => g.errors.push(format!("GPU {i}: {e}")),
        }
    }
}

// GPU pairs index several matrices at once.
#[allow(clippy::needless_range_loop)]
pub(super) fn probe_peers(report: &mut Report) -> Vec<Vec<Option<routes::Link>>> {
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

pub(super) fn probe_rdma(report: &mut Report) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_probe_becomes_a_line() {
        let r: Result<(), String> = guarded("a probe", || panic!("boom"));
        assert_eq!(r.unwrap_err(), "a probe failed unexpectedly: boom");
    }
}
