//! Shipping through a lossy, jittery, reordering, duplicating link (the test kit's UDP
//! impairment proxy between the shipper and the intake), with a partition in the middle:
//! every record arrives exactly once and in order, and the acks come back.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use tidelog_applier::intake::{Intake, IntakeOptions};
use tidelog_shipper::{Shipper, ShipperOptions};
use tidelog_testkit::{ImpairProxy, Impairment};
use tidelog_wal::SyncPolicy;

/// Short enough for a partition to end the connection within the test; the same on both
/// ends.
const SILENCE: Duration = Duration::from_millis(600);

#[test]
fn ships_exactly_once_through_loss_reorder_and_a_partition() {
    let p = pki();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut io = IntakeOptions::new("127.0.0.1:0".parse().unwrap(), dst.path().to_path_buf());
    io.sync = SyncPolicy::Batch;
    io.segment_size = 96 << 10;
    io.quic.silence_limit = SILENCE;
    let intake = {
        let _g = rt.enter();
        Intake::start(io, server_tls(&p), None).unwrap()
    };
    let link: Impairment = "loss=5%,delay=5ms,jitter=2ms,reorder=10%,dup=1%"
        .parse()
        .unwrap();
    let proxy = ImpairProxy::start(
        rt.handle(),
        intake.local_addr().unwrap(),
        link.clone(),
        0x5eed,
    )
    .unwrap();

    let mut writers: Vec<_> = (0..4)
        .map(|i| source(src.path(), &tablet(i), 64 << 10))
        .collect();
    for (i, w) in writers.iter_mut().enumerate() {
        write_records(w, 0, 300, 100 + 60 * i);
    }
    let mut o = ShipperOptions::new(src.path().to_path_buf(), proxy.local_addr());
    o.lanes = 2;
    o.max_frame_bytes = 32 << 10;
    o.window_bytes = 128 << 10;
    o.rescan_interval = Duration::from_millis(100);
    o.reconnect_min = Duration::from_millis(20);
    o.reconnect_max = Duration::from_millis(200);
    o.quic.silence_limit = SILENCE;
    let shipper = Shipper::start(o, client_tls(&p)).unwrap();
    let received = |i: usize, w: &tidelog_wal::Writer| {
        intake
            .tablet(&tablet(i))
            .is_some_and(|t| t.received_pos() >= w.written_pos())
    };
    let all_received =
        |writers: &[tidelog_wal::Writer]| writers.iter().enumerate().all(|(i, w)| received(i, w));
    wait_for(
        "the first records through the link",
        Duration::from_secs(60),
        || all_received(&writers),
    );

    // A partition while more is written: frames in flight are lost, the connections end on
    // silence, and new ones resume from what the intake holds durably.
    let reconnects = shipper.reconnects();
    proxy.set_impairment(Impairment {
        loss: 1.0,
        ..link.clone()
    });
    for (i, w) in writers.iter_mut().enumerate() {
        write_records(w, 1_000, 200, 200 + 30 * i);
    }
    wait_for(
        "the shipper to give the partitioned connections up",
        Duration::from_secs(30),
        || shipper.reconnects() > reconnects,
    );
    proxy.set_impairment(link);
    for (i, w) in writers.iter_mut().enumerate() {
        write_records(w, 2_000, 300, 64 + 20 * i);
    }
    wait_for(
        "everything through the link",
        Duration::from_secs(90),
        || all_received(&writers),
    );

    // Exactly once: the 800 records written, each once and in order (their hts are
    // 1..=800), and record for record what the source still holds (retention has removed
    // the acked segments before the last).
    for (i, w) in writers.iter().enumerate() {
        let t = tablet(i);
        let got = read_all(&dst.path().join("received"), &t);
        let hts: Vec<u64> = got.iter().map(|(_, r)| r.ht.0).collect();
        assert_eq!(hts, (1..=800).collect::<Vec<_>>(), "{t}: received hts");
        let kept = read_all(src.path(), &t);
        assert!(!kept.is_empty(), "{t}: the source holds nothing");
        assert!(
            got.ends_with(&kept),
            "{t}: the received log's tail differs from the source's"
        );
        let end = w.written_pos().0;
        wait_for(&format!("{t} acked"), Duration::from_secs(30), || {
            shipper.status().get(&t).is_some_and(|s| s.acked_pos == end)
        });
    }
    // The link did what it was told, both ways.
    let s = proxy.stats();
    for (dir, d) in [
        ("to the intake", s.to_target),
        ("to the shipper", s.to_client),
    ] {
        assert!(
            d.lost > 0 && d.reordered > 0 && d.duplicated > 0,
            "{dir}: {d:?}"
        );
    }
    assert!(shipper.reconnects() > reconnects);
    shipper.shutdown();
    rt.block_on(intake.shutdown());
    drop(proxy);
}
