//! Which NIC port each GPU should use, and what the machine supports, read
//! from sysfs and procfs.
//!
//! Everything here reads files below a root directory given by the caller
//! (`/` on a real machine), so the logic runs on fixture trees in tests.
//! Nothing here opens a device.
//!
//! * [`Topology::read`] lists the RDMA devices under
//!   `sys/class/infiniband/`: their PCI position, NUMA node, driver, and for
//!   each port its state, link layer, rate, LID and GID table.
//! * [`Topology::gpu`] finds a GPU by the PCI bus id CUDA reports
//!   (`"0000:1B:00.0"`, case-insensitive; the 8-digit domain of
//!   `nvidia-smi`, `"00000000:1B:00.0"`, works too).
//! * [`Distance`] classifies a GPU–NIC pair as NCCL does (PIX, PXB, PHB,
//!   NODE, SYS), from the two canonical PCI paths and the NUMA nodes.
//! * [`Topology::nearest`] picks the nearest usable port for one GPU;
//!   [`Topology::assign`] does it for all GPUs of a process group at once,
//!   spreading GPUs that are equally near to several NICs over different
//!   ones and reporting the GPUs that still share a NIC.
//! * [`nvidia_peermem_loaded`], [`dmabuf_supported_by_kernel`] and
//!   [`devx_privilege_hint`] answer the start-up questions about GPU memory
//!   registration and DevX.
//!
//! A port is usable when the [`HcaFilter`] (if any) accepts it, its state
//! is ACTIVE, and, for an Ethernet (RoCE) port, its GID table has a RoCE v2
//! entry ([`Port::roce_v2_gid_index`]). When no port is usable the error
//! says why and what to change ([`TopoError`]).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::hca::HcaFilter;

/// Where RDMA devices are listed, relative to the root.
pub const INFINIBAND_CLASS_DIR: &str = "sys/class/infiniband";
/// Where PCI devices are listed by bus id, relative to the root.
pub const PCI_DEVICES_DIR: &str = "sys/bus/pci/devices";

/// A failure to read the topology or to find a usable port. Messages say
/// what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopoError {
    /// A directory that exists could not be listed, or a file that must be
    /// read could not be.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// There is no RDMA device at all.
    #[error(
        "no RDMA device found under {}: install a ConnectX NIC with the mlx5_core/mlx5_ib drivers loaded \
         (`modprobe mlx5_ib`, and `ib_uverbs` for user space), or set DOORBELL_NIC=soft to use the software NIC",
        path.display()
    )]
    NoDevice {
        /// The directory that was looked in.
        path: PathBuf,
    },
    /// The device filter rejects every port there is.
    #[error(
        "the device filter `{filter}` (DOORBELL_IB_HCA) excludes every RDMA port; available: {}; \
         change or unset DOORBELL_IB_HCA",
        available.join(", ")
    )]
    FilterExcludesAll {
        /// The filter spec.
        filter: String,
        /// Every `device:port` present.
        available: Vec<String>,
    },
    /// RDMA devices exist but none lists a port.
    #[error(
        "RDMA device(s) {} list no ports (sys/class/infiniband/<device>/ports is empty or missing): the driver may \
         still be starting or the device failed to initialise; check `ibv_devinfo` and `dmesg`",
        devices.join(", ")
    )]
    NoPorts {
        /// The devices.
        devices: Vec<String>,
    },
    /// Every port the filter accepts is not ACTIVE.
    #[error(
        "no RDMA port is ACTIVE: {}; connect the cable and check the switch / subnet manager \
         (`ibstat`, `ibv_devinfo`; an InfiniBand port stays INIT until a subnet manager such as opensm runs){}",
        ports.iter().map(|p| format!("{}:{} is {}", p.device, p.port, p.state)).collect::<Vec<_>>().join(", "),
        filter.as_ref().map(|f| format!(", or widen DOORBELL_IB_HCA=`{f}`")).unwrap_or_default()
    )]
    AllPortsDown {
        /// The ports considered, with their state text.
        ports: Vec<PortStatus>,
        /// The filter in effect, if any.
        filter: Option<String>,
    },
    /// The only ACTIVE ports are Ethernet ports without a RoCE v2 GID.
    #[error(
        "RDMA port(s) {} are Ethernet (RoCE) but have no RoCE v2 GID: give the port's network interface an \
         IP address (each address adds a GID entry) and make sure RoCE v2 is enabled \
         (`cma_roce_mode -d <dev> -p <port> -m 2`, or the NIC's firmware settings)",
        ports.iter().map(|p| format!("{}:{}", p.device, p.port)).collect::<Vec<_>>().join(", ")
    )]
    NoRoceV2Gid {
        /// The ACTIVE Ethernet ports lacking one.
        ports: Vec<PortStatus>,
    },
    /// A GPU bus id is not of the form `[domain:]bus:device.function`.
    #[error("`{bus_id}` is not a PCI bus id: expected `dddd:bb:dd.f` in hex, e.g. `0000:1b:00.0`, as CUDA reports it")]
    BadBusId {
        /// What was given.
        bus_id: String,
    },
    /// No PCI device with the GPU's bus id exists.
    #[error("no PCI device {bus_id} under {}: check the bus id (`nvidia-smi --query-gpu=pci.bus_id --format=csv`)", path.display())]
    GpuNotFound {
        /// The normalised bus id.
        bus_id: String,
        /// The path looked at.
        path: PathBuf,
    },
    /// `proc/sys/kernel/osrelease` does not start with `major.minor`.
    #[error("cannot parse the kernel release `{text}` from {}: expected `major.minor...`", path.display())]
    BadKernelRelease {
        /// The file's content.
        text: String,
        /// The file.
        path: PathBuf,
    },
}

