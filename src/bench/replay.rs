//! Request logs and their replay against a running server.
//!
//! A request log holds `/v1/rank` request bodies: concatenated MessagePack objects (`.msgpack`)
//! or JSON Lines (`.jsonl`). [`synth_requests`] writes production-like ones, the server's
//! sampler records live ones, and [`replay`] sends them (closed loop: `concurrency` clients
//! each sending the next request when the last one is answered, each a thread of its own with
//! one keep-alive connection, so that the client adds no hand-off between threads to the
//! latency it measures; or open loop: `rate` requests per second whatever the answers, latency
//! counted from when each was due, so a stalled server is not hidden) and reports throughput,
//! latency percentiles, errors by status, and the server's own timings read from the replies
//! (to separate scoring from the service's overhead).

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::api::{FeatureValues, Format, RankDocument, RankRequest, RankResponse};
use crate::rank::fe::{synth_corpus_stats, synth_hit_documents, synth_query, FeatureResolver};
use crate::rank::model::Ranker;

/// Why a request log could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: request {index} (at byte {offset}) does not parse: {reason}")]
    Parse {
        path: String,
        index: usize,
        offset: u64,
        reason: String,
    },
    #[error("{path}: the log holds no request")]
    Empty { path: String },
}

/// A request log in memory: each request's body, exactly as logged.
#[derive(Debug, Clone)]
pub struct RequestLog {
    pub format: Format,
    pub bodies: Vec<Bytes>,
}

impl RequestLog {
    /// Reads a log; each request must parse as a `/v1/rank` request.
    ///
    /// # Errors
    /// [`LogError`] naming the request's index and byte offset.
    pub fn read(path: &Path) -> Result<RequestLog, LogError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LogError::Io {
            path: shown.clone(),
            source,
        })?;
        let format = Format::of_log(path);
        let mut bodies = Vec::new();
        let bytes = Bytes::from(bytes);
        let parse = |index: usize, offset: u64, reason: String| LogError::Parse {
            path: shown.clone(),
            index,
            offset,
            reason,
        };
        match format {
            Format::Json => {
                let mut offset = 0u64;
                for line in bytes.split(|&b| b == b'\n') {
                    if !line.iter().all(u8::is_ascii_whitespace) {
                        serde_json::from_slice::<RankRequest>(line)
                            .map_err(|e| parse(bodies.len(), offset, e.to_string()))?;
                        bodies.push(bytes.slice_ref(line));
                    }
                    offset += line.len() as u64 + 1;
                }
            }
            Format::Msgpack => {
                let mut start = 0usize;
                while start < bytes.len() {
                    let mut de = rmp_serde::Deserializer::new(Cursor::new(&bytes[start..]));
                    RankRequest::deserialize(&mut de)
                        .map_err(|e| parse(bodies.len(), start as u64, e.to_string()))?;
                    let end = start + de.position() as usize;
                    bodies.push(bytes.slice(start..end));
                    start = end;
                }
            }
        }
        if bodies.is_empty() {
            return Err(LogError::Empty { path: shown });
        }
        Ok(RequestLog { format, bodies })
    }

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

    /// Writes `requests` as a log at `path` (its format by extension).
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn write(path: &Path, requests: &[RankRequest]) -> Result<(), LogError> {
        let format = Format::of_log(path);
        let mut out = Vec::new();
        for request in requests {
            let frame = format.encode(request).map_err(|e| LogError::Io {
                path: path.display().to_string(),
                source: std::io::Error::other(e),
            })?;
            out.extend_from_slice(&frame);
            if format == Format::Json {
                out.push(b'\n');
            }
        }
        std::fs::write(path, out).map_err(|source| LogError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

/// Production-like `/v1/rank` requests for `ranker` (store name `name`): hit documents (several
/// streams, Zipf-distributed positions, from `fe::synth_hit_documents`) when every feature of
/// the ranker comes from the FE catalogue, else feature vectors (about 5 % missing values,
/// the rest drawn from a log-normal spread, as counts and scores are).
pub fn synth_requests(
    name: &str,
    ranker: &Ranker,
    docs: usize,
    count: usize,
    k: Option<usize>,
    seed: u64,
) -> Vec<RankRequest> {
    let hits = FeatureResolver::new(&ranker.features).is_ok();
    let width = ranker.features.len();
    (0..count)
        .map(|i| {
            let seed = seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(i as u64);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let (documents, query, stats) = if hits {
                let terms = rng.random_range(2..=5);
                let documents = synth_hit_documents(docs, terms, seed)
                    .into_iter()
                    .map(|h| RankDocument {
                        id: h.id.clone(),
                        features: None,
                        hits: Some(h),
                    })
                    .collect();
                (
                    documents,
                    Some(synth_query(terms, seed)),
                    Some(synth_corpus_stats()),
                )
            } else {
                let documents = (0..docs)
                    .map(|d| RankDocument {
                        id: Some(format!("q{i}d{d}")),
                        features: Some(FeatureValues::Vector(
                            (0..width)
                                .map(|_| {
                                    (rng.random::<f64>() >= 0.05).then(|| {
                                        (rng.random::<f64>() * 2.0 - 1.0).exp()
                                            * rng.random_range(0.0..4.0)
                                    })
                                })
                                .collect(),
                        )),
                        hits: None,
                    })
                    .collect();
                (documents, None, None)
            };
            RankRequest {
                ranker: name.to_string(),
                documents,
                query,
                stats,
                k,
                backend: None,
                explain: false,
                timeout_ms: None,
            }
        })
        .collect()
}

/// How to drive the server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// This many clients, each sending its next request when the last is answered.
    Concurrency(usize),
    /// This many requests per second, on schedule.
    Rate(f64),
}

/// What a replay measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    pub url: String,
    pub load: String,
    pub duration_s: f64,
    pub requests: u64,
    pub ok: u64,
    pub throughput_rps: f64,
    pub documents_per_s: f64,
    /// Client-side latency of answered requests, microseconds.
    pub latency_us: Percentiles,
    /// The server's `timings.total_us` (parsed request to reply), microseconds.
    pub server_total_us: Percentiles,
    /// The server's `timings.read_us` (receiving the request body), microseconds.
    #[serde(default)]
    pub server_read_us: Percentiles,
    /// The server's `timings.decode_us` (decoding the request body), microseconds.
    pub server_decode_us: Percentiles,
    /// The server's `timings.fe_us` (feature extraction or reading the vectors), microseconds.
    pub server_fe_us: Percentiles,
    /// The server's `timings.me_us` (scoring of the request's batch), microseconds.
    pub server_me_us: Percentiles,
    /// The server's `timings.queue_us`, microseconds.
    pub server_queue_us: Percentiles,
    /// Non-2xx answers by status, `"connection"` for requests with no answer, and `"client"`
    /// for closed-loop clients that could not start (a thread or runtime refused).
    pub errors: BTreeMap<String, u64>,
}

