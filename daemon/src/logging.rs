//! The log filter: what the operator gives (`--log-level`, RUST_LOG or the config's
//! `log-level`), with the libraries' own logs held at `warn` unless the filter names them.
//!
//! The store (fjall, lsm_tree), QUIC (quinn) and TLS (rustls) log their own progress at
//! info level: twenty lines at an applier's start that bury tidelog's. With `info` (the
//! daemons' default) or even `debug`, they stay at warnings and errors; a directive that
//! names one of them (`info,fjall=debug`) decides for it.

/// The crates whose logs are held at `warn` unless the filter names them.
pub const QUIET_DEPENDENCIES: &[&str] = &[
    "fjall",
    "lsm_tree",
    "quinn",
    "quinn_proto",
    "quinn_udp",
    "rustls",
    "h2",
    "hyper",
    "hyper_util",
    "axum",
    "tower",
    "mio",
    "tokio_uring",
    "io_uring",
];

/// The target a directive is about (`fjall::tree=debug` → `fjall`), if it names one.
fn directive_crate(directive: &str) -> Option<&str> {
    let target = directive.split(['=', '[']).next()?.trim();
    let krate = target.split("::").next()?;
    // A bare level (`info`, `debug`) names no target.
    let is_level = matches!(
        krate.to_ascii_lowercase().as_str(),
        "trace" | "debug" | "info" | "warn" | "error" | "off"
    ) && !directive.contains('=');
    (!krate.is_empty() && !is_level).then_some(krate)
}

/// `filter` with `,<crate>=warn` added for each of [`QUIET_DEPENDENCIES`] it does not name.
pub fn with_quiet_dependencies(filter: &str) -> String {
    let named: Vec<&str> = filter.split(',').filter_map(directive_crate).collect();
    let mut out = filter.trim().to_string();
    for dep in QUIET_DEPENDENCIES {
        if !named.contains(dep) {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(dep);
            out.push_str("=warn");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_are_quiet_unless_named() {
        let f = with_quiet_dependencies("info");
        assert!(
            f.starts_with("info,fjall=warn,lsm_tree=warn,quinn=warn"),
            "{f}"
        );
        assert!(f.contains(",rustls=warn"), "{f}");
        let f = with_quiet_dependencies("debug,fjall=info,quinn_proto::connection=trace");
        assert!(!f.contains("fjall=warn"), "{f}");
        assert!(!f.contains("quinn_proto=warn"), "{f}");
        assert!(
            f.contains("lsm_tree=warn") && f.contains(",quinn=warn"),
            "{f}"
        );
        assert!(
            f.starts_with("debug,fjall=info,quinn_proto::connection=trace,"),
            "{f}"
        );
        // A span filter on a named target still names it.
        let f = with_quiet_dependencies("rustls[handshake]=debug");
        assert!(!f.contains("rustls=warn"), "{f}");
        assert_eq!(directive_crate("warn"), None);
        assert_eq!(directive_crate("tidelog=debug"), Some("tidelog"));
        // Every result is a valid filter.
        for f in ["", "info", "warn,tidelog_applier=debug"] {
            assert!(
                tracing_subscriber::EnvFilter::try_new(with_quiet_dependencies(f)).is_ok(),
                "{f}"
            );
        }
    }
}
