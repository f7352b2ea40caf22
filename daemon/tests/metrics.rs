//! `GET /metrics` of both daemons: scraped from the admin sockets and from `metrics-listen`
//! over TCP, valid Prometheus text (checked as `promtool check metrics` would, without it:
//! `common::prom`; and by promtool itself where it is installed), with the names the
//! dashboards use, and per-tablet counters that move under traffic.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use common::*;

/// `/metrics` through the admin socket.
fn scrape_socket(socket: &Path) -> String {
    let (status, text) = scrape(socket).expect("the daemon answering /metrics");
    assert_eq!(status, 200);
    text
}

/// `/metrics` over plain HTTP on `metrics-listen`.
fn scrape_tcp(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("text/plain; version=0.0.4"),
        "{head}"
    );
    body.to_string()
}

/// The value of one sample (`name{labels}` exactly as exposed), if present.
fn value(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .map(|v| v.trim().parse().unwrap())
}

fn promtool_check(what: &str, text: &str) {
    common::prom::assert_valid(what, text);
}

/// The checker that stands in for promtool finds what promtool would.
#[test]
fn the_exposition_checker_catches_what_promtool_would() {
    let good = "# HELP tidelog_applier_x_total Things.\n# TYPE tidelog_applier_x_total counter\n\
                tidelog_applier_x_total{tablet=\"t1\"} 3\n\
                # HELP tidelog_applier_d_seconds Durations.\n# TYPE tidelog_applier_d_seconds histogram\n\
                tidelog_applier_d_seconds_bucket{le=\"0.1\"} 1\n\
                tidelog_applier_d_seconds_bucket{le=\"1\"} 2\n\
                tidelog_applier_d_seconds_bucket{le=\"+Inf\"} 2\n\
                tidelog_applier_d_seconds_sum 0.6\ntidelog_applier_d_seconds_count 2\n";
    assert_eq!(common::prom::problems(good), Vec::<String>::new());
    for (bad, want) in [
        (good.replace("x_total", "x"), "ends in _total"),
        (
            good.replace("# HELP tidelog_applier_x_total Things.\n", ""),
            "no HELP",
        ),
        (good.replace("{le=\"1\"} 2", "{le=\"1\"} 0"), "cumulative"),
        (
            good.replace("{tablet=\"t1\"}", "{tablet=t1}"),
            "does not parse",
        ),
        (good.replace("_count 2", "_count 3"), "+Inf bucket"),
        (good.replace("d_seconds", "d_milliseconds"), "base unit"),
        (
            good.replace("applier_x_total", "applierX_total"),
            "snake_case",
        ),
        (
            format!("{good}tidelog_applier_x_total{{tablet=\"t2\"}} 1\n"),
            "does not parse",
        ),
    ] {
        let p = common::prom::problems(&bad);
        assert!(
            p.iter().any(|l| l.contains(want)),
            "want {want:?}: {p:?}\n{bad}"
        );
    }
}

