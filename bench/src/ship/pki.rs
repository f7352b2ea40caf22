//! A throwaway PKI for the shipping benchmark: a CA, the applier's server certificate
//! (`localhost`, `127.0.0.1`) and the shipper's client certificate, written as PEM files so
//! both processes load the same material the way the daemon does.

use std::path::Path;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

const CA: &str = "ca.pem";
const SERVER_CERT: &str = "server.pem";
const SERVER_KEY: &str = "server.key";
const CLIENT_CERT: &str = "client.pem";
const CLIENT_KEY: &str = "client.key";

/// Generates the CA, server and client certificates into `dir`.
pub fn generate(dir: &Path) -> Result<()> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tidelog-bench CA");
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let sk = KeyPair::generate()?;
    let mut sp = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
    sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server = sp.signed_by(&sk, &issuer)?;
    let ck = KeyPair::generate()?;
    let mut cp = CertificateParams::new(Vec::<String>::new())?;
    cp.distinguished_name
        .push(DnType::CommonName, "tidelog-bench-shipper");
    cp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client = cp.signed_by(&ck, &issuer)?;
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    write(CA, ca_cert.pem())?;
    write(SERVER_CERT, server.pem())?;
    write(SERVER_KEY, sk.serialize_pem())?;
    write(CLIENT_CERT, client.pem())?;
    write(CLIENT_KEY, ck.serialize_pem())?;
    Ok(())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", path.display()))
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).with_context(|| format!("reading {}", path.display()))
}

/// The applier's (server's) material.
pub fn server(dir: &Path) -> Result<tidelog_applier::tls::TlsMaterial> {
    Ok(tidelog_applier::tls::TlsMaterial {
        ca: certs(&dir.join(CA))?,
        chain: certs(&dir.join(SERVER_CERT))?,
        key: key(&dir.join(SERVER_KEY))?,
    })
}

/// The shipper's (client's) material.
pub fn client(dir: &Path) -> Result<tidelog_shipper::TlsMaterial> {
    Ok(tidelog_shipper::TlsMaterial {
        ca: certs(&dir.join(CA))?,
        chain: certs(&dir.join(CLIENT_CERT))?,
        key: key(&dir.join(CLIENT_KEY))?,
    })
}
