//! [`Applier`] and [`ApplierOptions`]: opening the target side, recovery, pause and
//! shutdown, and the parts every other call of the front door reaches through
//! ([`Applier::store`], [`Applier::consistency`], [`Applier::intake`]). The other files of
//! `node/` add their calls to [`Applier`] (docs/ARCHITECTURE.md, "The applier's front
//! door").

use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidelog_wal::{HybridTime, TabletId, WalPos};

use crate::apply::{ApplyThreads, ReceivedReads};
use crate::binlog::Retention;
use crate::consistency::Consistency;
use crate::cutover::{self, Cleanup};
use crate::intake::{DurableHook, Intake, IntakeOptions};
use crate::retention::{ReceivedRetention, RETENTION_INTERVAL};
use crate::store::{Cutover, Store, StoreOptions};
use tidelog_net::tls::TlsMaterial;

use super::error::{Error, Result};
use super::waiters::WaitLimit;
use super::warm::{self, WarmState};
use super::workers;

/// Everything [`Applier::open`] needs.
#[derive(Debug)]
pub struct ApplierOptions {
    /// The QUIC intake and its received logs (`listen`, `data-dir`, `sync`, …).
    pub intake: IntakeOptions,
    /// The intake's certificates and key.
    pub tls: TlsMaterial,
    /// The store's block cache and memtable bound.
    pub store: StoreOptions,
    /// The safe time stays uninitialized until each of these has reported.
    pub expect_tablets: Vec<TabletId>,
    /// Apply threads the tablets are spread over.
    pub apply_threads: usize,
    /// Nice value of the apply and safe-time threads, and of the store's workers.
    pub apply_nice: i32,
    pub store_nice: i32,
    /// The longest the apply threads hold back for a shipper's catch-up.
    pub apply_yield_to_intake: Duration,
    /// Consistent reads older than this are refused.
    pub max_staleness: Duration,
    /// How long the binlog keeps commits.
    pub binlog_retention: Duration,
    /// The most requests that may wait on the safe time at once.
    pub max_waiters: usize,
}

/// The running applier. Cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct Applier {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) opts: Settings,
    pub(super) store: Arc<Store>,
    pub(super) consistency: Arc<Consistency>,
    pub(super) intake: Intake,
    pub(super) workers: Arc<workers::Workers>,
    /// The cutover found at open (a promoted target), to clean up after in `recover`.
    pub(super) cutover: Option<Cutover>,
    /// `store-nice` applied: how many store workers got it (`Err`: why not).
    pub(super) store_nice: std::result::Result<usize, String>,
    /// The cutover's background clean-up, once started.
    pub(super) cleanup: Mutex<Option<Cleanup>>,
    /// Serializes `promote`.
    pub(super) promote_lock: tokio::sync::Mutex<()>,
    /// `trx_status` answers given, by state (in `TrxState::ALL` order).
    pub(super) trx_lookups: [AtomicU64; 4],
    /// Pre-loading the look-up indexes ([`WarmState`]).
    pub(super) lookup_cache: Arc<AtomicU8>,
    pub(super) waiters: WaitLimit,
    /// Binlog and received-log retention, once recovered; stopped when dropped.
    pub(super) retention: Mutex<Option<(Retention, ReceivedRetention)>>,
}

/// The options kept after open (all but the TLS material).
#[derive(Debug)]
pub(super) struct Settings {
    pub(super) intake: IntakeOptions,
    pub(super) store: StoreOptions,
    pub(super) apply_nice: i32,
    pub(super) store_nice: i32,
    pub(super) max_staleness: Duration,
    pub(super) binlog_retention: Duration,
}

