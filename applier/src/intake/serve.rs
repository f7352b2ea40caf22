//! A shipper's connection: its control stream (Hello → claims → Welcome) and its tablet
//! streams (Open → resume Ack, frames checked and queued for the writer thread, Acks of
//! what is durable). The protocol's rules are `tidelog-proto`'s machines; this reads and
//! writes the QUIC streams, checks the clock skew and keeps the counters status shows.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use bytes::Bytes;
use tidelog_proto::intake::{AckOut, Durable, IntakeStream, Received};
use tidelog_proto::wire::{self, Message, MsgKind, MSG_HEADER_LEN};
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{HybridTime, TabletId, WalPos};
use tokio::sync::watch;
use tracing::Instrument;

use super::shared::Shared;
use super::state::TabletState;
use super::tablet::{lock, now_ms, TabletIntake, WriteReq};
use crate::frame_queue::PushError;

/// Whether data frame `f` (records `payload`) is beyond this host's clock plus `max`: the
/// first record whose ht is, or else the frame's safe time, as the bytes of the payload
/// before it (whole records within the bound) and the reason; `None` when all are within.
/// The payload's checksum was verified; its records are walked by their headers only (a
/// malformed one ends the walk, and the writer refuses the frame for it).
fn beyond_clock(f: &wire::DataFrame, payload: &[u8], max: Duration) -> Option<(usize, String)> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let limit = now.saturating_add(max.as_micros() as u64);
    let describe = |what: String, ht: HybridTime| {
        let ahead = Duration::from_micros(ht.physical_micros().saturating_sub(now));
        let when = humantime::format_rfc3339_seconds(ht.to_system_time());
        format!(
            "tablet {}: {what} has ht {ht} ({when}), {} ahead of this applier's clock, beyond \
             max-clock-skew {}: refused, nothing of it written or acknowledged",
            f.tablet,
            fmt_duration(ahead),
            fmt_duration(max)
        )
    };
    let mut off = 0usize;
    while let Some(head) = payload.get(off..off + RECORD_HEADER_LEN) {
        let len = head
            .get(8..12)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)?;
        let ht = head
            .get(16..24)
            .and_then(|b| b.try_into().ok())
            .map(|b| HybridTime(u64::from_le_bytes(b)))?;
        if ht.physical_micros() > limit {
            let pos = f.first_pos.add(off as u64);
            let why = describe(format!("the record at received-log position {pos}"), ht);
            return Some((off, why));
        }
        off = off.checked_add(RECORD_HEADER_LEN + len as usize)?;
    }
    (f.safe_time.physical_micros() > limit).then(|| {
        let why = describe(
            format!("the frame at received-log position {}", f.first_pos),
            f.safe_time,
        );
        (0, why)
    })
}

