//! The host side of GPU feature extraction: a batch of hit documents validated by the CPU's rules
//! and flattened into the arrays `kernels/fe.cu` reads ([`FeLayout`]), with the query's
//! [`FeParams`] and, for `fe_gather`, the ranker's gather codes and the documents' static
//! features. Apart from [`super::fe`] (the device buffers and launches) because it needs no
//! device: layouts are built on the host's threads before a device turn is taken, a decoder lays
//! documents out as it reads them ([`LayoutPart`]), and its tests run without a GPU.

use std::ops::Range;

use parking_lot::Mutex;
use rayon::prelude::*;

use crate::gpu::pinned::{HostBuffer, PinnedPool};
use crate::gpu::GpuError;
use crate::rank::fe::catalogue::STREAMS;
use crate::rank::fe::{
    validate_document, CorpusStats, GatherMap, HitDocument, HitError, HitStream, Prepared,
    QueryInfo, BM25F_B, BM25F_K1, BM25F_WEIGHTS, BM25_B, BM25_K1,
};

/// The most query terms the kernel takes (`FE_MAX_TERMS` in fe.cu: term sets are 64-bit masks,
/// per-term state lives in per-thread arrays of this size). Longer queries are
/// [`GpuError::TooLarge`], for the caller to run on the CPU.
pub const MAX_TERMS: u32 = 64;

/// Query-level values and constants as `fe_extract` takes them (`struct FeParams` in fe.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FeParams {
    idf_sum: f64,
    /// Per catalogue stream; 0 when `stats.avg_length` does not give it.
    avg_length: [f64; STREAMS.len()],
    bm25_k1: f64,
    bm25_b: f64,
    bm25f_k1: f64,
    bm25f_weight: [f64; STREAMS.len()],
    bm25f_b: [f64; STREAMS.len()],
    terms: u32,
    pub(super) n_docs: u32,
}

const _: () = assert!(std::mem::size_of::<FeParams>() == 136);

