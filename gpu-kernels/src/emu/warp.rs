//! Warp collectives (shuffles, votes, `bar.warp.sync`) that honour their
//! member mask, as the `*.sync` instructions do: only the lanes in the mask
//! take part, lanes outside it are not waited for, and several disjoint
//! groups of one warp (lanes 0-15 and 16-31 with their own masks) run at
//! the same time. A lane in the mask that never arrives fails the launch
//! after the barrier timeout, naming the missing lanes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub struct Warp {
    /// Lanes that exist in this warp (a partial last warp has fewer than 32).
    existing: u32,
    state: Mutex<State>,
    cv: Condvar,
}

struct State {
    /// Lanes whose thread has exited: no longer waited for.
    exited: u32,
    groups: Vec<Group>,
    next_id: u64,
}

/// One collective in flight: the lanes that called it with `mask`.
struct Group {
    id: u64,
    mask: u32,
    arrived: u32,
    values: [u64; 32],
    done: bool,
    /// Lanes that have read the result; the group goes when all have.
    consumed: u32,
}

/// What a lane sees once its group is complete.
pub struct GroupResult {
    /// Every participating lane's value, indexed by lane.
    pub values: [u64; 32],
    /// The lanes that took part.
    pub members: u32,
}

impl Warp {
    pub fn new(lanes: u32) -> Warp {
        Warp {
            existing: if lanes >= 32 { u32::MAX } else { (1u32 << lanes) - 1 },
            state: Mutex::new(State {
                exited: 0,
                groups: Vec::new(),
                next_id: 0,
            }),
            cv: Condvar::new(),
        }
    }

    /// Mask of the lanes that exist.
    pub fn existing(&self) -> u32 {
        self.existing
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Completes every group whose remaining members have all arrived.
    fn complete_ready(&self, st: &mut State) {
        let live = self.existing & !st.exited;
        let mut any = false;
        for g in st.groups.iter_mut().filter(|g| !g.done) {
            if g.arrived & (g.mask & live) == g.mask & live {
                g.done = true;
                any = true;
            }
        }
        if any {
            self.cv.notify_all();
        }
    }

    /// Lane `lane` joins the collective over `mask` with `value`; returns
    /// once every live lane of `mask` has joined. Unwinds when `aborted` is
    /// set; panics (naming `what` and the missing lanes) after `timeout`.
    pub fn exchange(&self, lane: u32, mask: u32, value: u64, aborted: &AtomicBool, timeout: Duration, what: &str) -> GroupResult {
        let bit = 1u32 << lane;
        if mask & bit == 0 {
            panic!("{what}: lane {lane} called it with mask {mask:#010x}, which does not include the lane itself");
        }
        let mut st = self.lock();
        let id = match st.groups.iter().position(|g| !g.done && g.mask == mask && g.arrived & bit == 0) {
            Some(i) => st.groups[i].id,
            None => {
                let id = st.next_id;
                st.next_id += 1;
                st.groups.push(Group {
                    id,
                    mask,
                    arrived: 0,
                    values: [0; 32],
                    done: false,
                    consumed: 0,
                });
                id
            }
        };
        let find = |st: &State| {
            st.groups
                .iter()
                .position(|g| g.id == id)
                .expect("a group lives until its members read it")
        };
        let i = find(&st);
        st.groups[i].values[lane as usize] = value;
        st.groups[i].arrived |= bit;
        self.complete_ready(&mut st);
        let deadline = Instant::now() + timeout;
        loop {
            let i = find(&st);
            if st.groups[i].done {
                let g = &mut st.groups[i];
                let out = GroupResult {
                    values: g.values,
                    members: g.arrived,
                };
                g.consumed |= bit;
                if g.consumed == g.arrived {
                    st.groups.remove(i);
                }
                return out;
            }
            if aborted.load(Ordering::Relaxed) {
                drop(st);
                std::panic::resume_unwind(Box::new(super::Aborted));
            }
            let now = Instant::now();
            if now >= deadline {
                let g = &st.groups[i];
                let missing = g.mask & self.existing & !st.exited & !g.arrived;
                let arrived = g.arrived;
                drop(st);
                panic!(
                    "{what} with mask {mask:#010x}: lane(s) {:?} never arrived within {timeout:?} (arrived: {:?}); \
                     every lane in the mask must call the same warp collective",
                    lanes_of(missing),
                    lanes_of(arrived)
                );
            }
            let wait = (deadline - now).min(Duration::from_millis(50));
            st = self.cv.wait_timeout(st, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Lane `lane`'s thread exits: collectives no longer wait for it.
    pub fn leave(&self, lane: u32) {
        let mut st = self.lock();
        st.exited |= 1 << lane;
        self.complete_ready(&mut st);
    }

    /// Wakes waiters so they notice an abort promptly.
    pub fn wake_all(&self) {
        let _g = self.lock();
        self.cv.notify_all();
    }
}

fn lanes_of(mask: u32) -> Vec<u32> {
    (0..32).filter(|l| mask & (1 << l) != 0).collect()
}
