//! QUIC client configuration: rustls with a client certificate (mutual TLS), the applier's
//! CA as the only trust anchor, TLS 1.3, ALPN `tidelog/1`, and the transport tuning.

use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tidelog_net::QuicTuning;
use tidelog_proto::wire::ALPN;

/// Certificates and key of the shipper, already parsed from PEM.
#[derive(Debug)]
pub struct TlsMaterial {
    /// The CA that signed the applier's certificate.
    pub ca: Vec<CertificateDer<'static>>,
    /// The shipper's client certificate chain.
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

/// quinn transport settings from the tuning ([`tidelog_net::transport`]).
pub fn transport(t: &QuicTuning) -> Result<quinn::TransportConfig> {
    Ok(tidelog_net::transport(t)?)
}

/// The shipper's QUIC client config.
pub fn client_config(m: &TlsMaterial, t: &QuicTuning) -> Result<quinn::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in &m.ca {
        roots
            .add(c.clone())
            .context("CA certificate is not usable as a trust anchor")?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_root_certificates(roots)
        .with_client_auth_cert(m.chain.clone(), m.key.clone_key())
        .context("shipper certificate and key do not form a usable pair")?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .context("TLS config is not usable for QUIC")?;
    let mut cc = quinn::ClientConfig::new(Arc::new(crypto));
    cc.transport_config(Arc::new(transport(t)?));
    Ok(cc)
}
