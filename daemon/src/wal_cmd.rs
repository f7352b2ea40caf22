//! `tidelog wal dump|append|check`: the WAL as JSON lines, and its verification.
//!
//! * `dump` prints every record as one JSON line (docs/ARCHITECTURE.md, "The source WAL"),
//!   tablets in sorted order, each in log order, up to `durable_pos` (or `written_pos` with
//!   `--written`; a tablet without a control file is scanned to the end of its valid
//!   records).
//! * `append` reads such lines on stdin and appends each as one commit to its tablet. The
//!   first bad line stops it: everything before it is written and durable, nothing of it is.
//!   A line must name its tablet, unless `--tablet T` is given: then a line without a
//!   `tablet` field goes to T, and a line naming another tablet is an error. Besides what
//!   the writer refuses (a key over the limit, an ht not above the last or ahead of the
//!   clock, a commit naming no participant; FORMAT.md), `append` refuses a commit of a
//!   transaction that wrote no intent, as far as the logs can tell: none of its
//!   participants holds an intent of it, and none can get one any more (an intent lies
//!   below its commit's ht, so a participant whose log already reaches that ht, or the
//!   commit's own tablet, is complete for it). A participant whose log is not there yet
//!   may still get them later in the input (`dump` lists tablets one after another), so
//!   such a commit is taken. A line longer than [`MAX_LINE`] is refused unread.
//! * `check` reads every record of every segment, validating checksums, positions, ht order
//!   and segment contiguity, and compares the end reached with the control file's
//!   `durable_pos`. An entry of the WAL directory that is not a tablet, or a tablet that
//!   fails, is reported and the others are still checked; the exit status is non-zero if
//!   anything was wrong.
//!
//! `dump | append --dir D2` reproduces the log: a dump of `D2` is byte-for-byte the first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use tidelog_wal::control::ControlView;
use tidelog_wal::format::{DEFAULT_SEGMENT_SIZE, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use tidelog_wal::json::{from_json_line_at, write_json_line};
use tidelog_wal::reader::{list_tablets, scan_tablets};
use tidelog_wal::{
    Body, Error as WalError, HybridClock, HybridTime, ReadLimit, Reader, Record, SyncPolicy,
    TabletId, TxnId, WalOptions, WalPos, Writer,
};

/// The longest input line `wal append` reads: a record body is at most 16 MiB, and the
/// JSON form of its bytes at most about six times that (`\u00XX` escapes).
pub const MAX_LINE: u64 = 128 << 20;

/// `tidelog wal …`
#[derive(Debug, Args)]
pub struct WalArgs {
    #[command(subcommand)]
    command: WalCommand,
}

#[derive(Debug, Subcommand)]
enum WalCommand {
    /// Print records as JSON lines on stdout.
    Dump(DumpArgs),
    /// Append records given as JSON lines on stdin, one commit per line.
    Append(AppendArgs),
    /// Verify every segment and record; print a summary line per tablet.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
struct DumpArgs {
    /// The WAL directory (one sub-directory per tablet).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Only this tablet.
    #[arg(long, value_name = "TABLET")]
    tablet: Option<TabletId>,
    /// Start at this record position (decimal or 0x hex); needs --tablet.
    #[arg(long, value_name = "POS", requires = "tablet")]
    from: Option<WalPos>,
    /// Read up to written_pos (committed, maybe not yet durable) instead of durable_pos.
    #[arg(long)]
    written: bool,
}

#[derive(Debug, Args)]
struct AppendArgs {
    /// The WAL directory (created if missing).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// The tablet of lines without a "tablet" field; a line naming another tablet is an
    /// error. Without it every line must name its tablet.
    #[arg(long, value_name = "TABLET")]
    tablet: Option<TabletId>,
    /// When each line's commit becomes durable; everything is synced before exit anyway.
    #[arg(long, value_enum, default_value_t = SyncArg::Batch)]
    sync: SyncArg,
    /// Size of new segment files: bytes, or with a unit (KiB, MiB, GiB; KB, MB, GB).
    #[arg(long, value_name = "SIZE", value_parser = tidelog::config::parse_size)]
    segment_size: Option<u64>,
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// The WAL directory (one sub-directory per tablet).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Only this tablet.
    #[arg(long, value_name = "TABLET")]
    tablet: Option<TabletId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SyncArg {
    /// msync before each commit returns.
    Always,
    /// Group commit.
    Batch,
    /// No sync per commit.
    None,
}

impl From<SyncArg> for SyncPolicy {
    fn from(s: SyncArg) -> SyncPolicy {
        match s {
            SyncArg::Always => SyncPolicy::Always,
            SyncArg::Batch => SyncPolicy::Batch,
            SyncArg::None => SyncPolicy::None,
        }
    }
}

pub fn run(args: WalArgs) -> Result<()> {
    match args.command {
        WalCommand::Dump(a) => dump(&a),
        WalCommand::Append(a) => append(&a),
        WalCommand::Check(a) => check(&a),
    }
}

/// The file name of the segment starting at `first` (FORMAT.md: 16 lowercase hex digits).
fn segment_file_name(first: WalPos) -> String {
    format!("{:016x}.seg", first.get())
}

fn tablets_of(dir: &Path, only: Option<&TabletId>) -> Result<Vec<TabletId>> {
    match only {
        Some(t) => Ok(vec![t.clone()]),
        None => list_tablets(dir).with_context(|| format!("listing tablets in {}", dir.display())),
    }
}

/// Opens a reader, or `None` for a tablet directory that holds no segment yet (and whose
/// control file, if any, does not claim otherwise).
fn open_reader(wal_dir: &Path, tablet: &TabletId, limit: ReadLimit) -> Result<Option<Reader>> {
    let truncated = match Reader::open(wal_dir, tablet, limit) {
        Ok(r) if !r.segment_starts().is_empty() => return Ok(Some(r)),
        // No segment (yet): the log is empty if its control file says so.
        Ok(_) => None,
        Err(e @ WalError::Truncated { .. }) => Some(e),
        Err(e) => return Err(e.into()),
    };
    let dir = wal_dir.join(tablet.as_str());
    let has_segments = std::fs::read_dir(&dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().ends_with(".seg"));
    if let (true, Some(e)) = (has_segments, truncated) {
        return Err(e.into());
    }
    if let Some(c) = ControlView::open(&dir)? {
        if c.written() > c.oldest() || c.durable() > c.oldest() {
            bail!(
                "tablet {tablet}: the control file {} says the log reaches position {} but there are no segment files",
                dir.join("control").display(),
                c.written().max(c.durable())
            );
        }
    }
    Ok(None)
}

// -------------------------------------------------------------------------------------------
// dump
// -------------------------------------------------------------------------------------------

fn dump(a: &DumpArgs) -> Result<()> {
    let tablets = tablets_of(&a.dir, a.tablet.as_ref())?;
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 20, stdout.lock());
    let res = dump_into(a, &tablets, &mut out);
    // What was read before an error is printed, then the error. A reader that went away
    // (`| head`) ends the dump quietly (`tidelog::output`).
    let flushed = match out.flush() {
        Err(e) if tidelog::output::reader_gone(&e) => Ok(()),
        r => r.context("writing stdout"),
    };
    res.and(flushed)
}

fn dump_into(a: &DumpArgs, tablets: &[TabletId], out: &mut impl Write) -> Result<()> {
    let mut line = String::with_capacity(64 << 10);
    for t in tablets {
        let tdir = a.dir.join(t.as_str());
        let limit = match ControlView::open(&tdir)? {
            None => ReadLimit::Scan,
            Some(_) if a.written => ReadLimit::Written,
            Some(_) => ReadLimit::Durable,
        };
        let Some(mut r) = open_reader(&a.dir, t, limit)? else {
            if let Some(from) = a.from {
                bail!("tablet {t}: --from {from}: the tablet has no records");
            }
            continue;
        };
        if let Some(from) = a.from {
            r.seek(from).with_context(|| format!("--from {from}"))?;
        }
        loop {
            let next = match r.next() {
                Ok(n) => n,
                Err(e) => {
                    let err = anyhow::Error::from(e);
                    return Err(match a.from {
                        Some(from) if r.position() == from => {
                            err.context(format!("--from {from} (not a record position?)"))
                        }
                        _ => err,
                    });
                }
            };
            let Some((pos, rec)) = next else { break };
            line.clear();
            write_json_line(&mut line, t, pos, &rec);
            line.push('\n');
            match out.write_all(line.as_bytes()) {
                Ok(()) => {}
                Err(e) if tidelog::output::reader_gone(&e) => return Ok(()),
                Err(e) => return Err(anyhow::Error::from(e).context("writing stdout")),
            }
        }
    }
    Ok(())
}

// -------------------------------------------------------------------------------------------
// append
// -------------------------------------------------------------------------------------------

struct Appended {
    writer: Writer,
    records: u64,
}

fn append(a: &AppendArgs) -> Result<()> {
    let opts = WalOptions {
        segment_size: a.segment_size.unwrap_or(DEFAULT_SEGMENT_SIZE),
        ..Default::default()
    };
    opts.validate().context("--segment-size")?;
    let mut writers = BTreeMap::new();
    let stdin = io::stdin();
    let input = BufReader::with_capacity(1 << 20, stdin.lock());
    let fed = feed(
        &a.dir,
        a.tablet.as_ref(),
        &opts,
        a.sync.into(),
        input,
        &mut writers,
    );
    // Whether or not a line was bad: make everything appended durable, then report.
    let finished = finish(writers);
    fed.and(finished)
}

/// Parses one input line; with `default_tablet`, a line without a `tablet` field is that
/// tablet's and a line naming another tablet is refused.
/// `now` gives the hybrid time of `"ht":"now"` for a tablet.
fn parse_line(
    line: &str,
    default_tablet: Option<&TabletId>,
    now: &mut dyn FnMut(&TabletId) -> std::result::Result<HybridTime, String>,
) -> Result<(TabletId, Record)> {
    let (tablet, rec) = from_json_line_at(line, default_tablet, now)?;
    if let Some(t) = default_tablet {
        if tablet != *t {
            bail!("the line's tablet {tablet} is not the tablet given with --tablet {t}");
        }
    }
    Ok((tablet, rec))
}

fn feed(
    wal_dir: &Path,
    default_tablet: Option<&TabletId>,
    opts: &WalOptions,
    sync: SyncPolicy,
    mut input: impl BufRead,
    writers: &mut BTreeMap<TabletId, Appended>,
) -> Result<()> {
    let mut buf = Vec::with_capacity(64 << 10);
    let mut n: u64 = 0;
    let mut txns = TxnCheck::default();
    // `"ht":"now"`: this clock, above the tablet's last ht (so consecutive lines, and a log
    // written by an earlier append, never get an ht that is not increasing).
    let clock = HybridClock::new();
    loop {
        buf.clear();
        let got = io::Read::take(input.by_ref(), MAX_LINE + 1)
            .read_until(b'\n', &mut buf)
            .with_context(|| format!("line {}: reading stdin", n + 1))?;
        if got == 0 {
            return Ok(());
        }
        n += 1;
        if got as u64 > MAX_LINE {
            bail!(
                "line {n}: longer than {} MiB; no record's JSON line can be that long",
                MAX_LINE >> 20
            );
        }
        let line = std::str::from_utf8(&buf).with_context(|| {
            format!(
                "line {n}: not valid UTF-8 (keys and values that are not UTF-8 are written as {{\"b64\":\"...\"}})"
            )
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let mut used_now = false;
        let (tablet, mut rec) = parse_line(line, default_tablet, &mut |_| {
            used_now = true;
            Ok(clock.now())
        })
        .with_context(|| format!("line {n}"))?;
        if used_now {
            let entry = writer_for(writers, wal_dir, opts, &tablet, n)?;
            if let Some(last) = entry.writer.last_ht().filter(|last| rec.ht <= *last) {
                clock.observe(last);
                rec.ht = clock.now();
            }
        }
        if let Body::Commit {
            txn, participants, ..
        } = &rec.body
        {
            txns.check_commit(wal_dir, &tablet, rec.ht, *txn, participants, writers)
                .with_context(|| format!("line {n}: tablet {tablet}"))?;
        }
        let entry = writer_for(writers, wal_dir, opts, &tablet, n)?;
        entry
            .writer
            .append(&rec)
            .with_context(|| format!("line {n}"))?;
        entry
            .writer
            .commit(sync)
            .with_context(|| format!("line {n}: commit"))?;
        entry.records += 1;
        match &rec.body {
            Body::Intent { txn, .. } => txns.intent_written(&tablet, *txn),
            Body::Commit { txn, .. } | Body::Abort { txn, .. } => txns.decided(*txn),
            _ => {}
        }
    }
}

/// The writer of `tablet`, opened (for line `n`) on first use.
fn writer_for<'a>(
    writers: &'a mut BTreeMap<TabletId, Appended>,
    wal_dir: &Path,
    opts: &WalOptions,
    tablet: &TabletId,
    n: u64,
) -> Result<&'a mut Appended> {
    if !writers.contains_key(tablet) {
        let w = Writer::open(wal_dir, tablet, opts.clone()).with_context(|| {
            format!(
                "line {n}: opening the log of tablet {tablet} in {}",
                wal_dir.display()
            )
        })?;
        writers.insert(
            tablet.clone(),
            Appended {
                writer: w,
                records: 0,
            },
        );
    }
    writers
        .get_mut(tablet)
        .with_context(|| format!("line {n}: tablet {tablet} has no writer"))
}

/// What `append` knows of the intents in the logs it writes to, to refuse the commit of a
/// transaction that wrote none (module doc).
#[derive(Default)]
struct TxnCheck {
    /// Per tablet looked at: what its log holds, read once when first needed and kept up
    /// to date with the intents appended since.
    logs: HashMap<TabletId, LogIntents>,
}

/// The undecided transactions with an intent in one tablet's log, and its last ht.
#[derive(Default)]
struct LogIntents {
    /// `false` when the log could not be read: nothing can be concluded from it.
    known: bool,
    last_ht: Option<HybridTime>,
    intents: HashSet<TxnId>,
}

/// Intents remembered per tablet before its entry is dropped (it is read again if needed).
const MAX_REMEMBERED_INTENTS: usize = 1 << 20;

impl TxnCheck {
    fn check_commit(
        &mut self,
        wal_dir: &Path,
        tablet: &TabletId,
        commit_ht: HybridTime,
        txn: TxnId,
        participants: &[TabletId],
        writers: &BTreeMap<TabletId, Appended>,
    ) -> Result<()> {
        // (A commit naming no participant at all is the writer's to refuse.)
        for p in participants {
            let log = self
                .logs
                .entry(p.clone())
                .or_insert_with(|| read_intents(wal_dir, p));
            if !log.known || log.intents.contains(&txn) {
                return Ok(());
            }
            let last = match writers.get(p) {
                Some(a) => a.writer.last_ht(),
                None => log.last_ht,
            };
            // Can an intent of `txn` still come to `p`? Only below the commit's ht.
            if p != tablet && last.is_none_or(|h| h < commit_ht) {
                return Ok(());
            }
        }
        if participants.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = participants.iter().map(ToString::to_string).collect();
        bail!(
            "the commit of txn {txn} at ht {commit_ht}: none of its participants [{}] holds an intent of it, and none can get one any more (its intents must lie below the commit's ht); a transaction that wrote no intent has nothing to commit",
            names.join(", ")
        )
    }

    fn intent_written(&mut self, tablet: &TabletId, txn: TxnId) {
        if let Some(log) = self.logs.get_mut(tablet) {
            if log.intents.len() >= MAX_REMEMBERED_INTENTS {
                self.logs.remove(tablet);
            } else {
                log.intents.insert(txn);
            }
        }
    }

    /// A decision for `txn` was written: its intents need no remembering any more.
    fn decided(&mut self, txn: TxnId) {
        for log in self.logs.values_mut() {
            log.intents.remove(&txn);
        }
    }
}

/// The transactions with an intent in the log of `t` as it is now, and its last ht.
fn read_intents(wal_dir: &Path, t: &TabletId) -> LogIntents {
    let mut out = LogIntents {
        known: true,
        ..Default::default()
    };
    let dir = wal_dir.join(t.as_str());
    if !dir.is_dir() {
        return out;
    }
    let limit = match ControlView::open(&dir) {
        Ok(Some(_)) => ReadLimit::Written,
        Ok(None) => ReadLimit::Scan,
        Err(_) => return LogIntents::default(),
    };
    let r = match open_reader(wal_dir, t, limit) {
        Ok(Some(r)) => r,
        Ok(None) => return out,
        Err(_) => return LogIntents::default(),
    };
    for item in r {
        match item {
            Ok((_, rec)) => {
                out.last_ht = Some(rec.ht);
                match rec.body {
                    Body::Intent { txn, .. } => {
                        out.intents.insert(txn);
                    }
                    Body::Commit { txn, .. } | Body::Abort { txn, .. } => {
                        out.intents.remove(&txn);
                    }
                    _ => {}
                }
            }
            Err(_) => return LogIntents::default(),
        }
    }
    out
}

/// Syncs and closes every writer, then prints what was appended.
fn finish(writers: BTreeMap<TabletId, Appended>) -> Result<()> {
    let mut first_err: Option<anyhow::Error> = None;
    let total: u64 = writers.values().map(|a| a.records).sum();
    let mut lines = Vec::with_capacity(writers.len());
    for (t, mut a) in writers {
        let end = a.writer.written_pos();
        let synced = a
            .writer
            .sync()
            .map(|_| ())
            .and_then(|()| a.writer.close())
            .with_context(|| format!("tablet {t}: final sync"));
        if let Err(e) = synced {
            first_err.get_or_insert(e);
        }
        lines.push(format!(
            "  {t}: {} record{}, log end {end}",
            a.records,
            if a.records == 1 { "" } else { "s" }
        ));
    }
    eprintln!(
        "tidelog wal append: {total} record{} appended to {} tablet{}",
        if total == 1 { "" } else { "s" },
        lines.len(),
        if lines.len() == 1 { "" } else { "s" }
    );
    for l in lines {
        eprintln!("{l}");
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

// -------------------------------------------------------------------------------------------
// check
// -------------------------------------------------------------------------------------------

/// What checking one tablet found.
#[derive(Debug)]
struct TabletCheck {
    segments: usize,
    records: u64,
    first: WalPos,
    end: WalPos,
    first_ht: Option<HybridTime>,
    last_ht: Option<HybridTime>,
    durable: Option<WalPos>,
    warnings: Vec<String>,
}

impl TabletCheck {
    fn summary(&self, t: &TabletId) -> String {
        let ht = match (self.first_ht, self.last_ht) {
            (Some(a), Some(b)) => format!("{a}..{b}"),
            _ => "-".into(),
        };
        let durable = match self.durable {
            Some(d) => d.to_string(),
            None => "-".into(),
        };
        format!(
            "{t}: ok segments={} records={} pos={}..{} ht={ht} bytes={} durable={durable}",
            self.segments,
            self.records,
            self.first,
            self.end,
            self.end.since(self.first),
        )
    }
}

fn check(a: &CheckArgs) -> Result<()> {
    // Entries that are not tablets are problems to report, not a reason to stop.
    let (tablets, others) = match &a.tablet {
        Some(t) => (vec![t.clone()], Vec::new()),
        None => scan_tablets(&a.dir)
            .with_context(|| format!("listing tablets in {}", a.dir.display()))?,
    };
    if tablets.is_empty() && others.is_empty() {
        eprintln!("no tablets in {}", a.dir.display());
        return Ok(());
    }
    let mut problems = Vec::new();
    for e in others {
        eprintln!("error: {e}");
        problems.push(e.to_string());
    }
    let mut failed = 0usize;
    for t in &tablets {
        match check_tablet(&a.dir, t) {
            Ok(c) => {
                for w in &c.warnings {
                    eprintln!("warning: {w}");
                }
                println!("{}", c.summary(t));
            }
            Err(e) => {
                failed += 1;
                eprintln!("error: {e:#}");
                problems.push(format!("tablet {t} failed its check (above)"));
            }
        }
    }
    if !problems.is_empty() {
        bail!(
            "check failed for {failed} of {} tablet{}; {} problem{}: {}",
            tablets.len(),
            if tablets.len() == 1 { "" } else { "s" },
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            problems.join("; ")
        );
    }
    Ok(())
}

fn check_tablet(wal_dir: &Path, t: &TabletId) -> Result<TabletCheck> {
    let dir = wal_dir.join(t.as_str());
    // Read the control file before the segments: durable_pos only rises, and everything
    // below the value read now must be there however far a live writer gets meanwhile.
    let control = ControlView::open(&dir)?;
    let durable = control.as_ref().map(ControlView::durable);
    let written = control.as_ref().map(ControlView::written);
    let mut c = TabletCheck {
        segments: 0,
        records: 0,
        first: WalPos::ZERO,
        end: WalPos::ZERO,
        first_ht: None,
        last_ht: None,
        durable,
        warnings: Vec::new(),
    };
    let Some(mut r) = open_reader(wal_dir, t, ReadLimit::Scan)? else {
        return Ok(c);
    };
    let starts = r.segment_starts().to_vec();
    c.segments = starts.len();
    c.first = r.position();
    if let Some(ctl) = &control {
        if c.first > ctl.oldest() {
            bail!(
                "tablet {t}: segments are missing: the control file says the oldest retained position is {}, but the first segment ({}) starts at {}",
                ctl.oldest(),
                segment_file_name(c.first),
                c.first
            );
        }
    }
    let last_start = starts.last().copied().unwrap_or_default();
    // Index of the segment holding position `p`.
    let seg_of = |p: WalPos| starts.partition_point(|s| *s <= p).saturating_sub(1);
    let file_at = |p: WalPos| {
        let first = starts.get(seg_of(p)).copied().unwrap_or_default();
        (
            dir.join(segment_file_name(first)),
            SEGMENT_HEADER_LEN as u64 + p.since(first),
        )
    };
    loop {
        let at = r.position();
        match r.next() {
            Ok(Some((p, rec))) => {
                let q = r.position();
                if let Some(&next) = starts.get(seg_of(p) + 1) {
                    if q > next {
                        let (file, off) = file_at(p);
                        bail!(
                            "corruption in tablet {t}, file {}, offset {off}: the record at position {p} ends at {q}, past position {next} where the next segment begins",
                            file.display()
                        );
                    }
                }
                c.records += 1;
                c.first_ht.get_or_insert(rec.ht);
                c.last_ht = Some(rec.ht);
            }
            Ok(None) => break,
            Err(e) => {
                // A bad record at or past durable_pos in the last segment is a torn tail
                // (an unsynced write cut by a crash): the writer's recovery cuts it there.
                if durable.is_some_and(|d| at >= d) && at >= last_start {
                    c.warnings.push(format!(
                        "tablet {t}: torn tail after durable_pos {}, at position {at} (recovery will cut the log there): {e}",
                        durable.unwrap_or_default()
                    ));
                    break;
                }
                let err = anyhow::Error::from(e);
                return Err(match durable {
                    Some(d) if at < d => err.context(format!(
                        "tablet {t}: durable data damaged: bad record at position {at}, below durable_pos {d}"
                    )),
                    _ => err,
                });
            }
        }
    }
    c.end = r.position();
    // The scan stops at the first all-zero header; that must be in the last segment.
    if c.end < last_start {
        let (file, off) = file_at(c.end);
        let next = starts.get(seg_of(c.end) + 1).copied().unwrap_or(last_start);
        bail!(
            "corruption in tablet {t}, file {}, offset {off}: the records end at position {} but the next segment begins at {next}",
            file.display(),
            c.end
        );
    }
    // A sealed segment's unused tail is zero: where the next segment begins, no further
    // record may follow in the old file.
    for w in starts.windows(2) {
        check_sealed_tail(&dir, t, w[0], w[1])?;
    }
    if let Some(d) = durable {
        if c.end < d {
            let (file, off) = file_at(c.end);
            bail!(
                "tablet {t}: durable data damaged: the valid records end at position {} (file {}, offset {off}) but the control file's durable_pos is {d}",
                c.end,
                file.display()
            );
        }
    }
    if let Some(w) = written {
        if c.end < w {
            c.warnings.push(format!(
                "tablet {t}: the records end at position {} but written_pos is {w}: commits after durable_pos {} are lost",
                c.end,
                durable.unwrap_or_default()
            ));
        }
    }
    Ok(c)
}

fn check_sealed_tail(dir: &Path, t: &TabletId, first: WalPos, next: WalPos) -> Result<()> {
    let path = dir.join(segment_file_name(first));
    let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let off = SEGMENT_HEADER_LEN as u64 + next.since(first);
    let mut buf = [0u8; RECORD_HEADER_LEN];
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
    if buf[..n].iter().any(|&b| b != 0) {
        bail!(
            "corruption in tablet {t}, file {}, offset {off}: non-zero bytes after the last record of a sealed segment (the next segment begins at position {next})",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tidelog::config::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("10MB"), Ok(10_000_000));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("99999999999999TiB").is_err());
    }
}
