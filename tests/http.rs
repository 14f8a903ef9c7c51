//! The HTTP service: routes through `oneshot` on `server::router(state)`, and real servers on
//! `127.0.0.1:0` for concurrency, overload and graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

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
    config.cpu_threads = 2;
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

fn server() -> TestServer {
    server_with(|_| {})
}

fn random_features(n_docs: usize, width: usize, seed: u64) -> Vec<f64> {
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

fn rank_request(ranker: &str, features: &[f64], width: usize) -> RankRequest {
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

fn expected_scores(ranker: &Ranker, features: &[f64]) -> Vec<Option<f64>> {
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

/// MessagePack bodies (their documents decoded during feature extraction) get the statuses and
/// messages JSON bodies get; a body whose documents do not decode is a 400 `bad_body` even
/// where the request would fail later for another reason.
#[tokio::test]
async fn msgpack_bodies_get_the_errors_json_bodies_get() {
    let s = server();
    let answer = |content_type: &str, body: Vec<u8>| {
        let request = Request::post("/v1/rank")
            .header(header::CONTENT_TYPE, content_type)
            .header(header::ACCEPT, "application/json")
            .body(Body::from(body))
            .unwrap();
        let app = s.app.clone();
        async move {
            let (status, _, body) = send(&app, request).await;
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            )
        }
    };
    let mut gpu = serde_json::json!({"ranker": "small", "backend": "gpu", "documents": [{"features": [1, 2, 3, 4]}]});
    let expired = serde_json::json!({"ranker": "small", "timeout_ms": 0, "documents": [{"features": [1, 2, 3, 4]}]});
    let cases = [
        serde_json::json!({"ranker": "small", "documents": [{"features": [1, 2, 3, 4]}, {"features": [1, 2, 3]}]}),
        serde_json::json!({"ranker": "small", "documents": [{"features": {"no.such": 1.0}}]}),
        serde_json::json!({"ranker": "small", "documents": [{"features": [1, 2, 3, 4], "hits": {}}]}),
        serde_json::json!({"ranker": "small", "documents": [{"id": "x"}]}),
        serde_json::json!({"ranker": "small", "query": {"terms": 2, "idf": [1.0, 2.0]},
            "stats": {"avg_length": {"body": 100.0}},
            "documents": [{"features": [1, 2, 3, 4]}, {"hits": {"streams": {"body": {"length": 10, "phrases": [[[0, 1], [5, 2]]]}}}}]}),
        serde_json::json!({"ranker": "small", "documents": [{"hits": {}}]}),
        serde_json::json!({"ranker": "nope", "documents": []}),
        gpu.clone(),
        expired.clone(),
    ];
    for case in &cases {
        let want = answer("application/json", json(case)).await;
        assert!(
            want.0.is_client_error() || want.0.is_server_error(),
            "{case}"
        );
        let got = answer(
            "application/msgpack",
            rmp_serde::to_vec_named(case).unwrap(),
        )
        .await;
        assert_eq!(got, want, "{case}");
    }

    // A document that does not decode, in requests that would also fail after decoding. (Not
    // with a passed deadline: that is answered 504 before the documents are read.)
    let unknown_field = serde_json::json!({"features": [1, 2, 3, 4], "zzz": 1});
    gpu["documents"][0] = unknown_field.clone();
    let nope = serde_json::json!({"ranker": "nope", "documents": [unknown_field.clone()]});
    let small = serde_json::json!({"ranker": "small", "documents": [unknown_field]});
    for case in [gpu, nope, small] {
        let (status, body) = answer(
            "application/msgpack",
            rmp_serde::to_vec_named(&case).unwrap(),
        )
        .await;
        assert_eq!(
            (status, &body["error"]["code"]),
            (StatusCode::BAD_REQUEST, &serde_json::json!("bad_body")),
            "{case}"
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(
                "MessagePack body does not parse: documents[0].zzz: unknown field `zzz`"
            ),
            "{message}"
        );
    }
}

#[tokio::test]
async fn every_client_error_status_with_its_body() {
    let s = server_with(|c| c.body_limit_bytes = 4096);
    let ok = json(&rank_request("small", &random_features(2, 4, 1), 4));

    expect_error(
        &s.app,
        post("/v1/rank", "text/plain", ok.clone()),
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        "unsupported Content-Type \"text/plain\": expected application/json or application/msgpack (also application/x-msgpack, application/vnd.msgpack)",
    )
    .await;

    // Announced as 1 GB: refused on the header, before any body is read.
    let huge = Request::post("/v1/rank")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, "1000000000")
        .body(Body::from(ok.clone()))
        .unwrap();
    expect_error(
        &s.app,
        huge,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "request body of 1000000000 bytes is over the limit of 4096 bytes",
    )
    .await;
    // Not announced (chunked): refused while reading.
    let stream = futures_body(vec![b' '; 5000]);
    let chunked = Request::post("/v1/rank")
        .header(header::CONTENT_TYPE, "application/json")
        .body(stream)
        .unwrap();
    expect_error(
        &s.app,
        chunked,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "request body of more than 4096 bytes is over the limit of 4096 bytes",
    )
    .await;

    expect_error(
        &s.app,
        post("/v1/rank", "application/json", b"{\"ranker\": \"small\",\n \"documents\": [1,]}".to_vec()),
        StatusCode::BAD_REQUEST,
        "bad_body",
        "JSON body does not parse: documents[0]: invalid type: integer `1`, expected struct RankDocument at line 2 column 16",
    )
    .await;

    let short = serde_json::json!({"ranker": "small", "documents": [{"features": [1, 2, 3, 4]}, {"features": [1, 2, 3]}]});
    expect_error(
        &s.app,
        post("/v1/rank", "application/json", json(&short)),
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "documents[1].features: expected 4 values (ranker \"small\"'s features), got 3",
    )
    .await;

    let unknown =
        serde_json::json!({"ranker": "small", "documents": [{"features": {"no.such": 1.0}}]});
    expect_error(
        &s.app,
        post("/v1/rank", "application/json", json(&unknown)),
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "documents[0].features.no.such: unknown feature: ranker \"small\" has no feature \"no.such\"",
    )
    .await;

    let bad_hit = serde_json::json!({"ranker": "small", "query": {"terms": 2, "idf": [1.0, 2.0]},
        "stats": {"avg_length": {"body": 100.0}},
        "documents": [{"features": [1, 2, 3, 4]}, {"hits": {"streams": {"body": {"length": 10, "phrases": [[[0, 1], [5, 2]]]}}}}]});
    let (status, _, body) =
        send(&s.app, post("/v1/rank", "application/json", json(&bad_hit))).await;
    let body: ErrorBody = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, body.error.code.as_str()),
        (StatusCode::BAD_REQUEST, "invalid_request")
    );
    assert!(
        body.error
            .message
            .starts_with("documents[1].hits: document 1, streams.body.phrases[0][1]: term index 5"),
        "{}",
        body.error.message
    );

    expect_error(
        &s.app,
        post(
            "/v1/rank",
            "application/json",
            json(&rank_request("nope", &[], 4)),
        ),
        StatusCode::NOT_FOUND,
        "unknown_ranker",
        "no ranker named \"nope\"",
    )
    .await;

    let mut gpu = rank_request("small", &random_features(1, 4, 1), 4);
    gpu.backend = Some(Backend::Gpu);
    expect_error(
        &s.app,
        post("/v1/rank", "application/json", json(&gpu)),
        StatusCode::SERVICE_UNAVAILABLE,
        "gpu_unavailable",
        "backend=gpu asked for, but this server has no usable GPU (see /readyz for why); use backend=auto or cpu",
    )
    .await;

    let mut expired = rank_request("small", &random_features(3, 4, 1), 4);
    expired.timeout_ms = Some(0);
    expect_error(
        &s.app,
        post("/v1/rank", "application/json", json(&expired)),
        StatusCode::GATEWAY_TIMEOUT,
        "deadline_exceeded",
        "deadline of 0 ms exceeded",
    )
    .await;

    let put = |auth: Option<&str>| {
        let mut builder = Request::put("/v1/rankers/other");
        if let Some(auth) = auth {
            builder = builder.header(header::AUTHORIZATION, auth);
        }
        builder
            .body(Body::from(to_native_json(&test_ranker(1.0))))
            .unwrap()
    };
    let unauthorized = "admin route needs `Authorization: Bearer TOKEN` with the configured token";
    expect_error(
        &s.app,
        put(None),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        unauthorized,
    )
    .await;
    expect_error(
        &s.app,
        put(Some("Bearer wrong")),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        unauthorized,
    )
    .await;
    let disabled = server_with(|c| c.admin_token = None);
    expect_error(
        &disabled.app,
        put(Some("Bearer test-token")),
        StatusCode::FORBIDDEN,
        "admin_disabled",
        "admin routes are disabled: no admin token is configured (admin_token / RANKSERVE_ADMIN_TOKEN)",
    )
    .await;

    expect_error(
        &s.app,
        Request::get("/v2/nothing").body(Body::empty()).unwrap(),
        StatusCode::NOT_FOUND,
        "not_found",
        "no route for GET /v2/nothing",
    )
    .await;
}

