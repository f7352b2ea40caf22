//! Test kit for the pipe: in-memory PKI, source WAL writers, an applier intake on an
//! ephemeral loopback port, and waiting on conditions with a deadline.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tidelog_wal::{Body, HybridTime, Op, Record, SyncPolicy, TabletId, WalOptions, Writer};

pub struct Pki {
    pub ca: CertificateDer<'static>,
    pub server: (CertificateDer<'static>, PrivateKeyDer<'static>),
    pub client: (CertificateDer<'static>, PrivateKeyDer<'static>),
}

fn key_der(k: &KeyPair) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(k.serialize_der()))
}

pub fn pki(name: &str) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} CA"));
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let sk = KeyPair::generate().unwrap();
    let mut sp =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server = sp.signed_by(&sk, &issuer).unwrap();
    let ck = KeyPair::generate().unwrap();
    let mut cp = CertificateParams::new(Vec::<String>::new()).unwrap();
    cp.distinguished_name
        .push(DnType::CommonName, "tidelog-shipper");
    cp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client = cp.signed_by(&ck, &issuer).unwrap();
    Pki {
        ca: ca_cert.der().clone(),
        server: (server.der().clone(), key_der(&sk)),
        client: (client.der().clone(), key_der(&ck)),
    }
}

pub fn server_tls(p: &Pki) -> tidelog_applier::tls::TlsMaterial {
    tidelog_applier::tls::TlsMaterial {
        ca: vec![p.ca.clone()],
        chain: vec![p.server.0.clone()],
        key: p.server.1.clone_key(),
    }
}

pub fn client_tls(p: &Pki) -> tidelog_shipper::TlsMaterial {
    tidelog_shipper::TlsMaterial {
        ca: vec![p.ca.clone()],
        chain: vec![p.client.0.clone()],
        key: p.client.1.clone_key(),
    }
}

/// Waits for `cond` up to `timeout`, polling; panics naming `what` on timeout.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn tablet(i: usize) -> TabletId {
    format!("tablet-{i}").parse().unwrap()
}

/// A source writer for tablet `t` under `wal_dir`, with small segments to rotate often.
pub fn source(wal_dir: &Path, t: &TabletId, segment_size: u64) -> Writer {
    Writer::open(
        wal_dir,
        t,
        WalOptions {
            segment_size,
            ..WalOptions::default()
        },
    )
    .unwrap()
}

/// Appends `n` write records (key `k{seq}`, value of `value_len` bytes) and commits.
pub fn write_records(w: &mut Writer, seq0: u64, n: u64, value_len: usize) {
    for s in seq0..seq0 + n {
        let ht = HybridTime(w.last_ht().map_or(1, |h| h.0 + 1));
        let r = Record::new(
            ht,
            Body::Write {
                ops: vec![Op::put(
                    format!("k{}", s % 97),
                    format!("{s:08}").repeat(value_len / 8 + 1)[..value_len].to_string(),
                )],
                trx_id: None,
                gtid: None,
            },
        );
        w.append(&r).unwrap();
    }
    w.commit(SyncPolicy::Always).unwrap();
}

/// All records of a tablet's log (Durable limit).
pub fn read_all(root: &Path, t: &TabletId) -> Vec<(tidelog_wal::WalPos, Record)> {
    tidelog_wal::Reader::open(root, t, tidelog_wal::ReadLimit::Durable)
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}
