//! An applier and a shipper on this machine, as configuration files under one directory
//! ([`LocalCluster`]): what `tidelog demo`, the fault run and the end-to-end benchmarks
//! start their [`crate::process::Daemon`]s with.

use std::path::{Path, PathBuf};

use anyhow::Result;

/// A UDP port free on 127.0.0.1 right now.
pub fn free_udp_port() -> Result<u16> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// An applier and a shipper on this machine, written under one directory: certificates
/// (`tls/`), `applier.toml` and `shipper.toml` on 127.0.0.1 with a free UDP port (sync
/// `batch`, `expect-tablets` t0..t{N-1}, one lane), admin sockets, and the source `wal/`.
/// Used by `tidelog demo`, the fault run and `tidelog-bench e2e`.
#[derive(Debug, Clone)]
pub struct LocalCluster {
    pub applier_cfg: PathBuf,
    pub shipper_cfg: PathBuf,
    pub applier_sock: PathBuf,
    pub shipper_sock: PathBuf,
    pub wal: PathBuf,
    pub port: u16,
}

impl LocalCluster {
    /// `applier_extra`: more top-level applier keys, one `key = value` per line (each ending
    /// in a newline), e.g. `apply-nice = -10\n`; empty for none.
    pub fn write(
        dir: &Path,
        tablets: usize,
        max_staleness: &str,
        shipper_id: &str,
        applier_extra: &str,
    ) -> Result<LocalCluster> {
        let tls = dir.join("tls");
        crate::pki::write(&tls)?;
        let port = free_udp_port()?;
        let ids: Vec<String> = (0..tablets).map(|i| format!("\"t{i}\"")).collect();
        let p = |f: &str| tls.join(f).display().to_string();
        let c = LocalCluster {
            applier_cfg: dir.join("applier.toml"),
            shipper_cfg: dir.join("shipper.toml"),
            applier_sock: dir.join("applier.sock"),
            shipper_sock: dir.join("shipper.sock"),
            wal: dir.join("wal"),
            port,
        };
        std::fs::create_dir_all(&c.wal)?;
        std::fs::write(
            &c.applier_cfg,
            format!(
                "listen = \"127.0.0.1:{port}\"\ndata-dir = \"{}\"\nadmin-socket = \"{}\"\nsync = \"batch\"\nmax-staleness = \"{max_staleness}\"\nexpect-tablets = [{}]\n{applier_extra}[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
                dir.join("applier").display(), c.applier_sock.display(), ids.join(", "),
                p("ca.pem"), p("applier.pem"), p("applier.key")
            ),
        )?;
        std::fs::write(
            &c.shipper_cfg,
            format!(
                "wal-dir = \"{}\"\napplier = \"127.0.0.1:{port}\"\nadmin-socket = \"{}\"\nshipper-id = \"{shipper_id}\"\nlanes = 1\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
                c.wal.display(), c.shipper_sock.display(), p("ca.pem"), p("shipper.pem"), p("shipper.key")
            ),
        )?;
        Ok(c)
    }
}
