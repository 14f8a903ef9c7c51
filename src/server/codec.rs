//! The JSON / MessagePack codec: the [`Coded`] extractor reads a body by its Content-Type,
//! [`Reply`] answers in the [`Negotiated`] format (`Accept`, else the request's own type, else
//! JSON), and [`negotiate_errors`] re-encodes error bodies into that format and logs them.
//!
//! The formats themselves ([`Format`]) are the API's ([`crate::api::format`]). Body limits are checked on `Content-Length` before anything is
//! read, then enforced while reading (a chunked body has no length).

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Serialize;

use super::error::{ApiError, ErrorLog};
use super::state::AppState;
use crate::api::{Format, RankBody, SearchRequest};

/// The format of a request body, by its Content-Type.
///
/// # Errors
/// [`ApiError::UnsupportedMediaType`] when the type is absent or not supported.
pub fn format_of_body(headers: &HeaderMap) -> Result<Format, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("(not text)"));
    content_type
        .and_then(Format::from_media_type)
        .ok_or_else(|| ApiError::UnsupportedMediaType {
            got: crate::rank::cut_input(content_type.unwrap_or("(none)")).into_owned(),
        })
}

/// The reply format for a request: `Accept` when it names a supported type, else the
/// request's Content-Type, else JSON.
pub fn negotiate(headers: &HeaderMap) -> Format {
    let accepted = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(Format::from_media_type);
    accepted
        .or_else(|| {
            headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .and_then(Format::from_media_type)
        })
        .unwrap_or(Format::Json)
}

/// `d` in whole microseconds, as replies time their steps.
pub fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

/// Reads a whole body of at most `limit` bytes, arrived within `deadline` of the call (one
/// deadline for the whole body: a client trickling bytes does not restart it).
///
/// # Errors
/// [`ApiError::PayloadTooLarge`] when `Content-Length` announces more (nothing is read) or the
/// body turns out longer; [`ApiError::BodyTimeout`] past the deadline; [`ApiError::BadBody`]
/// when the connection fails mid-body.
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, ApiError> {
    if let Some(announced) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
    {
        if announced.parse::<u64>().map_or(true, |n| n > limit as u64) {
            return Err(ApiError::PayloadTooLarge {
                limit,
                got: crate::rank::cut_input(announced).into_owned(),
            });
        }
    }
    let collected = tokio::time::timeout(deadline, Limited::new(body, limit).collect())
        .await
        .map_err(|_| ApiError::BodyTimeout {
            timeout_ms: deadline.as_millis().min(u64::MAX as u128) as u64,
        })?;
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ApiError::PayloadTooLarge {
                limit,
                got: format!("more than {limit}"),
            })
        }
        Err(err) => Err(ApiError::BadBody {
            format: "request",
            reason: format!("reading the body failed: {err}"),
        }),
    }
}

/// A request body type and how the [`Coded`] extractor decodes it.
pub trait RequestBody: Sized {
    /// Decodes one value from `bytes`, which must hold nothing else.
    ///
    /// # Errors
    /// As [`Format::decode`].
    fn decode_body(format: Format, bytes: Bytes) -> Result<Self, ApiError>;
}

impl RequestBody for SearchRequest {
    fn decode_body(format: Format, bytes: Bytes) -> Result<Self, ApiError> {
        Ok(format.decode(&bytes)?)
    }
}

impl RequestBody for RankBody {
    fn decode_body(format: Format, bytes: Bytes) -> Result<Self, ApiError> {
        Ok(RankBody::decode(format, bytes)?)
    }
}

/// A request body decoded by its Content-Type.
pub struct Coded<T> {
    pub value: T,
    pub format: Format,
    /// When the extractor began: the request's headers had arrived, its body not yet.
    pub started: Instant,
    /// Time spent receiving the body, after the headers.
    pub read_us: u64,
    /// Time spent decoding the body (after it was read): for a framed `/v1/rank` body, its
    /// fields and where its documents lie (they are decoded during feature extraction).
    pub decode_us: u64,
}

impl<T: RequestBody> FromRequest<AppState> for Coded<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let format = format_of_body(req.headers())?;
        let started = Instant::now();
        let (parts, body) = req.into_parts();
        let bytes = read_body(
            &parts.headers,
            body,
            state.body_limit(),
            state.body_deadline(),
        )
        .await?;
        let decoding = Instant::now();
        let value = T::decode_body(format, bytes)?;
        Ok(Coded {
            value,
            format,
            started,
            read_us: micros(decoding - started),
            decode_us: micros(decoding.elapsed()),
        })
    }
}

/// The reply format negotiated for this request.
#[derive(Debug, Clone, Copy)]
pub struct Negotiated(pub Format);

impl<S: Send + Sync> FromRequestParts<S> for Negotiated {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Negotiated(negotiate(&parts.headers)))
    }
}

