//! Why an exchange step failed: the device's status words, decoded.

use doorbell_kernels::coll::embedding::{
    EmbShape, STATUS_BAD_ID, STATUS_BAD_REQUEST, STATUS_CAPACITY, STATUS_NO_FORWARD, STATUS_NO_PEER_PTR, STATUS_PEER_TIMEOUT,
    STATUS_TIMEOUT,
};

use super::GRID_BARRIER_PHASES;
use crate::error::Error;

/// Why a fused exchange step failed, as
/// [`super::EmbeddingExchange::finish`] reports it.
/// Every variant but `Device` and `Timeout` means that nothing was written
/// on any rank (no output, no table) and that the next step can run.
#[derive(Debug)]
#[non_exhaustive]
pub enum EmbeddingError {
    /// A lookup id is not a row of its table (and not the padding id).
    BadId {
        /// The rank whose lookups held it.
        rank: u32,
        /// The lookup's table.
        table: u32,
        /// The lookup's sample.
        sample: u32,
        /// The lookup's position in its bag.
        position: u32,
        /// The id.
        id: u32,
        /// The rows every table has.
        rows: u32,
    },
    /// A (requester, owner) request list outgrew the capacity the exchange
    /// was built with.
    Capacity {
        /// The requester.
        rank: u32,
        /// The owner whose list outgrew it.
        owner: u32,
        /// Keys the list needed (at least).
        needed: u32,
        /// The capacity.
        cap: u32,
    },
    /// Another rank failed this step (`cause`, as that rank reported it);
    /// this rank learnt it from that rank's verdict.
    PeerFailed {
        /// This rank.
        rank: u32,
        /// The rank that failed.
        failed: u32,
        /// Its error, as it reported it.
        cause: Box<EmbeddingError>,
    },
    /// A backward after a forward that failed (no rank ran it).
    NoForward {
        /// This rank.
        rank: u32,
    },
    /// Another rank gave up on this step (its own wait ran out of budget:
    /// that rank reports the timeout); no rank pooled anything.
    PeerTimedOut {
        /// This rank.
        rank: u32,
        /// The rank that gave up.
        peer: u32,
    },
    /// An owner received a key that is not its own (a routing bug).
    BadRequest {
        /// This rank (the owner).
        rank: u32,
        /// The rank that asked.
        requester: u32,
        /// The key's table.
        table: u32,
        /// The key's id.
        id: u32,
    },
    /// The pull forward found no direct access to a peer's memory.
    NoPeerPointer {
        /// This rank.
        rank: u32,
        /// The peer out of direct reach.
        peer: u32,
    },
    /// A wait or grid barrier ran out of its budget (`phase`: where; the
    /// grid barriers are [`GRID_BARRIER_PHASES`]).
    Timeout {
        /// This rank.
        rank: u32,
        /// Where the kernel stopped.
        phase: u32,
    },
    /// A transport call was refused (`detail`: which call and peer).
    Transport {
        /// This rank.
        rank: u32,
        /// The status code.
        code: u32,
        /// Which call and which peer.
        detail: [u32; 2],
    },
    /// The communicator or the device failed (a timed-out transport wait, a
    /// driver error).
    Device(Error),
}

impl EmbeddingError {
    /// Decodes the status words `st` (`[code, details...]`) of `rank`.
    pub(super) fn from_status(rank: u32, st: &[u32], shape: &EmbShape) -> EmbeddingError {
        let w = |i: usize| st.get(i).copied().unwrap_or(0);
        match w(0) {
            STATUS_BAD_ID => EmbeddingError::BadId {
                rank,
                table: w(1),
                sample: w(2),
                position: w(3),
                id: w(4),
                rows: shape.rows,
            },
            STATUS_CAPACITY => EmbeddingError::Capacity {
                rank,
                owner: w(1),
                needed: w(2),
                cap: w(3),
            },
            STATUS_NO_FORWARD => EmbeddingError::NoForward { rank },
            STATUS_PEER_TIMEOUT => EmbeddingError::PeerTimedOut { rank, peer: w(1) },
            STATUS_BAD_REQUEST => EmbeddingError::BadRequest {
                rank,
                requester: w(1),
                table: w(2),
                id: w(3),
            },
            STATUS_NO_PEER_PTR => EmbeddingError::NoPeerPointer { rank, peer: w(1) },
            STATUS_TIMEOUT => EmbeddingError::Timeout { rank, phase: w(1) },
            code => EmbeddingError::Transport {
                rank,
                code,
                detail: [w(1), w(2)],
            },
        }
    }

