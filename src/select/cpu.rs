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

use super::bm25::{LengthTable, TermScorer, BOUND_SLACK};
use super::topk::TopK;
use super::{Mode, Query, QueryTerms, SelectStats};
use crate::index::codecs::BLOCK_LEN;
use crate::index::{DocId, Index, PostingCursor, PostingList, TERMINATED};

/// Blocks ahead of a block-max place whose entries are asked for when the place moves: windows
/// mostly move one block at a time, and the entries of the next ones are then in cache.
const ENTRIES_AHEAD: usize = 4;

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

/// AND: block-max intersection led by the shortest list. At `doc`, every list's block holding
/// it is found on the skip entries; the smallest of their last docIDs ends a window over which
/// each list's block bound holds. A window whose bounds sum to no more than the k-th score is
/// passed over undecoded. In another, the leader's postings are walked: once k documents are
/// held, each posting's contribution plus the other lists' block bounds must beat the k-th
/// score before any other list is sought (a posting of the leader alone decodes nothing else),
/// and after each list found, the part found plus the bounds of the lists still to seek. Those
/// contributions are bounded at the document's length floor; the exact length is read, and the
/// score computed, only for a document every list holds. Only blocks a sought candidate lands
/// in are decoded.
fn and_topk(index: &Index, query: &Query, lists: &QueryTerms, stats: &mut SelectStats) -> TopK {
    let mut top = TopK::new(query.k);
    let (mut terms, n_distinct, all_known) = prepare(index, query, lists);
    if !all_known || terms.is_empty() {
        return top;
    }
    terms.sort_by_key(|t| (t.cursor.df(), t.qi));
    let lists_bound: f64 = terms.iter().map(Term::list_bound).sum();
    let mut contrib = vec![0f32; n_distinct];
    // Per list after the leader: the sum of the block bounds of the lists after it.
    let mut rest_after = vec![0f64; terms.len()];
    // The leader's postings of a window that may enter: docID, tf.
    let mut cands = [(0 as DocId, 0u32); BLOCK_LEN];
    // Those the first follower holds and that may still enter: docID, leader's tf, follower's
    // tf, the two contributions' sum bounded at the length floor.
    let mut held = [(0 as DocId, 0u32, 0u32, 0f64); BLOCK_LEN];
    // The first follower's postings of a dense window by docID less the window's first
    // candidate: their place in its decoded block plus one (0: none).
    let mut follower_at = vec![0u8; FOLLOWER_MAP_SPAN];
    // Norms and contributions by length and by length floor (every term of a query has the
    // same norms): the same bits as the scorer's, without their divisions; the norm at each
    // length floor's code, for the leader's postings' bounds, on the stack.
    let table = LengthTable::shared(&terms[0].scorer);
    let floor_norms: [f32; 256] = *table.floor_norms();
    let mut doc = terms[0].cursor.doc();
    'windows: while doc != TERMINATED {
        let mut window_end = TERMINATED;
        let mut leader_bound = 0f64;
        let mut others_bound = 0f64;
        for (i, t) in terms.iter_mut().enumerate().rev() {
            let Some((last, bound)) = t.block_bound(doc) else {
                break 'windows;
            };
            window_end = window_end.min(last);
            match i {
                0 => leader_bound = bound,
                _ => {
                    rest_after[i] = others_bound;
                    others_bound += bound;
                }
            }
        }
        let theta = top.threshold();
        if let Some(theta) = theta {
            if lists_bound <= theta {
                break;
            }
            if leader_bound + others_bound <= theta {
                // window_end is some list's docID, below N < TERMINATED.
                doc = window_end + 1;
                continue;
            }
        }
        let (leader, others) = terms.split_first_mut().expect("at least one term");
        // Its candidates are sought in the other lists' blocks at the window: asked for now,
        // their reads overlap the leader's.
        for t in others.iter() {
            t.prefetch_window_block(doc);
        }
        let first = leader.cursor.seek_to_walk(doc);
        if first > window_end {
            doc = first;
            continue;
        }
        // The leader's postings in the window. Once k are held, only those whose contribution
        // with the other lists' block bounds may beat the k-th score are kept, bounded at their
        // documents' length floors ([`window_candidates`]). The other lists are sought for each, their
        // contributions bounded at the floor too; only a document that every list holds and
        // whose bound beats the k-th score has its exact length read (a cache miss, most of
        // the time) and is scored exactly.
        let need = theta.map_or(f32::NEG_INFINITY, |theta| (theta - others_bound) as f32);
        let (n_cands, in_window, block_goes_on) = window_candidates(
            index,
            &mut leader.cursor,
            &leader.scorer,
            &floor_norms,
            window_end,
            need,
            &mut cands,
        );
        // The first follower for every candidate at once, then the other followers for each
        // document it holds whose bound may still beat the k-th score.
        let (n_held, follower_ended) = match others.split_first_mut() {
            Some((first, _)) => first_follower_holds(
                index,
                &table,
                leader,
                first,
                theta.map(|theta| theta - rest_after.get(1).copied().unwrap_or(0.0)),
                window_end,
                &cands[..n_cands],
                &mut held,
                &mut follower_at,
            ),
            None => {
                for (h, &(d, tf)) in held.iter_mut().zip(&cands[..n_cands]) {
                    *h = (d, tf, 0, 0.0);
                }
                (n_cands, false)
            }
        };
        for &(d, leader_tf, first_tf, partial) in &held[..n_held] {
            let theta = top.threshold();
            // The first follower was sought at the window's k-th score: checked again at
            // today's, which documents pushed since may have raised.
            if let (Some(theta), [_, ..]) = (theta, &others) {
                if partial * (1.0 + BOUND_SLACK) + rest_after[1] <= theta {
                    continue;
                }
            }
            let code = index.scoring_length_code(d);
            let mut partial = partial;
            let mut enters = true;
            for (j, t) in others.iter_mut().enumerate().skip(1) {
                let found = t.cursor.seek(d);
                if found != d {
                    if found == TERMINATED {
                        break 'windows;
                    }
                    enters = false;
                    break;
                }
                partial += table.contribution_at_floor(&t.scorer, t.cursor.tf(), code) as f64;
                // The slack covers the summation order of the exact score.
                if let Some(theta) = theta {
                    if partial * (1.0 + BOUND_SLACK) + rest_after[j + 1] <= theta {
                        enters = false;
                        break;
                    }
                }
            }
            if enters {
                let dl = index.scoring_length(d);
                contrib[leader.qi] = table.contribution(&leader.scorer, leader_tf, dl);
                for (j, t) in others.iter_mut().enumerate() {
                    let tf = match j {
                        0 => first_tf,
                        _ => t.cursor.tf(),
                    };
                    contrib[t.qi] = table.contribution(&t.scorer, tf, dl);
                }
                stats.docs_scored += 1;
                top.push(d, exact_score(&contrib, |_| true));
            }
        }
        if follower_ended {
            break;
        }
        // The next window starts at the leader's next posting when its block, already decoded,
        // holds one (the walk above found it: no search); otherwise past this window, the
        // leader's next block still undecoded.
        doc = match block_goes_on {
            true => leader.cursor.skip_in_block(in_window),
            false => window_end + 1,
        };
    }
    stats.blocks_decoded += terms.iter().map(|t| t.cursor.blocks_decoded()).sum::<u64>();
    top
}

