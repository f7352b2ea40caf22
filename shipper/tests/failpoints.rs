//! Failure injection through the real pipe on loopback (docs/ARCHITECTURE.md,
//! "Guarantees"): corrupted frames, failing disk writes on the applier, and hostile frames
//! sent straight to the intake.
//!
//! The `fail` registry is process-global, so every test here takes [`serial`] first and
//! clears the failpoints it used when it ends (also on panic).
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::*;
use tidelog_applier::intake::{Intake, IntakeOptions, TabletState};
use tidelog_proto::wire::{self, Message, MSG_HEADER_LEN};
use tidelog_shipper::io::IoChoice;
use tidelog_shipper::{Shipper, ShipperOptions};
use tidelog_wal::{HybridTime, SyncPolicy, TabletId, WalOptions, WalPos, Writer};

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the process-wide failpoint registry for one test; clears the named failpoints on
/// drop.
struct Serial {
    _g: std::sync::MutexGuard<'static, ()>,
    names: Vec<&'static str>,
}

impl Drop for Serial {
    fn drop(&mut self) {
        for n in &self.names {
            fail::remove(n);
        }
    }
}

fn serial(names: &[&'static str]) -> Serial {
    let g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for n in names {
        fail::remove(n);
    }
    Serial {
        _g: g,
        names: names.to_vec(),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn start_intake(rt: &tokio::runtime::Runtime, p: &Pki, dir: &Path) -> Intake {
    let mut o = IntakeOptions::new("127.0.0.1:0".parse().unwrap(), dir.to_path_buf());
    o.sync = SyncPolicy::Batch;
    o.segment_size = 96 << 10;
    let _g = rt.enter();
    Intake::start(o, server_tls(p), None).unwrap()
}

fn shipper_opts(wal: &Path, addr: SocketAddr) -> ShipperOptions {
    let mut o = ShipperOptions::new(wal.to_path_buf(), addr);
    o.io_engine = IoChoice::Auto;
    o.lanes = 1;
    o.max_frame_bytes = 16 << 10;
    o.window_bytes = 256 << 10;
    o.rescan_interval = Duration::from_millis(100);
    o.reconnect_min = Duration::from_millis(20);
    o.reconnect_max = Duration::from_millis(200);
    o.acked_interval = Duration::from_millis(20);
    o
}

const WAIT: Duration = Duration::from_secs(30);

fn acked(s: &Shipper, t: &TabletId) -> u64 {
    s.status().get(t).map_or(0, |s| s.acked_pos)
}

fn acked_file(src: &Path, t: &TabletId) -> u64 {
    tidelog_wal::retention::read_acked(&src.join(t.as_str()))
        .unwrap()
        .map_or(0, |p| p.0)
}

/// Asserts that `got` is a prefix of `want`, record for record.
fn assert_prefix(
    want: &[(WalPos, tidelog_wal::Record)],
    got: &[(WalPos, tidelog_wal::Record)],
    what: &str,
) {
    assert!(
        got.len() <= want.len(),
        "{what}: received {} records, the source has {}",
        got.len(),
        want.len()
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g == w,
            "{what}: record {i} differs: got {g:?}, source {w:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 1. A frame corrupted in flight is refused, nothing of it is written, and it is resent.
// ---------------------------------------------------------------------------------------

#[test]
fn a_corrupted_frame_is_refused_then_resent_and_the_log_ends_identical() {
    let _s = serial(&["shipper::corrupt_frame"]);
    let p = pki();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let recv_root = dst.path().join("received");
    let rt = rt();
    let intake = start_intake(&rt, &p, dst.path());
    let t = tablet(0);
    let mut w = source(src.path(), &t, 64 << 10);
    write_records(&mut w, 0, 300, 100);
    let shipper = Shipper::start(
        shipper_opts(src.path(), intake.local_addr().unwrap()),
        client_tls(&p),
    )
    .unwrap();
    let end1 = w.written_pos();
    wait_for("the first records acked", WAIT, || {
        acked(&shipper, &t) == end1.0
    });
    let before = shipper.status()[&t].clone();
    assert_eq!(before.records_shipped, 300, "{before:?}");
    assert!(intake.tablet(&t).unwrap().status().error.is_none());

    // The next frame sent (the first one of the records below) has a flipped payload byte.
    fail::cfg("shipper::corrupt_frame", "1*return").unwrap();
    write_records(&mut w, 300, 600, 100);
    let end = w.written_pos();
    let ti = intake.tablet(&t).unwrap();
    // The refusal is counted; its error clears as soon as the resend is taken, so the
    // counter (not the transient error) is what the test waits on.
    wait_for("the intake to refuse the corrupt frame", WAIT, || {
        ti.frame_errors().1 >= 1
    });
    if let Some(err) = ti.status().error {
        assert!(
            err.contains("corrupt frame") && err.contains("checksum") && err.contains("tablet-0"),
            "intake error: {err}"
        );
    }
    // Right after the refusal the received log is still a prefix of the source.
    let want = read_all(src.path(), &t);
    assert_prefix(&want, &read_all(&recv_root, &t), "after the refusal");

    wait_for("everything received", WAIT, || ti.received_pos() >= end);
    wait_for("everything acked", WAIT, || acked(&shipper, &t) == end.0);
    let got = read_all(&recv_root, &t);
    assert_eq!(got.len(), 900);
    assert!(got == want, "the received log differs from the source");
    assert_eq!(ti.received_pos(), end);
    // Every record was written exactly once (a refused frame adds nothing).
    assert_eq!(ti.status().records, 900, "{:?}", ti.status());
    // Exactly the one corrupted frame was refused, for its checksum.
    assert_eq!(ti.frame_errors(), (1, 1));
    let st = shipper.status()[&t].clone();
    // The corrupt frame (and whatever followed it on the dead stream) went out twice.
    assert!(st.records_shipped > 900, "no resend: {st:?}");
    assert!(st.frames > before.frames + 1, "{st:?}");
    assert_eq!(st.records_acked, 900, "{st:?}");
    assert!(
        fail::list()
            .iter()
            .any(|(n, _)| n == "shipper::corrupt_frame"),
        "failpoint not registered"
    );
    shipper.shutdown();
    wait_for("the acked file", WAIT, || {
        acked_file(src.path(), &t) == end.0
    });
    rt.block_on(intake.shutdown());
}

// ---------------------------------------------------------------------------------------
// 2. A failing disk write on the applier stops that tablet's intake and is never acked.
// ---------------------------------------------------------------------------------------

/// With `failpoint` set to `action`, tablet 0 gets new records while tablet 1 is idle; the
/// failure hits tablet 0 only. Checks throughout that nothing beyond what the received log
/// recovers was ever acked (to the shipper or in the source's `acked` file), that tablet 0
/// stays `failed`, and that tablet 1 keeps flowing.
fn a_failed_disk_write_is_never_acked(failpoint: &'static str, action: &str) {
    let _s = serial(&[failpoint]);
    let p = pki();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let recv_root = dst.path().join("received");
    let rt = rt();
    let intake = start_intake(&rt, &p, dst.path());
    let (t0, t1) = (tablet(0), tablet(1));
    let mut w0 = source(src.path(), &t0, 64 << 10);
    let mut w1 = source(src.path(), &t1, 64 << 10);
    write_records(&mut w0, 0, 200, 100);
    write_records(&mut w1, 0, 200, 100);
    let shipper = Shipper::start(
        shipper_opts(src.path(), intake.local_addr().unwrap()),
        client_tls(&p),
    )
    .unwrap();
    let (e0, e1) = (w0.written_pos(), w1.written_pos());
    wait_for("both tablets acked", WAIT, || {
        acked(&shipper, &t0) == e0.0 && acked(&shipper, &t1) == e1.0
    });
    let ti0 = intake.tablet(&t0).unwrap();
    let ti1 = intake.tablet(&t1).unwrap();
    assert_eq!(ti0.received_pos(), e0);

    // Watch the acks of tablet 0 from now on.
    let max_acked = AtomicU64::new(0);
    let max_file = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                max_acked.fetch_max(acked(&shipper, &t0), Ordering::SeqCst);
                max_file.fetch_max(acked_file(src.path(), &t0), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        // Stops the watcher also when an assertion below fails.
        let _stop = StopOnDrop(&stop);
        fail::cfg(failpoint, action).unwrap();
        write_records(&mut w0, 200, 400, 100);
        wait_for("tablet 0 intake failed", WAIT, || {
            ti0.state() == TabletState::Failed
        });
        let err = ti0.status().error.unwrap_or_default();
        assert!(err.contains(failpoint), "intake error: {err}");
        // More source records: none of them may get through either.
        write_records(&mut w0, 600, 100, 100);
        // The shipper learns of the failure and keeps retrying without success.
        wait_for("the shipper to report tablet 0's failure", WAIT, || {
            shipper.status()[&t0].error.is_some()
        });
        // Tablet 1 keeps flowing on the same connection.
        write_records(&mut w1, 200, 300, 100);
        let e1 = w1.written_pos();
        wait_for("tablet 1 acked to its source end", WAIT, || {
            ti1.received_pos() == e1 && acked(&shipper, &t1) == e1.0
        });
        // The shipper reopens tablet 0's stream: the intake must refuse it and stay failed
        // (a bug that revives the tablet shows as a state other than `failed` here).
        wait_for("tablet 0's stream reopened and refused", WAIT, || {
            ti0.state() != TabletState::Failed
                || shipper.status()[&t0]
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains("refused the stream") && e.contains("io"))
        });
        assert_eq!(
            ti0.state(),
            TabletState::Failed,
            "a reopened stream revived a failed tablet: {:?}",
            ti0.status()
        );
        assert_eq!(ti1.state(), TabletState::Streaming);
    });
    let st0 = shipper.status()[&t0].clone();
    assert!(st0.state != "streaming" && st0.state != "idle", "{st0:?}");
    shipper.shutdown();
    let file0 = acked_file(src.path(), &t0);
    rt.block_on(intake.shutdown());

    // What the received log of tablet 0 recovers after the failure.
    let recovered = Writer::open(&recv_root, &t0, WalOptions::default())
        .unwrap()
        .written_pos();
    let (ma, mf) = (
        max_acked.load(Ordering::SeqCst),
        max_file.load(Ordering::SeqCst),
    );
    assert!(
        recovered < w0.written_pos(),
        "{failpoint} did not stop tablet 0"
    );
    assert!(
        ma <= recovered.0,
        "acked {ma} to the shipper but only {recovered} is durable"
    );
    assert!(
        mf <= recovered.0 && file0 <= recovered.0,
        "the source's acked file says {} but only {recovered} is durable",
        mf.max(file0)
    );
    assert!(
        ma >= e0.0 && file0 >= e0.0,
        "lost earlier acks: {ma} {file0}"
    );
    assert_prefix(
        &read_all(src.path(), &t0),
        &read_all(&recv_root, &t0),
        "tablet 0",
    );
    assert!(read_all(&recv_root, &t1) == read_all(src.path(), &t1));
}

struct StopOnDrop<'a>(&'a AtomicBool);
impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_failed_sync_on_the_applier_is_never_acked() {
    // The sync fails after 300 ms, as on a slow failing disk: an ack sent before the sync
    // completes would show within that time.
    a_failed_disk_write_is_never_acked("intake::sync", "1*return(300)");
}

#[test]
fn a_failed_append_on_the_applier_is_never_acked() {
    // The third frame's append fails; frames before it may be durable (and acked).
    a_failed_disk_write_is_never_acked("intake::append", "2*off->1*return");
}

// ---------------------------------------------------------------------------------------
// 3. Hostile frames sent straight to the intake over a valid mTLS connection.
// ---------------------------------------------------------------------------------------

/// Reads one message; bounded.
async fn read_one(recv: &mut quinn::RecvStream) -> Message {
    let fut = async {
        let mut head = [0u8; MSG_HEADER_LEN];
        recv.read_exact(&mut head).await.unwrap();
        let (_, len, _) = wire::decode_header(&head).unwrap();
        let mut all = head.to_vec();
        all.resize(MSG_HEADER_LEN + len, 0);
        recv.read_exact(&mut all[MSG_HEADER_LEN..]).await.unwrap();
        let (m, used) = wire::decode(&all).unwrap();
        assert_eq!(used, all.len());
        m
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .expect("timed out waiting for the intake's reply")
}

/// Opens a tablet stream; returns it with the resume position.
async fn open_stream(
    conn: &quinn::Connection,
    t: &TabletId,
) -> (quinn::SendStream, quinn::RecvStream, WalPos) {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&wire::encode_open(&wire::Open {
        tablet: t.clone(),
        from: WalPos::ZERO,
    }))
    .await
    .unwrap();
    match read_one(&mut recv).await {
        Message::Ack { durable, .. } => (send, recv, durable),
        other => panic!("expected the resume Ack, got {other:?}"),
    }
}

/// A whole data frame (head and payload).
fn frame(t: &TabletId, first: WalPos, ht: u64, count: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = wire::encode_data_head(t, first, HybridTime(ht), count, payload).to_vec();
    f.extend_from_slice(payload);
    f
}

/// The source log of one tablet as raw bytes with its record boundaries.
struct Raw {
    bytes: Vec<u8>,
    /// Record start positions, then the end.
    bounds: Vec<WalPos>,
    hts: Vec<u64>,
}

impl Raw {
    fn slice(&self, i: usize, n: usize) -> &[u8] {
        &self.bytes[self.bounds[i].0 as usize..self.bounds[i + n].0 as usize]
    }
    fn frame(&self, t: &TabletId, i: usize, n: usize) -> Vec<u8> {
        frame(
            t,
            self.bounds[i],
            self.hts[i + n - 1],
            n as u32,
            self.slice(i, n),
        )
    }
}

fn raw_source(dir: &Path, t: &TabletId, n: u64) -> Raw {
    let mut w = source(dir, t, 1 << 20);
    write_records(&mut w, 0, n, 60);
    let end = w.written_pos();
    drop(w);
    let recs = read_all(dir, t);
    let segs = tidelog_wal::reader::list_segments(&dir.join(t.as_str())).unwrap();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].0, WalPos::ZERO);
    let file = std::fs::read(&segs[0].1).unwrap();
    let h = tidelog_wal::format::SEGMENT_HEADER_LEN;
    let bytes = file[h..h + end.0 as usize].to_vec();
    let mut bounds: Vec<WalPos> = recs.iter().map(|(p, _)| *p).collect();
    bounds.push(end);
    let hts = recs.iter().map(|(_, r)| r.ht.0).collect();
    Raw { bytes, bounds, hts }
}

