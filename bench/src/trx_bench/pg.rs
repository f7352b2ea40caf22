//! PostgreSQL's `pg_xact_status` baseline: the cluster the script starts, the client side,
//! thread pinning.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::pgwire::PgConn;
use crate::stats::fmt_int;

use super::*;

// ---- PostgreSQL ----

pub(super) struct PgCluster {
    pub(super) script: PathBuf,
    pub(super) dir: Option<PathBuf>,
}

impl PgCluster {
    pub(super) fn stop(&mut self) {
        if let Some(d) = self.dir.take() {
            match Command::new("bash")
                .arg(&self.script)
                .arg("stop")
                .arg(&d)
                .output()
            {
                Ok(o) if o.status.success() => {}
                Ok(o) => eprintln!(
                    "stopping the baseline PostgreSQL in {}: {}",
                    d.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(e) => eprintln!("stopping the baseline PostgreSQL in {}: {e}", d.display()),
            }
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Clone, Debug, Serialize)]
pub(super) struct PgInfo {
    pub(super) version: String,
    pub(super) xids: u64,
    pub(super) first_xid: u64,
    pub(super) last_xid: u64,
    pub(super) aborted: u64,
    pub(super) build_s: String,
    pub(super) settings: &'static str,
}

/// The PostgreSQL side of the comparison: a throwaway cluster with `--pg-xids` assigned
/// xids and one connection with the prepared look-up.
pub(super) struct PgSide {
    pub(super) info: PgInfo,
    pub(super) conn: PgConn,
    pub(super) cluster: PgCluster,
    pub(super) first: u64,
    pub(super) last: u64,
    pub(super) aborted: Vec<u64>,
    pub(super) aborted_set: HashSet<u64>,
    pub(super) rng: Rng,
    pub(super) answer: String,
}

/// Restricts the calling thread (and the processes it spawns from now on) to `cpus`.
pub(super) fn pin_thread(cpus: &[usize]) -> Result<()> {
    // SAFETY: `cpu_set_t` is plain data; CPU_SET writes within it for ids below
    // CPU_SETSIZE (checked); sched_setaffinity reads `size_of` bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as usize {
                bail!("CPU {c} is beyond CPU_SETSIZE");
            }
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!(
                "sched_setaffinity to CPUs {cpus:?}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

/// Look-ups per block when the admin API and PostgreSQL alternate.
pub(super) const API_PG_BLOCK: usize = 500;

/// The PostgreSQL row measured beside `case`.
pub(super) fn pg_case_name(case: Case) -> String {
    format!("{} xid beside {}", pg_want(case), case.name())
}

/// The `pg_xact_status` answer a case expects.
pub(super) fn pg_want(case: Case) -> &'static str {
    if case.hit() {
        "committed"
    } else {
        "aborted"
    }
}

impl PgSide {
    /// `n` xids to look up for `case`: committed ones for hits, aborted ones for misses.
    pub(super) fn ids(&mut self, case: Case, n: u64) -> Vec<String> {
        (0..n)
            .map(|_| {
                if case.hit() {
                    loop {
                        let x = self.first + 1 + self.rng.below(self.last - self.first - 1);
                        if !self.aborted_set.contains(&x) {
                            break x.to_string();
                        }
                    }
                } else {
                    self.aborted[self.rng.below(self.aborted.len() as u64) as usize].to_string()
                }
            })
            .collect()
    }

    /// One `pg_xact_status` look-up, checked.
    pub(super) fn lookup(&mut self, case: Case, xid: &str) -> Result<()> {
        let want = pg_want(case);
        let got = self.conn.query_one("st", &[xid], &mut self.answer)?;
        if !got || self.answer != want {
            bail!(
                "pg_xact_status({xid}) answered {:?}, expected {want}",
                self.answer
            );
        }
        Ok(())
    }

    pub(super) fn stop(self) {
        let PgSide {
            conn, mut cluster, ..
        } = self;
        drop(conn);
        cluster.stop();
    }
}

pub(super) fn start_pg(args: &TrxArgs, work: &Path) -> Result<PgSide> {
    let script = work.join("pg-baseline.sh");
    std::fs::write(&script, PG_SCRIPT).with_context(|| format!("writing {}", script.display()))?;
    let xids = args.pg_xids.unwrap_or(args.commits);
    println!(
        "  starting a throwaway PostgreSQL and assigning {} xids (every {PG_ABORT_EVERY}th rolled back) ...",
        fmt_int(xids)
    );
    let t0 = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .arg("start")
        .arg(xids.to_string())
        .arg(PG_ABORT_EVERY.to_string())
        .output()
        .context("running bash pg-baseline.sh")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let kv = |k: &str| -> Option<String> {
        text.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
            .map(str::to_string)
    };
    // Owns the cluster from here, so every error path below stops it.
    let cluster = PgCluster {
        script: script.clone(),
        dir: kv("dir").map(PathBuf::from),
    };
    if !out.status.success() {
        bail!(
            "pg-baseline.sh start failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let need =
        |k: &str| kv(k).ok_or_else(|| anyhow!("pg-baseline.sh printed no {k}= line: {text}"));
    let num = |k: &str| -> Result<u64> {
        need(k)?
            .trim()
            .parse()
            .map_err(|e| anyhow!("pg-baseline.sh: {k}= is not a number: {e}"))
    };
    let socket_dir = PathBuf::from(need("socket_dir")?);
    let port: u16 = num("port")?
        .try_into()
        .map_err(|_| anyhow!("pg-baseline.sh: port out of range"))?;
    let (first, last) = (num("first_xid")?, num("last_xid")?);
    let aborted_file = PathBuf::from(need("aborted_file")?);
    let aborted: Vec<u64> = std::fs::read_to_string(&aborted_file)
        .with_context(|| format!("reading {}", aborted_file.display()))?
        .lines()
        .enumerate()
        .map(|(i, l)| {
            l.trim().parse().map_err(|e| {
                anyhow!(
                    "{} line {}: {l:?} is not an xid: {e}",
                    aborted_file.display(),
                    i + 1
                )
            })
        })
        .collect::<Result<_>>()?;
    if aborted.is_empty() || last <= first + 2 {
        bail!(
            "the baseline PostgreSQL has no xid range to look up ({first}..{last}, {} aborted)",
            aborted.len()
        );
    }
    let info = PgInfo {
        version: need("version")?,
        xids,
        first_xid: first,
        last_xid: last,
        aborted: aborted.len() as u64,
        build_s: need("build_s")?,
        settings: "initdb --auth=trust; fsync=off synchronous_commit=off full_page_writes=off autovacuum=off; Unix socket only; shared_buffers default (128MB)",
    };
    println!(
        "  PostgreSQL {} up in {:.1} s: xids {first}..{last} assigned in {} s ({} aborted)",
        info.version,
        t0.elapsed().as_secs_f64(),
        info.build_s,
        fmt_int(info.aborted)
    );
    let mut conn = PgConn::connect(&socket_dir, port, "postgres", "postgres")?;
    conn.prepare("st", "SELECT pg_xact_status($1::xid8)")?;
    let aborted_set: HashSet<u64> = aborted.iter().copied().collect();
    Ok(PgSide {
        info,
        conn,
        cluster,
        first,
        last,
        aborted,
        aborted_set,
        rng: Rng(args.seed ^ 0x5047),
        answer: String::new(),
    })
}
