//! Shared-memory heaps of emulator ranks in different processes.

use crate::error::{Error, Result};

pub(super) struct ShmRegion {
    pub(super) ptr: *mut u8,
    len: usize,
    pub(super) path: Option<std::path::PathBuf>,
}

// SAFETY: a process-shared mapping; accessed through raw device-style pointers.
unsafe impl Send for ShmRegion {}
// SAFETY: as above.
unsafe impl Sync for ShmRegion {}

impl ShmRegion {
    pub(super) fn create(path: &std::path::Path, len: usize) -> Result<ShmRegion> {
        use std::os::unix::io::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::comm(format!("cannot create shared heap {}: {e}", path.display())))?;
        f.set_len(len as u64)
            .map_err(|e| Error::comm(format!("cannot size shared heap {}: {e}", path.display())))?;
        Self::map(f.as_raw_fd(), len, Some(path.to_path_buf()))
    }

    pub(super) fn open(path: &std::path::Path, len: usize) -> Result<ShmRegion> {
        use std::os::unix::io::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::comm(format!("cannot open peer heap {}: {e}", path.display())))?;
        Self::map(f.as_raw_fd(), len, None)
    }

    fn map(fd: i32, len: usize, path: Option<std::path::PathBuf>) -> Result<ShmRegion> {
        // SAFETY: maps a file we hold open; the mapping outlives the fd.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::comm(format!(
                "mmap of a shared heap failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(ShmRegion {
            ptr: p as *mut u8,
            len,
            path,
        })
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        // SAFETY: mapped by `map` with this length.
        unsafe { libc::munmap(self.ptr as *mut _, self.len) };
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}
