//! Checks a start and `--check` share: what a daemon would be refused when it starts — a
//! directory it cannot create, an address another process holds, a socket in use — found
//! without side effects. Each daemon's `preflight` runs them for both, so that `--check`
//! cannot pass what a start refuses. Every error names the config key.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{bail, Result};

/// `dir` is a directory this process may write in, or can be made: its nearest existing
/// ancestor is one.
pub fn writable_dir(key: &str, dir: &Path) -> Result<()> {
    let mut p = dir;
    loop {
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => {
                if !may_write(p) {
                    bail!(
                        "key \"{key}\": {} is not writable by this process{}",
                        p.display(),
                        in_path_of(p, dir)
                    );
                }
                return Ok(());
            }
            Ok(_) => bail!(
                "key \"{key}\": {} is not a directory{}",
                p.display(),
                in_path_of(p, dir)
            ),
            // Missing, or under a file (ENOTDIR): look at the parent.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                match p.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => p = parent,
                    // A relative path: its first component is made in the working directory.
                    _ => p = Path::new("."),
                }
            }
            Err(e) => bail!(
                "key \"{key}\": cannot read {}: {e}{}",
                p.display(),
                in_path_of(p, dir)
            ),
        }
    }
}

fn in_path_of(p: &Path, dir: &Path) -> String {
    if p == dir {
        String::new()
    } else {
        format!(" (making {})", dir.display())
    }
}

fn may_write(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) on a NUL-terminated path that lives across the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// Nothing holds UDP `addr` (binds it and lets it go).
pub fn udp_free(key: &str, addr: SocketAddr) -> Result<()> {
    match std::net::UdpSocket::bind(addr) {
        Ok(_) => Ok(()),
        Err(e) => bail!("key \"{key}\": cannot listen on udp {addr}: {e}"),
    }
}

/// Nothing holds TCP `addr` (binds it and lets it go).
pub fn tcp_free(key: &str, addr: SocketAddr) -> Result<()> {
    match std::net::TcpListener::bind(addr) {
        Ok(_) => Ok(()),
        Err(e) => bail!("key \"{key}\": cannot listen on tcp {addr}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn directories_and_addresses() {
        let d = tempfile::tempdir().unwrap();
        writable_dir("data-dir", d.path()).unwrap();
        writable_dir("data-dir", &d.path().join("a/b/c")).unwrap();
        let f = d.path().join("file");
        std::fs::write(&f, "x").unwrap();
        let e = format!("{:#}", writable_dir("data-dir", &f).unwrap_err());
        assert!(
            e.starts_with("key \"data-dir\": ") && e.contains("is not a directory"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            writable_dir("data-dir", &f.join("sub")).unwrap_err()
        );
        assert!(e.contains("is not a directory (making "), "{e}");
        let held = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let e = format!(
            "{:#}",
            udp_free("listen", held.local_addr().unwrap()).unwrap_err()
        );
        assert!(
            e.starts_with("key \"listen\": cannot listen on udp 127.0.0.1:"),
            "{e}"
        );
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = format!(
            "{:#}",
            tcp_free("metrics-listen", held.local_addr().unwrap()).unwrap_err()
        );
        assert!(
            e.starts_with("key \"metrics-listen\": cannot listen on tcp"),
            "{e}"
        );
    }
}
