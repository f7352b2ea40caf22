//! The shipper's side of the protocol: the control stream of a connection ([`ShipControl`]:
//! Hello, Welcome, refused tablets asked for again) and the stream of one tablet
//! ([`ShipStream`]: Open, the resume Ack, the window of bytes not yet acknowledged, data
//! frames, keep-alives, acks).
//!
//! ```text
//!              bytes from the applier, now            what to ship, now
//!                        │                                   │
//!                        ▼                                   ▼
//!   ShipControl ── handle / handle_timeout        ShipStream ── open / can_send / send_frame
//!       │  poll_transmit → Hello bytes                 │  keepalive_due / keepalive → bytes
//!       └─ poll_event → Accepted{resume} | Refused     └─ handle(bytes) → poll_event:
//!                                                          Resume{from} | Acked{acked, records}
//! ```
//!
//! Neither does I/O or reads a clock: the caller feeds the bytes its streams deliver and
//! the time, sends the bytes returned, and reads the WAL where a stream says to.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tidelog_wal::{HybridTime, TabletId, WalPos};

use crate::decode::Decoder;
use crate::wire::{self, HelloTablet, Message, WireError, DATA_HEADER_LEN, MSG_HEADER_LEN};

/// How long after a refusal a refused tablet is announced again.
pub const REFUSED_RETRY: Duration = Duration::from_secs(5);

/// What the control stream learned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlEvent {
    /// Open the tablet's stream (the stream's first Ack says where to resume).
    Accepted { tablet: TabletId, resume: WalPos },
    /// Refused (claimed by another live shipper, a promoted target, the applier could not
    /// open its received log); announced again [`REFUSED_RETRY`] later.
    Refused { tablet: TabletId, reason: String },
}

/// The control stream failed: the connection is given up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("no Welcome from the applier within {0:?}")]
    NoWelcome(Duration),
    #[error("applier refused: {code}: {message}")]
    Refused { code: String, message: String },
    #[error("applier: {code}: {message}")]
    Applier { code: String, message: String },
    #[error("expected Welcome, got {0}")]
    NotWelcome(String),
    #[error("unexpected control message {0}")]
    Unexpected(String),
    #[error("the applier closed the control stream")]
    Closed,
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// The shipper's end of a connection's control stream.
#[derive(Debug)]
pub struct ShipControl {
    shipper_id: String,
    lane: u32,
    /// A Hello waits for its Welcome this long.
    answer_within: Duration,
    /// Tablets to announce in the next Hello.
    announce: Vec<TabletId>,
    /// Refused tablets and when they were refused.
    refused: Vec<(TabletId, Instant)>,
    /// A Hello was sent; its Welcome is due by then.
    awaiting: Option<Instant>,
    decoder: Decoder,
    events: VecDeque<ControlEvent>,
}

impl ShipControl {
    /// A connection's control stream, to announce `tablets`.
    pub fn new(
        shipper_id: &str,
        lane: u32,
        tablets: Vec<TabletId>,
        answer_within: Duration,
    ) -> ShipControl {
        ShipControl {
            shipper_id: shipper_id.to_string(),
            lane,
            answer_within,
            announce: tablets,
            refused: Vec::new(),
            awaiting: None,
            decoder: Decoder::new(),
            events: VecDeque::new(),
        }
    }

    /// A tablet found while connected: announced in the next Hello.
    pub fn announce(&mut self, tablet: TabletId) {
        self.announce.push(tablet);
    }

