//! Opens an index directory through mmap, checks every file and offset once at open, and
//! serves the dictionary, posting lists (`super::postings`), per-document data and the forward
//! index (`super::forward`).
//!
//! After [`Index::open`] succeeds, every offset the accessors use has been range-checked, so
//! a truncated or corrupted file is refused at open (naming the file and the check) rather
//! than read past its end later.

use std::path::{Path, PathBuf};

use super::blockmax::BLOCK_MAX_BYTES;
use super::codecs::{block_len, read_u32, Codec, BLOCK_LEN, SKIP_ENTRY_BYTES};
use super::format::MappedFile;
pub use super::forward::{
    ForwardIndex, ForwardStream, HitsSink, QueryCodes, StreamHits, KIND_FORWARD,
};
use super::lengths::LengthFloors;
pub use super::manifest::{Manifest, MANIFEST_VERSION};
pub use super::postings::{PostingList, TermInfo};
use super::{DocId, IndexError, TermId};

mod check;
pub(super) use check::check_offsets;

/// The manifest's file name.
pub const MANIFEST_FILE: &str = "index.json";
/// The dictionary file.
pub const TERMS_FILE: &str = "terms.bin";
/// The posting blocks file.
pub const POSTINGS_FILE: &str = "postings.bin";
/// The skip entries file.
pub const SKIPS_FILE: &str = "skips.bin";
/// The block-max entries file ([`super::blockmax`]; manifest version 3 on).
pub const BLOCK_MAX_FILE: &str = "blockmax.bin";
/// The per-document data file.
pub const DOCS_FILE: &str = "docs.bin";
/// The forward index file.
pub const FORWARD_FILE: &str = "forward.bin";
/// Container kinds (see [`super::format`]).
pub const KIND_TERMS: [u8; 4] = *b"TERM";
/// Container kind of `postings.bin`.
pub const KIND_POSTINGS: [u8; 4] = *b"POST";
/// Container kind of `skips.bin`.
pub const KIND_SKIPS: [u8; 4] = *b"SKIP";
/// Container kind of `blockmax.bin`.
pub const KIND_BLOCK_MAX: [u8; 4] = *b"BMAX";
/// Container kind of `docs.bin`.
pub const KIND_DOCS: [u8; 4] = *b"DOCS";

