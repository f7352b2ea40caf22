//! Sizes (`"64MiB"`, `"4096"`, `"64MB"`) and durations (`"15m"`, `"200ms"`) as the config
//! files and the CLI write them.

use std::time::Duration;

use serde::de::{Deserializer, Error as _};
use serde::Deserialize;

/// Parses a size: a byte count with an optional unit, binary (`KiB`, `MiB`, `GiB`, `TiB`,
/// also `K`, `M`, `G`, `T`) or decimal (`KB`, `MB`, `GB`, `TB`), case-insensitive, e.g.
/// `"64MiB"`, `"1 GiB"`, `"4096"`, `"16KiB"`, `"64MB"`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "invalid size {s:?}: expected a number of bytes with an optional unit, e.g. 64MiB"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|e| format!("invalid size {s:?}: {e}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "invalid size {s:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("invalid size {s:?}: too large"))
}

/// Parses a humantime duration (`"200ms"`, `"15m"`, `"1d"`, `"1h 30m"`).
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

pub(crate) fn de_size<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Int(i64),
        Str(String),
    }
    match Size::deserialize(d)
        .map_err(|_| D::Error::custom("expected a size: a byte count or a string like \"64MiB\""))?
    {
        Size::Int(n) => {
            u64::try_from(n).map_err(|_| D::Error::custom(format!("size {n} is negative")))
        }
        Size::Str(s) => parse_size(&s).map_err(D::Error::custom),
    }
}

pub(crate) fn de_duration<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Duration, D::Error> {
    let s = String::deserialize(d)
        .map_err(|_| D::Error::custom("expected a duration string like \"15m\" or \"200ms\""))?;
    parse_duration(&s).map_err(D::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("16KiB").unwrap(), 16384);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1 GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("64MB").unwrap(), 64_000_000);
        assert_eq!(parse_size("2gb").unwrap(), 2_000_000_000);
        assert!(parse_size("").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("1.5GiB").is_err());
        assert!(parse_size("99999999999TiB")
            .unwrap_err()
            .contains("too large"));
    }
}
