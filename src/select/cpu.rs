//! CPU query processing: AND by skipping intersection, OR by MaxScore with block-max bounds,
//! AND_OR on top of both. The reference the GPU path must match.
//!
//! Every algorithm walks documents in increasing docID order, so a document reaching a full
//! top-k must score strictly above its threshold (an equal score loses to the smaller docIDs
//! already held): pruning drops a document only when an upper bound of its score is ≤ the
//! threshold. Scores are always recomputed exactly (contributions summed in query order) before
//! a document is offered to the heap.

use super::bm25::TermScorer;
use super::topk::TopK;
use super::{dedup_terms, term_list, Mode, Query, SelectStats};
use crate::index::{DocId, Index, PostingCursor, TERMINATED};

/// One distinct query term that is in the index.
struct Term<'a> {
    /// Position among the query's distinct terms (the summation order).
    qi: usize,
    scorer: TermScorer,
    cursor: PostingCursor<'a>,
}

/// The query's distinct terms; the bool says whether every one of them has postings.
fn prepare<'a>(index: &'a Index, query: &Query) -> (Vec<Term<'a>>, usize, bool) {
    let distinct = dedup_terms(&query.terms);
    let n = index.num_docs() as u64;
    let avgdl = index.avg_scoring_length();
    let mut all_known = true;
    let mut terms = Vec::with_capacity(distinct.len());
    for (qi, t) in distinct.iter().enumerate() {
        match term_list(index, t) {
            Some(list) => terms.push(Term {
                qi,
                scorer: TermScorer::new(query.params, n, list.df as u64, avgdl),
                cursor: list.cursor(),
            }),
            None => all_known = false,
        }
    }
    (terms, distinct.len(), all_known)
}

/// Runs the query; returns hits (best first) and counters.
pub(super) fn run(index: &Index, query: &Query) -> (Vec<(DocId, f64)>, SelectStats) {
    let mut stats = SelectStats::default();
    if query.k == 0 || query.terms.is_empty() {
        return (Vec::new(), stats);
    }
    let hits = match query.mode {
        Mode::And => and_topk(index, query, query.k, &mut stats).into_sorted(),
        Mode::Or => or_topk(index, query, query.k, &mut stats).into_sorted(),
        Mode::AndOr => {
            let mut hits = and_topk(index, query, query.k, &mut stats).into_sorted();
            if hits.len() < query.k {
                // Every conjunctive match is in `hits`; at most hits.len() of the OR top-k are
                // among them, so OR's top-k holds the best k − hits.len() others.
                let mut seen: Vec<DocId> = hits.iter().map(|h| h.0).collect();
                seen.sort_unstable();
                let or = or_topk(index, query, query.k, &mut stats).into_sorted();
                let fill = query.k - hits.len();
                hits.extend(
                    or.into_iter()
                        .filter(|h| seen.binary_search(&h.0).is_err())
                        .take(fill),
                );
            }
            hits
        }
    };
    (hits, stats)
}

/// The exact score of `doc` from per-term contributions, summed in query order.
#[inline]
fn exact_score(contrib: &[f32], present: &[bool]) -> f64 {
    let mut s = 0f64;
    for (c, &p) in contrib.iter().zip(present) {
        if p {
            s += *c as f64;
        }
    }
    s
}

/// AND: intersect starting from the shortest list; every other list is `seek`ed to the
/// candidate, which decodes only the one block (found through the skip entries) that can hold it.
fn and_topk(index: &Index, query: &Query, k: usize, stats: &mut SelectStats) -> TopK {
    let mut top = TopK::new(k);
    let (mut terms, n_distinct, all_known) = prepare(index, query);
    if !all_known || terms.is_empty() {
        return top;
    }
    terms.sort_by_key(|t| (t.cursor.df(), t.qi));
    let mut contrib = vec![0f32; n_distinct];
    let present = vec![true; n_distinct];
    let mut candidate = terms[0].cursor.doc();
    'outer: while candidate != TERMINATED {
        for i in 1..terms.len() {
            let d = terms[i].cursor.seek(candidate);
            if d != candidate {
                if d == TERMINATED {
                    break 'outer;
                }
                candidate = terms[0].cursor.seek(d);
                continue 'outer;
            }
        }
        let dl = index.scoring_length(candidate);
        for t in terms.iter_mut() {
            contrib[t.qi] = t.scorer.contribution(t.cursor.tf(), dl);
        }
        stats.docs_scored += 1;
        top.push(candidate, exact_score(&contrib, &present));
        candidate = terms[0].cursor.advance();
    }
    stats.blocks_decoded += terms.iter().map(|t| t.cursor.blocks_decoded()).sum::<u64>();
    top
}

