//! Hit requests (DESIGN §5 "Tokens, phrases, hits"): one document seen by one query, as
//! streams → phrases → word hits, plus the query's term count and idf and the corpus's average
//! stream lengths; and their validation errors.
//!
//! # Validation rules
//! - the query's `idf` has exactly `terms` values, each finite;
//! - every `avg_length` is finite and > 0 (a catalogue stream missing from `avg_length` gets no
//!   length normalisation: its BM25/BM25F length factor is 1);
//! - in every stream (catalogue or not), every hit `[term, position]` has `term < Q` and
//!   `position < length`, and positions strictly increase along the stream: within a phrase
//!   *and across phrases* (phrases are listed in stream order and do not overlap, so two hits
//!   never share a position);
//! - stream names are free: any name is accepted and validated, but only the catalogue streams
//!   ([`super::STREAMS`]) publish features. Empty phrases are allowed and ignored.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::catalogue::{stream_slot, STREAMS};

/// One document seen by one query: its streams' hits and its static features.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HitDocument {
    /// The caller's document id, echoed in errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Streams by name (`title`, `body`, `anchor`, `url`, or any other).
    #[serde(default)]
    #[schema(value_type = BTreeMap<String, HitStream>)]
    pub streams: Streams,
    /// Static features by name without the `static.` prefix (`static_rank` feeds
    /// `static.static_rank`).
    #[serde(default, rename = "static")]
    pub static_features: BTreeMap<String, f64>,
}

/// A document's streams by name. On the wire a map from name to [`HitStream`]; in memory the
/// catalogue streams ([`STREAMS`]) sit in fixed slots, so that decoding one allocates no name
/// and FE finds them without a lookup, and other names in a map. As in a map, a name given
/// twice keeps its last stream.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Streams {
    /// By catalogue slot (the index in [`STREAMS`]).
    catalogue: [Option<HitStream>; STREAMS.len()],
    /// Streams outside the catalogue, by name.
    others: BTreeMap<String, HitStream>,
}

impl Streams {
    /// The stream called `name`.
    pub fn get(&self, name: &str) -> Option<&HitStream> {
        match stream_slot(name) {
            Some(slot) => self.catalogue[slot].as_ref(),
            None => self.others.get(name),
        }
    }

    /// The catalogue stream of `slot` (its index in [`STREAMS`]).
    ///
    /// # Panics
    /// When `slot >= STREAMS.len()`.
    pub fn slot(&self, slot: usize) -> Option<&HitStream> {
        self.catalogue[slot].as_ref()
    }

    /// The streams outside the catalogue, in name order.
    pub fn others(&self) -> impl Iterator<Item = (&str, &HitStream)> {
        self.others.iter().map(|(name, s)| (name.as_str(), s))
    }

    /// Sets the stream called `name`, replacing any stream of that name.
    pub fn insert(&mut self, name: &str, stream: HitStream) {
        match stream_slot(name) {
            Some(slot) => {
                self.set_slot(slot, stream);
            }
            None => {
                self.others.insert(name.to_string(), stream);
            }
        }
    }

    /// Sets the catalogue stream of `slot` (its index in [`STREAMS`]), returning the one it
    /// replaces.
    ///
    /// # Panics
    /// When `slot >= STREAMS.len()`.
    pub(crate) fn set_slot(&mut self, slot: usize, stream: HitStream) -> Option<HitStream> {
        self.catalogue[slot].replace(stream)
    }

    /// The catalogue stream of `slot`, taken from `spare` (or new) when absent, for a decoder
    /// that reads a stream into it in place (`api::msgpack_rank`).
    ///
    /// # Panics
    /// When `slot >= STREAMS.len()`.
    pub(crate) fn slot_mut(&mut self, slot: usize, spare: &mut Vec<HitStream>) -> &mut HitStream {
        self.catalogue[slot].get_or_insert_with(|| spare.pop().unwrap_or_default())
    }

    /// The stream outside the catalogue called `name`, new when absent, for a decoder that
    /// reads a stream into it in place.
    pub(crate) fn other_mut(&mut self, name: &str) -> &mut HitStream {
        self.others.entry(name.to_string()).or_default()
    }

