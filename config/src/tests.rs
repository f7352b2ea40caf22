//! Both config files together: defaults, key names in errors, file names, validation.

use std::path::PathBuf;
use std::time::Duration;

use super::*;

fn applier(text: &str) -> std::result::Result<ApplierConfig, String> {
    parse_str(text)
}

fn shipper(text: &str) -> std::result::Result<ShipperConfig, String> {
    parse_str(text)
}

#[test]
fn empty_files_give_the_defaults() {
    assert_eq!(applier("").unwrap(), ApplierConfig::default());
    let s = shipper("").unwrap();
    assert_eq!(s, ShipperConfig::default());
    assert!(!s.shipper_id.is_empty());
    assert_eq!(s.tls.cert, PathBuf::from("/etc/tidelog/tls/shipper.pem"));
    assert_eq!(
        ApplierConfig::default().tls.key,
        PathBuf::from("/etc/tidelog/tls/applier.key")
    );
}

#[test]
fn bad_values_name_the_key() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "max-staleness = \"15 parsecs\"",
            "max-staleness",
            "invalid duration",
        ),
        ("max-staleness = 15", "max-staleness", "duration"),
        ("sync = \"sometimes\"", "sync", "sometimes"),
        ("listen = \"nowhere\"", "listen", "nowhere"),
        (
            "segment-size = \"64 furlongs\"",
            "segment-size",
            "unknown unit",
        ),
        ("segment-size = -1", "segment-size", "negative"),
        (
            "expect-tablets = [\"bad tablet!\"]",
            "expect-tablets",
            "bad tablet!",
        ),
        ("expect-tablets = \"t1\"", "expect-tablets", ""),
        (
            "[quic]\nidle-timeout = \"soon\"",
            "quic.idle-timeout",
            "invalid duration",
        ),
        (
            "[quic]\nmax-udp-payload = 100000",
            "quic.max-udp-payload",
            "",
        ),
        (
            "[quic]\ncongestion = \"vegas\"",
            "quic.congestion",
            "not one of bbr, cubic, newreno",
        ),
        (
            "[quic]\ntime-threshold = \"long\"",
            "quic.time-threshold",
            "",
        ),
        ("[quic]\npacket-threshold = -1", "quic.packet-threshold", ""),
        ("[tls]\nca = 5", "tls.ca", ""),
        ("data-dir = 5", "data-dir", ""),
        ("data-dir = \"\"", "data-dir", "must not be empty"),
        ("admin-socket = \"\"", "admin-socket", "must not be empty"),
        ("[tls]\ncert = \"\"", "tls.cert", "must not be empty"),
        (
            "expect-tablets = [\"t1\", \"t2\", \"t1\"]",
            "expect-tablets",
            "tablet \"t1\" is listed more than once",
        ),
        ("received-direct-io = \"yes\"", "received-direct-io", ""),
        (
            "received-direct-io-in-catch-up = 1",
            "received-direct-io-in-catch-up",
            "",
        ),
        (
            "apply-yield-to-intake = \"a while\"",
            "apply-yield-to-intake",
            "invalid duration",
        ),
    ];
    for (text, key, what) in cases {
        let e = applier(text).unwrap_err();
        assert!(e.contains(&format!("key \"{key}\"")), "{text}: {e}");
        assert!(e.contains(what), "{text}: {e}");
    }
    let cases: &[(&str, &str)] = &[
        ("io-engine = \"fast\"", "io-engine"),
        ("lanes = -2", "lanes"),
        ("ship-unsynced = \"yes\"", "ship-unsynced"),
        ("window-bytes = \"lots\"", "window-bytes"),
        ("reconnect-max = \"5 fortnights\"", "reconnect-max"),
        ("wal-dir = \"\"", "wal-dir"),
        ("admin-socket = \"\"", "admin-socket"),
        ("[tls]\nkey = \"\"", "tls.key"),
    ];
    for (text, key) in cases {
        let e = shipper(text).unwrap_err();
        assert!(e.contains(&format!("key \"{key}\"")), "{text}: {e}");
    }
}

