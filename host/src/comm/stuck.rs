//! Who is stuck: when a device wait of this rank runs out of budget, every
//! rank's state is read over the world's status service
//! ([`World::serve_status`](crate::world::World)) and the timed-out error
//! names the chain of ranks that wait for each other, down to the one that
//! is not waiting on the device at all.
//!
//! Each rank keeps a [`Status`]: its last communicator-level step (inside a
//! synchronize since when, in a barrier, in another collective, returned,
//! dropping its communicator), how many kernels its device handle launched
//! (`Activity` on its device handle) and how many of those its last
//! successful synchronize covered, and the report of its own wait that ran
//! out, once found. Peers read it without this rank's cooperation; nothing
//! of it lives on the device, so device waits are unchanged.
//!
//! The chain follows each report's peer (the device knows it in barriers;
//! a plain `wait_until` on a word does not say who writes it): a rank
//! waiting for a peer that has a report of its own leads to that peer; a
//! peer without one is described by what it does (not running a kernel,
//! still running one, gone). Where the chain cannot be followed, every
//! other rank's state is listed, ranks stuck in waits first.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Communicator;
use crate::device::Activity;
use crate::error::{Error, StuckRanks};
use crate::world::wire::{Dec, Enc};
use crate::world::PeerStatus;

/// What a rank waits for past its own budget, so that ranks still inside a
/// synchronize can produce their report (or finish).
pub const STUCK_MARGIN: Duration = Duration::from_secs(1);
/// At most this many other ranks are described when the chain cannot be
/// followed.
const MAX_LISTED: usize = 16;
/// How often the ranks' states are read while some are still inside a
/// synchronize.
const POLL: Duration = Duration::from_millis(50);

/// A rank's last communicator-level step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// In its own code (between communicator calls).
    Idle,
    /// Inside `Communicator::synchronize`.
    Synchronize,
    /// Inside `Communicator::barrier`.
    Barrier,
    /// Inside another collective of the communicator (its name).
    Collective(&'static str),
    /// Its rank function returned (`Communicator::local`), `Ok` or not.
    Returned { ok: bool },
    /// Dropping its communicator (which waits for every rank).
    Dropping,
}

/// A timed-out wait, as a report names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    pub op: String,
    pub peer: Option<u32>,
    pub offset: u64,
    pub cmp: String,
    pub expected: u64,
    pub seen: u64,
}

struct State {
    step: Step,
    since: Instant,
    /// Launches when the current synchronize began.
    at_sync: u64,
    /// Launches that the last successful synchronize covered.
    synced: u64,
    report: Option<Wait>,
}

/// One rank's status record (see the [module docs](self)).
pub(crate) struct Status {
    /// The launches of its device handle (shared with it, so that a status
    /// read after the communicator went does not keep the device open).
    activity: Arc<Activity>,
    state: Mutex<State>,
}

/// The step a [`Status::enter`] started; the rank is back in its own code
/// when it drops.
pub(crate) struct StepGuard<'a> {
    status: &'a Status,
}

impl Drop for StepGuard<'_> {
    fn drop(&mut self) {
        let mut st = self.status.lock();
        if !matches!(st.step, Step::Returned { .. } | Step::Dropping) {
            st.step = Step::Idle;
            st.since = Instant::now();
        }
    }
}

impl StepGuard<'_> {
    /// A synchronize that returned: `ok` when it saw no error, which then
    /// covers every launch made before it began.
    pub(crate) fn synchronized(self, ok: bool) {
        if ok {
            let mut st = self.status.lock();
            st.synced = st.synced.max(st.at_sync);
            st.report = None;
        }
    }
}

