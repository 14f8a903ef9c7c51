//! `/v1/rank` and `/v1/search` bodies, JSON and MessagePack, through the decode path the
//! handlers use: `api::RankBody::decode` (the fast MessagePack framing, else rmp-serde or
//! serde_json), then the documents' feature rows for the bundled `small` ranker
//! (`RowSource::rows`: framing, FE on hit documents, the checks of every document); and
//! `api::Format::decode` of a `SearchRequest`, then the query run on a small index.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use rankserve::api::{BodyError, FeatureValues, Format, RankBody, RankDocument, SearchRequest};
use rankserve::index::tokenize::Tokenizer;
use rankserve::rank::engine::RowSource;
use rankserve::rank::store::{LoadedRanker, RankerStore};
use rankserve::select::{self, Query};
use serde_json::{json, Value};

use crate::support::{json_splices, msgpack_splices, mutated, peak_of, run, Bound, Mutated};

/// A body's peak heap: the decoded request (a document is a few hundred bytes of struct, and
/// MessagePack writes an empty one in a byte), then the feature matrix, `8 × documents ×
/// features` (121 for `small`).
const BODY_BOUND: Bound = Bound {
    per_byte: 1024,
    constant: 4 << 20,
};

fn small() -> Arc<LoadedRanker> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers");
    RankerStore::open(&dir, 1 << 30)
        .unwrap()
        .get("small")
        .unwrap()
}

fn rank_seeds(loaded: &LoadedRanker) -> Vec<Value> {
    let synth = |docs, k, seed| {
        rankserve::bench::replay::synth_requests("small", &loaded.ranker, docs, 1, k, seed)
            .pop()
            .unwrap()
    };
    let mut with_options = synth(2, Some(1), 2);
    with_options.backend = Some(rankserve::backend::Backend::Cpu);
    with_options.explain = true;
    with_options.timeout_ms = Some(1000);
    let mut vectors = synth(0, None, 3);
    let width = loaded.ranker.features.len();
    vectors.documents = (0..2)
        .map(|d| RankDocument {
            id: Some(format!("v{d}")),
            features: Some(FeatureValues::Vector(
                (0..width)
                    .map(|f| (f % 7 != 0).then_some(f as f64 * 0.5))
                    .collect(),
            )),
            hits: None,
        })
        .collect();
    let mut named = vectors.clone();
    named.documents = vec![RankDocument {
        id: None,
        features: Some(FeatureValues::Named(
            loaded.ranker.features[..3]
                .iter()
                .map(|n| (n.clone(), Some(1.5)))
                .collect(),
        )),
        hits: None,
    }];
    [synth(5, None, 1), with_options, vectors, named]
        .iter()
        .map(|r| serde_json::to_value(r).unwrap())
        .collect()
}

/// Whether a refusal names its place: the parser's line and column (JSON) or byte offset
/// (MessagePack), or the document and field.
fn names_its_place(err: &BodyError) -> bool {
    match err {
        // Nothing to point into: the whole body is the place.
        BodyError::BadBody { reason, .. } if reason.starts_with("the body is empty") => true,
        BodyError::BadBody {
            format: "JSON",
            reason,
        } => reason.contains(" line ") && reason.contains(" column "),
        BodyError::BadBody { reason, .. } => reason.contains(" byte "),
        BodyError::Invalid(message) => message.starts_with("documents["),
    }
}

fn head(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(200)];
    match std::str::from_utf8(cut) {
        Ok(text) => text.to_string(),
        Err(_) => format!("{cut:02x?}"),
    }
}

/// A `/v1/rank` body's feature rows, as the handler gets them: decoded (or framed), then its
/// documents' rows; a framed body whose fields were misread is decoded in full and read again.
fn rows_of(format: Format, bytes: &[u8], loaded: &LoadedRanker) -> Result<Vec<f64>, BodyError> {
    let mut body = RankBody::decode(format, Bytes::copy_from_slice(bytes))?;
    loop {
        if let Some(rows) = body.rows(loaded, 1)? {
            return Ok(rows);
        }
    }
}

