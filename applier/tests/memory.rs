//! The store's memory bounds (`STORE.md`, "Memory"): the memtables of all keyspaces stay
//! within `write-buffer-size` under a steady stream of commits.
#![allow(clippy::unwrap_used)]

use tidelog_applier::store::{Durability, Store, StoreOptions, MIN_WRITE_BUFFER_SIZE};
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{Body, Gtid, HybridTime, Op, Record, TabletId, TrxId, WalPos};

/// Commits that touch every keyspace a steady load writes (`mvcc`, `binlog`, `trx`, `gtid`,
/// `meta`): 100 000 of them, ~45 MiB of memtable data as fjall counts it (ten times the
/// bound), in batches of 500.
#[test]
fn memtables_stay_within_the_write_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let limit = MIN_WRITE_BUFFER_SIZE;
    let s = Store::open_with(
        dir.path(),
        &StoreOptions {
            cache_size: 8 << 20,
            write_buffer_size: limit,
        },
    )
    .unwrap();
    let tablet: TabletId = "m".parse().unwrap();
    let (mut pos, mut ht, mut seq) = (WalPos(0), 1u64, 0u64);
    let (mut max_buffer, mut max_memtables) = (0u64, 0u64);
    for _ in 0..200 {
        let mut batch = Vec::with_capacity(500);
        for _ in 0..500 {
            seq += 1;
            ht += 1;
            let r = Record::new(
                HybridTime(ht),
                Body::Write {
                    ops: vec![Op {
                        key: format!("account/{:06}", seq % 50_000).into_bytes(),
                        value: Some(vec![b'v'; 100]),
                    }],
                    trx_id: Some(TrxId::new(7, seq)),
                    gtid: Some(Gtid::new(0, 1, seq)),
                },
            );
            let len = (RECORD_HEADER_LEN + r.encoded_body_len().unwrap()) as u64;
            batch.push((pos, r));
            pos = pos.add(len);
        }
        s.apply(&tablet, &batch, pos, Durability::Buffered).unwrap();
        let m = s.memory();
        max_buffer = max_buffer.max(m.write_buffer);
        max_memtables = max_memtables.max(m.keyspaces.iter().map(|k| k.memtables).sum());
    }
    let m = s.memory();
    // A batch may land on top of the bound before the next one waits for the flushes.
    let one_batch = 512 << 10;
    assert!(
        max_buffer <= limit + one_batch,
        "memtables not flushed held {max_buffer} bytes; write-buffer-size {limit}"
    );
    // Flushed memtables still referenced by an older version (until fjall's next version
    // clean-up) add to it; how much depends on when the clean-up runs, so the test holds
    // them to the documented bound's share (2.5 × write-buffer-size, `STORE.md`, "Memory"):
    // without the bound they reach ten times it here.
    assert!(
        max_memtables <= 2 * limit + limit / 2,
        "memtables held {max_memtables} bytes, counting flushed ones; write-buffer-size {limit}"
    );
    assert!(
        m.write_buffer_stats.seals >= 5,
        "{:?}",
        m.write_buffer_stats
    );
    // Nothing was lost on the way: the last version of a key is readable.
    let v = s
        .get(format!("account/{:06}", seq % 50_000).as_bytes(), None)
        .unwrap()
        .unwrap();
    assert_eq!(v.ht, HybridTime(ht));
}
