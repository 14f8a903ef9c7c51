//! LightGBM `dump_model()` JSON → [`Ranker`], and the tree builder (`build_tree`) and header
//! checks (`check_header`) that the text model's import ([`super::lightgbm_text`]) shares, so
//! that both formats follow the one reading of LightGBM's rules below.
//!
//! LightGBM's own prediction rules (4.x `Tree::NumericalDecision`, `Tree::CategoricalDecision`,
//! and the C API's dense-row reader), reproduced here:
//! - Before any tree sees a row, a value with `|x| <= kZeroThreshold` (the float `1e-35f`,
//!   widened: 1.0000000180025095e-35) is read as exactly `0.0`; NaN is kept.
//! - Numerical split (`decision_type` `<=`): NaN becomes `0.0` unless `missing_type` is `NaN`;
//!   then the value goes the `default_left` way when `missing_type` is `Zero` and it is zero, or
//!   `missing_type` is `NaN` and it is NaN; otherwise left when `x <= threshold` (f64).
//! - Categorical split (`decision_type` `==`, `threshold` `"a||b||c"`): NaN goes right; else the
//!   category is `x` truncated to an integer, negative goes right, and left when it is listed.
//! - Leaf values are already multiplied by the tree's `shrinkage`; the raw score is their sum
//!   in tree order (there is no separate base score: `boost_from_average` is in the first tree).
//!
//! The ranker's `le_f64` decision compares the value as given, without the zero read, so a
//! threshold inside (−1e-35f, 1e-35f) is moved to the equivalent one outside it (see
//! [`numerical_threshold`]); every other threshold is kept bit for bit.

use serde::Deserialize;
use serde_json::Value;

use super::{check_unique_names, ranker_from_trees, Format, ImportError};
use crate::rank::cpu::ZERO_THRESHOLD;
use crate::rank::format::validate;
use crate::rank::model::{Decision, FeatureIdx, Missing, Node, Ranker, Split, Tree};
use crate::rank::RankerError;

const LIGHTGBM: Format = Format("LightGBM");

/// The fields of `dump_model()` JSON that the import reads; others are ignored.
#[derive(Deserialize)]
struct Dump {
    num_class: u32,
    num_tree_per_iteration: u32,
    max_feature_idx: i64,
    feature_names: Vec<String>,
    #[serde(default)]
    average_output: bool,
    tree_info: Vec<TreeInfo>,
}

#[derive(Deserialize)]
struct TreeInfo {
    tree_structure: RawNode,
}

/// A node of `tree_structure`: a split when `split_feature` is present, else a leaf.
#[derive(Deserialize)]
struct RawNode {
    split_feature: Option<i64>,
    threshold: Option<Value>,
    decision_type: Option<String>,
    default_left: Option<bool>,
    missing_type: Option<String>,
    left_child: Option<Box<RawNode>>,
    right_child: Option<Box<RawNode>>,
    leaf_value: Option<f64>,
    /// Present (with `leaf_features`, `leaf_const`) only in linear-tree models.
    leaf_coeff: Option<serde::de::IgnoredAny>,
}

/// Imports a LightGBM `booster.dump_model()` JSON document as an ensemble-only ranker whose
/// features are the model's `feature_names` (LightGBM writes `Column_i` when it had none).
///
/// # Errors
/// [`RankerError::Import`] naming the field of the model file and why (malformed, or a model a
/// ranker cannot represent exactly: multi-class, linear trees, averaged output), or the
/// [`validate`] error of the result.
pub fn import_lightgbm(bytes: &[u8]) -> Result<Ranker, RankerError> {
    let ranker = build(bytes)?;
    validate(&ranker)?;
    Ok(ranker)
}

fn build(bytes: &[u8]) -> Result<Ranker, ImportError> {
    let dump: Dump = serde_json::from_slice(bytes).map_err(|e| LIGHTGBM.json(&e))?;
    let header = Header {
        num_class: i64::from(dump.num_class),
        num_tree_per_iteration: i64::from(dump.num_tree_per_iteration),
        max_feature_idx: dump.max_feature_idx,
        feature_names: dump.feature_names,
        average_output: dump.average_output,
    };
    let features = check_header(LIGHTGBM, header)?;
    let trees = dump
        .tree_info
        .iter()
        .enumerate()
        .map(|(t, info)| {
            let path = format!("tree_info[{t}].tree_structure");
            build_tree(
                LIGHTGBM,
                features.len(),
                (&info.tree_structure, path),
                read_json_node,
            )
        })
        .collect::<Result<Vec<_>, ImportError>>()?;
    Ok(ranker_from_trees(features, trees, 0.0))
}

