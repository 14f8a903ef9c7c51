//! Deterministic synthetic rankers and feature vectors, for the production-like rankers in
//! `rankers/` (DESIGN §6), benchmarks at other sizes, and tests.
//!
//! A ranker is drawn from a ChaCha8 stream seeded by `seed`, so the same spec and seed give the
//! same file on every machine. Its feature map is the FE catalogue
//! ([`crate::rank::fe::feature_names`]) plus two static features. Trees are grown leaf-wise as
//! LightGBM grows them: the leaf that holds the most (simulated) documents is split next, more
//! or less, which gives unbalanced trees; depth is capped at [`MAX_DEPTH`], leaf counts are
//! 30–64, and thresholds are drawn inside the interval that the path to the leaf leaves open
//! for the feature, from the feature's plausible range ([`feature_range`]). Numbers are rounded
//! to 4 significant digits so that the files stay small.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::rank::format::validate;
use crate::rank::model::{
    Activation, Decision, Ensemble, Expr, FeatureIdx, Input, Layer, Missing, Node, Ranker, Split,
    Tree,
};

/// Deepest leaf of a synthetic tree, in edges from the root.
pub const MAX_DEPTH: u32 = 12;
/// Static features appended to the catalogue in a synthetic ranker's feature map.
pub const STATIC_FEATURES: [&str; 2] = ["static.static_rank", "static.page_quality"];

/// What to synthesize: counts of each input type, NN layer widths, ensemble trees.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SynthSpec {
    pub bucket: usize,
    pub linear: usize,
    pub loglinear: usize,
    pub freeform: usize,
    /// Tree inputs (each a model input feeding the layers).
    pub tree: usize,
    /// Output width of each layer, first to last (the last is 1); empty: no layers.
    pub layers: Vec<usize>,
    /// Trees of the ensemble (0: no ensemble).
    pub ensemble: usize,
}

/// Why a synth spec was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SynthSpecError {
    #[error("--inputs: expected KIND=COUNT (KIND one of bucket, linear, loglinear, freeform, tree, ensemble), got {0:?}")]
    BadInput(String),
    #[error(
        "--layers: expected comma-separated widths ending in 1 (e.g. 64,1) or \"none\", got {0:?}"
    )]
    BadLayers(String),
    #[error("nothing to synthesize: the inputs and the ensemble are both empty")]
    Empty,
    #[error("layers need inputs to read: --layers {0:?} with no inputs")]
    LayersWithoutInputs(String),
}

impl SynthSpec {
    /// The preset rankers of DESIGN §6: `small`, `medium`, `large`.
    pub fn preset(name: &str) -> Option<SynthSpec> {
        Some(match name {
            "small" => SynthSpec {
                bucket: 54,
                linear: 2,
                loglinear: 69,
                layers: vec![1],
                ..Default::default()
            },
            "medium" => SynthSpec {
                bucket: 10,
                loglinear: 5,
                tree: 500,
                layers: vec![1],
                ..Default::default()
            },
            "large" => SynthSpec {
                tree: 1250,
                layers: vec![64, 1],
                ..Default::default()
            },
            _ => return None,
        })
    }

