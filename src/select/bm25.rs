//! BM25 exactly as DESIGN §5, with the arithmetic pinned down so that the CPU, the GPU, AND and
//! OR produce bit-identical scores.
//!
//! - `idf(t) = ln(1 + (N − df + 0.5) / (df + 0.5))`, computed in f64, then rounded to f32.
//! - `avgdl = total scoring length / N` in f64, rounded to f32.
//! - A term's contribution is f32, evaluated in exactly this order (no fused multiply-add; the
//!   GPU kernels must be compiled with `--fmad=false`):
//!   `norm = k1 · ((1 − b) + b · (dl / avgdl))`, `c = idf · ((tf · (k1 + 1)) / (tf + norm))`.
//! - A document's score is the f64 sum of its terms' contributions (as f64) in the query's term
//!   order, after duplicate terms are removed keeping the first occurrence.
//!
//! Block-max bounds: the real-valued contribution is `idf·(k1+1) / (1 + k1·g/A)` with
//! `g = ((1−b)·A + b·dl) / tf`, largest where g is smallest. A block's [`BlockMax`] entry holds
//! the posting of smallest g at each b of [`BOUND_B`]; at the query's b, the chord between the
//! two neighbouring grid values bounds every posting's g from below (`index::blockmax` says
//! why), so [`TermScorer::max_bound`] bounds every posting's real-valued contribution. The f32
//! evaluation is within a few ulps (relative error below 1e-6, the f32 `1 − b` included) of the
//! real value, so the bound is inflated by 1e-5 relative: a true upper bound of every f32
//! contribution in the block.

/// BM25 parameters (DESIGN §5 defaults: k1 = 0.9, b = 0.4).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bm25Params {
    /// Term-frequency saturation, ≥ 0.
    pub k1: f32,
    /// Length normalisation, in [0, 1].
    pub b: f32,
}

impl Default for Bm25Params {
    fn default() -> Self {
        Self { k1: 0.9, b: 0.4 }
    }
}

/// BM25's idf in f64.
pub fn idf(n: u64, df: u64) -> f64 {
    (1.0 + (n as f64 - df as f64 + 0.5) / (df as f64 + 0.5)).ln()
}

use crate::index::blockmax::{BlockMax, BOUND_B};
use crate::index::lengths::floor_of;

/// One query term's scorer: everything but tf and dl fixed.
#[derive(Debug, Clone, Copy)]
pub struct TermScorer {
    idf: f32,
    k1: f32,
    k1_plus_1: f32,
    one_minus_b: f32,
    b: f32,
    avgdl: f32,
    /// The mean length `A₀` the index's [`BlockMax`] entries were chosen at (`avgdl` unless the
    /// query scores a shard with the whole collection's statistics).
    entry_avgdl: f64,
    /// The grid interval `BOUND_B[grid]..=BOUND_B[grid + 1]` holding the entries' b (the
    /// query's b seen at `A₀`, see [`TermScorer::with_entry_avgdl`]).
    grid: usize,
    /// [`TermScorer::max_bound`]'s constants (see [`TermScorer::place_bounds`]): `idf·(k1+1)`
    /// inflated by [`BOUND_SLACK`], and `k1·λ/A` times the chord's weight of each end of the
    /// grid interval.
    bound_top: f64,
    bound_weights: [f64; 2],
}

/// Relative inflation of [`TermScorer::max_bound`] over the real-valued contribution (see the module doc).
pub const BOUND_SLACK: f64 = 1e-5;

impl TermScorer {
    /// A scorer for a term of document frequency `df` in a collection of `n` documents whose
    /// mean scoring length is `avgdl`.
    pub fn new(params: Bm25Params, n: u64, df: u64, avgdl: f64) -> Self {
        let s = Self {
            idf: idf(n, df) as f32,
            k1: params.k1,
            k1_plus_1: params.k1 + 1.0,
            one_minus_b: 1.0 - params.b,
            b: params.b,
            avgdl: avgdl as f32,
            entry_avgdl: avgdl as f32 as f64,
            grid: 0,
            bound_top: 0.0,
            bound_weights: [0.0; 2],
        };
        s.place_bounds(params.b as f64, 1.0)
    }

