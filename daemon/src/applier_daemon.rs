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
use tidelog_applier::apply::{ApplyConfig, ApplyWorker};
use tidelog_applier::binlog::Retention;
use tidelog_applier::consistency::Consistency;
use tidelog_applier::intake::{DurableHook, Intake, IntakeOptions};
use tidelog_applier::store::Store;
use tidelog_applier::tls::TlsMaterial;
use tidelog_applier::trx::{TrxQuery, TrxState, TrxStatus};
use tidelog_wal::{Gtid, HybridTime, TabletId, WalPos};

use crate::admin::{self, ApiError, ApiPath, ApiQuery, JsonBytes};
use crate::config::{self, ApplierConfig};
use crate::{certs, notify};

/// Runs the applier until SIGTERM/SIGINT. With `check`, validates the config and exits.
pub fn run(config_path: &Path, check: bool) -> Result<()> {
    let cfg = config::check_applier(config_path)?;
    if check {
        println!("{}: ok", config_path.display());
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("applier")
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(serve(cfg))
}

/// Loads the PEM files named in `[tls]`.
pub fn tls_material(
    tls: &config::TlsConfig,
) -> Result<(
    Vec<rustls::pki_types::CertificateDer<'static>>,
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
)> {
    Ok((
        certs::load_certs(&tls.ca)?,
        certs::load_certs(&tls.cert)?,
        certs::load_key(&tls.key)?,
    ))
}

/// The apply workers, one per tablet, created when a tablet first shows up.
#[derive(Debug)]
pub struct Appliers {
    store: Arc<Store>,
    consistency: Arc<Consistency>,
    received: PathBuf,
    workers: Mutex<BTreeMap<TabletId, ApplyWorker>>,
    /// applied_records of each tablet when this process started (for record lag).
    base_records: Mutex<BTreeMap<TabletId, u64>>,
}

impl Appliers {
    fn ensure(&self, t: &TabletId) {
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
        let cfg = ApplyConfig {
            consistency: Some(self.consistency.clone()),
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

    fn stop_all(&self) {
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
}

async fn serve(cfg: ApplierConfig) -> Result<()> {
    notify::status("recovering");
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("creating data-dir {}", cfg.data_dir.display()))?;
    let data_dir = cfg.data_dir.clone();
    let store = Arc::new(
        tokio::task::spawn_blocking(move || Store::open(&data_dir))
            .await
            .context("opening the store")??,
    );
    let (s2, expect) = (store.clone(), cfg.expect_tablets.clone());
    let consistency = tokio::task::spawn_blocking(move || Consistency::start(s2, expect))
        .await
        .context("starting safe time")??;
    let appliers = Arc::new(Appliers {
        store: store.clone(),
        consistency: consistency.clone(),
        received: cfg.data_dir.join("received"),
        workers: Mutex::new(BTreeMap::new()),
        base_records: Mutex::new(BTreeMap::new()),
    });
    let (ca, chain, key) = tls_material(&cfg.tls)?;
    let mut opts = IntakeOptions::new(cfg.listen, cfg.data_dir.clone());
    opts.sync = cfg.sync;
    opts.segment_size = cfg.segment_size;
    opts.applier_id = format!("tidelog-applier@{}", config::default_shipper_id());
    opts.quic = tidelog_wal::wire::QuicTuning {
        receive_window: cfg.quic.receive_window,
        stream_receive_window: cfg.quic.stream_receive_window,
        max_udp_payload: cfg.quic.max_udp_payload,
        idle_timeout: cfg.quic.idle_timeout,
    };
    let a2 = appliers.clone();
    let hook: DurableHook = Arc::new(move |t: &TabletId, _p: WalPos| a2.ensure(t));
    let intake = Intake::start(opts, TlsMaterial { ca, chain, key }, Some(hook))?;
    // Recovery: apply whatever the received logs hold beyond the store's apply positions.
    let known: Vec<TabletId> = intake.tablets().iter().map(|t| t.tablet.clone()).collect();
    let a3 = appliers.clone();
    tokio::task::spawn_blocking(move || {
        for t in &known {
            a3.ensure(t);
        }
    })
    .await?;
    let state = ApplierState {
        intake: intake.clone(),
        appliers: appliers.clone(),
        store: store.clone(),
        consistency: consistency.clone(),
        max_staleness: cfg.max_staleness,
        trx_lookups: Arc::new(Default::default()),
    };
    let _retention = Retention::start(store.clone(), consistency.clone(), cfg.binlog_retention)?;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let socket = cfg.admin_socket.clone();
    let admin_task = tokio::spawn(async move {
        admin::serve(&socket, router(state), async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        })
        .await
    });
    tracing::info!(listen = %intake.local_addr()?, data_dir = %cfg.data_dir.display(), "applier ready");
    notify::ready();
    let _watchdog = notify::spawn_watchdog();
    notify::status(&format!("serving shippers on {}", intake.local_addr()?));
    let admin_failed = wait_for_signal(admin_task).await?;
    notify::stopping();
    notify::status("stopping: writing queued frames");
    intake.shutdown().await;
    let a4 = appliers.clone();
    let s2 = store.clone();
    let c4 = consistency.clone();
    tokio::task::spawn_blocking(move || {
        a4.stop_all();
        c4.stop();
        if let Err(e) = s2.persist() {
            tracing::error!("persisting the store: {e}");
        }
    })
    .await?;
    let _ = stop_tx.send(true);
    if let Some(e) = admin_failed {
        return Err(e);
    }
    tracing::info!("applier stopped");
    Ok(())
}

/// Waits for SIGTERM or SIGINT (or the admin server failing, which is returned).
pub async fn wait_for_signal(
    admin_task: tokio::task::JoinHandle<Result<()>>,
) -> Result<Option<anyhow::Error>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => { tracing::info!("SIGTERM: stopping"); Ok(None) }
        _ = int.recv() => { tracing::info!("SIGINT: stopping"); Ok(None) }
        r = admin_task => Ok(Some(match r {
            Ok(Ok(())) => anyhow::anyhow!("the admin API stopped"),
            Ok(Err(e)) => e,
            Err(e) => anyhow::anyhow!("the admin API task failed: {e}"),
        })),
    }
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
        .route("/v1/trx/", get(trx_status_empty))
        .route("/v1/binlog", get(binlog))
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
        let (applied, safe, apply_error) = match workers.get(t) {
            Some(w) => (
                w.applied_pos().0,
                w.safe_time(),
                w.error().map(|e| e.to_string()),
            ),
            None => (0, HybridTime::default(), None),
        };
        let applied_records = s
            .store
            .tablet(t)
            .ok()
            .flatten()
            .map_or(0, |m| m.applied_records);
        let applied_this_run = applied_records.saturating_sub(base.get(t).copied().unwrap_or(0));
        let state = if apply_error.is_some() {
            "apply_failed"
        } else {
            st.state
        };
        rows.insert(
            t.to_string(),
            json!({
                "received_pos": st.received_pos,
                "applied_pos": applied,
                "safe_time": ht(safe),
                "received_safe_time": ht(HybridTime(st.safe_time)),
                "state": state,
                "lag_bytes": st.received_pos.saturating_sub(applied),
                "lag_records": st.records.saturating_sub(applied_this_run),
                "received_records": st.records,
                "applied_records": applied_records,
                "received_bytes": st.bytes,
                "shipper": st.shipper,
                "last_frame_ms_ago": st.last_frame_ms_ago,
                "error": apply_error.or(st.error),
            }),
        );
    }
    rows
}

