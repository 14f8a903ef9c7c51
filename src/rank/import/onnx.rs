//! ONNX (`.onnx`: a protobuf `ModelProto`) → [`Ranker`]: tree ensembles (`ai.onnx.ml`
//! `TreeEnsembleRegressor`, as onnxmltools writes LightGBM / XGBoost models and skl2onnx writes
//! scikit-learn gradient boosting, and the opset-5 `TreeEnsemble`) into the ranker's ensemble,
//! and small MLPs (`Gemm`, or `MatMul` then `Add`, each optionally followed by `Relu`, `Sigmoid`
//! or `Tanh`, as PyTorch exports `nn.Linear` stacks) into its NN layers.
//!
//! The graph must be one chain: one float tensor input `[N, F]`, each node consuming the previous
//! node's output (and initializers), one output. `Identity` nodes are passed through. Anything
//! else — another op, a second input, an attribute outside the supported set — is refused naming
//! the node and what is supported; nothing is imported approximately.
//!
//! onnxruntime reads the input as f32 and, for trees, compares it with f32 thresholds. The
//! ranker's features are f64, so every comparison is made on `f32(x)` (rounded to nearest, as
//! numpy's `astype(float32)`): `BRANCH_LT` is the ranker's `lt_f32`, `BRANCH_LEQ` is `lt_f32` with
//! the next f32 above the threshold (exact, see [`super::le_f32`]); `GTE` and `GT` are those with
//! the branches swapped; `EQ` and `NEQ` become two splits (`< t`, then `<= t`) with the other
//! branch's subtree copied. A NaN goes to the true branch when `nodes_missing_value_tracks_true`
//! is 1 (and always for `NEQ`, since NaN != t), else to the false branch, as onnxruntime's
//! `val CMP t || (tracks_true && isnan(val))`. Leaf weights are f32 and summed here in f64;
//! onnxruntime sums in f32, so the two differ by a few f32 roundings of the sum.
//!
//! The protobuf messages are the subset of `onnx/onnx.proto` (ONNX 1.17) read here, declared by
//! hand with prost's derive and the file's field numbers (protobuf never reuses them), so no
//! protoc is needed.

use std::collections::HashMap;

use super::{ranker_from_trees, Format, ImportError};
use crate::rank::format::{validate, MAX_FEATURES};
use crate::rank::model::{Activation, Decision, Input, Layer, Missing, Node, Ranker, Split, Tree};
use crate::rank::RankerError;

const ONNX: Format = Format("ONNX");

/// How many times its ONNX node count a tree may grow by copying the subtrees of `BRANCH_EQ` /
/// `BRANCH_NEQ` nodes (each copies one subtree; a chain of them copies exponentially).
const COPY_GROWTH: usize = 8;

/// The subset of `onnx.proto` the import reads (field numbers from `onnx/onnx.proto`).
mod proto {
    use prost::Message;

    #[derive(Clone, PartialEq, Message)]
    pub struct ModelProto {
        #[prost(int64, tag = "1")]
        pub ir_version: i64,
        #[prost(message, optional, tag = "7")]
        pub graph: Option<GraphProto>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct GraphProto {
        #[prost(message, repeated, tag = "1")]
        pub node: Vec<NodeProto>,
        #[prost(message, repeated, tag = "5")]
        pub initializer: Vec<TensorProto>,
        #[prost(message, repeated, tag = "11")]
        pub input: Vec<ValueInfoProto>,
        #[prost(message, repeated, tag = "12")]
        pub output: Vec<ValueInfoProto>,
        /// Only counted: sparse initializers are refused.
        #[prost(bytes = "vec", repeated, tag = "15")]
        pub sparse_initializer: Vec<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct NodeProto {
        #[prost(string, repeated, tag = "1")]
        pub input: Vec<String>,
        #[prost(string, repeated, tag = "2")]
        pub output: Vec<String>,
        #[prost(string, tag = "3")]
        pub name: String,
        #[prost(string, tag = "4")]
        pub op_type: String,
        #[prost(message, repeated, tag = "5")]
        pub attribute: Vec<AttributeProto>,
        #[prost(string, tag = "7")]
        pub domain: String,
    }

    /// `AttributeProto.AttributeType` values used here.
    pub const FLOAT: i32 = 1;
    pub const INT: i32 = 2;
    pub const STRING: i32 = 3;
    pub const TENSOR: i32 = 4;
    pub const FLOATS: i32 = 6;
    pub const INTS: i32 = 7;
    pub const STRINGS: i32 = 8;

    #[derive(Clone, PartialEq, Message)]
    pub struct AttributeProto {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(float, tag = "2")]
        pub f: f32,
        #[prost(int64, tag = "3")]
        pub i: i64,
        #[prost(bytes = "vec", tag = "4")]
        pub s: Vec<u8>,
        #[prost(message, optional, tag = "5")]
        pub t: Option<TensorProto>,
        #[prost(float, repeated, packed = "false", tag = "7")]
        pub floats: Vec<f32>,
        #[prost(int64, repeated, packed = "false", tag = "8")]
        pub ints: Vec<i64>,
        #[prost(bytes = "vec", repeated, tag = "9")]
        pub strings: Vec<Vec<u8>>,
        #[prost(int32, tag = "20")]
        pub r#type: i32,
    }

    /// `TensorProto.DataType.FLOAT`.
    pub const DATA_FLOAT: i32 = 1;
    /// `TensorProto.DataType.UINT8`.
    pub const DATA_UINT8: i32 = 2;
    /// `TensorProto.DataLocation.EXTERNAL`.
    pub const EXTERNAL: i32 = 1;

