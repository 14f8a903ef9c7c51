//! The forward index (`forward.bin`): per document, its streams' phrase lengths, then every
//! token's term as a varint code, the most frequent terms in the fewest bytes. What builds hit
//! requests for the ranker (DESIGN §5); selection never reads it. Opened and checked by
//! [`super::reader::Index::open`], which serves it through `Index::forward_doc` and
//! `Index::hits`.
//!
//! ```text
//! document   n_streams, then per stream: stream number, n_phrases, n_phrases phrase lengths
//!            (the stream's length is their sum); then every stream's codes, streams in that
//!            order, one code per position                                  (all LEB128 varints)
//! code       rank r of the term when it is among the TOP_TERMS most frequent (section 2 lists
//!            them by rank), else TOP + term id, TOP = section 2's length
//! ```
//!
//! `hits` does not decode the codes: it searches the document's code bytes for the query terms'
//! own encodings, eight bytes at a time (a varint's last byte is the one with its high bit clear,
//! so a token starts after such a byte and its index is their count before it). Searching
//! compressed text for a word's codeword this way is Brisaboa et al.'s "directly searchable"
//! dense codes ("Lightweight natural language text compression", Information Retrieval 2007),
//! whose ETDC is LEB128 over frequency ranks.

use std::collections::HashMap;
use std::path::Path;

use foldhash::fast::FixedState;

use super::format::MappedFile;
use super::{DocId, IndexError, TermId};

/// Container kind of `forward.bin`.
pub const KIND_FORWARD: [u8; 4] = *b"FWDX";

/// How many of the most frequent terms get codes of their own (their rank): every code below
/// 2¹⁴ is a varint of at most two bytes, and above it three bytes cover up to 2²¹ whatever the
/// order, so ranking more terms would not shorten any code. The other terms' codes are their ids
/// shifted past the ranked ones.
pub const TOP_TERMS: usize = 1 << 14;

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

/// Term ids to codes and back ([`TOP_TERMS`]).
#[derive(Default)]
pub struct TermCodes {
    /// The ranked terms, most frequent first: code `r` is `top[r]`.
    top: Vec<TermId>,
    /// Each ranked term's rank.
    rank: HashMap<TermId, u32, FixedState>,
}

impl std::fmt::Debug for TermCodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TermCodes {{ {} ranked terms }}", self.top.len())
    }
}

impl TermCodes {
    /// The codes of an index whose terms have collection frequencies `cf` (indexed by term id):
    /// the `min(TOP_TERMS, cf.len())` terms of largest frequency ranked, ties by smaller id.
    pub fn by_frequency(cf: &[u64]) -> Self {
        let mut top: Vec<TermId> = (0..cf.len() as TermId).collect();
        let n_top = TOP_TERMS.min(top.len());
        let by = |&t: &TermId| (std::cmp::Reverse(cf[t as usize]), t);
        if n_top < top.len() {
            top.select_nth_unstable_by_key(n_top, by);
            top.truncate(n_top);
        }
        top.sort_unstable_by_key(by);
        Self::from_top(top).expect("distinct ids")
    }

    /// The codes whose ranked terms are `top`; `None` when an id is there twice.
    fn from_top(top: Vec<TermId>) -> Option<Self> {
        let mut rank = HashMap::with_capacity_and_hasher(top.len(), FixedState::default());
        for (r, &t) in top.iter().enumerate() {
            if rank.insert(t, r as u32).is_some() {
                return None;
            }
        }
        Some(Self { top, rank })
    }

    /// The ranked terms, most frequent first (`forward.bin`'s section 2).
    pub fn top(&self) -> &[TermId] {
        &self.top
    }

    /// Term `t`'s code.
    pub fn code(&self, t: TermId) -> u64 {
        match self.rank.get(&t) {
            Some(&r) => r as u64,
            None => self.top.len() as u64 + t as u64,
        }
    }

