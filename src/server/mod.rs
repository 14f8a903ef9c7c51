//! The HTTP service (axum): routes, the JSON / MessagePack codec, errors, the ranker store and
//! its CPU cache, admission and batching, metrics.
//!
//! - [`api`]: the wire types.
//! - [`codec`]: body extractor and replies in the negotiated format.
//! - [`error`]: `ApiError`, its statuses and stable codes.
//! - [`routes`]: [`router`] and the handlers.
//! - [`msgpack_rank`]: the fast MessagePack reader of `/v1/rank` bodies; [`rank_body`]: such a
//!   body as the handler gets it, decoded or framed for decoding during feature extraction.
//! - [`search`]: `/v1/search` (the pipeline from selection to ranking) and `/v1/index/reload`.
//! - [`state`]: what handlers share, admission, the request sampler.
//! - [`store`]: ranker files and the CPU ranker cache.
//! - [`batch`]: the per-ranker batching queue; scoring off the async runtime.
//! - [`engine`]: the CPU pool and the GPU, chosen per batch, with the fallback to the CPU.
//! - [`metrics`]: Prometheus names and recording.

pub mod api;
pub mod batch;
pub mod codec;
pub mod engine;
pub mod error;
pub mod metrics;
pub mod msgpack_rank;
pub mod rank_body;
pub mod routes;
pub mod search;
pub mod state;
pub mod store;

pub use routes::router;
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
