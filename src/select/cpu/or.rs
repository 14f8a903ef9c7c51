//! OR: block-max MaxScore in windows, the essential lists chosen per window.

use super::*;

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
pub(super) fn or_topk(
    index: &Index,
    query: &Query,
    lists: &QueryTerms,
    stats: &mut SelectStats,
) -> TopK {
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
        // A list non-essential for the query is bounded in the window by its blocks there:
        // a dense list's bound is mostly one outlier's, its blocks' far below.
        for (i, t) in terms.iter_mut().enumerate().take(first_essential) {
            if !live[i] {
                continue;
            }
            match t.bound_over(start, window_end, ub[i]) {
                Some(b) => bound[i] = b,
                None => {
                    live[i] = false;
                    bound[i] = 0.0;
                }
            }
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
