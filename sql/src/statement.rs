//! The statements the endpoint answers, recognised from their text: no I/O, no applier.
//!
//! A small tokenizer (case-insensitive keywords, `'…'` and `"…"` strings with backslash
//! escapes and doubled quotes, `` `…` `` identifiers, `@@[session.|global.]name`, numbers,
//! `?` placeholders, `-- `, `#` and `/* */` comments) feeds a parser of the handful of
//! forms in the table below; anything else is a [`ParseError`] the connection answers
//! with MySQL error 1235, naming what is supported, and keeps going.
//!
//! | form | [`Statement`] |
//! | --- | --- |
//! | `SELECT item [AS a] [, item …] [LIMIT n]` | `Select` (items: `trx_status(…)`, `trx_status_json(…)`, `MASTER_GTID_WAIT(…)`, `@@var`, `DATABASE()`, `VERSION()`, `CONNECTION_ID()`, `USER()`, literals) |
//! | `SHOW [GLOBAL\|SESSION] VARIABLES [LIKE 'p']` | `ShowVariables` |
//! | `SHOW REPLICA STATUS`, `SHOW SLAVE STATUS` | `ShowReplicaStatus` |
//! | `SET NAMES …`, `SET [SESSION\|LOCAL] a = v, …`, `SET autocommit = 1`, `SET CHARACTER SET …` | `Set` |
//! | `USE db` | `Use` |
//! | `COMMIT`, `ROLLBACK`, `BEGIN`, `START TRANSACTION` | `NoOp` (nothing is written here) |

use std::fmt;

/// What tidelog's SQL endpoint answers, for the error that refuses anything else.
pub const SUPPORTED: &str = "tidelog answers SELECT trx_status(id [, gtid_hint [, wait_seconds]]), \
SELECT trx_status_json(id [, gtid_hint [, wait_seconds]]), SELECT MASTER_GTID_WAIT(pos [, timeout]), \
SELECT @@gtid_current_pos, @@gtid_binlog_pos and other @@variables, SHOW REPLICA STATUS, \
SHOW VARIABLES [LIKE 'p'], SET (session set-up), USE and COM_PING";

/// The longest statement text looked at (a longer one is refused, not parsed).
pub const MAX_STATEMENT: usize = 64 * 1024;

/// A statement the text did not parse to; `Display` is the client's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not one of the supported forms (1235).
    Unsupported(String),
    /// A known function called with the wrong number of arguments (1582).
    ParamCount(&'static str),
    /// Nothing but whitespace and comments (1065).
    Empty,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Unsupported(why) => write!(f, "{why}; {SUPPORTED}"),
            ParseError::ParamCount(func) => {
                write!(
                    f,
                    "Incorrect parameter count in the call to native function '{func}'"
                )
            }
            ParseError::Empty => f.write_str("Query was empty"),
        }
    }
}

/// A function argument: a literal, or the `n`-th `?` of the statement (from 0).
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Str(String),
    /// A number as written (`5`, `0.5`, `-1`).
    Num(String),
    Null,
    Param(usize),
}

/// The functions a `SELECT` may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    TrxStatus,
    TrxStatusJson,
    MasterGtidWait,
    Database,
    Version,
    ConnectionId,
    User,
}

impl Func {
    fn by_name(name: &str) -> Option<Func> {
        Some(match name.to_ascii_lowercase().as_str() {
            "trx_status" => Func::TrxStatus,
            "trx_status_json" => Func::TrxStatusJson,
            "master_gtid_wait" => Func::MasterGtidWait,
            "database" | "schema" => Func::Database,
            "version" => Func::Version,
            "connection_id" => Func::ConnectionId,
            "user" | "current_user" | "session_user" | "system_user" => Func::User,
            _ => return None,
        })
    }

    /// The name as MySQL errors spell it.
    pub fn name(self) -> &'static str {
        match self {
            Func::TrxStatus => "trx_status",
            Func::TrxStatusJson => "trx_status_json",
            Func::MasterGtidWait => "MASTER_GTID_WAIT",
            Func::Database => "DATABASE",
            Func::Version => "VERSION",
            Func::ConnectionId => "CONNECTION_ID",
            Func::User => "USER",
        }
    }

    /// How many arguments it takes, at least and at most.
    fn arity(self) -> (usize, usize) {
        match self {
            Func::TrxStatus | Func::TrxStatusJson => (1, 3),
            Func::MasterGtidWait => (1, 2),
            _ => (0, 0),
        }
    }
}

