//! One tablet's shipping over a connection: its task opens a stream, reads the WAL from
//! where the applier's first Ack says and sends whole records as they are on disk, within
//! the window of unacknowledged bytes. What to send and what the applier's answers mean is
//! the tablet's [`ShipStream`] machine's; this moves the bytes and keeps the counters that
//! status shows.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::Rng;
use tidelog_proto::backoff::Backoff;
use tidelog_proto::ship::{ShipStream, StreamConfig, StreamEvent};
use tidelog_wal::{TabletId, WalPos};

use crate::tail::{Tail, TailError};
use crate::{read_bytes, stream_error_state, Shared, ShipState, TabletShip, SOURCE_RETRY};

/// Ships one tablet over this connection until it closes; re-opens its stream after a
/// stream-level error (the applier's first Ack says where to resume).
pub(crate) async fn tablet_task(
    shared: Arc<Shared>,
    conn: Rc<quinn::Connection>,
    tablet: TabletId,
    st: Arc<TabletShip>,
) {
    // A source that cannot be opened now (a control file being replaced, an I/O error) is
    // looked at again every SOURCE_RETRY while the connection lasts: the error state ends
    // with its cause, without a reconnect.
    let mut tail = loop {
        match Tail::open(
            &shared.opts.wal_dir,
            &tablet,
            shared.engine,
            shared.opts.ship_unsynced,
        ) {
            Ok(t) => {
                if ShipState::from_u8(st.state.load(Ordering::Relaxed)) == ShipState::Error {
                    tracing::info!(tablet = %tablet, "the source opens again");
                    st.set_error(None);
                    st.set_state(ShipState::Connecting);
                }
                break t;
            }
            Err(e) => {
                if ShipState::from_u8(st.state.load(Ordering::Relaxed)) != ShipState::Error {
                    tracing::error!("{e}; retrying every {SOURCE_RETRY:?}");
                }
                st.set_state(ShipState::Error);
                st.set_error(Some(e.to_string()));
            }
        }
        if conn.close_reason().is_some() || shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let notified = st.resume.notified();
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(SOURCE_RETRY) => {}
        }
    };
    // The tablet's side of the protocol, across the streams of this connection.
    let cfg = StreamConfig {
        window_bytes: shared.opts.window_bytes,
        keepalive_interval: shared.opts.keepalive_interval,
    };
    let acked = WalPos(st.acked.load(Ordering::Relaxed));
    let ship = RefCell::new(ShipStream::new(tablet.clone(), cfg).with_acked(acked));
    let mut backoff = Backoff::new(
        shared.opts.reconnect_min,
        shared.opts.reconnect_max,
        Duration::from_secs(10),
    );
    while conn.close_reason().is_none() && !shared.shutdown.load(Ordering::SeqCst) {
        let started = Instant::now();
        match ship_stream(&shared, &conn, &mut tail, &st, &ship).await {
            Ok(()) => return,
            Err(e) => {
                if conn.close_reason().is_some() {
                    return;
                }
                tracing::warn!(tablet = %tablet, "tablet stream: {e:#}; reopening");
                st.reopens.fetch_add(1, Ordering::Relaxed);
                st.set_error(Some(format!("{e:#}")));
                // These say why better than `connecting` until a stream opens again.
                if !matches!(
                    ShipState::from_u8(st.state.load(Ordering::Relaxed)),
                    ShipState::NeedsBootstrap | ShipState::TargetError
                ) {
                    st.set_state(ShipState::Connecting);
                }
            }
        }
        let wait = backoff.failed(started, Instant::now(), rand::rng().random_range(0.5..=1.0));
        tokio::time::sleep(wait).await;
    }
}

/// After a read that succeeded: a tablet in `error` (its source could not be read) leaves
/// it, and its error is cleared. Whether it was in `error`.
fn source_reads_again(st: &TabletShip, tablet: &TabletId, pos: WalPos) -> bool {
    if ShipState::from_u8(st.state.load(Ordering::Relaxed)) != ShipState::Error {
        return false;
    }
    tracing::info!(tablet = %tablet, at = %pos, "the source reads again");
    st.set_error(None);
    true
}

/// Writes the tablet's acknowledged position (as it is when the write starts) to its
/// `acked` file, through the tablet's one writer.
pub(crate) async fn write_acked(st: &Arc<TabletShip>, dir: PathBuf) {
    let st = st.clone();
    let r = tokio::task::spawn_blocking(move || st.acked_file.write(&dir, &st.acked)).await;
    match r {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!("writing the acked file: {e}"),
        Err(e) => tracing::warn!("writing the acked file: {e}"),
    }
}

