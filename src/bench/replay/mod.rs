//! Request logs and their replay against a running server.
//!
//! A request log ([`log`]) holds `/v1/rank` or `/v1/search` request bodies: concatenated
//! MessagePack objects (`.msgpack`) or JSON Lines (`.jsonl`). [`synth_requests`] writes
//! production-like rank requests, [`search_requests`] one search per query of a query file,
//! the server's sampler records live rank requests, and [`replay`] sends them to the endpoint
//! their type names (closed loop: `concurrency` clients each sending the next request when the
//! last one is answered, each a thread of its own with one keep-alive connection, so that the
//! client adds no hand-off between threads to the latency it measures; or open loop: `rate`
//! requests per second whatever the answers, latency counted from when each was due, so a
//! stalled server is not hidden) and reports ([`report`]) throughput, latency percentiles,
//! errors by status, the backends that ran and the server's own timings read from the replies
//! (to separate the work from the service's overhead).

pub mod log;
pub mod report;

pub use log::{search_requests, synth_requests, Endpoint, LogError, RequestLog};
pub use report::{Percentiles, ReplayReport};

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use parking_lot::Mutex;

use report::{Answer, Outcome, Tally};

impl RequestLog {
    /// A `POST` of the log's request `index` (modulo its length) to `target` on `host`.
    fn request(
        &self,
        index: usize,
        target: &hyper::Uri,
        host: &HeaderValue,
    ) -> hyper::Request<Full<Bytes>> {
        let body = self.bodies[index % self.bodies.len()].clone();
        let mut request = hyper::Request::new(Full::new(body));
        *request.method_mut() = hyper::Method::POST;
        *request.uri_mut() = target.clone();
        let headers = request.headers_mut();
        headers.insert(HOST, host.clone());
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static(self.format.content_type()),
        );
        request
    }
}

/// How to drive the server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// This many clients, each sending its next request when the last is answered.
    Concurrency(usize),
    /// This many requests per second, on schedule.
    Rate(f64),
}

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("--url {url:?}: expected http://HOST:PORT (https is not supported)")]
    BadUrl { url: String },
}

