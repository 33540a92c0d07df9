//! A heap shared with other processes through CUDA's virtual memory
//! management: consecutive physical allocations ("parts") mapped at one
//! virtual range, each exportable as a file descriptor, so that a peer
//! process can map some parts read-write and others read-only (legacy CUDA
//! IPC maps a whole allocation read-write). The communicator uses it for a
//! heap whose tail holds the soft NIC's port tables: peers may write the
//! heap and the tables' inboxes, not the tables themselves.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::cuda::Device;
use crate::error::{CudaCall, Error, Result};

/// Every part's length and offset is a multiple of this (2 MiB, the
/// allocation granularity of the GPUs doorbell targets; a GPU whose
/// granularity does not divide it is refused by
/// [`Device::vmm_unshareable`]).
pub(crate) const VMM_ALIGN: u64 = 2 << 20;

/// Parts mapped at one virtual range in this process: the owner's
/// allocation or a peer's imported one. Unmapped, released and the range
/// freed on drop.
pub(crate) struct VmmRange {
    ctx: Arc<CudaContext>,
    /// The GPU whose persistent kernels a release waits for.
    ordinal: usize,
    va: u64,
    /// Bytes reserved at `va`, and the prefix of them mapped.
    reserved: usize,
    mapped: usize,
    handles: Vec<sys::CUmemGenericAllocationHandle>,
}

impl VmmRange {
    /// The range's address in this process.
    pub(crate) fn as_raw(&self) -> u64 {
        self.va
    }

    /// Each part as a file descriptor for another process
    /// ([`Device::vmm_import`]).
    pub(crate) fn export(&self) -> Result<Vec<OwnedFd>> {
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        self.handles
            .iter()
            .map(|&h| {
                let mut fd: i32 = -1;
                // SAFETY: an allocation created with the POSIX descriptor handle type.
                unsafe {
                    sys::cuMemExportToShareableHandle(
                        &mut fd as *mut i32 as *mut _,
                        h,
                        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                        0,
                    )
                }
                .result()
                .call("cuMemExportToShareableHandle")?;
                // SAFETY: a descriptor the driver just created for this process.
                Ok(unsafe { OwnedFd::from_raw_fd(fd) })
            })
            .collect()
    }
}

impl Drop for VmmRange {
    fn drop(&mut self) {
        if self.reserved == 0 && self.mapped == 0 && self.handles.is_empty() {
            return; // released, or never held anything
        }
        // `cuMemUnmap` may wait for the GPU's kernels: while a soft NIC
        // engine runs there, the range is kept and released after it.
        let ordinal = self.ordinal;
        let moved = |me: &mut VmmRange| VmmRange {
            ctx: me.ctx.clone(),
            ordinal,
            va: me.va,
            reserved: std::mem::take(&mut me.reserved),
            mapped: std::mem::take(&mut me.mapped),
            handles: std::mem::take(&mut me.handles),
        };
        let later = moved(self);
        let mut later = Some(later);
        // Kept, it is released by its own drop (moved out of `later`).
        let keep = |e: &mut super::cuda::Persistent| {
            let range = later.take().expect("once");
            e.later.push(Box::new(move || drop(range)));
        };
        if super::cuda::defer_while_persistent(ordinal, keep) {
            return;
        }
        let Some(now) = later else { return };
        // The driver's virtual-memory calls need no current context, but a
        // bound one does no harm.
        let _ = now.ctx.bind_to_thread();
        now.release();
    }
}

impl VmmRange {
    /// Unmaps, releases and frees what this value holds, once.
    fn release(mut self) {
        let (va, reserved, mapped, handles) = (
            self.va,
            std::mem::take(&mut self.reserved),
            std::mem::take(&mut self.mapped),
            std::mem::take(&mut self.handles),
        );
        // SAFETY: the range and handles this value created, each undone once;
        // a failure leaves the rest in place (nothing else can be done).
        unsafe {
            if mapped != 0 {
                let _ = sys::cuMemUnmap(va, mapped);
            }
            for &h in &handles {
                let _ = sys::cuMemRelease(h);
            }
            if reserved != 0 {
                let _ = sys::cuMemAddressFree(va, reserved);
            }
        }
    }
}

