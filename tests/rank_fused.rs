//! `/v1/rank` with hit documents on the fused device path (issue 20): MessagePack bodies whose
//! documents the decoder lays out for the device as it reads them, then FE, the ranker's gather
//! and scoring in one device turn. On a GPU (skipped without one, failing under
//! `RANKSERVE_REQUIRE_GPU=1`).

use axum::http::StatusCode;

use rankserve::api::{FeatureValues, RankDocument, RankRequest, RankResponse};
use rankserve::backend::Backend;
use rankserve::bench::replay::synth_requests;
use rankserve::rank::fe::{synth_hit_documents, synth_query, HitDocument, HitStream};
use rankserve::rank::format::to_native_json;
use rankserve::server::error::ErrorBody;

use crate::http::{post, send, server_with, TestServer};
use crate::parity::{lightgbm_on_catalogue_features, load};

/// Documents with no streams, and with an empty stream and an empty phrase.
fn edge_documents() -> Vec<HitDocument> {
    let mut with_streams = HitDocument::default();
    let no_phrases: [&[[u32; 2]]; 0] = [];
    (with_streams.streams).insert("title", HitStream::new(4, no_phrases));
    (with_streams.streams).insert("body", HitStream::new(9, [&[][..], &[[0, 2]]]));
    vec![HitDocument::default(), with_streams]
}

/// A request of `docs` hit documents for `ranker`, its query of `q` terms, with `explain`; the
/// static features left out of every third document (NaN on both sides).
fn hits_request(ranker: &str, docs: Vec<HitDocument>, q: u32) -> RankRequest {
    let mut request = synth_requests(ranker, &load("rankers/medium.json"), 1, 1, None, 3).remove(0);
    request.ranker = ranker.to_string();
    request.query = Some(synth_query(q, u64::from(q)));
    request.explain = true;
    request.documents = (docs.into_iter().enumerate())
        .map(|(i, mut hits)| {
            if i % 3 == 0 {
                hits.static_features.clear();
            }
            RankDocument {
                id: hits.id.clone(),
                features: None,
                hits: Some(hits),
            }
        })
        .collect();
    request
}

async fn rank(s: &TestServer, request: &RankRequest) -> (StatusCode, Vec<u8>) {
    let body = rmp_serde::to_vec_named(request).unwrap();
    let (status, _, body) = send(&s.app, post("/v1/rank", "application/msgpack", body)).await;
    (status, body)
}

