//! Frames on the TCP star: `magic | kind | length | body`, every read and
//! write bounded by a deadline.
//!
//! The handshake's frames are plain ([`read_frame`], [`write_frame`]). Every
//! frame after it travels on a [`Link`]: `magic | kind | length | body | tag`,
//! where `length` counts body and tag and the tag is
//! `HMAC-SHA256(direction key, sequence number | magic | kind | length | body)`
//! (see [`auth`](super::auth)). A length above the reader's limit is refused
//! before anything is allocated, and bodies are read in chunks, so memory
//! grows only with bytes that really arrive.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::auth::{FrameKey, TAG_LEN};

/// Starts every frame; a stream that does not is not a doorbell world.
pub(crate) const MAGIC: [u8; 4] = *b"DBW1";
const HEADER: usize = 4 + 1 + 8;
/// Bodies are read (and memory committed) this much at a time.
const CHUNK: usize = 1 << 20;

/// Frames of the handshake, before the peer proved the token: small.
pub(crate) const MAX_UNAUTHENTICATED: u64 = 256;
/// Hello frames (they carry the layout blob).
pub(crate) const MAX_HELLO: u64 = 16 << 20;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// rank 0 → peer: protocol version, nonce.
    Challenge = 1,
    /// peer → rank 0: nonce, proof.
    Proof = 2,
    /// rank 0 → peer: wrong token.
    Refuse = 3,
    /// rank 0 → peer: rank 0's proof.
    RootProof = 4,
    /// peer → rank 0: who the peer is.
    Hello = 5,
    /// rank 0 → peer: ranks still missing.
    Status = 6,
    /// rank 0 → peer: the rendezvous failed (mismatch or timeout).
    Abort = 7,
    /// rank 0 → peer: everyone is here; the table of ranks.
    Welcome = 8,
    /// Either way: one step of a collective.
    Collective = 9,
    /// rank 0 → peer: the collective failed elsewhere.
    Fail = 10,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        use Kind::*;
        Some(match b {
            1 => Challenge,
            2 => Proof,
            3 => Refuse,
            4 => RootProof,
            5 => Hello,
            6 => Status,
            7 => Abort,
            8 => Welcome,
            9 => Collective,
            10 => Fail,
            _ => return None,
        })
    }
}

/// A frame read off the wire.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub kind: Kind,
    pub body: Vec<u8>,
}

/// Why a frame could not be read or written.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The other side closed or reset the connection.
    Closed(String),
    /// The deadline passed.
    TimedOut,
    /// Bytes that are not a doorbell frame.
    Garbage(String),
    /// A frame longer than the reader accepts; nothing of its body was read.
    TooLarge { kind: Kind, len: u64, max: u64 },
    /// A frame of a [`Link`] whose tag does not match: altered, forged,
    /// replayed or reordered. Carries the frame as received (body and tag
    /// together), unauthenticated, for diagnostics only.
    Forged(Frame),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Closed(why) => write!(f, "connection closed ({why})"),
            WireError::TimedOut => write!(f, "timed out"),
            WireError::Garbage(what) => write!(f, "{what}"),
            WireError::TooLarge { kind, len, max } => write!(f, "a {kind:?} frame of {len} bytes, more than the limit of {max}"),
            WireError::Forged(frame) => write!(
                f,
                "a {:?} frame failed authentication: its HMAC does not match this connection's session key and sequence \
                 number, so it was altered, forged, replayed or reordered on the way (or sent by another doorbell version)",
                frame.kind
            ),
        }
    }
}

fn remaining(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    // A zero timeout means "block forever" to the socket API: never pass it.
    (!left.is_zero()).then_some(left.max(Duration::from_millis(1)))
}

fn classify(e: io::Error) -> Option<WireError> {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted => None,
        _ => Some(closed(e)),
    }
}

