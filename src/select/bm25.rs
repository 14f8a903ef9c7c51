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
//! Block-max bounds: the real-valued contribution grows with tf and shrinks with dl (for
//! k1 ≥ 0 and 0 ≤ b ≤ 1), so `c(max_tf, min_len)` of a block bounds every posting's
//! real-valued contribution in it. The f32 evaluation is within a few ulps (relative error
//! below 1e-6) of the real value, so [`TermScorer::bound`] inflates it by 1e-5 relative: a true
//! upper bound of every f32 contribution in the block.

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

/// One query term's scorer: everything but tf and dl fixed.
#[derive(Debug, Clone, Copy)]
pub struct TermScorer {
    idf: f32,
    k1: f32,
    k1_plus_1: f32,
    one_minus_b: f32,
    b: f32,
    avgdl: f32,
}

/// Relative inflation of [`TermScorer::bound`] over the f32 contribution (see the module doc).
pub const BOUND_SLACK: f64 = 1e-5;

impl TermScorer {
    /// A scorer for a term of document frequency `df` in a collection of `n` documents whose
    /// mean scoring length is `avgdl`.
    pub fn new(params: Bm25Params, n: u64, df: u64, avgdl: f64) -> Self {
        Self {
            idf: idf(n, df) as f32,
            k1: params.k1,
            k1_plus_1: params.k1 + 1.0,
            one_minus_b: 1.0 - params.b,
            b: params.b,
            avgdl: avgdl as f32,
        }
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
        let tf = tf as f32;
        let norm = self.k1 * (self.one_minus_b + self.b * (dl as f32 / self.avgdl));
        self.idf * ((tf * self.k1_plus_1) / (tf + norm))
    }

    /// An upper bound (f64) of [`TermScorer::contribution`] over every posting with
    /// `tf ≤ max_tf` and `dl ≥ min_len`.
    #[inline]
    pub fn bound(&self, max_tf: u32, min_len: u32) -> f64 {
        self.contribution(max_tf, min_len) as f64 * (1.0 + BOUND_SLACK)
    }
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

    proptest! {
        /// The bound of (max_tf, min_len) is ≥ every contribution with tf ≤ max_tf, dl ≥ min_len.
        #[test]
        fn bound_is_a_true_upper_bound(
            k1 in 0f32..3.0, b in 0f32..=1.0, df in 1u64..1_000_000, avgdl in 1f64..5000.0,
            max_tf in 1u32..100_000, min_len in 1u32..100_000, dtf in 0u32..100_000, ddl in 0u32..1_000_000,
        ) {
            let s = TermScorer::new(Bm25Params { k1, b }, 1_000_000, df, avgdl);
            let tf = max_tf - dtf.min(max_tf - 1);
            let dl = min_len.saturating_add(ddl);
            prop_assert!((s.contribution(tf, dl) as f64) <= s.bound(max_tf, min_len));
            prop_assert!((s.contribution(max_tf, min_len) as f64) <= s.bound(max_tf, min_len));
        }
    }
}