impl Applier {
    /// Opens the store (recovering the received logs first: the undecided transactions,
    /// and the late intents of committed ones, live there and in memory only), finishes a
    /// cutover a crash interrupted, starts the safe time, the apply threads and the QUIC
    /// intake. A promoted target stays promoted: safe time frozen at the cut, shippers
    /// refused, nothing applied. Call [`Applier::recover`] next.
    pub async fn open(opts: ApplierOptions) -> Result<Applier> {
        let data_dir = opts.intake.data_dir.clone();
        std::fs::create_dir_all(&data_dir).map_err(|e| {
            Error::Other(
                anyhow::Error::new(e).context(format!("creating data-dir {}", data_dir.display())),
            )
        })?;
        let (d2, o2, so) = (data_dir.clone(), opts.intake.clone(), opts.store);
        let store = Arc::new(
            blocking(move || -> Result<Store> {
                crate::intake::recover_received_logs(&o2).map_err(Error::Other)?;
                Ok(Store::open_with(&d2, &so)?)
            })
            .await??,
        );
        let store_nice = set_store_nice(&store, opts.store_nice);
        let s1 = store.clone();
        let cutover = blocking(move || -> Result<Option<Cutover>> {
            match s1.cutover()? {
                Some(c) => Ok(Some(cutover::finish(&s1, c)?)),
                None => Ok(None),
            }
        })
        .await??;
        let (s2, expect) = (store.clone(), opts.expect_tablets.clone());
        let cut = cutover.as_ref().map(|c| c.cut);
        let nice = opts.apply_nice;
        let consistency = blocking(move || match cut {
            Some(cut) => Consistency::frozen(s2, expect, cut),
            None => Consistency::start_with_nice(s2, expect, nice),
        })
        .await??;
        let received = data_dir.join("received");
        let reads = ReceivedReads::for_logs(&received, opts.intake.direct_io);
        let threads = ApplyThreads::with_nice(opts.apply_threads, "apply", opts.apply_nice)?;
        let workers = Arc::new(workers::Workers::new(
            store.clone(),
            consistency.clone(),
            received,
            reads,
            threads,
            cutover.is_some(),
        ));
        let w2 = workers.clone();
        let hook: DurableHook = Arc::new(move |t: &TabletId, p: WalPos| w2.ensure(t, p));
        let intake =
            Intake::start(opts.intake.clone(), opts.tls, Some(hook)).map_err(Error::Other)?;
        let _ = workers.intake.set(intake.clone());
        workers
            .threads
            .yield_to_intake(intake.activity(), opts.apply_yield_to_intake);
        if let Some(c) = &cutover {
            intake.refuse(&refusal_reason(c.cut));
        }
        Ok(Applier {
            inner: Arc::new(Inner {
                opts: Settings {
                    intake: opts.intake,
                    store: opts.store,
                    apply_nice: opts.apply_nice,
                    store_nice: opts.store_nice,
                    max_staleness: opts.max_staleness,
                    binlog_retention: opts.binlog_retention,
                },
                store,
                consistency,
                intake,
                workers,
                cutover,
                store_nice,
                cleanup: Mutex::new(None),
                promote_lock: tokio::sync::Mutex::new(()),
                trx_lookups: Default::default(),
                lookup_cache: Arc::new(AtomicU8::new(WarmState::Empty as u8)),
                waiters: WaitLimit::new(opts.max_waiters),
                retention: Mutex::new(None),
            }),
        })
    }