/// The `{name}` of a ranker route, percent-decoded. A segment that does not decode (`%FF` is
/// not UTF-8) is 400 `bad_ranker_name` in the API's format, not axum's plain-text rejection.
#[derive(utoipa::IntoParams)]
#[into_params(names("name"), parameter_in = Path)]
pub struct RankerName(
    /// The ranker's store name: 1 to 64 characters of `A-Z a-z 0-9 _ -`.
    pub String,
);

impl<S: Send + Sync> FromRequestParts<S> for RankerName {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<String>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(name)) => Ok(RankerName(name)),
            Err(_) => {
                // The ranker routes' name is the segment after `/v1/rankers/`.
                let raw = parts.uri.path().split('/').nth(3).unwrap_or("");
                Err(ApiError::BadRankerName {
                    name: crate::rank::cut_input(raw).into_owned(),
                })
            }
        }
    }
}

/// A 200 reply encoded in the negotiated format.
pub struct Reply<T>(pub Format, pub T);

impl<T: Serialize> IntoResponse for Reply<T> {
    fn into_response(self) -> Response {
        let Reply(format, value) = self;
        match format.encode(&value) {
            Ok(bytes) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(format.content_type()),
                )],
                bytes,
            )
                .into_response(),
            Err(err) => {
                ApiError::internal(format!("encoding a reply failed: {err}")).into_response()
            }
        }
    }
}

/// Middleware: error bodies in the negotiated format; 5xx details logged at ERROR, each;
/// refusals (4xx, 503) logged at most once a second per code ([`RefusalLog`]), `overloaded`
/// at WARN and the rest at INFO, so that a flood of refused requests cannot flood the log.
pub async fn negotiate_errors(req: Request, next: Next) -> Response {
    let format = negotiate(req.headers());
    let mut response = next.run(req).await;
    let Some(log) = response.extensions_mut().remove::<ErrorLog>() else {
        return response;
    };
    let status = response.status();
    let code = &log.body.error.code;
    match &log.detail {
        Some(detail) => {
            tracing::error!(status = status.as_u16(), code = %code, detail = %detail, "request failed")
        }
        None => {
            if let Some(suppressed) = RefusalLog::global().admit(code, Instant::now()) {
                let message = &log.body.error.message;
                if code == "overloaded" {
                    tracing::warn!(status = status.as_u16(), code = %code, message = %message, suppressed, "request refused (at most one line a second per code; suppressed: refusals of this code since the last line)")
                } else {
                    tracing::info!(status = status.as_u16(), code = %code, message = %message, suppressed, "request refused")
                }
            }
        }
    }
    metrics::counter!("rankserve_http_errors_total", "code" => log.body.error.code.clone())
        .increment(1);
    if format == Format::Msgpack {
        if let Ok(bytes) = format.encode(&log.body) {
            let (mut parts, _) = response.into_parts();
            parts.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            parts.headers.remove(header::CONTENT_LENGTH);
            response = Response::from_parts(parts, Body::from(bytes));
        }
    }
    response
}

/// The log lines of refused requests: at most one per [`RefusalLog::EVERY`] per error code,
/// the refusals in between counted and the count written with the next line (the metrics
/// count every one).
#[derive(Default)]
pub struct RefusalLog {
    /// Per code: when its last line was written and the refusals since.
    codes: parking_lot::Mutex<std::collections::HashMap<String, (Instant, u64)>>,
}

impl RefusalLog {
    /// The least time between two lines of one code.
    pub const EVERY: Duration = Duration::from_secs(1);