    #[derive(Clone, PartialEq, Message)]
    pub struct TensorProto {
        #[prost(int64, repeated, packed = "false", tag = "1")]
        pub dims: Vec<i64>,
        #[prost(int32, tag = "2")]
        pub data_type: i32,
        #[prost(float, repeated, tag = "4")]
        pub float_data: Vec<f32>,
        /// Also holds the smaller integer types (uint8 and the like), one per entry.
        #[prost(int32, repeated, tag = "5")]
        pub int32_data: Vec<i32>,
        #[prost(string, tag = "8")]
        pub name: String,
        #[prost(bytes = "vec", tag = "9")]
        pub raw_data: Vec<u8>,
        #[prost(int32, tag = "14")]
        pub data_location: i32,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct ValueInfoProto {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub r#type: Option<TypeProto>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct TypeProto {
        /// The `tensor_type` case of the `value` oneof; other cases leave it unset.
        #[prost(message, optional, tag = "1")]
        pub tensor_type: Option<TensorType>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct TensorType {
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        #[prost(message, optional, tag = "2")]
        pub shape: Option<TensorShapeProto>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct TensorShapeProto {
        #[prost(message, repeated, tag = "1")]
        pub dim: Vec<Dimension>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct Dimension {
        #[prost(int64, optional, tag = "1")]
        pub dim_value: Option<i64>,
        #[prost(string, optional, tag = "2")]
        pub dim_param: Option<String>,
    }

    /// Decodes a `ModelProto`.
    pub fn decode(bytes: &[u8]) -> Result<ModelProto, prost::DecodeError> {
        ModelProto::decode(bytes)
    }
}

use proto::{AttributeProto, NodeProto, TensorProto};

/// Whether `bytes` decode as an ONNX `ModelProto` with an IR version and a graph (what
/// [`super::detect`] takes for ONNX once the bytes are not JSON).
pub fn is_onnx(bytes: &[u8]) -> bool {
    proto::decode(bytes).is_ok_and(|m| m.ir_version > 0 && m.graph.is_some())
}

/// Imports an ONNX model: a `TreeEnsembleRegressor` or `TreeEnsemble` as an ensemble-only ranker, or a chain of
/// `Gemm` / `MatMul`+`Add` layers and activations as NN layers fed by the features as they are.
/// The features are the input tensor's columns, named `f0`, `f1`, ...
///
/// # Errors
/// [`RankerError::Import`] naming the node (index, name, op), the attribute and what is supported
/// (anything outside the supported subset, malformed protobuf), or the [`validate`] error of the
/// result.
pub fn import_onnx(bytes: &[u8]) -> Result<Ranker, RankerError> {
    let ranker = build(bytes)?;
    validate(&ranker)?;
    Ok(ranker)
}

const SUPPORTED_OPS: &str =
    "ai.onnx.ml TreeEnsembleRegressor or TreeEnsemble (alone), or Gemm, MatMul, Add (the \
                             bias of a MatMul), Relu, Sigmoid, Tanh; Identity anywhere";

fn build(bytes: &[u8]) -> Result<Ranker, ImportError> {
    let model = proto::decode(bytes)
        .map_err(|e| ONNX.invalid("(protobuf)", format!("not an ONNX ModelProto: {e}")))?;
    if model.ir_version <= 0 {
        return Err(ONNX.invalid(
            "ir_version",
            format!("expected a positive IR version, got {}", model.ir_version),
        ));
    }
    let graph = model
        .graph
        .ok_or_else(|| ONNX.invalid("graph", "missing: the model has no graph"))?;
    if !graph.sparse_initializer.is_empty() {
        return Err(ONNX.unsupported(
            "graph.sparse_initializer",
            "sparse initializers are not supported (store weights as dense initializers)",
        ));
    }
    let initializers: HashMap<&str, &TensorProto> = graph
        .initializer
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    // Older exporters list the initializers among the inputs too.
    let inputs: Vec<_> = graph
        .input
        .iter()
        .filter(|v| !initializers.contains_key(v.name.as_str()))
        .collect();
    let [input] = inputs.as_slice() else {
        let names: Vec<_> = inputs.iter().map(|v| v.name.as_str()).collect();
        return Err(ONNX.unsupported(
            "graph.input",
            format!(
                "{} inputs {names:?}; supported: one float tensor input [N, F]",
                names.len()
            ),
        ));
    };
    let declared_width = input_width(input)?;
    let mut current = input.name.as_str();
    let mut trees: Option<(Vec<Tree>, f64, usize)> = None;
    let mut mlp = Mlp::default();
    for (i, node) in graph.node.iter().enumerate() {
        let at = format!(
            "graph.node[{i}] (name {:?}, op {})",
            node.name,
            op_name(node)
        );
        let domain = node.domain.as_str();
        let standard = domain.is_empty() || domain == "ai.onnx";
        // The node's inputs other than the chain's current value: initializers.
        let chained = |rest_ok: usize| -> Result<Vec<&TensorProto>, ImportError> {
            chain_inputs(node, &at, current, &initializers, rest_ok)
        };
        match (standard, domain, node.op_type.as_str()) {
            (true, _, "Identity") => {
                check_attributes(node, &at, &[])?;
                chained(0)?;
            }
            (_, "ai.onnx.ml", op @ ("TreeEnsembleRegressor" | "TreeEnsemble")) => {
                chained(0)?;
                if trees.is_some() || !mlp.is_empty() {
                    return Err(ONNX.unsupported(
                        at,
                        "a tree ensemble must be the graph's only computing node (a ranker \
                         cannot feed trees into layers or sum two ensembles' outputs)",
                    ));
                }
                trees = Some(if op == "TreeEnsemble" {
                    tree_ensemble(node, &at, declared_width)?
                } else {
                    tree_ensemble_regressor(node, &at, declared_width)?
                });
            }
            (true, _, "Gemm" | "MatMul" | "Add" | "Relu" | "Sigmoid" | "Tanh") => {
                if trees.is_some() {
                    return Err(ONNX.unsupported(
                        at,
                        "layers after a tree ensemble cannot be represented (a ranker's trees \
                         are added to the score)",
                    ));
                }
                mlp.step(node, &at, current, &initializers)?;
            }
            _ => {
                return Err(ONNX.unsupported(
                    at,
                    format!(
                        "op {} is not supported; supported: {SUPPORTED_OPS}",
                        op_name(node)
                    ),
                ))
            }
        }
        let [out] = node.output.as_slice() else {
            return Err(ONNX.unsupported(
                format!("{at}.output"),
                format!("{} outputs; supported: one", node.output.len()),
            ));
        };
        current = out;
    }
    // Checked after the nodes, so that an unsupported op is what a graph of one is refused for.
    let [output] = graph.output.as_slice() else {
        return Err(ONNX.unsupported(
            "graph.output",
            format!(
                "{} outputs; supported: one output (a ranker has one score)",
                graph.output.len()
            ),
        ));
    };
    if current != output.name {
        return Err(ONNX.unsupported(
            "graph.output[0]",
            format!(
                "the output is {:?} but the chain of nodes ends in {current:?}; the graph must \
                 be one chain from the input to the output",
                output.name
            ),
        ));
    }
    if let Some((trees, base, used_width)) = trees {
        let width = declared_width.unwrap_or(used_width).max(1);
        return Ok(ranker_from_trees(feature_names(width)?, trees, base));
    }
    mlp.finish(declared_width)
}

/// `domain::op_type`, or `op_type` in the default domain.
fn op_name(node: &NodeProto) -> String {
    match node.domain.as_str() {
        "" | "ai.onnx" => node.op_type.clone(),
        d => format!("{d}::{}", node.op_type),
    }
}

/// `f0`, `f1`, ... for `width` columns, bounded by the feature limit first.
fn feature_names(width: usize) -> Result<Vec<String>, ImportError> {
    if width > MAX_FEATURES {
        return Err(ONNX.invalid(
            "graph.input[0]",
            format!("expected at most {MAX_FEATURES} features, got {width}"),
        ));
    }
    Ok((0..width).map(|i| format!("f{i}")).collect())
}

/// The input's column count `F` when its shape says it: it must be a float tensor of rank 2.
fn input_width(input: &proto::ValueInfoProto) -> Result<Option<usize>, ImportError> {
    let path = format!("graph.input {:?}", input.name);
    let tensor = input
        .r#type
        .as_ref()
        .and_then(|t| t.tensor_type.as_ref())
        .ok_or_else(|| {
            ONNX.unsupported(
                path.clone(),
                "not a tensor; supported: one float tensor input [N, F]",
            )
        })?;
    if tensor.elem_type != proto::DATA_FLOAT {
        return Err(ONNX.unsupported(
            format!("{path}.elem_type"),
            format!(
                "element type {} ; supported: 1 (float), which onnxruntime compares in f32",
                tensor.elem_type
            ),
        ));
    }
    let Some(shape) = &tensor.shape else {
        return Ok(None);
    };
    match shape.dim.as_slice() {
        [_, columns] => match columns.dim_value {
            Some(f) if f >= 1 => Ok(Some(f as usize)),
            Some(f) => Err(ONNX.invalid(
                format!("{path}.shape[1]"),
                format!("expected at least 1 column, got {f}"),
            )),
            None => Ok(None),
        },
        dims => Err(ONNX.unsupported(
            format!("{path}.shape"),
            format!("rank {}; supported: rank 2 [N, F]", dims.len()),
        )),
    }
}

/// Checks that `node` consumes `current` as its first input (for `Add` either input) and that
/// its other inputs, at most `extra` of them, are initializers; returns those.
fn chain_inputs<'a>(
    node: &NodeProto,
    at: &str,
    current: &str,
    initializers: &HashMap<&str, &'a TensorProto>,
    extra: usize,
) -> Result<Vec<&'a TensorProto>, ImportError> {
    let commutes = node.op_type == "Add";
    let position = node
        .input
        .iter()
        .position(|name| name == current)
        .filter(|&p| p == 0 || commutes);
    let Some(position) = position else {
        return Err(ONNX.unsupported(
            format!("{at}.input"),
            format!(
                "inputs {:?} do not take {current:?} (the previous node's output) first; the \
                 graph must be one chain from the input to the output",
                node.input
            ),
        ));
    };
    let others: Vec<&str> = node
        .input
        .iter()
        .enumerate()
        .filter(|&(i, name)| i != position && !name.is_empty())
        .map(|(_, name)| name.as_str())
        .collect();
    if others.len() > extra {
        return Err(ONNX.unsupported(
            format!("{at}.input"),
            format!(
                "{} inputs; supported: the chain's value and at most {extra} initializers",
                node.input.len()
            ),
        ));
    }
    others
        .iter()
        .map(|name| {
            initializers.get(name).copied().ok_or_else(|| {
                ONNX.unsupported(
                    format!("{at}.input {name:?}"),
                    "not an initializer; supported: constant weights stored as initializers",
                )
            })
        })
        .collect()
}

/// The node's attributes by name, refusing any outside `allowed`.
fn check_attributes<'a>(
    node: &'a NodeProto,
    at: &str,
    allowed: &[&str],
) -> Result<HashMap<&'a str, &'a AttributeProto>, ImportError> {
    let mut map = HashMap::new();
    for a in &node.attribute {
        if !allowed.contains(&a.name.as_str()) {
            let supported = if allowed.is_empty() {
                "none".to_string()
            } else {
                allowed.join(", ")
            };
            return Err(ONNX.unsupported(
                format!("{at}.attribute {:?}", a.name),
                format!(
                    "not supported for {}; supported: {supported}",
                    op_name(node)
                ),
            ));
        }
        if map.insert(a.name.as_str(), a).is_some() {
            return Err(ONNX.invalid(format!("{at}.attribute {:?}", a.name), "given twice"));
        }
    }
    Ok(map)
}

/// Reads typed attribute values, checking the declared type (0, unset, is accepted).
struct Attributes<'a> {
    map: HashMap<&'a str, &'a AttributeProto>,
    at: &'a str,
}

impl<'a> Attributes<'a> {
    fn get(&self, name: &str, kind: i32) -> Result<Option<&'a AttributeProto>, ImportError> {
        match self.map.get(name) {
            Some(a) if a.r#type == kind || a.r#type == 0 => Ok(Some(a)),
            Some(a) => Err(ONNX.invalid(
                format!("{}.attribute {name:?}", self.at),
                format!("expected attribute type {kind}, got {}", a.r#type),
            )),
            None => Ok(None),
        }
    }

