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

/// Where `body`'s documents start (after the array's header), how many there are, and the
/// sequential walk's answer for their bounds.
fn sequential_framing(body: &[u8]) -> (usize, usize, Read<Vec<usize>>) {
    let mut reader = Reader {
        bytes: body,
        pos: 0,
        min_task: usize::MAX,
    };
    let mut found = None;
    let _ = reader.rank_request(|r, _| {
        let mut header = Reader { ..*r };
        let len = header.array_len()?;
        found = Some((header.pos, len, r.frame_documents()));
        Ok(Vec::new())
    });
    found.expect("the body has documents")
}

/// The helper walks of [`frame_in_parallel`] over `tasks` shares, those of the tasks
/// `ready` picks finished, the others not run.
fn helper_walks(
    body: &[u8],
    first: usize,
    len: usize,
    tasks: usize,
    ready: fn(usize) -> bool,
) -> (usize, Vec<OnceLock<Vec<usize>>>) {
    let share = (body.len() - first).div_ceil(tasks).max(1);
    let running = AtomicBool::new(false);
    let walks = (0..tasks)
        .map(|task| {
            let slot = OnceLock::new();
            if task > 0 && ready(task) {
                if let Some(walk) = share_walk(body, first, len, share, task, &running) {
                    slot.set(walk).expect("an empty slot");
                }
            }
            slot
        })
        .collect();
    (share, walks)
}

#[test]
fn parallel_framing_finds_the_sequential_walks_bounds() {
    let mut bodies: Vec<Vec<u8>> = requests(60).iter().map(msgpack).collect();
    // Ids whose UTF-8 bytes look like a document's start (0x82 0xa2 "id", 0x83 0xa4 "hits",
    // 0x81 0xa8 "features"), in every document, so that guesses land inside strings.
    let mut request = requests(60).swap_remove(0);
    for (d, document) in request.documents.iter_mut().enumerate() {
        document.id = Some(["\u{10a2}id", "\u{10e4}hits", "\u{1068}features"][d % 3].repeat(d % 5));
    }
    bodies.push(msgpack(&request));
    for body in &bodies {
        let (first, len, sequential) = sequential_framing(body);
        assert!(sequential.is_ok());
        for tasks in [2, 3, 5, 16, 61, 200] {
            let owned = Bytes::copy_from_slice(body);
            let parallel = frame_in_parallel(&owned, first, len, tasks);
            assert_eq!(parallel, sequential, "{tasks} tasks");
            // Whichever helpers are ready when the true walk reaches their share.
            for ready in [|_| true, |task| task % 2 == 0, |_| false] {
                let (share, walks) = helper_walks(body, first, len, tasks, ready);
                let chained = chain_walks(body, first, len, share, &walks);
                assert_eq!(chained, sequential, "{tasks} tasks");
            }
        }
    }
    // Through `frame`: the same bounds as one task's.
    let parallel = frame_in_tasks(Bytes::from(bodies[0].clone()), 2).expect("frames");
    let one = frame_in_tasks(Bytes::from(bodies[0].clone()), usize::MAX).expect("frames");
    assert_eq!(parallel.bounds, one.bounds);
}

#[test]
fn the_fields_after_the_documents_are_found_from_the_end() {
    for request in requests(30) {
        let body = msgpack(&request);
        let (_, _, walked) = sequential_framing(&body);
        let mut framed = frame(Bytes::from(body)).expect("fields were read");
        assert_eq!(framed.end, *walked.unwrap().last().unwrap());
        assert!(framed.frame_documents(rayon::current_num_threads()));
        let head = RankRequest {
            documents: Vec::new(),
            ..request
        };
        assert_eq!(framed.head, head);
    }
}

