//! The JSON object of a `trx_status` answer, the one shape every front end gives it: the
//! admin API's `GET /v1/trx/{id}` and the SQL endpoint's `trx_status_json(…)`. Hybrid
//! times and ids are decimal strings, absent fields `null`, keys in alphabetical order.

use tidelog_wal::{Gtid, TxnId};

use crate::trx::TrxStatus;

/// A value shown with its `Display`, serialized as a JSON string without an intermediate
/// `String`.
#[derive(Debug)]
struct Shown<T>(T);

impl<T: std::fmt::Display> serde::Serialize for Shown<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

/// The JSON of a `trx_status` answer, serialized straight from the answer (no `Value`
/// tree: this is what clients poll after a failure). Fields in alphabetical order, as
/// every other object the admin API renders through `serde_json::Value`.
#[derive(Debug, serde::Serialize)]
pub struct TrxJson<'a> {
    caught_up: bool,
    commit_ht: Option<Shown<u64>>,
    connect_id: Option<Shown<u64>>,
    gtid: Option<Shown<Gtid>>,
    reason: Option<&'a str>,
    safe_time: Option<Shown<u64>>,
    state: &'static str,
    trx_id: &'a str,
    txn: Option<Shown<TxnId>>,
    waits_for: Option<&'a str>,
}

/// The JSON view of `a`.
pub fn trx_json(a: &TrxStatus) -> TrxJson<'_> {
    TrxJson {
        caught_up: a.caught_up,
        commit_ht: a.commit_ht.map(|h| Shown(h.0)),
        connect_id: a.connect_id.map(Shown),
        gtid: a.gtid.map(Shown),
        reason: a.reason.as_deref(),
        safe_time: a.safe_time.map(|h| Shown(h.0)),
        state: a.state.name(),
        trx_id: &a.trx_id,
        txn: a.txn.map(Shown),
        waits_for: a.waits_for.as_deref(),
    }
}

/// The JSON text of `a`.
pub fn trx_json_string(a: &TrxStatus) -> String {
    // Serializing these plain fields cannot fail; an empty object would be the answer if
    // it ever did.
    serde_json::to_string(&trx_json(a)).unwrap_or_else(|_| "{}".to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::trx::TrxState;
    use serde_json::{json, Value};
    use tidelog_wal::HybridTime;

    /// The answer's JSON carries every field, absent ones as `null`, with ids and hybrid
    /// times as strings (the shape `tidelog ctl trx-status --json` and clients parse).
    #[test]
    fn trx_json_has_every_field_as_strings_or_null() {
        let g = Gtid {
            domain: 3,
            server: 7,
            seq: 42,
        };
        let txn = tidelog_wal::TxnId::from_u128(0xabc);
        let a = TrxStatus {
            trx_id: "12:34".into(),
            state: TrxState::Committed,
            reason: None,
            gtid: Some(g),
            commit_ht: Some(HybridTime(u64::MAX - 1)),
            connect_id: Some(12),
            txn: Some(txn),
            waits_for: None,
            safe_time: Some(HybridTime(99)),
            caught_up: true,
        };
        let got: Value =
            serde_json::from_slice(&serde_json::to_vec(&trx_json(&a)).unwrap()).unwrap();
        let want = json!({
            "trx_id": "12:34",
            "state": "COMMITTED",
            "reason": null,
            "gtid": g.to_string(),
            "commit_ht": (u64::MAX - 1).to_string(),
            "connect_id": "12",
            "txn": txn.to_string(),
            "waits_for": null,
            "safe_time": "99",
            "caught_up": true,
        });
        assert_eq!(got, want);
        assert_eq!(
            serde_json::from_str::<Value>(&trx_json_string(&a)).unwrap(),
            want
        );
        let u = TrxStatus {
            state: TrxState::Unknown,
            reason: Some("never seen".into()),
            gtid: None,
            commit_ht: None,
            connect_id: None,
            txn: None,
            waits_for: Some("x".into()),
            safe_time: None,
            caught_up: false,
            ..a
        };
        let got: Value =
            serde_json::from_slice(&serde_json::to_vec(&trx_json(&u)).unwrap()).unwrap();
        assert_eq!(got["reason"], "never seen");
        assert_eq!(got["waits_for"], "x");
        for k in ["gtid", "commit_ht", "connect_id", "txn", "safe_time"] {
            assert!(got[k].is_null(), "{k}: {got}");
        }
        assert_eq!(got.as_object().unwrap().len(), 10);
    }
}
