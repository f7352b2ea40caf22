//! The peer processes of the shipping benchmark, run by re-executing the bench binary with a
//! hidden subcommand so that each end's CPU time is its own process's:
//!
//! * `__applier`: the applier intake, a store and one apply worker per tablet; prints
//!   `ADDR <addr>`, then `P <received bytes> <applied bytes> <tablets>` every few ms.
//! * `__sink`: a raw QUIC (same TLS and transport settings) or TCP server that reads one
//!   stream to its end, discarding, answers with the byte count and exits. With
//!   `--durable-dir D` (QUIC only) it keeps the bytes instead: a writer thread writes them
//!   into preallocated 64 MiB segment files in `D` (each made ready, its pages in the page
//!   cache, by a helper thread one segment ahead) and `fdatasync`s after each group (every
//!   1 MiB buffer queued meanwhile, up to 64 MiB, as the intake's `batch` writer), and the
//!   answer waits for the last sync. `--direct` writes the segments with `O_DIRECT`
//!   instead (no page cache: each buffer is copied into one page-aligned buffer first).
//!
//! Both exit on stdin EOF (the bench holds the pipe) or SIGTERM.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use tidelog_applier::apply::{ApplyConfig, ApplyThreads, ApplyWorker, ReceivedReads};
use tidelog_applier::intake::{DurableHook, Intake, IntakeOptions};
use tidelog_applier::store::Store;
use tidelog_testkit::pki;
use tidelog_wal::TabletId;

use super::QuicArgs;
use crate::wal_bench::Sync;

#[derive(Debug, Args)]
pub struct ApplierArgs {
    #[arg(long)]
    pub listen: SocketAddr,
    #[arg(long)]
    pub data_dir: PathBuf,
    #[arg(long)]
    pub certs_dir: PathBuf,
    #[arg(long, value_enum)]
    pub sync: Sync,
    #[arg(long)]
    pub max_udp_payload: u16,
    #[arg(long, default_value_t = 5)]
    pub progress_ms: u64,
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub apply_nice: i32,
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub store_nice: i32,
    /// Write the received logs with `O_DIRECT` (the daemon's `received-direct-io`).
    #[arg(long)]
    pub direct_io: bool,
    /// Received-log segments begun during a catch-up with `O_DIRECT` (the daemon's
    /// `received-direct-io-in-catch-up`).
    #[arg(long)]
    pub direct_io_in_catch_up: bool,
    /// The daemon's `apply-yield-to-intake`, in milliseconds (0: never).
    #[arg(long, default_value_t = 0)]
    pub apply_yield_ms: u64,
    /// The daemon's `runtime-threads` (0: its default).
    #[arg(long, default_value_t = 0)]
    pub runtime_threads: usize,
    #[command(flatten)]
    pub quic: QuicArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Proto {
    Quic,
    Tcp,
}

#[derive(Debug, Args)]
pub struct SinkArgs {
    #[arg(long, value_enum)]
    pub proto: Proto,
    #[arg(long)]
    pub certs_dir: PathBuf,
    #[arg(long)]
    pub max_udp_payload: u16,
    /// Keep what is read: write it into segment files in this directory, synced group by
    /// group.
    #[arg(long)]
    pub durable_dir: Option<PathBuf>,
    /// With `--durable-dir`: write with `O_DIRECT`, around the page cache.
    #[arg(long, requires = "durable_dir")]
    pub direct: bool,
    #[command(flatten)]
    pub quic: QuicArgs,
}

/// Sets the returned flag at stdin EOF (the parent closed the pipe or died) or SIGTERM.
fn exit_flag(rt: &tokio::runtime::Runtime) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let _ = std::thread::Builder::new()
        .name("stdin-eof".into())
        .spawn(move || {
            let mut sink = [0u8; 64];
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            d.store(true, Ordering::SeqCst);
        });
    let d = done.clone();
    rt.spawn(async move {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
            d.store(true, Ordering::SeqCst);
        }
    });
    done
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn run_applier(a: &ApplierArgs) -> Result<()> {
    // As the daemon's `runtime-threads`.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(tidelog_config::runtime_threads(a.runtime_threads))
        .enable_all()
        .build()?;
    let store = Arc::new(Store::open(&a.data_dir)?);
    if a.store_nice != 0 {
        store
            .set_background_nice(a.store_nice)
            .context("--store-nice")?;
    }
    let received = a.data_dir.join("received");
    let reads = ReceivedReads::for_logs(&received, a.direct_io);
    let workers: Arc<Mutex<BTreeMap<TabletId, ApplyWorker>>> = Arc::default();
    // As the daemon's default `apply-threads`.
    let threads = Arc::new(ApplyThreads::with_nice(
        ApplyThreads::default_count(),
        "apply",
        a.apply_nice,
    )?);
    let hook: DurableHook = {
        let (workers, store, received) = (workers.clone(), store.clone(), received.clone());
        let threads = threads.clone();
        Arc::new(move |t: &TabletId, _| {
            let mut m = lock(&workers);
            if let Some(w) = m.get(t) {
                w.notify();
                return;
            }
            let cfg = ApplyConfig {
                threads: Some(threads.clone()),
                reads,
                ..ApplyConfig::default()
            };
            match ApplyWorker::start(store.clone(), &received, t.clone(), cfg) {
                Ok(w) => {
                    m.insert(t.clone(), w);
                }
                Err(e) => eprintln!("__applier: starting the apply worker of {t}: {e}"),
            }
        })
    };
    let mut o = IntakeOptions::new(a.listen, a.data_dir.clone());
    o.sync = a.sync.policy();
    o.direct_io = a.direct_io;
    o.direct_io_in_catch_up = a.direct_io_in_catch_up;
    o.quic = a.quic.tuning(a.max_udp_payload);
    let intake = {
        let _g = rt.enter();
        Intake::start(o, pki::load(&a.certs_dir, "applier")?, Some(hook))?
    };
    threads.yield_to_intake(intake.activity(), Duration::from_millis(a.apply_yield_ms));
    let done = exit_flag(&rt);
    let mut out = std::io::stdout().lock();
    writeln!(out, "ADDR {}", intake.local_addr()?)?;
    out.flush()?;
    let every = Duration::from_millis(a.progress_ms.max(1));
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(every);
        let tablets = intake.tablets();
        let received: u64 = tablets.iter().map(|t| t.received_pos().0).sum();
        let (applied, failed) = {
            let m = lock(&workers);
            let applied: u64 = m.values().map(|w| w.applied_pos().0).sum();
            let failed = m
                .values()
                .find_map(|w| w.error().map(|e| format!("{}: {e}", w.tablet())));
            (applied, failed)
        };
        if let Some(e) = failed {
            writeln!(out, "ERR apply worker stopped: {e}")?;
        }
        if writeln!(out, "P {received} {applied} {}", tablets.len()).is_err()
            || out.flush().is_err()
        {
            break;
        }
    }
    for (_, mut w) in std::mem::take(&mut *lock(&workers)) {
        let _ = w.stop();
    }
    rt.block_on(intake.shutdown());
    Ok(())
}

