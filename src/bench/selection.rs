//! The document stage's benchmark: each query of a file run alone on one thread (the
//! single-thread latency that peers such as Tantivy and PISA report), with its top-k and, on
//! request, its hit count, so that a peer's results on the same queries can be compared document
//! by document (`scripts/tantivy_compare.py` does, against `peers/tantivy`). Queries are timed in
//! passes over the whole set by default ([`Timing::Passes`], as peers time themselves), or each
//! query back to back ([`Timing::BackToBack`]). With a GPU, the same query stream runs on the GPU too
//! (through a warm posting cache) and through the scheduler (each query on the processor
//! [`crate::select::schedule`] picks), and decode speed is compared per codec: GPU (every list in
//! one launch) against one CPU core. [`step_ways`] times AND queries on the CPU and on the GPU
//! with every intersection step run each way ([`STEP_WAYS`]: binary search over the list decoded
//! whole, merge path, skip entries with only the candidates' blocks decoded), for the table of
//! intersection time by length ratio ([`by_ratio`]).

use std::time::Instant;

use serde::Serialize;

use crate::backend::{Backend, Processor};
use crate::gpu::GpuError;
use crate::index::codecs::BlockDecoder;
use crate::index::{Index, PostingList};
use crate::select::gpu::{
    decode::time_decode, search_and, AndPlan, DecodeTiming, GpuSelectError, PostingCache,
    SelectPhases,
};
use crate::select::schedule::{self, QueryShape, Scheduler};
use crate::select::{search, search_terms, Bm25Params, Mode, Query, QueryTerms, SelectError};

/// How [`run`] times the queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Timing {
    /// One untimed pass over every query, then `reps` timed passes, each running every query
    /// once: between two runs of a query the rest of the set has run, so its data is no longer
    /// all in the caches, as for a query stream (and as Tantivy's and PISA's runners time).
    #[default]
    Passes,
    /// Each query once untimed, then `reps` times in a row before the next query: its lists stay
    /// in the caches, which flatters every engine (Tantivy's p50 halved on the issue 21 set).
    BackToBack,
}

impl Timing {
    /// How the timing reads in a table's caption.
    pub fn label(self, reps: usize) -> String {
        match self {
            Timing::Passes => {
                format!("median over {reps} passes over the query set after a warm-up pass")
            }
            Timing::BackToBack => {
                format!("median of {reps} runs back to back after a warm-up, per query")
            }
        }
    }

    /// The order of [`run`]'s runs: (query index, timed?) for `queries` queries.
    fn schedule(self, queries: usize, reps: usize) -> Vec<(usize, bool)> {
        let reps = reps.max(1);
        match self {
            Timing::Passes => (0..=reps)
                .flat_map(|pass| (0..queries).map(move |q| (q, pass > 0)))
                .collect(),
            Timing::BackToBack => (0..queries)
                .flat_map(|q| (0..=reps).map(move |rep| (q, rep > 0)))
                .collect(),
        }
    }
}

/// What a query's time is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Clock {
    /// Wall time.
    #[default]
    Wall,
    /// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`): on a machine shared with
    /// other work it leaves out the time the thread waits for a core, not the cache misses its
    /// neighbours cause. Also the Tantivy peer's `--clock thread-cpu`.
    ThreadCpu,
}

