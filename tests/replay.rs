//! `rankserve replay`'s client against a real server on `127.0.0.1:0`: a `/v1/rank` log and
//! `/v1/search` logs, closed and open loop, every request counted with the server's timings.

use std::sync::Arc;
use std::time::Duration;

use rankserve::api::SearchRequest;
use rankserve::bench::replay::{
    replay, search_requests, synth_requests, Endpoint, Load, ReplayReport, RequestLog,
};
use rankserve::index::codecs::Codec;
use rankserve::index::queries::synth_queries;
use rankserve::select::Mode;

use crate::cli::rankserve;
use crate::http::test_ranker;
use crate::live::live;
use crate::selection::{built, fixture_corpus};

/// `requests` written as a log at `path` and read back, as `rankserve replay` reads it.
fn log_of<T: serde::Serialize>(path: &std::path::Path, requests: &[T]) -> Arc<RequestLog> {
    RequestLog::write(path, requests).unwrap();
    Arc::new(RequestLog::read(path).unwrap())
}

async fn run(url: &str, log: &Arc<RequestLog>, load: Load, ms: u64) -> ReplayReport {
    replay(
        url,
        Arc::clone(log),
        load,
        Duration::from_millis(ms),
        |_| {},
    )
    .await
    .unwrap()
}

/// Every request was answered with a 2xx, and each one's latency on the client contains its
/// time in the server.
fn assert_all_answered(report: &ReplayReport, load: Load) {
    assert!(report.errors.is_empty(), "{load:?}: {:?}", report.errors);
    assert!(
        report.ok >= 3 && report.ok == report.requests,
        "{load:?}: {report:?}"
    );
    assert!(report.server_total_us.max > 0, "{load:?}: {report:?}");
    assert!(
        report.latency_us.p50 >= report.server_total_us.p50,
        "{load:?}: {report:?}"
    );
    assert!(
        report.latency_us.max >= report.server_total_us.max,
        "{load:?}: {report:?}"
    );
}

const LOADS: [Load; 2] = [Load::Concurrency(3), Load::Rate(100.0)];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_counts_every_answer_closed_and_open_loop() {
    let live = live(|c| c.batching = false).await;
    let dir = tempfile::tempdir().unwrap();
    let log = log_of(
        &dir.path().join("log.msgpack"),
        &synth_requests("small", &test_ranker(0.125), 20, 8, Some(5), 3),
    );
    assert_eq!(log.endpoint, Endpoint::Rank);
    let url = format!("http://{}", live.addr);
    for load in LOADS {
        let report = run(&url, &log, load, 300).await;
        assert_all_answered(&report, load);
        assert_eq!(report.endpoint, Endpoint::Rank);
        let documents = (report.documents_per_s * report.duration_s).round() as u64;
        assert_eq!(documents, 20 * report.ok, "{load:?}");
        assert!(report.server_total_us.p50 > 0, "{load:?}");
        assert_eq!(report.backends["rank"]["cpu"], report.ok, "{load:?}");
    }
    let _ = live.shutdown.send(());
    live.task.await.unwrap().unwrap();
    // Nobody listens any more: every request is a connection error, and the replay still ends.
    for load in [Load::Concurrency(2), Load::Rate(50.0)] {
        let report = run(&url, &log, load, 100).await;
        assert_eq!(report.ok, 0, "{load:?}");
        assert!(report.errors["connection"] > 0, "{load:?}: {report:?}");
        assert_eq!(report.errors["connection"], report.requests, "{load:?}");
    }
}

