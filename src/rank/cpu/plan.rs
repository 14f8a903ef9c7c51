//! The fast CPU path: a ranker compiled once into a [`CpuPlan`], then scored a block of
//! documents at a time.
//!
//! Trees are flattened into one node array per forest (the ensemble's trees, and separately the
//! trees of tree inputs), 24 bytes a node, in the trees' own node order so that a flat index
//! minus the tree's root is the reference's leaf id. Every numeric decision becomes one f64
//! comparison `x <= bound`: an `lt_f32` threshold `t` is replaced by the largest f64 `b` with
//! `f32(x) < t ⇔ x <= b` ([`lt_f32_bound`]). Missing-value rules become three flag bits
//! combined without branches. A leaf points to itself on both sides and keeps its value in the
//! threshold slot, so a tree is walked for [`BLOCK`] documents at once, at most the tree's depth
//! steps, with no per-document branch on "is this a leaf" (the block stops when every document
//! stands on a leaf): the documents' walks are independent, which
//! keeps several loads in flight (the blocked traversal of Asadi et al. and QuickScorer's
//! observation that tree walks are latency-bound, not compute-bound). Categorical splits take a
//! slower branch, only in trees that have one.
//!
//! Every document's score is computed by the same sequence of f32/f64 operations as
//! [`super::score_doc_reference`], so scores are bit-identical to the reference for any batch
//! size and thread count (the tests check it on random trees and edge values).

use rayon::prelude::*;

use super::{category, transform_arg, ZERO_THRESHOLD};
use crate::rank::freeform;
use crate::rank::model::{Activation, Decision, Expr, Input, Layer, Missing, Node, Ranker, Tree};

/// Documents walked together through one tree: several independent walks keep node loads in
/// flight; 8 measured fastest (development machine, 10 000 rows of the LightGBM peer model, one
/// thread: 8 → 357–385 ms, 16 → 461–581, 32 → 536–750, 4 → 553–620).
pub const BLOCK: usize = 8;
/// Most documents per rayon task.
const TASK_DOCS: usize = 256;

/// Estimated work of one rayon task worth its scheduling, in nanoseconds of scoring.
const TASK_MIN_NS: usize = 20_000;
/// Estimated work of a whole batch below which it stays on the calling thread: waking a pool
/// cost more than it saved below this on the H100 host (small ranker, 100 documents: 188 µs on
/// 16 threads against 70 µs on one; docs/benchmarks-history.md).
const PARALLEL_MIN_NS: usize = 500_000;

/// Documents per rayon task for a batch of `n` documents costing about `doc_ns` each: about two
/// tasks per thread of the current pool, so that a query's few hundred candidates still spread
/// over every thread, but no task under [`TASK_MIN_NS`] of work; whole blocks, at most
/// [`TASK_DOCS`].
fn task_docs(n: usize, doc_ns: usize) -> usize {
    let per_task = n.div_ceil(2 * rayon::current_num_threads().max(1));
    let worth_it = TASK_MIN_NS.div_ceil(doc_ns.max(1));
    per_task
        .max(worth_it)
        .next_multiple_of(BLOCK)
        .clamp(BLOCK, TASK_DOCS)
}

const NAN_LEFT: u32 = 1;
const ZERO_MISSING: u32 = 2;
const DEFAULT_LEFT: u32 = 4;
const CATEGORICAL: u32 = 8;
const LEAF: u32 = 16;

/// A flattened node. Numeric split: left when `x <= threshold`. Categorical split: `threshold`
/// holds the index of its set in [`Forest::sets`]. Leaf: `threshold` is the leaf value and both
/// children are the leaf itself.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct FlatNode {
    threshold: f64,
    feature: u32,
    flags: u32,
    /// `[left, right]`, absolute indices into [`Forest::nodes`].
    children: [u32; 2],
}

/// Trees flattened into one node array.
#[derive(Debug, Clone, Default)]
struct Forest {
    nodes: Vec<FlatNode>,
    roots: Vec<u32>,
    /// Per tree: the longest root-to-leaf path, in edges.
    depths: Vec<u32>,
    /// Per tree: whether it has a categorical split.
    categorical: Vec<bool>,
    /// Category sets of categorical splits, sorted.
    sets: Vec<Vec<u32>>,
}

