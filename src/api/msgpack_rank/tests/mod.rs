use super::parallel::share_walk;
use super::*;
use crate::api::feature_matrix;
use crate::api::FeatureValues;
use crate::api::Format;
use crate::backend::Backend;
use crate::bench::replay::synth_requests;
use crate::rank::fe::{synth_hit_documents, synth_query};
use crate::rank::gpu::layout::MAX_TERMS;
use crate::rank::store::{LoadedRanker, RankerStore};
use proptest::prelude::*;
use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

mod framing;
mod layouts;

/// Synthetic requests for every bundled ranker (hit documents for those whose features
/// all come from FE, feature vectors otherwise), varied over the optional fields, named
/// features, ids, static features, streams outside the catalogue and empty phrases.
fn requests(docs: usize) -> Vec<RankRequest> {
    let store = store();
    let mut requests = Vec::new();
    for name in ["small", "medium", "large"] {
        let loaded = store.get(name).expect("a bundled ranker loads");
        let names = &loaded.ranker.features;
        for (i, mut request) in synth_requests(name, &loaded.ranker, docs, 4, None, 11)
            .into_iter()
            .enumerate()
        {
            request.k = [None, Some(0), Some(5), Some(usize::MAX)][i];
            request.backend = [
                None,
                Some(Backend::Auto),
                Some(Backend::Cpu),
                Some(Backend::Gpu),
            ][i];
            request.explain = i % 2 == 1;
            request.timeout_ms = [None, Some(0), Some(250), Some(u64::MAX)][i];
            if i == 3 {
                (request.query, request.stats) = (None, None);
            }
            for (d, document) in request.documents.iter_mut().enumerate() {
                if d % 3 == 0 {
                    document.id = None;
                }
                // The bundled rankers all take hit documents: some documents give a
                // feature vector instead, in order or by name.
                let values = names.iter().enumerate().map(|(f, name)| {
                    let value = (f % 7 != 3).then_some((d * f) as f64 / 8.0 - 1.0);
                    (name.clone(), value)
                });
                match d % 4 {
                    2 => {
                        document.features =
                            Some(FeatureValues::Vector(values.map(|(_, v)| v).collect()));
                        document.hits = None;
                    }
                    3 => {
                        document.features = Some(FeatureValues::Named(values.collect()));
                        document.hits = None;
                    }
                    _ => {}
                }
                if let Some(hits) = &mut document.hits {
                    if d % 2 == 1 {
                        hits.static_features
                            .insert("static_rank".into(), d as f64 * 0.5);
                        hits.streams.insert(
                            "headings",
                            HitStream::new(7, [vec![[0, 1], [1, 3]], vec![]]),
                        );
                        hits.streams
                            .insert("url", HitStream::new(3, Vec::<Vec<_>>::new()));
                    }
                    if d % 5 == 0 {
                        hits.id = None;
                    }
                }
            }
            requests.push(request);
        }
    }
    requests
}

fn msgpack(request: &RankRequest) -> Vec<u8> {
    Format::Msgpack.encode(request).expect("a request encodes")
}

#[test]
fn synthesized_requests_decode_as_rmp_serde_decodes_them() {
    let requests = requests(40);
    assert!(requests
        .iter()
        .any(|r| r.documents.iter().any(|d| d.hits.is_some())));
    assert!(requests.iter().any(|r| r
        .documents
        .iter()
        .any(|d| matches!(d.features, Some(FeatureValues::Named(_))))));
    for request in requests {
        let body = msgpack(&request);
        let serde: RankRequest = rmp_serde::from_slice(&body).expect("rmp-serde decodes");
        assert_eq!(serde, request);
        // In one task, and in parallel tasks of 2 and 7 documents.
        for min_task in [usize::MAX, 2, 7] {
            assert_eq!(decode_in_tasks(&body, min_task).as_ref(), Some(&serde));
        }
    }
}

/// Checks [`Framed::feature_matrix`] against the full path on `body`: where it answers, the
/// full path succeeds with the same matrix, bit for bit, on 1 and 3 threads; the framed
/// head is the decoded request without its documents. Returns whether it answered.
fn fused_equals_the_full_path(body: &[u8], store: &RankerStore) -> bool {
    let Some(framed) = frame_in_tasks(Bytes::copy_from_slice(body), 2) else {
        if let Some(request) = decode(body) {
            // Only a misread of the fields after the documents keeps a body the reader
            // takes from framing.
            let read = frame(Bytes::copy_from_slice(body)).expect("fields were read");
            let head = RankRequest {
                documents: Vec::new(),
                ..request
            };
            assert_ne!(read.head, head, "a body the reader takes frames");
        }
        return false;
    };
    let full = Format::Msgpack.decode_rank_request(body);
    if let Ok(request) = &full {
        let head = RankRequest {
            documents: Vec::new(),
            ..request.clone()
        };
        assert_eq!(msgpack(&framed.head), msgpack(&head));
        assert_eq!(framed.len(), request.documents.len());
    }
    let Ok(loaded) = store.get(&framed.head.ranker) else {
        return false;
    };
    let mut answered = false;
    for threads in [1, 3] {
        let fused =
            framed.feature_matrix(loaded.fe.as_ref(), loaded.ranker.features.len(), threads);
        let Some(fused) = fused else { continue };
        let full = match &full {
            Ok(request) => feature_matrix(request, &loaded, threads),
            Err(err) => panic!("the fused path answered a body that does not decode: {err}"),
        };
        let full = full.unwrap_or_else(|err| panic!("the fused path answered, not {err}"));
        let bits = |m: &[f64]| m.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&full), "threads = {threads}");
        answered = true;
    }
    layouts_equal_the_full_path(body, full.as_ref().ok(), &loaded);
    answered
}