/// The model-level fields both LightGBM formats carry, under the same names.
pub(super) struct Header {
    pub(super) num_class: i64,
    pub(super) num_tree_per_iteration: i64,
    pub(super) max_feature_idx: i64,
    pub(super) feature_names: Vec<String>,
    pub(super) average_output: bool,
}

/// Refuses what a ranker cannot represent (several outputs, averaged trees) and checks the
/// feature names; returns them.
pub(super) fn check_header(format: Format, header: Header) -> Result<Vec<String>, ImportError> {
    if header.num_class != 1 {
        return Err(format.unsupported(
            "num_class",
            format!(
                "a multi-class model ({} classes) has one score per class; a ranker has one \
                 output, so only num_class = 1 can be imported",
                header.num_class
            ),
        ));
    }
    if header.num_tree_per_iteration != 1 {
        return Err(format.unsupported(
            "num_tree_per_iteration",
            format!(
                "expected 1 (one output), got {}: multi-output models cannot be imported",
                header.num_tree_per_iteration
            ),
        ));
    }
    if header.average_output {
        return Err(format.unsupported(
            "average_output",
            "a random-forest model (average_output = true) averages its trees; only summed \
             ensembles (gbdt, goss, dart) can be imported",
        ));
    }
    let n_features = header.feature_names.len();
    // Not `max_feature_idx + 1`: the file's i64::MAX would overflow.
    if header.max_feature_idx != n_features as i64 - 1 {
        return Err(format.invalid(
            "max_feature_idx",
            format!(
                "expected {} (feature_names has {n_features} names), got {}",
                n_features as i64 - 1,
                header.max_feature_idx
            ),
        ));
    }
    check_unique_names(format, "feature_names", &header.feature_names)?;
    Ok(header.feature_names)
}

/// A split's rule as LightGBM states it, before it becomes the ranker's [`Decision`].
pub(super) enum Rule {
    /// `decision_type` `<=` (text: bit 0 clear).
    Numerical {
        threshold: f64,
        missing: Missing,
        default_left: bool,
    },
    /// `decision_type` `==` (text: bit 0 set): the categories that go left.
    Categorical(Vec<u32>),
}

/// One LightGBM node as either format reads it; `C` names a child in that format.
pub(super) enum LgbNode<C> {
    Leaf(f64),
    Split {
        feature: i64,
        /// Where `feature` is in the file, for the error when it is out of range.
        feature_path: String,
        rule: Rule,
        left: C,
        right: C,
    },
}

/// Lays out the tree under `root` in pre-order, turning LightGBM's rules into the ranker's
/// (see the module docs). `read` turns a child reference into its node; it refuses nodes
/// reached twice where the format could express that.
pub(super) fn build_tree<C>(
    format: Format,
    n_features: usize,
    root: C,
    mut read: impl FnMut(C) -> Result<LgbNode<C>, ImportError>,
) -> Result<Tree, ImportError> {
    let mut nodes = Vec::new();
    // (node, slot in `nodes` of the parent and whether this is its left child)
    let mut stack = vec![(root, None)];
    while let Some((src, parent)) = stack.pop() {
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
        match read(src)? {
            LgbNode::Leaf(value) => nodes.push(Node::Leaf(value)),
            LgbNode::Split {
                feature,
                feature_path,
                rule,
                left,
                right,
            } => {
                if !(0..n_features as i64).contains(&feature) {
                    return Err(format.invalid(
                        feature_path,
                        format!("expected a feature index in 0..{n_features}, got {feature}"),
                    ));
                }
                let (decision, missing, default_left) = match rule {
                    Rule::Numerical {
                        threshold,
                        missing,
                        default_left,
                    } => (
                        Decision::LeF64(numerical_threshold(threshold)),
                        missing,
                        default_left,
                    ),
                    Rule::Categorical(mut set) => {
                        set.sort_unstable();
                        set.dedup();
                        // NaN goes right whatever missing_type says (LightGBM 4
                        // CategoricalDecision).
                        (Decision::In(set), Missing::Nan, false)
                    }
                };
                let me = nodes.len();
                nodes.push(Node::Split(Split {
                    feature: feature as FeatureIdx,
                    decision,
                    missing,
                    default_left,
                    left: 0,
                    right: 0,
                }));
                // Right pushed first so the left subtree is laid out first (pre-order).
                stack.push((right, Some((me, false))));
                stack.push((left, Some((me, true))));
            }
        }
    }
    Ok(Tree { nodes })
}

