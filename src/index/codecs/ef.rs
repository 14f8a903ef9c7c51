//! Partitioned Elias-Fano, one partition per 128-posting block (Griffin PPoPP'18, "Para-EF").
//!
//! A block's docIDs become `v_i = d_i − base` in `0..=U` with `U = last − base` (both known
//! from the skip list, see the module above). With `l = min(31, ⌊log2((U+1)/n)⌋)` (0 when
//! `U+1 < 2n`), the low `l` bits of every `v_i` are bit-packed (`PACK`), and the high part
//! `h_i = v_i >> l` is written in unary: bit `h_i + i` of the high-bit words is set. There are
//! `(U >> l) + n` high bits, rounded up to whole words.
//!
//! ```text
//! word 0            header: bits 0..8 = l, bits 24..32 = tf width (set by the caller)
//! words 1..         low bits, n × l bits (PACK: BitPacker4x when n = 128, else SEQ)
//! then              high bits, ceil(((U >> l) + n) / 32) words, bit h_i + i set for each i
//! then              tf − 1, n × tf-width bits (PACK)
//! ```
//!
//! Decoding (CPU): unpack the low bits, then read the high bits a byte at a time: the `i`-th set
//! bit at position `p` gives `h_i = p − i`, so a byte `k` whose set bits are the `i`-th on
//! gives `h_{i+j} = (8k − i) + (p_j − j)` for its `j`-th set bit at place `p_j`, and a table of
//! `p_j − j` per byte value writes all its values at once, with no branch per posting. A cursor's
//! seeks into a block read it in place first ([`InPlace`]), decoding nothing. On the GPU each thread takes a high word, counts its set bits (popcount), a
//! prefix sum over the counts says which `i` each word's bits belong to, and each set bit is
//! decoded independently: exactly the Para-EF scheme.

use bitpacking::BitPacker4x;

use super::{pack, packed_bytes, packed_value, read_u32, unpack, BlockBounds, BLOCK_LEN};

/// The low-bit width for `n` values in `0..=u`.
pub fn low_width(u: u32, n: usize) -> u8 {
    let q = (u as u64 + 1) / n as u64;
    if q <= 1 {
        0
    } else {
        (63 - q.leading_zeros()).min(31) as u8
    }
}

/// Words of the high-bits part of a block of `n` values in `0..=u` with `l` low bits.
pub fn high_words(u: u32, l: u8, n: usize) -> usize {
    (((u >> l) as usize) + n).div_ceil(32)
}

/// Appends the header placeholder, low bits and high bits; returns the header word (without
/// the tf width).
pub(super) fn encode_docs(packer: &BitPacker4x, docs: &[u32], base: u32, out: &mut Vec<u8>) -> u32 {
    let n = docs.len();
    let last = docs[n - 1];
    let u = last - base;
    let l = low_width(u, n);
    let mask = if l == 0 { 0 } else { (1u32 << l) - 1 };
    out.extend_from_slice(&[0; 4]);
    let mut low = [0u32; BLOCK_LEN];
    for (o, &d) in low.iter_mut().zip(docs) {
        *o = (d - base) & mask;
    }
    pack(packer, &low[..n], l, out);
    let words = high_words(u, l, n);
    let at = out.len();
    out.resize(at + words * 4, 0);
    for (i, &d) in docs.iter().enumerate() {
        let pos = ((d - base) >> l) as usize + i;
        out[at + pos / 8] |= 1 << (pos % 8);
    }
    l as u32
}

/// Byte offset of the tf section.
pub(super) fn tf_offset(header: u32, b: BlockBounds) -> usize {
    let l = (header & 0xff) as u8;
    4 + packed_bytes(b.n, l) + high_words(b.last - b.base, l, b.n) * 4
}