/// `d` rounded to milliseconds, as humantime shows it (`86years 5months …`, `3s 500ms`).
fn fmt_duration(d: Duration) -> String {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// Reads one message from a QUIC stream. `Ok(None)` at a clean end of stream.
async fn read_msg(recv: &mut quinn::RecvStream) -> Result<Option<(Message, Bytes)>> {
    let mut head = [0u8; MSG_HEADER_LEN];
    match recv.read_exact(&mut head).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let (kind, len, sum) = wire::decode_header(&head)?;
    // One copy out of quinn's buffers, no zeroing first (frames are up to a few MiB), and
    // as many of its chunks per call as have arrived: each call takes the connection's lock,
    // which its driver, on the other runtime thread, holds while it decrypts packets.
    let mut body = bytes::BytesMut::with_capacity(len);
    // A data frame's checksum is taken from its record headers as they arrive, while they
    // are in the cache (`wire::DataChecksum`).
    let data = matches!(kind, MsgKind::Data | MsgKind::KeepAlive) && len >= wire::DATA_HEADER_LEN;
    let mut summing: Option<wire::DataChecksum> = None;
    while body.len() < len {
        use bytes::BufMut;
        use tokio::io::AsyncReadExt;
        let want = len - body.len();
        let n = recv
            .read_buf(&mut (&mut body).limit(want))
            .await
            .map_err(read_error)?;
        if n == 0 {
            anyhow::bail!(
                "the stream ended {} bytes into a {len}-byte {kind:?} message body",
                body.len()
            );
        }
        if data && body.len() >= wire::DATA_HEADER_LEN {
            let (head, payload) = body.split_at(wire::DATA_HEADER_LEN);
            summing
                .get_or_insert_with(|| wire::DataChecksum::new(head))
                .advance(payload, len - wire::DATA_HEADER_LEN);
        }
    }
    let msg = match summing {
        Some(c) => {
            let computed = c.finish(&body[wire::DATA_HEADER_LEN..]);
            wire::decode_body_summed(kind, &body, sum, computed)?
        }
        None => wire::decode_body(kind, &body, sum)?,
    };
    let body = body.freeze();
    let payload = if kind == MsgKind::Data {
        body.slice(wire::DATA_HEADER_LEN..)
    } else {
        Bytes::new()
    };
    Ok(Some((msg, payload)))
}

/// quinn's read error back out of the `std::io::Error` its `AsyncRead` wraps it in, so a
/// stream or connection that ended is told apart from a bad frame.
fn read_error(e: std::io::Error) -> anyhow::Error {
    match e.downcast::<quinn::ReadError>() {
        Ok(r) => r.into(),
        Err(e) => anyhow::Error::from(e).context("reading the stream"),
    }
}

/// The clock-skew check finds the first record beyond the clock plus the bound, by its
/// position (the records before it are within), else a frame safe time beyond it; hts
/// within pass.
#[cfg(test)]
#[test]
fn frames_beyond_the_clock_plus_the_skew_bound_are_named_by_position() {
    use tidelog_wal::{Body, Record};
    let now = HybridTime::from_system_time(SystemTime::now());
    let skew = Duration::from_millis(500);
    let ahead = |d: Duration| HybridTime(now.0 + ((d.as_micros() as u64) << 12));
    let frame = |hts: &[HybridTime], safe: HybridTime| {
        let mut payload = Vec::new();
        let first = WalPos(4096);
        for ht in hts {
            let rec = Record::new(*ht, Body::Heartbeat);
            payload.extend(
                rec.encode(first.add(payload.len() as u64))
                    .unwrap_or_default(),
            );
        }
        let f = wire::DataFrame {
            tablet: "e1".parse().unwrap_or_else(|_| unreachable!()),
            first_pos: first,
            end_pos: first.add(payload.len() as u64),
            safe_time: safe,
            record_count: hts.len() as u32,
        };
        (f, payload)
    };
    let (f, p) = frame(&[now, ahead(Duration::from_millis(100))], now);
    assert_eq!(beyond_clock(&f, &p, skew), None);
    let (f, p) = frame(&[now, ahead(Duration::from_secs(5)), HybridTime::MAX], now);
    let (within, why) = beyond_clock(&f, &p, skew).unwrap_or_default();
    assert_eq!(within, 32, "the first record is within the bound");
    assert!(
        why.contains("tablet e1")
            && why.contains("record at received-log position 4128")
            && why.contains("max-clock-skew 500ms"),
        "{why}"
    );
    let (f, p) = frame(&[now], HybridTime::MAX);
    let (within, why) = beyond_clock(&f, &p, skew).unwrap_or_default();
    assert_eq!(within, 0);
    assert!(
        why.contains("frame at received-log position 4096")
            && why.contains("18446744073709551615")
            && why.contains("2112-"),
        "{why}"
    );
}

#[cfg(test)]
#[test]
fn a_stream_that_ended_is_still_told_apart_through_async_read() {
    let io: std::io::Error = quinn::ReadError::Reset(quinn::VarInt::from_u32(7)).into();
    let e = read_error(io);
    assert!(matches!(
        e.downcast_ref::<quinn::ReadError>(),
        Some(quinn::ReadError::Reset(_))
    ));
    let e = read_error(std::io::Error::other("something else"));
    assert!(e.downcast_ref::<quinn::ReadError>().is_none());
    assert!(format!("{e:#}").contains("something else"));
}

pub(super) async fn serve_connection(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    conn_id: u64,
) -> Result<()> {
    let (csend, crecv) = conn
        .accept_bi()
        .await
        .context("waiting for the control stream")?;
    tokio::select! {
        r = serve_control(shared.clone(), &conn, csend, crecv, conn_id) => r,
        r = accept_tablet_streams(shared.clone(), &conn, conn_id) => r,
        r = watch_silence(&conn, shared.opts.quic.silence_limit) => r,
    }
}

/// Ends a connection that has received nothing for `limit` (a SIGKILLed shipper's, whose
/// tablets would otherwise stay claimed and shown as streaming until the idle timeout).
async fn watch_silence(conn: &quinn::Connection, limit: Duration) -> Result<()> {
    let mut silence = tidelog_net::Silence::new(conn.stats().udp_rx.datagrams);
    let mut look = tokio::time::interval(tidelog_net::Silence::look_every(limit));
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        look.tick().await;
        if let Some(quiet) = silence.exceeded(conn.stats().udp_rx.datagrams, limit) {
            conn.close(quinn::VarInt::from_u32(1), b"no packet from the shipper");
            anyhow::bail!(
                "no packet from the shipper for {:.1} s (limit {limit:?})",
                quiet.as_secs_f64()
            );
        }
    }
}

