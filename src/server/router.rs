//! The application: the routes ([`super::openapi::routes`]) and the layers around them (request
//! ids, tracing, metrics, error negotiation, a panic backstop, the URI length limit).

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use super::codec::negotiate_errors;
use super::error::ApiError;
use super::openapi;
use super::state::AppState;

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
                // No line of the trace layer's own for a 5xx: `negotiate_errors` writes the
                // one line an error gets (a 503 `overloaded` was logged twice, once at ERROR).
                .layer(TraceLayer::new_for_http().make_span_with(|req: &Request| {
                    let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("-");
                    tracing::info_span!("request", method = %req.method(), path = %crate::rank::cut_input(req.uri().path()), request_id = %id)
                }).on_failure(()))
                .layer(PropagateRequestIdLayer::x_request_id())
                .layer(axum::middleware::from_fn(super::metrics::track))
                .layer(axum::middleware::from_fn(negotiate_errors))
                .layer(CatchPanicLayer::custom(panic_response))
                .layer(axum::middleware::from_fn(limit_uri)),
        )
        .with_state(state)
}

/// The longest request target (path and query) answered; longer ones are 414 `uri_too_long`.
/// (hyper itself refuses targets over 64 KiB before routing, with a bodiless 414.)
pub const MAX_URI_BYTES: usize = 8192;

/// Middleware: 414 `uri_too_long` past [`MAX_URI_BYTES`], in the API's format and counted
/// like any other error.
async fn limit_uri(req: Request, next: axum::middleware::Next) -> Response {
    let length = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if length > MAX_URI_BYTES {
        return ApiError::UriTooLong {
            length,
            limit: MAX_URI_BYTES,
        }
        .into_response();
    }
    next.run(req).await
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
        path: crate::rank::cut_input(req.uri().path()).into_owned(),
    }
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::MethodNotAllowed {
        method: req.method().to_string(),
        path: crate::rank::cut_input(req.uri().path()).into_owned(),
    }
}
