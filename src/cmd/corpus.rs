//! `rankserve corpus synth` and `rankserve queries synth`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

use super::{BadInputExt, CmdResult};
use rankserve::index::corpus::{write_synth, SynthSpec};
use rankserve::index::queries::synth_queries;
use rankserve::index::Index;

/// The corpus format, shown by `corpus --help`, `corpus synth --help` and `index build --help`
/// (docs/index-format.md § Corpus input says the same at more length).
pub const CORPUS_FORMAT: &str = "\
Corpus format (what `corpus synth` writes and `index build` reads):
JSON Lines in UTF-8, one document a line, plain or gzip (gzip is recognised by its first two
bytes, whatever the file's name):
  {\"id\": \"d1\", \"streams\": {\"title\": \"...\", \"body\": \"...\"}, \"static\": {\"static_rank\": 0.7}}
  id       a non-empty string, unique in the corpus: what searches return
  streams  text fields by name (any names, any number; absent = none). Each is tokenized the
           same way: Unicode (UAX #29) words that start with a letter or digit, lower-cased;
           a phrase ends at . ! ? ; : or a line break. BM25 scores the --scoring stream
           (default body); the forward index keeps every stream for hit requests
  static   numbers by name (query-independent features; absent = NaN for that document)
Blank lines are skipped and other fields ignored; a line that is not such an object, an empty
or repeated id, or a stream that is not a string is refused with its line (exit 2).";

#[derive(clap::Subcommand)]
pub enum Command {
    /// Write a deterministic synthetic corpus (Zipfian vocabulary; title, body, anchor and url
    /// streams; static_rank and url_depth) as JSON Lines, gzip-compressed when the name ends in `.gz`.
    ///
    /// Example: `rankserve corpus synth --docs 1000000 --seed 1 --out corpus.jsonl.gz`
    #[command(after_help = CORPUS_FORMAT)]
    Synth {
        /// Number of documents.
        #[arg(long)]
        docs: u64,
        /// Seed; the output depends only on (docs, seed), not on the thread count.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output file (`.jsonl` or `.jsonl.gz`).
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(clap::Subcommand)]
pub enum QueriesCommand {
    /// Write queries of 2–5 terms (27/33/24/16 %), one per line, terms drawn from random
    /// documents of the index so that AND queries have results.
    ///
    /// Example: `rankserve queries synth --index idx --count 10000 --seed 1 --out queries.txt`
    Synth {
        /// The index directory (needs a forward index).
        #[arg(long)]
        index: PathBuf,
        /// Number of queries.
        #[arg(long)]
        count: usize,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output file.
        #[arg(long)]
        out: PathBuf,
    },
}

pub fn run(c: Command) -> CmdResult {
    match c {
        Command::Synth { docs, seed, out } => {
            let file = File::create(&out)
                .with_context(|| format!("creating {}", out.display()))
                .bad_input()?;
            let mut writer: Box<dyn Write> = if out.extension().is_some_and(|e| e == "gz") {
                Box::new(flate2::write::GzEncoder::new(
                    BufWriter::with_capacity(1 << 20, file),
                    flate2::Compression::fast(),
                ))
            } else {
                Box::new(BufWriter::with_capacity(1 << 20, file))
            };
            let bar = progress_bar(docs, "docs");
            let started = std::time::Instant::now();
            write_synth(SynthSpec { docs, seed }, &mut writer, |n| bar.inc(n))
                .with_context(|| format!("writing {}", out.display()))?;
            writer
                .flush()
                .with_context(|| format!("writing {}", out.display()))?;
            drop(writer);
            bar.finish_and_clear();
            eprintln!(
                "wrote {docs} documents to {} in {:.1} s",
                out.display(),
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
    }
}

pub fn run_queries(c: QueriesCommand) -> CmdResult {
    match c {
        QueriesCommand::Synth {
            index,
            count,
            seed,
            out,
        } => {
            let index = Index::open(&index)
                .with_context(|| format!("opening index {}", index.display()))
                .bad_input()?;
            let queries = synth_queries(&index, count, seed).bad_input()?;
            let mut text = queries.join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
            Ok(())
        }
    }
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress_bar(len: u64, unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let template = format!(
        "{{elapsed_precise}} [{{wide_bar}}] {{pos}}/{{len}} {unit} ({{per_sec}}, eta {{eta}})"
    );
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}
