//! Feature extraction on the CPU: documents per second, single thread, on synthetic hit
//! documents (`synth_hit_documents`: title ~10, body ~400 tokens, anchor, url; Zipf positions).
//!
//! - `catalogue/q{Q}`: every catalogue feature (119) per document;
//! - `ranker20/q{Q}`: a ranker-sized map of 20 features (3 static), the gather's share;
//! - `validate_only/q{Q}`: the validation walk alone over the same hits, the floor that any
//!   extraction (which must validate) pays.
//!
//! Run: `cargo bench --bench fe_cpu`. Results: `docs/benchmarks-history.md`, "Feature extraction on the GPU vs the CPU (issue 4)".

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rankserve::rank::fe::hits::{validate_query, validate_stream};
use rankserve::rank::fe::{
    feature_names, synth_corpus_stats, synth_hit_documents, synth_query, FeatureResolver,
};

const DOCS: usize = 1000;

fn bench(c: &mut Criterion) {
    let stats = synth_corpus_stats();
    let all = FeatureResolver::new(feature_names()).expect("catalogue names resolve");
    let subset: Vec<String> = feature_names()
        .iter()
        .step_by(7)
        .take(17)
        .cloned()
        .chain(
            [
                "static.static_rank",
                "static.spam_score",
                "static.url_depth",
            ]
            .map(String::from),
        )
        .collect();
    let ranker20 = FeatureResolver::new(&subset).expect("catalogue and static names resolve");

    let mut group = c.benchmark_group("fe_cpu");
    group.throughput(Throughput::Elements(DOCS as u64));
    for q in [2u32, 4, 8] {
        let query = synth_query(q, 7);
        let docs = synth_hit_documents(DOCS, q, 42);
        for (name, resolver) in [("catalogue", &all), ("ranker20", &ranker20)] {
            let mut out = vec![0.0; DOCS * resolver.len()];
            group.bench_with_input(BenchmarkId::new(name, format!("q{q}")), &docs, |b, docs| {
                b.iter(|| {
                    resolver
                        .extract_batch(&query, &stats, docs, &mut out, 1)
                        .expect("synthetic documents are valid")
                })
            });
        }
        group.bench_with_input(
            BenchmarkId::new("validate_only", format!("q{q}")),
            &docs,
            |b, docs| {
                b.iter(|| {
                    validate_query(&query).expect("valid");
                    for doc in docs {
                        for (name, stream) in doc.streams.iter() {
                            validate_stream(doc, name, stream, q).expect("valid");
                        }
                    }
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
