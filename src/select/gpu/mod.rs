//! The document stage on the GPU (host side): posting lists resident in the posting cache or
//! copied per query ([`cache`]), every list of a query decoded in one launch over a block table
//! ([`decode`]: `kernels/pfor.cu`, `kernels/ef.cu`); OR queries scored term at a time into dense
//! accumulators ([`or`]) and AND queries by a binary search per candidate ([`and`]), both with a
//! top-k on the device ([`topk`]; the kernels are `kernels/score.cu`). [`phases`] times a
//! query's steps with CUDA events for `rankserve bench selection --gpu`.
//! AND runs one intersection step at a time (`kernels/intersect.cu`), by merge path, binary
//! search, or binary search over the skip entries of a much longer list with only its
//! candidates' blocks decoded, and may hand the survivors to the CPU between steps ([`and`]);
//! AND_OR is AND, then OR when AND found fewer than k ([`search_and_or`]).
//!
//! The CPU ([`crate::select::cpu`]) is the reference: GPU results are the same documents in the
//! same order with bit-identical scores (DESIGN §5), which `tests/selection_gpu.rs` checks.
//! [`crate::select::schedule`] chooses between this path and the CPU per query, and for AND
//! per step.

pub mod and;
pub mod cache;
pub mod decode;
pub mod or;
pub mod phases;
mod topk;

pub use and::{search_and, AndPlan, Step};
pub use cache::{PostingCache, PostingCacheConfig, PostingCacheStats};
pub use decode::{DecodeTiming, DecodedBlocks, PackedLists};
pub use or::search_or;
pub use phases::SelectPhases;

use std::time::Instant;

use super::{check_params, cpu, Query, QueryTerms, SearchResult, SelectError, SelectStats};
use crate::gpu::GpuError;
use crate::index::{DocId, Index};

/// Why a GPU selection failed: the query itself (the CPU refuses it too), or the device (the
/// caller runs the query on the CPU instead).
#[derive(Debug, thiserror::Error)]
pub enum GpuSelectError {
    /// The query is invalid on any backend.
    #[error(transparent)]
    Query(#[from] SelectError),
    /// A device error: allocation, copy, launch or a limit of the kernels.
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// Checks `query`'s BM25 parameters as the CPU does, then runs `top_k` (one mode's device work)
/// and times it into a [`SearchResult`].
fn timed_search(
    query: &Query,
    top_k: impl FnOnce(&mut SelectStats) -> Result<Vec<(DocId, f64)>, GpuError>,
) -> Result<SearchResult, GpuSelectError> {
    check_params(query.params)?;
    let started = Instant::now();
    let mut stats = SelectStats::default();
    let hits = top_k(&mut stats)?;
    Ok(SearchResult {
        hits,
        select_us: started.elapsed().as_micros() as u64,
        stats,
    })
}

/// Runs one query in AND_OR mode on the GPU (whatever `query.mode` says): AND as `plan` says,
/// then, when AND found fewer than k documents, OR, filled as the CPU fills them
/// ([`cpu::fill_and_or`]): the same hits as [`crate::select::search`] with
/// [`crate::select::Mode::AndOr`], with bit-identical scores.
///
/// # Errors
/// As [`search_and`] and [`search_or`].
pub fn search_and_or(
    cache: &mut PostingCache,
    index: &Index,
    query: &Query,
    terms: &QueryTerms,
    plan: &AndPlan,
) -> Result<SearchResult, GpuSelectError> {
    timed_search(query, |stats| {
        let and = and::and_topk(cache, index, query, terms, plan, stats)?;
        if and.len() >= query.k {
            return Ok(and);
        }
        let or = or::or_topk(cache, index, query, terms, stats)?;
        Ok(cpu::fill_and_or(and, or, query.k))
    })
}
