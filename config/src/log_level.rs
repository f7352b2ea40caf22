//! `log-level`: the daemons' log filter, checked at start so a typo does not silence the
//! log.

use anyhow::{anyhow, bail, Result};

/// The daemons' log filter when neither `--log-level`, RUST_LOG nor `log-level` says.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// The level names a `log-level` directive may use (case-insensitive).
const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];

/// `log-level`: comma-separated directives, each a level name (`info`) or `target=level`
/// (`tidelog_applier=debug`, spans allowed in the target as `tracing` writes them), and the
/// whole a valid `tracing` filter. A bare word that is not a level is refused: `tracing`
/// would take it for a target name and log nothing else (`verbose`, `warning`).
pub(crate) fn validate_log_level(level: &str) -> Result<()> {
    const FORMS: &str = "accepted: a level (error, warn, info, debug, trace, off) or \
                         target=level (e.g. tidelog_applier=debug), separated by commas";
    let is_level = |s: &str| LEVELS.iter().any(|l| l.eq_ignore_ascii_case(s.trim()));
    let mut directives = 0;
    for d in level.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        directives += 1;
        match d.rsplit_once('=') {
            None if is_level(d) => {}
            None => bail!(
                "key \"log-level\": invalid filter {level:?}: directive {d:?} is not a level \
                 ({FORMS})"
            ),
            Some((target, lvl)) => {
                if target.trim().is_empty() || !is_level(lvl) {
                    bail!(
                        "key \"log-level\": invalid filter {level:?}: directive {d:?} is not \
                         target=level ({FORMS})"
                    );
                }
            }
        }
    }
    if directives == 0 {
        bail!("key \"log-level\": invalid filter {level:?}: it is empty ({FORMS})");
    }
    tracing_subscriber::EnvFilter::try_new(level)
        .map(|_| ())
        .map_err(|e| anyhow!("key \"log-level\": invalid filter {level:?}: {e} ({FORMS})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_level_directives() {
        for ok in [
            "info",
            "INFO",
            "Warn",
            "off",
            "tidelog_applier=debug,info",
            "tidelog_shipper=debug, warn",
            "tidelog_wal=TRACE",
            "info,",
        ] {
            validate_log_level(ok).unwrap_or_else(|e| panic!("{ok:?}: {e:#}"));
        }
        for (bad, directive) in [
            ("verbose", "verbose"),
            ("warning", "warning"),
            ("info,tidelog_applier", "tidelog_applier"),
            ("tidelog=verbose", "tidelog=verbose"),
            ("=debug", "=debug"),
            ("==", "=="),
        ] {
            let e = format!("{:#}", validate_log_level(bad).unwrap_err());
            assert!(
                e.starts_with("key \"log-level\": invalid filter")
                    && e.contains(&format!("directive {directive:?}"))
                    && e.contains("target=level"),
                "{bad:?}: {e}"
            );
        }
        assert!(format!("{:#}", validate_log_level(" ").unwrap_err()).contains("empty"));
    }
}