/// A port named in an error, with its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortStatus {
    /// The device name.
    pub device: String,
    /// The port number.
    pub port: u8,
    /// The state as sysfs gives it, e.g. `"1: DOWN"`.
    pub state: String,
}

/// A port's logical state (`ports/<n>/state`, e.g. `"4: ACTIVE"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// 1: no link.
    Down,
    /// 2: link up, not yet configured (InfiniBand: waiting for the subnet manager).
    Init,
    /// 3: configured, not yet active.
    Armed,
    /// 4: usable.
    Active,
    /// 5: active, deferring.
    ActiveDefer,
    /// Anything else, with its number if one could be read.
    Unknown(Option<u8>),
}

impl PortState {
    /// Parses sysfs' `"<number>: <NAME>"` text; the number decides.
    pub fn parse(text: &str) -> PortState {
        let num = text.trim().split(':').next().and_then(|n| n.trim().parse::<u8>().ok());
        match num {
            Some(1) => PortState::Down,
            Some(2) => PortState::Init,
            Some(3) => PortState::Armed,
            Some(4) => PortState::Active,
            Some(5) => PortState::ActiveDefer,
            other => PortState::Unknown(other),
        }
    }

    /// Whether the port can carry traffic.
    pub fn is_active(self) -> bool {
        self == PortState::Active
    }
}

/// A port's link layer (`ports/<n>/link_layer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID.
    InfiniBand,
    /// Ethernet: RoCE, addressed by GID.
    Ethernet,
    /// Something else (or unreadable), as text.
    Other(String),
}

impl LinkLayer {
    fn parse(text: &str) -> LinkLayer {
        match text.trim() {
            "InfiniBand" => LinkLayer::InfiniBand,
            "Ethernet" => LinkLayer::Ethernet,
            other => LinkLayer::Other(other.to_string()),
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkLayer::InfiniBand => f.write_str("InfiniBand"),
            LinkLayer::Ethernet => f.write_str("Ethernet"),
            LinkLayer::Other(s) => write!(f, "{s:?}"),
        }
    }
}

/// A GID entry's type (`ports/<n>/gid_attrs/types/<i>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GidType {
    /// `"IB/RoCE v1"`.
    IbRoceV1,
    /// `"RoCE v2"`: routable, UDP/IP encapsulated.
    RoceV2,
    /// Something else, as text.
    Other(String),
}

impl GidType {
    fn parse(text: &str) -> GidType {
        match text.trim() {
            "IB/RoCE v1" => GidType::IbRoceV1,
            "RoCE v2" => GidType::RoceV2,
            other => GidType::Other(other.to_string()),
        }
    }
}

/// One readable, non-zero entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID index.
    pub index: u32,
    /// The 16 bytes, network order.
    pub gid: [u8; 16],
    /// The type; `None` when `gid_attrs/types/<i>` is absent or unreadable
    /// (InfiniBand ports and old kernels).
    pub gid_type: Option<GidType>,
}

impl GidEntry {
    /// Whether the GID is an IPv4-mapped address, `::ffff:a.b.c.d`.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.gid[..10].iter().all(|&b| b == 0) && self.gid[10] == 0xff && self.gid[11] == 0xff
    }

    /// Whether the GID is an IPv6 link-local address, `fe80::/10`.
    pub fn is_link_local(&self) -> bool {
        self.gid[0] == 0xfe && (self.gid[1] & 0xc0) == 0x80
    }
}

