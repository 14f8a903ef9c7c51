//! The wire types of the HTTP API (the same serde types for JSON and MessagePack), shared by
//! the server, the request-log synthesizer and the replayer (field by field in `docs/api.md`),
//! and the one path from a request body to the ranking stage's input: [`Format`] decodes a
//! body, [`RankBody`] holds a `/v1/rank` body (decoded, or framed for the fast MessagePack
//! reader, [`msgpack_rank`]) and turns its documents into feature rows.

pub mod format;
pub mod msgpack_rank;
pub mod rank_body;
pub mod shard;

pub use format::{BodyError, Format};
pub use rank_body::{feature_matrix, Framing, RankBody};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::backend::Backend;
use crate::rank::fe::{CorpusStats, HitDocument, QueryInfo};
use crate::rank::gpu::crossover::Crossover;

/// `POST /v1/rank` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RankRequest {
    /// The ranker's store name.
    pub ranker: String,
    /// At most [`MAX_DOCUMENTS`].
    #[serde(deserialize_with = "at_most_max_documents")]
    pub documents: Vec<RankDocument>,
    /// Needed when a document carries `hits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<QueryInfo>,
    /// Needed when a document carries `hits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<CorpusStats>,
    /// When given, the reply has `order`: the indices of the `k` best documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub explain: bool,
    /// Deadline from arrival; the configured default when absent; 0 is already expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The most documents one `/v1/rank` request may hold. A MessagePack document can be one
/// byte (`{}`) and decodes to a few hundred, so a body's documents are counted as they are
/// decoded: a 64 MiB body of empty documents would otherwise take tens of GB.
pub const MAX_DOCUMENTS: usize = 100_000;

/// The most feature values (documents × the ranker's features) one `/v1/rank` request may
/// make: the feature matrix, 8 bytes a value, is at most 128 MiB.
pub const MAX_FEATURE_VALUES: usize = 1 << 24;

/// `documents`, refused past [`MAX_DOCUMENTS`] (as the array's length is read, when the format
/// gives it first; else at the first document past the limit).
fn at_most_max_documents<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<RankDocument>, D::Error> {
    struct Documents;
    impl<'de> serde::de::Visitor<'de> for Documents {
        type Value = Vec<RankDocument>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "an array of at most {MAX_DOCUMENTS} documents")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let too_many = |len| serde::de::Error::invalid_length(len, &Documents);
            let announced = seq.size_hint().unwrap_or(0);
            if announced > MAX_DOCUMENTS {
                return Err(too_many(announced));
            }
            let mut documents = Vec::with_capacity(announced.min(4096));
            while let Some(document) = seq.next_element()? {
                if documents.len() == MAX_DOCUMENTS {
                    return Err(too_many(MAX_DOCUMENTS + 1));
                }
                documents.push(document);
            }
            Ok(documents)
        }
    }
    deserializer.deserialize_seq(Documents)
}

/// One document of a rank request: its feature vector, or its hits for feature extraction.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RankDocument {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<FeatureValues>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hits: Option<HitDocument>,
}

/// A feature vector: in the ranker's order, or by name (absent names are missing). `null` is a
/// missing value (NaN).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum FeatureValues {
    Vector(Vec<Option<f64>>),
    Named(BTreeMap<String, Option<f64>>),
}

/// An array is a `Vector`, a map `Named`, as an untagged enum would decide, but anything else
/// is refused saying what was expected (serde's untagged enums say only that no variant
/// matched) and a bad value inside says where.
impl<'de> Deserialize<'de> for FeatureValues {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Values;
        impl<'de> serde::de::Visitor<'de> for Values {
            type Value = FeatureValues;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array of numbers or nulls (in the ranker's feature order) or a map of feature name to number or null")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<Self::Value, A::Error> {
                Deserialize::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(FeatureValues::Vector)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                Deserialize::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(FeatureValues::Named)
            }
        }
        deserializer.deserialize_any(Values)
    }
}

/// `POST /v1/rank` reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RankResponse {
    /// One per document, in request order (`null` in JSON for a NaN).
    pub scores: Vec<Option<f64>>,
    /// With `k`: indices of the best `k` documents, best first, ties by smaller index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<usize>>,
    pub timings: Timings,
    /// The backend that ran: `cpu` or `gpu`.
    pub backend: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<Vec<Explanation>>,
}

/// Where the time of a rank request went, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Timings {
    /// Receiving the request body, from the headers' arrival to its last byte.
    #[serde(default)]
    pub read_us: u64,
    /// Decoding the request body (JSON or MessagePack), once it was read.
    #[serde(default)]
    pub decode_us: u64,
    /// Building the feature matrix (feature extraction for hit documents).
    pub fe_us: u64,
    /// Model-input transforms, when measured apart from `me_us` (the CPU backend measures
    /// them together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mit_us: Option<u64>,
    /// Model evaluation of the batch this request ran in.
    pub me_us: u64,
    /// Waiting for its batch to start (while the ranker's batch before it ran).
    pub queue_us: u64,
    /// Documents and requests of the batch this request ran in (1 request: it ran alone).
    #[serde(default)]
    pub batch_docs: usize,
    #[serde(default)]
    pub batch_requests: usize,
    /// From the request's headers arriving (before its body was read) to the reply being
    /// encoded.
    pub total_us: u64,
}

