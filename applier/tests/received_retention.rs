//! Received-log retention with real apply workers and the safe-time machinery: the release
//! stops at the first intent of a transaction still waiting for its commit — also after a
//! restart, when the transaction is no longer in the store's cache — moves past it once the
//! transaction is applied or aborted, never moves back, and the log's writer then deletes
//! the released segments while everything stays readable.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tidelog_applier::apply::{ApplyConfig, ApplyWorker};
use tidelog_applier::consistency::Consistency;
use tidelog_applier::retention::Releaser;
use tidelog_applier::store::Store;
use tidelog_wal::retention::read_acked;
use tidelog_wal::*;

const DEADLINE: Duration = Duration::from_secs(60);

fn t(s: &str) -> TabletId {
    s.parse().unwrap()
}

fn writer(root: &Path, tab: &str) -> Writer {
    Writer::open(
        root,
        &t(tab),
        WalOptions {
            segment_size: 16 << 10,
            ..Default::default()
        },
    )
    .unwrap()
}

/// A fresh target directory and a writer for each of `tablets`' received logs in it.
fn source_logs<const N: usize>(tablets: [&str; N]) -> (tempfile::TempDir, [Writer; N]) {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let writers = tablets.map(|t| writer(&received, t));
    (dir, writers)
}

/// Appends and durably commits `recs`; returns each record's position.
fn append(w: &mut Writer, recs: Vec<Record>) -> Vec<WalPos> {
    let pos = recs.into_iter().map(|r| w.append(&r).unwrap()).collect();
    w.commit(SyncPolicy::Always).unwrap();
    pos
}

fn rec(ht: u64, body: Body) -> Record {
    Record::new(HybridTime(ht), body)
}

fn intent(ht: u64, txn: u128, key: &str, v: &str) -> Record {
    rec(
        ht,
        Body::Intent {
            txn: TxnId::from_u128(txn),
            trx_id: None,
            ops: vec![Op::put(key, v)],
        },
    )
}

fn write(ht: u64, key: &str, v: &str) -> Record {
    rec(
        ht,
        Body::Write {
            ops: vec![Op::put(key, v)],
            trx_id: None,
            gtid: None,
        },
    )
}

/// `txn`'s commit with `participants`, no trx id or gtid.
fn commit(ht: u64, txn: TxnId, participants: &[&str]) -> Record {
    rec(
        ht,
        Body::Commit {
            txn,
            participants: participants.iter().map(|p| t(p)).collect(),
            trx_id: None,
            gtid: None,
        },
    )
}

/// The applier side: store, safe-time machinery and one apply worker per tablet.
struct Target {
    store: Arc<Store>,
    consistency: Arc<Consistency>,
    workers: Vec<ApplyWorker>,
}

impl Target {
    fn start(dir: &Path, tablets: &[&str]) -> Target {
        let store = Arc::new(Store::open(dir).unwrap());
        let ts: Vec<TabletId> = tablets.iter().map(|s| t(s)).collect();
        let consistency = Consistency::start(store.clone(), ts.clone()).unwrap();
        let workers = ts
            .into_iter()
            .map(|tab| {
                let cfg = ApplyConfig {
                    poll_interval: Duration::from_millis(5),
                    consistency: Some(consistency.clone()),
                    ..Default::default()
                };
                ApplyWorker::start(store.clone(), &dir.join("received"), tab, cfg).unwrap()
            })
            .collect();
        Target {
            store,
            consistency,
            workers,
        }
    }

    fn wait_applied(&self, tab: &str, end: WalPos) {
        let w = self.workers.iter().find(|w| w.tablet() == &t(tab)).unwrap();
        assert!(w.wait_applied(end, DEADLINE), "{tab}: {:?}", w.error());
    }

    /// Waits until the safe time reaches `ht` (every transaction committed at or below it
    /// applied everywhere); fails naming the workers' errors.
    fn wait_safe_time(&self, ht: u64) {
        assert!(
            self.consistency
                .wait_for(HybridTime(ht), std::time::Instant::now() + DEADLINE),
            "safe time never reached {ht}: {:?}",
            self.workers.iter().map(|w| w.error()).collect::<Vec<_>>()
        );
    }

