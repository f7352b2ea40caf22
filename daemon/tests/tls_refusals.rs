//! What the logs say when TLS refuses the other end: a certificate signed by another CA is
//! named as such, with the CA file, on the end that refused it — not "connection lost" for a
//! connection that never existed — and the other end hears that it was refused.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;

/// Points the shipper's `[tls]` keys at other files.
fn shipper_tls(c: &Cluster, key: &str, file: &std::path::Path) {
    let text = std::fs::read_to_string(&c.shipper_cfg).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{key} = ")))
        .unwrap()
        .to_string();
    let text = text.replace(&line, &format!("{key} = \"{}\"", file.display()));
    std::fs::write(&c.shipper_cfg, text).unwrap();
}

fn log_of(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn the_applier_certificate_from_another_ca_is_named_on_the_shipper() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), "batch", "lanes = 1\n");
    let other = dir.path().join("other");
    certs_init(&other);
    // The shipper trusts another CA than the one that signed the applier's certificate.
    shipper_tls(&c, "ca", &other.join("ca.pem"));
    write_records(&c.wal, "t1", 1, |_| b"v".to_vec());
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    let log = dir.path().join("shipper.log");
    let want = format!(
        "cannot connect to the applier at 127.0.0.1:{}: the applier's certificate is not signed by the configured CA (ca = {})",
        c.port,
        other.join("ca.pem").display()
    );
    wait_for("the shipper naming the CA", Duration::from_secs(30), || {
        log_of(&log).contains(&want)
    });
    let l = log_of(&log);
    assert!(!l.contains(" lost"), "{l}");
    // The tablet's error says the same in the status.
    wait_for("the tablet's error", Duration::from_secs(30), || {
        api(&c.shipper_sock, "GET", "/v1/status").is_some_and(|(_, v)| {
            v["tablets"]["t1"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("not signed by the configured CA"))
        })
    });
}

#[test]
fn a_shipper_certificate_from_another_ca_is_named_on_the_applier() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), "batch", "lanes = 1\n");
    let other = dir.path().join("other");
    certs_init(&other);
    // The shipper presents a certificate of another CA (and still trusts the applier's).
    shipper_tls(&c, "cert", &other.join("shipper.pem"));
    shipper_tls(&c, "key", &other.join("shipper.key"));
    write_records(&c.wal, "t1", 1, |_| b"v".to_vec());
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    let (alog, slog) = (
        dir.path().join("applier.log"),
        dir.path().join("shipper.log"),
    );
    let want = format!(
        "shipper refused: its certificate is not signed by the configured CA (ca = {})",
        dir.path().join("tls/ca.pem").display()
    );
    wait_for("the applier naming the CA", Duration::from_secs(30), || {
        log_of(&alog).contains(&want)
    });
    wait_for(
        "the shipper told it was refused",
        Duration::from_secs(30),
        || log_of(&slog).contains("the applier refused this shipper's certificate"),
    );
}
