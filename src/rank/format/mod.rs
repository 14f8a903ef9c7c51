//! The native ranker file (DESIGN §5, schema and semantics in `docs/ranker-format.md`): reading
//! it into a validated [`Ranker`], writing a [`Ranker`] back, and the invariants every ranker
//! satisfies ([`validate`], which the importers call too).
//!
//! Reading happens in two steps: serde parses the JSON into file structs (type errors carry the
//! line and column), then the conversion resolves names, checks what the model types cannot
//! hold (f32 range, integer categories, node shapes) and [`validate`] checks the rest, each
//! error naming its field path (`inputs[17].upper`, `ensemble.trees[3].nodes[12].left`).
//!
//! Reading (the file structs and their conversion) is in `read`, the invariants in `invariants`,
//! writing in `write`.
//!
//! [`Ranker`]: crate::rank::model::Ranker

mod invariants;
mod read;
mod write;

pub use invariants::validate;
pub use read::parse_native;
pub use write::to_native_json;

/// The value of the file's `format` field.
pub const FORMAT_NAME: &str = "rankserve-ranker";
/// The only file version this build reads and writes.
pub const FORMAT_VERSION: u64 = 1;
/// The largest category an `in` split may list: a category is a feature value truncated to a
/// C `int` (as LightGBM does), so larger ones can never match.
pub const MAX_CATEGORY: u32 = i32::MAX as u32;
/// The most features a ranker may have, whatever its format: far above real rankers (hundreds
/// to a few thousand), and low enough that a ranker's per-feature structures (names, name maps)
/// stay within tens of MB. An XGBoost model only claims its count (`num_feature`), so its
/// importer checks the claim against this before making names.
pub const MAX_FEATURES: usize = 1_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    use crate::rank::error::RankerError;
    use crate::rank::model::{Decision, Input, Missing, Node, Ranker};
    use proptest::prelude::*;

    /// A small valid file using every kind of input, decision and activation.
    fn sample() -> serde_json::Value {
        serde_json::json!({
            "format": "rankserve-ranker", "version": 1,
            "features": ["body.bm25f", "title.first_occurrence.min", "static.rank"],
            "inputs": [
                {"type": "linear", "feature": "body.bm25f", "slope": 0.5, "intercept": 0.1},
                {"type": "loglinear", "feature": "static.rank", "slope": 2.0, "intercept": -1.0},
                {"type": "bucket", "feature": "title.first_occurrence.min", "lower": 1.0, "upper": 4.0},
                {"type": "freeform", "expr": "ln(body.bm25f + 1) * max(static.rank, 0.5)"},
                {"type": "tree", "tree": {"nodes": [
                    {"feature": 0, "decision": "le_f64", "threshold": 4.6285, "missing": "nan",
                     "default_left": true, "left": 1, "right": 2},
                    {"leaf": 0.25},
                    {"feature": 2, "decision": "in", "categories": [7, 1, 5],
                     "missing": "nan", "default_left": false, "left": 3, "right": 4},
                    {"leaf": -1.5}, {"leaf": 3.0}]}},
                {"type": "dummy"}
            ],
            "layers": [
                {"weights": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.0], [1, 1, 1, 1, 1, 1]],
                 "bias": [0.0, 1.0], "activation": "tanh"},
                {"weights": [[1.5, -2.0]], "bias": [0.25], "activation": "identity"}
            ],
            "ensemble": {"base_score": 0.5, "trees": [
                {"nodes": [{"feature": 1, "decision": "lt_f32", "threshold": 0.1, "missing": "zero",
                            "left": 2, "right": 1}, {"leaf": 1e-3}, {"leaf": -2.0}]},
                {"nodes": [{"leaf": 0.125}]}
            ]}
        })
    }

    fn load(v: &serde_json::Value) -> Result<Ranker, RankerError> {
        parse_native(v.to_string().as_bytes())
    }

    /// Applies `edit` to the sample and returns the load error.
    fn reject(edit: impl FnOnce(&mut serde_json::Value)) -> RankerError {
        let mut v = sample();
        edit(&mut v);
        load(&v).expect_err("the edited file should be rejected")
    }

    /// Asserts that the sample file, edited by `edit`, is refused at `path` with `message`.
    fn assert_rejected(edit: impl FnOnce(&mut serde_json::Value), path: &str, message: &str) {
        assert_eq!(reject(edit), RankerError::invalid(path, message));
    }

    fn invalid_at(err: RankerError) -> String {
        match err {
            RankerError::Invalid { path, .. } | RankerError::FreeForm { path, .. } => path,
            other => panic!("expected a field error, got {other}"),
        }
    }

    #[test]
    fn sample_loads_with_resolved_names_and_sorted_categories() {
        let r = load(&sample()).unwrap();
        assert_eq!(r.features.len(), 3);
        assert_eq!(
            r.inputs[1],
            Input::LogLinear {
                feature: 2,
                slope: 2.0,
                intercept: -1.0
            }
        );
        let Input::Tree(tree) = &r.inputs[4] else {
            panic!()
        };
        let Node::Split(s) = &tree.nodes[2] else {
            panic!()
        };
        assert_eq!(s.decision, Decision::In(vec![1, 5, 7]));
        assert_eq!(r.layers[0].inputs, 6);
        assert_eq!(r.layers[0].outputs, 2);
        let Node::Split(s) = &r.ensemble.as_ref().unwrap().trees[0].nodes[0] else {
            panic!()
        };
        assert_eq!(s.decision, Decision::LtF32(0.1));
        assert_eq!(s.missing, Missing::Zero);
        assert!(!s.default_left);
    }

    #[test]
    fn round_trips_exactly() {
        let r = load(&sample()).unwrap();
        let text = to_native_json(&r);
        let back = parse_native(text.as_bytes()).unwrap();
        assert_eq!(back, r);
        assert_eq!(to_native_json(&back), text);
    }

    proptest! {
        #[test]
        fn numbers_round_trip(t in proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL,
                              w in proptest::num::f32::NORMAL | proptest::num::f32::SUBNORMAL,
                              leaf in -1e6f64..1e6) {
            let mut r = load(&sample()).unwrap();
            r.layers[1].weights[0] = w;
            r.inputs[2] = Input::Bucket { feature: 1, lower: t, upper: f64::MAX };
            if t >= f64::MAX { return Ok(()); }
            r.ensemble.as_mut().unwrap().trees[1].nodes[0] = Node::Leaf(leaf);
            let back = parse_native(to_native_json(&r).as_bytes()).unwrap();
            prop_assert_eq!(back, r);
        }
    }

    #[test]
    fn rejects_json_syntax_with_line_and_column() {
        let err = parse_native(b"{\n  \"format\": \"rankserve-ranker\",\n  \"version\": 1,,\n}")
            .unwrap_err();
        assert!(matches!(err, RankerError::Json { line: 3, .. }), "{err}");
    }

    #[test]
    fn rejects_unknown_field() {
        let err = reject(|v| v["inputs"][0]["slop"] = 1.0.into());
        assert!(matches!(err, RankerError::Json { .. }), "{err}");
    }

    #[test]
    fn rejects_unknown_input_type() {
        let err = reject(|v| v["inputs"][0]["type"] = "quadratic".into());
        assert!(err.to_string().contains("quadratic"), "{err}");
    }

    #[test]
    fn rejects_wrong_format_and_version() {
        assert_eq!(
            invalid_at(reject(|v| v["format"] = "lightgbm".into())),
            "format"
        );
        assert_eq!(invalid_at(reject(|v| v["version"] = 2.into())), "version");
    }

    #[test]
    fn rejects_duplicate_feature_names() {
        assert_rejected(
            |v| v["features"][2] = "body.bm25f".into(),
            "features[2]",
            "duplicate feature name \"body.bm25f\" (also features[0])",
        );
    }

    #[test]
    fn rejects_empty_feature_list() {
        let err = reject(|v| {
            v["features"] = serde_json::json!([]);
            v.as_object_mut().unwrap().remove("inputs");
            v.as_object_mut().unwrap().remove("layers");
            v["ensemble"]["trees"] = serde_json::json!([]);
        });
        assert_eq!(invalid_at(err), "features");
    }

    #[test]
    fn rejects_empty_feature_name() {
        assert_eq!(
            invalid_at(reject(|v| v["features"][1] = "".into())),
            "features[1]"
        );
    }

    #[test]
    fn rejects_unknown_feature_reference() {
        assert_rejected(
            |v| v["inputs"][2]["feature"] = "title.bm25f".into(),
            "inputs[2].feature",
            "feature \"title.bm25f\" is not in `features`",
        );
    }

    #[test]
    fn rejects_more_features_than_the_limit() {
        let err = reject(|v| {
            v["features"] = (0..=MAX_FEATURES).map(|i| format!("x{i}")).collect();
        });
        assert_eq!(
            err,
            RankerError::invalid(
                "features",
                format!(
                    "expected at most {MAX_FEATURES} feature names, got {}",
                    MAX_FEATURES + 1
                )
            )
        );
    }

    #[test]
    fn rejects_freeform_with_unknown_feature() {
        let err = reject(|v| v["inputs"][3]["expr"] = "ln(nope)".into());
        assert_eq!(
            err.to_string(),
            "inputs[3].expr: column 4: unknown feature \"nope\" (not in the ranker's `features`)"
        );
    }

    #[test]
    fn rejects_bucket_lower_not_below_upper() {
        assert_rejected(
            |v| v["inputs"][2]["upper"] = 1.0.into(),
            "inputs[2].upper",
            "expected lower < upper, got lower 1.0 and upper 1.0",
        );
    }

    #[test]
    fn rejects_f32_overflow_as_not_finite() {
        assert_eq!(
            invalid_at(reject(|v| v["inputs"][0]["slope"] = 1e39.into())),
            "inputs[0].slope"
        );
        assert_eq!(
            invalid_at(reject(|v| v["layers"][1]["weights"][0][1] = (-1e300).into())),
            "layers[1].weights[0][1]"
        );
        assert_eq!(
            invalid_at(reject(|v| v["layers"][0]["bias"][1] = 4e38.into())),
            "layers[0].bias[1]"
        );
        assert_eq!(
            invalid_at(reject(
                |v| v["inputs"][4]["tree"]["nodes"][1]["leaf"] = 1e300.into()
            )),
            "inputs[4].tree.nodes[1].leaf"
        );
    }

    #[test]
    fn rejects_number_out_of_f64_range() {
        let text = sample().to_string().replace("4.6285", "1e400");
        assert!(matches!(
            parse_native(text.as_bytes()),
            Err(RankerError::Json { .. })
        ));
    }

    #[test]
    fn rejects_child_index_out_of_range() {
        assert_rejected(
            |v| v["ensemble"]["trees"][0]["nodes"][0]["right"] = 3.into(),
            "ensemble.trees[0].nodes[0].right",
            "child index 3 is outside the tree (0..3)",
        );
    }

    #[test]
    fn rejects_negative_child_index() {
        let err = reject(|v| v["ensemble"]["trees"][0]["nodes"][0]["left"] = (-1).into());
        assert_eq!(invalid_at(err), "ensemble.trees[0].nodes[0].left");
    }

    #[test]
    fn rejects_child_pointing_back_to_an_ancestor() {
        let err = reject(|v| v["inputs"][4]["tree"]["nodes"][2]["right"] = 0.into());
        assert_eq!(invalid_at(err), "inputs[4].tree.nodes[2].right");
    }

    #[test]
    fn rejects_node_with_two_parents() {
        let err = reject(|v| {
            v["inputs"][4]["tree"]["nodes"][2]["left"] = 1.into();
        });
        assert!(err.to_string().contains("already reached"), "{err}");
    }

    #[test]
    fn rejects_unreachable_node() {
        assert_rejected(
            |v| {
                let nodes = v["inputs"][4]["tree"]["nodes"].as_array_mut().unwrap();
                nodes.push(serde_json::json!({"leaf": 1.0}));
            },
            "inputs[4].tree.nodes[5]",
            "node is not reachable from the root (nodes[0])",
        );
    }

    #[test]
    fn rejects_empty_tree() {
        let err = reject(|v| v["ensemble"]["trees"][1]["nodes"] = serde_json::json!([]));
        assert_eq!(invalid_at(err), "ensemble.trees[1].nodes");
    }

    #[test]
    fn rejects_split_feature_out_of_range() {
        assert_rejected(
            |v| v["ensemble"]["trees"][0]["nodes"][0]["feature"] = 3.into(),
            "ensemble.trees[0].nodes[0].feature",
            "feature index 3 is outside `features` (0..3)",
        );
    }

    #[test]
    fn rejects_split_without_threshold() {
        let err = reject(|v| {
            v["ensemble"]["trees"][0]["nodes"][0]
                .as_object_mut()
                .unwrap()
                .remove("threshold");
        });
        assert_eq!(invalid_at(err), "ensemble.trees[0].nodes[0]");
    }

    #[test]
    fn rejects_split_without_children() {
        let err = reject(|v| {
            v["ensemble"]["trees"][0]["nodes"][0]
                .as_object_mut()
                .unwrap()
                .remove("left");
        });
        assert!(err.to_string().contains("needs `left`"), "{err}");
    }

    #[test]
    fn rejects_leaf_with_split_fields() {
        let err = reject(|v| v["ensemble"]["trees"][1]["nodes"][0]["left"] = 1.into());
        assert_eq!(invalid_at(err), "ensemble.trees[1].nodes[0].left");
    }

    #[test]
    fn rejects_unknown_decision_and_missing() {
        assert_eq!(
            invalid_at(reject(
                |v| v["ensemble"]["trees"][0]["nodes"][0]["decision"] = "lt".into()
            )),
            "ensemble.trees[0].nodes[0].decision"
        );
        assert_eq!(
            invalid_at(reject(
                |v| v["ensemble"]["trees"][0]["nodes"][0]["missing"] = "null".into()
            )),
            "ensemble.trees[0].nodes[0].missing"
        );
    }

    #[test]
    fn rejects_categories_on_numeric_split_and_threshold_on_in() {
        assert_eq!(
            invalid_at(reject(
                |v| v["ensemble"]["trees"][0]["nodes"][0]["categories"] = serde_json::json!([1])
            )),
            "ensemble.trees[0].nodes[0].categories"
        );
        assert_eq!(
            invalid_at(reject(
                |v| v["inputs"][4]["tree"]["nodes"][2]["threshold"] = 1.0.into()
            )),
            "inputs[4].tree.nodes[2].threshold"
        );
    }

    #[test]
    fn rejects_negative_or_fractional_category() {
        let err = reject(|v| v["inputs"][4]["tree"]["nodes"][2]["categories"][1] = (-1).into());
        assert_eq!(
            err,
            RankerError::invalid(
                "inputs[4].tree.nodes[2].categories[1]",
                "expected an integer category in 0..=2147483647, got -1.0"
            )
        );
        let err = reject(|v| v["inputs"][4]["tree"]["nodes"][2]["categories"][0] = 2.5.into());
        assert_eq!(invalid_at(err), "inputs[4].tree.nodes[2].categories[0]");
    }

    #[test]
    fn rejects_ragged_weight_rows() {
        assert_rejected(
            |v| v["layers"][0]["weights"][1] = serde_json::json!([1, 1, 1]),
            "layers[0].weights[1]",
            "expected 6 weights (as weights[0]), got 3",
        );
    }

    #[test]
    fn rejects_first_layer_width_not_matching_inputs() {
        assert_rejected(
            |v| {
                v["inputs"].as_array_mut().unwrap().pop();
            },
            "layers[0].weights",
            "expected rows of 5 weights (the number of inputs), got rows of 6",
        );
    }

    #[test]
    fn rejects_layers_that_do_not_chain() {
        let err = reject(|v| v["layers"][1]["weights"] = serde_json::json!([[1.0, 2.0, 3.0]]));
        assert_eq!(invalid_at(err), "layers[1].weights");
    }

    #[test]
    fn rejects_last_layer_with_more_than_one_output() {
        assert_rejected(
            |v| {
                v["layers"].as_array_mut().unwrap().pop();
            },
            "layers[0].weights",
            "the last layer must have 1 output, got 2",
        );
    }

    #[test]
    fn rejects_bias_length_mismatch() {
        let err = reject(|v| v["layers"][0]["bias"] = serde_json::json!([0.0]));
        assert_eq!(invalid_at(err), "layers[0].bias");
    }

    #[test]
    fn rejects_empty_layer() {
        let err = reject(|v| v["layers"][1]["weights"] = serde_json::json!([]));
        assert_eq!(invalid_at(err), "layers[1].weights");
    }

    #[test]
    fn rejects_unknown_activation() {
        assert_eq!(
            invalid_at(reject(|v| v["layers"][0]["activation"] = "gelu".into())),
            "layers[0].activation"
        );
    }

    #[test]
    fn rejects_nothing_to_score() {
        let err = reject(|v| {
            let o = v.as_object_mut().unwrap();
            o.remove("inputs");
            o.remove("layers");
            o.remove("ensemble");
        });
        assert_eq!(invalid_at(err), "inputs");
    }

    #[test]
    fn validate_rejects_non_finite_values_in_a_built_ranker() {
        let mut r = load(&sample()).unwrap();
        r.layers[1].weights[1] = f32::NAN;
        assert_eq!(
            validate(&r),
            Err(RankerError::invalid(
                "layers[1].weights[0][1]",
                "expected a finite number, got NaN"
            ))
        );
        let mut r = load(&sample()).unwrap();
        r.ensemble.as_mut().unwrap().base_score = f64::INFINITY;
        assert_eq!(invalid_at(validate(&r).unwrap_err()), "ensemble.base_score");
        let mut r = load(&sample()).unwrap();
        r.inputs[0] = Input::Linear {
            feature: 0,
            slope: f32::NEG_INFINITY,
            intercept: 0.0,
        };
        assert_eq!(invalid_at(validate(&r).unwrap_err()), "inputs[0].slope");
    }

    #[test]
    fn validate_rejects_unsorted_categories_in_a_built_ranker() {
        let mut r = load(&sample()).unwrap();
        let Input::Tree(tree) = &mut r.inputs[4] else {
            panic!()
        };
        let Node::Split(s) = &mut tree.nodes[2] else {
            panic!()
        };
        s.decision = Decision::In(vec![5, 1]);
        assert_eq!(
            invalid_at(validate(&r).unwrap_err()),
            "inputs[4].tree.nodes[2].categories[1]"
        );
    }
}