    /// Parses `--inputs bucket=54,linear=2,loglinear=69,tree=500,ensemble=0` and
    /// `--layers 64,1` (or `none`).
    ///
    /// # Errors
    /// A [`SynthSpecError`] quoting the part that does not parse.
    pub fn parse(inputs: &str, layers: &str) -> Result<SynthSpec, SynthSpecError> {
        let mut spec = SynthSpec::default();
        for part in inputs.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || SynthSpecError::BadInput(part.to_string());
            let (kind, count) = part.split_once('=').ok_or_else(bad)?;
            let count: usize = count.trim().parse().map_err(|_| bad())?;
            let slot = match kind.trim() {
                "bucket" => &mut spec.bucket,
                "linear" => &mut spec.linear,
                "loglinear" => &mut spec.loglinear,
                "freeform" => &mut spec.freeform,
                "tree" => &mut spec.tree,
                "ensemble" => &mut spec.ensemble,
                _ => return Err(bad()),
            };
            *slot = count;
        }
        let layers = layers.trim();
        if !(layers.is_empty() || layers == "none") {
            spec.layers = layers
                .split(',')
                .map(|w| w.trim().parse::<usize>().ok().filter(|w| *w > 0))
                .collect::<Option<Vec<_>>>()
                .filter(|ws| ws.last() == Some(&1))
                .ok_or_else(|| SynthSpecError::BadLayers(layers.to_string()))?;
        }
        let n_inputs = spec.n_inputs();
        if n_inputs == 0 && spec.ensemble == 0 {
            return Err(SynthSpecError::Empty);
        }
        if n_inputs == 0 && !spec.layers.is_empty() {
            return Err(SynthSpecError::LayersWithoutInputs(layers.to_string()));
        }
        Ok(spec)
    }

    /// Number of model inputs.
    pub fn n_inputs(&self) -> usize {
        self.bucket + self.linear + self.loglinear + self.freeform + self.tree
    }
}

/// A plausible range `[lo, hi]` of a feature's values and whether they are integers, from its
/// catalogue name (`docs/features.md`); names it does not know get `[0, 10]`.
pub fn feature_range(name: &str) -> (f64, f64, bool) {
    let stream_len = match name.split('.').next() {
        Some("title") => 12.0,
        Some("body") => 600.0,
        Some("anchor") => 60.0,
        Some("url") => 10.0,
        Some("doc") => 700.0,
        _ => 10.0,
    };
    let suffix = name.split_once('.').map_or(name, |(_, s)| s);
    if name.starts_with("static.")
        || suffix.ends_with("norm")
        || suffix.ends_with("fraction")
        || suffix.ends_with("density")
    {
        (0.0, 1.0, false)
    } else if suffix == "length" {
        (1.0, 2.0 * stream_len, true)
    } else if suffix.starts_with("first_occurrence")
        || suffix.starts_with("last_occurrence")
        || suffix.starts_with("window")
    {
        (0.0, stream_len + 1.0, true)
    } else if suffix.starts_with("occurrences.mean") {
        (0.0, 8.0, false)
    } else if suffix.starts_with("occurrences") || suffix == "phrases.matched" {
        (0.0, (stream_len / 20.0).max(4.0), true)
    } else if suffix.starts_with("distinct_terms")
        || suffix == "phrases.max_distinct"
        || suffix == "query_terms"
        || suffix.starts_with("in_order")
    {
        (0.0, 6.0, true)
    } else if suffix == "streams.matched" {
        (0.0, 4.0, true)
    } else if suffix.starts_with("bm25") || suffix.starts_with("matched_idf") {
        (0.0, 30.0, false)
    } else {
        (0.0, 10.0, false)
    }
}

/// Rounds to `digits` significant decimal digits (so the shortest printed form is short).
fn round_sig(x: f64, digits: usize) -> f64 {
    format!("{:.*e}", digits - 1, x).parse().unwrap_or(x)
}

/// The feature map of synthetic rankers: the FE catalogue, then [`STATIC_FEATURES`].
pub fn synth_feature_names() -> Vec<String> {
    let mut names = crate::rank::fe::feature_names().to_vec();
    names.extend(STATIC_FEATURES.iter().map(|s| s.to_string()));
    names
}

