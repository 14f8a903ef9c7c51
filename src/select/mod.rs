//! The document stage: candidate selection over an [`Index`] with BM25 and top-k.
//!
//! [`search`] runs one [`Query`] on the CPU ([`cpu`], the reference implementation that the GPU
//! path must match bit for bit); [`search_batch`] runs many, in parallel across queries.
//!
//! Query semantics (documented in `docs/index-format.md` § Query processing):
//! - Terms are looked up exactly as given (use [`Query::from_text`] to tokenize text the way
//!   documents were); duplicates are removed, keeping the first occurrence, and that order is
//!   the order in which contributions are summed.
//! - `and`: documents whose scoring stream holds every query term. A term that is not in the
//!   index (or never occurs in the scoring stream) therefore makes the AND result empty.
//! - `or`: documents holding at least one known term.
//! - `and_or`: the AND results first (in score order); when there are fewer than k of them,
//!   the best remaining OR results (documents not already listed, in score order) fill up to k.
//!   So a document holding every term always ranks above one that does not.
//! - An empty query, a query of unknown terms only (in `and` mode: any unknown term) or k = 0
//!   returns no hits; k larger than the collection returns every matching document. Terms of
//!   any length (10 000 characters included) are simply looked up; such a term is unknown.

pub mod bm25;
pub mod cpu;
pub mod engine;
pub mod gpu;
pub mod schedule;
pub mod topk;

use serde::{Deserialize, Serialize};

use crate::index::tokenize::Tokenizer;
use crate::index::{DocId, Index, PostingList, TermId};
pub use bm25::Bm25Params;

/// How query terms combine.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Serialize,
    Deserialize,
    clap::ValueEnum,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Every term must occur.
    #[default]
    And,
    /// Any term may occur.
    Or,
    /// AND, filled up with OR results when AND has fewer than k.
    AndOr,
}

/// One selection query.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// Terms, looked up exactly (already tokenized).
    pub terms: Vec<String>,
    /// How many hits to return.
    pub k: usize,
    /// AND, OR or AND_OR.
    pub mode: Mode,
    /// BM25 parameters for this query.
    pub params: Bm25Params,
    /// Collection-wide statistics that replace the index's own (a shard scoring as the whole
    /// collection); `None`: the index's.
    pub collection: Option<std::sync::Arc<Collection>>,
}

/// The statistics BM25 takes from the collection, when the index searched is one shard of it:
/// with them a shard's scores are those of the whole collection indexed as one
/// (`docs/deploy.md`, "Shards").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collection {
    /// N: documents in the collection.
    pub docs: u64,
    /// Sum of the scoring lengths (avgdl = this / N, as [`Index::avg_scoring_length`]).
    pub scoring_length: u64,
    /// Document frequency of each distinct query term (first-occurrence order, as
    /// [`dedup_terms`]); the caller checks the count.
    pub df: Vec<u64>,
}

impl Collection {
    /// avgdl, in f64, computed exactly as an index computes its own.
    pub fn avg_scoring_length(&self) -> f64 {
        match self.docs {
            0 => 0.0,
            n => self.scoring_length as f64 / n as f64,
        }
    }
}

impl Query {
    /// A query with DESIGN §5's BM25 defaults.
    pub fn new(terms: Vec<String>, k: usize, mode: Mode) -> Self {
        Self {
            terms,
            k,
            mode,
            params: Bm25Params::default(),
            collection: None,
        }
    }

    /// The scorer of distinct query term `qi` whose posting list in `index` has `df` postings:
    /// with the collection's statistics when the query carries them, else the index's.
    pub fn term_scorer(&self, index: &Index, qi: usize, df: u32) -> bm25::TermScorer {
        match &self.collection {
            // The index's block-max entries were chosen at its own mean length.
            Some(c) => bm25::TermScorer::new(self.params, c.docs, c.df[qi], c.avg_scoring_length())
                .with_entry_avgdl(index.avg_scoring_length()),
            None => bm25::TermScorer::new(
                self.params,
                index.num_docs() as u64,
                df as u64,
                index.avg_scoring_length(),
            ),
        }
    }

    /// A query from free text, tokenized like the documents.
    pub fn from_text(text: &str, k: usize, mode: Mode) -> Self {
        Self::new(Tokenizer::new().tokens(text), k, mode)
    }
}

