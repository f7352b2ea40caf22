//! The sim's intake: what the applier's intake does with the protocol machines — answer
//! each Hello through the claims, run an [`IntakeStream`] per tablet stream, queue the
//! frames for the received log's writer, and hand each durable end to the streams of its
//! tablet, which ack it. A restart keeps only the durable part of each received log.
//!
//! It checks as it goes: an Ack never names a position beyond the durable end (and the
//! durable end never falls below an Ack, restarts included); the received log is always
//! the source's bytes; a Hello for a tablet is refused exactly when another shipper's live
//! connection owns it; no tablet stream is accepted on a connection before its Hello.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::Rng;
use tidelog_proto::decode::Decoder;
use tidelog_proto::intake::{Claims, IntakeStream, Received, Refusal};
use tidelog_proto::wire::{self, Message};
use tidelog_wal::{TabletId, WalPos};

use crate::net::{ConnId, Side};
use crate::store::{RecvLog, WriteReq};
use crate::{Env, Ev};

struct IConn {
    shipper: Option<String>,
    control: Decoder,
    streams: BTreeMap<u64, IntakeStream>,
}

pub struct Intake {
    pub up: bool,
    claims: Claims,
    conns: BTreeMap<ConnId, IConn>,
    pub logs: BTreeMap<TabletId, RecvLog>,
    next_stream: u64,
    /// The highest position acknowledged per tablet, ever.
    pub max_acked: BTreeMap<TabletId, WalPos>,
    /// Bumped by each restart: a sync begun before it never completes.
    pub epoch: u64,
    pub max_sync: Duration,
}

impl Intake {
    pub fn new(max_sync: Duration) -> Intake {
        Intake {
            up: true,
            claims: Claims::new(),
            conns: BTreeMap::new(),
            logs: BTreeMap::new(),
            next_stream: 1,
            max_acked: BTreeMap::new(),
            epoch: 0,
            max_sync,
        }
    }

    pub fn durable(&self, t: &TabletId) -> u64 {
        self.logs.get(t).map_or(0, |l| l.durable as u64)
    }

    pub fn on_accepted(&mut self, conn: ConnId) {
        self.conns.insert(
            conn,
            IConn {
                shipper: None,
                control: Decoder::new(),
                streams: BTreeMap::new(),
            },
        );
    }

    pub fn on_closed(&mut self, env: &mut Env, conn: ConnId) {
        if self.conns.remove(&conn).is_some() {
            let freed = self.claims.release(conn);
            env.trace(|| format!("intake: conn {conn} ended, frees {freed:?}"));
        }
    }

