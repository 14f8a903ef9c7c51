//! `rankserve index build` and `rankserve index import-ciff`.

use std::path::PathBuf;

use anyhow::Context;

use super::corpus::progress_bar;
use super::{CmdResult, Failure};
use rankserve::index::builder::{build, BuildOptions, BuildReport};
use rankserve::index::ciff::import_ciff;
use rankserve::index::codecs::Codec;
use rankserve::index::shard::build_shards;
use rankserve::index::IndexError;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Build an index from a JSON Lines corpus (plain or gzip), on every core.
    ///
    /// Writes into a temporary directory next to OUT and renames it when complete; OUT must not exist.
    ///
    /// Example: `rankserve index build --corpus corpus.jsonl.gz --out idx --codec ef`
    #[command(after_help = super::corpus::CORPUS_FORMAT)]
    Build {
        /// The corpus file (JSON Lines, plain or gzip: the format is below).
        #[arg(long)]
        corpus: PathBuf,
        /// The index directory to create.
        #[arg(long)]
        out: PathBuf,
        /// The docID codec.
        #[arg(long, value_enum, default_value = "ef")]
        codec: Codec,
        /// Worker threads (default: every core).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// The stream BM25 scores, or `all` for every stream concatenated.
        #[arg(long, default_value = "body")]
        scoring: String,
        /// Leave out the forward index (selection-only index, smaller and faster to build).
        #[arg(long)]
        no_forward: bool,
        /// Build N shards (document-partitioned by contiguous ranges of documents) into
        /// OUT/shard-0 … OUT/shard-{N-1}, each served by its own `rankserve serve --index` behind
        /// a `rankserve serve --broker` (docs/deploy.md) [default: one index, no shards].
        #[arg(long, value_name = "N")]
        shards: Option<u32>,
        /// Print the build report as JSON on stdout (with --shards: one line per shard).
        #[arg(long)]
        json: bool,
    },
    /// Import a CIFF file (Common Index File Format: Anserini, PISA, Terrier) as a
    /// selection-only index: postings and document lengths, no forward index, so searches on it
    /// rank by BM25 alone.
    ///
    /// Writes into a temporary directory next to OUT and renames it when complete; OUT must not exist.
    ///
    /// Example: `rankserve index import-ciff robust04.ciff --out idx-robust04`
    ImportCiff {
        /// The CIFF file.
        file: PathBuf,
        /// The index directory to create.
        #[arg(long)]
        out: PathBuf,
        /// The docID codec.
        #[arg(long, value_enum, default_value = "ef")]
        codec: Codec,
        /// Print the import report as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(c: Command) -> CmdResult {
    match c {
        Command::Build {
            corpus,
            out,
            codec,
            threads,
            scoring,
            no_forward,
            shards,
            json,
        } => {
            let opts = BuildOptions {
                codec,
                scoring,
                threads,
                forward: !no_forward,
            };
            let bar = progress_bar(0, "docs");
            let reports = match shards {
                Some(shards) => build_shards(&corpus, &out, &opts, shards, &|n| bar.inc(n)),
                None => build(&corpus, &out, &opts, &|n| bar.inc(n)).map(|r| vec![r]),
            }
            .map_err(|e| failure(e, &corpus, &out))?;
            bar.finish_and_clear();
            reports
                .iter()
                .try_for_each(|report| summarize(report, codec, json))
        }
        Command::ImportCiff {
            file,
            out,
            codec,
            json,
        } => {
            let report = import_ciff(&file, &out, codec).map_err(|e| failure(e, &file, &out))?;
            summarize(&report, codec, json)
        }
    }
}

/// Exit 2 for the caller's input (the input file, its content, an existing OUT), 1 otherwise.
fn failure(e: IndexError, input: &std::path::Path, out: &std::path::Path) -> Failure {
    match e {
        IndexError::CorpusLine { .. } | IndexError::Ciff { .. } | IndexError::InvalidOption(_) => {
            Failure::BadInput(e.into())
        }
        IndexError::Io { ref path, .. } if path == input => Failure::BadInput(e.into()),
        e => Failure::Other(anyhow::Error::new(e).context(format!("building {}", out.display()))),
    }
}

/// Prints the report (JSON on stdout when asked) and the one-line summary on stderr.
fn summarize(report: &BuildReport, codec: Codec, json: bool) -> CmdResult {
    if json {
        println!("{}", serde_json::to_string(&report).context("report")?);
    }
    eprintln!(
                "indexed {} docs ({} terms, {} postings) in {:.2} s with {} threads: {:.0} docs/s; {:.2} bits/posting ({} codec, docIDs+tfs), {:.2} with skips",
                report.docs,
                report.terms,
                report.postings,
                report.seconds,
                report.threads,
                report.docs as f64 / report.seconds,
                report.postings_bytes as f64 * 8.0 / report.postings.max(1) as f64,
                codec.name(),
                (report.postings_bytes + report.skips_bytes) as f64 * 8.0 / report.postings.max(1) as f64,
            );
    if report.forward_bytes > 0 {
        eprintln!(
            "forward index: {} bytes of streams and term codes, {:.1} per document",
            report.forward_bytes,
            report.forward_bytes as f64 / report.docs.max(1) as f64
        );
    }
    let phases: Vec<String> = report
        .phases
        .iter()
        .map(|(name, s)| format!("{name} {s:.2}"))
        .collect();
    if !phases.is_empty() {
        eprintln!("seconds per step: {}", phases.join(", "));
    }
    Ok(())
}