/// A search log of the index's own queries, BM25 order (OR) and ranked by `small` (AND), is
/// sent to `/v1/search`; every reply is read: its timings and which backends ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn search_replay_answers_every_query_with_the_servers_timings() {
    let (index_dir, index) = built(&fixture_corpus(), "fixture", Codec::Ef);
    let queries = synth_queries(&index, 20, 1).unwrap();
    let at = index.dir().to_path_buf();
    let live = live(|c| c.index = Some(at)).await;
    let url = format!("http://{}", live.addr);
    let dir = tempfile::tempdir().unwrap();
    let template = |mode: Mode, ranker: Option<&str>| SearchRequest {
        query: None,
        terms: None,
        k: 5,
        candidates: 20,
        mode,
        ranker: ranker.map(String::from),
        backend: None,
        explain: false,
        timeout_ms: None,
    };
    for (name, mode, ranker, ranked_by) in [
        ("bm25.jsonl", Mode::Or, None, "none"),
        ("small.msgpack", Mode::And, Some("small"), "cpu"),
    ] {
        let requests = search_requests(&queries, &template(mode, ranker));
        let log = log_of(&dir.path().join(name), &requests);
        assert_eq!(log.endpoint, Endpoint::Search, "{name}");
        for load in LOADS {
            let report = run(&url, &log, load, 300).await;
            assert_all_answered(&report, load);
            assert_eq!(report.endpoint, Endpoint::Search, "{name} {load:?}");
            // Every reply decoded as a search reply: each is counted by backend.
            assert_eq!(
                report.backends["select"]["cpu"], report.ok,
                "{name} {load:?}"
            );
            assert_eq!(
                report.backends["rank"][ranked_by], report.ok,
                "{name} {load:?}"
            );
            assert!(
                report.server_select_us.max > 0,
                "{name} {load:?}: {report:?}"
            );
            assert!(
                report.server_select_us.p50 <= report.server_total_us.p50,
                "{name} {load:?}: {report:?}"
            );
            // Queries drawn from the index's documents: OR and AND both find hits.
            assert!(report.documents_per_s > 0.0, "{name} {load:?}: {report:?}");
            if ranker.is_some() {
                assert!(report.server_fe_us.max > 0, "{name} {load:?}: {report:?}");
            }
        }
    }
    let _ = live.shutdown.send(());
    live.task.await.unwrap().unwrap();
    drop(index_dir);
}

#[test]
fn requests_search_writes_one_request_per_query_and_replay_names_a_bad_log() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    std::fs::write(at("q.txt"), "alpha beta\n\n  gamma \n").unwrap();
    std::fs::write(at("none.txt"), "\n \n").unwrap();
    let out = rankserve(&[
        "requests",
        "search",
        "--queries",
        &at("q.txt"),
        "--mode",
        "or",
        "--k",
        "3",
        "--ranker",
        "small",
        "--out",
        &at("s.jsonl"),
    ]);
    assert!(out.status.success(), "{out:?}");
    let log = RequestLog::read(std::path::Path::new(&at("s.jsonl"))).unwrap();
    assert_eq!(log.endpoint, Endpoint::Search);
    let requests: Vec<SearchRequest> = log
        .bodies
        .iter()
        .map(|b| serde_json::from_slice(b).unwrap())
        .collect();
    let queries: Vec<_> = requests.iter().map(|r| r.query.as_deref()).collect();
    assert_eq!(queries, [Some("alpha beta"), Some("gamma")]);
    assert!(requests
        .iter()
        .all(|r| r.mode == Mode::Or && r.k == 3 && r.ranker.as_deref() == Some("small")));

    let out = rankserve(&[
        "requests",
        "search",
        "--queries",
        &at("none.txt"),
        "--out",
        &at("e.jsonl"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "rankserve: {}: no queries (expected one per line)\n",
            at("none.txt")
        )
    );

    // A query file given as the log: a `.txt` log is read as MessagePack, and its first
    // request is neither kind.
    let out = rankserve(&[
        "replay",
        "--url",
        "http://127.0.0.1:9",
        "--log",
        &at("q.txt"),
        "--concurrency",
        "1",
        "--duration",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "rankserve: {}: request 0 (at byte 0) does not parse: as a /v1/rank request: ",
            at("q.txt")
        )) && stderr.contains("; as a /v1/search request: "),
        "{stderr}"
    );
}
