//! AND queries on the GPU, one intersection step at a time (SvS, as the CPU: the shortest list's
//! postings are the candidates, sought in the other lists shortest first), and the hand-over of
//! a half-done intersection to the CPU (Griffin et al., PPoPP'18).
//!
//! An [`AndPlan`] (the scheduler's, [`crate::select::schedule::Scheduler::and_plan`]) says how
//! many of the lists, shortest first, the GPU intersects, and which way each step runs
//! ([`AndPlan::step`]):
//! - by skip entries when the step's list has at least [`AndPlan::skip_entry_min_ratio`] times
//!   the shortest list's postings (the candidates): the list is not decoded whole, but each
//!   candidate's block is found by binary search over the list's block bases (its skip entries,
//!   which the block table already carries), those blocks alone are decoded (at most one per
//!   candidate, by the decode kernels over a table built on the device), and each candidate is
//!   sought in its block (`intersect_skip_blocks`, `pfor/ef_decode_blocks`,
//!   `intersect_skip_seek`, `kernels/intersect.cu`);
//! - merge path (`intersect_merge_path`) when the step's list has at least
//!   [`AndPlan::merge_path_min_df`] postings: the merge of both cut into equal tiles, each list
//!   read once and coalesced, over every SM however few the candidates;
//! - otherwise a binary search per candidate (`intersect_search`), log2(n) dependent reads each.
//!
//! Only the GPU's lists are copied, and decoded whole unless a skip-entry step takes them. When
//! every list is the GPU's, the binary-search
//! steps run inside `score_and_found` after the merge-path steps' launches, and it sums each
//! survivor's contributions in query order: a query without merge steps is one launch before
//! the top-k, shared with OR. Otherwise
//! `intersect_gather` packs the survivors (docID and tf per list) and the CPU seeks them in the
//! remaining lists ([`crate::select::cpu::and_finish`]), through the skip entries, decoding one
//! block per candidate and list at most. Either way the hits and their bit patterns are the CPU
//! AND's.
//!
//! Counters: `blocks_decoded` is every block of the lists the GPU decodes whole, the blocks its
//! skip-entry steps decoded (counted on the device, read once the query is done) and the CPU's;
//! `docs_scored` counts the documents the CPU scored after a hand-over (0 when the GPU finished
//! the query).

use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};

use super::cache::{Decode, PostingCache, QueryPostings, StageRequest};
use super::decode::{decode_blocks, DESC_WORDS};
use super::phases::{self, Mark};
use super::topk::{host_words, launch_top_k};
use super::{GpuSelectError, Queued};
use crate::gpu::error::DriverResultExt;
use crate::gpu::{GpuDevice, GpuError, KernelModule};
use crate::index::codecs::BLOCK_LEN;
use crate::index::{Index, PostingList, TermId};
use crate::select::{cpu, Query, QueryTerms, SearchResult, SelectStats};

/// Merge elements per `intersect_merge_path` block, and its threads (`MERGE_TILE`,
/// `MERGE_THREADS` in `kernels/intersect.cu`).
const MERGE_TILE: u64 = 2048;
const MERGE_THREADS: u32 = 256;

/// Threads per `intersect_skip_seek` block: each block writes one count of decoded blocks.
const SKIP_SEEK_THREADS: u32 = 256;

/// Survivor rows that come back in the same copy as their count (a second copy brings any
/// more): a hand-over happens when the intersection is expected to be small, so one copy
/// usually brings them all. Its gain over two copies was below what the H100 runs could resolve
/// (`docs/benchmarks-history.md`, issue 6, run D).
const GATHER_FIRST_ROWS: usize = 1024;

/// How the GPU runs an AND query (see the module docs). The lists are counted shortest first,
/// ties by their place in the query, as [`crate::select::schedule::QueryShape::dfs`] orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AndPlan {
    /// Lists the GPU intersects (at least the shortest; more than the query has means all).
    pub gpu_lists: usize,
    /// A step that does not run by skip entries runs by merge path when its list has at least
    /// this many postings, else by binary search per candidate.
    pub merge_path_min_df: u32,
    /// A step runs by skip entries when its list has at least this many times the postings of
    /// the shortest list (0: every step; `u32::MAX`: none) and at least `skip_entry_min_df`.
    pub skip_entry_min_ratio: u32,
    /// The fewest postings of a list stepped through by skip entries: the step's three extra
    /// launches cost more than decoding a shorter list whole.
    pub skip_entry_min_df: u32,
}

