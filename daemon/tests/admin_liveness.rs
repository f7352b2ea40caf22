//! The admin API stays live whatever its clients do: requests that wait on the safe time
//! hold no thread and are capped (503 `too_many_waiters`), `status` and reads answer while
//! thousands wait, and a client that never finishes its request head is disconnected.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// Parked requests the test sends: more than the cap.
const PARKED: usize = 2000;

/// `tidelog::admin::MAX_WAITERS`, as the daemon reports it in status.
const CAP: usize = tidelog::admin::MAX_WAITERS;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Connects, retrying while the listen backlog is full (a burst of connections).
async fn connect(sock: &Path) -> UnixStream {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match UnixStream::connect(sock).await {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline && e.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Err(e) => panic!("connecting to {}: {e}", sock.display()),
        }
    }
}

/// One request on its own connection (`Connection: close`): the status code and the JSON
/// body (Null if it is not JSON).
async fn request(sock: PathBuf, path: String) -> (u16, Value) {
    let mut c = connect(&sock).await;
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    c.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    let code = text
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer to {path}: {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// `path` answered within `limit`: its latency, or `None` when it did not answer in time.
async fn timed(sock: &Path, path: &str, limit: Duration) -> Option<(Duration, u16, Value)> {
    let t0 = Instant::now();
    let (code, v) = tokio::time::timeout(limit, request(sock.to_path_buf(), path.to_string()))
        .await
        .ok()?;
    Some((t0.elapsed(), code, v))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// 2 000 requests wait on a safe time that will not come (`/v1/safe-time?wait-for=<u64
/// max>&wait=60s`, and `/v1/trx/…?gtid=<future>&wait=300s`), each on its own connection to
/// the real applier. The first [`CAP`] park; the rest get 503 `too_many_waiters` at once.
/// `status` and a `latest` read then answer within 100 ms (they used to queue behind the
/// waits on the blocking pool for 20 s and more), and a stop answers every parked request.
#[test]
fn status_answers_while_thousands_wait() {
    tidelog::admin::raise_open_files_limit();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    let mut applier = c.start_applier();
    wait_for("the applier's admin API", Duration::from_secs(30), || {
        api(&c.applier_sock, "GET", "/v1/status").is_some()
    });
    let sock = c.applier_sock.clone();
    let rt = runtime();
    let (tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..PARKED {
        let path = if i % 4 == 0 {
            format!("/v1/trx/7:{}?gtid=0-1-{}&wait=300s", i + 1, 1_000_000 + i)
        } else {
            format!("/v1/safe-time?wait-for={}&wait=60s", u64::MAX)
        };
        let (tx, sock) = (tx.clone(), sock.clone());
        rt.spawn(async move {
            let _ = tx.send(request(sock, path).await);
        });
    }
    drop(tx);
    rt.block_on(async {
        // Every request over the cap is refused at once; the rest are parked.
        let mut refused = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while refused < PARKED - CAP {
            let left = deadline.saturating_duration_since(Instant::now());
            let (code, body) = tokio::time::timeout(left, answers.recv())
                .await
                .unwrap_or_else(|_| panic!("only {refused} requests refused within 60 s"))
                .unwrap();
            assert_eq!(code, 503, "{body}");
            assert_eq!(body["error"], "too_many_waiters", "{body}");
            let msg = body["message"].as_str().unwrap();
            assert!(msg.contains(&CAP.to_string()), "{msg}");
            refused += 1;
        }
        let mut waiting = 0;
        while waiting < CAP {
            assert!(
                Instant::now() < deadline,
                "{waiting} of {CAP} requests parked within 60 s"
            );
            let Some((_, 200, st)) = timed(&sock, "/v1/status", Duration::from_secs(5)).await
            else {
                panic!("status gave no answer within 5 s while requests wait");
            };
            waiting = st["admin_waiters"]["waiting"].as_u64().unwrap() as usize;
            assert_eq!(st["admin_waiters"]["max"], CAP, "{st}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // With them all parked: status and a read answer at once.
        let mut status = Vec::new();
        let mut reads = Vec::new();
        for _ in 0..11 {
            let (took, code, v) = timed(&sock, "/v1/status", Duration::from_secs(5))
                .await
                .expect("status answers while requests wait");
            assert_eq!(code, 200, "{v}");
            status.push(took);
            let (took, code, v) = timed(&sock, "/v1/kv/k?mode=latest", Duration::from_secs(5))
                .await
                .expect("a latest read answers while requests wait");
            assert_eq!(code, 200, "{v}");
            reads.push(took);
        }
        let (status, reads) = (median(status), median(reads));
        eprintln!(
            "with {CAP} requests parked: status {status:?}, latest read {reads:?} (medians of 11)"
        );
        assert!(
            status < Duration::from_millis(100),
            "status took {status:?} (median of 11) with {CAP} requests parked"
        );
        assert!(
            reads < Duration::from_millis(100),
            "a read took {reads:?} (median of 11) with {CAP} requests parked"
        );
        // Still parked: none has answered.
        assert!(answers.try_recv().is_err(), "a parked request answered");
    });
    // A stop answers every parked request (nothing will move the safe time now) and exits.
    assert!(applier.terminate(Duration::from_secs(30)), "a clean stop");
    rt.block_on(async {
        let mut answered = 0;
        while let Ok(Some((code, body))) =
            tokio::time::timeout(Duration::from_secs(30), answers.recv()).await
        {
            assert_eq!(code, 200, "{body}");
            answered += 1;
        }
        assert_eq!(answered, CAP);
    });
}

/// A client that sends half a request line (or nothing) is disconnected once
/// `tidelog::admin::HEADER_READ_TIMEOUT` has passed, on both daemons' sockets; one that
/// finishes its request is answered.
#[test]
fn slow_request_heads_are_disconnected() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    for sock in [&c.applier_sock, &c.shipper_sock] {
        wait_for("the admin API", Duration::from_secs(30), || {
            api(sock, "GET", "/v1/status").is_some()
        });
    }
    let limit = tidelog::admin::HEADER_READ_TIMEOUT;
    runtime().block_on(async {
        let mut slow = Vec::new();
        for sock in [&c.applier_sock, &c.shipper_sock] {
            for sent in ["GET /v1/sta", ""] {
                let mut s = connect(sock).await;
                s.write_all(sent.as_bytes()).await.unwrap();
                slow.push((sock.clone(), sent, s, Instant::now()));
            }
        }
        for (sock, sent, mut s, t0) in slow {
            let mut buf = [0u8; 256];
            let closed = tokio::time::timeout(limit + Duration::from_secs(10), s.read(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{}: a connection that sent {sent:?} is still open after {:?}",
                        sock.display(),
                        t0.elapsed()
                    )
                });
            // Closed (EOF or reset), with no answer to a request it never finished.
            assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
            // Not before the timeout: a client may take a moment to send its request.
            assert!(t0.elapsed() >= limit - Duration::from_millis(500));
            // The daemon answers the next client.
            let (_, code, _) = timed(&sock, "/v1/status", Duration::from_secs(5))
                .await
                .expect("status answers");
            assert_eq!(code, 200);
        }
    });
}
