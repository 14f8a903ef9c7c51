//! The CPU/GPU choice per query, and the one place where a GPU selection falls back to the CPU.
//!
//! [`Scheduler::choose`] estimates each processor's time from the query's list lengths
//! ([`QueryShape`]) with the constants of [`CostModel`], measured on the H100 host
//! (`docs/benchmarks-history.md`, issue 6: where each constant came from is written beside it), and
//! applies Griffin's rule to AND first: when the second shortest list is more than
//! `griffin_ratio` times the shortest, the CPU's skipping intersection decodes at most one block
//! per candidate and per other list while the GPU path decodes whole lists, so the CPU wins
//! whatever the estimates say. Griffin's 128 (one posting per 128-posting block, DESIGN §1) is
//! the K20-era value; measured on the H100 against one core, the GPU still wins at 1 000–10 000
//! (default 4 096, see [`DEFAULT_GRIFFIN_RATIO`]).
//!
//! For an AND query sent to the GPU, [`Scheduler::and_plan`] then decides per intersection step
//! (Griffin's rule again, between the intermediate result and the next list): the GPU intersects
//! the lists, shortest first, while the next list is resident in the GPU posting cache or at
//! most `griffin_ratio` times the intersection so far, and hands the survivors to the CPU for
//! the rest ([`crate::select::gpu::AndPlan`]). A resident list always stays: measured on the
//! H100 (`docs/benchmarks-history.md`, issue 6), handing a query over before resident lists cost 9–25 µs
//! more than searching them on the device (a wait for the survivors, their copy back, the CPU's
//! block decodes), so only a list that would cross PCIe is worth leaving to the CPU (with
//! a 16 MB cache, the queries handed over took 18–31 % less than finishing on the GPU). The
//! intersection's size is estimated before any launch, as if the terms occurred independently
//! (`|C| ≈ df₀ · Π df_s / N`), so that the lists the CPU will take are never copied or decoded,
//! and no step waits for the device to learn a count. A GPU step runs by skip entries (only
//! the blocks that may hold a candidate decoded) when its list has at least
//! `skip_entry_min_ratio` times the shortest list's postings ([`DEFAULT_SKIP_ENTRY_MIN_RATIO`]
//! says why), else by merge path when its list has at least `merge_path_min_df` postings, else
//! by binary search inside the scoring launch (by default always: [`DEFAULT_MERGE_PATH_MIN_DF`]
//! says why). AND_OR goes where its AND goes (where OR goes when a term is missing, which
//! empties the AND).
//!
//! [`search`] runs a query on the backend asked for (`auto`: the scheduler's choice and plan;
//! `gpu`: every step on the GPU); any GPU error, [`GpuError::TooLarge`] from the posting cache's
//! staging included, runs the same query on the CPU, which gives the same answer, and is
//! returned beside the result so that the caller counts and logs it.
//!
//! The processors' queues enter the estimates through a [`Load`] read from a [`Backlog`]: the
//! device runs one batch at a time, so a query bound for it first waits for the estimated
//! work booked before it (counted as if each booked query ran alone: batches shared by the
//! queries waiting together make the real wait shorter, [`run_gpu_batch`]); the CPU's queries
//! share the cores, so once more run than there are cores each takes proportionally longer.
//! [`Scheduler::route`] adds both to the estimates, so that a heavy OR waits for a busy GPU
//! when the wait plus its GPU time still beats the CPU's expected time (its mean, not the
//! crossover's figure: [`CostModel`]), and a CPU-bound query goes to an idle
//! GPU when the cores are oversubscribed (work stealing, by the idle side taking work at the
//! choice rather than by moving queries already queued); [`Choice::gpu_margin_us`] bounds how
//! long such a query may then wait for the device before running on the CPU after all. The
//! queries waiting for the device run as one batch when it is free ([`run_gpu_batch`]). Not
//! built (issue 6): a query jumping the device's queue at its deadline: the device's lock is
//! fair only eventually, and a strict queue by due time (one condition variable, every waiter
//! woken at each hand-off) measured slower under 16 clients on the H100 host (throughput
//! 2 650–3 130 → 2 040–2 850 queries/s, the server's p99 9.6–11.5 → 11.8–44.3 ms;
//! `docs/benchmarks-history.md`, issue 6, run G), so it was taken out again.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::backend::{Backend, Processor};
use crate::gpu::GpuError;
use crate::index::{Index, TermId};
use crate::select::gpu::{
    search_batch, search_one, AndPlan, BatchQuery, GpuRun, GpuSelectError, PostingCache,
};
use crate::select::SelectError;
use crate::select::{search_terms as cpu_search, Mode, Query, QueryTerms, SearchResult};

