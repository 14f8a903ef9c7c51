//! CPU/GPU parity of the ranking stage (DESIGN §2): identical tree leaf choices, ensemble sums
//! within 1e-9 relative, transform outputs within 1e-6, NN outputs within 1e-4 (fp32 SGEMM, no
//! TF32), "relative" meaning |a − b| / max(1, |b|); feature extraction's catalogue bit-identical
//! (at most 1e-12 relative allowed on its f64 sums and ratios, and reported).
//!
//! Each test takes the GPU from `device_for_tests`: without one it prints why and passes, unless
//! `RANKSERVE_REQUIRE_GPU=1`, where it fails. Inputs are adversarial on purpose: values exactly on
//! split thresholds and bucket bounds, their f32 neighbours, NaN, ±0, ±1e-36, negative and
//! fractional categories, a single document and 65 537 documents.

use std::path::Path;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rankserve::api::{msgpack_rank, RankDocument, RankRequest};
use rankserve::gpu::device::device_for_tests;
use rankserve::gpu::pinned::PinnedPool;
use rankserve::rank::cpu;
use rankserve::rank::fe::{
    feature_names, synth_corpus_stats, synth_hit_documents, synth_query, CorpusStats,
    FeatureResolver, HitDocument, HitStream, QueryInfo, Streams,
};
use rankserve::rank::gpu::fe::GpuFe;
use rankserve::rank::gpu::layout::FeLayout;
use rankserve::rank::gpu::ranker::{GpuPhases, GpuRanker};
use rankserve::rank::gpu::trees::{GpuTrees, TreeLayout, TreeTargets};
use rankserve::rank::model::{Decision, Input, Node, Ranker, Tree};
use rankserve::rank::plan::PlanOptions;
use rankserve::rank::store::RankerStore;

/// |a − b| / max(1, |b|), with NaN equal only to NaN.
fn relative_error(a: f64, b: f64) -> f64 {
    if a == b || (a.is_nan() && b.is_nan()) {
        return 0.0;
    }
    (a - b).abs() / b.abs().max(1.0)
}

pub(crate) fn load(path: &str) -> Ranker {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    rankserve::rank::import::load_any(&bytes).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every threshold and bound the ranker compares each feature with.
fn interesting_values(ranker: &Ranker) -> Vec<Vec<f64>> {
    let mut values = vec![Vec::new(); ranker.features.len()];
    let add_tree = |tree: &Tree, values: &mut Vec<Vec<f64>>| {
        for node in &tree.nodes {
            if let Node::Split(s) = node {
                let v = &mut values[s.feature as usize];
                match &s.decision {
                    Decision::LeF64(t) => v.extend([*t, t.next_up(), t.next_down()]),
                    Decision::LtF32(t) => v.extend([
                        f64::from(*t),
                        f64::from(t.next_up()),
                        f64::from(t.next_down()),
                        // Rounds to t in f32 from below.
                        f64::from(*t) - f64::from(t.next_up() - *t) / 4.0,
                    ]),
                    Decision::In(cats) => v
                        .extend(cats.iter().flat_map(|&c| {
                            [f64::from(c), f64::from(c) + 0.5, -f64::from(c) - 0.5]
                        })),
                }
            }
        }
    };
    for input in &ranker.inputs {
        match input {
            Input::Bucket {
                feature,
                lower,
                upper,
            } => values[*feature as usize].extend([*lower, *upper, upper.next_down()]),
            Input::Tree(tree) => add_tree(tree, &mut values),
            _ => {}
        }
    }
    if let Some(e) = &ranker.ensemble {
        for tree in &e.trees {
            add_tree(tree, &mut values);
        }
    }
    values
}

/// `n` documents whose values are mostly thresholds of the ranker, with edge values mixed in.
fn adversarial_features(ranker: &Ranker, n: usize, seed: u64) -> Vec<f64> {
    let interesting = interesting_values(ranker);
    let edges = [f64::NAN, 0.0, -0.0, 1e-36, -1e-36, 1.0, -1.0, 1e6];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n * ranker.features.len());
    for _ in 0..n {
        for values in &interesting {
            let x = match rng.random_range(0..10) {
                0..=5 if !values.is_empty() => values[rng.random_range(0..values.len())],
                6 | 7 => edges[rng.random_range(0..edges.len())],
                _ => rng.random_range(-2.0..50.0),
            };
            out.push(x);
        }
    }
    out
}

/// Tree leaf choices must be identical, doc by doc, tree by tree.
fn assert_same_leaves(
    device: &rankserve::gpu::GpuDevice,
    trees: &[Tree],
    features: &[f64],
    n_features: usize,
    what: &str,
) {
    let n_docs = features.len() / n_features;
    let gpu = GpuTrees::upload(device, &TreeLayout::build(trees).unwrap()).unwrap();
    let stream = device.stream();
    let features_dev = stream.clone_htod(features).unwrap();
    let mut ids = stream.alloc_zeros::<u32>(n_docs * trees.len()).unwrap();
    let targets = TreeTargets {
        inputs: None,
        leaf_ids: Some(&mut ids),
        sums: None,
        base: 0.0,
    };
    gpu.launch(device, &features_dev, n_docs, n_features, targets)
        .unwrap();
    let mut ids = stream.clone_dtoh(&ids).unwrap();
    gpu.original_leaf_ids(&mut ids);
    for (d, row) in features.chunks(n_features).enumerate() {
        for (t, tree) in trees.iter().enumerate() {
            let cpu_leaf = cpu::tree_leaf(tree, row);
            assert_eq!(
                ids[d * trees.len() + t],
                cpu_leaf,
                "{what}: document {d}, tree {t}: row {row:?}"
            );
        }
    }
}

