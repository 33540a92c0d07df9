//! Frames on the TCP star: `magic | kind | length | body`, every read and
//! write bounded by a deadline.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Starts every frame; a stream that does not is not a doorbell world.
pub(crate) const MAGIC: [u8; 4] = *b"DBW1";
const HEADER: usize = 4 + 1 + 8;

/// Frames of the handshake, before the peer proved the token: small.
pub(crate) const MAX_UNAUTHENTICATED: u64 = 256;
/// Hello frames (they carry the layout blob).
pub(crate) const MAX_HELLO: u64 = 16 << 20;
/// Collective frames.
pub(crate) const MAX_COLLECTIVE: u64 = 1 << 40;

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
#[derive(Debug)]
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
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Closed(why) => write!(f, "connection closed ({why})"),
            WireError::TimedOut => write!(f, "timed out"),
            WireError::Garbage(what) => write!(f, "{what}"),
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
        _ => Some(WireError::Closed(e.to_string())),
    }
}

fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), WireError> {
    let mut off = 0;
    while off < buf.len() {
        let left = remaining(deadline).ok_or(WireError::TimedOut)?;
        s.set_read_timeout(Some(left)).map_err(|e| WireError::Closed(e.to_string()))?;
        match s.read(&mut buf[off..]) {
            Ok(0) => return Err(WireError::Closed("end of stream".into())),
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

fn write_all_by(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> Result<(), WireError> {
    let mut off = 0;
    while off < buf.len() {
        let left = remaining(deadline).ok_or(WireError::TimedOut)?;
        s.set_write_timeout(Some(left)).map_err(|e| WireError::Closed(e.to_string()))?;
        match s.write(&buf[off..]) {
            Ok(0) => return Err(WireError::Closed("write returned 0".into())),
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

/// Writes one frame, giving up at `deadline`.
pub(crate) fn write_frame(s: &mut TcpStream, kind: Kind, body: &[u8], deadline: Instant) -> Result<(), WireError> {
    let mut head = [0u8; HEADER];
    head[..4].copy_from_slice(&MAGIC);
    head[4] = kind as u8;
    head[5..].copy_from_slice(&(body.len() as u64).to_be_bytes());
    if body.len() <= 4096 {
        // One segment for small frames (TCP_NODELAY is on).
        let mut all = Vec::with_capacity(HEADER + body.len());
        all.extend_from_slice(&head);
        all.extend_from_slice(body);
        return write_all_by(s, &all, deadline);
    }
    write_all_by(s, &head, deadline)?;
    write_all_by(s, body, deadline)
}

/// Reads one frame of at most `max` body bytes, giving up at `deadline`.
pub(crate) fn read_frame(s: &mut TcpStream, max: u64, deadline: Instant) -> Result<Frame, WireError> {
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
    if len > max {
        return Err(WireError::Garbage(format!(
            "{kind:?} frame of {len} bytes exceeds the limit of {max}"
        )));
    }
    let mut body = vec![0u8; len as usize];
    read_exact_by(s, &mut body, deadline)?;
    Ok(Frame { kind, body })
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
        let f = read_frame(&mut b, MAX_COLLECTIVE, soon()).unwrap();
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
        assert!(matches!(read_frame(&mut b, 10, soon()), Err(WireError::Garbage(_))));
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
}
