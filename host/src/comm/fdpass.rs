//! Hands a rank's heap allocation handles (file descriptors of CUDA
//! virtual-memory allocations) to the other processes of its host.
//!
//! A file descriptor means nothing in another process; the kernel passes
//! one over a Unix socket (`SCM_RIGHTS`). The exporting rank listens on an
//! abstract socket (`doorbell-heap-<pid>-<32 hex digits>`; such names are
//! visible to every local user in `/proc/net/unix`) and publishes its name
//! and a 16-byte secret from `/dev/urandom` through the world's
//! authenticated all-gather. A connection must come from a process of the
//! same user (`SO_PEERCRED`) and send the secret first; only then does it
//! get the message: a few 64-bit words (the allocations' lengths) and the
//! descriptors. A connection that fails either check gets nothing and
//! does not count. The listener serves the expected number of peers and
//! stops, or stops at a deadline, or when dropped.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::socket::{recvmsg, sendmsg, sockopt, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::error::{Error, Result};

/// Most words and descriptors one message carries.
pub(super) const MAX_ITEMS: usize = 4;

/// The name's prefix; the rest is the pid and 32 hex digits.
const PREFIX: &str = "doorbell-heap-";

/// Bytes of the secret a connection sends first.
pub(crate) const SECRET_BYTES: usize = 16;

/// How long the listener waits for a connection's secret.
const SECRET_WAIT: Duration = Duration::from_secs(2);

