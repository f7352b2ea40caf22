//! Every shell block of README.md runs, as pasted, the way `trycmd` and `mdbook test` run
//! documentation: a broken quick start fails the build.
//!
//! A block fenced ```` ```sh ```` (or `bash`, `shell`) runs with `bash -e -o pipefail` in a
//! fresh temporary directory (also its TMPDIR), bounded in time, and must exit 0. There,
//! `./target/release/tidelog` is the binary under test and a stand-in `cargo` comes first on
//! PATH: `cargo build …` does nothing (the binary is built), `cargo run … -- ARGS` runs the
//! binary with ARGS. A block that cannot run here is fenced ```` ```sh no-run: why ````; the
//! test prints what it skipped and why. Files under docs/ follow the same convention when
//! they exist (blocks there run only if fenced ```` ```sh run ````).
//!
//! Blocks run one after the other (the ship quick start binds udp 127.0.0.1:7400); whatever
//! a block leaves running is killed with its process group.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one block may run (the demo takes about 15 s; the debug build on a loaded
/// machine more).
const BLOCK_LIMIT: Duration = Duration::from_secs(180);

/// A shell block of a Markdown file.
#[derive(Debug)]
struct Block {
    file: String,
    line: usize,
    /// `Some(why)` for a block fenced `no-run`.
    skip: Option<String>,
    text: String,
}

/// The shell blocks of `markdown` (fences may be indented, as in list items). In files
/// where `run_by_default` is false, only blocks fenced `sh run` run.
fn blocks(file: &str, markdown: &str, run_by_default: bool) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = markdown.lines().enumerate();
    while let Some((i, l)) = lines.next() {
        let t = l.trim_start();
        let Some(info) = t.strip_prefix("```") else {
            continue;
        };
        let indent = l.len() - t.len();
        let mut words = info.split_whitespace();
        let lang = words.next().unwrap_or("");
        let rest: Vec<&str> = words.collect();
        let mut text = String::new();
        for (_, body) in lines.by_ref() {
            if body.trim_start().starts_with("```") {
                break;
            }
            text.push_str(
                body.get(indent.min(body.len() - body.trim_start().len())..)
                    .unwrap_or(""),
            );
            text.push('\n');
        }
        if !matches!(lang, "sh" | "bash" | "shell") {
            continue;
        }
        let skip = match rest.first() {
            Some(w) if w.starts_with("no-run") => Some(rest.join(" ")),
            Some(&"run") => None,
            _ if run_by_default => None,
            _ => Some("not fenced `sh run`".into()),
        };
        out.push(Block {
            file: file.to_string(),
            line: i + 1,
            skip,
            text,
        });
    }
    out
}

/// The stand-in for cargo inside README blocks.
const FAKE_CARGO: &str = r#"#!/bin/sh
# cargo, as far as README blocks need it: the binary under test is built already.
case "$1" in
build) exit 0 ;;
run)
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done
    [ $# -gt 0 ] && shift
    exec ./target/release/tidelog "$@" ;;
*) echo "the README test cannot run: cargo $*" >&2; exit 1 ;;
esac
"#;

/// Runs `block` in a fresh directory; its exit status and output.
fn run(block: &Block) -> (Option<i32>, String, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    std::fs::create_dir_all(work.join("target/release")).unwrap();
    std::os::unix::fs::symlink(common::bin(), work.join("target/release/tidelog")).unwrap();
    let fake = work.join(".bin");
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::write(fake.join("cargo"), FAKE_CARGO).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(fake.join("cargo"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = work.join(".block.sh");
    std::fs::write(&script, &block.text).unwrap();
    let path = std::env::join_paths(std::iter::once(fake.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let log = work.join(".output");
    let started = Instant::now();
    let mut child = Command::new("bash")
        .arg("-e")
        .arg("-o")
        .arg("pipefail")
        .arg(&script)
        .current_dir(work)
        .env("PATH", path)
        .env("TMPDIR", work)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id() as i32;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if started.elapsed() > BLOCK_LIMIT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Whatever the block left running (daemons of a failed block) goes with its group.
    // SAFETY: kill(2) on the process group this test created.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
    let mut output = String::new();
    std::fs::File::open(&log)
        .unwrap()
        .read_to_string(&mut output)
        .unwrap();
    let code = match status {
        Some(st) => st.code().or(Some(128)),
        None => {
            output.push_str(&format!("\n[killed after {BLOCK_LIMIT:?}]"));
            None
        }
    };
    (code, output, started.elapsed())
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn markdown_files() -> Vec<(String, bool)> {
    let mut files = vec![("README.md".to_string(), true)];
    if let Ok(rd) = std::fs::read_dir(repo().join("docs")) {
        let mut docs: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".md"))
            .map(|n| format!("docs/{n}"))
            .collect();
        docs.sort();
        files.extend(docs.into_iter().map(|d| (d, false)));
    }
    files
}

#[test]
fn every_shell_block_of_the_readme_runs() {
    let mut all = Vec::new();
    for (file, default) in markdown_files() {
        let text = std::fs::read_to_string(repo().join(&file)).unwrap();
        all.extend(blocks(&file, &text, default));
    }
    let mut ran = 0;
    let mut failed = Vec::new();
    for b in &all {
        if let Some(why) = &b.skip {
            eprintln!("skipped {}:{} ({why})", b.file, b.line);
            continue;
        }
        let (code, output, took) = run(b);
        eprintln!("ran {}:{} in {took:.1?}: exit {code:?}", b.file, b.line);
        ran += 1;
        if code != Some(0) {
            failed.push(format!(
                "{}:{}: exit {code:?}\n--- block ---\n{}--- output ---\n{output}",
                b.file, b.line, b.text
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    // The demo and both quick starts at least.
    assert!(ran >= 3, "only {ran} blocks ran of {}", all.len());
}

#[test]
fn blocks_are_found_with_their_fences() {
    let md = "intro\n```sh\necho a\n```\n\n  ```sh no-run: needs root\n  rm -rf /x\n  ```\n\
              ```json\n{}\n```\n```bash\necho b\n```\n";
    let b = blocks("X.md", md, true);
    assert_eq!(b.len(), 3, "{b:?}");
    assert_eq!(
        (b[0].line, b[0].text.as_str(), &b[0].skip),
        (2, "echo a\n", &None)
    );
    assert_eq!(b[1].skip.as_deref(), Some("no-run: needs root"));
    assert_eq!(b[1].text, "rm -rf /x\n");
    assert_eq!(b[2].text, "echo b\n");
    let docs = blocks(
        "docs/x.md",
        "```sh\necho c\n```\n```sh run\necho d\n```\n",
        false,
    );
    assert!(docs[0].skip.is_some() && docs[1].skip.is_none(), "{docs:?}");
    // A failing block is reported as failing.
    let (code, out, _) = run(&Block {
        file: "X.md".into(),
        line: 1,
        skip: None,
        text: "false\necho not reached\n".into(),
    });
    assert_eq!(code, Some(1), "{out}");
    assert!(!out.contains("not reached"), "{out}");
    let (code, out, _) = run(&Block {
        file: "X.md".into(),
        line: 1,
        skip: None,
        text: "cargo build --release\n./target/release/tidelog --version\ncargo run --release -- --version\n".into(),
    });
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(out.matches("tidelog ").count(), 2, "{out}");
}
