//! The native ranker file (DESIGN §5, schema and semantics in `docs/ranker-format.md`): reading
//! it into a validated [`Ranker`], writing a [`Ranker`] back, and the invariants every ranker
//! satisfies ([`validate`], which the importers call too).
//!
//! Reading happens in two steps: serde parses the JSON into file structs (type errors carry the
//! line and column), then the conversion resolves names, checks what the model types cannot
//! hold (f32 range, integer categories, node shapes) and [`validate`] checks the rest, each
//! error naming its field path (`inputs[17].upper`, `ensemble.trees[3].nodes[12].left`).

use std::fmt::Write as _;

use serde::Deserialize;

use crate::rank::error::RankerError;
use crate::rank::freeform;
use crate::rank::model::{
    Activation, Decision, Ensemble, Expr, FeatureIdx, FreeForm, Input, Layer, Missing, Node,
    Ranker, Split, Tree,
};

/// The value of the file's `format` field.
pub const FORMAT_NAME: &str = "rankserve-ranker";
/// The only file version this build reads and writes.
pub const FORMAT_VERSION: u64 = 1;
/// The largest category an `in` split may list: a category is a feature value truncated to a
/// C `int` (as LightGBM does), so larger ones can never match.
pub const MAX_CATEGORY: u32 = i32::MAX as u32;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRanker {
    format: String,
    version: u64,
    features: Vec<String>,
    #[serde(default)]
    inputs: Vec<FileInput>,
    #[serde(default)]
    layers: Vec<FileLayer>,
    #[serde(default)]
    ensemble: Option<FileEnsemble>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum FileInput {
    Linear {
        feature: String,
        slope: f64,
        intercept: f64,
    },
    Loglinear {
        feature: String,
        slope: f64,
        intercept: f64,
    },
    Bucket {
        feature: String,
        lower: f64,
        upper: f64,
    },
    Freeform {
        expr: String,
    },
    Tree {
        tree: FileTree,
    },
    Dummy {},
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTree {
    nodes: Vec<FileNode>,
}

/// A node as written: a leaf has only `leaf`; a split has `feature`, `left`, `right` and either
/// `threshold` (numeric decisions) or `categories` (`in`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNode {
    leaf: Option<f64>,
    feature: Option<i64>,
    decision: Option<String>,
    threshold: Option<f64>,
    categories: Option<Vec<f64>>,
    missing: Option<String>,
    default_left: Option<bool>,
    left: Option<i64>,
    right: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLayer {
    weights: Vec<Vec<f64>>,
    bias: Vec<f64>,
    activation: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEnsemble {
    trees: Vec<FileTree>,
    #[serde(default)]
    base_score: f64,
}

/// Reads a native ranker file and validates it.
///
/// # Errors
/// [`RankerError::Json`] (with line and column) for bytes that are not JSON of the file's shape;
/// [`RankerError::Invalid`] / [`RankerError::FreeForm`] naming the field path otherwise.
pub fn parse_native(bytes: &[u8]) -> Result<Ranker, RankerError> {
    let file: FileRanker = serde_json::from_slice(bytes).map_err(|e| RankerError::from_json(&e))?;
    if file.format != FORMAT_NAME {
        return Err(RankerError::invalid(
            "format",
            format!("expected {FORMAT_NAME:?}, got {:?}", file.format),
        ));
    }
    if file.version != FORMAT_VERSION {
        return Err(RankerError::invalid(
            "version",
            format!("expected {FORMAT_VERSION}, got {}", file.version),
        ));
    }
    let features = file.features;
    check_features(&features)?;
    let inputs = file
        .inputs
        .into_iter()
        .enumerate()
        .map(|(i, input)| convert_input(input, &features, &format!("inputs[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let layers = file
        .layers
        .into_iter()
        .enumerate()
        .map(|(l, layer)| convert_layer(layer, &format!("layers[{l}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let ensemble = match file.ensemble {
        None => None,
        Some(e) => Some(Ensemble {
            trees: e
                .trees
                .into_iter()
                .enumerate()
                .map(|(t, tree)| convert_tree(tree, &format!("ensemble.trees[{t}]")))
                .collect::<Result<Vec<_>, _>>()?,
            base_score: e.base_score,
        }),
    };
    let ranker = Ranker {
        features,
        inputs,
        layers,
        ensemble,
    };
    validate(&ranker)?;
    Ok(ranker)
}

fn feature_index(name: &str, features: &[String], path: &str) -> Result<FeatureIdx, RankerError> {
    features
        .iter()
        .position(|f| f == name)
        .map(|i| i as FeatureIdx)
        .ok_or_else(|| RankerError::invalid(path, format!("feature {name:?} is not in `features`")))
}

fn to_f32(value: f64, path: &str) -> Result<f32, RankerError> {
    let v = value as f32;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(RankerError::invalid(
            path,
            format!("expected a finite f32, got {value:?} (out of f32 range)"),
        ))
    }
}

fn convert_input(input: FileInput, features: &[String], path: &str) -> Result<Input, RankerError> {
    let feature_at = |name: &str| feature_index(name, features, &format!("{path}.feature"));
    Ok(match input {
        FileInput::Linear {
            feature,
            slope,
            intercept,
        } => Input::Linear {
            feature: feature_at(&feature)?,
            slope: to_f32(slope, &format!("{path}.slope"))?,
            intercept: to_f32(intercept, &format!("{path}.intercept"))?,
        },
        FileInput::Loglinear {
            feature,
            slope,
            intercept,
        } => Input::LogLinear {
            feature: feature_at(&feature)?,
            slope: to_f32(slope, &format!("{path}.slope"))?,
            intercept: to_f32(intercept, &format!("{path}.intercept"))?,
        },
        FileInput::Bucket {
            feature,
            lower,
            upper,
        } => Input::Bucket {
            feature: feature_at(&feature)?,
            lower,
            upper,
        },
        FileInput::Freeform { expr } => {
            let parsed =
                freeform::parse(&expr, features).map_err(|error| RankerError::FreeForm {
                    path: format!("{path}.expr"),
                    error,
                })?;
            Input::FreeForm(FreeForm {
                source: expr,
                expr: parsed,
            })
        }
        FileInput::Tree { tree } => Input::Tree(convert_tree(tree, &format!("{path}.tree"))?),
        FileInput::Dummy {} => Input::Dummy,
    })
}

fn convert_tree(tree: FileTree, path: &str) -> Result<Tree, RankerError> {
    let nodes = tree
        .nodes
        .into_iter()
        .enumerate()
        .map(|(n, node)| convert_node(node, &format!("{path}.nodes[{n}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Tree { nodes })
}

fn convert_node(node: FileNode, path: &str) -> Result<Node, RankerError> {
    if let Some(leaf) = node.leaf {
        let split_fields = [
            ("feature", node.feature.is_some()),
            ("decision", node.decision.is_some()),
            ("threshold", node.threshold.is_some()),
            ("categories", node.categories.is_some()),
            ("missing", node.missing.is_some()),
            ("default_left", node.default_left.is_some()),
            ("left", node.left.is_some()),
            ("right", node.right.is_some()),
        ];
        if let Some((name, _)) = split_fields.iter().find(|(_, present)| *present) {
            return Err(RankerError::invalid(
                format!("{path}.{name}"),
                "a leaf node (with `leaf`) has no split fields",
            ));
        }
        return Ok(Node::Leaf(leaf));
    }
    let required = |v: Option<i64>, name: &str| {
        v.ok_or_else(|| {
            RankerError::invalid(
                path,
                format!("a split node needs `{name}` (or the node is a `leaf`)"),
            )
        })
    };
    let index = |v: i64, name: &str| {
        u32::try_from(v).map_err(|_| {
            RankerError::invalid(
                format!("{path}.{name}"),
                format!("expected a node/feature index ≥ 0, got {v}"),
            )
        })
    };
    let feature = index(required(node.feature, "feature")?, "feature")?;
    let left = index(required(node.left, "left")?, "left")?;
    let right = index(required(node.right, "right")?, "right")?;
    let decision_name = node.decision.as_deref().unwrap_or("le_f64");
    let decision = match decision_name {
        "le_f64" | "lt_f32" => {
            if node.categories.is_some() {
                return Err(RankerError::invalid(
                    format!("{path}.categories"),
                    format!("a {decision_name:?} split has a `threshold`, not `categories`"),
                ));
            }
            let threshold = node.threshold.ok_or_else(|| {
                RankerError::invalid(path, format!("a {decision_name:?} split needs `threshold`"))
            })?;
            if decision_name == "le_f64" {
                Decision::LeF64(threshold)
            } else {
                Decision::LtF32(to_f32(threshold, &format!("{path}.threshold"))?)
            }
        }
        "in" => {
            if node.threshold.is_some() {
                return Err(RankerError::invalid(
                    format!("{path}.threshold"),
                    "an \"in\" split has `categories`, not `threshold`",
                ));
            }
            let cats = node
                .categories
                .ok_or_else(|| RankerError::invalid(path, "an \"in\" split needs `categories`"))?;
            let mut set = Vec::with_capacity(cats.len());
            for (c, v) in cats.iter().enumerate() {
                if !(v.fract() == 0.0 && *v >= 0.0 && *v <= MAX_CATEGORY as f64) {
                    return Err(RankerError::invalid(
                        format!("{path}.categories[{c}]"),
                        format!("expected an integer category in 0..={MAX_CATEGORY}, got {v:?}"),
                    ));
                }
                set.push(*v as u32);
            }
            set.sort_unstable();
            set.dedup();
            Decision::In(set)
        }
        other => {
            return Err(RankerError::invalid(
                format!("{path}.decision"),
                format!("expected \"le_f64\", \"lt_f32\" or \"in\", got {other:?}"),
            ))
        }
    };
    let missing = match node.missing.as_deref().unwrap_or("none") {
        "none" => Missing::None,
        "zero" => Missing::Zero,
        "nan" => Missing::Nan,
        other => {
            return Err(RankerError::invalid(
                format!("{path}.missing"),
                format!("expected \"none\", \"zero\" or \"nan\", got {other:?}"),
            ))
        }
    };
    Ok(Node::Split(Split {
        feature,
        decision,
        missing,
        default_left: node.default_left.unwrap_or(false),
        left,
        right,
    }))
}

fn convert_layer(layer: FileLayer, path: &str) -> Result<Layer, RankerError> {
    let outputs = layer.weights.len();
    let inputs = layer.weights.first().map_or(0, Vec::len);
    let mut weights = Vec::with_capacity(outputs * inputs);
    for (o, row) in layer.weights.iter().enumerate() {
        if row.len() != inputs {
            return Err(RankerError::invalid(
                format!("{path}.weights[{o}]"),
                format!(
                    "expected {inputs} weights (as weights[0]), got {}",
                    row.len()
                ),
            ));
        }
        for (i, w) in row.iter().enumerate() {
            weights.push(to_f32(*w, &format!("{path}.weights[{o}][{i}]"))?);
        }
    }
    let bias = layer
        .bias
        .iter()
        .enumerate()
        .map(|(o, b)| to_f32(*b, &format!("{path}.bias[{o}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let activation = match layer.activation.as_str() {
        "identity" => Activation::Identity,
        "relu" => Activation::Relu,
        "tanh" => Activation::Tanh,
        "sigmoid" => Activation::Sigmoid,
        other => {
            return Err(RankerError::invalid(
                format!("{path}.activation"),
                format!("expected \"identity\", \"relu\", \"tanh\" or \"sigmoid\", got {other:?}"),
            ))
        }
    };
    Ok(Layer {
        inputs,
        outputs,
        weights,
        bias,
        activation,
    })
}

fn check_features(features: &[String]) -> Result<(), RankerError> {
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

/// Checks every invariant that [`crate::rank::model`] documents: unique non-empty feature names,
/// feature indices in range, finite numbers (f32 ones too), `lower < upper` in buckets, trees
/// that are trees (child indices in range, every node reached exactly once from node 0, so no
/// cycles), sorted category sets, layer shapes that chain from `inputs.len()` to one output,
/// and something to score.
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

/// Writes `ranker` as a native file: one item per line (features, inputs, tree nodes, weight
/// rows), numbers printed shortest-round-trip (f64 as f64, f32 as f32), fields equal to their
/// defaults left out. [`parse_native`] of the result gives back an equal ranker.
pub fn to_native_json(ranker: &Ranker) -> String {
    let mut out = String::new();
    out.push_str("{\n");
    let _ = writeln!(out, "  \"format\": {},", json_str(FORMAT_NAME));
    let _ = writeln!(out, "  \"version\": {FORMAT_VERSION},");
    out.push_str("  \"features\": [");
    push_list(
        &mut out,
        "    ",
        ranker.features.iter().map(|f| json_str(f)),
    );
    out.push(']');
    if !ranker.inputs.is_empty() {
        out.push_str(",\n  \"inputs\": [");
        let names = &ranker.features;
        let inputs: Vec<String> = ranker.inputs.iter().map(|i| input_json(i, names)).collect();
        push_list(&mut out, "    ", inputs.into_iter());
        out.push(']');
    }
    if !ranker.layers.is_empty() {
        out.push_str(",\n  \"layers\": [");
        let layers: Vec<String> = ranker.layers.iter().map(layer_json).collect();
        push_list(&mut out, "    ", layers.into_iter());
        out.push(']');
    }
    if let Some(e) = &ranker.ensemble {
        let _ = write!(
            out,
            ",\n  \"ensemble\": {{\"base_score\": {}, \"trees\": [",
            f64_str(e.base_score)
        );
        let trees: Vec<String> = e.trees.iter().map(tree_json).collect();
        push_list(&mut out, "    ", trees.into_iter());
        out.push_str("]}");
    }
    out.push_str("\n}\n");
    out
}

/// Pushes items one per line at `indent`, comma-separated, with a closing newline at the
/// indentation two less (the caller closes the bracket).
fn push_list(out: &mut String, indent: &str, items: impl Iterator<Item = String>) {
    let mut any = false;
    for (k, item) in items.enumerate() {
        out.push_str(if k == 0 { "\n" } else { ",\n" });
        out.push_str(indent);
        out.push_str(&item);
        any = true;
    }
    if any {
        out.push('\n');
        out.push_str(&indent[2..]);
    }
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

fn f64_str(v: f64) -> String {
    serde_json::Value::from(v).to_string()
}

fn f32_str(v: f32) -> String {
    // serde_json prints an f32 with the shortest digits that read back as the same f32.
    serde_json::to_string(&v).unwrap_or_else(|_| f64_str(f64::from(v)))
}

fn input_json(input: &Input, names: &[String]) -> String {
    let name = |f: &FeatureIdx| json_str(&names[*f as usize]);
    match input {
        Input::Linear {
            feature,
            slope,
            intercept,
        } => format!(
            "{{\"type\": \"linear\", \"feature\": {}, \"slope\": {}, \"intercept\": {}}}",
            name(feature),
            f32_str(*slope),
            f32_str(*intercept)
        ),
        Input::LogLinear {
            feature,
            slope,
            intercept,
        } => format!(
            "{{\"type\": \"loglinear\", \"feature\": {}, \"slope\": {}, \"intercept\": {}}}",
            name(feature),
            f32_str(*slope),
            f32_str(*intercept)
        ),
        Input::Bucket {
            feature,
            lower,
            upper,
        } => format!(
            "{{\"type\": \"bucket\", \"feature\": {}, \"lower\": {}, \"upper\": {}}}",
            name(feature),
            f64_str(*lower),
            f64_str(*upper)
        ),
        Input::FreeForm(ff) => format!(
            "{{\"type\": \"freeform\", \"expr\": {}}}",
            json_str(&ff.source)
        ),
        Input::Tree(tree) => format!("{{\"type\": \"tree\", \"tree\": {}}}", tree_json(tree)),
        Input::Dummy => "{\"type\": \"dummy\"}".to_string(),
    }
}

/// A tree on one line, nodes without spaces: production-sized rankers have 10⁵ nodes.
fn tree_json(tree: &Tree) -> String {
    let nodes: Vec<String> = tree.nodes.iter().map(node_json).collect();
    format!("{{\"nodes\": [{}]}}", nodes.join(","))
}

fn node_json(node: &Node) -> String {
    let s = match node {
        Node::Leaf(v) => return format!("{{\"leaf\":{}}}", f64_str(*v)),
        Node::Split(s) => s,
    };
    let mut out = format!("{{\"feature\":{}", s.feature);
    match &s.decision {
        Decision::LeF64(t) => {
            let _ = write!(out, ",\"threshold\":{}", f64_str(*t));
        }
        Decision::LtF32(t) => {
            let _ = write!(
                out,
                ",\"decision\":\"lt_f32\",\"threshold\":{}",
                f32_str(*t)
            );
        }
        Decision::In(set) => {
            let cats: Vec<String> = set.iter().map(u32::to_string).collect();
            let _ = write!(
                out,
                ",\"decision\":\"in\",\"categories\":[{}]",
                cats.join(",")
            );
        }
    }
    match s.missing {
        Missing::None => {}
        Missing::Zero => out.push_str(",\"missing\":\"zero\""),
        Missing::Nan => out.push_str(",\"missing\":\"nan\""),
    }
    if s.default_left {
        out.push_str(",\"default_left\":true");
    }
    let _ = write!(out, ",\"left\":{},\"right\":{}}}", s.left, s.right);
    out
}

fn layer_json(layer: &Layer) -> String {
    let activation = match layer.activation {
        Activation::Identity => "identity",
        Activation::Relu => "relu",
        Activation::Tanh => "tanh",
        Activation::Sigmoid => "sigmoid",
    };
    let row_str = |row: &[f32]| {
        row.iter()
            .map(|w| f32_str(*w))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = format!(
        "{{\"activation\": \"{activation}\", \"bias\": [{}], \"weights\": [",
        row_str(&layer.bias)
    );
    let rows = layer
        .weights
        .chunks(layer.inputs.max(1))
        .map(|r| format!("[{}]", row_str(r)));
    push_list(&mut out, "      ", rows);
    out.push_str("]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let err = reject(|v| v["features"][2] = "body.bm25f".into());
        assert_eq!(
            err,
            RankerError::invalid(
                "features[2]",
                "duplicate feature name \"body.bm25f\" (also features[0])"
            )
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
        let err = reject(|v| v["inputs"][2]["feature"] = "title.bm25f".into());
        assert_eq!(
            err,
            RankerError::invalid(
                "inputs[2].feature",
                "feature \"title.bm25f\" is not in `features`"
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
        let err = reject(|v| v["inputs"][2]["upper"] = 1.0.into());
        assert_eq!(
            err,
            RankerError::invalid(
                "inputs[2].upper",
                "expected lower < upper, got lower 1.0 and upper 1.0"
            )
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
        let err = reject(|v| v["ensemble"]["trees"][0]["nodes"][0]["right"] = 3.into());
        assert_eq!(
            err,
            RankerError::invalid(
                "ensemble.trees[0].nodes[0].right",
                "child index 3 is outside the tree (0..3)"
            )
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
        let err = reject(|v| {
            let nodes = v["inputs"][4]["tree"]["nodes"].as_array_mut().unwrap();
            nodes.push(serde_json::json!({"leaf": 1.0}));
        });
        assert_eq!(
            err,
            RankerError::invalid(
                "inputs[4].tree.nodes[5]",
                "node is not reachable from the root (nodes[0])"
            )
        );
    }

    #[test]
    fn rejects_empty_tree() {
        let err = reject(|v| v["ensemble"]["trees"][1]["nodes"] = serde_json::json!([]));
        assert_eq!(invalid_at(err), "ensemble.trees[1].nodes");
    }

    #[test]
    fn rejects_split_feature_out_of_range() {
        let err = reject(|v| v["ensemble"]["trees"][0]["nodes"][0]["feature"] = 3.into());
        assert_eq!(
            err,
            RankerError::invalid(
                "ensemble.trees[0].nodes[0].feature",
                "feature index 3 is outside `features` (0..3)"
            )
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
        let err = reject(|v| v["layers"][0]["weights"][1] = serde_json::json!([1, 1, 1]));
        assert_eq!(
            err,
            RankerError::invalid(
                "layers[0].weights[1]",
                "expected 6 weights (as weights[0]), got 3"
            )
        );
    }

    #[test]
    fn rejects_first_layer_width_not_matching_inputs() {
        let err = reject(|v| {
            v["inputs"].as_array_mut().unwrap().pop();
        });
        assert_eq!(
            err,
            RankerError::invalid(
                "layers[0].weights",
                "expected rows of 5 weights (the number of inputs), got rows of 6"
            )
        );
    }

    #[test]
    fn rejects_layers_that_do_not_chain() {
        let err = reject(|v| v["layers"][1]["weights"] = serde_json::json!([[1.0, 2.0, 3.0]]));
        assert_eq!(invalid_at(err), "layers[1].weights");
    }

    #[test]
    fn rejects_last_layer_with_more_than_one_output() {
        let err = reject(|v| {
            v["layers"].as_array_mut().unwrap().pop();
        });
        assert_eq!(
            err,
            RankerError::invalid(
                "layers[0].weights",
                "the last layer must have 1 output, got 2"
            )
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