/// Synthesizes a ranker (valid: it passes [`validate`]).
///
/// # Panics
/// When `spec` has layers without inputs or nothing at all (as [`SynthSpec::parse`] rejects).
pub fn synth(spec: &SynthSpec, seed: u64) -> Ranker {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let features = synth_feature_names();
    let ranges: Vec<_> = features.iter().map(|f| feature_range(f)).collect();
    // Feature popularity: a random order, weights falling off with rank (a few features carry
    // most splits, as in trained models).
    let mut order: Vec<FeatureIdx> = (0..features.len() as FeatureIdx).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    let weights: Vec<f64> = (0..order.len())
        .map(|r| 1.0 / (r as f64 + 2.0).powf(0.8))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut pick_feature = |rng: &mut ChaCha8Rng| {
        let mut u = rng.random_range(0.0..total);
        for (r, w) in weights.iter().enumerate() {
            if u < *w {
                return order[r];
            }
            u -= w;
        }
        order[order.len() - 1]
    };

    let mut inputs = Vec::with_capacity(spec.n_inputs());
    // Buckets: runs of 3 adjacent intervals over one feature's range.
    let mut f_cursor = 0usize;
    let mut next_feature = |step: usize| {
        let f = order[f_cursor % order.len()];
        f_cursor += step;
        f
    };
    let mut b = 0;
    while b < spec.bucket {
        let f = next_feature(1);
        let (lo, hi, integer) = ranges[f as usize];
        let mut cuts: Vec<f64> = (0..4)
            .map(|_| {
                let v = rng.random_range(lo..=hi);
                if integer {
                    v.round()
                } else {
                    round_sig(v, 3)
                }
            })
            .collect();
        cuts.sort_by(f64::total_cmp);
        cuts.dedup();
        for w in cuts.windows(2) {
            if b < spec.bucket {
                inputs.push(Input::Bucket {
                    feature: f,
                    lower: w[0],
                    upper: w[1],
                });
                b += 1;
            }
        }
    }
    let coef =
        |rng: &mut ChaCha8Rng, scale: f64| round_sig(rng.random_range(-scale..scale), 3) as f32;
    for _ in 0..spec.linear {
        let f = next_feature(1);
        let span = ranges[f as usize].1 - ranges[f as usize].0;
        inputs.push(Input::Linear {
            feature: f,
            slope: coef(&mut rng, 1.0 / span),
            intercept: coef(&mut rng, 0.5),
        });
    }
    for _ in 0..spec.loglinear {
        let f = next_feature(1);
        inputs.push(Input::LogLinear {
            feature: f,
            slope: coef(&mut rng, 1.0),
            intercept: coef(&mut rng, 0.5),
        });
    }
    for _ in 0..spec.freeform {
        let (a, b) = (next_feature(1), next_feature(1));
        let source = format!(
            "ln({} + 1) * max({}, 0.5)",
            features[a as usize], features[b as usize]
        );
        let expr =
            crate::rank::freeform::parse(&source, &features).expect("synthetic expressions parse");
        debug_assert!(matches!(expr, Expr::Binary(..)));
        inputs.push(Input::FreeForm(crate::rank::model::FreeForm {
            source,
            expr,
        }));
    }
    for _ in 0..spec.tree {
        inputs.push(Input::Tree(synth_tree(
            &mut rng,
            &ranges,
            &mut pick_feature,
            1.0,
        )));
    }

    let mut layers = Vec::with_capacity(spec.layers.len());
    let mut width = inputs.len();
    for (l, &outputs) in spec.layers.iter().enumerate() {
        let scale = 1.0 / (width as f64).sqrt();
        let weights = (0..width * outputs)
            .map(|_| coef(&mut rng, 2.0 * scale))
            .collect();
        let bias = (0..outputs).map(|_| coef(&mut rng, 0.1)).collect();
        let last = l + 1 == spec.layers.len();
        let activation = if last {
            Activation::Identity
        } else {
            Activation::Tanh
        };
        layers.push(Layer {
            inputs: width,
            outputs,
            weights,
            bias,
            activation,
        });
        width = outputs;
    }
    let ensemble = (spec.ensemble > 0).then(|| Ensemble {
        trees: (0..spec.ensemble)
            .map(|_| synth_tree(&mut rng, &ranges, &mut pick_feature, 0.05))
            .collect(),
        base_score: 0.0,
    });
    let ranker = Ranker {
        features,
        inputs,
        layers,
        ensemble,
    };
    debug_assert_eq!(validate(&ranker), Ok(()));
    ranker
}