    /// The Hello to send now, if one is due: the tablets to announce, each with its oldest
    /// and durable position (`positions`), and every tablet the shipper knows (`all`).
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        positions: impl Fn(&TabletId) -> (WalPos, WalPos),
        all: Vec<TabletId>,
    ) -> Option<Vec<u8>> {
        if self.awaiting.is_some() || self.announce.is_empty() {
            return None;
        }
        let tablets = std::mem::take(&mut self.announce)
            .into_iter()
            .map(|tablet| {
                let (oldest, durable) = positions(&tablet);
                HelloTablet {
                    tablet,
                    oldest,
                    durable,
                }
            })
            .collect();
        self.awaiting = Some(now + self.answer_within);
        Some(wire::encode_hello(&wire::Hello {
            shipper_id: self.shipper_id.clone(),
            lane: self.lane,
            tablets,
            all_tablets: all,
        }))
    }

    /// Bytes of the control stream from the applier.
    pub fn handle(&mut self, bytes: &[u8], now: Instant) -> Result<(), ControlError> {
        self.decoder.feed(bytes);
        while let Some((m, _)) = self.decoder.next_message()? {
            self.handle_message(Some(m), now)?;
        }
        Ok(())
    }

    /// The control stream ended (from the applier's side).
    pub fn handle_end(&mut self, now: Instant) -> Result<(), ControlError> {
        self.handle_message(None, now)
    }

    fn handle_message(&mut self, m: Option<Message>, now: Instant) -> Result<(), ControlError> {
        if self.awaiting.take().is_some() {
            let welcome = match m {
                Some(Message::Welcome(w)) => w,
                Some(Message::Error(e)) => {
                    return Err(ControlError::Refused {
                        code: e.code,
                        message: e.message,
                    })
                }
                other => return Err(ControlError::NotWelcome(format!("{other:?}"))),
            };
            for wt in welcome.tablets {
                self.events.push_back(match (wt.resume, wt.refused) {
                    (Some(resume), _) => ControlEvent::Accepted {
                        tablet: wt.tablet,
                        resume,
                    },
                    (None, reason) => {
                        self.refused.push((wt.tablet.clone(), now));
                        ControlEvent::Refused {
                            tablet: wt.tablet,
                            reason: reason.unwrap_or_else(|| "refused".into()),
                        }
                    }
                });
            }
            return Ok(());
        }
        match m {
            Some(Message::Error(e)) => Err(ControlError::Applier {
                code: e.code,
                message: e.message,
            }),
            None => Err(ControlError::Closed),
            Some(other) => Err(ControlError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Time passed: refused tablets due are announced again; a Welcome overdue fails.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ControlError> {
        if self.awaiting.is_some_and(|due| now >= due) {
            return Err(ControlError::NoWelcome(self.answer_within));
        }
        let announce = &mut self.announce;
        self.refused.retain(|(t, at)| {
            if now >= *at + REFUSED_RETRY {
                announce.push(t.clone());
                false
            } else {
                true
            }
        });
        Ok(())
    }

    /// When [`ShipControl::handle_timeout`] has something to do next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let refused = self.refused.iter().map(|(_, at)| *at + REFUSED_RETRY).min();
        match (self.awaiting, refused) {
            (Some(a), Some(r)) => Some(a.min(r)),
            (a, r) => a.or(r),
        }
    }

    pub fn poll_event(&mut self) -> Option<ControlEvent> {
        self.events.pop_front()
    }
}

/// What a tablet stream learned from the applier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamEvent {
    /// The first Ack: ship from `from`, the received log's durable end (it may lie below
    /// what was acknowledged before, when the target was bootstrapped again).
    Resume { from: WalPos, safe_time: HybridTime },
    /// The applier has `acked` durably; `records` more records are acknowledged than
    /// before.
    Acked { acked: WalPos, records: u64 },
}

/// Why a tablet stream ended; the shipper opens a new one after its backoff.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The applier answered the Open with an Error.
    #[error("applier refused the stream: {code}: {message}")]
    Refused { code: String, message: String },
    /// The applier ended the stream with an Error.
    #[error("applier: {code}: {message}")]
    Applier { code: String, message: String },
    #[error("expected the resume Ack, got {0}")]
    NoResume(String),
    #[error("unexpected message {0}")]
    Unexpected(String),
    #[error("the applier closed the stream")]
    Closed,
    #[error(transparent)]
    Wire(#[from] WireError),
}

impl StreamError {
    /// The applier's error code, when the applier ended the stream with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            StreamError::Refused { code, .. } | StreamError::Applier { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// The window and keep-alive settings of a tablet stream.
#[derive(Clone, Copy, Debug)]
pub struct StreamConfig {
    /// Bytes shipped and not acknowledged, at most.
    pub window_bytes: u64,
    /// A stream that sent nothing for this long sends a keep-alive.
    pub keepalive_interval: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No stream.
    Closed,
    /// Open sent; waiting for the resume Ack.
    Opening,
    Streaming,
}

/// One tablet's shipping, across the streams opened for it: the position acknowledged
/// (where the next stream's Open starts), and on the current stream the position shipped,
/// the frames in flight and the window.
#[derive(Debug)]
pub struct ShipStream {
    tablet: TabletId,
    cfg: StreamConfig,
    phase: Phase,
    /// Durable at the applier (its last Ack).
    acked: WalPos,
    /// Next position to ship on the current stream.
    pos: WalPos,
    /// Tablet safe time at `pos`.
    safe: HybridTime,
    /// Frames shipped and not acknowledged: (end position, records).
    frames: VecDeque<(WalPos, u32)>,
    records_in_flight: u64,
    last_send: Option<Instant>,
    decoder: Decoder,
    events: VecDeque<StreamEvent>,
}

impl ShipStream {
    pub fn new(tablet: TabletId, cfg: StreamConfig) -> ShipStream {
        ShipStream {
            tablet,
            cfg,
            phase: Phase::Closed,
            acked: WalPos::ZERO,
            pos: WalPos::ZERO,
            safe: HybridTime::MIN,
            frames: VecDeque::new(),
            records_in_flight: 0,
            last_send: None,
            decoder: Decoder::new(),
            events: VecDeque::new(),
        }
    }