async fn status(State(s): State<ApplierState>) -> Result<Json<Value>, ApiError> {
    let s2 = s.clone();
    let rows = tokio::task::spawn_blocking(move || tablet_rows(&s2))
        .await
        .map_err(|e| ApiError::internal(&anyhow::anyhow!("{e}")))?;
    let role = match s.store.role().map_err(|e| ApiError::internal(&e.into()))? {
        tidelog_applier::store::Role::Primary => "primary",
        tidelog_applier::store::Role::Standby => "replica",
    };
    let safe = s.consistency.safe_time();
    Ok(Json(json!({
        "role": role,
        "safe_time": ht(safe.unwrap_or_default()),
        "safe_time_initialized": safe.is_some(),
        "listen": s.intake.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        "tablets": rows,
    })))
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

/// The read time of a request: `latest` (None), an explicit `at` (≤ safe time), or the
/// safe time for `consistent` — refused with 503 when uninitialized or stale.
fn read_time(s: &ApplierState, q: &ReadQuery) -> Result<Option<HybridTime>, ApiError> {
    let at = match &q.at {
        Some(a) => Some(HybridTime(admin::parse_ht("at", a)?)),
        None => None,
    };
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
                "safe time is not initialized: {}",
                report
                    .uninitialized_reason
                    .unwrap_or_else(|| "no tablet has reported yet".into())
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
    if lag > s.max_staleness {
        let laggiest = report
            .laggiest
            .map_or_else(|| "?".to_string(), |t| t.to_string());
        return Err(ApiError::unavailable(
            "stale_safe_time",
            format!(
                "safe time {safe} is {} behind now (max-staleness {}); laggiest tablet {laggiest}",
                humantime::format_duration(
                    std::time::Duration::from_millis(lag.as_millis() as u64)
                ),
                humantime::format_duration(s.max_staleness)
            ),
        ));
    }
    Ok(Some(safe))
}

fn latest_ht(s: &ApplierState) -> HybridTime {
    let w = s.appliers.workers.lock().unwrap_or_else(|p| p.into_inner());
    w.values().map(|w| w.safe_time()).max().unwrap_or_default()
}

async fn kv_get(
    State(s): State<ApplierState>,
    ApiPath(key): ApiPath<String>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<Json<Value>, ApiError> {
    let at = read_time(&s, &q)?;
    let store = s.store.clone();
    let k = key.clone().into_bytes();
    let v = tokio::task::spawn_blocking(move || store.get(&k, at))
        .await
        .map_err(|e| ApiError::internal(&anyhow::anyhow!("{e}")))?
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
        "key": JsonBytes(key.into_bytes()),
        "found": found,
        "value": value,
        "version_ht": version,
        "read_ht": ht(read_ht),
    })))
}