/// A body without Content-Length, sent in 1000-byte chunks.
fn futures_body(bytes: Vec<u8>) -> Body {
    struct Chunks(Vec<bytes::Bytes>);
    impl hyper::body::Body for Chunks {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>>
        {
            std::task::Poll::Ready(
                self.0
                    .pop()
                    .map(|chunk| Ok(hyper::body::Frame::data(chunk))),
            )
        }
    }
    Body::new(Chunks(
        bytes
            .chunks(1000)
            .rev()
            .map(bytes::Bytes::copy_from_slice)
            .collect(),
    ))
}

#[tokio::test]
async fn errors_follow_the_negotiated_format_and_request_ids_are_echoed() {
    let s = server();
    let request = Request::post("/v1/rank")
        .header(header::CONTENT_TYPE, "application/msgpack")
        .header("x-request-id", "abc-123")
        .body(Body::from(
            rmp_serde::to_vec_named(&rank_request("nope", &[], 4)).unwrap(),
        ))
        .unwrap();
    let (status, headers, body) = send(&s.app, request).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(headers["x-request-id"], "abc-123");
    assert_eq!(headers[header::CONTENT_TYPE], "application/msgpack");
    let body: ErrorBody = rmp_serde::from_slice(&body).unwrap();
    assert_eq!(body.error.code, "unknown_ranker");
    // Generated when absent.
    let (_, headers, _) = send(
        &s.app,
        Request::get("/healthz").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(headers["x-request-id"].len(), 36);
}

#[tokio::test]
async fn bad_upload_leaves_the_old_ranker_serving_and_good_upload_replaces_it() {
    let s = server();
    let features = random_features(10, 4, 3);
    let rank = || {
        post(
            "/v1/rank",
            "application/json",
            json(&rank_request("small", &features, 4)),
        )
    };
    let before: RankResponse = serde_json::from_slice(&send(&s.app, rank()).await.2).unwrap();
    let file = s.state.store().dir().join("small.json");
    let on_disk = std::fs::read(&file).unwrap();

    let put = |body: String| {
        Request::put("/v1/rankers/small")
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Body::from(body))
            .unwrap()
    };
    let mut broken = test_ranker(0.125);
    broken.layers[0].bias = vec![0.0, 1.0]; // two biases for one output
    let (status, _, body) = send(&s.app, put(to_native_json(&broken))).await;
    let body: ErrorBody = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, body.error.code.as_str()),
        (StatusCode::BAD_REQUEST, "bad_ranker")
    );
    assert!(
        body.error
            .message
            .starts_with("ranker \"small\" is invalid: "),
        "{}",
        body.error.message
    );
    let (status, _, body) = send(&s.app, put("{\"format\": \"rankserve-ranker\", ".into())).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&body)
    );

    assert_eq!(std::fs::read(&file).unwrap(), on_disk);
    let after: RankResponse = serde_json::from_slice(&send(&s.app, rank()).await.2).unwrap();
    assert_eq!(after.scores, before.scores);
    let leftovers: Vec<_> = std::fs::read_dir(s.state.store().dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");

    // A good upload swaps in at once.
    let replacement = test_ranker(2.0);
    let (status, _, body) = send(&s.app, put(to_native_json(&replacement))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let description: RankerDescription = serde_json::from_slice(&body).unwrap();
    assert_eq!(description.features, replacement.features);
    assert_eq!(description.trees, 2);
    assert_eq!(description.resident, ["cpu"]);
    let replaced: RankResponse = serde_json::from_slice(&send(&s.app, rank()).await.2).unwrap();
    assert_eq!(replaced.scores, expected_scores(&replacement, &features));
    assert_ne!(replaced.scores, before.scores);

    // Delete, then it is gone.
    let delete = Request::delete("/v1/rankers/small")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&s.app, delete).await.0, StatusCode::NO_CONTENT);
    assert_eq!(send(&s.app, rank()).await.0, StatusCode::NOT_FOUND);
}

