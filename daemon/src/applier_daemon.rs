//! `tidelog apply --config F`: the applier daemon. Wires the QUIC intake (received logs), the
//! apply workers (fjall store) and the admin API on the Unix socket, and runs them the way
//! systemd expects: `READY=1` only after recovery, watchdog pings, `STATUS=` lines, and on
//! SIGTERM/SIGINT a clean stop (intake closed, queued frames written and synced, workers
//! stopped, store persisted, QUIC closed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tidelog_applier::apply::{ApplyConfig, ApplyThreads, ApplyWorker, ReceivedReads};
use tidelog_applier::binlog::Retention;
use tidelog_applier::consistency::Consistency;
use tidelog_applier::cutover::{self, Cleanup};
use tidelog_applier::intake::{DurableHook, Intake, IntakeOptions, TabletState};
use tidelog_applier::retention::{ReceivedRetention, RETENTION_INTERVAL};
use tidelog_applier::store::Cutover;
use tidelog_applier::store::Store;
use tidelog_applier::trx::{TrxQuery, TrxState, TrxStatus};
use tidelog_net::tls::TlsMaterial;
use tidelog_wal::{Gtid, HybridTime, TabletId, WalPos};

use crate::admin::{self, ApiError, ApiQuery, JsonBytes};
use crate::config::{self, ApplierConfig};
use crate::signals::Signals;
use crate::{metrics, notify, preflight, service};

/// After the start-up replay, how long the safe time may take to cover it.
const REPLAY_PUBLISH_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// A graceful stop that takes longer exits at once (the unit's TimeoutStopSec is 60 s).
const STOP_BOUND: std::time::Duration = std::time::Duration::from_secs(50);

/// Runs the applier until SIGTERM/SIGINT. With `check`, does what start-up does before its
/// first side effect ([`preflight`]) and exits.
pub fn run(config_path: &Path, check: bool) -> Result<()> {
    let cfg = config::check_applier(config_path)?;
    let (tls, warnings) = preflight(&cfg).map_err(|e| config::named(config_path, &e))?;
    config::report_warnings(config_path, &warnings, check);
    if check {
        println!("{}: ok", config_path.display());
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.effective_runtime_threads())
        .thread_name("applier")
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(serve(cfg, tls))
}

/// Everything a start would refuse, found without side effects: all `--check` does after
/// parsing, and the first thing a start does, so the two cannot drift. Loads `[tls]`
/// ([`TlsMaterial::load`]) and builds the QUIC server config the intake will build
/// from it; checks the intake's options as its received logs' writers will
/// (`segment-size`), `data-dir` a directory it can write or make (and a QUIC reset key
/// there readable), the `listen` and `metrics-listen` addresses free, and the admin socket
/// bindable ([`admin::check_bind`]). The error names the key (`key "tls.key": …`), also
/// for a certificate that expired or is not valid yet; the warnings are a private key
/// others can read and a certificate that expires within 30 days.
fn preflight(cfg: &ApplierConfig) -> Result<(TlsMaterial, Vec<String>)> {
    let (tls, warnings) = TlsMaterial::load_checked(&cfg.tls.files())?;
    tidelog_net::tls::server_config(&tls, &cfg.quic.tuning()).context("[tls]")?;
    intake_options(cfg)
        .validate()
        .context("key \"segment-size\"")?;
    preflight::writable_dir("data-dir", &cfg.data_dir)?;
    tidelog_applier::endpoint::check_reset_key(&cfg.data_dir).context("key \"data-dir\"")?;
    preflight::udp_free("listen", cfg.listen)?;
    if let Some(addr) = cfg.metrics_listen {
        preflight::tcp_free("metrics-listen", addr)?;
    }
    admin::check_bind(&cfg.admin_socket)?;
    Ok((tls, warnings))
}

/// The intake's options from the config (its TLS material apart).
fn intake_options(cfg: &ApplierConfig) -> IntakeOptions {
    let mut opts = IntakeOptions::new(cfg.listen, cfg.data_dir.clone());
    opts.sync = cfg.sync;
    opts.segment_size = cfg.segment_size;
    opts.direct_io = cfg.received_direct_io;
    opts.direct_io_in_catch_up = cfg.received_direct_io_in_catch_up;
    opts.applier_id = format!("tidelog-applier@{}", config::default_shipper_id());
    opts.quic = cfg.quic.tuning();
    opts.max_clock_skew = cfg.max_clock_skew;
    opts.ca_file = Some(cfg.tls.ca.clone());
    opts
}

/// The apply workers, one per tablet, created when a tablet first shows up.
#[derive(Debug)]
pub struct Appliers {
    store: Arc<Store>,
    consistency: Arc<Consistency>,
    received: PathBuf,
    workers: Mutex<BTreeMap<TabletId, ApplyWorker>>,
    /// Set by a cutover (or at start on a primary): no worker starts any more.
    closed: std::sync::atomic::AtomicBool,
    /// applied_records of each tablet when its worker started in this process: with the
    /// records the worker applied from before the intake opened the log
    /// (`ApplyWorker::records_below`) and those the intake received since, every record
    /// ever received (`received_records`).
    base_records: Mutex<BTreeMap<TabletId, u64>>,
    /// The intake, once started: where it opened each received log.
    intake: std::sync::OnceLock<Intake>,
    /// The apply threads the tablets are spread over (`apply-threads`).
    pub(crate) threads: Arc<ApplyThreads>,
    /// How the apply workers read the received logs.
    reads: ReceivedReads,
}

impl Appliers {
    /// Starts tablet `t`'s worker unless it runs (then wakes it). `received` is the end of
    /// its received log as the caller knows it, the end the intake opened it at when the
    /// intake is not known yet (only at start, before any frame arrived).
    fn ensure(&self, t: &TabletId, received: WalPos) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let mut w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
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
        self.base_records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(t.clone(), base);
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
    /// ([`Consistency::replayed`]). A failure is logged: the daemon starts anyway, its
    /// status showing the tablet's error. Nothing to do on a promoted target (no workers,
    /// the safe time frozen at the cut).
    fn replay(&self, ends: &[(TabletId, WalPos)], consistency: &Consistency) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        for (t, end) in ends {
            self.ensure(t, *end);
        }
        let progress: Vec<_> = {
            let w = self.workers();
            ends.iter()
                .filter_map(|(t, end)| w.get(t).map(|w| (w.progress(), *end)))
                .collect()
        };
        let behind: u64 = progress
            .iter()
            .map(|(p, end)| end.0.saturating_sub(p.applied_pos().0))
            .sum();
        let t0 = std::time::Instant::now();
        let r = consistency.replayed(&progress, REPLAY_PUBLISH_WITHIN, |p, end| {
            let msg = format!(
                "recovering: re-applying tablet {} ({} of {end})",
                p.tablet(),
                p.applied_pos()
            );
            tracing::info!("{msg}");
            notify::status(&msg);
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

    /// The apply workers by tablet (for metrics and the watchdog's liveness check).
    pub(crate) fn workers(&self) -> std::sync::MutexGuard<'_, BTreeMap<TabletId, ApplyWorker>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stop_all(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let mut w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        for (t, worker) in w.iter_mut() {
            if let Err(e) = worker.stop() {
                tracing::error!(tablet = %t, "apply worker stopped with: {e}");
            }
        }
    }
}

