//! Shards and the broker on loopback: the fixture corpus built whole and as three shards
//! (`index::shard::build_shards`), each shard a real server on a loopback port, a broker over
//! them. The broker's answers equal the whole index's, hits and scores, for AND, OR and AND_OR,
//! with and without a ranker; a shard stopped mid-run leaves partial answers that say which
//! shard is missing; a shard that never answers costs the per-shard timeout, not a hang.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::http::StatusCode;

use crate::http::{expect_error, json, post, send, server_with, TestServer};
use crate::live::{live, Live};
use crate::selection::fixture_corpus;
use rankserve::api::{SearchRequest, SearchResponse};
use rankserve::index::builder::{build, BuildOptions};
use rankserve::index::shard::{build_shards, shard_dir, ShardInfo};
use rankserve::select::Mode;
use rankserve::server::error::ErrorBody;

const SHARDS: u32 = 3;

/// A rankers directory holding the bundled small ranker as `prod-small`.
fn rankers(dir: &Path) -> PathBuf {
    let out = dir.join("rankers");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers/small.json"),
        out.join("prod-small.json"),
    )
    .unwrap();
    out
}

/// The whole index's server, one live server per shard, and the directory holding them.
struct Cluster {
    whole: TestServer,
    shards: Vec<Live>,
    dir: tempfile::TempDir,
}

async fn cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        threads: 2,
        ..BuildOptions::default()
    };
    let (whole_dir, sharded) = (dir.path().join("whole"), dir.path().join("sharded"));
    build(&fixture_corpus(), &whole_dir, &opts, &|_| {}).unwrap();
    build_shards(&fixture_corpus(), &sharded, &opts, SHARDS, &|_| {}).unwrap();
    let rankers = rankers(dir.path());
    let whole = server_with(|c| {
        c.index = Some(whole_dir);
        c.rankers = rankers.clone();
    });
    let mut shards = Vec::new();
    for i in 0..SHARDS {
        let index = shard_dir(&sharded, i);
        let rankers = rankers.clone();
        shards.push(
            live(move |c| {
                c.index = Some(index);
                c.rankers = rankers;
            })
            .await,
        );
    }
    Cluster { whole, shards, dir }
}

/// A broker over `urls` (named `shard-0` …), each call bounded by `timeout_ms`.
fn broker(dir: &Path, urls: &[String], timeout_ms: u64) -> TestServer {
    let mut list = format!("timeout_ms = {timeout_ms}\n");
    for (i, url) in urls.iter().enumerate() {
        list += &format!("[[shards]]\nname = \"shard-{i}\"\nurl = \"{url}\"\n");
    }
    let path = dir.join(format!("shards-{}.toml", urls.len()));
    std::fs::write(&path, list).unwrap();
    server_with(|c| c.broker = Some(path))
}

fn urls(shards: &[Live]) -> Vec<String> {
    shards
        .iter()
        .map(|s| format!("http://{}", s.addr))
        .collect()
}

fn request(query: &str, mode: Mode, ranker: Option<&str>) -> SearchRequest {
    SearchRequest {
        query: Some(query.into()),
        terms: None,
        k: 10,
        // Fewer candidates than matches: which ones the ranker sees matters.
        candidates: 25,
        mode,
        ranker: ranker.map(String::from),
        backend: None,
        explain: false,
        timeout_ms: None,
    }
}

