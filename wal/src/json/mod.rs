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
//!
//! Writing is in `write.rs`, reading (strict, naming the field at fault) in `read.rs`.

use crate::format::Kind;

mod read;
mod write;

pub use read::{from_json_line, from_json_line_at, from_json_line_or};
pub use write::{to_json_line, write_json_line};

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

#[cfg(test)]
mod tests;
