//! The applier's admin API and SQL endpoint as the bench drives them: the daemon's start
//! and config, the HTTP client, the SQL side.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use serde_json::Value;
use tidelog_testkit::http1::Http1;
use tidelog_testkit::Daemon;

use crate::e2e::tidelog_exe;
use crate::sqlwire::SqlConn;

use super::*;

pub(super) type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// One keep-alive connection to the admin socket, through either client.
pub(super) enum ApiClient {
    Blocking(Http1),
    Hyper {
        rt: tokio::runtime::Runtime,
        sender: Sender,
    },
}

impl ApiClient {
    pub(super) fn connect(kind: ApiClientKind, socket: &Path) -> Result<ApiClient> {
        Ok(match kind {
            ApiClientKind::Blocking => ApiClient::Blocking(Http1::connect(socket)?),
            ApiClientKind::Hyper => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let sender = rt.block_on(async {
                    let stream = tokio::net::UnixStream::connect(socket)
                        .await
                        .with_context(|| format!("connecting to {}", socket.display()))?;
                    let (sender, conn) =
                        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                            .await
                            .with_context(|| format!("HTTP handshake on {}", socket.display()))?;
                    tokio::spawn(conn);
                    anyhow::Ok(sender)
                })?;
                ApiClient::Hyper { rt, sender }
            }
        })
    }

    pub(super) fn get(&mut self, path: &str) -> Result<(u16, Vec<u8>)> {
        match self {
            ApiClient::Blocking(c) => c.get(path),
            ApiClient::Hyper { rt, sender } => rt.block_on(hyper_get(sender, path)),
        }
    }
}

pub(super) async fn hyper_get(sender: &mut Sender, path: &str) -> Result<(u16, Vec<u8>)> {
    sender
        .ready()
        .await
        .with_context(|| format!("the admin connection closed before GET {path}"))?;
    let req = hyper::Request::builder()
        .method(hyper::Method::GET)
        .uri(path)
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .with_context(|| format!("bad request GET {path}"))?;
    let resp = sender
        .send_request(req)
        .await
        .with_context(|| format!("GET {path}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .with_context(|| format!("reading the answer to GET {path}"))?
        .to_bytes();
    Ok((status, body.to_vec()))
}

pub(super) fn api_path(q: &Query) -> String {
    match &q.hint {
        Some(g) => format!("/v1/trx/{}?gtid={g}", q.trx),
        None => format!("/v1/trx/{}", q.trx),
    }
}

pub(super) fn check_api_answer(case: Case, q: &Query, status: u16, body: &[u8]) -> Result<()> {
    if status != 200 {
        bail!(
            "admin API {}: GET {} answered HTTP {status}: {}",
            case.name(),
            api_path(q),
            String::from_utf8_lossy(body)
        );
    }
    let v: Value = serde_json::from_slice(body).with_context(|| {
        format!(
            "admin API {}: GET {} answered a body that is not JSON: {}",
            case.name(),
            api_path(q),
            String::from_utf8_lossy(body)
        )
    })?;
    let state = v["state"].as_str().ok_or_else(|| {
        anyhow!(
            "admin API {}: GET {} answered without a string `state`: {v}",
            case.name(),
            api_path(q)
        )
    })?;
    check_answer("admin API", case, q, state, v["gtid"].as_str())
}

/// One admin-API look-up, checked.
pub(super) fn api_lookup(client: &mut ApiClient, case: Case, q: &Query, path: &str) -> Result<()> {
    let (st, body) = client.get(path)?;
    check_api_answer(case, q, st, &body)
}

pub(super) fn write_applier_config(
    work: &Path,
    data_dir: &Path,
    tablets: usize,
    cache_size: u64,
    sql: Option<SocketAddr>,
) -> Result<(PathBuf, PathBuf)> {
    let tls = work.join("tls");
    tidelog_testkit::pki::write(&tls)?;
    let port = tidelog_testkit::cluster::free_udp_port()?;
    let sock = work.join("applier.sock");
    let cfg = work.join("applier.toml");
    let ids: Vec<String> = (0..tablets).map(|i| format!("\"t{i}\"")).collect();
    let p = |f: &str| tls.join(f).display().to_string();
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndata-dir = \"{}\"\nadmin-socket = \"{}\"\nsync = \"batch\"\nmax-staleness = \"365d\"\nbinlog-retention = \"365d\"\ncache-size = \"{cache_size}\"\nexpect-tablets = [{}]\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            data_dir.display(),
            sock.display(),
            ids.join(", "),
            p("ca.pem"),
            p("applier.pem"),
            p("applier.key")
        ),
    )
    .with_context(|| format!("writing {}", cfg.display()))?;
    if let Some(addr) = sql {
        let pw = work.join("sql-password");
        std::fs::write(&pw, format!("{SQL_PASSWORD}\n"))
            .with_context(|| format!("writing {}", pw.display()))?;
        std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        let mut f = std::fs::OpenOptions::new().append(true).open(&cfg)?;
        write!(
            f,
            "[sql]\nlisten = \"{addr}\"\nuser = \"{SQL_USER}\"\npassword-file = \"{}\"\ntls = \"off\"\n",
            pw.display()
        )?;
    }
    Ok((cfg, sock))
}