impl Forest {
    fn push(&mut self, tree: &Tree) {
        let root = self.nodes.len() as u32;
        let mut has_cat = false;
        for (i, node) in tree.nodes.iter().enumerate() {
            let at = root + i as u32;
            self.nodes.push(match node {
                Node::Leaf(v) => FlatNode {
                    threshold: *v,
                    feature: 0,
                    flags: LEAF,
                    children: [at, at],
                },
                Node::Split(s) => {
                    let default_left = if s.default_left { DEFAULT_LEFT } else { 0 };
                    let (threshold, cat) = match &s.decision {
                        Decision::LeF64(t) => (*t, 0),
                        Decision::LtF32(t) => (lt_f32_bound(*t), 0),
                        Decision::In(set) => {
                            has_cat = true;
                            self.sets.push(set.clone());
                            ((self.sets.len() - 1) as f64, CATEGORICAL)
                        }
                    };
                    // Where a NaN goes: compared as 0 with `missing: none`, else the default way.
                    let nan_left = match s.missing {
                        Missing::None => match &s.decision {
                            Decision::In(set) => set.binary_search(&0).is_ok(),
                            _ => 0.0 <= threshold,
                        },
                        Missing::Zero | Missing::Nan => s.default_left,
                    };
                    let zero = if s.missing == Missing::Zero {
                        ZERO_MISSING
                    } else {
                        0
                    };
                    FlatNode {
                        threshold,
                        feature: s.feature,
                        flags: default_left | zero | cat | if nan_left { NAN_LEFT } else { 0 },
                        children: [root + s.left, root + s.right],
                    }
                }
            });
        }
        self.roots.push(root);
        self.depths.push(depth(tree));
        self.categorical.push(has_cat);
    }

    /// The flat indices of the leaves that `N` documents (rows of `n_features` values) reach in
    /// tree `t`.
    #[inline]
    fn leaves<const N: usize>(&self, t: usize, rows: &[f64], n_features: usize) -> [u32; N] {
        if self.categorical[t] {
            self.walk::<N, true>(t, rows, n_features)
        } else {
            self.walk::<N, false>(t, rows, n_features)
        }
    }

    #[inline(always)]
    fn walk<const N: usize, const CAT: bool>(
        &self,
        t: usize,
        rows: &[f64],
        n_features: usize,
    ) -> [u32; N] {
        let rows = &rows[..N * n_features];
        let mut at = [self.roots[t]; N];
        for _ in 0..self.depths[t] {
            // Unbalanced trees: the block usually reaches its leaves well before the deepest
            // path's length, and stops there (leaves step to themselves, so this only saves
            // work; the leaves reached are the same).
            let mut all_leaves = true;
            for (d, at) in at.iter_mut().enumerate() {
                let node = &self.nodes[*at as usize];
                all_leaves &= node.flags & LEAF != 0;
                let x = rows[d * n_features + node.feature as usize];
                let left = if CAT && node.flags & CATEGORICAL != 0 {
                    self.categorical_left(node, x)
                } else {
                    numeric_left(node, x)
                };
                *at = node.children[usize::from(!left)];
            }
            if all_leaves {
                break;
            }
        }
        at
    }

    #[cold]
    fn categorical_left(&self, node: &FlatNode, x: f64) -> bool {
        if x.is_nan() {
            return node.flags & NAN_LEFT != 0;
        }
        if node.flags & ZERO_MISSING != 0 && x.abs() <= ZERO_THRESHOLD {
            return node.flags & DEFAULT_LEFT != 0;
        }
        let set = &self.sets[node.threshold as usize];
        category(x).is_some_and(|c| set.binary_search(&c).is_ok())
    }
}

