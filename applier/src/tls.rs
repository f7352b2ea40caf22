//! QUIC server configuration: rustls with mutual TLS (only client certificates signed by
//! the configured CA), TLS 1.3, ALPN `tidelog/1`, and the transport tuning.

use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tidelog_wal::wire::{QuicTuning, ALPN};

/// Certificates and key of one end, already parsed from PEM.
#[derive(Debug)]
pub struct TlsMaterial {
    /// The CA that signs the peer's certificate.
    pub ca: Vec<CertificateDer<'static>>,
    /// This end's certificate chain.
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

/// quinn transport settings from the tuning.
pub fn transport(t: &QuicTuning) -> Result<quinn::TransportConfig> {
    let mut tc = quinn::TransportConfig::default();
    let vi = |v: u64, what: &str| {
        quinn::VarInt::from_u64(v).with_context(|| format!("{what} {v} is out of range"))
    };
    tc.receive_window(vi(t.receive_window, "receive window")?)
        .stream_receive_window(vi(t.stream_receive_window, "stream receive window")?)
        .send_window(t.receive_window)
        .max_concurrent_bidi_streams(vi(4096, "streams")?)
        .max_concurrent_uni_streams(vi(0, "streams")?)
        .initial_mtu(t.max_udp_payload.max(1200))
        .min_mtu(t.max_udp_payload.clamp(1200, 1452))
        .keep_alive_interval(Some(t.idle_timeout / 4))
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(t.idle_timeout).context("idle timeout out of range")?,
        ));
    Ok(tc)
}

/// The applier's QUIC server config: requires a client certificate signed by `m.ca`.
pub fn server_config(m: TlsMaterial, t: &QuicTuning) -> Result<quinn::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in m.ca {
        roots
            .add(c)
            .context("CA certificate is not usable as a trust anchor")?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .context("building the client-certificate verifier")?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(m.chain, m.key)
        .context("applier certificate and key do not form a usable pair")?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .context("TLS config is not usable for QUIC")?;
    let mut sc = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    sc.transport_config(Arc::new(transport(t)?));
    Ok(sc)
}
