//! Builds an index directory from a JSON Lines corpus, on every core.
//!
//! Pipeline (deterministic: the bytes depend only on the corpus and the options, not on the
//! thread count):
//! 1. Read lines in batches (a thread of its own reads one batch ahead); parse and tokenize
//!    chunks of [`CHUNK_DOCS`] documents in parallel, each chunk with its own local vocabulary.
//! 2. Look each chunk's terms up in the global vocabulary (in parallel, read-only), then merge
//!    the new ones into it in corpus order (term ids are assigned in order of first occurrence),
//!    and register stream and static-feature names.
//! 3. In parallel per chunk: rewrite tokens to global term ids, encode the forward index with
//!    term ids for codes (counting each term's occurrences), and emit `(term, doc, tf)` postings
//!    of the scoring stream sorted by term; the forward bytes are streamed to a provisional
//!    file in order, rewritten into `forward.bin` with the frequent terms' codes at the end
//!    (`forward`).
//! 4. Invert in parallel over term-id ranges of about equal posting counts: each range
//!    gathers its postings from every chunk (counting sort) and encodes its lists; the ranges'
//!    bytes are concatenated in term order into `postings.bin` and `skips.bin`.
//! 5. Sort the dictionary, write `terms.bin`, `docs.bin` and `index.json`.
//!
//! Everything is written into a temporary directory next to `--out`, renamed into place once
//! complete.
//!
//! The driver (options, report, the pipeline itself) is here; the term stores in `vocab`, step 1
//! in `parse`, step 2 in `collect`, steps 3 and 4 in `encode` (the forward index's two passes
//! in `forward`), and the files of step 5 in `write`.

mod collect;
mod encode;
mod forward;
mod parse;
mod vocab;
mod write;

pub(crate) use encode::RangeOut;
pub(crate) use write::{write_docs, write_postings, write_terms, TempDir};

use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;

use self::collect::Collected;
use self::encode::{encode_chunk, invert, Posting};
use self::forward::Provisional;
use self::parse::{parse_chunk, ChunkParser};
use super::codecs::Codec;
use super::corpus::{CorpusReader, RawLine};
use super::reader::{Index, Manifest};
use super::IndexError;

/// Documents per parse/encode chunk.
pub const CHUNK_DOCS: usize = 1024;

/// How to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Which codec holds the docIDs.
    pub codec: Codec,
    /// The stream BM25 scores (`body` by default), or `all` for the concatenation of every
    /// stream (in stream-name order).
    pub scoring: String,
    /// Worker threads (0: every core).
    pub threads: usize,
    /// Whether to write the forward index (needed to build hit requests).
    pub forward: bool,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            codec: Codec::Ef,
            scoring: "body".into(),
            threads: 0,
            forward: true,
        }
    }
}