impl Clock {
    /// Microseconds on this clock since an arbitrary origin (differences only).
    pub fn now_us(self) -> f64 {
        match self {
            Clock::Wall => {
                static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
                ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e6
            }
            Clock::ThreadCpu => {
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: clock_gettime writes one timespec through the valid pointer given;
                // CLOCK_THREAD_CPUTIME_ID exists on every Linux this crate runs on.
                unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
                ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
            }
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct SelectionConfig {
    pub mode: Mode,
    pub k: usize,
    pub params: Bm25Params,
    /// Timed runs per query after one warm-up; the median is kept.
    pub reps: usize,
    /// In passes over the query set or back to back ([`run`] only; the GPU's step timings are
    /// back to back).
    pub timing: Timing,
    /// What [`run`] reads a query's time from.
    pub clock: Clock,
    /// Whether [`run`] counts each query's hits (every matching document: an exhaustive search,
    /// untimed).
    pub count_hits: bool,
}

impl SelectionConfig {
    /// The query of `text` (tokenized like the documents) with this configuration's k, mode and
    /// BM25 parameters.
    pub(crate) fn query(&self, text: &str) -> Query {
        let mut query = Query::from_text(text, self.k, self.mode);
        query.params = self.params;
        query
    }
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
    /// The processor that answered.
    pub side: Processor,
    /// The dfs of the query's terms found in the index, ascending (the scheduler's input).
    pub dfs: Vec<u32>,
    /// Every document the query matches (with [`SelectionConfig::count_hits`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hits: Option<u64>,
}

/// Latency percentiles over queries, microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LatencySummary {
    pub queries: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    /// Queries answered on the GPU.
    pub on_gpu: usize,
}

impl LatencySummary {
    /// The summary of `runs` (all zero when there are none).
    pub fn of(runs: &[QueryRun]) -> LatencySummary {
        let us = sorted(runs.iter().map(|r| r.us));
        let at = |q: f64| nearest_rank(&us, q);
        LatencySummary {
            queries: us.len(),
            mean: mean(&us),
            p50: at(0.5),
            p90: at(0.9),
            p95: at(0.95),
            p99: at(0.99),
            p999: at(0.999),
            max: us.last().copied().unwrap_or(0.0),
            on_gpu: runs.iter().filter(|r| r.side == Processor::Gpu).count(),
        }
    }
}

/// `values`, in increasing order.
fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The median of `values` (the upper one of an even count), at least one value.
pub(crate) fn median(values: impl Iterator<Item = f64>) -> f64 {
    let v = sorted(values);
    v[v.len() / 2]
}

/// The nearest-rank `q` quantile of `sorted` values (0 when there are none).
fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0.0)
}

