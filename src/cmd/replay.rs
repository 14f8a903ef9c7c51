//! `rankserve requests synth` and `rankserve requests search` (write a `/v1/rank` or a
//! `/v1/search` request log) and `rankserve replay` (send one to a running server and report
//! throughput and latency).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::{BadInputExt, CmdResult};
use rankserve::api::SearchRequest;
use rankserve::backend::Backend;
use rankserve::bench::replay::{replay, search_requests, synth_requests, Load, RequestLog};
use rankserve::rank::import::load_any;
use rankserve::select::Mode;

#[derive(clap::Subcommand)]
pub enum RequestsCommand {
    /// Write a log of production-like `/v1/rank` requests: hit documents when every feature of
    /// the ranker comes from the FE catalogue, else feature vectors.
    ///
    /// Example: `rankserve requests synth --ranker medium --docs 1000 --count 200 --out medium-1000.msgpack`
    #[command(
        after_help = "Example:\n  rankserve requests synth --ranker medium --docs 1000 --count 200 --out medium-1000.msgpack"
    )]
    Synth(SynthArgs),
    /// Write a log of `/v1/search` requests: one per query of a query file, in order, each
    /// with the same options.
    ///
    /// Example: `rankserve requests search --queries queries.txt --mode or --k 10 --out search-or.msgpack`
    #[command(
        after_help = "Example:\n  rankserve requests search --queries queries.txt --mode or --k 10 --out search-or.msgpack\n  rankserve requests search --queries queries.txt --mode and --ranker small --candidates 100 --out search-small.jsonl"
    )]
    Search(SearchArgs),
}

#[derive(clap::Args)]
pub struct SynthArgs {
    /// Ranker store name (`RANKERS/NAME.json`), or the path of a ranker file.
    #[arg(long)]
    ranker: String,
    /// Directory the name is looked up in.
    #[arg(long, default_value = "rankers", value_name = "DIR")]
    rankers: PathBuf,
    /// Documents per request.
    #[arg(long)]
    docs: usize,
    /// Requests in the log.
    #[arg(long)]
    count: usize,
    /// The log: `.msgpack` (concatenated MessagePack objects) or `.jsonl` (JSON Lines).
    #[arg(long, value_name = "LOG")]
    out: PathBuf,
    /// Ask for the top `k` (`order` in the replies).
    #[arg(long)]
    k: Option<usize>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(clap::Args)]
pub struct SearchArgs {
    /// Queries, one per line (text, tokenized by the server; `rankserve queries synth`).
    #[arg(long, value_name = "FILE")]
    queries: PathBuf,
    /// How each query's terms combine.
    #[arg(long, value_enum, default_value_t = Mode::And)]
    mode: Mode,
    /// Hits per reply.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Candidates selected by BM25 for the ranker (at least `k` are taken).
    #[arg(long, default_value_t = 1000)]
    candidates: usize,
    /// The ranker's store name; without it the hits are ranked by BM25 alone.
    #[arg(long)]
    ranker: Option<String>,
    /// The backend asked for; the server's default when absent.
    #[arg(long, value_enum)]
    backend: Option<Backend>,
    /// The log: `.msgpack` (concatenated MessagePack objects) or `.jsonl` (JSON Lines).
    #[arg(long, value_name = "LOG")]
    out: PathBuf,
}

/// Replay a request log against a running server (`/v1/rank` or `/v1/search`, as the log's
/// requests are); report throughput, p50/p90/p99/p99.9 latency, the server's own timings,
/// the backends that ran and errors by status.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  rankserve replay --url http://127.0.0.1:8080 --log medium-1000.msgpack --concurrency 4 --duration 10\n  rankserve replay --url http://127.0.0.1:8080 --log search-or.msgpack --concurrency 16 --duration 5 --json"
)]
pub struct Args {
    /// The server's root, `http://HOST:PORT`.
    #[arg(long)]
    url: String,
    /// A request log (`.msgpack` or `.jsonl`), sent round-robin to the endpoint its requests
    /// are for.
    #[arg(long, value_name = "LOG")]
    log: PathBuf,
    /// Closed loop: this many clients, each waiting for its answer.
    #[arg(long, conflicts_with = "rate", required_unless_present = "rate")]
    concurrency: Option<usize>,
    /// Open loop: requests per second, on schedule.
    #[arg(long)]
    rate: Option<f64>,
    /// Seconds to run.
    #[arg(long)]
    duration: f64,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run_requests(c: RequestsCommand) -> CmdResult {
    match c {
        RequestsCommand::Synth(args) => synth(args),
        RequestsCommand::Search(args) => search(args),
    }
}

fn synth(args: SynthArgs) -> CmdResult {
    let as_path = PathBuf::from(&args.ranker);
    let (path, name) = if as_path.is_file() {
        let stem = as_path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("ranker")
            .to_string();
        (as_path, stem)
    } else {
        (
            args.rankers.join(format!("{}.json", args.ranker)),
            args.ranker.clone(),
        )
    };
    let bytes = std::fs::read(&path)
        .with_context(|| format!("reading ranker {}", path.display()))
        .bad_input()?;
    let ranker = load_any(&bytes)
        .with_context(|| format!("ranker {}", path.display()))
        .bad_input()?;
    let requests = synth_requests(&name, &ranker, args.docs, args.count, args.k, args.seed);
    RequestLog::write(&args.out, &requests).context("writing the request log")?;
    eprintln!(
        "wrote {} requests of {} documents for ranker {name:?} to {}",
        args.count,
        args.docs,
        args.out.display()
    );
    Ok(())
}

fn search(args: SearchArgs) -> CmdResult {
    let queries = super::bench::read_queries(&args.queries).bad_input()?;
    if queries.is_empty() {
        return Err(anyhow::anyhow!(
            "{}: no queries (expected one per line)",
            args.queries.display()
        ))
        .bad_input();
    }
    let template = SearchRequest {
        query: None,
        terms: None,
        k: args.k,
        candidates: args.candidates,
        mode: args.mode,
        ranker: args.ranker,
        backend: args.backend,
        explain: false,
        timeout_ms: None,
    };
    let requests = search_requests(&queries, &template);
    RequestLog::write(&args.out, &requests).context("writing the request log")?;
    eprintln!(
        "wrote {} /v1/search requests to {}",
        requests.len(),
        args.out.display()
    );
    Ok(())
}

pub fn run(args: Args) -> CmdResult {
    if !(args.duration > 0.0 && args.duration.is_finite()) {
        return Err(anyhow::anyhow!(
            "--duration {}: expected seconds > 0",
            args.duration
        ))
        .bad_input();
    }
    let load = match (args.concurrency, args.rate) {
        (Some(c), None) if c >= 1 => Load::Concurrency(c),
        (None, Some(r)) if r > 0.0 && r.is_finite() => Load::Rate(r),
        _ => return Err(anyhow::anyhow!("give --concurrency C ≥ 1 or --rate R > 0")).bad_input(),
    };
    let log = Arc::new(RequestLog::read(&args.log).bad_input()?);
    let bar = indicatif::ProgressBar::new(1000);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {percent}%")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let ticks = bar.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime
        .block_on(replay(
            &args.url,
            log,
            load,
            Duration::from_secs_f64(args.duration),
            move |f| ticks.set_position((f.clamp(0.0, 1.0) * 1000.0) as u64),
        ))
        .bad_input()?;
    bar.finish_and_clear();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("writing the report")?
        );
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
