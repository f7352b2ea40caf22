//! Helpers shared by the integration tests: deterministic record generators, a pristine
//! multi-segment log image and its byte layout, and bounded reading.
#![allow(dead_code, clippy::unwrap_used)]

pub mod fuzzkit;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tidelog_wal::format::SEGMENT_HEADER_LEN;
use tidelog_wal::*;

pub mod tmpfs;

pub const HDR: u64 = SEGMENT_HEADER_LEN as u64;

/// A seed from `var` (decimal or 0x hex), else `default`.
pub fn seed_from_env(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(s) => {
            let s = s.trim();
            s.strip_prefix("0x")
                .map(|h| u64::from_str_radix(h, 16))
                .unwrap_or_else(|| s.parse())
                .unwrap_or_else(|e| panic!("{var}={s:?}: {e}"))
        }
        Err(_) => default,
    }
}

pub fn env_usize(var: &str) -> Option<usize> {
    std::env::var(var).ok().map(|s| {
        s.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{var}={s:?}: {e}"))
    })
}

/// Per-case RNG: independent of how many cases ran before.
pub fn case_rng(seed: u64, case: usize) -> StdRng {
    StdRng::seed_from_u64(seed ^ (case as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

fn bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v[..]);
    // Some all-zero and low-entropy payloads too: zeros inside records must not confuse
    // end-of-data detection.
    if n > 0 && rng.random_ratio(1, 8) {
        v.iter_mut().for_each(|b| *b = 0);
    }
    v
}

fn opt_trx(rng: &mut StdRng) -> Option<TrxId> {
    rng.random_bool(0.5)
        .then(|| TrxId::new(rng.random(), rng.random_range(1..=u64::MAX)))
}

fn opt_gtid(rng: &mut StdRng) -> Option<Gtid> {
    rng.random_bool(0.5)
        .then(|| Gtid::new(rng.random(), rng.random(), rng.random()))
}

pub fn tablet_name(rng: &mut StdRng) -> TabletId {
    const CH: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-";
    let n = rng.random_range(1..=64);
    loop {
        let s: String = (0..n)
            .map(|_| CH[rng.random_range(0..CH.len())] as char)
            .collect();
        if let Ok(t) = s.parse() {
            return t;
        }
    }
}

fn ops(rng: &mut StdRng, max_value: usize) -> Vec<Op> {
    let n = rng.random_range(0..=4);
    (0..n)
        .map(|_| {
            let klen = rng.random_range(0..=40);
            let key = bytes(rng, klen);
            if rng.random_ratio(1, 5) {
                Op::delete(key)
            } else {
                // Mostly small values, sometimes big ones.
                let vlen = if rng.random_ratio(1, 6) {
                    rng.random_range(0..=max_value)
                } else {
                    rng.random_range(0..=max_value.min(200))
                };
                Op::put(key, bytes(rng, vlen))
            }
        })
        .collect()
}

/// A random record of any kind at `ht`, whose values are at most `max_value` bytes each.
pub fn random_record(rng: &mut StdRng, ht: HybridTime, max_value: usize) -> Record {
    let txn = TxnId::from_u128(rng.random());
    let body = match rng.random_range(0..5) {
        0 => Body::Write {
            ops: ops(rng, max_value),
            trx_id: opt_trx(rng),
            gtid: opt_gtid(rng),
        },
        1 => Body::Intent {
            txn,
            trx_id: opt_trx(rng),
            ops: ops(rng, max_value),
        },
        2 => Body::Commit {
            txn,
            participants: (0..rng.random_range(1..=4))
                .map(|_| tablet_name(rng))
                .collect(),
            trx_id: opt_trx(rng),
            gtid: opt_gtid(rng),
        },
        3 => Body::Abort {
            txn,
            trx_id: opt_trx(rng),
        },
        _ => Body::Heartbeat,
    };
    Record::new(ht, body)
}

/// Encoded length of `r` (header + body).
pub fn rec_len(r: &Record) -> u64 {
    r.encode(WalPos::ZERO).unwrap().len() as u64
}

/// `(first_pos, path)` of every segment in `tablet_dir`, ascending.
pub fn segments(tablet_dir: &Path) -> Vec<(WalPos, PathBuf)> {
    let mut v: Vec<_> = std::fs::read_dir(tablet_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            let hex = name.strip_suffix(".seg")?;
            Some((WalPos(u64::from_str_radix(hex, 16).ok()?), p.clone()))
        })
        .collect();
    v.sort();
    v
}

/// Reads every record up to the reader's end; at most `max` records (a reader that does
/// not make progress must not hang a test). Returns the records and the error that ended
/// the read, if any.
pub fn read_all(r: &mut Reader, max: usize) -> (Vec<(WalPos, Record)>, Option<Error>) {
    let mut out = Vec::new();
    for _ in 0..=max {
        match r.next() {
            Ok(Some(x)) => out.push(x),
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e)),
        }
    }
    panic!(
        "reader returned more than {max} records; last at {:?}",
        out.last().map(|x| x.0)
    );
}

/// Reads the whole tablet with `limit`; panics on any error.
pub fn read_ok(
    wal_dir: &Path,
    t: &TabletId,
    limit: ReadLimit,
    max: usize,
) -> Vec<(WalPos, Record)> {
    let mut r = Reader::open(wal_dir, t, limit).unwrap();
    let (got, err) = read_all(&mut r, max);
    if let Some(e) = err {
        panic!("read failed after {} records: {e}", got.len());
    }
    got
}

