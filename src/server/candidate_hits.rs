//! The candidates of a ranked `/v1/search` as the ranking engine's row source
//! ([`CandidateHits`], a [`RowSource`]): each candidate's hits are read from the forward index
//! straight into what feature extraction reads — a hit document reused from candidate to
//! candidate, FE'd at once on the CPU pool, or the fused device path's [`LayoutPart`]s — and
//! no hit document is built per candidate (issue 20 item 1; `/v1/rank`'s MessagePack body does
//! the same from its bytes, `api::msgpack_rank`).
//!
//! The hit requests are DESIGN §5's: Q is the number of distinct terms, in first-occurrence
//! order (selection's order), idf is BM25's (a term not in the index has df 0), the average
//! lengths are the index's per stream (streams no document has are left out: FE does not
//! normalise them), and a static feature is the document's, missing when NaN. With the
//! `collection`'s statistics (a shard's search), idf and the average lengths are the
//! collection's.
//!
//! The hits are valid by construction, so the layouts skip the validation a client's hit
//! documents get (FE on the CPU still checks them as it walks them): the forward index's reader
//! checks that a stream's phrase lengths sum to its length and counts positions along it (in
//! range, strictly increasing), and a hit's term index is that of one of the query's distinct
//! terms (below Q). Streams outside FE's catalogue publish no features and are read past.

use std::sync::Arc;

use rayon::prelude::*;

use super::shard::fe_statistics;
use crate::api::shard::CollectionStats;
use crate::gpu::pinned::PinnedPool;
use crate::gpu::GpuError;
use crate::index::forward::HitsSink;
use crate::index::{DocId, Index, IndexError, QueryCodes};
use crate::rank::engine::{FeRefused, RowSource};
use crate::rank::fe::catalogue::stream_slot;
use crate::rank::fe::{
    fill_rows_in_chunks, CorpusStats, GatherMap, HitDocument, HitError, HitStream, Prepared,
    QueryInfo,
};
use crate::rank::gpu::layout::{FeLayout, LayoutPart};
use crate::rank::store::LoadedRanker;
use crate::select::{bm25, dedup_terms};

/// Candidates per task on the CPU pool, at least: a candidate's forward-index entry decodes
/// and its features extract in a few µs, and a hand-off to the pool costs a few.
const MIN_CANDIDATES_PER_TASK: usize = 64;

