//! The forward index's read on the ranking path: `Index::hits` over each query's candidates, as
//! `/v1/search` builds hit requests before ranking them (here on one thread).

use super::selection::Clock;
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
            for &d in docs {
                hits += count_hits(index, d, ids, &mut digest)?;
            }
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

/// Document `d`'s hit count, its hit request hashed into `digest`.
fn count_hits(
    index: &Index,
    d: DocId,
    ids: &[Option<TermId>],
    digest: &mut impl std::hash::Hasher,
) -> Result<u64, IndexError> {
    let streams = index.hits(d, ids)?.unwrap_or_default();
    for s in &streams {
        std::hash::Hash::hash(&(&s.stream, s.length, &s.phrases), digest);
    }
    Ok(streams
        .iter()
        .flat_map(|s| &s.phrases)
        .map(|p| p.len() as u64)
        .sum())
}
