//! CPU query processing with dynamic pruning over block-max bounds (`index::blockmax`): AND by
//! block-max intersection (Tantivy's shape: windows of docIDs skipped on their blocks' bounds,
//! then each of the shortest list's postings scored before the other lists are sought), OR by
//! block-max MaxScore in windows (Lucene's shape: the essential lists chosen per window from the
//! blocks' bounds), AND_OR on top of both. The reference the GPU path must match.
//!
//! Every algorithm walks documents in increasing docID order, so a document reaching a full
//! top-k must score strictly above its threshold (an equal score loses to the smaller docIDs
//! already held): pruning drops a document only when an upper bound of its score is ≤ the
//! threshold, and every such bound holds at least one term's block bound, whose slack
//! (`bm25::BOUND_SLACK`) covers the rounding of summing in another order. Scores are always
//! recomputed exactly (contributions summed in query order) before a document is offered to the
//! heap. Blocks are decoded only where a candidate is sought: a window whose bounds cannot beat
//! the threshold is passed over on the skip entries alone.

mod and;
mod or;

use super::bm25::{LengthTable, TermScorer, BOUND_SLACK};
use super::topk::TopK;
use super::{Mode, Query, QueryTerms, SelectStats};
use crate::index::codecs::BLOCK_LEN;
use crate::index::{DocId, Index, PostingCursor, PostingList, TERMINATED};
pub use and::and_finish;
use and::and_topk;
use or::or_topk;

/// Blocks ahead of a block-max place whose entries are asked for when the place moves: windows
/// mostly move one block at a time, and the entries of the next ones are then in cache.
const ENTRIES_AHEAD: usize = 4;

/// Blocks past the first whose entries [`Term::bound_over`] reads before it answers with the
/// list's bound instead: a window of OR spans a few blocks of a denser list.
const BOUND_OVER_BLOCKS: usize = 8;

/// One distinct query term that is in the index.
struct Term<'a> {
    /// Position among the query's distinct terms (the summation order).
    qi: usize,
    scorer: TermScorer,
    cursor: PostingCursor<'a>,
    /// Block-max place, ahead of (or at) the cursor's block: block `shallow` spans docIDs up to
    /// `shallow_last`, each of whose contributions is at most `shallow_bound`.
    shallow: usize,
    shallow_last: DocId,
    shallow_bound: f64,
}

impl<'a> Term<'a> {
    fn new(qi: usize, scorer: TermScorer, list: PostingList<'a>) -> Self {
        Self {
            qi,
            scorer,
            cursor: list.cursor(),
            shallow: 0,
            shallow_last: list.block_last(0),
            shallow_bound: scorer.bound_at_ends(list.block_max_ends(0, scorer.bound_grid())),
        }
    }

    /// The block-max bound at `doc` and the last docID it holds for (`None`: the list ends
    /// before `doc`). Decodes nothing. `doc` must not decrease from call to call.
    #[inline]
    fn block_bound(&mut self, doc: DocId) -> Option<(DocId, f64)> {
        // Most calls stay in the block of the call before: only this test is inline.
        if doc > self.shallow_last {
            self.move_block_bound(doc)?;
        }
        Some((self.shallow_last, self.shallow_bound))
    }

    /// Moves the block-max place to the block that would hold `doc`, past the current one
    /// (`None`: the list ends before `doc`).
    #[inline(never)]
    fn move_block_bound(&mut self, doc: DocId) -> Option<()> {
        let j = self.cursor.shallow_seek(self.shallow, doc)?;
        let list = self.cursor.list();
        list.prefetch_entries(j + ENTRIES_AHEAD);
        self.shallow = j;
        self.shallow_last = list.block_last(j);
        self.shallow_bound = self
            .scorer
            .bound_at_ends(list.block_max_ends(j, self.scorer.bound_grid()));
        Some(())
    }

    /// The largest block-max bound over docIDs `from..=to` and whether the list holds any of
    /// them (`None`: it ends before `from`), read on the entries of the blocks there, or `cap`
    /// (a bound of the whole list) once more than [`BOUND_OVER_BLOCKS`] blocks would be read.
    /// Decodes nothing; the block-max place moves to `from` only, so that [`Term::block_bound`]
    /// still answers for any docID from `from` on.
    fn bound_over(&mut self, from: DocId, to: DocId, cap: f64) -> Option<f64> {
        let (mut last, mut bound) = self.block_bound(from)?;
        let list = self.cursor.list();
        // A window past the blocks read is known from one skip entry, before any bound is
        // computed.
        let far = self.shallow + BOUND_OVER_BLOCKS;
        if far + 1 < list.n_blocks() && list.block_last(far) < to {
            return Some(cap);
        }
        let grid = self.scorer.bound_grid();
        let mut j = self.shallow;
        while last < to && j + 1 < list.n_blocks() {
            j += 1;
            last = list.block_last(j);
            bound = bound.max(self.scorer.bound_at_ends(list.block_max_ends(j, grid)));
        }
        Some(bound.min(cap))
    }

