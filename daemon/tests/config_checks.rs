//! Config values the parser used to let through, checked with the real binary:
//! `tidelog apply|ship --config F --check` must fail (exit 1) naming the file and the key,
//! and a daemon must not start on them. Every process runs with its working directory in a
//! fresh temporary directory, so a path that silently became "the current directory" would
//! show up there.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::Cluster;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `tidelog <args>` in `cwd` (RUST_LOG unset, so the `log-level` key counts), killed if it
/// has not exited within 30 s (a daemon that starts instead of failing).
fn tidelog_in(cwd: &Path, args: &[&str]) -> Output {
    common::tidelog_bounded_in(Some(cwd), args, Duration::from_secs(30))
}

/// A valid cluster's configs, and an empty directory to run the binary in.
struct Setup {
    _tmp: tempfile::TempDir,
    cluster: Cluster,
    cwd: std::path::PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let cluster = Cluster::new(&tmp.path().join("cluster"), "batch", "");
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    Setup {
        _tmp: tmp,
        cluster,
        cwd,
    }
}

impl Setup {
    /// `(command, config file)` of the daemon `cmd` (`apply` or `ship`).
    fn cfg(&self, cmd: &str) -> &Path {
        match cmd {
            "apply" => &self.cluster.applier_cfg,
            _ => &self.cluster.shipper_cfg,
        }
    }

    /// Writes `cmd`'s config with `edit` applied to the valid one: lines of `set` replace the
    /// line setting the same key (in the file's order, so `ca = ` finds the `[tls]` one),
    /// or, for a key the file does not set, go at the top (before any table).
    fn write(&self, cmd: &str, set: &str) -> String {
        let path = self.cfg(cmd);
        let good = std::fs::read_to_string(path).unwrap();
        let mut lines: Vec<String> = good.lines().map(str::to_string).collect();
        let mut top = String::new();
        for l in set.lines() {
            let key = l.split('=').next().unwrap().trim();
            match lines
                .iter()
                .position(|x| x.split('=').next().unwrap().trim() == key)
            {
                Some(i) => lines[i] = l.to_string(),
                None => top.push_str(&format!("{l}\n")),
            }
        }
        std::fs::write(path, format!("{top}{}\n", lines.join("\n"))).unwrap();
        good
    }

    /// `tidelog cmd --config F [--check]` with `set` applied; restores the valid config.
    fn run(&self, cmd: &str, set: &str, check: bool) -> Output {
        let path = self.cfg(cmd);
        let good = self.write(cmd, set);
        let mut args = vec![cmd, "--config", path.to_str().unwrap()];
        if check {
            args.push("--check");
        }
        let out = tidelog_in(&self.cwd, &args);
        std::fs::write(path, good).unwrap();
        out
    }

    /// `set` must fail `--check` (and, with `start`, a real start) with exit 1 and an error
    /// naming the file, `key` and every one of `what`.
    fn refused(&self, cmd: &str, set: &str, key: &str, what: &[&str], start: bool) {
        let cfg = self.cfg(cmd).display().to_string();
        for check in [true, false] {
            if !check && !start {
                continue;
            }
            let out = self.run(cmd, set, check);
            let err = text(&out.stderr);
            let how = if check { "--check" } else { "start" };
            assert_eq!(
                out.status.code(),
                Some(1),
                "{cmd} {how} with {set:?}: {err}"
            );
            assert!(
                err.contains(&format!("{cfg}: key \"{key}\"")),
                "{cmd} {how} with {set:?} does not name the file and key {key:?}: {err}"
            );
            for w in what {
                assert!(
                    err.contains(w),
                    "{cmd} {how} with {set:?}: no {w:?} in {err}"
                );
            }
            assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
            let left: Vec<_> = std::fs::read_dir(&self.cwd).unwrap().collect();
            assert!(
                left.is_empty(),
                "{cmd} {how} with {set:?} wrote into its working directory: {left:?}"
            );
        }
    }

