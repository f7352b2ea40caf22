//! The pipe end to end through the real library endpoints on loopback: shipper (lanes,
//! io_uring or std) → QUIC with mutual TLS → applier intake → received logs.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../../wal/tests/common/tmpfs.rs"]
mod tmpfs;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tidelog_applier::intake::{Intake, IntakeOptions};
use tidelog_shipper::io::IoChoice;
use tidelog_shipper::{Shipper, ShipperOptions};
use tidelog_wal::SyncPolicy;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn start_intake(rt: &tokio::runtime::Runtime, p: &Pki, dir: &std::path::Path) -> Intake {
    start_intake_with(rt, p, dir, false)
}

fn start_intake_with(
    rt: &tokio::runtime::Runtime,
    p: &Pki,
    dir: &std::path::Path,
    direct_io: bool,
) -> Intake {
    start_intake_sized(rt, p, dir, direct_io, 96 << 10)
}

fn start_intake_sized(
    rt: &tokio::runtime::Runtime,
    p: &Pki,
    dir: &std::path::Path,
    direct_io: bool,
    segment_size: u64,
) -> Intake {
    let mut o = IntakeOptions::new("127.0.0.1:0".parse().unwrap(), dir.to_path_buf());
    o.sync = SyncPolicy::Batch;
    o.segment_size = segment_size;
    o.direct_io = direct_io;
    let _g = rt.enter();
    Intake::start(o, server_tls(p), None).unwrap()
}

/// Waits until the intake holds tablet `t` durably up to `end`.
fn wait_received(
    intake: &Intake,
    t: &tidelog_wal::TabletId,
    end: tidelog_wal::WalPos,
    what: &str,
    limit: Duration,
) {
    wait_for(&format!("{what} ({t} received up to {end})"), limit, || {
        intake.tablet(t).is_some_and(|ti| ti.received_pos() >= end)
    });
}

fn shipper_opts(
    wal: &std::path::Path,
    addr: SocketAddr,
    io: IoChoice,
    lanes: usize,
) -> ShipperOptions {
    let mut o = ShipperOptions::new(wal.to_path_buf(), addr);
    o.io_engine = io;
    o.lanes = lanes;
    o.max_frame_bytes = 64 << 10;
    o.window_bytes = 256 << 10;
    o.rescan_interval = Duration::from_millis(100);
    o.reconnect_min = Duration::from_millis(20);
    o.reconnect_max = Duration::from_millis(200);
    o
}

fn ships_8_tablets(io: IoChoice, lanes: usize, direct_io: bool) {
    let p = pki();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let rt = rt();
    let intake = start_intake_with(&rt, &p, dst.path(), direct_io);
    let addr = intake.local_addr().unwrap();
    let mut writers: Vec<_> = (0..8)
        .map(|i| source(src.path(), &tablet(i), 64 << 10))
        .collect();
    for (i, w) in writers.iter_mut().enumerate() {
        write_records(w, 0, 200 + 50 * i as u64, 100 + 40 * i);
    }
    // One record larger than a frame (64 KiB) to take the single-large-record path.
    write_records(&mut writers[3], 10_000, 1, 50_000);
    let shipper =
        Shipper::start(shipper_opts(src.path(), addr, io, lanes), client_tls(&p)).unwrap();
    // More while it runs: live tailing across rotations, and a tablet that appears later.
    for (i, w) in writers.iter_mut().enumerate() {
        write_records(w, 20_000, 300, 64 + i);
    }
    let mut late = source(src.path(), &tablet(8), 64 << 10);
    write_records(&mut late, 0, 100, 10);
    writers.push(late);
    for (i, w) in writers.iter().enumerate() {
        wait_received(
            &intake,
            &tablet(i),
            w.written_pos(),
            "shipped",
            Duration::from_secs(60),
        );
    }
    // Record for record identical, and the acks reached the shipper.
    for (i, w) in writers.iter().enumerate() {
        let t = tablet(i);
        let want = read_all(src.path(), &t);
        let got = read_all(&dst.path().join("received"), &t);
        assert_eq!(want.len(), got.len(), "{t}: record count");
        assert!(want == got, "{t}: received log differs from the source");
        let end = w.written_pos().0;
        wait_for(&format!("{t} acked"), Duration::from_secs(20), || {
            shipper.status().get(&t).is_some_and(|s| s.acked_pos == end)
        });
    }
    let st = shipper.status();
    assert_eq!(st.len(), 9);
    assert!(st
        .values()
        .all(|s| s.lag_bytes == 0 && s.records_acked == s.records_shipped));
    shipper.shutdown();
    // The acked files were written for retention.
    wait_for("acked files", Duration::from_secs(5), || {
        (0..9).all(|i| {
            tidelog_wal::retention::read_acked(&src.path().join(tablet(i).as_str()))
                .ok()
                .flatten()
                .is_some()
        })
    });
    rt.block_on(intake.shutdown());
}

