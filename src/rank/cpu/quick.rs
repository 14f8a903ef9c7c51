//! QuickScorer: the trees of a forest scored for a block of documents by scanning every split
//! of a feature in threshold order, across all trees at once (Lucchese et al., SIGIR 2015), with
//! the block's documents in SIMD lanes (vQS, Lucchese et al. 2016; RapidScorer, KDD 2018).
//!
//! Each tree keeps, per document, a bitvector of the leaves still reachable, leaves numbered
//! left to right, in one `u64` word per 64 leaves (a word a "slot"). A split that sends the
//! document right makes the leaves of its left subtree unreachable: their bits are cleared (a
//! split whose left leaves span several words is one cut per word). Once every split has cleared
//! its bits, the exit leaf is the lowest set bit (the leftmost leaf whose path no split left).
//! The splits of a feature are sorted by threshold, so the splits a document goes right at
//! are a prefix of the list: the scan of a feature stops at the first split that no document of
//! the block goes right at. No split is visited by a document that goes left there, and no
//! node is loaded in a dependent chain: the work is streaming compares and masked ANDs.
//!
//! Exactness: the splits are the walk's flattened nodes ([`super::walk`]): `x <= bound` with the
//! same f64 bounds. Missing values: every node sends a NaN one fixed way (left: `x > bound` is
//! false for a NaN; right: `!(x <= bound)` is true for it), so a feature's splits are kept in
//! separate runs by that way; `missing: zero` splits read the value with `|x| <= ZERO_THRESHOLD`
//! replaced by NaN, which then goes their default way. Categorical splits are decided per
//! document, by the walk's own rule, after the scan. The leaf reached is therefore the walk's,
//! and the leaf value is the same f64.

use super::walk::{FlatNode, Forest, CATEGORICAL, LEAF, NAN_LEFT, ZERO_MISSING};
use super::ZERO_THRESHOLD;

/// Documents scored together, one per SIMD lane (8 f64: one AVX-512 register, two AVX2 ones).
pub(super) const LANES: usize = 8;
/// Bitvector words (64 bytes each, all lanes) whose trees' splits are scanned together: they
/// stay in the L1 cache while every feature of the chunk is scanned.
const CHUNK_SLOTS: usize = 256;

/// The instruction set the scan runs on, chosen at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, one lane after the other (what the compiler makes of it).
    Portable,
    /// Two 4-lane AVX2 registers per block.
    Avx2,
    /// One 8-lane AVX-512 register per block, masked ANDs.
    Avx512,
}

impl Isa {
    /// The best this CPU runs.
    pub fn detect() -> Isa {
        *Isa::available().last().unwrap_or(&Isa::Portable)
    }

    /// Every instruction set this CPU runs, from the portable one up.
    pub fn available() -> Vec<Isa> {
        let mut isas = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                isas.push(Isa::Avx2);
            }
            if is_x86_feature_detected!("avx512f") {
                isas.push(Isa::Avx512);
            }
        }
        isas
    }
}

/// A numeric split in a scan (or the part of one in one word): a document with
/// `x > threshold` (or NaN, in a NaN-right run) goes right, and the leaves of the split's left
/// subtree (`left`, in word `slot`) become unreachable.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(super) struct Cut {
    pub(super) threshold: f64,
    pub(super) left: u64,
    pub(super) slot: u32,
}

/// The splits of one feature, one NaN way and one value reading, in ascending threshold order.
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub(super) feature: u32,
    /// `missing: zero` splits: read the value with zeros (within [`ZERO_THRESHOLD`]) as NaN.
    pub(super) zeroed: bool,
    /// A NaN goes right at these splits.
    pub(super) nan_right: bool,
    pub(super) cuts: std::ops::Range<u32>,
}

/// A categorical split (or its part in one word), decided per document after the scan.
#[derive(Debug, Clone, Copy)]
struct Fallback {
    node: FlatNode,
    slot: u32,
    left: u64,
}

/// One block's reachable-leaf bitvector word of one tree, a lane per document.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Bits(pub(super) [u64; LANES]);

/// One feature's values in a block, a lane per document.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(64))]
pub(super) struct Values(pub(super) [f64; LANES]);

/// Per-block buffers of the scan.
#[derive(Debug, Default)]
pub(super) struct QuickBlock {
    bits: Vec<Bits>,
    values: Vec<Values>,
    zeroed: Vec<Values>,
}

