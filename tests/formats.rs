//! Parity of imported LightGBM, XGBoost, CatBoost, ONNX and RankLib models with the libraries'
//! own predictions.
//!
//! The fixtures in `fixtures/trees/` were written by `scripts/make_tree_fixtures.py` (JSON
//! models), `scripts/make_import_fixtures.py` (LightGBM text, XGBoost UBJSON, RankLib XML) and
//! `scripts/make_catboost_onnx_fixtures.py` (CatBoost, ONNX): each model file, scoring rows (no
//! header, an empty field is missing) and the library's raw predictions (`raw_score=True` /
//! `output_margin=True` / `RawFormulaVal` / onnxruntime on the rows as float32; for RankLib, the
//! script's evaluator written from RankLib's source). Every row must score within
//! 1e-6·max(1, |theirs|) of the library.

use std::path::PathBuf;

use rankserve::rank::cpu::{score_batch, score_doc_reference};
use rankserve::rank::format::{parse_native, to_native_json};
use rankserve::rank::import::{
    import_catboost, import_lightgbm, import_lightgbm_text, import_onnx, import_ranklib,
    import_xgboost, import_xgboost_ubj, load_any,
};
use rankserve::rank::model::Ranker;
use rankserve::rank::RankerError;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/trees")
        .join(name)
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"))
}

/// The rows of `NAME.rows.csv`, flattened row-major, and the row width.
fn rows(name: &str) -> (Vec<f64>, usize) {
    let text = String::from_utf8(read(&format!("{name}.rows.csv"))).unwrap();
    let mut values = Vec::new();
    let mut width = 0;
    for line in text.lines() {
        let row: Vec<f64> = line
            .split(',')
            .map(|field| {
                if field.is_empty() {
                    f64::NAN
                } else {
                    field.parse().unwrap()
                }
            })
            .collect();
        width = row.len();
        values.extend(row);
    }
    (values, width)
}

fn expected(name: &str) -> Vec<f64> {
    let text = String::from_utf8(read(&format!("{name}.expected.txt"))).unwrap();
    text.lines().map(|l| l.parse().unwrap()).collect()
}

/// The largest relative error |ours − theirs| / max(1, |theirs|) over the rows.
fn max_relative_error(ours: &[f64], theirs: &[f64]) -> (f64, usize) {
    assert_eq!(ours.len(), theirs.len());
    ours.iter()
        .zip(theirs)
        .enumerate()
        .map(|(i, (a, b))| ((a - b).abs() / b.abs().max(1.0), i))
        .fold((0.0, 0), |best, e| if e.0 > best.0 { e } else { best })
}

/// Scores every row with the CPU evaluator (one thread and two: identical, and identical to the
/// per-document reference) and compares with the library's own predictions; `model` is the
/// model file `NAME.model.EXT`, beside `NAME.rows.csv` and `NAME.expected.txt`.
fn check_parity(model: &str, import: fn(&[u8]) -> Result<Ranker, RankerError>) {
    let name = &model[..model.find(".model.").expect("NAME.model.EXT")];
    let ranker = import(&read(model)).unwrap();
    let (values, width) = rows(name);
    assert_eq!(width, ranker.features.len(), "{name}: row width");
    let theirs = expected(name);
    assert_eq!(values.len() / width, theirs.len(), "{name}: row count");
    let ours = score_batch(&ranker, &values, 1);
    let reference: Vec<f64> = values
        .chunks(width)
        .map(|x| score_doc_reference(&ranker, x))
        .collect();
    let threaded = score_batch(&ranker, &values, 2);
    for (i, ((a, b), c)) in ours.iter().zip(&reference).zip(&threaded).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{name}: row {i}: plan vs reference"
        );
        assert_eq!(a.to_bits(), c.to_bits(), "{name}: row {i}: 1 vs 2 threads");
    }
    let (err, row) = max_relative_error(&ours, &theirs);
    eprintln!(
        "{name}: {} rows, max relative error {err:e} (row {row})",
        theirs.len()
    );
    assert!(
        err <= 1e-6,
        "{name}: row {row}: ours {} vs theirs {} (relative error {err:e})",
        ours[row],
        theirs[row]
    );
}

