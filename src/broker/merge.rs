//! The merge of the shards' answers into one index's answer.
//!
//! Each shard scored its documents with the collection's statistics, so a document's BM25 score
//! is the one the whole index gives it, and its docID (shard offset + its docID in the shard) is
//! the one the whole index gives it: the merge orders exactly as one index does.
//!
//! - The candidates: the best `wanted` by BM25, ties by smaller docID; for `and_or`, every
//!   shard's conjunctive matches first (in that order), then the others. Each shard sent its best
//!   `wanted` (its conjunctive ones first), so the collection's best `wanted` are among them.
//! - Without a ranker they are the hits. With one, the best `k` of them by ranker score, ties by
//!   smaller docID, a NaN score last: the order of one index's ranked search.

use crate::api::SearchHit;
use crate::select::Mode;

/// One shard's answer, its hits' `doc` already the collection's docIDs.
#[derive(Debug, Clone)]
pub struct ShardHits {
    /// In the shard's selection order.
    pub hits: Vec<SearchHit>,
    /// `and_or`: how many of the first hits hold every term.
    pub and_hits: Option<usize>,
}

/// The BM25 order: higher selection score first, ties by smaller docID.
fn by_selection(a: &SearchHit, b: &SearchHit) -> std::cmp::Ordering {
    (b.selection_score.total_cmp(&a.selection_score)).then(a.doc.cmp(&b.doc))
}

/// The collection's answer from its shards' (see the module docs): the best `wanted`
/// candidates of `mode`, then with `ranked` the best `k` of them by ranker score, else the
/// first `k`.
pub fn merge(
    answers: Vec<ShardHits>,
    mode: Mode,
    wanted: usize,
    k: usize,
    ranked: bool,
) -> Vec<SearchHit> {
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    for ShardHits { mut hits, and_hits } in answers {
        let conjunctive = match mode {
            Mode::AndOr => and_hits.unwrap_or(0).min(hits.len()),
            Mode::And | Mode::Or => hits.len(),
        };
        rest.extend(hits.drain(conjunctive..));
        first.extend(hits);
    }
    first.sort_unstable_by(by_selection);
    rest.sort_unstable_by(by_selection);
    first.extend(rest);
    first.truncate(wanted);
    let mut candidates = first;
    if !ranked {
        candidates.truncate(k);
        return candidates;
    }
    candidates.sort_unstable_by(by_score);
    candidates.truncate(k);
    candidates
}

/// The order of one index's ranked hits (its top-k over rows in docID order): a NaN score
/// (`None`) last, then higher score first (`total_cmp`), ties by smaller docID.
fn by_score(a: &SearchHit, b: &SearchHit) -> std::cmp::Ordering {
    let key = |hit: &SearchHit| hit.score.filter(|s| !s.is_nan());
    let by_value = match (key(a), key(b)) {
        (Some(x), Some(y)) => y.total_cmp(&x),
        (x, y) => x.is_none().cmp(&y.is_none()),
    };
    by_value.then(a.doc.cmp(&b.doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(doc: u32, selection_score: f64, score: Option<f64>) -> SearchHit {
        SearchHit {
            doc,
            id: format!("d{doc}"),
            score,
            selection_score,
            explain: None,
        }
    }

    fn docs(hits: &[SearchHit]) -> Vec<u32> {
        hits.iter().map(|h| h.doc).collect()
    }

    #[test]
    fn bm25_hits_merge_by_score_then_smaller_doc() {
        let a = ShardHits {
            hits: vec![hit(3, 2.0, Some(2.0)), hit(1, 1.0, Some(1.0))],
            and_hits: None,
        };
        let b = ShardHits {
            hits: vec![hit(12, 2.0, Some(2.0)), hit(10, 1.5, Some(1.5))],
            and_hits: None,
        };
        assert_eq!(docs(&merge(vec![a, b], Mode::Or, 3, 3, false)), [3, 12, 10]);
    }

    #[test]
    fn and_or_lists_every_shards_conjunctive_matches_first() {
        // Shard a: doc 1 holds every term (score 1), doc 2 does not (score 5).
        let a = ShardHits {
            hits: vec![hit(1, 1.0, None), hit(2, 5.0, None)],
            and_hits: Some(1),
        };
        let b = ShardHits {
            hits: vec![hit(11, 0.5, None), hit(12, 4.0, None)],
            and_hits: Some(1),
        };
        assert_eq!(
            docs(&merge(vec![a, b], Mode::AndOr, 3, 3, false)),
            [1, 11, 2]
        );
    }

    #[test]
    fn ranked_hits_are_the_best_k_candidates_by_ranker_score_nan_last() {
        let a = ShardHits {
            hits: vec![
                hit(0, 3.0, Some(0.1)),
                hit(1, 2.0, None),
                hit(2, 0.5, Some(9.0)),
            ],
            and_hits: None,
        };
        let b = ShardHits {
            hits: vec![hit(5, 2.5, Some(0.7)), hit(6, 1.0, Some(0.7))],
            and_hits: None,
        };
        // Candidates: the best 4 by BM25 (0, 5, 1, 6); doc 2 is not one of them.
        assert_eq!(docs(&merge(vec![a, b], Mode::Or, 4, 4, true)), [5, 6, 0, 1]);
    }
}