    fn stop(mut self) {
        for w in &mut self.workers {
            w.stop().unwrap();
        }
        self.consistency.stop();
    }
}

fn released(received: &Path, tab: &str) -> WalPos {
    read_acked(&received.join(tab))
        .unwrap()
        .unwrap_or(WalPos::ZERO)
}

#[test]
fn release_waits_for_undecided_intents_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let (mut wa, mut ws) = (writer(&received, "a"), writer(&received, "s"));
    // Tablet a: an intent of txn 1 (decided much later) and one of txn 2 (aborted soon),
    // then enough single-tablet writes for several segments.
    let p1 = append(&mut wa, vec![intent(10, 1, "t1", "one")])[0];
    append(&mut wa, vec![intent(11, 2, "t2", "two")]);
    let value = "x".repeat(500);
    for i in 0..100u64 {
        append(&mut wa, vec![write(20 + i, &format!("k{i}"), &value)]);
    }
    append(&mut ws, vec![rec(200, Body::Heartbeat)]);
    let target = Target::start(dir.path(), &["a", "s"]);
    target.wait_applied("a", wa.durable_pos());
    target.wait_applied("s", ws.durable_pos());

    // Txn 1 is undecided: nothing of it is stored (its intent is in the received log and
    // in memory); a's release stops at its intent; s has nothing to hold.
    assert_eq!(target.store.txn(&TxnId::from_u128(1)).unwrap(), None);
    let mut rel = Releaser::new(target.store.clone(), &received);
    rel.round().unwrap();
    assert_eq!(released(&received, "a"), p1);
    assert_eq!(released(&received, "s"), ws.durable_pos());

    // Txn 2 aborted: still held by txn 1 before it.
    append(
        &mut ws,
        vec![rec(
            201,
            Body::Abort {
                txn: TxnId::from_u128(2),
                trx_id: None,
            },
        )],
    );
    target.wait_applied("s", ws.durable_pos());
    rel.round().unwrap();
    assert_eq!(released(&received, "a"), p1);

    // Restart: opening the store finds txn 1 in the retained log again.
    drop(rel);
    target.stop();
    let target = Target::start(dir.path(), &["a", "s"]);
    assert_eq!(
        target.store.rebuilt().undecided,
        1,
        "{:?}",
        target.store.rebuilt()
    );
    target.wait_applied("a", wa.durable_pos());
    let mut rel = Releaser::new(target.store.clone(), &received);
    rel.round().unwrap();
    assert_eq!(
        released(&received, "a"),
        p1,
        "released past the intent of an undecided transaction after a restart"
    );

    // Txn 1 commits (decided on s), a passes its commit_ht: the part is applied, and the
    // release moves to a's apply position.
    append(
        &mut ws,
        vec![rec(
            300,
            Body::Commit {
                txn: TxnId::from_u128(1),
                participants: vec![t("a")],
                trx_id: None,
                gtid: None,
            },
        )],
    );
    append(&mut wa, vec![rec(301, Body::Heartbeat)]);
    let end_a = wa.durable_pos();
    target.wait_applied("a", end_a);
    // Safe time reaches 300 only once txn 1 is applied everywhere.
    assert!(target
        .consistency
        .wait_for(HybridTime(300), std::time::Instant::now() + DEADLINE));
    rel.round().unwrap();
    assert_eq!(released(&received, "a"), end_a);
    assert_eq!(
        target
            .store
            .get(b"t1", None)
            .unwrap()
            .unwrap()
            .value
            .as_deref(),
        Some(&b"one"[..])
    );
    assert_eq!(target.store.get(b"t2", None).unwrap(), None, "aborted");

    // The writer deletes the released segments when it next rotates; what is left reads.
    let before = tidelog_wal::reader::list_segments(&received.join("a"))
        .unwrap()
        .len();
    for i in 0..40u64 {
        append(&mut wa, vec![write(400 + i, &format!("m{i}"), &value)]);
    }
    let segs = tidelog_wal::reader::list_segments(&received.join("a")).unwrap();
    assert!(
        segs.len() < before && segs[0].0 > p1,
        "segments before {before}, after {segs:?}"
    );
    target.wait_applied("a", wa.durable_pos());
    let k99 = target.store.get(b"k99", None).unwrap().unwrap();
    assert_eq!(k99.value.as_deref(), Some(value.as_bytes()));
    // Never backwards: a new releaser (as after a restart) keeps the release.
    let mut rel = Releaser::new(target.store.clone(), &received);
    rel.round().unwrap();
    assert!(released(&received, "a") >= end_a);
    target.stop();
}

