//! Daemon configuration files (every key: `docs/configuration.md`): `applier.toml` and
//! `shipper.toml`.
//!
//! TOML, kebab-case keys, every key optional with the default stated on its field (and in the
//! example configs under `systemd/`, which a test parses). Durations are humantime strings
//! (`"200ms"`, `"15m"`, `"1d"`); sizes are a byte count or a string with a unit
//! ([`parse_size`]: `"64MiB"`, `"1GiB"`, `"16KiB"`, `"4096"`, decimal `"64MB"`).
//!
//! Parsing is strict: an unknown key or a bad value fails with a message naming the file and
//! the key, e.g. `applier.toml: key "max-staleness": invalid duration "15 parsecs": …` or
//! `shipper.toml: unknown key "tls.foo"`. [`load_applier`] / [`load_shipper`] only parse;
//! [`ApplierConfig::validate`] / [`ShipperConfig::validate`] then check what parsing cannot
//! (TLS files readable, the applier address resolves, limits consistent).

use std::fmt;
use std::fs::File;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde::Deserialize;
use tidelog_net::{Congestion, QuicTuning};
use tidelog_wal::{SyncPolicy, TabletId};

use crate::small_file;

/// `applier.toml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ApplierConfig {
    /// QUIC (UDP) address shippers connect to. Default `127.0.0.1:7400`.
    #[serde(deserialize_with = "de_from_str")]
    pub listen: SocketAddr,
    /// The store, received logs and persisted state. Default `/var/lib/tidelog/applier`.
    #[serde(deserialize_with = "de_path")]
    pub data_dir: PathBuf,
    /// The admin API's Unix socket. Default `/run/tidelog/applier.sock`.
    #[serde(deserialize_with = "de_path")]
    pub admin_socket: PathBuf,
    /// Durability of the received logs: `always`, `batch` or `none`. Default `batch`.
    #[serde(deserialize_with = "de_from_str")]
    pub sync: SyncPolicy,
    /// Consistent reads fail once safe time lags the wall clock by more. Default `15m`.
    #[serde(deserialize_with = "de_duration")]
    pub max_staleness: Duration,
    /// A shipped frame whose safe time or record ht is further ahead of this host's clock
    /// is refused (its tablet shows `clock_skew`; nothing of it is written, the safe time
    /// does not move; taken once within the bound). Default `500ms`.
    #[serde(deserialize_with = "de_duration")]
    pub max_clock_skew: Duration,
    /// How long binlog entries (and so `trx_status` answers) are kept; > 0. Default `1d`.
    #[serde(deserialize_with = "de_duration")]
    pub binlog_retention: Duration,
    /// Tablets that must all have reported before safe time is initialized, each once.
    /// Default `[]`.
    #[serde(deserialize_with = "de_tablets")]
    pub expect_tablets: Vec<TabletId>,
    /// Segment file size of the received logs. Default `64MiB`.
    #[serde(deserialize_with = "de_size")]
    pub segment_size: u64,
    /// The store's block cache, shared by all its keyspaces; > 0. Default `256MiB`.
    #[serde(deserialize_with = "de_size")]
    pub cache_size: u64,
    /// The most the store's memtables (the writes not yet flushed to its tables, all
    /// keyspaces together) may hold: above half of it the largest is flushed, above all of
    /// it apply waits for the flushes. At least 4MiB. Default `64MiB`.
    #[serde(deserialize_with = "de_size")]
    pub write_buffer_size: u64,
    /// Threads applying the received logs; tablets are spread over them, each thread taking
    /// its tablets in turn. 0 = half the cores, at least two. Default `0`.
    pub apply_threads: usize,
    /// Worker threads of the daemon's async runtime: the intake's QUIC connections and
    /// streams, the admin API, metrics. 0 = half the cores, at least one. Default `0`.
    pub runtime_threads: usize,
    /// Nice value (-20..=19) of the apply threads and the safe-time publisher, the stages
    /// consistent reads wait on; 0 = the process's. Below the process's own it needs
    /// `CAP_SYS_NICE` or a `LimitNICE=` that allows it; refused, it is logged and the
    /// threads run at the process's value. Default `0`.
    pub apply_nice: i32,
    /// Nice value (-20..=19) of the store's background workers (memtable flushes and
    /// compactions); 0 = the process's. A positive value lets the intake (durable receipt,
    /// the RPO) and the apply threads have a busy CPU first; compaction then runs in the
    /// gaps, and the store's own write stalls bound the debt. Default `0`.
    pub store_nice: i32,
    /// Write the received logs with `O_DIRECT`, around the page cache: the intake then
    /// spends no CPU copying frames into the page cache and writing them back, and the
    /// apply stage reads them from the device. Needs a `segment-size` that is a multiple of
    /// 4KiB. Where the file system refuses `O_DIRECT` the logs are written through the page
    /// cache, with a warning. Default `false`.
    pub received_direct_io: bool,
    /// Without `received-direct-io`: while shippers send a backlog (frames of 256 KiB or
    /// more within the last 100 ms), the received-log segments are written with `O_DIRECT`,
    /// and through the page cache again once the backlog is in. A bulk catch-up then costs
    /// no page-cache copy and takes no fresh pages (on a 2-core VM one lane received
    /// 560–629 MB/s with it against 317–477 without), while a target that keeps up (small
    /// frames) keeps its received logs in the page cache, where apply reads them back at
    /// once. Segments whose size is not a multiple of 4KiB stay in the page cache. Default
    /// `true`.
    pub received_direct_io_in_catch_up: bool,
    /// During a catch-up — shippers send a backlog (frames of 256 KiB or more) and the
    /// apply threads are behind (full batches) — the apply threads hold back, each time by
    /// at most this long: the received logs are made durable first (what a disaster loses),
    /// and the safe time follows when the backlog is in, or every this long during a long
    /// one. Neither a shipper that keeps up (small frames) nor apply that keeps up is held
    /// back. `0s` = never. Default `1s`.
    #[serde(deserialize_with = "de_duration")]
    pub apply_yield_to_intake: Duration,
    /// mTLS: the CA that signs shipper certificates, and this server's certificate and key.
    /// Default `/etc/tidelog/tls/{ca.pem,applier.pem,applier.key}`.
    #[serde(deserialize_with = "de_tls_applier")]
    pub tls: TlsConfig,
    /// QUIC transport tuning.
    pub quic: QuicConfig,
    /// Also serve `GET /metrics` (Prometheus) over plain HTTP on this TCP address, e.g.
    /// `127.0.0.1:9400`. Default unset: metrics only on the admin socket.
    #[serde(deserialize_with = "de_opt_addr")]
    pub metrics_listen: Option<SocketAddr>,
    /// Log filter (`info`, `debug`, `tidelog_applier=debug,info`, …). RUST_LOG and
    /// `--log-level` override it. Default `info`.
    pub log_level: String,
    /// The MySQL-protocol endpoint. Default unset: off.
    pub sql: Option<crate::sql_config::SqlConfig>,
}

