//! The sim's shipper: what a lane of the real shipper does with the protocol machines —
//! connect with backoff, announce its tablets, open a stream per accepted tablet, ship
//! whole records within the window, write acked positions to the source's `acked` file,
//! and reopen a failed stream after its own backoff. A restart makes a new one: it keeps
//! nothing.
//!
//! The rogue is a second shipper (another `shipper_id`) that now and then connects and
//! asks for a tablet, and opens its stream before the answer: the claim rules are tested
//! against it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::Rng;
use tidelog_proto::backoff::Backoff;
use tidelog_proto::ship::{ControlEvent, ShipControl, ShipStream, StreamConfig, StreamEvent};
use tidelog_wal::{TabletId, WalPos};

use crate::net::{ConnId, Side};
use crate::Env;

/// How the sim's shippers are set up.
#[derive(Clone, Debug)]
pub struct ShipCfg {
    pub stream: StreamConfig,
    pub max_frame: usize,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    pub silence: Duration,
}

struct Conn {
    id: ConnId,
    control: ShipControl,
    started: Instant,
    next_stream: u64,
    streams: BTreeMap<u64, TabletId>,
}

struct Slot {
    ship: ShipStream,
    stream: Option<u64>,
    started: Instant,
    accepted: bool,
    reopen_at: Option<Instant>,
    backoff: Backoff,
}

pub struct Shipper {
    pub id: String,
    cfg: ShipCfg,
    tablets: Vec<TabletId>,
    conn: Option<Conn>,
    lane: Backoff,
    next_connect: Instant,
    slots: BTreeMap<TabletId, Slot>,
}

impl Shipper {
    pub fn new(id: &str, cfg: ShipCfg, tablets: Vec<TabletId>, now: Instant) -> Shipper {
        let slots = tablets
            .iter()
            .map(|t| {
                let slot = Slot {
                    ship: ShipStream::new(t.clone(), cfg.stream),
                    stream: None,
                    started: now,
                    accepted: false,
                    reopen_at: None,
                    backoff: Backoff::new(
                        cfg.reconnect_min,
                        cfg.reconnect_max,
                        Duration::from_secs(10),
                    ),
                };
                (t.clone(), slot)
            })
            .collect();
        Shipper {
            id: id.to_string(),
            lane: Backoff::new(cfg.reconnect_min, cfg.reconnect_max, cfg.reconnect_max * 2),
            cfg,
            tablets,
            conn: None,
            next_connect: now,
            slots,
        }
    }

    pub fn owns(&self, conn: ConnId) -> bool {
        self.conn.as_ref().is_some_and(|c| c.id == conn)
    }

    pub fn conn(&self) -> Option<ConnId> {
        self.conn.as_ref().map(|c| c.id)
    }

    pub fn acked(&self, t: &TabletId) -> WalPos {
        self.slots.get(t).map_or(WalPos::ZERO, |s| s.ship.acked())
    }

