//! `applier.toml`: its keys with their defaults, and the checks parsing cannot make.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::Deserialize;
use tidelog_wal::{SyncPolicy, TabletId};

use crate::log_level::{validate_log_level, DEFAULT_LOG_LEVEL};
use crate::parse::{de_from_str, de_opt_addr, de_path, de_tablets};
use crate::quic::QuicConfig;
use crate::tls::{de_tls_applier, TlsConfig};
use crate::units::{de_duration, de_size};

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
    pub sql: Option<crate::sql::SqlConfig>,
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use tidelog_net::{Congestion, QuicTuning};

    fn applier(text: &str) -> std::result::Result<ApplierConfig, String> {
        crate::parse_str(text)
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
}
