//! The forward index's read on the ranking path, as `/v1/search` builds hit requests before
//! ranking them (here on one thread): each query's needles once ([`Index::query_codes`]), then
//! [`Index::hits_into`] over its candidates, into a sink that counts and hashes the hits.

use std::hash::Hash;

use super::selection::Clock;
use crate::index::forward::HitsSink;
use crate::index::{DocId, Index, IndexError, TermId};
use crate::select::{self, Mode, Query};

/// What [`run`] measured.
#[derive(Debug, Clone)]
pub struct HitsRun {
    /// Documents read per pass (every query's candidates).
    pub docs: u64,
    /// Hits found per pass.
    pub hits: u64,
    /// A digest of every hit request read in a pass (stream names, lengths, phrases, hits): equal
    /// digests mean two indexes (two layouts of one corpus) gave the same hit requests.
    pub digest: u64,
    /// Microseconds per document, one entry per timed pass.
    pub us_per_doc: Vec<f64>,
}

/// Selects each query's top `candidates` documents in `mode` (untimed), then reads their hits
/// in one untimed pass and `passes` timed passes over the whole query set, each query's reads
/// timed on `clock`.
///
/// # Errors
/// [`IndexError::Corrupt`] for a forward-index entry that does not decode.
pub fn run(
    index: &Index,
    queries: &[String],
    candidates: usize,
    mode: Mode,
    passes: usize,
    clock: Clock,
) -> Result<HitsRun, IndexError> {
    let mut work: Vec<(Vec<Option<TermId>>, Vec<DocId>)> = Vec::with_capacity(queries.len());
    for text in queries {
        let query = Query::from_text(text, candidates, mode);
        let docs = (select::search(index, &query))
            .expect("default BM25 parameters are valid")
            .hits
            .into_iter()
            .map(|(d, _)| d);
        let mut terms = query.terms.clone();
        let mut seen = std::collections::HashSet::new();
        terms.retain(|t| seen.insert(t.clone()));
        let ids = terms.iter().map(|t| index.term_id(t)).collect();
        work.push((ids, docs.collect()));
    }
    let docs = work.iter().map(|(_, d)| d.len() as u64).sum();
    let mut run = HitsRun {
        docs,
        hits: 0,
        digest: 0,
        us_per_doc: Vec::with_capacity(passes),
    };
    for pass in 0..=passes {
        let (mut us, mut hits) = (0.0, 0u64);
        let mut digest = std::hash::DefaultHasher::new();
        for (ids, docs) in &work {
            let start = clock.now_us();
            let codes = index.query_codes(ids);
            let mut sink = CountHits {
                hits: 0,
                digest: &mut digest,
            };
            for &d in docs {
                index.hits_into(d, &codes, &mut sink)?;
            }
            hits += sink.hits;
            us += clock.now_us() - start;
        }
        run.hits = hits;
        run.digest = std::hash::Hasher::finish(&digest);
        if pass > 0 {
            run.us_per_doc.push(us / docs.max(1) as f64);
        }
    }
    Ok(run)
}

/// The served reading's sink for the benchmark: counts the hits and hashes every stream (its
/// index and length), hit and phrase end into `digest`.
struct CountHits<'a, H> {
    hits: u64,
    digest: &'a mut H,
}

impl<H: std::hash::Hasher> HitsSink for CountHits<'_, H> {
    fn stream(&mut self, stream: u32, length: u32) {
        (0u8, stream, length).hash(self.digest);
    }

    fn hit(&mut self, term: u32, position: u32) {
        self.hits += 1;
        (1u8, term, position).hash(self.digest);
    }

    fn phrase_end(&mut self) {
        2u8.hash(self.digest);
    }
}
