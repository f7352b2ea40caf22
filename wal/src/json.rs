//! The JSON form of a record (docs/ARCHITECTURE.md, "The source WAL"), used by `tidelog wal
//! dump|append`.
//!
//! One object per line, fields in this order, each present only where the record's kind has
//! it (optional fields that are absent are omitted):
//!
//! ```text
//! {"tablet":"t1","pos":4096,"kind":"intent","ht":"7300…","txn":"<32 hex>","trx_id":"7:3",
//!  "gtid":"0-1-9","participants":["t1","t2"],"ops":[{"key":"k","value":"v"}]}
//! ```
//!
//! | kind        | fields besides tablet, pos, kind, ht |
//! | ----------- | ------------------------------------ |
//! | `write`     | trx_id?, gtid?, ops                  |
//! | `intent`    | txn, trx_id?, ops                    |
//! | `commit`    | txn, trx_id?, gtid?, participants    |
//! | `abort`     | txn, trx_id?                         |
//! | `heartbeat` | —                                    |
//!
//! * `ht` is written as a decimal string (hybrid times exceed 2^53); on input a decimal
//!   string or a non-negative integer is accepted, and `"now"`: the current hybrid time,
//!   as the caller's clock gives it ([`from_json_line_at`]; [`from_json_line_or`] reads
//!   the wall clock).
//! * `pos` is written on output and ignored on input.
//! * A key or value is a JSON string when its bytes are valid UTF-8, else `{"b64":"…"}`
//!   (standard base64 with padding). Either form is accepted on input. `"value":null`
//!   deletes the key; an empty value is `""`.
//! * `ops` (possibly `[]`) is always written for `write` and `intent`, `participants` always
//!   for `commit`; both are required on input for those kinds.
//! * Input is strict: an unknown or repeated field, a field the kind does not have, a missing
//!   required field or a bad value is an error that names the field. `trx_id` and `gtid` may
//!   be `null` on input, meaning absent.
//!
//! [`to_json_line`] / [`write_json_line`] and [`from_json_line`] are inverse: parsing a line
//! gives back the record, and writing the parsed record (at the same position) reproduces the
//! line byte for byte. Format limits (key and value lengths, participant count) are not
//! checked here; the record encoder checks them.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::format::Kind;
use crate::ids::{Gtid, TabletId, TrxId, TxnId};
use crate::pos::WalPos;
use crate::record::{Body, Op, Record};
use crate::time::HybridTime;

