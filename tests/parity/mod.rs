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

mod fe;
mod fused;

pub(crate) use fused::lightgbm_on_catalogue_features;

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
