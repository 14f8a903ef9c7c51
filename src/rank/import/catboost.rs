//! CatBoost `model.save_model(path, format="json")` → [`Ranker`].
//!
//! CatBoost's own prediction rules (1.2's CPU evaluator, `RawFormulaVal`), reproduced here:
//! - A float feature is read as an f32 and compared with each border (an f32; the JSON holds it
//!   widened to a double): the split is *true* when `f32(x) > border`. The ranker's left branch
//!   is the false one, `f32(x) <= border`, written as `lt_f32` with the next f32 above the
//!   border (see [`super::le_f32`]).
//! - A NaN is binarized by the feature's `nan_value_treatment`: `AsTrue` (trained with
//!   `nan_mode="Max"`) makes every split on it true; `AsFalse` (`nan_mode="Min"`) and `AsIs`
//!   make them false (a NaN compares false).
//! - An oblivious tree of depth `d` has one split per level and `2^d` leaves; the leaf index has
//!   bit `i` set when `splits[i]` is true. It becomes a full binary tree whose level `i` tests
//!   `splits[i]`, so the leaf reached is `leaf_values[index]` exactly.
//! - A non-symmetric tree (`grow_policy` Depthwise or Lossguide, written under `trees`) nests
//!   `{"split", "left", "right"}` down to `{"value"}`; `right` is the true branch.
//! - The raw value is `scale · Σ leaves + bias` (`scale_and_bias`). The bias becomes the
//!   ensemble's base score; a scale other than 1 multiplies each leaf instead (exact in f64 up to
//!   one rounding per leaf, 1e-16 relative; a scale of 1 changes nothing).
//!
//! Refused: categorical features (their CTR tables and one-hot values work on CatBoost's hashes
//! of strings, not numbers), text and embedding features, multi-dimensional models (multi-class,
//! multi-target: more than one leaf value per leaf), splits of any type but `FloatFeature`.

use serde::Deserialize;
use serde_json::Value;

use super::{check_unique_names, le_f32, ranker_from_trees, Format, ImportError};
use crate::rank::format::{validate, MAX_FEATURES};
use crate::rank::model::{Missing, Node, Ranker, Split, Tree};
use crate::rank::RankerError;

const CATBOOST: Format = Format("CatBoost");

/// The deepest oblivious tree accepted (CatBoost's own limit is 16); `2^d` leaves are written
/// out in the file, so this only keeps the index arithmetic small.
const MAX_DEPTH: usize = 24;

/// The fields of the JSON model that the import reads; others (`model_info`) are ignored.
#[derive(Deserialize)]
struct Model {
    features_info: FeaturesInfo,
    #[serde(default)]
    oblivious_trees: Option<Vec<ObliviousTree>>,
    #[serde(default)]
    trees: Option<Vec<RawNode>>,
    #[serde(default)]
    scale_and_bias: Option<(f64, Vec<f64>)>,
}