/// Serves one set of descriptors to the peers that connect (see the module
/// docs); stops when every expected peer was served, at its deadline, or
/// when dropped.
pub(crate) struct FdServer {
    name: String,
    secret: [u8; SECRET_BYTES],
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FdServer {
    /// Listens on a fresh abstract name and serves `words` and `fds` to
    /// `expected` connections of this user's processes, for at most
    /// `deadline`.
    pub(crate) fn start(words: Vec<u64>, fds: Vec<OwnedFd>, expected: usize, deadline: Duration) -> Result<FdServer> {
        if words.len() > MAX_ITEMS || fds.len() > MAX_ITEMS {
            return Err(Error::comm(format!(
                "a heap handle message carries at most {MAX_ITEMS} words and descriptors"
            )));
        }
        let mut r = [0u8; 16];
        crate::world::random_bytes(&mut r).map_err(|e| Error::comm(format!("cannot read /dev/urandom for a socket name: {e}")))?;
        let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let name = format!("{PREFIX}{}-{hex}", std::process::id());
        let mut secret = [0u8; SECRET_BYTES];
        crate::world::random_bytes(&mut secret).map_err(|e| Error::comm(format!("cannot read /dev/urandom for a secret: {e}")))?;
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| Error::comm(format!("socket name {name}: {e}")))?;
        let listener =
            UnixListener::bind_addr(&addr).map_err(|e| Error::comm(format!("cannot listen on the abstract socket {name}: {e}")))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::comm(format!("socket {name}: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("doorbell-fdpass".into())
            .spawn(move || serve(listener, (&words, &fds, &secret), expected, deadline, &flag))
            .map_err(|e| Error::comm(format!("cannot start the heap handle thread: {e}")))?;
        Ok(FdServer {
            name,
            secret,
            stop,
            thread: Some(thread),
        })
    }

    /// The abstract socket's name (without the leading NUL).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The secret a connection must send first.
    pub(crate) fn secret(&self) -> &[u8; SECRET_BYTES] {
        &self.secret
    }
}

impl Drop for FdServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The listener's loop: accept, check the peer's user, send, until
/// `expected` were served, the deadline passed or `stop` was set.
fn serve(listener: UnixListener, msg: (&[u64], &[OwnedFd], &[u8; SECRET_BYTES]), expected: usize, deadline: Duration, stop: &AtomicBool) {
    let until = Instant::now() + deadline;
    let mut served = 0;
    while served < expected && Instant::now() < until && !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => match send_to(&stream, msg) {
                Ok(()) => served += 1,
                Err(why) => tracing::warn!("heap handles not handed over a local connection: {why}"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => {
                tracing::warn!("heap handle socket: {e}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Sends the message to one connection after checking its user and its
/// secret.
fn send_to(stream: &UnixStream, (words, fds, secret): (&[u64], &[OwnedFd], &[u8; SECRET_BYTES])) -> std::result::Result<(), String> {
    let cred = nix::sys::socket::getsockopt(stream, sockopt::PeerCredentials).map_err(|e| format!("SO_PEERCRED: {e}"))?;
    // SAFETY: a plain query.
    let me = unsafe { libc::geteuid() };
    if cred.uid() != me {
        return Err(format!(
            "the connecting process (pid {}) runs as user {}, not {me}",
            cred.pid(),
            cred.uid()
        ));
    }
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(SECRET_WAIT)).map_err(|e| e.to_string())?;
    let mut got = [0u8; SECRET_BYTES];
    (&*stream)
        .read_exact(&mut got)
        .map_err(|e| format!("no secret from the connecting process (pid {}): {e}", cred.pid()))?;
    // Compared in full, whatever differs.
    if got.iter().zip(secret).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
        return Err(format!("the connecting process (pid {}) sent a wrong secret", cred.pid()));
    }
    let bytes: Vec<u8> = std::iter::once(words.len() as u64)
        .chain(words.iter().copied())
        .flat_map(u64::to_le_bytes)
        .collect();
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let sent =
        sendmsg::<()>(stream.as_raw_fd(), &[IoSlice::new(&bytes)], &cmsg, MsgFlags::empty(), None).map_err(|e| format!("sendmsg: {e}"))?;
    if sent != bytes.len() {
        return Err(format!("sent {sent} of {} bytes", bytes.len()));
    }
    Ok(())
}

/// Connects to the socket `name` that rank `peer` published, sends its
/// `secret` and receives its words and descriptors. `rank` and `peer`
/// describe a failure.
pub(crate) fn fetch(
    name: &[u8],
    secret: &[u8; SECRET_BYTES],
    (rank, peer): (usize, usize),
    timeout: Duration,
) -> Result<(Vec<u64>, Vec<OwnedFd>)> {
    let refuse = |why: String| Error::PeerUnreachable { rank, peer, reason: why };
    let shape = std::str::from_utf8(name)
        .ok()
        .and_then(|s| s.strip_prefix(PREFIX))
        .and_then(|s| s.split_once('-'));
    let well_formed = shape.is_some_and(|(pid, hex)| {
        pid.parse::<u32>().is_ok() && hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if !well_formed {
        return Err(refuse(format!(
            "it published {:?} as its heap handle socket, not {PREFIX}<pid>-<32 hex digits>; every rank must run this doorbell version",
            String::from_utf8_lossy(name)
        )));
    }
    let addr = SocketAddr::from_abstract_name(name).map_err(|e| refuse(format!("socket name: {e}")))?;
    let stream = UnixStream::connect_addr(&addr).map_err(|e| {
        refuse(format!(
            "cannot connect to its heap handle socket ({e}): it is in another network namespace (a container?) or it \
             exited; DOORBELL_HEAP_PARTS=0 on every rank shares heaps through CUDA IPC instead"
        ))
    })?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| refuse(e.to_string()))?;
    (&stream)
        .write_all(secret)
        .map_err(|e| refuse(format!("cannot send its heap handle socket the secret: {e}")))?;
    let mut buf = [0u8; 8 * (MAX_ITEMS + 1)];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; MAX_ITEMS]);
    let (n, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = loop {
            match recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r,
            }
        }
        .map_err(|e| refuse(format!("no heap handles from it: {e}")))?;
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(|e| refuse(format!("heap handles: {e}")))? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: descriptors the kernel just installed in this
                // process for this message; each owned once.
                fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(refuse(format!(
                "its heap handles did not all arrive (more than {MAX_ITEMS}, or this process is out of file descriptors)"
            )));
        }
        (msg.bytes, fds)
    };
    let word = |i: usize| {
        buf.get(8 * i..8 * i + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let count = word(0).filter(|&c| c as usize <= MAX_ITEMS && 8 * (c as usize + 1) == n);
    let Some(count) = count else {
        return Err(refuse(if n == 0 {
            "its heap handle socket closed without handing anything over (it refused this process: another user, \
             or a wrong secret)"
                .to_string()
        } else {
            format!("its heap handle message is malformed ({n} bytes)")
        }));
    };
    let words = (1..=count as usize).map(|i| word(i).expect("checked length")).collect();
    Ok((words, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe_fds() -> Vec<OwnedFd> {
        let mut p = [0i32; 2];
        // SAFETY: a plain syscall into a 2-int array.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors, each owned once.
        p.iter().map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) }).collect()
    }

    /// Two peers fetch the same words and working descriptors: a byte
    /// written into the served pipe's write end comes out of the fetched
    /// read end; the server then stops by itself.
    #[test]
    fn peers_receive_the_words_and_live_descriptors() {
        let fds = pipe_fds();
        let write_end = fds[1].try_clone().unwrap();
        let server = FdServer::start(vec![7, 1 << 40], fds, 2, Duration::from_secs(20)).unwrap();
        for k in 0..2u8 {
            let (words, got) = fetch(server.name().as_bytes(), server.secret(), (1, 0), Duration::from_secs(20)).unwrap();
            assert_eq!(words, vec![7, 1 << 40]);
            assert_eq!(got.len(), 2);
            let b = [0x40 + k];
            // SAFETY: a live pipe's write end.
            assert_eq!(unsafe { libc::write(write_end.as_raw_fd(), b.as_ptr() as *const _, 1) }, 1);
            let mut r = [0u8; 1];
            // SAFETY: the fetched read end.
            assert_eq!(unsafe { libc::read(got[0].as_raw_fd(), r.as_mut_ptr() as *mut _, 1) }, 1);
            assert_eq!(r, b);
        }
        let t = Instant::now();
        drop(server);
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    /// A name of another shape is refused before any connection; a name
    /// nobody listens on says so.
    #[test]
    fn bad_or_dead_names_are_refused_with_the_reason() {
        let e = fetch(b"/tmp/../etc", &[0; SECRET_BYTES], (0, 1), Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("every rank must run this doorbell version"), "{e}");
        let dead = format!("{PREFIX}1-{}", "0".repeat(32));
        let e = fetch(dead.as_bytes(), &[0; SECRET_BYTES], (0, 1), Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot connect"), "{e}");
    }

    /// A connection with a wrong secret gets nothing and does not count:
    /// the rightful peer still gets the message afterwards.
    #[test]
    fn a_wrong_secret_gets_nothing_and_takes_no_slot() {
        let server = FdServer::start(vec![3], pipe_fds(), 1, Duration::from_secs(20)).unwrap();
        let mut wrong = *server.secret();
        wrong[5] ^= 1;
        let e = fetch(server.name().as_bytes(), &wrong, (1, 0), Duration::from_secs(20))
            .unwrap_err()
            .to_string();
        assert!(e.contains("closed without handing anything over"), "{e}");
        let (words, got) = fetch(server.name().as_bytes(), server.secret(), (1, 0), Duration::from_secs(20)).unwrap();
        assert_eq!((words, got.len()), (vec![3], 2));
    }

    /// More items than one message carries are refused up front.
    #[test]
    fn too_many_items_are_refused() {
        assert!(FdServer::start(vec![0; MAX_ITEMS + 1], Vec::new(), 1, Duration::from_secs(1)).is_err());
    }
}
