//! Writing a record as its JSON line (the format: [`super`]).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

use crate::ids::{Gtid, TabletId, TrxId, TxnId};
use crate::pos::WalPos;
use crate::record::{Body, Op, Record};

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
pub(super) fn push_json_str(out: &mut String, s: &str) {
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
