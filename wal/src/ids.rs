//! Identifiers: `TabletId`, `TrxId` (`connect_id:commit_counter`), `Gtid` (`domain-server-seq`)
//! and `TxnId` (16-byte distributed transaction id).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ParseError;

/// Longest tablet id, in bytes.
pub const MAX_TABLET_ID_LEN: usize = 64;

/// A tablet (shard) id: `[A-Za-z0-9_.-]{1,64}`, and not `.` or `..` (it names a directory).
/// Shared, not copied: the apply path clones tablet ids into every transaction it tracks, and
/// a clone is a reference-count increment.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TabletId(std::sync::Arc<str>);

impl TabletId {
    pub fn new(s: &str) -> Result<TabletId, ParseError> {
        s.parse()
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TabletId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TabletId({})", self.0)
    }
}

impl fmt::Display for TabletId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for TabletId {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(ParseError::new(
                "tablet id",
                s,
                "empty; expected 1 to 64 of [A-Za-z0-9_.-]",
            ));
        }
        if s.len() > MAX_TABLET_ID_LEN {
            return Err(ParseError::new(
                "tablet id",
                s,
                format!("{} bytes long; at most {MAX_TABLET_ID_LEN}", s.len()),
            ));
        }
        if let Some((i, c)) = s
            .char_indices()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        {
            return Err(ParseError::new(
                "tablet id",
                s,
                format!("character {c:?} at byte {i} is not one of [A-Za-z0-9_.-]"),
            ));
        }
        if s == "." || s == ".." {
            return Err(ParseError::new(
                "tablet id",
                s,
                "`.` and `..` are not tablet ids",
            ));
        }
        Ok(TabletId(std::sync::Arc::from(s)))
    }
}

impl AsRef<str> for TabletId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// `"<connect_id>:<commit_counter>"`, both u64 decimal; the counter starts at 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TrxId {
    pub connect_id: u64,
    pub commit_counter: u64,
}

impl TrxId {
    pub fn new(connect_id: u64, commit_counter: u64) -> TrxId {
        TrxId {
            connect_id,
            commit_counter,
        }
    }
}

impl fmt::Display for TrxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.connect_id, self.commit_counter)
    }
}

fn parse_u64_field(
    what: &'static str,
    whole: &str,
    field: &str,
    name: &str,
) -> Result<u64, ParseError> {
    if field.is_empty() {
        return Err(ParseError::new(what, whole, format!("{name} is empty")));
    }
    if !field.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::new(
            what,
            whole,
            format!("{name} {field:?} is not a decimal number"),
        ));
    }
    field.parse::<u64>().map_err(|_| {
        ParseError::new(
            what,
            whole,
            format!("{name} {field} does not fit in 64 bits"),
        )
    })
}

impl FromStr for TrxId {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const WHAT: &str = "trx id";
        let Some((c, n)) = s.split_once(':') else {
            return Err(ParseError::new(
                WHAT,
                s,
                "expected <connect_id>:<commit_counter>",
            ));
        };
        let connect_id = parse_u64_field(WHAT, s, c, "connect_id")?;
        let commit_counter = parse_u64_field(WHAT, s, n, "commit_counter")?;
        if commit_counter == 0 {
            return Err(ParseError::new(WHAT, s, "commit_counter starts at 1"));
        }
        Ok(TrxId::new(connect_id, commit_counter))
    }
}

/// `"<domain>-<server>-<seq>"` (u32-u32-u64), MariaDB's form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
}

impl Gtid {
    pub fn new(domain: u32, server: u32, seq: u64) -> Gtid {
        Gtid {
            domain,
            server,
            seq,
        }
    }
}

impl fmt::Display for Gtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.seq)
    }
}

impl FromStr for Gtid {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const WHAT: &str = "gtid";
        let mut it = s.splitn(3, '-');
        let (Some(d), Some(sv), Some(q)) = (it.next(), it.next(), it.next()) else {
            return Err(ParseError::new(WHAT, s, "expected <domain>-<server>-<seq>"));
        };
        let domain = parse_u64_field(WHAT, s, d, "domain")?;
        let server = parse_u64_field(WHAT, s, sv, "server")?;
        let seq = parse_u64_field(WHAT, s, q, "seq")?;
        let domain = u32::try_from(domain).map_err(|_| {
            ParseError::new(WHAT, s, format!("domain {domain} does not fit in 32 bits"))
        })?;
        let server = u32::try_from(server).map_err(|_| {
            ParseError::new(WHAT, s, format!("server {server} does not fit in 32 bits"))
        })?;
        Ok(Gtid::new(domain, server, seq))
    }
}

