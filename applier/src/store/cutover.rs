//! The cutover as the store persists it ([`Cut`]; docs/ARCHITECTURE.md, "Cutover";
//! `applier/STORE.md`, "Cutover"): the cut is written first, with `role = primary`, in one
//! synced batch, and from then on every read is capped at it; the report follows; the
//! clean-up removes the `mvcc` versions above the cut a step at a time, from a persisted
//! cursor. The sequence around it (stop intake, compute the report, run the clean-up) is
//! the top-level `cutover.rs`'s.

use std::sync::atomic::{AtomicU64, Ordering};

use tidelog_wal::HybridTime;

use super::codec::{decode_cutover, encode_cutover};
use super::db::Tables;
use super::meta::Meta;
use super::schema::{CUTOVER, CUTOVER_CURSOR, CUTOVER_REMOVED, META};
use super::txns::Txns;
use super::types::{Cutover, CutoverReport, Durability, Role};
use crate::error::{Error, Result};
use crate::keys;

/// The cut every read is capped at, once a cutover began.
pub(super) struct Cut {
    /// 0: none.
    at: AtomicU64,
}

impl Cut {
    /// The cut of the store whose `meta` is `meta`, if a cutover began.
    pub(super) fn open(meta: &Meta) -> Result<Cut> {
        let at = cutover(meta)?.map_or(0, |c| c.cut.0);
        Ok(Cut {
            at: AtomicU64::new(at),
        })
    }

    /// The cut every read is capped at, once a cutover began.
    pub(super) fn get(&self) -> Option<HybridTime> {
        match self.at.load(Ordering::Acquire) {
            0 => None,
            c => Some(HybridTime(c)),
        }
    }

    /// `at` capped at the cut.
    pub(super) fn cap(&self, at: Option<HybridTime>) -> Option<HybridTime> {
        match (self.get(), at) {
            (Some(c), Some(a)) => Some(a.min(c)),
            (Some(c), None) => Some(c),
            (None, a) => a,
        }
    }

    /// Phase 1 of a cutover: caps every read at `cut`, then persists the cut and
    /// `role = primary` in one synced batch. Returns the stored cutover (an earlier one
    /// if a cutover already began: idempotent).
    pub(super) fn begin(
        &self,
        t: &Tables,
        txns: &Txns,
        meta: &Meta,
        cut: HybridTime,
        cut_time_us: u64,
    ) -> Result<Cutover> {
        let _g = txns.lock();
        if let Some(c) = cutover(meta)? {
            return Ok(c);
        }
        if cut == HybridTime::MIN {
            return Err(Error::Invalid("a cut at ht 0".into()));
        }
        self.at.store(cut.0, Ordering::Release);
        let c = Cutover {
            cut,
            cut_time_us,
            report: None,
            cleaned: false,
        };
        let mut b = t.batch();
        meta.put_raw(&mut b, CUTOVER, Some(encode_cutover(&c)?));
        meta.put_role(&mut b, Role::Primary);
        if let Err(e) = t.commit(b, Durability::Sync) {
            self.at.store(0, Ordering::Release);
            return Err(e);
        }
        Ok(c)
    }
}

/// The persisted cutover, if one began.
pub(super) fn cutover(meta: &Meta) -> Result<Option<Cutover>> {
    match meta.raw(CUTOVER)? {
        None => Ok(None),
        Some(v) => decode_cutover(&v)
            .map(Some)
            .map_err(|r| Error::corrupt(META, "global/cutover", r)),
    }
}

/// Stores the cutover's report (phase 2), durably. Keeps an earlier report.
pub(super) fn save_report(
    t: &Tables,
    txns: &Txns,
    meta: &Meta,
    report: &CutoverReport,
) -> Result<Cutover> {
    let _g = txns.lock();
    let mut c = cutover(meta)?.ok_or_else(|| Error::Invalid("no cutover began".into()))?;
    if c.report.is_some() {
        return Ok(c);
    }
    c.report = Some(report.clone());
    let mut b = t.batch();
    meta.put_raw(&mut b, CUTOVER, Some(encode_cutover(&c)?));
    t.commit(b, Durability::Sync)?;
    Ok(c)
}

/// One step of the cutover's background clean-up: scans `mvcc` from the persisted
/// cursor, removing versions above the cut, until `max_scanned` keys were looked at;
/// then persists the cursor (and, at the end, marks the cutover clean), all in one
/// batch. Returns (scanned, removed, done).
pub(super) fn cleanup_step(
    t: &Tables,
    txns: &Txns,
    meta: &Meta,
    max_scanned: usize,
) -> Result<(usize, usize, bool)> {
    let Some(c) = cutover(meta)? else {
        return Err(Error::Invalid("no cutover began".into()));
    };
    if c.cleaned {
        return Ok((0, 0, true));
    }
    let from = meta.raw(CUTOVER_CURSOR)?.unwrap_or_default();
    let mut b = t.batch();
    let (mut scanned, mut removed) = (0, 0);
    let mut last: Option<Vec<u8>> = None;
    for g in t.mvcc.range(from..) {
        if scanned >= max_scanned {
            break;
        }
        let (k, _) = g.into_inner().map_err(Error::store("scan mvcc"))?;
        let (_, ht) = keys::split(&k)?;
        if ht > c.cut {
            b.remove(&t.mvcc, k.to_vec());
            removed += 1;
        }
        scanned += 1;
        last = Some(k.to_vec());
    }
    let done = scanned < max_scanned;
    if removed > 0 {
        let total = removed_so_far(meta)? + removed as u64;
        meta.put_word(&mut b, CUTOVER_REMOVED, total);
    }
    if done {
        let c = Cutover { cleaned: true, ..c };
        meta.put_raw(&mut b, CUTOVER, Some(encode_cutover(&c)?));
        meta.put_raw(&mut b, CUTOVER_CURSOR, None);
    } else if let Some(mut k) = last {
        // Resume just after the last key looked at.
        k.push(0);
        meta.put_raw(&mut b, CUTOVER_CURSOR, Some(k));
    }
    let _g = txns.lock();
    t.commit(b, Durability::Sync)?;
    Ok((scanned, removed, done))
}

/// Versions the cutover's clean-up has removed so far, over all its runs (persisted
/// with each step).
pub(super) fn removed_so_far(meta: &Meta) -> Result<u64> {
    Ok(meta.word(CUTOVER_REMOVED)?.unwrap_or(0))
}
