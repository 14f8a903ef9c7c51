//! Binding a ranker's feature map to feature extraction: [`FeatureResolver`] maps each of the
//! ranker's feature names to a catalogue feature or a static feature once, at load time, and then
//! writes each document's `V` in the ranker's order.
//!
//! Extraction computes the whole catalogue in one walk into a per-thread scratch vector and
//! gathers the ranker's features from it: the walk over the hits dominates the cost, and the
//! gather is a few nanoseconds per feature (measurements in `docs/benchmarks-history.md`).

use std::cell::RefCell;

use rayon::prelude::*;

use super::catalogue::{catalogue_index, CATALOGUE_LEN, STATIC_PREFIX};
use super::fsm::{extract_all, Prepared, Scratch};
use super::hits::{CorpusStats, HitDocument, HitError, QueryInfo};

/// A ranker feature name that feature extraction cannot produce.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeError {
    /// Neither a catalogue feature nor `static.<name>`.
    #[error(
        "features[{index}]: unknown feature {name:?}: expected a catalogue feature \
         (docs/features.md, e.g. \"body.bm25f\") or \"static.<name>\""
    )]
    UnknownFeature {
        /// Position in the ranker's feature map.
        index: usize,
        /// The name given.
        name: String,
    },
}

/// Where one entry of `V` comes from.
#[derive(Debug, Clone, PartialEq)]
enum Source {
    /// An index into the catalogue.
    Catalogue(usize),
    /// A key of the document's static map (without the `static.` prefix).
    Static(String),
}

/// A ranker's feature map as the GPU gathers it (`fe_gather` in kernels/fe.cu): `codes[j]` is
/// feature j's catalogue column when non-negative, else `-1 - k` for `static_keys[k]` (each
/// document's static features are sent as a `documents × static_keys.len()` matrix). Catalogue
/// indices are below [`CATALOGUE_LEN`], and a ranker has far fewer than 2³¹ features, so the
/// codes fit an `i32`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatherMap {
    pub codes: Vec<i32>,
    pub static_keys: Vec<String>,
}

/// A ranker's feature map resolved against the catalogue.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureResolver {
    sources: Vec<Source>,
}

