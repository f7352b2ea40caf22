//! A minimal PostgreSQL v3 wire-protocol client over a Unix socket, for the `trx-status`
//! baseline: startup with trust authentication, one prepared statement (Parse), then
//! Bind/Execute/Sync per call, reading until ReadyForQuery. Text format only, one row of
//! one column at most. It is not a general client: no TLS, no passwords, no COPY, no
//! notifications beyond skipping them.
//!
//! Every message from the server is checked (type, length, contents); anything unexpected
//! is an error naming the message and what was wrong, never a panic.

use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

/// Protocol version 3.0.
const PROTOCOL_3_0: i32 = 196_608;
/// Largest server message accepted (our answers are a few dozen bytes).
const MAX_MESSAGE: usize = 1 << 20;

/// One connection.
pub struct PgConn {
    r: BufReader<UnixStream>,
    w: UnixStream,
    out: Vec<u8>,
    body: Vec<u8>,
}

impl std::fmt::Debug for PgConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConn").finish_non_exhaustive()
    }
}

/// Appends a message: type byte, i32 length (including itself), then what `body` writes.
fn message(out: &mut Vec<u8>, ty: u8, body: impl FnOnce(&mut Vec<u8>)) {
    out.push(ty);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    body(out);
    let len = (out.len() - at) as i32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// `S`everity, `C`ode and `M`essage of an ErrorResponse body.
fn error_text(body: &[u8]) -> String {
    let mut parts = Vec::new();
    for field in body.split(|b| *b == 0) {
        if let Some((&code, text)) = field.split_first() {
            if matches!(code, b'S' | b'C' | b'M' | b'D') {
                parts.push(String::from_utf8_lossy(text).into_owned());
            }
        }
    }
    parts.join(": ")
}

fn be_i16(b: &[u8], at: usize, what: &str) -> Result<i16> {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map(i16::from_be_bytes)
        .ok_or_else(|| anyhow!("{what}: message of {} bytes too short", b.len()))
}

fn be_i32(b: &[u8], at: usize, what: &str) -> Result<i32> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(i32::from_be_bytes)
        .ok_or_else(|| anyhow!("{what}: message of {} bytes too short", b.len()))
}

impl PgConn {
    /// Connects to `<socket_dir>/.s.PGSQL.<port>` as `user` to `database` (trust auth) and
    /// waits for the first ReadyForQuery.
    pub fn connect(socket_dir: &Path, port: u16, user: &str, database: &str) -> Result<PgConn> {
        let path = socket_dir.join(format!(".s.PGSQL.{port}"));
        let s = UnixStream::connect(&path)
            .with_context(|| format!("connecting to PostgreSQL at {}", path.display()))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let w = s.try_clone()?;
        let mut c = PgConn {
            r: BufReader::with_capacity(64 * 1024, s),
            w,
            out: Vec::with_capacity(256),
            body: Vec::with_capacity(256),
        };
        // StartupMessage has no type byte.
        let mut m = vec![0u8; 4];
        m.extend_from_slice(&PROTOCOL_3_0.to_be_bytes());
        for (k, v) in [("user", user), ("database", database)] {
            cstr(&mut m, k);
            cstr(&mut m, v);
        }
        m.push(0);
        let len = m.len() as i32;
        m[..4].copy_from_slice(&len.to_be_bytes());
        c.w.write_all(&m).context("sending the startup message")?;
        loop {
            let ty = c.read_message("startup")?;
            match ty {
                b'R' => {
                    let code = be_i32(&c.body, 0, "Authentication")?;
                    if code != 0 {
                        bail!(
                            "PostgreSQL asks for authentication method {code}; the baseline cluster must use trust auth"
                        );
                    }
                }
                b'S' | b'K' | b'N' => {}
                b'Z' => return Ok(c),
                b'E' => bail!("PostgreSQL refused the connection: {}", error_text(&c.body)),
                t => bail!("unexpected message {:?} during startup", t as char),
            }
        }
    }

