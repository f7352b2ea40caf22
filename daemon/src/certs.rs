//! `tidelog certs init`: a private CA and the mTLS certificates of both daemons, and loading
//! PEM files into rustls configurations (`docs/operations.md`, "Certificates").
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
//!
//! [`Material::load`] is how the daemons read `[tls]` at start and in `--check`: every file
//! parsed, the CA usable as a trust anchor, the key the certificate's; an error names the
//! config key and the file. [`key_mode_warning`] reports a private key others can read;
//! [`Material::check_validity`] refuses a certificate that expired or is not valid yet and
//! warns about one that expires within 30 days (its dates read by a small DER reader).
//!
//! [`server_config`] and [`client_config`] build the TLS 1.3 configurations the daemons use:
//! the applier requires a client certificate signed by `tls.ca`, the shipper verifies the
//! applier's against the same CA; both offer ALPN [`ALPN`].

use std::fs::OpenOptions;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, InconsistentKeys, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsConfig;
use crate::small_file;

/// The ALPN protocol id of the shipper–applier connection.
pub const ALPN: &[u8] = b"tidelog/1";

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

/// Writes a new CA and the applier and shipper certificates into `dir` (created if missing).
/// `extra_sans` are added to the applier certificate besides `localhost` and `127.0.0.1`.
/// Fails without writing anything if any of [`FILES`] exists and `force` is not set.
pub fn init(dir: &Path, extra_sans: &[String], force: bool) -> Result<InitReport> {
    let mut sans = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    for s in extra_sans {
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
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .context("signing the CA certificate")?;
    let issuer = Issuer::from_params(&ca_params, &ca_key);

    let applier_key = KeyPair::generate().context("generating the applier key")?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name = name("tidelog-applier");
    p.subject_alt_names = san_types;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.use_authority_key_identifier_extension = true;
    p.not_before = rcgen::date_time_ymd(year, 1, 1);
    p.not_after = rcgen::date_time_ymd(year + 10, 1, 1);
    let applier_cert = p
        .signed_by(&applier_key, &issuer)
        .context("signing the applier certificate")?;

    let shipper_key = KeyPair::generate().context("generating the shipper key")?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name = name(SHIPPER_CN);
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    p.use_authority_key_identifier_extension = true;
    p.not_before = rcgen::date_time_ymd(year, 1, 1);
    p.not_after = rcgen::date_time_ymd(year + 10, 1, 1);
    let shipper_cert = p
        .signed_by(&shipper_key, &issuer)
        .context("signing the shipper certificate")?;

    let contents = [
        ca_cert.pem(),
        ca_key.serialize_pem(),
        applier_cert.pem(),
        applier_key.serialize_pem(),
        shipper_cert.pem(),
        shipper_key.serialize_pem(),
    ];
    for (path, text) in paths.iter().zip(contents.iter()) {
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
        applier_sans: sans,
    })
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

/// A PEM file's bytes, at most [`small_file::PEM_MAX`].
fn read_pem(path: &Path) -> Result<Vec<u8>> {
    small_file::read(path, small_file::PEM_MAX, "a PEM file")
}

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{}: bad PEM: {e}", path.display()))?;
    if certs.is_empty() {
        bail!(
            "{}: no certificate (BEGIN CERTIFICATE) found",
            path.display()
        );
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let pem = read_pem(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            anyhow!("{}: no private key found", path.display())
        }
        e => anyhow!("{}: {e}", path.display()),
    })
}

/// How long before a certificate expires `--check` and the start begin to warn.
pub const EXPIRY_WARNING: std::time::Duration = std::time::Duration::from_secs(30 * 86400);

/// The PEM files of a daemon's `[tls]`, parsed and checked the way start-up uses them.
#[derive(Debug)]
pub struct Material {
    /// `tls.ca`: the certificates the peer's must chain to.
    pub ca: Vec<CertificateDer<'static>>,
    /// `tls.cert`: this end's certificate chain, its own certificate first.
    pub chain: Vec<CertificateDer<'static>>,
    /// `tls.key`: the private key of `chain[0]`.
    pub key: PrivateKeyDer<'static>,
}

