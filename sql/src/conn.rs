//! One client connection: greeting, optional TLS, `mysql_native_password`, then commands
//! until the client quits, stays idle for `idle-timeout`, or sends a packet that cannot be
//! read (that connection only is closed, after an error saying why when it can be said).
//!
//! ```text
//!  greeting ─► SSLRequest? ─► TLS ─► HandshakeResponse ─► auth (switch if needed)
//!                    └──────────────────────┘                 │ 1045 → close
//!                                                              ▼
//!       COM_QUERY / COM_STMT_PREPARE / COM_STMT_EXECUTE / COM_PING / … ◄─┐
//!             └─ answer (rows, OK, ERR 1235 …) ───────────────────────────┘
//! ```
//!
//! Until the TLS decision the packets are read exactly (never a byte beyond the one asked
//! for: the TLS handshake's first bytes may follow an `SSLRequest` at once); after it,
//! through a buffer.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use mysql_common::constants::CapabilityFlags;
use mysql_common::io::ParseBuf;
use mysql_common::packets::{AuthPlugin, HandshakeResponse};
use mysql_common::proto::codec::error::PacketCodecError;
use mysql_common::proto::codec::PacketCodec;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::answer::{self, Answer, Session, SqlError};
use crate::packets::{self, Bound, Malformed};
use crate::server::Shared;
use crate::statement::{self, Parsed, Statement};
use crate::variables::MAX_ALLOWED_PACKET;

/// How long a client has from connecting to being authenticated.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The most prepared statements one connection may hold.
pub const MAX_PREPARED: usize = 1024;

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("malformed packet: {0}")]
    Malformed(String),
    #[error("{0}")]
    Refused(&'static str),
}

impl From<PacketCodecError> for ConnError {
    fn from(e: PacketCodecError) -> Self {
        match e {
            PacketCodecError::Io(e) => ConnError::Io(e),
            e => ConnError::Malformed(e.to_string()),
        }
    }
}

impl From<Malformed> for ConnError {
    fn from(m: Malformed) -> Self {
        ConnError::Malformed(m.0)
    }
}

