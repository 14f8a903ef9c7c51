//! `rankserve bench`: the stage benchmarks. Tables go to stdout, JSON and plots to `--out`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rankserve::backend::Backend;
use rankserve::bench::clients;
use rankserve::bench::hits;
use rankserve::bench::ranking::{self, BenchConfig, BenchRanker, PowerConfig};
use rankserve::bench::selection::{self, Clock, LatencySummary, SelectionConfig, Timing};
use rankserve::gpu::{Executor, GpuDevice};
use rankserve::index::Index;
use rankserve::rank::import::load_any;
use rankserve::select::engine::{SelectConfig, SelectEngine};
use rankserve::select::gpu::{PostingCache, PostingCacheConfig};
use rankserve::select::schedule::Scheduler;
use rankserve::select::{Bm25Params, Mode, Query};

use super::{BadInputExt, CmdResult};

#[derive(clap::Subcommand)]
pub enum Command {
    /// The ranking stage: latency per batch on the CPU (one thread, all threads) and the GPU,
    /// the GPU's phase breakdown, the crossover per ranker, and optionally power.
    Ranking(RankingArgs),
    /// The document stage: each query alone on one thread (median of --reps runs: passes over
    /// the query set after a warm-up pass, or --timing back-to-back), with its top-k by document
    /// id and, with --out, its hit count, for comparison with a peer; with --gpu, the same
    /// queries on the GPU and decode speed per codec, GPU against one CPU core.
    #[command(after_help = "\
Timing: by default one untimed pass over the queries, then --reps passes each running every
query once (a query's time is its median over the passes; the same way peers/tantivy times
Tantivy). --timing back-to-back runs each query --reps times in a row instead, so its data stays
in the caches: faster, and labelled so in the output. With --gpu the backends take turns on each
run of a query. --out's hit counts come from an untimed exhaustive search per query.

Examples:
  rankserve bench selection --index idx --queries queries.txt --mode and --k 10
  rankserve bench selection --index idx --queries queries.txt --k1 1.2 --b 0.75 --out runs.jsonl
  rankserve bench selection --index idx --queries queries.txt --mode or --gpu
  rankserve bench selection --index idx --queries queries.txt --mode or --gpu --clients 16")]
    Selection(SelectionArgs),
    /// The forward index's read for ranking: each query's top --candidates documents are
    /// selected once (untimed), then their hit requests are read (`Index::hits_into` with the
    /// query's needles found once), as /v1/search does before ranking, in --passes passes over
    /// the query set after a warm-up pass.
    #[command(after_help = "\
Prints the forward index's size per document and, per pass, the microseconds per document on
--clock (each query's reads timed together), then their median.

Example:
  rankserve bench hits --index idx --queries queries.txt --candidates 1000 --clock thread-cpu")]
    Hits(HitsArgs),
}

#[derive(clap::Args)]
#[command(after_help = "\
Each cell is timed after one warm-up call: up to --reps repetitions, fewer when a cell would take
longer than --budget-ms (never fewer than 3). CPU times are CpuPlan::score_batch on one thread and
on --threads threads; GPU times are GpuRanker::score end to end (host staging, copies, kernels,
copy back); the GPU breakdown comes from CUDA events. Without a usable GPU the GPU columns are
absent and the reason is printed.

Examples:
  rankserve bench ranking --out bench-out
  rankserve bench ranking --rankers large --docs 10,100,1000 --reps 20
  rankserve bench ranking --ranker peer/ranker.json --features peer/rows.csv --expect peer/scores.txt
  rankserve bench ranking --power --power-seconds 20")]
pub struct RankingArgs {
    /// Bundled rankers (rankers/NAME.json), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "small,medium,large",
        conflicts_with = "ranker"
    )]
    rankers: Vec<String>,
    /// Ranker files instead (native or any imported format: docs/ranker-format.md).
    #[arg(long, value_name = "FILE", num_args = 1..)]
    ranker: Vec<PathBuf>,
    /// Feature rows (CSV, as `rankserve score` reads it) for every --ranker file instead of
    /// synthetic rows; repeated to fill batches larger than the file.
    #[arg(long, value_name = "FILE.csv", requires = "ranker")]
    features: Option<PathBuf>,
    /// Reference scores of the --features rows (one per line), checked on every backend within
    /// 1e-6 relative.
    #[arg(long, value_name = "FILE", requires = "features")]
    expect: Option<PathBuf>,
    /// Batch sizes, in documents, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,10,100,1000,10000,100000"
    )]
    docs: Vec<usize>,
    /// Threads of the "all threads" CPU column (0: one per hardware thread).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// The most timed repetitions per cell.
    #[arg(long, default_value_t = 50)]
    reps: usize,
    /// Time budget per cell, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    budget_ms: u64,
    /// Measure the CPU only, even when there is a GPU.
    #[arg(long)]
    cpu_only: bool,
    /// Also measure power: GPU idle, then each ranker under constant load: feature rows
    /// (`gpu`), and for rankers FE serves hit documents with FE included (`gpu+fe`); the CPU
    /// where RAPL can be read.
    #[arg(long)]
    power: bool,
    /// Seconds of constant load per ranker and backend.
    #[arg(long, default_value_t = 20.0)]
    power_seconds: f64,
    /// Documents per batch of the power load.
    #[arg(long, default_value_t = 10_000)]
    power_docs: usize,
    /// Only the power runs, not the latency tables.
    #[arg(long, requires = "power")]
    power_only: bool,
    /// Also time the model-input transforms with each of the seed's input-layout optimisations
    /// on and off (warp groups, feature order), at this many documents, for every ranker.
    #[arg(long, value_name = "DOCS")]
    mit_layouts: Option<usize>,
    /// Directory for ranking.json and ranking.svg.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

