//! The engine's state: plain `#[repr(C)]` records in fixed-size tables (no
//! allocation; the same bytes can live in device memory for a GPU-resident
//! engine). The host wrapper owns them and fills the setup fields; the
//! engine owns the fields marked "engine".
//!
//! ## Who writes a port's tables
//! Every field of a [`Port`] has one writer: its host (the setup fields,
//! while no engine of its own runs them) or its own port's engine (the
//! fields marked "engine"). Another port's engine — a requester whose
//! responder QP lives here — writes exactly two things: the events of the
//! [`Inbox`] of the one QP connected to it, and that inbox's `head`. It
//! reads the rest (regions, QP states, receive queues, the inbox's
//! `QpEntry::inbox_tail`, CQ producer indices) and never stores into it.
//! Everything a responder's completion changes — its receive CQ's
//! producer index and CQEs, its receive-queue index, its QP state, its
//! counters and error log — the owner's engine changes when it drains the
//! inbox ([`super::poll`]). An inbox has one producer (the QP's connected
//! peer: only the requester that RC pairs with a QP reaches it) and one
//! consumer (the owner), so it needs no atomic read-modify-write: the
//! producer writes an event and publishes the head with a release store;
//! the owner reads the head relaxed, acquires before reading events, and
//! publishes how far it read (`inbox_tail`) with a release store; the
//! producer reads that tail only when its cached copy says the inbox is
//! full. The inbox's memory is written by the peer and read by the owner
//! only through [`super::mem`]'s volatile and atomic accesses.
//!
//! The inboxes are the first [`PEER_WRITABLE_BYTES`] of a [`Port`], whole
//! pages, so that memory protection can enforce this: a peer process
//! needs write access to those pages of another process's tables and to
//! nothing after them (its remote regions, the data path, aside).

mod fabric;
mod shards;
mod state;

pub use fabric::{PortTable, Ports, Window};
pub use state::{QpState, Reason};

use super::link::LinkModel;

/// Memory regions per port.
pub const MAX_MRS: usize = 256;
/// Completion queues per port.
pub const MAX_CQS: usize = 64;
/// Queue pairs per port.
pub const MAX_QPS: usize = 64;
/// WQEs a QP may have started but not completed (the engine stops fetching
/// from a QP when this many are in flight).
pub const MAX_INFLIGHT: usize = 16;
/// Error records kept per port (a ring; older ones are overwritten).
pub const ERROR_LOG: usize = 32;
/// Ports in one fabric.
pub const MAX_PORTS: usize = 64;
/// Most engine blocks (shards) that serve one port at once, each its own
/// QPs ([`Port::assign_shards`]).
pub const MAX_SHARDS: usize = 8;
/// Most blocks of one port's engine kernel: up to [`MAX_SHARDS`] of them
/// serve QPs, the others serve none and copy chunks of the serving
/// blocks' large copies (the engine's shared copies).
pub const MAX_ENGINE_BLOCKS: usize = 32;
/// Responder events one QP's [`Inbox`] holds (as many as a requester has
/// WQEs in flight).
pub const INBOX: usize = MAX_INFLIGHT;

/// [`InboxEvent::kind`]: a receive WQE was consumed by a SEND or an RDMA
/// WRITE with immediate; its CQE is `opcode` (`RESP_SEND`, `RESP_WR_IMM`).
pub const EVENT_RECEIVE: u8 = 1;
/// [`InboxEvent::kind`]: a remote access or invalid-request error: the QP
/// moves to the error state (IB responder class C) and logs it.
pub const EVENT_ERROR: u8 = 2;
/// [`InboxEvent::kind`]: as [`EVENT_ERROR`], and the receive WQE being
/// consumed completes with a `RESP_ERR` CQE of `syndrome`.
pub const EVENT_ERROR_RECEIVE: u8 = 3;
/// [`InboxEvent::flags`]: the sender asked for a solicited event.
pub const EVENT_SOLICITED: u16 = 1;

