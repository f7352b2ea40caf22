//! The binlog and its indexes (docs/ARCHITECTURE.md, "Binlog and trx_status"): every commit
//! in `commit_ht` order, with point look-ups by trx_id and by gtid. Layouts are drawn in
//! `applier/STORE.md`.
//!
//! ```text
//!  binlog    BE commit_ht ‖ carrier tablet          → entry {trx_id?, gtid?, txn?, tablets}
//!  trx       BE connect_id ‖ BE counter             → commit {commit_ht, carrier, gtid?, txn?}
//!  trx_open  BE connect_id ‖ BE counter             → newest pending | aborted {ht, carrier, txn}
//!  gtid      BE domain ‖ BE seq                     → {server, commit_ht, carrier, trx_id?}
//!  open_aborts  BE ht ‖ trx key                      → ``  (aborted trx_open entries by time)
//! ```
//!
//! Entries are written by the store's apply (`batch.rs`) into the same atomic batch as the
//! records that carry them, so the binlog can neither lose nor repeat a commit across a
//! crash. An entry is **visible** once the published safe time is ≥ its `commit_ht`; readers
//! cap at safe time, so "appended as safe time passes it" needs no second write. A trx id
//! commits at most once (the counter moves on commit), so `trx` is a point look-up; aborts
//! and in-flight transactions (a retry after an abort reuses the id) live in the small
//! `trx_open` keyspace, which holds the newest one per trx id (a point look-up too: its
//! bloom filters answer the common miss without reading a block). It is read, modified and
//! written under the store's write lock. Retention removes entries whose `commit_ht`
//! is older than `binlog-retention` together with their index entries, and raises the
//! horizon kept in `meta`.

use std::sync::Arc;

use fjall::{Keyspace, OwnedWriteBatch};
use tidelog_wal::{Gtid, HybridTime, TabletId, TrxId, TxnId};

pub use super::codec::{
    decode_commit, decode_entry, decode_gtid, decode_open, encode_commit, encode_entry,
    encode_gtid, encode_open,
};
pub use super::schema::{
    binlog_key, decode_open_abort_key, gtid_key, open_abort_key, trx_key, BINLOG, GTID,
    OPEN_ABORTS, TRX, TRX_OPEN,
};
pub use super::types::{BinlogEntry, GtidEntry, OpenKind, TrxCommit, TrxOpen};
use crate::error::{Error, Result};

/// The binlog keyspaces of one store ([`super::Store::binlog`]).
#[derive(Clone)]
pub struct Binlog {
    pub(crate) binlog: Keyspace,
    pub(crate) trx: Keyspace,
    pub(crate) trx_open: Keyspace,
    pub(crate) gtid: Keyspace,
    /// Aborted `trx_open` entries by time, for retention: `BE ht ‖ trx key` → ``. May hold
    /// entries a newer attempt replaced since; expiry checks before it removes.
    pub(crate) open_aborts: Keyspace,
    /// Per gtid domain, the highest seq a look-up found visible at the published safe
    /// time. Seq grows in commit order within a domain, so every lower seq of the domain is
    /// visible too (or older than retention, which counts as visible): a hint at or below
    /// it needs no `gtid` read ([`Binlog::known_visible`]). Memory only; only grows.
    pub(crate) visible: Arc<std::sync::RwLock<std::collections::HashMap<u32, u64>>>,
}

impl std::fmt::Debug for Binlog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binlog").finish_non_exhaustive()
    }
}

/// A stored `binlog` entry, or the corruption error naming its key.
fn decode_stored(key: &[u8], v: &[u8]) -> Result<BinlogEntry> {
    decode_entry(key, v)
        .map_err(|r| Error::corrupt(BINLOG, format!("key {}", key.escape_ascii()), r))
}

/// The `trx_open` changes of one apply batch, by trx id (`None`: remove). Reads see them
/// before the store ([`Binlog::add_open`]); [`Binlog::write_open`] puts them in the batch.
#[derive(Debug, Default)]
pub(crate) struct OpenEdits(std::collections::HashMap<TrxId, Option<TrxOpen>>);

impl Binlog {
    // ---- writes, into the caller's apply batch -----------------------------------------

