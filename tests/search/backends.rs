//! `backend` on `/v1/search`: the CPU, `auto` and the GPU, whose selections must be the CPU's,
//! with one device busy or a query past its queue deadline.

use super::reload::{reload, small_corpus};
use super::*;

/// `POST /v1/search` with `backend` set, and the status and reply.
async fn search_on(
    s: &TestServer,
    text: &str,
    mode: Mode,
    k: usize,
    backend: Backend,
) -> (StatusCode, Vec<u8>) {
    let req = SearchRequest {
        backend: Some(backend),
        ..request(text, mode, k)
    };
    let (status, _, body) = send(&s.app, post("/v1/search", "application/json", json(&req))).await;
    (status, body)
}

/// Selection backends: `cpu` selects on the CPU, `auto` gives the CPU's hits wherever it runs
/// (on the CPU without a GPU), `gpu` is 503 `gpu_unavailable` without a GPU.
#[tokio::test]
async fn search_backend_selects_cpu_or_auto_and_gpu_needs_a_gpu() {
    let (s, _dir, index) = search_server_on(Backend::Auto);
    for text in QUERIES {
        for mode in [Mode::And, Mode::Or, Mode::AndOr] {
            let want = search(&index, &Query::from_text(text, 7, mode))
                .unwrap()
                .hits;
            for backend in [Backend::Cpu, Backend::Auto] {
                let (status, body) = search_on(&s, text, mode, 7, backend).await;
                assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
                let got: SearchResponse = serde_json::from_slice(&body).unwrap();
                assert_eq!(doc_scores(&got), want, "{text:?} {mode:?} {backend}");
                let expected_sides: &[&str] = match (backend, s.state.has_gpu()) {
                    (Backend::Auto, true) => &["cpu", "gpu"],
                    _ => &["cpu"],
                };
                assert!(
                    expected_sides.contains(&got.backends.select.as_str()),
                    "{backend}: selected on {}",
                    got.backends.select
                );
            }
        }
    }
    if !s.state.has_gpu() {
        let (status, body) = search_on(&s, "kitchen", Mode::And, 7, Backend::Gpu).await;
        let error: rankserve::server::error::ErrorBody = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (status, error.error.code.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "gpu_unavailable")
        );
    }
}

