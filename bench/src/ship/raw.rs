//! The raw baselines a ship run is measured against, each in the same run: a raw quinn
//! stream (to a sink that discards, or that makes the bytes durable as the intake does, with
//! or without `O_DIRECT`) and a raw TCP copy of the same bytes; and the peer processes
//! (`__applier`, `__sink`) they and the tidelog runs talk to.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tidelog_net::QuicTuning;

use crate::stats::fmt_bytes;

use super::{cpu, for_each_chunk, Baseline, Extent, Rate, ShipArgs, Source, CHUNK};

/// A peer process: this binary with a hidden subcommand.
pub(super) struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    pub(super) fn spawn(args: Vec<OsString>) -> Result<Peer> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting a peer process")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("peer stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("peer-out".into())
            .spawn(move || {
                for l in BufReader::new(stdout).lines() {
                    let Ok(l) = l else { break };
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Peer {
            child,
            stdin,
            lines: rx,
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line starting with `prefix` (others are echoed), within `timeout`.
    pub(super) fn expect(&self, prefix: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self.lines.recv_timeout(left).with_context(|| {
                format!("waiting for a `{prefix}` line from the peer process (did it exit?)")
            })?;
            if let Some(rest) = l.strip_prefix(prefix) {
                return Ok(rest.trim().to_string());
            }
            println!("peer: {l}");
        }
    }

    pub(super) fn addr(&self) -> Result<SocketAddr> {
        Ok(self.expect("ADDR ", Duration::from_secs(30))?.parse()?)
    }

    /// Closes stdin (the peer's signal to exit) and waits for it.
    pub(super) fn finish(mut self) -> Result<()> {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait()? {
                if !st.success() {
                    bail!("peer process exited with {st}");
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("peer process did not exit within 60 s of stdin EOF; killed");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(200));
            if matches!(self.child.try_wait(), Ok(None)) {
                let _ = self.child.kill();
            }
            let _ = self.child.wait();
        }
    }
}

/// The raw transfers measured beside tidelog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Raw {
    Tcp,
    Quinn,
    /// Raw quinn whose receiver writes the bytes to disk and syncs them group by group.
    QuinnDisk,
    /// The same, written with `O_DIRECT`.
    QuinnDirect,
}

impl Raw {
    pub(super) fn name(self) -> &'static str {
        match self {
            Raw::Tcp => "raw tcp",
            Raw::Quinn => "raw quinn",
            Raw::QuinnDisk => "raw quinn→disk",
            Raw::QuinnDirect => "raw quinn→disk O_DIRECT",
        }
    }
}

pub(super) fn baseline(
    args: &ShipArgs,
    raw: Raw,
    root: &Path,
    certs: &Path,
    extents: &[Extent],
    src: &Source,
) -> Result<Baseline> {
    let name = raw.name();
    println!("[baseline] {name}: {} ...", fmt_bytes(src.bytes));
    let mut peer_args: Vec<OsString> = vec![
        "__sink".into(),
        "--proto".into(),
        if raw == Raw::Tcp { "tcp" } else { "quic" }.into(),
        "--certs-dir".into(),
        certs.into(),
        "--max-udp-payload".into(),
        args.max_udp_payload.to_string().into(),
    ];
    peer_args.extend(args.quic.to_args());
    let disk = root.join("raw-disk");
    if raw_disk_used(raw) {
        std::fs::create_dir_all(&disk)?;
        peer_args.extend(["--durable-dir".into(), disk.clone().into()]);
    }
    if raw == Raw::QuinnDirect {
        peer_args.push("--direct".into());
    }
    let peer = Peer::spawn(peer_args)?;
    let addr = peer.addr()?;
    let (c0, p0) = (cpu::snapshot(None), cpu::snapshot(Some(peer.pid())));
    let (elapsed, n) = match raw {
        Raw::Tcp => tcp_client(addr, extents)?,
        Raw::Quinn | Raw::QuinnDisk | Raw::QuinnDirect => {
            quinn_client(addr, args.quic.tuning(args.max_udp_payload), certs, extents)?
        }
    };
    let (c1, p1) = (cpu::snapshot(None), cpu::snapshot(Some(peer.pid())));
    peer.expect("DONE ", Duration::from_secs(30))?;
    peer.finish()?;
    // Keep the disk free for the runs after.
    if raw_disk_used(raw) {
        let _ = std::fs::remove_dir_all(&disk);
        quiesce();
    }
    if n != src.bytes {
        bail!("{name}: the sink counted {n} bytes, expected {}", src.bytes);
    }
    Ok(Baseline {
        name,
        rate: Rate::new(n, src.records, elapsed),
        cpu_bench: cpu::usage(&c0, &c1),
        cpu_peer: cpu::usage(&p0, &p1),
    })
}

pub(super) fn raw_disk_used(raw: Raw) -> bool {
    matches!(raw, Raw::QuinnDisk | Raw::QuinnDirect)
}

/// Between runs: writes back what the last one left dirty (an applier's store, deleted
/// files' metadata) and waits for the device to go idle, so that the next run measured does
/// not share the machine with the previous one's writeback and discards.
pub(super) fn quiesce() {
    crate::wal_bench::sync_all();
    crate::wal_bench::settle_device();
}

fn tcp_client(addr: SocketAddr, extents: &[Extent]) -> Result<(Duration, u64)> {
    use std::io::Read;
    let t0 = Instant::now();
    let mut s = std::net::TcpStream::connect(addr)?;
    for_each_chunk(extents, |c| Ok(s.write_all(c)?))?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut ack = [0u8; 8];
    s.read_exact(&mut ack)?;
    Ok((t0.elapsed(), u64::from_le_bytes(ack)))
}

fn quinn_client(
    addr: SocketAddr,
    tuning: QuicTuning,
    certs: &Path,
    extents: &[Extent],
) -> Result<(Duration, u64)> {
    let cc =
        tidelog_net::tls::client_config(&tidelog_testkit::pki::load(certs, "shipper")?, &tuning)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let run = async move {
        // The same socket as the shipper's lanes (quic.udp-receive-buffer).
        let ep = tidelog_shipper::client_endpoint(
            SocketAddr::from(([0, 0, 0, 0], 0)),
            tuning.udp_receive_buffer,
        )?;
        let t0 = Instant::now();
        let conn = ep.connect_with(cc, addr, "localhost")?.await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        let mut buf = vec![0u8; CHUNK];
        for e in extents {
            let file = std::fs::File::open(&e.path)?;
            let mut off = 0u64;
            while off < e.len {
                let n = (e.len - off).min(CHUNK as u64) as usize;
                file.read_exact_at(&mut buf[..n], e.offset + off)?;
                send.write_all(&buf[..n]).await?;
                off += n as u64;
            }
        }
        send.finish()?;
        let mut ack = [0u8; 8];
        recv.read_exact(&mut ack).await?;
        let elapsed = t0.elapsed();
        conn.close(quinn::VarInt::from_u32(0), b"done");
        let _ = tokio::time::timeout(Duration::from_secs(3), ep.wait_idle()).await;
        Ok::<_, anyhow::Error>((elapsed, u64::from_le_bytes(ack)))
    };
    rt.block_on(async move {
        tokio::time::timeout(Duration::from_secs(300), run)
            .await
            .context("raw quinn baseline: no answer within 300 s")?
    })
}
