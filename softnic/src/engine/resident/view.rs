//! How a block's control thread sees the fabric ([`View`]: its own port
//! in a register, the others through the port table) and which of its QPs
//! an idle pass watches ([`Watch`]).

use super::super::mem;
use super::super::poll::doorbell_word;
use super::super::tables::{Port, PortTable, Ports, MAX_QPS};

/// Doorbell words an idle pass reads at once (QPs beyond these: every
/// pass is a full one).
const WATCHED: usize = 8;

/// The fabric as a thread of the engine sees it: its own port's address
/// held in a register, the other ports' read from the port table in device
/// memory when asked for (faster than a copy of the table in local memory:
/// a round trip of 52.7 – 53.1 against 57.0 – 62.5 µs on an H200).
pub(super) struct View {
    port: usize,
    own: *mut Port,
    table: *const PortTable,
}

impl View {
    /// The view of port `port` of `table`.
    ///
    /// # Safety
    /// `table` is a valid port table whose entries below its count point at
    /// live ports, and stays so while the view is used.
    pub(super) unsafe fn new(table: *const PortTable, port: usize) -> View {
        let mut v = View {
            port,
            own: core::ptr::null_mut(),
            table,
        };
        v.own = v.lookup(port);
        v
    }

    /// The engine's own port.
    #[inline(always)]
    pub(super) fn own(&self) -> Option<&Port> {
        // SAFETY: null or a live port (the constructor's contract).
        unsafe { self.own.as_ref() }
    }

    /// The engine's own port, to change its entries (as the tables'
    /// concurrency rules say).
    #[inline(always)]
    pub(super) fn own_mut(&mut self) -> Option<&mut Port> {
        // SAFETY: null or a live port (the constructor's contract).
        unsafe { self.own.as_mut() }
    }

    /// The port table (the constructor's contract keeps it valid).
    #[inline(always)]
    pub(super) fn table(&self) -> &PortTable {
        // SAFETY: the constructor's contract.
        unsafe { &*self.table }
    }

    /// Port `i`'s address from the table (null: no such port).
    #[inline(always)]
    fn lookup(&self, i: usize) -> *mut Port {
        self.table().port_ptr(i)
    }
}

impl Ports for View {
    #[inline(always)]
    fn get(&self, i: usize) -> Option<&Port> {
        let p = if i == self.port { self.own } else { self.lookup(i) };
        // SAFETY: null or a live port (the constructor's contract).
        unsafe { p.as_ref() }
    }
    #[inline(always)]
    fn get_mut(&mut self, i: usize) -> Option<&mut Port> {
        let p = if i == self.port { self.own } else { self.lookup(i) };
        // SAFETY: null or a live port (the constructor's contract), whose
        // fields an engine writes as the tables' concurrency rules say.
        unsafe { p.as_mut() }
    }
    #[inline(always)]
    fn reach(&self, i: usize, addr: u64, len: u64) -> Option<*mut u8> {
        if i == self.port {
            return Some(addr as usize as *mut u8);
        }
        self.table().reach(i, addr, len)
    }
    #[inline(always)]
    fn foreign(&self, i: usize) -> bool {
        i != self.port && self.table().foreign(i)
    }
}

/// The QP slots of the engine's port in use, and the first [`WATCHED`] of
/// them whose doorbell words an idle pass reads together.
///
/// An idle pass costs what its loads cost. A full pass
/// ([`poll_port_masked`]) walks every slot in use with dependent loads and
/// branches; when nothing was rung, nothing is due and the last pass did
/// nothing, the engine instead issues the doorbell-word loads of the
/// watched QPs and their inbox heads (responder events their peers wrote)
/// back to back (independent `ld.relaxed.sys`, one memory latency for
/// all) and compares them with what the tables last saw.
#[derive(Clone, Copy)]
pub(super) struct Watch {
    /// Bit `q`: slot `q` holds a QP.
    pub(super) mask: u64,
    /// Bit `b`: block `b` of the port serves a QP.
    pub(super) serving: u32,
    /// Watched slots, `n` of them.
    slots: [u8; WATCHED],
    n: usize,
    /// Every slot in use is watched.
    complete: bool,
}