    /// Appends a commit: the binlog entry and its trx and gtid index entries.
    pub(crate) fn add_commit(&self, b: &mut OwnedWriteBatch, e: &BinlogEntry) -> Result<()> {
        b.insert(
            &self.binlog,
            binlog_key(e.commit_ht, &e.tablet),
            encode_entry(e)?,
        );
        if let Some(t) = e.trx_id {
            b.insert(&self.trx, trx_key(t).to_vec(), encode_commit(e));
        }
        if let Some(g) = e.gtid {
            b.insert(
                &self.gtid,
                gtid_key(g.domain, g.seq).to_vec(),
                encode_gtid(e, g),
            );
        }
        Ok(())
    }

    fn current_open(&self, edits: &OpenEdits, t: TrxId) -> Result<Option<TrxOpen>> {
        match edits.0.get(&t) {
            Some(o) => Ok(o.clone()),
            None => self.trx_open(t),
        }
    }

    /// Records an aborted transaction of trx id `t`, unless a newer aborted one (a retry,
    /// applied first from another tablet) is recorded already. The caller holds the store's
    /// write lock until the batch commits. (Undecided transactions' pending entries are kept
    /// in memory by the store: [`crate::store::Store::open_trx`].)
    pub(crate) fn add_open(&self, edits: &mut OpenEdits, t: TrxId, o: TrxOpen) -> Result<()> {
        if self.current_open(edits, t)?.is_some_and(|c| c.ht > o.ht) {
            return Ok(());
        }
        edits.0.insert(t, Some(o));
        Ok(())
    }

    /// Puts `edits` into the apply batch.
    pub(crate) fn write_open(&self, b: &mut OwnedWriteBatch, edits: OpenEdits) {
        for (t, o) in edits.0 {
            match o {
                Some(o) => {
                    if o.kind == OpenKind::Aborted {
                        b.insert(&self.open_aborts, open_abort_key(o.ht, t), Vec::new());
                    }
                    b.insert(&self.trx_open, trx_key(t).to_vec(), encode_open(&o));
                }
                None => b.remove(&self.trx_open, trx_key(t).to_vec()),
            }
        }
    }

    // ---- point look-ups ----------------------------------------------------------------

    /// The commit of trx id `t`, if the binlog holds one (visible or not).
    pub fn trx_commit(&self, t: TrxId) -> Result<Option<TrxCommit>> {
        match self.trx.get(trx_key(t)).map_err(Error::store("read trx"))? {
            None => Ok(None),
            Some(v) => decode_commit(&v)
                .map(Some)
                .map_err(|r| Error::corrupt(TRX, format!("trx {t}"), r)),
        }
    }

    /// The newest undecided or aborted transaction of trx id `t`.
    pub fn trx_open(&self, t: TrxId) -> Result<Option<TrxOpen>> {
        match self
            .trx_open
            .get(trx_key(t))
            .map_err(Error::store("read trx_open"))?
        {
            None => Ok(None),
            Some(v) => decode_open(&v)
                .map(Some)
                .map_err(|r| Error::corrupt(TRX_OPEN, format!("trx {t}"), r)),
        }
    }

    /// Whether `g` is known visible: a look-up found a gtid of its domain with a seq at or
    /// above it visible (see the `visible` field).
    pub fn known_visible(&self, g: Gtid) -> bool {
        let m = self.visible.read().unwrap_or_else(|p| p.into_inner());
        m.get(&g.domain).is_some_and(|&seq| g.seq <= seq)
    }

    /// Records that `g` is visible at the published safe time.
    pub fn note_visible(&self, g: Gtid) {
        if self.known_visible(g) {
            return;
        }
        let mut m = self.visible.write().unwrap_or_else(|p| p.into_inner());
        let seq = m.entry(g.domain).or_insert(g.seq);
        *seq = (*seq).max(g.seq);
    }

    /// The commit with `domain`-`seq` (any server), if the binlog holds it.
    pub fn gtid(&self, domain: u32, seq: u64) -> Result<Option<GtidEntry>> {
        match self
            .gtid
            .get(gtid_key(domain, seq))
            .map_err(Error::store("read gtid"))?
        {
            None => Ok(None),
            Some(v) => decode_gtid(&gtid_key(domain, seq), &v)
                .map(Some)
                .map_err(|r| Error::corrupt(GTID, format!("gtid {domain}-?-{seq}"), r)),
        }
    }