/// Windows whose candidates span at most this many docIDs, with at least
/// [`FOLLOWER_MAP_MIN_CANDIDATES`] candidates, have the first follower's postings marked in a
/// map by docID rather than sought one candidate at a time: in a dense conjunction (every list
/// a quarter or more of the collection) most candidates are sought a few postings apart in the
/// same decoded block, and a seek each cost more than marking the block's postings.
const FOLLOWER_MAP_SPAN: usize = 4096;
const FOLLOWER_MAP_MIN_CANDIDATES: usize = 8;

/// The candidates (`cands`: the leader's postings of a window ending at `window_end`, ascending)
/// that the first follower `first` holds and whose contributions, bounded at the length floor,
/// may beat `need` (the k-th score less the other followers' block bounds; `None`: any may),
/// into `held` as (docID, leader's tf, follower's tf, the bound). Returns how many, and whether
/// the follower ended before a candidate (no later document is in the conjunction). A dense
/// window marks the follower's postings of the window in `follower_at` (all 0 before and after);
/// another seeks each candidate.
#[allow(clippy::too_many_arguments)]
fn first_follower_holds(
    index: &Index,
    table: &LengthTable,
    leader: &Term,
    first: &mut Term,
    need: Option<f64>,
    window_end: DocId,
    cands: &[(DocId, u32)],
    held: &mut [(DocId, u32, u32, f64); BLOCK_LEN],
    follower_at: &mut [u8],
) -> (usize, bool) {
    let mut n_held = 0;
    let mut offer = |d: DocId, leader_tf: u32, first_tf: u32| {
        let code = index.scoring_length_code(d);
        let partial = table.contribution_at_floor(&leader.scorer, leader_tf, code) as f64
            + table.contribution_at_floor(&first.scorer, first_tf, code) as f64;
        // The slack covers the summation order of the exact score.
        let may = need.is_none_or(|need| partial * (1.0 + BOUND_SLACK) > need);
        held[n_held % BLOCK_LEN] = (d, leader_tf, first_tf, partial);
        n_held += may as usize;
    };
    let Some(&(base, _)) = cands.first() else {
        return (0, false);
    };
    let dense = cands.len() >= FOLLOWER_MAP_MIN_CANDIDATES
        && ((window_end - base) as usize) < follower_at.len();
    if !dense {
        for &(d, leader_tf) in cands {
            match first.cursor.seek(d) {
                TERMINATED => return (n_held, true),
                found if found == d => {
                    let tf = first.cursor.tf();
                    offer(d, leader_tf, tf);
                }
                _ => {}
            }
        }
        return (n_held, false);
    }
    // The follower's block at the window holds every one of its postings in it (the window
    // ends at or before that block's last docID).
    first.cursor.seek_to_walk(base);
    let (docs, tfs) = first.cursor.block_rest();
    // Walked up to the window's end, one mispredicted exit: cheaper than finding the end first
    // by a binary search of dependent loads.
    let mut in_window = docs.len();
    for (i, &d) in docs.iter().enumerate() {
        if d > window_end {
            in_window = i;
            break;
        }
        follower_at[(d - base) as usize] = i as u8 + 1;
    }
    for &(d, leader_tf) in cands {
        let at = follower_at[(d - base) as usize] as usize;
        if at != 0 {
            offer(d, leader_tf, tfs[at - 1]);
        }
    }
    for &d in &docs[..in_window] {
        follower_at[(d - base) as usize] = 0;
    }
    if in_window < docs.len() {
        first.cursor.skip_in_block(in_window);
    }
    (n_held, false)
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
        top.push(doc, exact_score(&contrib, |_| true));
    }
    stats.blocks_decoded += rest.iter().map(|t| t.cursor.blocks_decoded()).sum::<u64>();
    (top.into_sorted(), stats)
}