/// The length ratio above which AND runs on the CPU whatever the estimates say. Griffin's paper
/// (and DESIGN §1) take 128 for 128-posting blocks; on the H100 host against one core
/// (`docs/benchmarks-history.md`, issue 6, 10 M documents, `scripts/ratio-queries.py`: two-term AND
/// queries by length ratio) the GPU answered first in every pair up to a ratio of 10⁴ and in
/// half of those from 10⁴ to 10⁵, and replaying two 500-query runs' measured times with 1 024,
/// 4 096 or no threshold at all cut the hybrid's AND mean from 62.9 to 39.6 µs (EF) and 43.1 to
/// 31.9 µs (PFor) against 128 (200 000 documents: no change).
pub const DEFAULT_GRIFFIN_RATIO: f64 = 4096.0;

/// The postings from which a GPU AND step's list is intersected by merge path rather than by a
/// binary search per candidate inside the scoring launch: by default never. Measured on the
/// H100 (`docs/benchmarks-history.md`, issue 6, 3 M documents, 500 synthetic AND queries, two
/// interleaved rounds, per-query ratios to the one-launch AND of the commit before the steps):
/// merging every step cost a median 5–19 % more per query (more with more terms), merging lists
/// of 2¹⁶ postings or more 4–18 %, searching every list 2–6 %; the shortest list of a real query
/// is short, so a search reads log₂ n words per candidate where a merge reads the whole long
/// list. On two-term pairs by length ratio one run had merge path ahead once the longer list
/// held 10⁵ postings and the next had it behind at almost every pair: not a margin to build on.
/// Kept configurable (`--merge-path-min-df`) for indexes whose short lists are long.
pub const DEFAULT_MERGE_PATH_MIN_DF: u32 = u32::MAX;

/// The length ratio (a step's list over the shortest list, whose postings are the candidates)
/// from which a GPU AND step runs by skip entries: only the blocks that may hold a candidate
/// are decoded, at most one per candidate, where decoding the list whole decodes ratio / 128 a
/// candidate. At 1 024 the step decodes at most an eighth of the list's blocks. The price is
/// three launches and a reset, against whole-list decoding at ≈ 200 G postings/s in the query's
/// one decode launch, so it also needs a long list ([`DEFAULT_SKIP_ENTRY_MIN_DF`]). Measured on
/// the H100 (`docs/benchmarks-history.md`, issue 6, "Skip-entry steps"; two-term AND queries, 10 M
/// documents, every step one way): skip entries fastest from a ratio of 10² (118 vs 122 µs by
/// merge path, long lists of ≈ 2 M postings) to 10⁵ (238 vs 313 µs, ≈ 8 M postings).
/// `--skip-entry-min-ratio` sets it: 0 runs every step by skip entries, 4294967295 none.
pub const DEFAULT_SKIP_ENTRY_MIN_RATIO: u32 = 1024;

/// The fewest postings a list needs for a GPU AND step over it to run by skip entries. At 10 M
/// documents, with the ratio alone (1 024) deciding, the 500 synthetic queries ran 7 % slower
/// GPU-only on the mean (84.0 → 90.6 µs): decoding fell by 8 µs a query and the extra launches
/// cost more; in the two-term table skip entries only broke even over lists of ≈ 2 M postings.
/// `--skip-entry-min-df` sets it.
pub const DEFAULT_SKIP_ENTRY_MIN_DF: u32 = 1 << 21;