/// Packets over a stream: MySQL framing (`mysql_common`'s codec: sequence ids checked,
/// packets longer than [`MAX_ALLOWED_PACKET`] refused).
struct Wire<S> {
    s: S,
    codec: PacketCodec,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// A packet being assembled from its chunks.
    pending: Vec<u8>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Wire<S> {
    fn new(s: S) -> Wire<S> {
        let mut codec = PacketCodec::default();
        codec.max_allowed_packet = MAX_ALLOWED_PACKET;
        Wire::with_codec(s, codec)
    }

    fn with_codec(s: S, codec: PacketCodec) -> Wire<S> {
        Wire {
            s,
            codec,
            rbuf: BytesMut::with_capacity(4096),
            wbuf: BytesMut::with_capacity(4096),
            pending: Vec::new(),
        }
    }

    fn send(&mut self, payload: &[u8]) -> Result<(), ConnError> {
        let mut p = payload;
        self.codec.encode(&mut p, &mut self.wbuf)?;
        Ok(())
    }

    async fn flush(&mut self) -> io::Result<()> {
        if !self.wbuf.is_empty() {
            self.s.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        self.s.flush().await
    }

    /// The next packet; `None` when the client closed the connection between packets.
    /// `exact`: read no byte beyond the packet.
    async fn recv(&mut self, exact: bool) -> Result<Option<Vec<u8>>, ConnError> {
        loop {
            if (!exact || self.whole_packet_buffered()?)
                && self.codec.decode(&mut self.rbuf, &mut self.pending)?
            {
                return Ok(Some(std::mem::take(&mut self.pending)));
            }
            let n = if exact {
                let want = self.exact_want()?;
                (&mut self.s)
                    .take(want as u64)
                    .read_buf(&mut self.rbuf)
                    .await?
            } else {
                self.s.read_buf(&mut self.rbuf).await?
            };
            if n == 0 {
                if self.rbuf.is_empty() && self.pending.is_empty() {
                    return Ok(None);
                }
                return Err(ConnError::Malformed(
                    "the connection closed within a packet".into(),
                ));
            }
        }
    }

    /// In exact mode: whether the buffer holds one whole (single-chunk) packet.
    fn whole_packet_buffered(&self) -> Result<bool, ConnError> {
        Ok(self.rbuf.len() >= 4 && self.exact_want()? == 0)
    }

    /// In exact mode: how many more bytes the packet in the buffer needs.
    fn exact_want(&self) -> Result<usize, ConnError> {
        if self.rbuf.len() < 4 {
            return Ok(4 - self.rbuf.len());
        }
        let len = u32::from_le_bytes([self.rbuf[0], self.rbuf[1], self.rbuf[2], 0]) as usize;
        if len >= 0xff_ffff || len > 64 * 1024 {
            return Err(ConnError::Malformed(format!(
                "a handshake packet of {len} bytes"
            )));
        }
        Ok((4 + len).saturating_sub(self.rbuf.len()))
    }

    /// Sends `e` and flushes; the caller closes the connection next.
    async fn fail(&mut self, e: &SqlError) -> Result<(), ConnError> {
        self.send(&packets::err(e))?;
        self.flush().await?;
        Ok(())
    }
}

/// A connection, from accept to close. Errors are the connection's own (logged by the
/// caller at debug level); the daemon goes on.
pub async fn serve<S>(stream: S, shared: Arc<Shared>, conn_id: u32) -> Result<(), ConnError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let nonce = nonce();
    let tls_offered = shared.tls.is_some();
    let mut w = Wire::new(stream);
    w.send(&packets::greeting(
        &crate::variables::version(),
        conn_id,
        &nonce,
        tls_offered,
    ))?;
    w.flush().await?;
    let first = within_handshake(&shared, w.recv(true)).await?;
    let Some(first) = first else { return Ok(()) };
    let caps = client_capabilities(&first)?;
    if caps.contains(CapabilityFlags::CLIENT_SSL) && first.len() == 32 {
        let Some(acceptor) = shared.tls.clone() else {
            shared.metrics.refused("malformed");
            return Err(ConnError::Malformed(
                "an SSLRequest, but TLS is off (`tls = \"off\"`)".into(),
            ));
        };
        let Wire { s, codec, .. } = w;
        let tls = within_handshake(&shared, async { Ok(acceptor.accept(s).await?) }).await?;
        let mut w = Wire::with_codec(tls, codec);
        let resp = within_handshake(&shared, w.recv(false)).await?;
        let Some(resp) = resp else { return Ok(()) };
        return session(w, resp, nonce, true, shared, conn_id).await;
    }
    if shared.opts.tls_required {
        shared.metrics.refused("tls_required");
        shared.metrics.error(3159);
        w.fail(&SqlError::new(
            3159,
            b"HY000",
            "Connections using insecure transport are prohibited (tls = \"required\"): connect with --ssl",
        ))
        .await?;
        return Err(ConnError::Refused(
            "a client without TLS while tls = \"required\"",
        ));
    }
    session(w, first, nonce, false, shared, conn_id).await
}

async fn within_handshake<T>(
    shared: &Shared,
    f: impl std::future::Future<Output = Result<T, ConnError>>,
) -> Result<T, ConnError> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, f).await {
        Ok(r) => {
            if matches!(r, Err(ConnError::Malformed(_))) {
                shared.metrics.refused("malformed");
            }
            r
        }
        Err(_) => {
            shared.metrics.refused("handshake_timeout");
            Err(ConnError::Refused("no complete handshake within 10 s"))
        }
    }
}

/// The capability flags at the start of a handshake response or `SSLRequest`.
fn client_capabilities(p: &[u8]) -> Result<CapabilityFlags, ConnError> {
    let b = p
        .get(..4)
        .ok_or_else(|| ConnError::Malformed("a handshake response shorter than 4 bytes".into()))?;
    Ok(CapabilityFlags::from_bits_truncate(u32::from_le_bytes([
        b[0], b[1], b[2], b[3],
    ])))
}

/// 20 random printable bytes (no NUL: clients read the nonce as a C string).
fn nonce() -> [u8; 20] {
    use rand::Rng;
    let mut rng = rand::rng();
    std::array::from_fn(|_| rng.random_range(b'!'..=b'~'))
}

/// Authentication, then the command loop.
async fn session<S>(
    mut w: Wire<S>,
    resp: Vec<u8>,
    nonce: [u8; 20],
    tls: bool,
    shared: Arc<Shared>,
    conn_id: u32,
) -> Result<(), ConnError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let hr: HandshakeResponse<'_> = ParseBuf(&resp).parse(()).map_err(|e| {
        shared.metrics.refused("malformed");
        ConnError::Malformed(format!("handshake response: {e}"))
    })?;
    if !hr
        .capabilities()
        .contains(CapabilityFlags::CLIENT_PROTOCOL_41)
    {
        shared.metrics.refused("malformed");
        w.fail(&SqlError::new(
            1043,
            b"08S01",
            "Bad handshake: the client does not speak protocol 4.1",
        ))
        .await?;
        return Err(ConnError::Refused("a client without protocol 4.1"));
    }
    let user = String::from_utf8_lossy(hr.user()).into_owned();
    let db = hr
        .db_name()
        .filter(|d| !d.is_empty())
        .map(|d| String::from_utf8_lossy(d).into_owned());
    let mut answer = hr.scramble_buf().to_vec();
    let native = matches!(
        hr.auth_plugin(),
        None | Some(AuthPlugin::MysqlNativePassword)
    );
    drop(hr);
    if !native {
        w.send(&packets::auth_switch(&nonce))?;
        w.flush().await?;
        answer = within_handshake(&shared, w.recv(false))
            .await?
            .ok_or(ConnError::Refused("closed during the auth switch"))?;
    }
    if user != shared.opts.user || !shared.password.matches(&nonce, &answer) {
        shared.metrics.refused("auth");
        shared.metrics.error(1045);
        let using = if answer.is_empty() { "NO" } else { "YES" };
        w.fail(&SqlError::new(
            1045,
            b"28000",
            format!("Access denied for user '{user}' (using password: {using})"),
        ))
        .await?;
        return Err(ConnError::Refused("bad credentials"));
    }
    w.send(&packets::ok())?;
    w.flush().await?;
    let mut s = Session {
        conn_id,
        user,
        db,
        tls_offered: shared.tls.is_some(),
        idle_timeout: shared.opts.idle_timeout,
    };
    tracing::debug!(conn = conn_id, tls, "SQL client authenticated");
    commands(&mut w, &mut s, &shared).await
}