/// The first `i` in `0..n` with `!below(i)` (`below` true then false over `0..n`).
fn partition_point_u32(n: usize, below: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if below(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// An open index.
#[derive(Debug)]
pub struct Index {
    dir: PathBuf,
    manifest: Manifest,
    terms: MappedFile,
    postings: MappedFile,
    skips: MappedFile,
    /// `blockmax.bin`; `None` for an index of manifest version 2, whose lists are bounded by
    /// their skip entries alone.
    block_max: Option<MappedFile>,
    docs: MappedFile,
    forward: Option<ForwardIndex>,
    /// A byte per document bounding its scoring length from below (made at open).
    length_floors: LengthFloors,
    avg_scoring_length: f64,
    generation: u64,
}

/// The generation the next opened index gets.
static NEXT_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Index {
    /// Opens and checks the index in `dir`.
    ///
    /// # Errors
    /// [`IndexError::Io`] when a file is missing or unreadable; [`IndexError::Corrupt`] naming
    /// the file and the failed check (header, CRC, section sizes, dictionary order, every
    /// term's offsets, every skip entry and block length, document offsets).
    pub fn open(dir: &Path) -> Result<Self, IndexError> {
        let manifest = Manifest::read(dir)?;
        let terms = MappedFile::open(&dir.join(TERMS_FILE), KIND_TERMS, 4)?;
        let postings = MappedFile::open(&dir.join(POSTINGS_FILE), KIND_POSTINGS, 1)?;
        let skips = MappedFile::open(&dir.join(SKIPS_FILE), KIND_SKIPS, 1)?;
        let block_max = match manifest.version >= 3 {
            true => Some(MappedFile::open(
                &dir.join(BLOCK_MAX_FILE),
                KIND_BLOCK_MAX,
                3,
            )?),
            false => None,
        };
        let docs = MappedFile::open(&dir.join(DOCS_FILE), KIND_DOCS, 5)?;
        let n = manifest.num_docs;
        let forward = if manifest.has_forward {
            Some(ForwardIndex::open(
                &dir.join(FORWARD_FILE),
                n,
                manifest.num_terms as u32,
            )?)
        } else {
            None
        };
        let avg_scoring_length = if n == 0 {
            0.0
        } else {
            manifest.total_scoring_length as f64 / n as f64
        };
        let mut index = Self {
            dir: dir.to_path_buf(),
            manifest,
            terms,
            postings,
            skips,
            block_max,
            docs,
            forward,
            length_floors: LengthFloors::default(),
            avg_scoring_length,
            generation: NEXT_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        index.check_terms()?;
        index.check_docs()?;
        index.length_floors = LengthFloors::new((0..n as u32).map(|d| index.scoring_length(d)));
        Ok(index)
    }

    /// The directory it was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A number no other index opened by this process has (a reopened directory gets a new
    /// one): what device copies of the index (the GPU posting cache) are keyed by.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Number of documents N.
    pub fn num_docs(&self) -> u32 {
        self.manifest.num_docs as u32
    }

    /// Number of terms.
    pub fn num_terms(&self) -> u32 {
        self.manifest.num_terms as u32
    }

    /// The docID codec.
    pub fn codec(&self) -> Codec {
        self.manifest.codec
    }

    /// Mean scoring length (avgdl), in f64; 0 for an empty index.
    pub fn avg_scoring_length(&self) -> f64 {
        self.avg_scoring_length
    }

    /// Mean length of a stream over all documents (absent streams count 0), for BM25F.
    pub fn avg_stream_length(&self, stream: usize) -> f64 {
        let n = self.manifest.num_docs;
        if n == 0 {
            0.0
        } else {
            self.manifest.stream_total_lengths[stream] as f64 / n as f64
        }
    }

    fn sorted_term_bytes(&self, i: usize) -> &[u8] {
        let o = self.terms.section(0);
        let at = |k: usize| {
            u64::from_le_bytes(o[k * 8..k * 8 + 8].try_into().expect("8 bytes")) as usize
        };
        &self.terms.section(1)[at(i)..at(i + 1)]
    }

    /// The term at sorted position `i` (0..num_terms) and its id.
    pub fn term_at(&self, i: usize) -> (&str, TermId) {
        let s = std::str::from_utf8(self.sorted_term_bytes(i)).expect("checked at open");
        (s, read_u32(self.terms.section(2), i * 4))
    }

    /// The id of `term` (exact bytes; callers tokenize first), by binary search.
    pub fn term_id(&self, term: &str) -> Option<TermId> {
        let (mut lo, mut hi) = (0usize, self.num_terms() as usize);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.sorted_term_bytes(mid).cmp(term.as_bytes()) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(read_u32(self.terms.section(2), mid * 4)),
            }
        }
        None
    }

    /// Term `id`'s dictionary entry.
    ///
    /// # Panics
    /// When `id ≥ num_terms`.
    pub fn term_info(&self, id: TermId) -> TermInfo {
        let at = id as usize * TermInfo::BYTES;
        TermInfo::read(&self.terms.section(3)[at..at + TermInfo::BYTES])
    }

    /// Term `id`'s posting list.
    pub fn postings(&self, id: TermId) -> PostingList<'_> {
        let info = self.term_info(id);
        let p = info.postings_offset as usize;
        let s = info.skip_start as usize * SKIP_ENTRY_BYTES;
        PostingList::mapped(
            self.manifest.codec,
            info.df,
            &self.postings.section(0)[p..p + info.postings_len as usize],
            &self.skips.section(0)[s..s + info.n_blocks as usize * SKIP_ENTRY_BYTES],
            self.block_max.as_ref().map_or(&[], |f| {
                let m = info.skip_start as usize * BLOCK_MAX_BYTES;
                &f.section(0)[m..m + info.n_blocks as usize * BLOCK_MAX_BYTES]
            }),
            match (&self.block_max, info.n_blocks >= 2) {
                (Some(f), true) => {
                    let ids = f.section(1);
                    let n = ids.len() / 4;
                    let i = partition_point_u32(n, |i| read_u32(ids, i * 4) < id);
                    match i < n && read_u32(ids, i * 4) == id {
                        true => &f.section(2)[i * BLOCK_MAX_BYTES..(i + 1) * BLOCK_MAX_BYTES],
                        false => &[],
                    }
                }
                _ => &[],
            },
        )
    }

    /// Document `d`'s scoring length (dl in BM25).
    #[inline]
    pub fn scoring_length(&self, d: DocId) -> u32 {
        read_u32(self.docs.section(0), d as usize * 4)
    }

    /// Asks for document `d`'s scoring length to be brought into the cache ahead of
    /// [`Index::scoring_length`]: a hint, nothing where the architecture has no prefetch.
    #[inline]
    pub fn prefetch_scoring_length(&self, d: DocId) {
        let at = d as usize * 4;
        super::prefetch(self.docs.section(0).get(at..at + 4).unwrap_or(&[]));
    }

    /// The one-byte code of a floor of document `d`'s scoring length (`super::lengths`, whose
    /// `floor_of` gives the floor): a quarter of the bytes of [`Index::scoring_length`], for
    /// bounds only.
    #[inline]
    pub fn scoring_length_code(&self, d: DocId) -> u8 {
        self.length_floors.code(d)
    }

    /// Document `d`'s length in stream `stream` (an index into the manifest's streams).
    pub fn stream_length(&self, d: DocId, stream: usize) -> u32 {
        read_u32(
            self.docs.section(1),
            (stream * self.manifest.num_docs as usize + d as usize) * 4,
        )
    }

    /// Document `d`'s static feature `f` (NaN when the document did not have it).
    pub fn static_value(&self, d: DocId, f: usize) -> f64 {
        let at = (f * self.manifest.num_docs as usize + d as usize) * 8;
        f64::from_le_bytes(
            self.docs.section(2)[at..at + 8]
                .try_into()
                .expect("8 bytes"),
        )
    }

    fn doc_id_bytes(&self, d: DocId) -> &[u8] {
        let o = self.docs.section(3);
        let at = |k: usize| {
            u64::from_le_bytes(o[k * 8..k * 8 + 8].try_into().expect("8 bytes")) as usize
        };
        &self.docs.section(4)[at(d as usize)..at(d as usize + 1)]
    }

    /// Document `d`'s external id.
    pub fn doc_id(&self, d: DocId) -> &str {
        std::str::from_utf8(self.doc_id_bytes(d)).expect("checked at open")
    }

    /// Whether the index has a forward index (CIFF imports do not).
    pub fn has_forward(&self) -> bool {
        self.forward.is_some()
    }

    /// Document `d`'s streams from the forward index (`None` without one).
    ///
    /// # Errors
    /// [`IndexError::Corrupt`] when the document's bytes do not decode.
    pub fn forward_doc(&self, d: DocId) -> Result<Option<Vec<ForwardStream>>, IndexError> {
        self.forward
            .as_ref()
            .map(|f| f.doc(d, self.manifest.streams.len(), self.num_terms()))
            .transpose()
    }

    /// The hits of document `d` for a query whose `i`-th term has id `query[i]` (`None` for a
    /// term not in the index): every stream of the document (with its length), and per phrase
    /// the `[i, position]` pairs where a query term occurs. `None` without a forward index.
    ///
    /// # Errors
    /// As [`Index::forward_doc`].
    pub fn hits(
        &self,
        d: DocId,
        query: &[Option<TermId>],
    ) -> Result<Option<Vec<StreamHits>>, IndexError> {
        (self.forward.as_ref())
            .map(|f| f.hits(d, &self.manifest.streams, query))
            .transpose()
    }

    /// What [`Index::hits_into`] searches each document for, for the query of term ids
    /// `query` ([`ForwardIndex::query_codes`]); nothing without a forward index.
    pub fn query_codes(&self, query: &[Option<TermId>]) -> QueryCodes {
        (self.forward.as_ref()).map_or_else(QueryCodes::default, |f| f.query_codes(query))
    }

    /// [`Index::hits`] of the query of `codes` ([`Index::query_codes`]) written into `sink`
    /// ([`ForwardIndex::hits_into`]); nothing without a forward index.
    ///
    /// # Errors
    /// As [`Index::forward_doc`].
    pub fn hits_into(
        &self,
        d: DocId,
        codes: &QueryCodes,
        sink: &mut impl HitsSink,
    ) -> Result<(), IndexError> {
        let Some(f) = &self.forward else {
            return Ok(());
        };
        f.hits_into(d, self.manifest.streams.len(), codes, sink)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::builder::{build, BuildOptions};
    use crate::index::corpus::{read_all, write_synth, SynthSpec};
    use crate::index::tokenize::Tokenizer;
    use crate::index::TERMINATED;
    use std::collections::BTreeMap;

    fn synth_index(dir: &Path, docs: u64, codec: Codec, scoring: &str) -> PathBuf {
        let corpus = dir.join("c.jsonl");
        let mut f = std::fs::File::create(&corpus).unwrap();
        write_synth(SynthSpec { docs, seed: 3 }, &mut f, |_| {}).unwrap();
        let out = dir.join(format!("idx-{}-{scoring}", codec.name()));
        let opts = BuildOptions {
            codec,
            scoring: scoring.into(),
            threads: 2,
            forward: true,
        };
        build(&corpus, &out, &opts, &|_| {}).unwrap();
        out
    }

    /// `index.json` edited by hand: refused at open, naming the file and the check, whether
    /// the checksum was left alone or made to match.
    #[test]
    fn an_edited_manifest_is_refused_naming_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let out = synth_index(dir.path(), 300, Codec::Ef, "body");
        let path = out.join(MANIFEST_FILE);
        let good = std::fs::read_to_string(&path).unwrap();
        let manifest: Manifest = serde_json::from_str(&good).unwrap();
        assert!(manifest.streams.len() >= 2, "{:?}", manifest.streams);
        let refused = |want: &str| {
            let err = Index::open(&out).unwrap_err().to_string();
            assert!(err.contains(want), "{err} lacks {want:?}");
            std::fs::write(&path, &good).unwrap();
        };
        let edited = |edit: &dyn Fn(&mut Manifest)| {
            let mut m = manifest.clone();
            edit(&mut m);
            m
        };
        let reordered = edited(&|m| {
            m.streams.reverse();
            m.stream_total_lengths.reverse();
        });
        // Left with its old checksum.
        let mut stale = reordered.clone();
        stale.checksum = manifest.checksum.clone();
        std::fs::write(&path, serde_json::to_string_pretty(&stale).unwrap()).unwrap();
        refused("index.json is corrupt: checksum \"crc32:");
        // With a checksum that matches: the files contradict it.
        reordered.write(&out).unwrap();
        refused("docs.bin is corrupt: stream 0 (");
        edited(&|m| m.stream_total_lengths[1] += 1)
            .write(&out)
            .unwrap();
        refused("docs.bin is corrupt: stream 1 (");
        let other = manifest
            .streams
            .iter()
            .find(|s| **s != manifest.scoring)
            .unwrap()
            .clone();
        edited(&|m| m.scoring = other.clone()).write(&out).unwrap();
        refused("'s scoring length is ");
        edited(&|m| m.scoring = "nope".into()).write(&out).unwrap();
        refused("index.json is corrupt: scoring stream \"nope\" is neither \"all\" nor one of the streams");
        // Written before manifests had checksums.
        let mut old: serde_json::Value = serde_json::from_str(&good).unwrap();
        old["version"] = 1.into();
        old.as_object_mut().unwrap().remove("checksum");
        std::fs::write(&path, old.to_string()).unwrap();
        refused("index.json is from another rankserve version: manifest version 1, this build reads versions 2 to 4 (version 1 manifests carry no checksum): rebuild the index");
        // Built before forward.bin held term codes.
        edited(&|m| m.version = 3).write(&out).unwrap();
        refused("index.json is from another rankserve version: manifest version 3: its forward.bin holds one term id per position, a layout this build no longer reads (version 4 on): rebuild the index with `rankserve index build`");
        let mut unknown: serde_json::Value = serde_json::from_str(&good).unwrap();
        unknown["extra"] = 1.into();
        std::fs::write(&path, unknown.to_string()).unwrap();
        refused("unknown field `extra`");
        edited(&|m| m.num_terms = u64::MAX).write(&out).unwrap();
        refused("index.json is corrupt: num_terms 18446744073709551615 does not fit a u32 term id");
        assert_eq!(Index::open(&out).unwrap().num_docs(), 300);
    }

    /// A forward-index entry claiming 2^32 − 1 streams (under a matching CRC-32) is refused as
    /// truncated; it used to reserve a slot for each first (hundreds of GB: an abort).
    #[test]
    fn a_forged_stream_count_sizes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = synth_index(dir.path(), 20, Codec::Ef, "body");
        let path = out.join(FORWARD_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        // Document 0's entry starts the first section, right after the 128-byte header.
        bytes[128..133].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        let crc = crc32fast::hash(&bytes[128..]);
        bytes[24..28].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        let index = Index::open(&out).unwrap();
        let err = index.forward_doc(0).unwrap_err().to_string();
        assert!(
            err.contains("forward.bin is corrupt: document 0: "),
            "{err}"
        );
    }

    /// The index agrees with a naive inversion of the corpus through the tokenizer.
    #[test]
    fn built_index_matches_naive_inversion() {
        let dir = tempfile::tempdir().unwrap();
        for (codec, scoring) in [(Codec::Ef, "body"), (Codec::Pfor, "all")] {
            let out = synth_index(dir.path(), 700, codec, scoring);
            let docs = read_all(&dir.path().join("c.jsonl")).unwrap();
            let index = Index::open(&out).unwrap();
            assert_eq!(index.num_docs(), 700);
            let mut tok = Tokenizer::new();
            let mut naive: BTreeMap<String, Vec<(u32, u32)>> = BTreeMap::new();
            let mut total_len = 0u64;
            for (d, doc) in docs.iter().enumerate() {
                let mut tf: BTreeMap<String, u32> = BTreeMap::new();
                let mut len = 0;
                for (name, text) in &doc.streams {
                    if scoring == "all" || name == scoring {
                        for t in tok.tokens(text) {
                            *tf.entry(t).or_default() += 1;
                            len += 1;
                        }
                    }
                }
                assert_eq!(index.scoring_length(d as u32), len);
                total_len += len as u64;
                for (t, n) in tf {
                    naive.entry(t).or_default().push((d as u32, n));
                }
                assert_eq!(index.doc_id(d as u32), doc.id);
                let rank = index
                    .manifest()
                    .static_features
                    .iter()
                    .position(|f| f == "static_rank")
                    .unwrap();
                assert_eq!(
                    index.static_value(d as u32, rank),
                    doc.static_features["static_rank"]
                );
            }
            assert_eq!(index.manifest().total_scoring_length, total_len);
            for (term, list) in &naive {
                let id = index
                    .term_id(term)
                    .unwrap_or_else(|| panic!("{term} missing"));
                let mut c = index.postings(id).cursor();
                let mut got = Vec::new();
                while c.doc() != TERMINATED {
                    got.push((c.doc(), c.tf()));
                    c.advance();
                }
                assert_eq!(&got, list, "{term}");
            }
            assert_eq!(index.term_id("zzzz-not-a-term"), None);
            // Forward index: the tokens of every stream come back, phrase by phrase, and the
            // stream lengths are docs.bin's.
            for d in 0..index.num_docs() {
                let streams = index.forward_doc(d).unwrap().unwrap();
                // Looking every token's string up is slow: four documents.
                let spelled = [0, 1, 350, 699].contains(&d);
                for s in streams.iter().filter(|_| spelled) {
                    let name = &index.manifest().streams[s.stream as usize];
                    let mut want = Vec::new();
                    let mut phrases: Vec<u32> = Vec::new();
                    tok.for_each_token(&docs[d as usize].streams[name], |t, p| {
                        want.push(t.to_string());
                        if p.phrase as usize == phrases.len() {
                            phrases.push(0);
                        }
                        *phrases.last_mut().unwrap() += 1;
                    });
                    let got: Vec<String> = s.terms.iter().map(|&t| term_of(&index, t)).collect();
                    assert_eq!(got, want);
                    assert_eq!(s.phrase_lens, phrases);
                }
                for s in &streams {
                    assert_eq!(index.stream_length(d, s.stream as usize), s.length);
                }
                // Hits, found in the codes, agree with the tokens decoded whole: for terms of
                // the document (frequent ones with short codes, rare ones with long codes), one
                // of them twice, and a term not in the index.
                let mut query: Vec<Option<TermId>> = (streams.iter())
                    .flat_map(|s| s.terms.iter().step_by(7).map(|&t| Some(t)))
                    .take(3)
                    .collect();
                query.extend([query.first().copied().flatten(), None]);
                let want: Vec<StreamHits> = (streams.iter())
                    .map(|s| {
                        let mut start = 0;
                        let phrases = (s.phrase_lens.iter())
                            .map(|&len| {
                                let range = start..start + len as usize;
                                start = range.end;
                                (range.flat_map(|p| {
                                    (query.iter().enumerate())
                                        .filter(move |&(_, q)| *q == Some(s.terms[p]))
                                        .map(move |(i, _)| [i as u32, p as u32])
                                }))
                                .collect::<Vec<_>>()
                            })
                            .filter(|hits| !hits.is_empty())
                            .collect();
                        let stream = index.manifest().streams[s.stream as usize].clone();
                        StreamHits {
                            stream,
                            length: s.length,
                            phrases,
                        }
                    })
                    .collect();
                assert_eq!(
                    index.hits(d, &query).unwrap().unwrap(),
                    want,
                    "document {d}"
                );
            }
        }
    }

    fn term_of(index: &Index, id: TermId) -> String {
        (0..index.num_terms() as usize)
            .map(|i| index.term_at(i))
            .find(|&(_, t)| t == id)
            .unwrap()
            .0
            .to_string()
    }

    #[test]
    fn hits_list_query_terms_by_phrase() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("c.jsonl");
        std::fs::write(
            &corpus,
            r#"{"id":"x","streams":{"body":"a b a. c a","title":"B"}}"#,
        )
        .unwrap();
        let out = dir.path().join("idx");
        build(&corpus, &out, &BuildOptions::default(), &|_| {}).unwrap();
        let index = Index::open(&out).unwrap();
        let q = [
            index.term_id("a"),
            index.term_id("nope"),
            index.term_id("b"),
        ];
        let hits = index.hits(0, &q).unwrap().unwrap();
        assert_eq!(hits.len(), 2);
        let body = hits.iter().find(|h| h.stream == "body").unwrap();
        assert_eq!(body.length, 5);
        assert_eq!(
            body.phrases,
            vec![vec![[0, 0], [2, 1], [0, 2]], vec![[0, 4]]]
        );
        let title = hits.iter().find(|h| h.stream == "title").unwrap();
        assert_eq!(title.phrases, vec![vec![[2, 0]]]);
    }

    #[test]
    fn corrupt_files_are_refused_naming_file_and_check() {
        let dir = tempfile::tempdir().unwrap();
        let out = synth_index(dir.path(), 300, Codec::Pfor, "body");
        Index::open(&out).unwrap();
        let expect = |file: &str, mutate: &dyn Fn(&mut Vec<u8>), want: &str| {
            let p = out.join(file);
            let good = std::fs::read(&p).unwrap();
            let mut bad = good.clone();
            mutate(&mut bad);
            std::fs::write(&p, &bad).unwrap();
            let err = Index::open(&out).unwrap_err().to_string();
            std::fs::write(&p, &good).unwrap();
            assert!(
                err.contains(file) && err.contains(want),
                "{err:?} should name {file} and {want:?}"
            );
        };
        expect(POSTINGS_FILE, &|b| b.truncate(b.len() - 3), "truncated");
        expect(
            SKIPS_FILE,
            &|b| b.truncate(60),
            "shorter than the 128-byte header",
        );
        expect(TERMS_FILE, &|b| *b.last_mut().unwrap() ^= 0x55, "CRC-32");
        expect(DOCS_FILE, &|b| b[12] = 2, "format version 2");
        expect(
            MANIFEST_FILE,
            &|b| {
                *b = String::from_utf8(b.clone())
                    .unwrap()
                    .replace("\"version\": 4", "\"version\": 7")
                    .into_bytes()
            },
            "version 7",
        );
        expect(MANIFEST_FILE, &|b| b.truncate(b.len() / 2), "line");
        expect(
            BLOCK_MAX_FILE,
            &|b| b.truncate(60),
            "shorter than the 128-byte header",
        );
        // A block's entry with a tf of 0 (it would prune every posting), CRC fixed up.
        let info = {
            let index = Index::open(&out).unwrap();
            (0..index.num_terms() as u32)
                .map(|id| index.term_info(id))
                .find(|i| i.df > 0)
                .unwrap()
        };
        expect(
            BLOCK_MAX_FILE,
            &|b| {
                let entry = info.skip_start as usize * BLOCK_MAX_BYTES;
                let at = crate::index::format::HEADER_BYTES + entry;
                b[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
                let crc = crc32fast::hash(&b[crate::index::format::HEADER_BYTES..]);
                b[24..28].copy_from_slice(&crc.to_le_bytes());
            },
            "a tf of 0",
        );
        // A skip entry pointing past its list, with the CRC fixed up: the offset check fires.
        expect(
            SKIPS_FILE,
            &|b| {
                let at = crate::index::format::HEADER_BYTES + 4;
                b[at..at + 4].copy_from_slice(&9999u32.to_le_bytes());
                let crc = crc32fast::hash(&b[crate::index::format::HEADER_BYTES..]);
                b[24..28].copy_from_slice(&crc.to_le_bytes());
            },
            "block 0",
        );
        std::fs::remove_file(out.join(FORWARD_FILE)).unwrap();
        let err = Index::open(&out).unwrap_err().to_string();
        assert!(err.contains(FORWARD_FILE), "{err}");
        // Version 3 needs blockmax.bin (version 2, made before it, opens without).
        std::fs::remove_file(out.join(BLOCK_MAX_FILE)).unwrap();
        let err = Index::open(&out).unwrap_err().to_string();
        assert!(err.contains(BLOCK_MAX_FILE), "{err}");
    }
}
