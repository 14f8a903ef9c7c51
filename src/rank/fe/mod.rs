//! Feature extraction (FE): turns a hit request (one document seen by one query: streams →
//! phrases → word hits) into the feature vector `V` a ranker reads.
//!
//! - [`catalogue`]: the names of every feature FE publishes, in a fixed order
//!   ([`feature_names`]); definitions in `docs/features.md`.

pub mod catalogue;

pub use catalogue::{feature_names, STATIC_PREFIX, STREAMS};