/// `backend=gpu` against `backend=cpu` through the served path: every explained feature bit for
/// bit, scores within DESIGN §2's tolerances (1e-4 relative for the NN rankers, 1e-9 for the
/// LightGBM trees), for 1, 1 000 and (medium) 65 537 documents (two device batches), Q = 1 to
/// 64, edge documents and absent static features; the reply says `gpu` (`cpu` under
/// `RANKSERVE_FAULT_GPU=1`, where the batch reruns on the CPU). A body that mixes feature
/// vectors with hit documents is scored from its rows, as before. An invalid hit document gets
/// the same 400 and message on both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_rank_of_hit_documents_extracts_and_scores_like_the_cpu() {
    let test = "gpu_rank_of_hit_documents_extracts_and_scores_like_the_cpu";
    if rankserve::gpu::device::device_for_tests(test).is_none() {
        return;
    }
    let faulty = std::env::var("RANKSERVE_FAULT_GPU").is_ok_and(|v| v == "1");
    let s = server_with(|c| {
        c.backend = Backend::Auto;
        c.fe_backend = Backend::Gpu;
    });
    let dir = s.state.store().dir().to_path_buf();
    for name in ["medium", "large"] {
        let from = format!("{}/rankers/{name}.json", env!("CARGO_MANIFEST_DIR"));
        std::fs::copy(from, dir.join(format!("{name}.json"))).unwrap();
    }
    let lightgbm = to_native_json(&lightgbm_on_catalogue_features());
    std::fs::write(dir.join("lightgbm.json"), lightgbm).unwrap();

    let mut cases = Vec::new();
    for (ranker, tolerance) in [("medium", 1e-4), ("large", 1e-4), ("lightgbm", 1e-9)] {
        for (n, q) in [(1, 4), (1000, 4), (300, 1), (700, 64)] {
            let mut docs = synth_hit_documents(n, q, 40 + n as u64);
            if q == 4 {
                docs.extend(edge_documents());
            }
            cases.push((hits_request(ranker, docs, q), tolerance));
        }
    }
    let docs = synth_hit_documents(65_537, 5, 43);
    cases.push((hits_request("medium", docs, 5), 1e-4));

    for (request, tolerance) in &cases {
        let what = format!(
            "{}, {} documents, Q = {}",
            request.ranker,
            request.documents.len(),
            request.query.as_ref().unwrap().terms
        );
        let mut replies = Vec::new();
        for backend in [Backend::Cpu, Backend::Gpu] {
            let request = RankRequest {
                backend: Some(backend),
                ..request.clone()
            };
            let (status, body) = rank(&s, &request).await;
            assert_eq!(
                status,
                StatusCode::OK,
                "{what}: {}",
                String::from_utf8_lossy(&body)
            );
            let reply: RankResponse = rmp_serde::from_slice(&body).unwrap();
            let side = match backend {
                Backend::Gpu if !faulty => "gpu",
                _ => "cpu",
            };
            assert_eq!(reply.backend, side, "{what}: {backend:?}");
            replies.push(reply);
        }
        let (cpu, gpu) = (&replies[0], &replies[1]);
        let bits = |v: &[Option<f64>]| v.iter().map(|x| x.map(f64::to_bits)).collect::<Vec<_>>();
        let (cpu_explain, gpu_explain) = (cpu.explain.as_ref(), gpu.explain.as_ref());
        let (cpu_explain, gpu_explain) = (cpu_explain.unwrap(), gpu_explain.unwrap());
        assert_eq!(cpu.scores.len(), request.documents.len(), "{what}");
        assert_eq!(gpu.scores.len(), request.documents.len(), "{what}");
        for (i, (want, got)) in cpu_explain.iter().zip(gpu_explain).enumerate() {
            assert_eq!(
                bits(&got.features),
                bits(&want.features),
                "{what}: document {i}"
            );
        }
        for (i, (want, got)) in cpu.scores.iter().zip(&gpu.scores).enumerate() {
            let (want, got) = (want.unwrap(), got.unwrap());
            assert!(
                (got - want).abs() <= tolerance * want.abs().max(1.0),
                "{what}: document {i}: GPU {got} vs CPU {want}"
            );
        }
    }

    // Feature vectors beside hit documents: not laid out, the rows path's (FE on the CPU as
    // the body is read, the rows scored on the GPU).
    let mut mixed = cases[1].0.clone();
    let cpu_rows = {
        let request = RankRequest {
            backend: Some(Backend::Cpu),
            ..mixed.clone()
        };
        let (status, body) = rank(&s, &request).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let reply: RankResponse = rmp_serde::from_slice(&body).unwrap();
        reply.explain.unwrap()
    };
    for (doc, row) in mixed.documents.iter_mut().zip(&cpu_rows).step_by(5) {
        (doc.features, doc.hits) = (Some(FeatureValues::Vector(row.features.clone())), None);
    }
    let mut replies = Vec::new();
    for backend in [Backend::Cpu, Backend::Gpu] {
        mixed.backend = Some(backend);
        let (status, body) = rank(&s, &mixed).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let reply: RankResponse = rmp_serde::from_slice(&body).unwrap();
        replies.push(reply);
    }
    assert_eq!(replies[1].backend, if faulty { "cpu" } else { "gpu" });
    for (i, (want, got)) in replies[0].scores.iter().zip(&replies[1].scores).enumerate() {
        let (want, got) = (want.unwrap(), got.unwrap());
        assert!(
            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
            "mixed documents: document {i}: GPU {got} vs CPU {want}"
        );
    }

    // An invalid hit (a position past its stream's length) in the 700th document.
    let mut request = cases[1].0.clone();
    let doc = request.documents[700].hits.as_mut().unwrap();
    doc.streams.insert("body", HitStream::new(3, [[[0, 7]]]));
    let mut errors = Vec::new();
    for backend in [Backend::Cpu, Backend::Gpu] {
        request.backend = Some(backend);
        let (status, body) = rank(&s, &request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{backend:?}");
        let error: ErrorBody = rmp_serde::from_slice(&body)
            .or_else(|_| serde_json::from_slice(&body))
            .unwrap();
        assert!(
            error.error.message.contains("documents[700]"),
            "{}",
            error.error.message
        );
        errors.push(error.error.message);
    }
    assert_eq!(errors[0], errors[1]);
}
