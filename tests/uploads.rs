//! Ranker uploads over HTTP: a bad upload (malformed, hostile, in the wrong format) is a 400 that
//! changes nothing; a good one, in any format the server reads, replaces the ranker.

use axum::body::Body;
use axum::http::{header, Request, StatusCode};

use rankserve::api::{RankResponse, RankerDescription};
use rankserve::rank::format::to_native_json;
use rankserve::server::error::ErrorBody;

use crate::http::{
    expect_error, expected_scores, json, post, random_features, rank_request, send, server,
    server_with, test_ranker, TestServer, TOKEN,
};

/// A request ranking `features` (documents of 4) with ranker `small`.
fn rank_small(features: &[f64]) -> Request<Body> {
    post(
        "/v1/rank",
        "application/json",
        json(&rank_request("small", features, 4)),
    )
}

/// What an upload over `small` must leave as it was: its scores for `features`, and its file's
/// path and bytes.
async fn small_before(
    s: &TestServer,
    features: &[f64],
) -> (RankResponse, std::path::PathBuf, Vec<u8>) {
    let before = serde_json::from_slice(&send(&s.app, rank_small(features)).await.2).unwrap();
    let file = s.state.store().dir().join("small.json");
    let on_disk = std::fs::read(&file).unwrap();
    (before, file, on_disk)
}

#[tokio::test]
async fn bad_upload_leaves_the_old_ranker_serving_and_good_upload_replaces_it() {
    let s = server();
    let features = random_features(10, 4, 3);
    let rank = || rank_small(&features);
    let (before, file, on_disk) = small_before(&s, &features).await;

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
    let rank = || rank_small(&features);
    let (before, file, on_disk) = small_before(s, &features).await;
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
