//! `tidelog ship --config F`: the shipper daemon. Starts the shipper lanes and the admin
//! API, reports readiness to systemd, and on SIGTERM/SIGINT stops shipping, records the
//! acknowledged positions and closes the QUIC connections gracefully.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tidelog_shipper::io::IoChoice;
use tidelog_shipper::{Shipper, ShipperOptions, TlsMaterial};
use tidelog_wal::TabletId;

use crate::admin::{self, ApiError, ApiQuery};
use crate::applier_daemon::tls_material;
use crate::config::{self, IoEngine, ShipperConfig};
use crate::signals::Signals;
use crate::{metrics, notify, service};

/// A graceful stop that takes longer exits at once (the unit's TimeoutStopSec is 30 s).
const STOP_BOUND: std::time::Duration = std::time::Duration::from_secs(25);

/// How long READY=1 waits for the lanes' first connection attempts to end (an unreachable
/// applier can hold a QUIC handshake until `quic.idle-timeout`); the lanes keep retrying.
const FIRST_ATTEMPT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the shipper until SIGTERM/SIGINT. With `check`, validates the config and exits.
pub fn run(config_path: &Path, check: bool) -> Result<()> {
    let cfg = config::check_shipper(config_path)?;
    if check {
        println!("{}: ok", config_path.display());
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(serve(cfg))
}

/// The library options for a config.
pub fn options(cfg: &ShipperConfig) -> Result<ShipperOptions> {
    let mut o = ShipperOptions::new(cfg.wal_dir.clone(), cfg.applier_addr()?);
    o.server_name = cfg.server_name.clone();
    o.shipper_id = cfg.shipper_id.clone();
    o.io_engine = match cfg.io_engine {
        IoEngine::Auto => IoChoice::Auto,
        IoEngine::Uring => IoChoice::Uring,
        IoEngine::Std => IoChoice::Std,
    };
    o.lanes = cfg.lanes;
    o.max_frame_bytes = usize::try_from(cfg.max_frame_bytes).context("max-frame-bytes")?;
    o.window_bytes = cfg.window_bytes;
    o.keepalive_interval = cfg.keepalive_interval;
    o.poll_interval = cfg.poll_interval;
    o.reconnect_min = cfg.reconnect_min;
    o.reconnect_max = cfg.reconnect_max;
    o.ship_unsynced = cfg.ship_unsynced;
    o.quic = tidelog_wal::wire::QuicTuning {
        receive_window: cfg.quic.receive_window,
        stream_receive_window: cfg.quic.stream_receive_window,
        max_udp_payload: cfg.quic.max_udp_payload,
        idle_timeout: cfg.quic.idle_timeout,
    };
    Ok(o)
}

async fn serve(cfg: ShipperConfig) -> Result<()> {
    // Before anything slow: a SIGTERM from now on is handled, never the default kill.
    let mut signals = Signals::install()?;
    notify::status("starting: scanning the WAL directory, connecting to the applier");
    let (ca, chain, key) = tls_material(&cfg.tls)?;
    let opts = options(&cfg)?;
    let shipper = Arc::new(
        tokio::task::spawn_blocking(move || Shipper::start(opts, TlsMaterial { ca, chain, key }))
            .await??,
    );
    let stop = admin::StopSignal::new();
    let stopped = || stop.stopped();
    let listener = admin::bind(&cfg.admin_socket).await?;
    let socket = cfg.admin_socket.clone();
    let (st, admin_stop) = (shipper.clone(), stopped());
    let mut admin_task =
        tokio::spawn(
            async move { admin::serve_bound(listener, &socket, router(st), admin_stop).await },
        );
    if let Some(addr) = cfg.metrics_listen {
        let r = metrics::metrics_only(get(metrics), shipper.clone());
        metrics::serve_tcp(addr, r, stopped()).await?;
    }
    // READY=1 once every lane's first connection attempt has ended (or timed out here).
    let s2 = shipper.clone();
    let started = tokio::task::spawn_blocking(move || s2.wait_started(FIRST_ATTEMPT_WAIT))
        .await
        .unwrap_or(false);
    if !started {
        tracing::warn!(applier = %cfg.applier, "no answer from the applier yet; ready anyway, the lanes keep trying");
    }
    tracing::info!(
        applier = %cfg.applier, wal_dir = %cfg.wal_dir.display(),
        io_engine = shipper.io_engine().name(), lanes = shipper.lanes(),
        connected_lanes = shipper.connected_lanes(), "shipper ready"
    );
    notify::ready();
    let s3 = shipper.clone();
    let _watchdog = notify::spawn_watchdog(move |limit| service::shipper_liveness(&s3, limit));
    let (s4, applier) = (shipper.clone(), cfg.applier.clone());
    let status_task = notify::spawn_status(service::STATUS_INTERVAL, move || {
        service::shipper_status(&s4, &applier)
    });
    let admin_failed = signals.first(&mut admin_task).await?;
    signals.during_stop(STOP_BOUND);
    notify::stopping();
    if let Some(t) = status_task {
        t.abort();
    }
    notify::status("stopping: recording acked positions, closing QUIC");
    let s2 = shipper.clone();
    tokio::task::spawn_blocking(move || s2.shutdown()).await?;
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
    tracing::info!("shipper stopped");
    Ok(())
}

fn router(s: Arc<Shipper>) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/pause", post(pause))
        .route("/v1/resume", post(resume))
        .route("/metrics", get(metrics))
        .with_state(s)
}

async fn status(State(s): State<Arc<Shipper>>) -> Json<Value> {
    let tablets: serde_json::Map<String, Value> = s
        .status()
        .into_iter()
        .map(|(t, st)| {
            (
                t.to_string(),
                serde_json::to_value(st).unwrap_or(Value::Null),
            )
        })
        .collect();
    Json(json!({
        "io_engine": s.io_engine().name(),
        "io_engine_note": s.io_engine_note(),
        "lanes": s.lanes(),
        "connected_lanes": s.connected_lanes(),
        "tablets": tablets,
    }))
}

#[derive(Debug, Deserialize)]
struct TabletQuery {
    tablet: Option<String>,
}

fn set_paused(s: &Shipper, q: &TabletQuery, paused: bool) -> Result<Json<Value>, ApiError> {
    let t = q
        .tablet
        .as_deref()
        .map(|t| {
            t.parse::<TabletId>()
                .map_err(|e| ApiError::bad_request(format!("tablet: {e}")))
        })
        .transpose()?;
    // An unknown tablet is a bad request (404 is for an unknown route); the message
    // names it: "unknown tablet T".
    s.set_paused(t.as_ref(), paused)
        .map_err(|e| ApiError::bad_request(format!("{e:#}")))?;
    Ok(Json(json!({"ok": true})))
}

async fn pause(
    State(s): State<Arc<Shipper>>,
    ApiQuery(q): ApiQuery<TabletQuery>,
) -> Result<Json<Value>, ApiError> {
    set_paused(&s, &q, true)
}

async fn resume(
    State(s): State<Arc<Shipper>>,
    ApiQuery(q): ApiQuery<TabletQuery>,
) -> Result<Json<Value>, ApiError> {
    set_paused(&s, &q, false)
}

async fn metrics(State(s): State<Arc<Shipper>>) -> axum::response::Response {
    admin::prometheus(metrics::shipper(&s))
}
