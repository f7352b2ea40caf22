//! The running safe-time machinery against a real store: published only once the store is
//! durable, monotone, persisted across a restart, and a waiter that blocks until safe time
//! reaches T or a deadline passes.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tidelog_applier::consistency::Consistency;
use tidelog_applier::store::{Durability, Store};
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{Body, HybridTime, Record, TabletId, WalPos};

fn t(s: &str) -> TabletId {
    s.parse().unwrap()
}

/// Applies heartbeats at `hts` to tablet `tab` from `from`; returns the outcome and the end.
fn heartbeats(
    store: &Store,
    tab: &TabletId,
    from: WalPos,
    hts: &[u64],
) -> (tidelog_applier::store::ApplyOutcome, WalPos) {
    let mut pos = from;
    let mut recs = Vec::new();
    for h in hts {
        let r = Record::new(HybridTime(*h), Body::Heartbeat);
        let len = (RECORD_HEADER_LEN + r.encoded_body_len().unwrap()) as u64;
        recs.push((pos, r));
        pos = pos.add(len);
    }
    (
        store.apply(tab, &recs, pos, Durability::Buffered).unwrap(),
        pos,
    )
}

#[test]
fn published_waited_for_monotone_and_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let c = Consistency::start(store.clone(), vec![t("a"), t("b")]).unwrap();
    let noop = Arc::new(|| {});
    c.register_worker(&t("a"), HybridTime::MIN, noop.clone());
    c.register_worker(&t("b"), HybridTime::MIN, noop.clone());
    assert_eq!(c.safe_time(), None);
    let (out, a_end) = heartbeats(&store, &t("a"), WalPos::ZERO, &[100, 200]);
    c.after_batch(&t("a"), &out);
    // b has not reported: a waiter times out at its deadline.
    let start = Instant::now();
    assert!(!c.wait_for(HybridTime(1), Instant::now() + Duration::from_millis(200)));
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        c.report().uninitialized_reason.as_deref(),
        Some("tablet b has not reported yet")
    );
    // A waiter on another thread is woken when b reports.
    let c2 = c.clone();
    let waiter = std::thread::spawn(move || {
        c2.wait_for(HybridTime(150), Instant::now() + Duration::from_secs(20))
    });
    let (out, _) = heartbeats(&store, &t("b"), WalPos::ZERO, &[150, 160]);
    c.after_batch(&t("b"), &out);
    assert!(waiter.join().unwrap());
    assert_eq!(c.safe_time(), Some(HybridTime(160)));
    assert_eq!(c.report().laggiest, Some(t("b")));
    // a moves on; b holds it: still 160. Never lower.
    let (out, _) = heartbeats(&store, &t("a"), a_end, &[300]);
    c.after_batch(&t("a"), &out);
    assert!(!c.wait_for(HybridTime(161), Instant::now() + Duration::from_millis(100)));
    assert_eq!(c.safe_time(), Some(HybridTime(160)));
    c.stop();
    drop(c);
    // Restart: the persisted safe time is published at once.
    let c = Consistency::start(store.clone(), vec![t("a"), t("b")]).unwrap();
    assert_eq!(c.safe_time(), Some(HybridTime(160)));
    assert_eq!(store.global_safe_time().unwrap(), Some(HybridTime(160)));
    c.stop();
}

#[test]
fn waiters_hold_on_through_a_cutover_until_its_cut_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let c = Consistency::start(store.clone(), vec![t("a")]).unwrap();
    c.register_worker(&t("a"), HybridTime::MIN, Arc::new(|| {}));
    let (out, _) = heartbeats(&store, &t("a"), WalPos::ZERO, &[100]);
    c.after_batch(&t("a"), &out);
    assert!(c.wait_for(HybridTime(100), Instant::now() + Duration::from_secs(20)));
    // A waiter for a safe time that will not come, with a long deadline; it reports the cut
    // it sees when it returns.
    let (tx, rx) = std::sync::mpsc::channel();
    let c2 = c.clone();
    std::thread::spawn(move || {
        let reached = c2.wait_for(HybridTime(500), Instant::now() + Duration::from_secs(20));
        let _ = tx.send((reached, c2.cut()));
    });
    c.begin_cutover();
    // The publisher has stopped, but the cut is not set: the waiter keeps waiting (it used
    // to give up here, and answered as a replica while the target was being promoted).
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a waiter gave up before the cut was set"
    );
    c.freeze(HybridTime(100));
    let (reached, cut) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(!reached);
    assert_eq!(cut, Some(HybridTime(100)));
    // A cutover that fails before its cut: waiters give up at once.
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let c = Consistency::start(store.clone(), vec![t("a")]).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let c2 = c.clone();
    c.begin_cutover();
    std::thread::spawn(move || {
        let _ = tx.send(c2.wait_for(HybridTime(500), Instant::now() + Duration::from_secs(20)));
    });
    c.cutover_failed();
    assert!(!rx.recv_timeout(Duration::from_secs(20)).unwrap());
}

/// `wait_until` holds no thread: 2 000 waiters park on a runtime with one thread, which
/// still runs other tasks; each is woken when the safe time reaches its target (not
/// before), the rest give up at their deadline or when the publisher stops, and none stays
/// registered.
#[test]
fn async_waiters_hold_no_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let c = Consistency::start(store.clone(), vec![t("a")]).unwrap();
    c.register_worker(&t("a"), HybridTime::MIN, Arc::new(|| {}));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let far = Instant::now() + Duration::from_secs(60);
        // Targets 1..=1000 are reached below; 1001..=2000 are not.
        let tasks: Vec<_> = (1..=2000u64)
            .map(|target| {
                let c = c.clone();
                tokio::spawn(async move { (target, c.wait_until(HybridTime(target), far).await) })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.waiters() < 2000 {
            assert!(Instant::now() < deadline, "{} parked", c.waiters());
            tokio::task::yield_now().await;
        }
        // The one thread is free: another task runs.
        assert_eq!(tokio::spawn(async { 7 }).await.unwrap(), 7);
        let (out, _) = heartbeats(&store, &t("a"), WalPos::ZERO, &[1000]);
        c.after_batch(&t("a"), &out);
        let mut tasks = tasks.into_iter();
        for h in tasks.by_ref().take(1000) {
            let (target, reached) = h.await.unwrap();
            assert!(reached, "target {target}");
        }
        assert_eq!(c.waiters(), 1000);
        // A short deadline gives up on time, and deregisters.
        let t0 = Instant::now();
        assert!(
            !c.wait_until(HybridTime(5000), Instant::now() + Duration::from_millis(50))
                .await
        );
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert_eq!(c.waiters(), 1000);
        // A stop wakes the rest: they did not reach their targets.
        let c2 = c.clone();
        tokio::task::spawn_blocking(move || c2.stop())
            .await
            .unwrap();
        for h in tasks {
            let (target, reached) = h.await.unwrap();
            assert!(!reached, "target {target}");
        }
        assert_eq!(c.waiters(), 0);
    });
}
