//! CIFF import: the Common Index File Format that Anserini, PISA and Terrier exchange
//! (<https://github.com/osirrc/ciff>, Lin et al., "Supporting Interoperability Between
//! Open-Source Search Engines with the Common Index File Format", SIGIR 2020).
//!
//! A CIFF file is a sequence of length-delimited protobuf messages (each preceded by its length
//! as a varint): one [`Header`], then `num_postings_lists` [`PostingsList`]s, then
//! `num_doc_records` [`DocRecord`]s. In a list, the first posting's `docid` is absolute and
//! each next one is the gap from the previous (so every gap after the first is ≥ 1).
//!
//! The import is a selection-only index: CIFF carries postings and document lengths but no
//! positions, so there is no forward index (searches on it rank by BM25 alone). The one indexed
//! stream is named `body`; a document's `doclength` is its scoring length. The messages are
//! written here by hand with prost's derive (the field numbers of `CommonIndexFileFormat.proto`);
//! no build script or protoc is needed.

use std::path::Path;

use prost::Message;
use rayon::prelude::*;

use super::blockmax::mean_length;
use super::builder::{write_docs, write_postings, write_terms, BuildReport, RangeOut, TempDir};
use super::codecs::Codec;
use super::reader::Manifest;
use super::IndexError;

/// CIFF's header: always the first message.
#[derive(Clone, PartialEq, Message)]
pub struct Header {
    #[prost(int32, tag = "1")]
    pub version: i32,
    /// Exactly the number of [`PostingsList`] messages that follow.
    #[prost(int32, tag = "2")]
    pub num_postings_lists: i32,
    /// Exactly the number of [`DocRecord`] messages that follow the lists.
    #[prost(int32, tag = "3")]
    pub num_doc_records: i32,
    /// The collection's vocabulary size (may exceed `num_postings_lists`).
    #[prost(int32, tag = "4")]
    pub total_postings_lists: i32,
    /// The collection's size (may exceed `num_doc_records`).
    #[prost(int32, tag = "5")]
    pub total_docs: i32,
    #[prost(int64, tag = "6")]
    pub total_terms_in_collection: i64,
    #[prost(double, tag = "7")]
    pub average_doclength: f64,
    /// Free text about the exporting system.
    #[prost(string, tag = "8")]
    pub description: String,
}

/// One posting: a docID (a gap after the list's first) and its term frequency.
#[derive(Clone, PartialEq, Message)]
pub struct Posting {
    #[prost(int32, tag = "1")]
    pub docid: i32,
    #[prost(int32, tag = "2")]
    pub tf: i32,
}

/// One term's postings.
#[derive(Clone, PartialEq, Message)]
pub struct PostingsList {
    #[prost(string, tag = "1")]
    pub term: String,
    #[prost(int64, tag = "2")]
    pub df: i64,
    #[prost(int64, tag = "3")]
    pub cf: i64,
    #[prost(message, repeated, tag = "4")]
    pub postings: Vec<Posting>,
}

/// One document's metadata.
#[derive(Clone, PartialEq, Message)]
pub struct DocRecord {
    /// The docID the postings use.
    #[prost(int32, tag = "1")]
    pub docid: i32,
    /// The document's id in its collection.
    #[prost(string, tag = "2")]
    pub collection_docid: String,
    #[prost(int32, tag = "3")]
    pub doclength: i32,
}

/// A list decoded to absolute docIDs.
struct DecodedList {
    term: String,
    docs: Vec<u32>,
    tfs: Vec<u32>,
}

/// Reads length-delimited messages from a byte slice, naming each one in errors.
struct Messages<'a> {
    path: &'a Path,
    bytes: &'a [u8],
}

impl Messages<'_> {
    fn next<M: Message + Default>(&mut self, what: &dyn Fn() -> String) -> Result<M, IndexError> {
        if self.bytes.is_empty() {
            return Err(ciff_error(
                self.path,
                format!("{}: file ends early", what()),
            ));
        }
        M::decode_length_delimited(&mut self.bytes)
            .map_err(|e| ciff_error(self.path, format!("{}: {e}", what())))
    }
}

fn ciff_error(path: &Path, what: String) -> IndexError {
    IndexError::Ciff {
        path: path.to_path_buf(),
        what,
    }
}

