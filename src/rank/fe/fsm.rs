//! The feature-extraction state machines (after Tadros 2015, §2.1.4 and §3.3): one walk per
//! stream, document → stream → phrase → word hit, in which every feature family's state is
//! updated at each hit; per-stream features are published at the end of the stream, the
//! per-document aggregates after the last stream, and the dependent features (BM25F) last.
//!
//! The walk also validates the hits (see [`super::hits`]), so a document is read once.
//! Everything is written into a catalogue-ordered scratch vector ([`super::catalogue`]); the
//! resolver gathers the ranker's features from it.

use super::catalogue::{DocFeature, StreamFeature, CATALOGUE_LEN, STREAMS};
use super::hits::{
    check_hit, validate_stream, CorpusStats, HitDocument, HitError, HitStream, Phrases, QueryInfo,
};

/// `k1` of the per-stream Okapi BM25 features (`<stream>.bm25`): DESIGN §5's selection default.
pub const BM25_K1: f64 = 0.9;
/// `b` of the per-stream Okapi BM25 features: DESIGN §5's selection default.
pub const BM25_B: f64 = 0.4;
/// `k1` of BM25F (`doc.bm25f`, `<stream>.bm25f`).
pub const BM25F_K1: f64 = 1.2;
/// BM25F stream weights `w_s`, in [`STREAMS`] order (title, body, anchor, url).
pub const BM25F_WEIGHTS: [f64; 4] = [3.0, 1.0, 2.0, 1.5];
/// BM25F length-normalisation strengths `b_s`, in [`STREAMS`] order.
pub const BM25F_B: [f64; 4] = [0.5, 0.75, 0.6, 0.5];

/// Per-term state of one stream's walk.
#[derive(Debug, Default)]
struct TermStates {
    /// Hits of each term in the stream so far.
    count: Vec<u32>,
    /// Position of each term's first hit (meaningful once `count > 0`).
    first: Vec<u32>,
    /// Position of each term's latest hit (meaningful once `count > 0`).
    last: Vec<u32>,
    /// Index of the latest phrase each term was hit in (`u32::MAX`: none yet).
    phrase: Vec<u32>,
    /// Matched terms by latest hit in the stream.
    in_stream: Recency,
    /// Terms hit in the current phrase, by latest hit.
    in_phrase: Recency,
}

impl TermStates {
    fn reset(&mut self, q: usize) {
        for (v, fresh) in [
            (&mut self.count, 0),
            (&mut self.first, 0),
            (&mut self.last, 0),
            (&mut self.phrase, u32::MAX),
        ] {
            v.clear();
            v.resize(q, fresh);
        }
        self.in_stream.reset(q);
        self.in_phrase.reset(q);
    }
}

/// Terms ordered by their latest hit, oldest first: a doubly linked list over term indices.
/// Since hits come in position order, the smallest window that ends at the newest hit and covers
/// every listed term starts at the oldest listed term's latest position, so each hit costs O(1)
/// instead of a scan over the Q terms.
#[derive(Debug, Default)]
struct Recency {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
}

const NIL: u32 = u32::MAX;

impl Recency {
    fn reset(&mut self, q: usize) {
        for v in [&mut self.prev, &mut self.next] {
            v.clear();
            v.resize(q, NIL);
        }
        self.clear();
    }

    /// Empties the list (members' stale links are overwritten when they are touched again).
    fn clear(&mut self) {
        self.head = NIL;
        self.tail = NIL;
    }

    /// Moves term `t` to the newest end; `listed` says whether it is in the list already.
    fn touch(&mut self, t: u32, listed: bool) {
        if listed {
            if self.tail == t {
                return;
            }
            let (p, n) = (self.prev[t as usize], self.next[t as usize]);
            if p == NIL {
                self.head = n;
            } else {
                self.next[p as usize] = n;
            }
            // `t` is not the tail, so it has a successor.
            self.prev[n as usize] = p;
        }
        self.prev[t as usize] = self.tail;
        self.next[t as usize] = NIL;
        if self.tail == NIL {
            self.head = t;
        } else {
            self.next[self.tail as usize] = t;
        }
        self.tail = t;
    }
}

/// Query-level values computed once per batch.
#[derive(Debug, Clone)]
pub(crate) struct Prepared<'q> {
    pub(crate) idf: &'q [f64],
    pub(crate) terms: u32,
    /// Σ idf, in term order.
    pub(crate) idf_sum: f64,
    /// Average length of each catalogue stream (`None`: no length normalisation).
    pub(crate) avg_length: [Option<f64>; STREAMS.len()],
}

impl<'q> Prepared<'q> {
    /// Validates the query and the statistics and precomputes what every document shares.
    pub(crate) fn new(query: &'q QueryInfo, stats: &CorpusStats) -> Result<Self, HitError> {
        super::hits::validate_query(query)?;
        super::hits::validate_stats(stats)?;
        Ok(Prepared {
            idf: &query.idf,
            terms: query.terms,
            idf_sum: query.idf.iter().sum(),
            avg_length: STREAMS.map(|s| stats.avg_length.get(s).copied()),
        })
    }

    /// BM25 length factor `1 − b + b·len/avg_len` of catalogue stream `slot`.
    fn length_factor(&self, slot: usize, b: f64, length: u32) -> f64 {
        match self.avg_length[slot] {
            Some(avg) => 1.0 - b + b * f64::from(length) / avg,
            None => 1.0,
        }
    }
}

