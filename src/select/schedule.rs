//! The CPU/GPU choice per query, and the one place where a GPU selection falls back to the CPU.
//!
//! [`Scheduler::choose`] estimates each processor's time from the query's list lengths
//! ([`QueryShape`]) with the constants of [`CostModel`], measured on the H100 host
//! (`docs/benchmarks.md`, issue 6: where each constant came from is written beside it), and
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
//! H100 (`docs/benchmarks.md`, issue 6), handing a query over before resident lists cost 9–25 µs
//! more than searching them on the device (a wait for the survivors, their copy back, the CPU's
//! block decodes), so only a list that would cross PCIe is worth leaving to the CPU (with
//! a 16 MB cache, the queries handed over took 18–31 % less than finishing on the GPU). The
//! intersection's size is estimated before any launch, as if the terms occurred independently
//! (`|C| ≈ df₀ · Π df_s / N`), so that the lists the CPU will take are never copied or decoded,
//! and no step waits for the device to learn a count. A GPU step runs by merge path when its
//! list has at least `merge_path_min_df` postings, else by binary search inside the scoring
//! launch (by default always: [`DEFAULT_MERGE_PATH_MIN_DF`] says why). AND_OR goes where its
//! AND goes (where OR goes when a term is missing, which empties the AND).
//!
//! [`search`] runs a query on the backend asked for (`auto`: the scheduler's choice and plan;
//! `gpu`: every step on the GPU); any GPU error, [`GpuError::TooLarge`] from the posting cache's
//! staging included, runs the same query on the CPU, which gives the same answer, and is
//! returned beside the result so that the caller counts and logs it.
//!
//! Not built (issue 6): the processors' queues in the estimates. The only work stealing is the
//! server's: an `auto` query that finds the GPU busy runs on the CPU, and a `gpu` query that
//! waits for it longer than its deadline too (`State::with_posting_cache`).

use crate::config::Backend;
use crate::gpu::GpuError;
use crate::index::{Index, TermId};
use crate::select::gpu::{
    search_and, search_and_or, search_or, AndPlan, GpuSelectError, PostingCache,
};
use crate::select::{check_params, SelectError};
use crate::select::{search_terms as cpu_search, Mode, Query, QueryTerms, SearchResult};

/// The length ratio above which AND runs on the CPU whatever the estimates say. Griffin's paper
/// (and DESIGN §1) take 128 for 128-posting blocks; on the H100 host against one core
/// (`docs/benchmarks.md`, issue 6, 10 M documents, `scripts/ratio-queries.py`: two-term AND
/// queries by length ratio) the GPU answered first in every pair up to a ratio of 10⁴ and in
/// half of those from 10⁴ to 10⁵, and replaying two 500-query runs' measured times with 1 024,
/// 4 096 or no threshold at all cut the hybrid's AND mean from 62.9 to 39.6 µs (EF) and 43.1 to
/// 31.9 µs (PFor) against 128 (200 000 documents: no change).
pub const DEFAULT_GRIFFIN_RATIO: f64 = 4096.0;

/// The postings from which a GPU AND step's list is intersected by merge path rather than by a
/// binary search per candidate inside the scoring launch: by default never. Measured on the
/// H100 (`docs/benchmarks.md`, issue 6, 3 M documents, 500 synthetic AND queries, two
/// interleaved rounds, per-query ratios to the one-launch AND of the commit before the steps):
/// merging every step cost a median 5–19 % more per query (more with more terms), merging lists
/// of 2¹⁶ postings or more 4–18 %, searching every list 2–6 %; the shortest list of a real query
/// is short, so a search reads log₂ n words per candidate where a merge reads the whole long
/// list. On two-term pairs by length ratio one run had merge path ahead once the longer list
/// held 10⁵ postings and the next had it behind at almost every pair: not a margin to build on.
/// Kept configurable (`--merge-path-min-df`) for indexes whose short lists are long.
pub const DEFAULT_MERGE_PATH_MIN_DF: u32 = u32::MAX;