/// The control stream: Hello messages (the first, and any later one for new tablets).
async fn serve_control(
    shared: Arc<Shared>,
    conn: &quinn::Connection,
    mut csend: quinn::SendStream,
    mut crecv: quinn::RecvStream,
    conn_id: u64,
) -> Result<()> {
    let remote = conn.remote_address();
    let mut first = true;
    loop {
        let Some((msg, _)) = read_msg(&mut crecv).await? else {
            return Ok(());
        };
        let Message::Hello(h) = msg else {
            let e = wire::encode_error("protocol", "expected Hello on the control stream");
            let _ = csend.write_all(&e).await;
            anyhow::bail!("protocol: expected Hello on the control stream");
        };
        if first {
            tracing::Span::current().record("shipper", h.shipper_id.as_str());
            tracing::info!(conn = conn_id, %remote, shipper = %h.shipper_id, lane = h.lane,
                tablets = h.tablets.len(), "shipper connected");
            first = false;
        }
        let refusal = lock(&shared.refusal).clone();
        let hook = lock(&shared.hook).0.clone();
        if let (None, Some(hook)) = (&refusal, hook) {
            // Registering is a durable store write: off the runtime's threads.
            let mut announced: Vec<TabletId> = h.tablets.iter().map(|t| t.tablet.clone()).collect();
            announced.extend(h.all_tablets.iter().cloned());
            announced.sort();
            announced.dedup();
            let sh = shared.clone();
            tokio::task::spawn_blocking(move || {
                for t in &announced {
                    let pos = lock(&sh.tablets)
                        .get(t)
                        .map_or(WalPos::ZERO, |ti| ti.received_pos());
                    hook(t, pos);
                }
            })
            .await
            .context("registering the announced tablets")?;
        }
        // Each tablet's intake (its received log opened, maybe created) before the claims
        // are taken, so that no file is opened under their lock.
        let ready: BTreeMap<TabletId, Result<Arc<TabletIntake>, String>> = h
            .tablets
            .iter()
            .map(|ht| {
                let ti = match &refusal {
                    Some(r) => Err(r.clone()),
                    None => shared.tablet(&ht.tablet).map_err(|e| format!("{e:#}")),
                };
                (ht.tablet.clone(), ti)
            })
            .collect();
        let w = lock(&shared.claims).answer_hello(
            &h,
            conn_id,
            &remote.to_string(),
            &shared.opts.applier_id,
            |t| match ready.get(t) {
                Some(Ok(ti)) => Ok(ti.received_pos()),
                Some(Err(e)) => Err(e.clone()),
                None => Err(format!("tablet {t} was not announced")),
            },
        );
        for reason in w.tablets.iter().filter_map(|wt| wt.refused.as_ref()) {
            tracing::warn!(conn = conn_id, "{reason}");
        }
        csend.write_all(&wire::encode_welcome(&w)).await?;
    }
}

async fn accept_tablet_streams(
    shared: Arc<Shared>,
    conn: &quinn::Connection,
    conn_id: u64,
) -> Result<()> {
    loop {
        let (send, recv) = conn.accept_bi().await?;
        let shared = shared.clone();
        tokio::spawn(
            async move {
                if let Err(e) = serve_tablet_stream(shared, send, recv, conn_id).await {
                    tracing::info!(conn = conn_id, "tablet stream ended: {e:#}");
                }
            }
            .in_current_span(),
        );
    }
}