/// Per-document detail of an `explain` reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Explanation {
    /// `V`, in the ranker's feature order (`null` for a missing value in JSON).
    pub features: Vec<Option<f64>>,
    /// The model inputs (transforms and tree-input leaf values), in input order.
    pub inputs: Vec<Option<f32>>,
}

/// `GET /v1/rankers/{name}` reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RankerDescription {
    pub name: String,
    /// The feature vector's names, in order.
    pub features: Vec<String>,
    /// Model inputs counted by type (`linear`, `loglinear`, `bucket`, `freeform`, `tree`, `dummy`).
    pub inputs: BTreeMap<String, usize>,
    pub layers: Vec<LayerShape>,
    /// Trees of the ensemble.
    pub trees: usize,
    /// Estimated bytes in memory, parsed.
    pub bytes: u64,
    pub file_bytes: u64,
    /// Where a copy is resident: `cpu` (parsed, in the CPU cache), `gpu` (in the GPU cache).
    pub resident: Vec<String>,
    /// The measured CPU/GPU crossover: `docs`, the batch size from which the GPU is faster
    /// (`null` when it never was), and the timings it was decided from; `null` until measured
    /// (there is no GPU, or the ranker has not been used since it loaded).
    pub crossover: Option<Crossover>,
}

/// The shape of one NN layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LayerShape {
    pub inputs: usize,
    pub outputs: usize,
    pub activation: String,
}

/// `GET /v1/rankers` reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RankerList {
    pub rankers: Vec<crate::rank::store::StoredRanker>,
}

/// `GET /readyz` and `GET /healthz` reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    pub ready: bool,
    /// Rankers in the CPU cache.
    pub rankers_loaded: usize,
    /// What the GPU probe found (`null` while it runs).
    pub gpu: Option<String>,
}

/// `POST /v1/search` request (DESIGN §5; semantics of every field in `docs/api.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    /// Free text, tokenized like the documents. Give `query` or `terms`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// Terms looked up exactly as given (already tokenized).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terms: Option<Vec<String>>,
    /// Hits returned.
    #[serde(default = "default_k")]
    pub k: usize,
    /// Candidates selected by BM25 and passed to the ranker (at least `k` are taken).
    #[serde(default = "default_candidates")]
    pub candidates: usize,
    #[serde(default)]
    pub mode: crate::select::Mode,
    /// The ranker's store name; without it the hits are ranked by BM25 alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranker: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// With a ranker: each hit carries its feature vector and model inputs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub explain: bool,
    /// Deadline from arrival; the configured default when absent; 0 is already expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

fn default_k() -> usize {
    10
}

fn default_candidates() -> usize {
    1000
}

/// `POST /v1/search` reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SearchResponse {
    /// Best first; ties by smaller `doc`.
    pub hits: Vec<SearchHit>,
    pub timings: SearchTimings,
    pub backends: SearchBackends,
    /// From a broker only: which shards answered (`partial` when one did not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<shard::ShardsAnswered>,
}

/// One hit of a search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SearchHit {
    /// The document's number in the index (0..N, corpus order).
    #[schema(value_type = u32)]
    pub doc: crate::index::DocId,
    /// The document's external id.
    pub id: String,
    /// The ranker's score, or the BM25 score without a ranker (`null` in JSON for a NaN).
    pub score: Option<f64>,
    /// The BM25 score that selected it.
    pub selection_score: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<Explanation>,
}

/// Where the time of a search went, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SearchTimings {
    /// Candidate selection (the document stage).
    pub select_us: u64,
    /// Building hit requests from the forward index and feature extraction.
    pub fe_us: u64,
    /// Model-input transforms, when measured apart from `me_us`; `null` when the backend
    /// measures them together (the CPU) or no ranker ran.
    pub mit_us: Option<u64>,
    /// Model evaluation of the batch the candidates ran in (0 without a ranker).
    pub me_us: u64,
    /// Waiting for a batch (0 without a ranker).
    pub queue_us: u64,
    /// Arrival of the parsed request to the reply being encoded.
    pub total_us: u64,
}

/// Which backend ran each stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SearchBackends {
    /// `cpu` or `gpu`: the processor that selected the candidates.
    pub select: String,
    /// `cpu` or `gpu`; `none` when no ranker ran (BM25 order).
    pub rank: String,
}

/// `POST /v1/index/reload` request; an empty body is `{}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReloadRequest {
    /// The index directory to open; the one being served (else the configured one) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub dir: Option<std::path::PathBuf>,
}

/// `POST /v1/index/reload` reply: the index now served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct IndexDescription {
    /// The directory it was opened from.
    #[schema(value_type = String)]
    pub dir: std::path::PathBuf,
    pub docs: u64,
    pub terms: u64,
    /// `ef` or `pfor`.
    pub codec: String,
    /// The stream BM25 scores.
    pub scoring: String,
    /// Whether hit requests can be built (rankers can run on search results).
    pub forward: bool,
}