    /// A tablet whose position `acked` was acknowledged on an earlier connection of this
    /// process: its next Open names it (the applier's resume Ack decides all the same).
    pub fn with_acked(mut self, acked: WalPos) -> ShipStream {
        self.acked = acked;
        self
    }

    pub fn tablet(&self) -> &TabletId {
        &self.tablet
    }

    /// Acknowledged (durable at the applier).
    pub fn acked(&self) -> WalPos {
        self.acked
    }

    /// Shipped on the current stream (the next frame starts here).
    pub fn shipped(&self) -> WalPos {
        self.pos
    }

    /// The tablet safe time the stream has shipped up to.
    pub fn safe_time(&self) -> HybridTime {
        self.safe
    }

    /// Records shipped on the current stream and not acknowledged.
    pub fn records_in_flight(&self) -> u64 {
        self.records_in_flight
    }

    /// Whether the resume Ack came and the stream ships.
    pub fn is_streaming(&self) -> bool {
        self.phase == Phase::Streaming
    }

    /// Begins a new stream: the Open to send on it, from the acknowledged position.
    pub fn open(&mut self) -> Vec<u8> {
        self.phase = Phase::Opening;
        self.decoder = Decoder::new();
        self.frames.clear();
        wire::encode_open(&wire::Open {
            tablet: self.tablet.clone(),
            from: self.acked,
        })
    }

    /// Bytes of the stream from the applier.
    pub fn handle(&mut self, bytes: &[u8], now: Instant) -> Result<(), StreamError> {
        self.decoder.feed(bytes);
        loop {
            let next = self.decoder.next_message();
            match next {
                Ok(Some((m, _))) => self.handle_message(Some(m), now)?,
                Ok(None) => return Ok(()),
                Err(e) => return Err(self.fail(e.into())),
            }
        }
    }

    /// The applier ended its side of the stream.
    pub fn handle_end(&mut self, now: Instant) -> Result<(), StreamError> {
        self.handle_message(None, now)
    }

    fn handle_message(&mut self, m: Option<Message>, now: Instant) -> Result<(), StreamError> {
        match (self.phase, m) {
            (Phase::Opening, Some(Message::Ack { durable, safe_time })) => {
                // The applier is the source of truth for where to resume.
                self.acked = durable;
                self.pos = durable;
                self.safe = safe_time;
                self.records_in_flight = 0;
                self.last_send = Some(now);
                self.phase = Phase::Streaming;
                self.events.push_back(StreamEvent::Resume {
                    from: durable,
                    safe_time,
                });
                Ok(())
            }
            (Phase::Opening, Some(Message::Error(e))) => Err(self.fail(StreamError::Refused {
                code: e.code,
                message: e.message,
            })),
            (Phase::Opening, other) => Err(self.fail(StreamError::NoResume(format!("{other:?}")))),
            (Phase::Streaming, Some(Message::Ack { durable, .. })) => {
                self.acked = self.acked.max(durable);
                let mut n = 0u64;
                while self.frames.front().is_some_and(|(end, _)| *end <= durable) {
                    n += self.frames.pop_front().map_or(0, |(_, c)| u64::from(c));
                }
                self.records_in_flight = self.records_in_flight.saturating_sub(n);
                self.events.push_back(StreamEvent::Acked {
                    acked: self.acked,
                    records: n,
                });
                Ok(())
            }
            (_, Some(Message::Error(e))) => Err(self.fail(StreamError::Applier {
                code: e.code,
                message: e.message,
            })),
            (_, None) => Err(self.fail(StreamError::Closed)),
            (_, Some(other)) => Err(self.fail(StreamError::Unexpected(format!("{other:?}")))),
        }
    }

