//! `POST /v1/search` and `POST /v1/index/reload` through the real router (and one real
//! listener), over indexes built from the fixture corpus: BM25-only hits equal
//! `select::search`, ranked hits equal `/v1/rank` on the same hit documents, reloads swap or
//! leave the old index serving, and the bad inputs of issue 5 answer as `docs/api.md` says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;

use crate::cli::{rankserve, root};
use crate::http::{expect_error, json, post, send, server_with, TestServer, TOKEN};
use crate::http_gpu::hold_device;
use crate::live::{client, live};
use crate::selection::{built, fixture_corpus};
use rankserve::api::{
    IndexDescription, RankDocument, RankRequest, RankResponse, SearchRequest, SearchResponse,
};
use rankserve::backend::Backend;
use rankserve::config::Config;
use rankserve::index::builder::{build, BuildOptions};
use rankserve::index::codecs::Codec;
use rankserve::index::tokenize::Tokenizer;
use rankserve::index::{DocId, Index};
use rankserve::rank::fe::{CorpusStats, FeatureResolver, HitDocument, HitStream, QueryInfo};
use rankserve::rank::format::parse_native;
use rankserve::select::{bm25, dedup_terms, search, Mode, Query};

mod backends;
mod reload;
mod serve;

fn bundled_rankers() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers")
}

/// A server over the fixture index (EF codec) with the bundled small and medium rankers copied
/// in as `prod-small` and `prod-medium`, plus the test's own handle on the same index.
fn search_server() -> (TestServer, tempfile::TempDir, Index) {
    search_server_on(Backend::Cpu)
}

/// [`search_server`] with `backend` as the server's default (`auto` and `gpu` probe the GPU).
pub(crate) fn search_server_on(backend: Backend) -> (TestServer, tempfile::TempDir, Index) {
    search_server_with(|c| c.backend = backend)
}

/// [`search_server_on`] with the server's configuration tweaked by `tweak`.
pub(crate) fn search_server_with(
    tweak: impl FnOnce(&mut Config),
) -> (TestServer, tempfile::TempDir, Index) {
    let (dir, index) = built(&fixture_corpus(), "fixture", Codec::Ef);
    let at = index.dir().to_path_buf();
    let server = server_with(|c| {
        c.index = Some(at);
        tweak(c);
    });
    for name in ["small", "medium"] {
        std::fs::copy(
            bundled_rankers().join(format!("{name}.json")),
            server.state.store().dir().join(format!("prod-{name}.json")),
        )
        .unwrap();
    }
    (server, dir, index)
}

pub(crate) fn request(query: &str, mode: Mode, k: usize) -> SearchRequest {
    SearchRequest {
        query: Some(query.into()),
        terms: None,
        k,
        candidates: 1000,
        mode,
        ranker: None,
        backend: None,
        explain: false,
        timeout_ms: None,
    }
}

