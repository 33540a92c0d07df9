//! What a QP is doing ([`QpState`], verbs' state machine) and why the
//! engine failed a WQE ([`Reason`], the soft NIC's own syndrome).

/// QP states (the values of verbs' `enum ibv_qp_state`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Fresh or reset: nothing is processed.
    Reset = 0,
    /// Receives may be posted; nothing is processed.
    Init = 1,
    /// Ready to receive: the QP answers its peer; its SQ is not processed.
    Rtr = 2,
    /// Ready to send: the SQ is processed on doorbells.
    Rts = 3,
    /// Error: every outstanding and newly posted WQE (send and receive)
    /// completes with `WR_FLUSH_ERR`.
    Err = 6,
}

impl QpState {
    /// The state with value `v` (an unknown value reads as `Err`).
    pub const fn from_u32(v: u32) -> QpState {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            _ => QpState::Err,
        }
    }

    /// Whether verbs allow `self → to` (`ibv_modify_qp`'s state machine for
    /// RC QPs, without SQD/SQE): RESET→INIT, INIT→INIT, INIT→RTR, RTR→RTS,
    /// RTS→RTS, any→ERR, any→RESET.
    pub const fn can_move_to(self, to: QpState) -> bool {
        matches!(
            (self, to),
            (_, QpState::Err)
                | (_, QpState::Reset)
                | (QpState::Reset, QpState::Init)
                | (QpState::Init, QpState::Init)
                | (QpState::Init, QpState::Rtr)
                | (QpState::Rtr, QpState::Rts)
                | (QpState::Rts, QpState::Rts)
        )
    }
}

/// Why the engine failed a WQE, in the soft NIC's own words. Written into
/// `vendor_err_synd` of the error CQE (real hardware puts its own vendor
/// codes there), and into the port's error log.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No reason recorded.
    None = 0,
    /// The key names no registered memory region (never registered, or
    /// deregistered).
    BadKey = 1,
    /// The region belongs to another protection domain than the QP.
    PdMismatch = 2,
    /// The address range is not inside the region.
    OutOfBounds = 3,
    /// The region (or the responder QP) does not grant the access.
    AccessDenied = 4,
    /// An atomic's remote address is not 8-byte aligned.
    Misaligned = 5,
    /// The ctrl segment's opcode is not one the soft NIC executes.
    BadOpcode = 6,
    /// The ctrl segment's `ds` does not fit the opcode or the ring.
    BadDs = 7,
    /// The ctrl segment's `wqe_index` is not the consumer index.
    WqeIndexMismatch = 8,
    /// The ctrl segment's QP number is not the QP's.
    QpnMismatch = 9,
    /// The peer QP is missing, not connected back to this QP, or not in
    /// RTR/RTS: no response until the transport timeout.
    PeerNotReady = 10,
    /// The peer's port is stalled (fault injection) past the transport
    /// timeout.
    PeerStalled = 11,
    /// No receive WQE was posted at the responder until the RNR timeout.
    NoReceiveWqe = 12,
    /// A fault injected on purpose (`FaultConfig::force_error_every`).
    Injected = 13,
    /// A message of 2^31 bytes or more, an atomic whose data segment is not
    /// 8 bytes, or a send longer than the receive buffers.
    Length = 14,
    /// A data segment with the inline flag (not executed by the soft NIC).
    InlineUnsupported = 15,
    /// The producer published more WQE basic blocks than the ring holds.
    SqOverrun = 16,
    /// The WQE was flushed because the QP is in the error state.
    Flushed = 17,
    /// The responder's memory is not mapped in the requester's process: a
    /// port of another process is reached only through its symmetric heap
    /// (its tables and remotely accessible regions), never its rings.
    Unmapped = 18,
    /// A WQE with more data segments than the engine copies
    /// ([`crate::engine::wqe::MAX_SGE`]), or a receive WQE with more scatter
    /// entries than it copies ([`crate::engine::rq::MAX_RECV_SGE`]).
    TooManySegments = 19,
    /// The responder's producer published more receive WQEs than its
    /// receive queue holds.
    RqOverrun = 20,
    /// The responder's receive CQ (or its engine's inbox) stayed full past
    /// the transport timeout.
    ResponderFull = 21,
    /// The QP's own send CQ stayed full past the transport timeout while a
    /// signaled WQE waited for room: its consumer stopped polling. No CQE can report it; the QP moves to the
    /// error state and its WQEs are flushed as the CQ gets room.
    CqOverrun = 22,
}

