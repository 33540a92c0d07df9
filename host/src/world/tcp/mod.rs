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

mod rendezvous;
mod star;

pub(crate) use rendezvous::{hostname, join};
pub use rendezvous::{
    RendezvousHost, HANDSHAKE_TIMEOUT, MAX_PENDING_HANDSHAKES, MAX_PENDING_PER_ADDRESS, PROTOCOL_VERSION, QUICK_PROOF_TIMEOUT, QUICK_SLOTS,
};
pub(crate) use star::Star;
