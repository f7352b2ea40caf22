//! The applier's metric families (`prometheus-client`): [`Applier::metrics`] registers one
//! collector per part — the front door (role, `trx_status` answers), the safe time, the
//! intake, the apply stage — each reading, at every scrape, the atomics its part keeps
//! anyway (plus one short lock of the consistency core and one store read for the role).
//!
//! Names are `tidelog_applier_<thing>_<unit>`; a counter is registered without its
//! `_total`, which the encoder appends to its samples. Positions are byte offsets in a
//! tablet's log; times are seconds.

use std::collections::BTreeMap;
use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric, MetricEncoder,
    NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tidelog_wal::{HybridTime, TabletId};

use super::applier::Applier;
use super::safe_time::skew_micros;
use crate::latency::{HistogramSnapshot, BUCKETS_SECONDS};
use crate::store::Role;
use crate::trx::TrxState;

impl Applier {
    /// Registers the applier's metric families in `registry`; each scrape reads them as
    /// they are then. Encoding is blocking (locks, one store read): scrape off an async
    /// runtime.
    pub fn metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(FrontDoor(self.clone())));
        registry.register_collector(Box::new(SafeTime(self.clone())));
        registry.register_collector(Box::new(IntakeStage(self.clone())));
        registry.register_collector(Box::new(ApplyStage(self.clone())));
    }
}

/// Every state an applier's tablet can show (`tidelog_applier_tablet_state`): its intake's
/// and its apply stage's, each once (both have a `disk_full`).
pub fn tablet_states() -> Vec<&'static str> {
    let mut states: Vec<&str> = crate::intake::TabletState::ALL
        .iter()
        .map(|st| st.name())
        .collect();
    for st in crate::error::APPLY_STATES {
        if !states.contains(&st) {
            states.push(st);
        }
    }
    states
}

/// A family of one unlabelled gauge.
fn gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: impl EncodeGaugeValue,
) -> fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A family of one unlabelled counter; `name` without `_total`.
fn counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: impl EncodeCounterValue,
) -> fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

/// A family of one series per label value, of `metric(value)`.
fn labelled<T, M: EncodeMetric>(
    e: &mut DescriptorEncoder,
    (name, help, kind): (&str, &str, MetricType),
    label: &str,
    rows: impl IntoIterator<Item = (T, M)>,
) -> fmt::Result
where
    T: AsRef<str>,
{
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (v, metric) in rows {
        metric.encode(m.encode_family(&[(label, v.as_ref())])?)?;
    }
    Ok(())
}

/// A per-tablet gauge family.
fn tablet_gauges<V: EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (String, V)>,
) -> fmt::Result {
    let rows = rows.into_iter().map(|(t, v)| (t, ConstGauge::new(v)));
    labelled(e, (name, help, MetricType::Gauge), "tablet", rows)
}

/// A per-tablet counter family; `name` without `_total`.
fn tablet_counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (String, u64)>,
) -> fmt::Result {
    let rows = rows.into_iter().map(|(t, v)| (t, ConstCounter::new(v)));
    labelled(e, (name, help, MetricType::Counter), "tablet", rows)
}

/// A latency snapshot as a Prometheus histogram (`_bucket{le=…}`, `_sum`, `_count`) in
/// seconds; the `+Inf` bucket is the count.
struct Histogram<'a>(&'a HistogramSnapshot);

