//! Binlog retention's pruning ([`Prune`]; `applier/STORE.md`, "The binlog", last point):
//! expired binlog entries go with their `trx` and `gtid` entries and their transactions'
//! `txns` records, then aborted `trx_open` entries with theirs, and the retention horizon
//! (`global/binlog_horizon`, which the `mvcc` history filter reads) rises. Nothing at or
//! above the prune floor that received-log retention sets goes: a restart must never read
//! an intent whose transaction's decision was pruned (it would look undecided).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tidelog_wal::{HybridTime, TxnId};

use super::binlog::Binlog;
use super::db::Tables;
use super::meta::Meta;
use super::schema::BINLOG_HORIZON;
use super::txns::Txns;
use super::types::Durability;
use crate::error::Result;

/// The retention horizon and the prune floor of one opening of the store.
pub(super) struct Prune {
    /// `global/binlog_horizon`, cached (raised only by [`Prune::expire_binlog`]); shared
    /// with the `mvcc` history filter (`history.rs`).
    horizon: Arc<AtomicU64>,
    /// See [`Prune::set_floor`] (0 until set: nothing pruned).
    floor: AtomicU64,
}

impl Prune {
    /// The pruning of a store whose `meta` is `meta`; `horizon` is the one the history
    /// filter was given, set here to the stored horizon.
    pub(super) fn open(meta: &Meta, horizon: Arc<AtomicU64>) -> Result<Prune> {
        let stored = meta.word(BINLOG_HORIZON)?.unwrap_or(HybridTime::MIN.0);
        horizon.store(stored, Ordering::Release);
        Ok(Prune {
            horizon,
            floor: AtomicU64::new(0),
        })
    }

    /// Binlog entries with `commit_ht` below this may have been removed by retention
    /// (`MIN`: none ever was). No store read: cached.
    pub(super) fn horizon(&self) -> HybridTime {
        HybridTime(self.horizon.load(Ordering::Acquire))
    }

    /// Binlog retention keeps the `txns` record of every transaction decided at or after
    /// `ht` (and the binlog from there): received-log retention says that every record still
    /// retained — what opening the store reads back after a restart — has an ht of at
    /// least `ht`. A transaction's intents come before its commit, so a committed
    /// transaction whose record goes has none left there (else it would look undecided
    /// after a restart); an aborted one is checked against its record's intents. Until the
    /// first call nothing is pruned.
    pub(super) fn set_floor(&self, ht: HybridTime) {
        self.floor.store(ht.0, Ordering::Release);
    }

    fn floor(&self) -> HybridTime {
        HybridTime(self.floor.load(Ordering::Acquire))
    }

    /// Retention: removes up to `max` binlog entries with `commit_ht < before` (capped at
    /// the prune floor), their index entries and old aborts, and raises the horizon.
    /// Returns the number of binlog entries removed and whether everything below `before`
    /// is gone.
    pub(super) fn expire_binlog(
        &self,
        t: &Tables,
        txns: &Txns,
        meta: &Meta,
        bl: &Binlog,
        before: HybridTime,
        max: usize,
    ) -> Result<(usize, bool)> {
        let floor = self.floor();
        let before = before.min(floor);
        let mut b = t.batch();
        let mut expired = Vec::new();
        let (n, done) = bl.expire(&mut b, before, max, &mut expired)?;
        // Their `txns` records go too (committed below safe time: applied everywhere, so
        // nothing reads them again); apply read-modify-writes `txns`, so under the lock.
        let _g = txns.lock();
        if done {
            // Aborted `trx_open` entries, and their transactions' records.
            let mut ob = t.batch();
            let mut aborted = Vec::new();
            // An aborted transaction's intents may come after its abort (in ht too): its
            // record goes only once none of them can be retained.
            let prunable = |x: &TxnId| -> Result<bool> {
                Ok(txns
                    .txn(x)?
                    .is_none_or(|st| st.intents.values().flatten().all(|i| i.ht < floor)))
            };
            bl.expire_open(&mut ob, before, &mut aborted, &prunable)?;
            for x in aborted {
                ob.remove(&txns.ks, x.0.to_vec());
                ob.remove(&txns.aborted, x.0.to_vec());
            }
            if !ob.is_empty() {
                t.commit(ob, Durability::Buffered)?;
            }
        }
        for x in expired {
            b.remove(&txns.ks, x.0.to_vec());
        }
        let raise = n > 0 && before > self.horizon();
        if raise {
            meta.put_word(&mut b, BINLOG_HORIZON, before.0);
        }
        t.commit(b, Durability::Buffered)?;
        if raise {
            self.horizon.fetch_max(before.0, Ordering::Release);
        }
        Ok((n, done))
    }
}
