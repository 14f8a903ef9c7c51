//! The forward index (`forward.bin`): per document, its streams' term ids phrase by phrase, as
//! varints. What builds hit requests for the ranker (DESIGN §5); selection never reads it.
//! Opened and checked by [`super::reader::Index::open`], which serves it through
//! `Index::forward_doc` and `Index::hits`.

use std::path::Path;

use super::format::MappedFile;
use super::{IndexError, TermId};

/// Container kind of `forward.bin`.
pub const KIND_FORWARD: [u8; 4] = *b"FWDX";

/// One stream of a document in the forward index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardStream {
    /// Index into [`super::Manifest::streams`].
    pub stream: u32,
    /// Tokens in the stream (positions are `0..length`).
    pub length: u32,
    /// Tokens per phrase, in order (they sum to `length`).
    pub phrase_lens: Vec<u32>,
    /// The term id at each position.
    pub terms: Vec<TermId>,
}

/// A stream's hits for one query: DESIGN §5's `{"length", "phrases": [[[term index, position], ...], ...]}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHits {
    /// The stream's name.
    pub stream: String,
    /// Tokens in the stream.
    pub length: u32,
    /// Per phrase that holds at least one query term, its hits `[query term index, position]`
    /// in position order. Phrases without hits are left out.
    pub phrases: Vec<Vec<[u32; 2]>>,
}

/// An open `forward.bin`: section 0 the documents' bytes, section 1 their `num_docs + 1` u64
/// offsets (checked at open).
#[derive(Debug)]
pub struct ForwardIndex {
    file: MappedFile,
}

impl ForwardIndex {
    /// Maps `path` and checks its document offsets against `num_docs`.
    ///
    /// # Errors
    /// [`IndexError::Io`] or [`IndexError::Corrupt`] (header, CRC, offsets).
    pub fn open(path: &Path, num_docs: u64) -> Result<Self, IndexError> {
        let file = MappedFile::open(path, KIND_FORWARD, 2)?;
        file.expect_len(1, "document offsets", num_docs + 1, 8)?;
        super::reader::check_offsets(&file, 1, 0, "document offsets")?;
        Ok(Self { file })
    }

    /// Document `d`'s streams, given the index's stream count and term count (the ranges
    /// every decoded number is checked against).
    ///
    /// # Errors
    /// [`IndexError::Corrupt`] when the document's bytes do not decode.
    pub fn doc(
        &self,
        d: super::DocId,
        n_streams_in_index: usize,
        num_terms: u32,
    ) -> Result<Vec<ForwardStream>, IndexError> {
        let f = &self.file;
        let o = f.section(1);
        let at = |k: usize| {
            u64::from_le_bytes(o[k * 8..k * 8 + 8].try_into().expect("8 bytes")) as usize
        };
        let bytes = &f.section(0)[at(d as usize)..at(d as usize + 1)];
        let bad = |what: &str| f.corrupt(format!("document {d}: {what}"));
        let mut r = VarintReader { bytes, at: 0 };
        let n_streams = r.next().ok_or_else(|| bad("truncated stream count"))?;
        // The count is read from the file: it sizes nothing beyond the streams an index has.
        let mut streams = Vec::with_capacity((n_streams as usize).min(n_streams_in_index));
        for _ in 0..n_streams {
            let stream = r.next().ok_or_else(|| bad("truncated stream number"))?;
            if stream as usize >= n_streams_in_index {
                return Err(bad("stream number out of range"));
            }
            let length = r.next().ok_or_else(|| bad("truncated length"))?;
            let n_phrases = r.next().ok_or_else(|| bad("truncated phrase count"))?;
            if n_phrases > length {
                return Err(bad("more phrases than tokens"));
            }
            let phrase_lens = (0..n_phrases)
                .map(|_| r.next().ok_or_else(|| bad("truncated phrase length")))
                .collect::<Result<Vec<_>, _>>()?;
            if phrase_lens.iter().map(|&p| p as u64).sum::<u64>() != length as u64 {
                return Err(bad("phrase lengths do not sum to the stream length"));
            }
            if length as usize > bytes.len() {
                return Err(bad("stream longer than its bytes"));
            }
            let terms = (0..length)
                .map(|_| {
                    r.next()
                        .filter(|&t| t < num_terms)
                        .ok_or_else(|| bad("term id truncated or out of range"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            streams.push(ForwardStream {
                stream,
                length,
                phrase_lens,
                terms,
            });
        }
        Ok(streams)
    }
}

/// The hits of a document's `streams` for a query whose `i`-th term has id `query[i]` (`None`
/// for a term not in the index): every stream (named from `stream_names`, with its length), and
/// per phrase the `[i, position]` pairs where a query term occurs.
pub fn hits(
    streams: Vec<ForwardStream>,
    stream_names: &[String],
    query: &[Option<TermId>],
) -> Vec<StreamHits> {
    let mut out = Vec::with_capacity(streams.len());
    for s in streams {
        let mut phrases = Vec::new();
        let mut pos = 0usize;
        for &len in &s.phrase_lens {
            let mut hits = Vec::new();
            for p in pos..pos + len as usize {
                for (qi, q) in query.iter().enumerate() {
                    if *q == Some(s.terms[p]) {
                        hits.push([qi as u32, p as u32]);
                    }
                }
            }
            if !hits.is_empty() {
                phrases.push(hits);
            }
            pos += len as usize;
        }
        out.push(StreamHits {
            stream: stream_names[s.stream as usize].clone(),
            length: s.length,
            phrases,
        });
    }
    out
}

struct VarintReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl VarintReader<'_> {
    fn next(&mut self) -> Option<u32> {
        let mut v = 0u64;
        for shift in (0..35).step_by(7) {
            let b = *self.bytes.get(self.at)?;
            self.at += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return u32::try_from(v).ok();
            }
        }
        None
    }
}
