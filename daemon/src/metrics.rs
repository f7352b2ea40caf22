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

use anyhow::{Context, Result};
use axum::Router;
use tidelog_applier::latency::{HistogramSnapshot, BUCKETS_SECONDS};
use tidelog_shipper::Shipper;

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

/// Every state an applier's tablet can show (`tidelog_applier_tablet_state`).
pub use tidelog_applier::node::tablet_states as applier_tablet_states;

/// The exposition of the families registered in `registry` (the applier's:
/// `Applier::metrics`), in the Prometheus text format 0.0.4 ([`from_openmetrics`]).
/// Blocking when a collector is (the applier's: locks, one store read).
pub fn exposition(registry: &prometheus_client::registry::Registry) -> String {
    let mut om = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode_registry(&mut om, registry) {
        tracing::warn!("metrics: encoding the registry: {e}");
    }
    from_openmetrics(&om)
}

/// `prometheus-client` writes OpenMetrics text; the daemons serve the Prometheus text
/// format 0.0.4 (`text/plain; version=0.0.4`), which every scraper reads and whose
/// names and label sets the dashboards and alerts were written against. The two differ in
/// three ways, rewritten here line by line: a counter's `# HELP` and `# TYPE` name the
/// family as its samples do (`x_total`, OpenMetrics: `x`); a histogram bucket's `le` is
/// the last label and written as Prometheus does (`1`, OpenMetrics: `1.0`, first); a
/// histogram's `_sum` and `_count` follow its buckets. `# EOF` is dropped.
pub fn from_openmetrics(om: &str) -> String {
    let mut out = String::with_capacity(om.len() + 256);
    let mut help: Option<&str> = None;
    // The current family, when it is a histogram, and its series' `_sum`/`_count` lines.
    let mut histogram: Option<&str> = None;
    let mut held: Vec<&str> = Vec::new();
    for line in om.lines() {
        if line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.rsplit_once(' ').unwrap_or((rest, ""));
            let total = if kind == "counter" && !name.ends_with("_total") {
                "_total"
            } else {
                ""
            };
            if let Some(h) = help.take() {
                let (_, text) = h.split_once(' ').unwrap_or((h, ""));
                let _ = writeln!(out, "# HELP {name}{total} {text}");
            }
            let _ = writeln!(out, "# TYPE {name}{total} {kind}");
            histogram = (kind == "histogram").then_some(name);
            continue;
        }
        let Some(family) = histogram else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let Some(rest) = line.strip_prefix(family) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        if rest.starts_with("_sum") || rest.starts_with("_count") {
            held.push(line);
            continue;
        }
        match rest.strip_prefix("_bucket{le=\"") {
            Some(bucket) => {
                let (le, after) = bucket.split_once('"').unwrap_or((bucket, ""));
                let le = match le.parse::<f64>() {
                    Ok(v) if v.is_finite() => v.to_string(),
                    _ => le.to_string(),
                };
                let (others, value) = after.split_once('}').unwrap_or((after, ""));
                let others = others.strip_prefix(',').unwrap_or(others);
                let sep = if others.is_empty() { "" } else { "," };
                let _ = writeln!(out, "{family}_bucket{{{others}{sep}le=\"{le}\"}}{value}");
                if le == "+Inf" {
                    for l in held.drain(..) {
                        out.push_str(l);
                        out.push('\n');
                    }
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    for l in held {
        out.push_str(l);
        out.push('\n');
    }
    out
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
        for state in tidelog_shipper::ShipState::ALL.iter().map(|st| st.name()) {
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

    /// What `prometheus-client` writes, turned into the 0.0.4 text: counters named with
    /// `_total` in HELP and TYPE, `le` last and as Prometheus writes it, `_sum`/`_count`
    /// after the buckets, no `# EOF`.
    #[test]
    fn openmetrics_becomes_prometheus_text() {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::histogram::Histogram;
        let mut r = prometheus_client::registry::Registry::default();
        let c: Counter = Counter::default();
        c.inc_by(3);
        r.register("tidelog_x_bytes", "Bytes", c);
        let h = Family::<Vec<(String, String)>, Histogram>::new_with_constructor(|| {
            Histogram::new([0.5, 1.0])
        });
        h.get_or_create(&vec![("stage".into(), "applied".into())])
            .observe(0.7);
        r.register("tidelog_x_seconds", "Ages", h);
        let mut om = String::new();
        prometheus_client::encoding::text::encode(&mut om, &r).unwrap();
        assert!(om.contains("# TYPE tidelog_x_bytes counter\n"), "{om}");
        assert_eq!(
            from_openmetrics(&om),
            "# HELP tidelog_x_bytes_total Bytes.\n\
             # TYPE tidelog_x_bytes_total counter\n\
             tidelog_x_bytes_total 3\n\
             # HELP tidelog_x_seconds Ages.\n\
             # TYPE tidelog_x_seconds histogram\n\
             tidelog_x_seconds_bucket{stage=\"applied\",le=\"0.5\"} 0\n\
             tidelog_x_seconds_bucket{stage=\"applied\",le=\"1\"} 1\n\
             tidelog_x_seconds_bucket{stage=\"applied\",le=\"+Inf\"} 1\n\
             tidelog_x_seconds_sum{stage=\"applied\"} 0.7\n\
             tidelog_x_seconds_count{stage=\"applied\"} 1\n"
        );
    }

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
