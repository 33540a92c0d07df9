//! Reading other ranks' status without their cooperation.
//!
//! A rank publishes a *status source* ([`World::serve_status`]): a function
//! that renders what the rank is doing right now as bytes (the communicator
//! keeps that record; the world only carries it). Any rank may then read
//! every rank's current bytes ([`World::read_statuses`]) while the others
//! are busy — inside a synchronize, a barrier, or gone — so a rank whose
//! wait ran out can say which rank is stuck.
//!
//! - **Thread worlds** keep every rank's source on a board in the group:
//!   reading calls it directly. A rank whose handle was dropped still has
//!   its source there (its last record), and is marked as having left.
//! - **Process worlds** cannot use the star (it is synchronous: a rank
//!   blocked in a collective or a kernel does not answer). Each rank runs a
//!   small responder thread on a port of its own, whose address travels in
//!   one all-gather when the source is published. A reader connects,
//!   both sides prove the job token (a key derived from it and the world's
//!   identity), and the responder answers with the bytes and a tag over
//!   them. Every step has a deadline ([`STATUS_IO_TIMEOUT`]); a refused or
//!   reset connection means the process is gone.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{auth, Inner, World};
use crate::error::Result;

/// What renders this rank's status, called on the reader's thread (thread
/// worlds) or the responder's (process worlds). Must not block for long.
pub(crate) type StatusSource = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

/// Deadline of each step of one status query of a process world
/// (connect, proofs, answer).
pub const STATUS_IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest status a responder sends or a reader accepts.
const MAX_STATUS: usize = 64 << 10;
/// Ranks of a process world queried at once.
const QUERY_THREADS: usize = 64;
const MAGIC: &[u8; 4] = b"DBS1";
const NONCE: usize = 16;
const TAG: usize = 32;

/// One rank's status as a reader got it.
#[derive(Clone, Debug)]
pub(crate) enum PeerStatus {
    /// Its source's bytes.
    Bytes(Vec<u8>),
    /// Its source's bytes, but the rank's world handle is gone (thread
    /// worlds: what it recorded last).
    Left(Vec<u8>),
    /// No answer: why (the process exited, it did not answer in time, ...).
    Gone(String),
    /// It never published a source.
    Unknown,
}

/// The board of a thread world: every rank's source.
#[derive(Default)]
pub(crate) struct Board {
    sources: Mutex<Vec<Option<StatusSource>>>,
}

impl Board {
    pub(crate) fn set(&self, rank: usize, size: usize, src: StatusSource) {
        let mut s = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() < size {
            s.resize(size, None);
        }
        s[rank] = Some(src);
    }

    fn get(&self, rank: usize) -> Option<StatusSource> {
        self.sources.lock().unwrap_or_else(|p| p.into_inner()).get(rank).cloned().flatten()
    }
}

/// A process world's side of the status service: the responder of this
/// rank and every rank's address.
pub(crate) struct Service {
    key: [u8; 32],
    addrs: Vec<Option<SocketAddr>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Service {
    pub(crate) fn peers(&self) -> ([u8; 32], Vec<Option<SocketAddr>>) {
        (self.key, self.addrs.clone())
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // The responder polls `stop` every few tens of milliseconds and
            // spends at most a few STATUS_IO_TIMEOUTs on one connection.
            let _ = t.join();
        }
    }
}

/// The status key of a process world: the stretched job token
/// ([`auth::stretch`], as the rendezvous used it) bound to the world's
/// identity.
pub(crate) fn status_key(stretched: &[u8], world: &[u8]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(stretched).expect("HMAC accepts keys of any length");
    m.update(b"doorbell-status-v1");
    m.update(world);
    m.finalize().into_bytes().into()
}

fn tag(key: &[u8; 32], label: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC accepts keys of any length");
    m.update(label);
    for p in parts {
        m.update(&(p.len() as u64).to_be_bytes());
        m.update(p);
    }
    m
}

fn io_deadline(s: &TcpStream, deadline: Instant) -> std::io::Result<()> {
    let left = deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline passed"))?;
    s.set_read_timeout(Some(left))?;
    s.set_write_timeout(Some(left))
}

fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        io_deadline(s, deadline)?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the connection closed")),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_all_by(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    io_deadline(s, deadline)?;
    s.write_all(buf)
}