/// Scores, model inputs and leaves of `ranker` on the GPU against the CPU.
fn check_ranker(ranker: &Ranker, n_docs: usize, seed: u64, what: &str) {
    let Some(device) = device_for_tests(what) else {
        return;
    };
    let n_features = ranker.features.len();
    let features = adversarial_features(ranker, n_docs, seed);
    let expected = cpu::score_batch(ranker, &features, 0);
    for options in [
        PlanOptions::default(),
        PlanOptions {
            warp_groups: false,
            feature_locality: false,
        },
    ] {
        let gpu = GpuRanker::upload(&device, ranker, options).unwrap();
        let got = gpu.score(&device, &features, true).unwrap();
        // NN outputs are fp32 GEMMs summed in another order: 1e-4. Without layers the inputs are
        // summed in f64: transforms (f32, where the GPU's ln and exp may differ from the CPU's
        // by an ulp) bound the error at 1e-6, tree leaves and ensembles alone at 1e-9.
        let has_transforms = ranker
            .inputs
            .iter()
            .any(|i| !matches!(i, Input::Tree(_) | Input::Dummy));
        let tolerance = match (ranker.layers.is_empty(), has_transforms) {
            (false, _) => 1e-4,
            (true, true) => 1e-6,
            (true, false) => 1e-9,
        };
        let mut worst = 0.0f64;
        for (d, (&g, &c)) in got.scores.iter().zip(&expected).enumerate() {
            let err = relative_error(g, c);
            worst = worst.max(err);
            assert!(
                err <= tolerance,
                "{what} {options:?}: document {d}: GPU {g} vs CPU {c}"
            );
        }
        let inputs = got.inputs.unwrap();
        let n_inputs = ranker.inputs.len();
        for (d, row) in features.chunks(n_features).enumerate() {
            let cpu_inputs = cpu::model_inputs(ranker, row);
            for (i, (&g, &c)) in inputs[d * n_inputs..(d + 1) * n_inputs]
                .iter()
                .zip(&cpu_inputs)
                .enumerate()
            {
                let err = relative_error(f64::from(g), f64::from(c));
                assert!(
                    err <= 1e-6,
                    "{what}: document {d}, input {i}: GPU {g} vs CPU {c}"
                );
            }
        }
        println!("{what} {options:?}: {n_docs} documents, worst relative score error {worst:.3e}");
    }
    let tree_inputs: Vec<Tree> = ranker
        .inputs
        .iter()
        .filter_map(|i| match i {
            Input::Tree(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    let leaf_docs = n_docs.min(4096) * n_features;
    if !tree_inputs.is_empty() {
        assert_same_leaves(
            &device,
            &tree_inputs,
            &features[..leaf_docs],
            n_features,
            what,
        );
    }
    if let Some(e) = &ranker.ensemble {
        assert_same_leaves(&device, &e.trees, &features[..leaf_docs], n_features, what);
    }
}

#[test]
fn small_ranker_gpu_matches_cpu() {
    check_ranker(&load("rankers/small.json"), 3000, 1, "small");
}

#[test]
fn medium_ranker_gpu_matches_cpu() {
    check_ranker(&load("rankers/medium.json"), 3000, 2, "medium");
}

#[test]
fn large_ranker_gpu_matches_cpu() {
    check_ranker(&load("rankers/large.json"), 2000, 3, "large");
}

#[test]
fn one_document_gpu_matches_cpu() {
    check_ranker(&load("rankers/medium.json"), 1, 4, "medium, one document");
}

#[test]
fn many_documents_gpu_matches_cpu() {
    check_ranker(
        &load("rankers/small.json"),
        65_537,
        5,
        "small, 65 537 documents",
    );
}

#[test]
fn imported_models_gpu_match_cpu() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/trees");
    let mut models: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            // The models the import tests score (the others are rejection fixtures): every
            // imported format, ONNX MLPs included.
            let name = p.to_string_lossy();
            name.find(".model.")
                .is_some_and(|at| Path::new(&format!("{}.expected.txt", &name[..at])).exists())
        })
        .collect();
    models.sort();
    assert!(!models.is_empty(), "no models in {}", root.display());
    for (i, path) in models.iter().enumerate() {
        let rel = path
            .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")))
            .unwrap();
        check_ranker(
            &load(rel.to_str().unwrap()),
            2000,
            10 + i as u64,
            rel.to_str().unwrap(),
        );
    }
}

