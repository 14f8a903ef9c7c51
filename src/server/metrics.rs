//! Prometheus metrics: the process-wide recorder, the per-route middleware, and the names.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `rankserve_http_requests_total` | counter | `route`, `status` |
//! | `rankserve_http_errors_total` | counter | `code` |
//! | `rankserve_http_request_duration_seconds` | histogram | `route` |
//! | `rankserve_http_connections_closed_total` | counter | `reason`: `timeout` (no complete request head within `idle_timeout_ms`: idle keep-alive or slow headers), `bad_head` (a request head hyper refused itself, answering 400, 414 or 431 without a body), `io` (the client went away mid-exchange) |
//! | `rankserve_rank_duration_seconds` | histogram | `ranker` |
//! | `rankserve_documents_ranked_total` | counter | `ranker` |
//! | `rankserve_backend_total` | counter | `backend` |
//! | `rankserve_search_duration_seconds` | histogram | `ranker` (`none` for BM25 order) |
//! | `rankserve_search_select_seconds` | histogram | |
//! | `rankserve_batch_documents`, `rankserve_batch_requests` | histogram | |
//! | `rankserve_select_gpu_batch_queries` | histogram | none (GPU selections run as one batch) |
//! | `rankserve_ranker_cache_{hits,misses,evictions}_total` | counter | `cache` (`cpu`, `gpu`) |
//! | `rankserve_ranker_cache_bytes`, `rankserve_ranker_cache_budget_bytes` | gauge | `cache` |
//! | `rankserve_gpu_fallback_total` | counter | `stage` (`rank`, `select`), `reason` (`too_large`, `gpu_error`) |
//! | `rankserve_select_backend_total` | counter | `backend` (the processor that selected: `cpu`, `gpu`) |
//! | `rankserve_posting_cache_{hits,misses}_total` | counter | none (with a GPU: query lists found resident, copied per query) |
//! | `rankserve_posting_cache_copied_bytes_total` | counter | none (bytes queries copied to the device) |
//! | `rankserve_posting_cache_bytes`, `rankserve_posting_cache_lists` | gauge | none (resident on the device) |
//! | `rankserve_gpu_power_watts` | gauge | none (with a GPU: NVML's board power when scraped) |
//! | `rankserve_gpu_energy_joules` | gauge | none (with a GPU: NVML's total-energy counter) |
//! | `rankserve_broker_shard_calls_total` | counter | `shard`, `phase` (`stats`, `search`), `outcome` (`ok`, `refused`, `missing`) (a broker's calls to its shards) |
//! | `rankserve_broker_shard_seconds` | histogram | `shard`, `phase` |
//! | `rankserve_broker_partial_total` | counter | none (a broker's searches answered without some shard) |

use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::state::State;
use crate::gpu::lru::LruStats;

/// Seconds: 50 µs to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 10.0,
];
/// Counts (documents or requests per batch).
const SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// The process-wide Prometheus handle, installing the recorder on first use (a process has one
/// global recorder; servers in one test binary share it).
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Prefix("rankserve_batch_".into()), SIZE_BUCKETS)
            })
            .and_then(|b| {
                let batch = Matcher::Full("rankserve_select_gpu_batch_queries".into());
                b.set_buckets_for_metric(batch, SIZE_BUCKETS)
            });
        let recorder = match builder {
            Ok(builder) => builder.build_recorder(),
            // Only an empty bucket list fails; the lists above are constant and non-empty.
            Err(_) => PrometheusBuilder::new().build_recorder(),
        };
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics may be empty");
        }
        metrics::counter!("rankserve_gpu_fallback_total", "stage" => "rank", "reason" => "none")
            .absolute(0);
        handle
    })
}

/// Middleware: request count and latency per matched route.
pub async fn track(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let started = Instant::now();
    let response = next.run(req).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!("rankserve_http_request_duration_seconds", "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!("rankserve_http_requests_total", "route" => route, "status" => status)
        .increment(1);
    response
}

/// Counts a connection that ended in an error of hyper's (see the table above); logged at
/// debug only, as clients cause these at will.
pub fn record_connection_error(err: &hyper::Error) {
    let reason = if err.is_timeout() {
        "timeout"
    } else if err.is_parse() || err.is_parse_too_large() {
        "bad_head"
    } else {
        "io"
    };
    tracing::debug!(reason, error = %err, "connection closed");
    metrics::counter!("rankserve_http_connections_closed_total", "reason" => reason).increment(1);
}

/// The Prometheus text, with the cache counters brought up to date.
pub fn render(state: &State) -> String {
    record_cache("cpu", None, state.store().cache_stats());
    for (ordinal, gpu) in state.rank.gpu_rankers() {
        record_cache("gpu", Some(ordinal), gpu.stats());
    }
    for (ordinal, stats) in state.select.posting_cache_stats() {
        let device = ordinal.to_string();
        metrics::counter!("rankserve_posting_cache_hits_total", "device" => device.clone())
            .absolute(stats.hits);
        metrics::counter!("rankserve_posting_cache_misses_total", "device" => device.clone())
            .absolute(stats.misses);
        metrics::counter!("rankserve_posting_cache_copied_bytes_total", "device" => device.clone())
            .absolute(stats.bytes_copied);
        metrics::gauge!("rankserve_posting_cache_bytes", "device" => device.clone())
            .set(stats.resident_bytes as f64);
        metrics::gauge!("rankserve_posting_cache_lists", "device" => device)
            .set(stats.resident_lists as f64);
    }
    for executor in state.gpu_executors() {
        executor.record_gauges();
    }
    // The selection scheduler's view of the queues at this instant.
    let load = state.select.load();
    metrics::gauge!("rankserve_select_gpu_queued_microseconds").set(load.gpu_queued_us);
    metrics::gauge!("rankserve_select_cpu_running").set(load.cpu_running as f64);
    for (ordinal, meter) in state.power() {
        let device = ordinal.to_string();
        match (meter.power_w(), meter.energy_j()) {
            (Ok(watts), Ok(joules)) => {
                metrics::gauge!("rankserve_gpu_power_watts", "device" => device.clone()).set(watts);
                metrics::gauge!("rankserve_gpu_energy_joules", "device" => device).set(joules);
            }
            (Err(err), _) | (_, Err(err)) => {
                tracing::warn!(device, error = %err, "reading GPU power")
            }
        }
    }
    handle().render()
}

fn record_cache(
    cache: &'static str,
    device: Option<usize>,
    (stats, resident, budget): (LruStats, u64, u64),
) {
    // The CPU's cache has no device label; each GPU's has its ordinal.
    let mut labels = vec![metrics::Label::new("cache", cache)];
    labels.extend(device.map(|d| metrics::Label::new("device", d.to_string())));
    metrics::counter!("rankserve_ranker_cache_hits_total", labels.clone()).absolute(stats.hits);
    metrics::counter!("rankserve_ranker_cache_misses_total", labels.clone()).absolute(stats.misses);
    metrics::counter!("rankserve_ranker_cache_evictions_total", labels.clone())
        .absolute(stats.evictions);
    metrics::gauge!("rankserve_ranker_cache_bytes", labels.clone()).set(resident as f64);
    metrics::gauge!("rankserve_ranker_cache_budget_bytes", labels).set(budget as f64);
}
