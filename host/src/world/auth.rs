//! Token proof: HMAC-SHA256 challenge-response. The token never travels.
//!
//! Rank 0 sends a fresh nonce `n0`; the peer answers with its own nonce `n1`
//! and `HMAC(token, "…peer" | n0 | n1)`; rank 0 checks it and answers with
//! `HMAC(token, "…root" | n1 | n0)`, which the peer checks. The labels keep a
//! proof of one direction from being replayed as the other; fresh nonces on
//! both sides keep a recorded proof from being replayed later.
//!
//! Both sides then derive one key per direction,
//! `HMAC(token, "…root->peer" | n0 | n1)` and `HMAC(token, "…peer->root" | n0 | n1)`,
//! and tag every later frame with `HMAC(key, sequence number | header | body)`
//! ([`FrameKey`]). The sequence number is implicit (each side counts), so a
//! dropped, replayed or reordered frame fails its tag like an altered one.
//!
//! `token` above is not the job token itself but [`stretch`] of it: PBKDF2
//! with HMAC-SHA256 over [`STRETCH_ROUNDS`] rounds. Whoever squats the
//! rendezvous port sees a peer's proof and can test token guesses against
//! it offline; stretching makes every guess cost those rounds instead of one
//! HMAC, and obviously guessable tokens are refused before any of this
//! ([`crate::Error::WeakToken`]). Each process stretches its token once per
//! rendezvous (tens of milliseconds).
//!
//! Ranks of one process recognise each other by [`process_tag`]: an HMAC
//! under a random secret that never leaves the process, so a peer cannot
//! claim to share our address space by copying our pid.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::Read;
use std::sync::OnceLock;

/// Bytes in a nonce.
pub(crate) const NONCE_LEN: usize = 16;
/// Bytes in a proof, a session key and a frame tag (one SHA-256 output).
pub(crate) const PROOF_LEN: usize = 32;
/// Bytes in a frame tag.
pub(crate) const TAG_LEN: usize = PROOF_LEN;

pub(crate) const PEER_LABEL: &[u8] = b"doorbell-rendezvous-v1 peer";
pub(crate) const ROOT_LABEL: &[u8] = b"doorbell-rendezvous-v1 root";
/// The salt of [`stretch`]: fixed, so that every rank derives the same key
/// before it has talked to anyone.
const STRETCH_SALT: &[u8] = b"doorbell-token-stretch-v1";
/// PBKDF2 rounds of [`stretch`].
pub(crate) const STRETCH_ROUNDS: u32 = 100_000;
const ROOT_TO_PEER_LABEL: &[u8] = b"doorbell-session-v2 root->peer";
const PEER_TO_ROOT_LABEL: &[u8] = b"doorbell-session-v2 peer->root";
const PROCESS_LABEL: &[u8] = b"doorbell-process-v1";

pub(crate) type Nonce = [u8; NONCE_LEN];

/// Fills `buf` from the kernel's CSPRNG.
pub(crate) fn random_bytes(buf: &mut [u8]) -> std::io::Result<()> {
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// A fresh nonce from the kernel's CSPRNG.
pub(crate) fn nonce() -> std::io::Result<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    random_bytes(&mut n)?;
    Ok(n)
}

fn keyed(key: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length (long ones are hashed first).
    <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC accepts keys of any length")
}

fn mac(token: &[u8], label: &[u8], first: &Nonce, second: &Nonce) -> Hmac<Sha256> {
    let mut m = keyed(token);
    m.update(label);
    m.update(first);
    m.update(second);
    m
}

/// PBKDF2-HMAC-SHA256 (RFC 8018) of `password` and `salt` over `rounds`
/// rounds, first 32-byte block.
fn pbkdf2_sha256(password: &[u8], salt: &[u8], rounds: u32) -> [u8; PROOF_LEN] {
    let prf = keyed(password);
    let mut m = prf.clone();
    m.update(salt);
    m.update(&1u32.to_be_bytes());
    let mut u: [u8; PROOF_LEN] = m.finalize().into_bytes().into();
    let mut out = u;
    for _ in 1..rounds {
        let mut m = prf.clone();
        m.update(&u);
        u = m.finalize().into_bytes().into();
        out.iter_mut().zip(&u).for_each(|(o, x)| *o ^= x);
    }
    out
}

/// The key the handshake proves and derives session keys from: the job
/// token stretched over [`STRETCH_ROUNDS`] PBKDF2 rounds.
pub(crate) fn stretch(token: &[u8]) -> [u8; PROOF_LEN] {
    pbkdf2_sha256(token, STRETCH_SALT, STRETCH_ROUNDS)
}

/// The proof of knowing `token` for this pair of nonces.
pub(crate) fn prove(token: &[u8], label: &[u8], first: &Nonce, second: &Nonce) -> [u8; PROOF_LEN] {
    mac(token, label, first, second).finalize().into_bytes().into()
}

/// Checks a proof in constant time.
pub(crate) fn verify(token: &[u8], label: &[u8], first: &Nonce, second: &Nonce, proof: &[u8]) -> bool {
    mac(token, label, first, second).verify_slice(proof).is_ok()
}

/// Which end of a rendezvous connection this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Root,
    Peer,
}

/// The per-direction frame keys of one connection, from the token and both
/// handshake nonces (`n0` rank 0's, `n1` the peer's).
pub(crate) fn session_keys(token: &[u8], n0: &Nonce, n1: &Nonce, side: Side) -> (FrameKey, FrameKey) {
    let down = FrameKey(keyed(&prove(token, ROOT_TO_PEER_LABEL, n0, n1)));
    let up = FrameKey(keyed(&prove(token, PEER_TO_ROOT_LABEL, n0, n1)));
    match side {
        Side::Root => (down, up),
        Side::Peer => (up, down),
    }
}