/// The processor that answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Cpu,
    Gpu,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Cpu => "cpu",
            Side::Gpu => "gpu",
        }
    }
}

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
/// squares over each query's measured time (`docs/benchmarks.md`, issue 6):
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
///   over the same queries replayed from their measured times (in-sample).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Any CPU query (term lookups, top-k heap).
    pub cpu_fixed_us: f64,
    /// CPU AND, per probe of [`QueryShape::cpu_and_probes`].
    pub cpu_and_probe_us: f64,
    /// CPU OR, per posting of every list (see above: a crossover more than a cost).
    pub cpu_or_posting_us: f64,
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
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler {
            model: CostModel::default(),
            griffin_ratio: DEFAULT_GRIFFIN_RATIO,
            merge_path_min_df: DEFAULT_MERGE_PATH_MIN_DF,
        }
    }
}

/// A choice and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub side: Side,
    pub cpu_us: f64,
    pub gpu_us: f64,
}

impl Scheduler {
    /// The processor expected to finish `mode` over `shape` first, on an index of `n_docs`.
    pub fn choose(&self, shape: &QueryShape, mode: Mode, n_docs: u32) -> Choice {
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
        let gpu_wins = match mode {
            // An AND with a missing term is empty: nothing to send anywhere.
            Mode::And => {
                !shape.missing_term && shape.length_ratio() <= self.griffin_ratio && gpu_us < cpu_us
            }
            Mode::Or => !shape.dfs.is_empty() && gpu_us < cpu_us,
            Mode::AndOr => return self.choose_and_or(shape, n_docs),
        };
        Choice {
            side: if gpu_wins { Side::Gpu } else { Side::Cpu },
            cpu_us,
            gpu_us,
        }
    }
}

impl Scheduler {
    /// AND_OR: where its OR goes when a missing term empties the AND; where its AND goes when
    /// the AND is expected to find k hits ([`QueryShape::and_estimate`]); otherwise both run, and
    /// the processor with the smaller sum of the two estimates takes the query.
    fn choose_and_or(&self, shape: &QueryShape, n_docs: u32) -> Choice {
        let or = self.choose(shape, Mode::Or, n_docs);
        if shape.missing_term {
            return or;
        }
        let and = self.choose(shape, Mode::And, n_docs);
        if shape.and_estimate(shape.dfs.len(), n_docs) >= shape.k as f64 {
            return and;
        }
        let (cpu_us, gpu_us) = (and.cpu_us + or.cpu_us, and.gpu_us + or.gpu_us);
        Choice {
            side: if gpu_us < cpu_us {
                Side::Gpu
            } else {
                Side::Cpu
            },
            cpu_us,
            gpu_us,
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
        }
    }

    /// Where `backend` sends `query`: the GPU always for `gpu`, when
    /// [`choose`](Self::choose) prefers it for `auto`, never for `cpu`. A caller that must take
    /// the device before using it routes the query first, so that a query bound for the CPU does
    /// not hold the device while it runs there, then runs the route ([`search_routed`]): the
    /// terms the estimate looked up serve the search.
    pub fn route<'a>(&self, index: &'a Index, query: &Query, backend: Backend) -> Route<'a> {
        let (terms, shape) = match backend {
            // Nothing to estimate: the GPU path looks its lists up itself.
            Backend::Gpu => (None, None),
            Backend::Cpu => (Some(QueryTerms::of(index, query)), None),
            Backend::Auto => {
                let terms = QueryTerms::of(index, query);
                let shape = QueryShape::from_terms(&terms, query.k);
                (Some(terms), Some(shape))
            }
        };
        let to_gpu = match &shape {
            Some(shape) => self.choose(shape, query.mode, index.num_docs()).side == Side::Gpu,
            None => backend == Backend::Gpu,
        };
        Route {
            terms,
            shape,
            to_gpu,
        }
    }
}

