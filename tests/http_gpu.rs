//! `/v1/rank` on the GPU backend: answers like the CPU's, a ranker over the device budget on the
//! CPU, several devices, and the fallback when a device fails (skipped without a GPU, failing
//! under `RANKSERVE_REQUIRE_GPU=1`).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;

use rankserve::api::{RankResponse, RankerDescription};
use rankserve::backend::Backend;

use crate::http::{
    expected_scores, json, post, random_features, rank_request, send, server_with, test_ranker,
};

/// Scores equal within DESIGN §2's NN tolerance (the test ranker has a tanh layer).
fn assert_close(got: &[Option<f64>], want: &[Option<f64>]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.unwrap(), w.unwrap());
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
            "document {i}: GPU {g} vs CPU {w}"
        );
    }
}

/// Ranks `features` with the test ranker on `backend`, expecting 200.
async fn rank_on(app: &Router, features: &[f64], backend: Backend) -> RankResponse {
    let mut request = rank_request("small", features, 4);
    request.backend = Some(backend);
    let (status, _, body) = send(app, post("/v1/rank", "application/json", json(&request))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn gpu_backend_ranks_like_the_cpu_and_reports_itself() {
    if rankserve::gpu::device::device_for_tests("gpu_backend_ranks_like_the_cpu").is_none() {
        return;
    }
    if std::env::var("RANKSERVE_FAULT_GPU").is_ok_and(|v| v == "1") {
        return eprintln!(
            "skipped under RANKSERVE_FAULT_GPU=1 (see gpu_fault_falls_back_to_the_cpu)"
        );
    }
    let s = server_with(|c| c.backend = Backend::Auto);
    assert!(s.state.has_gpu());
    let features = random_features(300, 4, 11);
    let want = expected_scores(&test_ranker(0.125), &features);
    for backend in [Backend::Gpu, Backend::Cpu] {
        let reply = rank_on(&s.app, &features, backend).await;
        assert_eq!(reply.backend, backend.to_string());
        match backend {
            Backend::Cpu => assert_eq!(reply.scores, want),
            _ => assert_close(&reply.scores, &want),
        }
    }
    // Warm-up uploaded the ranker and measured its crossover.
    let (_, _, body) = send(
        &s.app,
        Request::get("/v1/rankers/small")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let description: RankerDescription = serde_json::from_slice(&body).unwrap();
    assert_eq!(description.resident, ["cpu", "gpu"]);
    let crossover = description.crossover.expect("crossover measured at load");
    assert!(!crossover.points.is_empty());
    let (_, _, body) = send(
        &s.app,
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await;
    let metrics = String::from_utf8(body).unwrap();
    for name in [
        "rankserve_gpu_power_watts",
        "rankserve_gpu_energy_joules",
        "rankserve_ranker_cache_bytes{cache=\"gpu\",device=\"0\"}",
        "rankserve_gpu_device_up{device=\"0\"}",
        "rankserve_gpu_device_turns_total{device=\"0\"}",
        "rankserve_gpu_device_busy_microseconds_total{device=\"0\"}",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

#[tokio::test]
async fn ranker_over_the_gpu_budget_is_ranked_on_the_cpu() {
    if rankserve::gpu::device::device_for_tests("ranker_over_the_gpu_budget").is_none() {
        return;
    }
    let s = server_with(|c| {
        c.backend = Backend::Auto;
        c.gpu_cache_bytes = 1;
    });
    let features = random_features(64, 4, 12);
    let reply = rank_on(&s.app, &features, Backend::Gpu).await;
    assert_eq!(reply.backend, "cpu");
    assert_eq!(
        reply.scores,
        expected_scores(&test_ranker(0.125), &features)
    );
}

/// Holds device `executor` (a turn, counted in its load) until the returned sender is dropped
/// or sent to; returns once the turn is held.
pub(crate) fn hold_device(
    executor: &std::sync::Arc<rankserve::gpu::Executor>,
) -> (std::thread::JoinHandle<()>, std::sync::mpsc::Sender<()>) {
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let executor = std::sync::Arc::clone(executor);
    let holder = std::thread::spawn(move || {
        executor.run(|_| {
            held_tx.send(()).unwrap();
            let _ = release_rx.recv();
        })
    });
    held_rx.recv().unwrap();
    (holder, release_tx)
}

/// With several GPUs, a batch goes to a device that is free: while one device is held busy,
/// requests are scored on another, like the CPU, for each device in turn (they would wait for
/// the held one otherwise, and time out here). A device out of service after a failure gets no
/// work: with every device out, the CPU answers, counted as `out_of_service` (on a GPU; the
/// busy-device part needs two; skipped without one, failing under `RANKSERVE_REQUIRE_GPU=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_gpu_ranks_like_the_cpu_and_one_out_of_service_gets_no_work() {
    let test = "each_gpu_ranks_like_the_cpu_and_one_out_of_service_gets_no_work";
    if rankserve::gpu::device::device_for_tests(test).is_none() {
        return;
    }
    if std::env::var("RANKSERVE_FAULT_GPU").is_ok() {
        return eprintln!("{test}: skipped under RANKSERVE_FAULT_GPU");
    }
    let s = server_with(|c| c.backend = Backend::Auto);
    let executors = s.state.gpu_executors().to_vec();
    let features = random_features(300, 4, 17);
    let want = expected_scores(&test_ranker(0.125), &features);
    if executors.len() < 2 {
        eprintln!("{test}: one GPU, the busy-device part skipped");
    }
    for busy in (0..executors.len()).filter(|_| executors.len() >= 2) {
        let (holder, release) = hold_device(&executors[busy]);
        for _ in 0..3 {
            let reply = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                rank_on(&s.app, &features, Backend::Gpu),
            )
            .await
            .unwrap_or_else(|_| panic!("a request waited for the busy GPU {busy}"));
            assert_eq!(reply.backend, "gpu");
            assert_close(&reply.scores, &want);
        }
        drop(release);
        holder.join().unwrap();
    }
    let fault = rankserve::gpu::GpuError::FaultInjected { op: test };
    for executor in &executors {
        assert!(executor.failed(&fault));
        assert!(!executor.in_service());
    }
    let reply = rank_on(&s.app, &features, Backend::Gpu).await;
    assert_eq!(reply.backend, "cpu");
    assert_eq!(reply.scores, want);
    let (_, _, body) = send(
        &s.app,
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await;
    let metrics = String::from_utf8(body).unwrap();
    // The registry is the process's: other tests' servers hold executors of the same devices,
    // so gauges are not read back here (the executors' state is, above); counters only grow.
    for wanted in [
        "rankserve_gpu_device_failures_total{device=\"0\"}",
        "rankserve_gpu_fallback_total{stage=\"rank\",reason=\"out_of_service\"}",
    ] {
        assert!(metrics.contains(wanted), "{wanted} missing from /metrics");
    }
}

/// Meaningful under `RANKSERVE_FAULT_GPU=1` (scripts/gpu-run.sh runs it so): every GPU call
/// fails, and the caller still gets the CPU's answer.
#[tokio::test]
async fn gpu_fault_falls_back_to_the_cpu() {
    if std::env::var("RANKSERVE_FAULT_GPU").is_err() {
        return eprintln!("gpu_fault_falls_back_to_the_cpu: runs under RANKSERVE_FAULT_GPU=1");
    }
    if rankserve::gpu::device::device_for_tests("gpu_fault_falls_back_to_the_cpu").is_none() {
        return;
    }
    let s = server_with(|c| c.backend = Backend::Auto);
    let features = random_features(500, 4, 13);
    for backend in [Backend::Gpu, Backend::Auto] {
        let reply = rank_on(&s.app, &features, backend).await;
        assert_eq!(reply.backend, "cpu");
        assert_eq!(
            reply.scores,
            expected_scores(&test_ranker(0.125), &features)
        );
    }
    let metrics = rankserve::server::metrics::handle().render();
    assert!(metrics.contains("rankserve_gpu_fallback_total{stage=\"rank\",reason=\"gpu_error\"}"));
}
