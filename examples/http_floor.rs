//! The transport floor of `POST /v1/rank` on this machine: what a request costs over loopback
//! HTTP when the server does no work of its own. The same stack as `rankserve serve` (tokio,
//! hyper, axum, TCP_NODELAY) reads the whole body, hands the request to a CPU pool as the real
//! server does ([`Engines::on_cpu_pool_task`]) where it is held busy for `--hold-us` (standing in
//! for feature extraction and scoring, while the async worker that read the request waits),
//! then answers a MessagePack `RankResponse` of `--docs` scores, the size of the real reply. The
//! held time is reported as `me_us` and the body's reading as `read_us`, timed from the same
//! point as the real server's, so `rankserve replay` and `scripts/load_ab.sh` count the hold as
//! scoring: what is left of the client's latency is the part of the service overhead that no
//! handler removes (body transfer, HTTP parsing and writing, one hand-off and wake-ups), to
//! compare with the real server's.
//!
//!     cargo build --release --example http_floor
//!     target/release/examples/http_floor --addr 127.0.0.1:18700 --docs 1000 --hold-us 2000 &
//!     rankserve replay --url http://127.0.0.1:18700 --log requests.msgpack --concurrency 1 --duration 5

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use clap::Parser;
use rankserve::server::api::{RankResponse, Timings};
use rankserve::server::engine::Engines;

#[derive(Parser)]
struct Args {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:18700")]
    addr: SocketAddr,
    /// Scores in each reply.
    #[arg(long, default_value_t = 1000)]
    docs: usize,
    /// How long each request is held (busy) before its reply.
    #[arg(long, default_value_t = 0)]
    hold_us: u64,
}

struct Floor {
    docs: usize,
    hold: Duration,
    pool: Engines,
}

async fn rank(State(floor): State<Arc<Floor>>, request: Request) -> impl IntoResponse {
    let arrived = Instant::now();
    let body = axum::body::to_bytes(request.into_body(), usize::MAX).await;
    let read = arrived.elapsed();
    let hold = floor.hold;
    let held = floor
        .pool
        .on_cpu_pool_task(move || {
            let started = Instant::now();
            while started.elapsed() < hold {
                std::hint::spin_loop();
            }
            drop(body);
            started.elapsed()
        })
        .await
        .unwrap_or_default();
    let reply = RankResponse {
        scores: vec![Some(0.5); floor.docs],
        order: None,
        timings: Timings {
            read_us: read.as_micros() as u64,
            decode_us: 0,
            fe_us: 0,
            mit_us: None,
            me_us: held.as_micros() as u64,
            queue_us: 0,
            total_us: arrived.elapsed().as_micros() as u64,
        },
        backend: "none".to_string(),
        explain: None,
    };
    let bytes = rmp_serde::to_vec_named(&reply).unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/msgpack")], bytes)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let floor = Arc::new(Floor {
        docs: args.docs,
        hold: Duration::from_micros(args.hold_us),
        pool: Engines::new(threads),
    });
    let app = Router::new()
        .route("/v1/rank", post(rank))
        .route("/readyz", axum::routing::get(|| async { "ready" }))
        .layer(DefaultBodyLimit::disable())
        .with_state(floor);
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await
}
