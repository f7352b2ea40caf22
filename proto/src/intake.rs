//! The applier intake's side of the protocol: who owns which tablet ([`Claims`]), the
//! answer to a Hello ([`Claims::answer_hello`]), and one tablet stream ([`IntakeStream`]:
//! the Open, the resume Ack, the checks of each frame, and acks of what is durable only).
//!
//! ```text
//!   Hello ──► Claims::answer_hello(tablets ready: resume | reason) ──► Welcome
//!
//!   stream bytes/messages ──► IntakeStream::receive ──► Open → accept(durable) → resume Ack
//!                                   │                   Frame{first..end} → queue for the log
//!                                   │                   KeepAlive, ShipperError
//!                                   └─ Refusal{code, reason} → Error, the stream ends
//!   durable end of the received log ──► IntakeStream::durable ──► Ack | Error
//! ```
//!
//! A frame is acknowledged only once the received log reports it durable: nothing
//! acknowledged is ever lost. The resume position is the received log's durable end:
//! nothing is received twice.

use std::collections::{BTreeMap, VecDeque};

use tidelog_wal::{HybridTime, TabletId, WalPos};

use crate::decode::Decoder;
use crate::wire::{self, DataFrame, ErrorMsg, Hello, Message, Open, Welcome, WelcomeTablet};

/// The live connection a tablet is claimed by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub shipper_id: String,
    pub conn: u64,
    /// The shipper's address, as shown in a refusal.
    pub remote: String,
}

/// Which live connection ships each tablet: one shipper owns a tablet; the same shipper
/// reconnecting takes over from its old (maybe half-dead) connection.
#[derive(Debug, Default)]
pub struct Claims {
    owners: BTreeMap<TabletId, Owner>,
}

impl Claims {
    pub fn new() -> Claims {
        Claims::default()
    }

    /// Claims `tablet` for connection `conn` of `shipper_id`; the refusal names the live
    /// owner.
    pub fn claim(
        &mut self,
        tablet: &TabletId,
        shipper_id: &str,
        conn: u64,
        remote: &str,
    ) -> Result<(), String> {
        if let Some(cur) = self.owners.get(tablet) {
            if cur.conn != conn && cur.shipper_id != shipper_id {
                return Err(format!(
                    "tablet {tablet} is already shipped by live shipper {:?} from {}; refused for shipper {shipper_id:?}",
                    cur.shipper_id, cur.remote
                ));
            }
        }
        self.owners.insert(
            tablet.clone(),
            Owner {
                shipper_id: shipper_id.to_string(),
                conn,
                remote: remote.to_string(),
            },
        );
        Ok(())
    }

    pub fn owned_by(&self, tablet: &TabletId, conn: u64) -> bool {
        self.owners.get(tablet).is_some_and(|o| o.conn == conn)
    }

    pub fn owner(&self, tablet: &TabletId) -> Option<&Owner> {
        self.owners.get(tablet)
    }

    /// Connection `conn` ended: the tablets it owned are free; returns them.
    pub fn release(&mut self, conn: u64) -> Vec<TabletId> {
        let gone: Vec<TabletId> = self
            .owners
            .iter()
            .filter(|(_, o)| o.conn == conn)
            .map(|(t, _)| t.clone())
            .collect();
        for t in &gone {
            self.owners.remove(t);
        }
        gone
    }

    /// The Welcome for `hello` on connection `conn`: each announced tablet, in order, is
    /// refused with the reason `ready` gives for it (the target refuses all after a
    /// cutover, or its received log could not be opened), refused when another live
    /// shipper owns it, or claimed and given its resume position (`ready`'s: the received
    /// log's durable end).
    pub fn answer_hello(
        &mut self,
        hello: &Hello,
        conn: u64,
        remote: &str,
        applier_id: &str,
        mut ready: impl FnMut(&TabletId) -> Result<WalPos, String>,
    ) -> Welcome {
        let tablets = hello
            .tablets
            .iter()
            .map(|ht| {
                let claimed = ready(&ht.tablet).and_then(|resume| {
                    self.claim(&ht.tablet, &hello.shipper_id, conn, remote)
                        .map(|()| resume)
                });
                match claimed {
                    Ok(resume) => WelcomeTablet {
                        tablet: ht.tablet.clone(),
                        resume: Some(resume),
                        refused: None,
                    },
                    Err(reason) => WelcomeTablet {
                        tablet: ht.tablet.clone(),
                        resume: None,
                        refused: Some(reason),
                    },
                }
            })
            .collect();
        Welcome {
            applier_id: applier_id.to_string(),
            tablets,
        }
    }
}