    pub fn step(&mut self, env: &mut Env) {
        let now = env.now;
        let Some(conn) = &mut self.conn else {
            if now >= self.next_connect {
                let id = env.net.connect(now);
                env.trace(|| format!("{}: connecting (conn {id})", self.id));
                let control = ShipControl::new(&self.id, 0, self.tablets.clone(), self.cfg.silence);
                self.conn = Some(Conn {
                    id,
                    control,
                    started: now,
                    next_stream: 1,
                    streams: BTreeMap::new(),
                });
                self.step(env);
            }
            return;
        };
        if let Err(e) = conn.control.handle_timeout(now) {
            return self.conn_failed(env, &e.to_string());
        }
        let sources = &env.sources;
        let positions = |t: &TabletId| {
            sources.get(t).map_or((WalPos::ZERO, WalPos::ZERO), |s| {
                (WalPos(s.oldest), WalPos(s.end()))
            })
        };
        if let Some(hello) = conn
            .control
            .poll_transmit(now, positions, self.tablets.clone())
        {
            env.trace(|| format!("{}: Hello on conn {}", self.id, conn.id));
            env.send(conn.id, Side::Client, 0, &hello);
        }
        while let Some(ev) = conn.control.poll_event() {
            match ev {
                ControlEvent::Accepted { tablet, resume } => {
                    env.trace(|| format!("{}: {tablet} accepted, resume {resume}", self.id));
                    if let Some(s) = self.slots.get_mut(&tablet) {
                        s.accepted = true;
                        s.reopen_at = Some(now);
                    }
                }
                ControlEvent::Refused { tablet, reason } => {
                    env.trace(|| format!("{}: {tablet} refused: {reason}", self.id));
                    if let Some(s) = self.slots.get_mut(&tablet) {
                        s.accepted = false;
                    }
                }
            }
        }
        for (t, slot) in self.slots.iter_mut() {
            if slot.stream.is_none() && slot.accepted && slot.reopen_at.is_some_and(|r| r <= now) {
                let sid = conn.next_stream;
                conn.next_stream += 1;
                conn.streams.insert(sid, t.clone());
                slot.stream = Some(sid);
                slot.started = now;
                slot.reopen_at = None;
                let open = slot.ship.open();
                env.trace(|| {
                    format!(
                        "{}: {t} stream {sid} Open from {}",
                        self.id,
                        slot.ship.acked()
                    )
                });
                env.send(conn.id, Side::Client, sid, &open);
            }
            let Some(sid) = slot.stream else {
                continue;
            };
            while let Some(ev) = slot.ship.poll_event() {
                match ev {
                    StreamEvent::Resume { from, .. } => {
                        env.trace(|| format!("{}: {t} resumes at {from}", self.id));
                        let src = &env.sources[t];
                        if from.0 < src.oldest || from.0 > src.end() {
                            env.fail(format!(
                                "{t}: the applier resumes at {from}, but the source holds {}..{}: acknowledged data was lost",
                                src.oldest,
                                src.end()
                            ));
                        }
                    }
                    StreamEvent::Acked { acked, .. } => {
                        // The `acked` file: retention may delete below it from now on.
                        if let Some(src) = env.sources.get_mut(t) {
                            src.acked = src.acked.max(acked.0);
                        }
                    }
                }
            }
            while slot.ship.can_send() {
                let read = env.sources[t].read(slot.ship.shipped().0, self.cfg.max_frame);
                match read {
                    Ok(Some((payload, count, last_ht))) => {
                        let head = slot.ship.send_frame(&payload, count, last_ht, now);
                        let mut frame = head.to_vec();
                        frame.extend_from_slice(&payload);
                        env.send(conn.id, Side::Client, sid, &frame);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        env.fail(e);
                        break;
                    }
                }
            }
            if slot.ship.keepalive_due(now) {
                let k = slot.ship.keepalive(now);
                env.send(conn.id, Side::Client, sid, &k);
            }
        }
    }

    pub fn on_bytes(&mut self, env: &mut Env, stream: u64, bytes: &[u8]) {
        let now = env.now;
        let Some(conn) = &mut self.conn else {
            return;
        };
        if stream == 0 {
            if let Err(e) = conn.control.handle(bytes, now) {
                return self.conn_failed(env, &e.to_string());
            }
            return;
        }
        let Some(t) = conn.streams.get(&stream) else {
            return;
        };
        let Some(slot) = self.slots.get_mut(t).filter(|s| s.stream == Some(stream)) else {
            return;
        };
        if let Err(e) = slot.ship.handle(bytes, now) {
            env.trace(|| format!("{}: {t} stream {stream}: {e}; reopening", self.id));
            env.reset(conn.id, Side::Client, stream);
            slot.stream = None;
            let jitter = env.rng.random_range(0.5..=1.0);
            slot.reopen_at = Some(now + slot.backoff.failed(slot.started, now, jitter));
        }
    }