/// The mean of `values` (0 when there are none).
fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Why a benchmark run stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchSelectError {
    #[error(transparent)]
    Query(#[from] SelectError),
    /// A benchmark measures the backend asked for, so a fallback to the CPU is an error here.
    #[error("query {query:?} fell back to the CPU: {source}")]
    Fallback {
        query: String,
        source: crate::gpu::GpuError,
    },
    /// The CUDA events that time a GPU query's steps failed.
    #[error("timing the GPU's steps failed: {0}")]
    Timing(crate::gpu::GpuError),
    /// A query run on the GPU directly (no fallback to the CPU) failed there.
    #[error("query {query:?} failed on the GPU: {source}")]
    Gpu {
        query: String,
        source: crate::gpu::GpuError,
    },
}

/// Runs every query of `queries` (text, tokenized like the documents) on the calling thread on
/// each of `backends` ([`schedule::search`]: `cpu`, `gpu` through `gpu`'s posting cache, or
/// `auto`, the scheduler's choice per query), interleaved: each time a query runs, it runs once
/// on each backend in turn. `config.timing` orders the runs ([`Timing`]): passes over the query
/// set, or each query back to back; either way one untimed run first, then `config.reps` timed
/// runs per query and backend, keeping the median wall time per backend, the scheduler's estimate
/// included; one list of runs per backend. With `config.count_hits`, each query's hits are then
/// counted by a search for every matching document (k = the collection), untimed.
///
/// Interleaved because separate passes drift apart: in three passes over the same queries (CPU,
/// then GPU, then hybrid), the hybrid's CPU-side queries took from 0.66× to 1.98× (p10 to p90) the
/// CPU pass's time for the same code in the same process (H100 host, `docs/benchmarks-history.md`, issue 6). A
/// backend that may use the GPU first runs every query once: a GPU left idle starts at its idle
/// clock, and the first ten large queries of a 10 M-document run took ≈ 1.07 ms each, where the
/// same queries later in that run took 120–471 µs (H100), the per-query warm-up notwithstanding.
///
/// # Errors
/// The first query's error: invalid BM25 parameters, or a GPU failure (which would otherwise
/// have fallen back to the CPU).
pub fn run(
    index: &Index,
    queries: &[String],
    config: &SelectionConfig,
    backends: &[Backend],
    mut gpu: Option<&mut PostingCache>,
    scheduler: &Scheduler,
) -> Result<Vec<Vec<QueryRun>>, BenchSelectError> {
    let parsed: Vec<Query> = queries.iter().map(|text| config.query(text)).collect();
    for &backend in backends.iter().filter(|&&b| b != Backend::Cpu) {
        for query in &parsed {
            schedule::search(index, query, backend, gpu.as_deref_mut(), scheduler)?;
        }
    }
    let mut last: Vec<Vec<_>> = queries.iter().map(|_| Vec::new()).collect();
    let mut times = vec![vec![Vec::with_capacity(config.reps); backends.len()]; queries.len()];
    for (q, timed) in config.timing.schedule(queries.len(), config.reps) {
        let mut ran_now = Vec::with_capacity(backends.len());
        for (b, &backend) in backends.iter().enumerate() {
            let started = config.clock.now_us();
            let ran = schedule::search(index, &parsed[q], backend, gpu.as_deref_mut(), scheduler)?;
            let us = config.clock.now_us() - started;
            if let Some(source) = ran.fallback {
                return Err(BenchSelectError::Fallback {
                    query: queries[q].clone(),
                    source,
                });
            }
            if timed {
                times[q][b].push(us);
            }
            ran_now.push(ran);
        }
        last[q] = ran_now;
    }
    let mut runs: Vec<Vec<QueryRun>> = backends
        .iter()
        .map(|_| Vec::with_capacity(queries.len()))
        .collect();
    for (((text, query), last), times) in queries.iter().zip(&parsed).zip(last).zip(times) {
        let hits = match config.count_hits {
            true => Some(hit_count(index, query)?),
            false => None,
        };
        let dfs = QueryShape::of(index, query).dfs;
        for ((ran, times), out) in last.into_iter().zip(times).zip(&mut runs) {
            let result = ran.result;
            out.push(QueryRun {
                query: text.clone(),
                us: median(times.into_iter()),
                ids: result
                    .hits
                    .iter()
                    .map(|&(doc, _)| index.doc_id(doc).to_string())
                    .collect(),
                scores: result.hits.iter().map(|&(_, score)| score).collect(),
                blocks_decoded: result.stats.blocks_decoded,
                docs_scored: result.stats.docs_scored,
                side: ran.side,
                dfs: dfs.clone(),
                hits,
            });
        }
    }
    Ok(runs)
}

/// Every document `query` matches, counted by a CPU search with k = the collection's size: with
/// room for every match, no top-k threshold can skip one, whatever pruning the search does.
///
/// # Errors
/// As [`search`].
pub fn hit_count(index: &Index, query: &Query) -> Result<u64, SelectError> {
    let all = Query {
        k: index.num_docs() as usize,
        ..query.clone()
    };
    Ok(search(index, &all)?.hits.len() as u64)
}

/// Where GPU queries' time goes: per step, the median and the mean over the queries, and the
/// steps of the slowest query (what a tail is made of).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PhaseSummary {
    /// Queries that went through every step (those with no lists or no hits stop early).
    pub queries: usize,
    pub median: PhaseRow,
    pub mean: PhaseRow,
    pub slowest: PhaseRow,
}

/// One query's wall time split into host work (wall minus the stream's span) and the steps.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PhaseRow {
    pub wall_us: f64,
    pub host_us: f64,
    pub steps: SelectPhases,
}

