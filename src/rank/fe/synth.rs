//! Deterministic synthetic hit requests with a realistic shape, for benchmarks, the service's
//! `requests synth` and the GPU path's parity tests.
//!
//! Shape per document: `title` (4–16 tokens, 1–2 phrases), `body` (log-normal length, median
//! ≈ 300 tokens, 40–4000; phrases of ≈ 15 tokens), `anchor` (present in 70 % of documents, 2–60
//! tokens) and `url` (3–12 tokens). Each query term appears in a stream with a probability that
//! falls with the term's index (rarer terms later in the query); its count grows with the
//! stream's length, and its positions follow a Zipf law over the stream (early positions more
//! likely, as in real pages). Sometimes the whole query appears as an exact phrase. Three static
//! features: `static_rank`, `spam_score`, `url_depth`.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal, Zipf};
use rayon::prelude::*;

use super::hits::{CorpusStats, HitDocument, HitStream, QueryInfo, Streams};

/// `n` synthetic hit documents for a query of `q_terms` terms (ids `d0`, `d1`, …). The same
/// `(n, q_terms, seed)` always gives the same documents, however many threads run.
pub fn synth_hit_documents(n: usize, q_terms: u32, seed: u64) -> Vec<HitDocument> {
    (0..n)
        .into_par_iter()
        .map(|i| {
            let mut rng =
                ChaCha8Rng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            synth_document(&mut rng, i, q_terms)
        })
        .collect()
}

/// A synthetic query of `q_terms` terms with idf values like BM25's on a web corpus (1–9).
pub fn synth_query(q_terms: u32, seed: u64) -> QueryInfo {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    QueryInfo {
        terms: q_terms,
        idf: (0..q_terms).map(|_| rng.random_range(1.0..9.0)).collect(),
    }
}

/// Average stream lengths matching [`synth_hit_documents`]' distributions.
pub fn synth_corpus_stats() -> CorpusStats {
    CorpusStats {
        avg_length: [
            ("title", 9.8),
            ("body", 402.0),
            ("anchor", 22.0),
            ("url", 7.5),
        ]
        .into_iter()
        .map(|(s, v)| (s.to_string(), v))
        .collect(),
    }
}

fn synth_document(rng: &mut ChaCha8Rng, i: usize, q_terms: u32) -> HitDocument {
    let body_len = LogNormal::new(300f64.ln(), 0.7)
        .expect("constant parameters are valid")
        .sample(rng)
        .clamp(40.0, 4000.0) as u32;
    let mut streams = Streams::default();
    let title_len = rng.random_range(4..=16);
    streams.insert("title", synth_stream(rng, title_len, 8, q_terms, 0.6));
    streams.insert("body", synth_stream(rng, body_len, 15, q_terms, 0.9));
    if rng.random_bool(0.7) {
        let anchor_len = rng.random_range(2..=60);
        streams.insert("anchor", synth_stream(rng, anchor_len, 6, q_terms, 0.5));
    }
    let url_len = rng.random_range(3..=12);
    streams.insert("url", synth_stream(rng, url_len, 12, q_terms, 0.3));
    let static_features = [
        ("static_rank", rng.random_range(0.0..1.0)),
        ("spam_score", rng.random_range(0.0f64..1.0).powi(4)),
        ("url_depth", f64::from(rng.random_range(0u32..8))),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    HitDocument {
        id: Some(format!("d{i}")),
        streams,
        static_features,
    }
}

/// One stream of `length` tokens cut into phrases of about `phrase_len` tokens; term `t` appears
/// with probability `presence / (1 + 0.3 t)`.
fn synth_stream(
    rng: &mut ChaCha8Rng,
    length: u32,
    phrase_len: u32,
    q_terms: u32,
    presence: f64,
) -> HitStream {
    let zipf = Zipf::new(f64::from(length), 0.6).expect("length ≥ 1 and s > 0 are valid");
    let mut hits: Vec<[u32; 2]> = Vec::new(); // [position, term] while building
    for t in 0..q_terms {
        if !rng.random_bool((presence / (1.0 + 0.3 * f64::from(t))).min(1.0)) {
            continue;
        }
        let mean_extra = f64::from(length) / 120.0;
        let count = 1 + (rng.random_range(0.0..1.0f64).powi(2) * 2.0 * mean_extra) as u32;
        for _ in 0..count.min(length / 2 + 1) {
            let position = zipf.sample(rng) as u32 - 1;
            hits.push([position, t]);
        }
    }
    if q_terms > 0 && q_terms <= length && rng.random_bool(0.25) {
        let start = rng.random_range(0..=length - q_terms);
        hits.extend((0..q_terms).map(|t| [start + t, t]));
    }
    // One hit per position (the exact-phrase insert wins), in position order.
    hits.sort_by_key(|&[p, _]| p);
    hits.dedup_by_key(|&mut [p, _]| p);

    let mut phrases: Vec<Vec<[u32; 2]>> = Vec::new();
    let mut phrase_end = 0;
    for [position, term] in hits {
        if position >= phrase_end || phrases.is_empty() {
            while phrase_end <= position {
                phrase_end += rng.random_range(phrase_len / 2 + 1..=phrase_len * 3 / 2 + 1);
            }
            phrases.push(Vec::new());
        }
        phrases
            .last_mut()
            .expect("pushed above")
            .push([term, position]);
    }
    HitStream::new(length, phrases)
}
