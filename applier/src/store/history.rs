//! MVCC history retention: a fjall compaction filter on `mvcc` that drops versions no read
//! can see any more (drawn in `applier/STORE.md`, "`mvcc` history").
//!
//! Reads are at the safe time or at an explicit `at` no older than the retention horizon
//! `H` (`global/binlog_horizon`, raised by binlog retention, at most the safe time + 1; the
//! filter works with `H − 1`, which no read is below). A read at `t ≥ H` sees, per key, the
//! newest version with `ht ≤ t`; so of the versions with `ht ≤ H` only the newest can ever
//! be read, and the older ones go:
//!
//! ```text
//!  key k:  v@40  v@30  v@20  v@10  v@5        H = 25
//!          keep  keep  keep  drop  drop       (v@20: newest ≤ H; what a read at H sees)
//! ```
//!
//! Versions arrive in key order, newest first (`key ‖ inverted ht`). A compaction sees
//! only its input tables: a version is dropped only when a newer version ≤ `H` of the same
//! key came before it in the same compaction, so the version a read at `H` needs is never
//! dropped (it may be kept longer than needed). Dropped versions become tombstones, which
//! shadow any copy of the same version in a lower level. A key that cannot be decoded is
//! kept.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fjall::compaction::filter::{CompactionFilter, Context, Factory, ItemAccessor, Verdict};

use crate::keys;

/// Makes the filter of each `mvcc` compaction at the retention horizon as it is then
/// (shared with the store, which raises it).
pub(crate) struct HistoryFactory {
    pub horizon: Arc<AtomicU64>,
}

impl Factory for HistoryFactory {
    fn name(&self) -> &str {
        "tidelog-mvcc-history"
    }

    /// Binlog retention raises `H` to at most safe time + 1, and a consistent read is at
    /// the safe time: keep what a read at `H − 1` sees (a version at exactly `H` may exist
    /// on a tablet ahead of the others and must not hide the one below it).
    fn make_filter(&self, _ctx: &Context) -> Box<dyn CompactionFilter> {
        let h = self.horizon.load(Ordering::Acquire);
        Box::new(HistoryFilter::new(h.saturating_sub(1)))
    }
}

/// The filter of one compaction (see the module doc).
pub(crate) struct HistoryFilter {
    horizon: u64,
    /// The user key (encoded, with its terminator) of the previous version seen.
    key: Vec<u8>,
    /// Whether a version of `key` with `ht ≤ horizon` was seen (and kept) already.
    seen_base: bool,
}

impl HistoryFilter {
    /// A filter keeping what a read at `horizon` sees (0: keeps everything).
    fn new(horizon: u64) -> HistoryFilter {
        HistoryFilter {
            horizon,
            key: Vec::new(),
            seen_base: false,
        }
    }

    /// The verdict for the version of `enc` (an encoded `mvcc` key), in compaction order.
    pub(crate) fn verdict(&mut self, enc: &[u8]) -> Verdict {
        if self.horizon == 0 {
            return Verdict::Keep;
        }
        let Ok((user, ht)) = keys::split(enc) else {
            return Verdict::Keep;
        };
        if user != self.key.as_slice() {
            self.key.clear();
            self.key.extend_from_slice(user);
            self.seen_base = false;
        }
        if ht.0 > self.horizon {
            return Verdict::Keep;
        }
        if self.seen_base {
            Verdict::Remove
        } else {
            self.seen_base = true;
            Verdict::Keep
        }
    }
}

impl CompactionFilter for HistoryFilter {
    fn filter_item(
        &mut self,
        item: ItemAccessor<'_>,
        _ctx: &Context,
    ) -> fjall::compaction::filter::CompactionFilterResult {
        Ok(self.verdict(item.key()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tidelog_wal::HybridTime;

    #[test]
    fn keeps_the_newest_version_at_or_below_the_horizon_per_key() {
        let mut f = HistoryFilter::new(25);
        let k = |key: &[u8], ht| keys::encode(key, HybridTime(ht));
        let keep = |v: Verdict| matches!(v, Verdict::Keep);
        // Key "a": 40, 30 (above), 20 (base), 10 and 5 (dropped); key "ab": 10 is its base.
        let order = [
            (k(b"a", 40), true),
            (k(b"a", 30), true),
            (k(b"a", 20), true),
            (k(b"a", 10), false),
            (k(b"a", 5), false),
            (k(b"ab", 10), true),
            (k(b"ab", 3), false),
            (b"not an mvcc key".to_vec(), true),
        ];
        for (enc, want) in order {
            assert_eq!(keep(f.verdict(&enc)), want, "{}", enc.escape_ascii());
        }
        // Horizon 0: nothing is ever dropped.
        let mut f0 = HistoryFilter::new(0);
        assert!(keep(f0.verdict(&k(b"a", 20))) && keep(f0.verdict(&k(b"a", 10))));
    }
}