#[test]
fn both_daemons_expose_valid_prometheus_metrics_that_move() {
    let dir = tempfile::tempdir().unwrap();
    let (aport, sport) = (free_tcp_port(), free_tcp_port());
    // Not the default, so the status shows the key reached the runtime.
    let workers = tidelog::config::default_runtime_threads() + 2;
    let c = Cluster::with(
        dir.path(),
        "batch",
        &format!("metrics-listen = \"127.0.0.1:{aport}\"\nruntime-threads = {workers}\n"),
        &format!("lanes = 1\nmetrics-listen = \"127.0.0.1:{sport}\"\n"),
    );
    write_records(&c.wal, "t1", 50, |_| vec![b'x'; 100]);
    write_records(&c.wal, "t2", 30, |_| vec![b'x'; 100]);
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    let applied = |t: &str, n: u64| {
        api(&c.applier_sock, "GET", "/v1/status")
            .is_some_and(|(_, v)| v["tablets"][t]["applied_records"].as_u64() == Some(n))
    };
    wait_for("t1, t2 applied", Duration::from_secs(30), || {
        applied("t1", 50) && applied("t2", 30)
    });
    // The safe time is published shortly after the last batch.
    wait_for("safe time", Duration::from_secs(30), || {
        value(
            &scrape_socket(&c.applier_sock),
            "tidelog_applier_safe_time_initialized",
        ) == Some(1.0)
    });

    let a1 = scrape_socket(&c.applier_sock);
    // The status says the same, with the default limit of one hold.
    let (_, st) = api(&c.applier_sock, "GET", "/v1/status").expect("status");
    assert_eq!(st["apply_yield"]["limit_ms"], 1000, "{st}");
    assert_eq!(st["apply_yield"]["holding_threads"], 0, "{st}");
    assert_eq!(st["apply_yield"]["held_ms_total"], 0, "{st}");
    assert_eq!(st["received_direct_io"]["configured"], false, "{st}");
    assert_eq!(st["received_direct_io"]["in_use"], false, "{st}");
    // On by default; in use where the file system takes O_DIRECT.
    let in_catch_up = &st["received_direct_io_in_catch_up"];
    assert_eq!(in_catch_up["configured"], true, "{st}");
    assert_eq!(
        in_catch_up["in_use"],
        tidelog_wal::direct_io_supported(&std::env::temp_dir()),
        "{st}"
    );
    assert_eq!(st["runtime_threads"], workers, "{st}");
    let s1 = scrape_socket(&c.shipper_sock);
    promtool_check("applier", &a1);
    promtool_check("shipper", &s1);
    for name in [
        "tidelog_applier_role{role=\"replica\"} 1",
        "# TYPE tidelog_applier_received_bytes_total counter",
        "tidelog_applier_received_records_total{tablet=\"t1\"} 50",
        "tidelog_applier_applied_records_total{tablet=\"t1\"} 50",
        "tidelog_applier_applied_records_total{tablet=\"t2\"} 30",
        "# TYPE tidelog_applier_applied_bytes_total counter",
        "tidelog_applier_received_pos_bytes{tablet=\"t1\"}",
        "tidelog_applier_apply_lag_bytes{tablet=\"t1\"} 0",
        "tidelog_applier_safe_time_seconds ",
        "tidelog_applier_safe_time_lag_seconds ",
        "tidelog_applier_safe_time_skew_seconds ",
        "tidelog_applier_tablet_safe_time_lag_seconds{tablet=\"t2\"}",
        "tidelog_applier_connections_total 1",
        "tidelog_applier_frame_errors_total{tablet=\"t1\"} 0",
        "tidelog_applier_checksum_errors_total{tablet=\"t1\"} 0",
        "# TYPE tidelog_applier_apply_batch_duration_seconds histogram",
        "tidelog_applier_apply_batch_duration_seconds_bucket{le=\"+Inf\"}",
        "tidelog_applier_apply_batch_duration_seconds_sum ",
        "tidelog_applier_apply_batch_duration_seconds_count ",
        "# TYPE tidelog_applier_safe_time_publish_duration_seconds histogram",
        "# TYPE tidelog_applier_trx_status_lookups_total counter",
        "tidelog_applier_trx_status_lookups_total{state=\"COMMITTED\"} 0",
        "# TYPE tidelog_applier_apply_held_back_seconds_total counter",
        // Small frames, no catch-up: no apply thread holds back.
        "tidelog_applier_apply_threads_holding_back 0",
    ] {
        assert!(a1.contains(name), "applier metrics lack {name:?}:\n{a1}");
    }
    for name in [
        "tidelog_shipper_io_engine{engine=",
        "tidelog_shipper_connected_lanes 1",
        "# TYPE tidelog_shipper_reconnects_total counter",
        "tidelog_shipper_shipped_records_total{tablet=\"t1\"} 50",
        "tidelog_shipper_acked_records_total{tablet=\"t2\"} 30",
        "# TYPE tidelog_shipper_shipped_bytes_total counter",
        "tidelog_shipper_acked_pos_bytes{tablet=\"t1\"}",
        "tidelog_shipper_lag_bytes{tablet=\"t1\"} 0",
        "tidelog_shipper_stream_reopens_total{tablet=\"t1\"} 0",
    ] {
        assert!(s1.contains(name), "shipper metrics lack {name:?}:\n{s1}");
    }
    // Every state is exported for each tablet (series do not come and go), one of them 1.
    for (text, family, n, current) in [
        (
            &a1,
            "tidelog_applier_tablet_state",
            tidelog::metrics::applier_tablet_states().len(),
            "streaming",
        ),
        (&s1, "tidelog_shipper_tablet_state", 9, "idle"),
    ] {
        let prefix = format!("{family}{{tablet=\"t1\",state=\"");
        let rows: Vec<(&str, u64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix(prefix.as_str()))
            .filter_map(|l| {
                let (state, v) = l.split_once("\"} ")?;
                Some((state, v.trim().parse().ok()?))
            })
            .collect();
        assert_eq!(rows.len(), n, "{family}: {rows:?}");
        let on: Vec<_> = rows.iter().filter(|(_, v)| *v == 1).collect();
        assert_eq!(on.len(), 1, "{family}: {rows:?}");
        assert!(rows.iter().all(|(_, v)| *v <= 1), "{family}: {rows:?}");
        if on[0].0 != current {
            // The shipper's tablet may still be streaming when scraped.
            assert_eq!(
                (family, on[0].0),
                ("tidelog_shipper_tablet_state", "streaming")
            );
        }
    }
    // The applier acknowledged exactly what the shipper counts as acked.
    let acked = value(&s1, "tidelog_shipper_acked_pos_bytes{tablet=\"t1\"}").unwrap();
    assert_eq!(
        value(&a1, "tidelog_applier_received_pos_bytes{tablet=\"t1\"}"),
        Some(acked)
    );
    let batches = value(&a1, "tidelog_applier_apply_batch_duration_seconds_count").unwrap();
    assert!(batches >= 2.0, "{batches} apply batches for two tablets");
    // Safe time was published (the daemon waited for it), so at least once.
    let publishes = value(
        &a1,
        "tidelog_applier_safe_time_publish_duration_seconds_count",
    )
    .unwrap();
    assert!(publishes >= 1.0, "{publishes} safe-time publishes");
    // Each lag stage saw the records (written before the daemons started, so older than 0
    // and, by the source's hybrid times, far younger than a minute).
    for stage in ["received", "applied", "visible"] {
        let series = |part: &str| {
            let name = format!("tidelog_applier_stage_lag_seconds_{part}{{stage=\"{stage}\"}}");
            value(&a1, &name).unwrap_or_else(|| panic!("{name} missing:\n{a1}"))
        };
        let (count, sum) = (series("count"), series("sum"));
        assert!(count >= 1.0, "stage {stage}: {count} observations");
        assert!(
            sum > 0.0 && sum / count < 60.0,
            "stage {stage}: mean age {} s over {count}",
            sum / count
        );
        let inf =
            format!("tidelog_applier_stage_lag_seconds_bucket{{stage=\"{stage}\",le=\"+Inf\"}}");
        assert_eq!(value(&a1, &inf), Some(count), "{inf}");
    }

    // More traffic on t1 only: its counters move, t2's do not.
    write_records(&c.wal, "t1", 25, |_| vec![b'x'; 100]);
    wait_for("t1 applied again", Duration::from_secs(30), || {
        applied("t1", 75)
    });
    let a2 = scrape_tcp(aport);
    let s2 = scrape_tcp(sport);
    promtool_check("applier (tcp)", &a2);
    promtool_check("shipper (tcp)", &s2);
    let get = |t: &str, s: &str| value(t, s).unwrap_or_else(|| panic!("{s} missing:\n{t}"));
    assert_eq!(
        get(&a2, "tidelog_applier_applied_records_total{tablet=\"t1\"}"),
        75.0
    );
    assert_eq!(
        get(&a2, "tidelog_applier_applied_records_total{tablet=\"t2\"}"),
        30.0
    );
    assert!(
        get(&a2, "tidelog_applier_applied_bytes_total{tablet=\"t1\"}")
            > get(&a1, "tidelog_applier_applied_bytes_total{tablet=\"t1\"}")
    );
    assert!(
        get(&a2, "tidelog_applier_received_bytes_total{tablet=\"t1\"}")
            > get(&a1, "tidelog_applier_received_bytes_total{tablet=\"t1\"}")
    );
    assert_eq!(
        get(&a2, "tidelog_applier_received_bytes_total{tablet=\"t2\"}"),
        get(&a1, "tidelog_applier_received_bytes_total{tablet=\"t2\"}")
    );
    assert!(get(&a2, "tidelog_applier_apply_batch_duration_seconds_count") > batches);
    for stage in ["received", "applied"] {
        let name = format!("tidelog_applier_stage_lag_seconds_count{{stage=\"{stage}\"}}");
        assert!(get(&a2, &name) > get(&a1, &name), "{name} did not grow");
    }
    assert_eq!(
        get(&s2, "tidelog_shipper_shipped_records_total{tablet=\"t1\"}"),
        75.0
    );
    assert!(
        get(&s2, "tidelog_shipper_shipped_bytes_total{tablet=\"t1\"}")
            > get(&s1, "tidelog_shipper_shipped_bytes_total{tablet=\"t1\"}")
    );
    // Only /metrics on the TCP listener: the admin API stays on the socket.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", aport)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 404"), "{text}");
}
