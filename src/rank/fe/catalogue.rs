//! The feature catalogue: the names of every feature that feature extraction publishes, in a
//! fixed order (the order of the scratch vector the FSMs fill; see `docs/features.md`).
//!
//! Order: for each catalogue stream in [`STREAMS`] order (`title`, `body`, `anchor`, `url`), the
//! [`StreamFeature`]s in declaration order, named `<stream>.<suffix>`; then the
//! [`DocFeature`]s, named `doc.<suffix>`. Static features (`static.<name>`) are not in the
//! catalogue: they are copied from the request, and any `static.*` name is accepted by the
//! resolver.

use std::sync::OnceLock;

/// The streams that produce features, in catalogue order. Other stream names are accepted (and
/// validated) in hit requests but publish nothing.
pub const STREAMS: [&str; 4] = ["title", "body", "anchor", "url"];

/// Index of a catalogue stream in [`STREAMS`].
pub(crate) fn stream_slot(name: &str) -> Option<usize> {
    match name {
        "title" => Some(0),
        "body" => Some(1),
        "anchor" => Some(2),
        "url" => Some(3),
        _ => None,
    }
}

/// Prefix of static (per-document, query-independent) feature names.
pub const STATIC_PREFIX: &str = "static.";

/// Features published once per catalogue stream, in catalogue order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum StreamFeature {
    /// Stream length in tokens.
    Length,
    /// Hits of all query terms.
    OccurrencesSum,
    /// Least per-term hit count over the query's terms (0 when some term is absent).
    OccurrencesMin,
    /// Largest per-term hit count.
    OccurrencesMax,
    /// `OccurrencesSum / Q`.
    OccurrencesMean,
    /// `OccurrencesSum / length`.
    OccurrencesDensity,
    /// Earliest first-occurrence position over matched terms.
    FirstOccurrenceMin,
    /// Latest first-occurrence position over matched terms.
    FirstOccurrenceMax,
    /// `FirstOccurrenceMin / length`.
    FirstOccurrenceMinNorm,
    /// Earliest last-occurrence position over matched terms.
    LastOccurrenceMin,
    /// Latest last-occurrence position over matched terms.
    LastOccurrenceMax,
    /// `LastOccurrenceMax / length`.
    LastOccurrenceMaxNorm,
    /// Number of distinct query terms with at least one hit.
    DistinctTerms,
    /// `DistinctTerms / Q`.
    DistinctTermsFraction,
    /// Sum of the idf of the matched terms.
    MatchedIdfSum,
    /// `MatchedIdfSum / Σ idf`.
    MatchedIdfFraction,
    /// Adjacent in-order bigram matches (term i then i+1 at the next position, same phrase).
    InOrderBigrams,
    /// Longest run of consecutive query terms at consecutive positions within a phrase.
    InOrderLongestRun,
    /// Occurrences of the whole query, in order, as an exact phrase.
    InOrderFullMatches,
    /// Smallest span of positions covering every term matched in the stream.
    WindowStream,
    /// Smallest span inside one phrase covering every term matched in the stream.
    WindowPhrase,
    /// Phrases with at least one hit.
    PhrasesMatched,
    /// Most distinct query terms in one phrase.
    PhrasesMaxDistinct,
    /// Okapi BM25 of this stream alone (selection constants).
    Bm25,
    /// `Bm25 / ((k1 + 1) · Σ idf)`.
    Bm25Norm,
    /// BM25F restricted to this stream (BM25F constants).
    Bm25f,
}

impl StreamFeature {
    /// Every stream feature, in catalogue order (`ALL[i] as usize == i`).
    pub const ALL: [StreamFeature; 26] = {
        use StreamFeature::*;
        [
            Length,
            OccurrencesSum,
            OccurrencesMin,
            OccurrencesMax,
            OccurrencesMean,
            OccurrencesDensity,
            FirstOccurrenceMin,
            FirstOccurrenceMax,
            FirstOccurrenceMinNorm,
            LastOccurrenceMin,
            LastOccurrenceMax,
            LastOccurrenceMaxNorm,
            DistinctTerms,
            DistinctTermsFraction,
            MatchedIdfSum,
            MatchedIdfFraction,
            InOrderBigrams,
            InOrderLongestRun,
            InOrderFullMatches,
            WindowStream,
            WindowPhrase,
            PhrasesMatched,
            PhrasesMaxDistinct,
            Bm25,
            Bm25Norm,
            Bm25f,
        ]
    };