/// One item of a `SELECT` list.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Call(Func, Vec<Arg>),
    /// `@@name` (lower case, without `session.`/`global.`).
    Var(String),
    Literal(Arg),
}

/// An item with its column name (its text as written, or its alias).
#[derive(Debug, Clone, PartialEq)]
pub struct SelectItem {
    pub item: Item,
    pub label: String,
}

/// A recognised statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    Select(Vec<SelectItem>),
    /// `SHOW VARIABLES`, with the `LIKE` pattern if any.
    ShowVariables(Option<Arg>),
    ShowReplicaStatus,
    /// Session set-up, answered OK (the endpoint's session has nothing to change).
    Set,
    Use(String),
    NoOp,
}

/// A parsed statement and how many `?` placeholders it has.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub statement: Statement,
    pub params: usize,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Quoted(String),
    Str(String),
    Num(String),
    Var(String),
    Param,
    Punct(char),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    start: usize,
    end: usize,
}

fn unsupported(why: impl Into<String>) -> ParseError {
    ParseError::Unsupported(why.into())
}

/// Splits `text` into tokens; an unterminated string or comment, or a character outside
/// the grammar, is an error.
fn tokenize(text: &str) -> Result<Vec<Token>, ParseError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        match c {
            b' ' | b'\t' | b'\r' | b'\n' | b'\x0c' => i += 1,
            b'#' => i = line_end(b, i),
            b'-' if b.get(i + 1) == Some(&b'-')
                && b.get(i + 2).is_none_or(|c| c.is_ascii_whitespace()) =>
            {
                i = line_end(b, i)
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let close = text[i + 2..]
                    .find("*/")
                    .ok_or_else(|| unsupported("an unterminated /* comment"))?;
                i += 2 + close + 2;
            }
            b'\'' | b'"' => {
                let (s, next) = string(text, i)?;
                out.push(Token {
                    tok: Tok::Str(s),
                    start,
                    end: next,
                });
                i = next;
            }
            b'`' => {
                let (s, next) = backquoted(text, i)?;
                out.push(Token {
                    tok: Tok::Quoted(s),
                    start,
                    end: next,
                });
                i = next;
            }
            b'@' if b.get(i + 1) == Some(&b'@') => {
                let mut j = i + 2;
                while j < b.len() && (is_word(b[j]) || b[j] == b'.') {
                    j += 1;
                }
                let name = text[i + 2..j].to_ascii_lowercase();
                let name = name
                    .strip_prefix("session.")
                    .or_else(|| name.strip_prefix("global."))
                    .or_else(|| name.strip_prefix("local."))
                    .unwrap_or(&name)
                    .to_string();
                if name.is_empty() || name.contains('.') {
                    return Err(unsupported(format!("the variable {:?}", &text[i..j])));
                }
                out.push(Token {
                    tok: Tok::Var(name),
                    start,
                    end: j,
                });
                i = j;
            }
            b'0'..=b'9' => {
                let mut j = i;
                while j < b.len() && (b[j].is_ascii_digit() || b[j] == b'.') {
                    j += 1;
                }
                if j < b.len() && is_word(b[j]) {
                    return Err(unsupported(format!("the token {:?}", word_at(text, i))));
                }
                out.push(Token {
                    tok: Tok::Num(text[i..j].to_string()),
                    start,
                    end: j,
                });
                i = j;
            }
            c if is_word(c) => {
                let mut j = i;
                while j < b.len() && is_word(b[j]) {
                    j += 1;
                }
                out.push(Token {
                    tok: Tok::Word(text[i..j].to_string()),
                    start,
                    end: j,
                });
                i = j;
            }
            b'?' => {
                out.push(Token {
                    tok: Tok::Param,
                    start,
                    end: i + 1,
                });
                i += 1;
            }
            b'(' | b')' | b',' | b'=' | b';' | b'.' | b'*' | b'-' | b':' => {
                out.push(Token {
                    tok: Tok::Punct(c as char),
                    start,
                    end: i + 1,
                });
                i += 1;
            }
            _ => {
                let ch = text[i..].chars().next().unwrap_or('?');
                return Err(unsupported(format!("the character {ch:?}")));
            }
        }
    }
    Ok(out)
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