/// `shipper.toml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ShipperConfig {
    /// The WAL directory, one sub-directory per tablet. Default `/var/lib/tidelog/wal`.
    #[serde(deserialize_with = "de_path")]
    pub wal_dir: PathBuf,
    /// The applier's QUIC address, `host:port` (resolved by [`ShipperConfig::applier_addr`]).
    /// Default `127.0.0.1:7400`.
    pub applier: String,
    /// The name the applier's certificate must carry. Default `localhost`.
    pub server_name: String,
    /// The admin API's Unix socket. Default `/run/tidelog/shipper.sock`.
    #[serde(deserialize_with = "de_path")]
    pub admin_socket: PathBuf,
    /// File read engine: `auto`, `uring` or `std`. Default `auto`.
    pub io_engine: IoEngine,
    /// Runtime threads, each with its own QUIC connection; 0 = number of cores, at most
    /// [`MAX_LANES`]. Default 0.
    pub lanes: usize,
    /// This shipper's identity towards the applier. Default: the host name.
    pub shipper_id: String,
    /// Largest frame payload sent. Default `1MiB`.
    #[serde(deserialize_with = "de_size")]
    pub max_frame_bytes: u64,
    /// Bytes in flight (shipped, not acked) per tablet. Default `16MiB`.
    #[serde(deserialize_with = "de_size")]
    pub window_bytes: u64,
    /// Keep-alive frame (carrying the tablet safe time) interval for idle tablets.
    /// Default `200ms`.
    #[serde(deserialize_with = "de_duration")]
    pub keepalive_interval: Duration,
    /// Upper bound of an idle tailer's wait for new WAL data. Default `1ms`.
    #[serde(deserialize_with = "de_duration")]
    pub poll_interval: Duration,
    /// First reconnect delay; doubles (with jitter) up to `reconnect-max`. Default `100ms`.
    #[serde(deserialize_with = "de_duration")]
    pub reconnect_min: Duration,
    /// Longest reconnect delay. Default `5s`.
    #[serde(deserialize_with = "de_duration")]
    pub reconnect_max: Duration,
    /// Ship up to `written_pos` instead of `durable_pos` (the target may then get ahead of
    /// what the source would recover). Default `false`.
    pub ship_unsynced: bool,
    /// mTLS: the CA that signs the applier's certificate, and this client's certificate and
    /// key. Default `/etc/tidelog/tls/{ca.pem,shipper.pem,shipper.key}`.
    #[serde(deserialize_with = "de_tls_shipper")]
    pub tls: TlsConfig,
    /// QUIC transport tuning.
    pub quic: QuicConfig,
    /// Also serve `GET /metrics` (Prometheus) over plain HTTP on this TCP address, e.g.
    /// `127.0.0.1:9401`. Default unset: metrics only on the admin socket.
    #[serde(deserialize_with = "de_opt_addr")]
    pub metrics_listen: Option<SocketAddr>,
    /// Log filter (`info`, `debug`, `tidelog_shipper=debug,info`, …). RUST_LOG and
    /// `--log-level` override it. Default `info`.
    pub log_level: String,
}

/// `[tls]`: PEM files. Keys left out of the section take the daemon's default path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// CA certificate(s) the peer's certificate must chain to.
    pub ca: PathBuf,
    /// This daemon's certificate chain.
    pub cert: PathBuf,
    /// This daemon's private key.
    pub key: PathBuf,
}

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

/// The shipper's file read engine (docs/ARCHITECTURE.md, "Shipping").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoEngine {
    /// `uring` where io_uring works, else `std`.
    #[default]
    Auto,
    /// tokio-uring reads; fails at start if io_uring is unavailable.
    Uring,
    /// Positional reads on blocking threads.
    Std,
}

impl fmt::Display for IoEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoEngine::Auto => "auto",
            IoEngine::Uring => "uring",
            IoEngine::Std => "std",
        })
    }
}

const TLS_DIR: &str = "/etc/tidelog/tls";

/// The daemons' log filter when neither `--log-level`, RUST_LOG nor `log-level` says.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// The most shipper lanes (runtime threads with a QUIC connection each) `lanes` may ask for.
pub const MAX_LANES: usize = 256;

/// The most apply threads `apply-threads` may ask for.
pub const MAX_APPLY_THREADS: usize = 256;

/// The most runtime threads `runtime-threads` may ask for.
pub const MAX_RUNTIME_THREADS: usize = 256;

/// The applier's runtime threads when `runtime-threads` is 0: half the cores, at least one.
pub fn default_runtime_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// The applier's runtime threads for a `runtime-threads` value: itself, or
/// [`default_runtime_threads`] when it is 0. On 2 cores one worker left the intake's QUIC
/// work 8 % cheaper than two, which handed it back and forth between the cores
/// (`BENCHMARKS.md`).
pub fn runtime_threads(configured: usize) -> usize {
    match configured {
        0 => default_runtime_threads(),
        n => n,
    }
}

/// The level names a `log-level` directive may use (case-insensitive).
const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];

