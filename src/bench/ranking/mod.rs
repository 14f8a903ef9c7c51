//! The ranking-stage benchmark (`rankserve bench ranking`): latency per batch of feature
//! vectors on the CPU (one thread, and all threads) and on the GPU (end to end, copies
//! included), the GPU's phase breakdown as in Tadros (copy features in, copy the model on first
//! use, MIT, ME, copy scores out), the crossover batch size per ranker, an optional check of the
//! scores against a reference (the LightGBM peer's own predictions), and, on request, power and
//! energy per 1 000 documents under a constant load.
//!
//! Feature extraction is not timed here: the documents arrive as feature vectors (from
//! [`crate::rank::synth::synth_features`] or a CSV). Every timing is taken after a warm-up call;
//! CPU and end-to-end GPU times are host wall-clock times of the whole call (the GPU call
//! returns after the scores are on the host), and the GPU phases come from CUDA events.
//!
//! The driver, its configuration and result types are here; the power runs are in `power`, the
//! text tables in `tables` and the SVG plot in `plot`.

mod plot;
mod power;
mod tables;

pub use plot::svg;
pub use power::{bench_power, PowerConfig, PowerReport, PowerRun, Rapl};
pub use tables::{fmt_us, layout_table, tables};

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::gpu::power::PowerError;
use crate::gpu::{GpuDevice, GpuError};
use crate::rank::cpu::CpuPlan;
use crate::rank::gpu::ranker::{GpuPhases, GpuRanker};
use crate::rank::model::{Input, Ranker};
use crate::rank::plan::PlanOptions;

/// Why the benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The GPU failed part way (it was usable at the start).
    #[error("ranker {ranker}: GPU failure during {what}: {source}")]
    Gpu {
        ranker: String,
        what: &'static str,
        #[source]
        source: Box<GpuError>,
    },
    /// A power reading failed part way.
    #[error("power measurement of {what}: {source}")]
    Power {
        what: String,
        #[source]
        source: Box<PowerError>,
    },
    /// The CPU thread pool could not be built.
    #[error("could not start {threads} CPU threads: {source}")]
    Threads {
        threads: usize,
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
    /// Feature rows or reference scores do not fit the ranker.
    #[error("ranker {ranker}: {what}")]
    Input { ranker: String, what: String },
}

/// A ranker to benchmark, with optional fixed rows and reference scores.
#[derive(Debug, Clone)]
pub struct BenchRanker {
    /// Its name in the tables.
    pub name: String,
    /// The ranker.
    pub ranker: Ranker,
    /// Feature rows (row-major) to use instead of synthetic ones; repeated to fill large batches.
    pub rows: Option<Vec<f64>>,
    /// Reference scores of `rows` (e.g. the peer library's own), checked on every backend.
    pub reference: Option<Vec<f64>>,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Batch sizes, in documents.
    pub docs: Vec<usize>,
    /// Threads of the "all threads" CPU column.
    pub threads: usize,
    /// The most timed repetitions per cell (after one warm-up call); 0 counts as 1.
    pub reps: usize,
    /// The fewest timed repetitions per cell, when the budget allows (at most `reps`).
    pub min_reps: usize,
    /// Time a cell may take: repetitions stop at `reps` or when this is used, whichever first
    /// (but never below `min_reps`).
    pub budget: Duration,
    /// Seed of the synthetic feature rows.
    pub seed: u64,
}

/// Latency statistics of one cell, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    pub reps: usize,
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    pub min_us: f64,
    pub max_us: f64,
}

impl Stats {
    /// Statistics of a non-empty list of samples (nearest-rank percentiles).
    pub fn of(samples: &mut [f64]) -> Stats {
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let at = |q: f64| samples[((q * (n - 1) as f64).round() as usize).min(n - 1)];
        Stats {
            reps: n,
            median_us: if n % 2 == 1 {
                samples[n / 2]
            } else {
                (samples[n / 2 - 1] + samples[n / 2]) / 2.0
            },
            p10_us: at(0.1),
            p90_us: at(0.9),
            min_us: samples[0],
            max_us: samples[n - 1],
        }
    }
}

/// One batch size of one ranker.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub docs: usize,
    pub cpu_1: Stats,
    pub cpu_all: Stats,
    /// End to end: staging, copies, kernels, copy back, synchronisation.
    pub gpu: Option<Stats>,
    /// Median of each phase over the timed repetitions.
    pub gpu_phases: Option<GpuPhases>,
}