/// An OR candidate's contributions by query position, each with the candidate it was found for
/// (none yet: [`TERMINATED`]), so that nothing is cleared between candidates.
struct Found {
    contrib: Vec<f32>,
    at: Vec<DocId>,
}

impl Found {
    fn new(n_distinct: usize) -> Self {
        Self {
            contrib: vec![0f32; n_distinct],
            at: vec![TERMINATED; n_distinct],
        }
    }

    /// Term `qi`'s contribution `c` to candidate `doc`.
    #[inline]
    fn set(&mut self, qi: usize, doc: DocId, c: f32) {
        self.contrib[qi] = c;
        self.at[qi] = doc;
    }

    /// The exact score of candidate `doc`, from the contributions found for it.
    #[inline]
    fn score(&self, doc: DocId) -> f64 {
        exact_score(&self.contrib, |qi| self.at[qi] == doc)
    }
}

/// A window's lists non-essential there ([`or_topk`]), and what seeking them for a candidate reads.
struct WindowLesser<'w> {
    /// Places among the terms, ascending by bound.
    lists: &'w [usize],
    /// Each term's bound in the window.
    bound: &'w [f64],
    /// The sum of the lists' bounds.
    sum: f64,
    /// Terms below this place are non-essential for the whole query.
    first_essential: usize,
    table: &'w LengthTable,
}

