//! The invariants every ranker satisfies ([`validate`]), checked after reading a file and by the
//! importers.

use super::{MAX_CATEGORY, MAX_FEATURES};
use crate::rank::error::RankerError;
use crate::rank::model::{Decision, Expr, FeatureIdx, Input, Node, Ranker, Tree};

pub(super) fn check_features(features: &[String]) -> Result<(), RankerError> {
    if features.len() > MAX_FEATURES {
        return Err(RankerError::invalid(
            "features",
            format!(
                "expected at most {MAX_FEATURES} feature names, got {}",
                features.len()
            ),
        ));
    }
    let mut seen = std::collections::HashMap::with_capacity(features.len());
    for (i, name) in features.iter().enumerate() {
        if name.is_empty() {
            return Err(RankerError::invalid(
                format!("features[{i}]"),
                "expected a name, got \"\"",
            ));
        }
        if let Some(first) = seen.insert(name.as_str(), i) {
            return Err(RankerError::invalid(
                format!("features[{i}]"),
                format!("duplicate feature name {name:?} (also features[{first}])"),
            ));
        }
    }
    Ok(())
}

/// Checks every invariant that [`crate::rank::model`] documents: unique non-empty feature names
/// (at most [`MAX_FEATURES`]), feature indices in range, finite numbers (f32 ones too),
/// `lower < upper` in buckets, trees that are trees (child indices in range, every node reached
/// exactly once from node 0, so no cycles), sorted category sets, layer shapes that chain from
/// `inputs.len()` to one output, and something to score.
///
/// # Errors
/// The first violation, as [`RankerError::Invalid`] naming the field path.
pub fn validate(ranker: &Ranker) -> Result<(), RankerError> {
    check_features(&ranker.features)?;
    let n_features = ranker.features.len();
    if n_features == 0 {
        return Err(RankerError::invalid(
            "features",
            "expected at least one feature name, got none",
        ));
    }
    if ranker.inputs.is_empty() && ranker.ensemble.is_none() {
        return Err(RankerError::invalid(
            "inputs",
            "a ranker needs at least one input or an `ensemble`, got neither",
        ));
    }
    for (i, input) in ranker.inputs.iter().enumerate() {
        let path = format!("inputs[{i}]");
        match input {
            Input::Linear {
                feature,
                slope,
                intercept,
            }
            | Input::LogLinear {
                feature,
                slope,
                intercept,
            } => {
                check_feature(*feature, n_features, &format!("{path}.feature"))?;
                check_finite(f64::from(*slope), &format!("{path}.slope"))?;
                check_finite(f64::from(*intercept), &format!("{path}.intercept"))?;
            }
            Input::Bucket {
                feature,
                lower,
                upper,
            } => {
                check_feature(*feature, n_features, &format!("{path}.feature"))?;
                check_finite(*lower, &format!("{path}.lower"))?;
                check_finite(*upper, &format!("{path}.upper"))?;
                if lower >= upper {
                    return Err(RankerError::invalid(
                        format!("{path}.upper"),
                        format!("expected lower < upper, got lower {lower:?} and upper {upper:?}"),
                    ));
                }
            }
            Input::FreeForm(ff) => check_expr(&ff.expr, n_features, &format!("{path}.expr"))?,
            Input::Tree(tree) => check_tree(tree, n_features, true, &format!("{path}.tree"))?,
            Input::Dummy => {}
        }
    }
    let mut width = ranker.inputs.len();
    for (l, layer) in ranker.layers.iter().enumerate() {
        let path = format!("layers[{l}]");
        if layer.inputs != width {
            let fed_by = if l == 0 {
                "the number of inputs".to_string()
            } else {
                format!("layers[{}]'s outputs", l - 1)
            };
            return Err(RankerError::invalid(
                format!("{path}.weights"),
                format!(
                    "expected rows of {width} weights ({fed_by}), got rows of {}",
                    layer.inputs
                ),
            ));
        }
        if layer.outputs == 0 {
            return Err(RankerError::invalid(
                format!("{path}.weights"),
                "expected at least one row, got none",
            ));
        }
        if layer.weights.len() != layer.inputs * layer.outputs {
            return Err(RankerError::invalid(
                format!("{path}.weights"),
                format!(
                    "expected {}×{} = {} weights, got {}",
                    layer.outputs,
                    layer.inputs,
                    layer.inputs * layer.outputs,
                    layer.weights.len()
                ),
            ));
        }
        if layer.bias.len() != layer.outputs {
            return Err(RankerError::invalid(
                format!("{path}.bias"),
                format!(
                    "expected {} entries (one per row of weights), got {}",
                    layer.outputs,
                    layer.bias.len()
                ),
            ));
        }
        for (k, w) in layer.weights.iter().enumerate() {
            check_finite(
                f64::from(*w),
                &format!("{path}.weights[{}][{}]", k / layer.inputs, k % layer.inputs),
            )?;
        }
        for (o, b) in layer.bias.iter().enumerate() {
            check_finite(f64::from(*b), &format!("{path}.bias[{o}]"))?;
        }
        width = layer.outputs;
    }
    if !ranker.layers.is_empty() && width != 1 {
        return Err(RankerError::invalid(
            format!("layers[{}].weights", ranker.layers.len() - 1),
            format!("the last layer must have 1 output, got {width}"),
        ));
    }
    if let Some(ensemble) = &ranker.ensemble {
        check_finite(ensemble.base_score, "ensemble.base_score")?;
        for (t, tree) in ensemble.trees.iter().enumerate() {
            check_tree(tree, n_features, false, &format!("ensemble.trees[{t}]"))?;
        }
    }
    Ok(())
}