impl Reason {
    /// The reason for byte `v` (`None` for unknown values).
    pub const fn from_u8(v: u8) -> Reason {
        match v {
            1 => Reason::BadKey,
            2 => Reason::PdMismatch,
            3 => Reason::OutOfBounds,
            4 => Reason::AccessDenied,
            5 => Reason::Misaligned,
            6 => Reason::BadOpcode,
            7 => Reason::BadDs,
            8 => Reason::WqeIndexMismatch,
            9 => Reason::QpnMismatch,
            10 => Reason::PeerNotReady,
            11 => Reason::PeerStalled,
            12 => Reason::NoReceiveWqe,
            13 => Reason::Injected,
            14 => Reason::Length,
            15 => Reason::InlineUnsupported,
            16 => Reason::SqOverrun,
            17 => Reason::Flushed,
            18 => Reason::Unmapped,
            19 => Reason::TooManySegments,
            20 => Reason::RqOverrun,
            21 => Reason::ResponderFull,
            22 => Reason::CqOverrun,
            _ => Reason::None,
        }
    }

    /// What to check, in words.
    pub const fn description(self) -> &'static str {
        match self {
            Reason::None => "no reason recorded",
            Reason::BadKey => "the key names no registered memory region (never registered or deregistered)",
            Reason::PdMismatch => "the memory region belongs to another protection domain than the QP",
            Reason::OutOfBounds => "the address range is not inside the memory region",
            Reason::AccessDenied => "the memory region or the responder QP does not grant this access",
            Reason::Misaligned => "an atomic's remote address is not 8-byte aligned",
            Reason::BadOpcode => "the ctrl segment's opcode is not one the soft NIC executes",
            Reason::BadDs => "the ctrl segment's ds does not fit the opcode or the ring",
            Reason::WqeIndexMismatch => "the ctrl segment's wqe_index is not the SQ consumer index",
            Reason::QpnMismatch => "the ctrl segment's QP number is not this QP's",
            Reason::PeerNotReady => "the peer QP is missing, not connected back, or not in RTR/RTS",
            Reason::PeerStalled => "the peer port stopped answering (injected stall)",
            Reason::NoReceiveWqe => "the responder had no receive WQE posted",
            Reason::Injected => "an error injected by the fault configuration",
            Reason::Length => "a length error: 2^31 bytes or more, an atomic not of 8 bytes, or a send longer than the receive buffers",
            Reason::InlineUnsupported => "an inline data segment (the soft NIC does not execute inline data)",
            Reason::SqOverrun => "the producer published more WQE basic blocks than the send queue holds",
            Reason::Flushed => "flushed: the QP is in the error state",
            Reason::RqOverrun => "the responder's producer published more receive WQEs than its receive queue holds",
            Reason::ResponderFull => {
                "the responder's receive CQ (or its engine's inbox) stayed full past the transport timeout: nothing polls that CQ, \
                 or its engine stopped"
            }
            Reason::CqOverrun => {
                "the QP's own send CQ stayed full past the transport timeout (its consumer stopped polling): the CQ overran, \
                 the QP moved to the error state, and its WQEs are flushed as the CQ gets room"
            }
            Reason::TooManySegments => "more data segments in a WQE (or scatter entries in a receive WQE) than the soft NIC executes (16)",
            Reason::Unmapped => {
                "the responder lives in another process and this memory of it is not mapped here (only its symmetric heap is; \
                 SEND and WRITE with immediate, which consume its receive queue, do not cross processes)"
            }
        }
    }
}