/// Imports the CIFF file `ciff` into a new index directory `out` (written into a temporary
/// directory and renamed when complete, as [`super::builder::build`] does), docIDs in `codec`.
///
/// # Errors
/// [`IndexError::Ciff`] naming the message (header, list `i` and its term, doc record `i`)
/// when the file is not valid protobuf, ends early, has bytes after the last record, or breaks
/// CIFF's rules: counts that are negative or do not match, docIDs out of `0..num_doc_records`
/// or not increasing in a list, tf < 1, df different from the list's length, a term twice, a
/// docID without exactly one record, a negative length. [`IndexError::InvalidOption`] when
/// `out` exists; [`IndexError::Io`].
pub fn import_ciff(ciff: &Path, out: &Path, codec: Codec) -> Result<BuildReport, IndexError> {
    let started = std::time::Instant::now();
    let bytes = std::fs::read(ciff).map_err(|e| IndexError::io(ciff, e))?;
    let mut messages = Messages {
        path: ciff,
        bytes: &bytes,
    };
    let header: Header = messages.next(&|| "header".to_string())?;
    let count = |value: i32, field: &str| {
        u32::try_from(value)
            .map_err(|_| ciff_error(ciff, format!("header: {field} is {value}, expected ≥ 0")))
    };
    let n_lists = count(header.num_postings_lists, "num_postings_lists")?;
    let n_docs = count(header.num_doc_records, "num_doc_records")?;
    if n_docs == u32::MAX {
        return Err(ciff_error(
            ciff,
            format!("header: num_doc_records {n_docs} does not fit a u32 docID"),
        ));
    }
    // Every message takes at least a byte (its length prefix): what a count claims beyond the
    // bytes left is forged, and must size nothing.
    let mut lists = Vec::with_capacity((n_lists as usize).min(messages.bytes.len()));
    for i in 0..n_lists {
        let list: PostingsList = messages.next(&|| format!("postings list {i} of {n_lists}"))?;
        lists.push(decode_list(ciff, i, list, n_docs)?);
    }
    if n_docs as usize > messages.bytes.len() {
        return Err(ciff_error(
            ciff,
            format!(
                "header: num_doc_records {n_docs}, but {} bytes are left after the postings lists",
                messages.bytes.len()
            ),
        ));
    }
    let mut lengths = vec![None::<u32>; n_docs as usize];
    let mut ids = vec![String::new(); n_docs as usize];
    for i in 0..n_docs {
        let record: DocRecord = messages.next(&|| format!("doc record {i} of {n_docs}"))?;
        let at = |what: String| ciff_error(ciff, format!("doc record {i}: {what}"));
        let doc = u32::try_from(record.docid)
            .ok()
            .filter(|&d| d < n_docs)
            .ok_or_else(|| at(format!("docid {} outside 0..{n_docs}", record.docid)))?;
        let length = u32::try_from(record.doclength)
            .map_err(|_| at(format!("doclength {} is negative", record.doclength)))?;
        if lengths[doc as usize].replace(length).is_some() {
            return Err(at(format!("docid {doc} has a second record")));
        }
        ids[doc as usize] = record.collection_docid;
    }
    if !messages.bytes.is_empty() {
        return Err(ciff_error(
            ciff,
            format!(
                "{} bytes after the last doc record (the header announces {n_lists} lists and {n_docs} records)",
                messages.bytes.len()
            ),
        ));
    }
    // Every docID has a record: the loop above placed n_docs distinct records in n_docs slots.
    let scoring_len: Vec<u32> = lengths.into_iter().map(|l| l.unwrap_or(0)).collect();
    let mut sorted: Vec<&str> = lists.iter().map(|l| l.term.as_str()).collect();
    sorted.par_sort_unstable();
    if let Some(twice) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(ciff_error(
            ciff,
            format!("term {:?} has two postings lists", twice[0]),
        ));
    }

    let tmp = TempDir::create(out)?;
    let total_length: u64 = scoring_len.iter().map(|&l| l as u64).sum();
    let avgdl = mean_length(total_length, n_docs as u64);
    let ranges: Vec<RangeOut> = lists
        .par_chunks(1024)
        .map(|chunk| {
            let mut range = RangeOut::default();
            for list in chunk {
                range.push_list(
                    codec,
                    &list.docs,
                    &list.tfs,
                    |d| scoring_len[d as usize],
                    avgdl,
                );
            }
            range
        })
        .collect();
    let (infos, postings_bytes, skips_bytes) = write_postings(&tmp.path, ranges)?;
    let terms: Vec<String> = lists.into_iter().map(|l| l.term).collect();
    write_terms(
        &tmp.path,
        terms.len(),
        |id| terms[id as usize].as_str(),
        &infos,
    )?;
    let mut id_offsets = Vec::with_capacity(ids.len() + 1);
    let mut id_bytes = Vec::new();
    for id in &ids {
        id_offsets.push(id_bytes.len() as u64);
        id_bytes.extend_from_slice(id.as_bytes());
    }
    id_offsets.push(id_bytes.len() as u64);
    write_docs(
        &tmp.path,
        &scoring_len,
        std::slice::from_ref(&scoring_len),
        &[],
        &id_offsets,
        &id_bytes,
    )?;
    let manifest = Manifest {
        format: Manifest::FORMAT.into(),
        version: super::reader::MANIFEST_VERSION,
        codec,
        scoring: "body".into(),
        streams: vec!["body".into()],
        static_features: Vec::new(),
        num_docs: n_docs as u64,
        num_terms: terms.len() as u64,
        num_postings: infos.iter().map(|i| i.df as u64).sum(),
        total_scoring_length: total_length,
        stream_total_lengths: vec![total_length],
        has_forward: false,
        source: format!("CIFF {} ({})", ciff.display(), header.description),
        checksum: String::new(),
    };
    manifest.write(&tmp.path)?;
    tmp.commit(out)?;
    let sizes = [postings_bytes, skips_bytes, 0];
    Ok(BuildReport::of(&manifest, sizes, started, Vec::new()))
}

