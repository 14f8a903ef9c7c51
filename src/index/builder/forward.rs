//! The forward index in two passes: step 3 writes each document with its term ids as codes into a
//! provisional file, counting every term's occurrences; once the corpus is read, the codes are
//! rewritten with the most frequent terms ranked ([`TermCodes::by_frequency`]) into
//! `forward.bin` (layout: [`crate::index::forward`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use rayon::prelude::*;

use super::parse::ParsedDoc;
use super::write::{u32s, u64s};
use crate::index::format::SectionWriter;
use crate::index::forward::{put_varint, DocHead, TermCodes};
use crate::index::reader::{FORWARD_FILE, KIND_FORWARD};
use crate::index::IndexError;

/// Documents re-encoded per task of the second pass.
const RECODE_DOCS: usize = 4096;

/// Appends `doc` in the forward layout with each term's global id (`map` of its local id) as its
/// code, and counts its tokens per local term into `counts`.
pub(super) fn put_doc(
    out: &mut Vec<u8>,
    doc: &ParsedDoc,
    stream_ids: &[u32],
    map: &[u32],
    counts: &mut [u32],
) {
    put_varint(out, doc.streams.len() as u64);
    for (s, &sid) in doc.streams.iter().zip(stream_ids) {
        put_varint(out, sid as u64);
        put_varint(out, s.phrase_lens.len() as u64);
        for &p in &s.phrase_lens {
            put_varint(out, p as u64);
        }
    }
    for s in &doc.streams {
        for &t in &s.tokens {
            put_varint(out, map[t as usize] as u64);
            counts[t as usize] += 1;
        }
    }
}

/// The provisional file: documents whose codes are still term ids, and their offsets.
pub(super) struct Provisional {
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
    offsets: Vec<u64>,
}

impl Provisional {
    /// Creates it in the build directory `dir`.
    pub(super) fn create(dir: &Path) -> Result<Self, IndexError> {
        let path = dir.join("forward.provisional");
        let file = std::fs::File::create(&path).map_err(|e| IndexError::io(&path, e))?;
        Ok(Self {
            out: std::io::BufWriter::with_capacity(1 << 20, file),
            path,
            offsets: vec![0],
        })
    }

    /// Appends a chunk's documents: their bytes, and each one's length.
    pub(super) fn write(&mut self, bytes: &[u8], lens: &[u32]) -> Result<(), IndexError> {
        self.out
            .write_all(bytes)
            .map_err(|e| IndexError::io(&self.path, e))?;
        let mut at = *self.offsets.last().expect("starts with 0");
        for &l in lens {
            at += l as u64;
            self.offsets.push(at);
        }
        Ok(())
    }

    /// Writes `forward.bin` into `dir` with the terms ranked by their counts `cf` (indexed by
    /// term id), for an index of `n_streams` streams, and removes the provisional file; returns
    /// the size of `forward.bin`'s section 0.
    pub(super) fn finish(
        self,
        dir: &Path,
        cf: &[u64],
        n_streams: usize,
    ) -> Result<u64, IndexError> {
        let Provisional { path, out, offsets } = self;
        out.into_inner()
            .map_err(|e| IndexError::io(&path, e.into_error()))?;
        let file = std::fs::File::open(&path).map_err(|e| IndexError::io(&path, e))?;
        // SAFETY: the file is this build's own, in its own directory, and not written any more.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| IndexError::io(&path, e))?;
        let codes = TermCodes::by_frequency(cf);
        let mut w = SectionWriter::create(&dir.join(FORWARD_FILE), KIND_FORWARD)?;
        let mut new_offsets = Vec::with_capacity(offsets.len());
        new_offsets.push(0u64);
        // In rounds of a task of RECODE_DOCS documents per thread, written in document order:
        // one round's new bytes are in memory at a time.
        let n_docs = offsets.len() - 1;
        let round = RECODE_DOCS * rayon::current_num_threads();
        for first in (0..n_docs).step_by(round) {
            let last = (first + round).min(n_docs);
            let parts: Vec<(Vec<u8>, Vec<u64>)> = (first..last)
                .into_par_iter()
                .step_by(RECODE_DOCS)
                .map(|from| {
                    let to = (from + RECODE_DOCS).min(last);
                    let mut bytes = Vec::new();
                    let mut ends = Vec::with_capacity(to - from);
                    for d in from..to {
                        let doc = &map[offsets[d] as usize..offsets[d + 1] as usize];
                        recode(doc, &codes, n_streams, &mut bytes);
                        ends.push(bytes.len() as u64);
                    }
                    (bytes, ends)
                })
                .collect();
            for (bytes, ends) in parts {
                let base = *new_offsets.last().expect("starts with 0");
                w.write(&bytes)?;
                new_offsets.extend(ends.iter().map(|e| base + e));
            }
        }
        let data_bytes = w.section_len();
        w.end_section()?;
        w.write(&u64s(&new_offsets))?;
        w.end_section()?;
        w.write(&u32s(codes.top()))?;
        w.end_section()?;
        w.finish()?;
        drop(map);
        std::fs::remove_file(&path).map_err(|e| IndexError::io(&path, e))?;
        Ok(data_bytes)
    }
}

/// Appends `doc` (written by [`put_doc`]) with its term ids replaced by their `codes`.
fn recode(doc: &[u8], codes: &TermCodes, n_streams: usize, out: &mut Vec<u8>) {
    let head = DocHead::read(doc, n_streams).expect("the build's own document");
    out.extend_from_slice(&doc[..head.codes_at]);
    let mut id = 0u64;
    let mut shift = 0;
    for &b in &doc[head.codes_at..] {
        id |= ((b & 0x7f) as u64) << shift;
        shift += 7;
        if b < 0x80 {
            put_varint(out, codes.code(id as u32));
            (id, shift) = (0, 0);
        }
    }
}
