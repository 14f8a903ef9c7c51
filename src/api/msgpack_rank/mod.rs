//! A hand-written MessagePack reader for [`RankRequest`], the one body that is large on the
//! hot path.
//!
//! Why: decoding a 1 000-document medium request (222 KB) with rmp-serde took about 0.79 ms
//! on the 2-core dev machine (282 MB/s), and perf put about 40 % of it in rmp-serde's generic
//! visitor machinery, 10 % in its reader's buffer copies and 7 % in UTF-8 checks of field
//! names. This reader matches bytes on the slice directly and decodes that request in 0.47 ms
//! against rmp-serde's 0.83 ms in the same interleaved runs (`docs/benchmarks-history.md`, "Request
//! decoding (dev machine)").
//!
//! The fallback contract: [`decode`] returns `None` on anything it does not handle or that is
//! malformed (an unknown or duplicate field, a wrong type, an ext type, a struct given as an
//! array, a string in `bin` form, invalid UTF-8, trailing bytes, …), and the caller then
//! decodes the body with rmp-serde as before, so every error message stays rmp-serde's. On
//! what it accepts it builds exactly the value rmp-serde builds: it mirrors the serde
//! attributes of the wire types (`deny_unknown_fields`, defaults, `rename = "static"`, the
//! untagged [`FeatureValues`], a repeated map key keeping its last value, a repeated struct
//! field being an error) and serde's number conversions (any integer or float into `f64` by
//! `as`; into unsigned fields only integers in range).
//!
//! The entry points ([`decode`], [`frame`] and [`Framed`]) are here; the low-level reader of
//! values and request fields in `reader`, and the documents in parallel (the parallel decode,
//! the framing walks, the guess of where the fields after the documents start) in `parallel`.
//!
//! [`FeatureValues`]: super::FeatureValues

mod parallel;
mod reader;

use bytes::Bytes;
use rayon::prelude::*;

use self::parallel::{chain_walks, frame_in_parallel, guess_document_start, guess_tail};
use self::reader::{catalogue_slot, is_utf8, HitSink, Reader, StreamCheck};
use super::RankRequest;
use crate::gpu::pinned::PinnedPool;
use crate::gpu::GpuError;
use crate::rank::fe::{
    fill_rows_in_chunks, FeError, FeatureResolver, GatherMap, HitDocument, HitStream, Prepared,
    STREAMS,
};
use crate::rank::gpu::layout::{FeLayout, LayoutPart};

/// The body is one the fast reader leaves to rmp-serde.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unhandled;

type Read<T> = Result<T, Unhandled>;

/// Decodes a MessagePack [`RankRequest`] that fills `bytes` exactly; `None` when the body is
/// malformed or of a form this reader leaves to rmp-serde.
pub fn decode(bytes: &[u8]) -> Option<RankRequest> {
    // With two threads the parallel decode measured slower than one task (0.66 vs 0.47 ms for
    // 1 000 documents on the development machine), with sixteen 40 % faster (the H100 host).
    let min_task = if rayon::current_num_threads() >= MIN_THREADS {
        MIN_DOCUMENTS_PER_TASK
    } else {
        usize::MAX
    };
    decode_in_tasks(bytes, min_task)
}

/// Fewest threads in rayon's pool for which documents are decoded in parallel.
const MIN_THREADS: usize = 4;

/// Documents per parallel decoding task, at least: a hit document decodes in about 0.5–1 µs
/// and a hand-off to rayon's pool costs a few.
const MIN_DOCUMENTS_PER_TASK: usize = 64;

/// [`decode`], spreading the documents over rayon's pool in tasks of at least `min_task`
/// documents; `usize::MAX` decodes on the calling thread (for tests, which reach the parallel
/// path with small requests, and `benches/request_decode.rs`).
pub fn decode_in_tasks(bytes: &[u8], min_task: usize) -> Option<RankRequest> {
    let mut reader = Reader {
        bytes,
        pos: 0,
        min_task: min_task.max(1),
    };
    let request = reader.rank_request(|r, _| r.documents()).ok()?;
    (reader.pos == bytes.len()).then_some(request)
}

/// A MessagePack `/v1/rank` body read but for its documents: every other field decoded, and
/// (once [`Framed::frame_documents`] has run) where each document lies in the body.
/// [`Framed::feature_matrix`] then decodes the documents straight into the feature matrix,
/// running feature extraction on each hit document as it is read, without building a
/// [`RankDocument`] per document.
///
/// [`RankDocument`]: super::RankDocument
#[derive(Debug)]
pub struct Framed {
    /// Every field of the request; `documents` is empty.
    pub head: RankRequest,
    body: Bytes,
    /// Where the first document starts, and how many the array announces.
    first: usize,
    len: usize,
    /// Where the documents end, as the head's reading assumed (see [`frame`]).
    end: usize,
    /// Where each document starts, then where the last one ends; empty until framed.
    bounds: Vec<usize>,
}

