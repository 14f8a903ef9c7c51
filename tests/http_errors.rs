//! Client errors over HTTP: every 4xx with its code and exact message, in the negotiated format,
//! for JSON and MessagePack bodies alike; fields named in what was expected; undecodable paths,
//! long targets and huge names answered without echoing them whole.

use axum::body::Body;
use axum::http::{header, Request, StatusCode};

use rankserve::api::FeatureValues;
use rankserve::backend::Backend;
use rankserve::rank::format::to_native_json;
use rankserve::server::error::ErrorBody;

use crate::http::{
    expect_error, json, post, random_features, rank_request, send, server, server_with, test_ranker,
};

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
