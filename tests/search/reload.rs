//! `POST /v1/index/reload`: a good index swapped in, a bad one leaving the old serving, the
//! admin token, and searches racing reloads.

use super::*;

pub(super) fn small_corpus(dir: &Path, words: &str) -> PathBuf {
    let path = dir.join(format!("{words}.jsonl"));
    let lines: Vec<String> = (0..3)
        .map(|i| {
            format!(
                r#"{{"id": "{words}-{i}", "streams": {{"title": "t", "body": "{words} {words} kitchen {i}"}}, "static": {{}}}}"#
            )
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

pub(super) fn reload(dir: Option<&Path>, token: Option<&str>) -> Request<Body> {
    let mut builder = Request::post("/v1/index/reload");
    if let Some(token) = token {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    match dir {
        Some(dir) => builder
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::json!({ "dir": dir }).to_string()))
            .unwrap(),
        None => builder.body(Body::empty()).unwrap(),
    }
}

#[tokio::test]
async fn reload_swaps_the_index_and_a_bad_one_leaves_the_old_serving() {
    let (s, dir, _) = search_server();
    let corpus = small_corpus(dir.path(), "zebra");
    let next = dir.path().join("next");
    build(&corpus, &next, &BuildOptions::default(), &|_| {}).unwrap();
    let kitchen = request("kitchen", Mode::Or, 10);
    let before = search_json(&s, &kitchen).await;
    assert_eq!(before.hits.len(), 10);
    let held = s.state.index().unwrap();

    let (status, _, body) = send(&s.app, reload(Some(&next), Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let described: IndexDescription = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (described.dir.as_path(), described.docs),
        (next.as_path(), 3)
    );
    let after = search_json(&s, &kitchen).await;
    let ids: Vec<_> = after.hits.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| id.starts_with("zebra-")), "{ids:?}");
    // A search that took the old index before the swap still reads it.
    assert_eq!(
        search(&held, &Query::from_text("kitchen", 10, Mode::Or))
            .unwrap()
            .hits,
        doc_scores(&before)
    );

    // A corrupted copy is refused, naming the file and the check; the new index keeps serving.
    let broken = dir.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    for entry in std::fs::read_dir(&next).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), broken.join(entry.file_name())).unwrap();
    }
    let docs = broken.join("docs.bin");
    let mut bytes = std::fs::read(&docs).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&docs, bytes).unwrap();
    let (status, _, body) = send(&s.app, reload(Some(&broken), Some(TOKEN))).await;
    let error: rankserve::server::error::ErrorBody = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, error.error.code.as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "bad_index")
    );
    let prefix = format!(
        "index {} was not loaded, the index being served is unchanged: index file {} is corrupt: ",
        broken.display(),
        docs.display()
    );
    assert!(
        error.error.message.starts_with(&prefix),
        "{}",
        error.error.message
    );
    let missing = dir.path().join("nowhere");
    let (status, _, _) = send(&s.app, reload(Some(&missing), Some(TOKEN))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(search_json(&s, &kitchen).await.hits, after.hits);

    // An empty body re-opens the directory being served.
    let (status, _, body) = send(&s.app, reload(None, Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(search_json(&s, &kitchen).await.hits, after.hits);
}

#[tokio::test]
async fn reload_needs_the_admin_token() {
    let (s, _dir, index) = search_server();
    let at = index.dir();
    let message = "admin route needs `Authorization: Bearer TOKEN` with the configured token";
    expect_error(
        &s.app,
        reload(Some(at), None),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        message,
    )
    .await;
    expect_error(
        &s.app,
        reload(Some(at), Some("wrong")),
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        message,
    )
    .await;
    let open = server_with(|c| c.admin_token = None);
    expect_error(
        &open.app,
        reload(Some(at), Some(TOKEN)),
        StatusCode::FORBIDDEN,
        "admin_disabled",
        "admin routes are disabled: no admin token is configured (admin_token / RANKSERVE_ADMIN_TOKEN)",
    )
    .await;
    // Without an index served or configured, a reload must name its directory.
    let bare = server_with(|_| {});
    expect_error(
        &bare.app,
        reload(None, Some(TOKEN)),
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "no index directory: give `dir` (no index is configured or served)",
    )
    .await;
}

/// POSTs JSON `body` to `path` on a live server, with the admin token.
async fn post_live_json(
    client: &crate::live::Client,
    addr: std::net::SocketAddr,
    path: &str,
    body: &impl serde::Serialize,
) -> (StatusCode, Vec<u8>) {
    let request = Request::post(format!("http://{addr}{path}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(http_body_util::Full::new(bytes::Bytes::from(json(body))))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn searches_racing_reloads_each_see_one_whole_index() {
    let (dir, first) = built(&fixture_corpus(), "first", Codec::Ef);
    let second_dir = dir.path().join("second");
    build(
        &small_corpus(dir.path(), "kitchen"),
        &second_dir,
        &BuildOptions::default(),
        &|_| {},
    )
    .unwrap();
    let second = Index::open(&second_dir).unwrap();
    let query = request("kitchen", Mode::Or, 5);
    let expected = [&first, &second].map(|index| {
        search(index, &Query::from_text("kitchen", 5, Mode::Or))
            .unwrap()
            .hits
    });
    assert_ne!(expected[0], expected[1]);
    let dirs = [first.dir().to_path_buf(), second_dir.clone()];
    let live = live(|c| c.index = Some(dirs[0].clone())).await;
    let addr = live.addr;

    let searchers: Vec<_> = (0..4)
        .map(|_| {
            let (query, expected) = (query.clone(), expected.clone());
            tokio::spawn(async move {
                let client = client();
                let mut seen = [0usize; 2];
                for _ in 0..40 {
                    let (status, body) = post_live_json(&client, addr, "/v1/search", &query).await;
                    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
                    let reply: SearchResponse = serde_json::from_slice(&body).unwrap();
                    let got = doc_scores(&reply);
                    let which = expected.iter().position(|e| *e == got);
                    seen[which.expect("a result from one whole index")] += 1;
                }
                seen
            })
        })
        .collect();
    let reloader = client();
    for round in 0..20 {
        let target = serde_json::json!({ "dir": dirs[(round + 1) % 2] });
        let (status, body) = post_live_json(&reloader, addr, "/v1/index/reload", &target).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    let mut seen = [0usize; 2];
    for searcher in searchers {
        let s = searcher.await.unwrap();
        seen = [seen[0] + s[0], seen[1] + s[1]];
    }
    assert_eq!(seen[0] + seen[1], 160);
    let _ = live.shutdown.send(());
    live.task.await.unwrap().unwrap();
}
