//! XGBoost `save_model("x.json")` JSON and `save_model("x.ubj")` UBJSON → [`Ranker`].
//!
//! The UBJSON file is the same document in a binary encoding: it is decoded into the same
//! value (`import::ubjson`) and read by the same structures, so both import identically.
//!
//! XGBoost's own prediction rules (`predictor/predict_fn.h`), reproduced here:
//! - Feature values are read as f32; a missing value (NaN) goes the `default_left` way;
//!   otherwise left when `f32(x) < split_condition` (f32), which is the ranker's `lt_f32`.
//! - A leaf's value is its `split_conditions` entry (f32).
//! - The margin (`output_margin=True`) is the base margin plus the leaves' values; the base
//!   margin is `learner_model_param.base_score` taken through the objective's link function
//!   (logit for the logistic objectives, log for the Poisson/Gamma/Tweedie ones, identity for
//!   the squared-error and ranking ones), computed in f32 as XGBoost does.
//!
//! XGBoost accumulates the margin in f32, the ranker in f64: the ranker's score is the exact
//! sum, XGBoost's is within a few f32 rounding steps of it (relative 1e-7 on the fixtures).
//!
//! Refused: multi-class and multi-target models, categorical splits, DART (its trees carry
//! weights) and linear boosters, objectives whose link function is not listed here.

use serde::Deserialize;
use serde_json::Value;

use super::{check_unique_names, ranker_from_trees, Format, ImportError};
use crate::rank::format::{validate, MAX_FEATURES};
use crate::rank::model::{Decision, Missing, Node, Ranker, Split, Tree};
use crate::rank::RankerError;

const XGBOOST: Format = Format("XGBoost");

/// The fields of `save_model` JSON that the import reads; others are ignored.
#[derive(Deserialize)]
struct SavedModel {
    learner: Learner,
}

#[derive(Deserialize)]
struct Learner {
    #[serde(default)]
    feature_names: Vec<String>,
    learner_model_param: LearnerModelParam,
    objective: Objective,
    gradient_booster: GradientBooster,
}

/// XGBoost writes these numbers as JSON strings (`"5E-1"`, `"[4.6E-1]"`, `"0"`); numbers are
/// accepted too.
#[derive(Deserialize)]
struct LearnerModelParam {
    base_score: Value,
    #[serde(default)]
    num_class: Option<Value>,
    num_feature: Value,
    #[serde(default)]
    num_target: Option<Value>,
}

#[derive(Deserialize)]
struct Objective {
    name: String,
}

#[derive(Deserialize)]
struct GradientBooster {
    name: String,
    model: Option<GbTreeModel>,
}

#[derive(Deserialize)]
struct GbTreeModel {
    #[serde(default)]
    tree_info: Vec<i64>,
    /// Optional here so that a gblinear model (no `trees`) is refused by its booster name.
    trees: Option<Vec<RawTree>>,
}

#[derive(Deserialize)]
struct RawTree {
    left_children: Vec<i64>,
    right_children: Vec<i64>,
    split_indices: Vec<i64>,
    split_conditions: Vec<f64>,
    default_left: Vec<Value>,
    #[serde(default)]
    split_type: Vec<i64>,
}

/// Imports an XGBoost `booster.save_model("x.json")` document as an ensemble-only ranker whose
/// features are the model's `feature_names`, or `f0`, `f1`, ... (XGBoost's own default names)
/// when it has none.
///
/// # Errors
/// [`RankerError::Import`] naming the field of the model file and why (malformed, or a model a
/// ranker cannot represent exactly: multi-class or multi-target, categorical splits, DART,
/// an unknown objective), or the [`validate`] error of the result.
pub fn import_xgboost(bytes: &[u8]) -> Result<Ranker, RankerError> {
    let ranker = build(bytes)?;
    validate(&ranker)?;
    Ok(ranker)
}