/// A prepared statement.
struct Prepared {
    parsed: Parsed,
    bound: Bound,
}

async fn commands<S>(w: &mut Wire<S>, s: &mut Session, shared: &Shared) -> Result<(), ConnError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut prepared: HashMap<u32, Prepared> = HashMap::new();
    let mut next_stmt: u32 = 1;
    let m = &shared.metrics;
    loop {
        w.codec.reset_seq_id();
        let packet = match tokio::time::timeout(shared.opts.idle_timeout, w.recv(false)).await {
            Err(_) => {
                m.refused("idle_timeout");
                return Ok(());
            }
            Ok(Err(e)) => {
                if let ConnError::Malformed(why) = &e {
                    // The sequence may be off: say why as the next packet, then close.
                    malformed(w, m, why).await;
                }
                return Err(e);
            }
            Ok(Ok(None)) => return Ok(()),
            Ok(Ok(Some(p))) => p,
        };
        let Some((&cmd, body)) = packet.split_first() else {
            m.refused("malformed");
            return Err(ConnError::Malformed("an empty command packet".into()));
        };
        match cmd {
            // COM_QUIT
            0x01 => return Ok(()),
            // COM_INIT_DB
            0x02 => {
                m.statement("use");
                s.db = Some(String::from_utf8_lossy(body).into_owned());
                w.send(&packets::ok())?;
            }
            // COM_QUERY
            0x03 => {
                let text = String::from_utf8_lossy(body);
                let answer = match statement::parse(&text) {
                    Ok(p) => {
                        m.statement(kind(&p.statement));
                        answer::execute(&shared.applier, &p.statement, &[], s).await
                    }
                    Err(e) => {
                        m.statement("unsupported");
                        Answer::Err(SqlError::from_parse(&e))
                    }
                };
                write_answer(w, &answer, false, m)?;
            }
            // COM_FIELD_LIST: there are no tables.
            0x04 => w.send(&packets::eof())?,
            // COM_STATISTICS
            0x09 => w.send(format!("tidelog {}", env!("CARGO_PKG_VERSION")).as_bytes())?,
            // COM_PING
            0x0e => {
                m.statement("ping");
                w.send(&packets::ok())?;
            }
            // COM_STMT_PREPARE
            0x16 => {
                let text = String::from_utf8_lossy(body);
                let parsed = statement::parse(&text).map_err(|e| SqlError::from_parse(&e));
                let cols = parsed
                    .as_ref()
                    .map_err(Clone::clone)
                    .and_then(|p| answer::columns(&p.statement));
                match (parsed, cols) {
                    (Ok(_), Ok(_)) if prepared.len() >= MAX_PREPARED => {
                        let e = SqlError::new(
                            1461,
                            b"42000",
                            format!("Can't create more than {MAX_PREPARED} prepared statements on one connection"),
                        );
                        m.error(e.code);
                        w.send(&packets::err(&e))?;
                    }
                    (Ok(p), Ok(cols)) => {
                        m.statement("prepare");
                        let id = next_stmt;
                        next_stmt = next_stmt.wrapping_add(1).max(1);
                        w.send(&packets::prepare_ok(id, cols.len(), p.params))?;
                        if p.params > 0 {
                            for _ in 0..p.params {
                                w.send(&packets::param_column())?;
                            }
                            w.send(&packets::eof())?;
                        }
                        if !cols.is_empty() {
                            for c in &cols {
                                w.send(&packets::column(c))?;
                            }
                            w.send(&packets::eof())?;
                        }
                        prepared.insert(
                            id,
                            Prepared {
                                parsed: p,
                                bound: Bound::default(),
                            },
                        );
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        m.statement("unsupported");
                        m.error(e.code);
                        w.send(&packets::err(&e))?;
                    }
                }
            }
            // COM_STMT_EXECUTE
            0x17 => {
                let id = stmt_id(body)?;
                let Some(p) = prepared.get_mut(&id) else {
                    let e = SqlError::new(
                        1243,
                        b"HY000",
                        format!("Unknown prepared statement handler ({id}) given to EXECUTE"),
                    );
                    m.error(e.code);
                    w.send(&packets::err(&e))?;
                    w.flush().await?;
                    continue;
                };
                let params =
                    match packets::execute_params(&body[4..], p.parsed.params, &mut p.bound) {
                        Ok(v) => v,
                        Err(why) => {
                            malformed(w, m, &why.0).await;
                            return Err(why.into());
                        }
                    };
                m.statement(kind(&p.parsed.statement));
                let stmt = p.parsed.statement.clone();
                let answer = answer::execute(&shared.applier, &stmt, &params, s).await;
                write_answer(w, &answer, true, m)?;
            }
            // COM_STMT_SEND_LONG_DATA: no answer.
            0x18 => {
                let id = stmt_id(body)?;
                let param = body
                    .get(4..6)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .ok_or_else(|| {
                        ConnError::Malformed("COM_STMT_SEND_LONG_DATA too short".into())
                    })?;
                if let Some(p) = prepared.get_mut(&id) {
                    let d = p.bound.long_data.entry(param).or_default();
                    if d.len() + body.len() > MAX_ALLOWED_PACKET {
                        return Err(ConnError::Malformed(format!(
                            "more than {MAX_ALLOWED_PACKET} bytes of long data"
                        )));
                    }
                    d.extend_from_slice(&body[6..]);
                }
                continue;
            }
            // COM_STMT_CLOSE: no answer.
            0x19 => {
                prepared.remove(&stmt_id(body)?);
                continue;
            }
            // COM_STMT_RESET
            0x1a => {
                if let Some(p) = prepared.get_mut(&stmt_id(body)?) {
                    p.bound.long_data.clear();
                }
                w.send(&packets::ok())?;
            }
            // COM_SET_OPTION (multi-statements on/off): answered with EOF.
            0x1b => w.send(&packets::eof())?,
            // COM_RESET_CONNECTION
            0x1f => {
                prepared.clear();
                s.db = None;
                w.send(&packets::ok())?;
            }
            other => {
                let e = SqlError::new(1047, b"08S01", format!("Unknown command {other:#04x}"));
                m.error(e.code);
                w.send(&packets::err(&e))?;
            }
        }
        w.flush().await?;
    }
}

