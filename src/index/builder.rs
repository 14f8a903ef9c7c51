//! Builds an index directory from a JSON Lines corpus, on every core.
//!
//! Pipeline (deterministic: the bytes depend only on the corpus and the options, not on the
//! thread count):
//! 1. Read lines in batches (a thread of its own reads one batch ahead); parse and tokenize
//!    chunks of [`CHUNK_DOCS`] documents in parallel, each chunk with its own local vocabulary.
//! 2. Look each chunk's terms up in the global vocabulary (in parallel, read-only), then merge
//!    the new ones into it in corpus order (term ids are assigned in order of first occurrence),
//!    and register stream and static-feature names.
//! 3. In parallel per chunk: rewrite tokens to global term ids, encode the forward index,
//!    and emit `(term, doc, tf)` postings of the scoring stream sorted by term; the forward
//!    bytes are streamed to `forward.bin` in order.
//! 4. Invert in parallel over term-id ranges of about equal posting counts: each range
//!    gathers its postings from every chunk (counting sort) and encodes its lists; the ranges'
//!    bytes are concatenated in term order into `postings.bin` and `skips.bin`.
//! 5. Sort the dictionary, write `terms.bin`, `docs.bin` and `index.json`.
//!
//! Everything is written into a temporary directory next to `--out`, renamed into place once
//! complete.

use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::time::Instant;

use foldhash::fast::FixedState;
use hashbrown::HashTable;
use rayon::prelude::*;

use super::codecs::{encode_list, Codec, SkipEntry};
use super::corpus::{parse_line, CorpusDoc, CorpusReader, RawLine};
use super::format::{write_file, SectionWriter};
use super::reader::{
    Index, Manifest, TermInfo, FORWARD_FILE, KIND_DOCS, KIND_FORWARD, KIND_POSTINGS, KIND_SKIPS,
    KIND_TERMS,
};
use super::tokenize::Tokenizer;
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
    /// Bytes of `forward.bin` (0 without a forward index).
    pub forward_bytes: u64,
    /// Threads used.
    pub threads: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Wall-clock seconds per pipeline step, in order (`read`: waiting for the reader thread,
    /// `parse`, `lookup` of the known terms, the sequential `merge`, `encode`, `invert`,
    /// `write`): where a build's time goes, so that a slow one can be told apart.
    pub phases: Vec<(&'static str, f64)>,
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

/// Terms in id order, stored end to end in one string: a chunk's few tens of thousands of
/// distinct terms cost two allocations, not one each (allocating and freeing a string per
/// distinct term of every chunk was a large part of a build).
#[derive(Default)]
struct Terms {
    text: String,
    ends: Vec<usize>,
}

impl Terms {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn get(&self, id: u32) -> &str {
        let id = id as usize;
        let start = if id == 0 { 0 } else { self.ends[id - 1] };
        &self.text[start..self.ends[id]]
    }

    fn push(&mut self, term: &str) {
        self.text.push_str(term);
        self.ends.push(self.text.len());
    }

    fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len() as u32).map(|id| self.get(id))
    }
}

/// [`Terms`] and a hash table of their ids, which can be cleared and refilled without giving
/// its memory back (a chunk's parser does that for every chunk).
///
/// The hash is foldhash's fast variant with a fixed seed (builds are reproducible; keys are not
/// attacker-chosen in a way that matters here: a slow build, not a wrong one), folded to 32 bits
/// and kept beside each id: growing the table rehashes from those instead of reading every term
/// again, and a probe compares them before the strings (20 M new terms inserted in 6.0–7.3 s
/// before, 2.2–4.4 s after, on the development machine). A hand-rolled FxHash before foldhash
/// mixed its last multiply into the high bits only, and the table indexes by the low ones: with
/// syllable-built words the lookups collided, and merging a 1 M-document corpus's 2.3 M terms
/// took 61 s of a 94 s build.
#[derive(Default)]
struct Vocab {
    terms: Terms,
    /// (id, the term's 32-bit hash).
    ids: HashTable<(u32, u32)>,
}

