//! `POST /v1/search` with a ranker on a GPU: the candidates' hits laid out for the fused device
//! path straight from the forward index (`server::candidate_hits`) score as on the CPU. Beside
//! `search.rs`'s GPU tests (which run with `explain`, a device turn alone), these run without
//! it: the fused requests' shared device turns.

use rankserve::api::SearchRequest;
use rankserve::backend::Backend;
use rankserve::select::Mode;

use crate::search::{request, search_json, search_server_on};

/// On a GPU (skipped without one, failing under `RANKSERVE_REQUIRE_GPU=1`): with the default
/// `fe_backend=auto`, ranked searches on `backend=gpu` without `explain` (the fused path's
/// shared device turns: the candidates' hits laid out straight from the forward index) give
/// every candidate the CPU's score within DESIGN §2's 1e-4 (the medium ranker's NN), the same
/// candidates, and say `gpu` (`cpu` under `RANKSERVE_FAULT_GPU=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_ranked_search_without_explain_scores_like_the_cpu() {
    let test = "gpu_ranked_search_without_explain_scores_like_the_cpu";
    if rankserve::gpu::device::device_for_tests(test).is_none() {
        return;
    }
    let faulty = std::env::var("RANKSERVE_FAULT_GPU").is_ok_and(|v| v == "1");
    let (s, _dir, _index) = search_server_on(Backend::Auto);
    for (text, mode) in [
        ("the kitchen", Mode::Or),
        ("ranking lists", Mode::AndOr),
        ("of the and", Mode::And),
        ("the", Mode::Or),
    ] {
        let mut answers = Vec::new();
        for backend in [Backend::Cpu, Backend::Gpu] {
            let req = SearchRequest {
                ranker: Some("prod-medium".into()),
                backend: Some(backend),
                ..request(text, mode, usize::MAX)
            };
            let got = search_json(&s, &req).await;
            let side = match backend {
                Backend::Gpu if !faulty => "gpu",
                _ => "cpu",
            };
            assert_eq!(got.backends.rank, side, "{text:?} {backend:?}");
            let mut hits: Vec<_> = (got.hits.into_iter())
                .map(|h| (h.doc, h.score.unwrap()))
                .collect();
            hits.sort_by_key(|h| h.0);
            answers.push(hits);
        }
        let (cpu, gpu) = (&answers[0], &answers[1]);
        assert_eq!(cpu.len(), gpu.len(), "{text:?}");
        assert!(!cpu.is_empty(), "{text:?}");
        for ((doc, want), (gdoc, got)) in cpu.iter().zip(gpu) {
            assert_eq!(doc, gdoc, "{text:?}");
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{text:?}: document {doc}: GPU {got} vs CPU {want}"
            );
        }
    }
}
