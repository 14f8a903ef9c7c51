//! AND: block-max intersection led by the shortest list, and its finish after another
//! processor intersected some of the lists.

use super::*;

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
pub(super) fn and_topk(
    index: &Index,
    query: &Query,
    lists: &QueryTerms,
    stats: &mut SelectStats,
) -> TopK {
    let mut top = TopK::new(query.k);
    let (mut terms, n_distinct, all_known) = prepare(index, query, lists);
    if !all_known || terms.is_empty() {
        return top;
    }
    terms.sort_by_key(|t| (t.cursor.df(), t.qi));
    let list_bounds: Vec<f64> = terms.iter().map(Term::list_bound).collect();
    let lists_bound: f64 = list_bounds.iter().sum();
    let mut contrib = vec![0f32; n_distinct];
    // Per list after the leader: the sum of the block bounds of the lists after it.
    let mut rest_after = vec![0f64; terms.len()];
    // The leader's postings of a window that may enter: docID, tf.
    let mut cands = [(0 as DocId, 0u32); BLOCK_LEN];
    // Those the first follower holds and that may still enter: docID, leader's tf, follower's
    // tf, the two contributions' sum bounded at the length floor.
    let mut held = [(0 as DocId, 0u32, 0u32, 0f64); BLOCK_LEN];
    // The first follower's postings of dense windows by docID less the window's first
    // candidate ([`FollowerMap`]): the thread's, kept from query to query (made once, not
    // zeroed per query).
    let mut follower_at = FOLLOWER_MAPS.take().unwrap_or_else(FollowerMap::new);
    // Norms and contributions by length and by length floor (every term of a query has the
    // same norms): the same bits as the scorer's, without their divisions; the norm at each
    // length floor's code, for the leader's postings' bounds, on the stack.
    let table = LengthTable::shared(&terms[0].scorer);
    let floor_norms: [f32; 256] = *table.floor_norms();
    let mut doc = terms[0].cursor.doc();
    'windows: while doc != TERMINATED {
        // The leader's and the first follower's blocks end the window; the lists after them,
        // denser, are bounded over it by their blocks there: their short blocks would cut it
        // into windows of a few of the leader's postings each.
        let mut window_end = TERMINATED;
        for t in terms.iter_mut().take(WINDOW_LISTS) {
            let Some((last, _)) = t.block_bound(doc) else {
                break 'windows;
            };
            window_end = window_end.min(last);
        }
        let mut leader_bound = 0f64;
        let mut others_bound = 0f64;
        for (i, t) in terms.iter_mut().enumerate().rev() {
            let bound = match i < WINDOW_LISTS {
                true => t.block_bound(doc).map(|(_, b)| b),
                false => t.bound_over(doc, window_end, list_bounds[i]),
            };
            let Some(bound) = bound else {
                break 'windows;
            };
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
    FOLLOWER_MAPS.set(Some(follower_at));
    top
}

thread_local! {
    /// Each thread's [`FollowerMap`] between its AND queries.
    static FOLLOWER_MAPS: std::cell::Cell<Option<FollowerMap>> = const { std::cell::Cell::new(None) };
}

/// The lists, shortest first, whose blocks end AND's windows (the first follower's must: its
/// postings of a dense window are read from its block there).
const WINDOW_LISTS: usize = 2;

/// Windows whose candidates span at most this many docIDs, with at least
/// [`FOLLOWER_MAP_MIN_CANDIDATES`] candidates, have the first follower's postings marked in a
/// map by docID rather than sought one candidate at a time: in a dense conjunction (every list
/// a quarter or more of the collection) most candidates are sought a few postings apart in the
/// same decoded block, and a seek each cost more than marking the block's postings.
const FOLLOWER_MAP_SPAN: usize = 4096;
const FOLLOWER_MAP_MIN_CANDIDATES: usize = 8;

/// The first follower's postings of a dense window, by docID less the window's first candidate:
/// each entry the window's tag (high byte) and the posting's place in the decoded block plus one
/// (low byte). An entry of another window's tag is no posting of this one, so nothing is cleared
/// between windows, only the whole map once in 255 windows, when the tag wraps.
struct FollowerMap {
    at: Vec<u16>,
    tag: u16,
}

impl FollowerMap {
    fn new() -> Self {
        Self {
            at: vec![0; FOLLOWER_MAP_SPAN],
            tag: 0,
        }
    }

    /// Starts a window: every entry then reads as no posting.
    #[inline]
    fn next_window(&mut self) {
        self.tag += 1;
        if self.tag == 256 {
            self.at.fill(0);
            self.tag = 1;
        }
    }

    /// Marks the posting at place `place` (< 255) of docID `base + o`.
    #[inline]
    fn mark(&mut self, o: usize, place: usize) {
        self.at[o] = self.tag << 8 | (place as u16 + 1);
    }

    /// The place plus one of the window's posting of docID `base + o` (0: none), without a
    /// branch.
    #[inline]
    fn get(&self, o: usize) -> usize {
        let e = self.at[o];
        ((e & 0xff) * ((e >> 8 == self.tag) as u16)) as usize
    }
}

/// The candidates (`cands`: the leader's postings of a window ending at `window_end`, ascending)
/// that the first follower `first` holds and whose contributions, bounded at the length floor,
/// may beat `need` (the k-th score less the other followers' block bounds; `None`: any may),
/// into `held` as (docID, leader's tf, follower's tf, the bound). Returns how many, and whether
/// the follower ended before a candidate (no later document is in the conjunction). A dense
/// window marks the follower's postings of the window in `follower_at` and reads every
/// candidate's entry without a branch; another seeks each candidate.
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
    follower_at: &mut FollowerMap,
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
        && ((window_end - base) as usize) < FOLLOWER_MAP_SPAN;
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
    follower_at.next_window();
    let mut in_window = docs.len();
    for (i, &d) in docs.iter().enumerate() {
        if d > window_end {
            in_window = i;
            break;
        }
        follower_at.mark((d - base) as usize, i);
    }
    // The candidates the follower holds, then those whose bound may beat `need`, each kept
    // without a branch: whether the follower holds a candidate is about even, a mispredicted
    // branch as often when tested; and only those it holds have their length floors read (a
    // cache miss in a large collection).
    let mut both = [(0 as DocId, 0u32, 0u32); BLOCK_LEN];
    let mut n_both = 0;
    for &(d, leader_tf) in cands {
        let at = follower_at.get((d - base) as usize);
        // Any tf of the block when the follower does not hold `d`: that entry is dropped.
        both[n_both % BLOCK_LEN] = (d, leader_tf, tfs[at.saturating_sub(1)]);
        n_both += (at != 0) as usize;
    }
    for &(d, leader_tf, first_tf) in &both[..n_both] {
        offer(d, leader_tf, first_tf);
    }
    if in_window < docs.len() {
        first.cursor.skip_in_block(in_window);
    }
    (n_held, false)
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20))]
        /// Over more windows than the tag has values (it wraps and the map is cleared), each
        /// window's entries read as its own marks only: a naive map cleared per window agrees.
        #[test]
        fn follower_map_reads_only_the_window_s_marks(
            windows in proptest::collection::vec(
                proptest::collection::vec((0usize..FOLLOWER_MAP_SPAN, 0usize..BLOCK_LEN), 0..40),
                250..700,
            ),
            probes in proptest::collection::vec(0usize..FOLLOWER_MAP_SPAN, 1..40),
        ) {
            let mut map = FollowerMap::new();
            for marks in &windows {
                map.next_window();
                let mut naive = vec![0usize; FOLLOWER_MAP_SPAN];
                for &(o, place) in marks {
                    map.mark(o, place);
                    naive[o] = place + 1;
                }
                for &o in probes.iter().chain(marks.iter().map(|(o, _)| o)) {
                    prop_assert_eq!(map.get(o), naive[o]);
                }
            }
        }
    }
}
