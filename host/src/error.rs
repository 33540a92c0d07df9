//! The one error type of the host runtime.

/// Result alias for the host runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the host runtime can fail with. Each variant says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The CUDA driver library could not be loaded.
    #[error(
        "no CUDA driver on this machine (libcuda.so could not be loaded); run on a machine with an NVIDIA GPU and driver, \
         or use the CPU emulator (Backend::Cpu, or DOORBELL_DEVICE=cpu)"
    )]
    NoDriver,
    /// The driver loaded but reports no GPU.
    #[error("the CUDA driver reports no GPU; use the CPU emulator (Backend::Cpu, or DOORBELL_DEVICE=cpu)")]
    NoGpu,
    /// A GPU ordinal past the last GPU.
    #[error("GPU {ordinal} does not exist: this machine has {count} GPU(s)")]
    NoSuchGpu {
        /// Asked for.
        ordinal: usize,
        /// Available.
        count: usize,
    },
    /// A CUDA driver call failed.
    #[cfg(feature = "runtime")]
    #[error("CUDA call {call} failed: {source}")]
    Cuda {
        /// The driver call.
        call: &'static str,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// The kernel is not in the loaded PTX module.
    #[error("kernel `{name}` is not in the PTX module; was it declared with #[kernel] in the crate the PTX was built from?")]
    KernelNotFound {
        /// PTX entry name.
        name: &'static str,
    },
    /// The PTX was not built into this binary.
    #[error(
        "this binary carries no PTX (it was built with DOORBELL_SKIP_PTX=1 or without the device toolchain); \
         rebuild after running scripts/setup.sh, or use the CPU emulator (DOORBELL_DEVICE=cpu)"
    )]
    PtxNotBuilt,
    /// A kernel failed on the CPU emulator.
    #[cfg(feature = "runtime")]
    #[error("kernel `{kernel}` failed: {source}")]
    Emulator {
        /// The kernel.
        kernel: &'static str,
        /// What went wrong.
        source: doorbell_kernels::emu::EmuError,
    },
    /// A launch configuration the device cannot run.
    #[error("invalid launch of `{kernel}`: {reason}")]
    InvalidLaunch {
        /// The kernel.
        kernel: &'static str,
        /// Why.
        reason: String,
    },
    /// Host and device buffers of different lengths.
    #[error("length mismatch: device buffer holds {device} elements, host slice {host}")]
    LengthMismatch {
        /// Device buffer length.
        device: usize,
        /// Host slice length.
        host: usize,
    },
    /// `DOORBELL_DEVICE` holds something else than gpu, cpu or auto.
    #[error("DOORBELL_DEVICE={0:?} is not one of gpu, cpu, auto")]
    BadBackend(String),
    /// Objects from two different devices were combined.
    #[error("{0}")]
    DeviceMismatch(&'static str),
    /// A worker thread of the emulator could not be started.
    #[error("could not start an emulator stream thread: {0}")]
    Thread(#[source] std::io::Error),
}

#[cfg(feature = "runtime")]
pub(crate) trait CudaCall<T> {
    fn call(self, call: &'static str) -> Result<T>;
}

#[cfg(feature = "runtime")]
impl<T> CudaCall<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn call(self, call: &'static str) -> Result<T> {
        self.map_err(|source| Error::Cuda { call, source })
    }
}
