//! The `[quic]` settings both daemons share: flow-control windows, packet size,
//! keep-alives and idle timeout, loss detection, the congestion controller and the UDP
//! socket's receive buffer.

/// The congestion controller of a QUIC connection (`[quic] congestion`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Congestion {
    /// Paces by the measured bandwidth and round-trip time; random loss and reordering do
    /// not shrink its window. The default.
    #[default]
    Bbr,
    /// Loss-based (RFC 9438): each loss it sees cuts its window.
    Cubic,
    /// Loss-based (RFC 9002 §7): each loss it sees halves its window.
    NewReno,
}

impl Congestion {
    /// Every choice, as the config spells it.
    pub const ALL: [Congestion; 3] = [Congestion::Bbr, Congestion::Cubic, Congestion::NewReno];

    pub fn name(self) -> &'static str {
        match self {
            Congestion::Bbr => "bbr",
            Congestion::Cubic => "cubic",
            Congestion::NewReno => "newreno",
        }
    }
}

impl std::fmt::Display for Congestion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Congestion {
    type Err = String;

    fn from_str(s: &str) -> Result<Congestion, String> {
        Congestion::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("{s:?} is not one of bbr, cubic, newreno"))
    }
}

/// QUIC transport tuning shared by both ends (the daemons' `[quic]` config section).
#[derive(Clone, Debug, PartialEq)]
pub struct QuicTuning {
    /// Connection-level receive window (bytes in flight over all streams).
    pub receive_window: u64,
    /// Per-stream receive window.
    pub stream_receive_window: u64,
    /// Initial (and minimum) UDP payload size: loopback and LANs allow far more than 1200.
    pub max_udp_payload: u16,
    /// A connection silent this long is closed (QUIC's idle timeout).
    pub idle_timeout: std::time::Duration,
    /// Each end gives up a connection (or a handshake) that has received no packet for
    /// this long, well before the idle timeout: keep-alives ([`QuicTuning::keep_alive`])
    /// make a live peer answer within it even when every stream is blocked, so a SIGKILLed
    /// peer's connection does not linger, shown as streaming, until the idle timeout.
    pub silence_limit: std::time::Duration,
    /// Kernel receive buffer asked for the endpoint's UDP socket (`SO_RCVBUF`); 0 leaves
    /// the system default. See [`crate::bind_udp`].
    pub udp_receive_buffer: u64,
    /// The congestion controller of the connections this end sends on.
    pub congestion: Congestion,
    /// A packet is taken as lost once this many packets sent after it are acknowledged
    /// (QUIC's default 3 takes every reordering by 3 packets for a loss).
    pub packet_threshold: u32,
    /// A packet is taken as lost once a packet sent after it is acknowledged and this many
    /// round-trip times have passed since it was sent (QUIC's default 9/8).
    pub time_threshold: f32,
}

impl QuicTuning {
    /// The longest gap between the packets an end sends (QUIC keep-alives fill idle gaps).
    pub fn keep_alive(&self) -> std::time::Duration {
        (self.idle_timeout / 4)
            .min(self.silence_limit / 5)
            .max(std::time::Duration::from_millis(10))
    }
}

impl Default for QuicTuning {
    fn default() -> Self {
        QuicTuning {
            receive_window: 64 << 20,
            stream_receive_window: 16 << 20,
            max_udp_payload: 1472,
            idle_timeout: std::time::Duration::from_secs(30),
            silence_limit: std::time::Duration::from_secs(5),
            udp_receive_buffer: 8 << 20,
            congestion: Congestion::Bbr,
            packet_threshold: DEFAULT_PACKET_THRESHOLD,
            time_threshold: DEFAULT_TIME_THRESHOLD,
        }
    }
}

/// Default [`QuicTuning::packet_threshold`]: far beyond any reordering by jitter, so that
/// loss is detected by time ([`DEFAULT_TIME_THRESHOLD`]).
pub const DEFAULT_PACKET_THRESHOLD: u32 = 1 << 20;
/// Default [`QuicTuning::time_threshold`]: a packet that arrives up to a whole round trip
/// later than those sent after it (reordered or jittered) is not taken as lost.
pub const DEFAULT_TIME_THRESHOLD: f32 = 2.0;
