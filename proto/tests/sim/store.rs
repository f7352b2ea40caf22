//! What the two ends keep on disk: a source tablet's WAL (with its `acked` file and
//! retention) and the intake's received log of it (staged bytes, and the durable part a
//! restart keeps).

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::Rng;
use tidelog_proto::intake::Durable;
use tidelog_wal::{Body, HybridTime, Op, Record, TabletId, WalPos};

/// A source tablet's log: real encoded records at their positions.
pub(crate) struct Source {
    pub tablet: TabletId,
    pub bytes: Vec<u8>,
    /// Record boundaries: (position, ht).
    pub records: Vec<(u64, HybridTime)>,
    /// Retention deleted everything below.
    pub oldest: u64,
    /// The shipper's `acked` file.
    pub acked: u64,
    next_ht: u64,
}

impl Source {
    pub fn new(tablet: TabletId) -> Source {
        Source {
            tablet,
            bytes: Vec::new(),
            records: Vec::new(),
            oldest: 0,
            acked: 0,
            next_ht: 1 << 20,
        }
    }

    pub fn end(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// A source transaction commits one record.
    pub fn append(&mut self, rng: &mut StdRng) {
        self.next_ht += rng.random_range(1..1000);
        let n = self.records.len();
        let value = vec![n as u8; rng.random_range(0..200)];
        let r = Record::new(
            HybridTime(self.next_ht),
            Body::Write {
                ops: vec![Op::put(format!("{}-{n}", self.tablet), value)],
                trx_id: None,
                gtid: None,
            },
        );
        let pos = self.end();
        let Ok(b) = r.encode(WalPos(pos)) else {
            unreachable!("a small record encodes")
        };
        self.records.push((pos, r.ht));
        self.bytes.extend(b);
    }

    /// Whole records from `pos`, up to `max` bytes (at least one); `None` at the end.
    pub fn read(&self, pos: u64, max: usize) -> Result<Option<(Vec<u8>, u32, HybridTime)>, String> {
        if pos < self.oldest {
            return Err(format!(
                "tablet {}: position {pos} was deleted at the source (oldest {})",
                self.tablet, self.oldest
            ));
        }
        if pos == self.end() {
            return Ok(None);
        }
        let first = self
            .records
            .binary_search_by_key(&pos, |(p, _)| *p)
            .map_err(|_| format!("tablet {}: {pos} is not a record boundary", self.tablet))?;
        let mut end = first;
        while end < self.records.len() {
            let next = self.records.get(end + 1).map_or(self.end(), |(p, _)| *p);
            if end > first && (next - pos) as usize > max {
                break;
            }
            end += 1;
        }
        let stop = self.records.get(end).map_or(self.end(), |(p, _)| *p);
        let last_ht = self.records[end - 1].1;
        Ok(Some((
            self.bytes[pos as usize..stop as usize].to_vec(),
            (end - first) as u32,
            last_ht,
        )))
    }

    /// Retention: deletes whole records below some point at or below the `acked` file.
    pub fn retain(&mut self, rng: &mut StdRng) {
        let below: Vec<u64> = self
            .records
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| *p <= self.acked && *p > self.oldest)
            .collect();
        if !below.is_empty() {
            self.oldest = below[rng.random_range(0..below.len())];
        }
    }
}

/// A frame on its way to the received log's writer.
pub struct WriteReq {
    pub stream: u64,
    pub first: WalPos,
    pub payload: Vec<u8>,
}

/// The intake's received log of one tablet, written as the intake's writer thread writes
/// it: frames staged in order (a frame that does not continue the log, or whose records do
/// not verify, is refused with everything its stream queued after it), then synced.
pub struct RecvLog {
    pub tablet: TabletId,
    pub staged: Vec<u8>,
    staged_ht: Option<HybridTime>,
    /// Bytes that survive a restart.
    pub durable: usize,
    durable_ht: Option<HybridTime>,
    pub queue: VecDeque<WriteReq>,
    pub syncing: bool,
    refused: Option<u64>,
    error: Option<(u64, &'static str, String)>,
}

impl RecvLog {
    pub fn new(tablet: TabletId) -> RecvLog {
        RecvLog {
            tablet,
            staged: Vec::new(),
            staged_ht: None,
            durable: 0,
            durable_ht: None,
            queue: VecDeque::new(),
            syncing: false,
            refused: None,
            error: None,
        }
    }

    /// What the writer last published.
    pub fn published(&self) -> Durable {
        Durable {
            pos: WalPos(self.durable as u64),
            safe_time: self.durable_ht.unwrap_or_default(),
            error: self.error.clone(),
        }
    }

    /// Stages the queued frames (one group); the caller syncs them later.
    pub fn stage_group(&mut self) {
        let mut error = None;
        while let Some(req) = self.queue.pop_front() {
            if self.refused == Some(req.stream) {
                continue;
            }
            let end = WalPos(self.staged.len() as u64);
            if req.first != end {
                self.refused = Some(req.stream);
                error = Some((
                    req.stream,
                    "bad_position",
                    format!(
                        "frame starts at {} but the received log of tablet {} ends at {end}",
                        req.first, self.tablet
                    ),
                ));
                continue;
            }
            match tidelog_wal::verify::verify_records(
                &self.tablet,
                &req.payload,
                req.first,
                self.staged_ht,
            ) {
                Ok(sum) => {
                    self.staged.extend_from_slice(&req.payload);
                    self.staged_ht = sum.last_ht.or(self.staged_ht);
                }
                Err(e) => {
                    self.refused = Some(req.stream);
                    error = Some((req.stream, "corrupt_frame", e.to_string()));
                }
            }
        }
        if error.is_some() {
            self.error = error;
        }
        self.syncing = true;
    }

    /// The sync of the staged bytes completed: they are durable.
    pub fn synced(&mut self) {
        self.durable = self.staged.len();
        self.durable_ht = self.staged_ht;
        self.syncing = false;
    }

    /// The intake restarts: only what was durable is kept.
    pub fn restart(&mut self) {
        self.staged.truncate(self.durable);
        self.staged_ht = self.durable_ht;
        self.queue.clear();
        self.syncing = false;
        self.refused = None;
        self.error = None;
    }
}
