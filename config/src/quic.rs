//! `[quic]`: the transport tuning both daemons share, and the limits QUIC itself sets on it.

use std::time::Duration;

use anyhow::{bail, Result};
use serde::Deserialize;
use tidelog_net::{Congestion, QuicTuning};

use crate::parse::de_from_str;
use crate::units::{de_duration, de_size};

/// `[quic]`: transport tuning, the same keys for both daemons.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct QuicConfig {
    /// Connection-level receive window. Default `64MiB`.
    #[serde(deserialize_with = "de_size")]
    pub receive_window: u64,
    /// Per-stream receive window. Default `16MiB`.
    #[serde(deserialize_with = "de_size")]
    pub stream_receive_window: u64,
    /// Largest UDP payload (initial and maximum). Default 1472 (Ethernet MTU less headers).
    pub max_udp_payload: u16,
    /// A connection without traffic for this long is closed. Default `30s`.
    #[serde(deserialize_with = "de_duration")]
    pub idle_timeout: Duration,
    /// A connection (or handshake) that has received no packet for this long is given up
    /// and, by the shipper, made anew; keep-alives go out at least every fifth of it.
    /// Default `5s`.
    #[serde(deserialize_with = "de_duration")]
    pub silence_limit: Duration,
    /// Kernel receive buffer of the endpoint's UDP socket (`SO_RCVBUF`; past
    /// `net.core.rmem_max` only with `CAP_NET_ADMIN`); `0` leaves the system default.
    /// Default `8MiB`.
    #[serde(deserialize_with = "de_size")]
    pub udp_receive_buffer: u64,
    /// Congestion controller of the connections this daemon sends on: `bbr`, `cubic` or
    /// `newreno`. Default `bbr`.
    #[serde(deserialize_with = "de_from_str")]
    pub congestion: Congestion,
    /// A packet is taken as lost once this many packets sent after it are acknowledged
    /// (at least 3). Default 1048576: by time only (`time-threshold`).
    pub packet_threshold: u32,
    /// A packet is taken as lost once a later one is acknowledged and this many round-trip
    /// times have passed since it was sent (1.0 to 10.0). Default 2.0.
    pub time_threshold: f32,
}

impl Default for QuicConfig {
    fn default() -> Self {
        let t = QuicTuning::default();
        QuicConfig {
            receive_window: t.receive_window,
            stream_receive_window: t.stream_receive_window,
            max_udp_payload: t.max_udp_payload,
            idle_timeout: t.idle_timeout,
            silence_limit: t.silence_limit,
            udp_receive_buffer: t.udp_receive_buffer,
            congestion: t.congestion,
            packet_threshold: t.packet_threshold,
            time_threshold: t.time_threshold,
        }
    }
}

impl QuicConfig {
    /// The libraries' form of these settings.
    pub fn tuning(&self) -> QuicTuning {
        QuicTuning {
            receive_window: self.receive_window,
            stream_receive_window: self.stream_receive_window,
            max_udp_payload: self.max_udp_payload,
            idle_timeout: self.idle_timeout,
            silence_limit: self.silence_limit,
            udp_receive_buffer: self.udp_receive_buffer,
            congestion: self.congestion,
            packet_threshold: self.packet_threshold,
            time_threshold: self.time_threshold,
        }
    }

    /// Limits QUIC itself imposes.
    pub fn validate(&self) -> Result<()> {
        if !(1200..=65527).contains(&self.max_udp_payload) {
            bail!(
                "key \"quic.max-udp-payload\": {} is out of range 1200..=65527",
                self.max_udp_payload
            );
        }
        if self.stream_receive_window == 0 || self.receive_window == 0 {
            bail!("key \"quic.receive-window\"/\"quic.stream-receive-window\": must be > 0");
        }
        if self.stream_receive_window > self.receive_window {
            bail!(
                "key \"quic.stream-receive-window\": {} exceeds quic.receive-window {}",
                self.stream_receive_window,
                self.receive_window
            );
        }
        if self.idle_timeout.is_zero() {
            bail!("key \"quic.idle-timeout\": must be > 0");
        }
        if self.packet_threshold < 3 {
            bail!(
                "key \"quic.packet-threshold\": {} is below 3 (RFC 9002: every reordering by \
                 a few packets would be taken for a loss)",
                self.packet_threshold
            );
        }
        if !(1.0..=10.0).contains(&self.time_threshold) {
            bail!(
                "key \"quic.time-threshold\": {} is out of range 1.0..=10.0 (round-trip times)",
                self.time_threshold
            );
        }
        if self.silence_limit < Duration::from_millis(50) {
            bail!(
                "key \"quic.silence-limit\": {:?} is too short (at least 50ms)",
                self.silence_limit
            );
        }
        Ok(())
    }
}
