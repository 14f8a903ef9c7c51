//! Selection on the GPU against the CPU: every posting list decodes to the same docIDs and term
//! frequencies (both codecs; the fixture and synthetic indexes; hand-made lists of 1, 127, 128,
//! 129, ... postings with dense, gappy, exception-heavy and extreme values; every list of an index
//! in one batched launch), and OR, AND and AND_OR queries give the same documents in the same
//! order with bit-identical scores (AND by merge path, by binary search, by skip entries with
//! only the candidates' blocks decoded, and handed to the CPU after one or two lists), through posting caches that hold none, about half, or all of the lists;
//! a cache given another (or a reopened) index reloads, and a query too large for the staging
//! buffer is refused with `TooLarge`, and through the scheduler runs on the CPU instead. Batches
//! of mixed queries (every mode, an invalid one among them) answer each query as the CPU does,
//! and a batch over the staging buffer runs in parts.
//!
//! Without a GPU each test prints why and passes, unless `RANKSERVE_REQUIRE_GPU=1`.

use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rankserve::backend::{Backend, Processor};
use rankserve::gpu::device::device_for_tests;
use rankserve::gpu::{GpuDevice, GpuError};
use rankserve::index::codecs::{encode_list, BlockDecoder, Codec, BLOCK_LEN};
use rankserve::index::{DocId, Index, PostingList};
use rankserve::select::gpu::decode::decode_list;
use rankserve::select::gpu::{
    search_and, search_and_or, search_batch, search_or, AndPlan, BatchQuery, DecodedBlocks, GpuRun,
    GpuSelectError, PackedLists, PostingCache, PostingCacheConfig, Step,
};
use rankserve::select::schedule::{self, Scheduler};
use rankserve::select::{search, Bm25Params, Mode, Query, QueryTerms, SelectError};

use crate::selection::{fixture, pick_terms, query_strategy, synthetic};

/// One device for the whole module (probing compiles every kernel module).
fn device(test: &str) -> Option<Arc<GpuDevice>> {
    static DEVICE: OnceLock<Option<Arc<GpuDevice>>> = OnceLock::new();
    DEVICE.get_or_init(|| device_for_tests(test)).clone()
}

/// The CPU's decoding of a whole list: (docIDs, term frequencies).
fn cpu_decode(list: PostingList<'_>) -> (Vec<u32>, Vec<u32>) {
    let mut dec = BlockDecoder::new();
    let (mut docs, mut tfs) = (Vec::new(), Vec::new());
    for j in 0..list.n_blocks() {
        let bounds = list.bounds(j);
        dec.decode_docs(list.codec, list.block_bytes(j), bounds);
        dec.decode_tfs(list.codec, list.block_bytes(j), bounds);
        docs.extend_from_slice(&dec.docs[..bounds.n]);
        tfs.extend_from_slice(&dec.tfs[..bounds.n]);
    }
    (docs, tfs)
}

#[test]
fn every_index_list_decodes_like_the_cpu_gpu() {
    let Some(device) = device("every_index_list_decodes_like_the_cpu_gpu") else {
        return;
    };
    for codec in [Codec::Ef, Codec::Pfor] {
        for index in [fixture(codec), synthetic(codec)] {
            let (mut lists, mut single, mut multi_block) = (0, 0, 0);
            for i in 0..index.num_terms() as usize {
                let (term, id) = index.term_at(i);
                let list = index.postings(id);
                let got = decode_list(&device, list).unwrap();
                assert_eq!(got, cpu_decode(list), "{codec:?} list of {term:?}");
                lists += 1;
                single += usize::from(list.df == 1);
                multi_block += usize::from(list.n_blocks() > 1);
            }
            assert!(lists > 0 && single > 0 && multi_block > 0);
        }
    }
}

