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
//!   engine) and `/v1/index/reload`; `candidate_hits`, its candidates as the ranking engine's
//!   row source (their hits read from the forward index straight into FE's input).
//! - [`shard`]: the routes a broker calls, `/v1/shard/stats` and `/v1/shard/search`.
//! - [`broker`]: `/v1/search` on a broker (`--broker`): the fan-out to the shards and the merge.
//! - [`state`]: what handlers share, admission, the request sampler, the GPU probe's wiring.
//! - [`metrics`]: Prometheus names and recording.
//! - [`openapi`]: the route table and the OpenAPI document generated from the handlers and
//!   wire types.

pub mod auth;
pub mod broker;
mod candidate_hits;
pub mod codec;
pub mod error;
pub mod metrics;
pub mod openapi;
pub mod router;
pub mod routes;
pub mod search;
pub mod shard;
pub mod state;

pub use router::router;
pub use state::{AppState, State};

use std::future::Future;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::task::JoinSet;

/// Serves `state` on `listener` (HTTP/1.1) until `shutdown` resolves, then stops accepting,
/// lets the requests in flight finish for the configured grace period (`shutdown_grace_ms`)
/// and drops the connections still open after it.
///
/// A connection is closed when no complete request head arrives within `idle_timeout_ms` of
/// its opening or of its previous reply (hyper's header read timeout, which restarts when a
/// keep-alive connection goes idle): idle keep-alive connections and clients that trickle
/// their headers. Bodies have their own whole-body deadline ([`codec::read_body`]).
///
/// # Errors
/// Never at present: accept errors (e.g. out of file descriptors) are logged and retried.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let warm = std::sync::Arc::clone(&state);
    tokio::task::spawn_blocking(move || warm.warm_up());
    let grace = Duration::from_millis(state.config.shutdown_grace_ms);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(state.config.idle_timeout_ms));
    let app = router(state);
    // Sent once, at shutdown: every connection stops taking requests after its current one.
    let (closing, closing_rx) = tokio::sync::watch::channel(());
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        // Out of descriptors and the like: wait rather than spin.
                        tracing::warn!(error = %err, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // Replies go out as soon as they are written, not held back by Nagle's
                // algorithm until the client acknowledges the previous segment.
                if let Err(err) = stream.set_nodelay(true) {
                    tracing::debug!(error = %err, "TCP_NODELAY not set on a connection");
                }
                let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
                let mut closing = closing_rx.clone();
                connections.spawn(async move {
                    let mut conn = std::pin::pin!(conn);
                    let result = tokio::select! {
                        result = conn.as_mut() => result,
                        _ = closing.changed() => {
                            conn.as_mut().graceful_shutdown();
                            conn.await
                        }
                    };
                    if let Err(err) = result {
                        metrics::record_connection_error(&err);
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = closing.send(());
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = connections.len(),
            grace_ms = grace.as_millis() as u64,
            "shutdown grace period over: dropping the connections still open"
        );
        connections.shutdown().await;
    }
    Ok(())
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