async fn serve_tablet_stream(
    shared: Arc<Shared>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    conn_id: u64,
) -> Result<()> {
    let first = read_msg(&mut recv).await?;
    let open = match first.map(|(m, _)| IntakeStream::open(m)) {
        Some(Ok(open)) => open,
        Some(Err(refusal)) => {
            let _ = send.write_all(&refusal.encode()).await;
            anyhow::bail!("protocol: a tablet stream must start with Open");
        }
        None => {
            let _ = send
                .write_all(&wire::encode_error("protocol", "expected Open"))
                .await;
            anyhow::bail!("protocol: a tablet stream must start with Open");
        }
    };
    let tablet = open.tablet.clone();
    let ti = lock(&shared.tablets).get(&tablet).cloned();
    let Some(ti) = ti.filter(|ti| shared.owned_by(ti, conn_id)) else {
        let msg = format!("tablet {tablet} is not claimed by this connection (send Hello first)");
        let _ = send.write_all(&wire::encode_error("claimed", &msg)).await;
        anyhow::bail!("{msg}");
    };
    let stream_id = shared.stream_ids.fetch_add(1, Ordering::Relaxed);
    // A failed tablet stays failed (its writer thread is gone), and one whose disk is full
    // takes no stream until space returns: refuse the stream.
    let revived = ti
        .state
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
            (s != TabletState::Failed as u8 && s != TabletState::DiskFull as u8)
                .then_some(TabletState::Streaming as u8)
        });
    if let Err(was) = revived {
        let error = lock(&ti.last_error).clone().unwrap_or_default();
        let (code, reason) = if was == TabletState::DiskFull as u8 {
            (
                "disk_full",
                format!(
                    "the target's disk is full, intake of tablet {tablet} waits for space: {error}"
                ),
            )
        } else {
            (
                "io",
                format!("the received log of tablet {tablet} failed, intake stopped: {error}"),
            )
        };
        let _ = send.write_all(&wire::encode_error(code, &reason)).await;
        let _ = send.finish();
        let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
        anyhow::bail!("{reason}");
    }
    // The first Ack is the resume position: the received log's durable end.
    let mut durable = ti.durable.clone();
    let start = durable.borrow_and_update().clone();
    let (resume, check, gate) = IntakeStream::accept(stream_id, tablet.clone(), &start);
    send.write_all(&resume).await?;
    tracing::debug!(tablet = %tablet, conn = conn_id, from = %start.pos, "tablet stream open");
    let (etx, erx) = tokio::sync::mpsc::channel::<(&'static str, String)>(1);
    let r = async {
        tokio::select! {
            r = send_acks(&tablet, send, durable, gate, erx) => r,
            r = receive_frames(&shared, &ti, recv, check, stream_id, conn_id, etx) => r,
        }
    }
    .instrument(tracing::info_span!("stream", tablet = %tablet))
    .await;
    // Unless a newer connection (the shipper reconnected) has the tablet streaming by now.
    if ti.state() == TabletState::Streaming && shared.owned_by(&ti, conn_id) {
        ti.state
            .store(TabletState::Disconnected as u8, Ordering::SeqCst);
    }
    r
}