/// The reference's decision for a numeric split, without branches: a NaN fails both compares.
#[inline(always)]
fn numeric_left(node: &FlatNode, x: f64) -> bool {
    let nan = x.is_nan();
    let zero = (node.flags & ZERO_MISSING != 0) & (x.abs() <= ZERO_THRESHOLD);
    let below = x <= node.threshold;
    (below & !zero)
        | (zero & (node.flags & DEFAULT_LEFT != 0))
        | (nan & (node.flags & NAN_LEFT != 0))
}

/// The longest root-to-leaf path of a (validated) tree, in edges.
fn depth(tree: &Tree) -> u32 {
    let mut deepest = 0;
    let mut stack = vec![(0u32, 0u32)];
    while let Some((i, d)) = stack.pop() {
        match &tree.nodes[i as usize] {
            Node::Leaf(_) => deepest = deepest.max(d),
            Node::Split(s) => {
                stack.push((s.left, d + 1));
                stack.push((s.right, d + 1));
            }
        }
    }
    deepest
}

/// The largest f64 `b` such that, for every non-NaN f64 `x`, `f32(x) < t ⇔ x <= b` (rounding
/// to nearest, ties to even, as Rust's `as` and C casts do). `t` must be finite.
pub fn lt_f32_bound(t: f32) -> f64 {
    let t64 = f64::from(t);
    // The f32 just below t, as f64 (below -f32::MAX: -2^128, where rounding overflows).
    let below = if t == 0.0 {
        -f64::from(f32::from_bits(1))
    } else if t > 0.0 {
        f64::from(f32::from_bits(t.to_bits() - 1))
    } else if t == -f32::MAX {
        -(2f64.powi(128))
    } else {
        f64::from(f32::from_bits(t.to_bits() + 1))
    };
    let mid = (below + t64) / 2.0; // exact: 25 significant bits
    if mid as f32 == t {
        // the midpoint itself rounds up to t: the bound is the f64 just below it
        if mid > 0.0 {
            f64::from_bits(mid.to_bits() - 1)
        } else {
            f64::from_bits(mid.to_bits() + 1)
        }
    } else {
        mid
    }
}

#[derive(Debug, Clone)]
enum PlanInput {
    Linear {
        feature: usize,
        slope: f32,
        intercept: f32,
    },
    LogLinear {
        feature: usize,
        slope: f32,
        intercept: f32,
    },
    Bucket {
        feature: usize,
        lower: f64,
        upper: f64,
    },
    FreeForm(Expr),
    /// Index of the tree in [`CpuPlan::input_trees`].
    Tree(usize),
    Dummy,
}

/// A ranker compiled for the CPU: build it once per ranker ([`CpuPlan::new`]), score many batches.
#[derive(Debug, Clone)]
pub struct CpuPlan {
    n_features: usize,
    inputs: Vec<PlanInput>,
    input_trees: Forest,
    layers: Vec<Layer>,
    ensemble: Option<(Forest, f64)>,
    /// Rough cost of scoring one document, in nanoseconds: about 4 per input, 1 per layer
    /// weight and 30 per tree, as measured on the bundled rankers (docs/benchmarks-history.md).
    doc_ns: usize,
}

/// Per-task buffers: model inputs and layer outputs of one block, `[width][BLOCK]`.
#[derive(Default)]
struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
}

impl CpuPlan {
    /// Compiles a validated ranker.
    pub fn new(ranker: &Ranker) -> Self {
        let mut input_trees = Forest::default();
        let inputs: Vec<PlanInput> = ranker
            .inputs
            .iter()
            .map(|input| match input {
                Input::Linear {
                    feature,
                    slope,
                    intercept,
                } => PlanInput::Linear {
                    feature: *feature as usize,
                    slope: *slope,
                    intercept: *intercept,
                },
                Input::LogLinear {
                    feature,
                    slope,
                    intercept,
                } => PlanInput::LogLinear {
                    feature: *feature as usize,
                    slope: *slope,
                    intercept: *intercept,
                },
                Input::Bucket {
                    feature,
                    lower,
                    upper,
                } => PlanInput::Bucket {
                    feature: *feature as usize,
                    lower: *lower,
                    upper: *upper,
                },
                Input::FreeForm(ff) => PlanInput::FreeForm(ff.expr.clone()),
                Input::Tree(tree) => {
                    input_trees.push(tree);
                    PlanInput::Tree(input_trees.roots.len() - 1)
                }
                Input::Dummy => PlanInput::Dummy,
            })
            .collect();
        let ensemble = ranker.ensemble.as_ref().map(|e| {
            let mut forest = Forest::default();
            e.trees.iter().for_each(|t| forest.push(t));
            (forest, e.base_score)
        });
        let trees = input_trees.roots.len() + ensemble.as_ref().map_or(0, |(f, _)| f.roots.len());
        let weights: usize = ranker.layers.iter().map(|l| l.weights.len()).sum();
        CpuPlan {
            n_features: ranker.features.len(),
            doc_ns: 4 * inputs.len() + weights + 30 * trees,
            inputs,
            input_trees,
            layers: ranker.layers.clone(),
            ensemble,
        }
    }

