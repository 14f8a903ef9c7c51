//! Every file of an index: an index built from the fixture corpus, one file mutated, then
//! `Index::open` and, when it opens, every term's postings walked, queries run and every
//! document's forward-index entry and hits read, as `/v1/search` does. Binary files are
//! mutated three ways: raw (the CRC-32 catches it), in the payload with the CRC-32 fixed (the
//! structural checks must), and in the header with the CRC-32 fixed. `index.json` is mutated as
//! a JSON tree.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::Index as Pick;
use proptest::test_runner::TestCaseError;
use rankserve::index::builder::{build, BuildOptions};
use rankserve::index::codecs::Codec;
use rankserve::index::reader::{
    BLOCK_MAX_FILE, DOCS_FILE, FORWARD_FILE, MANIFEST_FILE, POSTINGS_FILE, SKIPS_FILE, TERMS_FILE,
};
use rankserve::index::{Index, IndexError, TERMINATED};
use rankserve::select::{self, Mode, Query};

use crate::support::{
    byte_edit, edit_bytes, json_splices, measuring, mutated, peak_of, run, Bound, ByteEdit, Mutated,
};

/// An index's open and queries: the files are mapped, not read; the heap holds the manifest,
/// a flag per term, decoded blocks and a query's hits.
const INDEX_BOUND: Bound = Bound {
    per_byte: 16,
    constant: 2 << 20,
};

const FILES: [&str; 7] = [
    MANIFEST_FILE,
    TERMS_FILE,
    POSTINGS_FILE,
    SKIPS_FILE,
    BLOCK_MAX_FILE,
    DOCS_FILE,
    FORWARD_FILE,
];

/// The first 60 documents of `fixtures/corpus.jsonl`, indexed with each codec, kept for the
/// test binary's life; each as its files' bytes.
struct Fixture {
    _dir: tempfile::TempDir,
    dirs: Vec<PathBuf>,
    files: Vec<Vec<Vec<u8>>>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let corpus = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/corpus.jsonl"),
        )
        .unwrap();
        let small: String = corpus.lines().take(60).map(|l| format!("{l}\n")).collect();
        let corpus_path = dir.path().join("corpus.jsonl");
        std::fs::write(&corpus_path, small).unwrap();
        let mut dirs = Vec::new();
        let mut files = Vec::new();
        for codec in [Codec::Ef, Codec::Pfor] {
            let out = dir.path().join(codec.name());
            let opts = BuildOptions {
                codec,
                threads: 1,
                ..BuildOptions::default()
            };
            build(&corpus_path, &out, &opts, &|_| {}).unwrap();
            files.push(
                FILES
                    .iter()
                    .map(|f| std::fs::read(out.join(f)).unwrap())
                    .collect(),
            );
            dirs.push(out);
        }
        Fixture {
            _dir: dir,
            dirs,
            files,
        }
    })
}

/// The fixture index (EF), opened.
pub fn opened_fixture_index() -> Index {
    Index::open(&fixture().dirs[0]).unwrap()
}

/// A word written over a binary file's bytes.
fn word() -> impl Strategy<Value = (Pick, Vec<u8>)> {
    let values = prop::sample::select(vec![
        0u64,
        1,
        2,
        7,
        8,
        127,
        128,
        255,
        0xffff,
        u32::MAX as u64 - 1,
        u32::MAX as u64,
        1 << 31,
        1 << 32,
        u64::MAX,
        u64::MAX - 7,
    ]);
    (any::<Pick>(), values, any::<bool>()).prop_map(|(at, v, wide)| {
        (
            at,
            if wide {
                v.to_le_bytes().to_vec()
            } else {
                (v as u32).to_le_bytes().to_vec()
            },
        )
    })
}

#[derive(Debug, Clone)]
enum FileEdit {
    /// Edits of the whole file, header and CRC-32 left as they are.
    Raw(Vec<ByteEdit>),
    /// Words written over the payload at 4-byte boundaries, the CRC-32 fixed.
    Payload(Vec<(Pick, Vec<u8>)>),
    /// Words written over the header's fields (bytes 8..96), the CRC-32 fixed.
    Header(Vec<(Pick, Vec<u8>)>),
    /// `index.json` as a JSON tree.
    Manifest(Mutated),
}

#[derive(Debug, Clone)]
struct Case {
    codec: usize,
    file: usize,
    edit: FileEdit,
}

fn case() -> impl Strategy<Value = Case> {
    let binary = prop_oneof![
        1 => prop::collection::vec(byte_edit(json_splices()), 1..3).prop_map(FileEdit::Raw),
        4 => prop::collection::vec(word(), 1..4).prop_map(FileEdit::Payload),
        1 => prop::collection::vec(word(), 1..3).prop_map(FileEdit::Header),
    ];
    prop_oneof![
        5 => (0..2usize, 1..FILES.len(), binary).prop_map(|(codec, file, edit)| Case { codec, file, edit }),
        1 => (0..2usize, mutated(1, json_splices())).prop_map(|(codec, m)| Case { codec, file: 0, edit: FileEdit::Manifest(m) }),
    ]
}

