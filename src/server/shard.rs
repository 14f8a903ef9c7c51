//! The shard routes a broker calls ([`crate::broker`]): `POST /v1/shard/stats` (what the served
//! index adds to the collection's statistics, and the document frequencies of a query's terms)
//! and `POST /v1/shard/search` (`/v1/search` scored with the collection's statistics).
//!
//! Any server answers them: an index built whole is a collection of one shard at offset 0, and
//! an index from `rankserve index build --shards` says where it lies in `shard.json`.
//!
//! A shard's search returns what the broker needs to reproduce one index's answer: its own
//! best candidates by BM25 (every one of its best `max(k, candidates)` with a ranker, each with
//! its ranker score, since the unsharded search ranks the collection's best `candidates` by
//! BM25 and any of them may lie in this shard), in selection order, and for `and_or` how many
//! of them hold every term (an `and_or` answer lists those first, whatever their scores).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State as Shared;

use super::codec::{Coded, Negotiated, Reply, RequestBody};
use super::error::{ApiError, ErrorBody};
use super::search::{
    bm25_order, candidates, prepare, rank_candidates, selection_query, Candidates, Prepared,
};
use super::state::{AppState, State};
use crate::api::shard::{
    CollectionStats, ShardSearchRequest, ShardSearchResponse, ShardStats, ShardStatsRequest,
};
use crate::api::{Format, SearchRequest};
use crate::backend::Backend;
use crate::index::shard::ShardInfo;
use crate::index::Index;
use crate::rank::fe::{CorpusStats, QueryInfo};
use crate::select::engine::Selected;
use crate::select::{bm25, dedup_terms, Collection, Mode, Query, SearchResult, SelectStats};

impl RequestBody for ShardStatsRequest {
    fn decode_body(format: Format, bytes: bytes::Bytes) -> Result<Self, ApiError> {
        Ok(format.decode(&bytes)?)
    }
}

impl RequestBody for ShardSearchRequest {
    fn decode_body(format: Format, bytes: bytes::Bytes) -> Result<Self, ApiError> {
        Ok(format.decode(&bytes)?)
    }
}

/// FE's query and corpus statistics from the collection's: idf per distinct term from its
/// collection df, the average length of each stream some document has.
pub(super) fn fe_statistics(collection: &CollectionStats) -> (QueryInfo, CorpusStats) {
    let query = QueryInfo {
        terms: collection.df.len() as u32,
        idf: (collection.df.iter())
            .map(|&df| bm25::idf(collection.docs, df))
            .collect(),
    };
    let stats = CorpusStats {
        avg_length: (collection.stream_lengths.iter())
            .map(|(name, &total)| (name.clone(), average(total, collection.docs)))
            .filter(|&(_, avg)| avg > 0.0)
            .collect(),
    };
    (query, stats)
}

/// `total / docs` as an index computes its average lengths (0 for no documents).
fn average(total: u64, docs: u64) -> f64 {
    match docs {
        0 => 0.0,
        n => total as f64 / n as f64,
    }
}

/// The statistics of `index` for `terms`.
///
/// # Errors
/// [`ApiError::Internal`] when `shard.json` does not read.
fn stats_of(index: &Index, terms: &[String]) -> Result<ShardStats, ApiError> {
    let manifest = index.manifest();
    Ok(ShardStats {
        shard: ShardInfo::read(index.dir()).map_err(ApiError::internal)?,
        docs: manifest.num_docs,
        scoring_length: manifest.total_scoring_length,
        stream_lengths: (manifest.streams.iter().cloned())
            .zip(manifest.stream_total_lengths.iter().copied())
            .collect(),
        df: (terms.iter())
            .map(|t| {
                index
                    .term_id(t)
                    .map_or(0, |id| index.term_info(id).df as u64)
            })
            .collect(),
    })
}

/// `POST /v1/shard/stats`.
#[utoipa::path(
    post,
    path = "/v1/shard/stats",
    tag = "shards",
    request_body = ShardStatsRequest,
    responses(
        (status = 200, description = "The served index's statistics and its df of each term", body = ShardStats),
        (status = 503, description = "`no_index`", body = ErrorBody),
    )
)]
pub(super) async fn shard_stats(
    Shared(state): Shared<AppState>,
    Negotiated(format): Negotiated,
    Coded { value: request, .. }: Coded<ShardStatsRequest>,
) -> Result<Reply<ShardStats>, ApiError> {
    let index = state.index().ok_or(ApiError::NoIndex)?;
    if request.terms.len() > super::search::MAX_QUERY_TERMS {
        return Err(ApiError::InvalidRequest(format!(
            "{} terms, at most {} are accepted",
            request.terms.len(),
            super::search::MAX_QUERY_TERMS
        )));
    }
    Ok(Reply(format, stats_of(&index, &request.terms)?))
}