    /// Sets [`TermScorer::max_bound`]'s constants for entries read at b `entry_b` (the query's
    /// b seen at `A₀`) whose `g` is scaled by `lambda` to the query's (1 when they agree).
    fn place_bounds(mut self, entry_b: f64, lambda: f64) -> Self {
        let (grid, t) = grid_place(entry_b);
        let k = self.k1 as f64 * lambda / self.avgdl as f64;
        self.grid = grid;
        self.bound_top = self.idf as f64 * self.k1_plus_1 as f64 * (1.0 + BOUND_SLACK);
        self.bound_weights = [(1.0 - t) * k, t * k];
        self
    }

    /// The same scorer bounding blocks whose [`BlockMax`] entries were chosen at mean length
    /// `a0` (a shard's own) while it scores with another `A` (the collection's). With
    /// `λ = ((1−b)·A + b·A₀) / A₀` and `β = b / λ`, every posting's `g_b` at `A` is
    /// `λ · g_β` at `A₀`, and `β` lies in [0, 1]: the entries bound `g_β` as they bound any b,
    /// so they bound `g_b` once scaled by `λ`.
    pub fn with_entry_avgdl(mut self, a0: f64) -> Self {
        let (a, a0, b) = (self.avgdl as f64, a0 as f32 as f64, self.b as f64);
        let lambda = ((1.0 - b) * a + b * a0) / a0;
        if a0 == a || !(lambda.is_finite() && lambda > 0.0) {
            return self;
        }
        self.entry_avgdl = a0;
        self.place_bounds((b / lambda).clamp(0.0, 1.0), lambda)
    }

    /// The term's idf as f32 (what the contributions use).
    pub fn idf(&self) -> f32 {
        self.idf
    }

    /// The fields the GPU's `score_term` (kernels/score.cu) takes, in its argument order:
    /// idf, k1, k1 + 1, 1 − b, b, avgdl; it evaluates [`TermScorer::contribution`] from them
    /// operation by operation.
    pub fn kernel_params(&self) -> [f32; 6] {
        [
            self.idf,
            self.k1,
            self.k1_plus_1,
            self.one_minus_b,
            self.b,
            self.avgdl,
        ]
    }

    /// The contribution of a posting with frequency `tf` in a document of scoring length `dl`.
    #[inline]
    pub fn contribution(&self, tf: u32, dl: u32) -> f32 {
        self.contribution_at_norm(tf, self.norm(dl))
    }

    /// The length normalisation of a document of scoring length `dl`: the same for every term
    /// of a query (it depends on k1, b and the mean length only).
    #[inline]
    pub fn norm(&self, dl: u32) -> f32 {
        self.k1 * (self.one_minus_b + self.b * (dl as f32 / self.avgdl))
    }

    /// Whether [`TermScorer::contribution_at_norm`] may exceed `need`: true wherever it does
    /// (the few where it does not cost a division later), without a division. The contribution
    /// exceeds `need` when `idf·tf·(k1+1) > need·(tf + norm)` (tf + norm > 0); each side and
    /// the contribution are within 4 f32 roundings (relative 2.4e-7) of their real values, so
    /// the left side inflated by 1e-5 keeps every posting whose rounded contribution does.
    #[inline]
    pub fn may_exceed_at_norm(&self, tf: u32, norm: f32, need: f32) -> bool {
        let tf = tf as f32;
        self.idf * (tf * self.k1_plus_1) * (1.0 + 1e-5) > need * (tf + norm)
    }

    /// [`TermScorer::may_exceed_at_norm`] of four postings, written so that the compiler
    /// computes them side by side (a vector register each operand).
    #[inline]
    #[allow(clippy::needless_range_loop)] // Indexed, the four lanes become one vector.
    pub fn may_exceed_at_norms(&self, tf: [u32; 4], norm: [f32; 4], need: f32) -> [bool; 4] {
        let mut out = [false; 4];
        for i in 0..4 {
            out[i] = self.may_exceed_at_norm(tf[i], norm[i], need);
        }
        out
    }

    /// [`TermScorer::contribution`] from the document's [`TermScorer::norm`], bit for bit.
    #[inline]
    pub fn contribution_at_norm(&self, tf: u32, norm: f32) -> f32 {
        self.idf * self.ratio_at_norm(tf, norm)
    }

