//! The on-disk index and everything that makes one: the tokenizer, the corpus reader and
//! synthetic corpus generator, the block codecs (Elias-Fano, PForDelta), the builder, the
//! mmap reader and CIFF import. `index/` sits at the bottom of the crate: it imports no stage.
//! The format is documented in `docs/index-format.md`.

pub mod blockmax;
pub mod builder;
pub mod ciff;
pub mod codecs;
pub mod corpus;
pub mod cursor;
pub mod error;
pub mod format;
pub mod forward;
pub mod lengths;
pub mod manifest;
pub mod postings;
pub mod queries;
pub mod reader;
pub mod shard;
pub mod tokenize;

pub use error::IndexError;

/// A document's number inside one index: 0..N in corpus order.
pub type DocId = u32;
/// A term's number inside one index.
pub type TermId = u32;

pub use cursor::{PostingCursor, TERMINATED};

/// Asks for the cache lines holding `bytes` to be brought in ahead of their reads: a hint,
/// nothing where the architecture has no prefetch.
#[inline]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        let start = bytes.as_ptr() as usize;
        let mut line = start & !63;
        while line < start + bytes.len() {
            // SAFETY: a prefetch never faults; the address is in a line `bytes` touches.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    bytes.as_ptr().wrapping_add(line).wrapping_sub(start).cast(),
                )
            }
            line += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}
pub use reader::{Index, Manifest, PostingList, QueryCodes, StreamHits, TermInfo};