/// What the cost model reads of a query: the dfs of its distinct terms found in the index,
/// ascending (ties by their place in the query, as the AND's SvS order), their term ids in the
/// same order, whether a term is missing (which empties an AND), and the hits wanted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueryShape {
    pub dfs: Vec<u32>,
    pub terms: Vec<TermId>,
    pub missing_term: bool,
    pub k: usize,
}

impl QueryShape {
    /// The shape of `query` over `index`.
    pub fn of(index: &Index, query: &Query) -> QueryShape {
        QueryShape::from_terms(&QueryTerms::of(index, query), query.k)
    }

    /// The shape of a query whose terms are `terms`, wanting `k` hits.
    pub fn from_terms(terms: &QueryTerms, k: usize) -> QueryShape {
        let mut lists = Vec::new();
        let mut missing_term = false;
        for found in &terms.lists {
            match found {
                Some((id, list)) => lists.push((list.df, *id)),
                None => missing_term = true,
            }
        }
        // A stable sort keeps equal lengths in query order.
        lists.sort_by_key(|&(df, _)| df);
        QueryShape {
            dfs: lists.iter().map(|&(df, _)| df).collect(),
            terms: lists.iter().map(|&(_, id)| id).collect(),
            missing_term,
            k,
        }
    }

    /// Postings of every list.
    pub fn sum_df(&self) -> u64 {
        self.dfs.iter().map(|&d| d as u64).sum()
    }

    /// The second shortest list over the shortest (1 for fewer than two lists).
    pub fn length_ratio(&self) -> f64 {
        match self.dfs[..] {
            [shortest, second, ..] => second as f64 / shortest.max(1) as f64,
            _ => 1.0,
        }
    }

    /// The size of the intersection of the `lists` shortest lists on an index of `n_docs`, as if
    /// the terms occurred independently: df₀ · Π df_s / N.
    pub fn and_estimate(&self, lists: usize, n_docs: u32) -> f64 {
        let n = n_docs.max(1) as f64;
        let mut dfs = self.dfs.iter().take(lists).map(|&df| df as f64);
        let first = dfs.next().unwrap_or(0.0);
        dfs.fold(first, |estimate, df| estimate * df / n)
    }

    /// The CPU AND's probes: each posting of the shortest list sought in every other list
    /// (the shortest list's length for a one-term query).
    pub fn cpu_and_probes(&self) -> u64 {
        let shortest = self.dfs.first().map_or(0, |&d| d as u64);
        shortest * (self.dfs.len().max(2) as u64 - 1)
    }
}