/// Parses sysfs' GID text, eight colon-separated groups of four hex digits.
/// Returns `None` for anything else.
pub fn parse_gid(text: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    let mut groups = 0;
    for (i, g) in text.trim().split(':').enumerate() {
        if i >= 8 || g.len() != 4 {
            return None;
        }
        let v = u16::from_str_radix(g, 16).ok()?;
        out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
        groups += 1;
    }
    (groups == 8).then_some(out)
}

/// One port of an RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// The port number (1-based).
    pub number: u8,
    /// The logical state.
    pub state: PortState,
    /// The state as sysfs gives it (`"4: ACTIVE"`), or `"unreadable"`.
    pub state_text: String,
    /// The physical state (`"5: LinkUp"`), if readable.
    pub phys_state: Option<String>,
    /// The link layer.
    pub link_layer: LinkLayer,
    /// The rate (`"200 Gb/sec (4X HDR)"`), if readable.
    pub rate: Option<String>,
    /// The LID (InfiniBand), if readable.
    pub lid: Option<u16>,
    /// The readable, non-zero GID entries, by index.
    pub gids: Vec<GidEntry>,
}

impl Port {
    /// The GID index to use for RoCE v2: among the entries whose type is
    /// RoCE v2, an IPv4-mapped one first (as NCCL does by default), then a
    /// global IPv6 one, then a link-local one; the lowest index within each.
    /// `None` when the table has no RoCE v2 entry.
    pub fn roce_v2_gid_index(&self) -> Option<u32> {
        let rank = |g: &GidEntry| {
            if g.is_ipv4_mapped() {
                0
            } else if !g.is_link_local() {
                1
            } else {
                2
            }
        };
        self.gids
            .iter()
            .filter(|g| g.gid_type == Some(GidType::RoceV2))
            .min_by_key(|g| (rank(g), g.index))
            .map(|g| g.index)
    }
}

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

fn io_err(path: &Path, source: io::Error) -> TopoError {
    TopoError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn read_numa(path: &Path) -> Option<u32> {
    read_trimmed(path)?.parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
}

/// Lists a directory's entry names, sorted; `Ok(None)` when it does not exist.
fn list_dir(path: &Path) -> Result<Option<Vec<String>>, TopoError> {
    let rd = match fs::read_dir(path) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path, e)),
    };
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| io_err(path, e))?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_string());
        }
    }
    names.sort_by(|a, b| natural_cmp(a, b));
    Ok(Some(names))
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

/// Whether the `nvidia_peermem` kernel module (or MLNX_OFED's older
/// `nv_peer_mem`) is loaded, so `ibv_reg_mr` can register GPU memory
/// directly: `sys/module/nvidia_peermem` (or `sys/module/nv_peer_mem`)
/// exists below `root`.
pub fn nvidia_peermem_loaded(root: &Path) -> bool {
    root.join("sys/module/nvidia_peermem").exists() || root.join("sys/module/nv_peer_mem").exists()
}

/// The running kernel's `(major, minor)` from `proc/sys/kernel/osrelease`
/// below `root`.
pub fn kernel_version(root: &Path) -> Result<(u32, u32), TopoError> {
    let path = root.join("proc/sys/kernel/osrelease");
    let text = fs::read_to_string(&path).map_err(|e| io_err(&path, e))?;
    let bad = || TopoError::BadKernelRelease {
        text: text.trim().to_string(),
        path: path.clone(),
    };
    let (major, rest) = text.trim().split_once('.').ok_or_else(bad)?;
    let minor_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    let major = major.parse().map_err(|_| bad())?;
    let minor = rest[..minor_len].parse().map_err(|_| bad())?;
    Ok((major, minor))
}

/// Whether the kernel is new enough (5.12 or later) for RDMA dma-buf
/// registration (`ibv_reg_dmabuf_mr`), the way to register GPU memory
/// without `nvidia_peermem`. The GPU driver must export dma-bufs too
/// (NVIDIA's open kernel modules, R515+), which this does not check.
pub fn dmabuf_supported_by_kernel(root: &Path) -> Result<bool, TopoError> {
    Ok(kernel_version(root)? >= (5, 12))
}

