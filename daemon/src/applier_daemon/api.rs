//! The applier's admin API: each route parses its request, makes one typed call on the
//! [`Applier`] and renders the answer as JSON (hybrid times as decimal strings, keys and
//! values as UTF-8 strings or `{"b64": …}`); an [`node::Error`] becomes its HTTP status
//! and error code ([`api_error`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tidelog_applier::node::{self, Applier, ReadMode};
use tidelog_applier::store::{Cutover, Role};
use tidelog_applier::trx_json::trx_json;
use tidelog_sql::SqlServer;
use tidelog_wal::{Gtid, HybridTime, TabletId};

use crate::admin::{self, ApiError, ApiQuery, JsonBytes};
use crate::config::ApplierConfig;

/// Everything the admin handlers read.
#[derive(Debug, Clone)]
pub struct ApplierState {
    pub applier: Applier,
    /// The configuration, for the memory bound `/v1/status` reports.
    pub config: Arc<ApplierConfig>,
    /// The SQL endpoint, when `[sql]` turns it on.
    pub sql: Option<Arc<SqlServer>>,
    /// The metric families, registered once ([`Applier::metrics`], the SQL endpoint's).
    registry: Arc<prometheus_client::registry::Registry>,
}

impl ApplierState {
    pub fn new(
        applier: Applier,
        config: Arc<ApplierConfig>,
        sql: Option<Arc<SqlServer>>,
    ) -> ApplierState {
        let mut registry = prometheus_client::registry::Registry::default();
        applier.metrics(&mut registry);
        if let Some(s) = &sql {
            s.metrics(&mut registry);
        }
        ApplierState {
            applier,
            config,
            sql,
            registry: Arc::new(registry),
        }
    }
}

/// The HTTP answer to a failed call: 400 for a bad request, 409 for a conflicting state
/// (promoted, no clean cut, a gtid expired or not visible), 503 for a consistent read that
/// cannot be served or no place to wait, 500 for the store, but 503 for a store that takes
/// no writes for now: `disk_full` (naming the path) or `store_unavailable`.
pub fn api_error(e: node::Error) -> ApiError {
    use node::Error as E;
    use tidelog_applier::error::Error as StoreError;
    match e {
        E::Store(StoreError::DiskFull(d)) => ApiError::unavailable("disk_full", d.to_string()),
        E::Store(e @ StoreError::Unavailable { .. }) => {
            ApiError::unavailable("store_unavailable", e.to_string())
        }
        E::Store(e) => ApiError::internal(&e.into()),
        E::Other(e) => ApiError::internal(&e),
        E::Invalid(m) => ApiError::bad_request(m),
        e @ (E::SafeTimeUninitialized { .. } | E::StaleSafeTime(_) | E::TooManyWaiters { .. }) => {
            ApiError::unavailable(e.code(), e.to_string())
        }
        e => ApiError::conflict(e.code(), e.to_string()),
    }
}

pub fn router(state: ApplierState) -> Router {
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

/// Runs `f` on the blocking pool (store reads and writes); a task that panicked is a 500.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(&anyhow::anyhow!("{e}")))
}

/// Runs a call of the applier on the blocking pool.
async fn call<T: Send + 'static>(
    s: &ApplierState,
    f: impl FnOnce(&Applier) -> node::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let a = s.applier.clone();
    blocking(move || f(&a)).await?.map_err(api_error)
}

