//! A UDP impairment proxy: forwards datagrams between clients and one target, losing,
//! delaying, jittering, reordering and duplicating them as an [`Impairment`] says, with a
//! seeded RNG so that a run's decisions can be replayed.
//!
//! ```text
//!   client ──▶ 127.0.0.1:<front>  ──(impair)──▶ upstream socket ──▶ target
//!   client ◀── 127.0.0.1:<front>  ◀──(impair)── upstream socket ◀── target
//! ```
//!
//! The proxy listens on an ephemeral port of 127.0.0.1 ([`ImpairProxy::local_addr`]). Each
//! client address gets its own upstream socket (ephemeral port, connected to the target), so
//! the target sees one peer per client, as it would without the proxy. Both directions are
//! impaired alike, each by its own RNG drawn in packet order: the up direction's from the
//! seed, each flow's down direction's from the seed and the flow's number (flows are
//! numbered in the order their first packet arrived).
//!
//! Per datagram, in this order:
//!
//! | step | share | effect |
//! | --- | --- | --- |
//! | loss | `loss` | dropped |
//! | duplicate | `duplicate` | a second copy follows, with its own fate |
//! | reorder | `reorder` (per copy) | held for twice `delay`: the datagrams sent in the `delay` after it overtake it |
//! | delay | otherwise | held for `delay` ± a uniform `jitter` (at least 0): independent delays reorder datagrams sent closer together than twice the jitter, as netem's jitter does |
//!
//! A fixed delay keeps the order. `reorder` displaces a datagram by as much as netem's
//! `reorder` (which sends it at once, `delay` ahead of its neighbours) but the other way: no
//! datagram arrives sooner than the path allows (`delay` − `jitter`), so round-trip samples
//! stay ones a real path could give. (netem's reordered packets cross a 20 ms path in no time;
//! a congestion controller that keeps the minimum round trip, as BBR does, then sizes its
//! window for a path of almost no delay.)
//!
//! Held datagrams are bounded ([`MAX_QUEUED_BYTES`] per direction); beyond it they are dropped and counted as `overflow`. The delays run on
//! tokio's timer, which fires at millisecond ticks and never early: a datagram is held at
//! least its delay, and those due in the same tick leave in due order.

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// What the link does to each datagram (see the module docs for the order of the steps).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Impairment {
    /// Share of datagrams dropped, 0..=1.
    pub loss: f64,
    /// Base one-way delay.
    pub delay: Duration,
    /// Each delayed datagram's delay is `delay` plus a uniform offset in ±`jitter`.
    pub jitter: Duration,
    /// Share of datagrams held for twice the delay, so that later ones overtake them, 0..=1.
    pub reorder: f64,
    /// Share of datagrams sent twice, 0..=1.
    pub duplicate: f64,
}

/// A spec that [`Impairment::from_str`] refuses; names the item and why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("impairment {item:?}: {reason} (expected e.g. loss=5%,delay=20ms,jitter=5ms,reorder=10%,dup=1%)")]
pub struct ImpairmentError {
    pub item: String,
    pub reason: String,
}

impl Impairment {
    /// Whether it does anything at all.
    pub fn is_none(&self) -> bool {
        *self == Impairment::default()
    }
}

fn share(item: &str, v: &str) -> Result<f64, ImpairmentError> {
    let bad = |reason: &str| ImpairmentError {
        item: item.to_string(),
        reason: reason.to_string(),
    };
    let v = v.trim();
    let x = match v.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => v.parse::<f64>(),
    }
    .map_err(|_| bad("not a share (a percentage like 5% or a fraction like 0.05)"))?;
    if !(0.0..=1.0).contains(&x) {
        return Err(bad("a share must be within 0%..=100%"));
    }
    Ok(x)
}

impl FromStr for Impairment {
    type Err = ImpairmentError;

