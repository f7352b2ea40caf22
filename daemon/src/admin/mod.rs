//! The admin API server (`docs/operations.md`, "Admin API"): HTTP/1.1 + JSON on a Unix
//! socket, and the pieces every handler shares — the error body, the JSON 404, hybrid times
//! as decimal strings and keys and values as UTF-8 strings or `{"b64": …}`.
//!
//! A daemon builds its `axum::Router` of `/v1/…` routes and hands it to [`serve`], which adds
//! the JSON 404 fallback and holds every connection to [`Limits`]: a client that has not
//! sent a whole request head within [`HEADER_READ_TIMEOUT`] is disconnected (a slow or
//! stuck client, or an idle keep-alive one, holds nothing for long), and beyond
//! [`MAX_CONNECTIONS`] a new connection is answered 503 `too_many_connections` and closed.
//! A request that waits (`/v1/safe-time?wait-for=`, `/v1/trx/…?gtid=`) takes a place of
//! the applier's wait limit (`tidelog_applier::node::WaitLimit`; 503 `too_many_waiters`
//! when none is left) and waits as an async task: no wait holds a thread, so `status`
//! answers however many wait.
//!
//! ```no_run
//! # async fn f(shutdown: tokio::sync::oneshot::Receiver<()>) -> anyhow::Result<()> {
//! use axum::{routing::get, Json, Router};
//! let router = Router::new().route("/v1/status", get(|| async { Json(serde_json::json!({})) }));
//! tidelog::admin::serve(
//!     "/run/tidelog/applier.sock".as_ref(),
//!     router,
//!     async move { let _ = shutdown.await; },
//! )
//! .await
//! # }
//! ```
//!
//! The server and its socket are in `serve.rs`, the error answer in `error.rs`, and the
//! request and answer values (queries, hybrid times, keys and values) in `values.rs`.

mod error;
mod serve;
mod values;

pub use error::{not_found, ApiError, ErrorBody};
pub use serve::{
    bind, check_bind, raise_open_files_limit, serve, serve_bound, serve_http, serve_limited,
    wind_down, Limits, StopSignal, HEADER_READ_TIMEOUT, MAX_CONNECTIONS, MAX_WAITERS, SOCKET_MODE,
};
pub use values::{
    ht, opt_ht, parse_ht, parse_tablet, parse_wait, percent_decode, prometheus, query_bytes,
    ApiQuery, JsonBytes,
};

#[cfg(test)]
mod tests;