/// Reads a MessagePack [`RankRequest`] that fills `body` exactly but for its documents: every
/// other field decoded; the documents are framed later, by [`Framed::frame_documents`].
/// `None` where [`decode`] would also give `None` (a malformed body, or one left to rmp-serde),
/// and where the fields after `documents` are not found (below).
///
/// Where the documents end is only known by walking them, and the fields a handler needs first
/// (`backend`, `timeout_ms`, `k`, `query`, …) usually follow them, so the fields after the
/// documents are found from the body's end instead ([`guess_tail`]): the walk, 222 KB for 1 000
/// hit documents, then runs in parallel on the CPU pool with feature extraction rather than on
/// the async worker that read the body (`docs/benchmarks-history.md`, issue 3). The guess is checked by
/// that walk: where the documents do not end where it assumed, [`Framed::frame_documents`]
/// says so and the caller decodes the body in full.
pub fn frame(body: Bytes) -> Option<Framed> {
    let mut reader = Reader {
        bytes: &body,
        pos: 0,
        min_task: usize::MAX,
    };
    let mut documents = None;
    let head = reader
        .rank_request(|r, after| {
            let len = r.documents_len()?;
            let first = r.pos;
            r.pos = guess_tail(r.bytes, first, after).ok_or(Unhandled)?;
            documents = Some((first, len, r.pos));
            Ok(Vec::new())
        })
        .ok()?;
    let (first, len, end) = documents?;
    (reader.pos == body.len()).then_some(Framed {
        head,
        body,
        first,
        len,
        end,
        bounds: Vec::new(),
    })
}

/// [`frame`] and [`Framed::frame_documents`] in a row, by parallel walks of at least
/// `min_task` documents' worth of bytes each (`usize::MAX`: on the calling thread); `None`
/// where either fails.
pub fn frame_in_tasks(body: Bytes, min_task: usize) -> Option<Framed> {
    let mut framed = frame(body)?;
    (framed.frame_documents_in_tasks(min_task, rayon::current_num_threads())).then_some(framed)
}

/// The fewest bytes a document that gives `features` or `hits` takes: a map marker, the key
/// `hits` (five bytes) and an empty map.
const MIN_DOCUMENT_BYTES: usize = 7;

/// Documents per task of [`Framed::feature_matrix`], at least: the hand-off to rayon's pool
/// costs a few µs, a hit document's decode and FE about 1 µs.
const MIN_FUSED_CHUNK: usize = 64;

impl Framed {
    /// The request's documents.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Finds where each document starts, in parallel on the current rayon pool over at most
    /// `threads` walks (the caller's walk is the true one, helpers' walks from guessed starts
    /// shorten it: see [`frame_in_parallel`]). `false` when the documents do not frame or do
    /// not end where [`frame`]'s reading of the fields after them assumed: the head may then be
    /// wrong, and the body must be decoded in full.
    pub fn frame_documents(&mut self, threads: usize) -> bool {
        self.frame_documents_in_tasks(MIN_DOCUMENTS_PER_TASK, threads)
    }

