//! `tantivy-runner`: the Tantivy crate over rankserve's corpus and query files (issue 21).
//!
//! `index` reads a corpus the way `rankserve index build` does (JSON Lines, plain or gzip,
//! through rankserve's own reader) and indexes one stream (`body`, rankserve's default scoring
//! stream) as pre-tokenized text: the tokens and positions are rankserve's tokenizer's, so both
//! engines index the same terms. Tantivy scores BM25 with k1 = 1.2 and b = 0.75 (fixed in
//! Tantivy), so rankserve must be run with `--k1 1.2 --b 0.75`. The index is merged into one
//! segment, as rankserve's is one.
//!
//! `search` runs a query file (one query a line, text tokenized like the documents, as
//! `rankserve queries synth` writes it) with `TopDocs::order_by_score` (Tantivy's pruning path:
//! block-max WAND for OR), AND (every term `Must`) or OR (`Should`), timed as passes over the
//! whole query set: one untimed warm-up pass, then `--passes` passes each running every query
//! once, a query's time being its median over the passes. With `--threads N`, N client threads
//! take the queries of a pass from a shared counter (one query per thread at a time), and the
//! passes' wall times give the throughput. `--back-to-back R` times each query R times in a row
//! instead (the data stays in cache: a different, labelled measurement).

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use rankserve::bench::selection::Clock;
use rankserve::index::corpus::{parse_line, CorpusReader, RawLine};
use rankserve::index::tokenize::Tokenizer;
use rayon::prelude::*;
use serde::Serialize;
use tantivy::collector::{Count, TopDocs};
use tantivy::indexer::NoMergePolicy;
use tantivy::query::{BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, STORED, STRING,
};
use tantivy::tokenizer::{PreTokenizedString, Token};
use tantivy::{Index, IndexWriter, TantivyDocument, Term};

#[derive(Parser)]
#[command(about = "Tantivy over rankserve's corpus and query files (issue 21's peer)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Index a rankserve corpus file (JSON Lines, plain or gzip) into a new Tantivy index.
    Index(IndexArgs),
    /// Run a query file against an index: timings, top-k and hit counts per query.
    Search(SearchArgs),
}

#[derive(clap::Args)]
struct IndexArgs {
    /// The corpus (`rankserve corpus synth` output or any file `rankserve index build` reads).
    #[arg(long)]
    corpus: PathBuf,
    /// The index directory (created; must not hold an index).
    #[arg(long)]
    out: PathBuf,
    /// The stream indexed and scored (rankserve scores `body` by default).
    #[arg(long, default_value = "body")]
    stream: String,
    /// Indexing threads (0: one per hardware thread); tokenizing runs on rayon's pool.
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// The index writer's memory budget, MB (split between its threads).
    #[arg(long, default_value_t = 1024)]
    heap_mb: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    And,
    Or,
}

#[derive(clap::Args)]
struct SearchArgs {
    #[arg(long)]
    index: PathBuf,
    /// Queries, one per line (blank lines skipped).
    #[arg(long)]
    queries: PathBuf,
    #[arg(long, value_enum, default_value_t = Mode::And)]
    mode: Mode,
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Timed passes over the query set (after one warm-up pass).
    #[arg(long, default_value_t = 5)]
    passes: usize,
    /// Client threads, each running one query at a time.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// What a query's time is read from: wall time, or the query thread's CPU time (rankserve's
    /// `bench selection --clock`).
    #[arg(long, value_enum, default_value_t = Clock::Wall)]
    clock: Clock,
    /// Time each query this many times in a row instead of in passes (the "back-to-back" mode).
    #[arg(long, value_name = "REPS", conflicts_with = "passes")]
    back_to_back: Option<usize>,
    /// Also count each query's hits (untimed, with Tantivy's `Count` collector).
    #[arg(long)]
    count: bool,
    /// One JSON line per query: query, us (median), ids and scores of the top-k, hits.
    #[arg(long, value_name = "FILE.jsonl")]
    out: Option<PathBuf>,
    /// The run's summary (JSON) here as well as on stdout.
    #[arg(long, value_name = "FILE.json")]
    summary: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Index(args) => index(&args),
        Command::Search(args) => search(&args),
    }
}

/// The schema: `id` (stored, untokenized) and the scored stream with frequencies and positions.
fn schema(stream: &str) -> (Schema, Field, Field) {
    let mut builder = Schema::builder();
    let id = builder.add_text_field("id", STRING | STORED);
    let indexing = TextFieldIndexing::default()
        .set_tokenizer("raw")
        .set_index_option(IndexRecordOption::WithFreqsAndPositions);
    let body = builder.add_text_field(
        stream,
        TextOptions::default().set_indexing_options(indexing),
    );
    (builder.build(), id, body)
}

