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
}

impl Barrier {
    pub fn new(n: usize) -> Self {
        Barrier {
            state: Mutex::new(State {
                expected: n,
                arrived: 0,
                generation: 0,
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
        let mut s = self.lock();
        s.arrived += 1;
        if s.arrived >= s.expected {
            s.arrived = 0;
            s.generation = s.generation.wrapping_add(1);
            self.cv.notify_all();
            return;
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
    }

    /// The calling thread exits: it no longer counts toward the barrier.
    pub fn leave(&self) {
        let mut s = self.lock();
        s.expected = s.expected.saturating_sub(1);
        if s.expected > 0 && s.arrived >= s.expected {
            s.arrived = 0;
            s.generation = s.generation.wrapping_add(1);
            self.cv.notify_all();
        }
    }

    /// Wakes waiters so they notice an abort promptly.
    pub fn wake_all(&self) {
        let _g = self.lock();
        self.cv.notify_all();
    }
}
