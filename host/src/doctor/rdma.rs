//! rdma-core and the RDMA devices: the libraries `rdma-sys-ext` loads,
//! the devices and ports sysfs shows ([`rdma_sys_ext::topo`]), and the NIC
//! each GPU would open ([`crate::nic::select`]).

use std::path::Path;
use std::sync::Arc;

use rdma_sys_ext::topo::{GidType, LinkLayer, Topology};
use rdma_sys_ext::{DeviceList, Verbs, LIBIBVERBS, LIBMLX5};
use serde::Serialize;

/// A shared library as loaded.
#[derive(Clone, Debug, Serialize)]
pub struct Library {
    /// Its soname.
    pub name: String,
    /// The file it resolved to (`None`: not loaded).
    pub path: Option<String>,
    /// The version its file name carries (`libibverbs.so.1.14.44.0` →
    /// `1.14.44.0`).
    pub version: Option<String>,
    /// Why it did not load.
    pub error: Option<String>,
}

/// A port of an RDMA device.
#[derive(Clone, Debug, Serialize)]
pub struct RdmaPort {
    /// Port number.
    pub port: u8,
    /// `ACTIVE`, `DOWN`, ...
    pub state: String,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: String,
    /// The rate sysfs reports.
    pub rate: Option<String>,
    /// RoCE v2 GID entries: index and address.
    pub roce_v2_gids: Vec<(u32, String)>,
    /// The GID index the NIC set-up would use (RoCE v2, IPv4-mapped first).
    pub gid_index: Option<u32>,
}

/// An RDMA device.
#[derive(Clone, Debug, Serialize)]
pub struct RdmaDev {
    /// `mlx5_0`, ...
    pub name: String,
    /// Its PCI bus id.
    pub pci_bus_id: Option<String>,
    /// Its kernel driver.
    pub driver: Option<String>,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// Ports.
    pub ports: Vec<RdmaPort>,
    /// Distance to each GPU (in ordinal order): `PIX`, `PXB`, `PHB`, `NODE`, `SYS`.
    pub gpu_distance: Vec<String>,
    /// Whether rdma-core lists it (it opens only what it lists).
    pub listed_by_rdma_core: Option<bool>,
}

/// The RDMA section.
#[derive(Clone, Debug, Serialize, Default)]
pub struct RdmaReport {
    /// libibverbs and libmlx5.
    pub libraries: Vec<Library>,
    /// The devices of `/sys/class/infiniband`.
    pub devices: Vec<RdmaDev>,
    /// What could not be read, and why.
    pub errors: Vec<String>,
    /// `nvidia_peermem` loaded (GPU memory registration through `ibv_reg_mr`).
    pub nvidia_peermem: bool,
    /// The NIC each GPU's rank would open (`DOORBELL_NIC`, `DOORBELL_IB_HCA`),
    /// or on the emulator the one rank 0 would.
    pub nic_per_gpu: Vec<String>,
}

/// The file a loaded library resolved to, from `/proc/self/maps`.
pub fn loaded_path(maps: &str, soname_prefix: &str) -> Option<String> {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(soname_prefix))
        })
        .map(str::to_string)
}

/// The version a library's file name carries after `.so.`.
pub fn version_of(path: &str) -> Option<String> {
    let file = Path::new(path).file_name()?.to_str()?;
    let (_, v) = file.split_once(".so.")?;
    (!v.is_empty()).then(|| v.to_string())
}

fn library(name: &str, loaded: Result<(), String>, maps: &str) -> Library {
    let stem = name.split(".so").next().unwrap_or(name);
    let path = loaded
        .is_ok()
        .then(|| loaded_path(maps, &format!("{stem}.so")))
        .flatten()
        .map(|p| std::fs::canonicalize(&p).map(|c| c.display().to_string()).unwrap_or(p));
    Library {
        name: name.to_string(),
        version: path.as_deref().and_then(version_of),
        path,
        error: loaded.err(),
    }
}