fn check_feature(feature: FeatureIdx, n_features: usize, path: &str) -> Result<(), RankerError> {
    if (feature as usize) < n_features {
        Ok(())
    } else {
        Err(RankerError::invalid(
            path,
            format!("feature index {feature} is outside `features` (0..{n_features})"),
        ))
    }
}

fn check_finite(value: f64, path: &str) -> Result<(), RankerError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(RankerError::invalid(
            path,
            format!("expected a finite number, got {value:?}"),
        ))
    }
}

fn check_expr(expr: &Expr, n_features: usize, path: &str) -> Result<(), RankerError> {
    match expr {
        Expr::Const(c) => check_finite(f64::from(*c), path),
        Expr::Feature(f) => check_feature(*f, n_features, path),
        Expr::Neg(e) => check_expr(e, n_features, path),
        Expr::Binary(_, a, b) => {
            check_expr(a, n_features, path)?;
            check_expr(b, n_features, path)
        }
        Expr::Call(func, args) => {
            let arity = match func {
                crate::rank::model::Func::Ln | crate::rank::model::Func::Exp => 1,
                crate::rank::model::Func::Min | crate::rank::model::Func::Max => 2,
            };
            if args.len() != arity {
                return Err(RankerError::invalid(
                    path,
                    format!("{func:?} takes {arity} argument(s), got {}", args.len()),
                ));
            }
            args.iter()
                .try_for_each(|a| check_expr(a, n_features, path))
        }
    }
}

/// `leaf_as_f32`: the tree is a model input, whose leaf value is read as f32.
fn check_tree(
    tree: &Tree,
    n_features: usize,
    leaf_as_f32: bool,
    path: &str,
) -> Result<(), RankerError> {
    let n = tree.nodes.len();
    if n == 0 {
        return Err(RankerError::invalid(
            format!("{path}.nodes"),
            "expected at least one node, got none",
        ));
    }
    let mut reached = vec![false; n];
    reached[0] = true;
    let mut stack = vec![0usize];
    while let Some(i) = stack.pop() {
        let node_path = format!("{path}.nodes[{i}]");
        match &tree.nodes[i] {
            Node::Leaf(v) => {
                check_finite(*v, &format!("{node_path}.leaf"))?;
                if leaf_as_f32 && !(*v as f32).is_finite() {
                    return Err(RankerError::invalid(
                        format!("{node_path}.leaf"),
                        format!("expected a finite f32 (a tree input is read as f32), got {v:?}"),
                    ));
                }
            }
            Node::Split(s) => {
                check_feature(s.feature, n_features, &format!("{node_path}.feature"))?;
                match &s.decision {
                    Decision::LeF64(t) => check_finite(*t, &format!("{node_path}.threshold"))?,
                    Decision::LtF32(t) => {
                        check_finite(f64::from(*t), &format!("{node_path}.threshold"))?
                    }
                    Decision::In(set) => {
                        if let Some(w) = set.windows(2).position(|w| w[0] >= w[1]) {
                            return Err(RankerError::invalid(
                                format!("{node_path}.categories[{}]", w + 1),
                                "expected categories sorted and without duplicates",
                            ));
                        }
                        if let Some(c) = set.iter().position(|&c| c > MAX_CATEGORY) {
                            return Err(RankerError::invalid(
                                format!("{node_path}.categories[{c}]"),
                                format!(
                                    "expected a category in 0..={MAX_CATEGORY}, got {}",
                                    set[c]
                                ),
                            ));
                        }
                    }
                }
                for (name, child) in [("left", s.left), ("right", s.right)] {
                    let child = child as usize;
                    if child >= n {
                        return Err(RankerError::invalid(
                            format!("{node_path}.{name}"),
                            format!("child index {child} is outside the tree (0..{n})"),
                        ));
                    }
                    if reached[child] {
                        return Err(RankerError::invalid(
                            format!("{node_path}.{name}"),
                            format!(
                                "child index {child} is already reached from the root \
                                 (a cycle, or a node with two parents)"
                            ),
                        ));
                    }
                    reached[child] = true;
                    stack.push(child);
                }
            }
        }
    }
    if let Some(orphan) = reached.iter().position(|r| !r) {
        return Err(RankerError::invalid(
            format!("{path}.nodes[{orphan}]"),
            "node is not reachable from the root (nodes[0])",
        ));
    }
    Ok(())
}