    /// The term of `code`, `None` unless it is below `num_terms`.
    fn term(&self, code: u64, num_terms: u32) -> Option<TermId> {
        match code.checked_sub(self.top.len() as u64) {
            None => Some(self.top[code as usize]),
            Some(id) => (id < num_terms as u64).then_some(id as TermId),
        }
    }
}

/// Appends `v` as a LEB128 varint (7 bits a byte, low first; the last byte's high bit clear).
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The varint at `bytes[*at..]`, moving `at` past it; `None` when it is truncated, longer than
/// five bytes (codes are below 2³⁵) or not in its shortest form (`hits` matches the shortest
/// form only, so a document decodes exactly when it can be searched).
fn get_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..35).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        v |= ((b & 0x7f) as u64) << shift;
        if b < 0x80 {
            return (shift == 0 || b != 0).then_some(v);
        }
    }
    None
}

/// A document's head: its streams, their phrase lengths, and where its codes start.
#[derive(Debug, Default)]
pub struct DocHead {
    /// Per stream: its number, length and phrase count, in document order.
    pub streams: Vec<(u32, u32, usize)>,
    /// Every stream's phrase lengths, streams in order.
    pub phrase_lens: Vec<u32>,
    /// Tokens in all streams.
    pub tokens: u64,
    /// The offset of the first code in the document's bytes.
    pub codes_at: usize,
}

impl DocHead {
    /// Reads the head of a document's `bytes` in an index of `n_streams` streams.
    ///
    /// # Errors
    /// What does not hold, for [`IndexError::Corrupt`]: a truncated or over-long varint, a stream
    /// number out of range, a stream longer than 2³² − 1 tokens, more tokens than code bytes.
    pub fn read(bytes: &[u8], n_streams: usize) -> Result<Self, &'static str> {
        let mut at = 0;
        let mut next = |what| get_varint(bytes, &mut at).ok_or(what);
        let count = next("truncated stream count")?;
        // Each stream takes two bytes at least: the count sizes nothing beyond them.
        let mut head = DocHead {
            streams: Vec::with_capacity((count as usize).min(bytes.len() / 2)),
            ..DocHead::default()
        };
        for _ in 0..count {
            let stream = next("truncated stream number")?;
            if stream >= n_streams as u64 {
                return Err("stream number out of range");
            }
            let n_phrases = next("truncated phrase count")?;
            let mut length = 0u64;
            for _ in 0..n_phrases {
                let len = next("truncated phrase length")?;
                length += len;
                if length > u32::MAX as u64 {
                    return Err("stream longer than 2^32 - 1 tokens");
                }
                head.phrase_lens.push(len as u32);
            }
            head.streams
                .push((stream as u32, length as u32, n_phrases as usize));
            head.tokens += length;
        }
        head.codes_at = at;
        if head.tokens > (bytes.len() - at) as u64 {
            return Err("more tokens than code bytes");
        }
        Ok(head)
    }
}

/// An open `forward.bin`: section 0 the documents' bytes, section 1 their `num_docs + 1` u64
/// offsets, section 2 the ranked terms (u32 ids; offsets and ranked terms checked at open).
#[derive(Debug)]
pub struct ForwardIndex {
    file: MappedFile,
    codes: TermCodes,
}

impl ForwardIndex {
    /// Maps `path` and checks its document offsets against `num_docs` and its ranked terms
    /// against `num_terms`.
    ///
    /// # Errors
    /// [`IndexError::Io`] or [`IndexError::Corrupt`] (header, CRC, offsets, ranked terms).
    pub fn open(path: &Path, num_docs: u64, num_terms: u32) -> Result<Self, IndexError> {
        let file = MappedFile::open(path, KIND_FORWARD, 3)?;
        file.expect_len(1, "document offsets", num_docs + 1, 8)?;
        super::reader::check_offsets(&file, 1, 0, "document offsets")?;
        let n_top = TOP_TERMS.min(num_terms as usize);
        file.expect_len(2, "ranked terms", n_top as u64, 4)?;
        let top: Vec<TermId> = (file.section(2).chunks_exact(4))
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        if let Some(t) = top.iter().find(|&&t| t >= num_terms) {
            return Err(file.corrupt(format!("ranked term id {t} is not below {num_terms}")));
        }
        let codes = TermCodes::from_top(top).ok_or_else(|| file.corrupt("a term ranked twice"))?;
        Ok(Self { file, codes })
    }