/// Runs every query once on the GPU to warm up, then once with the cache timing its steps with
/// CUDA events, and summarises the steps against the wall time of that run.
///
/// # Errors
/// As [`run`].
pub fn gpu_phases(
    index: &Index,
    queries: &[String],
    config: &SelectionConfig,
    cache: &mut PostingCache,
    scheduler: &Scheduler,
) -> Result<PhaseSummary, BenchSelectError> {
    cache.time_phases(true).map_err(BenchSelectError::Timing)?;
    let mut rows = Vec::with_capacity(queries.len());
    for text in queries {
        let query = config.query(text);
        schedule::search(index, &query, Backend::Gpu, Some(&mut *cache), scheduler)?;
        cache.take_phases().map_err(BenchSelectError::Timing)?;
        let started = Instant::now();
        let ran = schedule::search(index, &query, Backend::Gpu, Some(&mut *cache), scheduler)?;
        let wall_us = started.elapsed().as_secs_f64() * 1e6;
        if let Some(source) = ran.fallback {
            return Err(BenchSelectError::Fallback {
                query: text.clone(),
                source,
            });
        }
        if let Some(steps) = cache.take_phases().map_err(BenchSelectError::Timing)? {
            rows.push(PhaseRow {
                wall_us,
                host_us: wall_us - steps.stream_us(),
                steps,
            });
        }
    }
    cache.time_phases(false).ok();
    // One statistic of every column: the median (nearest rank, as the latency tables) or the mean.
    let summary = |stat: fn(&[f64]) -> f64| {
        let of = |column: fn(&PhaseRow) -> f64| stat(&sorted(rows.iter().map(column)));
        PhaseRow {
            wall_us: of(|r| r.wall_us),
            host_us: of(|r| r.host_us),
            steps: SelectPhases {
                copy_in_us: of(|r| r.steps.copy_in_us),
                decode_us: of(|r| r.steps.decode_us),
                score_us: of(|r| r.steps.score_us),
                topk_us: of(|r| r.steps.topk_us),
            },
        }
    };
    let slowest = rows
        .iter()
        .copied()
        .max_by(|a, b| a.wall_us.total_cmp(&b.wall_us))
        .unwrap_or_else(|| summary(mean));
    Ok(PhaseSummary {
        queries: rows.len(),
        slowest,
        median: summary(|v| nearest_rank(v, 0.5)),
        mean: summary(mean),
    })
}

/// The ways a GPU AND step can run, each forced on every step of a query run wholly on the GPU:
/// binary search over the list decoded whole, merge path, skip entries.
pub const STEP_WAYS: [(&str, AndPlan); 3] = [
    (
        "search",
        AndPlan {
            gpu_lists: usize::MAX,
            merge_path_min_df: u32::MAX,
            skip_entry_min_ratio: u32::MAX,
            skip_entry_min_df: 0,
        },
    ),
    (
        "merge path",
        AndPlan {
            gpu_lists: usize::MAX,
            merge_path_min_df: 0,
            skip_entry_min_ratio: u32::MAX,
            skip_entry_min_df: 0,
        },
    ),
    (
        "skip entries",
        AndPlan {
            gpu_lists: usize::MAX,
            merge_path_min_df: u32::MAX,
            skip_entry_min_ratio: 0,
            skip_entry_min_df: 0,
        },
    ),
];

/// One GPU way of [`STEP_WAYS`] on one query: medians over the timed runs.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct WayTiming {
    /// Wall time of the whole query, microseconds.
    pub wall_us: f64,
    /// The stream's span from the staging copy to the top-k (CUDA events), microseconds.
    pub stream_us: f64,
    pub blocks_decoded: u64,
}

/// One AND query on the CPU and on the GPU each way of [`STEP_WAYS`].
#[derive(Debug, Clone, Serialize)]
pub struct StepWaysRun {
    pub query: String,
    /// The dfs of its terms found in the index, ascending.
    pub dfs: Vec<u32>,
    /// Median wall time on the CPU (one thread), microseconds.
    pub cpu_us: f64,
    /// In [`STEP_WAYS`] order.
    pub ways: Vec<WayTiming>,
    /// Whether every way gave the CPU's hits (documents, order, score bits).
    pub same_hits: bool,
}