/// An intent of `txn` carrying trx id `trx`.
fn trx_intent(ht: u64, txn: u128, trx: TrxId, key: &str) -> Record {
    rec(
        ht,
        Body::Intent {
            txn: TxnId::from_u128(txn),
            trx_id: Some(trx),
            ops: vec![Op::put(key, "v")],
        },
    )
}

#[test]
fn undecided_trx_ids_are_restored_from_the_received_logs_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let (mut wa, mut ws) = (writer(&received, "a"), writer(&received, "s"));
    let (open, done, gone) = (TrxId::new(7, 1), TrxId::new(7, 2), TrxId::new(7, 3));
    // a: txn 1 stays undecided; txn 2 commits and txn 3 aborts on s.
    let p1 = append(&mut wa, vec![trx_intent(10, 1, open, "k1")])[0];
    append(
        &mut wa,
        vec![trx_intent(11, 2, done, "k2"), trx_intent(12, 3, gone, "k3")],
    );
    append(
        &mut ws,
        vec![
            rec(
                20,
                Body::Commit {
                    txn: TxnId::from_u128(2),
                    participants: vec![t("a")],
                    trx_id: Some(done),
                    gtid: None,
                },
            ),
            rec(
                21,
                Body::Abort {
                    txn: TxnId::from_u128(3),
                    trx_id: Some(gone),
                },
            ),
        ],
    );
    append(&mut wa, vec![rec(30, Body::Heartbeat)]);
    let target = Target::start(dir.path(), &["a", "s"]);
    target.wait_applied("a", wa.durable_pos());
    target.wait_applied("s", ws.durable_pos());
    let kind = |s: &Store, id| s.open_trx(id).unwrap().map(|o| (o.kind, o.txn));
    let pending1 = Some((
        tidelog_applier::binlog::OpenKind::Pending,
        TxnId::from_u128(1),
    ));
    let aborted3 = Some((
        tidelog_applier::binlog::OpenKind::Aborted,
        TxnId::from_u128(3),
    ));
    assert_eq!(kind(&target.store, open), pending1);
    assert_eq!(kind(&target.store, done), None);
    assert_eq!(kind(&target.store, gone), aborted3);
    // A release first, so that the restore reads from it: held at txn 1's intent.
    let mut rel = Releaser::new(target.store.clone(), &received);
    rel.round().unwrap();
    assert_eq!(released(&received, "a"), p1);
    drop(rel);
    target.stop();

    // After a restart the pending entry is back in memory, from the received log; the
    // aborted one is stored.
    let store = Arc::new(Store::open(dir.path()).unwrap());
    assert_eq!(store.rebuilt().restored, 1, "{:?}", store.rebuilt());
    // Txn 1 is in the cache again: the release stays at its intent.
    let mut rel = Releaser::new(store.clone(), &received);
    rel.round().unwrap();
    assert_eq!(released(&received, "a"), p1);
    assert_eq!(kind(&store, open), pending1);
    assert_eq!(kind(&store, done), None);
    assert_eq!(kind(&store, gone), aborted3);
}

