//! The [`Topology`]: the RDMA devices below a root, and the choice of a
//! port for each GPU ([`Topology::nearest`], [`Topology::assign`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::error::{io_err, TopoError};
use super::pci::{natural_cmp, normalize_bus_id, Distance, PciPath};
use super::port::{parse_gid, GidEntry, GidType, LinkLayer, Port, PortState, PortStatus};
use super::system::{list_dir, read_numa, read_trimmed, INFINIBAND_CLASS_DIR, PCI_DEVICES_DIR};
use crate::hca::HcaFilter;

/// An RDMA device as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaDevice {
    /// The device name, e.g. `"mlx5_0"`.
    pub name: String,
    /// Its PCI position; `None` for a device that is not on PCI (rxe, siw).
    pub pci: Option<PciPath>,
    /// Its NUMA node; `None` when unknown (`-1`) or unreadable.
    pub numa_node: Option<u32>,
    /// The kernel driver of the PCI function, e.g. `"mlx5_core"`.
    pub driver: Option<String>,
    /// The ports, by number.
    pub ports: Vec<Port>,
}

/// A GPU's PCI position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// The normalised bus id, `dddd:bb:dd.f` in lower case.
    pub bus_id: String,
    /// Its PCI position.
    pub pci: Option<PciPath>,
    /// Its NUMA node; `None` when unknown.
    pub numa_node: Option<u32>,
}

/// The port chosen for a GPU, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The GPU's normalised bus id.
    pub gpu: String,
    /// The RDMA device name.
    pub device: String,
    /// The port number.
    pub port: u8,
    /// The port's link layer.
    pub link_layer: LinkLayer,
    /// The GPU–NIC distance.
    pub distance: Distance,
    /// For Ethernet, the RoCE v2 GID index; `None` for InfiniBand.
    pub gid_index: Option<u32>,
    /// The device's driver, e.g. `"mlx5_core"`.
    pub driver: Option<String>,
    /// Other GPUs (bus ids) given the same device and port by
    /// [`Topology::assign`]; empty from [`Topology::nearest`].
    pub shared_with: Vec<String>,
    /// A sentence saying why this port was chosen.
    pub reason: String,
}

/// The RDMA devices of a machine, read from sysfs below a root.
#[derive(Debug, Clone)]
pub struct Topology {
    root: PathBuf,
    devices: Vec<RdmaDevice>,
}

impl Topology {
    /// Reads the RDMA devices below `root` (`/` on a real machine). A
    /// missing `sys/class/infiniband` gives an empty topology (the
    /// selection methods then report [`TopoError::NoDevice`]); attributes
    /// that cannot be read are left `None` / unknown. Fails only when a
    /// directory that exists cannot be listed.
    pub fn read(root: &Path) -> Result<Topology, TopoError> {
        let canonical_root = fs::canonicalize(root).map_err(|e| io_err(root, e))?;
        let class = root.join(INFINIBAND_CLASS_DIR);
        let mut devices = Vec::new();
        for name in list_dir(&class)?.unwrap_or_default() {
            let dev_dir = class.join(&name);
            let pci_dev = dev_dir.join("device");
            let pci = fs::canonicalize(&pci_dev)
                .ok()
                .and_then(|c| PciPath::from_sysfs(&canonical_root, &c));
            let numa_node = read_numa(&pci_dev.join("numa_node"));
            let driver = fs::read_link(pci_dev.join("driver"))
                .ok()
                .and_then(|l| l.file_name().and_then(|n| n.to_str()).map(String::from));
            let mut ports = Vec::new();
            for pname in list_dir(&dev_dir.join("ports"))?.unwrap_or_default() {
                let Ok(number) = pname.parse::<u8>() else { continue };
                ports.push(read_port(&dev_dir.join("ports").join(&pname), number)?);
            }
            devices.push(RdmaDevice {
                name,
                pci,
                numa_node,
                driver,
                ports,
            });
        }
        Ok(Topology {
            root: root.to_path_buf(),
            devices,
        })
    }

    /// Builds a topology from devices described directly (for callers that
    /// learned them elsewhere, and for tests). GPUs are still looked up
    /// below `root`.
    pub fn from_devices(root: &Path, devices: Vec<RdmaDevice>) -> Topology {
        Topology {
            root: root.to_path_buf(),
            devices,
        }
    }

    /// The root the topology was read from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The RDMA devices, in natural name order (`mlx5_2` before `mlx5_10`).
    pub fn devices(&self) -> &[RdmaDevice] {
        &self.devices
    }