/// Replays `log` against `url` (`http://host:port`, the server root) for `duration`, calling
/// `progress` with the elapsed fraction about ten times a second.
///
/// # Errors
/// [`ReplayError::BadUrl`].
pub async fn replay(
    url: &str,
    log: Arc<RequestLog>,
    load: Load,
    duration: Duration,
    progress: impl Fn(f64) + Send + 'static,
) -> Result<ReplayReport, ReplayError> {
    let bad_url = || ReplayError::BadUrl {
        url: url.to_string(),
    };
    let target: hyper::Uri = format!("{}{}", url.trim_end_matches('/'), log.endpoint.path())
        .parse()
        .map_err(|_| bad_url())?;
    let (Some("http"), Some(host), Some(authority)) =
        (target.scheme_str(), target.host(), target.authority())
    else {
        return Err(bad_url());
    };
    let addr = format!("{host}:{}", target.port_u16().unwrap_or(80));
    let host = HeaderValue::from_str(authority.as_str()).map_err(|_| bad_url())?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    let ends = started + duration;
    let ticker = tokio::spawn(async move {
        while Instant::now() < ends {
            progress(started.elapsed().as_secs_f64() / duration.as_secs_f64());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        progress(1.0);
    });
    match load {
        Load::Concurrency(clients) => {
            // Each client is a thread with one connection, driven on the same thread as its
            // requests (a current-thread runtime): a request and its reply cross no thread on
            // the client's side, so the latency measured is the server's and the transport's,
            // not the client's hand-offs (a pooled client's connection task and request task
            // can sit on different workers, a wake-up more each way).
            let clients = clients.max(1);
            let workers: Vec<_> = (0..clients)
                .map(|first| {
                    let (addr, host, log, tally) = (
                        addr.clone(),
                        host.clone(),
                        Arc::clone(&log),
                        Arc::clone(&tally),
                    );
                    let on_thread = Arc::clone(&tally);
                    let spawned = std::thread::Builder::new()
                        .name(format!("replay-{first}"))
                        .spawn(move || {
                            let runtime = tokio::runtime::Builder::new_current_thread()
                                .enable_all()
                                .build();
                            match runtime {
                                Ok(runtime) => runtime.block_on(closed_loop(
                                    &addr,
                                    &host,
                                    &log,
                                    (first, clients),
                                    ends,
                                    &on_thread,
                                )),
                                Err(_) => on_thread.lock().client_failed(),
                            }
                        });
                    spawned.inspect_err(|_| tally.lock().client_failed()).ok()
                })
                .collect();
            let _ = tokio::task::spawn_blocking(move || {
                for worker in workers.into_iter().flatten() {
                    let _ = worker.join();
                }
            })
            .await;
        }
        Load::Rate(per_s) => {
            let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
            connector.set_nodelay(true);
            let client: Client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .pool_max_idle_per_host(4096)
                    .build(connector);
            let interval = Duration::from_secs_f64(1.0 / per_s.max(1e-3));
            let mut in_flight = tokio::task::JoinSet::new();
            let mut index = 0usize;
            loop {
                let due = started + interval.mul_f64(index as f64);
                if due >= ends {
                    break;
                }
                tokio::time::sleep_until(due.into()).await;
                let (client, target, host, log, tally) = (
                    client.clone(),
                    target.clone(),
                    host.clone(),
                    Arc::clone(&log),
                    Arc::clone(&tally),
                );
                in_flight.spawn(async move {
                    let response = client.request(log.request(index, &target, &host)).await;
                    let answer = collect(response.ok()).await;
                    let outcome = Outcome::of(&log, due.elapsed(), answer);
                    tally.lock().record(outcome);
                });
                index += 1;
                while in_flight.try_join_next().is_some() {}
            }
            while in_flight.join_next().await.is_some() {}
        }
    }
    let _ = ticker.await;
    let elapsed = started.elapsed().as_secs_f64();
    let tally = std::mem::take(&mut *tally.lock());
    let load = match load {
        Load::Concurrency(c) => format!("concurrency {c}"),
        Load::Rate(r) => format!("rate {r}/s"),
    };
    Ok(tally.report(url, log.endpoint, load, elapsed))
}

/// Reads the whole body of `response` (the latency is taken after it).
async fn collect(response: Option<hyper::Response<Incoming>>) -> Answer {
    let response = response?;
    let status = response.status();
    Some((
        status,
        response.into_body().collect().await.map(|b| b.to_bytes()),
    ))
}

/// One client of a closed-loop replay: sends request `first`, then every `step`-th after it,
/// each when the last is answered, until `ends`, over one keep-alive connection (a new one
/// when it is lost).
async fn closed_loop(
    addr: &str,
    host: &HeaderValue,
    log: &RequestLog,
    (first, step): (usize, usize),
    ends: Instant,
    tally: &Mutex<Tally>,
) {
    let target = hyper::Uri::from_static(log.endpoint.path());
    let mut index = first;
    while Instant::now() < ends {
        let Some(mut sender) = connect(addr).await else {
            tally.lock().record(Outcome::Lost);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        while Instant::now() < ends {
            let due = Instant::now();
            let response = match sender.ready().await {
                Ok(()) => sender
                    .send_request(log.request(index, &target, host))
                    .await
                    .ok(),
                Err(_) => None,
            };
            let answer = collect(response).await;
            let outcome = Outcome::of(log, due.elapsed(), answer);
            let lost = matches!(outcome, Outcome::Lost);
            tally.lock().record(outcome);
            index += step;
            if lost {
                break;
            }
        }
    }
}

/// An HTTP/1.1 connection to `addr` whose I/O runs as a task of the calling thread's runtime.
async fn connect(addr: &str) -> Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .ok()?;
    tokio::spawn(connection);
    Some(sender)
}