    fn accepted(&self, cmd: &str, set: &str) {
        let out = self.run(cmd, set, true);
        assert!(
            out.status.success(),
            "{cmd} --check with {set:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn empty_paths_are_refused_naming_the_file_and_key() {
    let s = setup();
    s.accepted("apply", "");
    s.accepted("ship", "");
    // data-dir = "" used to pass --check, and a start wrote store/, received/ and
    // quic-reset.key into the working directory.
    s.refused("apply", "data-dir = \"\"", "data-dir", &["empty"], true);
    s.refused(
        "apply",
        "admin-socket = \"\"",
        "admin-socket",
        &["empty"],
        true,
    );
    s.refused("apply", "data-dir = \"  \"", "data-dir", &["empty"], false);
    for (cmd, key) in [("apply", "ca"), ("apply", "cert"), ("apply", "key")] {
        s.refused(
            cmd,
            &format!("{key} = \"\""),
            &format!("tls.{key}"),
            &["empty"],
            false,
        );
    }
    s.refused("ship", "wal-dir = \"\"", "wal-dir", &["empty"], true);
    s.refused(
        "ship",
        "admin-socket = \"\"",
        "admin-socket",
        &["empty"],
        false,
    );
    for key in ["ca", "cert", "key"] {
        s.refused(
            "ship",
            &format!("{key} = \"\""),
            &format!("tls.{key}"),
            &["empty"],
            false,
        );
    }
    // Addresses: empty is not an address either.
    s.refused(
        "apply",
        "metrics-listen = \"\"",
        "metrics-listen",
        &[],
        false,
    );
    s.refused(
        "ship",
        "metrics-listen = \"\"",
        "metrics-listen",
        &[],
        false,
    );
    s.refused("apply", "listen = \"\"", "listen", &[], false);
    s.refused("ship", "applier = \"\"", "applier", &[], false);
}

#[test]
fn log_level_typos_are_refused_naming_the_directive() {
    let s = setup();
    let forms = "error, warn, info, debug, trace, off";
    for cmd in ["apply", "ship"] {
        // Each of these parses as a tracing filter (a target name) that logs nothing.
        for (value, directive) in [
            ("verbose", "verbose"),
            ("warning", "warning"),
            ("debug,tidelog_applier", "tidelog_applier"),
            ("tidelog=verbose", "tidelog=verbose"),
            ("=debug", "=debug"),
        ] {
            let set = format!("log-level = \"{value}\"");
            let d = format!("directive {directive:?}");
            s.refused(cmd, &set, "log-level", &[&d, forms, "target=level"], false);
        }
        s.refused(cmd, "log-level = \"\"", "log-level", &["empty"], false);
        // What the example configs document: a level, or per module.
        for value in [
            "info",
            "INFO",
            "Warn",
            "error",
            "trace",
            "off",
            "debug",
            "tidelog_applier=debug,info",
            "tidelog_shipper=debug, warn",
            "tidelog_wal=TRACE",
        ] {
            s.accepted(cmd, &format!("log-level = \"{value}\""));
        }
    }
    // A typo in a start (not only --check) is refused too, before any logging is set up.
    s.refused(
        "apply",
        "log-level = \"verbose\"",
        "log-level",
        &["verbose"],
        true,
    );
}

#[test]
fn out_of_bounds_values_are_refused_naming_the_key() {
    let s = setup();
    s.refused("ship", "lanes = 100000", "lanes", &["100000", "256"], true);
    s.refused("ship", "lanes = 257", "lanes", &["257"], false);
    s.accepted("ship", "lanes = 256");
    s.accepted("ship", "lanes = 0");
    s.refused(
        "apply",
        "binlog-retention = \"0s\"",
        "binlog-retention",
        &["> 0"],
        true,
    );
    s.accepted("apply", "binlog-retention = \"1s\"");
    s.refused("apply", "cache-size = 0", "cache-size", &["> 0"], false);
    s.refused(
        "apply",
        "cache-size = \"0MiB\"",
        "cache-size",
        &["> 0"],
        false,
    );
    s.accepted("apply", "cache-size = \"1MiB\"");
    s.refused(
        "apply",
        "expect-tablets = [\"t1\", \"t2\", \"t1\"]",
        "expect-tablets",
        &["\"t1\"", "more than once"],
        false,
    );
    s.accepted("apply", "expect-tablets = [\"t1\", \"t2\"]");
    s.refused(
        "apply",
        "received-direct-io = true\nsegment-size = 100000",
        "segment-size",
        &["100000", "multiple of 4KiB", "received-direct-io"],
        false,
    );
    s.accepted(
        "apply",
        "received-direct-io = true\nsegment-size = \"128KiB\"",
    );
    s.refused(
        "apply",
        "max-staleness = \"1s\"\napply-yield-to-intake = \"2s\"",
        "apply-yield-to-intake",
        &["below max-staleness"],
        false,
    );
    s.accepted("apply", "apply-yield-to-intake = \"0s\"");
}

/// `--check` loads the `[tls]` PEM files and builds the TLS configuration the daemon would
/// (a start does the same before its first side effect): a garbage key, a key that is not
/// the certificate's and a CA file without a certificate fail naming the file, the key and
/// the PEM file; a `tidelog certs init` set passes without a warning.
#[test]
fn tls_files_are_loaded_and_matched_by_check() {
    let s = setup();
    let tls = s.cluster.root.join("tls");
    for cmd in ["apply", "ship"] {
        let out = s.run(cmd, "", true);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{cmd} --check: {stderr}");
        assert_eq!(stdout, format!("{}: ok\n", s.cfg(cmd).display()));
        assert!(!stderr.contains("warning"), "{cmd} --check: {stderr}");
    }

    let bad = s.cluster.root.join("bad");
    std::fs::create_dir(&bad).unwrap();
    let file = |name: &str, contents: &str| {
        let p = bad.join(name);
        std::fs::write(&p, contents).unwrap();
        p.display().to_string()
    };
    let garbage = file("garbage.key", "this is not a key\n");
    let armoured = file(
        "armoured.key",
        "-----BEGIN PRIVATE KEY-----\nAAAAAAAA\n-----END PRIVATE KEY-----\n",
    );
    let key_only = file(
        "key-only.pem",
        &std::fs::read_to_string(tls.join("ca.key")).unwrap(),
    );
    let bad_cert = file(
        "garbled.pem",
        "-----BEGIN CERTIFICATE-----\nAAAAAAAA\n-----END CERTIFICATE-----\n",
    );
    for (cmd, own, other) in [
        ("apply", "applier", "shipper"),
        ("ship", "shipper", "applier"),
    ] {
        // Before: a start failed only once the store was open (applier) or in the library's
        // own words (shipper); --check said ok.
        let set = format!("key = \"{garbage}\"");
        s.refused(cmd, &set, "tls.key", &[&garbage, "no private key"], true);
        let set = format!("key = \"{armoured}\"");
        s.refused(
            cmd,
            &set,
            "tls.key",
            &[&armoured, "not a usable private key"],
            false,
        );
        let theirs = tls.join(format!("{other}.key")).display().to_string();
        let mine = tls.join(format!("{own}.pem")).display().to_string();
        let set = format!("key = \"{theirs}\"");
        s.refused(
            cmd,
            &set,
            "tls.key",
            &[&theirs, &mine, "is not the private key of the certificate"],
            true,
        );
        let set = format!("ca = \"{key_only}\"");
        s.refused(cmd, &set, "tls.ca", &[&key_only, "no certificate"], false);
        let set = format!("ca = \"{bad_cert}\"");
        s.refused(
            cmd,
            &set,
            "tls.ca",
            &[&bad_cert, "not a usable CA certificate"],
            false,
        );
        let set = format!("cert = \"{bad_cert}\"");
        s.refused(
            cmd,
            &set,
            "tls.cert",
            &[&bad_cert, "not a usable certificate"],
            false,
        );
    }
}

/// A CA certificate outside its validity fails `--check` and the start (every handshake
/// would fail), naming the key, the file and the date.
#[test]
fn certificates_outside_their_validity_are_refused() {
    let s = setup();
    let dir = s.cluster.root.join("dated");
    std::fs::create_dir(&dir).unwrap();
    let ca = |name: &str, from: i32, until: i32| {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.not_before = rcgen::date_time_ymd(from, 1, 1);
        p.not_after = rcgen::date_time_ymd(until, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        let path = dir.join(name);
        std::fs::write(&path, p.self_signed(&key).unwrap().pem()).unwrap();
        path.display().to_string()
    };
    let expired = ca("expired.pem", 2001, 2002);
    let future = ca("future.pem", 2090, 2091);
    for cmd in ["apply", "ship"] {
        let set = format!("ca = \"{expired}\"");
        s.refused(
            cmd,
            &set,
            "tls.ca",
            &[&expired, "expired on 2002-01-01"],
            true,
        );
        let set = format!("ca = \"{future}\"");
        s.refused(
            cmd,
            &set,
            "tls.ca",
            &[&future, "not valid before 2090-01-01"],
            false,
        );
    }
}

/// A private key others can read is a warning (not an error) in `--check` and at start;
/// group read for the daemon's own group is the README's `chmod 0640` and is not.
#[test]
fn readable_private_key_is_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let s = setup();
    let key = s.cluster.root.join("tls/applier.key");
    let chmod = |mode: u32| {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let warning = format!(
        "warning: {}: key \"tls.key\": {} is accessible by group or others",
        s.cfg("apply").display(),
        key.display()
    );
    for (mode, warns) in [
        (0o644, true),
        (0o604, true),
        (0o660, true),
        (0o640, false),
        (0o600, false),
    ] {
        chmod(mode);
        let out = s.run("apply", "", true);
        let err = text(&out.stderr);
        assert!(out.status.success(), "mode {mode:o}: {err}");
        assert_eq!(err.contains(&warning), warns, "mode {mode:o}: {err}");
        if warns {
            assert!(err.contains(&format!("mode {mode:04o}")), "{err}");
        }
    }

    // At start: logged, and the daemon runs.
    chmod(0o644);
    let log = s.cluster.root.join("applier.log");
    let mut applier = s.cluster.start_applier();
    common::wait_for("the applier ready", Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("applier ready"))
    });
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("WARN") && logged.contains("is accessible by group or others"),
        "{logged}"
    );
    assert!(applier.terminate(Duration::from_secs(30)));
}