    /// Finds a GPU by PCI bus id (see [`normalize_bus_id`]) under
    /// `sys/bus/pci/devices/`.
    pub fn gpu(&self, bus_id: &str) -> Result<GpuInfo, TopoError> {
        let norm = normalize_bus_id(bus_id).ok_or_else(|| TopoError::BadBusId {
            bus_id: bus_id.to_string(),
        })?;
        let link = self.root.join(PCI_DEVICES_DIR).join(&norm);
        let canonical = fs::canonicalize(&link).map_err(|_| TopoError::GpuNotFound {
            bus_id: norm.clone(),
            path: link.clone(),
        })?;
        let canonical_root = fs::canonicalize(&self.root).map_err(|e| io_err(&self.root, e))?;
        let pci = PciPath::from_sysfs(&canonical_root, &canonical);
        let numa_node = read_numa(&link.join("numa_node"));
        Ok(GpuInfo {
            bus_id: norm,
            pci,
            numa_node,
        })
    }

    /// The distance from a GPU to a device; SYS when either is not on PCI.
    pub fn distance(gpu: &GpuInfo, dev: &RdmaDevice) -> Distance {
        match (&gpu.pci, &dev.pci) {
            (Some(g), Some(n)) => Distance::between(g, gpu.numa_node, n, dev.numa_node),
            _ => Distance::Sys,
        }
    }

    /// The usable ports for one GPU, nearest first, ties in natural name
    /// then port order; or the error saying why there are none.
    fn candidates(&self, gpu: &GpuInfo, filter: Option<&HcaFilter>) -> Result<Vec<Candidate>, TopoError> {
        if self.devices.is_empty() {
            return Err(TopoError::NoDevice {
                path: self.root.join(INFINIBAND_CLASS_DIR),
            });
        }
        let mut accepted = Vec::new();
        let mut available = Vec::new();
        for (di, dev) in self.devices.iter().enumerate() {
            for (pi, port) in dev.ports.iter().enumerate() {
                available.push(format!("{}:{}", dev.name, port.number));
                if filter.is_none_or(|f| f.accepts(&dev.name, port.number)) {
                    accepted.push((di, pi));
                }
            }
        }
        if available.is_empty() {
            return Err(TopoError::NoPorts {
                devices: self.devices.iter().map(|d| d.name.clone()).collect(),
            });
        }
        if accepted.is_empty() {
            let filter = filter.map(|f| f.spec().to_string()).unwrap_or_default();
            return Err(TopoError::FilterExcludesAll { filter, available });
        }
        let mut out = Vec::new();
        let mut down = Vec::new();
        let mut no_gid = Vec::new();
        for (di, pi) in accepted {
            let dev = &self.devices[di];
            let port = &dev.ports[pi];
            let status = PortStatus {
                device: dev.name.clone(),
                port: port.number,
                state: port.state_text.clone(),
            };
            let distance = Self::distance(gpu, dev);
            if !port.state.is_active() {
                down.push((distance, status));
                continue;
            }
            let gid_index = match port.link_layer {
                LinkLayer::Ethernet => match port.roce_v2_gid_index() {
                    Some(i) => Some(i),
                    None => {
                        no_gid.push(status);
                        continue;
                    }
                },
                _ => None,
            };
            out.push(Candidate {
                dev: di,
                port: pi,
                distance,
                gid_index,
                skipped: Vec::new(),
            });
        }
        if out.is_empty() {
            return Err(if no_gid.is_empty() {
                TopoError::AllPortsDown {
                    ports: down.into_iter().map(|(_, s)| s).collect(),
                    filter: filter.map(|f| f.spec().to_string()),
                }
            } else {
                TopoError::NoRoceV2Gid { ports: no_gid }
            });
        }
        out.sort_by(|a, b| {
            a.distance
                .cmp(&b.distance)
                .then_with(|| natural_cmp(&self.devices[a.dev].name, &self.devices[b.dev].name))
                .then_with(|| {
                    self.devices[a.dev].ports[a.port]
                        .number
                        .cmp(&self.devices[b.dev].ports[b.port].number)
                })
        });
        // Nearer ports that were passed over, for the reason text.
        let best = out[0].distance;
        let skipped: Vec<String> = down
            .iter()
            .filter(|(d, _)| *d < best)
            .map(|(d, s)| format!("{}:{} is nearer ({d}) but {}", s.device, s.port, s.state))
            .chain(
                no_gid
                    .iter()
                    .map(|s| format!("{}:{} is Ethernet without a RoCE v2 GID", s.device, s.port)),
            )
            .collect();
        for c in &mut out {
            c.skipped = skipped.clone();
        }
        Ok(out)
    }

