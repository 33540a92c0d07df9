//! Shared-memory heaps of emulator ranks in different processes.
//!
//! Each rank's heap is a file `/dev/shm/doorbell-<pid>-<32 hex digits>`:
//! the digits are 16 bytes from `/dev/urandom`, so other users cannot guess
//! the name, and the file is created with `O_CREAT | O_EXCL | O_NOFOLLOW`
//! and mode 0600, so nobody else can open it nor slip a file or a link in
//! under that name first. The names travel through the authenticated world
//! *before* any file exists; every rank removes every name of the job as
//! soon as all ranks have mapped all heaps (or as soon as the set-up fails),
//! so a rank killed after creating its file still leaves nothing behind
//! once any other rank notices.
//!
//! A peer's name is checked before it is opened ([`check_heap_path`]), and
//! the opened file before it is mapped ([`ShmRegion::open`]): a regular file
//! of our own user, private, at least as long as the heap. A shorter file
//! would raise SIGBUS on the first access past its end.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where heap files live, and how their names start.
const PREFIX: &str = "/dev/shm/doorbell-";
/// Random bytes in a heap file's name (hex-encoded).
const RANDOM_BYTES: usize = 16;
/// The only mode a heap file has.
const MODE: u32 = 0o600;

pub(super) struct ShmRegion {
    pub(super) ptr: *mut u8,
    len: usize,
}

// SAFETY: the region is plain shared memory with no thread affinity; ranks
// access it only through raw device-style pointers, synchronised by kernels.
unsafe impl Send for ShmRegion {}
// SAFETY: as above; `ShmRegion` itself is never mutated after mapping.
unsafe impl Sync for ShmRegion {}

/// A fresh, unguessable heap file name for this process.
pub(super) fn new_heap_path() -> Result<PathBuf> {
    let mut r = [0u8; RANDOM_BYTES];
    crate::world::random_bytes(&mut r).map_err(|e| Error::comm(format!("cannot read /dev/urandom for a shared heap name: {e}")))?;
    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
    Ok(PathBuf::from(format!("{PREFIX}{}-{hex}", std::process::id())))
}

/// Checks that `raw`, a heap file name rank `peer` published, names a file
/// of this job's shape: `/dev/shm/doorbell-<pid>-<32 lowercase hex>`, and
/// nothing else (no other directory, no `..`, no trailing bytes).
pub(super) fn check_heap_path(raw: &[u8], rank: usize, peer: usize) -> Result<PathBuf> {
    let refuse = |why: &str| Error::PeerUnreachable {
        rank,
        peer,
        reason: format!(
            "it published {:?} as its shared heap file, {why}; every rank must run this doorbell version \
             (heap files are named {PREFIX}<pid>-<32 hex digits>)",
            String::from_utf8_lossy(&raw[..raw.len().min(200)])
        ),
    };
    let s = std::str::from_utf8(raw).map_err(|_| refuse("which is not UTF-8"))?;
    let rest = s
        .strip_prefix(PREFIX)
        .ok_or_else(|| refuse(&format!("which is not in {PREFIX}*")))?;
    let (pid, hex) = rest.split_once('-').ok_or_else(|| refuse("which lacks the random part"))?;
    let pid_ok = !pid.is_empty() && pid.len() <= 10 && pid.bytes().all(|b| b.is_ascii_digit());
    let hex_ok = hex.len() == 2 * RANDOM_BYTES && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !pid_ok || !hex_ok {
        return Err(refuse("which does not have the shape of a heap file name"));
    }
    Ok(PathBuf::from(s))
}