/// Why GPU feature extraction did not produce features.
#[derive(Debug, thiserror::Error)]
pub enum GpuFeError {
    /// The request is invalid: the CPU's validation error, the same one the CPU path reports.
    #[error(transparent)]
    Hits(#[from] HitError),
    /// The GPU failed or the batch does not fit it: run the batch on the CPU.
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

impl GpuFeError {
    /// As a [`GpuError`], for callers whose hit documents cannot be invalid (synthetic ones,
    /// timed for the crossover or a benchmark): an invalid batch becomes a failed one.
    pub fn into_gpu_error(self) -> GpuError {
        match self {
            GpuFeError::Gpu(err) => err,
            GpuFeError::Hits(err) => GpuError::BatchFailed {
                reason: err.to_string(),
            },
        }
    }
}

/// A batch of hit documents flattened for `fe_extract` (the layout is drawn in fe.cu): stream
/// `doc * 4 + slot` for each catalogue stream, its non-empty phrases, their hits; and, for
/// `fe_gather`, the ranker's gather codes and the documents' static features it reads.
///
/// The arrays lie in two buffers, each copied to the device in one piece: the 32-bit ones in
/// `words`, the f64 ones in `reals`, each array from a multiple of 128 bytes. Joined into
/// pinned memory when the caller has a [`PinnedPool`] with room (then the copy is one DMA
/// each), else on the heap.
pub struct FeLayout {
    /// The 32-bit arrays, at `word_arrays` ([`WordArray`]).
    pub(super) words: HostBuffer<u32>,
    pub(super) word_arrays: [Span; WORD_ARRAYS],
    /// The f64 arrays, at `real_arrays` ([`RealArray`]).
    pub(super) reals: HostBuffer<f64>,
    pub(super) real_arrays: [Span; REAL_ARRAYS],
    pub(super) params: FeParams,
    pub(super) n_statics: usize,
}

/// The 32-bit arrays of a [`FeLayout`], in their order in `words`.
#[derive(Debug, Clone, Copy)]
pub(super) enum WordArray {
    /// `[docs × 4 + 1]`: first phrase of each stream, then the phrase count.
    StreamPhrases,
    /// `[phrases + 1]`: first hit of each phrase, then the hit count.
    PhraseHits,
    /// `[hits × 2]`: term, position.
    Hits,
    /// `[docs × 4]`: each stream's length (0 for an absent stream).
    StreamLengths,
    /// `[width]`: the [`GatherMap`]'s codes, i32 as their bits (empty without a map).
    Codes,
}
pub(super) const WORD_ARRAYS: usize = 5;

/// The f64 arrays of a [`FeLayout`], in their order in `reals`.
#[derive(Debug, Clone, Copy)]
pub(super) enum RealArray {
    /// `[Q]`.
    Idf,
    /// `[docs × n_statics]`: each document's value of each of the map's static keys, NaN when
    /// absent (a missing value, as on the CPU).
    Statics,
}
pub(super) const REAL_ARRAYS: usize = 2;

/// Where an array lies in its buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Span {
    start: usize,
    len: usize,
}

impl Span {
    pub(super) fn range(self) -> Range<usize> {
        self.start..self.start + self.len
    }
}

/// Bytes each array of a layout starts on a multiple of: a copied buffer's arrays stay as
/// aligned on the device as separate allocations would be for the kernels' loads (hits are
/// read as `uint2`).
const ARRAY_ALIGN_BYTES: usize = 128;

/// The spans of arrays of `lens` values of `T` laid back to back, each aligned, and the
/// buffer's length.
fn spans<T, const N: usize>(lens: [usize; N]) -> ([Span; N], usize) {
    let align = ARRAY_ALIGN_BYTES / size_of::<T>();
    let mut end = 0;
    let spans = lens.map(|len| {
        let span = Span { start: end, len };
        end = (end + len).next_multiple_of(align);
        span
    });
    (spans, end)
}

/// `buf`'s arrays at `spans` (in order, not overlapping) as separate slices.
fn split_arrays<'a, T, const N: usize>(
    mut buf: &'a mut [T],
    spans: &[Span; N],
) -> [&'a mut [T]; N] {
    let mut taken = 0;
    spans.map(|span| {
        let (_, rest) = std::mem::take(&mut buf).split_at_mut(span.start - taken);
        let (array, rest) = rest.split_at_mut(span.len);
        buf = rest;
        taken = span.start + span.len;
        array
    })
}

impl std::fmt::Debug for FeLayout {
    /// The arrays by name (not the padding between them), `params` and `n_statics`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeLayout")
            .field("stream_phrases", &self.stream_phrases())
            .field("phrase_hits", &self.phrase_hits())
            .field("hits", &self.hits())
            .field("stream_lengths", &self.stream_lengths())
            .field("idf", &self.idf())
            .field("params", &self.params)
            .field("codes", &self.codes())
            .field("statics", &self.statics())
            .field("n_statics", &self.n_statics)
            .finish()
    }
}

/// `n` as one of the kernels' 32-bit indices or counts: [`GpuError::TooLarge`] (`what`) when it
/// does not fit.
pub(super) fn index32(n: usize, what: &'static str) -> Result<u32, GpuError> {
    u32::try_from(n).map_err(|_| GpuError::TooLarge {
        what,
        got: n,
        limit: u32::MAX as usize,
    })
}

/// Documents one rayon task validates and flattens at least before the parts are joined: as
/// small as the decoder's runs (`msgpack_rank`'s 64), so that 1 000 documents spread over 16
/// threads (at 256, over 4: 0.18 ms where the decoder's 16 runs take 0.10, H100 host).
const CHUNK_DOCS: usize = 64;

/// A run of consecutive documents of a batch laid out, its offsets relative to the run: the
/// end (not the start) of each stream's phrases and of each phrase's hits. Built a document at
/// a time ([`LayoutPart::push`]: a decoder lays out each document as it reads it), in parallel
/// with other runs, then joined in order into one [`FeLayout`] (`FeLayout::join`).
#[derive(Debug, Default)]
pub struct LayoutPart {
    stream_phrase_ends: Vec<u32>,
    phrase_hit_ends: Vec<u32>,
    hits: Vec<u32>,
    stream_lengths: Vec<u32>,
    statics: Vec<f64>,
}

