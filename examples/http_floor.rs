//! The transport floor of `POST /v1/rank` on this machine: what a request costs over loopback
//! HTTP when the server does no work of its own. The same stack as `rankserve serve` (tokio,
//! hyper, axum, TCP_NODELAY) reads the whole body, hands the request to a CPU pool as the real
//! server does ([`Backends::on_cpu_pool_task`]) where it is held busy for `--hold-us` (standing in
//! for feature extraction and scoring, while the async worker that read the request waits),
//! then answers a MessagePack `RankResponse` of `--docs` scores, the size of the real reply. The
//! held time is reported as `me_us` and the body's reading as `read_us`, timed from the same
//! point as the real server's, so `rankserve replay` and `scripts/load_ab.sh` count the hold as
//! scoring: what is left of the client's latency is the part of the service overhead that no
//! handler removes (body transfer, HTTP parsing and writing, one hand-off and wake-ups), to
//! compare with the real server's.
//!
//! With `--lay-out RANKER` (and `--rankers DIR`) the floor is instead the host's share of the
//! fused GPU path, with no device: the body framed on the async worker as the real server does
//! ([`RankBody::decode`]), then on the pool its hit documents decoded and laid out for the
//! ranker's features ([`RowSource::hit_layouts`], the same call, the same parallel width) and
//! dropped. However many GPUs a host has, it answers no more `/v1/rank` hit requests a second
//! than this floor: the ceiling a multi-GPU throughput is read against. (The real server lays
//! out into reused pinned buffers; the floor into memory from the allocator, mimalloc as in
//! `rankserve`.)
//!
//!     cargo build --release --example http_floor
//!     target/release/examples/http_floor --addr 127.0.0.1:18700 --docs 1000 --hold-us 2000 &
//!     rankserve replay --url http://127.0.0.1:18700 --log requests.msgpack --concurrency 1 --duration 5
//!     target/release/examples/http_floor --rankers rankers --lay-out medium --cpu-threads 24 &

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use clap::Parser;
use rankserve::api::{Format, RankBody, RankResponse, Timings};
use rankserve::backend::Backend;
use rankserve::rank::engine::{Backends, RowSource};
use rankserve::rank::fe::GatherMap;
use rankserve::rank::gpu::ranker::DEFAULT_MAX_BATCH;
use rankserve::rank::store::RankerStore;

/// The allocator `rankserve` runs with: the layouts' buffers come from it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Where the hold runs: `pool` (a CPU pool task, as the real server's work) or `worker`
    /// (the async worker that read the request, no hand-off).
    #[arg(long, value_enum, default_value_t = HoldOn::Pool)]
    hold_on: HoldOn,
    /// `hyper` (axum, as the real server) or `raw`: HTTP/1.1 read and written by hand (headers
    /// scanned for `Content-Length`, one write per reply), the least a server can do.
    #[arg(long, value_enum, default_value_t = Transport::Hyper)]
    transport: Transport,
    /// SO_RCVBUF of the listening socket (inherited by its connections), in bytes; the
    /// kernel's default (autotuned) when not given.
    #[arg(long)]
    recv_buffer: Option<u32>,
    /// Instead of a hold, frame each request and lay its hit documents out for this ranker's
    /// features (a name in `--rankers`), as the real server's fused GPU path does before its
    /// device turn. Hyper transport only.
    #[arg(long, requires = "rankers", conflicts_with_all = ["hold_us", "transport"])]
    lay_out: Option<String>,
    /// The ranker store `--lay-out` names a ranker of.
    #[arg(long)]
    rankers: Option<std::path::PathBuf>,
    /// Threads of the CPU pool (every core by default).
    #[arg(long)]
    cpu_threads: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum HoldOn {
    Pool,
    Worker,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Transport {
    Hyper,
    Raw,
}

struct Floor {
    docs: usize,
    hold: Duration,
    hold_on: HoldOn,
    pool: Backends,
    /// The features' gather map of `--lay-out`'s ranker.
    lay_out: Option<GatherMap>,
}

impl Floor {
    /// Frames `body` here (the async worker, as the real server's extractor), then on the pool
    /// lays its hit documents out as the fused path does and drops them; returns the pool's
    /// time. A body that does not frame and lay out is a test setup's error: it panics.
    async fn lay_out(self: &Arc<Self>, body: Bytes) -> Duration {
        let mut body = RankBody::decode(Format::Msgpack, body).expect("a MessagePack rank body");
        let floor = Arc::clone(self);
        let work = move || {
            let started = Instant::now();
            let map = floor.lay_out.as_ref().expect("a --lay-out floor");
            let layouts = body.hit_layouts(map, DEFAULT_MAX_BATCH, floor.pool.width(), None);
            assert!(
                matches!(layouts, Some(Ok(_))),
                "the body's hit documents did not lay out: is it `requests synth` of the ranker?"
            );
            drop((layouts, body));
            started.elapsed()
        };
        self.pool.on_cpu_pool_task(work).await.unwrap_or_default()
    }

    /// Holds the request busy where `--hold-on` says, then drops `body` (as the real server
    /// frees a request after scoring it); returns the hold.
    async fn hold<B: Send + 'static>(&self, body: B) -> Duration {
        let hold = self.hold;
        let spin = move || {
            let started = Instant::now();
            while started.elapsed() < hold {
                std::hint::spin_loop();
            }
            drop(body);
            started.elapsed()
        };
        match self.hold_on {
            HoldOn::Pool => self.pool.on_cpu_pool_task(spin).await.unwrap_or_default(),
            HoldOn::Worker => tokio::task::block_in_place(spin),
        }
    }

    /// The MessagePack reply: `docs` scores and the timings.
    fn reply(&self, arrived: Instant, read: Duration, held: Duration) -> Vec<u8> {
        let reply = RankResponse {
            scores: vec![Some(0.5); self.docs],
            order: None,
            timings: Timings {
                read_us: read.as_micros() as u64,
                decode_us: 0,
                fe_us: 0,
                mit_us: None,
                me_us: held.as_micros() as u64,
                queue_us: 0,
                batch_docs: self.docs,
                batch_requests: 1,
                total_us: arrived.elapsed().as_micros() as u64,
            },
            backend: "none".to_string(),
            explain: None,
        };
        rmp_serde::to_vec_named(&reply).unwrap_or_default()
    }
}