/// Answers one reader: its nonce, ours, its proof, then the bytes and our tag.
fn answer(mut s: TcpStream, key: &[u8; 32], source: &OnceLock<StatusSource>) -> std::io::Result<()> {
    let deadline = Instant::now() + STATUS_IO_TIMEOUT;
    let mut hello = [0u8; 4 + NONCE];
    read_exact_by(&mut s, &mut hello, deadline)?;
    if &hello[..4] != MAGIC {
        return Ok(());
    }
    let ours = auth::nonce()?;
    write_all_by(&mut s, &ours, deadline)?;
    let mut proof = [0u8; TAG];
    read_exact_by(&mut s, &mut proof, deadline)?;
    let theirs = &hello[4..];
    if tag(key, b"ask", &[theirs, &ours]).verify_slice(&proof).is_err() {
        return Ok(());
    }
    let mut body = source.get().map(|f| f()).unwrap_or_default();
    body.truncate(MAX_STATUS);
    let t: [u8; TAG] = tag(key, b"tell", &[theirs, &ours, &body]).finalize().into_bytes().into();
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out.extend_from_slice(&t);
    write_all_by(&mut s, &out, deadline)
}

/// Reads the status of the responder at `addr`.
fn query(addr: SocketAddr, key: &[u8; 32]) -> std::result::Result<Vec<u8>, String> {
    let deadline = Instant::now() + STATUS_IO_TIMEOUT;
    let mut s = TcpStream::connect_timeout(&addr, STATUS_IO_TIMEOUT).map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "exited or was killed (its status port refuses connections)".to_string(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            format!("did not accept a status connection within {} s", STATUS_IO_TIMEOUT.as_secs())
        }
        _ => format!("could not be reached on its status port ({e})"),
    })?;
    let lost = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            format!("did not answer a status query within {} s", STATUS_IO_TIMEOUT.as_secs())
        }
        _ => format!("exited, or refused the status query ({e})"),
    };
    let mine = auth::nonce().map_err(|e| format!("could not be queried: no nonce for the query ({e})"))?;
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&mine);
    write_all_by(&mut s, &hello, deadline).map_err(lost)?;
    let mut theirs = [0u8; NONCE];
    read_exact_by(&mut s, &mut theirs, deadline).map_err(lost)?;
    let proof: [u8; TAG] = tag(key, b"ask", &[&mine, &theirs]).finalize().into_bytes().into();
    write_all_by(&mut s, &proof, deadline).map_err(lost)?;
    let mut len = [0u8; 4];
    read_exact_by(&mut s, &mut len, deadline).map_err(lost)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_STATUS {
        return Err(format!("announced a status of {len} bytes (at most {MAX_STATUS})"));
    }
    let mut body = vec![0u8; len + TAG];
    read_exact_by(&mut s, &mut body, deadline).map_err(lost)?;
    let t = body.split_off(len);
    tag(key, b"tell", &[&mine, &theirs, &body])
        .verify_slice(&t)
        .map_err(|_| "answered a status query with a tag that fails its check (another job's process on that port?)".to_string())?;
    Ok(body)
}

/// The responder: answers readers one at a time until `stop`.
fn respond(listener: TcpListener, key: [u8; 32], source: Arc<OnceLock<StatusSource>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = answer(s, &key, &source);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(25)),
            Err(_) => std::thread::sleep(Duration::from_millis(25)),
        }
    }
}