/// A `dump_model()` node and its path.
fn read_json_node(
    (node, path): (&RawNode, String),
) -> Result<LgbNode<(&RawNode, String)>, ImportError> {
    let Some(feature) = node.split_feature else {
        if node.leaf_coeff.is_some() {
            return Err(LIGHTGBM.unsupported(
                format!("{path}.leaf_coeff"),
                "linear trees (linear_tree = true) have a linear model per leaf; only \
                 constant leaves can be imported",
            ));
        }
        let value = node.leaf_value.ok_or_else(|| {
            LIGHTGBM.invalid(
                &path,
                "a node needs split_feature (a split) or leaf_value (a leaf), it has neither",
            )
        })?;
        return Ok(LgbNode::Leaf(value));
    };
    let field = |name: &str| format!("{path}.{name}");
    let missing_field = |name: &str| LIGHTGBM.invalid(field(name), "missing in a split node");
    let decision_type = node
        .decision_type
        .as_deref()
        .ok_or_else(|| missing_field("decision_type"))?;
    let threshold = node
        .threshold
        .as_ref()
        .ok_or_else(|| missing_field("threshold"))?;
    let rule = match decision_type {
        "<=" => {
            let missing = match node.missing_type.as_deref() {
                Some("None") => Missing::None,
                Some("Zero") => Missing::Zero,
                Some("NaN") => Missing::Nan,
                Some(other) => {
                    return Err(LIGHTGBM.invalid(
                        field("missing_type"),
                        format!("expected \"None\", \"Zero\" or \"NaN\", got {other:?}"),
                    ))
                }
                None => return Err(missing_field("missing_type")),
            };
            let default_left = node
                .default_left
                .ok_or_else(|| missing_field("default_left"))?;
            let threshold = threshold.as_f64().ok_or_else(|| {
                LIGHTGBM.invalid(
                    field("threshold"),
                    format!("expected a number for a \"<=\" split, got {threshold}"),
                )
            })?;
            Rule::Numerical {
                threshold,
                missing,
                default_left,
            }
        }
        "==" => {
            let text = threshold.as_str().ok_or_else(|| {
                LIGHTGBM.invalid(
                    field("threshold"),
                    format!("expected a category list like \"1||4||6\", got {threshold}"),
                )
            })?;
            Rule::Categorical(categories(text, &field("threshold"))?)
        }
        other => {
            return Err(LIGHTGBM.invalid(
                field("decision_type"),
                format!("expected \"<=\" or \"==\", got {other:?}"),
            ))
        }
    };
    let left = node
        .left_child
        .as_deref()
        .ok_or_else(|| missing_field("left_child"))?;
    let right = node
        .right_child
        .as_deref()
        .ok_or_else(|| missing_field("right_child"))?;
    Ok(LgbNode::Split {
        feature,
        feature_path: field("split_feature"),
        rule,
        left: (left, field("left_child")),
        right: (right, field("right_child")),
    })
}

/// The threshold `t'` for which `x <= t'` decides as LightGBM's `zero(x) <= t` does, where
/// `zero` reads `|x| <= ZERO_THRESHOLD` as `0.0`. Only `t` in `[-Z, Z)` needs moving: for `t`
/// in `[0, Z)` every zero-read value goes left, as does everything up to `Z`, so `t' = Z`; for
/// `t` in `[-Z, 0)` every zero-read value goes right, so `t'` is the double just below `-Z`.
pub fn numerical_threshold(t: f64) -> f64 {
    if (0.0..ZERO_THRESHOLD).contains(&t) {
        ZERO_THRESHOLD
    } else if (-ZERO_THRESHOLD..0.0).contains(&t) {
        // For a negative double, the next bit pattern up is the next value down.
        f64::from_bits((-ZERO_THRESHOLD).to_bits() + 1)
    } else {
        t
    }
}