impl EncodeMetric for Histogram<'_> {
    fn encode(&self, mut e: MetricEncoder) -> fmt::Result {
        let h = self.0;
        // The encoder takes per-bucket counts and adds them up again.
        let mut below = 0;
        let mut buckets: Vec<(f64, u64)> = BUCKETS_SECONDS
            .iter()
            .enumerate()
            .map(|(i, le)| {
                let n = h.cumulative.get(i).copied().unwrap_or(0);
                let in_bucket = n.saturating_sub(below);
                below = below.max(n);
                (*le, in_bucket)
            })
            .collect();
        buckets.push((f64::MAX, h.count.saturating_sub(below)));
        let sum = h.sum_micros as f64 / 1_000_000.0;
        e.encode_histogram::<NoLabelSet>(sum, h.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn histogram(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    h: &HistogramSnapshot,
) -> fmt::Result {
    Histogram(h).encode(e.encode_descriptor(name, help, None, MetricType::Histogram)?)
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

fn seconds(h: HybridTime) -> f64 {
    h.physical_micros() as f64 / 1_000_000.0
}

/// The front door's own: the role, and the `trx_status` answers it gave.
#[derive(Debug)]
struct FrontDoor(Applier);

impl Collector for FrontDoor {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let role = match self.0.store().role() {
            Ok(Role::Primary) => "primary",
            Ok(Role::Standby) => "replica",
            Err(err) => {
                tracing::warn!("metrics: reading the role: {err}");
                "unknown"
            }
        };
        labelled(
            &mut e,
            (
                "tidelog_applier_role",
                "The applier's role: 1 for the current one (replica until promoted, then primary).",
                MetricType::Gauge,
            ),
            "role",
            [(role, ConstGauge::new(1i64))],
        )?;
        let lookups = self.0.trx_lookups();
        labelled(
            &mut e,
            (
                "tidelog_applier_trx_status_lookups",
                "trx_status answers given, by state.",
                MetricType::Counter,
            ),
            "state",
            TrxState::ALL
                .iter()
                .zip(lookups)
                .map(|(st, n)| (st.name(), ConstCounter::new(n))),
        )
    }
}

/// The safe time (docs/ARCHITECTURE.md, "Safe time"): the global one, its lag behind the
/// wall clock, the skew, per-tablet lag, what holds it.
#[derive(Debug)]
struct SafeTime(Applier);

impl Collector for SafeTime {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let c = self.0.consistency();
        let report = c.report();
        let now = now_micros();
        counter(
            &mut e,
            "tidelog_applier_records_below_safe_time",
            "Records applied at or below the published safe time: a tablet registered after the safe time passed its records (added while running); consistent reads before it registered did not include them.",
            c.records_below_safe_time(),
        )?;
        gauge(
            &mut e,
            "tidelog_applier_safe_time_initialized",
            "1 once every expected tablet has reported and safe time is published.",
            i64::from(report.safe_time.is_some()),
        )?;
        if let Some(safe) = report.safe_time {
            gauge(
                &mut e,
                "tidelog_applier_safe_time_seconds",
                "The global safe time (physical part), as a Unix time in seconds.",
                seconds(safe),
            )?;
            gauge(
                &mut e,
                "tidelog_applier_safe_time_lag_seconds",
                "Wall clock minus the global safe time: how stale a consistent read is.",
                lag_seconds(now, safe),
            )?;
        }
        gauge(
            &mut e,
            "tidelog_applier_safe_time_skew_seconds",
            "Newest minus oldest tablet safe time among the tablets that reported.",
            skew_micros(&report.tablets) as f64 / 1_000_000.0,
        )?;
        tablet_gauges(
            &mut e,
            "tidelog_applier_tablet_safe_time_lag_seconds",
            "Wall clock minus the tablet's safe time (its last applied record or heartbeat).",
            report
                .tablets
                .iter()
                .filter(|(_, h)| **h != HybridTime::MIN)
                .map(|(t, h)| (t.to_string(), lag_seconds(now, *h))),
        )?;
        gauge(
            &mut e,
            "tidelog_applier_pending_transactions",
            "Committed transactions not yet applied on every participant tablet.",
            report.pending_txns,
        )?;
        histogram(
            &mut e,
            "tidelog_applier_safe_time_publish_duration_seconds",
            "Wall time of one safe-time publish: the new value written to the store's journal (after the batches it covers) before readers see it.",
            &c.publish_latency(),
        )
    }
}

/// The intake: what arrived, what was acknowledged, what was refused.
#[derive(Debug)]
struct IntakeStage(Applier);

impl Collector for IntakeStage {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let intake = self.0.intake();
        counter(
            &mut e,
            "tidelog_applier_connections",
            "Shipper connections accepted (a reconnecting shipper adds one each time).",
            intake.connections_total(),
        )?;
        let tablets = intake.tablets();
        let rows: Vec<_> = tablets
            .iter()
            .map(|ti| (ti.tablet.to_string(), ti.status(), ti.frame_errors()))
            .collect();
        tablet_counters(
            &mut e,
            "tidelog_applier_received_bytes",
            "Record bytes received and durable in the tablet's received log.",
            rows.iter().map(|(t, st, _)| (t.clone(), st.bytes)),
        )?;
        tablet_counters(
            &mut e,
            "tidelog_applier_received_records",
            "Records received and durable in the tablet's received log.",
            rows.iter().map(|(t, st, _)| (t.clone(), st.records)),
        )?;
        tablet_gauges(
            &mut e,
            "tidelog_applier_received_pos_bytes",
            "Durable end of the received log: the position acknowledged to the shipper.",
            rows.iter().map(|(t, st, _)| (t.clone(), st.received_pos)),
        )?;
        tablet_counters(
            &mut e,
            "tidelog_applier_frame_errors",
            "Frames refused (malformed, bad record, bad checksum or wrong position); nothing of them was written.",
            rows.iter().map(|(t, _, (frames, _))| (t.clone(), *frames)),
        )?;
        tablet_counters(
            &mut e,
            "tidelog_applier_checksum_errors",
            "Frames refused because a message or record checksum did not match.",
            rows.iter()
                .map(|(t, _, (_, checksums))| (t.clone(), *checksums)),
        )
    }
}

