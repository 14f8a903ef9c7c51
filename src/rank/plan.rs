//! The GPU layout of a ranker's model inputs, built on the host (no CUDA here): the transform
//! table `kernels/mit.cu` reads, FreeForm expressions compiled to postfix programs, and the column
//! order of the model-input matrix.
//!
//! The seed (Tadros 2015, §4.3) runs one GPU thread per (document, model input) and arranges the
//! inputs so that a warp does not diverge: inputs are grouped by transform kind, each group padded
//! to a multiple of 32 with Dummy inputs, and the NN's first-layer weights are permuted to match
//! (a dummy column has weight 0). Within a group, ordering by feature index makes neighbouring
//! threads read neighbouring features. Both are switchable ([`PlanOptions`]) so the benchmark can
//! show what each buys. Tree inputs always take the last columns, written by `trees_eval`.

use crate::rank::model::{BinaryOp, Expr, Func, Input, Layer, Ranker, Tree};

/// One column of the model-input matrix, as `kernels/mit.cu` reads it (see the layout there).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuTransform {
    pub kind: u32,
    pub feature: u32,
    pub slope: f32,
    pub intercept: f32,
    pub lower: f64,
    pub upper: f64,
}

const _: () = assert!(std::mem::size_of::<GpuTransform>() == 32);

/// Transform kinds, as `mit.cu`'s `KIND_*` codes.
pub mod kind {
    pub const DUMMY: u32 = 0;
    pub const LINEAR: u32 = 1;
    pub const LOGLINEAR: u32 = 2;
    pub const BUCKET: u32 = 3;
    pub const FREEFORM: u32 = 4;
    pub const TREE: u32 = 5;
}

/// FreeForm postfix op codes, as `mit.cu`'s `FF_*` codes.
mod op {
    pub const END: u32 = 0;
    pub const CONST: u32 = 1;
    pub const FEATURE: u32 = 2;
    pub const NEG: u32 = 3;
    pub const ADD: u32 = 4;
    pub const SUB: u32 = 5;
    pub const MUL: u32 = 6;
    pub const DIV: u32 = 7;
    pub const LN: u32 = 8;
    pub const EXP: u32 = 9;
    pub const MIN: u32 = 10;
    pub const MAX: u32 = 11;
}

/// Stack slots a FreeForm program may use on the GPU (`FF_STACK` in mit.cu).
pub const FREEFORM_STACK: usize = 16;
/// Threads per warp: the group size of the warp-group reordering.
const WARP: usize = 32;

/// The seed's input-layout optimisations, each switchable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    /// Group inputs by transform kind and pad each group to a multiple of 32 with Dummy inputs.
    pub warp_groups: bool,
    /// Order inputs by feature index within each group.
    pub feature_locality: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            warp_groups: true,
            feature_locality: true,
        }
    }
}

/// Why a ranker cannot be laid out for the GPU (it is then served by the CPU).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A FreeForm expression nests deeper than the GPU evaluator's stack.
    #[error("inputs[{input}]: the FreeForm expression needs {depth} stack slots, the GPU has {FREEFORM_STACK}")]
    FreeFormTooDeep { input: usize, depth: usize },
}

/// The model-input layout of one ranker.
#[derive(Debug, Clone, PartialEq)]
pub struct InputPlan {
    /// One entry per column, in column order; tree columns have kind [`kind::TREE`].
    pub transforms: Vec<GpuTransform>,
    /// FreeForm programs, `(op, operand)` pairs, each ending with END.
    pub program: Vec<u32>,
    /// For each input of the ranker, its column.
    pub column_of_input: Vec<usize>,
    /// The tree inputs, in input order, occupying columns `tree_col0..`.
    pub trees: Vec<Tree>,
    /// First tree column.
    pub tree_col0: usize,
}

