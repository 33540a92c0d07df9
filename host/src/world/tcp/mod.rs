//! The multi-process world: a TCP star around rank 0.
//!
//! Rendezvous, per peer connection:
//!
//! ```text
//! rank 0                                   peer
//!   Challenge { version, n0 }        ──▶
//!                                    ◀──   Proof { n1, HMAC(key, peer | n0 | n1) }
//!   Refuse                           ──▶   (wrong token: the peer fails with TokenMismatch)
//!   RootProof { HMAC(key, root | n1 | n0) } ──▶   (checked: a wrong one is TokenMismatch too)
//!   ... from here on every frame is tagged with its direction's session key ...
//!                                    ◀──   Hello { version, rank, size, local rank, host, pid, layout,
//!                                                   library version, heap layout word }
//!   Status { missing }               ──▶
//!   ... once every rank is in ...
//!   Welcome { world id, table of all ranks } ──▶   or Abort { mismatch | timeout | failure }
//! ```
//!
//! `key` is the job token stretched by PBKDF2 ([`super::auth`]), so a
//! proof seen by a squatter on the port costs it that stretching per guess.
//!
//! Rank 0 runs each handshake on its own thread, so a silent or hostile
//! connection cannot hold up the others; refused connections are reported on
//! stderr and otherwise ignored. At most [`MAX_PENDING_HANDSHAKES`] run at
//! once, at most [`MAX_PENDING_PER_ADDRESS`] of them from one source address,
//! and each has [`HANDSHAKE_TIMEOUT`] to prove the token and say hello; a
//! connection that finds those taken gets one of [`QUICK_SLOTS`] further
//! slots, where it must prove the token within [`QUICK_PROOF_TIMEOUT`]; past
//! those, connections are closed at once (a real rank retries). A frame
//! that fails its tag after the proofs ends the rendezvous or the collective
//! with an error naming the peer.
//!
//! Collectives: every rank sends `(op, sequence number, bytes)` to rank 0,
//! which checks that all called the same op at the same step and sends the
//! table of everyone's bytes back. On any failure rank 0 tells the others why
//! (`Fail`), so each rank's error names the rank at fault.

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use super::auth::{self, Nonce, Side, NONCE_LEN, PEER_LABEL, PROOF_LEN, ROOT_LABEL};
use super::wire::{self, Dec, Enc, Frame, Kind, Link, WireError};
use super::{Inner, Op, PeerInfo, World, WorldConfig, WorldId, MAX_FRAME_BYTES, WORLD_ID_LEN};
use crate::error::{Error, Result};

/// Version of the rendezvous and collective protocol; ranks must agree.
/// Version 2 tags every frame after the token proofs; version 3 proves a
/// stretched token (PBKDF2) instead of the token itself.
pub const PROTOCOL_VERSION: u32 = 3;

/// Connections rank 0 handshakes with at once; it closes further ones until
/// a handshake finishes (a joining rank then retries).
pub const MAX_PENDING_HANDSHAKES: usize = 64;
/// How long a connection has, from being accepted, to prove the token and
/// say hello (never longer than the rendezvous timeout).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Of the [`MAX_PENDING_HANDSHAKES`], how many connections from one source
/// address may hold at once, so that one client cannot take them all.
pub const MAX_PENDING_PER_ADDRESS: usize = 8;
/// Handshake slots kept apart for connections that find the others taken
/// (all of them, or all their address may hold): such a connection must
/// send its token proof within [`QUICK_PROOF_TIMEOUT`]. A real rank proves
/// within milliseconds of the challenge; a client that only holds slots
/// gives them up at once.
pub const QUICK_SLOTS: usize = 4;
/// How long a connection in one of the [`QUICK_SLOTS`] has to send its proof.
pub const QUICK_PROOF_TIMEOUT: Duration = Duration::from_secs(1);

/// How long rank 0 spends telling a peer about a failure.
const NOTIFY_GRACE: Duration = Duration::from_secs(1);
/// Extra time a peer waits for rank 0's verdict on a collective, so that
/// rank 0's report naming the slow rank arrives before the peer gives up.
const PEER_GRACE: Duration = Duration::from_secs(5);

/// This host's name as the world reports it: `DOORBELL_HOSTNAME` where
/// set (ranks that must not be taken for one host, e.g. containers on
/// different nodes with one hostname), else the kernel's. Ranks with
/// different names reach each other only through the NIC.
pub(crate) fn hostname() -> String {
    if let Some(h) = std::env::var("DOORBELL_HOSTNAME")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
    {
        return h;
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_string())
}

struct Hello {
    version: u32,
    size: usize,
    info: PeerInfo,
    /// The doorbell library version the process was built from.
    library: String,
    /// [`super::heap_layout_word`] of that build.
    heap_layout: u64,
}

fn encode_info(e: Enc, p: &PeerInfo) -> Enc {
    e.u64(p.rank as u64)
        .u64(p.local_rank as u64)
        .str(&p.hostname)
        .u32(p.pid)
        .bytes(&p.layout)
}

fn decode_info(d: &mut Dec<'_>) -> std::result::Result<PeerInfo, String> {
    Ok(PeerInfo {
        rank: d.usize("rank")?,
        local_rank: d.usize("local rank")?,
        hostname: d.str("hostname")?,
        pid: d.u32("pid")?,
        layout: d.bytes("layout")?.to_vec(),
    })
}

/// A decoded hello, or why not: with the (version, world size, rank) head
/// when at least that much was readable.
type RawHello = std::result::Result<Hello, (Option<(u32, usize, usize)>, String)>;

