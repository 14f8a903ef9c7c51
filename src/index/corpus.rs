//! Corpus input: JSON Lines documents (plain or gzip), and the deterministic synthetic corpus
//! generator behind `rankserve corpus synth`.
//!
//! One document a line:
//! `{"id": "d1", "streams": {"title": "...", "body": "...", "anchor": "...", "url": "..."},
//!   "static": {"static_rank": 0.7}}`. `streams` and `static` may be absent (empty); `id` may
//! not be empty, and `index build` refuses two documents with one id. Blank lines are skipped. A gzip file is recognised by its magic bytes, whatever its name.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal, Zipf};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::IndexError;

/// One corpus document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CorpusDoc {
    /// The external id, returned in search results.
    pub id: String,
    /// Named text streams (title, body, anchor, url, ...).
    #[serde(default)]
    pub streams: BTreeMap<String, String>,
    /// Static (query-independent) features.
    #[serde(default, rename = "static")]
    pub static_features: BTreeMap<String, f64>,
}

/// One raw corpus line with its 1-based line number, parsed later (in parallel).
#[derive(Debug, Clone)]
pub struct RawLine {
    /// 1-based line number in the file.
    pub line: u64,
    /// The line's text, without the line break.
    pub text: String,
}

/// Reads a corpus file line by line, transparently un-gzipping it.
pub struct CorpusReader {
    path: PathBuf,
    reader: Box<dyn BufRead + Send>,
    line: u64,
}

impl CorpusReader {
    /// Opens `path`; gzip is detected from the first two bytes (`1f 8b`).
    ///
    /// # Errors
    /// [`IndexError::Io`] when the file cannot be opened or read.
    pub fn open(path: &Path) -> Result<Self, IndexError> {
        let mut file = File::open(path).map_err(|e| IndexError::io(path, e))?;
        let mut magic = [0u8; 2];
        let n = read_up_to(&mut file, &mut magic).map_err(|e| IndexError::io(path, e))?;
        let file = File::open(path).map_err(|e| IndexError::io(path, e))?;
        let reader: Box<dyn BufRead + Send> = if n == 2 && magic == [0x1f, 0x8b] {
            Box::new(BufReader::with_capacity(
                1 << 20,
                flate2::read::MultiGzDecoder::new(file),
            ))
        } else {
            Box::new(BufReader::with_capacity(1 << 20, file))
        };
        Ok(Self {
            path: path.to_path_buf(),
            reader,
            line: 0,
        })
    }

