//! The low-level reader: [`Reader`] and its value readers (numbers, strings, maps, the
//! request's fields, documents, hit documents and their streams, a framed document's row), the
//! sinks of a hit document's static features, and the checks of fields read once.

use std::collections::BTreeMap;

use super::{DocumentBuffers, Fused, Given, Read, Unhandled};
use crate::api::{FeatureValues, RankDocument, RankRequest, MAX_DOCUMENTS};
use crate::backend::Backend;
use crate::rank::fe::{CorpusStats, HitDocument, HitStream, Phrases, QueryInfo, STREAMS};

/// Where a hit document goes as it is read ([`Reader::hit_document_into`]): a
/// [`HitDocument`] (the full decode), a reused one ([`DocumentBuffers`], the rows path's FE
/// reads it) or the next document of a layout part (`LayoutSink`, the fused device path).
pub(super) trait HitSink<'a> {
    /// Forgets the document read before.
    fn clear(&mut self);
    /// The document's id (`None` when absent or `nil`); `Unhandled` when it is not valid
    /// UTF-8.
    fn id(&mut self, id: Option<&'a [u8]>) -> Read<()>;
    /// Where to read the stream called `name` (the reader replaces its length and phrases);
    /// `Unhandled` when the name is not valid UTF-8.
    fn stream(&mut self, name: &'a [u8]) -> Read<&mut HitStream>;
    /// The stream last given by [`HitSink::stream`] is read: what its hits show of the
    /// validation rules.
    fn stream_read(&mut self, check: StreamCheck) -> Read<()>;
    /// A static feature; `Unhandled` when its name is not valid UTF-8.
    fn static_feature(&mut self, name: &'a [u8], value: f64) -> Read<()>;
}

/// `bytes` as a `str` when valid UTF-8.
pub(super) fn utf8(bytes: &[u8]) -> Read<&str> {
    std::str::from_utf8(bytes).map_err(|_| Unhandled)
}

/// Whether `bytes` are valid UTF-8. Names and ids are short and mostly ASCII: checked as such
/// first, inline, saving the general check's call.
pub(super) fn is_utf8(bytes: &[u8]) -> bool {
    bytes.is_ascii() || std::str::from_utf8(bytes).is_ok()
}

/// The catalogue slot (index in [`STREAMS`]) of a stream named `name`.
pub(super) fn catalogue_slot(name: &[u8]) -> Option<usize> {
    STREAMS.iter().position(|stream| stream.as_bytes() == name)
}

/// A fresh document each time (the full decode).
impl<'a> HitSink<'a> for HitDocument {
    fn clear(&mut self) {
        *self = HitDocument::default();
    }

    fn id(&mut self, id: Option<&'a [u8]>) -> Read<()> {
        self.id = id.map(utf8).transpose()?.map(str::to_string);
        Ok(())
    }

    fn stream(&mut self, name: &'a [u8]) -> Read<&mut HitStream> {
        Ok(match catalogue_slot(name) {
            Some(slot) => self.streams.slot_mut(slot, &mut Vec::new()),
            None => self.streams.other_mut(utf8(name)?),
        })
    }

    fn stream_read(&mut self, _: StreamCheck) -> Read<()> {
        Ok(())
    }

    fn static_feature(&mut self, name: &'a [u8], value: f64) -> Read<()> {
        self.static_features.insert(utf8(name)?.to_string(), value);
        Ok(())
    }
}

/// Vectors reused from document to document: streams of earlier documents wait in `spare`,
/// the id's string is kept, static features borrow their names from the body.
impl<'a> HitSink<'a> for DocumentBuffers<'a> {
    fn clear(&mut self) {
        self.hits.streams.clear_into(&mut self.spare);
        self.statics.clear();
    }

    fn id(&mut self, id: Option<&'a [u8]>) -> Read<()> {
        match id {
            Some(given) => {
                let kept = self.hits.id.get_or_insert_with(String::new);
                kept.clear();
                kept.push_str(utf8(given)?);
            }
            None => self.hits.id = None,
        }
        Ok(())
    }

    fn stream(&mut self, name: &'a [u8]) -> Read<&mut HitStream> {
        let streams = &mut self.hits.streams;
        Ok(match catalogue_slot(name) {
            Some(slot) => streams.slot_mut(slot, &mut self.spare),
            None => streams.other_mut(utf8(name)?),
        })
    }

    fn stream_read(&mut self, _: StreamCheck) -> Read<()> {
        Ok(())
    }

    /// A repeated name is kept twice; lookups search from the end, so the last value wins as
    /// in the map.
    fn static_feature(&mut self, name: &'a [u8], value: f64) -> Read<()> {
        self.statics.push((utf8(name)?, value));
        Ok(())
    }
}

/// What a stream's hits show of the validation rules ([`crate::rank::fe::hits`]), gathered as
/// they are read, to be checked against the query's terms.
#[derive(Debug, Clone, Copy)]
pub(super) struct StreamCheck {
    length: u32,
    /// Whether positions strictly increase along the stream.
    increasing: bool,
    /// One past the largest term given (0 without hits).
    term_end: u64,
    /// One past the last position given (0 without hits).
    position_end: u64,
}

impl StreamCheck {
    /// Whether every hit is valid for a query of `terms` terms: terms below it, positions
    /// strictly increasing, so all below the length when the last one is.
    pub(super) fn is_valid(&self, terms: u32) -> bool {
        self.increasing
            && self.term_end <= u64::from(terms)
            && self.position_end <= u64::from(self.length)
    }
}

/// A MessagePack number as written.
enum Number {
    Unsigned(u64),
    Signed(i64),
    Float(f64),
}

/// Sets a struct field once; a second occurrence is serde's `duplicate field` error.
fn set_once<T>(field: &mut Option<T>, value: T) -> Read<()> {
    if field.is_some() {
        return Err(Unhandled);
    }
    *field = Some(value);
    Ok(())
}

/// Marks a struct field decoded in place as seen; a second occurrence is serde's `duplicate
/// field` error.
fn first_time(seen: &mut bool) -> Read<()> {
    if std::mem::replace(seen, true) {
        return Err(Unhandled);
    }
    Ok(())
}

pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
    /// Fewest documents worth a parallel task.
    pub(super) min_task: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Read<u8> {
        self.bytes.get(self.pos).copied().ok_or(Unhandled)
    }

    fn byte(&mut self) -> Read<u8> {
        let byte = self.peek()?;
        self.pos += 1;
        Ok(byte)
    }

    fn take(&mut self, len: usize) -> Read<&'a [u8]> {
        let end = self.pos.checked_add(len).ok_or(Unhandled)?;
        let taken = self.bytes.get(self.pos..end).ok_or(Unhandled)?;
        self.pos = end;
        Ok(taken)
    }

    fn be<const N: usize>(&mut self) -> Read<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }

    /// A length that announces `len` elements of at least one byte each, bounded by what is
    /// left of the body so that a forged length cannot make a huge reservation.
    pub(super) fn capacity(&self, len: usize) -> usize {
        len.min(self.bytes.len() - self.pos)
    }

    fn map_len(&mut self) -> Read<usize> {
        match self.byte()? {
            marker @ 0x80..=0x8f => Ok(usize::from(marker & 0x0f)),
            0xde => Ok(usize::from(u16::from_be_bytes(self.be()?))),
            0xdf => Ok(u32::from_be_bytes(self.be()?) as usize),
            _ => Err(Unhandled),
        }
    }

    /// The length of the request's `documents` array; past [`MAX_DOCUMENTS`] left to
    /// rmp-serde, which refuses it.
    pub(super) fn documents_len(&mut self) -> Read<usize> {
        let len = self.array_len()?;
        if len > MAX_DOCUMENTS {
            return Err(Unhandled);
        }
        Ok(len)
    }

    pub(super) fn array_len(&mut self) -> Read<usize> {
        match self.byte()? {
            marker @ 0x90..=0x9f => Ok(usize::from(marker & 0x0f)),
            0xdc => Ok(usize::from(u16::from_be_bytes(self.be()?))),
            0xdd => Ok(u32::from_be_bytes(self.be()?) as usize),
            _ => Err(Unhandled),
        }
    }

    /// The bytes of a `str` (not `bin`, which serde also takes for a `String`: left to it),
    /// unchecked. Struct field names are matched as bytes against ASCII names: bytes equal to
    /// one are valid UTF-8 and any other is unhandled, so they need no UTF-8 check.
    pub(super) fn str_bytes(&mut self) -> Read<&'a [u8]> {
        let len = match self.byte()? {
            marker @ 0xa0..=0xbf => usize::from(marker & 0x1f),
            0xd9 => usize::from(self.byte()?),
            0xda => usize::from(u16::from_be_bytes(self.be()?)),
            0xdb => u32::from_be_bytes(self.be()?) as usize,
            _ => return Err(Unhandled),
        };
        self.take(len)
    }

    fn str(&mut self) -> Read<&'a str> {
        std::str::from_utf8(self.str_bytes()?).map_err(|_| Unhandled)
    }

    fn string(&mut self) -> Read<String> {
        self.str().map(str::to_string)
    }

    #[inline]
    fn number(&mut self) -> Read<Number> {
        Ok(match self.byte()? {
            marker @ 0x00..=0x7f => Number::Unsigned(u64::from(marker)),
            marker @ 0xe0..=0xff => Number::Signed(i64::from(marker as i8)),
            0xcc => Number::Unsigned(u64::from(self.byte()?)),
            0xcd => Number::Unsigned(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Number::Unsigned(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Number::Unsigned(u64::from_be_bytes(self.be()?)),
            0xd0 => Number::Signed(i64::from(self.byte()? as i8)),
            0xd1 => Number::Signed(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => Number::Signed(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => Number::Signed(i64::from_be_bytes(self.be()?)),
            0xca => Number::Float(f64::from(f32::from_be_bytes(self.be()?))),
            0xcb => Number::Float(f64::from_be_bytes(self.be()?)),
            _ => return Err(Unhandled),
        })
    }

    /// An `f64` field: serde takes any integer or float and converts it with `as`.
    fn f64(&mut self) -> Read<f64> {
        // Most are written as f64: read those without the dispatch.
        if self.bytes.get(self.pos) == Some(&0xcb) {
            self.pos += 1;
            return Ok(f64::from_be_bytes(self.be()?));
        }
        Ok(match self.number()? {
            Number::Unsigned(v) => v as f64,
            Number::Signed(v) => v as f64,
            Number::Float(v) => v,
        })
    }

    /// An unsigned field of at most `max`: serde takes integers in range, signed or not.
    fn unsigned(&mut self, max: u64) -> Read<u64> {
        let value = match self.number()? {
            Number::Unsigned(v) => v,
            Number::Signed(v) => u64::try_from(v).map_err(|_| Unhandled)?,
            Number::Float(_) => return Err(Unhandled),
        };
        if value > max {
            return Err(Unhandled);
        }
        Ok(value)
    }

    #[inline]
    fn u32(&mut self) -> Read<u32> {
        // Most hit terms and positions are positive fixints, most others 8 or 16 bits: read
        // them without the dispatch.
        match self.peek()? {
            fixint @ 0x00..=0x7f => {
                self.pos += 1;
                Ok(u32::from(fixint))
            }
            0xcc => {
                self.pos += 1;
                Ok(u32::from(self.byte()?))
            }
            0xcd => {
                self.pos += 1;
                Ok(u32::from(u16::from_be_bytes(self.be()?)))
            }
            _ => Ok(self.unsigned(u64::from(u32::MAX))? as u32),
        }
    }

    fn bool(&mut self) -> Read<bool> {
        match self.byte()? {
            0xc2 => Ok(false),
            0xc3 => Ok(true),
            _ => Err(Unhandled),
        }
    }

    /// An `Option`: `nil` is `None`, anything else is `read`'s value.
    fn optional<T>(&mut self, read: impl FnOnce(&mut Self) -> Read<T>) -> Read<Option<T>> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            return Ok(None);
        }
        read(self).map(Some)
    }

    /// A map from `str` keys to `read`'s values; a repeated key keeps its last value, as a
    /// `BTreeMap` does.
    fn str_map<T>(&mut self, read: impl Fn(&mut Self) -> Read<T>) -> Read<BTreeMap<String, T>> {
        let len = self.map_len()?;
        let mut map = BTreeMap::new();
        for _ in 0..len {
            let key = self.string()?;
            map.insert(key, read(self)?);
        }
        Ok(map)
    }

    /// The request, its `documents` read by `documents` (given how many fields follow them).
    pub(super) fn rank_request(
        &mut self,
        mut documents: impl FnMut(&mut Self, usize) -> Read<Vec<RankDocument>>,
    ) -> Read<RankRequest> {
        let (mut ranker, mut decoded, mut query, mut stats) = (None, None, None, None);
        let (mut k, mut backend, mut explain, mut timeout_ms) = (None, None, None, None);
        let fields = self.map_len()?;
        for field in 0..fields {
            match self.str_bytes()? {
                b"ranker" => set_once(&mut ranker, self.string()?)?,
                b"documents" => set_once(&mut decoded, documents(self, fields - field - 1)?)?,
                b"query" => set_once(&mut query, self.optional(Self::query_info)?)?,
                b"stats" => set_once(&mut stats, self.optional(Self::corpus_stats)?)?,
                b"k" => set_once(
                    &mut k,
                    self.optional(|r| r.unsigned(usize::MAX as u64).map(|v| v as usize))?,
                )?,
                b"backend" => set_once(&mut backend, self.optional(Self::backend)?)?,
                b"explain" => set_once(&mut explain, self.bool()?)?,
                b"timeout_ms" => {
                    set_once(&mut timeout_ms, self.optional(|r| r.unsigned(u64::MAX))?)?
                }
                _ => return Err(Unhandled),
            }
        }
        Ok(RankRequest {
            ranker: ranker.ok_or(Unhandled)?,
            documents: decoded.ok_or(Unhandled)?,
            query: query.flatten(),
            stats: stats.flatten(),
            k: k.flatten(),
            backend: backend.flatten(),
            explain: explain.unwrap_or(false),
            timeout_ms: timeout_ms.flatten(),
        })
    }

    /// `Backend` is `rename_all = "lowercase"` unit variants, written as their names.
    fn backend(&mut self) -> Read<Backend> {
        match self.str_bytes()? {
            b"auto" => Ok(Backend::Auto),
            b"cpu" => Ok(Backend::Cpu),
            b"gpu" => Ok(Backend::Gpu),
            _ => Err(Unhandled),
        }
    }

    /// Moves past one value of any type (ext types aside), checking only its framing.
    pub(super) fn skip_value(&mut self) -> Read<()> {
        let mut pending: usize = 1;
        while pending > 0 {
            pending -= 1;
            let marker = self.byte()?;
            let (items, len) = match marker {
                0x00..=0x7f | 0xc0 | 0xc2 | 0xc3 | 0xe0..=0xff => continue,
                0x80..=0x8f => (2 * usize::from(marker & 0x0f), 0),
                0x90..=0x9f => (usize::from(marker & 0x0f), 0),
                0xa0..=0xbf => (0, usize::from(marker & 0x1f)),
                0xcc | 0xd0 => (0, 1),
                0xcd | 0xd1 => (0, 2),
                0xca | 0xce | 0xd2 => (0, 4),
                0xcb | 0xcf | 0xd3 => (0, 8),
                0xc4 | 0xd9 => (0, usize::from(self.byte()?)),
                0xc5 | 0xda => (0, usize::from(u16::from_be_bytes(self.be()?))),
                0xc6 | 0xdb => (0, u32::from_be_bytes(self.be()?) as usize),
                0xdc => (usize::from(u16::from_be_bytes(self.be()?)), 0),
                0xdd => (u32::from_be_bytes(self.be()?) as usize, 0),
                0xde => (2 * usize::from(u16::from_be_bytes(self.be()?)), 0),
                0xdf => (2 * u32::from_be_bytes(self.be()?) as usize, 0),
                _ => return Err(Unhandled),
            };
            self.take(len)?;
            pending += items;
            // Each pending value takes at least a byte: a forged length stops here.
            if pending > self.bytes.len() - self.pos {
                return Err(Unhandled);
            }
        }
        Ok(())
    }

    pub(super) fn rank_document(&mut self) -> Read<RankDocument> {
        let (mut id, mut features, mut hits) = (None, None, None);
        for _ in 0..self.map_len()? {
            match self.str_bytes()? {
                b"id" => set_once(&mut id, self.optional(Self::string)?)?,
                b"features" => set_once(&mut features, self.optional(Self::feature_values)?)?,
                b"hits" => set_once(&mut hits, self.optional(Self::hit_document)?)?,
                _ => return Err(Unhandled),
            }
        }
        Ok(RankDocument {
            id: id.flatten(),
            features: features.flatten(),
            hits: hits.flatten(),
        })
    }

    /// The untagged `FeatureValues`: serde tries `Vector` first, which only an array can be,
    /// then `Named`, which only a map can be.
    fn feature_values(&mut self) -> Read<FeatureValues> {
        if matches!(self.peek()?, 0x80..=0x8f | 0xde | 0xdf) {
            return Ok(FeatureValues::Named(
                self.str_map(|r| r.optional(Self::f64))?,
            ));
        }
        let len = self.array_len()?;
        let mut values = Vec::with_capacity(self.capacity(len));
        for _ in 0..len {
            values.push(self.optional(Self::f64)?);
        }
        Ok(FeatureValues::Vector(values))
    }

    fn hit_document(&mut self) -> Read<HitDocument> {
        let mut doc = HitDocument::default();
        self.hit_document_into(&mut doc)?;
        Ok(doc)
    }

    /// A hit document into `sink`, which forgets the one before.
    pub(super) fn hit_document_into(&mut self, sink: &mut impl HitSink<'a>) -> Read<()> {
        sink.clear();
        let (mut id, mut streams, mut static_features) = (false, false, false);
        for _ in 0..self.map_len()? {
            match self.str_bytes()? {
                b"id" => {
                    first_time(&mut id)?;
                    let given = self.optional(Self::str_bytes)?;
                    sink.id(given)?;
                }
                b"streams" => {
                    first_time(&mut streams)?;
                    // A repeated name keeps its last stream, as serde's visitor does: the
                    // sink gives the same stream again.
                    for _ in 0..self.map_len()? {
                        let name = self.str_bytes()?;
                        let check = self.hit_stream_into(sink.stream(name)?)?;
                        sink.stream_read(check)?;
                    }
                }
                b"static" => {
                    first_time(&mut static_features)?;
                    for _ in 0..self.map_len()? {
                        let name = self.str_bytes()?;
                        sink.static_feature(name, self.f64()?)?;
                    }
                }
                _ => return Err(Unhandled),
            }
        }
        if !id {
            sink.id(None)?;
        }
        Ok(())
    }

    /// A stream into `stream`, replacing its length and phrases (their vectors are reused);
    /// what its hits show of the validation rules.
    fn hit_stream_into(&mut self, stream: &mut HitStream) -> Read<StreamCheck> {
        let (mut length, mut phrases) = (None, None);
        stream.phrases.clear();
        for _ in 0..self.map_len()? {
            match self.str_bytes()? {
                b"length" => set_once(&mut length, self.u32()?)?,
                b"phrases" => set_once(&mut phrases, self.phrases_into(&mut stream.phrases)?)?,
                _ => return Err(Unhandled),
            }
        }
        stream.length = length.ok_or(Unhandled)?;
        let (increasing, term_end, position_end) = phrases.unwrap_or((true, 0, 0));
        Ok(StreamCheck {
            length: stream.length,
            increasing,
            term_end,
            position_end,
        })
    }

    /// Phrases, each a list of `[term, position]` hits (2-element arrays in fixarray form;
    /// other forms are left to serde), into empty `phrases`; whether positions strictly
    /// increase, one past the largest term, one past the last position (see [`StreamCheck`]).
    fn phrases_into(&mut self, phrases: &mut Phrases) -> Read<(bool, u64, u64)> {
        // A copy of the reader: its position stays in a register through the loop.
        let mut reader = Reader { ..*self };
        let (hits, ends) = phrases.parts_mut();
        let (mut increasing, mut term_end, mut position_end) = (true, 0, 0);
        let phrase_count = reader.array_len()?;
        ends.reserve(reader.capacity(phrase_count));
        for _ in 0..phrase_count {
            let hit_count = reader.array_len()?;
            hits.reserve(reader.capacity(hit_count));
            for _ in 0..hit_count {
                let [term, position] = reader.hit()?;
                increasing &= u64::from(position) >= position_end;
                position_end = u64::from(position) + 1;
                term_end = term_end.max(u64::from(term) + 1);
                hits.push([term, position]);
            }
            ends.push(hits.len());
        }
        self.pos = reader.pos;
        Ok((increasing, term_end, position_end))
    }

    /// A `[term, position]` hit.
    #[inline]
    fn hit(&mut self) -> Read<[u32; 2]> {
        // Most hits are a fixarray of a positive fixint term and a position of 7, 8 or 16 bits
        // (a quarter of the synthesized requests' are past 127, in long bodies): read those
        // in one go.
        if let Some(&[0x92, term @ 0x00..=0x7f, marker, high, low]) =
            self.bytes.get(self.pos..self.pos + 5)
        {
            let (position, len) = match marker {
                0x00..=0x7f => (u32::from(marker), 3),
                0xcc => (u32::from(high), 4),
                0xcd => (u32::from(u16::from_be_bytes([high, low])), 5),
                _ => (0, 0),
            };
            if len > 0 {
                self.pos += len;
                return Ok([u32::from(term), position]);
            }
        }
        if self.byte()? != 0x92 {
            return Err(Unhandled);
        }
        Ok([self.u32()?, self.u32()?])
    }

    /// One document of a framed request into `row` (the ranker's width): its feature vector
    /// as given, or its hits' features extracted (see [`Framed::feature_matrix`]).
    ///
    /// [`Framed::feature_matrix`]: super::Framed::feature_matrix
    pub(super) fn document_row(
        &mut self,
        fused: &Fused<'_>,
        buffers: &mut DocumentBuffers<'a>,
        row: &mut [f64],
    ) -> Read<()> {
        let features = |r: &mut Self| {
            if r.array_len()? != row.len() {
                return Err(Unhandled);
            }
            for slot in row.iter_mut() {
                *slot = r.optional(Self::f64)?.unwrap_or(f64::NAN);
            }
            Ok(())
        };
        let given = self.framed_document(features, |r| r.hit_document_into(buffers))?;
        if given == Given::Hits {
            let resolver = fused.resolver.ok_or(Unhandled)?;
            let query = fused.query.as_ref().ok_or(Unhandled)?;
            resolver
                .extract_with_statics(query, &buffers.hits, |name| buffers.static_value(name), row)
                .map_err(|_| Unhandled)?;
        }
        Ok(())
    }

    /// One document of a framed request: its feature vector read by `features` or its hits by
    /// `hits` (each called with the reader at the value). Which of the two it gave; a document
    /// with neither or both (not `nil`) is the full path's error.
    pub(super) fn framed_document(
        &mut self,
        features: impl FnOnce(&mut Self) -> Read<()>,
        hits: impl FnOnce(&mut Self) -> Read<()>,
    ) -> Read<Given> {
        let (mut id, mut features_seen, mut hits_seen) = (false, false, false);
        let (mut features, mut hits) = (Some(features), Some(hits));
        let mut given = None;
        for _ in 0..self.map_len()? {
            let field = self.str_bytes()?;
            match field {
                b"id" => first_time(&mut id)?,
                b"features" => first_time(&mut features_seen)?,
                b"hits" => first_time(&mut hits_seen)?,
                _ => return Err(Unhandled),
            }
            if self.peek()? == 0xc0 {
                self.pos += 1;
                continue;
            }
            match field {
                b"id" => {
                    if !is_utf8(self.str_bytes()?) {
                        return Err(Unhandled);
                    }
                }
                // Both given is the full path's error.
                _ if given.is_some() => return Err(Unhandled),
                b"features" => {
                    given = Some(Given::Features);
                    // Seen once (checked above), so still there.
                    (features.take().ok_or(Unhandled)?)(self)?;
                }
                _ => {
                    given = Some(Given::Hits);
                    (hits.take().ok_or(Unhandled)?)(self)?;
                }
            }
        }
        given.ok_or(Unhandled)
    }

    fn query_info(&mut self) -> Read<QueryInfo> {
        let (mut terms, mut idf) = (None, None);
        for _ in 0..self.map_len()? {
            match self.str_bytes()? {
                b"terms" => set_once(&mut terms, self.u32()?)?,
                b"idf" => {
                    let len = self.array_len()?;
                    let mut values = Vec::with_capacity(self.capacity(len));
                    for _ in 0..len {
                        values.push(self.f64()?);
                    }
                    set_once(&mut idf, values)?
                }
                _ => return Err(Unhandled),
            }
        }
        Ok(QueryInfo {
            terms: terms.ok_or(Unhandled)?,
            idf: idf.ok_or(Unhandled)?,
        })
    }

    fn corpus_stats(&mut self) -> Read<CorpusStats> {
        let mut avg_length = None;
        for _ in 0..self.map_len()? {
            match self.str_bytes()? {
                b"avg_length" => set_once(&mut avg_length, self.str_map(Self::f64)?)?,
                _ => return Err(Unhandled),
            }
        }
        Ok(CorpusStats {
            avg_length: avg_length.unwrap_or_default(),
        })
    }
}
