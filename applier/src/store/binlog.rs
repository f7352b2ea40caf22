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
//! Entries are written by [`crate::store::Store::apply`] in the same atomic batch as the
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
use std::time::{Duration, SystemTime};

use fjall::{Keyspace, OwnedWriteBatch};
use tidelog_wal::{Gtid, HybridTime, TabletId, TrxId, TxnId};

use super::{put_tablet, Cur, Store};
use crate::consistency::Consistency;
use crate::error::{Error, Result};
use crate::periodic::Periodic;

/// Keyspace names.
pub const BINLOG: &str = "binlog";
pub const TRX: &str = "trx";
pub const TRX_OPEN: &str = "trx_open";
pub const GTID: &str = "gtid";
pub const OPEN_ABORTS: &str = "open_aborts";

const VERSION: u8 = 1;
const F_TRX: u8 = 1;
const F_GTID: u8 = 2;
const F_TXN: u8 = 4;

/// One commit in the binlog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BinlogEntry {
    pub commit_ht: HybridTime,
    /// The tablet whose log carried the commit (`write` or `commit` record).
    pub tablet: TabletId,
    pub trx_id: Option<TrxId>,
    pub gtid: Option<Gtid>,
    /// The distributed transaction, for a `commit`; `None` for a single-tablet `write`.
    pub txn: Option<TxnId>,
    /// The tablets the commit wrote: the participants, or the carrier for a `write`.
    pub tablets: Vec<TabletId>,
}

/// What the `trx` index says about a committed trx id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrxCommit {
    pub commit_ht: HybridTime,
    pub tablet: TabletId,
    pub gtid: Option<Gtid>,
    pub txn: Option<TxnId>,
}

/// An undecided or aborted transaction of a trx id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenKind {
    /// Intents received, no decision yet.
    Pending,
    /// An `abort` was received.
    Aborted,
}

/// The newest `trx_open` entry of a trx id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrxOpen {
    pub ht: HybridTime,
    pub kind: OpenKind,
    pub txn: TxnId,
    pub tablet: TabletId,
}

/// What the `gtid` index says about one gtid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GtidEntry {
    pub gtid: Gtid,
    pub commit_ht: HybridTime,
    pub tablet: TabletId,
    pub trx_id: Option<TrxId>,
}

/// The binlog keyspaces of one store ([`crate::store::Store::binlog`]).
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

// Keys and value codecs: public, like the store's, so that each can be driven on its own
// (the fuzz tests in `tests/fuzz.rs`).

pub fn binlog_key(commit_ht: HybridTime, tablet: &TabletId) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + tablet.as_str().len());
    k.extend_from_slice(&commit_ht.0.to_be_bytes());
    k.extend_from_slice(tablet.as_str().as_bytes());
    k
}

pub fn trx_key(t: TrxId) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&t.connect_id.to_be_bytes());
    k[8..].copy_from_slice(&t.commit_counter.to_be_bytes());
    k
}

pub fn gtid_key(domain: u32, seq: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&domain.to_be_bytes());
    k[4..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn put_trx(out: &mut Vec<u8>, t: TrxId) {
    out.extend_from_slice(&t.connect_id.to_le_bytes());
    out.extend_from_slice(&t.commit_counter.to_le_bytes());
}

fn put_gtid(out: &mut Vec<u8>, g: Gtid) {
    out.extend_from_slice(&g.domain.to_le_bytes());
    out.extend_from_slice(&g.server.to_le_bytes());
    out.extend_from_slice(&g.seq.to_le_bytes());
}

fn get_trx(c: &mut Cur<'_>) -> Result<TrxId, String> {
    Ok(TrxId::new(
        c.u64("trx_id.connect_id")?,
        c.u64("trx_id.commit_counter")?,
    ))
}

fn get_gtid(c: &mut Cur<'_>) -> Result<Gtid, String> {
    Ok(Gtid::new(
        c.u32("gtid.domain")?,
        c.u32("gtid.server")?,
        c.u64("gtid.seq")?,
    ))
}

fn get_txn(c: &mut Cur<'_>) -> Result<TxnId, String> {
    let b = c.take(16, "txn")?;
    let mut id = [0u8; 16];
    id.copy_from_slice(b);
    Ok(TxnId(id))
}

fn flags_of(trx: bool, gtid: bool, txn: bool) -> u8 {
    (if trx { F_TRX } else { 0 }) | (if gtid { F_GTID } else { 0 }) | (if txn { F_TXN } else { 0 })
}

fn header(c: &mut Cur<'_>, allowed: u8) -> Result<u8, String> {
    let v = c.u8("version")?;
    if v != VERSION {
        return Err(format!("unknown format version {v}"));
    }
    let f = c.u8("flags")?;
    if f & !allowed != 0 {
        return Err(format!("unknown flags {f:#04x}"));
    }
    Ok(f)
}

pub fn encode_entry(e: &BinlogEntry) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    out.push(VERSION);
    out.push(flags_of(
        e.trx_id.is_some(),
        e.gtid.is_some(),
        e.txn.is_some(),
    ));
    if let Some(t) = e.trx_id {
        put_trx(&mut out, t);
    }
    if let Some(g) = e.gtid {
        put_gtid(&mut out, g);
    }
    if let Some(x) = e.txn {
        out.extend_from_slice(&x.0);
    }
    let n = u16::try_from(e.tablets.len())
        .map_err(|_| Error::Invalid(format!("{} tablets in one commit", e.tablets.len())))?;
    out.extend_from_slice(&n.to_le_bytes());
    for t in &e.tablets {
        put_tablet(&mut out, t);
    }
    Ok(out)
}

