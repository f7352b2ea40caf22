//! The MySQL protocol's packets as bytes, both ways: what the endpoint sends (greeting, OK,
//! EOF, ERR, column definitions, text and binary rows, a prepared statement's metadata)
//! and what it reads of a `COM_STMT_EXECUTE` (its parameters). Framing, the handshake
//! response and binary values are `mysql_common`'s; no I/O here.
//!
//! The endpoint does not advertise `CLIENT_DEPRECATE_EOF`: result sets end with the
//! classic EOF packet, which every client (MariaDB's never had the other) reads.

use mysql_common::constants::{
    CapabilityFlags, ColumnFlags, ColumnType, StatusFlags, UTF8MB4_GENERAL_CI,
};
use mysql_common::io::ParseBuf;
use mysql_common::packets::{Column, HandshakePacket};
use mysql_common::proto::MySerialize;
use mysql_common::value::{BinValue, Value, ValueDeserializer};

use crate::answer::{Cell, Col, Kind, SqlError};

/// The collation of binary (numeric) columns.
const BINARY: u16 = 63;

/// What the server offers; `CLIENT_SSL` is added when TLS is on.
pub fn server_capabilities(tls: bool) -> CapabilityFlags {
    let mut c = CapabilityFlags::CLIENT_LONG_PASSWORD
        | CapabilityFlags::CLIENT_FOUND_ROWS
        | CapabilityFlags::CLIENT_LONG_FLAG
        | CapabilityFlags::CLIENT_CONNECT_WITH_DB
        | CapabilityFlags::CLIENT_PROTOCOL_41
        | CapabilityFlags::CLIENT_TRANSACTIONS
        | CapabilityFlags::CLIENT_SECURE_CONNECTION
        | CapabilityFlags::CLIENT_MULTI_RESULTS
        | CapabilityFlags::CLIENT_PS_MULTI_RESULTS
        | CapabilityFlags::CLIENT_PLUGIN_AUTH
        | CapabilityFlags::CLIENT_CONNECT_ATTRS
        | CapabilityFlags::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA;
    if tls {
        c |= CapabilityFlags::CLIENT_SSL;
    }
    c
}

/// The status every answer carries: autocommit on, no transaction.
pub const STATUS: StatusFlags = StatusFlags::SERVER_STATUS_AUTOCOMMIT;

/// The auth plugin the endpoint speaks.
pub const NATIVE_PASSWORD: &[u8] = b"mysql_native_password";

/// The initial greeting (`Protocol::HandshakeV10`) with the 20-byte `nonce`.
pub fn greeting(version: &str, conn_id: u32, nonce: &[u8; 20], tls: bool) -> Vec<u8> {
    let mut s1 = [0u8; 8];
    s1.copy_from_slice(&nonce[..8]);
    let mut s2 = nonce[8..].to_vec();
    s2.push(0);
    let p = HandshakePacket::new(
        10,
        version.as_bytes(),
        conn_id,
        s1,
        Some(s2),
        server_capabilities(tls),
        UTF8MB4_GENERAL_CI as u8,
        STATUS,
        Some(NATIVE_PASSWORD),
    );
    let mut out = Vec::new();
    p.serialize(&mut out);
    out
}

/// `AuthSwitchRequest` to `mysql_native_password` with `nonce`.
pub fn auth_switch(nonce: &[u8; 20]) -> Vec<u8> {
    let mut out = vec![0xfe];
    out.extend_from_slice(NATIVE_PASSWORD);
    out.push(0);
    out.extend_from_slice(nonce);
    out.push(0);
    out
}