/// What a requester's engine tells a responder QP's owner (see the module
/// docs): 32 bytes, two 16-byte stores.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxEvent {
    /// [`EVENT_RECEIVE`], [`EVENT_ERROR`] or [`EVENT_ERROR_RECEIVE`].
    pub kind: u8,
    /// The CQE opcode (a receive) or the WQE opcode (an error).
    pub opcode: u8,
    /// `MLX5_CQE_SYNDROME_*` (errors).
    pub syndrome: u8,
    /// [`Reason`] as `u8` (errors).
    pub reason: u8,
    /// The receive WQE's counter (mod 2^16).
    pub rq_idx: u16,
    /// [`EVENT_SOLICITED`].
    pub flags: u16,
    /// Bytes received.
    pub byte_cnt: u32,
    /// The immediate (a receive) or the key involved (an error).
    pub imm_or_key: u32,
    /// The address involved (an error).
    pub addr: u64,
    /// The requester's clock when it happened, ns.
    pub time_ns: u64,
}

const _: () = assert!(core::mem::size_of::<InboxEvent>() == 32);

impl InboxEvent {
    /// The event as the eight words [`super::mem::store_event`] writes.
    #[inline(always)]
    pub fn to_words(&self) -> [u32; 8] {
        [
            u32::from_le_bytes([self.kind, self.opcode, self.syndrome, self.reason]),
            self.rq_idx as u32 | (self.flags as u32) << 16,
            self.byte_cnt,
            self.imm_or_key,
            self.addr as u32,
            (self.addr >> 32) as u32,
            self.time_ns as u32,
            (self.time_ns >> 32) as u32,
        ]
    }

    /// The event from the eight words [`super::mem::load_event`] read.
    #[inline(always)]
    pub fn from_words(w: &[u32; 8]) -> InboxEvent {
        let [kind, opcode, syndrome, reason] = w[0].to_le_bytes();
        InboxEvent {
            kind,
            opcode,
            syndrome,
            reason,
            rq_idx: w[1] as u16,
            flags: (w[1] >> 16) as u16,
            byte_cnt: w[2],
            imm_or_key: w[3],
            addr: w[4] as u64 | (w[5] as u64) << 32,
            time_ns: w[6] as u64 | (w[7] as u64) << 32,
        }
    }
}

/// The responder events of one QP, written by its connected peer's engine
/// (the only thing another port's engine writes in this port's tables)
/// and drained by the owner's engine.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inbox {
    /// Peer: events written (wrapping); published with release after them.
    pub head: u32,
    /// Zero.
    pub reserved: [u32; 3],
    /// Peer: event `i` at `events[i % INBOX]`.
    pub events: [InboxEvent; INBOX],
}

impl Inbox {
    /// An empty inbox.
    pub const EMPTY: Inbox = Inbox {
        head: 0,
        reserved: [0; 3],
        events: [InboxEvent {
            kind: 0,
            opcode: 0,
            syndrome: 0,
            reason: 0,
            rq_idx: 0,
            flags: 0,
            byte_cnt: 0,
            imm_or_key: 0,
            addr: 0,
            time_ns: 0,
        }; INBOX],
    };
}

/// Access rights of a memory region or a QP (the values of verbs'
/// `IBV_ACCESS_*`). Local read is always allowed.
pub mod access {
    /// `IBV_ACCESS_LOCAL_WRITE`: the NIC may write the region for this
    /// port's own WQEs (RDMA read destination, atomic result, receive buffer).
    pub const LOCAL_WRITE: u32 = 1;
    /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA-write it.
    pub const REMOTE_WRITE: u32 = 2;
    /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA-read it.
    pub const REMOTE_READ: u32 = 4;
    /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics on it.
    pub const REMOTE_ATOMIC: u32 = 8;
    /// Every flag above.
    pub const ALL: u32 = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC;
}

/// `MLX5_INVALID_LKEY`: the lkey that ends a receive WQE's scatter list
/// when it has fewer entries than the RQ's stride holds (libmlx5 writes it).
pub const INVALID_LKEY: u32 = 0x100;