    fn choice(&self, gpu: &GpuInfo, c: &Candidate, note: Option<String>) -> Choice {
        let dev = &self.devices[c.dev];
        let port = &dev.ports[c.port];
        let mut reason = format!(
            "{}:{} is the nearest usable port to GPU {}: {} ({}), {} {}",
            dev.name,
            port.number,
            gpu.bus_id,
            c.distance,
            c.distance.describe(),
            port.state_text,
            port.link_layer
        );
        if let Some(i) = c.gid_index {
            reason.push_str(&format!(", RoCE v2 GID index {i}"));
        }
        if dev.pci.is_none() {
            reason.push_str("; the device is not on PCI, so its distance is taken as SYS");
        }
        if let Some(note) = note {
            reason.push_str("; ");
            reason.push_str(&note);
        }
        if !c.skipped.is_empty() {
            reason.push_str("; passed over: ");
            reason.push_str(&c.skipped.join(", "));
        }
        Choice {
            gpu: gpu.bus_id.clone(),
            device: dev.name.clone(),
            port: port.number,
            link_layer: port.link_layer.clone(),
            distance: c.distance,
            gid_index: c.gid_index,
            driver: dev.driver.clone(),
            shared_with: Vec::new(),
            reason,
        }
    }

    /// The nearest usable port for one GPU: the nearest ACTIVE port the
    /// filter accepts (with a RoCE v2 GID if Ethernet), ties broken by
    /// natural device-name order, then port number.
    pub fn nearest(&self, gpu_bus_id: &str, filter: Option<&HcaFilter>) -> Result<Choice, TopoError> {
        let gpu = self.gpu(gpu_bus_id)?;
        let cands = self.candidates(&gpu, filter)?;
        Ok(self.choice(&gpu, &cands[0], None))
    }

    /// A port for each GPU, in the order given. Each GPU gets a port at its
    /// nearest distance; among the ports at that distance, GPUs get
    /// different ports where possible (a maximum matching, tried in name
    /// order), and GPUs left over take the least-shared one. GPUs that end
    /// up on the same device and port list each other in
    /// [`Choice::shared_with`]. A bus id given twice is one GPU and gets the
    /// same port both times.
    pub fn assign(&self, gpu_bus_ids: &[&str], filter: Option<&HcaFilter>) -> Result<Vec<Choice>, TopoError> {
        let mut gpus: Vec<GpuInfo> = Vec::new();
        let mut order = Vec::with_capacity(gpu_bus_ids.len());
        for id in gpu_bus_ids {
            let g = self.gpu(id)?;
            match gpus.iter().position(|x| x.bus_id == g.bus_id) {
                Some(i) => order.push(i),
                None => {
                    order.push(gpus.len());
                    gpus.push(g);
                }
            }
        }
        // Each GPU's candidates at its best distance.
        let mut best: Vec<Vec<Candidate>> = Vec::with_capacity(gpus.len());
        for g in &gpus {
            let cands = self.candidates(g, filter)?;
            let d = cands[0].distance;
            best.push(cands.into_iter().take_while(|c| c.distance == d).collect());
        }
        // Among the maximum matchings of GPUs to distinct ports at their best
        // distance, take the one that gives each GPU in turn the first port
        // in name order that still allows a maximum matching.
        let key = |c: &Candidate| (c.dev, c.port);
        let edges: Vec<Vec<(usize, usize)>> = best.iter().map(|cs| cs.iter().map(key).collect()).collect();
        let all: Vec<usize> = (0..gpus.len()).collect();
        let target = max_matching(&edges, &all, &[]);
        let mut matched: Vec<Option<usize>> = vec![None; gpus.len()];
        let mut taken: Vec<(usize, usize)> = Vec::new();
        for g in 0..gpus.len() {
            let rest: Vec<usize> = (g + 1..gpus.len()).collect();
            for (ci, &k) in edges[g].iter().enumerate() {
                if taken.contains(&k) {
                    continue;
                }
                taken.push(k);
                if taken.len() + max_matching(&edges, &rest, &taken) == target {
                    matched[g] = Some(ci);
                    break;
                }
                taken.pop();
            }
        }
        let mut load: BTreeMap<(usize, usize), usize> = BTreeMap::new();
        for (g, m) in matched.iter().enumerate() {
            if let Some(ci) = m {
                *load.entry(key(&best[g][*ci])).or_default() += 1;
            }
        }
        for g in 0..gpus.len() {
            if matched[g].is_none() {
                // Least loaded; min_by_key keeps the first (name order) on ties.
                let ci = (0..best[g].len())
                    .min_by_key(|&ci| load.get(&key(&best[g][ci])).copied().unwrap_or(0))
                    .unwrap_or(0);
                *load.entry(key(&best[g][ci])).or_default() += 1;
                matched[g] = Some(ci);
            }
        }
        let picked: Vec<&Candidate> = (0..gpus.len()).map(|g| &best[g][matched[g].unwrap_or(0)]).collect();
        let mut choices: Vec<Choice> = Vec::with_capacity(gpus.len());
        for (g, gpu) in gpus.iter().enumerate() {
            let k = key(picked[g]);
            let shared_with: Vec<String> = gpus
                .iter()
                .enumerate()
                .filter(|&(h, _)| h != g && key(picked[h]) == k)
                .map(|(_, o)| o.bus_id.clone())
                .collect();
            let alternatives = best[g].len();
            let note = match (shared_with.is_empty(), alternatives) {
                (true, 1) => None,
                (true, n) => Some(format!(
                    "{n} ports are at this distance; the others went to other GPUs or follow in name order"
                )),
                (false, 1) => Some(format!(
                    "it is the only port at this distance, shared with GPU(s) {}",
                    shared_with.join(", ")
                )),
                (false, n) => Some(format!(
                    "{n} ports are at this distance but there are more GPUs than ports; shared with GPU(s) {}",
                    shared_with.join(", ")
                )),
            };
            let mut c = self.choice(gpu, picked[g], note);
            c.shared_with = shared_with;
            choices.push(c);
        }
        Ok(order.into_iter().map(|i| choices[i].clone()).collect())
    }
}

