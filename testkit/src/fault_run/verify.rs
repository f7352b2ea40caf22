//! Exactly once, checked after the run: the source WALs replayed here against what the
//! target serves.
//!
//! * **State**: every key of a consistent read of everything equals the source's committed
//!   state (each `write` at its ht, each committed transaction's intents at its
//!   commit_ht), key by key.
//! * **Records**: each tablet applied every record of its source WAL once
//!   (`applied_records` counts a record applied twice twice) and up to its end.
//! * **Commits**: the target's binlog holds every commit of the source (by commit_ht,
//!   trx_id and gtid) and nothing else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use anyhow::{bail, Context, Result};
use base64::Engine;
use serde_json::Value;
use tidelog_wal::{Body, ReadLimit, Reader, TabletId};

use crate::api::Api;

/// One commit: a `write` with a trx_id or gtid, or a `commit`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Commit {
    pub ht: u64,
    pub trx_id: String,
    pub gtid: String,
}

/// What the source WALs hold.
#[derive(Debug, Default)]
pub struct Source {
    /// The committed state: key → value.
    pub state: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Records per tablet.
    pub records: BTreeMap<TabletId, u64>,
    /// Every commit, in commit_ht order.
    pub commits: Vec<Commit>,
}

/// Replays every tablet's WAL under `wal` from its first record. An error if one no longer
/// starts at position 0 (retention removed its beginning: the replay would be partial).
pub fn replay(wal: &Path) -> Result<Source> {
    let mut src = Source::default();
    let mut intents: HashMap<[u8; 16], Vec<tidelog_wal::Op>> = HashMap::new();
    let mut versions: Vec<(u64, tidelog_wal::Op)> = Vec::new();
    let mut decided: Vec<(u64, [u8; 16])> = Vec::new();
    for t in tidelog_wal::reader::list_tablets(wal)? {
        let segments = tidelog_wal::reader::list_segments(&wal.join(t.as_str()))?;
        if let Some((first, _)) = segments.first().filter(|(p, _)| p.0 > 0) {
            bail!(
                "the source WAL of tablet {t} starts at position {first}: retention removed its \
                 beginning, so it cannot be replayed whole (use larger source segments)"
            );
        }
        let mut n = 0u64;
        for r in Reader::open(wal, &t, ReadLimit::Durable)? {
            let (_, rec) = r.with_context(|| format!("reading the source WAL of {t}"))?;
            n += 1;
            let ht = rec.ht.0;
            let commit = Commit {
                ht,
                trx_id: rec.trx_id().map(|x| x.to_string()).unwrap_or_default(),
                gtid: rec.gtid().map(|g| g.to_string()).unwrap_or_default(),
            };
            match rec.body {
                Body::Write { ops, trx_id, gtid } => {
                    if trx_id.is_some() || gtid.is_some() {
                        src.commits.push(commit);
                    }
                    versions.extend(ops.into_iter().map(|o| (ht, o)));
                }
                Body::Intent { txn, ops, .. } => intents.entry(txn.0).or_default().extend(ops),
                Body::Commit { txn, .. } => {
                    src.commits.push(commit);
                    decided.push((ht, txn.0));
                }
                Body::Abort { .. } | Body::Heartbeat => {}
            }
        }
        src.records.insert(t, n);
    }
    for (ht, txn) in decided {
        versions.extend(
            intents
                .remove(&txn)
                .unwrap_or_default()
                .into_iter()
                .map(|o| (ht, o)),
        );
    }
    // Stable: within one ht (one record or one transaction) the later op wins.
    versions.sort_by_key(|(ht, _)| *ht);
    for (_, o) in versions {
        match o.value {
            Some(v) => src.state.insert(o.key, v),
            None => src.state.remove(&o.key),
        };
    }
    src.commits.sort();
    Ok(src)
}