pub fn run_sink(a: &SinkArgs) -> Result<()> {
    // Never outlive the bench: exit at stdin EOF.
    let _ = std::thread::Builder::new()
        .name("stdin-eof".into())
        .spawn(|| {
            let mut sink = [0u8; 64];
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            std::process::exit(0);
        });
    match a.proto {
        Proto::Tcp => sink_tcp(),
        Proto::Quic => sink_quic(a),
    }
}

fn sink_tcp() -> Result<()> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    println!("ADDR {}", l.local_addr()?);
    std::io::stdout().flush()?;
    let (mut s, _) = l.accept()?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => n += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    s.write_all(&n.to_le_bytes())?;
    println!("DONE {n}");
    Ok(())
}

fn sink_quic(a: &SinkArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let tuning = a.quic.tuning(a.max_udp_payload);
    let sc = tidelog_net::tls::server_config(&pki::load(&a.certs_dir, "applier")?, &tuning)?;
    // The first segment before `ADDR`: a directory that cannot take it (e.g. no O_DIRECT on
    // tmpfs) fails the sink at once, not after the client has sent everything.
    let mut first_segment = match &a.durable_dir {
        Some(dir) => Some(sink_segment(dir, 0, a.direct)?),
        None => None,
    };
    rt.block_on(async move {
        // The same socket as the applier's intake (quic.udp-receive-buffer).
        let (ep, _) = tidelog_applier::intake::server_endpoint(
            "127.0.0.1:0".parse()?,
            quinn::EndpointConfig::default(),
            sc,
            tuning.udp_receive_buffer,
        )?;
        println!("ADDR {}", ep.local_addr()?);
        std::io::stdout().flush()?;
        let conn = ep
            .accept()
            .await
            .context("endpoint closed before a connection")?
            .await?;
        let (mut send, mut recv) = conn.accept_bi().await?;
        let n = match &a.durable_dir {
            None => {
                let mut buf = vec![0u8; 1 << 20];
                let mut n = 0u64;
                while let Some(k) = recv.read(&mut buf).await? {
                    n += k as u64;
                }
                n
            }
            Some(dir) => {
                let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
                let dir = dir.clone();
                let direct = a.direct;
                let first = first_segment.take().context("the sink's first segment")?;
                let writer = std::thread::Builder::new()
                    .name("sink-writer".into())
                    .spawn(move || durable_writer(&dir, first, direct, &rx))?;
                // Whole 1 MiB buffers, as the intake hands whole frames to its writers.
                let mut buf = Vec::with_capacity(1 << 20);
                loop {
                    let want = (1 << 20) - buf.len();
                    let Some(c) = recv.read_chunk(want, true).await? else {
                        break;
                    };
                    buf.extend_from_slice(&c.bytes);
                    if buf.len() == 1 << 20 {
                        let full = std::mem::replace(&mut buf, Vec::with_capacity(1 << 20));
                        if tx.send(full).is_err() {
                            break;
                        }
                    }
                }
                if !buf.is_empty() {
                    let _ = tx.send(buf);
                }
                drop(tx);
                writer
                    .join()
                    .map_err(|_| anyhow::anyhow!("the sink's writer thread panicked"))??
            }
        };
        send.write_all(&n.to_le_bytes()).await?;
        send.finish()?;
        let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
        println!("DONE {n}");
        Ok(())
    })
}