/// Trees compiled for the scan.
#[derive(Debug, Clone)]
pub(super) struct QuickForest {
    isa: Isa,
    cuts: Vec<Cut>,
    runs: Vec<Run>,
    /// Per chunk of about [`CHUNK_SLOTS`] words, its runs:
    /// `runs[chunk_runs[c]..chunk_runs[c + 1]]`.
    chunk_runs: Vec<u32>,
    /// Tree `t`'s bitvector words: `slot_start[t]..slot_start[t + 1]`.
    slot_start: Vec<u32>,
    fallbacks: Vec<Fallback>,
    /// Tree `t`'s leaf values, left to right: `leaf_values[leaf_start[t]..leaf_start[t + 1]]`.
    leaf_start: Vec<u32>,
    leaf_values: Vec<f64>,
    /// Whether a run reads zeroed values (any `missing: zero` numeric split).
    any_zeroed: bool,
}

/// The leaves of the tree rooted at `root` in `forest`, left to right (flat indices), and for
/// each split (flat index) the range of its left subtree's leaves in that order.
#[allow(clippy::type_complexity)]
fn leaves_in_order(forest: &Forest, root: u32) -> (Vec<u32>, Vec<(u32, std::ops::Range<usize>)>) {
    fn visit(
        forest: &Forest,
        at: u32,
        leaves: &mut Vec<u32>,
        splits: &mut Vec<(u32, std::ops::Range<usize>)>,
    ) {
        let node = &forest.nodes[at as usize];
        if node.flags & LEAF != 0 {
            leaves.push(at);
            return;
        }
        let first = leaves.len();
        visit(forest, node.children[0], leaves, splits);
        splits.push((at, first..leaves.len()));
        visit(forest, node.children[1], leaves, splits);
    }
    let mut leaves = Vec::new();
    let mut splits = Vec::new();
    visit(forest, root, &mut leaves, &mut splits);
    (leaves, splits)
}

/// Bits `from..to` of a `u64` (`to <= 64`).
fn leaf_bits(from: usize, to: usize) -> u64 {
    let below = |n: usize| if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
    below(to) & !below(from)
}

/// Leaves `range` as (word, bits) pairs, one per word they touch.
fn leaf_words(range: std::ops::Range<usize>) -> impl Iterator<Item = (usize, u64)> {
    (range.start / 64..range.end.div_ceil(64)).map(move |w| {
        let from = range.start.max(w * 64) - w * 64;
        let to = range.end.min(w * 64 + 64) - w * 64;
        (w, leaf_bits(from, to))
    })
}

/// The number of leaves of tree `t` of `forest`.
pub(super) fn leaf_count(forest: &Forest, t: usize) -> usize {
    let start = forest.roots[t] as usize;
    let end = forest
        .roots
        .get(t + 1)
        .map_or(forest.nodes.len(), |r| *r as usize);
    forest.nodes[start..end]
        .iter()
        .filter(|n| n.flags & LEAF != 0)
        .count()
}

impl QuickForest {
    /// Compiles trees `trees` of `forest`, in that order: tree `trees[i]` becomes this
    /// forest's tree `i`.
    pub(super) fn new(forest: &Forest, trees: &[usize], isa: Isa) -> QuickForest {
        let mut leaf_start = vec![0u32];
        let mut leaf_values = Vec::new();
        let mut slot_start = vec![0u32];
        let mut cuts = Vec::new();
        let mut runs = Vec::new();
        let mut chunk_runs = vec![0u32];
        let mut fallbacks = Vec::new();
        let mut any_zeroed = false;
        let mut rest = trees;
        while !rest.is_empty() {
            // (feature, zeroed, nan_right, threshold, left, slot) of every numeric split.
            let mut numeric: Vec<(u32, bool, bool, f64, u64, u32)> = Vec::new();
            let chunk_start = *slot_start.last().expect("starts at 0") as usize;
            while let Some((&t, later)) = rest.split_first() {
                let first = *slot_start.last().expect("starts at 0");
                if first as usize >= chunk_start + CHUNK_SLOTS {
                    break;
                }
                rest = later;
                let (leaves, splits) = leaves_in_order(forest, forest.roots[t]);
                leaf_values.extend(leaves.iter().map(|l| forest.nodes[*l as usize].threshold));
                leaf_start.push(leaf_values.len() as u32);
                slot_start.push(first + leaves.len().div_ceil(64) as u32);
                for (at, range) in splits {
                    let node = forest.nodes[at as usize];
                    for (word, left) in leaf_words(range) {
                        let slot = first + word as u32;
                        if node.flags & CATEGORICAL != 0 {
                            fallbacks.push(Fallback { node, slot, left });
                            continue;
                        }
                        let zeroed = node.flags & ZERO_MISSING != 0;
                        any_zeroed |= zeroed;
                        // A `missing: zero` split's NaN way is its default way (the walk's flags).
                        let nan_right = node.flags & NAN_LEFT == 0;
                        numeric.push((node.feature, zeroed, nan_right, node.threshold, left, slot));
                    }
                }
            }
            numeric.sort_by(|a, b| {
                (a.0, a.1, a.2)
                    .cmp(&(b.0, b.1, b.2))
                    .then(a.3.total_cmp(&b.3))
            });
            for group in numeric.chunk_by(|a, b| (a.0, a.1, a.2) == (b.0, b.1, b.2)) {
                let start = cuts.len() as u32;
                cuts.extend(group.iter().map(|s| Cut {
                    threshold: s.3,
                    left: s.4,
                    slot: s.5,
                }));
                runs.push(Run {
                    feature: group[0].0,
                    zeroed: group[0].1,
                    nan_right: group[0].2,
                    cuts: start..cuts.len() as u32,
                });
            }
            chunk_runs.push(runs.len() as u32);
        }
        QuickForest {
            isa,
            cuts,
            runs,
            chunk_runs,
            slot_start,
            fallbacks,
            leaf_start,
            leaf_values,
            any_zeroed,
        }
    }