/// The way one intersection step runs on the GPU (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    SkipEntries,
    MergePath,
    Search,
}

impl AndPlan {
    /// Every list on the GPU, each step as the thresholds say.
    pub fn gpu_only(
        merge_path_min_df: u32,
        (skip_entry_min_ratio, skip_entry_min_df): (u32, u32),
    ) -> AndPlan {
        AndPlan {
            gpu_lists: usize::MAX,
            merge_path_min_df,
            skip_entry_min_ratio,
            skip_entry_min_df,
        }
    }

    /// How the step over a list of `df` postings runs when the shortest list has `candidates`.
    pub fn step(&self, df: u32, candidates: u32) -> Step {
        if df >= self.skip_entry_min_df
            && df as u64 >= self.skip_entry_min_ratio as u64 * candidates as u64
        {
            Step::SkipEntries
        } else if df >= self.merge_path_min_df {
            Step::MergePath
        } else {
            Step::Search
        }
    }
}

/// Runs one query in AND mode on the GPU (whatever `query.mode` says) as `plan` says: the same
/// hits as [`crate::select::search`] with [`crate::select::Mode::And`], in the same order, with
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
    terms: &QueryTerms,
    plan: &AndPlan,
) -> Result<SearchResult, GpuSelectError> {
    super::search_one(cache, index, super::GpuRun::And(*plan), query, terms)
}

/// A query term's list with its place among the query's distinct terms.
struct QueryList<'a> {
    qi: usize,
    id: TermId,
    list: PostingList<'a>,
}

/// An AND query staged in a batch: what its launches need beyond its lists on the device.
pub(super) struct AndWork<'a> {
    /// The query's lists in SvS order; the GPU intersects the first `on_gpu`.
    lists: Vec<QueryList<'a>>,
    on_gpu: usize,
    /// Candidates (the shortest list's postings).
    na: u32,
    /// How each of the GPU's lists is stepped, and which are stepped by their own launches.
    ways: Vec<Step>,
    stepped: Vec<usize>,
    /// Scratch words of the `found` arrays, where the hand-over's rows follow.
    steps_words: usize,
    /// Scratch word of the skip-entry steps' decode table.
    skip_at: usize,
    skip_steps: usize,
    seek_blocks: usize,
}

impl AndWork<'_> {
    /// Whether the GPU intersects every list (else the CPU finishes the query).
    fn finished_here(&self) -> bool {
        self.on_gpu == self.lists.len()
    }

    /// The mapped host words of the skip-entry steps' counts.
    pub(super) fn count_words(&self) -> usize {
        self.skip_steps * self.seek_blocks
    }
}