fn word_at(text: &str, i: usize) -> &str {
    let b = text.as_bytes();
    let mut j = i;
    while j < b.len() && (is_word(b[j]) || b[j] == b'.') {
        j += 1;
    }
    &text[i..j]
}

fn line_end(b: &[u8], i: usize) -> usize {
    b[i..]
        .iter()
        .position(|&c| c == b'\n')
        .map_or(b.len(), |p| i + p + 1)
}

/// A `'…'` or `"…"` string from `text[i]`: backslash escapes (`\n`, `\t`, `\0`, `\\`,
/// `\'`, any other character as itself) and a doubled quote for the quote. Returns the
/// value and the index after the closing quote.
fn string(text: &str, i: usize) -> Result<(String, usize), ParseError> {
    let quote = text.as_bytes()[i] as char;
    let mut out = String::new();
    let mut chars = text[i + 1..].char_indices().peekable();
    while let Some((k, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, e)) => out.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    '0' => '\0',
                    'b' => '\u{8}',
                    'Z' => '\u{1a}',
                    e => e,
                }),
                None => break,
            },
            c if c == quote => {
                if chars.peek().is_some_and(|(_, n)| *n == quote) {
                    chars.next();
                    out.push(quote);
                } else {
                    return Ok((out, i + 1 + k + 1));
                }
            }
            c => out.push(c),
        }
    }
    Err(unsupported("an unterminated string"))
}

fn backquoted(text: &str, i: usize) -> Result<(String, usize), ParseError> {
    let mut out = String::new();
    let mut chars = text[i + 1..].char_indices().peekable();
    while let Some((k, c)) = chars.next() {
        if c == '`' {
            if chars.peek().is_some_and(|(_, n)| *n == '`') {
                chars.next();
                out.push('`');
            } else {
                return Ok((out, i + 1 + k + 1));
            }
        } else {
            out.push(c);
        }
    }
    Err(unsupported("an unterminated `identifier`"))
}

/// The parser's cursor over the tokens.
struct Cursor<'a> {
    text: &'a str,
    toks: Vec<Token>,
    pos: usize,
    params: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).map(|t| t.tok.clone());
        self.pos += 1;
        t
    }

    fn keyword(&self, k: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(w)) if w.eq_ignore_ascii_case(k))
    }

    fn eat_keyword(&mut self, k: &str) -> bool {
        let yes = self.keyword(k);
        if yes {
            self.pos += 1;
        }
        yes
    }

    fn eat_punct(&mut self, p: char) -> bool {
        let yes = self.peek() == Some(&Tok::Punct(p));
        if yes {
            self.pos += 1;
        }
        yes
    }

    fn expect_punct(&mut self, p: char, what: &str) -> Result<(), ParseError> {
        if self.eat_punct(p) {
            Ok(())
        } else {
            Err(unsupported(format!("expected {p:?} {what}")))
        }
    }

    /// The text from token `from` up to the current position.
    fn text_since(&self, from: usize) -> String {
        let (Some(a), Some(b)) = (self.toks.get(from), self.toks.get(self.pos.max(1) - 1)) else {
            return String::new();
        };
        self.text
            .get(a.start..b.end)
            .unwrap_or_default()
            .to_string()
    }

    /// Whether only a `;` (or nothing) is left.
    fn at_end(&mut self) -> bool {
        self.eat_punct(';');
        self.pos >= self.toks.len()
    }

    fn arg(&mut self) -> Result<Arg, ParseError> {
        let neg = self.eat_punct('-');
        let a = match self.next() {
            Some(Tok::Str(s)) if !neg => Arg::Str(s),
            Some(Tok::Num(n)) => Arg::Num(if neg { format!("-{n}") } else { n }),
            Some(Tok::Word(w)) if !neg && w.eq_ignore_ascii_case("null") => Arg::Null,
            Some(Tok::Param) if !neg => {
                self.params += 1;
                Arg::Param(self.params - 1)
            }
            other => {
                return Err(unsupported(format!(
                    "an argument must be a string, a number, NULL or ?, not {}",
                    describe(other.as_ref())
                )))
            }
        };
        Ok(a)
    }
}

