//! The checks [`Index::open`] runs once over every file, so that the accessors can index
//! without checking: each refuses a file naming it and what does not hold.

use super::*;

impl Index {
    pub(super) fn check_terms(&self) -> Result<(), IndexError> {
        let t = self.manifest.num_terms;
        let f = &self.terms;
        f.expect_len(0, "term offsets", t + 1, 8)?;
        f.expect_len(2, "sorted term ids", t, 4)?;
        f.expect_len(3, "term infos", t, TermInfo::BYTES as u64)?;
        check_offsets(f, 0, 1, "term offsets")?;
        let mut seen = vec![false; t as usize];
        let mut prev: Option<&[u8]> = None;
        for i in 0..t as usize {
            let s = self.sorted_term_bytes(i);
            if std::str::from_utf8(s).is_err() {
                return Err(f.corrupt(format!("term {i} in sorted order is not UTF-8")));
            }
            if prev.is_some_and(|p| p >= s) {
                return Err(f.corrupt(format!("terms not strictly sorted at sorted position {i}")));
            }
            prev = Some(s);
            let id = read_u32(f.section(2), i * 4) as usize;
            if id >= t as usize || std::mem::replace(&mut seen[id], true) {
                return Err(f.corrupt(format!(
                    "sorted term ids: entry {i} is {id}, not a fresh id below {t}"
                )));
            }
        }
        let n_skips = self.skips.section(0).len() / SKIP_ENTRY_BYTES;
        if self.skips.section(0).len() % SKIP_ENTRY_BYTES != 0 {
            return Err(self.skips.corrupt(format!(
                "{} bytes is not a whole number of 16-byte skip entries",
                self.skips.section(0).len()
            )));
        }
        if let Some(f) = &self.block_max {
            f.expect_len(0, "block entries", n_skips as u64, BLOCK_MAX_BYTES as u64)?;
            if f.section(1).len() % 4 != 0 {
                return Err(f.corrupt("list ids are not whole u32s"));
            }
            f.expect_len(
                2,
                "list entries",
                (f.section(1).len() / 4) as u64,
                BLOCK_MAX_BYTES as u64,
            )?;
            // Section 1: exactly the lists of two blocks or more, ascending.
            let ids = f.section(1);
            let want = (0..t as u32).filter(|&id| self.term_info(id).n_blocks >= 2);
            let mut have = (0..ids.len() / 4).map(|i| read_u32(ids, i * 4));
            for id in want {
                if have.next() != Some(id) {
                    return Err(f.corrupt(format!(
                        "term id {id}'s list has two blocks or more and no list entry in order"
                    )));
                }
            }
            if have.next().is_some() {
                return Err(f.corrupt("list entries for lists of fewer than two blocks"));
            }
        }
        let post_len = self.postings.section(0).len() as u64;
        let mut total = 0u64;
        for id in 0..t as u32 {
            let info = self.term_info(id);
            let what = |msg: String| f.corrupt(format!("term id {id}: {msg}"));
            if info.df as u64 > self.manifest.num_docs {
                return Err(what(format!(
                    "df {} > N = {}",
                    info.df, self.manifest.num_docs
                )));
            }
            if info.n_blocks as usize != (info.df as usize).div_ceil(BLOCK_LEN) {
                return Err(what(format!("{} blocks for df {}", info.n_blocks, info.df)));
            }
            if info
                .postings_offset
                .checked_add(info.postings_len)
                .is_none_or(|e| e > post_len)
            {
                return Err(what(format!(
                    "postings {}+{} past the end of {} ({post_len} bytes)",
                    info.postings_offset, info.postings_len, POSTINGS_FILE
                )));
            }
            if info
                .skip_start
                .checked_add(info.n_blocks as u64)
                .is_none_or(|e| e > n_skips as u64)
            {
                return Err(what(format!(
                    "skips {}+{} past the end of {} ({n_skips} entries)",
                    info.skip_start, info.n_blocks, SKIPS_FILE
                )));
            }
            total += info.df as u64;
            self.check_list(id)?;
        }
        if total != self.manifest.num_postings {
            return Err(IndexError::corrupt(
                self.dir.join(MANIFEST_FILE),
                format!(
                    "num_postings {}, lists hold {total}",
                    self.manifest.num_postings
                ),
            ));
        }
        Ok(())
    }

