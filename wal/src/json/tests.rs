#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::write::push_json_str;
use super::*;
use crate::ids::{Gtid, TabletId, TrxId, TxnId};
use crate::pos::WalPos;
use crate::record::{Body, Op, Record};
use crate::time::HybridTime;

fn t(s: &str) -> TabletId {
    s.parse().unwrap()
}

fn err(line: &str) -> String {
    match from_json_line(line) {
        Ok(r) => panic!("{line} parsed as {r:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_err(line: &str, want: &str) {
    let e = err(line);
    assert!(
        e.contains(want),
        "error for {line}\n  was:  {e}\n  want: …{want}…"
    );
}

const TXN: &str = "0123456789abcdef0011223344556677";

#[test]
fn ht_now_is_the_callers_clock_for_the_lines_tablet() {
    let line = r#"{"tablet":"t7","kind":"heartbeat","ht":"now"}"#;
    let mut asked = Vec::new();
    let (tablet, rec) = from_json_line_at(line, None, &mut |t| {
        asked.push(t.clone());
        Ok(HybridTime(42))
    })
    .unwrap();
    assert_eq!((tablet, rec.ht), (t("t7"), HybridTime(42)));
    assert_eq!(asked, vec![t("t7")]);
    // Without a clock of the caller's: the wall clock, logical 0.
    let before = HybridTime::from_system_time(std::time::SystemTime::now());
    let (_, rec) = from_json_line(line).unwrap();
    assert!(rec.ht >= before && rec.ht.logical() == 0, "{:?}", rec.ht);
    // The clock's refusal is the ht field's error; other words stay errors.
    let e = from_json_line_at(line, None, &mut |_| Err("behind the log".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("ht") && e.contains("behind the log"), "{e}");
    assert_err(r#"{"tablet":"t1","kind":"heartbeat","ht":"later"}"#, "`ht`");
}

#[test]
fn golden_lines_have_the_documented_field_order() {
    let txn = TxnId::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
    let cases = [
        (
            Record::new(
                HybridTime(7300),
                Body::Intent {
                    txn,
                    trx_id: Some(TrxId::new(7, 3)),
                    ops: vec![Op::put("k", "v"), Op::delete(vec![0xff, 0x00]), Op::put("", "")],
                },
            ),
            format!(
                r#"{{"tablet":"t1","pos":4096,"kind":"intent","ht":"7300","txn":"{TXN}","trx_id":"7:3","ops":[{{"key":"k","value":"v"}},{{"key":{{"b64":"/wA="}},"value":null}},{{"key":"","value":""}}]}}"#
            ),
        ),
        (
            Record::new(
                HybridTime(u64::MAX),
                Body::Commit {
                    txn,
                    participants: vec![t("t1"), t("t2")],
                    trx_id: Some(TrxId::new(7, 3)),
                    gtid: Some(Gtid::new(0, 1, 9)),
                },
            ),
            format!(
                r#"{{"tablet":"t1","pos":4096,"kind":"commit","ht":"18446744073709551615","txn":"{TXN}","trx_id":"7:3","gtid":"0-1-9","participants":["t1","t2"]}}"#
            ),
        ),
        (
            Record::new(
                HybridTime(0),
                Body::Commit {
                    txn,
                    participants: vec![],
                    trx_id: None,
                    gtid: None,
                },
            ),
            format!(r#"{{"tablet":"t1","pos":4096,"kind":"commit","ht":"0","txn":"{TXN}","participants":[]}}"#),
        ),
        (
            Record::new(
                HybridTime(5),
                Body::Write {
                    ops: vec![],
                    trx_id: None,
                    gtid: Some(Gtid::new(1, 2, 3)),
                },
            ),
            r#"{"tablet":"t1","pos":4096,"kind":"write","ht":"5","gtid":"1-2-3","ops":[]}"#.to_owned(),
        ),
        (
            Record::new(
                HybridTime(10),
                Body::Write {
                    ops: vec![Op::put("k", vec![0x80])],
                    trx_id: Some(TrxId::new(u64::MAX, 1)),
                    gtid: Some(Gtid::new(u32::MAX, 0, u64::MAX)),
                },
            ),
            r#"{"tablet":"t1","pos":4096,"kind":"write","ht":"10","trx_id":"18446744073709551615:1","gtid":"4294967295-0-18446744073709551615","ops":[{"key":"k","value":{"b64":"gA=="}}]}"#.to_owned(),
        ),
        (
            Record::new(
                HybridTime(6),
                Body::Abort {
                    txn,
                    trx_id: None,
                },
            ),
            format!(r#"{{"tablet":"t1","pos":4096,"kind":"abort","ht":"6","txn":"{TXN}"}}"#),
        ),
        (
            Record::new(HybridTime(8), Body::Heartbeat),
            r#"{"tablet":"t1","pos":4096,"kind":"heartbeat","ht":"8"}"#.to_owned(),
        ),
        (
            Record::new(
                HybridTime(9),
                Body::Write {
                    ops: vec![Op::put("a\"b\\c\n\u{1}é", "\t")],
                    trx_id: None,
                    gtid: None,
                },
            ),
            r#"{"tablet":"t1","pos":4096,"kind":"write","ht":"9","ops":[{"key":"a\"b\\c\n\u0001é","value":"\t"}]}"#
                .to_owned(),
        ),
    ];
    for (rec, want) in cases {
        let line = to_json_line(&t("t1"), WalPos(4096), &rec);
        assert_eq!(line, want);
        assert_eq!(from_json_line(&line).unwrap(), (t("t1"), rec));
    }
}

#[test]
fn write_json_line_appends() {
    let mut s = String::from("x");
    write_json_line(
        &mut s,
        &t("a"),
        WalPos(1),
        &Record::new(HybridTime(2), Body::Heartbeat),
    );
    assert_eq!(s, r#"x{"tablet":"a","pos":1,"kind":"heartbeat","ht":"2"}"#);
}

#[test]
fn input_accepts_integer_ht_any_field_order_b64_for_utf8_and_ignores_pos() {
    let line = r#" {"ops":[{"value":{"b64":"aGk="},"key":{"b64":""}}],"ht":42,"kind":"write","tablet":"t9","pos":"whatever","trx_id":null} "#;
    let (tablet, rec) = from_json_line(line).unwrap();
    assert_eq!(tablet, t("t9"));
    assert_eq!(
        rec,
        Record::new(
            HybridTime(42),
            Body::Write {
                ops: vec![Op::put("", "hi")],
                trx_id: None,
                gtid: None,
            }
        )
    );
    let (_, rec) = from_json_line(r#"{"tablet":"t","kind":"heartbeat","ht":"42"}"#).unwrap();
    assert_eq!(rec.ht, HybridTime(42));
    let (_, rec) = from_json_line(&format!(
        r#"{{"tablet":"t","kind":"heartbeat","ht":{}}}"#,
        u64::MAX
    ))
    .unwrap();
    assert_eq!(rec.ht, HybridTime::MAX);
}

#[test]
fn unknown_and_repeated_fields_are_refused_by_name() {
    assert_eq!(
        err(r#"{"tablet":"t","kind":"heartbeat","ht":"1","colour":"red"}"#),
        "unknown field `colour`; expected one of tablet, pos, kind, ht, txn, trx_id, gtid, participants, ops"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"heartbeat","ht":"1","ht":"2"}"#),
        "field `ht` appears more than once"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1","ops":[{"key":"k","value":"v","ttl":3}]}"#),
        "field `ops[0]`: unknown field `ttl`; an op has only `key` and `value`"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1","ops":[{"key":"k","key":"j","value":"v"}]}"#),
        "field `ops[0]`: field `key` appears more than once"
    );
    let long = "x".repeat(10_000);
    let e = err(&format!(r#"{{"{long}":1}}"#));
    assert!(e.len() < 200, "{e}");
}

#[test]
fn fields_on_the_wrong_kind_are_refused() {
    assert_eq!(
        err(r#"{"tablet":"t","kind":"heartbeat","ht":"1","ops":[]}"#),
        "field `ops`: not allowed on a heartbeat record"
    );
    assert_eq!(
        err(&format!(
            r#"{{"tablet":"t","kind":"intent","ht":"1","txn":"{TXN}","gtid":"0-1-2","ops":[]}}"#
        )),
        "field `gtid`: not allowed on an intent record"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1","txn":"00","ops":[]}"#),
        "field `txn`: not allowed on a write record"
    );
    assert_eq!(
        err(&format!(
            r#"{{"tablet":"t","kind":"abort","ht":"1","txn":"{TXN}","participants":[]}}"#
        )),
        "field `participants`: not allowed on an abort record"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"heartbeat","ht":"1","trx_id":null}"#),
        "field `trx_id`: not allowed on a heartbeat record"
    );
    assert_eq!(
        err(&format!(
            r#"{{"tablet":"t","kind":"commit","ht":"1","txn":"{TXN}","participants":[],"ops":[]}}"#
        )),
        "field `ops`: not allowed on a commit record"
    );
}

#[test]
fn missing_required_fields_are_named() {
    assert_eq!(
        err(r#"{"tablet":"t","kind":"heartbeat"}"#),
        "missing field `ht` (required on every record)"
    );
    assert_eq!(
        err(r#"{"kind":"heartbeat","ht":"1"}"#),
        "missing field `tablet` (required on every record)"
    );
    assert_eq!(
        err(r#"{"tablet":"t","ht":"1"}"#),
        "missing field `kind` (required on every record)"
    );
    assert_eq!(err("{}"), "missing field `kind` (required on every record)");
    assert_eq!(
        err(r#"{"tablet":"t","kind":"intent","ht":"1","ops":[]}"#),
        "missing field `txn` (required on an intent record)"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"abort","ht":"1"}"#),
        "missing field `txn` (required on an abort record)"
    );
    assert_eq!(
        err(&format!(
            r#"{{"tablet":"t","kind":"commit","ht":"1","txn":"{TXN}"}}"#
        )),
        "missing field `participants` (required on a commit record)"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1"}"#),
        "missing field `ops` (required on a write record)"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1","ops":[{"key":"k"}]}"#),
        "field `ops[0]`: missing field `value` (use \"value\": null to delete the key)"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1","ops":[{"value":"v"}]}"#),
        "field `ops[0]`: missing field `key`"
    );
}

#[test]
fn bad_values_use_the_id_parse_errors() {
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1","trx_id":"7","ops":[]}"#),
        "field `trx_id`: invalid trx id \"7\": expected <connect_id>:<commit_counter>"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1","trx_id":"7:0","ops":[]}"#),
        "field `trx_id`: invalid trx id \"7:0\": commit_counter starts at 1"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1","trx_id":7,"ops":[]}"#),
        "field `trx_id`: expected a string, got a number"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1","gtid":"0-1","ops":[]}"#),
        "field `gtid`: invalid gtid \"0-1\": expected <domain>-<server>-<seq>"
    );
    assert_eq!(
        err(r#"{"tablet":"a/b","kind":"heartbeat","ht":"1"}"#),
        "field `tablet`: invalid tablet id \"a/b\": character '/' at byte 1 is not one of [A-Za-z0-9_.-]"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"abort","ht":"1","txn":"0123"}"#),
        "field `txn`: invalid txn id \"0123\": 4 characters; expected 32 hex digits"
    );
    assert_eq!(
        err(&format!(
            r#"{{"tablet":"t","kind":"commit","ht":"1","txn":"{TXN}","participants":["ok",".."]}}"#
        )),
        "field `participants[1]`: invalid tablet id \"..\": `.` and `..` are not tablet ids"
    );
    assert_eq!(
        err(&format!(
            r#"{{"tablet":"t","kind":"commit","ht":"1","txn":"{TXN}","participants":"t1"}}"#
        )),
        "field `participants`: expected an array of tablet ids, got a string"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"merge","ht":"1"}"#),
        "field `kind`: unknown record kind \"merge\"; expected one of write, intent, commit, abort, heartbeat"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1","ops":{}}"#),
        "field `ops`: expected an array of {\"key\": …, \"value\": …} objects, got an object"
    );
    assert_eq!(
        err(r#"{"tablet":"t","kind":"write","ht":"1","ops":[3]}"#),
        "field `ops[0]`: expected an object {\"key\": …, \"value\": …}, got a number"
    );
}

#[test]
fn bad_hybrid_times_are_explained() {
    let hb = |ht: &str| format!(r#"{{"tablet":"t","kind":"heartbeat","ht":{ht}}}"#);
    assert_eq!(
        err(&hb(r#""12a""#)),
        "field `ht`: invalid hybrid time \"12a\": expected a decimal u64 (physical_us << 12 | logical)"
    );
    assert_eq!(err(&hb("-3")), "field `ht`: hybrid time -3 is negative");
    assert_contains(
        &err(&hb("1.5")),
        "field `ht`: hybrid time 1.5 is not an integer",
    );
    assert_contains(
        &err(&hb("18446744073709551616")),
        "not an integer (or is too large)",
    );
    assert_contains(
        &err(&hb(r#""18446744073709551616""#)),
        "out of range for u64",
    );
    assert_eq!(
        err(&hb("true")),
        "field `ht`: expected a hybrid time as a decimal string or a non-negative integer, got a boolean"
    );
    assert_eq!(
        err(&hb("null")),
        "field `ht`: expected a hybrid time as a decimal string or a non-negative integer, got null"
    );
}

fn assert_contains(haystack: &str, needle: &str) {
    assert!(
        haystack.contains(needle),
        "{haystack:?} does not contain {needle:?}"
    );
}

#[test]
fn keys_and_values_must_be_strings_or_b64() {
    let op = |o: &str| format!(r#"{{"tablet":"t","kind":"write","ht":"1","ops":[{o}]}}"#);
    assert_eq!(
        err(&op(r#"{"key":5,"value":"v"}"#)),
        "field `ops[0].key`: expected a UTF-8 string or {\"b64\": \"<base64>\"}, got a number"
    );
    assert_eq!(
        err(&op(r#"{"key":[1,2],"value":"v"}"#)),
        "field `ops[0].key`: expected a UTF-8 string or {\"b64\": \"<base64>\"}, got an array"
    );
    assert_eq!(
        err(&op(r#"{"key":null,"value":"v"}"#)),
        "field `ops[0].key`: a key cannot be null"
    );
    assert_eq!(
        err(&op(r#"{"key":{"hex":"00"},"value":"v"}"#)),
        "field `ops[0].key`: expected a UTF-8 string or {\"b64\": \"<base64>\"}, got an object with fields `hex`"
    );
    assert_eq!(
        err(&op(r#"{"key":{},"value":"v"}"#)),
        "field `ops[0].key`: expected a UTF-8 string or {\"b64\": \"<base64>\"}, got an empty object"
    );
    assert_eq!(
        err(&op(r#"{"key":{"b64":"AA==","x":1},"value":"v"}"#)),
        "field `ops[0].key`: expected a UTF-8 string or {\"b64\": \"<base64>\"}, got an object with fields `b64`, `x`"
    );
    assert_eq!(
        err(&op(r#"{"key":"k","value":true}"#)),
        "field `ops[0].value`: expected a UTF-8 string or {\"b64\": \"<base64>\"}, got a boolean"
    );
    assert_eq!(
        err(&op(r#"{"key":"k","value":{"b64":7}}"#)),
        "field `ops[0].value`: `b64` must be a base64 string, got a number"
    );
    // Malformed base64: bad character, missing padding, bad length, trailing bits.
    for bad in ["@@@@", "AA", "AAA", "AB==", "AA=", "A"] {
        let e = err(&op(&format!(r#"{{"key":"k","value":{{"b64":"{bad}"}}}}"#)));
        assert!(
            e.starts_with("field `ops[0].value`: invalid base64 in `b64`: "),
            "{bad}: {e}"
        );
    }
    let e = err(&op(
        r#"{"key":"k","value":"v"},{"key":{"b64":"!"},"value":null}"#,
    ));
    assert!(e.starts_with("field `ops[1].key`: invalid base64"), "{e}");
}

#[test]
fn non_json_and_non_objects_are_refused() {
    for (line, want) in [
        ("", "not JSON: EOF while parsing a value"),
        ("hello", "not JSON: expected value at line 1 column 1"),
        (r#"{"tablet":"t""#, "not JSON: "),
        (
            r#"{"tablet":"t","kind":"heartbeat","ht":"1"} {}"#,
            "not JSON: trailing characters",
        ),
        (r#"{"ht":"\ud800"}"#, "not JSON: "),
        ("[1,2]", "not a JSON object: the line is an array"),
        ("\"x\"", "not a JSON object: the line is a string"),
        ("42", "not a JSON object: the line is a number"),
        ("null", "not a JSON object: the line is null"),
    ] {
        assert_err(line, want);
    }
    // serde_json's recursion limit keeps deep nesting an error, not a stack overflow.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_err(&deep, "not JSON: recursion limit exceeded");
}

#[test]
fn escaping_matches_serde_json_for_every_ascii_byte() {
    let all: String = (0u8..0x80).map(char::from).collect();
    let mut out = String::new();
    push_json_str(&mut out, &all);
    assert_eq!(out, serde_json::to_string(&all).unwrap());
}

// The round trip of every record kind and the never-panics of arbitrary and mutated
// lines are fuzz properties in `wal/tests/fuzz.rs` (short runs in CI, 100 000 cases in
// the long form).
proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn escaping_matches_serde_json(s in any::<String>()) {
        let mut out = String::new();
        push_json_str(&mut out, &s);
        prop_assert_eq!(out, serde_json::to_string(&s).unwrap());
    }
}
