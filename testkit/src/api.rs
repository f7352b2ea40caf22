//! A blocking client of a daemon's admin API ([`Api`]) for the demo, the fault run, the
//! benches and the tests, and the bank's consistent read ([`BANK_SCAN`], [`bank_sum`]).

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::http1::Http1;

/// A blocking client of an admin socket: one keep-alive HTTP/1.1 connection ([`Http1`]),
/// opened on first use and again after it broke (a restarted daemon). Reads give up after
/// 10 s of silence. One per thread: it is `Send`, not `Sync`.
#[derive(Debug)]
pub struct Api {
    socket: PathBuf,
    conn: RefCell<Option<Http1>>,
}

impl Api {
    /// A client of `socket`; nothing is connected yet.
    pub fn new(socket: &Path) -> Api {
        Api {
            socket: socket.to_path_buf(),
            conn: RefCell::new(None),
        }
    }

    /// `GET path`: the status and the JSON body (`null` when not JSON). Made again once on
    /// a new connection if it failed on the kept one (the daemon may have closed it).
    pub fn get(&self, path: &str) -> Result<(u16, Value)> {
        let (status, body) = self.get_raw(path)?;
        Ok((status, json(&body)))
    }

    /// [`Api::get`] with the body as it came.
    pub fn get_raw(&self, path: &str) -> Result<(u16, Vec<u8>)> {
        self.raw("GET", path).or_else(|_| self.raw("GET", path))
    }

    /// One request on the kept connection (opened if needed), never repeated: the status
    /// and the JSON body (`null` when not JSON).
    pub fn request(&self, method: &str, path: &str) -> Result<(u16, Value)> {
        let (status, body) = self.raw(method, path)?;
        Ok((status, json(&body)))
    }

    fn raw(&self, method: &str, path: &str) -> Result<(u16, Vec<u8>)> {
        let mut conn = self.conn.borrow_mut();
        let c = match &mut *conn {
            Some(c) => c,
            None => conn.insert(Http1::connect(&self.socket)?),
        };
        let answer = c.request(method, path);
        if answer.is_err() {
            // Whatever is left of a failed exchange is not the next answer.
            *conn = None;
        }
        answer
    }
}

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

/// The consistent read of every bank balance (`GET /v1/scan?prefix=acct/`).
pub const BANK_SCAN: &str = "/v1/scan?prefix=acct/&limit=100000";

/// The bank total, the number of accounts and the `read_ht` of a [`BANK_SCAN`] answer.
pub fn bank_sum(v: &Value) -> Result<(u64, usize, String)> {
    let items = v["items"].as_array().cloned().unwrap_or_default();
    let mut total = 0u64;
    for i in &items {
        let s = i["value"].as_str().context("balance is not a string")?;
        total += s.parse::<u64>().with_context(|| format!("balance {s:?}"))?;
    }
    Ok((
        total,
        items.len(),
        v["read_ht"].as_str().unwrap_or("").to_string(),
    ))
}