impl InputPlan {
    /// Lays out `ranker`'s inputs.
    ///
    /// # Errors
    /// [`PlanError::FreeFormTooDeep`] when an expression does not fit the GPU evaluator.
    pub fn build(ranker: &Ranker, options: PlanOptions) -> Result<InputPlan, PlanError> {
        let mut program = Vec::new();
        // (group, feature, input index, transform) for every non-tree input.
        let mut transforms = Vec::new();
        let mut trees = Vec::new();
        let mut tree_inputs = Vec::new();
        for (i, input) in ranker.inputs.iter().enumerate() {
            let t = match input {
                Input::Linear {
                    feature,
                    slope,
                    intercept,
                } => transform(kind::LINEAR, *feature, *slope, *intercept, 0.0, 0.0),
                Input::LogLinear {
                    feature,
                    slope,
                    intercept,
                } => transform(kind::LOGLINEAR, *feature, *slope, *intercept, 0.0, 0.0),
                Input::Bucket {
                    feature,
                    lower,
                    upper,
                } => transform(kind::BUCKET, *feature, 0.0, 0.0, *lower, *upper),
                Input::FreeForm(ff) => {
                    let offset = program.len() as u32;
                    let depth = compile(&ff.expr, &mut program, 0);
                    if depth > FREEFORM_STACK {
                        return Err(PlanError::FreeFormTooDeep { input: i, depth });
                    }
                    program.extend([op::END, 0]);
                    transform(kind::FREEFORM, offset, 0.0, 0.0, 0.0, 0.0)
                }
                Input::Dummy => transform(kind::DUMMY, 0, 0.0, 0.0, 0.0, 0.0),
                Input::Tree(tree) => {
                    trees.push(tree.clone());
                    tree_inputs.push(i);
                    continue;
                }
            };
            transforms.push((t.kind, t.feature, i, t));
        }
        if options.warp_groups {
            // FreeForm programs are offsets, not features: keep their order.
            transforms.sort_by_key(|&(kind, feature, i, _)| match options.feature_locality {
                true if kind != kind::FREEFORM => (kind, feature, i),
                _ => (kind, 0, i),
            });
        }
        let mut plan = InputPlan {
            transforms: Vec::with_capacity(transforms.len() + trees.len()),
            program,
            column_of_input: vec![0; ranker.inputs.len()],
            trees,
            tree_col0: 0,
        };
        for (n, &(kind, _, input, t)) in transforms.iter().enumerate() {
            plan.column_of_input[input] = plan.transforms.len();
            plan.transforms.push(t);
            let group_ends = transforms.get(n + 1).is_none_or(|next| next.0 != kind);
            if options.warp_groups && group_ends {
                while plan.transforms.len() % WARP != 0 {
                    plan.transforms.push(GpuTransform::default());
                }
            }
        }
        plan.tree_col0 = plan.transforms.len();
        for input in tree_inputs {
            plan.column_of_input[input] = plan.transforms.len();
            plan.transforms.push(GpuTransform {
                kind: kind::TREE,
                ..GpuTransform::default()
            });
        }
        Ok(plan)
    }

    /// Number of columns of the model-input matrix (inputs plus dummies).
    pub fn n_columns(&self) -> usize {
        self.transforms.len()
    }

    /// The first NN layer's weights laid out for the column order: `[outputs][n_columns]`,
    /// row-major, 0 in dummy columns.
    pub fn permute_first_layer(&self, layer: &Layer) -> Vec<f32> {
        let columns = self.n_columns();
        let mut weights = vec![0.0f32; layer.outputs * columns];
        for out in 0..layer.outputs {
            for (input, &col) in self.column_of_input.iter().enumerate() {
                weights[out * columns + col] = layer.weights[out * layer.inputs + input];
            }
        }
        weights
    }
}

fn transform(
    kind: u32,
    feature: u32,
    slope: f32,
    intercept: f32,
    lower: f64,
    upper: f64,
) -> GpuTransform {
    GpuTransform {
        kind,
        feature,
        slope,
        intercept,
        lower,
        upper,
    }
}