/// Keys and values of the admin API: a UTF-8 string or `{"b64": "..."}`.
fn json_bytes(v: &Value) -> Result<Vec<u8>> {
    match v {
        Value::String(s) => Ok(s.clone().into_bytes()),
        Value::Object(o) => {
            let b = o
                .get("b64")
                .and_then(Value::as_str)
                .with_context(|| format!("not bytes: {v}"))?;
            Ok(base64::engine::general_purpose::STANDARD.decode(b)?)
        }
        _ => bail!("not bytes: {v}"),
    }
}

/// Everything a consistent read sees (`GET /v1/scan?prefix=`), as key → value.
pub fn target_state(api: &Api) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let (st, v) = api.get("/v1/scan?prefix=&limit=100000")?;
    if st != 200 {
        bail!("consistent scan of everything: {st} {v}");
    }
    if v["more"] != false {
        bail!("consistent scan of everything: more than 100 000 keys, not compared");
    }
    let mut out = BTreeMap::new();
    for i in v["items"].as_array().context("scan without items")? {
        out.insert(json_bytes(&i["key"])?, json_bytes(&i["value"])?);
    }
    Ok(out)
}

/// How the target's state differs from the source's.
#[derive(Debug, Default)]
pub struct StateDiff {
    /// Keys compared (on either side).
    pub compared: usize,
    /// Keys that differ (missing, extra or another value).
    pub differing: usize,
    /// The first few, described.
    pub examples: Vec<String>,
}

pub fn diff_state(
    source: &BTreeMap<Vec<u8>, Vec<u8>>,
    target: &BTreeMap<Vec<u8>, Vec<u8>>,
) -> StateDiff {
    let keys: BTreeSet<&Vec<u8>> = source.keys().chain(target.keys()).collect();
    let mut d = StateDiff {
        compared: keys.len(),
        ..StateDiff::default()
    };
    for k in keys {
        let (s, t) = (source.get(k), target.get(k));
        if s != t {
            d.differing += 1;
            if d.examples.len() < 5 {
                let show = |v: Option<&Vec<u8>>| {
                    v.map_or("(absent)".to_string(), |v| {
                        format!("{:?}", String::from_utf8_lossy(v))
                    })
                };
                d.examples.push(format!(
                    "{:?}: source {}, target {}",
                    String::from_utf8_lossy(k),
                    show(s),
                    show(t)
                ));
            }
        }
    }
    d
}

