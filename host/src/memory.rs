//! Device memory and mapped (pinned, device-visible) host memory.
//!
//! Device addresses are handed to kernels as raw pointers
//! ([`DeviceBuffer::as_mut_ptr`]); on the emulator they are host addresses.

use std::marker::PhantomData;

use crate::device::Device;
use crate::error::{Error, Result};

/// Plain data that may live in device memory and be copied bytewise.
///
/// # Safety
/// Every bit pattern of the type's size, including all zeros, must be a valid
/// value, and it must have no padding or pointers into host memory.
pub unsafe trait DeviceCopy: Copy + Send + Sync + 'static {}

macro_rules! device_copy {
    ($($t:ty),*) => { $(
        // SAFETY: plain numbers: every bit pattern is valid, no padding.
        unsafe impl DeviceCopy for $t {}
    )* };
}
device_copy!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128, f32, f64, usize, isize);
// SAFETY: arrays of plain data are plain data.
unsafe impl<T: DeviceCopy, const N: usize> DeviceCopy for [T; N] {}

/// The address of an empty buffer: nothing is allocated; aligned like an
/// allocation, never dereferenced.
const EMPTY_ADDR: u64 = 256;

/// Bytes of `len` elements of `T`, or [`Error::OutOfMemory`] when that
/// overflows the address space.
fn bytes_of<T>(len: usize, device: &Device) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| Error::OutOfMemory {
        bytes: u64::MAX,
        device: device.inner.memory_label(),
        detail: format!("{len} elements of {} bytes overflow the address space", std::mem::size_of::<T>()),
    })
}

/// `len` elements of `T` in device memory. Freed on drop (which, like
/// `cudaFree`, waits for the device's outstanding work).
pub struct DeviceBuffer<T: DeviceCopy> {
    device: Device,
    addr: u64,
    len: usize,
    _t: PhantomData<T>,
}

// SAFETY: the buffer owns device memory; access goes through `&self`/`&mut self`.
unsafe impl<T: DeviceCopy> Send for DeviceBuffer<T> {}
// SAFETY: `&self` methods only read through the driver.
unsafe impl<T: DeviceCopy> Sync for DeviceBuffer<T> {}

impl Device {
    /// Allocates `len` zeroed elements.
    pub fn alloc_zeroed<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = bytes_of::<T>(len, self)?;
        let addr = if bytes == 0 { EMPTY_ADDR } else { self.inner.alloc_zeroed(bytes)? };
        Ok(DeviceBuffer {
            device: self.clone(),
            addr,
            len,
            _t: PhantomData,
        })
    }

    /// Allocates and fills from `data`.
    pub fn alloc_from<T: DeviceCopy>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let mut b = self.alloc_zeroed(data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
    /// The device this buffer lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// Device address as a kernel argument.
    pub fn as_ptr(&self) -> *const T {
        self.addr as *const T
    }
    /// Device address as a kernel argument.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.addr as *mut T
    }
    /// Raw device address (`CUdeviceptr` on a GPU).
    pub fn as_raw(&self) -> u64 {
        self.addr
    }

    /// Refuses a host slice of `host` elements that is not the buffer's length.
    fn check_host_len(&self, host: usize) -> Result<()> {
        if host != self.len {
            return Err(Error::LengthMismatch { device: self.len, host });
        }
        Ok(())
    }

    /// Copies `src` into the buffer; waits for the device's outstanding work first.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.check_host_len(src.len())?;
        // SAFETY: `T` is plain data (DeviceCopy).
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr() as *const u8, std::mem::size_of_val(src)) };
        // SAFETY: the allocation spans exactly these bytes.
        unsafe { self.device.write_raw(self.addr, bytes) }
    }

    /// Copies the buffer into `dst`; waits for the device's outstanding work first.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.check_host_len(dst.len())?;
        // SAFETY: `T` is plain data: any bytes written are a valid `T`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut u8, std::mem::size_of_val(dst)) };
        // SAFETY: the allocation spans exactly these bytes.
        unsafe { self.device.read_raw(self.addr, bytes) }
    }

    /// The buffer's contents as a `Vec`.
    pub fn to_host(&self) -> Result<Vec<T>> {
        // SAFETY: `DeviceCopy` types are valid when zeroed.
        let mut v = vec![unsafe { std::mem::zeroed::<T>() }; self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// Sets every byte to zero; waits for the device's outstanding work first.
    pub fn zero(&mut self) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        self.device.synchronize()?;
        // SAFETY: the allocation spans num_bytes.
        unsafe { self.device.inner.zero(self.addr, self.num_bytes()) }
    }
}

