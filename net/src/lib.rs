//! tidelog-net: the network set-up both daemons (and the test kit's impairment proxy) use.
//!
//! * [`transport`]: the transport settings built from one [`QuicTuning`] (the `[quic]`
//!   config table): flow-control windows, packet size, keep-alives and idle timeout, loss
//!   detection and the congestion controller;
//! * [`bind_udp`]: an endpoint's UDP socket with its kernel receive buffer sized (socket2);
//! * [`Silence`]: a connection that has heard nothing for the silence limit;
//! * [`tls`]: the one TLS set-up (TLS 1.3, mutual authentication against one CA, ALPN
//!   `tidelog/1`): loading and checking a `[tls]` table's PEM files, the rustls and quinn
//!   server and client configurations, and the messages for a refused certificate;
//! * [`pki`]: the PKI generator of `tidelog certs init`, which tests and benchmarks use too;
//! * [`small_file`]: capped reads of the small files a daemon is pointed at.
//!
//! It runs nothing; the shipper's and the applier's endpoint set-up call [`bind_udp`],
//! [`tls::client_config`] and [`tls::server_config`]. The protocol spoken over the
//! connections is `tidelog-proto`'s.
//!
//! # Loss detection and congestion control on a WAN
//!
//! QUIC takes a packet as lost once `packet-threshold` later packets, or `time-threshold`
//! × the RTT, have been acknowledged past it (RFC 9002 §6.1; quinn's defaults are 3 and
//! 9/8). A link with jitter delivers packets sent microseconds apart out of order, so with
//! those defaults every reordering looks like a loss, and a loss-based controller (Cubic,
//! NewReno) shrinks its window at each one: over 20 ms ± 5 ms with 10 % reordering and 5 %
//! loss a backlog shipped at a few kB/s. The defaults here take a packet as lost only by
//! time, after 2 × the RTT, and use BBR, which paces by the measured bandwidth and round
//! trip and does not take random loss for congestion (`BENCHMARKS.md`, "Shipping over an
//! impaired link").
//!
//! What tuning cannot change: quinn drops a packet that arrives more than 128 packets
//! behind the newest one of its connection (its duplicate-detection window), and the
//! sender sends it again. Over a link that reorders by a few milliseconds, one connection
//! therefore carries at most about 128 packets per such interval; the shipper's lanes (one
//! connection each) add up.

pub mod pki;
mod silence;
pub mod small_file;
pub mod tls;
mod tuning;
mod udp;

use std::sync::Arc;

use quinn::congestion::{BbrConfig, ControllerFactory, CubicConfig, NewRenoConfig};

pub use silence::Silence;
pub use tuning::{Congestion, QuicTuning, DEFAULT_PACKET_THRESHOLD, DEFAULT_TIME_THRESHOLD};
pub use udp::{bind_udp, UdpReceiveBuffer};

/// A setting quinn cannot take; names the `[quic]` key.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("quic.{key}: {value} is out of range")]
    OutOfRange { key: &'static str, value: String },
}

/// quinn's transport config from the tuning.
pub fn transport(t: &QuicTuning) -> Result<quinn::TransportConfig, TransportError> {
    let vi = |key: &'static str, v: u64| {
        quinn::VarInt::from_u64(v).map_err(|_| TransportError::OutOfRange {
            key,
            value: v.to_string(),
        })
    };
    let idle =
        quinn::IdleTimeout::try_from(t.idle_timeout).map_err(|_| TransportError::OutOfRange {
            key: "idle-timeout",
            value: format!("{:?}", t.idle_timeout),
        })?;
    let mut tc = quinn::TransportConfig::default();
    tc.receive_window(vi("receive-window", t.receive_window)?)
        .stream_receive_window(vi("stream-receive-window", t.stream_receive_window)?)
        .send_window(t.receive_window)
        .initial_mtu(t.max_udp_payload.max(1200))
        .min_mtu(t.max_udp_payload.clamp(1200, 1452))
        .keep_alive_interval(Some(t.keep_alive()))
        .max_idle_timeout(Some(idle))
        .packet_threshold(t.packet_threshold)
        .time_threshold(t.time_threshold)
        .congestion_controller_factory(congestion(t.congestion));
    Ok(tc)
}

/// The congestion controller of a [`Congestion`] choice, with quinn's defaults.
pub fn congestion(c: Congestion) -> Arc<dyn ControllerFactory + Send + Sync> {
    match c {
        Congestion::Bbr => Arc::new(BbrConfig::default()),
        Congestion::Cubic => Arc::new(CubicConfig::default()),
        Congestion::NewReno => Arc::new(NewRenoConfig::default()),
    }
}