    /// The length of one document's feature row.
    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// Scores `features` (row-major, `n_features()` values per document); see
    /// [`super::score_batch`] for `threads`.
    ///
    /// # Panics
    /// When `features.len()` is not a multiple of `n_features()`.
    pub fn score_batch(&self, features: &[f64], threads: usize) -> Vec<f64> {
        let nf = self.n_features;
        assert!(
            nf > 0 && features.len() % nf == 0,
            "feature rows of {nf} values expected, got {} values",
            features.len()
        );
        let mut out = vec![0.0; features.len() / nf];
        if threads == 1 || out.len() <= BLOCK || out.len() * self.doc_ns < PARALLEL_MIN_NS {
            self.score_into(features, &mut out);
            return out;
        }
        let run = |out: &mut [f64]| {
            let task = task_docs(out.len(), self.doc_ns);
            out.par_chunks_mut(task)
                .zip(features.par_chunks(task * nf))
                .for_each(|(out, rows)| self.score_into(rows, out));
        };
        if threads == 0 {
            run(&mut out);
        } else {
            match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
                Ok(pool) => pool.install(|| run(&mut out)),
                // No threads to be had: the global pool gives the same scores.
                Err(_) => run(&mut out),
            }
        }
        out
    }

    /// Scores the documents of `rows` into `out`, [`BLOCK`] at a time, the rest one by one.
    fn score_into(&self, rows: &[f64], out: &mut [f64]) {
        let nf = self.n_features;
        let mut scratch = Scratch::default();
        let full = out.len() / BLOCK * BLOCK;
        for (b, out) in out[..full].chunks_exact_mut(BLOCK).enumerate() {
            self.score_block::<BLOCK>(&rows[b * BLOCK * nf..], out, &mut scratch);
        }
        for d in full..out.len() {
            self.score_block::<1>(&rows[d * nf..], &mut out[d..d + 1], &mut scratch);
        }
    }

    /// Scores `N` documents (the first `N` rows of `rows`).
    fn score_block<const N: usize>(&self, rows: &[f64], out: &mut [f64], scratch: &mut Scratch) {
        let nf = self.n_features;
        let mut model = [0.0f64; N];
        if !self.inputs.is_empty() {
            let sum_inputs = self.layers.is_empty();
            scratch.a.clear();
            for input in &self.inputs {
                let mut values = [0.0f64; N];
                match input {
                    PlanInput::Linear {
                        feature,
                        slope,
                        intercept,
                    } => {
                        for (d, v) in values.iter_mut().enumerate() {
                            *v = f64::from(
                                transform_arg(rows[d * nf + feature]) * slope + intercept,
                            );
                        }
                    }
                    PlanInput::LogLinear {
                        feature,
                        slope,
                        intercept,
                    } => {
                        for (d, v) in values.iter_mut().enumerate() {
                            *v = f64::from(
                                (transform_arg(rows[d * nf + feature]) + 1.0).ln() * slope
                                    + intercept,
                            );
                        }
                    }
                    PlanInput::Bucket {
                        feature,
                        lower,
                        upper,
                    } => {
                        for (d, v) in values.iter_mut().enumerate() {
                            let x = rows[d * nf + feature];
                            *v = if *lower <= x && x < *upper { 1.0 } else { 0.0 };
                        }
                    }
                    PlanInput::FreeForm(expr) => {
                        for (d, v) in values.iter_mut().enumerate() {
                            *v = f64::from(freeform::eval(expr, &rows[d * nf..(d + 1) * nf]));
                        }
                    }
                    PlanInput::Tree(t) => {
                        let leaves = self.input_trees.leaves::<N>(*t, rows, nf);
                        for (v, leaf) in values.iter_mut().zip(leaves) {
                            *v = self.input_trees.nodes[leaf as usize].threshold;
                        }
                    }
                    PlanInput::Dummy => {}
                }
                if sum_inputs {
                    for (m, v) in model.iter_mut().zip(values) {
                        *m += v;
                    }
                } else {
                    scratch.a.extend(values.iter().map(|v| *v as f32));
                }
            }
            if !sum_inputs {
                for layer in &self.layers {
                    layer_block::<N>(layer, &scratch.a, &mut scratch.b);
                    std::mem::swap(&mut scratch.a, &mut scratch.b);
                }
                for (m, v) in model.iter_mut().zip(&scratch.a[..N]) {
                    *m = f64::from(*v);
                }
            }
        }
        match &self.ensemble {
            None => out[..N].copy_from_slice(&model),
            Some((forest, base_score)) => {
                let mut sum = [*base_score; N];
                for t in 0..forest.roots.len() {
                    let leaves = forest.leaves::<N>(t, rows, nf);
                    for (s, leaf) in sum.iter_mut().zip(leaves) {
                        *s += forest.nodes[leaf as usize].threshold;
                    }
                }
                for d in 0..N {
                    out[d] = if self.inputs.is_empty() {
                        sum[d]
                    } else {
                        model[d] + sum[d]
                    };
                }
            }
        }
    }
}

