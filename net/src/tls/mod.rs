//! The one TLS set-up of tidelog's QUIC connections: TLS 1.3 with mutual authentication
//! against one CA, ALPN [`ALPN`].
//!
//! * The applier (server) requires a client certificate signed by its `tls.ca`
//!   ([`server_crypto`], [`server_config`]);
//! * the shipper (client) verifies the applier's certificate against the same CA and the
//!   name it dials ([`client_crypto`], [`client_config`]) and presents its own.
//!
//! [`TlsMaterial`] is one end's certificates and key, parsed: [`TlsMaterial::load`] reads
//! the PEM files of a `[tls]` table ([`TlsFiles`]) with capped reads and checks them the
//! way start-up and `--check` need ([`load`]); [`validity`] checks the certificates' dates;
//! [`refusal`] turns rustls's refusals into what an operator is told.

pub mod load;
pub mod refusal;
pub mod validity;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::QuicTuning;
use anyhow::{Context, Result};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

pub use load::{key_mode_warning, load_certs, load_key};
pub use refusal::CertRefusal;
pub use tidelog_proto::wire::ALPN;
pub use validity::{unix_now, EXPIRY_WARNING};

/// The PEM files of one end's `[tls]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `tls.ca`: the CA certificate(s) the peer's certificate must chain to.
    pub ca: PathBuf,
    /// `tls.cert`: this end's certificate chain, its own certificate first.
    pub cert: PathBuf,
    /// `tls.key`: this end's private key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// The files `tidelog certs init` writes into `dir` for `role` (`applier` or
    /// `shipper`): `ca.pem`, `<role>.pem`, `<role>.key`.
    pub fn in_dir(dir: &Path, role: &str) -> TlsFiles {
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{role}.pem")),
            key: dir.join(format!("{role}.key")),
        }
    }
}

/// Certificates and key of one end, parsed from PEM.
#[derive(Debug)]
pub struct TlsMaterial {
    /// The CA that signs the peer's certificate.
    pub ca: Vec<CertificateDer<'static>>,
    /// This end's certificate chain, its own certificate first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The private key of `chain[0]`.
    pub key: PrivateKeyDer<'static>,
}