    /// The process's (codes are few and fixed: the map stays small).
    pub fn global() -> &'static RefusalLog {
        static LOG: std::sync::OnceLock<RefusalLog> = std::sync::OnceLock::new();
        LOG.get_or_init(RefusalLog::default)
    }

    /// Whether a refusal with `code` at `now` gets a line: `Some(refusals suppressed since the
    /// last line)`, or `None` (counted for the next line).
    pub fn admit(&self, code: &str, now: Instant) -> Option<u64> {
        let mut codes = self.codes.lock();
        match codes.get_mut(code) {
            Some((last, suppressed)) if now.duration_since(*last) < Self::EVERY => {
                *suppressed += 1;
                None
            }
            Some((last, suppressed)) => {
                *last = now;
                Some(std::mem::take(suppressed))
            }
            None => {
                codes.insert(code.to_string(), (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    /// A body of these chunks, in order.
    fn chunked(chunks: &[Bytes]) -> Body {
        struct Chunks(Vec<Bytes>);
        impl hyper::body::Body for Chunks {
            type Data = Bytes;
            type Error = std::convert::Infallible;
            fn poll_frame(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>>
            {
                std::task::Poll::Ready(self.0.pop().map(|c| Ok(hyper::body::Frame::data(c))))
            }
        }
        Body::new(Chunks(chunks.iter().rev().cloned().collect()))
    }

    #[tokio::test]
    async fn bodies_are_read_whole_from_their_chunks_within_the_limit() {
        let chunks: Vec<Bytes> = [1000, 1, 0, 3000]
            .iter()
            .enumerate()
            .map(|(i, &n)| Bytes::from(vec![i as u8 + 1; n]))
            .collect();
        let whole = chunks.concat();
        let mut announced = HeaderMap::new();
        announced.insert(header::CONTENT_LENGTH, HeaderValue::from(whole.len()));
        for headers in [HeaderMap::new(), announced] {
            let read = read_body(&headers, chunked(&chunks), 1 << 20, MINUTE)
                .await
                .unwrap();
            assert_eq!(read, whole);
            // A body exactly at the limit is read.
            assert_eq!(
                read_body(&headers, chunked(&chunks), whole.len(), MINUTE)
                    .await
                    .unwrap(),
                whole
            );
        }
        // One byte over it, not announced: refused while reading.
        let over = read_body(&HeaderMap::new(), chunked(&chunks), whole.len() - 1, MINUTE).await;
        assert!(
            matches!(&over, Err(ApiError::PayloadTooLarge { got, .. }) if got == "more than 4000"),
            "{over:?}"
        );
        // One chunk is kept, not copied.
        let one = read_body(&HeaderMap::new(), chunked(&chunks[3..]), 1 << 20, MINUTE)
            .await
            .unwrap();
        assert_eq!(one.as_ptr(), chunks[3].as_ptr());
        assert!(read_body(&HeaderMap::new(), chunked(&[]), 10, MINUTE)
            .await
            .unwrap()
            .is_empty());
        // Announced over the limit: refused before anything is read.
        let mut huge = HeaderMap::new();
        huge.insert(
            header::CONTENT_LENGTH,
            HeaderValue::from_static("1000000000"),
        );
        let refused = read_body(&huge, chunked(&chunks), 1 << 20, MINUTE).await;
        assert!(
            matches!(&refused, Err(ApiError::PayloadTooLarge { got, .. }) if got == "1000000000"),
            "{refused:?}"
        );
    }

    #[test]
    fn refusals_are_logged_once_a_second_per_code_with_the_count_between() {
        let log = RefusalLog::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(log.admit("overloaded", at(0)), Some(0));
        assert_eq!(log.admit("overloaded", at(10)), None);
        assert_eq!(log.admit("bad_body", at(20)), Some(0), "codes apart");
        assert_eq!(log.admit("overloaded", at(999)), None);
        assert_eq!(log.admit("overloaded", at(1000)), Some(2));
        assert_eq!(log.admit("overloaded", at(1001)), None);
        assert_eq!(log.admit("overloaded", at(5000)), Some(1));
    }

    #[test]
    fn media_types() {
        assert_eq!(
            Format::from_media_type("application/json; charset=utf-8"),
            Some(Format::Json)
        );
        assert_eq!(
            Format::from_media_type("Application/X-MsgPack"),
            Some(Format::Msgpack)
        );
        assert_eq!(
            Format::from_media_type("application/vnd.msgpack"),
            Some(Format::Msgpack)
        );
        assert_eq!(Format::from_media_type("text/plain"), None);
    }

    #[test]
    fn negotiation_prefers_accept_then_content_type_then_json() {
        let mut headers = HeaderMap::new();
        assert_eq!(negotiate(&headers), Format::Json);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/msgpack"),
        );
        assert_eq!(negotiate(&headers), Format::Msgpack);
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/html, application/json;q=0.9"),
        );
        assert_eq!(negotiate(&headers), Format::Json);
        headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        assert_eq!(negotiate(&headers), Format::Msgpack);
    }

    #[test]
    fn decode_errors_give_positions() {
        let err = Format::Json.decode::<Vec<u32>>(b"[1,\n x]").unwrap_err();
        assert_eq!(
            err.to_string(),
            "JSON body does not parse: [1]: expected value at line 2 column 2"
        );
        let mut bytes = rmp_serde::to_vec(&vec![1u32, 2]).unwrap();
        bytes.push(0xc0);
        let err = Format::Msgpack.decode::<Vec<u32>>(&bytes).unwrap_err();
        assert_eq!(
            err.to_string(),
            "MessagePack body does not parse: trailing bytes after the value at byte 3 of 4"
        );
        let err = Format::Msgpack
            .decode::<Vec<u32>>(&[0x92, 0x01])
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("MessagePack body does not parse: "),
            "{err}"
        );
    }

    #[test]
    fn msgpack_round_trip_uses_named_fields() {
        #[derive(Serialize, serde::Deserialize, PartialEq, Debug)]
        struct S {
            name: String,
        }
        let bytes = Format::Msgpack.encode(&S { name: "x".into() }).unwrap();
        assert_eq!(bytes[0], 0x81); // a one-entry map, not an array
        assert_eq!(
            Format::Msgpack.decode::<S>(&bytes).unwrap(),
            S { name: "x".into() }
        );
    }
}