/// Checks the header against the bounds; returns the tf section's offset.
pub(super) fn check(header: u32, block: &[u8], b: BlockBounds) -> Result<usize, String> {
    let l = (header & 0xff) as u8;
    let expected = low_width(b.last - b.base, b.n);
    if l != expected || header & 0x00ff_ff00 != 0 {
        return Err(format!(
            "EF header {header:#010x}: low width {l}, expected {expected} for {b:?}"
        ));
    }
    let at = tf_offset(header, b);
    if at > block.len() {
        return Err(format!(
            "EF block needs {at} bytes before its tfs, {} available",
            block.len()
        ));
    }
    Ok(at)
}

/// For each byte value: the place of its `j`-th set bit less `j` at entry `j` (entries past its
/// set bits are 0 and overwritten by the next byte's), and its number of set bits.
static HIGH_BYTES: [([u8; 8], u8); 256] = {
    let mut t = [([0u8; 8], 0u8); 256];
    let mut byte = 0;
    while byte < 256 {
        let mut j = 0;
        let mut p = 0;
        while p < 8 {
            if byte >> p & 1 == 1 {
                t[byte].0[j] = (p - j) as u8;
                j += 1;
            }
            p += 1;
        }
        t[byte].1 = j as u8;
        byte += 1;
    }
    t
};

/// Decodes the docIDs (see the module doc).
pub(super) fn decode_docs(
    packer: &BitPacker4x,
    block: &[u8],
    b: BlockBounds,
    docs: &mut [u32; BLOCK_LEN],
    high: &mut [u32; BLOCK_LEN + 8],
) {
    let l = (read_u32(block, 0) & 0xff) as u8;
    let low_len = packed_bytes(b.n, l);
    unpack(packer, &block[4..4 + low_len], b.n, l, docs);
    let high_at = 4 + low_len;
    let words = high_words(b.last - b.base, l, b.n);
    // Each byte writes 8 values from the next unwritten one; only its set bits' are kept. A
    // block with more set bits than postings (corrupted) stops writing at the buffer's end, and
    // one with fewer leaves the last block's values in `high` (wrong docIDs, but capped).
    let mut i = 0usize;
    for (k, &byte) in block[high_at..high_at + words * 4].iter().enumerate() {
        let (places, count) = &HIGH_BYTES[byte as usize];
        let at = (8 * k as u32).wrapping_sub(i as u32);
        let out: &mut [u32; 8] = (&mut high[i..i + 8]).try_into().expect("8 values");
        for (o, &p) in out.iter_mut().zip(places) {
            *o = at.wrapping_add(p as u32);
        }
        i = (i + *count as usize).min(BLOCK_LEN);
    }
    for (d, &h) in docs[..b.n].iter_mut().zip(high.iter()) {
        *d = b.base.wrapping_add(h.wrapping_shl(l as u32) | *d);
    }
}

/// Bits of the high part one step of [`InPlace::seek`] reads at once (a byte-aligned 64-bit load
/// shifted into place keeps at least 57).
const WINDOW: usize = 56;
const WINDOW_MASK: u64 = (1 << WINDOW) - 1;

/// A block read in place: a cursor's seeks find their posting on the block's bits (Elias-Fano's
/// direct access) without decoding the block, for blocks where only a few postings are sought
/// (most of an AND follower's). A seek to `v` passes the zeros of the high part's buckets below
/// `v >> l`, popcount and select a word at a time, then reads the set bits from there, each
/// posting's low bits and term frequency read alone (`packed_value`). Seeks go forward from the
/// last posting found.
#[derive(Debug, Clone, Copy)]
pub struct InPlace<'a> {
    block: &'a [u8],
    bounds: BlockBounds,
    l: u8,
    high_at: usize,
    /// Bits of the high part, `(U >> l) + n`.
    high_bits: usize,
    tf_at: usize,
    tf_width: u8,
    /// The next bit of the high part to read, and the set bits (postings) before it.
    bit: usize,
    i: usize,
}