/// Why the candidates have no rows.
#[derive(Debug, thiserror::Error)]
pub(super) enum CandidateError {
    /// Feature extraction refused them: the ranker, or (never for an index's hits) a hit.
    #[error(transparent)]
    Fe(#[from] FeRefused),
    /// A candidate's forward-index entry does not decode (the index was checked at open, so
    /// this is corruption the server did not catch).
    #[error(transparent)]
    Index(#[from] IndexError),
}

/// A 500: the candidates' hits come from the index, so their refusal is the server's fault
/// (a ranker FE cannot serve is refused before, with its own message).
impl From<CandidateError> for super::error::ApiError {
    fn from(err: CandidateError) -> Self {
        super::error::ApiError::internal(err)
    }
}

/// A ranked search's candidates, read from the index as the engine asks for their rows or
/// layouts (see the module docs).
pub(super) struct CandidateHits {
    index: Arc<Index>,
    /// The candidates, by docID: row `i` is `docs[i]`.
    docs: Vec<DocId>,
    /// The distinct query terms as the forward index is searched for them.
    codes: QueryCodes,
    query: QueryInfo,
    stats: CorpusStats,
    /// The catalogue slot of each of the index's streams.
    slots: Vec<Option<usize>>,
}

impl CandidateHits {
    /// The candidates `docs` (by docID) of the query `terms` over `index`, with the
    /// `collection`'s statistics when given (a shard's search), else the index's.
    pub(super) fn new(
        index: Arc<Index>,
        terms: &[String],
        docs: Vec<DocId>,
        collection: Option<&CollectionStats>,
    ) -> CandidateHits {
        let distinct = dedup_terms(terms);
        let ids: Vec<_> = distinct.iter().map(|t| index.term_id(t)).collect();
        let (query, stats) = match collection {
            Some(collection) => fe_statistics(collection),
            None => {
                let n = index.num_docs() as u64;
                let df = |id: Option<u32>| id.map_or(0, |id| index.term_info(id).df) as u64;
                let query = QueryInfo {
                    terms: distinct.len() as u32,
                    idf: ids.iter().map(|&id| bm25::idf(n, df(id))).collect(),
                };
                let manifest = index.manifest();
                let stats = CorpusStats {
                    avg_length: (manifest.streams.iter().enumerate())
                        .map(|(i, name)| (name.clone(), index.avg_stream_length(i)))
                        .filter(|&(_, avg)| avg > 0.0)
                        .collect(),
                };
                (query, stats)
            }
        };
        let slots = (index.manifest().streams.iter())
            .map(|name| stream_slot(name))
            .collect();
        CandidateHits {
            codes: index.query_codes(&ids),
            index,
            docs,
            query,
            stats,
            slots,
        }
    }

    /// The position of static feature `name` among the index's.
    fn static_index(&self, name: &str) -> Option<usize> {
        (self.index.manifest().static_features.iter()).position(|n| n == name)
    }

    /// Document `d`'s static feature `f` (a position among the index's), `None` when absent
    /// (NaN in the index).
    fn static_value(&self, d: DocId, f: Option<usize>) -> Option<f64> {
        f.map(|f| self.index.static_value(d, f))
            .filter(|v| !v.is_nan())
    }

    /// The candidates `docs` laid out in one part, with the values of the statics at
    /// positions `statics` (NaN, a missing value, when absent). `Err(None)` when a candidate
    /// does not decode (the rows then report it), `Err(Some)` when the part overflows the
    /// kernel's 32-bit indices.
    fn lay_out(
        &self,
        docs: &[DocId],
        statics: &[Option<usize>],
    ) -> Result<LayoutPart, Option<GpuError>> {
        let mut part = LayoutPart::with_capacity(docs.len(), statics.len());
        let mut reading = Reading::new(&self.slots);
        for &d in docs {
            reading
                .read(&self.index, d, &self.codes)
                .map_err(|_| None)?;
            let values = (statics.iter()).map(|&f| self.static_value(d, f).unwrap_or(f64::NAN));
            (part.push_valid(|slot| reading.doc.streams.slot(slot), values)).map_err(Some)?;
        }
        Ok(part)
    }
}

/// The candidates' features are extracted on the CPU pool from each candidate's hits as they
/// are read, or laid out for the fused device path as they are read.
impl RowSource for CandidateHits {
    type Error = CandidateError;

    fn len(&self) -> usize {
        self.docs.len()
    }

    /// The rows of FE over each candidate's hits, read into one hit document per task reused
    /// from candidate to candidate: the rows [`FeatureResolver::extract_batch`] gives for the
    /// candidates' hit documents, bit for bit, with its errors.
    ///
    /// [`FeatureResolver::extract_batch`]: crate::rank::fe::FeatureResolver::extract_batch
    fn rows(
        &mut self,
        loaded: &LoadedRanker,
        threads: usize,
    ) -> Result<Option<Vec<f64>>, CandidateError> {
        let resolver = (loaded.fe.as_ref()).map_err(|err| FeRefused::Ranker(err.to_string()))?;
        let prepared = Prepared::new(&self.query, &self.stats).map_err(FeRefused::Hits)?;
        let width = resolver.len();
        let mut rows = vec![f64::NAN; self.docs.len() * width];
        let this = &*self;
        let fill = |first: usize, docs: &[DocId], rows: &mut [f64]| {
            let mut reading = Reading::new(&this.slots);
            for (i, &d) in docs.iter().enumerate() {
                reading.read(&this.index, d, &this.codes)?;
                let statics = |name: &str| this.static_value(d, this.static_index(name));
                let row = &mut rows[i * width..(i + 1) * width];
                (resolver.extract_with_statics(&prepared, &reading.doc, statics, row)).map_err(
                    |err| FeRefused::Hits(named(err, this.index.doc_id(d)).at_index(first + i)),
                )?;
            }
            Ok::<_, CandidateError>(())
        };
        fill_rows_in_chunks(
            &self.docs,
            &mut rows,
            width,
            threads,
            MIN_CANDIDATES_PER_TASK,
            fill,
        )?;
        Ok(Some(rows))
    }

    fn may_give_hits(&self) -> bool {
        true
    }

    /// The candidates in layouts of at most `max_docs`, each laid out in runs spread over the
    /// pool (`threads` of them, of at least [`MIN_CANDIDATES_PER_TASK`]) as their hits are read:
    /// the layouts [`FeLayout::build_split`] gives for their hit documents. `None` when the
    /// rows must decide (no candidates, invalid statistics, a candidate that does not decode).
    fn hit_layouts(
        &mut self,
        gather: &GatherMap,
        max_docs: usize,
        threads: usize,
        pinned: Option<&PinnedPool>,
    ) -> Option<Result<Vec<FeLayout>, GpuError>> {
        if self.docs.is_empty() {
            return None;
        }
        let prepared = Prepared::new(&self.query, &self.stats).ok()?;
        let statics: Vec<_> = (gather.static_keys.iter())
            .map(|key| self.static_index(key))
            .collect();
        let (threads, max_docs) = (threads.max(1), max_docs.max(1));
        let mut layouts = Vec::with_capacity(self.docs.len().div_ceil(max_docs));
        for batch in self.docs.chunks(max_docs) {
            let run = batch.len().div_ceil(threads).max(MIN_CANDIDATES_PER_TASK);
            let laid_out: Vec<_> = (batch.par_chunks(run))
                .map(|docs| self.lay_out(docs, &statics))
                .collect();
            let mut parts = Vec::with_capacity(laid_out.len());
            for part in laid_out {
                match part {
                    Ok(part) => parts.push(part),
                    Err(None) => return None,
                    Err(Some(err)) => return Some(Err(err)),
                }
            }
            match FeLayout::join(&prepared, Some(gather), &parts, pinned) {
                Ok(layout) => layouts.push(layout),
                Err(err) => return Some(Err(err)),
            }
        }
        Some(Ok(layouts))
    }
}

/// FE's error about a hit of the document whose id is `id`, naming it as FE names a hit
/// document that gives its id.
fn named(mut err: HitError, id: &str) -> HitError {
    if let HitError::TermOutOfRange { at, .. }
    | HitError::PositionOutOfRange { at, .. }
    | HitError::PositionNotIncreasing { at, .. } = &mut err
    {
        at.doc.id = Some(id.to_string());
    }
    err
}

/// One task's reading of candidates: each candidate's catalogue streams read into `doc`
/// (emptied first, its streams' vectors kept), the others read past.
struct Reading<'s> {
    /// The catalogue slot of each of the index's streams.
    slots: &'s [Option<usize>],
    doc: HitDocument,
    /// Streams of earlier candidates, kept for their vectors.
    spare: Vec<HitStream>,
    /// The slot of the stream being read; `None` outside the catalogue.
    current: Option<usize>,
}

impl<'s> Reading<'s> {
    fn new(slots: &'s [Option<usize>]) -> Self {
        Reading {
            slots,
            doc: HitDocument::default(),
            spare: Vec::new(),
            current: None,
        }
    }