/// What a build produced, for the command's summary and the benchmarks.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BuildReport {
    /// Documents indexed.
    pub docs: u64,
    /// Distinct terms (in any stream).
    pub terms: u64,
    /// Postings of the scoring stream.
    pub postings: u64,
    /// Bytes of `postings.bin` (docIDs and tfs).
    pub postings_bytes: u64,
    /// Bytes of `skips.bin`.
    pub skips_bytes: u64,
    /// Bytes of `forward.bin`'s documents (its section 0, without the offsets and ranked terms;
    /// 0 without a forward index).
    pub forward_bytes: u64,
    /// Threads used.
    pub threads: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Wall-clock seconds per pipeline step, in order (`read`: waiting for the reader thread,
    /// `parse`, `lookup` of the known terms, the sequential `merge`, `encode`, `invert`,
    /// `write`, which includes the forward index's second pass): where a build's time goes, so that a slow one can be told apart.
    pub phases: Vec<(&'static str, f64)>,
}

impl BuildReport {
    /// The report of a build of `manifest` begun at `started`, whose files have
    /// `[postings, skips, forward]` bytes.
    pub(crate) fn of(
        manifest: &Manifest,
        [postings_bytes, skips_bytes, forward_bytes]: [u64; 3],
        started: Instant,
        phases: Vec<(&'static str, f64)>,
    ) -> BuildReport {
        BuildReport {
            docs: manifest.num_docs,
            terms: manifest.num_terms,
            postings: manifest.num_postings,
            postings_bytes,
            skips_bytes,
            forward_bytes,
            threads: rayon::current_num_threads(),
            seconds: started.elapsed().as_secs_f64(),
            phases,
        }
    }
}

/// A build's pipeline steps, in order, as [`BuildReport::phases`] names them.
#[derive(Clone, Copy)]
enum Step {
    Read,
    Parse,
    Lookup,
    Merge,
    Encode,
    Invert,
    Write,
}

const STEP_NAMES: [&str; 7] = [
    "read", "parse", "lookup", "merge", "encode", "invert", "write",
];

/// Wall-clock time per pipeline step, accumulated over the batches.
struct PhaseClock {
    seconds: [f64; 7],
    mark: Instant,
}

impl PhaseClock {
    fn start() -> Self {
        Self {
            seconds: [0.0; 7],
            mark: Instant::now(),
        }
    }

    /// Charges the time since the last mark to `step`.
    fn charge(&mut self, step: Step) {
        let now = Instant::now();
        self.seconds[step as usize] += (now - self.mark).as_secs_f64();
        self.mark = now;
    }

    fn into_phases(self) -> Vec<(&'static str, f64)> {
        STEP_NAMES.into_iter().zip(self.seconds).collect()
    }
}

/// Builds an index from `corpus` into `out` (which must not exist yet).
///
/// `progress(n)` is called with the number of documents each time a batch is indexed.
///
/// # Errors
/// [`IndexError::InvalidOption`] when `out` exists or the scoring stream is empty-named;
/// [`IndexError::CorpusLine`] for a bad document (the build stops, nothing is renamed into
/// place); [`IndexError::Io`].
pub fn build(
    corpus: &Path,
    out: &Path,
    opts: &BuildOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<BuildReport, IndexError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| {
            IndexError::InvalidOption(format!("thread pool of {} threads: {e}", opts.threads))
        })?;
    pool.install(|| build_in_pool(corpus, out, opts, None, progress))
}

/// [`build`] of the documents `docs` of `corpus` only (its non-blank lines numbered from 0):
/// one shard of a document-partitioned index ([`super::shard`]). Document `docs.start` becomes
/// docID 0.
///
/// # Errors
/// As [`build`].
pub(crate) fn build_range(
    corpus: &Path,
    out: &Path,
    opts: &BuildOptions,
    docs: std::ops::Range<u64>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<BuildReport, IndexError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| {
            IndexError::InvalidOption(format!("thread pool of {} threads: {e}", opts.threads))
        })?;
    pool.install(|| build_in_pool(corpus, out, opts, Some(docs), progress))
}

/// Opens the index in `out` if there is one that opens (every check of [`Index::open`]);
/// otherwise builds it from `corpus` (as [`build`], without progress). A directory at `out` that
/// does not open is moved aside to `<out>.unreadable-<unix seconds>`, never deleted. Returns the
/// build's report, or `None` when the existing index was reused.
///
/// # Errors
/// As [`build`]; [`IndexError::Io`] when the unreadable directory cannot be moved aside.
pub fn open_or_build(
    corpus: &Path,
    out: &Path,
    opts: &BuildOptions,
) -> Result<Option<BuildReport>, IndexError> {
    if out.exists() {
        match Index::open(out) {
            Ok(_) => return Ok(None),
            Err(err) => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let mut aside = out.as_os_str().to_owned();
                aside.push(format!(".unreadable-{secs}"));
                tracing::warn!(index = %out.display(), moved_to = ?aside, error = %err, "existing index does not open: rebuilding it");
                std::fs::rename(out, &aside).map_err(|e| IndexError::io(out, e))?;
            }
        }
    }
    build(corpus, out, opts, &|_| {}).map(Some)
}

/// Refuses a corpus where two documents share an id (search results name documents by id),
/// naming the id and both lines. The ids are sorted by index (4 bytes a document), not hashed
/// into a set of copies; the lines are found by reading the corpus again, on error only.
///
/// # Errors
/// [`IndexError::CorpusLine`] at the later of the two lines; [`IndexError::Io`] re-reading.
fn check_ids_unique(
    corpus: &Path,
    first_doc: u64,
    ids: &[u8],
    offsets: &[u64],
) -> Result<(), IndexError> {
    let id = |d: u32| &ids[offsets[d as usize] as usize..offsets[d as usize + 1] as usize];
    let mut order: Vec<u32> = (0..offsets.len() as u32 - 1).collect();
    order.par_sort_unstable_by(|&a, &b| id(a).cmp(id(b)).then(a.cmp(&b)));
    let Some((first, second)) = order
        .windows(2)
        .filter(|w| id(w[0]) == id(w[1]))
        .map(|w| (w[0], w[1]))
        .min_by_key(|&(_, second)| second)
    else {
        return Ok(());
    };
    // Documents are the corpus's non-blank lines, in order.
    let mut reader = CorpusReader::open(corpus)?;
    let duplicate = id(second);
    let (first, second) = (first as u64 + first_doc, second as u64 + first_doc);
    let (mut lines, mut seen, mut found) = (Vec::new(), 0u64, [0u64; 2]);
    while found[1] == 0 && reader.read_batch(1 << 16, &mut lines)? > 0 {
        for raw in lines.drain(..) {
            if seen == first {
                found[0] = raw.line;
            }
            if seen == second {
                found[1] = raw.line;
            }
            seen += 1;
        }
    }
    Err(IndexError::CorpusLine {
        path: corpus.to_path_buf(),
        line: found[1],
        message: format!(
            "document id {:?} is already the id of line {}: ids must be unique",
            crate::rank::cut_input(&String::from_utf8_lossy(duplicate)),
            found[0]
        ),
    })
}