/// Reusable buffers of one extraction thread.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// The catalogue-ordered features of the last document.
    pub(crate) features: Vec<f64>,
    terms: TermStates,
    /// Per term: hits summed over the catalogue streams.
    doc_tf: Vec<u32>,
    /// Per term: BM25F's weighted, length-normalised term frequency `tf̃_t`.
    doc_tfw: Vec<f64>,
}

/// `num / den`, or `otherwise` when `den` is not positive.
fn ratio(num: f64, den: f64, otherwise: f64) -> f64 {
    if den > 0.0 {
        num / den
    } else {
        otherwise
    }
}

static EMPTY_STREAM: HitStream = HitStream {
    length: 0,
    phrases: Phrases::new(),
};

/// Extracts every catalogue feature of `doc` into `scratch.features`, validating it on the way.
///
/// # Errors
/// The first invalid hit (module docs of [`super::hits`]), without the batch index.
pub(crate) fn extract_all(
    query: &Prepared<'_>,
    doc: &HitDocument,
    scratch: &mut Scratch,
) -> Result<(), HitError> {
    let q = query.terms as usize;
    scratch.features.clear();
    scratch.features.resize(CATALOGUE_LEN, 0.0);
    scratch.doc_tf.clear();
    scratch.doc_tf.resize(q, 0);
    scratch.doc_tfw.clear();
    scratch.doc_tfw.resize(q, 0.0);

    let mut doc_length = 0.0;
    let mut streams_matched = 0.0;
    let mut bigrams = 0.0;
    let mut longest_run = 0.0f64;
    let mut full_matches = 0.0;
    // Streams outside the catalogue are only validated; the catalogue streams are walked in
    // catalogue order, so that sums over streams have a fixed order.
    for (name, stream) in doc.streams.others() {
        validate_stream(doc, name, stream, query.terms)?;
    }
    for slot in 0..STREAMS.len() {
        let stream = doc.streams.slot(slot).unwrap_or(&EMPTY_STREAM);
        walk_stream(query, doc, slot, STREAMS[slot], stream, scratch)?;
        let f = &scratch.features;
        doc_length += f64::from(stream.length);
        if f[StreamFeature::OccurrencesSum.index(slot)] > 0.0 {
            streams_matched += 1.0;
        }
        bigrams += f[StreamFeature::InOrderBigrams.index(slot)];
        longest_run = longest_run.max(f[StreamFeature::InOrderLongestRun.index(slot)]);
        full_matches += f[StreamFeature::InOrderFullMatches.index(slot)];
    }

    // Per-document aggregates over the per-term sums, then the dependent BM25F.
    let (mut sum, mut min, mut max, mut distinct, mut matched_idf, mut bm25f) =
        (0u64, u32::MAX, 0u32, 0u32, 0.0, 0.0);
    for t in 0..q {
        let tf = scratch.doc_tf[t];
        sum += u64::from(tf);
        min = min.min(tf);
        max = max.max(tf);
        if tf > 0 {
            distinct += 1;
            matched_idf += query.idf[t];
            let tfw = scratch.doc_tfw[t];
            bm25f += query.idf[t] * tfw / (BM25F_K1 + tfw);
        }
    }
    let qf = q as f64;
    let out = &mut scratch.features;
    use DocFeature as D;
    out[D::Length.index()] = doc_length;
    out[D::OccurrencesSum.index()] = sum as f64;
    out[D::OccurrencesMin.index()] = if q == 0 { 0.0 } else { f64::from(min) };
    out[D::OccurrencesMax.index()] = f64::from(max);
    out[D::DistinctTerms.index()] = f64::from(distinct);
    out[D::DistinctTermsFraction.index()] = ratio(f64::from(distinct), qf, 0.0);
    out[D::MatchedIdfSum.index()] = matched_idf;
    out[D::MatchedIdfFraction.index()] = ratio(matched_idf, query.idf_sum, 0.0);
    out[D::StreamsMatched.index()] = streams_matched;
    out[D::InOrderBigrams.index()] = bigrams;
    out[D::InOrderLongestRun.index()] = longest_run;
    out[D::InOrderFullMatches.index()] = full_matches;
    out[D::Bm25f.index()] = bm25f;
    out[D::Bm25fNorm.index()] = ratio(bm25f, query.idf_sum, 0.0);
    out[D::QueryTerms.index()] = qf;
    Ok(())
}