/// What DevX (`mlx5dv_devx_*`, used to create the QPs and CQs a GPU drives)
/// needs, for messages when opening it fails with a permission error.
pub fn devx_privilege_hint() -> &'static str {
    "DevX needs: the mlx5_ib kernel driver with DevX support (upstream Linux 5.0 or later, or MLNX_OFED), \
     read-write access to /dev/infiniband/uverbs* (in a container pass the device through, e.g. \
     `--device /dev/infiniband`), firmware that allows DevX for user contexts, and for raw-packet or \
     other privileged objects the CAP_NET_RAW capability (run as root or grant `setcap cap_net_raw+ep` \
     to the binary); also raise the locked-memory limit (`ulimit -l unlimited`) for the queues and \
     registered buffers"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(hb: &str, chain: &[&str]) -> PciPath {
        PciPath {
            host_bridge: hb.into(),
            chain: chain.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn bus_ids() {
        assert_eq!(normalize_bus_id("0000:1B:00.0").as_deref(), Some("0000:1b:00.0"));
        assert_eq!(normalize_bus_id("00000000:1B:00.0").as_deref(), Some("0000:1b:00.0"));
        assert_eq!(normalize_bus_id("1b:00.1").as_deref(), Some("0000:1b:00.1"));
        assert_eq!(normalize_bus_id("0001:c1:1f.7").as_deref(), Some("0001:c1:1f.7"));
        assert_eq!(normalize_bus_id("0001C8B2:00:00.0").as_deref(), Some("1c8b2:00:00.0"));
        for bad in [
            "",
            "1b",
            "0000:1b:00",
            "0000:1b:20.0",
            "0000:1b:00.8",
            "0000:1bb:00.0",
            "0000:1b:00.0x",
            "x:1b:00.0",
            "100000000:1b:00.0",
        ] {
            assert_eq!(normalize_bus_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn gids() {
        let g = parse_gid("0000:0000:0000:0000:0000:ffff:0a00:0001").unwrap();
        assert_eq!(&g[10..], &[0xff, 0xff, 10, 0, 0, 1]);
        let e = GidEntry {
            index: 0,
            gid: g,
            gid_type: None,
        };
        assert!(e.is_ipv4_mapped() && !e.is_link_local());
        let ll = GidEntry {
            index: 0,
            gid: parse_gid("fe80:0000:0000:0000:0e42:a1ff:fe2b:3c4d").unwrap(),
            gid_type: None,
        };
        assert!(ll.is_link_local() && !ll.is_ipv4_mapped());
        assert_eq!(parse_gid("fe80::1"), None);
        assert_eq!(parse_gid("0000:0000:0000:0000:0000:ffff:0a00:0001:0000"), None);
        assert_eq!(parse_gid("0000:0000:0000:0000:0000:ffff:0a00"), None);
        assert_eq!(parse_gid("zzzz:0000:0000:0000:0000:ffff:0a00:0001"), None);
    }

    #[test]
    fn states() {
        assert_eq!(PortState::parse("4: ACTIVE"), PortState::Active);
        assert_eq!(PortState::parse("1: DOWN"), PortState::Down);
        assert_eq!(PortState::parse("2: INIT"), PortState::Init);
        assert_eq!(PortState::parse("9: WHAT"), PortState::Unknown(Some(9)));
        assert_eq!(PortState::parse("garbage"), PortState::Unknown(None));
    }

    #[test]
    fn distances() {
        let gpu = path("pci0000:17", &["0000:17:01.0", "0000:18:00.0", "0000:19:00.0", "0000:1b:00.0"]);
        let same_switch = path("pci0000:17", &["0000:17:01.0", "0000:18:00.0", "0000:19:01.0", "0000:1c:00.0"]);
        let same_rp = path("pci0000:17", &["0000:17:01.0", "0000:20:00.0", "0000:21:00.0", "0000:22:00.0"]);
        let same_hb = path("pci0000:17", &["0000:17:02.0", "0000:30:00.0"]);
        let other_hb = path("pci0000:40", &["0000:40:01.0", "0000:41:00.0"]);
        assert_eq!(Distance::between(&gpu, Some(0), &same_switch, Some(0)), Distance::Pix);
        assert_eq!(Distance::between(&gpu, Some(0), &same_rp, Some(0)), Distance::Pxb);
        assert_eq!(Distance::between(&gpu, Some(0), &same_hb, Some(0)), Distance::Phb);
        assert_eq!(Distance::between(&gpu, Some(0), &other_hb, Some(0)), Distance::Node);
        assert_eq!(Distance::between(&gpu, None, &other_hb, None), Distance::Node);
        assert_eq!(Distance::between(&gpu, Some(0), &other_hb, Some(1)), Distance::Sys);
        assert_eq!(Distance::between(&gpu, Some(0), &other_hb, None), Distance::Sys);
        assert!(
            Distance::Pix < Distance::Pxb
                && Distance::Pxb < Distance::Phb
                && Distance::Phb < Distance::Node
                && Distance::Node < Distance::Sys
        );
    }

    #[test]
    fn pci_paths() {
        let root = Path::new("/r");
        let p = PciPath::from_sysfs(
            root,
            Path::new("/r/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/infiniband/mlx5_0"),
        )
        .unwrap();
        assert_eq!(p, path("pci0000:17", &["0000:17:01.0", "0000:18:00.0"]));
        assert_eq!(p.bus_id(), "0000:18:00.0");
        assert_eq!(p.bridges(), &["0000:17:01.0".to_string()]);
        assert_eq!(PciPath::from_sysfs(root, Path::new("/r/sys/devices/virtual/net/eth0")), None);
        assert_eq!(
            PciPath::from_sysfs(root, Path::new("/other/sys/devices/pci0000:17/0000:17:01.0")),
            None
        );
        assert_eq!(PciPath::from_sysfs(root, Path::new("/r/sys/devices/pci0000:17")), None);
        let hv = PciPath::from_sysfs(
            root,
            Path::new("/r/sys/devices/LNXSYSTM:00/LNXSYBUS:00/PNP0A03:00/device:07/VMBUS:01/47505500-0001-0000-3130-444531304235/pci0001:00/0001:00:00.0"),
        )
        .unwrap();
        assert_eq!(hv, path("pci0001:00", &["0001:00:00.0"]));
        assert_eq!(PciPath::from_sysfs(root, Path::new("/r/sys/devices/platform/pcie-0/x")), None);
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["mlx5_10", "mlx5_2", "mlx5_1", "mlx4_0", "mlx5_01"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["mlx4_0", "mlx5_1", "mlx5_01", "mlx5_2", "mlx5_10"]);
    }

    #[test]
    fn roce_gid_choice() {
        let g = |index, text: &str, t: Option<GidType>| GidEntry {
            index,
            gid: parse_gid(text).unwrap(),
            gid_type: t,
        };
        let mut port = Port {
            number: 1,
            state: PortState::Active,
            state_text: "4: ACTIVE".into(),
            phys_state: None,
            link_layer: LinkLayer::Ethernet,
            rate: None,
            lid: None,
            gids: vec![
                g(0, "fe80:0000:0000:0000:0e42:a1ff:fe2b:3c4d", Some(GidType::IbRoceV1)),
                g(1, "fe80:0000:0000:0000:0e42:a1ff:fe2b:3c4d", Some(GidType::RoceV2)),
                g(2, "0000:0000:0000:0000:0000:ffff:0a00:0001", Some(GidType::IbRoceV1)),
                g(3, "0000:0000:0000:0000:0000:ffff:0a00:0001", Some(GidType::RoceV2)),
            ],
        };
        assert_eq!(port.roce_v2_gid_index(), Some(3));
        port.gids.truncate(2);
        assert_eq!(port.roce_v2_gid_index(), Some(1));
        port.gids
            .push(g(5, "2001:0db8:0000:0000:0000:0000:0000:0001", Some(GidType::RoceV2)));
        assert_eq!(port.roce_v2_gid_index(), Some(5));
        port.gids.retain(|e| e.gid_type != Some(GidType::RoceV2));
        assert_eq!(port.roce_v2_gid_index(), None);
    }

    #[test]
    fn kernel_release_parse() {
        let dir = std::env::temp_dir().join(format!("doorbell-topo-unit-{}", std::process::id()));
        let proc_dir = dir.join("proc/sys/kernel");
        fs::create_dir_all(&proc_dir).unwrap();
        let write = |s: &str| fs::write(proc_dir.join("osrelease"), s).unwrap();
        write("5.15.0-91-generic\n");
        assert_eq!(kernel_version(&dir).unwrap(), (5, 15));
        assert!(dmabuf_supported_by_kernel(&dir).unwrap());
        write("5.11.22\n");
        assert!(!dmabuf_supported_by_kernel(&dir).unwrap());
        write("6.8.0\n");
        assert!(dmabuf_supported_by_kernel(&dir).unwrap());
        write("4.18.0-513.el8.x86_64");
        assert!(!dmabuf_supported_by_kernel(&dir).unwrap());
        write("5-12");
        assert!(matches!(kernel_version(&dir), Err(TopoError::BadKernelRelease { .. })));
        write("6");
        assert!(matches!(kernel_version(&dir), Err(TopoError::BadKernelRelease { .. })));
        write("6.x");
        assert!(matches!(kernel_version(&dir), Err(TopoError::BadKernelRelease { .. })));
        write("6.10-rc1");
        assert_eq!(kernel_version(&dir).unwrap(), (6, 10));
        write("linux");
        assert!(matches!(kernel_version(&dir), Err(TopoError::BadKernelRelease { .. })));
        fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(kernel_version(&dir), Err(TopoError::Io { .. })));
    }
}
