//! Block codecs for posting lists: docIDs and term frequencies in blocks of [`BLOCK_LEN`]
//! postings, each block decodable on its own (and on the GPU by popcount or prefix sum).
//!
//! A posting list is a sequence of blocks plus one [`SkipEntry`] per block. The skip entry gives
//! the block's last docID, so a decoder knows each block's bounds without reading it: block `j`
//! holds `n` docIDs in `base..=last`, where `base` is the previous block's last docID + 1 (0 for
//! the first block), `last` is this block's skip entry's `last_doc`, and `n` is [`BLOCK_LEN`]
//! except in the list's final block (`df - 128·(blocks - 1)`). Neither codec stores `base`,
//! `last` or `n` again.
//!
//! Every block starts with one little-endian header word and is a whole number of 32-bit words
//! long, so that blocks stay 4-byte aligned for the GPU:
//!
//! ```text
//! Elias-Fano block (ef.rs)                 PForDelta block (pfor.rs)
//! +------------------------------+         +------------------------------+
//! | u32 header: l | tfw<<8       |         | u32 header: b | ne<<8 |      |
//! +------------------------------+         |   ew<<16 | tfw<<24           |
//! | low bits: n × l bits  PACK   |         +------------------------------+
//! +------------------------------+         | slots: n × b bits     PACK   |
//! | high bits: unary, SEQ words  |         +------------------------------+
//! +------------------------------+         | exception positions: ne × u8 |
//! | tf−1: n × tfw bits    PACK   |         |   zero-padded to 4 bytes     |
//! +------------------------------+         +------------------------------+
//!                                          | exception high bits:         |
//!                                          |   ne × ew bits, SEQ          |
//!                                          +------------------------------+
//!                                          | tf−1: n × tfw bits    PACK   |
//!                                          +------------------------------+
//! ```
//!
//! Bit-packing layouts (all words little-endian u32):
//! - `SEQ` (sequential): value `i` occupies bits `i·w .. i·w+w` of the bit stream formed by the
//!   words in order, least significant bit first; `ceil(n·w/32)` words.
//! - `PACK` is `SEQ` when `n < 128` (only the final block of a list), and for full blocks the
//!   `bitpacking` crate's BitPacker4x layout (SIMD-BP128): four interleaved lanes, value `i` in
//!   lane `i % 4` at lane offset `(i / 4)·w` bits, lane word `k` stored as word `4k + lane`;
//!   `16·w` bytes.

pub mod ef;
pub mod pfor;

use bitpacking::{BitPacker, BitPacker4x};
use serde::{Deserialize, Serialize};

/// Postings per block; the one constant every codec, skip list and kernel is built around.
pub const BLOCK_LEN: usize = 128;

const _: () = assert!(BLOCK_LEN == BitPacker4x::BLOCK_LEN);

/// Which codec holds the docIDs (term frequencies are bit-packed either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// Partitioned Elias-Fano, one partition per block (Para-EF on the GPU).
    Ef,
    /// PForDelta of d-gaps with exceptions in side arrays.
    Pfor,
}

impl Codec {
    /// The codec's name in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Ef => "ef",
            Codec::Pfor => "pfor",
        }
    }
}

/// One skip entry per block (16 bytes on disk, four little-endian u32 in this order).
///
/// `max_tf` and `min_len` bound BM25 for any k1 ≥ 0 and b ∈ [0, 1]: the per-term score grows
/// with tf and shrinks with the document length, so the block's largest tf at its shortest
/// length bounds every posting of the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SkipEntry {
    /// The block's last (largest) docID.
    pub last_doc: u32,
    /// Byte offset of the block from the start of its list.
    pub offset: u32,
    /// Largest term frequency in the block.
    pub max_tf: u32,
    /// Smallest scoring-stream length among the block's documents.
    pub min_len: u32,
}

/// Bytes of one skip entry on disk.
pub const SKIP_ENTRY_BYTES: usize = 16;

impl SkipEntry {
    /// Appends the entry's 16 bytes.
    pub fn write(&self, out: &mut Vec<u8>) {
        for v in [self.last_doc, self.offset, self.max_tf, self.min_len] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Reads an entry from 16 bytes.
    pub fn read(bytes: &[u8]) -> Self {
        let w = |i: usize| read_u32(bytes, i * 4);
        SkipEntry {
            last_doc: w(0),
            offset: w(1),
            max_tf: w(2),
            min_len: w(3),
        }
    }
}

/// Where a block's docIDs lie: `n` docIDs in `base..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockBounds {
    /// Smallest possible docID (previous block's last + 1, or 0).
    pub base: u32,
    /// The block's last docID (from its skip entry).
    pub last: u32,
    /// Number of postings, 1..=128.
    pub n: usize,
}