pub(crate) async fn search_json(s: &TestServer, request: &SearchRequest) -> SearchResponse {
    let (status, _, body) = send(
        &s.app,
        post("/v1/search", "application/json", json(request)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// (doc, BM25) of a response's hits.
fn doc_scores(response: &SearchResponse) -> Vec<(DocId, f64)> {
    response
        .hits
        .iter()
        .map(|h| (h.doc, h.selection_score))
        .collect()
}

const QUERIES: [&str; 5] = [
    "the kitchen",
    "ranking lists",
    "of the and",
    "bread pages links",
    "Kitchen; RANKING!",
];

#[tokio::test]
async fn bm25_only_search_equals_select_search_in_json_and_msgpack() {
    let (s, _dir, index) = search_server();
    for text in QUERIES {
        for mode in [Mode::And, Mode::Or, Mode::AndOr] {
            let req = request(text, mode, 7);
            let want = search(&index, &Query::from_text(text, 7, mode))
                .unwrap()
                .hits;
            let got = search_json(&s, &req).await;
            assert_eq!(doc_scores(&got), want, "{text:?} {mode:?}");
            assert_eq!(got.backends.select, "cpu");
            assert_eq!(got.backends.rank, "none");
            for hit in &got.hits {
                assert_eq!(hit.score, Some(hit.selection_score));
                assert_eq!(hit.id, index.doc_id(hit.doc));
            }

            let (status, headers, body) = send(
                &s.app,
                post(
                    "/v1/search",
                    "application/msgpack",
                    rmp_serde::to_vec_named(&req).unwrap(),
                ),
            )
            .await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(headers[header::CONTENT_TYPE], "application/msgpack");
            let packed: SearchResponse = rmp_serde::from_slice(&body).unwrap();
            assert_eq!(packed.hits, got.hits, "{text:?} {mode:?}");
        }
    }
    // `terms` are looked up as given; the same terms as text give the same hits.
    let mut by_terms = request("", Mode::Or, 7);
    by_terms.query = None;
    by_terms.terms = Some(Tokenizer::new().tokens("the kitchen"));
    assert_eq!(
        search_json(&s, &by_terms).await.hits,
        search_json(&s, &request("the kitchen", Mode::Or, 7))
            .await
            .hits
    );
}

/// The hit documents of `docs` for `text`, built independently from the index's public API.
fn hit_request(index: &Index, text: &str, docs: &[DocId]) -> RankRequest {
    let terms = Tokenizer::new().tokens(text);
    let distinct = dedup_terms(&terms);
    let ids: Vec<_> = distinct.iter().map(|t| index.term_id(t)).collect();
    let n = index.num_docs() as u64;
    let manifest = index.manifest();
    let documents = docs
        .iter()
        .map(|&d| {
            let streams = index
                .hits(d, &ids)
                .unwrap()
                .unwrap()
                .into_iter()
                .map(|s| (s.stream, HitStream::new(s.length, s.phrases)))
                .collect();
            let statics: BTreeMap<String, f64> = manifest
                .static_features
                .iter()
                .enumerate()
                .map(|(f, name)| (name.clone(), index.static_value(d, f)))
                .filter(|(_, v)| !v.is_nan())
                .collect();
            RankDocument {
                id: None,
                features: None,
                hits: Some(HitDocument {
                    id: Some(index.doc_id(d).to_string()),
                    streams,
                    static_features: statics,
                }),
            }
        })
        .collect();
    RankRequest {
        ranker: "prod-small".into(),
        documents,
        query: Some(QueryInfo {
            terms: distinct.len() as u32,
            idf: ids
                .iter()
                .map(|id| bm25::idf(n, id.map_or(0, |id| index.term_info(id).df) as u64))
                .collect(),
        }),
        stats: Some(CorpusStats {
            avg_length: manifest
                .streams
                .iter()
                .enumerate()
                .map(|(i, s)| (s.clone(), index.avg_stream_length(i)))
                .filter(|&(_, avg)| avg > 0.0)
                .collect(),
        }),
        k: None,
        backend: None,
        explain: false,
        timeout_ms: None,
    }
}

#[tokio::test]
async fn ranked_search_scores_equal_rank_on_the_same_hit_documents() {
    let (s, _dir, index) = search_server();
    for (text, mode, candidates) in [
        ("the kitchen", Mode::Or, 40),
        ("ranking lists", Mode::AndOr, 1000),
        ("of the and", Mode::And, 25),
    ] {
        let mut req = request(text, mode, 6);
        req.ranker = Some("prod-small".into());
        req.candidates = candidates;
        req.explain = true;
        let got = search_json(&s, &req).await;
        assert_eq!(got.backends.rank, "cpu");

        // Every candidate through /v1/rank in docID order: the top 6 must be the search's hits.
        let mut selected = search(&index, &Query::from_text(text, candidates, mode))
            .unwrap()
            .hits;
        selected.sort_by_key(|&(d, _)| d);
        let docs: Vec<DocId> = selected.iter().map(|&(d, _)| d).collect();
        let mut rank = hit_request(&index, text, &docs);
        rank.k = Some(6);
        let (status, _, body) =
            send(&s.app, post("/v1/rank", "application/json", json(&rank))).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let ranked: RankResponse = serde_json::from_slice(&body).unwrap();
        let want: Vec<_> = ranked
            .order
            .unwrap()
            .into_iter()
            .map(|i| (docs[i], ranked.scores[i], selected[i].1))
            .collect();
        let have: Vec<_> = got
            .hits
            .iter()
            .map(|h| (h.doc, h.score, h.selection_score))
            .collect();
        assert_eq!(have, want, "{text:?} {mode:?}");
        assert!(have.iter().all(|h| h.1.is_some()), "{have:?}");
        assert!(have.windows(2).any(|w| w[0].1 != w[1].1), "{have:?}");
        for hit in &got.hits {
            let explained = hit.explain.as_ref().unwrap();
            assert_eq!(explained.features.len(), 121);
        }
    }
}

#[test]
fn bundled_rankers_resolve_against_feature_extraction() {
    for entry in std::fs::read_dir(bundled_rankers()).unwrap() {
        let path = entry.unwrap().path();
        let ranker = parse_native(&std::fs::read(&path).unwrap()).unwrap();
        let resolver = FeatureResolver::new(&ranker.features);
        assert!(resolver.is_ok(), "{}: {:?}", path.display(), resolver.err());
    }
}

#[tokio::test]
async fn index_without_a_forward_index_ranks_by_bm25_even_with_a_ranker() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("selection-only");
    let opts = BuildOptions {
        forward: false,
        ..BuildOptions::default()
    };
    build(&fixture_corpus(), &out, &opts, &|_| {}).unwrap();
    let index = Index::open(&out).unwrap();
    let s = server_with(|c| c.index = Some(out.clone()));
    std::fs::copy(
        bundled_rankers().join("small.json"),
        s.state.store().dir().join("small.json"),
    )
    .unwrap();
    let mut req = request("the kitchen", Mode::Or, 5);
    req.ranker = Some("small".into());
    let got = search_json(&s, &req).await;
    assert_eq!(got.backends.rank, "none");
    let want = search(&index, &Query::from_text("the kitchen", 5, Mode::Or))
        .unwrap()
        .hits;
    assert_eq!(doc_scores(&got), want);
}

#[tokio::test]
async fn inputs_that_select_nothing_answer_empty_and_mistakes_answer_4xx() {
    let (s, _dir, index) = search_server();
    let n = index.num_docs() as usize;
    let with_ranker = |mut req: SearchRequest| {
        req.ranker = Some("prod-small".into());
        req
    };
    let long_term = "x".repeat(10_000);
    let mut unknown_terms = request("", Mode::Or, 10);
    unknown_terms.query = None;
    unknown_terms.terms = Some(vec!["zzzunknown".into(), long_term.clone()]);
    let mut no_terms = request("", Mode::Or, 10);
    no_terms.query = None;
    no_terms.terms = Some(Vec::new());
    for req in [
        request("", Mode::And, 10),
        request("  ... !! ", Mode::Or, 10),
        request(&long_term, Mode::Or, 10),
        request("kitchen zzzunknown", Mode::And, 10),
        request("kitchen", Mode::Or, 0),
        unknown_terms.clone(),
        no_terms,
        with_ranker(request("", Mode::Or, 10)),
        with_ranker(unknown_terms),
    ] {
        let got = search_json(&s, &req).await;
        assert!(got.hits.is_empty(), "{req:?}: {:?}", got.hits);
    }
    // An unknown term does not empty an OR query.
    let got = search_json(&s, &request("kitchen zzzunknown", Mode::Or, 10)).await;
    assert_eq!(
        doc_scores(&got),
        search(&index, &Query::from_text("kitchen", 10, Mode::Or))
            .unwrap()
            .hits
    );
    // k above the collection: every matching document; with a ranker too.
    let everything = search(&index, &Query::from_text("the", n, Mode::Or))
        .unwrap()
        .hits;
    assert!(everything.len() > 100);
    let got = search_json(&s, &request("the", Mode::Or, 1 << 40)).await;
    assert_eq!(doc_scores(&got), everything);
    let mut ranked = request("the", Mode::Or, usize::MAX);
    ranked.ranker = Some("prod-medium".into());
    assert_eq!(search_json(&s, &ranked).await.hits.len(), everything.len());

    let bad = |body: serde_json::Value| {
        post(
            "/v1/search",
            "application/json",
            body.to_string().into_bytes(),
        )
    };
    expect_error(
        &s.app,
        bad(serde_json::json!({"query": "a", "terms": ["a"]})),
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "give `query` (text) or `terms` (a list), not both",
    )
    .await;
    expect_error(
        &s.app,
        bad(serde_json::json!({"k": 3})),
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "needs `query` (text) or `terms` (a list)",
    )
    .await;
    expect_error(
        &s.app,
        bad(serde_json::json!({"query": "a", "ranker": "nope"})),
        StatusCode::NOT_FOUND,
        "unknown_ranker",
        "no ranker named \"nope\"",
    )
    .await;
    expect_error(
        &s.app,
        bad(serde_json::json!({"query": "a", "backend": "gpu"})),
        StatusCode::SERVICE_UNAVAILABLE,
        "gpu_unavailable",
        "backend=gpu asked for, but this server has no usable GPU (see /readyz for why); use backend=auto or cpu",
    )
    .await;
    expect_error(
        &s.app,
        bad(serde_json::json!({"query": "a", "timeout_ms": 0})),
        StatusCode::GATEWAY_TIMEOUT,
        "deadline_exceeded",
        "deadline of 0 ms exceeded",
    )
    .await;
    let (status, _, body) = send(
        &s.app,
        bad(serde_json::json!({"query": "a", "mode": "xor"})),
    )
    .await;
    let error: rankserve::server::error::ErrorBody = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, error.error.code.as_str()),
        (StatusCode::BAD_REQUEST, "bad_body")
    );

    expect_error(
        &s.app,
        bad(serde_json::json!({"terms": vec!["a"; 1025]})),
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "the query has 1025 terms, at most 1024 are accepted",
    )
    .await;

    let no_index = server_with(|_| {});
    expect_error(
        &no_index.app,
        bad(serde_json::json!({"query": "a"})),
        StatusCode::SERVICE_UNAVAILABLE,
        "no_index",
        "no index is loaded: start the server with --index DIR, or POST /v1/index/reload with {\"dir\": DIR}",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_on_a_real_listener_in_msgpack() {
    let (dir, index) = built(&fixture_corpus(), "fixture", Codec::Pfor);
    let at = index.dir().to_path_buf();
    let live = live(|c| c.index = Some(at)).await;
    let req = request("ranking lists", Mode::AndOr, 5);
    let http = Request::post(format!("http://{}/v1/search", live.addr))
        .header(header::CONTENT_TYPE, "application/msgpack")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            rmp_serde::to_vec_named(&req).unwrap(),
        )))
        .unwrap();
    let response = client().request(http).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let got: SearchResponse = rmp_serde::from_slice(&body).unwrap();
    let want = search(&index, &Query::from_text("ranking lists", 5, Mode::AndOr))
        .unwrap()
        .hits;
    assert_eq!(doc_scores(&got), want);
    assert!(got.timings.total_us >= got.timings.select_us);
    let _ = live.shutdown.send(());
    live.task.await.unwrap().unwrap();
    drop(dir);
}

#[test]
fn index_build_refuses_duplicate_and_empty_ids_naming_the_lines() {
    let dir = tempfile::tempdir().unwrap();
    let build = |lines: &str| {
        let corpus = dir.path().join("c.jsonl");
        std::fs::write(&corpus, lines).unwrap();
        let out = dir.path().join("idx");
        let output = rankserve(&[
            "index",
            "build",
            "--corpus",
            corpus.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(!out.exists());
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).to_string(),
            corpus,
        )
    };
    let doc = |id: &str| format!("{{\"id\": \"{id}\", \"streams\": {{\"body\": \"a b c\"}}}}\n");
    let (code, stderr, corpus) =
        build(&[doc("a"), doc("b"), "\n".into(), doc("c"), doc("b")].concat());
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!(
            "rankserve: {}, line 5: document id \"b\" is already the id of line 2: ids must be unique",
            corpus.display()
        )
    );
    let (code, stderr, corpus) = build(&[doc("a"), doc("")].concat());
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!(
            "rankserve: {}, line 2: `id` is empty: every document needs a non-empty id of its own",
            corpus.display()
        )
    );
}
