//! The fused device path: hit documents → FE → gather → MIT, trees, NN → scores, and the
//! measurements of its timing (ignored tests).

use super::fe::{fe_edge_documents, fe_small_documents, partial_stats};
use super::*;

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
/// Run: `carry/tests/main parity::fused::fe_gpu_vs_cpu_timing --ignored --nocapture`.
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
/// Run: `carry/tests/main parity::fused::fused_fe_scoring_timing --ignored --nocapture`.
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