impl Status {
    pub(crate) fn new(activity: Arc<Activity>) -> Status {
        Status {
            activity,
            state: Mutex::new(State {
                step: Step::Idle,
                since: Instant::now(),
                at_sync: 0,
                synced: 0,
                report: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enters `step` until the guard drops.
    pub(crate) fn enter(&self, step: Step) -> StepGuard<'_> {
        let mut st = self.lock();
        st.step = step;
        st.since = Instant::now();
        if step == Step::Synchronize {
            st.at_sync = self.activity.get().0;
        }
        StepGuard { status: self }
    }

    /// Sets a final step (returned, dropping).
    pub(crate) fn set(&self, step: Step) {
        let mut st = self.lock();
        st.step = step;
        st.since = Instant::now();
    }

    fn set_report(&self, w: Wait) {
        self.lock().report = Some(w);
    }

    /// The record as peers read it.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let (launches, kernel) = self.activity.get();
        let st = self.lock();
        let (tag, name) = match st.step {
            Step::Idle => (0, ""),
            Step::Synchronize => (1, ""),
            Step::Barrier => (2, ""),
            Step::Collective(n) => (3, n),
            Step::Returned { ok: true } => (4, ""),
            Step::Returned { ok: false } => (5, ""),
            Step::Dropping => (6, ""),
        };
        let e = Enc::default()
            .u8(1)
            .u8(tag)
            .str(name)
            .u64(st.since.elapsed().as_millis() as u64)
            .u64(launches)
            .str(kernel)
            .u64(st.at_sync)
            .u64(st.synced);
        match &st.report {
            None => e.u8(0),
            Some(w) => e
                .u8(1)
                .str(&w.op)
                .u32(w.peer.unwrap_or(u32::MAX))
                .u64(w.offset)
                .str(&w.cmp)
                .u64(w.expected)
                .u64(w.seen),
        }
        .0
    }
}

/// A rank's record as read back ([`Status::encode`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Snapshot {
    step: Step,
    /// Milliseconds in `step`.
    for_ms: u64,
    launches: u64,
    kernel: String,
    at_sync: u64,
    synced: u64,
    report: Option<Wait>,
}

impl Snapshot {
    fn decode(b: &[u8]) -> std::result::Result<Snapshot, String> {
        let mut d = Dec::new(b);
        let version = d.u8("version")?;
        if version != 1 {
            return Err(format!("status version {version}"));
        }
        let tag = d.u8("step")?;
        let name = d.str("step name")?;
        let step = match tag {
            0 => Step::Idle,
            1 => Step::Synchronize,
            2 => Step::Barrier,
            // The names are the communicator's own; another's is shown generically.
            3 => Step::Collective(["alloc", "load_module"].into_iter().find(|n| *n == name).unwrap_or("a collective")),
            4 => Step::Returned { ok: true },
            5 => Step::Returned { ok: false },
            6 => Step::Dropping,
            t => return Err(format!("unknown step {t}")),
        };
        let for_ms = d.u64("time in step")?;
        let launches = d.u64("launches")?;
        let kernel = d.str("kernel")?;
        let at_sync = d.u64("launches at synchronize")?;
        let synced = d.u64("launches synchronized")?;
        let report = match d.u8("report")? {
            0 => None,
            _ => Some(Wait {
                op: d.str("op")?,
                peer: Some(d.u32("peer")?).filter(|&p| p != u32::MAX),
                offset: d.u64("offset")?,
                cmp: d.str("cmp")?,
                expected: d.u64("expected")?,
                seen: d.u64("seen")?,
            }),
        };
        Ok(Snapshot {
            step,
            for_ms,
            launches,
            kernel,
            at_sync,
            synced,
            report,
        })
    }
}

/// One rank as the composer sees it.
#[derive(Clone, Debug)]
pub(crate) enum Seen {
    /// Its record.
    Status(Snapshot),
    /// Its last record; its world handle is gone.
    Left(Snapshot),
    /// No record: why.
    Gone(String),
}

impl Seen {
    fn from_peer(p: PeerStatus) -> Seen {
        let decode = |b: &[u8]| Snapshot::decode(b).map_err(|e| format!("sent a status this build cannot read ({e})"));
        match p {
            PeerStatus::Bytes(b) => decode(&b).map_or_else(Seen::Gone, Seen::Status),
            PeerStatus::Left(b) => decode(&b).map_or_else(Seen::Gone, Seen::Left),
            PeerStatus::Gone(why) => Seen::Gone(why),
            PeerStatus::Unknown => Seen::Gone("has no communicator status to read".into()),
        }
    }

    fn snapshot(&self) -> Option<&Snapshot> {
        match self {
            Seen::Status(s) | Seen::Left(s) => Some(s),
            Seen::Gone(_) => None,
        }
    }

