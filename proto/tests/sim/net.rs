//! The in-memory network: connections of ordered, reliable byte streams over a lossy link,
//! as QUIC gives them to the protocol.
//!
//! Stream bytes travel in packets of at most [`MTU`] bytes, each with its stream offset.
//! The link delays each packet (latency plus jitter, more for a reordered one), duplicates
//! some, loses some (a lost packet is sent again after a retransmission timeout while its
//! connection lives, as QUIC's loss recovery does), and drops everything during a
//! partition. The receiving end puts the bytes back in order by offset and hands each byte
//! to its stream once. Each open end pings every `ping_every` and closes a connection that
//! has heard nothing for `silence` (the daemons' silence limit); a packet for a connection
//! the server no longer knows is answered with a close (QUIC's stateless reset).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::Rng;

use crate::{Ev, Queue};

pub const MTU: usize = 1200;

pub type ConnId = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    Client,
    Server,
}

impl Side {
    fn other(self) -> Side {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}

#[derive(Clone, Debug)]
pub enum Body {
    Data {
        stream: u64,
        offset: u64,
        bytes: Vec<u8>,
    },
    /// The sender gave the stream up (QUIC RESET_STREAM / STOP_SENDING).
    Reset {
        stream: u64,
    },
    Ping,
    Close,
}

#[derive(Clone, Debug)]
pub struct Packet {
    pub conn: ConnId,
    pub from: Side,
    pub body: Body,
    /// Times it was sent again (each retransmission timeout doubles, as QUIC's does).
    pub resent: u32,
    /// A duplicate made by the link: its loss is nobody's to repair.
    pub copy: bool,
}

impl Packet {
    fn new(conn: ConnId, from: Side, body: Body) -> Packet {
        Packet {
            conn,
            from,
            body,
            resent: 0,
            copy: false,
        }
    }
}

/// What reaches a node.
#[derive(Debug)]
pub enum Delivery {
    Bytes {
        conn: ConnId,
        to: Side,
        stream: u64,
        bytes: Vec<u8>,
    },
    Reset {
        conn: ConnId,
        to: Side,
        stream: u64,
    },
    /// The server saw a new connection.
    Accepted {
        conn: ConnId,
    },
    /// This end of the connection is closed (by the peer, or by its silence).
    Closed {
        conn: ConnId,
        side: Side,
    },
}

/// The faults of the link.
#[derive(Clone, Debug)]
pub struct Link {
    pub latency: Duration,
    pub jitter: Duration,
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
    pub partitions: Vec<(Instant, Instant)>,
    /// No loss, duplication or reordering from then on.
    pub faults_until: Instant,
}

impl Link {
    fn partitioned(&self, t: Instant) -> bool {
        self.partitions.iter().any(|(a, b)| *a <= t && t < *b)
    }

    fn rto(&self) -> Duration {
        ((self.latency + self.jitter) * 3).max(Duration::from_millis(5))
    }
}

#[derive(Default)]
struct Reassembly {
    next: u64,
    pending: BTreeMap<u64, Vec<u8>>,
}

impl Reassembly {
    /// Takes a chunk at `offset`; returns the bytes now contiguous, each once.
    fn take(&mut self, offset: u64, bytes: Vec<u8>) -> Vec<u8> {
        let end = offset + bytes.len() as u64;
        if end <= self.next {
            return Vec::new();
        }
        self.pending.entry(offset).or_insert(bytes);
        let mut out = Vec::new();
        while let Some((&off, _)) = self.pending.first_key_value() {
            if off > self.next {
                break;
            }
            let Some((off, b)) = self.pending.pop_first() else {
                break;
            };
            let skip = (self.next - off) as usize;
            if skip < b.len() {
                out.extend_from_slice(&b[skip..]);
                self.next = off + b.len() as u64;
            }
        }
        out
    }
}

struct End {
    open: bool,
    last_heard: Instant,
    last_sent: Instant,
    send_off: BTreeMap<u64, u64>,
    recv: BTreeMap<u64, Reassembly>,
    /// Streams reset, by either side: nothing more of them is sent or taken.
    reset: BTreeSet<u64>,
}

impl End {
    fn new(now: Instant) -> End {
        End {
            open: true,
            last_heard: now,
            last_sent: now,
            send_off: BTreeMap::new(),
            recv: BTreeMap::new(),
            reset: BTreeSet::new(),
        }
    }
}

pub(crate) struct Net {
    pub link: Link,
    /// The link's own draws (seeded from the run's).
    rng: StdRng,
    pub ping_every: Duration,
    pub silence: Duration,
    ends: BTreeMap<(ConnId, Side), End>,
    next_conn: ConnId,
}

impl Net {
    pub fn new(link: Link, ping_every: Duration, silence: Duration, rng: StdRng) -> Net {
        Net {
            link,
            rng,
            ping_every,
            silence,
            ends: BTreeMap::new(),
            next_conn: 1,
        }
    }