/// A leaf being grown: its index in the node array, depth, simulated share of the documents, and
/// the open interval each feature still has on its path.
struct Growing {
    node: u32,
    depth: u32,
    mass: f64,
    bounds: Vec<(f64, f64)>,
}

fn synth_tree(
    rng: &mut ChaCha8Rng,
    ranges: &[(f64, f64, bool)],
    pick_feature: &mut impl FnMut(&mut ChaCha8Rng) -> FeatureIdx,
    leaf_scale: f64,
) -> Tree {
    let n_leaves = if rng.random_bool(0.8) {
        rng.random_range(30..=64)
    } else {
        rng.random_range(8..30)
    };
    let mut nodes = vec![Node::Leaf(0.0)];
    let mut open = vec![Growing {
        node: 0,
        depth: 0,
        mass: 1.0,
        bounds: ranges.iter().map(|r| (r.0, r.1)).collect(),
    }];
    let mut leaves_done: Vec<u32> = Vec::new();
    while open.len() + leaves_done.len() < n_leaves && !open.is_empty() {
        // the next leaf to split: chosen in proportion to its share of the documents
        let total: f64 = open.iter().map(|g| g.mass).sum();
        let mut u = rng.random_range(0.0..total);
        let mut k = open.len() - 1;
        for (i, g) in open.iter().enumerate() {
            if u < g.mass {
                k = i;
                break;
            }
            u -= g.mass;
        }
        let leaf = open.swap_remove(k);
        // a feature whose open interval still has room for a threshold
        let mut choice = None;
        for _ in 0..8 {
            let f = pick_feature(rng);
            let (lo, hi) = leaf.bounds[f as usize];
            let integer = ranges[f as usize].2;
            if (integer && hi - lo >= 1.0)
                || (!integer && hi - lo > 1e-3 * (ranges[f as usize].1 - ranges[f as usize].0))
            {
                choice = Some((f, lo, hi, integer));
                break;
            }
        }
        let Some((f, lo, hi, integer)) = choice else {
            leaves_done.push(leaf.node);
            continue;
        };
        let threshold = if integer {
            // LightGBM puts integer thresholds between two values
            (rng.random_range(lo..hi)).floor() + 0.5
        } else {
            round_sig(rng.random_range(lo..hi), 4).clamp(lo, hi)
        };
        let p = rng.random_range(0.15..0.85);
        let left = nodes.len() as u32;
        let missing = if rng.random_bool(0.2) {
            Missing::Nan
        } else {
            Missing::None
        };
        nodes[leaf.node as usize] = Node::Split(Split {
            feature: f,
            decision: Decision::LeF64(threshold),
            missing,
            default_left: missing == Missing::Nan && rng.random_bool(0.5),
            left,
            right: left + 1,
        });
        nodes.push(Node::Leaf(0.0));
        nodes.push(Node::Leaf(0.0));
        for (child, share, bound) in [
            (left, p, (lo, threshold)),
            (left + 1, 1.0 - p, (threshold, hi)),
        ] {
            let mut bounds = leaf.bounds.clone();
            bounds[f as usize] = bound;
            let grown = Growing {
                node: child,
                depth: leaf.depth + 1,
                mass: leaf.mass * share,
                bounds,
            };
            if grown.depth >= MAX_DEPTH {
                leaves_done.push(child);
            } else {
                open.push(grown);
            }
        }
    }
    for node in open.iter().map(|g| g.node).chain(leaves_done) {
        let v = rng.random_range(-1.0..1.0f64);
        nodes[node as usize] = Node::Leaf(round_sig(v * v * v.signum() * leaf_scale, 4));
    }
    Tree { nodes }
}