#[derive(Deserialize)]
struct FeaturesInfo {
    #[serde(default)]
    float_features: Vec<FloatFeature>,
    #[serde(default)]
    categorical_features: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    text_features: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    embedding_features: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    ctrs: Vec<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct FloatFeature {
    flat_feature_index: u64,
    #[serde(default)]
    feature_id: String,
    #[serde(default)]
    nan_value_treatment: Option<String>,
}

#[derive(Deserialize)]
struct ObliviousTree {
    leaf_values: Vec<f64>,
    splits: Vec<RawSplit>,
}

#[derive(Deserialize)]
struct RawSplit {
    split_type: String,
    #[serde(default)]
    float_feature_index: Option<u64>,
    #[serde(default)]
    border: Option<f64>,
}

/// A node of a non-symmetric tree: a split with both children, or a leaf `value`.
#[derive(Deserialize)]
struct RawNode {
    #[serde(default)]
    split: Option<RawSplit>,
    #[serde(default)]
    left: Option<Box<RawNode>>,
    #[serde(default)]
    right: Option<Box<RawNode>>,
    #[serde(default)]
    value: Option<Value>,
}

/// Imports a CatBoost JSON model (`save_model(path, format="json")`) as an ensemble-only ranker
/// whose features are the float features in `flat_feature_index` order, named by their
/// `feature_id`, or `f0`, `f1`, ... when it is empty. The score is CatBoost's `RawFormulaVal`.
///
/// # Errors
/// [`RankerError::Import`] naming the field and why (malformed, or a model a ranker cannot
/// represent exactly: categorical, text or embedding features, multi-dimensional leaves, splits
/// other than on float features), or the [`validate`] error of the result.
pub fn import_catboost(bytes: &[u8]) -> Result<Ranker, RankerError> {
    let ranker = build(bytes)?;
    validate(&ranker)?;
    Ok(ranker)
}

/// Per float feature: whether a NaN goes left (the false branch).
struct FloatInfo {
    nan_left: Vec<bool>,
}

fn build(bytes: &[u8]) -> Result<Ranker, ImportError> {
    let model: Model = serde_json::from_slice(bytes).map_err(|e| CATBOOST.json(&e))?;
    let info = &model.features_info;
    for (name, count, why) in [
        (
            "categorical_features",
            info.categorical_features.len(),
            "CatBoost hashes their strings and looks the hashes up in CTR tables",
        ),
        (
            "ctrs",
            info.ctrs.len(),
            "CTR features need CatBoost's tables",
        ),
        ("text_features", info.text_features.len(), "text features"),
        (
            "embedding_features",
            info.embedding_features.len(),
            "embedding features",
        ),
    ] {
        if count > 0 {
            return Err(CATBOOST.unsupported(
                format!("features_info.{name}"),
                format!(
                    "{count} present, which cannot be imported ({why}); only float features \
                     are supported"
                ),
            ));
        }
    }
    let floats = &info.float_features;
    if floats.len() > MAX_FEATURES {
        return Err(CATBOOST.invalid(
            "features_info.float_features",
            format!(
                "expected at most {MAX_FEATURES} features, got {}",
                floats.len()
            ),
        ));
    }
    let mut features = Vec::with_capacity(floats.len());
    let mut nan_left = Vec::with_capacity(floats.len());
    for (i, f) in floats.iter().enumerate() {
        let path = format!("features_info.float_features[{i}]");
        if f.flat_feature_index != i as u64 {
            return Err(CATBOOST.invalid(
                format!("{path}.flat_feature_index"),
                format!(
                    "expected {i} (float features in flat order, no other features), got {}",
                    f.flat_feature_index
                ),
            ));
        }
        features.push(if f.feature_id.is_empty() {
            format!("f{i}")
        } else {
            f.feature_id.clone()
        });
        nan_left.push(match f.nan_value_treatment.as_deref() {
            None | Some("AsIs") | Some("AsFalse") => true,
            Some("AsTrue") => false,
            Some(other) => {
                return Err(CATBOOST.invalid(
                    format!("{path}.nan_value_treatment"),
                    format!("expected \"AsIs\", \"AsFalse\" or \"AsTrue\", got {other:?}"),
                ))
            }
        });
    }
    check_unique_names(
        CATBOOST,
        "features_info.float_features[].feature_id",
        &features,
    )?;
    let floats = FloatInfo { nan_left };
    let (scale, bias) = match &model.scale_and_bias {
        None => (1.0, 0.0),
        Some((scale, bias)) => {
            let bias = match bias.as_slice() {
                [] => 0.0,
                [b] => *b,
                more => {
                    return Err(CATBOOST.unsupported(
                        "scale_and_bias[1]",
                        format!(
                            "{} biases (one per dimension): a ranker has one output",
                            more.len()
                        ),
                    ))
                }
            };
            if !scale.is_finite() || !bias.is_finite() {
                return Err(CATBOOST.invalid(
                    "scale_and_bias",
                    format!("expected finite numbers, got scale {scale} and bias {bias}"),
                ));
            }
            (*scale, bias)
        }
    };
    let trees = match (&model.oblivious_trees, &model.trees) {
        (Some(trees), None) => trees
            .iter()
            .enumerate()
            .map(|(t, tree)| oblivious(tree, &format!("oblivious_trees[{t}]"), &floats, scale))
            .collect::<Result<Vec<_>, _>>()?,
        (None, Some(trees)) => trees
            .iter()
            .enumerate()
            .map(|(t, root)| {
                let mut nodes = Vec::new();
                nested(root, &format!("trees[{t}]"), &floats, scale, &mut nodes)?;
                Ok(Tree { nodes })
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => {
            return Err(CATBOOST.invalid(
                "(top level)",
                "expected exactly one of \"oblivious_trees\" (symmetric trees) or \"trees\" \
                 (Depthwise / Lossguide trees)",
            ))
        }
    };
    Ok(ranker_from_trees(features, trees, bias))
}

/// The split of `raw` as a ranker split (children to be filled in): left is CatBoost's false
/// branch, `f32(x) <= border`.
fn split(raw: &RawSplit, path: &str, floats: &FloatInfo) -> Result<Split, ImportError> {
    if raw.split_type != "FloatFeature" {
        return Err(CATBOOST.unsupported(
            format!("{path}.split_type"),
            format!(
                "{:?} splits cannot be imported; only \"FloatFeature\" splits are supported",
                raw.split_type
            ),
        ));
    }
    let n = floats.nan_left.len();
    let feature = raw
        .float_feature_index
        .ok_or_else(|| CATBOOST.invalid(format!("{path}.float_feature_index"), "missing"))?;
    let feature = usize::try_from(feature)
        .ok()
        .filter(|&f| f < n)
        .ok_or_else(|| {
            CATBOOST.invalid(
                format!("{path}.float_feature_index"),
                format!("expected a float feature index in 0..{n}, got {feature}"),
            )
        })?;
    let border = raw
        .border
        .ok_or_else(|| CATBOOST.invalid(format!("{path}.border"), "missing"))?;
    // CatBoost reads the border as a float.
    let border32 = border as f32;
    if !border32.is_finite() {
        return Err(CATBOOST.invalid(
            format!("{path}.border"),
            format!("expected a number within the f32 range, got {border}"),
        ));
    }
    Ok(Split {
        feature: feature as u32,
        decision: le_f32(border32),
        missing: Missing::Nan,
        default_left: floats.nan_left[feature],
        left: 0,
        right: 0,
    })
}

fn leaf(value: f64, scale: f64, path: &str) -> Result<Node, ImportError> {
    let v = if scale == 1.0 { value } else { value * scale };
    if v.is_finite() {
        Ok(Node::Leaf(v))
    } else {
        Err(CATBOOST.invalid(path, format!("expected a finite leaf value, got {v}")))
    }
}

/// An oblivious tree as a full binary tree in breadth-first order: level `l` holds `2^l` nodes,
/// the node at position `p` of level `l` having taken the decisions of bits `0..l` of `p`, so a
/// leaf's position is CatBoost's leaf index.
fn oblivious(
    tree: &ObliviousTree,
    path: &str,
    floats: &FloatInfo,
    scale: f64,
) -> Result<Tree, ImportError> {
    let depth = tree.splits.len();
    if depth > MAX_DEPTH {
        return Err(CATBOOST.unsupported(
            format!("{path}.splits"),
            format!("depth {depth}: at most {MAX_DEPTH} levels are supported"),
        ));
    }
    let leaves = 1usize << depth;
    let n_values = tree.leaf_values.len();
    if n_values != leaves {
        return Err(if n_values > leaves && n_values % leaves == 0 {
            CATBOOST.unsupported(
                format!("{path}.leaf_values"),
                format!(
                    "{} values per leaf (a multi-class or multi-target model): a ranker has one \
                     output",
                    n_values / leaves
                ),
            )
        } else {
            CATBOOST.invalid(
                format!("{path}.leaf_values"),
                format!("expected 2^{depth} = {leaves} values for {depth} splits, got {n_values}"),
            )
        });
    }
    let splits = tree
        .splits
        .iter()
        .enumerate()
        .map(|(i, s)| split(s, &format!("{path}.splits[{i}]"), floats))
        .collect::<Result<Vec<_>, _>>()?;
    let mut nodes = Vec::with_capacity(2 * leaves - 1);
    for (level, s) in splits.iter().enumerate() {
        let width = 1u32 << level;
        // Level `level` starts at index width - 1; the next level at 2·width - 1.
        let next = 2 * width - 1;
        for p in 0..width {
            nodes.push(Node::Split(Split {
                left: next + p,
                right: next + p + width,
                ..s.clone()
            }));
        }
    }
    for (i, v) in tree.leaf_values.iter().enumerate() {
        nodes.push(leaf(*v, scale, &format!("{path}.leaf_values[{i}]"))?);
    }
    Ok(Tree { nodes })
}

/// Appends `node` and its subtree in pre-order; returns its index. Nesting depth is bounded by
/// the JSON reader (128 levels).
fn nested(
    node: &RawNode,
    path: &str,
    floats: &FloatInfo,
    scale: f64,
    nodes: &mut Vec<Node>,
) -> Result<u32, ImportError> {
    let id = nodes.len();
    let Some(raw) = &node.split else {
        let value = match &node.value {
            Some(Value::Number(n)) => n.as_f64(),
            Some(Value::Array(values)) if values.len() > 1 => {
                return Err(CATBOOST.unsupported(
                    format!("{path}.value"),
                    format!(
                        "{} values per leaf (a multi-class or multi-target model): a ranker \
                         has one output",
                        values.len()
                    ),
                ))
            }
            Some(Value::Array(values)) => values.first().and_then(Value::as_f64),
            _ => None,
        }
        .ok_or_else(|| {
            CATBOOST.invalid(
                path,
                "a node needs \"split\" (with \"left\" and \"right\") or a numeric \"value\"",
            )
        })?;
        nodes.push(leaf(value, scale, &format!("{path}.value"))?);
        return Ok(id as u32);
    };
    let mut s = split(raw, &format!("{path}.split"), floats)?;
    let missing =
        |name: &str| CATBOOST.invalid(format!("{path}.{name}"), "missing in a split node");
    let left = node.left.as_deref().ok_or_else(|| missing("left"))?;
    let right = node.right.as_deref().ok_or_else(|| missing("right"))?;
    nodes.push(Node::Leaf(0.0)); // replaced once the children have indices
    s.left = nested(left, &format!("{path}.left"), floats, scale, nodes)?;
    s.right = nested(right, &format!("{path}.right"), floats, scale, nodes)?;
    nodes[id] = Node::Split(s);
    Ok(id as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::cpu::score_doc_reference;
    use crate::rank::model::Decision;

    fn model(trees: &str, nan: &str) -> String {
        format!(
            r#"{{"features_info":{{"float_features":[
              {{"borders":[0.5],"feature_id":"","feature_index":0,"flat_feature_index":0,
                "has_nans":true,"nan_value_treatment":"{nan}"}},
              {{"borders":[1.5],"feature_id":"","feature_index":1,"flat_feature_index":1,
                "has_nans":false,"nan_value_treatment":"AsIs"}}]}},
              "model_info":{{"params":{{"loss_function":{{"type":"YetiRank"}}}}}},
              {trees},"scale_and_bias":[1,[0.25]]}}"#
        )
    }

    /// splits[0] on feature 0 at 0.5 (bit 0), splits[1] on feature 1 at 1.5 (bit 1).
    const OBLIVIOUS: &str = r#""oblivious_trees":[{"leaf_values":[1,2,4,8],"leaf_weights":[1,1,1,1],
        "splits":[{"border":0.5,"float_feature_index":0,"split_index":0,"split_type":"FloatFeature"},
                  {"border":1.5,"float_feature_index":1,"split_index":1,"split_type":"FloatFeature"}]}]"#;

    #[test]
    fn oblivious_leaf_index_bits_follow_the_split_order() {
        let ranker = import_catboost(model(OBLIVIOUS, "AsFalse").as_bytes()).unwrap();
        assert_eq!(ranker.features, ["f0", "f1"]);
        let score = |a: f64, b: f64| score_doc_reference(&ranker, &[a, b]);
        // value > border sets the bit; the bias is added.
        assert_eq!(score(0.0, 0.0), 1.25);
        assert_eq!(score(0.6, 0.0), 2.25);
        assert_eq!(score(0.0, 2.0), 4.25);
        assert_eq!(score(0.6, 2.0), 8.25);
        // Exactly on the border is not greater: the bit stays 0.
        assert_eq!(score(0.5, 1.5), 1.25);
        // An f64 just above the border rounds onto it as f32: still not greater.
        assert_eq!(score(0.5 + 1e-12, 1.5), 1.25);
        // AsFalse: NaN is not greater.
        assert_eq!(score(f64::NAN, 2.0), 4.25);
        let tree = &ranker.ensemble.unwrap().trees[0];
        assert_eq!(tree.nodes.len(), 7);
        let Node::Split(root) = &tree.nodes[0] else {
            panic!("root is a split")
        };
        assert_eq!(
            root.decision,
            Decision::LtF32(f32::from_bits(0.5f32.to_bits() + 1))
        );
    }

    #[test]
    fn nan_as_true_sets_the_bit() {
        let ranker = import_catboost(model(OBLIVIOUS, "AsTrue").as_bytes()).unwrap();
        assert_eq!(score_doc_reference(&ranker, &[f64::NAN, 0.0]), 2.25);
    }

    #[test]
    fn scale_multiplies_the_leaves() {
        let text = model(OBLIVIOUS, "AsIs").replace("[1,[0.25]]", "[0.5,[0.25]]");
        let ranker = import_catboost(text.as_bytes()).unwrap();
        assert_eq!(score_doc_reference(&ranker, &[0.6, 2.0]), 4.25);
    }

    #[test]
    fn non_symmetric_trees_go_right_when_greater() {
        let trees = r#""trees":[{"split":{"border":0.5,"float_feature_index":0,"split_index":0,
            "split_type":"FloatFeature"},"left":{"value":-1,"weight":3},
            "right":{"split":{"border":1.5,"float_feature_index":1,"split_index":1,
              "split_type":"FloatFeature"},"left":{"value":2,"weight":1},"right":{"value":3,"weight":1}}}]"#;
        let ranker = import_catboost(model(trees, "AsTrue").as_bytes()).unwrap();
        let score = |a: f64, b: f64| score_doc_reference(&ranker, &[a, b]);
        assert_eq!(score(0.5, 9.0), -0.75);
        assert_eq!(score(0.7, 1.5), 2.25);
        assert_eq!(score(0.7, 1.6), 3.25);
        assert_eq!(score(f64::NAN, 1.6), 3.25);
    }

    fn error_of(text: &str) -> String {
        import_catboost(text.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn refuses_categorical_features() {
        let text = model(OBLIVIOUS, "AsIs").replace(
            r#""features_info":{"#,
            r#""features_info":{"categorical_features":[{"feature_index":0,"flat_feature_index":2}],"#,
        );
        let err = error_of(&text);
        assert!(
            err.starts_with("CatBoost model, features_info.categorical_features: 1 present"),
            "{err}"
        );
    }

    #[test]
    fn refuses_multi_dimensional_leaves() {
        let text = model(OBLIVIOUS, "AsIs").replace("[1,2,4,8]", "[1,2,4,8,1,2,4,8,1,2,4,8]");
        let err = error_of(&text);
        assert!(
            err.contains("oblivious_trees[0].leaf_values: 3 values per leaf"),
            "{err}"
        );
        let err = error_of(&model(OBLIVIOUS, "AsIs").replace("[1,2,4,8]", "[1,2,4]"));
        assert!(
            err.contains("expected 2^2 = 4 values for 2 splits, got 3"),
            "{err}"
        );
    }

    #[test]
    fn refuses_other_split_types_and_bad_indices() {
        let text = model(OBLIVIOUS, "AsIs").replacen("FloatFeature", "OnlineCtr", 1);
        let err = error_of(&text);
        assert!(
            err.contains("oblivious_trees[0].splits[0].split_type: \"OnlineCtr\" splits"),
            "{err}"
        );
        let text = model(OBLIVIOUS, "AsIs").replace(
            r#""float_feature_index":1,"split_index":1"#,
            r#""float_feature_index":7,"split_index":1"#,
        );
        let err = error_of(&text);
        assert!(
            err.contains(
                "splits[1].float_feature_index: expected a float feature index in 0..2, got 7"
            ),
            "{err}"
        );
    }

    #[test]
    fn refuses_a_model_without_trees() {
        let err = error_of(&model(r#""x":1"#, "AsIs"));
        assert!(
            err.contains("expected exactly one of \"oblivious_trees\""),
            "{err}"
        );
        let err = error_of(&model(OBLIVIOUS, "Weird"));
        assert!(
            err.contains("nan_value_treatment: expected \"AsIs\""),
            "{err}"
        );
    }

    /// A byte that often keeps the JSON valid (a digit, sign, bracket), else any byte.
    fn json_byte() -> impl proptest::strategy::Strategy<Value = u8> {
        use proptest::prelude::*;
        prop_oneof![
            proptest::sample::select(b"0123456789-.e[]{},:\"".to_vec()),
            any::<u8>(),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Mutated models are imported or refused with an error, never a panic.
        #[test]
        fn mutated_models_never_panic(
            edits in proptest::collection::vec((0usize..4096, json_byte()), 1..8),
            cut in 0usize..4096,
        ) {
            let nested = r#""trees":[{"split":{"border":0.5,"float_feature_index":0,
                "split_type":"FloatFeature"},"left":{"value":-1},"right":{"value":[2]}}]"#;
            for original in [model(OBLIVIOUS, "AsTrue"), model(nested, "AsIs")] {
                let mut bytes = original.into_bytes();
                for &(at, byte) in &edits {
                    let n = bytes.len();
                    bytes[at % n] = byte;
                }
                bytes.truncate(cut.max(1).min(bytes.len()));
                if let Err(e) = import_catboost(&bytes) {
                    proptest::prop_assert!(!e.to_string().is_empty());
                }
            }
        }
    }
}