/// Every commit of the target's binlog (`GET /v1/binlog`, page by page), in commit order.
pub fn target_binlog(api: &Api) -> Result<Vec<Commit>> {
    const PAGE: usize = 10_000;
    let mut out: Vec<Commit> = Vec::new();
    let mut from: Option<String> = None;
    loop {
        let path = match &from {
            None => format!("/v1/binlog?limit={PAGE}"),
            Some(g) => format!("/v1/binlog?from-gtid={g}&limit={PAGE}"),
        };
        let (st, v) = api.get(&path)?;
        if st != 200 {
            bail!("GET {path}: {st} {v}");
        }
        let entries = v["entries"].as_array().context("binlog without entries")?;
        // A page after the first starts with the entry it was asked from.
        let skip = usize::from(from.is_some());
        for e in entries.iter().skip(skip) {
            out.push(Commit {
                ht: e["commit_ht"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .with_context(|| format!("binlog entry without commit_ht: {e}"))?,
                trx_id: e["trx_id"].as_str().unwrap_or_default().to_string(),
                gtid: e["gtid"].as_str().unwrap_or_default().to_string(),
            });
        }
        if v["more"] != true || entries.len() <= skip {
            break;
        }
        let last = out.last().context("binlog page without entries")?;
        if last.gtid.is_empty() {
            bail!("binlog entry at {} has no gtid to read on from", last.ht);
        }
        from = Some(last.gtid.clone());
    }
    out.sort();
    Ok(out)
}

/// Source commits the target lacks, and target commits the source never made.
pub fn diff_commits(source: &[Commit], target: &[Commit]) -> (Vec<Commit>, Vec<Commit>) {
    let s: BTreeSet<&Commit> = source.iter().collect();
    let t: BTreeSet<&Commit> = target.iter().collect();
    (
        s.difference(&t).map(|c| (*c).clone()).collect(),
        t.difference(&s).map(|c| (*c).clone()).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidelog_wal::{HybridTime, Op, Record, SyncPolicy, TxnId, WalOptions, Writer};

    fn commit(ht: u64, g: u64) -> Commit {
        Commit {
            ht,
            trx_id: format!("1:{g}"),
            gtid: format!("0-1-{g}"),
        }
    }

    #[test]
    fn replay_applies_writes_and_committed_intents_only_and_counts_records() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b): (TabletId, TabletId) = ("a".parse().unwrap(), "b".parse().unwrap());
        let mut wa = Writer::open(dir.path(), &a, WalOptions::default()).unwrap();
        let mut wb = Writer::open(dir.path(), &b, WalOptions::default()).unwrap();
        let base = HybridTime::from_system_time(std::time::SystemTime::now()).0;
        let ht = |i: u64| HybridTime(base + i);
        let (t1, t2) = (TxnId([1; 16]), TxnId([2; 16]));
        wa.append(&Record::new(
            ht(1),
            Body::Write {
                ops: vec![Op::put("k1", "v1"), Op::put("k2", "v2")],
                trx_id: None,
                gtid: Some("0-1-1".parse().unwrap()),
            },
        ))
        .unwrap();
        wb.append(&Record::new(
            ht(2),
            Body::Intent {
                txn: t1,
                trx_id: None,
                ops: vec![Op::put("k3", "committed"), Op::delete("k1")],
            },
        ))
        .unwrap();
        wb.append(&Record::new(
            ht(3),
            Body::Intent {
                txn: t2,
                trx_id: None,
                ops: vec![Op::put("k4", "aborted")],
            },
        ))
        .unwrap();
        wa.append(&Record::new(
            ht(4),
            Body::Commit {
                txn: t1,
                participants: vec![a.clone(), b.clone()],
                trx_id: None,
                gtid: Some("0-1-2".parse().unwrap()),
            },
        ))
        .unwrap();
        wa.append(&Record::new(
            ht(5),
            Body::Abort {
                txn: t2,
                trx_id: None,
            },
        ))
        .unwrap();
        wa.commit(SyncPolicy::Always).unwrap();
        wb.commit(SyncPolicy::Always).unwrap();
        let s = replay(dir.path()).unwrap();
        let state: Vec<(&[u8], &[u8])> = s
            .state
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
            .collect();
        assert_eq!(
            state,
            vec![(&b"k2"[..], &b"v2"[..]), (&b"k3"[..], &b"committed"[..])]
        );
        assert_eq!(s.records[&a], 3);
        assert_eq!(s.records[&b], 2);
        let gtids: Vec<&str> = s.commits.iter().map(|c| c.gtid.as_str()).collect();
        assert_eq!(gtids, ["0-1-1", "0-1-2"]);
    }

    #[test]
    fn a_missing_extra_or_changed_key_or_commit_is_found() {
        let m = |kv: &[(&str, &str)]| -> BTreeMap<Vec<u8>, Vec<u8>> {
            kv.iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect()
        };
        let src = m(&[("a", "1"), ("b", "2"), ("c", "3")]);
        assert_eq!(diff_state(&src, &src.clone()).differing, 0);
        let d = diff_state(&src, &m(&[("a", "1"), ("b", "9"), ("d", "4")]));
        assert_eq!((d.compared, d.differing), (4, 3), "{:?}", d.examples);
        let (s, t) = (
            vec![commit(1, 1), commit(2, 2)],
            vec![commit(2, 2), commit(3, 3)],
        );
        assert_eq!(
            diff_commits(&s, &t),
            (vec![commit(1, 1)], vec![commit(3, 3)])
        );
        assert_eq!(diff_commits(&s, &s), (vec![], vec![]));
    }
}