/// A refusal that ends a tablet stream: the Error sent to the shipper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: &'static str,
    pub reason: String,
}

impl Refusal {
    pub fn new(code: &'static str, reason: impl Into<String>) -> Refusal {
        Refusal {
            code,
            reason: reason.into(),
        }
    }

    /// The Error message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        wire::encode_error(self.code, &self.reason)
    }
}

/// What a tablet stream received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Received {
    /// The stream's first message: the caller checks that the connection owns the tablet
    /// and that the tablet takes a stream, then [`IntakeStream::accept`]s or refuses it.
    Open(Open),
    /// A data frame that continues the stream: queue its payload for the received log.
    Frame(DataFrame),
    KeepAlive(DataFrame),
    /// The shipper reports a problem with its side (`needs_bootstrap`).
    ShipperError(ErrorMsg),
}

/// What the received log made durable, as its writer publishes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Durable {
    pub pos: WalPos,
    pub safe_time: HybridTime,
    /// The last refused frame: (stream id, code, reason); stream 0 is every stream of the
    /// tablet (its received log failed).
    pub error: Option<(u64, &'static str, String)>,
}

/// The frame checks of one tablet stream's receiving side.
#[derive(Clone, Debug)]
pub struct FrameCheck {
    tablet: TabletId,
    /// Where the next frame must start.
    expect: WalPos,
}

impl FrameCheck {
    /// A message after the Open.
    pub fn receive(&mut self, msg: Message) -> Result<Received, Refusal> {
        let tablet = &self.tablet;
        match msg {
            Message::Data(f) => {
                if &f.tablet != tablet || f.first_pos != self.expect {
                    return Err(Refusal::new(
                        "bad_position",
                        format!(
                            "frame for tablet {} at {} on the stream of tablet {tablet} expecting {}",
                            f.tablet, f.first_pos, self.expect
                        ),
                    ));
                }
                self.expect = f.end_pos;
                Ok(Received::Frame(f))
            }
            Message::KeepAlive(f) => Ok(Received::KeepAlive(f)),
            Message::Error(e) => Ok(Received::ShipperError(e)),
            other => Err(Refusal::new(
                "protocol",
                format!("unexpected message on the stream of tablet {tablet}: {other:?}"),
            )),
        }
    }

    pub fn tablet(&self) -> &TabletId {
        &self.tablet
    }
}

/// The ack side of one tablet stream: acks only what the received log reports durable,
/// each position once, and ends the stream with the writer's refusal of one of its frames.
#[derive(Clone, Debug)]
pub struct AckGate {
    stream: u64,
    /// The last position acknowledged on this stream.
    acked: WalPos,
}

/// What the ack side sends after a durable publication.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckOut {
    /// An Ack of this durable end.
    Ack(Vec<u8>),
    /// The Error that ends the stream.
    End(Refusal),
}

impl AckGate {
    /// The received log published `d`.
    pub fn durable(&mut self, d: &Durable) -> Option<AckOut> {
        if let Some((sid, code, reason)) = &d.error {
            if *sid == self.stream || *sid == 0 {
                return Some(AckOut::End(Refusal::new(code, reason.clone())));
            }
        }
        (d.pos > self.acked).then(|| {
            self.acked = d.pos;
            AckOut::Ack(wire::encode_ack(d.pos, d.safe_time))
        })
    }

    pub fn acked(&self) -> WalPos {
        self.acked
    }
}

#[derive(Debug)]
enum StreamPhase {
    AwaitOpen,
    Open(FrameCheck, AckGate),
    Ended,
}

/// One tablet stream at the intake: both sides in one (a caller that runs them apart takes
/// them from [`IntakeStream::accept`]).
#[derive(Debug)]
pub struct IntakeStream {
    stream: u64,
    phase: StreamPhase,
    decoder: Decoder,
    transmit: VecDeque<Vec<u8>>,
}

impl IntakeStream {
    /// Stream `stream` (an id unique in the intake) was accepted.
    pub fn new(stream: u64) -> IntakeStream {
        IntakeStream {
            stream,
            phase: StreamPhase::AwaitOpen,
            decoder: Decoder::new(),
            transmit: VecDeque::new(),
        }
    }

    pub fn id(&self) -> u64 {
        self.stream
    }

    /// The first message of the stream must be an Open.
    pub fn open(msg: Message) -> Result<Open, Refusal> {
        match msg {
            Message::Open(o) => Ok(o),
            _ => Err(Refusal::new("protocol", "expected Open")),
        }
    }

