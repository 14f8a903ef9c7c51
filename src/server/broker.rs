//! `/v1/search` on a broker ([`crate::broker`]): two fan-outs to the shards and the merge.
//!
//! 1. `POST /v1/shard/stats` with the query's distinct terms: each shard's documents, lengths
//!    and df of each term, summed into the collection's statistics. Asked per query, so a
//!    shard's reload is seen by the next query and no dictionary is held here.
//! 2. `POST /v1/shard/search` with them to the shards that answered 1: each shard scores as the
//!    whole collection and sends its best candidates (see `server::shard`).
//! 3. The merge ([`merge`]). A shard that did not answer either call within the per-shard
//!    timeout is left out and named in `shards.missing` (`partial`); a shard's 4xx (the
//!    request's fault) is the reply; no shard answering is 503 `shards_unavailable`.

use std::time::Instant;

use super::codec::micros;
use super::error::ApiError;
use super::search::{query_terms, Deadline};
use super::state::AppState;
use crate::api::shard::{
    CollectionStats, MissingShard, ShardSearchRequest, ShardSearchResponse, ShardStats,
    ShardStatsRequest, ShardsAnswered,
};
use crate::api::{SearchBackends, SearchRequest, SearchResponse, SearchTimings};
use crate::broker::merge::{merge, ShardHits};
use crate::broker::{Broker, Outcome};
use crate::select::dedup_terms;

/// The shards that answered a fan-out, with their answers, and the missing ones named in
/// `missing`; a refusal is returned as the error.
fn sort_out<T>(
    broker: &Broker,
    which: &[usize],
    outcomes: Vec<Outcome<T>>,
    missing: &mut Vec<MissingShard>,
) -> Result<Vec<(usize, T)>, ApiError> {
    let mut answered = Vec::with_capacity(outcomes.len());
    for (&i, outcome) in which.iter().zip(outcomes) {
        match outcome {
            Outcome::Answered(value) => answered.push((i, value)),
            Outcome::Refused {
                status,
                code,
                message,
            } => {
                return Err(ApiError::ShardRefused {
                    status: axum::http::StatusCode::from_u16(status)
                        .unwrap_or(axum::http::StatusCode::BAD_REQUEST),
                    code,
                    message,
                })
            }
            Outcome::Missing(reason) => missing.push(MissingShard {
                shard: broker.shards()[i].name.clone(),
                reason,
            }),
        }
    }
    Ok(answered)
}

/// The collection's statistics: the shards' sums. Their docID ranges must not overlap.
///
/// # Errors
/// [`ApiError::Internal`] when two shards' ranges overlap (the shard list names a shard twice
/// under two URLs, or shards of different builds).
fn collection_of(
    broker: &Broker,
    stats: &[(usize, ShardStats)],
) -> Result<CollectionStats, ApiError> {
    let mut ranges: Vec<_> = (stats.iter())
        .map(|(i, s)| {
            let offset = s.shard.map_or(0, |info| info.doc_offset);
            (offset, offset + s.docs, *i)
        })
        .collect();
    ranges.sort_unstable();
    if let Some(w) = ranges.windows(2).find(|w| w[0].1 > w[1].0) {
        return Err(ApiError::internal(format!(
            "shards {} and {} hold overlapping docIDs ({}..{} and {}..{}): check their shard.json",
            broker.shards()[w[0].2].name,
            broker.shards()[w[1].2].name,
            w[0].0,
            w[0].1,
            w[1].0,
            w[1].1
        )));
    }
    let terms = stats.first().map_or(0, |(_, s)| s.df.len());
    let mut collection = CollectionStats {
        docs: 0,
        scoring_length: 0,
        stream_lengths: Default::default(),
        df: vec![0; terms],
    };
    for (_, s) in stats {
        collection.docs += s.docs;
        collection.scoring_length += s.scoring_length;
        for (name, length) in &s.stream_lengths {
            *collection.stream_lengths.entry(name.clone()).or_default() += length;
        }
        for (total, df) in collection.df.iter_mut().zip(&s.df) {
            *total += df;
        }
    }
    Ok(collection)
}