#[derive(Debug, Clone)]
struct Candidate {
    dev: usize,
    port: usize,
    distance: Distance,
    gid_index: Option<u32>,
    skipped: Vec<String>,
}

/// The size of a maximum matching of `gpus` to distinct ports (keys in
/// `edges[g]`), not using the ports in `blocked` (Kuhn's augmenting paths).
fn max_matching(edges: &[Vec<(usize, usize)>], gpus: &[usize], blocked: &[(usize, usize)]) -> usize {
    fn augment(
        g: usize,
        edges: &[Vec<(usize, usize)>],
        blocked: &[(usize, usize)],
        owner: &mut BTreeMap<(usize, usize), usize>,
        seen: &mut [bool],
    ) -> bool {
        for &k in &edges[g] {
            if blocked.contains(&k) {
                continue;
            }
            match owner.get(&k).copied() {
                None => {
                    owner.insert(k, g);
                    return true;
                }
                Some(other) if !seen[other] => {
                    seen[other] = true;
                    if augment(other, edges, blocked, owner, seen) {
                        owner.insert(k, g);
                        return true;
                    }
                }
                Some(_) => {}
            }
        }
        false
    }
    let mut owner = BTreeMap::new();
    let mut size = 0;
    for &g in gpus {
        let mut seen = vec![false; edges.len()];
        seen[g] = true;
        if augment(g, edges, blocked, &mut owner, &mut seen) {
            size += 1;
        }
    }
    size
}

fn read_port(dir: &Path, number: u8) -> Result<Port, TopoError> {
    let state_text = read_trimmed(&dir.join("state")).unwrap_or_else(|| "unreadable".to_string());
    let state = PortState::parse(&state_text);
    let link_layer = read_trimmed(&dir.join("link_layer"))
        .map(|t| LinkLayer::parse(&t))
        .unwrap_or(LinkLayer::Other("unreadable".into()));
    let lid = read_trimmed(&dir.join("lid")).and_then(|t| u16::from_str_radix(t.trim_start_matches("0x"), 16).ok());
    let mut gids = Vec::new();
    for name in list_dir(&dir.join("gids"))?.unwrap_or_default() {
        let Ok(index) = name.parse::<u32>() else { continue };
        // Unused entries fail to read (EINVAL) or read as the zero GID.
        let Some(gid) = read_trimmed(&dir.join("gids").join(&name)).and_then(|t| parse_gid(&t)) else {
            continue;
        };
        if gid == [0; 16] {
            continue;
        }
        let gid_type = read_trimmed(&dir.join("gid_attrs").join("types").join(&name)).map(|t| GidType::parse(&t));
        gids.push(GidEntry { index, gid, gid_type });
    }
    gids.sort_by_key(|g| g.index);
    Ok(Port {
        number,
        state,
        state_text,
        phys_state: read_trimmed(&dir.join("phys_state")),
        link_layer,
        rate: read_trimmed(&dir.join("rate")),
        lid,
        gids,
    })
}
