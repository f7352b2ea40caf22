//! `tidelog`: the command-line entry point (README.md, `docs/operations.md`).
//!
//! Commands: the daemons `apply` and `ship`, `demo`, `ctl` (the admin API's client),
//! `certs init` and `wal dump|append|check`; their building blocks (config, admin server,
//! systemd notify, signals, metrics) are in the `tidelog` library.
//!
//! Exit codes: 0 success, 1 failure (the message is on stderr), 2 bad command line. The
//! daemons (`apply`, `ship`) also exit 143 on a second SIGTERM, 130 on a second SIGINT and
//! 131 on SIGQUIT (at once, see `tidelog::signals`); `demo` exits 143 / 130 when a SIGTERM /
//! SIGINT stopped it (after stopping its daemons and removing its directory, see
//! `tidelog::demo`).
//!
//! Logs go to stderr, plain (no ANSI colours) unless stderr is a terminal, without
//! timestamps when stderr is the journal (`JOURNAL_STREAM`, which systemd sets; journald
//! stamps each line itself). The level: `--log-level`, else RUST_LOG, else the daemon
//! config's `log-level`, else a default per command.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use tidelog::ctl;
use tidelog::demo::DemoEnd;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's malloc: the apply path allocates and frees small objects on
/// many threads (decoded records, batch items); glibc's arenas spent 17–20 % of the
/// applier's samples in `malloc`/`free`/`malloc_consolidate` (BENCHMARKS.md, changelog).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod wal_cmd;

/// tidelog: log shipping for disaster recovery of sharded transactional databases.
#[derive(Debug, Parser)]
#[command(name = "tidelog", version, about, propagate_version = true)]
struct Cli {
    /// Log filter for diagnostics on stderr (e.g. `info`, `debug`,
    /// `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons'
    /// `log-level` config key; without any, daemons log at `info` and the other commands
    /// warnings and errors only.
    #[arg(long, global = true, value_name = "FILTER")]
    log_level: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the applier daemon (target side): QUIC intake, apply, admin API.
    Apply(DaemonArgs),
    /// Run the shipper daemon (source side): tail the WALs and ship them.
    Ship(DaemonArgs),
    /// Everything on one machine: applier, shipper and a bank workload, with consistency checks.
    Demo(tidelog::demo::DemoArgs),
    /// Inspect, verify and write tablet WALs (`dump`, `append`, `check`).
    Wal(wal_cmd::WalArgs),
    /// Create the CA and the mTLS certificates of both daemons.
    Certs(CertsArgs),
    /// Talk to a running daemon through its admin socket.
    #[command(after_help = ctl::EXIT_STATUS_HELP)]
    Ctl(ctl::CtlArgs),
    /// Write the man pages or the shell completions (for packaging).
    #[command(hide = true)]
    Generate(GenerateArgs),
}

/// `tidelog generate man|completions DIR`
#[derive(Debug, Args)]
struct GenerateArgs {
    /// `man`: tidelog.1 and a page per subcommand (tidelog-ctl.1, tidelog-ctl-status.1, …);
    /// `completions`: tidelog.bash, _tidelog (zsh) and tidelog.fish.
    #[arg(value_enum)]
    what: Generated,
    /// Output directory (created if missing).
    dir: PathBuf,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Generated {
    Man,
    Completions,
}

/// Writes what `tidelog generate` is asked for from the clap definitions; the paths written.
fn generate(args: &GenerateArgs) -> Result<Vec<PathBuf>> {
    use clap::CommandFactory;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let mut cmd = Cli::command();
    let mut written = Vec::new();
    match args.what {
        Generated::Man => {
            // tidelog.1, tidelog-ctl.1, tidelog-ctl-status.1, … (hidden commands left out).
            clap_mangen::generate_to(cmd, &args.dir)
                .with_context(|| format!("writing man pages to {}", args.dir.display()))?;
            for e in std::fs::read_dir(&args.dir)? {
                let p = e?.path();
                if p.extension().is_some_and(|x| x == "1") {
                    written.push(p);
                }
            }
            written.sort();
        }
        Generated::Completions => {
            use clap_complete::Shell;
            for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
                let path = clap_complete::generate_to(shell, &mut cmd, "tidelog", &args.dir)
                    .with_context(|| format!("writing {shell} completions"))?;
                written.push(path);
            }
        }
    }
    Ok(written)
}

/// `tidelog apply|ship …`
#[derive(Debug, Args)]
struct DaemonArgs {
    /// The daemon's TOML configuration file.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Parse and validate the configuration, load the TLS files it names and build the TLS
    /// configuration from them (and, for `ship`, probe io_uring as `io-engine` asks), then
    /// exit: everything start-up does before its first side effect.
    #[arg(long)]
    check: bool,
}

