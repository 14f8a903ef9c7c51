//! The CPU evaluator of rankers: the reference every other backend is checked against, and a
//! real fallback.
//!
//! Two implementations live here. The functions of this module ([`model_inputs`], [`tree_leaf`],
//! [`goes_left`], [`score_doc_reference`]) follow the definitions of `docs/ranker-format.md`
//! line by line, one document at a time. [`CpuPlan`] (in [`plan`]) is the fast path that
//! [`score_batch`] runs: trees flattened once into one node array, walked for a block of
//! documents at a time; its tests prove it equal to the reference.
//!
//! Number rules (DESIGN §5 "Numbers"): feature values are f64; tree comparisons are done on the
//! f64 value (`lt_f32` splits round it to f32 first, as XGBoost does); transforms and NN layers
//! compute in f32; the sum of the inputs (no layers) and the ensemble are accumulated in f64, in
//! order. A missing value is NaN: transforms read it as 0, buckets do not contain it, splits
//! send it where their `missing` rule says.

pub mod plan;
mod quick;
#[cfg(target_arch = "x86_64")]
mod quick_simd;
#[cfg(test)]
mod testgen;
mod trees;
mod walk;

pub use plan::CpuPlan;
pub use quick::Isa;
pub use trees::TreeEvaluator;

use crate::rank::freeform;
use crate::rank::model::{Activation, Decision, Input, Layer, Missing, Node, Ranker, Split, Tree};

/// What LightGBM calls `kZeroThreshold`: a value with `|x| <= ZERO_THRESHOLD` is "zero" for
/// `missing: zero` splits. LightGBM declares it as the float `1e-35f` and compares doubles
/// with it, so the bound is the f32 nearest 1e-35, widened.
pub const ZERO_THRESHOLD: f64 = 1e-35f32 as f64;

/// Scores `n` documents: `features` is row-major `n × ranker.features.len()`. `threads == 1`
/// runs on the calling thread; `0` uses rayon's global pool; any other count a pool of that
/// many threads. Scores do not depend on the thread count nor on the batch.
///
/// Builds a [`CpuPlan`] each call; callers that score many batches with one ranker keep a plan.
///
/// # Panics
/// When `features.len()` is not a multiple of the ranker's feature count.
pub fn score_batch(ranker: &Ranker, features: &[f64], threads: usize) -> Vec<f64> {
    CpuPlan::new(ranker).score_batch(features, threads)
}

/// The model inputs `V'` of one document, in input order, as the NN's first layer reads them
/// (a tree input gives its leaf value rounded to f32; a Dummy gives 0).
pub fn model_inputs(ranker: &Ranker, doc_features: &[f64]) -> Vec<f32> {
    ranker
        .inputs
        .iter()
        .map(|input| input_value(input, doc_features) as f32)
        .collect()
}

/// The id (index into `tree.nodes`) of the leaf that `doc_features` reaches.
pub fn tree_leaf(tree: &Tree, doc_features: &[f64]) -> u32 {
    let mut at = 0u32;
    loop {
        match &tree.nodes[at as usize] {
            Node::Leaf(_) => return at,
            Node::Split(s) => {
                at = if goes_left(s, doc_features[s.feature as usize]) {
                    s.left
                } else {
                    s.right
                };
            }
        }
    }
}

/// The leaf value that `doc_features` reaches.
pub fn tree_value(tree: &Tree, doc_features: &[f64]) -> f64 {
    match tree.nodes[tree_leaf(tree, doc_features) as usize] {
        Node::Leaf(v) => v,
        Node::Split(_) => unreachable!("tree_leaf returns a leaf"),
    }
}

