//! The impairment proxy itself: each impairment does what it says, in bounds, and a seed
//! replays the same decisions.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use tidelog_testkit::{ImpairProxy, Impairment};
use tokio::net::UdpSocket;

/// A client and a target with the proxy between them.
struct Rig {
    proxy: ImpairProxy,
    client: UdpSocket,
    target: UdpSocket,
    base: std::time::Instant,
}

/// One datagram as the target got it.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    seq: u64,
    /// From the client's send to the target's receive.
    delay: Duration,
}

fn socket() -> UdpSocket {
    let (s, _) = tidelog_net::bind_udp(SocketAddr::from(([127, 0, 0, 1], 0)), 8 << 20).unwrap();
    s.set_nonblocking(true).unwrap();
    UdpSocket::from_std(s).unwrap()
}

fn imp(spec: &str) -> Impairment {
    spec.parse().unwrap()
}

async fn rig(spec: &str, seed: u64) -> Rig {
    let target = socket();
    let proxy = ImpairProxy::start(
        &tokio::runtime::Handle::current(),
        target.local_addr().unwrap(),
        imp(spec),
        seed,
    )
    .unwrap();
    let client = socket();
    client.connect(proxy.local_addr()).await.unwrap();
    Rig {
        proxy,
        client,
        target,
        base: std::time::Instant::now(),
    }
}

impl Rig {
    /// Datagrams the proxy has let through or still holds (copies included).
    fn due(&self) -> u64 {
        let s = self.proxy.stats().to_target;
        assert_eq!(s.send_errors, 0);
        s.received - s.lost - s.overflow + s.duplicated
    }

    /// Sends datagrams `0..n` (seq and send time, padded to 200 bytes) in windows of 256,
    /// and after each window receives until everything the proxy let through has arrived.
    async fn run(&self, n: u64) -> Vec<Arrival> {
        let mut out = Vec::new();
        let mut buf = [0u8; 512];
        let mut seq = 0;
        while seq < n {
            let end = (seq + 256).min(n);
            for s in seq..end {
                let mut d = [0u8; 200];
                d[..8].copy_from_slice(&s.to_le_bytes());
                let t = self.base.elapsed().as_nanos() as u64;
                d[8..16].copy_from_slice(&t.to_le_bytes());
                self.client.send(&d).await.unwrap();
            }
            seq = end;
            // Everything sent so far is counted by the proxy before it is let through; the
            // last ones may be lost, so look at the counts between short waits.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while self.proxy.stats().to_target.received < seq || (out.len() as u64) < self.due() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "datagrams missing after 20 s: got {} of {} due ({:?})",
                    out.len(),
                    self.due(),
                    self.proxy.stats()
                );
                let Ok(r) =
                    tokio::time::timeout(Duration::from_millis(5), self.target.recv(&mut buf))
                        .await
                else {
                    continue;
                };
                let k = r.unwrap();
                assert_eq!(k, 200);
                let at = self.base.elapsed().as_nanos() as u64;
                let s = u64::from_le_bytes(buf[..8].try_into().unwrap());
                let t = u64::from_le_bytes(buf[8..16].try_into().unwrap());
                out.push(Arrival {
                    seq: s,
                    delay: Duration::from_nanos(at - t),
                });
            }
        }
        out
    }
}

/// Arrivals overtaken by a datagram sent after them.
fn overtaken(a: &[Arrival]) -> usize {
    let mut max = None;
    a.iter()
        .filter(|x| {
            let late = max.is_some_and(|m| x.seq < m);
            max = max.max(Some(x.seq));
            late
        })
        .count()
}