    /// Document `d`'s bytes.
    fn bytes(&self, d: DocId) -> &[u8] {
        let o = self.file.section(1);
        let at = |k: usize| {
            u64::from_le_bytes(o[k * 8..k * 8 + 8].try_into().expect("8 bytes")) as usize
        };
        &self.file.section(0)[at(d as usize)..at(d as usize + 1)]
    }

    fn bad(&self, d: DocId, what: &str) -> IndexError {
        self.file.corrupt(format!("document {d}: {what}"))
    }

    /// Document `d`'s streams, given the index's stream count and term count (the ranges
    /// every decoded number is checked against).
    ///
    /// # Errors
    /// [`IndexError::Corrupt`] when the document's bytes do not decode.
    pub fn doc(
        &self,
        d: DocId,
        n_streams_in_index: usize,
        num_terms: u32,
    ) -> Result<Vec<ForwardStream>, IndexError> {
        let bytes = self.bytes(d);
        let head = DocHead::read(bytes, n_streams_in_index).map_err(|e| self.bad(d, e))?;
        let mut at = head.codes_at;
        let mut phrases = head.phrase_lens.iter();
        let mut streams = Vec::with_capacity(head.streams.len());
        for &(stream, length, n_phrases) in &head.streams {
            let terms = (0..length)
                .map(|_| {
                    get_varint(bytes, &mut at)
                        .and_then(|code| self.codes.term(code, num_terms))
                        .ok_or_else(|| self.bad(d, "term code truncated or out of range"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            streams.push(ForwardStream {
                stream,
                length,
                phrase_lens: phrases.by_ref().take(n_phrases).copied().collect(),
                terms,
            });
        }
        if at != bytes.len() {
            return Err(self.bad(d, "bytes after the last code"));
        }
        Ok(streams)
    }

    /// The hits of document `d` for a query whose `i`-th term has id `query[i]` (`None` for a
    /// term not in the index): every stream (named from `stream_names`, with its length), and
    /// per phrase the `[i, position]` pairs where a query term occurs
    /// ([`ForwardIndex::hits_into`] collected).
    ///
    /// # Errors
    /// As [`ForwardIndex::hits_into`].
    pub fn hits(
        &self,
        d: DocId,
        stream_names: &[String],
        query: &[Option<TermId>],
    ) -> Result<Vec<StreamHits>, IndexError> {
        let mut collected = CollectHits {
            stream_names,
            streams: Vec::new(),
            phrase: Vec::new(),
        };
        let codes = self.query_codes(query);
        self.hits_into(d, stream_names.len(), &codes, &mut collected)?;
        Ok(collected.streams)
    }

    /// What [`ForwardIndex::hits_into`] searches a document for, for a query whose `i`-th term
    /// has id `query[i]` (`None` for a term not in the index): made once per query, as it
    /// depends on the query only.
    pub fn query_codes(&self, query: &[Option<TermId>]) -> QueryCodes {
        QueryCodes(
            (query.iter().enumerate())
                .filter_map(|(i, t)| t.map(|t| Needle::new(self.codes.code(t), i as u32)))
                .collect(),
        )
    }

    /// Document `d`'s hits for the query of `codes` ([`ForwardIndex::query_codes`]), written
    /// into `sink` in document order: each stream of the document (its index into the index's
    /// `n_streams` streams, with its length), the hits of each phrase in position order, and a
    /// [`HitsSink::phrase_end`] after each phrase that had hits (phrases without hits are left
    /// out, as in [`StreamHits`]). Only the query terms' codes are looked for
    /// ([`find_codes`]); the others are never decoded. On an error the sink holds part of the
    /// document.
    ///
    /// # Errors
    /// [`IndexError::Corrupt`] when the document's head does not decode or its code bytes do
    /// not hold one code per token; [`ForwardIndex::doc`] checks each code too.
    pub fn hits_into(
        &self,
        d: DocId,
        n_streams: usize,
        codes: &QueryCodes,
        sink: &mut impl HitsSink,
    ) -> Result<(), IndexError> {
        let bytes = self.bytes(d);
        let head = DocHead::read(bytes, n_streams).map_err(|e| self.bad(d, e))?;
        let needles = &codes.0;
        let mut walk = PhraseWalk::new(&head, sink);
        if !needles.is_empty() {
            let tokens = find_codes(&bytes[head.codes_at..], needles, |token, i| {
                walk.hit(token, i)
            });
            if tokens != Some(head.tokens) {
                return Err(self.bad(d, "code bytes do not hold one code per token"));
            }
        }
        walk.finish();
        Ok(())
    }
}

/// A query's terms as [`ForwardIndex::hits_into`] looks for them in a document's code bytes
/// ([`ForwardIndex::query_codes`]).
#[derive(Debug, Clone, Default)]
pub struct QueryCodes(Vec<Needle>);

/// Where [`ForwardIndex::hits_into`] writes a document's hits, in the document's order.
pub trait HitsSink {
    /// A stream starts: its index into the index's streams, and its length in tokens.
    fn stream(&mut self, stream: u32, length: u32);
    /// A hit in the current phrase: the query term's index and the position in the stream.
    fn hit(&mut self, term: u32, position: u32);
    /// The current phrase, which had hits, ends.
    fn phrase_end(&mut self);
}

/// [`ForwardIndex::hits`]'s sink: the streams' hits as [`StreamHits`].
struct CollectHits<'a> {
    stream_names: &'a [String],
    streams: Vec<StreamHits>,
    /// The current phrase's hits.
    phrase: Vec<[u32; 2]>,
}

impl HitsSink for CollectHits<'_> {
    fn stream(&mut self, stream: u32, length: u32) {
        self.streams.push(StreamHits {
            stream: self.stream_names[stream as usize].clone(),
            length,
            phrases: Vec::new(),
        });
    }

    fn hit(&mut self, term: u32, position: u32) {
        self.phrase.push([term, position]);
    }

    fn phrase_end(&mut self) {
        let stream = self.streams.last_mut().expect("a phrase is in a stream");
        stream.phrases.push(std::mem::take(&mut self.phrase));
    }
}

/// A document's streams and phrases walked along the tokens where hits are found (token
/// indexes count across the document's streams): tells the sink where each stream starts and
/// where each phrase with hits ends, and turns a token index into a position in its stream.
struct PhraseWalk<'a, S> {
    streams: std::slice::Iter<'a, (u32, u32, usize)>,
    phrase_lens: std::slice::Iter<'a, u32>,
    sink: &'a mut S,
    /// The current stream's phrases after the current one.
    phrases_left: usize,
    /// Token index of the current stream's first token.
    stream_start: u64,
    /// Token index one past the current phrase (0 before the first).
    phrase_end: u64,
    /// Whether the current phrase had hits.
    any: bool,
}

impl<'a, S: HitsSink> PhraseWalk<'a, S> {
    fn new(head: &'a DocHead, sink: &'a mut S) -> Self {
        PhraseWalk {
            streams: head.streams.iter(),
            phrase_lens: head.phrase_lens.iter(),
            sink,
            phrases_left: 0,
            stream_start: 0,
            phrase_end: 0,
            any: false,
        }
    }