#[test]
fn lightgbm_lambdarank_matches_lightgbm() {
    check_parity("lgb_lambdarank.model.json", import_lightgbm);
}

#[test]
fn lightgbm_binary_zero_as_missing_matches_lightgbm() {
    check_parity("lgb_binary_zero.model.json", import_lightgbm);
}

#[test]
fn xgboost_ndcg_matches_xgboost() {
    check_parity("xgb_ndcg.model.json", import_xgboost);
}

#[test]
fn xgboost_logistic_with_bracketed_base_score_matches_xgboost() {
    check_parity("xgb_logistic.model.json", import_xgboost);
}

#[test]
fn lightgbm_text_lambdarank_with_categories_matches_lightgbm() {
    check_parity("lgbt_lambdarank.model.txt", import_lightgbm_text);
}

#[test]
fn lightgbm_text_binary_zero_as_missing_matches_lightgbm() {
    check_parity("lgbt_binary_zero.model.txt", import_lightgbm_text);
}

#[test]
fn xgboost_ubj_ndcg_matches_xgboost() {
    check_parity("xgbu_ndcg.model.ubj", import_xgboost_ubj);
}

#[test]
fn xgboost_ubj_logistic_with_base_score_matches_xgboost() {
    check_parity("xgbu_logistic.model.ubj", import_xgboost_ubj);
}

#[test]
fn ranklib_lambdamart_matches_the_reading_of_ranklib_source() {
    check_parity("ranklib_lambdamart.model.xml", import_ranklib);
}

#[test]
fn refuses_unsupported_variants_of_the_new_formats() {
    let err = |file: &str, import: fn(&[u8]) -> Result<Ranker, RankerError>| {
        import(&read(file)).unwrap_err().to_string()
    };
    assert_eq!(
        err("lgbt_linear.model.txt", import_lightgbm_text),
        "LightGBM text model, Tree=0.is_linear: linear trees (linear_tree = true) have a linear \
         model per leaf; only constant leaves can be imported"
    );
    assert_eq!(
        err("xgbu_gblinear.model.ubj", import_xgboost_ubj),
        "XGBoost model, learner.gradient_booster.name: expected \"gbtree\", got \"gblinear\" \
         (DART trees carry weights and gblinear has no trees)"
    );
    let categorical = err("xgbu_categorical.model.ubj", import_xgboost_ubj);
    assert!(
        categorical.contains(".split_type[") && categorical.contains("categorical splits cannot"),
        "{categorical}"
    );
}

#[test]
fn refuses_truncated_ubjson_naming_the_byte() {
    let bytes = read("xgbu_ndcg.model.ubj");
    let err = import_xgboost_ubj(&bytes[..bytes.len() / 2])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("XGBoost model UBJSON, byte "), "{err}");
}

#[test]
fn load_any_detects_the_text_binary_and_xml_formats() {
    for (file, import) in [
        (
            "lgbt_lambdarank.model.txt",
            import_lightgbm_text as fn(&[u8]) -> _,
        ),
        ("xgbu_ndcg.model.ubj", import_xgboost_ubj),
        ("ranklib_lambdamart.model.xml", import_ranklib),
    ] {
        let bytes = read(file);
        assert_eq!(load_any(&bytes).unwrap(), import(&bytes).unwrap(), "{file}");
    }
}

#[test]
fn feature_names_come_from_the_model() {
    let named = import_lightgbm(&read("lgb_lambdarank.model.json")).unwrap();
    assert_eq!(named.features[3], "site_category");
    let unnamed = import_lightgbm(&read("lgb_binary_zero.model.json")).unwrap();
    assert_eq!(
        unnamed.features,
        ["Column_0", "Column_1", "Column_2", "Column_3", "Column_4"]
    );
    let xgb = import_xgboost(&read("xgb_logistic.model.json")).unwrap();
    assert_eq!(xgb.features, ["f0", "f1", "f2", "f3"]);
    let text = import_lightgbm_text(&read("lgbt_lambdarank.model.txt")).unwrap();
    assert_eq!(text.features[2], "site_category");
    let ubj = import_xgboost_ubj(&read("xgbu_ndcg.model.ubj")).unwrap();
    assert_eq!(
        ubj.features,
        ["bm25", "proximity", "freshness", "static_rank"]
    );
    let ranklib = import_ranklib(&read("ranklib_lambdamart.model.xml")).unwrap();
    assert_eq!(ranklib.features, ["1", "2", "3", "4", "5"]);
}

