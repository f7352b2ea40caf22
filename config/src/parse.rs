//! The strict TOML parser of both config files: a syntax error shows where, a bad value
//! names its key (`key "quic.idle-timeout": …`), an unknown key is named with the keys
//! known there; and the `deserialize_with` helpers the config structs share.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde::Deserialize;
use tidelog_wal::TabletId;

use crate::small_file;

/// A TOML syntax error: where, what, and the part of the line around it (never the whole
/// of a long line).
fn syntax_error(text: &str, e: &toml::de::Error) -> String {
    let what = small_file::head(e.message().trim_end(), 256);
    let Some(span) = e.span() else {
        return format!("TOML parse error: {what}");
    };
    let at = span.start.min(text.len());
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    let line_no = text[..line_start].matches('\n').count() + 1;
    let col = text[line_start..at].chars().count() + 1;
    let (shown, caret) = small_file::snippet(&text[line_start..line_end], at - line_start);
    format!(
        "TOML parse error at line {line_no}, column {col}: {what}\n  | {shown}\n  | {}^",
        " ".repeat(caret)
    )
}

/// Parses a config from TOML text. The error names the key at fault but not the file, and
/// quotes a snippet of a long value or line, never the whole.
pub fn parse_str<T: DeserializeOwned>(text: &str) -> std::result::Result<T, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
    match T::deserialize(toml::Value::Table(table.clone())) {
        Ok(v) => Ok(v),
        Err(e) => Err(small_file::shorten(&blame_key::<T>(&table, e.message()))),
    }
}

/// Finds the key that makes deserialization fail by trying each key on its own (every field
/// has a default, so a table with one key deserializes unless that key is bad), recursing
/// into sub-tables. Returns `key "a.b": <why>` or `unknown key "a.b"`.
fn blame_key<T: DeserializeOwned>(table: &toml::Table, whole: &str) -> String {
    fn fails<T: DeserializeOwned>(t: &toml::Table) -> Option<String> {
        T::deserialize(toml::Value::Table(t.clone()))
            .err()
            .map(|e| e.message().to_string())
    }
    for (k, v) in table {
        let mut single = toml::Table::new();
        single.insert(k.clone(), v.clone());
        let Some(msg) = fails::<T>(&single) else {
            continue;
        };
        let unknown_here = msg.starts_with(&format!("unknown field `{k}`"));
        if let (toml::Value::Table(sub), false) = (v, unknown_here) {
            for (sk, sv) in sub {
                let mut inner = toml::Table::new();
                inner.insert(sk.clone(), sv.clone());
                let mut outer = toml::Table::new();
                outer.insert(k.clone(), toml::Value::Table(inner));
                if let Some(m) = fails::<T>(&outer) {
                    return describe(&format!("{k}.{sk}"), &m);
                }
            }
        }
        return describe(k, &msg);
    }
    whole.to_string()
}

fn describe(key: &str, msg: &str) -> String {
    if let Some(rest) = msg.strip_prefix("unknown field") {
        // serde: "unknown field `foo`, expected one of `a`, `b`"
        let expected = rest.split_once(", expected").map(|(_, e)| e.trim());
        match expected {
            Some(e) => format!("unknown key {key:?} (expected {})", e.replace('`', "\"")),
            None => format!("unknown key {key:?}"),
        }
    } else {
        format!("key {key:?}: {msg}")
    }
}

pub(crate) fn de_from_str<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    let s = String::deserialize(d)?;
    s.parse().map_err(|e| D::Error::custom(with_input(&s, &e)))
}

/// A parse error's text, prefixed with the input unless it already quotes it.
fn with_input(input: &str, e: &dyn fmt::Display) -> String {
    let text = e.to_string();
    if text.contains(&format!("{input:?}")) {
        text
    } else {
        format!("invalid value {input:?}: {text}")
    }
}

pub(crate) fn de_opt_addr<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<SocketAddr>, D::Error> {
    de_from_str(d).map(Some)
}

/// A path: an empty (or blank) one would silently mean the current directory.
pub(crate) fn de_path<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<PathBuf, D::Error> {
    let p = PathBuf::deserialize(d)?;
    if p.as_os_str().to_string_lossy().trim().is_empty() {
        return Err(D::Error::custom(format!(
            "must not be empty ({:?} would mean the current directory)",
            p.as_os_str()
        )));
    }
    Ok(p)
}

pub(crate) fn de_opt_path<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<PathBuf>, D::Error> {
    de_path(d).map(Some)
}

pub(crate) fn de_tablets<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<TabletId>, D::Error> {
    let mut out: Vec<TabletId> = Vec::new();
    for s in Vec::<String>::deserialize(d)? {
        let t = s
            .parse::<TabletId>()
            .map_err(|e| D::Error::custom(with_input(&s, &e)))?;
        if out.contains(&t) {
            return Err(D::Error::custom(format!(
                "tablet {s:?} is listed more than once"
            )));
        }
        out.push(t);
    }
    Ok(out)
}
