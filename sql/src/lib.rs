//! `tidelog-sql`: the applier's MySQL-protocol endpoint, so that an application's own
//! MariaDB/MySQL connector can ask `SELECT trx_status('<connect_id>:<counter>', '<gtid>')`
//! after a failover (docs/ARCHITECTURE.md, "The SQL endpoint"; docs/operations.md).
//!
//! It is one more thin front end of [`tidelog_applier::node::Applier`], beside the admin
//! API: each statement becomes a typed call (`trx_status`, `gtid_current_pos`,
//! `wait_gtid_pos`, `status`), and the applier's own caps hold (the wait limit, the longest
//! wait). It is not a SQL database: it recognises a handful of statement forms
//! ([`statement`]) and refuses every other one with error 1235, naming what it supports.
//!
//! ```text
//!  lib.rs        this map
//!  server.rs     SqlServer, SqlOptions: listener, connection limit, shutdown
//!  conn.rs       one connection: greeting, TLS, auth, the command loop
//!  packets.rs    packets as bytes (mysql_common's framing and types), no I/O
//!  statement.rs  the statement forms, parsed from text, no I/O
//!  answer.rs     a statement's answer, from calls on the Applier
//!  variables.rs  the @@variables
//!  replica.rs    SHOW REPLICA STATUS
//!  auth.rs       the password file and mysql_native_password
//!  metrics.rs    the endpoint's metric families
//! ```
//!
//! The protocol's primitives — packet framing with its size limit and sequence checks,
//! the handshake response, column definitions, binary values, the password scramble —
//! are `mysql_common`'s (the crate `mysql_async` is built on), so every byte a client
//! sends is read by a parser that returns errors, never panics.

pub mod answer;
pub mod auth;
mod conn;
mod metrics;
pub mod packets;
mod replica;
mod server;
pub mod statement;
pub mod variables;

pub use auth::Password;
pub use conn::{HANDSHAKE_TIMEOUT, MAX_PREPARED};
pub use server::{SqlOptions, SqlServer};