impl Vocab {
    /// A term's 32-bit hash (the high and low halves of foldhash's, folded).
    fn hash32(term: &str) -> u32 {
        let h = FixedState::default().hash_one(term);
        (h ^ (h >> 32)) as u32
    }

    /// The table's hash of a 32-bit one: hashbrown takes its tag from the top bits and the bucket
    /// from the low ones, so both halves carry it.
    fn spread(h: u32) -> u64 {
        (h as u64) << 32 | h as u64
    }

    fn find(&self, term: &str, h: u32) -> Option<u32> {
        self.ids
            .find(Self::spread(h), |&(id, hid)| {
                hid == h && self.terms.get(id) == term
            })
            .map(|&(id, _)| id)
    }

    fn get(&self, term: &str) -> Option<u32> {
        self.find(term, Self::hash32(term))
    }

    /// `term`'s id, adding it (as the next id) when it is new.
    fn id_or_insert(&mut self, term: &str) -> u32 {
        let h = Self::hash32(term);
        if let Some(id) = self.find(term, h) {
            return id;
        }
        let id = self.terms.len() as u32;
        self.terms.push(term);
        self.ids
            .insert_unique(Self::spread(h), (id, h), |&(_, h)| Self::spread(h));
        id
    }
}

struct ParsedStream {
    name: String,
    tokens: Vec<u32>,
    phrase_lens: Vec<u32>,
}

struct ParsedDoc {
    id: String,
    streams: Vec<ParsedStream>,
    statics: Vec<(String, f64)>,
}

struct ParsedChunk {
    vocab: Terms,
    docs: Vec<ParsedDoc>,
}

#[derive(Clone, Copy)]
struct Posting {
    term: u32,
    doc: u32,
    tf: u32,
}

/// What a worker thread keeps from one chunk to the next: its tokenizer and the capacity of its
/// chunk vocabulary's table (grown once instead of from empty for every chunk).
#[derive(Default)]
struct ChunkParser {
    tokenizer: Tokenizer,
    ids: HashTable<(u32, u32)>,
}

fn parse_chunk(
    parser: &mut ChunkParser,
    path: &Path,
    lines: &[RawLine],
) -> Result<ParsedChunk, IndexError> {
    let ChunkParser { tokenizer, ids } = parser;
    ids.clear();
    let mut local = Vocab {
        terms: Terms::default(),
        ids: std::mem::take(ids),
    };
    let mut docs = Vec::with_capacity(lines.len());
    for raw in lines {
        let CorpusDoc {
            id,
            streams,
            static_features,
        } = parse_line(path, raw)?;
        let streams = streams
            .into_iter()
            .map(|(name, text)| {
                let mut tokens = Vec::new();
                let mut phrase_lens: Vec<u32> = Vec::new();
                tokenizer.for_each_token(&text, |term, pos| {
                    tokens.push(local.id_or_insert(term));
                    if pos.phrase as usize == phrase_lens.len() {
                        phrase_lens.push(0);
                    }
                    *phrase_lens.last_mut().expect("pushed above") += 1;
                });
                ParsedStream {
                    name,
                    tokens,
                    phrase_lens,
                }
            })
            .collect();
        docs.push(ParsedDoc {
            id,
            streams,
            statics: static_features.into_iter().collect(),
        });
    }
    *ids = local.ids;
    Ok(ParsedChunk {
        vocab: local.terms,
        docs,
    })
}

/// A chunk's vocabulary after [`Collected::split_known`]: per local term, its global id when it
/// was already known, and the other terms' strings in local order.
struct ChunkTerms {
    known: Vec<Option<u32>>,
    fresh: Terms,
}

/// Global state accumulated in corpus order.
#[derive(Default)]
struct Collected {
    vocab: Vocab,
    streams: Vec<String>,
    stream_lengths: Vec<Vec<u32>>,
    statics: Vec<String>,
    static_values: Vec<Vec<f64>>,
    ids: Vec<u8>,
    id_offsets: Vec<u64>,
    scoring_len: Vec<u32>,
    docs: u64,
}

