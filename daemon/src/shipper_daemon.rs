//! `tidelog ship --config F`: the shipper daemon. Starts the shipper lanes and the admin
//! API, reports readiness to systemd, and on SIGTERM/SIGINT stops shipping, records the
//! acknowledged positions and closes the QUIC connections gracefully.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tidelog_shipper::io::IoChoice;
use tidelog_shipper::{Shipper, ShipperOptions, TlsMaterial};

use crate::admin::{self, ApiError, ApiQuery};
use crate::config::{self, IoEngine, ShipperConfig};
use crate::signals::Signals;
use crate::{metrics, notify, service};

/// A graceful stop that takes longer exits at once (the unit's TimeoutStopSec is 30 s).
const STOP_BOUND: std::time::Duration = std::time::Duration::from_secs(25);

/// How long READY=1 waits for the lanes' first connection attempts to end (an unreachable
/// applier can hold a QUIC handshake until `quic.idle-timeout`); the lanes keep retrying.
const FIRST_ATTEMPT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the shipper until SIGTERM/SIGINT. With `check`, does what start-up does before its
/// first side effect ([`preflight`]) and exits.
pub fn run(config_path: &Path, check: bool) -> Result<()> {
    let cfg = config::check_shipper(config_path)?;
    let (tls, warnings) = preflight(&cfg, check).map_err(|e| config::named(config_path, &e))?;
    config::report_warnings(config_path, &warnings, check);
    if check {
        println!("{}: ok", config_path.display());
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(serve(cfg, tls))
}

/// Everything a start would refuse, found without side effects: all `--check` does after
/// parsing, and the first thing a start does, so the two cannot drift. The library
/// options, `[tls]` loaded ([`TlsMaterial::load`]) and the QUIC client config built
/// from it as the lanes build it, the I/O engine chosen the way [`Shipper::start`] chooses
/// it (`io-engine = "uring"` without a working io_uring fails), `metrics-listen` free and
/// the admin socket bindable ([`admin::check_bind`]).
/// The error names the key (`key "tls.key": …`), also for a certificate that expired or is
/// not valid yet; the warnings are a private key others can read, a certificate that
/// expires within 30 days and, with `check`, `auto` falling back to `std` (a start logs
/// that itself).
fn preflight(cfg: &ShipperConfig, check: bool) -> Result<(TlsMaterial, Vec<String>)> {
    let opts = options(cfg)?;
    let (tls, mut warnings) = TlsMaterial::load_checked(&cfg.tls.files())?;
    warnings.extend(cfg.wal_dir_missing());
    tidelog_net::tls::client_config(&tls, &opts.quic).context("[tls]")?;
    match tidelog_shipper::io::choose(opts.io_engine) {
        Err(e) => bail!("key \"io-engine\": {e}"),
        Ok((_, Some(why))) if check => warnings.push(format!(
            "key \"io-engine\": \"{}\" falls back to the std engine: io_uring is unavailable \
             ({why})",
            cfg.io_engine
        )),
        Ok(_) => {}
    }
    if let Some(addr) = cfg.metrics_listen {
        crate::preflight::tcp_free("metrics-listen", addr)?;
    }
    admin::check_bind(&cfg.admin_socket)?;
    Ok((tls, warnings))
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
    o.quic = cfg.quic.tuning();
    o.ca_file = Some(cfg.tls.ca.clone());
    Ok(o)
}

async fn serve(cfg: ShipperConfig, tls: TlsMaterial) -> Result<()> {
    // Before anything slow: a SIGTERM from now on is handled, never the default kill.
    let mut signals = Signals::install()?;
    notify::status("starting: scanning the WAL directory, connecting to the applier");
    let opts = options(&cfg)?;
    let shipper = Arc::new(tokio::task::spawn_blocking(move || Shipper::start(opts, tls)).await??);
    let stop = admin::StopSignal::new();
    let stopped = || stop.stopped();
    let listener = admin::bind(&cfg.admin_socket).await?;
    let socket = cfg.admin_socket.clone();
    let state = ShipperState::new(shipper.clone());
    let (st, admin_stop) = (state.clone(), stopped());
    let mut admin_task =
        tokio::spawn(
            async move { admin::serve_bound(listener, &socket, router(st), admin_stop).await },
        );
    if let Some(addr) = cfg.metrics_listen {
        let r = metrics::metrics_only(get(metrics), state.clone());
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
    admin::wind_down(&stop, admin_failed, admin_task).await?;
    tracing::info!("shipper stopped");
    Ok(())
}

/// What the admin handlers read: the shipper, and its metric families registered once.
#[derive(Debug, Clone)]
struct ShipperState {
    shipper: Arc<Shipper>,
    registry: Arc<prometheus_client::registry::Registry>,
}

impl ShipperState {
    fn new(shipper: Arc<Shipper>) -> ShipperState {
        let mut registry = prometheus_client::registry::Registry::default();
        tidelog_shipper::metrics::register(shipper.clone(), &mut registry);
        ShipperState {
            shipper,
            registry: Arc::new(registry),
        }
    }
}

impl axum::extract::FromRef<ShipperState> for Arc<Shipper> {
    fn from_ref(s: &ShipperState) -> Arc<Shipper> {
        s.shipper.clone()
    }
}

fn router(s: ShipperState) -> Router {
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
    let t = admin::parse_tablet(q.tablet.as_deref())?;
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

/// `GET /metrics` (atomics only: cheap enough to encode on the runtime).
async fn metrics(State(s): State<ShipperState>) -> axum::response::Response {
    admin::prometheus(metrics::exposition(&s.registry))
}