impl<'a> InPlace<'a> {
    /// The block (which passed [`super::block_len`] for `bounds`) before its first posting.
    pub fn new(block: &'a [u8], bounds: BlockBounds) -> Self {
        let header = read_u32(block, 0);
        let l = ((header & 0xff) as u8).min(31);
        let high_at = 4 + packed_bytes(bounds.n, l);
        Self {
            block,
            bounds,
            l,
            high_at,
            high_bits: ((bounds.last - bounds.base) >> l) as usize + bounds.n,
            tf_at: tf_offset(header, bounds),
            tf_width: ((header >> 24) as u8).min(32),
            bit: 0,
            i: 0,
        }
    }

    /// The first posting from the last one found on (exclusive) whose docID is ≥ `target`, with
    /// `target` in `base..=last`: its place and docID. The docID is in `target..=last` whatever
    /// the block's bits (a corrupted block whose bits run out gives its last posting).
    pub fn seek(&mut self, target: u32) -> (usize, u32) {
        let v = target.saturating_sub(self.bounds.base);
        let bucket = (v >> self.l) as usize;
        // Every posting before the bucket's is below v: pass the high part's zeros up to it.
        let zeros_before = self.bit - self.i;
        if zeros_before < bucket {
            let mut left = bucket - zeros_before;
            loop {
                if self.bit >= self.high_bits {
                    return self.past_end();
                }
                let zeros = !self.window() & WINDOW_MASK;
                let counts = byte_counts(zeros);
                let here = (counts >> 56) as usize;
                if here >= left {
                    self.bit += select(zeros, counts, left as u32 - 1) as usize + 1;
                    break;
                }
                left -= here;
                self.bit += WINDOW;
            }
            self.i = self.bit - bucket;
        }
        let low_mask = ((1u64 << self.l) - 1) as u32;
        loop {
            if self.bit >= self.high_bits || self.i >= self.bounds.n {
                return self.past_end();
            }
            let ones = self.window() & WINDOW_MASK;
            if ones == 0 {
                self.bit += WINDOW;
                continue;
            }
            let at = self.bit + ones.trailing_zeros() as usize;
            let low = self.low(self.i) & low_mask;
            let value = ((at - self.i) as u32).wrapping_shl(self.l as u32) | low;
            let i = self.i;
            self.bit = at + 1;
            self.i += 1;
            if value >= v {
                let doc = self.bounds.base.saturating_add(value).min(self.bounds.last);
                return (i, doc);
            }
        }
    }

    /// The term frequency of posting `i`.
    pub fn tf(&self, i: usize) -> u32 {
        let tfs = self.block.get(self.tf_at..).unwrap_or(&[]);
        packed_value(tfs, self.bounds.n, self.tf_width, i).wrapping_add(1)
    }

    fn low(&self, i: usize) -> u32 {
        packed_value(&self.block[4..], self.bounds.n, self.l, i)
    }

    /// The high part's bits from `self.bit` on, in the low [`WINDOW`] bits (bits past the block
    /// read as zero).
    #[inline]
    fn window(&self) -> u64 {
        let at = self.high_at + self.bit / 8;
        let word = match self.block.get(at..at + 8) {
            Some(b) => u64::from_le_bytes(b.try_into().expect("8 bytes")),
            None => {
                let rest = self.block.get(at..).unwrap_or(&[]);
                let mut b = [0u8; 8];
                b[..rest.len()].copy_from_slice(rest);
                u64::from_le_bytes(b)
            }
        };
        word >> (self.bit % 8)
    }

    /// What a seek gives once the bits ran out (a corrupted block): the last posting.
    fn past_end(&mut self) -> (usize, u32) {
        self.bit = self.high_bits;
        self.i = self.bounds.n;
        (self.bounds.n - 1, self.bounds.last)
    }
}

const BYTES_OF_ONES: u64 = 0x0101_0101_0101_0101;

