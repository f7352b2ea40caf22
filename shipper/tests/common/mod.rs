//! Test kit for the pipe: in-memory PKI (`tidelog_testkit::pki`), source WAL writers, an
//! applier intake on an ephemeral loopback port, and waiting on conditions with a deadline.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use tidelog_net::tls::TlsMaterial;
pub use tidelog_testkit::pki::Pki;
use tidelog_wal::{Body, HybridTime, Op, Record, SyncPolicy, TabletId, WalOptions, Writer};

/// A new CA with both ends' certificates, in memory.
pub fn pki() -> Pki {
    tidelog_testkit::pki::in_memory().unwrap()
}

pub fn server_tls(p: &Pki) -> TlsMaterial {
    p.applier_material()
}

pub fn client_tls(p: &Pki) -> TlsMaterial {
    p.shipper_material()
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
