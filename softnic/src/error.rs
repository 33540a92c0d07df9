//! The crate's error type (host side).

use crate::engine::{LinkParseError, QpState, LINK_FORMS};

/// What went wrong while setting up or driving the soft NIC. Each variant
/// says what to change.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `DOORBELL_SOFTNIC_LINK` (or a string given for it) did not parse.
    #[error("{variable}={value:?} is not a link description: {}; accepted: {LINK_FORMS}", reason.description())]
    LinkSyntax {
        /// The variable (or "link" for a string passed in code).
        variable: &'static str,
        /// What it held.
        value: String,
        /// What was wrong.
        reason: LinkParseError,
    },
    /// A per-port table is full.
    #[error("soft NIC port {lid}: all {max} {what} slots are in use; destroy unused ones (the limit is engine::tables::MAX_*)")]
    TableFull {
        /// Port LID.
        lid: u16,
        /// "memory region", "CQ", "QP".
        what: &'static str,
        /// The table size.
        max: usize,
    },
    /// A ring or doorbell record passed at creation is unusable.
    #[error("{what}: {why}")]
    BadRing {
        /// Which ring.
        what: &'static str,
        /// What is wrong and what is needed.
        why: String,
    },
    /// Access flags verbs would refuse.
    #[error("access flags {flags:#x}: {why}")]
    BadAccess {
        /// The flags given.
        flags: u32,
        /// What is wrong.
        why: &'static str,
    },
    /// A memory region that is empty or wraps the address space.
    #[error("memory region at {addr:#x} of {len} bytes: {why}")]
    BadRegion {
        /// Start.
        addr: u64,
        /// Length.
        len: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// A QP state change the verbs state machine does not allow.
    #[error("QP {qpn:#x}: cannot move from {from:?} to {to:?} (RC QPs go RESET → INIT → RTR → RTS; any state → ERR or RESET)")]
    BadTransition {
        /// QP number.
        qpn: u32,
        /// Its state.
        from: QpState,
        /// The state asked for.
        to: QpState,
    },
    /// The remote QP of a connection does not exist in this fabric.
    #[error("no QP {qpn:#x} on the port with LID {lid} in this fabric: create the remote QP before connecting to it, and exchange endpoints from the same fabric")]
    NoSuchRemote {
        /// Remote LID.
        lid: u16,
        /// Remote QP number.
        qpn: u32,
    },
    /// A port index that [`crate::SoftFabric::open_device_at`] cannot give.
    #[error("soft NIC port index {index}: {why}")]
    PortIndex {
        /// The index asked for.
        index: usize,
        /// Why not.
        why: String,
    },
    /// An object of another device or fabric was passed in.
    #[error("{what} belongs to another soft NIC device or fabric")]
    Foreign {
        /// Which object.
        what: &'static str,
    },
    /// The QP has no receive queue.
    #[error("QP {qpn:#x} has no receive queue: create it with rq_wqes > 0")]
    NoReceiveQueue {
        /// QP number.
        qpn: u32,
    },
    /// Every receive WQE is posted and not yet consumed.
    #[error("QP {qpn:#x}: all {size} receive WQEs are outstanding; wait for receive completions first")]
    ReceiveQueueFull {
        /// QP number.
        qpn: u32,
        /// RQ size.
        size: u32,
    },
    /// A receive WQE with more scatter entries than the RQ stride holds.
    #[error("QP {qpn:#x}: {given} scatter entries, the receive queue holds at most {max} per WQE")]
    TooManyScatterEntries {
        /// QP number.
        qpn: u32,
        /// Entries given.
        given: usize,
        /// `rq_max_sge`.
        max: u32,
    },
    /// The port's tables belong to an engine running elsewhere (a
    /// GPU-resident engine) and this change cannot be made to them.
    #[error("soft NIC port {lid}: {what} is not possible while its engine runs elsewhere (a GPU-resident engine owns the tables); stop that engine first")]
    Resident {
        /// Port LID.
        lid: u16,
        /// What was asked.
        what: &'static str,
    },
    /// Writing to a resident engine's tables failed.
    #[error("soft NIC port {lid}: could not update the resident engine's {what}: {why}")]
    ResidentWrite {
        /// Port LID.
        lid: u16,
        /// Which table.
        what: &'static str,
        /// What the owner reported.
        why: String,
    },
    /// Deregistering a memory region did not reach the engine that checks
    /// its key (a resident engine whose tables could not be written): the
    /// region is still registered there, and its memory must stay
    /// allocated.
    #[error(
        "soft NIC port {lid}: memory region with key {key:#x} at {addr:#x} ({len} bytes) is still registered with the engine: {why}; \
         keep its memory allocated, and deregister again once the engine's tables can be written (or after stopping the engine)"
    )]
    Deregistration {
        /// Port LID.
        lid: u16,
        /// The region's key.
        key: u32,
        /// Its first byte.
        addr: u64,
        /// Its length.
        len: usize,
        /// What the engine's owner reported.
        why: String,
    },
    /// A bounded wait on the engine ran out.
    #[error("gave up after {waited_ns} ns of {clock} time waiting for {what}")]
    Timeout {
        /// How long, ns.
        waited_ns: u64,
        /// "virtual" or "real".
        clock: &'static str,
        /// What was awaited.
        what: String,
    },
}

/// `Result<T, Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