/// Decodes blocks into reused buffers (no allocation per block).
pub struct BlockDecoder {
    packer: BitPacker4x,
    /// The decoded docIDs (`..n` valid after [`BlockDecoder::decode_docs`]).
    pub docs: [u32; BLOCK_LEN],
    /// The decoded term frequencies (`..n` valid after [`BlockDecoder::decode_tfs`]).
    pub tfs: [u32; BLOCK_LEN],
    /// Scratch of the EF decode (its high parts), kept from block to block.
    high: [u32; BLOCK_LEN + 8],
}

impl Default for BlockDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl BlockDecoder {
    /// A decoder with zeroed buffers.
    pub fn new() -> Self {
        Self {
            packer: BitPacker4x::new(),
            docs: [0; BLOCK_LEN],
            tfs: [0; BLOCK_LEN],
            high: [0; BLOCK_LEN + 8],
        }
    }

    /// Decodes the block's docIDs into `self.docs[..bounds.n]`, every one at most
    /// `bounds.last` and the last one `bounds.last`.
    ///
    /// # Assumptions
    /// `block` passed [`block_len`] for these bounds (the reader checks every block at open);
    /// a block that did not may decode to wrong values but never reads outside `block`
    /// (slices are bounds-checked). Its bits are not checked at open, so a corrupted block
    /// whose file's CRC-32 was forged to match decodes to wrong docIDs: they are capped at the
    /// block's last, so that none indexes past the collection (`last` < N is checked at open)
    /// and a cursor's seek to a docID ≤ `last` stops inside the block.
    pub fn decode_docs(&mut self, codec: Codec, block: &[u8], bounds: BlockBounds) {
        match codec {
            Codec::Ef => {
                ef::decode_docs(&self.packer, block, bounds, &mut self.docs, &mut self.high)
            }
            Codec::Pfor => pfor::decode_docs(&self.packer, block, bounds, &mut self.docs),
        }
        // Only the upper bound: it is what keeps a docID inside the collection and a seek inside
        // the block; a lower clamp as well cost 8–18 % of the decode (`benches/selection_decode`).
        let docs = &mut self.docs[..bounds.n];
        for d in docs.iter_mut() {
            *d = (*d).min(bounds.last);
        }
        if let Some(last) = docs.last_mut() {
            *last = bounds.last;
        }
    }

    /// Decodes the block's term frequencies into `self.tfs[..bounds.n]`.
    pub fn decode_tfs(&mut self, codec: Codec, block: &[u8], bounds: BlockBounds) {
        let header = read_u32(block, 0);
        let at = match codec {
            Codec::Ef => ef::tf_offset(header, bounds),
            Codec::Pfor => pfor::tf_offset(header, bounds),
        };
        let width = (header >> 24) as u8;
        unpack(&self.packer, &block[at..], bounds.n, width, &mut self.tfs);
        for tf in &mut self.tfs[..bounds.n] {
            *tf = tf.wrapping_add(1);
        }
    }
}

/// Encodes one block (`docs` strictly increasing, all in `base..`, 1..=128 of them; `tfs ≥ 1`)
/// and appends it to `out`.
///
/// # Panics
/// When the preconditions fail (the builder guarantees them).
pub fn encode_block(codec: Codec, docs: &[u32], tfs: &[u32], base: u32, out: &mut Vec<u8>) {
    assert!(!docs.is_empty() && docs.len() <= BLOCK_LEN && docs.len() == tfs.len());
    let packer = BitPacker4x::new();
    let header_at = out.len();
    let header = match codec {
        Codec::Ef => ef::encode_docs(&packer, docs, base, out),
        Codec::Pfor => pfor::encode_docs(&packer, docs, base, out),
    };
    let mut minus_one = [0u32; BLOCK_LEN];
    for (m, &tf) in minus_one.iter_mut().zip(tfs) {
        assert!(tf >= 1, "term frequencies start at 1");
        *m = tf - 1;
    }
    let width = bit_width(minus_one[..tfs.len()].iter().copied().max().unwrap_or(0));
    pack(&packer, &minus_one[..tfs.len()], width, out);
    out[header_at..header_at + 4].copy_from_slice(&(header | (width as u32) << 24).to_le_bytes());
}