    /// Asks for the block at the block-max place to be brought into the cache when the cursor is
    /// not on it yet (a window's candidates at or after `doc` are sought in it).
    fn prefetch_window_block(&self, doc: DocId) {
        if self.cursor.block_last() < doc {
            self.cursor.list().prefetch_block(self.shallow);
        }
    }

    /// An upper bound of the term's contribution to any document.
    fn list_bound(&self) -> f64 {
        let list = self.cursor.list();
        match list.list_max() {
            Some(m) => self.scorer.max_bound(&m),
            None => (0..list.n_blocks())
                .map(|j| self.scorer.max_bound(&list.block_max(j)))
                .fold(0f64, f64::max),
        }
    }
}

/// The query's distinct terms; the bool says whether every one of them has postings.
fn prepare<'a>(
    index: &Index,
    query: &Query,
    lists: &QueryTerms<'a>,
) -> (Vec<Term<'a>>, usize, bool) {
    let mut all_known = true;
    let mut terms = Vec::with_capacity(lists.lists.len());
    for (qi, found) in lists.lists.iter().enumerate() {
        match found {
            Some((_, list)) => {
                terms.push(Term::new(qi, query.term_scorer(index, qi, list.df), *list))
            }
            None => all_known = false,
        }
    }
    (terms, lists.lists.len(), all_known)
}

/// Runs the query; returns hits (best first) and counters.
pub(super) fn run(
    index: &Index,
    query: &Query,
    lists: &QueryTerms,
) -> (Vec<(DocId, f64)>, SelectStats) {
    let mut stats = SelectStats::default();
    if query.k == 0 || query.terms.is_empty() {
        return (Vec::new(), stats);
    }
    let hits = match query.mode {
        Mode::And => and_topk(index, query, lists, &mut stats).into_sorted(),
        Mode::Or => or_topk(index, query, lists, &mut stats).into_sorted(),
        Mode::AndOr => {
            let and = and_topk(index, query, lists, &mut stats).into_sorted();
            match and.len() < query.k {
                true => {
                    let or = or_topk(index, query, lists, &mut stats).into_sorted();
                    fill_and_or(and, or, query.k)
                }
                false => and,
            }
        }
    };
    (hits, stats)
}

/// AND_OR's answer from AND's hits (fewer than `k`) and OR's best `k`: every AND hit first, then
/// the best OR hits not among them, up to `k`. Every conjunctive match is in `and`; at most
/// `and.len()` of OR's top-k are among them, so OR's top-k holds the best `k − and.len()` others.
pub(crate) fn fill_and_or(
    mut and: Vec<(DocId, f64)>,
    or: Vec<(DocId, f64)>,
    k: usize,
) -> Vec<(DocId, f64)> {
    let mut seen: Vec<DocId> = and.iter().map(|h| h.0).collect();
    seen.sort_unstable();
    let fill = k.saturating_sub(and.len());
    and.extend(
        or.into_iter()
            .filter(|h| seen.binary_search(&h.0).is_err())
            .take(fill),
    );
    and
}

/// The exact score of a document from per-term contributions, summed in query order, of the
/// terms (by query position) that `holds` says the document has.
#[inline]
fn exact_score(contrib: &[f32], holds: impl Fn(usize) -> bool) -> f64 {
    let mut s = 0f64;
    for (qi, c) in contrib.iter().enumerate() {
        if holds(qi) {
            s += *c as f64;
        }
    }
    s
}

