//! Every value the store writes, and its strict decoder (layouts drawn in
//! `applier/STORE.md`): a version in `mvcc`, a tablet's meta record, the cutover, a
//! transaction's state, and the binlog's entries and index records. Little-endian; the
//! fixed runs of fields are `zerocopy` structs with a size assertion, the variable parts
//! (tablet ids, lists) are read through [`Cur`].
//!
//! Public, so that each codec can be driven on its own (the fuzz tests in
//! `tests/fuzz.rs`): every `decode_*` refuses what its `encode_*` does not write (unknown
//! versions and flags, short or trailing bytes, lists out of order), with a reason that
//! says what and at which byte.

use std::collections::BTreeMap;

use tidelog_wal::{Gtid, HybridTime, TabletId, TrxId, TxnId, WalPos};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::schema::{BinlogKeyHead, GtidKey};
use super::types::{
    BinlogEntry, CommitInfo, Cutover, CutoverReport, GtidEntry, IntentRef, OpenKind, TabletMeta,
    TrxCommit, TrxOpen, TxnState,
};
use crate::error::{Error, Result};

/// Version byte of the store's own values (`txns`, `meta`).
const FORMAT_VERSION: u8 = 1;
/// Version byte of the binlog's values.
const BINLOG_VERSION: u8 = 1;

/// Bounded little-endian reader over a stored value; every failure says what and where.
pub(crate) struct Cur<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cur<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Cur<'a> {
        Cur { buf, at: 0 }
    }
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let s = self
            .buf
            .get(self.at..self.at.saturating_add(n))
            .ok_or_else(|| {
                format!(
                    "truncated at byte {} reading {what} ({n} bytes, {} left)",
                    self.at,
                    self.buf.len().saturating_sub(self.at)
                )
            })?;
        self.at += n;
        Ok(s)
    }
    /// A fixed run of fields.
    pub(crate) fn read<T: FromBytes + KnownLayout + Immutable + Unaligned>(
        &mut self,
        what: &str,
    ) -> Result<&'a T, String> {
        let b = self.take(size_of::<T>(), what)?;
        T::ref_from_bytes(b).map_err(|_| format!("{what}: not {} bytes", size_of::<T>()))
    }
    /// `n` fixed runs of fields, one after the other.
    fn read_n<T: FromBytes + Immutable + Unaligned>(
        &mut self,
        n: usize,
        what: &str,
    ) -> Result<&'a [T], String> {
        let b = self.take(n.saturating_mul(size_of::<T>()), what)?;
        <[T]>::ref_from_bytes(b).map_err(|_| format!("{what}: not {n} × {} bytes", size_of::<T>()))
    }
    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, String> {
        self.read::<u8>(what).copied()
    }
    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, String> {
        Ok(self.read::<U16>(what)?.get())
    }
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(self.read::<U32>(what)?.get())
    }
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(self.read::<U64>(what)?.get())
    }
    pub(crate) fn tablet(&mut self, what: &str) -> Result<TabletId, String> {
        let n = self.u8(what)? as usize;
        let at = self.at;
        let b = self.take(n, what)?;
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("invalid tablet id in {what} at byte {at}"))
    }
    /// A tablet id of a list kept in ascending order, each once (a map's keys or a set),
    /// that must come after `prev`: every value then has one encoding only.
    pub(crate) fn tablet_after(
        &mut self,
        what: &str,
        prev: Option<&TabletId>,
    ) -> Result<TabletId, String> {
        let at = self.at;
        let t = self.tablet(what)?;
        match prev {
            Some(p) if *p >= t => Err(format!(
                "{what} {t} at byte {at} does not follow {p}: the list must be in ascending order, each once"
            )),
            _ => Ok(t),
        }
    }
    pub(crate) fn end(&self) -> Result<(), String> {
        if self.at == self.buf.len() {
            Ok(())
        } else {
            Err(format!(
                "{} trailing bytes at byte {}",
                self.buf.len() - self.at,
                self.at
            ))
        }
    }
}

/// `u8 len ‖ id` (tablet ids are at most 64 bytes, checked by `TabletId`).
pub(crate) fn put_tablet(out: &mut Vec<u8>, t: &TabletId) {
    out.push(t.as_str().len() as u8);
    out.extend_from_slice(t.as_str().as_bytes());
}

/// The version byte and the flags every versioned value starts with; refuses another
/// version and flags outside `allowed`.
fn header(c: &mut Cur<'_>, version: u8, allowed: u8) -> Result<u8, String> {
    let v = c.u8("version")?;
    if v != version {
        return Err(format!("unknown format version {v}"));
    }
    let f = c.u8("flags")?;
    if f & !allowed != 0 {
        return Err(format!("unknown flags {f:#04x}"));
    }
    Ok(f)
}