/// Microseconds per unit of work on each processor: `fixed + per_unit × units`.
///
/// The defaults come from `rankserve bench selection --gpu --gpu-out` on the H100 host, by least
/// squares over each query's measured time (`docs/benchmarks-history.md`, issue 6):
/// - GPU (2026-11-23, commit d5ea478: top-k candidates reduced on the device; 200 000 and
///   10 000 000 documents, 500 synthetic queries each, k = 10, both fitted together): AND 36 µs
///   (EF) and 35 µs (PFor) + 0.00003 µs per posting (R² 0.97), OR 43 and 44 µs + 0.00005 per
///   posting + 0.0000145 per index document (clearing the dense accumulator, top-k over all of
///   it; R² 0.99). The constants below (40 µs, 0.00004, 0.000015) round between the modes;
///   replayed from the same runs' measured times (in-sample) they bring the 10 M-document OR
///   hybrid from 290 to 245 µs (EF) and 278 to 240 µs (PFor), under GPU-only's 255 and 260, and
///   leave every other case within 1 %.
/// - CPU AND (commit 135ef6a, 500 000 documents, the same kind of queries): 0.047 µs (EF) and 0.030 µs (PFor) per probe of [`QueryShape::cpu_and_probes`]
///   (R² 0.62 and 0.87); 0.04 between them, since replaying the queries' measured times with
///   any slope from 0.03 to 0.07 gives the same mean within 1 %.
/// - CPU OR: a line in the postings explains only 17 % of its variance (MaxScore's pruning
///   depends on the scores, not the lengths), so the slope is the crossover: 0.01 µs a posting
///   sends queries of more than ≈ 13 000 postings to the GPU, the slope that minimised the mean
///   over the same queries replayed from their measured times (in-sample). Being a crossover,
///   it is no time to weigh a queue against: since block-max MaxScore (issue 21) it is ≈ 4.6×
///   the CPU's mean time. The wait for the device is bounded by the CPU's mean instead
///   (`cpu_or_mean_*`, least squares over 1 000 `queries synth` OR queries on a 1 M-document
///   synthetic EF index, k1 = 1.2, b = 0.75, the development machine's thread CPU clock,
///   2026-11-28: 188 µs + 0.00098 µs per posting; through the origin 0.0015). With the
///   crossover as the bound, 16 clients in process on the H100 host (2 M documents) sent
///   54 % of the OR queries to the device and got fewer queries/s than the CPU alone; with the
///   mean, 25–27 % and 1.1–1.3× the CPU alone (docs/benchmarks.md, "16 clients in process").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Any CPU query (term lookups, top-k heap).
    pub cpu_fixed_us: f64,
    /// CPU AND, per probe of [`QueryShape::cpu_and_probes`].
    pub cpu_and_probe_us: f64,
    /// CPU OR, per posting of every list (see above: a crossover more than a cost).
    pub cpu_or_posting_us: f64,
    /// CPU OR's mean time, fixed part (see above: what a wait for the device is weighed
    /// against).
    pub cpu_or_mean_fixed_us: f64,
    /// CPU OR's mean time, per posting of every list.
    pub cpu_or_mean_posting_us: f64,
    /// Any GPU query: the staging copy, the launches, the kernels' latency and the one wait.
    pub gpu_fixed_us: f64,
    /// GPU, per posting of every list (decode and scoring).
    pub gpu_posting_us: f64,
    /// GPU OR, per document of the index (clearing the accumulator, top-k over all of it).
    pub gpu_or_doc_us: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            cpu_fixed_us: 2.0,
            cpu_and_probe_us: 0.04,
            cpu_or_posting_us: 0.01,
            cpu_or_mean_fixed_us: 190.0,
            cpu_or_mean_posting_us: 0.001,
            gpu_fixed_us: 40.0,
            gpu_posting_us: 0.00004,
            gpu_or_doc_us: 0.000015,
        }
    }
}

/// The per-query choice of a processor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scheduler {
    pub model: CostModel,
    /// Griffin's rule: AND runs on the CPU when the second shortest list is more than this many
    /// times the shortest, and hands over to the CPU between steps when the next list is more
    /// than this many times the intersection so far.
    pub griffin_ratio: f64,
    /// A GPU AND step runs by merge path when its list has at least this many postings.
    pub merge_path_min_df: u32,
    /// A GPU AND step runs by skip entries when its list has at least this many times the
    /// shortest list's postings and at least `skip_entry_min_df` (before merge path is
    /// considered).
    pub skip_entry_min_ratio: u32,
    pub skip_entry_min_df: u32,
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler {
            model: CostModel::default(),
            griffin_ratio: DEFAULT_GRIFFIN_RATIO,
            merge_path_min_df: DEFAULT_MERGE_PATH_MIN_DF,
            skip_entry_min_ratio: DEFAULT_SKIP_ENTRY_MIN_RATIO,
            skip_entry_min_df: DEFAULT_SKIP_ENTRY_MIN_DF,
        }
    }
}

/// A choice and why: each processor's estimated time for the query alone, and what its queue
/// adds under the [`Load`] the choice was made at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub side: Processor,
    /// The CPU's figure for the crossover (for OR, above its time: [`CostModel`]).
    pub cpu_us: f64,
    pub gpu_us: f64,
    pub cpu_wait_us: f64,
    pub gpu_wait_us: f64,
    /// The CPU's expected time for the query, its queue included: what a wait for the device is
    /// weighed against.
    pub cpu_mean_us: f64,
}

impl Choice {
    /// How long a query sent to the GPU may wait for the device before the CPU, started now,
    /// would be expected to have finished it: the CPU's expected time (with its queue) less the
    /// GPU's estimate.
    pub fn gpu_margin_us(&self) -> f64 {
        (self.cpu_mean_us - self.gpu_us).max(0.0)
    }
}