/// Runs every query of `queries` in AND mode (whatever `config.mode` says) on the CPU and on
/// the GPU each way of [`STEP_WAYS`]: one warm-up of each, then `config.reps` rounds timing each
/// in turn (wall time; on the GPU also the stream's span, from the cache's CUDA events).
///
/// # Errors
/// Invalid BM25 parameters, a GPU failure (never run on the CPU instead here), or the events.
pub fn step_ways(
    index: &Index,
    queries: &[String],
    config: &SelectionConfig,
    cache: &mut PostingCache,
) -> Result<Vec<StepWaysRun>, BenchSelectError> {
    cache.time_phases(true).map_err(BenchSelectError::Timing)?;
    let mut runs = Vec::with_capacity(queries.len());
    for text in queries {
        let query = Query {
            mode: Mode::And,
            ..config.query(text)
        };
        let terms = QueryTerms::of(index, &query);
        let cpu_hits = search_terms(index, &query, &terms)?.hits;
        let mut gpu = |plan: &AndPlan| {
            let started = Instant::now();
            let ran = search_and(cache, index, &query, &terms, plan);
            let wall_us = started.elapsed().as_secs_f64() * 1e6;
            let result = ran.map_err(|err| match err {
                GpuSelectError::Query(err) => BenchSelectError::Query(err),
                GpuSelectError::Gpu(source) => BenchSelectError::Gpu {
                    query: text.clone(),
                    source,
                },
            })?;
            let steps = cache.take_phases().map_err(BenchSelectError::Timing)?;
            let timing = WayTiming {
                wall_us,
                stream_us: steps.map_or(0.0, |s| s.stream_us()),
                blocks_decoded: result.stats.blocks_decoded,
            };
            Ok::<_, BenchSelectError>((timing, result.hits))
        };
        let mut same_hits = true;
        for (_, plan) in &STEP_WAYS {
            let bits = |hits: &[(u32, f64)]| -> Vec<(u32, u64)> {
                hits.iter().map(|&(d, s)| (d, s.to_bits())).collect()
            };
            same_hits &= bits(&gpu(plan)?.1) == bits(&cpu_hits);
        }
        let mut cpu_times = Vec::with_capacity(config.reps.max(1));
        let mut way_times = vec![Vec::with_capacity(config.reps.max(1)); STEP_WAYS.len()];
        for _ in 0..config.reps.max(1) {
            let started = Instant::now();
            search_terms(index, &query, &terms)?;
            cpu_times.push(started.elapsed().as_secs_f64() * 1e6);
            for ((_, plan), times) in STEP_WAYS.iter().zip(&mut way_times) {
                times.push(gpu(plan)?.0);
            }
        }
        let ways = way_times
            .iter()
            .map(|t| WayTiming {
                wall_us: median(t.iter().map(|w| w.wall_us)),
                stream_us: median(t.iter().map(|w| w.stream_us)),
                // The same on every run: which blocks hold the candidates does not change.
                blocks_decoded: t[0].blocks_decoded,
            })
            .collect();
        runs.push(StepWaysRun {
            query: text.clone(),
            dfs: QueryShape::from_terms(&terms, query.k).dfs,
            cpu_us: median(cpu_times.into_iter()),
            ways,
            same_hits,
        });
    }
    cache.time_phases(false).ok();
    Ok(runs)
}

/// The [`StepWaysRun`]s of one decade of the length ratio (the second shortest list over the
/// shortest), medians over their queries.
#[derive(Debug, Clone, Serialize)]
pub struct RatioDecade {
    /// Ratios from 10^decade up to 10^(decade + 1).
    pub decade: u32,
    pub queries: usize,
    pub shorter_df: u32,
    pub longer_df: u32,
    pub cpu_us: f64,
    /// In [`STEP_WAYS`] order.
    pub ways: Vec<WayTiming>,
    /// Queries each was fastest on (wall time): the CPU, then each way of [`STEP_WAYS`].
    pub fastest: Vec<usize>,
    /// Queries where some way's hits differed from the CPU's.
    pub mismatches: usize,
}