    /// Accepts the Open of `tablet`: the resume Ack (the received log's durable end) to
    /// send first, and the two sides of the stream from there.
    pub fn accept(
        stream: u64,
        tablet: TabletId,
        durable: &Durable,
    ) -> (Vec<u8>, FrameCheck, AckGate) {
        (
            wire::encode_ack(durable.pos, durable.safe_time),
            FrameCheck {
                tablet,
                expect: durable.pos,
            },
            AckGate {
                stream,
                acked: durable.pos,
            },
        )
    }

    /// Bytes from the shipper: the messages received, in order, until a refusal (which
    /// ends the stream; its Error is queued for [`IntakeStream::poll_transmit`]) or an
    /// Open, which is last: what follows it is taken by the next call (with no new bytes,
    /// if need be) once the caller has answered it.
    pub fn handle(&mut self, bytes: &[u8]) -> Vec<(Received, Vec<u8>)> {
        let mut out = Vec::new();
        if matches!(self.phase, StreamPhase::Ended) {
            return out;
        }
        self.decoder.feed(bytes);
        loop {
            let (msg, payload) = match self.decoder.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => return out,
                Err(e) => {
                    let tablet = match &self.phase {
                        StreamPhase::Open(c, _) => c.tablet.to_string(),
                        _ => "?".into(),
                    };
                    self.end(Refusal::new(
                        "corrupt_frame",
                        format!("corrupt frame on tablet {tablet}: {e}"),
                    ));
                    return out;
                }
            };
            let r = match &mut self.phase {
                StreamPhase::AwaitOpen => IntakeStream::open(msg).map(Received::Open),
                StreamPhase::Open(check, _) => check.receive(msg),
                StreamPhase::Ended => return out,
            };
            match r {
                Ok(r @ Received::Open(_)) => {
                    // The rest waits for the caller's answer to the Open.
                    out.push((r, payload));
                    return out;
                }
                Ok(r) => out.push((r, payload)),
                Err(refusal) => {
                    self.end(refusal);
                    return out;
                }
            }
        }
    }

    /// After [`Received::Open`]: the caller found the connection owns the tablet and the
    /// tablet takes a stream; the resume Ack is queued.
    pub fn accept_open(&mut self, tablet: TabletId, durable: &Durable) {
        let (ack, check, gate) = IntakeStream::accept(self.stream, tablet, durable);
        self.transmit.push_back(ack);
        self.phase = StreamPhase::Open(check, gate);
    }

    /// Ends the stream with `refusal` (queued as an Error).
    pub fn end(&mut self, refusal: Refusal) {
        self.transmit.push_back(refusal.encode());
        self.phase = StreamPhase::Ended;
    }

    /// The received log published `d`: an Ack, or the writer's refusal, is queued.
    pub fn durable(&mut self, d: &Durable) {
        let StreamPhase::Open(_, gate) = &mut self.phase else {
            return;
        };
        match gate.durable(d) {
            Some(AckOut::Ack(b)) => self.transmit.push_back(b),
            Some(AckOut::End(r)) => self.end(r),
            None => {}
        }
    }

    pub fn is_ended(&self) -> bool {
        matches!(self.phase, StreamPhase::Ended)
    }

    /// The tablet of an accepted stream.
    pub fn tablet(&self) -> Option<&TabletId> {
        match &self.phase {
            StreamPhase::Open(c, _) => Some(&c.tablet),
            _ => None,
        }
    }

    /// Bytes to send to the shipper.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmit.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TabletId {
        s.parse().unwrap_or_else(|_| unreachable!())
    }

    fn hello(shipper: &str, tablets: &[&str]) -> Hello {
        Hello {
            shipper_id: shipper.into(),
            lane: 0,
            tablets: tablets
                .iter()
                .map(|n| wire::HelloTablet {
                    tablet: t(n),
                    oldest: WalPos(0),
                    durable: WalPos(0),
                })
                .collect(),
            all_tablets: vec![],
        }
    }

    /// One shipper owns a tablet: another live shipper is refused it, naming the owner;
    /// the same shipper on a new connection takes it over; once the owner's connection
    /// ends, anyone may claim it.
    #[test]
    fn a_second_shipper_is_refused_a_claimed_tablet() {
        let mut c = Claims::new();
        let ready = |_: &TabletId| Ok(WalPos(8));
        let w = c.answer_hello(&hello("a", &["t1", "t2"]), 1, "10.0.0.1:5", "ap", ready);
        assert!(w.tablets.iter().all(|wt| wt.resume == Some(WalPos(8))));
        let w = c.answer_hello(&hello("b", &["t1"]), 2, "10.0.0.2:5", "ap", ready);
        let why = w.tablets[0].refused.clone().unwrap_or_default();
        assert!(
            why.contains("already shipped by live shipper \"a\" from 10.0.0.1:5")
                && why.contains("refused for shipper \"b\""),
            "{why}"
        );
        assert!(c.owned_by(&t("t1"), 1) && !c.owned_by(&t("t1"), 2));
        // The same shipper reconnecting takes over.
        let w = c.answer_hello(&hello("a", &["t1"]), 3, "10.0.0.1:6", "ap", ready);
        assert_eq!(w.tablets[0].resume, Some(WalPos(8)));
        assert!(c.owned_by(&t("t1"), 3) && !c.owned_by(&t("t1"), 1));
        assert_eq!(c.release(1), vec![t("t2")]);
        assert_eq!(c.release(3), vec![t("t1")]);
        let w = c.answer_hello(&hello("b", &["t1"]), 2, "10.0.0.2:5", "ap", ready);
        assert_eq!(w.tablets[0].resume, Some(WalPos(8)));
        // A tablet that is not ready is refused with the reason given, and not claimed.
        let w = c.answer_hello(&hello("c", &["t9"]), 4, "x", "ap", |_| {
            Err("promoted".into())
        });
        assert_eq!(w.tablets[0].refused.as_deref(), Some("promoted"));
        assert!(c.owner(&t("t9")).is_none());
    }

    /// Frames must continue the stream; only durable positions are acked, each once; a
    /// writer's refusal of this stream's frame ends it.
    #[test]
    fn frames_continue_the_stream_and_only_durable_positions_are_acked() {
        let mut s = IntakeStream::new(7);
        let head = |first: u64, len: usize| {
            let mut b =
                wire::encode_data_head(&t("t1"), WalPos(first), HybridTime(1), 0, &vec![0; len])
                    .to_vec();
            b.extend(vec![0u8; len]);
            b
        };
        let got = s.handle(&wire::encode_open(&Open {
            tablet: t("t1"),
            from: WalPos(0),
        }));
        assert!(matches!(&got[..], [(Received::Open(o), _)] if o.tablet == t("t1")));
        let d = Durable {
            pos: WalPos(100),
            safe_time: HybridTime(5),
            error: None,
        };
        s.accept_open(t("t1"), &d);
        let (m, _) =
            wire::decode(&s.poll_transmit().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            m,
            Message::Ack {
                durable: WalPos(100),
                safe_time: HybridTime(5)
            }
        );
        let got = s.handle(&head(100, 10));
        assert!(
            matches!(&got[..], [(Received::Frame(f), p)] if f.end_pos == WalPos(110) && p.len() == 10)
        );
        assert_eq!(
            s.poll_transmit(),
            None,
            "nothing acked before it is durable"
        );
        s.durable(&Durable {
            pos: WalPos(110),
            ..d.clone()
        });
        assert!(s.poll_transmit().is_some());
        s.durable(&Durable {
            pos: WalPos(110),
            ..d.clone()
        });
        assert_eq!(s.poll_transmit(), None, "each position once");
        // Another stream's refusal is not this stream's.
        s.durable(&Durable {
            pos: WalPos(110),
            error: Some((8, "bad_position", "x".into())),
            ..d.clone()
        });
        assert_eq!(s.poll_transmit(), None);
        // A gap ends the stream.
        assert!(s.handle(&head(120, 10)).is_empty());
        let (m, _) =
            wire::decode(&s.poll_transmit().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(m, Message::Error(e) if e.code == "bad_position"));
        assert!(s.is_ended());
    }

    #[test]
    fn a_stream_must_open_and_damaged_bytes_end_it() {
        let mut s = IntakeStream::new(1);
        assert!(s
            .handle(&wire::encode_ack(WalPos(0), HybridTime(0)))
            .is_empty());
        let (m, _) =
            wire::decode(&s.poll_transmit().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(m, Message::Error(e) if e.code == "protocol" && e.message == "expected Open")
        );
        let mut s = IntakeStream::new(2);
        let mut b = wire::encode_open(&Open {
            tablet: t("t1"),
            from: WalPos(0),
        });
        let last = b.len() - 1;
        b[last] ^= 1;
        assert!(s.handle(&b).is_empty());
        let (m, _) =
            wire::decode(&s.poll_transmit().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(m, Message::Error(e) if e.code == "corrupt_frame"));
    }
}
