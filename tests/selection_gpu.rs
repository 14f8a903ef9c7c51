//! Selection on the GPU against the CPU: every posting list decodes to the same docIDs and term
//! frequencies (both codecs; the fixture and synthetic indexes; hand-made lists of 1, 127, 128,
//! 129, ... postings with dense, gappy, exception-heavy and extreme values), and OR and AND
//! queries give the same documents in the same order with bit-identical scores.
//!
//! Without a GPU each test prints why and passes, unless `RANKSERVE_REQUIRE_GPU=1`.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rankserve::gpu::device::device_for_tests;
use rankserve::gpu::GpuDevice;
use rankserve::index::codecs::{encode_list, BlockDecoder, Codec, BLOCK_LEN};
use rankserve::index::{DocId, Index, PostingList};
use rankserve::select::gpu::decode::decode_list;
use rankserve::select::gpu::{search_and, search_or, DeviceList, GpuSelectError};
use rankserve::select::{search, Bm25Params, Mode, Query, SelectError};

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

/// Runs `q` on the GPU in its mode (OR or AND) and on the CPU: the same hits in the same order
/// with bit-identical scores.
fn check(device: &GpuDevice, index: &Index, q: &Query) {
    let gpu = match q.mode {
        Mode::Or => search_or(device, index, q),
        Mode::And => search_and(device, index, q),
        Mode::AndOr => panic!("AND_OR has no GPU path yet"),
    };
    let cpu = search(index, q).unwrap().hits;
    assert_eq!(bits(&gpu.unwrap().hits), bits(&cpu), "query {q:?}");
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
        for (i, a) in words.iter().enumerate() {
            for b in &words {
                let third = words[(i * 5 + 2) % words.len()];
                for terms in [vec![*a], vec![*a, *b, third], vec![*b, *a, *a]] {
                    for k in [1, 3, 10, 1000] {
                        for mode in [Mode::Or, Mode::And] {
                            let terms = terms.iter().map(|s| s.to_string()).collect();
                            check(&device, index, &Query::new(terms, k, mode));
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
        (common.clone(), 2047),
        (common.clone(), 2048),
        (common.clone(), 2049),
    ] {
        for mode in [Mode::Or, Mode::And] {
            check(&device, index, &Query::new(terms.clone(), k, mode));
        }
    }
    let mut bad = Query::new(common, 10, Mode::Or);
    bad.params.b = 1.5;
    assert!(matches!(
        search_or(&device, index, &bad),
        Err(GpuSelectError::Query(SelectError::InvalidParameter {
            name: "b",
            ..
        }))
    ));
    bad.params.b = 0.4;
    bad.params.k1 = f32::NAN;
    assert!(matches!(
        search_and(&device, index, &bad),
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
        let mode = if mode == 1 { Mode::Or } else { Mode::And };
        let mut q = Query::new(pick_terms(index, &picks), k, mode);
        q.params = Bm25Params { k1, b };
        check(&device, index, &q);
    }
}

/// Decode speed on an index given by `RANKSERVE_BENCH_INDEX` (built inside the GPU run): every
/// list of at least 4096 postings, decoded on one CPU core and on the GPU (lists resident on
/// the device, one launch per list, after a warm-up), in integers (docIDs + tfs) per second.
#[test]
#[ignore = "a measurement: RANKSERVE_BENCH_INDEX=DIR, on the GPU machine"]
fn decode_speed_gpu_vs_one_cpu_core() {
    let Ok(dir) = std::env::var("RANKSERVE_BENCH_INDEX") else {
        eprintln!("decode_speed: set RANKSERVE_BENCH_INDEX to an index directory");
        return;
    };
    let Some(device) = device("decode_speed_gpu_vs_one_cpu_core") else {
        return;
    };
    let index = Index::open(std::path::Path::new(&dir)).unwrap();
    let lists: Vec<PostingList> = (0..index.num_terms() as usize)
        .map(|i| index.postings(index.term_at(i).1))
        .filter(|l| l.df >= 4096)
        .collect();
    let postings: u64 = lists.iter().map(|l| l.df as u64).sum();
    let ints = 2 * postings;

    let mut dec = BlockDecoder::new();
    let mut checksum = 0u64;
    let cpu_started = Instant::now();
    for list in &lists {
        for j in 0..list.n_blocks() {
            let bounds = list.bounds(j);
            dec.decode_docs(list.codec, list.block_bytes(j), bounds);
            dec.decode_tfs(list.codec, list.block_bytes(j), bounds);
            checksum += (dec.docs[bounds.n - 1] ^ dec.tfs[0]) as u64;
        }
    }
    let cpu_s = cpu_started.elapsed().as_secs_f64();

    let on_device: Vec<DeviceList> = lists
        .iter()
        .map(|&l| DeviceList::upload(&device, l).unwrap())
        .collect();
    let mut outs: Vec<_> = on_device
        .iter()
        .map(|l| l.decode(&device).unwrap())
        .collect();
    let stream = device.stream();
    stream.synchronize().unwrap();
    let reps = 20;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let started = Instant::now();
        for (l, out) in on_device.iter().zip(outs.iter_mut()) {
            l.decode_into(&device, out, 0).unwrap();
        }
        stream.synchronize().unwrap();
        times.push(started.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let gpu_s = times[reps / 2];
    // The longest list alone: one launch, as an OR query's longest term would run.
    let longest = (0..on_device.len())
        .max_by_key(|&i| on_device[i].df())
        .unwrap();
    let mut one = Vec::with_capacity(reps);
    for _ in 0..reps {
        let started = Instant::now();
        on_device[longest]
            .decode_into(&device, &mut outs[longest], 0)
            .unwrap();
        stream.synchronize().unwrap();
        one.push(started.elapsed().as_secs_f64());
    }
    one.sort_by(f64::total_cmp);
    let one_s = one[reps / 2];
    let longest_ints = 2.0 * on_device[longest].df() as f64;
    println!(
        "decode_speed codec={:?} docs={} lists(df>=4096)={} postings={postings} checksum={checksum}\n\
         decode_speed cpu_1core: {:.3} s, {:.3} G ints/s\n\
         decode_speed gpu_all_lists (median of {reps}, {} launches): {:.3} ms, {:.3} G ints/s\n\
         decode_speed gpu_longest_list (df={}): {:.1} us, {:.3} G ints/s",
        index.codec(),
        index.num_docs(),
        lists.len(),
        cpu_s,
        ints as f64 / cpu_s / 1e9,
        on_device.len(),
        gpu_s * 1e3,
        ints as f64 / gpu_s / 1e9,
        on_device[longest].df(),
        one_s * 1e6,
        longest_ints / one_s / 1e9,
    );
}