    /// `loss=5%,delay=20ms,jitter=5ms,reorder=10%,dup=1%`: any subset, in any order;
    /// shares as percentages or fractions, durations as `20ms`, `1s`. `none` or an empty
    /// string: no impairment.
    fn from_str(s: &str) -> Result<Impairment, ImpairmentError> {
        let mut imp = Impairment::default();
        let s = s.trim();
        if s.is_empty() || s == "none" {
            return Ok(imp);
        }
        for item in s.split(',') {
            let item = item.trim();
            let bad = |reason: &str| ImpairmentError {
                item: item.to_string(),
                reason: reason.to_string(),
            };
            let (k, v) = item.split_once('=').ok_or_else(|| bad("not key=value"))?;
            let dur = |v: &str| {
                humantime::parse_duration(v.trim())
                    .map_err(|e| bad(&format!("not a duration like 20ms: {e}")))
            };
            match k.trim() {
                "loss" => imp.loss = share(item, v)?,
                "delay" => imp.delay = dur(v)?,
                "jitter" => imp.jitter = dur(v)?,
                "reorder" => imp.reorder = share(item, v)?,
                "dup" | "duplicate" => imp.duplicate = share(item, v)?,
                _ => {
                    return Err(bad(
                        "unknown key (known: loss, delay, jitter, reorder, dup)",
                    ))
                }
            }
        }
        if imp.reorder > 0.0 && imp.delay.is_zero() {
            return Err(ImpairmentError {
                item: format!("reorder={}%", imp.reorder * 100.0),
                reason: "needs a delay: the reordered datagrams are those sent without it".into(),
            });
        }
        if imp.jitter > imp.delay {
            return Err(ImpairmentError {
                item: format!("jitter={:?}", imp.jitter),
                reason: format!("exceeds the delay {:?}", imp.delay),
            });
        }
        Ok(imp)
    }
}

/// A share as a percentage, without trailing zeros (`5%`, `0.5%`).
fn pct(x: f64) -> String {
    let s = format!("{:.4}", x * 100.0);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}%")
}

impl std::fmt::Display for Impairment {
    /// The spec form [`Impairment::from_str`] reads.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_none() {
            return f.write_str("none");
        }
        write!(
            f,
            "loss={},delay={},jitter={},reorder={},dup={}",
            pct(self.loss),
            humantime::format_duration(self.delay),
            humantime::format_duration(self.jitter),
            pct(self.reorder),
            pct(self.duplicate)
        )
    }
}

/// Bytes held back per direction before more are dropped (`overflow`).
pub const MAX_QUEUED_BYTES: usize = 64 << 20;
/// Clients (source addresses) served; datagrams from more are dropped (`overflow`).
pub const MAX_FLOWS: usize = 256;
/// Kernel receive buffer asked for each of the proxy's sockets: a proxy thread preempted
/// for a moment on a busy host should not add losses of its own.
const SOCKET_BUFFER: u64 = 8 << 20;

/// Counts of one direction since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirStats {
    /// Datagrams that arrived.
    pub received: u64,
    /// Datagrams sent on (copies included).
    pub sent: u64,
    /// Dropped by `loss`.
    pub lost: u64,
    /// Extra copies made by `duplicate`.
    pub duplicated: u64,
    /// Held back by `reorder`, behind later ones.
    pub reordered: u64,
    /// Dropped because too much was held back, or too many clients.
    pub overflow: u64,
    /// Sends the OS refused (e.g. the target's port closed).
    pub send_errors: u64,
}

/// Both directions' counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Client → target.
    pub to_target: DirStats,
    /// Target → client, over all clients.
    pub to_client: DirStats,
}

#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    sent: AtomicU64,
    lost: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    overflow: AtomicU64,
    send_errors: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn get(&self) -> DirStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DirStats {
            received: g(&self.received),
            sent: g(&self.sent),
            lost: g(&self.lost),
            duplicated: g(&self.duplicated),
            reordered: g(&self.reordered),
            overflow: g(&self.overflow),
            send_errors: g(&self.send_errors),
        }
    }
}

/// A datagram held back until `at`; `seq` keeps equal times in arrival order.
#[derive(Debug)]
struct Held {
    at: Instant,
    seq: u64,
    data: Vec<u8>,
    flow: usize,
}

impl PartialEq for Held {
    fn eq(&self, o: &Held) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Held) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    /// Reversed: the max-heap's top is the earliest.
    fn cmp(&self, o: &Held) -> CmpOrdering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// One direction's impairment: decides each datagram's fate and holds the delayed ones.
#[derive(Debug)]
struct Link {
    rng: StdRng,
    imp: watch::Receiver<Impairment>,
    cur: Impairment,
    held: BinaryHeap<Held>,
    held_bytes: usize,
    seq: u64,
    counters: Arc<Counters>,
}

impl Link {
    fn new(seed: u64, imp: watch::Receiver<Impairment>, counters: Arc<Counters>) -> Link {
        let cur = imp.borrow().clone();
        Link {
            rng: StdRng::seed_from_u64(seed),
            imp,
            cur,
            held: BinaryHeap::new(),
            held_bytes: 0,
            seq: 0,
            counters,
        }
    }

