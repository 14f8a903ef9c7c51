//! One byte per document: a floor of its scoring length, for bounding scores before the exact
//! length is read. BM25 contributions fall as the length grows, so a contribution computed at
//! the floor bounds the exact one from above. The exact lengths are four bytes a document in
//! `docs.bin` (4 MB at 1 M documents, past a core's L2): a candidate's length read is a cache
//! miss most of the time, and most candidates of a pruned query are rejected on bounds. The
//! floors are a quarter of that, made at open from `docs.bin` (no format change), as Tantivy's
//! one-byte fieldnorms are; unlike Tantivy's, they never enter a score.
//!
//! Code: lengths below 16 exactly; above, the leading bit's place and the next four bits (steps
//! of at most 1/16 of the length) up to 2¹⁹; longer lengths all take the last code.

use super::DocId;

/// Lengths below this are their own codes.
const EXACT: u32 = 16;
/// Mantissa bits kept below the leading one.
const MANTISSA_BITS: u32 = 4;

/// The floor each code stands for (ascending): code `c` is the largest with `FLOOR[c] ≤ dl`.
static FLOOR: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = match c < EXACT as usize {
            true => c as u32,
            false => {
                let k = (c - EXACT as usize) as u32;
                let exp = 4 + k / 16;
                let mantissa = 16 + k % 16;
                mantissa << (exp - MANTISSA_BITS)
            }
        };
        c += 1;
    }
    t
};

/// The code of length `dl`.
pub fn encode(dl: u32) -> u8 {
    if dl < EXACT {
        return dl as u8;
    }
    // dl ≥ 16: the leading bit's place is ≥ 4.
    let exp = 31 - dl.leading_zeros();
    let mantissa = (dl >> (exp - MANTISSA_BITS)) & 15;
    let code = EXACT + (exp - 4) * 16 + mantissa;
    code.min(255) as u8
}

/// The largest length the code of `dl` guarantees: ≤ `dl`.
#[inline]
pub fn floor_of(code: u8) -> u32 {
    FLOOR[code as usize]
}

/// The codes of every document of an index.
#[derive(Debug, Default)]
pub struct LengthFloors {
    codes: Vec<u8>,
}

impl LengthFloors {
    /// The codes of `lengths`, in docID order.
    pub fn new(lengths: impl Iterator<Item = u32>) -> Self {
        Self {
            codes: lengths.map(encode).collect(),
        }
    }

    /// The code of document `d`'s length ([`floor_of`] gives its floor).
    ///
    /// # Panics
    /// When `d` is not a document of the index.
    #[inline]
    pub fn code(&self, d: DocId) -> u8 {
        self.codes[d as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_table_ascends_and_each_code_decodes_to_its_floor() {
        assert!(FLOOR.windows(2).all(|w| w[0] < w[1]));
        for (c, &f) in FLOOR.iter().enumerate() {
            assert_eq!(encode(f) as usize, c, "floor {f}");
        }
        assert_eq!(floor_of(encode(15)), 15);
        assert_eq!(floor_of(encode(16)), 16);
        assert_eq!(floor_of(encode(33)), 32);
        assert_eq!(floor_of(encode(34)), 34);
        assert_eq!(encode(u32::MAX), 255);
    }

    proptest! {
        /// The floor is at most the length and within a sixteenth of it (up to 2¹⁹), and codes
        /// keep the lengths' order.
        #[test]
        fn floors_bound_lengths_from_below(dl in 0u32..=u32::MAX, other in 0u32..=u32::MAX) {
            let f = floor_of(encode(dl));
            prop_assert!(f <= dl);
            if dl < 1 << 19 {
                prop_assert!(dl - f <= dl / 16, "{dl} -> {f}");
            }
            if dl <= other {
                prop_assert!(encode(dl) <= encode(other));
            }
        }
    }
}
