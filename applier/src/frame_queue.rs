//! The bounded queue between a tablet's stream task and its writer thread.
//!
//! A mutex-and-condvar queue that **never spins**: a consumer with nothing to do sleeps at
//! once, and a producer wakes it only when it sleeps. On this project's 2-core machines a
//! channel that spins and `sched_yield`s before it blocks (crossbeam's) cost more than it
//! saved: eight writer threads yielding to each other ~8 000 times a second under a 25 000
//! txn/s load, each yield a context switch that delayed the apply workers (BENCHMARKS.md,
//! changelog, 2026-12-04).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Debug)]
struct State<T> {
    items: VecDeque<T>,
    /// The consumer is blocked in [`FrameQueue::pop_into`].
    consumer_waiting: bool,
    /// Producers blocked in [`FrameQueue::push`].
    producers_waiting: usize,
    /// The consumer is gone ([`FrameQueue::close`]): nothing pushed would be taken out.
    closed: bool,
}

/// Why an item was not queued; it is given back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PushError<T> {
    Full(T),
    Closed(T),
}

/// A bounded multi-producer, single-consumer queue.
#[derive(Debug)]
pub(crate) struct FrameQueue<T> {
    state: Mutex<State<T>>,
    capacity: usize,
    not_empty: Condvar,
    not_full: Condvar,
}

impl<T> FrameQueue<T> {
    /// A queue holding at most `capacity` items (at least one).
    pub(crate) fn new(capacity: usize) -> FrameQueue<T> {
        let capacity = capacity.max(1);
        FrameQueue {
            state: Mutex::new(State {
                items: VecDeque::with_capacity(capacity),
                consumer_waiting: false,
                producers_waiting: 0,
                closed: false,
            }),
            capacity,
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pushed(&self, mut g: MutexGuard<'_, State<T>>, item: T) {
        g.items.push_back(item);
        let wake = g.consumer_waiting;
        g.consumer_waiting = false;
        drop(g);
        if wake {
            self.not_empty.notify_one();
        }
    }

    /// Queues `item` unless the queue is full or closed (then gives it back).
    pub(crate) fn try_push(&self, item: T) -> Result<(), PushError<T>> {
        let g = self.lock();
        if g.closed {
            return Err(PushError::Closed(item));
        }
        if g.items.len() >= self.capacity {
            return Err(PushError::Full(item));
        }
        self.pushed(g, item);
        Ok(())
    }

    /// Queues `item`, blocking while the queue is full; gives it back once closed.
    pub(crate) fn push(&self, item: T) -> Result<(), T> {
        let mut g = self.lock();
        while g.items.len() >= self.capacity && !g.closed {
            g.producers_waiting += 1;
            g = self.not_full.wait(g).unwrap_or_else(|p| p.into_inner());
            g.producers_waiting -= 1;
        }
        if g.closed {
            return Err(item);
        }
        self.pushed(g, item);
        Ok(())
    }

    /// The consumer stops: blocked and later pushes give their item back.
    pub(crate) fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        g.items.clear();
        drop(g);
        self.not_full.notify_all();
    }

    /// Moves the oldest item into `out`, waiting up to `timeout` for one, then further items
    /// while `more` accepts them; returns how many it moved (0: timed out).
    pub(crate) fn pop_into(
        &self,
        timeout: Duration,
        out: &mut Vec<T>,
        mut more: impl FnMut(&T) -> bool,
    ) -> usize {
        let mut g = self.lock();
        if g.items.is_empty() {
            g.consumer_waiting = true;
            g = self
                .not_empty
                .wait_timeout_while(g, timeout, |s| s.items.is_empty())
                .unwrap_or_else(|p| p.into_inner())
                .0;
            g.consumer_waiting = false;
        }
        let Some(first) = g.items.pop_front() else {
            return 0;
        };
        out.push(first);
        let mut n = 1;
        while let Some(next) = g.items.front() {
            if !more(next) {
                break;
            }
            out.extend(g.items.pop_front());
            n += 1;
        }
        // Producers wait only on a full queue: any waiting one has room now.
        let wake = g.producers_waiting > 0;
        drop(g);
        if wake {
            self.not_full.notify_all();
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;

    #[test]
    fn items_come_out_in_order_and_more_bounds_a_group() {
        let q = FrameQueue::new(8);
        for i in 0..5 {
            q.try_push(i).unwrap();
        }
        let mut out = Vec::new();
        let mut taken = 0;
        let n = q.pop_into(Duration::ZERO, &mut out, |_| {
            taken += 1;
            taken < 3
        });
        assert_eq!(n, 3);
        assert_eq!(out, [0, 1, 2]);
        out.clear();
        assert_eq!(q.pop_into(Duration::ZERO, &mut out, |_| true), 2);
        assert_eq!(out, [3, 4]);
        out.clear();
        assert_eq!(q.pop_into(Duration::from_millis(1), &mut out, |_| true), 0);
    }

    #[test]
    fn a_full_queue_refuses_try_push_and_blocks_push_until_popped() {
        let q = Arc::new(FrameQueue::new(2));
        q.try_push(1).unwrap();
        q.try_push(2).unwrap();
        assert_eq!(q.try_push(3), Err(PushError::Full(3)));
        let q2 = q.clone();
        let producer = std::thread::spawn(move || q2.push(3).unwrap());
        // The producer can only finish once an item is taken out.
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.len() < 3 && Instant::now() < deadline {
            q.pop_into(Duration::from_millis(100), &mut out, |_| true);
        }
        producer.join().unwrap();
        assert_eq!(out, [1, 2, 3]);
    }

    #[test]
    fn closing_releases_a_blocked_producer_and_refuses_more() {
        let q = Arc::new(FrameQueue::new(1));
        q.try_push(1).unwrap();
        let q2 = q.clone();
        let producer = std::thread::spawn(move || q2.push(2));
        q.close();
        assert_eq!(
            producer.join().unwrap(),
            Err(2),
            "the blocked push gave its item back"
        );
        assert_eq!(q.try_push(3), Err(PushError::Closed(3)));
        assert_eq!(q.push(4), Err(4));
    }

    #[test]
    fn a_waiting_consumer_is_woken_by_a_push() {
        let q = Arc::new(FrameQueue::new(4));
        let q2 = q.clone();
        let consumer = std::thread::spawn(move || {
            let mut out = Vec::new();
            let started = Instant::now();
            let n = q2.pop_into(Duration::from_secs(30), &mut out, |_| true);
            (n, out, started.elapsed())
        });
        // Push until the consumer has taken something (it may not be waiting yet).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !consumer.is_finished() && Instant::now() < deadline {
            let _ = q.try_push(7);
            std::thread::yield_now();
        }
        let (n, out, waited) = consumer.join().unwrap();
        assert!(n >= 1 && out.iter().all(|&v| v == 7));
        assert!(
            waited < Duration::from_secs(30),
            "woken by the push, not the timeout"
        );
    }
}
