//! A lane: one thread with its runtime, QUIC endpoint and connection to the applier. The
//! connection's control stream (Hello, Welcome, refused tablets asked for again) is the
//! [`ShipControl`] machine's; reconnects wait out the [`Backoff`]; each accepted tablet
//! gets a task ([`crate::stream`]).

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::Rng;
use tidelog_proto::backoff::Backoff;
use tidelog_proto::ship::{ControlEvent, ShipControl};
use tidelog_wal::{TabletId, WalPos};
use tokio::sync::mpsc;

use crate::io::IoEngine;
use crate::stream::{tablet_task, write_acked};
use crate::{read_bytes, refusal_state, tablet_state, LaneCmd, Shared, ShipState, ShipperOptions};

pub(crate) fn run_lane(shared: Arc<Shared>, lane: u32, rx: mpsc::UnboundedReceiver<LaneCmd>) {
    let fut = lane_main(shared.clone(), lane, rx);
    match shared.engine {
        IoEngine::Uring => match tokio_uring::Runtime::new(&tokio_uring::builder()) {
            Ok(rt) => rt.block_on(fut),
            Err(e) => tracing::error!(lane, "lane runtime: {e}"),
        },
        IoEngine::Std => {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(lane, "lane runtime: {e}");
                    return;
                }
            };
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, fut);
        }
    }
}

/// A QUIC client endpoint bound to `bind`, its UDP socket's receive buffer sized to `rcvbuf`
/// bytes (`quic.udp-receive-buffer`, [`tidelog_net::bind_udp`]). Must run inside a tokio runtime.
pub fn client_endpoint(bind: SocketAddr, rcvbuf: u64) -> Result<quinn::Endpoint> {
    let (socket, _) =
        tidelog_net::bind_udp(bind, rcvbuf).with_context(|| format!("binding udp {bind}"))?;
    let runtime = quinn::default_runtime().context("no async runtime for the QUIC endpoint")?;
    Ok(quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        None,
        socket,
        runtime,
    )?)
}

