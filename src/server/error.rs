//! The API's errors: each maps to one HTTP status and a stable snake_case `code`, written as
//! `{"error": {"code": ..., "message": ...}}` in the negotiated format (the
//! [`negotiate_errors`](super::codec::negotiate_errors) middleware re-encodes the JSON body that
//! [`ApiError::into_response`] writes when the client asked for MessagePack).
//!
//! 4xx messages say what was wrong and where; 5xx bodies are generic and the details go to the
//! log.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::api::BodyError;

/// An error answered to the client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("unsupported Content-Type {got:?}: expected application/json or application/msgpack (also application/x-msgpack, application/vnd.msgpack)")]
    UnsupportedMediaType { got: String },
    #[error("request body of {got} bytes is over the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize, got: String },
    #[error("request body not received whole within {timeout_ms} ms (body_timeout_ms)")]
    BodyTimeout { timeout_ms: u64 },
    #[error("{format} body does not parse: {reason}")]
    BadBody {
        format: &'static str,
        reason: String,
    },
    #[error("{0}")]
    InvalidRequest(String),
    #[error("invalid ranker name {name:?}: expected 1 to 64 characters of A-Z a-z 0-9 _ -")]
    BadRankerName { name: String },
    #[error("ranker {name:?} is invalid: {reason}")]
    BadRanker { name: String, reason: String },
    #[error("no ranker named {name:?}")]
    UnknownRanker { name: String },
    #[error("no index is loaded: start the server with --index DIR, or POST /v1/index/reload with {{\"dir\": DIR}}")]
    NoIndex,
    #[error("index {dir} was not loaded, the index being served is unchanged: {reason}")]
    BadIndex { dir: String, reason: String },
    #[error("request target of {length} bytes is over the limit of {limit} bytes")]
    UriTooLong { length: usize, limit: usize },
    #[error("no route for {method} {path}")]
    NotFound { method: String, path: String },
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("admin route needs `Authorization: Bearer TOKEN` with the configured token")]
    Unauthorized,
    #[error("admin routes are disabled: no admin token is configured (admin_token / RANKSERVE_ADMIN_TOKEN)")]
    AdminDisabled,
    #[error("backend=gpu asked for, but this server has no usable GPU (see /readyz for why); use backend=auto or cpu")]
    GpuUnavailable,
    #[error("the queue for ranker {ranker:?} is full ({capacity} requests); retry after {retry_after_s} s")]
    Overloaded {
        ranker: String,
        capacity: usize,
        retry_after_s: u32,
    },
    #[error("deadline of {timeout_ms} ms exceeded")]
    DeadlineExceeded { timeout_ms: u64 },
    #[error("not ready: {0}")]
    NotReady(String),
    /// A shard refused a broker's search (a 4xx: the request's fault), passed on as it came.
    #[error("{message}")]
    ShardRefused {
        status: StatusCode,
        code: String,
        message: String,
    },
    #[error("no shard answered: {missing}")]
    NoShardAnswered { missing: String },
    /// The server's own fault: `detail` goes to the log, not to the client.
    #[error("internal error")]
    Internal { detail: String },
}

impl From<BodyError> for ApiError {
    fn from(err: BodyError) -> ApiError {
        match err {
            BodyError::BadBody { format, reason } => ApiError::BadBody { format, reason },
            BodyError::Invalid(message) => ApiError::InvalidRequest(message),
        }
    }
}

/// What a stage that cannot fail its input answers.
impl From<std::convert::Infallible> for ApiError {
    fn from(never: std::convert::Infallible) -> ApiError {
        match never {}
    }
}

impl ApiError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            ApiError::BadBody { .. }
            | ApiError::InvalidRequest(_)
            | ApiError::BadRankerName { .. }
            | ApiError::BadRanker { .. } => StatusCode::BAD_REQUEST,
            ApiError::UnknownRanker { .. } | ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::BadIndex { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::AdminDisabled => StatusCode::FORBIDDEN,
            ApiError::GpuUnavailable
            | ApiError::Overloaded { .. }
            | ApiError::NotReady(_)
            | ApiError::NoIndex
            | ApiError::NoShardAnswered { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::ShardRefused { status, .. } => *status,
            ApiError::DeadlineExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable snake_case code (listed in `docs/api.md`).
    pub fn code(&self) -> &str {
        match self {
            ApiError::UnsupportedMediaType { .. } => "unsupported_media_type",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::BodyTimeout { .. } => "body_timeout",
            ApiError::BadBody { .. } => "bad_body",
            ApiError::InvalidRequest(_) => "invalid_request",
            ApiError::BadRankerName { .. } => "bad_ranker_name",
            ApiError::BadRanker { .. } => "bad_ranker",
            ApiError::UnknownRanker { .. } => "unknown_ranker",
            ApiError::NoIndex => "no_index",
            ApiError::BadIndex { .. } => "bad_index",
            ApiError::UriTooLong { .. } => "uri_too_long",
            ApiError::NotFound { .. } => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Unauthorized => "unauthorized",
            ApiError::AdminDisabled => "admin_disabled",
            ApiError::GpuUnavailable => "gpu_unavailable",
            ApiError::Overloaded { .. } => "overloaded",
            ApiError::DeadlineExceeded { .. } => "deadline_exceeded",
            ApiError::NotReady(_) => "not_ready",
            ApiError::ShardRefused { code, .. } => code,
            ApiError::NoShardAnswered { .. } => "shards_unavailable",
            ApiError::Internal { .. } => "internal",
        }
    }

    /// An internal error carrying `detail` for the log.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        ApiError::Internal {
            detail: detail.to_string(),
        }
    }
}

/// The error body, `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The inside of [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable, snake_case (the table of codes in `docs/api.md`).
    pub code: String,
    /// For people: what was wrong and where (4xx), `internal error` (5xx).
    pub message: String,
}

/// Put in the response's extensions so the middleware can re-encode and log it.
#[derive(Debug, Clone)]
pub struct ErrorLog {
    pub body: ErrorBody,
    /// The detail of a 5xx, for the log only.
    pub detail: Option<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let detail = match &self {
            ApiError::Internal { detail } => Some(detail.clone()),
            _ => None,
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code().to_string(),
                message: self.to_string(),
            },
        };
        let json = serde_json::to_vec(&body).unwrap_or_default();
        let mut response = (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            json,
        )
            .into_response();
        if let ApiError::Overloaded { retry_after_s, .. } = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
        }
        if let ApiError::BodyTimeout { .. } = self {
            // The rest of the body may still be on its way: the connection is not reused.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response.extensions_mut().insert(ErrorLog { body, detail });
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overloaded_carries_retry_after_and_code() {
        let response = ApiError::Overloaded {
            ranker: "m".into(),
            capacity: 4,
            retry_after_s: 1,
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let log = response.extensions().get::<ErrorLog>().unwrap();
        assert_eq!(log.body.error.code, "overloaded");
    }

    #[test]
    fn internal_detail_stays_out_of_the_body() {
        let response = ApiError::internal("disk on fire at /x").into_response();
        let log = response.extensions().get::<ErrorLog>().unwrap();
        assert_eq!(log.body.error.message, "internal error");
        assert_eq!(log.detail.as_deref(), Some("disk on fire at /x"));
    }
}
