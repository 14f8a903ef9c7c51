//! CIFF files through `index::ciff::import_ciff` (the `rankserve index import-ciff` command):
//! valid files made from random postings, mutated as messages (forged counts, negative and
//! repeated docIDs, wrong df) and as bytes, imported, and when the import succeeds the index
//! opened and searched.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use prost::Message;
use rankserve::index::ciff::{import_ciff, DocRecord, Header, Posting, PostingsList};
use rankserve::index::codecs::Codec;
use rankserve::index::{Index, IndexError};
use rankserve::select::{self, Mode, Query};

use crate::support::{byte_edit, edit_bytes, msgpack_splices, peak_of, run, Bound, ByteEdit};

/// The import's peak heap: the decoded lists (a posting of two bytes or more becomes two u32s),
/// the documents (an id and a length each), the index being written (measured: at most 73
/// bytes per input byte), and per thread of the index writer's pool its buffers (a 206-byte
/// file peaked at 2.14 MB on a 16-core host, 2 MiB held on 2 cores), plus the 1 MiB buffer of
/// `blockmax.bin`'s writer, open beside those of `postings.bin` and `skips.bin` (a 20-byte file
/// peaked at 3.15 MB on 2 cores).
fn ciff_bound() -> Bound {
    Bound {
        per_byte: 128,
        constant: (3 << 20) + (128 << 10) * rayon::current_num_threads(),
    }
}

/// A collection: per document its length, per term its documents (gaps ≥ 1) and tfs.
#[derive(Debug, Clone)]
struct Collection {
    lengths: Vec<i32>,
    lists: Vec<Vec<(i32, i32)>>,
}

fn collection() -> impl Strategy<Value = Collection> {
    (1usize..40).prop_flat_map(|docs| {
        (
            prop::collection::vec(0i32..500, docs),
            prop::collection::vec(
                prop::collection::btree_set(0..docs as i32, 1..docs.min(20) + 1)
                    .prop_flat_map(|set| {
                        let n = set.len();
                        (Just(set), prop::collection::vec(1i32..10, n))
                    })
                    .prop_map(|(set, tfs)| set.into_iter().zip(tfs).collect()),
                0..12,
            ),
        )
            .prop_map(|(lengths, lists)| Collection { lengths, lists })
    })
}

/// An edit of the messages before they are written.
#[derive(Debug, Clone)]
enum MessageEdit {
    Lists(i32),
    Docs(i32),
    Df(prop::sample::Index, i64),
    Gap(prop::sample::Index, prop::sample::Index, i32),
    Tf(prop::sample::Index, prop::sample::Index, i32),
    DocId(prop::sample::Index, i32),
    SameTerm,
}

fn extreme() -> impl Strategy<Value = i32> {
    prop::sample::select(vec![0, -1, 1, i32::MAX, i32::MIN, 1 << 20, 2_000_000_000])
}

fn message_edit() -> impl Strategy<Value = MessageEdit> {
    let pick = any::<prop::sample::Index>;
    prop_oneof![
        extreme().prop_map(MessageEdit::Lists),
        extreme().prop_map(MessageEdit::Docs),
        (
            pick(),
            prop::sample::select(vec![0i64, -1, i64::MAX, 1 << 40])
        )
            .prop_map(|(i, v)| MessageEdit::Df(i, v)),
        (pick(), pick(), extreme()).prop_map(|(i, j, v)| MessageEdit::Gap(i, j, v)),
        (pick(), pick(), extreme()).prop_map(|(i, j, v)| MessageEdit::Tf(i, j, v)),
        (pick(), extreme()).prop_map(|(i, v)| MessageEdit::DocId(i, v)),
        Just(MessageEdit::SameTerm),
    ]
}