impl Material {
    /// Loads `tls.ca`, `tls.cert` and `tls.key` and checks what the TLS configurations will
    /// need: each CA certificate usable as a trust anchor, the key a supported private key,
    /// the certificate parseable and its public key the private key's. Reads the files only.
    /// Errors name the key and the file: `key "tls.key": /etc/tidelog/tls/applier.key: no
    /// private key found`; callers add the config file.
    pub fn load(tls: &TlsConfig) -> Result<Material> {
        let named = |key: &str, e: anyhow::Error| anyhow!("key \"tls.{key}\": {e:#}");
        let ca = load_certs(&tls.ca).map_err(|e| named("ca", e))?;
        root_store(&tls.ca, &ca).map_err(|e| named("ca", e))?;
        let chain = load_certs(&tls.cert).map_err(|e| named("cert", e))?;
        let key = load_key(&tls.key).map_err(|e| named("key", e))?;
        let signer = provider()
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| {
                anyhow!(
                    "key \"tls.key\": {}: not a usable private key: {e}",
                    tls.key.display()
                )
            })?;
        match CertifiedKey::new(chain.clone(), signer).keys_match() {
            // `Unknown`: the key cannot say its public key; rustls accepts it the same way.
            Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(_)) => bail!(
                "key \"tls.key\": {} is not the private key of the certificate in {} \
                 (tls.cert)",
                tls.key.display(),
                tls.cert.display()
            ),
            Err(e) => bail!(
                "key \"tls.cert\": {}: not a usable certificate: {e}",
                tls.cert.display()
            ),
        }
        Ok(Material { ca, chain, key })
    }

    /// [`Material::load`], then what a start should know about the files: a private key
    /// others can read ([`key_mode_warning`]) and the certificates' validity
    /// ([`Material::check_validity`], now), as warnings — or an error for a certificate
    /// outside its validity.
    pub fn load_checked(tls: &TlsConfig) -> Result<(Material, Vec<String>)> {
        let m = Material::load(tls)?;
        let mut warnings: Vec<String> = key_mode_warning(&tls.key).into_iter().collect();
        warnings.extend(m.check_validity(tls, unix_now())?);
        Ok((m, warnings))
    }

    /// Checks the validity period of this end's certificate (`tls.cert`) and of each CA
    /// certificate (`tls.ca`) at `now` (Unix seconds): one that has expired or is not valid
    /// yet fails (every handshake would), naming the key, the file and the date; one that
    /// expires within [`EXPIRY_WARNING`] is a warning. A validity this reader cannot find
    /// is a warning too (rustls parsed the certificate; only the dates are unknown).
    pub fn check_validity(&self, tls: &TlsConfig, now: i64) -> Result<Vec<String>> {
        let mut warnings = Vec::new();
        let own = self.chain.first().map(|c| ("cert", &tls.cert, c));
        for (key, path, cert) in own
            .into_iter()
            .chain(self.ca.iter().map(|c| ("ca", &tls.ca, c)))
        {
            match validity(cert) {
                Err(e) => warnings.push(format!(
                    "key \"tls.{key}\": {}: cannot read the certificate's validity ({e})",
                    path.display()
                )),
                Ok((from, until)) => {
                    if now > until {
                        bail!(
                            "key \"tls.{key}\": {}: the certificate expired on {}",
                            path.display(),
                            format_unix_date(until)
                        );
                    }
                    if now < from {
                        bail!(
                            "key \"tls.{key}\": {}: the certificate is not valid before {} \
                             (is the clock right?)",
                            path.display(),
                            format_unix_date(from)
                        );
                    }
                    let left = until - now;
                    if left < EXPIRY_WARNING.as_secs() as i64 {
                        warnings.push(format!(
                            "key \"tls.{key}\": {}: the certificate expires on {} (in {} days)",
                            path.display(),
                            format_unix_date(until),
                            left / 86400
                        ));
                    }
                }
            }
        }
        Ok(warnings)
    }
}

/// The current time as Unix seconds.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// One DER element: its tag, its contents and what follows it.
fn der(buf: &[u8]) -> std::result::Result<(u8, &[u8], &[u8]), String> {
    let (&tag, rest) = buf.split_first().ok_or("truncated DER: no tag")?;
    let (&first, mut rest) = rest.split_first().ok_or("truncated DER: no length")?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(format!("bad DER length form 0x{first:02x}"));
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &b| (a << 8) | usize::from(b));
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return Err(format!(
            "truncated DER: element of {len} bytes, {} left",
            rest.len()
        ));
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