/// One registered memory region.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrEntry {
    /// First byte (an address in the engine's address space).
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// lkey = rkey (as on mlx5 for ordinary regions): `(slot + 1) << 8 | tag`.
    pub key: u32,
    /// [`access`] flags.
    pub access: u32,
    /// Protection domain number.
    pub pd: u32,
    /// 1 while registered.
    pub valid: u32,
}

impl MrEntry {
    /// An unused slot.
    pub const EMPTY: MrEntry = MrEntry {
        addr: 0,
        len: 0,
        key: 0,
        access: 0,
        pd: 0,
        valid: 0,
    };
}

/// The table slot a key names (keys are `(slot + 1) << 8 | tag`).
#[inline(always)]
pub const fn key_slot(key: u32) -> Option<usize> {
    let s = key >> 8;
    if s == 0 || s as usize > MAX_MRS {
        None
    } else {
        Some(s as usize - 1)
    }
}

/// The key of `slot` with generation `tag` (1..=255, so no key is 0 or
/// [`INVALID_LKEY`]).
#[inline(always)]
pub const fn make_key(slot: usize, tag: u8) -> u32 {
    let tag = if tag == 0 { 1 } else { tag };
    ((slot as u32 + 1) << 8) | tag as u32
}

/// One completion queue: a ring of 64-byte CQEs in caller-owned memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqEntry {
    /// The ring: `entries` CQEs of 64 bytes, 64-byte aligned.
    pub ring: *mut u8,
    /// The consumer's doorbell record (`dbrec[MLX5_CQ_SET_CI]`, BE32 of the
    /// consumer index mod 2^24); null: the engine does not check for room.
    pub dbrec: *const u32,
    /// Entries, a power of two.
    pub entries: u32,
    /// CQ number.
    pub cqn: u32,
    /// 1 while created.
    pub valid: u32,
    /// Armed for an event: 0 no, 1 any completion, 2 solicited (and error)
    /// completions only. Cleared when the event fires.
    pub armed: u32,
    /// Engine: CQEs written (wrapping).
    pub pi: u32,
    /// Engine: completion events fired.
    pub events: u32,
    /// Engine: the consumer index it read from `dbrec` last, at the width
    /// of `pi` (`pi` then, less the CQEs it left unconsumed). It only
    /// grows, so a stale one under-reports room: the owner port's engine
    /// reads the record again only when this one says "full".
    pub ci_seen: u32,
    /// Zero.
    pub reserved: u32,
}

impl CqEntry {
    /// An unused slot.
    pub const EMPTY: CqEntry = CqEntry {
        ring: core::ptr::null_mut(),
        dbrec: core::ptr::null(),
        entries: 0,
        cqn: 0,
        valid: 0,
        armed: 0,
        pi: 0,
        events: 0,
        ci_seen: 0,
        reserved: 0,
    };
}

/// A WQE the engine started (timed by the link model) and has not
/// completed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Inflight {
    /// SQ counter (in basic blocks) of its first basic block.
    pub wqe_idx: u32,
    /// Basic blocks it spans.
    pub bbs: u16,
    /// Flags: [`ADMITTED`] once its execution was counted (and the
    /// injected-error fault drawn for it): a retry after the responder or
    /// a CQ had no room counts it, and draws, again never;
    /// [`WAITS_OWN_CQ`] while `deadline_ns` is its wait for room in its
    /// own send CQ.
    pub admitted: u16,
    /// Modelled arrival / completion time, picoseconds.
    pub due_ps: u64,
    /// While it waits on the responder (RNR, stalled or absent peer) or
    /// for room in its own send CQ: when it gives up, nanoseconds; 0 when
    /// not waiting.
    pub deadline_ns: u64,
}

/// [`Inflight::admitted`] flag: its execution was counted.
pub const ADMITTED: u16 = 1;
/// [`Inflight::admitted`] flag: its deadline was set by its wait for room
/// in its QP's own send CQ (a wait on the responder then starts a deadline
/// of its own; one begun before the CQ filled keeps its deadline).
pub const WAITS_OWN_CQ: u16 = 2;

/// QP flag: the slot is in use.
pub const QP_IN_USE: u32 = 1;
/// QP flag: connected to a peer (set at RTR).
pub const QP_CONNECTED: u32 = 2;

