//! `POST /v1/search` with a ranker on a GPU: the candidates' hits laid out for the fused device
//! path straight from the forward index (`server::candidate_hits`) score as on the CPU, with
//! `explain` (a device turn alone, `fe_backend=gpu`) and without it (the fused requests' shared
//! device turns, the default `fe_backend=auto`).

use rankserve::api::SearchRequest;
use rankserve::backend::Backend;
use rankserve::config::Config;
use rankserve::index::DocId;
use rankserve::select::Mode;

use crate::http::TestServer;
use crate::search::{request, search_json, search_server_with};

/// One candidate's answer: its document, its score and, with `explain`, its features.
type Answer = (DocId, f64, Option<Vec<Option<f64>>>);

/// On a GPU (skipped without one, failing under `RANKSERVE_REQUIRE_GPU=1`): a server over the
/// fixture index configured by `tweak`, and for each query its ranked search with the medium
/// ranker on `backend=cpu` and `backend=gpu` (with `explain` when asked): the same candidates,
/// every explained feature equal bit for bit, every score the CPU's within DESIGN §2's 1e-4
/// (the medium ranker's NN), and each reply naming the side that ranked it (`cpu` for the GPU
/// request under `RANKSERVE_FAULT_GPU=1`, where the batch reruns on the CPU).
async fn ranks_like_the_cpu(test: &str, tweak: impl FnOnce(&mut Config), explain: bool) {
    if rankserve::gpu::device::device_for_tests(test).is_none() {
        return;
    }
    let faulty = std::env::var("RANKSERVE_FAULT_GPU").is_ok_and(|v| v == "1");
    let (s, _dir, _index) = search_server_with(|c| {
        c.backend = Backend::Auto;
        tweak(c);
    });
    for (text, mode) in [
        ("the kitchen", Mode::Or),
        ("ranking lists", Mode::AndOr),
        ("of the and", Mode::And),
        ("the", Mode::Or),
    ] {
        let cpu = answers(&s, text, mode, explain, Backend::Cpu, "cpu").await;
        let gpu_side = if faulty { "cpu" } else { "gpu" };
        let gpu = answers(&s, text, mode, explain, Backend::Gpu, gpu_side).await;
        assert_eq!(cpu.len(), gpu.len(), "{text:?}");
        assert!(!cpu.is_empty(), "{text:?}");
        let bits = |v: &Option<Vec<Option<f64>>>| {
            (v.iter().flatten())
                .map(|x| x.map(f64::to_bits))
                .collect::<Vec<_>>()
        };
        for ((doc, want, want_features), (gdoc, got, features)) in cpu.iter().zip(&gpu) {
            assert_eq!(doc, gdoc, "{text:?}");
            assert_eq!(features.is_some(), explain, "{text:?}: document {doc}");
            assert_eq!(
                bits(features),
                bits(want_features),
                "{text:?}: document {doc}"
            );
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{text:?}: document {doc}: GPU {got} vs CPU {want}"
            );
        }
    }
}

/// The ranked search of `text` on `backend`, its candidates by document; asserts the reply's
/// ranking side is `side`.
async fn answers(
    s: &TestServer,
    text: &str,
    mode: Mode,
    explain: bool,
    backend: Backend,
    side: &str,
) -> Vec<Answer> {
    let req = SearchRequest {
        ranker: Some("prod-medium".into()),
        explain,
        backend: Some(backend),
        ..request(text, mode, usize::MAX)
    };
    let got = search_json(s, &req).await;
    assert_eq!(got.backends.rank, side, "{text:?} {backend:?}");
    let mut hits: Vec<Answer> = (got.hits.into_iter())
        .map(|h| (h.doc, h.score.unwrap(), h.explain.map(|e| e.features)))
        .collect();
    hits.sort_by_key(|h| h.0);
    hits
}

/// `fe_backend=gpu`, `explain`: a ranked search on `backend=gpu` extracts and scores its
/// candidates on the fused device path, a turn alone ([`ranks_like_the_cpu`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_ranked_search_extracts_and_scores_like_the_cpu() {
    let test = "gpu_ranked_search_extracts_and_scores";
    ranks_like_the_cpu(test, |c| c.fe_backend = Backend::Gpu, true).await;
}

/// The default `fe_backend=auto`, no `explain`: the fused requests' shared device turns
/// ([`ranks_like_the_cpu`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_ranked_search_without_explain_scores_like_the_cpu() {
    let test = "gpu_ranked_search_without_explain_scores_like_the_cpu";
    ranks_like_the_cpu(test, |_| {}, false).await;
}