/// `notBefore` and `notAfter` of an X.509 certificate, as Unix seconds:
/// Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber,
/// signature, issuer, validity SEQUENCE { notBefore, notAfter }, … }, … }.
fn validity(cert: &[u8]) -> std::result::Result<(i64, i64), String> {
    const SEQUENCE: u8 = 0x30;
    let (tag, certificate, _) = der(cert)?;
    if tag != SEQUENCE {
        return Err(format!("certificate: tag 0x{tag:02x}, expected a SEQUENCE"));
    }
    let (tag, tbs, _) = der(certificate)?;
    if tag != SEQUENCE {
        return Err(format!(
            "tbsCertificate: tag 0x{tag:02x}, expected a SEQUENCE"
        ));
    }
    let mut rest = tbs;
    let (tag, _, after) = der(rest)?;
    if tag == 0xa0 {
        rest = after; // version
    }
    for field in ["serialNumber", "signature", "issuer"] {
        let (_, _, after) = der(rest).map_err(|e| format!("{field}: {e}"))?;
        rest = after;
    }
    let (tag, validity, _) = der(rest)?;
    if tag != SEQUENCE {
        return Err(format!("validity: tag 0x{tag:02x}, expected a SEQUENCE"));
    }
    let (t1, from, rest) = der(validity)?;
    let (t2, until, _) = der(rest)?;
    Ok((der_time(t1, from)?, der_time(t2, until)?))
}

/// A DER UTCTime (`YYMMDDHHMMSSZ`, years 1950–2049) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`) as Unix seconds.
fn der_time(tag: u8, v: &[u8]) -> std::result::Result<i64, String> {
    let text = std::str::from_utf8(v).map_err(|_| "a time that is not ASCII".to_string())?;
    let digits = text
        .strip_suffix('Z')
        .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("time {text:?}: expected digits and Z"))?;
    let num = |r: std::ops::Range<usize>| -> i64 { digits[r].parse().unwrap_or(0) };
    let (year, at) = match (tag, digits.len()) {
        (0x17, 12) => {
            let yy = num(0..2);
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
        }
        (0x18, 14) => (num(0..4), 4),
        _ => return Err(format!("time {text:?} with tag 0x{tag:02x}")),
    };
    let (month, day) = (num(at..at + 2), num(at + 2..at + 4));
    let (h, m, sec) = (
        num(at + 4..at + 6),
        num(at + 6..at + 8),
        num(at + 8..at + 10),
    );
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 {
        return Err(format!("time {text:?} out of range"));
    }
    Ok(days_from_civil(year, month, day) * 86400 + h * 3600 + m * 60 + sec)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix seconds as `YYYY-MM-DD` (UTC).