    /// [`TermScorer::contribution_at_norm`] less its idf factor: `(tf·(k1+1)) / (tf + norm)`.
    #[inline]
    fn ratio_at_norm(&self, tf: u32, norm: f32) -> f32 {
        let tf = tf as f32;
        (tf * self.k1_plus_1) / (tf + norm)
    }

    /// An upper bound (f64) of [`TermScorer::contribution`] over every posting that `m`
    /// describes (a block's or a list's entry; see the module doc).
    #[inline]
    pub fn max_bound(&self, m: &BlockMax) -> f64 {
        self.bound_at_ends([m.best[self.grid], m.best[self.grid + 1]])
    }

    /// The entry's place in [`BOUND_B`] whose (tf, dl) pair and the next one
    /// [`TermScorer::bound_at_ends`] reads.
    #[inline]
    pub fn bound_grid(&self) -> usize {
        self.grid
    }

    /// [`TermScorer::max_bound`] from the entry's (tf, dl) pairs at [`TermScorer::bound_grid`]
    /// and the next b only: what a block's bound reads, straight from the mapped entry.
    #[inline]
    pub fn bound_at_ends(&self, ends: [(u32, u32); 2]) -> f64 {
        // With g_i = n_i / tf_i at the interval's ends (n_i = (1−b_i)·A₀ + b_i·dl_i) and the
        // chord's weights w_i: idf·(k1+1) / (1 + k1·λ·(w_0·g_0 + w_1·g_1)/A), as one division.
        let a0 = self.entry_avgdl;
        let end = |i: usize| {
            let (tf, dl) = ends[i];
            let b = BOUND_B[self.grid + i] as f64;
            ((1.0 - b) * a0 + b * dl as f64, tf as f64)
        };
        let ((n0, tf0), (n1, tf1)) = (end(0), end(1));
        let [w0, w1] = self.bound_weights;
        let d = tf0 * tf1;
        self.bound_top * d / (d + w0 * n0 * tf1 + w1 * n1 * tf0)
    }
}

/// Lengths `0..TABLED_LENGTHS` whose norms [`LengthTable`] holds.
const TABLED_LENGTHS: usize = 2048;
/// Term frequencies `1..=TABLED_TFS` whose ratios [`LengthTable`] holds (most postings').
const TABLED_TFS: usize = 2;
/// Term frequencies `1..=FLOOR_TABLED_TFS` whose ratios [`LengthTable`] holds at each length
/// floor's code (4 KiB: a bound's contribution, read in place of a division).
const FLOOR_TABLED_TFS: usize = 4;
/// Tables kept for the process (one per k1, b and mean length in use; the oldest goes first).
const TABLES_KEPT: usize = 8;

/// The parts of every contribution that depend on the document's length alone, for one k1, b
/// and mean length (every term of a query shares them): the norm of each length below
/// [`TABLED_LENGTHS`] and of each length floor's code (`index::lengths`), and for tf in
/// `1..=`[`TABLED_TFS`] the ratio `(tf·(k1+1)) / (tf + norm)` of each of those lengths, so that
/// a contribution is `idf · ratio`, with no division. Tantivy's BM25 weight keeps the norms of
/// its 256 one-byte length codes so; rankserve's lengths are exact, so the table holds the short
/// lengths (almost every document's), and a longer length or a larger tf is computed. Every
/// value is computed by the operations of [`TermScorer::norm`] and
/// [`TermScorer::contribution_at_norm`], in their order: the results are theirs bit for bit.
#[derive(Debug)]
pub struct LengthTable {
    /// k1, b and the mean length, as bits.
    key: [u32; 3],
    norms: Box<[f32]>,
    /// `TABLED_TFS` rows of `TABLED_LENGTHS`: row `tf − 1` at `dl`.
    ratios: Box<[f32]>,
    floor_norms: [f32; 256],
    /// `FLOOR_TABLED_TFS` rows of 256: row `tf − 1` at each length floor's code.
    floor_ratios: Box<[f32]>,
}

impl LengthTable {
    /// The table of `s`'s k1, b and mean length, made on first use and kept for the process.
    pub fn shared(s: &TermScorer) -> std::sync::Arc<Self> {
        use std::sync::{Arc, Mutex};
        static TABLES: Mutex<Vec<Arc<LengthTable>>> = Mutex::new(Vec::new());
        let key = Self::key_of(s);
        let mut tables = TABLES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(t) = tables.iter().find(|t| t.key == key) {
            return Arc::clone(t);
        }
        let table = Arc::new(Self::new(s));
        if tables.len() == TABLES_KEPT {
            tables.remove(0);
        }
        tables.push(Arc::clone(&table));
        table
    }

