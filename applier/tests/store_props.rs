//! Property test of `Store` reads against a model: random write records applied in random
//! batches, then `get` at random times and `scan` with random prefixes, times and limits.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use tidelog_applier::store::{Durability, Store};
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::*;

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![Just(0u8), Just(1), Just(b'a'), Just(0xFF)],
        0..4,
    )
}

fn op() -> impl Strategy<Value = Op> {
    (
        key(),
        prop::option::weighted(0.8, prop::collection::vec(any::<u8>(), 0..4)),
    )
        .prop_map(|(key, value)| Op { key, value })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn reads_match_model(
        recs in prop::collection::vec((1u64..4, prop::collection::vec(op(), 0..4)), 1..80),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        probes in prop::collection::vec((key(), 0u64..300, 0usize..6), 1..20),
    ) {
        let tablet: TabletId = "p".parse().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        // Place records like a log: strictly increasing ht, contiguous positions.
        let mut ht = 0;
        let mut pos = WalPos(0);
        let mut placed = Vec::new();
        for (gap, ops) in recs {
            ht += gap;
            let r = Record::new(HybridTime(ht), Body::Write { ops, trx_id: None, gtid: None });
            let len = (RECORD_HEADER_LEN + r.encoded_body_len().unwrap()) as u64;
            placed.push((pos, r));
            pos = pos.add(len);
        }
        let end = pos;
        // Apply in random batches.
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c.index(placed.len())).collect();
        bounds.push(placed.len());
        bounds.sort();
        let mut from = 0;
        for b in bounds {
            if b <= from { continue; }
            let e = placed.get(b).map_or(end, |p| p.0);
            s.apply(&tablet, &placed[from..b], e, Durability::Buffered).unwrap();
            from = b;
        }
        // Model: key -> ht -> value (last op of a record wins).
        let mut m: BTreeMap<Vec<u8>, BTreeMap<u64, Option<Vec<u8>>>> = BTreeMap::new();
        for (_, r) in &placed {
            for op in r.ops() {
                m.entry(op.key.clone()).or_default().insert(r.ht.0, op.value.clone());
            }
        }
        for (k, at, limit) in probes {
            let at_ht = (at < 250).then_some(HybridTime(at));
            let want = m.get(&k).and_then(|vs| {
                vs.range(..=at_ht.map_or(u64::MAX, |h| h.0)).next_back()
            });
            let got = s.get(&k, at_ht).unwrap();
            prop_assert_eq!(got.map(|v| (v.ht.0, v.value)), want.map(|(h, v)| (*h, v.clone())));
            // Scan with k as the prefix.
            let visible: Vec<_> = m
                .iter()
                .filter(|(key, _)| key.starts_with(&k))
                .filter_map(|(key, vs)| {
                    let (h, v) = vs.range(..=at_ht.map_or(u64::MAX, |h| h.0)).next_back()?;
                    v.as_ref().map(|v| (key.clone(), v.clone(), HybridTime(*h)))
                })
                .collect();
            let (rows, more) = s.scan(&k, at_ht, limit).unwrap();
            prop_assert_eq!(&rows[..], &visible[..limit.min(visible.len())]);
            prop_assert_eq!(more, visible.len() > limit);
        }
    }
}
