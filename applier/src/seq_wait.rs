//! Waiting for a published, monotone `u64` (the safe time) to reach a target, without
//! holding a thread for an async caller, and at the cost of one fence and one relaxed load
//! to the publisher while nobody waits.
//!
//! A waiter registers `(target, id) → wake` in an ordered map, then loads the published
//! value again; the publisher stores the value, then looks at the count of waiters and,
//! only when there are some, wakes those whose target it reached. A waiter is a tokio
//! oneshot (an async task: nothing blocks) or a channel a thread sleeps on.
//!
//! Ordering: the waiter's `waiting += 1` (under the map's lock) and its load of the value,
//! and the publisher's store of the value and its load of `waiting`, are each separated by
//! a `SeqCst` fence: the store-buffering pattern. At least one side sees the other's write,
//! so either the waiter sees the new value (and does not sleep) or the publisher sees the
//! waiter and takes the lock, where the entry already is (its insertion and the increment
//! are one critical section, which the publisher's lock orders before its own).

use std::collections::BTreeMap;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// How a waiter is woken.
#[derive(Debug)]
pub(crate) enum Wake {
    /// An async task awaiting the receiver.
    Task(tokio::sync::oneshot::Sender<()>),
    /// A thread blocked on the receiver.
    Thread(std::sync::mpsc::SyncSender<()>),
}

impl Wake {
    fn wake(self) {
        // A receiver that is gone gave up (deadline or cancelled): nothing to do.
        match self {
            Wake::Task(tx) => {
                let _ = tx.send(());
            }
            Wake::Thread(tx) => {
                let _ = tx.try_send(());
            }
        }
    }
}

/// The registered waiters of one published value.
#[derive(Debug, Default)]
pub(crate) struct SeqWait {
    /// Entries in `map`, read by the publisher without the lock.
    waiting: AtomicUsize,
    /// `(target, id)` → how to wake the waiter.
    map: Mutex<BTreeMap<(u64, u64), Wake>>,
    next_id: AtomicU64,
}

/// A registered waiter; [`SeqWait::deregister`] removes it if it was not woken.
#[derive(Debug, Clone, Copy)]
#[must_use]
pub(crate) struct Ticket(u64, u64);

impl SeqWait {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<(u64, u64), Wake>> {
        // Plain data: a panic elsewhere cannot leave the map inconsistent.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a waiter for `target`. The caller then loads the published value (after
    /// this, see the module docs) and sleeps only if it is below `target`.
    pub(crate) fn register(&self, target: u64, wake: Wake) -> Ticket {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut m = self.lock();
            m.insert((target, id), wake);
            self.waiting.fetch_add(1, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        Ticket(target, id)
    }

    /// Removes a waiter that gave up (deadline, cancelled); nothing if it was woken.
    pub(crate) fn deregister(&self, t: Ticket) {
        let mut m = self.lock();
        if m.remove(&(t.0, t.1)).is_some() {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The publisher stored `value`: wakes every waiter whose target it reached. Without
    /// waiters this is a fence and a relaxed load.
    pub(crate) fn advanced(&self, value: u64) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let reached = {
            let mut m = self.lock();
            let reached = match value.checked_add(1) {
                Some(above) => {
                    let rest = m.split_off(&(above, 0));
                    std::mem::replace(&mut *m, rest)
                }
                None => std::mem::take(&mut *m),
            };
            self.waiting.fetch_sub(reached.len(), Ordering::Relaxed);
            reached
        };
        for w in reached.into_values() {
            w.wake();
        }
    }

    /// Wakes every waiter (the value will not move again, or the rules changed: a stop, a
    /// cutover); each looks at why it woke. The caller changes its state before this.
    pub(crate) fn wake_all(&self) {
        let all = {
            let mut m = self.lock();
            self.waiting.store(0, Ordering::Relaxed);
            std::mem::take(&mut *m)
        };
        for w in all.into_values() {
            w.wake();
        }
    }

    /// Waiters registered now.
    pub(crate) fn len(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn thread_waiter(w: &SeqWait, target: u64) -> (Ticket, std::sync::mpsc::Receiver<()>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        (w.register(target, Wake::Thread(tx)), rx)
    }

    #[test]
    fn wakes_exactly_the_reached_targets() {
        let w = SeqWait::default();
        let (_, r5) = thread_waiter(&w, 5);
        let (_, r7) = thread_waiter(&w, 7);
        let (_, rmax) = thread_waiter(&w, u64::MAX);
        assert_eq!(w.len(), 3);
        w.advanced(4);
        assert!(r5.try_recv().is_err());
        w.advanced(5);
        assert!(r5.try_recv().is_ok());
        assert!(r7.try_recv().is_err());
        assert_eq!(w.len(), 2);
        w.advanced(u64::MAX);
        assert!(r7.try_recv().is_ok() && rmax.try_recv().is_ok());
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn deregistered_waiters_are_not_counted_and_wake_all_empties() {
        let w = SeqWait::default();
        let (t, _r) = thread_waiter(&w, 9);
        let (_, r2) = thread_waiter(&w, 9);
        w.deregister(t);
        assert_eq!(w.len(), 1);
        w.deregister(t);
        assert_eq!(w.len(), 1);
        w.wake_all();
        assert!(r2.try_recv().is_ok());
        assert_eq!(w.len(), 0);
        // A woken waiter's deregister is a no-op.
        let (t3, _r3) = thread_waiter(&w, 1);
        w.advanced(1);
        w.deregister(t3);
        assert_eq!(w.len(), 0);
    }

    #[tokio::test]
    async fn async_waiter_is_woken() {
        let w = std::sync::Arc::new(SeqWait::default());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _t = w.register(3, Wake::Task(tx));
        let w2 = w.clone();
        let h = std::thread::spawn(move || w2.advanced(3));
        rx.await.unwrap();
        h.join().unwrap();
    }
}
