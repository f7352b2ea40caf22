//! Reading the visible binlog from a gtid: the commits at or below the safe time in commit
//! order, and for a gtid that cannot start the read, whether binlog retention removed it
//! (`GtidExpired`, naming the oldest retained in its domain) or it is not visible
//! (`GtidNotVisible`: not yet, or never).

use tidelog_wal::{Gtid, HybridTime};

use super::applier::Applier;
use super::error::{Error, Result};
use crate::binlog::BinlogEntry;

/// A page of the visible binlog.
#[derive(Clone, Debug)]
pub struct BinlogPage {
    /// The safe time it was read at (`None`: not initialized, and no entries).
    pub safe_time: Option<HybridTime>,
    pub entries: Vec<BinlogEntry>,
    /// More entries follow beyond the limit.
    pub more: bool,
}

impl Applier {
    /// Up to `limit` visible commits from gtid `from` (inclusive), or from the oldest
    /// retained. Blocking (store reads).
    pub fn binlog(&self, from: Option<Gtid>, limit: usize) -> Result<BinlogPage> {
        let safe = self.consistency().safe_time();
        let Some(upto) = safe else {
            return Ok(BinlogPage {
                safe_time: None,
                entries: Vec::new(),
                more: false,
            });
        };
        let bl = self.store().binlog()?;
        let start = match from {
            None => None,
            Some(g) => match bl.gtid(g.domain, g.seq)? {
                Some(e) if e.commit_ht <= upto => Some((e.commit_ht, e.tablet)),
                Some(_) | None => {
                    let horizon = self.store().binlog_horizon()?;
                    let first = bl.first_in_domain(g.domain)?;
                    return Err(match first {
                        Some(f) if g.seq < f.gtid.seq && horizon > HybridTime::MIN => {
                            Error::GtidExpired {
                                gtid: g,
                                domain: g.domain,
                                oldest: f.gtid,
                            }
                        }
                        _ => Error::GtidNotVisible {
                            gtid: g,
                            safe_time: upto,
                        },
                    });
                }
            },
        };
        let (entries, more) = bl.read(start.as_ref().map(|(h, t)| (*h, t)), upto, limit)?;
        Ok(BinlogPage {
            safe_time: safe,
            entries,
            more,
        })
    }
}
