//! The project's one PKI generator (rcgen): a private CA and the mTLS certificates of both
//! daemons. `tidelog certs init` writes it ([`init`], `docs/operations.md`,
//! "Certificates"); tests and benchmarks use the same certificates, written or in memory
//! ([`Pki::generate`]).
//!
//! `init` writes into one directory:
//!
//! | file | what |
//! | --- | --- |
//! | `ca.pem`, `ca.key` | a self-signed CA (`CN=tidelog CA`), ECDSA P-256 |
//! | `applier.pem`, `applier.key` | server certificate signed by the CA: SANs `localhost`, `127.0.0.1` and every `--san` (an IP address if it parses as one, else a DNS name); EKU server-auth |
//! | `shipper.pem`, `shipper.key` | client certificate signed by the CA, `CN=tidelog-shipper`; EKU client-auth |
//!
//! Keys are created with mode 0600 (never chmod-ed after writing); existing files are never
//! overwritten unless `force` is set. Certificates are valid from the start of the current
//! year for ten years.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::tls::TlsMaterial;

/// The CN of the shipper's client certificate.
pub const SHIPPER_CN: &str = "tidelog-shipper";

/// The files `init` writes, in the order it writes them.
pub const FILES: [&str; 6] = [
    "ca.pem",
    "ca.key",
    "applier.pem",
    "applier.key",
    "shipper.pem",
    "shipper.key",
];

/// What `init` wrote.
#[derive(Debug, Clone)]
pub struct InitReport {
    /// Every file written, full paths, in [`FILES`] order.
    pub files: Vec<PathBuf>,
    /// The applier certificate's subject alternative names.
    pub applier_sans: Vec<String>,
}

/// A CA and the certificates and keys of both ends it signed, in memory.
#[derive(Debug)]
pub struct Pki {
    ca: Certificate,
    ca_key: KeyPair,
    applier: Certificate,
    applier_key: KeyPair,
    shipper: Certificate,
    shipper_key: KeyPair,
    /// The applier certificate's subject alternative names.
    applier_sans: Vec<String>,
}

/// Writes a new CA and the applier and shipper certificates into `dir` (created if missing).
/// `extra_sans` are added to the applier certificate besides `localhost` and `127.0.0.1`.
/// Fails without writing anything if any of [`FILES`] exists and `force` is not set.
pub fn init(dir: &Path, extra_sans: &[String], force: bool) -> Result<InitReport> {
    let (sans, san_types) = applier_sans(extra_sans)?;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create directory {}", dir.display()))?;
    let paths: Vec<PathBuf> = FILES.iter().map(|f| dir.join(f)).collect();
    if !force {
        let existing: Vec<String> = paths
            .iter()
            .filter(|p| p.symlink_metadata().is_ok())
            .map(|p| p.display().to_string())
            .collect();
        if !existing.is_empty() {
            bail!(
                "refusing to overwrite {} (use --force to replace them)",
                existing.join(", ")
            );
        }
    }
    let pki = Pki::signed(sans, san_types)?;
    for (path, text) in paths.iter().zip(pki.pems().iter()) {
        let is_key = path.extension().is_some_and(|e| e == "key");
        write_new(
            path,
            text.as_bytes(),
            if is_key { 0o600 } else { 0o644 },
            force,
        )?;
    }
    Ok(InitReport {
        files: paths,
        applier_sans: pki.applier_sans,
    })
}

/// `localhost`, `127.0.0.1` and `extra` (each once), and their SAN form: an IP address if
/// it parses as one, else a DNS name.
fn applier_sans(extra: &[String]) -> Result<(Vec<String>, Vec<SanType>)> {
    let mut sans = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    for s in extra {
        if !sans.contains(s) {
            sans.push(s.clone());
        }
    }
    let mut san_types = Vec::with_capacity(sans.len());
    for s in &sans {
        san_types.push(match s.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                rustls_pki_types::DnsName::try_from(s.as_str()).map_err(|e| {
                    anyhow!("--san {s:?} is neither an IP address nor a DNS name: {e}")
                })?;
                SanType::DnsName(
                    s.as_str()
                        .try_into()
                        .map_err(|e| anyhow!("--san {s:?} is not a valid DNS name: {e}"))?,
                )
            }
        });
    }
    Ok((sans, san_types))
}

impl Pki {
    /// A new CA and both ends' certificates, as [`init`] makes them, without writing
    /// anything. `extra_sans` as for [`init`].
    pub fn generate(extra_sans: &[String]) -> Result<Pki> {
        let (sans, san_types) = applier_sans(extra_sans)?;
        Pki::signed(sans, san_types)
    }

