//! The fused paths against the full one ([`fused_equals_the_full_path`],
//! [`layouts_equal_the_full_path`]) on synthesized, refused and odd bodies.

use super::*;

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
