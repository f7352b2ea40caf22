//! What requests carry and answers hold: query parameters (a JSON 400 naming the field),
//! hybrid times as decimal strings, keys and values as UTF-8 strings or `{"b64": …}`, and
//! the Prometheus text answer.

use std::fmt;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, Uri};
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use super::error::ApiError;

/// `axum::extract::Query` whose rejection is the API's JSON 400 (`bad_request`, naming the
/// field) instead of axum's plain-text one. Hybrid-time fields: `#[serde(with = "opt_ht",
/// default)]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// A Prometheus text exposition answer (`GET /metrics`).
pub fn prometheus(text: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// A `?tablet=T` parameter (`None`: all tablets); a malformed id is a 400 naming it.
pub fn parse_tablet(tablet: Option<&str>) -> Result<Option<tidelog_wal::TabletId>, ApiError> {
    tablet
        .map(|t| {
            t.parse::<tidelog_wal::TabletId>()
                .map_err(|e| ApiError::bad_request(format!("tablet: {e}")))
        })
        .transpose()
}

/// Parses a query or path value the API takes as a hybrid time (decimal u64).
pub fn parse_ht(field: &str, s: &str) -> Result<u64, ApiError> {
    s.trim().parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "{field}: {s:?} is not a hybrid time (a decimal u64)"
        ))
    })
}

/// Percent-decodes `s` to bytes (keys need not be UTF-8: `/v1/kv/%00%FF` names the key
/// `00 FF`); in a query value `+` is a space, as in forms. A `%` without two hex digits after
/// it is a 400 naming `field` and the offset.
pub fn percent_decode(field: &str, s: &str, plus_is_space: bool) -> Result<Vec<u8>, ApiError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                // Two hex digits (`from_str_radix` alone would take a sign: `%+1`).
                let hex = b
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => out.push(v),
                    None => {
                        return Err(ApiError::bad_request(format!(
                            "{field}: bad percent-encoding at byte {i} of {s:?}"
                        )))
                    }
                }
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// The raw (percent-decoded) bytes of query parameter `name`, if present; the last one
/// wins, as with the typed query.
pub fn query_bytes(uri: &Uri, name: &str) -> Result<Option<Vec<u8>>, ApiError> {
    let mut found = None;
    for pair in uri.query().unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if percent_decode("query", k, true)? == name.as_bytes() {
            found = Some(percent_decode(name, v, true)?);
        }
    }
    Ok(found)
}

/// Parses a query value the API takes as a duration (`"5s"`, `"250ms"`).
pub fn parse_wait(field: &str, s: &str) -> Result<std::time::Duration, ApiError> {
    humantime::parse_duration(s.trim())
        .map_err(|e| ApiError::bad_request(format!("{field}: {s:?} is not a duration: {e}")))
}

/// `#[serde(with = "tidelog::admin::ht")]` for a `u64` hybrid time: written as a decimal
/// string, read from a decimal string or a non-negative integer.
pub mod ht {
    use super::*;

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        d.deserialize_any(HtVisitor)
    }

    pub(super) struct HtVisitor;

    impl Visitor<'_> for HtVisitor {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a hybrid time as a decimal string or a non-negative integer")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format!("hybrid time {v} is negative")))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
            Err(E::custom(format!(
                "hybrid time {v} is not an integer; send it as a decimal string"
            )))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            v.trim()
                .parse()
                .map_err(|_| E::custom(format!("hybrid time {v:?} is not a decimal u64")))
        }
    }
}

/// `#[serde(with = "tidelog::admin::opt_ht", default)]` for an `Option<u64>` hybrid time;
/// `None` is `null`.
pub mod opt_ht {
    use super::*;

    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Option<u64>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("null or a hybrid time")
            }
            fn visit_none<E: de::Error>(self) -> Result<Option<u64>, E> {
                Ok(None)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
                Ok(None)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
                super::ht::deserialize(d).map(Some)
            }
        }
        d.deserialize_option(V)
    }
}

/// A key or value in the API's JSON form: a string when the bytes are UTF-8, else
/// `{"b64": "<standard base64>"}`. Both forms are accepted on input.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct JsonBytes(pub Vec<u8>);

impl From<Vec<u8>> for JsonBytes {
    fn from(v: Vec<u8>) -> Self {
        JsonBytes(v)
    }
}

impl From<&[u8]> for JsonBytes {
    fn from(v: &[u8]) -> Self {
        JsonBytes(v.to_vec())
    }
}

impl From<&str> for JsonBytes {
    fn from(v: &str) -> Self {
        JsonBytes(v.as_bytes().to_vec())
    }
}

impl Serialize for JsonBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("b64", &BASE64.encode(&self.0))?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for JsonBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JsonBytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or {\"b64\": \"...\"}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<JsonBytes, E> {
                Ok(JsonBytes(v.as_bytes().to_vec()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonBytes, A::Error> {
                let mut out = None;
                while let Some(k) = map.next_key::<String>()? {
                    if k != "b64" {
                        return Err(de::Error::custom(format!(
                            "unknown field `{k}` in bytes; expected only `b64`"
                        )));
                    }
                    if out.is_some() {
                        return Err(de::Error::custom("duplicate field `b64`"));
                    }
                    let text: String = map.next_value()?;
                    out = Some(BASE64.decode(text.as_bytes()).map_err(|e| {
                        de::Error::custom(format!("`b64` is not standard base64: {e}"))
                    })?);
                }
                out.map(JsonBytes)
                    .ok_or_else(|| de::Error::custom("missing field `b64`"))
            }
        }
        d.deserialize_any(V)
    }
}