/// `n` documents' feature rows (row-major) for `ranker`: each value drawn from the feature's
/// plausible range (from the thresholds and bucket bounds the ranker uses on it, else
/// [`feature_range`]), with about 3 % missing (NaN) and 10 % exactly on one of the ranker's
/// thresholds or bounds for that feature, so that tests and benchmarks exercise both.
pub fn synth_features(ranker: &Ranker, n: usize, seed: u64) -> Vec<f64> {
    let nf = ranker.features.len();
    let mut cuts: Vec<Vec<f64>> = vec![Vec::new(); nf];
    let add_tree = |tree: &Tree, cuts: &mut Vec<Vec<f64>>| {
        for node in &tree.nodes {
            if let Node::Split(s) = node {
                let t = match &s.decision {
                    Decision::LeF64(t) => *t,
                    Decision::LtF32(t) => f64::from(*t),
                    Decision::In(set) => f64::from(set[0]),
                };
                cuts[s.feature as usize].push(t);
            }
        }
    };
    for input in &ranker.inputs {
        match input {
            Input::Bucket {
                feature,
                lower,
                upper,
            } => cuts[*feature as usize].extend([*lower, *upper]),
            Input::Tree(tree) => add_tree(tree, &mut cuts),
            _ => {}
        }
    }
    if let Some(e) = &ranker.ensemble {
        e.trees.iter().for_each(|t| add_tree(t, &mut cuts));
    }
    let ranges: Vec<(f64, f64, bool)> = ranker
        .features
        .iter()
        .zip(&cuts)
        .map(|(name, cuts)| {
            let (lo, hi, integer) = feature_range(name);
            match (
                cuts.iter().copied().reduce(f64::min),
                cuts.iter().copied().reduce(f64::max),
            ) {
                (Some(a), Some(b)) => {
                    let margin = 0.25 * (b - a).max(1.0);
                    let integer = integer && cuts.iter().all(|c| (c * 2.0).fract() == 0.0);
                    (
                        a.min(lo) - if a < lo { margin } else { 0.0 },
                        b.max(hi) + margin,
                        integer,
                    )
                }
                _ => (lo, hi, integer),
            }
        })
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rows = Vec::with_capacity(n * nf);
    for _ in 0..n {
        for f in 0..nf {
            let u: f64 = rng.random();
            let (lo, hi, integer) = ranges[f];
            rows.push(if u < 0.03 {
                f64::NAN
            } else if u < 0.13 && !cuts[f].is_empty() {
                cuts[f][rng.random_range(0..cuts[f].len())]
            } else if integer {
                rng.random_range(lo..=hi).round()
            } else {
                round_sig(rng.random_range(lo..=hi), 6)
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_and_leaves(tree: &Tree) -> (u32, usize) {
        let mut stack = vec![(0u32, 0u32)];
        let (mut depth, mut leaves) = (0, 0);
        while let Some((i, d)) = stack.pop() {
            match &tree.nodes[i as usize] {
                Node::Leaf(_) => {
                    depth = depth.max(d);
                    leaves += 1;
                }
                Node::Split(s) => stack.extend([(s.left, d + 1), (s.right, d + 1)]),
            }
        }
        (depth, leaves)
    }

    #[test]
    fn presets_have_the_design_shapes() {
        let small = synth(&SynthSpec::preset("small").unwrap(), 1);
        assert_eq!(small.inputs.len(), 125);
        assert_eq!(
            small
                .inputs
                .iter()
                .filter(|i| matches!(i, Input::Bucket { .. }))
                .count(),
            54
        );
        assert_eq!(
            small
                .inputs
                .iter()
                .filter(|i| matches!(i, Input::Linear { .. }))
                .count(),
            2
        );
        assert_eq!(
            small
                .inputs
                .iter()
                .filter(|i| matches!(i, Input::LogLinear { .. }))
                .count(),
            69
        );
        assert_eq!(small.layers.len(), 1);
        let large = synth(&SynthSpec::preset("large").unwrap(), 3);
        assert_eq!(large.inputs.len(), 1250);
        assert_eq!(
            (
                large.layers[0].inputs,
                large.layers[0].outputs,
                large.layers[1].outputs
            ),
            (1250, 64, 1)
        );
        assert_eq!(validate(&small), Ok(()));
        assert_eq!(validate(&large), Ok(()));
    }

    #[test]
    fn trees_are_realistic() {
        let medium = synth(&SynthSpec::preset("medium").unwrap(), 2);
        assert_eq!(validate(&medium), Ok(()));
        let shapes: Vec<(u32, usize)> = medium
            .inputs
            .iter()
            .filter_map(|i| {
                if let Input::Tree(t) = i {
                    Some(depth_and_leaves(t))
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(shapes.len(), 500);
        assert!(shapes
            .iter()
            .all(|(d, l)| *d <= MAX_DEPTH && *l >= 2 && *l <= 64));
        let mean_leaves = shapes.iter().map(|s| s.1).sum::<usize>() as f64 / 500.0;
        assert!(
            (30.0..=55.0).contains(&mean_leaves),
            "mean leaves {mean_leaves}"
        );
        // unbalanced: deep trees for their leaf count (a balanced 32-leaf tree has depth 5)
        let mean_depth = shapes.iter().map(|s| s.0 as f64).sum::<f64>() / 500.0;
        assert!(mean_depth > 7.0, "mean depth {mean_depth}");
    }

    #[test]
    fn deterministic_per_seed() {
        let spec =
            SynthSpec::parse("bucket=3,loglinear=2,freeform=1,tree=4,ensemble=3", "4,1").unwrap();
        assert_eq!(synth(&spec, 9), synth(&spec, 9));
        assert_ne!(synth(&spec, 9), synth(&spec, 10));
        let r = synth(&spec, 9);
        assert_eq!(synth_features(&r, 5, 1).len(), 5 * r.features.len());
        assert_eq!(
            synth_features(&r, 5, 1)
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            synth_features(&r, 5, 1)
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn spec_parsing() {
        assert_eq!(
            SynthSpec::parse("bucket=54, linear=2,loglinear=69", "1").unwrap(),
            SynthSpec::preset("small").unwrap()
        );
        assert_eq!(
            SynthSpec::parse("ensemble=100", "none").unwrap().ensemble,
            100
        );
        assert_eq!(
            SynthSpec::parse("trees=5", ""),
            Err(SynthSpecError::BadInput("trees=5".into()))
        );
        assert_eq!(
            SynthSpec::parse("tree=x", ""),
            Err(SynthSpecError::BadInput("tree=x".into()))
        );
        assert_eq!(
            SynthSpec::parse("tree=5", "64,2"),
            Err(SynthSpecError::BadLayers("64,2".into()))
        );
        assert_eq!(
            SynthSpec::parse("tree=5", "0,1"),
            Err(SynthSpecError::BadLayers("0,1".into()))
        );
        assert_eq!(SynthSpec::parse("", ""), Err(SynthSpecError::Empty));
        assert_eq!(
            SynthSpec::parse("ensemble=3", "1"),
            Err(SynthSpecError::LayersWithoutInputs("1".into()))
        );
    }

    #[test]
    fn features_hit_thresholds_and_nan() {
        let spec = SynthSpec::parse("tree=1", "1").unwrap();
        let r = synth(&spec, 2);
        let rows = synth_features(&r, 1000, 5);
        assert!(rows.iter().any(|v| v.is_nan()));
        let Input::Tree(t) = &r.inputs[0] else {
            panic!()
        };
        let Node::Split(s) = &t.nodes[0] else {
            panic!()
        };
        let Decision::LeF64(th) = s.decision else {
            panic!()
        };
        let nf = r.features.len();
        assert!(
            (0..1000).any(|d| rows[d * nf + s.feature as usize] == th),
            "some row sits on the root threshold"
        );
    }
}
