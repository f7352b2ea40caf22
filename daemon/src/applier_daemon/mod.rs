//! `tidelog apply --config F`: the applier daemon. Adapts the configuration to
//! [`ApplierOptions`], opens the applier ([`tidelog_applier::node::Applier`]: intake,
//! apply workers, safe time, retention, cutover), serves its admin API on the Unix socket
//! ([`api`]), and runs it the way systemd expects: `READY=1` only after recovery,
//! watchdog pings, `STATUS=` lines, and on SIGTERM/SIGINT a clean stop (intake closed,
//! queued frames written and synced, workers stopped, store persisted, QUIC closed).

mod api;

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use tidelog_applier::intake::IntakeOptions;
use tidelog_applier::node::{Applier, ApplierOptions, MAX_WAITERS};
use tidelog_applier::store::StoreOptions;
use tidelog_net::tls::TlsMaterial;
use tidelog_sql::{SqlOptions, SqlServer};

use crate::admin;
use crate::config::{self, ApplierConfig};
use crate::signals::Signals;
use crate::{metrics, notify, preflight, service};

pub use api::ApplierState;

/// A graceful stop that takes longer exits at once (the unit's TimeoutStopSec is 60 s).
const STOP_BOUND: std::time::Duration = std::time::Duration::from_secs(50);

/// Runs the applier until SIGTERM/SIGINT. With `check`, does what start-up does before its
/// first side effect ([`preflight`]) and exits.
pub fn run(config_path: &Path, check: bool) -> Result<()> {
    let cfg = config::check_applier(config_path)?;
    let (tls, sql, warnings) = preflight(&cfg).map_err(|e| config::named(config_path, &e))?;
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
    rt.block_on(serve(cfg, tls, sql))
}

/// Everything a start would refuse, found without side effects: all `--check` does after
/// parsing, and the first thing a start does, so the two cannot drift. Loads `[tls]`
/// ([`TlsMaterial::load`]) and builds the QUIC server config the intake will build
/// from it; checks the intake's options as its received logs' writers will
/// (`segment-size`), `data-dir` a directory it can write or make (and a QUIC reset key
/// there readable), the `listen` and `metrics-listen` addresses free, and the admin socket
/// bindable ([`admin::check_bind`]); with `[sql]`, its password file (read, and refused
/// when group or others can read it), its TLS configuration and its TCP address free
/// ([`crate::sql_config::sql_options`]). The error names the key (`key "tls.key":
/// …`), also for a certificate that expired or is not valid yet; the warnings are a
/// private key others can read and a certificate that expires within 30 days.
fn preflight(cfg: &ApplierConfig) -> Result<(TlsMaterial, Option<SqlOptions>, Vec<String>)> {
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
    let sql = match &cfg.sql {
        None => None,
        Some(s) => {
            let o = crate::sql_config::sql_options(s, &tls)?;
            preflight::tcp_free("sql.listen", s.listen)?;
            Some(o)
        }
    };
    Ok((tls, sql, warnings))
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

/// The applier's options from the config.
fn options(cfg: &ApplierConfig, tls: TlsMaterial) -> ApplierOptions {
    ApplierOptions {
        intake: intake_options(cfg),
        tls,
        store: StoreOptions {
            cache_size: cfg.cache_size,
            write_buffer_size: cfg.write_buffer_size,
        },
        expect_tablets: cfg.expect_tablets.clone(),
        apply_threads: cfg.effective_apply_threads(),
        apply_nice: cfg.apply_nice,
        store_nice: cfg.store_nice,
        apply_yield_to_intake: cfg.apply_yield_to_intake,
        max_staleness: cfg.max_staleness,
        binlog_retention: cfg.binlog_retention,
        max_waiters: MAX_WAITERS,
    }
}

async fn serve(cfg: ApplierConfig, tls: TlsMaterial, sql: Option<SqlOptions>) -> Result<()> {
    // Before anything slow: a SIGTERM from now on is handled, never the default kill.
    let mut signals = Signals::install()?;
    notify::status("recovering: opening the store and the received logs");
    let applier = Applier::open(options(&cfg, tls)).await?;
    match signals
        .unless_stopped(applier.recover(notify::status))
        .await
    {
        Some(r) => r.context("recovery")?,
        None => {
            notify::stopping();
            applier.shutdown().await?;
            tracing::info!("applier stopped");
            return Ok(());
        }
    }
    // Bound before READY=1, like the admin socket.
    let sql = match sql {
        Some(o) => Some(Arc::new(SqlServer::start(applier.clone(), o).await?)),
        None => None,
    };
    let state = ApplierState::new(applier.clone(), Arc::new(cfg.clone()), sql.clone());
    let stop = admin::StopSignal::new();
    let stopped = || stop.stopped();
    // Bound before READY=1: `tidelog ctl` works as soon as systemd says the unit started.
    let listener = admin::bind(&cfg.admin_socket).await?;
    let socket = cfg.admin_socket.clone();
    let (st2, admin_stop) = (state.clone(), stopped());
    let mut admin_task = tokio::spawn(async move {
        admin::serve_bound(listener, &socket, api::router(st2), admin_stop).await
    });
    if let Some(addr) = cfg.metrics_listen {
        let r = metrics::metrics_only(axum::routing::get(api::metrics), state.clone());
        metrics::serve_tcp(addr, r, stopped()).await?;
    }
    tracing::info!(listen = %applier.intake().local_addr()?, data_dir = %cfg.data_dir.display(), "applier ready");
    notify::ready();
    let a3 = applier.clone();
    let _watchdog = notify::spawn_watchdog(move |limit| match a3.stalled(limit) {
        Some(what) => Err(what),
        None => Ok(()),
    });
    let a4 = applier.clone();
    let status_task = notify::spawn_status(service::STATUS_INTERVAL, move || {
        service::applier_status(&a4)
    });
    let admin_failed = signals.first(&mut admin_task).await?;
    signals.during_stop(STOP_BOUND);
    notify::stopping();
    if let Some(t) = status_task {
        t.abort();
    }
    if let Some(sql) = &sql {
        sql.shutdown().await;
    }
    notify::status("stopping: writing queued frames");
    applier.shutdown().await?;
    admin::wind_down(&stop, admin_failed, admin_task).await?;
    tracing::info!("applier stopped");
    Ok(())
}