async fn lane_main(shared: Arc<Shared>, lane: u32, mut rx: mpsc::UnboundedReceiver<LaneCmd>) {
    let bind: SocketAddr = if shared.opts.applier.is_ipv6() {
        "[::]:0".parse().unwrap_or(SocketAddr::from(([0u8; 16], 0)))
    } else {
        SocketAddr::from(([0, 0, 0, 0], 0))
    };
    let endpoint = match client_endpoint(bind, shared.opts.quic.udp_receive_buffer) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(lane, "binding a UDP socket: {e:#}");
            return;
        }
    };
    // The lane's heartbeat, beaten from this thread: it stops if anything blocks the thread.
    let beat = {
        let sh = shared.clone();
        tokio::task::spawn_local(async move {
            loop {
                if let Some(b) = sh.lane_beats.get(lane as usize) {
                    b.beat();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let _beat = AbortOnDrop(beat);
    let mut tablets: Vec<TabletId> = Vec::new();
    let mut backoff = Backoff::new(
        shared.opts.reconnect_min,
        shared.opts.reconnect_max,
        shared.opts.reconnect_max * 2,
    );
    loop {
        // Take in tablets assigned while disconnected.
        while let Ok(cmd) = rx.try_recv() {
            match cmd {
                LaneCmd::Add(t) => tablets.push(t),
                LaneCmd::Shutdown => return close(endpoint).await,
            }
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            return close(endpoint).await;
        }
        if tablets.is_empty() {
            // Nothing to connect for: this lane is as started as it gets.
            shared.lane_settled(lane);
            match rx.recv().await {
                Some(LaneCmd::Add(t)) => tablets.push(t),
                _ => return close(endpoint).await,
            }
            continue;
        }
        let started = Instant::now();
        match connection(&shared, lane, &endpoint, &mut tablets, &mut rx).await {
            Ok(()) => return close(endpoint).await,
            Err(e) => {
                shared.lane_settled(lane);
                shared.reconnects.fetch_add(1, Ordering::Relaxed);
                // With TLS 1.3 the applier checks this shipper's certificate after the
                // handshake looked done here: its refusal ends a "connection" that never was.
                let text = format!("{e:#}");
                let e = match tidelog_net::tls::CertRefusal::of(&text) {
                    Some(_) if e.downcast_ref::<NotConnected>().is_none() => {
                        anyhow::Error::new(NotConnected::new(&shared.opts, &text))
                    }
                    _ => e,
                };
                if e.downcast_ref::<NotConnected>().is_some() {
                    tracing::warn!(lane, "{e:#}");
                } else {
                    tracing::warn!(
                        lane,
                        "connection to the applier at {} lost: {e:#}",
                        shared.opts.applier
                    );
                }
                for t in &tablets {
                    if let Some(s) = tablet_state(&shared, t) {
                        if ShipState::from_u8(s.state.load(Ordering::Relaxed))
                            != ShipState::NeedsBootstrap
                        {
                            s.set_state(ShipState::Connecting);
                        }
                        s.set_error(Some(format!("{e:#}")));
                    }
                }
            }
        }
        // Capped exponential backoff with jitter in [backoff/2, backoff].
        let wait = backoff.failed(started, Instant::now(), rand::rng().random_range(0.5..=1.0));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            cmd = rx.recv() => match cmd {
                Some(LaneCmd::Add(t)) => tablets.push(t),
                _ => return close(endpoint).await,
            }
        }
    }
}

async fn close(endpoint: quinn::Endpoint) {
    endpoint.close(quinn::VarInt::from_u32(0), b"shipper shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(3), endpoint.wait_idle()).await;
}

/// A tablet's oldest and durable position, as a Hello announces them.
fn hello_positions(shared: &Shared, t: &TabletId) -> (WalPos, WalPos) {
    // The tablet's control file, mapped once (status reads it too).
    let dir = shared.opts.wal_dir.join(t.as_str());
    tablet_state(shared, t)
        .and_then(|st| st.control(&dir).map(|c| (c.oldest(), c.durable())))
        .unwrap_or((WalPos::ZERO, WalPos::ZERO))
}

/// One connection's life: handshake, tablet tasks, new tablets; `Ok` on shutdown.
/// A connection attempt that ended before the connection existed (so it was not "lost"),
/// with what a refused certificate means for the operator.
#[derive(Debug)]
struct NotConnected(String);

impl NotConnected {
    fn new(opts: &ShipperOptions, why: &str) -> NotConnected {
        let meaning = tidelog_net::tls::refusal::server_refused(
            why,
            opts.ca_file.as_deref(),
            &opts.server_name,
        );
        NotConnected(format!(
            "cannot connect to the applier at {}: {meaning}",
            opts.applier
        ))
    }
}

impl std::fmt::Display for NotConnected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotConnected {}

async fn connection(
    shared: &Arc<Shared>,
    lane: u32,
    endpoint: &quinn::Endpoint,
    tablets: &mut Vec<TabletId>,
    rx: &mut mpsc::UnboundedReceiver<LaneCmd>,
) -> Result<()> {
    // Tests hold one lane back (`FAILPOINTS=shipper::lane_<n>_connect=return`).
    fail::fail_point!(&format!("shipper::lane_{lane}_connect"), |_| Err(
        anyhow::anyhow!("failpoint: lane {lane} does not connect")
    ));
    let cc = tidelog_net::tls::client_config(&shared.tls, &shared.opts.quic)?;
    let connecting = endpoint.connect_with(cc, shared.opts.applier, &shared.opts.server_name)?;
    tokio::pin!(connecting);
    // An unreachable applier would hold the handshake until the idle timeout: give up
    // after the silence limit (the lane retries with backoff), and keep taking commands
    // meanwhile, so a shutdown does not wait for it.
    let limit = shared.opts.quic.silence_limit;
    let give_up = tokio::time::sleep(limit);
    tokio::pin!(give_up);
    let conn = loop {
        tokio::select! {
            c = &mut connecting => {
                break c.map_err(|e| NotConnected::new(&shared.opts, &e.to_string()))?;
            }
            () = &mut give_up => {
                return Err(NotConnected::new(&shared.opts, &format!("no answer within {limit:?}")).into());
            }
            cmd = rx.recv() => match cmd {
                Some(LaneCmd::Add(t)) => tablets.push(t),
                _ => return Ok(()),
            },
        }
    };
    let (mut csend, mut crecv) = conn.open_bi().await?;
    let conn = Rc::new(conn);
    // Control bytes arrive through a channel: reading a QUIC stream is not cancel-safe,
    // the select below is.
    let (ctx, mut crx) = mpsc::unbounded_channel::<Result<Option<bytes::Bytes>>>();
    let reader = tokio::task::spawn_local(async move {
        loop {
            let m = read_bytes(&mut crecv).await;
            let end = !matches!(m, Ok(Some(_)));
            if ctx.send(m).is_err() || end {
                return;
            }
        }
    });
    let _reader = AbortOnDrop(reader);
    // Hello, Welcome, and the refused tablets asked for again 5 s later.
    let mut control = ShipControl::new(&shared.opts.shipper_id, lane, tablets.clone(), limit);
    shared.connected_lanes.fetch_add(1, Ordering::Relaxed);
    let _connected = scopeguard(shared.clone());
    shared.lane_settled(lane);
    let mut heard = tidelog_net::Silence::new(conn.stats().udp_rx.datagrams);
    // One timer for the periodic look at the connection's silence.
    let mut look = tokio::time::interval(tidelog_net::Silence::look_every(limit));
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let now = Instant::now();
        control.handle_timeout(now)?;
        let all = || {
            shared
                .tablets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .cloned()
                .collect()
        };
        if let Some(hello) = control.poll_transmit(now, |t| hello_positions(shared, t), all()) {
            csend.write_all(&hello).await?;
        }
        while let Some(ev) = control.poll_event() {
            match ev {
                ControlEvent::Accepted { tablet, .. } => {
                    let Some(st) = tablet_state(shared, &tablet) else {
                        continue;
                    };
                    // Where to resume comes again as the first Ack of the tablet stream.
                    // A refusal (or a target error) of before is over.
                    st.set_error(None);
                    if matches!(
                        ShipState::from_u8(st.state.load(Ordering::Relaxed)),
                        ShipState::Refused | ShipState::TargetError
                    ) {
                        st.set_state(ShipState::Connecting);
                    }
                    tokio::task::spawn_local(tablet_task(shared.clone(), conn.clone(), tablet, st));
                }
                ControlEvent::Refused { tablet, reason } => {
                    let Some(st) = tablet_state(shared, &tablet) else {
                        continue;
                    };
                    let state = refusal_state(&reason);
                    tracing::error!(tablet = %tablet, state = state.name(),
                        "applier refused the tablet: {reason}; asking again in 5 s");
                    st.set_state(state);
                    st.set_error(Some(format!("applier: {reason}")));
                }
            }
        }
        let due = control.poll_timeout();
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(LaneCmd::Add(t)) => {
                    tablets.push(t.clone());
                    control.announce(t);
                }
                _ => {
                    // Record what the applier has acknowledged before going away.
                    for t in tablets.iter() {
                        if let Some(st) = tablet_state(shared, t) {
                            if st.acked.load(Ordering::Relaxed) > 0 {
                                write_acked(&st, shared.opts.wal_dir.join(t.as_str())).await;
                            }
                        }
                    }
                    conn.close(quinn::VarInt::from_u32(0), b"shipper shutting down");
                    return Ok(());
                }
            },
            e = conn.closed() => {
                anyhow::bail!("{e}");
            }
            () = sleep_until(due) => {}
            _ = look.tick() => {
                if let Some(quiet) = heard.exceeded(conn.stats().udp_rx.datagrams, limit) {
                    conn.close(quinn::VarInt::from_u32(1), b"no packet from the applier");
                    anyhow::bail!(
                        "no packet from the applier for {:.1} s (limit {limit:?}); reconnecting",
                        quiet.as_secs_f64()
                    );
                }
            }
            m = crx.recv() => {
                match m.unwrap_or(Ok(None))? {
                    Some(bytes) => control.handle(&bytes, Instant::now())?,
                    None => control.handle_end(Instant::now())?,
                }
            }
        }
    }
}

/// Sleeps until `at`; forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Connected(Arc<Shared>);
impl Drop for Connected {
    fn drop(&mut self) {
        self.0.connected_lanes.fetch_sub(1, Ordering::Relaxed);
    }
}
fn scopeguard(s: Arc<Shared>) -> Connected {
    Connected(s)
}