#[test]
fn ships_8_tablets_identically_with_io_uring_over_2_lanes() {
    ships_8_tablets(IoChoice::Auto, 2, false);
}

/// The same into received logs written with `O_DIRECT` (`received-direct-io`).
#[test]
fn ships_8_tablets_identically_into_direct_io_received_logs() {
    ships_8_tablets(IoChoice::Auto, 1, true);
}

#[test]
fn ships_8_tablets_identically_with_std_reads_over_1_lane() {
    ships_8_tablets(IoChoice::Std, 1, false);
}

#[test]
fn a_shipper_from_another_ca_is_refused() {
    let good = pki();
    let evil = pki();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let rt = rt();
    let intake = start_intake(&rt, &good, dst.path());
    let mut w = source(src.path(), &tablet(0), 64 << 10);
    write_records(&mut w, 0, 50, 10);
    // Trusts the applier's CA but presents a client certificate signed by another CA.
    let mut tls = client_tls(&evil);
    tls.ca = client_tls(&good).ca;
    let shipper = Shipper::start(
        shipper_opts(src.path(), intake.local_addr().unwrap(), IoChoice::Auto, 1),
        tls,
    )
    .unwrap();
    wait_for(
        "the shipper to report the refusal",
        Duration::from_secs(20),
        || {
            shipper
                .status()
                .get(&tablet(0))
                .and_then(|s| s.error.clone())
                .is_some()
        },
    );
    let err = shipper.status()[&tablet(0)].error.clone().unwrap();
    assert!(
        err.contains("connection lost")
            || err.contains("closed")
            || err.contains("certificate")
            || err.contains("aborted"),
        "{err}"
    );
    assert!(
        intake.tablets().is_empty(),
        "a refused shipper registered a tablet"
    );
    assert!(!dst
        .path()
        .join("received")
        .join(tablet(0).as_str())
        .exists());
    assert_eq!(shipper.status()[&tablet(0)].acked_pos, 0);
    shipper.shutdown();
    rt.block_on(intake.shutdown());
}

#[test]
fn a_tablet_claimed_by_a_live_shipper_is_refused_for_a_second() {
    let p = pki();
    let (src1, src2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dst = tempfile::tempdir().unwrap();
    let rt = rt();
    let intake = start_intake(&rt, &p, dst.path());
    let addr = intake.local_addr().unwrap();
    let mut w1 = source(src1.path(), &tablet(0), 64 << 10);
    write_records(&mut w1, 0, 20, 10);
    drop(w1);
    // host-b holds a copy of the same log (a standby source host), then writes more.
    let (d1, d2) = (src1.path().join("tablet-0"), src2.path().join("tablet-0"));
    std::fs::create_dir_all(&d2).unwrap();
    for e in std::fs::read_dir(&d1).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d2.join(e.file_name())).unwrap();
    }
    let w1 = source(src1.path(), &tablet(0), 64 << 10);
    let mut o1 = shipper_opts(src1.path(), addr, IoChoice::Auto, 1);
    o1.shipper_id = "host-a".into();
    let s1 = Shipper::start(o1, client_tls(&p)).unwrap();
    let end = w1.written_pos();
    wait_received(
        &intake,
        &tablet(0),
        end,
        "host-a streams",
        Duration::from_secs(20),
    );
    let mut w2 = source(src2.path(), &tablet(0), 64 << 10);
    write_records(&mut w2, 100, 30, 10);
    let mut o2 = shipper_opts(src2.path(), addr, IoChoice::Auto, 1);
    o2.shipper_id = "host-b".into();
    let s2 = Shipper::start(o2, client_tls(&p)).unwrap();
    wait_for("host-b refused", Duration::from_secs(20), || {
        s2.status()
            .get(&tablet(0))
            .is_some_and(|s| s.state == "refused")
    });
    let reason = s2.status()[&tablet(0)].error.clone().unwrap();
    assert!(
        reason.contains("host-a") && reason.contains("tablet-0"),
        "{reason}"
    );
    assert_eq!(intake.tablet(&tablet(0)).unwrap().received_pos(), end);
    // host-a goes away (cleanly: its connection closes); host-b asks again and takes over.
    s1.shutdown();
    wait_received(
        &intake,
        &tablet(0),
        w2.written_pos(),
        "host-b takes over after host-a left",
        Duration::from_secs(30),
    );
    let got = read_all(&dst.path().join("received"), &tablet(0));
    assert!(got == read_all(src2.path(), &tablet(0)));
    s2.shutdown();
    rt.block_on(intake.shutdown());
}