/// Uploads `body` over ranker `small` and expects 400 `bad_ranker` saying `reason`; then that the
/// server still answers and `small` is unchanged, on disk and in its scores.
async fn upload_is_refused_and_changes_nothing(s: &TestServer, body: Vec<u8>, reason: &str) {
    let features = random_features(10, 4, 3);
    let rank = || {
        post(
            "/v1/rank",
            "application/json",
            json(&rank_request("small", &features, 4)),
        )
    };
    let before: RankResponse = serde_json::from_slice(&send(&s.app, rank()).await.2).unwrap();
    let file = s.state.store().dir().join("small.json");
    let on_disk = std::fs::read(&file).unwrap();
    let put = Request::put("/v1/rankers/small")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::from(body))
        .unwrap();
    expect_error(
        &s.app,
        put,
        StatusCode::BAD_REQUEST,
        "bad_ranker",
        &format!("ranker \"small\" is invalid: {reason}"),
    )
    .await;
    let healthz = Request::get("/healthz").body(Body::empty()).unwrap();
    assert_eq!(send(&s.app, healthz).await.0, StatusCode::OK);
    assert_eq!(std::fs::read(&file).unwrap(), on_disk);
    let (status, _, body) = send(&s.app, rank()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let after: RankResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(after.scores, before.scores);
}