/// Parts dropped, emptied, for the next batch's runs to reuse: a request's documents are laid
/// out in runs whose vectors grow to the run's size (a 10 000-document request on 16 threads:
/// about 70 KB of hits a run), and vectors allocated afresh for every request cost their
/// growth's copies and first touches each time, on every thread at once.
static SPARE_PARTS: Mutex<Vec<LayoutPart>> = Mutex::new(Vec::new());

/// The most parts kept, and the largest kept (bytes of its vectors' capacity): the spares stay
/// within a few tens of MB whatever the requests.
const SPARE_PARTS_MAX: usize = 32;
const SPARE_PART_MAX_BYTES: usize = 1 << 20;

impl Drop for LayoutPart {
    fn drop(&mut self) {
        let bytes = 4
            * (self.stream_phrase_ends.capacity()
                + self.phrase_hit_ends.capacity()
                + self.hits.capacity()
                + self.stream_lengths.capacity())
            + 8 * self.statics.capacity();
        if bytes == 0 || bytes > SPARE_PART_MAX_BYTES {
            return;
        }
        let mut spares = SPARE_PARTS.lock();
        if spares.len() < SPARE_PARTS_MAX {
            let mut part = LayoutPart::default();
            std::mem::swap(&mut part, self);
            part.stream_phrase_ends.clear();
            part.phrase_hit_ends.clear();
            part.hits.clear();
            part.stream_lengths.clear();
            part.statics.clear();
            spares.push(part);
        }
    }
}

impl LayoutPart {
    /// Room for `docs` documents with `n_statics` static features each (hits grow as they come),
    /// in a dropped part's vectors when one is spare.
    pub fn with_capacity(docs: usize, n_statics: usize) -> LayoutPart {
        let mut part = SPARE_PARTS.lock().pop().unwrap_or_default();
        part.stream_phrase_ends.reserve(docs * STREAMS.len());
        part.stream_lengths.reserve(docs * STREAMS.len());
        part.statics.reserve(docs * n_statics);
        part
    }

    /// Documents laid out.
    pub fn n_docs(&self) -> usize {
        self.stream_lengths.len() / STREAMS.len()
    }

    /// Validates `doc`, document `index` of the batch, by the CPU's rules for a query of `terms`
    /// terms, and appends it with its values of `static_keys`: `value(key)`, NaN when absent (a
    /// missing value, as on the CPU).
    ///
    /// # Errors
    /// [`GpuFeError::Hits`] (with `index`) for an invalid document; [`GpuError::TooLarge`] when
    /// the run overflows the kernel's 32-bit indices.
    pub fn push(
        &mut self,
        index: usize,
        doc: &HitDocument,
        terms: u32,
        static_keys: &[String],
        value: impl Fn(&str) -> Option<f64>,
    ) -> Result<(), GpuFeError> {
        validate_document(doc, terms).map_err(|e| e.at_index(index))?;
        let values = static_keys.iter().map(|key| value(key).unwrap_or(f64::NAN));
        Ok(self.push_valid(|slot| doc.streams.slot(slot), values)?)
    }

    /// Appends a valid document: its catalogue streams by slot (`None`: absent) and its values
    /// of the static keys.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when the run overflows the kernel's 32-bit indices.
    pub(crate) fn push_valid<'s>(
        &mut self,
        stream: impl Fn(usize) -> Option<&'s HitStream>,
        statics: impl IntoIterator<Item = f64>,
    ) -> Result<(), GpuError> {
        self.statics.extend(statics);
        for slot in 0..STREAMS.len() {
            let stream = stream(slot);
            self.stream_lengths.push(stream.map_or(0, |s| s.length));
            if let Some(stream) = stream {
                // The stream's hits are its phrases' one after the other, a few of them: copied
                // a hit at a time, inline (a call to copy them cost more).
                let start = self.hits.len() / 2;
                for hit in stream.phrases.hits() {
                    self.hits.extend_from_slice(hit);
                }
                index32(self.hits.len() / 2, "hits per batch")?;
                // Empty phrases (an end equal to the one before) count nowhere on the CPU:
                // they are left out.
                let mut last = 0;
                for &end in stream.phrases.ends() {
                    if end > last {
                        // Within the hits checked above.
                        self.phrase_hit_ends.push((start + end) as u32);
                        last = end;
                    }
                }
            }
            let end = index32(self.phrase_hit_ends.len(), "phrases per batch")?;
            self.stream_phrase_ends.push(end);
        }
        Ok(())
    }

    /// Validates and lays out `docs`, the documents from index `first` of the batch.
    fn build(
        first: usize,
        docs: &[HitDocument],
        terms: u32,
        static_keys: &[String],
    ) -> Result<LayoutPart, GpuFeError> {
        let mut part = LayoutPart::with_capacity(docs.len(), static_keys.len());
        for (i, doc) in docs.iter().enumerate() {
            let value = |key: &str| doc.static_features.get(key).copied();
            part.push(first + i, doc, terms, static_keys, value)?;
        }
        Ok(part)
    }
}

