//! The endpoint's metric families, registered next to the applier's: connections open,
//! accepted and refused (by reason), statements by kind, errors by MySQL code. Names are
//! `tidelog_applier_sql_<thing>`; counters are registered without `_total`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// The counters the connections keep.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    pub open: Gauge,
    pub accepted: Counter,
    pub refused: Family<Labels, Counter>,
    pub statements: Family<Labels, Counter>,
    pub errors: Family<Labels, Counter>,
}

impl Metrics {
    /// Registers the families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tidelog_applier_sql_connections",
            "SQL endpoint connections open now",
            self.open.clone(),
        );
        registry.register(
            "tidelog_applier_sql_connections_accepted",
            "SQL endpoint connections accepted (authenticated or not)",
            self.accepted.clone(),
        );
        registry.register(
            "tidelog_applier_sql_connections_refused",
            "SQL endpoint connections refused or closed early, by reason (max_connections, auth, tls_required, malformed, idle_timeout, handshake_timeout)",
            self.refused.clone(),
        );
        registry.register(
            "tidelog_applier_sql_statements",
            "SQL endpoint statements and commands answered, by kind",
            self.statements.clone(),
        );
        registry.register(
            "tidelog_applier_sql_errors",
            "SQL endpoint error answers, by MySQL error code",
            self.errors.clone(),
        );
    }

    pub fn refused(&self, reason: &'static str) {
        self.refused
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }

    pub fn statement(&self, kind: &'static str) {
        self.statements
            .get_or_create(&vec![("kind", kind.to_string())])
            .inc();
    }

    pub fn error(&self, code: u16) {
        self.errors
            .get_or_create(&vec![("code", code.to_string())])
            .inc();
    }
}
