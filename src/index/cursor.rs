//! A cursor over one posting list: decodes one block at a time into reused buffers and uses the
//! skip entries to jump over blocks that cannot hold the target.
//!
//! Contract (after tantivy's `DocSet`): a cursor always sits on a posting, or on
//! [`TERMINATED`] once the list is exhausted. [`PostingCursor::advance`] moves to the next
//! posting; [`PostingCursor::seek`] moves to the first posting whose docID is ≥ the target and
//! never moves backwards (a target ≤ the current docID leaves the cursor where it is).
//! Term frequencies are decoded lazily, only for blocks where [`PostingCursor::tf`] is called.
//! An Elias-Fano block a seek lands in is first read in place ([`InPlace`]): its first
//! [`SEEKS_IN_PLACE`] seeks decode nothing, and only a block sought more often, or walked
//! posting by posting, is decoded; a block entered after one sought that often is decoded at
//! once.

use super::codecs::ef::InPlace;
use super::codecs::{BlockDecoder, Codec};
use super::postings::PostingList;
use super::DocId;

/// The docID of an exhausted cursor (no index has 2³² − 1 documents).
pub const TERMINATED: DocId = u32::MAX;

/// Seeks an Elias-Fano block answers in place before it is decoded: most blocks an AND
/// follower lands in are sought once or twice, and a seek in place costs a few decoded seeks,
/// a decode a few dozen.
pub const SEEKS_IN_PLACE: u32 = 8;

/// A cursor over one posting list.
pub struct PostingCursor<'a> {
    list: PostingList<'a>,
    dec: Box<BlockDecoder>,
    block: usize,
    n: usize,
    pos: usize,
    tfs_ready: bool,
    /// The block when it is read in place rather than decoded, and the seeks it may still answer.
    in_place: Option<(InPlace<'a>, u32)>,
    /// Seeks that landed in the current block: a block entered after one sought at least
    /// [`SEEKS_IN_PLACE`] times is decoded at once (the list's blocks are sought densely).
    block_seeks: u32,
    doc: DocId,
    blocks_decoded: u64,
}

impl<'a> PostingCursor<'a> {
    /// A cursor on the list's first posting (or [`TERMINATED`] for an empty list).
    pub fn new(list: PostingList<'a>) -> Self {
        let mut c = Self {
            list,
            dec: Box::new(BlockDecoder::new()),
            block: 0,
            n: 0,
            pos: 0,
            tfs_ready: false,
            in_place: None,
            block_seeks: 0,
            doc: TERMINATED,
            blocks_decoded: 0,
        };
        if list.n_blocks() > 0 {
            c.load(0);
        }
        c
    }

    fn load(&mut self, j: usize) {
        let bounds = self.list.bounds(j);
        self.dec
            .decode_docs(self.list.codec, self.list.block_bytes(j), bounds);
        self.block = j;
        self.n = bounds.n;
        self.pos = 0;
        self.tfs_ready = false;
        self.in_place = None;
        self.block_seeks = 0;
        self.doc = self.dec.docs[0];
        self.blocks_decoded += 1;
    }

    /// Moves to block `j` for a seek into it: an Elias-Fano block is read in place, unless the
    /// block before was sought [`SEEKS_IN_PLACE`] times or more (most seeks of a list sought
    /// that densely would land in the decoded block); a PFor block (whose docIDs are a prefix
    /// sum) is decoded.
    fn enter(&mut self, j: usize) {
        if self.list.codec == Codec::Pfor || self.block_seeks >= SEEKS_IN_PLACE {
            return self.load(j);
        }
        self.block_seeks = 0;
        let bounds = self.list.bounds(j);
        let block = InPlace::new(self.list.block_bytes(j), bounds);
        self.in_place = Some((block, SEEKS_IN_PLACE));
        self.block = j;
        self.n = bounds.n;
        self.pos = 0;
        self.tfs_ready = false;
        self.blocks_decoded += 1;
    }

    /// Decodes a block read in place, the cursor staying on its posting.
    fn decode_in_place(&mut self) {
        if self.in_place.take().is_some() {
            let bounds = self.list.bounds(self.block);
            self.dec
                .decode_docs(self.list.codec, self.list.block_bytes(self.block), bounds);
            self.doc = self.dec.docs[self.pos];
        }
    }

    fn terminate(&mut self) -> DocId {
        self.in_place = None;
        self.block = self.list.n_blocks();
        self.doc = TERMINATED;
        TERMINATED
    }

    /// The current docID, or [`TERMINATED`].
    #[inline]
    pub fn doc(&self) -> DocId {
        self.doc
    }

