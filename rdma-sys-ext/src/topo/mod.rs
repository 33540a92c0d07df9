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
//! A port is usable when the [`HcaFilter`](crate::hca::HcaFilter) (if any) accepts it, its state
//! is ACTIVE, and, for an Ethernet (RoCE) port, its GID table has a RoCE v2
//! entry ([`Port::roce_v2_gid_index`]). When no port is usable the error
//! says why and what to change ([`TopoError`]).

mod error;
mod pci;
mod port;
mod system;
#[cfg(test)]
mod tests;
mod topology;

pub use error::TopoError;
pub use pci::{natural_cmp, normalize_bus_id, Distance, PciPath};
pub use port::{parse_gid, GidEntry, GidType, LinkLayer, Port, PortState, PortStatus};
pub use system::{
    devx_privilege_hint, dmabuf_supported_by_kernel, kernel_version, nvidia_peermem_loaded, INFINIBAND_CLASS_DIR, PCI_DEVICES_DIR,
};
pub use topology::{Choice, GpuInfo, RdmaDevice, Topology};
