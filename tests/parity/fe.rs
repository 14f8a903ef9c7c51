//! Feature extraction: the GPU's catalogue against the CPU's FSMs.

use super::*;

/// Catalogue features that are not integers (sums and ratios of f64): the only ones allowed to
/// differ from the CPU, by at most 1e-12 relative. Every other feature must be bit-identical.
fn fe_float_feature(name: &str) -> bool {
    ["bm25", "idf", "fraction", "norm", "mean", "density"]
        .iter()
        .any(|part| name.contains(part))
}

/// The whole catalogue of `docs` from `gpu` against the CPU's `extract_batch`.
fn check_fe(
    device: &rankserve::gpu::GpuDevice,
    gpu: &mut GpuFe,
    query: &QueryInfo,
    stats: &CorpusStats,
    docs: &[HitDocument],
    what: &str,
) {
    let names = feature_names();
    let catalogue = FeatureResolver::new(names).unwrap();
    let width = catalogue.len();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut cpu = vec![0.0; docs.len() * width];
    catalogue
        .extract_batch(query, stats, docs, &mut cpu, threads)
        .unwrap_or_else(|e| panic!("{what}: CPU: {e}"));
    let got = gpu
        .extract_catalogue(device, query, stats, docs)
        .unwrap_or_else(|e| panic!("{what}: GPU: {e}"));
    assert_eq!(got.len(), cpu.len(), "{what}");
    let (mut identical, mut worst) = (0usize, 0.0f64);
    for (i, (&g, &c)) in got.iter().zip(&cpu).enumerate() {
        if g.to_bits() == c.to_bits() {
            identical += 1;
            continue;
        }
        let (d, f) = (i / width, i % width);
        let err = relative_error(g, c);
        worst = worst.max(err);
        assert!(
            fe_float_feature(&names[f]) && err <= 1e-12,
            "{what}: document {d}, {}: GPU {g:?} vs CPU {c:?}",
            names[f]
        );
    }
    println!(
        "{what}: {} documents × {width} features: {identical} of {} bit-identical, worst \
         relative error {worst:.3e}",
        docs.len(),
        got.len()
    );
}

fn hit_stream(length: u32, phrases: &[&[[u32; 2]]]) -> HitStream {
    HitStream::new(length, phrases)
}

fn hit_doc(id: &str, streams: &[(&str, HitStream)]) -> HitDocument {
    HitDocument {
        id: Some(id.to_string()),
        streams: streams
            .iter()
            .map(|(n, s)| (n.to_string(), s.clone()))
            .collect(),
        static_features: [("static_rank".to_string(), 0.5)].into(),
    }
}

/// Hand-made documents for a query of 3 terms, one edge case each.
pub(super) fn fe_edge_documents() -> Vec<HitDocument> {
    let big = u32::MAX;
    vec![
        hit_doc("no streams", &[]),
        hit_doc(
            "streams without hits",
            &[
                ("title", hit_stream(7, &[])),
                ("body", hit_stream(300, &[])),
                ("anchor", hit_stream(1, &[])),
                ("url", hit_stream(0, &[])),
            ],
        ),
        hit_doc(
            "only empty phrases",
            &[("body", hit_stream(10, &[&[], &[]]))],
        ),
        hit_doc("one hit", &[("title", hit_stream(5, &[&[[1, 3]]]))]),
        hit_doc(
            "whole query in order",
            &[("body", hit_stream(20, &[&[[0, 2], [1, 3], [2, 4]]]))],
        ),
        hit_doc(
            "terms out of order",
            &[("body", hit_stream(20, &[&[[2, 1], [1, 2], [0, 3]]]))],
        ),
        hit_doc(
            "in order but not adjacent",
            &[("body", hit_stream(20, &[&[[0, 2], [1, 4], [2, 5]]]))],
        ),
        hit_doc(
            "repeated terms",
            &[(
                "body",
                hit_stream(
                    12,
                    &[
                        &[[0, 0], [0, 1], [0, 2], [1, 5], [1, 6]],
                        &[[0, 9], [0, 11]],
                    ],
                ),
            )],
        ),
        hit_doc(
            "whole query split by a phrase break",
            &[(
                "title",
                hit_stream(9, &[&[[0, 1], [1, 2]], &[[2, 3], [0, 4]], &[[1, 8]]]),
            )],
        ),
        hit_doc(
            "windows across phrases and ties between phrases",
            &[
                (
                    "body",
                    hit_stream(
                        40,
                        &[
                            &[[1, 5], [2, 6], [0, 8]],
                            &[[0, 20], [1, 21], [2, 22]],
                            &[],
                            &[[1, 30], [0, 31]],
                            &[[2, 35], [2, 36], [0, 37], [1, 39]],
                        ],
                    ),
                ),
                ("anchor", hit_stream(6, &[&[[2, 0]], &[[2, 5]]])),
            ],
        ),
        hit_doc(
            "only the anchor and a stream outside the catalogue",
            &[
                ("anchor", hit_stream(3, &[&[[0, 0], [1, 1], [2, 2]]])),
                ("headings", hit_stream(4, &[&[[0, 0], [1, 1]]])),
            ],
        ),
        hit_doc(
            "positions at the end of a stream of 2^32 - 1 tokens",
            &[(
                "url",
                hit_stream(big, &[&[[0, 0]], &[[2, big - 2], [1, big - 1]]]),
            )],
        ),
        hit_doc(
            "every stream",
            &[
                ("title", hit_stream(4, &[&[[0, 0], [1, 1]]])),
                ("body", hit_stream(50, &[&[[2, 10], [0, 12]], &[[1, 49]]])),
                ("anchor", hit_stream(8, &[&[[1, 0], [2, 1]]])),
                ("url", hit_stream(5, &[&[[0, 4]]])),
            ],
        ),
    ]
}