/// Checks [`Framed::fe_layouts`] against the full path, on `body` framed and not: where
/// it lays the documents out, the body decodes, every document gives hits only, the full
/// path builds its rows, and [`FeLayout::build_split`] of the decoded documents is the same
/// layouts, over 1 to 16 runs, in one device batch or several. Returns whether it laid them
/// out.
fn layouts_equal_the_full_path(
    body: &[u8],
    full: Option<&RankRequest>,
    loaded: &LoadedRanker,
) -> bool {
    let Ok(resolver) = loaded.fe.as_ref() else {
        return false;
    };
    let gather = resolver.gather_map();
    let unframed = frame(Bytes::copy_from_slice(body));
    let framed = frame_in_tasks(Bytes::copy_from_slice(body), 2);
    let mut laid_out = false;
    for (framed, threads, max_docs, min_run) in [
        (&unframed, 1, 65_536, 64),
        (&unframed, 3, 65_536, 1),
        (&unframed, 16, 65_536, 1),
        (&framed, 3, 65_536, 64),
        (&framed, 3, 70, 1),
    ] {
        let Some(framed) = framed else { continue };
        let laid = framed.fe_layouts_in_tasks(&gather, max_docs, threads, min_run, None);
        let Some(layouts) = laid else { continue };
        let request = full.expect("the fused path laid out a body that does not decode");
        feature_matrix(request, loaded, threads).expect("the full path takes the request");
        let (query, stats) = (request.query.as_ref(), request.stats.as_ref());
        let docs: Vec<HitDocument> = (request.documents.iter())
            .map(|d| {
                assert!(d.features.is_none(), "laid out a document with features");
                d.hits.clone().expect("laid out a document without hits")
            })
            .collect();
        let (query, stats) = (query.unwrap(), stats.unwrap());
        let want =
            FeLayout::build_split(query, stats, &docs, Some(&gather), max_docs, threads, None);
        // As Debug: a missing static feature is NaN, unequal to itself.
        let got = layouts.map_err(|err| err.to_string());
        let want = want.map_err(|err| err.to_string());
        let what = format!("threads = {threads}, runs of {min_run}, in {max_docs}");
        assert_eq!(format!("{got:?}"), format!("{want:?}"), "{what}");
        laid_out = true;
    }
    laid_out
}

fn store() -> RankerStore {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers");
    RankerStore::open(&dir, 1 << 30).expect("the bundled rankers open")
}

/// `request` with the features given by name given in order instead (the fused path
/// leaves features by name to the full path).
fn in_order(mut request: RankRequest, store: &RankerStore) -> RankRequest {
    let names = store.get(&request.ranker).unwrap().ranker.features.clone();
    for document in &mut request.documents {
        if let Some(FeatureValues::Named(values)) = &document.features {
            let vector = names.iter().map(|n| values.get(n).copied().flatten());
            document.features = Some(FeatureValues::Vector(vector.collect()));
        }
    }
    request
}

#[test]
fn feature_vectors_need_no_feature_extraction() {
    let store = store();
    let mut request = in_order(requests(40).swap_remove(1), &store);
    let loaded = store.get(&request.ranker).unwrap();
    let width = loaded.ranker.features.len();
    let cannot = FeError::UnknownFeature {
        index: 0,
        name: "x".into(),
    };
    // As bits: missing values are NaN.
    let bits = |m: Vec<f64>| m.into_iter().map(f64::to_bits).collect::<Vec<_>>();
    let matrix = |request: &RankRequest, fe| {
        frame_in_tasks(Bytes::from(msgpack(request)), 2)
            .unwrap()
            .feature_matrix(fe, width, 2)
            .map(bits)
    };
    // With hit documents, a ranker FE cannot serve is the full path's error.
    assert_eq!(matrix(&request, Err(&cannot)), None);
    request.documents.retain(|d| d.hits.is_none());
    assert!(request.documents.len() > 10);
    let fe = loaded.fe.as_ref();
    assert_eq!(matrix(&request, Err(&cannot)), matrix(&request, fe));
    assert_eq!(
        matrix(&request, fe),
        Some(bits(feature_matrix(&request, &loaded, 1).unwrap()))
    );
}