impl FeLayout {
    /// Validates the batch exactly as the CPU path does (query, statistics, then every document,
    /// reporting the lowest-index bad document with its index) and flattens it, chunks of
    /// documents in parallel on rayon's pool; with `gather`, the ranker's gather codes and the
    /// documents' static features go with it.
    ///
    /// # Errors
    /// [`GpuFeError::Hits`] for an invalid request; [`GpuError::TooLarge`] when the query has
    /// more than [`MAX_TERMS`] terms or the batch overflows the kernel's 32-bit indices.
    pub fn build(
        query: &QueryInfo,
        stats: &CorpusStats,
        docs: &[HitDocument],
        gather: Option<&GatherMap>,
    ) -> Result<FeLayout, GpuFeError> {
        let threads = rayon::current_num_threads();
        FeLayout::build_from(0, query, stats, docs, gather, threads, None)
    }

    /// [`FeLayout::build`] in layouts of at most `max_docs` documents each (a batch larger than
    /// one device batch holds runs as several), in order, each in parallel over at most
    /// `threads` of the current rayon pool, into `pinned` memory while the pool has room; an
    /// invalid document is reported with its index in `docs`, the lowest one, before any layout
    /// is returned.
    ///
    /// # Errors
    /// As [`FeLayout::build`].
    pub fn build_split(
        query: &QueryInfo,
        stats: &CorpusStats,
        docs: &[HitDocument],
        gather: Option<&GatherMap>,
        max_docs: usize,
        threads: usize,
        pinned: Option<&PinnedPool>,
    ) -> Result<Vec<FeLayout>, GpuFeError> {
        let max_docs = max_docs.max(1);
        if docs.is_empty() {
            return Ok(vec![FeLayout::build_from(
                0, query, stats, docs, gather, threads, pinned,
            )?]);
        }
        (docs.chunks(max_docs).enumerate())
            .map(|(c, part)| {
                FeLayout::build_from(c * max_docs, query, stats, part, gather, threads, pinned)
            })
            .collect()
    }

    /// [`FeLayout::build`] of `docs`, the documents from index `first` of the caller's batch, in
    /// parts of at least [`CHUNK_DOCS`] documents spread over at most `threads` (one: no part
    /// waits for another, which a busy pool needs to serve its tasks in order).
    fn build_from(
        first: usize,
        query: &QueryInfo,
        stats: &CorpusStats,
        docs: &[HitDocument],
        gather: Option<&GatherMap>,
        threads: usize,
        pinned: Option<&PinnedPool>,
    ) -> Result<FeLayout, GpuFeError> {
        let prepared = Prepared::new(query, stats)?;
        let static_keys = gather.map_or(&[][..], |g| &g.static_keys[..]);
        let part_docs = CHUNK_DOCS.max(docs.len().div_ceil(threads.max(1)));
        // Collected in part order, so the first error is the lowest-index document's.
        let parts: Vec<Result<LayoutPart, GpuFeError>> = docs
            .par_chunks(part_docs)
            .enumerate()
            .map(|(c, part)| {
                LayoutPart::build(first + c * part_docs, part, prepared.terms, static_keys)
            })
            .collect();
        let parts = parts.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(FeLayout::join(&prepared, gather, &parts, pinned)?)
    }

