//! A minimal MySQL-protocol client over TCP, for the `trx-status --sql` case: the
//! handshake with `mysql_native_password` (no TLS), one server-side prepared statement
//! (`COM_STMT_PREPARE`), then one `COM_STMT_EXECUTE` per call with string parameters,
//! reading the binary result set to its closing EOF. It measures the server, so it does
//! as little as a client can: one blocking socket, one buffer, no allocation per call
//! beyond the answer's string. Not a general client: one row of string columns at most.
//!
//! Every packet from the server is checked (length, kind); anything unexpected is an
//! error naming it, never a panic.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

/// Largest packet accepted (answers are a few dozen bytes).
const MAX_PACKET: usize = 1 << 20;

const CLIENT_LONG_PASSWORD: u32 = 1;
const CLIENT_PROTOCOL_41: u32 = 1 << 9;
const CLIENT_TRANSACTIONS: u32 = 1 << 13;
const CLIENT_SECURE_CONNECTION: u32 = 1 << 15;
const CLIENT_PLUGIN_AUTH: u32 = 1 << 19;
const MYSQL_TYPE_VAR_STRING: u8 = 0xfd;

/// One connection.
pub struct SqlConn {
    r: BufReader<TcpStream>,
    w: TcpStream,
    out: Vec<u8>,
    packet: Vec<u8>,
}

impl std::fmt::Debug for SqlConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlConn").finish_non_exhaustive()
    }
}

/// An ERR packet's code and message.
fn err_text(p: &[u8]) -> String {
    let code = p.get(1..3).map_or(0, |c| u16::from_le_bytes([c[0], c[1]]));
    let msg = p.get(9..).map(String::from_utf8_lossy).unwrap_or_default();
    format!("error {code}: {msg}")
}

fn lenenc_str(out: &mut Vec<u8>, s: &[u8]) {
    // Parameters here are short (< 251 bytes) or written with the 2-byte form.
    if s.len() < 251 {
        out.push(s.len() as u8);
    } else {
        out.push(0xfc);
        out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    }
    out.extend_from_slice(s);
}

/// A length-encoded integer at `p[*at..]`, advancing `at`.
fn lenenc_int(p: &[u8], at: &mut usize) -> Result<u64> {
    let first = *p.get(*at).ok_or_else(|| anyhow!("row truncated"))?;
    *at += 1;
    let n = match first {
        0..=250 => return Ok(first as u64),
        0xfc => 2,
        0xfd => 3,
        0xfe => 8,
        _ => bail!("bad length prefix {first:#x}"),
    };
    let b = p
        .get(*at..*at + n)
        .ok_or_else(|| anyhow!("row truncated"))?;
    *at += n;
    let mut v = [0u8; 8];
    v[..n].copy_from_slice(b);
    Ok(u64::from_le_bytes(v))
}