    /// The delay of one copy: `None` to send it at once.
    fn delay_of(&mut self) -> Option<Duration> {
        let imp = &self.cur;
        if imp.reorder > 0.0 && self.rng.random::<f64>() < imp.reorder {
            Counters::add(&self.counters.reordered, 1);
            return Some(imp.delay * 2);
        }
        let j = i64::try_from(imp.jitter.as_nanos()).unwrap_or(i64::MAX / 2);
        let base = i64::try_from(imp.delay.as_nanos()).unwrap_or(i64::MAX / 2);
        let off = if j > 0 {
            self.rng.random_range(-j..=j)
        } else {
            0
        };
        let d = u64::try_from(base.saturating_add(off)).unwrap_or(0);
        (d > 0).then(|| Duration::from_nanos(d))
    }

    /// Takes a datagram for `flow` that arrived `now`: returns how many copies to send at
    /// once (0, 1 or 2) and holds the delayed ones.
    fn admit(&mut self, now: Instant, data: &[u8], flow: usize) -> usize {
        if self.imp.has_changed().unwrap_or(false) {
            self.cur = self.imp.borrow_and_update().clone();
        }
        Counters::add(&self.counters.received, 1);
        if self.cur.loss > 0.0 && self.rng.random::<f64>() < self.cur.loss {
            Counters::add(&self.counters.lost, 1);
            return 0;
        }
        let copies = if self.cur.duplicate > 0.0 && self.rng.random::<f64>() < self.cur.duplicate {
            Counters::add(&self.counters.duplicated, 1);
            2
        } else {
            1
        };
        let mut at_once = 0;
        for _ in 0..copies {
            match self.delay_of() {
                None => at_once += 1,
                Some(_) if self.held_bytes + data.len() > MAX_QUEUED_BYTES => {
                    Counters::add(&self.counters.overflow, 1);
                }
                Some(d) => {
                    self.seq += 1;
                    self.held_bytes += data.len();
                    self.held.push(Held {
                        at: now + d,
                        seq: self.seq,
                        data: data.to_vec(),
                        flow,
                    });
                }
            }
        }
        at_once
    }

    fn next_due(&self) -> Option<Instant> {
        self.held.peek().map(|h| h.at)
    }

    fn pop_due(&mut self, now: Instant) -> Option<Held> {
        if self.held.peek()?.at > now {
            return None;
        }
        let h = self.held.pop()?;
        self.held_bytes -= h.data.len();
        Some(h)
    }

    fn sent(&self, r: std::io::Result<usize>) {
        match r {
            Ok(_) => Counters::add(&self.counters.sent, 1),
            Err(_) => Counters::add(&self.counters.send_errors, 1),
        }
    }
}

#[derive(Debug)]
struct Shared {
    imp: watch::Sender<Impairment>,
    to_target: Arc<Counters>,
    to_client: Arc<Counters>,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Shared {
    fn keep(&self, h: AbortHandle) {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(h);
    }
}

/// The proxy: its tasks run on the runtime it was started on and stop when it is dropped.
#[derive(Debug)]
pub struct ImpairProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// With [`ImpairProxy::start_on_thread`]: the thread's runtime, stopped on drop.
    thread: Option<(
        tokio::sync::oneshot::Sender<()>,
        std::thread::JoinHandle<()>,
    )>,
}

/// A UDP socket on 127.0.0.1 (ephemeral port), non-blocking, with a large receive buffer.
fn bind_local() -> std::io::Result<std::net::UdpSocket> {
    let (s, _) = tidelog_net::bind_udp(SocketAddr::from(([127, 0, 0, 1], 0)), SOCKET_BUFFER)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

impl ImpairProxy {
    /// Starts a proxy to `target` on `rt`, listening on 127.0.0.1 (ephemeral port).
    pub fn start(
        rt: &tokio::runtime::Handle,
        target: SocketAddr,
        imp: Impairment,
        seed: u64,
    ) -> std::io::Result<ImpairProxy> {
        let front = {
            let _g = rt.enter();
            UdpSocket::from_std(bind_local()?)?
        };
        let addr = front.local_addr()?;
        let shared = Arc::new(Shared {
            imp: watch::Sender::new(imp),
            to_target: Arc::default(),
            to_client: Arc::default(),
            tasks: Mutex::new(Vec::new()),
        });
        let task = rt.spawn(up(Arc::new(front), target, seed, shared.clone()));
        shared.keep(task.abort_handle());
        Ok(ImpairProxy {
            addr,
            shared,
            thread: None,
        })
    }

    /// The same on a thread of its own (named `impair-proxy`, a current-thread runtime),
    /// for callers without a runtime; the thread ends when the proxy is dropped.
    pub fn start_on_thread(
        target: SocketAddr,
        imp: Impairment,
        seed: u64,
    ) -> std::io::Result<ImpairProxy> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let join = std::thread::Builder::new()
            .name("impair-proxy".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let p = ImpairProxy::start(rt.handle(), target, imp, seed);
                let ok = p.is_ok();
                let _ = ready_tx.send(p);
                if ok {
                    // Runs the proxy's tasks until the proxy is dropped.
                    let _ = rt.block_on(stop_rx);
                }
            })?;
        let mut p = ready_rx.recv().map_err(|_| {
            std::io::Error::other("the impairment proxy's thread ended before it started")
        })??;
        p.thread = Some((stop_tx, join));
        Ok(p)
    }

    /// The address clients send to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes the impairment from the next datagram on (datagrams already held keep their
    /// delays). `loss` 100 % partitions the link.
    pub fn set_impairment(&self, imp: Impairment) {
        self.shared.imp.send_replace(imp);
    }

    /// The impairment in force.
    pub fn impairment(&self) -> Impairment {
        self.shared.imp.borrow().clone()
    }

    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            to_target: self.shared.to_target.get(),
            to_client: self.shared.to_client.get(),
        }
    }
}