/// Everything the admin handlers read.
#[derive(Debug, Clone)]
pub struct ApplierState {
    pub intake: Intake,
    pub appliers: Arc<Appliers>,
    pub store: Arc<Store>,
    pub consistency: Arc<Consistency>,
    pub max_staleness: std::time::Duration,
    /// `trx_status` answers given, by state (in `TrxState::ALL` order).
    pub trx_lookups: Arc<[AtomicU64; 4]>,
    /// Serializes `POST /v1/promote`.
    pub promote_lock: Arc<tokio::sync::Mutex<()>>,
    /// The cutover's background clean-up, once started.
    pub cleanup: Arc<Mutex<Option<Cleanup>>>,
    /// Pre-loading the look-up indexes into the block cache ([`WarmState`]).
    pub lookup_cache: Arc<std::sync::atomic::AtomicU8>,
    pub cache_size: u64,
    /// The configuration, for the memory bound `/v1/status` reports.
    pub config: Arc<crate::config::ApplierConfig>,
    /// `apply-nice` as configured.
    pub apply_nice: i32,
    /// `store-nice` as configured, and how many store workers got it (`Err`: why not).
    pub store_nice: (i32, Result<usize, String>),
    /// `received-direct-io` as configured.
    pub received_direct_io: bool,
    /// `received-direct-io-in-catch-up` as configured.
    pub received_direct_io_in_catch_up: bool,
    /// Places for requests that wait on the safe time ([`admin::MAX_WAITERS`]).
    pub waiters: admin::WaitLimit,
}

/// Where pre-loading the `trx_status` look-up indexes stands (`/v1/status` `lookup_cache`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum WarmState {
    /// Nothing to load (an empty binlog).
    Empty = 0,
    Loading = 1,
    Loaded = 2,
    /// Larger than 3/4 of `cache-size`: not loaded.
    TooLarge = 3,
    Failed = 4,
}

impl WarmState {
    fn name(v: u8) -> &'static str {
        match v {
            0 => "empty",
            1 => "loading",
            2 => "loaded",
            3 => "too-large",
            _ => "failed",
        }
    }
}

async fn serve(cfg: ApplierConfig, tls: TlsMaterial) -> Result<()> {
    // Before anything slow: a SIGTERM from now on is handled, never the default kill.
    let mut signals = Signals::install()?;
    notify::status("recovering: opening the store and the received logs");
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("creating data-dir {}", cfg.data_dir.display()))?;
    let opts = intake_options(&cfg);
    let (data_dir, o2) = (cfg.data_dir.clone(), opts.clone());
    let store_opts = tidelog_applier::store::StoreOptions {
        cache_size: cfg.cache_size,
        write_buffer_size: cfg.write_buffer_size,
    };
    // Opening reads the retained received logs once (the undecided transactions, and the
    // late intents of committed ones, live there and in memory only): recovered first, as
    // the intake will write them on.
    let store = Arc::new(
        tokio::task::spawn_blocking(move || -> Result<Store> {
            tidelog_applier::intake::recover_received_logs(&o2)?;
            Ok(Store::open_with(&data_dir, &store_opts)?)
        })
        .await
        .context("opening the store")??,
    );
    let store_nice = (cfg.store_nice, set_store_nice(&store, cfg.store_nice));
    // A promoted target stays promoted: safe time frozen at the cut, no intake, no apply;
    // a cutover interrupted by a crash is finished first.
    let s1 = store.clone();
    let cutover = tokio::task::spawn_blocking(move || -> Result<Option<Cutover>> {
        match s1.cutover()? {
            Some(c) => Ok(Some(cutover::finish(&s1, c)?)),
            None => Ok(None),
        }
    })
    .await
    .context("resuming the cutover")??;
    let (s2, expect) = (store.clone(), cfg.expect_tablets.clone());
    let cut = cutover.as_ref().map(|c| c.cut);
    let nice = cfg.apply_nice;
    let consistency = tokio::task::spawn_blocking(move || match cut {
        Some(cut) => Consistency::frozen(s2, expect, cut),
        None => Consistency::start_with_nice(s2, expect, nice),
    })
    .await
    .context("starting safe time")??;
    let received = cfg.data_dir.join("received");
    let reads = ReceivedReads::for_logs(&received, cfg.received_direct_io);
    let appliers = Arc::new(Appliers {
        store: store.clone(),
        consistency: consistency.clone(),
        received,
        reads,
        workers: Mutex::new(BTreeMap::new()),
        closed: std::sync::atomic::AtomicBool::new(cutover.is_some()),
        base_records: Mutex::new(BTreeMap::new()),
        intake: std::sync::OnceLock::new(),
        threads: Arc::new(ApplyThreads::with_nice(
            cfg.effective_apply_threads(),
            "apply",
            cfg.apply_nice,
        )?),
    });
    let a2 = appliers.clone();
    let hook: DurableHook = Arc::new(move |t: &TabletId, p: WalPos| a2.ensure(t, p));
    let intake = Intake::start(opts, tls, Some(hook))?;
    let _ = appliers.intake.set(intake.clone());
    appliers
        .threads
        .yield_to_intake(intake.activity(), cfg.apply_yield_to_intake);
    if let Some(c) = &cutover {
        intake.refuse(&refusal_reason(c.cut));
    }
    // Recovery: apply whatever the received logs hold beyond the store's apply positions,
    // up to the ends they have now, and let the safe time cover it before anyone can read
    // (the safe time is published before the store's fsync: `Consistency::replayed`).
    let known: Vec<(TabletId, WalPos)> = intake
        .tablets()
        .iter()
        .map(|t| (t.tablet.clone(), t.received_pos()))
        .collect();
    notify::status(&format!(
        "recovering: re-applying the received logs of {} tablets",
        known.len()
    ));
    let (a3, c3) = (appliers.clone(), consistency.clone());
    let replay = tokio::task::spawn_blocking(move || a3.replay(&known, &c3));
    match signals.unless_stopped(replay).await {
        Some(r) => r.context("recovery")?,
        None => {
            notify::stopping();
            stop_pipeline(&intake, &appliers, &consistency, &store, None).await?;
            tracing::info!("applier stopped");
            return Ok(());
        }
    }
    let state = ApplierState {
        intake: intake.clone(),
        appliers: appliers.clone(),
        store: store.clone(),
        consistency: consistency.clone(),
        max_staleness: cfg.max_staleness,
        trx_lookups: Arc::new(Default::default()),
        promote_lock: Arc::new(tokio::sync::Mutex::new(())),
        cleanup: Arc::new(Mutex::new(None)),
        lookup_cache: Arc::new(std::sync::atomic::AtomicU8::new(WarmState::Empty as u8)),
        cache_size: cfg.cache_size,
        config: Arc::new(cfg.clone()),
        apply_nice: cfg.apply_nice,
        store_nice,
        received_direct_io: cfg.received_direct_io,
        received_direct_io_in_catch_up: cfg.received_direct_io_in_catch_up,
        waiters: admin::WaitLimit::default(),
    };
    if cutover.as_ref().is_some_and(|c| !c.cleaned) {
        *state.cleanup.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Cleanup::start(store.clone())?);
    }
    let _retention = Retention::start(store.clone(), consistency.clone(), cfg.binlog_retention)?;
    // Releases what applying will not read again, so the received logs' writers delete it.
    let _received_retention = ReceivedRetention::start(
        store.clone(),
        &cfg.data_dir.join("received"),
        RETENTION_INTERVAL,
    )?;
    warm_lookup_cache(store.clone(), cfg.cache_size, state.lookup_cache.clone());
    let cleanup = state.cleanup.clone();
    let stop = admin::StopSignal::new();
    let stopped = || stop.stopped();
    // Bound before READY=1: `tidelog ctl` works as soon as systemd says the unit started.
    let listener = admin::bind(&cfg.admin_socket).await?;
    let socket = cfg.admin_socket.clone();
    let (st2, admin_stop) = (state.clone(), stopped());
    let mut admin_task = tokio::spawn(async move {
        admin::serve_bound(listener, &socket, router(st2), admin_stop).await
    });
    if let Some(addr) = cfg.metrics_listen {
        let r = metrics::metrics_only(get(metrics), state.clone());
        metrics::serve_tcp(addr, r, stopped()).await?;
    }
    tracing::info!(listen = %intake.local_addr()?, data_dir = %cfg.data_dir.display(), "applier ready");
    notify::ready();
    let st3 = state.clone();
    let _watchdog = notify::spawn_watchdog(move |limit| service::applier_liveness(&st3, limit));
    let st4 = state.clone();
    let status_task = notify::spawn_status(service::STATUS_INTERVAL, move || {
        service::applier_status(&st4)
    });
    let admin_failed = signals.first(&mut admin_task).await?;
    signals.during_stop(STOP_BOUND);
    notify::stopping();
    if let Some(t) = status_task {
        t.abort();
    }
    notify::status("stopping: writing queued frames");
    stop_pipeline(&intake, &appliers, &consistency, &store, Some(cleanup)).await?;
    stop.stop();
    if let Some(e) = admin_failed {
        return Err(e);
    }
    // Let the admin server finish its requests and remove the socket.
    if let Ok(Ok(Err(e))) =
        tokio::time::timeout(std::time::Duration::from_secs(5), admin_task).await
    {
        tracing::warn!("admin API: {e:#}");
    }
    tracing::info!("applier stopped");
    Ok(())
}