/// The corpus's batches of `batch` lines, read by a thread of their own one batch ahead of the
/// caller (reading was 12 s of a 79 s 10 M-document build when it waited its turn). The thread
/// stops at the end, after a read error (sent as the last item), or when the receiver is dropped.
///
/// # Errors
/// [`IndexError::Io`] when the thread cannot be started.
/// With `docs`, only those documents (non-blank lines numbered from 0) are sent.
fn read_ahead(
    mut reader: CorpusReader,
    batch: usize,
    docs: Option<std::ops::Range<u64>>,
) -> Result<std::sync::mpsc::IntoIter<Result<Vec<RawLine>, IndexError>>, IndexError> {
    let path = reader.path().to_path_buf();
    let docs = docs.unwrap_or(0..u64::MAX);
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let mut seen = 0u64;
    std::thread::Builder::new()
        .name("corpus-reader".into())
        .spawn(move || loop {
            let mut lines = Vec::with_capacity(batch);
            match reader.read_batch(batch, &mut lines) {
                Ok(0) => break,
                Ok(n) => {
                    let first = seen;
                    seen += n as u64;
                    let skip = docs.start.saturating_sub(first).min(n as u64) as usize;
                    lines.truncate(docs.end.saturating_sub(first).min(n as u64) as usize);
                    lines.drain(..skip.min(lines.len()));
                    if !lines.is_empty() && tx.send(Ok(lines)).is_err() {
                        break;
                    }
                    if seen >= docs.end {
                        break;
                    }
                }
                Err(e) => {
                    // The receiver may be gone already; the error then has no one to tell.
                    let _ = tx.send(Err(e));
                    break;
                }
            }
        })
        .map_err(|e| IndexError::io(&path, e))?;
    Ok(rx.into_iter())
}