/// Selects `query`'s candidates; for `and_or` also how many hold every term. `and_or` runs as
/// AND, then OR when AND has fewer than `k` (as the CPU's own `and_or` does), so that the
/// conjunctive matches are known.
fn select_counting_and(
    state: &State,
    index: &Arc<Index>,
    query: &Query,
    backend: Backend,
    at: Option<std::time::Instant>,
) -> Result<(Selected, Option<usize>), ApiError> {
    let run = |mode: Mode| {
        let query = Query {
            mode,
            ..query.clone()
        };
        let route = state.select.route(index, &query, backend);
        (state.select)
            .select(index, &query, route, backend, at)
            .map_err(ApiError::internal)
    };
    if query.mode != Mode::AndOr {
        return Ok((run(query.mode)?, None));
    }
    let and = run(Mode::And)?;
    let and_hits = and.result.hits.len();
    if and_hits >= query.k {
        return Ok((and, Some(and_hits)));
    }
    let or = run(Mode::Or)?;
    let stats = SelectStats {
        blocks_decoded: and.result.stats.blocks_decoded + or.result.stats.blocks_decoded,
        docs_scored: and.result.stats.docs_scored + or.result.stats.docs_scored,
    };
    let result = SearchResult {
        hits: crate::select::cpu::fill_and_or(and.result.hits, or.result.hits, query.k),
        select_us: and.result.select_us + or.result.select_us,
        stats,
    };
    Ok((
        Selected {
            result,
            side: or.side,
        },
        Some(and_hits),
    ))
}

/// `POST /v1/shard/search`.
#[utoipa::path(
    post,
    path = "/v1/shard/search",
    tag = "shards",
    request_body = ShardSearchRequest,
    responses(
        (status = 200, description = "The shard's candidates in selection order", body = ShardSearchResponse),
        (status = 404, description = "`unknown_ranker`", body = ErrorBody),
        (status = 503, description = "`no_index`, `gpu_unavailable`, or `overloaded`", body = ErrorBody),
        (status = 504, description = "`deadline_exceeded`", body = ErrorBody),
    )
)]
pub(super) async fn shard_search(
    Shared(state): Shared<AppState>,
    Negotiated(format): Negotiated,
    Coded {
        value: request,
        started: arrived,
        ..
    }: Coded<ShardSearchRequest>,
) -> Result<Reply<ShardSearchResponse>, ApiError> {
    let ShardSearchRequest {
        terms,
        k,
        candidates: wanted,
        mode,
        ranker,
        backend,
        explain,
        timeout_ms,
        collection,
    } = request;
    let search = SearchRequest {
        query: None,
        terms: Some(terms),
        k,
        candidates: wanted,
        mode,
        ranker,
        backend,
        explain,
        timeout_ms,
    };
    let Prepared {
        deadline,
        backend,
        terms,
        index,
        loaded,
        place: _place,
    } = prepare(&state, &search, arrived).await?;
    let distinct = dedup_terms(&terms).len();
    if collection.df.len() != distinct {
        return Err(ApiError::InvalidRequest(format!(
            "collection.df has {} entries for {distinct} distinct terms",
            collection.df.len()
        )));
    }
    let ranked = loaded.is_some();
    let mut query = selection_query(&index, terms, &search, ranked);
    query.collection = Some(Arc::new(Collection {
        docs: collection.docs,
        scoring_length: collection.scoring_length,
        df: collection.df.clone(),
    }));
    let (selected, and_hits, picked) = {
        let (state, index) = (Arc::clone(&state), Arc::clone(&index));
        let at = deadline.at;
        tokio::task::spawn_blocking(move || {
            let _stage = tracing::info_span!("shard_search", terms = query.terms.len()).entered();
            let (selected, and_hits) = select_counting_and(&state, &index, &query, backend, at)?;
            // The selection order, before `candidates` puts them in docID order for ranking.
            let picked = selected.result.hits.clone();
            let candidates = candidates(&index, &query.terms, selected, ranked, Some(&collection));
            Ok::<_, ApiError>((candidates, and_hits, picked))
        })
        .await
        .map_err(ApiError::internal)??
    };
    let Candidates {
        selected,
        hits,
        select_us,
        hits_us,
        select_side,
    } = selected;
    deadline.check()?;
    let ordered = match (loaded, hits) {
        (Some(loaded), Some(hits)) => {
            // Every candidate, with its ranker score, back in selection order.
            let every = SearchRequest {
                k: selected.len(),
                ..search
            };
            let mut ordered =
                rank_candidates(&state, &index, loaded, &selected, hits, &every, deadline).await?;
            let mut by_doc: HashMap<_, _> =
                (ordered.hits.drain(..)).map(|hit| (hit.doc, hit)).collect();
            ordered.hits = (picked.iter())
                .filter_map(|(doc, _)| by_doc.remove(doc))
                .collect();
            ordered
        }
        _ => bm25_order(&index, &picked, picked.len()),
    };
    let (timings, backends) = ordered.report(select_us, hits_us, select_side, arrived);
    Ok(Reply(
        format,
        ShardSearchResponse {
            hits: ordered.hits,
            and_hits,
            timings,
            backends,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fe_statistics_are_the_collections_and_leave_out_empty_streams() {
        let collection = CollectionStats {
            docs: 4,
            scoring_length: 10,
            stream_lengths: [("body".into(), 10), ("title".into(), 2), ("x".into(), 0)]
                .into_iter()
                .collect(),
            df: vec![1, 0, 4],
        };
        let (query, stats) = fe_statistics(&collection);
        assert_eq!(query.terms, 3);
        assert_eq!(
            query.idf,
            [bm25::idf(4, 1), bm25::idf(4, 0), bm25::idf(4, 4)]
        );
        assert_eq!(stats.avg_length.len(), 2);
        assert_eq!(stats.avg_length["body"], 2.5);
        assert_eq!(stats.avg_length["title"], 0.5);
    }
}