/// What an AND query stages ([`PostingCache::stage`]) and the plan of its launches; `None`
/// when its answer is empty without a launch (an unknown term, k = 0).
///
/// # Errors
/// [`GpuError::TooLarge`] when an intersection step's merge exceeds what the kernels index.
pub(super) fn and_stage<'a>(
    index: &Index,
    query: &Query,
    terms: &QueryTerms<'a>,
    plan: &AndPlan,
    stats: &mut SelectStats,
) -> Result<Option<(StageRequest<'a>, AndWork<'a>)>, GpuError> {
    // Any unknown term empties the result, as on the CPU.
    let Some(mut lists) = terms
        .lists
        .iter()
        .enumerate()
        .map(|(qi, found)| found.map(|(id, list)| QueryList { qi, id, list }))
        .collect::<Option<Vec<QueryList>>>()
    else {
        return Ok(None);
    };
    if query.k == 0 || lists.is_empty() {
        return Ok(None);
    }
    // SvS order, as the CPU's AND and the scheduler's shape.
    lists.sort_by_key(|l| (l.list.df, l.qi));
    let on_gpu = plan.gpu_lists.clamp(1, lists.len());
    let gpu_lists = &lists[..on_gpu];
    let na = gpu_lists[0].list.df;
    let merged = gpu_lists.iter().map(|l| l.list.df as u64 + na as u64).max();
    if merged.is_some_and(|m| m + MERGE_TILE > u32::MAX as u64) {
        return Err(GpuError::TooLarge {
            what: "postings of one intersection step",
            got: merged.unwrap_or(0) as usize,
            limit: (u32::MAX as u64 - MERGE_TILE) as usize,
        });
    }
    // Which lists are stepped by their own launches, in SvS order: the merge-path and skip-entry
    // ones, or every one when the CPU finishes the query (it reads every step's array); the
    // others are searched inside score_and_found. step_of[s] is list s's step array
    // (score_and_found's `step_of`).
    let finished_here = on_gpu == lists.len();
    let ways: Vec<Step> = gpu_lists.iter().map(|l| plan.step(l.list.df, na)).collect();
    let stepped: Vec<usize> = (1..on_gpu)
        .filter(|&s| !finished_here || ways[s] != Step::Search)
        .collect();
    let mut step_of = vec![u32::MAX; on_gpu];
    for (k, &s) in stepped.iter().enumerate() {
        step_of[s] = k as u32;
    }
    // A skip-entry step's list is not decoded whole: room for a block per candidate instead.
    let decode_of = |s: usize| match s > 0 && ways[s] == Step::SkipEntries {
        true => Decode::Later { blocks: na },
        false => Decode::Whole,
    };
    // Per-query words: 6 f32 BM25 parameters per GPU list (SvS order), then, for each distinct
    // query term in query order, its list's SvS position (score_and_found's `order`), then
    // step_of.
    let mut extra = Vec::with_capacity(8 * on_gpu);
    for (s, l) in gpu_lists.iter().enumerate() {
        if decode_of(s) == Decode::Whole {
            stats.blocks_decoded += l.list.n_blocks() as u64;
        }
        extra.extend(
            query
                .term_scorer(index, l.qi, l.list.df)
                .kernel_params()
                .map(f32::to_bits),
        );
    }
    let mut order: Vec<u32> = (0..on_gpu as u32).collect();
    order.sort_by_key(|&s| gpu_lists[s as usize].qi);
    extra.extend_from_slice(&order);
    extra.extend_from_slice(&step_of);
    // Scratch: one `found` array per step, then the hand-over's count and rows, then (from a
    // descriptor boundary) the skip-entry steps' decode table and candidate slots, which each
    // such step rewrites. Mapped host words: per skip-entry step, a count per seek block.
    let steps_words = stepped.len() * na as usize;
    let gather_words = match finished_here {
        false => 1 + na as usize * (1 + on_gpu),
        true => 0,
    };
    let skip_steps = (1..on_gpu)
        .filter(|&s| ways[s] == Step::SkipEntries)
        .count();
    let skip_at = (steps_words + gather_words).next_multiple_of(DESC_WORDS);
    let skip_words = match skip_steps {
        0 => 0,
        _ => (DESC_WORDS + 1) * na as usize,
    };
    let seek_blocks = na.div_ceil(SKIP_SEEK_THREADS) as usize;
    let request = StageRequest {
        lists: (gpu_lists.iter().enumerate())
            .map(|(s, l)| (l.id, l.list, decode_of(s)))
            .collect(),
        extra,
        scratch_words: skip_at + skip_words,
        mapped_words: skip_steps * seek_blocks,
        topk_words: match finished_here {
            true => host_words(na, query.k),
            false => 0,
        },
    };
    let work = AndWork {
        lists,
        on_gpu,
        na,
        ways,
        stepped,
        steps_words,
        skip_at,
        skip_steps,
        seek_blocks,
    };
    Ok(Some((request, work)))
}