/// `log-level`: comma-separated directives, each a level name (`info`) or `target=level`
/// (`tidelog_applier=debug`, spans allowed in the target as `tracing` writes them), and the
/// whole a valid `tracing` filter. A bare word that is not a level is refused: `tracing`
/// would take it for a target name and log nothing else (`verbose`, `warning`).
fn validate_log_level(level: &str) -> Result<()> {
    const FORMS: &str = "accepted: a level (error, warn, info, debug, trace, off) or \
                         target=level (e.g. tidelog_applier=debug), separated by commas";
    let is_level = |s: &str| LEVELS.iter().any(|l| l.eq_ignore_ascii_case(s.trim()));
    let mut directives = 0;
    for d in level.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        directives += 1;
        match d.rsplit_once('=') {
            None if is_level(d) => {}
            None => bail!(
                "key \"log-level\": invalid filter {level:?}: directive {d:?} is not a level \
                 ({FORMS})"
            ),
            Some((target, lvl)) => {
                if target.trim().is_empty() || !is_level(lvl) {
                    bail!(
                        "key \"log-level\": invalid filter {level:?}: directive {d:?} is not \
                         target=level ({FORMS})"
                    );
                }
            }
        }
    }
    if directives == 0 {
        bail!("key \"log-level\": invalid filter {level:?}: it is empty ({FORMS})");
    }
    tracing_subscriber::EnvFilter::try_new(level)
        .map(|_| ())
        .map_err(|e| anyhow!("key \"log-level\": invalid filter {level:?}: {e} ({FORMS})"))
}

impl TlsConfig {
    fn defaults_for(role: &str) -> TlsConfig {
        let dir = Path::new(TLS_DIR);
        TlsConfig {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{role}.pem")),
            key: dir.join(format!("{role}.key")),
        }
    }

    /// The applier's default paths.
    pub fn applier_default() -> TlsConfig {
        TlsConfig::defaults_for("applier")
    }

    /// The shipper's default paths.
    pub fn shipper_default() -> TlsConfig {
        TlsConfig::defaults_for("shipper")
    }

    /// The files, as the TLS set-up loads them (`tidelog_net::tls::TlsMaterial::load`).
    pub fn files(&self) -> tidelog_net::tls::TlsFiles {
        tidelog_net::tls::TlsFiles {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }

    /// Each file exists and is readable; the error names the key (`tls.ca`, …).
    pub fn validate(&self) -> Result<()> {
        for (key, path) in [("ca", &self.ca), ("cert", &self.cert), ("key", &self.key)] {
            File::open(path)
                .with_context(|| format!("key \"tls.{key}\": cannot read {}", path.display()))?;
        }
        Ok(())
    }
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

impl Default for ApplierConfig {
    fn default() -> Self {
        ApplierConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7400)),
            data_dir: PathBuf::from("/var/lib/tidelog/applier"),
            admin_socket: PathBuf::from("/run/tidelog/applier.sock"),
            sync: SyncPolicy::Batch,
            max_staleness: Duration::from_secs(15 * 60),
            max_clock_skew: tidelog_applier::intake::DEFAULT_MAX_CLOCK_SKEW,
            binlog_retention: Duration::from_secs(24 * 3600),
            expect_tablets: Vec::new(),
            segment_size: 64 << 20,
            cache_size: tidelog_applier::store::DEFAULT_CACHE_SIZE,
            write_buffer_size: tidelog_applier::store::DEFAULT_WRITE_BUFFER_SIZE,
            apply_threads: 0,
            runtime_threads: 0,
            apply_nice: 0,
            store_nice: 0,
            received_direct_io: false,
            received_direct_io_in_catch_up: true,
            apply_yield_to_intake: Duration::from_secs(1),
            tls: TlsConfig::applier_default(),
            quic: QuicConfig::default(),
            metrics_listen: None,
            log_level: DEFAULT_LOG_LEVEL.to_string(),
            sql: None,
        }
    }
}

impl ApplierConfig {
    /// Checks what parsing cannot: TLS files readable, limits consistent. The error names
    /// the key; callers add the file name.
    pub fn validate(&self) -> Result<()> {
        validate_log_level(&self.log_level)?;
        self.tls.validate()?;
        self.quic.validate()?;
        if let Some(sql) = &self.sql {
            sql.validate()?;
        }
        if self.segment_size < 64 << 10 {
            bail!(
                "key \"segment-size\": {} is below the minimum 64KiB",
                self.segment_size
            );
        }
        if self.received_direct_io && self.segment_size % 4096 != 0 {
            bail!(
                "key \"segment-size\": {} is not a multiple of 4KiB, which \"received-direct-io = true\" needs",
                self.segment_size
            );
        }
        if self.max_staleness.is_zero() {
            bail!("key \"max-staleness\": must be > 0");
        }
        if self.apply_yield_to_intake >= self.max_staleness {
            bail!(
                "key \"apply-yield-to-intake\": {:?} must be below max-staleness ({:?}), or consistent reads could fail during every burst",
                self.apply_yield_to_intake,
                self.max_staleness
            );
        }
        if self.binlog_retention.is_zero() {
            bail!("key \"binlog-retention\": must be > 0");
        }
        if self.cache_size == 0 {
            bail!("key \"cache-size\": must be > 0");
        }
        if self.write_buffer_size < tidelog_applier::store::MIN_WRITE_BUFFER_SIZE {
            bail!(
                "key \"write-buffer-size\": {} is below the minimum 4MiB",
                self.write_buffer_size
            );
        }
        if self.apply_threads > MAX_APPLY_THREADS {
            bail!(
                "key \"apply-threads\": {} is above the maximum {MAX_APPLY_THREADS} (0 = half the cores, at least two)",
                self.apply_threads
            );
        }
        if self.runtime_threads > MAX_RUNTIME_THREADS {
            bail!(
                "key \"runtime-threads\": {} is above the maximum {MAX_RUNTIME_THREADS} (0 = half the cores, at least one)",
                self.runtime_threads
            );
        }
        for (key, v) in [
            ("apply-nice", self.apply_nice),
            ("store-nice", self.store_nice),
        ] {
            if !(-20..=19).contains(&v) {
                bail!("key \"{key}\": {v} is not a nice value (-20 to 19; 0 = the process's)");
            }
        }
        Ok(())
    }

    /// The number of apply threads to run: `apply-threads`, or half the cores (at least
    /// two) when it is 0 — the other half is left to the intake, QUIC and the admin API.
    pub fn effective_apply_threads(&self) -> usize {
        if self.apply_threads > 0 {
            self.apply_threads
        } else {
            tidelog_applier::apply::ApplyThreads::default_count()
        }
    }

    /// The async runtime's worker threads ([`runtime_threads`]).
    pub fn effective_runtime_threads(&self) -> usize {
        runtime_threads(self.runtime_threads)
    }
}

