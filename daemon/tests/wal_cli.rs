//! `tidelog wal dump|append|check`, run as the real binary.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const TXN_A: &str = "000102030405060708090a0b0c0d0e0f";
const TXN_B: &str = "ff0102030405060708090a0b0c0d0e0f";

/// Records of two tablets, all five kinds, a binary key via b64, a tombstone, trx ids and
/// gtids, an integer ht, and an empty line.
fn sample_input() -> String {
    [
        r#"{"tablet":"t1","kind":"write","ht":"1000","trx_id":"7:1","gtid":"0-1-1","ops":[{"key":"k1","value":"v1"},{"key":{"b64":"AP8="},"value":null}]}"#.to_string(),
        format!(r#"{{"tablet":"t1","kind":"intent","ht":"1001","txn":"{TXN_A}","trx_id":"7:2","ops":[{{"key":"ik","value":"iv"}}]}}"#),
        String::new(),
        format!(r#"{{"tablet":"t2","kind":"intent","ht":1002,"txn":"{TXN_A}","ops":[{{"key":"ik2","value":""}}]}}"#),
        format!(r#"{{"tablet":"t1","kind":"commit","ht":"1003","txn":"{TXN_A}","trx_id":"7:2","gtid":"0-1-2","participants":["t1","t2"]}}"#),
        format!(r#"{{"tablet":"t2","kind":"abort","ht":"1004","txn":"{TXN_B}","trx_id":"8:1"}}"#),
        r#"{"tablet":"t2","kind":"heartbeat","ht":"1005"}"#.to_string(),
    ]
    .join("\n")
        + "\n"
}

fn tidelog(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidelog"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    // A child that refuses its arguments exits without reading: a broken pipe is fine.
    if let Err(e) = input.write_all(stdin) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn ok(o: Output) -> Output {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        stdout(&o),
        stderr(&o)
    );
    o
}

fn fails(o: Output) -> Output {
    assert_eq!(
        o.status.code(),
        Some(1),
        "expected exit 1\nstdout:\n{}\nstderr:\n{}",
        stdout(&o),
        stderr(&o)
    );
    o
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn append(dir: &Path, input: &str, extra: &[&str]) -> Output {
    let mut args = vec!["wal", "append", "--dir", s(dir)];
    args.extend_from_slice(extra);
    tidelog(&args, input.as_bytes())
}

fn dump(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["wal", "dump", "--dir", s(dir)];
    args.extend_from_slice(extra);
    tidelog(&args, b"")
}

fn check(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["wal", "check", "--dir", s(dir)];
    args.extend_from_slice(extra);
    tidelog(&args, b"")
}

fn lines(out: &str) -> Vec<Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn segments(tablet_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(tablet_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// `n` write records for `tablet` with ht from `ht0`, values big enough to fill segments.
fn many(tablet: &str, ht0: u64, n: u64) -> String {
    (0..n)
        .map(|i| {
            format!(
                r#"{{"tablet":"{tablet}","kind":"write","ht":"{}","trx_id":"3:{}","ops":[{{"key":"key{i}","value":"{}"}}]}}"#,
                ht0 + i,
                i + 1,
                "x".repeat(100 + (i as usize * 13) % 300)
            ) + "\n"
        })
        .collect()
}

fn flip_byte(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, offset).unwrap();
}

/// `tidelog wal dump | head`: a reader that goes away ends the dump quietly, with
/// success, not with an error about writing stdout.
#[test]
fn dump_into_a_closed_pipe_exits_quietly() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    ok(append(&wal, &sample_input(), &[]));
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidelog"))
        .args(["wal", "dump", "--dir"])
        .arg(&wal)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before the dump writes: its first write finds no reader.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        stderr(&o)
    );
    assert_eq!(stderr(&o), "");
}

#[test]
fn append_then_dump_all_kinds() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    let o = ok(append(&wal, &sample_input(), &[]));
    let err = stderr(&o);
    assert!(err.contains("6 records"), "{err}");
    assert!(
        err.contains("t1: 3 records") && err.contains("t2: 3 records"),
        "{err}"
    );

    let out = stdout(&ok(dump(&wal, &[])));
    let v = lines(&out);
    assert_eq!(v.len(), 6);
    // Sorted by tablet, then position.
    let order: Vec<_> = v
        .iter()
        .map(|r| (r["tablet"].as_str().unwrap(), r["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        order,
        [
            ("t1", "write"),
            ("t1", "intent"),
            ("t1", "commit"),
            ("t2", "intent"),
            ("t2", "abort"),
            ("t2", "heartbeat"),
        ]
    );
    assert_eq!(v[0]["pos"], 0);
    assert_eq!(v[0]["ht"], "1000");
    assert_eq!(v[0]["trx_id"], "7:1");
    assert_eq!(v[0]["gtid"], "0-1-1");
    assert_eq!(v[0]["ops"][0]["key"], "k1");
    assert_eq!(v[0]["ops"][0]["value"], "v1");
    assert_eq!(v[0]["ops"][1]["key"]["b64"], "AP8=");
    assert!(v[0]["ops"][1]["value"].is_null());
    assert!(v[1]["pos"].as_u64().unwrap() > 0);
    assert_eq!(v[1]["txn"], TXN_A);
    assert_eq!(v[2]["participants"], serde_json::json!(["t1", "t2"]));
    assert_eq!(v[2]["gtid"], "0-1-2");
    assert_eq!(v[3]["ht"], "1002");
    assert_eq!(v[3]["ops"][0]["value"], "");
    assert!(v[3].get("trx_id").is_none());
    assert_eq!(v[4]["txn"], TXN_B);
    assert_eq!(v[4]["trx_id"], "8:1");
    // Fields in the documented order, only those the kind has.
    assert_eq!(
        out.lines().last().unwrap(),
        format!(
            r#"{{"tablet":"t2","pos":{},"kind":"heartbeat","ht":"1005"}}"#,
            v[5]["pos"]
        )
    );

    // One tablet only.
    let t2 = lines(&stdout(&ok(dump(&wal, &["--tablet", "t2"]))));
    assert_eq!(t2.len(), 3);
    assert!(t2.iter().all(|r| r["tablet"] == "t2"));
    // --written gives the same (everything was synced before append exited).
    assert_eq!(stdout(&ok(dump(&wal, &["--written"]))), out);
}

#[test]
fn dump_append_dump_round_trip_is_byte_identical() {
    let d = tempfile::tempdir().unwrap();
    let a = d.path().join("a");
    let b = d.path().join("b");
    // Small segments in the source so the log spans several of them.
    let input = sample_input() + &many("t3", 5000, 150);
    ok(append(
        &a,
        &input,
        &["--segment-size", "8KiB", "--sync", "always"],
    ));
    assert!(segments(&a.join("t3")).len() > 3);
    let first = ok(dump(&a, &[])).stdout;
    assert_eq!(lines(std::str::from_utf8(&first).unwrap()).len(), 156);
    let o = ok(tidelog(&["wal", "append", "--dir", s(&b)], &first));
    assert!(stderr(&o).contains("156 records"), "{}", stderr(&o));
    let second = ok(dump(&b, &[])).stdout;
    assert!(first == second, "dumps differ");
    // And once more with --sync none and other segment sizes.
    let c = d.path().join("c");
    ok(tidelog(
        &[
            "wal",
            "append",
            "--dir",
            s(&c),
            "--sync",
            "none",
            "--segment-size",
            "16384",
        ],
        &second,
    ));
    assert!(ok(dump(&c, &[])).stdout == first);
}

#[test]
fn bad_line_stops_with_its_number_and_keeps_earlier_lines() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    let input = [
        r#"{"tablet":"t1","kind":"heartbeat","ht":"10"}"#,
        r#"{"tablet":"t2","kind":"heartbeat","ht":"11"}"#,
        r#"{"tablet":"t1","kind":"heartbeat","ht":"12","colour":"red"}"#,
        r#"{"tablet":"t1","kind":"heartbeat","ht":"13"}"#,
    ]
    .join("\n");
    let o = fails(append(&wal, &input, &[]));
    let err = stderr(&o);
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("colour"), "{err}");
    let v = lines(&stdout(&ok(dump(&wal, &[]))));
    let hts: Vec<_> = v.iter().map(|r| r["ht"].as_str().unwrap()).collect();
    assert_eq!(hts, ["10", "11"]);

    // More kinds of bad line, each at line 2 after a good one; nothing of it is written.
    let bad: &[(&[u8], &str)] = &[
        (b"not json at all", "line 2"),
        (br#"{"tablet":"t1","kind":"write","ht":"21"}"#, "ops"),
        (br#"{"tablet":"t1","kind":"heartbeat","ht":"-5"}"#, "ht"),
        (br#"{"tablet":"bad/name","kind":"heartbeat","ht":"21"}"#, "tablet"),
        (b"{\"tablet\":\"t1\",\"kind\":\"write\",\"ht\":\"21\",\"ops\":[{\"key\":\"\xff\xfe\",\"value\":null}]}", "UTF-8"),
        (br#"{"tablet":"t1","kind":"abort","ht":"21","txn":"123"}"#, "txn"),
    ];
    for (i, (line, what)) in bad.iter().enumerate() {
        let ht = 100 + 10 * i as u64;
        let mut input = format!(r#"{{"tablet":"t1","kind":"heartbeat","ht":"{ht}"}}"#).into_bytes();
        input.push(b'\n');
        input.extend_from_slice(line);
        input.extend_from_slice(b"\n");
        let o = fails(tidelog(&["wal", "append", "--dir", s(&wal)], &input));
        let err = stderr(&o);
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains(what), "expected {what:?} in: {err}");
        let last = lines(&stdout(&ok(dump(&wal, &["--tablet", "t1"]))))
            .pop()
            .unwrap();
        assert_eq!(last["ht"], ht.to_string(), "{err}");
    }
    ok(check(&wal, &[]));
}

#[test]
fn append_tablet_flag_names_the_tablet_of_lines_without_one() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    // Without --tablet a line must name its tablet (as before).
    let o = fails(append(&wal, r#"{"kind":"heartbeat","ht":"5"}"#, &[]));
    let err = stderr(&o);
    assert!(err.contains("line 1") && err.contains("tablet"), "{err}");
    assert!(!wal.join("t1").exists());

    // With --tablet t1: lines without a tablet go to t1, lines naming t1 are accepted.
    let input = [
        r#"{"kind":"heartbeat","ht":"10"}"#,
        r#"{"tablet":"t1","kind":"write","ht":"11","ops":[{"key":"k","value":"v"}]}"#,
        "",
        r#"  { "ht":"12" , "kind":"write","ops":[{"key":"k2","value":null}]}"#,
        r#"{"kind":"heartbeat","ht":13}"#,
    ]
    .join("\n");
    ok(append(&wal, &input, &["--tablet", "t1"]));
    let v = lines(&stdout(&ok(dump(&wal, &[]))));
    let got: Vec<_> = v
        .iter()
        .map(|r| (r["tablet"].as_str().unwrap(), r["ht"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        [("t1", "10"), ("t1", "11"), ("t1", "12"), ("t1", "13")]
    );
    assert_eq!(v[2]["ops"][0]["key"], "k2");
    assert!(v[2]["ops"][0]["value"].is_null());

    // A line naming another tablet stops it, naming the line and both tablets; what came
    // before is written, nothing of the other tablet is.
    let input = [
        r#"{"kind":"heartbeat","ht":"20"}"#,
        r#"{"tablet":"t2","kind":"heartbeat","ht":"21"}"#,
        r#"{"kind":"heartbeat","ht":"22"}"#,
    ]
    .join("\n");
    let o = fails(append(&wal, &input, &["--tablet", "t1"]));
    let err = stderr(&o);
    assert!(err.contains("line 2"), "{err}");
    assert!(err.contains("t2") && err.contains("--tablet t1"), "{err}");
    let last = lines(&stdout(&ok(dump(&wal, &["--tablet", "t1"]))))
        .pop()
        .unwrap();
    assert_eq!(last["ht"], "20");
    assert!(!wal.join("t2").exists());

    // Other faults of a line without a tablet are still reported as such.
    let o = fails(append(
        &wal,
        r#"{"kind":"write","ht":"30"}"#,
        &["--tablet", "t1"],
    ));
    let err = stderr(&o);
    assert!(err.contains("line 1") && err.contains("ops"), "{err}");
    // A bad tablet id is a bad command line.
    let o = append(&wal, "", &["--tablet", "bad/name"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    ok(check(&wal, &[]));
}

#[test]
fn ht_not_increasing_is_refused_with_line_number() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    let input = [
        r#"{"tablet":"t1","kind":"heartbeat","ht":"10"}"#,
        r#"{"tablet":"t2","kind":"heartbeat","ht":"5"}"#,
        r#"{"tablet":"t1","kind":"heartbeat","ht":"20"}"#,
        r#"{"tablet":"t1","kind":"heartbeat","ht":"20"}"#,
    ]
    .join("\n");
    let o = fails(append(&wal, &input, &[]));
    let err = stderr(&o);
    assert!(err.contains("line 4"), "{err}");
    assert!(err.contains("not greater"), "{err}");
    assert_eq!(lines(&stdout(&ok(dump(&wal, &[])))).len(), 3);
    // Across runs: the log's last ht counts.
    let o = fails(append(
        &wal,
        r#"{"tablet":"t1","kind":"heartbeat","ht":"15"}"#,
        &[],
    ));
    assert!(stderr(&o).contains("line 1"), "{}", stderr(&o));
    ok(append(
        &wal,
        r#"{"tablet":"t1","kind":"heartbeat","ht":"21"}"#,
        &[],
    ));
    assert_eq!(lines(&stdout(&ok(dump(&wal, &[])))).len(), 4);
}

#[test]
fn check_passes_and_summarises_each_tablet() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    ok(append(
        &wal,
        &(sample_input() + &many("t3", 5000, 100)),
        &["--segment-size", "8KiB"],
    ));
    let o = ok(check(&wal, &[]));
    let out = stdout(&o);
    let l: Vec<_> = out.lines().collect();
    assert_eq!(l.len(), 3, "{out}");
    assert!(
        l[0].starts_with("t1: ok segments=1 records=3 pos=0.."),
        "{out}"
    );
    assert!(l[0].contains("ht=1000..1003"), "{out}");
    assert!(l[1].starts_with("t2: ok segments=1 records=3 "), "{out}");
    assert!(l[1].contains("ht=1002..1005"), "{out}");
    let segs = segments(&wal.join("t3"));
    assert!(
        l[2].starts_with(&format!(
            "t3: ok segments={} records=100 pos=0..",
            segs.len()
        )),
        "{out}"
    );
    assert!(l[2].contains("ht=5000..5099"), "{out}");
    // pos=0..END, bytes=END, durable=END.
    let end = l[2]
        .split_whitespace()
        .find_map(|f| f.strip_prefix("pos=0.."))
        .unwrap();
    assert!(
        l[2].contains(&format!("bytes={end} durable={end}")),
        "{out}"
    );

    let one = stdout(&ok(check(&wal, &["--tablet", "t2"])));
    assert_eq!(one.lines().count(), 1);
    assert!(one.starts_with("t2: ok"));
}

#[test]
fn corrupt_byte_is_reported_with_tablet_file_and_offset() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    ok(append(
        &wal,
        &(sample_input() + &many("t3", 5000, 100)),
        &["--segment-size", "8KiB"],
    ));
    let recs = lines(&stdout(&ok(dump(&wal, &["--tablet", "t3"]))));
    let segs = segments(&wal.join("t3"));
    assert!(segs.len() > 2);
    // A byte in the body of the third record of the second segment.
    let seg = &segs[1];
    let name = seg.file_name().unwrap().to_str().unwrap().to_string();
    let first = u64::from_str_radix(name.trim_end_matches(".seg"), 16).unwrap();
    let in_seg: Vec<u64> = recs
        .iter()
        .map(|r| r["pos"].as_u64().unwrap())
        .filter(|p| *p >= first)
        .collect();
    let target = (in_seg[2] + in_seg[3]) / 2;
    flip_byte(seg, 128 + (target - first));

    let o = fails(check(&wal, &[]));
    let err = stderr(&o);
    assert!(err.contains("tablet t3"), "{err}");
    assert!(err.contains(&name), "{err}");
    assert!(
        err.contains(&format!("offset {}", 128 + in_seg[2] - first)),
        "{err}"
    );
    assert!(err.contains("durable data damaged"), "{err}");
    // The other tablets are still checked and reported.
    let out = stdout(&o);
    assert!(out.contains("t1: ok") && out.contains("t2: ok"), "{out}");
    // dump fails too, after printing what precedes the damage.
    let o = fails(dump(&wal, &["--tablet", "t3"]));
    assert!(stderr(&o).contains(&name), "{}", stderr(&o));
    assert_eq!(
        lines(&stdout(&o)).len(),
        recs.iter()
            .filter(|r| r["pos"].as_u64().unwrap() < in_seg[2])
            .count()
    );
    // The other tablets stay writable.
    ok(append(
        &wal,
        r#"{"tablet":"t1","kind":"heartbeat","ht":"2000"}"#,
        &[],
    ));
}

#[test]
fn wrong_magic_is_reported() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    ok(append(&wal, &sample_input(), &[]));
    let seg = segments(&wal.join("t1")).remove(0);
    flip_byte(&seg, 0);
    let err = stderr(&fails(check(&wal, &[])));
    assert!(err.contains("tablet t1"), "{err}");
    assert!(err.contains("0000000000000000.seg"), "{err}");
    assert!(err.contains("offset 0"), "{err}");
    assert!(err.contains("magic"), "{err}");
    let err = stderr(&fails(dump(&wal, &[])));
    assert!(err.contains("magic"), "{err}");
}

#[test]
fn records_missing_below_durable_pos_are_durable_damage() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    ok(append(&wal, &sample_input(), &[]));
    let recs = lines(&stdout(&ok(dump(&wal, &["--tablet", "t1"]))));
    let last = recs.last().unwrap()["pos"].as_u64().unwrap();
    // Zero the last record: the valid records now end before durable_pos.
    let seg = segments(&wal.join("t1")).remove(0);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
        f.write_all_at(&[0u8; 400], 128 + last).unwrap();
    }
    let err = stderr(&fails(check(&wal, &["--tablet", "t1"])));
    assert!(err.contains("durable data damaged"), "{err}");
    assert!(err.contains(&format!("position {last}")), "{err}");
    assert!(err.contains("0000000000000000.seg"), "{err}");
}

#[test]
fn torn_tail_after_durable_pos_is_a_warning() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    ok(append(&wal, &sample_input(), &[]));
    let out = stdout(&ok(check(&wal, &["--tablet", "t2"])));
    let end: u64 = out
        .split_whitespace()
        .find_map(|f| f.strip_prefix("durable="))
        .unwrap()
        .parse()
        .unwrap();
    let seg = segments(&wal.join("t2")).remove(0);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
        f.write_all_at(&[0xab; 50], 128 + end).unwrap();
    }
    let o = ok(check(&wal, &["--tablet", "t2"]));
    assert!(stderr(&o).contains("torn tail"), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("t2: ok segments=1 records=3"));
    // dump reads only up to durable_pos: unaffected.
    assert_eq!(
        lines(&stdout(&ok(dump(&wal, &["--tablet", "t2"])))).len(),
        3
    );
}

#[test]
fn garbage_files_are_named() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    ok(append(&wal, &sample_input(), &[]));
    let before = ok(dump(&wal, &[])).stdout;

    // In a tablet directory.
    let junk = wal.join("t1").join("junk.txt");
    std::fs::write(&junk, b"hello").unwrap();
    for o in [
        fails(check(&wal, &[])),
        fails(dump(&wal, &[])),
        fails(append(
            &wal,
            r#"{"tablet":"t1","kind":"heartbeat","ht":"9999"}"#,
            &[],
        )),
    ] {
        let err = stderr(&o);
        assert!(err.contains("junk.txt"), "{err}");
        assert!(err.contains("unexpected file"), "{err}");
    }
    std::fs::remove_file(&junk).unwrap();
    assert!(ok(dump(&wal, &[])).stdout == before, "nothing changed");

    // In the WAL directory itself.
    std::fs::write(wal.join("notes.txt"), b"hello").unwrap();
    for o in [fails(check(&wal, &[])), fails(dump(&wal, &[]))] {
        let err = stderr(&o);
        assert!(err.contains("notes.txt"), "{err}");
    }
    // A named tablet is still readable.
    ok(dump(&wal, &["--tablet", "t1"]));
    // A tablet that does not exist.
    let err = stderr(&fails(dump(&wal, &["--tablet", "nope"])));
    assert!(err.contains("nope"), "{err}");
}

#[test]
fn dump_from_a_record_position() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    ok(append(
        &wal,
        &(sample_input() + &many("t3", 5000, 60)),
        &["--segment-size", "8KiB"],
    ));
    let all = stdout(&ok(dump(&wal, &["--tablet", "t3"])));
    let all_lines: Vec<&str> = all.lines().collect();
    let recs = lines(&all);
    for k in [0, 1, 30, 59] {
        let pos = recs[k]["pos"].as_u64().unwrap().to_string();
        let got = stdout(&ok(dump(&wal, &["--tablet", "t3", "--from", &pos])));
        assert_eq!(
            got.lines().collect::<Vec<_>>(),
            all_lines[k..],
            "from {pos}"
        );
    }
    // Hex works too.
    let p = recs[30]["pos"].as_u64().unwrap();
    let got = stdout(&ok(dump(
        &wal,
        &["--tablet", "t3", "--from", &format!("0x{p:x}")],
    )));
    assert_eq!(got.lines().count(), 30);
    // The end position gives nothing.
    let out = stdout(&ok(check(&wal, &["--tablet", "t3"])));
    let end = out
        .split_whitespace()
        .find_map(|f| f.strip_prefix("durable="))
        .unwrap()
        .to_string();
    assert_eq!(
        stdout(&ok(dump(&wal, &["--tablet", "t3", "--from", &end]))),
        ""
    );

    // Not a record boundary, beyond the end, not a number, or without --tablet.
    let err = stderr(&fails(dump(
        &wal,
        &["--tablet", "t3", "--from", &(p + 1).to_string()],
    )));
    assert!(err.contains("--from"), "{err}");
    assert!(err.contains("tablet t3"), "{err}");
    let err = stderr(&fails(dump(
        &wal,
        &["--tablet", "t3", "--from", "99999999"],
    )));
    assert!(err.contains("beyond the readable end"), "{err}");
    let o = dump(&wal, &["--tablet", "t3", "--from", "abc"]);
    assert_eq!(o.status.code(), Some(2));
    let o = dump(&wal, &["--from", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--tablet"), "{}", stderr(&o));
}

#[test]
fn bad_arguments_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    for args in [
        vec!["wal", "append", "--dir", s(&wal), "--sync", "sometimes"],
        vec!["wal", "append", "--dir", s(&wal), "--segment-size", "lots"],
        vec!["wal", "frobnicate"],
        vec!["apply"],
    ] {
        let o = tidelog(&args, b"");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    // A size that parses but is out of range is a clear error, and nothing is created.
    let o = fails(append(&wal, &sample_input(), &["--segment-size", "1KiB"]));
    assert!(stderr(&o).contains("segment size"), "{}", stderr(&o));
    assert!(!wal.exists());
}

#[test]
fn a_missing_directory_is_named_with_its_os_error_once() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-wal");
    let o = fails(check(&missing, &[]));
    let err = stderr(&o);
    assert!(err.contains(s(&missing)), "{err}");
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

fn now_ht() -> u64 {
    tidelog_wal::HybridTime::from_system_time(std::time::SystemTime::now()).0
}

/// The keys that crashed the target (65 526 bytes; 32 763 NUL bytes, which the store's
/// encoding doubles) are refused by `wal append`, naming the line, the tablet and the
/// limit; the lines before stay written. The longest key allowed goes through.
#[test]
fn append_refuses_keys_over_the_end_to_end_limit() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    let nuls = base64_of(&[0u8; 32_763]);
    let longest = "K".repeat(32_752);
    for (bad, len) in [
        (
            format!(r#"{{"key":"{}","value":"v"}}"#, "K".repeat(65_526)),
            65_526,
        ),
        (
            format!(r#"{{"key":{{"b64":"{nuls}"}},"value":"v"}}"#),
            32_763,
        ),
    ] {
        std::fs::remove_dir_all(&wal).ok();
        let ht = now_ht();
        let input = [
            format!(r#"{{"tablet":"k2","kind":"heartbeat","ht":"{}"}}"#, ht + 1),
            format!(
                r#"{{"tablet":"k2","kind":"write","ht":"{}","ops":[{bad}]}}"#,
                ht + 2
            ),
        ]
        .join("\n");
        let err = stderr(&fails(append(&wal, &input, &[])));
        for part in [
            "line 2",
            "tablet k2",
            &format!("key is {len} bytes"),
            "limit 32752",
        ] {
            assert!(err.contains(part), "{part:?} not in {err}");
        }
        assert!(!err.contains("panicked"), "{err}");
    }
    let v = lines(&stdout(&ok(dump(&wal, &[]))));
    assert_eq!(v.len(), 1, "only the first heartbeat is written");
    let input = format!(
        r#"{{"tablet":"k2","kind":"write","ht":"{}","ops":[{{"key":"{longest}","value":"v"}}]}}"#,
        now_ht()
    );
    ok(append(&wal, &input, &[]));
    let v = lines(&stdout(&ok(dump(&wal, &[]))));
    assert_eq!(v[1]["ops"][0]["key"], longest.as_str());
}

fn base64_of(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// An ht beyond the wall clock plus the allowed skew (the one that held the target's safe
/// time in 2112 among them) is refused, naming the line and the tablet; nothing is written.
#[test]
fn append_refuses_an_ht_ahead_of_the_clock() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    let err = stderr(&fails(append(
        &wal,
        r#"{"tablet":"e1","kind":"heartbeat","ht":"18446744073709551615"}"#,
        &[],
    )));
    for part in [
        "line 1",
        "tablet e1",
        "ahead of this host's clock",
        "500 ms",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    let in_a_minute = now_ht() + (60_000_000 << 12);
    let input = format!(
        "{{\"tablet\":\"e1\",\"kind\":\"heartbeat\",\"ht\":\"{}\"}}\n{{\"tablet\":\"e1\",\"kind\":\"heartbeat\",\"ht\":\"{in_a_minute}\"}}\n",
        now_ht()
    );
    let err = stderr(&fails(append(&wal, &input, &[])));
    assert!(err.contains("line 2") && err.contains("tablet e1"), "{err}");
    assert_eq!(lines(&stdout(&ok(dump(&wal, &[])))).len(), 1);
}

/// A commit naming no participant is refused; so is the commit of a transaction that
/// wrote no intent where the logs can tell (its participants' logs already reach its ht,
/// or the participant is its own tablet). A participant whose intents may still come later
/// in the input (as in a dump, one tablet after another) is taken, and so is a commit whose
/// intents were written by an earlier run.
#[test]
fn append_refuses_commits_of_nothing() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    let commit = |t: &str, ht: u64, txn: &str, parts: &str| {
        format!(
            r#"{{"tablet":"{t}","kind":"commit","ht":"{ht}","txn":"{txn}","participants":[{parts}]}}"#
        )
    };
    let intent = |t: &str, ht: u64, txn: &str| {
        format!(
            r#"{{"tablet":"{t}","kind":"intent","ht":"{ht}","txn":"{txn}","ops":[{{"key":"k","value":"v"}}]}}"#
        )
    };
    let hb = |t: &str, ht: u64| format!(r#"{{"tablet":"{t}","kind":"heartbeat","ht":"{ht}"}}"#);

    let err = stderr(&fails(append(&wal, &commit("s", 10, TXN_A, ""), &[])));
    for part in ["line 1", "tablet s", TXN_A, "no participant"] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    // The commit's own tablet as its only participant, holding no intent of it.
    let err = stderr(&fails(append(&wal, &commit("s", 11, TXN_A, r#""s""#), &[])));
    for part in [
        "line 1",
        "tablet s",
        TXN_A,
        "holds an intent",
        "nothing to commit",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    // A participant whose log already reaches past the commit's ht without an intent.
    let input = [hb("p", 20), commit("s", 15, TXN_A, r#""p""#)].join("\n");
    let err = stderr(&fails(append(&wal, &input, &[])));
    assert!(err.contains("line 2") && err.contains("[p]"), "{err}");
    // Intents first: taken. Intents that may come later (p's log is behind): taken.
    let input = [
        intent("q", 30, TXN_A),
        commit("s", 31, TXN_A, r#""q""#),
        commit("s", 32, TXN_B, r#""r""#),
        intent("r", 25, TXN_B),
    ]
    .join("\n");
    ok(append(&wal, &input, &[]));
    // Intents written by an earlier run count too.
    const TXN_C: &str = "cc0102030405060708090a0b0c0d0e0f";
    ok(append(&wal, &intent("q", 40, TXN_C), &[]));
    ok(append(&wal, &commit("s", 41, TXN_C, r#""q""#), &[]));
    // The sample's dump appends again as it was (its commits follow their intents or
    // precede tablets not written yet).
    let again = d.path().join("again");
    let first = ok(dump(&wal, &[])).stdout;
    ok(tidelog(&["wal", "append", "--dir", s(&again)], &first));
    assert!(ok(dump(&again, &[])).stdout == first);
}

/// `wal check` reports an entry that is not a tablet and goes on checking the others; it
/// exits non-zero at the end, naming each problem.
#[test]
fn check_reports_odd_entries_and_checks_the_rest() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    ok(append(&wal, &sample_input(), &[]));
    std::fs::create_dir(wal.join("lost+found")).unwrap();
    std::fs::write(wal.join("notes.txt"), b"hello").unwrap();
    let o = fails(check(&wal, &[]));
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(
        out.contains("t1: ok") && out.contains("t2: ok"),
        "{out}\n{err}"
    );
    let summary = err.lines().last().unwrap();
    assert!(
        summary.contains("lost+found") && summary.contains("notes.txt"),
        "{err}"
    );
    assert!(summary.contains("2 problems"), "{err}");
    // A damaged tablet beside them is named too, and the good ones still pass.
    let seg = segments(&wal.join("t1")).remove(0);
    flip_byte(&seg, 0);
    let o = fails(check(&wal, &[]));
    assert!(stdout(&o).contains("t2: ok"), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.lines().last().unwrap().contains("tablet t1"), "{err}");
}

/// No input line makes `wal append` panic: garbage, deep nesting, huge numbers, fields of
/// every wrong type, oversize values and a line longer than any record's each get a clear
/// error naming the line; what came before is written.
#[test]
fn append_never_panics_on_bad_input() {
    let d = tempfile::tempdir().unwrap();
    let wal = d.path().join("wal");
    let ht = now_ht();
    let good = format!(r#"{{"tablet":"g","kind":"heartbeat","ht":"{ht}"}}"#);
    let mut bad: Vec<Vec<u8>> = vec![
        b"\x00\x01\x02".to_vec(),
        "[".repeat(100_000).into_bytes(),
        br#"{"tablet":"g","kind":"heartbeat","ht":1e400}"#.to_vec(),
        br#"{"tablet":"g","kind":"heartbeat","ht":"99999999999999999999999"}"#.to_vec(),
        br#"{"tablet":"g","kind":"write","ht":"5","ops":{"key":"k"}}"#.to_vec(),
        br#"{"tablet":"g","kind":"write","ht":"5","ops":[{"key":{"b64":"!!"},"value":null}]}"#
            .to_vec(),
        br#"{"tablet":["g"],"kind":7,"ht":null}"#.to_vec(),
        format!(
            r#"{{"tablet":"g","kind":"write","ht":"{}","ops":[{{"key":"k","value":"{}"}}]}}"#,
            ht + 1,
            "v".repeat(9 << 20)
        )
        .into_bytes(),
        format!(
            r#"{{"tablet":"g","kind":"commit","ht":"{}","txn":"{TXN_A}","participants":[{}]}}"#,
            ht + 1,
            vec![r#""p""#; 5000].join(",")
        )
        .into_bytes(),
    ];
    // Longer than any record's line may be: refused unread.
    let mut long = br#"{"tablet":"g","kind":"heartbeat","ht":""#.to_vec();
    long.resize(129 << 20, b'1');
    bad.push(long);
    for line in bad {
        let mut input = good.clone().into_bytes();
        input.push(b'\n');
        input.extend_from_slice(&line);
        input.push(b'\n');
        let o = fails(tidelog(&["wal", "append", "--dir", s(&wal)], &input));
        let err = stderr(&o);
        assert!(err.contains("line 2"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.len() < 4096,
            "the error quotes too much: {} bytes",
            err.len()
        );
        std::fs::remove_dir_all(&wal).unwrap();
    }
}
