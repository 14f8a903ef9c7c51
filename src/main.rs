//! The `rankserve` command line: serve, build indexes and corpora, make and import rankers,
//! score feature files, synthesize and replay request logs, run the benchmarks.
//!
//! Exit codes: 0 success, 2 bad input or usage (the message names what and where), 1 any other
//! failure.

mod cmd;

/// mimalloc instead of the system allocator: decoding a hit-document request makes tens of
/// thousands of small allocations (`docs/benchmarks-history.md`, "Request decoding (dev machine)").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "rankserve",
    version,
    about = "Learning-to-rank scoring accelerator: select candidates from a compressed inverted index and rank them with ML rankers, on the CPU or an NVIDIA GPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve(Box<cmd::serve::Args>),
    /// Synthesize a corpus (its format: `rankserve corpus --help`).
    #[command(subcommand, after_help = cmd::corpus::CORPUS_FORMAT)]
    Corpus(cmd::corpus::Command),
    /// Synthesize queries.
    #[command(subcommand)]
    Queries(cmd::corpus::QueriesCommand),
    /// Build or import an index.
    #[command(subcommand)]
    Index(cmd::index::Command),
    /// Make or import rankers.
    #[command(subcommand)]
    Ranker(cmd::ranker::Command),
    /// Score a CSV of feature vectors with a ranker, one score per line.
    Score(cmd::score::Args),
    /// Synthesize request logs.
    #[command(subcommand)]
    Requests(cmd::replay::RequestsCommand),
    /// Replay a request log against a running server.
    Replay(cmd::replay::Args),
    /// Run the stage benchmarks.
    #[command(subcommand)]
    Bench(cmd::bench::Command),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => cmd::serve::run(*args),
        Command::Corpus(c) => cmd::corpus::run(c),
        Command::Queries(c) => cmd::corpus::run_queries(c),
        Command::Index(c) => cmd::index::run(c),
        Command::Ranker(c) => cmd::ranker::run(c),
        Command::Score(args) => cmd::score::run(args),
        Command::Requests(c) => cmd::replay::run_requests(c),
        Command::Replay(args) => cmd::replay::run(args),
        Command::Bench(c) => cmd::bench::run(c),
    };
    std::process::exit(cmd::exit_code(result));
}