/// Parses a categorical split's `"a||b||c"`.
fn categories(text: &str, path: &str) -> Result<Vec<u32>, ImportError> {
    text.split("||")
        .map(|part| {
            part.trim().parse::<u32>().map_err(|_| {
                LIGHTGBM.invalid(
                    path,
                    format!(
                        "expected non-negative integer categories separated by \"||\", got \
                         {part:?} in {text:?}"
                    ),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The naive form of LightGBM's numerical rule, zero read included.
    fn lightgbm_goes_left(x: f64, t: f64) -> bool {
        let x = if x.abs() <= ZERO_THRESHOLD { 0.0 } else { x };
        x <= t
    }

    #[test]
    fn moved_thresholds_decide_as_lightgbm_does() {
        let z = ZERO_THRESHOLD;
        let below = |v: f64| {
            if v > 0.0 {
                f64::from_bits(v.to_bits() - 1)
            } else {
                f64::from_bits(v.to_bits() + 1)
            }
        };
        let xs = [
            0.0,
            -0.0,
            z,
            -z,
            below(z),
            below(-z),
            1e-36,
            -1e-36,
            1e-35,
            -1e-35,
            2e-35,
            -2e-35,
            1.0,
            -1.0,
        ];
        let ts = [
            0.0,
            -0.0,
            z,
            -z,
            1e-36,
            -1e-36,
            1e-35,
            -1e-35,
            below(z),
            below(-z),
            2e-35,
            -2e-35,
            0.5,
            -0.5,
        ];
        for t in ts {
            for x in xs {
                assert_eq!(
                    x <= numerical_threshold(t),
                    lightgbm_goes_left(x, t),
                    "x = {x:e}, t = {t:e}"
                );
            }
        }
        assert_eq!(numerical_threshold(0.25).to_bits(), 0.25f64.to_bits());
        assert_eq!(numerical_threshold(-z), below(-z));
    }

    /// Values around the zero threshold, in the ranges where the move matters.
    fn near_zero() -> impl proptest::strategy::Strategy<Value = f64> {
        use proptest::prelude::*;
        prop_oneof![
            (-3e-35f64..3e-35),
            (-1e-300f64..1e-300),
            Just(ZERO_THRESHOLD),
            Just(-ZERO_THRESHOLD),
            Just(0.0),
            Just(-0.0),
            any::<f64>().prop_filter("finite", |v| v.is_finite()),
        ]
    }

    proptest::proptest! {
        #[test]
        fn moved_thresholds_decide_as_lightgbm_does_everywhere(t in near_zero(), x in near_zero()) {
            proptest::prop_assert_eq!(x <= numerical_threshold(t), lightgbm_goes_left(x, t));
        }
    }

    fn leaf(v: f64) -> String {
        format!(r#"{{"leaf_index":0,"leaf_value":{v},"leaf_weight":1,"leaf_count":1}}"#)
    }

    fn dump(tree: &str) -> String {
        format!(
            r#"{{"name":"tree","version":"v4","num_class":1,"num_tree_per_iteration":1,
            "label_index":0,"max_feature_idx":1,"objective":"lambdarank",
            "feature_names":["a","b"],"extra":{{"ignored":true}},
            "tree_info":[{{"tree_index":0,"num_leaves":2,"num_cat":0,"shrinkage":0.1,
            "tree_structure":{tree}}}]}}"#
        )
    }

    fn split(feature: i64, decision: &str, threshold: &str, missing: &str) -> String {
        format!(
            r#"{{"split_index":0,"split_feature":{feature},"threshold":{threshold},
            "decision_type":"{decision}","default_left":true,"missing_type":"{missing}",
            "internal_value":0,"left_child":{},"right_child":{}}}"#,
            leaf(-1.5),
            leaf(2.5)
        )
    }

    #[test]
    fn a_split_and_its_leaves_become_a_node_array() {
        let ranker = import_lightgbm(dump(&split(1, "<=", "0.5", "Zero")).as_bytes()).unwrap();
        assert_eq!(ranker.features, ["a", "b"]);
        assert!(ranker.inputs.is_empty() && ranker.layers.is_empty());
        let ensemble = ranker.ensemble.unwrap();
        assert_eq!(ensemble.base_score, 0.0);
        assert_eq!(
            ensemble.trees[0].nodes,
            vec![
                Node::Split(Split {
                    feature: 1,
                    decision: Decision::LeF64(0.5),
                    missing: Missing::Zero,
                    default_left: true,
                    left: 1,
                    right: 2,
                }),
                Node::Leaf(-1.5),
                Node::Leaf(2.5),
            ]
        );
    }

    #[test]
    fn categorical_lists_are_sorted_and_nan_goes_right() {
        let ranker =
            import_lightgbm(dump(&split(0, "==", r#""7||1||4||1""#, "None")).as_bytes()).unwrap();
        let Node::Split(s) = &ranker.ensemble.unwrap().trees[0].nodes[0] else {
            panic!("expected a split at the root")
        };
        assert_eq!(s.decision, Decision::In(vec![1, 4, 7]));
        assert_eq!((s.missing, s.default_left), (Missing::Nan, false));
    }

    #[test]
    fn a_single_leaf_tree_is_one_leaf() {
        let ranker = import_lightgbm(dump(r#"{"leaf_value":0.25}"#).as_bytes()).unwrap();
        assert_eq!(
            ranker.ensemble.unwrap().trees[0].nodes,
            vec![Node::Leaf(0.25)]
        );
    }

    fn error_of(text: &str) -> String {
        import_lightgbm(text.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn rejects_a_feature_index_out_of_range() {
        let err = error_of(&dump(&split(2, "<=", "0.5", "NaN")));
        assert!(
            err.contains("tree_info[0].tree_structure.split_feature"),
            "{err}"
        );
        assert!(err.contains("0..2, got 2"), "{err}");
    }

    #[test]
    fn rejects_an_unknown_decision_type() {
        let err = error_of(&dump(&split(0, "<", "0.5", "NaN")));
        assert!(err.contains("tree_structure.decision_type"), "{err}");
    }

    #[test]
    fn rejects_an_unknown_missing_type() {
        let err = error_of(&dump(&split(0, "<=", "0.5", "Inf")));
        assert!(err.contains("tree_structure.missing_type"), "{err}");
    }

    #[test]
    fn rejects_a_bad_category_list() {
        let err = error_of(&dump(&split(0, "==", r#""1||-2""#, "NaN")));
        assert!(
            err.contains("tree_structure.threshold") && err.contains("\"-2\""),
            "{err}"
        );
    }

    #[test]
    fn rejects_a_string_threshold_on_a_numerical_split() {
        let err = error_of(&dump(&split(0, "<=", r#""0.5""#, "NaN")));
        assert!(err.contains("tree_structure.threshold"), "{err}");
    }

    #[test]
    fn rejects_a_node_that_is_neither_split_nor_leaf() {
        let err = error_of(&dump(r#"{"internal_value":1}"#));
        assert!(err.contains("tree_info[0].tree_structure:"), "{err}");
    }

    #[test]
    fn rejects_a_split_without_a_child() {
        let text = dump(&split(0, "<=", "0.5", "NaN")).replace("\"right_child\"", "\"other\"");
        let err = error_of(&text);
        assert!(err.contains("tree_structure.right_child: missing"), "{err}");
    }

    #[test]
    fn rejects_repeated_feature_names() {
        let text = dump(r#"{"leaf_value":0.25}"#).replace(r#"["a","b"]"#, r#"["a","a"]"#);
        assert!(error_of(&text).contains("feature_names[1]"));
    }

    #[test]
    fn rejects_a_name_count_that_disagrees_with_max_feature_idx() {
        let text = dump(r#"{"leaf_value":0.25}"#).replace(r#"["a","b"]"#, r#"["a"]"#);
        assert!(error_of(&text).contains("max_feature_idx"));
    }

    #[test]
    fn rejects_a_max_feature_idx_at_the_ends_of_i64() {
        for claimed in [i64::MAX, i64::MIN] {
            let text = dump(r#"{"leaf_value":0.25}"#).replace(
                r#""max_feature_idx":1"#,
                &format!(r#""max_feature_idx":{claimed}"#),
            );
            assert_eq!(
                error_of(&text),
                format!(
                    "LightGBM model, max_feature_idx: expected 1 (feature_names has 2 names), \
                     got {claimed}"
                )
            );
        }
    }

    #[test]
    fn rejects_multi_class_and_averaged_models() {
        let multi = dump(r#"{"leaf_value":0.25}"#).replace(r#""num_class":1"#, r#""num_class":3"#);
        assert!(error_of(&multi).contains("num_class: a multi-class model (3 classes)"));
        let rf = dump(r#"{"leaf_value":0.25}"#)
            .replace(r#""objective""#, r#""average_output":true,"objective""#);
        assert!(error_of(&rf).contains("average_output"));
    }

    #[test]
    fn rejects_linear_trees() {
        let err = error_of(&dump(
            r#"{"leaf_value":0.25,"leaf_const":0.25,"leaf_features":[0],"leaf_coeff":[0.5]}"#,
        ));
        assert!(
            err.contains("tree_structure.leaf_coeff: linear trees"),
            "{err}"
        );
    }

    #[test]
    fn malformed_json_names_line_and_column() {
        let err = error_of("{\"num_class\": 1,\n \"tree_info\": [}");
        assert!(
            err.starts_with("LightGBM model JSON, line 2, column"),
            "{err}"
        );
    }
}
