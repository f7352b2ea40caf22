//! One tidelog ship run: a fresh applier, the shipper started on the pre-written WALs, and
//! the clock stopped when everything is durably received and when it is applied.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tidelog_shipper::{Shipper, ShipperOptions};
use tidelog_testkit::{ImpairProxy, Impairment};

use crate::stats::fmt_bytes;

use super::raw::Peer;
use super::{cpu, describe_proxy, Rate, ShipArgs, ShipRun, Source};

/// Ships the backlog to a fresh applier; with `link`, through the impairment proxy.
pub(super) fn ship_run(
    args: &ShipArgs,
    lanes: usize,
    wal_dir: &Path,
    data: &Path,
    certs: &Path,
    src: &Source,
    link: Option<&Impairment>,
) -> Result<ShipRun> {
    println!(
        "[ship] lanes={lanes}: {} over {} tablets{} ...",
        fmt_bytes(src.bytes),
        src.tablets,
        link.map_or(String::new(), |l| format!(" through {l}"))
    );
    std::fs::create_dir_all(data)?;
    let peer = Peer::spawn(
        vec![
            "__applier".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            data.into(),
            "--certs-dir".into(),
            certs.into(),
            "--sync".into(),
            args.sync.name().into(),
            "--max-udp-payload".into(),
            args.max_udp_payload.to_string().into(),
            "--apply-nice".into(),
            args.apply_nice.to_string().into(),
            "--store-nice".into(),
            args.store_nice.to_string().into(),
        ]
        .into_iter()
        .chain(args.direct_io.then(|| "--direct-io".into()))
        .chain((!args.buffered_catch_up).then(|| "--direct-io-in-catch-up".into()))
        .chain([
            "--apply-yield-ms".into(),
            args.apply_yield.as_millis().to_string().into(),
            "--runtime-threads".into(),
            args.runtime_threads.to_string().into(),
        ])
        .chain(args.quic.to_args())
        .collect(),
    )?;
    let addr = peer.addr()?;
    // On a thread of its own in this process (`impair-proxy` in the CPU breakdown).
    let proxy = match link {
        Some(l) => Some(ImpairProxy::start_on_thread(addr, l.clone(), args.seed)?),
        None => None,
    };
    let mut o = ShipperOptions::new(
        wal_dir.to_path_buf(),
        proxy.as_ref().map_or(addr, |p| p.local_addr()),
    );
    o.shipper_id = "tidelog-bench".into();
    o.lanes = lanes;
    o.io_engine = args.io;
    o.max_frame_bytes = usize::try_from(args.frame)?;
    o.window_bytes = args.window;
    o.quic = args.quic.tuning(args.max_udp_payload);
    let tls = tidelog_testkit::pki::load(certs, "shipper")?;
    let (c0, p0) = (cpu::snapshot(None), cpu::snapshot(Some(peer.pid())));
    let t0 = Instant::now();
    let shipper = Shipper::start(o, tls)?;
    let mut received_at: Option<(Duration, cpu::Snapshot, cpu::Snapshot)> = None;
    let mut last_change = Instant::now();
    let mut last = (0u64, 0u64);
    // An impaired run past `--impair-limit`: what had been received and applied.
    let mut cut: Option<(u64, u64)> = None;
    let applied_at = loop {
        let l = peer.expect("", Duration::from_secs(120))?;
        if let Some(e) = l.strip_prefix("ERR ") {
            bail!("applier: {e}");
        }
        let Some(p) = l.strip_prefix("P ") else {
            println!("applier: {l}");
            continue;
        };
        let f: Vec<u64> = p
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let (recv, applied) = (
            f.first().copied().unwrap_or(0),
            f.get(1).copied().unwrap_or(0),
        );
        if (recv, applied) != last {
            last = (recv, applied);
            last_change = Instant::now();
        } else if last_change.elapsed() > Duration::from_secs(60) {
            bail!(
                "no progress for 60 s: received {recv}, applied {applied} of {}",
                src.bytes
            );
        }
        if received_at.is_none() && recv >= src.bytes {
            let el = t0.elapsed();
            received_at = Some((el, cpu::snapshot(None), cpu::snapshot(Some(peer.pid()))));
        }
        let stop = link.is_some() && t0.elapsed() > args.impair_limit;
        if applied >= src.bytes || stop {
            if applied < src.bytes {
                cut = Some((recv, applied));
            }
            break (
                t0.elapsed(),
                cpu::snapshot(None),
                cpu::snapshot(Some(peer.pid())),
            );
        }
    };
    let (recv_bytes, applied_bytes) = cut.unwrap_or((src.bytes, src.bytes));
    let received_at = match (received_at, cut) {
        (Some(r), _) => r,
        (None, Some(_)) => applied_at.clone(),
        (None, None) => bail!("applied everything before receiving it?"),
    };
    let frames = shipper.status().values().map(|s| s.frames).sum();
    let io_engine = shipper.io_engine().name();
    shipper.shutdown();
    let proxy_stats = proxy.as_ref().map(|p| describe_proxy(&p.stats()));
    drop(proxy);
    peer.finish()?;
    // Records in proportion to the bytes for a run stopped early (the records are alike).
    let records = |bytes: u64| src.records * bytes / src.bytes.max(1);
    Ok(ShipRun {
        lanes,
        io_engine,
        received: Rate::new(
            recv_bytes.min(src.bytes),
            records(recv_bytes.min(src.bytes)),
            received_at.0,
        ),
        applied: Rate::new(applied_bytes, records(applied_bytes), applied_at.0),
        cpu_bench_received: cpu::usage(&c0, &received_at.1),
        cpu_applier_received: cpu::usage(&p0, &received_at.2),
        cpu_bench_applied: cpu::usage(&c0, &applied_at.1),
        cpu_applier_applied: cpu::usage(&p0, &applied_at.2),
        frames,
        link: link.map(|l| l.to_string()),
        proxy: proxy_stats,
        complete: cut.is_none(),
    })
}