/// p50, p90, p99, p99.9 and max of a distribution, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    pub mean: f64,
}

impl Percentiles {
    fn of(h: &hdrhistogram::Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            mean: h.mean(),
        }
    }
}

impl ReplayReport {
    /// A plain-text table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{} ({}), {:.1} s: {} requests, {} ok, {:.1} req/s, {:.0} docs/s\n",
            self.url,
            self.load,
            self.duration_s,
            self.requests,
            self.ok,
            self.throughput_rps,
            self.documents_per_s
        );
        out += &format!(
            "{:<22}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}\n",
            "µs", "p50", "p90", "p99", "p99.9", "max", "mean"
        );
        for (name, p) in [
            ("client latency", &self.latency_us),
            ("server total", &self.server_total_us),
            ("server body read", &self.server_read_us),
            ("server decode", &self.server_decode_us),
            ("server FE", &self.server_fe_us),
            ("server scoring (me)", &self.server_me_us),
            ("server queue", &self.server_queue_us),
        ] {
            out += &format!(
                "{name:<22}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10.0}\n",
                p.p50, p.p90, p.p99, p.p999, p.max, p.mean
            );
        }
        if self.errors.is_empty() {
            out += "errors: none\n";
        } else {
            for (status, n) in &self.errors {
                out += &format!("errors {status}: {n}\n");
            }
        }
        out
    }
}

#[derive(Default)]
struct Tally {
    latency: Option<hdrhistogram::Histogram<u64>>,
    total: Option<hdrhistogram::Histogram<u64>>,
    read: Option<hdrhistogram::Histogram<u64>>,
    decode: Option<hdrhistogram::Histogram<u64>>,
    fe: Option<hdrhistogram::Histogram<u64>>,
    me: Option<hdrhistogram::Histogram<u64>>,
    queue: Option<hdrhistogram::Histogram<u64>>,
    requests: u64,
    ok: u64,
    documents: u64,
    errors: BTreeMap<String, u64>,
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    // 1 µs to 100 s, 3 significant digits: the bounds are constant and valid.
    hdrhistogram::Histogram::new_with_bounds(1, 100_000_000, 3).expect("constant histogram bounds")
}

fn add(h: &mut Option<hdrhistogram::Histogram<u64>>, v: u64) {
    let _ = h
        .get_or_insert_with(histogram)
        .record(v.clamp(1, 100_000_000));
}

/// How one request ended, as the tally counts it.
enum Outcome {
    /// A 2xx reply, with its timings and scores when it parses as a `RankResponse`.
    Answered(Duration, Option<RankResponse>),
    Status(hyper::StatusCode),
    /// No answer on the connection.
    Lost,
}