    /// The parameters a table is made for: `s`'s k1, b and mean length, as bits.
    fn key_of(s: &TermScorer) -> [u32; 3] {
        [s.k1.to_bits(), s.b.to_bits(), s.avgdl.to_bits()]
    }

    fn new(s: &TermScorer) -> Self {
        let norms: Box<[f32]> = (0..TABLED_LENGTHS as u32).map(|dl| s.norm(dl)).collect();
        let ratios = (1..=TABLED_TFS as u32)
            .flat_map(|tf| norms.iter().map(move |&norm| s.ratio_at_norm(tf, norm)))
            .collect();
        let floor_norms: [f32; 256] = std::array::from_fn(|c| s.norm(floor_of(c as u8)));
        let floor_ratios = (1..=FLOOR_TABLED_TFS as u32)
            .flat_map(|tf| {
                floor_norms
                    .iter()
                    .map(move |&norm| s.ratio_at_norm(tf, norm))
            })
            .collect();
        Self {
            key: Self::key_of(s),
            norms,
            ratios,
            floor_norms,
            floor_ratios,
        }
    }

    /// [`TermScorer::contribution`]`(tf, dl)` of `s`, a scorer of the table's k1, b and mean length.
    #[inline]
    pub fn contribution(&self, s: &TermScorer, tf: u32, dl: u32) -> f32 {
        debug_assert_eq!(self.key, Self::key_of(s));
        let (row, dl) = ((tf as usize).wrapping_sub(1), dl as usize);
        if dl >= TABLED_LENGTHS {
            return s.contribution(tf, dl as u32);
        }
        match row < TABLED_TFS {
            true => s.idf * self.ratios[row * TABLED_LENGTHS + dl],
            false => s.contribution_at_norm(tf, self.norms[dl]),
        }
    }

    /// [`TermScorer::norm`] at the floor of each length code (`index::lengths::floor_of`), by code.
    pub fn floor_norms(&self) -> &[f32; 256] {
        &self.floor_norms
    }

    /// [`TermScorer::contribution_at_norm`]`(tf, self.floor_norms()[code])` of `s`, a scorer of
    /// the table's k1, b and mean length: a bound of the contribution at any length of that
    /// code, without a division for the smaller tfs.
    #[inline]
    pub fn contribution_at_floor(&self, s: &TermScorer, tf: u32, code: u8) -> f32 {
        debug_assert_eq!(self.key, Self::key_of(s));
        let row = (tf as usize).wrapping_sub(1);
        match row < FLOOR_TABLED_TFS {
            true => s.idf * self.floor_ratios[row * 256 + code as usize],
            false => s.contribution_at_norm(tf, self.floor_norms[code as usize]),
        }
    }
}