    /// The layout of a batch whose documents are `parts`, in order, each laid out with
    /// `gather`'s static keys (none without one), for the query `prepared`; the parts are
    /// joined in parallel on the current rayon pool, into `pinned` memory when there is a pool
    /// with room.
    ///
    /// # Errors
    /// [`GpuError::TooLarge`] when the query has more than [`MAX_TERMS`] terms or the batch
    /// overflows the kernel's 32-bit indices.
    pub(crate) fn join(
        prepared: &Prepared<'_>,
        gather: Option<&GatherMap>,
        parts: &[LayoutPart],
        pinned: Option<&PinnedPool>,
    ) -> Result<FeLayout, GpuError> {
        if prepared.terms > MAX_TERMS {
            return Err(GpuError::TooLarge {
                what: "query terms",
                got: prepared.terms as usize,
                limit: MAX_TERMS as usize,
            });
        }
        let n_statics = gather.map_or(0, |g| g.static_keys.len());
        let n_docs: usize = parts.iter().map(LayoutPart::n_docs).sum();
        let n_streams = n_docs * STREAMS.len();
        // The kernel numbers streams (threads) with 32-bit indices too.
        index32(n_streams + 1, "streams per batch")?;
        let n_phrases: usize = parts.iter().map(|p| p.phrase_hit_ends.len()).sum();
        let n_hit_words: usize = parts.iter().map(|p| p.hits.len()).sum();
        index32(n_phrases, "phrases per batch")?;
        index32(n_hit_words / 2, "hits per batch")?;
        let codes = gather.map_or(&[][..], |g| &g.codes[..]);
        let (word_arrays, n_words) = spans::<u32, WORD_ARRAYS>([
            n_streams + 1,
            n_phrases + 1,
            n_hit_words,
            n_streams,
            codes.len(),
        ]);
        let (real_arrays, n_reals) =
            spans::<f64, REAL_ARRAYS>([prepared.idf.len(), n_docs * n_statics]);
        let mut layout = FeLayout {
            words: HostBuffer::new(n_words, pinned),
            word_arrays,
            reals: HostBuffer::new(n_reals, pinned),
            real_arrays,
            params: FeParams {
                idf_sum: prepared.idf_sum,
                avg_length: prepared.avg_length.map(|a| a.unwrap_or(0.0)),
                bm25_k1: BM25_K1,
                bm25_b: BM25_B,
                bm25f_k1: BM25F_K1,
                bm25f_weight: BM25F_WEIGHTS,
                bm25f_b: BM25F_B,
                terms: prepared.terms,
                n_docs: index32(n_docs, "documents per batch")?,
            },
            n_statics,
        };
        // Pinned memory holds an earlier layout's values: every value of every array is written
        // below (the padding between them is never read).
        let [stream_phrases, phrase_hits, hits, stream_lengths, codes_out] =
            split_arrays(&mut layout.words, &word_arrays);
        let [idf, statics] = split_arrays(&mut layout.reals, &real_arrays);
        stream_phrases[0] = 0;
        phrase_hits[0] = 0;
        for (out, &code) in codes_out.iter_mut().zip(codes) {
            *out = code as u32;
        }
        idf.copy_from_slice(prepared.idf);
        // The parts are joined in parallel, each into its own slices of the arrays, as their
        // documents were walked (the H200 run of docs/benchmarks.md measured the whole layout,
        // 0.7-1.5 ms at 10 000 documents, not the join alone).
        let mut joins = Vec::with_capacity(parts.len());
        let mut rest = (
            &mut stream_phrases[1..],
            &mut phrase_hits[1..],
            hits,
            stream_lengths,
            statics,
        );
        let (mut phrase_base, mut hit_base) = (0u32, 0u32);
        for part in parts {
            let (stream_phrases, r0) = rest.0.split_at_mut(part.stream_phrase_ends.len());
            let (phrase_hits, r1) = rest.1.split_at_mut(part.phrase_hit_ends.len());
            let (hits, r2) = rest.2.split_at_mut(part.hits.len());
            let (stream_lengths, r3) = rest.3.split_at_mut(part.stream_lengths.len());
            let (statics, r4) = rest.4.split_at_mut(part.statics.len());
            rest = (r0, r1, r2, r3, r4);
            let slices = (stream_phrases, phrase_hits, hits, stream_lengths, statics);
            joins.push((part, phrase_base, hit_base, slices));
            // Both bases stay within the totals checked above.
            phrase_base += part.phrase_hit_ends.len() as u32;
            hit_base += (part.hits.len() / 2) as u32;
        }
        joins
            .into_par_iter()
            .for_each(|(part, phrase_base, hit_base, slices)| {
                let (stream_phrases, phrase_hits, hits, stream_lengths, statics) = slices;
                for (d, &e) in stream_phrases.iter_mut().zip(&part.stream_phrase_ends) {
                    *d = e + phrase_base;
                }
                for (d, &e) in phrase_hits.iter_mut().zip(&part.phrase_hit_ends) {
                    *d = e + hit_base;
                }
                hits.copy_from_slice(&part.hits);
                stream_lengths.copy_from_slice(&part.stream_lengths);
                statics.copy_from_slice(&part.statics);
            });
        Ok(layout)
    }