/// `tidelog certs …`
#[derive(Debug, Args)]
struct CertsArgs {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Debug, Subcommand)]
enum CertsCommand {
    /// Write ca.pem ca.key applier.pem applier.key shipper.pem shipper.key into DIR (keys
    /// mode 0600). The applier certificate names localhost, 127.0.0.1 and every --san.
    Init {
        /// Output directory (created if missing).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// Another name for the applier certificate: an IP address or a DNS name. Repeatable.
        #[arg(long = "san", value_name = "NAME")]
        sans: Vec<String>,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
}

impl Command {
    /// The log filter used when neither `--log-level` nor RUST_LOG is given: a daemon's
    /// `log-level` config key (`info` if absent, not a valid filter, or if the config cannot
    /// be read — the daemon then fails with the config error itself, exit 1, naming the
    /// file and the key), else a default per command.
    fn default_log_filter(&self) -> String {
        let valid = |level: String| {
            if EnvFilter::try_new(&level).is_ok() {
                level
            } else {
                tidelog::config::DEFAULT_LOG_LEVEL.into()
            }
        };
        match self {
            // A one-shot tool: the WAL's per-open info lines would only be noise.
            Command::Wal(_) | Command::Certs(_) | Command::Ctl(_) | Command::Generate(_) => {
                "warn".into()
            }
            Command::Apply(a) => tidelog::config::load_applier(&a.config)
                .map_or_else(|_| "info".into(), |c| valid(c.log_level)),
            Command::Ship(a) => tidelog::config::load_shipper(&a.config)
                .map_or_else(|_| "info".into(), |c| valid(c.log_level)),
            Command::Demo(_) => "warn".into(),
        }
    }
}

fn init_logging(flag: Option<&str>, default: &str) -> Result<()> {
    let (text, what) = match flag {
        Some(f) => (f.to_string(), "--log-level"),
        None => match std::env::var("RUST_LOG") {
            Ok(v) if !v.trim().is_empty() => (v, "RUST_LOG"),
            _ => (default.to_string(), "log-level"),
        },
    };
    let filter = EnvFilter::try_new(tidelog::logging::with_quiet_dependencies(&text))
        .with_context(|| format!("bad {what} {text:?}"))?;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        fmt.without_time().init();
    } else {
        fmt.init();
    }
    Ok(())
}

/// Runs a command; its exit status on success (`ctl` has several, see `tidelog::ctl`).
fn run(command: Command) -> Result<u8> {
    match command {
        Command::Wal(args) => wal_cmd::run(args).map(|()| 0),
        Command::Apply(a) => tidelog::applier_daemon::run(&a.config, a.check).map(|()| 0),
        Command::Ship(a) => tidelog::shipper_daemon::run(&a.config, a.check).map(|()| 0),
        Command::Demo(a) => Ok(match tidelog::demo::run(a)? {
            DemoEnd::Finished | DemoEnd::OutputClosed => 0,
            // Not a failure to explain: the one line says what was stopped and removed.
            DemoEnd::Interrupted(i) => {
                eprintln!("{i}");
                i.exit_code()
            }
        }),
        Command::Certs(CertsArgs {
            command: CertsCommand::Init { dir, sans, force },
        }) => {
            let r = tidelog_net::pki::init(&dir, &sans, force)?;
            for f in &r.files {
                println!("wrote {}", f.display());
            }
            println!("applier certificate names: {}", r.applier_sans.join(", "));
            Ok(0)
        }
        Command::Ctl(args) => ctl::run(args),
        Command::Generate(args) => {
            for p in generate(&args)? {
                println!("wrote {}", p.display());
            }
            Ok(0)
        }
    }
}

/// `e` and its causes joined by `: ` (as `{:#}`), leaving out a cause whose text the
/// message already ends with (errors that print their source, like the WAL's I/O errors, would
/// otherwise show the OS error twice).
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for c in e.chain() {
        let t = c.to_string();
        if out.is_empty() {
            out = t;
        } else if !out.ends_with(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(cli.log_level.as_deref(), &cli.command.default_log_filter()) {
        eprintln!("error: {}", error_text(&e));
        return ExitCode::from(2);
    }
    if matches!(cli.command, Command::Apply(_) | Command::Ship(_)) {
        tidelog::panic_hook::install();
    }
    if let Err(e) = tidelog_memory::set_up() {
        tracing::warn!("cannot turn transparent huge pages off for this process: {e}");
    }
    // Failure injection for tests: only builds with the `fail` crate's
    // `failpoints` feature act on it; elsewhere the fail points compile to nothing.
    let _failpoints = std::env::var_os("FAILPOINTS").map(|_| fail::FailScenario::setup());
    match run(cli.command) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}
