//! What a statement answers: a result set, OK or a MySQL error, computed by typed calls on
//! the [`Applier`] (no policy of its own beyond the SQL forms: the look-ups, their waits
//! and their caps are the applier's). A statement's columns are known before it runs
//! ([`columns`]), as a prepared statement's metadata needs them.

use std::time::Duration;

use tidelog_applier::node::{self, wait_seconds, Applier, GtidPos, MAX_TRX_WAIT};
use tidelog_applier::trx::DEFAULT_WAIT;
use tidelog_applier::trx_json::trx_json_string;

use crate::packets::ParamValue;
use crate::replica;
use crate::statement::{like, Arg, Func, Item, ParseError, SelectItem, Statement};
use crate::variables::{self, Var};

/// A column's type as the endpoint sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A signed 64-bit integer (`LONGLONG`).
    Int,
    /// A UTF-8 string (`VAR_STRING`).
    Text,
}

/// A result set's column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Col {
    pub name: String,
    pub kind: Kind,
}

impl Col {
    pub fn text(name: &str) -> Col {
        Col {
            name: name.to_string(),
            kind: Kind::Text,
        }
    }
    pub fn int(name: &str) -> Col {
        Col {
            name: name.to_string(),
            kind: Kind::Int,
        }
    }
}

/// One value of a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cell {
    Null,
    Int(i64),
    Text(String),
}

/// A MySQL error: code, SQLSTATE and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqlError {
    pub code: u16,
    pub state: [u8; 5],
    pub message: String,
}

impl SqlError {
    pub fn new(code: u16, state: &[u8; 5], message: impl Into<String>) -> SqlError {
        SqlError {
            code,
            state: *state,
            message: message.into(),
        }
    }

    /// 1235 `ER_NOT_SUPPORTED_YET` and friends, from a statement that did not parse.
    pub fn from_parse(e: &ParseError) -> SqlError {
        let code = match e {
            ParseError::Unsupported(_) => 1235,
            ParseError::ParamCount(_) => 1582,
            ParseError::Empty => 1065,
        };
        SqlError::new(code, b"42000", e.to_string())
    }

    /// 1210 `ER_WRONG_ARGUMENTS`.
    pub fn arguments(func: Func, why: impl std::fmt::Display) -> SqlError {
        SqlError::new(
            1210,
            b"HY000",
            format!("Incorrect arguments to {}: {why}", func.name()),
        )
    }

    /// An error of the applier: 1210 for a bad request, else 1105 with the admin API's
    /// error code in front of the message.
    pub fn applier(e: node::Error) -> SqlError {
        match e {
            node::Error::Invalid(m) => SqlError::new(1210, b"HY000", m),
            e => SqlError::new(1105, b"HY000", format!("{}: {e}", e.code())),
        }
    }
}

/// A statement's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Rows(Vec<Col>, Vec<Vec<Cell>>),
    Ok,
    Err(SqlError),
}

/// What a connection knows of itself, for `CONNECTION_ID()`, `DATABASE()`, `USER()` and
/// the session variables.
#[derive(Clone, Debug)]
pub struct Session {
    pub conn_id: u32,
    pub user: String,
    pub db: Option<String>,
    /// Whether the endpoint offers TLS (`@@have_ssl`).
    pub tls_offered: bool,
    pub idle_timeout: Duration,
}

/// The columns `stmt` answers with (none for OK), known before it runs.
pub fn columns(stmt: &Statement) -> Result<Vec<Col>, SqlError> {
    match stmt {
        Statement::Select(items) => items.iter().map(item_column).collect(),
        Statement::ShowVariables(_) => Ok(vec![Col::text("Variable_name"), Col::text("Value")]),
        Statement::ShowReplicaStatus => Ok(replica::columns()),
        Statement::Set | Statement::Use(_) | Statement::NoOp => Ok(Vec::new()),
    }
}

fn item_column(i: &SelectItem) -> Result<Col, SqlError> {
    let kind = match &i.item {
        Item::Call(Func::MasterGtidWait | Func::ConnectionId, _) => Kind::Int,
        Item::Call(..) => Kind::Text,
        Item::Var(v) => variables::find(v)
            .ok_or_else(|| unknown_variable(v))?
            .kind(),
        Item::Literal(Arg::Num(n)) if n.parse::<i64>().is_ok() => Kind::Int,
        Item::Literal(_) => Kind::Text,
    };
    Ok(Col {
        name: i.label.clone(),
        kind,
    })
}

fn unknown_variable(v: &str) -> SqlError {
    SqlError::new(1193, b"HY000", format!("Unknown system variable '{v}'"))
}

/// Runs `stmt` with `params` bound to its `?`s (in order).
pub async fn execute(
    applier: &Applier,
    stmt: &Statement,
    params: &[ParamValue],
    s: &mut Session,
) -> Answer {
    match run(applier, stmt, params, s).await {
        Ok(a) => a,
        Err(e) => Answer::Err(e),
    }
}