impl Hello {
    // version, size and rank come first in every protocol version, so a
    // mismatch can always be named.
    fn encode(&self) -> Vec<u8> {
        encode_info(Enc::default().u32(self.version).u64(self.size as u64), &self.info)
            .str(&self.library)
            .u64(self.heap_layout)
            .0
    }
    fn decode(body: &[u8]) -> RawHello {
        let mut d = Dec::new(body);
        let head = (|| Ok::<_, String>((d.u32("version")?, d.usize("world size")?, d.usize("rank")?)))().map_err(|e| (None, e))?;
        let rest = (|| {
            let local_rank = d.usize("local rank")?;
            let hostname = d.str("hostname")?;
            let pid = d.u32("pid")?;
            let layout = d.bytes("layout")?.to_vec();
            let library = d.str("library version")?;
            let heap_layout = d.u64("heap layout word")?;
            d.end("hello")?;
            Ok::<_, String>((
                PeerInfo {
                    rank: head.2,
                    local_rank,
                    hostname,
                    pid,
                    layout,
                },
                library,
                heap_layout,
            ))
        })();
        match rest {
            Ok((info, library, heap_layout)) => Ok(Hello {
                version: head.0,
                size: head.1,
                info,
                library,
                heap_layout,
            }),
            Err(e) => Err((Some(head), e)),
        }
    }
}

/// Why rank 0 gave up on a rendezvous; sent to the peers in `Abort`.
enum AbortReason {
    Mismatch {
        rank: usize,
        field: String,
        ours: String,
        theirs: String,
    },
    Timeout {
        waited: Duration,
        missing: Vec<usize>,
    },
    /// A connection broke the protocol after proving the token (a forged
    /// frame, say).
    Protocol {
        peer: String,
        detail: String,
    },
    /// The welcome would exceed [`MAX_FRAME_BYTES`].
    TooLarge {
        what: String,
        bytes: u64,
    },
}

impl AbortReason {
    fn encode(&self) -> Vec<u8> {
        match self {
            AbortReason::Mismatch { rank, field, ours, theirs } => {
                Enc::default().u8(1).u64(*rank as u64).str(field).str(ours).str(theirs).0
            }
            AbortReason::Timeout { waited, missing } => Enc::default().u8(2).u64(waited.as_millis() as u64).list(missing).0,
            AbortReason::Protocol { peer, detail } => Enc::default().u8(3).str(peer).str(detail).0,
            AbortReason::TooLarge { what, bytes } => Enc::default().u8(4).str(what).u64(*bytes).0,
        }
    }
    fn decode(body: &[u8]) -> std::result::Result<AbortReason, String> {
        let mut d = Dec::new(body);
        match d.u8("abort reason")? {
            1 => Ok(AbortReason::Mismatch {
                rank: d.usize("rank")?,
                field: d.str("field")?,
                ours: d.str("ours")?,
                theirs: d.str("theirs")?,
            }),
            2 => Ok(AbortReason::Timeout {
                waited: Duration::from_millis(d.u64("waited")?),
                missing: d.list("missing")?,
            }),
            3 => Ok(AbortReason::Protocol {
                peer: d.str("peer")?,
                detail: d.str("detail")?,
            }),
            4 => Ok(AbortReason::TooLarge {
                what: d.str("what")?,
                bytes: d.u64("bytes")?,
            }),
            t => Err(format!("unknown abort reason {t}")),
        }
    }
    /// The error as `rank` reports it.
    fn into_error(self, rank: usize) -> Error {
        match self {
            AbortReason::Mismatch { rank, field, ours, theirs } => Error::RendezvousMismatch { rank, field, ours, theirs },
            AbortReason::Timeout { waited, missing } => Error::RendezvousTimeout { rank, waited, missing },
            AbortReason::Protocol { peer, detail } => Error::WorldProtocol { rank, peer, detail },
            AbortReason::TooLarge { what, bytes } => Error::FrameTooLarge {
                rank,
                what,
                bytes,
                max: MAX_FRAME_BYTES,
            },
        }
    }
}

/// Rank 0's side of the rendezvous, bound but not yet accepting: lets a
/// caller learn the port (useful with port 0) before blocking in
/// [`accept`](Self::accept).
pub struct RendezvousHost {
    listener: TcpListener,
    config: WorldConfig,
    max_pending: usize,
    per_address: usize,
    quick_slots: usize,
    handshake_timeout: Duration,
}

impl std::fmt::Debug for RendezvousHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RendezvousHost")
            .field("addr", &self.listener.local_addr().ok())
            .field("config", &self.config)
            .finish()
    }
}

enum Handshake {
    Joined(Link, SocketAddr, RawHello),
    WrongToken(SocketAddr),
    Failed(SocketAddr, String),
    /// The peer proved the token, then sent a frame that failed its tag.
    Forged(SocketAddr, String),
}