    /// The stream ended for `e` (the caller's own reasons too: the stream's I/O failed).
    pub fn fail(&mut self, e: StreamError) -> StreamError {
        self.phase = Phase::Closed;
        e
    }

    /// Whether another frame may be shipped: streaming, and less than the window is
    /// shipped and not acknowledged.
    pub fn can_send(&self) -> bool {
        self.phase == Phase::Streaming && self.pos.since(self.acked) < self.cfg.window_bytes
    }

    /// Bytes shipped and not acknowledged.
    pub fn in_flight(&self) -> u64 {
        self.pos.since(self.acked)
    }

    /// Ships `payload`, `count` whole records read at [`ShipStream::shipped`] whose last
    /// has ht `last_ht`: the header bytes to send in front of it.
    pub fn send_frame(
        &mut self,
        payload: &[u8],
        count: u32,
        last_ht: HybridTime,
        now: Instant,
    ) -> [u8; MSG_HEADER_LEN + DATA_HEADER_LEN] {
        let head = wire::encode_data_head(&self.tablet, self.pos, last_ht, count, payload);
        self.pos = self.pos.add(payload.len() as u64);
        self.safe = last_ht;
        self.frames.push_back((self.pos, count));
        self.records_in_flight += u64::from(count);
        self.last_send = Some(now);
        head
    }

    /// Whether a keep-alive is due: nothing sent for the keep-alive interval.
    pub fn keepalive_due(&self, now: Instant) -> bool {
        self.phase == Phase::Streaming
            && self
                .last_send
                .is_none_or(|t| now.saturating_duration_since(t) >= self.cfg.keepalive_interval)
    }

    /// A keep-alive at the shipped position and safe time.
    pub fn keepalive(&mut self, now: Instant) -> [u8; MSG_HEADER_LEN + DATA_HEADER_LEN] {
        self.last_send = Some(now);
        wire::encode_keepalive(&self.tablet, self.pos, self.safe)
    }

    /// When the next keep-alive falls due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        (self.phase == Phase::Streaming)
            .then(|| self.last_send.map(|t| t + self.cfg.keepalive_interval))
            .flatten()
    }

    /// The position the applier asks for was deleted at the source: the Error to send
    /// before the stream ends.
    pub fn needs_bootstrap(&mut self, reason: &str) -> Vec<u8> {
        self.phase = Phase::Closed;
        wire::encode_error("needs_bootstrap", reason)
    }

    pub fn poll_event(&mut self) -> Option<StreamEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TabletId {
        s.parse().unwrap_or_else(|_| unreachable!())
    }

    fn cfg() -> StreamConfig {
        StreamConfig {
            window_bytes: 100,
            keepalive_interval: Duration::from_millis(200),
        }
    }

