//! `GET /metrics` of both daemons: Prometheus text exposition (format 0.0.4), served on the
//! admin socket and, with `metrics-listen`, on a TCP address.
//!
//! Names are `tidelog_<component>_<thing>_<unit>`; counters end in `_total`, and count
//! from the daemon's start (Prometheus handles the reset at a restart). Positions are
//! byte offsets in a tablet's log; times are seconds. Everything is read from atomics the
//! shipping and applying threads keep anyway, except the applier's safe-time report (one
//! short lock of the consistency core) and its role (one store read).

use std::fmt::{Display, Write as _};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use axum::Router;
use tidelog_applier::latency::{HistogramSnapshot, BUCKETS_SECONDS};
use tidelog_applier::trx::TrxState;
use tidelog_shipper::Shipper;
use tidelog_wal::HybridTime;

use crate::applier_daemon::{ApplierState, APPLY_FAILED};

/// A metric family's type.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Builds one exposition: each family's `# HELP` and `# TYPE`, then its samples.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

/// Escapes a label value (`\`, `"` and newlines).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts a family.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample of the current family.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A family with one sample per tablet.
    pub fn per_tablet<T: Display>(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        rows: impl IntoIterator<Item = (String, T)>,
    ) {
        self.family(name, kind, help);
        for (t, v) in rows {
            self.sample(name, &[("tablet", &t)], v);
        }
    }

    /// A whole histogram family (`_bucket{le=…}`, `_sum`, `_count`) in seconds.
    pub fn histogram(&mut self, name: &str, help: &str, h: &HistogramSnapshot) {
        self.family(name, Kind::Histogram, help);
        self.histogram_series(name, None, h);
    }

    /// One histogram family with a series per value of label `label`.
    pub fn histograms(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        series: &[(&str, &HistogramSnapshot)],
    ) {
        self.family(name, Kind::Histogram, help);
        for (value, h) in series {
            self.histogram_series(name, Some((label, value)), h);
        }
    }

    fn histogram_series(&mut self, name: &str, label: Option<(&str, &str)>, h: &HistogramSnapshot) {
        let bucket = format!("{name}_bucket");
        let base: Vec<(&str, &str)> = label.into_iter().collect();
        for (i, le) in BUCKETS_SECONDS.iter().enumerate() {
            let le = le.to_string();
            let n = h.cumulative.get(i).copied().unwrap_or(0);
            self.sample(
                &bucket,
                &[base.as_slice(), &[("le", le.as_str())]].concat(),
                n,
            );
        }
        self.sample(
            &bucket,
            &[base.as_slice(), &[("le", "+Inf")]].concat(),
            h.count,
        );
        let sum = h.sum_micros as f64 / 1_000_000.0;
        self.sample(&format!("{name}_sum"), &base, sum);
        self.sample(&format!("{name}_count"), &base, h.count);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Seconds between a hybrid time's physical part and `now` (0 when in the future).
fn lag_seconds(now_us: u64, h: HybridTime) -> f64 {
    now_us.saturating_sub(h.physical_micros()) as f64 / 1_000_000.0
}

/// One tablet's numbers on the applier, gathered under the workers lock.
struct ApplierRow {
    tablet: String,
    state: &'static str,
    received_pos: u64,
    received_bytes: u64,
    received_records: u64,
    frame_errors: u64,
    checksum_errors: u64,
    applied_pos: u64,
    applied_bytes: u64,
    applied_records: u64,
    safe_time: HybridTime,
}

/// The applier's metrics. Blocking (locks, one store read): call it off the runtime.
pub fn applier(s: &ApplierState) -> String {
    let mut latency = HistogramSnapshot::empty();
    let (mut received_age, mut applied_age) =
        (HistogramSnapshot::empty(), HistogramSnapshot::empty());
    let rows: Vec<ApplierRow> = {
        let workers = s.appliers.workers();
        s.intake
            .tablets()
            .iter()
            .map(|ti| {
                let st = ti.status();
                let (frame_errors, checksum_errors) = ti.frame_errors();
                received_age.merge(&ti.received_age());
                let w = workers.get(&ti.tablet);
                if let Some(w) = w {
                    latency.merge(&w.batch_latency());
                    applied_age.merge(&w.applied_age());
                }
                let failed = w.is_some_and(|w| w.error().is_some());
                ApplierRow {
                    tablet: ti.tablet.to_string(),
                    state: if failed { APPLY_FAILED } else { st.state },
                    received_pos: st.received_pos,
                    received_bytes: st.bytes,
                    received_records: st.records,
                    frame_errors,
                    checksum_errors,
                    applied_pos: w.map_or(0, |w| w.applied_pos().0),
                    applied_bytes: w.map_or(0, |w| w.applied_bytes()),
                    applied_records: w.map_or(0, |w| w.applied_records()),
                    safe_time: w.map_or(HybridTime::default(), |w| w.safe_time()),
                }
            })
            .collect()
    };
    let report = s.consistency.report();
    let now = now_micros();
    let role = match s.store.role() {
        Ok(tidelog_applier::store::Role::Primary) => "primary",
        Ok(tidelog_applier::store::Role::Standby) => "replica",
        Err(e) => {
            tracing::warn!("metrics: reading the role: {e}");
            "unknown"
        }
    };
    let mut m = Exposition::new();
    m.family(
        "tidelog_applier_role",
        Kind::Gauge,
        "The applier's role: 1 for the current one (replica until promoted, then primary).",
    );
    m.sample("tidelog_applier_role", &[("role", role)], 1);

    m.family(
        "tidelog_applier_records_below_safe_time_total",
        Kind::Counter,
        "Records applied at or below the published safe time: a tablet registered after the safe time passed its records (added while running); consistent reads before it registered did not include them.",
    );
    m.sample(
        "tidelog_applier_records_below_safe_time_total",
        &[],
        s.consistency.records_below_safe_time(),
    );

    // Safe time (docs/ARCHITECTURE.md, "Safe time"): the global one, its lag behind the
    // wall clock, the skew.
    m.family(
        "tidelog_applier_safe_time_initialized",
        Kind::Gauge,
        "1 once every expected tablet has reported and safe time is published.",
    );
    m.sample(
        "tidelog_applier_safe_time_initialized",
        &[],
        u8::from(report.safe_time.is_some()),
    );
    if let Some(safe) = report.safe_time {
        m.family(
            "tidelog_applier_safe_time_seconds",
            Kind::Gauge,
            "The global safe time (physical part), as a Unix time in seconds.",
        );
        m.sample(
            "tidelog_applier_safe_time_seconds",
            &[],
            safe.physical_micros() as f64 / 1_000_000.0,
        );
        m.family(
            "tidelog_applier_safe_time_lag_seconds",
            Kind::Gauge,
            "Wall clock minus the global safe time: how stale a consistent read is.",
        );
        m.sample(
            "tidelog_applier_safe_time_lag_seconds",
            &[],
            lag_seconds(now, safe),
        );
    }
    let reported: Vec<HybridTime> = report
        .tablets
        .values()
        .copied()
        .filter(|h| *h != HybridTime::MIN)
        .collect();
    let skew = match (reported.iter().min(), reported.iter().max()) {
        (Some(lo), Some(hi)) => {
            hi.physical_micros().saturating_sub(lo.physical_micros()) as f64 / 1_000_000.0
        }
        _ => 0.0,
    };
    m.family(
        "tidelog_applier_safe_time_skew_seconds",
        Kind::Gauge,
        "Newest minus oldest tablet safe time among the tablets that reported.",
    );
    m.sample("tidelog_applier_safe_time_skew_seconds", &[], skew);
    m.per_tablet(
        "tidelog_applier_tablet_safe_time_lag_seconds",
        Kind::Gauge,
        "Wall clock minus the tablet's safe time (its last applied record or heartbeat).",
        report
            .tablets
            .iter()
            .filter(|(_, h)| **h != HybridTime::MIN)
            .map(|(t, h)| (t.to_string(), lag_seconds(now, *h))),
    );
    m.family(
        "tidelog_applier_pending_transactions",
        Kind::Gauge,
        "Committed transactions not yet applied on every participant tablet.",
    );
    m.sample(
        "tidelog_applier_pending_transactions",
        &[],
        report.pending_txns,
    );

    // Intake: what arrived, what was acknowledged, what was refused.
    m.family(
        "tidelog_applier_connections_total",
        Kind::Counter,
        "Shipper connections accepted (a reconnecting shipper adds one each time).",
    );
    m.sample(
        "tidelog_applier_connections_total",
        &[],
        s.intake.connections_total(),
    );
    let y = s.appliers.threads.yield_status();
    m.family(
        "tidelog_applier_apply_held_back_seconds_total",
        Kind::Counter,
        "Time the apply threads held back for a catch-up (apply-yield-to-intake), summed over the threads.",
    );
    m.sample(
        "tidelog_applier_apply_held_back_seconds_total",
        &[],
        y.held_total.as_secs_f64(),
    );
    m.family(
        "tidelog_applier_apply_threads_holding_back",
        Kind::Gauge,
        "Apply threads holding back for a catch-up now.",
    );
    m.sample(
        "tidelog_applier_apply_threads_holding_back",
        &[],
        y.holding_threads,
    );
    let col = |f: fn(&ApplierRow) -> u64| -> Vec<(String, u64)> {
        rows.iter().map(|r| (r.tablet.clone(), f(r))).collect()
    };
    m.per_tablet(
        "tidelog_applier_received_bytes_total",
        Kind::Counter,
        "Record bytes received and durable in the tablet's received log.",
        col(|r| r.received_bytes),
    );
    m.per_tablet(
        "tidelog_applier_received_records_total",
        Kind::Counter,
        "Records received and durable in the tablet's received log.",
        col(|r| r.received_records),
    );
    m.per_tablet(
        "tidelog_applier_received_pos_bytes",
        Kind::Gauge,
        "Durable end of the received log: the position acknowledged to the shipper.",
        col(|r| r.received_pos),
    );
    m.per_tablet(
        "tidelog_applier_frame_errors_total",
        Kind::Counter,
        "Frames refused (malformed, bad record, bad checksum or wrong position); nothing of them was written.",
        col(|r| r.frame_errors),
    );
    m.per_tablet(
        "tidelog_applier_checksum_errors_total",
        Kind::Counter,
        "Frames refused because a message or record checksum did not match.",
        col(|r| r.checksum_errors),
    );

    // Apply.
    m.per_tablet(
        "tidelog_applier_applied_bytes_total",
        Kind::Counter,
        "Received-log bytes applied into the store.",
        col(|r| r.applied_bytes),
    );
    m.per_tablet(
        "tidelog_applier_applied_records_total",
        Kind::Counter,
        "Records applied into the store.",
        col(|r| r.applied_records),
    );
    m.per_tablet(
        "tidelog_applier_applied_pos_bytes",
        Kind::Gauge,
        "Position in the received log applied up to.",
        col(|r| r.applied_pos),
    );
    m.per_tablet(
        "tidelog_applier_apply_lag_bytes",
        Kind::Gauge,
        "Received but not yet applied.",
        col(|r| r.received_pos.saturating_sub(r.applied_pos)),
    );
    m.per_tablet(
        "tidelog_applier_tablet_safe_time_seconds",
        Kind::Gauge,
        "The tablet's safe time (physical part) as a Unix time in seconds; 0 before its first record.",
        rows.iter()
            .map(|r| (r.tablet.clone(), r.safe_time.physical_micros() as f64 / 1_000_000.0))
            .collect::<Vec<_>>(),
    );
    m.family(
        "tidelog_applier_tablet_state",
        Kind::Gauge,
        "1 for the tablet's current intake/apply state, 0 for the others (every state is exported, so series do not come and go).",
    );
    let applier_states = tidelog_applier::intake::TabletState::ALL
        .map(|st| st.name())
        .into_iter()
        .chain([APPLY_FAILED]);
    for r in &rows {
        for state in applier_states.clone() {
            m.sample(
                "tidelog_applier_tablet_state",
                &[("tablet", &r.tablet), ("state", state)],
                u64::from(state == r.state),
            );
        }
    }
    m.histogram(
        "tidelog_applier_apply_batch_duration_seconds",
        "Wall time of one apply batch (read from the received log, written to the store), all tablets.",
        &latency,
    );
    m.histogram(
        "tidelog_applier_safe_time_publish_duration_seconds",
        "Wall time of one safe-time publish: the new value written to the store's journal (after the batches it covers) before readers see it.",
        &s.consistency.publish_latency(),
    );
    m.histograms(
        "tidelog_applier_stage_lag_seconds",
        "How old the newest data is at each stage, by this host's clock against the source's hybrid times, all tablets: `received` once a group of frames is durable in the received log, `applied` once an apply batch is in the store, `visible` once a safe time is published to readers.",
        "stage",
        &[
            ("received", &received_age),
            ("applied", &applied_age),
            ("visible", &s.consistency.visible_age()),
        ],
    );

    // ---- trx_status (binlog and trx_status): the route counts its answers ------------
    m.family(
        "tidelog_applier_trx_status_lookups_total",
        Kind::Counter,
        "trx_status answers given, by state.",
    );
    for (i, st) in TrxState::ALL.iter().enumerate() {
        let n = s
            .trx_lookups
            .get(i)
            .map_or(0, |c| c.load(Ordering::Relaxed));
        m.sample(
            "tidelog_applier_trx_status_lookups_total",
            &[("state", st.name())],
            n,
        );
    }
    // ----------------------------------------------------------------------------------
    m.finish()
}

/// The shipper's metrics (atomics only: cheap enough to run on the runtime).
pub fn shipper(s: &Shipper) -> String {
    let st = s.status();
    let mut m = Exposition::new();
    m.family(
        "tidelog_shipper_io_engine",
        Kind::Gauge,
        "1 for the WAL read engine in use (uring or std).",
    );
    m.sample(
        "tidelog_shipper_io_engine",
        &[("engine", s.io_engine().name())],
        1,
    );
    m.family(
        "tidelog_shipper_lanes",
        Kind::Gauge,
        "Lane threads (each with its own QUIC connection).",
    );
    m.sample("tidelog_shipper_lanes", &[], s.lanes());
    m.family(
        "tidelog_shipper_connected_lanes",
        Kind::Gauge,
        "Lanes with a live QUIC connection to the applier.",
    );
    m.sample("tidelog_shipper_connected_lanes", &[], s.connected_lanes());
    m.family(
        "tidelog_shipper_reconnects_total",
        Kind::Counter,
        "Connections to the applier lost or failed, each followed by a reconnect attempt.",
    );
    m.sample("tidelog_shipper_reconnects_total", &[], s.reconnects());
    type Field = fn(&tidelog_shipper::TabletShipStatus) -> u64;
    let families: [(&str, Kind, &str, Field); 11] = [
        (
            "tidelog_shipper_shipped_bytes_total",
            Kind::Counter,
            "Record bytes shipped (sent in data frames).",
            |t| t.bytes_shipped,
        ),
        (
            "tidelog_shipper_shipped_records_total",
            Kind::Counter,
            "Records shipped.",
            |t| t.records_shipped,
        ),
        (
            "tidelog_shipper_acked_records_total",
            Kind::Counter,
            "Records acknowledged durable by the applier.",
            |t| t.records_acked,
        ),
        (
            "tidelog_shipper_frames_total",
            Kind::Counter,
            "Data frames sent.",
            |t| t.frames,
        ),
        (
            "tidelog_shipper_stream_reopens_total",
            Kind::Counter,
            "Times the tablet's stream was reopened after an error.",
            |t| t.stream_reopens,
        ),
        (
            "tidelog_shipper_durable_pos_bytes",
            Kind::Gauge,
            "Durable end of the source WAL.",
            |t| t.durable_pos,
        ),
        (
            "tidelog_shipper_shipped_pos_bytes",
            Kind::Gauge,
            "Shipped up to.",
            |t| t.shipped_pos,
        ),
        (
            "tidelog_shipper_acked_pos_bytes",
            Kind::Gauge,
            "Acknowledged durable by the applier up to.",
            |t| t.acked_pos,
        ),
        (
            "tidelog_shipper_lag_bytes",
            Kind::Gauge,
            "Durable at the source, not yet acknowledged.",
            |t| t.lag_bytes,
        ),
        (
            "tidelog_shipper_lag_records",
            Kind::Gauge,
            "Records shipped on the current stream, not yet acknowledged.",
            |t| t.lag_records,
        ),
        (
            "tidelog_shipper_tablet_lane",
            Kind::Gauge,
            "The lane that ships the tablet.",
            |t| t.lane,
        ),
    ];
    for (name, kind, help, f) in families {
        m.per_tablet(
            name,
            kind,
            help,
            st.iter().map(|(t, row)| (t.to_string(), f(row))),
        );
    }
    m.family(
        "tidelog_shipper_tablet_state",
        Kind::Gauge,
        "1 for the tablet's current shipping state, 0 for the others (every state is exported, so series do not come and go).",
    );
    for (t, row) in &st {
        for state in tidelog_shipper::ShipState::ALL.map(|st| st.name()) {
            m.sample(
                "tidelog_shipper_tablet_state",
                &[("tablet", t.as_ref()), ("state", state)],
                u64::from(state == row.state),
            );
        }
    }
    m.finish()
}

/// Serves `GET /metrics` (and nothing else) over plain HTTP on `addr` until `shutdown`.
/// Binds before returning, so a bad address fails the start.
pub async fn serve_tcp(
    addr: SocketAddr,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("key \"metrics-listen\": cannot listen on tcp {addr}"))?;
    tracing::info!(%addr, "metrics listening");
    let app = router.fallback(crate::admin::not_found);
    let limits = crate::admin::Limits::for_this_process();
    Ok(tokio::spawn(crate::admin::serve_http(
        listener, app, shutdown, limits,
    )))
}