fn describe(t: Option<&Tok>) -> String {
    match t {
        None => "the end of the statement".into(),
        Some(Tok::Word(w)) | Some(Tok::Quoted(w)) => format!("{w:?}"),
        Some(Tok::Str(s)) => format!("the string {s:?}"),
        Some(Tok::Num(n)) => format!("the number {n}"),
        Some(Tok::Var(v)) => format!("@@{v}"),
        Some(Tok::Param) => "?".into(),
        Some(Tok::Punct(p)) => format!("{p:?}"),
    }
}

/// Parses one statement.
pub fn parse(text: &str) -> Result<Parsed, ParseError> {
    if text.len() > MAX_STATEMENT {
        return Err(unsupported(format!(
            "a statement of {} bytes (at most {MAX_STATEMENT})",
            text.len()
        )));
    }
    let toks = tokenize(text)?;
    if toks.is_empty() {
        return Err(ParseError::Empty);
    }
    let mut c = Cursor {
        text,
        toks,
        pos: 0,
        params: 0,
    };
    let statement = if c.eat_keyword("select") {
        select(&mut c)?
    } else if c.eat_keyword("show") {
        show(&mut c)?
    } else if c.eat_keyword("set") {
        set(&mut c)?
    } else if c.eat_keyword("use") {
        let db = match c.next() {
            Some(Tok::Word(w)) | Some(Tok::Quoted(w)) => w,
            other => return Err(unsupported(format!("USE {}", describe(other.as_ref())))),
        };
        Statement::Use(db)
    } else if c.eat_keyword("commit") || c.eat_keyword("rollback") || c.eat_keyword("begin") {
        c.eat_keyword("work");
        Statement::NoOp
    } else if c.eat_keyword("start") {
        if !c.eat_keyword("transaction") {
            return Err(unsupported("START without TRANSACTION"));
        }
        Statement::NoOp
    } else {
        return Err(unsupported(format!(
            "the statement {}",
            describe(c.peek()).to_uppercase()
        )));
    };
    if !c.at_end() {
        return Err(unsupported(format!(
            "{} after the statement",
            describe(c.peek())
        )));
    }
    Ok(Parsed {
        statement,
        params: c.params,
    })
}

fn select(c: &mut Cursor<'_>) -> Result<Statement, ParseError> {
    let mut items = Vec::new();
    loop {
        let from = c.pos;
        let item = match c.next() {
            Some(Tok::Var(v)) => Item::Var(v),
            Some(Tok::Word(w)) if c.peek() == Some(&Tok::Punct('(')) => {
                let func =
                    Func::by_name(&w).ok_or_else(|| unsupported(format!("the function {w}()")))?;
                c.pos += 1;
                let mut args = Vec::new();
                if !c.eat_punct(')') {
                    loop {
                        args.push(c.arg()?);
                        if c.eat_punct(')') {
                            break;
                        }
                        c.expect_punct(',', "between arguments")?;
                    }
                }
                let (lo, hi) = func.arity();
                if args.len() < lo || args.len() > hi {
                    return Err(ParseError::ParamCount(func.name()));
                }
                Item::Call(func, args)
            }
            Some(Tok::Word(w))
                if ["current_user", "user"].contains(&w.to_ascii_lowercase().as_str()) =>
            {
                Item::Call(Func::User, Vec::new())
            }
            _ => {
                c.pos = from;
                Item::Literal(c.arg()?)
            }
        };
        let mut label = c.text_since(from);
        if c.eat_keyword("as") {
            label = match c.next() {
                Some(Tok::Word(w)) | Some(Tok::Quoted(w)) | Some(Tok::Str(w)) => w,
                other => return Err(unsupported(format!("AS {}", describe(other.as_ref())))),
            };
        } else if let Some(Tok::Quoted(w)) = c.peek() {
            label = w.clone();
            c.pos += 1;
        }
        items.push(SelectItem { item, label });
        if !c.eat_punct(',') {
            break;
        }
    }
    if c.eat_keyword("limit") {
        match c.next() {
            Some(Tok::Num(_)) => {}
            other => return Err(unsupported(format!("LIMIT {}", describe(other.as_ref())))),
        }
    }
    Ok(Statement::Select(items))
}

