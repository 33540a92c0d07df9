//! A world of threads in one process: the same collectives, no sockets.
//!
//! Every collective is "deposit my bytes, wait until all ranks deposited,
//! read everyone's". The last rank to arrive checks that all called the same
//! collective, publishes the table and opens the next generation. Waits are
//! bounded: a rank that never comes, or whose handle was dropped, turns into
//! an error naming it instead of a hang.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Op;
use crate::error::{Error, Result};

pub(crate) struct Group {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
    /// Every rank's status source ([`super::status`]).
    board: super::status::Board,
}

struct State {
    generation: u64,
    deposits: Vec<Option<(Op, Vec<u8>)>>,
    arrived: usize,
    /// The table of the last completed generation.
    result: Option<Arc<Vec<Vec<u8>>>>,
    /// Handles dropped.
    left: Vec<bool>,
    /// Set once the ranks are out of step; every later call fails with it.
    broken: Option<Broken>,
}

/// What put the ranks out of step. Ranks inside the failed collective get
/// the specific error; later calls get [`Error::WorldBroken`].
#[derive(Clone)]
enum Broken {
    Mismatch { rank: usize, ours: String, theirs: String },
    Timeout { op: Op, missing: Vec<usize> },
    Left { peer: usize, op: Op },
    Failed { peer: usize, reason: String },
}

impl Group {
    pub(crate) fn new(size: usize, timeout: Duration) -> Arc<Group> {
        Arc::new(Group {
            size,
            timeout,
            state: Mutex::new(State {
                generation: 0,
                deposits: vec![None; size],
                arrived: 0,
                result: None,
                left: vec![false; size],
                broken: None,
            }),
            cv: Condvar::new(),
            board: Default::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves consistent data
        // (every update is a few plain stores); keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The error of a rank that was inside the collective that failed.
    fn failure(rank: usize, b: &Broken, waited: Duration) -> Error {
        match b {
            Broken::Mismatch { rank: r, ours, theirs } => Error::CollectiveMismatch {
                rank: *r,
                ours: ours.clone(),
                theirs: theirs.clone(),
            },
            Broken::Timeout { op, missing } => Error::CollectiveTimeout {
                rank,
                op: op.to_string(),
                waited,
                missing: missing.clone(),
            },
            Broken::Left { peer, op } => Error::PeerLost {
                rank,
                peer: *peer,
                op: op.to_string(),
                detail: "its World handle was dropped".into(),
            },
            Broken::Failed { peer, reason } => Error::PeerFailed {
                rank,
                peer: *peer,
                reason: reason.clone(),
            },
        }
    }

    /// The error of a rank that calls after the failure.
    fn broken(rank: usize, b: &Broken) -> Error {
        let reason = match b {
            // A failed rank is named however late the others call.
            Broken::Failed { .. } => return Self::failure(rank, b, Duration::ZERO),
            Broken::Mismatch { rank: r, ours, theirs } => format!("rank {r} called {theirs} where rank 0 called {ours}"),
            Broken::Timeout { op, missing } => format!("{op} timed out waiting for rank(s) {missing:?}"),
            Broken::Left { peer, op } => format!("rank {peer} left the world (its World handle was dropped) before {op}"),
        };
        Error::WorldBroken { rank, reason }
    }

    /// Runs one collective step for `rank`; returns every rank's bytes.
    pub(crate) fn exchange(&self, rank: usize, op: Op, mine: &[u8]) -> Result<Arc<Vec<Vec<u8>>>> {
        let mut st = self.lock();
        if let Some(b) = &st.broken {
            return Err(Self::broken(rank, b));
        }
        let start = Instant::now();
        let generation = st.generation;
        st.deposits[rank] = Some((op, mine.to_vec()));
        st.arrived += 1;
        if st.arrived == self.size {
            let deposits: Vec<(Op, Vec<u8>)> = st.deposits.iter_mut().map(|d| d.take().expect("every rank deposited")).collect();
            st.arrived = 0;
            st.generation += 1;
            let ours = deposits[0].0;
            let result = match deposits.iter().position(|(o, _)| *o != ours) {
                Some(r) => {
                    let b = Broken::Mismatch {
                        rank: r,
                        ours: ours.to_string(),
                        theirs: deposits[r].0.to_string(),
                    };
                    let e = Self::failure(rank, &b, start.elapsed());
                    st.broken = Some(b);
                    Err(e)
                }
                None => {
                    let table = Arc::new(deposits.into_iter().map(|(_, bytes)| bytes).collect::<Vec<_>>());
                    st.result = Some(table.clone());
                    Ok(table)
                }
            };
            self.cv.notify_all();
            return result;
        }
        let deadline = start + self.timeout;
        loop {
            if st.generation != generation {
                // The next generation cannot complete without this rank, so
                // `result` still holds ours.
                // An abort after the step completed does not undo it.
                return match &st.broken {
                    Some(b) if !matches!(b, Broken::Failed { .. }) => Err(Self::failure(rank, b, start.elapsed())),
                    _ => Ok(st.result.clone().expect("a completed generation publishes its table")),
                };
            }
            if let Some(b) = &st.broken {
                return Err(Self::failure(rank, b, start.elapsed()));
            }
            if let Some(peer) = (0..self.size).find(|&r| st.left[r] && st.deposits[r].is_none()) {
                let b = Broken::Left { peer, op };
                let e = Self::failure(rank, &b, start.elapsed());
                st.broken = Some(b);
                self.cv.notify_all();
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..self.size).filter(|&r| st.deposits[r].is_none()).collect();
                let b = Broken::Timeout { op, missing };
                let e = Self::failure(rank, &b, start.elapsed());
                st.broken = Some(b);
                self.cv.notify_all();
                return Err(e);
            }
            st = self.cv.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// `rank` failed: every waiting and later collective fails naming it
    /// (unless the world already broke for another reason).
    /// Returns false when the world had already broken.
    pub(crate) fn abort(&self, rank: usize, reason: &str) -> bool {
        let mut st = self.lock();
        if st.broken.is_some() {
            return false;
        }
        st.broken = Some(Broken::Failed {
            peer: rank,
            reason: reason.to_string(),
        });
        self.cv.notify_all();
        true
    }

    /// The ranks' status sources.
    pub(crate) fn board(&self) -> &super::status::Board {
        &self.board
    }

    /// Whether `rank`'s handle was dropped.
    pub(crate) fn has_left(&self, rank: usize) -> bool {
        self.lock().left.get(rank).copied().unwrap_or(false)
    }

    /// Marks `rank`'s handle as gone, waking ranks that wait for it.
    pub(crate) fn leave(&self, rank: usize) {
        self.lock().left[rank] = true;
        self.cv.notify_all();
    }
}