impl Default for ShipperConfig {
    fn default() -> Self {
        ShipperConfig {
            wal_dir: PathBuf::from("/var/lib/tidelog/wal"),
            applier: "127.0.0.1:7400".to_string(),
            server_name: "localhost".to_string(),
            admin_socket: PathBuf::from("/run/tidelog/shipper.sock"),
            io_engine: IoEngine::Auto,
            lanes: 0,
            shipper_id: default_shipper_id(),
            max_frame_bytes: 1 << 20,
            window_bytes: 16 << 20,
            keepalive_interval: Duration::from_millis(200),
            poll_interval: Duration::from_millis(1),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            ship_unsynced: false,
            tls: TlsConfig::shipper_default(),
            quic: QuicConfig::default(),
            metrics_listen: None,
            log_level: DEFAULT_LOG_LEVEL.to_string(),
        }
    }
}

impl ShipperConfig {
    /// Resolves `applier` (`ip:port` or `host:port`) to its first address.
    pub fn applier_addr(&self) -> Result<SocketAddr> {
        if let Ok(a) = self.applier.parse::<SocketAddr>() {
            return Ok(a);
        }
        self.applier
            .to_socket_addrs()
            .with_context(|| {
                format!(
                    "key \"applier\": {:?} is not a host:port address",
                    self.applier
                )
            })?
            .next()
            .ok_or_else(|| anyhow!("key \"applier\": {:?} resolves to nothing", self.applier))
    }

    /// The number of lanes to run: `lanes`, or the number of cores when it is 0.
    pub fn effective_lanes(&self) -> usize {
        if self.lanes > 0 {
            self.lanes
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    /// The warning for a `wal-dir` that does not exist (yet): the shipper waits for it.
    pub fn wal_dir_missing(&self) -> Option<String> {
        (!self.wal_dir.exists()).then(|| {
            format!(
                "key \"wal-dir\": {} does not exist yet; the shipper waits for it to appear",
                self.wal_dir.display()
            )
        })
    }

    /// Checks what parsing cannot: TLS files readable, the applier address resolves, limits
    /// consistent, `wal-dir` a directory if it exists. The error names the key; callers add
    /// the file name.
    pub fn validate(&self) -> Result<()> {
        validate_log_level(&self.log_level)?;
        if self.lanes > MAX_LANES {
            bail!(
                "key \"lanes\": {} is above the maximum {MAX_LANES} (0 = the number of cores)",
                self.lanes
            );
        }
        match std::fs::metadata(&self.wal_dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!(
                "key \"wal-dir\": {} is not a directory",
                self.wal_dir.display()
            ),
            // Not there yet: the shipper waits for it (`wal_dir_missing` warns).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => bail!(
                "key \"wal-dir\": cannot read {}: {e}",
                self.wal_dir.display()
            ),
        }
        self.tls.validate()?;
        self.quic.validate()?;
        self.applier_addr()?;
        if self.server_name.is_empty() {
            bail!("key \"server-name\": must not be empty");
        }
        if rustls_pki_types::ServerName::try_from(self.server_name.as_str()).is_err() {
            bail!(
                "key \"server-name\": {:?} is not a DNS name or IP address",
                self.server_name
            );
        }
        if self.shipper_id.is_empty() || self.shipper_id.len() > 255 {
            bail!("key \"shipper-id\": must be 1..=255 bytes");
        }
        if self.max_frame_bytes == 0 {
            bail!("key \"max-frame-bytes\": must be > 0");
        }
        if self.window_bytes < self.max_frame_bytes {
            bail!(
                "key \"window-bytes\": {} is below max-frame-bytes {}",
                self.window_bytes,
                self.max_frame_bytes
            );
        }
        if self.reconnect_min.is_zero() {
            bail!("key \"reconnect-min\": must be > 0");
        }
        if self.reconnect_max < self.reconnect_min {
            bail!(
                "key \"reconnect-max\": {} is below reconnect-min {}",
                humantime::format_duration(self.reconnect_max),
                humantime::format_duration(self.reconnect_min)
            );
        }
        if self.keepalive_interval.is_zero() || self.poll_interval.is_zero() {
            bail!("key \"keepalive-interval\"/\"poll-interval\": must be > 0");
        }
        Ok(())
    }
}

/// The host name (`gethostname`), or `tidelog-shipper` if it cannot be read.
pub fn default_shipper_id() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for `buf.len()` bytes; gethostname NUL-terminates within it
    // on success (we also leave the last byte 0 in case it truncates without one).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        if let Ok(s) = std::str::from_utf8(&buf[..end]) {
            if !s.is_empty() {
                return s.to_string();
            }
        }
    }
    "tidelog-shipper".to_string()
}

/// Reads and parses `applier.toml` (no [`ApplierConfig::validate`]).
pub fn load_applier(path: &Path) -> Result<ApplierConfig> {
    load(path)
}

/// Reads and parses `shipper.toml` (no [`ShipperConfig::validate`]).
pub fn load_shipper(path: &Path) -> Result<ShipperConfig> {
    load(path)
}

/// [`load_applier`] then [`ApplierConfig::validate`]; every error names the file.
pub fn check_applier(path: &Path) -> Result<ApplierConfig> {
    let c = load_applier(path)?;
    c.validate().map_err(|e| named(path, &e))?;
    Ok(c)
}

/// [`load_shipper`] then [`ShipperConfig::validate`]; every error names the file.
pub fn check_shipper(path: &Path) -> Result<ShipperConfig> {
    let c = load_shipper(path)?;
    c.validate().map_err(|e| named(path, &e))?;
    Ok(c)
}

/// `F: <error>` for the config file `path`, its quotes of the file's values cut
/// ([`small_file::shorten`]).
pub fn named(path: &Path, e: &anyhow::Error) -> anyhow::Error {
    anyhow!(
        "{}: {}",
        path.display(),
        small_file::shorten(&format!("{e:#}"))
    )
}

/// Reports what start-up (or `--check`) found questionable in the daemon configured by
/// `path` without refusing it: on stderr as `warning: F: …` with `check` (whatever the log
/// level), else logged at warn level.
pub fn report_warnings(path: &Path, warnings: &[String], check: bool) {
    for w in warnings {
        if check {
            eprintln!("warning: {}: {w}", path.display());
        } else {
            tracing::warn!("{}: {w}", path.display());
        }
    }
}