fn seqs(a: &[Arrival]) -> Vec<u64> {
    a.iter().map(|x| x.seq).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_impairment_everything_arrives_once_in_order() {
    let r = rig("none", 1).await;
    let a = r.run(2000).await;
    assert_eq!(seqs(&a), (0..2000).collect::<Vec<_>>());
    let s = r.proxy.stats().to_target;
    assert_eq!(
        (s.received, s.sent, s.lost, s.reordered),
        (2000, 2000, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_drops_its_share_and_a_seed_replays_the_same_drops() {
    let n = 4000;
    let run = |seed| async move {
        let r = rig("loss=10%", seed).await;
        let a = r.run(n).await;
        let lost = r.proxy.stats().to_target.lost;
        (seqs(&a), lost)
    };
    let (a, lost) = run(7).await;
    // Binomial(4000, 0.1): mean 400, sd 19.
    assert!((300..=500).contains(&lost), "lost {lost} of {n}");
    assert_eq!(a.len() as u64, n - lost);
    let set: BTreeSet<u64> = a.iter().copied().collect();
    assert_eq!(set.len(), a.len(), "a datagram arrived twice");
    let (again, lost_again) = run(7).await;
    assert_eq!((&a, lost), (&again, lost_again), "same seed, other drops");
    let (other, _) = run(8).await;
    assert_ne!(a, other, "another seed dropped the same datagrams");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_delay_holds_each_datagram_at_least_that_long_and_keeps_the_order() {
    let r = rig("delay=30ms", 1).await;
    let a = r.run(600).await;
    assert_eq!(seqs(&a), (0..600).collect::<Vec<_>>());
    let min = a.iter().map(|x| x.delay).min().unwrap();
    assert!(min >= Duration::from_millis(30), "min delay {min:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jitter_spreads_the_delay_and_reorders() {
    let r = rig("delay=20ms,jitter=10ms", 3).await;
    let a = r.run(1000).await;
    assert_eq!(a.len(), 1000);
    let min = a.iter().map(|x| x.delay).min().unwrap();
    assert!(min >= Duration::from_millis(10), "min delay {min:?}");
    // 256 datagrams sent within about a millisecond get independent delays over 20 ms.
    assert!(overtaken(&a) > 200, "{} overtaken", overtaken(&a));
    assert_eq!(r.proxy.stats().to_target.reordered, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dup_sends_its_share_twice() {
    let n = 2000;
    let r = rig("dup=20%", 5).await;
    let a = r.run(n).await;
    let dups = r.proxy.stats().to_target.duplicated;
    // Binomial(2000, 0.2): mean 400, sd 18.
    assert!((300..=500).contains(&dups), "duplicated {dups} of {n}");
    assert_eq!(a.len() as u64, n + dups);
    let mut seen = BTreeSet::new();
    let twice = a.iter().filter(|x| !seen.insert(x.seq)).count() as u64;
    assert_eq!(twice, dups);
    assert_eq!(seen.len() as u64, n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reorder_holds_its_share_back_behind_later_ones() {
    let n = 1000;
    let r = rig("delay=30ms,reorder=20%", 9).await;
    let a = r.run(n).await;
    assert_eq!(a.len() as u64, n);
    let held = r.proxy.stats().to_target.reordered;
    // Binomial(1000, 0.2): mean 200, sd 13.
    assert!((140..=260).contains(&held), "reordered {held} of {n}");
    // Each reordered one is held twice the delay; the others once (a busy host may delay
    // those too), and nothing beats the delay.
    let slow = a
        .iter()
        .filter(|x| x.delay >= Duration::from_millis(60))
        .count() as u64;
    assert!(slow >= held, "{slow} held 60 ms or more, {held} reordered");
    let min = a.iter().map(|x| x.delay).min().unwrap();
    assert!(min >= Duration::from_millis(30), "min delay {min:?}");
    // The datagrams of a window sent after a held one overtake it.
    assert!(overtaken(&a) > 100, "{} overtaken", overtaken(&a));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_come_back_impaired_too_and_loss_100_partitions() {
    let r = rig("delay=15ms", 1).await;
    let t0 = std::time::Instant::now();
    r.client.send(b"ping").await.unwrap();
    let mut buf = [0u8; 16];
    let (n, from) = r.target.recv_from(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"ping");
    // The target answers the flow's upstream socket, not the client.
    assert_ne!(from, r.client.local_addr().unwrap());
    r.target.send_to(b"pong", from).await.unwrap();
    let n = r.client.recv(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"pong");
    assert!(
        t0.elapsed() >= Duration::from_millis(30),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(r.proxy.stats().to_client.sent, 1);

    r.proxy.set_impairment(imp("loss=100%"));
    for _ in 0..50 {
        r.client.send(b"lost").await.unwrap();
    }
    // Counted as lost once the proxy has seen them all, and none reached the target.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while r.proxy.stats().to_target.lost < 50 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            r.proxy.stats()
        );
        tokio::task::yield_now().await;
    }
    r.proxy.set_impairment(Impairment::default());
    r.client.send(b"back").await.unwrap();
    let n = r.target.recv(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"back", "a lost datagram reached the target");
}

#[test]
fn specs_parse_and_bad_ones_name_the_item() {
    let i = imp("loss=5%,delay=20ms,jitter=5ms,reorder=10%,dup=1%");
    assert_eq!(
        i,
        Impairment {
            loss: 0.05,
            delay: Duration::from_millis(20),
            jitter: Duration::from_millis(5),
            reorder: 0.10,
            duplicate: 0.01,
        }
    );
    assert_eq!(i.to_string().parse::<Impairment>().unwrap(), i);
    assert_eq!(imp("loss=0.25").loss, 0.25);
    assert!(imp("none").is_none() && imp("").is_none());
    for (spec, item) in [
        ("loss=150%", "loss=150%"),
        ("loss=x", "loss=x"),
        ("delay=20", "delay=20"),
        ("colour=red", "colour=red"),
        ("loss", "loss"),
        ("reorder=10%", "reorder=10%"),
        ("delay=5ms,jitter=10ms", "jitter=10ms"),
    ] {
        let e = spec.parse::<Impairment>().unwrap_err();
        assert_eq!(e.item, item, "{spec}: {e}");
        assert!(e.to_string().contains(item), "{e}");
    }
}
