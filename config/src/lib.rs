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
//!
//! One file per concern: [`ApplierConfig`] (`applier.rs`), [`ShipperConfig`] (`shipper.rs`),
//! the `[tls]` and `[quic]` sections (`tls.rs`, `quic.rs`), sizes and durations (`units.rs`),
//! `log-level` (`log_level.rs`), and the strict parser that names the key at fault
//! (`parse.rs`); the applier's memory bound that a configuration implies (`memory.rs`).
//! It reads files and checks them; it starts nothing.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use serde::de::DeserializeOwned;

mod applier;
mod log_level;
pub mod memory;
mod parse;
mod quic;
mod shipper;
pub mod small_file;
mod sql;
mod tls;
mod units;

pub use applier::{
    default_runtime_threads, runtime_threads, ApplierConfig, MAX_APPLY_THREADS, MAX_RUNTIME_THREADS,
};
pub use log_level::DEFAULT_LOG_LEVEL;
pub use memory::ApplierBound;
pub use parse::parse_str;
pub use quic::QuicConfig;
pub use shipper::{default_shipper_id, IoEngine, ShipperConfig, MAX_LANES};
pub use sql::{SqlConfig, SqlTls, MAX_CONNECTIONS as SQL_MAX_CONNECTIONS};
pub use tls::TlsConfig;
pub use units::{parse_duration, parse_size};

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

#[cfg(test)]
mod tests;