#[test]
fn numbers_convert_as_serde_converts_them() {
    // `idf` and `avg_length` as integers and f32; `terms` and `length` as signed ints;
    // explicit nils for the optional fields.
    let body = rmp_serde::to_vec_named(&serde_json::json!({
        "ranker": "medium",
        "k": null,
        "backend": null,
        "timeout_ms": null,
        "query": {"terms": 2i8, "idf": [1u8, -3i64]},
        "stats": {"avg_length": {"body": 400u16}},
        "documents": [{"id": null, "hits": {"streams": {"body": {"length": 9i32,
            "phrases": [[[0, 1], [1, 4]]]}}}}, {"features": [1, null, -2, 0.5]}],
    }))
    .unwrap();
    // The feature value 0.5, an f64, written as an f32 instead.
    let half_f64 = [0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0];
    let at = body
        .windows(half_f64.len())
        .position(|w| w == half_f64)
        .expect("0.5 is in the body");
    let body_f32 = [
        &body[..at],
        &[0xca, 0x3f, 0, 0, 0],
        &body[at + half_f64.len()..],
    ]
    .concat();
    for body in [body, body_f32] {
        let serde: RankRequest = rmp_serde::from_slice(&body).expect("rmp-serde decodes");
        assert_eq!(decode(&body), Some(serde));
    }
}

#[test]
fn malformed_bodies_keep_rmp_serde_errors() {
    let request = requests(3).swap_remove(5);
    let body = msgpack(&request);
    let unknown_field = rmp_serde::to_vec_named(&serde_json::json!({
        "ranker": "small", "documents": [], "zlimit": 3,
    }))
    .unwrap();
    let duplicate_field = rmp_serde::to_vec_named(&serde_json::json!({"ranker": "small"}))
        .unwrap()
        .into_iter()
        .chain([0xa6])
        .chain(*b"ranker")
        .chain([0xa1, b'x'])
        .collect::<Vec<u8>>();
    let mut trailing = body.clone();
    trailing.push(0xc0);
    for bad in [
        &body[..body.len() / 2],
        &unknown_field,
        &duplicate_field,
        &trailing,
        &[0x93, 0x01, 0x02, 0x03][..],
    ] {
        assert_eq!(decode(bad), None);
        let fast = Format::Msgpack.decode_rank_request(bad).unwrap_err();
        let generic = Format::Msgpack.decode::<RankRequest>(bad).unwrap_err();
        assert_eq!(fast.to_string(), generic.to_string());
    }
    let without_unknown_field =
        rmp_serde::to_vec_named(&serde_json::json!({"ranker": "small", "documents": []})).unwrap();
    assert!(decode(&without_unknown_field).is_some());
    let err = Format::Msgpack
        .decode_rank_request(&trailing)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!(
            "MessagePack body does not parse: trailing bytes after the value at byte {} of {}",
            body.len(),
            trailing.len()
        )
    );
}

/// Bodies that differ from valid ones by a truncation, a changed byte or appended bytes.
fn mutated_bodies() -> impl Strategy<Value = Vec<u8>> {
    let bodies: Vec<Vec<u8>> = requests(3).iter().map(msgpack).collect();
    (
        0..bodies.len(),
        any::<prop::sample::Index>(),
        any::<u8>(),
        0..3u8,
        prop::collection::vec(any::<u8>(), 1..4),
    )
        .prop_map(move |(which, at, byte, how, appended)| {
            let mut body = bodies[which].clone();
            let at = at.index(body.len());
            match how {
                0 => body.truncate(at),
                1 => body[at] = byte,
                _ => body.extend_from_slice(&appended),
            }
            body
        })
}

static STORE: std::sync::LazyLock<RankerStore> = std::sync::LazyLock::new(store);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn mutated_bodies_decode_as_rmp_serde_decodes_them(body in mutated_bodies()) {
        let generic = Format::Msgpack.decode::<RankRequest>(&body);
        // One task, and one task per document (the parallel path).
        for min_task in [usize::MAX, 1] {
            if let Some(fast) = decode_in_tasks(&body, min_task) {
                // Compared as encoded bytes: a changed byte can make a NaN, unequal to itself.
                let generic = generic.as_ref().expect("rmp-serde accepts what the fast path accepts");
                prop_assert_eq!(msgpack(&fast), msgpack(generic));
            }
        }
        fused_equals_the_full_path(&body, &STORE);
        match (Format::Msgpack.decode_rank_request(&body), generic) {
            (Ok(fast), Ok(generic)) => prop_assert_eq!(msgpack(&fast), msgpack(&generic)),
            (Err(fast), Err(generic)) => prop_assert_eq!(fast.to_string(), generic.to_string()),
            (fast, generic) => prop_assert!(false, "{fast:?} vs {generic:?}"),
        }
    }
}