/// A trx id in a value.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct TrxIdLe {
    connect_id: U64,
    commit_counter: U64,
}
const _: () = assert!(size_of::<TrxIdLe>() == 16);

fn put_trx(out: &mut Vec<u8>, t: TrxId) {
    let v = TrxIdLe {
        connect_id: U64::new(t.connect_id),
        commit_counter: U64::new(t.commit_counter),
    };
    out.extend_from_slice(v.as_bytes());
}

fn get_trx(c: &mut Cur<'_>, what: &str) -> Result<TrxId, String> {
    let v = c.read::<TrxIdLe>(what)?;
    Ok(TrxId::new(v.connect_id.get(), v.commit_counter.get()))
}

/// A gtid in a value.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct GtidLe {
    domain: U32,
    server: U32,
    seq: U64,
}
const _: () = assert!(size_of::<GtidLe>() == 16);

fn put_gtid(out: &mut Vec<u8>, g: Gtid) {
    let v = GtidLe {
        domain: U32::new(g.domain),
        server: U32::new(g.server),
        seq: U64::new(g.seq),
    };
    out.extend_from_slice(v.as_bytes());
}

fn get_gtid(c: &mut Cur<'_>, what: &str) -> Result<Gtid, String> {
    let v = c.read::<GtidLe>(what)?;
    Ok(Gtid::new(v.domain.get(), v.server.get(), v.seq.get()))
}

fn get_txn(c: &mut Cur<'_>) -> Result<TxnId, String> {
    Ok(TxnId(*c.read::<[u8; 16]>("txn")?))
}

// ---- mvcc ----------------------------------------------------------------------------------

const VALUE_TOMBSTONE: u8 = 0;
const VALUE_PUT: u8 = 1;

pub fn encode_value(v: Option<&[u8]>) -> Vec<u8> {
    match v {
        None => vec![VALUE_TOMBSTONE],
        Some(v) => {
            let mut out = Vec::with_capacity(1 + v.len());
            out.push(VALUE_PUT);
            out.extend_from_slice(v);
            out
        }
    }
}

pub fn decode_value(v: &[u8]) -> Result<Option<Vec<u8>>, String> {
    match v.split_first() {
        Some((&VALUE_TOMBSTONE, [])) => Ok(None),
        Some((&VALUE_TOMBSTONE, rest)) => {
            Err(format!("tombstone with {} trailing bytes", rest.len()))
        }
        Some((&VALUE_PUT, rest)) => Ok(Some(rest.to_vec())),
        Some((tag, _)) => Err(format!("unknown value tag {tag}")),
        None => Err("empty value".into()),
    }
}

// ---- meta: tablet/<id> ---------------------------------------------------------------------

const TM_REGISTERED: u8 = 1;
const TM_OWNER: u8 = 2;

/// A tablet's counters, after version and flags.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct TabletCounters {
    applied_pos: U64,
    safe_time: U64,
    applied_records: U64,
}
const _: () = assert!(size_of::<TabletCounters>() == 24);

pub fn encode_tablet_meta(m: &TabletMeta) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(20);
    out.push(FORMAT_VERSION);
    let mut flags = 0;
    if m.registered {
        flags |= TM_REGISTERED;
    }
    if m.owner.is_some() {
        flags |= TM_OWNER;
    }
    out.push(flags);
    let counters = TabletCounters {
        applied_pos: U64::new(m.applied_pos.0),
        safe_time: U64::new(m.safe_time.0),
        applied_records: U64::new(m.applied_records),
    };
    out.extend_from_slice(counters.as_bytes());
    if let Some(o) = &m.owner {
        let n = u8::try_from(o.len())
            .map_err(|_| Error::Invalid(format!("owner {o:?} is longer than 255 bytes")))?;
        out.push(n);
        out.extend_from_slice(o.as_bytes());
    }
    Ok(out)
}

