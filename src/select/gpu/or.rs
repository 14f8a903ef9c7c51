//! OR queries on the GPU: term at a time into a dense accumulator (Ding et al. WWW'09), then a
//! top-k from per-block candidates merged on the host.
//!
//! Every distinct known term's list is decoded in the batch's one launch
//! ([`super::cache::PostingCache::stage`]); then, in the query's term order, one launch per term adds its BM25 contributions
//! (`score_term`) into one f64 per document. One stream makes every document's score the f64
//! sum of its f32 contributions in query term order, the CPU's definition (`select::bm25`), so
//! scores are bit-identical; `score.cu` is compiled without fused multiply-adds for the same
//! reason. The queries of a batch share the accumulator: each queues its reset, terms and
//! top-k after the one before it.
//!
//! Counters: `blocks_decoded` is every block of every term (TAAT decodes whole lists);
//! `docs_scored` stays 0, since the union's size is not counted on the device.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::cache::{Decode, PostingCache, QueryPostings, StageRequest};
use super::phases::{self, Mark};
use super::topk::{host_words, launch_top_k, PendingTopK};
use super::GpuSelectError;
use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError, KernelModule};
use crate::index::{Index, PostingList, TermId};
use crate::select::bm25::TermScorer;
use crate::select::{Query, QueryTerms, SearchResult, SelectStats};

/// Runs one query in OR mode on the GPU (whatever `query.mode` says): the same hits as
/// [`crate::select::search`] with [`crate::select::Mode::Or`], in the same order, with
/// bit-identical scores.
///
/// # Errors
/// [`GpuSelectError::Query`] for invalid BM25 parameters (as the CPU); [`GpuSelectError::Gpu`]
/// when a device allocation, copy or launch fails or the query's lists exceed the staging
/// buffer (the caller falls back to the CPU).
pub fn search_or(
    cache: &mut PostingCache,
    index: &Index,
    query: &Query,
    terms: &QueryTerms,
) -> Result<SearchResult, GpuSelectError> {
    super::search_one(cache, index, super::GpuRun::Or, query, terms)
}

/// An OR query staged in a batch: its lists, in query order.
pub(super) struct OrWork<'a> {
    lists: Vec<(TermId, PostingList<'a>)>,
    /// Each list's scorer ([`Query::term_scorer`]).
    scorers: Vec<TermScorer>,
}

/// What an OR query stages ([`super::cache::PostingCache::stage`]): every distinct known term's
/// list, decoded whole; `None` when it has nothing to score (k = 0 or no known term).
pub(super) fn or_stage<'a>(
    index: &Index,
    query: &Query,
    terms: &QueryTerms<'a>,
    stats: &mut SelectStats,
) -> Option<(StageRequest<'a>, OrWork<'a>)> {
    let lists: Vec<_> = terms.lists.iter().flatten().copied().collect();
    if query.k == 0 || lists.is_empty() {
        return None;
    }
    stats.blocks_decoded += lists.iter().map(|(_, l)| l.n_blocks() as u64).sum::<u64>();
    let request = StageRequest {
        lists: (lists.iter())
            .map(|&(id, list)| (id, list, Decode::Whole))
            .collect(),
        extra: Vec::new(),
        scratch_words: 0,
        mapped_words: 0,
        topk_words: host_words(index.num_docs(), query.k),
    };
    let scorers = (terms.lists.iter().enumerate())
        .filter_map(|(qi, found)| found.map(|(_, list)| query.term_scorer(index, qi, list.df)))
        .collect();
    Some((request, OrWork { lists, scorers }))
}

/// Queues a staged OR query: the accumulator's reset, a launch per term in query order, the
/// top-k.
///
/// # Errors
/// A driver error when a launch fails.
pub(super) fn or_queue(
    device: &GpuDevice,
    postings: QueryPostings<'_>,
    work: &OrWork<'_>,
    index: &Index,
    query: &Query,
) -> Result<PendingTopK, GpuError> {
    let n_docs = index.num_docs();
    let stream = device.stream();
    let fill = device.function(KernelModule::Score, "score_fill")?;
    let mut launch = stream.launch_builder(fill);
    launch.arg(&mut *postings.acc).arg(&n_docs);
    // SAFETY: `score_fill(double*, u32)`: the accumulator holds n_docs f64 (one per document of
    // the index the cache loaded); any 1-D grid.
    unsafe { launch.launch(LaunchConfig::for_num_elems(n_docs)) }.during("score_fill")?;

    for ((&(_, list), scorer), &slot) in work.lists.iter().zip(&work.scorers).zip(&postings.slot) {
        let span = slot as usize..slot as usize + list.df as usize;
        let docs = postings.decoded.docs.slice(span.clone());
        let tfs = postings.decoded.tfs.slice(span);
        let [idf, k1, k1_plus_1, one_minus_b, b, avgdl32] = scorer.kernel_params();
        let term = device.function(KernelModule::Score, "score_term")?;
        let mut launch = stream.launch_builder(term);
        launch
            .arg(&docs)
            .arg(&tfs)
            .arg(&list.df)
            .arg(postings.doc_len)
            .arg(&idf)
            .arg(&k1)
            .arg(&k1_plus_1)
            .arg(&one_minus_b)
            .arg(&b)
            .arg(&avgdl32)
            .arg(&mut *postings.acc);
        // SAFETY: `score_term(const u32*, const u32*, u32, const u32*, float × 6, double*)` in
        // this order; docs and tfs hold the term's df decoded postings with docIDs below n_docs
        // (checked at open), doc_len and acc hold n_docs entries; any 1-D grid.
        unsafe { launch.launch(LaunchConfig::for_num_elems(list.df)) }.during("score_term")?;
    }
    phases::mark(postings.events, Mark::Scored, stream)?;
    launch_top_k(
        device,
        postings.topk,
        postings.events,
        &*postings.acc,
        None,
        n_docs,
        query.k,
        postings.topk_at,
    )
}