    /// A client opens a connection (the server learns of it from its first packet).
    pub fn connect(&mut self, now: Instant) -> ConnId {
        let c = self.next_conn;
        self.next_conn += 1;
        self.ends.insert((c, Side::Client), End::new(now));
        c
    }

    pub fn is_open(&self, conn: ConnId, side: Side) -> bool {
        self.ends.get(&(conn, side)).is_some_and(|e| e.open)
    }

    /// Sends stream bytes from `from`'s end.
    pub fn send(
        &mut self,
        q: &mut Queue,
        now: Instant,
        conn: ConnId,
        from: Side,
        stream: u64,
        bytes: &[u8],
    ) {
        let Some(end) = self.ends.get_mut(&(conn, from)).filter(|e| e.open) else {
            return;
        };
        if end.reset.contains(&stream) {
            return;
        }
        let off = end.send_off.entry(stream).or_insert(0);
        let mut packets = Vec::new();
        for chunk in bytes.chunks(MTU) {
            packets.push(Body::Data {
                stream,
                offset: *off,
                bytes: chunk.to_vec(),
            });
            *off += chunk.len() as u64;
        }
        for body in packets {
            self.transmit(q, now, Packet::new(conn, from, body));
        }
    }

    /// `from` gives a stream up.
    pub fn reset(&mut self, q: &mut Queue, now: Instant, conn: ConnId, from: Side, stream: u64) {
        let Some(end) = self.ends.get_mut(&(conn, from)).filter(|e| e.open) else {
            return;
        };
        if end.reset.insert(stream) {
            end.recv.remove(&stream);
            let body = Body::Reset { stream };
            self.transmit(q, now, Packet::new(conn, from, body));
        }
    }

    /// Closes `side`'s end; tells the peer when `notify` (a process killed does not).
    pub fn close(&mut self, q: &mut Queue, now: Instant, conn: ConnId, side: Side, notify: bool) {
        if !self.is_open(conn, side) {
            return;
        }
        if notify {
            let body = Body::Close;
            self.transmit(q, now, Packet::new(conn, side, body));
        }
        if let Some(e) = self.ends.get_mut(&(conn, side)) {
            e.open = false;
            e.recv.clear();
        }
    }

    /// The server process restarts: it forgets every connection, silently.
    pub fn server_restart(&mut self) {
        for ((_, side), e) in self.ends.iter_mut() {
            if *side == Side::Server {
                e.open = false;
                e.recv.clear();
            }
        }
    }

    fn transmit(&mut self, q: &mut Queue, now: Instant, p: Packet) {
        if let Some(e) = self.ends.get_mut(&(p.conn, p.from)) {
            e.last_sent = now;
        }
        let faults = now < self.link.faults_until;
        let rng = &mut self.rng;
        let delay = |rng: &mut StdRng, link: &Link| {
            let mut d = link.latency + link.jitter.mul_f64(rng.random::<f64>());
            if faults && rng.random_bool(link.reorder) {
                d += link.latency.mul_f64(4.0 * rng.random::<f64>()) + Duration::from_millis(1);
            }
            d
        };
        if faults && rng.random_bool(self.link.dup) {
            let d = delay(rng, &self.link);
            let copy = Packet {
                copy: true,
                ..p.clone()
            };
            q.push(now + d, Ev::Arrive(copy));
        }
        let d = delay(rng, &self.link);
        q.push(now + d, Ev::Arrive(p));
    }