/// List `i`'s postings as absolute docIDs, checked against CIFF's rules.
fn decode_list(
    path: &Path,
    i: u32,
    list: PostingsList,
    n_docs: u32,
) -> Result<DecodedList, IndexError> {
    let at = |what: String| {
        ciff_error(
            path,
            format!("postings list {i} (term {:?}): {what}", list.term),
        )
    };
    if list.df != list.postings.len() as i64 {
        return Err(at(format!(
            "df {} but {} postings",
            list.df,
            list.postings.len()
        )));
    }
    let mut docs = Vec::with_capacity(list.postings.len());
    let mut tfs = Vec::with_capacity(list.postings.len());
    let mut doc = 0u64;
    for (j, posting) in list.postings.iter().enumerate() {
        let gap = u64::try_from(posting.docid)
            .ok()
            .filter(|&g| g > 0 || j == 0);
        let Some(gap) = gap else {
            return Err(at(format!(
                "posting {j}: docid gap {} (expected {})",
                posting.docid,
                if j == 0 {
                    "≥ 0"
                } else {
                    "≥ 1: docIDs strictly increase"
                }
            )));
        };
        doc += gap;
        if doc >= n_docs as u64 {
            return Err(at(format!(
                "posting {j}: docid {doc} outside 0..{n_docs} (num_doc_records)"
            )));
        }
        let tf = u32::try_from(posting.tf)
            .ok()
            .filter(|&tf| tf >= 1)
            .ok_or_else(|| at(format!("posting {j}: tf {}, expected ≥ 1", posting.tf)))?;
        docs.push(doc as u32);
        tfs.push(tf);
    }
    Ok(DecodedList {
        term: list.term,
        docs,
        tfs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Index;

    /// A CIFF file of `lists` (term, [(absolute docid, tf)]) and `docs` (id, length).
    fn ciff_bytes(lists: &[(&str, &[(i32, i32)])], docs: &[(&str, i32)]) -> Vec<u8> {
        let mut out = Vec::new();
        Header {
            version: 1,
            num_postings_lists: lists.len() as i32,
            num_doc_records: docs.len() as i32,
            total_postings_lists: lists.len() as i32,
            total_docs: docs.len() as i32,
            description: "unit test".into(),
            ..Header::default()
        }
        .encode_length_delimited(&mut out)
        .unwrap();
        for (term, postings) in lists {
            let mut previous = 0;
            PostingsList {
                term: term.to_string(),
                df: postings.len() as i64,
                cf: postings.iter().map(|p| p.1 as i64).sum(),
                postings: postings
                    .iter()
                    .map(|&(doc, tf)| {
                        let gap = doc - previous;
                        previous = doc;
                        Posting { docid: gap, tf }
                    })
                    .collect(),
            }
            .encode_length_delimited(&mut out)
            .unwrap();
        }
        for (d, (id, length)) in docs.iter().enumerate() {
            DocRecord {
                docid: d as i32,
                collection_docid: id.to_string(),
                doclength: *length,
            }
            .encode_length_delimited(&mut out)
            .unwrap();
        }
        out
    }

    fn import(bytes: &[u8]) -> Result<(tempfile::TempDir, Index), IndexError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("in.ciff");
        std::fs::write(&file, bytes).unwrap();
        let out = dir.path().join("idx");
        import_ciff(&file, &out, Codec::Pfor)?;
        let index = Index::open(&out)?;
        Ok((dir, index))
    }

    const DOCS: [(&str, i32); 3] = [("a", 4), ("b", 2), ("c", 7)];

    #[test]
    fn imports_postings_lengths_and_ids() {
        let (_dir, index) = import(&ciff_bytes(
            &[("x", &[(0, 2), (2, 1)]), ("y", &[(1, 3)])],
            &DOCS,
        ))
        .unwrap();
        assert_eq!(index.num_docs(), 3);
        assert!(!index.has_forward());
        assert_eq!(index.doc_id(2), "c");
        assert_eq!(index.scoring_length(2), 7);
        let mut cursor = index.postings(index.term_id("x").unwrap()).cursor();
        let mut got = Vec::new();
        while cursor.doc() != crate::index::TERMINATED {
            got.push((cursor.doc(), cursor.tf()));
            cursor.advance();
        }
        assert_eq!(got, [(0, 2), (2, 1)]);
    }

    fn message(bytes: &[u8]) -> String {
        import(bytes).unwrap_err().to_string()
    }

    #[test]
    fn every_rule_is_checked_and_named() {
        let tail = |m: String| m.split_once(": ").unwrap().1.to_string();
        assert_eq!(
            tail(message(&ciff_bytes(&[("x", &[(1, 1), (1, 1)])], &DOCS))),
            "postings list 0 (term \"x\"): posting 1: docid gap 0 (expected ≥ 1: docIDs strictly increase)"
        );
        assert_eq!(
            tail(message(&ciff_bytes(&[("x", &[(3, 1)])], &DOCS))),
            "postings list 0 (term \"x\"): posting 0: docid 3 outside 0..3 (num_doc_records)"
        );
        assert_eq!(
            tail(message(&ciff_bytes(&[("x", &[(0, 0)])], &DOCS))),
            "postings list 0 (term \"x\"): posting 0: tf 0, expected ≥ 1"
        );
        assert_eq!(
            tail(message(&ciff_bytes(
                &[("x", &[(0, 1)]), ("x", &[(1, 1)])],
                &DOCS
            ))),
            "term \"x\" has two postings lists"
        );
        let whole = ciff_bytes(&[("x", &[(0, 1)])], &DOCS);
        assert_eq!(
            tail(message(&whole[..whole.len() - 3])),
            "doc record 2 of 3: failed to decode Protobuf message: buffer underflow"
        );
        let mut longer = whole.clone();
        longer.push(0);
        assert_eq!(
            tail(message(&longer)),
            "1 bytes after the last doc record (the header announces 1 lists and 3 records)"
        );
        assert_eq!(
            tail(message(&ciff_bytes(&[("x", &[(0, 1)])], &[("a", -1)]))),
            "doc record 0: doclength -1 is negative"
        );
    }

    /// Counts a header claims size nothing: a 20-byte file announcing 2^31 − 2 documents used to
    /// allocate a length and an id for each (64 GB) before reading any, and one announcing 2^20
    /// lists 75 MB of list slots.
    #[test]
    fn forged_counts_are_refused_before_anything_is_sized_by_them() {
        let header = |lists: i32, docs: i32| {
            Header {
                num_postings_lists: lists,
                num_doc_records: docs,
                ..Header::default()
            }
            .encode_length_delimited_to_vec()
        };
        assert_eq!(
            message(&header(0, i32::MAX - 1))
                .split_once(": ")
                .unwrap()
                .1,
            "header: num_doc_records 2147483646, but 0 bytes are left after the postings lists"
        );
        assert!(
            message(&header(1 << 20, 0)).ends_with("postings list 0 of 1048576: file ends early")
        );
    }
}