/// Appends `expr` in postfix to `program`; returns the stack depth it needs on top of `depth`.
fn compile(expr: &Expr, program: &mut Vec<u32>, depth: usize) -> usize {
    match expr {
        Expr::Const(c) => {
            program.extend([op::CONST, c.to_bits()]);
            depth + 1
        }
        Expr::Feature(f) => {
            program.extend([op::FEATURE, *f]);
            depth + 1
        }
        Expr::Neg(e) => {
            let d = compile(e, program, depth);
            program.extend([op::NEG, 0]);
            d
        }
        Expr::Binary(bin, a, b) => {
            let da = compile(a, program, depth);
            let db = compile(b, program, depth + 1);
            let code = match bin {
                BinaryOp::Add => op::ADD,
                BinaryOp::Sub => op::SUB,
                BinaryOp::Mul => op::MUL,
                BinaryOp::Div => op::DIV,
            };
            program.extend([code, 0]);
            da.max(db)
        }
        Expr::Call(func, args) => {
            let mut d = depth;
            for (k, arg) in args.iter().enumerate() {
                d = d.max(compile(arg, program, depth + k));
            }
            let code = match func {
                Func::Ln => op::LN,
                Func::Exp => op::EXP,
                Func::Min => op::MIN,
                Func::Max => op::MAX,
            };
            program.extend([code, 0]);
            d
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::model::{FreeForm, Node};

    fn ranker(inputs: Vec<Input>) -> Ranker {
        Ranker {
            features: (0..8).map(|i| format!("f{i}")).collect(),
            inputs,
            layers: Vec::new(),
            ensemble: None,
        }
    }

    fn linear(feature: u32) -> Input {
        Input::Linear {
            feature,
            slope: 1.0,
            intercept: 0.0,
        }
    }

    fn bucket(feature: u32) -> Input {
        Input::Bucket {
            feature,
            lower: 0.0,
            upper: 1.0,
        }
    }

    #[test]
    fn warp_groups_pad_each_kind_and_put_trees_last() {
        let tree = Input::Tree(Tree {
            nodes: vec![Node::Leaf(1.0)],
        });
        let r = ranker(vec![bucket(3), linear(5), tree, bucket(1), linear(2)]);
        let plan = InputPlan::build(&r, PlanOptions::default()).unwrap();
        // linear group: f2, f5, then 30 dummies; bucket group: f1, f3, 30 dummies; one tree.
        assert_eq!(plan.n_columns(), 65);
        assert_eq!(plan.column_of_input, vec![33, 1, 64, 32, 0]);
        assert_eq!(plan.tree_col0, 64);
        assert_eq!(plan.transforms[2].kind, kind::DUMMY);
        assert_eq!(plan.transforms[64].kind, kind::TREE);

        let plain = PlanOptions {
            warp_groups: false,
            feature_locality: false,
        };
        let plan = InputPlan::build(&r, plain).unwrap();
        assert_eq!(plan.column_of_input, vec![0, 1, 4, 2, 3]);
    }

    #[test]
    fn first_layer_weights_follow_the_columns() {
        let mut r = ranker(vec![bucket(3), linear(5)]);
        r.layers.push(Layer {
            inputs: 2,
            outputs: 2,
            weights: vec![1.0, 2.0, 3.0, 4.0],
            bias: vec![0.0, 0.0],
            activation: crate::rank::model::Activation::Identity,
        });
        let plan = InputPlan::build(&r, PlanOptions::default()).unwrap();
        let w = plan.permute_first_layer(&r.layers[0]);
        assert_eq!(w.len(), 2 * 64);
        assert_eq!((w[0], w[32], w[1]), (2.0, 1.0, 0.0));
        assert_eq!((w[64], w[96]), (4.0, 3.0));
    }

    #[test]
    fn freeform_compiles_to_postfix_with_its_depth() {
        // max(f1, 0.5) * ln(f2 + 1)
        let expr = Expr::Binary(
            BinaryOp::Mul,
            Box::new(Expr::Call(
                Func::Max,
                vec![Expr::Feature(1), Expr::Const(0.5)],
            )),
            Box::new(Expr::Call(
                Func::Ln,
                vec![Expr::Binary(
                    BinaryOp::Add,
                    Box::new(Expr::Feature(2)),
                    Box::new(Expr::Const(1.0)),
                )],
            )),
        );
        let mut program = Vec::new();
        assert_eq!(compile(&expr, &mut program, 0), 3);
        let ops: Vec<u32> = program.chunks(2).map(|p| p[0]).collect();
        assert_eq!(
            ops,
            [
                op::FEATURE,
                op::CONST,
                op::MAX,
                op::FEATURE,
                op::CONST,
                op::ADD,
                op::LN,
                op::MUL
            ]
        );
        let r = ranker(vec![Input::FreeForm(FreeForm {
            source: String::new(),
            expr,
        })]);
        let plan = InputPlan::build(&r, PlanOptions::default()).unwrap();
        assert_eq!(plan.transforms[0].kind, kind::FREEFORM);
        assert_eq!(&plan.program[plan.program.len() - 2..], &[op::END, 0]);
    }
}