fn show(c: &mut Cursor<'_>) -> Result<Statement, ParseError> {
    let _ = c.eat_keyword("global") || c.eat_keyword("session");
    if c.eat_keyword("variables") {
        if c.eat_keyword("like") {
            return Ok(Statement::ShowVariables(Some(c.arg()?)));
        }
        return Ok(Statement::ShowVariables(None));
    }
    if (c.eat_keyword("replica") || c.eat_keyword("slave")) && c.eat_keyword("status") {
        return Ok(Statement::ShowReplicaStatus);
    }
    Err(unsupported(format!(
        "SHOW {}",
        describe(c.peek()).to_uppercase()
    )))
}

/// `SET NAMES x [COLLATE y]`, `SET CHARACTER SET x`, or assignments `[SESSION|LOCAL]
/// name = value` / `@@[session.]name = value`, comma-separated. `SET GLOBAL` is refused:
/// nothing of the endpoint is global.
fn set(c: &mut Cursor<'_>) -> Result<Statement, ParseError> {
    let value = |c: &mut Cursor<'_>| -> Result<(), ParseError> {
        match c.next() {
            Some(Tok::Word(_)) | Some(Tok::Str(_)) | Some(Tok::Num(_)) | Some(Tok::Quoted(_)) => {
                Ok(())
            }
            Some(Tok::Punct('-')) => match c.next() {
                Some(Tok::Num(_)) => Ok(()),
                other => Err(unsupported(format!("SET to -{}", describe(other.as_ref())))),
            },
            other => Err(unsupported(format!("SET to {}", describe(other.as_ref())))),
        }
    };
    if c.eat_keyword("names") {
        value(c)?;
        if c.eat_keyword("collate") {
            value(c)?;
        }
        return Ok(Statement::Set);
    }
    if c.eat_keyword("character") {
        if !c.eat_keyword("set") {
            return Err(unsupported("SET CHARACTER without SET"));
        }
        value(c)?;
        return Ok(Statement::Set);
    }
    if c.keyword("global") {
        return Err(unsupported(
            "SET GLOBAL (this endpoint has no global settings)",
        ));
    }
    loop {
        let _ = c.eat_keyword("session") || c.eat_keyword("local");
        match c.next() {
            Some(Tok::Word(_)) | Some(Tok::Var(_)) => {}
            other => return Err(unsupported(format!("SET {}", describe(other.as_ref())))),
        }
        if !(c.eat_punct('=') || (c.eat_punct(':') && c.eat_punct('='))) {
            return Err(unsupported("SET without ="));
        }
        value(c)?;
        if !c.eat_punct(',') {
            return Ok(Statement::Set);
        }
    }
}

/// MySQL's `LIKE`: `%` any run, `_` one character, `\` escapes; case-insensitive (the
/// variables' names are ASCII). Dynamic programming over (pattern, name) positions: linear
/// in their product whatever the pattern.
pub fn like(pattern: &str, name: &str) -> bool {
    #[derive(Clone, Copy)]
    enum P {
        Any,
        One,
        Char(char),
    }
    let mut p = Vec::new();
    let mut it = pattern.chars();
    while let Some(c) = it.next() {
        p.push(match c {
            '%' => P::Any,
            '_' => P::One,
            '\\' => P::Char(it.next().unwrap_or('\\')),
            c => P::Char(c),
        });
    }
    let n: Vec<char> = name.chars().collect();
    // ok[j]: the pattern so far matches n[..j].
    let mut ok = vec![false; n.len() + 1];
    ok[0] = true;
    for t in &p {
        let mut next = vec![false; n.len() + 1];
        match t {
            P::Any => {
                let mut any = false;
                for j in 0..=n.len() {
                    any |= ok[j];
                    next[j] = any;
                }
            }
            P::One => next[1..].copy_from_slice(&ok[..n.len()]),
            P::Char(c) => {
                for j in 1..=n.len() {
                    next[j] = ok[j - 1] && n[j - 1].eq_ignore_ascii_case(c);
                }
            }
        }
        ok = next;
    }
    ok[n.len()]
}

#[cfg(test)]
mod tests;