/// `/v1/search` answered by `broker`'s shards (the module docs).
///
/// # Errors
/// `invalid_request` (the terms), a shard's 4xx, 503 `shards_unavailable`, 504
/// `deadline_exceeded` when the request's deadline passed during a fan-out.
pub(super) async fn search(
    state: &AppState,
    broker: &Broker,
    request: SearchRequest,
    arrived: Instant,
) -> Result<SearchResponse, ApiError> {
    let deadline = Deadline::of(state, request.timeout_ms, arrived);
    let terms = query_terms(&request)?;
    let distinct: Vec<String> = dedup_terms(&terms).into_iter().map(String::from).collect();
    let mut missing = Vec::new();
    let all: Vec<usize> = (0..broker.shards().len()).collect();
    let stats_request = ShardStatsRequest {
        terms: distinct.clone(),
    };
    let outcomes = (broker)
        .fan_out::<_, ShardStats>(
            &all,
            "/v1/shard/stats",
            "stats",
            &stats_request,
            deadline.at,
        )
        .await;
    let stats = sort_out(broker, &all, outcomes, &mut missing)?;
    deadline.check()?;
    let collection = collection_of(broker, &stats)?;
    let offsets: Vec<u64> = (stats.iter())
        .map(|(_, s)| s.shard.map_or(0, |info| info.doc_offset))
        .collect();
    let asked: Vec<usize> = stats.iter().map(|&(i, _)| i).collect();
    let wanted = request.candidates.max(request.k);
    let search = ShardSearchRequest {
        terms: distinct,
        k: request.k,
        candidates: request.candidates,
        mode: request.mode,
        ranker: request.ranker.clone(),
        backend: request.backend,
        explain: request.explain,
        timeout_ms: deadline
            .at
            .map(|at| micros(at.saturating_duration_since(Instant::now())) / 1000),
        collection,
    };
    let outcomes = (broker)
        .fan_out::<_, ShardSearchResponse>(
            &asked,
            "/v1/shard/search",
            "search",
            &search,
            deadline.at,
        )
        .await;
    let answers = sort_out(broker, &asked, outcomes, &mut missing)?;
    deadline.check()?;
    if answers.is_empty() {
        let missing: Vec<String> = (missing.iter())
            .map(|m| format!("{} ({})", m.shard, m.reason))
            .collect();
        return Err(ApiError::NoShardAnswered {
            missing: missing.join(", "),
        });
    }
    let ranked = answers.iter().any(|(_, a)| a.backends.rank != "none");
    let mut timings = SearchTimings {
        select_us: 0,
        fe_us: 0,
        mit_us: None,
        me_us: 0,
        queue_us: 0,
        total_us: 0,
    };
    let backends = answers[0].1.backends.clone();
    let shard_hits: Vec<ShardHits> = (answers.into_iter())
        .map(|(i, answer)| {
            let offset = offsets[asked.iter().position(|&a| a == i).expect("asked")];
            // The slowest shard's step times: the steps ran at once.
            let t = answer.timings;
            timings.select_us = timings.select_us.max(t.select_us);
            timings.fe_us = timings.fe_us.max(t.fe_us);
            timings.me_us = timings.me_us.max(t.me_us);
            timings.queue_us = timings.queue_us.max(t.queue_us);
            ShardHits {
                hits: (answer.hits.into_iter())
                    .map(|mut hit| {
                        hit.doc = (offset + hit.doc as u64) as u32;
                        hit
                    })
                    .collect(),
                and_hits: answer.and_hits,
            }
        })
        .collect();
    let hits = merge(shard_hits, request.mode, wanted, request.k, ranked);
    if !missing.is_empty() {
        metrics::counter!("rankserve_broker_partial_total").increment(1);
        tracing::warn!(missing = ?missing, "partial search: shards missing");
    }
    timings.total_us = micros(arrived.elapsed());
    Ok(SearchResponse {
        hits,
        timings,
        backends: SearchBackends {
            select: backends.select,
            rank: backends.rank,
        },
        shards: Some(ShardsAnswered {
            partial: !missing.is_empty(),
            asked: broker.shards().len(),
            missing,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::shard::ShardInfo;

    fn stats(offset: u64, docs: u64, df: &[u64]) -> ShardStats {
        ShardStats {
            shard: Some(ShardInfo {
                shard: 0,
                shards: 2,
                doc_offset: offset,
                collection_docs: 10,
            }),
            docs,
            scoring_length: docs * 3,
            stream_lengths: [("body".to_string(), docs * 3), (format!("s{offset}"), 1)]
                .into_iter()
                .collect(),
            df: df.to_vec(),
        }
    }

    #[test]
    fn the_collection_is_the_sum_of_its_shards_whose_ranges_must_not_overlap() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("shards.toml");
        let text = "[[shards]]\nname = \"a\"\nurl = \"http://a:1\"\n[[shards]]\nname = \"b\"\nurl = \"http://b:1\"\n";
        std::fs::write(&list, text).unwrap();
        let broker = Broker::open(&list).unwrap();
        let collection = collection_of(
            &broker,
            &[(0, stats(0, 6, &[1, 0])), (1, stats(6, 4, &[2, 5]))],
        )
        .unwrap();
        assert_eq!((collection.docs, collection.scoring_length), (10, 30));
        assert_eq!(collection.df, [3, 5]);
        assert_eq!(collection.stream_lengths["body"], 30);
        assert_eq!(collection.stream_lengths["s6"], 1);
        let overlap = collection_of(&broker, &[(0, stats(0, 6, &[])), (1, stats(5, 4, &[]))]);
        assert!(
            matches!(overlap, Err(ApiError::Internal { detail }) if detail.contains("shards a and b hold overlapping docIDs (0..6 and 5..9)"))
        );
    }
}
