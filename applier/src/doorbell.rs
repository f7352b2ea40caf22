//! A wake-up for one sleeping thread that rings only when it sleeps.
//!
//! Rust's condvars make a `futex` wake system call on every notify, waiter or not; the apply
//! workers and the safe-time publisher are rung thousands of times a second while they are
//! busy, so a ring that finds nobody asleep only sets a flag.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Debug)]
struct Bell {
    /// Rung since the sleeper last looked.
    pending: bool,
    /// The sleeper is blocked on the condvar.
    sleeping: bool,
}

#[derive(Debug)]
pub(crate) struct Doorbell {
    bell: Mutex<Bell>,
    cv: Condvar,
}

impl Doorbell {
    /// A doorbell, already rung when `pending` (the sleeper's first look finds work).
    pub(crate) fn new(pending: bool) -> Doorbell {
        Doorbell {
            bell: Mutex::new(Bell {
                pending,
                sleeping: false,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Bell> {
        // Two flags: a panic elsewhere cannot leave them inconsistent.
        self.bell.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the sleeper, or has its next `wait` return at once.
    pub(crate) fn ring(&self) {
        let mut g = self.lock();
        g.pending = true;
        if g.sleeping {
            self.cv.notify_one();
        }
    }

    /// Sleeps until rung, `timeout`, or — checked under the lock, so a `stop` set before a
    /// `ring` is seen — `stop()`; clears the ring.
    pub(crate) fn wait(&self, timeout: Duration, stop: impl Fn() -> bool) {
        let mut g = self.lock();
        if !g.pending && !stop() {
            g.sleeping = true;
            g = self
                .cv
                .wait_timeout(g, timeout)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            g.sleeping = false;
        }
        g.pending = false;
    }
}
