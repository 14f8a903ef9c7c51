//! The fast CPU path: a ranker compiled once into a [`CpuPlan`], then scored a block of
//! documents at a time.
//!
//! The ensemble's trees and, separately, the trees of tree inputs are compiled into a
//! [`Trees`]: QuickScorer ([`super::quick`]) for every tree of at most 64 leaves, the block walk
//! ([`super::walk`]) for larger ones (or for all, with [`TreeEvaluator::Walk`]). A block of
//! [`BLOCK`] documents is scored together: inputs, layers, then the ensemble, each tree's values
//! added in tree order.
//!
//! Every document's score is computed by the same sequence of f32/f64 operations as
//! [`super::score_doc_reference`], so scores are bit-identical to the reference for any batch
//! size and thread count (the tests check it on random trees and edge values).

use rayon::prelude::*;

use super::quick::QuickBlock;
use super::transform_arg;
use super::trees::{TreeEvaluator, Trees};
use crate::rank::freeform;
use crate::rank::model::{Activation, Expr, Input, Layer, Ranker};

/// Documents scored together: QuickScorer's SIMD lanes; for the walk, several independent walks
/// that keep node loads in flight (8 measured fastest for the walk: development machine, 10 000
/// rows of the LightGBM peer model, one thread: 8 → 357–385 ms, 16 → 461–581, 32 → 536–750,
/// 4 → 553–620).
pub const BLOCK: usize = super::quick::LANES;
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
    input_trees: Trees,
    layers: Vec<Layer>,
    ensemble: Option<(Trees, f64)>,
    /// Rough cost of scoring one document, in nanoseconds: about 4 per input, 1 per layer
    /// weight and 30 per tree, as measured on the bundled rankers (docs/benchmarks-history.md).
    doc_ns: usize,
}

/// Per-task buffers: model inputs and layer outputs of one block, `[width][BLOCK]`; the
/// QuickScorer scan of the block's input trees, then of its ensemble; the remainder's rows.
#[derive(Default)]
struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
    quick: QuickBlock,
    rows: Vec<f64>,
}

impl CpuPlan {
    /// Compiles a validated ranker, its trees for [`TreeEvaluator::detect`].
    pub fn new(ranker: &Ranker) -> Self {
        CpuPlan::with_trees(ranker, TreeEvaluator::detect())
    }

    /// Compiles a validated ranker, its trees for `evaluator`.
    pub fn with_trees(ranker: &Ranker, evaluator: TreeEvaluator) -> Self {
        let mut input_trees = Vec::new();
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
                    PlanInput::Tree(input_trees.len() - 1)
                }
                Input::Dummy => PlanInput::Dummy,
            })
            .collect();
        let input_trees = Trees::new(input_trees, evaluator);
        let ensemble = ranker
            .ensemble
            .as_ref()
            .map(|e| (Trees::new(&e.trees, evaluator), e.base_score));
        let trees = input_trees.len() + ensemble.as_ref().map_or(0, |(f, _)| f.len());
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

    /// Scores the documents of `rows` into `out`, [`BLOCK`] at a time; a last partial block
    /// as a whole block whose missing rows repeat its last one, a single document alone.
    fn score_into(&self, rows: &[f64], out: &mut [f64]) {
        let nf = self.n_features;
        let mut scratch = Scratch::default();
        let full = out.len() / BLOCK * BLOCK;
        for (b, out) in out[..full].chunks_exact_mut(BLOCK).enumerate() {
            self.score_block::<BLOCK>(&rows[b * BLOCK * nf..], out, &mut scratch);
        }
        match out.len() - full {
            0 => {}
            1 => self.score_block::<1>(&rows[full * nf..], &mut out[full..], &mut scratch),
            rest => {
                let mut padded = std::mem::take(&mut scratch.rows);
                padded.clear();
                padded.extend_from_slice(&rows[full * nf..]);
                while padded.len() < BLOCK * nf {
                    padded.extend_from_within((rest - 1) * nf..rest * nf);
                }
                let mut block_out = [0.0; BLOCK];
                self.score_block::<BLOCK>(&padded, &mut block_out, &mut scratch);
                out[full..].copy_from_slice(&block_out[..rest]);
                scratch.rows = padded;
            }
        }
    }

    /// Scores `N` documents (the first `N` rows of `rows`).
    fn score_block<const N: usize>(&self, rows: &[f64], out: &mut [f64], scratch: &mut Scratch) {
        let nf = self.n_features;
        let mut model = [0.0f64; N];
        if !self.inputs.is_empty() {
            let sum_inputs = self.layers.is_empty();
            self.input_trees.scan::<N>(rows, nf, &mut scratch.quick);
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
                        values = self.input_trees.values::<N>(*t, rows, nf, &scratch.quick);
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
            Some((trees, base_score)) => {
                trees.scan::<N>(rows, nf, &mut scratch.quick);
                let mut sum = [*base_score; N];
                for t in 0..trees.len() {
                    let values = trees.values::<N>(t, rows, nf, &scratch.quick);
                    for (s, v) in sum.iter_mut().zip(values) {
                        *s += v;
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
    use super::super::quick::Isa;
    use super::super::score_doc_reference;
    use super::super::testgen::{edge_value, random_ranker};
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn plan_equals_reference_bitwise(seed in any::<u64>(), n_docs in 0usize..70) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let ranker = random_ranker(&mut rng);
            let nf = ranker.features.len();
            let rows: Vec<f64> = (0..n_docs * nf).map(|_| edge_value(&mut rng)).collect();
            let evaluators = Isa::available().into_iter().map(TreeEvaluator::Quick);
            for evaluator in evaluators.chain([TreeEvaluator::Walk]) {
                let mut plan = CpuPlan::with_trees(&ranker, evaluator);
                // Small test rankers stay on one thread by their cost; force the parallel path.
                plan.doc_ns = PARALLEL_MIN_NS;
                let single = plan.score_batch(&rows, 1);
                let parallel = plan.score_batch(&rows, 2);
                for d in 0..n_docs {
                    let want = score_doc_reference(&ranker, &rows[d * nf..(d + 1) * nf]);
                    prop_assert_eq!(single[d].to_bits(), want.to_bits(), "{:?} doc {} of {}", evaluator, d, n_docs);
                    prop_assert_eq!(parallel[d].to_bits(), want.to_bits());
                }
            }
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