/// Sends one Ack per published durable end (batched by the watch channel), or the Error
/// that ends the stream; what to send is the stream's [`AckGate`]'s.
///
/// [`AckGate`]: tidelog_proto::intake::AckGate
async fn send_acks(
    tablet: &TabletId,
    mut send: quinn::SendStream,
    mut durable: watch::Receiver<Durable>,
    mut gate: tidelog_proto::intake::AckGate,
    mut errors: tokio::sync::mpsc::Receiver<(&'static str, String)>,
) -> Result<()> {
    loop {
        tokio::select! {
            changed = durable.changed() => {
                if changed.is_err() {
                    anyhow::bail!("intake of tablet {tablet} stopped");
                }
            }
            e = errors.recv() => {
                if let Some((code, reason)) = e {
                    let _ = send.write_all(&wire::encode_error(code, &reason)).await;
                    let _ = send.finish();
                    // Let the error reach the shipper before the stream is dropped.
                    let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
                    anyhow::bail!("{code}: {reason}");
                }
                // The receiving side ended cleanly.
                return Ok(());
            }
        }
        let d = durable.borrow_and_update().clone();
        match gate.durable(&d) {
            Some(AckOut::Ack(ack)) => send.write_all(&ack).await?,
            Some(AckOut::End(refusal)) => {
                let _ = send.write_all(&refusal.encode()).await;
                let _ = send.finish();
                anyhow::bail!("{}: {}", refusal.code, refusal.reason);
            }
            None => {}
        }
    }
}

/// Reads frames and queues them for the tablet's writer thread; a bad frame is reported
/// through `errors` and ends the stream (nothing of it is written).
async fn receive_frames(
    shared: &Arc<Shared>,
    ti: &Arc<TabletIntake>,
    mut recv: quinn::RecvStream,
    mut check: tidelog_proto::intake::FrameCheck,
    stream_id: u64,
    conn_id: u64,
    errors: tokio::sync::mpsc::Sender<(&'static str, String)>,
) -> Result<()> {
    let tablet = &ti.tablet;
    loop {
        while ti.paused.load(Ordering::Relaxed) {
            // Paused: stop reading; QUIC flow control holds the shipper back.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let msg = match read_msg(&mut recv).await {
            Ok(Some(m)) => m,
            Ok(None) => {
                // Keep acking what is queued until the shipper goes away.
                std::future::pending::<()>().await;
                return Ok(());
            }
            Err(e) => {
                // The stream or connection ended under us (a shipper stopping, a network
                // failure): not the frame's fault, and nobody to tell. A stream that ends
                // inside a message is a bad frame, below.
                let ended = e.downcast_ref::<quinn::ReadError>().is_some()
                    || matches!(
                        e.downcast_ref::<quinn::ReadExactError>(),
                        Some(quinn::ReadExactError::ReadError(_))
                    );
                if ended {
                    return Err(e.context(format!("tablet {tablet}: stream ended")));
                }
                if let Some(w) = e.downcast_ref::<wire::WireError>() {
                    ti.count_frame_error(matches!(
                        w,
                        wire::WireError::HeaderChecksum | wire::WireError::BodyChecksum { .. }
                    ));
                }
                let reason = format!("corrupt frame on tablet {tablet}: {e:#}");
                tracing::warn!(
                    conn = conn_id,
                    "{reason}; stream closed, nothing of it written"
                );
                ti.set_error(reason.clone());
                let _ = errors.send(("corrupt_frame", reason.clone())).await;
                std::future::pending::<()>().await;
                return Ok(());
            }
        };
        if !shared.owned_by(ti, conn_id) {
            let _ = errors
                .send((
                    "claimed",
                    format!("tablet {tablet} was taken over by another connection"),
                ))
                .await;
            std::future::pending::<()>().await;
        }
        let (msg, payload) = msg;
        let received = match check.receive(msg) {
            Ok(r) => r,
            Err(refusal) => {
                if refusal.code == "bad_position" {
                    ti.count_frame_error(false);
                }
                ti.set_error(refusal.reason.clone());
                let _ = errors.send((refusal.code, refusal.reason)).await;
                std::future::pending::<()>().await;
                return Ok(());
            }
        };
        match received {
            Received::Frame(f) => {
                let mut refused = None;
                let mut payload = payload;
                if let Some((within, reason)) =
                    beyond_clock(&f, &payload, shared.opts.max_clock_skew)
                {
                    // The records before the first one beyond the bound are written (and
                    // acked); from it on nothing is: the shipper resends from the durable end
                    // on a new stream, and it is taken once it is within the bound.
                    ti.set_clock_skew(Some(reason.clone()));
                    refused = Some(reason);
                    payload = payload.slice(..within);
                } else {
                    ti.set_clock_skew(None);
                }
                ti.last_frame_ms.store(now_ms(), Ordering::Relaxed);
                if payload.is_empty() {
                    if let Some(reason) = refused {
                        let _ = errors.send(("clock_skew", reason)).await;
                        std::future::pending::<()>().await;
                    }
                    continue;
                }
                ti.shipping_again();
                let req = WriteReq {
                    stream: stream_id,
                    first: f.first_pos,
                    payload,
                };
                // Bounded queue: back-pressure onto the QUIC stream.
                let queued = match ti.queue.try_push(req) {
                    Ok(()) => true,
                    Err(PushError::Full(req)) => {
                        let q = ti.queue.clone();
                        matches!(
                            tokio::task::spawn_blocking(move || q.push(req)).await,
                            Ok(Ok(()))
                        )
                    }
                    Err(PushError::Closed(_)) => false,
                };
                if !queued {
                    anyhow::bail!("intake of tablet {tablet} stopped");
                }
                if let Some(reason) = refused {
                    let _ = errors.send(("clock_skew", reason)).await;
                    std::future::pending::<()>().await;
                }
            }
            Received::KeepAlive(_) => {
                ti.last_frame_ms.store(now_ms(), Ordering::Relaxed);
                ti.shipping_again();
            }
            Received::ShipperError(e) => {
                if e.code == "needs_bootstrap" {
                    ti.state
                        .store(TabletState::NeedsBootstrap as u8, Ordering::SeqCst);
                }
                ti.set_error(format!("{}: {}", e.code, e.message));
                tracing::warn!(tablet = %tablet, code = %e.code, "shipper reports: {}", e.message);
            }
            // Only the first message of a stream is an Open.
            Received::Open(_) => {}
        }
    }
}