impl Watch {
    pub(super) const EMPTY: Watch = Watch {
        mask: 0,
        serving: 0,
        slots: [0; WATCHED],
        n: 0,
        complete: true,
    };

    /// Lists the slots of the engine's own port in use that block `shard`
    /// serves, and which blocks serve any.
    pub(super) fn of(view: &View, shard: usize) -> Watch {
        let mut w = Watch::EMPTY;
        let Some(p) = view.own() else { return w };
        // Every slot's flags first, with no branch between the loads, so
        // they are in flight together (this runs right after a fence, when
        // each is a trip to L2, and a loop that branched on each waited for
        // each in turn); then the slots in use.
        for (q, qp) in p.qps.iter().enumerate() {
            w.mask |= ((qp.in_use() && qp.shard as usize == shard) as u64) << q;
            w.serving |= (qp.in_use() as u32) << (qp.shard % 32);
        }
        let mut left = w.mask;
        while left != 0 {
            let q = left.trailing_zeros() as usize;
            left &= left - 1;
            let qp = &p.qps[q % MAX_QPS];
            if w.n < WATCHED && !qp.dbrec.is_null() {
                w.slots[w.n] = q as u8;
                w.n += 1;
            } else {
                w.complete = false;
            }
        }
        w
    }

    /// The slots whose doorbell word or inbox head moved since their last
    /// pass (bit `q`: slot `q`), or every slot in use when not every slot
    /// is watched (only a pass over all of them can tell); no bit: none.
    /// When exactly one watched slot moved, and only its doorbell word,
    /// [`Rung::lone`] names it with the word read.
    ///
    /// # Safety
    /// The watched QPs' doorbell words are valid (the tables' contract).
    pub(super) unsafe fn rung(&self, view: &View) -> Rung {
        if !self.complete {
            return Rung {
                mask: self.mask,
                ..Rung::NONE
            };
        }
        let Some(p) = view.own() else { return Rung::NONE };
        let own = view.own;
        let mut seen = [0u64; WATCHED];
        let mut mail = [0u32; WATCHED];
        for (i, (s, m)) in seen.iter_mut().zip(mail.iter_mut()).enumerate() {
            if i < self.n {
                let q = self.slots[i] as usize % MAX_QPS;
                // SAFETY: the caller's contract; the inbox head (written by
                // the QP's peer) through its address only.
                unsafe {
                    *s = doorbell_word(&p.qps[q]);
                    *m = mem::peek_word(&raw const (*own).inbox[q].head);
                }
            }
        }
        let mut r = Rung::NONE;
        let mut mails = 0u64;
        for (i, (s, m)) in seen.iter().zip(mail.iter()).enumerate() {
            if i < self.n {
                let q = self.slots[i] as usize % MAX_QPS;
                let qp = &p.qps[q];
                let (rang, mail) = (*s != qp.last_doorbell, *m != qp.inbox_tail);
                if rang {
                    r.lone = Some((q, *s));
                }
                r.mask |= ((rang || mail) as u64) << q;
                mails |= (mail as u64) << q;
            }
        }
        if r.mask.count_ones() != 1 || mails != 0 {
            r.lone = None;
        }
        r
    }
}

/// What an idle pass's reads found ([`Watch::rung`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Rung {
    /// Bit `q`: slot `q` has something to do.
    pub(super) mask: u64,
    /// The one slot rung, with its doorbell word as read, when nothing
    /// else moved: a lone request ([`super::lone`]).
    pub(super) lone: Option<(usize, u64)>,
}

impl Rung {
    /// Nothing to do.
    pub(super) const NONE: Rung = Rung { mask: 0, lone: None };
}