/// Imports an XGBoost `booster.save_model("x.ubj")` UBJSON document (XGBoost's default format
/// since 2.1) exactly as [`import_xgboost`] imports the JSON one.
///
/// # Errors
/// As [`import_xgboost`]; bytes that are not UBJSON name the byte offset, and a field of the
/// wrong type or absent names its path.
pub fn import_xgboost_ubj(bytes: &[u8]) -> Result<Ranker, RankerError> {
    let value = super::ubjson::decode(bytes).map_err(|e| ImportError::Binary {
        format: "XGBoost",
        encoding: "UBJSON",
        offset: e.offset,
        message: e.message,
    })?;
    let model: SavedModel = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        XGBOOST.invalid(path, e.into_inner().to_string())
    })?;
    let ranker = build_from(model)?;
    validate(&ranker)?;
    Ok(ranker)
}

fn build(bytes: &[u8]) -> Result<Ranker, ImportError> {
    build_from(serde_json::from_slice(bytes).map_err(|e| XGBOOST.json(&e))?)
}

fn build_from(model: SavedModel) -> Result<Ranker, ImportError> {
    let learner = model.learner;
    let param = &learner.learner_model_param;
    let path = "learner.learner_model_param";
    let num_class = match &param.num_class {
        Some(v) => integer(v, &format!("{path}.num_class"))?,
        None => 0,
    };
    if num_class > 1 {
        return Err(XGBOOST.unsupported(
            format!("{path}.num_class"),
            format!(
                "a multi-class model ({num_class} classes) has one score per class; a ranker \
                 has one output, so only num_class 0 or 1 can be imported"
            ),
        ));
    }
    if let Some(v) = &param.num_target {
        let num_target = integer(v, &format!("{path}.num_target"))?;
        if num_target > 1 {
            return Err(XGBOOST.unsupported(
                format!("{path}.num_target"),
                format!("a multi-target model ({num_target} targets) cannot be one ranker"),
            ));
        }
    }
    // Only a count: with no names, one name per claimed feature is made below, so the claim
    // is bounded before anything is allocated (a 700-byte file could claim 10^12).
    let num_feature = integer(&param.num_feature, &format!("{path}.num_feature"))?;
    let n_features = usize::try_from(num_feature)
        .ok()
        .filter(|&n| n <= MAX_FEATURES)
        .ok_or_else(|| {
            XGBOOST.invalid(
                format!("{path}.num_feature"),
                format!("expected at most {MAX_FEATURES} features, got {num_feature}"),
            )
        })?;
    let features = if learner.feature_names.is_empty() {
        (0..n_features).map(|i| format!("f{i}")).collect()
    } else if learner.feature_names.len() == n_features {
        learner.feature_names
    } else {
        return Err(XGBOOST.invalid(
            "learner.feature_names",
            format!(
                "expected {n_features} names (num_feature), got {}",
                learner.feature_names.len()
            ),
        ));
    };
    check_unique_names(XGBOOST, "learner.feature_names", &features)?;
    let base_score = base_margin(
        &param.base_score,
        &learner.objective.name,
        &format!("{path}.base_score"),
    )?;
    let booster = learner.gradient_booster;
    if booster.name != "gbtree" {
        return Err(XGBOOST.unsupported(
            "learner.gradient_booster.name",
            format!(
                "expected \"gbtree\", got {:?} (DART trees carry weights and gblinear has no \
                 trees)",
                booster.name
            ),
        ));
    }
    let model = booster.model.ok_or_else(|| {
        XGBOOST.invalid(
            "learner.gradient_booster.model",
            "missing in a gbtree booster",
        )
    })?;
    if let Some((t, group)) = model.tree_info.iter().enumerate().find(|(_, g)| **g != 0) {
        return Err(XGBOOST.unsupported(
            format!("learner.gradient_booster.model.tree_info[{t}]"),
            format!("expected output group 0 (one output), got {group}"),
        ));
    }
    let trees = model
        .trees
        .ok_or_else(|| {
            XGBOOST.invalid(
                "learner.gradient_booster.model.trees",
                "missing in a gbtree booster",
            )
        })?
        .iter()
        .enumerate()
        .map(|(t, tree)| {
            convert(
                tree,
                &format!("learner.gradient_booster.model.trees[{t}]"),
                n_features,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ranker_from_trees(features, trees, base_score))
}

/// A non-negative integer written as a JSON number or a string (`"3"`).
fn integer(value: &Value, path: &str) -> Result<u64, ImportError> {
    let parsed = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    parsed.ok_or_else(|| {
        XGBOOST.invalid(
            path,
            format!("expected a non-negative integer, got {value}"),
        )
    })
}

/// `base_score` (a number, `"5E-1"` or `"[4.6E-1]"`) taken through `objective`'s link function
/// into margin space, in f32 like XGBoost's `ObjFunction::ProbToMargin`.
fn base_margin(value: &Value, objective: &str, path: &str) -> Result<f64, ImportError> {
    let bad = |why: &str| XGBOOST.invalid(path, format!("{why}, got {value}"));
    let score: f32 = match value {
        Value::Number(n) => n.as_f64().ok_or_else(|| bad("expected a number"))? as f32,
        Value::String(s) => {
            let inner = s.trim();
            let inner = match inner.strip_prefix('[') {
                Some(rest) => rest
                    .strip_suffix(']')
                    .ok_or_else(|| bad("expected a number or \"[number]\""))?,
                None => inner,
            };
            if inner.contains(',') {
                return Err(XGBOOST.unsupported(
                    path,
                    format!("one base score per target ({s:?}): a ranker has one output"),
                ));
            }
            inner
                .trim()
                .parse::<f32>()
                .map_err(|_| bad("expected a number or \"[number]\""))?
        }
        _ => return Err(bad("expected a number or a string such as \"[4.6E-1]\"")),
    };
    if !score.is_finite() {
        return Err(bad("expected a finite number"));
    }
    let margin = match objective {
        "binary:logistic" | "reg:logistic" | "binary:logitraw" => {
            if !(score > 0.0 && score < 1.0) {
                return Err(bad(&format!(
                    "objective {objective} needs a base score in (0, 1)"
                )));
            }
            -(1.0f32 / score - 1.0).ln()
        }
        "count:poisson" | "reg:gamma" | "reg:tweedie" => {
            if !(score > 0.0) {
                return Err(bad(&format!(
                    "objective {objective} needs a base score > 0"
                )));
            }
            score.ln()
        }
        "reg:squarederror"
        | "reg:linear"
        | "reg:squaredlogerror"
        | "reg:pseudohubererror"
        | "reg:absoluteerror"
        | "reg:quantileerror"
        | "binary:hinge"
        | "rank:ndcg"
        | "rank:pairwise"
        | "rank:map" => score,
        other => {
            return Err(XGBOOST.unsupported(
                "learner.objective.name",
                format!(
                    "objective {other:?}: its link function for base_score is not known here \
                     (known: logistic, Poisson/Gamma/Tweedie, squared-error and ranking \
                     objectives)"
                ),
            ))
        }
    };
    Ok(f64::from(margin))
}

/// Rebuilds one tree in pre-order from the root, so deleted (unreachable) nodes are dropped,
/// checking indices, array lengths and that no node is reached twice.
fn convert(tree: &RawTree, path: &str, n_features: usize) -> Result<Tree, ImportError> {
    let n = tree.left_children.len();
    for (name, len) in [
        ("right_children", tree.right_children.len()),
        ("split_indices", tree.split_indices.len()),
        ("split_conditions", tree.split_conditions.len()),
        ("default_left", tree.default_left.len()),
    ] {
        if len != n {
            return Err(XGBOOST.invalid(
                format!("{path}.{name}"),
                format!("expected {n} entries (as left_children), got {len}"),
            ));
        }
    }
    if n == 0 {
        return Err(XGBOOST.invalid(format!("{path}.left_children"), "a tree needs a root node"));
    }
    if let Some(i) = tree.split_type.iter().position(|&t| t != 0) {
        return Err(XGBOOST.unsupported(
            format!("{path}.split_type[{i}]"),
            "categorical splits cannot be imported (train with numerical features)",
        ));
    }
    let mut nodes: Vec<Node> = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    // (source node, slot in `nodes` of the parent's child index to fill, is-left)
    let mut stack: Vec<(usize, Option<(usize, bool)>)> = vec![(0, None)];
    while let Some((src, parent)) = stack.pop() {
        if std::mem::replace(&mut seen[src], true) {
            return Err(XGBOOST.invalid(
                format!("{path}.left_children"),
                format!("node {src} is reached twice: the nodes do not form a tree"),
            ));
        }
        let id = nodes.len() as u32;
        if let Some((p, is_left)) = parent {
            if let Node::Split(split) = &mut nodes[p] {
                if is_left {
                    split.left = id;
                } else {
                    split.right = id;
                }
            }
        }
        let condition = tree.split_conditions[src] as f32;
        let left = tree.left_children[src];
        if left == -1 {
            nodes.push(Node::Leaf(f64::from(condition)));
            continue;
        }
        let child = |v: i64, name: &str| {
            usize::try_from(v).ok().filter(|&c| c < n).ok_or_else(|| {
                XGBOOST.invalid(
                    format!("{path}.{name}[{src}]"),
                    format!("expected a node index in 0..{n} (or -1 for a leaf), got {v}"),
                )
            })
        };
        let left = child(left, "left_children")?;
        let right = child(tree.right_children[src], "right_children")?;
        let feature = tree.split_indices[src];
        if !(0..n_features as i64).contains(&feature) {
            return Err(XGBOOST.invalid(
                format!("{path}.split_indices[{src}]"),
                format!("expected a feature index in 0..{n_features}, got {feature}"),
            ));
        }
        let default_left = match &tree.default_left[src] {
            Value::Bool(b) => *b,
            Value::Number(v) if v.as_u64() == Some(0) => false,
            Value::Number(v) if v.as_u64() == Some(1) => true,
            other => {
                return Err(XGBOOST.invalid(
                    format!("{path}.default_left[{src}]"),
                    format!("expected a bool or 0/1, got {other}"),
                ))
            }
        };
        let me = nodes.len();
        nodes.push(Node::Split(Split {
            feature: feature as u32,
            decision: Decision::LtF32(condition),
            missing: Missing::Nan,
            default_left,
            left: 0,
            right: 0,
        }));
        // Right pushed first so the left subtree is laid out first (pre-order).
        stack.push((right, Some((me, false))));
        stack.push((left, Some((me, true))));
    }
    Ok(Tree { nodes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(base_score: &str, objective: &str, tree: &str) -> String {
        format!(
            r#"{{"learner":{{"attributes":{{}},"feature_names":[],"feature_types":[],
            "gradient_booster":{{"model":{{"gbtree_model_param":{{"num_parallel_tree":"1",
            "num_trees":"1"}},"iteration_indptr":[0,1],"tree_info":[0],"trees":[{tree}]}},
            "name":"gbtree"}},"learner_model_param":{{"base_score":{base_score},
            "boost_from_average":"1","num_class":"0","num_feature":"2","num_target":"1"}},
            "objective":{{"name":"{objective}"}}}},"version":[3,2,0]}}"#
        )
    }

    /// Root splits feature 1 at 0.5; left is a leaf, right splits feature 0 (default left).
    const TREE: &str = r#"{"left_children":[1,-1,3,-1,-1],"right_children":[2,-1,4,-1,-1],
        "split_indices":[1,0,0,0,0],"split_conditions":[0.5,-0.25,1.5,0.125,0.375],
        "default_left":[0,0,1,0,0],"split_type":[0,0,0,0,0],"base_weights":[0,0,0,0,0],
        "id":0,"tree_param":{"num_nodes":"5"}}"#;

    #[test]
    fn nodes_are_rebuilt_in_pre_order() {
        let ranker = import_xgboost(model("\"5E-1\"", "rank:ndcg", TREE).as_bytes()).unwrap();
        assert_eq!(ranker.features, ["f0", "f1"]);
        let ensemble = ranker.ensemble.unwrap();
        assert_eq!(ensemble.base_score, 0.5);
        let split = |feature, t: f32, default_left, left, right| {
            Node::Split(Split {
                feature,
                decision: Decision::LtF32(t),
                missing: Missing::Nan,
                default_left,
                left,
                right,
            })
        };
        assert_eq!(
            ensemble.trees[0].nodes,
            vec![
                split(1, 0.5, false, 1, 2),
                Node::Leaf(-0.25),
                split(0, 1.5, true, 3, 4),
                Node::Leaf(0.125),
                Node::Leaf(0.375),
            ]
        );
    }

    #[test]
    fn base_score_forms_and_links() {
        let base = |score: &str, objective: &str| {
            import_xgboost(model(score, objective, TREE).as_bytes())
                .unwrap()
                .ensemble
                .unwrap()
                .base_score
        };
        assert_eq!(base("\"[4.6E-1]\"", "rank:pairwise"), f64::from(0.46f32));
        assert_eq!(base("0.25", "reg:squarederror"), 0.25);
        assert_eq!(base("\"5E-1\"", "binary:logistic"), 0.0);
        let logit = base("\"[4.6E-1]\"", "binary:logistic");
        assert!((logit - (0.46f64 / 0.54).ln()).abs() < 1e-6, "{logit}");
        assert_eq!(base("\"[1E0]\"", "count:poisson"), 0.0);
    }

    #[test]
    fn default_left_may_be_bool() {
        let tree = TREE.replace("[0,0,1,0,0]", "[false,false,true,false,false]");
        let ranker = import_xgboost(model("0.5", "rank:ndcg", &tree).as_bytes()).unwrap();
        let Node::Split(s) = &ranker.ensemble.unwrap().trees[0].nodes[2] else {
            panic!("expected a split")
        };
        assert!(s.default_left);
    }

    fn error_of(text: &str) -> String {
        import_xgboost(text.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn rejects_multi_class() {
        let text = model("0.5", "multi:softprob", TREE)
            .replace(r#""num_class":"0""#, r#""num_class":"3""#);
        let err = error_of(&text);
        assert!(
            err.contains("learner_model_param.num_class: a multi-class model (3 classes)"),
            "{err}"
        );
    }

    #[test]
    fn rejects_multi_target_base_scores() {
        let err = error_of(&model("\"[0.5,0.25]\"", "reg:squarederror", TREE));
        assert!(
            err.contains("base_score: one base score per target"),
            "{err}"
        );
    }

    #[test]
    fn rejects_an_unknown_objective() {
        let err = error_of(&model("0.5", "reg:mystery", TREE));
        assert!(
            err.contains("learner.objective.name") && err.contains("reg:mystery"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_base_score_outside_the_link_domain() {
        let err = error_of(&model("1.5", "binary:logistic", TREE));
        assert!(
            err.contains("base_score: objective binary:logistic needs a base score in (0, 1)"),
            "{err}"
        );
    }

    #[test]
    fn rejects_categorical_splits() {
        let err = error_of(&model(
            "0.5",
            "rank:ndcg",
            &TREE.replace(r#""split_type":[0,0,0,0,0]"#, r#""split_type":[0,0,1,0,0]"#),
        ));
        assert!(err.contains("trees[0].split_type[2]: categorical"), "{err}");
    }

    #[test]
    fn rejects_a_child_out_of_range() {
        let err = error_of(&model(
            "0.5",
            "rank:ndcg",
            &TREE.replace("[2,-1,4,-1,-1]", "[2,-1,9,-1,-1]"),
        ));
        assert!(
            err.contains("trees[0].right_children[2]: expected a node index in 0..5"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_cycle() {
        let err = error_of(&model(
            "0.5",
            "rank:ndcg",
            &TREE.replace("[1,-1,3,-1,-1]", "[1,-1,0,-1,-1]"),
        ));
        assert!(err.contains("node 0 is reached twice"), "{err}");
    }

    #[test]
    fn rejects_arrays_of_different_lengths() {
        let err = error_of(&model(
            "0.5",
            "rank:ndcg",
            &TREE.replace("[0,0,1,0,0]", "[0,0,1]"),
        ));
        assert!(
            err.contains("trees[0].default_left: expected 5 entries"),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_feature_index_out_of_range() {
        let err = error_of(&model(
            "0.5",
            "rank:ndcg",
            &TREE.replace("[1,0,0,0,0]", "[1,0,7,0,0]"),
        ));
        assert!(
            err.contains("trees[0].split_indices[2]: expected a feature index in 0..2, got 7"),
            "{err}"
        );
    }

    /// `num_feature` replaced by `claimed` (JSON text); `feature_names` stays empty, so an
    /// import that trusted the claim would make one name per claimed feature.
    fn claiming(claimed: &str) -> String {
        model("0.5", "rank:ndcg", TREE).replace(
            r#""num_feature":"2""#,
            &format!(r#""num_feature":{claimed}"#),
        )
    }

    #[test]
    fn rejects_a_num_feature_past_the_limit_before_making_names() {
        let field = "XGBoost model, learner.learner_model_param.num_feature";
        for claimed in ["1000000000000", "18446744073709551615"] {
            assert_eq!(
                error_of(&claiming(&format!("\"{claimed}\""))),
                format!("{field}: expected at most {MAX_FEATURES} features, got {claimed}")
            );
            assert_eq!(
                error_of(&claiming(claimed)),
                format!("{field}: expected at most {MAX_FEATURES} features, got {claimed}")
            );
        }
        let past = MAX_FEATURES + 1;
        assert_eq!(
            error_of(&claiming(&past.to_string())),
            format!("{field}: expected at most {MAX_FEATURES} features, got {past}")
        );
        for (claimed, shown) in [
            ("\"-1\"", "\"-1\""),
            ("-1", "-1"),
            ("\"18446744073709551616\"", "\"18446744073709551616\""),
            ("1e12", "1000000000000.0"),
        ] {
            assert_eq!(
                error_of(&claiming(claimed)),
                format!("{field}: expected a non-negative integer, got {shown}")
            );
        }
    }

    #[test]
    fn a_num_feature_at_the_limit_imports() {
        let ranker = import_xgboost(claiming(&MAX_FEATURES.to_string()).as_bytes()).unwrap();
        assert_eq!(ranker.features.len(), MAX_FEATURES);
        assert_eq!(
            ranker.features[MAX_FEATURES - 1],
            format!("f{}", MAX_FEATURES - 1)
        );
    }

    #[test]
    fn rejects_dart() {
        let err = error_of(
            &model("0.5", "rank:ndcg", TREE).replace(r#""name":"gbtree""#, r#""name":"dart""#),
        );
        assert!(err.contains("gradient_booster.name"), "{err}");
    }

    fn ubj_fixture() -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/trees/xgbu_logistic.model.ubj");
        std::fs::read(path).unwrap()
    }

    #[test]
    fn ubj_and_json_of_one_document_import_alike() {
        let ubj = ubj_fixture();
        let value = crate::rank::import::ubjson::decode(&ubj).unwrap();
        let json = serde_json::to_vec(&value).unwrap();
        assert_eq!(
            import_xgboost_ubj(&ubj).unwrap(),
            import_xgboost(&json).unwrap()
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
        #[test]
        fn ubj_import_never_panics_on_mutated_models(
            edits in proptest::collection::vec(
                (proptest::prelude::any::<usize>(), proptest::prelude::any::<u8>()), 1..5),
            cut in proptest::prelude::any::<usize>(),
        ) {
            let mut bytes = ubj_fixture();
            for (at, byte) in edits {
                let at = at % bytes.len();
                bytes[at] = byte;
            }
            bytes.truncate(bytes.len() - cut % 64);
            let _ = import_xgboost_ubj(&bytes);
        }
    }

    #[test]
    fn malformed_json_names_line_and_column() {
        let err = error_of("{\"learner\":\n [}");
        assert!(err.starts_with("XGBoost model JSON, line 2"), "{err}");
    }
}