const HEADER_BYTES: usize = 128;

fn fix_crc(bytes: &mut [u8]) {
    if bytes.len() >= HEADER_BYTES {
        let crc = crc32fast::hash(&bytes[HEADER_BYTES..]);
        bytes[24..28].copy_from_slice(&crc.to_le_bytes());
    }
}

fn write_words(bytes: &mut [u8], words: &[(Pick, Vec<u8>)], range: std::ops::Range<usize>) {
    let slots = (range.end.saturating_sub(range.start)) / 4;
    for (at, w) in words {
        if slots == 0 {
            return;
        }
        let start = range.start + at.index(slots) * 4;
        let end = (start + w.len()).min(bytes.len());
        bytes[start..end].copy_from_slice(&w[..end - start]);
    }
}

fn mutate(case: &Case, original: &[u8]) -> Vec<u8> {
    let mut bytes = original.to_vec();
    match &case.edit {
        FileEdit::Raw(edits) => bytes = edit_bytes(bytes, edits),
        FileEdit::Payload(words) => {
            let len = bytes.len();
            write_words(&mut bytes, words, HEADER_BYTES..len);
            fix_crc(&mut bytes);
        }
        FileEdit::Header(words) => {
            write_words(&mut bytes, words, 8..96);
            fix_crc(&mut bytes);
        }
        FileEdit::Manifest(m) => {
            let manifest = serde_json::from_slice(original).unwrap();
            bytes = m.apply(&[manifest], false);
        }
    }
    bytes
}

/// Reads everything a search can reach: every term's postings and tfs, queries in every mode,
/// every document's id, lengths, static features and hits, and its forward-index entry decoded
/// whole (`hits` skips the codes of other terms).
fn exercise(index: &Index) -> Result<(), IndexError> {
    let n = index.num_docs();
    let terms: Vec<String> = (0..index.num_terms() as usize)
        .map(|i| index.term_at(i).0.to_string())
        .collect();
    for (i, term) in terms.iter().enumerate() {
        let id = index.term_id(term).expect("a listed term is found");
        let _ = index.term_info(id);
        let mut cursor = index.postings(id).cursor();
        while cursor.doc() != TERMINATED {
            let _ = cursor.tf();
            cursor.advance();
        }
        let mut cursor = index.postings(id).cursor();
        cursor.seek(i as u32 % n.max(1));
    }
    let ids: Vec<_> = terms.iter().take(3).map(|t| index.term_id(t)).collect();
    for mode in [Mode::And, Mode::Or, Mode::AndOr] {
        let words = terms.iter().step_by(7).take(4).cloned().collect();
        let query = Query::new(words, 10usize.min(n as usize), mode);
        select::search(index, &query).expect("default BM25 parameters are valid");
    }
    for d in 0..n {
        let _ = (index.doc_id(d), index.scoring_length(d));
        for s in 0..index.manifest().streams.len() {
            let _ = index.stream_length(d, s);
        }
        for f in 0..index.manifest().static_features.len() {
            let _ = index.static_value(d, f);
        }
        index.hits(d, &ids)?;
        index.forward_doc(d)?;
    }
    let _ = index.avg_scoring_length();
    Ok(())
}

#[test]
fn index_files_refuse_naming_the_file_and_bounded_heap() {
    // Built under the measuring lock: its allocations must not land in another target's
    // measurement (the counters are process-wide).
    let fixture = {
        let _one_at_a_time = measuring();
        fixture()
    };
    run("index files", 600, case(), |case, tally| {
        let original = &fixture.files[case.codec][case.file];
        let bytes = mutate(&case, original);
        let dir = tempfile::tempdir().unwrap();
        for (f, name) in FILES.iter().enumerate() {
            let file = if f == case.file {
                &bytes
            } else {
                &fixture.files[case.codec][f]
            };
            std::fs::write(dir.path().join(name), file).unwrap();
        }
        let size: usize = fixture.files[case.codec].iter().map(Vec::len).sum();
        let (opened, peak) = peak_of(|| Index::open(dir.path()).and_then(|index| exercise(&index)));
        tally.count(opened.is_ok(), size, peak);
        INDEX_BOUND.check("index", size, peak)?;
        if let Err(err) = opened {
            let path = match &err {
                IndexError::Corrupt { path, .. }
                | IndexError::Version { path, .. }
                | IndexError::Io { path, .. } => path.clone(),
                other => {
                    return Err(TestCaseError::fail(format!(
                        "{FILES:?}[{}]: {other}",
                        case.file
                    )))
                }
            };
            prop_assert!(
                path.parent() == Some(dir.path())
                    && FILES.iter().any(|f| path.file_name() == Some(f.as_ref())),
                "{err} names no file of the index"
            );
        }
        Ok(())
    });
}