/// The graceful stop of the data path: the intake writes its queued frames, the apply
/// workers and the safe-time publisher stop, the cutover clean-up (if any) stops between
/// two steps (its cursor is persisted, a restart continues), and the store is persisted.
async fn stop_pipeline(
    intake: &Intake,
    appliers: &Arc<Appliers>,
    consistency: &Arc<Consistency>,
    store: &Arc<Store>,
    cleanup: Option<Arc<Mutex<Option<Cleanup>>>>,
) -> Result<()> {
    intake.shutdown().await;
    let (a, c, s) = (appliers.clone(), consistency.clone(), store.clone());
    tokio::task::spawn_blocking(move || {
        a.stop_all();
        c.stop();
        if let Some(cleanup) = cleanup {
            drop(cleanup.lock().unwrap_or_else(|p| p.into_inner()).take());
        }
        if let Err(e) = s.persist() {
            tracing::error!("persisting the store: {e}");
        }
    })
    .await?;
    Ok(())
}

fn router(state: ApplierState) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/kv/{*key}", get(kv_get))
        .route("/v1/scan", get(scan))
        .route("/v1/safe-time", get(safe_time))
        .route("/v1/pause", post(pause))
        .route("/v1/resume", post(resume))
        .route("/v1/trx/{*trx_id}", get(trx_status))
        .route("/v1/trx/", get(trx_status))
        .route("/v1/binlog", get(binlog))
        .route("/v1/promote", post(promote))
        .route("/metrics", get(metrics))
        .with_state(state)
}

fn ht(h: HybridTime) -> String {
    h.0.to_string()
}

fn tablet_rows(s: &ApplierState) -> BTreeMap<String, Value> {
    let workers = s.appliers.workers.lock().unwrap_or_else(|p| p.into_inner());
    let base = s
        .appliers
        .base_records
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut rows = BTreeMap::new();
    for ti in s.intake.tablets() {
        let st = ti.status();
        let t = &ti.tablet;
        let meta = s.store.tablet(t).ok().flatten().unwrap_or_default();
        // Without a worker (a promoted target, or before it starts): as the store has it.
        let (applied, safe, fault, before_start) = match workers.get(t) {
            Some(w) => (
                w.applied_pos().0,
                w.safe_time(),
                w.fault(),
                w.records_below(),
            ),
            None => (meta.applied_pos.0, meta.safe_time, None, 0),
        };
        let applied_records = meta.applied_records;
        // Totals over the target's life, both: applied as stored; received = applied when
        // the worker started + applied since from before the intake opened the log + what
        // the intake received since.
        let received_records =
            base.get(t).copied().unwrap_or(applied_records) + before_start + st.records;
        let state = fault.as_ref().map_or(st.state, |f| f.state());
        rows.insert(
            t.to_string(),
            json!({
                "received_pos": st.received_pos,
                "applied_pos": applied,
                "safe_time": ht(safe),
                "received_safe_time": ht(HybridTime(st.safe_time)),
                "state": state,
                "lag_bytes": st.received_pos.saturating_sub(applied),
                "lag_records": received_records.saturating_sub(applied_records),
                "received_records": received_records,
                "applied_records": applied_records,
                // Received logs start at position 0: their end is every byte received.
                "received_bytes": st.received_pos,
                "shipper": st.shipper,
                "last_frame_ms_ago": st.last_frame_ms_ago,
                "error": fault.map(|f| f.to_string()).or(st.error),
            }),
        );
    }
    rows
}