    fn int(&self, name: &str, default: i64) -> Result<i64, ImportError> {
        Ok(self.get(name, proto::INT)?.map_or(default, |a| a.i))
    }

    fn float(&self, name: &str, default: f32) -> Result<f32, ImportError> {
        Ok(self.get(name, proto::FLOAT)?.map_or(default, |a| a.f))
    }

    fn string(&self, name: &str, default: &str) -> Result<String, ImportError> {
        Ok(self
            .get(name, proto::STRING)?
            .map_or(default.to_string(), |a| {
                String::from_utf8_lossy(&a.s).into_owned()
            }))
    }

    fn ints(&self, name: &str) -> Result<&'a [i64], ImportError> {
        Ok(self
            .get(name, proto::INTS)?
            .map_or(&[], |a| a.ints.as_slice()))
    }

    fn floats(&self, name: &str) -> Result<&'a [f32], ImportError> {
        Ok(self
            .get(name, proto::FLOATS)?
            .map_or(&[], |a| a.floats.as_slice()))
    }

    fn strings(&self, name: &str) -> Result<&'a [Vec<u8>], ImportError> {
        Ok(self
            .get(name, proto::STRINGS)?
            .map_or(&[], |a| a.strings.as_slice()))
    }

    /// A float tensor attribute's values (absent: empty).
    fn tensor(&self, name: &str) -> Result<Vec<f32>, ImportError> {
        let Some(a) = self.get(name, proto::TENSOR)? else {
            return Ok(Vec::new());
        };
        let t = a.t.as_ref().ok_or_else(|| {
            ONNX.invalid(self.path(name), "a tensor attribute without its tensor")
        })?;
        Ok(tensor_floats(t, &self.path(name))?.1)
    }

    /// A uint8 tensor attribute's values (absent: empty).
    fn tensor_bytes(&self, name: &str) -> Result<Vec<u8>, ImportError> {
        let Some(a) = self.get(name, proto::TENSOR)? else {
            return Ok(Vec::new());
        };
        let path = self.path(name);
        match &a.t {
            Some(t) if t.data_type == proto::DATA_UINT8 => {
                if !t.raw_data.is_empty() {
                    return Ok(t.raw_data.clone());
                }
                t.int32_data
                    .iter()
                    .map(|&v| {
                        u8::try_from(v)
                            .map_err(|_| ONNX.invalid(&path, format!("{v} is not a uint8")))
                    })
                    .collect()
            }
            Some(t) => Err(ONNX.unsupported(
                path,
                format!("element type {}; supported: 2 (uint8)", t.data_type),
            )),
            None => Err(ONNX.invalid(path, "a tensor attribute without its tensor")),
        }
    }

    fn path(&self, name: &str) -> String {
        format!("{}.attribute {name:?}", self.at)
    }
}

const TREE_ENSEMBLE_REGRESSOR_ATTRIBUTES: &[&str] = &[
    "aggregate_function",
    "base_values",
    "n_targets",
    "nodes_falsenodeids",
    "nodes_featureids",
    "nodes_hitrates",
    "nodes_missing_value_tracks_true",
    "nodes_modes",
    "nodes_nodeids",
    "nodes_treeids",
    "nodes_truenodeids",
    "nodes_values",
    "post_transform",
    "target_ids",
    "target_nodeids",
    "target_treeids",
    "target_weights",
];

/// A `nodes_modes` entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Leq,
    Lt,
    Gte,
    Gt,
    Eq,
    Neq,
    Leaf,
}

