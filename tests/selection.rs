//! Selection: AND, OR and AND_OR against a brute-force reference that scores every document,
//! on the fixture corpus and on random queries over a synthetic corpus, for both codecs.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use rankserve::index::builder::{build, BuildOptions};
use rankserve::index::codecs::Codec;
use rankserve::index::corpus::{write_synth, SynthSpec};
use rankserve::index::{DocId, Index, TERMINATED};
use rankserve::select::bm25::TermScorer;
use rankserve::select::cpu::and_finish;
use rankserve::select::{dedup_terms, search, Bm25Params, Mode, Query, QueryTerms, SelectError};

/// Scores every document exhaustively: the definition the fast paths must match exactly.
fn reference(index: &Index, q: &Query) -> Vec<(DocId, f64)> {
    if q.k == 0 {
        return Vec::new();
    }
    let n = index.num_docs() as usize;
    let distinct = dedup_terms(&q.terms);
    // Per distinct term: its scorer and a dense tf array (None: unknown or no postings).
    let lists: Vec<Option<(TermScorer, Vec<u32>)>> = distinct
        .iter()
        .map(|t| {
            let list = index.postings(index.term_id(t)?);
            if list.df == 0 {
                return None;
            }
            let scorer = TermScorer::new(
                q.params,
                n as u64,
                list.df as u64,
                index.avg_scoring_length(),
            );
            let mut tfs = vec![0u32; n];
            let mut c = list.cursor();
            while c.doc() != TERMINATED {
                tfs[c.doc() as usize] = c.tf();
                c.advance();
            }
            Some((scorer, tfs))
        })
        .collect();
    let all_known = lists.iter().all(|l| l.is_some()) && !distinct.is_empty();
    let mut scored: Vec<(bool, DocId, f64)> = Vec::new();
    for d in 0..n {
        let mut score = 0f64;
        let mut matched = 0;
        for (scorer, tfs) in lists.iter().flatten() {
            if tfs[d] > 0 {
                score += scorer.contribution(tfs[d], index.scoring_length(d as DocId)) as f64;
                matched += 1;
            }
        }
        let conjunctive = all_known && matched == distinct.len();
        let keep = match q.mode {
            Mode::And => conjunctive,
            Mode::Or | Mode::AndOr => matched > 0,
        };
        if keep {
            scored.push((conjunctive, d as DocId, score));
        }
    }
    scored.sort_by(|a, b| {
        let group = if q.mode == Mode::AndOr {
            b.0.cmp(&a.0)
        } else {
            std::cmp::Ordering::Equal
        };
        group.then(b.2.total_cmp(&a.2)).then(a.1.cmp(&b.1))
    });
    scored
        .into_iter()
        .take(q.k)
        .map(|(_, d, s)| (d, s))
        .collect()
}

pub(crate) fn fixture_corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/corpus.jsonl")
}

pub(crate) fn built(corpus: &Path, name: &str, codec: Codec) -> (tempfile::TempDir, Index) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(name);
    build(
        corpus,
        &out,
        &BuildOptions {
            codec,
            ..BuildOptions::default()
        },
        &|_| {},
    )
    .unwrap();
    let index = Index::open(&out).unwrap();
    (dir, index)
}

pub(crate) fn fixture(codec: Codec) -> &'static Index {
    static EF: OnceLock<(tempfile::TempDir, Index)> = OnceLock::new();
    static PFOR: OnceLock<(tempfile::TempDir, Index)> = OnceLock::new();
    let cell = if codec == Codec::Ef { &EF } else { &PFOR };
    &cell
        .get_or_init(|| built(&fixture_corpus(), "fixture", codec))
        .1
}