async fn status(State(s): State<ApplierState>) -> Result<Json<Value>, ApiError> {
    let st = call(&s, |a| a.status()).await?;
    let rows: BTreeMap<String, Value> = st
        .tablets
        .iter()
        .map(|(t, r)| {
            let row = json!({
                "received_pos": r.received_pos,
                "applied_pos": r.applied_pos,
                "safe_time": ht(r.safe_time),
                "received_safe_time": ht(r.received_safe_time),
                "state": r.state,
                "lag_bytes": r.received_pos.saturating_sub(r.applied_pos),
                "lag_records": r.received_records.saturating_sub(r.applied_records),
                "received_records": r.received_records,
                "applied_records": r.applied_records,
                // Received logs start at position 0: their end is every byte received.
                "received_bytes": r.received_pos,
                "shipper": r.shipper,
                "last_frame_ms_ago": r.last_frame_ms_ago,
                "error": r.error,
            });
            (t.to_string(), row)
        })
        .collect();
    let role = match st.role {
        Role::Primary => "primary",
        Role::Standby => "replica",
    };
    let cutover = match &st.cutover {
        None => Value::Null,
        Some(c) => json!({
            "cut_ht": ht(c.cut),
            "cut_time": rfc3339_us(c.cut_time_us),
            "cleanup_done": c.cleanup_done,
            "removed_versions": c.removed_versions,
        }),
    };
    let store_state = match (&st.store.fault, st.store.disk_full) {
        (None, _) => "ok",
        (Some(_), true) => "disk_full",
        (Some(_), false) => "unavailable",
    };
    let y = &st.apply_yield;
    let store_nice = match &st.store_nice.set {
        Ok(n) => json!({"configured": st.store_nice.configured, "set_threads": n}),
        Err(e) => json!({"configured": st.store_nice.configured, "set_threads": 0, "error": e}),
    };
    Ok(Json(json!({
        "role": role,
        "cutover": cutover,
        "store": {
            "path": st.store.path.display().to_string(),
            "state": store_state,
            "error": st.store.fault,
            "reopened": st.store.reopened,
        },
        "safe_time": ht(st.safe_time.unwrap_or_default()),
        "safe_time_initialized": st.safe_time.is_some(),
        "listen": st.listen.map(|a| a.to_string()).unwrap_or_default(),
        "udp_receive_buffer": {
            "configured": st.udp_receive_buffer.wanted,
            "bytes": st.udp_receive_buffer.got,
        },
        "lookup_cache": {
            "state": st.lookup_cache.name(),
            "index_bytes": st.lookup_index_bytes,
            "cache_size": st.cache_size,
        },
        "memory": memory_json(&st.memory, &s.config, rows.len()),
        "apply_nice": {
            "configured": st.apply_nice.configured,
            "set_threads": st.apply_nice.set.as_ref().map_or(0, |n| *n),
            "refused_threads": st.apply_nice.refused,
        },
        "store_nice": store_nice,
        "apply_yield": {
            "limit_ms": y.limit.map_or(0, |d| d.as_millis() as u64),
            "holding_threads": y.holding_threads,
            "held_ms_total": y.held_total.as_millis() as u64,
        },
        "received_direct_io": {
            "configured": st.received_direct_io.configured,
            "in_use": st.received_direct_io.in_use,
        },
        "received_direct_io_in_catch_up": {
            "configured": st.received_direct_io_in_catch_up.configured,
            "in_use": st.received_direct_io_in_catch_up.in_use,
        },
        // The async runtime's worker threads (`runtime-threads`), as the runtime has them.
        "runtime_threads": tokio::runtime::Handle::current().metrics().num_workers(),
        // Requests parked on the safe time (`wait-for`, a `trx_status` hint), and the cap.
        "admin_waiters": {"waiting": st.waiters.0, "max": st.waiters.1},
        // The SQL endpoint (`[sql]`), `null` when it is off.
        "sql": s.sql.as_ref().map(|q| json!({
            "listen": q.local_addr().to_string(),
            "connections": q.connections(),
        })),
        "tablets": rows,
    })))
}