/// The SQL side: one connection with the two look-ups prepared.
pub(super) struct SqlSide {
    pub(super) conn: SqlConn,
    pub(super) plain: u32,
    pub(super) hinted: u32,
    pub(super) answer: String,
}

impl SqlSide {
    pub(super) fn connect(addr: SocketAddr) -> Result<SqlSide> {
        let mut conn = SqlConn::connect(addr, SQL_USER, SQL_PASSWORD)?;
        let (plain, _) = conn.prepare("SELECT trx_status(?)")?;
        let (hinted, _) = conn.prepare("SELECT trx_status(?, ?)")?;
        Ok(SqlSide {
            conn,
            plain,
            hinted,
            answer: String::new(),
        })
    }

    /// One look-up (not checked: [`SqlSide::check`]).
    pub(super) fn lookup(&mut self, q: &Query) -> Result<()> {
        let got = match &q.hint {
            Some(h) => self
                .conn
                .execute_one(self.hinted, &[&q.trx, h], &mut self.answer)?,
            None => self
                .conn
                .execute_one(self.plain, &[&q.trx], &mut self.answer)?,
        };
        if !got {
            bail!("SQL endpoint: trx_status({}) answered no row", q.trx);
        }
        Ok(())
    }

    /// The state the last look-up answered, against what `case` expects.
    pub(super) fn check(&self, case: Case, q: &Query) -> Result<()> {
        let want = if case.hit() { "COMMITTED" } else { "UNKNOWN" };
        if self.answer != want {
            bail!(
                "SQL endpoint {}: trx_status({}, {:?}) answered {}, expected {want}",
                case.name(),
                q.trx,
                q.hint,
                self.answer
            );
        }
        Ok(())
    }
}

/// The admin-API side of the comparison: the real daemon and one connection to it (and,
/// with `--sql`, one to its SQL endpoint).
pub(super) struct ApiSide {
    pub(super) daemon: Daemon,
    pub(super) client: ApiClient,
    pub(super) sql: Option<SqlSide>,
}

impl ApiSide {
    pub(super) fn stop(mut self) {
        if let Err(e) = self.daemon.stop(Duration::from_secs(30)) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// Starts `tidelog apply` on `data_dir` and waits until it answers and has pre-loaded its
/// look-up indexes.
pub(super) fn start_api(args: &TrxArgs, work: &Path, data_dir: &Path) -> Result<ApiSide> {
    let exe = tidelog_exe()?;
    let sql_addr = if args.sql {
        let l = std::net::TcpListener::bind("127.0.0.1:0").context("a free TCP port")?;
        Some(l.local_addr()?)
    } else {
        None
    };
    let (cfg, sock) = write_applier_config(
        work,
        data_dir,
        args.tablets,
        args.cache_size
            .unwrap_or(tidelog_applier::store::DEFAULT_CACHE_SIZE),
        sql_addr,
    )?;
    let log = work.join("applier.log");
    let mut daemon = Daemon::spawn(&exe, "apply", &cfg, &log, "warn")?;
    let r = (|| {
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(120);
        let mut client = loop {
            daemon.check_alive()?;
            if let Ok(mut c) = ApiClient::connect(args.api_client, &sock) {
                if let Ok((200, _)) = c.get("/v1/status") {
                    break c;
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the applier did not answer on {} within 120 s; see {}",
                    sock.display(),
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (_, st) = client.get("/v1/safe-time")?;
        let st: Value = serde_json::from_slice(&st).context("GET /v1/safe-time: not JSON")?;
        println!(
            "  tidelog apply pid {} answering after {:.2} s; safe time {} (initialized: {}); {:?} client",
            daemon.pid(),
            t0.elapsed().as_secs_f64(),
            st["safe_time"],
            st["initialized"],
            args.api_client,
        );
        // The daemon pre-loads its look-up indexes into the block cache in the background:
        // measure once that is over (it competes for the two cores meanwhile).
        let t1 = Instant::now();
        let warm = loop {
            let (_, body) = client.get("/v1/status")?;
            let v: Value = serde_json::from_slice(&body).context("GET /v1/status: not JSON")?;
            let lc = v["lookup_cache"].clone();
            if lc["state"] != "loading" {
                break lc;
            }
            if Instant::now() > deadline {
                bail!("the applier still pre-loads its look-up indexes after 120 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        println!(
            "  look-up indexes {} in the daemon's block cache after {:.1} s more ({} MiB of {} MiB)",
            warm["state"].as_str().unwrap_or("?"),
            t1.elapsed().as_secs_f64(),
            warm["index_bytes"].as_u64().unwrap_or(0) >> 20,
            warm["cache_size"].as_u64().unwrap_or(0) >> 20,
        );
        let sql = match sql_addr {
            Some(a) => {
                let s = SqlSide::connect(a)?;
                println!(
                    "  SQL endpoint on {a}: SELECT trx_status(?) and trx_status(?, ?) prepared"
                );
                Some(s)
            }
            None => None,
        };
        Ok((client, sql))
    })();
    match r {
        Ok((client, sql)) => Ok(ApiSide {
            daemon,
            client,
            sql,
        }),
        Err(e) => {
            if let Err(e2) = daemon.stop(Duration::from_secs(30)) {
                eprintln!("warning: {e2:#}");
            }
            Err(e)
        }
    }
}