/// Where a query goes ([`Scheduler::route`]), and what deciding it looked up.
#[derive(Debug)]
pub struct Route<'a> {
    /// The query's terms, for a search on the CPU (`None` for `gpu`, until a fallback needs them).
    terms: Option<QueryTerms<'a>>,
    /// `auto`'s shape, for the per-step plan.
    shape: Option<QueryShape>,
    /// Whether the query goes to the GPU.
    pub to_gpu: bool,
}

/// A query's answer and where it came from.
#[derive(Debug)]
pub struct Scheduled {
    pub result: SearchResult,
    pub side: Side,
    /// The GPU error that sent the query back to the CPU.
    pub fallback: Option<GpuError>,
}

/// Runs `query` on the backend `backend` asks for (see the module docs); `gpu` is the posting
/// cache of the device, `None` without one (every query then runs on the CPU).
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
    let route = scheduler.route(index, query, backend);
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
    check_params(query.params)?;
    let mut fallback = None;
    if let (true, Some(cache)) = (route.to_gpu, gpu) {
        let plan = match &route.shape {
            Some(shape) => {
                scheduler.and_plan(shape, index.num_docs(), |t| cache.is_resident(index, t))
            }
            None => AndPlan::gpu_only(scheduler.merge_path_min_df),
        };
        let ran = match query.mode {
            Mode::Or => search_or(cache, index, query),
            Mode::And => search_and(cache, index, query, &plan),
            Mode::AndOr => search_and_or(cache, index, query, &plan),
        };
        match ran {
            Ok(result) => {
                return Ok(Scheduled {
                    result,
                    side: Side::Gpu,
                    fallback: None,
                })
            }
            Err(GpuSelectError::Query(err)) => return Err(err),
            Err(GpuSelectError::Gpu(err)) => fallback = Some(err),
        }
    }
    let terms = route.terms.unwrap_or_else(|| QueryTerms::of(index, query));
    Ok(Scheduled {
        result: cpu_search(index, query, &terms)?,
        side: Side::Cpu,
        fallback,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(dfs: &[u32]) -> QueryShape {
        QueryShape {
            dfs: dfs.to_vec(),
            terms: (0..dfs.len() as TermId).collect(),
            missing_term: false,
            k: 10,
        }
    }

    #[test]
    fn griffin_sends_a_short_list_against_long_ones_to_the_cpu() {
        let s = Scheduler {
            model: CostModel {
                cpu_and_probe_us: 1e3,
                ..CostModel::default()
            },
            ..Scheduler::default()
        };
        // The estimates prefer the GPU; the ratio decides.
        let at_ratio = 100 * DEFAULT_GRIFFIN_RATIO as u32;
        assert_eq!(
            s.choose(&shape(&[100, at_ratio]), Mode::And, 1 << 20).side,
            Side::Gpu
        );
        assert_eq!(
            s.choose(&shape(&[100, at_ratio + 1]), Mode::And, 1 << 20)
                .side,
            Side::Cpu
        );
        let strict = Scheduler {
            griffin_ratio: 2.0,
            ..s
        };
        assert_eq!(
            strict.choose(&shape(&[100, 201]), Mode::And, 1 << 20).side,
            Side::Cpu
        );
    }

    #[test]
    fn estimates_grow_with_the_lists() {
        let s = Scheduler::default();
        let small = s.choose(&shape(&[10, 20]), Mode::Or, 500_000);
        let large = s.choose(&shape(&[200_000, 300_000]), Mode::Or, 500_000);
        assert_eq!(small.side, Side::Cpu);
        assert_eq!(large.side, Side::Gpu);
        assert!(large.cpu_us > small.cpu_us && large.gpu_us > small.gpu_us);
        assert_eq!(s.choose(&shape(&[]), Mode::Or, 500_000).side, Side::Cpu);
        let missing = QueryShape {
            missing_term: true,
            ..shape(&[200_000, 300_000])
        };
        assert_eq!(s.choose(&missing, Mode::And, 500_000).side, Side::Cpu);
        // AND_OR goes where its OR goes when a term is missing, where its AND goes when the
        // AND should find k hits, else where both together cost least.
        assert_eq!(
            s.choose(&missing, Mode::AndOr, 500_000),
            s.choose(&missing, Mode::Or, 500_000)
        );
        let many = shape(&[200_000, 300_000]);
        assert!(many.and_estimate(2, 500_000) >= 10.0);
        assert_eq!(
            s.choose(&many, Mode::AndOr, 500_000),
            s.choose(&many, Mode::And, 500_000)
        );
        // Two lists of 100 among 10⁶ documents: 0.01 expected in the AND, so OR runs too; the
        // CPU wins both. 20 and 200 000: 4 expected; OR's 200 020 postings go to the GPU.
        for (dfs, side) in [(&[100, 100][..], Side::Cpu), (&[20, 200_000], Side::Gpu)] {
            let few = shape(dfs);
            assert!(few.and_estimate(2, 1_000_000) < 10.0);
            let (and, or) = (
                s.choose(&few, Mode::And, 1_000_000),
                s.choose(&few, Mode::Or, 1_000_000),
            );
            let and_or = s.choose(&few, Mode::AndOr, 1_000_000);
            assert_eq!(and_or.cpu_us, and.cpu_us + or.cpu_us);
            assert_eq!(and_or.gpu_us, and.gpu_us + or.gpu_us);
            assert_eq!(and_or.side, side, "{dfs:?}");
        }
    }

    #[test]
    fn and_plans_hand_over_when_the_next_list_outgrows_the_intersection() {
        let s = Scheduler {
            griffin_ratio: 100.0,
            ..Scheduler::default()
        };
        let plan = |dfs: &[u32], n_docs| s.and_plan(&shape(dfs), n_docs, |_| false).gpu_lists;
        // 1 000 × 5 000 / 10 000 = 500 estimated after two lists: 50 000 is within 100 × 500,
        // 50 001 is not.
        assert_eq!(plan(&[1_000, 5_000, 50_000], 10_000), 3);
        assert_eq!(plan(&[1_000, 5_000, 50_001], 10_000), 2);
        // The second list is Griffin's per-query rule: beyond it the GPU keeps the shortest only.
        assert_eq!(plan(&[1_000, 100_001], 1_000_000), 1);
        assert_eq!(plan(&[1_000, 100_000], 1_000_000), 2);
        assert_eq!(plan(&[7], 1_000_000), 1);
        assert_eq!(plan(&[], 1_000_000), 1);
        // An estimate under one document counts as one.
        assert_eq!(plan(&[1, 1, 100, 101], 1_000_000), 3);
        // A resident list stays on the GPU however long: searching it there costs no copy.
        let resident_second = |t: TermId| t == 1;
        let plan_resident = |dfs: &[u32]| s.and_plan(&shape(dfs), 1_000_000, resident_second);
        assert_eq!(plan_resident(&[1_000, 900_000]).gpu_lists, 2);
        assert_eq!(plan_resident(&[1_000, 900_000, 950_000]).gpu_lists, 2);
        assert_eq!(
            s.and_plan(&shape(&[1, 2]), 0, |_| true).merge_path_min_df,
            s.merge_path_min_df
        );
    }

    #[test]
    fn cpu_and_probes_seek_the_shortest_list_in_every_other() {
        assert_eq!(shape(&[3, 200, 1_000_000]).cpu_and_probes(), 6);
        assert_eq!(shape(&[7]).cpu_and_probes(), 7);
        assert_eq!(shape(&[]).cpu_and_probes(), 0);
        assert_eq!(shape(&[5]).length_ratio(), 1.0);
    }
}