/// `small`'s file with a fifth input, the FreeForm `expr` (weighted 0 by the layer).
fn with_freeform(expr: &str) -> Vec<u8> {
    let mut file: serde_json::Value =
        serde_json::from_str(&to_native_json(&test_ranker(0.125))).unwrap();
    file["inputs"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"type": "freeform", "expr": expr}));
    file["layers"][0]["weights"][0]
        .as_array_mut()
        .unwrap()
        .push(0.0.into());
    serde_json::to_vec(&file).unwrap()
}

const TOO_DEEP: &str = "the expression nests more than 128 levels deep (each parenthesis, \
                        function call, unary minus and binary operator is a level)";

#[tokio::test]
async fn deeply_nested_freeform_upload_is_400_and_the_old_ranker_serves() {
    let s = server();
    let feature = &test_ranker(0.125).features[0];
    // As in hostile files: far past the limit, so a parser without one overflows its stack.
    let parens = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
    let lns = format!("{}1{}", "ln(".repeat(3_000), ")".repeat(3_000));
    let minuses = format!("{}{feature}", "-".repeat(10_000));
    for (expr, column) in [(parens, 129), (lns, 385), (minuses, 129)] {
        upload_is_refused_and_changes_nothing(
            &s,
            with_freeform(&expr),
            &format!("inputs[4].expr: column {column}: {TOO_DEEP}"),
        )
        .await;
    }
}

#[tokio::test]
async fn deeply_nested_freeform_file_is_skipped_at_start() {
    let parens = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
    // `server_with` runs `warm_up`, which must log and skip `deep`, not crash.
    let s = server_with(|config| {
        std::fs::write(config.rankers.join("deep.json"), with_freeform(&parens)).unwrap();
    });
    let get = |uri: &str| Request::get(uri).body(Body::empty()).unwrap();
    let (status, _, body) = send(&s.app, get("/readyz")).await;
    assert_eq!(status, StatusCode::OK);
    let ready: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(ready["rankers_loaded"], 1);
    let features = random_features(3, 4, 5);
    let rank = |name: &str| {
        post(
            "/v1/rank",
            "application/json",
            json(&rank_request(name, &features, 4)),
        )
    };
    assert_eq!(send(&s.app, rank("small")).await.0, StatusCode::OK);
    // A stored file that does not load is the server's fault (until it is replaced).
    expect_error(
        &s.app,
        rank("deep"),
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error",
    )
    .await;
}

/// A small XGBoost `save_model` JSON (one tree, no feature names) claiming `num_feature`.
fn xgboost_claiming(num_feature: &str) -> Vec<u8> {
    format!(
        r#"{{"learner":{{"attributes":{{}},"feature_names":[],"feature_types":[],
        "gradient_booster":{{"model":{{"gbtree_model_param":{{"num_parallel_tree":"1",
        "num_trees":"1"}},"iteration_indptr":[0,1],"tree_info":[0],"trees":[{{
        "left_children":[1,-1,-1],"right_children":[2,-1,-1],"split_indices":[0,0,0],
        "split_conditions":[0.5,-0.25,0.75],"default_left":[1,0,0],"split_type":[0,0,0],
        "base_weights":[0,0,0],"id":0,"tree_param":{{"num_nodes":"3"}}}}]}},
        "name":"gbtree"}},"learner_model_param":{{"base_score":"5E-1",
        "boost_from_average":"1","num_class":"0","num_feature":"{num_feature}",
        "num_target":"1"}},"objective":{{"name":"rank:ndcg"}}}},"version":[3,2,0]}}"#
    )
    .into_bytes()
}

