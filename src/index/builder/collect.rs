//! Step 2: the global state accumulated in corpus order (vocabulary, stream and static-feature
//! names, per-document columns) and the merge of each chunk into it.

use super::parse::ParsedChunk;
use super::vocab::{Terms, Vocab};

/// A chunk's vocabulary after [`Collected::split_known`]: per local term, its global id when it
/// was already known, and the other terms' strings in local order.
pub(super) struct ChunkTerms {
    known: Vec<Option<u32>>,
    fresh: Terms,
}

/// Global state accumulated in corpus order.
#[derive(Default)]
pub(super) struct Collected {
    pub(super) vocab: Vocab,
    pub(super) streams: Vec<String>,
    pub(super) stream_lengths: Vec<Vec<u32>>,
    pub(super) statics: Vec<String>,
    pub(super) static_values: Vec<Vec<f64>>,
    pub(super) ids: Vec<u8>,
    pub(super) id_offsets: Vec<u64>,
    pub(super) scoring_len: Vec<u32>,
    pub(super) docs: u64,
}

impl Collected {
    fn name_index(names: &mut Vec<String>, name: &str) -> (usize, bool) {
        match names.iter().position(|n| n == name) {
            Some(i) => (i, false),
            None => {
                names.push(name.to_string());
                (names.len() - 1, true)
            }
        }
    }

    /// Splits a chunk's vocabulary into the global ids of the terms already known and the terms
    /// that are not (in order): a read-only pass that chunks make in parallel before
    /// [`merge`](Self::merge), which then only sees the new terms. The lookups, one per distinct
    /// term of every chunk, were most of the sequential part of a build.
    pub(super) fn split_known(&self, vocab: &Terms) -> ChunkTerms {
        let mut fresh = Terms::default();
        let known = vocab
            .iter()
            .map(|t| {
                let id = self.vocab.get(t);
                if id.is_none() {
                    fresh.push(t);
                }
                id
            })
            .collect();
        ChunkTerms { known, fresh }
    }

    /// Registers a chunk's names and per-document columns; returns its local → global term map
    /// and, per document, its streams' global indices. `terms` is
    /// [`split_known`](Self::split_known) of the chunk's vocabulary, taken before its batch's
    /// merges began.
    pub(super) fn merge(
        &mut self,
        chunk: &ParsedChunk,
        terms: ChunkTerms,
    ) -> (Vec<u32>, Vec<Vec<u32>>) {
        let mut fresh = terms.fresh.iter();
        let map = terms
            .known
            .into_iter()
            .map(|known| {
                // Not known before this batch: new, or added by an earlier chunk of it.
                known.unwrap_or_else(|| {
                    let t = fresh.next().expect("one fresh term per unknown id");
                    self.vocab.id_or_insert(t)
                })
            })
            .collect();
        let mut stream_ids = Vec::with_capacity(chunk.docs.len());
        for doc in &chunk.docs {
            let d = self.docs as usize;
            let mut ids = Vec::with_capacity(doc.streams.len());
            for s in &doc.streams {
                let (i, new) = Self::name_index(&mut self.streams, &s.name);
                if new {
                    self.stream_lengths.push(vec![0; d]);
                }
                self.stream_lengths[i].push(s.tokens.len() as u32);
                ids.push(i as u32);
            }
            for col in &mut self.stream_lengths {
                col.resize(d + 1, 0);
            }
            for (name, v) in &doc.statics {
                let (i, new) = Self::name_index(&mut self.statics, name);
                if new {
                    self.static_values.push(vec![f64::NAN; d]);
                }
                self.static_values[i].push(*v);
            }
            for col in &mut self.static_values {
                col.resize(d + 1, f64::NAN);
            }
            self.id_offsets.push(self.ids.len() as u64);
            self.ids.extend_from_slice(doc.id.as_bytes());
            self.docs += 1;
            stream_ids.push(ids);
        }
        (map, stream_ids)
    }
}
