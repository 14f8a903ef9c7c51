//! `rankserve bench`: the stage benchmarks. Tables go to stdout, JSON to `--out`.

use std::path::PathBuf;

use anyhow::Context;
use rankserve::bench::selection::{self, LatencySummary, SelectionConfig};
use rankserve::index::Index;
use rankserve::select::{Bm25Params, Mode};

use super::{BadInputExt, CmdResult};

#[derive(clap::Subcommand)]
pub enum Command {
    /// The document stage on the CPU: each query alone on one thread (median of --reps runs
    /// after a warm-up), with its top-k by document id, for comparison with a peer.
    #[command(after_help = "\
Examples:
  rankserve bench selection --index idx --queries queries.txt --mode and --k 10
  rankserve bench selection --index idx --queries queries.txt --k1 1.2 --b 0.75 --out runs.jsonl")]
    Selection(SelectionArgs),
}

#[derive(clap::Args)]
pub struct SelectionArgs {
    /// The index directory.
    #[arg(long)]
    index: PathBuf,
    /// Queries, one per line (text, tokenized like the documents; `rankserve queries synth`).
    #[arg(long, value_name = "FILE")]
    queries: PathBuf,
    #[arg(long, value_enum, default_value_t = Mode::And)]
    mode: Mode,
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
    /// Write one JSON line per query (query, us, ids, scores, work counters) here.
    #[arg(long, value_name = "FILE.jsonl")]
    out: Option<PathBuf>,
}

pub fn run(c: Command) -> CmdResult {
    match c {
        Command::Selection(args) => run_selection(args),
    }
}

fn run_selection(args: SelectionArgs) -> CmdResult {
    let index = Index::open(&args.index).bad_input()?;
    let text = std::fs::read_to_string(&args.queries)
        .with_context(|| format!("reading {}", args.queries.display()))
        .bad_input()?;
    let queries: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    let config = SelectionConfig {
        mode: args.mode,
        k: args.k,
        params: Bm25Params {
            k1: args.k1,
            b: args.b,
        },
        reps: args.reps,
    };
    let runs = selection::run(&index, &queries, &config).bad_input()?;
    if let Some(out) = &args.out {
        let mut lines = String::new();
        for run in &runs {
            lines += &serde_json::to_string(run).context("encoding a query's run")?;
            lines.push('\n');
        }
        std::fs::write(out, lines).with_context(|| format!("writing {}", out.display()))?;
    }
    let s = LatencySummary::of(&runs);
    println!(
        "{} queries, mode {:?}, k {}, k1 {}, b {}, {} docs, codec {}: µs per query, one thread",
        s.queries,
        args.mode,
        args.k,
        args.k1,
        args.b,
        index.num_docs(),
        index.codec().name()
    );
    println!(
        "mean {:.1}  p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}",
        s.mean, s.p50, s.p90, s.p99, s.max
    );
    Ok(())
}