#[test]
fn hostile_frames_are_refused_with_nothing_written_and_the_intake_stays_healthy() {
    let _s = serial(&[]);
    let p = pki();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let recv_root = dst.path().join("received");
    let rt = rt();
    let intake = start_intake(&rt, &p, dst.path());
    let addr = intake.local_addr().unwrap();
    let t = tablet(0);
    let raw = raw_source(src.path(), &t, 120);
    let source_recs = read_all(src.path(), &t);

    type Mutate = Box<dyn Fn(&Raw, &TabletId, usize) -> (Vec<u8>, &'static [&'static str])>;
    let flip = |mut f: Vec<u8>, at: usize| {
        f[at] ^= 0x20;
        f
    };
    let cases: Vec<(&str, Mutate)> = vec![
        (
            "bad magic",
            Box::new(move |r, t, i| (flip(r.frame(t, i, 3), 0), &["corrupt_frame"])),
        ),
        (
            "bad header checksum",
            Box::new(move |r, t, i| (flip(r.frame(t, i, 3), 30), &["corrupt_frame"])),
        ),
        (
            "bad header field (body length) under a stale header checksum",
            Box::new(move |r, t, i| (flip(r.frame(t, i, 3), 8), &["corrupt_frame"])),
        ),
        (
            "bad body checksum (payload byte flipped)",
            Box::new(move |r, t, i| {
                let f = r.frame(t, i, 3);
                let n = f.len();
                (flip(f, n - 5), &["corrupt_frame"])
            }),
        ),
        (
            "record with a bad checksum (frame checksums valid)",
            Box::new(move |r, t, i| {
                let mut payload = r.slice(i, 3).to_vec();
                let last = payload.len() - 3;
                payload[last] ^= 0x01;
                (
                    frame(t, r.bounds[i], r.hts[i + 2], 3, &payload),
                    &["corrupt_frame"],
                )
            }),
        ),
        (
            "record header with a wrong position (frame checksums valid)",
            Box::new(move |r, t, i| {
                // Record i+1 (its header names its own position) announced at record i's.
                (
                    frame(t, r.bounds[i], r.hts[i + 1], 1, r.slice(i + 1, 1)),
                    &["corrupt_frame", "bad_position"],
                )
            }),
        ),
        (
            "truncated record (frame checksums valid)",
            Box::new(move |r, t, i| {
                let payload = r.slice(i, 3);
                let cut = &payload[..payload.len() - 7];
                (
                    frame(t, r.bounds[i], r.hts[i + 2], 3, cut),
                    &["corrupt_frame"],
                )
            }),
        ),
        (
            "truncated body (stream ends inside the frame)",
            Box::new(move |r, t, i| {
                let f = r.frame(t, i, 3);
                let n = f.len();
                (f[..n - 10].to_vec(), &["corrupt_frame"])
            }),
        ),
        (
            "frame at a later position",
            Box::new(move |r, t, i| (r.frame(t, i + 1, 2), &["bad_position"])),
        ),
        (
            "frame of another tablet",
            Box::new(move |r, _t, i| (r.frame(&tablet(7), i, 2), &["bad_position"])),
        ),
        (
            "random bytes",
            Box::new(move |_r, _t, i| {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ i as u64;
                let b = (0..200)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                (b, &["corrupt_frame"])
            }),
        ),
        (
            "a Hello on a tablet stream",
            Box::new(move |_r, t, _i| {
                (
                    wire::encode_hello(&wire::Hello {
                        shipper_id: "raw".into(),
                        lane: 0,
                        tablets: vec![wire::HelloTablet {
                            tablet: t.clone(),
                            oldest: WalPos::ZERO,
                            durable: WalPos::ZERO,
                        }],
                        all_tablets: Vec::new(),
                    }),
                    &["protocol"],
                )
            }),
        ),
    ];

    rt.block_on(async {
        let cc =
            tidelog_net::tls::client_config(&client_tls(&p), &tidelog_net::QuicTuning::default())
                .unwrap();
        let ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let conn = tokio::time::timeout(WAIT, ep.connect_with(cc, addr, "localhost").unwrap())
            .await
            .unwrap()
            .unwrap();
        // Control stream: Hello → Welcome.
        let (mut csend, mut crecv) = conn.open_bi().await.unwrap();
        csend
            .write_all(&wire::encode_hello(&wire::Hello {
                shipper_id: "raw-client".into(),
                lane: 0,
                tablets: vec![wire::HelloTablet {
                    tablet: t.clone(),
                    oldest: WalPos::ZERO,
                    durable: raw.bounds[raw.bounds.len() - 1],
                }],
                all_tablets: Vec::new(),
            }))
            .await
            .unwrap();
        match read_one(&mut crecv).await {
            Message::Welcome(w) => {
                assert_eq!(w.tablets.len(), 1);
                assert_eq!(w.tablets[0].resume, Some(WalPos::ZERO), "{w:?}");
            }
            other => panic!("expected Welcome, got {other:?}"),
        }
        let ti = intake.tablet(&t).unwrap();

        // A stream that does not start with Open.
        {
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            send.write_all(&raw.frame(&t, 0, 2)).await.unwrap();
            let _ = send.finish();
            match read_one(&mut recv).await {
                Message::Error(e) => assert_eq!(e.code, "protocol", "{e:?}"),
                other => panic!("Data before Open: expected an Error, got {other:?}"),
            }
            assert_eq!(ti.received_pos(), WalPos::ZERO);
        }

        let mut next = 0usize; // records received so far
        for (name, make) in &cases {
            // The hostile frame on a fresh stream.
            let (mut send, mut recv, resume) = open_stream(&conn, &t).await;
            assert_eq!(resume, raw.bounds[next], "{name}: resume");
            let (bytes, codes) = make(&raw, &t, next);
            send.write_all(&bytes).await.unwrap();
            let _ = send.finish();
            let err = loop {
                match read_one(&mut recv).await {
                    Message::Error(e) => break e,
                    Message::Ack { durable, .. } => {
                        assert_eq!(durable, resume, "{name}: acked something new")
                    }
                    other => panic!("{name}: expected an Error, got {other:?}"),
                }
            };
            assert!(
                codes.contains(&err.code.as_str()),
                "{name}: code {} ({}), expected one of {codes:?}",
                err.code,
                err.message
            );
            drop((send, recv));
            // Nothing of it written.
            assert_eq!(ti.received_pos(), resume, "{name}: received_pos moved");
            let got = read_all(&recv_root, &t);
            assert_eq!(got.len(), next, "{name}: records written");
            assert_prefix(&source_recs, &got, name);

            // A valid stream right after works and is acked once durable.
            let (mut send, mut recv, resume) = open_stream(&conn, &t).await;
            assert_eq!(resume, raw.bounds[next], "{name}: resume after the refusal");
            send.write_all(&raw.frame(&t, next, 3)).await.unwrap();
            next += 3;
            let want = raw.bounds[next];
            loop {
                match read_one(&mut recv).await {
                    Message::Ack { durable, .. } if durable == want => break,
                    Message::Ack { durable, .. } => {
                        assert!(durable < want, "{name}: acked {durable} beyond {want}")
                    }
                    other => panic!("{name}: valid frame after the refusal got {other:?}"),
                }
            }
            let _ = send.finish();
            drop((send, recv));
            assert_eq!(ti.received_pos(), want);
            assert_ne!(ti.state(), TabletState::Failed, "{name}");
        }
        conn.close(quinn::VarInt::from_u32(0), b"done");
        ep.close(quinn::VarInt::from_u32(0), b"done");
        let _ = tokio::time::timeout(Duration::from_secs(3), ep.wait_idle()).await;
    });
    let got = read_all(&recv_root, &t);
    assert_eq!(got.len(), 3 * cases.len());
    assert_prefix(&source_recs, &got, "at the end");
    rt.block_on(intake.shutdown());
}