pub(crate) fn synthetic(codec: Codec) -> &'static Index {
    static EF: OnceLock<(tempfile::TempDir, Index)> = OnceLock::new();
    static PFOR: OnceLock<(tempfile::TempDir, Index)> = OnceLock::new();
    static CORPUS: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let corpus = &CORPUS
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("synth.jsonl");
            let mut f = std::fs::File::create(&p).unwrap();
            write_synth(
                SynthSpec {
                    docs: 4000,
                    seed: 11,
                },
                &mut f,
                |_| {},
            )
            .unwrap();
            (dir, p)
        })
        .1;
    let cell = if codec == Codec::Ef { &EF } else { &PFOR };
    &cell.get_or_init(|| built(corpus, "synth", codec)).1
}

fn check(index: &Index, q: &Query) {
    let got = search(index, q).unwrap().hits;
    let want = reference(index, q);
    assert_eq!(got, want, "query {q:?}");
}

const MODES: [Mode; 3] = [Mode::And, Mode::Or, Mode::AndOr];

#[test]
fn fixture_queries_match_the_reference() {
    let words = [
        "search",
        "index",
        "fast",
        "gpu",
        "the",
        "of",
        "cache",
        "river",
        "nonexistent",
        "rank",
        "café",
        "東京",
    ];
    for codec in [Codec::Ef, Codec::Pfor] {
        let index = fixture(codec);
        for (i, a) in words.iter().enumerate() {
            for (j, b) in words.iter().enumerate() {
                let third = words[(i * 7 + j * 3) % words.len()];
                for terms in [
                    vec![*a],
                    vec![*a, *b],
                    vec![*a, *b, third],
                    vec![*b, *a, *a],
                ] {
                    for mode in MODES {
                        for k in [1, 3, 10, 1000] {
                            check(
                                index,
                                &Query::new(terms.iter().map(|s| s.to_string()).collect(), k, mode),
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn and_or_puts_conjunctive_matches_first() {
    let index = fixture(Codec::Ef);
    let q = Query::new(vec!["fast".into(), "gpu".into()], 1000, Mode::AndOr);
    let hits = search(index, &q).unwrap().hits;
    let and = search(
        index,
        &Query {
            mode: Mode::And,
            ..q.clone()
        },
    )
    .unwrap()
    .hits;
    assert!(!and.is_empty() && and.len() < hits.len());
    assert_eq!(&hits[..and.len()], &and[..]);
}

#[test]
fn edge_cases_are_answered_sensibly() {
    let index = fixture(Codec::Pfor);
    let n = index.num_docs() as usize;
    for mode in MODES {
        // Empty query, k = 0, unknown terms only, a 10 000-character term: no hits.
        assert!(search(index, &Query::new(vec![], 10, mode))
            .unwrap()
            .hits
            .is_empty());
        assert!(search(index, &Query::new(vec!["search".into()], 0, mode))
            .unwrap()
            .hits
            .is_empty());
        assert!(search(
            index,
            &Query::new(vec!["zzzq".into(), "qqqz".into()], 10, mode)
        )
        .unwrap()
        .hits
        .is_empty());
        let long = "x".repeat(10_000);
        assert!(search(index, &Query::new(vec![long.clone()], 10, mode))
            .unwrap()
            .hits
            .is_empty());
        check(index, &Query::new(vec![long, "search".into()], 10, mode));
        // k larger than the collection: every match.
        let all = search(index, &Query::new(vec!["the".into()], n * 10, mode))
            .unwrap()
            .hits;
        let df = index.postings(index.term_id("the").unwrap()).df as usize;
        assert_eq!(all.len(), df);
    }
    // One unknown term empties AND but not OR or AND_OR.
    let q = |mode| Query::new(vec!["search".into(), "zzzq".into()], 10, mode);
    assert!(search(index, &q(Mode::And)).unwrap().hits.is_empty());
    assert!(!search(index, &q(Mode::Or)).unwrap().hits.is_empty());
    assert_eq!(
        search(index, &q(Mode::AndOr)).unwrap().hits,
        search(index, &q(Mode::Or)).unwrap().hits
    );
    // Text queries go through the document tokenizer.
    let q = Query::from_text("FAST, Gpu!", 5, Mode::And);
    assert_eq!(q.terms, vec!["fast", "gpu"]);
    // Bad BM25 parameters are refused, naming the parameter.
    let mut bad = Query::new(vec!["search".into()], 5, Mode::Or);
    bad.params = Bm25Params { k1: -1.0, b: 0.4 };
    assert!(matches!(
        search(index, &bad),
        Err(SelectError::InvalidParameter { name: "k1", .. })
    ));
    bad.params = Bm25Params { k1: 0.9, b: 1.5 };
    let err = search(index, &bad).unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid BM25 parameter b: expected a number in [0, 1], got 1.5"
    );
}

/// Terms for random queries: a mix of frequent, mid and rare terms of the synthetic index,
/// plus unknown ones.
pub(crate) fn query_strategy() -> impl Strategy<Value = (Vec<(u8, u32)>, usize, u8, f32, f32)> {
    (
        proptest::collection::vec((0u8..10, any::<u32>()), 1..6),
        prop_oneof![Just(1usize), Just(10), Just(100), 0usize..50, Just(5000)],
        0u8..3,
        prop_oneof![Just(0.9f32), 0f32..3.0],
        prop_oneof![Just(0.4f32), 0f32..=1.0],
    )
}

pub(crate) fn pick_terms(index: &Index, picks: &[(u8, u32)]) -> Vec<String> {
    // Terms sorted by df, descending, computed once.
    static BY_DF: OnceLock<Vec<String>> = OnceLock::new();
    let by_df = BY_DF.get_or_init(|| {
        let mut v: Vec<(u32, String)> = (0..index.num_terms() as usize)
            .map(|i| {
                let (t, id) = index.term_at(i);
                (index.term_info(id).df, t.to_string())
            })
            .filter(|(df, _)| *df > 0)
            .collect();
        v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        v.into_iter().map(|(_, t)| t).collect()
    });
    picks
        .iter()
        .map(|&(kind, r)| match kind {
            0..=3 => by_df[r as usize % 30].clone(),
            4..=6 => by_df[30 + r as usize % 300].clone(),
            7..=8 => by_df[r as usize % by_df.len()].clone(),
            _ => format!("unknown{r}"),
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]
    #[test]
    fn random_queries_match_the_reference((picks, k, mode, k1, b) in query_strategy(), pfor in any::<bool>()) {
        let index = synthetic(if pfor { Codec::Pfor } else { Codec::Ef });
        let terms = pick_terms(index, &picks);
        let mut q = Query::new(terms, k, MODES[mode as usize]);
        q.params = Bm25Params { k1, b };
        let got = search(index, &q).unwrap().hits;
        let want = reference(index, &q);
        prop_assert_eq!(got, want, "query {:?}", q);
    }

    /// An AND handed to the CPU after `done` of its lists (shortest first) were intersected
    /// elsewhere, as the GPU hands one over: the survivors' rows, shuffled, finish to exactly
    /// the AND's hits and score bits.
    #[test]
    fn and_finished_from_any_step_matches_the_whole_and((picks, k, _, k1, b) in query_strategy(), pfor in any::<bool>(), done in 1usize..6, seed in any::<u64>()) {
        let index = synthetic(if pfor { Codec::Pfor } else { Codec::Ef });
        let mut q = Query::new(pick_terms(index, &picks), k, Mode::And);
        q.params = Bm25Params { k1, b };
        let Some(mut lists) = dedup_terms(&q.terms)
            .into_iter()
            .enumerate()
            .map(|(qi, t)| Some((qi, index.postings(index.term_id(t)?))).filter(|(_, l)| l.df > 0))
            .collect::<Option<Vec<_>>>()
        else {
            return Ok(());
        };
        lists.sort_by_key(|(qi, l)| (l.df, *qi));
        lists.truncate(done);
        // Per document of the intersection of those lists: its tfs, in that order.
        let mut tfs: std::collections::BTreeMap<DocId, Vec<u32>> = Default::default();
        for (i, (_, list)) in lists.iter().enumerate() {
            let mut c = list.cursor();
            while c.doc() != TERMINATED {
                let doc = c.doc();
                if i == 0 {
                    tfs.insert(doc, vec![c.tf()]);
                } else if let Some(row) = tfs.get_mut(&doc).filter(|r| r.len() == i) {
                    row.push(c.tf());
                }
                c.advance();
            }
        }
        let mut rows: Vec<Vec<u32>> = tfs
            .into_iter()
            .filter(|(_, r)| r.len() == lists.len())
            .map(|(doc, r)| std::iter::once(doc).chain(r).collect())
            .collect();
        // Rows arrive in any order.
        rows.sort_by_key(|r| (r[0] as u64).wrapping_mul(seed | 1) >> 7);
        let done: Vec<usize> = lists.iter().map(|(qi, _)| *qi).collect();
        let (got, _) = and_finish(index, &q, &QueryTerms::of(index, &q), &done, &rows.concat());
        let bits = |h: &[(DocId, f64)]| h.iter().map(|&(d, s)| (d, s.to_bits())).collect::<Vec<_>>();
        prop_assert_eq!(bits(&got), bits(&search(index, &q).unwrap().hits), "query {:?}, done {:?}", q, done);
    }
}

/// How [`random_corpus`] pads its bodies.
#[derive(Debug, Clone, Copy)]
enum Pad {
    /// Up to 200 words: bodies of 1 to ~200 words.
    Varied,
    /// To 200 words: scores depend on the tfs alone and tie by the hundred.
    Tied,
    /// Up to ~8 000 words, spread over powers of two: lengths across many of the one-byte
    /// length floors' codes (`index::lengths`), whose steps grow with the length.
    Spread,
}

/// A corpus of `n` documents over an 8-word vocabulary, word `w` in a document with probability
/// ~1/(w+1) and repeated up to ~16 times, then padded (`pad`): long lists with varied tf and
/// length, so that block bounds differ from block to block.
fn random_corpus(dir: &Path, n: usize, seed: u64, pad: Pad) -> PathBuf {
    let mut x = seed | 1;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let mut lines = String::new();
    for d in 0..n {
        let mut words = Vec::new();
        for w in 0..8u64 {
            if next(w + 1) == 0 {
                let spread = 1 << next(5);
                let tf = 1 + next(spread) as usize;
                words.extend(std::iter::repeat_n(format!("w{w}"), tf));
            }
        }
        let pad = match pad {
            Pad::Varied => next(200) as usize,
            Pad::Tied => 200 - words.len(),
            Pad::Spread => {
                let bits = next(14);
                next(1 << bits) as usize
            }
        };
        words.extend(std::iter::repeat_n("pad".to_string(), pad));
        let body = words.join(" ");
        lines += &serde_json::json!({"id": format!("d{d}"), "streams": {"body": body}}).to_string();
        lines.push('\n');
    }
    let p = dir.join("random.jsonl");
    std::fs::write(&p, lines).unwrap();
    p
}

/// A query of the random corpora's words (`8` is the padding word), with BM25's k1 and b.
fn random_query(words: &[u8], k: usize, mode: u8, k1: f32, b: f32) -> Query {
    let terms = (words.iter())
        .map(|&w| match w {
            8 => "pad".to_string(),
            w => format!("w{w}"),
        })
        .collect();
    let mut q = Query::new(terms, k, MODES[mode as usize]);
    q.params = Bm25Params { k1, b };
    q
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    /// Random corpora (each built with both codecs), random queries, k, k1 and b (on and off
    /// the block-max grid): AND, OR and AND_OR equal the reference exactly; an index without
    /// `blockmax.bin` (manifest version 2, made before it) opens and answers the same.
    #[test]
    fn random_corpora_match_the_reference(
        n in 200usize..3000, seed in any::<u64>(),
        queries in proptest::collection::vec((proptest::collection::vec(0u8..9, 1..5), 0usize..40, 0u8..3,
            prop_oneof![Just(1.2f32), 0f32..3.0], prop_oneof![Just(0.75f32), Just(0.4), 0f32..=1.0]), 12),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let corpus = random_corpus(dir.path(), n, seed, Pad::Varied);
        for codec in [Codec::Ef, Codec::Pfor] {
            let (_d, index) = built(&corpus, "random", codec);
            let old = version_2_copy(&index);
            for (words, k, mode, k1, b) in &queries {
                let q = random_query(words, *k, *mode, *k1, *b);
                let want = reference(&index, &q);
                prop_assert_eq!(&search(&index, &q).unwrap().hits, &want, "query {:?}", q);
                prop_assert_eq!(&search(&old.1, &q).unwrap().hits, &want, "version 2, query {:?}", q);
            }
        }
    }
}

/// A query of the random corpora with its k, mode (an index into `MODES`), k1 and b.
type RandomQuery = (Vec<u8>, usize, u8, f32, f32);

/// Every query of `queries` on a random corpus of `n` documents padded with `pad` (one codec,
/// chosen by the seed's parity) answers as the brute-force reference does.
fn matches_the_reference(
    n: usize,
    seed: u64,
    pad: Pad,
    queries: &[RandomQuery],
) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let corpus = random_corpus(dir.path(), n, seed, pad);
    let codec = if seed % 2 == 0 {
        Codec::Ef
    } else {
        Codec::Pfor
    };
    let (_d, index) = built(&corpus, "random", codec);
    for (words, k, mode, k1, b) in queries {
        let q = random_query(words, *k, *mode, *k1, *b);
        prop_assert_eq!(
            &search(&index, &q).unwrap().hits,
            &reference(&index, &q),
            "query {:?}",
            q
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]
    /// The pruning paths where they are most exposed: small k over long lists (AND's windows
    /// and leader-first scoring, OR's per-window essential lists), on corpora whose scores tie
    /// by the hundred (every document as long) or vary; each answer equals the reference, ties
    /// by smaller docID included.
    #[test]
    fn pruned_top_k_matches_the_reference_with_ties(
        n in 1000usize..6000, seed in any::<u64>(), tied in any::<bool>(),
        queries in proptest::collection::vec((proptest::collection::vec(0u8..9, 1..6), 1usize..12, 0u8..3,
            prop_oneof![Just(1.2f32), 0f32..3.0], prop_oneof![Just(0.75f32), 0f32..=1.0]), 16),
    ) {
        matches_the_reference(n, seed, if tied { Pad::Tied } else { Pad::Varied }, &queries)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]
    /// Lengths from 0 to ~8 000 words, where the one-byte length floors that AND prunes on
    /// (and its exact lengths only for what may enter) are up to a sixteenth below the exact
    /// lengths: small k over long lists, every answer equal to the reference, score bits and
    /// ties by smaller docID included.
    #[test]
    fn length_floor_pruning_matches_the_reference(
        n in 500usize..2000, seed in any::<u64>(),
        queries in proptest::collection::vec((proptest::collection::vec(0u8..9, 1..6), 1usize..12, 0u8..3,
            prop_oneof![Just(1.2f32), 0f32..3.0], prop_oneof![Just(0.75f32), 0f32..=1.0]), 16),
    ) {
        matches_the_reference(n, seed, Pad::Spread, &queries)?;
    }
}

/// Block-max pruning at work on a corpus of varied tf and length (20 000 documents): AND and OR
/// of frequent terms, top 10, score under half their matches, fewer than the same index
/// scores with the skip entries' bounds alone (as a version 2 index), with the same answers.
#[test]
fn block_max_bounds_prune_and_and_or() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = random_corpus(dir.path(), 20_000, 7, Pad::Varied);
    let (_d, index) = built(&corpus, "random", Codec::Pfor);
    let old = version_2_copy(&index);
    for (mode, words) in [(Mode::And, ["w0", "w1"]), (Mode::Or, ["w1", "w2"])] {
        let mut q = Query::new(words.map(String::from).to_vec(), 10, mode);
        q.params = Bm25Params { k1: 1.2, b: 0.75 };
        let got = search(&index, &q).unwrap();
        let loose = search(&old.1, &q).unwrap();
        let matches = reference(
            &index,
            &Query {
                k: usize::MAX,
                ..q.clone()
            },
        )
        .len() as u64;
        eprintln!(
            "{mode:?}: {:?}, skip entries only {:?}, {matches} matches",
            got.stats, loose.stats
        );
        assert_eq!(got.hits, loose.hits);
        assert_eq!(got.hits, reference(&index, &q));
        assert!(
            got.stats.docs_scored < matches / 2,
            "{mode:?} scored {} of {matches}",
            got.stats.docs_scored
        );
        // Tighter bounds prune no less, and somewhere more: documents scored or blocks decoded
        // (AND scores the leader's postings first, so loose bounds may score as few).
        let (tight, slack) = (got.stats, loose.stats);
        assert!(
            tight.docs_scored <= slack.docs_scored
                && tight.blocks_decoded <= slack.blocks_decoded
                && tight.docs_scored + tight.blocks_decoded
                    < slack.docs_scored + slack.blocks_decoded,
            "{mode:?}: {tight:?} against {slack:?}"
        );
    }
}

/// AND of the densest words (w0 in every document, w1 in half, w2 in a third): windows of many
/// candidates, whose first follower is marked by docID rather than sought per candidate
/// (`select::cpu`'s dense windows), for k from 1 to past the matches, both codecs, each answer
/// equal to the reference.
#[test]
fn dense_and_windows_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = random_corpus(dir.path(), 12_000, 11, Pad::Varied);
    for codec in [Codec::Ef, Codec::Pfor] {
        let (_d, index) = built(&corpus, "random", codec);
        for words in [
            &["w1", "w0"][..],
            &["w2", "w1"],
            &["w1", "w2", "w0"],
            &["w3", "w0", "w1", "w2"],
        ] {
            for k in [1, 10, 100, 10_000] {
                let terms = words.iter().map(|w| w.to_string()).collect();
                let mut q = Query::new(terms, k, Mode::And);
                q.params = Bm25Params { k1: 1.2, b: 0.75 };
                let want = reference(&index, &q);
                assert_eq!(
                    search(&index, &q).unwrap().hits,
                    want,
                    "{codec:?} {words:?} k {k}"
                );
            }
        }
    }
}

/// A copy of `index` as an index of manifest version 2 was: no `blockmax.bin`; and no
/// `forward.bin`, whose version 2 layout this build no longer reads (selection never reads it).
fn version_2_copy(index: &Index) -> (tempfile::TempDir, Index) {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(index.dir()).unwrap() {
        let path = entry.unwrap().path();
        if !["blockmax.bin", "forward.bin"].contains(&path.file_name().unwrap().to_str().unwrap()) {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let mut manifest = index.manifest().clone();
    manifest.version = 2;
    manifest.has_forward = false;
    manifest.write(dir.path()).unwrap();
    let old = Index::open(dir.path()).unwrap();
    (dir, old)
}

#[test]
fn or_prunes_and_and_skips_blocks() {
    let index = synthetic(Codec::Ef);
    let terms = pick_terms(index, &[(0, 1), (0, 5), (5, 7)]);
    let or = search(index, &Query::new(terms.clone(), 10, Mode::Or)).unwrap();
    let union = reference(index, &Query::new(terms.clone(), usize::MAX, Mode::Or)).len() as u64;
    assert!(
        or.stats.docs_scored < union / 2,
        "MaxScore scored {} of {union}",
        or.stats.docs_scored
    );
    // AND of a rare and a frequent term decodes few of the frequent term's blocks.
    let rare = pick_terms(index, &[(7, 3000)]).remove(0);
    let common = pick_terms(index, &[(0, 0)]).remove(0);
    let and = search(
        index,
        &Query::new(vec![rare.clone(), common.clone()], 10, Mode::And),
    )
    .unwrap();
    let blocks = |t: &str| index.term_info(index.term_id(t).unwrap()).n_blocks as u64;
    assert!(
        and.stats.blocks_decoded < blocks(&rare) + blocks(&common) / 2,
        "{:?} of {} + {}",
        and.stats,
        blocks(&rare),
        blocks(&common)
    );
}
