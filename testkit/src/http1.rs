//! A minimal blocking HTTP/1.1 client over a Unix socket for the tests, the demo and the
//! benches: one keep-alive connection, requests without a body, answers with
//! `Content-Length` (what the admin API sends). It is the same shape of client as the
//! PostgreSQL baseline's of `tidelog-bench trx-status`: a blocking `write`, then blocking
//! `read`s on one socket, so the two columns of that bench measure the servers and not two
//! different client stacks.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

/// Longest status line or header line accepted.
const MAX_LINE: usize = 8 << 10;
/// Largest body accepted.
const MAX_BODY: usize = 64 << 20;
/// A server silent this long is an error.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// One keep-alive connection to an admin socket.
#[derive(Debug)]
pub struct Http1 {
    r: BufReader<UnixStream>,
    w: UnixStream,
    socket: PathBuf,
    req: Vec<u8>,
    line: String,
}

impl Http1 {
    /// Connects to `socket`; reads time out after 10 s.
    pub fn connect(socket: &Path) -> Result<Http1> {
        let w = UnixStream::connect(socket)
            .with_context(|| format!("connecting to {}", socket.display()))?;
        w.set_read_timeout(Some(READ_TIMEOUT))
            .context("setting the admin socket's read timeout")?;
        let r =
            BufReader::with_capacity(64 << 10, w.try_clone().context("cloning the admin socket")?);
        Ok(Http1 {
            r,
            w,
            socket: socket.to_path_buf(),
            req: Vec::with_capacity(256),
            line: String::with_capacity(256),
        })
    }

    /// `GET path`; the status code and the body.
    pub fn get(&mut self, path: &str) -> Result<(u16, Vec<u8>)> {
        self.request("GET", path)
    }

    /// `method path` without a body; the status code and the body.
    pub fn request(&mut self, method: &str, path: &str) -> Result<(u16, Vec<u8>)> {
        self.req.clear();
        write!(
            self.req,
            "{method} {path} HTTP/1.1\r\nhost: localhost\r\naccept: application/json\r\n"
        )?;
        if method != "GET" {
            self.req.extend_from_slice(b"content-length: 0\r\n");
        }
        self.req.extend_from_slice(b"\r\n");
        self.w
            .write_all(&self.req)
            .with_context(|| format!("sending {method} {path} on {}", self.socket.display()))?;
        let status = {
            let l = self.read_line(path)?;
            let mut it = l.split(' ');
            match (it.next(), it.next().map(str::parse::<u16>)) {
                (Some("HTTP/1.1"), Some(Ok(s))) => s,
                _ => bail!("GET {path}: malformed status line {l:?}"),
            }
        };
        let mut len: Option<usize> = None;
        loop {
            let l = self.read_line(path)?;
            if l.is_empty() {
                break;
            }
            let (name, value) = l
                .split_once(':')
                .ok_or_else(|| anyhow!("GET {path}: malformed header line {l:?}"))?;
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("content-length") {
                len = Some(
                    value
                        .parse()
                        .map_err(|_| anyhow!("GET {path}: malformed content-length {value:?}"))?,
                );
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                bail!("GET {path}: transfer-encoding {value:?} is not supported by this client");
            }
        }
        let len = len.ok_or_else(|| anyhow!("GET {path}: answer without content-length"))?;
        if len > MAX_BODY {
            bail!("GET {path}: body of {len} bytes is over {MAX_BODY}");
        }
        let mut body = vec![0; len];
        self.r
            .read_exact(&mut body)
            .with_context(|| format!("GET {path}: reading a body of {len} bytes"))?;
        Ok((status, body))
    }

    /// One CRLF-terminated line, without the CRLF.
    fn read_line(&mut self, path: &str) -> Result<&str> {
        self.line.clear();
        let n = (&mut self.r)
            .take(MAX_LINE as u64)
            .read_line(&mut self.line)
            .with_context(|| format!("GET {path}: reading the answer"))?;
        if n == 0 {
            bail!(
                "GET {path}: {} closed the connection",
                self.socket.display()
            );
        }
        if !self.line.ends_with("\r\n") {
            bail!("GET {path}: answer line over {MAX_LINE} bytes or not CRLF-terminated");
        }
        Ok(self.line.trim_end_matches("\r\n"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::unix::net::UnixListener;

    /// A one-connection server that answers each request with the next of `answers`.
    fn serve(answers: Vec<&'static [u8]>) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let l = UnixListener::bind(&sock).unwrap();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            for a in answers {
                // Read one request head (up to the blank line).
                let mut line = String::new();
                loop {
                    line.clear();
                    if r.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                        break;
                    }
                }
                w.write_all(a).unwrap();
            }
        });
        (dir, sock)
    }

    #[test]
    fn reads_keep_alive_answers_and_refuses_malformed_ones() {
        let (_d, sock) = serve(vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        ]);
        let mut c = Http1::connect(&sock).unwrap();
        assert_eq!(c.get("/x").unwrap(), (200, b"{\"a\":1}".to_vec()));
        assert_eq!(c.get("/y").unwrap(), (404, Vec::new()));
        let e = c.get("/z").unwrap_err().to_string();
        assert!(e.contains("transfer-encoding"), "{e}");

        let (_d, sock) = serve(vec![b"HTTP/1.1 OK\r\n\r\n"]);
        let e = Http1::connect(&sock)
            .unwrap()
            .get("/")
            .unwrap_err()
            .to_string();
        assert!(e.contains("malformed status line"), "{e}");
    }
}