/// The exact byte length of the block starting at `block[0]` for these bounds, computed from
/// its header, after checking every header field and side array against the bounds.
///
/// # Errors
/// A description of the failed check (the reader wraps it in `IndexError::Corrupt`).
pub fn block_len(codec: Codec, block: &[u8], bounds: BlockBounds) -> Result<usize, String> {
    if block.len() < 4 {
        return Err(format!("block of {} bytes has no header word", block.len()));
    }
    if bounds.n == 0 || bounds.n > BLOCK_LEN || bounds.last < bounds.base {
        return Err(format!("block bounds {bounds:?} impossible"));
    }
    let header = read_u32(block, 0);
    let tfw = header >> 24;
    if tfw > 32 {
        return Err(format!("tf bit width {tfw} > 32"));
    }
    let at = match codec {
        Codec::Ef => ef::check(header, block, bounds)?,
        Codec::Pfor => pfor::check(header, block, bounds)?,
    };
    let len = at + packed_bytes(bounds.n, tfw as u8);
    if len > block.len() {
        return Err(format!(
            "block needs {len} bytes, {} available",
            block.len()
        ));
    }
    Ok(len)
}

/// Encodes a whole list (`docs` strictly increasing, `tfs ≥ 1`) block by block, appending the
/// blocks to `out` and one skip entry per block to `skips`; `doc_len(d)` gives the scoring
/// length of document `d` (for the skip entries' `min_len`). Offsets are relative to
/// `out.len()` at the call.
pub fn encode_list(
    codec: Codec,
    docs: &[u32],
    tfs: &[u32],
    doc_len: impl Fn(u32) -> u32,
    out: &mut Vec<u8>,
    skips: &mut Vec<SkipEntry>,
) {
    let start = out.len();
    let mut base = 0u32;
    for (d, t) in docs.chunks(BLOCK_LEN).zip(tfs.chunks(BLOCK_LEN)) {
        let offset = (out.len() - start) as u32;
        encode_block(codec, d, t, base, out);
        let last = *d.last().expect("chunks are non-empty");
        skips.push(SkipEntry {
            last_doc: last,
            offset,
            max_tf: t.iter().copied().max().unwrap_or(0),
            min_len: d.iter().map(|&x| doc_len(x)).min().unwrap_or(0),
        });
        base = last.wrapping_add(1);
    }
}

/// Bounds of block `j` of a list from its skip entries and document frequency.
pub fn bounds_of(skips: impl Fn(usize) -> SkipEntry, j: usize, df: usize) -> BlockBounds {
    let base = if j == 0 {
        0
    } else {
        skips(j - 1).last_doc.wrapping_add(1)
    };
    let n = if (j + 1) * BLOCK_LEN <= df {
        BLOCK_LEN
    } else {
        df - j * BLOCK_LEN
    };
    BlockBounds {
        base,
        last: skips(j).last_doc,
        n,
    }
}

/// Number of bits needed for `v` (0 for 0).
pub fn bit_width(v: u32) -> u8 {
    (32 - v.leading_zeros()) as u8
}

/// Reads a little-endian u32 at byte `at`.
#[inline]
pub fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// Bytes taken by `n` values of `width` bits in the `PACK` layout.
pub fn packed_bytes(n: usize, width: u8) -> usize {
    if n == BLOCK_LEN {
        16 * width as usize
    } else {
        seq_bytes(n, width)
    }
}

/// Bytes taken by `n` values of `width` bits in the `SEQ` layout (whole words).
pub fn seq_bytes(n: usize, width: u8) -> usize {
    (n * width as usize).div_ceil(32) * 4
}

/// Appends `values` packed at `width` bits in the `PACK` layout.
pub(crate) fn pack(packer: &BitPacker4x, values: &[u32], width: u8, out: &mut Vec<u8>) {
    if values.len() == BLOCK_LEN {
        let at = out.len();
        out.resize(at + 16 * width as usize, 0);
        packer.compress(values, &mut out[at..], width);
    } else {
        pack_seq(values, width, out);
    }
}

