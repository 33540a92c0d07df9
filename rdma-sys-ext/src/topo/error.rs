//! [`TopoError`]: what goes wrong reading the topology or finding a usable
//! port, each message saying what to change.

use std::io;
use std::path::{Path, PathBuf};

use super::port::PortStatus;

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

/// The error for a path that could not be read.
pub(super) fn io_err(path: &Path, source: io::Error) -> TopoError {
    TopoError::Io {
        path: path.to_path_buf(),
        source,
    }
}