async fn run(
    applier: &Applier,
    stmt: &Statement,
    params: &[ParamValue],
    s: &mut Session,
) -> Result<Answer, SqlError> {
    match stmt {
        Statement::Select(items) => {
            let cols = columns(stmt)?;
            let mut row = Vec::with_capacity(items.len());
            for i in items {
                row.push(item(applier, &i.item, params, s).await?);
            }
            Ok(Answer::Rows(cols, vec![row]))
        }
        Statement::ShowVariables(pattern) => {
            let pattern = match pattern {
                None => None,
                Some(a) => match value(a, params)? {
                    Val::Text(t) => Some(t),
                    Val::Num(n) => Some(n),
                    Val::Null => return Ok(Answer::Rows(columns(stmt)?, Vec::new())),
                },
            };
            let mut rows = Vec::new();
            for v in variables::ALL {
                if pattern.as_deref().is_none_or(|p| like(p, v.name)) {
                    let cell = variables::value(applier, v, s)?;
                    let text = match cell {
                        Cell::Null => String::new(),
                        Cell::Int(n) => n.to_string(),
                        Cell::Text(t) => t,
                    };
                    rows.push(vec![Cell::Text(v.name.to_string()), Cell::Text(text)]);
                }
            }
            Ok(Answer::Rows(columns(stmt)?, rows))
        }
        Statement::ShowReplicaStatus => {
            let rows = replica::rows(applier).await?;
            Ok(Answer::Rows(replica::columns(), rows))
        }
        Statement::Use(db) => {
            s.db = Some(db.clone());
            Ok(Answer::Ok)
        }
        Statement::Set | Statement::NoOp => Ok(Answer::Ok),
    }
}

/// An argument's value.
enum Val {
    Null,
    Text(String),
    /// A number as text (`5`, `0.5`, `-1`).
    Num(String),
}

fn value(a: &Arg, params: &[ParamValue]) -> Result<Val, SqlError> {
    Ok(match a {
        Arg::Str(s) => Val::Text(s.clone()),
        Arg::Num(n) => Val::Num(n.clone()),
        Arg::Null => Val::Null,
        Arg::Param(i) => match params.get(*i) {
            None => {
                return Err(SqlError::new(
                    1210,
                    b"HY000",
                    format!(
                        "Incorrect arguments to EXECUTE: parameter {} not given",
                        i + 1
                    ),
                ))
            }
            Some(ParamValue::Null) => Val::Null,
            Some(ParamValue::Text(t)) => Val::Text(t.clone()),
            Some(ParamValue::Int(n)) => Val::Num(n.to_string()),
            Some(ParamValue::Float(f)) => Val::Num(f.to_string()),
        },
    })
}

/// A wait argument in seconds: a number, or a string holding one (`NULL`: `default`).
fn seconds(
    func: Func,
    a: Option<&Arg>,
    params: &[ParamValue],
    default: Duration,
) -> Result<Duration, SqlError> {
    let text = match a.map(|a| value(a, params)).transpose()? {
        None | Some(Val::Null) => return Ok(default),
        Some(Val::Num(n)) | Some(Val::Text(n)) => n,
    };
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| SqlError::arguments(func, format!("{text:?} is not a number of seconds")))?;
    wait_seconds(secs).map_err(|e| SqlError::arguments(func, e))
}

async fn item(
    applier: &Applier,
    item: &Item,
    params: &[ParamValue],
    s: &Session,
) -> Result<Cell, SqlError> {
    match item {
        Item::Literal(a) => Ok(match value(a, params)? {
            Val::Null => Cell::Null,
            Val::Num(n) => n.parse().map_or(Cell::Text(n), Cell::Int),
            Val::Text(t) => Cell::Text(t),
        }),
        Item::Var(v) => {
            let var = variables::find(v).ok_or_else(|| unknown_variable(v))?;
            variables::value(applier, var, s)
        }
        Item::Call(f, args) => call(applier, *f, args, params, s).await,
    }
}

async fn call(
    applier: &Applier,
    f: Func,
    args: &[Arg],
    params: &[ParamValue],
    s: &Session,
) -> Result<Cell, SqlError> {
    match f {
        Func::TrxStatus | Func::TrxStatusJson => {
            let id = match value(&args[0], params)? {
                Val::Null => return Ok(Cell::Null),
                Val::Text(t) | Val::Num(t) => t,
            };
            let hint = match args.get(1).map(|a| value(a, params)).transpose()? {
                None | Some(Val::Null) => None,
                Some(Val::Text(t)) => Some(t),
                Some(Val::Num(n)) => {
                    return Err(SqlError::arguments(
                        f,
                        format!("the gtid hint {n} is a number, not 'domain-server-seq'"),
                    ))
                }
            };
            let wait = seconds(f, args.get(2), params, DEFAULT_WAIT)?;
            let answer = applier
                .trx_status(&id, hint.as_deref(), wait)
                .await
                .map_err(SqlError::applier)?;
            Ok(Cell::Text(if f == Func::TrxStatus {
                answer.state.name().to_string()
            } else {
                trx_json_string(&answer)
            }))
        }
        Func::MasterGtidWait => {
            let pos = match value(&args[0], params)? {
                Val::Null => return Ok(Cell::Null),
                Val::Text(t) | Val::Num(t) => t,
            };
            let timeout = seconds(f, args.get(1), params, MAX_TRX_WAIT)?;
            let pos: GtidPos = pos
                .parse()
                .map_err(|e: node::Error| SqlError::arguments(f, e))?;
            let reached = applier
                .wait_gtid_pos(&pos, timeout)
                .await
                .map_err(SqlError::applier)?;
            Ok(Cell::Int(if reached { 0 } else { -1 }))
        }
        Func::Database => Ok(s.db.clone().map_or(Cell::Null, Cell::Text)),
        Func::Version => variables::value(applier, &Var::VERSION, s),
        Func::ConnectionId => Ok(Cell::Int(s.conn_id.into())),
        Func::User => Ok(Cell::Text(format!("{}@%", s.user))),
    }
}