/// Unpacks `n` values of `width` bits in the `PACK` layout from the start of `bytes`.
pub(crate) fn unpack(
    packer: &BitPacker4x,
    bytes: &[u8],
    n: usize,
    width: u8,
    out: &mut [u32; BLOCK_LEN],
) {
    if n == BLOCK_LEN {
        packer.decompress(&bytes[..16 * width as usize], out, width);
    } else {
        unpack_seq(bytes, width, &mut out[..n]);
    }
}

/// Value `i` of `n` values of `width` bits in the `PACK` layout at the start of `bytes`, read in
/// place (the others are not unpacked). Words past the end of `bytes` read as zero.
#[inline]
pub(crate) fn packed_value(bytes: &[u8], n: usize, width: u8, i: usize) -> u32 {
    let (word, shift) = match n == BLOCK_LEN {
        // Lane i % 4 at bit (i / 4)·width of the lane, whose word k is word 4k + lane.
        true => {
            let at = i / 4 * width as usize;
            (4 * (at / 32) + i % 4, at % 32)
        }
        false => {
            let at = i * width as usize;
            (at / 32, at % 32)
        }
    };
    let next = match n == BLOCK_LEN {
        true => word + 4,
        false => word + 1,
    };
    let read = |w: usize| bytes.get(4 * w..4 * w + 4).map_or(0, |b| read_u32(b, 0)) as u64;
    let pair = read(word) | read(next) << 32;
    ((pair >> shift) & ((1u64 << width) - 1)) as u32
}

/// Appends `values` at `width` bits in the `SEQ` layout.
pub(crate) fn pack_seq(values: &[u32], width: u8, out: &mut Vec<u8>) {
    let mut acc = 0u64;
    let mut bits = 0u32;
    for &v in values {
        acc |= (v as u64) << bits;
        bits += width as u32;
        if bits >= 32 {
            out.extend_from_slice(&(acc as u32).to_le_bytes());
            acc >>= 32;
            bits -= 32;
        }
    }
    if bits > 0 {
        out.extend_from_slice(&(acc as u32).to_le_bytes());
    }
}

