//! `/v1/rank` through `oneshot` on `server::router(state)`: ranking from JSON and MessagePack,
//! feature vectors, named features and hit documents alike, and the ops routes; and what the
//! other HTTP test modules share (a test ranker, a [`TestServer`], requests and checks).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use rand::{Rng, SeedableRng};
use tower::ServiceExt;

use rankserve::api::{FeatureValues, RankDocument, RankRequest, RankResponse, RankerDescription};
use rankserve::backend::Backend;
use rankserve::config::Config;
use rankserve::rank::cpu::score_batch;
use rankserve::rank::fe::{
    feature_names, synth_corpus_stats, synth_hit_documents, synth_query, FeatureResolver,
};
use rankserve::rank::format::{to_native_json, validate};
use rankserve::rank::model::{
    Activation, Decision, Ensemble, Input, Layer, Missing, Node, Ranker, Split, Tree,
};
use rankserve::server::error::ErrorBody;
use rankserve::server::{router, AppState, State};

pub(crate) const TOKEN: &str = "test-token";

fn split(feature: u32, threshold: f64, left: u32, right: u32) -> Node {
    Node::Split(Split {
        feature,
        decision: Decision::LeF64(threshold),
        missing: Missing::Nan,
        default_left: true,
        left,
        right,
    })
}

/// A small ranker over the first four FE catalogue features (so hit documents work too):
/// every input type but FreeForm, one tanh layer, and a two-tree ensemble scaled by `bias`.
pub(crate) fn test_ranker(bias: f64) -> Ranker {
    let features: Vec<String> = feature_names()[..4].to_vec();
    let tree = Tree {
        nodes: vec![split(3, 0.5, 1, 2), Node::Leaf(-0.25), Node::Leaf(0.75)],
    };
    let ranker = Ranker {
        features,
        inputs: vec![
            Input::Linear {
                feature: 0,
                slope: 0.5,
                intercept: 0.1,
            },
            Input::LogLinear {
                feature: 1,
                slope: 0.3,
                intercept: 0.0,
            },
            Input::Bucket {
                feature: 2,
                lower: 0.0,
                upper: 2.0,
            },
            Input::Tree(tree.clone()),
        ],
        layers: vec![Layer {
            inputs: 4,
            outputs: 1,
            weights: vec![0.4, -0.2, 0.3, 0.9],
            bias: vec![0.05],
            activation: Activation::Tanh,
        }],
        ensemble: Some(Ensemble {
            trees: vec![
                tree,
                Tree {
                    nodes: vec![split(0, 1.5, 1, 2), Node::Leaf(bias), Node::Leaf(-bias)],
                },
            ],
            base_score: 0.5,
        }),
    };
    validate(&ranker).expect("test ranker is valid");
    ranker
}

pub(crate) struct TestServer {
    pub(crate) state: AppState,
    pub(crate) app: Router,
    _dir: tempfile::TempDir,
}

pub(crate) fn server_with(tweak: impl FnOnce(&mut Config)) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("small.json"),
        to_native_json(&test_ranker(0.125)),
    )
    .unwrap();
    let mut config = Config {
        rankers: dir.path().to_path_buf(),
        admin_token: Some(TOKEN.into()),
        ..Config::default()
    };
    config.cpu_threads = Some(2);
    // Bit-exact comparisons with the CPU reference: GPU tests opt in to `auto` or `gpu`.
    config.backend = Backend::Cpu;
    tweak(&mut config);
    let state = State::new(config).unwrap();
    state.warm_up();
    let app = router(Arc::clone(&state));
    TestServer {
        state,
        app,
        _dir: dir,
    }
}

pub(crate) fn server() -> TestServer {
    server_with(|_| {})
}

pub(crate) fn random_features(n_docs: usize, width: usize, seed: u64) -> Vec<f64> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n_docs * width)
        .map(|i| {
            if i % 17 == 5 {
                f64::NAN
            } else {
                rng.random_range(-1.0..3.0)
            }
        })
        .collect()
}

pub(crate) fn rank_request(ranker: &str, features: &[f64], width: usize) -> RankRequest {
    RankRequest {
        ranker: ranker.into(),
        documents: features
            .chunks(width)
            .enumerate()
            .map(|(i, row)| RankDocument {
                id: Some(format!("d{i}")),
                features: Some(FeatureValues::Vector(
                    row.iter().map(|&v| (!v.is_nan()).then_some(v)).collect(),
                )),
                hits: None,
            })
            .collect(),
        query: None,
        stats: None,
        k: None,
        backend: None,
        explain: false,
        timeout_ms: None,
    }
}

