//! The shipper's metric families (`prometheus-client`), read at each scrape from the
//! atomics the lanes keep anyway: the read engine, lanes and their connections, and per
//! tablet what was shipped and acknowledged and its state. Names are
//! `tidelog_shipper_<thing>_<unit>`; a counter is registered without its `_total`, which
//! the encoder appends to its samples.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::{ShipState, Shipper, TabletShipStatus};

/// Registers the shipper's metric families in `registry`.
pub fn register(shipper: Arc<Shipper>, registry: &mut Registry) {
    registry.register_collector(Box::new(ShipperMetrics(shipper)));
}

#[derive(Debug)]
struct ShipperMetrics(Arc<Shipper>);

type Field = fn(&TabletShipStatus) -> u64;

/// The per-tablet families: (name without a counter's `_total`, type, help, value).
const TABLET_FAMILIES: [(&str, MetricType, &str, Field); 11] = [
    (
        "tidelog_shipper_shipped_bytes",
        MetricType::Counter,
        "Record bytes shipped (sent in data frames).",
        |t| t.bytes_shipped,
    ),
    (
        "tidelog_shipper_shipped_records",
        MetricType::Counter,
        "Records shipped.",
        |t| t.records_shipped,
    ),
    (
        "tidelog_shipper_acked_records",
        MetricType::Counter,
        "Records acknowledged durable by the applier.",
        |t| t.records_acked,
    ),
    (
        "tidelog_shipper_frames",
        MetricType::Counter,
        "Data frames sent.",
        |t| t.frames,
    ),
    (
        "tidelog_shipper_stream_reopens",
        MetricType::Counter,
        "Times the tablet's stream was reopened after an error.",
        |t| t.stream_reopens,
    ),
    (
        "tidelog_shipper_durable_pos_bytes",
        MetricType::Gauge,
        "Durable end of the source WAL.",
        |t| t.durable_pos,
    ),
    (
        "tidelog_shipper_shipped_pos_bytes",
        MetricType::Gauge,
        "Shipped up to.",
        |t| t.shipped_pos,
    ),
    (
        "tidelog_shipper_acked_pos_bytes",
        MetricType::Gauge,
        "Acknowledged durable by the applier up to.",
        |t| t.acked_pos,
    ),
    (
        "tidelog_shipper_lag_bytes",
        MetricType::Gauge,
        "Durable at the source, not yet acknowledged.",
        |t| t.lag_bytes,
    ),
    (
        "tidelog_shipper_lag_records",
        MetricType::Gauge,
        "Records shipped on the current stream, not yet acknowledged.",
        |t| t.lag_records,
    ),
    (
        "tidelog_shipper_tablet_lane",
        MetricType::Gauge,
        "The lane that ships the tablet.",
        |t| t.lane,
    ),
];

impl Collector for ShipperMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        let st = s.status();
        let mut m = e.encode_descriptor(
            "tidelog_shipper_io_engine",
            "1 for the WAL read engine in use (uring or std).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(m.encode_family(&[("engine", s.io_engine().name())])?)?;
        for (name, help, v) in [
            (
                "tidelog_shipper_lanes",
                "Lane threads (each with its own QUIC connection).",
                s.lanes() as u64,
            ),
            (
                "tidelog_shipper_connected_lanes",
                "Lanes with a live QUIC connection to the applier.",
                s.connected_lanes(),
            ),
        ] {
            let g = ConstGauge::new(v);
            g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        let c = ConstCounter::new(s.reconnects());
        c.encode(e.encode_descriptor(
            "tidelog_shipper_reconnects",
            "Connections to the applier lost or failed, each followed by a reconnect attempt.",
            None,
            c.metric_type(),
        )?)?;
        for (name, kind, help, f) in TABLET_FAMILIES {
            let mut m = e.encode_descriptor(name, help, None, kind)?;
            for (t, row) in &st {
                let labels = [("tablet", t.as_ref())];
                let family = m.encode_family(&labels)?;
                match kind {
                    MetricType::Counter => ConstCounter::new(f(row)).encode(family)?,
                    _ => ConstGauge::new(f(row)).encode(family)?,
                }
            }
        }
        let mut m = e.encode_descriptor(
            "tidelog_shipper_tablet_state",
            "1 for the tablet's current shipping state, 0 for the others (every state is exported, so series do not come and go).",
            None,
            MetricType::Gauge,
        )?;
        for (t, row) in &st {
            for state in ShipState::ALL.iter().map(|st| st.name()) {
                let labels = [("tablet", t.as_ref()), ("state", state)];
                ConstGauge::new(i64::from(state == row.state)).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
