//! The CUDA driver calls the ConnectX NIC needs of a GPU context (the one
//! [`Device::as_cuda`](crate::Device::as_cuda) hands out): a dma-buf of
//! device memory for registration, the GPU mapping of the NIC's UAR page,
//! and the GPU's PCI bus id for choosing the nearest NIC.

use cudarc::driver::{sys, CudaContext};

use crate::error::{CudaCall, Result};

/// `cuMemGetHandleForAddressRange(DMA_BUF_FD)`: a dma-buf file descriptor
/// for `len` bytes of device memory at `addr` (page-aligned range), which
/// `ibv_reg_dmabuf_mr` / DevX umem registration take. The caller closes it.
pub(super) fn dmabuf_fd(ctx: &CudaContext, addr: u64, len: usize) -> Result<i32> {
    ctx.bind_to_thread().call("cuCtxSetCurrent")?;
    let mut fd: core::ffi::c_int = -1;
    // SAFETY: `fd` is a valid out-pointer for an int; the driver checks the range.
    unsafe {
        sys::cuMemGetHandleForAddressRange(
            (&mut fd as *mut core::ffi::c_int).cast(),
            addr,
            len,
            sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    }
    .result()
    .call("cuMemGetHandleForAddressRange")?;
    Ok(fd)
}

/// `cuMemHostRegister(IOMEMORY | DEVICEMAP)` of `len` bytes of I/O memory
/// mapped at `ptr` (a NIC's UAR page), then `cuMemHostGetDevicePointer`:
/// the address at which kernels on `ctx`'s GPU write that memory.
///
/// # Safety
/// `ptr..ptr+len` is a page-aligned mapping that stays mapped until
/// [`host_unregister`].
pub(super) unsafe fn host_register_io(ctx: &CudaContext, ptr: *mut core::ffi::c_void, len: usize) -> Result<u64> {
    ctx.bind_to_thread().call("cuCtxSetCurrent")?;
    let flags = sys::CU_MEMHOSTREGISTER_IOMEMORY | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
    // SAFETY: caller's contract.
    unsafe { sys::cuMemHostRegister_v2(ptr, len, flags) }
        .result()
        .call("cuMemHostRegister")?;
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: `ptr` was just registered; `dptr` is a valid out-pointer.
    if let Err(e) = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, ptr, 0) }.result() {
        // SAFETY: registered above, not used by anything yet.
        let _ = unsafe { sys::cuMemHostUnregister(ptr) };
        return Err(e).call("cuMemHostGetDevicePointer");
    }
    Ok(dptr)
}

/// `cuMemHostUnregister` of a mapping [`host_register_io`] registered.
///
/// # Safety
/// No kernel uses the device address any more.
pub(super) unsafe fn host_unregister(ctx: &CudaContext, ptr: *mut core::ffi::c_void) -> Result<()> {
    ctx.bind_to_thread().call("cuCtxSetCurrent")?;
    // SAFETY: caller's contract.
    unsafe { sys::cuMemHostUnregister(ptr) }.result().call("cuMemHostUnregister")
}

/// `cuDeviceGetPCIBusId`: the GPU's PCI bus id, `0000:1b:00.0`.
pub(super) fn pci_bus_id(ctx: &CudaContext) -> Result<String> {
    let mut buf = [0 as core::ffi::c_char; 32];
    // SAFETY: the buffer holds `len` chars; the driver NUL-terminates.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as core::ffi::c_int, ctx.cu_device()) }
        .result()
        .call("cuDeviceGetPCIBusId")?;
    // SAFETY: NUL-terminated by the driver within the buffer.
    let s = unsafe { core::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(s.to_string_lossy().into_owned())
}