    /// Documents in the batch.
    pub fn n_docs(&self) -> usize {
        self.params.n_docs as usize
    }

    /// Hits in the batch (catalogue streams only).
    pub fn n_hits(&self) -> usize {
        self.hits().len() / 2
    }

    fn words(&self, array: WordArray) -> &[u32] {
        &self.words[self.word_arrays[array as usize].range()]
    }

    fn reals(&self, array: RealArray) -> &[f64] {
        &self.reals[self.real_arrays[array as usize].range()]
    }

    fn stream_phrases(&self) -> &[u32] {
        self.words(WordArray::StreamPhrases)
    }

    fn phrase_hits(&self) -> &[u32] {
        self.words(WordArray::PhraseHits)
    }

    fn hits(&self) -> &[u32] {
        self.words(WordArray::Hits)
    }

    fn stream_lengths(&self) -> &[u32] {
        self.words(WordArray::StreamLengths)
    }

    fn codes(&self) -> &[u32] {
        self.words(WordArray::Codes)
    }

    fn idf(&self) -> &[f64] {
        self.reals(RealArray::Idf)
    }

    fn statics(&self) -> &[f64] {
        self.reals(RealArray::Statics)
    }

    /// Whether the layout lies in pinned memory (copied to a device by DMA).
    pub fn is_pinned(&self) -> bool {
        matches!(self.words, HostBuffer::Pinned(_))
    }

    /// Features per document `fe_gather` writes (the gather map's width; 0 without one).
    pub fn width(&self) -> usize {
        self.codes().len()
    }