    /// Reads one message into `self.body`; returns its type.
    fn read_message(&mut self, during: &str) -> Result<u8> {
        let mut head = [0u8; 5];
        self.r
            .read_exact(&mut head)
            .with_context(|| format!("reading a message header ({during})"))?;
        let ty = head[0];
        let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
        let len = usize::try_from(len)
            .ok()
            .filter(|l| (4..=MAX_MESSAGE).contains(l))
            .ok_or_else(|| anyhow!("message {:?} ({during}) has bad length {len}", ty as char))?;
        self.body.resize(len - 4, 0);
        self.r
            .read_exact(&mut self.body)
            .with_context(|| format!("reading message {:?} ({during})", ty as char))?;
        Ok(ty)
    }

    /// Prepares `sql` as statement `name` (parameter types inferred from the casts in it).
    pub fn prepare(&mut self, name: &str, sql: &str) -> Result<()> {
        self.out.clear();
        message(&mut self.out, b'P', |o| {
            cstr(o, name);
            cstr(o, sql);
            o.extend_from_slice(&0i16.to_be_bytes());
        });
        message(&mut self.out, b'S', |_| {});
        self.w.write_all(&self.out).context("sending Parse")?;
        let mut err = None;
        loop {
            match self.read_message("prepare")? {
                b'1' | b'N' | b'S' => {}
                b'E' => err = Some(error_text(&self.body)),
                b'Z' => break,
                t => bail!("unexpected message {:?} after Parse", t as char),
            }
        }
        match err {
            Some(e) => bail!("preparing {sql:?}: {e}"),
            None => Ok(()),
        }
    }

    /// Runs prepared statement `name` with text parameters; returns the first column of the
    /// first row as text (`None` for no row or SQL NULL) into `value`.
    pub fn query_one(&mut self, name: &str, params: &[&str], value: &mut String) -> Result<bool> {
        self.out.clear();
        message(&mut self.out, b'B', |o| {
            cstr(o, "");
            cstr(o, name);
            o.extend_from_slice(&0i16.to_be_bytes());
            o.extend_from_slice(&(params.len() as i16).to_be_bytes());
            for p in params {
                o.extend_from_slice(&(p.len() as i32).to_be_bytes());
                o.extend_from_slice(p.as_bytes());
            }
            o.extend_from_slice(&0i16.to_be_bytes());
        });
        message(&mut self.out, b'E', |o| {
            cstr(o, "");
            o.extend_from_slice(&0i32.to_be_bytes());
        });
        message(&mut self.out, b'S', |_| {});
        self.w
            .write_all(&self.out)
            .context("sending Bind/Execute/Sync")?;
        value.clear();
        let mut got = false;
        let mut err = None;
        loop {
            match self.read_message("query")? {
                b'2' | b'C' | b'N' | b'S' | b'n' => {}
                b'D' if !got => {
                    let cols = be_i16(&self.body, 0, "DataRow")?;
                    if cols < 1 {
                        bail!("DataRow with {cols} columns, expected 1");
                    }
                    let len = be_i32(&self.body, 2, "DataRow")?;
                    if len >= 0 {
                        let v = self
                            .body
                            .get(6..6 + len as usize)
                            .ok_or_else(|| anyhow!("DataRow column of {len} bytes truncated"))?;
                        value.push_str(
                            std::str::from_utf8(v).context("DataRow column is not UTF-8")?,
                        );
                        got = true;
                    }
                }
                b'D' => {}
                b'E' => err = Some(error_text(&self.body)),
                b'Z' => break,
                t => bail!("unexpected message {:?} after Execute", t as char),
            }
        }
        match err {
            Some(e) => bail!("executing {name}({}): {e}", params.join(", ")),
            None => Ok(got),
        }
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        // Terminate, best effort.
        let mut t = Vec::new();
        message(&mut t, b'X', |_| {});
        let _ = self.w.write_all(&t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_framed_and_errors_read() {
        let mut o = Vec::new();
        message(&mut o, b'S', |_| {});
        assert_eq!(o, [b'S', 0, 0, 0, 4]);
        let e = b"SERROR\0C22023\0Mbad xid\0\0";
        assert_eq!(error_text(e), "ERROR: 22023: bad xid");
        assert!(be_i32(&[0, 1], 0, "x").is_err());
    }
}
