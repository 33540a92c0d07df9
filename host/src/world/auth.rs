//! Token proof: HMAC-SHA256 challenge-response. The token never travels.
//!
//! Rank 0 sends a fresh nonce `n0`; the peer answers with its own nonce `n1`
//! and `HMAC(token, "…peer" | n0 | n1)`; rank 0 checks it and answers with
//! `HMAC(token, "…root" | n1 | n0)`, which the peer checks. The labels keep a
//! proof of one direction from being replayed as the other; fresh nonces on
//! both sides keep a recorded proof from being replayed later.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::Read;

/// Bytes in a nonce.
pub(crate) const NONCE_LEN: usize = 16;
/// Bytes in a proof (one SHA-256 output).
pub(crate) const PROOF_LEN: usize = 32;

pub(crate) const PEER_LABEL: &[u8] = b"doorbell-rendezvous-v1 peer";
pub(crate) const ROOT_LABEL: &[u8] = b"doorbell-rendezvous-v1 root";

pub(crate) type Nonce = [u8; NONCE_LEN];

/// A fresh nonce from the kernel's CSPRNG.
pub(crate) fn nonce() -> std::io::Result<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut n)?;
    Ok(n)
}

fn mac(token: &[u8], label: &[u8], first: &Nonce, second: &Nonce) -> Hmac<Sha256> {
    // HMAC takes keys of any length (long ones are hashed first).
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token).expect("HMAC accepts keys of any length");
    m.update(label);
    m.update(first);
    m.update(second);
    m
}

/// The proof of knowing `token` for this pair of nonces.
pub(crate) fn prove(token: &[u8], label: &[u8], first: &Nonce, second: &Nonce) -> [u8; PROOF_LEN] {
    mac(token, label, first, second).finalize().into_bytes().into()
}

/// Checks a proof in constant time.
pub(crate) fn verify(token: &[u8], label: &[u8], first: &Nonce, second: &Nonce, proof: &[u8]) -> bool {
    mac(token, label, first, second).verify_slice(proof).is_ok()
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
}