async fn search(server: &TestServer, request: &SearchRequest) -> SearchResponse {
    let (status, _, body) = send(
        &server.app,
        post("/v1/search", "application/json", json(request)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

const QUERIES: [&str; 5] = [
    "the kitchen",
    "ranking lists",
    "of the and",
    "bread pages links",
    "kernel page unknownterm",
];

#[tokio::test]
async fn a_broker_over_shards_answers_exactly_as_the_whole_index() {
    let cluster = cluster().await;
    let broker = broker(cluster.dir.path(), &urls(&cluster.shards), 5000);
    let mut ranked_hits = 0;
    for text in QUERIES {
        for mode in [Mode::And, Mode::Or, Mode::AndOr] {
            for ranker in [None, Some("prod-small")] {
                let request = request(text, mode, ranker);
                let want = search(&cluster.whole, &request).await;
                let got = search(&broker, &request).await;
                assert_eq!(got.hits, want.hits, "{text:?} {mode:?} {ranker:?}");
                assert_eq!(got.backends.rank, want.backends.rank);
                let shards = got.shards.expect("a broker says which shards answered");
                assert!(!shards.partial && shards.missing.is_empty());
                assert_eq!(shards.asked, SHARDS as usize);
                if ranker.is_some() {
                    ranked_hits += got.hits.len();
                    assert_eq!(got.backends.rank, "cpu");
                }
            }
        }
    }
    assert!(ranked_hits > 50, "the queries must select something");
    // The shards split the corpus: every shard holds some of the hits of a common term.
    let common = search(&broker, &request("the", Mode::Or, None)).await;
    let offsets: Vec<u64> = (0..SHARDS)
        .map(|i| {
            let dir = shard_dir(&cluster.dir.path().join("sharded"), i);
            ShardInfo::read(&dir).unwrap().unwrap().doc_offset
        })
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(common.hits.iter().any(|h| h.doc as u64 >= offsets[2]));
    // A refusal every shard makes is the broker's reply.
    expect_error(
        &broker.app,
        post(
            "/v1/search",
            "application/json",
            json(&request("the", Mode::Or, Some("nope"))),
        ),
        StatusCode::NOT_FOUND,
        "unknown_ranker",
        "no ranker named \"nope\"",
    )
    .await;
}

#[tokio::test]
async fn a_shard_stopped_mid_run_leaves_partial_answers_naming_it() {
    let mut cluster = cluster().await;
    let broker = broker(cluster.dir.path(), &urls(&cluster.shards), 5000);
    let request = request("the kitchen", Mode::Or, None);
    assert!(!search(&broker, &request).await.shards.unwrap().partial);
    let stopped = cluster.shards.remove(1);
    let range = {
        let dir = shard_dir(&cluster.dir.path().join("sharded"), 1);
        let info = ShardInfo::read(&dir).unwrap().unwrap();
        let next = ShardInfo::read(&shard_dir(&cluster.dir.path().join("sharded"), 2))
            .unwrap()
            .unwrap();
        info.doc_offset..next.doc_offset
    };
    let _ = stopped.shutdown.send(());
    stopped.task.await.unwrap().unwrap();
    for _ in 0..3 {
        let got = search(&broker, &request).await;
        let shards = got.shards.unwrap();
        assert!(shards.partial);
        assert_eq!(shards.missing.len(), 1);
        assert_eq!(shards.missing[0].shard, "shard-1");
        assert_eq!(got.hits.len(), 10);
        assert!(got.hits.iter().all(|h| !range.contains(&(h.doc as u64))));
    }
    // With every shard gone: 503 shards_unavailable, at once.
    for live in cluster.shards.drain(..) {
        let _ = live.shutdown.send(());
        live.task.await.unwrap().unwrap();
    }
    let (status, _, body) = send(
        &broker.app,
        post("/v1/search", "application/json", json(&request)),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let body: ErrorBody = serde_json::from_slice(&body).unwrap();
    assert_eq!(body.error.code, "shards_unavailable");
    assert!(
        body.error
            .message
            .starts_with("no shard answered: shard-0 ("),
        "{}",
        body.error.message
    );
}

#[tokio::test]
async fn a_shard_that_never_answers_costs_the_per_shard_timeout() {
    let cluster = cluster().await;
    // Accepts connections, reads nothing, answers nothing.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let mut shard_urls = urls(&cluster.shards);
    shard_urls.push(format!("http://{silent_addr}"));
    let broker = broker(cluster.dir.path(), &shard_urls, 300);
    let started = Instant::now();
    let got = search(
        &broker,
        &request("the kitchen", Mode::AndOr, Some("prod-small")),
    )
    .await;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    let shards = got.shards.unwrap();
    assert!(shards.partial);
    assert_eq!(shards.missing[0].shard, "shard-3");
    assert!(
        shards.missing[0].reason.contains("no answer within 300 ms"),
        "{}",
        shards.missing[0].reason
    );
    // The three real shards hold the whole corpus: the answer is the whole index's.
    let want = search(
        &cluster.whole,
        &request("the kitchen", Mode::AndOr, Some("prod-small")),
    )
    .await;
    assert_eq!(got.hits, want.hits);
    held.abort();
}

#[test]
fn index_build_shards_writes_one_directory_per_shard_and_names_bad_lines_in_the_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    let doc = |id: &str| format!("{{\"id\": \"{id}\", \"streams\": {{\"body\": \"a b {id}\"}}}}\n");
    let build = |shards: &str, out: &Path| {
        let output = crate::cli::rankserve(&[
            "index",
            "build",
            "--corpus",
            corpus.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--shards",
            shards,
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        (output.status.code(), stderr)
    };
    std::fs::write(
        &corpus,
        [doc("a"), doc("b"), doc("c"), doc("d"), doc("e")].concat(),
    )
    .unwrap();
    let out = dir.path().join("ok");
    assert_eq!(build("2", &out).0, Some(0));
    let offsets: Vec<u64> = (0..2)
        .map(|i| {
            ShardInfo::read(&shard_dir(&out, i))
                .unwrap()
                .unwrap()
                .doc_offset
        })
        .collect();
    assert_eq!(offsets, [0, 2]);
    let bad = dir.path().join("bad");
    let (code, stderr) = build("6", &bad);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--shards 6: expected 1 to the corpus's 5 documents"),
        "{stderr}"
    );
    // A duplicate id within the second shard is named by its lines in the corpus.
    std::fs::write(
        &corpus,
        [doc("a"), doc("b"), doc("c"), doc("d"), doc("c")].concat(),
    )
    .unwrap();
    let (code, stderr) = build("2", &bad);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "rankserve: {}, line 5: document id \"c\" is already the id of line 3: ids must be unique",
            corpus.display()
        )
    );
    assert!(!bad.exists());
}