/// On a GPU (skipped without one, failing under `RANKSERVE_REQUIRE_GPU=1`): `backend=gpu`
/// selects on the GPU exactly the CPU's hits (documents, order, score bits) for AND, OR and
/// AND_OR, also after a reload to another index (the posting cache never serves the old lists).
/// Under `RANKSERVE_FAULT_GPU=1` every query falls back to the
/// CPU with the same hits, counted in `rankserve_gpu_fallback_total{stage="select"}`.
#[tokio::test]
async fn gpu_search_selects_exactly_the_cpus_hits() {
    if rankserve::gpu::device::device_for_tests("gpu_search_selects_exactly_the_cpus_hits")
        .is_none()
    {
        return;
    }
    let faulty = std::env::var("RANKSERVE_FAULT_GPU").is_ok_and(|v| v == "1");
    let (s, dir, index) = search_server_on(Backend::Auto);
    assert!(s.state.has_gpu());
    let check = |index: &Index, text: &str, mode: Mode, k: usize, got: &SearchResponse| {
        let want = search(index, &Query::from_text(text, k, mode))
            .unwrap()
            .hits;
        assert_eq!(doc_scores(got), want, "{text:?} {mode:?} k={k}");
        let side = if faulty { "cpu" } else { "gpu" };
        assert_eq!(got.backends.select, side, "{text:?} {mode:?}");
    };
    for text in QUERIES {
        for mode in [Mode::And, Mode::Or, Mode::AndOr] {
            for k in [1, 7, 1000] {
                let (status, body) = search_on(&s, text, mode, k, Backend::Gpu).await;
                assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
                check(
                    &index,
                    text,
                    mode,
                    k,
                    &serde_json::from_slice(&body).unwrap(),
                );
            }
        }
    }
    let corpus = small_corpus(dir.path(), "zebra");
    let next = dir.path().join("next");
    build(&corpus, &next, &BuildOptions::default(), &|_| {}).unwrap();
    let (status, _, _) = send(&s.app, reload(Some(&next), Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK);
    let reloaded = Index::open(&next).unwrap();
    for text in ["kitchen", "zebra kitchen", "kitchen 1"] {
        for mode in [Mode::And, Mode::Or, Mode::AndOr] {
            let (status, body) = search_on(&s, text, mode, 10, Backend::Gpu).await;
            assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
            check(
                &reloaded,
                text,
                mode,
                10,
                &serde_json::from_slice(&body).unwrap(),
            );
        }
    }
    let (_, _, body) = send(
        &s.app,
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await;
    let metrics = String::from_utf8(body).unwrap();
    let mut expected = vec![
        "rankserve_posting_cache_hits_total",
        "rankserve_posting_cache_copied_bytes_total",
        "rankserve_posting_cache_bytes",
        "rankserve_select_gpu_queued_microseconds",
        "rankserve_select_cpu_running",
    ];
    if faulty {
        expected.push("rankserve_select_backend_total{backend=\"cpu\"}");
        expected.push("rankserve_gpu_fallback_total{stage=\"select\",reason=\"gpu_error\"}");
    } else {
        expected.push("rankserve_select_backend_total{backend=\"gpu\"}");
    }
    for name in expected {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

/// On a GPU (skipped without one, failing under `RANKSERVE_REQUIRE_GPU=1`): with
/// With several GPUs, a selection goes to a device that is free: while one device is held
/// busy, `backend=gpu` queries select on another, exactly the CPU's hits, for each device in
/// turn (on the held one they would wait `gpu_queue_ms` and run on the CPU). Needs two GPUs;
/// skipped otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_gpu_selects_the_cpus_hits_while_another_is_busy() {
    let test = "each_gpu_selects_the_cpus_hits_while_another_is_busy";
    if rankserve::gpu::device::device_for_tests(test).is_none() {
        return;
    }
    if std::env::var("RANKSERVE_FAULT_GPU").is_ok() {
        return eprintln!("{test}: skipped under RANKSERVE_FAULT_GPU");
    }
    let (s, _dir, index) = search_server_on(Backend::Auto);
    let executors = s.state.gpu_executors().to_vec();
    if executors.len() < 2 {
        return eprintln!("{test}: skipped with one GPU");
    }
    for busy in 0..executors.len() {
        let (holder, release) = hold_device(&executors[busy]);
        for text in QUERIES {
            for mode in [Mode::And, Mode::Or, Mode::AndOr] {
                let (status, body) = search_on(&s, text, mode, 7, Backend::Gpu).await;
                assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
                let got: SearchResponse = serde_json::from_slice(&body).unwrap();
                let want = search(&index, &Query::from_text(text, 7, mode))
                    .unwrap()
                    .hits;
                assert_eq!(doc_scores(&got), want, "{text:?} {mode:?}, GPU {busy} busy");
                assert_eq!(
                    got.backends.select, "gpu",
                    "{text:?} {mode:?}, GPU {busy} busy"
                );
            }
        }
        drop(release);
        holder.join().unwrap();
    }
}

/// A `backend=gpu` selection that finds the device held by other queries waits `gpu_queue_ms`,
/// then runs on the CPU: the same hits, reported as selected on the CPU, long before the device
/// is free (on a GPU; skipped without one, failing under `RANKSERVE_REQUIRE_GPU=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_query_past_its_queue_deadline_runs_on_the_cpu() {
    if rankserve::gpu::device::device_for_tests(
        "a_gpu_query_past_its_queue_deadline_runs_on_the_cpu",
    )
    .is_none()
    {
        return;
    }
    let (dir, index) = built(&fixture_corpus(), "fixture", Codec::Ef);
    let at = index.dir().to_path_buf();
    let s = server_with(|c| {
        c.index = Some(at);
        c.backend = Backend::Auto;
        c.gpu_queue_ms = 50;
    });
    let _dir = dir;
    // Other work holds every device for 2 s.
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let state = s.state.clone();
    let holder = std::thread::spawn(move || {
        let executors = state.gpu_executors();
        assert!(!executors.is_empty(), "the probe found the GPU");
        let _held: Vec<_> = executors.iter().map(|e| e.turns().take()).collect();
        held_tx.send(()).unwrap();
        std::thread::sleep(std::time::Duration::from_secs(2));
    });
    held_rx.recv().unwrap();
    let started = std::time::Instant::now();
    let (status, body) = search_on(&s, "kitchen ranking", Mode::And, 7, Backend::Gpu).await;
    let waited = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let got: SearchResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(got.backends.select, "cpu");
    let want = search(&index, &Query::from_text("kitchen ranking", 7, Mode::And))
        .unwrap()
        .hits;
    assert_eq!(doc_scores(&got), want);
    assert!(
        waited >= std::time::Duration::from_millis(50)
            && waited < std::time::Duration::from_secs(1),
        "answered after {waited:?}"
    );
    holder.join().unwrap();
}