/// The process's resident size, the bound it is held below for this configuration and
/// number of tablets (`applier/STORE.md`, "Memory"), and what the store holds in memory.
fn memory_json(
    m: &tidelog_applier::store::StoreMemory,
    cfg: &ApplierConfig,
    tablets: usize,
) -> Value {
    let bound = crate::config::ApplierBound::of(cfg, tablets);
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
        "rss_bytes": tidelog_memory::rss_bytes(),
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

#[derive(Debug, Deserialize)]
struct ReadQuery {
    mode: Option<String>,
    at: Option<String>,
}

/// A request's read mode from its `mode` and `at`.
fn read_mode(mode: Option<&str>, at: Option<&str>) -> Result<ReadMode, ApiError> {
    let at = match at {
        Some(a) => Some(HybridTime(admin::parse_ht("at", a)?)),
        None => None,
    };
    ReadMode::parse(mode, at).map_err(api_error)
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
    let mode = read_mode(q.mode.as_deref(), q.at.as_deref())?;
    let k = key.clone();
    let r = call(&s, move |a| a.read(&k, mode)).await?;
    Ok(Json(json!({
        "key": JsonBytes(key),
        "found": r.value.is_some(),
        "value": r.value.map(JsonBytes),
        "version_ht": r.version_ht.map(ht),
        "read_ht": ht(r.read_ht),
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
    let mode = read_mode(q.mode.as_deref(), q.at.as_deref())?;
    let limit = limit(q.limit, 1000, 100_000)?;
    let r = call(&s, move |a| a.scan(&prefix, mode, limit)).await?;
    let items: Vec<Value> = r
        .items
        .into_iter()
        .map(|(k, v, h)| json!({"key": JsonBytes(k), "value": JsonBytes(v), "version_ht": ht(h)}))
        .collect();
    Ok(Json(
        json!({"read_ht": ht(r.read_ht), "items": items, "more": r.more}),
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
        let deadline = std::time::Instant::now() + wait;
        s.applier
            .wait_safe_time(target, deadline)
            .await
            .map_err(api_error)?;
    } else if q.wait.is_some() {
        return Err(ApiError::bad_request("wait needs wait-for=HT"));
    }
    let r = s.applier.safe_time();
    let tablets: serde_json::Map<String, Value> = r
        .tablets
        .iter()
        .map(|(t, st)| {
            let row = json!({"safe_time": ht(st.safe_time), "lag_ms": st.lag_ms});
            (t.to_string(), row)
        })
        .collect();
    Ok(Json(json!({
        "initialized": r.safe_time.is_some(),
        "safe_time": r.safe_time.map(ht),
        "lag_ms": r.lag_ms,
        "laggiest_tablet": r.laggiest_tablet.map(|t| t.to_string()),
        "reason": r.reason,
        "skew_ms": r.skew_ms,
        "pending_txns": r.pending_txns,
        "tablets": tablets,
    })))
}

#[derive(Debug, Deserialize)]
struct TabletQuery {
    tablet: Option<String>,
}

/// Pauses or resumes the intake of `?tablet=T` or of all; waits for a group the intake
/// writer has begun (its fsync): off the runtime.
async fn set_paused(
    s: &ApplierState,
    q: &TabletQuery,
    paused: bool,
) -> Result<Json<Value>, ApiError> {
    let t = admin::parse_tablet(q.tablet.as_deref())?;
    call(s, move |a| a.pause(t.as_ref(), paused)).await?;
    Ok(Json(json!({"ok": true})))
}

async fn pause(
    State(s): State<ApplierState>,
    ApiQuery(q): ApiQuery<TabletQuery>,
) -> Result<Json<Value>, ApiError> {
    set_paused(&s, &q, true).await
}

async fn resume(
    State(s): State<ApplierState>,
    ApiQuery(q): ApiQuery<TabletQuery>,
) -> Result<Json<Value>, ApiError> {
    set_paused(&s, &q, false).await
}

/// `GET /metrics`: the registered families ([`crate::metrics::exposition`]), encoded off
/// the runtime (locks, one store read).
pub async fn metrics(State(s): State<ApplierState>) -> axum::response::Response {
    let text = tokio::task::spawn_blocking(move || crate::metrics::exposition(&s.registry))
        .await
        .unwrap_or_default();
    admin::prometheus(text)
}

#[derive(Debug, Deserialize)]
struct TrxParams {
    gtid: Option<String>,
    wait: Option<String>,
}

/// `GET /v1/trx/{trx_id}?gtid=G&wait=D`. Every id, however malformed, gets an answer
/// (`UNKNOWN` with a reason) — also one that is not UTF-8 or has a bad `%` escape, so the
/// id is taken from the raw path; only a bad `wait` is a 400. The look-up is a few point
/// reads and runs inline; only a hint that is not visible yet waits
/// ([`Applier::trx_status`]).
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
        Some(w) => admin::parse_wait("wait", w)?,
    };
    let answer = s
        .applier
        .trx_status(&trx_id, q.gtid.as_deref(), wait)
        .await
        .map_err(api_error)?;
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
    let page = call(&s, move |a| a.binlog(from, limit)).await?;
    let entries: Vec<Value> = page
        .entries
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
        "safe_time": page.safe_time.map(ht),
        "entries": entries,
        "more": page.more,
    })))
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

/// `POST /v1/promote` (docs/ARCHITECTURE.md, "Cutover"; [`Applier::promote`]).
async fn promote(State(s): State<ApplierState>) -> Result<Json<Value>, ApiError> {
    let c = s.applier.promote().await.map_err(api_error)?;
    Ok(Json(cutover_json(&c)))
}