    /// Bytes copied to the device for this batch (the arrays and the padding between them).
    pub fn upload_bytes(&self) -> usize {
        4 * self.words.len() + 8 * self.reals.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::rank::fe::{feature_names, FeatureResolver, HitStream};

    fn stream(length: u32, phrases: &[&[[u32; 2]]]) -> HitStream {
        HitStream::new(length, phrases)
    }

    fn doc(streams: &[(&str, HitStream)]) -> HitDocument {
        HitDocument {
            id: None,
            streams: streams
                .iter()
                .map(|(n, s)| (n.to_string(), s.clone()))
                .collect(),
            static_features: BTreeMap::new(),
        }
    }

    fn query(q: u32) -> QueryInfo {
        QueryInfo {
            terms: q,
            idf: (1..=q).map(f64::from).collect(),
        }
    }

    #[test]
    fn layout_flattens_catalogue_streams_in_slot_order() {
        let docs = [
            doc(&[
                // Name order puts url before title; the layout keeps catalogue order.
                ("url", stream(3, &[&[[1, 2]]])),
                ("title", stream(9, &[&[[0, 1], [1, 2]], &[], &[[0, 5]]])),
                ("anchor", stream(7, &[])),
                ("headings", stream(4, &[&[[0, 0]]])),
            ]),
            doc(&[]),
            doc(&[("body", stream(30, &[&[], &[[2, 20]]]))]),
        ];
        let stats = CorpusStats {
            avg_length: [("body".to_string(), 402.0)].into(),
        };
        let layout = FeLayout::build(&query(3), &stats, &docs, None).expect("valid");
        assert_eq!(layout.n_docs(), 3);
        assert_eq!(layout.n_hits(), 5);
        // Streams: title, body, anchor, url of each document.
        assert_eq!(
            layout.stream_lengths(),
            [9, 0, 7, 3, 0, 0, 0, 0, 0, 30, 0, 0]
        );
        assert_eq!(
            layout.stream_phrases(),
            [0, 2, 2, 2, 3, 3, 3, 3, 3, 3, 4, 4, 4]
        );
        // Empty phrases are dropped; the headings stream is not in the layout.
        assert_eq!(layout.phrase_hits(), [0, 2, 3, 4, 5]);
        assert_eq!(layout.hits(), [0, 1, 1, 2, 0, 5, 1, 2, 2, 20]);
        assert_eq!(layout.idf(), [1.0, 2.0, 3.0]);
        assert_eq!(layout.params.idf_sum, 6.0);
        assert_eq!(layout.params.avg_length, [0.0, 402.0, 0.0, 0.0]);
        assert_eq!(
            (layout.params.terms, layout.params.bm25f_weight),
            (3, BM25F_WEIGHTS)
        );
        // Each array from a multiple of 128 bytes: 32 words, 16 reals.
        assert_eq!(layout.upload_bytes(), 4 * (32 * 4) + 8 * 16);
    }

    #[test]
    fn empty_batch_has_one_offset_each() {
        let layout = FeLayout::build(&query(2), &CorpusStats::default(), &[], None).expect("valid");
        assert_eq!(layout.n_docs(), 0);
        assert_eq!(layout.stream_phrases(), [0]);
        assert_eq!(layout.phrase_hits(), [0]);
        assert!(layout.hits().is_empty() && layout.stream_lengths().is_empty());
    }

    #[test]
    fn validation_reports_the_cpu_paths_error() {
        let bad_headings = stream(2, &[&[[0, 5]]]);
        let bad_body = stream(10, &[&[[0, 4], [1, 3]]]);
        let mut docs = vec![doc(&[]); 40];
        // Document 7 is bad in a catalogue stream and, later in name order, outside it: the CPU
        // walk reports the stream outside the catalogue first. Document 31 is bad too.
        docs[7] = doc(&[("body", bad_body.clone()), ("headings", bad_headings)]);
        docs[31] = doc(&[("body", bad_body)]);
        let resolver = FeatureResolver::new(feature_names()).expect("catalogue");
        let mut out = vec![0.0; docs.len() * resolver.len()];
        let cpu = resolver
            .extract_batch(&query(2), &CorpusStats::default(), &docs, &mut out, 4)
            .unwrap_err();
        let gpu = FeLayout::build(&query(2), &CorpusStats::default(), &docs, None).unwrap_err();
        assert_eq!(gpu.to_string(), cpu.to_string());
        assert!(
            gpu.to_string().starts_with("document 7, streams.headings"),
            "{gpu}"
        );
        let bad_query = QueryInfo {
            terms: 2,
            idf: vec![1.0],
        };
        assert_eq!(
            FeLayout::build(&bad_query, &CorpusStats::default(), &docs, None)
                .unwrap_err()
                .to_string(),
            "query.idf has 1 values, expected 2 (query.terms)"
        );
    }

    /// With a gather map, the layout carries its codes and each document's static values (NaN
    /// where absent); a batch split in layouts reports a bad document by its index in the whole
    /// batch, and the layouts together hold the batch.
    #[test]
    fn gather_statics_and_split_layouts() {
        let names: Vec<String> = ["static.rank", "doc.bm25f", "static.spam"]
            .map(String::from)
            .to_vec();
        let map = FeatureResolver::new(&names).unwrap().gather_map();
        let mut docs = vec![doc(&[("body", stream(10, &[&[[0, 1]]]))]); 5];
        docs[1].static_features.insert("rank".into(), 0.25);
        docs[4].static_features.insert("spam".into(), -1.0);
        let layout =
            FeLayout::build(&query(1), &CorpusStats::default(), &docs, Some(&map)).expect("valid");
        assert_eq!((layout.width(), layout.n_statics), (3, 2));
        assert_eq!(
            layout.codes(),
            map.codes.iter().map(|&c| c as u32).collect::<Vec<_>>()
        );
        let statics: Vec<Option<f64>> = (layout.statics().iter())
            .map(|v| (!v.is_nan()).then_some(*v))
            .collect();
        let (n, r, s) = (None, Some(0.25), Some(-1.0));
        assert_eq!(statics, [n, n, r, n, n, n, n, n, n, s]);

        let split = FeLayout::build_split(
            &query(1),
            &CorpusStats::default(),
            &docs,
            Some(&map),
            2,
            4,
            None,
        )
        .expect("valid");
        assert_eq!(
            split.iter().map(FeLayout::n_docs).collect::<Vec<_>>(),
            [2, 2, 1]
        );
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(split[2].statics()), bits(&layout.statics()[8..]));
        let empty =
            FeLayout::build_split(&query(1), &CorpusStats::default(), &[], None, 2, 4, None);
        assert_eq!(empty.expect("valid").len(), 1);
        docs[3] = doc(&[("body", stream(10, &[&[[0, 4], [0, 3]]]))]);
        let err =
            FeLayout::build_split(&query(1), &CorpusStats::default(), &docs, None, 2, 4, None)
                .unwrap_err();
        assert!(err.to_string().starts_with("document 3, "), "{err}");
    }