/// The first `len` bytes of the read buffer as a frame's payload for quinn's send queue
/// (`write_chunk`). A frame of at least half the largest size takes the buffer itself, so
/// its bytes are not copied once more on their way to the packets, and `buf` gets a fresh
/// one; a smaller frame is copied out, so that a frame never holds more than twice its size
/// in memory while it waits for its ack.
fn frame_payload(buf: &mut Vec<u8>, len: usize, max: usize) -> bytes::Bytes {
    if len >= max / 2 {
        let mut p = bytes::Bytes::from(std::mem::replace(buf, Vec::with_capacity(max)));
        p.truncate(len);
        p
    } else {
        bytes::Bytes::copy_from_slice(&buf[..len])
    }
}

#[test]
fn large_frames_take_the_read_buffer_and_small_ones_are_copied() {
    let max = 1 << 20;
    let mut buf = vec![7u8; max];
    let ptr = buf.as_ptr();
    let p = frame_payload(&mut buf, max - 10, max);
    assert_eq!(
        p.as_ptr(),
        ptr,
        "a large frame is the read buffer, not a copy"
    );
    assert_eq!(p.len(), max - 10);
    assert_ne!(buf.as_ptr(), ptr);
    assert!(buf.capacity() >= max && buf.is_empty());
    buf.resize(max, 9);
    let ptr = buf.as_ptr();
    let p = frame_payload(&mut buf, 100, max);
    assert_ne!(p.as_ptr(), ptr, "a small frame is copied out");
    assert_eq!(&p[..], &[9u8; 100][..]);
    assert_eq!(buf.as_ptr(), ptr, "and the read buffer is kept");
}

/// The applier's bytes on a tablet stream, into the tablet's machine; the stream's end
/// too. An Error from the applier sets the state its code calls for.
async fn feed_stream(
    recv: &mut quinn::RecvStream,
    ship: &RefCell<ShipStream>,
    st: &TabletShip,
) -> Result<()> {
    let got = read_bytes(recv).await?;
    let now = Instant::now();
    let r = match got {
        Some(b) => ship.borrow_mut().handle(&b, now),
        None => ship.borrow_mut().handle_end(now),
    };
    if let Err(e) = r {
        if let Some(code) = e.code() {
            st.set_state(stream_error_state(code));
        }
        return Err(e.into());
    }
    Ok(())
}

/// Takes the applier's acks on a tablet stream until it ends it.
async fn take_acks(
    recv: &mut quinn::RecvStream,
    ship: &RefCell<ShipStream>,
    st: &TabletShip,
) -> Result<()> {
    loop {
        // Events first: the bytes that brought the resume Ack may have brought acks too.
        loop {
            // Not in a `while let`: its borrow would last through the body.
            let ev = ship.borrow_mut().poll_event();
            let Some(ev) = ev else {
                break;
            };
            if let StreamEvent::Acked { acked, records } = ev {
                st.acked.fetch_max(acked.0, Ordering::Relaxed);
                st.records_acked.fetch_add(records, Ordering::Relaxed);
                st.records_in_flight
                    .store(ship.borrow().records_in_flight(), Ordering::Relaxed);
                st.acked_changed.notify_waiters();
            }
        }
        feed_stream(recv, ship, st).await?;
    }
}