/// Reads (at most [`small_file::CONFIG_MAX`]) and parses a config file; the error names
/// the file and quotes no more than a snippet of it ([`parse_str`]).
fn load<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = small_file::read_to_string(path, small_file::CONFIG_MAX, "a config file")
        .context("cannot read the config file")?;
    parse_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// A TOML syntax error: where, what, and the part of the line around it (never the whole
/// of a long line).
fn syntax_error(text: &str, e: &toml::de::Error) -> String {
    let what = small_file::head(e.message().trim_end(), 256);
    let Some(span) = e.span() else {
        return format!("TOML parse error: {what}");
    };
    let at = span.start.min(text.len());
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    let line_no = text[..line_start].matches('\n').count() + 1;
    let col = text[line_start..at].chars().count() + 1;
    let (shown, caret) = small_file::snippet(&text[line_start..line_end], at - line_start);
    format!(
        "TOML parse error at line {line_no}, column {col}: {what}\n  | {shown}\n  | {}^",
        " ".repeat(caret)
    )
}

/// Parses a config from TOML text. The error names the key at fault but not the file, and
/// quotes a snippet of a long value or line, never the whole.
pub fn parse_str<T: DeserializeOwned>(text: &str) -> std::result::Result<T, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
    match T::deserialize(toml::Value::Table(table.clone())) {
        Ok(v) => Ok(v),
        Err(e) => Err(small_file::shorten(&blame_key::<T>(&table, e.message()))),
    }
}

/// Finds the key that makes deserialization fail by trying each key on its own (every field
/// has a default, so a table with one key deserializes unless that key is bad), recursing
/// into sub-tables. Returns `key "a.b": <why>` or `unknown key "a.b"`.
fn blame_key<T: DeserializeOwned>(table: &toml::Table, whole: &str) -> String {
    fn fails<T: DeserializeOwned>(t: &toml::Table) -> Option<String> {
        T::deserialize(toml::Value::Table(t.clone()))
            .err()
            .map(|e| e.message().to_string())
    }
    for (k, v) in table {
        let mut single = toml::Table::new();
        single.insert(k.clone(), v.clone());
        let Some(msg) = fails::<T>(&single) else {
            continue;
        };
        let unknown_here = msg.starts_with(&format!("unknown field `{k}`"));
        if let (toml::Value::Table(sub), false) = (v, unknown_here) {
            for (sk, sv) in sub {
                let mut inner = toml::Table::new();
                inner.insert(sk.clone(), sv.clone());
                let mut outer = toml::Table::new();
                outer.insert(k.clone(), toml::Value::Table(inner));
                if let Some(m) = fails::<T>(&outer) {
                    return describe(&format!("{k}.{sk}"), &m);
                }
            }
        }
        return describe(k, &msg);
    }
    whole.to_string()
}

fn describe(key: &str, msg: &str) -> String {
    if let Some(rest) = msg.strip_prefix("unknown field") {
        // serde: "unknown field `foo`, expected one of `a`, `b`"
        let expected = rest.split_once(", expected").map(|(_, e)| e.trim());
        match expected {
            Some(e) => format!("unknown key {key:?} (expected {})", e.replace('`', "\"")),
            None => format!("unknown key {key:?}"),
        }
    } else {
        format!("key {key:?}: {msg}")
    }
}

/// Parses a size: a byte count with an optional unit, binary (`KiB`, `MiB`, `GiB`, `TiB`,
/// also `K`, `M`, `G`, `T`) or decimal (`KB`, `MB`, `GB`, `TB`), case-insensitive, e.g.
/// `"64MiB"`, `"1 GiB"`, `"4096"`, `"16KiB"`, `"64MB"`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "invalid size {s:?}: expected a number of bytes with an optional unit, e.g. 64MiB"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|e| format!("invalid size {s:?}: {e}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "invalid size {s:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("invalid size {s:?}: too large"))
}

/// Parses a humantime duration (`"200ms"`, `"15m"`, `"1d"`, `"1h 30m"`).
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

fn de_size<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Int(i64),
        Str(String),
    }
    match Size::deserialize(d)
        .map_err(|_| D::Error::custom("expected a size: a byte count or a string like \"64MiB\""))?
    {
        Size::Int(n) => {
            u64::try_from(n).map_err(|_| D::Error::custom(format!("size {n} is negative")))
        }
        Size::Str(s) => parse_size(&s).map_err(D::Error::custom),
    }
}

pub(crate) fn de_duration<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Duration, D::Error> {
    let s = String::deserialize(d)
        .map_err(|_| D::Error::custom("expected a duration string like \"15m\" or \"200ms\""))?;
    parse_duration(&s).map_err(D::Error::custom)
}

pub(crate) fn de_from_str<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    let s = String::deserialize(d)?;
    s.parse().map_err(|e| D::Error::custom(with_input(&s, &e)))
}

/// A parse error's text, prefixed with the input unless it already quotes it.
fn with_input(input: &str, e: &dyn fmt::Display) -> String {
    let text = e.to_string();
    if text.contains(&format!("{input:?}")) {
        text
    } else {
        format!("invalid value {input:?}: {text}")
    }
}

fn de_opt_addr<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<SocketAddr>, D::Error> {
    de_from_str(d).map(Some)
}

/// A path: an empty (or blank) one would silently mean the current directory.
pub(crate) fn de_path<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<PathBuf, D::Error> {
    let p = PathBuf::deserialize(d)?;
    if p.as_os_str().to_string_lossy().trim().is_empty() {
        return Err(D::Error::custom(format!(
            "must not be empty ({:?} would mean the current directory)",
            p.as_os_str()
        )));
    }
    Ok(p)
}

fn de_opt_path<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<PathBuf>, D::Error> {
    de_path(d).map(Some)
}