#[test]
fn refuses_a_lightgbm_multiclass_model() {
    let err = import_lightgbm(&read("lgb_multiclass.model.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("num_class: a multi-class model (3 classes)"),
        "{err}"
    );
}

#[test]
fn refuses_a_lightgbm_linear_tree_model() {
    let err = import_lightgbm(&read("lgb_linear.model.json"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("leaf_coeff: linear trees"), "{err}");
}

#[test]
fn refuses_an_xgboost_multiclass_model() {
    let err = import_xgboost(&read("xgb_multiclass.model.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("num_class: a multi-class model (3 classes)"),
        "{err}"
    );
}

#[test]
fn refuses_a_model_of_the_other_library() {
    let err = import_xgboost(&read("lgb_lambdarank.model.json"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing field `learner`"), "{err}");
    let err = import_lightgbm(&read("xgb_ndcg.model.json"))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("LightGBM model JSON"), "{err}");
}

#[test]
fn refuses_truncated_json() {
    let bytes = read("lgb_lambdarank.model.json");
    let err = import_lightgbm(&bytes[..bytes.len() / 2])
        .unwrap_err()
        .to_string();
    assert!(err.contains("EOF"), "{err}");
}

#[test]
fn native_round_trip_keeps_every_bit() {
    for (name, import) in [
        ("lgb_lambdarank", import_lightgbm as fn(&[u8]) -> _),
        ("lgb_binary_zero", import_lightgbm),
        ("xgb_ndcg", import_xgboost),
        ("xgb_logistic", import_xgboost),
    ] {
        let ranker = import(&read(&format!("{name}.model.json"))).unwrap();
        let native = to_native_json(&ranker);
        let back = parse_native(native.as_bytes()).unwrap();
        assert_eq!(back, ranker, "{name}: ranker after the native round trip");
        let (values, _) = rows(name);
        let (a, b) = (
            score_batch(&ranker, &values, 1),
            score_batch(&back, &values, 1),
        );
        assert!(
            a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: scores after the round trip"
        );
    }
}

#[test]
fn load_any_detects_each_format() {
    for name in ["lgb_lambdarank", "xgb_ndcg"] {
        let bytes = read(&format!("{name}.model.json"));
        let imported = load_any(&bytes).unwrap();
        let native = to_native_json(&imported);
        assert_eq!(load_any(native.as_bytes()).unwrap(), imported, "{name}");
    }
    assert_eq!(
        load_any(&read("lgb_binary_zero.model.json")).unwrap(),
        import_lightgbm(&read("lgb_binary_zero.model.json")).unwrap()
    );
}

fn rankserve(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_rankserve"))
        .args(args)
        .output()
        .expect("running rankserve")
}

#[test]
fn cli_import_writes_the_native_ranker() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lgb.json");
    let model = fixture("lgb_lambdarank.model.json");
    let run = rankserve(&[
        "ranker",
        "import",
        "--format",
        "lightgbm",
        "--in",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let written = parse_native(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(
        written,
        import_lightgbm(&read("lgb_lambdarank.model.json")).unwrap()
    );
}

#[test]
fn cli_import_of_a_bad_model_exits_2_naming_the_field_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("multi.json");
    let model = fixture("xgb_multiclass.model.json");
    let run = rankserve(&[
        "ranker",
        "import",
        "--format",
        "xgboost",
        "--in",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("learner.learner_model_param.num_class"),
        "{stderr}"
    );
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no partial output"
    );
}

#[test]
fn catboost_models_match_catboost() {
    for name in [
        "cb_yetirank.model.json",
        "cb_pairlogit.model.json",
        "cb_queryrmse_lossguide.model.json",
        "cb_rmse_nanmax.model.json",
        "cb_rmse_depthwise.model.json",
    ] {
        check_parity(name, import_catboost);
    }
}

#[test]
fn onnx_tree_ensembles_match_onnxruntime() {
    for name in [
        "onnx_lightgbm.model.onnx",
        "onnx_xgboost.model.onnx",
        "onnx_sklearn_gbr.model.onnx",
        "onnx_modes.model.onnx",
        "onnx5_lightgbm.model.onnx",
        "onnx5_modes.model.onnx",
    ] {
        check_parity(name, import_onnx);
    }
}

#[test]
fn onnx_mlps_match_onnxruntime() {
    for name in ["onnx_mlp_gemm.model.onnx", "onnx_mlp_matmul.model.onnx"] {
        check_parity(name, import_onnx);
    }
}

#[test]
fn catboost_and_onnx_native_round_trip_and_detection() {
    for (name, import) in [
        ("cb_yetirank.model.json", import_catboost as fn(&[u8]) -> _),
        ("cb_rmse_depthwise.model.json", import_catboost),
        ("onnx_lightgbm.model.onnx", import_onnx),
        ("onnx_mlp_gemm.model.onnx", import_onnx),
    ] {
        let bytes = read(name);
        let ranker = import(&bytes).unwrap();
        assert_eq!(load_any(&bytes).unwrap(), ranker, "{name}: detected");
        let back = parse_native(to_native_json(&ranker).as_bytes()).unwrap();
        assert_eq!(back, ranker, "{name}: ranker after the native round trip");
    }
}

#[test]
fn refuses_catboost_multiclass_and_categorical_models() {
    let err = import_catboost(&read("cb_multiclass.model.json"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "CatBoost model, scale_and_bias[1]: 3 biases (one per dimension): a ranker has one output"
    );
    let err = load_any(&read("cb_categorical.model.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("CatBoost model, features_info.categorical_features: 1 present"),
        "{err}"
    );
}

#[test]
fn refuses_an_onnx_classifier_naming_the_op() {
    let err = load_any(&read("onnx_classifier.model.onnx"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("ONNX model, graph.node[0]") && err.contains("TreeEnsembleClassifier"),
        "{err}"
    );
}

#[test]
fn cli_import_detects_the_format_or_takes_it_named() {
    let dir = tempfile::tempdir().unwrap();
    for (format, file, import) in [
        (
            None,
            "xgbu_ndcg.model.ubj",
            import_xgboost_ubj as fn(&[u8]) -> _,
        ),
        (
            Some("lightgbm-text"),
            "lgbt_lambdarank.model.txt",
            import_lightgbm_text,
        ),
        (
            Some("ranklib"),
            "ranklib_lambdamart.model.xml",
            import_ranklib,
        ),
        (Some("auto"), "ranklib_lambdamart.model.xml", import_ranklib),
        (Some("catboost"), "cb_yetirank.model.json", import_catboost),
        (None, "onnx_mlp_gemm.model.onnx", import_onnx),
    ] {
        let out = dir.path().join("out.json");
        let model = fixture(file);
        let mut args = vec!["ranker", "import"];
        if let Some(format) = format {
            args.extend(["--format", format]);
        }
        args.extend([
            "--in",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        let run = rankserve(&args);
        assert!(
            run.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let written = parse_native(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(written, import(&read(file)).unwrap(), "{file}");
    }
    let run = rankserve(&[
        "ranker",
        "import",
        "--format",
        "xgboost-ubj",
        "--in",
        fixture("xgbu_gblinear.model.ubj").to_str().unwrap(),
        "--out",
        dir.path().join("no.json").to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("learner.gradient_booster.name"), "{stderr}");
    let run = rankserve(&[
        "ranker",
        "import",
        "--format",
        "onnx",
        "--in",
        fixture("onnx_classifier.model.onnx").to_str().unwrap(),
        "--out",
        dir.path().join("c.json").to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("TreeEnsembleClassifier"));
}