/// One RC queue pair: its rings in caller-owned memory and the engine's
/// progress through them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QpEntry {
    /// SQ ring: `sq_wqebbs` basic blocks of 64 bytes, 64-byte aligned.
    pub sq: *mut u8,
    /// RQ ring: `rq_wqes` receive WQEs of `rq_max_sge × 16` bytes; null when
    /// the QP has no receive queue.
    pub rq: *mut u8,
    /// Doorbell record pair: `[0]` = BE32 receive counter
    /// (`MLX5_RCV_DBR`), `[1]` = BE32 send counter (`MLX5_SND_DBR`).
    pub dbrec: *mut u32,
    /// UAR doorbell word (the 8-byte store of `ring_doorbell`); null: the
    /// engine watches the doorbell record itself.
    pub uar: *const u64,
    /// QP number (24 bits).
    pub qpn: u32,
    /// [`QpState`] as `u32`.
    pub state: u32,
    /// Protection domain number.
    pub pd: u32,
    /// Send CQ (slot in this port's CQ table).
    pub send_cq: u32,
    /// Receive CQ (slot).
    pub recv_cq: u32,
    /// SQ size in basic blocks, a power of two.
    pub sq_wqebbs: u32,
    /// RQ size in WQEs, a power of two (0: no RQ).
    pub rq_wqes: u32,
    /// Scatter entries per receive WQE, a power of two.
    pub rq_max_sge: u32,
    /// Remote access the QP grants as a responder ([`access`] remote flags,
    /// set at INIT).
    pub access: u32,
    /// Peer port (index in the fabric), valid with [`QP_CONNECTED`].
    pub peer_port: u32,
    /// Peer QP slot on that port.
    pub peer_qp: u32,
    /// [`QP_IN_USE`] | [`QP_CONNECTED`].
    pub flags: u32,
    /// Engine: SQ consumer counter, in basic blocks (wrapping).
    pub sq_ci: u32,
    /// Engine: the send counter last read from the doorbell record (16 bits).
    pub sq_pi: u32,
    /// Engine: RQ consumer counter (wrapping): receive WQEs completed
    /// (drained from the inbox) or flushed.
    pub rq_ci: u32,
    /// Engine: 1 while a doorbell was seen and not acted on yet.
    pub db_pending: u32,
    /// Engine: last UAR value seen (or last doorbell-record value, without
    /// a UAR).
    pub last_doorbell: u64,
    /// Engine: when the pending doorbell is acted on (delay fault), ns.
    pub db_due_ns: u64,
    /// Engine: when the doorbell record was last read, ns.
    pub last_dbr_read_ns: u64,
    /// Engine: doorbells seen (for the drop fault).
    pub doorbells: u64,
    /// Engine: completion time of the latest RDMA read / atomic, ps (a
    /// fenced WQE starts no earlier).
    pub rd_atomic_due_ps: u64,
    /// Engine: polls in a row this QP's completions were held back
    /// (reorder fault).
    pub held: u32,
    /// Engine: head of the in-flight ring.
    pub inflight_head: u32,
    /// Engine: entries in the in-flight ring.
    pub inflight_len: u32,
    /// The engine block that serves this QP and whose counters
    /// ([`Port::stats`]) it adds to: set by [`Port::assign_shards`] before
    /// a GPU-resident engine of several blocks takes the port; 0 otherwise.
    pub shard: u32,
    /// Engine (as the responder): events of this QP's [`Inbox`] drained
    /// (wrapping); published with release, read by the peer.
    pub inbox_tail: u32,
    /// Engine (as the requester): events written into the peer QP's inbox
    /// (wrapping).
    pub out_head: u32,
    /// Engine (as the requester): the peer's `inbox_tail` as last read.
    pub out_tail_seen: u32,
    /// Engine (as the requester): the peer's receive WQEs this QP consumed
    /// (wrapping): the next SEND or WRITE with immediate takes receive WQE
    /// `peer_rq_ci`.
    pub peer_rq_ci: u32,
    /// Engine: WQEs started and not completed, oldest first.
    pub inflight: [Inflight; MAX_INFLIGHT],
}