/// Tags the frames of one direction of one connection.
#[derive(Clone)]
pub(crate) struct FrameKey(Hmac<Sha256>);

impl FrameKey {
    fn mac(&self, seq: u64, header: &[u8], body: &[u8]) -> Hmac<Sha256> {
        let mut m = self.0.clone();
        m.update(&seq.to_be_bytes());
        m.update(header);
        m.update(body);
        m
    }

    /// The tag of frame number `seq`.
    pub(crate) fn tag(&self, seq: u64, header: &[u8], body: &[u8]) -> [u8; TAG_LEN] {
        self.mac(seq, header, body).finalize().into_bytes().into()
    }

    /// Checks the tag of frame number `seq` in constant time.
    pub(crate) fn check(&self, seq: u64, header: &[u8], body: &[u8], tag: &[u8]) -> bool {
        self.mac(seq, header, body).verify_slice(tag).is_ok()
    }
}

static PROCESS_SECRET: OnceLock<[u8; 32]> = OnceLock::new();

/// This process's secret: random, made once, never sent anywhere.
fn process_secret() -> std::io::Result<&'static [u8; 32]> {
    if let Some(s) = PROCESS_SECRET.get() {
        return Ok(s);
    }
    let mut s = [0u8; 32];
    random_bytes(&mut s)?;
    // A racing thread may have set it first; either value is fine, as long
    // as every caller sees the same one afterwards.
    Ok(PROCESS_SECRET.get_or_init(|| s))
}

/// What rank `rank` of the world `world_id` presents to prove that it runs in
/// this process. Only this process can compute it; a peer that copies
/// another rank's tag still fails for its own rank, and a tag of one world is
/// worthless in the next.
pub(crate) fn process_tag(world_id: &[u8], rank: usize) -> std::io::Result<[u8; PROOF_LEN]> {
    let mut m = keyed(process_secret()?);
    m.update(PROCESS_LABEL);
    m.update(world_id);
    m.update(&(rank as u64).to_be_bytes());
    Ok(m.finalize().into_bytes().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_matches_rfc4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        let hex: String = m.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn pbkdf2_matches_rfc7914_vectors() {
        // RFC 7914 section 11 (PBKDF2-HMAC-SHA256), first 32 bytes.
        assert_eq!(
            hex(&pbkdf2_sha256(b"passwd", b"salt", 1)),
            "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc"
        );
        assert_eq!(
            hex(&pbkdf2_sha256(b"Password", b"NaCl", 80000)),
            "4ddcd8f60b98be21830cee5ef22701f9641a4418d04c0414aeff08876b34ab56"
        );
        let k = stretch(b"5f0c2e9a7b3d41e8");
        assert_eq!(k, pbkdf2_sha256(b"5f0c2e9a7b3d41e8", STRETCH_SALT, STRETCH_ROUNDS));
        assert_ne!(k, stretch(b"5f0c2e9a7b3d41e9"));
    }

    #[test]
    fn proofs_bind_token_label_and_nonces() {
        let (a, b) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(a, b, "two nonces from /dev/urandom collided");
        let p = prove(b"tok", PEER_LABEL, &a, &b);
        assert!(verify(b"tok", PEER_LABEL, &a, &b, &p));
        assert!(!verify(b"tok2", PEER_LABEL, &a, &b, &p));
        assert!(!verify(b"tok", ROOT_LABEL, &a, &b, &p));
        assert!(!verify(b"tok", PEER_LABEL, &b, &a, &p));
        assert!(!verify(b"tok", PEER_LABEL, &a, &b, &p[..31]));
    }

    #[test]
    fn session_keys_pair_up_and_bind_token_nonces_and_sequence() {
        let (n0, n1) = (nonce().unwrap(), nonce().unwrap());
        let (root_send, root_recv) = session_keys(b"token-0123456789", &n0, &n1, Side::Root);
        let (peer_send, peer_recv) = session_keys(b"token-0123456789", &n0, &n1, Side::Peer);
        let t = root_send.tag(0, b"head", b"body");
        assert!(peer_recv.check(0, b"head", b"body", &t));
        assert!(!peer_recv.check(1, b"head", b"body", &t), "a replayed frame must fail");
        assert!(!peer_recv.check(0, b"head", b"bodz", &t), "an altered body must fail");
        assert!(!peer_recv.check(0, b"heae", b"body", &t), "an altered header must fail");
        assert!(!root_recv.check(0, b"head", b"body", &t), "a frame reflected back must fail");
        assert!(root_recv.check(5, b"h", b"b", &peer_send.tag(5, b"h", b"b")));
        let (other, _) = session_keys(b"token-0123456789", &n1, &n0, Side::Root);
        assert!(!peer_recv.check(0, b"head", b"body", &other.tag(0, b"head", b"body")));
        let (wrong, _) = session_keys(b"token-9876543210", &n0, &n1, Side::Root);
        assert!(!peer_recv.check(0, b"head", b"body", &wrong.tag(0, b"head", b"body")));
    }

    #[test]
    fn process_tags_bind_world_and_rank() {
        let a = process_tag(b"world-a", 1).unwrap();
        assert_eq!(a, process_tag(b"world-a", 1).unwrap());
        assert_ne!(a, process_tag(b"world-a", 2).unwrap());
        assert_ne!(a, process_tag(b"world-b", 1).unwrap());
    }
}
