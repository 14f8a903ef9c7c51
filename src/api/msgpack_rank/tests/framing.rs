//! Framing a body's documents: in parallel as in sequence, and the fields after them.

use super::*;

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