impl QpEntry {
    /// An unused slot.
    pub const EMPTY: QpEntry = QpEntry {
        sq: core::ptr::null_mut(),
        rq: core::ptr::null_mut(),
        dbrec: core::ptr::null_mut(),
        uar: core::ptr::null(),
        qpn: 0,
        state: QpState::Reset as u32,
        pd: 0,
        send_cq: 0,
        recv_cq: 0,
        sq_wqebbs: 0,
        rq_wqes: 0,
        rq_max_sge: 0,
        access: 0,
        peer_port: 0,
        peer_qp: 0,
        flags: 0,
        sq_ci: 0,
        sq_pi: 0,
        rq_ci: 0,
        db_pending: 0,
        last_doorbell: 0,
        db_due_ns: 0,
        last_dbr_read_ns: 0,
        doorbells: 0,
        rd_atomic_due_ps: 0,
        held: 0,
        inflight_head: 0,
        inflight_len: 0,
        shard: 0,
        inbox_tail: 0,
        out_head: 0,
        out_tail_seen: 0,
        peer_rq_ci: 0,
        inflight: [Inflight {
            wqe_idx: 0,
            bbs: 0,
            admitted: 0,
            due_ps: 0,
            deadline_ns: 0,
        }; MAX_INFLIGHT],
    };

    /// The QP's state.
    #[inline(always)]
    pub const fn state(&self) -> QpState {
        QpState::from_u32(self.state)
    }

    /// Whether the slot holds a QP.
    #[inline(always)]
    pub const fn in_use(&self) -> bool {
        self.flags & QP_IN_USE != 0
    }

    /// The oldest in-flight WQE.
    #[inline(always)]
    pub fn inflight_front(&self) -> Option<&Inflight> {
        if self.inflight_len == 0 {
            None
        } else {
            self.inflight.get(self.inflight_head as usize % MAX_INFLIGHT)
        }
    }

    /// Mutable [`Self::inflight_front`].
    #[inline(always)]
    pub fn inflight_front_mut(&mut self) -> Option<&mut Inflight> {
        if self.inflight_len == 0 {
            None
        } else {
            self.inflight.get_mut(self.inflight_head as usize % MAX_INFLIGHT)
        }
    }

    /// Drops the oldest in-flight WQE.
    #[inline(always)]
    pub fn inflight_pop(&mut self) {
        if self.inflight_len > 0 {
            self.inflight_head = (self.inflight_head + 1) % MAX_INFLIGHT as u32;
            self.inflight_len -= 1;
        }
    }

    /// Appends an in-flight WQE; false when the ring is full.
    #[inline(always)]
    pub fn inflight_push(&mut self, w: Inflight) -> bool {
        if self.inflight_len as usize >= MAX_INFLIGHT {
            return false;
        }
        let i = (self.inflight_head + self.inflight_len) as usize % MAX_INFLIGHT;
        if let Some(slot) = self.inflight.get_mut(i) {
            *slot = w;
            self.inflight_len += 1;
            true
        } else {
            false
        }
    }

    /// Resets the engine's progress (RESET state).
    pub fn reset_progress(&mut self) {
        self.sq_ci = 0;
        self.sq_pi = 0;
        self.rq_ci = 0;
        self.db_pending = 0;
        self.last_doorbell = 0;
        self.db_due_ns = 0;
        self.doorbells = 0;
        self.rd_atomic_due_ps = 0;
        self.held = 0;
        self.inflight_head = 0;
        self.inflight_len = 0;
        self.inbox_tail = 0;
        self.out_head = 0;
        self.out_tail_seen = 0;
        self.peer_rq_ci = 0;
    }
}