impl Drop for ImpairProxy {
    fn drop(&mut self) {
        for t in self
            .shared
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
        if let Some((stop, join)) = self.thread.take() {
            let _ = stop.send(());
            let _ = join.join();
        }
    }
}

/// Mixes a flow's number into the seed of its down direction.
fn flow_seed(seed: u64, flow: usize) -> u64 {
    seed ^ (flow as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Sleeps until `at`, or forever.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Client → target: receives on the front socket, opens a flow per client, impairs and
/// sends on the flow's upstream socket.
async fn up(front: Arc<UdpSocket>, target: SocketAddr, seed: u64, shared: Arc<Shared>) {
    let mut link = Link::new(seed, shared.imp.subscribe(), shared.to_target.clone());
    let mut flows: HashMap<SocketAddr, usize> = HashMap::new();
    let mut upstream: Vec<Arc<UdpSocket>> = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        let due = link.next_due();
        tokio::select! {
            r = front.recv_from(&mut buf) => {
                // Errors on an unconnected UDP socket are transient (ICMP reports).
                if let Ok((n, from)) = r {
                    let flow = match flows.get(&from) {
                        Some(&f) => Some(f),
                        None if upstream.len() < MAX_FLOWS => {
                            match open_flow(&front, from, target, seed, upstream.len(), &shared) {
                                Ok(s) => {
                                    upstream.push(s);
                                    flows.insert(from, upstream.len() - 1);
                                    Some(upstream.len() - 1)
                                }
                                Err(_) => None,
                            }
                        }
                        None => None,
                    };
                    match flow {
                        Some(f) => {
                            for _ in 0..link.admit(Instant::now(), &buf[..n], f) {
                                link.sent(upstream[f].send(&buf[..n]).await);
                            }
                        }
                        None => {
                            Counters::add(&link.counters.received, 1);
                            Counters::add(&link.counters.overflow, 1);
                        }
                    }
                }
            }
            () = until(due) => {}
        }
        let now = Instant::now();
        while let Some(h) = link.pop_due(now) {
            link.sent(upstream[h.flow].send(&h.data).await);
        }
    }
}

/// Binds and connects a flow's upstream socket and starts its target → client task.
fn open_flow(
    front: &Arc<UdpSocket>,
    client: SocketAddr,
    target: SocketAddr,
    seed: u64,
    flow: usize,
    shared: &Arc<Shared>,
) -> std::io::Result<Arc<UdpSocket>> {
    let s = bind_local()?;
    s.connect(target)?;
    let s = Arc::new(UdpSocket::from_std(s)?);
    let link = Link::new(
        flow_seed(seed, flow),
        shared.imp.subscribe(),
        shared.to_client.clone(),
    );
    let task = tokio::spawn(down(s.clone(), front.clone(), client, link));
    shared.keep(task.abort_handle());
    Ok(s)
}

/// Target → one client.
async fn down(upstream: Arc<UdpSocket>, front: Arc<UdpSocket>, client: SocketAddr, mut link: Link) {
    let mut buf = vec![0u8; 65536];
    loop {
        let due = link.next_due();
        tokio::select! {
            r = upstream.recv(&mut buf) => {
                // A refused send to the target shows up here (ICMP): not fatal.
                if let Ok(n) = r {
                    for _ in 0..link.admit(Instant::now(), &buf[..n], 0) {
                        link.sent(front.send_to(&buf[..n], client).await);
                    }
                }
            }
            () = until(due) => {}
        }
        let now = Instant::now();
        while let Some(h) = link.pop_due(now) {
            link.sent(front.send_to(&h.data, client).await);
        }
    }
}
