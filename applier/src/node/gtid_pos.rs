//! Gtid positions through the front door, MariaDB's way of saying "caught up to here": the
//! visible position (the highest gtid per domain visible at the safe time, what
//! `@@gtid_current_pos` shows) and a wait until a position is visible (what
//! `MASTER_GTID_WAIT` does), as an async task in a place of the wait limit.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use tidelog_wal::{Gtid, HybridTime};

use super::applier::Applier;
use super::error::{Error, Result};
use super::trx_wait::MAX_TRX_WAIT;

/// A gtid position, MariaDB's `d-s-q[,d-s-q…]`: at most one gtid per domain, in domain
/// order. The empty string is the empty position.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GtidPos(pub Vec<Gtid>);

impl FromStr for GtidPos {
    type Err = Error;

    /// Parses `d-s-q[,d-s-q…]` (spaces around the commas allowed); a malformed gtid or a
    /// domain given twice is `Invalid`, naming it.
    fn from_str(s: &str) -> Result<GtidPos> {
        let mut out: Vec<Gtid> = Vec::new();
        for part in s.split(',').map(str::trim) {
            if part.is_empty() && s.trim().is_empty() {
                continue;
            }
            let g: Gtid = part
                .parse()
                .map_err(|e| Error::Invalid(format!("gtid position {s:?}: {part:?}: {e}")))?;
            if out.iter().any(|o| o.domain == g.domain) {
                return Err(Error::Invalid(format!(
                    "gtid position {s:?}: domain {} given twice",
                    g.domain
                )));
            }
            out.push(g);
        }
        out.sort_by_key(|g| g.domain);
        Ok(GtidPos(out))
    }
}

impl fmt::Display for GtidPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{g}")?;
        }
        Ok(())
    }
}

/// A wait given in (possibly fractional) seconds, as SQL clients give one: negative or
/// not a number is `Invalid`; longer than [`MAX_TRX_WAIT`] is capped to it.
pub fn wait_seconds(secs: f64) -> Result<Duration> {
    if secs.is_nan() || secs < 0.0 {
        return Err(Error::Invalid(format!(
            "a wait of {secs} seconds: must be a number ≥ 0"
        )));
    }
    Ok(Duration::try_from_secs_f64(secs)
        .unwrap_or(MAX_TRX_WAIT)
        .min(MAX_TRX_WAIT))
}

impl Applier {
    /// The highest gtid per domain visible at the published safe time (the empty position
    /// before any commit is visible, or before the safe time is initialized). A few point
    /// reads per domain: run it on the blocking pool.
    pub fn gtid_current_pos(&self) -> Result<GtidPos> {
        match self.consistency().safe_time() {
            None => Ok(GtidPos::default()),
            Some(safe) => Ok(GtidPos(self.store().binlog()?.visible_pos(safe)?)),
        }
    }

    /// Waits until every gtid of `pos` is visible at the safe time, or `timeout` (capped at
    /// [`MAX_TRX_WAIT`]) passes: `true` if it is. A gtid is visible once its commit is in
    /// the binlog at or below the safe time, or once a later commit of its domain is
    /// (binlog retention may have removed it). Waits as a task, in a place of the wait
    /// limit (`TooManyWaiters` when none is left), holding no thread; a check is a few
    /// point reads.
    pub async fn wait_gtid_pos(&self, pos: &GtidPos, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout.min(MAX_TRX_WAIT);
        let mut place = None;
        loop {
            let safe = self.consistency().safe_time();
            let Some(wanted) = self.gtid_pos_wants(pos, safe)? else {
                return Ok(true);
            };
            if Instant::now() >= deadline {
                return Ok(false);
            }
            if place.is_none() {
                place = Some(self.inner.waiters.enter()?);
            }
            if !self.consistency().wait_until(wanted, deadline).await {
                // The deadline passed, or nothing will move the safe time (a promoted
                // target): answer as it is now.
                let safe = self.consistency().safe_time();
                return Ok(self.gtid_pos_wants(pos, safe)?.is_none());
            }
        }
    }

    /// `None` when every gtid of `pos` is visible at `safe`; else the safe time to wait for
    /// before looking again: the commit_ht of a gtid the binlog holds, or the next safe
    /// time for one it does not hold yet.
    fn gtid_pos_wants(
        &self,
        pos: &GtidPos,
        safe: Option<HybridTime>,
    ) -> Result<Option<HybridTime>> {
        let next = safe.map_or(HybridTime(1), HybridTime::next);
        let binlog = self.store().binlog()?;
        for g in &pos.0 {
            if binlog.known_visible(*g) {
                continue;
            }
            if let Some(e) = binlog.gtid(g.domain, g.seq)? {
                if safe.is_some_and(|s| s >= e.commit_ht) {
                    binlog.note_visible(*g);
                    continue;
                }
                return Ok(Some(e.commit_ht));
            }
            let visible_later = match safe {
                Some(s) => binlog
                    .visible_pos(s)?
                    .iter()
                    .any(|v| v.domain == g.domain && v.seq >= g.seq),
                None => false,
            };
            if visible_later {
                binlog.note_visible(*g);
                continue;
            }
            return Ok(Some(next));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn positions_parse_and_print_in_domain_order() {
        let p: GtidPos = "1-1-7, 0-2-5".parse().unwrap();
        assert_eq!(p.to_string(), "0-2-5,1-1-7");
        assert_eq!("".parse::<GtidPos>().unwrap(), GtidPos::default());
        assert_eq!(GtidPos::default().to_string(), "");
        for bad in ["0-1", "0-1-2,", "x", "0-1-2,0-3-4", "0-1-2,,1-1-1"] {
            let e = bad.parse::<GtidPos>().unwrap_err();
            assert!(matches!(e, Error::Invalid(_)), "{bad}: {e}");
        }
    }

    #[test]
    fn waits_in_seconds_are_checked_and_capped() {
        assert_eq!(wait_seconds(0.5).unwrap(), Duration::from_millis(500));
        assert_eq!(wait_seconds(1e30).unwrap(), MAX_TRX_WAIT);
        assert_eq!(wait_seconds(f64::INFINITY).unwrap(), MAX_TRX_WAIT);
        assert!(wait_seconds(-1.0).is_err());
        assert!(wait_seconds(f64::NAN).is_err());
    }
}
