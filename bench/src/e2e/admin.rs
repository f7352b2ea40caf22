//! What the benches read from the applier's admin socket, over the test kit's blocking
//! client (`Api`).

use anyhow::Result;
use tidelog_testkit::Api;

use crate::stage_lag;

/// What the benches read from the applier's admin API.
pub(crate) trait AdminExt {
    /// The applier's lag-by-stage histograms (`GET /metrics`; empty when it fails).
    fn stage_lag(&self) -> stage_lag::Scrape;
    /// The published global safe time (0 while uninitialized).
    fn safe_time(&self) -> Result<u64>;
    /// The `safe_time` of the answer to `GET path` (0 when absent).
    fn safe_time_at(&self, path: &str) -> Result<u64>;
    /// Sum over tablets of `applied_records`.
    fn applied_records(&self) -> Result<u64>;
}

impl AdminExt for Api {
    fn stage_lag(&self) -> stage_lag::Scrape {
        match self.get_raw("/metrics") {
            Ok((200, body)) => stage_lag::parse(&String::from_utf8_lossy(&body)),
            _ => stage_lag::Scrape::default(),
        }
    }

    fn safe_time(&self) -> Result<u64> {
        self.safe_time_at("/v1/safe-time")
    }

    fn safe_time_at(&self, path: &str) -> Result<u64> {
        let (_, v) = self.get(path)?;
        Ok(v["safe_time"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0))
    }

    fn applied_records(&self) -> Result<u64> {
        let (_, v) = self.get("/v1/status")?;
        Ok(v["tablets"]
            .as_object()
            .map(|m| {
                m.values()
                    .filter_map(|t| t["applied_records"].as_u64())
                    .sum()
            })
            .unwrap_or(0))
    }
}