    /// The name after `<stream>.`.
    pub fn suffix(self) -> &'static str {
        use StreamFeature::*;
        match self {
            Length => "length",
            OccurrencesSum => "occurrences.sum",
            OccurrencesMin => "occurrences.min",
            OccurrencesMax => "occurrences.max",
            OccurrencesMean => "occurrences.mean",
            OccurrencesDensity => "occurrences.density",
            FirstOccurrenceMin => "first_occurrence.min",
            FirstOccurrenceMax => "first_occurrence.max",
            FirstOccurrenceMinNorm => "first_occurrence.min_norm",
            LastOccurrenceMin => "last_occurrence.min",
            LastOccurrenceMax => "last_occurrence.max",
            LastOccurrenceMaxNorm => "last_occurrence.max_norm",
            DistinctTerms => "distinct_terms",
            DistinctTermsFraction => "distinct_terms.fraction",
            MatchedIdfSum => "matched_idf.sum",
            MatchedIdfFraction => "matched_idf.fraction",
            InOrderBigrams => "in_order.bigrams",
            InOrderLongestRun => "in_order.longest_run",
            InOrderFullMatches => "in_order.full_matches",
            WindowStream => "window.stream",
            WindowPhrase => "window.phrase",
            PhrasesMatched => "phrases.matched",
            PhrasesMaxDistinct => "phrases.max_distinct",
            Bm25 => "bm25",
            Bm25Norm => "bm25.norm",
            Bm25f => "bm25f",
        }
    }

    /// Catalogue index of this feature for catalogue stream `stream` (an index into [`STREAMS`]).
    pub fn index(self, stream: usize) -> usize {
        stream * StreamFeature::ALL.len() + self as usize
    }
}

/// Features published once per document (over the catalogue streams), after the streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum DocFeature {
    /// Σ of the catalogue streams' lengths.
    Length,
    /// Hits of all query terms in all catalogue streams.
    OccurrencesSum,
    /// Least per-term hit count (summed over streams) over the query's terms.
    OccurrencesMin,
    /// Largest per-term hit count (summed over streams).
    OccurrencesMax,
    /// Query terms with a hit in some catalogue stream.
    DistinctTerms,
    /// `DistinctTerms / Q`.
    DistinctTermsFraction,
    /// Sum of the idf of the terms matched in some stream.
    MatchedIdfSum,
    /// `MatchedIdfSum / Σ idf`.
    MatchedIdfFraction,
    /// Catalogue streams with at least one hit.
    StreamsMatched,
    /// Σ over streams of in-order bigram matches.
    InOrderBigrams,
    /// Largest in-order run over streams.
    InOrderLongestRun,
    /// Σ over streams of whole-query phrase matches.
    InOrderFullMatches,
    /// BM25F over the catalogue streams (a dependent feature).
    Bm25f,
    /// `Bm25f / Σ idf`.
    Bm25fNorm,
    /// The query's term count Q.
    QueryTerms,
}

impl DocFeature {
    /// Every document feature, in catalogue order (`ALL[i] as usize == i`).
    pub const ALL: [DocFeature; 15] = {
        use DocFeature::*;
        [
            Length,
            OccurrencesSum,
            OccurrencesMin,
            OccurrencesMax,
            DistinctTerms,
            DistinctTermsFraction,
            MatchedIdfSum,
            MatchedIdfFraction,
            StreamsMatched,
            InOrderBigrams,
            InOrderLongestRun,
            InOrderFullMatches,
            Bm25f,
            Bm25fNorm,
            QueryTerms,
        ]
    };

