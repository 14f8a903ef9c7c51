//! The validated, in-memory ranker: what every backend (CPU reference, GPU) evaluates.
//!
//! A ranker maps a document's feature vector `V` (f64 values named by [`Ranker::features`]) to
//! one f64 score:
//!
//! 1. each [`Input`] turns `V` into one model input (a transform, computed in f32, or a tree's
//!    leaf value);
//! 2. when [`Ranker::layers`] is non-empty, the inputs feed the NN (f32, the last layer has one
//!    output) and that output is the ranker's value; otherwise the ranker's value is the sum of the
//!    inputs (in f64, input order);
//! 3. when [`Ranker::ensemble`] is present, its base score and its trees' leaf values are added,
//!    accumulated in f64 in tree order.
//!
//! Values of this module are only built by validation (the native file loader, the importers,
//! the synthesizer), so evaluators may rely on the invariants documented on each type.

/// Index of a feature in a ranker's feature vector `V`.
pub type FeatureIdx = u32;

/// A validated ranker.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranker {
    /// The feature map: the names of `V`'s entries, in order, unique.
    pub features: Vec<String>,
    /// Model inputs, in order (the NN's first layer reads them in this order).
    pub inputs: Vec<Input>,
    /// NN layers, first to last. Invariant: layer 0 has `inputs.len()` inputs, each layer's
    /// input count is the previous layer's output count, and the last layer has one output.
    pub layers: Vec<Layer>,
    /// Optional tree ensemble added to the score.
    pub ensemble: Option<Ensemble>,
}

/// One model input: a function of the feature vector. A missing feature value (NaN) reads as 0
/// in the Linear, LogLinear and FreeForm transforms and is outside every Bucket.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// `f32(x) * slope + intercept`.
    Linear {
        feature: FeatureIdx,
        slope: f32,
        intercept: f32,
    },
    /// `ln(f32(x) + 1) * slope + intercept`.
    LogLinear {
        feature: FeatureIdx,
        slope: f32,
        intercept: f32,
    },
    /// `1` when `lower <= x < upper` (compared in f64), else `0`.
    Bucket {
        feature: FeatureIdx,
        lower: f64,
        upper: f64,
    },
    /// An arithmetic expression over features; [`FreeForm::source`] is kept for writing back.
    FreeForm(FreeForm),
    /// A decision tree whose value is the leaf reached.
    Tree(Tree),
    /// Always `0`: pads warp groups on the GPU; a no-op on the CPU.
    Dummy,
}

/// A parsed FreeForm expression.
#[derive(Debug, Clone, PartialEq)]
pub struct FreeForm {
    /// The expression as written in the ranker file.
    pub source: String,
    /// The parsed expression tree, features resolved to indices.
    pub expr: Expr,
}

/// A FreeForm expression node. Evaluated in f32 like the other transforms.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Const(f32),
    Feature(FeatureIdx),
    Neg(Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    Call(Func, Vec<Expr>),
}

/// Binary arithmetic operators of FreeForm expressions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// Functions of FreeForm expressions (`ln` and `exp` take one argument, `min` and `max` two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Ln,
    Exp,
    Min,
    Max,
}

/// A decision tree as a node array; node 0 is the root.
///
/// Invariants: every child index is in range and greater than its parent's index is *not*
/// required, but the nodes form a tree (each node but the root has exactly one parent, no
/// cycles) and every path ends in a leaf.
#[derive(Debug, Clone, PartialEq)]
pub struct Tree {
    pub nodes: Vec<Node>,
}

/// A tree node.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Split(Split),
    Leaf(f64),
}

/// An internal tree node.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    pub feature: FeatureIdx,
    pub decision: Decision,
    pub missing: Missing,
    /// Where a missing value goes when [`Split::missing`] says it takes the default way.
    pub default_left: bool,
    pub left: u32,
    pub right: u32,
}

/// How a split compares the feature value.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Left when `x <= threshold` in f64 (LightGBM numerical splits).
    LeF64(f64),
    /// Left when `f32(x) < threshold` in f32 (XGBoost).
    LtF32(f32),
    /// Left when `x` is a non-negative integer category in the (sorted, deduplicated) set
    /// (LightGBM categorical splits). A value's category is `x` truncated toward zero, as
    /// LightGBM's `static_cast<int>` does (so 2.7 is category 2 and -0.5 category 0); a value
    /// `<= -1` or `>= 2^31` has none and goes right (see `docs/ranker-format.md`).
    In(Vec<u32>),
}

/// What counts as a missing value at a split, and where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Nothing is missing: NaN is treated as 0 and compared.
    None,
    /// `|x| <= 1e-35` and NaN go the default way.
    Zero,
    /// NaN goes the default way.
    Nan,
}

/// A fully connected NN layer: `out = activation(W · in + bias)`, computed in f32.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    /// Number of inputs (columns of `weights`).
    pub inputs: usize,
    /// Number of outputs (rows of `weights`).
    pub outputs: usize,
    /// Row-major `[outputs][inputs]`, finite.
    pub weights: Vec<f32>,
    /// `outputs` entries, finite.
    pub bias: Vec<f32>,
    pub activation: Activation,
}

/// NN activation functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Identity,
    Relu,
    Tanh,
    Sigmoid,
}

/// A tree ensemble: `base_score + Σ trees`, accumulated in f64 in tree order.
#[derive(Debug, Clone, PartialEq)]
pub struct Ensemble {
    pub trees: Vec<Tree>,
    pub base_score: f64,
}