#[tokio::test]
async fn xgboost_upload_claiming_huge_num_feature_is_400_and_the_server_answers() {
    let s = server();
    let field = "XGBoost model, learner.learner_model_param.num_feature";
    for claimed in ["1000000000000", "18446744073709551615"] {
        upload_is_refused_and_changes_nothing(
            &s,
            xgboost_claiming(claimed),
            &format!("{field}: expected at most 1000000 features, got {claimed}"),
        )
        .await;
    }
    upload_is_refused_and_changes_nothing(
        &s,
        xgboost_claiming("-1"),
        &format!("{field}: expected a non-negative integer, got \"-1\""),
    )
    .await;
    // The same file with an honest claim is a ranker.
    let put = Request::put("/v1/rankers/xgb")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::from(xgboost_claiming("2")))
        .unwrap();
    let (status, _, body) = send(&s.app, put).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let description: RankerDescription = serde_json::from_slice(&body).unwrap();
    assert_eq!(description.features, ["f0", "f1"]);
}

fn model_fixture(file: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/trees")
        .join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn put_model(uri: &str, content_type: &str, body: Vec<u8>) -> Request<Body> {
    Request::put(uri)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap()
}

#[tokio::test]
async fn uploads_of_text_binary_and_xml_models_are_detected_or_named() {
    let s = server();
    for (uri, file, content_type, first_feature) in [
        (
            "/v1/rankers/ubj",
            "xgbu_ndcg.model.ubj",
            "application/octet-stream",
            "bm25",
        ),
        (
            "/v1/rankers/ubj?format=xgboost-ubj",
            "xgbu_ndcg.model.ubj",
            "application/octet-stream",
            "bm25",
        ),
        (
            "/v1/rankers/lgbt?format=auto",
            "lgbt_lambdarank.model.txt",
            "text/plain",
            "bm25",
        ),
        (
            "/v1/rankers/lgbt?format=lightgbm-text",
            "lgbt_lambdarank.model.txt",
            "text/plain",
            "bm25",
        ),
        (
            "/v1/rankers/ranklib",
            "ranklib_lambdamart.model.xml",
            "application/xml",
            "1",
        ),
        (
            "/v1/rankers/ranklib?format=ranklib",
            "ranklib_lambdamart.model.xml",
            "application/xml",
            "1",
        ),
    ] {
        let (status, _, body) =
            send(&s.app, put_model(uri, content_type, model_fixture(file))).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{uri}: {}",
            String::from_utf8_lossy(&body)
        );
        let description: RankerDescription = serde_json::from_slice(&body).unwrap();
        assert_eq!(description.features[0], first_feature, "{uri}");
    }
    // Stored as uploaded and re-read by detection.
    for name in ["ubj", "lgbt", "ranklib"] {
        let load = Request::post(format!("/v1/rankers/{name}/load"))
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .unwrap();
        let (status, _, body) = send(&s.app, load).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{name}: {}",
            String::from_utf8_lossy(&body)
        );
    }
}

