//! The Debian package as `cargo deb -p tidelog` builds it from `[package.metadata.deb]` in
//! daemon/Cargo.toml: its tree laid out under a temporary root (the binary at
//! usr/bin/tidelog, the units, configs, man pages and completions where the package puts
//! them), `systemd-analyze verify --root` of the units against it (skipped with a note where
//! systemd-analyze is missing; `.ci/run` installs it), the man pages and completions in
//! daemon/dist/ up to date with the CLI, and the package's metadata (a stripped build, an
//! honest maintainer).
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deb_metadata() -> toml::Table {
    let text = std::fs::read_to_string(manifest_dir().join("Cargo.toml")).unwrap();
    let t: toml::Table = toml::from_str(&text).unwrap();
    t["package"]["metadata"]["deb"].as_table().unwrap().clone()
}

/// The files an asset's source names: the path, or the files matching a `*` in its last
/// component. `target/release/tidelog` is the binary the tests were built with.
fn sources(src: &str) -> Vec<PathBuf> {
    if src == "target/release/tidelog" {
        return vec![PathBuf::from(bin())];
    }
    let path = manifest_dir().join(src);
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    let Some((pre, post)) = name.split_once('*') else {
        assert!(path.is_file(), "asset {src} is missing");
        return vec![path];
    };
    let mut found: Vec<PathBuf> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            n.starts_with(pre) && n.ends_with(post) && n.len() >= pre.len() + post.len()
        })
        .collect();
    found.sort();
    assert!(!found.is_empty(), "asset {src} matches nothing");
    found
}

/// Lays the package's assets out under `root`, as dpkg would install them; the paths
/// installed, relative to `root`.
fn lay_out(root: &Path) -> Vec<String> {
    let mut installed = Vec::new();
    for a in deb_metadata()["assets"].as_array().unwrap() {
        let a = a.as_array().unwrap();
        let (src, dest, mode) = (
            a[0].as_str().unwrap(),
            a[1].as_str().unwrap(),
            u32::from_str_radix(a[2].as_str().unwrap(), 8).unwrap(),
        );
        for s in sources(src) {
            let rel = if dest.ends_with('/') {
                format!("{dest}{}", s.file_name().unwrap().to_str().unwrap())
            } else {
                dest.to_string()
            };
            let to = root.join(&rel);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&s, &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).unwrap();
            installed.push(rel);
        }
    }
    installed
}

