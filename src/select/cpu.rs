//! CPU query processing with dynamic pruning over block-max bounds (`index::blockmax`): AND by
//! a skipping intersection that also skips every docID range whose blocks' bounds sum to no
//! more than the k-th score, OR by block-max MaxScore, AND_OR on top of both. The reference the
//! GPU path must match.
//!
//! Every algorithm walks documents in increasing docID order, so a document reaching a full
//! top-k must score strictly above its threshold (an equal score loses to the smaller docIDs
//! already held): pruning drops a document only when an upper bound of its score is ≤ the
//! threshold. Scores are always recomputed exactly (contributions summed in query order) before
//! a document is offered to the heap.

use super::bm25::TermScorer;
use super::topk::TopK;
use super::{Mode, Query, QueryTerms, SelectStats};
use crate::index::{DocId, Index, PostingCursor, PostingList, TERMINATED};

/// One distinct query term that is in the index.
struct Term<'a> {
    /// Position among the query's distinct terms (the summation order).
    qi: usize,
    scorer: TermScorer,
    cursor: PostingCursor<'a>,
    /// Block-max place, ahead of (or at) the cursor's block: block `shallow` spans docIDs up to
    /// `shallow_last`, each of whose contributions is at most `shallow_bound`; its largest tf
    /// is `shallow_max_tf`.
    shallow: usize,
    shallow_last: DocId,
    shallow_bound: f64,
    shallow_max_tf: u32,
}

impl<'a> Term<'a> {
    fn new(qi: usize, scorer: TermScorer, list: PostingList<'a>) -> Self {
        Self {
            qi,
            scorer,
            cursor: list.cursor(),
            shallow: 0,
            shallow_last: list.block_last(0),
            shallow_bound: scorer.max_bound(&list.block_max(0)),
            shallow_max_tf: list.skip(0).max_tf,
        }
    }

    /// The block-max bound at `doc` and the last docID it holds for (`None`: the list ends
    /// before `doc`). Decodes nothing. `doc` must not decrease from call to call.
    #[inline]
    fn block_bound(&mut self, doc: DocId) -> Option<(DocId, f64)> {
        if doc > self.shallow_last {
            let j = self.cursor.shallow_seek(self.shallow, doc)?;
            let list = self.cursor.list();
            self.shallow = j;
            self.shallow_last = list.block_last(j);
            self.shallow_bound = self.scorer.max_bound(&list.block_max(j));
            self.shallow_max_tf = list.skip(j).max_tf;
        }
        Some((self.shallow_last, self.shallow_bound))
    }