/// `text`'s tokens as rankserve's tokenizer makes them (lower-cased, with their positions).
fn pre_tokenized(tokenizer: &mut Tokenizer, text: &str) -> PreTokenizedString {
    let mut tokens = Vec::new();
    tokenizer.for_each_token(text, |token, pos| {
        tokens.push(Token {
            offset_from: 0,
            offset_to: 0,
            position: pos.position as usize,
            text: token.to_string(),
            position_length: 1,
        })
    });
    PreTokenizedString {
        text: String::new(),
        tokens,
    }
}

fn index(args: &IndexArgs) -> anyhow::Result<()> {
    if args.out.exists() && std::fs::read_dir(&args.out)?.next().is_some() {
        bail!("{} is not empty: give a new directory", args.out.display());
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let threads = match args.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let (schema, id, body) = schema(&args.stream);
    let index = Index::create_in_dir(&args.out, schema)?;
    let mut writer: IndexWriter<TantivyDocument> =
        index.writer_with_num_threads(threads, args.heap_mb << 20)?;
    // The one merge below is ours: a merge the default policy starts on committed segments would
    // race it ("the segments that were merged could not be found", seen at 10 M documents).
    writer.set_merge_policy(Box::new(NoMergePolicy));
    let started = Instant::now();
    let mut reader = CorpusReader::open(&args.corpus)?;
    let mut lines: Vec<RawLine> = Vec::new();
    let mut docs = 0u64;
    loop {
        lines.clear();
        if reader.read_batch(16_384, &mut lines)? == 0 {
            break;
        }
        let batch = lines
            .par_iter()
            .map_init(Tokenizer::new, |tokenizer, line| {
                let doc = parse_line(&args.corpus, line)?;
                let mut out = TantivyDocument::new();
                out.add_text(id, &doc.id);
                let text = doc.streams.get(&args.stream).map_or("", String::as_str);
                out.add_pre_tokenized_text(body, pre_tokenized(tokenizer, text));
                Ok(out)
            })
            .collect::<Result<Vec<_>, rankserve::index::IndexError>>()?;
        docs += batch.len() as u64;
        for doc in batch {
            writer.add_document(doc)?;
        }
    }
    writer.commit()?;
    let indexed_s = started.elapsed().as_secs_f64();
    let segments = index.searchable_segment_ids()?;
    if segments.len() > 1 {
        writer.merge(&segments).wait()?;
    }
    writer.wait_merging_threads()?;
    let total_s = started.elapsed().as_secs_f64();
    let bytes = dir_bytes(&args.out)?;
    let summary = serde_json::json!({
        "docs": docs,
        "threads": threads,
        "index_s": indexed_s,
        "with_merge_s": total_s,
        "segments_before_merge": segments.len(),
        "index_bytes": bytes,
        "bytes_per_doc": bytes as f64 / docs.max(1) as f64,
    });
    println!("{summary}");
    Ok(())
}

/// The bytes of the files directly under `dir` (a Tantivy index is flat).
fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let meta = entry?.metadata()?;
        if meta.is_file() {
            total += meta.len();
        }
    }
    Ok(total)
}

/// One query's outcome, as `rankserve bench selection --out` writes its own.
#[derive(Serialize)]
struct QueryRun {
    query: String,
    /// Median wall time of one run, microseconds.
    us: f64,
    ids: Vec<String>,
    scores: Vec<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hits: Option<u64>,
}

/// The query of `text`: rankserve's tokens, duplicates dropped (as rankserve drops them), each a
/// term of the scored field, all `Must` (AND) or all `Should` (OR).
fn build_query(tokenizer: &mut Tokenizer, field: Field, text: &str, mode: Mode) -> Box<dyn Query> {
    let mut seen = HashSet::new();
    let occur = match mode {
        Mode::And => Occur::Must,
        Mode::Or => Occur::Should,
    };
    let clauses: Vec<(Occur, Box<dyn Query>)> = tokenizer
        .tokens(text)
        .into_iter()
        .filter(|t| seen.insert(t.clone()))
        .map(|t| {
            let term = TermQuery::new(
                Term::from_field_text(field, &t),
                IndexRecordOption::WithFreqs,
            );
            (occur, Box::new(term) as Box<dyn Query>)
        })
        .collect();
    Box::new(BooleanQuery::new(clauses))
}