async fn status(State(s): State<ApplierState>) -> Result<Json<Value>, ApiError> {
    let s2 = s.clone();
    let rows = blocking(move || tablet_rows(&s2)).await?;
    let rcvbuf = s.intake.udp_receive_buffer();
    // While the store is being reopened (after a full disk) status still answers: the
    // role from the safe time's state, no cutover details.
    let role = match s.store.role() {
        Ok(r) => r,
        Err(e) if e.is_retryable() && s.consistency.cut().is_some() => {
            tidelog_applier::store::Role::Primary
        }
        Err(e) if e.is_retryable() => tidelog_applier::store::Role::Standby,
        Err(e) => return Err(ApiError::internal(&e.into())),
    };
    let role = match role {
        tidelog_applier::store::Role::Primary => "primary",
        tidelog_applier::store::Role::Standby => "replica",
    };
    let safe = s.consistency.safe_time();
    let cutover = match s.store.cutover() {
        Ok(c) => c,
        Err(e) if e.is_retryable() => None,
        Err(e) => return Err(ApiError::internal(&e.into())),
    };
    let cutover = match cutover {
        None => Value::Null,
        Some(c) => {
            // The running clean-up's count, else the total its runs persisted.
            let running = s
                .cleanup
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map(|c| c.progress.removed.load(Ordering::Relaxed));
            let removed = match running {
                Some(n) => n,
                None => s
                    .store
                    .cutover_removed()
                    .map_err(|e| ApiError::internal(&e.into()))?,
            };
            json!({
                "cut_ht": ht(c.cut),
                "cut_time": rfc3339_us(c.cut_time_us),
                "cleanup_done": c.cleaned,
                "removed_versions": removed,
            })
        }
    };
    Ok(Json(json!({
        "role": role,
        "cutover": cutover,
        "store": store_json(&s.store),
        "safe_time": ht(safe.unwrap_or_default()),
        "safe_time_initialized": safe.is_some(),
        "listen": s.intake.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        "udp_receive_buffer": {"configured": rcvbuf.wanted, "bytes": rcvbuf.got},
        "lookup_cache": {
            "state": WarmState::name(s.lookup_cache.load(Ordering::Acquire)),
            "index_bytes": s.store.lookup_index_bytes(),
            "cache_size": s.cache_size,
        },
        "memory": memory_json(&s.store, &s.config, rows.len()),
        "apply_nice": apply_nice_json(s.apply_nice),
        "store_nice": store_nice_json(&s.store_nice),
        "apply_yield": apply_yield_json(&s.appliers.threads.yield_status()),
        "received_direct_io": {"configured": s.received_direct_io, "in_use": s.intake.direct_io()},
        "received_direct_io_in_catch_up": {
            "configured": s.received_direct_io_in_catch_up,
            "in_use": s.intake.direct_io_in_catch_up(),
        },
        // The async runtime's worker threads (`runtime-threads`), as the runtime has them.
        "runtime_threads": tokio::runtime::Handle::current().metrics().num_workers(),
        // Requests parked on the safe time (`wait-for`, a `trx_status` hint), and the cap.
        "admin_waiters": {"waiting": s.waiters.waiting(), "max": s.waiters.max()},
        "tablets": rows,
    })))
}

/// The store: where it lives, whether it takes writes (`ok`, `disk_full` naming the path,
/// `unavailable` while it is reopened after another failed write) and how often it was
/// reopened since start.
fn store_json(store: &Store) -> Value {
    let fault = store.fault();
    let state = match &fault {
        None => "ok",
        Some(e) if e.disk_full().is_some() => "disk_full",
        Some(_) => "unavailable",
    };
    json!({
        "path": store.path().display().to_string(),
        "state": state,
        "error": fault.map(|e| e.to_string()),
        "reopened": store.generation(),
    })
}

/// The process's resident size, the bound it is held below for this configuration and
/// number of tablets (`applier/STORE.md`, "Memory"), and what the store holds in memory.
fn memory_json(store: &Store, cfg: &crate::config::ApplierConfig, tablets: usize) -> Value {
    let m = store.memory();
    let bound = crate::memory::ApplierBound::of(cfg, tablets);
    let keyspaces: serde_json::Map<String, Value> = m
        .keyspaces
        .iter()
        .map(|k| {
            (
                k.name.to_string(),
                json!({
                    "memtable_bytes": k.memtables,
                    "active_memtable_bytes": k.active_memtable,
                    "sealed_memtables": k.sealed_memtables,
                    "old_versions": k.old_versions,
                    "pinned_filter_bytes": k.pinned_filters,
                    "pinned_index_bytes": k.pinned_indexes,
                }),
            )
        })
        .collect();
    json!({
        "rss_bytes": crate::memory::rss_bytes(),
        "bound_bytes": bound.total(),
        "block_cache_bytes": m.block_cache,
        "block_cache_capacity": m.block_cache_capacity,
        "write_buffer_bytes": m.write_buffer,
        "write_buffer_limit": m.write_buffer_stats.limit,
        "write_buffer_seals": m.write_buffer_stats.seals,
        "write_stalls": m.write_buffer_stats.stalls,
        "write_stalled_ms": m.write_buffer_stats.stalled.as_millis() as u64,
        "journals": m.journals,
        "unresolved_txns": m.unresolved_txns,
        "open_trx": m.open_trx,
        "aborted_filter_bytes": m.aborted_filter,
        "keyspaces": keyspaces,
    })
}

/// `apply-nice` and whether the threads got it: `set` and `refused` count the apply and
/// safe-time threads (a refusal is also logged).
fn apply_nice_json(configured: i32) -> Value {
    let (set, refused) = tidelog_applier::priority::stage_nice_counts();
    json!({"configured": configured, "set_threads": set, "refused_threads": refused})
}

/// `apply-yield-to-intake` and how the apply threads have held back for catch-ups.
fn apply_yield_json(y: &tidelog_applier::apply::YieldStatus) -> Value {
    json!({
        "limit_ms": y.limit.map_or(0, |d| d.as_millis() as u64),
        "holding_threads": y.holding_threads,
        "held_ms_total": y.held_total.as_millis() as u64,
    })
}

/// `store-nice` and whether the store's workers got it.
fn store_nice_json((configured, set): &(i32, Result<usize, String>)) -> Value {
    match set {
        Ok(n) => json!({"configured": configured, "set_threads": n}),
        Err(e) => json!({"configured": configured, "set_threads": 0, "error": e}),
    }
}

