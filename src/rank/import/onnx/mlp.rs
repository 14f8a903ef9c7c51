//! The MLP ops (`Gemm`, `MatMul` + `Add`, activations) into the ranker's NN layers.

use super::*;

/// The NN layers built so far from a chain of linear ops and activations.
#[derive(Default)]
pub(super) struct Mlp {
    layers: Vec<Layer>,
    /// A linear layer still waiting for its activation (or, after `MatMul`, for its bias).
    pending: Option<Pending>,
}

pub(super) struct Pending {
    layer: Layer,
    /// After `MatMul`: an `Add` may still give the bias.
    bias_open: bool,
}

impl Mlp {
    pub(super) fn is_empty(&self) -> bool {
        self.layers.is_empty() && self.pending.is_none()
    }

    fn flush(&mut self) {
        if let Some(p) = self.pending.take() {
            self.layers.push(p.layer);
        }
    }

    pub(super) fn step(
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
    pub(super) fn finish(mut self, declared_width: Option<usize>) -> Result<Ranker, ImportError> {
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
pub(super) fn tensor_floats(
    t: &TensorProto,
    path: &str,
) -> Result<(Vec<usize>, Vec<f32>), ImportError> {
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
pub(super) fn weights(b: &TensorProto, transposed: bool, path: &str) -> Result<Layer, ImportError> {
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
pub(super) fn bias(c: &TensorProto, outputs: usize, path: &str) -> Result<Vec<f32>, ImportError> {
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