    /// A lost packet is sent again while its sender's end lives and its stream is not reset.
    pub fn retransmit(&mut self, q: &mut Queue, now: Instant, p: Packet) {
        let Some(end) = self.ends.get(&(p.conn, p.from)).filter(|e| e.open) else {
            return;
        };
        if let Body::Data { stream, .. } = &p.body {
            if end.reset.contains(stream) {
                return;
            }
        }
        self.transmit(q, now, p);
    }

    /// A packet reaches the far end (or is lost on the way).
    pub fn arrive(
        &mut self,
        q: &mut Queue,
        now: Instant,
        p: Packet,
        server_up: bool,
    ) -> Vec<Delivery> {
        let mut out = Vec::new();
        let faults = now < self.link.faults_until;
        let lost = self.link.partitioned(now)
            || (faults && self.rng.random_bool(self.link.loss))
            || (p.from == Side::Client && !server_up);
        if lost {
            if !p.copy && matches!(p.body, Body::Data { .. } | Body::Reset { .. }) {
                let after = self.link.rto() * (1 << p.resent.min(6));
                let again = Packet {
                    resent: p.resent + 1,
                    ..p
                };
                q.push(now + after, Ev::Retransmit(again));
            }
            return out;
        }
        let to = p.from.other();
        let key = (p.conn, to);
        if let Entry::Vacant(v) = self.ends.entry(key) {
            if to != Side::Server {
                return out;
            }
            v.insert(End::new(now));
            out.push(Delivery::Accepted { conn: p.conn });
        }
        let Some(end) = self.ends.get_mut(&key) else {
            return out;
        };
        if !end.open {
            // A connection this server forgot: a stateless reset tells the client.
            if to == Side::Server && !matches!(p.body, Body::Close) {
                let body = Body::Close;
                let reply = Packet::new(p.conn, Side::Server, body);
                let d = self.link.latency;
                q.push(now + d, Ev::Arrive(reply));
            }
            return out;
        }
        end.last_heard = now;
        match p.body {
            Body::Ping => {}
            Body::Close => {
                end.open = false;
                end.recv.clear();
                out.push(Delivery::Closed {
                    conn: p.conn,
                    side: to,
                });
            }
            Body::Reset { stream } => {
                if end.reset.insert(stream) {
                    end.recv.remove(&stream);
                    out.push(Delivery::Reset {
                        conn: p.conn,
                        to,
                        stream,
                    });
                }
            }
            Body::Data {
                stream,
                offset,
                bytes,
            } => {
                if end.reset.contains(&stream) {
                    return out;
                }
                let bytes = end.recv.entry(stream).or_default().take(offset, bytes);
                if !bytes.is_empty() {
                    out.push(Delivery::Bytes {
                        conn: p.conn,
                        to,
                        stream,
                        bytes,
                    });
                }
            }
        }
        out
    }

    /// Pings from ends that sent nothing for a while; ends that heard nothing for the
    /// silence limit close.
    pub fn tick(&mut self, q: &mut Queue, now: Instant) -> Vec<Delivery> {
        let mut out = Vec::new();
        let mut pings = Vec::new();
        for (&(conn, side), e) in self.ends.iter_mut() {
            if !e.open {
                continue;
            }
            if now.saturating_duration_since(e.last_heard) >= self.silence {
                e.open = false;
                e.recv.clear();
                out.push(Delivery::Closed { conn, side });
            } else if now.saturating_duration_since(e.last_sent) >= self.ping_every {
                pings.push(Packet::new(conn, side, Body::Ping));
            }
        }
        for p in pings {
            self.transmit(q, now, p);
        }
        out
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.ends
            .values()
            .filter(|e| e.open)
            .map(|e| (e.last_heard + self.silence).min(e.last_sent + self.ping_every))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reassembly_hands_out_each_byte_once_in_order() {
        let mut r = Reassembly::default();
        assert!(r.take(3, b"def".to_vec()).is_empty());
        assert_eq!(r.take(0, b"abc".to_vec()), b"abcdef");
        assert!(r.take(0, b"abc".to_vec()).is_empty(), "a duplicate");
        assert_eq!(r.take(4, b"efgh".to_vec()), b"gh", "an overlap");
    }
}