impl Outcome {
    /// Reads `answer`, taken `latency` after its request was due, replies being in `format`.
    fn of(format: Format, latency: Duration, answer: Answer) -> Outcome {
        match answer {
            Some((status, Ok(body))) if status.is_success() => {
                Outcome::Answered(latency, format.decode::<RankResponse>(&body).ok())
            }
            Some((status, _)) => Outcome::Status(status),
            None => Outcome::Lost,
        }
    }
}

impl Tally {
    /// Counts a closed-loop client whose thread or runtime did not start: its requests are
    /// missing from the load, which the report says instead of hiding.
    fn client_failed(&mut self) {
        *self.errors.entry("client".to_string()).or_insert(0) += 1;
    }

    fn record(&mut self, outcome: Outcome) {
        self.requests += 1;
        match outcome {
            Outcome::Answered(latency, reply) => {
                self.ok += 1;
                add(&mut self.latency, latency.as_micros() as u64);
                if let Some(reply) = reply {
                    let t = reply.timings;
                    self.documents += reply.scores.len() as u64;
                    add(&mut self.total, t.total_us);
                    add(&mut self.read, t.read_us);
                    add(&mut self.decode, t.decode_us);
                    add(&mut self.fe, t.fe_us);
                    add(&mut self.me, t.me_us);
                    add(&mut self.queue, t.queue_us);
                }
            }
            Outcome::Status(status) => {
                *self.errors.entry(status.as_u16().to_string()).or_insert(0) += 1;
            }
            Outcome::Lost => *self.errors.entry("connection".to_string()).or_insert(0) += 1,
        }
    }
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
    let target: hyper::Uri = format!("{}/v1/rank", url.trim_end_matches('/'))
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
                    let outcome = Outcome::of(log.format, due.elapsed(), answer);
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
    let of = |h: &Option<hdrhistogram::Histogram<u64>>| {
        h.as_ref().map(Percentiles::of).unwrap_or_default()
    };
    Ok(ReplayReport {
        url: url.to_string(),
        load: match load {
            Load::Concurrency(c) => format!("concurrency {c}"),
            Load::Rate(r) => format!("rate {r}/s"),
        },
        duration_s: elapsed,
        requests: tally.requests,
        ok: tally.ok,
        throughput_rps: tally.ok as f64 / elapsed,
        documents_per_s: tally.documents as f64 / elapsed,
        latency_us: of(&tally.latency),
        server_total_us: of(&tally.total),
        server_read_us: of(&tally.read),
        server_decode_us: of(&tally.decode),
        server_fe_us: of(&tally.fe),
        server_me_us: of(&tally.me),
        server_queue_us: of(&tally.queue),
        errors: tally.errors,
    })
}

/// What came back for one request: its status and body, or nothing (no answer on the
/// connection).
type Answer = Option<(hyper::StatusCode, Result<Bytes, hyper::Error>)>;

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
    let target = hyper::Uri::from_static("/v1/rank");
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
            let outcome = Outcome::of(log.format, due.elapsed(), answer);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::model::Input;

    fn ranker(features: Vec<String>) -> Ranker {
        Ranker {
            inputs: vec![Input::Linear {
                feature: 0,
                slope: 1.0,
                intercept: 0.0,
            }],
            features,
            layers: Vec::new(),
            ensemble: None,
        }
    }

    #[test]
    fn logs_round_trip_in_both_formats() {
        let dir = tempfile::tempdir().unwrap();
        let requests = synth_requests("r", &ranker(vec!["x".into(), "y".into()]), 3, 5, Some(2), 1);
        assert!(requests
            .iter()
            .all(|r| r.documents.iter().all(|d| d.features.is_some())));
        for name in ["log.msgpack", "log.jsonl"] {
            let path = dir.path().join(name);
            RequestLog::write(&path, &requests).unwrap();
            let log = RequestLog::read(&path).unwrap();
            assert_eq!(log.bodies.len(), 5);
            let back: Vec<RankRequest> = log
                .bodies
                .iter()
                .map(|b| log.format.decode(b).unwrap())
                .collect();
            assert_eq!(back, requests);
        }
    }

    #[test]
    fn catalogue_rankers_get_hit_documents() {
        let features = crate::rank::fe::feature_names()[..3].to_vec();
        let requests = synth_requests("r", &ranker(features), 4, 2, None, 9);
        assert!(requests
            .iter()
            .all(|r| r.query.is_some() && r.documents.iter().all(|d| d.hits.is_some())));
        assert_eq!(
            requests,
            synth_requests(
                "r",
                &ranker(crate::rank::fe::feature_names()[..3].to_vec()),
                4,
                2,
                None,
                9
            )
        );
    }

    #[test]
    fn a_bad_frame_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.jsonl");
        std::fs::write(
            &path,
            "{\"ranker\": \"r\", \"documents\": []}\n{\"ranker\": 3}\n",
        )
        .unwrap();
        let err = RequestLog::read(&path).unwrap_err().to_string();
        assert!(err.contains("request 1 (at byte 33)"), "{err}");
    }
}
