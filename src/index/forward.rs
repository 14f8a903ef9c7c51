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
        let mut reader = self.reader(d, n_streams_in_index, num_terms)?;
        // The count is read from the file: it sizes nothing beyond the streams an index has.
        let mut streams = Vec::with_capacity(reader.streams_left.min(n_streams_in_index));
        while let Some((stream, length)) = reader.next_stream()? {
            let terms = (0..length)
                .map(|_| reader.term())
                .collect::<Result<Vec<_>, _>>()?;
            streams.push(ForwardStream {
                stream,
                length,
                phrase_lens: reader.phrase_lens.clone(),
                terms,
            });
        }
        Ok(streams)
    }

    /// The hits of document `d` for a query whose `i`-th term has id `query[i]` (`None` for a
    /// term not in the index): every stream (named from `stream_names`, with its length), and
    /// per phrase the `[i, position]` pairs where a query term occurs. One pass over the
    /// document's bytes: its terms are matched as they are read, never collected.
    ///
    /// # Errors
    /// As [`ForwardIndex::doc`].
    pub fn hits(
        &self,
        d: super::DocId,
        stream_names: &[String],
        num_terms: u32,
        query: &[Option<TermId>],
    ) -> Result<Vec<StreamHits>, IndexError> {
        let mut reader = self.reader(d, stream_names.len(), num_terms)?;
        let mut out = Vec::with_capacity(reader.streams_left.min(stream_names.len()));
        while let Some((stream, length)) = reader.next_stream()? {
            let mut phrases = Vec::new();
            let mut position = 0u32;
            for k in 0..reader.phrase_lens.len() {
                let mut hits = Vec::new();
                for _ in 0..reader.phrase_lens[k] {
                    let term = reader.term()?;
                    hits.extend(
                        (query.iter().enumerate())
                            .filter(|&(_, &q)| q == Some(term))
                            .map(|(i, _)| [i as u32, position]),
                    );
                    position += 1;
                }
                if !hits.is_empty() {
                    phrases.push(hits);
                }
            }
            out.push(StreamHits {
                stream: stream_names[stream as usize].clone(),
                length,
                phrases,
            });
        }
        Ok(out)
    }

    // --- Hits into a sink (issue 20 item 1): `ForwardIndex::hits` without its vectors, for a
    // caller that writes each document's hits into buffers it reuses. A thin walk over the same
    // reader as `hits`; it reports the same hits in the same order.

    /// [`ForwardIndex::hits`] written into `sink` instead of returned: each stream of the
    /// document (its index into the index's streams, with its length), then its hits in position
    /// order, a call to [`HitsSink::phrase_end`] after each phrase that had hits (phrases without
    /// hits are left out, as in [`StreamHits`]). On an error the sink holds part of the document.
    ///
    /// # Errors
    /// As [`ForwardIndex::doc`].
    pub fn hits_into(
        &self,
        d: super::DocId,
        n_streams_in_index: usize,
        num_terms: u32,
        query: &[Option<TermId>],
        sink: &mut impl HitsSink,
    ) -> Result<(), IndexError> {
        let mut reader = self.reader(d, n_streams_in_index, num_terms)?;
        while let Some((stream, length)) = reader.next_stream()? {
            sink.stream(stream, length);
            let mut position = 0u32;
            for k in 0..reader.phrase_lens.len() {
                let mut any = false;
                for _ in 0..reader.phrase_lens[k] {
                    let term = reader.term()?;
                    for (i, &q) in query.iter().enumerate() {
                        if q == Some(term) {
                            sink.hit(i as u32, position);
                            any = true;
                        }
                    }
                    position += 1;
                }
                if any {
                    sink.phrase_end();
                }
            }
        }
        Ok(())
    }

    /// A reader of document `d`'s bytes.
    fn reader(
        &self,
        d: super::DocId,
        n_streams_in_index: usize,
        num_terms: u32,
    ) -> Result<DocReader<'_>, IndexError> {
        let f = &self.file;
        let o = f.section(1);
        let at = |k: usize| {
            u64::from_le_bytes(o[k * 8..k * 8 + 8].try_into().expect("8 bytes")) as usize
        };
        let bytes = &f.section(0)[at(d as usize)..at(d as usize + 1)];
        let mut reader = DocReader {
            file: f,
            doc: d,
            varints: VarintReader { bytes, at: 0 },
            streams_left: 0,
            n_streams_in_index,
            num_terms,
            phrase_lens: Vec::new(),
        };
        reader.streams_left = reader
            .varints
            .next()
            .ok_or_else(|| reader.bad("truncated stream count"))?
            as usize;
        Ok(reader)
    }
}

/// Where [`ForwardIndex::hits_into`] writes a document's hits, in the document's order.
pub trait HitsSink {
    /// A stream starts: its index into the index's streams, and its length in tokens.
    fn stream(&mut self, stream: u32, length: u32);
    /// A hit in the current phrase: the query term's index and the position in the stream.
    fn hit(&mut self, term: u32, position: u32);
    /// The current phrase, which had hits, ends.
    fn phrase_end(&mut self);
}

/// A document's bytes read stream by stream: each stream's head (number, length, phrase
/// lengths) checked as it is read, then its `length` term ids one at a time.
struct DocReader<'a> {
    file: &'a MappedFile,
    doc: super::DocId,
    varints: VarintReader<'a>,
    streams_left: usize,
    n_streams_in_index: usize,
    num_terms: u32,
    /// The current stream's tokens per phrase.
    phrase_lens: Vec<u32>,
}

impl DocReader<'_> {
    fn bad(&self, what: &str) -> IndexError {
        self.file.corrupt(format!("document {}: {what}", self.doc))
    }

    fn varint(&mut self, what: &str) -> Result<u32, IndexError> {
        self.varints.next().ok_or_else(|| self.bad(what))
    }

    /// The next stream's number and length (its phrase lengths in `phrase_lens`), `None` after
    /// the last; the caller then reads its `length` terms.
    fn next_stream(&mut self) -> Result<Option<(u32, u32)>, IndexError> {
        if self.streams_left == 0 {
            return Ok(None);
        }
        self.streams_left -= 1;
        let stream = self.varint("truncated stream number")?;
        if stream as usize >= self.n_streams_in_index {
            return Err(self.bad("stream number out of range"));
        }
        let length = self.varint("truncated length")?;
        let n_phrases = self.varint("truncated phrase count")?;
        if n_phrases > length {
            return Err(self.bad("more phrases than tokens"));
        }
        self.phrase_lens.clear();
        for _ in 0..n_phrases {
            let len = self.varint("truncated phrase length")?;
            self.phrase_lens.push(len);
        }
        if self.phrase_lens.iter().map(|&p| p as u64).sum::<u64>() != length as u64 {
            return Err(self.bad("phrase lengths do not sum to the stream length"));
        }
        if length as usize > self.varints.bytes.len() {
            return Err(self.bad("stream longer than its bytes"));
        }
        Ok(Some((stream, length)))
    }

    /// The current stream's next term id.
    fn term(&mut self) -> Result<TermId, IndexError> {
        match self.varints.next() {
            Some(t) if t < self.num_terms => Ok(t),
            _ => Err(self.bad("term id truncated or out of range")),
        }
    }
}

struct VarintReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl VarintReader<'_> {
    fn next(&mut self) -> Option<u32> {
        // Most of a document's numbers fit one byte (lengths, phrase lengths, frequent terms).
        let first = *self.bytes.get(self.at)?;
        if first < 0x80 {
            self.at += 1;
            return Some(first as u32);
        }
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
