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
use super::{Mode, Query, QueryTerms, SelectStats};
use crate::index::{DocId, Index, PostingCursor, TERMINATED};

/// One distinct query term that is in the index.
struct Term<'a> {
    /// Position among the query's distinct terms (the summation order).
    qi: usize,
    scorer: TermScorer,
    cursor: PostingCursor<'a>,
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
            Some((_, list)) => terms.push(Term {
                qi,
                scorer: query.term_scorer(index, qi, list.df),
                cursor: list.cursor(),
            }),
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
fn and_topk(index: &Index, query: &Query, lists: &QueryTerms, stats: &mut SelectStats) -> TopK {
    let mut top = TopK::new(query.k);
    let (mut terms, n_distinct, all_known) = prepare(index, query, lists);
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

/// AND finished on the CPU after another processor intersected some of the lists (the GPU, when
/// the scheduler hands a query over between steps): `rows` hold the candidates that every list
/// in `done` holds (the lists of those query positions among the query's distinct terms), in
/// any order, each as its docID then its tf in each list of `done`, in `done`'s order. The
/// remaining lists are sought as [`and_topk`] seeks them, shortest first; the hits and their
/// scores are exactly [`and_topk`]'s over the whole query.
pub fn and_finish(
    index: &Index,
    query: &Query,
    lists: &QueryTerms,
    done: &[usize],
    rows: &[u32],
) -> (Vec<(DocId, f64)>, SelectStats) {
    let mut stats = SelectStats::default();
    let mut top = TopK::new(query.k);
    let (terms, n_distinct, all_known) = prepare(index, query, lists);
    if !all_known || terms.is_empty() || query.k == 0 {
        return (Vec::new(), stats);
    }
    let (mut finished, mut rest): (Vec<Term>, Vec<Term>) =
        terms.into_iter().partition(|t| done.contains(&t.qi));
    rest.sort_by_key(|t| (t.cursor.df(), t.qi));
    // Each finished term's tf column in the rows.
    finished.sort_by_key(|t| done.iter().position(|&qi| qi == t.qi));
    let stride = 1 + done.len();
    let mut order: Vec<usize> = (0..rows.len() / stride).collect();
    order.sort_unstable_by_key(|&r| rows[r * stride]);
    let mut contrib = vec![0f32; n_distinct];
    let present = vec![true; n_distinct];
    'candidates: for r in order {
        let row = &rows[r * stride..(r + 1) * stride];
        let doc = row[0];
        for t in rest.iter_mut() {
            match t.cursor.seek(doc) {
                TERMINATED => break 'candidates,
                d if d != doc => continue 'candidates,
                _ => {}
            }
        }
        let dl = index.scoring_length(doc);
        for (t, &tf) in finished.iter().zip(&row[1..]) {
            contrib[t.qi] = t.scorer.contribution(tf, dl);
        }
        for t in rest.iter_mut() {
            contrib[t.qi] = t.scorer.contribution(t.cursor.tf(), dl);
        }
        stats.docs_scored += 1;
        top.push(doc, exact_score(&contrib, &present));
    }
    stats.blocks_decoded += rest.iter().map(|t| t.cursor.blocks_decoded()).sum::<u64>();
    (top.into_sorted(), stats)
}

/// OR: MaxScore (Turtle & Flood) over per-term upper bounds taken from the skip entries
/// (max over blocks of the bound of (max_tf, min_len) for this query's k1, b), refined per
/// block for the non-essential terms.
fn or_topk(index: &Index, query: &Query, lists: &QueryTerms, stats: &mut SelectStats) -> TopK {
    let mut top = TopK::new(query.k);
    let (mut terms, n_distinct, _) = prepare(index, query, lists);
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