/// Reads rdma-core, the devices and the NIC choice for each GPU (PCI bus
/// ids in ordinal order; empty on the emulator).
pub fn probe(gpus: &[String]) -> RdmaReport {
    let mut out = RdmaReport {
        nvidia_peermem: rdma_sys_ext::topo::nvidia_peermem_loaded(Path::new("/")),
        ..RdmaReport::default()
    };
    let verbs = Verbs::load().map(Arc::new).map_err(|e| e.to_string());
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    out.libraries
        .push(library(LIBIBVERBS, verbs.as_ref().map(drop).map_err(Clone::clone), &maps));
    let mlx5 = match &verbs {
        Ok(v) if v.has_mlx5() => Ok(()),
        Ok(v) => Err(v.mlx5_load_error().unwrap_or("not found").to_string()),
        Err(_) => Err(format!("not tried: {LIBIBVERBS} did not load")),
    };
    out.libraries.push(library(LIBMLX5, mlx5, &maps));
    let listed: Option<Vec<String>> = match &verbs {
        Ok(v) => match DeviceList::new(v) {
            Ok(list) => Some(list.iter().filter_map(|d| d.ok().map(|d| d.name)).collect()),
            Err(e) => {
                out.errors.push(format!("rdma-core cannot list RDMA devices: {e}"));
                None
            }
        },
        Err(_) => None,
    };
    match Topology::read(Path::new("/")) {
        Err(e) => out.errors.push(format!("cannot read the RDMA devices from sysfs: {e}")),
        Ok(topo) => {
            let gpu_infos: Vec<_> = gpus.iter().map(|b| topo.gpu(b)).collect();
            for d in topo.devices() {
                out.devices.push(RdmaDev {
                    name: d.name.clone(),
                    pci_bus_id: d.pci.as_ref().map(|p| p.bus_id().to_string()),
                    driver: d.driver.clone(),
                    numa_node: d.numa_node,
                    ports: d
                        .ports
                        .iter()
                        .map(|p| RdmaPort {
                            port: p.number,
                            state: p.state_text.clone(),
                            link_layer: match &p.link_layer {
                                LinkLayer::InfiniBand => "InfiniBand".to_string(),
                                LinkLayer::Ethernet => "Ethernet (RoCE)".to_string(),
                                other => other.to_string(),
                            },
                            rate: p.rate.clone(),
                            roce_v2_gids: p
                                .gids
                                .iter()
                                .filter(|g| g.gid_type == Some(GidType::RoceV2))
                                .map(|g| (g.index, std::net::Ipv6Addr::from(g.gid).to_string()))
                                .collect(),
                            gid_index: p.roce_v2_gid_index(),
                        })
                        .collect(),
                    gpu_distance: gpu_infos
                        .iter()
                        .map(|g| match g {
                            Ok(g) => Topology::distance(g, d).to_string(),
                            Err(e) => format!("unknown ({e})"),
                        })
                        .collect(),
                    listed_by_rdma_core: listed.as_ref().map(|l| l.contains(&d.name)),
                });
            }
        }
    }
    out.nic_per_gpu = if gpus.is_empty() {
        vec![describe(crate::nic::select::select(0, None, &[]))]
    } else {
        gpus.iter()
            .enumerate()
            .map(|(i, b)| format!("GPU {i}: {}", describe(crate::nic::select::select(i, Some(b), gpus))))
            .collect()
    };
    out
}

fn describe(s: crate::Result<crate::nic::select::Selection>) -> String {
    match s {
        Ok(s) => s.describe(),
        Err(e) => format!("none: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_path_and_version_from_maps() {
        let maps = "7f00-7f10 r--p 00000000 fe:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                    7f20-7f30 r-xp 00001000 fe:01 456 /usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0\n\
                    7f40-7f50 rw-p 00000000 00:00 0\n";
        let p = loaded_path(maps, "libibverbs.so").expect("found");
        assert_eq!(p, "/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0");
        assert_eq!(version_of(&p).as_deref(), Some("1.14.44.0"));
        assert_eq!(loaded_path(maps, "libmlx5.so"), None);
        assert_eq!(version_of("/lib/libfoo.so"), None);
    }
}
