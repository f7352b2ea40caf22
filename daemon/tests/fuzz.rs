//! Fuzz-style property tests of what the daemons parse from outside: the admin API's path
//! and query values (percent-encoding, hybrid times, waits), its keys and values in JSON
//! (`{"b64": …}`), and the TOML config files with their sizes and durations.
//!
//! None may panic on arbitrary input; each refuses with a message naming what is wrong;
//! what is accepted round-trips through its encoder.
//!
//! CI runs the short form (`cargo test -p tidelog --test fuzz`); the long form, 100 000
//! cases of each property:
//!
//! ```text
//! cargo test --release -p tidelog --test fuzz -- --ignored --nocapture --test-threads 1
//! ```
//!
//! `FUZZ_CASES=N` sets the case count of either form and `FUZZ_SEED=S` replays a run.
#![allow(clippy::unwrap_used)]

#[path = "../../wal/tests/common/fuzzkit.rs"]
mod fuzzkit;

use fuzzkit::*;
use proptest::prelude::*;
use tidelog::admin::{self, JsonBytes};
use tidelog::config::{self, ApplierConfig, ShipperConfig};

fuzz_tests! {
    percent_decoding: 1000;
    query_numbers_and_waits: 1000;
    json_bytes: 1000;
    config_files: 300;
    sizes_and_durations: 1000;
}

/// Text rich in what the parsers look at: escapes, hex digits, signs, units, spaces.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[%0-9a-fA-F+ .-]{0,24}",
        "[ +-]?[0-9]{0,24}[ ]?(ms|s|m|h|d|us|ns|KiB|MiB|GiB|TiB|kb|MB|K|b|x)?[ ]?",
    ]
}

/// A `%` must be followed by two hex digits; anything else is a 400 naming the field.
fn percent_decoding(cases: u32) {
    check(
        "percent_decoding",
        cases,
        (text(), any::<bool>()),
        |(s, plus)| {
            match admin::percent_decode("key", &s, plus) {
                Ok(bytes) => {
                    let b = s.as_bytes();
                    for (i, _) in s.match_indices('%') {
                        prop_assert!(
                            b.get(i + 1..i + 3)
                                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)),
                            "{s:?} decoded to {bytes:?} with a bad escape at {i}"
                        );
                    }
                }
                Err(e) => {
                    prop_assert_eq!(e.status.as_u16(), 400);
                    prop_assert!(
                        e.message.contains("key") && e.message.contains("byte"),
                        "{e}"
                    );
                }
            }
            // What the client encodes, the server decodes back.
            let enc = tidelog::ctl::encode(&s);
            prop_assert_eq!(
                admin::percent_decode("key", &enc, plus).unwrap(),
                s.as_bytes()
            );
            Ok(())
        },
    );
}

fn query_numbers_and_waits(cases: u32) {
    check("query_numbers_and_waits", cases, text(), |s| {
        match admin::parse_ht("at", &s) {
            Ok(v) => prop_assert_eq!(admin::parse_ht("at", &v.to_string()).unwrap(), v),
            Err(e) => prop_assert!(e.message.starts_with("at:"), "{e}"),
        }
        if let Err(e) = admin::parse_wait("wait", &s) {
            prop_assert!(e.message.starts_with("wait:"), "{e}");
        }
        Ok(())
    });
}

/// Keys and values in the API's JSON: a string, or `{"b64": …}` for other bytes.
fn json_bytes(cases: u32) {
    let input = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40).prop_map(|b| (
            Some(b.clone()),
            serde_json::to_string(&JsonBytes(b)).unwrap()
        )),
        text().prop_map(|s| (None, s)),
        "[a-zA-Z0-9+/=]{0,12}".prop_map(|b| (None, format!(r#"{{"b64":"{b}"}}"#))),
        (text(), text()).prop_map(|(k, v)| (
            None,
            format!("{{{}:{}}}", serde_json::json!(k), serde_json::json!(v))
        )),
    ];
    check("json_bytes", cases, input, |(bytes, json)| {
        match serde_json::from_str::<JsonBytes>(&json) {
            Ok(v) => {
                if let Some(b) = bytes {
                    prop_assert_eq!(&v.0, &b);
                }
                let again = serde_json::to_string(&v).unwrap();
                prop_assert_eq!(serde_json::from_str::<JsonBytes>(&again).unwrap(), v);
            }
            Err(e) => {
                prop_assert!(bytes.is_none(), "a written value did not read back: {e}");
                prop_assert!(!e.to_string().is_empty());
            }
        }
        Ok(())
    });
}

/// Config files: arbitrary text, and the shipped example configs mutated.
fn config_files(cases: u32) {
    let examples = [
        include_str!("../../systemd/applier.toml"),
        include_str!("../../systemd/shipper.toml"),
    ];
    let input = prop_oneof![
        text(),
        (0usize..2, mutations()).prop_map(move |(i, ms)| {
            String::from_utf8_lossy(&mutate(examples[i].as_bytes(), &ms)).into_owned()
        }),
        (1usize..300).prop_map(|depth| format!("x = {}{}", "[".repeat(depth), "]".repeat(depth))),
    ];
    check("config_files", cases, input, |text| {
        for e in [
            config::parse_str::<ApplierConfig>(&text).err(),
            config::parse_str::<ShipperConfig>(&text).err(),
        ]
        .into_iter()
        .flatten()
        {
            prop_assert!(!e.trim().is_empty());
        }
        Ok(())
    });
}

fn sizes_and_durations(cases: u32) {
    check("sizes_and_durations", cases, text(), |s| {
        match config::parse_size(&s) {
            Ok(n) => prop_assert_eq!(config::parse_size(&n.to_string()), Ok(n)),
            Err(e) => prop_assert!(e.contains("size"), "{e}"),
        }
        if let Err(e) = config::parse_duration(&s) {
            prop_assert!(e.contains("duration"), "{e}");
        }
        Ok(())
    });
}
