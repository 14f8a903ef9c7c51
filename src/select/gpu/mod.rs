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
//! Queries run in batches ([`search_batch`]; one query is a batch of one): the server gathers
//! the GPU selections that arrive while the device is busy (the device's `gpu::Lane`), and a batch shares
//! one staging copy, one decode launch and one wait for the stream, each query's other launches
//! queued after the one before it (Wang et al. batch queries so, to pay the copies and the
//! kernel invocations once per batch).
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
pub use cache::{PostingCache, PostingCacheConfig, PostingCacheStats, StageRequest, StagedBatch};
pub use decode::{DecodeTiming, DecodedBlocks, PackedLists};
pub use or::search_or;
pub use phases::SelectPhases;

use std::time::Instant;

use super::{check_params, cpu, Mode, Query, QueryTerms, SearchResult, SelectStats};
use crate::gpu::GpuError;
use crate::index::{DocId, Index};
use and::AndWork;
use or::OrWork;
use topk::PendingTopK;

/// Why a GPU selection failed: the query itself (the CPU refuses it too), or the device (the
/// caller runs the query on the CPU instead).
#[derive(Debug, thiserror::Error)]
pub enum GpuSelectError {
    /// The query is invalid on any backend.
    #[error(transparent)]
    Query(#[from] super::SelectError),
    /// A device error: allocation, copy, launch or a limit of the kernels.
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// How a query of a batch runs on the GPU, whatever its `mode` field says: AND and AND_OR
/// with the plan of their intersection steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuRun {
    Or,
    And(AndPlan),
    AndOr(AndPlan),
}

impl GpuRun {
    /// `mode` run with `plan` (unused by OR).
    pub fn of(mode: Mode, plan: AndPlan) -> GpuRun {
        match mode {
            Mode::Or => GpuRun::Or,
            Mode::And => GpuRun::And(plan),
            Mode::AndOr => GpuRun::AndOr(plan),
        }
    }
}

/// One query of a batch ([`search_batch`]): what it asks, its terms as looked up in the index,
/// and how it runs.
#[derive(Clone, Copy)]
pub struct BatchQuery<'q, 'a> {
    pub query: &'q Query,
    pub terms: &'q QueryTerms<'a>,
    pub run: GpuRun,
}

/// Runs one query on the GPU as `run` says: the same hits as [`crate::select::search`] in that
/// mode, in the same order, with bit-identical scores. A batch of one ([`search_batch`]).
///
/// # Errors
/// As [`search_batch`], the batch's device error as [`GpuSelectError::Gpu`].
pub fn search_one(
    cache: &mut PostingCache,
    index: &Index,
    run: GpuRun,
    query: &Query,
    terms: &QueryTerms,
) -> Result<SearchResult, GpuSelectError> {
    let one = BatchQuery { query, terms, run };
    let mut answers = search_batch(cache, index, &[one])?;
    answers
        .pop()
        .unwrap_or_else(|| unreachable!("search_batch answers every query"))
}

/// Runs one query in AND_OR mode on the GPU (whatever `query.mode` says): AND as `plan` says,
/// then, when AND found fewer than k documents, OR, filled as the CPU fills them
/// ([`cpu::fill_and_or`]): the same hits as [`crate::select::search`] with
/// [`crate::select::Mode::AndOr`], with bit-identical scores.
///
/// # Errors
/// As [`search_one`].
pub fn search_and_or(
    cache: &mut PostingCache,
    index: &Index,
    query: &Query,
    terms: &QueryTerms,
    plan: &AndPlan,
) -> Result<SearchResult, GpuSelectError> {
    search_one(cache, index, GpuRun::AndOr(*plan), query, terms)
}

/// Runs a batch of queries on the GPU with shared work: one staging copy and one decode launch
/// for every list of every query ([`PostingCache::stage`]), then each query's launches queued
/// after the one before it with no wait between them, and one wait for the whole batch before
/// the host reads the top-ks. AND_OR queries whose AND found fewer than k documents run their
/// OR in a second such round. A query handed over to the CPU midway (its AND plan) waits for
/// the stream at that point. Each answer is what [`search_one`] gives for that query alone;
/// its `select_us` is the batch's time up to its round's end.
///
/// A batch whose lists do not fit the staging region is split in halves (down to one query,
/// which then fails with [`GpuError::TooLarge`]).
///
/// # Errors
/// A device error of the batch (a copy, allocation, launch or the wait): then no answer is
/// trustworthy, and every query falls back to the CPU. Per query, in its answer: invalid BM25
/// parameters ([`GpuSelectError::Query`]), or its own lists over a kernel's limits
/// ([`GpuSelectError::Gpu`]).
pub fn search_batch(
    cache: &mut PostingCache,
    index: &Index,
    batch: &[BatchQuery<'_, '_>],
) -> Result<Vec<Result<SearchResult, GpuSelectError>>, GpuError> {
    let started = Instant::now();
    let mut stats = vec![SelectStats::default(); batch.len()];
    let mut answers: Vec<Option<Result<Hits, GpuSelectError>>> =
        (0..batch.len()).map(|_| None).collect();
    let mut round = Vec::new();
    for (i, b) in batch.iter().enumerate() {
        if let Err(err) = check_params(b.query.params) {
            answers[i] = Some(Err(err.into()));
            continue;
        }
        let staged = match b.run {
            GpuRun::Or => Ok(or::or_stage(index, b.query, b.terms, &mut stats[i])
                .map(|(request, work)| (request, Work::Or(work)))),
            GpuRun::And(plan) | GpuRun::AndOr(plan) => {
                and::and_stage(index, b.query, b.terms, &plan, &mut stats[i])
                    .map(|staged| staged.map(|(request, work)| (request, Work::And(work))))
            }
        };
        match staged {
            Ok(Some((request, work))) => round.push((i, request, work)),
            Ok(None) => answers[i] = Some(Ok(Vec::new())),
            Err(err) => answers[i] = Some(Err(err.into())),
        }
    }
    let mut done_us = vec![0; batch.len()];
    for (i, hits) in run_round(cache, index, batch, round, &mut stats)? {
        answers[i] = Some(Ok(hits));
    }
    let elapsed = |started: Instant| started.elapsed().as_micros() as u64;
    done_us.fill(elapsed(started));
    // AND_OR: OR where AND found fewer than k.
    let mut round = Vec::new();
    for (i, b) in batch.iter().enumerate() {
        let short = matches!(&answers[i], Some(Ok(hits)) if hits.len() < b.query.k);
        if matches!(b.run, GpuRun::AndOr(_)) && short {
            if let Some((request, work)) = or::or_stage(index, b.query, b.terms, &mut stats[i]) {
                round.push((i, request, Work::Or(work)));
            }
        }
    }
    for (i, or) in run_round(cache, index, batch, round, &mut stats)? {
        if let Some(Ok(and)) = answers[i].take() {
            answers[i] = Some(Ok(cpu::fill_and_or(and, or, batch[i].query.k)));
        }
        done_us[i] = elapsed(started);
    }
    Ok((answers.into_iter().zip(stats).zip(done_us))
        .map(|((answer, stats), select_us)| {
            let hits = answer.unwrap_or_else(|| unreachable!("every query is answered"))?;
            Ok(SearchResult {
                hits,
                select_us,
                stats,
            })
        })
        .collect())
}

/// A query's hits, best first.
type Hits = Vec<(DocId, f64)>;

/// A staged query's plan of launches, by mode.
enum Work<'a> {
    Or(OrWork<'a>),
    And(AndWork<'a>),
}

/// A staged query once its launches are queued.
enum Queued {
    /// The GPU finishes it: its top-k, read after the batch's wait.
    TopK(PendingTopK),
    /// The CPU finished it after a hand-over (which waited for the stream).
    Done(Hits),
}

/// One round of [`search_batch`]: stages `round` (batch index, request, work), queues each
/// query's launches, waits once, and reads every query's hits.
fn run_round<'a>(
    cache: &mut PostingCache,
    index: &Index,
    batch: &[BatchQuery<'_, 'a>],
    round: Vec<(usize, StageRequest<'a>, Work<'a>)>,
    stats: &mut [SelectStats],
) -> Result<Vec<(usize, Hits)>, GpuError> {
    if round.is_empty() {
        return Ok(Vec::new());
    }
    let device = cache.device().clone();
    let (requests, works): (Vec<_>, Vec<_>) =
        round.into_iter().map(|(i, r, w)| (r, (i, w))).unzip();
    let mut staged = match cache.stage(index, &requests) {
        Err(GpuError::TooLarge { .. }) if requests.len() > 1 => {
            // The lists of the whole batch exceed the staging region: half of it at a time.
            let mut round: Vec<_> = (requests.into_iter().zip(works))
                .map(|(r, (i, w))| (i, r, w))
                .collect();
            let second = round.split_off(round.len() / 2);
            let mut hits = run_round(cache, index, batch, round, stats)?;
            hits.extend(run_round(cache, index, batch, second, stats)?);
            return Ok(hits);
        }
        staged => staged?,
    };
    let mut queued = Vec::with_capacity(works.len());
    for (q, (i, work)) in works.iter().enumerate() {
        let b = &batch[*i];
        let postings = staged.query(q);
        queued.push(match work {
            Work::Or(work) => Queued::TopK(or::or_queue(&device, postings, work, index, b.query)?),
            Work::And(work) => {
                let inputs = (b.query, b.terms);
                and::and_queue(&device, postings, work, index, inputs, &mut stats[*i])?
            }
        });
    }
    device.synchronize()?;
    let mut hits = Vec::with_capacity(works.len());
    for (q, ((i, work), queued)) in works.iter().zip(queued).enumerate() {
        if let Work::And(work) = work {
            stats[*i].blocks_decoded += staged.mapped_sum(q, work.count_words())?;
        }
        hits.push((
            *i,
            match queued {
                Queued::TopK(top) => staged.top_k(&top)?,
                Queued::Done(done) => done,
            },
        ));
    }
    Ok(hits)
}