    /// Removes every stream, moving the catalogue streams onto `spare` (a decoder that reuses
    /// their vectors; `api::msgpack_rank`).
    pub(crate) fn clear_into(&mut self, spare: &mut Vec<HitStream>) {
        spare.extend(self.catalogue.iter_mut().filter_map(Option::take));
        self.others.clear();
    }

    /// Every stream, in name order (the order of the wire's map).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &HitStream)> {
        let catalogue = STREAMS
            .iter()
            .zip(&self.catalogue)
            .filter_map(|(name, s)| Some((*name, s.as_ref()?)));
        let mut all: Vec<(&str, &HitStream)> = catalogue.chain(self.others()).collect();
        all.sort_unstable_by_key(|&(name, _)| name);
        all.into_iter()
    }

    /// Number of streams.
    pub fn len(&self) -> usize {
        self.catalogue.iter().flatten().count() + self.others.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::ops::Index<&str> for Streams {
    type Output = HitStream;

    /// # Panics
    /// When there is no stream called `name`.
    fn index(&self, name: &str) -> &HitStream {
        self.get(name)
            .unwrap_or_else(|| panic!("no stream called {name:?}"))
    }
}

impl<S: AsRef<str>> FromIterator<(S, HitStream)> for Streams {
    fn from_iter<I: IntoIterator<Item = (S, HitStream)>>(iter: I) -> Self {
        let mut streams = Streams::default();
        for (name, stream) in iter {
            streams.insert(name.as_ref(), stream);
        }
        streams
    }
}

impl<S: AsRef<str>, const N: usize> From<[(S, HitStream); N]> for Streams {
    fn from(streams: [(S, HitStream); N]) -> Self {
        streams.into_iter().collect()
    }
}

impl Serialize for Streams {
    fn serialize<Ser: Serializer>(&self, serializer: Ser) -> Result<Ser::Ok, Ser::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (name, stream) in self.iter() {
            map.serialize_entry(name, stream)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Streams {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(StreamsVisitor)
    }
}

struct StreamsVisitor;

impl<'de> Visitor<'de> for StreamsVisitor {
    type Value = Streams;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Streams, A::Error> {
        let mut streams = Streams::default();
        while let Some(name) = map.next_key::<StreamName>()? {
            let stream = map.next_value::<HitStream>()?;
            match name {
                StreamName::Catalogue(slot) => {
                    streams.set_slot(slot, stream);
                }
                StreamName::Other(name) => {
                    streams.others.insert(name, stream);
                }
            }
        }
        Ok(streams)
    }
}

/// A stream's name as decoded: a catalogue slot (no allocation) or another name.
enum StreamName {
    Catalogue(usize),
    Other(String),
}

impl<'de> Deserialize<'de> for StreamName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(StreamNameVisitor)
    }
}

struct StreamNameVisitor;

impl Visitor<'_> for StreamNameVisitor {
    type Value = StreamName;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<StreamName, E> {
        Ok(match stream_slot(name) {
            Some(slot) => StreamName::Catalogue(slot),
            None => StreamName::Other(name.to_string()),
        })
    }

    fn visit_string<E: serde::de::Error>(self, name: String) -> Result<StreamName, E> {
        Ok(match stream_slot(&name) {
            Some(slot) => StreamName::Catalogue(slot),
            None => StreamName::Other(name),
        })
    }
}

/// One stream of a document: its length in tokens and the query-term hits, phrase by phrase.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HitStream {
    /// Number of tokens in the stream (hit positions are offsets in `0..length`).
    pub length: u32,
    /// Per phrase, its hits as `[term index, position]` in position order.
    #[serde(default)]
    #[schema(value_type = Vec<Vec<[u32; 2]>>)]
    pub phrases: Phrases,
}

impl HitStream {
    /// A stream of `length` tokens with these phrases' hits.
    pub fn new<P: AsRef<[[u32; 2]]>>(length: u32, phrases: impl IntoIterator<Item = P>) -> Self {
        HitStream {
            length,
            phrases: phrases.into_iter().collect(),
        }
    }
}

/// A stream's phrases. On the wire a list of phrases, each a list of `[term, position]` hits;
/// in memory every hit of the stream in one vector and where each phrase ends in it, so that
/// decoding a stream makes two allocations however many phrases it has.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Phrases {
    /// Every hit, phrase after phrase.
    hits: Vec<[u32; 2]>,
    /// Per phrase, the end (exclusive) of its hits in `hits`; empty phrases repeat the end.
    ends: Vec<usize>,
}