/// Moves `len` bytes through a socket by `deadline`: `step(left, off)`
/// sets the socket's timeout to `left`, the time that is left, and reads or
/// writes from byte `off` on. A step that moves nothing is the end of the
/// connection (`ended` says how); a transient error is tried again.
fn transfer_by(
    len: usize,
    deadline: Instant,
    ended: &str,
    mut step: impl FnMut(Duration, usize) -> Result<io::Result<usize>, WireError>,
) -> Result<(), WireError> {
    let mut off = 0;
    while off < len {
        let left = remaining(deadline).ok_or(WireError::TimedOut)?;
        match step(left, off)? {
            Ok(0) => return Err(WireError::Closed(ended.into())),
            Ok(n) => off += n,
            Err(e) => {
                if let Some(err) = classify(e) {
                    return Err(err);
                }
            }
        }
    }
    Ok(())
}

fn closed(e: io::Error) -> WireError {
    WireError::Closed(e.to_string())
}

fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), WireError> {
    transfer_by(buf.len(), deadline, "end of stream", |left, off| {
        s.set_read_timeout(Some(left)).map_err(closed)?;
        Ok(s.read(&mut buf[off..]))
    })
}

fn write_all_by(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> Result<(), WireError> {
    transfer_by(buf.len(), deadline, "write returned 0", |left, off| {
        s.set_write_timeout(Some(left)).map_err(closed)?;
        Ok(s.write(&buf[off..]))
    })
}

fn header(kind: Kind, len: u64) -> [u8; HEADER] {
    let mut head = [0u8; HEADER];
    head[..4].copy_from_slice(&MAGIC);
    head[4] = kind as u8;
    head[5..].copy_from_slice(&len.to_be_bytes());
    head
}

fn write_parts(s: &mut TcpStream, parts: &[&[u8]], deadline: Instant) -> Result<(), WireError> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    if total <= 4096 + HEADER + TAG_LEN {
        // One segment for small frames (TCP_NODELAY is on).
        return write_all_by(s, &parts.concat(), deadline);
    }
    parts.iter().try_for_each(|p| write_all_by(s, p, deadline))
}

/// Writes one plain frame (handshake only), giving up at `deadline`.
pub(crate) fn write_frame(s: &mut TcpStream, kind: Kind, body: &[u8], deadline: Instant) -> Result<(), WireError> {
    write_parts(s, &[&header(kind, body.len() as u64), body], deadline)
}

/// Reads a header; `extra` bytes (the tag) follow the body.
fn read_header(s: &mut TcpStream, max: u64, extra: u64, deadline: Instant) -> Result<([u8; HEADER], Kind, u64), WireError> {
    let mut head = [0u8; HEADER];
    read_exact_by(s, &mut head, deadline)?;
    if head[..4] != MAGIC {
        return Err(WireError::Garbage(format!(
            "received {:02x?} where a doorbell frame starts with {:02x?} (\"DBW1\")",
            &head[..4],
            MAGIC
        )));
    }
    let kind = Kind::from_u8(head[4]).ok_or_else(|| WireError::Garbage(format!("unknown frame kind {}", head[4])))?;
    let len = u64::from_be_bytes(head[5..].try_into().unwrap());
    if len < extra {
        return Err(WireError::Garbage(format!(
            "{kind:?} frame of {len} bytes is too short to carry its {extra}-byte tag"
        )));
    }
    if len - extra > max {
        return Err(WireError::TooLarge {
            kind,
            len: len - extra,
            max,
        });
    }
    Ok((head, kind, len))
}

/// Reads `len` bytes, committing memory chunk by chunk as they arrive.
fn read_body(s: &mut TcpStream, len: u64, deadline: Instant) -> Result<Vec<u8>, WireError> {
    let len = usize::try_from(len).map_err(|_| WireError::Garbage(format!("a frame of {len} bytes does not fit this machine")))?;
    let mut body = Vec::with_capacity(len.min(CHUNK));
    while body.len() < len {
        let old = body.len();
        body.resize(old + (len - old).min(CHUNK), 0);
        read_exact_by(s, &mut body[old..], deadline)?;
    }
    Ok(body)
}

/// Reads one plain frame (handshake only) of at most `max` body bytes,
/// giving up at `deadline`.
pub(crate) fn read_frame(s: &mut TcpStream, max: u64, deadline: Instant) -> Result<Frame, WireError> {
    let (_, kind, len) = read_header(s, max, 0, deadline)?;
    Ok(Frame {
        kind,
        body: read_body(s, len, deadline)?,
    })
}

