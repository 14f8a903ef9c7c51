//! Document-partitioned shards: `rankserve index build --shards N` cuts a corpus into N
//! contiguous ranges of documents, each built as an index of its own (`OUT/shard-0` …), with a
//! `shard.json` that says where its docIDs start in the collection.
//!
//! Ranges, not a hash of the id: a document's global docID is the shard's `doc_offset` plus its
//! docID in the shard, so the collection's docIDs are those of the corpus indexed whole, and a
//! broker merging per-shard hits breaks ties by smaller global docID exactly as one index does.
//! A hash would balance shards no better for a corpus in arbitrary order and would need a map
//! back to the global numbering.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::builder::{build_range, BuildOptions, BuildReport, TempDir};
use super::corpus::CorpusReader;
use super::IndexError;

/// The file in a shard's directory that says which shard it is.
pub const SHARD_FILE: &str = "shard.json";

/// Where a shard lies in its collection (`shard.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShardInfo {
    /// This shard's number, 0..shards.
    pub shard: u32,
    /// Shards in the collection.
    pub shards: u32,
    /// The collection's docID of this shard's docID 0.
    pub doc_offset: u64,
    /// Documents in the whole collection when it was built.
    pub collection_docs: u64,
}

impl ShardInfo {
    /// The `shard.json` of the index in `dir`, `None` when it has none (an index built whole).
    ///
    /// # Errors
    /// [`IndexError::Io`] when it cannot be read; [`IndexError::Corrupt`] when it does not parse.
    pub fn read(dir: &Path) -> Result<Option<ShardInfo>, IndexError> {
        let path = dir.join(SHARD_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(IndexError::io(&path, err)),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|err| IndexError::corrupt(&path, err.to_string()))
    }

    fn write(&self, dir: &Path) -> Result<(), IndexError> {
        let path = dir.join(SHARD_FILE);
        let text = serde_json::to_string_pretty(self).expect("plain struct");
        std::fs::write(&path, text + "\n").map_err(|err| IndexError::io(&path, err))
    }
}

/// Shard `i`'s directory under a sharded build's `out`.
pub fn shard_dir(out: &Path, i: u32) -> PathBuf {
    out.join(format!("shard-{i}"))
}

/// The documents (non-blank lines numbered from 0) of shard `i` of `shards` in a corpus of
/// `docs`: contiguous ranges whose sizes differ by at most one.
pub fn shard_range(docs: u64, shards: u32, i: u32) -> std::ops::Range<u64> {
    let at = |s: u64| s * docs / shards as u64;
    at(i as u64)..at(i as u64 + 1)
}

/// Builds `corpus` as `shards` shards into `out/shard-0` … (`out` must not exist; it appears
/// complete or not at all). Returns each shard's build report.
///
/// `progress(n)` is called with the number of documents each time a batch is indexed.
///
/// # Errors
/// [`IndexError::InvalidOption`] when `shards` is 0 or more than the corpus's documents, or
/// `out` exists; otherwise as [`super::builder::build`] (a bad line is named in the corpus).
pub fn build_shards(
    corpus: &Path,
    out: &Path,
    opts: &BuildOptions,
    shards: u32,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<BuildReport>, IndexError> {
    let tmp = TempDir::create(out)?;
    let docs = count_documents(corpus)?;
    if shards == 0 || shards as u64 > docs {
        return Err(IndexError::InvalidOption(format!(
            "--shards {shards}: expected 1 to the corpus's {docs} documents"
        )));
    }
    let mut reports = Vec::with_capacity(shards as usize);
    for i in 0..shards {
        let range = shard_range(docs, shards, i);
        let dir = shard_dir(&tmp.path, i);
        reports.push(build_range(corpus, &dir, opts, range.clone(), progress)?);
        ShardInfo {
            shard: i,
            shards,
            doc_offset: range.start,
            collection_docs: docs,
        }
        .write(&dir)?;
    }
    tmp.commit(out)?;
    Ok(reports)
}

/// The corpus's documents (non-blank lines).
fn count_documents(corpus: &Path) -> Result<u64, IndexError> {
    let mut reader = CorpusReader::open(corpus)?;
    let (mut lines, mut docs) = (Vec::new(), 0u64);
    loop {
        lines.clear();
        match reader.read_batch(1 << 16, &mut lines)? {
            0 => return Ok(docs),
            n => docs += n as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::builder::build;
    use crate::index::Index;

    #[test]
    fn ranges_cover_the_corpus_in_order_and_differ_by_at_most_one() {
        for (docs, shards) in [(10, 3), (7, 7), (1000, 4), (5, 1)] {
            let ranges: Vec<_> = (0..shards).map(|i| shard_range(docs, shards, i)).collect();
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges.last().unwrap().end, docs);
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
            let sizes: Vec<_> = ranges.iter().map(|r| r.end - r.start).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn shards_hold_the_corpus_in_order_with_their_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("c.jsonl");
        let lines: Vec<String> = (0..10)
            .map(|i| format!(r#"{{"id": "d{i}", "streams": {{"body": "word{i} common"}}}}"#))
            .collect();
        // A blank line is not a document.
        std::fs::write(
            &corpus,
            lines[..4].join("\n") + "\n\n" + &lines[4..].join("\n"),
        )
        .unwrap();
        let opts = BuildOptions {
            threads: 1,
            ..BuildOptions::default()
        };
        let out = dir.path().join("sharded");
        let reports = build_shards(&corpus, &out, &opts, 3, &|_| {}).unwrap();
        assert_eq!(
            reports.iter().map(|r| r.docs).collect::<Vec<_>>(),
            [3, 3, 4]
        );
        let whole = dir.path().join("whole");
        build(&corpus, &whole, &opts, &|_| {}).unwrap();
        let whole = Index::open(&whole).unwrap();
        let mut scoring_length = 0;
        for i in 0..3 {
            let shard_dir = shard_dir(&out, i);
            let info = ShardInfo::read(&shard_dir).unwrap().unwrap();
            assert_eq!((info.shard, info.shards, info.collection_docs), (i, 3, 10));
            let shard = Index::open(&shard_dir).unwrap();
            for doc in 0..shard.num_docs() {
                assert_eq!(
                    shard.doc_id(doc),
                    whole.doc_id(info.doc_offset as u32 + doc)
                );
            }
            scoring_length += shard.manifest().total_scoring_length;
        }
        assert_eq!(scoring_length, whole.manifest().total_scoring_length);
        assert!(ShardInfo::read(whole.dir()).unwrap().is_none());
        let err = build_shards(&corpus, &dir.path().join("o"), &opts, 11, &|_| {}).unwrap_err();
        assert!(err.to_string().contains("--shards 11"), "{err}");
    }
}
