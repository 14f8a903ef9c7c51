//! Posting decode speed per codec on one core: docIDs and term frequencies of a 1 M-posting
//! list (Zipf-like gaps: mostly small, some large), decoded block by block as the query
//! processor does, in integers (docIDs + tfs) per second. Beside them, the reference point the
//! issue names: the `bitpacking` crate's SIMD BP128 (`BitPacker4x`) unpacking the same number of
//! integers at the list's typical bit width, with no delta, exceptions or tfs.
//!
//! Run: `cargo bench --bench selection_decode`. Results: `docs/benchmarks-history.md`, "Decode speed".

use bitpacking::{BitPacker, BitPacker4x};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use rankserve::index::codecs::{bounds_of, encode_list, BlockDecoder, Codec, SkipEntry};

const POSTINGS: usize = 1 << 20;

/// A strictly increasing docID list with gaps of 1..=64 mostly and an occasional jump of up to
/// 4 096 (a term of df ≈ N/20), and tfs of 1..=4 mostly.
fn list() -> (Vec<u32>, Vec<u32>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut doc = 0u32;
    let mut docs = Vec::with_capacity(POSTINGS);
    let mut tfs = Vec::with_capacity(POSTINGS);
    for _ in 0..POSTINGS {
        doc += if rng.random_range(0..100) == 0 {
            rng.random_range(1..4096)
        } else {
            rng.random_range(1..64)
        };
        docs.push(doc);
        tfs.push(if rng.random_range(0..10) == 0 {
            rng.random_range(1..40)
        } else {
            rng.random_range(1..4)
        });
    }
    (docs, tfs)
}

fn bench(c: &mut Criterion) {
    let (docs, tfs) = list();
    let mut group = c.benchmark_group("selection_decode");
    group.throughput(Throughput::Elements(2 * POSTINGS as u64));
    for codec in [Codec::Ef, Codec::Pfor] {
        let mut bytes = Vec::new();
        let mut skips: Vec<SkipEntry> = Vec::new();
        encode_list(codec, &docs, &tfs, |_| 100, &mut bytes, &mut skips);
        eprintln!(
            "{}: {:.2} bits per posting (docIDs + tfs, without skips)",
            codec.name(),
            bytes.len() as f64 * 8.0 / POSTINGS as f64
        );
        let mut decoder = BlockDecoder::new();
        group.bench_function(codec.name(), |b| {
            b.iter(|| {
                let mut sum = 0u64;
                for j in 0..skips.len() {
                    let bounds = bounds_of(|i| skips[i], j, POSTINGS);
                    let start = skips[j].offset as usize;
                    let block = &bytes[start..];
                    decoder.decode_docs(codec, block, bounds);
                    decoder.decode_tfs(codec, block, bounds);
                    sum += u64::from(decoder.docs[bounds.n - 1]) + u64::from(decoder.tfs[0]);
                }
                sum
            })
        });
    }
    // The reference: plain SIMD BP128 unpacking of 2 × POSTINGS integers at 6 bits.
    let packer = BitPacker4x::new();
    let values: Vec<u32> = (0..BitPacker4x::BLOCK_LEN as u32).map(|i| i % 64).collect();
    let mut packed = vec![0u8; 4 * BitPacker4x::BLOCK_LEN];
    let written = packer.compress(&values, &mut packed, 6);
    let mut out = vec![0u32; BitPacker4x::BLOCK_LEN];
    group.bench_function("bitpacking_bp128_6bit", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            for _ in 0..(2 * POSTINGS / BitPacker4x::BLOCK_LEN) {
                packer.decompress(&packed[..written], &mut out, 6);
                sum += u64::from(out[BitPacker4x::BLOCK_LEN - 1]);
            }
            sum
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
