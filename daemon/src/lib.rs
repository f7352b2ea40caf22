//! The `tidelog` daemon's library half: the pieces `main.rs` wires into the CLI and that the
//! integration tests drive directly — configuration files, the admin API server helpers
//! and its client (`ctl`), systemd notification, and `tidelog demo` (on the test kit's
//! local cluster and load generators, `tidelog-testkit`). TLS and `certs init` are in
//! `tidelog-net`.
//!
//! It holds no shipping or applying logic: that is in `tidelog-shipper` and
//! `tidelog-applier`; the WAL format is in `tidelog-wal`.

pub mod admin;
/// The configuration files, in their own crate so the bench parses them too.
pub use tidelog_config as config;
pub mod applier_daemon;
pub mod ctl;
pub mod demo;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod output;
pub mod panic_hook;
pub mod preflight;
pub mod service;
pub mod shipper_daemon;
pub mod signals;
pub mod sql_config;