/// A committed transaction with its part applied on one participant and not yet on another:
/// the first tablet's received log may be released (and deleted) past its intents. After a
/// restart the transaction is still pending; its part there must count as applied (it was,
/// and persisted, before the release), not be read again from a log that is gone.
#[test]
fn a_part_applied_before_a_restart_is_not_read_again_from_a_released_log() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let (mut wa, mut wb) = (writer(&received, "a"), writer(&received, "b"));
    let x = TxnId::from_u128(9);
    let target = Target::start(dir.path(), &["a", "b"]);
    append(&mut wb, vec![intent(10, 9, "kb", "vb")]);
    append(
        &mut wa,
        vec![intent(11, 9, "ka", "va"), commit(30, x, &["a", "b"])],
    );
    // a moves on (its part of x is applied once its safe time passes 30); b stays behind.
    let value = "x".repeat(500);
    for i in 0..100u64 {
        append(&mut wa, vec![write(40 + i, &format!("k{i}"), &value)]);
    }
    target.wait_applied("a", wa.durable_pos());
    target.wait_applied("b", wb.durable_pos());
    let mut rel = Releaser::new(target.store.clone(), &received);
    rel.round().unwrap();
    assert_eq!(
        released(&received, "a"),
        wa.durable_pos(),
        "a's part not applied"
    );
    // Rotations delete a's segments up to the release, x's intent among them.
    for i in 0..40u64 {
        append(&mut wa, vec![write(200 + i, &format!("m{i}"), &value)]);
    }
    let first = tidelog_wal::reader::list_segments(&received.join("a")).unwrap()[0].0;
    assert!(first > WalPos::ZERO, "nothing deleted: {first}");
    target.wait_applied("a", wa.durable_pos());
    drop(rel);
    target.stop();

    let target = Target::start(dir.path(), &["a", "b"]);
    append(&mut wb, vec![rec(300, Body::Heartbeat)]);
    append(&mut wa, vec![rec(300, Body::Heartbeat)]);
    target.wait_safe_time(30);
    let get = |k: &[u8]| target.store.get(k, None).unwrap().map(|v| v.value);
    assert_eq!(get(b"ka"), Some(Some(b"va".to_vec())));
    assert_eq!(get(b"kb"), Some(Some(b"vb".to_vec())));
    target.stop();
}

/// `txn`'s commit with `participants` under trx id `trx`.
fn trx_commit(ht: u64, txn: TxnId, participants: &[&str], trx: TrxId) -> Record {
    rec(
        ht,
        Body::Commit {
            txn,
            participants: participants.iter().map(|p| t(p)).collect(),
            trx_id: Some(trx),
            gtid: None,
        },
    )
}

/// A committed transaction whose intent on one participant is applied after its commit
/// (tablets apply independently), restarted before that participant's part is applied:
/// opening the store must find the commit again and the late intent in the received log,
/// or the part would be applied without it. With `trx` (carried by the intents and the
/// commit) nothing of the transaction is in `txns` and the commit comes from the binlog;
/// without, the `txns` record written at the commit holds it, without b's late intent.
fn a_late_intent_of_a_pending_transaction_is_rebuilt(trx: Option<TrxId>) {
    let (dir, [mut wa, mut wb, mut ws]) = source_logs(["a", "b", "s"]);
    let x = TxnId::from_u128(7);
    let intent = |ht, key| match trx {
        Some(id) => trx_intent(ht, 7, id, key),
        None => intent(ht, 7, key, "v"),
    };
    let target = Target::start(dir.path(), &["a", "b", "s"]);
    append(&mut wa, vec![intent(10, "ka")]);
    target.wait_applied("a", wa.durable_pos());
    let c = match trx {
        Some(id) => trx_commit(30, x, &["a", "b"], id),
        None => commit(30, x, &["a", "b"]),
    };
    append(&mut ws, vec![c]);
    target.wait_applied("s", ws.durable_pos());
    // b's intent (ht 20 < commit_ht 30) is applied only now, after the commit.
    append(&mut wb, vec![intent(20, "kb")]);
    target.wait_applied("b", wb.durable_pos());
    let stored = target.store.txn(&x).unwrap();
    match trx {
        Some(_) => assert_eq!(
            stored, None,
            "a commit the trx index leads back to was written to txns"
        ),
        None => {
            let rec_x = stored.unwrap();
            assert!(rec_x.commit.is_some());
            assert!(
                !rec_x.intents.contains_key(&t("b")),
                "b's late intent was written to the record: this test would not test the rebuild"
            );
        }
    }
    target.stop();

    let target = Target::start(dir.path(), &["a", "b", "s"]);
    let r = target.store.rebuilt();
    assert_eq!((r.pending, r.undecided), (1, 0), "{r:?}");
    // Every tablet passes the commit: both parts are applied at it, b's with its intent.
    for w in [&mut wa, &mut wb, &mut ws] {
        append(w, vec![rec(40, Body::Heartbeat)]);
    }
    target.wait_safe_time(30);
    let get = |k: &[u8]| target.store.get(k, None).unwrap().map(|v| (v.value, v.ht));
    let v = Some((Some(b"v".to_vec()), HybridTime(30)));
    assert_eq!(get(b"ka"), v);
    assert_eq!(get(b"kb"), v, "b's part lost its late intent");
    target.stop();
}