/// Scores of every backend against the reference.
#[derive(Debug, Clone, Serialize)]
pub struct ReferenceCheck {
    pub rows: usize,
    /// Largest |ours − theirs| / max(1, |theirs|) per backend.
    pub cpu_max_rel_error: f64,
    pub gpu_max_rel_error: Option<f64>,
    /// The tolerance: 1e-6.
    pub tolerance: f64,
    pub passed: bool,
}

/// Everything measured for one ranker.
#[derive(Debug, Clone, Serialize)]
pub struct RankerReport {
    pub name: String,
    pub features: usize,
    pub inputs: usize,
    pub tree_inputs: usize,
    pub ensemble_trees: usize,
    pub layers: Vec<usize>,
    /// First upload of the model to the device (host layout + copies), and the median of
    /// three more.
    pub upload_first_us: Option<f64>,
    pub upload_us: Option<f64>,
    /// Bytes of the model on the device.
    pub model_bytes: Option<usize>,
    pub cells: Vec<Cell>,
    /// The smallest measured batch size from which the GPU is faster at every larger measured
    /// size, against one CPU thread and against all threads.
    pub crossover_cpu_1: Option<usize>,
    pub crossover_cpu_all: Option<usize>,
    pub reference: Option<ReferenceCheck>,
}

/// The whole benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub host: String,
    pub cpu_threads: usize,
    /// The GPU's name, or why there is none.
    pub gpu: Result<String, String>,
    pub rankers: Vec<RankerReport>,
    pub power: Option<PowerReport>,
}

fn elapsed_us(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e6
}

/// Times `f` after one warm-up call: up to `reps` repetitions within `budget`, at least
/// `min_reps`; a cell whose warm-up alone took longer than the budget gets one timed run.
fn time<E>(config: &BenchConfig, mut f: impl FnMut() -> Result<(), E>) -> Result<Stats, E> {
    let warm = Instant::now();
    f()?;
    let estimate = warm.elapsed().as_secs_f64().max(1e-9);
    let budget = config.budget.as_secs_f64();
    let most = config.reps.max(1);
    let reps = match estimate > budget {
        true => 1,
        false => ((budget / estimate) as usize).clamp(config.min_reps.clamp(1, most), most),
    };
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        samples.push(elapsed_us(start));
    }
    Ok(Stats::of(&mut samples))
}

/// `n` documents' rows: the ranker's own rows repeated, or synthetic ones.
pub(super) fn rows_for(bench: &BenchRanker, n: usize, seed: u64) -> Vec<f64> {
    let nf = bench.ranker.features.len();
    match &bench.rows {
        Some(rows) if !rows.is_empty() => rows.iter().copied().cycle().take(n * nf).collect(),
        _ => crate::rank::synth::synth_features(&bench.ranker, n, seed),
    }
}

/// |a − b| / max(1, |b|), NaN equal only to NaN.
fn relative_error(a: f64, b: f64) -> f64 {
    if a == b || (a.is_nan() && b.is_nan()) {
        0.0
    } else {
        (a - b).abs() / b.abs().max(1.0)
    }
}

fn max_relative_error(ours: &[f64], theirs: &[f64]) -> f64 {
    ours.iter()
        .zip(theirs)
        .map(|(&a, &b)| relative_error(a, b))
        .fold(0.0, f64::max)
}

/// The smallest size from which `faster` holds at every larger measured size.
fn crossover(cells: &[Cell], faster: impl Fn(&Cell) -> bool) -> Option<usize> {
    let mut from = None;
    for cell in cells.iter().rev() {
        if faster(cell) {
            from = Some(cell.docs);
        } else {
            break;
        }
    }
    from
}

fn median_phases(samples: &[GpuPhases]) -> GpuPhases {
    let med = |f: fn(&GpuPhases) -> f64| {
        Stats::of(&mut samples.iter().map(f).collect::<Vec<_>>()).median_us
    };
    GpuPhases {
        stage_us: med(|p| p.stage_us),
        copy_in_us: med(|p| p.copy_in_us),
        mit_us: med(|p| p.mit_us),
        me_us: med(|p| p.me_us),
        copy_out_us: med(|p| p.copy_out_us),
    }
}

pub(super) fn gpu_err<'a>(
    ranker: &'a str,
    what: &'static str,
) -> impl FnOnce(GpuError) -> BenchError + 'a {
    move |source| BenchError::Gpu {
        ranker: ranker.to_string(),
        what,
        source: Box::new(source),
    }
}

