//! PForDelta with exceptions in side arrays (Ding et al. WWW'09, §"GPU-based PForDelta"; no
//! linked list through the slots, so the GPU decodes with one prefix sum).
//!
//! A block's docIDs become gaps `v_0 = d_0 − base`, `v_i = d_i − d_{i−1} − 1` (≥ 0 since docIDs
//! strictly increase). A slot width `b` is chosen per block to minimise the block's size; each
//! `v_i` keeps its low `b` bits in its slot, and the `ne` values with more bits are
//! *exceptions*: their positions (one byte each) and their high parts `v_i >> b` (at `ew`
//! bits, `SEQ`) go to two side arrays.
//!
//! ```text
//! word 0     header: bits 0..8 = b, 8..16 = ne, 16..24 = ew, 24..32 = tf width
//! words 1..  slots, n × b bits (PACK: BitPacker4x when n = 128, else SEQ)
//! then       exception positions, ne bytes, increasing, zero-padded to a multiple of 4
//! then       exception high parts, ne × ew bits (SEQ)
//! then       tf − 1, n × tf-width bits (PACK)
//! ```
//!
//! Decoding: unpack the slots, add `high_j << b` at each exception position, then
//! `d_i = base + i + Σ_{k≤i} v_k` (a prefix sum; on the GPU a block-wide scan).

use bitpacking::BitPacker4x;

use super::{
    bit_width, pack, pack_seq, packed_bytes, read_u32, seq_bytes, unpack, unpack_seq, BlockBounds,
    BLOCK_LEN,
};

/// Size in bytes of the docID part (after the header) for slot width `b`, given a histogram of
/// the gaps' bit widths; returns (bytes, exceptions, exception width).
fn cost(n: usize, hist: &[usize; 33], max_width: u8, b: u8) -> (usize, usize, u8) {
    let ne: usize = hist[b as usize + 1..].iter().sum();
    let ew = max_width.saturating_sub(b);
    (
        packed_bytes(n, b) + ne.div_ceil(4) * 4 + seq_bytes(ne, ew),
        ne,
        ew,
    )
}

/// Appends the header placeholder, slots and exception arrays; returns the header word
/// (without the tf width).
pub(super) fn encode_docs(packer: &BitPacker4x, docs: &[u32], base: u32, out: &mut Vec<u8>) -> u32 {
    let n = docs.len();
    let mut gaps = [0u32; BLOCK_LEN];
    let mut hist = [0usize; 33];
    let mut prev = base;
    for (i, &d) in docs.iter().enumerate() {
        gaps[i] = if i == 0 { d - base } else { d - prev - 1 };
        prev = d;
        hist[bit_width(gaps[i]) as usize] += 1;
    }
    let max_width = (0..=32u8)
        .rev()
        .find(|&w| hist[w as usize] > 0)
        .unwrap_or(0);
    let b = (0..=max_width)
        .min_by_key(|&b| (cost(n, &hist, max_width, b).0, std::cmp::Reverse(b)))
        .unwrap_or(0);
    let (_, ne, ew) = cost(n, &hist, max_width, b);
    out.extend_from_slice(&[0; 4]);
    let mask = if b == 32 { u32::MAX } else { (1u32 << b) - 1 };
    let mut slots = [0u32; BLOCK_LEN];
    let mut positions = Vec::with_capacity(ne.div_ceil(4) * 4);
    let mut highs = Vec::with_capacity(ne);
    for i in 0..n {
        slots[i] = gaps[i] & mask;
        if bit_width(gaps[i]) > b {
            positions.push(i as u8);
            highs.push(gaps[i] >> b);
        }
    }
    pack(packer, &slots[..n], b, out);
    positions.resize(ne.div_ceil(4) * 4, 0);
    out.extend_from_slice(&positions);
    pack_seq(&highs, ew, out);
    b as u32 | (ne as u32) << 8 | (ew as u32) << 16
}

fn fields(header: u32) -> (u8, usize, u8) {
    (
        (header & 0xff) as u8,
        ((header >> 8) & 0xff) as usize,
        ((header >> 16) & 0xff) as u8,
    )
}

/// Byte offset of the tf section.
pub(super) fn tf_offset(header: u32, b: BlockBounds) -> usize {
    let (bw, ne, ew) = fields(header);
    4 + packed_bytes(b.n, bw) + ne.div_ceil(4) * 4 + seq_bytes(ne, ew)
}

/// Checks the header and exception positions; returns the tf section's offset.
pub(super) fn check(header: u32, block: &[u8], b: BlockBounds) -> Result<usize, String> {
    let (bw, ne, ew) = fields(header);
    if bw > 32 || ew > 32 || bw as u32 + ew as u32 > 32 || ne > b.n || (ne > 0) != (ew > 0) {
        return Err(format!(
            "PFor header {header:#010x}: slot width {bw}, {ne} exceptions of {ew} bits, for {b:?}"
        ));
    }
    let at = tf_offset(header, b);
    if at > block.len() {
        return Err(format!(
            "PFor block needs {at} bytes before its tfs, {} available",
            block.len()
        ));
    }
    let pos_at = 4 + packed_bytes(b.n, bw);
    let positions = &block[pos_at..pos_at + ne];
    if positions.windows(2).any(|w| w[0] >= w[1])
        || positions.last().is_some_and(|&p| p as usize >= b.n)
    {
        return Err(format!(
            "PFor exception positions {positions:?} not increasing below {}",
            b.n
        ));
    }
    Ok(at)
}

/// Decodes the docIDs (see the module doc).
pub(super) fn decode_docs(
    packer: &BitPacker4x,
    block: &[u8],
    b: BlockBounds,
    docs: &mut [u32; BLOCK_LEN],
) {
    let (bw, ne, ew) = fields(read_u32(block, 0));
    let slots_len = packed_bytes(b.n, bw);
    unpack(packer, &block[4..4 + slots_len], b.n, bw, docs);
    if ne > 0 {
        let pos_at = 4 + slots_len;
        let high_at = pos_at + ne.div_ceil(4) * 4;
        let mut highs = [0u32; BLOCK_LEN];
        unpack_seq(&block[high_at..], ew, &mut highs[..ne]);
        for (&p, &h) in block[pos_at..pos_at + ne].iter().zip(&highs[..ne]) {
            docs[p as usize] |= h.wrapping_shl(bw as u32);
        }
    }
    let mut d = b.base.wrapping_add(docs[0]);
    docs[0] = d;
    for v in &mut docs[1..b.n] {
        d = d.wrapping_add(*v).wrapping_add(1);
        *v = d;
    }
}
