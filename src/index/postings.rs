//! A term's dictionary entry and its posting list as the reader serves them: blocks, skip
//! entries and block-max entries borrowed from the mapped files.

use super::blockmax::{BlockMax, BLOCK_MAX_BYTES};
use super::codecs::{bounds_of, read_u32, BlockBounds, Codec, SkipEntry, SKIP_ENTRY_BYTES};
use super::cursor::PostingCursor;
use super::DocId;

/// A term's entry in the dictionary (32 bytes on disk: df u32, n_blocks u32,
/// postings_offset u64, postings_len u64, skip_start u64; little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TermInfo {
    /// Documents whose scoring stream contains the term (0 for a term seen only elsewhere).
    pub df: u32,
    /// Blocks in its list: ceil(df / 128).
    pub n_blocks: u32,
    /// Offset of its first block in `postings.bin`'s payload.
    pub postings_offset: u64,
    /// Bytes of its list.
    pub postings_len: u64,
    /// Index of its first skip entry in `skips.bin`.
    pub skip_start: u64,
}

impl TermInfo {
    /// Bytes on disk.
    pub const BYTES: usize = 32;

    /// Appends the 32 bytes.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.df.to_le_bytes());
        out.extend_from_slice(&self.n_blocks.to_le_bytes());
        out.extend_from_slice(&self.postings_offset.to_le_bytes());
        out.extend_from_slice(&self.postings_len.to_le_bytes());
        out.extend_from_slice(&self.skip_start.to_le_bytes());
    }

    pub(super) fn read(b: &[u8]) -> Self {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        TermInfo {
            df: read_u32(b, 0),
            n_blocks: read_u32(b, 4),
            postings_offset: u64_at(8),
            postings_len: u64_at(16),
            skip_start: u64_at(24),
        }
    }
}

/// One term's posting list: its blocks and skip entries, borrowed from the mapped files.
#[derive(Debug, Clone, Copy)]
pub struct PostingList<'a> {
    /// The codec of the blocks.
    pub codec: Codec,
    /// Number of postings.
    pub df: u32,
    bytes: &'a [u8],
    skips: &'a [u8],
    /// Its blocks' `blockmax.bin` entries, or empty (an index made before manifest version 3,
    /// or a list made by [`PostingList::from_parts`]).
    maxes: &'a [u8],
    /// The whole list's entry, or empty (no entries, or a list of one block).
    list_entry: &'a [u8],
}

impl<'a> PostingList<'a> {
    /// An empty list (for terms not in the index).
    pub fn empty(codec: Codec) -> Self {
        Self {
            codec,
            df: 0,
            bytes: &[],
            skips: &[],
            maxes: &[],
            list_entry: &[],
        }
    }

    /// A list as the reader maps it: `maxes` its blocks' `blockmax.bin` entries and
    /// `list_entry` the whole list's (each empty where the index has none).
    pub(super) fn mapped(
        codec: Codec,
        df: u32,
        bytes: &'a [u8],
        skips: &'a [u8],
        maxes: &'a [u8],
        list_entry: &'a [u8],
    ) -> Self {
        Self {
            codec,
            df,
            bytes,
            skips,
            maxes,
            list_entry,
        }
    }

    /// Builds a list over raw bytes (tests and benchmarks); `skips` holds 16-byte entries.
    pub fn from_parts(codec: Codec, df: u32, bytes: &'a [u8], skips: &'a [u8]) -> Self {
        Self {
            codec,
            df,
            bytes,
            skips,
            maxes: &[],
            list_entry: &[],
        }
    }

    /// The whole list's block-max entry, when the index has them.
    pub fn list_max(&self) -> Option<BlockMax> {
        match (self.maxes.is_empty(), self.list_entry.is_empty()) {
            (true, _) => None,
            (false, true) => Some(self.block_max(0)),
            (false, false) => Some(BlockMax::read(self.list_entry)),
        }
    }

    /// Block `j`'s block-max entry, or what its skip entry bounds when the index has none.
    #[inline]
    pub fn block_max(&self, j: usize) -> BlockMax {
        match self.maxes.is_empty() {
            true => BlockMax::from_skip(self.skip(j)),
            false => BlockMax::read(&self.maxes[j * BLOCK_MAX_BYTES..]),
        }
    }

    /// Block `j`'s [`BlockMax::read_ends`] at grid place `g` (what its skip entry bounds when
    /// the index has no entries).
    #[inline]
    pub fn block_max_ends(&self, j: usize, g: usize) -> [(u32, u32); 2] {
        match self.maxes.is_empty() {
            true => {
                let s = self.skip(j);
                [(s.max_tf, s.min_len); 2]
            }
            false => BlockMax::read_ends(&self.maxes[j * BLOCK_MAX_BYTES..], g),
        }
    }

    /// Number of blocks.
    pub fn n_blocks(&self) -> usize {
        self.skips.len() / SKIP_ENTRY_BYTES
    }

    /// Skip entry `j`.
    #[inline]
    pub fn skip(&self, j: usize) -> SkipEntry {
        SkipEntry::read(&self.skips[j * SKIP_ENTRY_BYTES..(j + 1) * SKIP_ENTRY_BYTES])
    }

    /// Last docID of block `j` (reads 4 bytes).
    #[inline]
    pub fn block_last(&self, j: usize) -> DocId {
        read_u32(self.skips, j * SKIP_ENTRY_BYTES)
    }

    /// Block `j`'s bytes.
    pub fn block_bytes(&self, j: usize) -> &'a [u8] {
        let start = read_u32(self.skips, j * SKIP_ENTRY_BYTES + 4) as usize;
        let end = if j + 1 < self.n_blocks() {
            read_u32(self.skips, (j + 1) * SKIP_ENTRY_BYTES + 4) as usize
        } else {
            self.bytes.len()
        };
        &self.bytes[start..end]
    }

    /// Asks for block `j`'s bytes to be brought into the cache ahead of its reads (a hint).
    #[inline]
    pub fn prefetch_block(&self, j: usize) {
        super::prefetch(self.block_bytes(j));
    }

    /// Asks for block `j`'s skip and block-max entries to be brought into the cache ahead of
    /// their reads (a hint; nothing past the list's end).
    #[inline]
    pub fn prefetch_entries(&self, j: usize) {
        let skip = j * SKIP_ENTRY_BYTES;
        super::prefetch(self.skips.get(skip..skip + SKIP_ENTRY_BYTES).unwrap_or(&[]));
        let max = j * BLOCK_MAX_BYTES;
        super::prefetch(self.maxes.get(max..max + BLOCK_MAX_BYTES).unwrap_or(&[]));
    }

    /// Block `j`'s docID bounds.
    pub fn bounds(&self, j: usize) -> BlockBounds {
        bounds_of(|k| self.skip(k), j, self.df as usize)
    }

    /// The list's encoded bytes (all blocks).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// A cursor on the first posting.
    pub fn cursor(self) -> PostingCursor<'a> {
        PostingCursor::new(self)
    }
}
