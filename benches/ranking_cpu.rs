//! Model evaluation on the CPU (MIT + trees + NN, the compiled `CpuPlan`): documents per second
//! for the bundled small, medium and large rankers at 1, 100, 1 000 and 10 000 documents per
//! batch, on one thread and on every core (rayon's global pool). Feature rows come from
//! `rank::synth::synth_features` (realistic ranges, some missing values).
//!
//! Run: `cargo bench --bench ranking_cpu`. Results: `docs/benchmarks-history.md`, "CPU ranking".

use std::path::Path;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rankserve::rank::cpu::CpuPlan;
use rankserve::rank::format::parse_native;
use rankserve::rank::synth::synth_features;

const SIZES: &[usize] = &[1, 100, 1_000, 10_000];

fn bench(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in ["small", "medium", "large"] {
        let path = root.join(format!("rankers/{name}.json"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let ranker = parse_native(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let plan = CpuPlan::new(&ranker);
        let rows = synth_features(&ranker, *SIZES.last().unwrap_or(&1), 7);
        let width = ranker.features.len();
        let mut group = c.benchmark_group(format!("ranking_cpu/{name}"));
        for &docs in SIZES {
            let batch = &rows[..docs * width];
            group.throughput(Throughput::Elements(docs as u64));
            for (label, threads) in [("1_thread", 1), ("all_threads", 0)] {
                group.bench_with_input(BenchmarkId::new(label, docs), &batch, |b, batch| {
                    b.iter(|| plan.score_batch(batch, threads))
                });
            }
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