/// What the processors already have to do when a query is routed ([`Backlog::load`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// The estimated time of the queries holding or waiting for the device.
    pub gpu_queued_us: f64,
    /// The selections running on the CPU.
    pub cpu_running: usize,
    /// The cores they share.
    pub cpu_cores: usize,
}

impl Load {
    /// No queue on either side.
    pub const IDLE: Load = Load {
        gpu_queued_us: 0.0,
        cpu_running: 0,
        cpu_cores: 1,
    };

    /// How much longer a CPU query takes than alone: the running ones and it share the cores.
    fn cpu_stretch(&self) -> f64 {
        ((self.cpu_running + 1) as f64 / self.cpu_cores.max(1) as f64).max(1.0)
    }
}

/// The work handed to each processor and not yet finished, shared by the threads that route
/// queries: a [`Booking`] adds a query while it waits and runs and takes it away when dropped.
#[derive(Debug)]
pub struct Backlog {
    /// Estimated microseconds of the queries booked on the device.
    gpu_us: AtomicU64,
    /// Devices the GPU's selections are spread over: the wait is the booked time shared by them.
    gpu_devices: AtomicUsize,
    cpu_running: AtomicUsize,
    cpu_cores: usize,
}

impl Backlog {
    /// An empty backlog for a CPU of `cpu_cores` cores.
    pub fn new(cpu_cores: usize) -> Backlog {
        Backlog {
            gpu_us: AtomicU64::new(0),
            gpu_devices: AtomicUsize::new(1),
            cpu_running: AtomicUsize::new(0),
            cpu_cores: cpu_cores.max(1),
        }
    }

    /// Spreads the GPU's selections over `devices` devices from now on.
    pub fn set_gpu_devices(&self, devices: usize) {
        self.gpu_devices.store(devices.max(1), Ordering::Relaxed);
    }

    /// The queues now.
    pub fn load(&self) -> Load {
        Load {
            gpu_queued_us: self.gpu_us.load(Ordering::Relaxed) as f64
                / self.gpu_devices.load(Ordering::Relaxed) as f64,
            cpu_running: self.cpu_running.load(Ordering::Relaxed),
            cpu_cores: self.cpu_cores,
        }
    }

    /// Books a query on `side`: on the GPU, its estimate `gpu_us` (whole microseconds, at least
    /// one, so that a queue is never empty while a query holds the device); on the CPU, one
    /// more query sharing the cores.
    pub fn book(&self, side: Processor, gpu_us: f64) -> Booking<'_> {
        let us = match side {
            Processor::Gpu => {
                let us = gpu_us.ceil().max(1.0) as u64;
                self.gpu_us.fetch_add(us, Ordering::Relaxed);
                us
            }
            Processor::Cpu => {
                self.cpu_running.fetch_add(1, Ordering::Relaxed);
                0
            }
        };
        Booking {
            backlog: self,
            side,
            us,
        }
    }
}

/// A query's place in a [`Backlog`], given back when dropped.
#[derive(Debug)]
pub struct Booking<'a> {
    backlog: &'a Backlog,
    side: Processor,
    us: u64,
}