/// Runs the "all threads" CPU column: on the global rayon pool when it has `threads` threads (so
/// that a batch too small to split runs on the caller's thread, as in the server), else on a
/// pool of its own, built once.
pub(super) struct CpuThreads(Option<rayon::ThreadPool>);

impl CpuThreads {
    pub(super) fn new(threads: usize) -> Result<CpuThreads, BenchError> {
        if rayon::current_num_threads() == threads {
            return Ok(CpuThreads(None));
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map(|pool| CpuThreads(Some(pool)))
            .map_err(|source| BenchError::Threads { threads, source })
    }

    pub(super) fn score(&self, plan: &CpuPlan, rows: &[f64]) -> Vec<f64> {
        match &self.0 {
            None => plan.score_batch(rows, 0),
            Some(pool) => pool.install(|| plan.score_batch(rows, 0)),
        }
    }
}

/// Measures one ranker at every batch size.
///
/// # Errors
/// [`BenchError::Gpu`] when the GPU fails part way; [`BenchError::Input`] when the rows or
/// reference scores do not fit the ranker.
pub fn bench_ranker(
    bench: &BenchRanker,
    config: &BenchConfig,
    gpu: Option<&GpuDevice>,
    progress: &mut dyn FnMut(&str),
) -> Result<RankerReport, BenchError> {
    let ranker = &bench.ranker;
    let name = bench.name.as_str();
    let nf = ranker.features.len();
    if nf == 0 || bench.rows.as_ref().is_some_and(|r| r.len() % nf != 0) {
        return Err(BenchError::Input {
            ranker: name.into(),
            what: format!("feature rows must hold a multiple of {nf} values (one per feature)"),
        });
    }
    let plan = CpuPlan::new(ranker);
    let pool = CpuThreads::new(config.threads)?;
    let mut report = RankerReport {
        name: name.into(),
        features: nf,
        inputs: ranker.inputs.len(),
        tree_inputs: ranker
            .inputs
            .iter()
            .filter(|i| matches!(i, Input::Tree(_)))
            .count(),
        ensemble_trees: ranker.ensemble.as_ref().map_or(0, |e| e.trees.len()),
        layers: ranker.layers.iter().map(|l| l.outputs).collect(),
        upload_first_us: None,
        upload_us: None,
        model_bytes: None,
        cells: Vec::new(),
        crossover_cpu_1: None,
        crossover_cpu_all: None,
        reference: None,
    };
    let gpu_ranker = match gpu {
        Some(device) => {
            let upload = || -> Result<(GpuRanker, f64), GpuError> {
                let start = Instant::now();
                let r = GpuRanker::upload(device, ranker, Default::default())?;
                device.synchronize()?;
                Ok((r, elapsed_us(start)))
            };
            let (first, first_us) = upload().map_err(gpu_err(name, "model upload"))?;
            let mut again = Vec::new();
            for _ in 0..3 {
                again.push(upload().map_err(gpu_err(name, "model upload"))?.1);
            }
            report.upload_first_us = Some(first_us);
            report.upload_us = Some(Stats::of(&mut again).median_us);
            report.model_bytes = Some(first.bytes());
            Some((device, first))
        }
        None => None,
    };
    let max_docs = config.docs.iter().copied().max().unwrap_or(0);
    let all_rows = rows_for(bench, max_docs, config.seed);
    for &docs in &config.docs {
        let rows = &all_rows[..docs * nf];
        let cpu_1 = time(config, || {
            std::hint::black_box(plan.score_batch(rows, 1));
            Ok::<(), BenchError>(())
        })?;
        let cpu_all = time(config, || {
            std::hint::black_box(pool.score(&plan, rows));
            Ok::<(), BenchError>(())
        })?;
        let (gpu_stats, gpu_phases) = match &gpu_ranker {
            Some((device, r)) => {
                let stats = time(config, || r.score(device, rows, false).map(|_| ()))
                    .map_err(gpu_err(name, "scoring"))?;
                let mut phases = Vec::new();
                for _ in 0..stats.reps.min(20) {
                    phases.push(
                        r.score_timed(device, rows)
                            .map_err(gpu_err(name, "timed scoring"))?
                            .1,
                    );
                }
                (Some(stats), Some(median_phases(&phases)))
            }
            None => (None, None),
        };
        progress(&format!(
            "{name} {docs:>6} docs: cpu1 {:.1} us, cpu{} {:.1} us, gpu {}",
            cpu_1.median_us,
            config.threads,
            cpu_all.median_us,
            gpu_stats.map_or("-".into(), |s| format!("{:.1} us", s.median_us))
        ));
        report.cells.push(Cell {
            docs,
            cpu_1,
            cpu_all,
            gpu: gpu_stats,
            gpu_phases,
        });
    }
    if gpu_ranker.is_some() {
        let faster =
            |cpu: fn(&Cell) -> f64| move |c: &Cell| c.gpu.is_some_and(|g| g.median_us < cpu(c));
        report.crossover_cpu_1 = crossover(&report.cells, faster(|c| c.cpu_1.median_us));
        report.crossover_cpu_all = crossover(&report.cells, faster(|c| c.cpu_all.median_us));
    }
    if let (Some(rows), Some(reference)) = (&bench.rows, &bench.reference) {
        if reference.len() * nf != rows.len() {
            return Err(BenchError::Input {
                ranker: name.into(),
                what: format!(
                    "{} reference scores for {} rows",
                    reference.len(),
                    rows.len() / nf
                ),
            });
        }
        let cpu = pool.score(&plan, rows);
        let cpu_err = max_relative_error(&cpu, reference);
        let gpu_err_max = match &gpu_ranker {
            Some((device, r)) => Some(max_relative_error(
                &r.score(device, rows, false)
                    .map_err(gpu_err(name, "reference check"))?
                    .scores,
                reference,
            )),
            None => None,
        };
        let tolerance = 1e-6;
        report.reference = Some(ReferenceCheck {
            rows: reference.len(),
            cpu_max_rel_error: cpu_err,
            gpu_max_rel_error: gpu_err_max,
            tolerance,
            passed: cpu_err <= tolerance && gpu_err_max.is_none_or(|e| e <= tolerance),
        });
    }
    Ok(report)
}

/// Runs the latency benchmark over `rankers`; `gpu` is the device or why there is none.
///
/// # Errors
/// As [`bench_ranker`].
pub fn run(
    rankers: &[BenchRanker],
    config: &BenchConfig,
    gpu: &Result<Arc<GpuDevice>, String>,
    progress: &mut dyn FnMut(&str),
) -> Result<Report, BenchError> {
    let device = gpu.as_ref().ok().map(|d| d.as_ref());
    let mut reports = Vec::new();
    for bench in rankers {
        reports.push(bench_ranker(bench, config, device, progress)?);
    }
    Ok(Report {
        host: host_description(),
        cpu_threads: config.threads,
        gpu: gpu
            .as_ref()
            .map(|d| d.name().to_string())
            .map_err(Clone::clone),
        rankers: reports,
        power: None,
    })
}

/// The CPU model and core count, from /proc/cpuinfo where there is one.
pub fn host_description() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model}, {cores} hardware threads")
}