/// A tablet created while the shipper runs is found at once (inotify on the WAL directory),
/// not at the next rescan (an hour away here), also beside entries that are not tablets:
/// it counts for the target's safe time only from its announcement on.
#[test]
fn a_tablet_created_while_running_is_shipped_without_waiting_for_a_rescan() {
    let p = pki();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    // Entries that are not tablets (a file system's `lost+found`, a file an operator left)
    // are skipped: they used to fail the start, and every later scan.
    std::fs::create_dir(src.path().join("lost+found")).unwrap();
    std::fs::write(src.path().join("README"), b"tablets live here\n").unwrap();
    let rt = rt();
    let intake = start_intake(&rt, &p, dst.path());
    let addr = intake.local_addr().unwrap();
    let mut first = source(src.path(), &tablet(0), 64 << 10);
    write_records(&mut first, 0, 10, 10);
    let mut o = shipper_opts(src.path(), addr, IoChoice::Std, 1);
    o.rescan_interval = Duration::from_secs(3600);
    let shipper = Shipper::start(o, client_tls(&p)).unwrap();
    wait_received(
        &intake,
        &tablet(0),
        first.written_pos(),
        "tablet 0",
        Duration::from_secs(20),
    );
    let mut late = source(src.path(), &tablet(1), 64 << 10);
    write_records(&mut late, 0, 10, 10);
    wait_received(
        &intake,
        &tablet(1),
        late.written_pos(),
        "the new tablet, long before a rescan",
        Duration::from_secs(10),
    );
    shipper.shutdown();
    rt.block_on(intake.shutdown());
}

