//! Random rankers, trees and feature values for the CPU evaluators' property tests: every kind
//! of decision and missing rule, values on and around thresholds and the missing rules' edges.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::ZERO_THRESHOLD;
use crate::rank::format::validate;
use crate::rank::model::{
    Activation, Decision, Ensemble, Input, Layer, Missing, Node, Ranker, Split, Tree,
};

/// Values that sit on thresholds, on either side of them, and on the missing rules' edges.
pub(super) const EDGES: [f64; 14] = [
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

pub(super) fn edge_value(rng: &mut ChaCha8Rng) -> f64 {
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
/// missing rule, thresholds from [`EDGES`], node order shuffled (root stays 0). One tree in five
/// is bushy (most nodes split), so that trees of more than 64 leaves come up; one in ten or so
/// is a single leaf.
pub(super) fn random_tree(rng: &mut ChaCha8Rng, n_features: u32, max_depth: u32) -> Tree {
    let leaf_p = if rng.random_bool(0.2) { 0.05 } else { 0.3 };
    grow_tree(rng, n_features, max_depth, leaf_p)
}

/// A random valid tree whose nodes are leaves with probability `leaf_p` (and at `max_depth`).
pub(super) fn grow_tree(
    rng: &mut ChaCha8Rng,
    n_features: u32,
    max_depth: u32,
    leaf_p: f64,
) -> Tree {
    fn grow(
        rng: &mut ChaCha8Rng,
        nodes: &mut Vec<Node>,
        n_features: u32,
        depth: u32,
        leaf_p: f64,
    ) -> u32 {
        let at = nodes.len() as u32;
        if depth == 0 || rng.random_bool(leaf_p) {
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
        let left = grow(rng, nodes, n_features, depth - 1, leaf_p);
        let right = grow(rng, nodes, n_features, depth - 1, leaf_p);
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
    grow(rng, &mut nodes, n_features, max_depth, leaf_p);
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

pub(super) fn random_ranker(rng: &mut ChaCha8Rng) -> Ranker {
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
