//! Binding a ranker's feature map to feature extraction: [`FeatureResolver`] maps each of the
//! ranker's feature names to a catalogue feature or a static feature once, at load time, and then
//! writes each document's `V` in the ranker's order.
//!
//! Extraction computes the whole catalogue in one walk into a per-thread scratch vector and
//! gathers the ranker's features from it: the walk over the hits dominates the cost, and the
//! gather is a few nanoseconds per feature (measurements in `docs/benchmarks.md`).

use std::cell::RefCell;

use rayon::prelude::*;

use super::catalogue::{catalogue_index, STATIC_PREFIX};
use super::fsm::{extract_all, Prepared, Scratch};
use super::hits::{CorpusStats, HitDocument, HitError, QueryInfo};

/// A ranker feature name that feature extraction cannot produce.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeError {
    /// Neither a catalogue feature nor `static.<name>`.
    #[error(
        "features[{index}]: unknown feature {name:?}: expected a catalogue feature \
         (docs/features.md, e.g. \"body.bm25f\") or \"static.<name>\""
    )]
    UnknownFeature {
        /// Position in the ranker's feature map.
        index: usize,
        /// The name given.
        name: String,
    },
}

/// Where one entry of `V` comes from.
#[derive(Debug, Clone, PartialEq)]
enum Source {
    /// An index into the catalogue.
    Catalogue(usize),
    /// A key of the document's static map (without the `static.` prefix).
    Static(String),
}

/// A ranker's feature map resolved against the catalogue.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureResolver {
    sources: Vec<Source>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl FeatureResolver {
    /// Resolves `features` (a ranker's feature map, in order).
    ///
    /// # Errors
    /// [`FeError::UnknownFeature`] for the first name that is neither a catalogue feature nor
    /// `static.<non-empty name>`.
    pub fn new(features: &[String]) -> Result<FeatureResolver, FeError> {
        let sources = features
            .iter()
            .enumerate()
            .map(|(index, name)| {
                if let Some(i) = catalogue_index(name) {
                    return Ok(Source::Catalogue(i));
                }
                match name.strip_prefix(STATIC_PREFIX) {
                    Some(key) if !key.is_empty() => Ok(Source::Static(key.to_string())),
                    _ => Err(FeError::UnknownFeature {
                        index,
                        name: name.clone(),
                    }),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(FeatureResolver { sources })
    }

    /// Number of features written per document (the ranker's `V` length).
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// Whether the feature map is empty.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// Extracts one document's `V` into `out` (the ranker's order): catalogue features from the
    /// hits, `static.<name>` from the document's static map (NaN, a missing value, when absent).
    ///
    /// # Errors
    /// Any [`HitError`] of the query, the statistics or the document (the error has no batch
    /// index); [`HitError::OutputLength`] when `out.len() != self.len()`. On error `out`'s
    /// contents are unspecified.
    pub fn extract(
        &self,
        query: &QueryInfo,
        stats: &CorpusStats,
        doc: &HitDocument,
        out: &mut [f64],
    ) -> Result<(), HitError> {
        self.check_output(1, out.len())?;
        let prepared = Prepared::new(query, stats)?;
        SCRATCH.with_borrow_mut(|scratch| self.extract_prepared(&prepared, doc, scratch, out))
    }

    /// Extracts a batch: `out` is row-major `docs.len() × self.len()`. `threads <= 1` runs on
    /// the calling thread, otherwise the documents are split into `threads` contiguous chunks
    /// run on rayon's pool. The values never depend on `threads`.
    ///
    /// # Errors
    /// As [`FeatureResolver::extract`]; a document error carries the document's batch index,
    /// and is the one of the lowest index whatever `threads` is. On error `out`'s contents are
    /// unspecified.
    pub fn extract_batch(
        &self,
        query: &QueryInfo,
        stats: &CorpusStats,
        docs: &[HitDocument],
        out: &mut [f64],
        threads: usize,
    ) -> Result<(), HitError> {
        self.check_output(docs.len(), out.len())?;
        let prepared = Prepared::new(query, stats)?;
        let width = self.len();
        if docs.is_empty() {
            return Ok(());
        }
        let run_chunk = |first: usize, docs: &[HitDocument], out: &mut [f64]| {
            SCRATCH.with_borrow_mut(|scratch| {
                for (i, doc) in docs.iter().enumerate() {
                    let row = &mut out[i * width..(i + 1) * width];
                    self.extract_prepared(&prepared, doc, scratch, row)
                        .map_err(|e| e.at_index(first + i))?;
                }
                Ok(())
            })
        };
        // A zero-width map still validates every document, on one thread.
        if threads <= 1 || docs.len() == 1 || width == 0 {
            return run_chunk(0, docs, out);
        }
        let per_chunk = docs.len().div_ceil(threads);
        let results: Vec<Result<(), HitError>> = docs
            .par_chunks(per_chunk)
            .zip(out.par_chunks_mut(per_chunk * width))
            .enumerate()
            .map(|(c, (docs, out))| run_chunk(c * per_chunk, docs, out))
            .collect();
        results.into_iter().collect()
    }

    fn check_output(&self, docs: usize, got: usize) -> Result<(), HitError> {
        let expected = docs * self.len();
        if got != expected {
            return Err(HitError::OutputLength {
                expected,
                got,
                docs,
                features: self.len(),
            });
        }
        Ok(())
    }

    fn extract_prepared(
        &self,
        query: &Prepared<'_>,
        doc: &HitDocument,
        scratch: &mut Scratch,
        out: &mut [f64],
    ) -> Result<(), HitError> {
        extract_all(query, doc, scratch)?;
        for (slot, source) in out.iter_mut().zip(&self.sources) {
            *slot = match source {
                Source::Catalogue(i) => scratch.features[*i],
                Source::Static(key) => doc.static_features.get(key).copied().unwrap_or(f64::NAN),
            };
        }
        Ok(())
    }
}