impl WindowLesser<'_> {
    /// Seeks candidate `cand`'s lists, largest bound first, while its exact part `score` plus
    /// the bounds still to seek may beat the k-th score `theta`; returns whether it may enter.
    /// Inlined at both of the window's candidate loops: a call per candidate reloaded the
    /// window's state each time.
    #[inline(always)]
    fn seek(
        &self,
        terms: &mut [Term],
        found: &mut Found,
        theta: Option<f64>,
        cand: DocId,
        dl: u32,
        mut score: f64,
    ) -> bool {
        let Some(theta) = theta else {
            return true;
        };
        let mut rest = self.sum;
        for &i in self.lists.iter().rev() {
            let t = &mut terms[i];
            // A list non-essential for the query is bounded by its block at cand.
            let here = match i < self.first_essential {
                true => t.block_bound(cand).map_or(0.0, |(_, b)| b),
                false => self.bound[i],
            };
            // Only while a bound remains (its slack covers the summation order).
            let remaining = rest - self.bound[i] + here;
            if remaining > 0.0 && score + remaining <= theta {
                return false;
            }
            rest -= self.bound[i];
            if t.cursor.seek(cand) == cand {
                let c = self.table.contribution(&t.scorer, t.cursor.tf(), dl);
                found.set(t.qi, cand, c);
                score += c as f64;
            }
        }
        true
    }
}

