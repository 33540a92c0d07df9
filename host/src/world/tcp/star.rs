//! A joined multi-process world's collectives: every rank's links to rank 0
//! ([`Star`]), the step check rank 0 runs on each collective, and the
//! failure reports it sends to the others (the protocol is in [`super`]).

use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::world::wire::{Dec, Enc, Kind, Link, WireError};
use crate::world::{Inner, Op, PeerInfo, World, WorldConfig, WorldId, MAX_FRAME_BYTES};

/// How long rank 0 spends telling a peer about a failure.
pub(super) const NOTIFY_GRACE: Duration = Duration::from_secs(1);
/// Extra time a peer waits for rank 0's verdict on a collective, so that
/// rank 0's report naming the slow rank arrives before the peer gives up.
const PEER_GRACE: Duration = Duration::from_secs(5);

/// The world of a rank whose rendezvous finished with `links`; `key` is
/// the stretched job token the rendezvous used.
pub(super) fn star_world(
    rank: usize,
    size: usize,
    cfg: &WorldConfig,
    key: &[u8],
    table: Vec<PeerInfo>,
    id: WorldId,
    links: Links,
) -> World {
    let sockets: Vec<&TcpStream> = match &links {
        Links::Root(v) => v.iter().flatten().map(Link::stream).collect(),
        Links::Peer(l) => vec![l.stream()],
    };
    // A socket that cannot be cloned only costs an abort its quick wake-up.
    let local_ip = sockets.first().and_then(|s| s.local_addr().ok()).map(|a| a.ip());
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
        local_ip,
        key: key.to_vec(),
        status: Mutex::new(None),
    };
    World::from_parts(rank, size, cfg.local_rank, table, id, Inner::Tcp(Box::new(star)))
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
    /// This rank's address on the star (where its status port listens).
    local_ip: Option<std::net::IpAddr>,
    /// The stretched job token (the status service's key derives from it).
    key: Vec<u8>,
    /// The status service, once the communicator published a source.
    status: Mutex<Option<crate::world::status::Service>>,
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

pub(super) enum Links {
    /// Rank 0: one link per peer, indexed by rank (slot 0 empty).
    Root(Vec<Option<Link>>),
    /// A peer: the link to rank 0.
    Peer(Box<Link>),
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
    /// This rank's address on the star.
    pub(crate) fn local_ip(&self) -> std::io::Result<std::net::IpAddr> {
        self.local_ip
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotConnected, "no socket of the star has an address"))
    }

    /// The stretched job token.
    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    /// Keeps the status service (its responder ends with the star).
    pub(crate) fn set_status_service(&self, s: crate::world::status::Service) {
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
    }

    /// The status key and every rank's status address, once served.
    pub(crate) fn status_peers(&self) -> Option<([u8; 32], Vec<Option<std::net::SocketAddr>>)> {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|s| s.peers())
    }

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
