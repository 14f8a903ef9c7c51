//! The document stage's benchmark: each query of a file run alone on one thread (the
//! single-thread latency that peers such as Tantivy and PISA report), with its top-k, so that a
//! peer's results on the same queries can be compared document by document
//! (`scripts/tantivy_compare.py` does).

use std::time::Instant;

use serde::Serialize;

use crate::index::Index;
use crate::select::{search, Bm25Params, Mode, Query, SelectError};

/// What to run.
#[derive(Debug, Clone)]
pub struct SelectionConfig {
    pub mode: Mode,
    pub k: usize,
    pub params: Bm25Params,
    /// Timed runs per query after one warm-up; the median is kept.
    pub reps: usize,
}

/// One query's result.
#[derive(Debug, Clone, Serialize)]
pub struct QueryRun {
    pub query: String,
    /// Median wall time of one run, microseconds.
    pub us: f64,
    /// The top-k: the documents' ids (the corpus's `id`), best first.
    pub ids: Vec<String>,
    pub scores: Vec<f64>,
    pub blocks_decoded: u64,
    pub docs_scored: u64,
}

/// Latency percentiles over queries, microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LatencySummary {
    pub queries: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl LatencySummary {
    /// The summary of `runs` (all zero when there are none).
    pub fn of(runs: &[QueryRun]) -> LatencySummary {
        let mut us: Vec<f64> = runs.iter().map(|r| r.us).collect();
        us.sort_by(f64::total_cmp);
        let at = |q: f64| {
            us.get(((us.len() as f64 * q).ceil() as usize).saturating_sub(1))
                .copied()
                .unwrap_or(0.0)
        };
        LatencySummary {
            queries: us.len(),
            mean: us.iter().sum::<f64>() / us.len().max(1) as f64,
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: us.last().copied().unwrap_or(0.0),
        }
    }
}

/// Runs every query of `queries` (text, tokenized like the documents) on the calling thread.
///
/// # Errors
/// [`SelectError::InvalidParameter`] for BM25 parameters out of range.
pub fn run(
    index: &Index,
    queries: &[String],
    config: &SelectionConfig,
) -> Result<Vec<QueryRun>, SelectError> {
    let mut runs = Vec::with_capacity(queries.len());
    for text in queries {
        let mut query = Query::from_text(text, config.k, config.mode);
        query.params = config.params;
        let mut result = search(index, &query)?;
        let mut times = Vec::with_capacity(config.reps);
        for _ in 0..config.reps.max(1) {
            let started = Instant::now();
            result = search(index, &query)?;
            times.push(started.elapsed().as_secs_f64() * 1e6);
        }
        times.sort_by(f64::total_cmp);
        runs.push(QueryRun {
            query: text.clone(),
            us: times[times.len() / 2],
            ids: result
                .hits
                .iter()
                .map(|&(doc, _)| index.doc_id(doc).to_string())
                .collect(),
            scores: result.hits.iter().map(|&(_, score)| score).collect(),
            blocks_decoded: result.stats.blocks_decoded,
            docs_scored: result.stats.docs_scored,
        });
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(us: f64) -> QueryRun {
        QueryRun {
            query: String::new(),
            us,
            ids: Vec::new(),
            scores: Vec::new(),
            blocks_decoded: 0,
            docs_scored: 0,
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let runs: Vec<QueryRun> = (1..=100).map(|i| run_of(f64::from(i))).collect();
        let s = LatencySummary::of(&runs);
        assert_eq!((s.p50, s.p90, s.p99, s.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(s.mean, 50.5);
        assert_eq!(LatencySummary::of(&[]).queries, 0);
    }
}