impl Drop for Booking<'_> {
    fn drop(&mut self) {
        match self.side {
            Processor::Gpu => {
                self.backlog.gpu_us.fetch_sub(self.us, Ordering::Relaxed);
            }
            Processor::Cpu => {
                self.backlog.cpu_running.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl Scheduler {
    /// The processor expected to finish `mode` over `shape` first, on an index of `n_docs`,
    /// with no queue on either side.
    pub fn choose(&self, shape: &QueryShape, mode: Mode, n_docs: u32) -> Choice {
        self.choose_under(shape, mode, n_docs, &Load::IDLE)
    }

    /// [`choose`](Self::choose) with the queues of `load`: the GPU's booked work is waited for
    /// before the query's own time; the CPU's time stretches with the queries sharing its cores.
    /// The GPU takes the query when it wins the crossover with both queues counted and its
    /// queue is within the query's margin ([`Choice::gpu_margin_us`]: for OR, the crossover's
    /// figure is no time to wait against). Idle, that is the crossover alone. Griffin's rule
    /// (an AND's second list over `griffin_ratio` times its first stays on the CPU) holds at
    /// any load.
    pub fn choose_under(&self, shape: &QueryShape, mode: Mode, n_docs: u32, load: &Load) -> Choice {
        let Estimate {
            cpu_us,
            cpu_mean_us,
            gpu_us,
            gpu_allowed,
        } = self.estimate(shape, mode, n_docs);
        let stretch = load.cpu_stretch();
        let cpu_wait_us = cpu_us * (stretch - 1.0);
        let gpu_wait_us = load.gpu_queued_us;
        let mut choice = Choice {
            side: Processor::Cpu,
            cpu_us,
            gpu_us,
            cpu_wait_us,
            gpu_wait_us,
            cpu_mean_us: cpu_mean_us * stretch,
        };
        if gpu_allowed
            && gpu_us + gpu_wait_us < cpu_us + cpu_wait_us
            && gpu_wait_us <= choice.gpu_margin_us()
        {
            choice.side = Processor::Gpu;
        }
        choice
    }

    /// Each processor's time for `mode` over `shape` alone, and whether the GPU may take it.
    fn estimate(&self, shape: &QueryShape, mode: Mode, n_docs: u32) -> Estimate {
        let m = &self.model;
        let sum_df = shape.sum_df() as f64;
        let gpu_us = m.gpu_fixed_us
            + m.gpu_posting_us * sum_df
            + match mode {
                Mode::Or => m.gpu_or_doc_us * n_docs as f64,
                _ => 0.0,
            };
        let cpu_us = m.cpu_fixed_us
            + match mode {
                Mode::And => m.cpu_and_probe_us * shape.cpu_and_probes() as f64,
                _ => m.cpu_or_posting_us * sum_df,
            };
        let cpu_mean_us = match mode {
            Mode::And => cpu_us,
            _ => m.cpu_or_mean_fixed_us + m.cpu_or_mean_posting_us * sum_df,
        };
        let gpu_allowed = match mode {
            // An AND with a missing term is empty: nothing to send anywhere.
            Mode::And => !shape.missing_term && shape.length_ratio() <= self.griffin_ratio,
            Mode::Or => !shape.dfs.is_empty(),
            Mode::AndOr => return self.estimate_and_or(shape, n_docs),
        };
        Estimate {
            cpu_us,
            cpu_mean_us,
            gpu_us,
            gpu_allowed,
        }
    }

    /// AND_OR: its OR's estimate when a missing term empties the AND; its AND's when the AND is
    /// expected to find k hits ([`QueryShape::and_estimate`]); otherwise both run, and each
    /// processor's estimate is the sum of the two.
    fn estimate_and_or(&self, shape: &QueryShape, n_docs: u32) -> Estimate {
        let or = self.estimate(shape, Mode::Or, n_docs);
        if shape.missing_term {
            return or;
        }
        let and = self.estimate(shape, Mode::And, n_docs);
        if shape.and_estimate(shape.dfs.len(), n_docs) >= shape.k as f64 {
            return and;
        }
        Estimate {
            cpu_us: and.cpu_us + or.cpu_us,
            cpu_mean_us: and.cpu_mean_us + or.cpu_mean_us,
            gpu_us: and.gpu_us + or.gpu_us,
            gpu_allowed: true,
        }
    }

    /// The AND plan of a query bound for the GPU: `auto`'s per-step plan from its shape
    /// ([`Scheduler::and_plan`], with `cache`'s resident lists), or, without a shape (`gpu`),
    /// every step on the GPU.
    pub fn plan_for(
        &self,
        shape: Option<&QueryShape>,
        index: &Index,
        cache: &PostingCache,
    ) -> AndPlan {
        match shape {
            Some(shape) => self.and_plan(shape, index.num_docs(), |t| cache.is_resident(index, t)),
            None => AndPlan::gpu_only(
                self.merge_path_min_df,
                (self.skip_entry_min_ratio, self.skip_entry_min_df),
            ),
        }
    }

    /// How the GPU runs an AND over `shape` on an index of `n_docs` (see the module docs): the
    /// lists, shortest first (the shortest always), while each is resident in the GPU posting
    /// cache (`resident` says which terms are) or at most `griffin_ratio` times the
    /// intersection's estimated size so far.
    pub fn and_plan(
        &self,
        shape: &QueryShape,
        n_docs: u32,
        resident: impl Fn(TermId) -> bool,
    ) -> AndPlan {
        let mut gpu_lists = 1;
        while let Some(&df) = shape.dfs.get(gpu_lists) {
            let so_far = shape.and_estimate(gpu_lists, n_docs);
            let copied = !shape.terms.get(gpu_lists).is_some_and(|&t| resident(t));
            if copied && df as f64 > self.griffin_ratio * so_far.max(1.0) {
                break;
            }
            gpu_lists += 1;
        }
        AndPlan {
            gpu_lists,
            merge_path_min_df: self.merge_path_min_df,
            skip_entry_min_ratio: self.skip_entry_min_ratio,
            skip_entry_min_df: self.skip_entry_min_df,
        }
    }

    /// Where `backend` sends `query` under `load`: the GPU always for `gpu`, when
    /// [`choose_under`](Self::choose_under) prefers it for `auto`, never for `cpu`. A caller that
    /// must take the device before using it routes the query first, so that a query bound for
    /// the CPU does not hold the device while it runs there, books it ([`Backlog::book`] with
    /// [`Route::choice`]) and runs the route ([`search_routed`]): the terms the estimate looked
    /// up serve the search.
    pub fn route<'a>(
        &self,
        index: &'a Index,
        query: &Query,
        backend: Backend,
        load: &Load,
    ) -> Route<'a> {
        let terms = QueryTerms::of(index, query);
        let shape = QueryShape::from_terms(&terms, query.k);
        let mut choice = self.choose_under(&shape, query.mode, index.num_docs(), load);
        choice.side = match backend {
            Backend::Auto => choice.side,
            Backend::Cpu => Processor::Cpu,
            Backend::Gpu => Processor::Gpu,
        };
        Route {
            terms,
            // `gpu` runs every step on the GPU; only `auto` plans the hand-over.
            shape: (backend == Backend::Auto).then_some(shape),
            choice,
        }
    }
}

/// Each processor's time for a query alone.
#[derive(Debug, Clone, Copy)]
struct Estimate {
    /// The CPU's figure for the crossover.
    cpu_us: f64,
    /// The CPU's mean time ([`Choice::cpu_mean_us`]).
    cpu_mean_us: f64,
    gpu_us: f64,
    /// Whether the query may run on the GPU at all (Griffin's rule, a query with no list).
    gpu_allowed: bool,
}

/// Where a query goes ([`Scheduler::route`]), and what deciding it looked up.
#[derive(Debug)]
pub struct Route<'a> {
    /// The query's terms, looked up once for the estimate and the search on either side.
    terms: QueryTerms<'a>,
    /// `auto`'s shape, for the per-step plan.
    shape: Option<QueryShape>,
    /// The processor it goes to and the estimates behind it.
    pub choice: Choice,
}