pub(crate) fn post(uri: &str, content_type: &str, body: Vec<u8>) -> Request<Body> {
    Request::post(uri)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap()
}

pub(crate) fn json(request: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(request).unwrap()
}

pub(crate) async fn send(
    app: &Router,
    request: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, headers, bytes)
}

/// Sends `request` and checks the error status, code and exact message (JSON body).
pub(crate) async fn expect_error(
    app: &Router,
    request: Request<Body>,
    status: StatusCode,
    code: &str,
    message: &str,
) {
    let (got, _, body) = send(app, request).await;
    let body: ErrorBody = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!(
            "error body is not JSON ({e}): {}",
            String::from_utf8_lossy(&body)
        )
    });
    assert_eq!(
        (got, body.error.code.as_str(), body.error.message.as_str()),
        (status, code, message)
    );
}

pub(crate) fn expected_scores(ranker: &Ranker, features: &[f64]) -> Vec<Option<f64>> {
    score_batch(ranker, features, 1)
        .into_iter()
        .map(|s| (!s.is_nan()).then_some(s))
        .collect()
}

#[tokio::test]
async fn rank_in_json_and_msgpack_equals_score_batch() {
    let s = server();
    let features = random_features(50, 4, 7);
    let mut request = rank_request("small", &features, 4);
    request.k = Some(5);
    request.explain = true;
    let want = expected_scores(&test_ranker(0.125), &features);

    let (status, headers, body) =
        send(&s.app, post("/v1/rank", "application/json", json(&request))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    let reply: RankResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(reply.scores, want);
    assert_eq!(reply.backend, "cpu");
    let order = reply.order.unwrap();
    assert_eq!(order.len(), 5);
    let key = |i: usize| want[i].unwrap_or(f64::NEG_INFINITY);
    assert!(order
        .windows(2)
        .all(|w| key(w[0]) > key(w[1]) || (key(w[0]) == key(w[1]) && w[0] < w[1])));
    let explain = reply.explain.unwrap();
    assert_eq!(explain.len(), 50);
    assert_eq!(explain[1].features.len(), 4);
    assert_eq!(explain[1].inputs.len(), 4);

    for content_type in [
        "application/msgpack",
        "application/x-msgpack",
        "application/vnd.msgpack",
    ] {
        let body = rmp_serde::to_vec_named(&request).unwrap();
        let (status, headers, body) = send(&s.app, post("/v1/rank", content_type, body)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], "application/msgpack");
        let reply: RankResponse = rmp_serde::from_slice(&body).unwrap();
        assert_eq!(reply.scores, want);
    }

    // Accept wins over the request's own type.
    let request = Request::post("/v1/rank")
        .header(header::CONTENT_TYPE, "application/msgpack")
        .header(header::ACCEPT, "application/json")
        .body(Body::from(
            rmp_serde::to_vec_named(&rank_request("small", &features, 4)).unwrap(),
        ))
        .unwrap();
    let (status, headers, body) = send(&s.app, request).await;
    assert_eq!(
        (status, &headers[header::CONTENT_TYPE]),
        (StatusCode::OK, &"application/json".parse().unwrap())
    );
    assert_eq!(
        serde_json::from_slice::<RankResponse>(&body)
            .unwrap()
            .scores,
        want
    );
}

#[tokio::test]
async fn named_features_and_hit_documents_rank_like_their_vectors() {
    let s = server();
    let ranker = test_ranker(0.125);
    // By name: absent names are missing.
    let named = serde_json::json!({"ranker": "small", "documents": [
        {"features": {ranker.features[0].clone(): 2.0, ranker.features[3].clone(): 1.0}}]});
    let (status, _, body) = send(&s.app, post("/v1/rank", "application/json", json(&named))).await;
    assert_eq!(status, StatusCode::OK);
    let reply: RankResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        reply.scores,
        expected_scores(&ranker, &[2.0, f64::NAN, f64::NAN, 1.0])
    );

    // Hits: the server's feature extraction equals the resolver's.
    let docs = synth_hit_documents(20, 3, 11);
    let (query, stats) = (synth_query(3, 11), synth_corpus_stats());
    let resolver = FeatureResolver::new(&ranker.features).unwrap();
    let mut features = vec![0.0; 20 * 4];
    resolver
        .extract_batch(&query, &stats, &docs, &mut features, 1)
        .unwrap();
    let request = RankRequest {
        ranker: "small".into(),
        documents: docs
            .into_iter()
            .map(|h| RankDocument {
                id: None,
                features: None,
                hits: Some(h),
            })
            .collect(),
        query: Some(query),
        stats: Some(stats),
        ..rank_request("small", &[], 4)
    };
    let body = rmp_serde::to_vec_named(&request).unwrap();
    let (status, _, body) = send(&s.app, post("/v1/rank", "application/msgpack", body)).await;
    assert_eq!(status, StatusCode::OK);
    let reply: RankResponse = rmp_serde::from_slice(&body).unwrap();
    assert_eq!(reply.scores, expected_scores(&ranker, &features));
}

