//! Feature extraction (FE): turns a hit request (one document seen by one query: streams →
//! phrases → word hits) into the feature vector `V` a ranker reads.
//!
//! - [`catalogue`]: the names of every feature FE publishes, in a fixed order
//!   ([`feature_names`]); definitions in `docs/features.md`.
//! - [`hits`]: the hit request types and their validation.
//! - [`FeatureResolver`]: a ranker's feature map bound to the catalogue; writes each document's
//!   `V` in the ranker's order.
//! - [`synth_hit_documents`]: deterministic synthetic hit documents (benchmarks, tests).
//! - `fsm`: the one-pass state machines that compute every catalogue feature.

pub mod catalogue;
mod fsm;
pub mod hits;
mod resolver;
mod synth;

pub use catalogue::{feature_names, STATIC_PREFIX, STREAMS};
pub(crate) use fsm::Prepared;
pub use fsm::{BM25F_B, BM25F_K1, BM25F_WEIGHTS, BM25_B, BM25_K1};
pub use hits::{
    validate_document, CorpusStats, DocRef, HitDocument, HitError, HitRef, HitStream, Phrases,
    QueryInfo, Streams,
};
pub use resolver::{fill_rows_in_chunks, FeError, FeatureResolver, GatherMap};
pub use synth::{synth_corpus_stats, synth_hit_documents, synth_query};
