//! The document stage on the GPU (host side): posting lists resident in the posting cache or
//! copied per query ([`cache`]), every list of a query decoded in one launch over a block table
//! ([`decode`]: `kernels/pfor.cu`, `kernels/ef.cu`); OR queries scored term at a time into dense
//! accumulators ([`or`]) and AND queries by a binary search per candidate ([`and`]), both with a
//! top-k on the device ([`topk`]; the kernels are `kernels/score.cu`). [`phases`] times a
//! query's steps with CUDA events for `rankserve bench selection --gpu`.
//!
//! The CPU ([`crate::select::cpu`]) is the reference: GPU results are the same documents in the
//! same order with bit-identical scores (DESIGN §5), which `tests/selection_gpu.rs` checks.
//! [`crate::select::schedule`] chooses between this path and the CPU per query. Not built yet:
//! merge-path intersection, AND_OR.

pub mod and;
pub mod cache;
pub mod decode;
pub mod or;
pub mod phases;
mod topk;

pub use and::search_and;
pub use cache::{PostingCache, PostingCacheConfig, PostingCacheStats};
pub use decode::{DecodeTiming, DecodedBlocks, PackedLists};
pub use or::search_or;
pub use phases::SelectPhases;

use std::time::Instant;

use super::{check_params, Query, SearchResult, SelectError, SelectStats};
use crate::gpu::GpuError;
use crate::index::DocId;

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