impl<T: DeviceCopy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.num_bytes() == 0 {
            return;
        }
        // SAFETY: allocated by the device's alloc_zeroed with this size; freed once.
        unsafe { self.device.inner.free(self.addr, self.num_bytes()) };
    }
}

impl<T: DeviceCopy> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>[{}] @ {:#x} on {:?}",
            std::any::type_name::<T>(),
            self.len,
            self.addr,
            self.device
        )
    }
}

/// Pinned host memory mapped into the device's address space: the GPU reads
/// and writes it directly (flags, doorbells, host-visible status words).
pub struct MappedBuffer<T: DeviceCopy> {
    device: Device,
    host: *mut T,
    dev_addr: u64,
    len: usize,
    /// Whether the drop waits for the whole device first (the public
    /// allocation's promise); memory the library owns and knows idle
    /// (a stopped NIC's rings) does not, as that wait would also wait for
    /// other ranks' persistent kernels on the GPU.
    wait_on_drop: bool,
}

// SAFETY: owns its allocation; concurrent device access is through raw pointers only.
unsafe impl<T: DeviceCopy> Send for MappedBuffer<T> {}
// SAFETY: as above.
unsafe impl<T: DeviceCopy> Sync for MappedBuffer<T> {}

impl Device {
    /// Allocates `len` zeroed elements of mapped pinned host memory.
    pub fn alloc_mapped<T: DeviceCopy>(&self, len: usize) -> Result<MappedBuffer<T>> {
        let bytes = bytes_of::<T>(len.max(1), self)?;
        let (host, dev_addr) = self.inner.alloc_mapped(bytes)?;
        Ok(MappedBuffer {
            device: self.clone(),
            host: host as *mut T,
            dev_addr,
            len,
            wait_on_drop: true,
        })
    }

    /// As [`Self::alloc_mapped`], for memory whose owner knows that no
    /// kernel and no NIC uses it when it drops: the drop frees it without
    /// waiting for the device (the free itself waits while a persistent
    /// kernel runs on the GPU, as `cuMemFree`'s does).
    pub(crate) fn alloc_mapped_idle_on_drop<T: DeviceCopy>(&self, len: usize) -> Result<MappedBuffer<T>> {
        let mut m = self.alloc_mapped(len)?;
        m.wait_on_drop = false;
        Ok(m)
    }
}

impl<T: DeviceCopy> MappedBuffer<T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Host address.
    pub fn host_ptr(&self) -> *mut T {
        self.host
    }
    /// Device address, as a kernel argument.
    pub fn device_ptr(&self) -> *mut T {
        self.dev_addr as *mut T
    }
    /// Reads element `i` (volatile: the device may be writing it).
    pub fn read(&self, i: usize) -> T {
        assert!(i < self.len, "index {i} out of bounds for a mapped buffer of {}", self.len);
        // SAFETY: in bounds; volatile because another agent writes it.
        unsafe { std::ptr::read_volatile(self.host.add(i)) }
    }
    /// Writes element `i` (volatile).
    pub fn write(&self, i: usize, v: T) {
        assert!(i < self.len, "index {i} out of bounds for a mapped buffer of {}", self.len);
        // SAFETY: in bounds.
        unsafe { std::ptr::write_volatile(self.host.add(i), v) }
    }
}

impl<T: DeviceCopy> Drop for MappedBuffer<T> {
    fn drop(&mut self) {
        if self.wait_on_drop {
            self.device.wait_idle();
        }
        // SAFETY: allocated by the device's alloc_mapped with this size (see
        // alloc_mapped), idle after the synchronize (or by its owner's
        // word); freed once.
        unsafe {
            self.device
                .inner
                .free_mapped(self.host as *mut u8, self.len.max(1) * std::mem::size_of::<T>())
        };
    }
}

impl Device {
    /// Copies host bytes to device address `addr` (synchronous; waits for
    /// the device's outstanding work first).
    ///
    /// # Safety
    /// `addr..addr+src.len()` is device memory of this device.
    pub(crate) unsafe fn write_raw(&self, addr: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.synchronize()?;
        // SAFETY: the caller vouches that the range is device memory of this device.
        unsafe { self.inner.write(addr, src) }
    }

    /// Copies device bytes at `addr` to the host (synchronous).
    ///
    /// # Safety
    /// `addr..addr+dst.len()` is device memory of this device.
    pub(crate) unsafe fn read_raw(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.synchronize()?;
        // SAFETY: the caller vouches that the range is device memory of this device.
        unsafe { self.inner.read(addr, dst) }
    }
}
