//! Shared kit of the applier's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

pub mod tmpfs;

use tidelog_applier::store::{Durability, Store};
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{Body, HybridTime, Record, TabletId, WalPos};

/// One tablet's received log, placed record by record: each record applied to the store
/// in its own batch at contiguous positions.
pub struct Log {
    pub tablet: TabletId,
    pub pos: WalPos,
}

impl Log {
    pub fn new(t: &str) -> Log {
        Log {
            tablet: t.parse().unwrap(),
            pos: WalPos(0),
        }
    }

    pub fn apply(&mut self, s: &Store, ht: u64, body: Body) {
        let r = Record::new(HybridTime(ht), body);
        let len = (RECORD_HEADER_LEN + r.encoded_body_len().unwrap()) as u64;
        let at = self.pos;
        self.pos = at.add(len);
        s.apply(&self.tablet, &[(at, r)], self.pos, Durability::Buffered)
            .unwrap();
    }
}