/// A router with `/metrics` only, for [`serve_tcp`].
pub fn metrics_only<S: Clone + Send + Sync + 'static>(
    handler: axum::routing::MethodRouter<S>,
    state: S,
) -> Router {
    Router::new().route("/metrics", handler).with_state(state)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn exposition_format() {
        let mut m = Exposition::new();
        m.per_tablet(
            "tidelog_x_bytes_total",
            Kind::Counter,
            "Bytes.",
            [("t\"1".to_string(), 5u64)],
        );
        let mut h = HistogramSnapshot::empty();
        h.count = 2;
        h.sum_micros = 1_500_000;
        *h.cumulative.last_mut().unwrap() = 2;
        h.cumulative[10] = 1;
        m.histogram("tidelog_x_duration_seconds", "Latency.", &h);
        let text = m.finish();
        assert!(text.contains("# TYPE tidelog_x_bytes_total counter\n"));
        assert!(text.contains("tidelog_x_bytes_total{tablet=\"t\\\"1\"} 5\n"));
        assert!(
            text.contains("tidelog_x_duration_seconds_bucket{le=\"1\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("tidelog_x_duration_seconds_bucket{le=\"0.0005\"} 0\n"));
        assert!(text.contains("tidelog_x_duration_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("tidelog_x_duration_seconds_sum 1.5\n"));
        assert!(text.contains("tidelog_x_duration_seconds_count 2\n"));
    }
}
