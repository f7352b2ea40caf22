//! The applier's log lines name what they are about through their spans: a shipper
//! connection's lines carry `conn{conn=… shipper=…}`, a tablet stream's and an apply
//! worker's the tablet (`stream{tablet=…}`, `apply{tablet=…}`), so an operator can follow
//! one tablet or one shipper through the journal.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;

#[test]
fn connection_and_tablet_lines_carry_their_spans() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::with(dir.path(), "batch", "", "lanes = 1\n");
    write_records(&c.wal, "t1", 20, |_| vec![b'x'; 10]);
    let log = dir.path().join("applier.log");
    let _applier = Daemon::start_env("apply", &c.applier_cfg, &log, &[("RUST_LOG", "debug")]);
    let _shipper = c.start_shipper();
    wait_for("t1 applied", Duration::from_secs(30), || {
        api(&c.applier_sock, "GET", "/v1/status")
            .is_some_and(|(_, v)| v["tablets"]["t1"]["applied_records"].as_u64() == Some(20))
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let line = |what: &str| {
        text.lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} line in:\n{text}"))
            .to_string()
    };
    let open = line("tablet stream open");
    assert!(open.contains("conn{conn="), "{open}");
    assert!(open.contains("shipper="), "{open}");
    let apply = line("apply worker reading the received log");
    assert!(apply.contains("apply{tablet=t1}"), "{apply}");
}