/// `{ranker: "small", documents: [[1, 2, 3, 4], [4, 3, 2, 1]], stats: {avg_length: {k: 1}}}`
/// (the documents as feature vectors): the stats' last entry reads like the field `k`.
const STATS_ENDING_LIKE_A_FIELD: &[u8] = b"\x83\xa6ranker\xa5small\xa9documents\x92\
    \x81\xa8features\x94\x01\x02\x03\x04\x81\xa8features\x94\x04\x03\x02\x01\
    \xa5stats\x81\xaaavg_length\x81\xa1k\x01";

#[test]
fn a_tail_of_nested_field_names_is_not_read_once_per_name() {
    // {ranker: "small", documents: [], query: nil, stats: ["k", ["k", [… []]]]}: each `k`
    // reads as a field whose value runs to the end, then the second field is missing. Read
    // from every `k`, the guess would walk 20 000 × ~30 KB.
    let mut body = b"\x84\xa6ranker\xa5small\xa9documents\x90\xa5query\xc0\xa5stats".to_vec();
    for _ in 0..20_000 {
        body.extend_from_slice(b"\x92\xa1k");
    }
    body.push(0x90);
    let started = std::time::Instant::now();
    assert!(frame(Bytes::from(body.clone())).is_none());
    // Bounded: 0.18 ms in a release build on the development machine, against 570 ms
    // when every name was read to the end.
    assert!(started.elapsed() < std::time::Duration::from_millis(200));
    // The full decode refuses it (`stats` is no map).
    assert!(decode(&body).is_none());
}

#[test]
fn fields_misread_from_the_end_fail_to_frame() {
    let body = STATS_ENDING_LIKE_A_FIELD;
    let request = decode(body).expect("decodes");
    assert_eq!((request.k, request.stats.is_some()), (None, true));
    let mut framed = frame(Bytes::from_static(body)).expect("fields were read");
    // Read from the end, the stats' entry was taken for `k`.
    assert_eq!(
        (framed.head.k, framed.head.stats.is_some()),
        (Some(1), false)
    );
    assert!(!framed.frame_documents(rayon::current_num_threads()));
}