/// One layer on a block: `input` is `[layer.inputs][N]`, `output` becomes `[layer.outputs][N]`.
/// Each document's dot product is summed in input order, as the reference does; the inner loop
/// runs across the block's documents, which vectorizes without reordering any sum.
fn layer_block<const N: usize>(layer: &Layer, input: &[f32], output: &mut Vec<f32>) {
    output.clear();
    for o in 0..layer.outputs {
        let row = &layer.weights[o * layer.inputs..(o + 1) * layer.inputs];
        let mut acc = [0.0f32; N];
        for (w, x) in row.iter().zip(input.chunks_exact(N)) {
            for d in 0..N {
                acc[d] += w * x[d];
            }
        }
        let bias = layer.bias[o];
        output.extend(
            acc.iter()
                .map(|a| activate_fast(layer.activation, a + bias)),
        );
    }
}

#[inline(always)]
fn activate_fast(activation: Activation, v: f32) -> f32 {
    super::activate(activation, v)
}

#[cfg(test)]
mod tests {
    use super::super::{score_doc_reference, tree_leaf};
    use super::*;
    use crate::rank::format::validate;
    use crate::rank::model::{Ensemble, Split};
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Values that sit on thresholds, on either side of them, and on the missing rules' edges.
    const EDGES: [f64; 14] = [
        -2.0,
        -1.0,
        -0.5,
        -0.0,
        0.0,
        1e-36,
        1e-35,
        ZERO_THRESHOLD,
        0.1,
        0.5,
        1.0,
        2.5,
        3.0,
        7.0,
    ];

    fn edge_value(rng: &mut ChaCha8Rng) -> f64 {
        match rng.random_range(0..10) {
            0 => f64::NAN,
            1 => rng.random_range(-3.0..8.0),
            2 => f64::from(rng.random_range(-3.0f32..8.0)),
            3 => {
                let e = EDGES[rng.random_range(0..EDGES.len())];
                f64::from_bits(
                    e.to_bits()
                        .wrapping_add(rng.random_range(0..3))
                        .wrapping_sub(1),
                )
            }
            4 => f64::from(EDGES[rng.random_range(0..EDGES.len())] as f32),
            _ => EDGES[rng.random_range(0..EDGES.len())],
        }
    }