    fn frame_documents_in_tasks(&mut self, min_task: usize, threads: usize) -> bool {
        if !self.bounds.is_empty() {
            return true;
        }
        let tasks = (self.len / min_task.max(1)).min(threads);
        let bounds = match tasks >= 2 {
            true => frame_in_parallel(&self.body, self.first, self.len, tasks),
            // No helpers: the true walk alone.
            false => chain_walks(&self.body, self.first, self.len, usize::MAX, &[]),
        };
        match bounds {
            Ok(bounds) if bounds.last() == Some(&self.end) => {
                self.bounds = bounds;
                true
            }
            _ => false,
        }
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole body, as it was read.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The documents as one row-major `documents × fe.len()` feature matrix (`fe` being the
    /// ranker's feature map bound to FE, or why it cannot be), decoded and extracted in one
    /// pass: contiguous chunks of documents on rayon's pool (`threads` of them, of at least 64
    /// documents), each read from the body into buffers reused from document to document
    /// (a feature vector into its row, hits into one [`HitDocument`] that FE reads at once).
    ///
    /// `None` on any document that is malformed, that this reader leaves to rmp-serde, that
    /// gives its features by name, or that the full path would refuse (a wrong vector length,
    /// hits without `query` and `stats`, an invalid hit, a ranker FE cannot serve): the caller
    /// then decodes the body in full and builds the matrix from the decoded request, which
    /// gives the same error as before. Where it answers, the matrix is bit for bit the one
    /// built from the decoded request.
    pub fn feature_matrix(
        &self,
        fe: Result<&FeatureResolver, &FeError>,
        width: usize,
        threads: usize,
    ) -> Option<Vec<f64>> {
        if width == 0 {
            // Rows of nothing: the documents would go unread. The full path validates them.
            return None;
        }
        let bounds = self.sized_bounds()?;
        let hits = Fused {
            resolver: fe.ok(),
            query: match (&self.head.query, &self.head.stats) {
                (Some(query), Some(stats)) => Prepared::new(query, stats).ok(),
                _ => None,
            },
        };
        // Every value is overwritten: the initial zeros are written in parallel, `threads`
        // tasks, rather than by one thread before the tasks start.
        let len = self.len() * width;
        let mut matrix = Vec::new();
        rayon::iter::repeat_n(0.0, len)
            .with_min_len(len.div_ceil(threads.max(1)))
            .collect_into_vec(&mut matrix);
        fill_rows_in_chunks(
            &bounds[..self.len()],
            &mut matrix,
            width,
            threads,
            MIN_FUSED_CHUNK,
            |first, starts, rows| {
                let mut reader = Reader {
                    bytes: &self.body,
                    pos: 0,
                    min_task: usize::MAX,
                };
                let mut buffers = DocumentBuffers::default();
                for (i, (&start, row)) in starts.iter().zip(rows.chunks_mut(width)).enumerate() {
                    reader.pos = start;
                    reader.document_row(&hits, &mut buffers, row)?;
                    if reader.pos != bounds[first + i + 1] {
                        return Err(Unhandled);
                    }
                }
                Ok(())
            },
        )
        .ok()?;
        Some(matrix)
    }
    /// The documents laid out for the fused device path: [`FeLayout`]s of at most `max_docs`
    /// documents each, with `gather`'s static features, decoded, validated and laid out in one
    /// pass. Contiguous runs of documents go to rayon's pool (`threads` of them, of at least 64
    /// documents), each read into one reused [`HitDocument`] and appended to its run's
    /// [`LayoutPart`] at once: no tree per document is built, and none is walked again.
    ///
    /// A body not yet framed ([`Framed::frame_documents`]) is not framed first, when its
    /// documents fit one layout: each run starts where a guess puts a document's start in its
    /// share of the bytes (as the framing walks do), and runs are chained from the first
    /// document, a run whose start the run before does not end at read again from there. The
    /// documents are then read once instead of twice (a walk to frame them, then the decode).
    ///
    /// `None` where the full path must decide (it then gives today's answer, or today's
    /// error): no documents, a document that gives a feature vector, is malformed or left to
    /// rmp-serde, or is invalid; no `query` or `stats`, or invalid ones; documents that do not
    /// end where the fields after them were read to start; more than `max_docs` documents not
    /// framed. `Some(Err)` when the batch is over the FE kernel's limits (a query of more than
    /// [`MAX_TERMS`](crate::rank::gpu::layout::MAX_TERMS) terms): work for the CPU. The layouts
    /// are joined into `pinned` memory while the pool has room.
    pub fn fe_layouts(
        &self,
        gather: &GatherMap,
        max_docs: usize,
        threads: usize,
        pinned: Option<&PinnedPool>,
    ) -> Option<Result<Vec<FeLayout>, GpuError>> {
        self.fe_layouts_in_tasks(gather, max_docs, threads, MIN_FUSED_CHUNK, pinned)
    }

    /// [`Framed::fe_layouts`] in runs of at least `min_run` documents (tests reach many runs
    /// with small requests).
    fn fe_layouts_in_tasks(
        &self,
        gather: &GatherMap,
        max_docs: usize,
        threads: usize,
        min_run: usize,
        pinned: Option<&PinnedPool>,
    ) -> Option<Result<Vec<FeLayout>, GpuError>> {
        let (Some(query), Some(stats)) = (&self.head.query, &self.head.stats) else {
            return None;
        };
        let prepared = Prepared::new(query, stats).ok()?;
        let reading = Reading {
            terms: prepared.terms,
            static_keys: &gather.static_keys,
        };
        let (threads, min_run, max_docs) = (threads.max(1), min_run.max(1), max_docs.max(1));
        if self.is_empty() || (self.bounds.is_empty() && self.len() > max_docs) {
            return None;
        }
        if self.bounds.is_empty() {
            let runs = (self.len() / min_run).clamp(1, threads);
            let parts = self.lay_out_unframed(&reading, runs)?;
            return Some(FeLayout::join(&prepared, Some(gather), &parts, pinned).map(|l| vec![l]));
        }
        let bounds = self.sized_bounds()?;
        let mut layouts = Vec::with_capacity(self.len().div_ceil(max_docs));
        for (c, batch) in bounds[..self.len()].chunks(max_docs).enumerate() {
            let run = batch.len().div_ceil(threads).max(min_run);
            let parts: Vec<Read<LaidOut>> = (batch.par_chunks(run).enumerate())
                .map(|(r, starts)| {
                    let first = c * max_docs + r * run;
                    let ends = &bounds[first + 1..first + 1 + starts.len()];
                    let to = *ends.last().expect("a run has documents");
                    self.lay_out_run(starts[0], to, starts.len(), Some(ends), &reading)
                })
                .collect();
            let parts = parts.into_iter().collect::<Read<Vec<_>>>().ok()?;
            let parts: Vec<LayoutPart> = parts.into_iter().map(|run| run.part).collect();
            match FeLayout::join(&prepared, Some(gather), &parts, pinned) {
                Ok(layout) => layouts.push(layout),
                Err(err) => return Some(Err(err)),
            }
        }
        Some(Ok(layouts))
    }

    /// The documents of a body not framed, laid out in `runs` parts (see
    /// [`Framed::fe_layouts`]); `None` where a document does not lay out, or the documents are
    /// not `len` ending where the fields after them start.
    fn lay_out_unframed(&self, reading: &Reading<'_>, runs: usize) -> Option<Vec<LayoutPart>> {
        let (first, end, len) = (self.first, self.end, self.len());
        let share = (end - first).div_ceil(runs).max(1);
        let share_end = |run: usize| first.saturating_add(share.saturating_mul(run + 1)).min(end);
        let guessed: Vec<Option<LaidOut>> = (0..runs)
            .into_par_iter()
            .map(|run| {
                let start = match run {
                    0 => first,
                    _ => guess_document_start(&self.body, first + run * share, share_end(run))?,
                };
                self.lay_out_run(start, share_end(run), len, None, reading)
                    .ok()
            })
            .collect();
        let (mut next, mut docs) = (first, 0);
        let mut parts = Vec::with_capacity(runs);
        for (run, laid_out) in guessed.into_iter().enumerate() {
            let laid_out = match laid_out {
                Some(laid_out) if laid_out.start == next => laid_out,
                // A wrong guess, or a walk that failed from one: the share again from the true
                // start (a failure there is the body's).
                _ => (self.lay_out_run(next, share_end(run), len - docs, None, reading)).ok()?,
            };
            docs += laid_out.docs;
            next = laid_out.next;
            parts.push(laid_out.part);
        }
        (docs == len && next == end).then_some(parts)
    }

    /// Lays out the documents from `start` on, one after the other, while the next one starts
    /// before `to` and fewer than `max` were read; with `ends`, document `i` must end at
    /// `ends[i]` (where framing put the next one's start).
    fn lay_out_run(
        &self,
        start: usize,
        to: usize,
        max: usize,
        ends: Option<&[usize]>,
        reading: &Reading<'_>,
    ) -> Read<LaidOut> {
        let mut reader = Reader {
            bytes: &self.body,
            pos: start,
            min_task: usize::MAX,
        };
        // Room for the documents the run's bytes hold at this body's mean document size.
        let mean = ((self.end - self.first) / self.len.max(1)).max(MIN_DOCUMENT_BYTES);
        let room = max.min((to.saturating_sub(start)).div_ceil(mean) + 1);
        let mut sink = LayoutSink::new(
            LayoutPart::with_capacity(room, reading.static_keys.len()),
            reading,
        );
        let mut docs = 0;
        while reader.pos < to && docs < max {
            // A feature vector is the rows path's.
            (reader.framed_document(|_| Err(Unhandled), |r| r.hit_document_into(&mut sink)))?;
            if ends.is_some_and(|ends| ends[docs] != reader.pos) {
                return Err(Unhandled);
            }
            sink.push_document()?;
            docs += 1;
        }
        Ok(LaidOut {
            start,
            next: reader.pos,
            docs,
            part: sink.part,
        })
    }

    /// Where each document starts, then where the last one ends, once framed; `None` before,
    /// and when a document is too short to hold `features` or `hits`: the full path refuses
    /// it after checking every document, and a body of one-byte documents must not size a row
    /// (or a layout) for each first.
    fn sized_bounds(&self) -> Option<&[usize]> {
        let short = |d: &[usize]| d[1] - d[0] < MIN_DOCUMENT_BYTES;
        (!self.bounds.is_empty() && !self.bounds.windows(2).any(short)).then_some(&self.bounds)
    }
}

/// What laying out a document needs of the request and the ranker.
struct Reading<'a> {
    /// The query's terms (hits name terms below it).
    terms: u32,
    /// The static features the ranker reads, in its gather map's order.
    static_keys: &'a [String],
}

/// A run's layout as its documents are read: a document's catalogue streams wait by slot and
/// its static features by key until it is read whole, then it is appended to the run's part
/// (the layout has streams in catalogue order, the wire any order). Hits are checked as they
/// are read: an invalid document is the full path's.
struct LayoutSink<'r> {
    part: LayoutPart,
    /// The document's catalogue streams by slot; an absent one is empty, as it lays out.
    streams: [HitStream; STREAMS.len()],
    /// A stream outside the catalogue, read to be checked only.
    other: HitStream,
    /// The document's value of each of `reading.static_keys`, NaN when absent.
    statics: Vec<f64>,
    reading: &'r Reading<'r>,
}