/// `io-engine = "uring"` is probed by `--check` as the shipper probes it at start: without a
/// working io_uring, `--check` fails naming the key; `auto` then only warns.
#[test]
fn io_engine_is_probed_by_check() {
    let s = setup();
    s.accepted("ship", "io-engine = \"std\"");
    match tidelog_shipper::io::probe_uring() {
        Ok(()) => s.accepted("ship", "io-engine = \"uring\""),
        Err(why) => {
            s.refused(
                "ship",
                "io-engine = \"uring\"",
                "io-engine",
                &["io_uring is unavailable", &why],
                true,
            );
            let out = s.run("ship", "io-engine = \"auto\"", true);
            let err = text(&out.stderr);
            assert!(out.status.success(), "{err}");
            assert!(err.contains("falls back to the std engine"), "{err}");
        }
    }
}

/// What a start refuses, `--check` refuses too, with the same message naming the key: a
/// `segment-size` the received logs' writer refuses (a start used to accept it and fail
/// each tablet as it arrived), the QUIC port, the metrics port or the admin socket held by
/// another process, and a `data-dir` that is a file or lies under one.
#[test]
fn check_refuses_what_a_start_refuses() {
    let s = setup();
    s.refused(
        "apply",
        "segment-size = \"2TiB\"",
        "segment-size",
        &["2199023255552", "above 1 TiB"],
        true,
    );
    s.accepted("apply", "segment-size = \"1TiB\"");
    // The QUIC port.
    let held = std::net::UdpSocket::bind(("127.0.0.1", s.cluster.port)).unwrap();
    let addr = format!("udp 127.0.0.1:{}", s.cluster.port);
    s.refused("apply", "", "listen", &[&addr, "in use"], true);
    drop(held);
    s.accepted("apply", "");
    // The metrics port, on both daemons.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let set = format!("metrics-listen = \"127.0.0.1:{port}\"");
    let addr = format!("tcp 127.0.0.1:{port}");
    s.refused("apply", &set, "metrics-listen", &[&addr, "in use"], true);
    s.refused("ship", &set, "metrics-listen", &[&addr, "in use"], true);
    drop(held);
    s.accepted("apply", &set);
    // The admin socket: another process listens on it, or it is another kind of file.
    let sock = s.cluster.root.join("held.sock");
    let held = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let set = format!("admin-socket = \"{}\"", sock.display());
    for cmd in ["apply", "ship"] {
        s.refused(
            cmd,
            &set,
            "admin-socket",
            &["in use by a running process"],
            true,
        );
    }
    drop(held);
    // Nobody listens now: a stale socket, which a start replaces.
    s.accepted("apply", &set);
    let plain = s.cluster.root.join("plain-file");
    std::fs::write(&plain, "keep me").unwrap();
    let set = format!("admin-socket = \"{}\"", plain.display());
    s.refused("apply", &set, "admin-socket", &["not a socket"], false);
    let set = format!("admin-socket = \"{}/x.sock\"", plain.display());
    s.refused("ship", &set, "admin-socket", &["is not a directory"], false);
    assert_eq!(std::fs::read(&plain).unwrap(), b"keep me");
    // data-dir: a file, or under a file.
    let set = format!("data-dir = \"{}\"", plain.display());
    s.refused("apply", &set, "data-dir", &["is not a directory"], true);
    let set = format!("data-dir = \"{}/store\"", plain.display());
    s.refused(
        "apply",
        &set,
        "data-dir",
        &["is not a directory (making "],
        false,
    );
    assert_eq!(std::fs::read(&plain).unwrap(), b"keep me");
    // A QUIC reset key in data-dir that is not one.
    let data = s.cluster.root.join("data-with-bad-key");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("quic-reset.key"), "short").unwrap();
    let set = format!("data-dir = \"{}\"", data.display());
    s.refused(
        "apply",
        &set,
        "data-dir",
        &["quic-reset.key", "must be 64 bytes, found 5"],
        true,
    );
}

