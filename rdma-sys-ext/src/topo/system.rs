//! Reading the machine: the sysfs directories and files the topology is
//! read from, and the start-up questions about GPU memory registration and
//! DevX ([`nvidia_peermem_loaded`], [`dmabuf_supported_by_kernel`],
//! [`devx_privilege_hint`]).

use std::fs;
use std::io;
use std::path::Path;

use super::error::{io_err, TopoError};
use super::pci::natural_cmp;

/// Where RDMA devices are listed, relative to the root.
pub const INFINIBAND_CLASS_DIR: &str = "sys/class/infiniband";
/// Where PCI devices are listed by bus id, relative to the root.
pub const PCI_DEVICES_DIR: &str = "sys/bus/pci/devices";

pub(super) fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

pub(super) fn read_numa(path: &Path) -> Option<u32> {
    read_trimmed(path)?.parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
}

/// Lists a directory's entry names, sorted; `Ok(None)` when it does not exist.
pub(super) fn list_dir(path: &Path) -> Result<Option<Vec<String>>, TopoError> {
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