/// `n` small random documents for a query of `q` terms: random stream lengths (0–40), sparse
/// hits, runs of consecutive terms, phrase breaks and empty phrases, a stream outside the
/// catalogue.
pub(super) fn fe_small_documents(n: usize, q: u32, seed: u64) -> Vec<HitDocument> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let mut streams = Streams::default();
            for name in ["title", "body", "anchor", "url", "extra"] {
                if !rng.random_bool(0.8) {
                    continue;
                }
                let length = rng.random_range(0..40u32);
                let mut phrases: Vec<Vec<[u32; 2]>> = vec![Vec::new()];
                let mut previous: Option<u32> = None;
                for position in 0..length {
                    if rng.random_bool(0.15) {
                        phrases.push(Vec::new());
                    }
                    if q == 0 || !rng.random_bool(0.35) {
                        continue;
                    }
                    let term = match previous {
                        Some(t) if rng.random_bool(0.5) => (t + 1) % q,
                        _ => rng.random_range(0..q),
                    };
                    previous = Some(term);
                    phrases.last_mut().unwrap().push([term, position]);
                }
                streams.insert(name, HitStream::new(length, phrases));
            }
            HitDocument {
                id: Some(format!("s{i}")),
                streams,
                static_features: Default::default(),
            }
        })
        .collect()
}

pub(super) fn partial_stats() -> CorpusStats {
    CorpusStats {
        avg_length: [("body".to_string(), 402.0), ("url".to_string(), 0.75)].into(),
    }
}

#[test]
fn fe_synthetic_documents_gpu_matches_cpu() {
    let Some(device) = device_for_tests("fe_synthetic_documents_gpu_matches_cpu") else {
        return;
    };
    let mut gpu = GpuFe::new();
    for q in [1u32, 2, 4, 8] {
        check_fe(
            &device,
            &mut gpu,
            &synth_query(q, u64::from(q)),
            &synth_corpus_stats(),
            &synth_hit_documents(3000, q, 100 + u64::from(q)),
            &format!("FE, synthetic documents, Q = {q}"),
        );
    }
}

#[test]
pub(super) fn fe_edge_documents_gpu_matches_cpu() {
    let Some(device) = device_for_tests("fe_edge_documents_gpu_matches_cpu") else {
        return;
    };
    let mut gpu = GpuFe::new();
    let docs = fe_edge_documents();
    let queries = [
        QueryInfo {
            terms: 3,
            idf: vec![1.5, 0.25, 3.0],
        },
        // Negative idf summing to 0: every ratio over Σ idf is 0.
        QueryInfo {
            terms: 3,
            idf: vec![1.0, -1.0, 0.0],
        },
    ];
    for (qi, query) in queries.iter().enumerate() {
        for (si, stats) in [
            synth_corpus_stats(),
            partial_stats(),
            CorpusStats::default(),
        ]
        .iter()
        .enumerate()
        {
            check_fe(
                &device,
                &mut gpu,
                query,
                stats,
                &docs,
                &format!("FE, edge documents, query {qi}, stats {si}"),
            );
        }
    }
    // The same documents one at a time: a batch of one.
    for doc in &docs {
        check_fe(
            &device,
            &mut gpu,
            &queries[0],
            &synth_corpus_stats(),
            std::slice::from_ref(doc),
            &format!("FE, one document ({})", doc.id.as_deref().unwrap_or("")),
        );
    }
}