/// OR: block-max MaxScore in windows. The lists are ordered by their bound; the prefix whose
/// bounds sum to no more than the k-th score is non-essential for the whole query (Turtle and
/// Flood's MaxScore) and is only ever sought for a candidate. The other lists' blocks at `start`
/// end a window (at the smallest of their last docIDs) over which their block bounds hold; in
/// it, the lists are split again by those bounds (Lucene's MaxScore over windows): the
/// smallest-bound lists whose bounds sum to no more than the k-th score are non-essential there,
/// candidates come from the others' postings in the window only (a window with none is passed
/// over undecoded), and a candidate's non-essential lists are sought, largest bound first, only
/// while its exact part plus the bounds still to seek can beat the k-th score. The lists
/// non-essential for the query come first in every window's split; a window with one essential
/// list takes as candidates only its postings whose contribution at their length floors may
/// beat the k-th score with the other lists' bounds, as AND's leader does.
fn or_topk(index: &Index, query: &Query, lists: &QueryTerms, stats: &mut SelectStats) -> TopK {
    let mut top = TopK::new(query.k);
    let (mut terms, n_distinct, _) = prepare(index, query, lists);
    if terms.is_empty() {
        return top;
    }
    // Ascending by list bound (ties by query position, for determinism).
    let mut by_bound: Vec<(f64, Term)> = terms.drain(..).map(|t| (t.list_bound(), t)).collect();
    by_bound.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.qi.cmp(&b.1.qi)));
    let (ub, mut terms): (Vec<f64>, Vec<Term>) = by_bound.into_iter().unzip();
    let n = terms.len();
    // cum[i] = ub[0] + ... + ub[i].
    let cum: Vec<f64> = ub
        .iter()
        .scan(0f64, |s, &u| {
            *s += u;
            Some(*s)
        })
        .collect();
    let mut found = Found::new(n_distinct);
    // Norms and contributions by length (every term of a query has the same norms): the same
    // bits as the scorer's, without its divisions; the norm at each length floor's code, for
    // the bounds at the floor.
    let table = LengthTable::shared(&terms[0].scorer);
    // The postings of a window with one essential list that may enter: docID, tf.
    let mut cands = [(0 as DocId, 0u32); BLOCK_LEN];
    // Per term: whether its list may still hold a document at `start`, and its bound in the
    // window (its list's bound while it is non-essential for the whole query).
    let mut live = vec![true; n];
    let mut bound = vec![0f64; n];
    // The live terms, the window's non-essential ones first (`by_bound` below).
    let mut order: Vec<usize> = (0..n).collect();
    let mut first_essential = 0usize;
    let mut start = terms
        .iter()
        .map(|t| t.cursor.doc())
        .min()
        .unwrap_or(TERMINATED);
    while start != TERMINATED {
        let theta = top.threshold();
        if let Some(theta) = theta {
            while first_essential < n && cum[first_essential] <= theta {
                first_essential += 1;
            }
        }
        let mut window_end = TERMINATED;
        for (i, t) in terms.iter_mut().enumerate() {
            if !live[i] {
                continue;
            }
            bound[i] = match i < first_essential {
                true => ub[i],
                false => match t.block_bound(start) {
                    Some((last, b)) => {
                        window_end = window_end.min(last);
                        b
                    }
                    None => {
                        live[i] = false;
                        0.0
                    }
                },
            };
        }
        // Every list essential for the query has ended (or there is none): nothing left can
        // beat the k-th score.
        if window_end == TERMINATED {
            break;
        }
        // Last window's order, less the lists that ended, is most often still in order: sorted
        // only when it is not.
        order.retain(|&i| live[i]);
        // The lists non-essential for the query first: their bounds sum to no more than the
        // k-th score, so they are all non-essential in the window too, and every essential
        // list is then one whose block sets the window's end.
        let by_bound = |&a: &usize, &b: &usize| {
            ((a >= first_essential).cmp(&(b >= first_essential)))
                .then(bound[a].total_cmp(&bound[b]))
                .then(a.cmp(&b))
        };
        if !order.is_sorted_by(|a, b| by_bound(a, b).is_le()) {
            order.sort_by(by_bound);
        }
        let mut non_essential = 0;
        if let Some(theta) = theta {
            let mut sum = 0f64;
            while non_essential < order.len() && sum + bound[order[non_essential]] <= theta {
                sum += bound[order[non_essential]];
                non_essential += 1;
            }
        }
        if non_essential == order.len() {
            // window_end is some list's docID, below N < TERMINATED.
            start = window_end + 1;
            continue;
        }
        let (lesser, essential) = order.split_at(non_essential);
        let lesser = WindowLesser {
            lists: lesser,
            bound: &bound,
            sum: lesser.iter().map(|&i| bound[i]).sum(),
            first_essential,
            table: &table,
        };
        // One essential list whose block at `start` holds the whole window (a list
        // non-essential for the query sets no window end): as AND's leader, only its postings
        // whose contribution at the length floor, with the other lists' bounds, may beat the
        // k-th score are candidates, and only they have their exact lengths read.
        let single = match *essential {
            [only] => {
                let cursor = &mut terms[only].cursor;
                cursor.seek_to_walk(start);
                (cursor.block_last() >= window_end).then_some(only)
            }
            _ => None,
        };
        if let Some(only) = single {
            let t = &mut terms[only];
            let need = theta.map_or(f32::NEG_INFINITY, |theta| (theta - lesser.sum) as f32);
            let (n_cands, _, _) = window_candidates(
                index,
                &mut t.cursor,
                &t.scorer,
                table.floor_norms(),
                window_end,
                need,
                &mut cands,
            );
            let (qi, scorer) = (t.qi, t.scorer);
            for &(d, _) in &cands[..n_cands] {
                index.prefetch_scoring_length(d);
            }
            for &(cand, tf) in &cands[..n_cands] {
                let dl = index.scoring_length(cand);
                let c = table.contribution(&scorer, tf, dl);
                found.set(qi, cand, c);
                if lesser.seek(&mut terms, &mut found, top.threshold(), cand, dl, c as f64) {
                    stats.docs_scored += 1;
                    top.push(cand, found.score(cand));
                }
            }
            start = window_end + 1;
            continue;
        }
        // Every candidate of the window is one of the essential lists' postings in it, and
        // each needs its length (a cache miss, most of the time): asked for all at once here,
        // the reads overlap rather than stall one candidate at a time.
        for &i in essential {
            terms[i].cursor.seek_to_walk(start);
            let (docs, _) = terms[i].cursor.block_rest();
            for &d in &docs[..docs.partition_point(|&d| d <= window_end)] {
                index.prefetch_scoring_length(d);
            }
        }
        loop {
            let cand = (essential.iter())
                .map(|&i| terms[i].cursor.doc())
                .min()
                .unwrap_or(TERMINATED);
            if cand > window_end {
                break;
            }
            let dl = index.scoring_length(cand);
            let mut score = 0f64;
            for &i in essential {
                let t = &mut terms[i];
                if t.cursor.doc() == cand {
                    let c = table.contribution(&t.scorer, t.cursor.tf(), dl);
                    found.set(t.qi, cand, c);
                    score += c as f64;
                    // At the window's end the next posting may lie in a block not yet needed.
                    if cand < window_end {
                        t.cursor.advance();
                    }
                }
            }
            if lesser.seek(&mut terms, &mut found, top.threshold(), cand, dl, score) {
                stats.docs_scored += 1;
                top.push(cand, found.score(cand));
            }
            if cand == window_end {
                break;
            }
        }
        start = window_end + 1;
    }
    stats.blocks_decoded += terms.iter().map(|t| t.cursor.blocks_decoded()).sum::<u64>();
    top
}