    fn signed(sans: Vec<String>, san_types: Vec<SanType>) -> Result<Pki> {
        let year = current_year();
        let ca_key = KeyPair::generate().context("generating the CA key")?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.distinguished_name = name("tidelog CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        ca_params.not_before = rcgen::date_time_ymd(year, 1, 1);
        ca_params.not_after = rcgen::date_time_ymd(year + 10, 1, 1);
        let ca = ca_params
            .self_signed(&ca_key)
            .context("signing the CA certificate")?;
        let issuer = Issuer::from_params(&ca_params, &ca_key);

        let leaf = |cn: &str, sans: Vec<SanType>, eku: ExtendedKeyUsagePurpose| {
            let mut p = CertificateParams::new(Vec::<String>::new())?;
            p.distinguished_name = name(cn);
            p.subject_alt_names = sans;
            p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            p.extended_key_usages = vec![eku];
            p.use_authority_key_identifier_extension = true;
            p.not_before = rcgen::date_time_ymd(year, 1, 1);
            p.not_after = rcgen::date_time_ymd(year + 10, 1, 1);
            Ok::<_, rcgen::Error>(p)
        };
        let applier_key = KeyPair::generate().context("generating the applier key")?;
        let applier = leaf(
            "tidelog-applier",
            san_types,
            ExtendedKeyUsagePurpose::ServerAuth,
        )?
        .signed_by(&applier_key, &issuer)
        .context("signing the applier certificate")?;
        let shipper_key = KeyPair::generate().context("generating the shipper key")?;
        let shipper = leaf(SHIPPER_CN, Vec::new(), ExtendedKeyUsagePurpose::ClientAuth)?
            .signed_by(&shipper_key, &issuer)
            .context("signing the shipper certificate")?;
        Ok(Pki {
            ca,
            ca_key,
            applier,
            applier_key,
            shipper,
            shipper_key,
            applier_sans: sans,
        })
    }

    /// The PEM text of each of [`FILES`], in that order.
    pub fn pems(&self) -> [String; 6] {
        [
            self.ca.pem(),
            self.ca_key.serialize_pem(),
            self.applier.pem(),
            self.applier_key.serialize_pem(),
            self.shipper.pem(),
            self.shipper_key.serialize_pem(),
        ]
    }

    /// The applier's material: the CA, its certificate and key.
    pub fn applier_material(&self) -> TlsMaterial {
        self.material(&self.applier, &self.applier_key)
    }

    /// The shipper's material: the CA, its certificate and key.
    pub fn shipper_material(&self) -> TlsMaterial {
        self.material(&self.shipper, &self.shipper_key)
    }

    fn material(&self, cert: &Certificate, key: &KeyPair) -> TlsMaterial {
        TlsMaterial {
            ca: vec![self.ca.der().clone()],
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        }
    }
}

fn name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "tidelog");
    dn.push(DnType::CommonName, cn);
    dn
}

/// The current calendar year (UTC); certificates are valid from its 1 January for ten years.
fn current_year() -> i32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Mean Gregorian year; exact enough to pick the calendar year (off by at most a day
    // around New Year, which only moves not_before by a year).
    1970 + (secs / 31_556_952) as i32
}

/// Creates `path` with `mode` (the mode applies at creation, so a key is never readable by
/// others, not even briefly). With `replace`, an existing file is removed first.
fn write_new(path: &Path, data: &[u8], mode: u32, replace: bool) -> Result<()> {
    if replace {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot replace {}", path.display())),
        }
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn init_writes_files_with_modes_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("tls");
        let r = init(&d, &["db.example".into(), "10.1.2.3".into()], false).unwrap();
        assert_eq!(r.files.len(), 6);
        assert_eq!(
            r.applier_sans,
            ["localhost", "127.0.0.1", "db.example", "10.1.2.3"]
        );
        for f in FILES {
            let mode = std::fs::metadata(d.join(f)).unwrap().permissions().mode() & 0o777;
            if f.ends_with(".key") {
                assert_eq!(mode, 0o600, "{f}");
            } else {
                assert_eq!(mode & 0o077, mode & 0o044, "{f} not writable by others");
            }
        }
        let before = std::fs::read(d.join("ca.pem")).unwrap();
        let e = format!("{:#}", init(&d, &[], false).unwrap_err());
        assert!(
            e.contains("refusing to overwrite") && e.contains("ca.pem"),
            "{e}"
        );
        assert_eq!(std::fs::read(d.join("ca.pem")).unwrap(), before);
        init(&d, &[], true).unwrap();
        assert_ne!(std::fs::read(d.join("ca.pem")).unwrap(), before);
        assert!(init(&d, &["not a name!".into()], true).is_err());
    }

    /// The in-memory material is the files' content: the same certificates, and a key
    /// that loads as the one written.
    #[test]
    fn material_matches_the_files() {
        let p = Pki::generate(&[]).unwrap();
        let pems = p.pems();
        let m = p.applier_material();
        let from_pem = |text: &str| {
            use rustls_pki_types::pem::PemObject;
            rustls_pki_types::CertificateDer::from_pem_slice(text.as_bytes()).unwrap()
        };
        assert_eq!(m.ca, vec![from_pem(&pems[0])]);
        assert_eq!(m.chain, vec![from_pem(&pems[2])]);
        assert_eq!(p.shipper_material().chain, vec![from_pem(&pems[4])]);
    }
}