/// Walks one catalogue stream hit by hit, updating every family's state, then publishes the
/// stream's features and adds its per-term counts to the document's.
fn walk_stream(
    query: &Prepared<'_>,
    doc: &HitDocument,
    slot: usize,
    name: &str,
    stream: &HitStream,
    scratch: &mut Scratch,
) -> Result<(), HitError> {
    let q = query.terms as usize;
    let terms = &mut scratch.terms;
    terms.reset(q);

    // Occurrence family: counts, first/last positions live in `terms`.
    let mut previous: Option<u32> = None;
    let mut distinct = 0u32;
    // Window family: best span ending at a hit, over hits after the last newly matched term.
    let mut window_stream = u32::MAX;
    // Phrase family: most distinct terms in one phrase, and the best window among those phrases.
    let (mut phrases_matched, mut best_phrase_terms, mut best_phrase_window) =
        (0u32, 0u32, u32::MAX);
    // In-order family.
    let (mut bigrams, mut longest_run, mut full_matches) = (0u32, 0u32, 0u32);

    for (phrase, hits) in stream.phrases.iter().enumerate() {
        if hits.is_empty() {
            continue;
        }
        phrases_matched += 1;
        let phrase_tag = phrase as u32;
        terms.in_phrase.clear();
        let mut phrase_terms = 0u32;
        let mut phrase_window = u32::MAX;
        let mut run = 0u32;
        let mut previous_hit: Option<[u32; 2]> = None;
        for (hit, &[term, position]) in hits.iter().enumerate() {
            check_hit(
                doc,
                name,
                stream.length,
                query.terms,
                previous,
                phrase,
                hit,
                term,
                position,
            )?;
            previous = Some(position);

            let t = term as usize;
            let listed_in_stream = terms.count[t] > 0;
            if !listed_in_stream {
                distinct += 1;
                terms.first[t] = position;
                window_stream = u32::MAX;
            }
            terms.count[t] += 1;
            terms.last[t] = position;
            terms.in_stream.touch(term, listed_in_stream);
            let listed_in_phrase = terms.phrase[t] == phrase_tag;
            if !listed_in_phrase {
                terms.phrase[t] = phrase_tag;
                phrase_terms += 1;
                phrase_window = u32::MAX;
            }
            terms.in_phrase.touch(term, listed_in_phrase);

            // The smallest window ending here that covers every term seen (in the stream, in the
            // phrase) starts at the latest position of the least recently hit of those terms.
            let start_stream = terms.last[terms.in_stream.head as usize];
            let start_phrase = terms.last[terms.in_phrase.head as usize];
            window_stream = window_stream.min(position - start_stream + 1);
            phrase_window = phrase_window.min(position - start_phrase + 1);

            run = match previous_hit {
                Some([t, p]) if t + 1 == term && p + 1 == position => {
                    bigrams += 1;
                    run + 1
                }
                _ => 1,
            };
            longest_run = longest_run.max(run);
            // A run only ever climbs through consecutive terms, so it reaches Q only from term 0.
            if run == query.terms {
                full_matches += 1;
            }
            previous_hit = Some([term, position]);
        }
        if phrase_terms > best_phrase_terms {
            best_phrase_terms = phrase_terms;
            best_phrase_window = phrase_window;
        } else if phrase_terms == best_phrase_terms {
            best_phrase_window = best_phrase_window.min(phrase_window);
        }
    }

    // Publish the stream's features.
    let length = f64::from(stream.length);
    let (mut sum, mut min_count, mut max_count) = (0u64, u32::MAX, 0u32);
    let (mut first_min, mut first_max, mut last_min, mut last_max) =
        (u32::MAX, 0u32, u32::MAX, 0u32);
    let (mut matched_idf, mut bm25, mut bm25f) = (0.0, 0.0, 0.0);
    let bm25_norm = query.length_factor(slot, BM25_B, stream.length) * BM25_K1;
    let bm25f_norm = query.length_factor(slot, BM25F_B[slot], stream.length);
    for t in 0..q {
        let count = terms.count[t];
        sum += u64::from(count);
        min_count = min_count.min(count);
        max_count = max_count.max(count);
        if count > 0 {
            first_min = first_min.min(terms.first[t]);
            first_max = first_max.max(terms.first[t]);
            last_min = last_min.min(terms.last[t]);
            last_max = last_max.max(terms.last[t]);
            let idf = query.idf[t];
            let tf = f64::from(count);
            matched_idf += idf;
            bm25 += idf * tf * (BM25_K1 + 1.0) / (tf + bm25_norm);
            let tfw = BM25F_WEIGHTS[slot] * tf / bm25f_norm;
            bm25f += idf * tfw / (BM25F_K1 + tfw);
            scratch.doc_tf[t] += count;
            scratch.doc_tfw[t] += tfw;
        }
    }
    let (first_min, first_max, last_min, last_max) = if distinct == 0 {
        (length, length, length, length)
    } else {
        (
            f64::from(first_min),
            f64::from(first_max),
            f64::from(last_min),
            f64::from(last_max),
        )
    };
    let qf = q as f64;
    let sumf = sum as f64;
    let out = &mut scratch.features;
    let mut set = |f: StreamFeature, v: f64| out[f.index(slot)] = v;
    use StreamFeature as S;
    set(S::Length, length);
    set(S::OccurrencesSum, sumf);
    set(
        S::OccurrencesMin,
        if q == 0 { 0.0 } else { f64::from(min_count) },
    );
    set(S::OccurrencesMax, f64::from(max_count));
    set(S::OccurrencesMean, ratio(sumf, qf, 0.0));
    set(S::OccurrencesDensity, ratio(sumf, length, 0.0));
    set(S::FirstOccurrenceMin, first_min);
    set(S::FirstOccurrenceMax, first_max);
    set(S::FirstOccurrenceMinNorm, ratio(first_min, length, 1.0));
    set(S::LastOccurrenceMin, last_min);
    set(S::LastOccurrenceMax, last_max);
    set(S::LastOccurrenceMaxNorm, ratio(last_max, length, 1.0));
    set(S::DistinctTerms, f64::from(distinct));
    set(
        S::DistinctTermsFraction,
        ratio(f64::from(distinct), qf, 0.0),
    );
    set(S::MatchedIdfSum, matched_idf);
    set(
        S::MatchedIdfFraction,
        ratio(matched_idf, query.idf_sum, 0.0),
    );
    set(S::InOrderBigrams, f64::from(bigrams));
    set(S::InOrderLongestRun, f64::from(longest_run));
    set(S::InOrderFullMatches, f64::from(full_matches));
    let no_window = length + 1.0;
    set(
        S::WindowStream,
        if distinct == 0 {
            no_window
        } else {
            f64::from(window_stream)
        },
    );
    set(
        S::WindowPhrase,
        if distinct > 0 && best_phrase_terms == distinct {
            f64::from(best_phrase_window)
        } else {
            no_window
        },
    );
    set(S::PhrasesMatched, f64::from(phrases_matched));
    set(S::PhrasesMaxDistinct, f64::from(best_phrase_terms));
    set(S::Bm25, bm25);
    set(
        S::Bm25Norm,
        ratio(bm25, (BM25_K1 + 1.0) * query.idf_sum, 0.0),
    );
    set(S::Bm25f, bm25f);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::super::catalogue::{catalogue_index, feature_names};
    use super::*;

    /// Extracts the whole catalogue of `doc`.
    fn extract(query: &QueryInfo, stats: &CorpusStats, doc: &HitDocument) -> Vec<f64> {
        let prepared = Prepared::new(query, stats).expect("valid query and stats");
        let mut scratch = Scratch::default();
        extract_all(&prepared, doc, &mut scratch).expect("valid document");
        scratch.features
    }

    fn get(features: &[f64], name: &str) -> f64 {
        features[catalogue_index(name).unwrap_or_else(|| panic!("no feature {name}"))]
    }

    fn close(a: f64, b: f64) -> bool {
        a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
    }

    /// Asserts each `(name, expected)` pair, listing every mismatch.
    fn assert_features(features: &[f64], expected: &[(&str, f64)]) {
        let wrong: Vec<String> = expected
            .iter()
            .filter(|(name, want)| !close(get(features, name), *want))
            .map(|(name, want)| format!("{name}: got {}, expected {want}", get(features, name)))
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    fn stream(length: u32, phrases: &[&[[u32; 2]]]) -> HitStream {
        HitStream::new(length, phrases)
    }

    fn doc(streams: &[(&str, HitStream)]) -> HitDocument {
        HitDocument {
            id: Some("d1".into()),
            streams: streams
                .iter()
                .map(|(n, s)| (n.to_string(), s.clone()))
                .collect(),
            static_features: BTreeMap::new(),
        }
    }

    fn stats(avg: &[(&str, f64)]) -> CorpusStats {
        CorpusStats {
            avg_length: avg.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        }
    }

    /// Q = 3, idf [1, 2, 3]; title "t0 t1 _ _"; body of 20 tokens in which the whole query
    /// appears once as a phrase at 2..4; no anchor, no url.
    fn doc_a() -> (QueryInfo, CorpusStats, HitDocument) {
        let query = QueryInfo {
            terms: 3,
            idf: vec![1.0, 2.0, 3.0],
        };
        let stats = stats(&[("title", 5.0), ("body", 20.0)]);
        let doc = doc(&[
            ("title", stream(4, &[&[[0, 0], [1, 1]]])),
            (
                "body",
                stream(
                    20,
                    &[
                        &[[0, 2], [1, 3], [2, 4], [0, 7]],
                        &[[2, 10], [0, 12]],
                        &[],
                        &[[1, 15]],
                    ],
                ),
            ),
        ]);
        (query, stats, doc)
    }

    #[test]
    fn title_features_of_doc_a() {
        let (q, s, d) = doc_a();
        let f = extract(&q, &s, &d);
        // BM25: length factor 1 - 0.4 + 0.4·4/5 = 0.92; two terms with tf 1 and idf 1, 2.
        // BM25F (w 3, b 0.5): factor 0.9, tf̃ = 3/0.9 = 10/3, each term idf·(10/3)/(1.2 + 10/3).
        assert_features(
            &f,
            &[
                ("title.length", 4.0),
                ("title.occurrences.sum", 2.0),
                ("title.occurrences.min", 0.0),
                ("title.occurrences.max", 1.0),
                ("title.occurrences.mean", 2.0 / 3.0),
                ("title.occurrences.density", 0.5),
                ("title.first_occurrence.min", 0.0),
                ("title.first_occurrence.max", 1.0),
                ("title.first_occurrence.min_norm", 0.0),
                ("title.last_occurrence.min", 0.0),
                ("title.last_occurrence.max", 1.0),
                ("title.last_occurrence.max_norm", 0.25),
                ("title.distinct_terms", 2.0),
                ("title.distinct_terms.fraction", 2.0 / 3.0),
                ("title.matched_idf.sum", 3.0),
                ("title.matched_idf.fraction", 0.5),
                ("title.in_order.bigrams", 1.0),
                ("title.in_order.longest_run", 2.0),
                ("title.in_order.full_matches", 0.0),
                ("title.window.stream", 2.0),
                ("title.window.phrase", 2.0),
                ("title.phrases.matched", 1.0),
                ("title.phrases.max_distinct", 2.0),
                ("title.bm25", 3.0 * 1.9 / (1.0 + 0.9 * 0.92)),
                (
                    "title.bm25.norm",
                    3.0 * 1.9 / (1.0 + 0.9 * 0.92) / (1.9 * 6.0),
                ),
                ("title.bm25f", 3.0 * 10.0 / 13.6),
            ],
        );
    }

    #[test]
    fn body_features_of_doc_a() {
        let (q, s, d) = doc_a();
        let f = extract(&q, &s, &d);
        // tf: t0 = 3 (2, 7, 12), t1 = 2 (3, 15), t2 = 2 (4, 10). Length = average, so the BM25
        // factors are 1: BM25 term = idf·tf·1.9/(tf + 0.9); BM25F (w 1) term = idf·tf/(1.2 + tf).
        let bm25 = 3.0 * 1.9 / 3.9 + 2.0 * 2.0 * 1.9 / 2.9 + 3.0 * 2.0 * 1.9 / 2.9;
        assert_features(
            &f,
            &[
                ("body.length", 20.0),
                ("body.occurrences.sum", 7.0),
                ("body.occurrences.min", 2.0),
                ("body.occurrences.max", 3.0),
                ("body.occurrences.mean", 7.0 / 3.0),
                ("body.occurrences.density", 0.35),
                ("body.first_occurrence.min", 2.0),
                ("body.first_occurrence.max", 4.0),
                ("body.first_occurrence.min_norm", 0.1),
                ("body.last_occurrence.min", 10.0),
                ("body.last_occurrence.max", 15.0),
                ("body.last_occurrence.max_norm", 0.75),
                ("body.distinct_terms", 3.0),
                ("body.distinct_terms.fraction", 1.0),
                ("body.matched_idf.sum", 6.0),
                ("body.matched_idf.fraction", 1.0),
                // 0→1 at 2→3 and 1→2 at 3→4; the run 0,1,2 is the whole query.
                ("body.in_order.bigrams", 2.0),
                ("body.in_order.longest_run", 3.0),
                ("body.in_order.full_matches", 1.0),
                ("body.window.stream", 3.0),
                ("body.window.phrase", 3.0),
                // the empty third phrase does not count
                ("body.phrases.matched", 3.0),
                ("body.phrases.max_distinct", 3.0),
                ("body.bm25", bm25),
                ("body.bm25.norm", bm25 / (1.9 * 6.0)),
                ("body.bm25f", 3.0 / 4.2 + 2.0 * 2.0 / 3.2 + 3.0 * 2.0 / 3.2),
            ],
        );
    }

    #[test]
    fn absent_streams_publish_the_nothing_matched_values() {
        let (q, s, d) = doc_a();
        let f = extract(&q, &s, &d);
        for stream in ["anchor", "url"] {
            let expected: Vec<(String, f64)> = [
                ("length", 0.0),
                ("occurrences.sum", 0.0),
                ("occurrences.min", 0.0),
                ("occurrences.density", 0.0),
                ("first_occurrence.min", 0.0),
                ("first_occurrence.min_norm", 1.0),
                ("last_occurrence.max", 0.0),
                ("last_occurrence.max_norm", 1.0),
                ("distinct_terms", 0.0),
                ("in_order.longest_run", 0.0),
                ("window.stream", 1.0),
                ("window.phrase", 1.0),
                ("phrases.matched", 0.0),
                ("bm25", 0.0),
                ("bm25.norm", 0.0),
                ("bm25f", 0.0),
            ]
            .iter()
            .map(|(n, v)| (format!("{stream}.{n}"), *v))
            .collect();
            let expected: Vec<(&str, f64)> =
                expected.iter().map(|(n, v)| (n.as_str(), *v)).collect();
            assert_features(&f, &expected);
        }
    }

    #[test]
    fn unmatched_present_stream_uses_its_length() {
        let q = QueryInfo {
            terms: 2,
            idf: vec![1.0, 1.0],
        };
        let d = doc(&[("body", stream(50, &[&[], &[]]))]);
        let f = extract(&q, &CorpusStats::default(), &d);
        assert_features(
            &f,
            &[
                ("body.length", 50.0),
                ("body.first_occurrence.min", 50.0),
                ("body.first_occurrence.max", 50.0),
                ("body.last_occurrence.min", 50.0),
                ("body.last_occurrence.max", 50.0),
                ("body.first_occurrence.min_norm", 1.0),
                ("body.window.stream", 51.0),
                ("body.window.phrase", 51.0),
                ("body.phrases.matched", 0.0),
                ("body.phrases.max_distinct", 0.0),
            ],
        );
    }

    #[test]
    fn document_aggregates_and_bm25f_of_doc_a() {
        let (q, s, d) = doc_a();
        let f = extract(&q, &s, &d);
        // Per-term tf over streams: t0 1 + 3, t1 1 + 2, t2 0 + 2. BM25F tf̃: title adds
        // 3·1/0.9 = 10/3 for t0 and t1; body adds tf (w 1, factor 1). So tf̃ = 19/3, 16/3, 2 and
        // BM25F = 1·(19/3)/(1.2 + 19/3) + 2·(16/3)/(1.2 + 16/3) + 3·2/3.2.
        let bm25f = 19.0 / 22.6 + 32.0 / 19.6 + 6.0 / 3.2;
        assert_features(
            &f,
            &[
                ("doc.length", 24.0),
                ("doc.occurrences.sum", 9.0),
                ("doc.occurrences.min", 2.0),
                ("doc.occurrences.max", 4.0),
                ("doc.distinct_terms", 3.0),
                ("doc.distinct_terms.fraction", 1.0),
                ("doc.matched_idf.sum", 6.0),
                ("doc.matched_idf.fraction", 1.0),
                ("doc.streams.matched", 2.0),
                ("doc.in_order.bigrams", 3.0),
                ("doc.in_order.longest_run", 3.0),
                ("doc.in_order.full_matches", 1.0),
                ("doc.bm25f", bm25f),
                ("doc.bm25f.norm", bm25f / 6.0),
                ("doc.query_terms", 3.0),
            ],
        );
    }

    #[test]
    fn stream_window_may_cross_phrases_but_phrase_window_may_not() {
        // Q = 2. Phrases: [t0@1 t0@5 t1@9] [t0@11] [t1@12]. Across phrases t0@11..t1@12 spans 2;
        // inside a phrase only the first holds both terms: t0@5..t1@9 spans 5.
        let q = QueryInfo {
            terms: 2,
            idf: vec![1.0, 1.0],
        };
        let d = doc(&[(
            "body",
            stream(30, &[&[[0, 1], [0, 5], [1, 9]], &[[0, 11]], &[[1, 12]]]),
        )]);
        let f = extract(&q, &CorpusStats::default(), &d);
        assert_features(
            &f,
            &[
                ("body.window.stream", 2.0),
                ("body.window.phrase", 5.0),
                ("body.phrases.matched", 3.0),
                ("body.phrases.max_distinct", 2.0),
                // t0@11 then t1@12 are adjacent but in different phrases: no bigram.
                ("body.in_order.bigrams", 0.0),
                ("body.in_order.longest_run", 1.0),
                ("body.first_occurrence.min", 1.0),
                ("body.first_occurrence.max", 9.0),
                ("body.last_occurrence.min", 11.0),
                ("body.last_occurrence.max", 12.0),
            ],
        );
    }

    #[test]
    fn in_order_runs_bigrams_and_full_matches() {
        // Q = 4: t1 t2 t3 at 5..7 then t0 at 8 (a run of 3, not the whole query); the whole
        // query at 20..23; t1 t0 at 30, 31 (reversed: no bigram).
        let q = QueryInfo {
            terms: 4,
            idf: vec![1.0; 4],
        };
        let d = doc(&[(
            "body",
            stream(
                40,
                &[
                    &[[1, 5], [2, 6], [3, 7], [0, 8]],
                    &[[0, 20], [1, 21], [2, 22], [3, 23]],
                    &[[1, 30], [0, 31]],
                ],
            ),
        )]);
        let f = extract(&q, &CorpusStats::default(), &d);
        assert_features(
            &f,
            &[
                ("body.in_order.bigrams", 5.0),
                ("body.in_order.longest_run", 4.0),
                ("body.in_order.full_matches", 1.0),
                ("body.window.stream", 4.0),
                ("body.window.phrase", 4.0),
            ],
        );
    }

    #[test]
    fn single_term_query_counts_every_hit_as_a_full_match() {
        let q = QueryInfo {
            terms: 1,
            idf: vec![2.0],
        };
        let d = doc(&[("url", stream(3, &[&[[0, 0], [0, 1]]]))]);
        let f = extract(&q, &CorpusStats::default(), &d);
        assert_features(
            &f,
            &[
                ("url.in_order.full_matches", 2.0),
                ("url.in_order.bigrams", 0.0),
                ("url.in_order.longest_run", 1.0),
                ("url.window.stream", 1.0),
                ("url.occurrences.min", 2.0),
            ],
        );
    }

    #[test]
    fn missing_average_length_means_no_length_normalisation() {
        // Title of doc A without stats: factor 1, so each BM25 term is idf·1.9/1.9 = idf.
        let (q, _, d) = doc_a();
        let f = extract(&q, &CorpusStats::default(), &d);
        assert_features(&f, &[("title.bm25", 3.0), ("title.bm25f", 3.0 * 3.0 / 4.2)]);
    }

    #[test]
    fn empty_query_publishes_zeros_not_nan() {
        let q = QueryInfo {
            terms: 0,
            idf: vec![],
        };
        let d = doc(&[("body", stream(10, &[]))]);
        let f = extract(&q, &CorpusStats::default(), &d);
        assert!(f.iter().all(|v| v.is_finite()), "{f:?}");
        assert_features(
            &f,
            &[
                ("body.occurrences.mean", 0.0),
                ("doc.distinct_terms.fraction", 0.0),
            ],
        );
    }

    #[test]
    fn other_streams_are_validated_but_publish_nothing() {
        let (q, s, mut d) = doc_a();
        let before = extract(&q, &s, &d);
        d.streams.insert("headings", stream(5, &[&[[2, 1]]]));
        assert_eq!(extract(&q, &s, &d), before);
    }

    // ---- the naive reference: every feature straight from its definition ----

    /// Hits of a stream as `(phrase, term, position)`.
    fn flat(stream: &HitStream) -> Vec<(usize, u32, u32)> {
        stream
            .phrases
            .iter()
            .enumerate()
            .flat_map(|(p, hits)| hits.iter().map(move |&[t, pos]| (p, t, pos)))
            .collect()
    }

    /// Smallest `hi - lo + 1` over hit pairs such that the hits in `[lo, hi]` cover `needed`.
    fn naive_window(hits: &[(usize, u32, u32)], needed: &[u32]) -> Option<u32> {
        let mut best = None;
        for a in hits {
            for b in hits.iter().filter(|b| b.2 >= a.2) {
                let inside: Vec<u32> = hits
                    .iter()
                    .filter(|h| h.2 >= a.2 && h.2 <= b.2)
                    .map(|h| h.1)
                    .collect();
                if needed.iter().all(|t| inside.contains(t)) {
                    let w = b.2 - a.2 + 1;
                    best = Some(best.map_or(w, |x: u32| x.min(w)));
                }
            }
        }
        best
    }

    /// Length of the in-order run starting at `h`: hits `(term + k, position + k)` in the same phrase.
    fn run_from(hits: &[(usize, u32, u32)], h: &(usize, u32, u32)) -> u32 {
        let mut k = 1;
        while hits
            .iter()
            .any(|x| x.0 == h.0 && x.1 == h.1 + k && x.2 == h.2 + k)
        {
            k += 1;
        }
        k
    }

    fn naive(query: &QueryInfo, stats: &CorpusStats, doc: &HitDocument) -> BTreeMap<String, f64> {
        let q = query.terms;
        let idf_sum: f64 = query.idf.iter().sum();
        let div = |a: f64, b: f64, z: f64| if b > 0.0 { a / b } else { z };
        let mut out = BTreeMap::new();
        let mut doc_tf = vec![0u32; q as usize];
        let mut doc_tfw = vec![0.0; q as usize];
        let (mut length_sum, mut streams_matched, mut bigrams_sum, mut longest_max, mut full_sum) =
            (0.0, 0.0, 0.0, 0.0f64, 0.0);
        for (slot, name) in STREAMS.iter().enumerate() {
            let empty = HitStream::default();
            let s = doc.streams.get(name).unwrap_or(&empty);
            let hits = flat(s);
            let len = f64::from(s.length);
            let tf: Vec<u32> = (0..q)
                .map(|t| hits.iter().filter(|h| h.1 == t).count() as u32)
                .collect();
            let matched: Vec<u32> = (0..q).filter(|&t| tf[t as usize] > 0).collect();
            let firsts: Vec<f64> = matched
                .iter()
                .map(|&t| f64::from(hits.iter().find(|h| h.1 == t).unwrap().2))
                .collect();
            let lasts: Vec<f64> = matched
                .iter()
                .map(|&t| f64::from(hits.iter().rev().find(|h| h.1 == t).unwrap().2))
                .collect();
            let fmin = firsts
                .iter()
                .copied()
                .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.min(x))));
            let fmax = firsts
                .iter()
                .copied()
                .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
            let lmin = lasts
                .iter()
                .copied()
                .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.min(x))));
            let lmax = lasts
                .iter()
                .copied()
                .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
            let sum: u32 = tf.iter().sum();
            let matched_idf: f64 = matched.iter().map(|&t| query.idf[t as usize]).sum();
            let bigrams = hits.iter().filter(|h| run_from(&hits, h) >= 2).count();
            let longest = hits.iter().map(|h| run_from(&hits, h)).max().unwrap_or(0);
            let full = hits
                .iter()
                .filter(|h| h.1 == 0 && run_from(&hits, h) >= q)
                .count();
            let window_stream = naive_window(&hits, &matched);
            let phrase_ids: Vec<usize> = (0..s.phrases.len())
                .filter(|&p| !s.phrases[p].is_empty())
                .collect();
            let window_phrase = phrase_ids
                .iter()
                .filter_map(|&p| {
                    let in_phrase: Vec<_> = hits.iter().copied().filter(|h| h.0 == p).collect();
                    naive_window(&in_phrase, &matched)
                })
                .min();
            let max_distinct = phrase_ids
                .iter()
                .map(|&p| {
                    (0..q)
                        .filter(|&t| hits.iter().any(|h| h.0 == p && h.1 == t))
                        .count()
                })
                .max()
                .unwrap_or(0);
            let avg = stats.avg_length.get(*name).copied();
            let factor = |b: f64| avg.map_or(1.0, |a| 1.0 - b + b * len / a);
            let mut bm25 = 0.0;
            let mut bm25f = 0.0;
            for &t in &matched {
                let (idf, tft) = (query.idf[t as usize], f64::from(tf[t as usize]));
                bm25 += idf * tft * (BM25_K1 + 1.0) / (tft + BM25_K1 * factor(BM25_B));
                let tfw = BM25F_WEIGHTS[slot] * tft / factor(BM25F_B[slot]);
                bm25f += idf * tfw / (BM25F_K1 + tfw);
                doc_tf[t as usize] += tf[t as usize];
                doc_tfw[t as usize] += tfw;
            }
            let qf = f64::from(q);
            let values = [
                ("length", len),
                ("occurrences.sum", f64::from(sum)),
                (
                    "occurrences.min",
                    f64::from(tf.iter().copied().min().unwrap_or(0)),
                ),
                (
                    "occurrences.max",
                    f64::from(tf.iter().copied().max().unwrap_or(0)),
                ),
                ("occurrences.mean", div(f64::from(sum), qf, 0.0)),
                ("occurrences.density", div(f64::from(sum), len, 0.0)),
                ("first_occurrence.min", fmin.unwrap_or(len)),
                ("first_occurrence.max", fmax.unwrap_or(len)),
                (
                    "first_occurrence.min_norm",
                    div(fmin.unwrap_or(len), len, 1.0),
                ),
                ("last_occurrence.min", lmin.unwrap_or(len)),
                ("last_occurrence.max", lmax.unwrap_or(len)),
                (
                    "last_occurrence.max_norm",
                    div(lmax.unwrap_or(len), len, 1.0),
                ),
                ("distinct_terms", matched.len() as f64),
                (
                    "distinct_terms.fraction",
                    div(matched.len() as f64, qf, 0.0),
                ),
                ("matched_idf.sum", matched_idf),
                ("matched_idf.fraction", div(matched_idf, idf_sum, 0.0)),
                ("in_order.bigrams", bigrams as f64),
                ("in_order.longest_run", f64::from(longest)),
                ("in_order.full_matches", full as f64),
                ("window.stream", window_stream.map_or(len + 1.0, f64::from)),
                (
                    "window.phrase",
                    if matched.is_empty() {
                        None
                    } else {
                        window_phrase
                    }
                    .map_or(len + 1.0, f64::from),
                ),
                ("phrases.matched", phrase_ids.len() as f64),
                ("phrases.max_distinct", max_distinct as f64),
                ("bm25", bm25),
                ("bm25.norm", div(bm25, (BM25_K1 + 1.0) * idf_sum, 0.0)),
                ("bm25f", bm25f),
            ];
            for (suffix, v) in values {
                out.insert(format!("{name}.{suffix}"), v);
            }
            length_sum += len;
            streams_matched += if sum > 0 { 1.0 } else { 0.0 };
            bigrams_sum += bigrams as f64;
            longest_max = longest_max.max(f64::from(longest));
            full_sum += full as f64;
        }
        let matched: Vec<usize> = (0..q as usize).filter(|&t| doc_tf[t] > 0).collect();
        let matched_idf: f64 = matched.iter().map(|&t| query.idf[t]).sum();
        let bm25f: f64 = matched
            .iter()
            .map(|&t| query.idf[t] * doc_tfw[t] / (BM25F_K1 + doc_tfw[t]))
            .sum();
        let qf = f64::from(q);
        let values = [
            ("length", length_sum),
            ("occurrences.sum", f64::from(doc_tf.iter().sum::<u32>())),
            (
                "occurrences.min",
                f64::from(doc_tf.iter().copied().min().unwrap_or(0)),
            ),
            (
                "occurrences.max",
                f64::from(doc_tf.iter().copied().max().unwrap_or(0)),
            ),
            ("distinct_terms", matched.len() as f64),
            (
                "distinct_terms.fraction",
                div(matched.len() as f64, qf, 0.0),
            ),
            ("matched_idf.sum", matched_idf),
            ("matched_idf.fraction", div(matched_idf, idf_sum, 0.0)),
            ("streams.matched", streams_matched),
            ("in_order.bigrams", bigrams_sum),
            ("in_order.longest_run", longest_max),
            ("in_order.full_matches", full_sum),
            ("bm25f", bm25f),
            ("bm25f.norm", div(bm25f, idf_sum, 0.0)),
            ("query_terms", qf),
        ];
        for (suffix, v) in values {
            out.insert(format!("doc.{suffix}"), v);
        }
        out
    }

    /// A random valid stream: a sorted subset of `0..length` as positions, random terms, random
    /// phrase breaks (some phrases empty).
    fn arb_stream(q: u32) -> impl Strategy<Value = HitStream> {
        (0u32..30).prop_flat_map(move |length| {
            let positions: Vec<u32> = (0..length).collect();
            let n = positions.len();
            (
                Just(length),
                proptest::sample::subsequence(positions, 0..=n.min(12)),
                proptest::collection::vec((0..q.max(1), 0u8..4), 12),
            )
                .prop_map(|(length, positions, marks)| {
                    let mut phrases: Vec<Vec<[u32; 2]>> = vec![Vec::new()];
                    for (position, (term, brk)) in positions.into_iter().zip(marks) {
                        if brk == 0 {
                            phrases.push(Vec::new());
                            if term % 3 == 0 {
                                phrases.push(Vec::new()); // an empty phrase
                            }
                        }
                        phrases.last_mut().unwrap().push([term, position]);
                    }
                    HitStream::new(length, phrases)
                })
        })
    }

    fn arb_case() -> impl Strategy<Value = (QueryInfo, CorpusStats, HitDocument)> {
        (1u32..9).prop_flat_map(|q| {
            let streams = proptest::collection::btree_map(
                prop_oneof![
                    Just("title"),
                    Just("body"),
                    Just("anchor"),
                    Just("url"),
                    Just("extra")
                ]
                .prop_map(str::to_string),
                arb_stream(q),
                0..5,
            );
            let idf = proptest::collection::vec(0.0f64..10.0, q as usize);
            let avg = proptest::collection::btree_map(
                prop_oneof![Just("title"), Just("body"), Just("anchor"), Just("url")]
                    .prop_map(str::to_string),
                0.5f64..40.0,
                0..4,
            );
            (streams, idf, avg).prop_map(move |(streams, idf, avg_length)| {
                (
                    QueryInfo { terms: q, idf },
                    CorpusStats { avg_length },
                    HitDocument {
                        id: None,
                        streams: streams.into_iter().collect(),
                        static_features: BTreeMap::new(),
                    },
                )
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn one_pass_equals_naive_definitions((query, stats, doc) in arb_case()) {
            let fast = extract(&query, &stats, &doc);
            let slow = naive(&query, &stats, &doc);
            prop_assert_eq!(slow.len(), feature_names().len());
            for (i, name) in feature_names().iter().enumerate() {
                prop_assert!(close(fast[i], slow[name]), "{}: one-pass {} naive {}", name, fast[i], slow[name]);
            }
        }
    }
}
