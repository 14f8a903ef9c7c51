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
//! `p_j − j` per byte value writes all its values at once, with no branch per posting. On the GPU each thread takes a high word, counts its set bits (popcount), a
//! prefix sum over the counts says which `i` each word's bits belong to, and each set bit is
//! decoded independently: exactly the Para-EF scheme.

use bitpacking::BitPacker4x;

use super::{pack, packed_bytes, read_u32, unpack, BlockBounds, BLOCK_LEN};

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

#[cfg(test)]
mod tests {
    use super::*;
    use bitpacking::BitPacker;

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
