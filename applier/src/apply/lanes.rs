//! The apply threads ([`ApplyThreads`]): each runs one lane of tablets, a step of each per
//! round, and sleeps only after a round without work; during a shipper's catch-up it holds
//! its rounds back for the intake (see [`ApplyThreads::yield_to_intake`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::state::{Applying, Wake};
use super::tablet::{Step, TabletLoop};
use crate::doorbell::Doorbell;
use crate::error::{Error, Result};
use crate::intake::IntakeActivity;

/// Longest wait of a yielding apply thread between looks at the intake's state.
const YIELD_CHECK: Duration = Duration::from_millis(50);

/// One apply thread: its doorbell and the tablets handed to it.
#[derive(Debug)]
pub(super) struct Lane {
    /// Rung for more to read, ready parts, or stop; and whether the thread has ended.
    pub(super) wake: Arc<Wake>,
    /// Tablets given to the thread and not yet taken in by it.
    pub(super) inbox: Mutex<Vec<TabletLoop>>,
    /// Tablets on this thread (taken in or not), for placing new ones.
    pub(super) tablets: AtomicUsize,
    pub(super) shutdown: AtomicBool,
    /// Set by [`ApplyThreads::yield_to_intake`].
    pub(super) yield_to: OnceLock<(Arc<IntakeActivity>, Duration)>,
    /// The thread is holding back for a catch-up.
    pub(super) holding: AtomicBool,
    /// Nanoseconds held back since start.
    pub(super) held_ns: AtomicU64,
}

/// How the group's threads have held back for catch-ups ([`ApplyThreads::yield_status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct YieldStatus {
    /// The configured limit of one hold (`None`: never held back).
    pub limit: Option<Duration>,
    /// Threads holding back now.
    pub holding_threads: usize,
    /// Time held back since start, summed over the threads.
    pub held_total: Duration,
}

/// Marks its lane's thread as ended when dropped (also while unwinding).
struct ExitMark<'a>(&'a Lane);

impl Drop for ExitMark<'_> {
    fn drop(&mut self) {
        self.0.wake.exited.store(true, Ordering::Release);
    }
}

/// A group of apply threads shared by tablets (see the module doc). Dropping it stops the
/// tablets still on it and joins the threads.
#[derive(Debug)]
pub struct ApplyThreads {
    pub(super) lanes: Vec<Arc<Lane>>,
    threads: Vec<JoinHandle<()>>,
}

impl ApplyThreads {
    /// `n` threads (at least one), named `{name}-{i}`.
    pub fn new(n: usize, name: &str) -> Result<ApplyThreads> {
        Self::with_nice(n, name, 0)
    }

    /// [`ApplyThreads::new`], each thread at nice value `nice` (0: the process's; see
    /// [`crate::priority`]).
    pub fn with_nice(n: usize, name: &str, nice: i32) -> Result<ApplyThreads> {
        let mut lanes = Vec::new();
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let lane = Arc::new(Lane {
                wake: Arc::new(Wake {
                    bell: Doorbell::new(false),
                    exited: AtomicBool::new(false),
                }),
                inbox: Mutex::new(Vec::new()),
                tablets: AtomicUsize::new(0),
                shutdown: AtomicBool::new(false),
                yield_to: OnceLock::new(),
                holding: AtomicBool::new(false),
                held_ns: AtomicU64::new(0),
            });
            let l = lane.clone();
            let t = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    let _mark = ExitMark(&l);
                    crate::priority::apply_stage_nice("apply", nice);
                    lane_main(&l)
                })
                .map_err(|source| Error::Io {
                    op: "spawn apply thread",
                    path: PathBuf::new(),
                    source,
                })?;
            lanes.push(lane);
            threads.push(t);
        }
        Ok(ApplyThreads { lanes, threads })
    }

    /// The default size of a group: half the cores (the other half is left to the intake,
    /// QUIC and reads), at least two: the store prepares one batch while the one before it
    /// commits, which takes a second thread. On 2 cores two threads kept up with 10-20 %
    /// more transactions per second than one, with a lower safe-time lag (`BENCHMARKS.md`).
    pub fn default_count() -> usize {
        std::thread::available_parallelism().map_or(2, |n| (n.get() / 2).max(2))
    }

    /// During a catch-up — a thread's last round applied full batches (the received logs
    /// are ahead of it) while `activity` says shippers are sending a backlog (large frames)
    /// — the thread holds its rounds back, each time by at most `max`: durable receipt (what a
    /// disaster would lose) gets the CPU first, and the target's safe time follows when the
    /// burst is over, or every `max` during a long one. Between holds a thread applies one
    /// full batch (its round ends there; the next starts at the following tablet). A thread
    /// that keeps up (partial batches) never holds back, nor while a tablet is being stopped.
    /// `max` zero: never. Set once; later calls change nothing.
    pub fn yield_to_intake(&self, activity: Arc<IntakeActivity>, max: Duration) {
        if max.is_zero() {
            return;
        }
        for l in &self.lanes {
            let _ = l.yield_to.set((activity.clone(), max));
            l.wake.bell.ring();
        }
    }

    /// Whether and how long the threads held back for catch-ups (`/v1/status`
    /// `apply_yield`, metrics).
    pub fn yield_status(&self) -> YieldStatus {
        YieldStatus {
            limit: self
                .lanes
                .first()
                .and_then(|l| l.yield_to.get())
                .map(|(_, d)| *d),
            holding_threads: self
                .lanes
                .iter()
                .filter(|l| l.holding.load(Ordering::Relaxed))
                .count(),
            held_total: Duration::from_nanos(
                self.lanes
                    .iter()
                    .map(|l| l.held_ns.load(Ordering::Relaxed))
                    .sum(),
            ),
        }
    }

    /// The running thread with the fewest tablets (an ended one only if all have ended).
    pub(super) fn pick(&self) -> Arc<Lane> {
        self.lanes
            .iter()
            .min_by_key(|l| {
                (
                    l.wake.exited.load(Ordering::Acquire),
                    l.tablets.load(Ordering::Relaxed),
                )
            })
            .cloned()
            .unwrap_or_else(|| unreachable!("an ApplyThreads has at least one lane"))
    }
}