/// An authenticated connection: every frame carries a tag under this
/// direction's session key and an implicit sequence number.
pub(crate) struct Link {
    stream: TcpStream,
    send_key: FrameKey,
    recv_key: FrameKey,
    sent: u64,
    received: u64,
}

impl Link {
    /// Wraps `stream` once the handshake derived the keys
    /// ([`auth::session_keys`](super::auth::session_keys)).
    pub(crate) fn new(stream: TcpStream, (send_key, recv_key): (FrameKey, FrameKey)) -> Link {
        Link {
            stream,
            send_key,
            recv_key,
            sent: 0,
            received: 0,
        }
    }

    /// The socket, for polling.
    pub(crate) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Writes one tagged frame, giving up at `deadline`.
    pub(crate) fn write(&mut self, kind: Kind, body: &[u8], deadline: Instant) -> Result<(), WireError> {
        let head = header(kind, body.len() as u64 + TAG_LEN as u64);
        let tag = self.send_key.tag(self.sent, &head, body);
        // Counted even when the write fails: a half-written frame ends the link.
        self.sent += 1;
        write_parts(&mut self.stream, &[&head, body, &tag], deadline)
    }

    /// Sends only the header of a frame of `len` body bytes that is too
    /// large to send: the reader refuses it by its length
    /// ([`WireError::TooLarge`]) without waiting for a body, and reports it
    /// at once. The link is unusable afterwards.
    pub(crate) fn announce_unsendable(&mut self, kind: Kind, len: u64, deadline: Instant) -> Result<(), WireError> {
        self.sent += 1;
        write_all_by(&mut self.stream, &header(kind, len.saturating_add(TAG_LEN as u64)), deadline)
    }

    /// Reads one tagged frame of at most `max` body bytes, giving up at
    /// `deadline`; a frame whose tag does not match is [`WireError::Forged`].
    pub(crate) fn read(&mut self, max: u64, deadline: Instant) -> Result<Frame, WireError> {
        let (head, kind, len) = read_header(&mut self.stream, max, TAG_LEN as u64, deadline)?;
        let mut body = read_body(&mut self.stream, len, deadline)?;
        let seq = self.received;
        self.received += 1;
        let split = body.len() - TAG_LEN;
        if !self.recv_key.check(seq, &head, &body[..split], &body[split..]) {
            return Err(WireError::Forged(Frame { kind, body }));
        }
        body.truncate(split);
        Ok(Frame { kind, body })
    }
}

/// Big-endian encoder for frame bodies.
#[derive(Default)]
pub(crate) struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn raw(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    pub fn bytes(self, v: &[u8]) -> Self {
        self.u64(v.len() as u64).raw(v)
    }
    pub fn str(self, v: &str) -> Self {
        self.bytes(v.as_bytes())
    }
    pub fn list(self, v: &[usize]) -> Self {
        v.iter().fold(self.u64(v.len() as u64), |e, &x| e.u64(x as u64))
    }
}

/// Decoder matching [`Enc`]; errors say what was being read.
pub(crate) struct Dec<'a> {
    buf: &'a [u8],
}