/// Why a line is not a valid JSON record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// The line does not parse as JSON at all.
    #[error("not JSON: {0}")]
    Syntax(String),
    /// The line is JSON but not an object.
    #[error("not a JSON object: the line is {0}")]
    NotAnObject(&'static str),
    /// A field name that no record has.
    #[error("unknown field `{0}`; expected one of tablet, pos, kind, ht, txn, trx_id, gtid, participants, ops")]
    UnknownField(String),
    /// The same field twice in one object.
    #[error("field `{0}` appears more than once")]
    DuplicateField(String),
    /// A field that exists, but not on this kind of record.
    #[error("field `{field}`: not allowed on {} record", with_article(*.kind))]
    NotAllowed { field: &'static str, kind: Kind },
    /// A required field is absent; `required_on` says where it is required.
    #[error("missing field `{field}` (required on {required_on})")]
    Missing {
        field: &'static str,
        required_on: &'static str,
    },
    /// A field is present but its value is wrong; `field` may be a path like `ops[2].key`.
    #[error("field `{field}`: {reason}")]
    Invalid { field: String, reason: String },
}

fn with_article(kind: Kind) -> &'static str {
    match kind {
        Kind::Write => "a write",
        Kind::Intent => "an intent",
        Kind::Commit => "a commit",
        Kind::Abort => "an abort",
        Kind::Heartbeat => "a heartbeat",
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> JsonError {
    JsonError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

/// The JSON line for `rec` at `pos` in `tablet`, without a trailing newline.
#[must_use]
pub fn to_json_line(tablet: &TabletId, pos: WalPos, rec: &Record) -> String {
    let payload: usize = rec
        .ops()
        .iter()
        .map(|op| 24 + op.key.len() + op.value.as_ref().map_or(4, Vec::len))
        .sum();
    let participants = match &rec.body {
        Body::Commit { participants, .. } => {
            participants.iter().map(|p| p.as_str().len() + 3).sum()
        }
        _ => 0,
    };
    let mut out = String::with_capacity(192 + payload + payload / 3 + participants);
    write_json_line(&mut out, tablet, pos, rec);
    out
}

/// Appends the JSON line for `rec` at `pos` in `tablet` to `out`, without a trailing newline.
/// Reusing `out` across records avoids an allocation per record.
pub fn write_json_line(out: &mut String, tablet: &TabletId, pos: WalPos, rec: &Record) {
    // Tablet ids, hybrid times, txn ids, trx ids and gtids are plain ASCII that needs no
    // escaping; only keys and values go through the escaper.
    out.push_str("{\"tablet\":\"");
    out.push_str(tablet.as_str());
    out.push_str("\",\"pos\":");
    push_u64(out, pos.0);
    out.push_str(",\"kind\":\"");
    out.push_str(rec.kind().name());
    out.push_str("\",\"ht\":\"");
    push_u64(out, rec.ht.0);
    out.push('"');
    match &rec.body {
        Body::Write { ops, trx_id, gtid } => {
            push_trx_id(out, trx_id.as_ref());
            push_gtid(out, gtid.as_ref());
            push_ops(out, ops);
        }
        Body::Intent { txn, trx_id, ops } => {
            push_txn(out, txn);
            push_trx_id(out, trx_id.as_ref());
            push_ops(out, ops);
        }
        Body::Commit {
            txn,
            participants,
            trx_id,
            gtid,
        } => {
            push_txn(out, txn);
            push_trx_id(out, trx_id.as_ref());
            push_gtid(out, gtid.as_ref());
            out.push_str(",\"participants\":[");
            for (i, p) in participants.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push('"');
                out.push_str(p.as_str());
                out.push('"');
            }
            out.push(']');
        }
        Body::Abort { txn, trx_id } => {
            push_txn(out, txn);
            push_trx_id(out, trx_id.as_ref());
        }
        Body::Heartbeat => {}
    }
    out.push('}');
}

fn push_u64(out: &mut String, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &buf[i..] {
        out.push(char::from(d));
    }
}

fn push_txn(out: &mut String, txn: &TxnId) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push_str(",\"txn\":\"");
    for b in txn.0 {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
    }
    out.push('"');
}

fn push_trx_id(out: &mut String, trx_id: Option<&TrxId>) {
    if let Some(t) = trx_id {
        out.push_str(",\"trx_id\":\"");
        push_u64(out, t.connect_id);
        out.push(':');
        push_u64(out, t.commit_counter);
        out.push('"');
    }
}

fn push_gtid(out: &mut String, gtid: Option<&Gtid>) {
    if let Some(g) = gtid {
        out.push_str(",\"gtid\":\"");
        push_u64(out, u64::from(g.domain));
        out.push('-');
        push_u64(out, u64::from(g.server));
        out.push('-');
        push_u64(out, g.seq);
        out.push('"');
    }
}

fn push_ops(out: &mut String, ops: &[Op]) {
    out.push_str(",\"ops\":[");
    for (i, op) in ops.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"key\":");
        push_bytes(out, &op.key);
        out.push_str(",\"value\":");
        match &op.value {
            Some(v) => push_bytes(out, v),
            None => out.push_str("null"),
        }
        out.push('}');
    }
    out.push(']');
}

/// A JSON string when `b` is UTF-8, else `{"b64":"…"}`.
fn push_bytes(out: &mut String, b: &[u8]) {
    match std::str::from_utf8(b) {
        Ok(s) => push_json_str(out, s),
        Err(_) => {
            out.push_str("{\"b64\":\"");
            BASE64.encode_string(b, out);
            out.push_str("\"}");
        }
    }
}