#[tokio::test]
async fn uploads_in_a_wrong_or_unknown_format_are_400() {
    let s = server();
    let ubj = model_fixture("xgbu_ndcg.model.ubj");
    expect_error(
        &s.app,
        put_model(
            "/v1/rankers/m?format=tensorflow",
            "application/octet-stream",
            ubj.clone(),
        ),
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "unknown format \"tensorflow\": expected auto, native, lightgbm, lightgbm-text, xgboost, \
         xgboost-ubj, ranklib, catboost, onnx",
    )
    .await;
    let (status, _, _) = send(
        &s.app,
        put_model(
            "/v1/rankers/m?fromat=ranklib",
            "application/octet-stream",
            ubj.clone(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    expect_error(
        &s.app,
        put_model(
            "/v1/rankers/m?format=lightgbm-text",
            "application/octet-stream",
            ubj,
        ),
        StatusCode::BAD_REQUEST,
        "bad_ranker",
        "ranker \"m\" is invalid: LightGBM text model, (first line): expected \"tree\", the first \
         line of a LightGBM text model",
    )
    .await;
    upload_is_refused_and_changes_nothing(
        &s,
        model_fixture("xgbu_gblinear.model.ubj"),
        "XGBoost model, learner.gradient_booster.name: expected \"gbtree\", got \"gblinear\" \
         (DART trees carry weights and gblinear has no trees)",
    )
    .await;
    upload_is_refused_and_changes_nothing(
        &s,
        model_fixture("lgbt_linear.model.txt"),
        "LightGBM text model, Tree=0.is_linear: linear trees (linear_tree = true) have a linear \
         model per leaf; only constant leaves can be imported",
    )
    .await;
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

/// A real server on a loopback port; `shutdown` stops it.
pub(crate) struct Live {
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) shutdown: tokio::sync::oneshot::Sender<()>,
    pub(crate) task: tokio::task::JoinHandle<std::io::Result<()>>,
    _server: TestServer,
}

pub(crate) async fn live(tweak: impl FnOnce(&mut Config)) -> Live {
    let server = server_with(tweak);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(rankserve::server::serve(
        listener,
        Arc::clone(&server.state),
        async {
            let _ = stop.await;
        },
    ));
    Live {
        addr,
        shutdown,
        task,
        _server: server,
    }
}

pub(crate) type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<bytes::Bytes>,
>;

pub(crate) fn client() -> Client {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

async fn post_live(
    client: &Client,
    addr: std::net::SocketAddr,
    request: &RankRequest,
) -> (StatusCode, Vec<u8>) {
    let request = Request::post(format!("http://{addr}/v1/rank"))
        .header(header::CONTENT_TYPE, "application/msgpack")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            rmp_serde::to_vec_named(request).unwrap(),
        )))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    (
        status,
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_clients_are_batched_and_all_correct() {
    let live = live(|c| c.max_batch_docs = 400).await;
    let ranker = test_ranker(0.125);
    let client = client();
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let (client, addr, ranker) = (client.clone(), live.addr, ranker.clone());
        tasks.push(tokio::spawn(async move {
            let features = random_features(1 + (i as usize * 7) % 40, 4, 100 + i);
            let (status, body) =
                post_live(&client, addr, &rank_request("small", &features, 4)).await;
            assert_eq!(status, StatusCode::OK, "client {i}");
            let reply: RankResponse = rmp_serde::from_slice(&body).unwrap();
            assert_eq!(
                reply.scores,
                expected_scores(&ranker, &features),
                "client {i}"
            );
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Batches ran (the recorder is shared by this binary's tests; whether requests merge
    // depends on their timing: `rank::engine::batch`'s tests show merging deterministically).
    let metrics = rankserve::server::metrics::handle().render();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().last())
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(value("rankserve_batch_requests_count") > 0.0);
    let _ = live.shutdown.send(());
    live.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn full_queue_is_503_overloaded_with_retry_after() {
    // One place per ranker and 32 requests at once: those that find it taken are refused, the
    // others answered.
    let live = live(|c| c.queue_capacity = 1).await;
    let client = client();
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let (client, addr) = (client.clone(), live.addr);
        tasks.push(tokio::spawn(async move {
            let body = json(&rank_request("small", &random_features(2000, 4, i), 4));
            let request = Request::post(format!("http://{addr}/v1/rank"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .unwrap();
            let response = client.request(request).await.unwrap();
            let (status, retry_after) = (
                response.status(),
                response.headers().get(header::RETRY_AFTER).cloned(),
            );
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, retry_after, body)
        }));
    }
    let (mut ok, mut refused) = (0, 0);
    for task in tasks {
        let (status, retry_after, body) = task.await.unwrap();
        if status == StatusCode::OK {
            ok += 1;
            continue;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after.unwrap(), "1");
        let body: ErrorBody = serde_json::from_slice(&body).unwrap();
        assert_eq!(body.error.code, "overloaded");
        assert_eq!(
            body.error.message,
            "the queue for ranker \"small\" is full (1 requests); retry after 1 s"
        );
        refused += 1;
    }
    assert!(ok >= 1 && refused >= 1, "{ok} answered, {refused} refused");
    let _ = live.shutdown.send(());
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn overload_refusals_are_logged_at_warn_at_most_once_a_second_not_at_error_each() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    // One thread: every request's middleware logs on it, into `captured`.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let refused = runtime.block_on(async {
        let s = server_with(|c| c.queue_capacity = 1);
        let mut requests = tokio::task::JoinSet::new();
        for i in 0..48u64 {
            let app = s.app.clone();
            let body = json(&rank_request("small", &random_features(2000, 4, i), 4));
            requests.spawn(async move {
                send(&app, post("/v1/rank", "application/json", body))
                    .await
                    .0
            });
        }
        let mut refused = 0;
        while let Some(status) = requests.join_next().await {
            refused += usize::from(status.unwrap() == StatusCode::SERVICE_UNAVAILABLE);
        }
        refused
    });
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(refused >= 3, "{refused} refused: not an overload");
    assert!(!log.contains("ERROR"), "{log}");
    // Other tests of this binary may have logged `overloaded` within the second: 0 or 1 line.
    let lines = log.lines().filter(|l| l.contains("overloaded")).count();
    assert!(lines <= 1, "{lines} lines for {refused} refusals:\n{log}");
    assert!(
        log.lines()
            .filter(|l| l.contains("overloaded"))
            .all(|l| l.contains("WARN")),
        "{log}"
    );
}

#[tokio::test]
async fn bad_bodies_name_the_field_and_what_was_expected() {
    let s = server();
    let features_string =
        br#"{"ranker": "small", "documents": [{"features": [1, 2, 3, 4]}, {"features": "x"}]}"#;
    expect_error(
        &s.app,
        post("/v1/rank", "application/json", features_string.to_vec()),
        StatusCode::BAD_REQUEST,
        "bad_body",
        "JSON body does not parse: documents[1].features: invalid type: string \"x\", expected an array of numbers or nulls (in the ranker's feature order) or a map of feature name to number or null at line 1 column 78",
    )
    .await;
    let element = br#"{"ranker": "small", "documents": [{"features": [1, "a", 3, 4]}]}"#;
    let (_, _, body) = send(
        &s.app,
        post("/v1/rank", "application/json", element.to_vec()),
    )
    .await;
    let body: ErrorBody = serde_json::from_slice(&body).unwrap();
    assert!(
        body.error.message.starts_with(
            "JSON body does not parse: documents[0].features[1]: invalid type: string \"a\""
        ),
        "{}",
        body.error.message
    );
    // MessagePack `k: {}`: rmp-serde says only "wrong msgpack marker FixMap(0)".
    let k_map = rmp_serde::to_vec_named(&serde_json::json!({
        "ranker": "small", "documents": [{"features": [1, 2, 3, 4]}], "k": {}
    }))
    .unwrap();
    let (status, _, body) = send(&s.app, post("/v1/rank", "application/msgpack", k_map)).await;
    let body: ErrorBody = rmp_serde::from_slice(&body).unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body.error.message.starts_with("MessagePack body does not parse: k: invalid type: map, expected usize (at or before byte "),
        "{}",
        body.error.message
    );
    for (content_type, expected) in [
        (
            "application/msgpack",
            "MessagePack body does not parse: the body is empty: expected a MessagePack map",
        ),
        (
            "application/json",
            "JSON body does not parse: the body is empty: expected a JSON object",
        ),
    ] {
        let mut empty = post("/v1/rank", content_type, Vec::new());
        empty
            .headers_mut()
            .insert(header::ACCEPT, "application/json".parse().unwrap());
        expect_error(&s.app, empty, StatusCode::BAD_REQUEST, "bad_body", expected).await;
    }
    let mut truncated =
        rmp_serde::to_vec_named(&rank_request("small", &random_features(3, 4, 1), 4)).unwrap();
    truncated.truncate(truncated.len() - 3);
    let (_, _, body) = send(&s.app, post("/v1/rank", "application/msgpack", truncated)).await;
    let message = rmp_serde::from_slice::<ErrorBody>(&body)
        .unwrap()
        .error
        .message;
    assert!(
        message.contains("the body ends inside a value (truncated)"),
        "{message}"
    );
    // A wrongly typed string of 100 000 characters is quoted cut.
    let long = format!(
        r#"{{"ranker": "small", "documents": [], "k": "{}"}}"#,
        "x".repeat(100_000)
    );
    let (_, _, body) = send(
        &s.app,
        post("/v1/rank", "application/json", long.into_bytes()),
    )
    .await;
    let message = serde_json::from_slice::<ErrorBody>(&body)
        .unwrap()
        .error
        .message;
    assert!(
        message.len() < 512
            && message.starts_with("JSON body does not parse: k: invalid type: string"),
        "{message}"
    );
}

#[tokio::test]
async fn undecodable_paths_and_long_targets_answer_in_the_error_format_and_are_counted() {
    let s = server();
    let counted = |code: &str| {
        let text = rankserve::server::metrics::handle().render();
        let prefix = format!("rankserve_http_errors_total{{code=\"{code}\"}}");
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .and_then(|l| l.split_whitespace().last())
            .map_or(0.0, |v| v.parse::<f64>().unwrap())
    };
    let (bad_name, too_long) = (counted("bad_ranker_name"), counted("uri_too_long"));
    expect_error(
        &s.app,
        Request::get("/v1/rankers/%FF").body(Body::empty()).unwrap(),
        StatusCode::BAD_REQUEST,
        "bad_ranker_name",
        "invalid ranker name \"%FF\": expected 1 to 64 characters of A-Z a-z 0-9 _ -",
    )
    .await;
    let long = format!("/v1/rankers?{}", "q".repeat(9000));
    expect_error(
        &s.app,
        Request::get(long).body(Body::empty()).unwrap(),
        StatusCode::URI_TOO_LONG,
        "uri_too_long",
        "request target of 9012 bytes is over the limit of 8192 bytes",
    )
    .await;
    // An unknown path is quoted cut.
    let (status, _, body) = send(
        &s.app,
        Request::get(format!("/{}", "p".repeat(5000)))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let message = serde_json::from_slice::<ErrorBody>(&body)
        .unwrap()
        .error
        .message;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(message.ends_with("… (5001 bytes)"), "{message}");
    assert!(counted("bad_ranker_name") > bad_name && counted("uri_too_long") > too_long);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_with_requests_in_flight_loses_none() {
    use hyper_util::rt::TokioIo;
    let live = live(|_| {}).await;
    let ranker = test_ranker(0.125);
    // Every client first has its connection accepted and answered (a health check), so the
    // shutdown finds 16 requests sent on served connections, not connections still in the
    // listener's backlog (which a stopping server rightly refuses), however slow the machine.
    let connected = Arc::new(tokio::sync::Barrier::new(17));
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let (addr, ranker, connected) = (live.addr, ranker.clone(), Arc::clone(&connected));
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            let health = Request::get("/healthz")
                .header(header::HOST, "rankserve")
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            assert_eq!(
                sender.send_request(health).await.unwrap().status(),
                StatusCode::OK
            );
            connected.wait().await;
            // Large enough that some are still being scored when the shutdown comes.
            let features = random_features(2000, 4, i);
            let request = Request::post("/v1/rank")
                .header(header::HOST, "rankserve")
                .header(header::CONTENT_TYPE, "application/msgpack")
                .body(http_body_util::Full::new(bytes::Bytes::from(
                    rmp_serde::to_vec_named(&rank_request("small", &features, 4)).unwrap(),
                )))
                .unwrap();
            let response = sender.send_request(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let reply: RankResponse = rmp_serde::from_slice(&body).unwrap();
            assert_eq!(reply.scores, expected_scores(&ranker, &features));
        }));
    }
    connected.wait().await;
    tokio::time::sleep(Duration::from_millis(100)).await; // all sent, some being scored
    let _ = live.shutdown.send(());
    for task in tasks {
        task.await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(5), live.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

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

/// A ranker or feature name of megabytes comes back cut to its first 64 characters and its
/// length, not whole, in the reply (and so in the log line).
#[tokio::test]
async fn huge_names_in_a_request_are_quoted_cut() {
    let s = server_with(|_| {});
    let long = "n".repeat(100_000);
    let cut = format!("{}… (100000 bytes)", "n".repeat(64));
    expect_error(
        &s.app,
        post(
            "/v1/rank",
            "application/json",
            json(&rank_request(&long, &random_features(1, 4, 1), 4)),
        ),
        StatusCode::BAD_REQUEST,
        "bad_ranker_name",
        &format!("invalid ranker name {cut:?}: expected 1 to 64 characters of A-Z a-z 0-9 _ -"),
    )
    .await;
    let mut request = rank_request("small", &random_features(1, 4, 1), 4);
    request.documents[0].features = Some(FeatureValues::Named(
        [(long.clone(), Some(1.0))].into_iter().collect(),
    ));
    expect_error(
        &s.app,
        post("/v1/rank", "application/json", json(&request)),
        StatusCode::BAD_REQUEST,
        "invalid_request",
        &format!(
            "documents[0].features.{cut}: unknown feature: ranker \"small\" has no feature {cut:?}"
        ),
    )
    .await;
}

#[tokio::test]
async fn onnx_and_catboost_uploads_are_recognised_and_an_unsupported_op_is_400() {
    let s = server();
    let trees = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/trees");
    for (name, file, features) in [
        ("mlp", "onnx_mlp_gemm.model.onnx", 6),
        ("cb", "cb_yetirank.model.json", 5),
    ] {
        let put = Request::put(format!("/v1/rankers/{name}"))
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Body::from(std::fs::read(trees.join(file)).unwrap()))
            .unwrap();
        let (status, _, body) = send(&s.app, put).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let description: RankerDescription = serde_json::from_slice(&body).unwrap();
        assert_eq!(description.features.len(), features, "{name}");
    }
    upload_is_refused_and_changes_nothing(
        &s,
        std::fs::read(trees.join("onnx_classifier.model.onnx")).unwrap(),
        "ONNX model, graph.node[0] (name \"TreeEnsembleClassifier\", op \
         ai.onnx.ml::TreeEnsembleClassifier): op ai.onnx.ml::TreeEnsembleClassifier is not \
         supported; supported: ai.onnx.ml TreeEnsembleRegressor or TreeEnsemble (alone), or Gemm, \
         MatMul, Add (the bias of a MatMul), Relu, Sigmoid, Tanh; Identity anywhere",
    )
    .await;
}