    /// The current posting's term frequency (decodes the block's tfs on first use).
    ///
    /// # Panics
    /// On a terminated cursor.
    #[inline]
    pub fn tf(&mut self) -> u32 {
        assert!(self.doc != TERMINATED, "tf() on a terminated cursor");
        // A block whose tfs are decoded is not read in place: this is all that most calls of
        // a walked list (OR's essential lists) run, inline; the rest is a call.
        match self.tfs_ready {
            true => self.dec.tfs[self.pos],
            false => self.tf_unready(),
        }
    }

    /// [`PostingCursor::tf`] in a block read in place or whose tfs are not decoded yet.
    #[inline(never)]
    fn tf_unready(&mut self) -> u32 {
        if let Some((block, _)) = &self.in_place {
            return block.tf(self.pos);
        }
        self.dec.decode_tfs(
            self.list.codec,
            self.list.block_bytes(self.block),
            self.list.bounds(self.block),
        );
        self.tfs_ready = true;
        self.dec.tfs[self.pos]
    }

    /// The last docID of the block the cursor has decoded (a [`PostingCursor::seek`] to a
    /// target up to it decodes nothing); [`TERMINATED`] once the list is exhausted.
    #[inline]
    pub fn block_last(&self) -> DocId {
        match self.doc {
            TERMINATED => TERMINATED,
            _ => self.list.block_last(self.block),
        }
    }

    /// The postings from the current one to the end of the decoded block, as docIDs and term
    /// frequencies (decoding the tfs on first use); empty once the list is exhausted. The
    /// cursor does not move.
    pub fn block_rest(&mut self) -> (&[DocId], &[u32]) {
        if self.doc == TERMINATED {
            return (&[], &[]);
        }
        self.decode_in_place();
        self.tf();
        (
            &self.dec.docs[self.pos..self.n],
            &self.dec.tfs[self.pos..self.n],
        )
    }

    /// Moves `n` postings on within the decoded block, to a posting of it: `n` is less than
    /// the length of [`PostingCursor::block_rest`] just before (what a caller that walked those
    /// postings knows without a search); returns its docID.
    ///
    /// # Panics
    /// When the block holds no posting `n` on.
    #[inline]
    pub fn skip_in_block(&mut self, n: usize) -> DocId {
        assert!(
            self.in_place.is_none() && self.pos + n < self.n,
            "past the decoded block"
        );
        self.pos += n;
        self.doc = self.dec.docs[self.pos];
        self.doc
    }

    /// The number of postings in the list.
    pub fn df(&self) -> u32 {
        self.list.df
    }

    /// The list under the cursor.
    pub fn list(&self) -> PostingList<'a> {
        self.list
    }

    /// Blocks decoded so far.
    pub fn blocks_decoded(&self) -> u64 {
        self.blocks_decoded
    }

    /// Moves to the next posting; returns its docID or [`TERMINATED`].
    #[inline]
    pub fn advance(&mut self) -> DocId {
        if self.doc == TERMINATED {
            return TERMINATED;
        }
        self.decode_in_place();
        self.pos += 1;
        if self.pos < self.n {
            self.doc = self.dec.docs[self.pos];
            return self.doc;
        }
        if self.block + 1 < self.list.n_blocks() {
            self.load(self.block + 1);
            self.doc
        } else {
            self.terminate()
        }
    }

    /// Moves to the first posting with docID ≥ `target` (see the module doc); returns its
    /// docID or [`TERMINATED`]. Blocks whose last docID is below `target` are skipped without
    /// being decoded: the skip entries are searched by galloping from the current block, then
    /// binary search.
    #[inline]
    pub fn seek(&mut self, target: DocId) -> DocId {
        match target <= self.doc {
            true => self.doc,
            false => self.seek_ahead(target, false),
        }
    }

    /// [`PostingCursor::seek`] before walking the block from there ([`PostingCursor::block_rest`],
    /// [`PostingCursor::advance`]): a block it lands in is decoded at once, not read in place.
    #[inline]
    pub fn seek_to_walk(&mut self, target: DocId) -> DocId {
        match target <= self.doc {
            true => self.doc,
            false => self.seek_ahead(target, true),
        }
    }

    /// [`PostingCursor::seek`] to a target past the current posting; a block entered is
    /// decoded at once when `walk`.
    fn seek_ahead(&mut self, target: DocId, walk: bool) -> DocId {
        if target > self.list.block_last(self.block) {
            match (self.block_from(self.block, target), walk) {
                (Some(j), true) => self.load(j),
                (Some(j), false) => self.enter(j),
                (None, _) => return self.terminate(),
            }
        }
        // The current block's last docID is ≥ target, so the search stops inside the block.
        self.block_seeks += 1;
        if let Some((block, seeks_left)) = &mut self.in_place {
            if *seeks_left > 0 {
                *seeks_left -= 1;
                (self.pos, self.doc) = block.seek(target);
                return self.doc;
            }
            self.decode_in_place();
        }
        self.pos = first_at_least(&self.dec.docs[..self.n], self.pos, target);
        self.doc = self.dec.docs[self.pos];
        self.doc
    }

    /// The first block from block `from` on whose last docID is ≥ `target`, found by galloping
    /// from `from`, then binary search (`None` when no block is).
    fn block_from(&self, from: usize, target: DocId) -> Option<usize> {
        let nb = self.list.n_blocks();
        let last = |j: usize| self.list.block_last(j);
        if from >= nb {
            return None;
        }
        if last(from) >= target {
            return Some(from);
        }
        // Gallop: find hi with last(hi) ≥ target, lo < hi with last(lo) < target.
        let mut lo = from;
        let mut step = 1;
        let mut hi = lo + 1;
        while hi < nb && last(hi) < target {
            lo = hi;
            step *= 2;
            hi = lo + step;
        }
        if hi >= nb {
            hi = nb - 1;
            if last(hi) < target {
                return None;
            }
        }
        // Binary search in (lo, hi].
        let (mut a, mut b) = (lo + 1, hi);
        while a < b {
            let mid = (a + b) / 2;
            if last(mid) < target {
                a = mid + 1;
            } else {
                b = mid;
            }
        }
        Some(a)
    }

    /// The block that would hold `target`, searched from block `from` on (at or after the
    /// cursor's block) without decoding anything: what block-max pruning reads, keeping its own
    /// place ahead of the cursor. `None` when no block is left (the list ends below `target`).
    /// Block `j` spans the docIDs after block `j − 1`'s last up to its own last.
    pub fn shallow_seek(&self, from: usize, target: DocId) -> Option<usize> {
        if self.doc == TERMINATED {
            return None;
        }
        self.block_from(from.max(self.block), target)
    }
}