#[test]
fn every_transform_kind_gpu_matches_cpu() {
    let json = r#"{"format": "rankserve-ranker", "version": 1,
        "features": ["a", "b", "c"],
        "inputs": [
            {"type": "linear", "feature": "a", "slope": 0.37, "intercept": -1.5},
            {"type": "loglinear", "feature": "b", "slope": 2.5, "intercept": 0.1},
            {"type": "bucket", "feature": "c", "lower": 1.0, "upper": 4.0},
            {"type": "bucket", "feature": "a", "lower": -1.0, "upper": 0.0},
            {"type": "freeform", "expr": "ln(a + 1) * max(b, 0.5)"},
            {"type": "freeform", "expr": "min(exp(-c / 10), a - b) / 3"},
            {"type": "tree", "tree": {"nodes": [
                {"feature": 0, "decision": "le_f64", "threshold": 4.6285, "missing": "nan",
                 "default_left": true, "left": 1, "right": 2},
                {"leaf": 0.0132},
                {"feature": 2, "decision": "in", "categories": [1, 5, 7], "missing": "zero",
                 "default_left": false, "left": 3, "right": 4},
                {"leaf": -0.25}, {"leaf": 0.5}]}}
        ],
        "layers": [
            {"weights": [[0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7], [0.5, 0.5, -0.5, 0.25, 0.125, -1.0, 2.0]],
             "bias": [0.01, -0.02], "activation": "tanh"},
            {"weights": [[1.5, -0.75]], "bias": [0.2], "activation": "sigmoid"}
        ],
        "ensemble": {"trees": [{"nodes": [
            {"feature": 1, "decision": "lt_f32", "threshold": 0.1, "missing": "none",
             "left": 1, "right": 2},
            {"leaf": 1.0}, {"leaf": -1.0}]}], "base_score": 0.5}}"#;
    let ranker = rankserve::rank::format::parse_native(json.as_bytes()).unwrap();
    check_ranker(&ranker, 5000, 20, "every transform kind");
    let mut without_layers = ranker.clone();
    without_layers.layers.clear();
    check_ranker(&without_layers, 5000, 21, "every transform kind, no layers");
}