impl Route<'_> {
    /// Whether the query goes to the GPU.
    pub fn to_gpu(&self) -> bool {
        self.choice.side == Processor::Gpu
    }
}

/// A query's answer and where it came from.
#[derive(Debug)]
pub struct Scheduled {
    pub result: SearchResult,
    pub side: Processor,
    /// The GPU error that sent the query back to the CPU.
    pub fallback: Option<GpuError>,
}

/// Runs `query` on the backend `backend` asks for (see the module docs), routed as if both
/// processors were idle; `gpu` is the posting cache of the device, `None` without one (every
/// query then runs on the CPU).
///
/// # Errors
/// [`SelectError::InvalidParameter`] for BM25 parameters out of range, on any backend.
pub fn search(
    index: &Index,
    query: &Query,
    backend: Backend,
    gpu: Option<&mut PostingCache>,
    scheduler: &Scheduler,
) -> Result<Scheduled, SelectError> {
    let route = scheduler.route(index, query, backend, &Load::IDLE);
    search_routed(index, query, route, gpu, scheduler)
}

/// [`search`] along a route already taken ([`Scheduler::route`] of the same index and query).
///
/// # Errors
/// As [`search`].
pub fn search_routed(
    index: &Index,
    query: &Query,
    route: Route,
    gpu: Option<&mut PostingCache>,
    scheduler: &Scheduler,
) -> Result<Scheduled, SelectError> {
    // The parameters are checked once, by the GPU's batch or by the CPU's search.
    let answer = match (route.to_gpu(), gpu) {
        (true, Some(cache)) => {
            let plan = scheduler.plan_for(route.shape.as_ref(), index, cache);
            let run = GpuRun::of(query.mode, plan);
            Some(search_one(cache, index, run, query, &route.terms))
        }
        _ => None,
    };
    settle(index, query, route, answer)
}