/// Whether the split sends the feature value `x` left.
///
/// Missing values first: with `missing: none` a NaN is compared as 0; with `nan` a NaN goes the
/// default way; with `zero` a NaN or `|x| <= ZERO_THRESHOLD` goes the default way. Then the
/// decision: `le_f64` left when `x <= threshold`; `lt_f32` left when `f32(x) < threshold`; `in`
/// left when `x`'s category (truncated toward zero, as LightGBM's `static_cast<int>`) is in the
/// set, a value `<= -1` or `>= 2^31` having no category.
pub fn goes_left(split: &Split, x: f64) -> bool {
    let x = if x.is_nan() {
        match split.missing {
            Missing::None => 0.0,
            Missing::Zero | Missing::Nan => return split.default_left,
        }
    } else {
        x
    };
    if split.missing == Missing::Zero && x.abs() <= ZERO_THRESHOLD {
        return split.default_left;
    }
    match &split.decision {
        Decision::LeF64(t) => x <= *t,
        Decision::LtF32(t) => (x as f32) < *t,
        Decision::In(set) => category(x).is_some_and(|c| set.binary_search(&c).is_ok()),
    }
}

/// The category of a non-NaN value: `trunc(x)` when that is a non-negative C `int`.
pub(crate) fn category(x: f64) -> Option<u32> {
    if x > -1.0 && x < 2_147_483_648.0 {
        Some(x as u32) // truncates toward zero; (-1, 0) gives 0 like LightGBM's cast
    } else {
        None
    }
}

/// A feature value as a transform reads it: f32, missing (NaN) as 0.
#[inline]
pub(crate) fn transform_arg(x: f64) -> f32 {
    if x.is_nan() {
        0.0
    } else {
        x as f32
    }
}

/// One input's value; f64 so that a tree input keeps its leaf exactly for the input sum, while
/// every transform is computed in f32.
fn input_value(input: &Input, doc: &[f64]) -> f64 {
    match input {
        Input::Linear {
            feature,
            slope,
            intercept,
        } => f64::from(transform_arg(doc[*feature as usize]) * slope + intercept),
        Input::LogLinear {
            feature,
            slope,
            intercept,
        } => f64::from((transform_arg(doc[*feature as usize]) + 1.0).ln() * slope + intercept),
        Input::Bucket {
            feature,
            lower,
            upper,
        } => {
            let x = doc[*feature as usize];
            if *lower <= x && x < *upper {
                1.0
            } else {
                0.0
            }
        }
        Input::FreeForm(ff) => f64::from(freeform::eval(&ff.expr, doc)),
        Input::Tree(tree) => tree_value(tree, doc),
        Input::Dummy => 0.0,
    }
}

/// Applies an activation in f32.
#[inline]
pub fn activate(activation: Activation, v: f32) -> f32 {
    match activation {
        Activation::Identity => v,
        Activation::Relu => {
            if v > 0.0 {
                v
            } else {
                0.0
            }
        }
        Activation::Tanh => v.tanh(),
        Activation::Sigmoid => 1.0 / (1.0 + (-v).exp()),
    }
}

/// One layer on one document: `out[o] = act((Σ_i w[o][i]·in[i], summed in f32 in input order) + bias[o])`.
pub fn layer_forward(layer: &Layer, input: &[f32]) -> Vec<f32> {
    (0..layer.outputs)
        .map(|o| {
            let row = &layer.weights[o * layer.inputs..(o + 1) * layer.inputs];
            let dot = row
                .iter()
                .zip(input)
                .fold(0.0f32, |acc, (w, x)| acc + w * x);
            activate(layer.activation, dot + layer.bias[o])
        })
        .collect()
}