pub fn decode_tablet_meta(v: &[u8]) -> Result<TabletMeta, String> {
    let mut c = Cur::new(v);
    let flags = header(&mut c, FORMAT_VERSION, TM_REGISTERED | TM_OWNER)?;
    let n = c.read::<TabletCounters>("applied_pos, safe_time, applied_records")?;
    let owner = if flags & TM_OWNER != 0 {
        let n = c.u8("owner length")? as usize;
        let b = c.take(n, "owner")?;
        Some(String::from_utf8(b.to_vec()).map_err(|_| "owner is not UTF-8".to_string())?)
    } else {
        None
    };
    c.end()?;
    Ok(TabletMeta {
        applied_pos: WalPos(n.applied_pos.get()),
        safe_time: HybridTime(n.safe_time.get()),
        registered: flags & TM_REGISTERED != 0,
        owner,
        applied_records: n.applied_records.get(),
    })
}

/// `global/safe_time`, `global/binlog_horizon` and `global/cutover_removed`: one u64.
pub(super) fn decode_word(v: &[u8]) -> Option<u64> {
    U64::read_from_bytes(v).ok().map(U64::get)
}

// ---- meta: global/cutover ------------------------------------------------------------------

const CUT_REPORT: u8 = 1;
const CUT_CLEANED: u8 = 2;

/// The cut, after version and flags.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct CutHead {
    cut: U64,
    cut_time_us: U64,
}
const _: () = assert!(size_of::<CutHead>() == 16);

/// The report's totals, when flagged; as many [`TabletLag`]s follow, each after its id.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ReportHead {
    lost_commits: U64,
    lost_window_ms: U64,
    tablets: U16,
}
const _: () = assert!(size_of::<ReportHead>() == 18);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct TabletLag {
    safe_time: U64,
    lag_ms: U64,
}
const _: () = assert!(size_of::<TabletLag>() == 16);

pub fn encode_cutover(c: &Cutover) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT_VERSION);
    let mut flags = 0;
    if c.report.is_some() {
        flags |= CUT_REPORT;
    }
    if c.cleaned {
        flags |= CUT_CLEANED;
    }
    out.push(flags);
    let head = CutHead {
        cut: U64::new(c.cut.0),
        cut_time_us: U64::new(c.cut_time_us),
    };
    out.extend_from_slice(head.as_bytes());
    if let Some(r) = &c.report {
        let n = u16::try_from(r.tablets.len())
            .map_err(|_| Error::Invalid(format!("{} tablets", r.tablets.len())))?;
        let head = ReportHead {
            lost_commits: U64::new(r.lost_commits),
            lost_window_ms: U64::new(r.lost_window_ms),
            tablets: U16::new(n),
        };
        out.extend_from_slice(head.as_bytes());
        for (t, (safe, lag)) in &r.tablets {
            put_tablet(&mut out, t);
            let l = TabletLag {
                safe_time: U64::new(safe.0),
                lag_ms: U64::new(*lag),
            };
            out.extend_from_slice(l.as_bytes());
        }
    }
    Ok(out)
}

pub fn decode_cutover(v: &[u8]) -> Result<Cutover, String> {
    let mut c = Cur::new(v);
    let flags = header(&mut c, FORMAT_VERSION, CUT_REPORT | CUT_CLEANED)?;
    let head = c.read::<CutHead>("cut, cut_time")?;
    let report = if flags & CUT_REPORT != 0 {
        let r = c.read::<ReportHead>("lost_commits, lost_window_ms, tablet count")?;
        let mut tablets = BTreeMap::new();
        for _ in 0..r.tablets.get() {
            let t = c.tablet_after("tablet", tablets.keys().next_back())?;
            let l = c.read::<TabletLag>("tablet safe time, tablet lag")?;
            tablets.insert(t, (HybridTime(l.safe_time.get()), l.lag_ms.get()));
        }
        Some(CutoverReport {
            lost_commits: r.lost_commits.get(),
            lost_window_ms: r.lost_window_ms.get(),
            tablets,
        })
    } else {
        None
    };
    c.end()?;
    Ok(Cutover {
        cut: HybridTime(head.cut.get()),
        cut_time_us: head.cut_time_us.get(),
        report,
        cleaned: flags & CUT_CLEANED != 0,
    })
}

// ---- txns ----------------------------------------------------------------------------------

const TX_COMMIT: u8 = 1;
const TX_ABORTED: u8 = 2;
const TX_TRX_ID: u8 = 4;
const TX_GTID: u8 = 8;
const TX_APPLIED_PARTS: u8 = 16;
const TX_OPEN: u8 = 32;

/// A commit's time and position, when flagged; its tablet and participants follow.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct CommitHead {
    commit_ht: U64,
    pos: U64,
}
const _: () = assert!(size_of::<CommitHead>() == 16);

/// One intent record of a transaction on a tablet.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct IntentLe {
    pos: U64,
    ht: U64,
}
const _: () = assert!(size_of::<IntentLe>() == 16);