fn encode(c: &Collection, edits: &[MessageEdit]) -> Vec<u8> {
    let mut header = Header {
        version: 1,
        num_postings_lists: c.lists.len() as i32,
        num_doc_records: c.lengths.len() as i32,
        total_postings_lists: c.lists.len() as i32,
        total_docs: c.lengths.len() as i32,
        total_terms_in_collection: 0,
        average_doclength: 0.0,
        description: "fuzz".into(),
    };
    let mut lists: Vec<PostingsList> = c
        .lists
        .iter()
        .enumerate()
        .map(|(t, postings)| {
            let mut prev = 0;
            PostingsList {
                term: format!("t{t}"),
                df: postings.len() as i64,
                cf: postings.iter().map(|p| p.1 as i64).sum(),
                postings: postings
                    .iter()
                    .map(|&(doc, tf)| {
                        let gap = doc - prev;
                        prev = doc;
                        Posting { docid: gap, tf }
                    })
                    .collect(),
            }
        })
        .collect();
    let mut docs: Vec<DocRecord> = c
        .lengths
        .iter()
        .enumerate()
        .map(|(d, &len)| DocRecord {
            docid: d as i32,
            collection_docid: format!("doc{d}"),
            doclength: len,
        })
        .collect();
    for edit in edits {
        match edit {
            MessageEdit::Lists(v) => header.num_postings_lists = *v,
            MessageEdit::Docs(v) => header.num_doc_records = *v,
            MessageEdit::Df(i, v) if !lists.is_empty() => {
                let n = lists.len();
                lists[i.index(n)].df = *v;
            }
            MessageEdit::Gap(i, j, v) | MessageEdit::Tf(i, j, v) if !lists.is_empty() => {
                let n = lists.len();
                let list = &mut lists[i.index(n)];
                let p = j.index(list.postings.len());
                match edit {
                    MessageEdit::Gap(..) => list.postings[p].docid = *v,
                    _ => list.postings[p].tf = *v,
                }
            }
            MessageEdit::DocId(i, v) => {
                let n = docs.len();
                docs[i.index(n)].docid = *v;
            }
            MessageEdit::SameTerm if lists.len() >= 2 => lists[1].term = lists[0].term.clone(),
            _ => {}
        }
    }
    let mut bytes = header.encode_length_delimited_to_vec();
    for list in &lists {
        bytes.extend(list.encode_length_delimited_to_vec());
    }
    for doc in &docs {
        bytes.extend(doc.encode_length_delimited_to_vec());
    }
    bytes
}

/// Varints worth splicing into protobuf: the longest, the most negative, a forged length.
fn protobuf_splices() -> Vec<Vec<u8>> {
    let mut s = msgpack_splices();
    s.push(vec![0xff; 10]);
    s.push(vec![0xff, 0xff, 0xff, 0xff, 0x0f]);
    s.push(vec![
        0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
    ]);
    s.push(vec![0x08, 0xff, 0xff, 0xff, 0xff, 0x07]);
    s.push(vec![0x10, 0xff, 0xff, 0xff, 0xff, 0x07]);
    s.push(vec![0x18, 0xff, 0xff, 0xff, 0xff, 0x07]);
    s
}

#[test]
fn ciff_files_refuse_naming_the_message_and_bounded_heap() {
    let strategy = (
        collection(),
        prop::collection::vec(message_edit(), 0..3),
        prop_oneof![
            1 => Just(Vec::<ByteEdit>::new()),
            1 => prop::collection::vec(byte_edit(protobuf_splices()), 1..3),
        ],
    );
    run(
        "ciff files",
        600,
        strategy,
        |(collection, edits, byte_edits), tally| {
            let bytes = edit_bytes(encode(&collection, &edits), &byte_edits);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("in.ciff");
            std::fs::write(&path, &bytes).unwrap();
            let out = dir.path().join("index");
            let (imported, peak) = peak_of(|| {
                import_ciff(&path, &out, Codec::Pfor)?;
                let index = Index::open(&out)?;
                let terms = (0..index.num_terms() as usize)
                    .map(|i| index.term_at(i).0.to_string())
                    .collect();
                let k = (index.num_docs() as usize).min(10);
                select::search(&index, &Query::new(terms, k, Mode::Or)).expect("valid parameters");
                Ok::<_, IndexError>(())
            });
            tally.count(imported.is_ok(), bytes.len(), peak);
            ciff_bound().check("ciff", bytes.len(), peak)?;
            match imported {
                Ok(()) => Ok(()),
                Err(IndexError::Ciff { path: named, what }) => {
                    prop_assert_eq!(&named, &path);
                    let places = [
                        "header",
                        "postings list ",
                        "doc record ",
                        "bytes after the last doc record",
                        "term ",
                    ];
                    prop_assert!(
                        places
                            .iter()
                            .any(|p| what.starts_with(p) || what.contains(p)),
                        "{what}"
                    );
                    Ok(())
                }
                Err(other) => Err(TestCaseError::fail(format!("not a CIFF error: {other}"))),
            }
        },
    );
}