    /// A random valid tree over `n_features` features: unbalanced, every kind of decision and
    /// missing rule, thresholds from [`EDGES`], node order shuffled (root stays 0).
    fn random_tree(rng: &mut ChaCha8Rng, n_features: u32, max_depth: u32) -> Tree {
        fn grow(rng: &mut ChaCha8Rng, nodes: &mut Vec<Node>, n_features: u32, depth: u32) -> u32 {
            let at = nodes.len() as u32;
            if depth == 0 || rng.random_bool(0.3) {
                nodes.push(Node::Leaf(rng.random_range(-1.0..1.0)));
                return at;
            }
            nodes.push(Node::Leaf(0.0));
            let decision = match rng.random_range(0..6) {
                0 => Decision::LtF32(EDGES[rng.random_range(0..EDGES.len())] as f32),
                1 => Decision::In({
                    let mut s: Vec<u32> = (0..rng.random_range(1..4))
                        .map(|_| rng.random_range(0..8))
                        .collect();
                    s.sort_unstable();
                    s.dedup();
                    s
                }),
                _ => Decision::LeF64(EDGES[rng.random_range(0..EDGES.len())]),
            };
            let missing = [Missing::None, Missing::Zero, Missing::Nan][rng.random_range(0..3)];
            let feature = rng.random_range(0..n_features);
            let default_left = rng.random_bool(0.5);
            let left = grow(rng, nodes, n_features, depth - 1);
            let right = grow(rng, nodes, n_features, depth - 1);
            nodes[at as usize] = Node::Split(Split {
                feature,
                decision,
                missing,
                default_left,
                left,
                right,
            });
            at
        }
        let mut nodes = Vec::new();
        grow(rng, &mut nodes, n_features, max_depth);
        // shuffle node order, keeping the root at 0
        let n = nodes.len();
        let mut order: Vec<usize> = (1..n).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let mut new_of = vec![0u32; n];
        for (new, old) in order.iter().enumerate() {
            new_of[*old] = new as u32 + 1;
        }
        let mut shuffled = vec![Node::Leaf(0.0); n];
        for (old, node) in nodes.into_iter().enumerate() {
            let node = match node {
                Node::Split(mut s) => {
                    s.left = new_of[s.left as usize];
                    s.right = new_of[s.right as usize];
                    Node::Split(s)
                }
                leaf => leaf,
            };
            shuffled[new_of[old] as usize] = node;
        }
        Tree { nodes: shuffled }
    }

    fn random_ranker(rng: &mut ChaCha8Rng) -> Ranker {
        let n_features = rng.random_range(1..6u32);
        let features = (0..n_features).map(|i| format!("f{i}")).collect();
        let mut inputs = Vec::new();
        for _ in 0..rng.random_range(0..5) {
            let feature = rng.random_range(0..n_features);
            inputs.push(match rng.random_range(0..5) {
                0 => Input::Linear {
                    feature,
                    slope: rng.random_range(-2.0..2.0),
                    intercept: 0.25,
                },
                1 => Input::LogLinear {
                    feature,
                    slope: 0.5,
                    intercept: rng.random_range(-1.0..1.0),
                },
                2 => Input::Bucket {
                    feature,
                    lower: EDGES[rng.random_range(0..7)],
                    upper: EDGES[rng.random_range(7..14)],
                },
                3 => Input::Tree(random_tree(rng, n_features, 6)),
                _ => Input::Dummy,
            });
        }
        let layers = if !inputs.is_empty() && rng.random_bool(0.5) {
            let hidden = rng.random_range(1..5);
            let mut w = |n: usize| {
                (0..n)
                    .map(|_| rng.random_range(-1.0f32..1.0))
                    .collect::<Vec<_>>()
            };
            vec![
                Layer {
                    inputs: inputs.len(),
                    outputs: hidden,
                    weights: w(inputs.len() * hidden),
                    bias: w(hidden),
                    activation: Activation::Tanh,
                },
                Layer {
                    inputs: hidden,
                    outputs: 1,
                    weights: w(hidden),
                    bias: w(1),
                    activation: Activation::Identity,
                },
            ]
        } else {
            vec![]
        };
        let ensemble = if inputs.is_empty() || rng.random_bool(0.5) {
            let trees = (0..rng.random_range(1..12))
                .map(|_| random_tree(rng, n_features, 10))
                .collect();
            Some(Ensemble {
                trees,
                base_score: rng.random_range(-1.0..1.0),
            })
        } else {
            None
        };
        let r = Ranker {
            features,
            inputs,
            layers,
            ensemble,
        };
        validate(&r).expect("random rankers are valid");
        r
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn plan_equals_reference_bitwise(seed in any::<u64>(), n_docs in 0usize..70) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let ranker = random_ranker(&mut rng);
            let nf = ranker.features.len();
            let rows: Vec<f64> = (0..n_docs * nf).map(|_| edge_value(&mut rng)).collect();
            let mut plan = CpuPlan::new(&ranker);
            // Small test rankers stay on one thread by their cost; force the parallel path.
            plan.doc_ns = PARALLEL_MIN_NS;
            let single = plan.score_batch(&rows, 1);
            let parallel = plan.score_batch(&rows, 2);
            for d in 0..n_docs {
                let want = score_doc_reference(&ranker, &rows[d * nf..(d + 1) * nf]);
                prop_assert_eq!(single[d].to_bits(), want.to_bits(), "doc {} of {}", d, n_docs);
                prop_assert_eq!(parallel[d].to_bits(), want.to_bits());
            }
        }