async fn rank(State(floor): State<Arc<Floor>>, request: Request) -> impl IntoResponse {
    let arrived = Instant::now();
    let body = axum::body::to_bytes(request.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    let read = arrived.elapsed();
    let held = match floor.lay_out {
        Some(_) => floor.lay_out(body).await,
        None => floor.hold(body).await,
    };
    (
        [(header::CONTENT_TYPE, "application/msgpack")],
        floor.reply(arrived, read, held),
    )
}

/// One connection served by hand: each request's headers read until the blank line, its body
/// by `Content-Length`, the reply written in one piece.
async fn serve_raw(floor: Arc<Floor>, mut stream: tokio::net::TcpStream) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = Vec::with_capacity(1 << 20);
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if stream.read_buf(&mut buffer).await? == 0 {
                return Ok(());
            }
        };
        let arrived = Instant::now();
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            if stream.read_buf(&mut buffer).await? == 0 {
                return Ok(());
            }
        }
        let read = arrived.elapsed();
        // The body stays in the connection's buffer, dropped from it after the hold.
        let held = floor.hold(()).await;
        buffer.drain(..head_end + length);
        let reply = floor.reply(arrived, read, held);
        let mut out = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/msgpack\r\ncontent-length: {}\r\n\r\n",
            reply.len()
        )
        .into_bytes();
        out.extend_from_slice(&reply);
        stream.write_all(&out).await?;
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let lay_out = match (&args.lay_out, &args.rankers) {
        (Some(name), Some(dir)) => {
            let loaded = RankerStore::open(dir, u64::MAX)
                .and_then(|store| store.get(name))
                .map_err(std::io::Error::other)?;
            let resolver = loaded
                .fe
                .as_ref()
                .map_err(|err| std::io::Error::other(err.clone()))?;
            Some(resolver.gather_map())
        }
        _ => None,
    };
    let floor = Arc::new(Floor {
        docs: args.docs,
        hold: Duration::from_micros(args.hold_us),
        hold_on: args.hold_on,
        pool: Backends::new(Some(args.cpu_threads.unwrap_or(threads)), Backend::Cpu),
        lay_out,
    });
    let socket = match args.addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if let Some(bytes) = args.recv_buffer {
        socket.set_recv_buffer_size(bytes)?;
    }
    socket.bind(args.addr)?;
    let listener = socket.listen(1024)?;
    if args.transport == Transport::Raw {
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve_raw(Arc::clone(&floor), stream));
        }
    }
    let app = Router::new()
        .route("/v1/rank", post(rank))
        .route("/readyz", axum::routing::get(|| async { "ready" }))
        .layer(DefaultBodyLimit::disable())
        .with_state(floor);
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await
}