    /// Reads candidate `d`'s hits for the query of `codes` into `doc` (no streams
    /// without a forward index). Its id is left out: read only for an error ([`named`]), it
    /// costs a cache miss or two per candidate in a large index.
    fn read(&mut self, index: &Index, d: DocId, codes: &QueryCodes) -> Result<(), IndexError> {
        self.doc.streams.clear_into(&mut self.spare);
        self.current = None;
        index.hits_into(d, codes, self)
    }

    /// The stream being read, when it is a catalogue stream.
    #[inline]
    fn current(&mut self) -> Option<&mut HitStream> {
        let slot = self.current?;
        Some(self.doc.streams.slot_mut(slot, &mut self.spare))
    }
}

impl HitsSink for Reading<'_> {
    fn stream(&mut self, stream: u32, length: u32) {
        self.current = self.slots.get(stream as usize).copied().flatten();
        if let Some(stream) = self.current() {
            // A stream given twice keeps its last, as in a map.
            stream.length = length;
            stream.phrases.clear();
        }
    }

    #[inline]
    fn hit(&mut self, term: u32, position: u32) {
        if let Some(stream) = self.current() {
            stream.phrases.parts_mut().0.push([term, position]);
        }
    }

    fn phrase_end(&mut self) {
        if let Some(stream) = self.current() {
            let (hits, ends) = stream.phrases.parts_mut();
            ends.push(hits.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::index::builder::{build, BuildOptions};
    use crate::rank::engine::HitBatch;
    use crate::rank::fe::Phrases;
    use crate::rank::store::RankerStore;

    /// The hit documents of `docs`, built as `/v1/search` built them before [`CandidateHits`]:
    /// one [`HitDocument`] per candidate from [`Index::hits`], the reference for its rows and
    /// layouts; `terms` is the query.
    fn hit_documents(hits: &CandidateHits, terms: &[String]) -> HitBatch {
        let (index, manifest) = (&hits.index, hits.index.manifest());
        let ids: Vec<_> = (dedup_terms(terms).iter())
            .map(|t| index.term_id(t))
            .collect();
        let docs = (hits.docs.iter())
            .map(|&d| {
                let streams = (index.hits(d, &ids).unwrap().unwrap_or_default())
                    .into_iter()
                    .map(|s| (s.stream, HitStream::new(s.length, s.phrases)))
                    .collect();
                let static_features: BTreeMap<String, f64> = (manifest.static_features.iter())
                    .enumerate()
                    .map(|(f, name)| (name.clone(), index.static_value(d, f)))
                    .filter(|(_, value)| !value.is_nan())
                    .collect();
                HitDocument {
                    id: Some(index.doc_id(d).to_string()),
                    streams,
                    static_features,
                }
            })
            .collect();
        HitBatch {
            query: hits.query.clone(),
            stats: hits.stats.clone(),
            docs,
        }
    }

    /// An index of the fixture corpus and `extra` lines after it.
    fn index(extra: &[&str]) -> (tempfile::TempDir, Arc<Index>) {
        let dir = tempfile::tempdir().unwrap();
        let fixture =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/corpus.jsonl");
        let mut corpus = std::fs::read_to_string(fixture).unwrap();
        for line in extra {
            corpus.push_str(line);
            corpus.push('\n');
        }
        let path = dir.path().join("c.jsonl");
        std::fs::write(&path, corpus).unwrap();
        let out = dir.path().join("idx");
        build(&path, &out, &BuildOptions::default(), &|_| {}).unwrap();
        let index = Index::open(&out).unwrap();
        (dir, Arc::new(index))
    }

    fn bits(values: &[f64]) -> Vec<u64> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn query_statistics_are_bm25s_and_the_documents_hits_those_of_the_forward_index() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("c.jsonl");
        std::fs::write(
            &corpus,
            concat!(
                r#"{"id": "a", "streams": {"title": "red fox", "body": "the red fox. a fox"}, "static": {"static_rank": 0.5}}"#,
                "\n",
                r#"{"id": "b", "streams": {"body": "blue sky"}, "static": {}}"#,
                "\n",
            ),
        )
        .unwrap();
        let out = dir.path().join("idx");
        build(&corpus, &out, &BuildOptions::default(), &|_| {}).unwrap();
        let index = Arc::new(Index::open(&out).unwrap());
        let terms = ["fox", "red", "fox", "unknown"].map(String::from);
        let hits = CandidateHits::new(index, &terms, vec![0, 1], None);
        // Distinct terms in first-occurrence order; an unknown term has df 0.
        assert_eq!(hits.query.terms, 3);
        assert_eq!(
            hits.query.idf,
            [bm25::idf(2, 1), bm25::idf(2, 1), bm25::idf(2, 0)]
        );
        assert_eq!(hits.stats.avg_length["body"], 3.5);
        assert_eq!(hits.stats.avg_length["title"], 1.0);
        let mut reading = Reading::new(&hits.slots);
        reading.read(&hits.index, 0, &hits.codes).unwrap();
        let a = reading.doc.clone();
        assert_eq!(a.streams["body"].length, 5);
        assert_eq!(
            a.streams["body"].phrases,
            Phrases::from_iter([&[[1, 1], [0, 2]][..], &[[0, 4]]])
        );
        assert_eq!(
            a.streams["title"].phrases,
            Phrases::from_iter([[[1, 0], [0, 1]]])
        );
        assert_eq!(
            hits.static_value(0, hits.static_index("static_rank")),
            Some(0.5)
        );
        // The next candidate reuses the vectors and keeps nothing of the first.
        reading.read(&hits.index, 1, &hits.codes).unwrap();
        assert_eq!(
            reading.doc.streams,
            hit_documents(&hits, &terms).docs[1].streams
        );
        assert!(reading.doc.streams["body"].phrases.is_empty());
        assert_eq!(hits.static_value(1, hits.static_index("static_rank")), None);
    }

    /// The rows and the layouts of the candidates equal those of their hit documents built as
    /// before ([`hit_documents`]), bit for bit, in one task and in several, on the fixture index
    /// with documents without streams, without static features, and with a stream outside
    /// the catalogue; with the collection's statistics too.
    #[test]
    fn rows_and_layouts_equal_those_of_the_candidates_hit_documents() {
        let (_dir, index) = index(&[
            r#"{"id": "empty", "streams": {}, "static": {}}"#,
            r#"{"id": "no-static", "streams": {"title": "the kitchen", "headings": "kitchen ranking. the"}, "static": {}}"#,
            r#"{"id": "url-only", "streams": {"url": "https://the.example/kitchen"}, "static": {"url_depth": 1}}"#,
        ]);
        let store = RankerStore::open(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers"),
            1 << 30,
        )
        .unwrap();
        let loaded = store.get("medium").unwrap();
        let resolver = loaded.fe.as_ref().unwrap();
        let gather = resolver.gather_map();
        assert!(!gather.static_keys.is_empty());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let n = index.num_docs();
        let collection = CollectionStats {
            docs: 1000,
            scoring_length: 40_000,
            stream_lengths: [("body".into(), 30_000), ("title".into(), 900)].into(),
            df: vec![300, 20, 0],
        };
        let all: Vec<DocId> = (0..n).collect();
        let some: Vec<DocId> = (0..n).step_by(3).chain([n - 3, n - 1]).collect();
        for (text, docs, collection) in [
            ("the kitchen ranking", all.clone(), None),
            ("kitchen kitchen of nothingness", some.clone(), None),
            ("the kitchen ranking", some, Some(&collection)),
            ("zzz", all.clone(), None),
            ("the", vec![], None),
        ] {
            let terms = crate::index::tokenize::Tokenizer::new().tokens(text);
            let mut hits = CandidateHits::new(Arc::clone(&index), &terms, docs, collection);
            let batch = hit_documents(&hits, &terms);
            let what = format!("{text:?}, {} candidates", batch.docs.len());
            let mut want = vec![0.0; batch.docs.len() * resolver.len()];
            (resolver.extract_batch(&batch.query, &batch.stats, &batch.docs, &mut want, 1))
                .unwrap();
            for threads in [1, 4] {
                let rows = pool
                    .install(|| hits.rows(&loaded, threads))
                    .unwrap()
                    .unwrap();
                assert_eq!(bits(&rows), bits(&want), "{what}, {threads} threads");
                for max_docs in [7, 1000] {
                    let got = pool.install(|| hits.hit_layouts(&gather, max_docs, threads, None));
                    if batch.docs.is_empty() {
                        assert!(got.is_none(), "{what}");
                        continue;
                    }
                    let got = got.unwrap().unwrap();
                    let (query, stats) = (&batch.query, &batch.stats);
                    let want = (FeLayout::build_split(
                        query,
                        stats,
                        &batch.docs,
                        Some(&gather),
                        max_docs,
                        threads,
                        None,
                    ))
                    .unwrap();
                    assert_eq!(
                        format!("{got:?}"),
                        format!("{want:?}"),
                        "{what}, {threads} threads, layouts of {max_docs}"
                    );
                }
            }
        }
    }

    /// An error about a candidate's hit names it as FE names a hit document that gives its id.
    #[test]
    fn errors_about_a_candidate_name_its_id_as_fe_does() {
        let store = RankerStore::open(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers"),
            1 << 30,
        )
        .unwrap();
        let loaded = store.get("small").unwrap();
        let resolver = loaded.fe.as_ref().unwrap();
        let query = QueryInfo {
            terms: 1,
            idf: vec![1.0],
        };
        let mut doc = HitDocument {
            id: Some("d7".into()),
            streams: [("body", HitStream::new(3, [[[0, 5]]]))].into(),
            ..HitDocument::default()
        };
        let mut row = vec![0.0; resolver.len()];
        let stats = CorpusStats::default();
        let want = resolver
            .extract(&query, &stats, &doc, &mut row)
            .unwrap_err();
        doc.id = None;
        let got = resolver
            .extract(&query, &stats, &doc, &mut row)
            .unwrap_err();
        assert_ne!(got, want);
        assert_eq!(named(got, "d7").to_string(), want.to_string());
    }

    /// A ranker with a feature FE cannot produce is refused as such (the handler answers its
    /// 400), before any candidate is read.
    #[test]
    fn a_ranker_fe_cannot_serve_is_refused_by_the_rows() {
        let (_dir, index) = index(&[]);
        let dir = tempfile::tempdir().unwrap();
        let store = RankerStore::open(dir.path(), 1 << 30).unwrap();
        let ranker = serde_json::json!({
            "format": "rankserve-ranker", "version": 1, "features": ["f0"],
            "inputs": [{"type": "linear", "feature": "f0", "slope": 1.0, "intercept": 0.0}],
            "layers": [{"weights": [[1.0]], "bias": [0.0], "activation": "identity"}]
        });
        let loaded = (store.put("vectors", ranker.to_string().as_bytes(), None)).unwrap();
        let mut hits = CandidateHits::new(index, &["the".into()], vec![0, 1], None);
        assert!(matches!(
            hits.rows(&loaded, 1),
            Err(CandidateError::Fe(FeRefused::Ranker(_)))
        ));
    }

    /// A query of more terms than the FE kernel takes is over the device's limits: its rows
    /// go to the CPU.
    #[test]
    fn a_query_over_the_kernels_terms_is_over_the_device_limits() {
        let (_dir, index) = index(&[]);
        let limit = crate::rank::gpu::layout::MAX_TERMS as usize;
        let terms: Vec<String> = (0..=limit).map(|t| format!("t{t}")).collect();
        let mut hits = CandidateHits::new(index, &terms, vec![0, 1, 2], None);
        let gather = GatherMap::default();
        assert!(matches!(
            hits.hit_layouts(&gather, 100, 1, None),
            Some(Err(GpuError::TooLarge { .. }))
        ));
    }
}
