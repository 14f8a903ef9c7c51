//! AND queries on the GPU for lists of similar length: every term's list decoded whole, then one
//! thread per posting of the shortest list finds it in every other list by binary search (Ding
//! et al. WWW'09) and sums its contributions in query term order (`score_and`), so scores are
//! bit-identical to the CPU's AND; the top-k is shared with OR.
//!
//! Decoding whole lists is what makes this the path for lists of similar length: for a short
//! list against a long one the CPU (or a GPU search over skip entries, still to come) decodes
//! only the few blocks that can match. Merge-path intersection is still to come too.
//!
//! Every term's list is decoded in one launch ([`PostingCache::decode_query`]).
//!
//! Counters: `blocks_decoded` is every block of every term; `docs_scored` stays 0.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::cache::PostingCache;
use super::phases::{self, Mark};
use super::topk::top_k;
use super::GpuSelectError;
use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuError, KernelModule};
use crate::index::{DocId, Index, PostingList, TermId};
use crate::select::bm25::TermScorer;
use crate::select::{dedup_terms, term_id_list, Query, SearchResult, SelectStats};

/// Runs one query in AND mode on the GPU (whatever `query.mode` says): the same hits as
/// [`crate::select::search`] with [`crate::select::Mode::And`], in the same order, with
/// bit-identical scores.
///
/// # Errors
/// [`GpuSelectError::Query`] for invalid BM25 parameters (as the CPU); [`GpuSelectError::Gpu`]
/// when a device allocation, copy or launch fails, or the query's lists exceed the staging
/// buffer (the caller falls back to the CPU).
pub fn search_and(
    cache: &mut PostingCache,
    index: &Index,
    query: &Query,
) -> Result<SearchResult, GpuSelectError> {
    super::timed_search(query, |stats| and_topk(cache, index, query, stats))
}

fn and_topk(
    cache: &mut PostingCache,
    index: &Index,
    query: &Query,
    stats: &mut SelectStats,
) -> Result<Vec<(DocId, f64)>, GpuError> {
    // Any unknown term empties the result, as on the CPU.
    let Some(lists) = dedup_terms(&query.terms)
        .into_iter()
        .map(|t| term_id_list(index, t))
        .collect::<Option<Vec<(TermId, PostingList)>>>()
    else {
        return Ok(Vec::new());
    };
    if query.k == 0 || lists.is_empty() {
        return Ok(Vec::new());
    }
    let device = cache.device().clone();
    let n = index.num_docs() as u64;
    let avgdl = index.avg_scoring_length();
    let mut dfs = Vec::with_capacity(lists.len());
    let mut params = Vec::with_capacity(6 * lists.len());
    for &(_, list) in &lists {
        stats.blocks_decoded += list.n_blocks() as u64;
        dfs.push(list.df);
        params.extend(
            TermScorer::new(query.params, n, list.df as u64, avgdl)
                .kernel_params()
                .map(f32::to_bits),
        );
    }
    // The BM25 parameters travel in the query's one staging copy.
    let postings = cache.decode_query(index, &lists, &params)?;
    // The candidates: the shortest list (ties by query position, as the CPU orders terms).
    let shortest = (0..lists.len()).min_by_key(|&t| (dfs[t], t)).unwrap_or(0);
    let m = dfs[shortest];
    let n_terms = lists.len() as u32;
    let starts = postings.slots_and_dfs.slice(..lists.len());
    let dfs_dev = postings.slots_and_dfs.slice(lists.len()..);
    // SAFETY: the words are the f32 parameters' bit patterns, 6 per term.
    let Some(params_dev) = (unsafe { postings.extra.transmute::<f32>(params.len()) }) else {
        unreachable!("the extra words are the parameters")
    };
    // The accumulator holds one f64 per document, at least m: AND's scores need no allocation.
    let scores = postings.acc;
    let shortest_u32 = shortest as u32;
    let function = device.function(KernelModule::Score, "score_and")?;
    let stream = device.stream();
    let mut launch = stream.launch_builder(function);
    launch
        .arg(postings.docs)
        .arg(postings.tfs)
        .arg(&starts)
        .arg(&dfs_dev)
        .arg(&params_dev)
        .arg(&n_terms)
        .arg(&shortest_u32)
        .arg(postings.doc_len)
        .arg(&mut *scores);
    // SAFETY: `score_and(const u32*, const u32*, const u32*, const u32*, const float*, u32, u32,
    // const u32*, double*)` in this order; term t's postings lie at starts[t]..starts[t]+dfs[t]
    // of docs and tfs (decoded above, docIDs increasing and below num_docs), params holds 6 f32
    // per term, doc_len num_docs entries, scores num_docs ≥ m = dfs[shortest]; any 1-D grid.
    unsafe { launch.launch(LaunchConfig::for_num_elems(m)) }.during("score_and")?;
    phases::mark(postings.events, Mark::Scored, stream)?;
    let start = postings.slot[shortest] as usize;
    let ids = postings.docs.slice(start..start + m as usize);
    top_k(
        &device,
        postings.topk,
        postings.events,
        scores,
        Some(&ids),
        m,
        query.k,
    )
}
