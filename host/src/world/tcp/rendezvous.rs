//! The rendezvous of a multi-process world: rank 0's [`RendezvousHost`]
//! admits every peer through the token proofs and its hello, and [`join`]
//! is a peer's side of it. Both end in a [`Star`](super::star::Star) of
//! authenticated links (the protocol is in [`super`]).

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::star::{star_world, Links, NOTIFY_GRACE};
use crate::error::{Error, Result};
use crate::world::auth::{self, Nonce, Side, NONCE_LEN, PEER_LABEL, PROOF_LEN, ROOT_LABEL};
use crate::world::wire::{self, Dec, Enc, Frame, Kind, Link, WireError};
use crate::world::{PeerInfo, World, WorldConfig, WorldId, MAX_FRAME_BYTES, WORLD_ID_LEN};

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
    /// [`crate::world::heap_layout_word`] of that build.
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
    Joined(Box<Link>, SocketAddr, RawHello),
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
        crate::world::check_token(config)?;
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
        if layout.len() > crate::world::MAX_LAYOUT {
            return Err(Error::WorldProtocol {
                rank: 0,
                peer: "itself".into(),
                detail: format!(
                    "the layout blob has {} bytes, more than the {} a rendezvous carries",
                    layout.len(),
                    crate::world::MAX_LAYOUT
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
                            joined[r] = Some((*link, info));
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

        report_turned_away(turned_away, self.max_pending);
        welcome(cfg, layout, joined, &token, deadline)
    }
}

/// Rank 0 once every rank joined: sends each the table of all ranks with
/// a fresh world id (the welcome) and forms the world.
fn welcome(cfg: &WorldConfig, layout: &[u8], joined: Vec<Option<(Link, PeerInfo)>>, token: &Arc<[u8]>, deadline: Instant) -> Result<World> {
    let (rank, size) = (0, cfg.size);
    let io = |what, source| Error::WorldIo { rank, what, source };
    let me = PeerInfo {
        rank: 0,
        local_rank: cfg.local_rank,
        hostname: hostname(),
        pid: std::process::id(),
        layout: layout.to_vec(),
    };
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
    Ok(star_world(0, size, cfg, token, table, id, Links::Root(links)))
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
        Ok(h) if h.library != crate::world::LIBRARY_VERSION => {
            return Err(mismatch(
                h.info.rank,
                "doorbell library version",
                crate::world::LIBRARY_VERSION.to_string(),
                h.library,
            ))
        }
        Ok(h) if h.heap_layout != crate::world::heap_layout_word() => {
            return Err(mismatch(
                h.info.rank,
                "heap layout word (the shared structures of another build)",
                format!("{:#018x}", crate::world::heap_layout_word()),
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
        Ok(Frame { kind: Kind::Hello, body }) => Handshake::Joined(Box::new(link), addr, Hello::decode(&body)),
        Ok(f) => fail(format!("expected a hello, got a {:?} frame", f.kind)),
        Err(WireError::Forged(f)) => {
            // Version 1 sent its hello untagged: its last 32 bytes then pose
            // as the tag. Name the version rather than a forgery.
            let head = match Hello::decode(&f.body) {
                Ok(h) => Some((h.version, h.size, h.info.rank)),
                Err((head, _)) => head,
            };
            match head {
                Some((v, size, rank)) if f.kind == Kind::Hello && v != PROTOCOL_VERSION => Handshake::Joined(
                    Box::new(link),
                    addr,
                    Err((Some((v, size, rank)), "another protocol version".into())),
                ),
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
        library: crate::world::LIBRARY_VERSION.to_string(),
        heap_layout: crate::world::heap_layout_word(),
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
    Ok(star_world(rank, size, cfg, &key, table, id, Links::Peer(Box::new(link))))
}