/// Fewest documents one rayon task gathers (a gather costs nanoseconds per feature).
const GATHER_MIN_DOCS: usize = 1024;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl FeatureResolver {
    /// Resolves `features` (a ranker's feature map, in order).
    ///
    /// # Errors
    /// [`FeError::UnknownFeature`] for the first name that is neither a catalogue feature nor
    /// `static.<non-empty name>`.
    pub fn new(features: &[String]) -> Result<FeatureResolver, FeError> {
        let sources = features
            .iter()
            .enumerate()
            .map(|(index, name)| {
                if let Some(i) = catalogue_index(name) {
                    return Ok(Source::Catalogue(i));
                }
                match name.strip_prefix(STATIC_PREFIX) {
                    Some(key) if !key.is_empty() => Ok(Source::Static(key.to_string())),
                    _ => Err(FeError::UnknownFeature {
                        index,
                        name: name.clone(),
                    }),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(FeatureResolver { sources })
    }

    /// Number of features written per document (the ranker's `V` length).
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// Whether the feature map is empty.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// Extracts one document's `V` into `out` (the ranker's order): catalogue features from the
    /// hits, `static.<name>` from the document's static map (NaN, a missing value, when absent).
    ///
    /// # Errors
    /// Any [`HitError`] of the query, the statistics or the document (the error has no batch
    /// index); [`HitError::OutputLength`] when `out.len() != self.len()`. On error `out`'s
    /// contents are unspecified.
    pub fn extract(
        &self,
        query: &QueryInfo,
        stats: &CorpusStats,
        doc: &HitDocument,
        out: &mut [f64],
    ) -> Result<(), HitError> {
        self.check_output(1, out.len())?;
        let prepared = Prepared::new(query, stats)?;
        self.extract_with_statics(&prepared, doc, statics_of(doc), out)
    }

    /// [`FeatureResolver::extract`] for a caller that prepared the query once
    /// ([`Prepared::new`]) and keeps the document's static features elsewhere: `statics` gives
    /// a static feature's value by name (without the `static.` prefix), and `doc`'s own static
    /// map is not read. For a decoder that extracts as it reads (`api::msgpack_rank`).
    ///
    /// # Errors
    /// As [`FeatureResolver::extract`], without checking `out`'s length.
    pub(crate) fn extract_with_statics(
        &self,
        query: &Prepared<'_>,
        doc: &HitDocument,
        statics: impl Fn(&str) -> Option<f64>,
        out: &mut [f64],
    ) -> Result<(), HitError> {
        SCRATCH.with_borrow_mut(|scratch| self.extract_prepared(query, doc, statics, scratch, out))
    }

    /// Extracts a batch: `out` is row-major `docs.len() × self.len()`. `threads <= 1` runs on
    /// the calling thread, otherwise the documents are split into `threads` contiguous chunks
    /// run on rayon's pool. The values never depend on `threads`.
    ///
    /// # Errors
    /// As [`FeatureResolver::extract`]; a document error carries the document's batch index,
    /// and is the one of the lowest index whatever `threads` is. On error `out`'s contents are
    /// unspecified.
    pub fn extract_batch(
        &self,
        query: &QueryInfo,
        stats: &CorpusStats,
        docs: &[HitDocument],
        out: &mut [f64],
        threads: usize,
    ) -> Result<(), HitError> {
        self.check_output(docs.len(), out.len())?;
        let prepared = Prepared::new(query, stats)?;
        let width = self.len();
        if docs.is_empty() {
            return Ok(());
        }
        let run_chunk = |first: usize, docs: &[HitDocument], out: &mut [f64]| {
            SCRATCH.with_borrow_mut(|scratch| {
                for (i, doc) in docs.iter().enumerate() {
                    let row = &mut out[i * width..(i + 1) * width];
                    self.extract_prepared(&prepared, doc, statics_of(doc), scratch, row)
                        .map_err(|e| e.at_index(first + i))?;
                }
                Ok(())
            })
        };
        fill_rows_in_chunks(docs, out, width, threads, 1, run_chunk)
    }

    /// Checks that an output buffer of `got` values fits `docs` documents × [`FeatureResolver::len`].
    ///
    /// # Errors
    /// [`HitError::OutputLength`] when it does not.
    pub fn check_output(&self, docs: usize, got: usize) -> Result<(), HitError> {
        let expected = docs * self.len();
        if got != expected {
            return Err(HitError::OutputLength {
                expected,
                got,
                docs,
                features: self.len(),
            });
        }
        Ok(())
    }

    /// Writes one document's `V` (the ranker's order) into `out` from its catalogue row (every
    /// catalogue feature, in catalogue order, however computed: by the CPU walk or on the GPU)
    /// and its static map (NaN, a missing value, for an absent key).
    ///
    /// # Assumptions
    /// `catalogue.len() == CATALOGUE_LEN` and `out.len() == self.len()`; shorter slices leave
    /// the features past their end unwritten.
    pub fn gather(&self, catalogue: &[f64], doc: &HitDocument, out: &mut [f64]) {
        self.gather_with(catalogue, statics_of(doc), out);
    }

    /// [`FeatureResolver::gather`] with the static features given by name (without the
    /// `static.` prefix) by `statics`.
    fn gather_with(
        &self,
        catalogue: &[f64],
        statics: impl Fn(&str) -> Option<f64>,
        out: &mut [f64],
    ) {
        for (slot, source) in out.iter_mut().zip(&self.sources) {
            *slot = match source {
                Source::Catalogue(i) => catalogue.get(*i).copied(),
                Source::Static(key) => statics(key),
            }
            .unwrap_or(f64::NAN);
        }
    }

    /// [`FeatureResolver::gather`] for a batch, documents in parallel on rayon's pool:
    /// `catalogue` is row-major `docs.len() × CATALOGUE_LEN`, `out` row-major
    /// `docs.len() × self.len()`.
    ///
    /// # Errors
    /// [`HitError::OutputLength`] when `out.len() != docs.len() * self.len()`.
    pub fn gather_batch(
        &self,
        catalogue: &[f64],
        docs: &[HitDocument],
        out: &mut [f64],
    ) -> Result<(), HitError> {
        self.check_output(docs.len(), out.len())?;
        if self.is_empty() {
            return Ok(());
        }
        catalogue
            .par_chunks(CATALOGUE_LEN)
            .zip(docs)
            .zip(out.par_chunks_mut(self.len()))
            .with_min_len(GATHER_MIN_DOCS)
            .for_each(|((row, doc), out)| self.gather(row, doc, out));
        Ok(())
    }

    /// The resolver as a device gather reads it ([`GatherMap`]): each static key once, in
    /// first-seen order, and one code per feature.
    pub fn gather_map(&self) -> GatherMap {
        let mut static_keys: Vec<String> = Vec::new();
        let codes = (self.sources.iter())
            .map(|source| match source {
                Source::Catalogue(i) => *i as i32,
                Source::Static(key) => {
                    let k = match static_keys.iter().position(|s| s == key) {
                        Some(k) => k,
                        None => {
                            static_keys.push(key.clone());
                            static_keys.len() - 1
                        }
                    };
                    -(k as i32) - 1
                }
            })
            .collect();
        GatherMap { codes, static_keys }
    }

    fn extract_prepared(
        &self,
        query: &Prepared<'_>,
        doc: &HitDocument,
        statics: impl Fn(&str) -> Option<f64>,
        scratch: &mut Scratch,
        out: &mut [f64],
    ) -> Result<(), HitError> {
        extract_all(query, doc, scratch)?;
        self.gather_with(&scratch.features, statics, out);
        Ok(())
    }
}

/// A document's static features by name, from its own map.
fn statics_of(doc: &HitDocument) -> impl Fn(&str) -> Option<f64> + '_ {
    |key| doc.static_features.get(key).copied()
}

/// Fills `out` (`docs.len()` rows of `width` values) by `fill(first, docs, rows)` over
/// contiguous chunks of `docs`: `threads` chunks of at least `min_chunk` documents on rayon's
/// pool, or one call on the calling thread when that is all there is (always when `width` is 0:
/// the documents are still validated). Each chunk stops at its first error and the chunks are
/// checked in order, so the error returned is the lowest failing document's, whatever `threads`.
///
/// # Errors
/// The first error of `fill`, by chunk order.
pub fn fill_rows_in_chunks<D: Sync, E: Send>(
    docs: &[D],
    out: &mut [f64],
    width: usize,
    threads: usize,
    min_chunk: usize,
    fill: impl Fn(usize, &[D], &mut [f64]) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let chunk = docs.len().div_ceil(threads.max(1)).max(min_chunk.max(1));
    if width == 0 || docs.len() <= chunk {
        return fill(0, docs, out);
    }
    let results: Vec<Result<(), E>> = docs
        .par_chunks(chunk)
        .zip(out.par_chunks_mut(chunk * width))
        .enumerate()
        .map(|(c, (docs, rows))| fill(c * chunk, docs, rows))
        .collect();
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::catalogue::feature_names;
    use super::super::hits::HitStream;
    use super::super::synth::{synth_corpus_stats, synth_hit_documents, synth_query};
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn small_doc() -> HitDocument {
        HitDocument {
            id: Some("d1".into()),
            streams: [("body".to_string(), HitStream::new(20, [[[0, 3], [1, 4]]]))].into(),
            static_features: [("static_rank".to_string(), 0.7)].into(),
        }
    }

    #[test]
    fn gather_map_codes_catalogue_columns_and_numbers_static_keys_once() {
        let resolver = FeatureResolver::new(&names(&[
            "static.b",
            "doc.bm25f",
            "static.a",
            "title.length",
            "static.b",
        ]))
        .unwrap();
        let map = resolver.gather_map();
        let bm25f = catalogue_index("doc.bm25f").unwrap() as i32;
        let title = catalogue_index("title.length").unwrap() as i32;
        assert_eq!(map.codes, [-1, bm25f, -2, title, -1]);
        assert_eq!(map.static_keys, ["b", "a"]);
    }

    #[test]
    fn writes_features_in_the_rankers_order_with_missing_statics_as_nan() {
        let resolver = FeatureResolver::new(&names(&[
            "static.static_rank",
            "body.occurrences.sum",
            "body.length",
            "static.pagerank",
            "doc.query_terms",
        ]))
        .expect("all known");
        let query = QueryInfo {
            terms: 2,
            idf: vec![1.0, 1.0],
        };
        let mut out = vec![0.0; 5];
        resolver
            .extract(&query, &CorpusStats::default(), &small_doc(), &mut out)
            .expect("valid");
        assert_eq!(out[..3], [0.7, 2.0, 20.0]);
        assert!(out[3].is_nan());
        assert_eq!(out[4], 2.0);
    }

    #[test]
    fn rejects_an_unknown_feature_naming_its_index() {
        let err = FeatureResolver::new(&names(&["body.bm25f", "body.bm52f"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "features[1]: unknown feature \"body.bm52f\": expected a catalogue feature \
             (docs/features.md, e.g. \"body.bm25f\") or \"static.<name>\""
        );
    }

    #[test]
    fn rejects_an_empty_static_name() {
        assert_eq!(
            FeatureResolver::new(&names(&["static."])).unwrap_err(),
            FeError::UnknownFeature {
                index: 0,
                name: "static.".into()
            }
        );
    }

    #[test]
    fn rejects_a_wrong_output_length() {
        let resolver = FeatureResolver::new(&names(&["body.length"])).expect("known");
        let query = QueryInfo {
            terms: 2,
            idf: vec![1.0, 1.0],
        };
        let err = resolver
            .extract_batch(
                &query,
                &CorpusStats::default(),
                &[small_doc(), small_doc()],
                &mut [0.0; 3],
                1,
            )
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "output buffer has 3 values, expected 2 (2 documents × 1 features)"
        );
    }

    #[test]
    fn batch_is_identical_for_any_thread_count() {
        let resolver = FeatureResolver::new(feature_names()).expect("catalogue");
        let query = synth_query(3, 1);
        let stats = synth_corpus_stats();
        let docs = synth_hit_documents(57, 3, 9);
        let mut one = vec![0.0; docs.len() * resolver.len()];
        resolver
            .extract_batch(&query, &stats, &docs, &mut one, 1)
            .expect("synthetic documents are valid");
        for threads in [2, 4, 64] {
            let mut many = vec![0.0; one.len()];
            resolver
                .extract_batch(&query, &stats, &docs, &mut many, threads)
                .expect("valid");
            assert_eq!(one, many, "threads = {threads}");
        }
        let mut single = vec![0.0; resolver.len()];
        resolver
            .extract(&query, &stats, &docs[33], &mut single)
            .expect("valid");
        assert_eq!(single, one[33 * resolver.len()..34 * resolver.len()]);
    }

    #[test]
    fn gathering_from_catalogue_rows_equals_extracting() {
        let query = synth_query(4, 2);
        let stats = synth_corpus_stats();
        let docs = synth_hit_documents(2500, 4, 11);
        let catalogue = FeatureResolver::new(feature_names()).expect("catalogue");
        let mut rows = vec![0.0; docs.len() * catalogue.len()];
        catalogue
            .extract_batch(&query, &stats, &docs, &mut rows, 1)
            .expect("valid");
        let ranker = FeatureResolver::new(&names(&[
            "static.spam_score",
            "doc.bm25f",
            "static.missing",
            "body.window.phrase",
            "doc.bm25f",
        ]))
        .expect("known");
        let mut extracted = vec![0.0; docs.len() * ranker.len()];
        ranker
            .extract_batch(&query, &stats, &docs, &mut extracted, 2)
            .expect("valid");
        let mut gathered = vec![0.0; extracted.len()];
        ranker
            .gather_batch(&rows, &docs, &mut gathered)
            .expect("sized");
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&gathered), bits(&extracted));
        assert!(matches!(
            ranker.gather_batch(&rows, &docs, &mut gathered[1..]),
            Err(HitError::OutputLength { .. })
        ));
    }

    #[test]
    fn batch_reports_the_first_bad_document_with_its_index() {
        let resolver = FeatureResolver::new(&names(&["doc.bm25f"])).expect("known");
        let query = QueryInfo {
            terms: 1,
            idf: vec![1.0],
        };
        let bad_url = HitStream::new(1, [[[0, 1]]]);
        let mut docs: Vec<HitDocument> = (0..10)
            .map(|i| HitDocument {
                id: Some(format!("d{i}")),
                ..HitDocument::default()
            })
            .collect();
        // Documents 3 and 8 are bad, in different chunks when threads = 4.
        docs[3].streams.insert("url", bad_url.clone());
        docs[8].streams.insert("url", bad_url);
        for threads in [1, 4] {
            let mut out = vec![0.0; docs.len()];
            let err = resolver
                .extract_batch(&query, &CorpusStats::default(), &docs, &mut out, threads)
                .unwrap_err();
            assert_eq!(
                err.to_string(),
                "document 3 (id \"d3\"), streams.url.phrases[0][0]: position 1 out of range: \
                 the stream's length is 1",
                "threads = {threads}"
            );
        }
    }

    #[test]
    fn zero_width_map_still_validates() {
        let resolver = FeatureResolver::new(&[]).expect("empty");
        let query = QueryInfo {
            terms: 1,
            idf: vec![1.0],
        };
        let err = resolver
            .extract_batch(
                &query,
                &CorpusStats::default(),
                &[small_doc(), small_doc()],
                &mut [],
                4,
            )
            .unwrap_err();
        assert!(
            matches!(err, HitError::TermOutOfRange { term: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn synthetic_documents_are_deterministic_and_shaped() {
        let a = synth_hit_documents(200, 4, 5);
        assert_eq!(a, synth_hit_documents(200, 4, 5));
        assert_ne!(a, synth_hit_documents(200, 4, 6));
        let mean = |s: &str| {
            let l: Vec<f64> = a
                .iter()
                .filter_map(|d| d.streams.get(s))
                .map(|s| f64::from(s.length))
                .collect();
            l.iter().sum::<f64>() / l.len() as f64
        };
        assert!((6.0..14.0).contains(&mean("title")), "{}", mean("title"));
        assert!((200.0..600.0).contains(&mean("body")), "{}", mean("body"));
        let hits: usize = a
            .iter()
            .map(|d| d.streams["body"].phrases.hits().len())
            .sum();
        assert!(hits > 200, "body hits {hits}");
        let statics: BTreeMap<_, _> = a[0].static_features.clone();
        assert_eq!(statics.len(), 3);
    }

    /// Single-thread throughput on synthetic documents, for `docs/benchmarks-history.md`. The box is
    /// shared, so each configuration is timed as many short repetitions and the fastest (the
    /// least disturbed) and the median are reported.
    /// Run: `cargo test --release --lib extraction_throughput -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a test"]
    fn extraction_throughput() {
        use std::time::Instant;
        const DOCS: usize = 1000;
        const REPS: usize = 300;
        let stats = synth_corpus_stats();
        let all = FeatureResolver::new(feature_names()).expect("catalogue");
        let subset: Vec<String> = feature_names()
            .iter()
            .step_by(7)
            .take(17)
            .cloned()
            .chain(
                [
                    "static.static_rank",
                    "static.spam_score",
                    "static.url_depth",
                ]
                .map(String::from),
            )
            .collect();
        let ranker20 = FeatureResolver::new(&subset).expect("names resolve");
        let time = |f: &mut dyn FnMut()| {
            f();
            let mut ns: Vec<f64> = (0..REPS)
                .map(|_| {
                    let start = Instant::now();
                    f();
                    start.elapsed().as_nanos() as f64 / DOCS as f64
                })
                .collect();
            ns.sort_by(f64::total_cmp);
            (ns[0], ns[REPS / 2])
        };
        println!("| Q | hits/doc | map | best ns/doc | best docs/s | median ns/doc |");
        println!("|---|---|---|---|---|---|");
        for q in [2u32, 4, 8] {
            let query = synth_query(q, 7);
            let docs = synth_hit_documents(DOCS, q, 42);
            let hits: usize = docs
                .iter()
                .flat_map(|d| d.streams.iter())
                .map(|(_, s)| s.phrases.hits().len())
                .sum();
            let per_doc = hits as f64 / DOCS as f64;
            for (name, resolver) in [("catalogue (119)", &all), ("ranker20", &ranker20)] {
                let mut out = vec![0.0; DOCS * resolver.len()];
                let (best, median) = time(&mut || {
                    resolver
                        .extract_batch(&query, &stats, &docs, &mut out, 1)
                        .expect("valid")
                });
                println!(
                    "| {q} | {per_doc:.1} | {name} | {best:.0} | {:.2e} | {median:.0} |",
                    1e9 / best
                );
            }
            let (best, median) = time(&mut || {
                for doc in &docs {
                    crate::rank::fe::hits::validate_document(doc, q).expect("valid");
                }
            });
            println!(
                "| {q} | {per_doc:.1} | validation walk only | {best:.0} | {:.2e} | {median:.0} |",
                1e9 / best
            );
        }
    }
}