impl Clone for TlsMaterial {
    fn clone(&self) -> TlsMaterial {
        TlsMaterial {
            ca: self.ca.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

/// rustls with the ring provider, the one both ends use.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `ca` as trust anchors; `what` is the error's context when one is not usable.
fn root_store(ca: &[CertificateDer<'static>], what: impl Fn() -> String) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for c in ca {
        roots.add(c.clone()).with_context(&what)?;
    }
    Ok(roots)
}

/// The context of a CA certificate the TLS configurations cannot use.
fn not_a_trust_anchor() -> String {
    "CA certificate is not usable as a trust anchor".to_string()
}

/// The applier's TLS 1.3 server configuration: its certificate and key, a client
/// certificate signed by `m.ca` required, no early data. ALPN [`ALPN`].
pub fn server_crypto(m: &TlsMaterial) -> Result<ServerConfig> {
    let verifier = WebPkiClientVerifier::builder_with_provider(
        Arc::new(root_store(&m.ca, not_a_trust_anchor)?),
        provider(),
    )
    .build()
    .context("building the client-certificate verifier")?;
    let mut tls = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(m.chain.clone(), m.key.clone_key())
        .context("applier certificate and key do not form a usable pair")?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.max_early_data_size = 0;
    Ok(tls)
}

/// A TCP server's TLS configuration with this end's certificate and key and no client
/// certificate (the SQL endpoint: MySQL clients authenticate with a password): TLS 1.2
/// and 1.3, which every MySQL/MariaDB client library speaks.
pub fn server_crypto_password_clients(m: &TlsMaterial) -> Result<ServerConfig> {
    ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS 1.2 and 1.3")?
        .with_no_client_auth()
        .with_single_cert(m.chain.clone(), m.key.clone_key())
        .context("certificate and key do not form a usable pair")
}

/// The shipper's TLS 1.3 client configuration: the applier's certificate must chain to
/// `m.ca` (and name the server it dials); presents its own certificate and key. ALPN
/// [`ALPN`].
pub fn client_crypto(m: &TlsMaterial) -> Result<ClientConfig> {
    let mut tls = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_root_certificates(root_store(&m.ca, not_a_trust_anchor)?)
        .with_client_auth_cert(m.chain.clone(), m.key.clone_key())
        .context("shipper certificate and key do not form a usable pair")?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(tls)
}

/// The server's transport settings: the tuning ([`crate::transport`]) with the applier's
/// stream limits: a bidirectional stream per tablet, no unidirectional ones.
pub fn server_transport(t: &QuicTuning) -> Result<quinn::TransportConfig> {
    let mut tc = crate::transport(t)?;
    tc.max_concurrent_bidi_streams(quinn::VarInt::from_u32(4096))
        .max_concurrent_uni_streams(quinn::VarInt::from_u32(0));
    Ok(tc)
}

/// The applier's QUIC server config: [`server_crypto`] and [`server_transport`].
pub fn server_config(m: &TlsMaterial, t: &QuicTuning) -> Result<quinn::ServerConfig> {
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(server_crypto(m)?)
        .context("TLS config is not usable for QUIC")?;
    let mut sc = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    sc.transport_config(Arc::new(server_transport(t)?));
    Ok(sc)
}

/// The shipper's QUIC client config: [`client_crypto`] and the tuning's transport.
pub fn client_config(m: &TlsMaterial, t: &QuicTuning) -> Result<quinn::ClientConfig> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(client_crypto(m)?)
        .context("TLS config is not usable for QUIC")?;
    let mut cc = quinn::ClientConfig::new(Arc::new(crypto));
    cc.transport_config(Arc::new(crate::transport(t)?));
    Ok(cc)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rustls::{ClientConnection, ServerConnection};
    use rustls_pki_types::ServerName;

    use super::*;
    use crate::pki;

    fn material(dir: &Path, role: &str) -> TlsMaterial {
        TlsMaterial::load(&TlsFiles::in_dir(dir, role)).unwrap()
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

    fn connect_with(
        server: &TlsMaterial,
        client: &TlsMaterial,
        name: &str,
    ) -> std::result::Result<(), rustls::Error> {
        let server_cfg = Arc::new(server_crypto(server).unwrap());
        let client_cfg = Arc::new(client_crypto(client).unwrap());
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

    fn connect(
        server_dir: &Path,
        client_dir: &Path,
        name: &str,
    ) -> std::result::Result<(), rustls::Error> {
        connect_with(
            &material(server_dir, "applier"),
            &material(client_dir, "shipper"),
            name,
        )
    }

    #[test]
    fn mutual_tls_handshake_and_foreign_ca_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        pki::init(&a, &["dr.example".into(), "::1".into()], false).unwrap();
        pki::init(&b, &[], false).unwrap();

        for name in ["localhost", "127.0.0.1", "dr.example", "::1"] {
            connect(&a, &a, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        // A name not in the applier certificate.
        assert!(connect(&a, &a, "other.example").is_err());

        // A shipper whose certificate comes from another CA is refused by the applier.
        let server_cfg = Arc::new(server_crypto(&material(&a, "applier")).unwrap());
        let client_cfg = Arc::new(
            client_crypto(
                &TlsMaterial::load(&TlsFiles {
                    ca: a.join("ca.pem"),
                    cert: b.join("shipper.pem"),
                    key: b.join("shipper.key"),
                })
                .unwrap(),
            )
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
        assert_eq!(CertRefusal::of(&e.to_string()), Some(CertRefusal::OtherCa));

        // And the shipper refuses an applier from another CA.
        let e = connect(&b, &a, "localhost").unwrap_err();
        assert_eq!(CertRefusal::of(&e.to_string()), Some(CertRefusal::OtherCa));

        // The applier certificate cannot act as a client (server-auth EKU only).
        let applier = material(&a, "applier");
        let client_cfg = Arc::new(client_crypto(&applier).unwrap());
        let server_cfg = Arc::new(server_crypto(&applier).unwrap());
        let mut server = ServerConnection::new(server_cfg).unwrap();
        let mut client =
            ClientConnection::new(client_cfg, ServerName::try_from("localhost").unwrap()).unwrap();
        assert!(handshake(&mut client, &mut server).is_err());
    }

    /// The material of a generated PKI, never written, is what the files would hold.
    #[test]
    fn in_memory_material_connects() {
        let p = pki::Pki::generate(&[]).unwrap();
        connect_with(&p.applier_material(), &p.shipper_material(), "localhost").unwrap();
        let other = pki::Pki::generate(&[]).unwrap();
        assert!(connect_with(
            &p.applier_material(),
            &other.shipper_material(),
            "localhost"
        )
        .is_err());
    }

    /// Both QUIC configs build from the same material and tuning.
    #[test]
    fn quic_configs_build() {
        let p = pki::Pki::generate(&[]).unwrap();
        let t = QuicTuning::default();
        server_config(&p.applier_material(), &t).unwrap();
        client_config(&p.shipper_material(), &t).unwrap();
    }
}