/// Counts a malformed packet and says why (error 1835) before the connection closes;
/// the client may be gone already.
async fn malformed<S: AsyncRead + AsyncWrite + Unpin>(
    w: &mut Wire<S>,
    m: &crate::metrics::Metrics,
    why: &str,
) {
    m.refused("malformed");
    m.error(1835);
    let _ = w
        .fail(&SqlError::new(
            1835,
            b"HY000",
            format!("Malformed packet: {why}"),
        ))
        .await;
}

fn stmt_id(body: &[u8]) -> Result<u32, ConnError> {
    body.get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| ConnError::Malformed("a statement command without its statement id".into()))
}

/// The metrics' name of a statement's kind.
fn kind(s: &Statement) -> &'static str {
    use crate::statement::{Func, Item};
    match s {
        Statement::Select(items) => match items.first().map(|i| &i.item) {
            Some(Item::Call(Func::TrxStatus, _)) => "trx_status",
            Some(Item::Call(Func::TrxStatusJson, _)) => "trx_status_json",
            Some(Item::Call(Func::MasterGtidWait, _)) => "master_gtid_wait",
            Some(Item::Var(_)) => "variables",
            _ => "select",
        },
        Statement::ShowVariables(_) => "show_variables",
        Statement::ShowReplicaStatus => "show_replica_status",
        Statement::Set => "set",
        Statement::Use(_) => "use",
        Statement::NoOp => "transaction",
    }
}

fn write_answer<S: AsyncRead + AsyncWrite + Unpin>(
    w: &mut Wire<S>,
    a: &Answer,
    binary: bool,
    m: &crate::metrics::Metrics,
) -> Result<(), ConnError> {
    match a {
        Answer::Ok => w.send(&packets::ok()),
        Answer::Err(e) => {
            m.error(e.code);
            w.send(&packets::err(e))
        }
        Answer::Rows(cols, rows) => {
            w.send(&packets::column_count(cols.len()))?;
            for c in cols {
                w.send(&packets::column(c))?;
            }
            w.send(&packets::eof())?;
            for r in rows {
                if binary {
                    w.send(&packets::binary_row(r))?;
                } else {
                    w.send(&packets::text_row(r))?;
                }
            }
            w.send(&packets::eof())
        }
    }
}