impl<'r> LayoutSink<'r> {
    fn new(part: LayoutPart, reading: &'r Reading<'r>) -> Self {
        LayoutSink {
            part,
            streams: Default::default(),
            other: HitStream::default(),
            statics: vec![f64::NAN; reading.static_keys.len()],
            reading,
        }
    }

    /// Appends the document read to the part.
    fn push_document(&mut self) -> Read<()> {
        let statics = self.statics.iter().copied();
        (self
            .part
            .push_valid(|slot| Some(&self.streams[slot]), statics))
        .map_err(|_| Unhandled)
    }
}

impl<'a> HitSink<'a> for LayoutSink<'_> {
    fn clear(&mut self) {
        for stream in &mut self.streams {
            stream.length = 0;
            stream.phrases.clear();
        }
        self.statics.fill(f64::NAN);
    }

    #[inline]
    fn id(&mut self, id: Option<&'a [u8]>) -> Read<()> {
        match id.is_none_or(is_utf8) {
            true => Ok(()),
            false => Err(Unhandled),
        }
    }

    #[inline]
    fn stream(&mut self, name: &'a [u8]) -> Read<&mut HitStream> {
        match catalogue_slot(name) {
            Some(slot) => Ok(&mut self.streams[slot]),
            None if is_utf8(name) => Ok(&mut self.other),
            None => Err(Unhandled),
        }
    }

    #[inline]
    fn stream_read(&mut self, check: StreamCheck) -> Read<()> {
        match check.is_valid(self.reading.terms) {
            true => Ok(()),
            false => Err(Unhandled),
        }
    }

    /// A repeated name keeps its last value, as in the decoded map.
    #[inline]
    fn static_feature(&mut self, name: &'a [u8], value: f64) -> Read<()> {
        let keys = self.reading.static_keys;
        match keys.iter().position(|key| key.as_bytes() == name) {
            Some(k) => self.statics[k] = value,
            None if is_utf8(name) => {}
            None => return Err(Unhandled),
        }
        Ok(())
    }
}