#[derive(Debug, Deserialize)]
struct ScanQuery {
    prefix: Option<String>,
    mode: Option<String>,
    at: Option<String>,
    limit: Option<usize>,
}

async fn scan(
    State(s): State<ApplierState>,
    ApiQuery(q): ApiQuery<ScanQuery>,
) -> Result<Json<Value>, ApiError> {
    let at = read_time(
        &s,
        &ReadQuery {
            mode: q.mode.clone(),
            at: q.at.clone(),
        },
    )?;
    let limit = q.limit.unwrap_or(1000).clamp(1, 100_000);
    let store = s.store.clone();
    let prefix = q.prefix.clone().unwrap_or_default().into_bytes();
    let (items, more) = tokio::task::spawn_blocking(move || store.scan(&prefix, at, limit))
        .await
        .map_err(|e| ApiError::internal(&anyhow::anyhow!("{e}")))?
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

async fn safe_time(State(s): State<ApplierState>) -> Json<Value> {
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
    Json(json!({
        "initialized": r.safe_time.is_some(),
        "safe_time": r.safe_time.map(ht),
        "lag_ms": r.safe_time.map(lag_ms),
        "laggiest_tablet": r.laggiest.map(|t| t.to_string()),
        "reason": r.uninitialized_reason,
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

async fn pause(
    State(s): State<ApplierState>,
    ApiQuery(q): ApiQuery<TabletQuery>,
) -> Result<Json<Value>, ApiError> {
    let t = parse_tablet(&q)?;
    s.intake
        .set_paused(t.as_ref(), true)
        .map_err(|e| ApiError::not_found(format!("{e:#}")))?;
    Ok(Json(json!({"ok": true})))
}

async fn resume(
    State(s): State<ApplierState>,
    ApiQuery(q): ApiQuery<TabletQuery>,
) -> Result<Json<Value>, ApiError> {
    let t = parse_tablet(&q)?;
    s.intake
        .set_paused(t.as_ref(), false)
        .map_err(|e| ApiError::not_found(format!("{e:#}")))?;
    Ok(Json(json!({"ok": true})))
}

async fn metrics(State(s): State<ApplierState>) -> axum::response::Response {
    let s2 = s.clone();
    let rows = tokio::task::spawn_blocking(move || tablet_rows(&s2))
        .await
        .unwrap_or_default();
    let mut out = String::new();
    let gauges: [(&str, &str, &str); 5] = [
        (
            "tidelog_applier_received_pos_bytes",
            "received_pos",
            "End of the durable received log.",
        ),
        (
            "tidelog_applier_applied_pos_bytes",
            "applied_pos",
            "Position applied into the store.",
        ),
        (
            "tidelog_applier_apply_lag_bytes",
            "lag_bytes",
            "Received but not yet applied.",
        ),
        (
            "tidelog_applier_received_records_total",
            "received_records",
            "Records received since start.",
        ),
        (
            "tidelog_applier_applied_records_total",
            "applied_records",
            "Records applied (persisted count).",
        ),
    ];
    for (name, field, help) in gauges {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (t, row) in &rows {
            let v = row.get(field).and_then(Value::as_u64).unwrap_or(0);
            out.push_str(&format!("{name}{{tablet=\"{t}\"}} {v}\n"));
        }
    }
    out.push_str("# HELP tidelog_applier_trx_status_lookups_total trx_status answers given, by state.\n# TYPE tidelog_applier_trx_status_lookups_total counter\n");
    for (i, st) in TrxState::ALL.iter().enumerate() {
        out.push_str(&format!(
            "tidelog_applier_trx_status_lookups_total{{state=\"{}\"}} {}\n",
            st.name(),
            s.trx_lookups[i].load(Ordering::Relaxed)
        ));
    }
    admin::prometheus(out)
}

#[derive(Debug, Deserialize)]
struct TrxParams {
    gtid: Option<String>,
    wait: Option<String>,
}

/// Longest `wait` a `trx_status` call may ask for.
const MAX_TRX_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

fn trx_json(a: &TrxStatus) -> Value {
    json!({
        "trx_id": a.trx_id,
        "state": a.state.name(),
        "reason": a.reason,
        "gtid": a.gtid.map(|g| g.to_string()),
        "commit_ht": a.commit_ht.map(ht),
        "connect_id": a.connect_id.map(|c| c.to_string()),
        "txn": a.txn.map(|t| t.to_string()),
        "waits_for": a.waits_for,
        "tablets": a.tablets.iter().map(TabletId::to_string).collect::<Vec<_>>(),
        "safe_time": a.safe_time.map(ht),
        "caught_up": a.caught_up,
    })
}

async fn trx_status_empty(
    s: State<ApplierState>,
    q: ApiQuery<TrxParams>,
) -> Result<Json<Value>, ApiError> {
    trx_status(s, ApiPath(String::new()), q).await
}

/// `GET /v1/trx/{trx_id}?gtid=G&wait=D`. Every id, however malformed, gets an answer
/// (`UNKNOWN` with a reason); only a bad `wait` is a 400. The look-up is a few point reads
/// and runs inline; only a hint that is not visible yet waits, on the blocking pool.
async fn trx_status(
    State(s): State<ApplierState>,
    ApiPath(trx_id): ApiPath<String>,
    ApiQuery(q): ApiQuery<TrxParams>,
) -> Result<Json<Value>, ApiError> {
    let wait = match q.wait.as_deref() {
        None => tidelog_applier::trx::DEFAULT_WAIT,
        Some(w) => admin::parse_wait("wait", w)?.min(MAX_TRX_WAIT),
    };
    let has_hint = q.gtid.is_some();
    let ask = move |s: &ApplierState, wait: std::time::Duration| {
        tidelog_applier::trx::trx_status(
            &s.store,
            &*s.consistency,
            &TrxQuery {
                trx_id: &trx_id,
                gtid_hint: q.gtid.as_deref(),
                wait,
                max_staleness: s.max_staleness,
            },
        )
    };
    let answer = if !has_hint {
        ask(&s, wait)
    } else {
        // A hint that is already visible needs no wait: answer inline (point reads, like
        // the no-hint case). Only a hint the target has not reached yet (`caught_up:
        // false`) is asked again on the blocking pool, where it may wait up to `wait`.
        let first =
            ask(&s, std::time::Duration::ZERO).map_err(|e| ApiError::internal(&e.into()))?;
        if first.caught_up || wait.is_zero() {
            Ok(first)
        } else {
            let s2 = s.clone();
            tokio::task::spawn_blocking(move || ask(&s2, wait))
                .await
                .map_err(|e| ApiError::internal(&anyhow::anyhow!("{e}")))?
        }
    }
    .map_err(|e| ApiError::internal(&e.into()))?;
    if let Some(i) = TrxState::ALL.iter().position(|st| *st == answer.state) {
        s.trx_lookups[i].fetch_add(1, Ordering::Relaxed);
    }
    Ok(Json(trx_json(&answer)))
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
    let limit = q.limit.unwrap_or(BINLOG_LIMIT).clamp(1, BINLOG_MAX_LIMIT) as usize;
    let from: Option<Gtid> = match q.from_gtid.as_deref() {
        None | Some("") => None,
        Some(g) => Some(
            g.parse()
                .map_err(|e| ApiError::bad_request(format!("from-gtid: {e}")))?,
        ),
    };
    let safe = s.consistency.safe_time();
    let s2 = s.clone();
    let (entries, more) = tokio::task::spawn_blocking(move || -> Result<_, ApiError> {
        let Some(upto) = safe else {
            return Ok((Vec::new(), false));
        };
        let bl = s2.store.binlog();
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
                        let why = match first {
                            Some(f) if g.seq < f.gtid.seq && horizon > HybridTime::MIN => format!(
                                "gtid {g} was removed by binlog retention; the oldest retained in domain {} is {}",
                                g.domain, f.gtid
                            ),
                            _ => format!("gtid {g} is not in the visible binlog (safe time {upto})"),
                        };
                        return Err(ApiError::not_found(why));
                    }
                }
            }
        };
        bl.read(start.as_ref().map(|(h, t)| (*h, t)), upto, limit)
            .map_err(|e| ApiError::internal(&e.into()))
    })
    .await
    .map_err(|e| ApiError::internal(&anyhow::anyhow!("{e}")))??;
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