/// Each byte of `x` replaced by the set bits of `x` up to and including it (the top byte: all).
#[inline]
fn byte_counts(x: u64) -> u64 {
    let pairs = x - ((x >> 1) & 0x5555_5555_5555_5555);
    let nibbles = (pairs & 0x3333_3333_3333_3333) + ((pairs >> 2) & 0x3333_3333_3333_3333);
    let bytes = (nibbles + (nibbles >> 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    bytes.wrapping_mul(BYTES_OF_ONES)
}

/// The place of set bit `r` (from 0) of `x`, which has more than `r`; `counts` is
/// [`byte_counts`]`(x)`. Branch-free: the bytes whose running count is ≤ `r` come before the
/// bit's byte, and [`HIGH_BYTES`] places it in its byte.
#[inline]
fn select(x: u64, counts: u64, r: u32) -> u32 {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Per byte, its high bit set where the running count is ≤ r (both ≤ 64: no borrow).
    let at_most = (((r as u64 * BYTES_OF_ONES) | HIGH) - counts) & HIGH;
    let byte = ((at_most >> 7).wrapping_mul(BYTES_OF_ONES) >> 56) as u32;
    let before = ((counts << 8) >> (8 * byte)) as u8 as u32;
    let (places, _) = &HIGH_BYTES[(x >> (8 * byte)) as u8 as usize];
    let j = r - before;
    8 * byte + places[j as usize] as u32 + j
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitpacking::BitPacker;

    proptest::proptest! {
        /// The set bit `r` is found wherever it lies.
        #[test]
        fn select_finds_the_rth_set_bit(x in proptest::prelude::any::<u64>(), r in 0u32..64) {
            let places: Vec<u32> = (0..64).filter(|&p| x >> p & 1 == 1).collect();
            if let Some(&want) = places.get(r as usize) {
                proptest::prop_assert_eq!(select(x, byte_counts(x), r), want);
            }
            proptest::prop_assert_eq!((byte_counts(x) >> 56) as u32, x.count_ones());
        }
    }

    proptest::proptest! {
        /// Seeks in place find what a search of the decoded block finds: the first posting
        /// from the last one found on whose docID is ≥ the target, and its tf.
        #[test]
        fn seeks_in_place_match_the_decoded_block(
            gaps in proptest::collection::vec(1u32..2000, 1..=BLOCK_LEN),
            base in 0u32..1000,
            steps in proptest::collection::vec(0u32..3000, 1..40),
        ) {
            let mut d = base;
            let docs: Vec<u32> = gaps.iter().map(|g| { d += g - 1; let x = d; d += 1; x }).collect();
            let tfs: Vec<u32> = docs.iter().map(|d| d % 300 + 1).collect();
            let mut block = Vec::new();
            super::super::encode_block(super::super::Codec::Ef, &docs, &tfs, base, &mut block);
            let bounds = BlockBounds { base, last: *docs.last().unwrap(), n: docs.len() };
            let mut reader = InPlace::new(&block, bounds);
            let mut target = base;
            let mut from = 0;
            for step in steps {
                target = (target + step).min(bounds.last);
                let Some(want) = (from..docs.len()).find(|&i| docs[i] >= target) else { break };
                let (i, doc) = reader.seek(target);
                proptest::prop_assert_eq!((i, doc), (want, docs[want]));
                proptest::prop_assert_eq!(reader.tf(i), tfs[i]);
                from = want + 1;
                if from == docs.len() { break; }
                target = target.max(docs[want] + 1);
            }
        }
    }

    #[test]
    fn griffin_figure_4_example() {
        // The paper's example: (5, 6, 8, 15, 18, 33) with U = 36 gives 2 low bits; here U is
        // the last value, 33, and (33+1)/6 = 5 gives ⌊log2 5⌋ = 2 as well.
        let docs = [5u32, 6, 8, 15, 18, 33];
        assert_eq!(low_width(33, 6), 2);
        let mut out = Vec::new();
        let header = encode_docs(&BitPacker4x::new(), &docs, 0, &mut out);
        out[..4].copy_from_slice(&header.to_le_bytes());
        // high parts 1,1,2,3,4,8 → set bits at 1,2,4,6,8,13
        let high = read_u32(&out, 8);
        assert_eq!(
            high,
            (1 << 1) | (1 << 2) | (1 << 4) | (1 << 6) | (1 << 8) | (1 << 13)
        );
    }
}
