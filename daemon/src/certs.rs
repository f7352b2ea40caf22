//! `tidelog certs init`: a private CA and the mTLS certificates of both daemons, and loading
//! PEM files into rustls configurations (DESIGN §4, §8).
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
//! config key and the file. [`key_mode_warning`] reports a private key others can read.
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

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?
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
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            anyhow!("{}: no private key found", path.display())
        }
        e => anyhow!("{}: {e}", path.display()),
    })
}

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