    /// Appends up to `max` non-blank lines to `out`; returns how many were appended (0 at the end).
    ///
    /// # Errors
    /// [`IndexError::Io`] on a read error; [`IndexError::CorpusLine`] for a line that is not UTF-8.
    pub fn read_batch(&mut self, max: usize, out: &mut Vec<RawLine>) -> Result<usize, IndexError> {
        let mut got = 0;
        let mut buf = Vec::new();
        while got < max {
            buf.clear();
            let n = self
                .reader
                .read_until(b'\n', &mut buf)
                .map_err(|e| IndexError::io(&self.path, e))?;
            if n == 0 {
                break;
            }
            self.line += 1;
            while matches!(buf.last(), Some(b'\n' | b'\r')) {
                buf.pop();
            }
            if buf.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            let text = String::from_utf8(std::mem::take(&mut buf)).map_err(|e| {
                IndexError::CorpusLine {
                    path: self.path.clone(),
                    line: self.line,
                    message: format!(
                        "not UTF-8 (invalid byte at column {})",
                        e.utf8_error().valid_up_to() + 1
                    ),
                }
            })?;
            out.push(RawLine {
                line: self.line,
                text,
            });
            got += 1;
        }
        Ok(got)
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Parses one corpus line.
///
/// # Errors
/// [`IndexError::CorpusLine`] naming the file, line and column when the JSON is not a document.
pub fn parse_line(path: &Path, raw: &RawLine) -> Result<CorpusDoc, IndexError> {
    let bad = |message: String| IndexError::CorpusLine {
        path: path.to_path_buf(),
        line: raw.line,
        message,
    };
    let doc: CorpusDoc =
        serde_json::from_str(&raw.text).map_err(|e| bad(format!("column {}: {e}", e.column())))?;
    if doc.id.is_empty() {
        return Err(bad(
            "`id` is empty: every document needs a non-empty id of its own".into(),
        ));
    }
    Ok(doc)
}

/// Reads a whole corpus into memory (for tests and small fixtures).
///
/// # Errors
/// As [`CorpusReader::open`], [`CorpusReader::read_batch`] and [`parse_line`].
pub fn read_all(path: &Path) -> Result<Vec<CorpusDoc>, IndexError> {
    let mut reader = CorpusReader::open(path)?;
    let mut lines = Vec::new();
    while reader.read_batch(1 << 16, &mut lines)? > 0 {}
    lines.iter().map(|l| parse_line(path, l)).collect()
}

/// Parameters of the synthetic corpus.
#[derive(Debug, Clone, Copy)]
pub struct SynthSpec {
    /// Number of documents.
    pub docs: u64,
    /// Seed: the same (docs, seed) always gives the same bytes, whatever the thread count.
    pub seed: u64,
}

/// Documents per generator chunk; each chunk has its own RNG stream, seeded from (seed, chunk).
pub const SYNTH_CHUNK_DOCS: u64 = 2048;

/// The Zipf exponent of the synthetic vocabulary (English text is close to 1).
const ZIPF_EXPONENT: f64 = 1.0;

/// Vocabulary size for a corpus of `docs` documents: grows with the corpus so that the rarest
/// terms occur once and the commonest occur in nearly every document.
pub fn synth_vocabulary(docs: u64) -> u64 {
    (docs.saturating_mul(2)).clamp(20_000, 20_000_000)
}

/// 64 consonant-vowel syllables; a term is its Zipf rank written in base 64 with them.
const SYLLABLES: [&str; 64] = [
    "ba", "be", "bi", "bo", "bu", "da", "de", "di", "do", "du", "fa", "fe", "fi", "fo", "fu", "ga",
    "ge", "gi", "go", "gu", "ka", "ke", "ki", "ko", "ku", "la", "le", "li", "lo", "lu", "ma", "me",
    "mi", "mo", "mu", "na", "ne", "ni", "no", "nu", "pa", "pe", "pi", "po", "pu", "ra", "re", "ri",
    "ro", "ru", "sa", "se", "si", "so", "su", "ta", "te", "ti", "to", "tu", "va", "ve", "vi", "vo",
];

/// Appends the word of Zipf rank `rank` (1-based) to `out`: distinct ranks give distinct
/// lower-case ASCII words, which the tokenizer reads back as single tokens.
pub fn synth_word(rank: u64, out: &mut String) {
    // Bijective base 64: every rank maps to a distinct non-empty syllable string.
    let mut n = rank;
    let mut digits = [0u8; 12];
    let mut len = 0;
    while n > 0 {
        n -= 1;
        digits[len] = (n % 64) as u8;
        n /= 64;
        len += 1;
    }
    for &d in digits[..len].iter().rev() {
        out.push_str(SYLLABLES[d as usize]);
    }
}

/// Writes the synthetic corpus as JSON Lines to `out` (plain or, when `gzip`, gzip).
///
/// Chunks of [`SYNTH_CHUNK_DOCS`] documents are generated in parallel (rayon) and written in
/// order, so the output is the same for any thread count.
///
/// # Errors
/// I/O errors from `out`.
pub fn write_synth(
    spec: SynthSpec,
    out: &mut dyn Write,
    mut progress: impl FnMut(u64),
) -> std::io::Result<()> {
    let chunks = spec.docs.div_ceil(SYNTH_CHUNK_DOCS);
    let wave = (rayon::current_num_threads() as u64 * 4).max(1);
    let mut first = 0;
    while first < chunks {
        let last = (first + wave).min(chunks);
        let texts: Vec<String> = (first..last)
            .into_par_iter()
            .map(|c| synth_chunk(spec, c))
            .collect();
        for t in &texts {
            out.write_all(t.as_bytes())?;
        }
        progress(
            ((last * SYNTH_CHUNK_DOCS).min(spec.docs)) - (first * SYNTH_CHUNK_DOCS).min(spec.docs),
        );
        first = last;
    }
    Ok(())
}

/// One chunk's JSON Lines text.
fn synth_chunk(spec: SynthSpec, chunk: u64) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    rng.set_stream(chunk);
    let vocab = synth_vocabulary(spec.docs);
    let zipf = Zipf::new(vocab as f64, ZIPF_EXPONENT).expect("vocabulary ≥ 1 and exponent ≥ 0");
    // Body lengths: log-normal, median 100 tokens, long tail (capped at 5000).
    let body_len = LogNormal::new(100f64.ln(), 0.8).expect("valid log-normal");
    let start = chunk * SYNTH_CHUNK_DOCS;
    let end = (start + SYNTH_CHUNK_DOCS).min(spec.docs);
    let mut out = String::with_capacity((end - start) as usize * 1200);
    for doc in start..end {
        out.push_str("{\"id\":\"d");
        out.push_str(&doc.to_string());
        out.push_str("\",\"streams\":{\"title\":\"");
        let title_len = rng.random_range(2..=10);
        synth_text(&mut rng, &zipf, title_len, 50, &mut out);
        out.push_str("\",\"body\":\"");
        let n = (body_len.sample(&mut rng) as u32).clamp(1, 5000);
        synth_text(&mut rng, &zipf, n, 0, &mut out);
        out.push_str("\",\"anchor\":\"");
        let anchor_len = if rng.random_bool(0.5) {
            0
        } else {
            rng.random_range(1..=20)
        };
        synth_text(&mut rng, &zipf, anchor_len, 50, &mut out);
        out.push_str("\",\"url\":\"http://www.");
        synth_word(sample_rank(&mut rng, &zipf, 50), &mut out);
        out.push_str(".com");
        let depth = rng.random_range(1..=4u32);
        for _ in 0..depth {
            out.push('/');
            synth_word(sample_rank(&mut rng, &zipf, 50), &mut out);
        }
        out.push_str("\"},\"static\":{\"static_rank\":");
        let static_rank: f64 = rng.random();
        out.push_str(&format!("{}", (static_rank * 1e6).round() / 1e6));
        out.push_str(",\"url_depth\":");
        out.push_str(&depth.to_string());
        out.push_str("}}\n");
    }
    out
}

/// A Zipf rank, re-drawn while it is at most `skip_top` (titles, anchors and urls avoid the
/// commonest words).
fn sample_rank(rng: &mut ChaCha8Rng, zipf: &Zipf<f64>, skip_top: u64) -> u64 {
    loop {
        let r = zipf.sample(rng) as u64;
        if r > skip_top {
            return r;
        }
    }
}

/// `n` words in sentences of 4–20 words: the first word capitalised, sentences ended by `.`
/// (sometimes `?`, `!` or `;`), and a line break every few sentences.
fn synth_text(rng: &mut ChaCha8Rng, zipf: &Zipf<f64>, n: u32, skip_top: u64, out: &mut String) {
    let mut left_in_sentence = 0u32;
    for i in 0..n {
        if left_in_sentence == 0 {
            left_in_sentence = rng.random_range(4..=20);
            if i > 0 {
                out.push_str(match rng.random_range(0..20u32) {
                    0 => "? ",
                    1 => "! ",
                    2 => "; ",
                    3 => ".\\n",
                    _ => ". ",
                });
            }
            let before = out.len();
            synth_word(sample_rank(rng, zipf, skip_top), out);
            // Capitalise the sentence's first letter (exercises lower-casing).
            // SAFETY of the slice: synth words are ASCII.
            out[before..before + 1].make_ascii_uppercase();
        } else {
            out.push(' ');
            synth_word(sample_rank(rng, zipf, skip_top), out);
        }
        left_in_sentence -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synth_words_are_distinct_for_distinct_ranks() {
        let mut seen = std::collections::HashSet::new();
        for r in 1..=20_000u64 {
            let mut w = String::new();
            synth_word(r, &mut w);
            assert!(seen.insert(w), "rank {r} repeats a word");
        }
    }

    #[test]
    fn synth_is_deterministic_and_parses() {
        let spec = SynthSpec { docs: 300, seed: 7 };
        let mut a = Vec::new();
        write_synth(spec, &mut a, |_| {}).unwrap();
        let b = synth_chunk(spec, 0);
        assert_eq!(&a[..b.len()], b.as_bytes());
        let text = String::from_utf8(a).unwrap();
        let docs: Vec<CorpusDoc> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(docs.len(), 300);
        assert_eq!(docs[299].id, "d299");
        assert!(docs[0].streams["body"].len() > 0);
        assert!(docs[0].static_features.contains_key("static_rank"));
    }

    #[test]
    fn reader_reads_plain_and_gzip_and_reports_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("c.jsonl");
        std::fs::write(
            &plain,
            "{\"id\":\"a\",\"streams\":{\"body\":\"x y\"}}\n\n{\"id\":\"b\"}\n",
        )
        .unwrap();
        let docs = read_all(&plain).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].id, "b");
        let gz = dir.path().join("c.jsonl.gz");
        let mut enc =
            flate2::write::GzEncoder::new(File::create(&gz).unwrap(), flate2::Compression::fast());
        enc.write_all(&std::fs::read(&plain).unwrap()).unwrap();
        enc.finish().unwrap();
        assert_eq!(read_all(&gz).unwrap(), docs);
        let bad = dir.path().join("bad.jsonl");
        std::fs::write(&bad, "{\"id\":\"a\"}\n{\"id\": 3}\n").unwrap();
        let err = read_all(&bad).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