/// The tablet id a binlog or `trx_open` key ends with.
fn key_tablet(b: &[u8]) -> Result<TabletId, String> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse::<TabletId>().ok())
        .ok_or_else(|| "key does not end in a valid tablet id".to_string())
}

/// A stored `binlog` entry, or the corruption error naming its key.
fn decode_stored(key: &[u8], v: &[u8]) -> Result<BinlogEntry> {
    decode_entry(key, v)
        .map_err(|r| Error::corrupt(BINLOG, format!("key {}", key.escape_ascii()), r))
}

pub fn decode_entry(key: &[u8], v: &[u8]) -> Result<BinlogEntry, String> {
    let (ht, tablet) = key
        .split_first_chunk::<8>()
        .ok_or_else(|| format!("key of {} bytes, expected at least 9", key.len()))?;
    let tablet = key_tablet(tablet)?;
    let mut c = Cur::new(v);
    let f = header(&mut c, F_TRX | F_GTID | F_TXN)?;
    let trx_id = (f & F_TRX != 0).then(|| get_trx(&mut c)).transpose()?;
    let gtid = (f & F_GTID != 0).then(|| get_gtid(&mut c)).transpose()?;
    let txn = (f & F_TXN != 0).then(|| get_txn(&mut c)).transpose()?;
    let n = c.u16("tablet count")?;
    let tablets = (0..n)
        .map(|_| c.tablet("tablet"))
        .collect::<Result<Vec<_>, _>>()?;
    c.end()?;
    Ok(BinlogEntry {
        commit_ht: HybridTime(u64::from_be_bytes(*ht)),
        tablet,
        trx_id,
        gtid,
        txn,
        tablets,
    })
}

pub fn encode_commit(e: &BinlogEntry) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(VERSION);
    out.push(flags_of(false, e.gtid.is_some(), e.txn.is_some()));
    out.extend_from_slice(&e.commit_ht.0.to_le_bytes());
    put_tablet(&mut out, &e.tablet);
    if let Some(g) = e.gtid {
        put_gtid(&mut out, g);
    }
    if let Some(x) = e.txn {
        out.extend_from_slice(&x.0);
    }
    out
}

pub fn decode_commit(v: &[u8]) -> Result<TrxCommit, String> {
    let mut c = Cur::new(v);
    let f = header(&mut c, F_GTID | F_TXN)?;
    let commit_ht = HybridTime(c.u64("commit_ht")?);
    let tablet = c.tablet("carrier tablet")?;
    let gtid = (f & F_GTID != 0).then(|| get_gtid(&mut c)).transpose()?;
    let txn = (f & F_TXN != 0).then(|| get_txn(&mut c)).transpose()?;
    c.end()?;
    Ok(TrxCommit {
        commit_ht,
        tablet,
        gtid,
        txn,
    })
}

pub fn encode_gtid(e: &BinlogEntry, g: Gtid) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    out.push(VERSION);
    out.push(flags_of(e.trx_id.is_some(), false, false));
    out.extend_from_slice(&g.server.to_le_bytes());
    out.extend_from_slice(&e.commit_ht.0.to_le_bytes());
    put_tablet(&mut out, &e.tablet);
    if let Some(t) = e.trx_id {
        put_trx(&mut out, t);
    }
    out
}

pub fn decode_gtid(key: &[u8], v: &[u8]) -> Result<GtidEntry, String> {
    let k: [u8; 12] = key
        .try_into()
        .map_err(|_| format!("key of {} bytes, expected 12", key.len()))?;
    let (d, s) = k.split_at(4);
    let domain = u32::from_be_bytes(d.try_into().map_err(|_| "domain")?);
    let seq = u64::from_be_bytes(s.try_into().map_err(|_| "seq")?);
    let mut c = Cur::new(v);
    let f = header(&mut c, F_TRX)?;
    let server = c.u32("server")?;
    let commit_ht = HybridTime(c.u64("commit_ht")?);
    let tablet = c.tablet("carrier tablet")?;
    let trx_id = (f & F_TRX != 0).then(|| get_trx(&mut c)).transpose()?;
    c.end()?;
    Ok(GtidEntry {
        gtid: Gtid::new(domain, server, seq),
        commit_ht,
        tablet,
        trx_id,
    })
}