    /// Scans `N` documents (the first `N` rows of `rows`, `n_features` values each; lanes past
    /// `N` repeat the last document) into `block`; `forest` is the walk these trees came from.
    pub(super) fn scan<const N: usize>(
        &self,
        forest: &Forest,
        rows: &[f64],
        n_features: usize,
        block: &mut QuickBlock,
    ) {
        const { assert!(N >= 1 && N <= LANES) };
        block.values.resize(n_features, Values::default());
        for (f, v) in block.values.iter_mut().enumerate() {
            for (l, x) in v.0.iter_mut().enumerate() {
                *x = rows[l.min(N - 1) * n_features + f];
            }
        }
        if self.any_zeroed {
            block.zeroed.clear();
            block.zeroed.extend(block.values.iter().map(|v| {
                Values(v.0.map(|x| {
                    if x.abs() <= ZERO_THRESHOLD {
                        f64::NAN
                    } else {
                        x
                    }
                }))
            }));
        }
        block.bits.clear();
        let slots = *self.slot_start.last().expect("starts at 0") as usize;
        block.bits.resize(slots, Bits([u64::MAX; LANES]));
        for c in 0..self.chunk_runs.len() - 1 {
            let runs = &self.runs[self.chunk_runs[c] as usize..self.chunk_runs[c + 1] as usize];
            let (values, zeroed, bits) = (&block.values, &block.zeroed, &mut block.bits);
            match self.isa {
                Isa::Portable => scan_portable(runs, &self.cuts, values, zeroed, bits),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => {
                    // SAFETY: `Isa::Avx2` is only chosen where the CPU has AVX2 (Isa::available),
                    // and every cut's slot indexes `bits` (resized to the slot count above).
                    unsafe { super::quick_simd::scan_avx2(runs, &self.cuts, values, zeroed, bits) }
                }
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => {
                    // SAFETY: as above, for AVX-512F.
                    unsafe {
                        super::quick_simd::scan_avx512(runs, &self.cuts, values, zeroed, bits)
                    }
                }
                #[cfg(not(target_arch = "x86_64"))]
                Isa::Avx2 | Isa::Avx512 => scan_portable(runs, &self.cuts, values, zeroed, bits),
            }
        }
        for fb in &self.fallbacks {
            let x = &block.values[fb.node.feature as usize].0;
            let bits = &mut block.bits[fb.slot as usize].0;
            for l in 0..N {
                if !forest.categorical_left(&fb.node, x[l]) {
                    bits[l] &= !fb.left;
                }
            }
        }
    }

    /// The leaf values tree `t` gives the first `N` documents of the last [`Self::scan`].
    #[inline]
    pub(super) fn values<const N: usize>(&self, t: usize, block: &QuickBlock) -> [f64; N] {
        let start = self.leaf_start[t] as usize;
        std::array::from_fn(|l| self.leaf_values[start + self.leaf(t, l, block)])
    }

    /// The index (left to right) of the leaf tree `t` gives lane `l` of the last scan: the
    /// lowest bit set in its first non-zero word (the last word always keeps the rightmost
    /// leaf's bit, which no split clears).
    #[inline]
    fn leaf(&self, t: usize, l: usize, block: &QuickBlock) -> usize {
        let (first, end) = (self.slot_start[t] as usize, self.slot_start[t + 1] as usize);
        let mut w = first;
        while w + 1 < end && block.bits[w].0[l] == 0 {
            w += 1;
        }
        (w - first) * 64 + block.bits[w].0[l].trailing_zeros() as usize
    }
}

