//! `shipper.toml`: its keys with their defaults, and the checks parsing cannot make.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

use crate::log_level::{validate_log_level, DEFAULT_LOG_LEVEL};
use crate::parse::{de_opt_addr, de_path};
use crate::quic::QuicConfig;
use crate::tls::{de_tls_shipper, TlsConfig};
use crate::units::{de_duration, de_size};

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

/// The most shipper lanes (runtime threads with a QUIC connection each) `lanes` may ask for.
pub const MAX_LANES: usize = 256;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn shipper(text: &str) -> std::result::Result<ShipperConfig, String> {
        crate::parse_str(text)
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
}