    /// The bound of the term's contribution to a document of length `dl` in the block last
    /// passed to [`Term::block_bound`]: BM25 falls with length, so a long document is bounded
    /// far below the block's best posting.
    #[inline]
    fn bound_at(&self, dl: u32) -> f64 {
        self.scorer
            .bound(self.shallow_max_tf, dl)
            .min(self.shallow_bound)
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
/// candidate, which decodes only the one block (found through the skip entries) that can hold
/// it. Once k documents are held, the blocks of every list that hold the next target span
/// docIDs up to the smallest of their last docIDs; when their bounds sum to no more than the
/// k-th score, nothing up to there can enter and the whole range is skipped, undecoded. (A
/// candidate is not bounded at its own length before the other lists are sought, as OR's are:
/// that reads the length of every candidate of the shortest list, most of which the other
/// lists reject, and cost more CPU time than it saved on the synth corpus at 1 M documents.)
fn and_topk(index: &Index, query: &Query, lists: &QueryTerms, stats: &mut SelectStats) -> TopK {
    let mut top = TopK::new(query.k);
    let (mut terms, n_distinct, all_known) = prepare(index, query, lists);
    if !all_known || terms.is_empty() {
        return top;
    }
    terms.sort_by_key(|t| (t.cursor.df(), t.qi));
    let mut contrib = vec![0f32; n_distinct];
    let present = vec![true; n_distinct];
    let mut target = terms[0].cursor.doc();
    'outer: while target != TERMINATED {
        // The last docID the block bounds were checked up to (none until k are held).
        let mut checked_to = TERMINATED;
        if let Some(theta) = top.threshold() {
            let mut sum = 0f64;
            for t in terms.iter_mut() {
                let Some((last, bound)) = t.block_bound(target) else {
                    break 'outer;
                };
                sum += bound;
                checked_to = checked_to.min(last);
            }
            if sum <= theta {
                // checked_to is some list's docID, below N < TERMINATED.
                target = checked_to + 1;
                continue;
            }
        }
        let candidate = terms[0].cursor.seek(target);
        if candidate == TERMINATED {
            break;
        }
        if candidate > checked_to {
            target = candidate;
            continue;
        }
        for t in terms[1..].iter_mut() {
            let d = t.cursor.seek(candidate);
            if d != candidate {
                if d == TERMINATED {
                    break 'outer;
                }
                target = d;
                continue 'outer;
            }
        }
        let dl = index.scoring_length(candidate);
        for t in terms.iter_mut() {
            contrib[t.qi] = t.scorer.contribution(t.cursor.tf(), dl);
        }
        stats.docs_scored += 1;
        top.push(candidate, exact_score(&contrib, &present));
        target = terms[0].cursor.advance();
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

/// OR: block-max MaxScore. Terms sorted by their list's bound; the shortest prefix whose
/// bounds sum to no more than the k-th score is non-essential (Turtle & Flood's MaxScore):
/// candidates come from the other, essential lists only. Before a candidate is scored, the
/// block-max bounds of the blocks holding it are summed, first over every list (when no more
/// than the k-th score, every essential list skips to the end of the shortest of those blocks),
/// then over the lists that can hold it, first as the blocks bound them, then at the
/// candidate's length with each block's largest tf (no more: the candidate is dropped); the non-essential
/// lists are sought last to first while their block bounds can still lift it above the k-th
/// score.
fn or_topk(index: &Index, query: &Query, lists: &QueryTerms, stats: &mut SelectStats) -> TopK {
    let mut top = TopK::new(query.k);
    let (mut terms, n_distinct, _) = prepare(index, query, lists);
    if terms.is_empty() {
        return top;
    }
    let ub: Vec<f64> = terms.iter().map(Term::list_bound).collect();
    // Sorted by bound, ascending (ties by query position, for determinism).
    let mut order: Vec<usize> = (0..terms.len()).collect();
    order.sort_by(|&a, &b| ub[a].total_cmp(&ub[b]).then(terms[a].qi.cmp(&terms[b].qi)));
    let mut taken: Vec<Option<Term>> = terms.drain(..).map(Some).collect();
    let mut terms: Vec<Term> = order
        .iter()
        .map(|&i| taken[i].take().expect("each index once"))
        .collect();
    // cum[i] = ub[0] + ... + ub[i], in sorted order.
    let cum: Vec<f64> = order
        .iter()
        .scan(0f64, |s, &i| {
            *s += ub[i];
            Some(*s)
        })
        .collect();
    let mut contrib = vec![0f32; n_distinct];
    let mut present = vec![false; n_distinct];
    // Per sorted term, its block bound at the candidate (0 when its list has ended).
    let mut block = vec![0f64; terms.len()];
    let mut first_essential = 0usize;
    loop {
        let theta = top.threshold();
        if let Some(theta) = theta {
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
        if let Some(theta) = theta {
            let (mut all, mut at_doc, mut upto) = (0f64, 0f64, TERMINATED);
            for (i, t) in terms.iter_mut().enumerate() {
                let (last, bound) = t.block_bound(doc).unwrap_or((TERMINATED, 0.0));
                block[i] = bound;
                all += bound;
                upto = upto.min(last);
                if i < first_essential || t.cursor.doc() == doc {
                    at_doc += bound;
                }
            }
            if all <= theta {
                // upto is some list's docID (`all` > 0 otherwise... or every list ended).
                let next = upto.saturating_add(1);
                for t in terms[first_essential..].iter_mut() {
                    t.cursor.seek(next);
                }
                continue;
            }
            let mut drop = at_doc <= theta;
            if !drop {
                // The candidate's own length bounds it closer than the blocks do.
                let dl = index.scoring_length(doc);
                at_doc = 0.0;
                for (i, t) in terms.iter().enumerate() {
                    if i < first_essential || t.cursor.doc() == doc {
                        block[i] = t.bound_at(dl);
                        at_doc += block[i];
                    }
                }
                drop = at_doc <= theta;
            }
            if drop {
                for t in terms[first_essential..].iter_mut() {
                    if t.cursor.doc() == doc {
                        t.cursor.advance();
                    }
                }
                continue;
            }
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
        if let Some(theta) = theta {
            // rest = the non-essential block bounds not yet replaced by exact contributions.
            let mut rest: f64 = block[..first_essential].iter().sum();
            for i in (0..first_essential).rev() {
                if estimate + rest <= theta {
                    pruned = true;
                    break;
                }
                rest -= block[i];
                let t = &mut terms[i];
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