pub fn encode_txn(st: &TxnState) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT_VERSION);
    let mut flags = 0;
    if st.commit.is_some() {
        flags |= TX_COMMIT;
    }
    if st.aborted {
        flags |= TX_ABORTED;
    }
    if st.trx_id.is_some() {
        flags |= TX_TRX_ID;
    }
    if st.gtid.is_some() {
        flags |= TX_GTID;
    }
    if !st.applied_parts.is_empty() {
        flags |= TX_APPLIED_PARTS;
    }
    if st.open.is_some() {
        flags |= TX_OPEN;
    }
    out.push(flags);
    if let Some(t) = st.trx_id {
        put_trx(&mut out, t);
    }
    if let Some(g) = st.gtid {
        put_gtid(&mut out, g);
    }
    if let Some(c) = &st.commit {
        let head = CommitHead {
            commit_ht: U64::new(c.commit_ht.0),
            pos: U64::new(c.pos.0),
        };
        out.extend_from_slice(head.as_bytes());
        put_tablet(&mut out, &c.tablet);
        let n = u16::try_from(c.participants.len())
            .map_err(|_| Error::Invalid(format!("{} participants", c.participants.len())))?;
        out.extend_from_slice(&n.to_le_bytes());
        for p in &c.participants {
            put_tablet(&mut out, p);
        }
    }
    let n = u16::try_from(st.intents.len())
        .map_err(|_| Error::Invalid(format!("{} intent tablets", st.intents.len())))?;
    out.extend_from_slice(&n.to_le_bytes());
    for (t, list) in &st.intents {
        put_tablet(&mut out, t);
        let n = u32::try_from(list.len())
            .map_err(|_| Error::Invalid(format!("{} intents on tablet {t}", list.len())))?;
        out.extend_from_slice(&n.to_le_bytes());
        for r in list {
            let i = IntentLe {
                pos: U64::new(r.pos.0),
                ht: U64::new(r.ht.0),
            };
            out.extend_from_slice(i.as_bytes());
        }
    }
    if !st.applied_parts.is_empty() {
        let n = u16::try_from(st.applied_parts.len())
            .map_err(|_| Error::Invalid(format!("{} applied parts", st.applied_parts.len())))?;
        out.extend_from_slice(&n.to_le_bytes());
        for t in &st.applied_parts {
            put_tablet(&mut out, t);
        }
    }
    if let Some((ht, t)) = &st.open {
        out.extend_from_slice(&ht.0.to_le_bytes());
        put_tablet(&mut out, t);
    }
    Ok(out)
}

pub fn decode_txn(v: &[u8]) -> Result<TxnState, String> {
    let mut c = Cur::new(v);
    let all = TX_COMMIT | TX_ABORTED | TX_TRX_ID | TX_GTID | TX_APPLIED_PARTS | TX_OPEN;
    let flags = header(&mut c, FORMAT_VERSION, all)?;
    let mut st = TxnState {
        aborted: flags & TX_ABORTED != 0,
        ..TxnState::default()
    };
    if flags & TX_TRX_ID != 0 {
        st.trx_id = Some(get_trx(&mut c, "trx_id")?);
    }
    if flags & TX_GTID != 0 {
        st.gtid = Some(get_gtid(&mut c, "gtid")?);
    }
    if flags & TX_COMMIT != 0 {
        let head = c.read::<CommitHead>("commit_ht, commit position")?;
        let tablet = c.tablet("commit tablet")?;
        let n = c.u16("participant count")?;
        let participants = (0..n)
            .map(|_| c.tablet("participant"))
            .collect::<Result<Vec<_>, _>>()?;
        st.commit = Some(CommitInfo {
            commit_ht: HybridTime(head.commit_ht.get()),
            tablet,
            pos: WalPos(head.pos.get()),
            participants,
        });
    }
    let n = c.u16("intent tablet count")?;
    for _ in 0..n {
        let t = c.tablet_after("intent tablet", st.intents.keys().next_back())?;
        let k = c.u32("intent count")?;
        let list = c
            .read_n::<IntentLe>(k as usize, "intent positions and hts")?
            .iter()
            .map(|i| IntentRef {
                pos: WalPos(i.pos.get()),
                ht: HybridTime(i.ht.get()),
            })
            .collect();
        st.intents.insert(t, list);
    }
    if flags & TX_APPLIED_PARTS != 0 {
        let n = c.u16("applied part count")?;
        for _ in 0..n {
            let t = c.tablet_after("applied part", st.applied_parts.last())?;
            st.applied_parts.insert(t);
        }
    }
    if flags & TX_OPEN != 0 {
        st.open = Some((HybridTime(c.u64("open ht")?), c.tablet("open tablet")?));
    }
    c.end()?;
    Ok(st)
}