    pub fn on_closed(&mut self, env: &mut Env, conn: ConnId) {
        if self.owns(conn) {
            self.conn_failed(env, "connection lost");
        }
    }

    fn conn_failed(&mut self, env: &mut Env, why: &str) {
        let now = env.now;
        let Some(conn) = self.conn.take() else {
            return;
        };
        env.trace(|| format!("{}: conn {} failed: {why}", self.id, conn.id));
        env.close(conn.id, Side::Client, true);
        for s in self.slots.values_mut() {
            s.stream = None;
            s.accepted = false;
        }
        let jitter = env.rng.random_range(0.5..=1.0);
        self.next_connect = now + self.lane.failed(conn.started, now, jitter);
    }

    /// Killed: the connection is dropped without a word.
    pub fn kill(&mut self, env: &mut Env) {
        if let Some(c) = self.conn.take() {
            env.close(c.id, Side::Client, false);
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let Some(conn) = &self.conn else {
            return Some(self.next_connect);
        };
        let slots = self.slots.values().filter_map(|s| {
            let reopen = s.reopen_at.filter(|_| s.accepted && s.stream.is_none());
            match (reopen, s.ship.poll_timeout().filter(|_| s.stream.is_some())) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        });
        conn.control.poll_timeout().into_iter().chain(slots).min()
    }
}

/// A second shipper that now and then asks for a tablet the first one ships.
pub struct Rogue {
    pub id: String,
    tablet: TabletId,
    pub attempts: Vec<Instant>,
    conn: Option<(ConnId, ShipControl, ShipStream)>,
    silence: Duration,
}

impl Rogue {
    pub fn new(tablet: TabletId, attempts: Vec<Instant>, cfg: &ShipCfg) -> Rogue {
        Rogue {
            id: "rogue".into(),
            tablet,
            attempts,
            conn: None,
            silence: cfg.silence,
        }
    }

    pub fn owns(&self, conn: ConnId) -> bool {
        self.conn.as_ref().is_some_and(|c| c.0 == conn)
    }

    pub fn step(&mut self, env: &mut Env) {
        let now = env.now;
        if self.conn.is_none() && self.attempts.first().is_some_and(|a| *a <= now) {
            self.attempts.remove(0);
            let id = env.net.connect(now);
            env.trace(|| format!("rogue: asks for {} (conn {id})", self.tablet));
            let mut control =
                ShipControl::new(&self.id, 0, vec![self.tablet.clone()], self.silence);
            let hello = control.poll_transmit(now, |_| (WalPos::ZERO, WalPos::ZERO), vec![]);
            env.send(id, Side::Client, 0, &hello.unwrap_or_default());
            // The tablet stream, before the answer: refused unless the claim was granted.
            let cfg = StreamConfig {
                window_bytes: 1 << 20,
                keepalive_interval: Duration::from_secs(1),
            };
            let mut stream = ShipStream::new(self.tablet.clone(), cfg);
            env.send(id, Side::Client, 1, &stream.open());
            self.conn = Some((id, control, stream));
        }
    }

    pub fn on_bytes(&mut self, env: &mut Env, stream: u64, bytes: &[u8]) {
        let now = env.now;
        let Some((id, control, ship)) = &mut self.conn else {
            return;
        };
        let id = *id;
        if stream == 1 {
            let r = ship.handle(bytes, now);
            env.trace(|| format!("rogue: its stream: {r:?}"));
            return;
        }
        let r = control.handle(bytes, now);
        let mut done = r.is_err();
        while let Some(ev) = control.poll_event() {
            env.trace(|| format!("rogue: {ev:?}"));
            done = true;
        }
        if done {
            env.close(id, Side::Client, true);
            self.conn = None;
        }
    }

    pub fn on_closed(&mut self, conn: ConnId) {
        if self.owns(conn) {
            self.conn = None;
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.attempts
            .first()
            .copied()
            .filter(|_| self.conn.is_none())
    }
}