pub fn run(c: Command) -> CmdResult {
    match c {
        Command::Ranking(args) => run_ranking(args),
        Command::Selection(args) => run_selection(args),
        Command::Hits(args) => run_hits(args),
    }
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn load_rankers(args: &RankingArgs) -> anyhow::Result<Vec<BenchRanker>> {
    let files: Vec<(String, PathBuf)> = if args.ranker.is_empty() {
        args.rankers
            .iter()
            .map(|n| (n.clone(), PathBuf::from(format!("rankers/{n}.json"))))
            .collect()
    } else {
        args.ranker
            .iter()
            .map(|p| {
                let stem = p
                    .file_stem()
                    .map_or("ranker".into(), |s| s.to_string_lossy().into_owned());
                (stem, p.clone())
            })
            .collect()
    };
    let mut rankers = Vec::new();
    for (name, path) in files {
        let ranker = load_any(read(&path)?.as_bytes())
            .with_context(|| format!("loading ranker {}", path.display()))?;
        let rows = match &args.features {
            Some(csv) => Some(
                super::score::parse_csv(&read(csv)?, &ranker.features)
                    .with_context(|| format!("in {}", csv.display()))?,
            ),
            None => None,
        };
        let reference = match &args.expect {
            Some(file) => Some(
                read(file)?
                    .lines()
                    .enumerate()
                    .filter(|(_, l)| !l.trim().is_empty())
                    .map(|(i, l)| {
                        l.trim().parse::<f64>().with_context(|| {
                            format!(
                                "{} line {}: expected a score, got {l:?}",
                                file.display(),
                                i + 1
                            )
                        })
                    })
                    .collect::<anyhow::Result<Vec<f64>>>()?,
            ),
            None => None,
        };
        if let (Some(rows), Some(reference)) = (&rows, &reference) {
            let n_rows = rows.len() / ranker.features.len().max(1);
            anyhow::ensure!(
                reference.len() == n_rows,
                "--expect has {} scores for the {n_rows} rows of --features",
                reference.len()
            );
        }
        rankers.push(BenchRanker {
            name,
            ranker,
            rows,
            reference,
        });
    }
    Ok(rankers)
}

fn run_ranking(args: RankingArgs) -> CmdResult {
    if args.docs.is_empty() || args.docs.contains(&0) || args.reps == 0 {
        return Err(anyhow::anyhow!(
            "--docs needs batch sizes of at least 1 and --reps at least 1"
        ))
        .bad_input();
    }
    let rankers = load_rankers(&args).bad_input()?;
    let threads = match args.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    // The "all threads" column and the GPU's host staging run on the global pool; it may already
    // exist (then the benchmark builds a pool of its own).
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global();
    let gpu: Result<Arc<GpuDevice>, String> = if args.cpu_only {
        Err("--cpu-only".into())
    } else {
        GpuDevice::probe().map_err(|e| e.to_string())
    };
    if let Err(why) = &gpu {
        eprintln!("bench ranking: GPU columns absent: {why}");
    }
    let config = BenchConfig {
        docs: args.docs.clone(),
        threads,
        reps: args.reps,
        min_reps: 3,
        budget: Duration::from_millis(args.budget_ms),
        seed: 42,
    };
    let mut progress = |line: &str| eprintln!("{line}");
    let mut report = if args.power_only {
        ranking::Report {
            host: ranking::host_description(),
            cpu_threads: threads,
            gpu: gpu
                .as_ref()
                .map(|d| d.name().to_string())
                .map_err(Clone::clone),
            rankers: Vec::new(),
            power: None,
        }
    } else {
        ranking::run(&rankers, &config, &gpu, &mut progress).context("bench ranking")?
    };
    if args.power {
        let power = PowerConfig {
            seconds: args.power_seconds,
            docs: args.power_docs,
            threads,
            seed: config.seed,
        };
        let device = gpu.as_ref().ok().map(|d| d.as_ref());
        report.power = Some(
            ranking::bench_power(&rankers, &power, device, &mut progress)
                .context("bench ranking --power")?,
        );
    }
    print!("{}", ranking::tables(&report));
    if let (Some(docs), Ok(device)) = (args.mit_layouts, &gpu) {
        let mut runs = Vec::new();
        for bench in &rankers {
            runs.extend(
                ranking::mit_layouts(bench, docs, &config, device)
                    .context("bench ranking --mit-layouts")?,
            );
        }
        print!("{}", ranking::layout_table(&runs));
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let json = serde_json::to_string_pretty(&report).context("encoding the report")?;
        let json_path = dir.join("ranking.json");
        std::fs::write(&json_path, json)
            .with_context(|| format!("writing {}", json_path.display()))?;
        if !report.rankers.is_empty() {
            let svg_path = dir.join("ranking.svg");
            std::fs::write(&svg_path, ranking::svg(&report))
                .with_context(|| format!("writing {}", svg_path.display()))?;
        }
        eprintln!("bench ranking: wrote {}", dir.display());
    }
    if report
        .rankers
        .iter()
        .any(|r| r.reference.as_ref().is_some_and(|c| !c.passed))
    {
        return Err(
            anyhow::anyhow!("scores differ from the reference by more than 1e-6 relative").into(),
        );
    }
    Ok(())
}

/// The index and the queries a document-stage benchmark runs.
#[derive(clap::Args)]
pub struct QuerySet {
    /// The index directory.
    #[arg(long)]
    index: PathBuf,
    /// Queries, one per line (text, tokenized like the documents; `rankserve queries synth`).
    #[arg(long, value_name = "FILE")]
    queries: PathBuf,
    /// How the queries' terms combine (`bench hits`: how each query's candidates are selected).
    #[arg(long, value_enum, default_value_t = Mode::And)]
    mode: Mode,
}

#[derive(clap::Args)]
pub struct SelectionArgs {
    #[command(flatten)]
    set: QuerySet,
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// BM25 k1 (DESIGN §5 default 0.9; Tantivy's is 1.2).
    #[arg(long, default_value_t = 0.9)]
    k1: f32,
    /// BM25 b (DESIGN §5 default 0.4; Tantivy's is 0.75).
    #[arg(long, default_value_t = 0.4)]
    b: f32,
    /// Timed runs per query.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Passes over the whole query set, or each query's runs back to back.
    #[arg(long, value_enum, default_value_t = Timing::Passes)]
    timing: Timing,
    /// What a query's time is read from: wall time, or the query thread's CPU time (leaves out
    /// waiting for a core on a shared machine).
    #[arg(long, value_enum, default_value_t = Clock::Wall)]
    clock: Clock,
    /// Write one JSON line per query (query, us, ids, scores, work counters, hits: every
    /// document it matches, counted untimed) here.
    #[arg(long, value_name = "FILE.jsonl")]
    out: Option<PathBuf>,
    /// Also run the queries on the GPU (OR or AND) and time decoding there; fails without one.
    #[arg(long)]
    gpu: bool,
    /// GPU posting cache budget in bytes; the queries themselves are its admission log, so the
    /// cache is warm (lists of terms in at least --gpu-min-visits queries are resident).
    #[arg(long, default_value_t = 1 << 30)]
    gpu_posting_cache_bytes: u64,
    #[arg(long, default_value_t = 1)]
    gpu_min_visits: u64,
    /// Decode speed is measured over the lists of at least this many postings (and over all).
    #[arg(long, default_value_t = 4096)]
    decode_min_df: u32,
    /// The hybrid's Griffin threshold: AND runs on the CPU when the second shortest list is
    /// more than this many times the shortest.
    #[arg(long, default_value_t = rankserve::select::schedule::DEFAULT_GRIFFIN_RATIO)]
    griffin_ratio: f64,
    /// A GPU AND step runs by merge path when its list has at least this many postings (else by
    /// binary search per candidate): 0 merges always, 4294967295 never.
    #[arg(long, default_value_t = rankserve::select::schedule::DEFAULT_MERGE_PATH_MIN_DF)]
    merge_path_min_df: u32,
    /// A GPU AND step runs by skip entries (only its candidates' blocks decoded) when its list
    /// has at least this many times the shortest list's postings: 0 always, 4294967295 never.
    #[arg(long, default_value_t = rankserve::select::schedule::DEFAULT_SKIP_ENTRY_MIN_RATIO)]
    skip_entry_min_ratio: u32,
    /// ... and at least this many postings: 0 any list.
    #[arg(long, default_value_t = rankserve::select::schedule::DEFAULT_SKIP_ENTRY_MIN_DF)]
    skip_entry_min_df: u32,
    /// With --gpu, one JSON line per query here: its dfs and its CPU, GPU and hybrid times.
    #[arg(long, value_name = "FILE.jsonl")]
    gpu_out: Option<PathBuf>,
    /// With --gpu, also time each query in AND mode on the CPU and on the GPU with every step
    /// by binary search, by merge path and by skip entries, and print the intersection time by
    /// decade of the length ratio (two-term queries: `scripts/ratio-queries.py`).
    #[arg(long, requires = "gpu")]
    step_ways: bool,
    /// Also run the queries with this many concurrent client threads, each one query at a time,
    /// through the server's selection engine with its default settings (CPU; with --gpu also
    /// the GPU and the scheduler's choice under load): throughput and latency per backend, timed
    /// as peers/tantivy's `search --threads N`.
    #[arg(long, value_name = "N")]
    clients: Option<usize>,
}

/// `--out`: one JSON line per query's CPU run.
fn write_runs(out: Option<&std::path::Path>, runs: &[selection::QueryRun]) -> anyhow::Result<()> {
    let Some(out) = out else { return Ok(()) };
    let mut lines = String::new();
    for run in runs {
        lines += &serde_json::to_string(run).context("encoding a query's run")?;
        lines.push('\n');
    }
    std::fs::write(out, lines).with_context(|| format!("writing {}", out.display()))
}

/// `--step-ways`: AND time by decade of the length ratio, on the CPU and each GPU way.
fn print_step_ways(runs: &[selection::StepWaysRun], reps: usize) {
    let ways = selection::STEP_WAYS.map(|(name, _)| name);
    println!(
        "intersection by length ratio (second shortest list over the shortest), mode And, µs per \
         query, median of {reps} runs each after a warm-up, the CPU and the GPU's ways taking \
         turns per query; GPU: wall (stream span from CUDA events) and blocks decoded, every \
         step run that way; fastest: queries each was fastest on by wall time (CPU / {}):",
        ways.join(" / ")
    );
    println!(
        "| length ratio | queries | shorter df | longer df | CPU | {} | fastest | hits ≠ CPU |",
        ways.join(" | ")
    );
    println!(
        "|---|---:|---:|---:|---:|{}---:|---:|",
        "---:|".repeat(ways.len())
    );
    for d in selection::by_ratio(runs) {
        let ways: Vec<String> = (d.ways.iter())
            .map(|w| format!("{:.1} ({:.1}) {}", w.wall_us, w.stream_us, w.blocks_decoded))
            .collect();
        let fastest: Vec<String> = d.fastest.iter().map(|n| n.to_string()).collect();
        println!(
            "| 10^{}–10^{} | {} | {} | {} | {:.1} | {} | {} | {} |",
            d.decade,
            d.decade + 1,
            d.queries,
            d.shorter_df,
            d.longer_df,
            d.cpu_us,
            ways.join(" | "),
            fastest.join(" / "),
            d.mismatches
        );
    }
}

/// `--clients`: the queries under concurrent clients through the server's selection engine, on
/// the CPU and, with `device`, on the GPU and through the scheduler; the table.
fn print_clients(
    index: &Arc<Index>,
    queries: &[String],
    config: &SelectionConfig,
    clients: usize,
    device: Option<&Arc<GpuDevice>>,
) -> anyhow::Result<()> {
    let defaults = rankserve::config::Config::default();
    let engine = SelectEngine::new(
        SelectConfig {
            griffin_ratio: defaults.griffin_ratio,
            gpu_batch: defaults.gpu_select_batch,
            gpu_queue: Duration::from_millis(defaults.gpu_queue_ms),
            posting_cache_bytes: defaults.gpu_posting_cache_bytes,
        },
        std::thread::available_parallelism().map_or(1, usize::from),
    );
    let backends: &[Backend] = match device {
        Some(device) => {
            engine.install_gpu(&[Executor::new(Arc::clone(device))], Some(index));
            &[Backend::Cpu, Backend::Gpu, Backend::Auto]
        }
        None => &[Backend::Cpu],
    };
    let runs = clients::run(index, queries, config, &engine, backends, clients)
        .context("running the queries under concurrent clients")?;
    println!(
        "{clients} clients through the selection engine (in process, the server's defaults; each \
         query once per pass, {} passes after a warm-up pass, the backends taking turns pass by \
         pass), µs per query (its median over the passes):",
        config.reps
    );
    println!("| backend | queries/s (median pass) | passes min–max | mean | p50 | p90 | p99 | max | on CPU | on GPU | top-k ≠ first row |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for run in &runs {
        let s = LatencySummary::of(&run.runs);
        let (on_cpu, on_gpu) = clients::sides(run);
        let lo = run.pass_qps.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = run.pass_qps.iter().copied().fold(0.0, f64::max);
        println!(
            "| {} | {:.0} | {lo:.0}–{hi:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {on_cpu} | {on_gpu} | {} |",
            run.backend,
            run.qps(),
            s.mean,
            s.p50,
            s.p90,
            s.p99,
            s.max,
            selection::mismatches(&runs[0].runs, &run.runs)
        );
    }
    Ok(())
}

/// The non-blank lines of a query file.
pub(super) fn read_queries(path: &Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

#[derive(clap::Args)]
pub struct HitsArgs {
    /// The index (with a forward index) and the queries.
    #[command(flatten)]
    set: QuerySet,
    /// Candidates per query (/v1/search's `candidates`).
    #[arg(long, default_value_t = 1000)]
    candidates: usize,
    /// Timed passes over the query set.
    #[arg(long, default_value_t = 5)]
    passes: usize,
    /// What the reads' time is read from: wall time, or the thread's CPU time.
    #[arg(long, value_enum, default_value_t = Clock::Wall)]
    clock: Clock,
}

fn run_hits(args: HitsArgs) -> CmdResult {
    let index = Index::open(&args.set.index).bad_input()?;
    if !index.has_forward() {
        return Err(anyhow::anyhow!(
            "{} has no forward index",
            args.set.index.display()
        ))
        .bad_input();
    }
    let queries = read_queries(&args.set.queries).bad_input()?;
    let run = hits::run(
        &index,
        &queries,
        args.candidates,
        args.set.mode,
        args.passes,
        args.clock,
    )
    .context("reading hits")?;
    let forward_bytes =
        std::fs::metadata(args.set.index.join(rankserve::index::reader::FORWARD_FILE))
            .with_context(|| format!("{}: forward.bin", args.set.index.display()))?
            .len();
    let n = index.num_docs().max(1) as f64;
    println!(
        "forward.bin {forward_bytes} bytes, {:.1} per document; {} queries, {} candidates \
         read per pass, {} hits (digest {:016x})",
        forward_bytes as f64 / n,
        queries.len(),
        run.docs,
        run.hits,
        run.digest
    );
    let mut passes = run.us_per_doc.clone();
    println!(
        "µs per document ({:?}), per pass: {}",
        args.clock,
        passes
            .iter()
            .map(|us| format!("{us:.3}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    passes.sort_by(f64::total_cmp);
    if let Some(median) = passes.get(passes.len() / 2) {
        println!("median {median:.3}");
    }
    Ok(())
}

fn run_selection(args: SelectionArgs) -> CmdResult {
    let index = Arc::new(Index::open(&args.set.index).bad_input()?);
    let queries = read_queries(&args.set.queries).bad_input()?;
    let config = SelectionConfig {
        mode: args.set.mode,
        k: args.k,
        params: Bm25Params {
            k1: args.k1,
            b: args.b,
        },
        reps: args.reps,
        timing: args.timing,
        clock: args.clock,
        count_hits: args.out.is_some(),
    };
    let scheduler = Scheduler {
        griffin_ratio: args.griffin_ratio,
        merge_path_min_df: args.merge_path_min_df,
        skip_entry_min_ratio: args.skip_entry_min_ratio,
        skip_entry_min_df: args.skip_entry_min_df,
        ..Scheduler::default()
    };
    let header = format!(
        "{} queries, mode {:?}, k {}, k1 {}, b {}, {} docs, codec {}",
        queries.len(),
        args.set.mode,
        args.k,
        args.k1,
        args.b,
        index.num_docs(),
        index.codec().name()
    );
    if !args.gpu {
        let runs = selection::run(&index, &queries, &config, &[Backend::Cpu], None, &scheduler)
            .bad_input()?
            .remove(0);
        write_runs(args.out.as_deref(), &runs)?;
        let s = LatencySummary::of(&runs);
        println!(
            "{header}: µs per query, one thread, {}",
            args.timing.label(args.reps)
        );
        println!(
            "mean {:.1}  p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            s.mean, s.p50, s.p90, s.p99, s.p999, s.max
        );
        if let Some(clients) = args.clients {
            print_clients(&index, &queries, &config, clients, None)?;
        }
        return Ok(());
    }
    let device = GpuDevice::probe().context("--gpu: no usable GPU")?;
    let log: Vec<Query> = queries
        .iter()
        .map(|t| Query::from_text(t, args.k, args.set.mode))
        .collect();
    let cache_config = PostingCacheConfig {
        budget_bytes: args.gpu_posting_cache_bytes,
        min_visits: args.gpu_min_visits,
        ..PostingCacheConfig::default()
    };
    let mut cache = PostingCache::new(device.clone(), cache_config, &log)
        .context("allocating the GPU posting cache")?;
    let decode = [args.decode_min_df, 1]
        .iter()
        .map(|&min_df| Ok((min_df, selection::decode_speed(&cache, &index, min_df, 20)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let backends = [Backend::Cpu, Backend::Gpu, Backend::Auto];
    let [runs, gpu_runs, hybrid_runs]: [Vec<selection::QueryRun>; 3] = selection::run(
        &index,
        &queries,
        &config,
        &backends,
        Some(&mut cache),
        &scheduler,
    )
    .context("running the queries on the CPU, the GPU and through the scheduler")?
    .try_into()
    .expect("one list of runs per backend");
    write_runs(args.out.as_deref(), &runs)?;
    let phases = selection::gpu_phases(&index, &queries, &config, &mut cache, &scheduler)
        .context("timing the GPU queries' steps")?;
    if let Some(out) = &args.gpu_out {
        let mut lines = String::new();
        for ((cpu, gpu), hybrid) in runs.iter().zip(&gpu_runs).zip(&hybrid_runs) {
            let line = serde_json::json!({
                "query": cpu.query, "dfs": cpu.dfs, "cpu_us": cpu.us, "gpu_us": gpu.us,
                "hybrid_us": hybrid.us, "hybrid_side": hybrid.side,
            });
            lines += &line.to_string();
            lines.push('\n');
        }
        std::fs::write(out, lines).with_context(|| format!("writing {}", out.display()))?;
    }
    let step_ways = match args.step_ways {
        true => Some(
            selection::step_ways(&index, &queries, &config, &mut cache)
                .context("timing the queries' intersection steps each way")?,
        ),
        false => None,
    };
    let stats = cache.stats();
    println!("{header}; GPU {} ({})", device.name(), device.arch());
    println!(
        "decode, codec {} (docIDs + tfs; GPU: one launch over every list, CUDA events, median \
         [min–max] of 20 after a warm-up; bytes = lists + block table read, 8 B/posting written)",
        index.codec().name()
    );
    println!(
        "| lists | postings | blocks | CPU 1 core G ints/s | GPU ms | GPU G ints/s | GPU TB/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (min_df, d) in &decode {
        let g = &d.gpu;
        println!(
            "| df ≥ {min_df}: {} | {} | {} | {:.2} | {:.3} [{:.3}–{:.3}] | {:.1} | {:.2} |",
            g.lists,
            g.postings,
            g.blocks,
            d.cpu_g_ints_per_s,
            g.median_ms,
            g.min_ms,
            g.max_ms,
            g.g_ints_per_s(),
            g.tb_per_s()
        );
    }
    println!(
        "latency, mode {:?}, µs per query ({}, the backends taking turns on each run), one \
         thread:",
        args.set.mode,
        args.timing.label(args.reps)
    );
    println!("| backend | mean | p50 | p95 | p99 | p99.9 | max | on CPU | on GPU |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, r) in [("CPU", &runs), ("GPU", &gpu_runs), ("hybrid", &hybrid_runs)] {
        let s = LatencySummary::of(r);
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} |",
            s.mean,
            s.p50,
            s.p95,
            s.p99,
            s.p999,
            s.max,
            s.queries - s.on_gpu,
            s.on_gpu
        );
    }
    println!(
        "GPU steps, mode {:?}, µs (CUDA events, one run per query after a warm-up; host = wall \
         minus the stream's span; {} queries went through every step):",
        args.set.mode, phases.queries
    );
    println!("| | wall | host | copy in | decode | score | top-k |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, row) in [
        ("median", &phases.median),
        ("mean", &phases.mean),
        ("slowest", &phases.slowest),
    ] {
        let s = &row.steps;
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            row.wall_us, row.host_us, s.copy_in_us, s.decode_us, s.score_us, s.topk_us
        );
    }
    if let Some(runs) = &step_ways {
        print_step_ways(runs, args.reps);
    }
    let staged = stats.queries.max(1);
    println!(
        "GPU posting cache: {} lists, {} bytes resident; {} hits, {} misses, {:.0} bytes copied \
         per query; GPU top-k identical to the CPU's on {}/{} queries, hybrid's on {}/{}",
        stats.resident_lists,
        stats.resident_bytes,
        stats.hits,
        stats.misses,
        stats.bytes_copied as f64 / staged as f64,
        runs.len() - selection::mismatches(&runs, &gpu_runs),
        runs.len(),
        runs.len() - selection::mismatches(&runs, &hybrid_runs),
        runs.len()
    );
    if let Some(clients) = args.clients {
        drop(cache);
        print_clients(&index, &queries, &config, clients, Some(&device))?;
    }
    Ok(())
}
