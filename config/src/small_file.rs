//! Reading a config file with a cap on how much is read ([`read_to_string`], on
//! `tidelog_net::small_file`, which also reads the PEM files), and the cap on how much of an
//! input an error message quotes ([`shorten`], [`snippet`]): a message that shows a bad
//! value shows a snippet of it, never the whole of a huge one.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

/// The most a config file may hold.
pub const CONFIG_MAX: u64 = 16 << 20;

/// The most of an input value an error message quotes ([`shorten`], [`snippet`]), in
/// characters.
pub const QUOTE_MAX: usize = 64;

/// `tidelog_net::small_file::read` as UTF-8 text.
pub fn read_to_string(path: &Path, max: u64, what: &str) -> Result<String> {
    let bytes = tidelog_net::small_file::read(path, max, what)?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// The most an error message that quotes inputs may hold after [`shorten`] (its quotes
/// already cut), in bytes.
pub const MESSAGE_MAX: usize = 4096;

/// `msg` with every double-quoted string in it longer than [`QUOTE_MAX`] characters cut to
/// that (`"aaaa…" (1048576 bytes)`), and the whole cut to [`MESSAGE_MAX`] bytes: an error
/// that echoes a bad value from a huge file stays short.
pub fn shorten(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len().min(MESSAGE_MAX + 64));
    let mut rest = msg;
    while let Some(open) = rest.find('"') {
        out.push_str(&rest[..=open]);
        let body = &rest[open + 1..];
        // The closing quote: the next one not escaped by a backslash.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let (inner, after) = match end {
            Some(i) => (&body[..i], &body[i + 1..]),
            None => (body, ""),
        };
        match inner.char_indices().nth(QUOTE_MAX) {
            None => out.push_str(inner),
            Some((cut, _)) => {
                out.push_str(&inner[..cut]);
                out.push('…');
                let _ = write!(out, "\" ({} bytes)", inner.len());
                rest = after;
                continue;
            }
        }
        if end.is_some() {
            out.push('"');
        }
        rest = after;
    }
    out.push_str(rest);
    if out.len() > MESSAGE_MAX {
        let cut = floor_char_boundary(&out, MESSAGE_MAX);
        let total = out.len();
        out.truncate(cut);
        let _ = write!(out, "… (message cut at {cut} of {total} bytes)");
    }
    out
}

/// The first `n` characters of `s`, with `…` when it had more.
pub fn head(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        None => s.to_string(),
        Some((cut, _)) => format!("{}…", &s[..cut]),
    }
}

/// The part of `line` around byte `col` (at most [`QUOTE_MAX`] characters on each side),
/// with `…` where it was cut, and the caret's column within the snippet.
pub fn snippet(line: &str, col: usize) -> (String, usize) {
    let col = floor_char_boundary(line, col.min(line.len()));
    let before: Vec<(usize, char)> = line[..col].char_indices().collect();
    let start = before
        .len()
        .checked_sub(QUOTE_MAX)
        .map_or(0, |i| before[i].0);
    let end = line[col..]
        .char_indices()
        .nth(QUOTE_MAX)
        .map_or(line.len(), |(i, _)| col + i);
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    let caret = out.chars().count() + line[start..col].chars().count();
    out.push_str(&line[start..end]);
    if end < line.len() {
        out.push('…');
    }
    (out, caret)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn config_text_must_be_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"a\xffb").unwrap();
        let e = format!("{:#}", read_to_string(&p, 16, "x").unwrap_err());
        assert!(e.contains("not UTF-8") && e.contains("offset 1"), "{e}");
        let e = format!("{:#}", read_to_string(&p, 2, "a config file").unwrap_err());
        assert!(e.contains("more than a config file may (2 bytes)"), "{e}");
    }

    #[test]
    fn quotes_and_snippets_are_bounded() {
        assert_eq!(head("15 parsecs", 10), "15 parsecs");
        let long = "é".repeat(1 << 20);
        assert_eq!(head(&long, 3), "ééé…");
        let (s, caret) = snippet("abc", 1);
        assert_eq!((s.as_str(), caret), ("abc", 1));
        let line = format!("{}X{}", "a".repeat(1000), "b".repeat(1000));
        let (s, caret) = snippet(&line, 1000);
        assert_eq!(s.chars().count(), 2 * QUOTE_MAX + 2);
        assert_eq!(s.chars().nth(caret), Some('X'));
        // Multi-byte characters are not split.
        let line = "é".repeat(300);
        let (s, _) = snippet(&line, 301);
        assert!(s.starts_with('…') && s.ends_with('…'), "{s}");
    }

    #[test]
    fn long_quotes_in_messages_are_cut() {
        let short = r#"key "max-staleness": invalid duration "15 parsecs": unknown unit"#;
        assert_eq!(shorten(short), short);
        let big = "y".repeat(1 << 20);
        let msg = format!("key \"max-staleness\": invalid duration {big:?}: unknown time unit {big:?}, supported …");
        let s = shorten(&msg);
        assert!(s.len() < 300, "{s}");
        assert!(
            s.starts_with("key \"max-staleness\": invalid duration \"yyy"),
            "{s}"
        );
        assert!(
            s.contains("…\" (1048576 bytes): unknown time unit \"yyy"),
            "{s}"
        );
        assert!(s.ends_with(", supported …"), "{s}");
        // Escaped quotes inside stay inside; an unclosed quote is cut too.
        assert_eq!(shorten(r#"a "b\"c" d"#), r#"a "b\"c" d"#);
        let s = shorten(&format!("unclosed \"{big}"));
        assert!(s.len() < 200, "{s}");
        // Unquoted bulk: the whole is cut.
        let s = shorten(&big);
        assert!(
            s.len() < MESSAGE_MAX + 64 && s.contains("message cut at 4096"),
            "{s}"
        );
    }
}
