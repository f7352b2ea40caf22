//! The apply workers, one per tablet, created when a tablet first shows up (its first
//! durable frame, or a shipper announcing it), and the start-up replay of the received
//! logs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tidelog_wal::{TabletId, WalPos};

use crate::apply::{ApplyConfig, ApplyThreads, ApplyWorker, ReceivedReads};
use crate::consistency::Consistency;
use crate::intake::Intake;
use crate::store::Store;

/// After the start-up replay, how long the safe time may take to cover it.
const REPLAY_PUBLISH_WITHIN: Duration = Duration::from_secs(30);

/// The registry of apply workers.
#[derive(Debug)]
pub(crate) struct Workers {
    store: Arc<Store>,
    consistency: Arc<Consistency>,
    received: PathBuf,
    workers: Mutex<BTreeMap<TabletId, ApplyWorker>>,
    /// Set by a cutover (or at start on a primary): no worker starts any more.
    closed: AtomicBool,
    /// applied_records of each tablet when its worker started in this process: with the
    /// records the worker applied from before the intake opened the log
    /// (`ApplyWorker::records_below`) and those the intake received since, every record
    /// ever received (`received_records`).
    base_records: Mutex<BTreeMap<TabletId, u64>>,
    /// The intake, once started: where it opened each received log.
    pub(crate) intake: OnceLock<Intake>,
    /// The apply threads the tablets are spread over (`apply-threads`).
    pub(crate) threads: Arc<ApplyThreads>,
    /// How the apply workers read the received logs.
    reads: ReceivedReads,
}

impl Workers {
    pub(crate) fn new(
        store: Arc<Store>,
        consistency: Arc<Consistency>,
        received: PathBuf,
        reads: ReceivedReads,
        threads: ApplyThreads,
        closed: bool,
    ) -> Workers {
        Workers {
            store,
            consistency,
            received,
            reads,
            workers: Mutex::new(BTreeMap::new()),
            closed: AtomicBool::new(closed),
            base_records: Mutex::new(BTreeMap::new()),
            intake: OnceLock::new(),
            threads: Arc::new(threads),
        }
    }

    /// Starts tablet `t`'s worker unless it runs (then wakes it). `received` is the end of
    /// its received log as the caller knows it, the end the intake opened it at when the
    /// intake is not known yet (only at start, before any frame arrived).
    pub(crate) fn ensure(&self, t: &TabletId, received: WalPos) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let mut w = self.workers();
        if let Some(worker) = w.get(t) {
            worker.notify();
            return;
        }
        if let Err(e) = self.store.register_tablet(t) {
            tracing::error!(tablet = %t, "registering the tablet: {e}");
        }
        let base = self
            .store
            .tablet(t)
            .ok()
            .flatten()
            .map_or(0, |m| m.applied_records);
        self.base_records().insert(t.clone(), base);
        self.consistency.register_tablet(t);
        let opened_at = match self.intake.get() {
            Some(i) => i.tablet(t).map_or(WalPos::ZERO, |ti| ti.opened_at()),
            None => received,
        };
        let cfg = ApplyConfig {
            consistency: Some(self.consistency.clone()),
            threads: Some(self.threads.clone()),
            reads: self.reads,
            count_below: opened_at,
            ..ApplyConfig::default()
        };
        match ApplyWorker::start(self.store.clone(), &self.received, t.clone(), cfg) {
            Ok(worker) => {
                worker.notify();
                w.insert(t.clone(), worker);
            }
            Err(e) => tracing::error!(tablet = %t, "starting the apply worker: {e}"),
        }
    }

    /// Starts the workers of the tablets in `ends` and waits until they have applied their
    /// received logs to those ends and the safe time covers it
    /// ([`Consistency::replayed`]); `progress` hears each tablet it waits for. A failure
    /// is logged: the applier starts anyway, its status showing the tablet's error.
    /// Nothing to do on a promoted target (no workers, the safe time frozen at the cut).
    pub(crate) fn replay(&self, ends: &[(TabletId, WalPos)], progress: &dyn Fn(&str)) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        for (t, end) in ends {
            self.ensure(t, *end);
        }
        let replaying: Vec<_> = {
            let w = self.workers();
            ends.iter()
                .filter_map(|(t, end)| w.get(t).map(|w| (w.progress(), *end)))
                .collect()
        };
        let behind: u64 = replaying
            .iter()
            .map(|(p, end)| end.0.saturating_sub(p.applied_pos().0))
            .sum();
        let t0 = std::time::Instant::now();
        let consistency = &self.consistency;
        let r = consistency.replayed(&replaying, REPLAY_PUBLISH_WITHIN, |p, end| {
            let msg = format!(
                "recovering: re-applying tablet {} ({} of {end})",
                p.tablet(),
                p.applied_pos()
            );
            tracing::info!("{msg}");
            progress(&msg);
        });
        match r {
            Ok(()) => tracing::info!(
                bytes = behind,
                took_ms = t0.elapsed().as_millis() as u64,
                safe_time = %consistency.safe_time().map_or_else(|| "uninitialized".to_string(), |s| s.to_string()),
                "received logs re-applied"
            ),
            Err(e) => tracing::error!("recovery: {e}; starting anyway"),
        }
    }

    /// The apply workers by tablet.
    pub(crate) fn workers(&self) -> MutexGuard<'_, BTreeMap<TabletId, ApplyWorker>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// See `base_records`.
    pub(crate) fn base_records(&self) -> MutexGuard<'_, BTreeMap<TabletId, u64>> {
        self.base_records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops every worker; none starts from then on (a cutover, the shutdown).
    pub(crate) fn stop_all(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let mut w = self.workers();
        for (t, worker) in w.iter_mut() {
            if let Err(e) = worker.stop() {
                tracing::error!(tablet = %t, "apply worker stopped with: {e}");
            }
        }
    }
}