/// A run of consecutive documents laid out by one task.
struct LaidOut {
    /// Where its first document starts, and where the one after its last starts.
    start: usize,
    next: usize,
    docs: usize,
    part: LayoutPart,
}

/// Which of `features` and `hits` a framed document gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Given {
    Features,
    Hits,
}

/// What the fused decode needs to extract a hit document's features.
struct Fused<'r> {
    /// `None` when the ranker takes feature vectors only.
    resolver: Option<&'r FeatureResolver>,
    /// `None` when the request lacks `query` or `stats`, or they are invalid.
    query: Option<Prepared<'r>>,
}

/// Buffers one task of [`Framed::feature_matrix`] reuses from document to document.
#[derive(Default)]
struct DocumentBuffers<'a> {
    hits: HitDocument,
    /// The document's static features, names borrowed from the body.
    statics: Vec<(&'a str, f64)>,
    /// Streams of earlier documents, kept for their vectors.
    spare: Vec<HitStream>,
}

impl DocumentBuffers<'_> {
    /// The document's static feature `name`: the last value given, as in the decoded map.
    fn static_value(&self, name: &str) -> Option<f64> {
        (self.statics.iter().rev())
            .find(|(given, _)| *given == name)
            .map(|&(_, value)| value)
    }
}

#[cfg(test)]
mod tests;