/// OR: MaxScore (Turtle & Flood) over per-term upper bounds taken from the skip entries
/// (max over blocks of the bound of (max_tf, min_len) for this query's k1, b), refined per
/// block for the non-essential terms.
fn or_topk(index: &Index, query: &Query, k: usize, stats: &mut SelectStats) -> TopK {
    let mut top = TopK::new(k);
    let (mut terms, n_distinct, _) = prepare(index, query);
    if terms.is_empty() {
        return top;
    }
    let bound_of = |t: &Term| {
        let list = t.cursor.list();
        (0..list.n_blocks())
            .map(|j| list.skip(j))
            .map(|s| t.scorer.bound(s.max_tf, s.min_len))
            .fold(0f64, f64::max)
    };
    let mut ub: Vec<(f64, usize)> = terms.iter().map(|t| (bound_of(t), t.qi)).collect();
    // Sort terms by bound, ascending (ties by query position, for determinism).
    let mut order: Vec<usize> = (0..terms.len()).collect();
    order.sort_by(|&a, &b| ub[a].0.total_cmp(&ub[b].0).then(ub[a].1.cmp(&ub[b].1)));
    let mut sorted: Vec<Term> = Vec::with_capacity(terms.len());
    let mut taken: Vec<Option<Term>> = terms.drain(..).map(Some).collect();
    for &i in &order {
        sorted.push(taken[i].take().expect("each index once"));
    }
    ub = order.iter().map(|&i| ub[i]).collect();
    let terms = &mut sorted;
    // cum[i] = ub[0] + ... + ub[i]
    let cum: Vec<f64> = ub
        .iter()
        .scan(0f64, |s, u| {
            *s += u.0;
            Some(*s)
        })
        .collect();
    let mut contrib = vec![0f32; n_distinct];
    let mut present = vec![false; n_distinct];
    let mut first_essential = 0usize;
    loop {
        if let Some(theta) = top.threshold() {
            while first_essential < terms.len() && cum[first_essential] <= theta {
                first_essential += 1;
            }
        }
        if first_essential == terms.len() {
            break;
        }
        let doc = terms[first_essential..]
            .iter()
            .map(|t| t.cursor.doc())
            .min()
            .unwrap_or(TERMINATED);
        if doc == TERMINATED {
            break;
        }
        let dl = index.scoring_length(doc);
        let mut estimate = 0f64;
        for t in terms[first_essential..].iter_mut() {
            if t.cursor.doc() == doc {
                let c = t.scorer.contribution(t.cursor.tf(), dl);
                contrib[t.qi] = c;
                present[t.qi] = true;
                estimate += c as f64;
                t.cursor.advance();
            }
        }
        let mut pruned = false;
        if let Some(theta) = top.threshold() {
            for i in (0..first_essential).rev() {
                if estimate + cum[i] <= theta {
                    pruned = true;
                    break;
                }
                let rest = if i == 0 { 0.0 } else { cum[i - 1] };
                let t = &mut terms[i];
                let block_bound = t
                    .cursor
                    .shallow_block(doc)
                    .map_or(0.0, |s| t.scorer.bound(s.max_tf, s.min_len));
                if estimate + block_bound + rest <= theta {
                    pruned = true;
                    break;
                }
                if t.cursor.seek(doc) == doc {
                    let c = t.scorer.contribution(t.cursor.tf(), dl);
                    contrib[t.qi] = c;
                    present[t.qi] = true;
                    estimate += c as f64;
                }
            }
        }
        if !pruned {
            stats.docs_scored += 1;
            top.push(doc, exact_score(&contrib, &present));
        }
        present.iter_mut().for_each(|p| *p = false);
    }
    stats.blocks_decoded += terms.iter().map(|t| t.cursor.blocks_decoded()).sum::<u64>();
    top
}