/// Postings an in-block seek counts without a branch before it searches the rest.
const SCAN: usize = 16;

/// The first place from `from` on whose docID is ≥ `target`, where `docs` (increasing) ends
/// with one that is. A seek mostly lands a few postings on (an AND's candidates are sought in
/// order, most of them close together): the next [`SCAN`] postings are counted in one
/// branch-free pass (their docIDs below `target`, vectorised), and only a target past them is
/// searched for in the rest, by binary search.
#[inline]
fn first_at_least(docs: &[DocId], from: usize, target: DocId) -> usize {
    if let Some(next) =
        (docs.get(from..from + SCAN)).and_then(|s| <&[DocId; SCAN]>::try_from(s).ok())
    {
        let below: usize = next.iter().map(|&d| (d < target) as usize).sum();
        if below < SCAN {
            return from + below;
        }
        let rest = from + SCAN;
        return rest + docs[rest..].partition_point(|&d| d < target);
    }
    from + docs[from..].partition_point(|&d| d < target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::codecs::{block_len, encode_list, Codec, BLOCK_LEN};
    use proptest::prelude::*;

    fn encoded(codec: Codec, docs: &[u32]) -> (Vec<u8>, Vec<u8>) {
        let tfs: Vec<u32> = docs.iter().map(|d| d % 7 + 1).collect();
        let (mut bytes, mut skips) = (Vec::new(), Vec::new());
        encode_list(codec, docs, &tfs, |_| 1, &mut bytes, &mut skips);
        let mut sk = Vec::new();
        for s in &skips {
            s.write(&mut sk);
        }
        (bytes, sk)
    }

    proptest! {
        /// The in-block search finds the first place from `from` on whose docID is ≥ the
        /// target, whether the target is within the next postings it counts or past them.
        #[test]
        fn first_at_least_matches_a_linear_scan(
            gaps in proptest::collection::vec(1u32..5, 1..=BLOCK_LEN),
            from in 0usize..BLOCK_LEN,
            ahead in 1u32..300,
        ) {
            let mut d = 0u32;
            let docs: Vec<u32> = gaps.iter().map(|g| { d += g; d }).collect();
            let from = from % docs.len();
            // Any target above the docID at `from` and up to the last one.
            let target = (docs[from] + ahead).min(*docs.last().unwrap());
            let want = (from..docs.len()).find(|&i| docs[i] >= target).unwrap();
            prop_assert_eq!(first_at_least(&docs, from, target), want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]
        /// seek/advance agree with a naive scan of the decoded list.
        #[test]
        fn seek_matches_naive_scan(
            gaps in proptest::collection::vec(1u32..300, 0..1200),
            targets in proptest::collection::vec(0u32..200_000, 1..60),
            pfor in any::<bool>(),
        ) {
            let codec = if pfor { Codec::Pfor } else { Codec::Ef };
            let mut d = 0u32;
            let docs: Vec<u32> = gaps.iter().map(|g| { d += g; d }).collect();
            let (bytes, sk) = encoded(codec, &docs);
            let list = PostingList::from_parts(codec, docs.len() as u32, &bytes, &sk);
            let mut c = list.cursor();
            let mut sorted = targets.clone();
            sorted.sort_unstable();
            let first_at_least = |t: u32| docs.iter().copied().find(|&x| x >= t).unwrap_or(TERMINATED);
            for (i, &t) in sorted.iter().enumerate() {
                if i % 3 == 2 {
                    // Interleave an advance: it moves to the next posting.
                    let before = c.doc();
                    let next = if before == TERMINATED { TERMINATED } else { first_at_least(before + 1) };
                    prop_assert_eq!(c.advance(), next);
                }
                let before = c.doc();
                // The shallow place of t, from any block on, is the first block from there
                // (and from the cursor's) whose last docID is ≥ t.
                let from = (t as usize) % 7;
                let naive = (from.max(c.block)..list.n_blocks()).find(|&j| list.block_last(j) >= t);
                let shallow = c.shallow_seek(from, t);
                prop_assert_eq!(shallow, if before == TERMINATED { None } else { naive });
                let want = if t <= before { before } else { first_at_least(t) };
                // Every third seek as a walk's (its block decoded at once).
                let got = match i % 3 {
                    1 => c.seek_to_walk(t),
                    _ => c.seek(t),
                };
                prop_assert_eq!(got, want);
                if want != TERMINATED {
                    prop_assert_eq!(c.tf(), want % 7 + 1);
                }
            }
            // A fresh full scan by advance returns every doc in order.
            let mut c = list.cursor();
            let mut all = Vec::new();
            while c.doc() != TERMINATED { all.push(c.doc()); c.advance(); }
            prop_assert_eq!(all, docs.clone());
            prop_assert_eq!(c.blocks_decoded() as usize, docs.len().div_ceil(BLOCK_LEN));
        }
    }

    /// Blocks whose bits were overwritten (as in a file whose CRC-32 was forged to match, which
    /// the checks at open do not decode): seek and advance never panic (a seek used to index
    /// past the decoded block) and no docID passes its block's last.
    #[test]
    fn corrupted_block_bits_stay_in_bounds() {
        let docs: Vec<u32> = (0..300).map(|i| i * 3 + 1).collect();
        for codec in [Codec::Ef, Codec::Pfor] {
            let (bytes, sk) = encoded(codec, &docs);
            for at in (4..bytes.len().saturating_sub(8)).step_by(4) {
                for value in [1u64, u64::MAX, 0, 1 << 31] {
                    let mut bad = bytes.clone();
                    bad[at..at + 8].copy_from_slice(&value.to_le_bytes());
                    let list = PostingList::from_parts(codec, docs.len() as u32, &bad, &sk);
                    // What the reader's checks at open let through: every block as long as
                    // its header says.
                    let passes_open = (0..list.n_blocks()).all(|j| {
                        let block = list.block_bytes(j);
                        block_len(codec, block, list.bounds(j)) == Ok(block.len())
                    });
                    if !passes_open {
                        continue;
                    }
                    let last = *docs.last().unwrap();
                    for target in (0..=last + 1).step_by(5) {
                        let got = list.cursor().seek(target);
                        assert!(got <= last || got == TERMINATED, "{codec:?} at {at}: {got}");
                    }
                    let mut c = list.cursor();
                    while c.doc() != TERMINATED {
                        assert!(c.doc() <= last);
                        c.advance();
                    }
                }
            }
        }
    }

    #[test]
    fn seek_skips_blocks_without_decoding_them() {
        let docs: Vec<u32> = (0..128 * 50).map(|i| i * 2).collect();
        let (bytes, sk) = encoded(Codec::Ef, &docs);
        let mut c = PostingList::from_parts(Codec::Ef, docs.len() as u32, &bytes, &sk).cursor();
        assert_eq!(c.seek(128 * 40 * 2 + 1), 128 * 40 * 2 + 2);
        assert_eq!(c.blocks_decoded(), 2);
        assert_eq!(c.seek(5), 128 * 40 * 2 + 2, "seek never moves backwards");
        assert_eq!(c.seek(u32::MAX - 1), TERMINATED);
        assert_eq!(c.advance(), TERMINATED);
    }
}
