//! The system variables a connector reads on connect (`@@version`, `@@max_allowed_packet`,
//! `@@wait_timeout`, …) and the replication ones (`@@gtid_current_pos`), with their values:
//! what `SELECT @@name` and `SHOW VARIABLES` answer.

use tidelog_applier::node::Applier;

use crate::answer::{Cell, Kind, Session, SqlError};

/// The largest packet the endpoint reads (statements are short; a larger packet closes the
/// connection).
pub const MAX_ALLOWED_PACKET: usize = 1 << 20;

/// The server version in the greeting and `@@version`: MariaDB's dialect of the protocol
/// (`MASTER_GTID_WAIT`, gtid positions), so connectors use it.
pub fn version() -> String {
    format!("10.11.99-MariaDB-tidelog-{}", env!("CARGO_PKG_VERSION"))
}

/// How a variable gets its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// `NULL` (e.g. `socket`: there is no Unix socket).
    Null,
    Text(&'static str),
    Int(i64),
    Version,
    VersionComment,
    MaxAllowedPacket,
    IdleTimeout,
    GtidPos,
    ReadOnly,
    Tls,
}

/// A variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Var {
    pub name: &'static str,
    source: Source,
}

impl Var {
    pub const VERSION: Var = Var {
        name: "version",
        source: Source::Version,
    };

    pub fn kind(&self) -> Kind {
        match self.source {
            Source::Int(_) | Source::MaxAllowedPacket | Source::IdleTimeout | Source::ReadOnly => {
                Kind::Int
            }
            _ => Kind::Text,
        }
    }
}

const fn v(name: &'static str, source: Source) -> Var {
    Var { name, source }
}

/// Every variable, by name (`SHOW VARIABLES` lists them in this order).
pub const ALL: &[Var] = &[
    v("autocommit", Source::Int(1)),
    v("character_set_client", Source::Text("utf8mb4")),
    v("character_set_connection", Source::Text("utf8mb4")),
    v("character_set_results", Source::Text("utf8mb4")),
    v("character_set_server", Source::Text("utf8mb4")),
    v("collation_connection", Source::Text("utf8mb4_general_ci")),
    v("collation_server", Source::Text("utf8mb4_general_ci")),
    v("gtid_binlog_pos", Source::GtidPos),
    v("gtid_current_pos", Source::GtidPos),
    v("gtid_slave_pos", Source::GtidPos),
    v("have_ssl", Source::Tls),
    v("init_connect", Source::Text("")),
    v("interactive_timeout", Source::IdleTimeout),
    v("license", Source::Text("Apache-2.0")),
    v("lower_case_table_names", Source::Int(0)),
    v("max_allowed_packet", Source::MaxAllowedPacket),
    v("net_buffer_length", Source::Int(16384)),
    v("net_write_timeout", Source::Int(60)),
    v("performance_schema", Source::Text("OFF")),
    v("read_only", Source::ReadOnly),
    v("socket", Source::Null),
    v("sql_mode", Source::Text("")),
    v("system_time_zone", Source::Text("UTC")),
    v("time_zone", Source::Text("SYSTEM")),
    v("transaction_isolation", Source::Text("REPEATABLE-READ")),
    v("tx_isolation", Source::Text("REPEATABLE-READ")),
    v("tx_read_only", Source::Int(1)),
    v("version", Source::Version),
    v("version_comment", Source::VersionComment),
    v("wait_timeout", Source::IdleTimeout),
];

/// The variable `name` (lower case).
pub fn find(name: &str) -> Option<&'static Var> {
    ALL.iter().find(|v| v.name == name)
}

/// The value of `v` now.
pub fn value(applier: &Applier, v: &Var, s: &Session) -> Result<Cell, SqlError> {
    Ok(match v.source {
        Source::Null => Cell::Null,
        Source::Text(t) => Cell::Text(t.to_string()),
        Source::Int(n) => Cell::Int(n),
        Source::Version => Cell::Text(version()),
        Source::VersionComment => Cell::Text(format!(
            "tidelog {}: the applier's trx_status endpoint",
            env!("CARGO_PKG_VERSION")
        )),
        Source::MaxAllowedPacket => Cell::Int(MAX_ALLOWED_PACKET as i64),
        Source::IdleTimeout => Cell::Int(s.idle_timeout.as_secs().min(i64::MAX as u64) as i64),
        Source::GtidPos => Cell::Text(
            applier
                .gtid_current_pos()
                .map_err(crate::answer::SqlError::applier)?
                .to_string(),
        ),
        // A replica is read-only; so is a promoted target through this endpoint.
        Source::ReadOnly => Cell::Int(1),
        Source::Tls => Cell::Text(if s.tls_offered { "YES" } else { "DISABLED" }.to_string()),
    })
}
