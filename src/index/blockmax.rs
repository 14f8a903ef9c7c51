//! Block-max entries (`blockmax.bin`): per posting list and per block, the postings whose BM25
//! contribution is largest, kept beside the skip entries (which the GPU reads and which stay as
//! they are) so that the CPU's dynamic pruning bounds a block by its real postings.
//!
//! Why pairs and not scores: with `A` the mean scoring length, a posting's BM25 contribution is
//! `idf·(k1+1) / (1 + k1·g_b/A)` with `g_b = ((1−b)·A + b·dl) / tf`, so the posting of largest
//! contribution is the one of smallest `g_b`, whatever k1 and idf. An entry keeps, for each b of
//! [`BOUND_B`], the (tf, dl) of that posting: at those b the bound is the block's true maximum,
//! for any k1. Between two of them, `g_b` of every posting is linear in b, so the minimum over
//! postings is concave in b and lies above the chord between the two stored minima: the chord
//! bounds every posting (`select::bm25` turns it into a score bound). So one entry bounds every
//! b in [0, 1], tightly at 0, DESIGN §5's 0.4, Lucene and Tantivy's 0.75 and 1.
//!
//! Layout: entries of [`BLOCK_MAX_BYTES`] (for each b of [`BOUND_B`] in order: tf u32, dl u32,
//! little-endian) in three sections: 0, one per block, aligned with the skip entries (a list's
//! from its `skip_start`); 1, the ids (u32, ascending) of the terms whose list has two blocks or
//! more; 2, those lists' own entries, in that order. A list of one block is bounded by its
//! block's entry.

use super::codecs::{SkipEntry, BLOCK_LEN};

/// The length-normalisation values b at which an entry holds the exact best posting.
pub const BOUND_B: [f32; 4] = [0.0, 0.4, 0.75, 1.0];

/// Bytes of one entry on disk.
pub const BLOCK_MAX_BYTES: usize = 8 * BOUND_B.len();

/// For each b of [`BOUND_B`], the (tf, dl) of the posting whose contribution is largest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockMax {
    /// (tf, dl) per b of [`BOUND_B`].
    pub best: [(u32, u32); BOUND_B.len()],
}

/// The mean scoring length as BM25 uses it (`select::bm25`: total / N in f64, then f32).
pub fn mean_length(total: u64, n: u64) -> f32 {
    if n == 0 {
        0.0
    } else {
        (total as f64 / n as f64) as f32
    }
}

impl BlockMax {
    /// The entry of postings given as (tf ≥ 1, dl), for mean length `avgdl`; `None` when there
    /// are none.
    pub fn of(postings: impl Iterator<Item = (u32, u32)>, avgdl: f32) -> Option<Self> {
        let mut best: Option<[(u32, u32); BOUND_B.len()]> = None;
        // g_b(tf, dl) = num / tf with num = (1−b)·A + b·dl, computed as the f32 contribution
        // computes its norm's parts; compared by cross-multiplying (no division).
        let num = |b: f32, dl: u32| (1.0 - b) as f64 * avgdl as f64 + b as f64 * dl as f64;
        for (tf, dl) in postings {
            let best = best.get_or_insert([(tf, dl); BOUND_B.len()]);
            for (slot, &b) in best.iter_mut().zip(&BOUND_B) {
                if num(b, dl) * (slot.0 as f64) < num(b, slot.1) * tf as f64 {
                    *slot = (tf, dl);
                }
            }
        }
        best.map(|best| Self { best })
    }

    /// What a skip entry alone bounds: its largest tf at its shortest length at every b (the
    /// bound of an index without `blockmax.bin`).
    pub fn from_skip(s: SkipEntry) -> Self {
        Self {
            best: [(s.max_tf, s.min_len); BOUND_B.len()],
        }
    }

    /// Appends the entry's bytes.
    pub fn write(&self, out: &mut Vec<u8>) {
        for (tf, dl) in self.best {
            out.extend_from_slice(&tf.to_le_bytes());
            out.extend_from_slice(&dl.to_le_bytes());
        }
    }

