//! Versions of user keys in `mvcc`: written at a hybrid time into the caller's batch, read
//! at a time by one seek (`get`) or by a prefix scan (`scan`) — layouts and the scan's
//! re-seek are drawn in `applier/STORE.md`, "`mvcc`". The times given here are already
//! capped (at the cutover's cut, by the caller); versions older than the retention horizon
//! that no read can see are dropped by compaction (`history.rs`).

use std::collections::BTreeMap;
use std::ops::Bound;

use fjall::{Database, Keyspace, OwnedWriteBatch, Readable};
use tidelog_wal::HybridTime;

use super::codec::{decode_value, encode_value};
use super::schema::MVCC;
use super::types::Version;
use crate::error::{Error, Result};
use crate::keys;

/// Scans re-seek instead of stepping once they passed this many invisible versions of one key.
const RESEEK_AFTER: usize = 8;

/// A user key and its visible value and version, as `scan` lists them.
type Row = (Vec<u8>, Vec<u8>, HybridTime);

/// Puts one version at `ht` of each key of `ops` into `batch` (several ops on one key: the
/// last one wins, one version per key and ht); `key_buf` is reused between calls. Returns
/// the versions written.
pub(super) fn write<'a>(
    batch: &mut OwnedWriteBatch,
    mvcc: &Keyspace,
    ops: impl IntoIterator<Item = (&'a [u8], &'a Option<Vec<u8>>)>,
    ht: HybridTime,
    key_buf: &mut Vec<u8>,
) -> u64 {
    let mut last: BTreeMap<&[u8], &Option<Vec<u8>>> = BTreeMap::new();
    for (k, v) in ops {
        last.insert(k, v);
    }
    let mut n = 0;
    for (k, v) in last {
        key_buf.clear();
        keys::encode_into(key_buf, k, ht);
        batch.insert(mvcc, key_buf.clone(), encode_value(v.as_deref()));
        n += 1;
    }
    n
}

/// The newest version of `key` with ht ≤ `at` (newest of all for `None`), by one seek.
pub(super) fn get(mvcc: &Keyspace, key: &[u8], at: Option<HybridTime>) -> Result<Option<Version>> {
    if keys::encoded_len(key) > keys::MAX_ENCODED_LEN {
        // Never stored (`check_record`), and fjall asserts on such a seek key.
        return Ok(None);
    }
    let (lo, hi) = keys::visible_range(key, at.unwrap_or(HybridTime::MAX));
    let Some(g) = mvcc.range(lo..hi).next() else {
        return Ok(None);
    };
    let (k, v) = g.into_inner().map_err(Error::store("read mvcc"))?;
    let (_, ht) = keys::split(&k)?;
    let value = decode_value(&v)
        .map_err(|r| Error::corrupt(MVCC, format!("key {} at ht {ht}", key.escape_ascii()), r))?;
    Ok(Some(Version { value, ht }))
}

/// Per user key starting with `prefix`, ascending, the version visible at `at`, skipping
/// keys whose visible version is a delete; at most `limit` entries and whether more visible
/// keys follow. Reads one consistent snapshot of `db`.
pub(super) fn scan(
    db: &Database,
    mvcc: &Keyspace,
    prefix: &[u8],
    at: HybridTime,
    limit: usize,
) -> Result<(Vec<Row>, bool)> {
    if keys::encoded_len(prefix) > keys::MAX_ENCODED_LEN {
        // No stored key is that long (`check_record`), and fjall asserts on such a bound.
        return Ok((Vec::new(), false));
    }
    let snap = db.snapshot();
    let (start, end) = keys::prefix_range(prefix);
    let mut iter = snap.range(mvcc, (start, end.clone()));
    let mut out = Vec::new();
    // Encoded user key (`escape ‖ 00 01`) whose visible version was already taken.
    let mut done: Option<Vec<u8>> = None;
    // Invisible versions stepped over in a row for one key.
    let mut stepped = 0usize;
    while let Some(g) = iter.next() {
        let (k, v) = g.into_inner().map_err(Error::store("scan mvcc"))?;
        let (user, ht) = keys::split(&k)?;
        let finished = done.as_deref() == Some(user);
        if finished || ht > at {
            stepped += 1;
            if stepped >= RESEEK_AFTER {
                stepped = 0;
                let mut from = user.to_vec();
                if finished {
                    // Past every version of this key: escape ‖ 00 02.
                    if let Some(last) = from.last_mut() {
                        *last += 1;
                    }
                } else {
                    from.extend_from_slice(&(!at.0).to_be_bytes());
                }
                iter = snap.range(mvcc, (Bound::Included(from), end.clone()));
            }
            continue;
        }
        stepped = 0;
        done = Some(user.to_vec());
        let value = decode_value(&v)
            .map_err(|r| Error::corrupt(MVCC, format!("key {} at ht {ht}", k.escape_ascii()), r))?;
        let Some(value) = value else { continue };
        if out.len() >= limit {
            return Ok((out, true));
        }
        let (key, _) = keys::decode(&k)?;
        out.push((key, value, ht));
    }
    Ok((out, false))
}