/// One tablet's numbers in the apply stage, gathered under the workers lock.
struct ApplyRow {
    state: &'static str,
    received_pos: u64,
    applied_pos: u64,
    applied_bytes: u64,
    applied_records: u64,
    safe_time: HybridTime,
}

/// The apply stage: per tablet, what was applied, its state; the batches' latency and the
/// stages' lag; the apply threads holding back for a catch-up.
#[derive(Debug)]
struct ApplyStage(Applier);

impl Collector for ApplyStage {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let mut latency = HistogramSnapshot::empty();
        let (mut received_age, mut applied_age) =
            (HistogramSnapshot::empty(), HistogramSnapshot::empty());
        let rows: BTreeMap<TabletId, ApplyRow> = {
            let workers = self.0.inner.workers.workers();
            self.0
                .intake()
                .tablets()
                .iter()
                .map(|ti| {
                    let st = ti.status();
                    received_age.merge(&ti.received_age());
                    let w = workers.get(&ti.tablet);
                    if let Some(w) = w {
                        latency.merge(&w.batch_latency());
                        applied_age.merge(&w.applied_age());
                    }
                    let fault = w.and_then(|w| w.fault());
                    let row = ApplyRow {
                        state: fault.map_or(st.state, |f| f.state()),
                        received_pos: st.received_pos,
                        applied_pos: w.map_or(0, |w| w.applied_pos().0),
                        applied_bytes: w.map_or(0, |w| w.applied_bytes()),
                        applied_records: w.map_or(0, |w| w.applied_records()),
                        safe_time: w.map_or(HybridTime::default(), |w| w.safe_time()),
                    };
                    (ti.tablet.clone(), row)
                })
                .collect()
        };
        let y = self.0.inner.workers.threads.yield_status();
        counter(
            &mut e,
            "tidelog_applier_apply_held_back_seconds",
            "Time the apply threads held back for a catch-up (apply-yield-to-intake), summed over the threads.",
            y.held_total.as_secs_f64(),
        )?;
        gauge(
            &mut e,
            "tidelog_applier_apply_threads_holding_back",
            "Apply threads holding back for a catch-up now.",
            y.holding_threads,
        )?;
        let col = |f: fn(&ApplyRow) -> u64| rows.iter().map(move |(t, r)| (t.to_string(), f(r)));
        tablet_counters(
            &mut e,
            "tidelog_applier_applied_bytes",
            "Received-log bytes applied into the store.",
            col(|r| r.applied_bytes),
        )?;
        tablet_counters(
            &mut e,
            "tidelog_applier_applied_records",
            "Records applied into the store.",
            col(|r| r.applied_records),
        )?;
        tablet_gauges(
            &mut e,
            "tidelog_applier_applied_pos_bytes",
            "Position in the received log applied up to.",
            col(|r| r.applied_pos),
        )?;
        tablet_gauges(
            &mut e,
            "tidelog_applier_apply_lag_bytes",
            "Received but not yet applied.",
            col(|r| r.received_pos.saturating_sub(r.applied_pos)),
        )?;
        tablet_gauges(
            &mut e,
            "tidelog_applier_tablet_safe_time_seconds",
            "The tablet's safe time (physical part) as a Unix time in seconds; 0 before its first record.",
            rows.iter().map(|(t, r)| (t.to_string(), seconds(r.safe_time))),
        )?;
        let mut m = e.encode_descriptor(
            "tidelog_applier_tablet_state",
            "1 for the tablet's current intake/apply state, 0 for the others (every state is exported, so series do not come and go).",
            None,
            MetricType::Gauge,
        )?;
        let states = tablet_states();
        for (t, r) in &rows {
            for &state in &states {
                let labels = [("tablet", t.as_ref()), ("state", state)];
                ConstGauge::new(i64::from(state == r.state)).encode(m.encode_family(&labels)?)?;
            }
        }
        histogram(
            &mut e,
            "tidelog_applier_apply_batch_duration_seconds",
            "Wall time of one apply batch (read from the received log, written to the store), all tablets.",
            &latency,
        )?;
        let visible = self.0.consistency().visible_age();
        labelled(
            &mut e,
            (
                "tidelog_applier_stage_lag_seconds",
                "How old the newest data is at each stage, by this host's clock against the source's hybrid times, all tablets: `received` once a group of frames is durable in the received log, `applied` once an apply batch is in the store, `visible` once a safe time is published to readers.",
                MetricType::Histogram,
            ),
            "stage",
            [
                ("received", Histogram(&received_age)),
                ("applied", Histogram(&applied_age)),
                ("visible", Histogram(&visible)),
            ],
        )
    }
}