#[test]
fn fe_short_and_empty_queries_gpu_match_cpu() {
    let Some(device) = device_for_tests("fe_short_and_empty_queries_gpu_match_cpu") else {
        return;
    };
    let mut gpu = GpuFe::new();
    let one = QueryInfo {
        terms: 1,
        idf: vec![2.0],
    };
    check_fe(
        &device,
        &mut gpu,
        &one,
        &partial_stats(),
        &fe_small_documents(2000, 1, 7),
        "FE, Q = 1",
    );
    let empty = QueryInfo {
        terms: 0,
        idf: vec![],
    };
    check_fe(
        &device,
        &mut gpu,
        &empty,
        &synth_corpus_stats(),
        &fe_small_documents(500, 0, 8),
        "FE, Q = 0",
    );
}

#[test]
fn fe_longest_query_gpu_matches_cpu() {
    let Some(device) = device_for_tests("fe_longest_query_gpu_matches_cpu") else {
        return;
    };
    let mut gpu = GpuFe::new();
    let q = rankserve::rank::gpu::layout::MAX_TERMS;
    check_fe(
        &device,
        &mut gpu,
        &synth_query(q, 9),
        &synth_corpus_stats(),
        &fe_small_documents(2000, q, 9),
        "FE, Q = 64 (small documents)",
    );
    check_fe(
        &device,
        &mut gpu,
        &synth_query(q, 10),
        &synth_corpus_stats(),
        &synth_hit_documents(500, q, 10),
        "FE, Q = 64 (synthetic documents)",
    );
}

#[test]
fn fe_many_documents_gpu_matches_cpu() {
    let Some(device) = device_for_tests("fe_many_documents_gpu_matches_cpu") else {
        return;
    };
    check_fe(
        &device,
        &mut GpuFe::new(),
        &synth_query(5, 11),
        &partial_stats(),
        &fe_small_documents(65_537, 5, 11),
        "FE, 65 537 small documents",
    );
}

/// One `GpuFe` over batches that grow and shrink (its buffers are reused), and the ranker-order
/// gather with static features, against the CPU's `extract_batch`.
#[test]
fn fe_reused_buffers_and_ranker_order_gpu_match_cpu() {
    let what = "FE, reused buffers, ranker order";
    let Some(device) = device_for_tests(what) else {
        return;
    };
    let query = synth_query(4, 12);
    let stats = synth_corpus_stats();
    let mut gpu = GpuFe::new();
    for (b, n) in [1000usize, 3, 0, 1, 1500].into_iter().enumerate() {
        let docs = synth_hit_documents(n, 4, 200 + b as u64);
        check_fe(
            &device,
            &mut gpu,
            &query,
            &stats,
            &docs,
            &format!("{what}, batch {b}"),
        );
    }
    let names: Vec<String> = [
        "doc.bm25f",
        "static.static_rank",
        "body.window.phrase",
        "static.no_such_key",
        "title.first_occurrence.min_norm",
        "doc.bm25f",
        "url.in_order.longest_run",
    ]
    .map(String::from)
    .to_vec();
    let resolver = FeatureResolver::new(&names).unwrap();
    let docs = synth_hit_documents(700, 4, 13);
    let mut cpu = vec![0.0; docs.len() * names.len()];
    resolver
        .extract_batch(&query, &stats, &docs, &mut cpu, 1)
        .unwrap();
    let mut got = vec![0.0; cpu.len()];
    gpu.extract_batch(&device, &resolver, &query, &stats, &docs, &mut got)
        .unwrap();
    for (i, (g, c)) in got.iter().zip(&cpu).enumerate() {
        assert!(
            g.to_bits() == c.to_bits() || g.is_nan() && c.is_nan(),
            "{what}: document {}, {}: GPU {g} vs CPU {c}",
            i / names.len(),
            names[i % names.len()]
        );
    }
}