/// Runs `f` on another thread; `None` if it has not finished within `timeout` (the thread
/// is left running: the harness exits at the end anyway).
pub fn with_timeout<T: Send + 'static>(
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(timeout).ok()
}

/// A pristine log written with `SyncPolicy::Always`, and where every byte of it lies.
#[derive(Debug)]
pub struct Image {
    pub root: tempfile::TempDir,
    pub tablet: TabletId,
    pub seg_size: u64,
    /// Every record with its position, in order.
    pub recs: Vec<(WalPos, Record)>,
    /// Encoded length of each record.
    pub lens: Vec<u64>,
    /// `(first_pos, file name)` of each segment.
    pub segs: Vec<(WalPos, String)>,
    /// End of the log.
    pub end: WalPos,
}

impl Image {
    /// Writes `n` random records (commits of 1–3 records, all `SyncPolicy::Always`).
    pub fn build(tablet: &str, seg_size: u64, n: usize, seed: u64) -> Image {
        let mut rng = StdRng::seed_from_u64(seed);
        let root = tempfile::tempdir().unwrap();
        let tablet: TabletId = tablet.parse().unwrap();
        let opts = WalOptions {
            segment_size: seg_size,
            ..Default::default()
        };
        let mut w = Writer::open(root.path(), &tablet, opts).unwrap();
        let max_value = (seg_size as usize - 600) / 2;
        let mut recs = Vec::new();
        let mut lens = Vec::new();
        let mut ht = 1_000u64;
        let mut in_commit = 0;
        for _ in 0..n {
            ht += rng.random_range(1..1000);
            let r = random_record(&mut rng, HybridTime(ht), max_value);
            let p = w.append(&r).unwrap();
            lens.push(rec_len(&r));
            recs.push((p, r));
            in_commit += 1;
            if in_commit >= rng.random_range(1..=3) {
                w.commit(SyncPolicy::Always).unwrap();
                in_commit = 0;
            }
        }
        w.commit(SyncPolicy::Always).unwrap();
        let end = w.durable_pos();
        assert_eq!(w.written_pos(), end);
        drop(w);
        let segs: Vec<_> = segments(&root.path().join(tablet.as_str()))
            .into_iter()
            .map(|(p, path)| (p, path.file_name().unwrap().to_str().unwrap().to_owned()))
            .collect();
        let img = Image {
            root,
            tablet,
            seg_size,
            recs,
            lens,
            segs,
            end,
        };
        img.check_layout();
        img
    }

    fn check_layout(&self) {
        // Positions are contiguous across segments.
        let mut p = WalPos::ZERO;
        for ((at, _), len) in self.recs.iter().zip(&self.lens) {
            assert_eq!(*at, p, "records are not contiguous");
            p = p.add(*len);
        }
        assert_eq!(p, self.end);
        assert!(
            self.segs.len() >= 4,
            "the image should span several segments"
        );
        assert_eq!(self.segs[0].0, WalPos::ZERO);
        // Every segment starts on a record boundary.
        for (first, _) in &self.segs {
            assert!(
                *first == self.end || self.recs.iter().any(|(p, _)| p == first),
                "segment {first} does not start at a record"
            );
        }
    }

    pub fn tablet_dir(&self) -> PathBuf {
        self.root.path().join(self.tablet.as_str())
    }

    /// Logical end of the written data in segment `k`.
    pub fn seg_end(&self, k: usize) -> WalPos {
        self.segs.get(k + 1).map_or(self.end, |s| s.0)
    }

    /// Bytes of segment `k` that are header or written records.
    pub fn seg_written_len(&self, k: usize) -> u64 {
        HDR + self.seg_end(k).since(self.segs[k].0)
    }

    /// Total of `seg_written_len` over all segments: the range of "flat" byte offsets.
    pub fn flat_len(&self) -> u64 {
        (0..self.segs.len()).map(|k| self.seg_written_len(k)).sum()
    }

    /// A flat offset → (segment index, file offset).
    pub fn locate(&self, mut x: u64) -> (usize, u64) {
        for k in 0..self.segs.len() {
            let n = self.seg_written_len(k);
            if x < n {
                return (k, x);
            }
            x -= n;
        }
        panic!("flat offset beyond the image");
    }

    /// Logical position of file offset `o` of segment `k` (a header offset maps to the
    /// segment's first position).
    pub fn logical(&self, k: usize, o: u64) -> WalPos {
        self.segs[k].0.add(o.saturating_sub(HDR))
    }

    /// Index of the record containing logical position `p` (`p` below the end).
    pub fn record_at(&self, p: WalPos) -> usize {
        assert!(p < self.end);
        self.recs.partition_point(|(at, _)| *at <= p) - 1
    }

    /// Index of the first record at or after `p`.
    pub fn first_record_from(&self, p: WalPos) -> usize {
        self.recs.partition_point(|(at, _)| *at < p)
    }

    /// Copies the tablet directory (segments and control file) to `dst_root/<tablet>/`,
    /// replacing whatever was there.
    pub fn copy_to(&self, dst_root: &Path) -> PathBuf {
        let dst = dst_root.join(self.tablet.as_str());
        if dst.exists() {
            std::fs::remove_dir_all(&dst).unwrap();
        }
        std::fs::create_dir_all(&dst).unwrap();
        for e in std::fs::read_dir(self.tablet_dir()).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
        dst
    }

    /// The pristine bytes of segment `k`.
    pub fn seg_bytes(&self, k: usize) -> Vec<u8> {
        std::fs::read(self.tablet_dir().join(&self.segs[k].1)).unwrap()
    }
}