fn search(args: &SearchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.k > 0, "--k must be at least 1");
    anyhow::ensure!(args.threads > 0, "--threads must be at least 1");
    let index = Index::open_in_dir(&args.index)
        .with_context(|| format!("opening the Tantivy index {}", args.index.display()))?;
    let schema = index.schema();
    let id = schema.get_field("id")?;
    let field = schema
        .fields()
        .find(|(f, _)| *f != id)
        .map(|(f, _)| f)
        .context("the index has no text field besides `id`")?;
    let searcher = index.reader()?.searcher();
    let texts: Vec<String> = std::fs::read_to_string(&args.queries)
        .with_context(|| format!("reading {}", args.queries.display()))?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    let mut tokenizer = Tokenizer::new();
    let queries: Vec<Box<dyn Query>> = texts
        .iter()
        .map(|t| build_query(&mut tokenizer, field, t, args.mode))
        .collect();
    let top = TopDocs::with_limit(args.k).order_by_score();

    // The answers (and the warm-up pass): untimed.
    let mut runs = Vec::with_capacity(texts.len());
    for (text, query) in texts.iter().zip(&queries) {
        let hits = searcher.search(query.as_ref(), &top)?;
        let mut ids = Vec::with_capacity(hits.len());
        for &(_, address) in &hits {
            let doc: TantivyDocument = searcher.doc(address)?;
            let value = doc.get_first(id).and_then(|v| v.as_str()).unwrap_or("");
            ids.push(value.to_string());
        }
        let count = if args.count {
            Some(searcher.search(query.as_ref(), &Count)? as u64)
        } else {
            None
        };
        runs.push(QueryRun {
            query: text.clone(),
            us: 0.0,
            ids,
            scores: hits.iter().map(|&(s, _)| f64::from(s)).collect(),
            hits: count,
        });
    }

    let run_one = |q: &dyn Query| -> anyhow::Result<f64> {
        let started = args.clock.now_us();
        let hits = searcher.search(q, &top)?;
        let us = args.clock.now_us() - started;
        std::hint::black_box(hits);
        Ok(us)
    };
    let (timing, pass_walls) = match args.back_to_back {
        Some(reps) => {
            let mut times = vec![Vec::with_capacity(reps); queries.len()];
            for (q, t) in queries.iter().zip(&mut times) {
                for _ in 0..reps.max(1) {
                    t.push(run_one(q.as_ref())?);
                }
            }
            (times, Vec::new())
        }
        None => passes(&queries, args.passes.max(1), args.threads, &run_one)?,
    };
    for (run, times) in runs.iter_mut().zip(&timing) {
        run.us = median(times);
    }

    if let Some(path) = &args.out {
        let mut out = BufWriter::new(
            File::create(path).with_context(|| format!("creating {}", path.display()))?,
        );
        for run in &runs {
            serde_json::to_writer(&mut out, run)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
    }
    let mut us: Vec<f64> = runs.iter().map(|r| r.us).collect();
    us.sort_by(f64::total_cmp);
    let qps: Vec<f64> = pass_walls
        .iter()
        .map(|&s| queries.len() as f64 / s)
        .collect();
    let summary = serde_json::json!({
        "engine": "tantivy",
        "mode": args.mode,
        "k": args.k,
        "queries": queries.len(),
        "timing": match args.back_to_back {
            Some(reps) => format!("back-to-back, {reps} runs per query"),
            None => format!("passes: {} timed after one warm-up", args.passes.max(1)),
        },
        "threads": args.threads,
        "us": {
            "mean": us.iter().sum::<f64>() / us.len().max(1) as f64,
            "p50": nearest_rank(&us, 0.5),
            "p90": nearest_rank(&us, 0.9),
            "p99": nearest_rank(&us, 0.99),
            "max": us.last().copied().unwrap_or(0.0),
        },
        "qps_median_pass": if qps.is_empty() { None } else { Some(median(&qps)) },
    });
    println!("{summary}");
    if let Some(path) = &args.summary {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Times every query once per pass, `passes` times, on `threads` client threads taking queries
/// from a shared counter; returns each query's times and each pass's wall time in seconds.
fn passes(
    queries: &[Box<dyn Query>],
    passes: usize,
    threads: usize,
    run_one: &(dyn Fn(&dyn Query) -> anyhow::Result<f64> + Sync),
) -> anyhow::Result<(Vec<Vec<f64>>, Vec<f64>)> {
    let times = Mutex::new(vec![Vec::with_capacity(passes); queries.len()]);
    let mut walls = Vec::with_capacity(passes);
    for _ in 0..passes {
        let next = AtomicUsize::new(0);
        let started = Instant::now();
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| -> anyhow::Result<Vec<(usize, f64)>> {
                        let mut mine = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(q) = queries.get(i) else {
                                return Ok(mine);
                            };
                            mine.push((i, run_one(q.as_ref())?));
                        }
                    })
                })
                .collect();
            for worker in workers {
                let mine = worker.join().expect("a client thread panicked")?;
                let mut times = times.lock().expect("times lock");
                for (i, us) in mine {
                    times[i].push(us);
                }
            }
            Ok::<_, anyhow::Error>(())
        })?;
        walls.push(started.elapsed().as_secs_f64());
    }
    Ok((times.into_inner().expect("times lock"), walls))
}

/// The median of `values` (the upper one of an even count), as rankserve's bench takes it.
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The nearest-rank `q` quantile of `sorted` values, as rankserve's bench takes it.
fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0.0)
}