    /// True when the step wrote nothing anywhere and the exchange can go on.
    pub fn nothing_written(&self) -> bool {
        match self {
            EmbeddingError::BadId { .. }
            | EmbeddingError::Capacity { .. }
            | EmbeddingError::NoForward { .. }
            | EmbeddingError::PeerTimedOut { .. } => true,
            EmbeddingError::PeerFailed { cause, .. } => cause.nothing_written(),
            _ => false,
        }
    }
}

impl std::fmt::Display for EmbeddingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmbeddingError::BadId {
                rank,
                table,
                sample,
                position,
                id,
                rows,
            } => write!(
                f,
                "rank {rank}: id {id} (table {table}, sample {sample}, position {position}) is out of range: tables have {rows} rows \
                 (0xFFFFFFFF is padding); nothing was written on any rank"
            ),
            EmbeddingError::Capacity { rank, owner, needed, cap } => write!(
                f,
                "rank {rank}: {needed} unique keys for rank {owner} exceed the list capacity {cap}; nothing was written on any rank \
                 (build the exchange with a capacity of at least the largest list, Traffic::max_pair)"
            ),
            EmbeddingError::PeerFailed { rank, failed, cause } => {
                write!(f, "rank {rank}: rank {failed} failed this step, so no rank wrote anything: {cause}")
            }
            EmbeddingError::NoForward { rank } => write!(
                f,
                "rank {rank}: the backward did not run because its forward failed; nothing was written on any rank"
            ),
            EmbeddingError::PeerTimedOut { rank, peer } => write!(
                f,
                "rank {rank}: rank {peer} stopped waiting in this step (its wait ran out of budget: it reports the timeout), so no rank \
                 pooled anything; nothing was written on any rank and the next step can run (if a rank can start this late, raise \
                 DOORBELL_WAIT_TIMEOUT_S)"
            ),
            EmbeddingError::BadRequest {
                rank,
                requester,
                table,
                id,
            } => write!(
                f,
                "rank {rank}: rank {requester} asked for table {table} id {id} that this rank does not own"
            ),
            EmbeddingError::NoPeerPointer { rank, peer } => write!(
                f,
                "rank {rank}: no direct access to rank {peer}'s memory (the pull forward needs it)"
            ),
            EmbeddingError::Timeout { rank, phase } if GRID_BARRIER_PHASES.contains(phase) => write!(
                f,
                "rank {rank}: a grid barrier of the exchange ran out of budget (phase {phase}): some blocks of the grid never started — every block must be resident at once; launch the grid the exchange fitted (EmbeddingExchange::launch_config, from launch_config_for)"
            ),
            EmbeddingError::Timeout { rank, phase } => {
                write!(f, "rank {rank}: a wait of the exchange ran out of budget (phase {phase})")
            }
            EmbeddingError::Transport { rank, code, detail } => write!(
                f,
                "rank {rank}: a transport call was refused (status {code}, detail {} {}); the communicator's report says which",
                detail[0], detail[1]
            ),
            EmbeddingError::Device(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for EmbeddingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EmbeddingError::Device(e) => Some(e),
            EmbeddingError::PeerFailed { cause, .. } => Some(cause.as_ref()),
            _ => None,
        }
    }
}

impl From<Error> for EmbeddingError {
    fn from(e: Error) -> Self {
        EmbeddingError::Device(e)
    }
}

impl From<EmbeddingError> for Error {
    /// The device error itself, or [`Error::Comm`] with the message.
    fn from(e: EmbeddingError) -> Self {
        match e {
            EmbeddingError::Device(e) => e,
            e => Error::Comm(e.to_string()),
        }
    }
}
