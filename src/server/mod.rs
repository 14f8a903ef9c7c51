//! The HTTP service (axum), HTTP only: routes, the JSON / MessagePack codec, errors, auth,
//! metrics exposition, and the wiring of the state. Every decision about devices, batching and
//! fallback belongs to the stages' engines ([`crate::rank::engine`], [`crate::select::engine`]);
//! the wire types and the decoding of bodies into the stages' inputs to [`crate::api`].
//!
//! - [`router`]: [`router()`], the routes and the layers around them.
//! - [`codec`]: body extractor and replies in the negotiated format.
//! - [`auth`]: the admin routes' bearer token.
//! - [`error`]: `ApiError`, its statuses and stable codes.
//! - [`routes`]: the `/v1/rank`, ranker and operations handlers.
//! - [`search`]: `/v1/search` (the pipeline that chains the selection engine into the ranking
//!   engine) and `/v1/index/reload`.
//! - [`state`]: what handlers share, admission, the request sampler, the GPU probe's wiring.
//! - [`metrics`]: Prometheus names and recording.
//! - [`openapi`]: the route table and the OpenAPI document generated from the handlers and
//!   wire types.

pub mod auth;
pub mod codec;
pub mod error;
pub mod metrics;
pub mod openapi;
pub mod router;
pub mod routes;
pub mod search;
pub mod state;

pub use router::router;
pub use state::{AppState, State};

use std::future::Future;

/// Serves `state` on `listener` until `shutdown` resolves, then stops accepting and waits for
/// the requests in flight to be answered.
///
/// # Errors
/// The listener fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let warm = std::sync::Arc::clone(&state);
    tokio::task::spawn_blocking(move || warm.warm_up());
    // Replies go out as soon as they are written, not held back by Nagle's algorithm until
    // the client acknowledges the previous segment (axum leaves it on).
    let listener = listener.tap_io(|stream| {
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error = %err, "TCP_NODELAY not set on a connection");
        }
    });
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
    tracing::info!("shutdown signal received: draining requests in flight");
}
