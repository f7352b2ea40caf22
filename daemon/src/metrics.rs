//! `GET /metrics` of both daemons: Prometheus text exposition (format 0.0.4), served on the
//! admin socket and, with `metrics-listen`, on a TCP address.
//!
//! The families are registered by the components themselves (`prometheus-client`
//! collectors: `tidelog_applier::node::Applier::metrics`, `tidelog_shipper::metrics`);
//! this module serves a registry ([`exposition`]). Names are
//! `tidelog_<component>_<thing>_<unit>`; counters end in `_total`, and count from the
//! daemon's start (Prometheus handles the reset at a restart). Positions are byte offsets
//! in a tablet's log; times are seconds. Everything is read from atomics the shipping and
//! applying threads keep anyway, except the applier's safe-time report (one short lock of
//! the consistency core) and its role (one store read).

use std::fmt::Write as _;
use std::net::SocketAddr;

use anyhow::{Context, Result};
use axum::Router;

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
}