/// Stderr of a refusal: short, and no panic.
fn short_refusal(out: &Output, what: &str) -> String {
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: {}",
        &err[..err.len().min(2000)]
    );
    assert!(
        err.len() < 4096,
        "{what}: {} bytes of stderr: {}…",
        err.len(),
        &err[..err.len().min(300)]
    );
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{what}: {err}"
    );
    err
}

/// A file the daemon reads is read up to a cap: a PEM file at `/dev/zero` (which used to
/// abort on a 2 GB allocation with a backtrace) or a config file above 16 MiB is a short
/// error naming the file and the cap; an error about a huge value or line in a config file
/// quotes a snippet, never the whole.
#[test]
fn file_reads_and_quoted_inputs_are_capped() {
    let s = setup();
    for (cmd, key) in [("apply", "ca"), ("apply", "key"), ("ship", "cert")] {
        let set = format!("{key} = \"/dev/zero\"");
        s.refused(
            cmd,
            &set,
            &format!("tls.{key}"),
            &["/dev/zero", "more than a PEM file may (1 MiB)"],
            cmd == "apply" && key == "ca",
        );
        let out = s.run(cmd, &set, true);
        short_refusal(&out, &set);
    }

    // Above the cap: refused from its size, not read (nor echoed).
    let big = s.cluster.root.join("big.toml");
    {
        let mut f = std::fs::File::create(&big).unwrap();
        use std::io::Write;
        f.write_all(b"listen = ").unwrap();
        f.set_len(20 << 20).unwrap();
    }
    let bigp = big.to_str().unwrap();
    for cmd in ["apply", "ship"] {
        for check in [true, false] {
            let mut args = vec![cmd, "--config", bigp];
            if check {
                args.push("--check");
            }
            let out = tidelog_in(&s.cwd, &args);
            let err = short_refusal(&out, cmd);
            assert!(
                err.contains(&format!(
                    "{bigp} holds 20971520 bytes, more than a config file may (16 MiB)"
                )),
                "{err}"
            );
        }
    }

    // Under the cap, with a value, a key and a line of 4 MiB: the message names the key
    // or the line and quotes a snippet.
    let huge = "x".repeat(4 << 20);
    let cases = [
        (
            format!("max-staleness = \"{huge}\""),
            "key \"max-staleness\": invalid duration \"xxxx",
        ),
        (format!("{huge} = 1"), "unknown key \"xxxx"),
        (
            format!("listen = {huge}"),
            "TOML parse error at line 1, column 10",
        ),
        (
            format!("expect-tablets = [\"{huge}\"]"),
            "key \"expect-tablets\"",
        ),
    ];
    let path = s.cfg("apply").to_path_buf();
    let good = std::fs::read_to_string(&path).unwrap();
    for (line, want) in &cases {
        std::fs::write(&path, format!("{line}\n{good}")).unwrap();
        let out = tidelog_in(
            &s.cwd,
            &["apply", "--config", path.to_str().unwrap(), "--check"],
        );
        let err = short_refusal(&out, want);
        assert!(err.contains(want), "{want}: {err}");
        assert!(
            err.contains(&format!("({} bytes)", huge.len())) || err.contains('…'),
            "{err}"
        );
    }
    std::fs::write(&path, good).unwrap();
}