impl Phrases {
    /// No phrases.
    pub const fn new() -> Self {
        Phrases {
            hits: Vec::new(),
            ends: Vec::new(),
        }
    }

    /// Number of phrases (empty ones included).
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are no phrases.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Every hit of the stream, phrase after phrase.
    pub fn hits(&self) -> &[[u32; 2]] {
        &self.hits
    }

    /// Per phrase, the end (exclusive) of its hits in [`Phrases::hits`]: non-decreasing, an
    /// empty phrase's equal to the one before.
    pub fn ends(&self) -> &[usize] {
        &self.ends
    }

    /// Each phrase's hits, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[[u32; 2]]> {
        (0..self.ends.len()).map(|phrase| &self[phrase])
    }

    /// Removes every phrase, keeping the vectors.
    pub fn clear(&mut self) {
        self.hits.clear();
        self.ends.clear();
    }

    /// Appends a phrase.
    pub fn push(&mut self, phrase: &[[u32; 2]]) {
        self.hits.extend_from_slice(phrase);
        self.ends.push(self.hits.len());
    }

    /// Every hit and, per phrase, the end (exclusive) of its hits in the former, for a decoder
    /// that fills both in one pass and reuses their capacity (`api::msgpack_rank`). It keeps
    /// the ends non-decreasing and the last one equal to the number of hits.
    pub(crate) fn parts_mut(&mut self) -> (&mut Vec<[u32; 2]>, &mut Vec<usize>) {
        (&mut self.hits, &mut self.ends)
    }
}

impl std::ops::Index<usize> for Phrases {
    type Output = [[u32; 2]];

    /// # Panics
    /// When there is no phrase `phrase`.
    fn index(&self, phrase: usize) -> &[[u32; 2]] {
        let start = phrase.checked_sub(1).map_or(0, |p| self.ends[p]);
        &self.hits[start..self.ends[phrase]]
    }
}

impl<P: AsRef<[[u32; 2]]>> FromIterator<P> for Phrases {
    fn from_iter<I: IntoIterator<Item = P>>(iter: I) -> Self {
        let mut phrases = Phrases::default();
        for phrase in iter {
            phrases.push(phrase.as_ref());
        }
        phrases
    }
}

impl Serialize for Phrases {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for phrase in self.iter() {
            seq.serialize_element(phrase)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Phrases {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(PhrasesVisitor)
    }
}

/// Visits the list of phrases, appending each phrase's hits to one vector.
struct PhrasesVisitor;

impl<'de> Visitor<'de> for PhrasesVisitor {
    type Value = Phrases;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Phrases, A::Error> {
        let mut phrases = Phrases::default();
        phrases.ends.reserve(seq.size_hint().unwrap_or(0).min(4096));
        while seq
            .next_element_seed(PhraseSeed(&mut phrases.hits))?
            .is_some()
        {
            phrases.ends.push(phrases.hits.len());
        }
        Ok(phrases)
    }
}

/// Decodes one phrase (a list of hits) onto the end of the stream's hits.
struct PhraseSeed<'a>(&'a mut Vec<[u32; 2]>);

impl<'de> DeserializeSeed<'de> for PhraseSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for PhraseSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.reserve(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(hit) = seq.next_element::<[u32; 2]>()? {
            self.0.push(hit);
        }
        Ok(())
    }
}

/// The query side of a hit request.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryInfo {
    /// Number of query terms Q; hits name terms `0..Q`.
    pub terms: u32,
    /// Inverse document frequency of each query term (Q values).
    pub idf: Vec<f64>,
}

/// Corpus statistics for length normalisation (BM25, BM25F).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CorpusStats {
    /// Average length of each stream over the corpus, by stream name.
    #[serde(default)]
    pub avg_length: BTreeMap<String, f64>,
}

/// Which document an error is about: its index in the batch and its id, when known.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DocRef {
    /// Index in the batch (absent for a single-document call).
    pub index: Option<usize>,
    /// The document's `id`, when it has one.
    pub id: Option<String>,
}