impl Drop for ApplyThreads {
    fn drop(&mut self) {
        for l in &self.lanes {
            l.shutdown.store(true, Ordering::Release);
            l.wake.bell.ring();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// An apply thread: one step per tablet per round, asleep only after a round without work.
fn lane_main(lane: &Lane) {
    let mut tablets: Vec<TabletLoop> = Vec::new();
    // How long the rounds have been held back for the intake, and whether the last round
    // applied a full batch (more was waiting).
    let mut held = Duration::ZERO;
    let mut behind = false;
    loop {
        tablets.append(&mut lane.inbox.lock().unwrap_or_else(|p| p.into_inner()));
        let shutdown = lane.shutdown.load(Ordering::Acquire);
        if let Some((activity, max)) = lane.yield_to.get() {
            let stopping = shutdown || tablets.iter().any(|t| t.sh.stop.load(Ordering::Acquire));
            if behind && !stopping && held < *max && activity.catching_up() {
                // Each durable group of the intake rings the bell: the state is looked at
                // again then, or after YIELD_CHECK at the latest.
                let t0 = Instant::now();
                lane.holding.store(true, Ordering::Relaxed);
                lane.wake.bell.wait((*max - held).min(YIELD_CHECK), || {
                    lane.shutdown.load(Ordering::Acquire)
                });
                let waited = t0.elapsed();
                held += waited;
                lane.held_ns
                    .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
                continue;
            }
            held = Duration::ZERO;
            lane.holding.store(false, Ordering::Relaxed);
        }
        let mut worked = false;
        behind = false;
        let mut sleep = Duration::from_secs(1);
        // During a catch-up a round ends at its first full batch, and the next one starts
        // at the tablet after it: a thread that is behind does one batch between holds,
        // not one per tablet (its first round, before it knew, cost up to eight).
        let catch_up = !shutdown
            && lane
                .yield_to
                .get()
                .is_some_and(|(activity, _)| activity.catching_up());
        let mut cut: Option<usize> = None;
        let mut kept = 0usize;
        tablets.retain_mut(|t| {
            if cut.is_some() {
                return true;
            }
            if shutdown || t.sh.stop.load(Ordering::Acquire) {
                t.finish(Ok(()), &lane.tablets);
                return false;
            }
            let span = t.span.clone();
            let _e = span.enter();
            let stepped = {
                let _a = Applying::enter(&t.sh.tablet);
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.step()))
            };
            match stepped {
                Ok(Ok(Step::Worked { full })) => {
                    worked = true;
                    behind |= full;
                    kept += 1;
                    if full && catch_up {
                        cut = Some(kept);
                    }
                    true
                }
                Ok(Ok(Step::Idle(within))) => {
                    sleep = sleep.min(within);
                    kept += 1;
                    true
                }
                Ok(Err(e)) if e.is_retryable() => {
                    // A full disk: nothing of the batch took effect; tried again later.
                    sleep = sleep.min(t.hold(e));
                    kept += 1;
                    true
                }
                Ok(Err(e)) => {
                    t.finish(Err(e), &lane.tablets);
                    false
                }
                Err(p) => {
                    // The panic hook has logged it. What the store holds in memory for the
                    // batch may be half-changed: received-log retention stops trusting it.
                    t.store.mark_cache_incomplete();
                    let e = Error::Panicked {
                        tablet: t.sh.tablet.clone(),
                        from: t.sh.applied_pos.load(),
                        message: Error::panic_message(&*p),
                    };
                    t.finish(Err(e), &lane.tablets);
                    false
                }
            }
        });
        if let Some(next) = cut {
            let n = tablets.len();
            tablets.rotate_left(next % n);
        }
        if shutdown {
            return;
        }
        if !worked {
            lane.wake
                .bell
                .wait(sleep, || lane.shutdown.load(Ordering::Acquire));
        }
    }
}
