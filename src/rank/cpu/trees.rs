//! A forest as the plan scores it: QuickScorer ([`super::quick`]) for the trees it takes, the
//! block walk ([`super::walk`]) for the rest, each tree's value read in tree order.

use super::quick::{leaf_count, Isa, QuickBlock, QuickForest};
use super::walk::Forest;
use crate::rank::model::Tree;

/// How a [`super::CpuPlan`] evaluates trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeEvaluator {
    /// The block walk for every tree.
    Walk,
    /// QuickScorer on this instruction set for the trees of at most `QUICK_MAX_LEAVES` leaves,
    /// the walk for larger ones.
    Quick(Isa),
}

impl TreeEvaluator {
    /// What [`super::CpuPlan::new`] uses: QuickScorer on the best instruction set of this CPU.
    pub fn detect() -> TreeEvaluator {
        TreeEvaluator::Quick(Isa::detect())
    }
}

/// The most leaves of a tree that QuickScorer takes; larger trees stay on the walk. Measured
/// (development machine, one thread, CPU time, 2 000 documents of random ensembles of 200
/// trees, `examples/cpu_peer.rs --random`): QuickScorer against the walk 1.9 against 4.9 ms at
/// 8 leaves, 4.9 against 8.8 at 64, 10.2 against 12.1 at 128, 20.8 against 20.1 at 256.
const QUICK_MAX_LEAVES: usize = 128;

/// Trees compiled for the plan.
#[derive(Debug, Clone, Default)]
pub(super) struct Trees {
    walk: Forest,
    quick: Option<QuickForest>,
    /// Per tree: its index in `quick`, or `u32::MAX` for a tree on the walk.
    slots: Vec<u32>,
}

impl Trees {
    pub(super) fn new<'a>(
        trees: impl IntoIterator<Item = &'a Tree>,
        evaluator: TreeEvaluator,
    ) -> Trees {
        let mut walk = Forest::default();
        trees.into_iter().for_each(|t| walk.push(t));
        let n = walk.roots.len();
        let mut slots = vec![u32::MAX; n];
        let quick = match evaluator {
            TreeEvaluator::Walk => None,
            TreeEvaluator::Quick(isa) => {
                let fits: Vec<usize> = (0..n)
                    .filter(|t| leaf_count(&walk, *t) <= QUICK_MAX_LEAVES)
                    .collect();
                for (i, t) in fits.iter().enumerate() {
                    slots[*t] = i as u32;
                }
                (!fits.is_empty()).then(|| QuickForest::new(&walk, &fits, isa))
            }
        };
        Trees { walk, quick, slots }
    }

    /// The number of trees.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// QuickScorer, for blocks of `N` documents: a lone document takes the walk, which costs
    /// it fewer loads than scanning every split below its values (same measurement as
    /// [`QUICK_MAX_LEAVES`], one document: 64 leaves 14 µs against 8, 256 leaves 41 against 11).
    #[inline]
    fn quick<const N: usize>(&self) -> Option<&QuickForest> {
        self.quick.as_ref().filter(|_| N > 1)
    }

    /// Prepares [`Self::values`] for `N` documents (the first `N` rows of `rows`).
    #[inline]
    pub(super) fn scan<const N: usize>(
        &self,
        rows: &[f64],
        n_features: usize,
        block: &mut QuickBlock,
    ) {
        if let Some(quick) = self.quick::<N>() {
            quick.scan::<N>(&self.walk, rows, n_features, block);
        }
    }

    /// The leaf values tree `t` gives the first `N` documents of `rows`, which the last
    /// [`Self::scan`] read.
    #[inline]
    pub(super) fn values<const N: usize>(
        &self,
        t: usize,
        rows: &[f64],
        n_features: usize,
        block: &QuickBlock,
    ) -> [f64; N] {
        match (self.slots[t], self.quick::<N>()) {
            (slot, Some(quick)) if slot != u32::MAX => quick.values::<N>(slot as usize, block),
            _ => self
                .walk
                .leaves::<N>(t, rows, n_features)
                .map(|leaf| self.walk.nodes[leaf as usize].threshold),
        }
    }
}
