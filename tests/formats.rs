//! Parity of imported LightGBM and XGBoost models with the libraries' own predictions.
//!
//! The fixtures in `fixtures/trees/` were written by `scripts/make_tree_fixtures.py`: each
//! model's JSON, scoring rows (no header, an empty field is missing) and the library's raw
//! predictions (`raw_score=True` / `output_margin=True`). Every row must score within
//! 1e-6·max(1, |theirs|) of the library.

use std::path::PathBuf;

use rankserve::rank::format::{parse_native, to_native_json};
use rankserve::rank::import::{import_lightgbm, import_xgboost, load_any};
use rankserve::rank::model::{Decision, Missing, Node, Ranker, Tree};
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

/// The model's rules (`rank::model` docs), one node at a time: the naive reference.
fn naive_leaf(tree: &Tree, x: &[f64]) -> f64 {
    let mut at = 0usize;
    loop {
        let split = match &tree.nodes[at] {
            Node::Leaf(value) => return *value,
            Node::Split(split) => split,
        };
        let mut v = x[split.feature as usize];
        if v.is_nan() && split.missing != Missing::Nan {
            v = 0.0;
        }
        let takes_default = match split.missing {
            Missing::None => false,
            Missing::Zero => v.is_nan() || v.abs() <= 1e-35_f32 as f64,
            Missing::Nan => v.is_nan(),
        };
        let left = if takes_default {
            split.default_left
        } else {
            match &split.decision {
                Decision::LeF64(t) => v <= *t,
                Decision::LtF32(t) => (v as f32) < *t,
                // LightGBM truncates the value to an integer category; negatives go right.
                Decision::In(set) => {
                    let category = v.trunc();
                    category >= 0.0 && set.binary_search(&(category as u32)).is_ok()
                }
            }
        };
        at = if left { split.left } else { split.right } as usize;
    }
}

fn naive_score(ranker: &Ranker, x: &[f64]) -> f64 {
    let ensemble = ranker
        .ensemble
        .as_ref()
        .expect("an imported ranker has an ensemble");
    ensemble
        .trees
        .iter()
        .fold(ensemble.base_score, |sum, tree| sum + naive_leaf(tree, x))
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

fn check_parity(name: &str, import: fn(&[u8]) -> Result<Ranker, RankerError>) {
    let ranker = import(&read(&format!("{name}.model.json"))).unwrap();
    let (values, width) = rows(name);
    assert_eq!(width, ranker.features.len(), "{name}: row width");
    let theirs = expected(name);
    assert_eq!(values.len() / width, theirs.len(), "{name}: row count");
    let ours: Vec<f64> = values
        .chunks(width)
        .map(|x| naive_score(&ranker, x))
        .collect();
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
    check_parity("lgb_lambdarank", import_lightgbm);
}

#[test]
fn lightgbm_binary_zero_as_missing_matches_lightgbm() {
    check_parity("lgb_binary_zero", import_lightgbm);
}

#[test]
fn xgboost_ndcg_matches_xgboost() {
    check_parity("xgb_ndcg", import_xgboost);
}

#[test]
fn xgboost_logistic_with_bracketed_base_score_matches_xgboost() {
    check_parity("xgb_logistic", import_xgboost);
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
        let (values, width) = rows(name);
        for x in values.chunks(width) {
            let (a, b) = (naive_score(&ranker, x), naive_score(&back, x));
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{name}: score after the round trip"
            );
        }
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