/// `s` as a quoted JSON string, escaped exactly as `serde_json` escapes it.
fn push_json_str(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let short = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        // `i` is at an ASCII byte and `start` just after one: both are char boundaries.
        out.push_str(&s[start..i]);
        if short.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        } else {
            out.push_str(short);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

// ---------------------------------------------------------------------------------------------
// Input
// ---------------------------------------------------------------------------------------------

/// A parsed JSON value that, unlike `serde_json::Value`, keeps an object's fields in order
/// and keeps repeated fields, so that a repeated field can be refused.
#[derive(Debug)]
enum J {
    Null,
    Bool,
    U64(u64),
    I64(i64),
    F64(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    fn type_name(&self) -> &'static str {
        match self {
            J::Null => "null",
            J::Bool => "a boolean",
            J::U64(_) | J::I64(_) | J::F64(_) => "a number",
            J::Str(_) => "a string",
            J::Arr(_) => "an array",
            J::Obj(_) => "an object",
        }
    }
}

impl<'de> Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<J, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = J;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_unit<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_none<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_bool<E>(self, _: bool) -> Result<J, E> {
                Ok(J::Bool)
            }
            fn visit_u64<E>(self, v: u64) -> Result<J, E> {
                Ok(J::U64(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<J, E> {
                Ok(J::I64(v))
            }
            fn visit_f64<E>(self, v: f64) -> Result<J, E> {
                Ok(J::F64(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<J, E> {
                Ok(J::Str(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<J, E> {
                Ok(J::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<J, A::Error> {
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(e) = seq.next_element()? {
                    v.push(e);
                }
                Ok(J::Arr(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<J, A::Error> {
                let mut v = Vec::with_capacity(map.size_hint().unwrap_or(0).min(16));
                while let Some(e) = map.next_entry::<String, J>()? {
                    v.push(e);
                }
                Ok(J::Obj(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Top-level field names, in output order.
const FIELDS: [&str; 9] = [
    "tablet",
    "pos",
    "kind",
    "ht",
    "txn",
    "trx_id",
    "gtid",
    "participants",
    "ops",
];

/// Whether a record of `kind` has the top-level field `field`.
fn kind_has(kind: Kind, field: &str) -> bool {
    match field {
        "txn" => matches!(kind, Kind::Intent | Kind::Commit | Kind::Abort),
        "trx_id" => kind != Kind::Heartbeat,
        "gtid" => matches!(kind, Kind::Write | Kind::Commit),
        "participants" => kind == Kind::Commit,
        "ops" => matches!(kind, Kind::Write | Kind::Intent),
        _ => true,
    }
}

/// At most 64 characters of a name from the input, for an error message.
fn bounded(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_owned(),
    }
}

/// Parses one JSON line (surrounding whitespace allowed) into its tablet and record.
///
/// # Errors
///
/// A [`JsonError`] naming the offending field when the line is not JSON, not an object, has
/// an unknown, repeated, missing or (for its kind) misplaced field, or a bad value.
pub fn from_json_line(line: &str) -> Result<(TabletId, Record), JsonError> {
    from_json_line_or(line, None)
}

/// [`from_json_line`], with `default_tablet` the tablet of a line without a `tablet` field.
/// `"ht":"now"` is the wall clock's hybrid time (physical microseconds, logical 0).
pub fn from_json_line_or(
    line: &str,
    default_tablet: Option<&TabletId>,
) -> Result<(TabletId, Record), JsonError> {
    from_json_line_at(line, default_tablet, &mut |_| {
        Ok(HybridTime::from_system_time(std::time::SystemTime::now()))
    })
}

/// [`from_json_line_or`], with `now` giving the hybrid time of `"ht":"now"` for the line's
/// tablet (a writer's caller gives one above the tablet's last ht); its error becomes the
/// `ht` field's.
pub fn from_json_line_at(
    line: &str,
    default_tablet: Option<&TabletId>,
    now: &mut dyn FnMut(&TabletId) -> Result<HybridTime, String>,
) -> Result<(TabletId, Record), JsonError> {
    let top: J = serde_json::from_str(line).map_err(|e| JsonError::Syntax(e.to_string()))?;
    let fields = match top {
        J::Obj(fields) => fields,
        other => return Err(JsonError::NotAnObject(other.type_name())),
    };

    let mut slots: [Option<J>; 9] = Default::default();
    for (name, value) in fields {
        let Some(i) = FIELDS.iter().position(|f| *f == name) else {
            return Err(JsonError::UnknownField(bounded(&name)));
        };
        if slots[i].is_some() {
            return Err(JsonError::DuplicateField(FIELDS[i].to_owned()));
        }
        slots[i] = Some(value);
    }
    let [tablet, _pos_is_ignored, kind, ht, txn, trx_id, gtid, participants, ops] = slots;

    let Some(kind) = kind else {
        return Err(JsonError::Missing {
            field: "kind",
            required_on: "every record",
        });
    };
    let kind = parse_kind(kind)?;
    let present = [
        txn.is_some(),
        trx_id.is_some(),
        gtid.is_some(),
        participants.is_some(),
        ops.is_some(),
    ];
    for (field, present) in FIELDS[4..].iter().zip(present) {
        if present && !kind_has(kind, field) {
            return Err(JsonError::NotAllowed { field, kind });
        }
    }

    let required_on = match kind {
        Kind::Write => "a write record",
        Kind::Intent => "an intent record",
        Kind::Commit => "a commit record",
        Kind::Abort => "an abort record",
        Kind::Heartbeat => "a heartbeat record",
    };
    let require = |j: Option<J>, field: &'static str, required_on: &'static str| {
        j.ok_or(JsonError::Missing { field, required_on })
    };
    let tablet = match (tablet, default_tablet) {
        (None, Some(t)) => t.clone(),
        (j, _) => parse_tablet(require(j, "tablet", "every record")?, "tablet")?,
    };
    let ht = match require(ht, "ht", "every record")? {
        J::Str(s) if s == "now" => now(&tablet).map_err(|e| invalid("ht", e))?,
        j => parse_ht(j)?,
    };
    let txn = || -> Result<TxnId, JsonError> {
        parse_str_field(require(txn, "txn", required_on)?, "txn")
    };
    let body = match kind {
        Kind::Write => Body::Write {
            trx_id: parse_opt(trx_id, "trx_id")?,
            gtid: parse_opt(gtid, "gtid")?,
            ops: parse_ops(require(ops, "ops", required_on)?)?,
        },
        Kind::Intent => Body::Intent {
            txn: txn()?,
            trx_id: parse_opt(trx_id, "trx_id")?,
            ops: parse_ops(require(ops, "ops", required_on)?)?,
        },
        Kind::Commit => Body::Commit {
            txn: txn()?,
            trx_id: parse_opt(trx_id, "trx_id")?,
            gtid: parse_opt(gtid, "gtid")?,
            participants: parse_participants(require(participants, "participants", required_on)?)?,
        },
        Kind::Abort => Body::Abort {
            txn: txn()?,
            trx_id: parse_opt(trx_id, "trx_id")?,
        },
        Kind::Heartbeat => Body::Heartbeat,
    };
    Ok((tablet, Record { ht, body }))
}

fn parse_kind(j: J) -> Result<Kind, JsonError> {
    let J::Str(s) = j else {
        return Err(invalid(
            "kind",
            format!("expected a string, got {}", j.type_name()),
        ));
    };
    Ok(match s.as_str() {
        "write" => Kind::Write,
        "intent" => Kind::Intent,
        "commit" => Kind::Commit,
        "abort" => Kind::Abort,
        "heartbeat" => Kind::Heartbeat,
        other => {
            return Err(invalid(
                "kind",
                format!(
                "unknown record kind {:?}; expected one of write, intent, commit, abort, heartbeat",
                bounded(other)
            ),
            ))
        }
    })
}

/// A string field parsed with the type's `FromStr` (whose error says what is wrong).
fn parse_str_field<T>(j: J, field: &str) -> Result<T, JsonError>
where
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    match j {
        J::Str(s) => s.parse().map_err(|e: T::Err| invalid(field, e.to_string())),
        other => Err(invalid(
            field,
            format!("expected a string, got {}", other.type_name()),
        )),
    }
}

fn parse_tablet(j: J, field: &str) -> Result<TabletId, JsonError> {
    parse_str_field(j, field)
}

/// An optional string field: absent or `null` is `None`.
fn parse_opt<T>(j: Option<J>, field: &str) -> Result<Option<T>, JsonError>
where
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    match j {
        None | Some(J::Null) => Ok(None),
        Some(j) => parse_str_field(j, field).map(Some),
    }
}

/// A decimal string or a non-negative integer (the same rules as `HybridTime`'s serde form).
fn parse_ht(j: J) -> Result<HybridTime, JsonError> {
    match j {
        J::Str(s) => s
            .parse()
            .map_err(|e: crate::error::ParseError| invalid("ht", e.to_string())),
        J::U64(v) => Ok(HybridTime(v)),
        J::I64(v) => u64::try_from(v)
            .map(HybridTime)
            .map_err(|_| invalid("ht", format!("hybrid time {v} is negative"))),
        J::F64(v) => Err(invalid(
            "ht",
            format!(
                "hybrid time {v} is not an integer (or is too large); send it as a decimal string"
            ),
        )),
        other => Err(invalid(
            "ht",
            format!(
                "expected a hybrid time as a decimal string or a non-negative integer, got {}",
                other.type_name()
            ),
        )),
    }
}

fn parse_participants(j: J) -> Result<Vec<TabletId>, JsonError> {
    let J::Arr(items) = j else {
        return Err(invalid(
            "participants",
            format!("expected an array of tablet ids, got {}", j.type_name()),
        ));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| parse_tablet(item, &format!("participants[{i}]")))
        .collect()
}

fn parse_ops(j: J) -> Result<Vec<Op>, JsonError> {
    let J::Arr(items) = j else {
        return Err(invalid(
            "ops",
            format!(
                "expected an array of {{\"key\": …, \"value\": …}} objects, got {}",
                j.type_name()
            ),
        ));
    };
    let mut ops = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let J::Obj(fields) = item else {
            return Err(invalid(
                format!("ops[{i}]"),
                format!(
                    "expected an object {{\"key\": …, \"value\": …}}, got {}",
                    item.type_name()
                ),
            ));
        };
        let mut key = None;
        let mut value = None;
        for (name, v) in fields {
            let slot = match name.as_str() {
                "key" => &mut key,
                "value" => &mut value,
                other => {
                    return Err(invalid(
                        format!("ops[{i}]"),
                        format!(
                            "unknown field `{}`; an op has only `key` and `value`",
                            bounded(other)
                        ),
                    ))
                }
            };
            if slot.is_some() {
                return Err(invalid(
                    format!("ops[{i}]"),
                    format!("field `{name}` appears more than once"),
                ));
            }
            *slot = Some(v);
        }
        let Some(key) = key else {
            return Err(invalid(format!("ops[{i}]"), "missing field `key`"));
        };
        let Some(value) = value else {
            return Err(invalid(
                format!("ops[{i}]"),
                "missing field `value` (use \"value\": null to delete the key)",
            ));
        };
        let key = match key {
            J::Null => return Err(invalid(format!("ops[{i}].key"), "a key cannot be null")),
            k => parse_bytes(k, || format!("ops[{i}].key"))?,
        };
        let value = match value {
            J::Null => None,
            v => Some(parse_bytes(v, || format!("ops[{i}].value"))?),
        };
        ops.push(Op { key, value });
    }
    Ok(ops)
}

/// A UTF-8 string or `{"b64": "<standard base64 with padding>"}`.
fn parse_bytes(j: J, field: impl Fn() -> String) -> Result<Vec<u8>, JsonError> {
    const EXPECTED: &str = "expected a UTF-8 string or {\"b64\": \"<base64>\"}";
    match j {
        J::Str(s) => Ok(s.into_bytes()),
        J::Obj(mut fields) => {
            if fields.len() != 1 || fields[0].0 != "b64" {
                let names: Vec<String> = fields
                    .iter()
                    .take(8)
                    .map(|(n, _)| format!("`{}`", bounded(n)))
                    .collect();
                let got = if names.is_empty() {
                    "an empty object".to_owned()
                } else {
                    format!("an object with fields {}", names.join(", "))
                };
                return Err(invalid(field(), format!("{EXPECTED}, got {got}")));
            }
            match fields.pop() {
                Some((_, J::Str(b64))) => BASE64
                    .decode(b64.as_bytes())
                    .map_err(|e| invalid(field(), format!("invalid base64 in `b64`: {e}"))),
                Some((_, other)) => Err(invalid(
                    field(),
                    format!("`b64` must be a base64 string, got {}", other.type_name()),
                )),
                None => Err(invalid(field(), EXPECTED)),
            }
        }
        other => Err(invalid(
            field(),
            format!("{EXPECTED}, got {}", other.type_name()),
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
            err(
                r#"{"tablet":"t","kind":"write","ht":"1","ops":[{"key":"k","value":"v","ttl":3}]}"#
            ),
            "field `ops[0]`: unknown field `ttl`; an op has only `key` and `value`"
        );
        assert_eq!(
            err(
                r#"{"tablet":"t","kind":"write","ht":"1","ops":[{"key":"k","key":"j","value":"v"}]}"#
            ),
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
}
