//! The example configs under `systemd/` parse with the real parser, state the real defaults,
//! and document every key the parser knows.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use tidelog::config::{load_applier, load_shipper, parse_str, ApplierConfig, ShipperConfig};

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../systemd")
        .join(name)
}

/// The keys the parser accepts in a section, from its "unknown key" error.
fn known_keys<T: serde::de::DeserializeOwned + std::fmt::Debug>(section: &str) -> Vec<String> {
    let text = if section.is_empty() {
        "no-such-key = 1".to_string()
    } else {
        format!("[{section}]\nno-such-key = 1")
    };
    let e = parse_str::<T>(&text).unwrap_err();
    let (_, expected) = e.split_once("expected").unwrap_or_else(|| panic!("{e}"));
    expected
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| !w.is_empty() && *w != "one" && *w != "of")
        .map(str::to_string)
        .collect()
}

fn assert_documents_every_key<T: serde::de::DeserializeOwned + std::fmt::Debug>(
    file: &str,
    sections: &[&str],
) {
    let text = std::fs::read_to_string(example(file)).unwrap();
    let mut checked = 0;
    for &section in sections {
        let keys = known_keys::<T>(section);
        assert!(!keys.is_empty(), "{section}");
        for k in keys {
            if section.is_empty() && sections.contains(&k.as_str()) {
                continue;
            }
            let documented = text.lines().any(|l| {
                l.trim_start_matches(['#', ' '])
                    .starts_with(&format!("{k} ="))
            });
            assert!(
                documented,
                "{file}: key {k:?} ([{section}]) is not documented"
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "{file}: only {checked} keys checked");
}

#[test]
fn applier_example_parses_to_the_defaults_and_documents_every_key() {
    let c = load_applier(&example("applier.toml")).unwrap();
    assert_eq!(c, ApplierConfig::default());
    assert_documents_every_key::<ApplierConfig>("applier.toml", &["", "tls", "quic", "sql"]);
}

#[test]
fn shipper_example_parses_to_the_defaults_and_documents_every_key() {
    let c = load_shipper(&example("shipper.toml")).unwrap();
    assert_eq!(c, ShipperConfig::default());
    assert_documents_every_key::<ShipperConfig>("shipper.toml", &["", "tls", "quic"]);
}

#[test]
fn units_name_the_example_paths() {
    for (unit, cfg, sock) in [
        ("tidelog-applier.service", "applier.toml", "applier.sock"),
        ("tidelog-shipper.service", "shipper.toml", "shipper.sock"),
    ] {
        let text = std::fs::read_to_string(example(unit)).unwrap();
        assert!(text.contains("Type=notify"), "{unit}");
        assert!(text.contains("WatchdogSec="), "{unit}");
        assert!(
            text.contains(&format!("--config /etc/tidelog/{cfg}")),
            "{unit}"
        );
        let example_cfg = std::fs::read_to_string(example(cfg)).unwrap();
        assert!(
            example_cfg.contains(&format!("/run/tidelog/{sock}")),
            "{cfg}"
        );
    }
}

/// The example's `[sql]` table is commented out (the endpoint is off by default); with its
/// keys uncommented it parses to the documented defaults.
#[test]
fn applier_example_sql_table_states_the_defaults() {
    let text = std::fs::read_to_string(example("applier.toml")).unwrap();
    let (_, table) = text.split_once("# [sql]\n").unwrap();
    let keys: Vec<&str> = table
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| l.contains(" = "))
        .collect();
    assert_eq!(keys.len(), 6, "{keys:?}");
    let c: ApplierConfig = parse_str(&format!("[sql]\n{}", keys.join("\n"))).unwrap();
    assert_eq!(c.sql, Some(tidelog::config::SqlConfig::default()));
    let off: ApplierConfig = parse_str("").unwrap();
    assert_eq!(off.sql, None);
}