/// The score of one document, straight from the definitions (the reference for [`CpuPlan`]).
pub fn score_doc_reference(ranker: &Ranker, doc: &[f64]) -> f64 {
    let model = if ranker.layers.is_empty() {
        ranker
            .inputs
            .iter()
            .fold(0.0f64, |acc, input| acc + input_value(input, doc))
    } else {
        let mut v = model_inputs(ranker, doc);
        for layer in &ranker.layers {
            v = layer_forward(layer, &v);
        }
        f64::from(v[0])
    };
    match &ranker.ensemble {
        None => model,
        Some(e) => {
            let sum = e
                .trees
                .iter()
                .fold(e.base_score, |acc, t| acc + tree_value(t, doc));
            if ranker.inputs.is_empty() {
                sum
            } else {
                model + sum
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::model::{Ensemble, Expr, FreeForm};

    fn split(decision: Decision, missing: Missing, default_left: bool) -> Split {
        Split {
            feature: 0,
            decision,
            missing,
            default_left,
            left: 1,
            right: 2,
        }
    }

    fn ranker(inputs: Vec<Input>, layers: Vec<Layer>, ensemble: Option<Ensemble>) -> Ranker {
        Ranker {
            features: vec!["a".into(), "b".into()],
            inputs,
            layers,
            ensemble,
        }
    }

    fn value(input: Input, a: f64) -> f32 {
        model_inputs(&ranker(vec![input], vec![], None), &[a, 0.0])[0]
    }

    #[test]
    fn linear_in_f32() {
        let lin = || Input::Linear {
            feature: 0,
            slope: 0.5,
            intercept: 0.1,
        };
        assert_eq!(value(lin(), 3.0), 1.6f32);
        // f32(0.1) * 0.5 + 0.1 in f32, not in f64
        assert_eq!(value(lin(), 0.1), 0.1f32 * 0.5 + 0.1f32);
        assert_eq!(value(lin(), f64::NAN), 0.1, "missing reads as 0");
        assert_eq!(value(lin(), 1e300), f32::INFINITY, "beyond f32 range");
    }

    #[test]
    fn loglinear_in_f32() {
        let log = || Input::LogLinear {
            feature: 0,
            slope: 2.0,
            intercept: -1.0,
        };
        assert_eq!(value(log(), 0.0), -1.0);
        assert_eq!(
            value(log(), std::f64::consts::E - 1.0),
            ((std::f64::consts::E as f32 - 1.0) + 1.0).ln() * 2.0 - 1.0
        );
        assert_eq!(value(log(), 9.0), 10f32.ln() * 2.0 - 1.0);
        assert_eq!(value(log(), f64::NAN), -1.0);
        assert_eq!(value(log(), -1.0), f32::NEG_INFINITY);
    }

    #[test]
    fn bucket_is_half_open_in_f64() {
        let b = || Input::Bucket {
            feature: 0,
            lower: 1.0,
            upper: 4.0,
        };
        assert_eq!(value(b(), 1.0), 1.0, "lower is inside");
        assert_eq!(value(b(), 4.0), 0.0, "upper is outside");
        assert_eq!(value(b(), 3.9999999999999996), 1.0);
        assert_eq!(value(b(), 0.9999999999999999), 0.0);
        assert_eq!(value(b(), f64::NAN), 0.0);
        // compared in f64: 4 - 1e-12 rounds to 4.0 in f32 but is inside
        assert_eq!(value(b(), 4.0 - 1e-12), 1.0);
        let z = Input::Bucket {
            feature: 0,
            lower: 0.0,
            upper: 1.0,
        };
        assert_eq!(value(z.clone(), -0.0), 1.0, "-0 == 0");
    }

    #[test]
    fn freeform_and_dummy() {
        let ff = Input::FreeForm(FreeForm {
            source: "a * 2".into(),
            expr: Expr::Binary(
                crate::rank::model::BinaryOp::Mul,
                Box::new(Expr::Feature(0)),
                Box::new(Expr::Const(2.0)),
            ),
        });
        assert_eq!(value(ff, 1.5), 3.0);
        assert_eq!(value(Input::Dummy, 7.0), 0.0);
    }

    #[test]
    fn le_f64_on_and_around_the_threshold() {
        let s = split(Decision::LeF64(0.5), Missing::None, false);
        assert!(goes_left(&s, 0.5));
        assert!(!goes_left(&s, 0.5000000000000001));
        assert!(goes_left(&s, 0.49999999999999994));
        assert!(goes_left(&s, f64::NEG_INFINITY));
        assert!(!goes_left(&s, f64::INFINITY));
        let z = split(Decision::LeF64(0.0), Missing::None, false);
        assert!(goes_left(&z, -0.0) && goes_left(&z, 0.0));
        assert!(!goes_left(&z, 5e-324));
        let n = split(Decision::LeF64(-0.0), Missing::None, false);
        assert!(goes_left(&n, 0.0), "0 <= -0");
    }

    #[test]
    fn lt_f32_rounds_the_value_first() {
        let s = split(Decision::LtF32(0.1), Missing::None, false);
        assert!(!goes_left(&s, 0.1f32 as f64), "on the threshold goes right");
        // 0.1 (f64) rounds to 0.1f32, which is not < 0.1f32, although 0.1 < f64(0.1f32)
        assert!(!goes_left(&s, 0.1));
        assert!(goes_left(&s, 0.09999999));
        // a value just below f64(0.1f32) that still rounds to 0.1f32 goes right
        let just_below = f64::from_bits((0.1f32 as f64).to_bits() - 1);
        assert!(!goes_left(&s, just_below));
        let prev = f32::from_bits(0.1f32.to_bits() - 1);
        assert!(goes_left(&s, prev as f64));
        assert!(!goes_left(&s, 1e300), "rounds to +inf");
        let z = split(Decision::LtF32(0.0), Missing::None, false);
        assert!(!goes_left(&z, -1e-50), "rounds to -0, not < 0");
        assert!(goes_left(&z, -1e-40));
    }

    #[test]
    fn missing_none_compares_nan_as_zero() {
        assert!(goes_left(
            &split(Decision::LeF64(0.0), Missing::None, false),
            f64::NAN
        ));
        assert!(!goes_left(
            &split(Decision::LeF64(-0.5), Missing::None, true),
            f64::NAN
        ));
        assert!(goes_left(
            &split(Decision::LtF32(0.5), Missing::None, false),
            f64::NAN
        ));
        assert!(goes_left(
            &split(Decision::In(vec![0, 3]), Missing::None, false),
            f64::NAN
        ));
    }

    #[test]
    fn missing_nan_sends_nan_the_default_way_only() {
        for default_left in [false, true] {
            let s = split(Decision::LeF64(1.0), Missing::Nan, default_left);
            assert_eq!(goes_left(&s, f64::NAN), default_left);
            assert!(goes_left(&s, 0.0), "zero is a value");
            assert!(!goes_left(&s, 2.0));
        }
    }

    #[test]
    fn missing_zero_sends_nan_and_tiny_values_the_default_way() {
        let s = split(Decision::LeF64(1.0), Missing::Zero, false);
        assert!(!goes_left(&s, f64::NAN));
        assert!(!goes_left(&s, 0.0));
        assert!(!goes_left(&s, -0.0));
        assert!(!goes_left(&s, ZERO_THRESHOLD));
        assert!(!goes_left(&s, -ZERO_THRESHOLD));
        assert!(goes_left(&s, f64::from_bits(ZERO_THRESHOLD.to_bits() + 1)));
        assert!(
            goes_left(&s, 1e-35 * 1.0000001),
            "the bound is f32(1e-35), above 1e-35"
        );
        assert!(goes_left(&s, 0.5));
        let s = split(Decision::LeF64(-1.0), Missing::Zero, true);
        assert!(goes_left(&s, 0.0));
        assert!(!goes_left(&s, 1e-30));
    }

    #[test]
    fn categorical_truncates_like_lightgbm() {
        let s = split(Decision::In(vec![0, 2, 7]), Missing::Nan, false);
        assert!(goes_left(&s, 2.0));
        assert!(goes_left(&s, 2.9), "truncated toward zero");
        assert!(goes_left(&s, 7.0));
        assert!(!goes_left(&s, 3.0));
        assert!(goes_left(&s, -0.5), "(-1, 0) truncates to category 0");
        assert!(!goes_left(&s, -1.0));
        assert!(!goes_left(&s, -2.0));
        assert!(!goes_left(&s, f64::NAN), "NaN goes the default way (right)");
        assert!(
            !goes_left(&s, 4294967298.0),
            "beyond a C int: no category (not 2 mod 2^32)"
        );
        assert!(!goes_left(&s, f64::INFINITY));
        let d = split(Decision::In(vec![5]), Missing::Nan, true);
        assert!(goes_left(&d, f64::NAN));
    }

    #[test]
    fn tree_leaf_follows_the_node_array() {
        // root: a <= 1 ? node 2 : node 1; node 2: b in {3} ? leaf 3 : leaf 4
        let tree = Tree {
            nodes: vec![
                Node::Split(Split {
                    feature: 0,
                    decision: Decision::LeF64(1.0),
                    missing: Missing::Nan,
                    default_left: true,
                    left: 2,
                    right: 1,
                }),
                Node::Leaf(10.0),
                Node::Split(Split {
                    feature: 1,
                    decision: Decision::In(vec![3]),
                    missing: Missing::Nan,
                    default_left: false,
                    left: 3,
                    right: 4,
                }),
                Node::Leaf(20.0),
                Node::Leaf(30.0),
            ],
        };
        assert_eq!(tree_leaf(&tree, &[5.0, 3.0]), 1);
        assert_eq!(tree_leaf(&tree, &[1.0, 3.0]), 3);
        assert_eq!(tree_leaf(&tree, &[f64::NAN, 4.0]), 4);
        assert_eq!(tree_value(&tree, &[0.0, 3.0]), 20.0);
    }

    #[test]
    fn activations() {
        assert_eq!(activate(Activation::Identity, -2.5), -2.5);
        assert_eq!(activate(Activation::Relu, -2.5), 0.0);
        assert_eq!(activate(Activation::Relu, 2.5), 2.5);
        assert_eq!(activate(Activation::Tanh, 0.5), 0.5f32.tanh());
        assert_eq!(activate(Activation::Sigmoid, 0.0), 0.5);
        assert_eq!(
            activate(Activation::Sigmoid, 2.0),
            1.0 / (1.0 + (-2.0f32).exp())
        );
    }

    #[test]
    fn score_without_layers_sums_inputs_in_f64_plus_ensemble() {
        let leaf = |v| Tree {
            nodes: vec![Node::Leaf(v)],
        };
        let r = ranker(
            vec![
                Input::Linear {
                    feature: 0,
                    slope: 1.0,
                    intercept: 0.0,
                },
                Input::Tree(leaf(0.1)),
                Input::Bucket {
                    feature: 1,
                    lower: 0.0,
                    upper: 1.0,
                },
            ],
            vec![],
            Some(Ensemble {
                trees: vec![leaf(1e-20), leaf(2.0)],
                base_score: 0.5,
            }),
        );
        let want = (0.0 + f64::from(0.25f32) + 0.1 + 1.0) + ((0.5 + 1e-20) + 2.0);
        assert_eq!(score_doc_reference(&r, &[0.25, 0.5]), want);
    }

    #[test]
    fn score_with_layers_is_the_last_output() {
        let r = ranker(
            vec![
                Input::Linear {
                    feature: 0,
                    slope: 1.0,
                    intercept: 0.0,
                },
                Input::Linear {
                    feature: 1,
                    slope: 1.0,
                    intercept: 0.0,
                },
            ],
            vec![
                Layer {
                    inputs: 2,
                    outputs: 2,
                    weights: vec![1.0, 2.0, -1.0, 0.5],
                    bias: vec![0.5, 0.0],
                    activation: Activation::Relu,
                },
                Layer {
                    inputs: 2,
                    outputs: 1,
                    weights: vec![2.0, 3.0],
                    bias: vec![-1.0],
                    activation: Activation::Identity,
                },
            ],
            None,
        );
        // hidden = relu([1*1 + 2*2 + 0.5, -1*1 + 0.5*2 + 0]) = [5.5, 0]; out = 2*5.5 + 0 - 1 = 10
        assert_eq!(score_doc_reference(&r, &[1.0, 2.0]), 10.0);
        assert_eq!(model_inputs(&r, &[1.0, f64::NAN]), vec![1.0, 0.0]);
    }

    #[test]
    fn ensemble_only_starts_from_base_score() {
        let r = Ranker {
            features: vec!["a".into()],
            inputs: vec![],
            layers: vec![],
            ensemble: Some(Ensemble {
                trees: vec![Tree {
                    nodes: vec![Node::Leaf(-0.0)],
                }],
                base_score: -0.0,
            }),
        };
        assert!(
            score_doc_reference(&r, &[1.0]).is_sign_negative(),
            "no 0.0 added in front"
        );
    }
}