impl SqlConn {
    /// Connects and logs in as `user` with `password`.
    pub fn connect(addr: SocketAddr, user: &str, password: &str) -> Result<SqlConn> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .with_context(|| format!("connecting to the SQL endpoint {addr}"))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut c = SqlConn {
            r: BufReader::with_capacity(64 * 1024, s.try_clone()?),
            w: s,
            out: Vec::with_capacity(256),
            packet: Vec::with_capacity(4096),
        };
        let seq = c.read_packet().context("reading the greeting")?;
        let g = &c.packet;
        if g.first() != Some(&10) {
            bail!("the greeting is not protocol 10: {}", err_text(g));
        }
        let ver_end = g[1..]
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| anyhow!("greeting without a version"))?
            + 1;
        let at = ver_end + 1 + 4;
        let part1 = g
            .get(at..at + 8)
            .ok_or_else(|| anyhow!("greeting too short"))?;
        // filler 1, caps 2, charset 1, status 2, caps 2, auth len 1, reserved 10
        let at2 = at + 8 + 1 + 2 + 1 + 2 + 2 + 1 + 10;
        let part2 = g
            .get(at2..at2 + 12)
            .ok_or_else(|| anyhow!("greeting too short"))?;
        let mut nonce = part1.to_vec();
        nonce.extend_from_slice(part2);
        let scramble = mysql_common::scramble::scramble_native(&nonce, password.as_bytes())
            .ok_or_else(|| anyhow!("an empty password"))?;
        let caps = CLIENT_LONG_PASSWORD
            | CLIENT_PROTOCOL_41
            | CLIENT_TRANSACTIONS
            | CLIENT_SECURE_CONNECTION
            | CLIENT_PLUGIN_AUTH;
        let mut r = Vec::new();
        r.extend_from_slice(&caps.to_le_bytes());
        r.extend_from_slice(&(MAX_PACKET as u32).to_le_bytes());
        r.push(45);
        r.extend_from_slice(&[0; 23]);
        r.extend_from_slice(user.as_bytes());
        r.push(0);
        r.push(scramble.len() as u8);
        r.extend_from_slice(&scramble);
        r.extend_from_slice(b"mysql_native_password\0");
        c.write_packet(seq.wrapping_add(1), &r)?;
        c.read_packet().context("reading the login's answer")?;
        if c.packet.first() != Some(&0) {
            bail!("login refused: {}", err_text(&c.packet));
        }
        Ok(c)
    }

    /// The connection's socket, for bytes this client would never send (the daemon's tests
    /// include this file).
    #[allow(dead_code)]
    pub fn socket(&mut self) -> &mut TcpStream {
        &mut self.w
    }

    fn write_packet(&mut self, seq: u8, payload: &[u8]) -> Result<()> {
        self.out.clear();
        self.out
            .extend_from_slice(&(payload.len() as u32).to_le_bytes()[..3]);
        self.out.push(seq);
        self.out.extend_from_slice(payload);
        self.w.write_all(&self.out)?;
        Ok(())
    }

    /// Reads one packet into `self.packet`; returns its sequence id.
    fn read_packet(&mut self) -> Result<u8> {
        let mut h = [0u8; 4];
        self.r
            .read_exact(&mut h)
            .context("reading a packet header")?;
        let len = u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize;
        if len > MAX_PACKET {
            bail!("a packet of {len} bytes");
        }
        self.packet.resize(len, 0);
        self.r
            .read_exact(&mut self.packet)
            .context("reading a packet")?;
        Ok(h[3])
    }

    /// Whether the packet read last is an EOF packet.
    fn is_eof(&self) -> bool {
        self.packet.first() == Some(&0xfe) && self.packet.len() < 9
    }

    /// Reads packets up to and including an EOF.
    fn skip_to_eof(&mut self) -> Result<()> {
        loop {
            self.read_packet()?;
            if self.packet.first() == Some(&0xff) {
                bail!("{}", err_text(&self.packet));
            }
            if self.is_eof() {
                return Ok(());
            }
        }
    }

    /// Prepares `sql`; returns the statement id and its parameter count.
    pub fn prepare(&mut self, sql: &str) -> Result<(u32, usize)> {
        let mut p = vec![0x16];
        p.extend_from_slice(sql.as_bytes());
        self.write_packet(0, &p)?;
        self.read_packet()?;
        let ok = &self.packet;
        if ok.first() != Some(&0) || ok.len() < 12 {
            bail!("preparing {sql:?}: {}", err_text(ok));
        }
        let id = u32::from_le_bytes([ok[1], ok[2], ok[3], ok[4]]);
        let cols = u16::from_le_bytes([ok[5], ok[6]]);
        let params = u16::from_le_bytes([ok[7], ok[8]]) as usize;
        if params > 0 {
            self.skip_to_eof()?;
        }
        if cols > 0 {
            self.skip_to_eof()?;
        }
        Ok((id, params))
    }

    /// Executes statement `id` with string `params`; the first column of its one row goes
    /// into `answer`. Returns whether there was a row.
    pub fn execute_one(&mut self, id: u32, params: &[&str], answer: &mut String) -> Result<bool> {
        let mut p = Vec::with_capacity(64);
        p.push(0x17);
        p.extend_from_slice(&id.to_le_bytes());
        p.push(0);
        p.extend_from_slice(&1u32.to_le_bytes());
        if !params.is_empty() {
            p.extend(std::iter::repeat_n(0u8, params.len().div_ceil(8)));
            p.push(1);
            for _ in params {
                p.extend_from_slice(&[MYSQL_TYPE_VAR_STRING, 0]);
            }
            for v in params {
                lenenc_str(&mut p, v.as_bytes());
            }
        }
        self.write_packet(0, &p)?;
        self.read_packet()?;
        match self.packet.first() {
            Some(0xff) => bail!("{}", err_text(&self.packet)),
            Some(0) if self.packet.len() >= 7 => return Ok(false),
            _ => {}
        }
        // Column definitions, then EOF.
        self.skip_to_eof()?;
        let mut got = false;
        loop {
            self.read_packet()?;
            if self.is_eof() {
                return Ok(got);
            }
            let row = &self.packet;
            if row.first() != Some(&0) {
                bail!("a row that is not a binary row: {}", err_text(row));
            }
            // header, NULL bitmap of (1 + 7 + 2) / 8 = 1 byte for one column, value.
            let mut at = 2;
            if row.get(1).is_some_and(|b| b & 0b100 != 0) {
                answer.clear();
            } else {
                let n = lenenc_int(row, &mut at)? as usize;
                let v = row
                    .get(at..at + n)
                    .ok_or_else(|| anyhow!("row truncated"))?;
                answer.clear();
                answer.push_str(std::str::from_utf8(v).context("a non-UTF-8 answer")?);
            }
            got = true;
        }
    }
}