impl fmt::Display for DocRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("document")?;
        if let Some(index) = self.index {
            write!(f, " {index}")?;
        }
        if let Some(id) = &self.id {
            // The client's id, cut: it is echoed in the reply and the log.
            write!(f, " (id {:?})", crate::rank::cut_input(id))?;
        }
        Ok(())
    }
}

/// Where a hit sits: document, stream, phrase and hit index within the phrase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HitRef {
    /// The document.
    pub doc: DocRef,
    /// Stream name.
    pub stream: String,
    /// Phrase index within the stream.
    pub phrase: usize,
    /// Hit index within the phrase.
    pub hit: usize,
}

impl fmt::Display for HitRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, streams.{}.phrases[{}][{}]",
            self.doc,
            crate::rank::cut_input(&self.stream),
            self.phrase,
            self.hit
        )
    }
}

/// A rejected hit request (an HTTP 400). Each variant names where and what was expected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HitError {
    /// A hit's term index is not below the query's term count.
    #[error("{at}: term index {term} out of range: the query has {terms} terms")]
    TermOutOfRange {
        /// Where.
        at: HitRef,
        /// The term index given.
        term: u32,
        /// The query's term count Q.
        terms: u32,
    },
    /// A hit's position is not below its stream's length.
    #[error("{at}: position {position} out of range: the stream's length is {length}")]
    PositionOutOfRange {
        /// Where.
        at: HitRef,
        /// The position given.
        position: u32,
        /// The stream's length.
        length: u32,
    },
    /// A hit's position is not greater than the previous hit's in the same stream.
    #[error(
        "{at}: position {position} out of order: expected > {previous}, the previous hit's \
         position in this stream (positions strictly increase within and across phrases)"
    )]
    PositionNotIncreasing {
        /// Where.
        at: HitRef,
        /// The position given.
        position: u32,
        /// The previous hit's position in the stream.
        previous: u32,
    },
    /// The query's idf list does not have one value per term.
    #[error("query.idf has {got} values, expected {expected} (query.terms)")]
    IdfLength {
        /// Q.
        expected: u32,
        /// Values given.
        got: usize,
    },
    /// An idf value is NaN or infinite.
    #[error("query.idf[{index}] is {value}, expected a finite number")]
    IdfNotFinite {
        /// Term index.
        index: usize,
        /// The value given.
        value: f64,
    },
    /// An average stream length is not a finite positive number.
    #[error("stats.avg_length.{stream} is {value}, expected a finite number > 0")]
    BadAvgLength {
        /// Stream name.
        stream: String,
        /// The value given.
        value: f64,
    },
    /// The output buffer does not fit the documents × the resolver's features.
    #[error("output buffer has {got} values, expected {expected} ({docs} documents × {features} features)")]
    OutputLength {
        /// Values expected.
        expected: usize,
        /// Values given.
        got: usize,
        /// Documents in the batch.
        docs: usize,
        /// Features per document.
        features: usize,
    },
}

impl HitError {
    /// The same error with the document's batch index filled in.
    pub fn at_index(mut self, index: usize) -> Self {
        match &mut self {
            HitError::TermOutOfRange { at, .. }
            | HitError::PositionOutOfRange { at, .. }
            | HitError::PositionNotIncreasing { at, .. } => at.doc.index = Some(index),
            HitError::IdfLength { .. }
            | HitError::IdfNotFinite { .. }
            | HitError::BadAvgLength { .. }
            | HitError::OutputLength { .. } => {}
        }
        self
    }
}

/// Checks the query side: one finite idf per term.
///
/// # Errors
/// [`HitError::IdfLength`], [`HitError::IdfNotFinite`].
pub fn validate_query(query: &QueryInfo) -> Result<(), HitError> {
    if query.idf.len() != query.terms as usize {
        return Err(HitError::IdfLength {
            expected: query.terms,
            got: query.idf.len(),
        });
    }
    match query.idf.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(HitError::IdfNotFinite {
            index,
            value: query.idf[index],
        }),
        None => Ok(()),
    }
}

/// Checks the corpus statistics: every average length finite and > 0.
///
/// # Errors
/// [`HitError::BadAvgLength`].
pub fn validate_stats(stats: &CorpusStats) -> Result<(), HitError> {
    match stats
        .avg_length
        .iter()
        .find(|(_, v)| !(v.is_finite() && **v > 0.0))
    {
        Some((stream, value)) => Err(HitError::BadAvgLength {
            stream: crate::rank::cut_input(stream).into_owned(),
            value: *value,
        }),
        None => Ok(()),
    }
}