    /// The name after `doc.`.
    pub fn suffix(self) -> &'static str {
        use DocFeature::*;
        match self {
            Length => "length",
            OccurrencesSum => "occurrences.sum",
            OccurrencesMin => "occurrences.min",
            OccurrencesMax => "occurrences.max",
            DistinctTerms => "distinct_terms",
            DistinctTermsFraction => "distinct_terms.fraction",
            MatchedIdfSum => "matched_idf.sum",
            MatchedIdfFraction => "matched_idf.fraction",
            StreamsMatched => "streams.matched",
            InOrderBigrams => "in_order.bigrams",
            InOrderLongestRun => "in_order.longest_run",
            InOrderFullMatches => "in_order.full_matches",
            Bm25f => "bm25f",
            Bm25fNorm => "bm25f.norm",
            QueryTerms => "query_terms",
        }
    }

    /// Catalogue index of this feature.
    pub fn index(self) -> usize {
        STREAM_FEATURE_COUNT + self as usize
    }
}

/// Number of per-stream features in the catalogue (all streams).
pub const STREAM_FEATURE_COUNT: usize = STREAMS.len() * StreamFeature::ALL.len();

/// Number of features in the catalogue.
pub const CATALOGUE_LEN: usize = STREAM_FEATURE_COUNT + DocFeature::ALL.len();

/// The feature catalogue: every name feature extraction publishes, in catalogue order
/// (module docs). Definitions are in `docs/features.md`.
pub fn feature_names() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut names = Vec::with_capacity(CATALOGUE_LEN);
        for stream in STREAMS {
            for feature in StreamFeature::ALL {
                names.push(format!("{stream}.{}", feature.suffix()));
            }
        }
        for feature in DocFeature::ALL {
            names.push(format!("doc.{}", feature.suffix()));
        }
        names
    })
}

/// Catalogue index of `name`, if it is a catalogue feature.
pub fn catalogue_index(name: &str) -> Option<usize> {
    static INDEX: OnceLock<std::collections::HashMap<&'static str, usize>> = OnceLock::new();
    INDEX
        .get_or_init(|| {
            feature_names()
                .iter()
                .enumerate()
                .map(|(i, n)| (n.as_str(), i))
                .collect()
        })
        .get(name)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_slots_follow_the_catalogue() {
        for (i, name) in STREAMS.iter().enumerate() {
            assert_eq!(stream_slot(name), Some(i));
        }
        assert_eq!(stream_slot("headings"), None);
    }

    #[test]
    fn all_arrays_are_in_declaration_order() {
        for (i, f) in StreamFeature::ALL.iter().enumerate() {
            assert_eq!(*f as usize, i);
        }
        for (i, f) in DocFeature::ALL.iter().enumerate() {
            assert_eq!(*f as usize, i);
        }
    }

    #[test]
    fn catalogue_has_at_least_100_unique_names_in_order() {
        let names = feature_names();
        assert_eq!(names.len(), CATALOGUE_LEN);
        assert!(names.len() >= 100, "{}", names.len());
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        assert_eq!(names[0], "title.length");
        assert_eq!(names[StreamFeature::Bm25f.index(1)], "body.bm25f");
        assert_eq!(names[DocFeature::Bm25f.index()], "doc.bm25f");
        assert_eq!(
            names[StreamFeature::FirstOccurrenceMin.index(0)],
            "title.first_occurrence.min"
        );
        for (i, n) in names.iter().enumerate() {
            assert_eq!(catalogue_index(n), Some(i));
            assert!(!n.starts_with(STATIC_PREFIX));
        }
        assert_eq!(catalogue_index("body.nonsense"), None);
    }

    #[test]
    fn docs_list_every_feature_in_catalogue_order() {
        let doc = include_str!("../../../docs/features.md");
        let (_, list) = doc
            .split_once("## Full list")
            .expect("docs/features.md has a full list");
        let listed: Vec<&str> = list
            .lines()
            .filter_map(|line| line.split_once(". `"))
            .map(|(_, rest)| rest.trim_end_matches('`'))
            .collect();
        assert_eq!(listed, feature_names());
        // and every suffix has its definition row
        for f in StreamFeature::ALL {
            assert!(
                doc.contains(&format!("| `{}` |", f.suffix())),
                "{}",
                f.suffix()
            );
        }
        for f in DocFeature::ALL {
            assert!(
                doc.contains(&format!("| `{}` |", f.suffix())),
                "{}",
                f.suffix()
            );
        }
    }
}