fn format_unix_date(t: i64) -> String {
    let z = t.div_euclid(86400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Why `key` (the `tls.key` file) can be read by others than the daemon, if it can: any
/// group or other permission bit (`mode & 0o077`), except group read when the file's group
/// is the daemon's own (the README's `chgrp tidelog *.key && chmod 0640 *.key`, for keys
/// owned by root and read by the `tidelog` user). `None` also when the file cannot be
/// stat-ed (loading it reports that).
pub fn key_mode_warning(key: &Path) -> Option<String> {
    let meta = std::fs::metadata(key).ok()?;
    let mode = meta.mode() & 0o7777;
    let loose = mode & 0o077;
    // SAFETY: getegid(2) takes no arguments and cannot fail.
    let own_group = meta.gid() == unsafe { libc::getegid() };
    if loose == 0 || (loose == 0o040 && own_group) {
        return None;
    }
    Some(format!(
        "key \"tls.key\": {} is accessible by group or others (mode {mode:04o}); a private \
         key should be mode 0600, or 0640 with the daemon's own group",
        key.display()
    ))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `certs` (read from `path`) as trust anchors.
fn root_store(path: &Path, certs: &[CertificateDer<'static>]) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots
            .add(c.clone())
            .with_context(|| format!("{}: not a usable CA certificate", path.display()))?;
    }
    Ok(roots)
}

fn roots(ca: &Path) -> Result<RootCertStore> {
    root_store(ca, &load_certs(ca)?)
}

/// The applier's TLS 1.3 server configuration: its certificate and key, and a client
/// certificate signed by `tls.ca` required. ALPN [`ALPN`].
pub fn server_config(tls: &TlsConfig) -> Result<ServerConfig> {
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots(&tls.ca)?), provider())
            .build()
            .with_context(|| format!("{}: cannot verify clients with it", tls.ca.display()))?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(load_certs(&tls.cert)?, load_key(&tls.key)?)
        .with_context(|| {
            format!(
                "{} / {}: certificate and key do not form a usable pair",
                tls.cert.display(),
                tls.key.display()
            )
        })?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

/// The shipper's TLS 1.3 client configuration: the applier's certificate must chain to
/// `tls.ca`; presents its own certificate and key. ALPN [`ALPN`].
pub fn client_config(tls: &TlsConfig) -> Result<ClientConfig> {
    let mut cfg = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots(&tls.ca)?)
        .with_client_auth_cert(load_certs(&tls.cert)?, load_key(&tls.key)?)
        .with_context(|| {
            format!(
                "{} / {}: certificate and key do not form a usable pair",
                tls.cert.display(),
                tls.key.display()
            )
        })?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use rustls::{ClientConnection, ServerConnection};
    use rustls_pki_types::ServerName;

    use super::*;

    fn tls(dir: &Path, role: &str) -> TlsConfig {
        TlsConfig {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{role}.pem")),
            key: dir.join(format!("{role}.key")),
        }
    }

    /// Runs a handshake in memory; the first error from either side.
    fn handshake(
        client: &mut ClientConnection,
        server: &mut ServerConnection,
    ) -> std::result::Result<(), rustls::Error> {
        for _ in 0..20 {
            let mut buf = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut buf).unwrap();
            }
            if !buf.is_empty() {
                server.read_tls(&mut &buf[..]).unwrap();
                server.process_new_packets()?;
            }
            let mut buf = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut buf).unwrap();
            }
            if !buf.is_empty() {
                client.read_tls(&mut &buf[..]).unwrap();
                client.process_new_packets()?;
            }
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        panic!("handshake did not finish");
    }

    fn connect(
        server_dir: &Path,
        client_dir: &Path,
        name: &str,
    ) -> std::result::Result<(), rustls::Error> {
        let server_cfg = Arc::new(server_config(&tls(server_dir, "applier")).unwrap());
        let client_cfg = Arc::new(client_config(&tls(client_dir, "shipper")).unwrap());
        let mut server = ServerConnection::new(server_cfg).unwrap();
        let mut client =
            ClientConnection::new(client_cfg, ServerName::try_from(name.to_string()).unwrap())
                .unwrap();
        handshake(&mut client, &mut server)?;
        assert_eq!(server.alpn_protocol(), Some(ALPN));
        let peer = server.peer_certificates().unwrap();
        assert_eq!(peer.len(), 1);
        Ok(())
    }

    #[test]
    fn dates_convert_both_ways() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(format_unix_date(951_868_800), "2000-03-01");
        assert_eq!(format_unix_date(0), "1970-01-01");
        // Every day of four centuries round-trips (leap years, 2000 and 2100 included).
        for day in (-1_000..146_097).step_by(7) {
            let t = day * 86400;
            let f = format_unix_date(t);
            let (y, m, d) = (&f[0..4], &f[5..7], &f[8..10]);
            let back = days_from_civil(y.parse().unwrap(), m.parse().unwrap(), d.parse().unwrap());
            assert_eq!(back, day, "{f}");
        }
        assert_eq!(der_time(0x17, b"491231235959Z").unwrap(), 2_524_607_999);
        assert_eq!(der_time(0x17, b"500101000000Z").unwrap(), -631_152_000);
        assert_eq!(der_time(0x18, b"20491231235959Z").unwrap(), 2_524_607_999);
        for (tag, bad) in [
            (0x17, &b"4912312359Z"[..]),
            (0x18, b"491231235959Z"),
            (0x17, b"491331235959Z"),
            (0x17, b"49123123595aZ"),
            (0x17, b"491231235959"),
            (0x17, b"\xff\xfe"),
        ] {
            assert!(der_time(tag, bad).is_err(), "{bad:?}");
        }
    }

    /// `certs init` certificates are valid from the start of this year for ten years:
    /// nothing to say today, a warning within 30 days of the end, an error past it or
    /// before the start — each naming the key, the file and the date.
    #[test]
    fn certificate_validity_is_checked_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("tls");
        init(&d, &[], false).unwrap();
        let cfg = tls(&d, "shipper");
        let m = Material::load(&cfg).unwrap();
        assert_eq!(
            m.check_validity(&cfg, unix_now()).unwrap(),
            Vec::<String>::new()
        );
        let (from, until) = validity(&m.chain[0]).unwrap();
        let year = format_unix_date(unix_now())[..4].parse::<i64>().unwrap();
        assert_eq!(format_unix_date(from), format!("{year:04}-01-01"));
        assert_eq!(format_unix_date(until), format!("{:04}-01-01", year + 10));
        assert_eq!(validity(&m.ca[0]).unwrap(), (from, until));

        let w = m.check_validity(&cfg, until - 10 * 86400).unwrap();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with("key \"tls.cert\"")
                && w[0].contains("shipper.pem")
                && w[0].contains(&format!("expires on {}-01-01 (in 10 days)", year + 10)),
            "{w:?}"
        );
        assert!(
            w[1].starts_with("key \"tls.ca\"") && w[1].contains("ca.pem"),
            "{w:?}"
        );

        let e = format!("{:#}", m.check_validity(&cfg, until + 1).unwrap_err());
        assert!(
            e.starts_with("key \"tls.cert\"")
                && e.contains(&format!("expired on {}-01-01", year + 10)),
            "{e}"
        );
        let e = format!("{:#}", m.check_validity(&cfg, from - 1).unwrap_err());
        assert!(
            e.contains(&format!("not valid before {year:04}-01-01")),
            "{e}"
        );
    }

    /// Damaged or truncated DER gives an error, never a panic.
    #[test]
    fn validity_of_damaged_der_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("tls");
        init(&d, &[], false).unwrap();
        let cert = load_certs(&d.join("applier.pem")).unwrap().remove(0);
        let bytes = cert.as_ref();
        for n in 0..bytes.len().min(400) {
            let _ = validity(&bytes[..n]);
        }
        assert!(validity(&bytes[..60]).is_err());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut b = bytes.to_vec();
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % b.len();
                b[i] = (x >> 32) as u8;
            }
            let _ = validity(&b);
        }
        assert!(validity(b"").is_err());
        assert!(validity(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
    }

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

    #[test]
    fn mutual_tls_handshake_and_foreign_ca_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        init(&a, &["dr.example".into(), "::1".into()], false).unwrap();
        init(&b, &[], false).unwrap();

        for name in ["localhost", "127.0.0.1", "dr.example", "::1"] {
            connect(&a, &a, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        // A name not in the applier certificate.
        assert!(connect(&a, &a, "other.example").is_err());

        // A shipper whose certificate comes from another CA is refused by the applier.
        let server_cfg = Arc::new(server_config(&tls(&a, "applier")).unwrap());
        let client_cfg = Arc::new(
            client_config(&TlsConfig {
                ca: a.join("ca.pem"),
                cert: b.join("shipper.pem"),
                key: b.join("shipper.key"),
            })
            .unwrap(),
        );
        let mut server = ServerConnection::new(server_cfg).unwrap();
        let mut client =
            ClientConnection::new(client_cfg, ServerName::try_from("localhost").unwrap()).unwrap();
        let e = handshake(&mut client, &mut server).unwrap_err();
        assert!(
            matches!(e, rustls::Error::InvalidCertificate(_)),
            "expected a certificate error, got {e}"
        );

        // And the shipper refuses an applier from another CA.
        assert!(connect(&b, &a, "localhost").is_err());

        // The applier certificate cannot act as a client (server-auth EKU only).
        let client_cfg = Arc::new(client_config(&tls(&a, "applier")).unwrap());
        let server_cfg = Arc::new(server_config(&tls(&a, "applier")).unwrap());
        let mut server = ServerConnection::new(server_cfg).unwrap();
        let mut client =
            ClientConnection::new(client_cfg, ServerName::try_from("localhost").unwrap()).unwrap();
        assert!(handshake(&mut client, &mut server).is_err());
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty.pem");
        std::fs::write(&p, "nothing here\n").unwrap();
        let e = format!("{:#}", load_certs(&p).unwrap_err());
        assert!(
            e.contains("empty.pem") && e.contains("no certificate"),
            "{e}"
        );
        let e = format!("{:#}", load_key(&p).unwrap_err());
        assert!(
            e.contains("empty.pem") && e.contains("no private key"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            load_certs(&dir.path().join("gone.pem")).unwrap_err()
        );
        assert!(e.contains("gone.pem"), "{e}");
        init(dir.path(), &[], false).unwrap();
        assert_eq!(
            load_certs(&dir.path().join("applier.pem")).unwrap().len(),
            1
        );
        load_key(&dir.path().join("shipper.key")).unwrap();
    }
}