/// The handshakes rank 0 is running: how many hold a regular slot, how
/// many a quick one, and the regular ones per source address.
#[derive(Default)]
struct Pending {
    regular: AtomicUsize,
    quick: AtomicUsize,
    by_address: Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

impl Pending {
    fn by_address(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<std::net::IpAddr, usize>> {
        self.by_address.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a connection from `ip`: a regular one while fewer than
    /// `max` run and fewer than `per_address` from `ip`; else a quick one
    /// while fewer than `quick` run; else none.
    fn take(self: &Arc<Self>, ip: std::net::IpAddr, max: usize, per_address: usize, quick: usize) -> Option<PendingSlot> {
        let mut by = self.by_address();
        let mine = by.get(&ip).copied().unwrap_or(0);
        if self.regular.load(Ordering::Acquire) < max && mine < per_address {
            self.regular.fetch_add(1, Ordering::AcqRel);
            *by.entry(ip).or_insert(0) += 1;
            return Some(PendingSlot {
                pending: self.clone(),
                regular_for: Some(ip),
            });
        }
        if self.quick.load(Ordering::Acquire) < quick {
            self.quick.fetch_add(1, Ordering::AcqRel);
            return Some(PendingSlot {
                pending: self.clone(),
                regular_for: None,
            });
        }
        None
    }
}

/// Frees a handshake slot when its thread ends.
struct PendingSlot {
    pending: Arc<Pending>,
    /// The source address of a regular slot; `None` for a quick one.
    regular_for: Option<std::net::IpAddr>,
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        match self.regular_for {
            Some(ip) => {
                let mut by = self.pending.by_address();
                if let Some(n) = by.get_mut(&ip) {
                    *n -= 1;
                    if *n == 0 {
                        by.remove(&ip);
                    }
                }
                self.pending.regular.fetch_sub(1, Ordering::AcqRel);
            }
            None => {
                self.pending.quick.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

impl RendezvousHost {
    /// Binds `config.bind_addr:config.master_port` (rank 0 only). With port
    /// 0 the system picks a free port: read it from
    /// [`local_addr`](Self::local_addr) and hand it to the other ranks.
    pub fn bind(config: &WorldConfig) -> Result<RendezvousHost> {
        if config.rank != 0 {
            return Err(Error::WorldProtocol {
                rank: config.rank,
                peer: "itself".into(),
                detail: "only rank 0 hosts the rendezvous; other ranks call World::rendezvous".into(),
            });
        }
        super::check_token(config)?;
        let addr = format_addr(&config.bind_addr, config.master_port);
        let listener = TcpListener::bind(addr.as_str()).map_err(|source| Error::Bind { addr, source })?;
        Ok(RendezvousHost {
            listener,
            config: config.clone(),
            max_pending: MAX_PENDING_HANDSHAKES,
            per_address: MAX_PENDING_PER_ADDRESS,
            quick_slots: QUICK_SLOTS,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        })
    }

    /// Other handshake limits, for tests of a connection flood.
    #[cfg(test)]
    pub(crate) fn with_handshake_limits(mut self, max_pending: usize, timeout: Duration) -> RendezvousHost {
        self.max_pending = max_pending;
        self.handshake_timeout = timeout;
        self
    }

    /// Other per-address and quick-slot limits, for tests of a connection flood.
    #[cfg(test)]
    pub(crate) fn with_address_limits(mut self, per_address: usize, quick_slots: usize) -> RendezvousHost {
        self.per_address = per_address;
        self.quick_slots = quick_slots;
        self
    }

    /// The address rank 0 listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// Waits for every other rank, checks them, and forms the world; the
    /// rendezvous timeout counts from this call. `layout` is this rank's
    /// opaque layout blob, published to every rank in [`World::peers`].
    pub fn accept(self, layout: &[u8]) -> Result<World> {
        let cfg = &self.config;
        if layout.len() > super::MAX_LAYOUT {
            return Err(Error::WorldProtocol {
                rank: 0,
                peer: "itself".into(),
                detail: format!(
                    "the layout blob has {} bytes, more than the {} a rendezvous carries",
                    layout.len(),
                    super::MAX_LAYOUT
                ),
            });
        }
        let (rank, size) = (0, cfg.size);
        let start = Instant::now();
        let deadline = start + cfg.rendezvous_timeout;
        let io = |what, source| Error::WorldIo { rank, what, source };
        self.listener
            .set_nonblocking(true)
            .map_err(|e| io("making the rendezvous listener non-blocking", e))?;
        let token: Arc<[u8]> = Arc::from(&auth::stretch(cfg.token())[..]);
        let (tx, rx) = mpsc::channel::<Handshake>();
        let mut joined: Vec<Option<(Link, PeerInfo)>> = (0..size).map(|_| None).collect();
        let missing_of = |joined: &[Option<(Link, PeerInfo)>]| -> Vec<usize> { (1..size).filter(|&r| joined[r].is_none()).collect() };
        let pending = Arc::new(Pending::default());
        let mut turned_away = 0u64;
        let mut poll = Duration::from_micros(200);
        loop {
            let mut busy = false;
            match self.listener.accept() {
                Ok((stream, addr)) => {
                    busy = true;
                    match pending.take(addr.ip(), self.max_pending, self.per_address, self.quick_slots) {
                        None => {
                            drop(stream);
                            turned_away += 1;
                            if turned_away == 1 {
                                eprintln!(
                                    "doorbell: rendezvous: every handshake slot is taken ({} in all, at most {} per \
                                     address, and {} for quick provers); closing new connections (first from {addr}) \
                                     until one finishes; real ranks retry",
                                    self.max_pending, self.per_address, self.quick_slots
                                );
                            }
                        }
                        Some(slot) => {
                            let (tx, token) = (tx.clone(), token.clone());
                            let by = deadline.min(Instant::now() + self.handshake_timeout);
                            let proof_by = match slot.regular_for {
                                Some(_) => by,
                                None => by.min(Instant::now() + QUICK_PROOF_TIMEOUT),
                            };
                            std::thread::Builder::new()
                                .name("doorbell-rendezvous".into())
                                .spawn(move || {
                                    let _slot = slot;
                                    let _ = tx.send(root_handshake(stream, addr, &token, proof_by, by));
                                })
                                .map_err(|e| io("starting a rendezvous handshake thread", e))?;
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // Running out of descriptors and the like pass; the deadline bounds us.
                Err(e) => eprintln!("doorbell: rendezvous: accept failed: {e}"),
            }
            while let Ok(h) = rx.try_recv() {
                busy = true;
                match h {
                    Handshake::WrongToken(addr) => eprintln!(
                        "doorbell: rendezvous: refused a connection from {addr}: its DOORBELL_TOKEN does not match this job's; \
                         still waiting"
                    ),
                    Handshake::Failed(addr, why) => {
                        eprintln!("doorbell: rendezvous: dropped a connection from {addr}: {why}; still waiting")
                    }
                    Handshake::Forged(addr, detail) => {
                        // It proved the token: a rank of this job, or someone
                        // tampering with its connection. Neither can be trusted.
                        let reason = AbortReason::Protocol {
                            peer: format!("the process at {addr}"),
                            detail,
                        };
                        abort_all(&mut joined, &reason.encode());
                        report_turned_away(turned_away, self.max_pending);
                        return Err(reason.into_error(rank));
                    }
                    Handshake::Joined(mut link, addr, hello) => match check_hello(hello, cfg, &joined, addr) {
                        Ok(None) => {}
                        Ok(Some(info)) => {
                            let r = info.rank;
                            let mut missing = missing_of(&joined);
                            missing.retain(|&m| m != r);
                            // Best effort: the peer only uses it to name missing ranks on timeout.
                            let status = Enc::default().list(&missing).0;
                            let _ = link.write(Kind::Status, &status, Instant::now() + NOTIFY_GRACE);
                            joined[r] = Some((link, info));
                        }
                        Err(reason) => {
                            let body = reason.encode();
                            let _ = link.write(Kind::Abort, &body, Instant::now() + NOTIFY_GRACE);
                            abort_all(&mut joined, &body);
                            report_turned_away(turned_away, self.max_pending);
                            return Err(reason.into_error(rank));
                        }
                    },
                }
            }
            if joined.iter().skip(1).all(Option::is_some) {
                break;
            }
            if Instant::now() >= deadline {
                let reason = AbortReason::Timeout {
                    waited: start.elapsed(),
                    missing: missing_of(&joined),
                };
                abort_all(&mut joined, &reason.encode());
                report_turned_away(turned_away, self.max_pending);
                return Err(reason.into_error(rank));
            }
            poll = if busy {
                Duration::from_micros(200)
            } else {
                (poll * 2).min(Duration::from_millis(20))
            };
            std::thread::sleep(poll);
        }

        let me = PeerInfo {
            rank: 0,
            local_rank: cfg.local_rank,
            hostname: hostname(),
            pid: std::process::id(),
            layout: layout.to_vec(),
        };
        report_turned_away(turned_away, self.max_pending);
        let mut table = vec![me];
        let mut links: Vec<Option<Link>> = vec![None];
        for slot in joined.into_iter().skip(1) {
            let (link, info) = slot.expect("all joined");
            table.push(info);
            links.push(Some(link));
        }
        let mut id: WorldId = [0; WORLD_ID_LEN];
        auth::random_bytes(&mut id).map_err(|e| io("reading /dev/urandom", e))?;
        let welcome = table.iter().fold(Enc::default().raw(&id).u64(size as u64), encode_info).0;
        if welcome.len() as u64 > MAX_FRAME_BYTES {
            let reason = AbortReason::TooLarge {
                what: format!("the welcome (the table of {size} ranks with their layout blobs)"),
                bytes: welcome.len() as u64,
            };
            let body = reason.encode();
            for link in links.iter_mut().flatten() {
                let _ = link.write(Kind::Abort, &body, Instant::now() + NOTIFY_GRACE);
            }
            return Err(reason.into_error(rank));
        }
        for (r, link) in links.iter_mut().enumerate().skip(1) {
            let link = link.as_mut().expect("all joined");
            if let Err(e) = link.write(Kind::Welcome, &welcome, deadline.max(Instant::now() + NOTIFY_GRACE)) {
                return Err(Error::PeerLost {
                    rank,
                    peer: r,
                    op: "rendezvous".into(),
                    detail: e.to_string(),
                });
            }
        }
        Ok(star_world(0, size, cfg, table, id, Links::Root(links)))
    }
}

fn report_turned_away(n: u64, max_pending: usize) {
    if n > 0 {
        eprintln!("doorbell: rendezvous: closed {n} connection(s) at once because {max_pending} handshakes were already running");
    }
}

fn format_addr(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn abort_all(joined: &mut [Option<(Link, PeerInfo)>], body: &[u8]) {
    for (link, _) in joined.iter_mut().flatten() {
        let _ = link.write(Kind::Abort, body, Instant::now() + NOTIFY_GRACE);
    }
}

fn check_hello(
    hello: RawHello,
    cfg: &WorldConfig,
    joined: &[Option<(Link, PeerInfo)>],
    addr: SocketAddr,
) -> std::result::Result<Option<PeerInfo>, AbortReason> {
    let mismatch = |rank: usize, field: &str, ours: String, theirs: String| AbortReason::Mismatch {
        rank,
        field: field.into(),
        ours,
        theirs,
    };
    let (version, size, rank, info) = match hello {
        Ok(h) if h.library != super::LIBRARY_VERSION => {
            return Err(mismatch(
                h.info.rank,
                "doorbell library version",
                super::LIBRARY_VERSION.to_string(),
                h.library,
            ))
        }
        Ok(h) if h.heap_layout != super::heap_layout_word() => {
            return Err(mismatch(
                h.info.rank,
                "heap layout word (the shared structures of another build)",
                format!("{:#018x}", super::heap_layout_word()),
                format!("{:#018x}", h.heap_layout),
            ))
        }
        Ok(h) => (h.version, h.size, h.info.rank, Some(h.info)),
        Err((Some((v, s, r)), _)) if v != PROTOCOL_VERSION => (v, s, r, None),
        Err((_, why)) => {
            // Authenticated but undecodable, from our own protocol version: a
            // broken client rather than a misconfigured job. Drop it.
            eprintln!("doorbell: rendezvous: dropped a connection from {addr}: malformed hello ({why}); still waiting");
            return Ok(None);
        }
    };
    if version != PROTOCOL_VERSION {
        return Err(mismatch(
            rank,
            "protocol version",
            PROTOCOL_VERSION.to_string(),
            version.to_string(),
        ));
    }
    if size != cfg.size {
        return Err(mismatch(rank, "world size", cfg.size.to_string(), size.to_string()));
    }
    if rank == 0 || rank >= cfg.size {
        return Err(mismatch(
            rank,
            "rank",
            format!("a rank in 1..{}", cfg.size),
            format!("{rank} (from {addr})"),
        ));
    }
    let info = info.expect("decoded");
    if let Some((_, first)) = &joined[rank] {
        return Err(mismatch(
            rank,
            "rank",
            format!("rank {rank} already joined from {} pid {}", first.hostname, first.pid),
            format!("a second rank {rank} from {} pid {} ({addr})", info.hostname, info.pid),
        ));
    }
    Ok(Some(info))
}

/// Rank 0's side of one handshake: the proof must arrive by `proof_by`,
/// the hello by `deadline`.
fn root_handshake(mut s: TcpStream, addr: SocketAddr, token: &[u8], proof_by: Instant, deadline: Instant) -> Handshake {
    let fail = |why: String| Handshake::Failed(addr, why);
    let _ = s.set_nodelay(true);
    if let Err(e) = s.set_nonblocking(false) {
        return fail(e.to_string());
    }
    let n0 = match auth::nonce() {
        Ok(n) => n,
        Err(e) => return fail(format!("reading /dev/urandom failed: {e}")),
    };
    let challenge = Enc::default().u32(PROTOCOL_VERSION).raw(&n0).0;
    if let Err(e) = wire::write_frame(&mut s, Kind::Challenge, &challenge, deadline) {
        return fail(format!("sending the challenge: {e}"));
    }
    let proof = match wire::read_frame(&mut s, wire::MAX_UNAUTHENTICATED, proof_by) {
        Ok(Frame { kind: Kind::Proof, body }) if body.len() == NONCE_LEN + PROOF_LEN => body,
        Ok(f) => {
            return fail(format!(
                "expected a token proof, got a {:?} frame of {} bytes",
                f.kind,
                f.body.len()
            ))
        }
        Err(e) => return fail(format!("waiting for the token proof: {e}")),
    };
    let n1: Nonce = proof[..NONCE_LEN].try_into().unwrap();
    if !auth::verify(token, PEER_LABEL, &n0, &n1, &proof[NONCE_LEN..]) {
        let _ = wire::write_frame(&mut s, Kind::Refuse, b"token mismatch", Instant::now() + NOTIFY_GRACE);
        return Handshake::WrongToken(addr);
    }
    let root_proof = auth::prove(token, ROOT_LABEL, &n1, &n0);
    if let Err(e) = wire::write_frame(&mut s, Kind::RootProof, &root_proof, deadline) {
        return fail(format!("sending rank 0's proof: {e}"));
    }
    let mut link = Link::new(s, auth::session_keys(token, &n0, &n1, Side::Root));
    match link.read(wire::MAX_HELLO, deadline) {
        Ok(Frame { kind: Kind::Hello, body }) => Handshake::Joined(link, addr, Hello::decode(&body)),
        Ok(f) => fail(format!("expected a hello, got a {:?} frame", f.kind)),
        Err(WireError::Forged(f)) => {
            // Version 1 sent its hello untagged: its last 32 bytes then pose
            // as the tag. Name the version rather than a forgery.
            let head = match Hello::decode(&f.body) {
                Ok(h) => Some((h.version, h.size, h.info.rank)),
                Err((head, _)) => head,
            };
            match head {
                Some((v, size, rank)) if f.kind == Kind::Hello && v != PROTOCOL_VERSION => {
                    Handshake::Joined(link, addr, Err((Some((v, size, rank)), "another protocol version".into())))
                }
                Some((_, _, rank)) => Handshake::Forged(addr, format!("(claiming rank {rank}) {}", WireError::Forged(f))),
                None => Handshake::Forged(addr, WireError::Forged(f).to_string()),
            }
        }
        Err(e) => fail(format!("waiting for the hello: {e}")),
    }
}

enum Attempt {
    /// Connected, and the other side sent a frame.
    Answered(TcpStream, Frame),
    /// Connected to something that does not speak our protocol.
    Garbage(String),
    /// Not there (yet); worth another try.
    Retry(String),
}

fn connect_once(target: &str, deadline: Instant) -> Attempt {
    let addrs: Vec<SocketAddr> = match target.to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => return Attempt::Retry(format!("resolving {target}: {e}")),
    };
    let mut last = format!("{target} resolves to no address");
    for a in addrs {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(1), Duration::from_secs(2));
        match TcpStream::connect_timeout(&a, left) {
            Ok(mut s) => {
                let _ = s.set_nodelay(true);
                return match wire::read_frame(&mut s, wire::MAX_UNAUTHENTICATED, deadline) {
                    Ok(f) => Attempt::Answered(s, f),
                    Err(WireError::Garbage(g)) => Attempt::Garbage(g),
                    Err(e) => Attempt::Retry(format!("waiting for rank 0's challenge from {a}: {e}")),
                };
            }
            Err(e) => last = format!("connecting to {a}: {e}"),
        }
    }
    Attempt::Retry(last)
}

/// A peer's side of the rendezvous.
pub(crate) fn join(cfg: &WorldConfig, layout: &[u8]) -> Result<World> {
    let (rank, size) = (cfg.rank, cfg.size);
    let start = Instant::now();
    let deadline = start + cfg.rendezvous_timeout;
    let target = format_addr(&cfg.master_addr, cfg.master_port);
    let timeout = |missing: Vec<usize>| Error::RendezvousTimeout {
        rank,
        waited: start.elapsed(),
        missing,
    };
    let protocol = |detail: String| Error::WorldProtocol {
        rank,
        peer: format!("rank 0 at {target}"),
        detail,
    };

    // Stretched once, before the first connection.
    let key = auth::stretch(cfg.token());
    // Rank 0 may start after us: retry until it answers with a challenge.
    let mut backoff = Duration::from_millis(10);
    let mut last_failure = String::new();
    let (mut s, challenge) = loop {
        if Instant::now() >= deadline {
            eprintln!("doorbell: rank {rank}: could not reach rank 0 at {target}; last attempt: {last_failure}");
            return Err(timeout(vec![0]));
        }
        match connect_once(&target, deadline) {
            Attempt::Answered(s, f) => break (s, f),
            Attempt::Garbage(g) => {
                return Err(protocol(format!(
                    "it is not a doorbell rendezvous ({g}); check that MASTER_ADDR/MASTER_PORT (or DOORBELL_MASTER_PORT) \
                     name this job's rank 0 and that no other service (e.g. torch.distributed's store) uses that port"
                )))
            }
            Attempt::Retry(why) => {
                last_failure = why;
                std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
    };

    let n0: Nonce = match challenge {
        Frame {
            kind: Kind::Challenge,
            body,
        } if body.len() >= 4 && u32::from_be_bytes(body[..4].try_into().unwrap()) != PROTOCOL_VERSION => {
            return Err(Error::RendezvousMismatch {
                rank,
                field: "protocol version".into(),
                ours: u32::from_be_bytes(body[..4].try_into().unwrap()).to_string(),
                theirs: PROTOCOL_VERSION.to_string(),
            })
        }
        Frame {
            kind: Kind::Challenge,
            body,
        } if body.len() == 4 + NONCE_LEN => body[4..].try_into().unwrap(),
        f => {
            return Err(protocol(format!(
                "expected a challenge, got a {:?} frame of {} bytes",
                f.kind,
                f.body.len()
            )))
        }
    };
    let wire_err = |e: WireError, what: &str| match e {
        WireError::TimedOut => timeout(vec![0]),
        WireError::Closed(why) => Error::PeerLost {
            rank,
            peer: 0,
            op: format!("rendezvous ({what})"),
            detail: why,
        },
        WireError::Garbage(g) => protocol(g),
        e @ WireError::Forged(_) => protocol(e.to_string()),
        WireError::TooLarge { kind, len, max } => Error::FrameTooLarge {
            rank,
            what: format!("a {kind:?} frame from rank 0 ({what})"),
            bytes: len,
            max,
        },
    };
    let n1 = auth::nonce().map_err(|source| Error::WorldIo {
        rank,
        what: "reading /dev/urandom",
        source,
    })?;
    let proof = Enc::default().raw(&n1).raw(&auth::prove(&key, PEER_LABEL, &n0, &n1)).0;
    wire::write_frame(&mut s, Kind::Proof, &proof, deadline).map_err(|e| wire_err(e, "sending the token proof"))?;
    match wire::read_frame(&mut s, wire::MAX_UNAUTHENTICATED, deadline) {
        Ok(Frame { kind: Kind::Refuse, .. }) => return Err(Error::TokenMismatch { rank, addr: target }),
        Ok(Frame {
            kind: Kind::RootProof,
            body,
        }) => {
            if !auth::verify(&key, ROOT_LABEL, &n1, &n0, &body) {
                return Err(Error::TokenMismatch { rank, addr: target });
            }
        }
        Ok(f) => return Err(protocol(format!("expected rank 0's proof, got a {:?} frame", f.kind))),
        Err(e) => return Err(wire_err(e, "waiting for rank 0's proof")),
    }
    let mut link = Link::new(s, auth::session_keys(&key, &n0, &n1, Side::Peer));
    let me = PeerInfo {
        rank,
        local_rank: cfg.local_rank,
        hostname: hostname(),
        pid: std::process::id(),
        layout: layout.to_vec(),
    };
    let hello = Hello {
        version: PROTOCOL_VERSION,
        size,
        info: me,
        library: super::LIBRARY_VERSION.to_string(),
        heap_layout: super::heap_layout_word(),
    }
    .encode();
    link.write(Kind::Hello, &hello, deadline)
        .map_err(|e| wire_err(e, "sending the hello"))?;

    let mut missing = vec![0];
    let (id, table) = loop {
        match link.read(MAX_FRAME_BYTES, deadline) {
            Ok(Frame { kind: Kind::Status, body }) => missing = Dec::new(&body).list("missing").map_err(protocol)?,
            Ok(Frame { kind: Kind::Abort, body }) => return Err(AbortReason::decode(&body).map_err(protocol)?.into_error(rank)),
            Ok(Frame { kind: Kind::Welcome, body }) => {
                let mut d = Dec::new(&body);
                let id: WorldId = d.raw(WORLD_ID_LEN, "world id").map_err(protocol)?.try_into().unwrap();
                let n = d.usize("rank count").map_err(protocol)?;
                let table = (0..n)
                    .map(|_| decode_info(&mut d))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(protocol)?;
                if n != size || table.iter().enumerate().any(|(i, p)| p.rank != i) {
                    return Err(protocol(format!(
                        "welcome lists {n} ranks out of order or of the wrong count (expected {size})"
                    )));
                }
                d.end("welcome").map_err(protocol)?;
                break (id, table);
            }
            Ok(f) => return Err(protocol(format!("unexpected {:?} frame during the rendezvous", f.kind))),
            Err(WireError::TimedOut) => return Err(timeout(missing)),
            Err(e) => return Err(wire_err(e, "waiting for the other ranks")),
        }
    };
    Ok(star_world(rank, size, cfg, table, id, Links::Peer(link)))
}

/// The connections of a formed TCP world.
/// The world of a rank whose rendezvous finished with `links`.
fn star_world(rank: usize, size: usize, cfg: &WorldConfig, table: Vec<PeerInfo>, id: WorldId, links: Links) -> World {
    let sockets: Vec<&TcpStream> = match &links {
        Links::Root(v) => v.iter().flatten().map(Link::stream).collect(),
        Links::Peer(l) => vec![l.stream()],
    };
    // A socket that cannot be cloned only costs an abort its quick wake-up.
    let wakers = sockets.into_iter().filter_map(|s| s.try_clone().ok()).collect();
    let star = Star {
        rank,
        size,
        timeout: cfg.world_timeout,
        state: Mutex::new(StarState {
            seq: 0,
            links,
            broken: None,
        }),
        pending_abort: Mutex::new(None),
        wakers,
    };
    World::from_parts(rank, size, cfg.local_rank, table, id, Inner::Tcp(star))
}

pub(crate) struct Star {
    rank: usize,
    size: usize,
    timeout: Duration,
    /// Held for a whole collective (up to the world timeout).
    state: Mutex<StarState>,
    /// An abort that found a collective in progress: what this rank's
    /// handle reports from now on, and the reason the others are sent. The
    /// thread holding `state` sends it (the links' frame counters are its).
    pending_abort: Mutex<Option<PendingAbort>>,
    /// Clones of the links' sockets: shutting their read side down ends a
    /// collective's blocking reads at once, so it sees the pending abort.
    wakers: Vec<TcpStream>,
}

struct PendingAbort {
    broken: String,
    reason: String,
}

struct StarState {
    seq: u64,
    links: Links,
    broken: Option<String>,
}

enum Links {
    /// Rank 0: one link per peer, indexed by rank (slot 0 empty).
    Root(Vec<Option<Link>>),
    /// A peer: the link to rank 0.
    Peer(Link),
}

fn describe(op: Op, seq: u64) -> String {
    format!("{op} (collective #{seq})")
}

/// Bytes of [`encode_step`].
const STEP_LEN: u64 = 1 + 8 + 8;

fn encode_step(op: Op, seq: u64) -> Enc {
    let (tag, arg) = op.code();
    Enc::default().u8(tag).u64(arg).u64(seq)
}

fn decode_step(d: &mut Dec<'_>) -> std::result::Result<(Op, u64), String> {
    let tag = d.u8("op")?;
    let arg = d.u64("op argument")?;
    let seq = d.u64("sequence number")?;
    Ok((Op::from_code(tag, arg).ok_or_else(|| format!("unknown collective op {tag}"))?, seq))
}

/// The error `rank` reports when its link to `peer` failed during `op`
/// (timeouts, which can name more ranks, are the caller's).
fn link_error(rank: usize, peer: usize, op: &str, e: WireError) -> Error {
    match e {
        WireError::Closed(detail) => Error::PeerLost {
            rank,
            peer,
            op: op.to_string(),
            detail,
        },
        WireError::TimedOut => Error::PeerLost {
            rank,
            peer,
            op: op.to_string(),
            detail: "timed out".into(),
        },
        WireError::TooLarge { kind, len, max } => Error::FrameTooLarge {
            rank,
            what: format!("a {kind:?} frame from rank {peer} in {op}"),
            bytes: len,
            max,
        },
        e @ (WireError::Garbage(_) | WireError::Forged(_)) => Error::WorldProtocol {
            rank,
            peer: format!("rank {peer}"),
            detail: format!("in {op}: {e}"),
        },
    }
}

impl Star {
    pub(crate) fn exchange(&self, op: Op, mine: &[u8]) -> Result<Arc<Vec<Vec<u8>>>> {
        let rank = self.rank;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.send_pending_abort(&mut st);
        if let Some(reason) = &st.broken {
            return Err(Error::WorldBroken {
                rank,
                reason: reason.clone(),
            });
        }
        let seq = st.seq;
        st.seq += 1;
        let start = Instant::now();
        let result = match &mut st.links {
            Links::Root(links) => self.root_exchange(links, op, seq, mine, start),
            Links::Peer(link) => self.peer_exchange(link, op, seq, mine, start),
        };
        if let Err(e) = &result {
            st.broken = Some(e.to_string());
        }
        if self.send_pending_abort(&mut st) {
            // Aborted during this collective (its reads were cut short).
            return Err(Error::WorldBroken {
                rank,
                reason: st.broken.clone().unwrap_or_default(),
            });
        }
        result
    }

    /// Sends an abort that [`Star::abort`] left to the holder of the lock;
    /// whether there was one.
    fn send_pending_abort(&self, st: &mut StarState) -> bool {
        let Some(p) = self.pending_abort.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return false;
        };
        st.broken = Some(p.broken);
        notify_failure(&mut st.links, st.seq, &p.reason);
        true
    }

    /// This rank failed: tell the others without waiting for them. Rank 0
    /// fails every peer's current or next collective; a peer sends rank 0 a
    /// `Fail` frame, which rank 0's next collective relays to the others.
    /// Returns false when the world had already broken.
    ///
    /// Returns within about a second: when a collective of another thread
    /// holds the world (possibly until its timeout), the abort is left to
    /// that thread and the links' read sides are shut down, which ends its
    /// blocking reads at once; it then sends the notification.
    pub(crate) fn abort(&self, reason: &str) -> bool {
        let pending = PendingAbort {
            broken: format!("this rank aborted the world: {reason}"),
            reason: format!("rank {} failed: {reason}", self.rank),
        };
        let mut st = match self.state.try_lock() {
            Ok(st) => st,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                let mut slot = self.pending_abort.lock().unwrap_or_else(|p| p.into_inner());
                if slot.is_some() {
                    return false;
                }
                *slot = Some(pending);
                drop(slot);
                for s in &self.wakers {
                    let _ = s.shutdown(Shutdown::Read);
                }
                return true;
            }
        };
        // A pending abort of another thread is sent now, and this one is not.
        if self.send_pending_abort(&mut st) || st.broken.is_some() {
            return false;
        }
        let st = &mut *st;
        st.broken = Some(pending.broken);
        notify_failure(&mut st.links, st.seq, &pending.reason);
        true
    }

    fn root_exchange(&self, links: &mut [Option<Link>], op: Op, seq: u64, mine: &[u8], start: Instant) -> Result<Arc<Vec<Vec<u8>>>> {
        let deadline = start + self.timeout;
        let what = describe(op, seq);
        let gathered = (|| {
            let mut table = vec![Vec::new(); self.size];
            table[0] = mine.to_vec();
            // The answer carries every part: keep it under the frame limit
            // while reading, so an oversize part is refused unread.
            let mut answer = STEP_LEN + 8 + 8 + mine.len() as u64;
            if answer > MAX_FRAME_BYTES {
                return Err(Error::FrameTooLarge {
                    rank: 0,
                    what: format!("this rank's part of {what}"),
                    bytes: answer,
                    max: MAX_FRAME_BYTES,
                });
            }
            for r in 1..self.size {
                let link = links[r].as_mut().expect("rank 0 holds a link per peer");
                // Rank r's frame is its step, a length and its part; the answer grows by the last two.
                let frame = match link.read(MAX_FRAME_BYTES - answer + STEP_LEN, deadline) {
                    Ok(f) => f,
                    Err(WireError::TimedOut) => {
                        // The later ranks were not read yet: those with nothing
                        // pending have not arrived either.
                        let mut missing = vec![r];
                        missing.extend((r + 1..self.size).filter(|&q| !has_pending(links[q].as_ref().expect("link").stream())));
                        return Err(Error::CollectiveTimeout {
                            rank: 0,
                            op: what.clone(),
                            waited: start.elapsed(),
                            missing,
                        });
                    }
                    Err(WireError::TooLarge { len, .. }) => {
                        return Err(Error::FrameTooLarge {
                            rank: 0,
                            what: format!(
                                "the answer to {what} with rank {r}'s part ({} bytes)",
                                len.saturating_sub(STEP_LEN + 8)
                            ),
                            bytes: (answer + len).saturating_sub(STEP_LEN),
                            max: MAX_FRAME_BYTES,
                        })
                    }
                    Err(e) => return Err(link_error(0, r, &what, e)),
                };
                let bad = |detail: String| Error::WorldProtocol {
                    rank: 0,
                    peer: format!("rank {r}"),
                    detail,
                };
                if frame.kind == Kind::Fail {
                    // The peer failed and aborted (Star::abort): relay its reason.
                    let mut d = Dec::new(&frame.body);
                    let _ = decode_step(&mut d).map_err(bad)?;
                    return Err(Error::PeerFailed {
                        rank: 0,
                        peer: r,
                        reason: d.str("reason").map_err(bad)?,
                    });
                }
                if frame.kind != Kind::Collective {
                    return Err(bad(format!("expected a collective step, got a {:?} frame", frame.kind)));
                }
                let mut d = Dec::new(&frame.body);
                let (their_op, their_seq) = decode_step(&mut d).map_err(bad)?;
                if (their_op, their_seq) != (op, seq) {
                    return Err(Error::CollectiveMismatch {
                        rank: r,
                        ours: what.clone(),
                        theirs: describe(their_op, their_seq),
                    });
                }
                table[r] = d.bytes("payload").map_err(bad)?.to_vec();
                d.end("the collective step").map_err(bad)?;
                answer += 8 + table[r].len() as u64;
            }
            Ok(table)
        })();
        let table = match gathered {
            Ok(t) => t,
            Err(e) => {
                fail_all(links, op, seq, &e.to_string());
                return Err(e);
            }
        };
        let reply = table.iter().fold(encode_step(op, seq).u64(self.size as u64), |e, b| e.bytes(b)).0;
        for r in 1..self.size {
            let link = links[r].as_mut().expect("link");
            if let Err(e) = link.write(Kind::Collective, &reply, deadline.max(Instant::now() + NOTIFY_GRACE)) {
                let e = Error::PeerLost {
                    rank: 0,
                    peer: r,
                    op: what.clone(),
                    detail: e.to_string(),
                };
                fail_all(links, op, seq, &e.to_string());
                return Err(e);
            }
        }
        Ok(Arc::new(table))
    }

    fn peer_exchange(&self, link: &mut Link, op: Op, seq: u64, mine: &[u8], start: Instant) -> Result<Arc<Vec<Vec<u8>>>> {
        let rank = self.rank;
        let what = describe(op, seq);
        let bad = |detail: String| Error::WorldProtocol {
            rank,
            peer: "rank 0".into(),
            detail,
        };
        let timed_out = || Error::CollectiveTimeout {
            rank,
            op: what.clone(),
            waited: start.elapsed(),
            missing: vec![0],
        };
        let step = encode_step(op, seq).bytes(mine).0;
        if step.len() as u64 > MAX_FRAME_BYTES {
            // Rank 0 refuses the frame by its header alone and tells every
            // rank; this rank need not wait for that.
            let _ = link.announce_unsendable(Kind::Collective, step.len() as u64, Instant::now() + NOTIFY_GRACE);
            return Err(Error::FrameTooLarge {
                rank,
                what: format!("this rank's part of {what}"),
                bytes: step.len() as u64,
                max: MAX_FRAME_BYTES,
            });
        }
        match link.write(Kind::Collective, &step, start + self.timeout) {
            Ok(()) => {}
            Err(WireError::TimedOut) => return Err(timed_out()),
            Err(e) => return Err(link_error(rank, 0, &what, e)),
        }
        let frame = match link.read(MAX_FRAME_BYTES, start + self.timeout + PEER_GRACE) {
            Ok(f) => f,
            Err(WireError::TimedOut) => return Err(timed_out()),
            Err(e) => return Err(link_error(rank, 0, &what, e)),
        };
        let mut d = Dec::new(&frame.body);
        match frame.kind {
            Kind::Fail => {
                let (_, _) = decode_step(&mut d).map_err(bad)?;
                Err(Error::WorldAborted {
                    rank,
                    op: what.clone(),
                    reason: d.str("reason").map_err(bad)?,
                })
            }
            Kind::Collective => {
                let (their_op, their_seq) = decode_step(&mut d).map_err(bad)?;
                if (their_op, their_seq) != (op, seq) {
                    return Err(bad(format!("answered {} to our {what}", describe(their_op, their_seq))));
                }
                let n = d.usize("rank count").map_err(bad)?;
                if n != self.size {
                    return Err(bad(format!("answered with {n} ranks, the world has {}", self.size)));
                }
                let table = (0..n)
                    .map(|_| d.bytes("payload").map(<[u8]>::to_vec))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(bad)?;
                d.end("the collective answer").map_err(bad)?;
                Ok(Arc::new(table))
            }
            k => Err(bad(format!("expected a collective answer, got a {k:?} frame"))),
        }
    }
}

/// Whether bytes wait on `s` (without consuming them).
fn has_pending(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let pending = matches!(s.peek(&mut b), Ok(n) if n > 0);
    let _ = s.set_nonblocking(false);
    pending
}

fn fail_all(links: &mut [Option<Link>], op: Op, seq: u64, reason: &str) {
    let body = encode_step(op, seq).str(reason).0;
    // One grace for all the links, so that a dead peer or many cannot
    // stretch it.
    let deadline = Instant::now() + NOTIFY_GRACE;
    for link in links.iter_mut().flatten() {
        let _ = link.write(Kind::Fail, &body, deadline);
    }
}

/// Tells the other ranks that this one failed (`reason`): rank 0 tells
/// every peer, a peer tells rank 0 (which relays it).
fn notify_failure(links: &mut Links, seq: u64, reason: &str) {
    match links {
        Links::Root(links) => fail_all(links, Op::Barrier, seq, reason),
        Links::Peer(s) => {
            let body = encode_step(Op::Barrier, seq).str(reason).0;
            let _ = s.write(Kind::Fail, &body, Instant::now() + NOTIFY_GRACE);
        }
    }
}

impl Drop for Star {
    /// An abort left to a collective that ended before it saw it is sent now.
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let p = self.pending_abort.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(p) = p {
            notify_failure(&mut st.links, st.seq, &p.reason);
        }
    }
}