    /// The (tf, dl) pairs at b = `BOUND_B[g]` and `BOUND_B[g + 1]` of the entry at the start of
    /// `bytes`, read without the rest: a bound reads only these, and loading the whole entry
    /// into an array indexed by `g` stalled on the stores it had just made. One bounds check for
    /// the 16 bytes: four calls of `codecs::read_u32` were 3.5 % slower on heavy AND (1 M
    /// synthetic index, paired A/B, 4 rounds, 2026-11-27).
    #[inline]
    pub fn read_ends(bytes: &[u8], g: usize) -> [(u32, u32); 2] {
        let e: &[u8; 16] = bytes[g * 8..g * 8 + 16].try_into().expect("16 bytes");
        let w = |i: usize| u32::from_le_bytes([e[i * 4], e[i * 4 + 1], e[i * 4 + 2], e[i * 4 + 3]]);
        [(w(0), w(1)), (w(2), w(3))]
    }

    /// Reads an entry from [`BLOCK_MAX_BYTES`] bytes.
    pub fn read(bytes: &[u8]) -> Self {
        let w = |i: usize| super::codecs::read_u32(bytes, i * 4);
        let mut best = [(0, 0); BOUND_B.len()];
        for (i, slot) in best.iter_mut().enumerate() {
            *slot = (w(2 * i), w(2 * i + 1));
        }
        Self { best }
    }
}

/// Appends one entry per block of [`BLOCK_LEN`] of a list to `blocks` and returns the whole
/// list's entry when it has two blocks or more (a list of one is bounded by its block's);
/// `doc_len(d)` gives document `d`'s scoring length.
pub fn push_list_maxes(
    docs: &[u32],
    tfs: &[u32],
    doc_len: impl Fn(u32) -> u32,
    avgdl: f32,
    blocks: &mut Vec<BlockMax>,
) -> Option<BlockMax> {
    let first = blocks.len();
    blocks.extend(
        docs.chunks(BLOCK_LEN)
            .zip(tfs.chunks(BLOCK_LEN))
            .filter_map(|(d, t)| {
                BlockMax::of(t.iter().zip(d).map(|(&tf, &d)| (tf, doc_len(d))), avgdl)
            }),
    );
    let list = &blocks[first..];
    match list.len() {
        0 | 1 => None,
        _ => BlockMax::of(list.iter().flat_map(|b| b.best), avgdl),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_pick_the_best_posting_per_b() {
        // (tf, dl): b = 0 wants the largest tf, b = 1 the largest tf/dl.
        let postings = [(3, 300), (1, 10), (2, 100)];
        let m = BlockMax::of(postings.into_iter(), 100.0).unwrap();
        assert_eq!(m.best[0], (3, 300));
        assert_eq!(m.best[3], (1, 10));
        let mut bytes = Vec::new();
        m.write(&mut bytes);
        assert_eq!(bytes.len(), BLOCK_MAX_BYTES);
        assert_eq!(BlockMax::read(&bytes), m);
        assert_eq!(BlockMax::of(std::iter::empty(), 1.0), None);
    }

    #[test]
    fn one_entry_per_block_and_one_per_list_of_two_blocks_or_more() {
        let docs: Vec<u32> = (0..300).collect();
        let tfs: Vec<u32> = (0..300).map(|d| if d == 200 { 9 } else { 1 }).collect();
        let mut out = Vec::new();
        let list = push_list_maxes(&docs, &tfs, |_| 50, 50.0, &mut out);
        assert_eq!(list.unwrap().best[0], (9, 50));
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].best[0], (1, 50));
        assert_eq!(out[1].best[0], (9, 50));
        assert_eq!(
            push_list_maxes(&docs[..128], &tfs[..128], |_| 50, 50.0, &mut out),
            None
        );
        assert_eq!(push_list_maxes(&[], &[], |_| 50, 50.0, &mut out), None);
        assert_eq!(out.len(), 4);
    }
}