fn put_lenenc_int(out: &mut Vec<u8>, n: u64) {
    match n {
        0..=250 => out.push(n as u8),
        251..=0xffff => {
            out.push(0xfc);
            out.extend_from_slice(&(n as u16).to_le_bytes());
        }
        0x1_0000..=0xff_ffff => {
            out.push(0xfd);
            out.extend_from_slice(&(n as u32).to_le_bytes()[..3]);
        }
        _ => {
            out.push(0xfe);
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
}

fn put_lenenc_str(out: &mut Vec<u8>, s: &[u8]) {
    put_lenenc_int(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// An OK packet (no rows affected).
pub fn ok() -> Vec<u8> {
    let mut out = vec![0x00, 0, 0];
    out.extend_from_slice(&STATUS.bits().to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// The EOF packet that ends column definitions and rows.
pub fn eof() -> Vec<u8> {
    let mut out = vec![0xfe];
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&STATUS.bits().to_le_bytes());
    out
}

/// An ERR packet.
pub fn err(e: &SqlError) -> Vec<u8> {
    let mut out = vec![0xff];
    out.extend_from_slice(&e.code.to_le_bytes());
    out.push(b'#');
    out.extend_from_slice(&e.state);
    // Bounded: a message is read by people, and a packet must stay small.
    let msg = e.message.as_bytes();
    out.extend_from_slice(&msg[..msg.len().min(4096)]);
    out
}

/// The column count that starts a result set.
pub fn column_count(n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    put_lenenc_int(&mut out, n as u64);
    out
}

/// A column definition (`Protocol::ColumnDefinition41`).
pub fn column(c: &Col) -> Vec<u8> {
    let col = match c.kind {
        Kind::Int => Column::new(ColumnType::MYSQL_TYPE_LONGLONG)
            .with_character_set(BINARY)
            .with_column_length(21)
            .with_flags(ColumnFlags::BINARY_FLAG | ColumnFlags::NUM_FLAG),
        Kind::Text => Column::new(ColumnType::MYSQL_TYPE_VAR_STRING)
            .with_character_set(UTF8MB4_GENERAL_CI)
            .with_column_length(1 << 20),
    }
    .with_schema(b"")
    .with_table(b"")
    .with_org_table(b"")
    .with_name(c.name.as_bytes())
    .with_org_name(c.name.as_bytes());
    let mut out = Vec::new();
    col.serialize(&mut out);
    out
}

/// A row of the text protocol (`COM_QUERY`).
pub fn text_row(cells: &[Cell]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in cells {
        match c {
            Cell::Null => out.push(0xfb),
            Cell::Int(n) => put_lenenc_str(&mut out, n.to_string().as_bytes()),
            Cell::Text(s) => put_lenenc_str(&mut out, s.as_bytes()),
        }
    }
    out
}

/// A row of the binary protocol (`COM_STMT_EXECUTE`): header, NULL bitmap (offset 2),
/// then the values as the columns' types say.
pub fn binary_row(cells: &[Cell]) -> Vec<u8> {
    let mut out = vec![0x00];
    let bitmap_at = out.len();
    out.resize(bitmap_at + (cells.len() + 7 + 2) / 8, 0);
    for (i, c) in cells.iter().enumerate() {
        match c {
            Cell::Null => {
                let bit = i + 2;
                out[bitmap_at + bit / 8] |= 1 << (bit % 8);
            }
            Cell::Int(n) => out.extend_from_slice(&n.to_le_bytes()),
            Cell::Text(s) => put_lenenc_str(&mut out, s.as_bytes()),
        }
    }
    out
}

/// `COM_STMT_PREPARE_OK`.
pub fn prepare_ok(stmt_id: u32, columns: usize, params: usize) -> Vec<u8> {
    let mut out = vec![0x00];
    out.extend_from_slice(&stmt_id.to_le_bytes());
    out.extend_from_slice(&(columns as u16).to_le_bytes());
    out.extend_from_slice(&(params as u16).to_le_bytes());
    out.push(0);
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// The definition of a `?` parameter in a prepared statement's metadata.
pub fn param_column() -> Vec<u8> {
    column(&Col {
        name: "?".into(),
        kind: Kind::Text,
    })
}

/// A value bound to a `?`.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    Null,
    Text(String),
    Int(i128),
    Float(f64),
}

/// What a prepared statement keeps between executions: its parameters' types, bound by
/// the first execution that sends them, and data sent with `COM_STMT_SEND_LONG_DATA`.
#[derive(Debug, Default, Clone)]
pub struct Bound {
    pub types: Vec<(ColumnType, ColumnFlags)>,
    pub long_data: std::collections::BTreeMap<u16, Vec<u8>>,
}

/// Why a packet could not be read: the connection is closed after saying so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

/// Reads the parameters of a `COM_STMT_EXECUTE` body (after the command byte and the
/// statement id) for a statement with `n` parameters.
pub fn execute_params(
    body: &[u8],
    n: usize,
    bound: &mut Bound,
) -> Result<Vec<ParamValue>, Malformed> {
    let short = || Malformed("COM_STMT_EXECUTE is shorter than its parameters".to_string());
    // flags (1), iteration count (4)
    let mut rest = body.get(5..).ok_or_else(short)?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let bitmap_len = n.div_ceil(8);
    let bitmap = rest.get(..bitmap_len).ok_or_else(short)?;
    rest = &rest[bitmap_len..];
    let (&new_bound, r) = rest.split_first().ok_or_else(short)?;
    rest = r;
    if new_bound == 1 {
        let types = rest.get(..2 * n).ok_or_else(short)?;
        rest = &rest[2 * n..];
        bound.types = types
            .chunks_exact(2)
            .map(|t| {
                let ty = ColumnType::try_from(t[0]).map_err(|_| {
                    Malformed(format!(
                        "COM_STMT_EXECUTE: unknown parameter type {:#x}",
                        t[0]
                    ))
                })?;
                let flags = if t[1] & 0x80 != 0 {
                    ColumnFlags::UNSIGNED_FLAG
                } else {
                    ColumnFlags::empty()
                };
                Ok((ty, flags))
            })
            .collect::<Result<_, _>>()?;
    }
    if bound.types.len() != n {
        return Err(Malformed(
            "COM_STMT_EXECUTE without the parameters' types".to_string(),
        ));
    }
    let mut buf = ParseBuf(rest);
    let mut out = Vec::with_capacity(n);
    for (i, &(ty, flags)) in bound.types.iter().enumerate() {
        if bitmap[i / 8] & (1 << (i % 8)) != 0 {
            out.push(ParamValue::Null);
            continue;
        }
        if let Some(data) = bound.long_data.get(&(i as u16)) {
            out.push(ParamValue::Text(String::from_utf8_lossy(data).into_owned()));
            continue;
        }
        let v: ValueDeserializer<BinValue> = buf
            .parse((ty, flags))
            .map_err(|e| Malformed(format!("COM_STMT_EXECUTE parameter {}: {e}", i + 1)))?;
        out.push(match v.0 {
            Value::NULL => ParamValue::Null,
            Value::Bytes(b) => ParamValue::Text(String::from_utf8_lossy(&b).into_owned()),
            Value::Int(n) => ParamValue::Int(n.into()),
            Value::UInt(n) => ParamValue::Int(n.into()),
            Value::Float(f) => ParamValue::Float(f.into()),
            Value::Double(f) => ParamValue::Float(f),
            other => ParamValue::Text(other.as_sql(true).trim_matches('\'').to_string()),
        });
    }
    bound.long_data.clear();
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn rows_encode_nulls_and_types() {
        assert_eq!(
            text_row(&[Cell::Text("ab".into()), Cell::Null, Cell::Int(-1)]),
            [2, b'a', b'b', 0xfb, 2, b'-', b'1']
        );
        let b = binary_row(&[Cell::Null, Cell::Int(7), Cell::Text("x".into())]);
        assert_eq!(b[0], 0);
        assert_eq!(b[1], 0b100, "NULL bitmap with offset 2");
        assert_eq!(&b[2..10], &7i64.to_le_bytes());
        assert_eq!(&b[10..], &[1, b'x']);
    }

    #[test]
    fn execute_params_read_types_values_and_nulls() {
        let mut bound = Bound::default();
        // flags, iterations, bitmap (param 2 NULL), new-params-bound, types, values.
        let mut body = vec![0, 1, 0, 0, 0, 0b010, 1];
        body.extend_from_slice(&[ColumnType::MYSQL_TYPE_VAR_STRING as u8, 0]);
        body.extend_from_slice(&[ColumnType::MYSQL_TYPE_NULL as u8, 0]);
        body.extend_from_slice(&[ColumnType::MYSQL_TYPE_LONGLONG as u8, 0]);
        body.extend_from_slice(&[3, b'5', b':', b'1']);
        body.extend_from_slice(&5i64.to_le_bytes());
        let got = execute_params(&body, 3, &mut bound).unwrap();
        assert_eq!(
            got,
            [
                ParamValue::Text("5:1".into()),
                ParamValue::Null,
                ParamValue::Int(5)
            ]
        );
        // The next execution may leave the types out: the bound ones are used.
        let mut again = vec![0, 1, 0, 0, 0, 0b010, 0];
        again.extend_from_slice(&[1, b'x']);
        again.extend_from_slice(&9i64.to_le_bytes());
        assert_eq!(
            execute_params(&again, 3, &mut bound).unwrap()[2],
            ParamValue::Int(9)
        );
    }

    #[test]
    fn malformed_execute_bodies_are_errors() {
        let mut bound = Bound::default();
        for body in [
            &[][..],
            &[0, 1, 0, 0],
            &[0, 1, 0, 0, 0],
            &[0, 1, 0, 0, 0, 0, 0],
            &[0, 1, 0, 0, 0, 0, 1, 0xee, 0],
            &[0, 1, 0, 0, 0, 0, 1, 0xfd, 0, 50, b'x'],
            &[0, 1, 0, 0, 0, 0, 1, 0x08, 0, 1, 2],
        ] {
            assert!(execute_params(body, 1, &mut bound).is_err(), "{body:?}");
        }
    }

    proptest::proptest! {
        /// Any bytes: parameters or an error, never a panic.
        #[test]
        fn any_execute_body(body in proptest::collection::vec(proptest::num::u8::ANY, 0..64), n in 0usize..5) {
            let mut bound = Bound::default();
            let _ = execute_params(&body, n, &mut bound);
        }
    }
}
