//! A received log that lost its tail (a segment truncated behind the applier's back, cut at
//! its last valid record when the log is opened again) ends below the apply position: the
//! apply stage waits until the intake has received it again and goes on from the apply
//! position — nothing skipped, nothing applied twice — instead of stopping for good.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tidelog_applier::apply::{ApplyConfig, ApplyWorker};
use tidelog_applier::consistency::Consistency;
use tidelog_applier::store::Store;
use tidelog_wal::{
    Body, HybridTime, Op, ReadLimit, Reader, Record, SyncPolicy, TabletId, WalOptions, WalPos,
    Writer,
};

fn t() -> TabletId {
    "t1".parse().unwrap()
}

fn record(i: u64) -> Record {
    Record::new(
        HybridTime(1_000 + i),
        Body::Write {
            ops: vec![Op::put(format!("k{i:04}"), format!("v{i}").into_bytes())],
            trx_id: None,
            gtid: None,
        },
    )
}

/// The encoded bytes of records `[from, to)` of the log under `root`, and the position
/// after them.
fn raw(root: &std::path::Path, from: WalPos, to: WalPos) -> Vec<u8> {
    let mut r = Reader::open(root, &t(), ReadLimit::Durable).unwrap();
    r.seek(from).unwrap();
    let mut out = Vec::new();
    while Reader::position(&r) < to {
        let (pos, rec) = r.next().unwrap().unwrap();
        out.extend_from_slice(&rec.encode(pos).unwrap());
    }
    out
}

/// Whether the worker is still running 300 ms on (a negative check: a worker that stops on
/// the short log stops at its first look).
fn stays_running(w: &ApplyWorker) -> bool {
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        if !w.is_running() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    w.is_running()
}

#[test]
fn a_received_log_that_lost_its_tail_is_applied_on_once_it_is_received_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("received");
    let opts = WalOptions {
        segment_size: 64 << 10,
        ..WalOptions::default()
    };
    // 300 records over several segments, all applied.
    let n = 300u64;
    let mut w = Writer::open(&root, &t(), opts.clone()).unwrap();
    for i in 0..n {
        w.append(&record(i)).unwrap();
    }
    let end = w.commit(SyncPolicy::Always).unwrap();
    drop(w);
    let store = Arc::new(Store::open(&dir.path().join("data")).unwrap());
    let cfg = || ApplyConfig {
        consistency: None,
        batch_records: 50,
        ..ApplyConfig::default()
    };
    let mut worker = ApplyWorker::start(store.clone(), &root, t(), cfg()).unwrap();
    worker.notify();
    assert!(worker.wait_applied(end, Duration::from_secs(30)));
    worker.stop().unwrap();
    let lost = raw(&root, WalPos::ZERO, end);

    // The last segment loses its second half (the applier was down).
    let segs = tidelog_wal::reader::list_segments(&root.join("t1")).unwrap();
    let (last_first, last_path) = segs.last().unwrap().clone();
    let written = end.since(last_first);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&last_path)
        .unwrap();
    f.set_len(tidelog_wal::format::SEGMENT_HEADER_LEN as u64 + written / 2)
        .unwrap();
    drop(f);
    // The intake opens it again: cut at the last valid record, below the apply position.
    let mut w = Writer::open(&root, &t(), opts).unwrap();
    let cut = w.written_pos();
    assert!(cut < end && cut >= last_first, "cut at {cut}, end {end}");

    // The apply stage starts (a restarted applier) and waits, not failed.
    let consistency = Consistency::start(store.clone(), vec![t()]).unwrap();
    let mut worker = ApplyWorker::start(
        store.clone(),
        &root,
        t(),
        ApplyConfig {
            consistency: Some(consistency.clone()),
            ..cfg()
        },
    )
    .unwrap();
    worker.notify();
    assert!(stays_running(&worker), "{:?}", worker.fault());
    assert!(worker.fault().is_none(), "{:?}", worker.fault());
    assert_eq!(worker.applied_pos(), end);

    // The shipper sends the lost part again, then new records.
    let resent = &lost[cut.0 as usize..];
    let half = resent.len() / 2;
    let cut_rec = {
        // A record boundary in the middle of what is resent.
        let mut off = 0usize;
        let mut boundary = 0usize;
        while off < half {
            let len = u32::from_le_bytes(resent[off + 8..off + 12].try_into().unwrap()) as usize
                + tidelog_wal::format::RECORD_HEADER_LEN;
            off += len;
            boundary = off;
        }
        boundary
    };
    w.append_encoded(&resent[..cut_rec]).unwrap();
    w.commit(SyncPolicy::Always).unwrap();
    worker.notify();
    assert!(stays_running(&worker), "{:?}", worker.fault());
    assert!(worker.fault().is_none(), "{:?}", worker.fault());
    assert_eq!(
        worker.applied_pos(),
        end,
        "nothing applied below the apply position"
    );
    w.append_encoded(&resent[cut_rec..]).unwrap();
    assert_eq!(w.commit(SyncPolicy::Always).unwrap(), end);
    for i in n..n + 20 {
        w.append(&record(i)).unwrap();
    }
    let new_end = w.commit(SyncPolicy::Always).unwrap();
    worker.notify();
    assert!(
        worker.wait_applied(new_end, Duration::from_secs(30)),
        "stuck at {} of {new_end}: {:?}",
        worker.applied_pos(),
        worker.fault()
    );
    assert!(consistency.wait_for(
        HybridTime(1_000 + n + 19),
        Instant::now() + Duration::from_secs(10)
    ));
    worker.stop().unwrap();
    consistency.stop();
    // Every record exactly once.
    let m = store.tablet(&t()).unwrap().unwrap();
    assert_eq!(m.applied_records, n + 20);
    let (items, more) = store.scan(b"k", None, 1000).unwrap();
    assert!(!more);
    assert_eq!(items.len() as u64, n + 20);
    for (i, (k, v, ht)) in items.iter().enumerate() {
        assert_eq!(k, format!("k{i:04}").as_bytes());
        assert_eq!(v, format!("v{i}").as_bytes());
        assert_eq!(*ht, HybridTime(1_000 + i as u64));
    }
}