    /// Resume from the first Ack, ship within the window, count acked records, and open the
    /// next stream from the acknowledged position.
    #[test]
    fn a_stream_resumes_ships_within_the_window_and_reopens_from_the_ack() {
        let now = Instant::now();
        let mut s = ShipStream::new(t("a"), cfg());
        let open = s.open();
        let (m, _) = wire::decode(&open).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            m,
            Message::Open(wire::Open {
                tablet: t("a"),
                from: WalPos(0)
            })
        );
        assert!(!s.can_send());
        s.handle(&wire::encode_ack(WalPos(40), HybridTime(7)), now)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            s.poll_event(),
            Some(StreamEvent::Resume {
                from: WalPos(40),
                safe_time: HybridTime(7)
            })
        );
        assert_eq!((s.acked(), s.shipped()), (WalPos(40), WalPos(40)));
        s.send_frame(&[0; 60], 3, HybridTime(9), now);
        assert!(s.can_send(), "60 of 100 in flight");
        s.send_frame(&[0; 40], 2, HybridTime(11), now);
        assert!(!s.can_send(), "the window is full");
        assert_eq!(s.records_in_flight(), 5);
        s.handle(&wire::encode_ack(WalPos(100), HybridTime(9)), now)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            s.poll_event(),
            Some(StreamEvent::Acked {
                acked: WalPos(100),
                records: 3
            })
        );
        assert!(s.can_send());
        // An older ack never moves the position back.
        s.handle(&wire::encode_ack(WalPos(50), HybridTime(9)), now)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.acked(), WalPos(100));
        // The applier ends the stream; the next one starts from what was acknowledged.
        let e = s
            .handle(&wire::encode_error("corrupt_frame", "x"), now)
            .unwrap_err();
        assert_eq!(e.code(), Some("corrupt_frame"));
        assert!(!s.can_send());
        let (m, _) = wire::decode(&s.open()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            m,
            Message::Open(wire::Open {
                tablet: t("a"),
                from: WalPos(100)
            })
        );
        // A resume below what was acknowledged (the target was bootstrapped again) is taken.
        s.handle(&wire::encode_ack(WalPos(0), HybridTime(0)), now)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((s.acked(), s.shipped()), (WalPos(0), WalPos(0)));
        assert_eq!(s.records_in_flight(), 0);
    }

    #[test]
    fn the_first_answer_must_be_the_resume_ack() {
        let now = Instant::now();
        let mut s = ShipStream::new(t("a"), cfg());
        s.open();
        let e = s
            .handle(&wire::encode_error("claimed", "not yours"), now)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "applier refused the stream: claimed: not yours"
        );
        s.open();
        let e = s.handle_end(now).unwrap_err();
        assert_eq!(e.to_string(), "expected the resume Ack, got None");
    }

    #[test]
    fn keepalives_fall_due_after_the_interval_without_a_frame() {
        let t0 = Instant::now();
        let mut s = ShipStream::new(t("a"), cfg());
        s.open();
        assert!(
            !s.keepalive_due(t0 + Duration::from_secs(9)),
            "not streaming"
        );
        s.handle(&wire::encode_ack(WalPos(0), HybridTime(3)), t0)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_millis(200)));
        assert!(!s.keepalive_due(t0 + Duration::from_millis(199)));
        assert!(s.keepalive_due(t0 + Duration::from_millis(200)));
        let k = s.keepalive(t0 + Duration::from_millis(200));
        let (m, _) = wire::decode(&k).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(m, Message::KeepAlive(f) if f.safe_time == HybridTime(3)));
        assert!(!s.keepalive_due(t0 + Duration::from_millis(300)));
    }

    /// Welcome answers each announced tablet; a refused one is announced again 5 s later;
    /// a Welcome that does not come in time fails the connection.
    #[test]
    fn control_announces_takes_the_welcome_and_asks_again_for_refused_tablets() {
        let t0 = Instant::now();
        let limit = Duration::from_secs(2);
        let mut c = ShipControl::new("s1", 0, vec![t("a"), t("b")], limit);
        let pos = |_: &TabletId| (WalPos(0), WalPos(10));
        let hello = c.poll_transmit(t0, pos, vec![t("a"), t("b")]);
        let (m, _) = wire::decode(&hello.unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
        let Message::Hello(h) = m else {
            panic!("{m:?}")
        };
        assert_eq!(h.tablets.len(), 2);
        assert_eq!(
            c.poll_transmit(t0, pos, vec![]),
            None,
            "one Hello at a time"
        );
        let welcome = wire::Welcome {
            applier_id: "x".into(),
            tablets: vec![
                wire::WelcomeTablet {
                    tablet: t("a"),
                    resume: Some(WalPos(4)),
                    refused: None,
                },
                wire::WelcomeTablet {
                    tablet: t("b"),
                    resume: None,
                    refused: Some("claimed".into()),
                },
            ],
        };
        c.handle(&wire::encode_welcome(&welcome), t0)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.poll_event(),
            Some(ControlEvent::Accepted {
                tablet: t("a"),
                resume: WalPos(4)
            })
        );
        assert!(matches!(c.poll_event(), Some(ControlEvent::Refused { .. })));
        assert_eq!(c.poll_timeout(), Some(t0 + REFUSED_RETRY));
        c.handle_timeout(t0 + REFUSED_RETRY)
            .unwrap_or_else(|e| panic!("{e}"));
        let again = c.poll_transmit(t0 + REFUSED_RETRY, pos, vec![]);
        let (m, _) = wire::decode(&again.unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(m, Message::Hello(h) if h.tablets.len() == 1 && h.tablets[0].tablet == t("b"))
        );
        let late = t0 + REFUSED_RETRY + limit;
        assert_eq!(c.handle_timeout(late), Err(ControlError::NoWelcome(limit)));
        // Anything but a Welcome after a Hello ends the connection; so does an end of the
        // control stream.
        let mut c = ShipControl::new("s1", 0, vec![t("a")], limit);
        c.poll_transmit(t0, pos, vec![]);
        let e = c
            .handle(&wire::encode_error("protocol", "no"), t0)
            .unwrap_err();
        assert_eq!(e.to_string(), "applier refused: protocol: no");
        assert_eq!(c.handle_end(t0), Err(ControlError::Closed));
    }
}
