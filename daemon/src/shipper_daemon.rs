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
use crate::applier_daemon::{tls_material, wait_for_signal};
use crate::config::{self, IoEngine, ShipperConfig};
use crate::notify;

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
    let (ca, chain, key) = tls_material(&cfg.tls)?;
    let opts = options(&cfg)?;
    let shipper = Arc::new(
        tokio::task::spawn_blocking(move || Shipper::start(opts, TlsMaterial { ca, chain, key }))
            .await??,
    );
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let socket = cfg.admin_socket.clone();
    let st = shipper.clone();
    let admin_task = tokio::spawn(async move {
        admin::serve(&socket, router(st), async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        })
        .await
    });
    tracing::info!(
        applier = %cfg.applier, wal_dir = %cfg.wal_dir.display(),
        io_engine = shipper.io_engine().name(), lanes = shipper.lanes(), "shipper ready"
    );
    notify::ready();
    let _watchdog = notify::spawn_watchdog();
    notify::status(&format!(
        "shipping {} to {} ({} lanes, io {})",
        cfg.wal_dir.display(),
        cfg.applier,
        shipper.lanes(),
        shipper.io_engine().name()
    ));
    let admin_failed = wait_for_signal(admin_task).await?;
    notify::stopping();
    let s2 = shipper.clone();
    tokio::task::spawn_blocking(move || s2.shutdown()).await?;
    let _ = stop_tx.send(true);
    if let Some(e) = admin_failed {
        return Err(e);
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
    s.set_paused(t.as_ref(), paused)
        .map_err(|e| ApiError::not_found(format!("{e:#}")))?;
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
    let st = s.status();
    let mut out = String::new();
    type Field = fn(&tidelog_shipper::TabletShipStatus) -> u64;
    let gauges: [(&str, &str, Field); 6] = [
        (
            "tidelog_shipper_durable_pos_bytes",
            "Source durable end.",
            |t| t.durable_pos,
        ),
        ("tidelog_shipper_shipped_pos_bytes", "Shipped up to.", |t| {
            t.shipped_pos
        }),
        (
            "tidelog_shipper_acked_pos_bytes",
            "Acknowledged durable by the applier.",
            |t| t.acked_pos,
        ),
        (
            "tidelog_shipper_lag_bytes",
            "Durable at the source, not yet acked.",
            |t| t.lag_bytes,
        ),
        (
            "tidelog_shipper_records_shipped_total",
            "Records shipped.",
            |t| t.records_shipped,
        ),
        ("tidelog_shipper_frames_total", "Frames sent.", |t| t.frames),
    ];
    for (name, help, f) in gauges {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (t, row) in &st {
            out.push_str(&format!("{name}{{tablet=\"{t}\"}} {}\n", f(row)));
        }
    }
    out.push_str(&format!(
        "# HELP tidelog_shipper_io_engine The WAL read engine in use.\n# TYPE tidelog_shipper_io_engine gauge\ntidelog_shipper_io_engine{{engine=\"{}\"}} 1\n",
        s.io_engine().name()
    ));
    out.push_str(&format!(
        "# HELP tidelog_shipper_connected_lanes Lanes with a live QUIC connection.\n# TYPE tidelog_shipper_connected_lanes gauge\ntidelog_shipper_connected_lanes {}\n",
        s.connected_lanes()
    ));
    admin::prometheus(out)
}
