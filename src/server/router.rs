//! The application: the routes ([`super::openapi::routes`]) and the layers around them (request
//! ids, tracing, metrics, error negotiation, a panic backstop, the body timeout).

use std::time::Duration;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

use super::codec::negotiate_errors;
use super::error::ApiError;
use super::openapi;
use super::state::AppState;

/// How long a client may take to send its body.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The application: every route, with request ids, tracing, metrics, error negotiation and a
/// panic backstop.
pub fn router(state: AppState) -> Router {
    super::metrics::handle();
    let (routes, _document) = openapi::routes().split_for_parts();
    routes
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
                .layer(TraceLayer::new_for_http().make_span_with(|req: &Request| {
                    let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("-");
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
                }))
                .layer(PropagateRequestIdLayer::x_request_id())
                .layer(axum::middleware::from_fn(super::metrics::track))
                .layer(axum::middleware::from_fn(negotiate_errors))
                .layer(CatchPanicLayer::custom(panic_response))
                .layer(RequestBodyTimeoutLayer::new(BODY_TIMEOUT)),
        )
        .with_state(state)
}

fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    ApiError::internal(format!("handler panicked: {what}")).into_response()
}

async fn not_found(req: Request) -> ApiError {
    ApiError::NotFound {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
    }
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::MethodNotAllowed {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
    }
}