/// `runs` of at least two lists grouped by decade of their length ratio, lowest first.
pub fn by_ratio(runs: &[StepWaysRun]) -> Vec<RatioDecade> {
    let mut decades: Vec<(u32, Vec<&StepWaysRun>)> = Vec::new();
    for run in runs.iter().filter(|r| r.dfs.len() >= 2 && r.dfs[0] > 0) {
        let ratio = run.dfs[1] as f64 / run.dfs[0] as f64;
        let decade = ratio.log10().floor().max(0.0) as u32;
        match decades.iter_mut().find(|(d, _)| *d == decade) {
            Some((_, runs)) => runs.push(run),
            None => decades.push((decade, vec![run])),
        }
    }
    decades.sort_by_key(|(d, _)| *d);
    decades
        .into_iter()
        .map(|(decade, runs)| {
            let median_of = |f: &dyn Fn(&StepWaysRun) -> f64| median(runs.iter().map(|r| f(r)));
            let ways = (0..STEP_WAYS.len())
                .map(|w| WayTiming {
                    wall_us: median_of(&|r| r.ways[w].wall_us),
                    stream_us: median_of(&|r| r.ways[w].stream_us),
                    blocks_decoded: median_of(&|r| r.ways[w].blocks_decoded as f64) as u64,
                })
                .collect();
            let mut fastest = vec![0; 1 + STEP_WAYS.len()];
            for r in &runs {
                let times = std::iter::once(r.cpu_us).chain(r.ways.iter().map(|w| w.wall_us));
                let best = times
                    .enumerate()
                    .min_by(|a, b| a.1.total_cmp(&b.1))
                    .map_or(0, |(i, _)| i);
                fastest[best] += 1;
            }
            RatioDecade {
                decade,
                queries: runs.len(),
                shorter_df: median_of(&|r| r.dfs[0] as f64) as u32,
                longer_df: median_of(&|r| r.dfs[1] as f64) as u32,
                cpu_us: median_of(&|r| r.cpu_us),
                ways,
                fastest,
                mismatches: runs.iter().filter(|r| !r.same_hits).count(),
            }
        })
        .collect()
}

/// Queries whose runs differ between `a` and `b` (other documents, order or score bits).
pub fn mismatches(a: &[QueryRun], b: &[QueryRun]) -> usize {
    let bits = |r: &QueryRun| r.scores.iter().map(|s| s.to_bits()).collect::<Vec<u64>>();
    let same =
        |x: &QueryRun, y: &QueryRun| x.query == y.query && x.ids == y.ids && bits(x) == bits(y);
    a.iter().zip(b).filter(|(x, y)| !same(x, y)).count() + a.len().abs_diff(b.len())
}

/// Decode speed over one set of lists: one CPU core and the GPU (one launch).
#[derive(Debug, Clone, Copy)]
pub struct DecodeComparison {
    /// Integers (docIDs + tfs) per second on one CPU core, in billions (one pass, after a
    /// warm-up pass).
    pub cpu_g_ints_per_s: f64,
    pub gpu: DecodeTiming,
}