/// Unpacks `out.len()` values of `width` bits in the `SEQ` layout from `bytes`.
pub(crate) fn unpack_seq(bytes: &[u8], width: u8, out: &mut [u32]) {
    let words = seq_bytes(out.len(), width) / 4;
    let mask = if width == 32 {
        u32::MAX as u64
    } else {
        (1u64 << width) - 1
    };
    let word = |w: usize| {
        if w < words {
            read_u32(bytes, w * 4) as u64
        } else {
            0
        }
    };
    for (i, o) in out.iter_mut().enumerate() {
        let bit = i * width as usize;
        let w = bit / 32;
        let pair = word(w) | (word(w + 1) << 32);
        *o = ((pair >> (bit % 32)) & mask) as u32;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bit `i` of the little-endian word stream `bytes`.
    fn bit(bytes: &[u8], i: usize) -> u32 {
        ((bytes[i / 8] >> (i % 8)) & 1) as u32
    }

    /// Naive reference for the `PACK`/`SEQ` layouts, read bit by bit as the module doc draws them.
    pub(crate) fn naive_unpack(bytes: &[u8], n: usize, width: u8, interleaved: bool) -> Vec<u32> {
        (0..n)
            .map(|i| {
                (0..width as usize)
                    .map(|k| {
                        let stream_bit = if interleaved {
                            (i / 4) * width as usize + k
                        } else {
                            i * width as usize + k
                        };
                        let byte_bit = if interleaved {
                            let word = stream_bit / 32;
                            (4 * word + i % 4) * 32 + stream_bit % 32
                        } else {
                            stream_bit
                        };
                        bit(bytes, byte_bit) << k
                    })
                    .sum()
            })
            .collect()
    }

    /// Naive reference decoder of a whole list, from the documented layouts only.
    pub(crate) fn naive_decode_list(
        codec: Codec,
        bytes: &[u8],
        skips: &[SkipEntry],
        df: usize,
    ) -> (Vec<u32>, Vec<u32>) {
        let (mut docs, mut tfs) = (Vec::new(), Vec::new());
        for j in 0..skips.len() {
            let b = bounds_of(|k| skips[k], j, df);
            let block = &bytes[skips[j].offset as usize..];
            let header = read_u32(block, 0);
            let full = b.n == BLOCK_LEN;
            let pbytes = |w: u8| {
                if full {
                    16 * w as usize
                } else {
                    (b.n * w as usize).div_ceil(32) * 4
                }
            };
            let tf_at;
            match codec {
                Codec::Ef => {
                    let l = (header & 0xff) as u8;
                    let low = naive_unpack(&block[4..], b.n, l, full);
                    let high_at = 4 + pbytes(l);
                    let mut i = 0;
                    let mut pos = 0;
                    while i < b.n {
                        if bit(&block[high_at..], pos) == 1 {
                            let high = (pos - i) as u64;
                            docs.push((b.base as u64 + (high << l) + low[i] as u64) as u32);
                            i += 1;
                        }
                        pos += 1;
                    }
                    let high_bits = ((b.last - b.base) as u64 >> l) as usize + b.n;
                    tf_at = high_at + high_bits.div_ceil(32) * 4;
                }
                Codec::Pfor => {
                    let bw = (header & 0xff) as u8;
                    let ne = ((header >> 8) & 0xff) as usize;
                    let ew = ((header >> 16) & 0xff) as u8;
                    let mut v: Vec<u64> = naive_unpack(&block[4..], b.n, bw, full)
                        .into_iter()
                        .map(u64::from)
                        .collect();
                    let pos_at = 4 + pbytes(bw);
                    let high_at = pos_at + ne.div_ceil(4) * 4;
                    let highs = naive_unpack(&block[high_at..], ne, ew, false);
                    for e in 0..ne {
                        v[block[pos_at + e] as usize] += (highs[e] as u64) << bw;
                    }
                    let mut d = b.base as u64;
                    for (i, g) in v.iter().enumerate() {
                        d += g + u64::from(i > 0);
                        docs.push(d as u32);
                    }
                    tf_at = high_at + (ne * ew as usize).div_ceil(32) * 4;
                }
            }
            let tfw = (header >> 24) as u8;
            tfs.extend(
                naive_unpack(&block[tf_at..], b.n, tfw, full)
                    .into_iter()
                    .map(|t| t + 1),
            );
        }
        (docs, tfs)
    }

    /// Fast decode of a whole list through [`BlockDecoder`], checking every block's length.
    pub(crate) fn fast_decode_list(
        codec: Codec,
        bytes: &[u8],
        skips: &[SkipEntry],
        df: usize,
    ) -> (Vec<u32>, Vec<u32>) {
        let mut dec = BlockDecoder::new();
        let (mut docs, mut tfs) = (Vec::new(), Vec::new());
        for j in 0..skips.len() {
            let b = bounds_of(|k| skips[k], j, df);
            let start = skips[j].offset as usize;
            let end = skips.get(j + 1).map_or(bytes.len(), |s| s.offset as usize);
            let block = &bytes[start..end];
            assert_eq!(
                block_len(codec, block, b),
                Ok(block.len()),
                "block {j} length"
            );
            dec.decode_docs(codec, block, b);
            dec.decode_tfs(codec, block, b);
            docs.extend_from_slice(&dec.docs[..b.n]);
            tfs.extend_from_slice(&dec.tfs[..b.n]);
        }
        (docs, tfs)
    }

    fn round_trip(docs: &[u32], tfs: &[u32]) {
        for codec in [Codec::Ef, Codec::Pfor] {
            let (mut bytes, mut skips) = (Vec::new(), Vec::new());
            encode_list(codec, docs, tfs, |d| d % 1000 + 1, &mut bytes, &mut skips);
            assert_eq!(skips.len(), docs.len().div_ceil(BLOCK_LEN));
            assert_eq!(bytes.len() % 4, 0);
            let fast = fast_decode_list(codec, &bytes, &skips, docs.len());
            assert_eq!(
                (&fast.0[..], &fast.1[..]),
                (docs, tfs),
                "{codec:?} fast decode"
            );
            let naive = naive_decode_list(codec, &bytes, &skips, docs.len());
            assert_eq!(naive, fast, "{codec:?} naive reference");
            for (j, s) in skips.iter().enumerate() {
                let d = &docs[j * BLOCK_LEN..((j + 1) * BLOCK_LEN).min(docs.len())];
                let t = &tfs[j * BLOCK_LEN..((j + 1) * BLOCK_LEN).min(docs.len())];
                assert_eq!(s.max_tf, *t.iter().max().unwrap());
                assert_eq!(s.min_len, d.iter().map(|x| x % 1000 + 1).min().unwrap());
            }
        }
    }

    fn from_gaps(gaps: &[u32]) -> Vec<u32> {
        let mut d = 0u64;
        gaps.iter()
            .enumerate()
            .map(|(i, &g)| {
                d = if i == 0 { g as u64 } else { d + g as u64 };
                d as u32
            })
            .collect()
    }

    #[test]
    fn adversarial_lists_round_trip() {
        round_trip(&[], &[]);
        round_trip(&[0], &[1]);
        round_trip(&[u32::MAX], &[u32::MAX]);
        for n in [1, 2, 127, 128, 129, 255, 256, 257, 1000] {
            let ones: Vec<u32> = (0..n as u32).collect();
            round_trip(&ones, &vec![1; n]);
            let tfs: Vec<u32> = (0..n as u32).map(|i| i * 7919 % 300 + 1).collect();
            let shifted: Vec<u32> = (0..n as u32).map(|i| u32::MAX - n as u32 + 1 + i).collect();
            round_trip(&shifted, &tfs);
        }
        // Gaps near 2^32: three documents spanning the whole docID space.
        round_trip(&[0, 1, u32::MAX - 1, u32::MAX], &[1, 2, 3, 4]);
        round_trip(&[5, u32::MAX - 3], &[9, 1]);
        // 128 postings, one huge gap among unit gaps (one PFor exception; EF with large U).
        let mut gaps = vec![1u32; 128];
        gaps[0] = 3;
        gaps[64] = u32::MAX - 300;
        round_trip(&from_gaps(&gaps), &vec![2; 128]);
        let mut gaps = vec![1u32; 129];
        gaps[128] = 4_000_000_000;
        round_trip(&from_gaps(&gaps), &vec![1; 129]);
    }

    fn list_strategy() -> impl Strategy<Value = (Vec<u32>, Vec<u32>)> {
        let gap = prop_oneof![
            6 => 1u32..4,
            3 => 1u32..1000,
            1 => 1u32..20_000_000,
        ];
        (
            proptest::collection::vec(gap, 0..700),
            0u32..1000,
            proptest::collection::vec(1u32..100, 700),
        )
            .prop_map(|(gaps, first, tf_pool)| {
                let mut docs = Vec::with_capacity(gaps.len());
                let mut d = first as u64;
                for (i, g) in gaps.iter().enumerate() {
                    if i > 0 {
                        d += *g as u64;
                    }
                    if d > u32::MAX as u64 {
                        break;
                    }
                    docs.push(d as u32);
                }
                let tfs = docs
                    .iter()
                    .enumerate()
                    .map(|(i, _)| {
                        if i % 17 == 3 {
                            tf_pool[i] * 1000
                        } else {
                            tf_pool[i]
                        }
                    })
                    .collect();
                (docs, tfs)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn random_lists_round_trip((docs, tfs) in list_strategy()) {
            round_trip(&docs, &tfs);
        }
    }

    proptest! {
        /// A value read in place is the one unpacking gives, in either layout, at any width.
        #[test]
        fn packed_values_read_in_place_match_unpacking(
            values in proptest::collection::vec(any::<u32>(), 1..=BLOCK_LEN),
            width in 0u8..=32,
        ) {
            let mask = ((1u64 << width) - 1) as u32;
            let values: Vec<u32> = values.iter().map(|v| v & mask).collect();
            let packer = BitPacker4x::new();
            let mut out = Vec::new();
            pack(&packer, &values, width, &mut out);
            for (i, &v) in values.iter().enumerate() {
                prop_assert_eq!(packed_value(&out, values.len(), width, i), v);
            }
        }
    }

    #[test]
    fn seq_and_interleaved_layouts_match_the_drawn_layout() {
        let packer = BitPacker4x::new();
        let values: Vec<u32> = (0..128u32)
            .map(|i| i.wrapping_mul(2654435761) >> 19)
            .collect();
        for n in [1usize, 5, 100, 128] {
            let mut out = Vec::new();
            pack(&packer, &values[..n], 13, &mut out);
            assert_eq!(out.len(), packed_bytes(n, 13));
            assert_eq!(naive_unpack(&out, n, 13, n == 128), values[..n].to_vec());
        }
    }
}