#[test]
fn every_index_list_in_one_launch_decodes_like_the_cpu_gpu() {
    let Some(device) = device("every_index_list_in_one_launch_decodes_like_the_cpu_gpu") else {
        return;
    };
    for codec in [Codec::Ef, Codec::Pfor] {
        for index in [fixture(codec), synthetic(codec)] {
            let lists: Vec<PostingList> = (0..index.num_terms() as usize)
                .map(|i| index.postings(index.term_at(i).1))
                .collect();
            let mut packed = PackedLists::default();
            for &list in &lists {
                packed.push(list).unwrap();
            }
            let on_device = packed.upload(&device).unwrap();
            let mut out = DecodedBlocks::alloc(&device, packed.n_blocks()).unwrap();
            on_device.decode_into(&device, codec, &mut out).unwrap();
            for (t, &list) in lists.iter().enumerate() {
                let got = out
                    .download(&device, packed.first_block[t], list.df)
                    .unwrap();
                assert_eq!(got, cpu_decode(list), "{codec:?} list {t} of the batch");
            }
        }
    }
}

/// A list's docIDs and term frequencies.
type Postings = (Vec<u32>, Vec<u32>);

/// A list of `n` postings from `first`: `posting(i)` gives posting i's d-gap minus one (unused
/// for i = 0) and its tf.
fn made_list(n: usize, first: u32, mut posting: impl FnMut(usize) -> (u32, u32)) -> Postings {
    let (mut docs, mut tfs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut d = first;
    for i in 0..n {
        let (gap, tf) = posting(i);
        if i > 0 {
            d = d + 1 + gap;
        }
        docs.push(d);
        tfs.push(tf);
    }
    (docs, tfs)
}

#[test]
fn edge_length_lists_decode_like_the_cpu_gpu() {
    // The CPU half (decoding equals what was encoded) runs without a GPU too.
    let device = device("edge_length_lists_decode_like_the_cpu_gpu");
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    for n in [1usize, 2, 31, 127, 128, 129, 255, 256, 257, 1000, 3001] {
        // Spread so the last docID stays below u32::MAX - 1 (docIDs are below N < 2^32 - 1).
        let wide = ((u32::MAX - 2) as u64 / n as u64 - 1) as u32;
        let shapes: Vec<(&str, Postings)> = vec![
            ("dense", made_list(n, 0, |_| (0, 1))),
            (
                "gappy",
                made_list(n, 3, |_| (rng.random_range(0..60), rng.random_range(1..6))),
            ),
            (
                "exceptions",
                made_list(n, 977, |i| {
                    let gap = if i % 17 == 5 {
                        rng.random_range(1 << 16..1 << 22)
                    } else {
                        rng.random_range(0..4)
                    };
                    let tf = if i % 29 == 3 {
                        rng.random_range(1 << 12..1 << 20)
                    } else {
                        1
                    };
                    (gap, tf)
                }),
            ),
            (
                "extreme",
                made_list(n, 7, |i| (wide, if i % 2 == 0 { u32::MAX } else { 1 })),
            ),
        ];
        for (shape, (docs, tfs)) in shapes {
            for codec in [Codec::Ef, Codec::Pfor] {
                let (mut bytes, mut skips) = (Vec::new(), Vec::new());
                encode_list(codec, &docs, &tfs, |_| 1, &mut bytes, &mut skips);
                let mut skip_bytes = Vec::new();
                for s in &skips {
                    s.write(&mut skip_bytes);
                }
                let list = PostingList::from_parts(codec, n as u32, &bytes, &skip_bytes);
                assert_eq!(list.n_blocks(), n.div_ceil(BLOCK_LEN));
                let cpu = cpu_decode(list);
                assert_eq!(
                    cpu,
                    (docs.clone(), tfs.clone()),
                    "CPU {codec:?} {shape} n={n}"
                );
                if let Some(device) = &device {
                    let gpu = decode_list(device, list).unwrap();
                    assert_eq!(gpu, cpu, "GPU {codec:?} {shape} n={n}");
                }
            }
        }
    }
}

/// Hits with scores as bits: equality means bit-identical scores.
fn bits(hits: &[(DocId, f64)]) -> Vec<(DocId, u64)> {
    hits.iter().map(|&(d, s)| (d, s.to_bits())).collect()
}

/// A posting cache with a small staging buffer (the test indexes are small).
fn cache_of(device: &Arc<GpuDevice>, budget_bytes: u64, log: &[Query]) -> PostingCache {
    let config = PostingCacheConfig {
        budget_bytes,
        min_visits: 1,
        staging_bytes: 8 << 20,
    };
    PostingCache::new(device.clone(), config, log).unwrap()
}

/// Posting caches for `index`: none resident, every other term resident (by the log), and every
/// term resident.
fn caches(device: &Arc<GpuDevice>, index: &Index) -> Vec<(&'static str, PostingCache)> {
    let terms: Vec<String> = (0..index.num_terms() as usize)
        .map(|i| index.term_at(i).0.to_string())
        .collect();
    let every_other: Vec<String> = terms.iter().step_by(2).cloned().collect();
    let log = |terms: Vec<String>| vec![Query::new(terms, 10, Mode::Or)];
    vec![
        ("no cache", cache_of(device, 0, &[])),
        ("half", cache_of(device, u64::MAX, &log(every_other))),
        ("all", cache_of(device, u64::MAX, &log(terms))),
    ]
}

/// The AND plans every GPU AND and AND_OR check runs: every step by merge path, every step by
/// binary search, the survivors handed to the CPU after one list and after two, merge path for
/// the longer lists only, every step by skip entries (finished on the GPU, and handed to the CPU
/// after two lists), and skip entries for lists 8 times the shortest with merge path below.
const PLANS: [AndPlan; 8] = [
    AndPlan {
        gpu_lists: usize::MAX,
        merge_path_min_df: 0,
        skip_entry_min_ratio: u32::MAX,
        skip_entry_min_df: 0,
    },
    AndPlan {
        gpu_lists: usize::MAX,
        merge_path_min_df: u32::MAX,
        skip_entry_min_ratio: u32::MAX,
        skip_entry_min_df: 0,
    },
    AndPlan {
        gpu_lists: 1,
        merge_path_min_df: 0,
        skip_entry_min_ratio: u32::MAX,
        skip_entry_min_df: 0,
    },
    AndPlan {
        gpu_lists: 2,
        merge_path_min_df: u32::MAX,
        skip_entry_min_ratio: u32::MAX,
        skip_entry_min_df: 0,
    },
    // Merge-path steps over the longer lists only, the shorter ones searched.
    AndPlan {
        gpu_lists: usize::MAX,
        merge_path_min_df: 300,
        skip_entry_min_ratio: u32::MAX,
        skip_entry_min_df: 0,
    },
    SKIP_EVERY_STEP,
    AndPlan {
        gpu_lists: 2,
        ..SKIP_EVERY_STEP
    },
    AndPlan {
        gpu_lists: usize::MAX,
        merge_path_min_df: 0,
        skip_entry_min_ratio: 8,
        skip_entry_min_df: 0,
    },
];

/// Every step by skip entries, on the GPU.
const SKIP_EVERY_STEP: AndPlan = AndPlan {
    gpu_lists: usize::MAX,
    merge_path_min_df: u32::MAX,
    skip_entry_min_ratio: 0,
    skip_entry_min_df: 0,
};

/// Runs `q` on the GPU in its mode through `cache` (AND and AND_OR under every plan of
/// [`PLANS`]) and on the CPU: the same hits in the same order with bit-identical scores.
fn check_with(cache: &mut PostingCache, what: &str, index: &Index, q: &Query) {
    let cpu = search(index, q).unwrap().hits;
    let plans = match q.mode {
        Mode::Or => &PLANS[..1],
        Mode::And | Mode::AndOr => &PLANS[..],
    };
    let terms = QueryTerms::of(index, q);
    for plan in plans {
        let gpu = match q.mode {
            Mode::Or => search_or(cache, index, q, &terms),
            Mode::And => search_and(cache, index, q, &terms, plan),
            Mode::AndOr => search_and_or(cache, index, q, &terms, plan),
        };
        assert_eq!(
            bits(&gpu.unwrap().hits),
            bits(&cpu),
            "{what}, {plan:?}: query {q:?}"
        );
    }
}

/// [`check_with`] through every cache of [`caches`].
fn check(caches: &mut [(&'static str, PostingCache)], index: &Index, q: &Query) {
    for (what, cache) in caches.iter_mut() {
        check_with(cache, what, index, q);
    }
}

#[test]
fn fixture_queries_match_the_cpu_gpu() {
    let Some(device) = device("fixture_queries_match_the_cpu_gpu") else {
        return;
    };
    let words = [
        "search",
        "index",
        "gpu",
        "the",
        "of",
        "cache",
        "nonexistent",
        "café",
        "東京",
    ];
    for codec in [Codec::Ef, Codec::Pfor] {
        let index = fixture(codec);
        let mut caches = caches(&device, index);
        for (i, a) in words.iter().enumerate() {
            for b in &words {
                let third = words[(i * 5 + 2) % words.len()];
                for terms in [vec![*a], vec![*a, *b, third], vec![*b, *a, *a]] {
                    for k in [1, 3, 10, 1000] {
                        for mode in [Mode::Or, Mode::And, Mode::AndOr] {
                            let terms = terms.iter().map(|s| s.to_string()).collect();
                            check(&mut caches, index, &Query::new(terms, k, mode));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn edge_cases_match_the_cpu_gpu() {
    let Some(device) = device("edge_cases_match_the_cpu_gpu") else {
        return;
    };
    let index = synthetic(Codec::Pfor);
    let mut caches = caches(&device, index);
    // The three most common terms: several thousand survivors, so a hand-over's rows take
    // more than its first copy.
    let common = pick_terms(index, &[(0, 0), (0, 1), (0, 2)]);
    let with_unknown = vec![common[0].clone(), "unknown-term".to_string()];
    let repeated = vec![common[1].clone(), common[0].clone(), common[1].clone()];
    for (terms, k) in [
        (vec![], 10),
        (common.clone(), 0),
        (vec!["unknown-term".to_string()], 10),
        (with_unknown, 10),
        (repeated, 10),
        (vec![common[0].clone()], 10),
        (common.clone(), index.num_docs() as usize + 5),
        // The warp top-k keeps up to 32 per block, the sort takes over from 33.
        (common.clone(), 32),
        (common.clone(), 33),
        (common.clone(), 2047),
        (common.clone(), 2048),
        (common.clone(), 2049),
    ] {
        for mode in [Mode::Or, Mode::And, Mode::AndOr] {
            check(&mut caches, index, &Query::new(terms.clone(), k, mode));
        }
    }
    let mut bad = Query::new(common, 10, Mode::Or);
    bad.params.b = 1.5;
    assert!(matches!(
        search_or(&mut caches[0].1, index, &bad, &QueryTerms::of(index, &bad)),
        Err(GpuSelectError::Query(SelectError::InvalidParameter {
            name: "b",
            ..
        }))
    ));
    bad.params.b = 0.4;
    bad.params.k1 = f32::NAN;
    assert!(matches!(
        search_and(
            &mut caches[0].1,
            index,
            &bad,
            &QueryTerms::of(index, &bad),
            &PLANS[0]
        ),
        Err(GpuSelectError::Query(SelectError::InvalidParameter {
            name: "k1",
            ..
        }))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn random_queries_match_the_cpu_gpu((picks, k, mode, k1, b) in query_strategy(), pfor in any::<bool>()) {
        let Some(device) = device("random_queries_match_the_cpu_gpu") else {
            return Ok(());
        };
        let index = synthetic(if pfor { Codec::Pfor } else { Codec::Ef });
        let mode = [Mode::And, Mode::Or, Mode::AndOr][mode as usize];
        let mut q = Query::new(pick_terms(index, &picks), k, mode);
        q.params = Bm25Params { k1, b };
        // A cache of the query's own terms (all resident) and one of none.
        check_with(&mut cache_of(&device, u64::MAX, std::slice::from_ref(&q)), "own terms", index, &q);
        check_with(&mut cache_of(&device, 0, &[]), "no cache", index, &q);
    }
}

/// The blocks of `long` that may hold one of `short`'s docIDs (the last block whose base is at
/// most the docID, for docIDs up to the list's last): what a skip-entry step decodes for a
/// two-term query.
fn candidate_blocks(short: PostingList<'_>, long: PostingList<'_>) -> u64 {
    let last = long.block_last(long.n_blocks() - 1);
    let mut blocks: Vec<usize> = (cpu_decode(short).0.into_iter())
        .filter(|&doc| doc <= last)
        .map(|doc| {
            (0..long.n_blocks())
                .filter(|&j| long.bounds(j).base <= doc)
                .count()
                - 1
        })
        .collect();
    blocks.dedup();
    blocks.len() as u64
}

#[test]
fn skip_entry_steps_decode_only_candidate_blocks_and_match_the_cpu_gpu() {
    let Some(device) =
        device("skip_entry_steps_decode_only_candidate_blocks_and_match_the_cpu_gpu")
    else {
        return;
    };
    for codec in [Codec::Ef, Codec::Pfor] {
        let index = synthetic(codec);
        // Very short lists (the rarest terms) against the longest (the commonest), and a
        // three-term query whose second step sees the survivors of the first.
        let mut by_df: Vec<(u32, String)> = (0..index.num_terms() as usize)
            .map(|i| index.term_at(i))
            .map(|(t, id)| (index.term_info(id).df, t.to_string()))
            .filter(|(df, _)| *df > 0)
            .collect();
        by_df.sort();
        let (rare, common) = (&by_df[..], &by_df[by_df.len() - 3..]);
        let longest = &common[2];
        assert!(
            longest.0 >= 1024 * rare[0].0,
            "{:?} vs {:?}",
            rare[0],
            longest
        );
        let mut caches = caches(&device, index);
        for (what, cache) in caches.iter_mut() {
            for short in [&rare[0], &rare[rare.len() / 3], &rare[rare.len() / 2]] {
                let q = Query::new(vec![longest.1.clone(), short.1.clone()], 10, Mode::And);
                let terms = QueryTerms::of(index, &q);
                let cpu = search(index, &q).unwrap();
                let (short_list, long_list) = (
                    index.postings(index.term_id(&short.1).unwrap()),
                    index.postings(index.term_id(&longest.1).unwrap()),
                );
                // The scheduler's default plan runs this step by skip entries when the ratio is
                // at least its threshold; every plan gives the CPU's hits.
                let default = Scheduler::default().and_plan(
                    &schedule::QueryShape::of(index, &q),
                    index.num_docs(),
                    |_| true,
                );
                for plan in [SKIP_EVERY_STEP, default, PLANS[1]] {
                    let gpu = search_and(cache, index, &q, &terms, &plan).unwrap();
                    assert_eq!(bits(&gpu.hits), bits(&cpu.hits), "{what}, {plan:?}: {q:?}");
                    let skipped = plan.step(long_list.df, short_list.df) == Step::SkipEntries;
                    let long_blocks = match skipped {
                        true => candidate_blocks(short_list, long_list),
                        false => long_list.n_blocks() as u64,
                    };
                    assert_eq!(
                        gpu.stats.blocks_decoded,
                        short_list.n_blocks() as u64 + long_blocks,
                        "{what}, {plan:?}: {q:?}"
                    );
                }
                assert!(candidate_blocks(short_list, long_list) < long_list.n_blocks() as u64);
                let three = vec![common[0].1.clone(), short.1.clone(), longest.1.clone()];
                for mode in [Mode::And, Mode::AndOr] {
                    check_with(cache, what, index, &Query::new(three.clone(), 10, mode));
                }
            }
        }
    }
}

#[test]
fn posting_cache_counts_and_reloads_for_another_index_gpu() {
    let Some(device) = device("posting_cache_counts_and_reloads_for_another_index_gpu") else {
        return;
    };
    let a = synthetic(Codec::Ef);
    let terms = pick_terms(a, &[(0, 0), (0, 1), (5, 3)]);
    let q = Query::new(terms.clone(), 10, Mode::Or);
    // The log holds the first two terms only: they are resident, the third is staged.
    let log = [Query::new(terms[..2].to_vec(), 10, Mode::Or)];
    let mut cache = cache_of(&device, u64::MAX, &log);
    check_with(&mut cache, "partial", a, &q);
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.rebuilds), (2, 1, 1));
    assert_eq!(stats.resident_lists, 2);
    let third = a.postings(a.term_id(&terms[2]).unwrap());
    let table_bytes = 16
        * (q.terms.iter())
            .map(|t| a.postings(a.term_id(t).unwrap()).n_blocks() as u64)
            .sum::<u64>();
    // One copy: the three lists' slots and dfs (OR passes no other words), padded to a
    // 16-byte descriptor, the block table and the staged list.
    let meta_bytes = 4 * (2 * 3usize).next_multiple_of(4) as u64;
    assert_eq!(
        stats.last_query_bytes_copied,
        meta_bytes + table_bytes + third.bytes().len() as u64
    );
    // Another index, then the same directory reopened: each is loaded afresh, never served
    // from the lists of the one before.
    let b = fixture(Codec::Ef);
    for word in ["search", "index", "the"] {
        let q = Query::new(vec![word.to_string()], 10, Mode::Or);
        check_with(&mut cache, "after switching index", b, &q);
    }
    let reopened = Index::open(a.dir()).unwrap();
    assert_ne!(reopened.generation(), a.generation());
    check_with(&mut cache, "reopened", &reopened, &q);
    assert_eq!(cache.stats().rebuilds, 3);
}

#[test]
fn a_query_larger_than_the_staging_buffer_is_refused_gpu() {
    let Some(device) = device("a_query_larger_than_the_staging_buffer_is_refused_gpu") else {
        return;
    };
    let index = synthetic(Codec::Pfor);
    let config = PostingCacheConfig {
        budget_bytes: 0,
        min_visits: 1,
        staging_bytes: 64,
    };
    let mut cache = PostingCache::new(device.clone(), config, &[]).unwrap();
    let q = Query::new(pick_terms(index, &[(0, 0), (0, 1)]), 10, Mode::And);
    assert!(matches!(
        search_and(&mut cache, index, &q, &QueryTerms::of(index, &q), &PLANS[0]),
        Err(GpuSelectError::Gpu(GpuError::TooLarge { .. }))
    ));
    // Through the scheduler the same query falls back to the CPU: same answer, error reported.
    for mode in [Mode::And, Mode::Or, Mode::AndOr] {
        let q = Query { mode, ..q.clone() };
        let ran = schedule::search(
            index,
            &q,
            Backend::Gpu,
            Some(&mut cache),
            &Scheduler::default(),
        )
        .unwrap();
        assert_eq!(ran.side, Processor::Cpu);
        assert!(matches!(ran.fallback, Some(GpuError::TooLarge { .. })));
        assert_eq!(ran.result.hits, search(index, &q).unwrap().hits);
    }
}

/// Random queries of 1–4 terms of `index` (an unknown term now and then) in every mode, with k
/// from 1 to 1 000.
fn random_queries(index: &Index, n: usize, seed: u64) -> Vec<Query> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let modes = [Mode::Or, Mode::And, Mode::AndOr];
    (0..n)
        .map(|i| {
            let terms = (0..rng.random_range(1..=4))
                .map(|_| match rng.random_range(0..20) {
                    0 => "nonexistent".to_string(),
                    _ => index
                        .term_at(rng.random_range(0..index.num_terms() as usize))
                        .0
                        .to_string(),
                })
                .collect();
            let k = [1, 10, 100, 1000][rng.random_range(0..4)];
            Query::new(terms, k, modes[i % 3])
        })
        .collect()
}

#[test]
fn batches_of_mixed_queries_match_the_cpu_gpu() {
    let Some(device) = device("batches_of_mixed_queries_match_the_cpu_gpu") else {
        return;
    };
    for codec in [Codec::Ef, Codec::Pfor] {
        let index = synthetic(codec);
        let mut queries = random_queries(index, 40, 11);
        // One query with invalid BM25 parameters: its own error, the others unharmed.
        queries[5].params = Bm25Params { k1: -1.0, b: 0.4 };
        let terms: Vec<QueryTerms> = queries.iter().map(|q| QueryTerms::of(index, q)).collect();
        let mut caches = caches(&device, index);
        for (what, cache) in caches.iter_mut() {
            // Finished on the GPU by merge path, handed over after one list, by skip entries.
            for plan in [PLANS[0], PLANS[2], SKIP_EVERY_STEP] {
                let batch: Vec<BatchQuery> = (queries.iter().zip(&terms))
                    .map(|(query, terms)| BatchQuery {
                        query,
                        terms,
                        run: GpuRun::of(query.mode, plan),
                    })
                    .collect();
                let batches_before = cache.stats().batches;
                let answers = search_batch(cache, index, &batch).unwrap();
                assert_eq!(answers.len(), queries.len());
                for (q, answer) in queries.iter().zip(answers) {
                    match search(index, q) {
                        Ok(cpu) => assert_eq!(
                            bits(&answer.unwrap().hits),
                            bits(&cpu.hits),
                            "{codec:?}, {what}, {plan:?}: {q:?}"
                        ),
                        Err(_) => assert!(matches!(answer, Err(GpuSelectError::Query(_)))),
                    }
                }
                // One staged batch for the AND and OR round, one for AND_OR's OR round.
                assert!(cache.stats().batches - batches_before <= 2);
            }
        }
    }
}

#[test]
fn a_batch_over_the_staging_buffer_runs_in_parts_gpu() {
    let Some(device) = device("a_batch_over_the_staging_buffer_runs_in_parts_gpu") else {
        return;
    };
    let index = synthetic(Codec::Pfor);
    let queries: Vec<Query> = random_queries(index, 12, 5)
        .into_iter()
        .map(|q| Query {
            mode: Mode::Or,
            ..q
        })
        .collect();
    let terms: Vec<QueryTerms> = queries.iter().map(|q| QueryTerms::of(index, q)).collect();
    let batch: Vec<BatchQuery> = (queries.iter().zip(&terms))
        .map(|(query, terms)| BatchQuery {
            query,
            terms,
            run: GpuRun::Or,
        })
        .collect();
    // Staging room for the largest query alone, not for all of them.
    let mut largest = 0;
    let mut roomy = cache_of(&device, 0, &[]);
    for one in &batch {
        search_batch(&mut roomy, index, std::slice::from_ref(one)).unwrap();
        largest = largest.max(roomy.stats().last_query_bytes_copied);
    }
    let config = PostingCacheConfig {
        budget_bytes: 0,
        min_visits: 1,
        staging_bytes: largest,
    };
    let mut cache = PostingCache::new(device.clone(), config, &[]).unwrap();
    let answers = search_batch(&mut cache, index, &batch).unwrap();
    for (q, answer) in queries.iter().zip(answers) {
        let cpu = search(index, q).unwrap();
        assert_eq!(bits(&answer.unwrap().hits), bits(&cpu.hits), "{q:?}");
    }
    assert!(cache.stats().batches > 1, "{:?}", cache.stats());
}
