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
    check_hit, validate_stream, CorpusStats, HitDocument, HitError, HitStream, QueryInfo,
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
#[derive(Debug, Clone, Copy)]
struct TermState {
    /// Hits of this term in the stream so far.
    count: u32,
    /// Position of its first hit.
    first: u32,
    /// Position of its latest hit.
    last: u32,
    /// Index of the latest phrase it was hit in (`u32::MAX`: none yet).
    phrase: u32,
}

const FRESH_TERM: TermState = TermState {
    count: 0,
    first: 0,
    last: 0,
    phrase: u32::MAX,
};

/// Query-level values computed once per batch.
#[derive(Debug, Clone)]
pub(crate) struct Prepared<'q> {
    pub(crate) idf: &'q [f64],
    pub(crate) terms: u32,
    idf_sum: f64,
    /// Average length of each catalogue stream (`None`: no length normalisation).
    avg_length: [Option<f64>; STREAMS.len()],
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
    terms: Vec<TermState>,
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
    phrases: Vec::new(),
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
    for (slot, name) in STREAMS.iter().enumerate() {
        let stream = doc.streams.get(*name).unwrap_or(&EMPTY_STREAM);
        walk_stream(query, doc, slot, name, stream, scratch)?;
        let f = &scratch.features;
        doc_length += f64::from(stream.length);
        if f[StreamFeature::OccurrencesSum.index(slot)] > 0.0 {
            streams_matched += 1.0;
        }
        bigrams += f[StreamFeature::InOrderBigrams.index(slot)];
        longest_run = longest_run.max(f[StreamFeature::InOrderLongestRun.index(slot)]);
        full_matches += f[StreamFeature::InOrderFullMatches.index(slot)];
    }
    for (name, stream) in &doc.streams {
        if !STREAMS.contains(&name.as_str()) {
            validate_stream(doc, name, stream, query.terms)?;
        }
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
    terms.clear();
    terms.resize(q, FRESH_TERM);

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

            let state = &mut terms[term as usize];
            if state.count == 0 {
                distinct += 1;
                state.first = position;
                window_stream = u32::MAX;
            }
            state.count += 1;
            state.last = position;
            if state.phrase != phrase_tag {
                state.phrase = phrase_tag;
                phrase_terms += 1;
                phrase_window = u32::MAX;
            }

            // The smallest window ending here that covers every term seen (in the stream, in
            // the phrase) starts at the earliest of those terms' latest positions.
            let (mut start_stream, mut start_phrase) = (position, position);
            for s in terms.iter() {
                if s.count > 0 {
                    start_stream = start_stream.min(s.last);
                    if s.phrase == phrase_tag {
                        start_phrase = start_phrase.min(s.last);
                    }
                }
            }
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
    for (t, s) in terms.iter().enumerate() {
        sum += u64::from(s.count);
        min_count = min_count.min(s.count);
        max_count = max_count.max(s.count);
        if s.count > 0 {
            first_min = first_min.min(s.first);
            first_max = first_max.max(s.first);
            last_min = last_min.min(s.last);
            last_max = last_max.max(s.last);
            let idf = query.idf[t];
            let tf = f64::from(s.count);
            matched_idf += idf;
            bm25 += idf * tf * (BM25_K1 + 1.0) / (tf + bm25_norm);
            let tfw = BM25F_WEIGHTS[slot] * tf / bm25f_norm;
            bm25f += idf * tfw / (BM25F_K1 + tfw);
            scratch.doc_tf[t] += s.count;
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
