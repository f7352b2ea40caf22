//! The API's error answer, `{"error": code, "message": text}` with its HTTP status.

use std::fmt;

use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

/// An error answer: `{"error": code, "message": text}` with an HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status: 400 bad request, 404 unknown route or object, 409 conflicting state,
    /// 503 unavailable (e.g. `stale_safe_time`), 500 internal.
    pub status: StatusCode,
    /// A stable snake_case code, e.g. `bad_request`, `stale_safe_time`.
    pub code: String,
    /// Text for a human; names what is wrong (the key, the lagging tablet).
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
        }
    }
    /// 400 `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    /// 409 with a code saying which state conflicts (e.g. `promoted`).
    pub fn conflict(code: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, code, message)
    }
    /// 503 with a code such as `stale_safe_time` or `safe_time_uninitialized`.
    pub fn unavailable(code: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
    }
    /// 500 `internal`; the message is the error chain.
    pub fn internal(err: &anyhow::Error) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("{err:#}"),
        )
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

/// The JSON error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(ErrorBody {
                error: self.code,
                message: self.message,
            }),
        )
            .into_response()
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        ApiError::internal(&e)
    }
}

/// The fallback for unknown routes: 404 `{"error":"not_found","message":"no route GET /x"}`.
/// [`serve`] installs it; call it from a custom fallback if you replace that.
pub async fn not_found(method: axum::http::Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route {method} {}", uri.path()))
}