/// Queues a staged AND query's intersection steps, then its scoring and top-k, or hands its
/// survivors over to the CPU, which finishes it at once (the hand-over waits for the stream).
///
/// # Errors
/// A driver error when a launch or the hand-over's copy fails.
pub(super) fn and_queue(
    device: &GpuDevice,
    mut postings: QueryPostings<'_>,
    work: &AndWork<'_>,
    index: &Index,
    (query, terms): (&Query, &QueryTerms<'_>),
    stats: &mut SelectStats,
) -> Result<Queued, GpuError> {
    let (na, on_gpu) = (work.na, work.on_gpu);
    let gpu_lists = &work.lists[..on_gpu];
    let stream = device.stream();
    let docs = postings.decoded.docs.device_ptr(stream).0;
    let at = |slot: u32| docs + 4 * slot as u64;
    let found = postings.scratch.device_ptr(stream).0;
    let found_of = |k: usize| found + 4 * (k * na as usize) as u64;
    let candidates = at(postings.slot[0]);
    let mut skip_step = 0;
    for (k, &s) in work.stepped.iter().enumerate() {
        let nb = gpu_lists[s].list.df;
        let alive = if k == 0 { 0 } else { found_of(k - 1) };
        let (kernel, config) = match work.ways[s] {
            Step::SkipEntries => {
                let seek = SkipSeek {
                    list: s,
                    alive,
                    na,
                    scratch_at: work.skip_at,
                    found: found_of(k),
                    counts_at: postings.mapped_at + skip_step * work.seek_blocks,
                };
                seek_by_skip_entries(device, &mut postings, gpu_lists[s].list, &seek)?;
                skip_step += 1;
                continue;
            }
            Step::MergePath => (
                "intersect_merge_path",
                LaunchConfig {
                    grid_dim: ((na as u64 + nb as u64).div_ceil(MERGE_TILE) as u32, 1, 1),
                    block_dim: (MERGE_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                },
            ),
            Step::Search => ("intersect_search", LaunchConfig::for_num_elems(na)),
        };
        let function = device.function(KernelModule::Intersect, kernel)?;
        let (b, out) = (at(postings.slot[s]), found_of(k));
        let mut launch = stream.launch_builder(function);
        launch
            .arg(&candidates)
            .arg(&alive)
            .arg(&na)
            .arg(&b)
            .arg(&nb)
            .arg(&out);
        // SAFETY: both kernels are `(const u32* a, const u32* alive, u32 na, const u32* b, u32 nb,
        // u32* found)`: a is list 0's na decoded docIDs, b list s's nb (increasing, decoded
        // above), alive null or the previous step's na entries, found this step's na entries of
        // the scratch (steps_words = steps × na); na + nb + 2048 < 2³² (checked when staged);
        // the merge kernel gets one 256-thread block per 2048 merge elements, the search any
        // grid.
        unsafe { launch.launch(config) }.during(kernel)?;
    }
    if work.finished_here() {
        let scores = &mut *postings.acc;
        let function = device.function(KernelModule::Score, "score_and_found")?;
        let starts = postings.slots_and_dfs.slice(..on_gpu);
        let dfs = postings.slots_and_dfs.slice(on_gpu..);
        let params_at = postings.extra.device_ptr(stream).0;
        let order_at = params_at + 4 * 6 * on_gpu as u64;
        let step_of_at = order_at + 4 * on_gpu as u64;
        let (lists_u32, steps) = (on_gpu as u32, work.stepped.len() as u32);
        let mut launch = stream.launch_builder(function);
        launch
            .arg(&postings.decoded.docs)
            .arg(&postings.decoded.tfs)
            .arg(&starts)
            .arg(&dfs)
            .arg(&found)
            .arg(&step_of_at)
            .arg(&steps)
            .arg(&order_at)
            .arg(&params_at)
            .arg(&lists_u32)
            .arg(&na)
            .arg(postings.doc_len)
            .arg(&mut *scores);
        // SAFETY: `score_and_found(const u32* docs, const u32* tfs, const u32* start, const u32*
        // df, const u32* found, const u32* step_of, u32 steps, const u32* order, const float*
        // params, u32 lists, u32 na, const u32* doc_len, double* out)`: docs/tfs hold list s's
        // df[s] postings at start[s] (the query's slots and dfs), found the `steps` arrays the
        // launches above wrote, the extra words 6 f32 per list, then `order` and `step_of` (a
        // word per list each), doc_len one entry per document, out ≥ na entries (the
        // accumulator: one per document ≥ df); any 1-D grid.
        unsafe { launch.launch(LaunchConfig::for_num_elems(na)) }.during("score_and_found")?;
        phases::mark(postings.events, Mark::Scored, stream)?;
        let ids = (postings.decoded.docs)
            .slice(postings.slot[0] as usize..(postings.slot[0] + na) as usize);
        let top = launch_top_k(
            device,
            postings.topk,
            postings.events,
            scores,
            Some(&ids),
            na,
            query.k,
            postings.topk_at,
        )?;
        return Ok(Queued::TopK(top));
    }
    let rows = gather(device, &mut postings, found, work.steps_words, on_gpu, na)?;
    let done: Vec<usize> = gpu_lists.iter().map(|l| l.qi).collect();
    let (hits, cpu_stats) = cpu::and_finish(index, query, terms, &done, &rows);
    stats.blocks_decoded += cpu_stats.blocks_decoded;
    stats.docs_scored += cpu_stats.docs_scored;
    Ok(Queued::Done(hits))
}

/// Where a skip-entry step reads and writes (device addresses, scratch and mapped words).
struct SkipSeek {
    /// The step's list, by its SvS position among the GPU's lists.
    list: usize,
    /// The previous step's `found` array, or 0 (null) for the first step.
    alive: u64,
    /// Candidates (the shortest list's postings).
    na: u32,
    /// The scratch's first word for the decode table (`DESC_WORDS` × na, at a multiple of
    /// `DESC_WORDS`) and the candidates' slots (na) after it.
    scratch_at: usize,
    /// This step's `found` array (na words).
    found: u64,
    /// The mapped word from which the seek's blocks write their counts.
    counts_at: usize,
}

/// Queues one skip-entry step (see the module docs): `intersect_skip_blocks` over the list's
/// skip entries (the bases in its descriptors), the decode of the blocks it chose into the
/// list's room, and `intersect_skip_seek`, which writes `step.found` and the decoded blocks'
/// counts.
///
/// # Errors
/// A driver error when the reset, a launch or the decode fails.
fn seek_by_skip_entries(
    device: &GpuDevice,
    postings: &mut QueryPostings<'_>,
    list: PostingList<'_>,
    step: &SkipSeek,
) -> Result<(), GpuError> {
    let stream = device.stream();
    let na = step.na as usize;
    let table_words = step.scratch_at..step.scratch_at + DESC_WORDS * na;
    stream
        .memset_zeros(&mut postings.scratch.slice_mut(table_words.clone()))
        .during("skip-entry decode table reset")?;
    let scratch = postings.scratch.device_ptr(stream).0;
    let table = scratch + 4 * step.scratch_at as u64;
    let slot_of = table + 4 * (DESC_WORDS * na) as u64;
    let docs = postings.decoded.docs.device_ptr(stream).0;
    let candidates = docs + 4 * postings.slot[0] as u64;
    let room = docs + 4 * postings.slot[step.list] as u64;
    let skips = postings.table.device_ptr(stream).0
        + 4 * (DESC_WORDS as u64 * postings.first_desc[step.list] as u64);
    let n_blocks = list.n_blocks() as u32;
    let last = list.block_last(list.n_blocks() - 1);
    let function = device.function(KernelModule::Intersect, "intersect_skip_blocks")?;
    let mut launch = stream.launch_builder(function);
    launch
        .arg(&candidates)
        .arg(&step.alive)
        .arg(&step.na)
        .arg(&skips)
        .arg(&n_blocks)
        .arg(&last)
        .arg(&slot_of)
        .arg(&table);
    // SAFETY: `intersect_skip_blocks(const u32* a, const u32* alive, u32 na, const BlockDesc*
    // skips, u32 n_blocks, u32 last, u32* slot_of, BlockDesc* table)`: a is list 0's na decoded
    // docIDs, alive null or the previous step's na entries, skips the list's n_blocks
    // descriptors in the query's block table (16-byte aligned: the table starts at a multiple of
    // 4 words), last its last docID, slot_of na words and table na descriptors of the scratch
    // (16-byte aligned, zeroed above); any 1-D grid.
    unsafe { launch.launch(LaunchConfig::for_num_elems(step.na)) }
        .during("intersect_skip_blocks")?;
    let room_at = postings.slot[step.list] as usize / BLOCK_LEN;
    let table_view = postings.scratch.slice(table_words);
    decode_blocks(
        device,
        postings.codec,
        postings.words,
        &table_view,
        postings.decoded,
        room_at,
    )?;
    let counts = postings.mapped.mapped + 4 * step.counts_at as u64;
    let function = device.function(KernelModule::Intersect, "intersect_skip_seek")?;
    let mut launch = stream.launch_builder(function);
    launch
        .arg(&candidates)
        .arg(&step.na)
        .arg(&slot_of)
        .arg(&table)
        .arg(&room)
        .arg(&step.found)
        .arg(&counts);
    let config = LaunchConfig {
        grid_dim: (step.na.div_ceil(SKIP_SEEK_THREADS), 1, 1),
        block_dim: (SKIP_SEEK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `intersect_skip_seek(const u32* a, u32 na, const u32* slot_of, const BlockDesc*
    // table, const u32* docs, u32* found, u32* decoded)`: a, slot_of and table as above (written
    // by the launch before), docs the list's room of na decoded blocks (the decode above wrote
    // the table's blocks there), found this step's na entries of the scratch, decoded the
    // mapped host words from `counts_at` (the caller sized them: a word per seek block and
    // skip-entry step); one 256-thread block per 256 candidates, as the kernel requires.
    unsafe { launch.launch(config) }.during("intersect_skip_seek")?;
    Ok(())
}

/// Packs the survivors of the GPU's `lists` − 1 steps (`intersect_gather`) into the scratch from
/// word `at` on and copies them back: per survivor, in no particular order, its docID then its
/// tf in each of the GPU's lists.
///
/// # Errors
/// A driver error when the launch or a copy fails.
fn gather(
    device: &GpuDevice,
    postings: &mut QueryPostings<'_>,
    found: u64,
    at: usize,
    lists: usize,
    na: u32,
) -> Result<Vec<u32>, GpuError> {
    let stream = device.stream();
    let stride = 1 + lists;
    stream
        .memset_zeros(&mut postings.scratch.slice_mut(at..at + 1))
        .during("hand-over count reset")?;
    let function = device.function(KernelModule::Intersect, "intersect_gather")?;
    let candidates = postings.decoded.docs.device_ptr(stream).0 + 4 * postings.slot[0] as u64;
    let starts = postings.slots_and_dfs.slice(..lists);
    let out = found + 4 * at as u64;
    let steps = lists as u32;
    let mut launch = stream.launch_builder(function);
    launch
        .arg(&candidates)
        .arg(&postings.decoded.tfs)
        .arg(&starts)
        .arg(&found)
        .arg(&steps)
        .arg(&na)
        .arg(&out);
    // SAFETY: `intersect_gather(const u32* a, const u32* tfs, const u32* start, const u32* found,
    // u32 steps, u32 na, u32* out)`: a is list 0's na docIDs, tfs every list's at start[s],
    // found the steps' (lists − 1) × na entries at the scratch's start, out the scratch from
    // word `at` (1 + na × (1 + lists) words: the count, zeroed above, and at most na rows);
    // the grid is whole warps (LaunchConfig::for_num_elems gives blocks of 1 024 threads).
    unsafe { launch.launch(LaunchConfig::for_num_elems(na)) }.during("intersect_gather")?;
    // The count and the first rows in one copy, the rest (if any) in a second.
    let first = (na as usize).min(GATHER_FIRST_ROWS);
    let mut rows = stream
        .clone_dtoh(&postings.scratch.slice(at..at + 1 + first * stride))
        .during("hand-over download")?;
    let count = rows[0] as usize;
    rows.truncate(1 + count.min(first) * stride);
    rows.remove(0);
    if count > first {
        let rest = postings
            .scratch
            .slice(at + 1 + first * stride..at + 1 + count * stride);
        rows.extend(stream.clone_dtoh(&rest).during("hand-over rows download")?);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_runs_by_skip_entries_from_its_ratio_to_the_candidates_then_by_merge_path() {
        let plan = AndPlan::gpu_only(5_000, (1024, 0));
        assert_eq!(plan.step(1024 * 3, 3), Step::SkipEntries);
        assert_eq!(plan.step(1024 * 3 - 1, 3), Step::Search);
        // Merge path only below the ratio, from its length on.
        assert_eq!(plan.step(5_000, 1_000), Step::MergePath);
        assert_eq!(plan.step(1_000_000, 1_000), Step::MergePath);
        assert_eq!(plan.step(1024 * 6_000, 6_000), Step::SkipEntries);
        // 0: every step, even over a list shorter than the candidates; u32::MAX: none.
        assert_eq!(AndPlan::gpu_only(0, (0, 0)).step(1, 7), Step::SkipEntries);
        let never = AndPlan::gpu_only(u32::MAX, (u32::MAX, 0));
        assert_eq!(never.step(u32::MAX - 1, 1), Step::Search);
        // A list under the length floor is decoded whole whatever its ratio.
        let long_only = AndPlan::gpu_only(5_000, (1024, 1 << 21));
        assert_eq!(long_only.step(1024 * 1_000, 1_000), Step::MergePath);
        assert_eq!(long_only.step(1024 * 3_000, 3_000), Step::SkipEntries);
    }
}