impl Collected {
    fn name_index(names: &mut Vec<String>, name: &str) -> (usize, bool) {
        match names.iter().position(|n| n == name) {
            Some(i) => (i, false),
            None => {
                names.push(name.to_string());
                (names.len() - 1, true)
            }
        }
    }

    /// Splits a chunk's vocabulary into the global ids of the terms already known and the terms
    /// that are not (in order): a read-only pass that chunks make in parallel before
    /// [`merge`](Self::merge), which then only sees the new terms. The lookups, one per distinct
    /// term of every chunk, were most of the sequential part of a build.
    fn split_known(&self, vocab: &Terms) -> ChunkTerms {
        let mut fresh = Terms::default();
        let known = vocab
            .iter()
            .map(|t| {
                let id = self.vocab.get(t);
                if id.is_none() {
                    fresh.push(t);
                }
                id
            })
            .collect();
        ChunkTerms { known, fresh }
    }

    /// Registers a chunk's names and per-document columns; returns its local → global term map
    /// and, per document, its streams' global indices. `terms` is
    /// [`split_known`](Self::split_known) of the chunk's vocabulary, taken before its batch's
    /// merges began.
    fn merge(&mut self, chunk: &ParsedChunk, terms: ChunkTerms) -> (Vec<u32>, Vec<Vec<u32>>) {
        let mut fresh = terms.fresh.iter();
        let map = terms
            .known
            .into_iter()
            .map(|known| {
                // Not known before this batch: new, or added by an earlier chunk of it.
                known.unwrap_or_else(|| {
                    let t = fresh.next().expect("one fresh term per unknown id");
                    self.vocab.id_or_insert(t)
                })
            })
            .collect();
        let mut stream_ids = Vec::with_capacity(chunk.docs.len());
        for doc in &chunk.docs {
            let d = self.docs as usize;
            let mut ids = Vec::with_capacity(doc.streams.len());
            for s in &doc.streams {
                let (i, new) = Self::name_index(&mut self.streams, &s.name);
                if new {
                    self.stream_lengths.push(vec![0; d]);
                }
                self.stream_lengths[i].push(s.tokens.len() as u32);
                ids.push(i as u32);
            }
            for col in &mut self.stream_lengths {
                col.resize(d + 1, 0);
            }
            for (name, v) in &doc.statics {
                let (i, new) = Self::name_index(&mut self.statics, name);
                if new {
                    self.static_values.push(vec![f64::NAN; d]);
                }
                self.static_values[i].push(*v);
            }
            for col in &mut self.static_values {
                col.resize(d + 1, f64::NAN);
            }
            self.id_offsets.push(self.ids.len() as u64);
            self.ids.extend_from_slice(doc.id.as_bytes());
            self.docs += 1;
            stream_ids.push(ids);
        }
        (map, stream_ids)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Encodes a chunk's forward index and scoring postings; returns (forward bytes, per-doc
/// forward byte lengths, postings sorted by term then doc, scoring lengths).
fn encode_chunk(
    chunk: &ParsedChunk,
    map: &[u32],
    stream_ids: &[Vec<u32>],
    first_doc: u32,
    scoring: &str,
    forward: bool,
) -> (Vec<u8>, Vec<u32>, Vec<Posting>, Vec<u32>) {
    let mut fwd = Vec::new();
    let mut fwd_lens = Vec::with_capacity(chunk.docs.len());
    let mut postings = Vec::new();
    let mut lens = Vec::with_capacity(chunk.docs.len());
    let mut scoring_terms: Vec<u32> = Vec::new();
    let all = scoring == "all";
    for (i, doc) in chunk.docs.iter().enumerate() {
        let d = first_doc + i as u32;
        let start = fwd.len();
        scoring_terms.clear();
        if forward {
            put_varint(&mut fwd, doc.streams.len() as u32);
        }
        for (s, &sid) in doc.streams.iter().zip(&stream_ids[i]) {
            if forward {
                put_varint(&mut fwd, sid);
                put_varint(&mut fwd, s.tokens.len() as u32);
                put_varint(&mut fwd, s.phrase_lens.len() as u32);
                for &p in &s.phrase_lens {
                    put_varint(&mut fwd, p);
                }
                for &t in &s.tokens {
                    put_varint(&mut fwd, map[t as usize]);
                }
            }
            if all || s.name == scoring {
                scoring_terms.extend(s.tokens.iter().map(|&t| map[t as usize]));
            }
        }
        fwd_lens.push((fwd.len() - start) as u32);
        lens.push(scoring_terms.len() as u32);
        scoring_terms.sort_unstable();
        let mut j = 0;
        while j < scoring_terms.len() {
            let t = scoring_terms[j];
            let mut k = j + 1;
            while k < scoring_terms.len() && scoring_terms[k] == t {
                k += 1;
            }
            postings.push(Posting {
                term: t,
                doc: d,
                tf: (k - j) as u32,
            });
            j = k;
        }
    }
    postings.sort_unstable_by_key(|p| (p.term, p.doc));
    (fwd, fwd_lens, postings, lens)
}

/// One term range's encoded lists (offsets relative to the range until [`write_postings`]).
#[derive(Default)]
pub(crate) struct RangeOut {
    bytes: Vec<u8>,
    skips: Vec<SkipEntry>,
    infos: Vec<TermInfo>,
}

impl RangeOut {
    /// Encodes the next term's list (`docs` strictly increasing, `tfs ≥ 1`, at most 2³² − 1
    /// postings) and records its info.
    pub(crate) fn push_list(
        &mut self,
        codec: Codec,
        docs: &[u32],
        tfs: &[u32],
        doc_len: impl Fn(u32) -> u32,
    ) {
        let (offset, first_skip) = (self.bytes.len(), self.skips.len());
        encode_list(codec, docs, tfs, doc_len, &mut self.bytes, &mut self.skips);
        self.infos.push(TermInfo {
            df: docs.len() as u32,
            n_blocks: (self.skips.len() - first_skip) as u32,
            postings_offset: offset as u64,
            postings_len: (self.bytes.len() - offset) as u64,
            skip_start: first_skip as u64,
        });
    }
}

/// Inverts the chunks' postings (each sorted by term, then doc; chunks in doc order) and
/// encodes every term's list; returns ranges in term order.
fn invert(
    chunks: &[Vec<Posting>],
    n_terms: usize,
    codec: Codec,
    scoring_len: &[u32],
) -> Vec<RangeOut> {
    let df: Vec<u32> = chunks
        .par_iter()
        .fold(
            || vec![0u32; n_terms],
            |mut acc, c| {
                for p in c {
                    acc[p.term as usize] += 1;
                }
                acc
            },
        )
        .reduce(
            || vec![0u32; n_terms],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            },
        );
    let total: u64 = df.iter().map(|&d| d as u64).sum();
    let target = (total / (rayon::current_num_threads() as u64 * 8)).max(1 << 16);
    let mut ranges = Vec::new();
    let (mut lo, mut acc) = (0usize, 0u64);
    for (t, &d) in df.iter().enumerate() {
        acc += d as u64;
        if acc >= target {
            ranges.push(lo..t + 1);
            lo = t + 1;
            acc = 0;
        }
    }
    if lo < n_terms || ranges.is_empty() {
        ranges.push(lo..n_terms);
    }
    ranges
        .into_par_iter()
        .map(|r| {
            let mut starts = Vec::with_capacity(r.len() + 1);
            let mut n = 0usize;
            for t in r.clone() {
                starts.push(n);
                n += df[t] as usize;
            }
            starts.push(n);
            let mut docs = vec![0u32; n];
            let mut tfs = vec![0u32; n];
            let mut cursor = starts.clone();
            for c in chunks {
                let a = c.partition_point(|p| (p.term as usize) < r.start);
                let b = c.partition_point(|p| (p.term as usize) < r.end);
                for p in &c[a..b] {
                    let at = &mut cursor[p.term as usize - r.start];
                    docs[*at] = p.doc;
                    tfs[*at] = p.tf;
                    *at += 1;
                }
            }
            let mut out = RangeOut::default();
            for k in 0..r.len() {
                let (s, e) = (starts[k], starts[k + 1]);
                out.push_list(codec, &docs[s..e], &tfs[s..e], |d| scoring_len[d as usize]);
            }
            out
        })
        .collect()
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
    pool.install(|| build_in_pool(corpus, out, opts, progress))
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

/// The corpus's batches of `batch` lines, read by a thread of their own one batch ahead of the
/// caller (reading was 12 s of a 79 s 10 M-document build when it waited its turn). The thread
/// stops at the end, after a read error (sent as the last item), or when the receiver is dropped.
///
/// # Errors
/// [`IndexError::Io`] when the thread cannot be started.
fn read_ahead(
    mut reader: CorpusReader,
    batch: usize,
) -> Result<std::sync::mpsc::IntoIter<Result<Vec<RawLine>, IndexError>>, IndexError> {
    let path = reader.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("corpus-reader".into())
        .spawn(move || loop {
            let mut lines = Vec::with_capacity(batch);
            match reader.read_batch(batch, &mut lines) {
                Ok(0) => break,
                Ok(_) => {
                    if tx.send(Ok(lines)).is_err() {
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
    progress: &(dyn Fn(u64) + Sync),
) -> Result<BuildReport, IndexError> {
    let started = Instant::now();
    if opts.scoring.is_empty() {
        return Err(IndexError::InvalidOption(
            "scoring stream name is empty (use a stream name or `all`)".into(),
        ));
    }
    let tmp = TempDir::create(out)?;
    let reader = CorpusReader::open(corpus)?;
    let path = reader.path().to_path_buf();
    let mut collected = Collected::default();
    let mut forward = if opts.forward {
        Some(SectionWriter::create(
            &tmp.path.join(FORWARD_FILE),
            KIND_FORWARD,
        )?)
    } else {
        None
    };
    let mut fwd_offsets: Vec<u64> = vec![0];
    let mut chunk_postings: Vec<Vec<Posting>> = Vec::new();
    let batch = CHUNK_DOCS * rayon::current_num_threads() * 8;
    let batches = read_ahead(reader, batch)?;
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
        for (fwd, fwd_lens, postings, lens) in encoded {
            if let Some(w) = forward.as_mut() {
                w.write(&fwd)?;
                let mut at = *fwd_offsets.last().expect("starts with 0");
                for l in fwd_lens {
                    at += l as u64;
                    fwd_offsets.push(at);
                }
            }
            collected.scoring_len.extend(lens);
            chunk_postings.push(postings);
        }
        clock.charge(Step::Encode);
        progress(lines.len() as u64);
    }
    let mut forward_bytes = 0;
    if let Some(mut w) = forward {
        forward_bytes = w.section_len();
        w.end_section()?;
        w.write(&u64s(&fwd_offsets))?;
        w.end_section()?;
        w.finish()?;
    }
    let n_terms = collected.vocab.terms.len();
    let ranges = invert(&chunk_postings, n_terms, opts.codec, &collected.scoring_len);
    drop(chunk_postings);
    clock.charge(Step::Invert);
    let (infos, postings_bytes, skips_bytes) = write_postings(&tmp.path, ranges)?;
    let terms = &collected.vocab.terms;
    write_terms(&tmp.path, terms.len(), |id| terms.get(id), &infos)?;
    collected.id_offsets.push(collected.ids.len() as u64);
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
        version: super::format::FORMAT_VERSION,
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
    };
    manifest.write(&tmp.path)?;
    tmp.commit(out)?;
    clock.charge(Step::Write);
    Ok(BuildReport {
        docs: manifest.num_docs,
        terms: manifest.num_terms,
        postings: manifest.num_postings,
        postings_bytes,
        skips_bytes,
        forward_bytes,
        threads: rayon::current_num_threads(),
        seconds: started.elapsed().as_secs_f64(),
        phases: clock.into_phases(),
    })
}

/// Little-endian bytes of a u64 slice.
pub(crate) fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes of a u32 slice.
pub(crate) fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes `postings.bin` and `skips.bin` from encoded ranges (in term order); returns every
/// term's info with file-absolute offsets, and the two files' payload sizes.
pub(crate) fn write_postings(
    dir: &Path,
    ranges: Vec<RangeOut>,
) -> Result<(Vec<TermInfo>, u64, u64), IndexError> {
    let mut post = SectionWriter::create(&dir.join(super::reader::POSTINGS_FILE), KIND_POSTINGS)?;
    let mut skips = SectionWriter::create(&dir.join(super::reader::SKIPS_FILE), KIND_SKIPS)?;
    let mut infos = Vec::new();
    let mut skip_bytes = Vec::new();
    let (mut at, mut sk) = (0u64, 0u64);
    for r in ranges {
        post.write(&r.bytes)?;
        skip_bytes.clear();
        for s in &r.skips {
            s.write(&mut skip_bytes);
        }
        skips.write(&skip_bytes)?;
        infos.extend(r.infos.into_iter().map(|mut i| {
            i.postings_offset += at;
            i.skip_start += sk;
            i
        }));
        at += r.bytes.len() as u64;
        sk += r.skips.len() as u64;
    }
    let (pb, sb) = (post.section_len(), skips.section_len());
    post.end_section()?;
    post.finish()?;
    skips.end_section()?;
    skips.finish()?;
    Ok((infos, pb, sb))
}

/// Writes `terms.bin`: the dictionary sorted by term, and each term id's info.
pub(crate) fn write_terms<'t>(
    dir: &Path,
    n_terms: usize,
    term: impl Fn(u32) -> &'t str + Sync,
    infos: &[TermInfo],
) -> Result<(), IndexError> {
    let mut order: Vec<u32> = (0..n_terms as u32).collect();
    order.par_sort_unstable_by(|&a, &b| term(a).cmp(term(b)));
    let mut offsets = Vec::with_capacity(n_terms + 1);
    let mut bytes = Vec::new();
    for &t in &order {
        offsets.push(bytes.len() as u64);
        bytes.extend_from_slice(term(t).as_bytes());
    }
    offsets.push(bytes.len() as u64);
    let mut info_bytes = Vec::with_capacity(infos.len() * TermInfo::BYTES);
    for i in infos {
        i.write(&mut info_bytes);
    }
    write_file(
        &dir.join(super::reader::TERMS_FILE),
        KIND_TERMS,
        &[&u64s(&offsets), &bytes, &u32s(&order), &info_bytes],
    )
}

/// Writes `docs.bin`.
pub(crate) fn write_docs(
    dir: &Path,
    scoring_len: &[u32],
    stream_lengths: &[Vec<u32>],
    static_values: &[Vec<f64>],
    id_offsets: &[u64],
    ids: &[u8],
) -> Result<(), IndexError> {
    let lengths: Vec<u8> = stream_lengths.iter().flat_map(|c| u32s(c)).collect();
    let statics: Vec<u8> = static_values
        .iter()
        .flat_map(|c| c.iter().flat_map(|v| v.to_le_bytes()))
        .collect();
    write_file(
        &dir.join(super::reader::DOCS_FILE),
        KIND_DOCS,
        &[
            &u32s(scoring_len),
            &lengths,
            &statics,
            &u64s(id_offsets),
            ids,
        ],
    )
}

/// A build directory next to the destination, removed unless committed.
pub(crate) struct TempDir {
    pub(crate) path: PathBuf,
    committed: bool,
}

impl TempDir {
    /// Creates `.NAME.building-PID` next to `out`; refuses when `out` exists.
    pub(crate) fn create(out: &Path) -> Result<Self, IndexError> {
        if out.exists() {
            return Err(IndexError::InvalidOption(format!(
                "{} already exists; remove it or choose another output directory",
                out.display()
            )));
        }
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "index".into());
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| IndexError::io(parent, e))?;
        let path = parent.join(format!(".{name}.building-{}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(|e| IndexError::io(&path, e))?;
        }
        std::fs::create_dir(&path).map_err(|e| IndexError::io(&path, e))?;
        Ok(Self {
            path,
            committed: false,
        })
    }

    /// Renames the finished directory to `out`.
    pub(crate) fn commit(mut self, out: &Path) -> Result<(), IndexError> {
        std::fs::rename(&self.path, out).map_err(|e| IndexError::io(out, e))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