/// One entry of a port's error log: a failed WQE or an asynchronous error.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ErrorRecord {
    /// Engine time, ns.
    pub time_ns: u64,
    /// The address involved (0 if none).
    pub addr: u64,
    /// The key involved (0 if none).
    pub key: u32,
    /// QP number.
    pub qpn: u32,
    /// `wqe_counter` of the WQE (or receive WQE).
    pub wqe_counter: u16,
    /// WQE opcode.
    pub opcode: u8,
    /// `MLX5_CQE_SYNDROME_*` reported.
    pub syndrome: u8,
    /// [`Reason`] as `u8`.
    pub reason: u8,
    /// 1: this port was the responder (a receive-side error).
    pub responder: u8,
    /// Zero.
    pub reserved: [u8; 2],
}

/// Counters of one port.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PortStats {
    /// WQEs executed successfully.
    pub wqes: u64,
    /// Payload bytes moved by this port's WQEs.
    pub bytes: u64,
    /// CQEs written to this port's CQs.
    pub cqes: u64,
    /// Error CQEs (not counting flushes).
    pub errors: u64,
    /// Flush CQEs.
    pub flushes: u64,
    /// Doorbells seen.
    pub doorbells: u64,
    /// Doorbells dropped by fault injection.
    pub doorbells_dropped: u64,
    /// Doorbell-record reads made by the timeout (not by a doorbell).
    pub dbr_rereads: u64,
    /// WQEs the engine began to execute (the forced-error fault counts these).
    pub executed: u64,
    /// WQEs fetched from send queues (started; executed once due).
    pub fetched: u64,
    /// The UAR word last read that differed from the QP's previous one
    /// (the first 8 bytes of the last ctrl segment rung); 0: none yet.
    pub last_uar: u64,
    /// The last new send counter read from a doorbell record (16 bits; a
    /// value that advanced some QP's producer counter).
    pub last_sq_pi: u32,
    /// The QP number of the QP whose doorbell or WQE was handled last.
    pub last_qpn: u32,
    /// The SQ counter (basic blocks) of the WQE fetched last.
    pub last_wqe: u32,
    /// Zero.
    pub reserved: u32,
}

/// The page size the peer-writable part of a [`Port`] is rounded to.
pub const PAGE: usize = 4096;
/// Bytes of the inboxes of a port's QPs.
const INBOX_TABLE: usize = MAX_QPS * core::mem::size_of::<Inbox>();
/// Zeros after the inboxes, up to a page boundary.
const INBOX_PAD: usize = INBOX_TABLE.next_multiple_of(PAGE) - INBOX_TABLE;
/// The bytes at the start of a [`Port`] that another port's engine may
/// write: its QPs' [`Inbox`]es, a whole number of pages. Everything past
/// them only the port's own engine and host write. A process that maps a
/// port's tables for its peers (a port of another process, whose tables
/// lie in its symmetric heap) can map these pages read-write and the rest
/// read-only, when the tables start on a page boundary.
pub const PEER_WRITABLE_BYTES: usize = INBOX_TABLE + INBOX_PAD;

/// One soft NIC port: its tables, link state and log.
#[repr(C)]
#[derive(Clone)]
pub struct Port {
    /// Each QP's responder events, written by its connected peer's engine
    /// (see the module docs): the first [`PEER_WRITABLE_BYTES`] bytes.
    pub inbox: [Inbox; MAX_QPS],
    /// Zero (the inboxes end on a page boundary).
    pub inbox_pad: [u8; INBOX_PAD],
    /// Memory regions.
    pub mrs: [MrEntry; MAX_MRS],
    /// Completion queues.
    pub cqs: [CqEntry; MAX_CQS],
    /// Queue pairs.
    pub qps: [QpEntry; MAX_QPS],
    /// Link model (disabled: every WQE completes when executed).
    pub link: LinkModel,
    /// When the port's transmitter is free again, ps: shared by the port's
    /// engine blocks, changed only through [`super::mem::reserve_wire`].
    pub tx_free_ps: u64,
    /// The port's LID (its address in the fabric).
    pub lid: u32,
    /// 1 while in use.
    pub valid: u32,
    /// Error log (a ring of [`ERROR_LOG`] entries).
    pub errors: [ErrorRecord; ERROR_LOG],
    /// Error records written (wrapping).
    pub errors_written: u32,
    /// 0, or 1 + the slot in [`Self::mrs`] of the region holding its rank's
    /// symmetric heap: the heap header's trace word
    /// (`doorbell_kernels::trace::TRACE_OFFSET`) says where the device
    /// trace's rings are (0: not tracing), and the engine's trace events
    /// go there ([`crate::engine::trace`]).
    pub trace_mr: u32,
    /// Counters, one set per engine block ([`QpEntry::shard`]: each block
    /// writes its own); [`Port::total_stats`] adds them up.
    pub stats: [PortStats; MAX_SHARDS],
}