    /// A batch of several parts (more than `CHUNK_DOCS` documents) is the documents' own
    /// layouts one after another, offsets moved along.
    #[test]
    fn parts_join_into_the_documents_layouts_in_order() {
        let names: Vec<String> = ["static.static_rank", "doc.bm25f"]
            .map(String::from)
            .to_vec();
        let map = FeatureResolver::new(&names).unwrap().gather_map();
        let docs = crate::rank::fe::synth_hit_documents(3 * CHUNK_DOCS + 17, 3, 9);
        let (q, stats) = (query(3), CorpusStats::default());
        let whole = FeLayout::build(&q, &stats, &docs, Some(&map)).expect("valid");
        let ones = FeLayout::build_split(&q, &stats, &docs, Some(&map), 1, 4, None).expect("valid");
        let (mut phrases, mut hits) = (0u32, 0u32);
        for (d, one) in ones.iter().enumerate() {
            let streams = d * STREAMS.len()..(d + 1) * STREAMS.len();
            let moved = |v: &[u32], by: u32| v.iter().map(|&e| e + by).collect::<Vec<_>>();
            assert_eq!(
                whole.stream_phrases()[streams.start..=streams.end],
                moved(one.stream_phrases(), phrases)
            );
            assert_eq!(whole.stream_lengths()[streams], one.stream_lengths()[..]);
            let n_phrases = one.phrase_hits().len() as u32 - 1;
            let ph = phrases as usize..=(phrases + n_phrases) as usize;
            assert_eq!(whole.phrase_hits()[ph], moved(one.phrase_hits(), hits));
            let n_hits = one.n_hits() as u32;
            let words = 2 * hits as usize..2 * (hits + n_hits) as usize;
            assert_eq!(whole.hits()[words], one.hits()[..]);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&whole.statics()[d..d + 1]), bits(one.statics()));
            (phrases, hits) = (phrases + n_phrases, hits + n_hits);
        }
        assert_eq!(
            (whole.phrase_hits().len() as u32 - 1, whole.n_hits() as u32),
            (phrases, hits)
        );
    }

    #[test]
    fn queries_longer_than_the_kernel_takes_are_too_large() {
        let docs = [doc(&[("body", stream(100, &[&[[63, 0], [0, 99]]]))])];
        assert!(FeLayout::build(&query(MAX_TERMS), &CorpusStats::default(), &docs, None).is_ok());
        let err = FeLayout::build(&query(MAX_TERMS + 1), &CorpusStats::default(), &docs, None)
            .unwrap_err();
        assert!(
            matches!(
                err,
                GpuFeError::Gpu(GpuError::TooLarge {
                    what: "query terms",
                    got: 65,
                    limit: 64
                })
            ),
            "{err}"
        );
    }
}