    /// The highest commit counter below `below` of connection `connect_id` the target holds
    /// (committed, undecided or aborted).
    pub fn counter_before(&self, connect_id: u64, below: u64) -> Result<Option<u64>> {
        let lo = trx_key(TrxId::new(connect_id, 0)).to_vec();
        let hi = trx_key(TrxId::new(connect_id, below)).to_vec();
        let mut best = None;
        for ks in [&self.trx, &self.trx_open] {
            if let Some(g) = ks.range(lo.clone()..hi.clone()).next_back() {
                let k = g.key().map_err(Error::store("read trx"))?;
                if let Some(c) = k.get(8..16).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                    best = best.max(Some(u64::from_be_bytes(c)));
                }
            }
        }
        Ok(best)
    }

    /// The oldest retained commit of `domain` (`None`: the binlog holds none of it).
    pub fn first_in_domain(&self, domain: u32) -> Result<Option<GtidEntry>> {
        let Some(g) = self.gtid.prefix(domain.to_be_bytes()).next() else {
            return Ok(None);
        };
        let (k, v) = g.into_inner().map_err(Error::store("read gtid"))?;
        decode_gtid(&k, &v)
            .map(Some)
            .map_err(|r| Error::corrupt(GTID, format!("key {}", k.escape_ascii()), r))
    }

    /// Whether the binlog holds any commit with a gtid.
    pub fn has_gtids(&self) -> Result<bool> {
        Ok(!self.gtid.is_empty().map_err(Error::store("read gtid"))?)
    }

    /// Up to `limit` entries in commit order starting at `from` (`commit_ht`, carrier
    /// tablet; the oldest for `None`) with `commit_ht ≤ upto`, and whether more follow.
    pub fn read(
        &self,
        from: Option<(HybridTime, &TabletId)>,
        upto: HybridTime,
        limit: usize,
    ) -> Result<(Vec<BinlogEntry>, bool)> {
        let start = match from {
            Some((ht, t)) => binlog_key(ht, t),
            None => Vec::new(),
        };
        let mut out = Vec::new();
        for g in self.binlog.range(start..) {
            let (k, v) = g.into_inner().map_err(Error::store("read binlog"))?;
            let e = decode_stored(&k, &v)?;
            if e.commit_ht > upto {
                return Ok((out, false));
            }
            if out.len() >= limit {
                return Ok((out, true));
            }
            out.push(e);
        }
        Ok((out, false))
    }

    /// The distributed transactions committed above `after`, in commit order: the ones a
    /// restart may still have to apply somewhere (see `Store::pending_txns`).
    pub(crate) fn distributed_above(&self, after: HybridTime) -> Result<Vec<(TxnId, BinlogEntry)>> {
        let mut out = Vec::new();
        for g in self.binlog.range(after.next().0.to_be_bytes().to_vec()..) {
            let (k, v) = g.into_inner().map_err(Error::store("read binlog"))?;
            let e = decode_stored(&k, &v)?;
            if let Some(t) = e.txn {
                out.push((t, e));
            }
        }
        Ok(out)
    }

    /// The newest `commit_ht` the binlog holds (visible or not).
    pub fn last_commit_ht(&self) -> Result<Option<HybridTime>> {
        let Some(g) = self.binlog.last_key_value() else {
            return Ok(None);
        };
        let k = g.key().map_err(Error::store("read binlog"))?;
        let ht = k.first_chunk::<8>().ok_or_else(|| {
            Error::corrupt(
                BINLOG,
                format!("key {}", k.escape_ascii()),
                "shorter than 8 bytes",
            )
        })?;
        Ok(Some(HybridTime(u64::from_be_bytes(*ht))))
    }

    /// Every gtid domain the binlog holds, by one seek per domain.
    pub fn domains(&self) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut from = [0u8; 4];
        loop {
            let Some(g) = self.gtid.range(from.to_vec()..).next() else {
                return Ok(out);
            };
            let k = g.key().map_err(Error::store("read gtid"))?;
            let d = k
                .first_chunk::<4>()
                .map(|d| u32::from_be_bytes(*d))
                .ok_or_else(|| {
                    Error::corrupt(
                        GTID,
                        format!("key {}", k.escape_ascii()),
                        "shorter than 4 bytes",
                    )
                })?;
            out.push(d);
            match d.checked_add(1) {
                Some(n) => from = n.to_be_bytes(),
                None => return Ok(out),
            }
        }
    }

    /// The first gtid entry of `domain` with seq ≥ `seq`.
    fn gtid_at_or_after(&self, domain: u32, seq: u64) -> Result<Option<GtidEntry>> {
        let Some(g) = self
            .gtid
            .range(gtid_key(domain, seq).to_vec()..=gtid_key(domain, u64::MAX).to_vec())
            .next()
        else {
            return Ok(None);
        };
        let (k, v) = g.into_inner().map_err(Error::store("read gtid"))?;
        decode_gtid(&k, &v)
            .map(Some)
            .map_err(|r| Error::corrupt(GTID, format!("key {}", k.escape_ascii()), r))
    }

    /// Commits above `cut` by gtid sequence: per domain, the newest seq received minus the
    /// newest seq with `commit_ht ≤ cut` (found by binary search, O(log n) seeks). Gtid
    /// sequence numbers grow by one per commit in commit order (docs/ARCHITECTURE.md,
    /// "Concepts"), so this counts commits the target never received too, as long as a
    /// later one arrived.
    pub fn commits_above(&self, cut: HybridTime) -> Result<u64> {
        let mut lost = 0u64;
        for d in self.domains()? {
            let Some((first, last)) = self.domain_ends(d)? else {
                continue;
            };
            let below = match self.last_at_or_below(d, &first, &last, cut)? {
                Some(seq) => seq,
                None => first.gtid.seq.saturating_sub(1),
            };
            lost += last.gtid.seq.saturating_sub(below);
        }
        Ok(lost)
    }

    /// The visible position at `upto`: per domain (in order), the commit with the highest
    /// seq whose `commit_ht ≤ upto` (O(log n) seeks a domain). A domain none of whose
    /// retained commits is at or below `upto` is left out.
    pub fn visible_pos(&self, upto: HybridTime) -> Result<Vec<Gtid>> {
        let mut out = Vec::new();
        for d in self.domains()? {
            let Some((first, last)) = self.domain_ends(d)? else {
                continue;
            };
            if let Some(seq) = self.last_at_or_below(d, &first, &last, upto)? {
                if let Some(e) = self.gtid_at_or_after(d, seq)? {
                    out.push(e.gtid);
                }
            }
        }
        Ok(out)
    }

    /// The oldest and newest retained commits of domain `d`.
    fn domain_ends(&self, d: u32) -> Result<Option<(GtidEntry, GtidEntry)>> {
        let Some(first) = self.gtid_at_or_after(d, 0)? else {
            return Ok(None);
        };
        let Some(g) = self.gtid.prefix(d.to_be_bytes()).next_back() else {
            return Ok(None);
        };
        let (k, v) = g.into_inner().map_err(Error::store("read gtid"))?;
        let last = decode_gtid(&k, &v)
            .map_err(|r| Error::corrupt(GTID, format!("key {}", k.escape_ascii()), r))?;
        Ok(Some((first, last)))
    }

    /// The highest seq of domain `d` (between its ends `first` and `last`) whose commit is
    /// at or below `cut`, by binary search: gtid sequence numbers grow by one per commit in
    /// commit order (docs/ARCHITECTURE.md, "Concepts"). `None` when `first` is above it.
    fn last_at_or_below(
        &self,
        d: u32,
        first: &GtidEntry,
        last: &GtidEntry,
        cut: HybridTime,
    ) -> Result<Option<u64>> {
        if first.commit_ht > cut {
            return Ok(None);
        }
        // Largest s with f(s) ≤ cut, f(s) = commit_ht of the first entry ≥ s.
        let (mut lo, mut hi) = (first.gtid.seq, last.gtid.seq);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            match self.gtid_at_or_after(d, mid)? {
                Some(e) if e.commit_ht <= cut => lo = mid,
                _ => hi = mid - 1,
            }
        }
        Ok(Some(lo))
    }

    /// Removes, into `b`, up to `max` entries with `commit_ht < before` and their index
    /// entries, adding the distributed transactions among them to `txns`. Returns how many
    /// binlog entries it removed and whether it reached `before`.
    pub(crate) fn expire(
        &self,
        b: &mut OwnedWriteBatch,
        before: HybridTime,
        max: usize,
        txns: &mut Vec<TxnId>,
    ) -> Result<(usize, bool)> {
        let mut n = 0;
        for g in self.binlog.range(..before.0.to_be_bytes().to_vec()) {
            if n >= max {
                return Ok((n, false));
            }
            let (k, v) = g.into_inner().map_err(Error::store("read binlog"))?;
            let e = decode_stored(&k, &v)?;
            b.remove(&self.binlog, k.to_vec());
            if let Some(t) = e.trx_id {
                b.remove(&self.trx, trx_key(t).to_vec());
            }
            if let Some(g) = e.gtid {
                b.remove(&self.gtid, gtid_key(g.domain, g.seq).to_vec());
            }
            txns.extend(e.txn);
            n += 1;
        }
        Ok((n, true))
    }

    /// Removes, into `b`, aborted `trx_open` entries older than `before`, adding their
    /// transactions to `txns`: a range of `open_aborts` (only what expires is read), each
    /// checked against `trx_open` (a retry may have replaced it). The caller holds the
    /// store's write lock until the batch commits (apply read-modify-writes `trx_open`).
    pub(crate) fn expire_open(
        &self,
        b: &mut OwnedWriteBatch,
        before: HybridTime,
        txns: &mut Vec<TxnId>,
        prunable: &dyn Fn(&TxnId) -> Result<bool>,
    ) -> Result<usize> {
        let mut n = 0;
        for g in self.open_aborts.range(..before.0.to_be_bytes().to_vec()) {
            let k = g.key().map_err(Error::store("read open_aborts"))?;
            let (ht, t) = decode_open_abort_key(&k).ok_or_else(|| {
                Error::corrupt(
                    OPEN_ABORTS,
                    format!("key {}", k.escape_ascii()),
                    "expected 24 bytes",
                )
            })?;
            let o = self.trx_open(t)?;
            let current = o
                .as_ref()
                .filter(|o| o.kind == OpenKind::Aborted && o.ht == ht);
            if let Some(o) = current {
                if !prunable(&o.txn)? {
                    continue; // kept whole, looked at again next time
                }
            }
            b.remove(&self.open_aborts, k.to_vec());
            if let Some(o) = current {
                b.remove(&self.trx_open, trx_key(t).to_vec());
                txns.push(o.txn);
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn t(s: &str) -> TabletId {
        s.parse().unwrap()
    }

    #[test]
    fn encodings_roundtrip_and_corruption_is_named() {
        let e = BinlogEntry {
            commit_ht: HybridTime(0x0102_0304_0506_0708),
            tablet: t("status-1"),
            trx_id: Some(TrxId::new(u64::MAX, 7)),
            gtid: Some(Gtid::new(3, 9, 1 << 40)),
            txn: Some(TxnId::from_u128(42)),
            tablets: vec![t("a"), t("b")],
        };
        let k = binlog_key(e.commit_ht, &e.tablet);
        let v = encode_entry(&e).unwrap();
        assert_eq!(decode_entry(&k, &v).unwrap(), e);
        let c = decode_commit(&encode_commit(&e)).unwrap();
        assert_eq!(
            (c.commit_ht, c.tablet, c.gtid, c.txn),
            (e.commit_ht, e.tablet.clone(), e.gtid, e.txn)
        );
        let g = e.gtid.unwrap();
        let ge = decode_gtid(&gtid_key(g.domain, g.seq), &encode_gtid(&e, g)).unwrap();
        assert_eq!(
            (ge.gtid, ge.commit_ht, ge.trx_id),
            (g, e.commit_ht, e.trx_id)
        );
        let o = TrxOpen {
            ht: HybridTime(99),
            kind: OpenKind::Aborted,
            txn: TxnId::from_u128(5),
            tablet: t("x"),
        };
        let ov = encode_open(&o);
        assert_eq!(decode_open(&ov).unwrap(), o);
        for cut in 0..ov.len() {
            assert!(decode_open(&ov[..cut]).is_err(), "cut {cut}");
        }
        // Every truncation and a trailing byte are named errors, never panics.
        for cut in 0..v.len() {
            assert!(decode_entry(&k, &v[..cut]).is_err(), "cut {cut}");
        }
        let mut long = v.clone();
        long.push(0);
        assert!(decode_entry(&k, &long).unwrap_err().contains("trailing"));
        assert!(decode_entry(&k[..8], &v).is_err());
        let mut bad = v.clone();
        bad[1] = 0x80;
        assert!(decode_entry(&k, &bad).unwrap_err().contains("flags"));
        assert!(decode_open(&[1, 9]).unwrap_err().contains("kind"));
    }

    #[test]
    fn keys_sort_by_commit_ht() {
        let a = binlog_key(HybridTime(5), &t("z"));
        let b = binlog_key(HybridTime(6), &t("a"));
        assert!(a < b);
        assert!(gtid_key(1, u64::MAX) < gtid_key(2, 0));
    }
}