    pub fn on_reset(&mut self, conn: ConnId, stream: u64) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.streams.remove(&stream);
        }
    }

    pub fn on_bytes(&mut self, env: &mut Env, conn: ConnId, stream: u64, bytes: &[u8]) {
        if stream == 0 {
            return self.on_control(env, conn, bytes);
        }
        let mut input = bytes.to_vec();
        loop {
            let Some(c) = self.conns.get_mut(&conn) else {
                return;
            };
            let next = &mut self.next_stream;
            let s = c.streams.entry(stream).or_insert_with(|| {
                *next += 1;
                IntakeStream::new(*next)
            });
            let received = s.handle(&input);
            input.clear();
            let mut opened = false;
            for (r, payload) in received {
                match r {
                    Received::Open(o) => opened = self.open(env, conn, stream, o.tablet),
                    Received::Frame(f) => {
                        let owned = self.claims.owned_by(&f.tablet, conn);
                        let Some(s) = self.stream_mut(conn, stream) else {
                            return;
                        };
                        if !owned {
                            let why =
                                format!("tablet {} was taken over by another connection", f.tablet);
                            s.end(Refusal::new("claimed", why));
                            break;
                        }
                        let id = s.id();
                        if let Some(log) = self.logs.get_mut(&f.tablet) {
                            log.queue.push_back(WriteReq {
                                stream: id,
                                first: f.first_pos,
                                payload,
                            });
                        }
                    }
                    Received::KeepAlive(_) | Received::ShipperError(_) => {}
                }
            }
            self.flush(env, conn, stream);
            if !opened {
                return;
            }
        }
    }

    fn stream_mut(&mut self, conn: ConnId, stream: u64) -> Option<&mut IntakeStream> {
        self.conns.get_mut(&conn)?.streams.get_mut(&stream)
    }

    /// Answers an Open: accepted (the resume Ack) when this connection owns the tablet.
    fn open(&mut self, env: &mut Env, conn: ConnId, stream: u64, tablet: TabletId) -> bool {
        let hello_answered = self.conns.get(&conn).is_some_and(|c| c.shipper.is_some());
        if !self.claims.owned_by(&tablet, conn) {
            let why =
                format!("tablet {tablet} is not claimed by this connection (send Hello first)");
            env.trace(|| format!("intake: conn {conn}: {why}"));
            if let Some(s) = self.stream_mut(conn, stream) {
                s.end(Refusal::new("claimed", why));
            }
            return false;
        }
        if !hello_answered {
            env.fail(format!(
                "{tablet}: a stream opened on conn {conn} before any Hello was accepted"
            ));
        }
        let d = self
            .logs
            .get(&tablet)
            .map(RecvLog::published)
            .unwrap_or_default();
        let Some(s) = self.stream_mut(conn, stream) else {
            return false;
        };
        env.trace(|| format!("intake: {tablet} stream {} resumes at {}", s.id(), d.pos));
        s.accept_open(tablet, &d);
        true
    }

    fn on_control(&mut self, env: &mut Env, conn: ConnId, bytes: &[u8]) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.control.feed(bytes);
        loop {
            let Some(c) = self.conns.get_mut(&conn) else {
                return;
            };
            let hello = match c.control.next_message() {
                Ok(None) => return,
                Ok(Some((Message::Hello(h), _))) => h,
                Ok(Some(_)) | Err(_) => {
                    env.send(
                        conn,
                        Side::Server,
                        0,
                        &wire::encode_error("protocol", "expected Hello"),
                    );
                    env.close(conn, Side::Server, true);
                    return self.on_closed(env, conn);
                }
            };
            c.shipper = Some(hello.shipper_id.clone());
            for t in hello
                .tablets
                .iter()
                .map(|t| &t.tablet)
                .chain(&hello.all_tablets)
            {
                self.logs
                    .entry(t.clone())
                    .or_insert_with(|| RecvLog::new(t.clone()));
            }
            // Who owns each tablet now, and whether that connection lives.
            let owners: Vec<_> = hello
                .tablets
                .iter()
                .map(|t| self.claims.owner(&t.tablet).cloned())
                .collect();
            let logs = &self.logs;
            let welcome =
                self.claims
                    .answer_hello(&hello, conn, &format!("conn-{conn}"), "sim", |t| {
                        Ok(logs
                            .get(t)
                            .map_or(WalPos::ZERO, |l| WalPos(l.durable as u64)))
                    });
            for (wt, owner) in welcome.tablets.iter().zip(owners) {
                let other_live = owner.filter(|o| {
                    o.shipper_id != hello.shipper_id && self.conns.contains_key(&o.conn)
                });
                if other_live.is_some() != wt.refused.is_some() {
                    env.fail(format!(
                        "{}: Hello of {:?} answered {wt:?} while owned by {other_live:?}",
                        wt.tablet, hello.shipper_id
                    ));
                }
            }
            env.trace(|| {
                format!(
                    "intake: Welcome to {} on conn {conn}: {:?}",
                    hello.shipper_id, welcome.tablets
                )
            });
            env.send(conn, Side::Server, 0, &wire::encode_welcome(&welcome));
        }
    }

    /// Sends what a stream has queued, checking each Ack against the durable end.
    fn flush(&mut self, env: &mut Env, conn: ConnId, stream: u64) {
        let Some(s) = self
            .conns
            .get_mut(&conn)
            .and_then(|c| c.streams.get_mut(&stream))
        else {
            return;
        };
        let tablet = s.tablet().cloned();
        while let Some(b) = s.poll_transmit() {
            if let (Ok((Message::Ack { durable, .. }, _)), Some(t)) = (wire::decode(&b), &tablet) {
                let end = self.logs.get(t).map_or(0, |l| l.durable as u64);
                if durable.0 > end {
                    env.fail(format!("{t}: acked {durable} beyond the durable end {end}"));
                }
                let m = self.max_acked.entry(t.clone()).or_default();
                *m = (*m).max(durable);
            }
            env.send(conn, Side::Server, stream, &b);
        }
    }

    /// Starts a group of queued frames toward the received log (one sync at a time).
    pub fn pump(&mut self, env: &mut Env) {
        for (t, log) in self.logs.iter_mut() {
            if !log.syncing && !log.queue.is_empty() {
                log.stage_group();
                let after = self.max_sync.mul_f64(env.rng.random::<f64>());
                env.q.push(env.now + after, Ev::Sync(t.clone(), self.epoch));
            }
        }
    }

    /// A sync completed: the staged bytes are durable, and every stream of the tablet hears.
    pub fn on_sync(&mut self, env: &mut Env, t: &TabletId, epoch: u64) {
        if epoch != self.epoch || !self.up {
            return;
        }
        let Some(log) = self.logs.get_mut(t) else {
            return;
        };
        log.synced();
        let src = &env.sources[t];
        if src.bytes.get(..log.durable) != Some(&log.staged[..log.durable]) {
            env.fail(format!("{t}: the received log is not the source's bytes"));
        }
        let d = log.published();
        env.trace(|| format!("intake: {t} durable to {}", d.pos));
        let mut touched = Vec::new();
        for (conn, c) in self.conns.iter_mut() {
            for (sid, s) in c.streams.iter_mut() {
                if s.tablet() == Some(t) {
                    s.durable(&d);
                    touched.push((*conn, *sid));
                }
            }
        }
        for (conn, sid) in touched {
            self.flush(env, conn, sid);
        }
    }

    pub fn restart(&mut self, env: &mut Env) {
        env.net.server_restart();
        self.conns.clear();
        self.claims = Claims::new();
        self.epoch += 1;
        self.up = false;
        for (t, log) in self.logs.iter_mut() {
            log.restart();
            let acked = self.max_acked.get(t).copied().unwrap_or_default();
            if (log.durable as u64) < acked.0 {
                env.fail(format!(
                    "{t}: after a restart the received log ends at {}, below the acknowledged {acked}",
                    log.durable
                ));
            }
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        None
    }
}