fn de_tablets<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<TabletId>, D::Error> {
    let mut out: Vec<TabletId> = Vec::new();
    for s in Vec::<String>::deserialize(d)? {
        let t = s
            .parse::<TabletId>()
            .map_err(|e| D::Error::custom(with_input(&s, &e)))?;
        if out.contains(&t) {
            return Err(D::Error::custom(format!(
                "tablet {s:?} is listed more than once"
            )));
        }
        out.push(t);
    }
    Ok(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    #[serde(default, deserialize_with = "de_opt_path")]
    ca: Option<PathBuf>,
    #[serde(default, deserialize_with = "de_opt_path")]
    cert: Option<PathBuf>,
    #[serde(default, deserialize_with = "de_opt_path")]
    key: Option<PathBuf>,
}

impl RawTls {
    fn with_defaults(self, d: TlsConfig) -> TlsConfig {
        TlsConfig {
            ca: self.ca.unwrap_or(d.ca),
            cert: self.cert.unwrap_or(d.cert),
            key: self.key.unwrap_or(d.key),
        }
    }
}

fn de_tls_applier<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<TlsConfig, D::Error> {
    Ok(RawTls::deserialize(d)?.with_defaults(TlsConfig::applier_default()))
}

fn de_tls_shipper<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<TlsConfig, D::Error> {
    Ok(RawTls::deserialize(d)?.with_defaults(TlsConfig::shipper_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applier(text: &str) -> std::result::Result<ApplierConfig, String> {
        parse_str(text)
    }

    fn shipper(text: &str) -> std::result::Result<ShipperConfig, String> {
        parse_str(text)
    }

    #[test]
    fn empty_files_give_the_defaults() {
        assert_eq!(applier("").unwrap(), ApplierConfig::default());
        let s = shipper("").unwrap();
        assert_eq!(s, ShipperConfig::default());
        assert!(!s.shipper_id.is_empty());
        assert_eq!(s.tls.cert, PathBuf::from("/etc/tidelog/tls/shipper.pem"));
        assert_eq!(
            ApplierConfig::default().tls.key,
            PathBuf::from("/etc/tidelog/tls/applier.key")
        );
    }

    #[test]
    fn full_applier_config() {
        let c = applier(
            r#"
listen = "0.0.0.0:7500"
data-dir = "/d"
admin-socket = "/s.sock"
sync = "always"
max-staleness = "90s"
max-clock-skew = "2s"
binlog-retention = "7d"
expect-tablets = ["t1", "t-2"]
segment-size = "1GiB"
cache-size = "1GiB"
write-buffer-size = "32MiB"
apply-threads = 3
runtime-threads = 2
apply-nice = -5
store-nice = 7
[tls]
ca = "/x/ca.pem"
key = "/x/a.key"
[quic]
receive-window = 1048576
stream-receive-window = "512KiB"
max-udp-payload = 9000
idle-timeout = "1m"
silence-limit = "2s"
udp-receive-buffer = "16MiB"
congestion = "cubic"
packet-threshold = 64
time-threshold = 2
"#,
        )
        .unwrap();
        assert_eq!(c.listen, "0.0.0.0:7500".parse().unwrap());
        assert_eq!(c.data_dir, PathBuf::from("/d"));
        assert_eq!(c.sync, SyncPolicy::Always);
        assert_eq!(c.max_staleness, Duration::from_secs(90));
        assert_eq!(c.max_clock_skew, Duration::from_secs(2));
        assert_eq!(c.binlog_retention, Duration::from_secs(7 * 86400));
        assert_eq!(c.expect_tablets.len(), 2);
        assert_eq!(c.expect_tablets[1].as_str(), "t-2");
        assert_eq!(c.segment_size, 1 << 30);
        assert_eq!(c.cache_size, 1 << 30);
        assert_eq!(ApplierConfig::default().cache_size, 256 << 20);
        assert_eq!(c.write_buffer_size, 32 << 20);
        assert_eq!(ApplierConfig::default().write_buffer_size, 64 << 20);
        assert_eq!(c.effective_apply_threads(), 3);
        assert_eq!(c.effective_runtime_threads(), 2);
        assert!(ApplierConfig::default().effective_apply_threads() >= 1);
        assert_eq!(c.apply_nice, -5);
        assert_eq!(c.store_nice, 7);
        assert_eq!(ApplierConfig::default().store_nice, 0);
        assert_eq!(ApplierConfig::default().apply_nice, 0);
        assert_eq!(c.tls.ca, PathBuf::from("/x/ca.pem"));
        assert_eq!(c.tls.cert, PathBuf::from("/etc/tidelog/tls/applier.pem"));
        assert_eq!(c.tls.key, PathBuf::from("/x/a.key"));
        assert_eq!(c.quic.receive_window, 1 << 20);
        assert_eq!(c.quic.stream_receive_window, 512 << 10);
        assert_eq!(c.quic.max_udp_payload, 9000);
        assert_eq!(c.quic.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.quic.silence_limit, Duration::from_secs(2));
        assert_eq!(c.quic.tuning().silence_limit, Duration::from_secs(2));
        assert_eq!(c.quic.tuning().udp_receive_buffer, 16 << 20);
        assert_eq!(QuicConfig::default().udp_receive_buffer, 8 << 20);
        let t = c.quic.tuning();
        assert_eq!(
            (t.congestion, t.packet_threshold, t.time_threshold),
            (Congestion::Cubic, 64, 2.0)
        );
        // Unset, they are the libraries' defaults: BBR, loss found by time.
        let d = QuicConfig::default().tuning();
        assert_eq!(d, QuicTuning::default());
        assert_eq!(d.congestion, Congestion::Bbr);
        assert_eq!(d.time_threshold, 2.0);
    }

    #[test]
    fn full_shipper_config() {
        let c = shipper(
            r#"
wal-dir = "/w"
applier = "10.0.0.1:7400"
server-name = "dr.example"
io-engine = "std"
lanes = 3
shipper-id = "src-1"
max-frame-bytes = "256KiB"
window-bytes = "64MB"
keepalive-interval = "1s"
poll-interval = "500us"
reconnect-min = "50ms"
reconnect-max = "10s"
ship-unsynced = true
"#,
        )
        .unwrap();
        assert_eq!(c.io_engine, IoEngine::Std);
        assert_eq!(c.lanes, 3);
        assert_eq!(c.effective_lanes(), 3);
        assert_eq!(c.shipper_id, "src-1");
        assert_eq!(c.max_frame_bytes, 256 << 10);
        assert_eq!(c.window_bytes, 64_000_000);
        assert_eq!(c.poll_interval, Duration::from_micros(500));
        assert!(c.ship_unsynced);
        assert_eq!(c.applier_addr().unwrap(), "10.0.0.1:7400".parse().unwrap());
    }

    #[test]
    fn bad_values_name_the_key() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "max-staleness = \"15 parsecs\"",
                "max-staleness",
                "invalid duration",
            ),
            ("max-staleness = 15", "max-staleness", "duration"),
            ("sync = \"sometimes\"", "sync", "sometimes"),
            ("listen = \"nowhere\"", "listen", "nowhere"),
            (
                "segment-size = \"64 furlongs\"",
                "segment-size",
                "unknown unit",
            ),
            ("segment-size = -1", "segment-size", "negative"),
            (
                "expect-tablets = [\"bad tablet!\"]",
                "expect-tablets",
                "bad tablet!",
            ),
            ("expect-tablets = \"t1\"", "expect-tablets", ""),
            (
                "[quic]\nidle-timeout = \"soon\"",
                "quic.idle-timeout",
                "invalid duration",
            ),
            (
                "[quic]\nmax-udp-payload = 100000",
                "quic.max-udp-payload",
                "",
            ),
            (
                "[quic]\ncongestion = \"vegas\"",
                "quic.congestion",
                "not one of bbr, cubic, newreno",
            ),
            (
                "[quic]\ntime-threshold = \"long\"",
                "quic.time-threshold",
                "",
            ),
            ("[quic]\npacket-threshold = -1", "quic.packet-threshold", ""),
            ("[tls]\nca = 5", "tls.ca", ""),
            ("data-dir = 5", "data-dir", ""),
            ("data-dir = \"\"", "data-dir", "must not be empty"),
            ("admin-socket = \"\"", "admin-socket", "must not be empty"),
            ("[tls]\ncert = \"\"", "tls.cert", "must not be empty"),
            (
                "expect-tablets = [\"t1\", \"t2\", \"t1\"]",
                "expect-tablets",
                "tablet \"t1\" is listed more than once",
            ),
            ("received-direct-io = \"yes\"", "received-direct-io", ""),
            (
                "received-direct-io-in-catch-up = 1",
                "received-direct-io-in-catch-up",
                "",
            ),
            (
                "apply-yield-to-intake = \"a while\"",
                "apply-yield-to-intake",
                "invalid duration",
            ),
        ];
        for (text, key, what) in cases {
            let e = applier(text).unwrap_err();
            assert!(e.contains(&format!("key \"{key}\"")), "{text}: {e}");
            assert!(e.contains(what), "{text}: {e}");
        }
        let cases: &[(&str, &str)] = &[
            ("io-engine = \"fast\"", "io-engine"),
            ("lanes = -2", "lanes"),
            ("ship-unsynced = \"yes\"", "ship-unsynced"),
            ("window-bytes = \"lots\"", "window-bytes"),
            ("reconnect-max = \"5 fortnights\"", "reconnect-max"),
            ("wal-dir = \"\"", "wal-dir"),
            ("admin-socket = \"\"", "admin-socket"),
            ("[tls]\nkey = \"\"", "tls.key"),
        ];
        for (text, key) in cases {
            let e = shipper(text).unwrap_err();
            assert!(e.contains(&format!("key \"{key}\"")), "{text}: {e}");
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = applier("listen = \"127.0.0.1:1\"\nfoo = 1").unwrap_err();
        assert!(e.contains("unknown key \"foo\""), "{e}");
        assert!(e.contains("max-staleness"), "lists the known keys: {e}");
        let e = applier("[tls]\nca = \"/a\"\nfoo = \"x\"").unwrap_err();
        assert!(e.contains("unknown key \"tls.foo\""), "{e}");
        let e = shipper("[quic]\nwindow = 1").unwrap_err();
        assert!(e.contains("unknown key \"quic.window\""), "{e}");
        let e = applier("[foo]\na = 1").unwrap_err();
        assert!(e.starts_with("unknown key \"foo\""), "{e}");
        let e = applier("tls = 5").unwrap_err();
        assert!(e.starts_with("key \"tls\""), "{e}");
        // A shipper key is not an applier key.
        let e = applier("wal-dir = \"/w\"").unwrap_err();
        assert!(e.contains("unknown key \"wal-dir\""), "{e}");
    }

    #[test]
    fn syntax_errors_and_file_names() {
        let e = applier("listen = ").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("applier.toml");
        std::fs::write(&p, "max-staleness = \"15 parsecs\"\n").unwrap();
        let e = format!("{:#}", load_applier(&p).unwrap_err());
        assert!(
            e.contains("applier.toml: key \"max-staleness\": invalid duration \"15 parsecs\""),
            "{e}"
        );
        std::fs::write(&p, "[tls]\nca = \"/nonexistent/ca.pem\"\n").unwrap();
        let e = format!("{:#}", check_applier(&p).unwrap_err());
        assert!(
            e.contains("applier.toml: key \"tls.ca\": cannot read /nonexistent/ca.pem"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            load_shipper(&dir.path().join("missing.toml")).unwrap_err()
        );
        assert!(e.contains("missing.toml"), "{e}");
    }

    #[test]
    fn metrics_listen_and_log_level() {
        let c = applier("metrics-listen = \"127.0.0.1:9400\"\nlog-level = \"debug\"").unwrap();
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9400".parse().unwrap()));
        assert_eq!(c.log_level, "debug");
        assert_eq!(ApplierConfig::default().metrics_listen, None);
        assert_eq!(ApplierConfig::default().log_level, "info");
        let s = shipper("metrics-listen = \"[::1]:9401\"").unwrap();
        assert_eq!(s.metrics_listen, Some("[::1]:9401".parse().unwrap()));
        let e = applier("metrics-listen = \"nowhere\"").unwrap_err();
        assert!(
            e.contains("key \"metrics-listen\"") && e.contains("nowhere"),
            "{e}"
        );
        let e = shipper("metrics-listen = 9400").unwrap_err();
        assert!(e.contains("key \"metrics-listen\""), "{e}");
        let c = ApplierConfig {
            log_level: "tidelog=[bad".into(),
            ..ApplierConfig::default()
        };
        let e = format!("{:#}", c.validate().unwrap_err());
        assert!(e.contains("log-level"), "{e}");
    }

    #[test]
    fn log_level_directives() {
        for ok in [
            "info",
            "INFO",
            "Warn",
            "off",
            "tidelog_applier=debug,info",
            "tidelog_shipper=debug, warn",
            "tidelog_wal=TRACE",
            "info,",
        ] {
            validate_log_level(ok).unwrap_or_else(|e| panic!("{ok:?}: {e:#}"));
        }
        for (bad, directive) in [
            ("verbose", "verbose"),
            ("warning", "warning"),
            ("info,tidelog_applier", "tidelog_applier"),
            ("tidelog=verbose", "tidelog=verbose"),
            ("=debug", "=debug"),
            ("==", "=="),
        ] {
            let e = format!("{:#}", validate_log_level(bad).unwrap_err());
            assert!(
                e.starts_with("key \"log-level\": invalid filter")
                    && e.contains(&format!("directive {directive:?}"))
                    && e.contains("target=level"),
                "{bad:?}: {e}"
            );
        }
        assert!(format!("{:#}", validate_log_level(" ").unwrap_err()).contains("empty"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("16KiB").unwrap(), 16384);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1 GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("64MB").unwrap(), 64_000_000);
        assert_eq!(parse_size("2gb").unwrap(), 2_000_000_000);
        assert!(parse_size("").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("1.5GiB").is_err());
        assert!(parse_size("99999999999TiB")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn validate_checks_files_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        let tls = TlsConfig {
            ca: dir.path().join("ca.pem"),
            cert: dir.path().join("applier.pem"),
            key: dir.path().join("applier.key"),
        };
        let mut c = ApplierConfig {
            tls: tls.clone(),
            ..ApplierConfig::default()
        };
        let e = format!("{:#}", c.validate().unwrap_err());
        assert!(e.contains("tls.ca") && e.contains("ca.pem"), "{e}");
        for f in ["ca.pem", "applier.pem", "applier.key"] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        c.validate().unwrap();
        c.quic.max_udp_payload = 1000;
        let e = format!("{:#}", c.validate().unwrap_err());
        assert!(e.contains("quic.max-udp-payload"), "{e}");
        c.quic.max_udp_payload = 1472;
        c.quic.silence_limit = Duration::from_millis(10);
        let e = format!("{:#}", c.validate().unwrap_err());
        assert!(
            e.contains("quic.silence-limit") && e.contains("at least 50ms"),
            "{e}"
        );
        c.quic.silence_limit = Duration::from_secs(5);
        c.quic.packet_threshold = 2;
        let e = format!("{:#}", c.validate().unwrap_err());
        assert!(e.contains("quic.packet-threshold"), "{e}");
        c.quic.packet_threshold = 3;
        for bad in [0.5, 11.0, f32::NAN] {
            c.quic.time_threshold = bad;
            let e = format!("{:#}", c.validate().unwrap_err());
            assert!(e.contains("quic.time-threshold"), "{bad}: {e}");
        }
        c.quic.time_threshold = 1.125;
        c.validate().unwrap();

        let mut s = ShipperConfig {
            tls,
            wal_dir: dir.path().join("wal"),
            ..ShipperConfig::default()
        };
        // Missing: valid, with a warning (the shipper waits for it).
        s.validate().unwrap();
        let w = s.wal_dir_missing().unwrap();
        assert!(w.contains("key \"wal-dir\"") && w.contains("waits"), "{w}");
        std::fs::write(dir.path().join("wal"), "x").unwrap();
        let e = format!("{:#}", s.validate().unwrap_err());
        assert!(
            e.contains("key \"wal-dir\"") && e.contains("not a directory"),
            "{e}"
        );
        std::fs::remove_file(dir.path().join("wal")).unwrap();
        std::fs::create_dir(dir.path().join("wal")).unwrap();
        s.validate().unwrap();
        assert_eq!(s.wal_dir_missing(), None);
        s.reconnect_max = Duration::from_millis(1);
        assert!(format!("{:#}", s.validate().unwrap_err()).contains("reconnect-max"));
        s.reconnect_max = Duration::from_secs(5);
        s.applier = "no port here".into();
        assert!(format!("{:#}", s.validate().unwrap_err()).contains("key \"applier\""));
        s.applier = "127.0.0.1:7400".into();
        s.window_bytes = 10;
        assert!(format!("{:#}", s.validate().unwrap_err()).contains("window-bytes"));
        s.window_bytes = 16 << 20;
        s.lanes = MAX_LANES;
        s.validate().unwrap();
        s.lanes = 100_000;
        let e = format!("{:#}", s.validate().unwrap_err());
        assert!(e.starts_with("key \"lanes\": 100000 is above"), "{e}");

        c.quic.silence_limit = Duration::from_secs(5);
        c.validate().unwrap();
        c.binlog_retention = Duration::ZERO;
        let e = format!("{:#}", c.validate().unwrap_err());
        assert!(
            e.starts_with("key \"binlog-retention\": must be > 0"),
            "{e}"
        );
        c.binlog_retention = Duration::from_secs(1);
        c.apply_threads = MAX_APPLY_THREADS + 1;
        let e = format!("{:#}", c.validate().unwrap_err());
        assert!(e.starts_with("key \"apply-threads\": 257 is above"), "{e}");
        c.apply_threads = 0;
        c.runtime_threads = MAX_RUNTIME_THREADS + 1;
        let e = format!("{:#}", c.validate().unwrap_err());
        assert!(
            e.starts_with("key \"runtime-threads\": 257 is above"),
            "{e}"
        );
        c.runtime_threads = 0;
        assert!(c.effective_runtime_threads() >= 1);
        type Field = fn(&mut ApplierConfig) -> &mut i32;
        let nice: [(&str, Field); 2] = [
            ("apply-nice", |c| &mut c.apply_nice),
            ("store-nice", |c| &mut c.store_nice),
        ];
        for (key, field) in nice {
            for bad in [-21, 20] {
                *field(&mut c) = bad;
                let e = format!("{:#}", c.validate().unwrap_err());
                assert!(
                    e.starts_with(&format!("key \"{key}\": {bad} is not a nice value")),
                    "{e}"
                );
            }
            for good in [-20, 19] {
                *field(&mut c) = good;
                c.validate().unwrap();
            }
        }
        c.cache_size = 0;
        let e = format!("{:#}", c.validate().unwrap_err());
        assert!(e.starts_with("key \"cache-size\": must be > 0"), "{e}");
        c.cache_size = 1 << 20;
        c.write_buffer_size = (4 << 20) - 1;
        let e = format!("{:#}", c.validate().unwrap_err());
        assert!(
            e.starts_with("key \"write-buffer-size\": 4194303 is below the minimum 4MiB"),
            "{e}"
        );
        c.write_buffer_size = 4 << 20;
        c.validate().unwrap();
    }
}