    /// Recovery: applies whatever the received logs hold beyond the store's apply
    /// positions, up to the ends they have now, and lets the safe time cover it before
    /// anyone can read (the safe time is published before the store's fsync:
    /// [`Consistency::replayed`]); `progress` hears what it waits for. Then starts the
    /// background work: binlog and received-log retention, the look-up cache's warm-up,
    /// and a cutover's unfinished clean-up. A failed tablet is logged and shown by status;
    /// the applier runs anyway.
    pub async fn recover(&self, progress: impl Fn(&str) + Send + 'static) -> Result<()> {
        let known: Vec<(TabletId, WalPos)> = self
            .intake()
            .tablets()
            .iter()
            .map(|t| (t.tablet.clone(), t.received_pos()))
            .collect();
        progress(&format!(
            "recovering: re-applying the received logs of {} tablets",
            known.len()
        ));
        let w = self.inner.workers.clone();
        blocking(move || w.replay(&known, &progress)).await?;
        let store = self.store();
        if self.inner.cutover.as_ref().is_some_and(|c| !c.cleaned) {
            *self.inner.cleanup.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(Cleanup::start(store.clone())?);
        }
        let retention = Retention::start(
            store.clone(),
            self.consistency().clone(),
            self.inner.opts.binlog_retention,
        )?;
        // Releases what applying will not read again, so the received logs' writers
        // delete it.
        let received = ReceivedRetention::start(
            store.clone(),
            &self.inner.opts.intake.data_dir.join("received"),
            RETENTION_INTERVAL,
        )?;
        *self
            .inner
            .retention
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((retention, received));
        warm::warm_lookup_cache(
            store.clone(),
            self.inner.opts.store.cache_size,
            self.inner.lookup_cache.clone(),
        );
        Ok(())
    }

    /// Stops (`true`) or restarts intake of one tablet or of all. A pause returns once a
    /// group the intake's writer had begun is written. Refused on a promoted target, which
    /// takes no shipped logs at all. Blocking.
    pub fn pause(&self, tablet: Option<&TabletId>, paused: bool) -> Result<()> {
        if let Some(cut) = self.consistency().cut() {
            let what = if paused { "pause" } else { "resume" };
            return Err(Error::Promoted { what, cut });
        }
        self.intake()
            .set_paused(tablet, paused)
            .map_err(|e| Error::Invalid(format!("{e:#}")))
    }

    /// The graceful stop: the intake writes its queued frames and closes, the apply
    /// workers and the safe-time publisher stop, the cutover clean-up (if any) stops
    /// between two steps (its cursor is persisted, a restart continues), the store is
    /// persisted, and retention stops.
    pub async fn shutdown(&self) -> Result<()> {
        self.intake().shutdown().await;
        let a = self.clone();
        blocking(move || {
            a.inner.workers.stop_all();
            a.consistency().stop();
            drop(
                a.inner
                    .cleanup
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take(),
            );
            if let Err(e) = a.store().persist() {
                tracing::error!("persisting the store: {e}");
            }
            drop(
                a.inner
                    .retention
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take(),
            );
        })
        .await
    }

    /// The store (for what the calls above do not cover: tests, tools).
    pub fn store(&self) -> &Arc<Store> {
        &self.inner.store
    }

    /// The safe-time machinery.
    pub fn consistency(&self) -> &Arc<Consistency> {
        &self.inner.consistency
    }

    /// The QUIC intake.
    pub fn intake(&self) -> &Intake {
        &self.inner.intake
    }
}

/// Applies `store-nice` to the store's background workers; a refusal is logged and
/// otherwise ignored (it costs throughput, not the applier), as `apply-nice`.
fn set_store_nice(store: &Store, nice: i32) -> std::result::Result<usize, String> {
    if nice == 0 {
        return Ok(0);
    }
    match store.set_background_nice(nice) {
        Ok(0) => {
            tracing::warn!(
                nice,
                "store-nice: no store worker threads (named {}) found to set",
                crate::store::WORKER_THREAD
            );
            Ok(0)
        }
        Ok(n) => {
            tracing::info!(
                nice,
                threads = n,
                "store workers' nice value set (store-nice)"
            );
            Ok(n)
        }
        Err(e) => {
            tracing::warn!(
                nice,
                error = %e,
                "cannot set the store workers' nice value (store-nice): below the process's it \
                 needs CAP_SYS_NICE or a LimitNICE= that allows it"
            );
            Err(e.to_string())
        }
    }
}

/// Why shippers are refused once the target is promoted.
pub(super) fn refusal_reason(cut: HybridTime) -> String {
    format!(
        "this target was promoted to primary at cut {cut} (cutover); it accepts no shipped logs"
    )
}

/// Runs `f` on the blocking pool; a task that panicked is an error.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Other(anyhow::anyhow!("{e}")))
}