/// Decode speed of every list of `index` with at least `min_df` postings: one CPU core
/// ([`BlockDecoder`], block by block) against the GPU ([`time_decode`], `reps` launches).
///
/// # Errors
/// A device error when an allocation, copy, launch or event fails.
pub fn decode_speed(
    cache: &PostingCache,
    index: &Index,
    min_df: u32,
    reps: usize,
) -> Result<DecodeComparison, GpuError> {
    let lists: Vec<PostingList> = (0..index.num_terms() as usize)
        .map(|i| index.postings(index.term_at(i).1))
        .filter(|l| l.df >= min_df.max(1))
        .collect();
    let postings: u64 = lists.iter().map(|l| l.df as u64).sum();
    let mut dec = BlockDecoder::new();
    let mut checksum = 0u64;
    let mut cpu_s = 0.0;
    for _pass in 0..2 {
        let started = Instant::now();
        for list in &lists {
            for j in 0..list.n_blocks() {
                let bounds = list.bounds(j);
                dec.decode_docs(list.codec, list.block_bytes(j), bounds);
                dec.decode_tfs(list.codec, list.block_bytes(j), bounds);
                checksum = checksum.wrapping_add((dec.docs[bounds.n - 1] ^ dec.tfs[0]) as u64);
            }
        }
        cpu_s = started.elapsed().as_secs_f64();
    }
    std::hint::black_box(checksum);
    Ok(DecodeComparison {
        cpu_g_ints_per_s: 2.0 * postings as f64 / cpu_s / 1e9,
        gpu: time_decode(cache.device(), index.codec(), &lists, reps)?,
    })
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
            side: Processor::Cpu,
            dfs: Vec::new(),
            hits: None,
        }
    }

    fn step_ways_run(dfs: &[u32], cpu_us: f64, walls: [f64; 3]) -> StepWaysRun {
        StepWaysRun {
            query: String::new(),
            dfs: dfs.to_vec(),
            cpu_us,
            ways: walls
                .iter()
                .map(|&wall_us| WayTiming {
                    wall_us,
                    stream_us: wall_us / 2.0,
                    blocks_decoded: wall_us as u64,
                })
                .collect(),
            same_hits: cpu_us != 0.0,
        }
    }

    #[test]
    fn ratio_decades_take_medians_and_count_the_fastest() {
        let runs = [
            step_ways_run(&[10, 50], 5.0, [9.0, 8.0, 7.0]),
            step_ways_run(&[10, 99], 1.0, [9.0, 8.0, 7.0]),
            step_ways_run(&[10, 20], 9.0, [6.0, 8.0, 7.0]),
            step_ways_run(&[3, 30_000], 0.0, [9.0, 8.0, 2.0]),
            step_ways_run(&[7], 1.0, [1.0, 1.0, 1.0]),
        ];
        let decades = by_ratio(&runs);
        assert_eq!(decades.len(), 2);
        let (first, last) = (&decades[0], &decades[1]);
        assert_eq!(
            (first.decade, first.queries, last.decade, last.queries),
            (0, 3, 4, 1)
        );
        assert_eq!(
            (first.shorter_df, first.longer_df, first.cpu_us),
            (10, 50, 5.0)
        );
        assert_eq!(first.ways[0].wall_us, 9.0);
        assert_eq!(first.ways[0].stream_us, 4.5);
        assert_eq!(first.fastest, vec![2, 1, 0, 0]);
        assert_eq!((first.mismatches, last.mismatches), (0, 1));
        assert_eq!(last.fastest, vec![1, 0, 0, 0]);
    }

    #[test]
    fn passes_run_the_whole_set_between_two_runs_of_a_query() {
        let passes = Timing::Passes.schedule(3, 2);
        let order: Vec<usize> = passes.iter().map(|&(q, _)| q).collect();
        assert_eq!(order, vec![0, 1, 2, 0, 1, 2, 0, 1, 2]);
        assert!(passes[..3].iter().all(|&(_, timed)| !timed));
        assert!(passes[3..].iter().all(|&(_, timed)| timed));
        let back = Timing::BackToBack.schedule(2, 2);
        assert_eq!(
            back,
            vec![
                (0, false),
                (0, true),
                (0, true),
                (1, false),
                (1, true),
                (1, true)
            ]
        );
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let runs: Vec<QueryRun> = (1..=1000).map(|i| run_of(f64::from(i))).collect();
        let s = LatencySummary::of(&runs);
        assert_eq!(
            (s.p50, s.p90, s.p95, s.p99, s.p999, s.max),
            (500.0, 900.0, 950.0, 990.0, 999.0, 1000.0)
        );
        assert_eq!(s.mean, 500.5);
        assert_eq!(LatencySummary::of(&[]).queries, 0);
    }
}
