//! Wire types of the shard routes a broker calls (`POST /v1/shard/stats`,
//! `POST /v1/shard/search`) and of the broker's report in a `/v1/search` reply; semantics in
//! `docs/api.md`, "Shards and the broker".

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{SearchBackends, SearchHit, SearchTimings};
use crate::backend::Backend;
use crate::index::shard::ShardInfo;

/// `POST /v1/shard/stats` request: the terms whose document frequencies are wanted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShardStatsRequest {
    /// Terms looked up exactly as given.
    #[serde(default)]
    pub terms: Vec<String>,
}

/// `POST /v1/shard/stats` reply: what the served index adds to the collection's BM25 and FE
/// statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ShardStats {
    /// The index's `shard.json`; `null` for an index built whole (its docIDs start at 0).
    pub shard: Option<ShardInfo>,
    /// Documents in the index.
    pub docs: u64,
    /// Sum of the documents' scoring lengths.
    pub scoring_length: u64,
    /// Per stream, the sum of its lengths over the documents.
    pub stream_lengths: BTreeMap<String, u64>,
    /// Per term of the request, in order: its document frequency in the scoring stream (0 when
    /// the index does not have it).
    pub df: Vec<u64>,
}

/// The collection's statistics, summed over every shard, sent with a shard search so that the
/// shard scores as the whole collection indexed as one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CollectionStats {
    /// Documents in the collection (BM25's N).
    pub docs: u64,
    /// Sum of the scoring lengths (avgdl = this / docs).
    pub scoring_length: u64,
    /// Per stream, the sum of its lengths (FE's average lengths = these / docs).
    pub stream_lengths: BTreeMap<String, u64>,
    /// Per term of the request's `terms`, in order, its document frequency.
    pub df: Vec<u64>,
}

/// `POST /v1/shard/search` request: `/v1/search`'s fields with the terms already tokenized and
/// distinct, and the collection's statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShardSearchRequest {
    /// Distinct terms, looked up exactly as given.
    pub terms: Vec<String>,
    pub k: usize,
    pub candidates: usize,
    #[serde(default)]
    pub mode: crate::select::Mode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranker: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub explain: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    pub collection: CollectionStats,
}

/// `POST /v1/shard/search` reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ShardSearchResponse {
    /// The shard's candidates (`doc` numbered in the shard) in selection order: BM25 best
    /// first, ties by smaller `doc`; `and_or`'s conjunctive matches before the others. Without a
    /// ranker the best `k`, with one the best `max(k, candidates)`, each with its ranker score.
    pub hits: Vec<SearchHit>,
    /// `and_or` only: how many of the first hits hold every term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub and_hits: Option<usize>,
    pub timings: SearchTimings,
    pub backends: SearchBackends,
}

/// A broker's `/v1/search` reply says which shards answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ShardsAnswered {
    /// Whether a shard did not answer: the hits are then those of the shards that did.
    pub partial: bool,
    /// Shards asked.
    pub asked: usize,
    /// The shards that did not answer, and why.
    pub missing: Vec<MissingShard>,
}

/// A shard that did not answer a broker's search.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MissingShard {
    /// Its name in the broker's shard list.
    pub shard: String,
    /// Why: a timeout, a refused connection, or its error reply.
    pub reason: String,
}