/// Segment size of the durable sink's files, as the received logs' default.
const SINK_SEGMENT: u64 = 64 << 20;

/// Creates the sink's segment `i` in `dir`, preallocated. Unless `direct`, reads it through
/// once so its pages are in the page cache before the writer's `pwrite`s reach them (as the
/// received logs' segments are pre-faulted on a helper thread).
fn sink_segment(dir: &std::path::Path, i: u64, direct: bool) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let path = dir.join(format!("{i:06}"));
    let f = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .custom_flags(if direct { libc::O_DIRECT } else { 0 })
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    // SAFETY: plain syscall on a valid fd.
    let rc = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, SINK_SEGMENT as libc::off_t) };
    if rc != 0 {
        let e = std::io::Error::from_raw_os_error(rc);
        return Err(anyhow::Error::new(e).context(format!("preallocating {}", path.display())));
    }
    if direct {
        // Written around the page cache: nothing to read in.
        return Ok(f);
    }
    let mut scratch = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < SINK_SEGMENT {
        let k = f
            .read_at(&mut scratch, off)
            .with_context(|| format!("reading {}", path.display()))?;
        if k == 0 {
            break;
        }
        off += k as u64;
    }
    Ok(f)
}

/// Writes every buffer into preallocated 64 MiB segment files `dir/NNNNNN`, from `first`
/// (segment 0) on, as the received logs are laid out; a helper thread makes the next one
/// ready. After each group (every buffer already queued, up to 64 MiB) it `fdatasync`s each
/// file written to; returns the bytes written once the last group is synced.
fn durable_writer(
    dir: &std::path::Path,
    first: std::fs::File,
    direct: bool,
    rx: &std::sync::mpsc::Receiver<Vec<u8>>,
) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let ahead = |i: u64| {
        let dir = dir.to_path_buf();
        std::thread::spawn(move || sink_segment(&dir, i, direct))
    };
    let join = |h: std::thread::JoinHandle<Result<std::fs::File>>| {
        h.join()
            .map_err(|_| anyhow::anyhow!("the sink's segment thread panicked"))?
    };
    let mut n = 0u64;
    let mut seg = first;
    let mut next_seg = ahead(1);
    let mut dirty: Vec<std::fs::File> = Vec::new();
    // O_DIRECT wants page-aligned memory, offsets and lengths: each buffer is copied into
    // this one (buffers are whole MiB but the last, which is padded with zeros).
    let mut aligned = if direct {
        Some(memmap2::MmapMut::map_anon(1 << 20)?)
    } else {
        None
    };
    while let Ok(first) = rx.recv() {
        let mut group = 0usize;
        let mut next = Some(first);
        while let Some(buf) = next.take() {
            let mut rest = &buf[..];
            while !rest.is_empty() {
                let off = n % SINK_SEGMENT;
                let k = rest.len().min((SINK_SEGMENT - off) as usize);
                if let Some(a) = aligned.as_mut() {
                    let padded = k.next_multiple_of(4096);
                    a[..k].copy_from_slice(&rest[..k]);
                    a[k..padded].fill(0);
                    seg.write_all_at(&a[..padded], off)
                        .context("writing a sink segment")?;
                } else {
                    seg.write_all_at(&rest[..k], off)
                        .context("writing a sink segment")?;
                }
                rest = &rest[k..];
                n += k as u64;
                if n % SINK_SEGMENT == 0 {
                    let i = n / SINK_SEGMENT;
                    let ready = std::mem::replace(&mut next_seg, ahead(i + 1));
                    dirty.push(std::mem::replace(&mut seg, join(ready)?));
                }
            }
            group += buf.len();
            if group < (64 << 20) {
                next = rx.try_recv().ok();
            }
        }
        for f in dirty.iter().chain(std::iter::once(&seg)) {
            f.sync_data().context("syncing a sink segment")?;
        }
        dirty.clear();
    }
    let _ = join(next_seg);
    Ok(n)
}