#[test]
fn unknown_keys_are_named() {
    let e = applier("listen = \"127.0.0.1:1\"\nfoo = 1").unwrap_err();
    assert!(e.contains("unknown key \"foo\""), "{e}");
    assert!(e.contains("max-staleness"), "lists the known keys: {e}");
    let e = applier("[tls]\nca = \"/a\"\nfoo = \"x\"").unwrap_err();
    assert!(e.contains("unknown key \"tls.foo\""), "{e}");
    let e = shipper("[quic]\nwindow = 1").unwrap_err();
    assert!(e.contains("unknown key \"quic.window\""), "{e}");
    let e = applier("[foo]\na = 1").unwrap_err();
    assert!(e.starts_with("unknown key \"foo\""), "{e}");
    let e = applier("tls = 5").unwrap_err();
    assert!(e.starts_with("key \"tls\""), "{e}");
    // A shipper key is not an applier key.
    let e = applier("wal-dir = \"/w\"").unwrap_err();
    assert!(e.contains("unknown key \"wal-dir\""), "{e}");
}

#[test]
fn syntax_errors_and_file_names() {
    let e = applier("listen = ").unwrap_err();
    assert!(e.contains("line 1"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("applier.toml");
    std::fs::write(&p, "max-staleness = \"15 parsecs\"\n").unwrap();
    let e = format!("{:#}", load_applier(&p).unwrap_err());
    assert!(
        e.contains("applier.toml: key \"max-staleness\": invalid duration \"15 parsecs\""),
        "{e}"
    );
    std::fs::write(&p, "[tls]\nca = \"/nonexistent/ca.pem\"\n").unwrap();
    let e = format!("{:#}", check_applier(&p).unwrap_err());
    assert!(
        e.contains("applier.toml: key \"tls.ca\": cannot read /nonexistent/ca.pem"),
        "{e}"
    );
    let e = format!(
        "{:#}",
        load_shipper(&dir.path().join("missing.toml")).unwrap_err()
    );
    assert!(e.contains("missing.toml"), "{e}");
}

#[test]
fn metrics_listen_and_log_level() {
    let c = applier("metrics-listen = \"127.0.0.1:9400\"\nlog-level = \"debug\"").unwrap();
    assert_eq!(c.metrics_listen, Some("127.0.0.1:9400".parse().unwrap()));
    assert_eq!(c.log_level, "debug");
    assert_eq!(ApplierConfig::default().metrics_listen, None);
    assert_eq!(ApplierConfig::default().log_level, "info");
    let s = shipper("metrics-listen = \"[::1]:9401\"").unwrap();
    assert_eq!(s.metrics_listen, Some("[::1]:9401".parse().unwrap()));
    let e = applier("metrics-listen = \"nowhere\"").unwrap_err();
    assert!(
        e.contains("key \"metrics-listen\"") && e.contains("nowhere"),
        "{e}"
    );
    let e = shipper("metrics-listen = 9400").unwrap_err();
    assert!(e.contains("key \"metrics-listen\""), "{e}");
    let c = ApplierConfig {
        log_level: "tidelog=[bad".into(),
        ..ApplierConfig::default()
    };
    let e = format!("{:#}", c.validate().unwrap_err());
    assert!(e.contains("log-level"), "{e}");
}

#[test]
fn validate_checks_files_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    let tls = TlsConfig {
        ca: dir.path().join("ca.pem"),
        cert: dir.path().join("applier.pem"),
        key: dir.path().join("applier.key"),
    };
    let mut c = ApplierConfig {
        tls: tls.clone(),
        ..ApplierConfig::default()
    };
    let e = format!("{:#}", c.validate().unwrap_err());
    assert!(e.contains("tls.ca") && e.contains("ca.pem"), "{e}");
    for f in ["ca.pem", "applier.pem", "applier.key"] {
        std::fs::write(dir.path().join(f), "x").unwrap();
    }
    c.validate().unwrap();
    c.quic.max_udp_payload = 1000;
    let e = format!("{:#}", c.validate().unwrap_err());
    assert!(e.contains("quic.max-udp-payload"), "{e}");
    c.quic.max_udp_payload = 1472;
    c.quic.silence_limit = Duration::from_millis(10);
    let e = format!("{:#}", c.validate().unwrap_err());
    assert!(
        e.contains("quic.silence-limit") && e.contains("at least 50ms"),
        "{e}"
    );
    c.quic.silence_limit = Duration::from_secs(5);
    c.quic.packet_threshold = 2;
    let e = format!("{:#}", c.validate().unwrap_err());
    assert!(e.contains("quic.packet-threshold"), "{e}");
    c.quic.packet_threshold = 3;
    for bad in [0.5, 11.0, f32::NAN] {
        c.quic.time_threshold = bad;
        let e = format!("{:#}", c.validate().unwrap_err());
        assert!(e.contains("quic.time-threshold"), "{bad}: {e}");
    }
    c.quic.time_threshold = 1.125;
    c.validate().unwrap();

    let mut s = ShipperConfig {
        tls,
        wal_dir: dir.path().join("wal"),
        ..ShipperConfig::default()
    };
    // Missing: valid, with a warning (the shipper waits for it).
    s.validate().unwrap();
    let w = s.wal_dir_missing().unwrap();
    assert!(w.contains("key \"wal-dir\"") && w.contains("waits"), "{w}");
    std::fs::write(dir.path().join("wal"), "x").unwrap();
    let e = format!("{:#}", s.validate().unwrap_err());
    assert!(
        e.contains("key \"wal-dir\"") && e.contains("not a directory"),
        "{e}"
    );
    std::fs::remove_file(dir.path().join("wal")).unwrap();
    std::fs::create_dir(dir.path().join("wal")).unwrap();
    s.validate().unwrap();
    assert_eq!(s.wal_dir_missing(), None);
    s.reconnect_max = Duration::from_millis(1);
    assert!(format!("{:#}", s.validate().unwrap_err()).contains("reconnect-max"));
    s.reconnect_max = Duration::from_secs(5);
    s.applier = "no port here".into();
    assert!(format!("{:#}", s.validate().unwrap_err()).contains("key \"applier\""));
    s.applier = "127.0.0.1:7400".into();
    s.window_bytes = 10;
    assert!(format!("{:#}", s.validate().unwrap_err()).contains("window-bytes"));
    s.window_bytes = 16 << 20;
    s.lanes = MAX_LANES;
    s.validate().unwrap();
    s.lanes = 100_000;
    let e = format!("{:#}", s.validate().unwrap_err());
    assert!(e.starts_with("key \"lanes\": 100000 is above"), "{e}");

    c.quic.silence_limit = Duration::from_secs(5);
    c.validate().unwrap();
    c.binlog_retention = Duration::ZERO;
    let e = format!("{:#}", c.validate().unwrap_err());
    assert!(
        e.starts_with("key \"binlog-retention\": must be > 0"),
        "{e}"
    );
    c.binlog_retention = Duration::from_secs(1);
    c.apply_threads = MAX_APPLY_THREADS + 1;
    let e = format!("{:#}", c.validate().unwrap_err());
    assert!(e.starts_with("key \"apply-threads\": 257 is above"), "{e}");
    c.apply_threads = 0;
    c.runtime_threads = MAX_RUNTIME_THREADS + 1;
    let e = format!("{:#}", c.validate().unwrap_err());
    assert!(
        e.starts_with("key \"runtime-threads\": 257 is above"),
        "{e}"
    );
    c.runtime_threads = 0;
    assert!(c.effective_runtime_threads() >= 1);
    type Field = fn(&mut ApplierConfig) -> &mut i32;
    let nice: [(&str, Field); 2] = [
        ("apply-nice", |c| &mut c.apply_nice),
        ("store-nice", |c| &mut c.store_nice),
    ];
    for (key, field) in nice {
        for bad in [-21, 20] {
            *field(&mut c) = bad;
            let e = format!("{:#}", c.validate().unwrap_err());
            assert!(
                e.starts_with(&format!("key \"{key}\": {bad} is not a nice value")),
                "{e}"
            );
        }
        for good in [-20, 19] {
            *field(&mut c) = good;
            c.validate().unwrap();
        }
    }
    c.cache_size = 0;
    let e = format!("{:#}", c.validate().unwrap_err());
    assert!(e.starts_with("key \"cache-size\": must be > 0"), "{e}");
    c.cache_size = 1 << 20;
    c.write_buffer_size = (4 << 20) - 1;
    let e = format!("{:#}", c.validate().unwrap_err());
    assert!(
        e.starts_with("key \"write-buffer-size\": 4194303 is below the minimum 4MiB"),
        "{e}"
    );
    c.write_buffer_size = 4 << 20;
    c.validate().unwrap();
}
