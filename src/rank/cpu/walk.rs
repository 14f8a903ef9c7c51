//! The block walk: trees flattened into one node array per forest, walked for a block of
//! documents at a time.
//!
//! Nodes are 24 bytes, in the trees' own node order so that a flat index minus the tree's root
//! is the reference's leaf id. Every numeric decision becomes one f64 comparison `x <= bound`: an
//! `lt_f32` threshold `t` is replaced by the largest f64 `b` with `f32(x) < t ⇔ x <= b`
//! ([`lt_f32_bound`]). Missing-value rules become three flag bits combined without branches. A
//! leaf points to itself on both sides and keeps its value in the threshold slot, so a tree is
//! walked for a block of documents at once, at most the tree's depth steps, with no
//! per-document branch on "is this a leaf" (the block stops when every document stands on a
//! leaf): the documents' walks are independent, which keeps several loads in flight (the
//! blocked traversal of Asadi et al.). Categorical splits take a slower branch, only in trees
//! that have one. The flattened nodes are also what [`super::quick`] builds its bitvectors from.

use super::{category, ZERO_THRESHOLD};
use crate::rank::model::{Decision, Missing, Node, Tree};

pub(super) const NAN_LEFT: u32 = 1;
pub(super) const ZERO_MISSING: u32 = 2;
pub(super) const DEFAULT_LEFT: u32 = 4;
pub(super) const CATEGORICAL: u32 = 8;
pub(super) const LEAF: u32 = 16;

/// A flattened node. Numeric split: left when `x <= threshold`. Categorical split: `threshold`
/// holds the index of its set in [`Forest::sets`]. Leaf: `threshold` is the leaf value and both
/// children are the leaf itself.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(super) struct FlatNode {
    pub(super) threshold: f64,
    pub(super) feature: u32,
    pub(super) flags: u32,
    /// `[left, right]`, absolute indices into [`Forest::nodes`].
    pub(super) children: [u32; 2],
}

/// Trees flattened into one node array.
#[derive(Debug, Clone, Default)]
pub(super) struct Forest {
    pub(super) nodes: Vec<FlatNode>,
    pub(super) roots: Vec<u32>,
    /// Per tree: the longest root-to-leaf path, in edges.
    depths: Vec<u32>,
    /// Per tree: whether it has a categorical split.
    categorical: Vec<bool>,
    /// Category sets of categorical splits, sorted.
    sets: Vec<Vec<u32>>,
}

impl Forest {
    pub(super) fn push(&mut self, tree: &Tree) {
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
    pub(super) fn leaves<const N: usize>(
        &self,
        t: usize,
        rows: &[f64],
        n_features: usize,
    ) -> [u32; N] {
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
    pub(super) fn categorical_left(&self, node: &FlatNode, x: f64) -> bool {
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

#[cfg(test)]
mod tests {
    use super::super::testgen::{edge_value, random_tree};
    use super::super::tree_leaf;
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    const N: usize = 8;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn flat_leaves_equal_reference_leaf_ids(seed in any::<u64>()) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let tree = random_tree(&mut rng, 3, 12);
            let mut forest = Forest::default();
            forest.push(&tree);
            let rows: Vec<f64> = (0..3 * N).map(|_| edge_value(&mut rng)).collect();
            let leaves = forest.leaves::<N>(0, &rows, 3);
            for d in 0..N {
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
}