const _: () = assert!(core::mem::offset_of!(Port, mrs) == PEER_WRITABLE_BYTES && PEER_WRITABLE_BYTES.is_multiple_of(PAGE));

impl Port {
    /// An empty port with LID `lid`.
    pub const fn new(lid: u32, link: LinkModel) -> Port {
        Port {
            inbox: [Inbox::EMPTY; MAX_QPS],
            inbox_pad: [0; INBOX_PAD],
            mrs: [MrEntry::EMPTY; MAX_MRS],
            cqs: [CqEntry::EMPTY; MAX_CQS],
            qps: [QpEntry::EMPTY; MAX_QPS],
            link,
            tx_free_ps: 0,
            lid,
            valid: 1,
            errors: [ErrorRecord {
                time_ns: 0,
                addr: 0,
                key: 0,
                qpn: 0,
                wqe_counter: 0,
                opcode: 0,
                syndrome: 0,
                reason: 0,
                responder: 0,
                reserved: [0; 2],
            }; ERROR_LOG],
            errors_written: 0,
            trace_mr: 0,
            stats: [PortStats::ZERO; MAX_SHARDS],
        }
    }

    /// Appends to the error log (the owner's engine and, while no engine
    /// runs the port, its host). The slot is claimed with an atomic add on
    /// `errors_written` (at `sys` scope: error paths are rare), so the
    /// host reading the log concurrently sees each record's slot claimed
    /// once.
    pub fn log_error(&mut self, r: ErrorRecord) {
        // SAFETY: a field of this live port, 4-byte aligned.
        let n = unsafe { super::mem::claim_u32(&raw mut self.errors_written) };
        if let Some(slot) = self.errors.get_mut(n as usize % ERROR_LOG) {
            *slot = r;
        }
    }

    /// Checks `[addr, addr + len)` against the region of `key`: registered,
    /// same protection domain, inside, with every flag of `need`. Returns the
    /// pointer to `addr`. A zero-length range is not checked (verbs do not
    /// validate keys of zero-length transfers).
    pub fn check_mr(&self, key: u32, pd: u32, addr: u64, len: u64, need: u32) -> Result<*mut u8, Reason> {
        if len == 0 {
            return Ok(addr as usize as *mut u8);
        }
        match self.mr_of(key) {
            Some(mr) => mr.admits(key, pd, addr, len, need),
            None => Err(Reason::BadKey),
        }
    }

    /// The entry of the slot `key` names (not checked: see
    /// [`MrEntry::admits`]).
    #[inline(always)]
    pub fn mr_of(&self, key: u32) -> Option<&MrEntry> {
        key_slot(key).and_then(|s| self.mrs.get(s))
    }
}

impl MrEntry {
    /// [`Port::check_mr`]'s checks of a non-empty range on this entry (a
    /// copy of the slot `key` names): registered under `key`, same
    /// protection domain, inside, with every flag of `need`.
    #[inline(always)]
    pub fn admits(&self, key: u32, pd: u32, addr: u64, len: u64, need: u32) -> Result<*mut u8, Reason> {
        if self.valid == 0 || self.key != key {
            return Err(Reason::BadKey);
        }
        if self.pd != pd {
            return Err(Reason::PdMismatch);
        }
        let end = match addr.checked_add(len) {
            Some(e) => e,
            None => return Err(Reason::OutOfBounds),
        };
        if addr < self.addr || end > self.addr.wrapping_add(self.len) {
            return Err(Reason::OutOfBounds);
        }
        if self.access & need != need {
            return Err(Reason::AccessDenied);
        }
        Ok(addr as usize as *mut u8)
    }
}
