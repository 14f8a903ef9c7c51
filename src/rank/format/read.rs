//! Reading a native ranker file: the file structs serde parses, and their conversion into a
//! [`Ranker`] (names resolved, f32 ranges, integer categories and node shapes checked).

use serde::Deserialize;

use super::invariants::{check_features, validate};
use super::{FORMAT_NAME, FORMAT_VERSION, MAX_CATEGORY};
use crate::rank::error::RankerError;
use crate::rank::freeform;
use crate::rank::model::{
    Activation, Decision, Ensemble, FeatureIdx, FreeForm, Input, Layer, Missing, Node, Ranker,
    Split, Tree,
};

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
