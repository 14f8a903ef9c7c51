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

fn small_corpus(dir: &Path, words: &str) -> PathBuf {
    let path = dir.join(format!("{words}.jsonl"));
    let lines: Vec<String> = (0..3)
        .map(|i| {
            format!(
                r#"{{"id": "{words}-{i}", "streams": {{"title": "t", "body": "{words} {words} kitchen {i}"}}, "static": {{}}}}"#
            )
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

fn reload(dir: Option<&Path>, token: Option<&str>) -> Request<Body> {
    let mut builder = Request::post("/v1/index/reload");
    if let Some(token) = token {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    match dir {
        Some(dir) => builder
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::json!({ "dir": dir }).to_string()))
            .unwrap(),
        None => builder.body(Body::empty()).unwrap(),
    }
}

#[tokio::test]
async fn reload_swaps_the_index_and_a_bad_one_leaves_the_old_serving() {
    let (s, dir, _) = search_server();
    let corpus = small_corpus(dir.path(), "zebra");
    let next = dir.path().join("next");
    build(&corpus, &next, &BuildOptions::default(), &|_| {}).unwrap();
    let kitchen = request("kitchen", Mode::Or, 10);
    let before = search_json(&s, &kitchen).await;
    assert_eq!(before.hits.len(), 10);
    let held = s.state.index().unwrap();

    let (status, _, body) = send(&s.app, reload(Some(&next), Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let described: IndexDescription = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (described.dir.as_path(), described.docs),
        (next.as_path(), 3)
    );
    let after = search_json(&s, &kitchen).await;
    let ids: Vec<_> = after.hits.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| id.starts_with("zebra-")), "{ids:?}");
    // A search that took the old index before the swap still reads it.
    assert_eq!(
        search(&held, &Query::from_text("kitchen", 10, Mode::Or))
            .unwrap()
            .hits,
        doc_scores(&before)
    );

    // A corrupted copy is refused, naming the file and the check; the new index keeps serving.
    let broken = dir.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    for entry in std::fs::read_dir(&next).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), broken.join(entry.file_name())).unwrap();
    }
    let docs = broken.join("docs.bin");
    let mut bytes = std::fs::read(&docs).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&docs, bytes).unwrap();
    let (status, _, body) = send(&s.app, reload(Some(&broken), Some(TOKEN))).await;
    let error: rankserve::server::error::ErrorBody = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, error.error.code.as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "bad_index")
    );
    let prefix = format!(
        "index {} was not loaded, the index being served is unchanged: index file {} is corrupt: ",
        broken.display(),
        docs.display()
    );
    assert!(
        error.error.message.starts_with(&prefix),
        "{}",
        error.error.message
    );
    let missing = dir.path().join("nowhere");
    let (status, _, _) = send(&s.app, reload(Some(&missing), Some(TOKEN))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(search_json(&s, &kitchen).await.hits, after.hits);

    // An empty body re-opens the directory being served.
    let (status, _, body) = send(&s.app, reload(None, Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(search_json(&s, &kitchen).await.hits, after.hits);
}

#[tokio::test]
async fn reload_needs_the_admin_token() {
    let (s, _dir, index) = search_server();
    let at = index.dir();
    let message = "admin route needs `Authorization: Bearer TOKEN` with the configured token";
    expect_error(
        &s.app,
        reload(Some(at), None),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        message,
    )
    .await;
    expect_error(
        &s.app,
        reload(Some(at), Some("wrong")),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        message,
    )
    .await;
    let open = server_with(|c| c.admin_token = None);
    expect_error(
        &open.app,
        reload(Some(at), Some(TOKEN)),
        StatusCode::FORBIDDEN,
        "admin_disabled",
        "admin routes are disabled: no admin token is configured (admin_token / RANKSERVE_ADMIN_TOKEN)",
    )
    .await;
    // Without an index served or configured, a reload must name its directory.
    let bare = server_with(|_| {});
    expect_error(
        &bare.app,
        reload(None, Some(TOKEN)),
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "no index directory: give `dir` (no index is configured or served)",
    )
    .await;
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

/// The scoring stream of `index` as a CIFF file: lists in sorted term order (terms that occur
/// only in other streams have no list), docID gaps, scoring lengths as document lengths.
fn export_ciff(index: &Index) -> Vec<u8> {
    use prost::Message;
    use rankserve::index::ciff::{DocRecord, Header, Posting, PostingsList};
    use rankserve::index::TERMINATED;
    let mut lists = Vec::new();
    for i in 0..index.num_terms() as usize {
        let (term, id) = index.term_at(i);
        let mut cursor = index.postings(id).cursor();
        let (mut postings, mut previous) = (Vec::new(), 0);
        while cursor.doc() != TERMINATED {
            postings.push(Posting {
                docid: (cursor.doc() - previous) as i32,
                tf: cursor.tf() as i32,
            });
            previous = cursor.doc();
            cursor.advance();
        }
        if !postings.is_empty() {
            lists.push(PostingsList {
                term: term.to_string(),
                df: postings.len() as i64,
                cf: postings.iter().map(|p| p.tf as i64).sum(),
                postings,
            });
        }
    }
    let n = index.num_docs();
    let mut out = Vec::new();
    Header {
        version: 1,
        num_postings_lists: lists.len() as i32,
        num_doc_records: n as i32,
        total_postings_lists: lists.len() as i32,
        total_docs: n as i32,
        total_terms_in_collection: index.manifest().total_scoring_length as i64,
        average_doclength: index.avg_scoring_length(),
        description: "exported by tests/search.rs".into(),
    }
    .encode_length_delimited(&mut out)
    .unwrap();
    for list in lists {
        list.encode_length_delimited(&mut out).unwrap();
    }
    for d in 0..n {
        DocRecord {
            docid: d as i32,
            collection_docid: index.doc_id(d).to_string(),
            doclength: index.scoring_length(d) as i32,
        }
        .encode_length_delimited(&mut out)
        .unwrap();
    }
    out
}

#[tokio::test]
async fn ciff_import_serves_the_same_bm25_results_as_the_index_it_came_from() {
    let (dir, original) = built(&fixture_corpus(), "fixture", Codec::Ef);
    let file = dir.path().join("fixture.ciff");
    std::fs::write(&file, export_ciff(&original)).unwrap();
    let imported = dir.path().join("imported");
    let output = rankserve(&[
        "index",
        "import-ciff",
        file.to_str().unwrap(),
        "--out",
        imported.to_str().unwrap(),
        "--codec",
        "pfor",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let s = server_with(|c| c.index = Some(imported.clone()));
    for text in QUERIES {
        for mode in [Mode::And, Mode::Or, Mode::AndOr] {
            let mut req = request(text, mode, 8);
            req.ranker = Some("small".into());
            let got = search_json(&s, &req).await;
            assert_eq!(got.backends.rank, "none");
            let want = search(&original, &Query::from_text(text, 8, mode))
                .unwrap()
                .hits;
            assert_eq!(doc_scores(&got), want, "{text:?} {mode:?}");
            for hit in &got.hits {
                assert_eq!(hit.id, original.doc_id(hit.doc));
            }
        }
    }

    // A truncated file is refused with exit 2, naming the file and the message, and no index.
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let refused = dir.path().join("refused");
    let output = rankserve(&[
        "index",
        "import-ciff",
        file.to_str().unwrap(),
        "--out",
        refused.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "rankserve: CIFF file {}: postings list ",
            file.display()
        )),
        "{stderr}"
    );
    assert!(!refused.exists());
}

/// Starts `rankserve serve` with `args` (from the repository root, so `rankers/` and
/// `fixtures/` are there) and returns it with its listening address and the log lines up to
/// the `listening` one; the rest of its log is drained in the background.
fn start_serve(args: &[&str]) -> (std::process::Child, std::net::SocketAddr, Vec<String>) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rankserve"))
        .arg("serve")
        .args(args)
        .current_dir(root())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (lines, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = lines.send(without_ansi(&line));
        }
    });
    let mut seen = Vec::new();
    while let Ok(line) = receive.recv_timeout(std::time::Duration::from_secs(60)) {
        let addr = line.contains(" listening ").then(|| {
            line.split_once("addr=")
                .unwrap()
                .1
                .split(' ')
                .next()
                .unwrap()
                .parse()
        });
        seen.push(line);
        if let Some(addr) = addr {
            std::thread::spawn(move || receive.into_iter().for_each(drop));
            return (child, addr.unwrap(), seen);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("serve did not start listening: {seen:#?}");
}

/// `line` without terminal colour sequences (`ESC [ ... m`).
fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

/// One HTTP/1.1 JSON POST over a plain socket; returns the status line and the body.
fn post_json(addr: std::net::SocketAddr, path: &str, body: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

#[test]
fn serve_with_no_index_builds_the_demo_index_once_and_ranks_with_the_bundled_rankers() {
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap();
    for (start, expected) in [(1, "demo index built"), (2, "demo index reused")] {
        let (mut child, addr, log) =
            start_serve(&["--addr", "127.0.0.1:0", "--data-dir", data_dir]);
        assert!(
            log.iter().any(|l| l.contains(expected)),
            "start {start}: {log:#?}"
        );
        for ranker in ["small", "medium", "large"] {
            let (status, body) = post_json(
                addr,
                "/v1/search",
                &format!(
                    r#"{{"query": "kitchen ranking", "mode": "or", "k": 3, "ranker": "{ranker}"}}"#
                ),
            );
            assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
            let reply: SearchResponse = serde_json::from_str(&body).unwrap();
            assert_eq!(reply.hits.len(), 3);
            // `auto`: the GPU, where there is one and the batch is past the crossover.
            assert!(["cpu", "gpu"].contains(&reply.backends.rank.as_str()));
            assert!(
                reply.hits.iter().all(|h| h.score.is_some()),
                "{ranker}: {body}"
            );
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert!(data.path().join("index/index.json").exists());
}

/// POSTs JSON `body` to `path` on a live server, with the admin token.
async fn post_live_json(
    client: &crate::live::Client,
    addr: std::net::SocketAddr,
    path: &str,
    body: &impl serde::Serialize,
) -> (StatusCode, Vec<u8>) {
    let request = Request::post(format!("http://{addr}{path}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(http_body_util::Full::new(bytes::Bytes::from(json(body))))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn searches_racing_reloads_each_see_one_whole_index() {
    let (dir, first) = built(&fixture_corpus(), "first", Codec::Ef);
    let second_dir = dir.path().join("second");
    build(
        &small_corpus(dir.path(), "kitchen"),
        &second_dir,
        &BuildOptions::default(),
        &|_| {},
    )
    .unwrap();
    let second = Index::open(&second_dir).unwrap();
    let query = request("kitchen", Mode::Or, 5);
    let expected = [&first, &second].map(|index| {
        search(index, &Query::from_text("kitchen", 5, Mode::Or))
            .unwrap()
            .hits
    });
    assert_ne!(expected[0], expected[1]);
    let dirs = [first.dir().to_path_buf(), second_dir.clone()];
    let live = live(|c| c.index = Some(dirs[0].clone())).await;
    let addr = live.addr;

    let searchers: Vec<_> = (0..4)
        .map(|_| {
            let (query, expected) = (query.clone(), expected.clone());
            tokio::spawn(async move {
                let client = client();
                let mut seen = [0usize; 2];
                for _ in 0..40 {
                    let (status, body) = post_live_json(&client, addr, "/v1/search", &query).await;
                    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
                    let reply: SearchResponse = serde_json::from_slice(&body).unwrap();
                    let got = doc_scores(&reply);
                    let which = expected.iter().position(|e| *e == got);
                    seen[which.expect("a result from one whole index")] += 1;
                }
                seen
            })
        })
        .collect();
    let reloader = client();
    for round in 0..20 {
        let target = serde_json::json!({ "dir": dirs[(round + 1) % 2] });
        let (status, body) = post_live_json(&reloader, addr, "/v1/index/reload", &target).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    let mut seen = [0usize; 2];
    for searcher in searchers {
        let s = searcher.await.unwrap();
        seen = [seen[0] + s[0], seen[1] + s[1]];
    }
    assert_eq!(seen[0] + seen[1], 160);
    let _ = live.shutdown.send(());
    live.task.await.unwrap().unwrap();
}

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