// ---- feature extraction: the GPU's catalogue against the CPU's FSMs ----

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
fn fe_edge_documents() -> Vec<HitDocument> {
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
fn fe_small_documents(n: usize, q: u32, seed: u64) -> Vec<HitDocument> {
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

fn partial_stats() -> CorpusStats {
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
fn fe_edge_documents_gpu_matches_cpu() {
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

// ---- the fused device path: hit documents → FE → gather → MIT, trees, NN → scores ----

/// The tolerance DESIGN §2 gives `ranker`'s scores (as `check_ranker` picks it).
fn score_tolerance(ranker: &Ranker) -> f64 {
    let has_transforms = ranker
        .inputs
        .iter()
        .any(|i| !matches!(i, Input::Tree(_) | Input::Dummy));
    match (ranker.layers.is_empty(), has_transforms) {
        (false, _) => 1e-4,
        (true, true) => 1e-6,
        (true, false) => 1e-9,
    }
}

fn refs(layouts: &[FeLayout]) -> Vec<&FeLayout> {
    layouts.iter().collect()
}

/// `GpuRanker::score_hits` on `docs` against the CPU's FE (`extract_batch`) and scoring: the
/// rows it gathered on the device bit-identical, the scores within the ranker's tolerance, and
/// the model inputs of `explain` those of the CPU.
#[allow(clippy::too_many_arguments)]
fn check_fused(
    device: &rankserve::gpu::GpuDevice,
    fe: &mut GpuFe,
    ranker: &Ranker,
    gpu: &GpuRanker,
    query: &QueryInfo,
    stats: &CorpusStats,
    docs: &[HitDocument],
    what: &str,
) {
    let resolver = FeatureResolver::new(&ranker.features).unwrap();
    let width = resolver.len();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rows = vec![0.0; docs.len() * width];
    resolver
        .extract_batch(query, stats, docs, &mut rows, threads)
        .unwrap_or_else(|e| panic!("{what}: CPU: {e}"));
    let expected = cpu::score_batch(ranker, &rows, 0);
    let map = resolver.gather_map();
    // In pinned memory, as the served path joins them.
    let pinned = PinnedPool::new(Arc::clone(device.context()), 64 << 20);
    let layouts = FeLayout::build_split(
        query,
        stats,
        docs,
        Some(&map),
        gpu.max_batch(),
        rayon::current_num_threads(),
        Some(&pinned),
    )
    .unwrap_or_else(|e| panic!("{what}: layout: {e}"));
    let explain = docs.len() <= 2000;
    let got = gpu
        .score_hits(device, fe, &refs(&layouts), explain, true)
        .unwrap_or_else(|e| panic!("{what}: GPU: {e}"));
    let got_rows = got.rows.expect("rows kept");
    assert_eq!(got_rows.len(), rows.len(), "{what}");
    for (i, (g, c)) in got_rows.iter().zip(&rows).enumerate() {
        assert!(
            g.to_bits() == c.to_bits(),
            "{what}: document {}, {}: GPU {g:?} vs CPU {c:?}",
            i / width,
            ranker.features[i % width]
        );
    }
    let tolerance = score_tolerance(ranker);
    assert_eq!(got.scores.len(), docs.len(), "{what}");
    let mut worst = 0.0f64;
    for (d, (&g, &c)) in got.scores.iter().zip(&expected).enumerate() {
        let err = relative_error(g, c);
        worst = worst.max(err);
        assert!(err <= tolerance, "{what}: document {d}: GPU {g} vs CPU {c}");
    }
    // The documents in layouts of growing sizes scored in one device batch, as the layouts of
    // requests that share a device turn are: each gathered at its place among the rows, the
    // extraction lanes each taking several layouts and growing their buffers within the turn.
    if docs.len() >= 3 && docs.len() <= gpu.max_batch() {
        let threads = rayon::current_num_threads();
        let (mut parts, mut start, mut size) = (Vec::new(), 0, docs.len().div_ceil(45));
        while start < docs.len() {
            let end = (start + size).min(docs.len());
            let max = gpu.max_batch();
            let part = &docs[start..end];
            parts.extend(
                FeLayout::build_split(query, stats, part, Some(&map), max, threads, None)
                    .unwrap_or_else(|e| panic!("{what}: layout: {e}")),
            );
            (start, size) = (end, size * 3 / 2 + 1);
        }
        let packed = gpu
            .score_hits(device, fe, &refs(&parts), false, true)
            .unwrap_or_else(|e| panic!("{what}: GPU, packed: {e}"));
        let packed_rows = packed.rows.expect("rows kept");
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(bits(&packed_rows) == bits(&rows), "{what}: packed rows");
        for (d, (&g, &c)) in packed.scores.iter().zip(&expected).enumerate() {
            let err = relative_error(g, c);
            assert!(
                err <= tolerance,
                "{what}: packed, document {d}: GPU {g} vs CPU {c}"
            );
        }
    }
    if let Some(inputs) = got.inputs {
        let n_inputs = ranker.inputs.len();
        for (d, row) in rows.chunks(width.max(1)).enumerate() {
            let cpu_inputs = cpu::model_inputs(ranker, row);
            for (j, (&g, &c)) in inputs[d * n_inputs..(d + 1) * n_inputs]
                .iter()
                .zip(&cpu_inputs)
                .enumerate()
            {
                let err = relative_error(f64::from(g), f64::from(c));
                assert!(
                    err <= 1e-6,
                    "{what}: document {d}, input {j}: GPU {g} vs CPU {c}"
                );
            }
        }
    }
    println!(
        "{what}: {} documents: rows bit-identical, worst score error {worst:.3e} (tolerance \
         {tolerance:e})",
        docs.len()
    );
}

/// Synthetic documents with their static features taken away from every third (NaN on both
/// sides), then the hand-made edge documents (empty streams, no streams, …) when `q` is 3.
fn fused_documents(n: usize, q: u32, seed: u64) -> Vec<HitDocument> {
    let mut docs = synth_hit_documents(n, q, seed);
    for doc in docs.iter_mut().step_by(3) {
        doc.static_features.clear();
    }
    if q == 3 {
        docs.extend(fe_edge_documents());
    }
    docs
}

/// The imported LightGBM lambdarank fixture, its features renamed to catalogue features and one
/// static feature (the model reads them by position).
pub(crate) fn lightgbm_on_catalogue_features() -> Ranker {
    let mut ranker = load("fixtures/trees/lgb_lambdarank.model.json");
    let names = feature_names();
    let n = ranker.features.len();
    for (i, name) in ranker.features.iter_mut().enumerate() {
        *name = match i + 1 == n {
            true => "static.static_rank".to_string(),
            false => names[(i * 7) % names.len()].clone(),
        };
    }
    ranker
}

#[test]
fn fused_hits_gpu_match_cpu() {
    let what = "fused FE and scoring";
    let Some(device) = device_for_tests(what) else {
        return;
    };
    let mut fe = GpuFe::new();
    let stats = synth_corpus_stats();
    let rankers = [
        ("small", load("rankers/small.json")),
        ("medium", load("rankers/medium.json")),
        ("large", load("rankers/large.json")),
        ("imported LightGBM", lightgbm_on_catalogue_features()),
    ];
    for (name, ranker) in &rankers {
        let gpu = GpuRanker::upload(&device, ranker, PlanOptions::default()).unwrap();
        for (n, q) in [(1usize, 4u32), (1000, 4), (300, 3), (1500, 1)] {
            let query = synth_query(q, u64::from(q));
            let docs = fused_documents(n, q, 40 + n as u64);
            let what = format!("{what}, {name}, {} documents, Q = {q}", docs.len());
            check_fused(&device, &mut fe, ranker, &gpu, &query, &stats, &docs, &what);
        }
        let q = rankserve::rank::gpu::layout::MAX_TERMS;
        let docs = fe_small_documents(700, q, 41);
        let longest = format!("{what}, {name}, Q = {q}");
        let query = synth_query(q, 3);
        check_fused(
            &device, &mut fe, ranker, &gpu, &query, &stats, &docs, &longest,
        );
        let empty = QueryInfo {
            terms: 0,
            idf: vec![],
        };
        let docs = fe_small_documents(200, 0, 42);
        let no_terms = format!("{what}, {name}, Q = 0");
        check_fused(
            &device, &mut fe, ranker, &gpu, &empty, &stats, &docs, &no_terms,
        );
    }
    // Over the device batch: split into several layouts, scored in one call.
    let medium = &rankers[1].1;
    let gpu = GpuRanker::upload(&device, medium, PlanOptions::default()).unwrap();
    // Layouts of different queries in one device batch, as requests sharing a turn give them:
    // each one's rows as it gets them alone, its scores within the tolerance.
    let map = FeatureResolver::new(&medium.features).unwrap().gather_map();
    let layouts: Vec<FeLayout> = (0..9u32)
        .map(|i| {
            let (q, n) = (1 + i % 5, 50 + 40 * i as usize);
            let docs = fused_documents(n, q, 60 + u64::from(i));
            FeLayout::build(&synth_query(q, u64::from(i)), &stats, &docs, Some(&map)).unwrap()
        })
        .collect();
    let together = (gpu.score_hits(&device, &mut fe, &refs(&layouts), false, true)).unwrap();
    let (mut rows, mut scores) = (Vec::new(), Vec::new());
    for layout in &layouts {
        let alone = gpu
            .score_hits(&device, &mut fe, &[layout], false, true)
            .unwrap();
        rows.extend(alone.rows.unwrap());
        scores.extend(alone.scores);
    }
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(
        bits(&together.rows.unwrap()) == bits(&rows),
        "{what}: nine queries' rows"
    );
    for (d, (&t, &a)) in together.scores.iter().zip(&scores).enumerate() {
        let err = relative_error(t, a);
        assert!(
            err <= score_tolerance(medium),
            "{what}: nine queries, document {d}: {t} vs {a}"
        );
    }
    let docs = fe_small_documents(65_537, 5, 43);
    let what = format!("{what}, medium, 65 537 documents in device batches of 65 536");
    check_fused(
        &device,
        &mut fe,
        medium,
        &gpu,
        &synth_query(5, 4),
        &partial_stats(),
        &docs,
        &what,
    );
    let gpu = gpu.with_max_batch(700);
    let docs = fused_documents(2000, 4, 44);
    let what = "fused FE and scoring, medium, 2 000 documents in device batches of 700";
    check_fused(
        &device,
        &mut fe,
        medium,
        &gpu,
        &synth_query(4, 5),
        &stats,
        &docs,
        what,
    );
}

/// GPU feature extraction against the CPU's on 10 000 synthetic documents (and a few other batch
/// sizes): CPU one thread and all threads, GPU end to end (validate, flatten, copy in, kernel,
/// gather on the device, the ranker's rows copied out) with its parts (the copy-out column is the
/// whole catalogue's, as the path before the device gather copied it).
/// Run: `carry/tests/main parity::fe_gpu_vs_cpu_timing --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a test"]
fn fe_gpu_vs_cpu_timing() {
    let Some(device) = device_for_tests("fe_gpu_vs_cpu_timing") else {
        return;
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let catalogue = FeatureResolver::new(feature_names()).unwrap();
    let stats = synth_corpus_stats();
    let stream = device.stream().clone();
    /// Median milliseconds of `reps` runs after one warm-up run.
    fn median_ms(reps: usize, f: &mut dyn FnMut()) -> f64 {
        f();
        let mut ms: Vec<f64> = (0..reps)
            .map(|_| {
                let start = std::time::Instant::now();
                f();
                start.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        ms[reps / 2]
    }
    println!(
        "device: {}; CPU threads: {threads}; medians in ms",
        device.name()
    );
    println!(
        "| docs | Q | hits/doc | CPU 1 thread | CPU {threads} threads | GPU end to end | \
         validate+flatten | copy in | kernel | copy out | GPU vs 1 thread | GPU vs {threads} threads |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut gpu = GpuFe::new();
    for (n, q) in [
        (10_000, 2u32),
        (10_000, 4),
        (10_000, 8),
        (100, 4),
        (1000, 4),
        (100_000, 4),
    ] {
        let query = synth_query(q, 7);
        let docs = synth_hit_documents(n, q, 42);
        let reps = if n >= 100_000 { 5 } else { 15 };
        let mut out = vec![0.0; n * catalogue.len()];
        let cpu1 = median_ms(reps, &mut || {
            catalogue
                .extract_batch(&query, &stats, &docs, &mut out, 1)
                .unwrap()
        });
        let cpun = median_ms(reps, &mut || {
            catalogue
                .extract_batch(&query, &stats, &docs, &mut out, threads)
                .unwrap()
        });
        let end_to_end = median_ms(reps, &mut || {
            gpu.extract_batch(&device, &catalogue, &query, &stats, &docs, &mut out)
                .unwrap()
        });
        let layout_ms = median_ms(reps, &mut || {
            FeLayout::build(&query, &stats, &docs, None).unwrap();
        });
        let layout = FeLayout::build(&query, &stats, &docs, None).unwrap();
        let copy_in = median_ms(reps, &mut || {
            gpu.upload(&device, &layout).unwrap();
            stream.synchronize().unwrap();
        });
        let kernel = median_ms(reps, &mut || {
            gpu.launch(&device).unwrap();
            stream.synchronize().unwrap();
        });
        let copy_out = median_ms(reps, &mut || {
            gpu.download(&device).unwrap();
        });
        println!(
            "| {n} | {q} | {:.1} | {cpu1:.3} | {cpun:.3} | {end_to_end:.3} | {layout_ms:.3} | \
             {copy_in:.3} ({:.1} MB) | {kernel:.3} | {copy_out:.3} ({:.1} MB) | {:.1}× | {:.1}× |",
            layout.n_hits() as f64 / n as f64,
            layout.upload_bytes() as f64 / 1e6,
            (n * catalogue.len() * 8) as f64 / 1e6,
            cpu1 / end_to_end,
            cpun / end_to_end,
        );
    }
}

/// Feature extraction and scoring of hit documents together, end to end, medium and large
/// rankers, Q = 4: the CPU (FE then the ranker's CPU plan) on 1 thread and on every thread,
/// against the GPU: the old served path (catalogue copied out and gathered on the host, rows
/// copied in again), rows gathered on the device and copied out then in, and the fused path
/// (layout on all the host's threads, as the served path lays out a request it runs alone, then
/// one device turn). Medians of 15 runs after a warm-up.
/// Run: `carry/tests/main parity::fused_fe_scoring_timing --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a test"]
fn fused_fe_scoring_timing() {
    let Some(device) = device_for_tests("fused_fe_scoring_timing") else {
        return;
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stats = synth_corpus_stats();
    fn median_ms(reps: usize, f: &mut dyn FnMut()) -> f64 {
        f();
        let mut ms: Vec<f64> = (0..reps)
            .map(|_| {
                let start = std::time::Instant::now();
                f();
                start.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        ms[reps / 2]
    }
    println!(
        "device: {}; CPU threads: {threads}; medians of 15 in ms",
        device.name()
    );
    println!(
        "| ranker | docs | CPU 1 thread | CPU {threads} threads | GPU old path | GPU rows via \
         device gather | GPU fused | fused: layout | fused: device turn | fused vs \
         {threads} threads | fused vs old path |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut fe = GpuFe::new();
    // Layouts in pinned memory, as the served path joins them.
    let pinned = PinnedPool::new(Arc::clone(device.context()), 256 << 20);
    let store = RankerStore::open(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers"),
        1 << 30,
    )
    .unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let (mut served, mut sweeps, mut phases) = (Vec::new(), Vec::new(), Vec::new());
    for name in ["medium", "large"] {
        let loaded = store.get(name).unwrap();
        let ranker = load(&format!("rankers/{name}.json"));
        let plan = cpu::CpuPlan::new(&ranker);
        let resolver = FeatureResolver::new(&ranker.features).unwrap();
        let map = resolver.gather_map();
        let gpu = GpuRanker::upload(&device, &ranker, PlanOptions::default()).unwrap();
        let score = |fe: &mut GpuFe, layouts: &[FeLayout]| {
            let scored = gpu.score_hits(&device, fe, &refs(layouts), false, false);
            std::hint::black_box(scored.unwrap());
        };
        for n in [1000usize, 10_000] {
            let query = synth_query(4, 7);
            let docs = synth_hit_documents(n, 4, 42);
            let mut rows = vec![0.0; n * resolver.len()];
            let cpu_run = |t: usize| {
                let mut rows = vec![0.0; n * resolver.len()];
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .build()
                    .unwrap();
                median_ms(15, &mut || {
                    pool.install(|| {
                        resolver
                            .extract_batch(&query, &stats, &docs, &mut rows, t)
                            .unwrap();
                        std::hint::black_box(plan.score_batch(&rows, if t == 1 { 1 } else { 0 }));
                    })
                })
            };
            let (cpu1, cpun) = (cpu_run(1), cpu_run(threads));
            let old = median_ms(15, &mut || {
                let catalogue = fe
                    .extract_catalogue(&device, &query, &stats, &docs)
                    .unwrap();
                resolver.gather_batch(catalogue, &docs, &mut rows).unwrap();
                std::hint::black_box(gpu.score(&device, &rows, false).unwrap());
            });
            let gathered = median_ms(15, &mut || {
                fe.extract_batch(&device, &resolver, &query, &stats, &docs, &mut rows)
                    .unwrap();
                std::hint::black_box(gpu.score(&device, &rows, false).unwrap());
            });
            let max = gpu.max_batch();
            let build = || {
                let p = Some(&pinned);
                FeLayout::build_split(&query, &stats, &docs, Some(&map), max, threads, p).unwrap()
            };
            let fused = median_ms(15, &mut || {
                let layouts = build();
                score(&mut fe, &layouts);
            });
            let layout = median_ms(15, &mut || {
                std::hint::black_box(build());
            });
            let layouts = build();
            let turn = median_ms(15, &mut || {
                score(&mut fe, &layouts);
            });
            // The device turn's phases by CUDA events (each its median over 15 turns).
            let timed: Vec<_> = (0..16)
                .map(|_| {
                    gpu.score_hits_timed(&device, &mut fe, &refs(&layouts))
                        .unwrap()
                        .1
                })
                .skip(1)
                .collect();
            let phase = |f: fn(&GpuPhases) -> f64| {
                let mut us: Vec<f64> = timed.iter().map(f).collect();
                us.sort_by(f64::total_cmp);
                us[us.len() / 2]
            };
            let (fe_in, mit, me, out) = (
                phase(|p| p.copy_in_us),
                phase(|p| p.mit_us),
                phase(|p| p.me_us),
                phase(|p| p.copy_out_us),
            );
            phases.push(format!(
                "| {name} | {n} | {:.1} | {fe_in:.1} | {mit:.1} | {me:.1} | {out:.1} | {:.1} | {:.1} |",
                turn * 1e3,
                fe_in + mit + me + out,
                turn * 1e3 - (fe_in + mit + me + out)
            ));
            println!(
                "| {name} | {n} | {cpu1:.3} | {cpun:.3} | {old:.3} | {gathered:.3} | \
                 {fused:.3} | {layout:.3} | {turn:.3} | {:.1}× | {:.1}× |",
                cpun / fused,
                old / fused
            );
            // As served: from the request's MessagePack body, as `/v1/rank` reads it.
            let request = RankRequest {
                ranker: name.to_string(),
                query: Some(query.clone()),
                stats: Some(stats.clone()),
                documents: (docs.iter().cloned())
                    .map(|hits| RankDocument {
                        id: hits.id.clone(),
                        features: None,
                        hits: Some(hits),
                    })
                    .collect(),
                k: None,
                backend: None,
                explain: false,
                timeout_ms: None,
            };
            let body = bytes::Bytes::from(rmp_serde::to_vec_named(&request).unwrap());
            let framed = || {
                let mut framed = msgpack_rank::frame(body.clone()).unwrap();
                assert!(framed.frame_documents(threads));
                framed
            };
            let cpu_served = median_ms(15, &mut || {
                pool.install(|| {
                    let framed = framed();
                    let fe = loaded.fe.as_ref();
                    let rows = framed.feature_matrix(fe, resolver.len(), threads).unwrap();
                    std::hint::black_box(loaded.plan.score_batch(&rows, 0));
                })
            });
            // The handler's way: the fields but the documents read, then the documents laid
            // out as they are read (not framed first), into pinned memory (as served) or onto
            // the heap.
            let decode_layout = |tasks: usize, pinned: Option<&PinnedPool>| {
                pool.install(|| {
                    let head = msgpack_rank::frame(body.clone()).unwrap();
                    head.fe_layouts(&map, max, tasks, pinned).unwrap().unwrap()
                })
            };
            let mut time_served = |pinned: Option<&PinnedPool>| {
                let served = median_ms(15, &mut || {
                    let layouts = decode_layout(threads, pinned);
                    score(&mut fe, &layouts);
                });
                let laid_out = median_ms(15, &mut || {
                    std::hint::black_box(decode_layout(threads, pinned));
                });
                let layouts = decode_layout(threads, pinned);
                assert_eq!(layouts[0].is_pinned(), pinned.is_some());
                let turn = median_ms(15, &mut || {
                    score(&mut fe, &layouts);
                });
                (served, laid_out, turn)
            };
            let (gpu_served, laid_out, turn) = time_served(Some(&pinned));
            let (heap_served, heap_laid_out, heap_turn) = time_served(None);
            let framing = median_ms(15, &mut || {
                pool.install(|| std::hint::black_box(framed()));
            });
            // How the layout's time moves with its runs' count.
            let by_tasks: Vec<String> = [1, 2, 4, 8]
                .iter()
                .map(|&tasks| {
                    let ms = median_ms(15, &mut || {
                        std::hint::black_box(decode_layout(tasks, Some(&pinned)));
                    });
                    format!("{ms:.3}")
                })
                .collect();
            sweeps.push(format!(
                "| {name} | {n} | {} | {laid_out:.3} |",
                by_tasks.join(" | ")
            ));
            served.push(format!(
                "| {name} | {n} | {:.2} | {cpu_served:.3} | {framing:.3} | {gpu_served:.3} | \
                 {laid_out:.3} | {turn:.3} | {heap_served:.3} | {heap_laid_out:.3} | \
                 {heap_turn:.3} | {:.1}× |",
                body.len() as f64 / 1e6,
                cpu_served / gpu_served
            ));
        }
    }
    println!(
        "\nFrom the MessagePack body, as /v1/rank serves it ({threads} threads; CPU: frame, \
         decode+FE, score; GPU: decode+layout as read into pinned memory, device turn; the same \
         with the layout on the heap):"
    );
    println!(
        "| ranker | docs | body MB | CPU {threads} threads | CPU: framing | GPU fused | GPU: \
         decode + layout | GPU: device turn | heap: fused | heap: decode + layout | heap: device \
         turn | GPU vs CPU |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in served {
        println!("{row}");
    }
    println!(
        "\nThe fused device turn (µs): host wall (median of 15), then its phases by CUDA events \
         (medians of 15): copy in + fe_extract + fe_gather, MIT, model evaluation, scores' copy \
         out; their sum, and the rest (host work and gaps between the phases):"
    );
    println!(
        "| ranker | docs | turn | copy in + FE | MIT | model | copy out | phases | rest |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for row in phases {
        println!("{row}");
    }
    println!("\nDecode + layout as read, by the runs' count (at least 64 documents each):");
    println!("| ranker | docs | 1 | 2 | 4 | 8 | {threads} |\n|---|---:|---:|---:|---:|---:|---:|");
    for row in sweeps {
        println!("{row}");
    }
}

/// A batch above the ranker's device-batch maximum is split; the pooled buffers are reused
/// across calls of different sizes; the scores stay those of the CPU.
#[test]
fn split_and_pooled_batches_gpu_match_cpu() {
    let what = "split and pooled batches";
    let Some(device) = device_for_tests(what) else {
        return;
    };
    for (path, seed) in [("rankers/large.json", 30), ("rankers/small.json", 31)] {
        let ranker = load(path);
        let gpu = GpuRanker::upload(&device, &ranker, PlanOptions::default())
            .unwrap()
            .with_max_batch(300);
        assert_eq!(gpu.max_batch(), 300);
        for n_docs in [1000, 7, 300, 1] {
            let features = adversarial_features(&ranker, n_docs, seed + n_docs as u64);
            let expected = cpu::score_batch(&ranker, &features, 0);
            let got = gpu.score(&device, &features, false).unwrap();
            let (timed, phases) = gpu.score_timed(&device, &features).unwrap();
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got.scores),
                bits(&timed.scores),
                "{path}, {n_docs} documents: timed and untimed scores differ"
            );
            assert!(phases.copy_in_us > 0.0 && phases.me_us > 0.0, "{phases:?}");
            for (d, (&g, &c)) in got.scores.iter().zip(&expected).enumerate() {
                assert!(
                    relative_error(g, c) <= 1e-4,
                    "{path}, {n_docs} documents: document {d}: GPU {g} vs CPU {c}"
                );
            }
        }
        assert!(gpu.pool_bytes() > 0);
    }
}

/// A large batch of rows is scored in parts whose copy in overlaps the scoring of the part
/// before (two buffer sets, the device's copy stream, events between them), for part counts of
/// two to four and a short last part: every score is the CPU's and the one-part-at-a-time
/// path's (`score_timed`) within the CPU's tolerance. Not bit for bit: a part's size sets the
/// tree kernel's launch shape (documents per block, hence trees per lane and the order of the
/// f64 sum) and cuBLAS's kernel, so the last bits move with it, as between any two batch sizes
/// (measured on an H100: the imported LightGBM model's scores at 9 001 documents, and 3 720 of
/// 4 096 large-ranker scores, median 4e-7 relative).
#[test]
fn overlapped_parts_gpu_match_serial_batches_and_cpu() {
    let what = "overlapped parts";
    let Some(device) = device_for_tests(what) else {
        return;
    };
    for (path, seed) in [
        ("fixtures/trees/lgb_lambdarank.model.json", 40),
        ("rankers/large.json", 41),
    ] {
        let ranker = load(path);
        let gpu = GpuRanker::upload(&device, &ranker, PlanOptions::default()).unwrap();
        for n_docs in [4096, 9001, 10_000] {
            let features = adversarial_features(&ranker, n_docs, seed + n_docs as u64);
            let expected = cpu::score_batch(&ranker, &features, 0);
            let got = gpu.score(&device, &features, false).unwrap();
            let (serial, _) = gpu.score_timed(&device, &features).unwrap();
            assert_eq!(got.scores.len(), n_docs);
            let scores = got.scores.iter().zip(&serial.scores).zip(&expected);
            for (d, ((&g, &s), &c)) in scores.enumerate() {
                assert!(
                    relative_error(g, c) <= 1e-4 && relative_error(g, s) <= 1e-4,
                    "{path}, {n_docs} documents: document {d}: GPU {g} (serial {s}) vs CPU {c}"
                );
            }
        }
    }
}

/// A batch of requests scored as several blocks (`GpuRanker::score_blocks`, what the batching
/// lane sends: each request's rows where they are, empty ones included) gives the bits of the
/// same rows scored as one matrix, on the serial path and on the overlapped one (≥ 4 096
/// documents, whose parts cut across the blocks): the device sees the same staged values.
#[test]
fn blocks_gpu_match_one_matrix() {
    let what = "blocks";
    let Some(device) = device_for_tests(what) else {
        return;
    };
    let ranker = load("rankers/medium.json");
    let gpu = GpuRanker::upload(&device, &ranker, PlanOptions::default()).unwrap();
    let width = ranker.features.len();
    for sizes in [vec![3usize, 0, 100, 1], vec![2000, 1, 0, 2500, 96]] {
        let n_docs: usize = sizes.iter().sum();
        let features = adversarial_features(&ranker, n_docs, 60 + n_docs as u64);
        let mut blocks = Vec::new();
        let mut first = 0;
        for size in &sizes {
            blocks.push(&features[first * width..(first + size) * width]);
            first += size;
        }
        let whole = gpu.score(&device, &features, false).unwrap().scores;
        let split = gpu.score_blocks(&device, &blocks, false).unwrap().scores;
        let bits = |s: &[f64]| s.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&split),
            bits(&whole),
            "{what}: blocks of {sizes:?} documents"
        );
    }
}
