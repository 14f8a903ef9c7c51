//! Step 1: parsing and tokenizing a chunk of corpus lines, each chunk with its own local
//! vocabulary.

use std::path::Path;

use hashbrown::HashTable;

use super::vocab::{Terms, Vocab};
use crate::index::corpus::{parse_line, CorpusDoc, RawLine};
use crate::index::tokenize::Tokenizer;
use crate::index::IndexError;

pub(super) struct ParsedStream {
    pub(super) name: String,
    pub(super) tokens: Vec<u32>,
    pub(super) phrase_lens: Vec<u32>,
}

pub(super) struct ParsedDoc {
    pub(super) id: String,
    pub(super) streams: Vec<ParsedStream>,
    pub(super) statics: Vec<(String, f64)>,
}

pub(super) struct ParsedChunk {
    pub(super) vocab: Terms,
    pub(super) docs: Vec<ParsedDoc>,
}

/// What a worker thread keeps from one chunk to the next: its tokenizer and the capacity of its
/// chunk vocabulary's table (grown once instead of from empty for every chunk).
#[derive(Default)]
pub(super) struct ChunkParser {
    tokenizer: Tokenizer,
    ids: HashTable<(u32, u32)>,
}

pub(super) fn parse_chunk(
    parser: &mut ChunkParser,
    path: &Path,
    lines: &[RawLine],
) -> Result<ParsedChunk, IndexError> {
    let ChunkParser { tokenizer, ids } = parser;
    ids.clear();
    let mut local = Vocab {
        terms: Terms::default(),
        ids: std::mem::take(ids),
    };
    let mut docs = Vec::with_capacity(lines.len());
    for raw in lines {
        let CorpusDoc {
            id,
            streams,
            static_features,
        } = parse_line(path, raw)?;
        let streams = streams
            .into_iter()
            .map(|(name, text)| {
                let mut tokens = Vec::new();
                let mut phrase_lens: Vec<u32> = Vec::new();
                tokenizer.for_each_token(&text, |term, pos| {
                    tokens.push(local.id_or_insert(term));
                    if pos.phrase as usize == phrase_lens.len() {
                        phrase_lens.push(0);
                    }
                    *phrase_lens.last_mut().expect("pushed above") += 1;
                });
                ParsedStream {
                    name,
                    tokens,
                    phrase_lens,
                }
            })
            .collect();
        docs.push(ParsedDoc {
            id,
            streams,
            statics: static_features.into_iter().collect(),
        });
    }
    *ids = local.ids;
    Ok(ParsedChunk {
        vocab: local.terms,
        docs,
    })
}
