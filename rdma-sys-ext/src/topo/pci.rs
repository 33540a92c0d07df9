//! PCI positions and the GPU–NIC [`Distance`] (NCCL's PIX, PXB, PHB, NODE,
//! SYS), with the bus-id and name orderings the topology sorts by.

use std::cmp::Ordering;
use std::fmt;
use std::path::Path;

/// A canonical PCI position: the host bridge (`pci0000:17`) and the chain
/// of bus ids from the root port down to the device itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciPath {
    /// The host bridge directory name, e.g. `"pci0000:17"`.
    pub host_bridge: String,
    /// Bus ids from the root port to the device, e.g.
    /// `["0000:17:01.0", "0000:18:00.0", "0000:19:00.0", "0000:1b:00.0"]`.
    pub chain: Vec<String>,
}

impl PciPath {
    /// Reads a canonical sysfs device path (absolute, already resolved),
    /// relative to the canonical `root`: `sys/devices/pciDDDD:BB/<bdf>/.../<bdf>`.
    /// Components below the last bus id (e.g. `infiniband/mlx5_0`) are
    /// dropped. `None` when the path is not a PCI device (e.g.
    /// `sys/devices/virtual/...` for a software RDMA device).
    pub fn from_sysfs(canonical_root: &Path, canonical: &Path) -> Option<PciPath> {
        let rel = canonical.strip_prefix(canonical_root).ok()?;
        let mut comps = rel.iter().map(|c| c.to_str());
        if comps.next()? != Some("sys") || comps.next()? != Some("devices") {
            return None;
        }
        // Usually `sys/devices/pci0000:17/...`; in Hyper-V guests the host
        // bridge sits deeper (`sys/devices/LNXSYSTM:00/.../VMBUS:01/<guid>/pci0001:00/...`).
        let host_bridge = loop {
            let c = comps.next()??;
            if is_host_bridge(c) {
                break c;
            }
        };
        let mut chain = Vec::new();
        for c in comps {
            match c {
                Some(c) if normalize_bus_id(c).as_deref() == Some(c) => chain.push(c.to_string()),
                _ => break,
            }
        }
        if chain.is_empty() {
            return None;
        }
        Some(PciPath {
            host_bridge: host_bridge.to_string(),
            chain,
        })
    }

    /// The device's own bus id (the last element of the chain).
    pub fn bus_id(&self) -> &str {
        self.chain.last().map(String::as_str).unwrap_or_default()
    }

    /// The bridges above the device (the chain without its last element).
    pub fn bridges(&self) -> &[String] {
        &self.chain[..self.chain.len().saturating_sub(1)]
    }
}

/// Whether a sysfs directory name is a PCI host bridge, `pci<domain>:<bus>`.
fn is_host_bridge(name: &str) -> bool {
    let Some((domain, bus)) = name.strip_prefix("pci").and_then(|r| r.split_once(':')) else {
        return false;
    };
    let hex = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_hexdigit());
    domain.len() >= 4 && hex(domain) && bus.len() == 2 && hex(bus)
}

/// How far apart a GPU and a NIC are, nearest first (NCCL's classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Distance {
    /// Below the same PCIe switch: they share a bridge below the root port.
    Pix,
    /// Below the same root port but not the same switch (only the root port
    /// is shared).
    Pxb,
    /// Below the same host bridge (`pci0000:xx`) through different root ports.
    Phb,
    /// Different host bridges on the same NUMA node.
    Node,
    /// Different NUMA nodes (across the CPU interconnect), or unknown.
    Sys,
}

impl Distance {
    /// The class of a GPU–NIC pair. Different host bridges count as NODE
    /// when both NUMA nodes are known and equal, or both unknown (the
    /// kernel reports no NUMA information on single-node machines), and SYS
    /// otherwise.
    ///
    /// sysfs does not tell one switch built of several internal levels from
    /// cascaded switches, so any shared bridge below the root port counts as
    /// PIX.
    pub fn between(gpu: &PciPath, gpu_numa: Option<u32>, nic: &PciPath, nic_numa: Option<u32>) -> Distance {
        if gpu.host_bridge != nic.host_bridge {
            return if gpu_numa == nic_numa { Distance::Node } else { Distance::Sys };
        }
        let shared = gpu.bridges().iter().zip(nic.bridges()).take_while(|(a, b)| a == b).count();
        match shared {
            0 => Distance::Phb,
            1 => Distance::Pxb,
            _ => Distance::Pix,
        }
    }

    /// What the class means, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Distance::Pix => "below the same PCIe switch",
            Distance::Pxb => "below the same PCIe root port, different switches",
            Distance::Phb => "through the PCIe host bridge",
            Distance::Node => "different host bridges on the same NUMA node",
            Distance::Sys => "across NUMA nodes",
        }
    }
}

impl fmt::Display for Distance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Distance::Pix => "PIX",
            Distance::Pxb => "PXB",
            Distance::Phb => "PHB",
            Distance::Node => "NODE",
            Distance::Sys => "SYS",
        })
    }
}

/// Orders names with embedded numbers numerically (`mlx5_2` < `mlx5_10`).
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn split(s: &str) -> Vec<(bool, &str)> {
        let mut parts = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                parts.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        parts
    }
    let (pa, pb) = (split(a), split(b));
    for (x, y) in pa.iter().zip(&pb) {
        let ord = match (x, y) {
            ((true, nx), (true, ny)) => {
                let (tx, ty) = (nx.trim_start_matches('0'), ny.trim_start_matches('0'));
                tx.len()
                    .cmp(&ty.len())
                    .then_with(|| tx.cmp(ty))
                    .then_with(|| nx.len().cmp(&ny.len()))
            }
            ((_, sx), (_, sy)) => sx.cmp(sy),
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    pa.len().cmp(&pb.len())
}

/// Normalises a PCI bus id to `dddd:bb:dd.f` in lower case, as sysfs names
/// devices (a domain above `ffff`, as in some Hyper-V guests, keeps its
/// extra digits). Accepts an optional domain of up to 8 hex digits
/// (`nvidia-smi` prints 8), any case.
pub fn normalize_bus_id(bus_id: &str) -> Option<String> {
    let s = bus_id.trim();
    let mut parts: Vec<&str> = s.split(':').collect();
    if parts.len() == 2 {
        parts.insert(0, "0");
    }
    let [domain, bus, devfn] = parts[..] else { return None };
    let (dev, func) = devfn.split_once('.')?;
    let hex = |t: &str, max_len: usize| -> Option<u32> {
        if t.is_empty() || t.len() > max_len || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(t, 16).ok()
    };
    let domain = hex(domain, 8)?;
    let bus = hex(bus, 2)?;
    let dev = hex(dev, 2)?;
    let func = hex(func, 1)?;
    if dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}