/// A record damaged at the source (a bit flipped on disk under `durable_pos`): the records
/// before it are shipped, the tablet stops in `error` naming the segment file and the
/// position — not a reconnect loop with the applier refusing the frame — and the other
/// tablets keep flowing. Once the byte is repaired, the rest goes.
#[test]
fn a_damaged_source_record_stops_its_tablet_in_error_naming_the_file() {
    use std::os::unix::fs::FileExt;
    let p = pki();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let rt = rt();
    let intake = start_intake(&rt, &p, dst.path());
    let addr = intake.local_addr().unwrap();
    let (bad_t, good_t) = (tablet(0), tablet(1));
    let mut bad_w = source(src.path(), &bad_t, 1 << 20);
    let mut good_w = source(src.path(), &good_t, 1 << 20);
    write_records(&mut bad_w, 0, 10, 200);
    write_records(&mut good_w, 0, 10, 200);
    let records = read_all(src.path(), &bad_t);
    let victim = records[6].0;
    let segs = tidelog_wal::reader::list_segments(&src.path().join(bad_t.as_str())).unwrap();
    let (first, path) = segs.iter().rev().find(|(f, _)| *f <= victim).unwrap();
    let off = tidelog_wal::reader::SEGMENT_DATA_OFFSET + victim.since(*first) + 40;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, off).unwrap();
    file.write_all_at(&[byte[0] ^ 0x10], off).unwrap();

    let shipper = Shipper::start(
        shipper_opts(src.path(), addr, IoChoice::Auto, 1),
        client_tls(&p),
    )
    .unwrap();
    wait_received(
        &intake,
        &good_t,
        good_w.written_pos(),
        "the other tablet",
        Duration::from_secs(30),
    );
    wait_received(
        &intake,
        &bad_t,
        victim,
        "the records before the damage",
        Duration::from_secs(30),
    );
    wait_for(
        "the damaged tablet in error",
        Duration::from_secs(10),
        || {
            shipper
                .status()
                .get(&bad_t)
                .is_some_and(|s| s.state == "error")
        },
    );
    let row = shipper.status().remove(&bad_t).unwrap();
    let err = row.error.clone().unwrap_or_default();
    assert!(
        err.contains(&path.display().to_string()) && err.contains(&victim.to_string()),
        "the error names the file and the position: {err}"
    );
    assert!(err.contains("checksum"), "{err}");
    assert_eq!(
        row.shipped_pos, victim.0,
        "nothing at or past the damage shipped"
    );
    // It stays there: no reconnects, no stream reopened, nothing more received, while the
    // shipper looks again every second.
    let until = std::time::Instant::now() + Duration::from_millis(2500);
    while std::time::Instant::now() < until {
        let row = shipper.status().remove(&bad_t).unwrap();
        assert_eq!((row.state, row.stream_reopens), ("error", 0), "{row:?}");
        assert_eq!(intake.tablet(&bad_t).unwrap().received_pos(), victim);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(shipper.reconnects(), 0);

    // Repaired: the rest is shipped, identical to the source.
    file.write_all_at(&byte, off).unwrap();
    wait_received(
        &intake,
        &bad_t,
        bad_w.written_pos(),
        "the rest after the repair",
        Duration::from_secs(30),
    );
    wait_for("the tablet out of error", Duration::from_secs(10), || {
        shipper
            .status()
            .get(&bad_t)
            .is_some_and(|s| s.state != "error" && s.error.is_none())
    });
    assert!(read_all(src.path(), &bad_t) == read_all(&dst.path().join("received"), &bad_t));
    shipper.shutdown();
    rt.block_on(intake.shutdown());
}