/// The scan in plain Rust: lane by lane, the same decisions as the SIMD kernels.
#[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(x <= t)`: true for a NaN, which goes right
fn scan_portable(
    runs: &[Run],
    cuts: &[Cut],
    values: &[Values],
    zeroed: &[Values],
    bits: &mut [Bits],
) {
    for run in runs {
        let x = if run.zeroed { &zeroed } else { &values }[run.feature as usize].0;
        let cuts = &cuts[run.cuts.start as usize..run.cuts.end as usize];
        for cut in cuts {
            let b = &mut bits[cut.slot as usize].0;
            let mut any = false;
            for l in 0..LANES {
                let right = if run.nan_right {
                    !(x[l] <= cut.threshold)
                } else {
                    x[l] > cut.threshold
                };
                any |= right;
                if right {
                    b[l] &= !cut.left;
                }
            }
            if !any {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testgen::{edge_value, grow_tree, random_tree};
    use super::super::tree_leaf;
    use super::*;
    use crate::rank::model::{Node, Tree};
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The reference's leaf ids of `tree`, left to right.
    fn reference_leaves(tree: &Tree) -> Vec<u32> {
        fn visit(tree: &Tree, at: u32, out: &mut Vec<u32>) {
            match &tree.nodes[at as usize] {
                Node::Leaf(_) => out.push(at),
                Node::Split(s) => {
                    visit(tree, s.left, out);
                    visit(tree, s.right, out);
                }
            }
        }
        let mut out = Vec::new();
        visit(tree, 0, &mut out);
        out
    }

    #[test]
    fn leaf_bits_cover_the_range() {
        assert_eq!(leaf_bits(0, 0), 0);
        assert_eq!(leaf_bits(0, 1), 1);
        assert_eq!(leaf_bits(3, 5), 0b11000);
        assert_eq!(leaf_bits(0, 64), u64::MAX);
        assert_eq!(leaf_bits(63, 64), 1 << 63);
        assert_eq!(leaf_words(3..5).collect::<Vec<_>>(), vec![(0, 0b11000)]);
        assert_eq!(
            leaf_words(60..130).collect::<Vec<_>>(),
            vec![(0, 0xf << 60), (1, u64::MAX), (2, 0b11)]
        );
        assert_eq!(leaf_words(64..128).collect::<Vec<_>>(), vec![(1, u64::MAX)]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Every instruction set reaches the reference's leaf, in blocks of 8 documents and of
        /// one, on forests of up to 300 trees (several chunks), one-leaf trees, 64-leaf ones and
        /// larger ones (several words) included.
        #[test]
        fn scan_reaches_the_reference_leaf(seed in any::<u64>(), n_trees in 1usize..300) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let nf = rng.random_range(1..5u32);
            let trees: Vec<Tree> = (0..n_trees)
                .map(|_| {
                    match rng.random_range(0..20) {
                        0 => grow_tree(&mut rng, nf, 6, 0.0), // 64 leaves
                        1 => grow_tree(&mut rng, nf, 8, 0.0), // 256 leaves
                        _ => random_tree(&mut rng, nf, 8),
                    }
                })
                .collect();
            let mut forest = Forest::default();
            trees.iter().for_each(|t| forest.push(t));
            let ids: Vec<usize> = (0..n_trees).collect();
            let nf = nf as usize;
            let rows: Vec<f64> = (0..LANES * nf).map(|_| edge_value(&mut rng)).collect();
            for isa in Isa::available() {
                let quick = QuickForest::new(&forest, &ids, isa);
                let mut block = QuickBlock::default();
                quick.scan::<LANES>(&forest, &rows, nf, &mut block);
                for (t, tree) in trees.iter().enumerate() {
                    let in_order = reference_leaves(tree);
                    for l in 0..LANES {
                        let want = tree_leaf(tree, &rows[l * nf..(l + 1) * nf]);
                        prop_assert_eq!(in_order[quick.leaf(t, l, &block)], want, "{:?} tree {} lane {}", isa, t, l);
                    }
                }
                let mut one = QuickBlock::default();
                quick.scan::<1>(&forest, &rows[3 * nf..], nf, &mut one);
                for t in 0..n_trees {
                    prop_assert_eq!(quick.values::<1>(t, &one)[0].to_bits(), quick.values::<LANES>(t, &block)[3].to_bits());
                }
            }
        }
    }
}
