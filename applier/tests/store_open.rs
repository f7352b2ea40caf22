//! Opening a damaged store fails with an error that names the store's directory, the
//! files concerned and what fjall found.
#![allow(clippy::unwrap_used)]

use tidelog_applier::error::Error;
use tidelog_applier::store::{Durability, Store};
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{Body, HybridTime, Op, Record, TabletId, WalPos};

/// Writes `k0`..`k{n-1}` on tablet `t1`, one record each, every value `len` bytes of `x`.
fn write_keys(s: &Store, n: u64, len: usize) {
    let t: TabletId = "t1".parse().unwrap();
    let mut pos = WalPos(0);
    for i in 0..n {
        let r = Record::new(
            HybridTime(100 + i),
            Body::Write {
                ops: vec![Op::put(format!("k{i}"), vec![b'x'; len])],
                trx_id: None,
                gtid: None,
            },
        );
        let end = pos.add((RECORD_HEADER_LEN + r.encoded_body_len().unwrap()) as u64);
        s.apply(&t, &[(pos, r)], end, Durability::Buffered).unwrap();
        pos = end;
    }
}

/// A byte flipped inside a write batch in fjall's journal: fjall says only
/// `JournalRecovery(ChecksumMismatch)`; the error names the store, the journal file and the
/// reason in words.
#[test]
fn a_damaged_journal_is_named_with_the_store_and_its_files() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open(dir.path()).unwrap();
        write_keys(&s, 20, 1000);
        s.persist().unwrap();
    }
    let store = dir.path().join("store");
    let journal = store.join("0.jnl");
    let mut bytes = std::fs::read(&journal).unwrap();
    // Inside a value (a run of `x`), so the batch's length fields stay intact.
    let at = bytes
        .windows(100)
        .position(|w| w.iter().all(|&b| b == b'x'))
        .unwrap()
        + 50;
    bytes[at] ^= 0x55;
    std::fs::write(&journal, &bytes).unwrap();
    let e = Store::open(dir.path()).err().unwrap();
    let msg = e.to_string();
    assert!(
        matches!(&e, Error::Open { path, .. } if *path == store),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("opening the store at {}", store.display()))
            && msg.contains("journal does not recover")
            && msg.contains("checksum does not match")
            && msg.contains(&journal.display().to_string())
            && msg.contains("ChecksumMismatch"),
        "{msg}"
    );
}

/// Memtables that journal recovery refilled are flushed at once when large: the next
/// opening does not replay the same journal again. Without it an applier restarted over
/// and over under load replayed ever more of its journal at each start.
#[test]
fn a_large_recovered_journal_is_flushed_so_the_next_open_does_not_replay_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open(dir.path()).unwrap();
        write_keys(&s, 1200, 10_000);
        s.persist().unwrap();
        assert!(s.memory().write_buffer > 10 << 20, "{:?}", s.memory());
    }
    {
        // Recovers about 12 MiB from the journal, and flushes it.
        let s = Store::open(dir.path()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while s.memory().write_buffer > 1 << 20 || !s.background_idle() {
            assert!(
                std::time::Instant::now() < deadline,
                "the recovered memtables were not flushed: {:?}",
                s.memory()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let s = Store::open(dir.path()).unwrap();
    let m = s.memory();
    assert!(
        m.write_buffer < 1 << 20,
        "the third opening replayed the journal again: {} bytes in memtables",
        m.write_buffer
    );
    let v = s.get(b"k1199", None).unwrap().unwrap();
    assert_eq!(v.value.as_deref().map(<[u8]>::len), Some(10_000));
}