impl World {
    /// Publishes this rank's status source. Collective in a process world
    /// (each rank starts its responder and the addresses are all-gathered;
    /// a rank that cannot open a port logs a warning and gathers an empty
    /// address, so only a failed gather is an error). A later call changes
    /// nothing (the first source stays).
    pub(crate) fn serve_status(&self, src: StatusSource) -> Result<()> {
        let first = self.status_source.set(src.clone()).is_ok();
        match &self.inner {
            Inner::Single => Ok(()),
            Inner::Threads(g) => {
                if first {
                    g.board().set(self.rank, self.size, src);
                }
                Ok(())
            }
            Inner::Tcp(star) => {
                if !first {
                    return Ok(());
                }
                let key = status_key(star.key(), &self.id);
                let stop = Arc::new(AtomicBool::new(false));
                // Where the others reach this rank: the address of its end of
                // the star (any port).
                let started = (|| -> std::io::Result<(SocketAddr, std::thread::JoinHandle<()>)> {
                    let listener = TcpListener::bind((star.local_ip()?, 0))?;
                    listener.set_nonblocking(true)?;
                    let me = listener.local_addr()?;
                    let (source, stop) = (self.status_source.clone(), stop.clone());
                    let thread = std::thread::Builder::new()
                        .name(format!("doorbell-status-{}", self.rank))
                        .spawn(move || respond(listener, key, source, stop))?;
                    Ok((me, thread))
                })();
                // Without a port this rank still takes part in the gather,
                // so that the ranks stay in step; peers then say so.
                let (mine, thread) = match started {
                    Ok((addr, t)) => (addr.to_string(), Some(t)),
                    Err(e) => {
                        tracing::warn!(
                            "rank {}: no status port ({e}): a peer whose wait runs out will not see this rank's state",
                            self.rank
                        );
                        (String::new(), None)
                    }
                };
                let mut service = Service {
                    key,
                    addrs: Vec::new(),
                    stop,
                    thread,
                };
                // On an error the responder stops as `service` drops.
                let all = self.all_gather_bytes(mine.as_bytes())?;
                service.addrs = all
                    .iter()
                    .map(|b| std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()))
                    .collect();
                star.set_status_service(service);
                Ok(())
            }
        }
    }

    /// Every rank's status now, indexed by rank. In a process world each
    /// query ends within [`STATUS_IO_TIMEOUT`], and up to 64 ranks are
    /// read at once.
    pub(crate) fn read_statuses(&self) -> Vec<PeerStatus> {
        let own = || self.status_source.get().map_or(PeerStatus::Unknown, |f| PeerStatus::Bytes(f()));
        match &self.inner {
            Inner::Single => vec![own()],
            Inner::Threads(g) => (0..self.size)
                .map(|r| match g.board().get(r) {
                    Some(f) if g.has_left(r) => PeerStatus::Left(f()),
                    Some(f) => PeerStatus::Bytes(f()),
                    None if g.has_left(r) => PeerStatus::Gone("exited (its World handle was dropped)".into()),
                    None => PeerStatus::Unknown,
                })
                .collect(),
            Inner::Tcp(star) => {
                let Some((key, addrs)) = star.status_peers() else {
                    return (0..self.size)
                        .map(|r| if r == self.rank { own() } else { PeerStatus::Unknown })
                        .collect();
                };
                // A thread per rank, at most QUERY_THREADS at a time: each
                // query ends within STATUS_IO_TIMEOUT.
                let mut all = Vec::with_capacity(self.size);
                for chunk in (0..self.size).collect::<Vec<_>>().chunks(QUERY_THREADS) {
                    std::thread::scope(|s| {
                        let handles: Vec<_> = chunk
                            .iter()
                            .map(|&r| {
                                let addr = addrs.get(r).copied().flatten();
                                (r != self.rank).then(|| s.spawn(move || addr.map(|a| query(a, &key))))
                            })
                            .collect();
                        all.extend(handles.into_iter().map(|h| match h {
                            None => own(),
                            Some(h) => match h.join() {
                                Ok(Some(Ok(b))) => PeerStatus::Bytes(b),
                                Ok(Some(Err(why))) => PeerStatus::Gone(why),
                                Ok(None) => PeerStatus::Gone("has no status port (it could not open one: see its log)".into()),
                                Err(_) => PeerStatus::Gone("could not be queried (the query panicked)".into()),
                            },
                        }));
                    });
                }
                all
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_query_needs_the_key_and_a_closed_port_reads_as_gone() {
        let key = [7u8; 32];
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let source: Arc<OnceLock<StatusSource>> = Arc::new(OnceLock::new());
        let _ = source.set(Arc::new(|| b"in barrier".to_vec()));
        let stop = Arc::new(AtomicBool::new(false));
        let t = {
            let (source, stop) = (source.clone(), stop.clone());
            std::thread::spawn(move || respond(listener, key, source, stop))
        };
        assert_eq!(query(addr, &key).unwrap(), b"in barrier");
        let e = query(addr, &[8u8; 32]).unwrap_err();
        assert!(e.contains("refused the status query"), "{e}");
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
        let e = query(addr, &key).unwrap_err();
        assert!(e.contains("exited or was killed"), "{e}");
    }
}