    /// Checks one list's skip entries and that every block is exactly as long as its header says.
    pub(super) fn check_list(&self, id: TermId) -> Result<(), IndexError> {
        let list = self.postings(id);
        let bad = |j: usize, msg: String| {
            self.postings
                .corrupt(format!("term id {id}, block {j}: {msg}"))
        };
        let bad_skip = |j: usize, msg: String| {
            self.skips
                .corrupt(format!("term id {id}, skip entry of block {j}: {msg}"))
        };
        let mut prev_end = 0u64;
        for j in 0..list.n_blocks() {
            let s = list.skip(j);
            if s.offset as u64 != prev_end {
                return Err(bad_skip(
                    j,
                    format!(
                        "block starts at {}, previous block ended at {prev_end}",
                        s.offset
                    ),
                ));
            }
            if s.last_doc as u64 >= self.manifest.num_docs
                || (j > 0 && s.last_doc <= list.block_last(j - 1))
            {
                return Err(bad_skip(
                    j,
                    format!(
                        "last docID {} not increasing below N = {}",
                        s.last_doc, self.manifest.num_docs
                    ),
                ));
            }
            let end = if j + 1 < list.n_blocks() {
                list.skip(j + 1).offset as u64
            } else {
                list.bytes().len() as u64
            };
            if end < s.offset as u64 || end > list.bytes().len() as u64 {
                return Err(bad_skip(
                    j,
                    format!("block ends at {end}, list has {} bytes", list.bytes().len()),
                ));
            }
            if let Some(f) = self.block_max.as_ref() {
                // A tf of 0 would bound the block's scores by 0: every posting pruned.
                let m = list.block_max(j);
                let whole = list.list_max().expect("the index has entries");
                if j == 0 && whole.best.iter().any(|p| p.0 == 0) {
                    return Err(f.corrupt(format!(
                        "term id {id}, the list's entry: a tf of 0 in {:?}",
                        whole.best
                    )));
                }
                if m.best.iter().any(|p| p.0 == 0) {
                    return Err(f.corrupt(format!(
                        "term id {id}, entry of block {j}: a tf of 0 in {:?}",
                        m.best
                    )));
                }
            }
            let bounds = list.bounds(j);
            if (bounds.last - bounds.base) as usize + 1 < bounds.n {
                return Err(bad(
                    j,
                    format!(
                        "{} postings cannot fit docIDs {}..={}",
                        bounds.n, bounds.base, bounds.last
                    ),
                ));
            }
            let block = &list.bytes()[s.offset as usize..end as usize];
            match block_len(list.codec, block, bounds) {
                Ok(l) if l == block.len() => {}
                Ok(l) => {
                    return Err(bad(
                        j,
                        format!("header gives {l} bytes, skip entries give {}", block.len()),
                    ))
                }
                Err(e) => return Err(bad(j, e)),
            }
            prev_end = end;
        }
        Ok(())
    }

    pub(super) fn check_docs(&self) -> Result<(), IndexError> {
        let n = self.manifest.num_docs;
        let f = &self.docs;
        f.expect_len(0, "scoring lengths", n, 4)?;
        f.expect_len(
            1,
            "stream lengths",
            n * self.manifest.streams.len() as u64,
            4,
        )?;
        f.expect_len(
            2,
            "static features",
            n * self.manifest.static_features.len() as u64,
            8,
        )?;
        f.expect_len(3, "id offsets", n + 1, 8)?;
        check_offsets(f, 3, 4, "id offsets")?;
        if std::str::from_utf8(f.section(4)).is_err() {
            return Err(f.corrupt("document ids are not UTF-8"));
        }
        for d in 0..n as u32 {
            if std::str::from_utf8(self.doc_id_bytes(d)).is_err() {
                return Err(f.corrupt(format!("document {d}'s id splits a UTF-8 character")));
            }
        }
        let total: u64 = (0..n as u32).map(|d| self.scoring_length(d) as u64).sum();
        if total != self.manifest.total_scoring_length {
            return Err(f.corrupt(format!(
                "scoring lengths sum to {total}, {MANIFEST_FILE} says {}",
                self.manifest.total_scoring_length
            )));
        }
        self.check_streams()
    }

    /// The manifest's streams against `docs.bin`: each stream's total is the sum of its
    /// lengths, and each document's scoring length is its scoring stream's length (the sum of
    /// its streams' for `all`). A reordered `streams` list or an edited total is refused here
    /// even where the manifest's checksum was made to match.
    pub(super) fn check_streams(&self) -> Result<(), IndexError> {
        let m = &self.manifest;
        let n = m.num_docs as u32;
        let scoring = m.streams.iter().position(|s| *s == m.scoring);
        let mut scoring_lengths = vec![0u64; n as usize];
        for (s, name) in m.streams.iter().enumerate() {
            let mut total = 0u64;
            for d in 0..n {
                let length = self.stream_length(d, s) as u64;
                total += length;
                if scoring.is_none_or(|i| i == s) {
                    scoring_lengths[d as usize] += length;
                }
            }
            if total != m.stream_total_lengths[s] {
                return Err(self.docs.corrupt(format!(
                    "stream {s} ({name:?}) lengths sum to {total}, {MANIFEST_FILE}'s \
                     stream_total_lengths[{s}] says {}",
                    m.stream_total_lengths[s]
                )));
            }
        }
        if let Some(d) =
            (0..n).find(|&d| self.scoring_length(d) as u64 != scoring_lengths[d as usize])
        {
            return Err(self.docs.corrupt(format!(
                "document {d}'s scoring length is {}, its {:?} length {}: {MANIFEST_FILE}'s \
                 streams or scoring do not describe this index",
                self.scoring_length(d),
                m.scoring,
                scoring_lengths[d as usize]
            )));
        }
        Ok(())
    }
}

/// Checks that section `i` of `f` holds non-decreasing u64 offsets starting at 0 and ending at
/// the length of section `target`.
pub(in crate::index) fn check_offsets(
    f: &MappedFile,
    i: usize,
    target: usize,
    name: &str,
) -> Result<(), IndexError> {
    let o = f.section(i);
    let n = o.len() / 8;
    let end = f.section(target).len() as u64;
    let mut prev = 0u64;
    for k in 0..n {
        let v = u64::from_le_bytes(o[k * 8..k * 8 + 8].try_into().expect("8 bytes"));
        if (k == 0 && v != 0) || v < prev || v > end {
            return Err(f.corrupt(format!(
                "{name}[{k}] = {v}: not non-decreasing from 0 within {end} bytes"
            )));
        }
        prev = v;
    }
    if n > 0 && prev != end {
        return Err(f.corrupt(format!("{name} end at {prev}, data has {end} bytes")));
    }
    Ok(())
}