/// Of the received log's positions `[from, to)` (whole pages only), how many pages are in
/// the page cache, and how many there are (`mincore` over a mapping of each segment).
fn cached_pages(
    root: &std::path::Path,
    t: &tidelog_wal::TabletId,
    from: tidelog_wal::WalPos,
    to: tidelog_wal::WalPos,
) -> (usize, usize) {
    use tidelog_wal::format::SEGMENT_HEADER_LEN;
    let segs = tidelog_wal::reader::list_segments(&root.join(t.as_str())).unwrap();
    let (mut cached, mut total) = (0, 0);
    for (i, (first, path)) in segs.iter().enumerate() {
        let first = first.0;
        let end = segs.get(i + 1).map_or(u64::MAX, |s| s.0 .0);
        let (a, b) = (from.0.max(first), to.0.min(end));
        if a >= b {
            continue;
        }
        let f = std::fs::File::open(path).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: a fresh read-only shared mapping of the whole file, only handed to
        // mincore (never read through) and unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED, "mmap {}", path.display());
        let mut v = vec![0u8; len.div_ceil(4096)];
        // SAFETY: `map` is a live mapping of `len` bytes; `v` has one byte per page.
        let rc = unsafe { libc::mincore(map, len, v.as_mut_ptr()) };
        // SAFETY: the mapping made above, of `len` bytes.
        unsafe { libc::munmap(map, len) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        let pa = (SEGMENT_HEADER_LEN + (a - first) as usize).div_ceil(4096);
        let pb = (SEGMENT_HEADER_LEN + (b - first) as usize) / 4096;
        if pa < pb {
            cached += v[pa..pb].iter().filter(|b| *b & 1 == 1).count();
            total += pb - pa;
        }
    }
    (cached, total)
}

/// `direct_io_in_catch_up` (the daemon's `received-direct-io-in-catch-up`): a backlog,
/// shipped in large frames, is written around the page cache; a live stream after it, in
/// small frames, through the page cache again, where apply reads it back at once.
#[test]
fn a_backlog_goes_around_the_page_cache_and_a_live_stream_through_it() {
    let p = pki();
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let rt = rt();
    let mut o = IntakeOptions::new("127.0.0.1:0".parse().unwrap(), dst.path().to_path_buf());
    o.sync = SyncPolicy::Batch;
    o.segment_size = 4 << 20;
    o.direct_io_in_catch_up = true;
    let intake = {
        let _g = rt.enter();
        Intake::start(o, server_tls(&p), None).unwrap()
    };
    if !intake.direct_io_in_catch_up() {
        eprintln!("the temporary directory's file system refuses O_DIRECT: skipped");
        rt.block_on(intake.shutdown());
        return;
    }
    let t = tablet(0);
    let mut w = source(src.path(), &t, 32 << 20);
    write_records(&mut w, 0, 12_000, 1000);
    let backlog_end = w.written_pos();
    let mut so = shipper_opts(src.path(), intake.local_addr().unwrap(), IoChoice::Auto, 1);
    so.max_frame_bytes = 1 << 20;
    so.window_bytes = 8 << 20;
    let shipper = Shipper::start(so, client_tls(&p)).unwrap();
    wait_received(
        &intake,
        &t,
        backlog_end,
        "the backlog",
        Duration::from_secs(60),
    );
    let activity = intake.activity();
    wait_for("the catch-up to end", Duration::from_secs(10), || {
        !activity.catching_up()
    });
    for i in 0..40 {
        write_records(&mut w, 100_000 + i * 10, 10, 1000);
        wait_received(
            &intake,
            &t,
            w.written_pos(),
            "live",
            Duration::from_secs(20),
        );
    }
    let live_end = w.written_pos();
    let received = dst.path().join("received");
    // The first frames go through the page cache: the catch-up is seen once they are durable.
    let skip = tidelog_wal::WalPos(2 << 20);
    let (b_cached, b_total) = cached_pages(&received, &t, skip, backlog_end);
    let (l_cached, l_total) = cached_pages(&received, &t, backlog_end, live_end);
    assert!(
        b_total > 1500 && l_total > 50,
        "{b_total} / {l_total} pages"
    );
    assert!(
        b_cached * 5 < b_total,
        "{b_cached} of the backlog's {b_total} pages are in the page cache"
    );
    assert!(
        l_cached * 2 > l_total,
        "only {l_cached} of the live stream's {l_total} pages are in the page cache"
    );
    // (Reading it brings it into the page cache: after the counts.)
    assert!(
        read_all(src.path(), &t) == read_all(&received, &t),
        "received log differs from the source"
    );
    shipper.shutdown();
    rt.block_on(intake.shutdown());
}

/// The shipper's status row of `t`: (state, error, shipped, acked).
fn row(shipper: &Shipper, t: &tidelog_wal::TabletId) -> Option<(String, Option<String>, u64, u64)> {
    shipper
        .status()
        .remove(t)
        .map(|r| (r.state.to_string(), r.error, r.shipped_pos, r.acked_pos))
}

/// A tablet whose bytes are all shipped but not acknowledged (the applier holds them:
/// paused here, a full disk in the field) is `catching_up`, not `idle`; once they are
/// acknowledged it is `idle`.
#[test]
fn unacknowledged_bytes_are_catching_up_not_idle() {
    let p = pki();
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let rt = rt();
    let intake = start_intake(&rt, &p, dst.path());
    intake.set_paused(None, true).unwrap();
    let t = tablet(0);
    let mut w = source(src.path(), &t, 64 << 10);
    write_records(&mut w, 0, 40, 300);
    let end = w.written_pos().0;
    let shipper = Shipper::start(
        shipper_opts(src.path(), intake.local_addr().unwrap(), IoChoice::Auto, 1),
        client_tls(&p),
    )
    .unwrap();
    // Everything shipped, nothing acknowledged, and the lane found nothing more to send.
    wait_for(
        "all shipped and the lane done",
        Duration::from_secs(20),
        || row(&shipper, &t).is_some_and(|(st, _, shipped, _)| shipped == end && st != "streaming"),
    );
    let (state, _, _, acked) = row(&shipper, &t).unwrap();
    assert_eq!(acked, 0);
    assert_eq!(state, "catching_up", "{end} bytes unacknowledged");
    assert_eq!(shipper.status()[&t].lag_bytes, end);
    intake.set_paused(None, false).unwrap();
    wait_for("acknowledged and idle", Duration::from_secs(20), || {
        row(&shipper, &t).is_some_and(|(st, _, _, acked)| acked == end && st == "idle")
    });
    shipper.shutdown();
    rt.block_on(intake.shutdown());
}

/// When the applier cannot take a tablet because its disk is full, the shipper says
/// `target_error` with the applier's reason, not `refused` (which says another shipper owns
/// it); once there is space, it ships on its own and the error is gone.
#[test]
fn a_full_target_disk_is_a_target_error_that_clears() {
    let Some(fs) = tmpfs::Tmpfs::mount(256 << 10) else {
        return;
    };
    let p = pki();
    let src = tempfile::tempdir().unwrap();
    let rt = rt();
    // Received segments larger than the target's disk.
    let intake = start_intake_sized(&rt, &p, fs.path(), false, 1 << 20);
    let t = tablet(0);
    let mut w = source(src.path(), &t, 64 << 10);
    write_records(&mut w, 0, 50, 100);
    let end = w.written_pos();
    let shipper = Shipper::start(
        shipper_opts(src.path(), intake.local_addr().unwrap(), IoChoice::Auto, 1),
        client_tls(&p),
    )
    .unwrap();
    wait_for("the target error", Duration::from_secs(20), || {
        row(&shipper, &t).is_some_and(|(st, _, _, _)| st != "connecting")
    });
    let (state, error, _, _) = row(&shipper, &t).unwrap();
    assert_eq!(state, "target_error", "{error:?}");
    let error = error.unwrap();
    assert!(
        error.to_lowercase().contains("no space left on device") && error.contains("tablet-0"),
        "{error}"
    );
    // Space comes back: no restart of either end.
    fs.resize(16 << 20);
    wait_received(
        &intake,
        &t,
        end,
        "shipped once there is space",
        Duration::from_secs(30),
    );
    wait_for("acknowledged, no error", Duration::from_secs(20), || {
        row(&shipper, &t).is_some_and(|(st, err, _, acked)| {
            acked == end.0 && err.is_none() && (st == "idle" || st == "streaming")
        })
    });
    shipper.shutdown();
    rt.block_on(intake.shutdown());
}

/// A source log whose first segment could not be created (no space for its preallocation:
/// a control file and no segment) is an empty log to the shipper, not one that needs a
/// bootstrap; once the writer makes the segment, its records are shipped.
#[test]
fn a_source_whose_first_segment_failed_is_empty_not_needs_bootstrap() {
    let Some(fs) = tmpfs::Tmpfs::mount(256 << 10) else {
        return;
    };
    let p = pki();
    let dst = tempfile::tempdir().unwrap();
    let rt = rt();
    let intake = start_intake(&rt, &p, dst.path());
    let t = tablet(0);
    let e = tidelog_wal::Writer::open(
        fs.path(),
        &t,
        tidelog_wal::WalOptions {
            segment_size: 1 << 20,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("No space left"), "{e}");
    let shipper = Shipper::start(
        shipper_opts(fs.path(), intake.local_addr().unwrap(), IoChoice::Auto, 1),
        client_tls(&p),
    )
    .unwrap();
    wait_for("an idle, empty tablet", Duration::from_secs(20), || {
        row(&shipper, &t).is_some_and(|(st, err, _, _)| {
            assert_ne!(st, "needs_bootstrap", "{err:?}");
            st == "idle" && err.is_none()
        })
    });
    fs.resize(8 << 20);
    let mut w = source(fs.path(), &t, 64 << 10);
    write_records(&mut w, 0, 30, 100);
    wait_received(
        &intake,
        &t,
        w.written_pos(),
        "shipped",
        Duration::from_secs(30),
    );
    let st = row(&shipper, &t).unwrap();
    assert!(st.1.is_none() && st.0 != "needs_bootstrap", "{st:?}");
    assert!(
        read_all(&dst.path().join("received"), &t) == read_all(fs.path(), &t),
        "received log differs"
    );
    shipper.shutdown();
    rt.block_on(intake.shutdown());
    drop(w);
}