#[test]
fn a_forged_documents_length_fails_to_frame_without_reserving_it() {
    let mut body = msgpack(&requests(20).swap_remove(1));
    let (first, _, _) = sequential_framing(&body);
    // The documents' array header (array 16, 20 documents) announces 2³² − 1 instead.
    let header = first - 3;
    assert_eq!(body[header], 0xdc);
    body.splice(header..first, [0xdd, 0xff, 0xff, 0xff, 0xff]);
    let first = first + 2;
    let owned = Bytes::from(body.clone());
    assert_eq!(
        frame_in_parallel(&owned, first, u32::MAX as usize, 4),
        Err(Unhandled)
    );
    assert!(frame_in_tasks(owned, 1).is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// A corrupted body frames in parallel exactly as in sequence: the same bounds, or an
    /// error for both.
    #[test]
    fn parallel_framing_of_corrupted_bodies(
        at in 0.0f64..1.0,
        byte in any::<u8>(),
        cut in prop::option::of(0.0f64..1.0),
        tasks in 2usize..40,
    ) {
        let mut body = msgpack(&requests(30).swap_remove(1));
        let (first, len, _) = sequential_framing(&body);
        let pos = first + ((body.len() - first) as f64 * at) as usize;
        let last = body.len() - 1;
        body[pos.min(last)] = byte;
        if let Some(cut) = cut {
            body.truncate(first + ((body.len() - first) as f64 * cut) as usize);
        }
        let mut reader = Reader { bytes: &body, pos: first, min_task: usize::MAX };
        let sequential: Read<Vec<usize>> = (|| {
            let mut bounds = vec![first];
            for _ in 0..len {
                reader.skip_value()?;
                bounds.push(reader.pos);
            }
            Ok(bounds)
        })();
        let owned = Bytes::copy_from_slice(&body);
        prop_assert_eq!(&frame_in_parallel(&owned, first, len, tasks), &sequential);
        let (share, walks) = helper_walks(&body, first, len, tasks, |_| true);
        prop_assert_eq!(&chain_walks(&body, first, len, share, &walks), &sequential);
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
fn fused_decode_and_fe_equal_the_decoded_requests_matrix() {
    let store = store();
    for request in requests(150) {
        let request = in_order(request, &store);
        let answered = fused_equals_the_full_path(&msgpack(&request), &store);
        // Without `query`, hit documents go to the full path (and its error).
        assert_eq!(answered, request.query.is_some(), "{:?}", request.k);
    }
}

#[test]
fn fused_decode_declines_what_the_full_path_refuses_or_decodes_otherwise() {
    let store = store();
    let mut request = in_order(requests(70).swap_remove(1), &store);
    assert!(fused_equals_the_full_path(&msgpack(&request), &store));
    // Features by name; a wrong vector length; both or neither of `features` and `hits`;
    // an invalid hit; no `stats`.
    let mut cases = Vec::new();
    let mut named = request.clone();
    named.documents[66].features = Some(FeatureValues::Named([("x".into(), None)].into()));
    named.documents[66].hits = None;
    cases.push(named);
    let mut short = request.clone();
    short.documents[65].features = Some(FeatureValues::Vector(vec![Some(1.0)]));
    short.documents[65].hits = None;
    cases.push(short);
    let mut both = request.clone();
    both.documents[64].features = Some(FeatureValues::Vector(vec![]));
    cases.push(both);
    let mut neither = request.clone();
    neither.documents[0].hits = None;
    cases.push(neither);
    let mut bad_hit = request.clone();
    let hits = bad_hit.documents[69].hits.as_mut().unwrap();
    hits.streams.insert("body", HitStream::new(3, [[[0, 7]]]));
    cases.push(bad_hit);
    request.stats = None;
    cases.push(request);
    for case in cases {
        assert!(!fused_equals_the_full_path(&msgpack(&case), &store));
        let loaded = store.get(&case.ranker).unwrap();
        let gather = loaded.fe.as_ref().unwrap().gather_map();
        let framed = frame_in_tasks(Bytes::from(msgpack(&case)), 2).unwrap();
        assert!(framed.fe_layouts(&gather, 65_536, 2, None).is_none());
        let unframed = frame(Bytes::from(msgpack(&case))).unwrap();
        assert!(unframed
            .fe_layouts_in_tasks(&gather, 65_536, 4, 1, None)
            .is_none());
    }
}

#[test]
fn hit_documents_are_laid_out_as_from_the_decoded_request() {
    let store = store();
    let mut laid_out_bodies = 0;
    let hits_only = |mut request: RankRequest| {
        request.documents.retain(|d| d.features.is_none());
        request
    };
    let bodies = requests(150).into_iter().map(|r| in_order(r, &store));
    for request in bodies.flat_map(|r| [r.clone(), hits_only(r)]) {
        let loaded = store.get(&request.ranker).unwrap();
        let body = msgpack(&request);
        let full = Format::Msgpack.decode_rank_request(&body).unwrap();
        let laid_out = layouts_equal_the_full_path(&body, Some(&full), &loaded);
        let all_hits = request.documents.iter().all(|d| d.hits.is_some());
        assert_eq!(laid_out, request.query.is_some() && all_hits);
        laid_out_bodies += usize::from(laid_out);
    }
    assert_eq!(laid_out_bodies, 9, "bodies laid out");
    // A query over the kernel's terms is the CPU's work, not the full path's error.
    let mut request = in_order(requests(70).swap_remove(1), &store);
    let q = MAX_TERMS + 1;
    request.query = Some(synth_query(q, 5));
    for doc in &mut request.documents {
        (doc.features, doc.hits) = (None, Some(synth_hit_documents(1, q, 6).remove(0)));
    }
    let loaded = store.get(&request.ranker).unwrap();
    let gather = loaded.fe.as_ref().unwrap().gather_map();
    let framed = frame_in_tasks(Bytes::from(msgpack(&request)), 2).unwrap();
    let laid_out = framed.fe_layouts(&gather, 65_536, 2, None);
    assert!(
        matches!(laid_out, Some(Err(GpuError::TooLarge { .. }))),
        "{laid_out:?}"
    );
    assert!(framed
        .feature_matrix(loaded.fe.as_ref(), loaded.ranker.features.len(), 2)
        .is_some());
}

/// MessagePack written as given: map entries in this order, repeated keys kept, strings
/// as bytes (invalid UTF-8 included).
#[derive(Clone)]
enum Wire {
    Map(Vec<(&'static [u8], Wire)>),
    Array(Vec<Wire>),
    U32(u32),
    F64(f64),
    Str(&'static [u8]),
}

impl Wire {
    fn phrases(phrases: &[&[[u32; 2]]]) -> Wire {
        let hit = |hit: &[u32; 2]| Wire::Array(hit.map(Wire::U32).into());
        Wire::Array(
            phrases
                .iter()
                .map(|p| Wire::Array(p.iter().map(hit).collect()))
                .collect(),
        )
    }

    fn stream(length: u32, phrases: &[&[[u32; 2]]]) -> Wire {
        Wire::Map(vec![
            (b"length", Wire::U32(length)),
            (b"phrases", Wire::phrases(phrases)),
        ])
    }

    /// In the shortest forms, as clients write it.
    fn write(&self, out: &mut Vec<u8>) {
        let len = |out: &mut Vec<u8>, fixed: u8, long: u8, len: usize| match len < 16 {
            true => out.push(fixed | len as u8),
            false => {
                out.push(long);
                out.extend((len as u16).to_be_bytes());
            }
        };
        match self {
            Wire::Map(entries) => {
                len(out, 0x80, 0xde, entries.len());
                for (key, value) in entries {
                    Wire::Str(key).write(out);
                    value.write(out);
                }
            }
            Wire::Array(items) => {
                len(out, 0x90, 0xdc, items.len());
                items.iter().for_each(|item| item.write(out));
            }
            Wire::U32(v @ 0..=0x7f) => out.push(*v as u8),
            Wire::U32(v) => {
                out.push(0xce);
                out.extend(v.to_be_bytes());
            }
            Wire::F64(v) => {
                out.push(0xcb);
                out.extend(v.to_be_bytes());
            }
            Wire::Str(bytes) => {
                len(out, 0xa0, 0xda, bytes.len());
                out.extend(*bytes);
            }
        }
    }
}

/// Odd hit documents the layout path must lay out as the full path does, or leave to it:
/// each one put among 90 valid documents (runs of one document and more, framed and not),
/// checked by [`layouts_equal_the_full_path`].
#[test]
fn odd_hit_documents_lay_out_as_the_full_path_or_are_left_to_it() {
    let store = store();
    let loaded = store.get("medium").unwrap();
    let streams =
        |streams: Vec<(&'static [u8], Wire)>| Wire::Map(vec![(b"streams", Wire::Map(streams))]);
    let statics =
        |statics: Vec<(&'static [u8], Wire)>| Wire::Map(vec![(b"static", Wire::Map(statics))]);
    let valid = Wire::Map(vec![
        (b"id", Wire::Str(b"d")),
        (
            b"streams",
            Wire::Map(vec![
                (
                    b"body",
                    Wire::stream(900, &[&[[0, 3], [1, 200]], &[[2, 700]]]),
                ),
                (b"title", Wire::stream(9, &[&[[1, 0]]])),
            ]),
        ),
        (
            b"static",
            Wire::Map(vec![
                (b"static_rank", Wire::F64(0.5)),
                (b"spam", Wire::F64(1.0)),
            ]),
        ),
    ]);
    let q64 = Wire::stream(64, &[&[[63, 0], [0, 63]]]);
    let length_last = |position| {
        let phrases = Wire::phrases(&[&[[0, position]]]);
        Wire::Map(vec![(b"phrases", phrases), (b"length", Wire::U32(5))])
    };
    // (document, the query's terms, whether it is laid out)
    let cases = [
        (valid.clone(), 3, true),
        (Wire::Map(vec![]), 3, true),
        (streams(vec![]), 3, true),
        (streams(vec![(b"body", Wire::stream(0, &[]))]), 3, true),
        (
            streams(vec![(b"url", Wire::stream(4, &[&[], &[[0, 3]], &[]]))]),
            3,
            true,
        ),
        (streams(vec![(b"body", q64.clone())]), 64, true),
        (streams(vec![(b"body", q64)]), 63, false),
        (streams(vec![(b"anchor", length_last(4))]), 3, true),
        (streams(vec![(b"anchor", length_last(5))]), 3, false),
        // A repeated stream keeps its last copy.
        (
            streams(vec![
                (b"body", Wire::stream(9, &[&[[0, 1]]])),
                (b"body", Wire::stream(30, &[&[[2, 20]]])),
            ]),
            3,
            true,
        ),
        // Streams outside the catalogue are checked, not laid out.
        (
            streams(vec![
                (b"headings", Wire::stream(9, &[&[[0, 1]]])),
                ("körper".as_bytes(), Wire::stream(3, &[])),
            ]),
            3,
            true,
        ),
        (
            streams(vec![(b"headings", Wire::stream(9, &[&[[0, 9]]]))]),
            3,
            false,
        ),
        (
            streams(vec![(b"body", Wire::stream(9, &[&[[3, 1]]]))]),
            3,
            false,
        ),
        (
            streams(vec![(b"body", Wire::stream(9, &[&[[0, 4]], &[[1, 4]]]))]),
            3,
            false,
        ),
        (
            streams(vec![(b"body", Wire::stream(9, &[&[[0, 5], [1, 2]]]))]),
            3,
            false,
        ),
        (streams(vec![(b"b\xffdy", Wire::stream(9, &[]))]), 3, false),
        // NaN, infinite, repeated, integer and missing static features.
        (
            statics(vec![(b"static_rank", Wire::F64(f64::NAN))]),
            3,
            true,
        ),
        (
            statics(vec![
                (b"page_quality", Wire::F64(f64::INFINITY)),
                (b"page_quality", Wire::F64(-2.0)),
            ]),
            3,
            true,
        ),
        (statics(vec![(b"static_rank", Wire::U32(7))]), 3, true),
        (statics(vec![(b"\xffx", Wire::F64(1.0))]), 3, false),
        // Ids: any UTF-8, or the full path's error.
        (
            Wire::Map(vec![(b"id", Wire::Str("dé".as_bytes()))]),
            3,
            true,
        ),
        (Wire::Map(vec![(b"id", Wire::Str(b"d\xff"))]), 3, false),
    ];
    for (i, (odd, terms, laid_out)) in cases.into_iter().enumerate() {
        let mut documents = vec![valid.clone(); 90];
        documents[45] = odd;
        let documents = documents
            .into_iter()
            .map(|hits| Wire::Map(vec![(b"hits", hits)]));
        let idf = Wire::Array((0..terms).map(|t| Wire::F64(1.0 + f64::from(t))).collect());
        let avg_length = Wire::Map(vec![(b"body", Wire::F64(400.0))]);
        let request = Wire::Map(vec![
            (b"ranker", Wire::Str(b"medium")),
            (b"documents", Wire::Array(documents.collect())),
            (
                b"query",
                Wire::Map(vec![(b"terms", Wire::U32(terms)), (b"idf", idf)]),
            ),
            (b"stats", Wire::Map(vec![(b"avg_length", avg_length)])),
        ]);
        let mut body = Vec::new();
        request.write(&mut body);
        let full = Format::Msgpack.decode_rank_request(&body).ok();
        let got = layouts_equal_the_full_path(&body, full.as_ref(), &loaded);
        assert_eq!(got, laid_out, "case {i}");
    }
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