impl ShmRegion {
    /// Creates this rank's heap file at `path` (from [`new_heap_path`]),
    /// private to this user, and maps `len` bytes of it.
    pub(super) fn create(path: &Path, len: usize) -> Result<ShmRegion> {
        let fail = |what: &str, e: std::io::Error| {
            Error::comm(format!(
                "cannot {what} the shared heap {}: {e}; /dev/shm must be a writable tmpfs with room for the heap \
                 (CommOptions::heap_bytes)",
                path.display()
            ))
        };
        // O_EXCL: never adopt a file someone else put there; O_NOFOLLOW: nor a link.
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| fail("create", e))?;
        // The umask may only have removed bits; make the mode exact.
        f.set_permissions(std::fs::Permissions::from_mode(MODE))
            .map_err(|e| fail("set the mode of", e))?;
        f.set_len(len as u64).map_err(|e| fail("size", e))?;
        Self::map(&f, len).map_err(|e| fail("map", e))
    }

    /// Opens and maps rank `peer`'s heap file `path` (from
    /// [`check_heap_path`]), after checking that it is a regular file of this
    /// user, private, and at least `len` bytes long.
    pub(super) fn open(path: &Path, len: usize, rank: usize, peer: usize) -> Result<ShmRegion> {
        let refuse = |why: String| Error::PeerUnreachable {
            rank,
            peer,
            reason: format!("its shared heap {} {why}", path.display()),
        };
        // O_NOFOLLOW: a link in its place is refused; O_NONBLOCK: a FIFO
        // there cannot hold us up before fstat refuses it.
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| {
                refuse(format!(
                    "cannot be opened: {e}; it must be a file that rank {peer}, running as this user on this host, created \
                     (a symbolic link is refused)"
                ))
            })?;
        let meta = f.metadata().map_err(|e| refuse(format!("cannot be examined: {e}")))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if !meta.file_type().is_file() {
            return Err(refuse("is not a regular file".into()));
        }
        if meta.uid() != me {
            return Err(refuse(format!(
                "belongs to uid {}, not to this process's uid {me}; every rank of a job must run as the same user",
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(refuse(format!(
                "has mode {:o}, open to other users; doorbell creates heap files with mode 600",
                meta.mode() & 0o777
            )));
        }
        if meta.len() < len as u64 {
            return Err(refuse(format!(
                "has {} bytes, fewer than the {len} of the heap; every rank must use the same CommOptions::heap_bytes",
                meta.len()
            )));
        }
        Self::map(&f, len).map_err(|e| refuse(format!("cannot be mapped: {e}")))
    }

    fn map(f: &File, len: usize) -> std::io::Result<ShmRegion> {
        // SAFETY: maps `len` bytes of a file we hold open and that has at
        // least `len` bytes; the mapping stays valid after `f` is closed.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ShmRegion { ptr: p as *mut u8, len })
    }
}

impl ShmRegion {
    /// Makes bytes `[from, len)` of this mapping read-only (`from` a page
    /// multiple): what this rank only reads of a peer's allocation.
    pub(super) fn read_only_from(&self, from: usize, rank: usize, peer: usize) -> Result<()> {
        if from >= self.len {
            return Ok(());
        }
        // SAFETY: the range lies inside this mapping (checked above), which
        // `map` made; only its protection changes.
        let r = unsafe { libc::mprotect(self.ptr.add(from) as *mut _, self.len - from, libc::PROT_READ) };
        if r != 0 {
            return Err(Error::comm(format!(
                "rank {rank}: cannot make rank {peer}'s soft NIC tables read-only in this process: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(())
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        // SAFETY: mapped by `map` with this length, unmapped only here.
        unsafe { libc::munmap(self.ptr as *mut _, self.len) };
    }
}

/// The heap file names of a job; removes every one when dropped. Removing
/// a name does not unmap anything: ranks that mapped a heap keep it.
#[derive(Default)]
pub(super) struct HeapFiles(Vec<PathBuf>);

impl HeapFiles {
    /// Adds a name (this rank's, or a peer's that passed [`check_heap_path`]).
    pub(super) fn add(&mut self, path: PathBuf) {
        self.0.push(path);
    }
}

impl Drop for HeapFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            // Usually already gone: whichever rank came first removed it.
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: usize = 1 << 16;

    #[test]
    fn heap_files_are_private_unguessable_and_removed() {
        let (a, b) = (new_heap_path().unwrap(), new_heap_path().unwrap());
        assert_ne!(a, b);
        check_heap_path(a.to_str().unwrap().as_bytes(), 0, 1).unwrap();
        let mut files = HeapFiles::default();
        files.add(a.clone());
        let region = ShmRegion::create(&a, LEN).unwrap();
        let meta = std::fs::symlink_metadata(&a).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600, "heap file mode");
        assert_eq!(meta.len(), LEN as u64);
        // A second create under the same name must fail, not adopt the file.
        assert!(ShmRegion::create(&a, LEN).is_err());
        let peer = ShmRegion::open(&a, LEN, 1, 0).unwrap();
        // SAFETY: both map the same LEN bytes.
        unsafe {
            *region.ptr.add(LEN - 1) = 0x5a;
            assert_eq!(*peer.ptr.add(LEN - 1), 0x5a);
        }
        drop(files);
        assert!(!a.exists(), "HeapFiles must remove the file");
        // The mappings outlive the name.
        // SAFETY: as above.
        unsafe { assert_eq!(*peer.ptr.add(LEN - 1), 0x5a) };
    }

    /// The protection of the mapping of `addr` in this process, as
    /// `/proc/self/maps` shows it (e.g. `rw-s`).
    fn protection_at(addr: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for line in maps.lines() {
            let mut f = line.split_whitespace();
            let (range, perms) = (f.next().unwrap(), f.next().unwrap());
            let (a, b) = range.split_once('-').unwrap();
            let (a, b) = (usize::from_str_radix(a, 16).unwrap(), usize::from_str_radix(b, 16).unwrap());
            if (a..b).contains(&addr) {
                return perms.to_string();
            }
        }
        panic!("{addr:#x} is not mapped")
    }

    /// A peer's mapping made read-only from a page on: what lies before it
    /// stays writable (and shared with the owner), what lies from it on is
    /// read-only in this process only; the owner still writes there.
    #[test]
    fn a_peer_mapping_is_read_only_from_the_page_asked() {
        let path = new_heap_path().unwrap();
        let mut files = HeapFiles::default();
        files.add(path.clone());
        let owner = ShmRegion::create(&path, LEN).unwrap();
        let peer = ShmRegion::open(&path, LEN, 1, 0).unwrap();
        let from = LEN - 2 * 4096;
        peer.read_only_from(from, 1, 0).unwrap();
        let at = |r: &ShmRegion, off: usize| r.ptr as usize + off;
        assert_eq!(protection_at(at(&peer, from - 1)), "rw-s");
        assert_eq!(protection_at(at(&peer, from)), "r--s");
        assert_eq!(protection_at(at(&peer, LEN - 1)), "r--s");
        assert_eq!(protection_at(at(&owner, LEN - 1)), "rw-s", "the owner's own mapping");
        // SAFETY: inside both mappings of the same LEN bytes; the peer writes
        // only below `from`.
        unsafe {
            *peer.ptr.add(from - 1) = 0x11;
            *owner.ptr.add(from) = 0x22;
            assert_eq!(*owner.ptr.add(from - 1), 0x11);
            assert_eq!(*peer.ptr.add(from), 0x22);
        }
        // Past the end: nothing to protect.
        peer.read_only_from(LEN, 1, 0).unwrap();
        // Not on a page: refused by the kernel, reported naming both ranks.
        let e = peer.read_only_from(from + 8, 1, 0).unwrap_err().to_string();
        assert!(e.contains("rank 1") && e.contains("rank 0"), "{e}");
    }

    fn refused(path: &[u8]) -> String {
        match check_heap_path(path, 3, 5) {
            Err(e @ Error::PeerUnreachable { rank: 3, peer: 5, .. }) => e.to_string(),
            other => panic!("{:?} was not refused: {other:?}", String::from_utf8_lossy(path)),
        }
    }

    #[test]
    fn peer_paths_outside_the_job_namespace_are_refused() {
        let hex = "0123456789abcdef0123456789abcdef";
        check_heap_path(format!("/dev/shm/doorbell-42-{hex}").as_bytes(), 3, 5).unwrap();
        for bad in [
            "/etc/passwd".to_string(),
            format!("/dev/shm/doorbell-42-{hex}/../../etc/passwd"),
            format!("/dev/shm/../shm/doorbell-42-{hex}"),
            format!("/dev/shm/doorbell-../../etc-{hex}"),
            format!("/dev/shm/doorbell-42-{}", &hex[..31]),
            format!("/dev/shm/doorbell-42-{hex}0"),
            format!("/dev/shm/doorbell-42-{}", hex.to_uppercase()),
            format!("/dev/shm/doorbell--{hex}"),
            format!("/tmp/doorbell-42-{hex}"),
            format!("dev/shm/doorbell-42-{hex}"),
            format!("/dev/shm/doorbell-42-{hex}\0"),
        ] {
            let msg = refused(bad.as_bytes());
            assert!(msg.contains("rank 5"), "{msg}");
        }
        refused(b"/dev/shm/doorbell-42-\xff\xfe");
    }

    fn open_err(path: &Path) -> String {
        match ShmRegion::open(path, LEN, 3, 5) {
            Err(e @ Error::PeerUnreachable { rank: 3, peer: 5, .. }) => e.to_string(),
            Err(e) => panic!("wrong error for {}: {e}", path.display()),
            Ok(_) => panic!("{} was mapped", path.display()),
        }
    }

    #[test]
    fn bad_peer_files_are_refused_before_mapping() {
        let mut files = HeapFiles::default();
        let mut fresh = || {
            let p = new_heap_path().unwrap();
            files.add(p.clone());
            p
        };
        // Missing.
        let missing = fresh();
        assert!(open_err(&missing).contains("cannot be opened"));
        // Too short: mapping it would SIGBUS on the first access past its end.
        let short = fresh();
        drop(ShmRegion::create(&short, LEN / 2).unwrap());
        let msg = open_err(&short);
        assert!(msg.contains("fewer than") && msg.contains(&LEN.to_string()), "{msg}");
        // A symbolic link to a good heap file.
        let good = fresh();
        drop(ShmRegion::create(&good, LEN).unwrap());
        let link = fresh();
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(open_err(&link).contains("symbolic link"));
        // Open to other users.
        let open = fresh();
        drop(ShmRegion::create(&open, LEN).unwrap());
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(open_err(&open).contains("mode 644"));
        // Not a regular file.
        let dir = fresh();
        std::fs::create_dir(&dir).unwrap();
        assert!(open_err(&dir).contains("not a regular file") || open_err(&dir).contains("cannot be opened"));
        std::fs::remove_dir(&dir).unwrap();
        // The good one maps.
        ShmRegion::open(&good, LEN, 3, 5).unwrap();
    }
}
