//! Steps 3 and 4: a chunk's provisional forward index and scoring postings, and the inversion
//! of every chunk's postings into encoded lists, per term range.

use rayon::prelude::*;

use super::forward::put_doc;
use super::parse::ParsedChunk;
use crate::index::blockmax::{mean_length, push_list_maxes, BlockMax};
use crate::index::codecs::{encode_list, Codec, SkipEntry};
use crate::index::reader::TermInfo;

#[derive(Clone, Copy)]
pub(super) struct Posting {
    term: u32,
    doc: u32,
    tf: u32,
}

/// A chunk's encoded forward index and scoring postings.
pub(super) struct EncodedChunk {
    /// The documents' provisional forward bytes ([`super::forward::put_doc`]), empty without a
    /// forward index.
    pub(super) forward: Vec<u8>,
    /// Each document's byte length in `forward`.
    pub(super) forward_lens: Vec<u32>,
    /// Occurrences of each local term in every stream (empty without a forward index).
    pub(super) counts: Vec<u32>,
    /// Postings sorted by term, then doc.
    pub(super) postings: Vec<Posting>,
    /// Each document's scoring length.
    pub(super) lens: Vec<u32>,
}

/// Encodes a chunk's forward index (when `forward`) and scoring postings; `map` takes local
/// term ids to global ones.
pub(super) fn encode_chunk(
    chunk: &ParsedChunk,
    map: &[u32],
    stream_ids: &[Vec<u32>],
    first_doc: u32,
    scoring: &str,
    forward: bool,
) -> EncodedChunk {
    let mut out = EncodedChunk {
        forward: Vec::new(),
        forward_lens: Vec::with_capacity(chunk.docs.len()),
        counts: vec![0; if forward { map.len() } else { 0 }],
        postings: Vec::new(),
        lens: Vec::with_capacity(chunk.docs.len()),
    };
    let mut scoring_terms: Vec<u32> = Vec::new();
    let all = scoring == "all";
    for (i, doc) in chunk.docs.iter().enumerate() {
        let d = first_doc + i as u32;
        if forward {
            let start = out.forward.len();
            put_doc(&mut out.forward, doc, &stream_ids[i], map, &mut out.counts);
            out.forward_lens.push((out.forward.len() - start) as u32);
        }
        scoring_terms.clear();
        for s in &doc.streams {
            if all || s.name == scoring {
                scoring_terms.extend(s.tokens.iter().map(|&t| map[t as usize]));
            }
        }
        out.lens.push(scoring_terms.len() as u32);
        scoring_terms.sort_unstable();
        let mut j = 0;
        while j < scoring_terms.len() {
            let t = scoring_terms[j];
            let mut k = j + 1;
            while k < scoring_terms.len() && scoring_terms[k] == t {
                k += 1;
            }
            out.postings.push(Posting {
                term: t,
                doc: d,
                tf: (k - j) as u32,
            });
            j = k;
        }
    }
    out.postings.sort_unstable_by_key(|p| (p.term, p.doc));
    out
}

/// One term range's encoded lists (offsets relative to the range until [`write_postings`](super::write_postings)).
#[derive(Default)]
pub(crate) struct RangeOut {
    pub(super) bytes: Vec<u8>,
    pub(super) skips: Vec<SkipEntry>,
    /// One block-max entry per block (`blockmax.bin`'s section 0).
    pub(super) maxes: Vec<BlockMax>,
    /// The entries of lists of two blocks or more, each with its list's place in `infos`.
    pub(super) list_maxes: Vec<(u32, BlockMax)>,
    pub(super) infos: Vec<TermInfo>,
}

impl RangeOut {
    /// Encodes the next term's list (`docs` strictly increasing, `tfs ≥ 1`, at most 2³² − 1
    /// postings) and its block-max entries (for mean scoring length `avgdl`, see
    /// [`mean_length`](crate::index::blockmax::mean_length)) and records its info.
    pub(crate) fn push_list(
        &mut self,
        codec: Codec,
        docs: &[u32],
        tfs: &[u32],
        doc_len: impl Fn(u32) -> u32,
        avgdl: f32,
    ) {
        let (offset, first_skip) = (self.bytes.len(), self.skips.len());
        encode_list(codec, docs, tfs, &doc_len, &mut self.bytes, &mut self.skips);
        if let Some(m) = push_list_maxes(docs, tfs, doc_len, avgdl, &mut self.maxes) {
            self.list_maxes.push((self.infos.len() as u32, m));
        }
        self.infos.push(TermInfo {
            df: docs.len() as u32,
            n_blocks: (self.skips.len() - first_skip) as u32,
            postings_offset: offset as u64,
            postings_len: (self.bytes.len() - offset) as u64,
            skip_start: first_skip as u64,
        });
    }
}

/// Inverts the chunks' postings (each sorted by term, then doc; chunks in doc order) and
/// encodes every term's list; returns ranges in term order.
pub(super) fn invert(
    chunks: &[Vec<Posting>],
    n_terms: usize,
    codec: Codec,
    scoring_len: &[u32],
) -> Vec<RangeOut> {
    let df: Vec<u32> = chunks
        .par_iter()
        .fold(
            || vec![0u32; n_terms],
            |mut acc, c| {
                for p in c {
                    acc[p.term as usize] += 1;
                }
                acc
            },
        )
        .reduce(
            || vec![0u32; n_terms],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            },
        );
    let total: u64 = df.iter().map(|&d| d as u64).sum();
    let avgdl = mean_length(
        scoring_len.iter().map(|&l| l as u64).sum(),
        scoring_len.len() as u64,
    );
    let target = (total / (rayon::current_num_threads() as u64 * 8)).max(1 << 16);
    let mut ranges = Vec::new();
    let (mut lo, mut acc) = (0usize, 0u64);
    for (t, &d) in df.iter().enumerate() {
        acc += d as u64;
        if acc >= target {
            ranges.push(lo..t + 1);
            lo = t + 1;
            acc = 0;
        }
    }
    if lo < n_terms || ranges.is_empty() {
        ranges.push(lo..n_terms);
    }
    ranges
        .into_par_iter()
        .map(|r| {
            let mut starts = Vec::with_capacity(r.len() + 1);
            let mut n = 0usize;
            for t in r.clone() {
                starts.push(n);
                n += df[t] as usize;
            }
            starts.push(n);
            let mut docs = vec![0u32; n];
            let mut tfs = vec![0u32; n];
            let mut cursor = starts.clone();
            for c in chunks {
                let a = c.partition_point(|p| (p.term as usize) < r.start);
                let b = c.partition_point(|p| (p.term as usize) < r.end);
                for p in &c[a..b] {
                    let at = &mut cursor[p.term as usize - r.start];
                    docs[*at] = p.doc;
                    tfs[*at] = p.tf;
                    *at += 1;
                }
            }
            let mut out = RangeOut::default();
            for k in 0..r.len() {
                let (s, e) = (starts[k], starts[k + 1]);
                out.push_list(
                    codec,
                    &docs[s..e],
                    &tfs[s..e],
                    |d| scoring_len[d as usize],
                    avgdl,
                );
            }
            out
        })
        .collect()
}