#[test]
fn a_late_intent_of_a_pending_transaction_is_rebuilt_from_the_received_log() {
    a_late_intent_of_a_pending_transaction_is_rebuilt(None);
}

#[test]
fn a_pending_commit_without_a_record_is_rebuilt_from_the_binlog() {
    a_late_intent_of_a_pending_transaction_is_rebuilt(Some(TrxId::new(5, 1)));
}

/// A transaction without a `txns` record, committed and applied everywhere below the
/// persisted safe time while its intents are still retained: after a restart it is neither
/// rebuilt as undecided (which would hold the release at its intent for ever) nor as
/// pending, and the release passes it.
#[test]
fn a_resolved_commit_without_a_record_is_not_rebuilt_as_undecided() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let (mut wa, mut ws) = (writer(&received, "a"), writer(&received, "s"));
    let (x, trx) = (TxnId::from_u128(8), TrxId::new(5, 2));
    let target = Target::start(dir.path(), &["a", "s"]);
    append(&mut wa, vec![trx_intent(10, 8, trx, "ka")]);
    append(&mut ws, vec![trx_commit(30, x, &["a"], trx)]);
    append(&mut wa, vec![rec(40, Body::Heartbeat)]);
    append(&mut ws, vec![rec(40, Body::Heartbeat)]);
    assert!(target
        .consistency
        .wait_for(HybridTime(40), std::time::Instant::now() + DEADLINE));
    assert_eq!(target.store.txn(&x).unwrap(), None);
    target.stop();

    let target = Target::start(dir.path(), &["a", "s"]);
    let r = target.store.rebuilt();
    assert!(
        r.records > 0,
        "nothing read back: the intent was not retained ({r:?})"
    );
    assert_eq!((r.undecided, r.pending), (0, 0), "{r:?}");
    let mut rel = Releaser::new(target.store.clone(), &received);
    rel.round().unwrap();
    assert_eq!(released(&received, "a"), wa.durable_pos());
    target.stop();
}

/// A transaction with one intent that carries no trx id cannot be found through the `trx`
/// index, so its commit must be recorded in `txns`. That fact lives in memory only, so it is
/// read back with the intents when the store reopens before the transaction commits.
#[test]
fn an_intent_without_a_trx_id_read_back_at_a_restart_gets_the_commit_recorded() {
    let (dir, [mut wa, mut wb, mut ws]) = source_logs(["a", "b", "s"]);
    let (x, trx) = (TxnId::from_u128(9), TrxId::new(5, 3));
    append(&mut wa, vec![intent(10, 9, "ka", "v")]);
    append(&mut wb, vec![trx_intent(11, 9, trx, "kb")]);
    let target = Target::start(dir.path(), &["a", "b", "s"]);
    target.wait_applied("a", wa.durable_pos());
    target.wait_applied("b", wb.durable_pos());
    target.stop();

    let target = Target::start(dir.path(), &["a", "b", "s"]);
    assert_eq!(
        target.store.rebuilt().undecided,
        1,
        "{:?}",
        target.store.rebuilt()
    );
    append(&mut ws, vec![trx_commit(30, x, &["a", "b"], trx)]);
    target.wait_applied("s", ws.durable_pos());
    let stored = target.store.txn(&x).unwrap();
    assert!(
        stored.is_some_and(|st| st.commit.is_some()),
        "the commit of a transaction with an intent the trx index cannot lead back to was not recorded"
    );
    target.stop();
}