/// One stream: Open, the resume Ack, then frames until an error or shutdown. The protocol
/// (what to send, the window, what the acks mean) is the tablet's [`ShipStream`]'s; this
/// reads the WAL and moves bytes.
async fn ship_stream(
    shared: &Arc<Shared>,
    conn: &quinn::Connection,
    tail: &mut Tail,
    st: &Arc<TabletShip>,
    ship: &RefCell<ShipStream>,
) -> Result<()> {
    let tablet = tail.tablet.clone();
    let (mut send, mut recv) = conn.open_bi().await?;
    let open = ship.borrow_mut().open();
    send.write_all(&open).await?;
    let (pos, safe) = loop {
        let ev = ship.borrow_mut().poll_event();
        if let Some(StreamEvent::Resume { from, safe_time }) = ev {
            break (from, safe_time);
        }
        feed_stream(&mut recv, ship, st).await?;
    };
    st.acked.store(pos.0, Ordering::Relaxed);
    st.shipped.store(pos.0, Ordering::Relaxed);
    if let Err(e) = tail.check_start(pos) {
        if let TailError::NeedsBootstrap { .. } = e {
            st.set_state(ShipState::NeedsBootstrap);
            let refusal = ship.borrow_mut().needs_bootstrap(&e.to_string());
            let _ = send.write_all(&refusal).await;
            tracing::error!("{e}");
            st.set_error(Some(e.to_string()));
            // Stay connected and look again later (an operator may bootstrap the target).
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        anyhow::bail!("{e}");
    }
    st.set_error(None);
    st.set_state(ShipState::Streaming);
    tracing::info!(tablet = %tablet, from = %pos, safe_time = %safe, "shipping");

    // Acks: in-flight accounting and the stream's errors.
    st.records_in_flight.store(0, Ordering::Relaxed);
    let acks = take_acks(&mut recv, ship, st);
    // The source's `acked` file, rewritten at most every `acked_interval` (two fsyncs each).
    let dir = tail.dir().to_path_buf();
    let written = Rc::new(std::cell::Cell::new(WalPos(0)));
    let flusher = {
        let (st, dir, written) = (st.clone(), dir.clone(), written.clone());
        let every = shared.opts.acked_interval;
        async move {
            loop {
                tokio::time::sleep(every).await;
                let a = WalPos(st.acked.load(Ordering::Relaxed));
                if a > written.get() {
                    write_acked(&st, dir.clone()).await;
                    written.set(a);
                }
            }
        }
    };
    let sender = async {
        let max = shared.opts.max_frame_bytes;
        let mut buf: Vec<u8> = Vec::with_capacity(max);
        let mut idle_wait = Duration::from_micros(50);
        loop {
            if shared.shutdown.load(Ordering::SeqCst) {
                let _ = send.finish();
                return Ok::<(), anyhow::Error>(());
            }
            if st.paused.load(Ordering::Relaxed) {
                let notified = st.resume.notified();
                tokio::select! {
                    _ = notified => {}
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                continue;
            }
            if !ship.borrow().can_send() {
                // The window is full: wait for an ack.
                let notified = st.acked_changed.notified();
                tokio::select! {
                    _ = notified => {}
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
                continue;
            }
            let pos = ship.borrow().shipped();
            match tail.read(pos, &mut buf, max).await {
                Ok(Some(chunk)) => {
                    let payload = frame_payload(&mut buf, chunk.len, max);
                    let head = ship.borrow_mut().send_frame(
                        &payload,
                        chunk.count,
                        chunk.last_ht,
                        Instant::now(),
                    );
                    // Test hook: one frame whose payload does not match its checksum.
                    let corrupt = (|| {
                        fail::fail_point!("shipper::corrupt_frame", |_| true);
                        false
                    })();
                    send.write_all(&head).await?;
                    if corrupt {
                        let mut bad = payload.to_vec();
                        if let Some(b) = bad.last_mut() {
                            *b ^= 0x40;
                        }
                        send.write_all(&bad).await?;
                    } else {
                        send.write_chunk(payload).await?;
                    }
                    let pos = ship.borrow().shipped();
                    st.shipped.store(pos.0, Ordering::Relaxed);
                    st.records_shipped
                        .fetch_add(u64::from(chunk.count), Ordering::Relaxed);
                    st.records_in_flight
                        .store(ship.borrow().records_in_flight(), Ordering::Relaxed);
                    st.bytes_shipped
                        .fetch_add(chunk.len as u64, Ordering::Relaxed);
                    st.frames.fetch_add(1, Ordering::Relaxed);
                    source_reads_again(st, &tablet, pos);
                    st.set_state(ShipState::Streaming);
                    idle_wait = Duration::from_micros(50);
                }
                Ok(None) => {
                    // Nothing new, and no error: a source error of before is over.
                    if source_reads_again(st, &tablet, pos) {
                        st.set_state(ShipState::Streaming);
                    }
                    let now = Instant::now();
                    if ship.borrow().keepalive_due(now) {
                        let k = ship.borrow_mut().keepalive(now);
                        send.write_all(&k).await?;
                        st.set_state(ShipState::Idle);
                    }
                    // Adaptive wait: quick right after data, then up to poll_interval.
                    tokio::time::sleep(idle_wait).await;
                    idle_wait = (idle_wait * 2)
                        .min(shared.opts.poll_interval.max(Duration::from_micros(50)));
                }
                Err(e @ TailError::NeedsBootstrap { .. }) => {
                    st.set_state(ShipState::NeedsBootstrap);
                    let refusal = ship.borrow_mut().needs_bootstrap(&e.to_string());
                    let _ = send.write_all(&refusal).await;
                    st.set_error(Some(e.to_string()));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    anyhow::bail!("{e}");
                }
                Err(e) => {
                    // The source cannot be read at `pos` (a damaged record, an I/O error):
                    // reconnecting would not help. The tablet stays in `error`, its stream
                    // open and kept alive at what was shipped, and the read is retried now
                    // and then (an operator may repair the source).
                    if ShipState::from_u8(st.state.load(Ordering::Relaxed)) != ShipState::Error {
                        tracing::error!(tablet = %tablet, "{e}; shipping of this tablet stopped");
                    }
                    st.set_state(ShipState::Error);
                    st.set_error(Some(e.to_string()));
                    let k = ship.borrow_mut().keepalive(Instant::now());
                    send.write_all(&k).await?;
                    let notified = st.resume.notified();
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep(SOURCE_RETRY) => {}
                    }
                }
            }
        }
    };
    let r = tokio::select! {
        r = acks => r,
        r = sender => r,
        () = flusher => Ok(()),
    };
    let a = WalPos(st.acked.load(Ordering::Relaxed));
    if a > written.get() {
        write_acked(st, dir).await;
    }
    r
}
