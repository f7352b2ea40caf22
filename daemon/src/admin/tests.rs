use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use axum::Router;
use serde::{Deserialize, Serialize};

use super::*;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct T {
    #[serde(with = "ht")]
    a: u64,
    #[serde(with = "opt_ht", default)]
    b: Option<u64>,
    k: JsonBytes,
    v: Option<JsonBytes>,
}

#[test]
fn hybrid_times_are_strings_and_bytes_utf8_or_b64() {
    let t = T {
        a: u64::MAX,
        b: Some(7),
        k: JsonBytes::from("k"),
        v: Some(JsonBytes(vec![0, 0xff])),
    };
    let s = serde_json::to_string(&t).unwrap();
    assert_eq!(
        s,
        r#"{"a":"18446744073709551615","b":"7","k":"k","v":{"b64":"AP8="}}"#
    );
    assert_eq!(serde_json::from_str::<T>(&s).unwrap(), t);
    let t2: T = serde_json::from_str(r#"{"a":5,"k":{"b64":"aGk="},"v":null}"#).unwrap();
    assert_eq!(t2.a, 5);
    assert_eq!(t2.b, None);
    assert_eq!(t2.k.0, b"hi");
    assert_eq!(t2.v, None);
    assert!(serde_json::from_str::<T>(r#"{"a":-1,"k":"x","v":null}"#).is_err());
    assert!(serde_json::from_str::<T>(r#"{"a":"x1","k":"x","v":null}"#).is_err());
    assert!(serde_json::from_str::<T>(r#"{"a":1,"k":{"b64":"!!"},"v":null}"#).is_err());
    assert!(serde_json::from_str::<T>(r#"{"a":1,"k":{"hex":"00"},"v":null}"#).is_err());
    assert!(serde_json::from_str::<T>(r#"{"a":1,"k":5,"v":null}"#).is_err());
}

#[test]
fn percent_decoding_gives_raw_bytes() {
    assert_eq!(
        percent_decode("key", "a%00%FFb", false).unwrap(),
        b"a\0\xffb"
    );
    assert_eq!(percent_decode("key", "a+b", false).unwrap(), b"a+b");
    assert_eq!(percent_decode("prefix", "a+b%2B", true).unwrap(), b"a b+");
    for bad in ["%", "%F", "%GG", "ab%zz", "%+1", "a%+F"] {
        let e = percent_decode("key", bad, false).unwrap_err().to_string();
        assert!(e.contains("key: bad percent-encoding"), "{bad}: {e}");
    }
    let u: Uri = "/v1/scan?mode=latest&prefix=%00%FF&limit=2"
        .parse()
        .unwrap();
    assert_eq!(query_bytes(&u, "prefix").unwrap(), Some(vec![0, 0xff]));
    assert_eq!(query_bytes(&u, "at").unwrap(), None);
}

#[test]
fn api_error_body() {
    let e = ApiError::unavailable("stale_safe_time", "tablet t3 lags by 20m");
    assert_eq!(e.to_string(), "stale_safe_time: tablet t3 lags by 20m");
    let r = e.into_response();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(parse_ht("at", "12x").is_err());
    assert_eq!(parse_ht("at", "12").unwrap(), 12);
    assert!(parse_wait("wait", "5 parsecs").is_err());
}

/// A router with `GET /v1/status` only.
fn status_only() -> Router {
    Router::new().route(
        "/v1/status",
        axum::routing::get(|| async { axum::Json(serde_json::json!({"ok": true})) }),
    )
}

/// `req` ("GET /v1/status") on a new connection; the whole answer.
async fn ask(p: &Path, req: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::UnixStream::connect(p).await.unwrap();
    let head =
        format!("{req} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    c.write_all(head.as_bytes()).await.unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).await.unwrap();
    out
}

/// Unknown paths and known paths with another method both get the JSON 404.
#[tokio::test]
async fn unknown_routes_and_methods_get_the_json_404() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("admin.sock");
    let l = bind(&p).await.unwrap();
    let stop = StopSignal::new();
    let server = serve_bound(l, &p, status_only(), stop.stopped());
    let client = async {
        let mut answers = Vec::new();
        for req in [
            "GET /v1/status",
            "POST /v1/status",
            "DELETE /v1/status",
            "GET /v1/nope",
        ] {
            answers.push((req, ask(&p, req).await));
        }
        stop.stop();
        answers
    };
    let (served, answers) = tokio::join!(server, client);
    served.unwrap();
    assert!(answers[0].1.starts_with("HTTP/1.1 200"), "{}", answers[0].1);
    for (req, r) in &answers[1..] {
        assert!(r.starts_with("HTTP/1.1 404"), "{req}: {r}");
        let body = &r[r.find("\r\n\r\n").unwrap() + 4..];
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"], "not_found", "{req}: {body}");
        assert_eq!(v["message"], format!("no route {req}"), "{req}: {body}");
    }
}

/// Beyond `max_connections` a connection gets a 503 `too_many_connections`; connections
/// that send no request are closed after the header timeout, which frees their places.
#[tokio::test]
async fn connections_are_capped_and_idle_ones_closed() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("admin.sock");
    let l = bind(&p).await.unwrap();
    let router = status_only();
    let stop = StopSignal::new();
    let limits = Limits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(2),
    };
    let server = tokio::spawn({
        let p = p.clone();
        let stopped = stop.stopped();
        async move { serve_limited(l, &p, router, stopped, limits).await }
    });
    let t0 = std::time::Instant::now();
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(tokio::net::UnixStream::connect(&p).await.unwrap());
    }
    let refused = ask(&p, "GET /v1/status").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("\"too_many_connections\""), "{refused}");
    if t0.elapsed() < limits.header_read_timeout {
        // The idle ones are closed at their timeout; then the places are free.
        for mut c in idle {
            let mut b = [0u8; 16];
            let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut b))
                .await
                .expect("an idle connection is closed");
            assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
        }
        assert!(t0.elapsed() >= limits.header_read_timeout);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let a = ask(&p, "GET /v1/status").await;
        if a.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{a}");
    }
    stop.stop();
    server.await.unwrap().unwrap();
    assert!(!p.exists());
}

#[tokio::test]
async fn refuses_live_socket_and_non_socket_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("sub/admin.sock");
    let l = bind(&p).await.unwrap();
    let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, SOCKET_MODE);
    let e = format!("{:#}", bind(&p).await.unwrap_err());
    assert!(e.contains("in use"), "{e}");
    drop(l);
    // Stale now: nobody listens.
    let _l = bind(&p).await.unwrap();
    let f = dir.path().join("plain");
    std::fs::write(&f, "keep me").unwrap();
    let e = format!("{:#}", bind(&f).await.unwrap_err());
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
}
