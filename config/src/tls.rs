//! `[tls]`: the PEM files of mutual TLS, each key defaulting to the daemon's own path under
//! `/etc/tidelog/tls`.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Deserializer};

use crate::parse::de_opt_path;

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

const TLS_DIR: &str = "/etc/tidelog/tls";

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

pub(crate) fn de_tls_applier<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<TlsConfig, D::Error> {
    Ok(RawTls::deserialize(d)?.with_defaults(TlsConfig::applier_default()))
}

pub(crate) fn de_tls_shipper<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<TlsConfig, D::Error> {
    Ok(RawTls::deserialize(d)?.with_defaults(TlsConfig::shipper_default()))
}