/// Both formats, each with its own splices.
fn bodies(seeds: usize) -> impl Strategy<Value = (bool, Mutated)> {
    prop_oneof![
        mutated(seeds, json_splices()).prop_map(|m| (false, m)),
        mutated(seeds, msgpack_splices()).prop_map(|m| (true, m)),
    ]
}

#[test]
fn rank_bodies_refuse_with_a_place_and_bounded_heap() {
    let loaded = small();
    let seeds = rank_seeds(&loaded);
    run(
        "rank bodies",
        1000,
        bodies(seeds.len()),
        |(msgpack, case), tally| {
            let bytes = case.apply(&seeds, msgpack);
            let format = if msgpack {
                Format::Msgpack
            } else {
                Format::Json
            };
            let len = bytes.len();
            let (rows, peak) = peak_of(|| rows_of(format, &bytes, &loaded));
            tally.count(rows.is_ok(), len, peak);
            BODY_BOUND.check("rank body", len, peak)?;
            if let Err(err) = &rows {
                prop_assert!(
                    names_its_place(err),
                    "the refusal names no place: {err} (body {})",
                    head(&bytes)
                );
            }
            Ok(())
        },
    );
}

fn search_seeds() -> Vec<Value> {
    vec![
        json!({"query": "the kitchen bread", "k": 5}),
        json!({"terms": ["the", "of"], "k": 3, "candidates": 50, "mode": "and", "ranker": "small",
               "backend": "cpu", "explain": true, "timeout_ms": 100}),
        json!({"query": "lists ranking page", "mode": "or"}),
    ]
}

#[test]
fn search_bodies_refuse_with_a_place_and_bounded_heap() {
    // Opened under the measuring lock, as `index_files` builds its fixture.
    let index = {
        let _one_at_a_time = crate::support::measuring();
        crate::index_files::opened_fixture_index()
    };
    let seeds = search_seeds();
    run(
        "search bodies",
        500,
        bodies(seeds.len()),
        |(msgpack, case), tally| {
            let bytes = case.apply(&seeds, msgpack);
            let format = if msgpack {
                Format::Msgpack
            } else {
                Format::Json
            };
            let (decoded, peak) = peak_of(|| format.decode::<SearchRequest>(&bytes));
            tally.count(decoded.is_ok(), bytes.len(), peak);
            BODY_BOUND.check("search body", bytes.len(), peak)?;
            match decoded {
                Err(err) => prop_assert!(
                    names_its_place(&err),
                    "the refusal names no place: {err} (body {})",
                    head(&bytes)
                ),
                // As the handler: text tokenized, at most 1 024 terms, at most N hits.
                Ok(request) => {
                    let terms = match (request.query, request.terms) {
                        (Some(text), None) => Tokenizer::new().tokens(&text),
                        (None, Some(terms)) => terms,
                        _ => return Ok(()),
                    };
                    if terms.len() <= 1024 {
                        let k = request
                            .k
                            .max(request.candidates)
                            .min(index.num_docs() as usize);
                        let result = select::search(&index, &Query::new(terms, k, request.mode));
                        prop_assert!(result.is_ok());
                    }
                }
            }
            Ok(())
        },
    );
}

/// The smallest documents a body can hold (`{}`, one MessagePack byte; `{"features": {}}`, all
/// values missing) are the most heap per byte: each becomes a decoded document and a row of
/// the feature matrix.
#[test]
fn bodies_of_the_smallest_documents_stay_in_the_bound() {
    let loaded = small();
    let _one_at_a_time = crate::support::measuring();
    for document in [json!({}), json!({"features": {}}), json!({"hits": {}})] {
        for msgpack in [false, true] {
            let body = json!({"ranker": "small", "documents": vec![document.clone(); 50_000]});
            let bytes = crate::support::serialize(&body, msgpack);
            let format = if msgpack {
                Format::Msgpack
            } else {
                Format::Json
            };
            let (rows, peak) = peak_of(|| rows_of(format, &bytes, &loaded).map(|rows| rows.len()));
            eprintln!(
                "{document} × 50 000, {}: {} bytes, peak {peak}, {:?}",
                format.name(),
                bytes.len(),
                rows.as_ref()
                    .map_err(|e| e.to_string().chars().take(80).collect::<String>())
            );
            BODY_BOUND.check("rank body", bytes.len(), peak).unwrap();
        }
    }
}
