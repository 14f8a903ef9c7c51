//! What a `/v1/rank` request costs before scoring: decoding the whole body
//! (`Format::decode_rank_request`, which spreads a MessagePack body's documents over rayon's
//! pool; the handler's path for JSON and for MessagePack the fused path declines), the same
//! MessagePack decode on one thread, building the feature matrix from the decoded request
//! (`routes::feature_matrix`, FE from the hits), and both in a row; for MessagePack also what
//! the handler now does: reading every field but the documents (`msgpack_rank::frame`, in the
//! extractor: `frame_head`), framing the documents (`Framed::frame_documents`, parallel walks,
//! on the CPU pool: `frame` is both steps, `frame_one_task` both on one walk) and decoding the
//! documents during FE (`Framed::feature_matrix`), or into the fused device path's layout
//! (`Framed::fe_layouts`: `layout` as the handler runs it, `frame_layout` after framing). The
//! request is one production-like request of `rankserve requests synth` for the bundled
//! medium ranker: 1 000 hit documents, in MessagePack and in JSON.
//!
//! Run: `cargo bench --bench request_decode`. Results: `docs/benchmarks-history.md`, "Request decoding
//! (dev machine)".

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rankserve::api::feature_matrix;
use rankserve::api::msgpack_rank;
use rankserve::api::Format;
use rankserve::bench::replay::synth_requests;
use rankserve::bench::selection::Clock;
use rankserve::rank::store::{LoadedRanker, RankerStore};

/// The allocator of the `rankserve` binary, so that the bench measures what the server runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const DOCS: usize = 1000;
const RANKER: &str = "medium";

/// The bundled medium ranker, as the server loads it.
fn medium_ranker() -> Arc<LoadedRanker> {
    let store = RankerStore::open(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers"),
        1 << 30,
    )
    .expect("the bundled rankers open");
    store.get(RANKER).expect("the medium ranker loads")
}

fn bench(c: &mut Criterion) {
    let loaded = medium_ranker();
    let request = synth_requests(RANKER, &loaded.ranker, DOCS, 1, None, 1)
        .pop()
        .expect("one request");
    assert!(
        request.documents.iter().all(|d| d.hits.is_some()),
        "the medium ranker takes hit documents"
    );

    // The server's default `cpu_threads`: FE spreads a request's documents over them.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut group = c.benchmark_group("request_decode");
    for format in [Format::Msgpack, Format::Json] {
        let body = format.encode(&request).expect("the request encodes");
        let label = format!("{format:?}").to_lowercase();
        eprintln!("{label}: {} bytes, {DOCS} documents", body.len());
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("decode", &label), &body, |b, body| {
            b.iter(|| format.decode_rank_request(body).expect("decodes"))
        });
        if format == Format::Msgpack {
            group.bench_with_input(
                BenchmarkId::new("decode_one_task", &label),
                &body,
                |b, body| {
                    b.iter(|| msgpack_rank::decode_in_tasks(body, usize::MAX).expect("decodes"))
                },
            );
            group.bench_function(BenchmarkId::new("fe", &label), |b| {
                b.iter(|| feature_matrix(&request, &loaded, threads).expect("valid hits"))
            });
            let bytes = Bytes::from(body.clone());
            // What the extractor does: every field but the documents.
            group.bench_function(BenchmarkId::new("frame_head", &label), |b| {
                b.iter(|| msgpack_rank::frame(bytes.clone()).expect("frames"))
            });
            // The documents framed as the handler frames them, on the CPU pool.
            group.bench_function(BenchmarkId::new("frame", &label), |b| {
                b.iter(|| {
                    let mut framed = msgpack_rank::frame(bytes.clone()).expect("frames");
                    assert!(framed.frame_documents(rayon::current_num_threads()));
                    framed
                })
            });
            // Framed by one walk whatever the pool: the parallel walks' baseline.
            group.bench_function(BenchmarkId::new("frame_one_task", &label), |b| {
                b.iter(|| msgpack_rank::frame_in_tasks(bytes.clone(), usize::MAX).expect("frames"))
            });
            let width = loaded.ranker.features.len();
            group.bench_function(BenchmarkId::new("frame_fused_fe", &label), |b| {
                b.iter(|| {
                    let mut framed = msgpack_rank::frame(bytes.clone()).expect("frames");
                    assert!(framed.frame_documents(rayon::current_num_threads()));
                    framed
                        .feature_matrix(loaded.fe.as_ref(), width, threads)
                        .expect("valid hits")
                })
            });
            // The fused device path's host side: the documents laid out for `fe_extract` as
            // they are read (what the handler does), and after framing them.
            let gather = loaded
                .fe
                .as_ref()
                .expect("FE serves the ranker")
                .gather_map();
            group.bench_function(BenchmarkId::new("layout", &label), |b| {
                b.iter(|| {
                    let framed = msgpack_rank::frame(bytes.clone()).expect("frames");
                    (framed.fe_layouts(&gather, 65_536, threads, None))
                        .expect("hit documents")
                        .expect("within the kernel's limits")
                })
            });
            group.bench_function(BenchmarkId::new("frame_layout", &label), |b| {
                b.iter(|| {
                    let mut framed = msgpack_rank::frame(bytes.clone()).expect("frames");
                    assert!(framed.frame_documents(rayon::current_num_threads()));
                    (framed.fe_layouts(&gather, 65_536, threads, None))
                        .expect("hit documents")
                        .expect("within the kernel's limits")
                })
            });
        }
        group.bench_with_input(BenchmarkId::new("decode_fe", &label), &body, |b, body| {
            b.iter(|| {
                let request = format.decode_rank_request(body).expect("decodes");
                feature_matrix(&request, &loaded, threads).expect("valid hits")
            })
        });
    }
    group.finish();
}

/// The fused device path's host side alone (`layout` above) per document: 1 000 and 10 000
/// documents, on one thread timed by its CPU clock (in a pool of one thread: on a machine
/// shared with other work it leaves out the time the thread waits for a core), and on the
/// server's default `cpu_threads` by the wall clock.
fn bench_layout(c: &mut Criterion) {
    let loaded = medium_ranker();
    let gather = (loaded.fe.as_ref())
        .expect("FE serves the ranker")
        .gather_map();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a pool of one thread");
    let mut group = c.benchmark_group("layout");
    for docs in [1_000, 10_000] {
        let request = synth_requests(RANKER, &loaded.ranker, docs, 1, None, 1)
            .pop()
            .expect("one request");
        let body = Bytes::from(
            Format::Msgpack
                .encode(&request)
                .expect("the request encodes"),
        );
        let lay_out = |threads| {
            let framed = msgpack_rank::frame(body.clone()).expect("frames");
            (framed.fe_layouts(&gather, 65_536, threads, None))
                .expect("hit documents")
                .expect("within the kernel's limits")
        };
        group.throughput(Throughput::Elements(docs as u64));
        let id = BenchmarkId::new(format!("{docs}_docs"), "1_thread_cpu_clock");
        group.bench_function(id, |b| {
            b.iter_custom(|iters| {
                one_thread.install(|| {
                    let start = Clock::ThreadCpu.now_us();
                    for _ in 0..iters {
                        std::hint::black_box(lay_out(1));
                    }
                    Duration::from_secs_f64((Clock::ThreadCpu.now_us() - start) / 1e6)
                })
            })
        });
        let id = BenchmarkId::new(format!("{docs}_docs"), format!("{threads}_threads"));
        group.bench_function(id, |b| b.iter(|| lay_out(threads)));
    }
    group.finish();
}

criterion_group!(benches, bench, bench_layout);
criterion_main!(benches);