/// Applies `store-nice` to the store's background workers; a refusal is logged and
/// otherwise ignored (it costs throughput, not the daemon), as `apply-nice`.
fn set_store_nice(store: &Store, nice: i32) -> Result<usize, String> {
    if nice == 0 {
        return Ok(0);
    }
    match store.set_background_nice(nice) {
        Ok(0) => {
            tracing::warn!(
                nice,
                "store-nice: no store worker threads (named {}) found to set",
                tidelog_applier::store::WORKER_THREAD
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

#[derive(Debug, Deserialize)]
struct ReadQuery {
    mode: Option<String>,
    at: Option<String>,
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Runs `f` on the blocking pool (store reads and writes); a task that panicked
/// is a 500.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(&anyhow::anyhow!("{e}")))
}

/// The read time of a request: `latest` (None), an explicit `at` (≤ safe time), or the
/// safe time for `consistent` — refused with 503 when uninitialized or stale.
fn read_time(s: &ApplierState, q: &ReadQuery) -> Result<Option<HybridTime>, ApiError> {
    let at = match &q.at {
        Some(a) => Some(HybridTime(admin::parse_ht("at", a)?)),
        None => None,
    };
    if let Some(at) = at {
        // Versions older than the retention horizon may have been compacted away.
        let h = s
            .store
            .binlog_horizon()
            .map_err(|e| ApiError::internal(&e.into()))?;
        if at < h {
            return Err(ApiError::bad_request(format!(
                "at={at} is older than the retention horizon {h} (binlog-retention): the versions it would read may be gone"
            )));
        }
    }
    let mode = q.mode.as_deref().unwrap_or("consistent");
    if mode == "latest" {
        if at.is_some() {
            return Err(ApiError::bad_request(
                "mode=latest and at=HT exclude each other",
            ));
        }
        return Ok(None);
    }
    if mode != "consistent" {
        return Err(ApiError::bad_request(format!(
            "mode {mode:?}: expected consistent or latest"
        )));
    }
    let report = s.consistency.report();
    let Some(safe) = report.safe_time else {
        return Err(ApiError::unavailable(
            "safe_time_uninitialized",
            format!(
                "safe time is not initialized: {}{}",
                uninitialized_reason(s, &report),
                store_fault(s)
            ),
        ));
    };
    if let Some(at) = at {
        if at > safe {
            return Err(ApiError::bad_request(format!(
                "at={at} is above the safe time {safe}: not readable consistently yet"
            )));
        }
        return Ok(Some(at));
    }
    let lag = std::time::Duration::from_micros(now_micros().saturating_sub(safe.physical_micros()));
    // A promoted target's safe time is its cut, final: never stale.
    if lag > s.max_staleness && s.consistency.cut().is_none() {
        let laggiest = match &report.laggiest {
            None => "?".to_string(),
            Some(t) => match tablet_stopped(s, t) {
                Some(why) => format!("{t}, {why}"),
                None => t.to_string(),
            },
        };
        return Err(ApiError::unavailable(
            "stale_safe_time",
            format!(
                "safe time {safe} is {} behind now (max-staleness {}); laggiest tablet {laggiest}{}",
                humantime::format_duration(
                    std::time::Duration::from_millis(lag.as_millis() as u64)
                ),
                humantime::format_duration(s.max_staleness),
                store_fault(s)
            ),
        ));
    }
    Ok(Some(safe))
}

/// `; the store takes no writes: <why>` while it does not (a full disk names the path),
/// else nothing: what holds every tablet's apply stage and the safe time.
fn store_fault(s: &ApplierState) -> String {
    match s.store.fault() {
        Some(e) => format!("; the store takes no writes until it is reopened: {e}"),
        None => String::new(),
    }
}

/// Why tablet `t` makes no progress when that is a fault rather than a wait: its apply
/// stage stopped (`stopped (record_rejected): apply stopped at received-log position P:
/// …`), waits for space (`disk_full`), or its intake refuses frames beyond the clock
/// (`clock_skew`) or cannot write its received log. `None` for a tablet that is only
/// behind or idle.
pub(crate) fn tablet_stopped(s: &ApplierState, t: &TabletId) -> Option<String> {
    if let Some(f) = s.appliers.workers().get(t).and_then(|w| w.fault()) {
        let how = if f.error.is_retryable() {
            "waits"
        } else {
            "stopped"
        };
        return Some(format!("{how} ({}): {f}", f.state()));
    }
    let ti = s.intake.tablet(t)?;
    let why = ti.status().error.unwrap_or_default();
    match ti.state() {
        // Its received log cannot be written: nothing new reaches its apply stage.
        TabletState::DiskFull => Some(format!(
            "waits (disk_full): its intake waits for space: {why}"
        )),
        TabletState::Failed => Some(format!("stopped (failed): its intake stopped: {why}")),
        _ => ti
            .clock_skew()
            .map(|skew| format!("refusing its frames (clock_skew): {skew}")),
    }
}

/// Why the safe time is not initialized: a tablet that has not reported because it
/// stopped before its first record was applied is named with its fault (a stopped tablet
/// is preferred to one that is only waiting for its first record), else the core's reason.
pub(crate) fn uninitialized_reason(
    s: &ApplierState,
    r: &tidelog_applier::consistency::SafeTimeReport,
) -> String {
    let unreported = r
        .tablets
        .iter()
        .filter(|(_, h)| **h == HybridTime::MIN)
        .map(|(t, _)| t);
    for t in unreported.chain(r.laggiest.as_ref()) {
        if let Some(why) = tablet_stopped(s, t) {
            return format!("tablet {t} has no record applied: it {why}");
        }
    }
    r.uninitialized_reason
        .clone()
        .unwrap_or_else(|| "no tablet has reported yet".into())
}

fn latest_ht(s: &ApplierState) -> HybridTime {
    if let Some(c) = s.store.cut() {
        return c;
    }
    let w = s.appliers.workers.lock().unwrap_or_else(|p| p.into_inner());
    w.values().map(|w| w.safe_time()).max().unwrap_or_default()
}

/// `GET /v1/kv/{key}`: the key is the rest of the path, percent-decoded to bytes (so keys
/// that are not UTF-8, which answers show as `{"b64": …}`, can be read too).
async fn kv_get(
    State(s): State<ApplierState>,
    uri: axum::http::Uri,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<Json<Value>, ApiError> {
    let raw = uri.path().strip_prefix("/v1/kv/").unwrap_or_default();
    let key = admin::percent_decode("key", raw, false)?;
    let at = read_time(&s, &q)?;
    let store = s.store.clone();
    let k = key.clone();
    let v = blocking(move || store.get(&k, at))
        .await?
        .map_err(|e| ApiError::internal(&e.into()))?;
    let read_ht = at.unwrap_or_else(|| latest_ht(&s));
    let (found, value, version) = match v {
        Some(v) => match v.value {
            Some(bytes) => (true, Some(JsonBytes(bytes)), Some(ht(v.ht))),
            None => (false, None, Some(ht(v.ht))),
        },
        None => (false, None, None),
    };
    Ok(Json(json!({
        "key": JsonBytes(key),
        "found": found,
        "value": value,
        "version_ht": version,
        "read_ht": ht(read_ht),
    })))
}

/// A `limit` query parameter: `default` when absent, at least 1, capped at `max`.
fn limit(limit: Option<u64>, default: u64, max: u64) -> Result<usize, ApiError> {
    match limit {
        Some(0) => Err(ApiError::bad_request("limit: must be at least 1")),
        l => Ok(l.unwrap_or(default).min(max) as usize),
    }
}

/// `prefix` is read from the raw query (bytes, not necessarily UTF-8).
#[derive(Debug, Deserialize)]
struct ScanQuery {
    mode: Option<String>,
    at: Option<String>,
    limit: Option<u64>,
}

async fn scan(
    State(s): State<ApplierState>,
    uri: axum::http::Uri,
    ApiQuery(q): ApiQuery<ScanQuery>,
) -> Result<Json<Value>, ApiError> {
    let prefix = admin::query_bytes(&uri, "prefix")?.unwrap_or_default();
    let at = read_time(
        &s,
        &ReadQuery {
            mode: q.mode.clone(),
            at: q.at.clone(),
        },
    )?;
    let limit = limit(q.limit, 1000, 100_000)?;
    let store = s.store.clone();
    let (items, more) = blocking(move || store.scan(&prefix, at, limit))
        .await?
        .map_err(|e| ApiError::internal(&e.into()))?;
    let read_ht = at.unwrap_or_else(|| latest_ht(&s));
    let items: Vec<Value> = items
        .into_iter()
        .map(|(k, v, h)| json!({"key": JsonBytes(k), "value": JsonBytes(v), "version_ht": ht(h)}))
        .collect();
    Ok(Json(
        json!({"read_ht": ht(read_ht), "items": items, "more": more}),
    ))
}

#[derive(Debug, Deserialize)]
struct SafeTimeQuery {
    /// Answer once the safe time is ≥ this hybrid time (or `wait` passed).
    #[serde(rename = "wait-for")]
    wait_for: Option<String>,
    wait: Option<String>,
}

/// `GET /v1/safe-time[?wait-for=HT[&wait=D]]`. With `wait-for`, the answer comes as soon as
/// the published safe time reaches `HT`, or after `wait` (default 1s, at most 60s) with the
/// safe time as it is then: a client following the safe time (a replication monitor, the
/// e2e benchmark's lag sampler) gets each advance when it happens instead of polling.
async fn safe_time(
    State(s): State<ApplierState>,
    ApiQuery(q): ApiQuery<SafeTimeQuery>,
) -> Result<Json<Value>, ApiError> {
    if let Some(w) = &q.wait_for {
        let target = HybridTime(admin::parse_ht("wait-for", w)?);
        let wait = match q.wait.as_deref() {
            None => std::time::Duration::from_secs(1),
            Some(w) => admin::parse_wait("wait", w)?.min(std::time::Duration::from_secs(60)),
        };
        if s.consistency.safe_time().is_none_or(|st| st < target) && !wait.is_zero() {
            let _place = s.waiters.enter()?;
            let deadline = std::time::Instant::now() + wait;
            s.consistency.wait_until(target, deadline).await;
        }
    } else if q.wait.is_some() {
        return Err(ApiError::bad_request("wait needs wait-for=HT"));
    }
    Ok(safe_time_report(&s))
}

fn safe_time_report(s: &ApplierState) -> Json<Value> {
    let r = s.consistency.report();
    let now = now_micros();
    let lag_ms = |h: HybridTime| now.saturating_sub(h.physical_micros()) / 1000;
    let tablets: serde_json::Map<String, Value> = r
        .tablets
        .iter()
        .map(|(t, h)| {
            let lag = if *h == HybridTime::MIN {
                Value::Null
            } else {
                json!(lag_ms(*h))
            };
            (t.to_string(), json!({"safe_time": ht(*h), "lag_ms": lag}))
        })
        .collect();
    let reported: Vec<HybridTime> = r
        .tablets
        .values()
        .copied()
        .filter(|h| *h != HybridTime::MIN)
        .collect();
    let skew_ms = match (reported.iter().min(), reported.iter().max()) {
        (Some(lo), Some(hi)) => (hi.physical_micros().saturating_sub(lo.physical_micros())) / 1000,
        _ => 0,
    };
    // Why the safe time does not move: not initialized, or held by a stopped tablet.
    let reason = match (&r.safe_time, &r.laggiest) {
        (None, _) => Some(uninitialized_reason(s, &r)),
        (Some(_), Some(t)) => tablet_stopped(s, t).map(|why| format!("tablet {t} holds it: {why}")),
        (Some(_), None) => None,
    };
    Json(json!({
        "initialized": r.safe_time.is_some(),
        "safe_time": r.safe_time.map(ht),
        "lag_ms": r.safe_time.map(lag_ms),
        "laggiest_tablet": r.laggiest.map(|t| t.to_string()),
        "reason": reason,
        "skew_ms": skew_ms,
        "pending_txns": r.pending_txns,
        "tablets": tablets,
    }))
}

#[derive(Debug, Deserialize)]
struct TabletQuery {
    tablet: Option<String>,
}

fn parse_tablet(q: &TabletQuery) -> Result<Option<TabletId>, ApiError> {
    q.tablet
        .as_deref()
        .map(|t| {
            t.parse::<TabletId>()
                .map_err(|e| ApiError::bad_request(format!("tablet: {e}")))
        })
        .transpose()
}

/// A promoted target takes no shipped logs at all: pausing or resuming its intake is a
/// conflict (409), not a no-op answered `ok`.
fn refuse_if_promoted(s: &ApplierState, what: &str) -> Result<(), ApiError> {
    match s.consistency.cut() {
        Some(cut) => Err(ApiError::conflict(
            "promoted",
            format!("cannot {what}: this target was promoted to primary at the cut {cut} and accepts no shipped logs"),
        )),
        None => Ok(()),
    }
}

async fn pause(
    State(s): State<ApplierState>,
    ApiQuery(q): ApiQuery<TabletQuery>,
) -> Result<Json<Value>, ApiError> {
    let t = parse_tablet(&q)?;
    refuse_if_promoted(&s, "pause")?;
    // Waits for a group the intake writer has begun (its fsync): off the runtime.
    let intake = s.intake.clone();
    blocking(move || intake.set_paused(t.as_ref(), true))
        .await?
        .map_err(|e| ApiError::bad_request(format!("{e:#}")))?;
    Ok(Json(json!({"ok": true})))
}

async fn resume(
    State(s): State<ApplierState>,
    ApiQuery(q): ApiQuery<TabletQuery>,
) -> Result<Json<Value>, ApiError> {
    let t = parse_tablet(&q)?;
    refuse_if_promoted(&s, "resume")?;
    s.intake
        .set_paused(t.as_ref(), false)
        .map_err(|e| ApiError::bad_request(format!("{e:#}")))?;
    Ok(Json(json!({"ok": true})))
}

async fn metrics(State(s): State<ApplierState>) -> axum::response::Response {
    let text = tokio::task::spawn_blocking(move || metrics::applier(&s))
        .await
        .unwrap_or_default();
    admin::prometheus(text)
}

/// `trx_status` is typically asked right after a failure, often of this very daemon: load
/// the look-up keyspaces into the block cache in the background at start, when they fit in
/// three quarters of `cache-size` (more would only evict what it loads).
fn warm_lookup_cache(store: Arc<Store>, cache_size: u64, state: Arc<std::sync::atomic::AtomicU8>) {
    let set = move |w: WarmState| state.store(w as u8, Ordering::Release);
    let bytes = store.lookup_index_bytes();
    if bytes == 0 {
        return;
    }
    if bytes > cache_size / 4 * 3 {
        tracing::info!(
            lookup_bytes = bytes,
            cache_size,
            "trx_status look-up indexes exceed 3/4 of cache-size: not pre-loading them (raise cache-size for µs look-ups)"
        );
        set(WarmState::TooLarge);
        return;
    }
    set(WarmState::Loading);
    let set2 = set.clone();
    let spawned = std::thread::Builder::new()
        .name("cache-warm".into())
        .spawn(move || {
            let t0 = std::time::Instant::now();
            match store.warm_lookup_cache() {
                Ok(n) => {
                    tracing::info!(
                        entries = n,
                        lookup_bytes = bytes,
                        took_ms = t0.elapsed().as_millis() as u64,
                        "trx_status look-up indexes loaded into the block cache"
                    );
                    set2(WarmState::Loaded);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pre-loading the look-up indexes failed");
                    set2(WarmState::Failed);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the cache-warm thread");
        set(WarmState::Failed);
    }
}

#[derive(Debug, Deserialize)]
struct TrxParams {
    gtid: Option<String>,
    wait: Option<String>,
}

/// Longest `wait` a `trx_status` call may ask for.
const MAX_TRX_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// A value shown with its `Display`, serialized as a JSON string without an intermediate
/// `String`.
struct Shown<T>(T);

impl<T: std::fmt::Display> serde::Serialize for Shown<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

/// The JSON of a `trx_status` answer, serialized straight from the answer (no `Value`
/// tree: this is the route clients poll after a failure). Fields in alphabetical order, as
/// every other object the API renders through `serde_json::Value`.
#[derive(serde::Serialize)]
struct TrxJson<'a> {
    caught_up: bool,
    commit_ht: Option<Shown<u64>>,
    connect_id: Option<Shown<u64>>,
    gtid: Option<Shown<Gtid>>,
    reason: Option<&'a str>,
    safe_time: Option<Shown<u64>>,
    state: &'static str,
    trx_id: &'a str,
    txn: Option<Shown<tidelog_wal::TxnId>>,
    waits_for: Option<&'a str>,
}

fn trx_json(a: &TrxStatus) -> TrxJson<'_> {
    TrxJson {
        caught_up: a.caught_up,
        commit_ht: a.commit_ht.map(|h| Shown(h.0)),
        connect_id: a.connect_id.map(Shown),
        gtid: a.gtid.map(Shown),
        reason: a.reason.as_deref(),
        safe_time: a.safe_time.map(|h| Shown(h.0)),
        state: a.state.name(),
        trx_id: &a.trx_id,
        txn: a.txn.map(Shown),
        waits_for: a.waits_for.as_deref(),
    }
}

/// A `trx_status` answer, waiting up to `wait` for a hint that is not visible yet: each
/// look-up is a few point reads, run inline; between two, the request waits as a task for
/// the safe time the look-up named ([`tidelog_applier::trx::trx_status_now`]), in a place of
/// the [`admin::WaitLimit`] (503 `too_many_waiters` when none is left), holding no thread.
async fn trx_answer(
    s: &ApplierState,
    trx_id: &str,
    gtid: Option<&str>,
    wait: std::time::Duration,
) -> Result<TrxStatus, ApiError> {
    let deadline = std::time::Instant::now() + wait;
    let ask = |wait| {
        tidelog_applier::trx::trx_status_now(
            &s.store,
            &*s.consistency,
            &TrxQuery {
                trx_id,
                gtid_hint: gtid,
                wait,
                max_staleness: s.max_staleness,
            },
        )
        .map_err(|e| ApiError::internal(&e.into()))
    };
    let mut place = None;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let (answer, wanted) = ask(left)?;
        let Some(wanted) = wanted else {
            return Ok(answer);
        };
        if place.is_none() {
            place = Some(s.waiters.enter()?);
        }
        if !s.consistency.wait_until(wanted, deadline).await {
            // The wait is over, or nothing will move the safe time now: answer as it is.
            return Ok(ask(std::time::Duration::ZERO)?.0);
        }
    }
}

/// `GET /v1/trx/{trx_id}?gtid=G&wait=D`. Every id, however malformed, gets an answer
/// (`UNKNOWN` with a reason) — also one that is not UTF-8 or has a bad `%` escape, so the
/// id is taken from the raw path; only a bad `wait` is a 400. The look-up is a few point
/// reads and runs inline; only a hint that is not visible yet waits ([`trx_answer`]).
async fn trx_status(
    State(s): State<ApplierState>,
    uri: axum::http::Uri,
    ApiQuery(q): ApiQuery<TrxParams>,
) -> Result<axum::response::Response, ApiError> {
    let raw = uri.path().strip_prefix("/v1/trx/").unwrap_or_default();
    let trx_id = match admin::percent_decode("trx_id", raw, false) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => raw.to_string(),
    };
    let wait = match q.wait.as_deref() {
        None => tidelog_applier::trx::DEFAULT_WAIT,
        Some(w) => admin::parse_wait("wait", w)?.min(MAX_TRX_WAIT),
    };
    let answer = trx_answer(&s, &trx_id, q.gtid.as_deref(), wait).await?;
    if let Some(i) = TrxState::ALL.iter().position(|st| *st == answer.state) {
        s.trx_lookups[i].fetch_add(1, Ordering::Relaxed);
    }
    Ok(axum::response::IntoResponse::into_response(Json(trx_json(
        &answer,
    ))))
}

#[derive(Debug, Deserialize)]
struct BinlogParams {
    #[serde(rename = "from-gtid")]
    from_gtid: Option<String>,
    limit: Option<u64>,
}

/// Default and largest `limit` of `GET /v1/binlog`.
const BINLOG_LIMIT: u64 = 100;
const BINLOG_MAX_LIMIT: u64 = 10_000;

/// `GET /v1/binlog?from-gtid=G&limit=N`: visible commits (≤ safe time) in commit order,
/// starting at gtid G (inclusive) or at the oldest retained.
async fn binlog(
    State(s): State<ApplierState>,
    ApiQuery(q): ApiQuery<BinlogParams>,
) -> Result<Json<Value>, ApiError> {
    let limit = limit(q.limit, BINLOG_LIMIT, BINLOG_MAX_LIMIT)?;
    let from: Option<Gtid> = match q.from_gtid.as_deref() {
        None | Some("") => None,
        Some(g) => Some(
            g.parse()
                .map_err(|e| ApiError::bad_request(format!("from-gtid: {e}")))?,
        ),
    };
    let safe = s.consistency.safe_time();
    let s2 = s.clone();
    let (entries, more) = blocking(move || -> Result<_, ApiError> {
        let Some(upto) = safe else {
            return Ok((Vec::new(), false));
        };
        let bl = s2
            .store
            .binlog()
            .map_err(|e| ApiError::internal(&e.into()))?;
        let start = match from {
            None => None,
            Some(g) => {
                let e = bl
                    .gtid(g.domain, g.seq)
                    .map_err(|e| ApiError::internal(&e.into()))?;
                match e {
                    Some(e) if e.commit_ht <= upto => Some((e.commit_ht, e.tablet)),
                    Some(_) | None => {
                        let horizon = s2
                            .store
                            .binlog_horizon()
                            .map_err(|e| ApiError::internal(&e.into()))?;
                        let first = bl
                            .first_in_domain(g.domain)
                            .map_err(|e| ApiError::internal(&e.into()))?;
                        // 409: the binlog's state does not hold it (404 is for routes).
                        return Err(match first {
                            Some(f) if g.seq < f.gtid.seq && horizon > HybridTime::MIN => {
                                ApiError::conflict(
                                    "gtid_expired",
                                    format!(
                                        "gtid {g} was removed by binlog retention; the oldest retained in domain {} is {}",
                                        g.domain, f.gtid
                                    ),
                                )
                            }
                            _ => ApiError::conflict(
                                "gtid_not_visible",
                                format!("gtid {g} is not in the visible binlog (safe time {upto})"),
                            ),
                        });
                    }
                }
            }
        };
        bl.read(start.as_ref().map(|(h, t)| (*h, t)), upto, limit)
            .map_err(|e| ApiError::internal(&e.into()))
    })
    .await??;
    let entries: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!({
                "gtid": e.gtid.map(|g| g.to_string()),
                "trx_id": e.trx_id.map(|t| t.to_string()),
                "commit_ht": ht(e.commit_ht),
                "tablets": e.tablets.iter().map(TabletId::to_string).collect::<Vec<_>>(),
                "txn": e.txn.map(|t| t.to_string()),
            })
        })
        .collect();
    Ok(Json(json!({
        "safe_time": safe.map(ht),
        "entries": entries,
        "more": more,
    })))
}

fn refusal_reason(cut: HybridTime) -> String {
    format!(
        "this target was promoted to primary at cut {cut} (cutover); it accepts no shipped logs"
    )
}

fn rfc3339_us(us: u64) -> String {
    humantime::format_rfc3339_micros(std::time::UNIX_EPOCH + std::time::Duration::from_micros(us))
        .to_string()
}

fn cutover_json(c: &Cutover) -> Value {
    let r = c.report.clone().unwrap_or_default();
    let tablets: serde_json::Map<String, Value> = r
        .tablets
        .iter()
        .map(|(t, (safe, lag))| {
            (
                t.to_string(),
                json!({"lag_ms": lag, "safe_time": ht(*safe)}),
            )
        })
        .collect();
    json!({
        "role": "primary",
        "cut_ht": ht(c.cut),
        "cut_time": rfc3339_us(c.cut_time_us),
        "lost_commits": r.lost_commits,
        "lost_window_ms": r.lost_window_ms,
        "tablets": tablets,
    })
}

/// `POST /v1/promote` (docs/ARCHITECTURE.md, "Cutover"): refuse shippers, stop applying,
/// cut at the safe time, persist the cut (reads are capped at it from then on) and the
/// report, and clean up above the cut in the background. Idempotent: a promoted target
/// returns its report.
async fn promote(State(s): State<ApplierState>) -> Result<Json<Value>, ApiError> {
    let _one = s.promote_lock.lock().await;
    let s2 = s.clone();
    let c = blocking(move || -> Result<Cutover, ApiError> {
        let internal = |e: tidelog_applier::error::Error| ApiError::internal(&e.into());
        if let Some(c) = s2.store.cutover().map_err(internal)? {
            return cutover::finish(&s2.store, c).map_err(internal);
        }
        if s2.consistency.safe_time().is_none() {
            let r = s2.consistency.report();
            return Err(ApiError::conflict(
                "safe_time_uninitialized",
                format!(
                    "cannot promote: safe time is not initialized ({}), so there is no clean cut",
                    uninitialized_reason(&s2, &r)
                ),
            ));
        }
        s2.intake.refuse("this target is being promoted to primary (cutover); it accepts no shipped logs");
        s2.appliers.stop_all();
        // Waiters for the safe time (a `trx_status` with a hint) hold on until the cut is
        // set, then answer as the promoted target.
        s2.consistency.begin_cutover();
        let promoted = s2
            .consistency
            .safe_time()
            .ok_or_else(|| ApiError::conflict("safe_time_uninitialized", "safe time vanished"))
            .and_then(|cut| cutover::promote(&s2.store, cut).map_err(internal));
        let c = promoted.inspect_err(|_| s2.consistency.cutover_failed())?;
        s2.consistency.freeze(c.cut);
        s2.intake.refuse(&refusal_reason(c.cut));
        tracing::info!(cut = %c.cut, lost_commits = c.report.as_ref().map_or(0, |r| r.lost_commits), "promoted to primary");
        Ok(c)
    })
    .await??;
    {
        let mut g = s.cleanup.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() && !c.cleaned {
            *g = Some(Cleanup::start(s.store.clone()).map_err(|e| ApiError::internal(&e.into()))?);
        }
    }
    Ok(Json(cutover_json(&c)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The answer's JSON carries every field, absent ones as `null`, with ids and hybrid
    /// times as strings (the shape `tidelog ctl trx-status --json` and clients parse).
    #[test]
    fn trx_json_has_every_field_as_strings_or_null() {
        let g = Gtid {
            domain: 3,
            server: 7,
            seq: 42,
        };
        let txn = tidelog_wal::TxnId::from_u128(0xabc);
        let a = TrxStatus {
            trx_id: "12:34".into(),
            state: TrxState::Committed,
            reason: None,
            gtid: Some(g),
            commit_ht: Some(HybridTime(u64::MAX - 1)),
            connect_id: Some(12),
            txn: Some(txn),
            waits_for: None,
            safe_time: Some(HybridTime(99)),
            caught_up: true,
        };
        let got: Value =
            serde_json::from_slice(&serde_json::to_vec(&trx_json(&a)).unwrap()).unwrap();
        let want = json!({
            "trx_id": "12:34",
            "state": "COMMITTED",
            "reason": null,
            "gtid": g.to_string(),
            "commit_ht": (u64::MAX - 1).to_string(),
            "connect_id": "12",
            "txn": txn.to_string(),
            "waits_for": null,
            "safe_time": "99",
            "caught_up": true,
        });
        assert_eq!(got, want);
        let u = TrxStatus {
            state: TrxState::Unknown,
            reason: Some("never seen".into()),
            gtid: None,
            commit_ht: None,
            connect_id: None,
            txn: None,
            waits_for: Some("x".into()),
            safe_time: None,
            caught_up: false,
            ..a
        };
        let got: Value =
            serde_json::from_slice(&serde_json::to_vec(&trx_json(&u)).unwrap()).unwrap();
        assert_eq!(got["reason"], "never seen");
        assert_eq!(got["waits_for"], "x");
        for k in ["gtid", "commit_ht", "connect_id", "txn", "safe_time"] {
            assert!(got[k].is_null(), "{k}: {got}");
        }
        assert_eq!(got.as_object().unwrap().len(), 10);
    }
}