// ---- binlog --------------------------------------------------------------------------------

const F_TRX: u8 = 1;
const F_GTID: u8 = 2;
const F_TXN: u8 = 4;

fn flags_of(trx: bool, gtid: bool, txn: bool) -> u8 {
    (if trx { F_TRX } else { 0 }) | (if gtid { F_GTID } else { 0 }) | (if txn { F_TXN } else { 0 })
}

pub fn encode_entry(e: &BinlogEntry) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    out.push(BINLOG_VERSION);
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

pub fn decode_entry(key: &[u8], v: &[u8]) -> Result<BinlogEntry, String> {
    let (head, tablet) = BinlogKeyHead::ref_from_prefix(key)
        .map_err(|_| format!("key of {} bytes, expected at least 9", key.len()))?;
    let tablet = key_tablet(tablet)?;
    let mut c = Cur::new(v);
    let f = header(&mut c, BINLOG_VERSION, F_TRX | F_GTID | F_TXN)?;
    let trx_id = (f & F_TRX != 0)
        .then(|| get_trx(&mut c, "trx_id"))
        .transpose()?;
    let gtid = (f & F_GTID != 0)
        .then(|| get_gtid(&mut c, "gtid"))
        .transpose()?;
    let txn = (f & F_TXN != 0).then(|| get_txn(&mut c)).transpose()?;
    let n = c.u16("tablet count")?;
    let tablets = (0..n)
        .map(|_| c.tablet("tablet"))
        .collect::<Result<Vec<_>, _>>()?;
    c.end()?;
    Ok(BinlogEntry {
        commit_ht: HybridTime(head.commit_ht.get()),
        tablet,
        trx_id,
        gtid,
        txn,
        tablets,
    })
}

pub fn encode_commit(e: &BinlogEntry) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(BINLOG_VERSION);
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
    let f = header(&mut c, BINLOG_VERSION, F_GTID | F_TXN)?;
    let commit_ht = HybridTime(c.u64("commit_ht")?);
    let tablet = c.tablet("carrier tablet")?;
    let gtid = (f & F_GTID != 0)
        .then(|| get_gtid(&mut c, "gtid"))
        .transpose()?;
    let txn = (f & F_TXN != 0).then(|| get_txn(&mut c)).transpose()?;
    c.end()?;
    Ok(TrxCommit {
        commit_ht,
        tablet,
        gtid,
        txn,
    })
}

/// A `gtid` record's server and commit time, after version and flags.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct GtidHead {
    server: U32,
    commit_ht: U64,
}
const _: () = assert!(size_of::<GtidHead>() == 12);

pub fn encode_gtid(e: &BinlogEntry, g: Gtid) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    out.push(BINLOG_VERSION);
    out.push(flags_of(e.trx_id.is_some(), false, false));
    let head = GtidHead {
        server: U32::new(g.server),
        commit_ht: U64::new(e.commit_ht.0),
    };
    out.extend_from_slice(head.as_bytes());
    put_tablet(&mut out, &e.tablet);
    if let Some(t) = e.trx_id {
        put_trx(&mut out, t);
    }
    out
}

pub fn decode_gtid(key: &[u8], v: &[u8]) -> Result<GtidEntry, String> {
    let k = GtidKey::ref_from_bytes(key)
        .map_err(|_| format!("key of {} bytes, expected 12", key.len()))?;
    let mut c = Cur::new(v);
    let f = header(&mut c, BINLOG_VERSION, F_TRX)?;
    let head = c.read::<GtidHead>("server, commit_ht")?;
    let tablet = c.tablet("carrier tablet")?;
    let trx_id = (f & F_TRX != 0)
        .then(|| get_trx(&mut c, "trx_id"))
        .transpose()?;
    c.end()?;
    Ok(GtidEntry {
        gtid: Gtid::new(k.domain.get(), head.server.get(), k.seq.get()),
        commit_ht: HybridTime(head.commit_ht.get()),
        tablet,
        trx_id,
    })
}

const OPEN_PENDING: u8 = 1;
const OPEN_ABORTED: u8 = 2;

pub fn encode_open(o: &TrxOpen) -> Vec<u8> {
    let mut out = Vec::with_capacity(36);
    out.push(BINLOG_VERSION);
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
    if ver != BINLOG_VERSION {
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