/// A distributed transaction's 16-byte id; text form is 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TxnId(pub [u8; 16]);

impl TxnId {
    pub fn from_u128(v: u128) -> TxnId {
        TxnId(v.to_be_bytes())
    }
    pub fn as_u128(self) -> u128 {
        u128::from_be_bytes(self.0)
    }
}

impl fmt::Debug for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TxnId({self})")
    }
}

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for TxnId {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const WHAT: &str = "txn id";
        if s.len() != 32 {
            return Err(ParseError::new(
                WHAT,
                s,
                format!("{} characters; expected 32 hex digits", s.len()),
            ));
        }
        let mut out = [0u8; 16];
        for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
            let hex = |b: u8| match b {
                b'0'..=b'9' => Some(b - b'0'),
                b'a'..=b'f' => Some(b - b'a' + 10),
                b'A'..=b'F' => Some(b - b'A' + 10),
                _ => None,
            };
            match (hex(chunk[0]), hex(chunk[1])) {
                (Some(h), Some(l)) => out[i] = h << 4 | l,
                _ => {
                    return Err(ParseError::new(
                        WHAT,
                        s,
                        format!("non-hex character at position {}", i * 2),
                    ))
                }
            }
        }
        Ok(TxnId(out))
    }
}

macro_rules! serde_via_str {
    ($($t:ty => $expect:literal),* $(,)?) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $t;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expect)
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$t, E> {
                        v.parse().map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
    )*};
}

serde_via_str! {
    TabletId => "a tablet id string",
    TrxId => "a trx id string \"<connect_id>:<commit_counter>\"",
    Gtid => "a gtid string \"<domain>-<server>-<seq>\"",
    TxnId => "a txn id of 32 hex digits",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tablet_ids_are_validated() {
        assert!("t1".parse::<TabletId>().is_ok());
        assert!("a.b-c_D9".parse::<TabletId>().is_ok());
        assert!("x".repeat(64).parse::<TabletId>().is_ok());
        let e = "x".repeat(65).parse::<TabletId>().unwrap_err();
        assert!(e.reason.contains("at most 64"), "{e}");
        let e = "a/b".parse::<TabletId>().unwrap_err();
        assert!(e.reason.contains("'/'"), "{e}");
        assert!("".parse::<TabletId>().is_err());
        assert!("..".parse::<TabletId>().is_err());
        assert!("é".parse::<TabletId>().is_err());
    }

    #[test]
    fn trx_ids_parse_and_print() {
        let t: TrxId = "7:3".parse().unwrap();
        assert_eq!(t, TrxId::new(7, 3));
        assert_eq!(t.to_string(), "7:3");
        for bad in [
            "7",
            "7:",
            ":3",
            "7:x",
            "7:0",
            "a:1",
            "1:2:3",
            "18446744073709551616:1",
            "-1:2",
        ] {
            assert!(bad.parse::<TrxId>().is_err(), "{bad} parsed");
        }
        let e = "7:99999999999999999999".parse::<TrxId>().unwrap_err();
        assert!(e.reason.contains("64 bits"), "{e}");
    }

    #[test]
    fn gtids_parse_and_print() {
        let g: Gtid = "0-1-9".parse().unwrap();
        assert_eq!(g, Gtid::new(0, 1, 9));
        assert_eq!(g.to_string(), "0-1-9");
        for bad in [
            "0-1",
            "0-1-",
            "x-1-2",
            "4294967296-1-1",
            "0-1-2-3",
            "0--1-2",
        ] {
            assert!(bad.parse::<Gtid>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn txn_ids_round_trip() {
        let t = TxnId::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let s = t.to_string();
        assert_eq!(s, "0123456789abcdef0011223344556677");
        assert_eq!(s.parse::<TxnId>().unwrap(), t);
        assert_eq!(s.to_uppercase().parse::<TxnId>().unwrap(), t);
        assert!("0123".parse::<TxnId>().is_err());
        assert!("g123456789abcdef0011223344556677".parse::<TxnId>().is_err());
        let j = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<TxnId>(&j).unwrap(), t);
    }
}