/// Checks one stream's hits against the rules in the module docs (used for streams that
/// publish no features; the FSM walk checks catalogue streams as it goes).
///
/// # Errors
/// [`HitError::TermOutOfRange`], [`HitError::PositionOutOfRange`],
/// [`HitError::PositionNotIncreasing`], naming the first bad hit.
pub fn validate_stream(
    doc: &HitDocument,
    name: &str,
    stream: &HitStream,
    terms: u32,
) -> Result<(), HitError> {
    let mut previous = None;
    for (phrase, hits) in stream.phrases.iter().enumerate() {
        for (hit, &[term, position]) in hits.iter().enumerate() {
            check_hit(
                doc,
                name,
                stream.length,
                terms,
                previous,
                phrase,
                hit,
                term,
                position,
            )?;
            previous = Some(position);
        }
    }
    Ok(())
}

/// Checks every stream of `doc`, catalogue or not, for paths that do not walk the hits on the
/// CPU (the GPU's). The order is the CPU walk's, so both report the same first error: streams
/// outside the catalogue in name order, then the catalogue streams in catalogue order.
///
/// # Errors
/// As [`validate_stream`], for the first bad hit; the error has no batch index.
pub fn validate_document(doc: &HitDocument, terms: u32) -> Result<(), HitError> {
    for (name, stream) in doc.streams.others() {
        validate_stream(doc, name, stream, terms)?;
    }
    for (slot, name) in STREAMS.iter().enumerate() {
        if let Some(stream) = doc.streams.slot(slot) {
            validate_stream(doc, name, stream, terms)?;
        }
    }
    Ok(())
}