/// The postings of `cursor`'s block, from its current one up to `window_end`, whose contribution
/// bounded at their documents' length floors (a byte each, mostly in cache: `index::lengths`) may
/// exceed `need`, found in one branch-free pass whose reads overlap, as (docID, tf) into `cands`.
/// Returns how many went there, how many of the block's postings lie in the window, and whether
/// the block holds postings past it. The cursor does not move.
fn window_candidates(
    index: &Index,
    cursor: &mut PostingCursor,
    scorer: &TermScorer,
    floor_norms: &[f32; 256],
    window_end: DocId,
    need: f32,
    cands: &mut [(DocId, u32); BLOCK_LEN],
) -> (usize, usize, bool) {
    let mut n_cands = 0;
    let (docs, tfs) = cursor.block_rest();
    // Four postings at a time while the fourth is in the window, their bounds computed side by
    // side (a vector each).
    let mut m = 0;
    while let (Some(d), Some(tf)) = (docs.get(m..m + 4), tfs.get(m..m + 4)) {
        let d: [DocId; 4] = d.try_into().expect("4 docIDs");
        if d[3] > window_end {
            break;
        }
        let tf: [u32; 4] = tf.try_into().expect("4 tfs");
        let norm = d.map(|d| floor_norms[index.scoring_length_code(d) as usize]);
        let pass = scorer.may_exceed_at_norms(tf, norm, need);
        for i in 0..4 {
            // At most one candidate per posting of a block: the mask, a no-op, spares the
            // bounds check.
            cands[n_cands % BLOCK_LEN] = (d[i], tf[i]);
            n_cands += pass[i] as usize;
        }
        m += 4;
    }
    let mut in_window = docs.len();
    // The rest walked up to the window's end, one mispredicted exit: cheaper than finding the
    // end first by a binary search of dependent loads.
    for (k, (&d, &tf)) in docs[m..].iter().zip(&tfs[m..]).enumerate() {
        if d > window_end {
            in_window = m + k;
            break;
        }
        let norm = floor_norms[index.scoring_length_code(d) as usize];
        cands[n_cands % BLOCK_LEN] = (d, tf);
        n_cands += scorer.may_exceed_at_norm(tf, norm, need) as usize;
    }
    (n_cands, in_window, in_window < docs.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::codecs::{encode_list, Codec};
    use crate::select::bm25::Bm25Params;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// A window's bound of a list is the largest bound of the blocks holding docIDs in
        /// the window (the list's own past [`BOUND_OVER_BLOCKS`] of them), so it bounds every
        /// posting there; calls with rising windows leave `block_bound` answering from each
        /// window's start.
        #[test]
        fn bound_over_is_the_largest_block_bound_in_the_window(
            gaps in proptest::collection::vec(1u32..40, 1..3000),
            windows in proptest::collection::vec((0u32..2000, 0u32..3000), 1..20),
        ) {
            let docs: Vec<u32> = gaps.iter().scan(0u32, |d, g| { *d += g; Some(*d) }).collect();
            let tfs: Vec<u32> = docs.iter().map(|d| d % 5 + 1).collect();
            let lens = |d: u32| d % 13 + 1;
            let (mut bytes, mut skips) = (Vec::new(), Vec::new());
            encode_list(Codec::Ef, &docs, &tfs, lens, &mut bytes, &mut skips);
            let mut sk = Vec::new();
            for s in &skips {
                s.write(&mut sk);
            }
            let list = PostingList::from_parts(Codec::Ef, docs.len() as u32, &bytes, &sk);
            let scorer = TermScorer::new(Bm25Params::default(), 1 << 20, docs.len() as u64, 7.0);
            let mut term = Term::new(0, scorer, list);
            let cap = term.list_bound();
            let block_bound = |j: usize| scorer.max_bound(&list.block_max(j));
            let mut from = 0u32;
            for (step, span) in windows {
                from += step;
                let to = from + span;
                let got = term.bound_over(from, to, cap);
                // Blocks holding docIDs from..=to: from the one that would hold `from` to the
                // first whose last docID reaches `to` (or the list's last).
                let first = (0..list.n_blocks()).find(|&j| list.block_last(j) >= from);
                let Some(first) = first else {
                    prop_assert_eq!(got, None);
                    continue;
                };
                let last = (first..list.n_blocks())
                    .find(|&j| list.block_last(j) >= to)
                    .unwrap_or(list.n_blocks() - 1);
                let want = match last - first > BOUND_OVER_BLOCKS {
                    true => cap,
                    false => (first..=last).map(block_bound).fold(0f64, f64::max).min(cap),
                };
                prop_assert_eq!(got, Some(want));
                for (&d, &tf) in docs.iter().zip(&tfs) {
                    if (from..=to).contains(&d) {
                        prop_assert!(scorer.contribution(tf, lens(d)) as f64 <= want);
                    }
                }
                prop_assert_eq!(term.block_bound(from).map(|b| b.1), Some(block_bound(first)));
            }
        }
    }
}