/// The answer of a routed query from the GPU's (`None`: it did not run there): the GPU's
/// result, or the CPU's when the GPU failed (with the error, for the caller to count and log).
///
/// # Errors
/// As [`search`].
pub fn settle(
    index: &Index,
    query: &Query,
    route: Route,
    gpu: Option<Result<SearchResult, GpuSelectError>>,
) -> Result<Scheduled, SelectError> {
    let fallback = match gpu {
        Some(Ok(result)) => {
            return Ok(Scheduled {
                result,
                side: Processor::Gpu,
                fallback: None,
            })
        }
        Some(Err(GpuSelectError::Query(err))) => return Err(err),
        Some(Err(GpuSelectError::Gpu(err))) => Some(err),
        None => None,
    };
    Ok(Scheduled {
        result: cpu_search(index, query, &route.terms)?,
        side: Processor::Cpu,
        fallback,
    })
}

/// A query bound for the GPU, owned, so that whichever thread holds the device runs it in a
/// batch with other requests' queries ([`run_gpu_batch`]).
#[derive(Debug)]
pub struct GpuJob {
    index: Arc<Index>,
    query: Query,
    /// The route's term lookups (the lists are taken from the index again, without a search).
    terms: Vec<Option<TermId>>,
    shape: Option<QueryShape>,
}

impl Route<'_> {
    /// This route's query as a [`GpuJob`] over `index` (the index it was routed on).
    pub fn gpu_job(&self, index: Arc<Index>, query: &Query) -> GpuJob {
        GpuJob {
            index,
            query: query.clone(),
            terms: self
                .terms
                .lists
                .iter()
                .map(|l| l.map(|(id, _)| id))
                .collect(),
            shape: self.shape.clone(),
        }
    }
}

/// Runs `jobs` on the GPU in batches ([`crate::select::gpu::search_batch`]), one per index
/// (consecutive jobs of one index share a batch), each with the plan [`search_routed`] would
/// give it; answers in job order. A batch's device error is the first job's answer; the
/// others' say that their batch failed (each then runs on the CPU).
pub fn run_gpu_batch(
    cache: &mut PostingCache,
    scheduler: &Scheduler,
    jobs: &[GpuJob],
) -> Vec<Result<SearchResult, GpuSelectError>> {
    let mut answers = Vec::with_capacity(jobs.len());
    for group in jobs.chunk_by(|a, b| Arc::ptr_eq(&a.index, &b.index)) {
        let index = &*group[0].index;
        let terms: Vec<QueryTerms> = (group.iter())
            .map(|job| QueryTerms {
                lists: (job.terms.iter())
                    .map(|id| id.map(|id| (id, index.postings(id))))
                    .collect(),
            })
            .collect();
        let batch: Vec<BatchQuery> = (group.iter().zip(&terms))
            .map(|(job, terms)| BatchQuery {
                query: &job.query,
                terms,
                run: GpuRun::of(
                    job.query.mode,
                    scheduler.plan_for(job.shape.as_ref(), index, cache),
                ),
            })
            .collect();
        match search_batch(cache, index, &batch) {
            Ok(ran) => answers.extend(ran),
            Err(err) => {
                let reason = err.to_string();
                answers.push(Err(err.into()));
                answers.extend((1..group.len()).map(|_| {
                    let reason = reason.clone();
                    Err(GpuError::BatchFailed { reason }.into())
                }));
            }
        }
    }
    answers
}

#[cfg(test)]
mod tests;
