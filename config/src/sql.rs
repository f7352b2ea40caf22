//! `[sql]` in `applier.toml`: the MySQL-protocol endpoint (docs/configuration.md, "[sql]";
//! docs/operations.md, "The SQL endpoint"). Off unless the table is present. The daemon
//! turns it into the endpoint's options (reading the password file, refused when group or
//! others can read it, and building TLS from `[tls]`) — the same checks at start and in
//! `tidelog apply --check`.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::parse::{de_from_str, de_path};
use crate::units::de_duration;
use anyhow::{bail, Result};
use serde::Deserialize;

/// `[sql]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct SqlConfig {
    /// TCP address of the endpoint. Default `127.0.0.1:3307`.
    #[serde(deserialize_with = "de_from_str")]
    pub listen: SocketAddr,
    /// The user name clients log in with. Default `tidelog`.
    pub user: String,
    /// The password: the file's first line (a trailing newline is stripped). The file must
    /// not be readable by group or others (mode 0600). Default `/etc/tidelog/sql-password`.
    #[serde(deserialize_with = "de_path")]
    pub password_file: PathBuf,
    /// TLS with `[tls]`'s certificate and key: `off`, `optional` (a client may switch to
    /// it, `--ssl`) or `required` (clients that do not are refused). Default `optional`.
    #[serde(deserialize_with = "de_from_str")]
    pub tls: SqlTls,
    /// Connections held at once (one more is refused with error 1040). Default 256.
    pub max_connections: usize,
    /// A connection idle between statements for this long is closed (MySQL's
    /// `wait_timeout`). Default `8h`.
    #[serde(deserialize_with = "de_duration")]
    pub idle_timeout: Duration,
}

/// `sql.tls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SqlTls {
    Off,
    #[default]
    Optional,
    Required,
}

impl FromStr for SqlTls {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<SqlTls, String> {
        match s {
            "off" => Ok(SqlTls::Off),
            "optional" => Ok(SqlTls::Optional),
            "required" => Ok(SqlTls::Required),
            _ => Err("expected off, optional or required".into()),
        }
    }
}

impl fmt::Display for SqlTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SqlTls::Off => "off",
            SqlTls::Optional => "optional",
            SqlTls::Required => "required",
        })
    }
}

/// The most connections `max-connections` may ask for.
pub const MAX_CONNECTIONS: usize = 65_536;

impl Default for SqlConfig {
    fn default() -> Self {
        SqlConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 3307)),
            user: "tidelog".to_string(),
            password_file: PathBuf::from("/etc/tidelog/sql-password"),
            tls: SqlTls::Optional,
            max_connections: 256,
            idle_timeout: Duration::from_secs(8 * 3600),
        }
    }
}

impl SqlConfig {
    /// What parsing cannot check (no file is read here).
    pub fn validate(&self) -> Result<()> {
        if self.user.is_empty() || self.user.len() > 80 {
            bail!("key \"sql.user\": must be 1 to 80 bytes");
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            bail!(
                "key \"sql.max-connections\": {} is out of range 1..={MAX_CONNECTIONS}",
                self.max_connections
            );
        }
        if self.idle_timeout.is_zero() {
            bail!("key \"sql.idle-timeout\": must be > 0");
        }
        Ok(())
    }
}