const OPEN_PENDING: u8 = 1;
const OPEN_ABORTED: u8 = 2;

pub fn encode_open(o: &TrxOpen) -> Vec<u8> {
    let mut out = Vec::with_capacity(36);
    out.push(VERSION);
    out.push(match o.kind {
        OpenKind::Pending => OPEN_PENDING,
        OpenKind::Aborted => OPEN_ABORTED,
    });
    out.extend_from_slice(&o.ht.0.to_le_bytes());
    put_tablet(&mut out, &o.tablet);
    out.extend_from_slice(&o.txn.0);
    out
}

pub fn decode_open(v: &[u8]) -> Result<TrxOpen, String> {
    let mut c = Cur::new(v);
    let ver = c.u8("version")?;
    if ver != VERSION {
        return Err(format!("unknown format version {ver}"));
    }
    let kind = match c.u8("kind")? {
        OPEN_PENDING => OpenKind::Pending,
        OPEN_ABORTED => OpenKind::Aborted,
        k => return Err(format!("unknown kind {k}")),
    };
    let ht = HybridTime(c.u64("ht")?);
    let tablet = c.tablet("tablet")?;
    let txn = get_txn(&mut c)?;
    c.end()?;
    Ok(TrxOpen {
        ht,
        kind,
        txn,
        tablet,
    })
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
            let Some(first) = self.gtid_at_or_after(d, 0)? else {
                continue;
            };
            let Some(g) = self.gtid.prefix(d.to_be_bytes()).next_back() else {
                continue;
            };
            let (k, v) = g.into_inner().map_err(Error::store("read gtid"))?;
            let last = decode_gtid(&k, &v)
                .map_err(|r| Error::corrupt(GTID, format!("key {}", k.escape_ascii()), r))?;
            let below = if first.commit_ht > cut {
                first.gtid.seq.saturating_sub(1)
            } else {
                // Largest s with f(s) ≤ cut, f(s) = commit_ht of the first entry ≥ s.
                let (mut lo, mut hi) = (first.gtid.seq, last.gtid.seq);
                while lo < hi {
                    let mid = lo + (hi - lo).div_ceil(2);
                    match self.gtid_at_or_after(d, mid)? {
                        Some(e) if e.commit_ht <= cut => lo = mid,
                        _ => hi = mid - 1,
                    }
                }
                lo
            };
            lost += last.gtid.seq.saturating_sub(below);
        }
        Ok(lost)
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

/// `open_aborts` key: `BE ht ‖ trx key`.
pub fn open_abort_key(ht: HybridTime, t: TrxId) -> Vec<u8> {
    let mut k = Vec::with_capacity(24);
    k.extend_from_slice(&ht.0.to_be_bytes());
    k.extend_from_slice(&trx_key(t));
    k
}

pub fn decode_open_abort_key(k: &[u8]) -> Option<(HybridTime, TrxId)> {
    let ht = u64::from_be_bytes(k.get(..8)?.try_into().ok()?);
    let c = u64::from_be_bytes(k.get(8..16)?.try_into().ok()?);
    let n = u64::from_be_bytes(k.get(16..24)?.try_into().ok()?);
    (k.len() == 24).then(|| (HybridTime(ht), TrxId::new(c, n)))
}

/// Binlog retention (`binlog-retention`): a thread that removes entries whose `commit_ht`
/// is older than the retention (and below safe time), in batches, every tenth of the
/// retention (between 100 ms and 1 min). Stops when dropped.
#[derive(Debug)]
pub struct Retention {
    /// Held for its `Drop`: stops and joins the thread.
    _thread: Periodic,
}

/// Entries removed per store batch by retention.
const EXPIRE_BATCH: usize = 10_000;

impl Retention {
    pub fn start(
        store: Arc<Store>,
        consistency: Arc<Consistency>,
        retention: Duration,
    ) -> Result<Retention> {
        let every = (retention / 10).clamp(Duration::from_millis(100), Duration::from_secs(60));
        let p = Periodic::start("binlog-retention", every, move || {
            let Some(safe) = consistency.safe_time() else {
                return;
            };
            // A retention reaching before the epoch keeps everything.
            let horizon = SystemTime::now()
                .checked_sub(retention)
                .map_or(HybridTime::MIN, HybridTime::from_system_time);
            let before = horizon.min(safe.next());
            loop {
                match store.expire_binlog(before, EXPIRE_BATCH) {
                    Ok((n, done)) => {
                        if n > 0 {
                            tracing::debug!(removed = n, %before, "binlog retention");
                        }
                        if done {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::error!("binlog retention: {e}");
                        break;
                    }
                }
            }
        })
        .map_err(|source| Error::Io {
            op: "spawn the binlog retention thread",
            path: Default::default(),
            source,
        })?;
        Ok(Retention { _thread: p })
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
