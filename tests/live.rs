//! Real servers on `127.0.0.1:0`: many clients at once, a full queue, the overload log, and a
//! graceful shutdown with requests in flight; [`live`] serves the other modules' tests too.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;

use rankserve::api::{RankRequest, RankResponse};
use rankserve::config::Config;
use rankserve::server::error::ErrorBody;

use crate::http::{
    expected_scores, json, post, random_features, rank_request, send, server_with, test_ranker,
    TestServer,
};

/// A real server on a loopback port; `shutdown` stops it.
pub(crate) struct Live {
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) shutdown: tokio::sync::oneshot::Sender<()>,
    pub(crate) task: tokio::task::JoinHandle<std::io::Result<()>>,
    _server: TestServer,
}

pub(crate) async fn live(tweak: impl FnOnce(&mut Config)) -> Live {
    let server = server_with(tweak);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(rankserve::server::serve(
        listener,
        Arc::clone(&server.state),
        async {
            let _ = stop.await;
        },
    ));
    Live {
        addr,
        shutdown,
        task,
        _server: server,
    }
}

pub(crate) type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<bytes::Bytes>,
>;

pub(crate) fn client() -> Client {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

async fn post_live(
    client: &Client,
    addr: std::net::SocketAddr,
    request: &RankRequest,
) -> (StatusCode, Vec<u8>) {
    let request = Request::post(format!("http://{addr}/v1/rank"))
        .header(header::CONTENT_TYPE, "application/msgpack")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            rmp_serde::to_vec_named(request).unwrap(),
        )))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    (
        status,
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_clients_are_batched_and_all_correct() {
    let live = live(|c| c.max_batch_docs = 400).await;
    let ranker = test_ranker(0.125);
    let client = client();
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let (client, addr, ranker) = (client.clone(), live.addr, ranker.clone());
        tasks.push(tokio::spawn(async move {
            let features = random_features(1 + (i as usize * 7) % 40, 4, 100 + i);
            let (status, body) =
                post_live(&client, addr, &rank_request("small", &features, 4)).await;
            assert_eq!(status, StatusCode::OK, "client {i}");
            let reply: RankResponse = rmp_serde::from_slice(&body).unwrap();
            assert_eq!(
                reply.scores,
                expected_scores(&ranker, &features),
                "client {i}"
            );
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Batches ran (the recorder is shared by this binary's tests; whether requests merge
    // depends on their timing: `rank::engine::batch`'s tests show merging deterministically).
    let metrics = rankserve::server::metrics::handle().render();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().last())
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(value("rankserve_batch_requests_count") > 0.0);
    let _ = live.shutdown.send(());
    live.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn full_queue_is_503_overloaded_with_retry_after() {
    // One place per ranker and 32 requests at once: those that find it taken are refused, the
    // others answered.
    let live = live(|c| c.queue_capacity = 1).await;
    let client = client();
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let (client, addr) = (client.clone(), live.addr);
        tasks.push(tokio::spawn(async move {
            let body = json(&rank_request("small", &random_features(2000, 4, i), 4));
            let request = Request::post(format!("http://{addr}/v1/rank"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .unwrap();
            let response = client.request(request).await.unwrap();
            let (status, retry_after) = (
                response.status(),
                response.headers().get(header::RETRY_AFTER).cloned(),
            );
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, retry_after, body)
        }));
    }
    let (mut ok, mut refused) = (0, 0);
    for task in tasks {
        let (status, retry_after, body) = task.await.unwrap();
        if status == StatusCode::OK {
            ok += 1;
            continue;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after.unwrap(), "1");
        let body: ErrorBody = serde_json::from_slice(&body).unwrap();
        assert_eq!(body.error.code, "overloaded");
        assert_eq!(
            body.error.message,
            "the queue for ranker \"small\" is full (1 requests); retry after 1 s"
        );
        refused += 1;
    }
    assert!(ok >= 1 && refused >= 1, "{ok} answered, {refused} refused");
    let _ = live.shutdown.send(());
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn overload_refusals_are_logged_at_warn_at_most_once_a_second_not_at_error_each() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    // One thread: every request's middleware logs on it, into `captured`.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let refused = runtime.block_on(async {
        let s = server_with(|c| c.queue_capacity = 1);
        let mut requests = tokio::task::JoinSet::new();
        for i in 0..48u64 {
            let app = s.app.clone();
            let body = json(&rank_request("small", &random_features(2000, 4, i), 4));
            requests.spawn(async move {
                send(&app, post("/v1/rank", "application/json", body))
                    .await
                    .0
            });
        }
        let mut refused = 0;
        while let Some(status) = requests.join_next().await {
            refused += usize::from(status.unwrap() == StatusCode::SERVICE_UNAVAILABLE);
        }
        refused
    });
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(refused >= 3, "{refused} refused: not an overload");
    assert!(!log.contains("ERROR"), "{log}");
    // Other tests of this binary may have logged `overloaded` within the second: 0 or 1 line.
    let lines = log.lines().filter(|l| l.contains("overloaded")).count();
    assert!(lines <= 1, "{lines} lines for {refused} refusals:\n{log}");
    assert!(
        log.lines()
            .filter(|l| l.contains("overloaded"))
            .all(|l| l.contains("WARN")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_with_requests_in_flight_loses_none() {
    use hyper_util::rt::TokioIo;
    let live = live(|_| {}).await;
    let ranker = test_ranker(0.125);
    // Every client first has its connection accepted and answered (a health check), so the
    // shutdown finds 16 requests sent on served connections, not connections still in the
    // listener's backlog (which a stopping server rightly refuses), however slow the machine.
    let connected = Arc::new(tokio::sync::Barrier::new(17));
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let (addr, ranker, connected) = (live.addr, ranker.clone(), Arc::clone(&connected));
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            let health = Request::get("/healthz")
                .header(header::HOST, "rankserve")
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            assert_eq!(
                sender.send_request(health).await.unwrap().status(),
                StatusCode::OK
            );
            connected.wait().await;
            // Large enough that some are still being scored when the shutdown comes.
            let features = random_features(2000, 4, i);
            let request = Request::post("/v1/rank")
                .header(header::HOST, "rankserve")
                .header(header::CONTENT_TYPE, "application/msgpack")
                .body(http_body_util::Full::new(bytes::Bytes::from(
                    rmp_serde::to_vec_named(&rank_request("small", &features, 4)).unwrap(),
                )))
                .unwrap();
            let response = sender.send_request(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let reply: RankResponse = rmp_serde::from_slice(&body).unwrap();
            assert_eq!(reply.scores, expected_scores(&ranker, &features));
        }));
    }
    connected.wait().await;
    tokio::time::sleep(Duration::from_millis(100)).await; // all sent, some being scored
    let _ = live.shutdown.send(());
    for task in tasks {
        task.await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(5), live.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