/// A MessagePack body's fields after `documents` are read from its end before the documents are
/// framed; where the last field's bytes read like request fields (here the stats' stream `k`),
/// the request is still ranked by its own fields: the same reply as the JSON request, no `order`.
#[tokio::test]
async fn msgpack_fields_misread_from_the_end_are_read_again() {
    let s = server();
    // {ranker: "small", documents: [[1, 2, 3, 4], [4, 3, 2, 1]], stats: {avg_length: {k: 1}}}
    let msgpack: &[u8] = b"\x83\xa6ranker\xa5small\xa9documents\x92\
        \x81\xa8features\x94\x01\x02\x03\x04\x81\xa8features\x94\x04\x03\x02\x01\
        \xa5stats\x81\xaaavg_length\x81\xa1k\x01";
    let same = serde_json::json!({"ranker": "small", "stats": {"avg_length": {"k": 1}},
        "documents": [{"features": [1, 2, 3, 4]}, {"features": [4, 3, 2, 1]}]});
    let mut replies = Vec::new();
    for (content_type, body) in [
        ("application/msgpack", msgpack.to_vec()),
        ("application/json", json(&same)),
    ] {
        let (status, _, reply) = send(&s.app, post("/v1/rank", content_type, body)).await;
        assert_eq!(status, StatusCode::OK, "{content_type}");
        let reply: RankResponse = rmp_serde::from_slice(&reply)
            .or_else(|_| serde_json::from_slice(&reply).map_err(|e| e.to_string()))
            .unwrap();
        replies.push((reply.scores, reply.order));
    }
    assert_eq!(replies[0], replies[1]);
    assert_eq!(replies[0].1, None);
}

#[tokio::test]
async fn ops_routes_describe_list_ready_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("small.json"),
        to_native_json(&test_ranker(0.125)),
    )
    .unwrap();
    let state = State::new(Config {
        rankers: dir.path().to_path_buf(),
        backend: Backend::Cpu,
        ..Config::default()
    })
    .unwrap();
    let app = router(Arc::clone(&state));
    let get = |uri: &str| Request::get(uri).body(Body::empty()).unwrap();
    assert_eq!(
        send(&app, get("/readyz")).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(send(&app, get("/healthz")).await.0, StatusCode::OK);
    state.warm_up();
    let (status, _, body) = send(&app, get("/readyz")).await;
    assert_eq!(status, StatusCode::OK);
    let ready: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        ready,
        serde_json::json!({"ready": true, "rankers_loaded": 1, "gpu": "not probed: the configured backend is cpu"})
    );

    let (_, _, body) = send(&app, get("/v1/rankers")).await;
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(list["rankers"][0]["name"], "small");
    let (_, _, body) = send(&app, get("/v1/rankers/small")).await;
    let description: RankerDescription = serde_json::from_slice(&body).unwrap();
    assert_eq!(description.features, test_ranker(0.125).features);
    assert_eq!(description.inputs.get("tree"), Some(&1));
    assert_eq!(description.layers.len(), 1);
    assert_eq!(description.crossover, None);

    send(
        &app,
        post(
            "/v1/rank",
            "application/json",
            json(&rank_request("small", &random_features(3, 4, 2), 4)),
        ),
    )
    .await;
    let (status, _, body) = send(&app, get("/metrics")).await;
    let text = String::from_utf8(body).unwrap();
    assert_eq!(status, StatusCode::OK);
    for name in [
        "rankserve_http_requests_total",
        "rankserve_http_request_duration_seconds_bucket",
        "rankserve_rank_duration_seconds_bucket",
        "rankserve_documents_ranked_total",
        "rankserve_backend_total",
        "rankserve_batch_documents_bucket",
        "rankserve_ranker_cache_hits_total",
        "rankserve_gpu_fallback_total",
        // Gauges of the selection's queues (no index here: nothing queued).
        "rankserve_select_gpu_queued_microseconds",
        "rankserve_select_cpu_running",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
}