    /// Still inside a synchronize without a report: it may produce one.
    fn pending(&self) -> bool {
        matches!(self, Seen::Status(s) if s.step == Step::Synchronize && s.report.is_none())
    }
}

fn wait_line(r: usize, w: &Wait) -> String {
    let what = format!("at offset {:#x} ({} {} {}, saw {})", w.offset, w.op, w.cmp, w.expected, w.seen);
    match w.peer {
        Some(p) => format!("rank {r} waits for rank {p}'s signal {what}"),
        None => format!("rank {r} waits for a signal {what} from a rank its wait does not name"),
    }
}

/// What rank `r` does, when it has no report of its own. `awaited`: a rank
/// on the chain waits for its signal.
fn state_line(r: usize, seen: &Seen, awaited: bool) -> String {
    let s = match seen {
        Seen::Gone(why) => return format!("rank {r} {why}"),
        Seen::Status(s) | Seen::Left(s) => s,
    };
    if s.step == Step::Synchronize && s.launches > s.synced {
        return format!(
            "rank {r} is still in synchronize after {} ms, running its launch #{} (`{}`), without a timed-out wait \
             of its own (a kernel that computes or spins without a budget?)",
            s.for_ms, s.launches, s.kernel
        );
    }
    let activity = if s.launches == 0 {
        "is not running a kernel: it launched none since its communicator was created".to_string()
    } else if s.launches <= s.synced {
        format!(
            "is not running a kernel: it launched nothing since its last synchronize, which covered its launch #{} (`{}`){}",
            s.launches,
            s.kernel,
            if awaited {
                " — that kernel ended without writing the word, or this rank skipped a launch"
            } else {
                ""
            }
        )
    } else {
        format!(
            "launched `{}` (launch #{}) and has not synchronized it: that kernel may still run, or ended without \
             writing the word",
            s.kernel, s.launches
        )
    };
    let place = match (seen, s.step) {
        (Seen::Left(_), _) => "it exited (its world handle is gone)".to_string(),
        (_, Step::Returned { ok }) => format!(
            "it exited: its rank function returned {}",
            if ok { "Ok" } else { "an error or panicked" }
        ),
        (_, Step::Dropping) => "it exited its program's use of the communicator (dropping it)".to_string(),
        (_, Step::Barrier) => format!("now in barrier (for {} ms)", s.for_ms),
        (_, Step::Collective(n)) => format!("now in {n} (for {} ms)", s.for_ms),
        (_, Step::Synchronize) => format!("now in synchronize (for {} ms)", s.for_ms),
        (_, Step::Idle) => format!("back in its own code for {} ms", s.for_ms),
    };
    format!("rank {r} {activity}; {place}")
}

/// The chain from rank `me` (whose wait ran out), over every rank's state.
pub(crate) fn compose(me: usize, seen: &[Seen]) -> StuckRanks {
    let n = seen.len();
    let mut parts = Vec::new();
    let mut chain = Vec::new();
    let mut on_chain = vec![false; n];
    let mut culprit = None;
    let mut resolved = false;
    let mut cur = me;
    while cur < n {
        on_chain[cur] = true;
        chain.push(cur);
        match seen[cur].snapshot().and_then(|s| s.report.as_ref()) {
            Some(w) => {
                parts.push(wait_line(cur, w));
                match w.peer.map(|p| p as usize).filter(|&p| p < n) {
                    Some(p) if on_chain[p] => {
                        parts.push(format!("rank {p} is above: these waits form a cycle"));
                        resolved = true;
                        break;
                    }
                    Some(p) => cur = p,
                    None => break,
                }
            }
            None => {
                parts.push(state_line(cur, &seen[cur], cur != me));
                if cur != me {
                    culprit = Some(cur);
                    resolved = true;
                }
                break;
            }
        }
    }
    let mut text = parts.join("; ");
    if !resolved {
        // Ranks stuck in waits first, then the others, by rank.
        let mut others: Vec<usize> = (0..n).filter(|&r| !on_chain[r]).collect();
        others.sort_by_key(|&r| (seen[r].snapshot().and_then(|s| s.report.as_ref()).is_none(), r));
        let lines: Vec<String> = others
            .iter()
            .take(MAX_LISTED)
            .map(|&r| match seen[r].snapshot().and_then(|s| s.report.as_ref()) {
                Some(w) => wait_line(r, w),
                None => state_line(r, &seen[r], false),
            })
            .collect();
        if !lines.is_empty() {
            text += &format!("; the other ranks: {}", lines.join("; "));
        }
        if others.len() > MAX_LISTED {
            text += &format!("; and {} more ranks", others.len() - MAX_LISTED);
        }
    }
    StuckRanks { chain, culprit, text }
}

impl Communicator {
    /// For a timed-out wait: records it in this rank's status, reads every
    /// rank's (giving ranks still inside a synchronize up to this rank's
    /// budget plus [`STUCK_MARGIN`] to report or finish), and puts the
    /// chain into the error (also logged). Other errors pass unchanged.
    pub(super) fn name_the_stuck(&self, mut e: Error) -> Error {
        let Error::WaitTimeout {
            rank,
            op,
            peer,
            offset,
            cmp,
            expected,
            seen,
            stuck,
            ..
        } = &mut e
        else {
            return e;
        };
        self.status.set_report(Wait {
            op: op.to_string(),
            peer: *peer,
            offset: *offset,
            cmp: cmp.to_string(),
            expected: *expected,
            seen: *seen,
        });
        let deadline = Instant::now() + Duration::from_nanos(self.budget_ns) + STUCK_MARGIN;
        let all = loop {
            let all: Vec<Seen> = self.world.read_statuses().into_iter().map(Seen::from_peer).collect();
            let now = Instant::now();
            if now >= deadline || !all.iter().enumerate().any(|(r, s)| r != self.rank && s.pending()) {
                break all;
            }
            std::thread::sleep(POLL.min(deadline - now));
        };
        let found = compose(self.rank, &all);
        tracing::error!("rank {rank}: a device wait ran out of budget; who is stuck: {}", found.text);
        *stuck = Some(Box::new(found));
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(step: Step, launches: u64, synced: u64, report: Option<Wait>) -> Seen {
        Seen::Status(Snapshot {
            step,
            for_ms: 7,
            launches,
            kernel: "k".into(),
            at_sync: synced,
            synced,
            report,
        })
    }

    fn wait(peer: Option<u32>, offset: u64) -> Option<Wait> {
        Some(Wait {
            op: "barrier".into(),
            peer,
            offset,
            cmp: ">=".into(),
            expected: 5,
            seen: 4,
        })
    }

    #[test]
    fn the_chain_follows_peers_to_the_rank_that_launched_nothing() {
        let seen = vec![
            snap(Step::Idle, 3, 3, None),
            snap(Step::Synchronize, 4, 3, wait(Some(3), 0x18)),
            snap(Step::Idle, 3, 3, None),
            snap(Step::Synchronize, 4, 3, wait(Some(5), 0x28)),
            Seen::Gone("exited or was killed".into()),
            snap(Step::Barrier, 3, 3, None),
        ];
        let found = compose(1, &seen);
        assert_eq!((found.chain.as_slice(), found.culprit), (&[1, 3, 5][..], Some(5)));
        let s = found.text;
        assert!(
            s.starts_with(
                "rank 1 waits for rank 3's signal at offset 0x18 (barrier >= 5, saw 4); rank 3 waits for rank 5's signal at offset 0x28"
            ),
            "{s}"
        );
        assert!(
            s.contains("rank 5 is not running a kernel: it launched nothing since its last synchronize"),
            "{s}"
        );
        assert!(s.contains("now in barrier"), "{s}");
        assert!(!s.contains("rank 4"), "the chain is resolved: {s}");
        let s = compose(3, &seen).text;
        assert!(s.starts_with("rank 3 waits for rank 5's"), "{s}");
    }

    #[test]
    fn a_cycle_and_an_unnamed_writer_are_said_so() {
        let seen = vec![
            snap(Step::Synchronize, 1, 0, wait(Some(1), 8)),
            snap(Step::Synchronize, 1, 0, wait(Some(0), 0)),
        ];
        let found = compose(0, &seen);
        assert!(found.text.ends_with("rank 0 is above: these waits form a cycle"), "{}", found.text);
        assert_eq!((found.chain.as_slice(), found.culprit), (&[0, 1][..], None));
        let seen = vec![
            snap(Step::Synchronize, 1, 0, wait(None, 0x100)),
            Seen::Gone("exited or was killed (its status port refuses connections)".into()),
            snap(Step::Synchronize, 1, 0, wait(None, 0x108)),
        ];
        let found = compose(0, &seen);
        assert_eq!((found.chain.as_slice(), found.culprit), (&[0][..], None));
        let s = found.text;
        assert!(s.starts_with("rank 0 waits for a signal at offset 0x100"), "{s}");
        let others = s.split("; the other ranks: ").nth(1).expect(&s);
        assert!(others.starts_with("rank 2 waits for a signal at offset 0x108"), "{s}");
        assert!(others.contains("rank 1 exited or was killed"), "{s}");
    }

    #[test]
    fn a_status_survives_its_encoding() {
        let dev = crate::Device::emulator(0);
        let st = Status::new(dev.activity().clone());
        dev.activity().note("ring");
        {
            let g = st.enter(Step::Synchronize);
            g.synchronized(true);
        }
        st.set_report(Wait {
            op: "wait_until".into(),
            peer: None,
            offset: 0x40,
            cmp: "==".into(),
            expected: 1,
            seen: 0,
        });
        let _b = st.enter(Step::Barrier);
        let s = Snapshot::decode(&st.encode()).unwrap();
        assert_eq!((s.step, s.launches, s.kernel.as_str(), s.synced), (Step::Barrier, 1, "ring", 1));
        assert_eq!(s.report.map(|w| (w.peer, w.offset)), Some((None, 0x40)));
    }
}