/// Converts a `TreeEnsembleRegressor` node: its trees, its base value, and the input width its
/// feature ids need.
fn tree_ensemble_regressor(
    node: &NodeProto,
    at: &str,
    declared_width: Option<usize>,
) -> Result<(Vec<Tree>, f64, usize), ImportError> {
    let map =
        check_attributes(node, at, TREE_ENSEMBLE_REGRESSOR_ATTRIBUTES).map_err(|e| {
            match node
                .attribute
                .iter()
                .find(|a| a.name.ends_with("_as_tensor"))
            {
                Some(a) => ONNX.unsupported(
                    format!("{at}.attribute {:?}", a.name),
                    "double-precision thresholds, weights or base values are not supported; \
                 supported: the float attributes (nodes_values, target_weights, base_values)",
                ),
                None => e,
            }
        })?;
    let attrs = Attributes { map, at };
    let n_targets = attrs.int("n_targets", 1)?;
    if n_targets != 1 {
        return Err(ONNX.unsupported(
            attrs.path("n_targets"),
            format!("{n_targets} targets; a ranker has one output, so only 1 is supported"),
        ));
    }
    let aggregate = attrs.string("aggregate_function", "SUM")?;
    if aggregate != "SUM" {
        return Err(ONNX.unsupported(
            attrs.path("aggregate_function"),
            format!("{aggregate:?}; supported: \"SUM\" (the ranker adds its trees)"),
        ));
    }
    let post = attrs.string("post_transform", "NONE")?;
    if post != "NONE" {
        return Err(ONNX.unsupported(
            attrs.path("post_transform"),
            format!(
                "{post:?}; supported: \"NONE\" (a transform of the sum is not a sum of trees; \
                 export the raw score)"
            ),
        ));
    }
    let base = match attrs.floats("base_values")? {
        [] => 0.0,
        [b] => f64::from(*b),
        more => {
            return Err(ONNX.unsupported(
                attrs.path("base_values"),
                format!("{} values; supported: at most one (one target)", more.len()),
            ))
        }
    };
    if !base.is_finite() {
        return Err(ONNX.invalid(attrs.path("base_values"), "expected a finite number"));
    }

    let treeids = attrs.ints("nodes_treeids")?;
    let n = treeids.len();
    let nodeids = attrs.ints("nodes_nodeids")?;
    let featureids = attrs.ints("nodes_featureids")?;
    let values = attrs.floats("nodes_values")?;
    let trueids = attrs.ints("nodes_truenodeids")?;
    let falseids = attrs.ints("nodes_falsenodeids")?;
    let modes = attrs.strings("nodes_modes")?;
    let tracks = attrs.ints("nodes_missing_value_tracks_true")?;
    for (name, len) in [
        ("nodes_nodeids", nodeids.len()),
        ("nodes_featureids", featureids.len()),
        ("nodes_values", values.len()),
        ("nodes_truenodeids", trueids.len()),
        ("nodes_falsenodeids", falseids.len()),
        ("nodes_modes", modes.len()),
    ] {
        if len != n {
            return Err(ONNX.invalid(
                attrs.path(name),
                format!("expected {n} entries (as nodes_treeids), got {len}"),
            ));
        }
    }
    if !tracks.is_empty() && tracks.len() != n {
        return Err(ONNX.invalid(
            attrs.path("nodes_missing_value_tracks_true"),
            format!("expected 0 or {n} entries, got {}", tracks.len()),
        ));
    }
    let modes = modes
        .iter()
        .enumerate()
        .map(|(i, m)| match m.as_slice() {
            b"BRANCH_LEQ" => Ok(Mode::Leq),
            b"BRANCH_LT" => Ok(Mode::Lt),
            b"BRANCH_GTE" => Ok(Mode::Gte),
            b"BRANCH_GT" => Ok(Mode::Gt),
            b"BRANCH_EQ" => Ok(Mode::Eq),
            b"BRANCH_NEQ" => Ok(Mode::Neq),
            b"LEAF" => Ok(Mode::Leaf),
            other => Err(ONNX.unsupported(
                format!("{}[{i}]", attrs.path("nodes_modes")),
                format!(
                    "{:?}; supported: BRANCH_LEQ, BRANCH_LT, BRANCH_GTE, BRANCH_GT, BRANCH_EQ, \
                     BRANCH_NEQ, LEAF",
                    String::from_utf8_lossy(other)
                ),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;

    // Leaf values: the target weights of each (tree, node), summed.
    let t_trees = attrs.ints("target_treeids")?;
    let t_nodes = attrs.ints("target_nodeids")?;
    let t_ids = attrs.ints("target_ids")?;
    let t_weights = attrs.floats("target_weights")?;
    for (name, len) in [
        ("target_nodeids", t_nodes.len()),
        ("target_ids", t_ids.len()),
        ("target_weights", t_weights.len()),
    ] {
        if len != t_trees.len() {
            return Err(ONNX.invalid(
                attrs.path(name),
                format!(
                    "expected {} entries (as target_treeids), got {len}",
                    t_trees.len()
                ),
            ));
        }
    }
    let mut weights: HashMap<(i64, i64), f64> = HashMap::new();
    for k in 0..t_trees.len() {
        if t_ids[k] != 0 {
            return Err(ONNX.unsupported(
                format!("{}[{k}]", attrs.path("target_ids")),
                format!("target {}; supported: 0 (one target)", t_ids[k]),
            ));
        }
        *weights.entry((t_trees[k], t_nodes[k])).or_insert(0.0) += f64::from(t_weights[k]);
    }

    // Trees in order of first appearance; each tree's nodes by id.
    let mut order: Vec<i64> = Vec::new();
    let mut by_tree: HashMap<i64, HashMap<i64, usize>> = HashMap::new();
    for k in 0..n {
        let tree = by_tree.entry(treeids[k]).or_insert_with(|| {
            order.push(treeids[k]);
            HashMap::new()
        });
        if tree.insert(nodeids[k], k).is_some() {
            return Err(ONNX.invalid(
                format!("{}[{k}]", attrs.path("nodes_nodeids")),
                format!("node {} of tree {} is given twice", nodeids[k], treeids[k]),
            ));
        }
    }
    // A child (or root) id of tree `tree`: a branch's position, or a leaf's summed weights.
    let resolve = |tree: i64, id: i64, name: &str, k: usize| -> Result<Ref, ImportError> {
        let p = *by_tree[&tree].get(&id).ok_or_else(|| {
            ONNX.invalid(
                format!("{}[{k}]", attrs.path(name)),
                format!("tree {tree} has no node {id}"),
            )
        })?;
        Ok(match modes[p] {
            Mode::Leaf => Ref::Leaf(weights.get(&(tree, id)).copied().unwrap_or(0.0)),
            _ => Ref::Branch(p),
        })
    };
    let branches = (0..n)
        .map(|k| {
            if modes[k] == Mode::Leaf {
                return Ok(None);
            }
            Ok(Some(Branch {
                feature: featureids[k],
                threshold: values[k],
                mode: modes[k],
                tracks_true: tracks.get(k).is_some_and(|&v| v == 1),
                on_true: resolve(treeids[k], trueids[k], "nodes_truenodeids", k)?,
                on_false: resolve(treeids[k], falseids[k], "nodes_falsenodeids", k)?,
            }))
        })
        .collect::<Result<Vec<_>, ImportError>>()?;
    let ensemble = Ensemble {
        branches: &branches,
        attrs: &attrs,
        names: ["nodes_featureids", "nodes_values", "nodes_modes"],
        declared_width,
    };
    let mut used_width = 0usize;
    let trees = order
        .iter()
        .map(|&tree| {
            let p = *by_tree[&tree].get(&0).ok_or_else(|| {
                ONNX.invalid(
                    attrs.path("nodes_nodeids"),
                    format!("tree {tree} has no node 0 (its root)"),
                )
            })?;
            let root = match modes[p] {
                Mode::Leaf => Ref::Leaf(weights.get(&(tree, 0)).copied().unwrap_or(0.0)),
                _ => Ref::Branch(p),
            };
            ensemble.tree(root, &format!("tree {tree}"), &mut used_width)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((trees, base, used_width))
}

const TREE_ENSEMBLE_ATTRIBUTES: &[&str] = &[
    "aggregate_function",
    "leaf_targetids",
    "leaf_weights",
    "membership_values",
    "n_targets",
    "nodes_falseleafs",
    "nodes_falsenodeids",
    "nodes_featureids",
    "nodes_hitrates",
    "nodes_missing_value_tracks_true",
    "nodes_modes",
    "nodes_splits",
    "nodes_trueleafs",
    "nodes_truenodeids",
    "post_transform",
    "tree_roots",
];

/// Converts an opset-5 `TreeEnsemble` node (integer enums, tensors for splits, modes and leaf
/// weights, leaves in their own arrays): its trees, its base value (none: 0), and the input width
/// its feature ids need.
fn tree_ensemble(
    node: &NodeProto,
    at: &str,
    declared_width: Option<usize>,
) -> Result<(Vec<Tree>, f64, usize), ImportError> {
    let attrs = Attributes {
        map: check_attributes(node, at, TREE_ENSEMBLE_ATTRIBUTES)?,
        at,
    };
    let n_targets = attrs.int("n_targets", 1)?;
    if n_targets != 1 {
        return Err(ONNX.unsupported(
            attrs.path("n_targets"),
            format!("{n_targets} targets; a ranker has one output, so only 1 is supported"),
        ));
    }
    let aggregate = attrs.int("aggregate_function", 1)?;
    if aggregate != 1 {
        return Err(ONNX.unsupported(
            attrs.path("aggregate_function"),
            format!("{aggregate}; supported: 1 (SUM: the ranker adds its trees)"),
        ));
    }
    let post = attrs.int("post_transform", 0)?;
    if post != 0 {
        return Err(ONNX.unsupported(
            attrs.path("post_transform"),
            format!(
                "{post}; supported: 0 (NONE: a transform of the sum is not a sum of trees; \
                 export the raw score)"
            ),
        ));
    }
    if !attrs.tensor("membership_values")?.is_empty() {
        return Err(ONNX.unsupported(
            attrs.path("membership_values"),
            "set membership (BRANCH_MEMBER) is not supported",
        ));
    }
    let roots = attrs.ints("tree_roots")?;
    let featureids = attrs.ints("nodes_featureids")?;
    let n = featureids.len();
    let splits = attrs.tensor("nodes_splits")?;
    let modes = attrs.tensor_bytes("nodes_modes")?;
    let trueids = attrs.ints("nodes_truenodeids")?;
    let trueleafs = attrs.ints("nodes_trueleafs")?;
    let falseids = attrs.ints("nodes_falsenodeids")?;
    let falseleafs = attrs.ints("nodes_falseleafs")?;
    let tracks = attrs.ints("nodes_missing_value_tracks_true")?;
    for (name, len) in [
        ("nodes_splits", splits.len()),
        ("nodes_modes", modes.len()),
        ("nodes_truenodeids", trueids.len()),
        ("nodes_trueleafs", trueleafs.len()),
        ("nodes_falsenodeids", falseids.len()),
        ("nodes_falseleafs", falseleafs.len()),
    ] {
        if len != n {
            return Err(ONNX.invalid(
                attrs.path(name),
                format!("expected {n} entries (as nodes_featureids), got {len}"),
            ));
        }
    }
    if !tracks.is_empty() && tracks.len() != n {
        return Err(ONNX.invalid(
            attrs.path("nodes_missing_value_tracks_true"),
            format!("expected 0 or {n} entries, got {}", tracks.len()),
        ));
    }
    let targets = attrs.ints("leaf_targetids")?;
    let leaf_weights = attrs.tensor("leaf_weights")?;
    if targets.len() != leaf_weights.len() {
        return Err(ONNX.invalid(
            attrs.path("leaf_targetids"),
            format!(
                "expected {} entries (as leaf_weights), got {}",
                leaf_weights.len(),
                targets.len()
            ),
        ));
    }
    if let Some(k) = targets.iter().position(|&t| t != 0) {
        return Err(ONNX.unsupported(
            format!("{}[{k}]", attrs.path("leaf_targetids")),
            format!("target {}; supported: 0 (one target)", targets[k]),
        ));
    }
    let child = |ids: &[i64], leafs: &[i64], k: usize, name: &str| -> Result<Ref, ImportError> {
        let (id, leaf) = (ids[k], leafs[k] != 0);
        let limit = if leaf { leaf_weights.len() } else { n };
        let index = usize::try_from(id)
            .ok()
            .filter(|&i| i < limit)
            .ok_or_else(|| {
                ONNX.invalid(
                    format!("{}[{k}]", attrs.path(name)),
                    format!(
                        "expected a {} index in 0..{limit}, got {id}",
                        if leaf { "leaf" } else { "node" }
                    ),
                )
            })?;
        Ok(if leaf {
            Ref::Leaf(f64::from(leaf_weights[index]))
        } else {
            Ref::Branch(index)
        })
    };
    let branches = (0..n)
        .map(|k| {
            let mode = match modes[k] {
                0 => Mode::Leq,
                1 => Mode::Lt,
                2 => Mode::Gte,
                3 => Mode::Gt,
                4 => Mode::Eq,
                5 => Mode::Neq,
                other => {
                    return Err(ONNX.unsupported(
                        format!("{}[{k}]", attrs.path("nodes_modes")),
                        format!(
                            "{other}; supported: 0 (BRANCH_LEQ), 1 (LT), 2 (GTE), 3 (GT), 4 (EQ), \
                             5 (NEQ); 6 (BRANCH_MEMBER) is not"
                        ),
                    ))
                }
            };
            Ok(Some(Branch {
                feature: featureids[k],
                threshold: splits[k],
                mode,
                tracks_true: tracks.get(k).is_some_and(|&v| v == 1),
                on_true: child(trueids, trueleafs, k, "nodes_truenodeids")?,
                on_false: child(falseids, falseleafs, k, "nodes_falsenodeids")?,
            }))
        })
        .collect::<Result<Vec<_>, ImportError>>()?;
    let ensemble = Ensemble {
        branches: &branches,
        attrs: &attrs,
        names: ["nodes_featureids", "nodes_splits", "nodes_modes"],
        declared_width,
    };
    let mut used_width = 0usize;
    let trees = roots
        .iter()
        .enumerate()
        .map(|(t, &root)| {
            let root = usize::try_from(root)
                .ok()
                .filter(|&r| r < n)
                .ok_or_else(|| {
                    ONNX.invalid(
                        format!("{}[{t}]", attrs.path("tree_roots")),
                        format!("expected a node index in 0..{n}, got {root}"),
                    )
                })?;
            ensemble.tree(Ref::Branch(root), &format!("tree {t}"), &mut used_width)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((trees, 0.0, used_width))
}

/// A child (or a root): a branch's position in the node arrays, or a leaf's value.
#[derive(Clone, Copy)]
enum Ref {
    Branch(usize),
    Leaf(f64),
}

/// A branch node of either op, its children resolved.
struct Branch {
    feature: i64,
    threshold: f32,
    mode: Mode,
    tracks_true: bool,
    on_true: Ref,
    on_false: Ref,
}

/// The branches of one ensemble (by node position; `None` for leaf positions) and where errors
/// point: the attributes holding feature ids, thresholds and modes.
struct Ensemble<'a> {
    branches: &'a [Option<Branch>],
    attrs: &'a Attributes<'a>,
    names: [&'static str; 3],
    declared_width: Option<usize>,
}

/// Where a built node's index goes: the root, or a parent's left or right child.
#[derive(Clone, Copy)]
enum Slot {
    Root,
    Left(usize),
    Right(usize),
}

impl Ensemble<'_> {
    /// The branch positions reachable from `root`, each once.
    fn reachable(&self, root: Ref) -> usize {
        let mut seen = vec![false; self.branches.len()];
        let mut stack = vec![root];
        let mut count = 0;
        while let Some(r) = stack.pop() {
            let Ref::Branch(k) = r else { continue };
            if std::mem::replace(&mut seen[k], true) {
                continue;
            }
            count += 1;
            if let Some(b) = &self.branches[k] {
                stack.extend([b.on_true, b.on_false]);
            }
        }
        count
    }

    /// Builds one tree from `root` in pre-order, copying the subtrees that `EQ` / `NEQ` need
    /// twice (and any reached from two parents); unreachable nodes are dropped, as onnxruntime
    /// never visits them.
    fn tree(&self, root: Ref, label: &str, used_width: &mut usize) -> Result<Tree, ImportError> {
        let [feature_name, threshold_name, mode_name] = self.names;
        let at = |name: &str, k: usize| format!("{}[{k}]", self.attrs.path(name));
        let reachable = self.reachable(root);
        let budget = (2 * reachable + 1).saturating_mul(COPY_GROWTH).max(64);
        let mut nodes: Vec<Node> = Vec::new();
        let mut stack = vec![(root, Slot::Root, 0usize)];
        while let Some((r, slot, depth)) = stack.pop() {
            let id = nodes.len();
            link(&mut nodes, slot, id);
            let k = match r {
                Ref::Leaf(v) => {
                    nodes.push(Node::Leaf(v));
                    continue;
                }
                Ref::Branch(k) => k,
            };
            if depth > reachable {
                return Err(ONNX.invalid(
                    at(mode_name, k),
                    format!("{label} has a cycle through node position {k}"),
                ));
            }
            let Some(b) = &self.branches[k] else {
                unreachable!("a leaf position resolves to Ref::Leaf")
            };
            let limit = self.declared_width.unwrap_or(MAX_FEATURES);
            if !(0..limit as i64).contains(&b.feature) {
                return Err(ONNX.invalid(
                    at(feature_name, k),
                    format!("expected a feature index in 0..{limit}, got {}", b.feature),
                ));
            }
            *used_width = (*used_width).max(b.feature as usize + 1);
            if !b.threshold.is_finite() {
                return Err(ONNX.invalid(
                    at(threshold_name, k),
                    format!("expected a finite threshold, got {}", b.threshold),
                ));
            }
            let split = |decision, default_left| Split {
                feature: b.feature as u32,
                decision,
                missing: Missing::Nan,
                default_left,
                left: 0,
                right: 0,
            };
            let lt = Decision::LtF32(b.threshold);
            let le = super::le_f32(b.threshold);
            let (t, f) = (b.on_true, b.on_false);
            match b.mode {
                Mode::Leq | Mode::Lt | Mode::Gte | Mode::Gt => {
                    let (decision, true_left) = match b.mode {
                        Mode::Leq => (le, true),
                        Mode::Lt => (lt, true),
                        Mode::Gte => (lt, false),
                        _ => (le, false),
                    };
                    // NaN compares false, so it goes the true way only when tracked.
                    let nan_left = b.tracks_true == true_left;
                    nodes.push(Node::Split(split(decision, nan_left)));
                    let (left, right) = if true_left { (t, f) } else { (f, t) };
                    stack.push((right, Slot::Right(id), depth + 1));
                    stack.push((left, Slot::Left(id), depth + 1));
                }
                Mode::Eq | Mode::Neq => {
                    // EQ: x < t → false; x <= t → true; else false. NEQ the other way round.
                    // A NaN is "true" for NEQ (NaN != t) and for a tracked EQ.
                    let (inside, outside) = if b.mode == Mode::Eq { (t, f) } else { (f, t) };
                    let nan_true = b.mode == Mode::Neq || b.tracks_true;
                    let nan_inside = nan_true == (b.mode == Mode::Eq);
                    nodes.push(Node::Split(split(lt, !nan_inside)));
                    let second = nodes.len();
                    link(&mut nodes, Slot::Right(id), second);
                    nodes.push(Node::Split(split(le, nan_inside)));
                    stack.push((outside, Slot::Right(second), depth + 1));
                    stack.push((inside, Slot::Left(second), depth + 1));
                    stack.push((outside, Slot::Left(id), depth + 1));
                }
                Mode::Leaf => unreachable!("leaves are not branches"),
            }
            if nodes.len() > budget {
                return Err(ONNX.unsupported(
                    at(mode_name, k),
                    format!(
                        "{label}: copied subtrees (each BRANCH_EQ / BRANCH_NEQ copies one, as a \
                         ranker's splits compare with < and <=; a node reached from two \
                         parents is copied too) would grow the tree past {budget} nodes \
                         ({COPY_GROWTH}x its {} nodes)",
                        2 * reachable + 1
                    ),
                ));
            }
        }
        Ok(Tree { nodes })
    }
}

/// Sets the child index that `slot` names to `id`.
fn link(nodes: &mut [Node], slot: Slot, id: usize) {
    let (parent, left) = match slot {
        Slot::Root => return,
        Slot::Left(p) => (p, true),
        Slot::Right(p) => (p, false),
    };
    if let Node::Split(s) = &mut nodes[parent] {
        if left {
            s.left = id as u32;
        } else {
            s.right = id as u32;
        }
    }
}

/// The NN layers built so far from a chain of linear ops and activations.
#[derive(Default)]
struct Mlp {
    layers: Vec<Layer>,
    /// A linear layer still waiting for its activation (or, after `MatMul`, for its bias).
    pending: Option<Pending>,
}

struct Pending {
    layer: Layer,
    /// After `MatMul`: an `Add` may still give the bias.
    bias_open: bool,
}

impl Mlp {
    fn is_empty(&self) -> bool {
        self.layers.is_empty() && self.pending.is_none()
    }

    fn flush(&mut self) {
        if let Some(p) = self.pending.take() {
            self.layers.push(p.layer);
        }
    }

    fn step(
        &mut self,
        node: &NodeProto,
        at: &str,
        current: &str,
        initializers: &HashMap<&str, &TensorProto>,
    ) -> Result<(), ImportError> {
        match node.op_type.as_str() {
            "Gemm" => {
                let attrs = Attributes {
                    map: check_attributes(node, at, &["alpha", "beta", "transA", "transB"])?,
                    at,
                };
                for (name, value) in [
                    ("alpha", attrs.float("alpha", 1.0)?),
                    ("beta", attrs.float("beta", 1.0)?),
                ] {
                    if value != 1.0 {
                        return Err(ONNX.unsupported(
                            attrs.path(name),
                            format!("{value}; supported: 1 (a scaled product is not a layer)"),
                        ));
                    }
                }
                let trans_a = attrs.int("transA", 0)?;
                if trans_a != 0 {
                    return Err(ONNX.unsupported(
                        attrs.path("transA"),
                        format!("{trans_a}; supported: 0 (rows are documents)"),
                    ));
                }
                let trans_b = attrs.int("transB", 0)?;
                if trans_b != 0 && trans_b != 1 {
                    return Err(ONNX.invalid(
                        attrs.path("transB"),
                        format!("expected 0 or 1, got {trans_b}"),
                    ));
                }
                let inputs = chain_inputs(node, at, current, initializers, 2)?;
                let Some(b) = inputs.first() else {
                    return Err(ONNX.invalid(format!("{at}.input"), "Gemm needs B"));
                };
                let mut layer = weights(b, trans_b == 1, &format!("{at}.input B"))?;
                if let Some(c) = inputs.get(1) {
                    layer.bias = bias(c, layer.outputs, &format!("{at}.input C"))?;
                }
                self.flush();
                self.pending = Some(Pending {
                    layer,
                    bias_open: false,
                });
            }
            "MatMul" => {
                check_attributes(node, at, &[])?;
                let inputs = chain_inputs(node, at, current, initializers, 1)?;
                let Some(b) = inputs.first() else {
                    return Err(ONNX.invalid(format!("{at}.input"), "MatMul needs B"));
                };
                let layer = weights(b, false, &format!("{at}.input B"))?;
                self.flush();
                self.pending = Some(Pending {
                    layer,
                    bias_open: true,
                });
            }
            "Add" => {
                check_attributes(node, at, &[])?;
                let inputs = chain_inputs(node, at, current, initializers, 1)?;
                match (&mut self.pending, inputs.first()) {
                    (
                        Some(Pending {
                            layer,
                            bias_open: open @ true,
                        }),
                        Some(c),
                    ) => {
                        layer.bias = bias(c, layer.outputs, &format!("{at}.input"))?;
                        *open = false;
                    }
                    _ => {
                        return Err(ONNX.unsupported(
                            at,
                            "Add is supported only as the bias right after a MatMul",
                        ))
                    }
                }
            }
            op => {
                check_attributes(node, at, &[])?;
                chain_inputs(node, at, current, initializers, 0)?;
                let activation = match op {
                    "Relu" => Activation::Relu,
                    "Sigmoid" => Activation::Sigmoid,
                    _ => Activation::Tanh,
                };
                let Some(mut p) = self.pending.take() else {
                    return Err(ONNX.unsupported(
                        at,
                        format!(
                            "{op} must follow a Gemm or a MatMul (+ Add): a ranker's layer is \
                             a linear map then one activation"
                        ),
                    ));
                };
                p.layer.activation = activation;
                self.layers.push(p.layer);
            }
        }
        Ok(())
    }

    /// The ranker: one identity input per column feeding the layers.
    fn finish(mut self, declared_width: Option<usize>) -> Result<Ranker, ImportError> {
        self.flush();
        let Some(first) = self.layers.first() else {
            return Err(ONNX.unsupported(
                "graph.node",
                format!("no computing node; supported: {SUPPORTED_OPS}"),
            ));
        };
        let width = first.inputs;
        if let Some(declared) = declared_width.filter(|&d| d != width) {
            return Err(ONNX.invalid(
                "graph.input[0].shape[1]",
                format!("{declared} columns, but the first layer takes {width}"),
            ));
        }
        for (i, pair) in self.layers.windows(2).enumerate() {
            if pair[1].inputs != pair[0].outputs {
                return Err(ONNX.invalid(
                    format!("layer {}", i + 1),
                    format!(
                        "takes {} values but layer {i} gives {}",
                        pair[1].inputs, pair[0].outputs
                    ),
                ));
            }
        }
        let outputs = self.layers.last().map_or(0, |l| l.outputs);
        if outputs != 1 {
            return Err(ONNX.unsupported(
                "graph.output[0]",
                format!("{outputs} columns; a ranker has one score, so the last layer must have one output"),
            ));
        }
        let features = feature_names(width)?;
        let inputs = (0..width)
            .map(|i| Input::Linear {
                feature: i as u32,
                slope: 1.0,
                intercept: 0.0,
            })
            .collect();
        Ok(Ranker {
            features,
            inputs,
            layers: self.layers,
            ensemble: None,
        })
    }
}

/// A float initializer's dims and values.
fn tensor_floats(t: &TensorProto, path: &str) -> Result<(Vec<usize>, Vec<f32>), ImportError> {
    if t.data_type != proto::DATA_FLOAT {
        return Err(ONNX.unsupported(
            path,
            format!(
                "initializer {:?} has element type {}; supported: 1 (float)",
                t.name, t.data_type
            ),
        ));
    }
    if t.data_location == proto::EXTERNAL {
        return Err(ONNX.unsupported(
            path,
            format!(
                "initializer {:?} is stored in an external file; save the model with its \
                 weights inside",
                t.name
            ),
        ));
    }
    let dims = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ONNX.invalid(path, format!("negative dims {:?}", t.dims)))?;
    let count = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| ONNX.invalid(path, format!("dims {:?} overflow", t.dims)))?;
    let values: Vec<f32> = if t.raw_data.is_empty() {
        t.float_data.clone()
    } else {
        t.raw_data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let held = if t.raw_data.is_empty() {
        values.len()
    } else {
        t.raw_data.len() / 4 + usize::from(t.raw_data.len() % 4 != 0)
    };
    if held != count || (!t.raw_data.is_empty() && t.raw_data.len() % 4 != 0) {
        return Err(ONNX.invalid(
            path,
            format!(
                "initializer {:?} has dims {:?} ({count} values) but holds {} bytes of raw data \
                 and {} float_data values",
                t.name,
                t.dims,
                t.raw_data.len(),
                t.float_data.len()
            ),
        ));
    }
    Ok((dims, values))
}

/// A layer (identity activation, zero bias) from a weight matrix: `[inputs, outputs]`, or
/// `[outputs, inputs]` when `transposed` (PyTorch's `nn.Linear` weight with `transB = 1`).
fn weights(b: &TensorProto, transposed: bool, path: &str) -> Result<Layer, ImportError> {
    let (dims, values) = tensor_floats(b, path)?;
    let [rows, cols] = dims[..] else {
        return Err(ONNX.unsupported(
            path,
            format!("weights of rank {}; supported: rank 2", dims.len()),
        ));
    };
    let (inputs, outputs) = if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    if inputs == 0 || outputs == 0 {
        return Err(ONNX.invalid(path, format!("empty weights {dims:?}")));
    }
    let weights = if transposed {
        values
    } else {
        // [inputs][outputs] → [outputs][inputs]
        (0..outputs)
            .flat_map(|o| (0..inputs).map(move |i| (o, i)))
            .map(|(o, i)| values[i * outputs + o])
            .collect()
    };
    Ok(Layer {
        inputs,
        outputs,
        weights,
        bias: vec![0.0; outputs],
        activation: Activation::Identity,
    })
}

/// A bias of `outputs` entries from a tensor of shape `[outputs]`, `[1, outputs]` or one value
/// (broadcast).
fn bias(c: &TensorProto, outputs: usize, path: &str) -> Result<Vec<f32>, ImportError> {
    let (dims, values) = tensor_floats(c, path)?;
    let shape_ok = match dims[..] {
        [] | [1] | [1, 1] => true,
        [n] | [1, n] => n == outputs,
        _ => false,
    };
    if !shape_ok {
        return Err(ONNX.unsupported(
            path,
            format!("bias of shape {dims:?}; supported: [{outputs}], [1, {outputs}] or one value"),
        ));
    }
    Ok(if values.len() == 1 {
        vec![values[0]; outputs]
    } else {
        values
    })
}

#[cfg(test)]
mod tests {
    use super::proto::*;
    use super::*;
    use crate::rank::cpu::score_doc_reference;
    use prost::Message;

    fn ints(name: &str, v: &[i64]) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            ints: v.to_vec(),
            r#type: INTS,
            ..Default::default()
        }
    }

    fn floats(name: &str, v: &[f32]) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            floats: v.to_vec(),
            r#type: FLOATS,
            ..Default::default()
        }
    }

    fn strings(name: &str, v: &[&str]) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
            r#type: STRINGS,
            ..Default::default()
        }
    }

    fn value_info(name: &str, width: i64) -> ValueInfoProto {
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                tensor_type: Some(TensorType {
                    elem_type: DATA_FLOAT,
                    shape: Some(TensorShapeProto {
                        dim: vec![
                            Dimension {
                                dim_value: None,
                                dim_param: Some("N".into()),
                            },
                            Dimension {
                                dim_value: Some(width),
                                dim_param: None,
                            },
                        ],
                    }),
                }),
            }),
        }
    }

    fn model(nodes: Vec<NodeProto>, initializer: Vec<TensorProto>, width: i64) -> Vec<u8> {
        let out = nodes
            .last()
            .map_or("x".to_string(), |n| n.output[0].clone());
        ModelProto {
            ir_version: 8,
            graph: Some(GraphProto {
                node: nodes,
                initializer,
                input: vec![value_info("x", width)],
                output: vec![value_info(&out, 1)],
                sparse_initializer: vec![],
            }),
        }
        .encode_to_vec()
    }

    /// One tree: node 0 `mode` on feature 0 at 0.5 (true → node 1, leaf 1; false → node 2,
    /// leaf 2), with missing-value tracking `tracks`.
    fn one_split(mode: &str, tracks: i64) -> NodeProto {
        NodeProto {
            input: vec!["x".into()],
            output: vec!["y".into()],
            name: "trees".into(),
            op_type: "TreeEnsembleRegressor".into(),
            domain: "ai.onnx.ml".into(),
            attribute: vec![
                ints("n_targets", &[]),
                ints("nodes_treeids", &[0, 0, 0]),
                ints("nodes_nodeids", &[0, 1, 2]),
                ints("nodes_featureids", &[0, 0, 0]),
                floats("nodes_values", &[0.5, 0.0, 0.0]),
                strings("nodes_modes", &[mode, "LEAF", "LEAF"]),
                ints("nodes_truenodeids", &[1, 0, 0]),
                ints("nodes_falsenodeids", &[2, 0, 0]),
                ints("nodes_missing_value_tracks_true", &[tracks, 0, 0]),
                ints("target_treeids", &[0, 0]),
                ints("target_nodeids", &[1, 2]),
                ints("target_ids", &[0, 0]),
                floats("target_weights", &[1.0, 2.0]),
                floats("base_values", &[0.25]),
            ]
            .into_iter()
            .map(|mut a| {
                if a.name == "n_targets" {
                    a = AttributeProto {
                        name: "n_targets".into(),
                        i: 1,
                        r#type: INT,
                        ..Default::default()
                    };
                }
                a
            })
            .collect(),
        }
    }

    /// What onnxruntime computes for the one-split model: 1 on the true branch, 2 on the false,
    /// plus the base 0.25.
    fn onnxruntime_rule(mode: &str, tracks: bool, x: f64) -> f64 {
        let v = x as f32;
        let t = 0.5f32;
        let taken = match mode {
            "BRANCH_LEQ" => v <= t,
            "BRANCH_LT" => v < t,
            "BRANCH_GTE" => v >= t,
            "BRANCH_GT" => v > t,
            "BRANCH_EQ" => v == t,
            _ => v != t,
        } || (tracks && v.is_nan());
        if taken {
            1.25
        } else {
            2.25
        }
    }

    #[test]
    fn every_mode_decides_as_onnxruntime_in_f32() {
        let near = f64::from(0.5f32);
        let xs = [
            0.0,
            near,
            near + 1e-12,
            near - 1e-12,
            f64::from(f32::from_bits(0.5f32.to_bits() + 1)),
            f64::from(f32::from_bits(0.5f32.to_bits() - 1)),
            0.75,
            -3.0,
            f64::NAN,
            f64::INFINITY,
            1e300,
        ];
        for mode in [
            "BRANCH_LEQ",
            "BRANCH_LT",
            "BRANCH_GTE",
            "BRANCH_GT",
            "BRANCH_EQ",
            "BRANCH_NEQ",
        ] {
            for tracks in [0, 1] {
                let bytes = model(vec![one_split(mode, tracks)], vec![], 1);
                let ranker = import_onnx(&bytes).unwrap();
                for x in xs {
                    assert_eq!(
                        score_doc_reference(&ranker, &[x]),
                        onnxruntime_rule(mode, tracks == 1, x),
                        "{mode}, tracks {tracks}, x = {x:e}"
                    );
                }
            }
        }
    }

    fn tensor(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
        TensorProto {
            dims: dims.to_vec(),
            data_type: DATA_FLOAT,
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            name: name.into(),
            ..Default::default()
        }
    }

    fn op(op_type: &str, inputs: &[&str], output: &str) -> NodeProto {
        NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            name: format!("{op_type}_0"),
            op_type: op_type.into(),
            ..Default::default()
        }
    }

    #[test]
    fn gemm_and_matmul_add_become_layers() {
        let mut gemm = op("Gemm", &["x", "w1", "b1"], "h");
        gemm.attribute.push(AttributeProto {
            name: "transB".into(),
            i: 1,
            r#type: INT,
            ..Default::default()
        });
        let nodes = vec![
            gemm,
            op("Relu", &["h"], "r"),
            op("MatMul", &["r", "w2"], "m"),
            op("Add", &["b2", "m"], "a"),
            op("Sigmoid", &["a"], "y"),
        ];
        let inits = vec![
            // PyTorch layout [out, in]: row o holds output o's weights.
            tensor("w1", &[2, 3], &[1.0, 0.0, 0.0, 0.0, 1.0, -1.0]),
            tensor("b1", &[2], &[0.5, 0.0]),
            // MatMul layout [in, out].
            tensor("w2", &[2, 1], &[2.0, -1.0]),
            tensor("b2", &[1], &[0.25]),
        ];
        let ranker = import_onnx(&model(nodes, inits, 3)).unwrap();
        assert_eq!(ranker.features, ["f0", "f1", "f2"]);
        assert_eq!(ranker.layers.len(), 2);
        assert_eq!(ranker.layers[0].weights, [1.0, 0.0, 0.0, 0.0, 1.0, -1.0]);
        assert_eq!(ranker.layers[0].activation, Activation::Relu);
        assert_eq!(ranker.layers[1].weights, [2.0, -1.0]);
        let x = [0.25f64, 2.0, 0.5];
        let h = [(0.25f32 + 0.5).max(0.0), (2.0f32 - 0.5).max(0.0)];
        let expected = 1.0 / (1.0 + (-(2.0 * h[0] - h[1] + 0.25f32)).exp());
        assert_eq!(score_doc_reference(&ranker, &x), f64::from(expected));
    }

    fn error_of(bytes: &[u8]) -> String {
        import_onnx(bytes).unwrap_err().to_string()
    }

    #[test]
    fn refuses_what_is_outside_the_subset() {
        let err = error_of(&model(vec![op("Softmax", &["x"], "y")], vec![], 3));
        assert!(
            err.contains(
                "graph.node[0] (name \"Softmax_0\", op Softmax): op Softmax is not supported"
            ),
            "{err}"
        );
        let mut gemm = op("Gemm", &["x", "w"], "y");
        gemm.attribute.push(AttributeProto {
            name: "transA".into(),
            i: 1,
            r#type: INT,
            ..Default::default()
        });
        let err = error_of(&model(vec![gemm], vec![tensor("w", &[3, 1], &[1.0; 3])], 3));
        assert!(
            err.contains("attribute \"transA\": 1; supported: 0"),
            "{err}"
        );
        let err = error_of(&model(vec![op("Relu", &["x"], "y")], vec![], 3));
        assert!(err.contains("Relu must follow a Gemm"), "{err}");
        let mut post = one_split("BRANCH_LEQ", 0);
        post.attribute.push(AttributeProto {
            name: "post_transform".into(),
            s: b"LOGISTIC".to_vec(),
            r#type: STRING,
            ..Default::default()
        });
        let err = error_of(&model(vec![post], vec![], 1));
        assert!(
            err.contains("attribute \"post_transform\": \"LOGISTIC\"; supported: \"NONE\""),
            "{err}"
        );
        let mut odd = one_split("BRANCH_LEQ", 0);
        odd.attribute.push(floats("nodes_values_as_tensor", &[]));
        let err = error_of(&model(vec![odd], vec![], 1));
        assert!(err.contains("double-precision thresholds"), "{err}");
        // Two outputs of the input, not a chain.
        let err = error_of(&model(
            vec![op("MatMul", &["w", "x"], "y")],
            vec![tensor("w", &[1, 3], &[1.0; 3])],
            3,
        ));
        assert!(err.contains("do not take \"x\""), "{err}");
        let err = error_of(b"definitely not protobuf \xff\xff\xff");
        assert!(
            err.starts_with("ONNX model, (protobuf): not an ONNX ModelProto"),
            "{err}"
        );
    }

    #[test]
    fn refuses_a_cycle_and_a_missing_child() {
        let mut cyclic = one_split("BRANCH_LEQ", 0);
        for a in &mut cyclic.attribute {
            if a.name == "nodes_modes" {
                a.strings[1] = b"BRANCH_LEQ".to_vec();
            }
            if a.name == "nodes_truenodeids" {
                a.ints = vec![1, 0, 0];
            }
        }
        let err = error_of(&model(vec![cyclic], vec![], 1));
        assert!(err.contains("has a cycle"), "{err}");
        let mut dangling = one_split("BRANCH_LEQ", 0);
        for a in &mut dangling.attribute {
            if a.name == "nodes_falsenodeids" {
                a.ints = vec![9, 0, 0];
            }
        }
        let err = error_of(&model(vec![dangling], vec![], 1));
        assert!(
            err.contains("nodes_falsenodeids\"[0]: tree 0 has no node 9"),
            "{err}"
        );
    }

    #[test]
    fn detects_onnx_bytes() {
        assert!(is_onnx(&model(vec![one_split("BRANCH_LEQ", 0)], vec![], 1)));
        assert!(!is_onnx(b"{\"format\":1}"));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Mutated models are imported or refused with an error, never a panic.
        #[test]
        fn mutated_models_never_panic(
            seed in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 1..8),
            cut in 0usize..4096,
        ) {
            let mut gemm = op("Gemm", &["x", "w", "b"], "h");
            gemm.attribute.push(AttributeProto { name: "transB".into(), i: 1, r#type: INT, ..Default::default() });
            let mlp = model(
                vec![gemm, op("Tanh", &["h"], "y")],
                vec![tensor("w", &[1, 2], &[0.5, -0.5]), tensor("b", &[1], &[0.1])],
                2,
            );
            for original in [model(vec![one_split("BRANCH_EQ", 1)], vec![], 1), mlp] {
                let mut bytes = original.clone();
                for &(at, byte) in &seed {
                    let n = bytes.len();
                    bytes[at % n] = byte;
                }
                bytes.truncate(cut.max(1).min(bytes.len()));
                if let Err(e) = import_onnx(&bytes) {
                    proptest::prop_assert!(!e.to_string().is_empty());
                }
            }
        }
    }
}