/// One layout of the model-input transforms on the GPU, timed.
#[derive(Debug, Clone, Serialize)]
pub struct LayoutRun {
    pub ranker: String,
    pub docs: usize,
    /// Inputs grouped by transform kind, each group padded to a warp with Dummy inputs.
    pub warp_groups: bool,
    /// Inputs ordered by feature within a group.
    pub feature_locality: bool,
    /// Median `mit_eval` time (CUDA events), microseconds.
    pub mit_us: f64,
    /// Median GPU end-to-end time, microseconds.
    pub end_to_end_us: f64,
}

/// What each of the seed's input-layout optimisations buys: `bench`'s ranker uploaded with
/// every combination of [`PlanOptions`] and timed at `docs` documents (the first layer's
/// weights follow the layout, so every combination gives the same scores).
///
/// # Errors
/// [`BenchError::Gpu`] when the GPU fails.
pub fn mit_layouts(
    bench: &BenchRanker,
    docs: usize,
    config: &BenchConfig,
    device: &GpuDevice,
) -> Result<Vec<LayoutRun>, BenchError> {
    let name = bench.name.as_str();
    let rows = rows_for(bench, docs, config.seed);
    let mut runs = Vec::new();
    for (warp_groups, feature_locality) in
        [(true, true), (false, true), (true, false), (false, false)]
    {
        let options = PlanOptions {
            warp_groups,
            feature_locality,
        };
        let gpu = GpuRanker::upload(device, &bench.ranker, options)
            .map_err(gpu_err(name, "model upload"))?;
        let end = time(config, || gpu.score(device, &rows, false).map(|_| ()))
            .map_err(gpu_err(name, "scoring"))?;
        let mut phases = Vec::new();
        for _ in 0..end.reps.clamp(3, 20) {
            phases.push(
                gpu.score_timed(device, &rows)
                    .map_err(gpu_err(name, "timed scoring"))?
                    .1,
            );
        }
        runs.push(LayoutRun {
            ranker: name.into(),
            docs,
            warp_groups,
            feature_locality,
            mit_us: median_phases(&phases).mit_us,
            end_to_end_us: end.median_us,
        });
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_take_median_and_nearest_rank_percentiles() {
        let mut samples: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        let s = Stats::of(&mut samples);
        assert_eq!((s.median_us, s.min_us, s.max_us), (5.5, 1.0, 10.0));
        assert_eq!((s.p10_us, s.p90_us), (2.0, 9.0));
        assert_eq!(Stats::of(&mut [3.0]).median_us, 3.0);
    }

    fn cell(docs: usize, cpu: f64, gpu: f64) -> Cell {
        let s = |v| Stats::of(&mut [v]);
        Cell {
            docs,
            cpu_1: s(cpu),
            cpu_all: s(cpu),
            gpu: Some(s(gpu)),
            gpu_phases: None,
        }
    }

    #[test]
    fn repetitions_stay_within_reps_whatever_min_reps_says() {
        let mut config = BenchConfig {
            docs: vec![1],
            threads: 1,
            reps: 2,
            min_reps: 3,
            budget: Duration::from_secs(1),
            seed: 1,
        };
        let mut calls = 0;
        let stats = time(&config, || {
            calls += 1;
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!((stats.reps, calls), (2, 3));
        config.reps = 0;
        assert_eq!(time(&config, || Ok::<(), ()>(())).unwrap().reps, 1);
    }

    #[test]
    fn crossover_is_where_the_gpu_wins_from_then_on() {
        let cells = [
            cell(1, 1.0, 2.0),
            cell(10, 3.0, 2.0),
            cell(100, 5.0, 6.0),
            cell(1000, 50.0, 7.0),
        ];
        assert_eq!(
            crossover(&cells, |c| c.gpu.unwrap().median_us < c.cpu_1.median_us),
            Some(1000)
        );
        assert_eq!(
            crossover(&cells[..3], |c| c.gpu.unwrap().median_us
                < c.cpu_1.median_us),
            None
        );
        assert_eq!(
            crossover(&cells[1..2], |c| c.gpu.unwrap().median_us
                < c.cpu_1.median_us),
            Some(10)
        );
    }

    #[test]
    fn cpu_only_run_has_tables_and_a_plot() {
        let ranker =
            crate::rank::synth::synth(&crate::rank::synth::SynthSpec::preset("small").unwrap(), 7);
        let bench = BenchRanker {
            name: "small".into(),
            rows: None,
            reference: None,
            ranker,
        };
        let config = BenchConfig {
            docs: vec![1, 20],
            threads: 2,
            reps: 3,
            min_reps: 1,
            budget: Duration::from_millis(1),
            seed: 1,
        };
        let report = run(
            &[bench],
            &config,
            &Err("no GPU in this test".into()),
            &mut |_| {},
        )
        .unwrap();
        let text = tables(&report);
        assert!(text.contains("GPU column absent"), "{text}");
        assert_eq!(report.rankers[0].cells.len(), 2);
        assert!(report.rankers[0].crossover_cpu_1.is_none());
        let plot = svg(&report);
        assert!(
            plot.starts_with("<svg") && plot.contains("polyline"),
            "{plot}"
        );
    }

    #[test]
    fn reference_scores_are_checked_against_every_backend() {
        let ranker =
            crate::rank::synth::synth(&crate::rank::synth::SynthSpec::preset("small").unwrap(), 7);
        let rows = crate::rank::synth::synth_features(&ranker, 5, 3);
        let mut reference = CpuPlan::new(&ranker).score_batch(&rows, 1);
        let config = BenchConfig {
            docs: vec![5],
            threads: 1,
            reps: 1,
            min_reps: 1,
            budget: Duration::from_millis(1),
            seed: 1,
        };
        let mut bench = BenchRanker {
            name: "r".into(),
            ranker,
            rows: Some(rows),
            reference: Some(reference.clone()),
        };
        let report = bench_ranker(&bench, &config, None, &mut |_| {}).unwrap();
        assert!(report.reference.unwrap().passed);
        reference[2] += 1e-3;
        bench.reference = Some(reference);
        let check = bench_ranker(&bench, &config, None, &mut |_| {})
            .unwrap()
            .reference
            .unwrap();
        assert!(!check.passed && check.cpu_max_rel_error > 1e-6, "{check:?}");
    }
}