impl Device {
    /// Why this GPU cannot share a heap through [`Self::vmm_alloc`] now, or
    /// `None` when it can.
    pub(crate) fn vmm_unshareable(&self) -> Option<String> {
        use sys::CUdevice_attribute::*;
        if self.persistent_running() {
            // Mapping may wait for the GPU's kernels, and an engine kernel
            // runs until its communicator's teardown.
            return Some("a soft NIC engine of another communicator runs on this GPU".into());
        }
        let attr = |a| self.context().attribute(a).unwrap_or(0);
        if attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED) == 0 {
            return Some("the GPU has no virtual memory management".into());
        }
        if attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) == 0 {
            return Some("the GPU cannot export allocations as file descriptors".into());
        }
        let mut g = 0usize;
        let prop = self.vmm_prop();
        // SAFETY: a plain query.
        let r = unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        };
        match r.result() {
            Ok(()) if g != 0 && VMM_ALIGN.is_multiple_of(g as u64) => None,
            Ok(()) => Some(format!("the GPU's allocation granularity ({g} bytes) does not divide {VMM_ALIGN}")),
            Err(e) => Some(format!("cuMemGetAllocationGranularity failed: {e}")),
        }
    }

    fn vmm_prop(&self) -> sys::CUmemAllocationProp {
        use sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED as RDMA;
        // SAFETY: a plain C struct; zero is every field's default.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ordinal() as i32;
        // A NIC may register it (GPUDirect RDMA) where the GPU allows.
        prop.allocFlags.gpuDirectRDMACapable = (self.context().attribute(RDMA).unwrap_or(0) != 0) as u8;
        prop
    }

    /// Reserves a range and maps the parts in it, read-write for this GPU
    /// before part `read_only_from` and read-only from it on; the handles
    /// are released on failure.
    fn vmm_map(&self, handles: Vec<sys::CUmemGenericAllocationHandle>, parts: &[u64], read_only_from: usize) -> Result<VmmRange> {
        let len: u64 = parts.iter().sum();
        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: a fresh reservation of `len` bytes.
        let r = unsafe { sys::cuMemAddressReserve(&mut va, len as usize, VMM_ALIGN as usize, 0, 0) }.result();
        // From here (or at once, on failure) the range's drop undoes what was done.
        let mut range = VmmRange {
            ctx: self.context().clone(),
            ordinal: self.ordinal(),
            va,
            reserved: len as usize,
            mapped: 0,
            handles,
        };
        if let Err(e) = r {
            range.reserved = 0;
            range.va = 0;
            return Err(Error::Cuda {
                call: "cuMemAddressReserve",
                source: e,
            });
        }
        for (&h, &n) in range.handles.iter().zip(parts) {
            // SAFETY: the next `n` bytes of the reservation; `h` is `n` bytes.
            unsafe { sys::cuMemMap(va + range.mapped as u64, n as usize, 0, h, 0) }
                .result()
                .call("cuMemMap")?;
            range.mapped += n as usize;
        }
        let ro: u64 = parts[..read_only_from.min(parts.len())].iter().sum();
        if ro != 0 {
            self.vmm_access(va, ro, sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE)?;
        }
        if ro < len {
            self.vmm_access(va + ro, len - ro, sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ)?;
        }
        Ok(range)
    }

    fn vmm_access(&self, va: u64, len: u64, flags: sys::CUmemAccess_flags) -> Result<()> {
        // SAFETY: a plain C struct; zero is every field's default.
        let mut desc: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        desc.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        desc.location.id = self.ordinal() as i32;
        desc.flags = flags;
        // SAFETY: `va..va + len` is mapped by this process.
        unsafe { sys::cuMemSetAccess(va, len as usize, &desc, 1) }
            .result()
            .call("cuMemSetAccess")
    }

    /// Zeroed parts of the given lengths (multiples of [`VMM_ALIGN`]) on
    /// this GPU, consecutive in one range, each exportable.
    pub(crate) fn vmm_alloc(&self, parts: &[u64]) -> Result<VmmRange> {
        if parts.is_empty() || parts.iter().any(|&n| n == 0 || n % VMM_ALIGN != 0) {
            return Err(Error::comm(format!(
                "heap parts {parts:?} must be non-zero multiples of {VMM_ALIGN}"
            )));
        }
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        let prop = self.vmm_prop();
        let mut handles = Vec::new();
        for &n in parts {
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: a fresh allocation of `n` bytes.
            let r = unsafe { sys::cuMemCreate(&mut h, n as usize, &prop, 0) }.result();
            if let Err(e) = r {
                for h in handles {
                    // SAFETY: created above, not mapped.
                    let _ = unsafe { sys::cuMemRelease(h) };
                }
                let total: u64 = parts.iter().sum();
                return Err(if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
                    Error::OutOfMemory {
                        bytes: total,
                        device: self.memory_label(),
                        detail: format!("cuMemCreate failed: {e}"),
                    }
                } else {
                    Error::Cuda {
                        call: "cuMemCreate",
                        source: e,
                    }
                });
            }
            handles.push(h);
        }
        let range = self.vmm_map(handles, parts, parts.len())?;
        // SAFETY: the range is mapped read-write for this GPU.
        unsafe { self.zero(range.va, range.mapped) }?;
        Ok(range)
    }

    /// Maps the parts another process exported ([`VmmRange::export`]), of
    /// the given lengths, consecutive in one range: read-write for this GPU
    /// before part `read_only_from`, read-only from it on. `rank`, `peer`
    /// and `peer_ordinal` describe a failure.
    pub(crate) fn vmm_import(
        &self,
        fds: &[OwnedFd],
        parts: &[u64],
        read_only_from: usize,
        (peer_ordinal, rank, peer): (u32, usize, usize),
    ) -> Result<VmmRange> {
        if fds.len() != parts.len() {
            return Err(Error::PeerUnreachable {
                rank,
                peer,
                reason: format!("it handed over {} heap parts, not {}", fds.len(), parts.len()),
            });
        }
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        let mut handles = Vec::new();
        for fd in fds {
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: a descriptor received from the peer; the driver
            // validates it (the descriptor stays ours, closed on drop).
            let r = unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut h,
                    fd.as_raw_fd() as usize as *mut _,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            }
            .result();
            if let Err(e) = r {
                for h in handles {
                    // SAFETY: imported above, not mapped.
                    let _ = unsafe { sys::cuMemRelease(h) };
                }
                return Err(Error::PeerUnreachable {
                    rank,
                    peer,
                    reason: format!(
                        "cuMemImportFromShareableHandle of its heap failed ({e:?}); its GPU {peer_ordinal} may not be \
                         reachable from GPU {}",
                        self.ordinal()
                    ),
                });
            }
            handles.push(h);
        }
        self.vmm_map(handles, parts, read_only_from).map_err(|e| Error::PeerUnreachable {
            rank,
            peer,
            reason: format!(
                "its heap parts could not be mapped at the lengths this rank expects ({parts:?} bytes): {e}; \
                 every rank must run this doorbell version"
            ),
        })
    }
}