/// Why a query was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectError {
    /// A BM25 parameter out of range.
    #[error("invalid BM25 parameter {name}: expected {expected}, got {got}")]
    InvalidParameter {
        /// `k1` or `b`.
        name: &'static str,
        /// The accepted range.
        expected: &'static str,
        /// The value given.
        got: f32,
    },
}

/// Counters of the work a query did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SelectStats {
    /// Posting blocks whose docIDs were decoded.
    pub blocks_decoded: u64,
    /// Documents whose full score was computed.
    pub docs_scored: u64,
}

/// A query's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchResult {
    /// (docID, BM25 score), best first, ties by smaller docID.
    pub hits: Vec<(DocId, f64)>,
    /// Wall-clock microseconds spent selecting.
    pub select_us: u64,
    /// Work counters.
    pub stats: SelectStats,
}

/// Runs one query on the CPU.
///
/// # Errors
/// [`SelectError::InvalidParameter`] when k1 < 0, k1 is not finite, or b is outside [0, 1].
pub fn search(index: &Index, query: &Query) -> Result<SearchResult, SelectError> {
    search_terms(index, query, &QueryTerms::of(index, query))
}

/// [`search`] with the query's terms already looked up (`terms` must be
/// [`QueryTerms::of`] this index and query).
///
/// # Errors
/// As [`search`].
pub fn search_terms(
    index: &Index,
    query: &Query,
    terms: &QueryTerms,
) -> Result<SearchResult, SelectError> {
    check_params(query.params)?;
    let started = std::time::Instant::now();
    let (hits, stats) = cpu::run(index, query, terms);
    Ok(SearchResult {
        hits,
        select_us: started.elapsed().as_micros() as u64,
        stats,
    })
}

/// Checks a query's BM25 parameters (both backends refuse the same queries).
///
/// # Errors
/// [`SelectError::InvalidParameter`] when k1 < 0, k1 is not finite, or b is outside [0, 1].
pub fn check_params(p: Bm25Params) -> Result<(), SelectError> {
    if !(p.k1.is_finite() && p.k1 >= 0.0) {
        return Err(SelectError::InvalidParameter {
            name: "k1",
            expected: "a finite number ≥ 0",
            got: p.k1,
        });
    }
    if !(0.0..=1.0).contains(&p.b) {
        return Err(SelectError::InvalidParameter {
            name: "b",
            expected: "a number in [0, 1]",
            got: p.b,
        });
    }
    Ok(())
}

/// Runs many queries, in parallel across queries (rayon's current pool), results in order.
pub fn search_batch(index: &Index, queries: &[Query]) -> Vec<Result<SearchResult, SelectError>> {
    use rayon::prelude::*;
    queries.par_iter().map(|q| search(index, q)).collect()
}

/// A query term's posting list, or `None` when the term is not in the index or never occurs in
/// its scoring stream (df = 0).
pub fn term_list<'a>(index: &'a Index, term: &str) -> Option<PostingList<'a>> {
    term_id_list(index, term).map(|(_, list)| list)
}

/// [`term_list`] with the term's id.
pub fn term_id_list<'a>(index: &'a Index, term: &str) -> Option<(TermId, PostingList<'a>)> {
    let id = index.term_id(term)?;
    let list = index.postings(id);
    (list.df > 0).then_some((id, list))
}

/// A query's distinct terms (first-occurrence order) looked up in the index once, so that the
/// scheduler's estimate and the search share the lookups (each a binary search over the sorted
/// terms; the scheduler's second lookup cost 0.5–1.1 µs a query on the H100 host at 3 M
/// documents, `docs/benchmarks-history.md`, issue 6, run E).
#[derive(Debug, Clone)]
pub struct QueryTerms<'a> {
    /// Per distinct term, its id and posting list ([`term_id_list`]; `None`: not in the index).
    pub lists: Vec<Option<(TermId, PostingList<'a>)>>,
}

impl<'a> QueryTerms<'a> {
    pub fn of(index: &'a Index, query: &Query) -> QueryTerms<'a> {
        QueryTerms {
            lists: dedup_terms(&query.terms)
                .into_iter()
                .map(|term| term_id_list(index, term))
                .collect(),
        }
    }
}

/// The query's distinct terms in first-occurrence order.
pub fn dedup_terms(terms: &[String]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::with_capacity(terms.len());
    for t in terms {
        if !out.contains(&t.as_str()) {
            out.push(t);
        }
    }
    out
}