impl<'a> Dec<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Dec { buf }
    }
    pub fn raw(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err(format!("truncated frame: {what} needs {n} bytes, {} left", self.buf.len()));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    pub fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.raw(1, what)?[0])
    }
    pub fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.raw(4, what)?.try_into().unwrap()))
    }
    pub fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.raw(8, what)?.try_into().unwrap()))
    }
    pub fn usize(&mut self, what: &str) -> Result<usize, String> {
        let v = self.u64(what)?;
        usize::try_from(v).map_err(|_| format!("{what} = {v} does not fit this machine"))
    }
    pub fn bytes(&mut self, what: &str) -> Result<&'a [u8], String> {
        let n = self.usize(what)?;
        self.raw(n, what)
    }
    pub fn str(&mut self, what: &str) -> Result<String, String> {
        Ok(String::from_utf8_lossy(self.bytes(what)?).into_owned())
    }
    pub fn list(&mut self, what: &str) -> Result<Vec<usize>, String> {
        let n = self.usize(what)?;
        if n > self.buf.len() / 8 {
            return Err(format!("truncated frame: {what} claims {n} entries"));
        }
        (0..n).map(|_| self.usize(what)).collect()
    }
    pub fn end(&self, what: &str) -> Result<(), String> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(format!("{} trailing bytes after {what}", self.buf.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn frames_round_trip_small_and_large() {
        let (mut a, mut b) = pair();
        let big: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
        let big2 = big.clone();
        let t = std::thread::spawn(move || {
            write_frame(&mut a, Kind::Hello, b"hi", soon()).unwrap();
            write_frame(&mut a, Kind::Collective, &big2, soon()).unwrap();
            a
        });
        let f = read_frame(&mut b, 10, soon()).unwrap();
        assert_eq!((f.kind, f.body.as_slice()), (Kind::Hello, &b"hi"[..]));
        let f = read_frame(&mut b, MAX_HELLO, soon()).unwrap();
        assert_eq!((f.kind, f.body), (Kind::Collective, big));
        drop(t.join().unwrap());
        assert!(matches!(read_frame(&mut b, 10, soon()), Err(WireError::Closed(_))));
    }

    #[test]
    fn read_times_out_and_rejects_garbage_and_oversize() {
        let (mut a, mut b) = pair();
        let t0 = Instant::now();
        let r = read_frame(&mut b, 10, Instant::now() + Duration::from_millis(100));
        assert!(matches!(r, Err(WireError::TimedOut)), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(3));
        write_frame(&mut a, Kind::Proof, &[0u8; 11], soon()).unwrap();
        let r = read_frame(&mut b, 10, soon());
        assert!(
            matches!(
                r,
                Err(WireError::TooLarge {
                    kind: Kind::Proof,
                    len: 11,
                    max: 10
                })
            ),
            "{r:?}"
        );
        let (mut a, mut b) = pair();
        a.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert!(matches!(read_frame(&mut b, 10, soon()), Err(WireError::Garbage(_))));
    }

    #[test]
    fn codec_round_trips_and_reports_truncation() {
        let e = Enc::default().u8(7).u32(9).str("host").bytes(&[1, 2]).list(&[3, 5]);
        let mut d = Dec::new(&e.0);
        assert_eq!(d.u8("a").unwrap(), 7);
        assert_eq!(d.u32("b").unwrap(), 9);
        assert_eq!(d.str("c").unwrap(), "host");
        assert_eq!(d.bytes("d").unwrap(), &[1, 2]);
        assert_eq!(d.list("e").unwrap(), vec![3, 5]);
        d.end("all").unwrap();
        let mut d = Dec::new(&e.0[..6]);
        d.u8("a").unwrap();
        assert!(d.u64("b").unwrap_err().contains("truncated"));
        let huge = Enc::default().u64(u64::MAX / 2);
        assert!(Dec::new(&huge.0).list("l").is_err());
    }

    fn links() -> (Link, Link) {
        use crate::world::auth::{nonce, session_keys, Side};
        let (a, b) = pair();
        let (n0, n1) = (nonce().unwrap(), nonce().unwrap());
        let token = b"wire-test-token-0123456789";
        (
            Link::new(a, session_keys(token, &n0, &n1, Side::Root)),
            Link::new(b, session_keys(token, &n0, &n1, Side::Peer)),
        )
    }

    #[test]
    fn links_round_trip_in_both_directions() {
        let (mut root, mut peer) = links();
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
        let big2 = big.clone();
        let t = std::thread::spawn(move || {
            for i in 0..3u8 {
                root.write(Kind::Status, &[i], soon()).unwrap();
            }
            root.write(Kind::Collective, &big2, soon()).unwrap();
            root.read(10, soon()).unwrap()
        });
        for i in 0..3u8 {
            assert_eq!(
                peer.read(10, soon()).unwrap(),
                Frame {
                    kind: Kind::Status,
                    body: vec![i]
                }
            );
        }
        assert_eq!(peer.read(1 << 30, soon()).unwrap().body, big);
        peer.write(Kind::Hello, b"", soon()).unwrap();
        assert_eq!(
            t.join().unwrap(),
            Frame {
                kind: Kind::Hello,
                body: vec![]
            }
        );
    }

    /// Writes `frame` raw on the link's socket (an attacker on the wire).
    fn inject(link: &mut Link, bytes: &[u8]) {
        let mut s = link.stream().try_clone().unwrap();
        s.write_all(bytes).unwrap();
    }

    /// The bytes `Link::write` would put on the wire for frame number `seq`.
    fn sealed(key: &FrameKey, seq: u64, kind: Kind, body: &[u8]) -> Vec<u8> {
        let head = header(kind, (body.len() + TAG_LEN) as u64);
        [&head[..], body, &key.tag(seq, &head, body)].concat()
    }

    #[test]
    fn links_refuse_altered_forged_replayed_and_reordered_frames() {
        use crate::world::auth::{nonce, session_keys, Side};
        let (a, b) = pair();
        let (n0, n1) = (nonce().unwrap(), nonce().unwrap());
        let token = b"wire-test-token-0123456789";
        let (root_send, _) = session_keys(token, &n0, &n1, Side::Root);
        let mut peer = Link::new(b, session_keys(token, &n0, &n1, Side::Peer));
        let mut a = a;
        let good0 = sealed(&root_send, 0, Kind::Collective, b"step zero");
        let good1 = sealed(&root_send, 1, Kind::Collective, b"step one");
        a.write_all(&good0).unwrap();
        assert_eq!(peer.read(100, soon()).unwrap().body, b"step zero");

        // Replayed: frame 0 again where frame 1 is due.
        a.write_all(&good0).unwrap();
        assert!(matches!(peer.read(100, soon()), Err(WireError::Forged(f)) if f.kind == Kind::Collective));

        // Each of the following on a fresh link at sequence 0.
        let fresh = || {
            let (a, b) = pair();
            (a, Link::new(b, session_keys(token, &n0, &n1, Side::Peer)))
        };
        // Reordered: frame 1 first.
        let (mut a, mut peer) = fresh();
        a.write_all(&good1).unwrap();
        assert!(matches!(peer.read(100, soon()), Err(WireError::Forged(_))));
        // Altered: one body bit flipped, or the kind changed.
        let (mut a, mut peer) = fresh();
        let mut bad = good0.clone();
        bad[HEADER + 2] ^= 1;
        a.write_all(&bad).unwrap();
        assert!(matches!(peer.read(100, soon()), Err(WireError::Forged(_))));
        let (mut a, mut peer) = fresh();
        let mut bad = good0.clone();
        bad[4] = Kind::Fail as u8;
        a.write_all(&bad).unwrap();
        assert!(matches!(peer.read(100, soon()), Err(WireError::Forged(f)) if f.kind == Kind::Fail));
        // Forged: a tag under another token.
        let (mut a, mut peer) = fresh();
        let (other, _) = session_keys(b"another-token-0123456789", &n0, &n1, Side::Root);
        a.write_all(&sealed(&other, 0, Kind::Collective, b"step zero")).unwrap();
        assert!(matches!(peer.read(100, soon()), Err(WireError::Forged(_))));
        // A plain (untagged) frame.
        let (mut a, mut peer) = fresh();
        write_frame(&mut a, Kind::Collective, &[0u8; 40], soon()).unwrap();
        assert!(matches!(peer.read(100, soon()), Err(WireError::Forged(_))));
    }

    #[test]
    fn oversize_frames_are_refused_before_any_allocation() {
        let (mut a, mut b) = pair();
        // A header claiming 1 TiB, and nothing behind it: the reader must
        // answer at once instead of allocating or waiting for the body.
        a.write_all(&header(Kind::Collective, 1 << 40)).unwrap();
        let t0 = Instant::now();
        let r = read_frame(&mut b, 1 << 30, soon());
        assert!(
            matches!(r, Err(WireError::TooLarge { kind: Kind::Collective, len, max }) if len == 1 << 40 && max == 1 << 30),
            "{r:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(2));
        let (mut root, mut peer) = links();
        inject(&mut root, &header(Kind::Collective, (1 << 40) + TAG_LEN as u64));
        let r = peer.read(1 << 30, soon());
        assert!(matches!(r, Err(WireError::TooLarge { len, .. }) if len == 1 << 40), "{r:?}");
        let (mut root, mut peer) = links();
        inject(&mut root, &header(Kind::Collective, 5));
        assert!(matches!(peer.read(1 << 30, soon()), Err(WireError::Garbage(g)) if g.contains("too short")));
    }
}