    /// Moves to the next phrase, ending the current one and starting the streams up to the
    /// next phrase's (streams without phrases included); `false` past the last.
    fn next_phrase(&mut self) -> bool {
        if std::mem::take(&mut self.any) {
            self.sink.phrase_end();
        }
        while self.phrases_left == 0 {
            let Some(&(stream, length, n_phrases)) = self.streams.next() else {
                return false;
            };
            self.stream_start = self.phrase_end;
            self.sink.stream(stream, length);
            self.phrases_left = n_phrases;
        }
        self.phrases_left -= 1;
        // The head holds each stream's phrase lengths: as many as its phrase count.
        self.phrase_end += *self.phrase_lens.next().expect("a phrase length") as u64;
        true
    }

    /// Query term `i` at token index `token` (tokens in increasing order). A token past the
    /// document's phrases is left out: its code bytes hold more codes than tokens, which the
    /// caller refuses.
    fn hit(&mut self, token: u64, i: u32) {
        while token >= self.phrase_end {
            if !self.next_phrase() {
                return;
            }
        }
        self.sink.hit(i, (token - self.stream_start) as u32);
        self.any = true;
    }

    /// Ends the last phrase with hits and starts the streams after it.
    fn finish(mut self) {
        while self.next_phrase() {}
    }
}

/// A code searched for: its varint bytes and the query term it stands for.
#[derive(Debug, Clone)]
struct Needle {
    /// The varint's bytes, zero after its `len`.
    bytes: [u8; 8],
    len: usize,
    /// The first byte in every byte of a word, for the eight-at-a-time comparison.
    first: u64,
    query_term: u32,
}

impl Needle {
    /// `code`'s needle; codes are below 2³⁵ (five varint bytes at most).
    fn new(code: u64, query_term: u32) -> Self {
        let mut v = Vec::with_capacity(8);
        put_varint(&mut v, code);
        let mut bytes = [0u8; 8];
        bytes[..v.len()].copy_from_slice(&v);
        Self {
            bytes,
            len: v.len(),
            first: u64::from_ne_bytes([bytes[0]; 8]),
            query_term,
        }
    }
}

const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
const LOW_BITS: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// The high bit of each byte of `x` that is zero (exact: no carry crosses a byte).
fn zero_bytes(x: u64) -> u64 {
    !(((x & LOW_BITS) + LOW_BITS) | x) & HIGH_BITS
}

/// Searches `codes` (varints, one per token) for the needles' codes eight bytes at a time,
/// calling `found(token index, query term)` for every token that is one, in token order (a
/// token equal to several needles: in the needles' order). Returns the number of tokens, or
/// `None` when the last varint is cut off.
///
/// In a little-endian word of eight bytes, the bytes with the high bit clear end a varint
/// (`ends`); a token starts at the byte after an end, the previous word's last byte carried
/// over; a needle can match only where a token starts and the byte equals its first, and is
/// then compared whole. A token's index is the count of ends before it.
fn find_codes(codes: &[u8], needles: &[Needle], mut found: impl FnMut(u64, u32)) -> Option<u64> {
    let (mut tokens, mut carry) = (0u64, 0x80u64);
    let mut word = |at: usize, w: u64, valid: u64| {
        let ends = !w & HIGH_BITS & valid;
        let starts = ((ends << 8) | carry) & valid;
        carry = ends >> 56;
        let mut candidates = 0;
        for n in needles {
            candidates |= zero_bytes(w ^ n.first) & starts;
        }
        while candidates != 0 {
            let byte = candidates.trailing_zeros() as usize / 8;
            let token = tokens + (ends & ((1u64 << (8 * byte)) - 1)).count_ones() as u64;
            let rest = &codes[at + byte..];
            for n in needles {
                if rest.get(..n.len) == Some(&n.bytes[..n.len]) {
                    found(token, n.query_term);
                }
            }
            candidates &= candidates - 1;
        }
        tokens += ends.count_ones() as u64;
    };
    let words = codes.chunks_exact(8);
    let tail = words.remainder();
    for (k, w) in words.enumerate() {
        word(
            k * 8,
            u64::from_le_bytes(w.try_into().expect("8 bytes")),
            u64::MAX,
        );
    }
    if !tail.is_empty() {
        let mut last = [0u8; 8];
        last[..tail.len()].copy_from_slice(tail);
        let valid = (1u64 << (8 * tail.len())) - 1;
        word(codes.len() - tail.len(), u64::from_le_bytes(last), valid);
    }
    codes.last().is_none_or(|&b| b < 0x80).then_some(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The straightforward search: decode every code, compare it with each needle.
    fn find_codes_naive(codes: &[u8], needles: &[Needle]) -> Option<(u64, Vec<(u64, u32)>)> {
        let (mut at, mut token, mut found) = (0, 0u64, Vec::new());
        while at < codes.len() {
            let start = at;
            get_varint(codes, &mut at)?;
            for n in needles {
                if codes[start..at] == n.bytes[..n.len] {
                    found.push((token, n.query_term));
                }
            }
            token += 1;
        }
        Some((token, found))
    }

    /// Codes of every length: one byte, two, three, five.
    fn code() -> impl Strategy<Value = u64> {
        prop_oneof![0..128u64, 0..1u64 << 14, 0..1u64 << 21, 0..1u64 << 34]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The word-at-a-time search finds exactly what decoding every code finds.
        #[test]
        fn find_codes_matches_decoding_every_code(
            tokens in prop::collection::vec(code(), 0..60),
            picks in prop::collection::vec((any::<prop::sample::Index>(), code()), 0..5),
        ) {
            let mut codes = Vec::new();
            for &c in &tokens {
                put_varint(&mut codes, c);
            }
            // Needles mostly taken from the tokens (so they match), some anything.
            let needles: Vec<Needle> = picks
                .iter()
                .enumerate()
                .map(|(i, (at, c))| match tokens.is_empty() || i % 3 == 2 {
                    true => Needle::new(*c, i as u32),
                    false => Needle::new(tokens[at.index(tokens.len())], i as u32),
                })
                .collect();
            let mut found = Vec::new();
            let n = find_codes(&codes, &needles, |t, i| found.push((t, i)));
            prop_assert_eq!(n, Some(tokens.len() as u64));
            prop_assert_eq!(Some((n.unwrap(), found)), find_codes_naive(&codes, &needles));
        }
    }

    #[test]
    fn a_cut_off_code_is_not_a_token() {
        let needles = [Needle::new(300, 0)];
        assert_eq!(find_codes(&[0x05, 0xac], &needles, |_, _| ()), None);
        assert_eq!(find_codes(&[], &needles, |_, _| ()), Some(0));
    }

    #[test]
    fn codes_rank_the_frequent_terms_and_shift_the_rest() {
        let cf = [1, 9, 9, 0, 4];
        let codes = TermCodes::by_frequency(&cf);
        assert_eq!(codes.top(), [1, 2, 4, 0, 3]);
        assert_eq!(codes.code(4), 2);
        assert_eq!(codes.term(2, 5), Some(4));
        let many: Vec<u64> = (0..TOP_TERMS as u64 + 3).collect();
        let codes = TermCodes::by_frequency(&many);
        assert_eq!(codes.top()[0], TOP_TERMS as u32 + 2);
        assert_eq!(codes.code(2), TOP_TERMS as u64 + 2);
        assert_eq!(codes.term(TOP_TERMS as u64 + 2, many.len() as u32), Some(2));
        assert_eq!(
            codes.term(2 * TOP_TERMS as u64 + 3, many.len() as u32),
            None
        );
    }

    #[test]
    fn varints_in_shortest_form_only() {
        let mut at = 0;
        assert_eq!(get_varint(&[0x80, 0x00], &mut at), None);
        let mut at = 0;
        assert_eq!(
            get_varint(&[0xff, 0xff, 0xff, 0xff, 0x7f], &mut at),
            Some((1 << 35) - 1)
        );
        let mut at = 0;
        assert_eq!(
            get_varint(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01], &mut at),
            None
        );
    }
}