#[test]
fn the_package_holds_binary_units_configs_man_pages_and_completions() {
    let root = tempfile::tempdir().unwrap();
    let files = lay_out(root.path());
    for want in [
        "usr/bin/tidelog",
        "lib/systemd/system/tidelog-applier.service",
        "lib/systemd/system/tidelog-shipper.service",
        "etc/tidelog/applier.toml",
        "etc/tidelog/shipper.toml",
        "usr/lib/tmpfiles.d/tidelog.conf",
        "usr/lib/sysusers.d/tidelog.conf",
        "usr/share/man/man1/tidelog.1",
        "usr/share/man/man1/tidelog-ctl.1",
        "usr/share/man/man1/tidelog-ctl-promote.1",
        "usr/share/man/man1/tidelog-apply.1",
        "usr/share/man/man1/tidelog-ship.1",
        "usr/share/bash-completion/completions/tidelog",
        "usr/share/zsh/vendor-completions/_tidelog",
        "usr/share/fish/vendor_completions.d/tidelog.fish",
    ] {
        assert!(files.iter().any(|f| f == want), "{want} not in {files:?}");
    }
    let mode = std::fs::metadata(root.path().join("usr/bin/tidelog"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    // The installed binary runs and is the one the man page describes.
    let out = Command::new(root.path().join("usr/bin/tidelog"))
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(version.starts_with("tidelog "), "{version}");
    let man = std::fs::read_to_string(root.path().join("usr/share/man/man1/tidelog.1")).unwrap();
    assert!(
        man.contains(version.trim()),
        "tidelog.1 is not for {version}"
    );

    // Built stripped, by a profile of its own; the maintainer is the project.
    let meta = deb_metadata();
    let profile = meta["profile"].as_str().unwrap();
    let ws: toml::Table =
        toml::from_str(&std::fs::read_to_string(manifest_dir().join("../Cargo.toml")).unwrap())
            .unwrap();
    let p = &ws["profile"][profile];
    assert_eq!(p["strip"].as_str(), Some("symbols"), "{p}");
    assert_eq!(p["debug"].as_bool(), Some(false), "{p}");
    let maintainer = meta["maintainer"].as_str().unwrap();
    let repository = ws["workspace"]["package"]["repository"].as_str().unwrap();
    assert_eq!(maintainer, format!("tidelog developers <{repository}>"));
}

/// `systemd-analyze verify --root` of the shipped units against the packaged tree: their
/// ExecStart= binary, paths and settings as installed (not the source tree's).
#[test]
fn the_shipped_units_verify_against_the_packaged_paths() {
    let Some(analyze) = tool(
        "systemd-analyze",
        "`systemd-analyze verify --root` of the packaged units",
    ) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    lay_out(root.path());
    // The targets the units order themselves after and are wanted by, from the host's
    // systemd (it is installed: systemd-analyze is).
    let units = root.path().join("usr/lib/systemd/system");
    std::fs::create_dir_all(&units).unwrap();
    let mut copied = 0;
    for e in std::fs::read_dir("/usr/lib/systemd/system").unwrap() {
        let p = e.unwrap().path();
        let n = p.file_name().unwrap().to_str().unwrap().to_string();
        if (n.ends_with(".target") || n.ends_with(".slice")) && p.is_file() {
            std::fs::copy(&p, units.join(&n)).unwrap();
            copied += 1;
        }
    }
    assert!(copied > 0, "no systemd targets in /usr/lib/systemd/system");
    for unit in ["tidelog-applier.service", "tidelog-shipper.service"] {
        let path = root.path().join("lib/systemd/system").join(unit);
        let out = Command::new(&analyze)
            .arg("verify")
            .arg("--man=no")
            .arg(format!("--root={}", root.path().display()))
            .arg(&path)
            .env("SYSTEMD_LOG_LEVEL", "notice")
            .output()
            .unwrap();
        let all = output_text(&out);
        assert!(
            out.status.success() && all.trim().is_empty(),
            "{unit}: {all}"
        );
    }
    // The check can fail: without the binary at usr/bin/tidelog it does.
    std::fs::remove_file(root.path().join("usr/bin/tidelog")).unwrap();
    let out = Command::new(&analyze)
        .arg("verify")
        .arg("--man=no")
        .arg(format!("--root={}", root.path().display()))
        .arg(
            root.path()
                .join("lib/systemd/system/tidelog-applier.service"),
        )
        .output()
        .unwrap();
    assert!(!out.status.success(), "verify passed without the binary");
}

/// daemon/dist/ holds what `tidelog generate` writes from the CLI now: regenerate it after
/// changing a command or an option.
#[test]
fn man_pages_and_completions_are_up_to_date() {
    for (what, dir) in [("man", "dist/man"), ("completions", "dist/completions")] {
        let tmp = tempfile::tempdir().unwrap();
        let out = Command::new(bin())
            .args(["generate", what])
            .arg(tmp.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list = |d: &Path| -> Vec<(String, Vec<u8>)> {
            let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| {
                    let p = e.unwrap().path();
                    (
                        p.file_name().unwrap().to_str().unwrap().to_string(),
                        std::fs::read(&p).unwrap(),
                    )
                })
                .collect();
            v.sort();
            v
        };
        let (fresh, kept) = (list(tmp.path()), list(&manifest_dir().join(dir)));
        let names = |v: &[(String, Vec<u8>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        let stale: Vec<&String> = fresh
            .iter()
            .filter(|(n, b)| !kept.iter().any(|(k, c)| k == n && c == b))
            .map(|(n, _)| n)
            .collect();
        assert!(
            names(&fresh) == names(&kept) && stale.is_empty(),
            "daemon/{dir} is not what the CLI generates ({stale:?} differ; files {:?} vs {:?}): \
             run `cargo run -p tidelog -- generate {what} daemon/{dir}`",
            names(&fresh),
            names(&kept)
        );
    }
    // The hidden command stays out of the pages and the help.
    let tidelog_1 = std::fs::read_to_string(manifest_dir().join("dist/man/tidelog.1")).unwrap();
    assert!(!tidelog_1.contains("generate"), "{tidelog_1}");
}