fn build_in_pool(
    corpus: &Path,
    out: &Path,
    opts: &BuildOptions,
    docs: Option<std::ops::Range<u64>>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<BuildReport, IndexError> {
    let started = Instant::now();
    let first_doc = docs.as_ref().map_or(0, |d| d.start);
    if opts.scoring.is_empty() {
        return Err(IndexError::InvalidOption(
            "scoring stream name is empty (use a stream name or `all`)".into(),
        ));
    }
    let tmp = TempDir::create(out)?;
    let reader = CorpusReader::open(corpus)?;
    let path = reader.path().to_path_buf();
    let mut collected = Collected::default();
    let mut forward = match opts.forward {
        true => Some(Provisional::create(&tmp.path)?),
        false => None,
    };
    // Each term's occurrences in every stream, by global id (with a forward index).
    let mut cf: Vec<u64> = Vec::new();
    let mut chunk_postings: Vec<Vec<Posting>> = Vec::new();
    let batch = CHUNK_DOCS * rayon::current_num_threads() * 8;
    let batches = read_ahead(reader, batch, docs)?;
    let mut clock = PhaseClock::start();
    for lines in batches {
        let lines = lines?;
        clock.charge(Step::Read);
        let parsed = lines
            .par_chunks(CHUNK_DOCS)
            .map_init(ChunkParser::default, |parser, c| {
                parse_chunk(parser, &path, c)
            })
            .collect::<Result<Vec<_>, _>>()?;
        clock.charge(Step::Parse);
        let terms: Vec<_> = parsed
            .par_iter()
            .map(|chunk| collected.split_known(&chunk.vocab))
            .collect();
        clock.charge(Step::Lookup);
        let mut jobs = Vec::with_capacity(parsed.len());
        for (chunk, terms) in parsed.iter().zip(terms) {
            let first = collected.docs;
            if first + chunk.docs.len() as u64 >= u32::MAX as u64 {
                return Err(IndexError::InvalidOption(format!(
                    "more than {} documents",
                    u32::MAX - 1
                )));
            }
            let (map, sids) = collected.merge(chunk, terms);
            jobs.push((map, sids, first as u32));
        }
        clock.charge(Step::Merge);
        let encoded: Vec<_> = parsed
            .par_iter()
            .zip(&jobs)
            .map(|(c, (map, sids, first))| {
                encode_chunk(c, map, sids, *first, &opts.scoring, opts.forward)
            })
            .collect();
        for (chunk, (map, _, _)) in encoded.into_iter().zip(&jobs) {
            if let Some(w) = forward.as_mut() {
                w.write(&chunk.forward, &chunk.forward_lens)?;
                cf.resize(collected.vocab.terms.len(), 0);
                for (&global, &n) in map.iter().zip(&chunk.counts) {
                    cf[global as usize] += n as u64;
                }
            }
            collected.scoring_len.extend(chunk.lens);
            chunk_postings.push(chunk.postings);
        }
        clock.charge(Step::Encode);
        progress(lines.len() as u64);
    }
    let forward_bytes = match forward {
        Some(w) => w.finish(&tmp.path, &cf, collected.streams.len())?,
        None => 0,
    };
    clock.charge(Step::Write);
    let n_terms = collected.vocab.terms.len();
    let ranges = invert(&chunk_postings, n_terms, opts.codec, &collected.scoring_len);
    drop(chunk_postings);
    clock.charge(Step::Invert);
    let (infos, postings_bytes, skips_bytes) = write_postings(&tmp.path, ranges)?;
    let terms = &collected.vocab.terms;
    write_terms(&tmp.path, terms.len(), |id| terms.get(id), &infos)?;
    collected.id_offsets.push(collected.ids.len() as u64);
    check_ids_unique(corpus, first_doc, &collected.ids, &collected.id_offsets)?;
    if opts.scoring != "all" && !collected.streams.contains(&opts.scoring) {
        return Err(IndexError::InvalidOption(format!(
            "scoring stream {:?} occurs in no document of {} (its streams: {:?})",
            opts.scoring,
            corpus.display(),
            collected.streams
        )));
    }
    write_docs(
        &tmp.path,
        &collected.scoring_len,
        &collected.stream_lengths,
        &collected.static_values,
        &collected.id_offsets,
        &collected.ids,
    )?;
    let manifest = Manifest {
        format: Manifest::FORMAT.into(),
        version: super::reader::MANIFEST_VERSION,
        codec: opts.codec,
        scoring: opts.scoring.clone(),
        streams: collected.streams.clone(),
        static_features: collected.statics.clone(),
        num_docs: collected.docs,
        num_terms: n_terms as u64,
        num_postings: infos.iter().map(|i| i.df as u64).sum(),
        total_scoring_length: collected.scoring_len.iter().map(|&l| l as u64).sum(),
        stream_total_lengths: collected
            .stream_lengths
            .iter()
            .map(|c| c.iter().map(|&l| l as u64).sum())
            .collect(),
        has_forward: opts.forward,
        source: format!("corpus {}", corpus.display()),
        checksum: String::new(),
    };
    manifest.write(&tmp.path)?;
    tmp.commit(out)?;
    clock.charge(Step::Write);
    let sizes = [postings_bytes, skips_bytes, forward_bytes];
    Ok(BuildReport::of(
        &manifest,
        sizes,
        started,
        clock.into_phases(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture_corpus() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/corpus.jsonl")
    }

    #[test]
    fn open_or_build_builds_once_then_reuses_and_moves_a_broken_one_aside() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("index");
        let opts = BuildOptions {
            threads: 1,
            ..BuildOptions::default()
        };
        let built = open_or_build(&fixture_corpus(), &out, &opts).unwrap();
        assert_eq!(built.map(|r| r.docs), Some(200));
        assert!(open_or_build(&fixture_corpus(), &out, &opts)
            .unwrap()
            .is_none());

        std::fs::write(out.join(super::super::reader::DOCS_FILE), b"truncated").unwrap();
        let rebuilt = open_or_build(&fixture_corpus(), &out, &opts).unwrap();
        assert!(rebuilt.is_some());
        assert_eq!(Index::open(&out).unwrap().num_docs(), 200);
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("index.unreadable-"))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
    }
}
