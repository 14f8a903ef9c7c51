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

mod mlp;
mod proto;
mod trees;

use mlp::*;
use proto::{AttributeProto, NodeProto, TensorProto};
use trees::*;

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
