//! Reading a JSON line into a record, strictly: every error names its field (the format:
//! [`super`]).

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{invalid, JsonError};
use crate::format::Kind;
use crate::ids::{TabletId, TxnId};
use crate::record::{Body, Op, Record};
use crate::time::HybridTime;

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