/// The grid interval of [`BOUND_B`] holding `b` and `b`'s place in it.
fn grid_place(b: f64) -> (usize, f64) {
    let grid = (0..BOUND_B.len() - 2)
        .find(|&i| b <= BOUND_B[i + 1] as f64)
        .unwrap_or(BOUND_B.len() - 2);
    let (lo, hi) = (BOUND_B[grid] as f64, BOUND_B[grid + 1] as f64);
    (grid, ((b - lo) / (hi - lo)).clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn idf_matches_the_formula() {
        assert_eq!(idf(10, 1), (1.0f64 + 9.5 / 1.5).ln());
        assert!(
            idf(1000, 1000) > 0.0,
            "idf stays positive even when every document has the term"
        );
    }

    /// A b from the grid or anywhere in [0, 1].
    fn any_b() -> impl Strategy<Value = f32> {
        prop_oneof![proptest::sample::select(BOUND_B.to_vec()), 0f32..=1.0]
    }

    proptest! {
        /// A block's bound is ≥ every contribution in it, for any k1 and b; at the grid's b it
        /// is the block's largest contribution (within the slack).
        #[test]
        fn max_bound_is_a_true_upper_bound(
            k1 in 0f32..3.0, b in any_b(), df in 1u64..1_000_000, avgdl in 1f32..5000.0,
            postings in proptest::collection::vec((1u32..200, 1u32..20_000), 1..128),
        ) {
            let s = TermScorer::new(Bm25Params { k1, b }, 1_000_000, df, avgdl as f64);
            let m = BlockMax::of(postings.iter().copied(), avgdl).unwrap();
            let bound = s.max_bound(&m);
            let best = postings.iter().map(|&(tf, dl)| s.contribution(tf, dl) as f64).fold(0f64, f64::max);
            prop_assert!(best <= bound, "{best} > {bound}");
            if BOUND_B.contains(&b) {
                prop_assert!(bound <= best * (1.0 + 3.0 * BOUND_SLACK), "{bound} loose over {best}");
            }
            // A skip entry's (max_tf, min_len) bounds too, never tighter than the entry.
            let max_tf = postings.iter().map(|p| p.0).max().unwrap();
            let min_len = postings.iter().map(|p| p.1).min().unwrap();
            let skip = BlockMax::from_skip(crate::index::codecs::SkipEntry { max_tf, min_len, ..Default::default() });
            prop_assert!(bound <= s.max_bound(&skip) * (1.0 + 1e-12));
        }

        /// The division-free test keeps every posting whose contribution exceeds `need`, for
        /// needs at, just below and just above the contribution (and any other).
        #[test]
        fn may_exceed_keeps_every_contribution_above_need(
            k1 in 0f32..3.0, b in any_b(), df in 1u64..1_000_000, avgdl in 1f32..5000.0,
            tf in 1u32..300, dl in 0u32..20_000, step in -3i32..=3, other in -20f32..20.0,
        ) {
            let s = TermScorer::new(Bm25Params { k1, b }, 1_000_000, df, avgdl as f64);
            let norm = s.norm(dl);
            let c = s.contribution_at_norm(tf, norm);
            prop_assert_eq!(c.to_bits(), s.contribution(tf, dl).to_bits());
            let near = f32::from_bits((c.to_bits() as i64 + step as i64).max(0) as u32);
            for need in [near, other, f32::NEG_INFINITY] {
                if c > need {
                    prop_assert!(s.may_exceed_at_norm(tf, norm, need), "{} > {}", c, need);
                }
            }
        }

        /// The length table's contributions are the scorer's, bit for bit, at tabled and
        /// untabled lengths and tfs, and so are its norms and contributions at every length
        /// floor.
        #[test]
        fn length_table_contributions_are_the_scorers(
            k1 in 0f32..3.0, b in any_b(), df in 1u64..1_000_000, avgdl in 1f32..5000.0,
            tf in 1u32..6, dl in prop_oneof![0u32..(TABLED_LENGTHS as u32 + 2), 0u32..1_000_000],
            code in 0u8..=255,
        ) {
            let s = TermScorer::new(Bm25Params { k1, b }, 1_000_000, df, avgdl as f64);
            let t = LengthTable::shared(&s);
            prop_assert_eq!(t.contribution(&s, tf, dl).to_bits(), s.contribution(tf, dl).to_bits());
            let floor = floor_of(code);
            prop_assert_eq!(t.floor_norms()[code as usize].to_bits(), s.norm(floor).to_bits());
            prop_assert_eq!(
                t.contribution_at_floor(&s, tf, code).to_bits(),
                s.contribution_at_norm(tf, s.norm(floor)).to_bits()
            );
        }

        /// Entries chosen at a shard's mean length bound the contributions scored with the
        /// collection's (another) mean length.
        #[test]
        fn entries_of_another_mean_length_still_bound(
            k1 in 0f32..3.0, b in any_b(), a0 in 1f32..5000.0, a in 1f32..5000.0,
            postings in proptest::collection::vec((1u32..200, 1u32..20_000), 1..128),
        ) {
            let s = TermScorer::new(Bm25Params { k1, b }, 1_000_000, 1_000, a as f64)
                .with_entry_avgdl(a0 as f64);
            let m = BlockMax::of(postings.iter().copied(), a0).unwrap();
            let bound = s.max_bound(&m);
            let best = postings.iter().map(|&(tf, dl)| s.contribution(tf, dl) as f64).fold(0f64, f64::max);
            prop_assert!(best <= bound, "{best} > {bound}");
        }
    }
}