/// Checks one hit: term in range, position in range and after `previous`.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn check_hit(
    doc: &HitDocument,
    stream: &str,
    length: u32,
    terms: u32,
    previous: Option<u32>,
    phrase: usize,
    hit: usize,
    term: u32,
    position: u32,
) -> Result<(), HitError> {
    let at = || HitRef {
        doc: DocRef {
            index: None,
            id: doc.id.clone(),
        },
        stream: stream.to_string(),
        phrase,
        hit,
    };
    if term >= terms {
        return Err(HitError::TermOutOfRange {
            at: at(),
            term,
            terms,
        });
    }
    if position >= length {
        return Err(HitError::PositionOutOfRange {
            at: at(),
            position,
            length,
        });
    }
    if let Some(previous) = previous {
        if position <= previous {
            return Err(HitError::PositionNotIncreasing {
                at: at(),
                position,
                previous,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(q: u32) -> QueryInfo {
        QueryInfo {
            terms: q,
            idf: vec![1.0; q as usize],
        }
    }

    fn one_stream(name: &str, length: u32, phrases: Vec<Vec<[u32; 2]>>) -> HitDocument {
        HitDocument {
            id: Some("d42".into()),
            streams: [(name, HitStream::new(length, phrases))].into(),
            static_features: BTreeMap::new(),
        }
    }

    fn check(doc: &HitDocument, q: u32) -> Result<(), HitError> {
        doc.streams
            .iter()
            .try_for_each(|(name, s)| validate_stream(doc, name, s, q))
    }

    #[test]
    fn parses_the_design_example() {
        let json = r#"{"id": "d42",
            "streams": {"title": {"length": 9,  "phrases": [[[0, 1], [1, 2]]]},
                        "body":  {"length": 312, "phrases": [[[0, 10], [0, 12], [1, 13]], [[1, 40]]]}},
            "static": {"static_rank": 0.7}}"#;
        let doc: HitDocument = serde_json::from_str(json).expect("valid");
        assert_eq!(doc.id.as_deref(), Some("d42"));
        assert_eq!(doc.streams["body"].phrases[0][2], [1, 13]);
        assert_eq!(doc.static_features["static_rank"], 0.7);
        check(&doc, 2).expect("valid hits");
        let q: QueryInfo =
            serde_json::from_str(r#"{"terms": 2, "idf": [1.5, 2.5]}"#).expect("valid");
        validate_query(&q).expect("valid");
        let s: CorpusStats =
            serde_json::from_str(r#"{"avg_length": {"title": 9.8, "body": 402.0}}"#)
                .expect("valid");
        validate_stats(&s).expect("valid");
    }

    #[test]
    fn round_trips_through_messagepack() {
        let doc = one_stream("body", 10, vec![vec![[0, 1], [1, 3]], vec![]]);
        let bytes = rmp_serde::to_vec_named(&doc).expect("serializable");
        let back: HitDocument = rmp_serde::from_slice(&bytes).expect("round trip");
        assert_eq!(back, doc);
    }

    #[test]
    fn flat_form_keeps_the_wire_form() {
        let wire = serde_json::json!({"id": "d42",
            "streams": {"title": {"length": 9, "phrases": [[[0, 1], [1, 2]]]},
                        "headings": {"length": 4, "phrases": [[], [[1, 3]]]},
                        "body": {"length": 312, "phrases": [[[0, 10], [0, 12], [1, 13]], [[1, 40]]]}},
            "static": {"static_rank": 0.7}});
        let doc: HitDocument = serde_json::from_value(wire.clone()).expect("valid");
        assert_eq!(doc.streams["body"].phrases[1], [[1, 40]]);
        assert_eq!(doc.streams["headings"].phrases.len(), 2);
        assert_eq!(serde_json::to_value(&doc).expect("serializable"), wire);
        let bytes = rmp_serde::to_vec_named(&wire).expect("serializable");
        let back: HitDocument = rmp_serde::from_slice(&bytes).expect("valid");
        assert_eq!(back, doc);
        let names: Vec<&str> = doc.streams.iter().map(|(name, _)| name).collect();
        assert_eq!(names, ["body", "headings", "title"]);
    }

    #[test]
    fn malformed_phrases_are_rejected_as_the_nested_form_was() {
        /// The wire types as plain derives over nested vectors and maps (the form before
        /// `Phrases` and `Streams`), named alike so that messages compare equal.
        #[allow(dead_code)]
        mod nested {
            use serde::Deserialize;
            use std::collections::BTreeMap;

            #[derive(Debug, Deserialize)]
            #[serde(deny_unknown_fields)]
            pub struct HitStream {
                length: u32,
                #[serde(default)]
                phrases: Vec<Vec<[u32; 2]>>,
            }

            #[derive(Debug, Deserialize)]
            pub struct HitDocument {
                streams: BTreeMap<String, HitStream>,
            }
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct HitDocument {
            streams: Streams,
        }
        let msgpack = |json: &str| {
            rmp_serde::to_vec_named(&serde_json::from_str::<serde_json::Value>(json).unwrap())
                .unwrap()
        };
        for json in [
            r#"{"streams": 5}"#,
            r#"{"streams": {"body": 5}}"#,
            r#"{"streams": {"x": {"length": -1}}}"#,
        ] {
            let flat = serde_json::from_str::<HitDocument>(json).unwrap_err();
            let nested = serde_json::from_str::<nested::HitDocument>(json).unwrap_err();
            assert_eq!(flat.to_string(), nested.to_string(), "{json}");
            let flat = rmp_serde::from_slice::<HitDocument>(&msgpack(json)).unwrap_err();
            let nested = rmp_serde::from_slice::<nested::HitDocument>(&msgpack(json)).unwrap_err();
            assert_eq!(flat.to_string(), nested.to_string(), "{json}");
        }
        // A MessagePack map key that is not a string.
        let bytes = [
            0x81, 0xa7, b's', b't', b'r', b'e', b'a', b'm', b's', 0x81, 0x01, 0x80,
        ];
        let flat = rmp_serde::from_slice::<HitDocument>(&bytes).unwrap_err();
        let nested = rmp_serde::from_slice::<nested::HitDocument>(&bytes).unwrap_err();
        assert_eq!(flat.to_string(), nested.to_string());
        for json in [
            r#"{"length": 3, "phrases": [5]}"#,
            r#"{"length": 3, "phrases": 5}"#,
            r#"{"length": 3, "phrases": [[[0]]]}"#,
            r#"{"length": 3, "phrases": [[[0, 1, 2]]]}"#,
            r#"{"length": 3, "phrases": [[[0, -1]]]}"#,
            r#"{"length": 3, "phrases": [], "x": 1}"#,
        ] {
            let flat = serde_json::from_str::<HitStream>(json).unwrap_err();
            let nested = serde_json::from_str::<nested::HitStream>(json).unwrap_err();
            assert_eq!(flat.to_string(), nested.to_string(), "{json}");
            let flat = rmp_serde::from_slice::<HitStream>(&msgpack(json)).unwrap_err();
            let nested = rmp_serde::from_slice::<nested::HitStream>(&msgpack(json)).unwrap_err();
            assert_eq!(flat.to_string(), nested.to_string(), "{json}");
        }
    }

    #[test]
    fn a_stream_named_twice_keeps_the_last() {
        let doc: HitDocument = serde_json::from_str(
            r#"{"streams": {"body": {"length": 1}, "x": {"length": 1},
                            "body": {"length": 2}, "x": {"length": 3}}}"#,
        )
        .expect("valid");
        assert_eq!(doc.streams["body"].length, 2);
        assert_eq!(doc.streams["x"].length, 3);
        assert_eq!(doc.streams.len(), 2);
    }

    #[test]
    fn rejects_unknown_fields() {
        let err = serde_json::from_str::<HitDocument>(r#"{"stream": {}}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `stream`"), "{err}");
    }

    #[test]
    fn rejects_term_index_out_of_range() {
        let doc = one_stream("body", 10, vec![vec![[0, 1]], vec![[1, 4], [2, 6]]]);
        let err = check(&doc, 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "document (id \"d42\"), streams.body.phrases[1][1]: term index 2 out of range: \
             the query has 2 terms"
        );
    }

    #[test]
    fn rejects_position_out_of_range() {
        let doc = one_stream("title", 5, vec![vec![[0, 5]]]);
        assert_eq!(
            check(&doc, 1).unwrap_err().to_string(),
            "document (id \"d42\"), streams.title.phrases[0][0]: position 5 out of range: \
             the stream's length is 5"
        );
    }

    #[test]
    fn rejects_repeated_position_within_a_phrase() {
        let doc = one_stream("body", 10, vec![vec![[0, 3], [1, 3]]]);
        assert!(matches!(
            check(&doc, 2),
            Err(HitError::PositionNotIncreasing { position: 3, previous: 3, ref at }) if at.hit == 1
        ));
    }

    #[test]
    fn rejects_positions_decreasing_across_phrases() {
        let doc = one_stream("body", 10, vec![vec![[0, 4]], vec![], vec![[1, 2]]]);
        assert_eq!(
            check(&doc, 2).unwrap_err().to_string(),
            "document (id \"d42\"), streams.body.phrases[2][0]: position 2 out of order: \
             expected > 4, the previous hit's position in this stream (positions strictly \
             increase within and across phrases)"
        );
    }

    #[test]
    fn rejects_idf_of_wrong_length() {
        let q = QueryInfo {
            terms: 3,
            idf: vec![1.0, 2.0],
        };
        assert_eq!(
            validate_query(&q).unwrap_err().to_string(),
            "query.idf has 2 values, expected 3 (query.terms)"
        );
    }

    #[test]
    fn rejects_non_finite_idf() {
        let q = QueryInfo {
            terms: 2,
            idf: vec![1.0, f64::INFINITY],
        };
        assert_eq!(
            validate_query(&q).unwrap_err(),
            HitError::IdfNotFinite {
                index: 1,
                value: f64::INFINITY
            }
        );
    }

    #[test]
    fn rejects_non_positive_average_length() {
        let s = CorpusStats {
            avg_length: [("anchor".to_string(), 0.0)].into(),
        };
        assert_eq!(
            validate_stats(&s).unwrap_err().to_string(),
            "stats.avg_length.anchor is 0, expected a finite number > 0"
        );
    }

    #[test]
    fn accepts_any_stream_name_and_empty_phrases() {
        let doc = one_stream("headings", 3, vec![vec![], vec![[0, 2]]]);
        check(&doc, 1).expect("valid");
        validate_query(&query(0)).expect("an empty query is valid");
    }

    #[test]
    fn error_names_the_batch_index_once_known() {
        let doc = one_stream("url", 2, vec![vec![[0, 2]]]);
        let err = check(&doc, 1).unwrap_err().at_index(7);
        assert!(
            err.to_string()
                .starts_with("document 7 (id \"d42\"), streams.url.phrases[0][0]"),
            "{err}"
        );
    }
}
