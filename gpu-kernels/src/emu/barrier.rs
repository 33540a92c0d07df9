//! A barrier whose party can shrink (exited threads leave it), that gives up
//! on an aborted launch, and that fails loudly instead of hanging.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

pub struct Barrier {
    state: Mutex<State>,
    cv: Condvar,
}

struct State {
    expected: usize,
    arrived: usize,
    generation: u64,
    /// OR of the predicates of this generation's arrivals so far.
    or_acc: bool,
    /// The OR of the last completed generation (read by its waiters; the
    /// next generation cannot complete before they arrive at it).
    last_or: bool,
}

impl State {
    /// The last party arrived: the generation completes.
    fn complete(&mut self) {
        self.arrived = 0;
        self.generation = self.generation.wrapping_add(1);
        self.last_or = std::mem::take(&mut self.or_acc);
    }
}

impl Barrier {
    pub fn new(n: usize) -> Self {
        Barrier {
            state: Mutex::new(State {
                expected: n,
                arrived: 0,
                generation: 0,
                or_acc: false,
                last_or: false,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for every remaining party. Unwinds when `aborted` is set, panics
    /// (naming `what`) when the others do not arrive within the timeout.
    pub fn wait(&self, aborted: &AtomicBool, what: &str) {
        self.wait_or(false, aborted, what);
    }

    /// As [`Self::wait`], returning whether any party passed `pred` true
    /// (`bar.red.or.pred`).
    pub fn wait_or(&self, pred: bool, aborted: &AtomicBool, what: &str) -> bool {
        let mut s = self.lock();
        s.arrived += 1;
        s.or_acc |= pred;
        if s.arrived >= s.expected {
            s.complete();
            self.cv.notify_all();
            return s.last_or;
        }
        let gen = s.generation;
        let deadline = Instant::now() + super::barrier_timeout();
        while s.generation == gen {
            if aborted.load(Ordering::Relaxed) {
                s.arrived -= 1;
                drop(s);
                std::panic::resume_unwind(Box::new(super::Aborted));
            }
            let now = Instant::now();
            if now >= deadline {
                // The barrier is dead (the launch aborts): leave the count as
                // is, so every thread that gives up reports the same numbers.
                let (arrived, expected) = (s.arrived, s.expected);
                drop(s);
                panic!(
                    "{what}: only {arrived} of {expected} threads arrived within {:?} (divergent control flow around a barrier or warp collective?)",
                    super::barrier_timeout()
                );
            }
            let wait = (deadline - now).min(Duration::from_millis(50));
            s = self.cv.wait_timeout(s, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
        s.last_or
    }

    /// The calling thread exits: it no longer counts toward the barrier.
    pub fn leave(&self) {
        let mut s = self.lock();
        s.expected = s.expected.saturating_sub(1);
        if s.expected > 0 && s.arrived >= s.expected {
            s.complete();
            self.cv.notify_all();
        }
    }

    /// Wakes waiters so they notice an abort promptly.
    pub fn wake_all(&self) {
        let _g = self.lock();
        self.cv.notify_all();
    }
}