        #[test]
        fn flat_leaves_equal_reference_leaf_ids(seed in any::<u64>()) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let tree = random_tree(&mut rng, 3, 12);
            let mut forest = Forest::default();
            forest.push(&tree);
            let rows: Vec<f64> = (0..3 * BLOCK).map(|_| edge_value(&mut rng)).collect();
            let leaves = forest.leaves::<BLOCK>(0, &rows, 3);
            for d in 0..BLOCK {
                prop_assert_eq!(leaves[d], tree_leaf(&tree, &rows[d * 3..d * 3 + 3]));
            }
        }

        #[test]
        fn lt_f32_bound_matches_rounding(bits in any::<u32>(), x in any::<f64>(), k in -3i64..3) {
            let t = f32::from_bits(bits);
            prop_assume!(t.is_finite());
            let b = lt_f32_bound(t);
            let near = f64::from_bits((b.to_bits() as i64 + k) as u64);
            for x in [x, b, near, f64::from(t), f64::from_bits((f64::from(t).to_bits() as i64 + k) as u64)] {
                if !x.is_nan() {
                    prop_assert_eq!((x as f32) < t, x <= b, "t {} x {} b {}", t, x, b);
                }
            }
        }
    }

    #[test]
    fn lt_f32_bound_edges() {
        for t in [
            0.0f32,
            -0.0,
            f32::from_bits(1),
            -f32::from_bits(1),
            f32::MAX,
            -f32::MAX,
            f32::MIN_POSITIVE,
            0.1,
            -0.1,
            1.0,
        ] {
            let b = lt_f32_bound(t);
            assert!((b as f32) < t, "t {t}: bound {b} itself goes left");
            let next = if b >= 0.0 {
                f64::from_bits(b.to_bits() + 1)
            } else {
                f64::from_bits(b.to_bits() - 1)
            };
            assert!(
                (next as f32) >= t,
                "t {t}: the f64 after the bound goes right"
            );
        }
    }

    #[test]
    fn scores_do_not_depend_on_the_batch() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let ranker = random_ranker(&mut rng);
        let nf = ranker.features.len();
        let rows: Vec<f64> = (0..600 * nf).map(|_| edge_value(&mut rng)).collect();
        let mut plan = CpuPlan::new(&ranker);
        plan.doc_ns = PARALLEL_MIN_NS; // the parallel path, in tasks of one block
        let all = plan.score_batch(&rows, 0);
        let tail = plan.score_batch(&rows[17 * nf..], 3);
        assert_eq!(
            all[17..].iter().map(|s| s.to_bits()).collect::<Vec<_>>(),
            tail.iter().map(|s| s.to_bits()).collect::<Vec<_>>()
        );
    }
}
